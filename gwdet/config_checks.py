"""Checks of a whole merged config, run before anything is built.

* every value of gwdet's config table passes its check (:func:`gwdet.config.check_config_values`),
  ``MODEL.RESNETS.GW_POSITIONS`` parses and has a ``GW_NORM`` to place, BGN example groups fit
  the batch and divide the images each process trains on;
* detectron2's own keys that detectron2 reads only once training (or its data loading, or its first
  checkpoint) has started hold values it can use (:data:`DETECTRON2_VALUE_RULES`, the pixel mean and
  std against ``INPUT.FORMAT``), each refused naming the key, its value and the fix;
* then, in ONE :class:`NormConfigError` listing every key to change at once: every NORM value is a
  known name; a NORM value only gwdet can build with the config's values (gwdet's names, GN with
  ``MODEL.GN.NUM_GROUPS`` other than 32) does not go to a detectron2 component that would build it
  without them (or fail with detectron2's bare ``KeyError``); ``MODEL.RESNETS.GW_POSITIONS`` does
  not go to a component that ignores it. Setting every key the message names builds the model.

:data:`NORM_SITES` is the table of which NORM key detectron2 reads in which component;
:data:`GWDET_COMPONENTS` maps each such component to gwdet's, which is detectron2's own component
with its norms built from the config (:mod:`gwdet.modeling`).
"""
from __future__ import annotations

import difflib
import functools
import json
import logging
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from detectron2.config import CfgNode, get_cfg
from detectron2.utils import comm

from gwdet.errors import GwdetError, GwdetKeyError, GwdetValueError, did_you_mean
from gwdet.layers.common import is_finite_number, is_whole_number
from gwdet.config import (CONFIG_KEYS, add_gwdet_config, allowed_config_keys, check_config_value, check_config_values,
                          config_default, config_value, flatten_config, require_gwdet_config)
from gwdet.norms import (DETECTRON2_GN_GROUPS, OWN_NAMES_NOTE, UnknownNormError, add_registered_config_keys,
                         detectron2_builds_as_configured, known_norm_names, norm_record, norm_records,
                         spawned_process_note)
from gwdet.positions import BLOCK_CONV_OF_POSITION, backbone_reads_gw_positions, parse_gw_positions

# Where a message sends the reader: the section explaining how NORM strings become layers.
DOC_FILE = "docs/usage.md"
DOC_SECTION_TITLE = "How norm hyper-parameters reach the layers"
DOC_SECTION = f'{DOC_FILE}, section "{DOC_SECTION_TITLE}"'

# detectron2's components that read a NORM key -> gwdet's component that builds the same network
# with the config's norms. detectron2's components missing here have no gwdet replacement.
GWDET_COMPONENTS: Mapping[str, str] = {
    "build_resnet_backbone": "build_gw_resnet_backbone",
    "build_resnet_fpn_backbone": "build_gw_resnet_fpn_backbone",
    "build_retinanet_resnet_fpn_backbone": "build_gw_retinanet_resnet_fpn_backbone",
    "Res5ROIHeads": "GWRes5ROIHeads",
    "FastRCNNConvFCHead": "GWFastRCNNConvFCHead",
    "MaskRCNNConvUpsampleHead": "GWMaskRCNNConvUpsampleHead",
    "RetinaNet": "GWRetinaNet",
    "SemSegFPNHead": "GWSemSegFPNHead",
}
GW_BACKBONES = ("build_gw_resnet_backbone", "build_gw_resnet_fpn_backbone", "build_gw_retinanet_resnet_fpn_backbone")
GW_ROI_HEADS = ("GWRes5ROIHeads",)

# The parts detectron2's meta-architectures build from the config besides the backbone (a
# meta-architecture not listed here may build any part, so every part is checked for it).
ROI_HEADS, BOX_HEAD, MASK_HEAD, SEM_SEG_HEAD = "roi_heads", "box_head", "mask_head", "sem_seg_head"
RES5_HEAD = "res5_head"  # the res5 stage of C4 models, built by the ROI heads
META_ARCH_PARTS: Mapping[str, frozenset] = {
    "GeneralizedRCNN": frozenset({ROI_HEADS}),
    "PanopticFPN": frozenset({ROI_HEADS, SEM_SEG_HEAD}),
    "ProposalNetwork": frozenset(),
    "RetinaNet": frozenset(),
    "GWRetinaNet": frozenset(),
    "SemanticSegmentor": frozenset({SEM_SEG_HEAD}),
}
RES5_ROI_HEADS = ("Res5ROIHeads", "GWRes5ROIHeads")  # these build no box head: res5 is their head
# Backbones (detectron2's and gwdet's) that build no FPN, so MODEL.FPN.NORM is read by nothing
BACKBONES_WITHOUT_FPN = ("build_resnet_backbone", "build_gw_resnet_backbone", "build_resnet_deeplab_backbone")


@dataclass(frozen=True)
class NormSite:
    """A NORM key, the key naming the component that reads it, and detectron2's components that
    read it by name (without the config's values; gwdet's replacement: :data:`GWDET_COMPONENTS`).
    ``part`` is the model part the component is (None: always built, like the backbone)."""

    norm_key: str
    component_key: str
    detectron2_readers: tuple[str, ...]
    part: str | None = None


NORM_SITES = (
    NormSite("MODEL.RESNETS.NORM", "MODEL.BACKBONE.NAME",
             ("build_resnet_backbone", "build_resnet_fpn_backbone", "build_retinanet_resnet_fpn_backbone",
              "build_resnet_deeplab_backbone")),
    NormSite("MODEL.FPN.NORM", "MODEL.BACKBONE.NAME",
             ("build_resnet_fpn_backbone", "build_retinanet_resnet_fpn_backbone")),
    # C4 models: Res5ROIHeads builds the res5 stage with MODEL.RESNETS.NORM
    NormSite("MODEL.RESNETS.NORM", "MODEL.ROI_HEADS.NAME", ("Res5ROIHeads",), RES5_HEAD),
    NormSite("MODEL.ROI_BOX_HEAD.NORM", "MODEL.ROI_BOX_HEAD.NAME", ("FastRCNNConvFCHead",), BOX_HEAD),
    NormSite("MODEL.ROI_MASK_HEAD.NORM", "MODEL.ROI_MASK_HEAD.NAME", ("MaskRCNNConvUpsampleHead",), MASK_HEAD),
    NormSite("MODEL.RETINANET.NORM", "MODEL.META_ARCHITECTURE", ("RetinaNet",)),
    NormSite("MODEL.SEM_SEG_HEAD.NORM", "MODEL.SEM_SEG_HEAD.NAME",
             ("SemSegFPNHead", "DeepLabV3Head", "DeepLabV3PlusHead", "PanopticDeepLabSemSegHead"), SEM_SEG_HEAD),
)
NORM_KEYS = tuple(dict.fromkeys(site.norm_key for site in NORM_SITES)) + ("MODEL.RESNETS.GW_NORM",)
# the NORM keys whose layers normalize the images of a batch (the ROI heads' normalize boxes)
IMAGE_BATCH_NORM_KEYS = ("MODEL.RESNETS.NORM", "MODEL.RESNETS.GW_NORM", "MODEL.FPN.NORM", "MODEL.RETINANET.NORM",
                         "MODEL.SEM_SEG_HEAD.NORM")


class NormConfigError(GwdetError, ValueError):
    """The config sends norms where they cannot be built as configured. ``changes`` holds every
    ``key -> value`` that fixes them, all at once (``problems``: one line per finding; findings
    only the user can fix, such as an unknown name, have no change)."""

    def __init__(self, message: str, changes: Mapping[str, str], problems: Sequence[str]) -> None:
        super().__init__(message)
        self.changes = dict(changes)
        self.problems = list(problems)

    def __str__(self) -> str:
        return str(self.args[0])

    def __reduce__(self):  # picklable, e.g. from a worker process
        return type(self), (self.args[0], self.changes, self.problems)


class UnknownNormConfigError(NormConfigError, UnknownNormError):
    """A :class:`NormConfigError` that includes a NORM name nobody registered: also an
    :class:`gwdet.UnknownNormError` (a ``KeyError``). NormConfigError comes first, so that its
    ``__init__`` (``.changes``, ``.problems``) runs, not ``KeyError``'s."""


@dataclass(frozen=True)
class _Problem:
    why: str
    change: tuple[str, str] | None  # (key, value) that fixes it; None: only the user can fix it


def _value(cfg: CfgNode, key: str) -> Any:
    """``cfg``'s value at ``key``; None where the config has no such key (a project's key)."""
    try:
        return config_value(cfg, key)
    except (KeyError, AttributeError):
        return None


def _registry(component_key: str) -> Any:
    """detectron2's registry of the components ``component_key`` names (None: functions, or none)."""
    from detectron2.modeling import META_ARCH_REGISTRY, ROI_HEADS_REGISTRY, SEM_SEG_HEADS_REGISTRY
    from detectron2.modeling.roi_heads import ROI_BOX_HEAD_REGISTRY, ROI_MASK_HEAD_REGISTRY

    return {"MODEL.META_ARCHITECTURE": META_ARCH_REGISTRY, "MODEL.ROI_HEADS.NAME": ROI_HEADS_REGISTRY,
            "MODEL.ROI_BOX_HEAD.NAME": ROI_BOX_HEAD_REGISTRY, "MODEL.ROI_MASK_HEAD.NAME": ROI_MASK_HEAD_REGISTRY,
            "MODEL.SEM_SEG_HEAD.NAME": SEM_SEG_HEADS_REGISTRY}.get(component_key)


def is_one_of(component_key: str, component: str, names: Sequence[str]) -> bool:
    """Whether ``component`` (the value of ``component_key``) is one of the registered classes
    ``names`` or a subclass of one (a project's own head deriving from detectron2's builds as it does)."""
    if component in names:
        return True
    registry = _registry(component_key)
    if registry is None or component not in registry:
        return False
    kind = registry.get(component)
    bases = [registry.get(name) for name in names if name in registry]
    return isinstance(kind, type) and any(isinstance(base, type) and issubclass(kind, base) for base in bases)


def _reads_as_detectron2(site: NormSite, component: str) -> bool:
    """Whether ``component`` builds ``site``'s norm as detectron2's readers do (without the config's
    values): one of them, or a subclass of one that is no subclass of gwdet's replacement and keeps
    the reader's ``from_config`` (a subclass with one of its own builds its arguments itself, as
    docs/usage.md shows with ``gwdet.norm_from_config``)."""
    gwdet_components = [GWDET_COMPONENTS[name] for name in site.detectron2_readers if name in GWDET_COMPONENTS]
    if (not is_one_of(site.component_key, component, site.detectron2_readers)
            or is_one_of(site.component_key, component, gwdet_components)):
        return False
    return component in site.detectron2_readers or not _has_own_from_config(site, component)


