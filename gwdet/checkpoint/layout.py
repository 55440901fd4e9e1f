"""torchvision's ResNet/ResNeXt key layout, and its mapping onto detectron2's ResNet names.

Source modules (torchvision) and their detectron2 counterparts (gwdet's backbone, without the
``backbone.bottom_up.`` prefix that detectron2's matching heuristics add when loading)::

    conv1                      -> stem.conv1
    bn1                        -> stem.conv1.norm            position S1
    layer{i}.{j}.conv{k}       -> res{i+1}.{j}.conv{k}
    layer{i}.{j}.bn{k}         -> res{i+1}.{j}.conv{k}.norm  position B{k}
    layer{i}.{j}.downsample.0  -> res{i+1}.{j}.shortcut
    layer{i}.{j}.downsample.1  -> res{i+1}.{j}.shortcut.norm
    fc                         -> dropped (the ImageNet classifier)

A norm with ``running_mean``/``running_var`` is a BN; one with only ``weight``/``bias`` has no batch
statistics and is taken for GW (the GW authors' modules keep their affine as ``[1, C, 1, 1]``).
When no norm at all has statistics, the checkpoint is GN-style (e.g. an ImageNet GN ResNet).
"""
from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np
import torch

from gwdet.checkpoint.loading import ConversionError, preview_names
from gwdet.positions import POSITIONS, format_gw_positions, parse_gw_positions

BN_LEAVES = frozenset({"weight", "bias", "running_mean", "running_var"})
AFFINE_LEAVES = frozenset({"weight", "bias"})
DROPPED_NORM_LEAF = "num_batches_tracked"
CLASSIFIER_MODULE = "fc"
SHORTCUT = "shortcut"
NORM_POSITIONS = (*POSITIONS, SHORTCUT)
CONV = "conv"

STEM_CHANNELS = 64
RES2_OUT_CHANNELS = 256

_BLOCK_MODULE = re.compile(r"layer([1-4])\.(\d+)\.(conv[123]|bn[123]|downsample\.[01])")
_TARGET_BLOCK = re.compile(r"res([2-5])\.(\d+)\.")


@dataclass(frozen=True)
class Architecture:
    """A bottleneck ResNet/ResNeXt as detectron2's ``MODEL.RESNETS`` describes it."""

    name: str
    depth: int
    blocks_per_stage: tuple[int, int, int, int]
    num_groups: int
    width_per_group: int

    def describe(self) -> str:
        """``"R-50 (blocks per stage [3, 4, 6, 3], conv2 1 group x 64 channels)"``."""
        shape = _describe_shape(self.blocks_per_stage, self.num_groups, self.width_per_group)
        return f"{self.name} ({shape})"


ARCHITECTURES = {
    arch.name: arch
    for arch in (
        Architecture("R-50", 50, (3, 4, 6, 3), 1, 64),
        Architecture("R-101", 101, (3, 4, 23, 3), 1, 64),
        Architecture("X-50-32x4d", 50, (3, 4, 6, 3), 32, 4),
        Architecture("X-101-32x8d", 101, (3, 4, 23, 3), 32, 8),
    )
}


@dataclass
class SourceNorm:
    """One norm module of the source checkpoint, ``num_batches_tracked`` left out."""

    source: str  # torchvision module, e.g. "layer1.0.bn2"
    target: str  # detectron2 module, e.g. "res2.0.conv2.norm"
    position: str  # one of NORM_POSITIONS
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def affine_only(self) -> bool:
        """No running statistics: GW (or GN in a GN-style checkpoint), not BN."""
        return set(self.tensors) == AFFINE_LEAVES


@dataclass
class SourceLayout:
    """A torchvision-layout state dict, sorted into what is converted, dropped, or unknown."""

    convs: dict[str, torch.Tensor] = field(default_factory=dict)  # detectron2 key -> weight
    norms: dict[str, SourceNorm] = field(default_factory=dict)  # torchvision module -> norm
    dropped_classifier: list[str] = field(default_factory=list)
    dropped_num_batches_tracked: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)


