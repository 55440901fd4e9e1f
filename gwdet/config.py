"""Every config key gwdet adds to detectron2's config: one table of (key, default, check).

``add_gwdet_config(cfg)`` follows detectron2's project convention (``add_pointrend_config`` and the
like): call it on a fresh ``get_cfg()`` before ``merge_from_file``. Calling it twice is harmless.
:func:`check_config_values` checks every value of the table in a merged config, and
:func:`config_default` is where the Python API (:func:`gwdet.norm`) takes its defaults, so the two
surfaces cannot disagree.
"""
from __future__ import annotations

import difflib
import reprlib
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from detectron2.config import CfgNode as CN

from gwdet.errors import GwdetKeyError, GwdetTypeError, GwdetValueError, did_you_mean, listed
from gwdet.layers.common import check_flag, check_int_at_least, check_iterations, check_positive, check_unit_interval


def _int_at_least(minimum: int) -> Callable[[str, str, Any], None]:
    return lambda owner, key, value: check_int_at_least(owner, key, value, minimum)


def _iterations(owner: str, key: str, value: Any) -> None:
    check_iterations(owner, value, key)


def _string(owner: str, key: str, value: Any) -> None:
    if not isinstance(value, str):
        raise GwdetValueError(f"{owner}: {key} must be a string, got {value!r}")


# The names of the embedded shapes dataset's splits start with it (shapes_train, shapes_val,
# shapes_test): gwdet generates the dataset for any such name, and no other dataset may take one.
SHAPES_PREFIX = "shapes_"


@dataclass(frozen=True)
class ConfigKey:
    """A key gwdet adds: its dotted name, default and the check its value must pass, called with
    the name of what is checked (``config``, ``gwdet.norm``), the name of the value and the value."""

    name: str
    default: Any
    check: Callable[[str, str, Any], None]
    doc: str


CONFIG_KEYS: tuple[ConfigKey, ...] = (
    # Group whitening (group_whitening_huang2021, Eqs. 8-10): "GW" (ItN, Eqs. 6-7), "GW_ZCA" (Eq. 5).
    ConfigKey("MODEL.GW.NUM_GROUPS", 64, _int_at_least(1),
              "groups g; a layer with fewer channels uses one channel per group (Sec. 5.1.1)"),
    ConfigKey("MODEL.GW.T", 5, _iterations, "Newton iterations of ItN (Eq. 7)"),
    ConfigKey("MODEL.GW.EPS", 1e-5, check_positive, "added to the diagonal of each group covariance"),
    # Group normalization behind the name "GN": detectron2 fixes 32 groups; this makes it a knob so
    # GN and GW compare at the same group number (group_whitening_huang2021, Fig. 6).
    ConfigKey("MODEL.GN.NUM_GROUPS", 32, _int_at_least(1), "groups of the name GN (detectron2: 32)"),
    # Batch whitening (decorrelated_batchnorm_huang2018, Algorithm 1): "BW" (ZCA) and "BW_ItN".
    ConfigKey("MODEL.BW.GROUP_SIZE", 16, _int_at_least(1), "channels whitened together (k_G)"),
    ConfigKey("MODEL.BW.T", 5, _iterations, "Newton iterations of BW_ItN"),
    ConfigKey("MODEL.BW.EPS", 1e-5, check_positive, "added to the diagonal of each covariance"),
    ConfigKey("MODEL.BW.MOMENTUM", 0.1, check_unit_interval, "running mean / whitening matrix update"),
    # Batch-group normalization (four_things_batchnorm_summers2020, Sec. 3.4): "BGN"; "GhostBN" is
    # the same layer with one channel per group (Sec. 3.2) and reads the other BGN keys.
    ConfigKey("MODEL.BGN.NUM_GROUPS", 32, _int_at_least(1), "channel groups of BGN"),
    ConfigKey("MODEL.BGN.EXAMPLES_PER_GROUP", 2, _int_at_least(1), "examples normalized together"),
    ConfigKey("MODEL.BGN.EVAL_EXAMPLE_WEIGHT", 0.0, check_unit_interval,
              "inference example weighing alpha (Sec. 3.1, Eq. 3)"),
    ConfigKey("MODEL.BGN.MOMENTUM", 0.1, check_unit_interval, "running statistics update"),
    ConfigKey("MODEL.BGN.EPS", 1e-5, check_positive, "added to the variance"),
    ConfigKey("MODEL.STRICT_NORM_GROUPS", False, check_flag,
              "raise instead of logging when a GW/BW/BGN/GN layer cannot use the requested groups"),
    # Positions of GW in a ResNet/ResNeXt (group_whitening_huang2021, Sec. 5.1.1), read by gwdet's
    # backbones only: see gwdet.positions.
    ConfigKey("MODEL.RESNETS.GW_POSITIONS", "", _string, "e.g. 'S1-B2'; '' means none"),
    ConfigKey("MODEL.RESNETS.GW_NORM", "GW", _string, "the norm name placed at GW_POSITIONS"),
    # The embedded synthetic dataset (gwdet/data/shapes.py), registered as "shapes_train",
    # "shapes_val" and "shapes_test". ROOT "" means the cache folder ($GWDET_CACHE or ~/.cache/gwdet).
    ConfigKey("DATASETS.SHAPES.ROOT", "", _string, "folder of the generated dataset"),
    ConfigKey("DATASETS.SHAPES.NUM_TRAIN", 200, _int_at_least(1), "training images"),
    ConfigKey("DATASETS.SHAPES.NUM_VAL", 50, _int_at_least(1), "validation images"),
    ConfigKey("DATASETS.SHAPES.NUM_TEST", 50, _int_at_least(1), "held-out test images"),
    ConfigKey("DATASETS.SHAPES.IMAGE_SIZE", 128, _int_at_least(1), "image side in pixels"),
    ConfigKey("DATASETS.SHAPES.SEED", 0, _int_at_least(0), "generator seed"),
    # After training/evaluation, draw predictions on this many images of DATASETS.TEST[0] into
    # OUTPUT_DIR/vis (detectron2's Visualizer). 0 turns it off.
    ConfigKey("TEST.VIS_IMAGES", 0, _int_at_least(0), "prediction drawings written after a run"),
)
_BY_NAME = {key.name: key for key in CONFIG_KEYS}


