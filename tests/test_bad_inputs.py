"""Bad input gets an error naming what is wrong and how to fix it (docs/reliability.md lists all),
and input the layers can compute gets the right result however large or small it is.

Weight-conversion errors (wrong architecture or positions, corrupted, truncated and non-checkpoint
files) are tested in test_convert.py; unsafe pickles in test_safe_loading.py.
"""
import copy
import json
import os

import numpy as np
import pytest
import torch
from detectron2.data import DatasetCatalog, MetadataCatalog, build_detection_train_loader
from detectron2.data import detection_utils
from detectron2.data.datasets import register_coco_instances
from detectron2.structures import BoxMode

from gwdet.checkpoint.resilient import ResilientCheckpointer
from gwdet.data import (
    CacheNotWritableError,
    NonFiniteImageError,
    ShapesSpec,
    check_dataset_files,
    check_finite_images,
    ensure_generated,
    prepare_datasets,
    register_shapes,
)
from gwdet.data.finite_images import FiniteImageBatches
from gwdet.data.resumable import skip_trained_samples
from gwdet.engine.trainer import Trainer
from gwdet.model_zoo import build_config
from gwdet.layers import BatchGroupNorm, BatchWhitening, GroupWhitening, group_whitening_reference

from conftest import DEMO_CONFIG, TINY_OPTS
from layer_cases import NAMES, RESULT_NAMES, assert_close_relative, forward_backward, inputs, make_layer

CONFIG_CASES = {
    "unknown norm name": (["MODEL.FPN.NORM", "GWW"], ["MODEL.FPN.NORM", "'GWW'", "Known names", "GW_ZCA"]),
    "gwdet norm in detectron2's head": (
        ["MODEL.ROI_BOX_HEAD.NAME", "FastRCNNConvFCHead"],
        ["MODEL.ROI_BOX_HEAD.NORM='GW'", "detectron2's FastRCNNConvFCHead", "GWFastRCNNConvFCHead"],
    ),
    "GN groups that detectron2's head would ignore": (
        ["MODEL.ROI_MASK_HEAD.NAME", "MaskRCNNConvUpsampleHead", "MODEL.ROI_MASK_HEAD.NORM", "GN"],
        ["MODEL.GN.NUM_GROUPS=8", "always builds GN with 32 groups", "GWMaskRCNNConvUpsampleHead"],
    ),
    "GW positions with a backbone that ignores them": (
        ["MODEL.BACKBONE.NAME", "build_resnet_fpn_backbone", "MODEL.RESNETS.NORM", "BN"],
        ["GW_POSITIONS='S1-B2'", "build_resnet_fpn_backbone", "build_gw_resnet_fpn_backbone"],
    ),
    "bad position token": (["MODEL.RESNETS.GW_POSITIONS", "S1-B4"], ["'B4'", "Valid tokens", "B12"]),
    "GW groups < 1": (["MODEL.GW.NUM_GROUPS", "0"], ["MODEL.GW.NUM_GROUPS", ">= 1", "got 0"]),
    "GW T < 1": (["MODEL.GW.T", "0"], ["MODEL.GW.T", ">= 1"]),
    "GW eps <= 0": (["MODEL.GW.EPS", "0.0"], ["MODEL.GW.EPS", "> 0"]),
    "BW momentum outside [0, 1]": (["MODEL.BW.MOMENTUM", "1.5"], ["MODEL.BW.MOMENTUM", "[0, 1]"]),
    "example weight outside [0, 1]": (["MODEL.BGN.EVAL_EXAMPLE_WEIGHT", "-0.5"], ["MODEL.BGN.EVAL_EXAMPLE_WEIGHT"]),
    "example groups larger than the batch": (  # of images: the ROI heads' batches are their many boxes
        ["MODEL.FPN.NORM", "BGN", "MODEL.BGN.EXAMPLES_PER_GROUP", "8"],
        ["MODEL.BGN.EXAMPLES_PER_GROUP=8", "SOLVER.IMS_PER_BATCH=4", "images per GPU"],
    ),
}


@pytest.mark.parametrize("case", sorted(CONFIG_CASES))
def test_bad_config_value_names_the_key(case):
    opts, fragments = CONFIG_CASES[case]
    with pytest.raises((ValueError, KeyError)) as err:
        build_config(str(DEMO_CONFIG), opts)
    for fragment in fragments:
        assert fragment in str(err.value), (case, str(err.value))


