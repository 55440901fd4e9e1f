"""Which architecture (with which GW positions) a torchvision-layout state dict is.

The architectures are those a converted checkpoint can have
(:data:`gwdet.checkpoint.converted_weights.ARCHITECTURES`). A checkpoint's architecture is read off
its blocks per stage and the grouping of its first 3x3 conv; its GW positions
(group_whitening_huang2021, Sec. 5.1.1) are the positions whose norms have no running statistics.
When no norm has any, the checkpoint is GN-style (e.g. an ImageNet GN ResNet) and has no GW.
Positions are inferred only where the norms show GW (a gwdet GW layer's record, or the GW
authors' ``[1, C, 1, 1]`` affine): norms without running statistics that keep their affine as
``[C]`` with no record may as well be GroupNorm, so there the caller names the GW positions.
"""
from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Mapping

import torch

from gwdet.checkpoint.converted_weights import ARCHITECTURES, Architecture, describe_shape
from gwdet.convert.loading import ConversionError, preview_names
from gwdet.convert.torchvision_keys import NORM_POSITIONS, RECORD_LEAF, SHORTCUT, SourceLayout, SourceNorm
from gwdet.positions import POSITIONS, format_gw_positions, parse_gw_positions

_TARGET_BLOCK = re.compile(r"res([2-5])\.(\d+)\.")

# ---- the architecture of a checkpoint -------------------------------------------------------


def check_bottleneck_blocks(layout: SourceLayout) -> None:
    """Raise for a basic-block ResNet (ResNet-18/34), which no supported architecture is."""
    if "res2.0.conv3.weight" not in layout.convs:
        raise ConversionError(
            "this is a basic-block ResNet (ResNet-18/34: no layer1.0.conv3), and the converter converts the "
            f"bottleneck architectures of the papers' models only ({', '.join(ARCHITECTURES)}): use a checkpoint of "
            "one of them. (gwdet builds ResNet-18/34 backbones, with GW at S1, B1, B2 and B12, but converts no "
            "weights for them: train them from scratch, or convert a BN ResNet-18/34 with detectron2's "
            "tools/convert-torchvision-to-d2.py for a model without GW.)"
        )


# a key of a torchvision bottleneck block: stage, block, and the module (None for one a bottleneck has not)
_SOURCE_BLOCK_KEY = re.compile(r"layer([1-4])\.(\d+)\.(?:(conv[123]|bn[123])\.)?")
BOTTLENECK_MODULES = ("conv1", "bn1", "conv2", "bn2", "conv3", "bn3")


@dataclass(frozen=True)
class StrayBlocks:
    """Blocks of a torchvision-layout state dict beyond the blocks of ``arch``, which the rest of it
    is, each holding fewer than half of a bottleneck block's modules (:func:`stray_blocks`)."""

    arch: Architecture
    keys: dict[str, list[str]]  # each stray block ("layer4.3") -> its keys
    modules: dict[str, list[str]]  # each stray block -> the bottleneck modules it holds keys of ("conv1")


