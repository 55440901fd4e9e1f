"""Deploying GW models: TorchScript through detectron2's TracingAdapter (loaded in a process without
gwdet), ONNX in onnxruntime, the ZCA refusal, empty inputs (every layer on 0 samples, a Mask R-CNN on
an image without detections), and tools/deploy/export_model.py (its sample, its check, its files).

Every check compares numbers with the eager model (which runs gwdet's fused custom op), on the tiny
randomly initialized Mask R-CNNs of tests/tiny_models.py.
"""
import hashlib
import json
import math
import importlib.util
import os
import re
import subprocess
import shutil
import sys
import warnings

import numpy as np
import pytest

pytest.importorskip("detectron2.export", reason="detectron2 0.6's export module imports caffe2 (gwdet.export needs detectron2 >= 0.7)")

import torch
import torchvision
from detectron2.layers import get_norm
from detectron2.modeling import build_model
from detectron2.modeling.proposal_generator import proposal_utils
from detectron2.modeling.roi_heads import fast_rcnn
from PIL import Image

from conftest import DEMO_CONFIG, REPO, TINY_OPTS
from gwdet import known_norm_names
from gwdet import norm as gwdet_norm
from gwdet.model_zoo import build_config
from gwdet.export import (
    export_model_onnx,
    export_onnx,
    export_torchscript,
    max_abs_difference,
    run_onnx,
    tracing_adapter,
    verify_export,
)
from gwdet.errors import GwdetTypeError, GwdetValueError
from gwdet.layers import BatchGroupNorm, BatchWhitening, GroupWhitening
from gwdet.norms import norm_record
from gwdet.utils.atomic import record_checksum
from layer_cases import CATALOGUE_CHANNELS, CATALOGUE_PARAMS
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


def onnxruntime_outputs(path, batches, optimized=True):
    """The file's outputs for each of ``batches`` (a list of inputs each) from one onnxruntime
    session, with its graph optimizations (onnxruntime's default, as :func:`run_onnx` runs it) or
    without any: a file must run both ways, not only where a rewrite happens to hide a fault."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    if not optimized:
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    names = [entry.name for entry in session.get_inputs()]
    # the exporter drops inputs the graph does not use: fewer names than inputs is expected
    return [session.run(None, {name: tensor.numpy() for name, tensor in zip(names, inputs, strict=False)})
            for inputs in batches]


# ---- empty inputs: no ROI in a head --------------------------------------------------------------
# A head's norm layers see one sample per ROI, and an image without detections sends 0 ROIs through
# the mask head. Every gwdet layer, traced (or exported) on a non-empty batch, must then return an
# empty output in TorchScript and in onnxruntime.

# The layers of the norm catalogue with small hyper-parameters (layer_cases.py).
EMPTY_BATCH_LAYERS = CATALOGUE_PARAMS


class ConvAndNorm(torch.nn.Module):
    """A conv and one of gwdet's layers after it, as in detectron2's heads."""

    def __init__(self, name: str, channels: int = CATALOGUE_CHANNELS) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, channels, 3, padding=1)
        self.norm = get_norm(gwdet_norm(name, **EMPTY_BATCH_LAYERS[name]), channels)

    def forward(self, x):
        return self.norm(self.conv(x))


def trained_conv_and_norm(name):
    """:class:`ConvAndNorm` in evaluation mode, with an affine and running statistics of one
    training batch, so that neither is the identity."""
    torch.manual_seed(0)
    module = ConvAndNorm(name)
    with torch.no_grad():
        module.train()(torch.randn(6, 3, 5, 5) * 3 + 1)
        module.norm.weight.uniform_(0.5, 1.5)
        module.norm.bias.normal_()
    return module.eval()


def test_the_empty_batch_test_covers_every_gwdet_layer():
    gwdet_names = {name for name in known_norm_names()
                   if norm_record(name).builtin and norm_record(name).detectron2_values is None}
    assert gwdet_names == set(EMPTY_BATCH_LAYERS)


# (torch warns that the variance of BGN's empty blocks has no degree of freedom: there is none to compute)
@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning", "ignore::DeprecationWarning")
def test_torch_jit_traces_own_check_passes_for_zca_whitening():
    # "Graphs differed across invocations": the check traces again under no_grad, where the ZCA
    # graph left out its (zero-valued) first-order term
    module = trained_conv_and_norm("GW_ZCA")
    example = torch.randn(2, 3, 5, 5, generator=torch.Generator().manual_seed(4))
    traced = torch.jit.trace(module, (example,))  # check_trace on, parameters requiring grad
    with torch.no_grad():
        assert (traced(example) - module(example)).abs().max().item() <= 1e-5


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning", "ignore::DeprecationWarning",
                            r"ignore:var_mean\(\). degrees of freedom:UserWarning")
@pytest.mark.parametrize("name", sorted(EMPTY_BATCH_LAYERS))
def test_a_traced_layer_returns_an_empty_output_for_an_empty_batch(name, tmp_path):
    module = trained_conv_and_norm(name)
    generator = torch.Generator().manual_seed(3)
    example = torch.randn(2, 3, 5, 5, generator=generator)
    # 3 samples of another size, and none
    batch, empty = torch.randn(3, 3, 4, 6, generator=generator), torch.zeros(0, 3, 5, 5)
    with torch.no_grad():
        expected = module(batch)
        assert module(empty).shape == (0, 12, 5, 5)
    traced = torch.jit.trace(module, (example,), check_trace=False)
    torch.jit.save(traced, str(tmp_path / "layer.ts"))
    loaded = torch.jit.load(str(tmp_path / "layer.ts"))
    with torch.no_grad():
        out = loaded(empty)
        assert out.shape == (0, 12, 5, 5) and out.dtype == torch.float32
        assert (loaded(batch) - expected).abs().max().item() <= 1e-5
    if name == "GW_ZCA":
        return  # no eigendecomposition in ONNX (test_onnx_export_of_zca_names_the_itn_alternatives)
    pytest.importorskip("onnxruntime")
    path = str(tmp_path / "layer.onnx")
    export_onnx(module, (example,), path, input_names=["x"], dynamic_axes={"x": {0: "n", 2: "h", 3: "w"}})
    for optimized in (True, False):
        [[out_empty], [out]] = onnxruntime_outputs(path, [[empty], [batch]], optimized)
        assert out_empty.shape == (0, 12, 5, 5) and out_empty.dtype == np.float32
        assert max_abs_difference([expected], [out]) <= 1e-5


# ---- a GW Mask R-CNN on an image without detections ----------------------------------------------


def detector_with_and_without_detections(variant):
    """The tiny model of ``variant`` with a score threshold between the best scores of two 64 x 64
    images: ``(model, image with detections, image without)``. Its mask head then meets 0 ROIs on
    the second image. (An ONNX file takes images of the size it was traced at, hence one size.)"""
    model = build_tiny_model(variant)
    strengthen_output_layers(model)  # scores that follow the image, not 1/81 everywhere
    predictor = model.roi_heads.box_predictor
    predictor.test_score_thresh = 0.0
    generator = torch.Generator().manual_seed(6)
    candidates = [torch.rand(3, 64, 64, generator=generator) * 255 for _ in range(4)]
    with torch.no_grad():
        scores = [model.inference([{"image": image}], do_postprocess=False)[0].scores for image in candidates]
    best = [s.max().item() for s in scores]
    with_detections, without = candidates[best.index(max(best))], candidates[best.index(min(best))]
    threshold = (max(best) + min(best)) / 2
    # far from every score: float rounding in an exported file cannot move a detection across it
    assert min((torch.cat(scores) - threshold).abs()).item() > 1e-3
    predictor.test_score_thresh = threshold
    return model, with_detections, without


def detection_outputs(adapter, outputs):
    """boxes, scores, classes and masks of the exported model's outputs."""
    instances = adapter.outputs_schema(outputs)[0]["instances"]
    return [instances.pred_boxes.tensor, instances.scores, instances.pred_classes, instances.pred_masks]


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning", "ignore::DeprecationWarning")
def test_exported_mask_rcnn_runs_an_image_without_detections(tmp_path):
    # itn_bw_bgn: GW (the demo's mask head norm) in the mask head, BW_ItN in the FPN, BGN in the box
    # head and ResNet; the demo's whole export runs in onnxruntime in the export tool's ONNX test
    pytest.importorskip("onnxruntime")
    model, with_detections, without = detector_with_and_without_detections("itn_bw_bgn")
    rois = []
    mask_norm = model.roi_heads.mask_head.mask_fcn1.norm
    assert isinstance(mask_norm, GroupWhitening)
    hook = mask_norm.register_forward_pre_hook(lambda module, inputs: rois.append(inputs[0].shape[0]))
    with torch.no_grad():
        expected = {"with": tracing_adapter(model, with_detections)(with_detections)}
        expected["without"] = tracing_adapter(model, without)(without)
    hook.remove()
    assert rois[0] > 0 and rois[1] == 0, "the second image must reach the mask head's GW with no ROI"
    images = {"with": with_detections, "without": without}

    # traced on the image with detections, as the export tool does
    onnx_path = str(tmp_path / "model.onnx")
    adapter = export_model_onnx(model, with_detections, onnx_path)
    traced, _ = export_torchscript(model, with_detections, str(tmp_path / "model.ts"))
    runs = {"torchscript": lambda batches: [traced(image) for [image] in batches]}
    runs["onnxruntime"] = lambda batches: onnxruntime_outputs(onnx_path, batches)
    runs["onnxruntime, not optimized"] = lambda batches: onnxruntime_outputs(onnx_path, batches, optimized=False)
    for how, run in runs.items():
        with torch.no_grad():
            got = dict(zip(images, run([[image] for image in images.values()]), strict=True))
        empty = detection_outputs(adapter, [torch.as_tensor(output) for output in got["without"]])
        assert [tuple(t.shape) for t in empty] == [(0, 4), (0,), (0,), (0, 1, 28, 28)], how
        assert max_abs_difference(expected["with"], got["with"]) <= TOLERANCE, how
        assert len(detection_outputs(adapter, expected["with"])[1]) > 0


def test_onnx_export_of_zca_names_the_itn_alternatives(tmp_path):
    backbone = FeatureTuple(build_tiny_model("all_norms").backbone).eval()
    with pytest.raises(RuntimeError) as error:
        export_onnx(backbone, (torch.randn(1, 3, 64, 64),), str(tmp_path / "zca.onnx"))
    message = str(error.value)
    assert "eigendecomposition" in message and "'GW'" in message and "'BW_ItN'" in message


# ---- checksums: a damaged export is refused by name ----------------------------------------------


def _flip_a_byte(path, position=None):
    data = bytearray(path.read_bytes())
    data[len(data) // 2 if position is None else position] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
def test_a_torchscript_export_records_its_sha256_and_a_damaged_one_is_refused(tmp_path):
    import hashlib
    import warnings

    from gwdet.export import DamagedExportError, load_export

    model, image = build_tiny_model("demo"), images()[0]
    path = tmp_path / "model.ts"
    traced, _ = export_torchscript(model, image, str(path))
    record = (tmp_path / "model.ts.sha256").read_text()
    assert record == f"{hashlib.sha256(path.read_bytes()).hexdigest()}  model.ts\n"  # sha256sum's format
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.ts", "model.ts.sha256"]  # no temporary left
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = load_export(str(path))
    assert not [w for w in caught if "checksum" in str(w.message)], "a recorded export loads checked, without a warning"
    with torch.no_grad():
        assert max_abs_difference(traced(image), loaded(image)) == 0.0

    _flip_a_byte(path)
    with pytest.raises(DamagedExportError, match=r"model.ts is damaged \(its SHA-256 differs from the one recorded "
                                                 r"in model.ts.sha256 when it was written\). Export the model again"
                                                 r".* If you replaced it on purpose .*copy its model.ts.sha256 with it"):
        load_export(str(path))
    # through a link (current.ts -> releases/v3/model.ts): loaded with "no checksum record" before
    link = tmp_path / "link" / "current.ts"
    link.parent.mkdir()
    link.symlink_to(path)
    with pytest.raises(DamagedExportError, match=rf"current.ts is damaged \(its SHA-256 differs from the one recorded in "
                                                 rf"{tmp_path / 'model.ts.sha256'} when it was written\)"):
        load_export(str(link))
    # without a record: loaded unchecked with a warning; a file that is no TorchScript is still named
    (tmp_path / "model.ts.sha256").unlink()
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.warns(UserWarning, match="has no checksum record"), \
            pytest.raises(DamagedExportError, match=r"model.ts cannot be read as TorchScript .*Export the model again"):
        load_export(str(path))


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning", "ignore::DeprecationWarning")
def exported_gw_layer(folder):
    """A conv and a GW layer, its input and its ONNX export ``folder/layer.onnx``."""
    pytest.importorskip("onnxruntime")
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), GroupWhitening(8, num_groups=2)).eval()
    x = torch.randn(2, 3, 16, 16)
    path = folder / "layer.onnx"
    export_onnx(module, (x,), str(path))
    return module, x, path