LAYER_CASES = {
    "GW num_groups": (lambda: GroupWhitening(16, num_groups=0), ["num_groups", ">= 1"]),
    "GW method": (lambda: GroupWhitening(16, method="svd"), ["method", "'itn'", "'zca'"]),
    "BW T": (lambda: BatchWhitening(16, T=0), ["T", ">= 1"]),
    "BGN example weight": (lambda: BatchGroupNorm(16, eval_example_weight=2.0), ["eval_example_weight", "[0, 1]"]),
    "GW wrong channels": (lambda: GroupWhitening(16)(torch.randn(2, 8, 4, 4)), ["(N, 16", "[2, 8, 4, 4]"]),
    "GW integer input": (lambda: GroupWhitening(16)(torch.ones(2, 16, 4, 4, dtype=torch.int64)),
                         ["floating-point input", "torch.int64", ".float()"]),
    "GW one value per group": (lambda: GroupWhitening(16, num_groups=16)(torch.randn(2, 16)),
                               ["single value", "normalizes to 0", "fewer groups (num_groups: MODEL.GW.NUM_GROUPS",
                                "MODEL.ROI_MASK_HEAD.POOLER_RESOLUTION"]),
    # a GW FPN on a small image (its stride-32 level 1 x 1): the advice named only an ROI head's POOLER_RESOLUTION
    "GW one value per group of a 1 x 1 feature map": (
        lambda: GroupWhitening(64, num_groups=64)(torch.randn(1, 64, 1, 1)),
        ["1 channel per group here) or a larger input (this one has 1 position per channel): a backbone or FPN level "
         "of stride s has one position per s pixels of the padded image, so larger images (INPUT.MIN_SIZE_TRAIN / "
         "MIN_SIZE_TEST)"]),
    "BW one value per channel in training": (lambda: BatchWhitening(16).train()(torch.randn(1, 16, 1, 1)),
                                             ["each channel of the batch holds a single value"]),
}


@pytest.mark.parametrize("case", sorted(LAYER_CASES))
def test_bad_layer_argument_names_the_argument(case):
    build, fragments = LAYER_CASES[case]
    with pytest.raises(ValueError) as err:
        build()
    for fragment in fragments:
        assert fragment in str(err.value), (case, str(err.value))


@pytest.mark.parametrize("shape", [(2, 16, 0, 5), (0, 16, 4, 0), (2, 16, 0)])
def test_zero_spatial_size_to_gw_names_the_shape_as_group_norm_refuses_it(shape):
    x = torch.randn(shape)
    with pytest.raises(RuntimeError):
        torch.nn.GroupNorm(4, 16)(x)  # torch refuses it (a RuntimeError without the shape)
    for whiten in (GroupWhitening(16, num_groups=4), lambda x: group_whitening_reference(x, 4)):
        with pytest.raises(ValueError) as err:
            whiten(x)
        assert f"input of shape {list(shape)} has a zero spatial size" in str(err.value), str(err.value)


@pytest.mark.parametrize("layer", [BatchWhitening(16, group_size=4), BatchGroupNorm(16, num_groups=4)],
                         ids=["BW", "BGN"])
def test_zero_spatial_size_to_batch_statistics_norms_is_empty_as_batch_norm(layer):
    x = torch.randn(2, 16, 0, 5)
    assert torch.nn.BatchNorm2d(16)(x).shape == x.shape  # what torch's batch norm does
    buffers = {name: buffer.clone() for name, buffer in layer.named_buffers()}
    for training in (True, False):
        out = layer.train(training)(x)
        assert out.shape == x.shape and out.dtype == x.dtype
    assert all(torch.equal(buffers[name], buffer) for name, buffer in layer.named_buffers()), \
        "no observation: the running statistics stay as they were"


def test_missing_image_folder_names_the_path(tmp_path):
    json_file = tmp_path / "instances.json"
    json_file.write_text(json.dumps({"images": [], "annotations": [], "categories": []}))
    register_coco_instances("gwdet_test_no_images", {}, str(json_file), str(tmp_path / "missing_images"))
    with pytest.raises(FileNotFoundError) as err:
        check_dataset_files(["gwdet_test_no_images"])
    assert "missing_images" in str(err.value) and "image_root" in str(err.value)