def _has_own_from_config(site: NormSite, component: str) -> bool:
    """Whether the registered class ``component`` defines a ``from_config`` other than that of the
    detectron2 reader of ``site`` it derives from."""
    registry = _registry(site.component_key)
    kind = registry.get(component) if registry is not None and component in registry else None
    readers = [registry.get(name) for name in site.detectron2_readers if registry is not None and name in registry]
    own = getattr(getattr(kind, "from_config", None), "__func__", None)
    return own is not None and all(own is not getattr(getattr(reader, "from_config", None), "__func__", None)
                                   for reader in readers)


def builds_part(cfg: CfgNode, part: str | None) -> bool:
    """Whether the model of ``cfg`` has ``part`` (None: the backbone, always built)."""
    if part is None:
        return True
    parts = META_ARCH_PARTS.get(cfg.MODEL.META_ARCHITECTURE)  # None: may build any part
    if part == SEM_SEG_HEAD:
        return parts is None or SEM_SEG_HEAD in parts
    if parts is not None and ROI_HEADS not in parts:
        return False  # the box and mask heads are parts of the ROI heads
    if part == BOX_HEAD:
        return not is_one_of("MODEL.ROI_HEADS.NAME", cfg.MODEL.ROI_HEADS.NAME, RES5_ROI_HEADS)
    if part == MASK_HEAD:
        return bool(cfg.MODEL.MASK_ON)
    if part == RES5_HEAD:  # a backbone that makes res5 itself is no C4 backbone (e.g. built alone)
        return (is_one_of("MODEL.ROI_HEADS.NAME", cfg.MODEL.ROI_HEADS.NAME, RES5_ROI_HEADS)
                and "res5" not in cfg.MODEL.RESNETS.OUT_FEATURES)
    return True


def _unknown_names(cfg: CfgNode) -> tuple[list[_Problem], set[str]]:
    problems, unknown = [], set()
    for key in NORM_KEYS:
        name = _value(cfg, key)
        if name and name not in known_norm_names():
            unknown.add(key)
            note = spawned_process_note()
            problems.append(_Problem(f"{key}={name!r} is not a known norm name: fix the name, or register it "
                                     f"with gwdet.register_norm ({OWN_NAMES_NOTE})" + (f".{note}" if note else ""),
                                     None))
    return problems, unknown


def _replacement(component_key: str, component: str, built_with: str,
                 otherwise: str) -> tuple[str, tuple[str, str] | None]:
    """The fix for detectron2's ``component``: gwdet's replacement (and the change naming it), or
    what to do by hand where gwdet has none."""
    gwdet_component = GWDET_COMPONENTS.get(component)
    if gwdet_component is None:
        by_hand = (f"gwdet has no replacement for {component}: {otherwise}, or build that part with "
                   "gwdet.norm_from_config(name, cfg) in a subclass's from_config")
        return by_hand, None
    fix = f"gwdet's {gwdet_component} builds the same network {built_with} ({component_key} {gwdet_component})"
    return fix, (component_key, gwdet_component)


def _norm_reader_problems(cfg: CfgNode, skip: set[str]) -> list[_Problem]:
    """A norm that needs the config's values must not go to a component that cannot take them."""
    problems = []
    for site in NORM_SITES:
        name = _value(cfg, site.norm_key)
        component = _value(cfg, site.component_key)
        if site.norm_key in skip or not _reads_as_detectron2(site, component) or not builds_part(cfg, site.part):
            continue
        if detectron2_builds_as_configured(name, cfg):
            continue
        record = norm_record(name)
        reader = (f"detectron2's {component}" if component in site.detectron2_readers
                  else f"{component}, a subclass of detectron2's {' / '.join(site.detectron2_readers)},")
        if record.detectron2_values:  # detectron2 builds the name, with other values than the config's
            configured = ", ".join(f"{record.config_keys[param]}={_value(cfg, record.config_keys[param])}"
                                   for param in record.detectron2_values)
            # the one value detectron2 fixes is a group number (GN's 32)
            fixed = ", ".join(f"{value} groups" for value in record.detectron2_values.values())
            why = (f"{site.norm_key}={name!r} with {configured}, and {reader} "
                   f"({site.component_key}) always builds {name} with {fixed}")
        else:
            why = (f"{site.norm_key}={name!r}, but {reader} ({site.component_key}) cannot "
                   f"build {name!r} with the config's values (detectron2's get_norm would raise KeyError)")
        fix, change = _replacement(site.component_key, component, "with the config's values",
                                   f"set {site.norm_key} to one of detectron2's names (BN, SyncBN, FrozenBN; GN "
                                   f"with MODEL.GN.NUM_GROUPS {DETECTRON2_GN_GROUPS})")
        problems.append(_Problem(f"{why}; {fix}", change))
    return problems


def _gw_position_problems(cfg: CfgNode) -> list[_Problem]:
    """``MODEL.RESNETS.GW_POSITIONS`` must go to gwdet's components, which read it."""
    spec = cfg.MODEL.RESNETS.GW_POSITIONS
    positions = parse_gw_positions(spec)
    if not positions:
        return []
    problems = []
    backbone = cfg.MODEL.BACKBONE.NAME
    if not backbone_reads_gw_positions(backbone, GW_BACKBONES):
        why = (f"MODEL.RESNETS.GW_POSITIONS={spec!r} is read by gwdet's backbones only (and by builders of your own "
               f"marked with gwdet.modeling.reads_gw_positions), but MODEL.BACKBONE.NAME={backbone!r} is none of "
               "them: it would build a model without GW there")
        fix, change = _replacement("MODEL.BACKBONE.NAME", backbone, "with GW there",
                                   f"set MODEL.BACKBONE.NAME to one of {', '.join(GW_BACKBONES)}, or "
                                   "MODEL.RESNETS.GW_POSITIONS to ''")
        problems.append(_Problem(f"{why}; {fix}", change))
    roi_heads = cfg.MODEL.ROI_HEADS.NAME
    if (positions & set(BLOCK_CONV_OF_POSITION) and not is_one_of("MODEL.ROI_HEADS.NAME", roi_heads, GW_ROI_HEADS)
            and builds_part(cfg, RES5_HEAD)):
        why = (f"MODEL.RESNETS.GW_POSITIONS={spec!r} puts GW in every bottleneck block, but detectron2's "
               f"{roi_heads} (MODEL.ROI_HEADS.NAME) would build the res5 blocks without it")
        fix, change = _replacement("MODEL.ROI_HEADS.NAME", roi_heads, "with GW there in res5",
                                   "set MODEL.RESNETS.GW_POSITIONS to stem positions only ('S1') or ''")
        problems.append(_Problem(f"{why}; {fix}", change))
    return problems


def _error(cfg: CfgNode, problems: list[_Problem], any_unknown: bool) -> NormConfigError:
    changes: dict[str, str] = {}
    for problem in problems:
        if problem.change is not None:
            changes.setdefault(*problem.change)
    by_hand = [problem for problem in problems if problem.change is None]
    lines = [f"The config's norms cannot be built as configured ({len(problems)} finding(s))."]
    if changes:
        lines.append("Change these keys, all at once:" if not by_hand else
                     "Change these keys, all at once (and fix the findings below marked 'by hand'):")
        lines.extend(f"  {key}: {_value(cfg, key)!r} -> {value!r}" for key, value in changes.items())
        lines.append("  (command-line overrides: " + " ".join(f"{key} {value}" for key, value in changes.items())
                     + ")")
    lines.append("Findings:")
    lines.extend(f"  - {'by hand: ' if problem.change is None and changes else ''}{problem.why}"
                 for problem in problems)
    if any_unknown:
        lines.append(f"Known names: {', '.join(known_norm_names())}.")
    lines.append("gwdet's components are detectron2's own with the norms built with the config's values; "
                 f"see {DOC_SECTION}.")
    message = "\n".join(lines)
    whys = [problem.why for problem in problems]
    if any_unknown:
        return UnknownNormConfigError(message, changes, whys)
    return NormConfigError(message, changes, whys)


def norm_config_problems(cfg: CfgNode) -> NormConfigError | None:
    """Every finding about where the config's norms go, as one :class:`NormConfigError` (not
    raised), or None when there is none."""
    unknown_problems, unknown = _unknown_names(cfg)
    problems = unknown_problems + _norm_reader_problems(cfg, unknown) + _gw_position_problems(cfg)
    return _error(cfg, problems, bool(unknown)) if problems else None


def _check_gw_norm(cfg: CfgNode) -> None:
    positions = cfg.MODEL.RESNETS.GW_POSITIONS
    parse_gw_positions(positions)
    if positions and not cfg.MODEL.RESNETS.GW_NORM:
        raise GwdetValueError(
            f"MODEL.RESNETS.GW_POSITIONS={positions!r} with MODEL.RESNETS.GW_NORM='' would leave those "
            "positions without any normalization. Set GW_NORM to the norm to place there (e.g. 'GW'), "
            "or GW_POSITIONS to '' to keep MODEL.RESNETS.NORM everywhere.")


def builds_norm(cfg: CfgNode, key: str) -> bool:
    """Whether the model of ``cfg`` builds layers of the NORM key ``key``: ``MODEL.RESNETS.GW_NORM``
    at ``GW_POSITIONS`` only, an FPN's in an FPN backbone, RetinaNet's in a RetinaNet, the heads' in
    the parts the model has (:func:`builds_part`)."""
    if key == "MODEL.RESNETS.GW_NORM":
        return bool(cfg.MODEL.RESNETS.GW_POSITIONS)
    if key == "MODEL.FPN.NORM":
        return cfg.MODEL.BACKBONE.NAME not in BACKBONES_WITHOUT_FPN
    if key == "MODEL.RETINANET.NORM":
        return cfg.MODEL.META_ARCHITECTURE in ("RetinaNet", "GWRetinaNet")
    parts = {"MODEL.ROI_BOX_HEAD.NORM": BOX_HEAD, "MODEL.ROI_MASK_HEAD.NORM": MASK_HEAD,
             "MODEL.SEM_SEG_HEAD.NORM": SEM_SEG_HEAD}
    return key not in parts or builds_part(cfg, parts[key])


def _check_example_groups(cfg: CfgNode) -> None:
    """An example group larger than the whole batch never fills: BGN would silently become GN. Where
    the layers see the images (backbone, FPN, the heads run on whole feature maps), the groups must
    divide the images each process trains on (:func:`check_example_groups`); the ROI heads, whose
    batches are the varying boxes of the images, keep the layer's rule."""
    example_group_norms = {record.name for record in norm_records() if record.example_groups}
    on_images = [key for key in IMAGE_BATCH_NORM_KEYS if _value(cfg, key) in example_group_norms and builds_norm(cfg, key)]
    if on_images:  # the ROI heads' batches are their boxes, many per image
        check_example_groups(cfg.MODEL.BGN.EXAMPLES_PER_GROUP, cfg.SOLVER.IMS_PER_BATCH, comm.get_world_size(),
                             on_images, "MODEL.BGN.EXAMPLES_PER_GROUP", "SOLVER.IMS_PER_BATCH",
                             batch_note=_rescaled_batch_note(cfg))


