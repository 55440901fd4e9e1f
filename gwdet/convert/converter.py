"""Convert a torchvision-layout ImageNet ResNet/ResNeXt checkpoint into a detectron2 ``.pkl``.

The file is read (:mod:`~gwdet.convert.loading`), its names mapped onto detectron2's ResNet names
(:mod:`~gwdet.convert.torchvision_keys`), its architecture and GW positions inferred and, when the
caller names them, checked (:mod:`~gwdet.convert.architecture`), and every tensor checked against
the backbone that will load it (:mod:`~gwdet.convert.target_backbone`); this module assembles the
output (:mod:`~gwdet.checkpoint.converted_weights`), which ``DetectionCheckpointer`` maps onto
``backbone.bottom_up.*``. The classifier (``fc``) and ``num_batches_tracked`` are dropped; other
keys outside torchvision's layout fail the conversion unless ``allow_unexpected=True``. A BN without
an affine (``BatchNorm2d(affine=False)``) is written with weight 1 and bias 0, the same function. Converted
weights expect images as torchvision feeds them (:meth:`ConversionReport.config` lists the keys).
"""
from __future__ import annotations

import logging
import os
import pickle
import re
from dataclasses import dataclass, field
from typing import Mapping, Sequence, cast
from urllib.parse import urlsplit

import numpy as np
import torch


from gwdet.errors import GwdetTypeError
from gwdet.utils.atomic import OutputExistsError, file_version, remove_stale_partials, write_atomically
from gwdet.utils.cli_errors import file_url_path, unexpanded_variable_problem
from gwdet.checkpoint.integrity import with_checksums
from gwdet.convert.architecture import (
    ARCHITECTURES,
    BOTTLENECK_MODULES,
    check_bottleneck_blocks,
    check_gw_told_from_group_norm,
    check_requested_architecture,
    check_requested_gw_positions,
    check_requested_names,
    infer_architecture,
    infer_gw_positions,
    is_gn_style,
    stray_blocks,
    undetermined_gw_norms,
)
from gwdet.convert.loading import (
    ConversionError,
    SourceStateDict,
    broken_link,
    local_input_path,
    preview_names,
    read_source_state_dict,
)
from gwdet.checkpoint.converted_weights import (
    ARCH_FIELD,
    AUTHOR_KEY,
    GW_POSITIONS_FIELD,
    NORM_FIELD,
    MATCHING_HEURISTICS_KEY,
    METADATA_KEY,
    WEIGHTS_KEY,
    conversion_author,
    conversion_metadata,
    malformed_record_field,
)
from gwdet.convert.target_backbone import check_fits_architecture, expected_shapes, loading_config
from gwdet.convert.torchvision_keys import RECORD_LEAF, SourceLayout, parse_torchvision_layout
from gwdet.layers import GroupWhitening
from gwdet.layers.common import check_flag
from gwdet.layers.settings_state import SETTINGS_BYTES, decode_settings
from gwdet.norms import norm_record
from gwdet.positions import POSITIONS, format_gw_positions, parse_gw_positions

OUTPUT_SUFFIX = ".pkl"
logger = logging.getLogger(__name__)
UNEXPECTED_FLAG = "--allow-unexpected"


@dataclass
class ConversionReport:
    """What a conversion found, converted, dropped and inferred."""

    source: str
    wrapping: str  # where the state dict sat in the file
    stripped_prefix: str  # "module." when DataParallel prefixes were removed, else ""
    arch: str  # an ARCHITECTURES name
    arch_requested: str | None
    gw_positions: str  # gwdet's GW_POSITIONS spelling; "" means no GW
    gw_positions_requested: str | None
    gn_style: bool  # no norm has running statistics (e.g. an ImageNet GN model)
    converted_convs: int
    converted_bn_norms: int
    converted_affine_norms: int  # GW norms (GN norms when gn_style)
    reshaped_affine: int  # GW weights/biases of C values in one axis ([1, C, 1, 1], [C, 1, 1], ...) reshaped to [C]
    converted_keys: int
    dropped_classifier: list[str]
    dropped_num_batches_tracked: int
    unexpected: list[str]  # dropped because allow_unexpected was set
    settings_records: int = 0  # gwdet norm layers' recorded settings, carried for the loading layers to check
    recorded_config: dict[str, object] = field(default_factory=dict)  # what those settings give (MODEL.GW.*)
    reshaped_from: list[str] = field(default_factory=list)  # the shapes reshaped to [C], e.g. "[1,C,1,1]"
    # BNs with running statistics and no affine (BatchNorm2d(affine=False)), written with weight 1 and bias 0
    identity_affine: list[str] = field(default_factory=list)
    # BNs whose weight/bias were kept as [1, C, 1, 1] (or another broadcasting shape): reshaped to [C], the same values
    reshaped_bn: list[str] = field(default_factory=list)
    # BNs whose running_mean/running_var were kept as [1, C, 1, 1] (or another broadcasting shape): reshaped to [C]
    reshaped_bn_statistics: list[str] = field(default_factory=list)
    output: str | None = None

    def format(self) -> str:
        """The report as printed by ``tools/convert_pretrained.py``."""
        affine_kind = "GN" if self.gn_style else "GW"
        reshaped = ""
        if self.reshaped_affine:
            shapes = " and ".join(self.reshaped_from or ["[1,C,1,1]"])
            reshaped = f"; {self.reshaped_affine} reshaped {shapes} -> [C]"
        unexpected = (
            f"{len(self.unexpected)} dropped ({UNEXPECTED_FLAG}): {preview_names(self.unexpected)}"
            if self.unexpected
            else "none"
        )
        prefix = f", {self.stripped_prefix!r} prefix removed" if self.stripped_prefix else ""
        lines = [
            f"Converted {self.source}" + (f" -> {self.output}" if self.output else ""),
            f"  source layout : {self.wrapping}{prefix}",
            f"  architecture  : {self.arch}; {_origin(self.arch_requested, '--arch')}",
            f"  GW positions  : {self._positions_text()}; "
            f"{_origin(self.gw_positions_requested, '--gw-positions')}",
            f"  converted     : {self.converted_keys} keys: {self.converted_convs} convs, "
            f"{self.converted_bn_norms} BN norms (weight, bias, running_mean, running_var),",
            f"                  {self.converted_affine_norms} {affine_kind} norms "
            f"(weight, bias{reshaped})",
            *([f"  reshaped BN   : {preview_names(self.reshaped_bn, 4)} kept weight/bias as [1,C,1,1] (or another "
               "broadcasting shape):",
               "                  reshaped to [C], the same values"] if self.reshaped_bn else []),
            *([f"  reshaped stats: {preview_names(self.reshaped_bn_statistics, 4)} kept running_mean/running_var as "
               "[1,C,1,1] (or another broadcasting shape):",
               "                  reshaped to [C], the same values"] if self.reshaped_bn_statistics else []),
            *([f"  no affine     : {preview_names(self.identity_affine, 4)} had no weight or bias "
               "(BatchNorm2d(affine=False)):",
               "                  written with weight 1, bias 0, which compute the same"] if self.identity_affine
              else []),
            f"  dropped       : {len(self.dropped_classifier)} classifier keys "
            f"{preview_names(self.dropped_classifier, 4)}, "
            f"{self.dropped_num_batches_tracked} num_batches_tracked",
            f"  unexpected    : {unexpected}",
            *([f"  settings      : {self.settings_records} gwdet norm layers' recorded settings carried (the layers "
               "that load them refuse other settings)"] if self.settings_records else []),
            "Config for these weights:",
        ]
        lines += [f"  {key}: {_yaml_value(value)}" for key, value in self.config().items()]
        unrecorded = [*(["their GN layers' group count (MODEL.GN.NUM_GROUPS)"] if self.gn_style else []),
                      *(["their GW layers' method, group count, iterations and eps (MODEL.RESNETS.GW_NORM, "
                         "MODEL.GW.NUM_GROUPS, T, EPS)"] if self.gw_positions else [])]
        usual = [*(["torchvision's and detectron2's GN ResNets use 32 groups"] if self.gn_style else []),
                 *(["the GW paper's ImageNet models whiten by ItN (GW_NORM GW) with 64 groups and T 5, gwdet's "
                    "defaults; check the source's own"] if self.gw_positions else [])]
        if unrecorded and not self.settings_records:
            lines.append(f"Not in the weights, so not checked when they load: {' and '.join(unrecorded)}. Set them to "
                         f"the source model's ({'; '.join(usual)}): other values load without a word into layers that "
                         "compute another function than the source's.")
        return "\n".join(lines)

    def _positions_text(self) -> str:
        if self.gw_positions:
            return self.gw_positions
        if self.gn_style:
            return "none (no norm has running statistics: GN-style)"
        return "none (BN everywhere)"

    def config(self) -> dict[str, object]:
        """The config keys (detectron2's and gwdet's) of a model loading these weights."""
        return {**loading_config(ARCHITECTURES[self.arch], self.gw_positions, self.gn_style), **self.recorded_config}

    def author(self) -> str:
        """The output's ``__author__``; detectron2 logs it when loading the weights."""
        return conversion_author(self.arch, self.gw_positions, self.source)

    def metadata(self) -> dict[str, object]:
        """What the weights are, stored in the output under :data:`METADATA_KEY`."""
        return conversion_metadata(self.arch, self.gw_positions, self.gn_style, self.source, self.config())


