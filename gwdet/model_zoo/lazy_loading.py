"""Reading a LazyConfig (``.py``) the way gwdet's tools read it: detectron2's ``LazyConfig.load``,
then the command line's ``key=value`` overrides, each key checked.

A run's ``config.yaml`` that ``LazyConfig.save`` wrote is a LazyConfig too (:func:`is_lazy_config`):
it is read without ``yaml.unsafe_load``, building only the objects such a file holds (``ShapeSpec``,
and the classes or functions named by ``!!python/name`` tags, imported as a ``_target_`` is); any
other tag that would build a Python object is refused.

An override's key must exist in the config, or name an argument of the callable of the ``L(...)``
node it is set on (on a ``gwdet.norm`` node: a setting of its norm name); ``+key=value`` adds a key
on purpose. A misspelt key is an error naming the close ones, never a new key; a key below a
reference to a shared node (``"${..stem.norm}"``) is refused, since setting it would replace the
reference. A mapping with a ``_target_`` given for a node replaces it (a node of its own, whose
left-out values take their defaults); one without sets its keys in the node. A key with an empty part (``train..max_iter``) and
an override hydra's grammar cannot read (``train.max_iter==3``) are refused naming the override,
before any is applied. :func:`load_lazy_config` is the one loader of LazyConfigs for the train,
export and analyze tools (:mod:`gwdet.model_zoo.loading` is the yacs one).
"""
from __future__ import annotations

import ast
import difflib
import importlib.util
import inspect
import os
import re
import sys
from pathlib import PurePath
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from detectron2.config import LazyCall, LazyConfig, get_cfg
from detectron2.layers import ShapeSpec
from detectron2.utils.registry import locate

from gwdet.config import ABSENT
from gwdet.errors import GwdetFileNotFoundError, GwdetTypeError, GwdetValueError, did_you_mean
from gwdet.model_zoo.model_zoo import configs_dir
from gwdet.utils.command_line import warn_of_repeated_overrides

LAZY_SUFFIX = ".py"
SAVED_SUFFIXES = (".yaml", ".yml")
OUTPUT_SETTING = "train.output_dir"
PYTHON_TAG = "tag:yaml.org,2002:python/"
_CFG_PACKAGE = "detectron2._cfg_loader"  # the package detectron2's LazyConfig loader runs a config file in
NORM_TAG = PYTHON_TAG + "object:gwdet.norms.Norm"  # a gwdet.norm(...) object, as LazyConfig.save writes it


def is_lazy_config(config_file: str | os.PathLike | None) -> bool:
    """Whether ``config_file`` names a LazyConfig rather than a yacs config: a ``.py`` file, or a
    YAML file that ``LazyConfig.save`` wrote (a mapping whose ``model`` has a ``_target_``)."""
    path = str(config_file or "")
    if path.endswith(LAZY_SUFFIX):
        return True
    if not path.endswith(SAVED_SUFFIXES) or not os.path.isfile(path):
        return False
    try:
        tree = _yaml_as_data(path)
    except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError):  # the yacs loader names what is wrong (a date
        # that does not exist, 2026-13-01, is a ValueError of the YAML reader)
        return False
    return _is_saved_lazy_config(tree)


def _is_saved_lazy_config(tree: Any) -> bool:
    """Whether the data of a YAML file is what ``LazyConfig.save`` writes: a mapping whose ``model``
    has a ``_target_`` (beside it any module-level node of the ``.py``, ``GW`` say)."""
    return isinstance(tree, dict) and isinstance(tree.get("model"), dict) and "_target_" in tree["model"]


class _TagsAsDataLoader(yaml.SafeLoader):
    """PyYAML's ``SafeLoader`` that reads a ``!!python/...`` tag as data instead of refusing it:
    ``{"python_tag": "object:detectron2.layers.shape_spec.ShapeSpec", "value": {...}}``. Nothing
    is imported or called, and two saved configs still compare equal exactly when their tags and
    values are equal."""


