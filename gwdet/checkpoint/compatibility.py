"""Refusing weights that do not fit the model they are loaded into.

detectron2 loads mismatched weights with at most a logged warning (``FrozenBatchNorm2d`` fills
missing running statistics with 0 and 1). Converted weights record their architecture and GW
positions, gwdet's checkpoints the type and hyper-parameters of every norm layer, and gwdet's norm
layers their settings in the model's state (``<layer>._extra_state``,
:mod:`gwdet.layers.settings_state`); these are checked against the model before anything is loaded,
so weights of another architecture, or trained with other norms or other norm values (GW with 16
groups evaluated with 8), are refused. With the opt-in to load them anyway, the layers' recorded
settings are removed from the state first (:func:`drop_layer_settings`).
"""
from __future__ import annotations

import enum
import hashlib
import inspect
import re
import types
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np
import torch
from torch.nn.utils.parametrize import type_before_parametrizations
from detectron2.modeling.backbone import ResNet

from gwdet.errors import GwdetValueError, listed
from gwdet.checkpoint.converted_weights import ARCH_FIELD, ARCHITECTURES, GW_POSITIONS_FIELD, INPUT_FIELD, NORM_FIELD
from gwdet.layers import BatchGroupNorm, GroupWhitening
from gwdet.layers.settings_state import (EXTRA_STATE_KEY, SettingsInState, cast_record, function_settings,
                                         decode_settings, same_setting)
from gwdet.modeling.backbone import convs_with_norm
from gwdet.modeling.example_weighing import is_example_weighted
from gwdet.modeling.model_checks import PER_LEVEL_CONTAINERS
from gwdet.norms import (EMPTY_CELL, NORM_SETTINGS_MARK, RUNNING_STATISTICS_NORMS, TORCH_NORM_SETTINGS, cell_values,
                         layer_types, norm_classes, norm_records)
from gwdet.positions import convs_at_positions, format_gw_positions, parse_gw_positions, positions_with_norm
from gwdet.utils.cli_errors import as_override


class NormMismatchError(GwdetValueError):
    """A checkpoint whose norm layers are not the model's: ``finding`` says which; the message adds
    that nothing was loaded, and the fix."""

    def __init__(self, finding: str, fix: str) -> None:
        super().__init__(f"{finding}; nothing was loaded. {fix}")
        self.finding = finding


def unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The model a ``DistributedDataParallel`` or ``DataParallel`` wrapper holds (its ``module``), as
    detectron2's checkpointer unwraps it; any other model as it is (a child named ``module`` is
    one of its modules, not a wrapped model)."""
    if isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
        return model.module
    return model


def _resnet_of(model: torch.nn.Module) -> ResNet | None:
    return next((m for m in model.modules() if isinstance(m, ResNet)), None)


# The input settings of the converted weights' check as a LazyConfig names them (gwdet's and
# detectron2's: model.*; the ResNet's stages where gwdet's LazyConfigs build them)
LAZY_INPUT_SETTINGS = {"INPUT.FORMAT": "model.input_format", "MODEL.PIXEL_MEAN": "model.pixel_mean",
                       "MODEL.PIXEL_STD": "model.pixel_std",
                       "MODEL.RESNETS.STRIDE_IN_1X1": "the ResNet's stages.stride_in_1x1"}


def _check_input_format(expected: Mapping, model: torch.nn.Module, resnet: ResNet, lazy: bool) -> None:
    """``ValueError`` naming the keys to set when ``model`` feeds its ResNet images otherwise than
    the converted weights expect (colour order, pixel mean and std, stride in the 1x1 or 3x3 conv):
    such weights would load and train, on inputs they were never trained on. ``lazy``: named as a
    LazyConfig's values (:data:`LAZY_INPUT_SETTINGS`)."""
    found: dict[str, Any] = {}
    if hasattr(model, "input_format"):
        found["INPUT.FORMAT"] = model.input_format
    for key, name in (("MODEL.PIXEL_MEAN", "pixel_mean"), ("MODEL.PIXEL_STD", "pixel_std")):
        value = getattr(model, name, None)
        if isinstance(value, torch.Tensor):
            found[key] = [round(float(v), 3) for v in value.flatten()]
    blocks = [block for stage in resnet.stages[1:2] for block in stage[:1] if hasattr(block, "conv1")]
    if blocks:
        found["MODEL.RESNETS.STRIDE_IN_1X1"] = tuple(blocks[0].conv1.stride) != (1, 1)
    wanted = {"INPUT.FORMAT": expected.get("format"), "MODEL.PIXEL_MEAN": expected.get("pixel_mean"),
              "MODEL.PIXEL_STD": expected.get("pixel_std"), "MODEL.RESNETS.STRIDE_IN_1X1": expected.get("stride_in_1x1")}
    differing = []
    for key, value in wanted.items():
        if value is None or key not in found:
            continue
        if isinstance(value, list):
            same = len(value) == len(found[key]) and all(abs(float(a) - b) < 1e-3 for a, b in zip(value, found[key], strict=True))
        else:
            same = value == found[key]
        if not same:
            differing.append((key, found[key], value))
    if differing:
        if lazy:
            differing = [(LAZY_INPUT_SETTINGS[key], now, want) for key, now, want in differing]
        where = ("configs/LazyConfig/mask_rcnn_R_50_FPN_gw.py sets all of them" if lazy else
                 "configs/Base-RCNN-FPN.yaml sets all of them")
        raise GwdetValueError(
            "The weights were converted for images fed as torchvision feeds them, but the model differs: "
            + "; ".join(f"{key} is {now!r}, the weights expect {want!r}" for key, now, want in differing)
            + ". Set " + (" ".join(f"{key}={want!r}" for key, _, want in differing) if lazy else
                          " ".join(f"{key} {want!r}" for key, _, want in differing))
            + f" ({where}), or load weights converted for this input.")


