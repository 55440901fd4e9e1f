"""A failure inside detectron2's code while it builds or first runs a model from a config, named
with the config values that are likely its cause.

gwdet checks the values it knows (:mod:`gwdet.config_checks`); detectron2 has many more, and a
value it cannot use stops it with a bare ``AssertionError``, ``KeyError`` or ``IndexError`` from
deep inside a component. :func:`detectron2_config_failure` turns such an error into one message:
what failed, where in detectron2, the values given on the command line, and the values of the
config sections the failing detectron2 module reads that differ from detectron2's defaults.
Errors raised in gwdet's own code or outside detectron2 are left as they are (they are bugs or
faults, not config values).
"""
from __future__ import annotations

import contextlib
import os
import re
import traceback
from typing import Any, Callable, Iterator, Sequence

import detectron2
from detectron2.config import CfgNode, get_cfg

from gwdet.config import add_gwdet_config, flatten_config
from gwdet.errors import GwdetError, GwdetImportError, GwdetValueError, listed
from gwdet.layers import largest_divisor_at_most
from gwdet.norms import known_norm_names

# detectron2's modules (paths below the detectron2 package; the first match wins) and the config
# sections the components they hold are built from.
MODULE_SECTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("modeling/backbone/fpn.py", ("MODEL.FPN", "MODEL.RESNETS")),
    ("modeling/backbone/", ("MODEL.RESNETS", "MODEL.BACKBONE")),
    ("modeling/anchor_generator.py", ("MODEL.ANCHOR_GENERATOR", "MODEL.RPN")),
    ("modeling/proposal_generator/", ("MODEL.RPN", "MODEL.PROPOSAL_GENERATOR", "MODEL.ANCHOR_GENERATOR")),
    ("modeling/roi_heads/box_head.py", ("MODEL.ROI_BOX_HEAD",)),
    ("modeling/roi_heads/mask_head.py", ("MODEL.ROI_MASK_HEAD",)),
    ("modeling/roi_heads/", ("MODEL.ROI_HEADS", "MODEL.ROI_BOX_HEAD", "MODEL.ROI_MASK_HEAD")),
    ("modeling/poolers.py", ("MODEL.ROI_HEADS", "MODEL.ROI_BOX_HEAD", "MODEL.ROI_MASK_HEAD")),
    ("modeling/box_regression.py", ("MODEL.ROI_BOX_HEAD", "MODEL.RPN")),
    ("modeling/", ("MODEL",)),
    ("layers/", ("MODEL",)),
    ("solver/", ("SOLVER",)),
    ("data/", ("INPUT", "DATALOADER", "DATASETS", "MODEL")),
    ("engine/", ("SOLVER",)),
)  # other modules (checkpoint/, export/, ...): their errors are not a config value's
# The LazyConfig nodes that hold a yacs section's values
LAZY_NODES = {"MODEL": ("model.",), "SOLVER": ("optimizer.", "lr_multiplier.", "train."),
              "INPUT": ("dataloader.",), "DATALOADER": ("dataloader.",), "DATASETS": ("dataloader.",)}
SHOWN = 8  # values listed per kind
GET_NORM_MODULE = "layers/batch_norm.py"  # detectron2's get_norm, which builds norms from its own names
_FRAME = re.compile(r'File "([^"]+)", line (\d+)')  # a frame in a traceback's text (a loader worker's)
# torch's GroupNorm refusing the 32 groups of detectron2's get_norm("GN", channels)
DETECTRON2_GN_GROUPS_ERROR = re.compile(r"num_channels \((\d+)\) must be divisible by num_groups \(32\)")


def failure_site(error: BaseException) -> tuple[str, int] | None:
    """``(path below detectron2/, line)`` of the innermost frame of ``error`` in detectron2's code,
    frames of a loader worker's traceback (in the message) included; ``None`` when the error was
    raised in gwdet's code below that frame, or detectron2 is nowhere in it."""
    frames = [(frame.filename, frame.lineno or 0) for frame in traceback.extract_tb(error.__traceback__)]
    frames += [(path, int(line)) for path, line in _FRAME.findall(str(error))]
    detectron2_root = os.path.dirname(os.path.abspath(detectron2.__file__)) + os.sep
    gwdet_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    for path, line in reversed(frames):
        path = os.path.abspath(path)
        if path.startswith(gwdet_root):
            return None
        if path.startswith(detectron2_root):
            return path[len(detectron2_root):], line
    return None


