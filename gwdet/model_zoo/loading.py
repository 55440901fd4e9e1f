"""Reading a yacs config file the way gwdet's tools read it: detectron2's defaults, gwdet's keys,
the file with its ``_BASE_`` chain, then the command line's ``KEY VALUE`` overrides, checked.

What yacs and fvcore report in their own words (a missing ``_BASE_`` file, a key the config does
not have, a value of another type than the key's default, overrides that do not come in pairs) is
refused here before or instead, naming the file, the key and the fix (:func:`check_base_files`,
:func:`merge_problem`). :func:`build_config` is the one loader of yacs configs: the train, export
and analyze tools, :func:`gwdet.model_zoo.get_config` and the study all call it.
"""
from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from detectron2.config import CfgNode, LazyConfig, get_cfg

from gwdet.config import add_gwdet_config
from gwdet.config_checks import check_gwdet_config
from gwdet.errors import GwdetFileNotFoundError, GwdetIsADirectoryError, GwdetValueError
from gwdet.model_zoo.model_zoo import configs_dir, get_config_file


def build_config(config_file: str, opts: list[str] | None = None) -> CfgNode:
    """detectron2's defaults + gwdet's keys + ``config_file`` + ``KEY VALUE`` overrides, checked, frozen."""
    if not config_file:
        raise GwdetValueError("No config given: pass --config configs/<file>.yaml (see configs/).")
    if os.path.isdir(config_file):
        raise GwdetIsADirectoryError(f"Config file {config_file!r} is a folder: give a config file in it "
                                     "(configs/ holds gwdet's).")
    if not os.path.isfile(config_file):
        raise GwdetFileNotFoundError(f"Config file {config_file!r} does not exist (run from the repository root?).")
    if config_file.endswith(".py"):
        raise GwdetValueError(
            f"Config file {config_file!r} is a LazyConfig (.py), not a yacs config, which is what this step "
            "reads. tools/train_net.py (here or through --launcher slurm), tools/analyze_model.py and "
            "tools/deploy/export_model.py take LazyConfigs, with key=value overrides; in Python, load one with "
            "gwdet.engine.lazy.load_lazy_config.")
    with open(config_file, encoding="utf-8") as f:
        text = f.read()
    try:
        content = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError as error:
        raise GwdetValueError(f"Config file {config_file!r} is not valid YAML: {error}") from None
    if not isinstance(content, dict):
        raise GwdetValueError(f"Config file {config_file!r} holds no KEY: VALUE mapping (is it empty?). "
                              "Start from one of the files under configs/.")
    check_base_files(config_file, content)
    cfg = add_gwdet_config(get_cfg())
    try:
        cfg.merge_from_file(config_file)
    except (KeyError, AssertionError, ValueError) as error:  # yacs: unknown key, wrong type
        raise GwdetValueError(
            f"Config file {config_file!r} (or a _BASE_ it names): {merge_problem(cfg, error)}") from None
    try:
        cfg.merge_from_list(opts or [])
    except (KeyError, AssertionError, ValueError) as error:
        raise GwdetValueError(f"The KEY VALUE overrides: {merge_problem(cfg, error)}") from None
    if cfg.OUTPUT_DIR.startswith("~"):  # a quoted ~ reaches the config as it is: a folder named "~"
        cfg.OUTPUT_DIR = os.path.expanduser(cfg.OUTPUT_DIR)
    check_gwdet_config(cfg)
    cfg.freeze()
    return cfg


_UNKNOWN_KEY = re.compile(r"Non-existent (?:config )?key: (\S+)")
_WRONG_TYPE = re.compile(r"Type mismatch \(<class '([\w.]+)'> vs\. <class '([\w.]+)'>\) with values "
                         r"\((.*) vs\. (.*)\) for config key: (\S+)$", re.DOTALL)


def merge_problem(cfg: CfgNode, error: BaseException) -> str:
    """What yacs' error when merging into ``cfg`` means, with the fix: a key the config does not
    have (and the close ones it has), a value of another type than the key's default, a section
    given a value, overrides that do not come in pairs."""
    text = str(error.args[0]) if error.args else str(error)
    unknown = _UNKNOWN_KEY.search(text)
    if unknown:
        key = unknown.group(1)
        close = difflib.get_close_matches(key, list(flatten_config(cfg)), n=3, cutoff=0.8)
        hint = f" Did you mean {' or '.join(close)}?" if close else ""
        return (f"{key} is not a key of detectron2's or gwdet's config.{hint} (A project's own keys are added "
                "by its add_*_config function before the config is read.)")
    wrong = _WRONG_TYPE.search(text)
    if wrong:
        expected, given, default, value, key = wrong.groups()
        if expected.endswith("CfgNode"):
            return f"{key} is a section of keys, not a value: set one of its keys (e.g. {key}.<KEY> VALUE)."
        return (f"{key} takes a value of type {expected.rsplit('.', 1)[-1]} (it is {default} before this "
                f"value); got {value} (a {given.rsplit('.', 1)[-1]}).")
    if "odd length" in text:
        return f"overrides come in KEY VALUE pairs; {text.split(': ', 1)[-1].split(';')[0]} has a key without its value."
    return text