def parse_torchvision_layout(tensors: dict[str, torch.Tensor]) -> SourceLayout:
    """Sort every key of ``tensors`` into convs, norms, dropped keys and unexpected keys.

    Raises:
        ConversionError: the keys are not a bottleneck ResNet's, or a norm is neither a complete
            BN nor an affine-only layer.
    """
    layout = SourceLayout()
    for key, value in tensors.items():
        module, _, leaf = key.rpartition(".")
        target = _detectron2_module(module)
        if module == CLASSIFIER_MODULE:
            layout.dropped_classifier.append(key)
        elif target is None:
            layout.unexpected.append(key)
        elif target[1] == CONV and leaf == "weight":
            layout.convs[f"{target[0]}.weight"] = value
        elif target[1] != CONV and leaf == DROPPED_NORM_LEAF:
            layout.dropped_num_batches_tracked.append(key)
        elif target[1] != CONV and leaf in BN_LEAVES:
            norm = layout.norms.setdefault(module, SourceNorm(module, *target))
            norm.tensors[leaf] = value
        else:  # e.g. a conv bias: torchvision's ResNet convs have none
            layout.unexpected.append(key)
    _check_bottleneck_resnet(layout, tensors)
    _check_norms_complete(layout)
    return layout


def _detectron2_module(module: str) -> tuple[str, str] | None:
    """torchvision module -> (detectron2 module, CONV or the norm's position); None if unknown."""
    if module == "conv1":
        return "stem.conv1", CONV
    if module == "bn1":
        return "stem.conv1.norm", "S1"
    match = _BLOCK_MODULE.fullmatch(module)
    if match is None:
        return None
    stage, block, part = match.groups()
    prefix = f"res{int(stage) + 1}.{block}"
    if part.startswith("conv"):
        return f"{prefix}.{part}", CONV
    if part.startswith("bn"):
        return f"{prefix}.conv{part[-1]}.norm", f"B{part[-1]}"
    if part == "downsample.0":
        return f"{prefix}.shortcut", CONV
    return f"{prefix}.shortcut.norm", SHORTCUT


def _check_bottleneck_resnet(layout: SourceLayout, tensors: dict[str, torch.Tensor]) -> None:
    if "stem.conv1.weight" not in layout.convs or "res2.0.conv1.weight" not in layout.convs:
        raise ConversionError(
            "not a torchvision-layout ResNet/ResNeXt: expected keys like 'conv1.weight', "
            "'bn1.running_mean', 'layer1.0.conv2.weight', 'layer1.0.downsample.0.weight' "
            f"(after removing 'module.' prefixes), found {preview_names(list(tensors))}."
        )
    if "res2.0.conv3.weight" not in layout.convs:
        raise ConversionError(
            "this is a basic-block ResNet (ResNet-18/34: no layer1.0.conv3). gwdet's GW "
            "positions and the supported architectures need bottleneck blocks: use a "
            f"checkpoint of {', '.join(ARCHITECTURES)}."
        )


def _check_norms_complete(layout: SourceLayout) -> None:
    for norm in layout.norms.values():
        if set(norm.tensors) not in (BN_LEAVES, AFFINE_LEAVES):
            raise ConversionError(
                f"norm {norm.source} has {sorted(norm.tensors)}: neither a BatchNorm "
                f"({sorted(BN_LEAVES)}) nor a GW layer ({sorted(AFFINE_LEAVES)}). The "
                "checkpoint is incomplete or not a torchvision-layout ResNet."
            )


# ---- architecture --------------------------------------------------------------------------


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
        f"{_describe_shape(blocks, num_groups, width_per_group)}. Supported: {supported}."
    )


def _blocks_per_stage(layout: SourceLayout) -> tuple[int, ...]:
    blocks: dict[int, set[int]] = defaultdict(set)
    for target in [*layout.convs, *(norm.target for norm in layout.norms.values())]:
        match = _TARGET_BLOCK.match(target)
        if match:
            blocks[int(match.group(1))].add(int(match.group(2)))
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


def _describe_shape(blocks: Iterable[int], num_groups: int, width_per_group: int) -> str:
    groups = f"{num_groups} group{'s' if num_groups != 1 else ''}"
    return f"blocks per stage {list(blocks)}, conv2 {groups} x {width_per_group} channels"


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


# ---- GW positions --------------------------------------------------------------------------


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
                "while other norms are BN: gwdet's backbone keeps BN at shortcuts."
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


def check_requested_gw_positions(inferred: frozenset[str], requested: str | None) -> None:
    """Raise unless ``requested`` (a GW_POSITIONS string, or None for any) names ``inferred``."""
    if requested is None:
        return
    wanted = _parse_requested_gw_positions(requested)
    if wanted == inferred:
        return
    consequences = []
    if wanted - inferred:
        consequences.append(
            f"BN statistics would go into GW layers at {_quoted(wanted - inferred)}"
        )
    if inferred - wanted:
        consequences.append(
            f"GW parameters would go into BN layers at {_quoted(inferred - wanted)}"
        )
    raise ConversionError(
        f"the checkpoint does not fit --gw-positions {requested!r}: it has GW (norms without "
        f"running statistics) at {_quoted(inferred)}, so {' and '.join(consequences)}. "
        f"Pass --gw-positions '{format_gw_positions(inferred)}' and set "
        "MODEL.RESNETS.GW_POSITIONS to the same, or convert the checkpoint you meant."
    )


