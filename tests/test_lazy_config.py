"""LazyConfig: gwdet.norm in L(...) nodes, GW positions via place_norm, save/load round trips."""
from collections import Counter

import pytest
import torch
from detectron2.config import LazyCall as L
from detectron2.config import LazyConfig, instantiate
from detectron2.modeling.backbone import BasicStem, ResNet

import gwdet
from gwdet.layers import GroupWhitening
from gwdet.modeling import place_norm

from conftest import REPO

LAZY = REPO / "configs" / "LazyConfig"


def _norms_by_part(model: torch.nn.Module) -> dict:
    found: dict = {}
    for name, layer in model.named_modules():
        kind = type(layer).__name__
        if isinstance(layer, GroupWhitening) or "Norm" in kind:
            part = ("bottom_up" if "bottom_up" in name else "fpn" if ".fpn_" in name
                    else "box_head" if "box_head" in name else "mask_head" if "mask_head" in name else name)
            found.setdefault(part, Counter())[kind] += 1
    return {part: dict(counter) for part, counter in found.items()}


def _gw_values(model: torch.nn.Module) -> set:
    return {(m.num_groups, m.T, m.eps) for m in model.modules() if isinstance(m, GroupWhitening)}


@pytest.mark.parametrize("config, expected", [
    ("mask_rcnn_R_50_FPN_gw.py", {"bottom_up": {"GroupWhitening": 17, "FrozenBatchNorm2d": 36},
                                  "fpn": {"GroupWhitening": 8}, "box_head": {"GroupWhitening": 4},
                                  "mask_head": {"GroupWhitening": 4}}),
    ("scratch_faster_rcnn_R_50_FPN_gw.py", {"bottom_up": {"GroupWhitening": 53}, "fpn": {"GroupWhitening": 8},
                                            "box_head": {"GroupWhitening": 4}}),
])
def test_lazy_configs_build_gw_in_every_part_and_survive_save_and_load(config, expected, tmp_path):
    cfg = LazyConfig.load(str(LAZY / config))
    cfg.model.backbone.norm.num_groups = 16  # one value changed: it must reach the FPN only
    saved = tmp_path / "saved.yaml"
    LazyConfig.save(cfg, str(saved))
    reloaded = LazyConfig.load(str(saved))
    for loaded in (cfg, reloaded):
        torch.manual_seed(0)
        model = instantiate(loaded.model)
        assert _norms_by_part(model) == expected
        fpn = {(m.num_groups, m.T, m.eps) for n, m in model.named_modules()
               if isinstance(m, GroupWhitening) and ".fpn_" in n}
        assert fpn == {(16, 5, 1e-5)}
        assert _gw_values(model) == {(16, 5, 1e-5), (64, 5, 1e-5)}
    saved_again = tmp_path / "saved_again.yaml"
    LazyConfig.save(reloaded, str(saved_again))
    assert saved_again.read_text() == saved.read_text()
    assert "gwdet.norm" in saved.read_text()


def test_place_norm_puts_the_norm_at_the_positions_and_freezes_after():
    resnet = place_norm(
        ResNet(BasicStem(3, 64, norm="BN"), ResNet.make_default_stages(18, norm="BN"),
               out_features=["res5"], freeze_at=0),
        positions="S1-B2", norm=gwdet.norm("GW", num_groups=4), freeze_at=2)
    assert isinstance(resnet.stem.conv1.norm, GroupWhitening) and resnet.stem.conv1.norm.num_groups == 4
    stage2, stage3 = resnet.stages[0], resnet.stages[1]
    assert all(isinstance(block.conv2.norm, GroupWhitening) for block in stage2)
    assert type(stage2[0].conv1.norm).__name__ == "FrozenBatchNorm2d", "frozen stage: BN -> FrozenBN"
    assert type(stage3[0].conv1.norm).__name__ == "BatchNorm2d", "trainable stage keeps BN"
    assert not any(p.requires_grad for p in stage2.parameters())
    assert all(p.requires_grad for p in stage3.parameters())


def test_a_norm_name_detectron2_does_not_know_fails_loudly_in_a_lazy_config():
    node = L(BasicStem)(in_channels=3, out_channels=16, norm="GW")
    with pytest.raises(KeyError):
        instantiate(node)