def _rescaled_batch_note(cfg: CfgNode) -> str:
    """Where ``cfg`` is detectron2's rescaling (``DefaultTrainer.auto_scale_workers``, which copies
    the mark of the config the gate accepted) of a config with another ``SOLVER.IMS_PER_BATCH`` and a
    ``SOLVER.REFERENCE_WORLD_SIZE`` other than the number of processes: a note saying so, else ''."""
    checked = getattr(cfg, _CHECKED_CONTENT, None)
    if checked is None:
        return ""
    try:
        solver = json.loads(checked)["SOLVER"]
        given, reference = solver["IMS_PER_BATCH"], solver["REFERENCE_WORLD_SIZE"]
    except (ValueError, KeyError, TypeError):
        return ""
    batch, processes = cfg.SOLVER.IMS_PER_BATCH, comm.get_world_size()
    if given == batch or reference in (0, processes) or cfg.SOLVER.REFERENCE_WORLD_SIZE != processes:
        return ""
    return (f" (detectron2 rescaled SOLVER.IMS_PER_BATCH from the {given} given to {batch}: SOLVER.REFERENCE_WORLD_SIZE "
            f"is {reference}, and the run has {processes} process(es); set SOLVER.REFERENCE_WORLD_SIZE 0 to train with "
            "the batch as given)")


def check_example_groups(examples: int, batch: int, processes: int, layers: Sequence[str], examples_setting: str,
                         batch_setting: str, batch_note: str = "") -> None:
    """Refuse example groups of ``examples`` images (``examples_setting``) for ``layers`` that see the
    images of a batch of ``batch`` (``batch_setting``) over ``processes``: a group larger than the
    batch never fills (BGN would silently become GN), and one that does not divide the images each
    process trains on would normalize the last images of every batch as a smaller group of their own
    (the rule of :class:`~gwdet.layers.BatchGroupNorm`). ``batch_note`` follows the batch in the
    messages (how the batch came to be, where it is not the value given)."""
    if examples > batch:
        raise GwdetValueError(
            f"config: {examples_setting}={examples} is larger than {batch_setting}={batch}{batch_note}, so no example "
            f"group can be filled. Use at most the images per GPU ({batch_setting} / number of GPUs); to evaluate weights (a "
            f"model of the config, which may be trained again), give the {batch_setting} they were trained with.")
    images = batch // processes
    if images % examples:
        raise GwdetValueError(
            f"config: {examples_setting}={examples} does not divide the {images} images each process trains on "
            f"({batch_setting}={batch}{batch_note} over {processes} process(es)), so the layers of {', '.join(layers)} would "
            f"normalize the last {images % examples} image(s) of every batch as an example group of their own. Use "
            f"a {examples_setting} that divides {images}, or a {batch_setting} that is a multiple of "
            f"{examples * processes}.")


# ---- detectron2's own keys, whose bad values detectron2 refuses late or never ------------------

# the depths detectron2's ResNet builders know (their table of blocks per stage)
DETECTRON2_RESNET_DEPTHS = (18, 34, 50, 101, 152)
# the backbones that build a ResNet of MODEL.RESNETS.DEPTH (detectron2's and gwdet's)
RESNET_BACKBONES = ("build_resnet_backbone", "build_resnet_fpn_backbone", "build_retinanet_resnet_fpn_backbone",
                    "build_resnet_deeplab_backbone") + GW_BACKBONES
# the values of INPUT.MASK_FORMAT detectron2's data loading reads (detectron2.data.detection_utils)
DETECTRON2_MASK_FORMATS = ("polygon", "bitmask")
# INPUT.FORMAT -> the channels of an image detectron2 reads in it and trains on (its own BGR, and
# PIL's modes of 8-bit channels); detectron2's YUV-BT.601 gives float64 images the model cannot take,
# and PIL's other modes (1, F, I, P, ...) lack the channel axis its mapper needs
FORMAT_CHANNELS: Mapping[str, int] = {"BGR": 3, "RGB": 3, "YCbCr": 3, "HSV": 3, "LAB": 3, "L": 1, "RGBA": 4,
                                      "CMYK": 4}


def _no_whole_number(value: Any, counts: str, give: str) -> str:
    """The problem of a count that is no integer (a float, a string, a bool): ``counts`` says what
    it counts, ``give`` what to give as an integer instead."""
    return (f"is no whole number of {counts} ({type(value).__name__}): give {give}"
            f"{', unquoted' if isinstance(value, str) else ''}")


def _max_iter(cfg: CfgNode, max_iter: Any) -> str | None:
    """A ``SOLVER.MAX_ITER`` that is no integer (its range is the training's to refuse: an evaluation
    reads none of it)."""
    if is_whole_number(max_iter):
        return None
    example = (f", e.g. SOLVER.MAX_ITER {int(max_iter)}" if is_finite_number(max_iter) and max_iter >= 1
               and max_iter == int(max_iter) else "")
    return (_no_whole_number(max_iter, "iterations", "the number of iterations to train as an integer of at least 1")
            + f"{example} (detectron2's training loop counts them with range(), which takes no "
            f"{type(max_iter).__name__}).")


def _batch_number(batch: Any, world_size: int) -> str | None:
    """A total batch that is no integer (how many processes can share it is checked where they are
    known: :func:`check_batch_split`)."""
    if is_whole_number(batch):
        return None
    return _no_whole_number(batch, "images", "the batch of all processes together as an integer, a positive multiple "
                            f"of {world_size}") + "."


def _ims_per_batch(cfg: CfgNode, batch: Any) -> str | None:
    return _batch_number(batch, comm.get_world_size())


def _checkpoint_period(cfg: CfgNode, period: Any) -> str | None:
    if is_whole_number(period) and period >= 1:
        return None
    return ("is no number of iterations between checkpoints: detectron2's PeriodicCheckpointer saves one every "
            "SOLVER.CHECKPOINT_PERIOD iterations (with 0 it stops with ZeroDivisionError after the first iteration). "
            f"Use an integer >= 1; to save only the final model, use SOLVER.MAX_ITER ({_value(cfg, 'SOLVER.MAX_ITER')}).")


def _eval_period(cfg: CfgNode, period: Any) -> str | None:
    if is_whole_number(period) and period >= 0:
        return None
    return ("is no number of iterations between evaluations: give a whole number of at least 0 (0: evaluate once, "
            "after training), e.g. TEST.EVAL_PERIOD 1000.")


def _base_lr(cfg: CfgNode, lr: Any) -> str | None:
    if is_finite_number(lr) and lr >= 0:
        return None
    return ("is no learning rate: it must be a finite number >= 0 (torch's optimizer refuses a negative one with "
            "'Invalid learning rate' once the model is built, and a negative rate would climb the loss). Use a "
            "positive rate, e.g. 0.02 for a batch of 16 images (detectron2's; scale it with SOLVER.IMS_PER_BATCH).")


# A learning rate of 0 is detectron2's to take (evaluation reads it too), but a training run with it
# leaves the weights as they are: said when training starts.
ZERO_RATE = ("{setting}: training with a learning rate of 0 leaves the weights as they are through the whole run "
             "(the optimizer's steps change nothing); give the rate you mean, e.g. 0.02 for a batch of 16 images.")


SEED_LIMIT = 2 ** 32  # numpy's seeds are below it (detectron2 seeds numpy, torch and random with it)


def _seed(cfg: CfgNode, seed: Any) -> str | None:
    if is_whole_number(seed) and seed < SEED_LIMIT:
        return None
    return (f"is no seed: give a whole number below 2**32 = {SEED_LIMIT} (numpy's limit), or a negative one for a "
            "random seed, e.g. 0.")


def _num_workers(cfg: CfgNode, workers: Any) -> str | None:
    if is_whole_number(workers) and workers >= 0:
        return None
    if not is_whole_number(workers):
        return _no_whole_number(workers, "data-loading processes", "an integer of at least 0 (0: load the data in the "
                                "training process)") + ", e.g. 4."
    return ("is no number of data-loading processes: torch's DataLoader refuses a negative one when the loader is "
            "built. Use 0 (load the data in the training process) or more, e.g. 4.")


def _resnet_depth(cfg: CfgNode, depth: Any) -> str | None:
    backbone = _value(cfg, "MODEL.BACKBONE.NAME")
    if backbone not in RESNET_BACKBONES:
        return None
    if not (is_whole_number(depth) and depth in DETECTRON2_RESNET_DEPTHS):
        return (f"is not a depth of detectron2's ResNets, which MODEL.BACKBONE.NAME={backbone!r} builds (it would stop "
                f"with a bare KeyError). Use one of {', '.join(map(str, DETECTRON2_RESNET_DEPTHS))}, e.g. 50.")
    return None


def _mask_format(cfg: CfgNode, mask_format: Any) -> str | None:
    if mask_format in DETECTRON2_MASK_FORMATS:
        return None
    return ("is not a mask format detectron2 reads (it would stop with a bare AssertionError at the first mask it "
            "loads). Use 'polygon' (masks kept as polygons) or 'bitmask' (masks as images; COCO's RLE masks need it).")


def _warmup_iters(cfg: CfgNode, iters: Any) -> str | None:
    if is_whole_number(iters) and iters >= 0:
        return None
    if not is_whole_number(iters):
        return _no_whole_number(iters, "warm-up iterations", "an integer of at least 0 (0: no warm-up)") + ", e.g. 1000."
    return ("is no number of warm-up iterations: detectron2's scheduler would stretch a negative warm-up into a "
            "learning rate outside the schedule without a word. Use an integer >= 0 (0: no warm-up), e.g. 1000.")


def _steps(cfg: CfgNode, steps: Any) -> str | None:
    if (isinstance(steps, (list, tuple)) and all(is_whole_number(step) and step >= 1 for step in steps)
            and all(steps[index] < steps[index + 1] for index in range(len(steps) - 1))):
        max_iter = _value(cfg, "SOLVER.MAX_ITER")
        if is_whole_number(max_iter) and max_iter in steps:
            return (f"holds SOLVER.MAX_ITER={max_iter} itself, a step at the last iteration, which detectron2's "
                    "scheduler (fvcore) refuses when training starts: give steps below SOLVER.MAX_ITER (a step "
                    "above it is left out, with detectron2's warning).")
        return None
    return ("is no schedule of learning-rate steps: give the iterations at which the rate is multiplied by "
            "SOLVER.GAMMA as positive integers in increasing order, e.g. (60000, 80000), or () for none.")


