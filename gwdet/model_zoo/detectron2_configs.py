"""detectron2's own packaged LazyConfigs (``common/models/mask_rcnn_fpn.py``, ``common/optim.py``, ...),
which gwdet's LazyConfigs build on, found and loaded without :mod:`detectron2.model_zoo`.

detectron2's ``model_zoo`` needs ``pkg_resources``, which setuptools >= 81 does not ship. A
pip-installed detectron2 carries its configs in ``detectron2/model_zoo/configs``: the folder is
found with :func:`importlib.util.find_spec` (importing neither detectron2 nor its ``model_zoo``) and
a file loaded with ``detectron2.config.LazyConfig.load``, as ``model_zoo.get_config`` does.
"""
from __future__ import annotations

import difflib
import importlib.util
import os
from pathlib import Path

from gwdet.errors import GwdetFileNotFoundError, GwdetValueError, did_you_mean

INSTALL_DOC = "docs/install.md"


def detectron2_configs_dir() -> Path:
    """The ``model_zoo/configs`` folder of the detectron2 that ``import detectron2`` would load.

    Raises ModuleNotFoundError when no detectron2 is importable, and FileNotFoundError (naming the
    folder looked in and the fix) when that detectron2 carries no configs.
    """
    spec = importlib.util.find_spec("detectron2")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"gwdet's LazyConfigs build on detectron2's packaged configs, but no detectron2 is importable. "
            f"Install detectron2 first (make setup does; other ways: {INSTALL_DOC}).", name="detectron2")
    locations = [Path(location) for location in spec.submodule_search_locations]
    for location in locations:
        configs = location / "model_zoo" / "configs"
        if configs.is_dir():
            return configs
    looked = ", ".join(str(location / "model_zoo" / "configs") for location in locations)
    raise GwdetFileNotFoundError(
        f"detectron2's packaged configs are missing: no folder {looked}. gwdet's LazyConfigs build on "
        "detectron2's common/ LazyConfigs, which a detectron2 installed by pip carries there. Fix: reinstall "
        "detectron2 with pip (pip install <detectron2 source or checkout>, or make setup for the registry "
        "wheel), or link its checkout's configs/ folder to that path "
        f"(ln -s <detectron2 checkout>/configs {locations[0] / 'model_zoo' / 'configs'}); see {INSTALL_DOC}.")


def detectron2_config_file(config_path: str) -> Path:
    """The file of detectron2's packaged config ``config_path`` (relative to detectron2's
    ``configs/``, e.g. ``"common/models/mask_rcnn_fpn.py"``); FileNotFoundError naming the folder
    and the closest names when it is not there."""
    root = detectron2_configs_dir()
    path = Path(os.path.normpath(root / config_path))
    if path.resolve().is_relative_to(root.resolve()) and path.is_file():
        return path
    names = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.py") if "__pycache__" not in p.parts)
    close = difflib.get_close_matches(config_path, names, n=3, cutoff=0.6)
    raise GwdetFileNotFoundError(f"{config_path!r} is not among detectron2's packaged configs ({root})."
                                 f"{did_you_mean(close)}")


def detectron2_lazy_config(config_path: str):
    """detectron2's packaged LazyConfig ``config_path`` (a ``.py`` file under detectron2's
    ``configs/``, e.g. ``"common/train.py"``), loaded with ``detectron2.config.LazyConfig.load``: the
    object detectron2's ``model_zoo.get_config`` returns for it, without ``pkg_resources``."""
    if not config_path.endswith(".py"):
        suffixed = f"{config_path}.py"
        if not config_path.endswith((".yaml", ".yml")) and (detectron2_configs_dir() / suffixed).is_file():
            raise GwdetValueError(f"{config_path!r} is not among detectron2's packaged configs: did you mean "
                                  f"{suffixed!r}? detectron2_lazy_config takes the file's name with its .py.")
        raise GwdetValueError(f"{config_path!r} is not a LazyConfig: detectron2_lazy_config loads detectron2's .py "
                              "configs (for a .yaml one: gwdet.model_zoo.build_config(str(gwdet.model_zoo."
                              f"detectron2_config_file({config_path!r}))), which adds gwdet's keys)")
    from detectron2.config import LazyConfig

    return LazyConfig.load(str(detectron2_config_file(config_path)))