def config_default(name: str) -> Any:
    """The default of gwdet's config key ``name`` (e.g. ``"MODEL.GW.NUM_GROUPS"``)."""
    return _BY_NAME[name].default


def config_value(cfg: CN, name: str) -> Any:
    """``cfg``'s value at the dotted key ``name``; ``TypeError`` when a section on the way was
    replaced by a value (``cfg.MODEL.GW = None``)."""
    node = cfg
    parts = name.split(".")
    for depth, part in enumerate(parts):
        if depth and not isinstance(node, Mapping):
            section = ".".join(parts[:depth])
            raise GwdetTypeError(f"config: {section} is {node!r}, not a section of keys (it holds {name}): set its "
                                 f"keys instead of replacing it, e.g. cfg.{name} = ...")
        node = node[part]
    return node


class _Absent:
    """The value of a key that a config lacks (no config value can equal it)."""

    def __repr__(self) -> str:
        return "<absent>"


ABSENT = _Absent()


def flatten_config(tree: Mapping, prefix: str = "") -> dict[str, Any]:
    """``{"A": {"B": 1}}`` -> ``{"A.B": 1}`` for a CfgNode or the dict a config's YAML dump loads
    to; sequences become lists, as a YAML round trip gives them back."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            flat.update(flatten_config(value, name))
        else:
            flat[name] = as_saved(value)
    return flat


def as_saved(value: Any) -> Any:
    """``value`` as a YAML round trip gives it back: sequences as lists."""
    return [as_saved(item) for item in value] if isinstance(value, (list, tuple)) else value


def add_gwdet_config(cfg: CN) -> CN:
    """Add gwdet's keys (norm hyper-parameters, GW positions, the shapes dataset) to ``cfg``.

    Returns ``cfg`` for chaining. Keys already present keep their values, so the call is idempotent.
    A frozen ``cfg`` (``cfg.freeze()``) takes the keys too, and the sections added to a frozen
    section are frozen with it, so that gwdet's keys of a frozen config are as immutable as
    detectron2's (``cfg.defrost()`` makes them all changeable again).
    """
    if not isinstance(cfg, CN):
        kind = type(cfg)
        shown = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
        other_node = (", a yacs CfgNode but not detectron2's, without detectron2's keys, which gwdet's builders "
                      "read: merge yours into detectron2's (cfg = detectron2.config.get_cfg(); "
                      "cfg.merge_from_other_cfg(yours)) and give that") if any(
            base.__name__ == "CfgNode" and base.__module__.startswith(("yacs.", "fvcore.")) for base in kind.__mro__) \
            else ""
        raise GwdetTypeError(f"add_gwdet_config: give a yacs CfgNode of detectron2's (detectron2.config.CfgNode, "
                             f"from detectron2.config.get_cfg()), got {shown}{other_node}")
    added_to_frozen: list[CN] = []  # sections added to a frozen section, frozen once filled
    for key in CONFIG_KEYS:
        *parents, leaf = key.name.split(".")
        node = cfg
        for depth, part in enumerate(parents):
            if part not in node:
                node[part] = CN()
                if node.is_frozen():
                    added_to_frozen.append(node[part])
            node = node[part]
            if not isinstance(node, CN):
                raise GwdetTypeError(f"add_gwdet_config: {'.'.join(parents[:depth + 1])} is {node!r}, where gwdet's "
                                     f"keys ({key.name}, ...) need a section; remove that value from the config")
        if leaf not in node:
            node[leaf] = key.default
    for section in added_to_frozen:
        section.freeze()
    return cfg


def missing_gwdet_keys(cfg: CN) -> list[str]:
    """The keys of the table that ``cfg`` lacks (none once it went through :func:`add_gwdet_config`)."""
    missing = []
    for key in CONFIG_KEYS:
        try:
            config_value(cfg, key.name)
        except (KeyError, AttributeError):
            missing.append(key.name)
    return missing


def refuse_a_mapping_as_a_config(who: str, cfg: Any) -> None:
    """Refuse a mapping that is no yacs CfgNode (a plain dict) given where a yacs config is read,
    naming its type and how to make a config of it; anything else is left to the checks after."""
    kind = type(cfg)
    if not isinstance(cfg, Mapping) or kind.__name__ == "DictConfig" or any(
            base.__name__ == "CfgNode" for base in kind.__mro__):
        return
    shown = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    raise GwdetTypeError(
        f"{who} needs a detectron2 CfgNode (a yacs config), got a {shown}: {reprlib.repr(cfg)}. A {shown} is no "
        "config gwdet can read: its keys are not checked against detectron2's and gwdet's, and it has no defaults for "
        "the ones it lacks (gwdet.add_gwdet_config takes a CfgNode too). Make a config with "
        "cfg = detectron2.config.get_cfg(); gwdet.add_gwdet_config(cfg); cfg.merge_from_file(path), or load one of "
        "gwdet's with gwdet.model_zoo.get_config(path) or gwdet.model_zoo.build_config(path); to use a dict of "
        "config values, merge it into such a config: cfg.merge_from_other_cfg(detectron2.config.CfgNode(your_dict)).")


def require_gwdet_config(cfg: CN, who: str) -> None:
    """Raise ``KeyError`` naming ``who`` when ``cfg`` lacks gwdet's keys; ``TypeError`` for a
    ``cfg`` that is no yacs CfgNode (a plain dict: :func:`refuse_a_mapping_as_a_config`).

    A config without them cannot say which hyper-parameters its norms should have; building with
    gwdet's defaults instead could silently differ from what the user meant.
    """
    refuse_a_mapping_as_a_config(who, cfg)
    if not isinstance(cfg, Mapping):
        raise GwdetTypeError(f"{who} needs a detectron2 CfgNode (detectron2.config.get_cfg() with "
                             f"gwdet.add_gwdet_config), got {type(cfg).__name__}")
    if type(cfg).__name__ == "DictConfig":  # omegaconf's, without importing it
        raise GwdetTypeError(
            f"{who} needs a yacs CfgNode, but got a LazyConfig (omegaconf DictConfig): build its model with "
            "detectron2.config.instantiate(cfg.model); its norms are the gwdet.norm(...) nodes in it.")
    missing = missing_gwdet_keys(cfg)
    if len(missing) == len(CONFIG_KEYS):
        raise GwdetKeyError(
            f"{who} needs gwdet's config keys (MODEL.GW.*, ...), but the config has none: call "
            "gwdet.add_gwdet_config(cfg) on the config before merge_from_file."
        )
    if missing:
        raise GwdetKeyError(
            f"{who} needs gwdet's config keys, but the config lacks {listed(missing, 5)} (deleted from it?): "
            "gwdet.add_gwdet_config(cfg) adds them back with gwdet's defaults; set them "
            "again where your config gave other values."
        )


# Sections only gwdet's table fills (detectron2 has none of them), and the prefix of gwdet's keys in
# detectron2's MODEL.RESNETS: a key there that the table lacks is read by nothing.
GWDET_SECTIONS = ("MODEL.GW", "MODEL.GN", "MODEL.BW", "MODEL.BGN", "DATASETS.SHAPES")
GWDET_RESNETS_PREFIX = "MODEL.RESNETS.GW"


def check_config_values(cfg: CN) -> None:
    """Raise ``KeyError`` for a key of gwdet's sections that its table lacks (a misspelt key set from
    Python, ``cfg.MODEL.GW.NUM_GROUP = 8``: a config file's or override's is refused when merged),
    naming the close keys; then ``ValueError`` naming the key for any value that fails its check."""
    given = [f"{section}.{key}" for section in GWDET_SECTIONS for key in config_value(cfg, section)]
    given += [f"MODEL.RESNETS.{key}" for key in cfg.MODEL.RESNETS
              if f"MODEL.RESNETS.{key}".upper().startswith(GWDET_RESNETS_PREFIX)]
    for name in given:
        if name not in _BY_NAME:
            close = ([name.upper()] if name.upper() in _BY_NAME
                     else difflib.get_close_matches(name.upper(), list(_BY_NAME), n=2, cutoff=0.8))
            raise GwdetKeyError(f"{name} is not a key of gwdet's config (set in Python after the config was read?), "
                                f"so nothing reads it.{did_you_mean(close, quote=False)} gwdet's keys are listed in docs/usage.md.")
    for key in CONFIG_KEYS:
        key.check("config", key.name, config_value(cfg, key.name))


def check_config_value(name: str, value: Any) -> None:
    """Raise ``ValueError`` naming the key unless ``value`` passes the check of the key ``name`` of
    gwdet's table."""
    _BY_NAME[name].check("config", name, value)


