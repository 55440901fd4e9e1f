"""Norm names -> layers, with their hyper-parameters carried explicitly.

detectron2 builds norm layers with ``get_norm(norm, channels)``, where ``norm`` is one of its own
names or any callable ``channels -> nn.Module``. gwdet plugs into the second form and never
changes ``get_norm``: :func:`norm` returns a :class:`Norm`, a callable that holds a norm name and
all of its hyper-parameters::

    gwdet.norm("GW", num_groups=16)          # Norm('GW', num_groups=16, T=5, eps=1e-05)
    FPN(..., norm=gwdet.norm("GW", num_groups=16))
    L(FastRCNNConvFCHead)(..., conv_norm=L(gwdet.norm)(name="GW", num_groups=16))   # LazyConfig

With a yacs config, :func:`norm_from_config` turns a NORM string into a :class:`Norm` carrying
that config's values (``MODEL.GW.*``, ...); gwdet's registered backbones and heads call it in
their ``from_config``. Nothing is kept between builds: the values travel with the callable.

Hyper-parameters left out of :func:`norm` take the defaults of gwdet's config table
(:mod:`gwdet.config`), so the Python API and the config agree.

Registering a name of your own::

    @gwdet.register_norm("MyGN", config_keys={"num_groups": "MODEL.MY_GN.NUM_GROUPS"})
    def my_gn(channels: int, num_groups: int = 16) -> torch.nn.Module:
        return torch.nn.GroupNorm(num_groups, channels)
"""
from __future__ import annotations

import copy
import difflib
import functools
import inspect
import logging
import math
import multiprocessing
from collections import defaultdict
from dataclasses import dataclass, field
from types import GetSetDescriptorType, MappingProxyType, MemberDescriptorType
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import torch
import detectron2.layers.batch_norm as detectron2_batch_norm
from detectron2.config import CfgNode, get_cfg
from detectron2.layers import get_norm as detectron2_get_norm
from detectron2.utils.logger import log_first_n

from gwdet.errors import GwdetAttributeError, GwdetError, GwdetKeyError, GwdetTypeError, GwdetValueError, listed
from gwdet.config import (CONFIG_KEYS, GWDET_RESNETS_PREFIX, GWDET_SECTIONS, add_gwdet_config, check_config_values,
                          config_default, config_value, flatten_config, refuse_a_mapping_as_a_config,
                          require_gwdet_config)
from gwdet.layers import BatchGroupNorm, BatchWhitening, GroupWhitening, largest_divisor_at_most
from gwdet.layers.common import check_flag, check_int_at_least, is_real_number, is_whole_number

DETECTRON2_GN_GROUPS = 32  # detectron2's get_norm("GN") always has 32 groups
_CHECKS = {key.name: key.check for key in CONFIG_KEYS}
_REQUIRED = inspect.Parameter.empty
# Set on every module a norm name registered with register_norm builds, so that the optimizer
# treats it as a norm (gwdet.solver.is_norm_layer) whether or not the name gave its layer_types;
# every other norm layer is recognised by its class.
NORM_LAYER_MARK = "_gwdet_norm_layer"
# Set beside it: the values the registered name built the module with ({setting: value}), which gwdet's
# checkpoints record for a layer of a class whose settings they do not know (gwdet.checkpoint.compatibility)
NORM_SETTINGS_MARK = "_gwdet_norm_settings"
# Classes that hold modules of any kind: never a norm's layer type (register_norm)
_GENERIC_MODULES = (torch.nn.Module, torch.nn.Sequential, torch.nn.ModuleList, torch.nn.ModuleDict)


class UnknownNormError(GwdetError, KeyError):
    """A norm name nobody registered. A ``KeyError``, like detectron2's own lookup failure."""

    def __str__(self) -> str:  # KeyError would print the message with quotes around it
        return str(self.args[0])


@dataclass(frozen=True)
class NormRecord:
    """Everything gwdet knows about one norm name; every check asks the catalogue, not a list.

    * ``build(channels, **params)`` makes the layer; ``config_keys`` maps each param to its yacs key.
    * ``batch_statistics``: the layer normalizes with statistics over several examples (it must
      not be shared across FPN levels).
    * ``layer_types``: the classes of the layers it builds (a base class stands for its subclasses),
      by which checkpoints, model checks, the optimizer, example weighing and flop counting
      recognise such a layer however it was built; norm classes no name builds: the end of this module.
    * ``detectron2_values``: ``None`` when detectron2's ``get_norm`` cannot build the name, else the
      param values it builds it with (GN: ``{"num_groups": 32}``).
    * ``detectron2_per_level``: detectron2's ``RetinaNetHead`` keeps this name's layers per FPN level.
    * ``example_groups``: the layer normalizes over groups of ``MODEL.BGN.EXAMPLES_PER_GROUP``
      examples (BGN, GhostBN).
    * ``builtin``: one of detectron2's or gwdet's names (never replaced, never unregistered).
    """

    name: str
    build: Callable[..., torch.nn.Module]
    config_keys: Mapping[str, str] = field(default_factory=dict)
    batch_statistics: bool = False
    layer_types: tuple[type, ...] = ()
    detectron2_values: Mapping[str, Any] | None = None
    detectron2_per_level: bool = False
    example_groups: bool = False
    builtin: bool = False

    def __post_init__(self) -> None:  # pragma: no mutate block (the built-in records are made on import)
        """The mappings read-only, as the record's fields are: the catalogue hands out the record
        itself, and a change through one caller would change every later build."""
        object.__setattr__(self, "config_keys", MappingProxyType(dict(self.config_keys)))
        if self.detectron2_values is not None:
            object.__setattr__(self, "detectron2_values", MappingProxyType(dict(self.detectron2_values)))

    def default(self, param: str) -> Any:
        key = self.config_keys.get(param)
        if key in _CHECKS:
            return config_default(key)
        return inspect.signature(self.build).parameters[param].default

    def params(self) -> list[str]:
        return list(inspect.signature(self.build).parameters)[1:]


_RECORDS: dict[str, NormRecord] = {}


def register_norm(name: str, build: Callable[..., torch.nn.Module] | None = None, *,
                  config_keys: Mapping[str, str] | None = None, batch_statistics: bool = False,
                  layer_types: tuple[type, ...] = ()):
    """Register ``build(channels, **params) -> nn.Module`` under ``name``; usable as a decorator.

    ``config_keys`` maps each keyword of ``build`` to the yacs key :func:`norm_from_config` reads
    it from; ``batch_statistics`` and ``layer_types`` as in :class:`NormRecord`. The layers it builds
    are norms to the optimizer in any case (:func:`gwdet.solver.is_norm_layer`). Raises
    ``ValueError`` naming the norm for a name of detectron2's or gwdet's or one already registered (a
    plugin that reloads calls :func:`unregister_norm` first), for a config key no config can hold
    (:func:`_refuse_keys_no_config_holds`), or for arguments of the wrong kind;
    a ``build`` that cannot be called as ``build(channels, **settings)``, or with a parameter named
    as an argument of :func:`norm` itself (:func:`_check_build`), is a ``TypeError``; what ``build``
    returns is checked by :class:`Norm`.
    """
    if callable(name) and not isinstance(name, str):  # @gwdet.register_norm over a function, without the name
        shown = build_name(name)
        function = shown if shown.isidentifier() else "build"
        suggested = function.upper() if function != "build" else "MY_NORM"
        raise GwdetTypeError(
            f"register_norm takes the norm's name first, got {name!r} in its place (@gwdet.register_norm used as a "
            f"decorator without the name?). Give the name the norm is looked up by: @gwdet.register_norm("
            f"{suggested!r}) over the function, or gwdet.register_norm({suggested!r}, {function}).")
    if not isinstance(name, str) or not name:
        raise GwdetValueError(f"register_norm: name must be a non-empty string, got {name!r}")
    _refuse_taken(name, again=None)
    owner = f"register_norm({name!r})"
    check_flag(owner, "batch_statistics", batch_statistics)
    keys = _checked_config_keys(owner, config_keys)
    if not isinstance(layer_types, (tuple, list)) or not all(isinstance(kind, type) for kind in layer_types):
        raise GwdetTypeError(f"{owner}: layer_types must be a tuple of classes, got {layer_types!r}")
    generic = [kind.__name__ for kind in layer_types if kind in _GENERIC_MODULES]
    if generic:
        raise GwdetValueError(
            f"{owner}: layer_types names {', '.join(generic)}, a class of modules of every kind (detectron2's "
            "ResNet stages and heads too): each would count as a norm layer, its convs' weights taking "
            "SOLVER.WEIGHT_DECAY_NORM. Name the normalizing class inside what the build returns (e.g. "
            "torch.nn.GroupNorm), or leave layer_types out: the modules the build returns are marked as norms "
            "in any case.")

    _check_layer_types(owner, tuple(layer_types), batch_statistics)

    def _register(fn: Callable[..., torch.nn.Module]) -> Callable[..., torch.nn.Module]:
        _check_build(owner, fn)
        record = NormRecord(name, fn, keys, batch_statistics, tuple(layer_types))
        _refuse_taken(name, again=record)
        unknown = set(record.config_keys) - set(record.params())
        if unknown:
            raise GwdetValueError(f"register_norm({name!r}): config_keys name {sorted(unknown)}, which "
                                  f"{build_name(fn)} does not take (it takes {record.params()})")
        _refuse_other_defaults(record)
        _refuse_keys_no_config_holds(record)
        _RECORDS[name] = record
        return fn

    return _register if build is None else _register(build)


# Layers that compute rather than normalize: a class among them, or a base class of them, in a
# registration's layer_types would make every such layer of every model a norm layer; inside a norm
# layer (a conditional norm's convolution) their parameters keep the ordinary weight decay.
COMPUTING_MODULES = (torch.nn.modules.conv._ConvNd, torch.nn.Linear, torch.nn.Bilinear, torch.nn.Embedding,
                      torch.nn.EmbeddingBag, torch.nn.RNNBase, torch.nn.MultiheadAttention)


def _check_layer_types(owner: str, layer_types: tuple[type, ...], batch_statistics: bool) -> None:
    """Refuse ``layer_types`` that would mark layers no norm of the registration builds: a
    convolution, linear or embedding class (or a base class of one), and a class a built-in name
    builds with the other ``batch_statistics`` (the model checks would take that name's layers for
    the registered name's)."""
    computing = [kind.__name__ for kind in layer_types if issubclass(kind, COMPUTING_MODULES)
                 or any(issubclass(layer, kind) for layer in COMPUTING_MODULES)]
    if computing:
        raise GwdetValueError(
            f"{owner}: layer_types names {', '.join(computing)}, a convolution, linear or embedding layer (or a base "
            "class of one), not a norm: every such layer of every model would count as a norm layer, its weights "
            "taking SOLVER.WEIGHT_DECAY_NORM and gwdet's checkpoints recording it as a norm. Name the normalizing "
            "class the build returns (e.g. torch.nn.GroupNorm), or leave layer_types out.")
    for kind in layer_types:
        for record in norm_records():
            if record.builtin and record.batch_statistics != batch_statistics and any(
                    issubclass(layer, kind) for layer in record.layer_types):
                keeps = "keeps batch statistics" if record.batch_statistics else "keeps no batch statistics"
                raise GwdetValueError(
                    f"{owner}: layer_types names {kind.__name__}, the layer of the built-in norm {record.name!r}, which "
                    f"{keeps}, but the registration says batch_statistics={batch_statistics}: the model checks would "
                    f"take every {record.name!r} layer for one of yours. Give batch_statistics={record.batch_statistics}, "
                    f"or name a class of your own (a subclass of {kind.__name__}) in layer_types.")