def detectron2_group_norm_failure(error: BaseException, where: str, layers: str = "",
                                  outcome: str = "") -> GwdetValueError | None:
    """The refusal of detectron2's norm name ``"GN"`` given (by ``where``, e.g. ``"place_norm:
    norm='GN'"`` or a LazyConfig's node) for a layer whose channels 32 does not divide, from torch's
    ``ValueError`` ``error`` raised under detectron2's ``get_norm``, which builds ``GroupNorm(32,
    channels)`` for that name; ``layers`` names the layers (default: the channels of the error's),
    ``outcome`` ends the first sentence (``"; nothing was replaced"``). The fix it names is gwdet's
    ``GN``, which takes the largest divisor of each layer's channels not above the group count
    asked for. ``None`` for any other error."""
    found = (DETECTRON2_GN_GROUPS_ERROR.search(str(error))
             if isinstance(error, ValueError) and not isinstance(error, GwdetError) else None)
    site = failure_site(error) if found is not None else None
    if found is None or site is None or site[0] != GET_NORM_MODULE:
        return None
    channels = int(found.group(1))
    module, line = site
    return GwdetValueError(
        f"{where}: 'GN' given as a name makes detectron2's get_norm build torch's GroupNorm of 32 groups "
        f"(detectron2/{module}:{line}), and 32 does not divide the "
        f"{f'channels of {layers}' if layers else f'{channels} channels of a layer it is given for'}"
        f"{outcome}. Give gwdet.norm('GN', num_groups=N) instead of the name (L(gwdet.norm)(name='GN', "
        "num_groups=N) in a LazyConfig): it builds torch's GroupNorm over the largest divisor of each layer's "
        f"channels not above N (with N=32: 32 groups where the channels allow it, "
        f"{largest_divisor_at_most(channels, 32)} on {channels} channels).")


def detectron2_config_failure(error: BaseException, cfg: Any, doing: str,
                              overrides: Sequence[str] = ()) -> GwdetValueError | None:
    """The refusal for ``error``, raised while detectron2 was ``doing`` (e.g. "build the model")
    with ``cfg`` (``overrides``: the command line's ``KEY VALUE`` pairs of a yacs config, or a
    LazyConfig's ``key=value`` ones); ``None`` for an error that is not detectron2 failing on a
    config value (:func:`failure_site`). A LazyConfig's values are named by its overrides only."""
    site = failure_site(error)
    if isinstance(error, (GwdetError, OSError)) or site is None:
        return None
    module, line = site
    if isinstance(error, KeyError) and module == GET_NORM_MODULE and error.args and error.args[0] in known_norm_names():
        name = error.args[0]
        return GwdetValueError(
            f"detectron2 could not {doing} with this config: a component gave detectron2's get_norm the norm name "
            f"{name!r} (detectron2/{module}:{line}), which only gwdet builds, with the config's values: get_norm knows "
            f"detectron2's own names only. Give that component gwdet.norm_from_config({name!r}, cfg) instead of the "
            "name, e.g. in its from_config (docs/usage.md), or set its NORM to one of detectron2's names (BN, SyncBN, "
            "FrozenBN, GN).")
    groups = select_groups(cfg)
    if (isinstance(error, ValueError) and module == GET_NORM_MODULE and "by num_groups (32)" in str(error)
            and groups not in (None, 32)):
        return GwdetValueError(
            f"detectron2 could not {doing} with this config: a component built GroupNorm with detectron2's "
            f"get_norm('GN', channels) (detectron2/{module}:{line}), which takes 32 groups whatever MODEL.GN.NUM_GROUPS "
            f"({groups}) says, and {str(error).strip()}. Give that component gwdet.norm_from_config('GN', cfg) instead "
            "of the name, e.g. in its from_config (docs/usage.md), so that it builds the config's groups.")
    sections = next((found for prefix, found in MODULE_SECTIONS if module.startswith(prefix)), None)
    if sections is None:
        return None
    if isinstance(cfg, CfgNode):
        prefixes = tuple(f"{section}." for section in sections)
        given = {key: value for key, value in zip(overrides[::2], overrides[1::2], strict=False)}
        given_there = [f"{key}={value}" for key, value in given.items() if key.startswith(prefixes)]
        changed = [change for change in _changed_values(cfg, prefixes) if change.split("=", 1)[0] not in given]
    else:  # a LazyConfig: its overrides of the nodes of those sections, else all of them
        nodes = tuple(node for section in sections for node in LAZY_NODES[section.split(".")[0]])
        lazy_given = [override for override in overrides if "=" in override]
        given_there, changed = [override for override in lazy_given if override.startswith(nodes)] or lazy_given, []
    text = str(error).strip().splitlines()
    problem = f"{type(error).__name__}: {text[0]}" if text else type(error).__name__
    parts = [f"detectron2 could not {doing} with this config: {problem} (detectron2/{module}:{line}); gwdet does "
             "not check that value itself."]
    if given_there:
        parts.append(f"Given on the command line: {listed(given_there, SHOWN)}.")
    if changed:
        others = "Other values" if given_there else "Values"
        parts.append(f"{others} of {', '.join(sections)} that differ from detectron2's defaults: {listed(changed, SHOWN)}.")
    parts.append("Change the value detectron2 cannot use (--verbose shows the traceback).")
    return GwdetValueError(" ".join(parts))