def _yaml_value(value: object) -> str:
    """``"RGB"`` for strings (so that ``""`` shows), ``str(value)`` otherwise."""
    return f'"{value}"' if isinstance(value, str) else str(value)


def _origin(requested: str | None, flag: str) -> str:
    return "inferred" if requested is None else f"inferred, matches {flag}"


def convert_state_dict(
    source: SourceStateDict,
    arch: str | None = None,
    gw_positions: str | None = None,
    allow_unexpected: bool = False,
    source_name: str = "<state dict>",
) -> tuple[dict[str, np.ndarray], ConversionReport]:
    """Map a torchvision-layout state dict onto detectron2's ResNet names.

    Args:
        source: the source tensors, e.g. from :func:`read_source_state_dict`; numpy arrays (an
            ``.npz``'s) among them are read as the tensors they hold.
        arch: an :data:`ARCHITECTURES` name to insist on, or None to accept the inferred one.
        gw_positions: a GW_POSITIONS string to insist on (``""``: no GW), or None for the inferred
            ones; needed where norms without running statistics keep no GW record and a ``[C]``
            affine, whose weights cannot tell GW from GroupNorm.
        allow_unexpected: drop keys outside torchvision's ResNet layout instead of failing.
        source_name: how the report names the source.

    Returns:
        The detectron2-named float32 arrays, and the report.

    Raises:
        ConversionError: the checkpoint does not fit ``arch``/``gw_positions``, is of an
            unsupported architecture, has GW positions gwdet cannot represent or (without
            ``gw_positions``) cannot tell from GroupNorm, is incomplete, or has unexpected keys.
    """
    check_flag("convert_state_dict", "allow_unexpected", allow_unexpected)
    if not isinstance(source, SourceStateDict):
        raise ConversionError(f"convert_state_dict: source must be a SourceStateDict (from read_source_state_dict, "
                              f"or SourceStateDict(tensors=state_dict, wrapping='bare state_dict', stripped_prefix='')), got "
                              f"{type(source).__name__}")
    if not isinstance(source_name, str):
        raise ConversionError(f"convert_state_dict: source_name is how the report names the source, a str (e.g. the "
                              f"checkpoint's path), got {source_name!r} ({type(source_name).__name__}); leave it out "
                              "for '<state dict>'.")
    check_requested_names(arch, gw_positions)
    tensors = _source_tensors(source)
    _check_dense(tensors)
    tensors, stray = _without_stray_blocks(tensors, allow_unexpected)
    layout = parse_torchvision_layout(tensors)
    layout.unexpected.extend(stray)
    check_bottleneck_blocks(layout)
    _check_unexpected(layout, allow_unexpected)
    inferred_arch = infer_architecture(layout)
    check_requested_architecture(inferred_arch, arch)
    positions = infer_gw_positions(layout)
    gn_style = is_gn_style(layout)
    check_gw_told_from_group_norm(layout, positions, gw_positions)
    undetermined = frozenset(norm.position for norm in undetermined_gw_norms(layout, positions))
    check_requested_gw_positions(positions, gw_positions, gn_style, undetermined)
    weights, reshaped = detectron2_weights(layout)
    expected = expected_shapes(inferred_arch, format_gw_positions(positions), gn_style)
    check_fits_architecture(weights, expected, inferred_arch)
    check_trained(layout, source_name)
    _check_zero_variances(layout, source_name)
    records = {f"{norm.target}.{RECORD_LEAF}": norm.record.numpy() for norm in layout.norms.values()
               if norm.record is not None}  # checked by the layers that load them: their settings
    weights.update(records)
    affine_norms = sum(norm.affine_only for norm in layout.norms.values())
    return weights, ConversionReport(
        source=source_name,
        wrapping=source.wrapping,
        stripped_prefix=source.stripped_prefix,
        arch=inferred_arch.name,
        arch_requested=arch,
        gw_positions=format_gw_positions(positions),
        gw_positions_requested=gw_positions,
        gn_style=gn_style,
        converted_convs=len(layout.convs),
        converted_bn_norms=len(layout.norms) - affine_norms,
        converted_affine_norms=affine_norms,
        reshaped_affine=len(reshaped),
        reshaped_from=sorted(set(reshaped), key=reshaped.index),
        converted_keys=len(weights),
        dropped_classifier=sorted(layout.dropped_classifier),
        dropped_num_batches_tracked=len(layout.dropped_num_batches_tracked),
        unexpected=sorted(layout.unexpected),
        settings_records=len(records),
        recorded_config=recorded_config([norm.record for norm in layout.norms.values() if norm.record is not None]),
        identity_affine=[norm.source for norm in layout.norms.values() if norm.identity_affine],
        reshaped_bn=reshaped_bn_affine(layout),
        reshaped_bn_statistics=reshaped_bn_statistics(layout),
    )


