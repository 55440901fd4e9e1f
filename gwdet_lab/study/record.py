"""Each cell's full resolved config, recorded before it trains, and the check against it.

A study spans days; its config files, the common ``--opts`` or gwdet's defaults may change in
between. Before anything trains, every cell of the study gets ``study_cell.json`` in its folder:
the cell, the config file and overrides it came from, and the complete config they resolve to
(``CfgNode.dump()``, every key and default). Later invocations, and the worker process before it
trains, resolve the cell again and compare the full dumps key by key:

* identical: the folder is the cell's; finished work is kept, interrupted work resumes;
* different: the study stops before training anything and lists the keys that differ with both
  values (``on_mismatch="refuse"``, the default), or the cell goes to the first free or matching
  folder ``<name>.2``, ``<name>.3``, ... (``on_mismatch="new-folder"``).

Datasets given with ``--register-coco`` are recorded by their files: the JSON's and the image
folder's paths and the JSON's SHA-256 (:func:`dataset_files`). A later invocation whose dataset
of the same name points at other files, or whose JSON changed, is a mismatch like a config key.
The record also names, for the reader, the package versions and every dataset's annotation file
with its SHA-256 (``environment``: :func:`gwdet.engine.run_environment.run_environment`, as each
run's ``results.json`` does); those are not compared.

A folder with training output but no record (made by an older version of the tool, or by hand)
cannot be checked and counts as a mismatch. Keys ignored by the comparison: ``OUTPUT_DIR`` (it is
the folder) and ``DATASETS.SHAPES.ROOT`` (where the dataset cache lives; its contents are keyed
by every generator parameter, see :mod:`gwdet.data.shapes`).
"""
from __future__ import annotations

import datetime
import functools
import itertools
import os
import subprocess
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Callable, Collection, Mapping, Sequence

import yaml
from detectron2.config import CfgNode

from gwdet.checkpoint.resilient import absolute_weights_path
from gwdet.errors import GwdetError, GwdetFileExistsError, GwdetValueError, listed
from gwdet.data import prepare_datasets
from gwdet.data.coco_registration import environment_datasets
from gwdet.data.datasets import config_dataset_names
from gwdet.engine.run_environment import run_environment
from gwdet.utils.atomic import CHECKSUM_SUFFIX, cached_sha256
from gwdet.model_zoo import build_config
from gwdet.config import ABSENT
from gwdet.engine.output_dir import checkpoints_in, differing_values, holds_run, run_files
from gwdet.utils.run_file_names import CONFIG_NAME, RESULTS_JSON
from gwdet_lab.study.cells import CONFIG_PATTERNS, GROUP_LABELS, MAX_FOLDER_VERSIONS, Cell
from gwdet_lab.study.run_folder import RECORD_JSON, STUDY_RUN_JSON, RunFolder

IGNORED_KEYS = ("OUTPUT_DIR", "DATASETS.SHAPES.ROOT")
ON_MISMATCH = ("refuse", "new-folder")
SNAPSHOT_FILE = "SNAPSHOT.txt"


class ConfigMismatch(GwdetError, ValueError):
    """A cell's requested config differs from what its folder recorded."""


@dataclass(frozen=True)
class PlannedCell:
    """A cell, the full override list it trains with, its resolved config, and its folder."""

    cell: Cell
    opts: tuple[str, ...]
    cfg: CfgNode
    folder: RunFolder

    @property
    def max_iter(self) -> int:
        return int(self.cfg.SOLVER.MAX_ITER)

    @property
    def images(self) -> int:
        """Images the cell trains on: iterations x images per batch."""
        return self.max_iter * int(self.cfg.SOLVER.IMS_PER_BATCH)


def comparable_dump(cfg: CfgNode) -> str:
    """``cfg.dump()`` with the :data:`IGNORED_KEYS` blanked."""
    cfg = cfg.clone()
    cfg.defrost()
    for key in IGNORED_KEYS:
        node = cfg
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.get(part) if isinstance(node, CfgNode) else None
        if isinstance(node, CfgNode) and leaf in node:
            node[leaf] = ""
    return cfg.dump()


def config_differences(recorded: str, requested: str) -> list[str]:
    """One line per key whose value differs between two dumps (a key only one side has included)."""
    lines = []
    for key, old, new in differing_values(yaml.safe_load(recorded) or {}, yaml.safe_load(requested) or {}):
        if new is ABSENT:
            lines.append(f"{key}: recorded {old!r}, requested config has no such key")
        elif old is ABSENT:
            lines.append(f"{key}: requested {new!r}, the record has no such key")
        else:
            lines.append(f"{key}: recorded {old!r}, requested {new!r}")
    return lines


