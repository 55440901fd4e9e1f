"""Which runs ("cells") a study trains: a norm configuration at a batch size and a seed.

group_whitening_huang2021 (end of Sec. 5.2) trains Faster R-CNN from scratch at 2 images per GPU
with four norm configurations: all BN, BN + GW at S1-B2, all GN and all GW. The named studies:

* ``paper``: those four at the configs' batch size (2) with seeds 0, 1, 2;
* ``batch-sweep``: the four at 1, 2, 4 and 8 images per batch, seed 0, with the number of images
  seen held fixed and the learning rate scaled linearly (:func:`batch_scaling_opts`), as in the
  Group Normalization paper's Fig. 1, for detection;
* ``heads``: BN + GW at S1-B2 as it is (BN in the FPN and box head) and with GN or GW there
  instead, beside all GN, at 2 images per batch with seeds 0-4: whether BN + GW's gap to GN comes
  from the batch norms that normalize over 2 images outside the backbone.

A cell's name is ``<group>-b<batch>-s<seed>`` and names its folder, so a cell two studies share
(the batch sweep's 2-image cells at seed 0 are the paper study's) is trained once. Custom run
sets (``--configs``, ``--extra``) are cells too, one per config and seed.
"""
from __future__ import annotations

import itertools
import math
import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from detectron2.config import CfgNode

from gwdet.errors import GwdetValueError
from gwdet.utils.atomic import NAME_MAX

PAPER_GROUPS = ("bn", "bn_gw_s1b2", "gn", "gw")
HEADS_GROUPS = ("bn_gw_s1b2", "bn_gw_s1b2_gn_heads", "bn_gw_s1b2_gw_heads", "gn")
GROUP_LABELS = {"bn": "BN", "bn_gw_s1b2": "BN+GW S1-B2", "gn": "GN", "gw": "GW",
                "bn_gw_s1b2_gn_heads": "BN+GW S1-B2, GN heads", "bn_gw_s1b2_gw_heads": "BN+GW S1-B2, GW heads"}
# Box AP of the paper's from-scratch runs at 2 images per GPU (COCO, Faster R-CNN R-50-FPN, 1x: the
# setup of its Table 4, which the from-scratch experiment says it follows).
PAPER_AP = {"bn": 25.10, "bn_gw_s1b2": 28.37, "gn": 28.19, "gw": 28.79}
# The one MODEL key an override may set while the row keeps the paper's number: where the model runs,
# not what it is (:func:`model_overrides`).
MODEL_KEYS_OF_THE_MACHINE = ("MODEL.DEVICE",)
# Every pairwise ordering the paper's four numbers imply, as (better, worse) pairs: all six pairs,
# higher paper AP first (GW > BN + GW > GN > BN).
PAPER_ORDERINGS = tuple(itertools.combinations(sorted(PAPER_GROUPS, key=PAPER_AP.__getitem__, reverse=True), 2))
# The heads study's questions, as (A, B) pairs tested for A > B: does GN or GW in the FPN and box
# head raise BN + GW, and does it close the gap to all GN?
HEADS_COMPARISONS = (("bn_gw_s1b2_gn_heads", "bn_gw_s1b2"), ("bn_gw_s1b2_gw_heads", "bn_gw_s1b2"),
                     ("gn", "bn_gw_s1b2_gn_heads"), ("gn", "bn_gw_s1b2_gw_heads"))
# Every comparison a report makes where it has both sides' cells, in this order.
COMPARISONS = PAPER_ORDERINGS + HEADS_COMPARISONS
CONFIG_PATTERNS = {
    "shapes": "configs/Study/{group}.yaml",
    "coco": "configs/Scratch/faster_rcnn_R_50_FPN_{group}.yaml",
}
STUDIES = ("paper", "batch-sweep", "heads")
STUDY_GROUPS = {"paper": PAPER_GROUPS, "batch-sweep": PAPER_GROUPS, "heads": HEADS_GROUPS}
DEFAULT_SEEDS = {"paper": (0, 1, 2), "batch-sweep": (0,), "heads": (0, 1, 2, 3, 4)}
DEFAULT_BATCH_SIZES = (1, 2, 4, 8)
MAX_SHOWN_BATCH_SIZE = 32  # the largest batch size a refused schedule's message lists as fitting it
# Solver keys counted in iterations: scaled by (config batch / cell batch) to keep images fixed.
ITERATION_KEYS = ("MAX_ITER", "WARMUP_ITERS", "CHECKPOINT_PERIOD")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
MAX_FOLDER_VERSIONS = 99  # folders <cell>, <cell>.2, ... <cell>.99 (--on-mismatch new-folder)
# the longest cell name whose folder, with the version suffix of the last of them, a file system takes
MAX_NAME_LENGTH = NAME_MAX - len(f".{MAX_FOLDER_VERSIONS}")