def _source_tensors(source: SourceStateDict) -> dict[str, torch.Tensor]:
    """``source.tensors`` with numpy arrays turned into tensors (sharing their memory); a
    ``ConversionError`` naming the first name that is not a string, or value that is neither."""
    if not isinstance(source.tensors, Mapping):
        raise ConversionError(f"convert_state_dict: source.tensors must be a dict of parameter names to torch tensors "
                              f"(a model's state_dict()), got {type(source.tensors).__name__}.")
    tensors = {}
    for name, value in source.tensors.items():
        if not isinstance(name, str):
            raise ConversionError(f"convert_state_dict: source.tensors has the key {name!r} "
                                  f"({type(name).__name__}); a state dict's keys are parameter names (str), as a "
                                  "model's state_dict() has them.")
        if isinstance(value, np.ndarray):
            try:
                value = torch.from_numpy(value if value.flags.writeable else value.copy())
            except TypeError:  # an object array, or a dtype torch has no tensors of
                raise ConversionError(f"convert_state_dict: source.tensors[{name!r}] is a numpy array of dtype "
                                      f"{value.dtype}, which torch holds no tensors of; give the arrays as numbers "
                                      "(e.g. array.astype(numpy.float32)).") from None
        elif not isinstance(value, torch.Tensor):
            raise ConversionError(f"convert_state_dict: source.tensors[{name!r}] is a {type(value).__name__}, not a "
                                  "torch tensor or numpy array; give the state dict's tensors (e.g. "
                                  "{name: torch.as_tensor(value) for name, value in state_dict.items()}).")
        tensors[name] = value
    return tensors


def _check_dense(tensors: Mapping[str, torch.Tensor]) -> None:
    """A ``ConversionError`` naming the first tensor of ``tensors`` that is not a dense (strided)
    one: a sparse tensor (a pruned model's ``.to_sparse()`` weight) or an MKL-DNN one, whose values
    are converted only once they are saved dense."""
    for name, value in tensors.items():
        if value.layout != torch.strided:
            kind = str(value.layout).removeprefix("torch.").removeprefix("_")
            raise ConversionError(
                f"{name} is a {kind} tensor (layout {value.layout}), and the converter reads dense tensors only: "
                "save the checkpoint with dense tensors, e.g. torch.save({k: v.to_dense() if "
                "v.layout != torch.strided else v for k, v in state_dict.items()}, path) (a sparse weight's missing "
                "entries become zeros), and convert that file; nothing was written.")


def recorded_config(records: list[torch.Tensor]) -> dict[str, object]:
    """The config values that gwdet GW layers' recorded settings ``records`` give: the norm at the GW
    positions (``MODEL.RESNETS.GW_NORM``, ``GW`` or ``GW_ZCA`` by the recorded method) and its
    values (``MODEL.GW.*``, from the norm catalogue's keys), each where every record that has it
    agrees."""
    values: dict[str, set] = {}
    for record in records:
        settings = decode_settings(record)
        if settings is None or settings.get("layer") != GroupWhitening.__name__:
            continue
        name = "GW_ZCA" if settings.get("method") == "zca" else "GW"
        values.setdefault("MODEL.RESNETS.GW_NORM", set()).add(name)
        for param, key in norm_record(name).config_keys.items():
            if param in settings:
                values.setdefault(key, set()).add(settings[param])
    return {key: next(iter(found)) for key, found in sorted(values.items()) if len(found) == 1}


def detectron2_weights(layout: SourceLayout) -> tuple[dict[str, np.ndarray], list[str]]:
    """detectron2-named float32 arrays of the convs and norms, and the shape (``"[1,C,1,1]"``) of
    each affine weight or bias of a norm without statistics that was reshaped to ``[C]``. A batch
    norm's weight, bias, running mean or running variance kept in such a broadcasting shape is
    reshaped to ``[C]`` too (the same values; :func:`reshaped_bn_affine` and
    :func:`reshaped_bn_statistics` name those norms for the report)."""
    weights = {key: _float_array(key, value) for key, value in layout.convs.items()}
    reshaped = []
    for norm in layout.norms.values():
        for leaf, value in norm.tensors.items():
            if norm.affine_only and _is_broadcast_affine(value):
                reshaped.append(_layout_of(value))
                value = value.reshape(-1)
            elif leaf in (*_AFFINE_LEAVES, *_STATISTICS_LEAVES) and _is_broadcast_affine(value):
                value = value.reshape(-1)
            weights[f"{norm.target}.{leaf}"] = _float_array(f"{norm.source}.{leaf}", value)
    return weights, reshaped


_AFFINE_LEAVES = ("weight", "bias")
_STATISTICS_LEAVES = ("running_mean", "running_var")


def reshaped_bn_affine(layout: SourceLayout) -> list[str]:
    """The batch norms (source names) of ``layout`` whose weight or bias is kept in a broadcasting
    shape (``[1, C, 1, 1]``), which :func:`detectron2_weights` reshapes to ``[C]``."""
    return [norm.source for norm in layout.norms.values() if not norm.affine_only
            and any(_is_broadcast_affine(norm.tensors[leaf]) for leaf in _AFFINE_LEAVES if leaf in norm.tensors)]


def reshaped_bn_statistics(layout: SourceLayout) -> list[str]:
    """The batch norms (source names) of ``layout`` whose running mean or variance is kept in a
    broadcasting shape (``[1, C, 1, 1]``), which :func:`detectron2_weights` reshapes to ``[C]``."""
    return [norm.source for norm in layout.norms.values() if not norm.affine_only
            and any(_is_broadcast_affine(norm.tensors[leaf]) for leaf in _STATISTICS_LEAVES if leaf in norm.tensors)]


def check_trained(layout: SourceLayout, source_name: str) -> None:
    """A ``ConversionError`` when every norm of ``layout`` holds what a freshly built ResNet's hold:
    running mean 0 and variance 1 in each batch norm, or (a model without running statistics) an
    affine weight of ones (or zeros) and a bias of zeros in each norm: a model that was never
    trained, such as ``torchvision.models.resnet50()`` saved without its ``weights=``."""
    norms = [norm.tensors for norm in layout.norms.values()]
    statistics = [tensors for tensors in norms if "running_mean" in tensors and "running_var" in tensors]
    if statistics:
        untrained = all(not tensors["running_mean"].any() and bool((tensors["running_var"] == 1).all())
                        for tensors in statistics)
        held = "running mean 0 and variance 1 in every batch norm"
    else:
        untrained = bool(norms) and all(
            "weight" in tensors and bool(((tensors["weight"] == 1).all() or not tensors["weight"].any()))
            and not tensors.get("bias", torch.zeros(1)).any() for tensors in norms)
        held = "an affine weight of ones and a bias of zeros in every norm"
    if untrained:
        raise ConversionError(
            f"{source_name} holds the weights of a ResNet that was never trained ({held}, as a model is built): "
            "fine-tuning from it would start from random weights. Save a trained model, e.g. torchvision's "
            "resnet50(weights='IMAGENET1K_V1').state_dict() (torchvision.models.resnet50() alone is untrained); "
            "nothing was written.")
    _check_partly_untrained(layout, source_name)