def test_json_without_annotations_is_explained(tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    json_file = tmp_path / "instances.json"
    json_file.write_text(json.dumps({
        "images": [{"id": 1, "file_name": "a.png", "height": 64, "width": 64}],
        "categories": [{"id": 1, "name": "circle"}],
    }))
    register_coco_instances("gwdet_test_no_annotations", {}, str(json_file), str(images))
    cfg = build_config(str(DEMO_CONFIG), TINY_OPTS + ["DATASETS.TRAIN", "('gwdet_test_no_annotations',)"])
    check_dataset_files(cfg.DATASETS.TRAIN)
    with pytest.raises(ValueError) as err:
        Trainer.build_train_loader(cfg)
    assert "gwdet_test_no_annotations" in str(err.value) and "'annotations'" in str(err.value)


def _unregister(name):
    if name in DatasetCatalog.list():
        DatasetCatalog.remove(name)
        MetadataCatalog.remove(name)


DEGENERATE_BOXES = {
    "zero width": ([10, 10, 0, 8], "has no area"),
    "negative height": ([10, 10, 8, -2], "has no area"),
    "NaN": ([10, float("nan"), 8, 8], "is not four finite numbers"),
    "three numbers": ([10, 10, 8], "is not four finite numbers"),
    "far outside the image": ([50, 50, 100, 8], "reaches outside the 64x64 image"),
}


@pytest.mark.parametrize("case", sorted(DEGENERATE_BOXES))
def test_degenerate_box_of_a_dataset_registered_by_the_user_names_the_image(tmp_path, case):
    """A dataset registered with detectron2's own register_coco_instances (not --register-coco) is
    checked when gwdet's Trainer builds its train loader."""
    bbox, fault = DEGENERATE_BOXES[case]
    json_file = tmp_path / "instances.json"
    # NaN is not JSON: Python writes it as NaN, which json.load (detectron2's reader) reads back
    json_file.write_text(json.dumps({
        "images": [{"id": 1, "file_name": "good.png", "height": 64, "width": 64},
                   {"id": 2, "file_name": "bad_box.png", "height": 64, "width": 64}],
        "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [8, 8, 16, 16], "area": 256, "iscrowd": 0},
                        {"id": 2, "image_id": 2, "category_id": 1, "bbox": bbox, "area": 64, "iscrowd": 0}],
        "categories": [{"id": 1, "name": "circle"}],
    }))
    _unregister("gwdet_test_bad_box")
    register_coco_instances("gwdet_test_bad_box", {}, str(json_file), str(tmp_path))
    cfg = build_config(str(DEMO_CONFIG), TINY_OPTS + ["DATASETS.TRAIN", "('gwdet_test_bad_box',)",
                                                      "MODEL.MASK_ON", "False"])
    with pytest.raises(ValueError) as err:
        Trainer.build_train_loader(cfg)
    message = str(err.value)
    for fragment in ("DATASETS.TRAIN ('gwdet_test_bad_box',): 1 box(es) cannot be trained on",
                     f"image '{tmp_path / 'bad_box.png'}' (image_id 2): bbox", fault, "Correct or remove"):
        assert fragment in message, message
    assert "good.png" not in message


def test_degenerate_xyxy_box_of_a_registered_function_is_refused_and_crowd_boxes_pass():
    from detectron2.config import LazyCall
    from detectron2.data import get_detection_dataset_dicts

    from gwdet.engine.lazy import _instantiate_dataset

    records = [{"file_name": "scan.png", "image_id": 5, "height": 64, "width": 64, "annotations": [
        {"bbox": [0, 0, 64, 64], "bbox_mode": BoxMode.XYWH_ABS, "category_id": 0, "iscrowd": 1},  # crowd: not a box
        {"bbox": [30, 30, 20, 40], "bbox_mode": BoxMode.XYXY_ABS, "category_id": 0, "iscrowd": 0},
    ]}]
    _unregister("gwdet_test_xyxy_box")
    DatasetCatalog.register("gwdet_test_xyxy_box", lambda: records)
    MetadataCatalog.get("gwdet_test_xyxy_box").set(thing_classes=["circle"])
    node = LazyCall(get_detection_dataset_dicts)(names="gwdet_test_xyxy_box", filter_empty=False)
    with pytest.raises(ValueError) as err:
        _instantiate_dataset(node)  # a LazyConfig's dataloader.train.dataset
    message = str(err.value)
    assert "dataloader.train.dataset: 1 box(es)" in message and "bbox [30, 30, 20, 40] (XYXY_ABS) has no area" in message
    records[0]["annotations"].pop()
    assert _instantiate_dataset(node)[0]["image_id"] == 5


def test_missing_weights_file_says_how_to_get_one(tmp_path):
    checkpointer = ResilientCheckpointer(torch.nn.Linear(2, 2), str(tmp_path))
    with pytest.raises(FileNotFoundError) as err:
        checkpointer.resume_or_load(str(tmp_path / "weights" / "R-50-GW.pkl"), resume=False)
    assert "R-50-GW.pkl" in str(err.value) and "convert_pretrained.py" in str(err.value)