def select_groups(cfg: Any) -> Any:
    """``MODEL.GN.NUM_GROUPS`` of a yacs config, ``None`` for a LazyConfig (its norms carry their own)."""
    return cfg.MODEL.GN.get("NUM_GROUPS") if isinstance(cfg, CfgNode) and "GN" in cfg.get("MODEL", {}) else None


@contextlib.contextmanager
def named_config_failures(cfg: Any, doing: str, overrides: Sequence[str] = (),
                          applies: Callable[[], bool] = lambda: True) -> Iterator[None]:
    """Re-raise a failure of detectron2 inside the block as :func:`detectron2_config_failure`'s
    refusal (the original error chained to it) when ``applies()`` (e.g. training has not finished a
    step yet); any other error as it is."""
    try:
        yield
    except Exception as error:
        refusal = detectron2_config_failure(error, cfg, doing, overrides) if applies() else None
        if refusal is None:
            raise
        raise refusal from error


def _changed_values(cfg: CfgNode, prefixes: tuple[str, ...]) -> list[str]:
    """``KEY=VALUE`` for the values of keys starting with ``prefixes`` that differ from detectron2's
    defaults (with gwdet's keys)."""
    defaults = flatten_config(add_gwdet_config(get_cfg()))
    return [f"{key}={value!r}" for key, value in flatten_config(cfg).items()
            if key.startswith(prefixes) and defaults.get(key) != value]


# What detectron2 raises for a layer of its compiled ops (detectron2._C) where they do not load:
# detectron2.utils.develop.create_dummy_class's ImportError.
_MISSING_COMPILED_LAYER = re.compile(r"Cannot import 'detectron2\._C', therefore '(\w+)' is not available")
DEFORMABLE_LAYERS = ("DeformConv", "ModulatedDeformConv")
_BUILD_D2_FROM_SOURCE = ("build detectron2 from source into the environment (make setup D2_SOURCE=git+https://github.com/"
                         "facebookresearch/detectron2.git; docs/install.md, detectron2 versions)")


def compiled_layer_refusal(error: BaseException, cfg: Any, outcome: str) -> GwdetImportError | None:
    """The refusal of a model whose layer needs detectron2's compiled ops (``detectron2._C``), which
    this detectron2 lacks, from detectron2's ``ImportError`` ``error`` while the model was built with
    ``cfg``: deformable convolutions name ``MODEL.RESNETS.DEFORM_ON_PER_STAGE`` where the config sets
    it; ``outcome`` ends the first sentence (``"; nothing was written"``). ``None`` for another error."""
    found = _MISSING_COMPILED_LAYER.search(str(error)) if isinstance(error, ImportError) else None
    if found is None:
        return None
    layer = found.group(1)
    needs = (f"detectron2's {layer} needs detectron2's compiled ops (detectron2._C), and this detectron2 has none "
             f"(the default registry wheel's never loads){outcome}.")
    resnets = getattr(getattr(cfg, "MODEL", None), "RESNETS", None)
    stages = getattr(resnets, "DEFORM_ON_PER_STAGE", None) if resnets is not None else None
    if layer in DEFORMABLE_LAYERS and stages is not None and any(stages):
        off = "[" + ",".join("False" for _ in stages) + "]"
        return GwdetImportError(
            f"MODEL.RESNETS.DEFORM_ON_PER_STAGE {list(stages)} asks for deformable convolutions: {needs} Set it to "
            f"all False (MODEL.RESNETS.DEFORM_ON_PER_STAGE \"{off}\"), or {_BUILD_D2_FROM_SOURCE}.")
    if layer in DEFORMABLE_LAYERS:
        return GwdetImportError(f"The model has deformable convolutions: {needs} Build the model without them, or "
                                f"{_BUILD_D2_FROM_SOURCE}.")
    return GwdetImportError(f"The model has a layer of detectron2's compiled ops: {needs} Build the model without it, "
                            f"or {_BUILD_D2_FROM_SOURCE}.")


@contextlib.contextmanager
def compiled_layers_named(cfg: Any, outcome: str = "") -> Iterator[None]:
    """Re-raise detectron2's ``ImportError`` of a layer that needs its compiled ops, raised inside the
    block (the model being built from ``cfg``), as :func:`compiled_layer_refusal`'s refusal, the
    original error chained to it; any other error as it is."""
    try:
        yield
    except ImportError as error:
        refusal = compiled_layer_refusal(error, cfg, outcome)
        if refusal is None:
            raise
        raise refusal from error