def _check_partly_untrained(layout: SourceLayout, source_name: str) -> None:
    """Name the batch norms of ``layout`` whose running statistics are still a freshly built layer's
    (mean 0 and variance 1 in every channel): a trained network has none, since a single training
    step in train mode moves them. When more than half of the batch norms are at those values the
    network as a whole was not trained (its layers never saw data), and a ``ConversionError`` says
    so; when fewer are, a warning lists how many and which, and the conversion goes on."""
    statistics = {norm.source: norm.tensors for norm in layout.norms.values()
                  if "running_mean" in norm.tensors and "running_var" in norm.tensors}
    at_init = [name for name, tensors in statistics.items()
               if not tensors["running_mean"].any() and bool((tensors["running_var"] == 1).all())]
    if not at_init:
        return
    which = (f"{len(at_init)} of the {len(statistics)} batch norms of {source_name} hold the running statistics of a "
             f"layer that never saw data (mean 0 and variance 1 in every channel, as a model is built): "
             f"{preview_names(at_init, 5)}")
    if 2 * len(at_init) > len(statistics):
        raise ConversionError(
            f"{which}. Most of the network was never trained, so fine-tuning from it would start mostly from random "
            "weights. Save a trained model (e.g. torchvision's resnet50(weights='IMAGENET1K_V1').state_dict()), "
            "or check that the statistics were saved from the trained model; nothing was written.")
    logger.warning(
        "%s. A trained network has no such layer: check that the checkpoint holds the statistics of the trained "
        "model (a layer replaced or re-initialized after training has them); the conversion goes on.", which)


ZERO_VARIANCE = 1e-12  # far below FrozenBN's eps (1e-5), which then alone decides a channel's scale


def _check_zero_variances(layout: SourceLayout, source_name: str) -> None:
    """Warn naming each batch norm of ``layout`` whose running variance is (about) zero in every
    channel (below :data:`ZERO_VARIANCE`). The converted FrozenBN computes what the source's BN
    computes in eval, ``weight / sqrt(running_var + eps)``, so the conversion is faithful; but such a
    layer scales its input by about ``1 / sqrt(eps)`` (316 for eps 1e-5), and a whole layer of zero
    variance after a conv with weights does not come out of training: the checkpoint is damaged or
    its statistics were never gathered."""
    zero = [norm.source for norm in layout.norms.values()
            if "running_var" in norm.tensors  # as float32: torch has no comparisons of float8 values
            and bool((norm.tensors["running_var"].float().abs() < ZERO_VARIANCE).all())]
    if zero:
        logger.warning(
            "%d batch norm(s) of %s hold a running variance of zero in every channel: %s. Converted, such a layer "
            "scales its input by 1/sqrt(eps), about 316 for eps 1e-5, as the source's BN does in eval; training does "
            "not leave a whole layer at zero variance. Check those layers' running_var in the source checkpoint "
            "(a damaged file, or statistics never gathered) before fine-tuning from it.",
            len(zero), source_name, preview_names(zero, 5))


def _is_broadcast_affine(value: torch.Tensor) -> bool:
    """An affine parameter kept in a broadcasting shape: its values along one axis, every other axis
    of size 1 (the GW authors' ``[1, C, 1, 1]``, or ``[C, 1, 1]``, ``[1, C]``)."""
    return value.dim() > 1 and sum(size != 1 for size in value.shape) <= 1


def _layout_of(value: torch.Tensor) -> str:
    """``"[1,C,1,1]"`` for a broadcast affine parameter of shape ``[1, 64, 1, 1]``."""
    return "[" + ",".join("1" if size == 1 else "C" for size in value.shape) + "]"


def _float_array(name: str, value: torch.Tensor) -> np.ndarray:
    """``value`` as float32 numbers; a ``ConversionError`` for integer tensors, non-finite values
    and a negative running variance (a damaged or wrongly saved checkpoint)."""
    if not value.is_floating_point():
        raise ConversionError(f"{name} has dtype {value.dtype}; weights must be floating point.")
    array = value.detach().to(torch.float32).numpy()
    bad = int(array.size - np.isfinite(array).sum())
    if bad:
        raise ConversionError(f"{name} holds {bad} non-finite value(s) (NaN or inf) in float32: the checkpoint is "
                              "damaged or diverged; convert the weights of a finite model.")
    if name.endswith("running_var") and (array < 0).any():
        raise ConversionError(f"{name} holds {int((array < 0).sum())} negative value(s): a variance is never "
                              "negative, so the checkpoint is damaged or not a batch norm's state; convert another.")
    return array


_IN_BLOCK = re.compile(r"layer[1-4]\.\d+\.")


def _check_unexpected(layout: SourceLayout, allow_unexpected: bool) -> None:
    """A ``ConversionError`` for keys outside torchvision's ResNet layout, unless ``allow_unexpected``.
    Keys inside the residual blocks (``layerN.M.*``: an SE-ResNet's ``se.fc1``, say) are named as parts
    of the blocks that gwdet's ResNet does not have: the checkpoint is of another architecture, and
    dropping them (what ``allow_unexpected`` does) converts a network that computes something else.
    For keys outside the blocks (a head, an EMA counter) the message offers the flag."""
    in_blocks = sorted(key for key in layout.unexpected if _IN_BLOCK.match(key))
    if in_blocks and not allow_unexpected:
        modules = sorted({key.rpartition(".")[0].split(".", 2)[2] for key in in_blocks})
        raise ConversionError(
            f"{len(in_blocks)} key(s) inside the residual blocks are not part of torchvision's ResNet layout: "
            f"{preview_names(in_blocks)}. They are modules of the blocks ({preview_names(modules, 4)}) that gwdet's "
            "ResNet (detectron2's bottleneck block: conv1-3, their norms, the shortcut) does not have, so the "
            "checkpoint is of another architecture (an SE-ResNet, say); dropping them would convert a network that "
            f"computes something else ({UNEXPECTED_FLAG} does that, and the result is no longer the network "
            "that was trained). Convert a torchvision-layout ResNet/ResNeXt (e.g. torchvision's "
            "resnet50(weights='IMAGENET1K_V1')) instead; nothing was written.")
    if layout.unexpected and not allow_unexpected:
        raise ConversionError(
            f"{len(layout.unexpected)} keys are not part of torchvision's ResNet layout: "
            f"{preview_names(sorted(layout.unexpected))}. Check that this is the checkpoint you "
            f"meant; pass {UNEXPECTED_FLAG} to drop these keys and convert the rest."
        )


