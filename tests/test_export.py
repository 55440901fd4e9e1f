"""Deploying GW models: TorchScript through detectron2's TracingAdapter (loaded in a process without
gwdet), ONNX in onnxruntime, the ZCA refusal, and tools/deploy/export_model.py.

Every check compares numbers with the eager model (which runs gwdet's fused custom op), on the tiny
randomly initialized Mask R-CNNs of tests/tiny_models.py.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("detectron2.export", reason="detectron2 0.6's export module imports caffe2 (gwdet.export needs detectron2 >= 0.7)")

import torch
from PIL import Image

from conftest import DEMO_CONFIG, TINY_OPTS
from gwdet.export import (
    export_model_onnx,
    export_onnx,
    export_torchscript,
    max_abs_difference,
    run_onnx,
)
from gwdet.layers import BatchGroupNorm, BatchWhitening, GroupWhitening
from tiny_models import build_tiny_model

TOLERANCE = 1e-4


def count(model, layer_type, **attributes):
    return sum(
        isinstance(m, layer_type) and all(getattr(m, k) == v for k, v in attributes.items())
        for m in model.modules()
    )


def test_variants_hold_the_layers_they_are_meant_to_check():
    mixed = build_tiny_model("all_norms")
    assert count(mixed, GroupWhitening, method="zca") == 17 and count(mixed, GroupWhitening, method="itn") == 4
    assert count(mixed, BatchWhitening, method="zca") == 8
    assert count(mixed, BatchGroupNorm) == 16 * 2 + 4 + 4  # B1, B3, shortcuts; box head convs
    itn = build_tiny_model("itn_bw_bgn")
    assert count(itn, GroupWhitening, method="itn") == 17 + 4 and count(itn, BatchWhitening, method="itn") == 8


def images():
    generator = torch.Generator().manual_seed(1)
    return [torch.rand(3, 64, 64, generator=generator) * 255, torch.rand(3, 48, 64, generator=generator) * 255]


def assert_meaningful(adapter, outputs):
    """Enough detections, with differing scores and masks, for a comparison to mean something."""
    instances = adapter.outputs_schema(outputs)[0]["instances"]
    assert len(instances) > 10 and instances.pred_masks.shape[1:] == (1, 28, 28)
    assert instances.scores.std() > 0 and instances.pred_masks.std() > 0


# ---- TorchScript ---------------------------------------------------------------------------------

FRESH_PROCESS = """
import json, sys
import torch, torchvision  # torchvision registers nms and roi_align, as for any detectron2 model
folder = sys.argv[1]
differences = {}
for variant in sys.argv[2:]:
    model = torch.jit.load(f"{folder}/{variant}.ts")
    saved = torch.load(f"{folder}/{variant}.expected.pt")
    largest = 0.0
    for image, expected in zip(saved["images"], saved["outputs"]):
        outputs = model(image)
        assert len(outputs) == len(expected)
        for got, want in zip(outputs, expected):
            assert got.shape == want.shape, (variant, got.shape, want.shape)
            if want.numel():
                largest = max(largest, (got.double() - want.double()).abs().max().item())
    differences[variant] = largest
leaked = sorted(name for name in sys.modules if name.split(".")[0] in ("gwdet", "detectron2"))
print(json.dumps({"differences": differences, "leaked": leaked}))
"""


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
def test_torchscript_outputs_match_eager_in_a_process_without_gwdet(tmp_path):
    variants = ["demo", "all_norms"]
    for variant in variants:
        model = build_tiny_model(variant)
        first, second = images()
        _, adapter = export_torchscript(model, first, str(tmp_path / f"{variant}.ts"))
        with torch.no_grad():  # on the traced image and on one of another size
            expected = [adapter(image) for image in (first, second)]
        assert_meaningful(adapter, expected[0])
        torch.save({"images": [first, second], "outputs": expected}, tmp_path / f"{variant}.expected.pt")
    result = subprocess.run(
        [sys.executable, "-c", FRESH_PROCESS, str(tmp_path), *variants],
        capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["leaked"] == []
    for variant in variants:
        assert report["differences"][variant] <= TOLERANCE, report


# ---- ONNX ------------------------------------------------------------------------------------------


class FeatureTuple(torch.nn.Module):
    """A detectron2 backbone returning its feature maps as a tuple (ONNX outputs)."""

    def __init__(self, backbone: torch.nn.Module) -> None:
        super().__init__()
        self.backbone = backbone

    def forward(self, x: torch.Tensor):
        features = self.backbone(x)
        return tuple(features[name] for name in sorted(features))


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning", "ignore::DeprecationWarning")
def test_onnx_backbone_and_fpn_match_onnxruntime(tmp_path):
    # GW (ItN) at S1-B2 of the ResNet, BGN at its other norms, BW_ItN in the FPN
    pytest.importorskip("onnxruntime")
    backbone = FeatureTuple(build_tiny_model("itn_bw_bgn").backbone).eval()
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(2, 3, 64, 64, generator=generator)
    path = str(tmp_path / "backbone.onnx")
    export_onnx(backbone, (x,), path)
    with torch.no_grad():
        expected = backbone(x)
    assert len(expected) == 5 and all(feature.std() > 0.1 for feature in expected)
    # float32 features reach |f| ~ 30 here: compare relative to their scale
    scale = max(1.0, max(feature.abs().max().item() for feature in expected))
    assert max_abs_difference(expected, run_onnx(path, [x])) <= TOLERANCE * scale


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning", "ignore::DeprecationWarning")
def test_onnx_full_model_matches_onnxruntime(tmp_path):
    # the demo model: GW in the ResNet (S1-B2), the FPN and both heads; GN elsewhere
    pytest.importorskip("onnxruntime")
    model = build_tiny_model("demo")
    image = images()[0]
    path = str(tmp_path / "model.onnx")
    adapter = export_model_onnx(model, image, path)
    with torch.no_grad():
        expected = adapter(image)
    assert_meaningful(adapter, expected)
    assert max_abs_difference(expected, run_onnx(path, [image])) <= TOLERANCE


def test_onnx_export_of_zca_names_the_itn_alternatives(tmp_path):
    backbone = FeatureTuple(build_tiny_model("all_norms").backbone).eval()
    with pytest.raises(RuntimeError) as error:
        export_onnx(backbone, (torch.randn(1, 3, 64, 64),), str(tmp_path / "zca.onnx"))
    message = str(error.value)
    assert "eigendecomposition" in message and "'GW'" in message and "'BW_ItN'" in message


# ---- tools/deploy/export_model.py --------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
def test_export_tool_scripts_the_model_and_checks_it(tmp_path, capsys):
    # detectron2's flags; --export-method scripting compiles gwdet's layers with the model
    from gwdet.export.export_model import main

    generator = np.random.default_rng(3)
    Image.fromarray(generator.integers(0, 255, (80, 96, 3), dtype=np.uint8)).save(tmp_path / "sample.png")
    argv = [
        "--config-file", str(DEMO_CONFIG), "--format", "torchscript", "--export-method", "scripting",
        "--sample-image", str(tmp_path / "sample.png"), "--output", str(tmp_path / "out"),
    ]
    assert main(argv + list(TINY_OPTS)) == 0
    scripted = torch.jit.load(str(tmp_path / "out" / "model.ts"))
    assert "GroupWhitening" in scripted.model.backbone.bottom_up.stem.conv1.norm.original_name
    printed = capsys.readouterr().out
    difference = float(printed.split("on the sample input: ")[-1].strip())
    assert difference <= TOLERANCE
