"""ResNet/ResNeXt (+FPN) backbones with a chosen norm (GW by default) at chosen positions.

Positions follow group_whitening_huang2021, Sec. 5.1.1: ``S1`` is the stem norm; ``B1``, ``B2``
and ``B3`` are the norms after conv1, conv2 and conv3 of every bottleneck block; ``B12`` is B1 and
B2. Tokens are joined by ``-`` (the paper's default is ``S1-B2``: 17 GW layers in a ResNet-50).
Shortcut norms and every other norm keep ``MODEL.RESNETS.NORM``.

The network is detectron2's own ResNet, built by detectron2's ``build_resnet_backbone``; only the
norm modules at the chosen positions are replaced, so checkpoint keys are detectron2's
(``backbone.bottom_up.res2.0.conv2.norm.weight``). ``MODEL.BACKBONE.FREEZE_AT`` keeps its meaning:
it is applied after the replacement (BN in frozen stages becomes FrozenBN, every parameter there
stops requiring gradients; a GW layer in a frozen stage keeps whitening, with frozen affine).
"""
from __future__ import annotations

from typing import FrozenSet, Iterator

from detectron2.config import CfgNode
from detectron2.layers import Conv2d, ShapeSpec, get_norm
from detectron2.modeling import BACKBONE_REGISTRY
from detectron2.modeling.backbone import FPN, ResNet
from detectron2.modeling.backbone.fpn import LastLevelMaxPool
from detectron2.modeling.backbone.resnet import build_resnet_backbone

from gwdet.config_checks import check_gwdet_config
from gwdet.layers import GroupWhitening
from gwdet.modeling.positions import parse_gw_positions
from gwdet.norm_registry import norm_config

_BLOCK_CONV_OF_POSITION = {"B1": "conv1", "B2": "conv2", "B3": "conv3"}


def convs_at_positions(resnet: ResNet, positions: FrozenSet[str]) -> Iterator[Conv2d]:
    """The conv layers whose norm sits at ``positions``, stem first, then block by block."""
    if "S1" in positions:
        yield resnet.stem.conv1
    block_positions = sorted(positions & set(_BLOCK_CONV_OF_POSITION))
    for stage in resnet.stages:
        for block in stage:
            for position in block_positions:
                conv_name = _BLOCK_CONV_OF_POSITION[position]
                if not hasattr(block, conv_name):
                    raise ValueError(
                        f"GW position {position} needs {conv_name} in every block, but "
                        f"{type(block).__name__} has none: use MODEL.RESNETS.DEPTH >= 50 "
                        "(bottleneck blocks) or drop that position."
                    )
                yield getattr(block, conv_name)


def gw_positions_of(resnet: ResNet, gw_types: tuple = (GroupWhitening,)) -> FrozenSet[str]:
    """The positions (``S1``, ``B1``, ``B2``, ``B3``) where every norm is one of ``gw_types``."""
    positions = {"S1"} if isinstance(resnet.stem.conv1.norm, gw_types) else set()
    blocks = [block for stage in resnet.stages for block in stage]
    for position, conv_name in _BLOCK_CONV_OF_POSITION.items():
        if all(isinstance(getattr(getattr(b, conv_name, None), "norm", None), gw_types) for b in blocks):
            positions.add(position)
    return frozenset(positions)


def build_gw_resnet(cfg: CfgNode, input_shape: ShapeSpec) -> ResNet:
    """detectron2's ResNet with ``MODEL.RESNETS.GW_NORM`` at ``MODEL.RESNETS.GW_POSITIONS``."""
    check_gwdet_config(cfg)
    positions = parse_gw_positions(cfg.MODEL.RESNETS.GW_POSITIONS)
    unfrozen = cfg.clone()
    unfrozen.defrost()
    unfrozen.MODEL.BACKBONE.FREEZE_AT = 0
    with norm_config(cfg):
        resnet = build_resnet_backbone(unfrozen, input_shape)
        for conv in convs_at_positions(resnet, positions):
            conv.norm = get_norm(cfg.MODEL.RESNETS.GW_NORM, conv.out_channels)
    return resnet.freeze(cfg.MODEL.BACKBONE.FREEZE_AT)


@BACKBONE_REGISTRY.register()
def build_gw_resnet_backbone(cfg: CfgNode, input_shape: ShapeSpec) -> ResNet:
    """``MODEL.BACKBONE.NAME: "build_gw_resnet_backbone"`` (C4-style heads)."""
    return build_gw_resnet(cfg, input_shape)


@BACKBONE_REGISTRY.register()
def build_gw_resnet_fpn_backbone(cfg: CfgNode, input_shape: ShapeSpec) -> FPN:
    """``MODEL.BACKBONE.NAME: "build_gw_resnet_fpn_backbone"``: the GW ResNet under an FPN."""
    bottom_up = build_gw_resnet(cfg, input_shape)
    with norm_config(cfg):
        return FPN(
            bottom_up=bottom_up,
            in_features=cfg.MODEL.FPN.IN_FEATURES,
            out_channels=cfg.MODEL.FPN.OUT_CHANNELS,
            norm=cfg.MODEL.FPN.NORM,
            top_block=LastLevelMaxPool(),
            fuse_type=cfg.MODEL.FPN.FUSE_TYPE,
        )