def resolve(cell: Cell, folder: RunFolder, common_opts: Sequence[str] = ()) -> tuple[tuple[str, ...], CfgNode]:
    """The cell's full overrides (common ones, then the cell's, which win, then ``OUTPUT_DIR``)
    and the config they give. A bad key or value raises ``ValueError`` naming the cell."""
    opts = (*common_opts, *cell.opts, "OUTPUT_DIR", str(folder.path))
    try:
        cfg = build_config(cell.config_file, list(opts))
    except (AssertionError, KeyError, ValueError) as error:  # yacs asserts on unknown keys
        raise GwdetValueError(f"Run {cell.name!r} ({cell.config_file}): {error}") from error
    return opts, cfg


def read_record(folder: RunFolder) -> dict | None:
    """The folder's ``study_cell.json`` (``None`` when there is none); a record without the fields
    this version reads and writes (``cell`` with :class:`Cell`'s fields, ``opts``, ``config``) is
    refused as one written by another version of gwdet."""
    record = folder.read_json(RECORD_JSON)
    if not record:
        return None
    cell = record.get("cell")
    expected = {field.name for field in fields(Cell)}
    problems = [f"no {key!r}" for key in ("cell", "opts", "config") if key not in record]
    if isinstance(cell, dict):
        problems += [f"cell without {key!r}" for key in sorted(expected - set(cell))]
        problems += [f"cell with {key!r}, which this version does not know" for key in sorted(set(cell) - expected)]
    elif "cell" in record:
        problems.append("'cell' is not a mapping")
    if problems:
        raise GwdetValueError(
            f"{folder.file(RECORD_JSON)} is not a cell record of this version of gwdet ({'; '.join(problems)}): "
            "another version wrote it. Report it with the gwdet that trained the cell (the record's 'code' names "
            "it), or move the folder aside to train the cell again.")
    return record


def dataset_files(cfg: CfgNode) -> dict[str, dict[str, str]]:
    """The ``--register-coco`` datasets (``$GWDET_REGISTER_COCO``) among ``cfg``'s
    ``DATASETS.TRAIN`` and ``DATASETS.TEST``: name -> JSON file, image folder, JSON's SHA-256."""
    given = {dataset.name: dataset for dataset in environment_datasets()}
    files = {}
    for name in dict.fromkeys((*cfg.DATASETS.TRAIN, *cfg.DATASETS.TEST)):
        dataset = given.get(name)
        if dataset is not None:
            files[name] = {"json_file": dataset.json_file, "image_root": dataset.image_root,
                           "json_sha256": cached_sha256(dataset.json_file)}
    return files


def dataset_differences(recorded: dict, requested: dict) -> list[str]:
    """One line per dataset whose recorded files differ from the requested ones."""
    lines = []
    for name in sorted(set(recorded) | set(requested)):
        old, new = recorded.get(name), requested.get(name)
        if old is None:
            lines.append(f"dataset {name}: the record does not name its files (recorded without --register-coco)")
            continue
        if new is None:
            lines.append(f"dataset {name}: recorded with --register-coco {old.get('json_file')!r}, requested without")
            continue
        lines += [f"dataset {name}: {key} recorded {old.get(key)!r}, requested {new[key]!r}"
                  for key in ("json_file", "image_root") if old.get(key) != new[key]]
        if old.get("json_sha256") != new["json_sha256"] and old.get("json_file") == new["json_file"]:
            lines.append(f"dataset {name}: {new['json_file']} changed since the cell was recorded (SHA-256 "
                         f"{str(old.get('json_sha256'))[:12]}... then, {new['json_sha256'][:12]}... now)")
    return lines


def mismatch(folder: RunFolder, cfg: CfgNode) -> list[str]:
    """Why ``folder`` cannot hold a cell with config ``cfg`` (empty when it can)."""
    record = read_record(folder)
    if record is None:
        if folder.has_training_output():
            return [f"{folder.path} holds training output but no {RECORD_JSON}: its config is unknown"]
        return []
    return (config_differences(record["config"], comparable_dump(cfg))
            + dataset_differences(record.get("datasets", {}), dataset_files(cfg)))