def test_an_onnx_export_records_its_sha256_and_run_onnx_refuses_a_damaged_one(tmp_path):
    from gwdet.export import DamagedExportError, load_export

    module, x, path = exported_gw_layer(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["layer.onnx", "layer.onnx.sha256"]
    with torch.no_grad():
        expected = module(x)
    session = load_export(str(path))  # an onnxruntime session
    (output,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    assert max_abs_difference([expected], [output]) <= TOLERANCE
    _flip_a_byte(path, position=-20)
    for load in (lambda: run_onnx(str(path), [x]), lambda: load_export(str(path))):
        with pytest.raises(DamagedExportError, match=r"layer.onnx is damaged \(its SHA-256 differs .*layer.onnx.sha256"):
            load()


def test_run_onnx_names_an_input_of_another_dtype_or_size_and_takes_numpy_arrays(tmp_path):
    module, x, path = exported_gw_layer(tmp_path)
    with torch.no_grad():
        expected = module(x)
    assert max_abs_difference([expected], run_onnx(str(path), [x.numpy()])) <= TOLERANCE  # numpy: as a tensor
    for other in (x.double(), torch.randn(2, 3, 24, 16)):  # onnxruntime: "Unexpected input data type" / "Got: 24"
        with pytest.raises(ValueError, match=r"input 0 \('.*'\) of .*layer.onnx takes tensor\(float\) of shape .*, got "
                                             r"tensor\((double|float)\) of shape \[.*\]: the export is fixed to the dtype and "
                                             r"size of the sample image it was traced with"):
            run_onnx(str(path), [other])
    # before: a bare tensor was read as a list of its first dimension, and a second input left out without a word
    with pytest.raises(ValueError, match=r"^run_onnx takes a list of the export's inputs, e.g. \[image\], not one Tensor "
                                         r"of shape \[2, 3, 16, 16\]: put the image in a list.$"):
        run_onnx(str(path), x)
    with pytest.raises(ValueError, match=r"^run_onnx got 2 inputs, but .*layer.onnx takes 1 \('.*'\): an export of one "
                                         r"image per call runs once per image, run_onnx\(path, \[image\]\)\. Extra "
                                         r"inputs would be left out.$"):
        run_onnx(str(path), [x, x])


def test_an_export_under_the_other_formats_name_a_meta_device_and_no_path_are_named(tmp_path):
    # before: each was called damaged, with the advice to export again; None ended in a TypeError
    from gwdet.export import load_export

    _, x, path = exported_gw_layer(tmp_path)
    shutil.copyfile(path, tmp_path / "layer.ts")
    with pytest.raises(ValueError, match=r"layer.ts holds an ONNX model, which its name does not say: rename it to end "
                                         r"in .onnx \(gwdet reads the format from the name\); nothing was loaded.$"):
        load_export(str(tmp_path / "layer.ts"))
    traced = tmp_path / "traced.onnx"
    torch.jit.save(torch.jit.trace(torch.nn.Linear(2, 2), torch.zeros(1, 2)), str(traced))
    for load in (lambda: load_export(str(traced)), lambda: run_onnx(str(traced), [x])):
        with pytest.raises(ValueError, match=r"traced.onnx (holds a TorchScript archive, which its name does not say: "
                                             r"rename it to end in .ts|is a TorchScript export, not ONNX)"):
            load()
    shutil.move(traced, tmp_path / "traced.ts")
    with pytest.raises(ValueError, match=r"^map_location='meta' gives tensors without values"):
        load_export(str(tmp_path / "traced.ts"), map_location="meta")
    with pytest.raises(TypeError, match=r"^load_export takes the path of an export \(a str or pathlib.Path\), not None"):
        load_export(None)


def test_an_export_record_in_upper_case_or_damaged_a_record_or_a_checkpoint_given_are_named(tmp_path):
    # before: each was called a damaged export, with the advice to export again
    from gwdet.checkpoint.resilient import ResilientCheckpointer
    from gwdet.export import load_export, verify_export

    path = tmp_path / "model.ts"
    torch.jit.save(torch.jit.trace(torch.nn.Linear(2, 2), torch.zeros(1, 2)), str(path))
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    (tmp_path / "model.ts.sha256").write_text(f"{digest.upper()}  model.ts\n")  # as PowerShell writes it
    load_export(str(path))
    (tmp_path / "model.ts.sha256").write_text("")
    with pytest.warns(UserWarning, match=r"model.ts: its checksum record model.ts.sha256 is damaged, so the export "
                                         r"is loaded unchecked. Delete model.ts.sha256 \(or export again\)") as warned:
        load_export(str(path))
    assert not [w for w in warned if "has no checksum record" in str(w.message)]  # it has one, unusable
    with pytest.warns(UserWarning, match="loaded unchecked"):
        assert verify_export(str(path)) is False  # was True: as if it had been checked
    with pytest.raises(ValueError, match=r"model.ts.sha256 is the checksum record of an export, not the export: "
                                         r"pass .*model.ts.$"):
        load_export(str(tmp_path / "model.ts.sha256"))
    ResilientCheckpointer(torch.nn.Linear(2, 2), save_dir=str(tmp_path)).save("model_final")
    with pytest.raises(ValueError, match=r"model_final.pth is a checkpoint \(a torch.save "
                                                                    r"archive\), not a TorchScript export: export the "
                                                                    r"model with tools/deploy/export_model.py"):
        load_export(str(tmp_path / "model_final.pth"))
    with pytest.raises(ValueError, match=r"^map_location is 'gpu', which is not a PyTorch device: use 'cpu', 'cuda'"):
        load_export(str(path), map_location="gpu")


# ---- tools/deploy/export_model.py --------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
def test_export_tool_scripts_the_model_and_checks_it(tmp_path, capsys):
    # detectron2's flags; --export-method scripting compiles gwdet's layers with the model
    from gwdet.export.export_model import main

    generator = np.random.default_rng(3)
    Image.fromarray(generator.integers(0, 255, (80, 96, 3), dtype=np.uint8)).save(tmp_path / "sample.png")
    argv = [
        "--config-file", str(DEMO_CONFIG), "--untrained", "--format", "torchscript", "--export-method", "scripting",
        "--sample-image", str(tmp_path / "sample.png"), "--output", str(tmp_path / "out"),
    ]
    # a test set the export does not read, given its own image, need not be registered (a deployment machine)
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        assert main(argv + list(TINY_OPTS) + ["DATASETS.TEST", "('my_val',)"]) == 0
    # torch's advice to switch to torch.export, which cannot capture the R-CNN: not shown by the tool
    assert not [w for w in shown if "is deprecated. Please switch to" in str(w.message)]
    scripted = torch.jit.load(str(tmp_path / "out" / "model.ts"))
    assert "GroupWhitening" in scripted.model.backbone.bottom_up.stem.conv1.norm.original_name
    printed = capsys.readouterr().out
    difference = float(printed.split("on the sample input: ")[-1].splitlines()[0])
    assert difference <= TOLERANCE
    # "takes an image as a uint8 (C, H, W) tensor": called so, TorchScript refused it (it takes a tuple of dicts)
    assert 'The exported model takes a tuple of one dict per image, ({"image": image},), and returns a list of dicts ' \
           "of the detections' fields, one per image; each image as a uint8 (C, H, W) tensor" in printed
    image = torch.from_numpy(np.asarray(Image.open(tmp_path / "sample.png"))).permute(2, 0, 1).contiguous()
    assert "scores" in scripted(({"image": image},))[0]  # as the line says


def test_export_tool_keeps_an_earlier_export_and_leaves_nothing_when_it_cannot_check(tmp_path, capsys):
    """No detection on the sample image: nothing to compare, so nothing is written; an earlier
    export stays as it was unless --overwrite."""
    from gwdet.export.export_model import main

    Image.fromarray(np.zeros((64, 64, 3), dtype=np.uint8)).save(tmp_path / "blank.png")
    out = tmp_path / "out"
    argv = ["--config-file", str(DEMO_CONFIG), "--untrained", "--sample-image", str(tmp_path / "blank.png"), "--output",
            str(out)]
    no_detection = ["MODEL.ROI_HEADS.SCORE_THRESH_TEST", "1.0"]
    with pytest.raises(SystemExit) as refused:
        main(argv + list(TINY_OPTS) + no_detection)
    assert refused.value.code == 2 and re.search(": error: The sample image gave no detection.*nothing was written",
                                                 capsys.readouterr().err)
    assert not out.exists(), "refused before anything was written"

    out.mkdir()
    (out / "model.ts").write_bytes(b"an earlier export")
    record_checksum(str(out / "model.ts"))  # an export has its record: --overwrite replaces no other file
    with pytest.raises(SystemExit) as refused:
        main(argv + list(TINY_OPTS))
    assert refused.value.code == 2 and re.search("model.ts already exists; it is left as it is.*--overwrite",
                                                 capsys.readouterr().err)
    linked = tmp_path / "linked"  # a link to an export on a disk that is not mounted: replaced before
    linked.mkdir()
    (linked / "model.ts").symlink_to(tmp_path / "unmounted" / "model.ts")
    with pytest.raises(SystemExit) as refused:
        main(argv[:-1] + [str(linked)] + list(TINY_OPTS))
    assert refused.value.code == 2 and "model.ts already exists; it is left as it is" in capsys.readouterr().err
    assert (linked / "model.ts").is_symlink()
    with pytest.raises(SystemExit) as refused:
        main(argv + ["--overwrite"] + list(TINY_OPTS) + no_detection)
    assert refused.value.code == 2 and "gave no detection" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["model.ts", "model.ts.sha256"]
    assert (out / "model.ts").read_bytes() == b"an earlier export"


def test_export_tool_compares_on_the_first_sample_with_detections_or_says_there_is_none():
    from gwdet.export import export_model

    model, with_detections, without = detector_with_and_without_detections("demo")
    image, found = export_model.pick_sample(model, iter([without, with_detections]), "shapes_val (DATASETS.TEST[0])")
    assert image is with_detections and found > 0
    with pytest.raises(export_model.ExportCheckError, match=r"None of the first 2 images of shapes_val \(DATASETS.TEST\[0\]\) gave a "
                                         r"detection, so the export could not be compared.*nothing was written"):
        export_model.pick_sample(model, iter([without, without]), "shapes_val (DATASETS.TEST[0])")
    with pytest.raises(export_model.ExportCheckError, match="The sample image gave no detection.*nothing was written"):
        export_model.pick_sample(model, iter([without]))

    # without --sample-image the test set's images are tried in order, at most SAMPLE_SEARCH_LIMIT
    read = []

    class EndlessTestSet:  # what sample_candidates asks of a gwdet.engine.run.RunConfig
        def test_batches(self):
            for index in range(3 * export_model.SAMPLE_SEARCH_LIMIT):
                read.append(index)
                yield [{"image": without}]

        def describe_test_set(self):
            return "shapes_val (DATASETS.TEST[0])"

    images, source = export_model.sample_candidates(EndlessTestSet(), None)
    with pytest.raises(export_model.ExportCheckError, match=f"None of the first {export_model.SAMPLE_SEARCH_LIMIT} images of "
                                         r"shapes_val \(DATASETS.TEST\[0\]\) gave a detection"):
        export_model.pick_sample(model, images, source)
    assert len(read) == export_model.SAMPLE_SEARCH_LIMIT


def test_export_check_compares_only_outputs_that_hold_values():
    from gwdet.export.export_model import ExportCheckError, compared_difference

    boxes, size = torch.rand(3, 4), torch.tensor([64, 64])
    assert compared_difference([boxes, size], [boxes + 1e-3, size]) == pytest.approx(1e-3, rel=1e-3)
    # no detection: boxes, scores, classes and masks are empty, and only the image size would be compared
    with pytest.raises(ExportCheckError, match=r"outputs \[0\] are empty.*nothing was written"):
        compared_difference([torch.zeros(0, 4), size], [torch.zeros(0, 4), size])
    with pytest.raises(ExportCheckError, match=r"differ from the eager model's \(output 0: shape \(2, 4\), expected \(3, 4\)\)"):
        compared_difference([boxes, size], [boxes[:2], size])


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
def test_export_tool_replaces_an_export_only_with_overwrite_and_a_checked_file(tmp_path, monkeypatch, capsys):
    from gwdet.export import deploy
    from gwdet.export.export_model import main

    generator = np.random.default_rng(3)
    Image.fromarray(generator.integers(0, 255, (80, 96, 3), dtype=np.uint8)).save(tmp_path / "sample.png")
    out = tmp_path / "out"
    argv = ["--config-file", str(DEMO_CONFIG), "--untrained", "--sample-image", str(tmp_path / "sample.png"), "--output",
            str(out)]

    def interrupted(module, path):
        with open(path, "wb") as file:
            file.write(b"the first half of an export")
        raise RuntimeError("interrupted")

    with monkeypatch.context() as patch:
        patch.setattr(deploy, "save_script_module", interrupted)
        with pytest.raises(RuntimeError, match="interrupted"):
            main(argv + list(TINY_OPTS))
        assert not out.exists(), "the folder made for the export goes with its partial file"
        out.mkdir()
        (out / "model.ts").write_bytes(b"an earlier export")
        record_checksum(str(out / "model.ts"))  # an export has its record: --overwrite replaces no other file
        with pytest.raises(RuntimeError, match="interrupted"):
            main(argv + ["--overwrite"] + list(TINY_OPTS))
        assert sorted(p.name for p in out.iterdir()) == ["model.ts", "model.ts.sha256"]
        assert (out / "model.ts").read_bytes() == b"an earlier export"
    stale = out / f".model.ts.{_dead_pid()}.0123456789ab.partial"  # left by an export killed while writing
    stale.write_bytes(b"half an export")
    assert main(argv + ["--overwrite"] + list(TINY_OPTS)) == 0
    assert sorted(p.name for p in out.iterdir()) == ["model.ts", "model.ts.sha256"]
    printed = capsys.readouterr().out
    assert re.search(r"detection\(s\) matched by class and box; largest differences: boxes .* px, scores .*, mask "
                     r"probabilities .* \(tolerance 0.001: boxes 0.064 px, scores and mask probabilities 0.001\); "
                     r"largest absolute difference from the eager model on the sample input: ", printed), printed
    from gwdet.export import load_export

    assert load_export(str(out / "model.ts"))(torch.rand(3, 64, 80) * 255)[-1].tolist() == [64, 80]


# ---- the export's check: detections matched by class and box, then compared within a tolerance ------

def _detections(rows, masks=None):
    """``Detections`` from ``(class, score, x0, y0, x1, y1)`` rows."""
    from gwdet.export.detection_check import Detections

    table = torch.tensor(rows, dtype=torch.float64).reshape(-1, 6)
    return Detections(table[:, 2:], table[:, 1], table[:, 0], masks)


def test_near_equal_scores_in_the_other_order_are_the_same_detections():
    from gwdet.export.detection_check import compare_detections

    masks = torch.rand(3, 1, 28, 28, dtype=torch.float64)
    eager = _detections([(1, 0.81230, 10, 10, 30, 30), (2, 0.81229, 40, 5, 60, 50), (1, 0.3, 2, 40, 20, 62)], masks)
    swapped = [1, 0, 2]  # the export rounds the first two scores the other way round
    export = _detections([(2, 0.81231, 40, 5, 60, 50.00002), (1, 0.81230, 10, 10, 30, 30), (1, 0.3, 2, 40, 20, 62)],
                         masks[swapped] + 1e-6)
    in_order = (eager.boxes - export.boxes).abs().max().item()
    assert in_order == 30.0, "position by position, two different objects are compared"
    comparison = compare_detections(eager, export, (64, 64))
    assert comparison.problems == [] and comparison.matched == 3
    assert comparison.box == pytest.approx(2e-5) and comparison.score == pytest.approx(2e-5)
    assert comparison.mask == pytest.approx(1e-6)
    assert comparison.summary() == (
        "3 detection(s) matched by class and box; largest differences: boxes 2e-05 px, scores 2e-05, mask "
        "probabilities 1e-06 (tolerance 0.001: boxes 0.064 px, scores and mask probabilities 0.001)")
    # detections without masks (a Faster R-CNN's): the summary said "mask probabilities 0", as if compared
    assert compare_detections(_detections([(1, 0.5, 10, 10, 30, 30)]), _detections([(1, 0.5, 10, 10, 30, 30)]),
                              (64, 64)).summary() == (
        "1 detection(s) matched by class and box; largest differences: boxes 0 px, scores 0 (tolerance 0.001: boxes "
        "0.064 px, scores 0.001)")
    # a tolerance below the rounding: the same pairs, their differences named (each was "found by one side only")
    strict = compare_detections(eager, export, (64, 64), tolerance=1e-9)
    assert strict.matched == 3 and strict.problems == ["a matched detection's box differs by 2e-05 px",
                                                       "a matched detection's score differs by 2e-05",
                                                       "a matched detection's mask probabilities differ by up to 1e-06"]


def test_a_proposal_networks_proposals_are_matched_by_box_not_compared_in_order():
    # a ProposalNetwork's export was compared position by position: two proposals of near-equal
    # objectness in the other order were "outputs differ by 34.8", and the export refused
    from detectron2.structures import Boxes, Instances

    from gwdet.export.detection_check import Detections, compare_detections, detection_limits
    from gwdet.export.export_model import _instance_fields

    def proposals(rows):
        table = torch.tensor(rows, dtype=torch.float32)
        return [{"proposals": Instances((64, 64), proposal_boxes=Boxes(table[:, 1:]), objectness_logits=table[:, 0])}]

    eager = _instance_fields(proposals([(3.10001, 10, 10, 30, 30), (3.1, 40, 5, 60, 50)]))
    export = _instance_fields(proposals([(3.10001, 40, 5, 60, 50), (3.1, 10, 10, 30, 30)]))
    assert set(eager) == {"proposal_boxes", "objectness_logits"}
    comparison = compare_detections(Detections.from_fields(eager), Detections.from_fields(export), (64, 64))
    assert comparison.problems == [] and comparison.matched == 2 and comparison.box == 0
    model = build_tiny_model("demo")
    model.roi_heads = None  # as a ProposalNetwork: the proposal generator's test count is the limit
    assert detection_limits(model) == (None, model.proposal_generator.post_nms_topk[False])


def test_detections_beyond_the_tolerance_or_found_by_one_side_only_are_differences():
    from gwdet.export.detection_check import compare_detections

    eager = _detections([(1, 0.9, 10, 10, 30, 30), (2, 0.6, 40, 5, 60, 50), (3, 0.0502, 0, 0, 8, 8)])
    moved = _detections([(1, 0.9, 10, 10, 30, 35), (2, 0.6, 40, 5, 60, 50)])  # a box 5 px off; the last one dropped
    comparison = compare_detections(eager, moved, (64, 64), score_threshold=0.05)
    assert comparison.problems == ["only the eager model finds class 1 score 0.9000 box [10.0, 10.0, 30.0, 30.0]",
                                   "only the export finds class 1 score 0.9000 box [10.0, 10.0, 30.0, 35.0]"]
    assert comparison.refusal().startswith(
        "The exported model's detections differ from the eager model's on the sample image beyond the tolerance (2 "
        "difference(s): only the eager model finds class 1 score 0.9000 box [10.0, 10.0, 30.0, 30.0]; only the export "
        "finds class 1 score 0.9000 box [10.0, 10.0, 30.0, 35.0]); nothing was written. 1 detection(s) matched")
    # the detection at the score threshold is rounding's to keep or drop; another class is another detection
    assert compare_detections(eager, eager, (64, 64)).problems == []
    relabelled = _detections([(1, 0.9, 10, 10, 30, 30), (4, 0.6, 40, 5, 60, 50), (3, 0.0502, 0, 0, 8, 8)])
    assert len(compare_detections(eager, relabelled, (64, 64)).problems) == 2
    rescored = _detections([(1, 0.95, 10, 10, 30, 30), (2, 0.6, 40, 5, 60, 50)])
    assert compare_detections(eager, rescored, (64, 64), score_threshold=0.05).problems == [
        "a matched detection's score differs by 0.05"]
    # with as many detections as the model keeps, the lowest kept score is a cut rounding can move too
    first_two = _detections([(1, 0.9, 10, 10, 30, 30), (2, 0.6, 40, 5, 60, 50)])
    assert compare_detections(eager, first_two, (64, 64), max_detections=3).problems == []
    assert len(compare_detections(eager, first_two, (64, 64)).problems) == 1


def test_values_that_are_not_finite_are_differences_not_equalities():
    """NaN compares as no difference in max() and in a tolerance test: an export of NaN scores and
    masks passed its check."""
    from gwdet.export.detection_check import compare_detections

    masks = torch.rand(1, 1, 4, 4, dtype=torch.float64)
    eager = _detections([(1, 0.9, 10, 10, 30, 30)], masks)
    broken = _detections([(1, float("nan"), 10, 10, 30, 30)], masks * float("nan"))
    assert compare_detections(eager, broken, (64, 64)).problems == [
        "the export's scores hold values that are not finite (NaN or inf)",
        "the export's masks hold values that are not finite (NaN or inf)"]
    assert max_abs_difference([torch.ones(3)], [torch.tensor([float("nan"), 1.0, 5.0])]) == float("inf")
    assert max_abs_difference([torch.tensor([float("inf"), 1.0])], [torch.tensor([float("inf"), 1.5])]) == 0.5


# nested outputs (detectron2's are) raised torch's "only one element tensors can be converted to Python scalars"
def test_max_abs_difference_compares_nested_outputs_item_by_item_and_names_where_they_differ_in_kind():
    a = torch.ones(2)
    assert max_abs_difference([[a]], [[a + 1]]) == 1.0
    assert max_abs_difference([(a, [a])], [(a, [a * 3])]) == 2.0
    assert max_abs_difference([[1.0, 2.0]], [[1.0, 2.5]]) == 0.5  # a list of numbers: one array
    with pytest.raises(ValueError, match=r"^output 0: a Tensor, expected a list: give both sides' outputs nested"):
        max_abs_difference([[a]], [a])
    with pytest.raises(ValueError, match=r"^2 outputs expected in output 0, got 1$"):
        max_abs_difference([[a, a]], [[a]])
    with pytest.raises(ValueError, match=r"^output 0.0: shape \(1, 2\), expected \(2,\)$"):
        max_abs_difference([[a]], [[a[None]]])


def test_an_export_into_a_folder_is_refused_before_tracing(tmp_path):
    with pytest.raises(IsADirectoryError, match=r"is a folder: give the path of the file to write, e.g. .*model.ts"):
        export_torchscript(None, torch.zeros(3, 8, 8), str(tmp_path))  # no model needed: nothing is traced
    with pytest.raises(IsADirectoryError, match=r"is a folder: give the path of the file to write, e.g. .*model.onnx"):
        export_onnx(torch.nn.Identity(), (torch.zeros(1),), str(tmp_path))
    # a user's file or a checkpoint at the path was replaced without a word
    (tmp_path / "model_final.pth").write_bytes(b"my checkpoint")
    for export in (lambda path: export_torchscript(None, torch.zeros(3, 8, 8), path),
                   lambda path: export_onnx(torch.nn.Identity(), (torch.zeros(1),), path),
                   lambda path: export_model_onnx(None, torch.zeros(3, 8, 8), path)):
        with pytest.raises(FileExistsError, match=r"model_final.pth exists: an export replaces it only with "
                                                  r"overwrite=True"):
            export(str(tmp_path / "model_final.pth"))
    assert (tmp_path / "model_final.pth").read_bytes() == b"my checkpoint"
    with pytest.raises(ValueError, match=r"The export's path is empty"):
        export_torchscript(None, torch.zeros(3, 8, 8), "")
    # inside torch.autocast: the file was written and failed when run normally (torchvision's nms dtypes)
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(ValueError, match=r"The export runs inside "
                                                                                       r"torch.autocast \(cpu\)"):
        export_torchscript(None, torch.zeros(3, 8, 8), str(tmp_path / "model.ts"))
    # opsets 13 to 15 exported detectron2's aligned ROIAlign as another function, accepted by every check
    with pytest.raises(ValueError, match=r"^opset 14: a detector's ROIAlign .* from opset 16 on"):
        export_model_onnx(None, torch.zeros(3, 8, 8), str(tmp_path / "model.onnx"), opset=14)


def _sample_image(folder):
    generator = np.random.default_rng(3)
    Image.fromarray(generator.integers(0, 255, (80, 96, 3), dtype=np.uint8)).save(folder / "sample.png")
    return folder / "sample.png"


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
def test_export_tool_refuses_an_export_beyond_its_tolerance_and_one_into_a_folder_another_export_holds(tmp_path,
                                                                                                         capsys):
    from gwdet.export.export_model import ExportFolderLock, main

    out = tmp_path / "out"
    argv = ["--config-file", str(DEMO_CONFIG), "--untrained", "--sample-image", str(_sample_image(tmp_path)),
            "--output", str(out)]
    with pytest.raises(SystemExit) as refused:
        main(argv + ["--tolerance", "1e-12"] + list(TINY_OPTS))  # float rounding alone exceeds it
    printed = capsys.readouterr().err
    assert refused.value.code == 2 and "beyond the tolerance" in printed and "nothing was written" in printed
    assert not out.exists()
    out.mkdir()
    with ExportFolderLock(str(out)), pytest.raises(SystemExit) as refused:
        main(argv + list(TINY_OPTS))
    assert refused.value.code == 2 and f"--output {out} is in use by another export" in capsys.readouterr().err
    assert os.listdir(out) == []
    # a training's folder while it trains: "another export", after the model was built and traced
    from gwdet.engine.output_dir import OutputDirLock

    with OutputDirLock(str(out)), pytest.raises(SystemExit) as refused:
        main(argv + list(TINY_OPTS))
    assert refused.value.code == 2 and (f"--output {out} is in use by a training run (pid {os.getpid()}), whose "
                                        "output folder it is; nothing was written") in capsys.readouterr().err


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
def test_the_export_tool_writes_and_checks_an_onnx_export(tmp_path, capsys):
    """The demo model (GW in the ResNet at S1-B2, the FPN and both heads) exported to ONNX: the tool
    compares onnxruntime's detections with the eager model's within its tolerance and fails beyond
    it. It checks its file under a temporary name before the file takes model.onnx: run_onnx reads
    the format from the content there (it refused the file as misnamed, so no ONNX export was written)."""
    pytest.importorskip("onnxruntime")
    from gwdet.export.export_model import main

    out = tmp_path / "out"
    argv = ["--config-file", str(DEMO_CONFIG), "--untrained", "--sample-image", str(_sample_image(tmp_path)),
            "--format", "onnx", "--output", str(out), *TINY_OPTS]
    assert main(argv) == 0, capsys.readouterr().err
    assert sorted(os.listdir(out)) == ["model.onnx", "model.onnx.sha256"]
    assert len(run_onnx(str(out / "model.onnx"), [torch.zeros(3, 53, 64, dtype=torch.uint8)])) >= 3  # the sample after the resize
    # the file's inputs and outputs named by what they hold (before: x.1, boxes.35, value.3, value.7, ...)
    import onnxruntime

    session = onnxruntime.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    names = ["pred_boxes", "pred_classes", "pred_masks", "scores", "image_size"]
    assert [i.name for i in session.get_inputs()] == ["image"] and [o.name for o in session.get_outputs()] == names
    assert f"Its input is named image; its outputs, in order: {', '.join(names)}" in capsys.readouterr().out


def _dead_pid() -> int:
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)


@pytest.mark.parametrize("record", ["SHA256 (model.ts) = {}\n", "SHA2-256(model.ts)= {}\n", "SHA256(model.ts)= {}\n"],
                         ids=["shasum --tag", "openssl 3", "openssl 1.1"])
def test_a_bsd_format_checksum_record_checks_the_export(tmp_path, record):
    # the record `shasum --tag` / `openssl dgst -sha256` writes was called damaged, the export loaded unchecked
    from gwdet.export import DamagedExportError, verify_export

    path = tmp_path / "model.ts"
    torch.jit.save(torch.jit.trace(torch.nn.Linear(2, 2), torch.zeros(1, 2)), str(path))
    (tmp_path / "model.ts.sha256").write_text(record.format(hashlib.sha256(path.read_bytes()).hexdigest()))
    assert verify_export(str(path)) is True
    path.write_bytes(path.read_bytes() + b"x")
    with pytest.raises(DamagedExportError):
        verify_export(str(path))


def test_a_sample_image_of_another_layout_or_a_model_on_meta_is_refused_by_name(tmp_path):
    # detectron2's raw "The size of tensor a (64) must match ..." and torch's "cond must be a bool"
    from gwdet.engine.trainer import Trainer
    from gwdet.export import export_torchscript
    from gwdet.model_zoo import build_config

    from conftest import DEMO_CONFIG, TINY_OPTS

    model = Trainer.build_model(build_config(str(DEMO_CONFIG), TINY_OPTS))
    for image in (torch.zeros(64, 64, 3), torch.zeros(4, 64, 64), torch.zeros(1, 3, 64, 64)):
        with pytest.raises(ValueError, match=rf"The sample image has shape {list(image.shape)}".replace("[", r"\[")
                           + r"; the model takes one image as a \(C, H, W\) tensor of 3 channels"):
            export_torchscript(model, image, str(tmp_path / "model.ts"))
    meta = Trainer.build_model(build_config(str(DEMO_CONFIG), TINY_OPTS + ["MODEL.DEVICE", "meta"]))
    with pytest.raises(ValueError, match="The model is on the meta device"):
        export_torchscript(meta, torch.zeros(3, 64, 64), str(tmp_path / "model.ts"))
    # a float64 image ended in torch's "expected scalar type Double but found Float" inside the trace
    with pytest.raises(ValueError, match=re.escape(
            "The sample image is torch.float64, and the model normalizes it with its torch.float32 pixel mean, so it "
            "would reach the model's torch.float32 layers as torch.float64 (torch's dtype error inside the trace): "
            "give it as uint8, as detectron2's test loader does, or as torch.float32 (image.to(torch.float32)).")):
        export_torchscript(model, torch.zeros(3, 64, 64, dtype=torch.float64), str(tmp_path / "model.ts"))
    assert not (tmp_path / "model.ts").exists()


def _run_eval_refusal(run, capsys) -> str:
    """What the export tool prints when it refuses ``--run-eval --output run`` (exit status 2)."""
    from gwdet.export.export_model import main

    argv = ["--config-file", str(DEMO_CONFIG), "--untrained", "--run-eval", "--output", str(run), *TINY_OPTS]
    with pytest.raises(SystemExit) as refused:
        main(argv)
    assert refused.value.code == 2
    return capsys.readouterr().err


def test_run_eval_into_a_finished_runs_folder_is_refused_before_the_export(tmp_path, capsys):
    # --run-eval --output <a LazyConfig run>: the run's inference/coco_instances_results.json replaced by the export's
    run = tmp_path / "run"
    (run / "inference").mkdir(parents=True)
    (run / "inference" / "coco_instances_results.json").write_text("[]")
    (run / "results.json").write_text("{}")
    printed = _run_eval_refusal(run, capsys)
    assert (f"which holds the detections of the finished run in {run} "
            "(coco_instances_results.json, which its results.json describes)") in printed
    assert f"--output {run / 'deploy'}" in printed and sorted(os.listdir(run)) == ["inference", "results.json"]


def test_run_eval_into_a_training_runs_folder_is_refused_before_the_export(tmp_path, capsys):
    # --run-eval --output <a yacs run>: the export's detections went into the run's inference/ beside its
    # shapes_val/, and a later --overwrite of the run deleted them as the run's
    run = tmp_path / "run"
    (run / "inference" / "shapes_val").mkdir(parents=True)
    (run / "model_final.pth").write_bytes(b"weights")
    printed = _run_eval_refusal(run, capsys)
    assert (f"--output {run} holds a training run (model_final.pth), and --run-eval "
            "writes its evaluation into inference/ there") in printed
    assert f"--output {run / 'deploy'}" in printed and sorted(os.listdir(run)) == ["inference", "model_final.pth"]


def test_run_eval_into_a_folder_of_an_earlier_evaluation_is_refused_without_overwrite(tmp_path, capsys):
    # the export moved away, an earlier --run-eval's detections left in inference/: replaced without a word
    from gwdet.export.export_model import main

    (tmp_path / "inference").mkdir()
    (tmp_path / "inference" / "instances_predictions.pth").write_bytes(b"earlier")
    argv = ["--config-file", str(DEMO_CONFIG), "--untrained", "--run-eval", "--output", str(tmp_path), *TINY_OPTS]
    with pytest.raises(SystemExit) as refused:
        main(argv)
    assert refused.value.code == 2 and (
        f"--output {tmp_path} holds an earlier evaluation's detections (instances_predictions.pth in inference/), which "
        "--run-eval would replace; nothing was written. Pass --overwrite to replace them") in capsys.readouterr().err
    assert (tmp_path / "inference" / "instances_predictions.pth").read_bytes() == b"earlier"
    # --overwrite of the export without --run-eval: the detections of the replaced model were left beside the new one
    (tmp_path / "model.ts").write_bytes(b"an earlier export")
    argv = ["--config-file", str(DEMO_CONFIG), "--untrained", "--overwrite", "--output", str(tmp_path), *TINY_OPTS]
    with pytest.raises(SystemExit) as refused:
        main(argv)
    assert refused.value.code == 2 and (
        f"--output {tmp_path} holds the detections of an earlier --run-eval (instances_predictions.pth in inference/), "
        "of the model.ts that --overwrite replaces: they would be left beside a model they are not of; nothing was "
        "written. Add --run-eval") in capsys.readouterr().err
    assert (tmp_path / "model.ts").read_bytes() == b"an earlier export"


class _Doubling(torch.nn.Module):
    """A module that takes detectron2's inputs (a list of dicts with "image") and doubles the image."""

    def forward(self, inputs):
        return inputs[0]["image"] * 2


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
def test_an_export_under_the_name_of_another_format_is_refused_before_tracing(tmp_path):
    # a TorchScript archive written as model.onnx / model.pth, an ONNX model as model2.ts, without a word

    image = torch.zeros(3, 8, 8)
    for path, writer, fix in ((tmp_path / "out" / "model.onnx", "export_torchscript", "out/model.ts"),
                              (tmp_path / "model.pth", "export_torchscript", "model.ts"),
                              (tmp_path / "model", "export_torchscript", "model.ts")):
        with pytest.raises(ValueError, match=rf"^{writer} writes a TorchScript archive, which gwdet names \.ts .*"
                                             rf"Give a path ending in \.ts, e.g. '.*{re.escape(fix)}'; nothing was "
                                             "written"):
            export_torchscript(None, image, str(path))  # no model needed: nothing is traced
    with pytest.raises(ValueError, match=r"'.*model.onnx' ends in \.onnx, the name of an ONNX model"):
        export_torchscript(None, image, str(tmp_path / "model.onnx"))
    with pytest.raises(ValueError, match=r"^export_model_onnx writes an ONNX model, which gwdet names \.onnx .*"
                                         r"'.*model2.ts' ends in \.ts, the name of a TorchScript archive. Give a path "
                                         r"ending in \.onnx, e.g. '.*model2.onnx'; nothing was written"):
        export_model_onnx(None, image, str(tmp_path / "model2.ts"))
    with pytest.raises(ValueError, match=r"^export_onnx writes an ONNX model, .* 'layer.pt' ends in \.pt"):
        export_onnx(torch.nn.Identity(), (torch.zeros(1),), "layer.pt")
    assert sorted(os.listdir(tmp_path)) == []
    export_torchscript(_Doubling(), image, str(tmp_path / "model.ts"))
    assert sorted(os.listdir(tmp_path)) == ["model.ts", "model.ts.sha256"]


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
def test_the_deploy_page_says_the_loaded_torchscript_module_takes_3_h_w_unchecked(tmp_path):
    # an (H, W, C) image gave TorchScript's raw "The size of tensor a (128) must match ..." with no word on the page
    from gwdet.export import load_export

    page = " ".join((REPO / "docs" / "deploy.md").read_text().split())
    assert ("The TorchScript module is the file's, unwrapped: a traced export takes one image as a `(3, H, W)` tensor "
            "and does not check it.") in page
    model, image = build_tiny_model("demo"), images()[0]
    export_torchscript(model, image, str(tmp_path / "model.ts"))
    loaded = load_export(str(tmp_path / "model.ts"))
    assert isinstance(loaded, torch.jit.ScriptModule)  # what torch.jit.load gives, as the page says
    height = image.shape[1]
    with pytest.raises(RuntimeError, match=rf"The size of tensor a \({height}\) must match the size of tensor b \(3\)"):
        loaded(image.permute(1, 2, 0).contiguous())
    assert "own error (`The size of tensor a (128) must match the size of tensor b (3)" in page
    with torch.no_grad():
        assert len(loaded(image[:1])) == len(loaded(image))  # one channel: broadcast, as the page says
    assert "a one-channel `(1, H, W)` image is broadcast to three channels without a word" in page


def test_overwrite_replaces_an_earlier_export_only_not_a_users_own_file(tmp_path, capsys):
    # before: --overwrite replaced a user's own model.ts / model.onnx (text, or a TorchScript / ONNX model saved
    # otherwise: no .sha256 record) by the export without a word
    from gwdet.export import export_model

    own_ts = tmp_path / "own.ts"
    torch.jit.script(torch.nn.Linear(3, 2)).save(str(own_ts))
    cases = [("torchscript", "model.ts", "a TorchScript", b"my own model\n"),
             ("onnx", "model.onnx", "an ONNX", b"my own model\n"),
             ("torchscript", "model.ts", "a TorchScript", own_ts.read_bytes()),
             ("onnx", "model.onnx", "an ONNX", b"\x08\x07\x12\x07pytorch")]
    for number, (export_format, name, kind, data) in enumerate(cases):
        out = tmp_path / f"{export_format}-{number}"
        out.mkdir()
        (out / name).write_bytes(data)
        with pytest.raises(SystemExit) as refused:
            export_model.main(["--config-file", str(DEMO_CONFIG), "--untrained", "--format", export_format,
                               "--output", str(out), "--overwrite", *TINY_OPTS])
        assert refused.value.code == 2 and (
            f"error: --overwrite replaces an earlier export, and {out / name} is none: it has no {name}.sha256 record "
            f"beside it (which every export gets), so it is a file of yours ({kind} model saved otherwise included) "
            f"that the export would delete; nothing was written. Move it out of {out} (or delete it yourself), or "
            "choose another --output.") in capsys.readouterr().err
        assert os.listdir(out) == [name] and (out / name).read_bytes() == data
        assert not export_model.is_export_file(str(out / name))
        (out / f"{name}.sha256").write_text("my notes\n")  # a file of the user's named like a record: no record
        assert not export_model.is_export_file(str(out / name))
        os.remove(out / f"{name}.sha256")
        record_checksum(str(out / name))  # the record of an export (one replaced by hand is still one)
        assert export_model.is_export_file(str(out / name))


def test_a_sample_image_given_as_a_url_is_named_with_the_download(tmp_path, capsys):
    # before: "--sample-image http://example.com/a.jpg does not exist.", with no way out
    from gwdet.export.export_model import main

    with pytest.raises(SystemExit) as refused:
        main(["--config-file", str(DEMO_CONFIG), "--untrained", "--output", str(tmp_path / "out"), "--sample-image",
              "http://example.com/a.jpg", *TINY_OPTS])
    assert refused.value.code == 2 and (
        "error: --sample-image 'http://example.com/a.jpg' is a URL, and the tool reads a local image file: download it "
        "first (e.g. curl -o sample.jpg http://example.com/a.jpg) and give its path (--sample-image sample.jpg); nothing "
        "was written.") in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_deformable_convolutions_without_detectron2s_compiled_ops_are_named(tmp_path, monkeypatch, capsys):
    # before: a raw "ImportError: Cannot import 'detectron2._C', therefore 'DeformConv' is not available" traceback
    # from export_model.py and analyze_model.py, exit status 1
    from detectron2.modeling.backbone import resnet
    from detectron2.utils.develop import create_dummy_class

    from gwdet.export import analyze_model, export_model

    # detectron2 without _C (the registry wheel) has this class in place of DeformConv; so does this test
    monkeypatch.setattr(resnet, "DeformConv", create_dummy_class(
        "DeformConv", "detectron2._C", "detectron2 is not compiled successfully, please build following the "
                                       "instructions!"))
    deform = ["MODEL.RESNETS.DEFORM_ON_PER_STAGE", "[False,False,False,True]"]
    expected = ("error: MODEL.RESNETS.DEFORM_ON_PER_STAGE [False, False, False, True] asks for deformable convolutions: "
                "detectron2's DeformConv needs detectron2's compiled ops (detectron2._C), and this detectron2 has none "
                "(the default registry wheel's never loads){outcome}. Set it to all False "
                "(MODEL.RESNETS.DEFORM_ON_PER_STAGE \"[False,False,False,False]\"), or build detectron2 from source into "
                "the environment (make setup D2_SOURCE=git+https://github.com/facebookresearch/detectron2.git; "
                "docs/install.md, detectron2 versions).")
    with pytest.raises(SystemExit) as refused:
        export_model.main(["--config-file", str(DEMO_CONFIG), "--untrained", "--output", str(tmp_path / "out"),
                           *TINY_OPTS, *deform])
    assert refused.value.code == 2 and expected.format(outcome="; nothing was written") in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    with pytest.raises(SystemExit) as refused:
        analyze_model.main(["--config-file", str(DEMO_CONFIG), "--tasks", "structure", *TINY_OPTS, *deform])
    assert refused.value.code == 2 and expected.format(outcome="") in capsys.readouterr().err
    with pytest.raises(ImportError, match="MODEL.RESNETS.DEFORM_ON_PER_STAGE") as shown:  # --verbose: the traceback
        analyze_model.main(["--config-file", str(DEMO_CONFIG), "--tasks", "structure", "--verbose", *TINY_OPTS, *deform])
    assert "Cannot import 'detectron2._C', therefore 'DeformConv'" in str(shown.value.__cause__)


# before: a float64 GW was exported without a word into an ONNX file that onnx.checker and onnxruntime reject
@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning", "ignore::DeprecationWarning")
def test_an_onnx_export_the_checker_rejects_is_refused_before_it_is_written(tmp_path):
    pytest.importorskip("onnx")
    x = torch.randn(2, 16, 6, 6, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"^The ONNX file exported for .*gw64\.onnx is invalid, and onnxruntime would "
                                         r"refuse to load it \(onnx\.checker: .*Mismatched tensor element type.*\)\. "
                                         r"The model or its inputs are float64, .* export in float32 .*; nothing "
                                         r"was written\.$"):
        export_onnx(GroupWhitening(16, num_groups=4).double(), (x,), str(tmp_path / "gw64.onnx"))
    assert list(tmp_path.iterdir()) == []
    export_onnx(GroupWhitening(16, num_groups=4).float(), (x.float(),), str(tmp_path / "gw32.onnx"))  # the fix
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gw32.onnx", "gw32.onnx.sha256"]


# torch's dynamo exporter wrote the weights beside the file under the temporary name (.gw.onnx.<pid>.<id>.partial.data),
# which the renamed file then referenced
def test_a_dynamo_onnx_export_is_one_file_holding_its_weights(tmp_path):
    pytest.importorskip("onnxscript")
    layer = GroupWhitening(16, num_groups=4).eval()
    x = torch.randn(2, 16, 4, 4, generator=torch.Generator().manual_seed(0))
    path = str(tmp_path / "gw.onnx")
    export_onnx(layer, (x,), path, dynamo=True)
    assert sorted(os.listdir(tmp_path)) == ["gw.onnx", "gw.onnx.sha256"]
    if importlib.util.find_spec("onnxruntime") is not None:
        with torch.no_grad():
            assert max_abs_difference((layer(x),), run_onnx(path, [x])) <= TOLERANCE


def test_load_export_refuses_a_device_argument_of_the_other_format_or_one_it_cannot_honour(tmp_path):
    # before: map_location of an ONNX file and providers of a TorchScript file were ignored (a CPU model,
    # no word), and providers as a string reached onnxruntime as its letters ("Unknown Provider Type: C")
    import onnxruntime

    from gwdet.export import load_export

    _, x, path = exported_gw_layer(tmp_path)
    with pytest.raises(TypeError, match=r"^providers takes a list of onnxruntime execution providers, not "
                                        r"'CPUExecutionProvider': give e.g. providers=\['CPUExecutionProvider'\] "):
        load_export(str(path), providers="CPUExecutionProvider")
    session = load_export(str(path), map_location="cpu")
    assert session.get_providers() == ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        for give in ({"map_location": "cuda"}, {"providers": ["CUDAExecutionProvider"]}):
            with pytest.raises(ValueError, match=r"CUDAExecutionProvider.*which this onnxruntime lacks \(it has \["):
                load_export(str(path), **give)
    with pytest.raises(ValueError, match=r"^map_location='meta' has no ONNX form: .*layer.onnx runs in onnxruntime"):
        load_export(str(path), map_location="meta")
    with pytest.raises(ValueError, match=r"^load_export got both map_location='cpu' and providers="):
        load_export(str(path), map_location="cpu", providers=["CPUExecutionProvider"])
    traced = tmp_path / "traced.ts"
    torch.jit.save(torch.jit.trace(torch.nn.Linear(2, 2), torch.zeros(1, 2)), str(traced))
    with pytest.warns(UserWarning, match="has no checksum record"), \
            pytest.raises(ValueError, match=r"^providers=\['CUDAExecutionProvider'\] are onnxruntime's execution "
                                            r"providers, which .*traced.ts \(a TorchScript export\) does not use: give "
                                            r"its device as map_location, e.g. map_location='cuda'"):
        load_export(str(traced), providers=["CUDAExecutionProvider"])


def test_run_onnx_copies_a_flipped_numpy_image_and_refuses_a_dict_by_name(tmp_path):
    # before: a numpy view of negative strides ended in torch's "At least one stride ... is negative", and a
    # dict in torch's "new(): invalid data type 'str'"
    module, x, path = exported_gw_layer(tmp_path)
    flipped = x.numpy()[:, :, ::-1]
    with torch.no_grad():
        expected = module(x.flip(2))
    assert max_abs_difference([expected], run_onnx(str(path), [flipped])) <= TOLERANCE
    with pytest.raises(TypeError, match=r"^run_onnx takes a list of the export's inputs in their order, e.g. \[image\], "
                                        r"not a dict \(keys \['image'\]\): give run_onnx\(path, \[image\]\)"):
        run_onnx(str(path), {"image": x})


def _training_flags(model):
    return {name: module.training for name, module in model.named_modules()}


# an export of a model in training mode left it (and every submodule) in evaluation mode without a word
@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning", "ignore::DeprecationWarning")
def test_an_export_gives_the_model_back_in_the_modes_it_had(tmp_path):
    model = build_tiny_model("demo", training=True)
    model.backbone.bottom_up.stem.eval()  # a frozen part of a model in training: each module's own flag comes back
    modes = _training_flags(model)
    image = images()[0]
    traced, adapter = export_torchscript(model, image, str(tmp_path / "bn_train.ts"))
    assert _training_flags(model) == modes and not traced.training
    with torch.no_grad():  # the adapter runs the eager model in evaluation mode, as the export does
        assert max_abs_difference(traced(image), adapter(image)) <= TOLERANCE
    assert _training_flags(model) == modes
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), GroupWhitening(8, num_groups=2)).train()
    export_onnx(module, (torch.randn(2, 3, 16, 16),), str(tmp_path / "layer.onnx"))
    assert all(layer.training for layer in module.modules())
    backbone = FeatureTuple(build_tiny_model("all_norms").backbone).train()  # a failed export (ZCA has no ONNX form)
    modes = _training_flags(backbone)
    with pytest.raises(RuntimeError, match="eigendecomposition"):
        export_onnx(backbone, (torch.randn(1, 3, 64, 64),), str(tmp_path / "zca.onnx"))
    assert _training_flags(backbone) == modes