def stray_blocks(tensors: Mapping[str, object]) -> StrayBlocks | None:
    """The blocks of ``tensors`` (a torchvision-layout state dict) that are stray keys rather than
    blocks of the network: blocks beyond a supported architecture's blocks per stage that each hold
    keys of fewer than half of a bottleneck block's modules (conv1-3, bn1-3), where the blocks below
    them are all there and ``layer1.0.conv2``'s grouping is that architecture's. A block with more of
    its modules is a block of another architecture (None here: :func:`infer_architecture` names
    it); None also when no block lies beyond a supported architecture."""
    keys: dict[tuple[int, int], list[str]] = defaultdict(list)
    modules: dict[tuple[int, int], set[str]] = defaultdict(set)
    for key in tensors:
        match = _SOURCE_BLOCK_KEY.match(key)
        if match:
            block = (int(match.group(1)), int(match.group(2)))
            keys[block].append(key)
            if match.group(3):
                modules[block].add(match.group(3))
    conv2 = tensors.get("layer1.0.conv2.weight")
    if not isinstance(conv2, torch.Tensor) or conv2.dim() != 4 or conv2.shape[1] == 0:
        return None  # no grouping to tell the architecture by: _conv2_grouping names that
    grouping = (int(conv2.shape[0]) // int(conv2.shape[1]), int(conv2.shape[1]))
    for arch in ARCHITECTURES.values():
        if grouping != (arch.num_groups, arch.width_per_group):
            continue
        beyond = sorted(block for block in keys if block[1] >= arch.blocks_per_stage[block[0] - 1])
        below = all((stage, block) in keys for stage in range(1, 5) for block in range(arch.blocks_per_stage[stage - 1]))
        if beyond and below and all(2 * len(modules[block]) < len(BOTTLENECK_MODULES) for block in beyond):
            return StrayBlocks(
                arch=arch,
                keys={f"layer{stage}.{block}": sorted(keys[(stage, block)]) for stage, block in beyond},
                modules={f"layer{stage}.{block}": [module for module in BOTTLENECK_MODULES
                                                   if module in modules[(stage, block)]] for stage, block in beyond})
    return None


def infer_architecture(layout: SourceLayout) -> Architecture:
    """The architecture with the checkpoint's blocks per stage and conv2 grouping."""
    blocks = _blocks_per_stage(layout)
    num_groups, width_per_group = _conv2_grouping(layout)
    found = (blocks, num_groups, width_per_group)
    for arch in ARCHITECTURES.values():
        if (arch.blocks_per_stage, arch.num_groups, arch.width_per_group) == found:
            return arch
    supported = "; ".join(arch.describe() for arch in ARCHITECTURES.values())
    raise ConversionError(
        "unsupported architecture: the checkpoint has "
        f"{describe_shape(blocks, num_groups, width_per_group)}. Supported: {supported}."
    )


def _blocks_per_stage(layout: SourceLayout) -> tuple[int, ...]:
    """The number of blocks of each stage; a ``ConversionError`` for a stage whose block numbers have
    gaps (every key of a block left out of the checkpoint)."""
    blocks: dict[int, set[int]] = defaultdict(set)
    for target in [*layout.convs, *(norm.target for norm in layout.norms.values())]:
        match = _TARGET_BLOCK.match(target)
        if match:
            blocks[int(match.group(1))].add(int(match.group(2)))
    for stage in range(2, 6):
        found = sorted(blocks[stage])
        missing = [f"layer{stage - 1}.{block}" for block in range(max(found, default=-1)) if block not in blocks[stage]]
        if missing:
            raise ConversionError(
                f"the checkpoint misses block{'s' if len(missing) > 1 else ''} {', '.join(missing)}: layer{stage - 1} "
                f"has blocks {', '.join(map(str, found))}, and a torchvision ResNet numbers the blocks of a stage from "
                f"0 without gaps, so the file is incomplete (no key of {'those blocks' if len(missing) > 1 else 'that block'} "
                "is in it); nothing was converted. "
                "Convert the complete checkpoint (download or save it again).")
    return tuple(len(blocks[stage]) for stage in range(2, 6))


def _conv2_grouping(layout: SourceLayout) -> tuple[int, int]:
    """(groups, channels per group) of the first block's 3x3 conv, read off its weight's shape."""
    weight = layout.convs.get("res2.0.conv2.weight")
    if weight is None or weight.dim() != 4 or weight.shape[1] == 0:
        raise ConversionError(
            "layer1.0.conv2.weight is missing or not a 4-d conv weight, so ResNet cannot be told "
            "from ResNeXt. The checkpoint is incomplete or not a torchvision-layout ResNet."
        )
    out_channels, width_per_group = int(weight.shape[0]), int(weight.shape[1])
    return out_channels // width_per_group, width_per_group


def check_requested_names(arch: str | None, gw_positions: str | None) -> None:
    """Raise for an unknown architecture or a malformed GW_POSITIONS string (None: no request)."""
    if arch is not None and arch not in ARCHITECTURES:
        raise ConversionError(
            f"unknown architecture {arch!r}: choose one of {', '.join(ARCHITECTURES)}."
        )
    if gw_positions is not None:
        _parse_requested_gw_positions(gw_positions)


def check_requested_architecture(inferred: Architecture, requested: str | None) -> None:
    """Raise unless ``requested`` (an ``ARCHITECTURES`` name, or None for any) is ``inferred``."""
    if requested is None or requested == inferred.name:
        return
    raise ConversionError(
        f"the checkpoint does not fit --arch {requested}: it is {inferred.describe()}, while "
        f"{ARCHITECTURES[requested].describe()}. Pass --arch {inferred.name} (and the matching "
        "MODEL.RESNETS config), or convert the checkpoint you meant."
    )


# ---- the GW positions of a checkpoint -------------------------------------------------------


def is_gn_style(layout: SourceLayout) -> bool:
    """No norm has running statistics (e.g. an ImageNet GN ResNet): nothing there is BN."""
    return all(norm.affine_only for norm in layout.norms.values())


def infer_gw_positions(layout: SourceLayout) -> frozenset[str]:
    """The positions (gwdet tokens S1, B1, B2, B3) whose norms are GW, i.e. affine-only.

    A GN-style checkpoint has none. Raises when GW sits at the shortcuts, or at a block
    position in some blocks but not in others: gwdet's backbone has neither.
    """
    if is_gn_style(layout):
        return frozenset()
    positions = set()
    for position in NORM_POSITIONS:
        norms = [norm for norm in layout.norms.values() if norm.position == position]
        gw = [norm.source for norm in norms if norm.affine_only]
        bn = [norm.source for norm in norms if not norm.affine_only]
        if gw and position == SHORTCUT:
            raise ConversionError(
                f"norms without running statistics at shortcuts ({preview_names(gw, 3)}) "
                "while other norms are BN: gwdet's backbone keeps BN at shortcuts, so no model of it computes "
                "this checkpoint's function; nothing was converted. Convert a ResNet with GW (gwdet.norm('GW') or "
                "an authors' GW layer) at block positions only and BN at the shortcuts, or one with BN everywhere."
            )
        if gw and bn:
            raise ConversionError(
                f"inconsistent GW positions: {len(gw)} of {len(norms)} norms at {position} are GW "
                f"(e.g. {gw[0]}), the others BN (e.g. {bn[0]}). gwdet puts the same norm at a "
                "position in every block, so no GW_POSITIONS fits this checkpoint."
            )
        if gw:
            positions.add(position)
    return frozenset(positions)


# what becomes of a GroupNorm among BN norms: gwdet's backbone has no place for it
_GROUP_NORM_UNMAPPED = ("gwdet's conversion does not map it: its backbone has GW at the GW positions and one norm "
                        "everywhere else (MODEL.RESNETS.NORM, BN for a checkpoint with running statistics), so no "
                        "config computes GroupNorm at one position alone")


def undetermined_gw_norms(layout: SourceLayout, positions: frozenset[str]) -> list[SourceNorm]:
    """The norms at ``positions`` (inferred GW positions) whose state does not show GW
    (:attr:`~gwdet.convert.torchvision_keys.SourceNorm.shows_gw`): no running statistics, no gwdet
    GW record, an affine of ``[C]`` values, as torch's GroupNorm keeps it."""
    return [norm for norm in layout.norms.values()
            if norm.position in positions and norm.affine_only and not norm.shows_gw]


def check_gw_told_from_group_norm(layout: SourceLayout, positions: frozenset[str], requested: str | None) -> None:
    """A ``ConversionError`` when GW positions were inferred (``requested`` is None) from norms whose
    weights cannot tell GW from GroupNorm (:func:`undetermined_gw_norms`), naming their positions,
    keys, and the ``--gw-positions`` that converts them as GW; with ``requested`` the caller has
    said what they are (:func:`check_requested_gw_positions` checks it against the checkpoint)."""
    undetermined = undetermined_gw_norms(layout, positions)
    if requested is not None or not undetermined:
        return
    where = "; ".join(
        f"{position} ({preview_names([norm.source for norm in undetermined if norm.position == position], 3)})"
        for position in POSITIONS if any(norm.position == position for norm in undetermined))
    keys = sorted(f"{norm.source}.{leaf}" for norm in undetermined for leaf in norm.tensors)
    spec = format_gw_positions(positions)
    raise ConversionError(
        f"the norms at {where} have no running statistics, carry no gwdet GW layer's record of its settings "
        f"({RECORD_LEAF}) and keep their weight and bias as [C] values ({preview_names(keys, 4)}), as torch's "
        "GroupNorm does (gwdet's GW layers record their settings; the GW authors' keep their affine as [1, C, 1, 1]): "
        "the weights cannot tell GW from GroupNorm (or another norm without running statistics) there, so the GW "
        f"positions were not inferred and nothing was converted. If the source model has GW layers there (as its model "
        f"definition shows), pass --gw-positions {spec!r} (in Python: gw_positions={spec!r}) and set "
        f"MODEL.RESNETS.GW_POSITIONS to the same. If it has GroupNorm there, {_GROUP_NORM_UNMAPPED}: convert a "
        "checkpoint with BN or GW there.")


def check_requested_gw_positions(inferred: frozenset[str], requested: str | None, gn_style: bool = False,
                                 undetermined: frozenset[str] = frozenset()) -> None:
    """Raise unless ``requested`` (a GW_POSITIONS string, or None for any) names ``inferred``; a
    ``gn_style`` checkpoint's norms have no running statistics anywhere (GN's); at the
    ``undetermined`` positions the norms without running statistics may as well be GroupNorm
    (:func:`undetermined_gw_norms`), and the refusal says so."""
    if requested is None:
        return
    wanted = _parse_requested_gw_positions(requested)
    if wanted == inferred:
        return
    undetermined = undetermined & inferred
    consequences = []
    if wanted - inferred:
        consequences.append(
            f"{'GN parameters' if gn_style else 'BN statistics'} would go into GW layers at "
            f"{_quoted(wanted - inferred)}"
        )
    if inferred - wanted:
        what = "the parameters of norms without running statistics" if undetermined else "GW parameters"
        consequences.append(f"{what} would go into BN layers at {_quoted(inferred - wanted)}")
    if undetermined:
        which = ("GW or GroupNorm: they" if undetermined == inferred else
                 f"GW; at {_quoted(undetermined)} perhaps GroupNorm: there they")
        has = (f"norms without running statistics at {_quoted(inferred)} ({which} carry no gwdet GW record and keep "
               "their affine as [C], as GroupNorm does, so the weights cannot tell which)")
        if_gw = (f" if the norms at {_quoted(undetermined)} are GW layers (if they are GroupNorm, "
                 f"{_GROUP_NORM_UNMAPPED})")
    else:
        has, if_gw = f"GW (norms without running statistics) at {_quoted(inferred)}", ""
    raise ConversionError(
        f"the checkpoint does not fit --gw-positions {requested!r}: it has {has}, so {' and '.join(consequences)}. "
        f"Pass --gw-positions '{format_gw_positions(inferred)}' (in Python: gw_positions=...) and set "
        f"MODEL.RESNETS.GW_POSITIONS to the same{if_gw}, or convert the checkpoint you meant."
    )


def _parse_requested_gw_positions(requested: str) -> frozenset[str]:
    try:
        return parse_gw_positions(requested)
    except ValueError as error:
        message = str(error).replace("MODEL.RESNETS.GW_POSITIONS=", "--gw-positions ").replace(
            "MODEL.RESNETS.GW_POSITIONS must", "--gw-positions (gw_positions= in Python) must")
        raise ConversionError(message) from None


def _quoted(positions: frozenset[str]) -> str:
    return repr(format_gw_positions(positions)) if positions else "no position"