def check_trained_as_recorded(planned: Sequence[PlannedCell]) -> None:
    """Refuse cells whose folder's ``config.yaml`` (the config the run trained with, written by
    ``train_net``) is not the config their record holds: a run continued or trained again by hand
    in the cell's folder (``--resume SOLVER.MAX_ITER ...``) whose results are not the cell's."""
    problems = []
    for item in planned:
        path = item.folder.file(CONFIG_NAME)
        if not path.is_file():
            continue
        recorded = item.cfg.clone()
        recorded.defrost()  # train_net writes the initial weights' path absolute
        recorded.MODEL.WEIGHTS = absolute_weights_path(recorded.MODEL.WEIGHTS)
        differences = config_differences(comparable_dump(recorded), comparable_dump(build_config(str(path))))
        if differences:
            problems.append(f"  {item.cell.name} ({path}): " + "; ".join(
                line.replace("requested", CONFIG_NAME).replace("the record has no such key", "not in the record")
                for line in differences[:6]) + (" ..." if len(differences) > 6 else ""))
    if problems:
        raise GwdetValueError(
            "The config the run trained with (its config.yaml) is not the cell's recorded config; its results are "
            "not the cell's, and nothing was written:\n" + "\n".join(problems) + "\nThe run was trained further "
            "or again outside the study. Move its folder aside (the study trains the cell again); its own results "
            "stay in its results.md.")


def write_record(planned: PlannedCell, common_opts: Sequence[str]) -> None:
    """``study_cell.json``: the cell, where its config came from, the full resolved config, and
    the code and environment it was planned with (package versions, the annotation files of its
    datasets with their SHA-256: :func:`gwdet.engine.run_environment.run_environment`; for the
    reader: only ``config`` and ``datasets`` are compared), once its datasets are registered
    (:func:`gwdet.data.prepare_datasets`)."""
    planned.folder.write_json(RECORD_JSON, {
        "cell": asdict(planned.cell),
        "common_opts": list(common_opts),
        "opts": list(planned.opts),
        "config": comparable_dump(planned.cfg),
        "datasets": dataset_files(planned.cfg),
        "recorded": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "code": code_version(),
        "environment": run_environment(config_dataset_names(planned.cfg)),
    })