@dataclass(frozen=True)
class Cell:
    """One run: its ``name`` (folder and table row), the ``group`` it is averaged in (a norm
    configuration), its config file and overrides, and the seed and batch size they give."""

    name: str
    group: str
    config_file: str
    opts: tuple[str, ...]
    seed: int
    batch_size: int

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise GwdetValueError(
                f"Run name {self.name!r} must start with an ASCII letter (a-z, A-Z) or digit and hold only ASCII "
                "letters, digits and _ . + - (it names a folder)."
            )
        if len(self.name) > MAX_NAME_LENGTH:
            raise GwdetValueError(
                f"Run name {self.name[:40]}... is {len(self.name)} characters long: it names a folder (with a "
                f"version suffix such as .2), and folder names end at {NAME_MAX} bytes. Give the configuration a name "
                f"that keeps its cells' names to {MAX_NAME_LENGTH} characters; nothing was written.")
        if len(self.opts) % 2:
            raise GwdetValueError(f"Run {self.name!r}: overrides must be KEY VALUE pairs, got {list(self.opts)}")

    @property
    def label(self) -> str:
        return GROUP_LABELS.get(self.group, self.group)


@dataclass(frozen=True)
class RunSpec:
    """A named config with overrides of its own, before seeds and batch sizes make cells of it."""

    name: str
    config_file: str
    opts: tuple[str, ...] = ()


def cell_name(group: str, batch_size: int, seed: int) -> str:
    return f"{group}-b{batch_size}-s{seed}"


def paper_specs(dataset: str, repo_root: Path, study: str = "paper") -> list[RunSpec]:
    """The configurations of the named ``study`` on ``dataset`` ("shapes": configs/Study, "coco":
    configs/Scratch, which has the paper's four only)."""
    if dataset not in CONFIG_PATTERNS:
        raise GwdetValueError(f"Unknown dataset {dataset!r}; choose one of {', '.join(CONFIG_PATTERNS)}.")
    if study == "heads" and dataset != "shapes":
        raise GwdetValueError("--study heads has configs for --dataset shapes only (configs/Study/*_heads.yaml).")
    pattern = CONFIG_PATTERNS[dataset]
    return [RunSpec(group, str(repo_root / pattern.format(group=group))) for group in STUDY_GROUPS[study]]