# run_onnx(load_export('model.onnx'), [img]) raised "TypeError: stat: path should be string, ..."; a copy without its
# .sha256 ran without a word, while load_export warned
def test_run_onnx_takes_load_exports_session_and_warns_of_a_file_without_a_record(tmp_path):
    from gwdet.export import load_export

    module, x, path = exported_gw_layer(tmp_path)
    with torch.no_grad():
        expected = module(x)
    assert max_abs_difference([expected], run_onnx(load_export(str(path)), [x])) <= TOLERANCE
    with pytest.raises(TypeError, match=r"^run_onnx runs an ONNX export given as the path of its file \(a str or "
                                        r"pathlib.Path\) or as the onnxruntime InferenceSession "
                                        r"gwdet.export.load_export\(path\) gives, not 3: "):
        run_onnx(3, [x])
    copy = tmp_path / "copy.onnx"
    shutil.copyfile(path, copy)
    with pytest.warns(UserWarning, match=r"copy.onnx has no checksum record \(copy.onnx.sha256 beside it\), so it is "
                                         r"loaded unchecked") as caught:
        outputs = run_onnx(copy, [x])
    assert max_abs_difference([expected], outputs) <= TOLERANCE
    assert [warning.filename for warning in caught] == [__file__]
    with warnings.catch_warnings():  # a file with its record: no warning
        warnings.simplefilter("error")
        run_onnx(str(path), [x])


