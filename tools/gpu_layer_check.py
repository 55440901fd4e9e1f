"""gwdet's layers on a CUDA device where detectron2 is not installed (``make gpu-check`` needs it):
the largest differences from CPU float64 of GW, GW_ZCA, BW and BW_ItN with TF32 off and on
(``torch.set_float32_matmul_precision("high")``), of ItN at T=5 and 9 on an ill-conditioned
covariance, and of GW_ZCA with as many values per group as groups. gwdet.layers imports nothing of
detectron2, but the gwdet package does, so it runs from a copy of the layers (docs/reliability.md,
section GPU, gives the command)."""
import sys
from typing import Callable, Dict, List

import torch
import torch.nn.functional as F

from gwdet.layers import BatchWhitening, GroupWhitening

DEVICE = "cuda"
LAYERS: Dict[str, Callable[[], torch.nn.Module]] = {
    "GW": lambda: GroupWhitening(64, 16),
    "GW_ZCA": lambda: GroupWhitening(64, 16, method="zca"),
    "BW": lambda: BatchWhitening(64, 16, momentum=1.0),
    "BW_ItN": lambda: BatchWhitening(64, 16, method="itn", momentum=1.0),
}


def largest_difference(a: torch.Tensor, b: torch.Tensor) -> str:
    return f"{float((a.double().cpu() - b.double().cpu()).abs().max()):.2g}"


def correlated_input() -> torch.Tensor:
    """(8, 64, 7, 7), channels mixed within groups of 16 by a matrix of condition 100."""
    def rotation() -> torch.Tensor:
        return torch.linalg.qr(torch.randn(16, 16, dtype=torch.float64))[0]

    mixing = rotation() @ torch.diag(torch.logspace(0, -2, 16, dtype=torch.float64)) @ rotation()
    noise = torch.randn(8, 64, 7, 7, dtype=torch.float64)
    return torch.einsum("ij,njhw->nihw", torch.block_diag(*[mixing] * 4), noise) * 5 + 3


def outputs(name: str, x: torch.Tensor, device: str, dtype: torch.dtype) -> List[torch.Tensor]:
    """The layer's training output, and for batch whitening its evaluation output too."""
    layer = LAYERS[name]().to(device, dtype)
    results = [layer(x.to(device, dtype))]
    if name.startswith("BW"):
        layer.eval()
        results.append(layer(x.to(device, dtype)))
    return results


def main() -> int:
    if any(arg in ("-h", "--help") for arg in sys.argv[1:]):
        print(__doc__)
        return 0
    if not torch.cuda.is_available():
        print("gpu_layer_check.py: error: it compares gwdet's layers on a CUDA device with CPU float64, and "
              "torch.cuda.is_available() is False here: run it on a machine with an NVIDIA GPU "
              "(docs/reliability.md, section GPU).", file=sys.stderr)
        return 2
    print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name(0), flush=True)
    torch.manual_seed(0)
    x = correlated_input()
    exact = {name: outputs(name, x, "cpu", torch.float64) for name in LAYERS}
    for precision in ("highest", "high"):  # "high": TF32 where the device has it
        torch.set_float32_matmul_precision(precision)
        for name in LAYERS:
            got = outputs(name, x, DEVICE, torch.float32)
            print(f"float32 products {precision}: {name}",
                  [largest_difference(a, b) for a, b in zip(got, exact[name], strict=True)], flush=True)
    torch.set_float32_matmul_precision("highest")
    smooth = F.avg_pool2d(torch.randn(2, 3, 64, 64), 5, 1, 2)
    with torch.no_grad():
        features = torch.nn.Conv2d(3, 64, 7, 2, 3, bias=False)(smooth)  # an ill-conditioned group covariance
    for T in (5, 9):
        gw = largest_difference(GroupWhitening(64, 64, T=T).to(DEVICE)(features.to(DEVICE)),
                                GroupWhitening(64, 64, T=T).double()(features.double()))
        bw = largest_difference(BatchWhitening(64, 16, method="itn", T=T).to(DEVICE)(features.to(DEVICE)),
                                BatchWhitening(64, 16, method="itn", T=T).double()(features.double()))
        print(f"ItN T={T}: GW {gw}, BW_ItN {bw}", flush=True)
    square = torch.randn(2, 256, 4, 4, dtype=torch.float64) * 100 + 300  # m = 256 / 64 * 16 = 64 = g
    zca = largest_difference(GroupWhitening(256, 64, method="zca").to(DEVICE)(square.float().to(DEVICE)),
                             GroupWhitening(256, 64, method="zca").double()(square))
    print(f"GW_ZCA with m == g: {zca}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