def _without_stray_blocks(tensors: dict[str, torch.Tensor],
                          allow_unexpected: bool) -> tuple[dict[str, torch.Tensor], list[str]]:
    """``tensors`` without the keys of stray blocks (:func:`~gwdet.convert.architecture.stray_blocks`:
    blocks beyond the architecture the rest is, each holding keys of fewer than half of a bottleneck's
    modules), and those keys; a ``ConversionError`` naming the blocks and their keys unless
    ``allow_unexpected``, which drops them as other keys outside torchvision's ResNet layout."""
    stray = stray_blocks(tensors)
    if stray is None:
        return tensors, []
    keys = [key for block in stray.keys.values() for key in block]
    if not allow_unexpected:
        arch = stray.arch
        held = "; ".join(
            f"{block} holds only {preview_names(stray.keys[block], 4)} (keys of {len(stray.modules[block])} of the "
            f"{len(BOTTLENECK_MODULES)} modules of a bottleneck block: {', '.join(BOTTLENECK_MODULES)})"
            for block in stray.keys)
        stages = sorted({block.split(".")[0] for block in stray.keys})
        counts = " and ".join(f"{count} blocks in {stage} ({stage}.0-{stage}.{count - 1})" for stage in stages
                              for count in [arch.blocks_per_stage[int(stage[-1]) - 1]])
        plural = len(stray.keys) > 1
        raise ConversionError(
            f"stray key{'s' if len(keys) > 1 else ''} of {'blocks' if plural else 'a block'} that the network does "
            f"not have: {held}. The other blocks are {arch.describe()}, which has {counts}, so "
            f"{'these blocks are' if plural else 'this block is'} no part of the network (a whole block holds all "
            "six modules). Check that this is the checkpoint you meant; pass "
            f"{UNEXPECTED_FLAG} (in Python: allow_unexpected=True) to drop these keys and convert the rest as "
            f"{arch.name}; nothing was written.")
    dropped = set(keys)
    return {key: value for key, value in tensors.items() if key not in dropped}, sorted(keys)


def convert_checkpoint(
    input_path: str | os.PathLike,
    output_path: str | os.PathLike,
    arch: str | None = None,
    gw_positions: str | None = None,
    allow_unsafe_pickle: bool = False,
    allow_unexpected: bool = False,
    overwrite: bool = False,
) -> ConversionReport:
    """Read ``input_path``, convert it, and write a detectron2 ``.pkl`` to ``output_path``.

    The output appears only when the conversion succeeds; an existing ``output_path`` is replaced
    only with ``overwrite``. See :func:`convert_state_dict` for
    ``arch``, ``gw_positions`` and ``allow_unexpected``; ``allow_unsafe_pickle`` permits full
    unpickling of the input, which can execute arbitrary code (trusted files only). Either path may
    be a ``file://`` URL of this host (read as its path); an output URL of another scheme is refused.

    Raises:
        ConversionError: anything that prevents a faithful conversion; the message says what
            and how to fix it.
        GwdetTypeError: a path that is not a str or ``os.PathLike`` (an open file, say).
    """
    for name, value in (("allow_unsafe_pickle", allow_unsafe_pickle), ("allow_unexpected", allow_unexpected),
                        ("overwrite", overwrite)):
        check_flag("convert_checkpoint", name, value)
    if isinstance(input_path, Mapping):  # a state dict in memory (a notebook's model.state_dict())
        raise ConversionError(
            "convert_checkpoint: input_path is a state dict, not a file's path: torch.save(state_dict, path) and "
            "give that path, or convert it in memory with gwdet.convert.convert_state_dict(SourceStateDict("
            "tensors=state_dict, wrapping='bare state_dict', stripped_prefix='')) and write the weights it returns "
            "with gwdet.convert.write_detectron2_pkl.")
    for name, path in (("input_path", input_path), ("output_path", output_path)):
        if not isinstance(path, (str, bytes, os.PathLike)):
            opened = " (an open file)" if hasattr(path, "read") or hasattr(path, "write") else ""
            raise GwdetTypeError(
                f"convert_checkpoint: {name} must be a file's path (a str or pathlib.Path), got a "
                f"{type(path).__name__}{opened}: give the path of the file itself. To convert a state dict in memory, "
                "use gwdet.convert.convert_state_dict(SourceStateDict(tensors=state_dict, wrapping='bare state_dict', "
                "stripped_prefix='')) and write the weights it returns with gwdet.convert.write_detectron2_pkl.")
    input_path, output_path = os.fspath(input_path), os.fspath(output_path)
    for name, path in (("input_path", input_path), ("output_path", output_path)):
        if not isinstance(path, str):
            raise ConversionError(f"convert_checkpoint: {name} must be a str or os.PathLike path, got "
                                  f"{path!r} ({type(path).__name__})")
    check_requested_names(arch, gw_positions)
    input_path = local_input_path(input_path)
    unexpanded = unexpanded_variable_problem("output_path", output_path)
    if unexpanded is not None:  # a quoted '$HOME/w.pkl': a folder named '$HOME'
        raise ConversionError(unexpanded)
    output_path = _local_output_path(output_path)
    _refuse_url_output(output_path)
    _check_output_path(input_path, output_path, overwrite)
    # what --overwrite replaces: another conversion's output written meanwhile is kept
    found = file_version(output_path)
    _remove_leftovers(output_path)
    source = read_source_state_dict(input_path, allow_unsafe_pickle=allow_unsafe_pickle)
    try:
        weights, report = convert_state_dict(
            source, arch, gw_positions, allow_unexpected, source_name=input_path
        )
    except ConversionError as error:
        raise ConversionError(f"{input_path}: {error}") from None
    write_detectron2_pkl(weights, output_path, report.author(), report.metadata(), overwrite=overwrite,
                         replacing=found)
    report.output = output_path
    return report


def _remove_leftovers(output_path: str) -> None:
    """Remove the temporary files of ``output_path`` that conversions killed while writing it left
    behind (those of processes that no longer run), and say so."""
    folder, name = os.path.split(os.path.abspath(output_path))
    remove_stale_partials(folder, "conversion", of=name)


def _check_output_path(input_path: str, output_path: str, overwrite: bool) -> None:
    _check_output_place(output_path)
    both_exist = os.path.isfile(input_path) and os.path.isfile(output_path)
    if both_exist and os.path.samefile(input_path, output_path):
        raise ConversionError(f"{output_path}: this is the input file; choose another output.")
    if os.path.exists(output_path) and not overwrite:
        raise ConversionError(
            f"{output_path} already exists; it is left as it is. Pass --overwrite (in Python: overwrite=True) to "
            "replace it, or choose another output file."
        )