# overwrite='no' replaced the user's file (a string is true), dynamo='no' ran the dynamo exporter, opset=17.0 ended
# in torch's TypeError after thousands of lines of its graph
def test_the_export_functions_check_their_flags_and_opset(tmp_path):
    users = tmp_path / "u.onnx"
    users.write_text("the user's file")
    identity = (torch.nn.Identity(), (torch.zeros(1),))
    for call, message in [
            (lambda: export_onnx(*identity, str(users), overwrite="no"), "export_onnx: overwrite must be True or False, "
                                                                         "got 'no' (str)"),
            (lambda: export_torchscript(None, torch.zeros(3, 8, 8), str(tmp_path / "u.ts"), overwrite="no"),
             "export_torchscript: overwrite must be True or False, got 'no' (str)"),
            (lambda: export_onnx(*identity, str(tmp_path / "n.onnx"), dynamo="no"),
             "export_onnx: dynamo must be True or False, got 'no' (str)"),
            (lambda: export_onnx(*identity, str(tmp_path / "n.onnx"), opset=17.0),
             "export_onnx: opset must be an integer >= 1, got 17.0 (float)"),
            (lambda: export_model_onnx(None, torch.zeros(3, 8, 8), str(tmp_path / "m.onnx"), opset=17.0),
             "export_model_onnx: opset must be an integer >= 1, got 17.0 (float)")]:
        with pytest.raises(ValueError, match=re.escape(message)):
            call()
    assert users.read_text() == "the user's file" and sorted(os.listdir(tmp_path)) == ["u.onnx"]


