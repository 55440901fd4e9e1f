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
import torchvision
from detectron2.modeling import build_model
from detectron2.modeling.proposal_generator import proposal_utils
from detectron2.modeling.roi_heads import fast_rcnn
from PIL import Image

from conftest import DEMO_CONFIG, REPO, TINY_OPTS
from gwdet.engine import build_config
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


# ---- float64: the traced formulas and the fused op compute one function --------------------------
# In float32 the two implementations round differently and a deep random network amplifies that
# (configs/mask_rcnn_gw.yaml at 256 x 256: 2.7e-4 pixels in the boxes, docs/deploy.md). In float64
# rounding shrinks by 2^29, so any remaining difference would be a difference of formulas.

# configs/mask_rcnn_gw.yaml with its structure kept and its size cut: a ResNeXt (32 groups) with GW
# (g=64, T=5) in the stem and at B2 of every block, FrozenBN elsewhere; GW in the FPN, the 4conv1fc
# box head and the mask head. The 64 x 64 and 48 x 64 images of images() take the fused op through
# all its branches: one channel per group (stem, res2), several (most layers) and fewer columns than
# groups (res5 at 2 x 2).
HEADLINE_CONFIG = REPO / "configs" / "mask_rcnn_gw.yaml"
HEADLINE_AT_TEST_SIZE = [
    "MODEL.WEIGHTS", "", "MODEL.DEVICE", "cpu",
    "MODEL.RESNETS.DEPTH", "50", "MODEL.RESNETS.WIDTH_PER_GROUP", "2", "MODEL.RESNETS.RES2_OUT_CHANNELS", "128",
    "MODEL.FPN.OUT_CHANNELS", "128", "MODEL.ROI_BOX_HEAD.CONV_DIM", "128", "MODEL.ROI_BOX_HEAD.FC_DIM", "256",
    "MODEL.ROI_MASK_HEAD.CONV_DIM", "128",
    # random weights score every class near 1/81: keep all detections, fewer of them
    "MODEL.ROI_HEADS.SCORE_THRESH_TEST", "0.0", "MODEL.RPN.POST_NMS_TOPK_TEST", "100", "TEST.DETECTIONS_PER_IMAGE", "30",
]
# float64 rounding: measured 7.8e-15 (mask probabilities) and 4.9e-16 (scores); eps scaled by 1 + 1e-6
# in the traced formulas alone gives 2.8e-10 and 2.5e-11 (and by 1.01, 1.3e-4 pixels in the boxes)
FLOAT64_TOLERANCE = 1e-12


def batched_nms_in_scores_dtype(boxes, scores, idxs, iou_threshold):
    """detectron2's ``batched_nms`` without its cast of the boxes to float32.

    detectron2 casts the boxes to float32 (for float16's range) and torchvision's ``nms`` refuses
    scores of another dtype, so a float64 R-CNN stops at the RPN's NMS. This is the same torchvision
    call with the boxes in the scores' dtype (detectron2's ``Boxes`` hold float32 coordinates).
    """
    return torchvision.ops.batched_nms(boxes.to(scores.dtype), scores, idxs, iou_threshold)


def strengthen_output_layers(model):
    """Redraw the output layers detectron2 initializes near zero (RPN, box and mask predictors,
    std 0.01 and 0.001) with std ``1/sqrt(fan_in)``: scores, boxes and masks then follow the
    features at full strength instead of sitting at 1/81 and 0.5, so that a difference inside the
    network shows in the outputs."""
    layers = [
        model.proposal_generator.rpn_head.objectness_logits,
        model.proposal_generator.rpn_head.anchor_deltas,
        model.roi_heads.box_predictor.cls_score,
        model.roi_heads.box_predictor.bbox_pred,
        model.roi_heads.mask_head.predictor,
    ]
    generator = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for layer in layers:
            layer.weight.copy_(torch.randn(layer.weight.shape, generator=generator) * layer.weight[0].numel() ** -0.5)


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
def test_traced_formulas_equal_the_fused_op_in_float64_on_the_headline_structure(tmp_path, monkeypatch):
    for module in (proposal_utils, fast_rcnn):
        monkeypatch.setattr(module, "batched_nms", batched_nms_in_scores_dtype)
    torch.manual_seed(0)
    model = build_model(build_config(str(HEADLINE_CONFIG), HEADLINE_AT_TEST_SIZE)).eval().double()
    strengthen_output_layers(model)
    box_head = model.roi_heads.box_head
    assert len(box_head.conv_norm_relus) == 4 and len(box_head.fcs) == 1
    # stem + 16 blocks at B2, 8 in the FPN, 4 in each head
    assert count(model, GroupWhitening, num_groups=64, T=5, method="itn") == 1 + 16 + 8 + 4 + 4
    first, second = (image.double() for image in images())
    path = str(tmp_path / "headline_float64.ts")
    _, adapter = export_torchscript(model, first, path)
    loaded = torch.jit.load(path)
    # the file runs the reference formulas (ATen operators), not the op eager mode runs
    assert "gwdet::" not in str(loaded.inlined_graph)
    for image in (first, second):
        with torch.no_grad():
            expected, outputs = adapter(image), loaded(image)
        assert_meaningful(adapter, expected)
        want = adapter.outputs_schema(expected)[0]["instances"]
        got = adapter.outputs_schema(outputs)[0]["instances"]
        assert want.scores.dtype == want.pred_masks.dtype == got.scores.dtype == torch.float64
        assert torch.equal(got.pred_classes, want.pred_classes)
        # detectron2's Boxes store float32 coordinates: float32's bound
        assert (got.pred_boxes.tensor - want.pred_boxes.tensor).abs().max().item() <= TOLERANCE
        assert (got.scores - want.scores).abs().max().item() <= FLOAT64_TOLERANCE
        assert (got.pred_masks - want.pred_masks).abs().max().item() <= FLOAT64_TOLERANCE


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


def test_export_tool_keeps_an_earlier_export_and_leaves_nothing_when_it_cannot_check(tmp_path):
    """No detection on the sample image: nothing to compare, so nothing is written; an earlier
    export stays as it was unless --overwrite."""
    from gwdet.export.export_model import main

    Image.fromarray(np.zeros((64, 64, 3), dtype=np.uint8)).save(tmp_path / "blank.png")
    out = tmp_path / "out"
    argv = ["--config-file", str(DEMO_CONFIG), "--sample-image", str(tmp_path / "blank.png"), "--output", str(out)]
    no_detection = ["MODEL.ROI_HEADS.SCORE_THRESH_TEST", "1.0"]
    with pytest.raises(SystemExit, match="gave no detection.*nothing was written"):
        main(argv + list(TINY_OPTS) + no_detection)
    assert not out.exists(), "refused before anything was written"

    out.mkdir()
    (out / "model.ts").write_bytes(b"an earlier export")
    with pytest.raises(SystemExit, match="model.ts already exists; it is left as it is.*--overwrite"):
        main(argv + list(TINY_OPTS))
    with pytest.raises(SystemExit, match="gave no detection"):
        main(argv + ["--overwrite"] + list(TINY_OPTS) + no_detection)
    assert [p.name for p in out.iterdir()] == ["model.ts"] and (out / "model.ts").read_bytes() == b"an earlier export"