def code_version() -> dict:
    """The gwdet and gwdet_lab source folders and their git commit (and whether files differ from it)."""
    import gwdet
    import gwdet_lab

    root = Path(gwdet.__file__).resolve().parents[1]
    version = {"gwdet": str(Path(gwdet.__file__).resolve().parent),
               "gwdet_lab": str(Path(gwdet_lab.__file__).resolve().parent)}
    def git(*arguments: str) -> str | None:
        try:
            done = subprocess.run(["git", *arguments], cwd=root, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    # Only when the code's folder is a repository's root (a copy inside another repository's
    # ignored folder would otherwise report that repository's commit).
    top = git("rev-parse", "--show-toplevel")
    if top and Path(top).resolve() == root:
        version["git_commit"] = git("rev-parse", "HEAD")
        version["uncommitted_changes"] = bool(git("status", "--porcelain", "--", "gwdet", "gwdet_lab", "configs"))
    snapshot = root / SNAPSHOT_FILE  # a copy of the tree made for a long study says what it copied
    if snapshot.is_file():
        version["snapshot"] = snapshot.read_text().strip()
    return version


def code_label(version: dict) -> str:
    """A short name of the code :func:`code_version` describes: its commit (and whether files
    differed from it), else the snapshot it was copied from, else its folder."""
    commit = version.get("git_commit")
    if commit:
        return commit[:12] + (" with uncommitted changes" if version.get("uncommitted_changes") else "")
    return str(version.get("snapshot") or version.get("gwdet", "unknown"))


@functools.cache
def running_code_label() -> str:
    """:func:`code_label` of the code this process runs."""
    return code_label(code_version())


def write_usage(folder: RunFolder, earlier: dict, seconds: float, peak_mb: float) -> None:
    """The cell's ``study_run.json``: ``earlier`` (what the file held when this invocation started)
    plus this invocation's wall ``seconds``, the larger peak memory, and the code that ran it
    (``code``: each version once, in order, so that a cell resumed after the code changed says so)."""
    folder.write_json(STUDY_RUN_JSON, {
        "peak_rss_mb": max(peak_mb, earlier.get("peak_rss_mb", 0.0)),
        "wall_seconds": seconds + earlier.get("wall_seconds", 0.0),
        "sessions": 1 + earlier.get("sessions", 0),
        "code": list(dict.fromkeys([*earlier.get("code", []), running_code_label()])),
    })


def common_overrides_note(planned: Sequence[PlannedCell], given: Sequence[str]) -> str | None:
    """The report's note of the overrides every cell trained with: ``given`` (the study's command
    line's), else the ``common_opts`` of the cells' records where they are one list (a report from
    records); ``None`` without any."""
    common = tuple(given)
    if not common:
        recorded = {tuple((read_record(p.folder) or {}).get("common_opts") or ()) for p in planned}
        common = next(iter(recorded)) if len(recorded) == 1 else ()
    return f"Common overrides of every cell: {' '.join(common)}." if common else None


def code_note(planned: Sequence[PlannedCell]) -> str | None:
    """A report note naming the cells run by more than one version of the code, or by another
    version than the one their record was planned with (``None`` when there is none)."""
    lines = []
    for item in planned:
        record, ran = read_record(item.folder) or {}, item.folder.read_json(STUDY_RUN_JSON).get("code", [])
        planned_with = code_label(record.get("code", {}))
        if len(ran) > 1 or (ran and ran[0] != planned_with):
            lines.append(f"{item.cell.name} (planned with {planned_with}; run with {', '.join(ran)})")
    if not lines:
        return None
    return "Cells run by another version of the code than planned, or by several: " + "; ".join(lines) + "."


def check_seeds_of_one_configuration_alike(planned: Sequence[PlannedCell]) -> None:
    """Refuse cells that the report would average as seeds of one configuration (one group at one
    batch size) whose configs differ in more than the seed (a cell of a shorter check study
    exported among a long study's records): their mean and paired tests would mix two trainings."""
    trees = {item.cell.name: yaml.safe_load(comparable_dump(item.cfg)) or {} for item in planned}
    for first, second in itertools.combinations(planned, 2):
        a, b = first.cell, second.cell
        if (a.group, a.batch_size) != (b.group, b.batch_size):
            continue
        differing = [f"{key} ({one!r} in {a.name}, {other!r} in {b.name})"
                     for key, one, other in differing_values(trees[a.name], trees[b.name]) if key != "SEED"]
        if differing:
            raise GwdetValueError(
                f"Cells {a.name} and {b.name} are seeds of one configuration ({a.label} at {a.batch_size} images) in "
                f"the report, but their configs differ in more than the seed: {'; '.join(differing[:3])}"
                f"{'; ...' if len(differing) > 3 else ''}. Their mean and paired tests would mix two trainings; "
                "nothing was written. Report them apart (--only, or records folders of one study each).")


def _segments(item: PlannedCell) -> list:
    """The stretches a finished cell's training ran in (results.json's ``environment.segments``:
    ``from_iteration``, threads, ...; empty for a cell trained in one go)."""
    return item.folder.read_json(RESULTS_JSON).get("environment", {}).get("segments", [])


def _changed_between_stretches(planned: Sequence[PlannedCell], key: str) -> str | None:
    """The cells whose training ran in stretches with other values of ``key`` (results.json's
    ``environment.segments``: a cell stopped and resumed with another setting), each as
    ``"gw-s0 (1, then 2)"``, joined by ``"; "`` (``None`` when there is none)."""
    lines = []
    for item in planned:
        values = list(dict.fromkeys(segment.get(key) for segment in _segments(item) if isinstance(segment, dict)))
        if len(values) > 1:
            lines.append(f"{item.cell.name} ({', then '.join(map(str, values))})")
    return "; ".join(lines) or None


def threads_note(planned: Sequence[PlannedCell]) -> str | None:
    """A report note naming the cells whose training ran in stretches with other thread counts
    (a cell stopped and resumed with another ``--threads``: its results.json's
    ``environment.segments``): on a CPU the thread count changes the sums' order, so their weights
    differ from an uninterrupted run's (``None`` when there is none)."""
    cells = _changed_between_stretches(planned, "threads")
    if cells is None:
        return None
    return ("Cells resumed with another thread count than they started with: " + cells + ". A CPU sums "
            "in another order with other threads, so their weights differ from those of a run with one count.")


def processes_note(planned: Sequence[PlannedCell]) -> str | None:
    """A report note naming the cells whose training ran in stretches with other process counts
    (a cell stopped and resumed with another ``--num-gpus``: results.json's ``environment.segments``):
    the gradients are summed over another number of processes, and each process draws its own
    images, so their weights differ from an uninterrupted run's (``None`` when there is none)."""
    cells = _changed_between_stretches(planned, "processes")
    if cells is None:
        return None
    return ("Cells resumed with another process count (--num-gpus) than they started with: " + cells + ". "
            "Gradients are summed over other processes in another order, so their weights differ from those of "
            "a run with one count.")


def _cells_apart(by_value: Mapping[str, list[str]]) -> str | None:
    """``"gw-s0, gn-s0 (value); gw-s2 (other value)"`` for cells grouped by a value that should be
    one for every cell of a report, ``None`` when there is one value (or none)."""
    if len(by_value) < 2:
        return None
    return "; ".join(f"{listed(names, 4)} ({value})" for value, names in by_value.items())


def code_versions_note(planned: Sequence[PlannedCell]) -> str | None:
    """A report note naming the cells run by other versions of the code than other cells (the
    versions ``study_run.json`` lists, else the one the cell's record was planned with): seeds of
    one configuration trained by two versions are pooled in its mean, and cells of two versions
    compared (``None`` when every cell ran one version)."""
    by_code: dict[str, list[str]] = {}
    for item in planned:
        ran = item.folder.read_json(STUDY_RUN_JSON).get("code") or [code_label((read_record(item.folder) or {})
                                                                                .get("code", {}))]
        by_code.setdefault(", then ".join(ran), []).append(item.cell.name)
    cells = _cells_apart(by_code)
    if cells is None:
        return None
    return (f"Cells run by other versions of the code than others: {cells}. The means and comparisons over them mix "
            "the versions; a change of the code between them may change their numbers.")


def _cells_by_environment(planned: Sequence[PlannedCell], label: Callable[[dict], str | None]) -> str | None:
    """The cells grouped by what ``label`` reads from their results.json's ``environment`` and
    from that of each stretch of a resumed cell (``"a then b"`` where they differ), as
    :func:`_cells_apart` lists them; ``None`` when every cell has one label (or none has any)."""
    grouped: dict[str, list[str]] = {}
    for item in planned:
        environment = item.folder.read_json(RESULTS_JSON).get("environment", {})  # as _segments reads it
        stretches = [segment for segment in environment.get("segments", []) if isinstance(segment, dict)]
        found = list(dict.fromkeys(text for text in map(label, (environment, *stretches)) if text is not None))
        if found:
            grouped.setdefault(" then ".join(found), []).append(item.cell.name)
    return _cells_apart(grouped)


def _machine_label(environment: dict) -> str | None:
    """The torch version and CPU capability (the vector instructions torch's CPU kernels use) a
    run's ``environment`` records, ``None`` where it records them not."""
    versions, cpu = environment.get("versions"), environment.get("cpu")
    if not isinstance(versions, dict) or not isinstance(cpu, dict):
        return None
    return f"torch {versions.get('torch')}, CPU capability {cpu.get('torch_capability')}"


def machine_note(planned: Sequence[PlannedCell]) -> str | None:
    """A report note naming the cells trained with other torch versions or CPU capabilities than
    other cells (:func:`_machine_label`): other kernels sum in another order, so their weights
    differ (``None`` when every cell ran with one, or none recorded them)."""
    cells = _cells_by_environment(planned, _machine_label)
    if cells is None:
        return None
    return (f"Cells trained with other torch versions or CPU capabilities than others: {cells}. Other kernels sum in "
            "another order, so their weights differ, and means over them mix the machines.")


def _plan_label(environment: dict) -> str | None:
    """The GW/BW execution plans a run's ``environment`` records (``execution_plans``) as a note
    names them: ``"cpu plan 'cpu', cuda plan 'triton'"``, and the ``GWDET_GW_PLAN`` value that
    forced them."""
    plans = environment.get("execution_plans")
    if not isinstance(plans, dict):
        return None
    label = f"cpu plan {plans.get('cpu')!r}, cuda plan {plans.get('cuda')!r}"
    return label + (f", forced by GWDET_GW_PLAN={plans['forced']}" if plans.get("forced") else "")


def plans_note(planned: Sequence[PlannedCell]) -> str | None:
    """A report note naming the cells trained under other GW/BW execution plans than the others
    (:func:`_plan_label`): another plan computes the whitening with other operations, so its
    weights differ in their last bits and beyond (``None`` when every cell ran under one)."""
    groups = _cells_by_environment(planned, _plan_label)
    if groups is None:
        return None
    return (f"Cells trained under other GW execution plans than others: {groups}. Another plan computes GW and BW "
            "with other operations, so their weights differ, and means over them mix the plans.")


# The iterations detectron2's logged losses are medians over (its writers' window)
LOSS_WINDOW = 20


def resumed_loss_note(planned: Sequence[PlannedCell]) -> str | None:
    """A report note naming the cells resumed within their last :data:`LOSS_WINDOW` iterations
    (results.json's ``environment.segments``): the final loss detectron2 logs is a median over the
    iterations of the process, so theirs covers fewer iterations than an uninterrupted run's
    (``None`` when there is none)."""
    lines = []
    for item in planned:
        segments = _segments(item)
        start = segments[-1].get("from_iteration") if segments and isinstance(segments[-1], dict) else None
        if len(segments) > 1 and isinstance(start, int) and int(item.cfg.SOLVER.MAX_ITER) - start < LOSS_WINDOW:
            lines.append(f"{item.cell.name} (its last {int(item.cfg.SOLVER.MAX_ITER) - start})")
    if not lines:
        return None
    return (f"Final losses are detectron2's medians over the last {LOSS_WINDOW} iterations a process trained; for "
            "cells resumed near their end they cover only the iterations since the resume: " + "; ".join(lines) + ".")


def is_norm_key(key: str) -> bool:
    """Whether the config key ``key`` chooses or sets the norm layers (what a study's configurations
    are meant to differ in)."""
    return (key.endswith(".NORM") or key in ("MODEL.RESNETS.GW_POSITIONS", "MODEL.STRICT_NORM_GROUPS")
            or key.startswith(("MODEL.GW.", "MODEL.BW.", "MODEL.BGN.", "MODEL.GN.")))


def confounded_note(planned: Sequence[PlannedCell], shown: int = 4) -> str | None:
    """A report note naming the values other than the norms (:func:`is_norm_key`) in which cells
    that the report compares (other configurations at the same batch size and seed) differ: their
    differences are not the norms' alone (``None`` when there is none)."""
    trees = {item.cell.name: yaml.safe_load(comparable_dump(item.cfg)) or {} for item in planned}
    lines: dict[str, str] = {}
    for first, second in itertools.combinations(planned, 2):
        a, b = first.cell, second.cell
        if (a.batch_size, a.seed) != (b.batch_size, b.seed) or a.group == b.group:
            continue
        for key, one, other in differing_values(trees[a.name], trees[b.name]):
            if not is_norm_key(key) and key not in lines:
                lines[key] = f"{key} ({a.name} {one!r}, {b.name} {other!r})"
    if not lines:
        return None
    listed_lines = list(lines.values())
    more = f" and {len(listed_lines) - shown} more" if len(listed_lines) > shown else ""
    return ("Cells compared at the same batch size and seed differ in more than their norms: "
            + "; ".join(listed_lines[:shown]) + more + ". Their differences mix those values with the norms'.")


# The keys that choose which norm layers sit where in the study's Faster R-CNN: what tells its
# configurations apart
NORM_CHOICES = ("MODEL.RESNETS.NORM", "MODEL.RESNETS.GW_POSITIONS", "MODEL.RESNETS.GW_NORM", "MODEL.FPN.NORM",
                "MODEL.ROI_BOX_HEAD.NORM")


def _norm_choices(cfg: CfgNode) -> dict[str, object]:
    """The values of :data:`NORM_CHOICES` in ``cfg``, by key."""
    tree = yaml.safe_load(comparable_dump(cfg)) or {}
    return {key: new for key, _, new in differing_values({}, tree) if key in NORM_CHOICES}


def check_configurations_are_what_they_are_called(planned: Sequence[PlannedCell], common_opts: Sequence[str] = ()
                                                  ) -> None:
    """Refuse cells the report would compare (other configurations at one batch size and seed)
    whose configs are the same (an override of every cell's norms): a configuration compared with
    itself under two names; and a cell named as one of gwdet's configurations (``gw``, whose row
    carries the paper's number) whose config, after every override (``common_opts`` and the cell's
    own), places other norms than that configuration's own config file does
    (:data:`~gwdet_lab.study.cells.CONFIG_PATTERNS`)."""
    choices = {item.cell.name: _norm_choices(item.cfg) for item in planned}
    dumps = {item.cell.name: comparable_dump(item.cfg) for item in planned}
    for first, second in itertools.combinations(planned, 2):
        a, b = first.cell, second.cell
        if (a.batch_size, a.seed) == (b.batch_size, b.seed) and a.group != b.group and dumps[a.name] == dumps[b.name]:
            given = f" (--opts {' '.join(common_opts)} applies to every cell)" if common_opts else ""
            raise GwdetValueError(
                f"Cells {a.name} ({a.label}) and {b.name} ({b.label}) have the same config{given}: the report would "
                "compare one configuration with itself under two names. Give each configuration what sets it apart "
                "in its own config (or its own overrides: --extra NAME=CONFIG KEY VALUE ...), not in --opts; "
                "nothing was trained.")
    for item in planned:
        own = _packaged_norm_choices(item.cell.group)
        if own is None:
            continue
        differing = {key: value for key, value in choices[item.cell.name].items() if own.get(key) != value}
        if differing:
            shown = "; ".join(f"{key}: {value!r} where {item.cell.group}'s own config has {own.get(key)!r}"
                              for key, value in sorted(differing.items())[:3])
            setters = _overrides_of(differing, (("--opts", tuple(common_opts)), ("--extra", item.cell.opts)))
            given = f", with the overrides {setters}," if setters else ""
            undo = f" (leave {', '.join(sorted(differing))} out of the overrides)" if setters else ""
            raise GwdetValueError(
                f"Cell {item.cell.name} is named {item.cell.group!r}, one of gwdet's configurations ({item.cell.label}, "
                f"whose report row carries the paper's numbers), but its config {item.cell.config_file}{given} places "
                f"other norms: {shown}. Name it by what it is (--configs NAME=CONFIG with a name of your own), or give "
                f"it the config of {item.cell.label}{undo}; nothing was trained.")


def _overrides_of(keys: Collection[str], given: Sequence[tuple[str, Sequence[str]]]) -> str:
    """The ``KEY VALUE`` pairs among ``given`` (flag, override list) that set one of ``keys``, each
    after its flag (``"--opts MODEL.FPN.NORM GN"``); empty when none does."""
    parts = []
    for flag, opts in given:
        pairs = [f"{key} {value if value else repr(value)}" for key, value in zip(opts[::2], opts[1::2], strict=True)
                 if key in keys]
        if pairs:
            parts.append(f"{flag} {' '.join(pairs)}")
    return "; ".join(parts)


@functools.lru_cache(maxsize=None)
def _packaged_norm_choices(group: str) -> dict[str, object] | None:
    """The norm choices of gwdet's own config file of the configuration ``group`` (the shapes
    study's; the COCO configs place the same norms), without any override, or None for a group
    that is not one of them."""
    if group not in GROUP_LABELS:
        return None
    config = Path(__file__).resolve().parents[2] / CONFIG_PATTERNS["shapes"].format(group=group)
    return _norm_choices(build_config(str(config)))


def plan(cells: Sequence[Cell], runs_dir: Path, common_opts: Sequence[str] = (),
         on_mismatch: str = "refuse", record: bool = True) -> list[PlannedCell]:
    """Resolve every cell, pick its folder under ``runs_dir`` and check it against the record.

    Nothing is written until every cell has passed, so a refused study leaves no trace; then
    the datasets of the cells without a record are prepared and each of them gets one (so later cells of a long study keep the config the
    study started with; ``record=False`` only checks). ``ConfigMismatch`` lists every refused
    cell with the keys that differ.
    """
    if on_mismatch not in ON_MISMATCH:
        raise ValueError(f"on_mismatch must be one of {ON_MISMATCH}, got {on_mismatch!r}")
    planned, problems = [], []
    for cell in cells:
        for version in range(1, MAX_FOLDER_VERSIONS + 1):
            folder = RunFolder(runs_dir / (cell.name if version == 1 else f"{cell.name}.{version}"))
            opts, cfg = resolve(cell, folder, common_opts)
            differences = mismatch(folder, cfg)
            if not differences or on_mismatch == "refuse":
                break
        else:
            raise ConfigMismatch(f"{cell.name}: no free folder among {MAX_FOLDER_VERSIONS} versions")
        if differences:
            problems.append((cell, folder, differences))
        planned.append(PlannedCell(cell, opts, cfg, folder))
    files = [str(p.folder.path) for p in planned if os.path.lexists(p.folder.path) and not p.folder.path.is_dir()]
    if files:
        raise GwdetFileExistsError(
            f"{listed(files, 3)}: a file (or link) is where the study keeps the cell's folder, which the study would "
            f"have to replace; nothing was written. Move it out of {runs_dir}, or give the study another --out.")
    check_configurations_are_what_they_are_called(planned, common_opts)
    if problems:
        holders = {cell.name: holder for cell, _, _ in problems
                   if (holder := folder_of_requested_config(cell, runs_dir, common_opts)) is not None}
        raise ConfigMismatch(mismatch_message(problems, holders))
    if record:
        check_no_users_run_files(planned, runs_dir)
    unrecorded = [item for item in planned if record and read_record(item.folder) is None]
    for item in unrecorded:  # the datasets every record names, generated and registered before any is written
        prepare_datasets(item.cfg)
    for item in unrecorded:
        write_record(item, common_opts)
    return planned


def users_run_files(folder: Path) -> list[str]:
    """The files of ``folder`` named as a training run's (:func:`~gwdet.engine.output_dir.run_files`)
    when nothing there shows that a run of gwdet wrote them (no recorded ``config.yaml`` or
    ``results.json``, no checkpoint): a user's own, which ``train_net`` refuses to train beside."""
    if not folder.is_dir() or not holds_run(str(folder)):
        return []
    if any((folder / (name + CHECKSUM_SUFFIX)).is_file() for name in (CONFIG_NAME, RESULTS_JSON)) or checkpoints_in(
            str(folder)):
        return []
    return run_files(str(folder))


def check_no_users_run_files(planned: Sequence[PlannedCell], runs_dir: Path) -> None:
    """Refuse, before anything is written, cells whose folder holds files named as a run's that no
    run wrote (:func:`users_run_files`): the cell's training would refuse them after the study
    recorded the cell there."""
    found = [f"{item.folder.path} holds {listed(names, 4)}" for item in planned
             if (names := users_run_files(item.folder.path))]
    if found:
        raise GwdetFileExistsError(
            f"{listed(found, 3, '; ')}, named as a training run's files, but nothing there shows that a run of gwdet "
            f"wrote them (no recorded {CONFIG_NAME} or {RESULTS_JSON}, no checkpoint), so the cell cannot train there; "
            "nothing was written. Move them out of the cell's folder, or give the study another --out.")


def folder_of_requested_config(cell: Cell, runs_dir: Path, common_opts: Sequence[str]) -> RunFolder | None:
    """The folder ``<name>.<version>`` (version 2 on) whose record holds ``cell``'s requested config
    (one an earlier ``--on-mismatch new-folder`` made), else ``None``."""
    for version in range(2, MAX_FOLDER_VERSIONS + 1):
        folder = RunFolder(runs_dir / f"{cell.name}.{version}")
        if read_record(folder) is None:
            return None
        if not mismatch(folder, resolve(cell, folder, common_opts)[1]):
            return folder
    return None


def mismatch_message(problems: Sequence[tuple[Cell, RunFolder, list[str]]], holders: Mapping[str, RunFolder],
                     shown: int = 12) -> str:
    """The refusal of cells whose folders recorded other configs; ``holders``: the folders that
    already hold a cell's requested config (by the cell's name)."""
    lines = [f"{len(problems)} run(s) differ from the config their folder recorded; nothing was trained:"]
    for cell, folder, differences in problems:
        lines.append(f"  {cell.name} ({folder.path}):")
        lines += [f"    {line}" for line in differences[:shown]]
        if len(differences) > shown:
            lines.append(f"    ... and {len(differences) - shown} more")
    added = all(line.endswith("the record has no such key") for _, _, differences in problems for line in differences)
    if added:
        runs = problems[0][1].path.parent
        lines.append("Every difference is a key this version of gwdet has and the records do not: the cells were "
                     f"recorded by an earlier version. Report the finished cells as recorded with --records {runs} "
                     "(nothing is trained), or train them again into another --out.")
    else:
        lines.append("Restore the recorded config (config files, --opts), use another --out, or pass "
                     "--on-mismatch new-folder to train the requested config into new folders "
                     "(<name>.2, ...) beside the recorded ones.")
    if holders:
        lines.append("The requested config is already in " + ", ".join(
            f"{holder.path.name} (for {name})" for name, holder in holders.items()) + ", which --on-mismatch "
            "new-folder made: pass --on-mismatch new-folder again to use those folders (what they hold is not "
            "trained again).")
    return "\n".join(lines)