# a user's model.ts.sha256 (no model.ts) was replaced by the export's record without a word
def test_a_users_file_under_the_records_name_is_kept_unless_overwrite(tmp_path):
    from gwdet.export.export_model import main

    users = tmp_path / "u.ts.sha256"
    users.write_text("deadbeef  my notes\n")
    with pytest.raises(FileExistsError, match=rf"^{re.escape(str(users))} is there and is no checksum record, but the "
                                              r"export writes its own record under that name: it is left as it is"):
        export_torchscript(_Doubling(), torch.zeros(3, 8, 8), str(tmp_path / "u.ts"))
    assert users.read_text() == "deadbeef  my notes\n" and sorted(os.listdir(tmp_path)) == ["u.ts.sha256"]
    out = tmp_path / "out"
    out.mkdir()
    (out / "model.ts.sha256").write_text("deadbeef  model.ts\n")
    with pytest.raises(SystemExit):
        main(["--config-file", str(DEMO_CONFIG), "--untrained", "--output", str(out), *TINY_OPTS])
    assert (out / "model.ts.sha256").read_text() == "deadbeef  model.ts\n"
    # a stale record of gwdet's (its export deleted) is replaced as before
    export_torchscript(_Doubling(), torch.zeros(3, 8, 8), str(tmp_path / "v.ts"))
    (tmp_path / "v.ts").unlink()
    export_torchscript(_Doubling(), torch.zeros(3, 8, 8), str(tmp_path / "v.ts"))
    assert verify_export(str(tmp_path / "v.ts"))


