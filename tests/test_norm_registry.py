"""gwdet's norm names inside detectron2's get_norm: import order, config values, errors."""
import subprocess
import sys
import textwrap

import pytest
import torch
from detectron2.config import get_cfg
from detectron2.layers import ShapeSpec, get_norm
from detectron2.modeling import build_backbone

import gwdet
from gwdet import add_gwdet_config, known_norm_names, norm_config, register_norm
from gwdet.layers import BatchGroupNorm, BatchWhitening, GroupWhitening

from conftest import REPO

GWDET_NAMES = {"GW": GroupWhitening, "GW_ZCA": GroupWhitening, "BW": BatchWhitening,
               "BW_ItN": BatchWhitening, "BGN": BatchGroupNorm, "GhostBN": BatchGroupNorm}


@pytest.mark.parametrize("name", sorted(GWDET_NAMES))
def test_every_name_builds_its_layer_and_runs(name):
    layer = get_norm(name, 64)
    assert isinstance(layer, GWDET_NAMES[name])
    out = layer.train()(torch.randn(4, 64, 5, 5))
    assert out.shape == (4, 64, 5, 5) and torch.isfinite(out).all()


@pytest.mark.parametrize("first", ["detectron2.modeling", "gwdet"])
def test_registry_works_in_both_import_orders(first):
    second = "gwdet" if first == "detectron2.modeling" else "detectron2.modeling"
    script = textwrap.dedent(f"""
        import {first}
        import {second}
        import detectron2.modeling.backbone.fpn as fpn
        import detectron2.modeling.roi_heads.box_head as box_head
        import detectron2.modeling.roi_heads.mask_head as mask_head
        from detectron2.layers import get_norm
        for fn in (get_norm, fpn.get_norm, box_head.get_norm, mask_head.get_norm):
            assert type(fn("GW", 32)).__name__ == "GroupWhitening", fn
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]


def test_importing_twice_keeps_one_wrapper():
    import importlib

    import detectron2.layers as d2_layers

    before = d2_layers.get_norm
    importlib.reload(gwdet)
    assert d2_layers.get_norm is before


def _fpn_cfg(num_groups: int):
    cfg = add_gwdet_config(get_cfg())
    cfg.MODEL.BACKBONE.NAME = "build_gw_resnet_fpn_backbone"
    cfg.MODEL.RESNETS.OUT_FEATURES = ["res2", "res3", "res4", "res5"]
    cfg.MODEL.FPN.IN_FEATURES = ["res2", "res3", "res4", "res5"]
    cfg.MODEL.RESNETS.DEPTH = 50
    cfg.MODEL.FPN.NORM = "GW"
    cfg.MODEL.GW.NUM_GROUPS = num_groups
    return cfg


def test_two_configs_in_one_process_get_their_own_group_numbers():
    first = build_backbone(_fpn_cfg(16), ShapeSpec(channels=3))
    second = build_backbone(_fpn_cfg(4), ShapeSpec(channels=3))
    groups = lambda model: {m.num_groups for m in model.modules() if isinstance(m, GroupWhitening)}
    assert groups(first) == {16} and groups(second) == {4}
    # Outside a build the defaults apply again: nothing leaked.
    assert get_norm("GW", 256).num_groups == 64


def test_gn_group_number_comes_from_config():
    cfg = add_gwdet_config(get_cfg())
    cfg.MODEL.GN.NUM_GROUPS = 16
    with norm_config(cfg):
        assert get_norm("GN", 64).num_groups == 16
    assert get_norm("GN", 64).num_groups == 32, "detectron2's default outside a build"


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError) as err:
        get_norm("GWW", 64)
    message = str(err.value)
    assert "'GWW'" in message and "register_norm" in message
    for name in ("BN", "FrozenBN", "SyncBN", "GN", *GWDET_NAMES):
        assert name in message


def test_users_can_register_their_own_name():
    @register_norm("TestInstanceNorm")
    def _instance_norm(channels, model_cfg):
        return torch.nn.GroupNorm(channels, channels)

    assert "TestInstanceNorm" in known_norm_names()
    assert get_norm("TestInstanceNorm", 8).num_groups == 8