# What the norms outside GW of a converted file are ("norm" of its record), and what that needs of
# the model's ResNet norms there: running statistics to load (BN), or none (GN).
_NORM_KINDS = {
    "BN": ("a BN model (its norms outside GW have running statistics)", "MODEL.RESNETS.NORM FrozenBN, BN or SyncBN"),
    "GN": ("a GN-style model (its norms outside GW have no running statistics)", "MODEL.RESNETS.NORM GN"),
}


def _fits_norm_kind(kind: str, norm: Any) -> bool:
    if kind == "GN":
        return isinstance(norm, torch.nn.GroupNorm)
    return all(isinstance(getattr(norm, name, None), torch.Tensor) for name in ("running_mean", "running_var"))


def _check_norm_kind(kind: str, resnet: ResNet, model: torch.nn.Module) -> None:
    """Refuse a ResNet whose norms outside GW cannot take the converted norms of ``kind``: BN
    statistics into GN layers (dropped, the GN layers given BN's scale and shift), or GN parameters
    into layers with running statistics (which then normalize with 0 and 1)."""
    names = {module: name for name, module in model.named_modules()}
    convs = [resnet.stem.conv1] + [conv for stage in resnet.stages for block in stage for conv in block.children()
                                   if hasattr(conv, "norm")]
    misfits = [conv.norm for conv in convs
               if not isinstance(conv.norm, GroupWhitening) and not _fits_norm_kind(kind, conv.norm)]
    if misfits:
        found = sorted({type(norm).__name__ if norm is not None else "no norm" for norm in misfits})
        where = listed([names.get(norm, "?") for norm in misfits if norm is not None] or ["every conv"], 2)
        source, setting = _NORM_KINDS[kind]
        raise GwdetValueError(
            f"The weights were converted from {source}, but the model's ResNet has {' and '.join(found)} there "
            f"({where}). Set {setting}, or load weights converted from a model with the ResNet's norms.")


# The settings that place GW in a ResNet, as a message names them: a yacs config's keys, and those of
# gwdet's LazyConfigs (their place_norm node at model.backbone.bottom_up)
YACS_PLACEMENT = {"positions": "MODEL.RESNETS.GW_POSITIONS", "norm": "MODEL.RESNETS.GW_NORM",
                  "base": "MODEL.RESNETS.NORM FrozenBN"}
LAZY_PLACEMENT = {"positions": "model.backbone.bottom_up.positions", "norm": "model.backbone.bottom_up.norm.name",
                  "base": "norm='FrozenBN' in the ResNet's stem and stages (model.backbone.bottom_up.resnet)"}