def _check_output_place(output_path: str) -> None:
    """Refuse an output that detectron2 would not read as converted weights (a name not ending in
    :data:`OUTPUT_SUFFIX`) or that cannot be written: below a file, in a missing folder, a folder,
    a link to nothing or one that loops, or in a folder that is such a link; or that names no file
    (empty, blank, or ``-``). The one check of the output's name and place for the tool,
    :func:`convert_checkpoint` and :func:`write_detectron2_pkl`."""
    _refuse_unnamed_output(output_path)
    _refuse_folder_output(output_path)
    _check_output_suffix(output_path)
    folder = os.path.dirname(os.path.abspath(output_path))
    above = folder  # the nearest part of the path that exists
    while not os.path.lexists(above) and os.path.dirname(above) != above:
        above = os.path.dirname(above)
    broken = broken_link(output_path)
    if broken is not None and broken.link != output_path:
        raise ConversionError(f"{output_path}: {broken.describe(output_path)}, so there is no folder to write into; "
                              f"nothing was converted. Point the link at the folder meant (ln -sfn /path/to/folder "
                              f"{broken.link}), or give another output path.")
    if os.path.lexists(above) and not os.path.isdir(above):
        raise ConversionError(f"{output_path}: {above} is a file, not a folder: give the output a path in a folder.")
    if broken is not None and broken.loops:
        raise ConversionError(f"{output_path} is {broken.describe(output_path)}, which leads to no file; nothing was "
                              "converted. Remove the link, or give another output file.")
    if not os.path.isdir(folder):
        raise ConversionError(f"{output_path}: folder {folder} does not exist. Create it first.")
    if os.path.islink(output_path) and not os.path.exists(output_path):
        raise ConversionError(f"{output_path} is a link to {os.readlink(output_path)}, which does not exist; nothing "
                              "was converted. Remove the link, or give another output file.")


EXAMPLE_OUTPUT = "R-50.pkl"  # a name the refusals of an output that names no file give as an example


def _refuse_unnamed_output(output_path: str) -> None:
    """Refuse an output path that names no file: an empty or blank one (an unset shell variable, as
    in ``"$OUT"``), or ``-``, which commands read as standard output; the converted weights are a
    ``.pkl`` file, and the message gives an example name (:data:`EXAMPLE_OUTPUT`)."""
    if not output_path.strip():
        what = "is empty" if not output_path else f"is blank ({output_path!r})"
        raise ConversionError(
            f"the output path {what} (OUT on the command line, output_path in Python; an unset shell variable, as "
            f"in \"$OUT\"?): give the {OUTPUT_SUFFIX} file to write, e.g. {EXAMPLE_OUTPUT}; nothing was written.")
    if output_path == "-":
        raise ConversionError(
            "the output path is '-', which many commands read as standard output, but the converter writes a file: "
            f"detectron2 reads converted weights from a {OUTPUT_SUFFIX} file, not from a stream. Give the "
            f"{OUTPUT_SUFFIX} file to write, e.g. {EXAMPLE_OUTPUT}; nothing was written.")


def _refuse_folder_output(output_path: str) -> None:
    """Refuse an output that is a folder, or names one (ends in a path separator): the converted
    weights are one file, which goes in the folder under a name of its own."""
    if os.path.isdir(output_path):
        what = "is a folder"
    elif output_path.endswith((os.sep, "/")):
        what = "names a folder (it ends in '/')"
    else:
        return
    example = os.path.join(output_path, "R-50-GW" + OUTPUT_SUFFIX)
    raise ConversionError(f"{output_path} {what}: give the path of the {OUTPUT_SUFFIX} file to write, a file name "
                          f"in it (e.g. {example}); nothing was written.")


def _check_output_suffix(output_path: str) -> None:
    """Refuse an output whose name does not end with :data:`OUTPUT_SUFFIX`, which detectron2 would
    not read as converted weights."""
    if not output_path.endswith(OUTPUT_SUFFIX):
        stem = os.path.splitext(output_path)[0] if os.path.splitext(output_path)[1] else output_path
        raise ConversionError(
            f"{output_path}: the output must end with {OUTPUT_SUFFIX}; detectron2 reads "
            "converted weights (numpy arrays, matching heuristics) only from .pkl files. Name it "
            f"{stem + OUTPUT_SUFFIX!r} (or another name ending in {OUTPUT_SUFFIX}); nothing was written."
        )


class _Unseen:
    """The default of :func:`write_detectron2_pkl`'s ``replacing``: look at the output when the call starts."""

    def __repr__(self) -> str:
        return "<what is there when the call starts>"


_LOOK_NOW = _Unseen()


def write_detectron2_pkl(
    weights: dict[str, np.ndarray],
    output_path: str | os.PathLike,
    author: str,
    metadata: Mapping[str, object] | None = None,
    overwrite: bool = False,
    replacing: os.stat_result | None | _Unseen = _LOOK_NOW,
) -> None:
    """Write ``weights`` as a detectron2 ``.pkl`` with matching heuristics on.

    ``output_path`` must end with ``.pkl`` (the files detectron2 reads as converted weights); an
    existing ``output_path`` is refused (:class:`ConversionError`, the file left as it is) unless
    ``overwrite``. The file is written under a temporary name in the same folder and renamed when
    complete, so ``output_path`` never holds a partial file. ``replacing`` is what the caller saw at
    ``output_path`` before it began (its ``os.stat``, or ``None`` for no file; by default, what is
    there when this call starts): when the file there is no longer that one at the rename (another
    process wrote it meanwhile), it is kept and this call refused, so that of two conversions into
    one file exactly one succeeds. ``metadata`` goes under :data:`METADATA_KEY`, and a checksum of
    every array and of the author and metadata (:mod:`gwdet.checkpoint.integrity`) beside the weights.

    ``weights`` must be a non-empty dict of parameter names to numpy arrays (what
    :func:`convert_state_dict` returns; detectron2 and gwdet read no tensors from a ``.pkl``), floating
    point but for ``num_batches_tracked`` and the settings records (``<layer>._extra_state``, uint8)
    of gwdet norm layers that :func:`convert_state_dict` carries, and
    ``metadata`` plain data (str, int, float, bool, None, and lists, tuples and dicts of them), which
    the weights-only loading reads back; anything else is refused before a file is written.
    A ``file://`` URL of this host is written to its path like any local path; a URL of another
    scheme is refused (the file is written atomically, to a local folder).
    """
    check_flag("write_detectron2_pkl", "overwrite", overwrite)
    _check_weights(weights)
    _check_metadata(metadata)
    if metadata is not None:
        _check_record_fits_weights(metadata, weights)
    if not isinstance(output_path, (str, os.PathLike)):
        raise GwdetTypeError(f"write_detectron2_pkl: output_path must be a file's path (a str or pathlib.Path), got a "
                             f"{type(output_path).__name__} ({_short_repr(output_path)}): give the path of the .pkl "
                             "to write; nothing was written.")
    output_path = os.fspath(output_path)
    if not isinstance(output_path, str):
        raise GwdetTypeError(f"write_detectron2_pkl: output_path must be a str or os.PathLike path, got "
                             f"{output_path!r} ({type(output_path).__name__}); nothing was written.")
    unexpanded = unexpanded_variable_problem("output_path", output_path)
    if unexpanded is not None:  # a quoted '$HOME/w.pkl': a folder named '$HOME'
        raise ConversionError(unexpanded)
    output_path = _local_output_path(output_path)
    _refuse_url_output(output_path)
    _check_output_place(output_path)
    seen = file_version(output_path) if isinstance(replacing, _Unseen) else replacing
    if seen is not None and not overwrite:
        _refuse_existing(output_path)
    _write_pkl(weights, output_path, author, metadata, overwrite, seen)