def test_a_resume_with_another_process_count_is_refused_where_batch_statistics_would_change(tmp_path, caplog):
    # before: a run of 2 processes resumed by 1 without a word (BN over 2 images per process instead
    # of 1), and its results.json then recorded "processes": 1
    from gwdet.checkpoint.resilient import RUN_SEGMENTS_KEY
    from gwdet.engine.run_environment import run_segment
    from gwdet.layers import GroupWhitening

    for norm, refused in ((torch.nn.BatchNorm2d(4), True), (GroupWhitening(4, num_groups=2), False)):
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), norm)
        folder = tmp_path / type(norm).__name__
        folder.mkdir()
        ResilientCheckpointer(model, str(folder), segment={"processes": 2}).save("model_0000009", iteration=9)
        resumed = ResilientCheckpointer(model, str(folder))
        if refused:
            with pytest.raises(ValueError, match=(
                    r"^--resume: the run in .*BatchNorm2d trained with 2 process\(es\) \(model_0000009.pth\), but "
                    r"this resume has 1: each process would train on another share of SOLVER.IMS_PER_BATCH, so the norm "
                    r"layers with batch statistics \(1\) would normalize over other batches than the run's, .*Resume "
                    r"with 2 process\(es\) \(--num-gpus x --num-machines\), or start a new run from its weights")):
                resumed.resume_or_load("", resume=True)
        else:
            with caplog.at_level("WARNING"):
                assert resumed.resume_or_load("", resume=True)["iteration"] == 9
            assert "--resume with 1 process(es) of a run trained with 2 (model_0000009.pth): its norm layers " \
                   "normalize each image on its own" in caplog.text
    (tmp_path / "one").mkdir()  # a trainer's checkpointer records the processes of the run (1, as now)
    ResilientCheckpointer(model, str(tmp_path / "one"), segment=run_segment).save("model_0000009", iteration=9)
    resumed = ResilientCheckpointer(model, str(tmp_path / "one")).resume_or_load("", resume=True)
    assert resumed[RUN_SEGMENTS_KEY][-1]["processes"] == 1


@pytest.mark.parametrize("method", ["itn", "zca"])
def test_non_finite_input_stays_in_its_own_sample(method):
    """Documented behaviour: GW normalises each sample alone, so a NaN/Inf poisons that sample's
    output and nothing else (no check on the hot path; detectron2's trainer stops on a NaN loss);
    ZCA's eigendecomposition does not fail for the whole batch."""
    layer = GroupWhitening(8, num_groups=4, method=method)
    for bad in (float("nan"), float("inf")):
        x = torch.randn(3, 8, 4, 4)
        x[1, 2, 0, 0] = bad
        y = layer(x)
        assert torch.isfinite(y[0]).all() and torch.isfinite(y[2]).all()
        assert not torch.isfinite(y[1]).all()
        assert torch.allclose(y[[0, 2]], layer(x[[0, 2]]), atol=1e-5)
        reference = group_whitening_reference(x, 4, 5, layer.eps, method, layer.weight, layer.bias)
        assert torch.allclose(reference[[0, 2]], y[[0, 2]], atol=1e-4) and not torch.isfinite(reference[1]).all()


@pytest.mark.parametrize("method", ["itn", "zca"])
def test_batch_whitening_of_a_batch_with_a_non_finite_value_is_nan_like_batch_norm(method):
    x = torch.randn(4, 8, 3, 3)
    x[2, 1, 0, 0] = float("nan")
    y = BatchWhitening(8, group_size=4, method=method)(x)  # the NaN's group of channels is NaN, like BN's channel
    assert torch.isnan(y[:, :4]).all() and torch.isfinite(y[:, 4:]).all()


