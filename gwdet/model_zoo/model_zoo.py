"""Where gwdet's configs are, and finding one by name (see :mod:`gwdet.model_zoo`)."""
from __future__ import annotations

import argparse
import difflib
import logging
import os
import re
import sys
from pathlib import Path, PurePath, PurePosixPath
from typing import Callable, Sequence

from gwdet.errors import GwdetFileNotFoundError, GwdetTypeError, GwdetValueError, did_you_mean
from gwdet.model_zoo.detectron2_configs import detectron2_configs_dir

_HERE = Path(__file__).resolve().parent
PACKAGED_CONFIGS = _HERE / "configs"  # a wheel's copy of configs/ (setup.py puts it there)
_CHECKOUT = _HERE.parents[1]  # gwdet/model_zoo -> gwdet -> the repository, in a source checkout
CONFIG_SUFFIXES = (".yaml", ".yml", ".py")

logger = logging.getLogger(__name__)


def _checkout_configs() -> Path | None:
    """The repository's ``configs/`` when this gwdet runs from a source checkout (an editable
    install, or the repository on ``sys.path``); None for an installed wheel."""
    pyproject = _CHECKOUT / "pyproject.toml"
    configs = _CHECKOUT / "configs"
    if not (configs.is_dir() and pyproject.is_file()):
        return None
    try:
        text = pyproject.read_text(encoding="utf-8")
    except OSError:
        return None
    # Another project's files beside an installed gwdet must not be taken for gwdet's checkout.
    return configs if re.search(r'^name\s*=\s*"gwdet"\s*$', text, re.MULTILINE) else None


def configs_dir() -> Path:
    """The folder every config name is relative to: the checkout's ``configs/`` in a source
    checkout, else the wheel's ``gwdet/model_zoo/configs``."""
    checkout = _checkout_configs()
    if checkout is not None:
        return checkout
    if PACKAGED_CONFIGS.is_dir():
        return PACKAGED_CONFIGS
    raise GwdetFileNotFoundError(
        f"gwdet's configs are missing: neither {PACKAGED_CONFIGS} (a wheel's configs) nor {_CHECKOUT / 'configs'} "
        "(a source checkout's) exists. This gwdet was installed from a build that left them out: reinstall it "
        "from a wheel built by its setup.py, or install the checkout with pip install -e .")


def is_lazy_parts(name: str) -> bool:
    """Whether the packaged ``name`` is a file of LazyConfig parts that the configs import (a
    ``common/`` folder's file, a ``*_parts.py``), not a config to train."""
    path = PurePosixPath(name)
    return path.suffix == ".py" and ("common" in path.parts[:-1] or path.name.endswith("_parts.py"))


def list_configs() -> list[str]:
    """Every config :func:`gwdet.model_zoo.get_config` loads (``.yaml`` and LazyConfig ``.py`` files,
    not the LazyConfig parts the configs import: :func:`is_lazy_parts`), sorted."""
    root = configs_dir()
    return sorted(
        name for path in root.rglob("*")
        if path.is_file() and path.suffix in CONFIG_SUFFIXES and "__pycache__" not in path.parts
        and not is_lazy_parts(name := path.relative_to(root).as_posix())
    )


def _available(names: Sequence[str]) -> str:
    return "\n  " + "\n  ".join(names) if names else " none"


def _suggestion(config_path: str, names: Sequence[str]) -> str:
    wanted = PurePosixPath(str(config_path).replace(os.sep, "/"))
    same_name = [name for name in names if PurePosixPath(name).name == wanted.name]
    close = same_name or difflib.get_close_matches(wanted.as_posix(), names, n=3, cutoff=0.6)
    return did_you_mean(close)