BASE_KEY = "_BASE_"


def _base_paths(config_file: str, content: Mapping) -> list[tuple[str, str]]:
    """``(as written, as fvcore resolves it)`` for each ``_BASE_`` of a config (one or a list):
    ``~`` expanded, a relative path taken from the folder of ``config_file``; URLs are left out."""
    bases = content.get(BASE_KEY)
    written = [bases] if isinstance(bases, str) else [b for b in bases if isinstance(b, str)] if isinstance(bases, list) else []
    resolved = []
    for base in written:
        path = os.path.expanduser(base) if base.startswith("~") else base
        if path.startswith(("http://", "https://")):
            continue
        if not path.startswith("/"):
            path = os.path.join(os.path.dirname(config_file), path)
        resolved.append((base, path))
    return resolved


def _shipped_config_named(name: str) -> str | None:
    """The path of a config gwdet ships whose file name is ``name`` (the first, by path), if any."""
    try:
        matches = sorted(configs_dir().rglob(os.path.basename(name)))
    except (FileNotFoundError, ValueError):
        return None
    return str(matches[0]) if matches else None


def check_base_files(config_file: str, content: Mapping, named_from: Sequence[str] = ()) -> None:
    """Every ``_BASE_`` file that ``config_file`` (whose YAML is ``content``) names, directly or
    through its own bases, exists, and no config is its own base: a ``FileNotFoundError`` naming the
    missing base, the config that names it (and the chain from the config given) and the fix, or a
    ``ValueError`` for a cycle (both :class:`gwdet.errors.GwdetError`). A base that is not plain YAML is left to detectron2 to read."""
    chain = [*named_from, config_file]
    for written, path in _base_paths(config_file, content):
        path = os.path.normpath(path)
        if os.path.abspath(path) in {os.path.abspath(named) for named in chain}:
            raise GwdetValueError(
                f"Config file {config_file!r} names {BASE_KEY}: {written!r}, so a config is its own base "
                f"({' -> '.join([*chain, path])}). Remove that {BASE_KEY} line or point it at another config.")
        if not os.path.isfile(path):
            via = f" (a base of {' -> '.join(repr(named) for named in chain[:-1])})" if named_from else ""
            shipped = _shipped_config_named(written)
            hint = f" gwdet ships a config of that name: {shipped}." if shipped else ""
            raise GwdetFileNotFoundError(
                f"Config file {config_file!r}{via} names {BASE_KEY}: {written!r}, but there is no file {path} "
                f"(a relative {BASE_KEY} is read from the folder of the config that names it). Correct the "
                f"{BASE_KEY} line of {config_file} to the base config's path, or put the base config at {path}.{hint}")
        try:
            with open(path, encoding="utf-8") as f:
                base_content = yaml.safe_load(f)
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue
        if isinstance(base_content, dict):
            check_base_files(path, base_content, chain)


def flatten_config(tree: Mapping, prefix: str = "") -> dict[str, Any]:
    """``{"A": {"B": 1}}`` -> ``{"A.B": 1}`` for a CfgNode or the dict a config's YAML dump loads
    to; sequences become lists, as a YAML round trip gives them back."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            flat.update(flatten_config(value, name))
        else:
            flat[name] = _as_saved(value)
    return flat


def _as_saved(value: Any) -> Any:
    return [_as_saved(item) for item in value] if isinstance(value, (list, tuple)) else value


def get_config(config_path: str, *, opts: Sequence[str] | None = None):
    """Config ``config_path`` loaded the way gwdet's tools load it.

    ``.yaml``: a yacs ``CfgNode`` with detectron2's defaults, gwdet's keys, the file and its
    ``_BASE_`` chain, and the ``KEY VALUE`` pairs of ``opts`` merged and checked (what
    ``tools/train_net.py`` trains), left unfrozen for the caller. ``.py``: the LazyConfig
    (``detectron2.config.LazyConfig.load``) with ``opts`` as ``key=value`` overrides.
    """
    path = get_config_file(config_path)
    suffix = Path(path).suffix
    if suffix in (".yaml", ".yml"):
        cfg = build_config(path, list(opts or []))
        cfg.defrost()
        return cfg
    if suffix == ".py":
        cfg = LazyConfig.load(path)
        if opts:
            cfg = LazyConfig.apply_overrides(cfg, list(opts))
        return cfg
    raise GwdetValueError(f"{config_path!r} is neither a yacs (.yaml) nor a LazyConfig (.py) config")