@pytest.mark.parametrize("metadata,fragments", [
    ({"arch": "R-50", "gw_positions": "S1-B2"}, ["GW at 'S1-B2'", "model has GW at ''", "GW_POSITIONS 'S1-B2'"]),
    ({"arch": "R-101", "gw_positions": ""}, ["R-101", "blocks per stage [3, 4, 6]", "DEPTH 101"]),
])
def test_converted_weights_that_misfit_the_model_are_refused(tmp_path, metadata, fragments):
    import pickle

    import numpy as np
    from detectron2.config import get_cfg
    from detectron2.layers import ShapeSpec
    from detectron2.modeling import build_backbone

    from gwdet import add_gwdet_config

    cfg = add_gwdet_config(get_cfg())
    cfg.MODEL.BACKBONE.NAME, cfg.MODEL.RESNETS.NORM = "build_gw_resnet_backbone", "FrozenBN"
    backbone = build_backbone(cfg, ShapeSpec(channels=3))
    weights = tmp_path / "weights.pkl"
    model = {"stem.conv1.norm.weight": np.ones(64, np.float32)}
    weights.write_bytes(pickle.dumps({"model": model, "__author__": "test", "matching_heuristics": True, "gwdet": metadata}))
    before = backbone.stem.conv1.norm.weight.clone()
    with pytest.raises(ValueError) as err:
        ResilientCheckpointer(backbone, str(tmp_path)).resume_or_load(str(weights), resume=False)
    for fragment in fragments:
        assert fragment in str(err.value), str(err.value)
    assert torch.equal(backbone.stem.conv1.norm.weight, before), "nothing was loaded"


# ---- magnitudes: values near 1e20, whose squares overflow float32, and tiny ones -----------------

@pytest.mark.parametrize("scale", [1e20, 1e30, 1e-20])
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("name", NAMES)
def test_huge_and_tiny_inputs_give_the_float64_result(name, training, scale):
    """float32 at 1e20 (squares 1e40 > 3.4e38) and 1e30 against the same layer in float64, where
    nothing overflows; and at 1e-20, where the variance (1e-40) is far below eps, so the output is
    about x / sqrt(eps), not the output for x / 1e-20."""
    layer = make_layer(name, training)
    reference = copy.deepcopy(layer).double()
    x, grad = inputs()
    x = x * scale
    got = forward_backward(layer, x, grad)
    expected = forward_backward(reference, x.double(), grad.double())
    for what, a, b in zip(RESULT_NAMES, got, expected, strict=True):
        assert_close_relative(a, b, 1e-5, what)


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("name", NAMES)
def test_huge_input_gives_the_output_of_the_unscaled_input(name, training):
    """Normalization does not see a factor 1e20 except through eps, which is then negligible: the
    output is that of x, the input gradient that of x divided by 1e20, the affine's gradients the
    same. In evaluation BW's running statistics come from one training step on its own input
    (momentum 1); BGN uses only the example's own statistics (eval_example_weight 1), as its
    running variance cannot hold the variance of 1e20-sized values."""
    scale = 1e20
    x, grad = inputs()
    results = []
    for data in (x * scale, x):
        layer = make_layer(name, True)
        if name.startswith("BW"):
            layer.momentum = 1.0
        if name == "BGN":
            layer.eval_example_weight = 1.0
        if not training:
            if name.startswith("BW"):
                with torch.no_grad():
                    layer(data)
            layer.eval()
        results.append(forward_backward(layer, data, grad))
    (out, grad_x, grad_w, grad_b), (out_1, grad_x_1, grad_w_1, grad_b_1) = results
    assert_close_relative(out, out_1, 1e-4, "output")
    assert_close_relative(grad_x * scale, grad_x_1, 1e-4, "input gradient")
    assert_close_relative(grad_w, grad_w_1, 1e-4, "weight gradient")
    assert_close_relative(grad_b, grad_b_1, 1e-4, "bias gradient")


@pytest.mark.parametrize("method", ["itn", "zca"])
def test_scaling_is_per_sample_and_leaves_ordinary_samples_untouched(method):
    """A huge sample in the batch changes nothing, bit for bit, in the others' results."""
    layer = make_layer("GW" if method == "itn" else "GW_ZCA", True)
    x, grad = inputs()
    mixed = x.clone()
    mixed[1] *= 1e20
    alone = forward_backward(layer, x[[0, 2, 3]], grad[[0, 2, 3]])
    layer.zero_grad()
    out, grad_x, _, _ = forward_backward(layer, mixed, grad)
    assert torch.equal(out[[0, 2, 3]], alone[0]) and torch.equal(grad_x[[0, 2, 3]], alone[1])
    assert torch.isfinite(out[1]).all() and torch.isfinite(grad_x[1]).all()


@pytest.mark.parametrize("method", ["itn", "zca"])
def test_reference_formulas_and_traced_layer_agree_on_huge_input(method):
    """The public reference (what TorchScript and ONNX record) scales like the custom op."""
    layer = make_layer("GW" if method == "itn" else "GW_ZCA", True)
    x, _ = inputs()
    x = x * 1e20
    fused = layer(x)
    reference = group_whitening_reference(x, 4, layer.T, layer.eps, method, layer.weight, layer.bias)
    traced = torch.jit.trace(layer, (x,))
    for other in (reference, traced(x)):
        assert_close_relative(other.detach(), fused.detach(), 1e-5, "reference")