def _config_key_defaults(record: NormRecord) -> dict[str, Any]:
    """``{config key: the default its build function gives the argument read from it}`` of the
    record's config keys whose argument has a default."""
    parameters = inspect.signature(record.build).parameters
    return {key: parameters[param].default for param, key in record.config_keys.items()
            if param in parameters and parameters[param].default is not inspect.Parameter.empty}


def _refuse_other_defaults(record: NormRecord) -> None:
    """Refuse a config key of ``record`` below a value or naming a section of detectron2's or
    gwdet's config, and one that neither has and that another registered name reads with another
    default: :func:`add_registered_config_keys` adds it with one default, and the other name would
    be built with it without a word."""
    values = {**flatten_config(get_cfg()), **{config_key.name: config_key.default for config_key in CONFIG_KEYS}}
    existing = set(values)
    sections = {key.rsplit(".", depth)[0] for key in existing for depth in range(1, key.count(".") + 1)}
    for param, key in record.config_keys.items():
        above = next((key[:end] for end in range(len(key)) if key[end] == "." and key[:end] in existing), None)
        if above is not None or key in sections:
            what = (f"lies below {above}, which detectron2's or gwdet's config holds as a value, not as a section"
                    if above else "is a section of detectron2's or gwdet's config (it holds keys, not one value)")
            raise GwdetValueError(
                f"register_norm({record.name!r}): the config key {key} (for {param}) {what}: give {param} a key of "
                f"its own, e.g. MODEL.{record.name.upper()}.{param.upper()}.")
    defaults = _config_key_defaults(record)
    for param, key in record.config_keys.items():
        default = defaults.get(key)
        if key in existing and default is not None and values[key] is not None and _kind(default) != _kind(values[key]):
            raise GwdetValueError(
                f"register_norm({record.name!r}): the config key {key} holds {_kind(values[key])} values (its default "
                f"is {values[key]!r}), and {record.name!r} reads its {param} (default {default!r}, {_kind(default)}) "
                f"from it: give {param} a key of {_kind(default)} values, or of its own, e.g. "
                f"MODEL.{record.name.upper()}.{param.upper()}.")
        if key in existing and default is not None and _as_config_value(default) != _as_config_value(values[key]):
            raise GwdetValueError(
                f"register_norm({record.name!r}): {build_name(record.build)} gives {param} the default {default!r}, but "
                f"reads it from the config key {key}, whose default in detectron2's or gwdet's config is "
                f"{values[key]!r}: a config that leaves the key as it is would build {param}={values[key]!r}, not "
                f"{default!r}. Give {param} the default {values[key]!r} or none, or read it from a key of its own, "
                f"e.g. MODEL.{record.name.upper()}.{param.upper()}.")
    for key in set(record.config_keys.values()) - existing:
        default = defaults.get(key, _NO_DEFAULT)
        for other in norm_records():
            if other.name == record.name or key not in other.config_keys.values():
                continue
            theirs = _config_key_defaults(other).get(key, _NO_DEFAULT)
            if theirs is not default and theirs != default:
                ours, shown = (f"the default {value!r}" if value is not _NO_DEFAULT else "no default"
                               for value in (default, theirs))
                raise GwdetValueError(
                    f"register_norm({record.name!r}): the config key {key} is read by {other.name!r} too, with "
                    f"{shown}, and {record.name!r} gives it {ours}: a config without the key would build "
                    f"one of them with the other's default. Give both the same default, or {record.name!r} a key of its "
                    "own.")


def _refuse_keys_no_config_holds(record: NormRecord) -> None:
    """Refuse a config key of ``record`` that gwdet's config check refuses in every config holding
    it, so that no config could set it (and, once :func:`add_registered_config_keys` adds it, no
    config could be used at all): one not in upper case, whose sections the check takes for
    misspellings of detectron2's or gwdet's (``model.my.g`` for ``MODEL``, ``MODEL.fpn.G``), or a
    key that gwdet's table lacks in one of gwdet's own sections (``MODEL.GW.MY_G``: :func:`gwdet.config.check_config_values`). The message
    gives the key in upper case where that spelling can be held, else a key of the name's own."""
    for param, key in record.config_keys.items():
        problem = _config_key_refused_by_the_check(key)
        if problem is None:
            continue
        upper = key.upper()
        own = f"MODEL.{record.name.upper()}.{param.upper()}"
        fix = (f"write it in upper case, as detectron2's and gwdet's keys are: config_keys={{{param!r}: {upper!r}}}"
               if upper != key and _config_key_refused_by_the_check(upper) is None else
               f"give {param} a key of its own, e.g. config_keys={{{param!r}: {own!r}}}")
        raise GwdetValueError(
            f"register_norm({record.name!r}): no config can hold the config key {key} (for {param}): {problem}, so "
            f"every config holding the key would be refused. Nothing was registered; {fix}.")


def _config_key_refused_by_the_check(key: str) -> str | None:
    """Why gwdet's config check would refuse every config that holds ``key`` once a norm has
    registered it, or None where a config can hold it: a part of the key not in upper case, as every
    key of detectron2's and gwdet's configs is (the check takes a section in other letter case,
    ``model`` for ``MODEL``, for a misspelling), or a key that gwdet's table lacks in one of gwdet's
    own sections (``MODEL.GW.MY_G``: :func:`gwdet.config.check_config_values`)."""
    if key != key.upper():
        part = next(part for part in key.split(".") if part != part.upper())
        return (f"it is not in upper case, as every key of detectron2's and gwdet's configs is, and gwdet's config "
                f"check takes a part in other letter case ({part} for {part.upper()}) for a misspelling and refuses "
                "it")
    *sections, leaf = key.split(".")
    cfg = add_gwdet_config(get_cfg())
    node = cfg
    for section in sections:
        if not isinstance(node, CfgNode):  # below a value: _refuse_other_defaults names it
            return None
        node = node.setdefault(section, CfgNode())
    if not isinstance(node, CfgNode):
        return None
    if leaf not in node:
        node[leaf] = None
    try:
        check_config_values(cfg)
    except GwdetKeyError:
        section = next((name for name in GWDET_SECTIONS if key.startswith(name + ".")), GWDET_RESNETS_PREFIX)
        return (f"it lies among gwdet's own keys ({section}...), where gwdet's config check refuses every key "
                "gwdet's config table lacks (the table's keys are listed in docs/usage.md)")
    return None


# The default of a build's argument that has none (set apart from a default of None).
_NO_DEFAULT = object()


def _as_config_value(value: Any) -> Any:
    """``value`` as a config compares it: a tuple as the list yacs holds."""
    return list(value) if isinstance(value, tuple) else value


