"""Every yaml under configs/ loads with add_gwdet_config and builds its model on CPU."""
import pytest
from detectron2.modeling import build_model

from gwdet.engine import build_config
from gwdet.layers import GroupWhitening

from conftest import REPO

CONFIGS = sorted(p for p in (REPO / "configs").rglob("*.yaml") if not p.name.startswith("Base-"))


def gw_count(model):
    return sum(isinstance(m, GroupWhitening) for m in model.modules())


def test_all_configs_are_found():
    assert len(CONFIGS) >= 19, [p.name for p in CONFIGS]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(REPO / "configs")))
def test_config_loads_and_builds(path):
    cfg = build_config(str(path), ["MODEL.DEVICE", "cpu"])
    model = build_model(cfg)
    name = path.stem
    if name.endswith("_gw") or name == "mask_rcnn_gw":
        assert gw_count(model) > 0
    if name.endswith(("_bn", "_gn")):
        assert gw_count(model) == 0
    if cfg.MODEL.RESNETS.GW_POSITIONS == "S1-B2":
        blocks = sum(len(s) for s in model.backbone.bottom_up.stages)
        assert gw_count(model.backbone.bottom_up) == 1 + blocks


def test_paper_configs_use_converted_weight_conventions():
    for path in CONFIGS:
        if "Demo" in path.parts:
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