# (section, what it samples, the losses left at 0 without foreground samples) of detectron2's samplers
SAMPLERS = (("ROI_HEADS", "regions", "the box regression and mask losses stay"),
            ("RPN", "anchors", "the RPN's box regression loss stays"))


def check_training_sampling(cfg: CfgNode) -> None:
    """Refuse, for a training, sampling values that train something else than asked: a size range
    of ``INPUT.MIN_SIZE_TRAIN`` from its larger end (numpy's bare "low >= high" at the first image),
    and a region or anchor sampling without foreground samples (:func:`no_positive_samples`)."""
    sizes, sampling = cfg.INPUT.MIN_SIZE_TRAIN, cfg.INPUT.MIN_SIZE_TRAIN_SAMPLING
    if sampling == "range" and len(sizes) == 2 and sizes[0] > sizes[1]:
        raise GwdetValueError(f"config: INPUT.MIN_SIZE_TRAIN={sizes!r} is a range from its larger end: with "
                              f"INPUT.MIN_SIZE_TRAIN_SAMPLING 'range' give the ends from low to high, ({sizes[1]}, "
                              f"{sizes[0]}).")
    meta = cfg.MODEL.META_ARCHITECTURE
    parts = META_ARCH_PARTS.get(meta)
    samples_regions = parts is None or ROI_HEADS in parts
    samples_anchors = cfg.MODEL.PROPOSAL_GENERATOR.NAME == "RPN" and meta not in ("RetinaNet", "GWRetinaNet",
                                                                                  "SemanticSegmentor")
    for section, samples, losses in SAMPLERS:
        if not (samples_regions if section == "ROI_HEADS" else samples_anchors):
            continue  # a model without that sampler (a RetinaNet, a proposal network) reads none of its values
        fraction_key = f"MODEL.{section}.POSITIVE_FRACTION"
        problem = no_positive_samples(_value(cfg, f"MODEL.{section}.BATCH_SIZE_PER_IMAGE"), _value(cfg, fraction_key),
                                      f"MODEL.{section}.BATCH_SIZE_PER_IMAGE", fraction_key, samples, losses)
        if problem is not None:
            raise GwdetValueError(f"config: {fraction_key}={_value(cfg, fraction_key)!r} {problem}")


def no_positive_samples(batch: Any, fraction: Any, batch_setting: str, fraction_setting: str, samples: str,
                        losses: str) -> str | None:
    """The problem of sampling ``batch`` (``batch_setting``) ``samples`` per image with a
    ``fraction`` (``fraction_setting``) of foreground ones, where detectron2's ``subsample_labels``
    takes ``int(batch * fraction)`` foreground samples: 0 of them leaves ``losses`` (with their
    verb) at 0 for the whole training; None where there is at least one (or a value is no number:
    its own rule)."""
    if not (is_whole_number(batch) and is_finite_number(fraction)) or int(batch * fraction) >= 1:
        return None
    least = f"a {batch_setting} of at least {math.ceil(1 / fraction)}, or " if fraction > 0 else ""
    return (f"with {batch_setting}={batch!r} samples int({batch} x {fraction:g}) = 0 foreground {samples} per image "
            f"(detectron2 rounds the count down), so {losses} 0 for the whole training: give {least}a larger "
            f"{fraction_setting}.")


def _repeated(names: Any) -> list[str]:
    counts = Counter(map(str, names)) if isinstance(names, (list, tuple)) else Counter()
    return sorted(name for name, count in counts.items() if count > 1)


def _distinct_datasets(cfg: CfgNode, names: Any) -> str | None:
    twice = _repeated(names)
    if not twice:
        return None
    return (f"names {', '.join(map(repr, twice))} more than once: give each test dataset once (evaluated twice, "
            "detectron2 files its results under no name).")


def _distinct_training_datasets(cfg: CfgNode, names: Any) -> str | None:
    twice = _repeated(names)
    if not twice:
        return None
    return (f"names {', '.join(map(repr, twice))} more than once: give each training dataset once (detectron2 "
            "would join the copies and draw their images twice as often as the others'; to weigh images, set "
            "DATALOADER.SAMPLER_TRAIN RepeatFactorTrainingSampler).")


def _gamma(cfg: CfgNode, gamma: Any) -> str | None:
    if is_finite_number(gamma) and gamma > 0:
        return None
    return ("is no learning-rate factor: each of SOLVER.STEPS multiplies the rate by it, so it must be a finite "
            "number > 0 (0 stops training, a negative one turns the rate negative), e.g. 0.1.")


def _momentum(cfg: CfgNode, momentum: Any) -> str | None:
    if is_finite_number(momentum) and 0 <= momentum < 1:
        return None
    return ("is no SGD momentum: it must be a number from 0 (none) to below 1 (torch's SGD refuses a negative one; "
            "1 or more makes the updates grow without bound), e.g. 0.9.")


def _one_of(*choices: str, reads: str) -> Callable[[CfgNode, Any], str | None]:
    """A rule for a key detectron2 reads as one of ``choices`` (``reads``: which part reads it)."""
    def problem(cfg: CfgNode, value: Any) -> str | None:
        if value in choices:
            return None
        return (f"is not one of the values {reads} knows (it would stop with a bare error when that part is "
                f"built): use one of {', '.join(map(repr, choices))}.")
    return problem


# "pragma: no mutate": the rule factories below run once, while this module is imported (to build
# DETECTRON2_VALUE_RULES), before mutmut's workers choose a mutant: a mutant of them never takes effect
# (docs/reliability.md, "Mutation testing"); tests/test_config_values.py checks the rules they build.
def _number(low: float, high: float | None = None, *, low_open: bool = False,
            means: str) -> Callable[[CfgNode, Any], str | None]:  # pragma: no mutate block
    """A rule for a finite number from ``low`` (excluded with ``low_open``) to ``high`` (``None``:
    no bound); ``means`` says what the key is."""
    def problem(cfg: CfgNode, value: Any) -> str | None:
        if is_finite_number(value) and (value > low if low_open else value >= low) and (high is None or value <= high):
            return None
        bound = f"{'above' if low_open else 'at least'} {low:g}" + (f" and at most {high:g}" if high is not None else "")
        return f"is no {means}: give a finite number {bound}."
    return problem


def _whole(least: int, most: int | None = None, *, means: str) -> Callable[[CfgNode, Any], str | None]:  # pragma: no mutate block
    """A rule for an integer from ``least`` to ``most`` (``None``: no bound); ``means`` says what
    the key counts."""
    def problem(cfg: CfgNode, value: Any) -> str | None:
        if is_whole_number(value) and value >= least and (most is None or value <= most):
            return None
        return f"is no {means}: give an integer of at least {least}" + (f" and at most {most}." if most else ".")
    return problem


def _registered(registry_name: str, *also: str, part: str | None = None) -> Callable[[CfgNode, Any], str | None]:  # pragma: no mutate block
    """A rule for a component name that detectron2 looks up in its registry ``registry_name``
    (detectron2.modeling), where gwdet's components and those a project registered before the
    build are too; ``also``: names detectron2 takes without the registry; ``part``: the model part
    the component is, checked only where the model has it (:func:`builds_part`)."""
    def problem(cfg: CfgNode, value: Any) -> str | None:
        import detectron2.modeling as modeling

        if not value or not builds_part(cfg, part):  # "": detectron2's default where the part is not chosen
            return None

        registry = getattr(modeling, registry_name)
        known = sorted([*(name for name, _ in registry), *also])
        if value in known:
            return None
        return (f"is not registered in detectron2's {registry_name} (the build would stop with a KeyError): fix "
                f"the name, or register your component before building. Registered: {', '.join(known)}.")
    return problem


def _image_format(cfg: CfgNode, image_format: Any) -> str | None:
    if image_format in FORMAT_CHANNELS:
        return None
    return (f"is not a format detectron2 reads images in and trains on: use one of {', '.join(FORMAT_CHANNELS)} "
            "(detectron2's YUV-BT.601 gives float64 images the model cannot take; PIL's modes other than these lack "
            "the channel axis detectron2's mapper needs).")


def _load_proposals(cfg: CfgNode, load: Any) -> str | None:
    if not load:
        return None
    files = {key: _value(cfg, f"DATASETS.{key}") or () for key in ("PROPOSAL_FILES_TRAIN", "PROPOSAL_FILES_TEST")}
    names = {"PROPOSAL_FILES_TRAIN": _value(cfg, "DATASETS.TRAIN") or (),
             "PROPOSAL_FILES_TEST": _value(cfg, "DATASETS.TEST") or ()}
    wrong = [key for key in files if len(files[key]) != len(names[key])]
    if not wrong:
        return None
    return (f"reads precomputed proposals, one file per dataset, and DATASETS.{wrong[0]} gives "
            f"{len(files[wrong[0]])} for {len(names[wrong[0]])} dataset(s) (detectron2 would stop on a bare "
            f"AssertionError): give one proposal file per dataset of DATASETS.{wrong[0].split('_')[-1]}, or set "
            "MODEL.LOAD_PROPOSALS False to compute proposals (an RPN).")


def _training_sampler(cfg: CfgNode, sampler: Any) -> str | None:
    problem = _one_of("TrainingSampler", "RepeatFactorTrainingSampler", "RandomSubsetTrainingSampler",
                      reads="detectron2's train loader")(cfg, sampler)
    if problem is None and sampler == "RandomSubsetTrainingSampler" and "RANDOM_SUBSET_RATIO" not in cfg.DATALOADER:
        return ("reads DATALOADER.RANDOM_SUBSET_RATIO, which this detectron2's config does not have (its loader would "
                "stop on it): use TrainingSampler or RepeatFactorTrainingSampler.")
    return problem


def _min_sizes(cfg: CfgNode, sizes: Any) -> str | None:
    sampling = _value(cfg, "INPUT.MIN_SIZE_TRAIN_SAMPLING")
    if (isinstance(sizes, (list, tuple)) and sizes and all(is_whole_number(size) and size >= 1 for size in sizes)
            and (sampling != "range" or len(sizes) == 2)):
        return None
    return ("is no list of training image sizes: give the shorter image sides to choose from as integers >= 1, "
            "e.g. (640, 672, 704) (with INPUT.MIN_SIZE_TRAIN_SAMPLING 'range': exactly two, the range's ends).")