# opset 12 (GW's diagonal needs 13) and 99 (no such opset) ended in torch's raw UnsupportedOperatorError and
# RuntimeError; a map_location dict (torch.load's form) in torch.jit.load's raw ValueError
def test_an_opset_the_layers_or_the_exporter_cannot_take_and_a_map_location_dict_are_named(tmp_path):
    from gwdet.export import load_export

    layer = GroupWhitening(16, num_groups=4).eval()
    for opset, reason in ((12, "Exporting the operator 'aten::diagonal' to ONNX opset version 12 is not supported"),
                          (99, "Unsupported onnx_opset_version: 99")):
        with pytest.raises(ValueError, match=rf"at opset {opset} failed: {re.escape(reason)}.*Export at an opset the "
                                             r"exporter and every layer support \(the default, 17; gwdet's layers need "
                                             r"13 or newer\); nothing was written"):
            export_onnx(layer, (torch.randn(2, 16, 4, 4),), str(tmp_path / f"g{opset}.onnx"), opset=opset)
    assert os.listdir(tmp_path) == []
    export_torchscript(_Doubling(), torch.zeros(3, 8, 8), str(tmp_path / "m.ts"))
    with pytest.raises(TypeError, match=r"^load_export: map_location of a TorchScript file is a device .* got "
                                        r"\{'cuda:0': 'cpu'\} \(dict\)"):
        load_export(str(tmp_path / "m.ts"), map_location={"cuda:0": "cpu"})


# export_model_onnx(nn.Sequential(Conv2d, GW), image, path) failed in the trace with torch's raw
# "conv2d() received an invalid combination of arguments" (the adapter gave the module a list of dicts)
def test_export_model_onnx_refuses_a_module_that_is_no_detector_before_tracing(tmp_path):
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), GroupWhitening(16))
    path = tmp_path / "out" / "m.onnx"
    with pytest.raises(GwdetTypeError, match=re.escape(
            "export_model_onnx exports a detectron2 detector, a meta-architecture (") + r".*GeneralizedRCNN.*"
            + re.escape(") built by gwdet.build_model, whose input detectron2's tracing adapter gives as a list of "
                        "dicts; got a Sequential. Export a module that takes tensors with "
                        "gwdet.export.export_onnx(module, (x,), path) (or torch.onnx.export), x a sample batch tensor "
                        "of its input; nothing was written.")):
        export_model_onnx(module, torch.randn(3, 32, 32), str(path))
    assert not (tmp_path / "out").exists()


# export_torchscript of a bare layer or an nn.Sequential ended in torch's raw "'list' object has no attribute
# 'is_nested'" / "conv2d() received an invalid combination of arguments" (the adapter gave it a list of dicts)
@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
def test_export_torchscript_refuses_a_module_that_takes_tensors_by_name(tmp_path):
    layer = GroupWhitening(16)
    sequential = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), GroupWhitening(16))
    cases = [(layer, torch.randn(16, 8, 8), "GroupWhitening", "GwdetTypeError: GroupWhitening: expected a torch.Tensor "
                                                              "input"),
             (sequential, torch.randint(0, 255, (3, 32, 32), dtype=torch.uint8), "Sequential",
              "TypeError: conv2d() received an invalid combination of arguments")]
    for module, image, name, reason in cases:
        with pytest.raises(GwdetTypeError, match=re.escape(
                "export_torchscript traces a detectron2 detector (a meta-architecture such as GeneralizedRCNN, built "
                "by gwdet.build_model) through detectron2's tracing adapter, which gives the model its input as a "
                f"list of dicts, [{{'image': image}}]; the {name} given failed on it ({reason}") + r".*"
                + re.escape("), so it takes tensors. Trace such a module with torch.jit.trace(module, (x,)) and "
                            "torch.jit.save, x a sample batch tensor of its input (or export it to ONNX with "
                            "gwdet.export.export_onnx(module, (x,), path)); nothing was written.")):
            export_torchscript(module, image, str(tmp_path / "out" / "m.ts"))
    assert not (tmp_path / "out").exists()
    export_torchscript(_Doubling(), torch.zeros(3, 8, 8), str(tmp_path / "d.ts"))  # detectron2's inputs: traced
    assert sorted(os.listdir(tmp_path)) == ["d.ts", "d.ts.sha256"]


# export_onnx(layer, [x], path) (args a list) ended in torch's raw "'list' object has no attribute 'is_nested'"
@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning", "ignore::DeprecationWarning")
def test_export_onnx_refuses_args_that_are_no_tuple_and_takes_a_tensor_as_one(tmp_path):
    pytest.importorskip("onnxruntime")
    layer = GroupWhitening(16).eval()
    x = torch.randn(2, 16, 4, 4)
    with pytest.raises(GwdetTypeError, match=re.escape(
            "export_onnx takes args as a tuple of the module's inputs (it exports module(*args)), not a list of 1: "
            "give them as a tuple, tuple(args): e.g. (x,) for [x] (a single tensor x is taken as (x,)); nothing was "
            "written.")):
        export_onnx(layer, [x], str(tmp_path / "out" / "gl.onnx"))
    with pytest.raises(GwdetTypeError, match=r"^export_onnx takes args as a tuple .*, not dict \{'x': 1\}: give a "
                                             r"tuple, e.g. \(x,\)"):
        export_onnx(layer, {"x": 1}, str(tmp_path / "out" / "gl.onnx"))
    assert not (tmp_path / "out").exists()
    export_onnx(layer, x, str(tmp_path / "gt.onnx"))  # a tensor: (x,)
    with torch.no_grad():
        assert max_abs_difference([layer(x)], run_onnx(str(tmp_path / "gt.onnx"), [x])) <= TOLERANCE