def _kind(value: Any) -> str:
    """What a config value is, as yacs tells types apart (an override of an integer key with a
    float is refused): a bool, an integer, a float, a string, a list, ..."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "float"
    return "list" if isinstance(value, (list, tuple)) else "string" if isinstance(value, str) else type(value).__name__


def _checked_config_keys(owner: str, config_keys: Any) -> dict[str, str]:
    """``config_keys`` as a dict, after checking that it maps keyword names to dotted key names."""
    if config_keys is None:
        return {}
    if not isinstance(config_keys, Mapping):
        raise GwdetTypeError(f"{owner}: config_keys must map build's keywords to config keys, e.g. "
                             f"{{'num_groups': 'MODEL.GN.NUM_GROUPS'}}, got {config_keys!r}")
    for param, key in config_keys.items():
        if not isinstance(param, str) or not isinstance(key, str) or not key or any(
                not part for part in key.split(".")):
            raise GwdetValueError(f"{owner}: config_keys must map build's keywords to dotted config keys "
                                  f"(e.g. 'MODEL.GN.NUM_GROUPS'), got {param!r}: {key!r}")
    return dict(config_keys)


def build_name(build: Any) -> str:
    """How messages name a norm's build function: by its name; a ``functools.partial`` by the
    function it wraps; another callable object (an instance of a class with ``__call__``) by its
    class."""
    if isinstance(build, functools.partial):
        return f"functools.partial({build_name(build.func)}, ...)"
    name = getattr(build, "__name__", None)
    return name if isinstance(name, str) else f"a {type(build).__qualname__} object"


def _check_build(owner: str, build: Any) -> None:
    """Raise naming the norm unless ``build`` is a callable that gwdet can call as
    ``build(channels, **settings)``: the channel count first (no later parameter named as a
    channel count, as ``torch.nn.GroupNorm``'s ``num_channels``), every other parameter by keyword
    (none positional-only, none collecting), and none named as an argument of :func:`norm` itself
    (``name``, ``strict``, ``read_from_config``), which would take the value meant for ``build``."""
    if not callable(build):
        raise GwdetTypeError(f"{owner}: build must be a function channels -> torch.nn.Module, got "
                             f"{build!r} ({type(build).__name__})")
    try:
        parameters = list(inspect.signature(build).parameters.values())
    except (TypeError, ValueError):  # a callable whose signature Python cannot read: its keywords are unknown
        raise GwdetTypeError(f"{owner}: the signature of {build!r} cannot be read, so its keywords are "
                             "unknown; register a function (def build(channels, ...))") from None
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                  inspect.Parameter.VAR_POSITIONAL)
    if not parameters or parameters[0].kind not in positional:
        raise GwdetTypeError(f"{owner}: build must take the channel count as its first argument "
                             f"(def build(channels, ...)), but {getattr(build, '__qualname__', build)!r} takes "
                             f"{[p.name for p in parameters]}")
    collecting = [p for p in parameters[1:] if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    if collecting:
        shown = "*" * (1 + (collecting[0].kind == inspect.Parameter.VAR_KEYWORD)) + collecting[0].name
        raise GwdetTypeError(f"{owner}: build takes {shown}, but gwdet.norm(name, **params) checks each parameter "
                             "by name against build's signature and records it: name each keyword "
                             "(def build(channels, num_groups=32, eps=1e-5)) instead of collecting them")
    shown_build = build_name(build)
    channel_at = next((at for at, p in enumerate(parameters) if at and p.name in _CHANNEL_ARGUMENTS), None)
    if channel_at is not None:
        before = [p.name for p in parameters[:channel_at]]
        raise GwdetTypeError(
            f"{owner}: {shown_build} takes {[p.name for p in parameters]}, with the channel count as "
            f"{parameters[channel_at].name!r}, not first: gwdet builds the layer as build(channels, **settings), the "
            f"channel count as the first positional argument and every setting by keyword, so the channel count would "
            f"go into {before[0]!r}. Register a function that takes the channel count first, e.g. "
            f"def build(channels, {', '.join(f'{name}=...' for name in before)}): "
            f"return {shown_build}({', '.join(before)}, channels).")
    positional_only = [p.name for p in parameters[1:] if p.kind is inspect.Parameter.POSITIONAL_ONLY]
    if positional_only:
        raise GwdetTypeError(
            f"{owner}: {shown_build} takes {', '.join(positional_only)} as positional-only (before '/'), but gwdet "
            "builds the layer as build(channels, **settings), giving every setting by keyword, so no value could "
            f"reach {'them' if len(positional_only) > 1 else 'it'}. Let build take {', '.join(positional_only)} by "
            "keyword (move the '/' right after the channel count, or leave it out).")
    reserved = _reserved_names()
    clashing = [p.name for p in parameters[1:] if p.name in reserved]
    if clashing:
        clash = clashing[0]
        raise GwdetTypeError(
            f"{owner}: {shown_build} takes a parameter named {clash!r}, which is an argument of gwdet.norm itself "
            f"({reserved[clash]}): gwdet.norm(..., {clash}=...) and a config key read into it would set gwdet's "
            f"argument, never {shown_build}'s. Rename the parameter (e.g. {clash + '_'!r}, and its config_keys "
            "entry with it).")


def _reserved_names() -> dict[str, str]:
    """The names a build function's parameters cannot have: the arguments of :func:`norm` and
    :class:`Norm` themselves, each with what it is."""
    meaning = {"name": "the norm's name", "self": "the Norm object",
               "strict": "refuse a group count the channels cannot use, MODEL.STRICT_NORM_GROUPS",
               "read_from_config": "whether the values were read from a yacs config"}
    found = {}
    for function in (norm, Norm.__init__):
        for parameter in inspect.signature(function).parameters.values():
            if parameter.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
                found[parameter.name] = meaning.get(parameter.name, "an argument of gwdet.norm")
    return found


def _same_registration(record: NormRecord, other: NormRecord) -> bool:
    """Whether ``other`` registers what ``record`` does: the same settings and the same build
    (:func:`_same_value`): the same object, or, for a module read again (a LazyConfig file that
    registers its norm, ``importlib.reload``), whose functions and classes are new objects, a
    function of the same name, code, defaults, closure values and read globals, or a class of the
    same name, bases and attributes. Two builds a factory made with other values (``make(4)``,
    ``make(8)``) are two registrations."""
    try:
        same_build = _same_value(record.build, other.build, set())
    except RecursionError:  # a value that holds itself: the same only as the same object
        same_build = record.build is other.build
    return same_build and (dict(record.config_keys), record.batch_statistics, record.layer_types) == (
        dict(other.config_keys), other.batch_statistics, other.layer_types)


# attributes of a class that say where it was defined, not what it does (a LazyConfig file read
# again is a module of another, random name), or that Python makes anew for every class
_CLASS_BOOKKEEPING = frozenset({"__module__", "__dict__", "__weakref__", "__firstlineno__", "__static_attributes__"})
# a closure cell with no value yet (a name the enclosing function has not assigned)
EMPTY_CELL = object()


def _same_value(a: Any, b: Any, comparing: set[tuple[int, int]]) -> bool:
    """Whether ``a`` and ``b`` are the same as far as a build reads them: the same object; a module
    of the same name; a function of the same name and code whose defaults, keyword defaults,
    closure values and read module-level names (:func:`_read_globals`) are the same; a class of the
    same name whose bases and attributes (``vars``, but for where it was defined) are the same;
    tuples, lists and dicts of the same values; tensors and arrays of the same shape, dtype and
    values; anything else of the same type that compares equal with ``==`` (an object without its
    own ``==`` is then only itself). ``comparing`` holds the pairs of functions and classes being
    compared (a method's ``__class__`` cell leads back to its class): such a pair is taken as the
    same while it is."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if inspect.ismodule(a):
        return bool(a.__name__ == b.__name__)
    pair = (id(a), id(b))
    if pair in comparing:
        return True
    if inspect.isfunction(a) or inspect.isclass(a):  # kept alive by their owners, so their ids stay theirs
        comparing.add(pair)
    if inspect.isfunction(a):
        return (a.__qualname__ == b.__qualname__ and _code(a) == _code(b)
                and _same_value(a.__defaults__, b.__defaults__, comparing)
                and _same_value(a.__kwdefaults__, b.__kwdefaults__, comparing)
                and _same_value(cell_values(a), cell_values(b), comparing)
                and _same_value(_read_globals(a), _read_globals(b), comparing))
    if inspect.isclass(a):
        own_a = {key: value for key, value in vars(a).items() if key not in _CLASS_BOOKKEEPING}
        own_b = {key: value for key, value in vars(b).items() if key not in _CLASS_BOOKKEEPING}
        return (a.__qualname__ == b.__qualname__ and _same_value(a.__bases__, b.__bases__, comparing)
                and _same_value(own_a, own_b, comparing))
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same_value(x, y, comparing) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_value(a[key], b[key], comparing) for key in a)
    if isinstance(a, (staticmethod, classmethod)):
        return _same_value(a.__func__, b.__func__, comparing)
    if isinstance(a, property):
        return all(_same_value(getattr(a, part), getattr(b, part), comparing) for part in ("fget", "fset", "fdel"))
    if isinstance(a, (MemberDescriptorType, GetSetDescriptorType)):  # a slot of a class made anew
        return bool(a.__name__ == b.__name__)
    if isinstance(a, (torch.Tensor, np.ndarray)):
        return a.shape == b.shape and a.dtype == b.dtype and bool((a == b).all())
    try:
        equal = a == b
        return isinstance(equal, (bool, np.bool_)) and bool(equal)
    except Exception:  # an == that cannot compare the two: only the same object is the same
        return False


def cell_values(function: Callable) -> tuple[Any, ...]:
    """The values of ``function``'s closure cells, in order (:data:`EMPTY_CELL` for an empty one)."""
    values = []
    for cell in getattr(function, "__closure__", None) or ():
        try:
            values.append(cell.cell_contents)
        except ValueError:  # an empty cell
            values.append(EMPTY_CELL)
    return tuple(values)


def _read_globals(function: Callable) -> dict[str, Any]:
    """The module-level names ``function``'s code reads, each with its value (compared by
    :func:`_same_value`)."""
    names = getattr(getattr(function, "__code__", None), "co_names", ())
    scope = getattr(function, "__globals__", {})
    return {name: scope[name] for name in names if name in scope}


def _code(function: Callable) -> Any:
    """What a function computes, as far as its code object tells: its bytes, constants and names."""
    code = getattr(function, "__code__", None)
    return (code.co_code, code.co_consts, code.co_names) if code is not None else repr(function)


def _refuse_taken(name: str, again: NormRecord | None) -> None:
    """Refuse a name that cannot be registered: odd characters, a case-insensitive twin, a
    built-in name, or, once the registration ``again`` is known (a decorator's function comes
    later), a registered one, unless ``again`` registers the same (:func:`_same_registration`: the
    new function then takes its place)."""
    if name != name.strip() or not name.isprintable() or not name.isascii():
        raise GwdetValueError(f"register_norm: name {name!r} has spaces at an end, unprintable or non-ASCII "
                              "characters, which a config cannot be told apart by; use letters, digits and '_'")
    alike = [other for other in _RECORDS if other != name and other.casefold() == name.casefold()]
    if alike:
        kind = "built-in norm name" if _RECORDS[alike[0]].builtin else "registered norm name"
        raise GwdetValueError(f"register_norm: {name!r} differs from the {kind} {alike[0]!r} only in "
                              f"case, so a config saying {name!r} would build your layer where {alike[0]!r} may "
                              "have been meant; choose a name that differs in more than case")
    record = _RECORDS.get(name)
    if record is not None and record.builtin:
        raise GwdetValueError(f"register_norm: {name!r} is a built-in norm name; choose another name")
    if record is not None and again is not None and not _same_registration(record, again):
        owner = record.build.__module__ or getattr(getattr(record.build, "__code__", None), "co_filename", None)
        raise GwdetValueError(f"register_norm: {name!r} is already registered (by {owner}."
                              f"{getattr(record.build, '__qualname__', record.build)}); choose another name, or "
                              f"call gwdet.norms.unregister_norm({name!r}) first")


def unregister_norm(name: str) -> None:
    """Remove a name registered with :func:`register_norm`: for tests, and for plugins that reload
    and register again. Built-in names cannot be removed; an unknown name is an
    :class:`UnknownNormError`."""
    if norm_record(name).builtin:
        raise GwdetValueError(f"unregister_norm: {name!r} is a built-in norm name and cannot be removed")
    del _RECORDS[name]


# Where a registered name is known: said with every refusal of an unknown name
OWN_NAMES_NOTE = ("a name registered in your own code is known only to the process that ran it: gwdet's tools "
                  "cannot run it, nor can a run's saved config.yaml; train and evaluate with a script of your own "
                  "that registers it first, or with the LazyConfig .py that registers it, docs/usage.md")


def spawned_process_note() -> str:
    """In a process the launcher started (``--num-gpus``, ``--num-machines``: Python's
    multiprocessing spawn), why a name or key registered in one's own script may be missing there;
    "" in any other process."""
    if multiprocessing.parent_process() is None:
        return ""
    return (" This process was started by the launcher (--num-gpus, --num-machines): it imports your script anew "
            "without running its `if __name__ == \"__main__\":` block, so a gwdet.register_norm call inside that "
            "block does not reach it: register the name at the script's top level.")


def known_norm_names() -> list[str]:
    """Every name :func:`norm` accepts, sorted (detectron2's, gwdet's and registered ones)."""
    return sorted(_RECORDS)


def add_registered_config_keys(cfg: CfgNode) -> CfgNode:
    """Add to the yacs config ``cfg`` each config key of a registered name (``register_norm``'s
    ``config_keys``) that it lacks, with the default its build function gives that argument, so that
    a config file can set it (``MODEL.MY_GN.NUM_GROUPS: 8``) as it sets gwdet's own; an argument
    without a default adds no key (the build then asks for it). Names that share a key give it one
    default (:func:`register_norm` refuses another). Returns ``cfg``."""
    defaults = {key: default for record in norm_records() for key, default in _config_key_defaults(record).items()}
    for key, default in defaults.items():
        *sections, leaf = key.split(".")
        node = cfg
        for section in sections:
            if not isinstance(node, CfgNode):
                break
            node = node.setdefault(section, CfgNode())
        if isinstance(node, CfgNode) and leaf not in node:
            node[leaf] = default
    return cfg


def norm_records() -> list[NormRecord]:
    """Every record of the catalogue, sorted by name."""
    return [_RECORDS[name] for name in known_norm_names()]


def norm_record(name: str) -> NormRecord:
    """The :class:`NormRecord` of ``name``; :class:`UnknownNormError` listing the known names."""
    if isinstance(name, str) and name in _RECORDS:
        return _RECORDS[name]
    if name is None or name == "":
        raise UnknownNormError(no_norm_message(name))
    raise UnknownNormError(
        f"Unknown norm name {name!r}. Known names: {', '.join(known_norm_names())}. Fix the "
        f"NORM value, or register the name with gwdet.register_norm(name, build) ({OWN_NAMES_NOTE})."
        + spawned_process_note()
    )


def no_norm_message(name: Any, where: str | None = None) -> str:
    """What a norm of the name ``None`` or ``""`` (no norm) is told: no norm is ``''`` given where the
    norm goes, in place of the norm, in every kind of config and to detectron2's and gwdet's
    components; ``None`` is no norm only to detectron2's ``get_norm`` and ``Conv2d`` in Python.
    ``where``: the path of the LazyConfig node that made the norm, which the fix then names."""
    if where is not None:
        place = f"{where}='' (an override; {where} = '' in Python), in place of the gwdet.norm node"
    else:
        place = (f"NORM: \"\" in a yacs config, <the node's path>='' in a LazyConfig (e.g. model.backbone.norm=''), "
                 f"norm='' to detectron2's and gwdet's components in Python, in place of gwdet.norm({name!r})")
    none = (" None is no norm only to detectron2's get_norm and Conv2d in Python: its FPN keeps its convolutions' bias "
            "only for '' (bias = norm == ''), so with None they would have neither norm nor bias, and gwdet refuses "
            "None as a NORM value of a yacs config and as a LazyConfig's norm argument." if name is None else "")
    return (f"{name!r} names no norm, so there is nothing to build or look up. For no norm, give '' where the norm "
            f"goes: {place}.{none} Else give a norm's name: {', '.join(known_norm_names())}.")


def synchronizes_cuda_only(name: str) -> bool:
    """Whether ``name`` builds torch's ``SyncBatchNorm`` (detectron2's ``SyncBN`` and ``nnSyncBN``, or
    a registered name whose ``layer_types`` say so), which synchronizes CUDA tensors only: processes
    training on the CPU stop at its first forward. False for a name the catalogue does not know."""
    record = _RECORDS.get(name) if isinstance(name, str) else None
    return record is not None and any(issubclass(layer, torch.nn.SyncBatchNorm) for layer in record.layer_types)


def check_detectron2_buildable(argument: str, norm: Any) -> None:
    """Refuse a name only gwdet builds given as ``argument`` (e.g. ``"place_norm: norm"``) to a
    component that passes it to detectron2's ``get_norm``, which would raise a bare ``KeyError``."""
    if isinstance(norm, str) and norm and norm_record(norm).detectron2_values is None:
        raise GwdetValueError(f"{argument}={norm!r} is built by gwdet, not by detectron2's get_norm: give "
                              f"gwdet.norm({norm!r}, ...) with the hyper-parameters you want.")


def norm_classes() -> tuple[type, ...]:
    """Every norm layer class: the catalogue's (:func:`layer_types`), then torch's and detectron2's
    (:data:`TORCH_NORM_SETTINGS`)."""
    return layer_types() + tuple(kind for kind, _ in TORCH_NORM_SETTINGS)


def shared_norm_layers(model: torch.nn.Module) -> list[list[str]]:
    """The places of each norm layer object held by more than one module of ``model``, or by one
    module under more than one name (one list of names per such layer): a norm's build function
    that returned one cached layer for several calls, or ``self.norm1 = self.norm2 = norm(c)``,
    ties their parameters and statistics together. A block reused whole (one parent holding the
    layer under one name, reached by several paths) is not counted: its norm is shared along with
    the rest of it."""
    norms = norm_classes()
    places: dict[int, dict[int, dict[str, str]]] = defaultdict(dict)  # layer -> parent -> its name there -> path
    for path, child in model.named_modules(remove_duplicate=False):
        if path and (isinstance(child, norms) or getattr(child, NORM_LAYER_MARK, False)):
            parent_path, _, name = path.rpartition(".")
            parent = model.get_submodule(parent_path)
            places[id(child)].setdefault(id(parent), {}).setdefault(name, path)
    return [[path for names in held.values() for path in names.values()] for held in places.values()
            if len(held) > 1 or any(len(names) > 1 for names in held.values())]


def check_untied_norms(model: torch.nn.Module) -> None:
    """Refuse a model with a norm layer object at several places (:func:`shared_norm_layers`)."""
    tied = shared_norm_layers(model)
    if tied:
        first = tied[0]
        raise GwdetValueError(
            f"One norm layer object ({type(model.get_submodule(first[0])).__name__}) sits at {len(first)} places, "
            f"{listed(first, 3)}, so their weights and statistics are one"
            + (f" ({len(tied) - 1} more such layer(s))" if len(tied) > 1 else "")
            + ": the code that builds the model gave one layer object to several modules (a norm layer made once "
            "and passed to each conv, or a norm's build function that returns a layer it built before). Build a new "
            "layer for each place (call the norm's builder once per conv).")


def layer_channels(layer: torch.nn.Module) -> int | None:
    """The channel count a norm layer was built for, where it says: ``num_features`` (torch's batch
    and instance norms, detectron2's FrozenBatchNorm2d, gwdet's layers) or ``num_channels`` (GroupNorm);
    ``None`` for a layer with neither (a weight's length need not be the channels')."""
    for attribute in ("num_features", "num_channels"):
        value = getattr(layer, attribute, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def unbuilt_group_norms(layer: torch.nn.Module) -> list[str]:
    """Each torch ``GroupNorm`` in ``layer`` (``layer`` itself included) whose group count torch
    would refuse at the first forward rather than when built, as ``"<name>: GroupNorm(-2, 64)"``:
    fewer than 1 group (``GroupNorm(-2, 64)`` is built, 64 being divisible by -2), or a count that
    does not divide the channels."""
    return [f"{name + ': ' if name else ''}GroupNorm({module.num_groups!r}, {module.num_channels!r})"
            for name, module in layer.named_modules() if isinstance(module, torch.nn.GroupNorm)
            and (module.num_groups < 1 or module.num_channels % module.num_groups != 0)]


def layer_types(*, batch_statistics: bool | None = None, detectron2: bool | None = None) -> tuple[type, ...]:
    """The layer classes the catalogue's names build, each once. With ``batch_statistics`` given,
    those of the names that do (True) or do not (False) normalize over several examples; with
    ``detectron2`` given, those of the names detectron2's ``get_norm`` builds itself (True: BN, GN,
    ...) or does not (False: gwdet's names and registered ones). Norm classes outside the catalogue
    (torch's InstanceNorm, ...) are listed at the end of this module."""
    found: dict[type, None] = {}
    for record in norm_records():
        if batch_statistics is not None and record.batch_statistics != batch_statistics:
            continue
        if detectron2 is not None and (record.detectron2_values is not None) != detectron2:
            continue
        found.update(dict.fromkeys(record.layer_types))
    return tuple(found)


def detectron2_builds(name: str, values: Mapping[str, Any]) -> bool:
    """Whether detectron2's ``get_norm(name)`` itself builds ``name`` with hyper-parameters
    ``values`` (missing ones: the name's defaults)."""
    native = norm_record(name).detectron2_values
    if native is None:
        return False
    record = norm_record(name)
    return all((values[param] if param in values else record.default(param)) == value
               for param, value in native.items())


def _config_values(record: NormRecord, cfg) -> dict[str, Any]:
    """The values of ``record``'s keywords in ``cfg``; a key the config lacks (one a user's
    :func:`register_norm` named) is a ``KeyError`` naming the norm, the key and the fix."""
    require_gwdet_config(cfg, f"The norm {record.name!r}")
    values = {}
    for param, key in record.config_keys.items():
        try:
            values[param] = config_value(cfg, key)
        except (KeyError, AttributeError):
            parent = key.rpartition(".")[0] or key
            raise GwdetKeyError(
                f"The norm {record.name!r} reads its {param} from the config key {key} (its register_norm "
                f"config_keys), which the config does not have. Add the key to the config before merge_from_file "
                f"(e.g. cfg.{parent} = CfgNode(); cfg.{key} = <default>), or register the norm with a key the "
                "config has.") from None
        if isinstance(values[param], dict):  # a CfgNode: the key names a section
            raise GwdetValueError(
                f"The norm {record.name!r} reads its {param} from the config key {key} (its register_norm "
                f"config_keys), which is a section of the config ({', '.join(sorted(values[param]))}), not a value; "
                "register the norm with the full key of the value.")
    return values


def detectron2_builds_as_configured(name: Any, cfg) -> bool:
    """Whether detectron2's own components build the NORM value ``name`` as the yacs config
    ``cfg`` configures it: no norm (``""``), or a detectron2 name with detectron2's values (GN
    only with ``MODEL.GN.NUM_GROUPS`` 32). False for every name only gwdet builds so; an unknown
    name is an :class:`UnknownNormError`. ``cfg`` needs gwdet's keys only where the name reads any."""
    if not name:
        return True
    record = norm_record(name)
    if record.detectron2_values is None:
        return False
    if not record.config_keys:
        return detectron2_builds(name, {})
    return detectron2_builds(name, _config_values(record, cfg))


def built_by_detectron2_get_norm(layer: torch.nn.Module) -> bool:
    """Whether ``layer`` is a ``GroupNorm`` that detectron2's ``get_norm("GN", channels)`` built,
    with its own 32 groups whatever ``MODEL.GN.NUM_GROUPS`` says: torch's ``GroupNorm`` of 32
    groups that neither gwdet's ``GN`` built (which keeps the group count asked for on the layer,
    :data:`REQUESTED_GROUPS`: 32 can be its channel rule's answer to 64 on 32 channels) nor a name
    registered with :func:`register_norm` (its layers carry :data:`NORM_LAYER_MARK`)."""
    return (type(layer) is torch.nn.GroupNorm and layer.num_groups == DETECTRON2_GN_GROUPS
            and not hasattr(layer, REQUESTED_GROUPS) and not getattr(layer, NORM_LAYER_MARK, False))


def group_adjustment(layer: torch.nn.Module) -> tuple[str, int, int] | None:
    """``(what, requested, used)`` when a layer could not use the group number (GW, BGN, GN) or
    group size (BW) it was given, because it does not divide the channels; ``None`` otherwise."""
    for requested, used, what in (("num_groups", "effective_num_groups", "groups"),
                                  ("group_size", "effective_group_size", "channels per group"),
                                  (REQUESTED_GROUPS, "num_groups", "groups")):  # GN (_group_norm)
        if hasattr(layer, requested) and hasattr(layer, used) and getattr(layer, requested) != getattr(layer, used):
            return what, getattr(layer, requested), getattr(layer, used)
    return None


def _hashable(value: Any) -> Any:
    """``value`` as a hashable that equal values share: a list as a tuple, numbers as they are (an
    ``np.int64(8)`` hashes as ``8``), anything else unhashable by its repr."""
    if isinstance(value, (list, tuple)):
        return tuple(map(_hashable, value))
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


def _plain(value: Any) -> Any:
    """``value`` with numpy's scalars as Python's own (a ``np.int64`` as an ``int``, a ``np.float32``
    as a ``float``, a ``np.bool_`` as a ``bool``, a ``np.str_`` as a ``str``), in lists and tuples
    too: a Norm keeps the values a saved config writes as plain YAML and compares as Python's."""
    if isinstance(value, (list, tuple)):
        return type(value)(map(_plain, value)) if type(value) in (list, tuple) else value
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, np.str_):
        return str(value)
    return value


def _check_kind_of_default(name: str, param: str, value: Any, default: Any, source: str = "") -> None:
    """Refuse a value given for ``param`` of a registered norm that is of another kind than its
    ``default``: a string where the build takes a number, a list or a tuple (whose characters it
    would iterate), a bool or a float where it takes an integer, a bool where it takes a float: the
    layer would fail at its first forward inside the user's own code, or compute with a truth value
    or another sequence. Where the default is a bool, refuse anything but
    a bool (numpy's included), as the built-in names' flags do: ``'no'`` or ``0`` would be read as a
    truth value without a word. ``source``: where the value came from, said after it (a config key)."""
    given = f"gwdet.norm({name!r}): {param}={value!r}{source}"
    if isinstance(default, bool):
        if not isinstance(value, (bool, np.bool_)):
            raise GwdetValueError(
                f"{given} is not True or False, and the norm's build takes a flag "
                f"there (its default is {default!r}), which would take {value!r} as a truth value whatever it "
                f"says: give {param}=True or {param}=False (true or false in a LazyConfig override).")
        return
    if isinstance(default, (list, tuple)) and isinstance(value, (str, bytes)):
        kind = type(default).__name__
        raise GwdetTypeError(
            f"{given} is a string, and the norm's build takes a {kind} there (its default is {default!r}), which "
            f"would iterate the string's characters: give {param} as a {kind} (e.g. {param}={default!r}; "
            f"[{value!r}] for a {kind} of that one string).")
    number = isinstance(default, (int, float))
    if number and isinstance(value, str):
        raise GwdetTypeError(f"{given} is a string, and the norm's build takes a "
                             f"number there (its default is {default!r}): give {param} as a number.")
    if number and isinstance(value, (bool, np.bool_)):
        kind = "an integer" if isinstance(default, int) else "a float"
        raise GwdetTypeError(
            f"{given} is a bool, and the norm's build takes {kind} there (its default is {default!r}), where "
            f"{value!r} would count as {int(value)}: give {param} as {kind} (e.g. {param}={default!r}).")
    if isinstance(default, int) and is_real_number(value) and not is_whole_number(value):
        integral = math.isfinite(value) and float(value).is_integer()
        instead = f"{int(value)} rather than {value!r}" if integral else f"{param}={default!r}"
        raise GwdetTypeError(
            f"{given} is a {type(value).__name__}, and the norm's build takes an integer there (its default is "
            f"{default!r}), which the layer would fail on or round: give {param} as an integer (e.g. {instead}).")


def _as_default_kind(value: Any, default: Any) -> Any:
    """``value`` as a ``float`` where the norm's build takes a float there (its ``default`` is one)
    and ``value`` is another kind of real number (an ``int``, a ``Fraction``): torch's layers take
    a float, and a saved record writes a float as YAML does; ``value`` itself otherwise."""
    if isinstance(default, float) and is_real_number(value) and type(value) is not float:
        return float(value)
    return value


def _own_copy(value: Any) -> Any:
    """A deep copy of ``value`` where it is a container that can be changed in place or hold such a
    container (a list, dict, set, bytearray, or a tuple of them); ``value`` itself otherwise."""
    if isinstance(value, (list, tuple, dict, set, frozenset, bytearray)):
        return copy.deepcopy(value)
    return value


class NormParams(Mapping):
    """The read-only ``{setting: value}`` of a :class:`Norm` (its ``params``): a mapping that compares
    equal to a dict of the same items and refuses item assignment and deletion.

    It holds its own deep copies of the lists, dicts, sets and tuples given to it, made when it is
    made, and hands out copies of them (``params[key]``, ``dict(params)``, ``**params``): changing
    the caller's list or dict, or one read from the params, leaves the norm's values as they were."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        self._values = {key: _own_copy(value) for key, value in values.items()}

    def __getitem__(self, key: str) -> Any:
        return _own_copy(self._values[key])

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __setitem__(self, key: str, value: Any) -> None:
        raise GwdetTypeError(
            f"A norm's params {self!r} are read-only: {key}={value!r} cannot be set in them, as the norm's values were "
            "checked together when it was made. Build a new norm with the values you want, e.g. "
            f"gwdet.norm(name, {key}=...).")

    def __delitem__(self, key: str) -> None:
        raise GwdetTypeError(
            f"A norm's params {self!r} are read-only: {key} cannot be deleted from them. Build a new norm with the "
            "values you want, e.g. gwdet.norm(name, ...).")

    def __repr__(self) -> str:
        return repr(self._values)

    def __reduce__(self) -> tuple:
        return NormParams, (self._values,)


class Norm:
    """A norm name with every hyper-parameter fixed: call it with a channel count for a layer.

    detectron2 accepts it wherever it takes a norm (``get_norm``, ``norm=`` / ``conv_norm=``
    arguments). Equal names and values compare equal; ``repr`` shows every value.

    A layer that cannot use the requested group number (it does not divide the channels; see
    :func:`group_adjustment`) is logged once per name, request and channel count, or with
    ``strict=True`` (``MODEL.STRICT_NORM_GROUPS``) refused: a group count never changes silently.

    A Norm is read-only: assigning or deleting an attribute is refused, and ``params`` is a
    read-only mapping that keeps its own copies of the lists and dicts given (or taken from the
    build function's defaults) and hands out copies, also to the build function at each call;
    build a new one for other values.
    """

    name: str
    params: Mapping[str, Any]
    strict: bool
    read_from_config: bool
    _record: NormRecord | None

    def __init__(self, name: str, strict: bool = False, *, read_from_config: bool = False, **params: Any) -> None:
        """``read_from_config``: the values were read from a yacs config (:func:`norm_from_config`),
        which errors then name the keys of; else they were given in Python (or a LazyConfig)."""
        if isinstance(name, Norm):
            raise GwdetTypeError(already_a_norm_message(name, params))
        kind = norm_record(name)
        check_flag(f"gwdet.norm({name!r})", "strict", strict)
        accepted = kind.params()
        # None for a value the norm does not take leaves it out: a LazyConfig node switched to another
        # norm by an override keeps the earlier norm's values, which an override cannot delete
        params = {key: _plain(value) for key, value in params.items() if key in accepted or value is not None}
        unknown = sorted(set(params) - set(accepted))
        if unknown:
            raise GwdetTypeError(unknown_params_message(name, accepted, unknown))
        values = {}
        for param in accepted:
            value = params[param] if param in params else kind.default(param)
            if value is _REQUIRED:
                raise GwdetTypeError(f"gwdet.norm({name!r}) needs a value for {param!r}")
            key = kind.config_keys.get(param)
            check = _CHECKS.get(key) if key is not None else None
            if check is not None:
                source = "" if kind.builtin else f" (read from {key})" if read_from_config else \
                    f" (given to gwdet.norm, checked as its config key {key})"
                check("config" if read_from_config else "gwdet.norm", f"{param} of norm {name!r}{source}", value)
            elif param in params:
                _check_kind_of_default(name, param, value, kind.default(param),
                                       f" (read from {key})" if read_from_config and key is not None else "")
            values[param] = _as_default_kind(value, kind.default(param))
        _set_norm_fields(self, name, NormParams(values), strict, read_from_config, kind)

    def __setattr__(self, attribute: str, value: Any) -> None:
        """Refuse every assignment: a Norm's name and values were checked together when it was made,
        and the layers it builds, its equality and its hash follow them."""
        raise GwdetAttributeError(
            f"{self!r} is read-only: its name and values were checked together when it was made, so "
            f"{attribute}={value!r} cannot be set on it. Build a new one with the values you want, "
            f"e.g. gwdet.norm({self.name!r}, ...).")

    def __delattr__(self, attribute: str) -> None:
        """Refuse every deletion, as :meth:`__setattr__` refuses every assignment."""
        raise GwdetAttributeError(
            f"{self!r} is read-only: {attribute} cannot be deleted from it. Build a new one with the values you "
            f"want, e.g. gwdet.norm({self.name!r}, ...).")

    def __getstate__(self) -> dict[str, Any]:
        """What pickling, ``copy.deepcopy`` and ``LazyConfig.save`` (a ``!!python/object`` tag) keep of
        a Norm: its name, its values as a plain dict and its flags."""
        return {"name": self.name, "params": dict(self.params), "strict": self.strict,
                "read_from_config": self.read_from_config}

    def __setstate__(self, state: Mapping[str, Any]) -> None:
        """The Norm :meth:`__getstate__` kept, set without checking the values again (they were
        checked when it was made)."""
        _set_norm_fields(self, state["name"], NormParams(state["params"]), state["strict"],
                         state.get("read_from_config", False), _RECORDS.get(state["name"]))

    def __copy__(self) -> Norm:
        """The same norm, made with the same registration of its name (:meth:`_record_now`)."""
        return self.__deepcopy__({})

    def __deepcopy__(self, memo: dict[int, Any]) -> Norm:
        """The same norm with its own copy of the values, made with the same registration of its
        name (pickling keeps no build function: an unpickled Norm takes the name's registration
        in the process that unpickles it)."""
        made = object.__new__(Norm)
        _set_norm_fields(made, self.name, NormParams(dict(self.params)), self.strict, self.read_from_config,
                         self._record)
        memo[id(self)] = made
        return made

    def _record_now(self) -> NormRecord:
        """The name's :class:`NormRecord`, refused when it is not the registration this Norm was made
        with: the name was unregistered and registered again with another build function or other
        settings since (:func:`_same_registration`; a file read again that registers the same code
        is the same), and this Norm would build the new registration's layer with values checked
        against the earlier one."""
        record = norm_record(self.name)
        made_with = self._record
        if made_with is None or record is made_with or _same_registration(made_with, record):
            return record
        earlier, now = build_name(made_with.build), build_name(record.build)
        if earlier == now:
            earlier, now = f"one {earlier}", f"another function named {now}"
        raise GwdetValueError(
            f"{self!r} was made while {self.name!r} was registered with {earlier}; the name has been registered "
            f"anew since, with {now}{'' if made_with.build is not record.build else ' and other settings'}, so this "
            f"norm would build the new registration's layers with values checked against the earlier one. Make the "
            f"norm again after the registration you want: gwdet.norm({self.name!r}"
            + "".join(f", {key}={value!r}" for key, value in self.params.items())
            + ") (or register the earlier function again to build with it).")

    @property
    def batch_statistics(self) -> bool:
        """Whether the layer normalizes with statistics over several examples (BN, BW, BGN)."""
        return norm_record(self.name).batch_statistics

    def __call__(self, *positional: Any, **settings: Any) -> torch.nn.Module:
        """The layer of this norm for a channel count given alone: positionally, as
        detectron2's ``get_norm(norm, channels)`` calls it (``norm(16)``), or by keyword, as
        ``channels`` (``norm(channels=16)``, the word of a norm's callable ``channels -> nn.Module``)
        or torch's ``num_channels`` (``norm(num_channels=16)``). No channel count, or more than one,
        is refused, and so are more positional arguments, torch's other words for the channel count
        (``num_features``, ``normalized_shape``) and other keywords (``eps=...``), with the fix: the
        settings belong to :func:`norm`. After the norm's name was registered anew with another
        build function, the Norm made before is refused (:meth:`_record_now`)."""
        forms = "norm(16), norm(channels=16) or norm(num_channels=16)"
        accepted = list(norm_record(self.name).params())
        if len(positional) > 1:
            raise GwdetTypeError(
                f"{self!r} was called with {len(positional)} positional arguments "
                f"({', '.join(map(repr, positional))}): a norm takes the channel count alone, {forms} (as detectron2's "
                f"get_norm(norm, channels) calls it), and its settings are fixed when it is made: give them to "
                f"gwdet.norm({self.name!r}, <setting>=...) (the settings {self.name!r} takes: {accepted or 'none'}).")
        other_words = [key for key in settings if key in _CHANNEL_ARGUMENTS and key not in _CALL_CHANNEL_KEYWORDS]
        if other_words:
            given = ", ".join(f"{key}={settings[key]!r}" for key in other_words)
            raise GwdetTypeError(
                f"{self!r} was called with {given}, torch's word for a layer's channel count, which a norm does not "
                f"take: a norm takes the channel count alone, {forms}, e.g. norm({settings[other_words[0]]!r}) "
                f"(gwdet.norm takes no channel count either: the call gives it).")
        counts = {key: settings.pop(key) for key in _CALL_CHANNEL_KEYWORDS if key in settings}
        if positional:
            counts = {"positionally": positional[0], **counts}
        if len(counts) > 1:
            given = ", ".join(f"{value!r} {key}" if key == "positionally" else f"{key}={value!r}"
                              for key, value in counts.items())
            raise GwdetTypeError(
                f"{self!r} was called with more than one channel count ({given}): give the channel count once, "
                f"e.g. norm({next(iter(counts.values()))!r}), as detectron2's get_norm(norm, channels) calls it.")
        channels: Any = next(iter(counts.values()), _NO_DEFAULT)
        if channels is _NO_DEFAULT and not settings:
            raise GwdetTypeError(
                f"{self!r} was called without a channel count: a norm builds its layer for the channel count it is "
                f"called with, e.g. norm(32) (as detectron2's get_norm(norm, channels) calls it), norm(channels=32) or "
                f"norm(num_channels=32); gwdet.norm({self.name!r}, ...) takes the settings, the call the channels.")
        if settings:
            channels = 16 if channels is _NO_DEFAULT else channels
            given = ", ".join(f"{key}={value!r}" for key, value in settings.items())
            merged = ", ".join(f"{key}={value!r}" for key, value in {**self.params, **settings}.items())
            raise GwdetTypeError(
                f"{self!r} was called with {given}: a norm builds its layer from the channel count alone "
                f"(norm({channels!r}) or norm(num_channels={channels!r})), and its settings are fixed when it is "
                f"made. Give them to gwdet.norm: gwdet.norm({self.name!r}, {merged}) (the settings "
                f"{self.name!r} takes: {accepted or 'none'}).")
        if isinstance(channels, torch.Tensor):  # a module's forward calling the Norm given where a layer belongs
            raise GwdetTypeError(
                f"gwdet.norm({self.name!r}) was called with a tensor of shape {list(channels.shape)}: it builds a layer "
                f"for a channel count, and is not the layer itself (a module given it as its norm layer, as "
                f"detectron2's Conv2d(..., norm=...) takes one, runs it on its input). Give such a module the built "
                f"layer: detectron2's get_norm(norm, channels), or norm(channels).")
        check_int_at_least(f"The norm {self.name!r}", "channels", channels, 1)
        record = self._record_now()
        try:
            layer = record.build(channels, **self.params)
        except (TypeError, ValueError, ArithmeticError) as error:  # ArithmeticError: GroupNorm(0, c)'s modulo by zero
            if record.builtin or isinstance(error, GwdetError):
                raise
            raise GwdetValueError(
                f"The norm {self.name!r} (a registered name) could not build a layer of {channels} channels with "
                f"{self._values_given(record)}: its build function "
                f"{getattr(record.build, '__qualname__', record.build)} raised {type(error).__name__}: {error}. "
                "Give values it can build with (--verbose shows where it failed).") from error
        if not record.builtin:
            check_norm_layer(layer, channels, record.build, name=self.name, values=self._values_given(record))
            setattr(layer, NORM_LAYER_MARK, True)
            setattr(layer, NORM_SETTINGS_MARK, dict(self.params))
        adjusted = group_adjustment(layer)
        if adjusted is not None:
            what, requested, used = adjusted
            message = f"{self.name} with {requested} {what} cannot divide {channels} channels"
            if self.strict:
                raise GwdetValueError(f"{message} (strict: refused; allowed, the layer would use {used}). Choose a "
                                      "value that divides the channels, or allow the adjustment (strict=False; "
                                      "MODEL.STRICT_NORM_GROUPS False).")
            log_first_n(logging.WARNING, f"{message}; the layer uses {used}.", key="message", name=__name__)
        return layer

    def _values_given(self, record: NormRecord) -> str:
        """The values this norm builds with, and where they come from, as a refusal of its build
        names them: ``"groups=0 (groups from MODEL.MYSEC.GROUPS in a yacs config)"``."""
        values = ", ".join(f"{key}={value!r}" for key, value in self.params.items()) or "no values"
        keys = ", ".join(f"{key} from {config_key}" for key, config_key in record.config_keys.items())
        source = (" (the values of gwdet.norm)" if not self.read_from_config else
                  f" ({keys} in a yacs config)" if keys else "")
        return f"{values}{source}"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Norm):
            return NotImplemented
        return (self.name, self.params, self.strict) == (other.name, other.params, other.strict)

    def __hash__(self) -> int:
        return hash((self.name, tuple((key, _hashable(value)) for key, value in sorted(self.params.items())),
                     self.strict))

    def __repr__(self) -> str:
        args = "".join(f", {key}={value!r}" for key, value in self.params.items())
        return f"Norm({self.name!r}{args}{', strict=True' if self.strict else ''})"


def check_norm_layer(layer: Any, channels: int, build: Callable, *, name: str | None = None,
                     path: str | None = None, values: str = "") -> None:
    """Refuse what a norm's callable ``build`` returned for ``channels`` channels where a model built
    with it would be broken without a word, or fail only at its first input: no torch module (``None``
    would leave the conv without norm and, detectron2 dropping the bias of a conv given a norm, without
    bias); torch's ``Identity`` (the same); torch's ``LayerNorm`` over the last axis (the feature map's
    width); a ``GroupNorm`` torch would refuse at the first forward (:func:`unbuilt_group_norms`); a
    layer of other channels (:func:`layer_channels`); a tensor of another floating dtype than the
    default, or on the meta device. One check for both kinds of callable: a registered name's build
    function (``name``, with the ``values`` it built with; :meth:`Norm.__call__`), and a callable given
    as a LazyConfig's norm argument at ``path`` (:class:`gwdet.engine.lazy_checks.CheckedNorm`), whose
    messages name that path and the LazyConfig's fixes."""
    shown = getattr(build, "__qualname__", build)
    if path is None:
        owner, function = f"The norm {name!r}: its build function {shown}", "function"
        returns = "make it return the layer"
        no_norm = ("set the NORM key to '' (detectron2's no norm, which keeps the bias; norm='' in a LazyConfig), "
                   "or make the function return a norm layer")
        other_layer = "register a function that returns"
        groups = (f"The norm {name!r} (a registered name): its build function {shown} returned a "
                  f"{type(layer).__name__} for {channels} channels with {values}")
        groups_fix = "Give values it can build with."
    else:
        owner, function = f"{path}: the callable {shown}", "callable"
        no_norm_given = f"give {path}='' (detectron2's no norm, which keeps the bias; {path} = '' in Python)"
        no_norm = f"{no_norm_given}, or make the callable return a norm layer"
        returns = ("a norm argument takes a name detectron2's get_norm knows, L(gwdet.norm)(name=..., ...), or a "
                   "callable of the channel count that returns a normalization module of that many channels "
                   f"(lambda channels: torch.nn.GroupNorm(32, channels)); for no norm, {no_norm_given}.")
        other_layer = "give a callable that returns"
        groups = f"{owner} returned a {type(layer).__name__} for {channels} channels"
        groups_fix = "Make the callable build a group count that divides the channels it is given."
    if not isinstance(layer, torch.nn.Module):
        raise GwdetTypeError(
            f"{owner} returned {layer!r} ({type(layer).__name__}) for {channels} channels, not a torch.nn.Module; "
            f"{returns}")
    if isinstance(layer, torch.nn.Identity):  # detectron2 gives a conv with a norm no bias
        raise GwdetValueError(
            f"{owner} returned {layer!r} for {channels} channels; detectron2 drops the bias of a conv given a norm, "
            f"so the layer would have neither normalization nor bias. For no norm, {no_norm}.")
    if (isinstance(layer, torch.nn.LayerNorm) and type(layer).forward is torch.nn.LayerNorm.forward
            and tuple(layer.normalized_shape) == (channels,)):
        raise GwdetValueError(
            f"{owner} returned torch's {layer!r} for {channels} channels, which normalizes over the last axis of its "
            f"input: the width of detectron2's (N, C, H, W) feature maps, not the channels (and a map {channels} wide "
            "is the only one it runs on). For a layer norm over the channels, use gwdet's 'LN' (detectron2's "
            f"LayerNorm, gwdet.norm('LN')), or {other_layer} torch.nn.GroupNorm(1, channels) (over the channels and "
            "the whole map).")
    broken = unbuilt_group_norms(layer)
    if broken:
        raise GwdetValueError(
            f"{groups}, holding {listed(broken, 3)}: torch's GroupNorm needs at least 1 group and a group count that "
            f"divides its channels, which it checks at the first forward (a RuntimeError there), not when built. "
            f"{groups_fix}")
    built_for = layer_channels(layer)
    if built_for is not None and built_for != channels:
        raise GwdetValueError(
            f"{owner} returned a {type(layer).__name__} of {built_for} channels where {channels} were asked (its first "
            f"input would fail in torch): build the layer for the channel count the {function} is given.")
    _refuse_other_dtype_or_meta(owner, "build function" if path is None else "callable", layer, channels)


def _refuse_other_dtype_or_meta(owner: str, function: str, layer: torch.nn.Module, channels: int) -> None:
    """Refuse the layer a norm's ``function`` (``owner``: the start of the message, naming it)
    returned for ``channels`` channels when one of its parameters or buffers is of a floating dtype
    other than ``torch.get_default_dtype()`` (the dtype the convolution around it is built in; the
    model's forward would stop at torch's "mixed dtype"), or on the meta device while the default
    device is not (its values do not exist, and the model cannot be moved off it with ``.to()``
    after building)."""
    default_dtype = torch.get_default_dtype()
    try:
        meta_default = torch.get_default_device().type == "meta"  # a model built on the meta device as a whole
    except RuntimeError:  # a default device this machine lacks: not the meta device
        meta_default = False
    for tensor_name, tensor in [*layer.named_parameters(), *layer.named_buffers()]:
        if tensor.is_floating_point() and tensor.dtype != default_dtype:
            raise GwdetValueError(
                f"{owner} returned a {type(layer).__name__} for {channels} channels whose {tensor_name} is "
                f"{tensor.dtype}, where the model is built in torch's default dtype, {default_dtype} (that of the "
                f"convolution around the norm): the model's forward would stop at torch's \"mixed dtype\" error. "
                f"Build the layer in the default dtype (no dtype=, .double(), .half() or .to({tensor.dtype}) in the "
                f"{function}); for a model in {tensor.dtype}, move the whole model after building it "
                f"(model.to({tensor.dtype})).")
        if tensor.device.type == "meta" and not meta_default:
            raise GwdetValueError(
                f"{owner} returned a {type(layer).__name__} for {channels} channels whose {tensor_name} is on the "
                "meta device, which holds no values: the model cannot be moved off it (detectron2 moves the model "
                "to MODEL.DEVICE with .to() after building it). Build the layer on a real device (no device='meta' "
                f"in the {function}): the model is moved with .to() after building.")


def already_a_norm_message(given: Norm, params: Mapping[str, Any]) -> str:
    """What :class:`Norm` (and :func:`norm`) says when given the :class:`Norm` ``given`` where the
    name goes, with the settings ``params``: it is a norm already; use it, or make one of its name
    with other values (``params`` over its own)."""
    fix = "use it as it is (detectron2 takes it wherever it takes a norm, e.g. norm=n)"
    if params:
        shown = ", ".join(f"{key}={value!r}" for key, value in {**given.params, **params}.items())
        fix += f"; with these values it is gwdet.norm({given.name!r}, {shown})"
    elif given.params:
        fix += "; for other values, make one of its name: gwdet.norm(n.name, **{**n.params, <setting>: <value>})"
    return f"gwdet.norm takes a norm name (a string such as 'GW'), got {given!r}, which is already a norm: {fix}."


def _set_norm_fields(made: Norm, name: str, params: Mapping[str, Any], strict: bool, read_from_config: bool,
                     record: NormRecord | None) -> None:
    """Set the fields of the read-only ``made`` (:meth:`Norm.__setattr__` refuses assignments);
    ``record``: the registration of ``name`` it was made with (``None``: unknown, the name's
    registration at each call is taken)."""
    object.__setattr__(made, "name", name)
    object.__setattr__(made, "params", params)
    object.__setattr__(made, "strict", strict)
    object.__setattr__(made, "read_from_config", read_from_config)
    object.__setattr__(made, "_record", record)


def norm(name: str, *positional: Any, strict: bool = False, **params: Any) -> Norm:
    """The norm ``name`` with hyper-parameters ``params`` (the rest: gwdet's config defaults);
    ``strict=True`` refuses a group number a layer's channels cannot use. Everything but the name
    is given by keyword: ``gwdet.norm("GW", 8)`` is refused (8 groups? 8 channels?).

    The documented entry point for Python and LazyConfig users (``L(gwdet.norm)(name="GW",
    num_groups=16)``); see :class:`Norm`. ``None`` for a setting the norm does not take leaves it
    out (an override ``...norm.T=null`` after ``...norm.name=GW_ZCA``); any other value it does
    not take is refused.
    """
    if positional:
        raise GwdetTypeError(
            f"gwdet.norm({name!r}, {', '.join(map(repr, positional))}): give the norm's settings by keyword, e.g. "
            f"gwdet.norm({name!r}, num_groups=...); the layer's channels are given when detectron2 builds it.")
    return Norm(name, strict, **params)


# The whitening method of each built-in whitening name: the name chooses it (gwdet.norm takes no method)
_WHITENING_METHODS = {"GW": "ItN", "GW_ZCA": "ZCA", "BW": "ZCA", "BW_ItN": "ItN"}
# Arguments of a layer class that are its channel count, which detectron2 gives when it builds the layer
_CHANNEL_ARGUMENTS = ("num_channels", "num_features", "channels", "normalized_shape")
# The keywords a Norm takes the channel count by: the word of gwdet's docs and messages, and torch's
_CALL_CHANNEL_KEYWORDS = ("channels", "num_channels")


def _layer_arguments(record: NormRecord) -> dict[str, Any]:
    """``{argument: default}`` of the layer class ``record`` builds (its first layer type), besides
    the channel count: what a norm name that does not set an argument leaves at that default."""
    if not record.layer_types:
        return {}
    try:
        parameters = inspect.signature(record.layer_types[0]).parameters.values()
    except (TypeError, ValueError):  # no signature to read
        return {}
    return {p.name: p.default for p in parameters if p.default is not p.empty and p.name not in _CHANNEL_ARGUMENTS
            and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def unknown_params_message(name: str, accepted: Sequence[str], unknown: Sequence[str], node: str | None = None, *,
                           added: bool = False) -> str:
    """What :class:`Norm` says of values ``unknown`` that the norm ``name`` does not take (it takes
    ``accepted``), with the fix for each: a setting of other norms (in a LazyConfig node an override
    switched to ``name``, set to null), ``method`` (the name chooses it: GW or GW_ZCA, BW or BW_ItN),
    a misspelt setting (the close one), an argument of the layer class the name does not set (a
    registered name of one's own, or a function of the channel count), or none of these (left out).
    ``node``: the path of the LazyConfig node that gave them, if known; ``added``: the values are
    being added to that node by overrides (not yet in it)."""
    said = f"gwdet.norm({name!r}) takes {list(accepted) or 'no hyper-parameters'}, not {list(unknown)}"
    record = _RECORDS.get(name)
    layer_arguments = _layer_arguments(record) if record is not None else {}
    takers = {key: [other.name for other in norm_records() if other.name != name and key in other.params()]
              for key in unknown}
    of_others = [key for key in unknown if takers[key]]
    method = [key for key in unknown if key == "method" and name in _WHITENING_METHODS and key not in of_others]
    close = {key: match[0] for key in unknown if key not in of_others + method
             for match in [difflib.get_close_matches(key, accepted, n=1, cutoff=0.6)] if match}
    of_layer = [key for key in unknown if key not in of_others + method and key not in close
                and key in layer_arguments]
    rest = [key for key in unknown if key not in of_others + method + of_layer and key not in close]
    path = f"{node}." if node is not None else ""

    def them(keys: Sequence[str]) -> str:
        return "them" if len(keys) > 1 else "it"

    def leave_out(keys: Sequence[str]) -> str:
        if node is not None and not added:
            return f"set {' '.join(f'{node}.{key}=null' for key in keys)} (an override cannot delete a value)"
        return f"leave {', '.join(keys)} out"

    sentences = []
    if close:
        sentences.append("Did you mean " + ", ".join(f"{path}{match} (not {key})" for key, match in close.items())
                         + "?")
    if method:
        family = [other for other in _WHITENING_METHODS
                  if record is not None and _RECORDS[other].layer_types == record.layer_types]
        switch = next(other for other in family if other != name)
        example = f"{node}.name={switch}" if node is not None else f"gwdet.norm({switch!r}, ...)"
        sentences.append(
            "gwdet.norm chooses the whitening method by the norm's name: "
            + ", ".join(f"{other!r} {'whitens ' * (other == family[0])}by {_WHITENING_METHODS[other]}"
                        for other in family)
            + f". Give the name of the method you want ({example}), and {leave_out(method)}.")
    if of_layer:
        kind = record.layer_types[0].__name__ if record is not None else "the layer"
        defaults = ", ".join(f"{key}={layer_arguments[key]!r}" for key in of_layer)
        sentences.append(
            f"{', '.join(of_layer)} {'are arguments' if len(of_layer) > 1 else 'is an argument'} of {kind} that "
            f"gwdet.norm({name!r}) does not set (its layers keep {kind}'s {defaults}). For another value, register "
            "a norm name of your own whose build function sets it (gwdet.register_norm, docs/usage.md), or give, "
            f"where the norm is taken, a function of the channel count that builds the {kind} with it; "
            f"{leave_out(of_layer)} here.")
    if rest:
        sentences.append(f"No norm takes {', '.join(rest)}: {leave_out(rest)}.")
    if of_others and added:
        settings = "; ".join(f"{key} is a setting of {listed(takers[key], 4)}" for key in of_others)
        taking_all = [other for other in takers[of_others[0]] if all(other in takers[key] for key in of_others)]
        switch = (f": give the node a norm that takes {them(of_others)} ({node}.name={taking_all[0]}), or "
                  if taking_all else ", and no norm takes them all: ")
        sentences.append(f"{settings}, not of {name!r}{switch}leave {them(of_others)} out.")
    elif of_others and node is not None:
        sentences.append("An override keeps the node's other values; set those the norm does not take to null to "
                         f"leave them out: {' '.join(f'{node}.{key}=null' for key in of_others)}")
    elif of_others:
        sentences.append(f"Leave {', '.join(of_others)} out; in a LazyConfig node that an override switched to "
                         f"{name!r}, set {them(of_others)} to null (<the node's path>.{of_others[0]}=null), as an "
                         "override cannot delete a value.")
    return f"{said}. {' '.join(sentences)}"


def norm_from_config(name: Any, cfg) -> Any:
    """What to pass detectron2 as ``norm`` for the NORM value ``name`` of the yacs config ``cfg``.

    * ``""``, ``None`` and callables are returned as they are; a layer (an ``nn.Module`` instance:
      callable, but on a tensor) and another value that is no string, a false one (``False``, ``0``,
      ``[]``) too, are refused (``GwdetTypeError``);
    * detectron2's names without hyper-parameters in the config (BN, FrozenBN, SyncBN, LN, ...)
      are returned as they are, so its components keep their behaviour for them;
    * every other name becomes a :class:`Norm` holding ``cfg``'s values of its keys (``MODEL.GW.*``
      for GW, ``MODEL.GN.NUM_GROUPS`` for GN, ...). ``GN`` too, whatever its group count: gwdet
      builds torch's ``GroupNorm`` with GW's channel-group rule (a group count that does not divide
      a layer's channels is adjusted and logged, or refused with ``MODEL.STRICT_NORM_GROUPS``, where
      torch's would stop). ``cfg`` must have gwdet's keys (:func:`gwdet.add_gwdet_config`); a
      plain dict given as ``cfg`` is refused first (:func:`gwdet.config.refuse_a_mapping_as_a_config`).
    """
    refuse_a_mapping_as_a_config(f"norm_from_config({name!r}, cfg)", cfg)
    if isinstance(name, torch.nn.Module):  # callable, but its forward takes a tensor, not a channel count
        raise GwdetTypeError(
            f"norm_from_config: {name!r} is a layer, not what builds one: a NORM value is a norm name (a string such "
            "as 'GW'), '' for none, or a callable channels -> nn.Module that returns a new layer for each part, where "
            "this one layer object would be shared by every part given it. Give a name with the settings you want "
            f"(gwdet.norm('GW', num_groups=16)), or a function of the channel count that builds a new "
            f"{type(name).__name__} at each call.")
    if name is None or (isinstance(name, str) and not name) or callable(name):
        return name
    if not isinstance(name, str):
        empty = (" It is empty or false, and detectron2 would call it as a norm: for no norm give '' (or None)."
                 if _is_false(name) else "")
        raise GwdetTypeError(
            f"norm_from_config: a NORM value is a norm name (a string such as 'GW'), '' for none, or a callable "
            f"channels -> nn.Module (gwdet.norm(...)); got {name!r} ({type(name).__name__}).{empty} Known names: "
            f"{', '.join(known_norm_names())}.")
    record = norm_record(name)
    if not record.config_keys and detectron2_builds_as_configured(name, cfg):
        return name
    values = _config_values(record, cfg)
    return Norm(name, bool(config_value(cfg, "MODEL.STRICT_NORM_GROUPS")), read_from_config=True, **values)


def _is_false(value: Any) -> bool:
    """Whether ``value`` is false in Python (``False``, ``0``, ``[]``, ...); ``False`` for a value
    whose truth is not defined (an array of several values)."""
    try:
        return not value
    except (ValueError, TypeError, RuntimeError):
        return False


# ---- the built-in names ------------------------------------------------------------------------
# "pragma: no mutate": code that runs once, while this module is imported (docs/reliability.md,
# "Mutation testing").

def _detectron2_norm(name: str) -> Callable[[int], torch.nn.Module]:  # pragma: no mutate block
    def build(channels: int) -> torch.nn.Module:
        return detectron2_get_norm(name, channels)

    build.__name__ = f"detectron2_{name}"
    return build


# the attribute of a GN layer that keeps the group count asked for (group_adjustment)
REQUESTED_GROUPS = "requested_num_groups"


def _group_norm(channels: int, num_groups: int) -> torch.nn.Module:
    """torch's ``GroupNorm`` (Wu & He 2018) over the largest divisor of ``channels`` not above
    ``num_groups``: GW's channel-group rule, where torch would stop ("num_channels must be
    divisible by num_groups"). The layer stays torch's class with torch's state dict, so that its
    weights move between gwdet's components and detectron2's; the request is kept on it for
    :func:`group_adjustment`."""
    layer = torch.nn.GroupNorm(largest_divisor_at_most(channels, num_groups), channels)
    setattr(layer, REQUESTED_GROUPS, num_groups)
    return layer


def _group_whitening_itn(channels: int, num_groups: int, T: int, eps: float) -> torch.nn.Module:
    return GroupWhitening(channels, num_groups=num_groups, T=T, eps=eps, method="itn")


def _group_whitening_zca(channels: int, num_groups: int, eps: float) -> torch.nn.Module:
    return GroupWhitening(channels, num_groups=num_groups, eps=eps, method="zca")


def _batch_whitening_zca(channels: int, group_size: int, eps: float, momentum: float) -> torch.nn.Module:
    return BatchWhitening(channels, group_size=group_size, eps=eps, momentum=momentum, method="zca")


def _batch_whitening_itn(channels: int, group_size: int, T: int, eps: float,
                         momentum: float) -> torch.nn.Module:
    return BatchWhitening(channels, group_size=group_size, T=T, eps=eps, momentum=momentum, method="itn")


def _batch_group_norm(channels: int, num_groups: int, examples_per_group: int, eps: float,
                      momentum: float, eval_example_weight: float) -> torch.nn.Module:
    return BatchGroupNorm(channels, num_groups=num_groups, examples_per_group=examples_per_group,
                          eps=eps, momentum=momentum, eval_example_weight=eval_example_weight)


def _ghost_batch_norm(channels: int, examples_per_group: int, eps: float, momentum: float,
                      eval_example_weight: float) -> torch.nn.Module:
    return _batch_group_norm(channels, channels, examples_per_group, eps, momentum, eval_example_weight)


_GW_KEYS = {"num_groups": "MODEL.GW.NUM_GROUPS", "T": "MODEL.GW.T", "eps": "MODEL.GW.EPS"}
_BW_KEYS = {"group_size": "MODEL.BW.GROUP_SIZE", "T": "MODEL.BW.T", "eps": "MODEL.BW.EPS",
            "momentum": "MODEL.BW.MOMENTUM"}
_BGN_KEYS = {"num_groups": "MODEL.BGN.NUM_GROUPS", "examples_per_group": "MODEL.BGN.EXAMPLES_PER_GROUP",
             "eps": "MODEL.BGN.EPS", "momentum": "MODEL.BGN.MOMENTUM",
             "eval_example_weight": "MODEL.BGN.EVAL_EXAMPLE_WEIGHT"}


def _only(keys: Mapping[str, str], build: Callable) -> dict[str, str]:  # pragma: no mutate block
    params = list(inspect.signature(build).parameters)[1:]
    return {param: keys[param] for param in params}


_SYNC_BN = (torch.nn.SyncBatchNorm,)  # detectron2's "SyncBN" with torch > 1.5
_NAIVE_SYNC_BN = (detectron2_batch_norm.NaiveSyncBatchNorm,)  # a BatchNorm2d
# The layers of SyncBN, nnSyncBN and naiveSyncBN: their batch statistics span every process's images,
# and their forward asks the process group from Python (which TorchScript cannot compile).
SYNCHRONIZED_NORMS = _SYNC_BN + _NAIVE_SYNC_BN
_DETECTRON2_LN = getattr(detectron2_batch_norm, "LayerNorm", torch.nn.LayerNorm)


# pragma: no mutate start
def _detectron2_record(name: str, batch_statistics: bool, layers: tuple[type, ...],
                       per_level: bool = False) -> NormRecord:
    return NormRecord(name, _detectron2_norm(name), batch_statistics=batch_statistics, layer_types=layers,
                      detectron2_values={}, detectron2_per_level=per_level, builtin=True)
# pragma: no mutate end


_BUILTINS = [
    _detectron2_record("BN", True, (torch.nn.BatchNorm2d,), per_level=True),
    _detectron2_record("SyncBN", True, _SYNC_BN, per_level=True),
    _detectron2_record("FrozenBN", False, (detectron2_batch_norm.FrozenBatchNorm2d,)),
    _detectron2_record("nnSyncBN", True, _SYNC_BN),
    _detectron2_record("naiveSyncBN", True, _NAIVE_SYNC_BN),
    _detectron2_record("naiveSyncBN_N", True, _NAIVE_SYNC_BN),
    _detectron2_record("LN", False, (_DETECTRON2_LN,)),
    NormRecord("GN", _group_norm, {"num_groups": "MODEL.GN.NUM_GROUPS"}, layer_types=(torch.nn.GroupNorm,),
               detectron2_values={"num_groups": DETECTRON2_GN_GROUPS}, builtin=True),
    NormRecord("GW", _group_whitening_itn, _only(_GW_KEYS, _group_whitening_itn),
               layer_types=(GroupWhitening,), builtin=True),
    NormRecord("GW_ZCA", _group_whitening_zca, _only(_GW_KEYS, _group_whitening_zca),
               layer_types=(GroupWhitening,), builtin=True),
    NormRecord("BW", _batch_whitening_zca, _only(_BW_KEYS, _batch_whitening_zca), batch_statistics=True,
               layer_types=(BatchWhitening,), builtin=True),
    NormRecord("BW_ItN", _batch_whitening_itn, _only(_BW_KEYS, _batch_whitening_itn), batch_statistics=True,
               layer_types=(BatchWhitening,), builtin=True),
    NormRecord("BGN", _batch_group_norm, _only(_BGN_KEYS, _batch_group_norm), batch_statistics=True,
               layer_types=(BatchGroupNorm,), example_groups=True, builtin=True),
    NormRecord("GhostBN", _ghost_batch_norm, _only(_BGN_KEYS, _ghost_batch_norm), batch_statistics=True,
               layer_types=(BatchGroupNorm,), example_groups=True, builtin=True),
]
_RECORDS.update((record.name, record) for record in _BUILTINS)


# ---- norm layers outside the catalogue ---------------------------------------------------------
# What gwdet's checks and records know of torch's and detectron2's norm classes besides the layer
# types of the names above: layers built without a name (by a LazyConfig's lambda, say) and
# detectron2's own lists. Each fact is here once; its readers add the catalogue's layer types.

# The classes detectron2's get_default_optimizer_params gives weight_decay_norm (its own list,
# detectron2/solver/build.py, 0.6 to 0.7; its NaiveSyncBatchNorm derives from BatchNorm2d).
# gwdet.solver adds the layer types of the names detectron2 does not build
# (layer_types(detectron2=False)).
DETECTRON2_OPTIMIZER_NORMS: tuple[type[torch.nn.Module], ...] = (
    torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.BatchNorm3d, torch.nn.SyncBatchNorm, torch.nn.GroupNorm,
    torch.nn.InstanceNorm1d, torch.nn.InstanceNorm2d, torch.nn.InstanceNorm3d, torch.nn.LayerNorm,
    torch.nn.LocalResponseNorm,
)

# The classes that make one function at evaluation of the same weights and running statistics,
# (x - running_mean) / sqrt(running_var + eps) * weight + bias: BN, SyncBN, naiveSyncBN and FrozenBN.
# Weights of one load into another (detectron2 fine-tunes weights trained with BN as FrozenBN), and
# their eps is compared (gwdet.checkpoint.compatibility).
RUNNING_STATISTICS_NORMS: tuple[type[torch.nn.Module], ...] = (
    torch.nn.BatchNorm2d, torch.nn.SyncBatchNorm, detectron2_batch_norm.NaiveSyncBatchNorm,
    detectron2_batch_norm.FrozenBatchNorm2d,
)

# torch's batch norms of every kind (BatchNorm1d and 3d and the lazy ones too, which no name
# builds): they normalize with statistics over several examples, as the names with
# batch_statistics do (gwdet.modeling.model_checks).
TORCH_BATCH_NORMS: tuple[type[torch.nn.Module], ...] = (torch.nn.modules.batchnorm._BatchNorm,)

# torch's and detectron2's norm classes, each with the attributes that make such a layer the
# function it is (the first class a layer is an instance of counts; gwdet's layers name theirs in
# HYPER_PARAMETERS). gwdet's checkpoints record the class of every such layer, whoever built it,
# and these values (gwdet.checkpoint.compatibility). _NormBase: torch's batch and instance norms. affine (whether
# the layer has weight and bias) and track_running_stats (whether it normalizes with running statistics at
# evaluation) are recorded too: a checkpoint's weights or statistics would otherwise be dropped without a refusal.
# FrozenBatchNorm2d has neither attribute (gwdet.checkpoint.compatibility compares it as the batch norm it is).
TORCH_NORM_SETTINGS: tuple[tuple[type[torch.nn.Module], tuple[str, ...]], ...] = (
    (torch.nn.GroupNorm, ("num_groups", "eps", "affine")),
    (torch.nn.modules.batchnorm._NormBase, ("eps", "momentum", "affine", "track_running_stats")),
    (detectron2_batch_norm.FrozenBatchNorm2d, ("eps",)),
    (torch.nn.LayerNorm, ("normalized_shape", "eps", "elementwise_affine")),
    *(((_DETECTRON2_LN, ("eps",)),) if _DETECTRON2_LN is not torch.nn.LayerNorm else ()),
)

# detectron2's container of one batch norm per FPN level, in which its RetinaNetHead keeps the
# layers of the names with detectron2_per_level (detectron2 releases after 0.6 only).
DETECTRON2_PER_LEVEL_NORMS: tuple[type[torch.nn.Module], ...] = (
    (detectron2_batch_norm.CycleBatchNormList,) if hasattr(detectron2_batch_norm, "CycleBatchNormList") else ())
