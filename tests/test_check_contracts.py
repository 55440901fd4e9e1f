"""Properties of the checks that no other test pinned: each test here kills a mutation of the code
that the rest of the suite let pass (docs/reliability.md, "Mutation testing").
"""
import logging
import os

import pytest
from detectron2.config import get_cfg

from gwdet import add_gwdet_config, check_gwdet_config, norm
from gwdet.config import config_default
from gwdet.engine.output_dir import CONFIG_NAME, check_resume_config
from gwdet.layers import GroupWhitening
from gwdet.norms import UnknownNormError


def gw_backbone_config():
    cfg = get_cfg()
    add_gwdet_config(cfg)
    cfg.MODEL.BACKBONE.NAME = "build_gw_resnet_fpn_backbone"
    cfg.MODEL.RESNETS.GW_POSITIONS = "S1-B2"
    cfg.MODEL.ROI_HEADS.NAME = "StandardROIHeads"  # FPN's heads: res5 is in the backbone
    return cfg


def test_gw_norm_with_an_unknown_name_is_refused_naming_the_key():
    cfg = gw_backbone_config()
    check_gwdet_config(cfg)  # the paper's S1-B2 with GW_NORM "GW": valid
    cfg.MODEL.RESNETS.GW_NORM = "GWW"
    with pytest.raises(UnknownNormError, match=r"MODEL\.RESNETS\.GW_NORM='GWW' is not a known norm name"):
        check_gwdet_config(cfg)


def test_defaults_are_the_papers_in_the_config_table_and_in_the_layer():
    # group_whitening_huang2021 Sec. 5: GW (g=64) with ItN, T=5 (and eps 1e-5 in its Algorithm 1).
    assert config_default("MODEL.GW.NUM_GROUPS") == 64
    assert config_default("MODEL.GW.T") == 5
    assert config_default("MODEL.GW.EPS") == 1e-5
    layer = GroupWhitening(256)
    assert (layer.num_groups, layer.T, layer.eps) == (64, 5, 1e-5)
    built = norm("GW")(256)
    assert (built.num_groups, built.T, built.eps) == (64, 5, 1e-5)
    cfg = get_cfg()
    add_gwdet_config(cfg)
    assert (cfg.MODEL.GW.NUM_GROUPS, cfg.MODEL.GW.T, cfg.MODEL.GW.EPS) == (64, 5, 1e-5)


def run_folder_with(cfg, folder):
    """A run folder as training leaves it: its config.yaml and one checkpoint."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, CONFIG_NAME), "w") as f:
        f.write(cfg.dump())
    open(os.path.join(folder, "model_0000009.pth"), "wb").close()
    return str(folder)


def test_resume_allows_other_weights_and_device_but_not_another_model(tmp_path, caplog):
    trained = gw_backbone_config()
    folder = run_folder_with(trained, tmp_path / "run")

    moved = trained.clone()
    moved.MODEL.WEIGHTS = "elsewhere/model_final.pth"
    moved.MODEL.DEVICE = "cuda"
    check_resume_config(moved, folder)  # where the weights come from and where they run: no other model

    longer = trained.clone()
    longer.SOLVER.MAX_ITER = trained.SOLVER.MAX_ITER * 2
    with caplog.at_level(logging.WARNING):
        check_resume_config(longer, folder)  # a longer schedule: logged, not refused
    assert "SOLVER.MAX_ITER" in caplog.text

    for key, value in [("GW.NUM_GROUPS", 16), ("RESNETS.GW_POSITIONS", "S1"), ("PIXEL_STD", [57.0, 57.0, 57.0])]:
        other = trained.clone()
        other.merge_from_list([f"MODEL.{key}", value])
        with pytest.raises(ValueError, match=rf"trained with another model .*MODEL\.{key}"):
            check_resume_config(other, folder)