@pytest.mark.parametrize("name", NAMES)
def test_constant_huge_input_stays_finite(name):
    # zero variance leaves only the ridge eps / s^2 (floored, as it underflows near 1e38) to whiten by
    layer = make_layer(name, True)
    x = torch.full((2, 16, 3, 3), 3e38, requires_grad=True)
    out = layer(x)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()


# an evaluation with a running_var that overflowed to inf returned NaN everywhere without a word
def test_bgn_running_variance_that_overflowed_is_refused_in_evaluation_naming_the_overflow():
    from gwdet.errors import GwdetValueError

    layer = make_layer("BGN", True)
    x, _ = inputs()
    with torch.no_grad():
        layer(x * 1e20)  # variance 1e40: the float32 buffer holds inf
    assert torch.isinf(layer.running_var).all()
    with pytest.raises(GwdetValueError, match=r"^BatchGroupNorm: running_var holds inf values \(the first at channel 0\): "
                                              r"in evaluation \(eval mode\) the output would be NaN\. The likely cause: "
                                              r"the float32 running statistic overflowed in training.*inputs beyond about "
                                              r"1\.84e\+19 in magnitude\)\. Scale the layer's inputs down, or keep the "
                                              r"layer in float64 \(layer\.double\(\)\)"):
        layer.eval()(x)


# ---- the dataset cache folder -----------------------------------------------------------------

TINY_SPEC = ShapesSpec(image_size=32, num_train=1, num_val=1, num_test=1)


def test_cache_under_a_file_names_the_variable_and_the_fix(tmp_path, monkeypatch):
    # a path below a regular file cannot be created, not even by root
    blocker = tmp_path / "file.txt"
    blocker.write_text("not a folder")
    monkeypatch.setenv("GWDET_CACHE", str(blocker / "sub"))
    with pytest.raises(CacheNotWritableError) as err:
        ensure_generated(TINY_SPEC)
    message = str(err.value)
    for fragment in (f"GWDET_CACHE={str(blocker / 'sub')!r}", "Not a directory", "Point GWDET_CACHE at a writable directory"):
        assert fragment in message, message


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory (chmod does not stop it)")
def test_read_only_cache_names_the_variable_and_the_fix(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o500)
    monkeypatch.setenv("GWDET_CACHE", str(cache))
    try:
        with pytest.raises(CacheNotWritableError) as err:
            ensure_generated(TINY_SPEC)
    finally:
        cache.chmod(0o700)
    message = str(err.value)
    assert f"GWDET_CACHE={str(cache)!r}" in message and "Permission denied" in message, message
    assert list(cache.iterdir()) == []


def test_unwritable_dataset_root_in_the_config_names_the_key(tmp_path):
    blocker = tmp_path / "file.txt"
    blocker.write_text("not a folder")
    cfg = build_config(str(DEMO_CONFIG), TINY_OPTS + ["DATASETS.SHAPES.ROOT", str(blocker / "shapes")])
    with pytest.raises(CacheNotWritableError) as err:
        register_shapes(cfg)
    message = str(err.value)
    assert f"DATASETS.SHAPES.ROOT={str(blocker / 'shapes')!r}" in message, message
    assert "Set DATASETS.SHAPES.ROOT to a writable directory" in message, message


# ---- input images with inf or NaN pixels ------------------------------------------------------


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_non_finite_pixel_names_the_image(bad):
    image = torch.rand(3, 8, 8) * 255
    image[1, 2, 5] = bad
    good = {"image": torch.randint(0, 256, (3, 8, 8), dtype=torch.uint8), "file_name": "good.png"}
    with pytest.raises(NonFiniteImageError) as err:
        check_finite_images([good, {"image": image, "file_name": "scan_07.npy", "image_id": 7}])
    message = str(err.value)
    for fragment in ("'scan_07.npy'", "image_id 7", "not finite", "1 of 192", "(1, 2, 5)"):
        assert fragment in message, message
    check_finite_images([good, {"image": image.nan_to_num(posinf=0.0), "file_name": "fixed.npy"}])


def _npy_mapper(record):
    """A custom mapper of the kind that can hand the model float images: pixels from ``.npy``."""
    record = dict(record)
    pixels = np.load(record["file_name"])
    record["image"] = torch.as_tensor(np.ascontiguousarray(pixels.transpose(2, 0, 1)))
    annotations = record.pop("annotations")
    record["instances"] = detection_utils.annotations_to_instances(annotations, pixels.shape[:2], mask_format="bitmask")
    return record