# an export of one format into an --output folder holding an earlier export of the other format (of other
# weights, say) left both there without a word
@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
def test_export_tool_warns_of_an_earlier_export_of_the_other_format_in_its_folder(tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    from conftest import logged_warnings
    from gwdet.export.export_model import main

    out = tmp_path / "out"
    argv = ["--config-file", str(DEMO_CONFIG), "--untrained", "--sample-image", str(_sample_image(tmp_path)),
            "--output", str(out)]
    with logged_warnings("gwdet.export") as warned:
        assert main(argv + ["--format", "onnx", *TINY_OPTS]) == 0, capsys.readouterr().err
    assert warned == []
    onnx_bytes = (out / "model.onnx").read_bytes()
    with logged_warnings("gwdet.export") as warned:
        assert main(argv + ["--format", "torchscript", *TINY_OPTS]) == 0, capsys.readouterr().err
    assert warned == [
        f"{out / 'model.onnx'} is an earlier export of the other format, and it was left as it is: it may hold other "
        f"weights than this export's (--untrained, random weights), so {out} may now hold exports of two different "
        f"models. Export onnx again into {out} with the same weights (--format onnx --overwrite), or remove "
        f"{out / 'model.onnx'} and model.onnx.sha256."]
    assert sorted(os.listdir(out)) == ["model.onnx", "model.onnx.sha256", "model.ts", "model.ts.sha256"]
    assert (out / "model.onnx").read_bytes() == onnx_bytes


class _RoiPooling(torch.nn.Module):
    """Holds detectron2's ROIPooler (aligned ROIAlign), as an R-CNN's box head does."""

    def __init__(self) -> None:
        super().__init__()
        from detectron2.modeling.poolers import ROIPooler
        self.pooler = ROIPooler(output_size=7, scales=(1 / 4,), sampling_ratio=0, pooler_type="ROIAlignV2")

    def forward(self, x):
        return x


def test_export_onnx_refuses_an_opset_below_the_aligned_roi_align_for_a_module_that_pools_regions(tmp_path):
    # export_onnx(adapter, (image,), 'a13.onnx', opset=13) of a detector wrote a file whose detections differed by 95.6
    with pytest.raises(ValueError, match=r"export_onnx: opset 13 is below 16, the first whose RoiAlign computes "
                                         r"detectron2's aligned ROIAlign, which the module holds \(pooler\.level_poolers"
                                         r"\.0\): an older one exports other detections\. Give opset 16 or newer"):
        export_onnx(_RoiPooling(), (torch.zeros(1),), str(tmp_path / "a13.onnx"), opset=13)
    assert os.listdir(tmp_path) == []
    export_onnx(torch.nn.Identity(), (torch.zeros(1),), str(tmp_path / "i13.onnx"), opset=13)  # no ROIAlign: as asked


def test_export_onnx_with_dynamo_names_what_torch_export_cannot_capture_and_the_fix(tmp_path):
    # dynamo=True on a module torch.export cannot capture (a whole R-CNN): torch's raw TorchExportError with ANSI codes
    class DataDependent(torch.nn.Module):
        def forward(self, x):
            return x * 2 if x.sum() > 0 else x - 1

    with pytest.raises(ValueError, match=r"export_onnx\(dynamo=True\) of .*k\.onnx: torch\.export could not capture the "
                                         r"module \(torch: Failed to export the model with torch\.export\. This is step "
                                         r"1/3.*torch\.export cannot capture every module \(a whole detectron2 R-CNN "
                                         r"among them\) \(docs/deploy\.md, Limits\)\. Export with dynamo=False") as caught:
        export_onnx(DataDependent(), (torch.ones(3),), str(tmp_path / "k.onnx"), dynamo=True)
    assert "\x1b[" not in str(caught.value) and caught.value.__cause__ is not None
    assert os.listdir(tmp_path) == []


class _Returns3(torch.nn.Module):
    """A module of one tensor input, a number with a default, and 3 outputs (one nested)."""

    def forward(self, x, scale=2):
        return x * scale, (x + 1, x - 1)


# export_onnx(layer, (x,), path, input_names=['a', 'b']) wrote the file with one input 'a', 'b' dropped without a word
# (given to the module's weights: a Conv2d's initializers were named 'b', 'c')
@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
def test_export_onnx_refuses_more_input_names_than_inputs_before_writing(tmp_path):
    onnx = pytest.importorskip("onnx")
    layer, x = GroupWhitening(32, num_groups=4).eval(), torch.randn(2, 32, 8, 8)
    with pytest.raises(GwdetValueError, match=re.escape(
            "export_onnx: input_names has 2 names ('a', 'b'), but the export has 1 input (the tensors and numbers "
            "among args, nested tuples, lists and dicts flattened, with the default values of the forward arguments "
            "args leaves out), so torch.onnx.export would give 'b' to the module's weights (the file's initializers) "
            "or leave it out. Give at most 1 input name, one per input in order (inputs after the last name get "
            "automatic names); nothing was written.")):
        export_onnx(layer, (x,), str(tmp_path / "out" / "gwn.onnx"), input_names=["a", "b"])
    with pytest.raises(GwdetValueError, match=r"input_names has 3 names \('x', 'scale', 'c'\), but the export has 2 "
                                              r"inputs .* so torch.onnx.export would give 'c' to"):
        export_onnx(_Returns3(), (x,), str(tmp_path / "out" / "r.onnx"), input_names=["x", "scale", "c"])
    assert not (tmp_path / "out").exists()
    # fewer names than inputs: torch's automatic names for the rest; the number torch makes an input can be named
    export_onnx(_Returns3(), (x,), str(tmp_path / "r1.onnx"), input_names=["x"])
    export_onnx(_Returns3(), (x,), str(tmp_path / "r2.onnx"), input_names=["x", "scale"])
    assert [value.name for value in onnx.load(str(tmp_path / "r2.onnx")).graph.input] == ["x", "scale"]
    assert onnx.load(str(tmp_path / "r1.onnx")).graph.input[0].name == "x"


# three output_names for one output ended in torch's raw "RuntimeError: number of output names provided (3) exceeded
# number of outputs (1)"; with dynamo=True the extra names were dropped without a word
@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning", "ignore::UserWarning", "ignore::DeprecationWarning")
@pytest.mark.parametrize("dynamo", [False, True])
def test_export_onnx_refuses_more_output_names_than_outputs_and_keeps_no_file(tmp_path, dynamo):
    onnx = pytest.importorskip("onnx")
    if dynamo:
        pytest.importorskip("onnxscript")
    path = tmp_path / "o.onnx"
    with pytest.raises(GwdetValueError, match=re.escape(
            "export_onnx: output_names has 4 names ('p', 'q', 'r', 's'), but the export has 3 outputs (the tensors "
            "module(*args) returns, nested tuples, lists and dicts flattened), so 's' would name no output of the "
            "file. Give at most 3 output names, one per output in order (outputs after the last name get automatic "
            "names); nothing was written.")) as caught:
        export_onnx(_Returns3(), (torch.randn(2, 4),), str(path), dynamo=dynamo, output_names=["p", "q", "r", "s"])
    assert caught.value.__cause__ is None and os.listdir(tmp_path) == []
    export_onnx(_Returns3(), (torch.randn(2, 4),), str(path), dynamo=dynamo, output_names=["p", "q", "r"])
    assert [value.name for value in onnx.load(str(path)).graph.output] == ["p", "q", "r"]


# input_names=['a'], output_names=['a']: the input was renamed 'a.1' without a word (session.run(None, {'a': x})
# then failed in onnxruntime); input_names='image' was read letter by letter, a name 3 or '' became an automatic name
# or torch's raw "incompatible function arguments"
@pytest.mark.parametrize("names, error, message", [
    ({"input_names": ["a"], "output_names": ["a"]}, GwdetValueError,
     "export_onnx: a name is given twice: 'a' (input_names[0] and output_names[0]). The inputs and outputs of an ONNX "
     "file need names of their own, and torch.onnx.export renames one of a pair (an input 'a' becomes 'a.1', which "
     "onnxruntime then expects) or fails: give each input and output a different name; nothing was written."),
    ({"output_names": ["y", "y"]}, GwdetValueError,
     "export_onnx: a name is given twice: 'y' (output_names[0] and output_names[1]). "),
    ({"input_names": "image"}, GwdetTypeError,
     "export_onnx takes input_names as a list of names, one per input in order, not the string 'image' "
     "(torch.onnx.export would read it letter by letter): give input_names=['image']; nothing was written."),
    ({"output_names": [3]}, GwdetTypeError,
     "export_onnx: output_names[0] is 3 (int), not a string: give each output's name as a str, e.g. "
     "output_names=['3']; nothing was written."),
    ({"input_names": [""]}, GwdetValueError,
     "export_onnx: input_names[0] is an empty string, which torch.onnx.export replaces with an automatic name (such "
     "as 'onnx::Cast_0') without a word: give every listed input a name (names go to the inputs in order; those after "
     "the last name get automatic names); nothing was written."),
])
def test_export_onnx_refuses_a_name_given_twice_or_that_is_no_string_before_tracing(tmp_path, names, error, message):
    with pytest.raises(error, match="^" + re.escape(message)):
        export_onnx(torch.nn.Identity(), (torch.zeros(1),), str(tmp_path / "out" / "i.onnx"), **names)
    assert os.listdir(tmp_path) == []


class _ImageScale(torch.nn.Module):
    """A model of one (C, H, W) uint8 image, as detectron2's exports take it: the image as floats, scaled."""

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return image.float() * 2.0


# an (H, W, C) image was told "the export is fixed to the dtype and size of the sample image ... Give an image of that
# dtype and size (the test loader's resize ...), or export again with --sample-image", not the layout and its permute
def test_run_onnx_names_an_image_in_hwc_layout_and_the_permute(tmp_path):
    pytest.importorskip("onnxruntime")
    image = torch.randint(0, 255, (3, 12, 10), dtype=torch.uint8)
    path = tmp_path / "model.onnx"
    export_onnx(_ImageScale(), (image,), str(path))
    hwc = image.permute(1, 2, 0)
    for given in (hwc, hwc.numpy()):
        with pytest.raises(ValueError, match=r"^input 0 \('.*'\) of .*model.onnx takes tensor\(uint8\) of shape "
                                             r"\[3, 12, 10\], got tensor\(uint8\) of shape \[12, 10, 3\]: an image in "
                                             r"\(H, W, C\) layout, with its 3 channels last, where the export takes "
                                             r"\(C, H, W\), as detectron2's models do. Give image.permute\(2, 0, 1\) "
                                             r"\(of a numpy array: image.transpose\(2, 0, 1\)\).$"):
            run_onnx(str(path), [given])
    (output,) = run_onnx(str(path), [hwc.permute(2, 0, 1)])  # the fix the message gives
    assert (output == image.float().numpy() * 2).all()
    with pytest.raises(ValueError, match=r"an image in \(H, W, C\) layout.* After it, the image still differs in size "
                                         r"\[3, 20, 10\] \(the export takes \[3, 12, 10\]\) and dtype tensor\(float\) "
                                         r"\(the export takes tensor\(uint8\)\): the export is fixed to the dtype and "
                                         r"size of the sample image"):
        run_onnx(str(path), [torch.zeros(20, 10, 3)])


# a Python export_onnx of a layer run on another size was told only the export tool's --sample-image as the way out
def test_run_onnx_on_another_size_names_export_onnxs_dynamic_axes_too(tmp_path):
    pytest.importorskip("onnxruntime")
    module = GroupWhitening(16, num_groups=4).eval()
    path = tmp_path / "gw_static.onnx"
    export_onnx(module, (torch.randn(2, 16, 5, 5),), str(path))
    other = torch.randn(3, 16, 7, 4)
    with pytest.raises(GwdetValueError, match=r"got tensor\(float\) of shape \[3, 16, 7, 4\]: .* or export again with "
                                              r"--sample-image of the size you need, or, for an export_onnx\(module, "
                                              r"\(sample,\), path\) in Python, export again with the sizes that vary left "
                                              r"free: export_onnx\(module, \(sample,\), path, input_names=\['image'\], "
                                              r"dynamic_axes=\{'image': \{0: 'batch', 2: 'height', 3: 'width'\}\}\)\.$"):
        run_onnx(str(path), [other])
    with pytest.raises(GwdetValueError, match=r"got tensor\(double\) .* in Python, export again with a sample of the "
                                              r"dtype you need\.$"):
        run_onnx(str(path), [torch.randn(2, 16, 5, 5).double()])
    free = tmp_path / "gw_free.onnx"  # the way the message names
    export_onnx(module, (torch.randn(2, 16, 5, 5),), str(free), input_names=["image"],
                dynamic_axes={"image": {0: "batch", 2: "height", 3: "width"}})
    with torch.no_grad():
        expected = module(other)
    assert max_abs_difference([expected], run_onnx(str(free), [other])) <= TOLERANCE


# Before: a record that was a folder or a link to nothing let a damaged export load unchecked without a word.
@pytest.mark.parametrize("record_kind", ["folder", "dangling link"])
def test_an_export_whose_record_is_no_regular_file_is_refused_for_torchscript_and_onnx(tmp_path, record_kind):
    from gwdet.export import load_export, verify_export

    _, x, onnx_path = exported_gw_layer(tmp_path)
    ts_path = tmp_path / "layer.ts"
    torch.jit.save(torch.jit.trace(torch.nn.Conv2d(3, 4, 3).eval(), torch.randn(1, 3, 8, 8)), str(ts_path))
    _flip_a_byte(onnx_path, position=-20)
    for path in (ts_path, onnx_path):
        record = tmp_path / f"{path.name}.sha256"
        record.unlink(missing_ok=True)
        if record_kind == "folder":
            record.mkdir()
            kind = "a folder"
        else:
            record.symlink_to(tmp_path / "gone.sha256")
            kind = r"a symbolic link to '.*gone.sha256', which does not exist"
        expected = (rf"{path.name}: its checksum record .*{path.name}.sha256 is {kind}, not a file holding the SHA-256 "
                    r"written with the export, so the export cannot be checked; nothing was loaded. Remove it .*"
                    rf"sha256sum {path.name} > {path.name}.sha256")
        for read in (load_export, verify_export):
            with pytest.raises(GwdetValueError, match=expected):
                read(str(path))
    with pytest.raises(GwdetValueError, match="layer.onnx.sha256 is"):
        run_onnx(str(onnx_path), [x])


# Before: complex outputs were compared after a cast to float64 (1+1j against 1+5j gave 0.0), and int64 values above
# 2**53 too (2**53 + 1 against 2**53 gave 0.0).
def test_max_abs_difference_compares_complex_values_by_modulus_and_integers_exactly():
    assert max_abs_difference([torch.tensor([1 + 1j])], [torch.tensor([1 + 5j])]) == 4.0
    assert max_abs_difference([torch.tensor([3 + 0j])], [torch.tensor([0 + 4j])]) == 5.0
    assert max_abs_difference([torch.tensor([2**53 + 1])], [torch.tensor([2**53])]) == 1.0
    assert max_abs_difference([torch.tensor([2**62 + 7])], [torch.tensor([2**62 + 2])]) == 5.0
    assert max_abs_difference([torch.tensor([2**63 - 1])], [torch.tensor([-2**63])]) == float(2**64 - 1)  # no wrap
    assert max_abs_difference([torch.tensor([2**32])], [torch.tensor([2**32 - 1])]) == 1.0
    assert max_abs_difference([np.array([2**64 - 1], dtype=np.uint64)], [np.array([2**64 - 2], dtype=np.uint64)]) == 1
    assert max_abs_difference([torch.tensor([0], dtype=torch.uint8)], [torch.tensor([255], dtype=torch.uint8)]) == 255
    assert max_abs_difference([torch.tensor([True])], [torch.tensor([False])]) == 1.0
    assert max_abs_difference([torch.tensor([1, 2])], [torch.tensor([1.5, 2.0])]) == 0.5
    assert max_abs_difference([0.1], [0.1 + 1e-12]) > 0  # Python floats in float64
    assert max_abs_difference([torch.tensor([complex(1, math.inf)])], [torch.tensor([complex(2, math.inf)])]) == 1.0
    assert max_abs_difference([torch.tensor([complex(math.nan, 0)])], [torch.tensor([1 + 0j])]) == math.inf


# Before: dict outputs (detectron2's) ended in torch's "RuntimeError: Could not infer dtype of dict", a str output in
# "TypeError: new(): invalid data type 'str'" and None in "Could not infer dtype of NoneType".
def test_max_abs_difference_compares_dicts_key_by_key_and_names_outputs_it_cannot_compare():
    a = torch.ones(3)
    assert max_abs_difference([{"scores": a}], [{"scores": a + 1}]) == 1.0
    assert max_abs_difference([{"boxes": [a, {"x": a}]}], [{"boxes": [a, {"x": a * 4}]}]) == 3.0
    with pytest.raises(GwdetValueError, match=re.escape(
            "output 0['scores']: shape (2,), expected (3,)")):
        max_abs_difference([{"scores": a}], [{"scores": a[:2]}])
    with pytest.raises(GwdetValueError, match=re.escape(
            "output 0: keys ['score', 'boxes'], expected ['scores', 'boxes'] ('scores' missing and 'score' not "
            "expected): give both sides' outputs with the same keys")):
        max_abs_difference([{"scores": a, "boxes": a}], [{"score": a, "boxes": a}])
    with pytest.raises(GwdetValueError, match=r"^output 0: a Tensor, expected a dict: give both sides' outputs nested"):
        max_abs_difference([{"scores": a}], [a])
    for value, shown in (("ab", "'ab' (str)"), (None, "None (NoneType)"),
                         (np.array(["a"]), r"array(['a'], dtype='<U1') (a numpy array of <U1)")):
        with pytest.raises(GwdetTypeError, match="^" + re.escape(
                f"output 0: the expected side is {shown}, which max_abs_difference cannot compare: it compares "
                "tensors, numpy arrays and numbers, and lists, tuples and dicts of them.")):
            max_abs_difference([value], [value])
    with pytest.raises(GwdetTypeError, match=re.escape("output 0['labels'].1: the actual side is None (NoneType)")):
        max_abs_difference([{"labels": [a, a]}], [{"labels": [a, None]}])


# Before: opset=7 ended in torch's "OnnxExporterError: ONNX export failed on where, which is not implemented for
# opset 7", where opset 99 got gwdet's message naming the opsets its layers need.
@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning", "ignore::UserWarning")
def test_export_onnx_names_an_opset_below_13_as_gwdets_layers_need_it(tmp_path):
    with pytest.raises(GwdetValueError, match=r"at opset 7 failed: ONNX export failed on where, which is not "
                                              r"implemented for opset 7.*Export at an opset the exporter and every "
                                              r"layer support \(the default, 17; gwdet's layers need 13 or newer\); "
                                              r"nothing was written\.$"):
        export_onnx(GroupWhitening(16, num_groups=4), torch.randn(2, 16, 8, 8), str(tmp_path / "gw7.onnx"), opset=7)
    assert os.listdir(tmp_path) == []


# Before: a dynamic_axes key naming no input or output ({'y': ...} for input_names=['x']) wrote a file with every size
# fixed, with only torch's UserWarning among others; dynamic_axes=['x'] ended in "AttributeError: 'list' object has
# no attribute 'items'".
@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning", "ignore::UserWarning")
def test_export_onnx_refuses_dynamic_axes_of_a_name_the_export_lacks_or_not_in_torchs_form(tmp_path):
    layer, x = GroupWhitening(16, num_groups=4), torch.randn(2, 16, 8, 8)
    with pytest.raises(GwdetValueError, match=r"^export_onnx: dynamic_axes names 'y', which is no input or output of "
                                              r"the export, so the axes meant would stay fixed to the example's sizes\. "
                                              r"The export's inputs are 'x' and its outputs '\d+' \(named by "
                                              r"input_names=\['x'\]; the others get the exporter's automatic names\)"
                                              r".*; nothing was written\.$"):
        export_onnx(layer, x, str(tmp_path / "gwd.onnx"), input_names=["x"], dynamic_axes={"y": {0: "b"}})
    with pytest.raises(GwdetTypeError, match=re.escape(
            "export_onnx takes dynamic_axes as a dict from an input's or output's name to its dynamic axes, as "
            "torch.onnx.export does, not the list ['x']: give e.g. dynamic_axes={'x': {0: 'batch'}} (axis 0 free, "
            "named 'batch'), or the free axes as a list, {'x': [0, 1, 2, 3]} for every axis of a 4-d input (named "
            "automatically); nothing was written.")):
        export_onnx(layer, x, str(tmp_path / "gwe.onnx"), dynamic_axes=["x"])
    with pytest.raises(GwdetTypeError, match=r"^export_onnx: dynamic_axes\['x'\] is 0, but the dynamic axes"):
        export_onnx(layer, x, str(tmp_path / "gwv.onnx"), input_names=["x"], dynamic_axes={"x": 0})
    assert os.listdir(tmp_path) == []
    # the exporter's automatic input name and torch's list form of the axes are taken, the given dict left as it is
    axes = {"x.1": [0]}
    export_onnx(layer, x, str(tmp_path / "auto.onnx"), dynamic_axes=axes)
    assert axes == {"x.1": [0]}
    assert run_onnx(str(tmp_path / "auto.onnx"), [torch.randn(4, 16, 8, 8)])[0].shape == (4, 16, 8, 8)


# Before: with dynamo=True, a dynamic_axes key naming no input ended in torch's raw "RuntimeError: # Failed to convert
# 'dynamic_axes' to 'dynamic_shapes'".
@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")
def test_export_onnx_with_dynamo_names_dynamic_axes_it_cannot_convert(tmp_path):
    pytest.importorskip("onnxscript")
    layer, x = GroupWhitening(16, num_groups=4), torch.randn(2, 16, 8, 8)
    with pytest.raises(GwdetValueError, match=r"^export_onnx\(dynamo=True\) of .*gwd\.onnx: torch could not turn "
                                              r"dynamic_axes \{'y': \{0: 'b'\}\} into torch.export's dynamic shapes "
                                              r"\(torch: .*\)\. With dynamo=True, key dynamic_axes by the names given "
                                              r"in input_names .*; nothing was written\.$"):
        export_onnx(layer, x, str(tmp_path / "gwd.onnx"), dynamo=True, input_names=["x"], dynamic_axes={"y": {0: "b"}})
    assert os.listdir(tmp_path) == []


def test_an_export_below_a_file_is_refused_before_tracing(tmp_path):
    # os.makedirs failed with a raw FileExistsError [Errno 17] (export_torchscript after tracing the whole detector)
    (tmp_path / "notes.txt").write_text("my notes")
    traced = []
    model = torch.nn.Conv2d(3, 3, 1)
    model.register_forward_hook(lambda *_: traced.append(1))
    below = tmp_path / "notes.txt" / "deeper"
    for export, name in ((lambda path: export_torchscript(model, torch.zeros(3, 8, 8), path), "model.ts"),
                         (lambda path: export_onnx(model, (torch.zeros(1, 3, 8, 8),), path), "model.onnx"),
                         (lambda path: export_model_onnx(model, torch.zeros(3, 8, 8), path), "model.onnx")):
        path = str(below / name)
        with pytest.raises(FileExistsError, match=re.escape(
                f"{path}: {tmp_path / 'notes.txt'} is a file, so no folder can be created below it. Give a file path "
                "whose parent folders are folders (or do not exist yet); nothing was written.")):
            export(path)
    assert not traced and (tmp_path / "notes.txt").read_text() == "my notes"
    export_onnx(model, (torch.zeros(1, 3, 8, 8),), str(tmp_path / "new" / "folders" / "model.onnx"))  # created
    assert (tmp_path / "new" / "folders" / "model.onnx").is_file()
