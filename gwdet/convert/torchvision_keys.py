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
statistics (GW, or GN in a GN-style checkpoint; the GW authors' modules keep their affine as
``[1, C, 1, 1]``). What the norms say about the architecture is :mod:`gwdet.convert.architecture`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch

from gwdet.checkpoint.resilient import torchvision_detection_hint
from gwdet.convert.loading import ConversionError, preview_names
from gwdet.positions import POSITIONS

BN_LEAVES = frozenset({"weight", "bias", "running_mean", "running_var"})
AFFINE_LEAVES = frozenset({"weight", "bias"})
DROPPED_NORM_LEAF = "num_batches_tracked"
RECORD_LEAF = "_extra_state"  # the settings a gwdet norm layer records in its state (gwdet.layers.settings_state)
CLASSIFIER_MODULE = "fc"
SHORTCUT = "shortcut"
NORM_POSITIONS = (*POSITIONS, SHORTCUT)
CONV = "conv"

_BLOCK_MODULE = re.compile(r"layer([1-4])\.(\d+)\.(conv[123]|bn[123]|downsample\.[01])")
# the convs of a deep stem (timm's resnet50d, ResNet-C/D): conv1.0, conv1.3, conv1.6 in a Sequential
_DEEP_STEM_CONV = re.compile(r"conv1\.(\d+)\.weight")


@dataclass
class SourceNorm:
    """One norm module of the source checkpoint, ``num_batches_tracked`` left out."""

    source: str  # torchvision module, e.g. "layer1.0.bn2"
    target: str  # detectron2 module, e.g. "res2.0.conv2.norm"
    position: str  # one of NORM_POSITIONS
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    record: torch.Tensor | None = None  # a gwdet layer's recorded settings, carried into the converted weights

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
        ConversionError: the keys are not a torchvision ResNet's, or a norm is neither a complete
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
        elif target[1] != CONV and leaf == RECORD_LEAF:
            layout.norms.setdefault(module, SourceNorm(module, *target)).record = value
        elif target[1] != CONV and leaf in BN_LEAVES:
            norm = layout.norms.setdefault(module, SourceNorm(module, *target))
            norm.tensors[leaf] = value
        else:  # e.g. a conv bias: torchvision's ResNet convs have none
            layout.unexpected.append(key)
    _check_resnet_keys(layout, tensors)
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


def _check_resnet_keys(layout: SourceLayout, tensors: dict[str, torch.Tensor]) -> None:
    if "stem.conv1.weight" not in layout.convs or "res2.0.conv1.weight" not in layout.convs:
        names = list(tensors)
        _check_single_stem_conv(tensors)
        if any(name.startswith(("backbone.bottom_up.", "backbone.res", "backbone.stem.")) for name in names):
            hint = (" Those are a detectron2 model's weights, which need no conversion: give the file as MODEL.WEIGHTS "
                    "(train.init_checkpoint) directly.")
        elif any(name.startswith("_orig_mod.") or "._orig_mod." in name for name in names):
            hint = (" Those are the names of a torch.compile'd model's weights: save the uncompiled module's "
                    "(model._orig_mod.state_dict()) and convert that file.")
        else:
            hint = torchvision_detection_hint(names) or _prefix_hint(names)
        raise ConversionError(
            "not a torchvision-layout ResNet/ResNeXt: expected keys like 'conv1.weight', "
            "'bn1.running_mean', 'layer1.0.conv2.weight', 'layer1.0.downsample.0.weight' "
            f"(after removing 'module.' prefixes), found {preview_names(names)}.{hint}"
        )


def _check_single_stem_conv(tensors: dict[str, torch.Tensor]) -> None:
    """A ``ConversionError`` for a deep stem in place of torchvision's ``conv1``: several stem convs
    (``conv1.0.weight``, ``conv1.3.weight``, ...; timm's resnet50d and other ResNet-C/D models),
    which gwdet's backbone (detectron2's ResNet, one 7x7 stem conv) has no place for."""
    if "conv1.weight" in tensors:
        return
    stem = sorted((name for name, value in tensors.items() if _DEEP_STEM_CONV.fullmatch(name) and value.dim() == 4),
                  key=lambda name: int(name.split(".")[1]))
    if len(stem) < 2:
        return
    shapes = ", ".join(f"{name} {'x'.join(map(str, tensors[name].shape))}" for name in stem)
    raise ConversionError(
        f"conv1.weight is missing, and {len(stem)} stem convs stand in its place ({shapes}): a deep stem, as "
        "timm's resnet50d and other ResNet-C/D models have. gwdet's backbone (detectron2's ResNet) has a single "
        "7x7 stem conv, so these weights cannot be converted into it. Convert a torchvision-layout ResNet/ResNeXt "
        "(one 7x7 conv1, e.g. torchvision's resnet50(weights='IMAGENET1K_V1')) instead.")


def shared_layout_prefix(names: list[str]) -> str | None:
    """The prefix (``"encoder."``) that every one of ``names`` starts with, and after which they are a
    torchvision ResNet's (its ``conv1.weight`` and ``layer1.0.conv1.weight`` among them), else None."""
    known = set(names)
    for name in names:
        if name.endswith(".conv1.weight"):
            prefix = name[:-len("conv1.weight")]
            if f"{prefix}layer1.0.conv1.weight" in known and all(other.startswith(prefix) for other in names):
                return prefix
    return None


def _prefix_hint(names: list[str]) -> str:
    """For ``names`` that are a torchvision ResNet's under one prefix (:func:`shared_layout_prefix`):
    the prefix, and the one line that saves the weights without it; else ``""``."""
    prefix = shared_layout_prefix(names)
    if prefix is None:
        return ""
    return (f" Every key is under the prefix {prefix!r}, before a torchvision "
            f"layout: save the weights without it ({{key.removeprefix({prefix!r}): value for "
            "key, value in weights.items()}) and convert that file with tools/convert_pretrained.py.")


def _check_norms_complete(layout: SourceLayout) -> None:
    for norm in layout.norms.values():
        if set(norm.tensors) not in (BN_LEAVES, AFFINE_LEAVES):
            raise ConversionError(
                f"norm {norm.source} has {sorted(norm.tensors)}: neither a BatchNorm "
                f"({sorted(BN_LEAVES)}) nor a GW layer ({sorted(AFFINE_LEAVES)}). The "
                "checkpoint is incomplete or not a torchvision-layout ResNet."
            )