def get_config_file(config_path: str) -> str:
    """The absolute path of config ``config_path`` (relative to ``configs/``, e.g.
    ``"mask_rcnn_gw.yaml"``, ``"Demo/mask_rcnn_R_50_FPN_gw_shapes.yaml"``,
    ``"LazyConfig/mask_rcnn_R_50_FPN_gw.py"``). A name that is not there (or that no file could
    have, too long for the file system) raises FileNotFoundError listing the configs that are; a
    name holding a NUL character, ValueError."""
    if not isinstance(config_path, (str, os.PathLike)):
        raise GwdetTypeError(f"gwdet.model_zoo: config_path must be a config's name (a str such as "
                             f"'mask_rcnn_gw.yaml'), got {config_path!r} ({type(config_path).__name__})")
    config_path = os.fspath(config_path)
    if "\0" in config_path:
        raise GwdetValueError(f"gwdet.model_zoo: config_path {config_path!r} holds a NUL character ('\\x00'), which no "
                              "file name can hold: give the config's name, e.g. 'mask_rcnn_gw.yaml' "
                              "(gwdet.model_zoo.list_configs() names them).")
    root = configs_dir()
    path = os.path.normpath(os.path.join(root, config_path))
    try:
        inside = Path(path).resolve().is_relative_to(root.resolve())
    except OSError:  # a name the file system cannot hold (too long, say): no config of gwdet's
        inside = True
    if inside and os.path.isfile(path):
        return path
    names = list_configs()
    where = "is outside gwdet's configs folder" if not inside else "is not among gwdet's configs"
    own = (" For a config file of your own, use gwdet.model_zoo.build_config(path) (a yacs .yaml) or "
           "gwdet.model_zoo.lazy_loading.load_lazy_config(path) (a .py)." if os.path.isfile(config_path) else "")
    if not own and _is_detectron2_config(config_path):
        loaded = (f"gwdet.model_zoo.detectron2_lazy_config({config_path!r})" if config_path.endswith(".py") else
                  f"gwdet.model_zoo.build_config(str(gwdet.model_zoo.detectron2_config_file({config_path!r}))), which "
                  "adds gwdet's keys")
        own = (f" It is one of detectron2's packaged configs: load it with {loaded}, as detectron2's "
               "model_zoo.get_config would.")
    raise GwdetFileNotFoundError(f"{config_path!r} {where} ({root}).{own}{_suggestion(config_path, names)} "
                                 f"Available configs (gwdet.model_zoo.list_configs()):{_available(names)}")


def _is_detectron2_config(config_path: str) -> bool:
    """Whether ``config_path`` names a config of the detectron2 that ``import detectron2`` loads."""
    try:
        root = detectron2_configs_dir()
    except (ModuleNotFoundError, FileNotFoundError):
        return False
    return os.path.isfile(root / config_path)  # False for a name the file system cannot hold (too long, say)


def resolve_config_file(config_file: str, announce: Callable[[str], None] | None = None) -> str:
    """The config file a command line's ``--config-file`` names: ``config_file`` itself when it
    exists (relative to the working directory), else the packaged config of that name (a leading
    ``configs/`` is dropped, so the repository's commands work from any folder), reported through
    ``announce`` (default: this module's logger). Neither: FileNotFoundError naming both places and
    the packaged configs. An empty name is returned as it is (the tools report a missing config)."""
    if not config_file or os.path.lexists(config_file):  # a link that leads nowhere is the loader's to name
        return config_file
    local = os.path.abspath(config_file)
    names: list[str] = []
    if not os.path.isabs(config_file):
        parts = PurePath(config_file).parts
        names.append(PurePosixPath(*parts).as_posix())
        if len(parts) > 1 and parts[0] == "configs":
            names.append(PurePosixPath(*parts[1:]).as_posix())
    root = configs_dir()
    for name in names:
        try:
            packaged = get_config_file(name)
        except FileNotFoundError:
            continue
        (announce or logger.info)(f"{config_file} is not a file here ({local}): using gwdet's packaged config "
                                  f"{name!r} ({packaged})")
        return packaged
    available = list_configs()
    example = "mask_rcnn_gw.yaml" if "mask_rcnn_gw.yaml" in available else (available or ["NAME"])[0]
    raise GwdetFileNotFoundError(
        f"Config file {config_file!r} does not exist: not at {local} (relative to the working directory), and "
        f"not among gwdet's packaged configs in {root} (gwdet.model_zoo).{_suggestion(config_file, available)} "
        f"Packaged configs, usable by name (e.g. --config-file {example}):"
        f"{_available(available)}")


def resolve_config_argument(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Set ``args.config_file`` to the file it names (:func:`resolve_config_file`), saying on stderr
    when that is a packaged config; a config found nowhere is ``parser``'s error (exit status 2)."""
    try:
        args.config_file = resolve_config_file(
            args.config_file, lambda message: print(f"{parser.prog}: {message}", file=sys.stderr, flush=True)
        )
    except FileNotFoundError as error:
        parser.error(str(error))