def batch_scaling_opts(cfg: CfgNode, batch_size: int) -> tuple[str, ...]:
    """Overrides that train ``cfg`` at ``batch_size`` images per batch on the same number of images
    with the learning rate scaled linearly: iteration counts (``MAX_ITER``, ``STEPS``,
    ``WARMUP_ITERS``, ``CHECKPOINT_PERIOD``, ``TEST.EVAL_PERIOD``) times ``B / batch_size`` and
    ``BASE_LR`` times ``batch_size / B``, where B is ``cfg``'s batch. Empty at B itself, so that
    cell's config is the config's own. ``ValueError`` when a count does not scale to an integer."""
    base = int(cfg.SOLVER.IMS_PER_BATCH)
    if batch_size == base:
        return ()
    if batch_size < 1:
        raise GwdetValueError(f"Batch size must be at least 1, got {batch_size}.")

    counts = _schedule_counts(cfg)
    _check_schedule_scales(counts, base, batch_size)
    scaled = {key: [iterations * base // batch_size for iterations in values] for key, values in counts.items()}
    opts = ["SOLVER.IMS_PER_BATCH", str(batch_size), "SOLVER.BASE_LR", repr(cfg.SOLVER.BASE_LR * batch_size / base)]
    for key in ITERATION_KEYS:
        opts += [f"SOLVER.{key}", str(scaled[f"SOLVER.{key}"][0])]
    opts += ["SOLVER.STEPS", repr(tuple(scaled["SOLVER.STEPS"]))]
    if cfg.TEST.EVAL_PERIOD:
        opts += ["TEST.EVAL_PERIOD", str(scaled["TEST.EVAL_PERIOD"][0])]
    return tuple(opts)


def _schedule_counts(cfg: CfgNode) -> dict[str, list[int]]:
    """The iteration counts :func:`batch_scaling_opts` scales, by key (``SOLVER.STEPS``: each step)."""
    counts = {f"SOLVER.{key}": [int(cfg.SOLVER[key])] for key in ITERATION_KEYS}
    counts["SOLVER.STEPS"] = [int(step) for step in cfg.SOLVER.STEPS]
    if cfg.TEST.EVAL_PERIOD:
        counts["TEST.EVAL_PERIOD"] = [int(cfg.TEST.EVAL_PERIOD)]
    return counts


def _nearest_multiple(value: int, multiple: int) -> int:
    """The multiple of ``multiple`` nearest ``value`` (the lower on a tie), at least ``multiple``."""
    lower = value // multiple * multiple
    nearest = lower if value - lower <= lower + multiple - value else lower + multiple
    return max(nearest, multiple)


def _check_schedule_scales(counts: dict[str, list[int]], base: int, batch_size: int) -> None:
    """Refuse, naming every one at once, the iteration counts of ``counts`` (at ``base`` images per
    batch) that are no whole number of iterations of ``batch_size`` images, each with the nearest
    count that is, the ``--opts`` that gives them, and the batch sizes the schedule fits as it is."""
    multiple = batch_size // math.gcd(base, batch_size)  # a count fits when it is a multiple of this
    unfit = {key: values for key, values in counts.items() if any(value % multiple for value in values)}
    if not unfit:
        return

    def shown(key: str, values: list[int]) -> str:
        return f"({', '.join(map(str, values))}{',' * (len(values) == 1)})" if key == "SOLVER.STEPS" else str(values[0])

    fits = {key: [value if value % multiple == 0 else _nearest_multiple(value, multiple) for value in values]
            for key, values in unfit.items()}
    named = ", ".join(f"{key} = {shown(key, values)} (fits: {shown(key, fits[key])})" for key, values in unfit.items())
    given = " ".join(f"{key} {shown(key, values)!r}" if key == "SOLVER.STEPS" else f"{key} {shown(key, values)}"
                     for key, values in fits.items())
    images = math.gcd(*(value * base for values in counts.values() for value in values))
    sizes = [size for size in range(1, MAX_SHOWN_BATCH_SIZE + 1) if images == 0 or images % size == 0]
    raise GwdetValueError(
        f"batch size {batch_size}: {named}: iteration counts of the config's {base} images per batch that are no "
        f"whole number of iterations of {batch_size} images (each must be a multiple of {multiple} iterations of "
        f"{base} images). Give counts that fit with --opts (in iterations of {base} images; applied to every cell), "
        f"e.g. --opts {given}, or batch sizes this schedule fits as it is (--batch-sizes, up to "
        f"{MAX_SHOWN_BATCH_SIZE}): {' '.join(map(str, sizes))}.")


def model_overrides(opts: Sequence[str]) -> tuple[str, ...]:
    """The ``"KEY VALUE"`` pairs of the override list ``opts`` that set a ``MODEL.*`` key (the norms'
    hyper-parameters, the architecture, the initial weights), but for
    :data:`MODEL_KEYS_OF_THE_MACHINE`: a cell with any is another model than its config file's, so
    the report gives it no paper number."""
    return tuple(f"{key} {value}" for key, value in zip(opts[::2], opts[1::2], strict=False)
                 if key.startswith("MODEL.") and key not in MODEL_KEYS_OF_THE_MACHINE)


def seed_opts(seed: int) -> tuple[str, ...]:
    return ("SEED", str(seed))


def study_cells(
    study: str,
    specs: Sequence[RunSpec],
    base_configs: Sequence[CfgNode],
    seeds: Sequence[int] | None = None,
    batch_sizes: Sequence[int] | None = None,
) -> list[Cell]:
    """The cells of ``study`` over ``specs`` (``base_configs[i]`` is ``specs[i]`` resolved with
    the common overrides; it gives the batch size and the schedule to scale).

    ``paper`` and ``heads``: every spec at its own batch size, seed-major (all norms of seed 0 first);
    ``batch-sweep``: every spec at every batch size, batch-major; ``custom``: every spec at every
    seed in ``seeds``, or once at its config's own seed when ``seeds`` is ``None``.
    """
    cells = []
    if study in ("paper", "heads"):
        for seed in seeds if seeds is not None else DEFAULT_SEEDS[study]:
            for spec, cfg in zip(specs, base_configs, strict=True):
                batch = int(cfg.SOLVER.IMS_PER_BATCH)
                cells.append(Cell(cell_name(spec.name, batch, seed), spec.name, spec.config_file,
                                  (*spec.opts, *seed_opts(seed)), seed, batch))
    elif study == "batch-sweep":
        for batch in batch_sizes or DEFAULT_BATCH_SIZES:
            for seed in seeds if seeds is not None else DEFAULT_SEEDS["batch-sweep"]:
                for spec, cfg in zip(specs, base_configs, strict=True):
                    cells.append(Cell(cell_name(spec.name, batch, seed), spec.name, spec.config_file,
                                      (*spec.opts, *batch_scaling_opts(cfg, batch), *seed_opts(seed)),
                                      seed, batch))
    elif study == "custom":
        for spec, cfg in zip(specs, base_configs, strict=True):
            batch = int(cfg.SOLVER.IMS_PER_BATCH)
            if seeds is None:
                if int(cfg.SEED) < 0:  # detectron2 draws a seed of its own for each run: no pairs, no repeats
                    raise GwdetValueError(
                        f"Run {spec.name!r} ({spec.config_file}) has SEED {cfg.SEED}, so each of its runs would draw "
                        "a random seed that the report cannot pair with the other configurations' or repeat. Give "
                        "the seeds: --seeds 0 1 2.")
                cells.append(Cell(spec.name, spec.name, spec.config_file, spec.opts, int(cfg.SEED), batch))
            else:
                cells += [Cell(f"{spec.name}-s{seed}", spec.name, spec.config_file,
                               (*spec.opts, *seed_opts(seed)), seed, batch) for seed in seeds]
    else:
        raise GwdetValueError(f"Unknown study {study!r}; choose one of {', '.join(STUDIES)}.")
    check_unique_names(cells)
    return cells


def belongs_to_study(cell: Cell, study: str) -> bool:
    """Whether ``cell`` is one the named ``study`` makes (:func:`study_cells`): one of the study's
    groups, named ``<group>-b<images>-s<seed>``, from the study's config file of that group (of any
    dataset), and for ``paper`` and ``heads`` at that config's own batch size (its only override
    the seed)."""
    if cell.group not in STUDY_GROUPS[study] or cell.name != cell_name(cell.group, cell.batch_size, cell.seed):
        return False
    config = Path(cell.config_file).as_posix()
    files = [pattern.format(group=cell.group) for pattern in CONFIG_PATTERNS.values()]
    if not any(config == file or config.endswith("/" + file) for file in files):
        return False
    if study == "batch-sweep":
        return tuple(cell.opts[-2:]) == seed_opts(cell.seed)
    return tuple(cell.opts) == seed_opts(cell.seed)


def parse_config_item(item: str) -> RunSpec:
    """``"NAME=path.yaml"``, or ``"path.yaml"`` named after the file (without ``.yaml``). An item
    holding ``=`` is a config path, named after the file, when the part before the first ``=`` holds
    a path separator (a folder in the path, not a NAME), or when no file is at the part after it and
    the whole item is a file (a config whose name holds ``=``); a name so derived that no run can
    take is refused, with the NAME=CONFIG to give."""
    name, sep, path = item.partition("=")
    as_path = not sep or "/" in name or os.sep in name or (not os.path.exists(path) and os.path.isfile(item))
    if as_path:
        name, path = Path(item).stem, item
        if sep and not _NAME.match(name):
            raise GwdetValueError(
                f"{item!r} is read as a config file, and its file name gives the run name {name!r}, which a run cannot "
                "take (it names a folder: ASCII letters, digits and _ . + -). Name the run yourself with NAME=CONFIG, "
                f"e.g. mine={item}.")
    if not name.strip() or not path.strip():
        raise GwdetValueError(f"{item!r}: give NAME=CONFIG, a name and a config file, e.g. "
                              "gw=configs/Study/gw.yaml (or the config file alone, named after it).")
    return RunSpec(name, path)


def parse_extra(tokens: Sequence[str]) -> RunSpec:
    """``["NAME=CONFIG", KEY, VALUE, ...]``: a run with overrides of its own, e.g. a BGN run

    ``bgn=configs/Study/bn.yaml MODEL.RESNETS.NORM BGN``.
    """
    if not tokens or "=" not in tokens[0]:
        raise GwdetValueError(f"--extra takes NAME=CONFIG [KEY VALUE ...], got {list(tokens)}")
    if len(tokens[1:]) % 2:
        raise GwdetValueError(f"--extra {tokens[0]}: overrides must be KEY VALUE pairs, got {list(tokens[1:])}")
    spec = parse_config_item(tokens[0])
    return RunSpec(spec.name, spec.config_file, tuple(tokens[1:]))


def check_no_repeats(flag: str, values: Sequence[int] | None) -> None:
    """``ValueError`` naming ``flag`` and each value it gives more than once: every value makes cells
    of its own, named after it, so a repeated one would make the same cells twice."""
    repeated = [value for value, count in Counter(values or ()).items() if count > 1]
    if repeated:
        once = " ".join(str(value) for value in dict.fromkeys(values or ()))
        raise GwdetValueError(
            f"{flag} gives {', '.join(map(str, repeated))} more than once: each value makes cells of its own, so a "
            f"repeated one would make the same cells twice. Give each value once, e.g. {flag} {once}.")


def check_unique_names(items: Iterable[Cell | RunSpec]) -> None:
    """``ValueError`` naming any name used twice (two runs cannot share a folder)."""
    seen: dict[str, str] = {}
    for item in items:
        if item.name.casefold() in seen:
            other = seen[item.name.casefold()]
            alike = "" if other == item.name else (f" ({other!r} and {item.name!r} differ in case only: one folder on "
                                                   "a disk that ignores case, one label in the report)")
            raise GwdetValueError(f"Two runs are named {item.name!r}{alike}; name them apart with NAME=CONFIG.")
        seen[item.name.casefold()] = item.name