def check_weights_fit_model(metadata: Mapping, model: torch.nn.Module, lazy: bool = False) -> None:
    """Raise ``ValueError`` when converted weights (their ``"gwdet"`` metadata) misfit ``model``;
    ``lazy``: name the settings of gwdet's LazyConfigs in the fix (:data:`LAZY_PLACEMENT`)."""
    resnet = _resnet_of(model)
    if resnet is None:
        return
    arch_name = metadata.get(ARCH_FIELD)
    arch = ARCHITECTURES.get(arch_name) if arch_name is not None else None
    if arch is not None:
        first = resnet.stages[0][0]
        conv2 = first.conv2
        found = (tuple(len(stage) for stage in resnet.stages), conv2.groups, conv2.out_channels // conv2.groups)
        # A ResNet built for fewer OUT_FEATURES omits its last stages: compare the ones it has.
        expected_shape = (arch.blocks_per_stage[: len(found[0])], arch.num_groups, arch.width_per_group)
        widths = {"STEM_OUT_CHANNELS": (resnet.stem.out_channels, arch.stem_out_channels),
                  "RES2_OUT_CHANNELS": (first.out_channels, arch.res2_out_channels)}
        other_widths = {key: pair for key, pair in widths.items() if pair[0] != pair[1]}
        if found != expected_shape or other_widths:
            described = {"STEM_OUT_CHANNELS": "a stem of {} channels", "RES2_OUT_CHANNELS": "res2 of {} channels"}
            has = [f"blocks per stage {list(found[0])}", f"conv2 {found[1]} group(s) x {found[2]} channels",
                   *(described[key].format(pair[0]) for key, pair in other_widths.items())]
            settings = [f"MODEL.RESNETS.DEPTH {arch.depth}", f"NUM_GROUPS {arch.num_groups}",
                        f"WIDTH_PER_GROUP {arch.width_per_group}",
                        *(f"{key} {pair[1]}" for key, pair in other_widths.items())]
            raise GwdetValueError(
                f"The weights are {arch.describe()}, but the model's ResNet has {', '.join(has[:-1])} and {has[-1]}. "
                f"Set {', '.join(settings)}, or load the weights converted for this architecture.")
    if isinstance(metadata.get(INPUT_FIELD), Mapping):
        _check_input_format(metadata[INPUT_FIELD], model, resnet, lazy)
    if GW_POSITIONS_FIELD in metadata:
        _check_gw_positions(parse_gw_positions(metadata[GW_POSITIONS_FIELD]), resnet, model,
                            LAZY_PLACEMENT if lazy else YACS_PLACEMENT, metadata.get(NORM_FIELD))
    if metadata.get(NORM_FIELD) in _NORM_KINDS:
        _check_norm_kind(metadata[NORM_FIELD], resnet, model)


def _check_gw_positions(expected: frozenset, resnet: ResNet, model: torch.nn.Module, settings: Mapping[str, str],
                        kind: Any = None) -> None:
    """Refuse a ResNet without GW exactly at the weights' GW positions ``expected``: the positions
    placed elsewhere (the fix: ``settings["positions"]``, with the norm the weights' other norms
    need where the ResNet's do not fit their ``kind``: :func:`_check_norm_kind`), or another norm
    placed at them (the fix: ``settings["norm"]``), told apart by whether the norms there differ from
    the rest."""
    present = positions_with_norm(resnet, (GroupWhitening,))
    if expected == present:
        return
    shown = format_gw_positions(expected)
    at_positions = [conv.norm for conv in convs_at_positions(resnet, expected)]  # stem first, block by block
    placed = {type(norm) for norm in at_positions if not isinstance(norm, GroupWhitening)}
    at_position_ids = {id(norm) for norm in at_positions}
    elsewhere = {type(conv.norm) for conv in convs_with_norm(resnet) if id(conv.norm) not in at_position_ids}
    if placed and not placed <= elsewhere:  # a norm of its own at the positions: another GW_NORM
        names = {module: name for name, module in model.named_modules()}
        where = listed([names.get(norm, "?") for norm in at_positions if not isinstance(norm, GroupWhitening)], 2)
        raise GwdetValueError(
            f"The weights have GW at {shown!r}, but the model has {' and '.join(sorted(t.__name__ for t in placed))} "
            f"at those positions ({where}), so GW's parameters would load into other layers. Place GW there: "
            f"{as_override(settings['norm'], 'GW')} (or GW_ZCA), or load weights converted from a model with that norm.")
    if present > expected and all(isinstance(conv.norm, GroupWhitening) for conv in convs_with_norm(resnet)):
        raise GwdetValueError(  # GW_POSITIONS may be right already: the ResNet's other norms are GW too
            f"The weights have GW at {shown!r} (norms without running statistics) and other norms everywhere else, "
            "but every norm of the model's ResNet is GW, so those norms' values would load into GW layers. Set "
            f"{settings['base']} (or the norm the converter reported for the weights' other norms), keeping GW at "
            f"{shown!r}.")
    misfit = kind in _NORM_KINDS and any(not isinstance(conv.norm, GroupWhitening) and not _fits_norm_kind(kind, conv.norm)
                                         for conv in convs_with_norm(resnet))
    also = f" and {_NORM_KINDS[kind][1]}, as the weights were converted from {_NORM_KINDS[kind][0]}" if misfit else ""
    kept = "GN" if kind == "GN" else "BN statistics"
    raise GwdetValueError(
        f"The weights have GW at {shown!r} (norms without running statistics), but the model has GW at "
        f"{format_gw_positions(present)!r}. Set {as_override(settings['positions'], repr(shown))}{also}, so that {kept} "
        "and GW parameters each load into their own kind of layer.")


def check_statistics_have_a_layer(weights: Mapping[str, Any], model: torch.nn.Module, how_to_opt_in: str) -> None:
    """Raise ``ValueError`` when ``weights`` (a state dict, detectron2's key names or a shorter
    suffix of them, as its checkpointer matches ``.pkl`` files) hold batch norm's running
    statistics for a layer of ``model`` that keeps none (GW, GN): BN's scale and shift would load as
    that layer's affine and its statistics be dropped, another function without a word."""
    prefixes = {key.rsplit(".", 1)[0] for key in weights if key.endswith((".running_mean", ".running_var"))}
    if not prefixes:
        return
    without_statistics = (GroupWhitening, torch.nn.GroupNorm)
    layers = [name for name, module in unwrapped(model).named_modules()
              if isinstance(module, without_statistics) and name
              and any(name == prefix or name.endswith("." + prefix) for prefix in prefixes)]
    if layers:
        raise NormMismatchError(
            f"The weights hold batch norm statistics (running_mean, running_var) for {len(layers)} layer(s) that keep "
            f"none in this model ({listed(layers, 3)}): BN's scale and shift would load as their affine and the "
            "statistics be dropped, another function", "Build the model with BN where the weights "
            "have it (MODEL.RESNETS.GW_POSITIONS to where they have GW, \"\" for none; MODEL.RESNETS.NORM), or load "
            f"weights trained or converted for this model (tools/convert_pretrained.py), or {how_to_opt_in} to load "
            "them anyway.")


# ---- norm layer types recorded in gwdet's checkpoints ------------------------------------------

NORM_TYPES_KEY = "gwdet_norm_types"


def norm_layer_types() -> tuple[type, ...]:
    """The classes whose modules :func:`norm_types` records: the layer types of the norm
    catalogue's names (:func:`gwdet.norms.layer_types`), torch's and detectron2's norm classes
    however built (by LazyConfigs, say; :data:`gwdet.norms.TORCH_NORM_SETTINGS`), and the
    containers that keep one norm per FPN level."""
    return norm_classes() + PER_LEVEL_CONTAINERS


def _always_recorded_types() -> tuple[type, ...]:
    """The classes of :func:`norm_layer_types` that every process records, whatever names it
    registered: the layer types of gwdet's and detectron2's built-in norm names, torch's and
    detectron2's norm classes, and the per-level containers. A checkpoint's record of norm types
    without an entry at a place held no layer of these classes there."""
    built_in = tuple(kind for record in norm_records() if record.builtin for kind in record.layer_types)
    return built_in + tuple(kind for kind, _ in TORCH_NORM_SETTINGS) + PER_LEVEL_CONTAINERS


def _untyped_place(name: str, layer: torch.nn.Module, saved_types: Mapping[str, str]) -> bool:
    """Whether ``layer`` (the model's module ``name``) is of a class every checkpoint records
    (:func:`_always_recorded_types`) while ``saved_types``, a checkpoint's record of norm types,
    has no entry at ``name``: the checkpoint's layer there was of another kind (a registered norm's
    layer whose class no catalogue names, or a callable norm's)."""
    return name not in saved_types and isinstance(layer, _always_recorded_types())


def _registered_names_taking(values: Mapping[str, Any]) -> list[str]:
    """The norm names registered with :func:`gwdet.norms.register_norm` (not the built-in ones)
    whose build takes every one of ``values``' settings."""
    return [record.name for record in norm_records() if not record.builtin and set(values) <= set(record.params())]


def norm_types(model: torch.nn.Module) -> dict[str, str]:
    """``{module name: class name}`` of every norm layer of ``model`` (DDP's ``module.`` dropped; a
    layer with a ``torch.nn.utils.parametrize`` parametrization by its own class, not torch's subclass)."""
    kinds = norm_layer_types()
    modules = dict(unwrapped(model).named_modules())
    return {name: type_before_parametrizations(modules[name]).__name__ for name, module in modules.items()
            if name and isinstance(module, kinds)}


_RUNNING_STATISTICS_NAMES = frozenset(kind.__name__ for kind in RUNNING_STATISTICS_NORMS)


def same_norm_kind(saved: str, present: str) -> bool:
    """Whether a norm layer of class name ``saved`` in a checkpoint is the function of one of class
    name ``present`` with its weights: the same class, or two of :data:`gwdet.norms.RUNNING_STATISTICS_NORMS`
    (BN-trained weights into FrozenBN)."""
    return saved == present or {saved, present} <= _RUNNING_STATISTICS_NAMES


# A layer of RUNNING_STATISTICS_NORMS without a batch norm's attribute (FrozenBatchNorm2d) as the function of
# that setting: it normalizes with its running statistics (track_running_stats True). It keeps a weight of 1 and
# a bias of 0 where a batch norm without them (affine False) saved none, and does not train (momentum): a
# recorded affine or momentum makes no difference to it.
FROZEN_BATCH_NORM_SETTINGS: Mapping[str, Any] = types.MappingProxyType({"track_running_stats": True})
_FROZEN_INDIFFERENT_SETTINGS = ("affine", "momentum")


def _with_frozen_settings(layer: torch.nn.Module | None, values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` (a layer's :func:`norm_settings`) with, for a ``layer`` of
    :data:`gwdet.norms.RUNNING_STATISTICS_NORMS` that lacks them, the batch norm settings it has as
    a function (:data:`FROZEN_BATCH_NORM_SETTINGS`); any other layer's as they are."""
    if not isinstance(layer, RUNNING_STATISTICS_NORMS):
        return dict(values)
    return {**{key: value for key, value in FROZEN_BATCH_NORM_SETTINGS.items() if key not in values}, **values}


def check_norm_types(saved: Mapping[str, str], model: torch.nn.Module, how_to_opt_in: str,
                     saved_settings: Mapping[str, Any] | None = None) -> None:
    """Raise ``ValueError`` when a norm layer of ``model``, or the layer at a recorded norm's place,
    had another type in the saved model (:func:`same_norm_kind`), or a layer that had a norm has none
    now: its weights (a GN's affine into a GW, say) would load without a word into the wrong layer,
    or not at all. With ``saved_settings`` (the checkpoint's record of norm settings), a place it
    records values for and ``saved`` no type, where ``model`` has a layer of a class every
    checkpoint records (:func:`_untyped_place`: a GW layer where a registered norm, ``'Scale'`` with
    ``scale 2.0``, built a layer of its own class), is refused too, naming the registered norms
    whose build takes those values. Batch norms met by layers that
    :func:`gwdet.modeling.apply_example_weighing` made are named so, with the order that loads them
    (the weights first, then the example weighing)."""
    modules = dict(unwrapped(model).named_modules())  # a recorded norm's place may hold a layer of no known norm now
    present = {name: type_before_parametrizations(modules[name]).__name__ for name in saved if name in modules} | \
        norm_types(model)
    # a norm taken out of a layer that is still there (its conv without one: NORM ""); a part the model lacks
    # as a whole (a mask head's norms in a box-only model) is not a norm of this model's to compare
    removed = {name: "no norm" for name in saved if name not in modules and "." in name
               and name.rsplit(".", 1)[0] in modules}
    differing = [f"{name}: {saved[name]} -> {kind}" for name, kind in (present | removed).items()
                 if name in saved and not same_norm_kind(saved[name], kind)]
    for name, values in (saved_settings or {}).items():
        layer = modules.get(name) if isinstance(name, str) and name else None
        if layer is None or not isinstance(values, Mapping) or not values or not _untyped_place(name, layer, saved):
            continue
        names = " or ".join(map(repr, _registered_names_taking(values)))
        shown = ", ".join(f"{key} {value!r}" for key, value in values.items())
        differing.append(f"{name}: a layer {f'of the norm {names} ' if names else ''}({shown}), of a class the "
                         f"checkpoint does not record -> {type_before_parametrizations(layer).__name__}")
    weighed = [name for name, kind in present.items() if name in saved and not same_norm_kind(saved[name], kind)
               and saved[name] in _RUNNING_STATISTICS_NAMES and is_example_weighted(modules[name])]
    if differing and len(weighed) == len(differing):
        raise NormMismatchError(
            f"The checkpoint holds batch norms where this model has example-weighted BatchGroupNorm layers: "
            f"apply_example_weighing replaced them before the weights were loaded ({len(differing)} layers, e.g. "
            f"{'; '.join(differing[:3])})", "Load the batch-norm weights into the model first and apply "
            "apply_example_weighing(model, weight) afterwards, as tools/compare_norms.py does with a trained model "
            "(build the model, load the checkpoint, then apply example weighing)."
        )
    if differing:
        raise NormMismatchError(
            f"The checkpoint was trained with other norm layers than this config builds "
            f"({len(differing)} layers, e.g. {'; '.join(differing[:3])})", "Load "
            f"weights trained with this config's NORM values (a LazyConfig's norm nodes), or {how_to_opt_in} to load them anyway."
        )


# ---- norm hyper-parameters recorded in gwdet's checkpoints --------------------------------------

NORM_SETTINGS_KEY = "gwdet_norm_settings"


def norm_setting_names() -> tuple[tuple[type, tuple[str, ...]], ...]:
    """The attributes that make each kind of norm layer the function it is (the first class a
    layer is an instance of counts): those the catalogue's layer types name, gwdet's layers
    (``HYPER_PARAMETERS``, what their state dicts record besides channels and ``affine``; a
    subclass before the class it derives from), then torch's and detectron2's
    (:data:`gwdet.norms.TORCH_NORM_SETTINGS`)."""
    named = sorted((kind for kind in layer_types() if issubclass(kind, SettingsInState)),
                   key=lambda kind: -len(kind.__mro__))
    return tuple((kind, kind.HYPER_PARAMETERS) for kind in named) + TORCH_NORM_SETTINGS


# the mark of a Python object's default repr (<Foo object at 0x7f...>), which names no value
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


class UnrecordableSettingError(GwdetValueError):
    """A norm setting that a checkpoint cannot record as plain data (:func:`plain_setting`)."""


def _import_path(value: Any) -> str:
    """The dotted path a class, function or module is imported by (``torch.nn.modules.activation.ReLU``)."""
    if isinstance(value, types.ModuleType):
        return value.__name__
    module = getattr(value, "__module__", None)
    name = getattr(value, "__qualname__", None) or getattr(value, "__name__", None) or repr(value)
    return f"{module}.{name}" if module else str(name)


def _code_digest(code: types.CodeType) -> str:
    """12 hexadecimal digits of the SHA-256 of what ``code`` computes: its bytecode, the names it
    reads and its constants (a nested function's code by its own digest, a frozenset's members in
    sorted order), not where it stands in its file. The bytecode is the interpreter's: another
    Python version gives another digest."""
    digest = hashlib.sha256(code.co_code)
    digest.update(repr(code.co_names).encode())
    for constant in code.co_consts:
        shown = _code_digest(constant) if isinstance(constant, types.CodeType) else \
            repr(sorted(map(repr, constant))) if isinstance(constant, frozenset) else repr(constant)
        digest.update(shown.encode())
    return digest.hexdigest()[:12]


def _routine_record(value: Any) -> str:
    """A class, module or function as its import path. A function its path does not name alone (one
    defined inside another function, ``make.<locals>.scale``, a lambda, or one of the script run as
    ``__main__``, which no other process imports by that path) with a digest of its code
    (:func:`_code_digest`) and the values it holds (closure cells, default arguments: :func:`plain_setting`
    of each), so that two lambdas, a script's function edited between saving and loading, or two
    functions one factory made with other values are recorded apart; a bound method with the object
    it is bound to. A module-level function of an importable module is recorded by its path alone."""
    path = _import_path(value)
    if isinstance(value, types.MethodType):
        return f"{path} of {plain_setting(value.__self__)!r}"
    if not (inspect.isfunction(value) and ("<locals>" in value.__qualname__ or "<lambda>" in value.__qualname__
                                           or value.__module__ == "__main__")):
        return path
    held = {"closure": [plain_setting(item) for item in cell_values(value) if item is not EMPTY_CELL],
            "defaults": plain_setting(value.__defaults__ or ()),
            "keyword defaults": plain_setting(value.__kwdefaults__ or {})}
    return " ".join([path, f"code {_code_digest(value.__code__)}"]
                    + [f"{what} {shown!r}" for what, shown in held.items() if shown])


def plain_setting(value: Any) -> Any:
    """A norm setting ``value`` as plain data, what a checkpoint records and torch's weights-only
    loading reads back: numbers, strings, ``True``/``False`` and ``None`` as they are; a list, a tuple
    or a LazyConfig node's ``ListConfig`` as a list, a mapping (a ``DictConfig``) as a dict, a set as
    a sorted list, each of plain values; a numpy number as a Python number; a tensor or array as the
    list of its values; a dtype or device as its name (``'torch.float64'``); a class, function or
    module as its import path (``'torch.nn.modules.activation.ReLU'``), an enum member as its
    class's path and name; any other object as its ``repr`` where that shows its values
    (``functools.partial(...)``, ``ReLU(inplace=True)``). An object whose ``repr`` names only where it
    is in memory is refused (:class:`UnrecordableSettingError`): no record could tell two of them
    apart."""
    if isinstance(value, enum.Enum):
        return f"{_import_path(type(value))}.{value.name}"
    if isinstance(value, np.generic) and not isinstance(value, (np.bytes_, np.void)):
        value = value.item()
    if value is None:
        return None
    for kind in (bool, int, float, str):  # a subclass (numpy's float64) as the plain type
        if isinstance(value, kind):
            return kind(value)
    if isinstance(value, torch.Tensor) and not value.is_meta:
        return value.detach().cpu().tolist()
    if isinstance(value, np.ndarray) and value.dtype.kind in "biufc":
        return value.tolist()
    if isinstance(value, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return str(value)
    if isinstance(value, Mapping):
        return {key if key is None or isinstance(key, (bool, int, float, str)) else repr(plain_setting(key)):
                plain_setting(item) for key, item in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        return [plain_setting(item) for item in value]
    if isinstance(value, (set, frozenset)):
        return sorted((plain_setting(item) for item in value), key=repr)
    if isinstance(value, (type, types.ModuleType)) or inspect.isroutine(value):
        return _routine_record(value)
    shown = repr(value)
    if _ADDRESS.search(shown):
        raise UnrecordableSettingError(
            f"{shown} ({type(value).__name__}) is no value a checkpoint can record: its repr names where it is in "
            "memory, not what it holds")
    return shown


def _plain_or_shown(value: Any) -> Any:
    """:func:`plain_setting` of ``value``; one it refuses as its ``repr``, to be compared (a recorded
    value never equals it)."""
    try:
        return plain_setting(value)
    except UnrecordableSettingError:
        return repr(value)


def norm_settings(model: torch.nn.Module, for_saving: bool = False) -> dict[str, dict[str, Any]]:
    """``{module name: {hyper-parameter: value}}`` of every norm layer of ``model`` that has any: the
    attributes :func:`norm_setting_names` names, and for a layer a registered norm name built, the
    values it was built with (:data:`gwdet.norms.NORM_SETTINGS_MARK`), each as plain data
    (:func:`plain_setting`), so that the checkpoint that records them loads without unpickling code.
    ``for_saving``: a value that cannot be recorded is refused, naming the layer, the setting and
    the fix (else it is kept as its ``repr``, which no recorded value equals)."""
    model = unwrapped(model)
    settings = norm_setting_names()
    found = {}
    for name, module in model.named_modules():
        names = next((attributes for kind, attributes in settings if isinstance(module, kind)), ())
        built_with = getattr(module, NORM_SETTINGS_MARK, None)
        values = {attribute: getattr(module, attribute) for attribute in names}
        if isinstance(built_with, dict):  # a registered name's layer: a subclass of gwdet's may add settings
            values.update(built_with)
        if not (name and values):
            continue
        if not for_saving:
            found[name] = {setting: _plain_or_shown(value) for setting, value in values.items()}
            continue
        found[name] = {}
        for setting, value in values.items():
            try:
                found[name][setting] = plain_setting(value)
            except UnrecordableSettingError:
                raise UnrecordableSettingError(
                    f"The norm layer {name} ({type(module).__name__}) was built with {setting}={value!r} "
                    f"({type(value).__name__}), which a checkpoint cannot record: its repr names where it is in memory, "
                    "not what it holds, so no checkpoint could tell whether weights loaded into the layer were trained "
                    "with the same value. Give "
                    f"{setting} as plain data (a number, string, list or dict of them; a class or function, which "
                    f"checkpoints record by its import path), or give {type(value).__name__} a __repr__ that shows "
                    "the values that make it what it is.") from None
    return found


def check_norm_settings(saved: Mapping[str, Mapping[str, Any]], model: torch.nn.Module, how_to_opt_in: str,
                        saved_types: Mapping[str, str] | None = None) -> None:
    """Raise ``ValueError`` naming the layers and values when a norm layer of ``model`` has other
    hyper-parameters than the saved model had (the weights load, but into another function); a
    layer of another kind than ``saved_types`` records (:func:`check_norm_types` names it) is
    not compared. A FrozenBatchNorm2d is compared as the batch norm it computes as
    (:data:`FROZEN_BATCH_NORM_SETTINGS`: weights of a batch norm without running statistics are
    refused)."""
    modules = dict(unwrapped(model).named_modules())
    present = {name: _with_frozen_settings(modules.get(name), values) for name, values in norm_settings(model).items()}
    if saved_types:
        present = {name: values for name, values in present.items()
                   if same_norm_kind(saved_types.get(name, type(modules[name]).__name__), type(modules[name]).__name__)}
    _refuse_other_settings(saved, present, how_to_opt_in, model)


class UncomparedSettings(NamedTuple):
    """A layer whose recorded norm values :func:`uncompared_norm_settings` finds uncompared."""

    layer: str  # the module's name
    kind: str  # its class name
    names: tuple[str, ...]  # the registered norm names that build it (by values or layer_types); may be empty
    values: dict[str, Any]  # the recorded values the layer has none of


def uncompared_norm_settings(saved: Mapping[str, Mapping[str, Any]], model: torch.nn.Module,
                             saved_types: Mapping[str, str] | None = None) -> list[UncomparedSettings]:
    """The layers of ``model`` built without :func:`gwdet.norm` (no
    :data:`gwdet.norms.NORM_SETTINGS_MARK`) for which ``saved`` records values the layer holds none
    of (a registered name's own settings, ``scale`` say), so that :func:`check_norm_settings`
    compares nothing of them; a layer of another kind than ``saved_types`` records, or of a class
    every checkpoint records at a place ``saved_types`` has no entry for (:func:`_untyped_place`),
    is left out (:func:`check_norm_types` names it). The norm names are the registered ones
    (:func:`gwdet.norms.register_norm`) whose build takes every such value, else those of the
    layer's type (``layer_types``); none where no registered name fits. A batch norm's values that
    make no difference to a FrozenBatchNorm2d (:data:`FROZEN_BATCH_NORM_SETTINGS`) are no
    uncompared values of it."""
    present = norm_settings(model)
    modules = dict(unwrapped(model).named_modules())
    records = [record for record in norm_records() if not record.builtin]
    found = []
    for name, recorded in saved.items():
        layer = modules.get(name) if isinstance(name, str) and name else None
        if layer is None or not isinstance(recorded, Mapping) or isinstance(getattr(layer, NORM_SETTINGS_MARK, None), dict):
            continue
        kind = type_before_parametrizations(layer).__name__
        if saved_types is not None and (not same_norm_kind(saved_types.get(name, kind), kind)
                                        or _untyped_place(name, layer, saved_types)):
            continue
        compared = _with_frozen_settings(layer, present.get(name, {}))
        indifferent = _FROZEN_INDIFFERENT_SETTINGS if isinstance(layer, RUNNING_STATISTICS_NORMS) else ()
        values = {key: value for key, value in recorded.items() if key not in compared and key not in indifferent}
        if not values:
            continue
        taking = _registered_names_taking(values)
        owners = [record.name for record in records if isinstance(layer, record.layer_types) or record.name in taking]
        found.append(UncomparedSettings(name, kind, tuple(taking or owners), values))
    return found


def _function_of(layer: torch.nn.Module | None, values: Mapping[str, Any]) -> dict[str, Any]:
    """The settings ``values`` of ``layer`` as the function they make it
    (:func:`~gwdet.layers.settings_state.function_settings`: a group count as the layer's channels
    round it, no ``T`` for ZCA, none of :data:`~gwdet.layers.settings_state.UNCOMPARED_SETTINGS`)."""
    channels = getattr(layer, "num_channels", None)
    return function_settings(type(layer).__name__, {**values, **({"num_channels": channels} if channels else {})})


def _batch_group_norm_name(layer: torch.nn.Module | None, function: Mapping[str, Any]) -> str | None:
    """The norm name whose layer ``layer`` is with the function settings ``function``
    (:func:`_function_of`) when it is a :class:`~gwdet.layers.BatchGroupNorm` of known channels:
    ``"GhostBN"`` for one channel per group (the layer GhostBN builds), else ``"BGN"``; ``None``
    for any other layer, or when the group count is not known."""
    channels, groups = getattr(layer, "num_channels", None), function.get("num_groups")
    if not isinstance(layer, BatchGroupNorm) or not isinstance(channels, int) or not isinstance(groups, int):
        return None
    return "GhostBN" if groups == channels else "BGN"


def _refuse_other_settings(saved: Mapping[str, Mapping[str, Any]], present: Mapping[str, Mapping[str, Any]],
                           how_to_opt_in: str, model: torch.nn.Module) -> None:
    """Raise ``ValueError`` naming up to three values that differ between ``saved`` and ``present``
    (``{layer: {setting: value}}`` of ``model``'s layers) and make another function of the layer
    (:func:`_function_of`: 64 groups requested of 16 channels are the 16 groups of a request of
    16); layers and values that ``saved`` lacks are not compared. A BatchGroupNorm whose group
    count makes it another norm name's layer (BGN with one channel per group is GhostBN's,
    :func:`_batch_group_norm_name`) is refused naming the two norms, whose names, not MODEL.BGN
    values, tell them apart."""
    layers = dict(unwrapped(model).named_modules())
    differing, renamed = [], []
    for name, values in present.items():
        if not isinstance(saved.get(name), Mapping):
            continue
        # both as plain data: an older file's tuple, a layer's own tuple or ListConfig, compare as lists
        recorded = {key: _plain_or_shown(value) for key, value in saved[name].items()}
        current = {key: _plain_or_shown(value) for key, value in values.items()}
        was, now = _function_of(layers.get(name), recorded), _function_of(layers.get(name), current)
        differing += [f"{name} {key} {recorded[key]!r} -> {value!r}" for key, value in current.items()
                      if key in recorded and not same_setting(recorded[key], value)
                      and not same_setting(was.get(key), now.get(key))]
        kinds = (_batch_group_norm_name(layers.get(name), was), _batch_group_norm_name(layers.get(name), now))
        if None not in kinds and kinds[0] != kinds[1]:
            trained = (f"gwdet.norm('BGN', num_groups={recorded.get('num_groups')!r})" if kinds[0] == "BGN"
                       else "gwdet.norm('GhostBN')")
            renamed.append((f"{name}: BGN with num_groups {recorded.get('num_groups')!r} -> GhostBN" if kinds[0] == "BGN"
                            else f"{name}: GhostBN -> BGN with num_groups {current.get('num_groups')!r}", trained))
    if renamed:
        raise NormMismatchError(
            f"The checkpoint was trained with another norm than this config builds ({len(renamed)} layers, e.g. "
            f"{'; '.join(finding for finding, _ in renamed[:3])}): both names build a BatchGroupNorm, GhostBN with one channel per group, so "
            "they differ in the norm's name, not in a MODEL.BGN value (GhostBN takes no num_groups and ignores "
            "MODEL.BGN.NUM_GROUPS)", "Build the norm the weights were trained with: set its name (the run's "
            "config.yaml: the NORM keys, e.g. MODEL.RESNETS.NORM and MODEL.FPN.NORM; a LazyConfig's norm nodes, e.g. "
            f"{renamed[0][1]}), or {how_to_opt_in} to load them anyway."
        )
    if differing:
        raise NormMismatchError(
            f"The checkpoint was trained with other norm hyper-parameters than this config gives its layers "
            f"({len(differing)} values, e.g. {'; '.join(differing[:3])})", "Use the values "
            "the weights were trained with (the run's config.yaml: MODEL.GW.*, MODEL.BW.*, MODEL.BGN.*, "
            "MODEL.GN.NUM_GROUPS, and for a method the norm's name, GW or GW_ZCA, BW or BW_ItN, in MODEL.RESNETS.GW_NORM and the "
            "NORM keys; a LazyConfig's: the norm nodes' values, e.g. model.backbone.norm.num_groups), "
            f"or {how_to_opt_in} to load them anyway."
        )


# ---- settings recorded by gwdet's layers in the model's state ---------------------------------

def _recording_layers(model: torch.nn.Module) -> dict[str, SettingsInState]:
    """``{state dict key of its settings: layer}`` for every gwdet layer of ``model`` (DDP's
    ``module.`` dropped) that records its settings in its state."""
    model = unwrapped(model)
    return {f"{name}.{EXTRA_STATE_KEY}" if name else EXTRA_STATE_KEY: module
            for name, module in model.named_modules() if isinstance(module, SettingsInState)}


def _saved_key(weights: Mapping[str, Any], key: str, suffix: bool = False) -> str | None:
    """The key of ``weights`` that holds ``key``'s value: itself, or with DDP's ``module.``; with
    ``suffix``, else the one key of ``weights`` that ``key`` ends with after a dot (a converted
    backbone's ``stem.conv1.norm._extra_state`` for ``backbone.bottom_up.stem.conv1.norm._extra_state``,
    as detectron2's checkpointer matches such files)."""
    exact = next((found for found in (key, "module." + key) if found in weights), None)
    if exact is not None or not suffix:
        return exact
    tails = [found for found in weights if key.endswith("." + found)]
    return tails[0] if len(tails) == 1 else None


def check_layer_settings(weights: Mapping[str, Any], model: torch.nn.Module, how_to_opt_in: str) -> None:
    """Raise ``ValueError`` before anything is loaded when a gwdet layer of ``model`` recorded
    other settings in ``weights`` (a state dict) than it has: another layer class (as
    :func:`check_norm_types`; also where a gwdet layer's record meets a layer of another kind, a
    GroupNorm say) or other values (as :func:`check_norm_settings`: its hyper-parameters,
    and its channel count and ``affine``). A record that is not gwdet's settings is refused naming its key. Layers without a
    record (states saved before the layers recorded settings) are not compared."""
    saved_types: dict[str, str] = {}
    saved_settings: dict[str, dict[str, Any]] = {}
    present: dict[str, dict[str, Any]] = {}
    for key, layer in _recording_layers(model).items():
        found = _saved_key(weights, key, suffix=True)
        if found is None:
            continue
        saved = decode_settings(weights[found])
        name = key[: -len(EXTRA_STATE_KEY)].rstrip(".")
        if saved is None:
            raise GwdetValueError(f"The checkpoint's {found} is not the settings a gwdet norm layer records"
                                  f"{cast_record(weights[found])}, so "
                                  f"the weights of {name or 'the model'} cannot be checked against the layer; "
                                  "load an unchanged checkpoint of this model.")
        saved_types[name] = saved.pop("layer")
        saved_settings[name] = saved
        present[name] = layer.settings()
    module_names = [name for name, _ in unwrapped(model).named_modules() if name]
    for found, value in weights.items():  # gwdet layers' records where the model has a layer of another kind
        if not found.endswith(EXTRA_STATE_KEY):
            continue
        name = _module_of_record(found[: -len(EXTRA_STATE_KEY)].rstrip(".").removeprefix("module."), module_names)
        saved = decode_settings(value) if name not in saved_types else None
        if saved is not None:
            saved_types[name] = saved["layer"]
    check_norm_types(saved_types, model, how_to_opt_in)
    _refuse_other_settings(saved_settings, present, how_to_opt_in, model)


def _module_of_record(name: str, module_names: list[str]) -> str:
    """The module of the model that a record of ``name`` loads into: ``name`` itself, else the one
    module whose name ends with ``"." + name`` (a converted backbone's ``stem.conv1.norm`` for
    ``backbone.bottom_up.stem.conv1.norm``, as detectron2's checkpointer matches such files), else
    ``name`` as it is."""
    if name in module_names:
        return name
    tails = [module for module in module_names if module.endswith("." + name)]
    return tails[0] if len(tails) == 1 else name


def check_unrecorded_weights(weights: Mapping[str, Any], model: torch.nn.Module, how_to_opt_in: str,
                             types_recorded: bool = False, saved_types: Mapping[str, str] | None = None) -> None:
    """Raise ``ValueError`` before anything is loaded when ``weights`` (a state dict from a file that
    records no norm settings: not written by gwdet's checkpointer or converter, or, with
    ``types_recorded``, by one that recorded the norm types only) hold the affine weights of gwdet
    layers of ``model`` without the settings those layers save in their state: weights of other
    layers with the same shapes (a GN or LN model's, saved by detectron2's own checkpointer), or of
    these layers with other group numbers, that would load without a word. ``saved_types``: the
    record of norm types of a file that records the norm settings too; only layers at places it has
    no entry for are refused (a gwdet layer is recorded wherever a checkpoint holds one, so the
    weights there come from a layer of another kind: a norm registered without ``layer_types``, or
    given as a callable, records no type)."""
    layers = []
    for key, layer in _recording_layers(model).items():
        name = key[: -len(EXTRA_STATE_KEY)].rstrip(".")
        if saved_types is not None and name in saved_types:
            continue
        if _saved_key(weights, f"{name}.weight" if name else "weight") and _saved_key(weights, key) is None:
            layers.append(f"{name or 'the model'} ({type(layer).__name__})")
    if not layers:
        return
    if saved_types is not None:
        why = ("and the file's record of norm types has no norm layer at these places (it records every gwdet layer "
               "it holds): they come from layers of another kind with the same shapes (a norm registered without "
               "layer_types, or given as a callable, records no type: register it with layer_types=(TheClass,) to "
               "have its layers recorded), so they were not trained as these layers")
    elif types_recorded:
        why = ("nor gwdet's record of the norm settings (the file records the norm types only), so whether they were "
               "trained with these layers' settings (their group numbers) cannot be checked")
    else:
        why = ("nor gwdet's record of the norm types: they come from other layers with the same shapes (a GN model's, "
               "saved by detectron2's own checkpointer) or from a file gwdet did not write, so whether they were "
               "trained as these layers cannot be checked")
    raise NormMismatchError(
        f"The checkpoint holds weights for {len(layers)} gwdet norm layer(s) of this model ({listed(layers, 3)}) "
        f"but not the settings these layers save with their weights ({EXTRA_STATE_KEY}), {why}",
        "Load weights trained with this config (gwdet's checkpoints record their norms), or "
        f"{how_to_opt_in} to load them anyway.")


def check_statistics_in_weights(weights: Mapping[str, Any], model: torch.nn.Module, how_to_opt_in: str,
                                suffix: bool = False) -> None:
    """Raise ``ValueError`` before anything is loaded when ``weights`` (a state dict from a file that
    records no norm types) hold the affine weights of layers of ``model`` that keep running
    statistics (BN, FrozenBN) but no statistics for them: they come from norm layers without any (GN,
    GW), and the layers would normalize with detectron2's defaults, mean 0 and variance 1. ``suffix``:
    the weights' names are matched by their ends (a ``.pkl`` that detectron2 matches so)."""
    layers = [f"{name} ({type(module).__name__})" for name, module in unwrapped(model).named_modules()
              if name and isinstance(getattr(module, "running_mean", None), torch.Tensor)
              and _saved_key(weights, f"{name}.weight", suffix)
              and _saved_key(weights, f"{name}.running_mean", suffix) is None
              and _saved_key(weights, f"{name}.running_var", suffix) is None]
    if layers:
        raise NormMismatchError(
            f"The checkpoint holds the affine weights of {len(layers)} layer(s) that keep running statistics in this "
            f"model ({listed(layers, 3)}) but no statistics for them: they were trained in norm layers without any "
            "(GN, GW, ...), and these layers would normalize with mean 0 and variance 1", "Build the model with the "
            "norms the weights were trained with (MODEL.RESNETS.NORM GN, say; a LazyConfig's norm nodes), or "
            f"{how_to_opt_in} to load them anyway.")


def unrecorded_group_norms(weights: Mapping[str, Any], model: torch.nn.Module) -> list[str]:
    """The ``GroupNorm`` layers of ``model`` (``"name (N groups)"``) whose affine weights ``weights``
    hold (a state dict from a file without gwdet's records of norm settings): torch's GroupNorm
    saves no group number, so nothing can tell whether they were trained with the model's."""
    return [f"{name} ({module.num_groups} groups)" for name, module in unwrapped(model).named_modules()
            if type(module) is torch.nn.GroupNorm and module.affine and _saved_key(weights, f"{name}.weight")]


def drop_layer_settings(weights: dict[str, Any], model: torch.nn.Module) -> None:
    """Remove from ``weights`` the settings that ``model``'s gwdet layers recorded: the layers then
    load the weights whatever settings they were saved with (the opt-in to load other norm values)."""
    for key in _recording_layers(model):
        found = _saved_key(weights, key)
        if found is not None:
            del weights[found]