def _parse_requested_gw_positions(requested: str) -> frozenset[str]:
    try:
        return parse_gw_positions(requested)
    except ValueError as error:
        message = str(error).replace("MODEL.RESNETS.GW_POSITIONS=", "--gw-positions ")
        raise ConversionError(message) from None


def _quoted(positions: frozenset[str]) -> str:
    return repr(format_gw_positions(positions)) if positions else "no position"


# ---- conversion ----------------------------------------------------------------------------


def detectron2_weights(layout: SourceLayout) -> tuple[dict[str, np.ndarray], int]:
    """detectron2-named float32 arrays of the convs and norms, and the number reshaped to [C]."""
    weights = {key: _float_array(key, value) for key, value in layout.convs.items()}
    reshaped = 0
    for norm in layout.norms.values():
        for leaf, value in norm.tensors.items():
            if norm.affine_only and _is_broadcast_affine(value):
                value = value.reshape(-1)
                reshaped += 1
            weights[f"{norm.target}.{leaf}"] = _float_array(f"{norm.source}.{leaf}", value)
    return weights, reshaped


def _is_broadcast_affine(value: torch.Tensor) -> bool:
    """The GW authors' affine layout ``[1, C, 1, 1]``."""
    return value.dim() == 4 and value.shape[0] == 1 and value.shape[2:] == (1, 1)


def _float_array(name: str, value: torch.Tensor) -> np.ndarray:
    if not value.is_floating_point():
        raise ConversionError(f"{name} has dtype {value.dtype}; weights must be floating point.")
    return value.detach().to(torch.float32).numpy()


def expected_shapes(
    arch: Architecture, affine_only_positions: frozenset[str]
) -> dict[str, tuple[int, ...]]:
    """Every key gwdet's backbone for ``arch`` loads, with its shape.

    Norms at ``affine_only_positions`` (from ``NORM_POSITIONS``) have weight and bias only; the
    others are BN with running statistics.
    """
    shapes = {"stem.conv1.weight": (STEM_CHANNELS, 3, 7, 7)}
    shapes.update(_norm_shapes("stem.conv1.norm", STEM_CHANNELS, "S1" in affine_only_positions))
    in_channels = STEM_CHANNELS
    for stage, num_blocks in enumerate(arch.blocks_per_stage):
        out_channels = RES2_OUT_CHANNELS * 2**stage
        width = arch.num_groups * arch.width_per_group * 2**stage
        for block in range(num_blocks):
            convs = [
                ("conv1", "B1", (width, in_channels, 1, 1)),
                ("conv2", "B2", (width, width // arch.num_groups, 3, 3)),
                ("conv3", "B3", (out_channels, width, 1, 1)),
            ]
            if block == 0:
                convs.append(("shortcut", SHORTCUT, (out_channels, in_channels, 1, 1)))
            for conv, position, shape in convs:
                module = f"res{stage + 2}.{block}.{conv}"
                shapes[f"{module}.weight"] = shape
                affine_only = position in affine_only_positions
                shapes.update(_norm_shapes(f"{module}.norm", shape[0], affine_only))
            in_channels = out_channels
    return shapes


def _norm_shapes(module: str, channels: int, affine_only: bool) -> dict[str, tuple[int, ...]]:
    leaves = AFFINE_LEAVES if affine_only else BN_LEAVES
    return {f"{module}.{leaf}": (channels,) for leaf in sorted(leaves)}


def check_fits_architecture(
    weights: dict[str, np.ndarray], expected: dict[str, tuple[int, ...]], arch: Architecture
) -> None:
    """Raise naming the missing, surplus and mis-shaped keys unless ``weights`` is ``expected``."""
    missing = [key for key in expected if key not in weights]
    surplus = [key for key in weights if key not in expected]
    misshaped = [
        f"{key} {list(weights[key].shape)} (needs {list(shape)})"
        for key, shape in expected.items()
        if key in weights and tuple(weights[key].shape) != shape
    ]
    findings = (("missing", missing), ("surplus", surplus), ("with a wrong shape", misshaped))
    problems = [f"{len(keys)} {what}: {preview_names(keys, 4)}" for what, keys in findings if keys]
    if problems:
        raise ConversionError(
            f"the checkpoint does not fit {arch.describe()} (keys in detectron2's names): "
            f"{'; '.join(problems)}. The file is incomplete or of another architecture."
        )