def _local_output_path(output_path: str) -> str:
    """``output_path`` with a ``file://`` URL of this host turned into its path (detectron2's
    ``PathManager`` has no handler for ``file://``); any other path as it is."""
    local, host = file_url_path(output_path)
    if host is not None:
        raise ConversionError(
            f"{output_path} names a file on the host {host!r}, which cannot be written from here (a "
            "file:// URL of this machine is file:///PATH, with three slashes); nothing was written. Give a local "
            "path, and copy the file to that host.")
    return local


def _refuse_url_output(output_path: str) -> None:
    """Refuse an output URL of a scheme other than ``file://`` (which :func:`_local_output_path` reads
    as its path): the converted weights are written atomically to a local file."""
    if "://" in output_path:
        scheme = urlsplit(output_path).scheme or output_path.partition("://")[0]
        raise ConversionError(
            f"{output_path}: the converter writes local files (file:///PATH included), not {scheme}:// URLs; nothing "
            "was written. Write to a local path, and copy the file where it goes with that storage's own tools.")


def _check_weights(weights: object) -> None:
    """A ``ConversionError`` unless ``weights`` is a non-empty dict of names to numpy arrays of
    numbers: what detectron2's and gwdet's loading read from a ``.pkl`` as weights. Arrays are
    floating point, but for ``num_batches_tracked`` and for the settings records of gwdet norm
    layers under ``<layer>._extra_state`` (:func:`_is_settings_record`), which those layers check
    their settings against when the weights load; another array under that key is refused."""
    if not isinstance(weights, Mapping) or not weights:
        what = "an empty dict" if isinstance(weights, Mapping) else f"a {type(weights).__name__}"
        raise ConversionError(
            f"write_detectron2_pkl: weights must be a non-empty dict of parameter names to numpy arrays (what "
            f"convert_state_dict returns), got {what}; nothing was written, since a file without weights loads "
            "nothing into a model.")
    for name, value in weights.items():
        if not isinstance(name, str):
            raise ConversionError(f"write_detectron2_pkl: weights has the key {name!r} ({type(name).__name__}); "
                                  "weights are named by their parameters' names (str). Nothing was written.")
        if isinstance(value, torch.Tensor):
            raise ConversionError(
                f"write_detectron2_pkl: weights[{name!r}] is a torch tensor; a detectron2 .pkl holds numpy arrays "
                "(detectron2's and gwdet's loading refuse tensors in a .pkl). Give the arrays ({name: "
                "value.detach().cpu().numpy() for name, value in weights.items()}), or convert_state_dict's output; "
                "nothing was written.")
        if not isinstance(value, np.ndarray) or value.dtype.kind not in "biufc":
            what = (f"a numpy array of dtype {value.dtype}" if isinstance(value, np.ndarray)
                    else f"a {type(value).__name__}")
            raise ConversionError(
                f"write_detectron2_pkl: weights[{name!r}] is {what}, not a numpy array of numbers, which is what a "
                "detectron2 .pkl holds and its loading reads. Give numpy arrays (e.g. numpy.asarray(value, "
                "dtype=numpy.float32)); nothing was written.")
        if name.rpartition(".")[2] == RECORD_LEAF and value.dtype.kind not in "fc":
            if _is_settings_record(value):
                continue
            raise ConversionError(
                f"write_detectron2_pkl: weights[{name!r}] is a numpy array of dtype {value.dtype} and shape "
                f"{list(value.shape)}, not the settings record a gwdet norm layer writes under {RECORD_LEAF!r} (a "
                f"uint8 array of {SETTINGS_BYTES} bytes of JSON naming the layer, which convert_state_dict carries "
                "from the source): loading would refuse it. Give the record as the layer's state_dict() holds it "
                f"(its numpy()), or leave the key out; nothing was written.")
        if value.dtype.kind not in "fc" and not name.endswith("num_batches_tracked"):
            raise ConversionError(
                f"write_detectron2_pkl: weights[{name!r}] is a numpy array of dtype {value.dtype}, but weights are "
                "floating point (a model's parameters and running statistics; convert_state_dict refuses integer "
                "weights too): loaded into a model, integers would be copied into its float layers as they are "
                "(quantized values unscaled, or zeros). Give the float weights (e.g. value.astype(numpy.float32) of "
                "dequantized values); nothing was written.")


def _is_settings_record(value: np.ndarray) -> bool:
    """Whether ``value`` is the record of its settings a gwdet norm layer writes in its state (and
    :func:`convert_state_dict` carries into the weights): a uint8 array of :data:`SETTINGS_BYTES`
    bytes holding the JSON object that :func:`~gwdet.layers.settings_state.decode_settings` reads."""
    return value.dtype == np.uint8 and value.shape == (SETTINGS_BYTES,) and decode_settings(value) is not None


_PLAIN_VALUES = (str, int, float, bool, type(None))


def _check_metadata(metadata: object) -> None:
    """A ``ConversionError`` unless ``metadata`` is None or a dict of plain data (str, int, float,
    bool, None, and lists, tuples and dicts of them), naming the first entry that is not."""
    if metadata is None:
        return
    if not isinstance(metadata, Mapping):
        raise ConversionError(f"write_detectron2_pkl: metadata must be a dict (or None), got a "
                              f"{type(metadata).__name__}; nothing was written.")
    found = _unplain_entry(dict(metadata), "metadata")
    if found is not None:
        where, value = found
        raise ConversionError(
            f"write_detectron2_pkl: {where} is a {type(value).__name__} ({_short_repr(value)}), not plain data: "
            "metadata holds str, int, float, bool, None, and lists, tuples and dicts of them, which the weights-only "
            "loading reads back. Store it as one of those (e.g. its name as a str); nothing was written.")
    malformed = malformed_record_field(metadata)
    if malformed is not None:
        name, value, what = malformed
        raise ConversionError(
            f"write_detectron2_pkl: metadata{''.join(f'[{part!r}]' for part in name.split('.'))} is {_short_repr(value)} ({type(value).__name__}): gwdet's loading "
            f"reads that field of the record to check the weights against the model, and takes {what} there. Give "
            "that, or keep your own data under another key; nothing was written.")


_NORM_OF_POSITION = {"S1": re.compile(r"stem\.conv1\.norm"), "B1": re.compile(r"res[2-5]\.\d+\.conv1\.norm"),
                     "B2": re.compile(r"res[2-5]\.\d+\.conv2\.norm"), "B3": re.compile(r"res[2-5]\.\d+\.conv3\.norm")}