def _scheduler_name(cfg: CfgNode, name: Any) -> str | None:
    known = _one_of("WarmupMultiStepLR", "WarmupCosineLR", "WarmupStepWithFixedGammaLR",
                    reads="detectron2's build_lr_scheduler")(cfg, name)
    if known is not None or name != "WarmupStepWithFixedGammaLR":
        return known
    decays, max_iter = _value(cfg, "SOLVER.NUM_DECAYS"), _value(cfg, "SOLVER.MAX_ITER")
    # its value changes where the fraction done reaches k / (decays + 1): at the first iteration at or after it
    steps = [-(-max_iter * k // (decays + 1)) for k in range(1, decays + 1)] \
        if is_whole_number(decays) and is_whole_number(max_iter) and decays >= 1 else []
    same = ("The same schedule: SOLVER.LR_SCHEDULER_NAME WarmupMultiStepLR with SOLVER.STEPS "
            f"\"({', '.join(map(str, steps))}{',' if len(steps) == 1 else ''})\" and the same SOLVER.GAMMA."
            if steps and steps[0] >= 1 and steps == sorted(set(steps)) and steps[-1] < max_iter else
            f"Use SOLVER.LR_SCHEDULER_NAME WarmupMultiStepLR with SOLVER.STEPS of your own (its {decays} equal steps do "
            f"not fit a run of {max_iter} iterations).")
    return ("stops the training after its last iteration: detectron2's LR hook steps the scheduler once more, at the "
            "end of the schedule, where fvcore's StepWithFixedGammaParamScheduler has no value (IndexError), so no "
            f"model_final.pth and no results are written. {same}")


def _cosine_end(cfg: CfgNode, end: Any) -> str | None:
    if _value(cfg, "SOLVER.LR_SCHEDULER_NAME") != "WarmupCosineLR":
        return None
    base = _value(cfg, "SOLVER.BASE_LR")
    if is_finite_number(base) and base == 0:
        return ("with SOLVER.BASE_LR 0: detectron2's WarmupCosineLR divides SOLVER.BASE_LR_END by SOLVER.BASE_LR; give "
                "a rate above 0 (a rate of 0 trains nothing), or SOLVER.LR_SCHEDULER_NAME WarmupMultiStepLR.")
    if is_finite_number(end) and is_finite_number(base) and 0 <= end <= base:
        return None
    return (f"is no final learning rate of WarmupCosineLR: it must be a number from 0 to SOLVER.BASE_LR ({base!r}), the "
            "rate the cosine ends at (detectron2 stops with a bare AssertionError of their ratio), e.g. 0.0.")


def _clip_norm_type(cfg: CfgNode, norm_type: Any) -> str | None:
    if (not _value(cfg, "SOLVER.CLIP_GRADIENTS.ENABLED") or _value(cfg, "SOLVER.CLIP_GRADIENTS.CLIP_TYPE") != "norm"
            or (isinstance(norm_type, (int, float)) and not isinstance(norm_type, bool) and norm_type > 0)):
        return None
    return ("is no p of a p-norm: with SOLVER.CLIP_GRADIENTS.CLIP_TYPE 'norm' it must be a number > 0 (torch computes "
            "a 0- or negative norm of the gradients, which clips them to nothing useful), e.g. 2.0; the largest "
            "absolute value is p = inf, which yacs reads from 1e999.")


def _clip_value(cfg: CfgNode, value: Any) -> str | None:
    if not _value(cfg, "SOLVER.CLIP_GRADIENTS.ENABLED") or (is_finite_number(value) and value > 0):
        return None
    return ("is no gradient clipping bound: with SOLVER.CLIP_GRADIENTS.ENABLED it must be a finite number > 0 "
            "(a negative bound would set every gradient to it), e.g. 1.0.")


def _weight_decay_bias(cfg: CfgNode, value: Any) -> str | None:
    return None if value is None else _number(0, means="weight decay of the biases")(cfg, value)


def _reference_world_size(cfg: CfgNode, size: Any) -> str | None:
    batch = _value(cfg, "SOLVER.IMS_PER_BATCH")
    if is_whole_number(size) and (size == 0 or (size >= 1 and is_whole_number(batch) and batch % size == 0)):
        return None
    return (f"is no number of processes SOLVER.IMS_PER_BATCH={batch!r} was chosen for: detectron2 rescales the "
            "batch, learning rate and schedule from it to the processes of the run, and needs a positive "
            "divisor of SOLVER.IMS_PER_BATCH. Use 0 (no rescaling) or such a divisor.")


def _res5_dilation(cfg: CfgNode, dilation: Any) -> str | None:
    if dilation not in (1, 2) or isinstance(dilation, bool):
        return "is no res5 dilation: detectron2's ResNet takes 1 (stride 32) or 2 (stride 16, the DC5 models)."
    if dilation == 1:
        return None
    backbone = _value(cfg, "MODEL.BACKBONE.NAME")
    if backbone not in BACKBONES_WITHOUT_FPN:
        return (f"keeps res5 at stride 16, as res4 is, which the FPN of MODEL.BACKBONE.NAME={backbone!r} cannot take "
                "(its inputs must halve in size level by level): use 1 with an FPN, or a backbone without one "
                "(build_gw_resnet_backbone with res5 in MODEL.RESNETS.OUT_FEATURES: detectron2's DC5 models).")
    if builds_part(cfg, RES5_HEAD):
        return (f"is read by the backbone's res5 only, and MODEL.ROI_HEADS.NAME={_value(cfg, 'MODEL.ROI_HEADS.NAME')!r} "
                "builds res5 in its ROI heads, without dilation (a C4 model): the value would be ignored. Use 1, or "
                "the DC5 layout (res5 in MODEL.RESNETS.OUT_FEATURES and StandardROIHeads).")
    return None


# INPUT.CROP.TYPE -> what detectron2's RandomCrop reads in INPUT.CROP.SIZE
CROP_SIZES = {"relative": "two fractions of the image's height and width in (0, 1], e.g. [0.9, 0.9]",
              "relative_range": "two fractions in (0, 1], the smallest crop's height and width, e.g. [0.9, 0.9]",
              "absolute": "two sizes in pixels >= 1, the crop's height and width, e.g. [640, 640]",
              "absolute_range": "two sizes in pixels >= 1, the smallest and the largest side, smallest first, "
                                "e.g. [384, 600]"}


def _crop_size(cfg: CfgNode, size: Any) -> str | None:
    crop_type = _value(cfg, "INPUT.CROP.TYPE")
    if not _value(cfg, "INPUT.CROP.ENABLED") or crop_type not in CROP_SIZES:
        return None  # no crop, or a type INPUT.CROP.TYPE's own rule refuses
    pair = isinstance(size, (list, tuple)) and len(size) == 2
    if pair and crop_type.startswith("relative") and all(is_finite_number(v) and 0 < v <= 1 for v in size):
        return None
    if pair and crop_type.startswith("absolute") and all(is_whole_number(v) and v >= 1 for v in size) and (
            crop_type == "absolute" or size[0] <= size[1]):
        return None
    return f"is no crop size for INPUT.CROP.TYPE {crop_type!r}: detectron2's RandomCrop reads {CROP_SIZES[crop_type]}."


def _thresholds(prefix: str) -> Callable[[CfgNode, Any], str | None]:  # pragma: no mutate block
    """A rule for ``{prefix}.IOU_THRESHOLDS`` with ``{prefix}.IOU_LABELS`` (detectron2's Matcher)."""
    def problem(cfg: CfgNode, thresholds: Any) -> str | None:
        labels = _value(cfg, f"{prefix}.IOU_LABELS")
        if (isinstance(thresholds, (list, tuple)) and thresholds
                and all(is_finite_number(t) and 0 <= t <= 1 for t in thresholds)
                and list(thresholds) == sorted(thresholds) and isinstance(labels, (list, tuple))
                and len(labels) == len(thresholds) + 1):
            return None
        return (f"with {prefix}.IOU_LABELS={labels!r} is no matching rule: give IoU thresholds in [0, 1] in "
                f"increasing order and one more label than thresholds (each of -1, 0, 1), e.g. IOU_THRESHOLDS "
                "[0.5] with IOU_LABELS [0, 1].")
    return problem


def _feature_names(cfg: CfgNode, names: Any) -> str | None:
    stages = ("stem", "res2", "res3", "res4", "res5")
    if isinstance(names, (list, tuple)) and names and all(name in stages for name in names):
        return None
    return f"names no ResNet outputs: give some of {', '.join(stages)}, e.g. ['res2', 'res3', 'res4', 'res5']."


def _fpn_inputs(cfg: CfgNode, names: Any) -> str | None:
    outputs = _value(cfg, "MODEL.RESNETS.OUT_FEATURES")
    backbone = _value(cfg, "MODEL.BACKBONE.NAME")
    if "fpn" not in str(backbone) or not names or (  # []: detectron2's default, for a config that builds no FPN
            isinstance(names, (list, tuple)) and isinstance(outputs, (list, tuple))
            and all(name in outputs for name in names)):
        return None
    return (f"names features the ResNet does not output (MODEL.RESNETS.OUT_FEATURES={outputs!r}), which the FPN of "
            f"MODEL.BACKBONE.NAME={backbone!r} reads: give a subset of MODEL.RESNETS.OUT_FEATURES.")


def _anchor_lists(cfg: CfgNode, lists: Any) -> str | None:
    reader = "RETINANET" if "RetinaNet" in str(_value(cfg, "MODEL.META_ARCHITECTURE")) else "RPN"
    levels = _value(cfg, f"MODEL.{reader}.IN_FEATURES")
    count = len(levels) if isinstance(levels, (list, tuple)) else None
    if (isinstance(lists, (list, tuple)) and lists and len(lists) in (1, count)
            and all(isinstance(item, (list, tuple)) and item and all(is_finite_number(v) and v > 0 for v in item)
                    for item in lists)):
        return None
    return (f"is no list of anchor settings per feature level: give one non-empty list of positive numbers per "
            f"level the proposal generator reads ({count} here: MODEL.{reader}.IN_FEATURES={levels!r}; if that is "
            "what is wrong, fix it instead), or one list for all of them, e.g. [[32], [64], [128], [256], [512]] "
            "for SIZES and [[0.5, 1.0, 2.0]] for ASPECT_RATIOS.")


def _config_version(cfg: CfgNode, version: Any) -> str | None:
    latest = get_cfg().VERSION
    if version == latest:
        return None
    return (f"is not the version of detectron2's config format ({latest}), which detectron2 sets itself (a file of "
            "an older version is upgraded as it is read): leave VERSION out of the overrides, and a run's config.yaml "
            "written with it could not be read back.")


# the loss weights of detectron2's heads (MODEL.RPN.LOSS_WEIGHT and the like; a LazyConfig's loss_weight arguments)
LOSS_WEIGHT = _number(0, means="loss weight (a negative one makes training increase its loss; 0 leaves it out)")


def _box_weights(cfg: CfgNode, weights: Any) -> str | None:
    if isinstance(weights, Sequence) and not isinstance(weights, str) and len(weights) == 4 \
            and all(is_finite_number(w) and w > 0 for w in weights):  # a list, a tuple, a LazyConfig's ListConfig
        return None
    return ("is no set of box regression weights: detectron2's Box2BoxTransform takes four numbers > 0 (x, y, width, "
            "height), e.g. (10.0, 10.0, 5.0, 5.0); other lengths fail at the first iteration.")


def _anchor_offset(cfg: CfgNode, offset: Any) -> str | None:
    if is_finite_number(offset) and 0 <= offset < 1:
        return None
    return "is no anchor offset: detectron2's anchor generator takes a number from 0 up to (not including) 1, e.g. 0.0."


def _nesterov(cfg: CfgNode, nesterov: Any) -> str | None:
    momentum = _value(cfg, "SOLVER.MOMENTUM")
    if nesterov is not True or not is_finite_number(momentum) or momentum > 0:
        return None
    return (f"needs momentum, but SOLVER.MOMENTUM is {momentum!r}: torch's SGD refuses Nesterov momentum without it "
            "once the model is built. Set SOLVER.MOMENTUM above 0 (e.g. 0.9) or SOLVER.NESTEROV False.")


def _proposal_min_size(cfg: CfgNode, size: Any) -> str | None:
    shorter = _value(cfg, "INPUT.MIN_SIZE_TEST")
    if not is_finite_number(size) or size < 0:
        return "is no proposal size: give a number of pixels >= 0 (detectron2's default 0 keeps every proposal)."
    if is_finite_number(shorter) and 0 < shorter <= size:
        return (f"drops every proposal at test time: a proposal must be wider and taller than it, and the test "
                f"images' shorter side is resized to INPUT.MIN_SIZE_TEST={shorter!r} pixels, so nothing would be "
                "detected (every AP NaN). Give a size well below the images' (e.g. 0, detectron2's default).")
    return None


@dataclass(frozen=True)
class ValueRule:
    """A key of detectron2's config and its rule: ``problem(cfg, value)`` is None for a value
    detectron2 can use, else the rest of the message after ``config: KEY=VALUE`` (why and the fix)."""

    key: str
    problem: Callable[[CfgNode, Any], str | None]


DETECTRON2_VALUE_RULES = (
    ValueRule("SOLVER.MAX_ITER", _max_iter),  # first: the rules below compare their values with it
    ValueRule("SOLVER.IMS_PER_BATCH", _ims_per_batch),
    ValueRule("SOLVER.CHECKPOINT_PERIOD", _checkpoint_period),
    ValueRule("TEST.EVAL_PERIOD", _eval_period),
    ValueRule("SOLVER.BASE_LR", _base_lr),
    ValueRule("SOLVER.WARMUP_ITERS", _warmup_iters),
    ValueRule("SOLVER.STEPS", _steps),
    ValueRule("DATASETS.TEST", _distinct_datasets),
    ValueRule("DATASETS.TRAIN", _distinct_training_datasets),
    ValueRule("SOLVER.GAMMA", _gamma),
    ValueRule("SOLVER.MOMENTUM", _momentum),
    ValueRule("DATALOADER.NUM_WORKERS", _num_workers),
    ValueRule("SEED", _seed),
    ValueRule("MODEL.RESNETS.DEPTH", _resnet_depth),
    ValueRule("INPUT.MASK_FORMAT", _mask_format),
    ValueRule("SOLVER.LR_SCHEDULER_NAME", _scheduler_name),
    ValueRule("SOLVER.BASE_LR_END", _cosine_end),
    ValueRule("SOLVER.CLIP_GRADIENTS.NORM_TYPE", _clip_norm_type),
    ValueRule("SOLVER.WARMUP_METHOD", _one_of("linear", "constant", reads="detectron2's warm-up")),
    ValueRule("SOLVER.WARMUP_FACTOR", _number(0, 1, means="warm-up factor (the rate starts at BASE_LR times it)")),
    ValueRule("SOLVER.WEIGHT_DECAY", _number(0, means="weight decay")),
    ValueRule("SOLVER.WEIGHT_DECAY_NORM", _number(0, means="weight decay of the norm layers")),
    ValueRule("SOLVER.WEIGHT_DECAY_BIAS", _weight_decay_bias),
    ValueRule("SOLVER.BIAS_LR_FACTOR", _number(0, means="learning-rate factor of the biases")),
    ValueRule("SOLVER.CLIP_GRADIENTS.CLIP_TYPE", _one_of("value", "norm", reads="detectron2's gradient clipping")),
    ValueRule("SOLVER.CLIP_GRADIENTS.CLIP_VALUE", _clip_value),
    ValueRule("SOLVER.REFERENCE_WORLD_SIZE", _reference_world_size),
    ValueRule("INPUT.FORMAT", _image_format),
    ValueRule("INPUT.MIN_SIZE_TRAIN_SAMPLING", _one_of("choice", "range", reads="detectron2's ResizeShortestEdge")),
    ValueRule("INPUT.MIN_SIZE_TRAIN", _min_sizes),
    ValueRule("INPUT.MAX_SIZE_TRAIN", _whole(1, means="longest image side")),
    ValueRule("INPUT.MIN_SIZE_TEST", _whole(0, means="test image size (0: no resizing)")),
    ValueRule("MODEL.PROPOSAL_GENERATOR.MIN_SIZE", _proposal_min_size),
    ValueRule("INPUT.MAX_SIZE_TEST", _whole(1, means="longest image side")),
    ValueRule("INPUT.RANDOM_FLIP", _one_of("none", "horizontal", "vertical", reads="detectron2's augmentations")),
    ValueRule("INPUT.CROP.TYPE", _one_of(*CROP_SIZES, reads="detectron2's RandomCrop")),
    ValueRule("INPUT.CROP.SIZE", _crop_size),
    ValueRule("MODEL.RESNETS.RES5_DILATION", _res5_dilation),
    ValueRule("DATALOADER.SAMPLER_TRAIN", _training_sampler),
    ValueRule("MODEL.LOAD_PROPOSALS", _load_proposals),
    ValueRule("DATALOADER.REPEAT_THRESHOLD", _number(0, means="repeat-factor threshold")),
    ValueRule("MODEL.META_ARCHITECTURE", _registered("META_ARCH_REGISTRY")),
    # DeepLab's backbone is registered when its detectron2 project is imported (gwdet names it)
    ValueRule("MODEL.BACKBONE.NAME", _registered("BACKBONE_REGISTRY", "build_resnet_deeplab_backbone")),
    ValueRule("MODEL.BACKBONE.FREEZE_AT", _whole(0, 5, means="number of frozen backbone stages")),
    ValueRule("MODEL.PROPOSAL_GENERATOR.NAME", _registered("PROPOSAL_GENERATOR_REGISTRY", "PrecomputedProposals")),
    ValueRule("MODEL.RPN.HEAD_NAME", _registered("RPN_HEAD_REGISTRY")),
    ValueRule("MODEL.ROI_HEADS.NAME", _registered("ROI_HEADS_REGISTRY", part=ROI_HEADS)),
    ValueRule("MODEL.ROI_BOX_HEAD.NAME", _registered("ROI_BOX_HEAD_REGISTRY", part=BOX_HEAD)),
    ValueRule("MODEL.ROI_MASK_HEAD.NAME", _registered("ROI_MASK_HEAD_REGISTRY", part=MASK_HEAD)),
    ValueRule("MODEL.RESNETS.OUT_FEATURES", _feature_names),
    ValueRule("MODEL.FPN.IN_FEATURES", _fpn_inputs),
    ValueRule("MODEL.FPN.FUSE_TYPE", _one_of("sum", "avg", reads="detectron2's FPN")),
    ValueRule("MODEL.ANCHOR_GENERATOR.SIZES", _anchor_lists),
    ValueRule("MODEL.ANCHOR_GENERATOR.ASPECT_RATIOS", _anchor_lists),
    ValueRule("MODEL.ROI_HEADS.IOU_THRESHOLDS", _thresholds("MODEL.ROI_HEADS")),
    ValueRule("MODEL.RPN.IOU_THRESHOLDS", _thresholds("MODEL.RPN")),
    ValueRule("MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE", _whole(1, means="number of regions sampled per image")),
    ValueRule("MODEL.RPN.BATCH_SIZE_PER_IMAGE", _whole(1, means="number of anchors sampled per image")),
    ValueRule("MODEL.ROI_HEADS.POSITIVE_FRACTION", _number(0, 1, means="fraction of foreground regions")),
    ValueRule("MODEL.RPN.POSITIVE_FRACTION", _number(0, 1, means="fraction of foreground anchors")),
    ValueRule("MODEL.ROI_HEADS.SCORE_THRESH_TEST", _number(0, 1, means="score threshold (scores are in [0, 1])")),
    ValueRule("MODEL.ROI_HEADS.NMS_THRESH_TEST", _number(0, 1, means="NMS IoU threshold (IoUs are in [0, 1])")),
    ValueRule("MODEL.RPN.NMS_THRESH", _number(0, 1, means="NMS IoU threshold (IoUs are in [0, 1])")),
    ValueRule("TEST.DETECTIONS_PER_IMAGE", _whole(1, means="number of detections kept per image")),
    ValueRule("MODEL.RPN.PRE_NMS_TOPK_TRAIN", _whole(1, means="number of proposals kept before NMS")),
    ValueRule("MODEL.RPN.PRE_NMS_TOPK_TEST", _whole(1, means="number of proposals kept before NMS")),
    ValueRule("MODEL.RPN.POST_NMS_TOPK_TRAIN", _whole(1, means="number of proposals kept after NMS")),
    ValueRule("MODEL.RPN.POST_NMS_TOPK_TEST", _whole(1, means="number of proposals kept after NMS")),
    ValueRule("MODEL.ROI_HEADS.NUM_CLASSES", _whole(1, means="number of classes")),
    ValueRule("MODEL.RESNETS.NUM_GROUPS", _whole(1, means="number of ResNeXt groups (1: ResNet)")),
    *(ValueRule(key, _whole(1, means="number of channels")) for key in (
        "MODEL.RESNETS.STEM_OUT_CHANNELS", "MODEL.RESNETS.RES2_OUT_CHANNELS", "MODEL.RESNETS.WIDTH_PER_GROUP",
        "MODEL.FPN.OUT_CHANNELS", "MODEL.ROI_BOX_HEAD.CONV_DIM", "MODEL.ROI_BOX_HEAD.FC_DIM",
        "MODEL.ROI_MASK_HEAD.CONV_DIM")),
    *(ValueRule(f"MODEL.{head}.POOLER_RESOLUTION", _whole(1, means="pooled region size"))
      for head in ("ROI_BOX_HEAD", "ROI_MASK_HEAD")),
    *(ValueRule(f"MODEL.{head}.POOLER_TYPE", _one_of("ROIAlign", "ROIAlignV2", "ROIPool", "ROIAlignRotated",
                                                     reads="detectron2's ROIPooler"))
      for head in ("ROI_BOX_HEAD", "ROI_MASK_HEAD")),
    *(ValueRule(f"MODEL.{head}.BBOX_REG_LOSS_TYPE", _one_of("smooth_l1", "giou", "diou", "ciou",
                                                            reads="detectron2's box regression loss"))
      for head in ("ROI_BOX_HEAD", "RPN")),
    *(ValueRule(f"MODEL.{head}.BBOX_REG_WEIGHTS", _box_weights) for head in ("ROI_BOX_HEAD", "RPN")),
    *(ValueRule(key, LOSS_WEIGHT) for key in (
        "MODEL.RPN.LOSS_WEIGHT", "MODEL.RPN.BBOX_REG_LOSS_WEIGHT", "MODEL.ROI_BOX_HEAD.BBOX_REG_LOSS_WEIGHT",
        "MODEL.ROI_KEYPOINT_HEAD.LOSS_WEIGHT", "MODEL.SEM_SEG_HEAD.LOSS_WEIGHT",
        "MODEL.PANOPTIC_FPN.INSTANCE_LOSS_WEIGHT")),
    ValueRule("MODEL.ANCHOR_GENERATOR.OFFSET", _anchor_offset),
    ValueRule("SOLVER.NESTEROV", _nesterov),
    ValueRule("VERSION", _config_version),
)


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


YACS_PIXEL_KEYS = ("MODEL.PIXEL_MEAN", "MODEL.PIXEL_STD", "INPUT.FORMAT")


def _check_pixel_normalization(cfg: CfgNode) -> None:
    """:func:`check_pixel_normalization` of the config's ``MODEL.PIXEL_MEAN``, ``MODEL.PIXEL_STD``
    and ``INPUT.FORMAT``."""
    mean, std, image_format = (_value(cfg, key) for key in YACS_PIXEL_KEYS)
    if mean is None or std is None:  # a config without detectron2's keys (a project's own)
        return
    check_pixel_normalization(mean, std, image_format)


def check_batch_split(described: str, batch: Any, world_size: int) -> None:
    """Refuse a total batch that is no integer, or that ``world_size`` processes cannot share
    evenly; ``described``, the messages' subject, names its setting and value (``"SETTING=VALUE"``)."""
    problem = _batch_number(batch, world_size)
    if problem is not None:
        raise GwdetValueError(f"{described} {problem}")
    if batch < 1 or batch % world_size:
        raise GwdetValueError(
            f"{described}, which {world_size} process(es) (--num-gpus x --num-machines) cannot share evenly: use a "
            f"positive multiple of {world_size} (it is the batch of all processes together).")


def check_pixel_normalization(mean: Any, std: Any, image_format: Any,
                              keys: Sequence[str] = YACS_PIXEL_KEYS) -> None:
    """The pixel ``mean`` and ``std`` hold one finite number per channel of the images of
    ``image_format`` (the backbone takes ``len(mean)`` input channels), the std ones above 0: the
    model computes ``(image - mean) / std`` per channel. ``keys``: the settings of the three values
    (a yacs config's, or a LazyConfig's ``model.pixel_mean`` ...), as the refusals name them."""
    mean_key, std_key, format_key = keys
    channels = FORMAT_CHANNELS.get(image_format)
    values = {mean_key: mean, std_key: std}
    examples = {mean_key: "[103.53, 116.28, 123.675]", std_key: "[57.375, 57.12, 58.395]"}
    for key, value in values.items():
        if not isinstance(value, (list, tuple)) or not all(is_finite_number(item) for item in value):
            raise GwdetValueError(
                f"config: {key}={value!r} must be a list of finite numbers, one per channel of the images "
                f"({format_key}={image_format!r}), e.g. {examples[key]} for BGR images (ImageNet's).")
    if any(item <= 0 for item in std):
        raise GwdetValueError(
            f"config: {std_key}={std!r} holds a value <= 0: the model divides each image channel by its value "
            "(0 gives inf and NaN inputs, a negative value flips the channel). Use the standard deviations of the "
            "pixel values, all > 0, e.g. [57.375, 57.12, 58.395] (ImageNet's, in BGR order), or 1.0 per channel "
            "for weights that took them into their first conv (detectron2's MSRA R-50 and R-101).")
    wrong = [key for key, value in values.items() if channels is not None and len(value) != channels]
    if wrong:
        given = " and ".join(f"{key}={values[key]!r}" for key in wrong)
        lengths = sorted({len(values[key]) for key in wrong})
        formats = [name for name, count in FORMAT_CHANNELS.items() if count == lengths[0]]
        other_format = (f", or set {format_key} to a format of {_count(lengths[0], 'channel')} ({', '.join(formats)})"
                        if len(mean) == len(std) and formats else "")
        raise GwdetValueError(
            f"config: {given} {'has' if len(wrong) == 1 else 'have'} "
            f"{' and '.join(_count(length, 'value') for length in lengths)}, but images of "
            f"{format_key}={image_format!r} have {_count(channels or 0, 'channel')}: the model normalizes each "
            f"channel with one value of {mean_key} and one of {std_key}, and the backbone takes "
            f"len({mean_key}) input channels. Give {' and '.join(wrong)} {_count(channels or 0, 'value')}"
            f"{' each' if len(wrong) > 1 else ''}, one per channel{other_format}.")
    if len(mean) != len(std):
        raise GwdetValueError(
            f"config: {mean_key}={mean!r} has {_count(len(mean), 'value')} and {std_key}={std!r} has "
            f"{len(std)}: the model normalizes each image channel with one value of each. Give both one value per "
            f"channel of the images ({format_key}={image_format!r}).")
    if all(0 <= item <= 1 for item in mean) and all(item < 1 for item in std):
        raise GwdetValueError(
            f"config: {mean_key}={mean!r} and {std_key}={std!r} are statistics of pixel values from 0 to 1 "
            "(torchvision's), but detectron2 gives the model values from 0 to 255: the normalized inputs would reach "
            f"about {255 / min(std):.0f}. Multiply both by 255 (ImageNet's: {examples[mean_key]} and "
            f"{examples[std_key]} in BGR order; [123.675, 116.28, 103.53] and [58.395, 57.12, 57.375] in RGB).")


def check_no_empty_values(cfg: CfgNode) -> None:
    """Raise ``ValueError`` for a key of detectron2 or gwdet left empty (``None``: yacs takes it for
    any key, from an empty YAML value ``KEY:`` or the override ``KEY None``) whose default is a
    value; a project's own keys, and keys whose default is ``None``, may be empty."""
    defaults = flatten_config(add_gwdet_config(get_cfg()))
    for key, value in flatten_config(cfg).items():
        if value is None and defaults.get(key) is not None:
            raise GwdetValueError(
                f"config: {key} is empty (None), where its default is {defaults[key]!r}: give it a value (an "
                f"empty YAML value, '{key.rsplit('.', 1)[-1]}:' with nothing after it, YAML's ~ and null, or the "
                f"override '{key} None' reads as None).")


@functools.lru_cache(maxsize=1)
def _default_keys() -> tuple[frozenset[str], frozenset[str]]:
    """The dotted keys of detectron2's defaults with gwdet's (``get_cfg()`` with
    :func:`add_gwdet_config`), and their sections."""
    keys = frozenset(flatten_config(add_gwdet_config(get_cfg())))
    sections = frozenset(key.rsplit(".", depth)[0] for key in keys for depth in range(1, key.count(".") + 1))
    return keys, sections


def _differ_in_digits_only(name: str, other: str) -> bool:
    """Whether ``name`` and ``other`` differ in digits only (``RES4_DILATION``, ``RES5_DILATION``):
    the numbered keys of a family, which a project extends on purpose."""
    return len(name) == len(other) and all(a == b or (a.isdigit() and b.isdigit())
                                           for a, b in zip(name, other, strict=True))


def _swapped_letters(name: str, other: str) -> bool:
    """Whether ``name`` is ``other`` with two neighbouring letters swapped (``NROM``, ``NORM``)."""
    if len(name) != len(other) or name == other:
        return False
    at = [index for index, (a, b) in enumerate(zip(name, other, strict=True)) if a != b]
    return len(at) == 2 and at[1] == at[0] + 1 and name[at[0]] == other[at[1]] and name[at[1]] == other[at[0]]


def check_unknown_keys(cfg: CfgNode) -> None:
    """Raise ``KeyError`` for a key set in a section of detectron2's or gwdet's defaults that neither
    has, nor a registered norm's ``config_keys``, nor :func:`gwdet.config.allow_config_keys`, when its
    name is one of theirs in other letter case or close to one of theirs (a misspelling set from
    Python, ``cfg.MODEL.FPN.NORMS = "GN"``, or a misspelt section, ``cfg.MODEL.RESNET.GW_POSITIONS``;
    a config file's or override's is refused when merged). A key of a project's own (a new section,
    ``MODEL.POINT_HEAD``, or a name close to none, ``MODEL.ROI_MASK_HEAD.FC_DIM``) is left to the
    project's code, which reads it."""
    keys, sections = _default_keys()
    known = keys | sections | {key for record in norm_records() for key in record.config_keys.values()}
    allowed = allowed_config_keys()

    def walk(node: Mapping, prefix: str) -> None:
        for key, value in node.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            if name in known:
                if isinstance(value, Mapping) and name in sections:
                    walk(value, name)
                continue
            if name in allowed:
                continue
            siblings = {other.rsplit(".", 1)[-1]: other for other in known
                        if other.rpartition(".")[0] == prefix}
            upper = str(key).upper()
            close = ([siblings[upper]] if upper in siblings else
                     [siblings[match] for match in sorted(siblings) if _swapped_letters(upper, match)] or
                     [siblings[match] for match in difflib.get_close_matches(upper, list(siblings), n=3, cutoff=0.8)
                      if not _differ_in_digits_only(upper, match)][:2])
            if close:
                what = "section" if isinstance(value, Mapping) else "key"
                raise GwdetKeyError(
                    f"{name} is not a {what} of detectron2's or gwdet's config (set in Python after the config was "
                    f"read?), so nothing reads it.{did_you_mean(close, quote=False)} Set that instead; a {what} a "
                    f"project of yours adds on purpose is declared with gwdet.config.allow_config_keys({name!r}) "
                    "before the config is used.")

    walk(cfg, "")


def check_detectron2_values(cfg: CfgNode) -> None:
    """Raise ``ValueError`` naming the key, its value and the fix for a value of detectron2's own
    keys that detectron2 would refuse only late (when the optimizer, the data loader or the first
    checkpoint is made, at the first mask loaded) or with a bare error: :data:`DETECTRON2_VALUE_RULES`,
    and the pixel mean and std (:func:`_check_pixel_normalization`)."""
    for rule in DETECTRON2_VALUE_RULES:
        _check_rule(cfg, rule)
    _check_pixel_normalization(cfg)


def value_refusal(cfg: CfgNode, key: str, value: Any) -> str | None:
    """What the value checks (gwdet's table, :data:`DETECTRON2_VALUE_RULES`) would say of ``key`` set
    to ``value`` in ``cfg`` (left as it is); ``None`` where they accept it, or check no such key."""
    try:
        if key in {config_key.name for config_key in CONFIG_KEYS}:
            check_config_value(key, value)
        else:
            changed = cfg.clone()
            changed.defrost()
            changed.merge_from_list([key, value])
            check_detectron2_value(changed, key)
    except GwdetError as error:
        return str(error)
    return None


def check_detectron2_value(cfg: CfgNode, key: str) -> None:
    """:func:`check_detectron2_values` of the key ``key`` alone (a rule of
    :data:`DETECTRON2_VALUE_RULES`), for a check that reads it before the whole config is checked."""
    for rule in DETECTRON2_VALUE_RULES:
        if rule.key == key:
            _check_rule(cfg, rule)


def _check_rule(cfg: CfgNode, rule: ValueRule) -> None:
    value = _value(cfg, rule.key)
    if value is None:  # a config without the key (a project's own): nothing to check
        return
    problem = rule.problem(cfg, value)
    if problem is not None:
        raise GwdetValueError(f"config: {rule.key}={value!r} {problem}")


def check_gwdet_config(cfg: CfgNode) -> None:
    """Raise (naming the keys and the fix) for any config value gwdet cannot build as written.

    Values are checked first (each error names its key, and none depends on which components
    build the model); then every finding about where the norms go is raised at once as a
    :class:`NormConfigError` whose message lists every key to change (``.changes``); applying them
    all builds the model. A config that passes is marked with its content (:func:`ensure_checked`).
    """
    require_gwdet_config(cfg, "gwdet")
    check_no_empty_values(cfg)
    check_config_values(cfg)
    check_unknown_keys(cfg)
    check_detectron2_values(cfg)
    _check_gw_norm(cfg)
    _check_example_groups(cfg)
    error = norm_config_problems(cfg)
    if error is not None:
        raise error
    warn_unbuilt_norms(cfg)
    warn_of_basic_block_resnext_values(cfg)
    object.__setattr__(cfg, _CHECKED_CONTENT, _content(cfg))  # beside yacs' own flags, not a config key


def warn_of_basic_block_resnext_values(cfg: CfgNode) -> None:
    """A warning when a ResNet of basic blocks (``MODEL.RESNETS.DEPTH`` 18 or 34) is given ResNeXt
    values (``NUM_GROUPS`` other than 1): detectron2 builds basic blocks without groups, so the
    model is a plain ResNet of that depth."""
    depth, groups = cfg.MODEL.RESNETS.DEPTH, cfg.MODEL.RESNETS.NUM_GROUPS
    if cfg.MODEL.BACKBONE.NAME in RESNET_BACKBONES and depth in (18, 34) and groups != 1:
        logging.getLogger(__name__).warning(
            f"MODEL.RESNETS.NUM_GROUPS is {groups}, but MODEL.RESNETS.DEPTH {depth} builds basic blocks, which "
            "detectron2 builds without groups (nor WIDTH_PER_GROUP): the model is a plain ResNet-"
            f"{depth}. Use a depth of 50 or more for a ResNeXt, or MODEL.RESNETS.NUM_GROUPS 1.")


def warn_unbuilt_norms(cfg: CfgNode) -> None:
    """A warning for each NORM key given a norm that only parts the model does not build would read
    (a mask head without ``MODEL.MASK_ON``, a box head in a C4 model, an FPN in a backbone without
    one, a RetinaNet head in another meta-architecture, ``MODEL.RESNETS.GW_NORM`` other than its
    default without ``GW_POSITIONS``): the setting has no effect."""
    meta = cfg.MODEL.META_ARCHITECTURE
    parts = META_ARCH_PARTS.get(meta)
    why_not_built = {MASK_HEAD: "MODEL.MASK_ON is False",
                     BOX_HEAD: f"MODEL.ROI_HEADS.NAME is {cfg.MODEL.ROI_HEADS.NAME!r}, whose res5 stage is the box head"}
    for site in NORM_SITES:
        name = _value(cfg, site.norm_key)
        if name and site.part in why_not_built and not builds_part(cfg, site.part):
            why = (f"MODEL.META_ARCHITECTURE is {meta!r}, which builds no ROI heads"
                   if parts is not None and ROI_HEADS not in parts else why_not_built[site.part])
            logging.getLogger(__name__).warning(
                f"{site.norm_key} is {name!r}, but the model has no {site.part.replace('_', ' ')} "
                f"({why}): no {name} is built there. Set {site.norm_key} \"\" or build that part.")
    retinanet_norm = _value(cfg, "MODEL.RETINANET.NORM")
    if retinanet_norm and not builds_norm(cfg, "MODEL.RETINANET.NORM"):
        logging.getLogger(__name__).warning(
            f"MODEL.RETINANET.NORM is {retinanet_norm!r}, but the model has no RetinaNet head "
            f"(MODEL.META_ARCHITECTURE is {meta!r}): no {retinanet_norm} is built there. Set MODEL.RETINANET.NORM \"\" "
            "or build a RetinaNet.")
    gw_norm = _value(cfg, "MODEL.RESNETS.GW_NORM")
    if gw_norm != config_default("MODEL.RESNETS.GW_NORM") and not builds_norm(cfg, "MODEL.RESNETS.GW_NORM"):
        logging.getLogger(__name__).warning(
            f"MODEL.RESNETS.GW_NORM is {gw_norm!r}, but MODEL.RESNETS.GW_POSITIONS is empty: GW_NORM is built at those "
            f"positions only, so no {gw_norm} is built; the backbone's norms are MODEL.RESNETS.NORM "
            f"({cfg.MODEL.RESNETS.NORM!r}). Give GW_POSITIONS (e.g. 'S1-B2'), or set the name as MODEL.RESNETS.NORM.")
    fpn_norm, backbone = _value(cfg, "MODEL.FPN.NORM"), cfg.MODEL.BACKBONE.NAME
    if fpn_norm and backbone in BACKBONES_WITHOUT_FPN:
        logging.getLogger(__name__).warning(
            f"MODEL.FPN.NORM is {fpn_norm!r}, but the model has no FPN (MODEL.BACKBONE.NAME is {backbone!r}): no "
            f"{fpn_norm} is built there. Set MODEL.FPN.NORM \"\" or build an FPN backbone.")
    warn_unread_norm_values(cfg)


# gwdet's sections of norm hyper-parameters, read by the norm names whose records name their keys
NORM_VALUE_SECTIONS = ("MODEL.GW.", "MODEL.GN.", "MODEL.BW.", "MODEL.BGN.")
# group numbers a config's base sets for every norm it may build, so that GN and GW compare at the
# same number (group_whitening_huang2021, Fig. 6): unread in a model without that norm, on purpose
SHARED_GROUP_KEYS = ("MODEL.GW.NUM_GROUPS", "MODEL.GN.NUM_GROUPS")


def built_norm_names(cfg: CfgNode) -> list[str]:
    """The names of the norms the config's NORM keys build, sorted."""
    return sorted({_value(cfg, key) for key in NORM_KEYS if _value(cfg, key) and builds_norm(cfg, key)})


def norm_keys_read(cfg: CfgNode) -> set[str]:
    """The keys of norm hyper-parameters that the norms the config builds read (their records'
    ``config_keys``): a key of :func:`norm_value_defaults` outside it has no effect on the model."""
    return {key for name in built_norm_names(cfg) for key in norm_record(name).config_keys.values()}


def norm_value_defaults() -> dict[str, Any]:
    """``{key: default}`` of the keys that only norms read: gwdet's sections of
    :data:`NORM_VALUE_SECTIONS`, and the ``config_keys`` of registered names that neither
    detectron2's nor gwdet's config has (``MODEL.MY_GN.NUM_GROUPS``), with the default their build
    function gives (:func:`gwdet.norms.add_registered_config_keys`)."""
    defaults = {key: default for key, default in flatten_config(add_gwdet_config(CfgNode())).items()
                if key.startswith(NORM_VALUE_SECTIONS)}
    known, _ = _default_keys()
    registered = flatten_config(add_registered_config_keys(CfgNode()))
    return {**defaults, **{key: default for key, default in registered.items() if key not in known}}


def warn_unread_norm_values(cfg: CfgNode) -> None:
    """A warning for each norm hyper-parameter that only norms read (:func:`norm_value_defaults`:
    ``MODEL.GW.*``, ``MODEL.GN.*``, ``MODEL.BW.*``, ``MODEL.BGN.*`` and registered names' own
    ``config_keys``) set away from its default that none of the norms the config's NORM keys build
    reads (``MODEL.BGN.NUM_GROUPS`` with GhostBN only, ``MODEL.GW.T`` with GW_ZCA only, ``MODEL.BW.T``
    without a BW layer, ``MODEL.MY_GN.NUM_GROUPS`` without a MyGN layer): the value has no effect. The
    group numbers of :data:`SHARED_GROUP_KEYS` are named only where a norm of their section is built;
    a registered key the config lacks (registered after the config was made) is set by nothing."""
    built = built_norm_names(cfg)
    read = norm_keys_read(cfg)
    present = flatten_config(cfg)
    for key, default in norm_value_defaults().items():
        if key in read or key not in present:
            continue
        value = config_value(cfg, key)
        if value == default:
            continue
        section_read = any(other.startswith(key.rsplit(".", 1)[0] + ".") for other in read)
        if not section_read and key in SHARED_GROUP_KEYS:
            continue
        readers = [record.name for record in norm_records() if key in record.config_keys.values()]
        logging.getLogger(__name__).warning(
            f"{key} is {value!r} (default {default!r}), but none of the norms the model builds "
            f"({', '.join(built) or 'none'}) reads it; {' and '.join(readers) or 'no norm'} "
            f"{'does' if len(readers) == 1 else 'do'}: the value has no effect. Set {key} back to {default!r}, or "
            "use a norm that reads it.")


# The attribute of a CfgNode holding the content check_gwdet_config accepted (copied by clone()).
_CHECKED_CONTENT = "_gwdet_checked_content"


def _content(cfg: CfgNode) -> str:
    """Every key and value of ``cfg``, as one string."""
    return json.dumps(cfg, sort_keys=True, default=repr)


def ensure_checked(cfg: CfgNode) -> None:
    """:func:`check_gwdet_config`, unless it already accepted ``cfg`` with its present content.

    The gate of gwdet's components (backbones, heads), which detectron2's own ``build_model`` may
    build without passing through :func:`gwdet.build_model`: a config read by
    :func:`gwdet.model_zoo.build_config` or checked by a build is checked once, and a changed
    value is checked again."""
    if getattr(cfg, _CHECKED_CONTENT, None) != _content(cfg):
        check_gwdet_config(cfg)