def _tag_as_data(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> dict:
    if isinstance(node, yaml.MappingNode):
        value: Any = loader.construct_mapping(node, deep=True)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_scalar(node)
    return {"python_tag": suffix, "value": value}


_TagsAsDataLoader.add_multi_constructor(PYTHON_TAG, _tag_as_data)


def read_saved_config(path: str) -> Any:
    """The ``config.yaml`` at ``path`` (``LazyConfig.save``'s YAML, whose ``ShapeSpec`` and block
    classes carry ``!!python/...`` tags) as plain data, interpolations resolved, each tag read as
    data (:class:`_TagsAsDataLoader`), for comparing saved configs."""
    content = _yaml_as_data(path)
    return OmegaConf.to_container(OmegaConf.create(content), resolve=True) if isinstance(content, dict) else content


def _yaml_as_data(path: str) -> Any:
    """The YAML file at ``path`` read by :class:`_TagsAsDataLoader`."""
    with open(path, encoding="utf-8") as f:
        return yaml.load(f, Loader=_TagsAsDataLoader)  # noqa: S506 (a safe loader)


class _SavedLazyConfigLoader(yaml.SafeLoader):
    """PyYAML's ``SafeLoader`` that also builds what ``LazyConfig.save`` writes with tags: a
    ``ShapeSpec``, and a class or function named by ``!!python/name:module.name``."""


def _shape_spec(loader: yaml.SafeLoader, node: yaml.Node) -> ShapeSpec:
    return ShapeSpec(**loader.construct_mapping(node, deep=True))


def _named(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
    """The class or function the tag names by its import path; one that cannot be imported (a
    lambda or a function defined inside another, which ``LazyConfig.save`` writes as
    ``None.<lambda>``) is a constructor error naming it."""
    try:
        return locate(suffix)
    except ImportError:
        raise yaml.constructor.ConstructorError(
            None, None, f"the tag !!python/name:{suffix} names no importable object (a lambda or a function defined "
            "inside another, which YAML cannot hold)", node.start_mark) from None


class _SavedStrictError(yaml.constructor.ConstructorError):
    """A ``gwdet.norm(...)`` tag whose ``strict`` is not YAML's ``true`` or ``false``: the norm's
    name, the value and where it is in the file."""

    def __init__(self, name: str, value: Any, mark: Any) -> None:
        super().__init__(None, None, f"strict must be True or False, got {value!r} ({type(value).__name__})", mark)
        self.name, self.value = name, value


def _saved_norm(loader: yaml.SafeLoader, node: yaml.Node) -> dict:
    """A ``gwdet.norm(...)`` object as ``LazyConfig.save`` writes it (its name, values and
    strictness), read as the node ``L(gwdet.norm)(...)`` of the same values, which builds the same
    layers (:func:`norms_as_nodes`). ``strict`` is YAML's ``true`` or ``false`` (absent: false), as
    :func:`gwdet.norm` checks it; any other value (``'false'``, ``1``) is refused
    (:class:`_SavedStrictError`), not read as its truth value."""
    from gwdet.norms import norm

    state = loader.construct_mapping(node, deep=True)
    params = state.get("params", {})
    if not isinstance(state.get("name"), str) or not isinstance(params, dict):
        raise yaml.constructor.ConstructorError(
            None, None, f"the tag {NORM_TAG} holds no norm name and values ({state!r})", node.start_mark)
    strict = state.get("strict", False)
    if not isinstance(strict, bool):
        marks = [value.start_mark for key, value in node.value
                 if isinstance(key, yaml.ScalarNode) and key.value == "strict"]
        raise _SavedStrictError(state["name"], strict, marks[0] if marks else node.start_mark)
    return {"_target_": norm, "name": state["name"], **params, **({"strict": True} if strict else {})}


def _other_object(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
    raise yaml.constructor.ConstructorError(
        None, None, f"the tag !!python/{suffix} would build a Python object that a saved LazyConfig does not hold",
        node.start_mark)


_SavedLazyConfigLoader.add_constructor(PYTHON_TAG + "object:detectron2.layers.shape_spec.ShapeSpec", _shape_spec)
_SavedLazyConfigLoader.add_constructor(NORM_TAG, _saved_norm)
_SavedLazyConfigLoader.add_multi_constructor(PYTHON_TAG + "name:", _named)
_SavedLazyConfigLoader.add_multi_constructor(PYTHON_TAG, _other_object)


def _load_saved_lazy_config(path: str) -> DictConfig:
    """The LazyConfig that ``LazyConfig.save`` wrote to ``path`` (module docstring)."""
    try:
        with open(path, encoding="utf-8") as f:
            content = yaml.load(f, Loader=_SavedLazyConfigLoader)  # noqa: S506 (a safe loader)
    except _SavedStrictError as error:
        mark = error.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "its tag"
        raise GwdetValueError(
            f"Config file {path!r} is a LazyConfig saved as YAML, but the {error.name!r} norm in it (the tag "
            f"{NORM_TAG.replace(PYTHON_TAG, '!!python/')}, its strict at {where}): {error.problem}, whose truth value would make it "
            f"strict={bool(error.value)}. LazyConfig.save writes YAML's true or false: write strict: false (no "
            "quotes) to let a layer adjust a group count its channels cannot use, or strict: true to refuse such a "
            "count.") from None
    except yaml.constructor.ConstructorError as error:
        saved_numpy = _saved_numpy_values(path) if NUMPY_TAG_MARK in str(error.problem) else []
        if saved_numpy:
            raise GwdetValueError(
                f"Config file {path!r} is a LazyConfig saved as YAML, but it holds numpy values, which "
                "LazyConfig.save writes as tags that would build Python objects (!!python/object/apply:numpy...): "
                f"{_listed_numpy_values(saved_numpy)}. A saved LazyConfig holds "
                "plain values: in the config built in Python, give Python values (int(...), float(...), bool(...); "
                "of a numpy array: .item() or .tolist()) and save it again, or write the value in place of its tag "
                "in this file.") from None
        raise GwdetValueError(
            f"Config file {path!r} is a LazyConfig saved as YAML, but {error.problem} ({error.problem_mark}); "
            "gwdet builds only the ShapeSpecs, named classes and gwdet.norm(...) objects that LazyConfig.save "
            "writes. Use the .py LazyConfig the run was made from (with the same overrides), or, for a config "
            "built in Python, give that value as a node before saving it (a norm: L(gwdet.norm)(name='GW', "
            "num_groups=...); another object: L(its class)(its arguments)).") from None
    return OmegaConf.create(content, flags={"allow_objects": True})


# how the tags of numpy values begin (numpy 2: numpy._core.multiarray.scalar; numpy 1: numpy.core...)
NUMPY_TAG_MARK = "python/object/apply:numpy."


def numpy_values(cfg: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Every numpy value of the config ``cfg`` (a number, ``np.bool_`` or any other ``np.generic``,
    and an array, a 0-d one included), in its nodes and lists and in the dicts, lists and tuples
    they hold, each with its dotted key: ``[("model.backbone.norm.num_groups", np.int64(8))]``.
    ``LazyConfig.save`` writes such a value as a tag that builds a Python object, which no saved
    config may hold (:func:`_load_saved_lazy_config`)."""
    if isinstance(cfg, (DictConfig, ListConfig)):  # references (${...}) and missing values ('???') not read
        names: list[Any] = list(cfg.keys()) if isinstance(cfg, DictConfig) else list(range(len(cfg)))
        items: Iterable[tuple[Any, Any]] = [(name, cfg[name]) for name in names if not (
            OmegaConf.is_interpolation(cfg, name) or OmegaConf.is_missing(cfg, name))]
    elif isinstance(cfg, Mapping):
        items = cfg.items()
    elif isinstance(cfg, (list, tuple)):
        items = enumerate(cfg)
    else:
        return []
    found = []
    for name, value in items:
        key = f"{prefix}.{name}" if prefix else str(name)
        if isinstance(value, (np.generic, np.ndarray)):
            found.append((key, value))
        else:
            found.extend(numpy_values(value, key))
    return found


def refuse_numpy_values(cfg: Any, what: str) -> None:
    """Refuse a LazyConfig ``cfg`` (``what``: how the message names it) that holds numpy values
    (:func:`numpy_values`), naming each key with the Python value to give: the ``config.yaml`` a run
    saves of it could not be read again."""
    found = numpy_values(cfg)
    if found:
        raise GwdetValueError(
            f"{what} holds numpy values: {_listed_numpy_values(found)}. LazyConfig.save writes them as tags that build "
            "Python objects, so the config.yaml a run saves could not be read again: give Python values (int(...), "
            "float(...), bool(...); of a numpy array: .item() or .tolist()).")


def _listed_numpy_values(found: Sequence[tuple[str, Any]], limit: int = 5) -> str:
    """``key is np.int64(8), to give as 8 (int(...))`` for each of the first ``limit`` numpy values found (a
    value of None: a numpy array not read back from a saved file), and how many more there are."""
    shown = []
    for key, value in found[:limit]:
        if value is None:
            shown.append(f"{key} is a numpy array, to give as a list (.tolist()) or a number (.item())")
        elif isinstance(value, np.ndarray) and value.ndim:
            shown.append(f"{key} is {value!r}, to give as {value.tolist()!r} (.tolist())")
        else:
            plain = value.item()
            call = ".item()" if isinstance(value, np.ndarray) else f"{type(plain).__name__}(...)"
            shown.append(f"{key} is {value!r}, to give as {plain!r} ({call})")
    more = f"; and {len(found) - limit} more" if len(found) > limit else ""
    return "; ".join(shown) + more


def _saved_numpy_values(path: str) -> list[tuple[str, Any]]:
    """The numpy values ``LazyConfig.save`` wrote to ``path`` as tags (``!!python/object/apply:
    numpy...``), each with its dotted key and its value: a scalar read back from its tag's dtype and
    bytes (:func:`_saved_numpy_scalar`), None for another (an array); [] where the file cannot be read."""
    try:
        tree = _yaml_as_data(path)
    except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError):
        return []
    found: list[tuple[str, Any]] = []

    def visit(node: Any, prefix: str) -> None:
        if isinstance(node, dict) and set(node) == {"python_tag", "value"}:
            if f"python/{node['python_tag']}".startswith(NUMPY_TAG_MARK):
                found.append((prefix, _saved_numpy_scalar(node)))
            return
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for name, value in items:
            visit(value, f"{prefix}.{name}" if prefix else str(name))

    visit(tree, "")
    return found


def _saved_numpy_scalar(node: dict) -> Any:
    """The numpy scalar of a ``!!python/object/apply:numpy...multiarray.scalar`` tag read as data
    (:class:`_TagsAsDataLoader`: the tag of its dtype and its bytes), built by ``np.frombuffer``
    only; None for another numpy tag (an array)."""
    try:
        dtype_tag, data = node["value"]
        dtype = np.dtype(dtype_tag["value"]["args"][0])
        if not isinstance(data, bytes) or dtype.hasobject or len(data) != dtype.itemsize:
            return None
        return np.frombuffer(data, dtype=dtype)[0]
    except (TypeError, KeyError, IndexError, ValueError):
        return None


def callable_of(node: Any) -> Any:
    """The callable an ``L(...)`` node calls (its ``_target_``, imported when it is a name), or None."""
    if not isinstance(node, DictConfig) or "_target_" not in node:
        return None
    target = node._target_
    if isinstance(target, str):
        try:
            target = locate(target)
        except Exception:  # a name that does not import: instantiate will say so
            return None
    return target if callable(target) else None


def argument_names(target: Any) -> tuple[set[str], bool]:
    """The keyword arguments ``target`` takes, and whether it takes any (``**kwargs``)."""
    try:
        parameters = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):  # no signature to read: accept, as instantiate would try
        return set(), True
    names = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return names, any(p.kind is p.VAR_KEYWORD for p in parameters)


def select(cfg: DictConfig, key: str) -> Any:
    """The value at the dotted ``key`` of ``cfg`` (interpolations resolved where they can be), or
    :data:`ABSENT` when there is none."""
    return OmegaConf.select(cfg, key, default=ABSENT, throw_on_resolution_failure=False)


def _reference_above(cfg: DictConfig, parts: Sequence[str]) -> tuple[str, str] | None:
    """The first level above the key ``parts`` that is a reference to another node
    (``"${...stem.norm}"``), and the reference; None when there is none."""
    container: Any = cfg
    for depth in range(1, len(parts)):
        name: str | int = parts[depth - 1]
        if isinstance(container, ListConfig) and str(name).isdigit():
            name = int(name)
        if not isinstance(container, (DictConfig, ListConfig)):
            return None
        try:
            if OmegaConf.is_interpolation(container, name):
                raw: Any = OmegaConf.to_container(container, resolve=False)
                return ".".join(parts[:depth]), str(raw[name])
        except (KeyError, IndexError, ValueError, TypeError):
            return None
        container = select(cfg, ".".join(parts[:depth]))
    return None


# yacs keys of a run and the LazyConfig settings in their place (docs/usage.md)
YACS_RUN_KEYS = {"MODEL.WEIGHTS": "train.init_checkpoint", "OUTPUT_DIR": "train.output_dir", "SEED": "train.seed",
                 "MODEL.DEVICE": "train.device", "SOLVER.MAX_ITER": "train.max_iter", "SOLVER.BASE_LR": "optimizer.lr",
                 "SOLVER.IMS_PER_BATCH": "dataloader.train.total_batch_size",
                 "SOLVER.CHECKPOINT_PERIOD": "train.checkpointer.period", "TEST.EVAL_PERIOD": "train.eval_period"}


def _yacs_key_advice(key: str) -> str:
    """For a yacs key given to a LazyConfig, the words that name its LazyConfig setting ("" for others)."""
    twin = YACS_RUN_KEYS.get(key.lstrip("+"))
    if twin is not None:
        return f" {key.lstrip('+')} is a yacs config's key; a LazyConfig sets it as {twin}=..."
    top = key.lstrip("+").split(".")[0]
    if top.isupper() and top in get_cfg():
        return f" {top}.* are a yacs config's keys, which a LazyConfig does not read; set its own (docs/usage.md)."
    return ""


def check_override_key(cfg: DictConfig, key: str, given: Mapping[str, Any] | None = None,
                       coming: Mapping[str, Any] | None = None) -> None:
    """Raise ``ValueError`` unless ``key`` (dotted) is in ``cfg`` or names an argument of the
    callable of the ``L(...)`` node it would be set on, and is not below a reference to a shared
    node (which the override would replace); the message names the close keys or the fix. On a
    ``gwdet.norm`` node the arguments are those of its norm name (after the overrides: ``coming``,
    every override's value by its dotted key), besides ``name`` and ``strict``; another value
    than null is ``TypeError``, as :func:`gwdet.norm` refuses it, naming the close setting."""
    parts = key.split(".")
    _refuse_a_value_above(cfg, key, given)
    reference = _reference_above(cfg, parts)
    if reference is not None:
        level, target = reference
        raise GwdetValueError(
            f"LazyConfig override {key!r}: {level!r} is {target}, a reference to a node other settings share, "
            f"and setting a value under it would replace the reference. Set the value where it points, or give "
            f"{level} a node of its own ({level}={{_target_: ..., ...}}).")
    if select(cfg, key) is not ABSENT:
        return
    depth = len(parts) - 1  # the deepest level of the key that the config has
    while depth > 0 and select(cfg, ".".join(parts[:depth])) is ABSENT:
        depth -= 1
    parent_key, name = ".".join(parts[:depth]), parts[depth]
    parent = select(cfg, parent_key) if parent_key else cfg
    target = callable_of(parent)
    arguments, any_keyword = argument_names(target) if target is not None else (set(), False)
    if depth == len(parts) - 1:
        _check_norm_setting(cfg, parent_key, target, name, (coming or {}).get(key, ABSENT), coming or {})
    present = {str(k) for k in parent.keys()} if isinstance(parent, DictConfig) else set()
    if depth == len(parts) - 1 and name in arguments:
        return  # an argument the node's callable takes, left at its default by the config
    if depth == len(parts) - 1 and any_keyword:  # passed on through **kwargs, unless it reads as a misspelling
        misspelt = difflib.get_close_matches(name, sorted(present | arguments), n=2, cutoff=0.8)
        if not misspelt:
            return
        meant = [*_deeper_keys(parent, name, parent_key), *('.'.join([*parts[:depth], c]) for c in misspelt)]
        raise GwdetValueError(
            f"LazyConfig override {key!r}: the config has no {name!r} under {parent_key!r}, and "
            f"{getattr(target, '__qualname__', target)} passes unknown keywords on (**kwargs), where a misspelt key "
            f"fails when the model is built.{did_you_mean(meant)} Write +{key}=... to pass {name!r} on purpose.")
    if isinstance(parent, ListConfig) and name.lstrip("-").isdigit():
        raise GwdetValueError(
            f"LazyConfig override {key!r}: {parent_key} is a list of {len(parent)} item(s) (indices 0 to "
            f"{len(parent) - 1}), which has no item {name}: set one of its items, or give the whole list "
            f"({parent_key}=[...]).")
    deeper = _deeper_keys(parent, name, parent_key) if depth == len(parts) - 1 else []
    close = difflib.get_close_matches(name, sorted(present | arguments), n=3, cutoff=0.6)
    where = f"under {parent_key!r}" if parent_key else "at the top of the config"
    hint = did_you_mean([*deeper, *('.'.join([*parts[:depth], c]) for c in close)])
    named = getattr(target, "__qualname__", target)
    takes = f" ({named} takes {', '.join(sorted(arguments))})" if arguments else ""
    # a key added to an L(...) node is passed to its callable, which takes no such argument
    not_taken = (f" {named} takes no argument {name!r}, and instantiate passes every key of the node to it: a key "
                 f"added with +{key}=... would stop it." if target is not None else "")
    advice = _yacs_key_advice(key) or not_taken or (
        f" Write +{key}=... to add a new key on purpose." if parent_key else
        f" The config's top-level keys are {', '.join(sorted(map(str, present)))}; nothing reads a key added beside "
        "them, so set one of theirs (e.g. train.max_iter=...).")
    raise GwdetValueError(f"LazyConfig override {key!r}: the config has no {name!r} {where}{takes}.{hint}{advice}")


# The most keys deeper in the config that a missing key's suggestion names (_deeper_keys)
DEEPER_KEYS_SHOWN = 3


def _deeper_keys(parent: Any, name: str, parent_key: str) -> list[str]:
    """The full keys more than one level under ``parent`` (the config node at ``parent_key``, which
    has no key ``name`` of its own) whose last name is ``name``: ``optimizer.params.weight_decay_norm``
    for ``optimizer.weight_decay_norm``. The shallowest first, at most :data:`DEEPER_KEYS_SHOWN`;
    references to other nodes (``${...}``) are not followed."""
    found: list[tuple[int, str]] = []

    def walk(node: Any, path: list[str]) -> None:
        if isinstance(node, DictConfig):
            items: list[tuple[str, Any]] = [(str(key), key) for key in node.keys()]
        elif isinstance(node, ListConfig):
            items = [(str(index), index) for index in range(len(node))]
        else:
            return
        for shown, key in items:
            if OmegaConf.is_interpolation(node, key):
                continue
            here = [*path, shown]
            if shown == name and len(here) > 1:
                found.append((len(here), ".".join(filter(None, [parent_key, *here]))))
            if not OmegaConf.is_missing(node, key):  # reading a missing value ('???') raises
                walk(node[key], here)

    walk(parent, [])
    return [key for _, key in sorted(found)[:DEEPER_KEYS_SHOWN]]


def _norm_settings(name: Any) -> list[str] | None:
    """The settings ``gwdet.norm(name, ...)`` takes besides ``name`` and ``strict``, or None for a
    name the catalogue does not know (``instantiate`` names it)."""
    from gwdet.norms import UnknownNormError, norm_record

    try:
        return norm_record(name).params() if isinstance(name, str) else None
    except UnknownNormError:
        return None


def _is_norm(target: Any) -> bool:
    """Whether ``target`` is :func:`gwdet.norm`."""
    from gwdet.norms import norm

    return target is norm


def _norm_setting_default(node: Any, setting: str) -> Any:
    """The default of ``setting`` of the norm the ``gwdet.norm`` node ``node`` names (its build
    function's, or gwdet's config default for a built-in name's), or :data:`ABSENT` for a setting the
    norm does not take or a name the catalogue does not know."""
    from gwdet.norms import norm_record

    try:
        name = node.get("name", None) if isinstance(node, DictConfig) else None
    except OmegaConfBaseException:  # a name that does not resolve (instantiate names it)
        return ABSENT
    settings = _norm_settings(name)
    if not isinstance(name, str) or settings is None or setting not in settings:
        return ABSENT
    return norm_record(name).default(setting)


def _check_norm_setting(cfg: DictConfig, node: str, target: Any, setting: str, value: Any,
                        coming: Mapping[str, Any]) -> None:
    """Raise ``TypeError`` when an override sets ``setting`` to a value other than null on the
    ``gwdet.norm`` node at ``node`` (``target``: its callable) and the norm the node names after the
    overrides (``coming``) does not take it: :func:`gwdet.norm` would refuse it when the model is
    built; the message names the close setting or the norm that takes it."""
    from gwdet.norms import norm, unknown_params_message

    if target is not norm or setting in ("name", "strict", "_target_") or value is None:
        return
    name_key = f"{node}.name" if node else "name"
    name = coming[name_key] if name_key in coming else select(cfg, name_key)
    settings = _norm_settings(name)
    if settings is not None and setting not in settings:
        raise GwdetTypeError(f"{node}: {unknown_params_message(name, settings, [setting], node, added=True)}")


def _refuse_a_value_above(cfg: DictConfig, key: str, given: Mapping[str, Any] | None = None) -> None:
    """Raise ``ValueError`` when a level above the dotted ``key`` (``+`` stripped) holds a value,
    not a node (a norm given by its name, ``norm="GN"``): nothing can be set under it (omegaconf
    stops with a bare ``KeyError``), and the node that would take the key is named."""
    parts = key.lstrip("+").split(".")
    for depth in range(1, len(parts)):
        level = ".".join(parts[:depth])
        held = select(cfg, level)
        if held is ABSENT:
            return
        if not isinstance(held, (DictConfig, ListConfig)):  # as the command line sets it, where it does
            raise _value_above_error(key, level, (given or {}).get(level, held))


def _refuse_a_new_top_node(cfg: DictConfig, key: str) -> None:
    """Raise ``ValueError`` for a ``+key`` that adds a node at the top of the config: nothing reads
    it (the model, loaders, optimizer and run read their own nodes), so the run would go on as if
    it were not given (``+MODEL.WEIGHTS=...`` trained from scratch)."""
    top = key.lstrip("+").split(".")[0]
    if top in cfg:
        return
    raise GwdetValueError(
        f"LazyConfig override {key!r} adds {top!r} at the top of the config, which nothing reads: the run would go "
        f"on as without it.{_yacs_key_advice(key) or ' Add the key under the node that reads it (train, model, dataloader, optimizer, lr_multiplier).'}")


def _value_above_error(key: str, level: str, held: Any) -> GwdetValueError:
    """The refusal of an override ``key`` below ``level``, which holds the value ``held``."""
    below = key.lstrip("+")[len(level) + 1:].split(".")[0]
    fix = (f"give {level} a node of its own that holds the value, e.g. {level}={{_target_: gwdet.norm, name: "
           f"{held}, {below}: ...}}, or set {level} itself" if isinstance(held, str) else f"set {level} itself")
    return GwdetValueError(
        f"LazyConfig override {key!r}: {level!r} holds the value {held!r}, not a node of keys, so nothing can be set "
        f"under it: {fix}.")


def _check_key_parts(override: str, key: str, value: str) -> None:
    """Raise ``ValueError`` when the dotted ``key`` of ``override`` has an empty part (two dots in a
    row, or a dot at an end), naming the override as it was probably meant."""
    plus, parts = key[:len(key) - len(key.lstrip("+"))], key.lstrip("+").split(".")
    if all(parts):
        return
    meant = ".".join(part for part in parts if part) or "train.max_iter"
    raise GwdetValueError(
        f"LazyConfig override {override!r}: the key {key!r} has an empty part (two dots in a row, or a dot at "
        f"an end): write one dot between the names of a dotted key, e.g. {plus}{meant}={value}")


def _is_own_node(cfg: DictConfig, key: str) -> bool:
    """Whether ``key`` holds a node of its own (not a reference to another, not a value)."""
    parent_key, _, name = key.rpartition(".")
    parent = select(cfg, parent_key) if parent_key else cfg
    if not isinstance(parent, DictConfig) or name not in parent or OmegaConf.is_interpolation(parent, name):
        return False
    return isinstance(parent[name], DictConfig)


def _mapping_keys(value: Any, prefix: str) -> list[str]:
    """The dotted keys below ``prefix`` that a mapping ``value`` sets (``{a: 1, b: {c: 2}}``: ``a``,
    ``b.c``)."""
    if not isinstance(value, dict):
        return []
    keys = []
    for name, inner in value.items():
        keys += _mapping_keys(inner, f"{prefix}.{name}") if isinstance(inner, dict) and inner else [f"{prefix}.{name}"]
    return keys


def _override_values(overrides: Sequence[str]) -> dict[str, Any]:
    """Every value the ``overrides`` set, by dotted key (the last override of a key counts; a
    mapping's keys too, ``a={b: 1}`` as ``a.b``); those hydra's grammar cannot read are left out,
    for :func:`apply_overrides` to refuse in their turn."""
    values: dict[str, Any] = {}
    for override in overrides:
        key, equals, value = override.partition("=")
        key = key.strip().lstrip("+")
        if not equals or not key or key.startswith("~"):
            continue
        try:
            parsed = _parsed_value(override, key, value)
        except GwdetValueError:
            continue
        values[key] = parsed
        if isinstance(parsed, dict):
            values.update(_mapping_values(parsed, key))
    return values


def _mapping_values(value: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """``{dotted key: value}`` of every key below ``prefix`` that the mapping ``value`` sets."""
    found: dict[str, Any] = {}
    for name, inner in value.items():
        found[f"{prefix}.{name}"] = inner
        if isinstance(inner, dict):
            found.update(_mapping_values(inner, f"{prefix}.{name}"))
    return found


def _check_new_node(override: str, key: str, node: Mapping[str, Any]) -> None:
    """Refuse a key of the mapping ``node`` that an override gives ``key`` as a node of its own (it
    has a ``_target_``) when the node's callable does not take it: a ``gwdet.norm`` node's keys are
    ``name``, ``strict`` and the settings of its norm name (``TypeError``, as :func:`gwdet.norm`
    refuses them); another callable's, its arguments. A ``_target_`` that names no callable is
    refused when the config is read (:func:`check_targets`)."""
    from gwdet.norms import norm, unknown_params_message

    target = callable_of(OmegaConf.create({"_target_": node["_target_"]}, flags={"allow_objects": True}))
    given = [str(name) for name, value in node.items() if name != "_target_" and value is not None]
    if target is norm:
        settings = _norm_settings(node.get("name"))
        unknown = sorted(name for name in given if name not in ("name", "strict") and name not in (settings or ()))
        if settings is not None and unknown:
            raise GwdetTypeError(f"LazyConfig override {override!r}: "
                                 f"{unknown_params_message(node['name'], settings, unknown, key, added=True)}")
        return
    arguments, any_keyword = argument_names(target) if target is not None else (set(), True)
    unknown = [name for name in given if name not in arguments]
    if unknown and not any_keyword:
        what = getattr(target, "__qualname__", repr(target))
        close = {name: difflib.get_close_matches(name, sorted(arguments), n=1, cutoff=0.6) for name in unknown}
        hint = "".join(f" Did you mean {match[0]} (not {name})?" for name, match in close.items() if match)
        raise GwdetValueError(
            f"LazyConfig override {override!r}: {what} takes no argument {', '.join(map(repr, unknown))}; it takes "
            f"{', '.join(sorted(arguments)) or 'none'}.{hint} Give the node the arguments of its callable.")


def _parsed_value(override: str, key: str, value: str) -> Any:
    """The value of ``override`` as hydra's override grammar reads it, which detectron2's
    ``LazyConfig.apply_overrides`` reads the overrides with; ``ValueError`` naming ``override``
    when the grammar cannot read it (``train.max_iter==3``, an unclosed bracket or quote). None
    where hydra is not installed (detectron2 then splits at the '=')."""
    try:
        from hydra.core.override_parser.overrides_parser import OverridesParser
        from hydra.errors import OverrideParseException
    except ImportError:
        return None
    try:
        return OverridesParser.create().parse_overrides([override])[0].value()
    except OverrideParseException as error:
        details = [line for line in str(error).splitlines()
                   if line.strip() and not line.startswith(("Error parsing override", "See https://"))]
        reason = details[0].split(" expecting ")[0].strip() if details else "not in hydra's override grammar"
        meant = f" Did you mean {key}={value.lstrip('=')}?" if value.startswith("=") else ""
        if value.strip().startswith("(") and value.strip().endswith(")"):
            meant = (f" Lists and tuples are written in brackets on the command line: {key}=[{value.strip()[1:-1]}] "
                     "(quoted, the value would be the text itself).")
        raise GwdetValueError(
            f"LazyConfig override {override!r} cannot be read ({reason}).{meant} Write key=value with one '=', "
            "e.g. train.max_iter=100, and quote a value holding special characters, e.g. "
            "train.output_dir='output/a=b' (hydra's override grammar: "
            "https://hydra.cc/docs/advanced/override_grammar/basic/).") from None


# The nodes a run builds its parts from: set to null, the run could not be built
RUN_NODES = {"model": "the model", "optimizer": "the optimizer", "lr_multiplier": "the learning-rate schedule",
             "dataloader": "the data loaders", "dataloader.train": "the training loader",
             "dataloader.test": "the test loader", "dataloader.evaluator": "the evaluator of the test set",
             "train": "the run's settings", "train.checkpointer": "the checkpoint settings"}


def _current_value(cfg: DictConfig, key: str) -> Any:
    """What ``key`` holds before an override: its value in ``cfg``, else the default of the argument
    of that name of its node's callable (an argument the config leaves out; on a ``gwdet.norm`` node,
    the default of that setting of the norm the node names), else :data:`ABSENT`."""
    value = select(cfg, key)
    if value is not ABSENT:
        return value
    parent_key, _, name = key.rpartition(".")
    node = select(cfg, parent_key) if parent_key else cfg
    target = callable_of(node)
    if target is not None and _is_norm(target):
        return _norm_setting_default(node, name)
    try:
        parameter = inspect.signature(target).parameters.get(name) if target is not None else None
    except (TypeError, ValueError):
        return ABSENT
    return ABSENT if parameter is None or parameter.default is inspect.Parameter.empty else parameter.default


def _check_value_kind(cfg: DictConfig, override: str, key: str, value: str, parsed: Any) -> None:
    """Raise ``ValueError`` for an override whose value hydra's grammar reads otherwise than it was
    most likely meant: an unquoted comma (a sweep of values, which no tool runs), ``no`` / ``off`` for
    a boolean (a text, true to detectron2), ``None`` (the text 'None'; null is ``null``), or null for a
    node the run builds from (:data:`RUN_NODES`)."""
    if type(parsed).__name__.endswith("Sweep"):  # hydra's ChoiceSweep, RangeSweep, IntervalSweep
        raise GwdetValueError(
            f"LazyConfig override {override!r}: an unquoted ',' makes hydra read {value!r} as a sweep over several "
            f"values, which gwdet's tools do not run. Quote a text that holds a comma ({key}=\"{value}\"), or write a "
            f"list in brackets ({key}=[{value}]); GW positions join with '-' (S1-B2).")
    current = _current_value(cfg, key)
    if isinstance(current, bool) and isinstance(parsed, str):
        raise GwdetValueError(
            f"LazyConfig override {override!r}: {key} is a boolean ({current}), and hydra reads {value!r} as the text "
            f"{parsed!r}, which Python takes as true whatever it says: write {key}=true or {key}=false.")
    if parsed == "None" and value.strip() == "None" and not isinstance(current, str):
        raise GwdetValueError(
            f"LazyConfig override {override!r}: hydra reads None as the text 'None'; null is written null: "
            f"{key}=null.")
    if parsed is None and value.strip() == "null" and key in RUN_NODES and isinstance(current, DictConfig):
        raise GwdetValueError(
            f"LazyConfig override {override!r}: {key} is {RUN_NODES[key]}, which the run builds and cannot go without; "
            f"nothing was run. Set its keys ({key}.KEY=VALUE), or give it a node of its own ({key}={{_target_: ..., "
            "...}).")


def _target_problem(name: str) -> str:
    """Why the ``_target_`` ``name`` is not a callable that detectron2's ``locate`` finds ("" when it
    is), with the close names of the module it reaches."""
    try:
        found = locate(name)
    except Exception:  # detectron2's ImportError, or what importing the module raised
        found = None
    if callable(found):
        return ""
    if found is not None:
        return f"{name!r} is a {type(found).__name__}, not a callable (a class or function) that builds the node."
    module_name, _, attribute = name.rpartition(".")
    module = None
    while module_name and module is None:
        try:
            module = locate(module_name)
        except Exception:
            module_name, _, attribute = module_name.rpartition(".")
    if module is None:
        return f"{name!r} cannot be imported."
    close = difflib.get_close_matches(attribute, [n for n in dir(module) if not n.startswith("_")], n=3, cutoff=0.6)
    hint = did_you_mean([f"{module_name}.{c}" for c in close], quote=False)
    return f"{module_name} has no {attribute!r}, so {name!r} cannot be imported.{hint}"


def check_targets(node: Any, path: str = "") -> None:
    """Raise ``ValueError`` naming the first ``_target_`` below ``node`` (at ``path``) that names no
    callable (:func:`_target_problem`): found as the config is read, not when the run builds it."""
    if isinstance(node, DictConfig):
        target = node.get("_target_") if "_target_" in node and not OmegaConf.is_interpolation(node, "_target_") else None
        problem = _target_problem(target) if isinstance(target, str) else ""
        if problem:
            where = f"{path}._target_" if path else "_target_"
            raise GwdetValueError(f"LazyConfig {where}: {problem} Nothing was built.")
        for name in map(str, node.keys()):
            if not (OmegaConf.is_interpolation(node, name) or OmegaConf.is_missing(node, name)):
                check_targets(node[name], f"{path}.{name}" if path else name)
    elif isinstance(node, ListConfig):
        for index in range(len(node)):
            if not (OmegaConf.is_interpolation(node, index) or OmegaConf.is_missing(node, index)):
                check_targets(node[index], f"{path}.{index}")


def apply_overrides(cfg: DictConfig, overrides: Iterable[str]) -> DictConfig:
    """detectron2's ``LazyConfig.apply_overrides`` after every override is checked: its key has no
    empty part and is in the config (:func:`check_override_key`; ``+key=value`` adds a key without
    that check), and hydra's grammar reads it (:func:`_parsed_value`). A mapping with a ``_target_``
    given for a node (``model.backbone.norm={_target_: gwdet.norm, name: GN, num_groups: 4}``) is a
    node of its own: it replaces the node, so the values it leaves out take their defaults, and its
    keys are checked against its callable (:func:`_check_new_node`). A mapping without one sets its
    keys in the node (OmegaConf's merge), each checked as its dotted override is. After they are
    applied, each key's value resolves."""
    overrides = list(overrides)
    coming = _override_values(overrides)
    keys, values = [], []  # each override's key (without its '+') and value
    replacing: set[int] = set()  # the overrides that give a node a new node of its own
    given: dict[str, Any] = {}  # the values the overrides before the current one set, by key
    for index, override in enumerate(overrides):
        key, equals, value = override.partition("=")
        if not equals or not key.strip():
            raise GwdetValueError(
                f"LazyConfig override {override!r} is not key=value. A LazyConfig takes dotted keys with '=', "
                "e.g. train.max_iter=100 train.output_dir=output/run (KEY VALUE pairs are for yacs configs).")
        if key.startswith("~"):
            raise GwdetValueError(f"LazyConfig override {override!r}: deleting a key is not supported.")
        _check_key_parts(override, key.strip(), value)
        if not key.startswith("+"):
            check_override_key(cfg, key.strip(), given, coming)
        else:
            _refuse_a_value_above(cfg, key.strip(), given)
            _refuse_a_new_top_node(cfg, key.strip())
        parsed = _parsed_value(override, key.strip(), value)
        _check_value_kind(cfg, override, key.strip().lstrip("+"), value, parsed)
        if not key.startswith("+") and isinstance(parsed, dict) and "_target_" in parsed \
                and isinstance(select(cfg, key.strip()), DictConfig):
            _check_new_node(override, key.strip(), parsed)
            replacing.add(index)
        elif not key.startswith("+") and _is_own_node(cfg, key.strip()):  # a mapping merges into such a node
            for nested in _mapping_keys(parsed, key.strip()):
                check_override_key(cfg, nested, given, coming)
        keys.append(key.strip().lstrip("+"))
        values.append(parsed)
        given[keys[-1]] = parsed
    try:
        applied, merged = cfg, []  # merged: the overrides detectron2 applies next, in their order
        for index in range(len(overrides) + 1):
            if index < len(overrides) and index not in replacing:
                merged.append(overrides[index][1:] if overrides[index].startswith("+") else overrides[index])
                continue
            applied = LazyConfig.apply_overrides(applied, merged) if merged else applied
            merged = []
            if index < len(overrides):  # a node of its own: assigned, not merged into the node it replaces
                OmegaConf.update(applied, keys[index], values[index], merge=False)
    except KeyError as error:  # detectron2's safe_update: a key below a value an earlier override set
        below = re.match(r"Trying to update key (\S+), but (\S+) is not a config", str(error.args[0]) if error.args else "")
        if below is None:
            raise
        key, level = below.group(1), below.group(2)
        raise _value_above_error(key, level, given.get(level, select(cfg, level))) from None
    except OmegaConfBaseException as error:  # e.g. a list given for a node
        key = getattr(error, "full_key", None) or "a key"
        advice = (f" {key} holds a node (an L(...) call or a mapping), which a list cannot replace: set its keys "
                  f"({key}.KEY=VALUE), give it a node of its own ({key}={{_target_: ..., ...}}), or a single value "
                  f"({key}=VALUE; a dataset's names take one name so).") if isinstance(select(cfg, key), DictConfig) else ""
        raise GwdetValueError(
            f"The LazyConfig overrides cannot set {key}: {str(error).splitlines()[0]}.{advice}") from None
    for override, key in zip(overrides, keys, strict=True):
        try:
            OmegaConf.select(applied, key, throw_on_resolution_failure=True)
        except OmegaConfBaseException as error:  # an interpolation that names no key
            raise GwdetValueError(f"LazyConfig override {override!r} cannot be resolved: {str(error).splitlines()[0]}. "
                                  "An interpolation ${...} must name a key of the config.") from None
    return applied


def _load_python_config(config_file: str) -> DictConfig:
    """detectron2's ``LazyConfig.load`` of a ``.py`` config, its syntax errors, missing relative
    imports and imports of modules that cannot be found named with the line or file and the fix."""
    try:
        loaded = LazyConfig.load(config_file)
    except SyntaxError as error:
        cause = error.__cause__ if isinstance(error.__cause__, SyntaxError) else error
        raise GwdetValueError(f"Config file {config_file!r} is not valid Python: {cause.msg} (line {cause.lineno}). "
                              "Correct that line.") from None
    except KeyError as error:
        if error.args != ("*",):  # detectron2's import hook looks the names up one by one
            raise
        raise GwdetValueError(
            f"Config file {config_file!r} imports with '*', which detectron2's LazyConfig loader cannot: import the "
            "names it uses (from .x import model, dataloader, optimizer, lr_multiplier, train).") from None
    except ModuleNotFoundError as error:
        raise _missing_module_error(config_file, error) from None
    except ImportError as error:
        if "does not exist" not in str(error):  # detectron2's message for a relative import not beside the file
            raise
        raise GwdetValueError(
            f"Config file {config_file!r}: {error} A LazyConfig's relative imports (from .common... import ...) read "
            "files beside it: copy the folders it imports along with it (for gwdet's: cp -r configs/LazyConfig/common "
            f"{os.path.dirname(config_file) or '.'}/).") from None
    _check_nothing_left_out(config_file, loaded)
    return loaded


def _missing_module_error(config_file: str, error: ModuleNotFoundError) -> GwdetValueError:
    """The refusal of a config whose import names a module that cannot be found: the config file
    (or the one it imports) and line of the import, the module, and the fix."""
    where = f"Config file {config_file!r}"
    frame = None
    trace = error.__traceback__
    while trace is not None:  # the innermost frame of a file detectron2's loader runs as a config
        if str(trace.tb_frame.f_globals.get("__package__") or "").startswith(_CFG_PACKAGE):
            frame = trace
        trace = trace.tb_next
    if frame is not None:
        source = frame.tb_frame.f_code.co_filename
        line = frame.tb_lineno
        try:  # read now: linecache may hold an earlier version of the file
            with open(source, encoding="utf-8") as file:
                text = file.read().splitlines()[line - 1].strip()
        except (OSError, UnicodeDecodeError, IndexError):
            text = ""
        if os.path.abspath(source) != os.path.abspath(config_file):
            where += f" imports {source!r}, which"
        where += f" (line {line}: {text})" if text else f" (line {line})"
    missing = error.name or str(error)
    if not str(error).startswith("No module named"):  # a message of its own, which names its fix
        return GwdetValueError(f"{where} cannot import {missing!r}: {error}")
    top = missing.split(".")[0]
    try:
        top_found = top != missing and importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        top_found = False
    what = (f"{top!r} is installed but has no module {missing!r}" if top_found
            else f"no module {missing!r} is installed in this environment ({sys.executable})")
    fix = "Correct the import." if top_found else "Install it, or correct the import."
    return GwdetValueError(f"{where} cannot import {missing!r}: {what}. {fix}")


# the top-level values gwdet's tools and detectron2's lazyconfig_train_net.py read
RUN_VALUES = ("model", "dataloader", "optimizer", "lr_multiplier", "train")


def _check_nothing_left_out(config_file: str, loaded: DictConfig) -> None:
    """Refuse a run value (:data:`RUN_VALUES`) that the file assigns at its top level but that
    ``LazyConfig.load`` left out: it keeps dicts, lists and ``L(...)(...)`` nodes only, so an object
    built in the file (``lr_multiplier = CosineParamScheduler(1, 0)``) is dropped without a word."""
    with open(config_file, encoding="utf-8") as file:
        tree = ast.parse(file.read(), config_file)
    for statement in tree.body:
        if isinstance(statement, ast.Assign):
            targets, value = statement.targets, statement.value
        elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
            targets, value = [statement.target], statement.value
        else:
            continue
        for target in targets:
            if isinstance(target, ast.Name) and target.id in RUN_VALUES and target.id not in loaded:
                example = f"{target.id} = L(...)(...)"
                if isinstance(value, ast.Call) and not value.args:
                    example = f"{target.id} = L({ast.unparse(value.func)})({', '.join(map(ast.unparse, value.keywords))})"
                elif isinstance(value, ast.Call):  # LazyCall takes its arguments by name only
                    example = f"{target.id} = L({ast.unparse(value.func)})(...), each argument given by name"
                raise GwdetValueError(
                    f"Config file {config_file!r} (line {statement.lineno}) sets {target.id} = {ast.unparse(value)}, an "
                    "object that "
                    "detectron2's LazyConfig.load leaves out (it keeps dicts, lists and L(...)(...) nodes only), so the "
                    f"config would have no {target.id}. Write it as a node to be built: {example} (from "
                    "detectron2.config import LazyCall as L).")


def check_override_list(who: str, opts: Any) -> None:
    """Refuse overrides that are not a list of strings (``TypeError`` naming ``who``): one string
    would be read letter by letter."""
    if opts is not None and (isinstance(opts, (str, bytes)) or not isinstance(opts, Sequence)
                             or not all(isinstance(item, str) for item in opts)):
        raise GwdetTypeError(f"{who}: opts must be a list of strings, KEY VALUE pairs for a yacs config "
                             f"(['MODEL.GW.NUM_GROUPS', '4']) or key=value for a LazyConfig, got {opts!r}")


def _looks_like_yacs(config_file: str) -> bool:
    """Whether the YAML file ``config_file`` is a yacs config: a mapping with an upper-case key
    (``MODEL``, ``_BASE_``) that is not a saved LazyConfig (whose ``.py`` may have had a module-level
    node of such a name, as configs/LazyConfig/mask_rcnn_R_50_FPN_gw.py has ``GW``)."""
    try:
        tree = _yaml_as_data(config_file)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):  # the loader names what is wrong
        return False
    return isinstance(tree, dict) and not _is_saved_lazy_config(tree) and any(str(key).isupper() for key in tree)


def check_config_file_exists(config_file: str) -> None:
    """Refuse a ``config_file`` that is not a regular file: missing, or a named pipe, a device or a
    link that leads nowhere or in a loop (``FileNotFoundError`` / ``ValueError``, both gwdet's)."""
    suffix = os.path.splitext(config_file)[1]
    if suffix.lower() == LAZY_SUFFIX and suffix != LAZY_SUFFIX:
        raise GwdetValueError(f"Config file {config_file!r} ends in {suffix!r}: a LazyConfig is told by its suffix "
                              f"{LAZY_SUFFIX!r}, in lower case (this one would be read as YAML); rename it.")
    if os.path.isfile(config_file):
        return
    if os.path.lexists(config_file):
        raise GwdetValueError(f"Config file {config_file!r} is not a regular file (a named pipe, a device, or a link "
                              "that leads nowhere or in a loop): give the config file itself.")
    raise GwdetFileNotFoundError(f"Config file {config_file!r} does not exist{_packaged_config_hint(config_file)}")


def _packaged_config_hint(config_file: str) -> str:
    """Where a config file that does not exist was looked for, and how to load a packaged config of
    its name (or where their names are listed), for the refusal's end."""
    name = PurePath(config_file)
    name = PurePath(*name.parts[1:]) if name.parts[:1] == ("configs",) else name
    where = "" if name.is_absolute() else f" in {os.getcwd()}"
    try:
        packaged = None if name.is_absolute() else configs_dir() / name
    except GwdetFileNotFoundError:  # an installation without its configs: that refusal comes with get_config
        packaged = None
    if packaged is not None and packaged.is_file():
        return (f"{where}; {name.as_posix()!r} names a config gwdet packages: load it by name with "
                f"gwdet.model_zoo.get_config({name.as_posix()!r}), or give its path {str(packaged)!r}.")
    return (f"{where} (gwdet.model_zoo.list_configs() names the configs gwdet packages, which "
            "gwdet.model_zoo.get_config loads by name).")


def norms_as_nodes(node: Any) -> None:
    """Replace, in place, every ``gwdet.norm(...)`` object of the config (the README's
    ``conv_norm = gwdet.norm("GW", ...)``) by the node ``L(gwdet.norm)(...)`` of the same name and
    values: it builds the same layers, and a run's saved config.yaml then holds plain values that
    can be read again (the object would be saved as a Python tag, which no config may hold)."""
    from gwdet.norms import Norm, norm

    items = node.items_ex(resolve=False) if isinstance(node, DictConfig) else enumerate(node) \
        if isinstance(node, ListConfig) else ()
    for key, value in list(items):
        if isinstance(value, Norm):
            node[key] = LazyCall(norm)(name=value.name, **value.params, **({"strict": True} if value.strict else {}))
        elif isinstance(value, (DictConfig, ListConfig)):
            norms_as_nodes(value)


def load_lazy_config(config_file: str, overrides: Sequence[str] = (), *, model: bool = False) -> DictConfig:
    """The LazyConfig ``config_file`` with the ``key=value`` ``overrides`` applied (checked by
    :func:`apply_overrides`; a key they set more than once is warned of, naming the value used, the
    last); a ``~`` in ``train.output_dir`` is expanded. ``model``: the file must
    define a ``model`` (what a run builds; the parts the configs import define none), checked first."""
    if not isinstance(model, (bool, np.bool_)):
        raise GwdetValueError(
            f"load_lazy_config: model must be True or False, got {model!r} ({type(model).__name__}), which would be "
            "read as a truth value whatever it says: give model=True to require the file to define a model, "
            "model=False (the default) otherwise.")
    if not config_file:
        raise GwdetValueError("No config given: pass --config-file configs/<file>.py (see configs/LazyConfig/).")
    config_file = os.fspath(config_file)
    check_override_list("load_lazy_config", overrides)
    check_config_file_exists(config_file)
    warn_of_repeated_overrides(overrides)
    if not config_file.endswith(LAZY_SUFFIX) and _looks_like_yacs(config_file):
        raise GwdetValueError(
            f"Config file {config_file!r} is a yacs config (upper-case sections such as MODEL, or _BASE_), not a "
            f"LazyConfig: read it with gwdet.model_zoo.build_config({config_file!r}), or give a LazyConfig (.py, "
            "or the YAML LazyConfig.save writes).")
    loaded = _load_python_config(config_file) if config_file.endswith(LAZY_SUFFIX) else _load_saved_lazy_config(config_file)
    norms_as_nodes(loaded)
    refuse_numpy_values(loaded, f"Config file {config_file!r}")
    if model and not isinstance(loaded.get("model"), DictConfig):
        raise GwdetValueError(
            f"Config file {config_file!r} defines no model: a LazyConfig names the model to build in "
            "model = L(...)(...), beside train, dataloader, optimizer and lr_multiplier (e.g. "
            "configs/LazyConfig/mask_rcnn_R_50_FPN_gw_shapes.py).")
    cfg = apply_overrides(loaded, overrides or ())
    try:
        OmegaConf.to_container(cfg, resolve=True)  # every ${...} of the file names a key (checked once, here)
    except OmegaConfBaseException as error:
        key = getattr(error, "full_key", None) or "a value"
        raise GwdetValueError(
            f"Config file {config_file!r}: {key} cannot be resolved: {str(error).splitlines()[0]}. An interpolation "
            "${...} must name a key of the config (a node replaced by another callable, e.g. a bottom_up wrapped in "
            "gwdet.modeling.place_norm, may lack the key it named): give the value itself, e.g. "
            f"{key}=[...].") from None
    check_targets(cfg)
    output_dir = select(cfg, OUTPUT_SETTING)
    if isinstance(output_dir, str) and output_dir.startswith("~"):
        cfg.train.output_dir = os.path.expanduser(output_dir)
    return cfg


def check_keys(cfg: DictConfig, keys: Sequence[str], purpose: str) -> None:
    """Raise ``ValueError`` naming every one of ``keys`` the config lacks for ``purpose``."""
    missing = [key for key in keys if select(cfg, key) is ABSENT]
    if missing:
        raise GwdetValueError(
            f"This LazyConfig cannot be used for {purpose}: it has no {', '.join(missing)}. A LazyConfig for "
            "gwdet's tools (and detectron2's tools/lazyconfig_train_net.py) defines model, dataloader.train, "
            "dataloader.test, dataloader.evaluator, optimizer, lr_multiplier and train (detectron2's "
            "common/train.py: train = get_config('common/train.py').train); see configs/LazyConfig/.")
