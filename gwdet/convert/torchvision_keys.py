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
statistics (GW, or GN in a GN-style checkpoint). A BN with running statistics and no ``weight``/``bias``
(``BatchNorm2d(affine=False)``) normalizes exactly as one with weight 1 and bias 0, which it is given
(detectron2's BN and FrozenBN always have an affine). Such a norm shows itself to be GW by a gwdet
``GroupWhitening`` layer's record of its settings (``_extra_state``) or by an affine kept in a
broadcasting shape (the GW authors' modules keep theirs as ``[1, C, 1, 1]``); one with neither
keeps its affine as ``[C]``, as torch's ``GroupNorm`` does, and its weights cannot tell which it is.
What the norms say about the architecture is :mod:`gwdet.convert.architecture`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch

from gwdet.checkpoint.resilient import torchvision_detection_hint
from gwdet.convert.loading import DATA_PARALLEL_PREFIX, ConversionError, preview_names
from gwdet.layers.settings_state import decode_settings
from gwdet.positions import POSITIONS

BN_LEAVES = frozenset({"weight", "bias", "running_mean", "running_var"})
AFFINE_LEAVES = frozenset({"weight", "bias"})
STATISTICS_LEAVES = BN_LEAVES - AFFINE_LEAVES  # all that a BatchNorm2d(affine=False) holds
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
    identity_affine: bool = False  # a BatchNorm2d(affine=False): given weight 1 and bias 0, the same function

    @property
    def affine_only(self) -> bool:
        """No running statistics: GW (or GN in a GN-style checkpoint), not BN."""
        return set(self.tensors) == AFFINE_LEAVES

    @property
    def shows_gw(self) -> bool:
        """Its state shows a GW layer rather than a GroupNorm: a gwdet ``GroupWhitening`` layer's record
        of its settings, or an affine kept in a broadcasting shape (the GW authors' ``[1, C, 1, 1]``,
        which torch's ``GroupNorm``, keeping ``[C]``, never has)."""
        settings = decode_settings(self.record) if self.record is not None else None
        if settings is not None and settings["layer"] == GW_LAYER:
            return True
        return bool(self.tensors) and all(value.dim() > 1 for value in self.tensors.values())


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

    A norm with running statistics and no affine (``BatchNorm2d(affine=False)``) is given weight 1
    and bias 0 (:func:`give_identity_affine`).

    Raises:
        ConversionError: the keys are not a torchvision ResNet's, or a norm is neither a complete
            BN, an affine-free BN nor an affine-only layer.
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
    check_gwdet_norm_records(layout)
    _check_norms_complete(layout)
    give_identity_affine(layout)
    return layout


def give_identity_affine(layout: SourceLayout) -> None:
    """Give each norm of ``layout`` that holds running statistics and no weight or bias (a
    ``BatchNorm2d(affine=False)``) a weight of ones and a bias of zeros, one per channel of its
    ``running_mean``, and mark it :attr:`SourceNorm.identity_affine`. Such a BN computes
    ``(x - mean) / sqrt(var + eps)``, and detectron2's BN and FrozenBN compute that times the weight
    plus the bias: with weight 1 and bias 0, the same function."""
    for norm in layout.norms.values():
        if set(norm.tensors) == STATISTICS_LEAVES:
            mean = norm.tensors["running_mean"]
            channels = (mean.numel(),) if mean.dim() > 1 else mean.shape  # one per channel, as the [C] it becomes
            norm.tensors["weight"] = torch.ones(channels, dtype=torch.float32)
            norm.tensors["bias"] = torch.zeros(channels, dtype=torch.float32)
            norm.identity_affine = True


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
        prefixed = [name for name in names if name.startswith(DATA_PARALLEL_PREFIX)]
        if prefixed:  # only keys given in memory: read_source_state_dict removes these prefixes or refuses a mix
            removed, hint = "", _data_parallel_prefix_hint(names, prefixed)
        else:
            removed = f" (after removing {DATA_PARALLEL_PREFIX!r} prefixes)"
        raise ConversionError(
            "not a torchvision-layout ResNet/ResNeXt: expected keys like 'conv1.weight', "
            "'bn1.running_mean', 'layer1.0.conv2.weight', 'layer1.0.downsample.0.weight'"
            f"{removed}, found {preview_names(names)}.{hint}"
        )


def _data_parallel_prefix_hint(names: list[str], prefixed: list[str]) -> str:
    """For keys of which ``prefixed`` start with ``module.`` (the prefix (Distributed)DataParallel adds),
    given to :func:`~gwdet.convert.convert_state_dict`, which removes no prefix: that they carry it,
    and how to give them without it (or, for a mix of prefixed and bare keys, one model's keys)."""
    if len(prefixed) < len(names):
        bare = [name for name in names if not name.startswith(DATA_PARALLEL_PREFIX)]
        return (f" {len(prefixed)} of the {len(names)} keys start with {DATA_PARALLEL_PREFIX!r} (the prefix "
                f"(Distributed)DataParallel adds), the others do not: {preview_names(prefixed, 3)} beside "
                f"{preview_names(bare, 3)}. These are the names of a wrapped and an unwrapped model mixed; give the "
                "state dict of one model (model.module.state_dict() of a wrapped one).")
    prefix = DATA_PARALLEL_PREFIX
    while all(name.startswith(prefix + DATA_PARALLEL_PREFIX) for name in names):
        prefix += DATA_PARALLEL_PREFIX
    unwrapped = [name[len(prefix):] for name in names]
    rest = torchvision_detection_hint(unwrapped) or _prefix_hint(unwrapped)
    wrappings = prefix.count(DATA_PARALLEL_PREFIX)
    adds = " (once per wrapping)" if wrappings > 1 else ""
    return (f" Every key starts with {prefix!r}, the prefix (Distributed)DataParallel adds{adds}, which convert_state_dict "
            "leaves on the keys it is given (read_source_state_dict removes it when it reads a file): give the keys "
            f"without it, SourceStateDict(tensors={{key.removeprefix({prefix!r}): value for key, value in "
            f"state_dict.items()}}, wrapping='bare state_dict', stripped_prefix={prefix!r}), or torch.save the state "
            f"dict and convert the file with read_source_state_dict or tools/convert_pretrained.py.{rest}")


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


def layout_prefixes(names: list[str]) -> list[str]:
    """The prefixes (``"backbone."``) after which some of ``names`` are a torchvision ResNet's (its
    ``conv1.weight`` and ``layer1.0.conv1.weight`` among them), whether or not other names sit beside
    them (a classifier head under ``"head."``, as in mmpretrain's checkpoints), in the order found."""
    known = set(names)
    return list(dict.fromkeys(name[:-len("conv1.weight")] for name in names if name.endswith(".conv1.weight")
                              and f"{name[:-len('conv1.weight')]}layer1.0.conv1.weight" in known))


# the prefix of the ResNet in OpenMMLab's (mmpretrain's, formerly mmcls') checkpoints, its neck and head beside it
MMPRETRAIN_PREFIX = "backbone."


def _prefix_hint(names: list[str]) -> str:
    """For ``names`` that are a torchvision ResNet's under one prefix (:func:`shared_layout_prefix`):
    the prefix, and the one line that saves the weights without it. For ``names`` of which only some
    are a torchvision ResNet's under a prefix (:func:`layout_prefixes`), the others another part of
    the network (a head, a neck): the prefix, those others, and the one line that saves the ResNet's
    weights alone without it. Else ``""``."""
    prefix = shared_layout_prefix(names)
    if prefix is not None:
        return (f" Every key is under the prefix {prefix!r}, before a torchvision "
                f"layout: save the weights without it ({{key.removeprefix({prefix!r}): value for "
                "key, value in weights.items()}) and convert that file with tools/convert_pretrained.py.")
    prefixes = layout_prefixes(names)
    if not prefixes:
        return ""
    prefix = prefixes[0]
    inside = [name for name in names if name.startswith(prefix)]
    others = [name for name in names if not name.startswith(prefix)]
    line = (f"{{key.removeprefix({prefix!r}): value for key, value in weights.items() if "
            f"key.startswith({prefix!r})}}")
    if len(prefixes) > 1:
        return (f" The keys hold {len(prefixes)} torchvision-layout ResNets, under the prefixes "
                f"{preview_names(prefixes, 4)}: save the one you mean alone without its prefix (for {prefix!r}: "
                f"{line}) and convert that file with tools/convert_pretrained.py.")
    openmmlab = " (the layout of mmpretrain's and mmcls' checkpoints)" if prefix == MMPRETRAIN_PREFIX else ""
    return (f" {len(inside)} of the {len(names)} keys are a torchvision ResNet's under the prefix {prefix!r}, beside "
            f"{len(others)} of another part of the network ({preview_names(others, 3)}){openmmlab}: save the "
            f"ResNet's weights alone without the prefix ({line}) and convert that file with "
            "tools/convert_pretrained.py.")


# the layer class whose recorded settings the converter carries: GW at GW_POSITIONS in a BN ResNet
GW_LAYER = "GroupWhitening"
# a batch whitening layer's whitening matrix (gwdet's BatchWhitening), which no BN, GN or GW layer has
WHITENING_LEAF = "running_whitening"
_CONVERTED = ("the converter converts a ResNet whose norms are BN (with gwdet GW layers at block positions S1, B1, "
              "B2, B3, or none) or GN, and the config it prints builds BN, GW and GN layers only")


def _shown_settings(settings: dict) -> str:
    return ", ".join(f"{name}={value!r}" for name, value in settings.items() if name != "layer")


def check_gwdet_norm_records(layout: SourceLayout) -> None:
    """A ``ConversionError`` for norms whose recorded settings (a gwdet layer's ``_extra_state``) name a
    layer the converted model would not have there: any gwdet layer other than GW (BGN, BW, ...), or GW
    in a checkpoint whose norms all lack running statistics (GW at the shortcuts too), which the
    converter would report as GN. The error names the layer, how many norms are such and one's
    settings."""
    recorded = {source: decode_settings(norm.record) for source, norm in layout.norms.items()
                if norm.record is not None}
    found = {source: settings for source, settings in recorded.items() if settings is not None}
    others = {source: settings for source, settings in found.items() if settings["layer"] != GW_LAYER}
    if others:
        source, settings = next(iter(others.items()))
        layers = sorted({settings["layer"] for settings in others.values()})
        raise ConversionError(
            f"{len(others)} of the {len(layout.norms)} norms are gwdet {' and '.join(layers)} layers, by the settings "
            f"they recorded (e.g. {source}: {settings['layer']}({_shown_settings(settings)})): {_CONVERTED}, which "
            "compute another function than these weights were trained as, so nothing was converted. Convert a "
            "ResNet trained with BN or GN norms (e.g. torchvision's resnet50(weights='IMAGENET1K_V1')), or one "
            "with gwdet.norm('GW') or gwdet.norm('GW_ZCA') at block positions and BN elsewhere.")
    gw = [source for source, settings in found.items() if settings["layer"] == GW_LAYER]
    if gw and all(norm.affine_only for norm in layout.norms.values()):
        settings = found[gw[0]]
        shortcuts = [norm.source for norm in layout.norms.values() if norm.position == SHORTCUT]
        raise ConversionError(
            f"no norm of the checkpoint has running statistics, and {len(gw)} of the {len(layout.norms)} are gwdet "
            f"{GW_LAYER} layers, by the settings they recorded (e.g. {gw[0]}: {GW_LAYER}({_shown_settings(settings)}))"
            f"{', the shortcuts among them (' + preview_names(shortcuts, 2) + ')' if set(shortcuts) & set(gw) else ''}"
            f": {_CONVERTED}; gwdet's backbone keeps BN at the shortcuts, and as a GN-style model the GW weights would "
            "load into GroupNorm layers, another function, so nothing was converted. Convert a ResNet with "
            "gwdet.norm('GW') or gwdet.norm('GW_ZCA') at block positions only and BN elsewhere (the shortcuts "
            "included), or one with GN norms.")


def _check_norms_complete(layout: SourceLayout) -> None:
    for norm in layout.norms.values():
        if f"{norm.source}.{WHITENING_LEAF}" in layout.unexpected:
            raise ConversionError(
                f"norm {norm.source} has {sorted([*norm.tensors, WHITENING_LEAF])}: a batch whitening (BW) layer's "
                f"state, whose {WHITENING_LEAF} is the whitening matrix its running statistics are; {_CONVERTED}, "
                "so a BW model's weights are not converted (as BN they would lose the whitening). Convert a ResNet "
                "trained with BN or GN norms (e.g. torchvision's resnet50(weights='IMAGENET1K_V1')), or one with "
                "gwdet.norm('GW') or gwdet.norm('GW_ZCA') at block positions and BN elsewhere.")
        if set(norm.tensors) not in (BN_LEAVES, AFFINE_LEAVES, STATISTICS_LEAVES):
            raise ConversionError(
                f"norm {norm.source} has {sorted(norm.tensors)}: neither a BatchNorm "
                f"({sorted(BN_LEAVES)}, or {sorted(STATISTICS_LEAVES)} without an affine) nor a GW layer "
                f"({sorted(AFFINE_LEAVES)}). The checkpoint is incomplete or not a torchvision-layout ResNet."
            )