class _NpyTrainer(Trainer):
    @classmethod
    def build_train_loader(cls, cfg):
        return build_detection_train_loader(cfg, mapper=_npy_mapper)


def test_inf_pixel_stops_training_before_the_model_runs(tmp_path):
    records = []
    for index in range(2):
        pixels = np.random.default_rng(index).uniform(0, 255, (64, 64, 3)).astype(np.float32)
        if index == 1:
            pixels[10, 20, 0] = np.inf
        file_name = tmp_path / f"image_{index}.npy"
        np.save(file_name, pixels)
        square = [8.0, 8.0, 40.0, 8.0, 40.0, 40.0, 8.0, 40.0]
        records.append({
            "file_name": str(file_name), "image_id": index, "height": 64, "width": 64,
            "annotations": [{"bbox": [8, 8, 32, 32], "bbox_mode": BoxMode.XYWH_ABS, "category_id": 0,
                             "segmentation": [square], "iscrowd": 0}],
        })
    name = "gwdet_test_inf_pixel"
    if name in DatasetCatalog.list():
        DatasetCatalog.remove(name)
        MetadataCatalog.remove(name)
    DatasetCatalog.register(name, lambda: records)
    MetadataCatalog.get(name).set(thing_classes=["circle", "square", "triangle", "star"])
    opts = ["DATASETS.TRAIN", f"('{name}',)", "DATASETS.TEST", "()", "OUTPUT_DIR", str(tmp_path / "out"),
            "SOLVER.MAX_ITER", "5", "DATALOADER.ASPECT_RATIO_GROUPING", "False"]
    trainer = _NpyTrainer(build_config(str(DEMO_CONFIG), TINY_OPTS + opts))
    calls = []
    trainer.model.register_forward_pre_hook(lambda module, args: calls.append(1))
    with pytest.raises(NonFiniteImageError) as err:
        trainer.train()
    assert "image_1.npy" in str(err.value) and "not finite" in str(err.value)
    assert calls == [], "the model never ran on the batch"


def test_checked_train_loader_still_resumes_where_it_stopped():
    # the wrapper passes on what gwdet.data.resumable set on the loader it wraps
    cfg = build_config(str(DEMO_CONFIG), TINY_OPTS)
    prepare_datasets(cfg)
    loader = FiniteImageBatches(Trainer.build_train_loader(cfg))
    assert skip_trained_samples(loader, 3 * cfg.SOLVER.IMS_PER_BATCH)


def test_group_whitening_parameters_on_another_device_than_the_input_are_named():
    with torch.device("meta"):  # e.g. built on the meta device, its weights never loaded
        layer = GroupWhitening(8, num_groups=4)
    with pytest.raises(ValueError, match=r"GroupWhitening: the input is on cpu, the weight on meta; move the layer"):
        layer(torch.randn(2, 8, 3, 3))


