"""Every yaml under configs/ builds, on CPU, the norm each NORM key names at every place, with the
config's group numbers (expected types derived from the config alone)."""
import pytest
import torch
from detectron2.layers import FrozenBatchNorm2d
from detectron2.modeling import build_model

from gwdet.engine import build_config
from gwdet.layers import GroupWhitening
from gwdet.positions import BLOCK_CONV_OF_POSITION, parse_gw_positions

from conftest import REPO

CONFIGS = sorted(p for p in (REPO / "configs").rglob("*.yaml") if not p.name.startswith("Base-"))


NORM_TYPES = {"GW": GroupWhitening, "GN": torch.nn.GroupNorm, "BN": torch.nn.BatchNorm2d,
              "SyncBN": torch.nn.SyncBatchNorm, "FrozenBN": FrozenBatchNorm2d, "": type(None)}
GROUPS_KEY = {GroupWhitening: "GW", torch.nn.GroupNorm: "GN"}


def expected_type(name: str, frozen: bool):
    kind = NORM_TYPES[name]
    return FrozenBatchNorm2d if frozen and kind is torch.nn.BatchNorm2d else kind


def backbone_expectations(cfg, resnet):
    """(conv, expected norm type) for every norm-carrying conv of the ResNet, from the config alone."""
    positions = parse_gw_positions(cfg.MODEL.RESNETS.GW_POSITIONS)
    freeze_at = cfg.MODEL.BACKBONE.FREEZE_AT
    yield resnet.stem.conv1, expected_type(
        cfg.MODEL.RESNETS.GW_NORM if "S1" in positions else cfg.MODEL.RESNETS.NORM, freeze_at >= 1)
    for index, stage in enumerate(resnet.stages, start=2):
        for block in stage:
            for conv_name in ("conv1", "conv2", "conv3", "shortcut"):
                conv = getattr(block, conv_name, None)
                if conv is None:
                    continue
                at_gw = any(BLOCK_CONV_OF_POSITION[p] == conv_name for p in positions if p != "S1")
                name = cfg.MODEL.RESNETS.GW_NORM if at_gw else cfg.MODEL.RESNETS.NORM
                yield conv, expected_type(name, freeze_at >= index)


def head_expectations(cfg, model):
    for name, conv in model.backbone.named_children():
        if name.startswith(("fpn_lateral", "fpn_output")):
            yield conv, expected_type(cfg.MODEL.FPN.NORM, False)
    for conv in getattr(model.roi_heads.box_head, "conv_norm_relus", []):
        yield conv, expected_type(cfg.MODEL.ROI_BOX_HEAD.NORM, False)
    if cfg.MODEL.MASK_ON:
        for conv in model.roi_heads.mask_head.conv_norm_relus:
            yield conv, expected_type(cfg.MODEL.ROI_MASK_HEAD.NORM, False)


def test_all_configs_are_found():
    assert len(CONFIGS) >= 19, [p.name for p in CONFIGS]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(REPO / "configs")))
def test_config_builds_every_norm_the_config_names_with_its_values(path):
    cfg = build_config(str(path), ["MODEL.DEVICE", "cpu"])
    model = build_model(cfg)
    checked = 0
    for conv, kind in [*backbone_expectations(cfg, model.backbone.bottom_up), *head_expectations(cfg, model)]:
        assert type(conv.norm) is kind, (path.name, conv, kind)
        if kind in GROUPS_KEY:
            assert conv.norm.num_groups == cfg.MODEL[GROUPS_KEY[kind]].NUM_GROUPS
        checked += 1
    assert checked >= 60


def test_paper_configs_use_converted_weight_conventions():
    for path in CONFIGS:
        if {"Demo", "Study"} & set(path.parts):  # the shapes dataset: no ImageNet weights
            continue
        cfg = build_config(str(path))
        assert cfg.INPUT.FORMAT == "RGB" and not cfg.MODEL.RESNETS.STRIDE_IN_1X1
        assert cfg.MODEL.PIXEL_STD == [58.395, 57.120, 57.375]


def test_headline_config_is_table_5():
    cfg = build_config(str(REPO / "configs" / "mask_rcnn_gw.yaml"))
    assert cfg.MODEL.MASK_ON and cfg.MODEL.RESNETS.DEPTH == 101
    assert (cfg.MODEL.RESNETS.NUM_GROUPS, cfg.MODEL.RESNETS.WIDTH_PER_GROUP) == (32, 8)
    assert cfg.MODEL.RESNETS.GW_POSITIONS == "S1-B2"
    assert cfg.MODEL.FPN.NORM == cfg.MODEL.ROI_BOX_HEAD.NORM == cfg.MODEL.ROI_MASK_HEAD.NORM == "GW"
    assert (cfg.MODEL.ROI_BOX_HEAD.NUM_CONV, cfg.MODEL.ROI_BOX_HEAD.NUM_FC) == (4, 1)
    assert (cfg.SOLVER.MAX_ITER, cfg.SOLVER.IMS_PER_BATCH, cfg.SOLVER.BASE_LR) == (180000, 8, 0.01)


def test_scratch_configs_train_every_norm():
    for path in CONFIGS:
        if "Scratch" in path.parts:
            cfg = build_config(str(path))
            assert cfg.MODEL.BACKBONE.FREEZE_AT == 0 and cfg.MODEL.WEIGHTS == ""
            assert cfg.MODEL.RESNETS.NORM in {"BN", "GN", "GW"}
