"""Refusing converted ImageNet weights that do not fit the model they are loaded into.

detectron2's ``FrozenBatchNorm2d`` quietly fills running statistics a checkpoint lacks with 0 and
1, so GW affine parameters would load into BN layers without a word; a ResNet-101 checkpoint into a
ResNet-50 only logs skipped keys. Weights written by ``tools/convert_pretrained.py`` record their
architecture and GW positions, which are checked here against the model's backbone before loading.
"""
from __future__ import annotations

from typing import Mapping

import torch
from detectron2.modeling.backbone import ResNet

from gwdet.checkpoint.layout import ARCHITECTURES
from gwdet.modeling.backbone import gw_positions_of
from gwdet.modeling.positions import parse_gw_positions

POSITION_ORDER = ("S1", "B1", "B2", "B3")


def format_positions(positions) -> str:
    """``{"B2", "S1"}`` -> ``"S1-B2"``; none -> ``""``."""
    return "-".join(p for p in POSITION_ORDER if p in positions)


def _resnet_of(model: torch.nn.Module) -> ResNet | None:
    return next((m for m in model.modules() if isinstance(m, ResNet)), None)


def check_weights_fit_model(metadata: Mapping, model: torch.nn.Module) -> None:
    """Raise ``ValueError`` when converted weights (their ``"gwdet"`` metadata) misfit ``model``."""
    resnet = _resnet_of(model)
    if resnet is None:
        return
    arch = ARCHITECTURES.get(metadata.get("arch"))
    if arch is not None:
        conv2 = resnet.stages[0][0].conv2
        found = (tuple(len(stage) for stage in resnet.stages), conv2.groups, conv2.out_channels // conv2.groups)
        # A ResNet built for fewer OUT_FEATURES omits its last stages: compare the ones it has.
        expected = (arch.blocks_per_stage[: len(found[0])], arch.num_groups, arch.width_per_group)
        if found != expected:
            raise ValueError(
                f"The weights are {arch.describe()}, but the model's ResNet has blocks per stage "
                f"{list(found[0])} and conv2 {found[1]} group(s) x {found[2]} channels. Set "
                f"MODEL.RESNETS.DEPTH {arch.depth}, NUM_GROUPS {arch.num_groups}, WIDTH_PER_GROUP "
                f"{arch.width_per_group}, or load the weights converted for this architecture."
            )
    if "gw_positions" in metadata:
        expected = parse_gw_positions(metadata["gw_positions"])
        present = gw_positions_of(resnet)
        if expected != present:
            raise ValueError(
                f"The weights have GW at {format_positions(expected)!r} (norms without running "
                f"statistics), but the model has GW at {format_positions(present)!r}. Set "
                f"MODEL.RESNETS.GW_POSITIONS {format_positions(expected)!r}, so that BN statistics "
                "and GW parameters each load into their own kind of layer."
            )