def test_the_functional_forms_check_their_arguments_as_the_layers_do():
    # before: integer inputs came back rounded to integers, momentum 5 or eps -1 ran (NaN), a group count
    # that does not divide the channels or a weight of the wrong size ended in torch's shape errors
    from gwdet.layers import batch_group_norm, batch_whitening, group_whitening, group_whitening_reference
    from gwdet.layers import largest_divisor_at_most

    x = torch.randn(4, 16, 5, 5)
    whole = torch.randint(-5, 6, (4, 16, 5, 5))
    stats = (torch.zeros(16), torch.ones(16))
    for call in (lambda: group_whitening(whole, 4), lambda: group_whitening_reference(whole, 4),
                 lambda: batch_whitening(whole, torch.zeros(16), torch.eye(4).repeat(4, 1, 1), None, None, True, 0.1,
                                         5, 1e-5, "itn"),
                 lambda: batch_group_norm(whole, *stats, None, None, True, 4, 2, 1e-5, 0.1, 0.0)):
        with pytest.raises(ValueError, match=r"expected a floating-point input, got torch.int64; convert it with "
                                             r"\.float\(\)"):
            call()
    with pytest.raises(ValueError, match=r"^batch_whitening: momentum must be"):
        batch_whitening(x, torch.zeros(16), torch.eye(16)[None], None, None, True, 5.0, 5, 1e-5, "zca")
    with pytest.raises(ValueError, match=r"^batch_whitening: eps must be"):
        batch_whitening(x, torch.zeros(16), torch.eye(16)[None], None, None, True, 0.1, 5, -1.0, "zca")
    with pytest.raises(ValueError, match=r"^batch_whitening: running_whitening must hold one k x k matrix per group "
                                         r"of k channels, shape \[16 / k, k, k\], got \[1, 8, 8\]"):
        batch_whitening(x, torch.zeros(16), torch.eye(8)[None], None, None, True, 0.1, 5, 1e-5, "zca")
    with pytest.raises(ValueError, match=r"^batch_group_norm: eval_example_weight must be"):
        batch_group_norm(x, *stats, None, None, False, 4, 2, 1e-5, 0.1, 3.0)
    with pytest.raises(ValueError, match=r"^batch_group_norm: groups=5 must divide the 16 channels of the input \(the "
                                         r"layer uses largest_divisor_at_most\(16, num_groups\) = 4\)"):
        batch_group_norm(x, *stats, None, None, True, 5, 2, 1e-5, 0.1, 0.0)
    with pytest.raises(ValueError, match=r"^batch_group_norm: examples_per_group must be"):
        batch_group_norm(x, *stats, None, None, True, 4, 0, 1e-5, 0.1, 0.0)
    with pytest.raises(ValueError, match=r"^batch_group_norm: running_var must hold one value per channel, shape "
                                         r"\[16\], got \[8\]"):
        batch_group_norm(x, torch.zeros(16), torch.ones(8), None, None, True, 4, 2, 1e-5, 0.1, 0.0)
    # torch's "lerp_kernel_scalar" not implemented for 'Long'
    with pytest.raises(ValueError, match=r"^batch_group_norm: running_var \(torch.int64\) must be floating-point: it "
                                         r"holds a running average, .*; create it as torch.ones\(16\), or convert"):
        batch_group_norm(x, torch.zeros(16), torch.ones(16, dtype=torch.int64), None, None, True, 4, 2, 1e-5, 0.1, 0.0)
    with pytest.raises(ValueError, match=r"^batch_group_norm: running_mean \(torch.int32\) and running_var "
                                         r"\(torch.int64\) must be floating-point: they hold running averages, .*; "
                                         r"create them as torch.zeros\(16\) and torch.ones\(16\), or convert"):
        batch_group_norm(x, torch.zeros(16, dtype=torch.int32), torch.ones(16, dtype=torch.int64), None, None, False,
                         4, 2, 1e-5, 0.1, 0.0)
    with pytest.raises(ValueError, match=r"^group_whitening_reference: weight must hold one value per channel, shape "
                                         r"\[16\], got \[8\]"):
        group_whitening_reference(x, 4, 5, 1e-5, "itn", torch.ones(8), torch.zeros(16))
    for training in (True, False):  # a raw AttributeError ('NoneType' object has no attribute 'lerp_')
        with pytest.raises(ValueError, match=r"^batch_group_norm: running_mean and running_var must be tensors of one "
                                             r"value per channel, shape \[16\] .*got None"):
            batch_group_norm(x, None, None, None, None, training, 4, 2, 1e-5, 0.1, 0.0)
    for total, limit in ((-16, 4), (16, 0), (16, 4.5), (16.0, 4), (16, True)):  # 4.5 gave 0.5 groups
        with pytest.raises(ValueError, match=r"^largest_divisor_at_most: total and limit must be integers >= 1"):
            largest_divisor_at_most(total, limit)
    assert batch_group_norm(x, *stats, None, None, True, 4, 2, 1e-5, 0.1, 0.0).shape == x.shape


# dict batches with an "image" key for a model whose forward takes a dict were refused as one detectron2 image's
# record, with no word of forward=
def test_dict_batches_of_a_model_that_takes_a_dict_name_the_forward_that_runs_it():
    from gwdet.errors import GwdetTypeError
    from gwdet.layers import update_running_statistics

    class DictModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.n = BatchWhitening(8, 4)

        def forward(self, batch):
            return self.n(batch["image"])

    torch.manual_seed(0)
    model = DictModel()
    loader = [{"image": torch.randn(4, 8, 3, 3)}]
    with pytest.raises(GwdetTypeError, match=r"^update_running_statistics: the loader gave a dict .*for one whose "
                                             r"forward takes the dict itself, forward=lambda m, b: m\(b\); .* The "
                                             r"running statistics are as they were\.$"):
        update_running_statistics(loader, model)
    assert torch.equal(model.n.running_mean, torch.zeros(8))
    assert update_running_statistics(loader, model, forward=lambda m, b: m(b)) == 1
    assert not torch.equal(model.n.running_mean, torch.zeros(8))
