"""Bad input gets an error naming what is wrong and how to fix it (docs/reliability.md lists all).

Weight-conversion errors (wrong architecture or positions, corrupted, truncated and non-checkpoint
files) are tested in test_convert.py; unsafe pickles in test_safe_loading.py.
"""
import json

import pytest
import torch
from detectron2.data.datasets import register_coco_instances

from gwdet.checkpoint.resilient import ResilientCheckpointer
from gwdet.data import check_dataset_files
from gwdet.engine import Trainer, build_config
from gwdet.layers import BatchGroupNorm, BatchWhitening, GroupWhitening

from conftest import DEMO_CONFIG, TINY_OPTS

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
    "example groups larger than the batch": (
        ["MODEL.ROI_BOX_HEAD.NORM", "BGN", "MODEL.BGN.EXAMPLES_PER_GROUP", "8"],
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
                               ["single value", "normalizes to 0", "fewer groups"]),
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


def test_missing_weights_file_says_how_to_get_one(tmp_path):
    checkpointer = ResilientCheckpointer(torch.nn.Linear(2, 2), str(tmp_path))
    with pytest.raises(FileNotFoundError) as err:
        checkpointer.resume_or_load(str(tmp_path / "weights" / "R-50-GW.pkl"), resume=False)
    assert "R-50-GW.pkl" in str(err.value) and "convert_pretrained.py" in str(err.value)


def test_non_finite_input_stays_in_its_own_sample():
    """Documented behaviour: GW normalises each sample alone, so a NaN/Inf poisons that sample's
    output and nothing else (no check on the hot path; detectron2's trainer stops on a NaN loss)."""
    layer = GroupWhitening(8, num_groups=4)
    for bad in (float("nan"), float("inf")):
        x = torch.randn(3, 8, 4, 4)
        x[1, 2, 0, 0] = bad
        y = layer(x)
        assert torch.isfinite(y[0]).all() and torch.isfinite(y[2]).all()
        assert not torch.isfinite(y[1]).all()
        assert torch.allclose(y[[0, 2]], layer(x[[0, 2]]))


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