def _weights_shape(weights: Mapping[str, np.ndarray]) -> tuple[tuple[int, ...] | None, tuple[int, int] | None]:
    """The blocks per stage (when every stage res2-res5 is there) and the conv2 grouping
    (groups, channels per group; from ``res2.0.conv2.weight``) that backbone weights in detectron2's
    names show; None for what they do not show."""
    blocks = []
    for stage in range(2, 6):
        found = {int(key.split(".")[1]) for key in weights
                 if re.fullmatch(rf"res{stage}\.\d+\.conv1\.weight", key)}
        blocks.append(max(found) + 1 if found else 0)
    conv2 = weights.get("res2.0.conv2.weight")
    grouping = None
    if isinstance(conv2, np.ndarray) and conv2.ndim == 4 and conv2.shape[1] and conv2.shape[0] % conv2.shape[1] == 0:
        grouping = (conv2.shape[0] // conv2.shape[1], int(conv2.shape[1]))
    return (tuple(blocks) if all(blocks) else None), grouping


def _statistics_by_position(weights: Mapping[str, np.ndarray]) -> dict[str, bool]:
    """For each norm position (S1, B1, B2, B3) whose norms the weights hold, whether those norms have
    running statistics (a BN's) or not (a GW's or GN's); a position of mixed norms is left out."""
    norms: dict[str, set[bool]] = {}
    for key in weights:
        module, _, leaf = key.rpartition(".")
        if leaf != "weight":
            continue
        for position, pattern in _NORM_OF_POSITION.items():
            if pattern.fullmatch(module):
                norms.setdefault(position, set()).add(f"{module}.running_var" in weights)
    return {position: next(iter(found)) for position, found in norms.items() if len(found) == 1}


def _check_record_fits_weights(metadata: Mapping[str, object], weights: Mapping[str, np.ndarray]) -> None:
    """A ``ConversionError`` when the ``"gwdet"`` record of ``metadata`` (its arch, gw_positions and
    norm fields) contradicts what ``weights`` show: their blocks per stage and conv2 grouping, and
    which norm positions hold running statistics (BN) and which do not (GW, or GN). gwdet's loading
    checks a model against that record, so a wrong one gives wrong advice there. Fields the weights
    do not show (a partial set of weights) are not checked."""
    arch_name = metadata.get(ARCH_FIELD)
    gw_field = metadata.get(GW_POSITIONS_FIELD)
    norm = metadata.get(NORM_FIELD)
    problems = []
    if isinstance(arch_name, str) and arch_name in ARCHITECTURES:
        arch = ARCHITECTURES[arch_name]
        blocks, grouping = _weights_shape(weights)
        if blocks is not None and blocks != arch.blocks_per_stage:
            problems.append(f"its arch {arch_name!r} has blocks per stage {list(arch.blocks_per_stage)}, the weights "
                            f"{list(blocks)}")
        if grouping is not None and grouping != (arch.num_groups, arch.width_per_group):
            problems.append(f"its arch {arch_name!r} has conv2 {arch.num_groups} group(s) x {arch.width_per_group} "
                            f"channels, the weights {grouping[0]} group(s) x {grouping[1]} channels")
    statistics = _statistics_by_position(weights)
    with_stats = [position for position in POSITIONS if statistics.get(position)]
    if isinstance(gw_field, str) and norm != "GN":
        recorded = parse_gw_positions(gw_field)
        as_bn = [position for position in POSITIONS if position in recorded and statistics.get(position)]
        as_gw = [position for position in POSITIONS if statistics.get(position) is False and position not in recorded]
        if as_bn:
            problems.append(f"its gw_positions {gw_field!r} puts GW at {', '.join(as_bn)}, where the weights hold "
                            "running statistics (BN)")
        if as_gw and norm == "BN":
            problems.append(f"its gw_positions {gw_field!r} puts BN at {', '.join(as_gw)}, where the weights hold "
                            "no running statistics (GW)")
    if norm == "GN" and with_stats:
        problems.append(f"its norm 'GN' has no running statistics, and the weights hold some at "
                        f"{', '.join(with_stats)} (BN)")
    if problems:
        raise ConversionError(
            f"write_detectron2_pkl: the metadata's {METADATA_KEY!r} record contradicts the weights: "
            f"{'; '.join(problems)}. gwdet's loading checks a model against that record, so it would advise the "
            "wrong config. Give the record of these weights (convert_state_dict's report.metadata()), or keep data "
            f"of your own under keys other than {ARCH_FIELD!r}, {GW_POSITIONS_FIELD!r} and {NORM_FIELD!r}; nothing "
            "was written.")


def _unplain_entry(value: object, where: str) -> tuple[str, object] | None:
    """The place (``metadata['a'][0]``) and value of the first part of ``value`` that is not plain data, or None."""
    if type(value) in _PLAIN_VALUES:  # not subclasses (numpy scalars, enums), which pickle as their classes
        return None
    if type(value) is dict:
        for key, item in value.items():
            if type(key) not in _PLAIN_VALUES:
                return f"a key of {where}", key
            found = _unplain_entry(item, f"{where}[{key!r}]")
            if found is not None:
                return found
        return None
    if type(value) in (list, tuple):
        for index, item in enumerate(cast(Sequence, value)):
            found = _unplain_entry(item, f"{where}[{index}]")
            if found is not None:
                return found
        return None
    return where, value


def _short_repr(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _refuse_existing(output_path: str, caller: str = "write_detectron2_pkl") -> None:
    raise ConversionError(
        f"{caller}: {output_path} already exists; it is left as it is. Pass overwrite=True (the "
        "tool's --overwrite) to replace it, or choose another output file.")


def _write_pkl(weights: dict[str, np.ndarray], output_path: str, author: str, metadata: Mapping[str, object] | None,
               overwrite: bool, seen: os.stat_result | None) -> None:
    """The writing of :func:`write_detectron2_pkl`, its checks done: ``output_path`` is renamed into
    place only while it is still ``seen`` (``None``: no file)."""
    checkpoint: dict[str, object] = {WEIGHTS_KEY: weights, AUTHOR_KEY: author, MATCHING_HEURISTICS_KEY: True}
    if metadata is not None:
        checkpoint[METADATA_KEY] = dict(metadata)
    checkpoint = with_checksums(checkpoint, WEIGHTS_KEY)
    try:
        write_atomically(output_path, lambda file: pickle.dump(checkpoint, file), exclusive=seen is None,
                         replacing=seen)
    except OutputExistsError:  # the file at output_path changed after it was seen: another process wrote it
        again = ("run this conversion again" if overwrite else
                 "pass overwrite=True (the tool's --overwrite)")
        raise ConversionError(
            f"{output_path} was written by another conversion while this one ran; it is left as it is and this "
            f"conversion's output discarded. Check which conversion you want there; {again} to replace it, "
            "or choose another output file.") from None
    except OSError as error:
        raise ConversionError(f"{output_path}: cannot write the output ({error}).") from None