# Keys a project of the user's adds to detectron2's sections under a name close to one of
# detectron2's (declared with allow_config_keys), which the config gate would otherwise take for a misspelling.
_ALLOWED_KEYS: set[str] = set()


def allow_config_keys(*names: str) -> None:
    """Declare the dotted keys ``names`` (``"MODEL.ROI_MASK_HEAD.NUM_CONVS"``) as keys that a project
    of yours adds to the config on purpose, so that the config gate does not refuse them as misspellings
    of detectron2's or gwdet's keys. Call it before the config is used."""
    for name in names:
        if not isinstance(name, str) or not name or name.startswith(".") or name.endswith("."):
            raise GwdetValueError(f"allow_config_keys: give dotted config keys such as 'MODEL.ROI_MASK_HEAD.NUM_CONVS', "
                                  f"got {name!r}")
        if name.upper().startswith(tuple(f"{section}." for section in GWDET_SECTIONS) + (GWDET_RESNETS_PREFIX,)):
            raise GwdetValueError(
                f"allow_config_keys: {name!r} is in one of gwdet's own sections ({', '.join(GWDET_SECTIONS)}, "
                f"{GWDET_RESNETS_PREFIX}*), which hold gwdet's keys only: nothing would read it. Give a project key its "
                "own section (e.g. MODEL.MY_PROJECT.KEY); gwdet's keys are listed in docs/usage.md.")
        _ALLOWED_KEYS.add(name)


def allowed_config_keys() -> frozenset[str]:
    """The keys declared with :func:`allow_config_keys`."""
    return frozenset(_ALLOWED_KEYS)


def _markdown_default(value: Any) -> str:
    """A default as it reads in a config file: strings in double quotes, ``1e-5`` for 1e-05."""
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, float):
        mantissa, exponent_mark, exponent = repr(value).partition("e")
        if exponent_mark:
            sign = "-" if exponent.startswith("-") else ""
            return f"{mantissa}e{sign}{exponent.lstrip('+-').lstrip('0') or '0'}"
    return repr(value)


def config_keys_markdown() -> str:
    """The table of every key in :data:`CONFIG_KEYS` as markdown: key, default and meaning.

    ``docs/usage.md`` holds this text between its ``config-keys`` markers, and
    ``tests/test_docs.py`` checks that the two are equal.
    """
    lines = ["| key | default | meaning |", "| --- | --- | --- |"]
    for key in CONFIG_KEYS:
        doc = key.doc.replace("|", "\\|")
        lines.append(f"| `{key.name}` | `{_markdown_default(key.default)}` | {doc} |")
    return "\n".join(lines) + "\n"
