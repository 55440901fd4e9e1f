"""Tiny randomly initialized Mask R-CNNs of the demo family, for the export, flop and compile tests.

``build_tiny_model(variant)`` builds the demo config at test size (conftest.TINY_OPTS) with the
norms of ``VARIANTS[variant]``, and randomizes the running statistics of BW and BGN as if they had
been trained, so that in evaluation mode those layers do not reduce to the identity.
"""
import torch
from detectron2.modeling import build_model

from conftest import DEMO_CONFIG, TINY_OPTS
from gwdet.model_zoo import build_config
from gwdet.layers import BatchGroupNorm, BatchWhitening

VARIANTS = {
    # the demo: GW at S1-B2 (GN at the other ResNet norms), GW in the FPN and both heads
    "demo": [],
    # every gwdet layer in one model: GW_ZCA at S1-B2, BGN at the other ResNet norms and in the box
    # head (with inference example weighing), BW (ZCA) in the FPN, GW (ItN) in the mask head
    "all_norms": [
        "MODEL.RESNETS.NORM", "BGN", "MODEL.RESNETS.GW_NORM", "GW_ZCA", "MODEL.FPN.NORM", "BW",
        "MODEL.ROI_BOX_HEAD.NORM", "BGN", "MODEL.ROI_MASK_HEAD.NORM", "GW",
        "MODEL.BGN.EVAL_EXAMPLE_WEIGHT", "0.5", "MODEL.BW.GROUP_SIZE", "8",
    ],
    # only what ONNX can hold: GW (ItN) at S1-B2 and in the mask head, BW_ItN in the FPN, BGN
    "itn_bw_bgn": [
        "MODEL.RESNETS.NORM", "BGN", "MODEL.FPN.NORM", "BW_ItN", "MODEL.ROI_BOX_HEAD.NORM", "BGN",
        "MODEL.ROI_MASK_HEAD.NORM", "GW", "MODEL.BGN.EVAL_EXAMPLE_WEIGHT", "0.5", "MODEL.BW.GROUP_SIZE", "8",
    ],
}
# fewer proposals and detections than the demo: less work in the heads, the same graph
FEWER_DETECTIONS = ["MODEL.RPN.POST_NMS_TOPK_TEST", "40", "TEST.DETECTIONS_PER_IMAGE", "20"]


def randomize_running_statistics(model: torch.nn.Module, seed: int = 0) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (BatchWhitening, BatchGroupNorm)):
                module.running_mean.normal_(0.0, 0.2, generator=generator)
            if isinstance(module, BatchGroupNorm):
                module.running_var.uniform_(0.5, 2.0, generator=generator)
            if isinstance(module, BatchWhitening):
                size = module.running_whitening.shape[-1]
                noise = torch.randn(module.running_whitening.shape, generator=generator) * 0.2
                module.running_whitening.copy_(torch.eye(size) + noise @ noise.transpose(1, 2))


def build_tiny_model(variant: str, training: bool = False) -> torch.nn.Module:
    cfg = build_config(str(DEMO_CONFIG), list(TINY_OPTS) + FEWER_DETECTIONS + VARIANTS[variant])
    torch.manual_seed(0)
    model = build_model(cfg).train(training)
    randomize_running_statistics(model)
    return model
