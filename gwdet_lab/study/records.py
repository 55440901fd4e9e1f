"""A study's committed records: what a report needs of each finished cell, without checkpoints.

A cell's run folder (:mod:`gwdet_lab.study.run_folder`) lives on the machine that trained it. Its
records are the files the report reads: ``study_cell.json`` (the cell and its resolved config),
``config.yaml``, the results, metrics, timing and evaluation records, ``image_bootstrap.json`` and
the detections on the report split (gzip-compressed). :func:`export_records` copies them into a
folder kept with the documentation (``docs/study/records/<study>/<cell>/``);
:func:`recorded_cells` reads such a folder back as finished cells, taking each cell's config from
its record instead of resolving it again, so that a report regenerates from the records alone.
"""
from __future__ import annotations

import errno
import gzip
import json
import math
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import yaml
from detectron2.config import CfgNode

from gwdet.errors import GwdetError, GwdetFileNotFoundError, GwdetOSError, GwdetValueError, listed
from gwdet.engine.run_environment import ENVIRONMENT_KEY
from gwdet.utils.atomic import CHECKSUM_SUFFIX, checksum_path, record_checksum
from gwdet.utils.run_file_names import (CONFIG_NAME, FINAL_WEIGHTS, INFERENCE_FOLDER, LAST_CHECKPOINT, METRICS_JSON,
                                        RESULTS_JSON, RESULTS_MARKDOWN)
from gwdet_lab.study.cells import PAPER_GROUPS, Cell
from gwdet_lab.study.evaluation import report_dataset
from gwdet_lab.study.image_bootstrap import DETECTIONS_JSON
from gwdet_lab.study.record import PlannedCell, config_differences, read_record
from gwdet_lab.study.run_folder import (
    BATCH_STATISTICS_JSON,
    COMPLETE_JSON,
    DIVERGED_JSON,
    EXAMPLE_WEIGHING_JSON,
    IMAGE_BOOTSTRAP_JSON,
    RECORD_JSON,
    STUDY_RUN_JSON,
    TIMING_JSON,
    RunFolder,
)

OVER_TRAINING_JSON = "over_training.json"  # gwdet_lab.study.over_training
RECORD_FILES = (RECORD_JSON, CONFIG_NAME, RESULTS_JSON, RESULTS_MARKDOWN, METRICS_JSON, EXAMPLE_WEIGHING_JSON,
                BATCH_STATISTICS_JSON, TIMING_JSON, STUDY_RUN_JSON, COMPLETE_JSON, IMAGE_BOOTSTRAP_JSON,
                DIVERGED_JSON, OVER_TRAINING_JSON)


class RecordsIncomplete(GwdetError, ValueError):
    """A records folder names a cell that did not finish every evaluation the report needs."""


def missing_record_files(planned: PlannedCell) -> list[str]:
    """The records a report reads that the cell's folder lacks: ``study_complete.json`` (written
    once the cell finished), and but for a diverged cell ``results.json`` and ``metrics.json``
    (its final loss and loss curve); an export or copy cut short leaves some out."""
    folder = planned.folder
    needed = (COMPLETE_JSON,) if folder.diverged() else (RESULTS_JSON, METRICS_JSON, COMPLETE_JSON)
    return [name for name in needed if not folder.file(name).is_file()]


def _result_values(path: Path) -> dict[tuple[str, str, str], float] | None:
    """The APs of the ``results.json`` at ``path``: (dataset, task, metric) -> value (``null`` read as
    NaN; the run's environment left out); ``None`` when there is no such file or it cannot be read
    as results."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    values: dict[tuple[str, str, str], float] = {}
    for dataset, tasks in data.items():
        if dataset == ENVIRONMENT_KEY or not isinstance(tasks, dict):
            continue
        for task, metrics in tasks.items():
            if isinstance(metrics, dict):
                for metric, value in metrics.items():
                    number = math.nan if value is None else value
                    values[(dataset, task, metric)] = number if isinstance(number, (int, float)) else math.nan
    return values


def _same_value(first: float | None, second: float | None) -> bool:
    if first is None or second is None:
        return first is second
    return first == second or (math.isnan(first) and math.isnan(second))


def _shown_value(value: float | None) -> str:
    return "none" if value is None else "nan" if math.isnan(value) else f"{value:.2f}"


def differing_results(planned: Sequence[PlannedCell], destination: Path) -> list[str]:
    """The cells among ``planned`` whose records in ``destination/<cell>/`` (an earlier export, a
    record of ``study_cell.json`` there) hold other results than the cell's own: its ``results.json``
    with other APs, or one that cannot be read, or results where the cell has none; each as
    ``cell (dataset task metric kept -> exported)`` naming the first value that differs, and how many
    more do. Cells whose kept results are the exported ones, or that have none kept, are not listed."""
    found = []
    for item in planned:
        kept_path = destination / item.cell.name / RESULTS_JSON
        if not (destination / item.cell.name / RECORD_JSON).is_file() or not kept_path.is_file():
            continue
        kept = _result_values(kept_path)
        exported_path = item.folder.file(RESULTS_JSON)
        exported = _result_values(exported_path) if exported_path.is_file() else {}
        if kept is None:
            found.append(f"{item.cell.name} ({kept_path} cannot be read as results)")
            continue
        exported = exported or {}
        keys = list(dict.fromkeys([*kept, *exported]))
        changed = [key for key in keys if not _same_value(kept.get(key), exported.get(key))]
        if not changed:
            continue
        first = changed[0]
        more = f" and {len(changed) - 1} more value(s)" if len(changed) > 1 else ""
        found.append(f"{item.cell.name} ({' '.join(first)} {_shown_value(kept.get(first))} -> "
                     f"{_shown_value(exported.get(first))}{more})")
    return found


def export_records(planned: Sequence[PlannedCell], destination: Path, overwrite: bool = False) -> list[Path]:
    """Copy the records of the finished cells ``planned`` into ``destination/<cell>/`` (each file
    with its ``.sha256``, recorded for a json record whose run folder lacks it; the report split's detections as
    ``.json.gz``); returns the cell folders written. In a cell folder already there, the record
    files are replaced and anything else is kept; a destination that is where the records are read
    from, that holds a record of the cell with another config, or whose cell folder holds files
    named as records but no ``study_cell.json`` (files no export wrote), is refused before anything
    is written; so is one holding records of the cell with the same config but other results
    (:func:`differing_results`: another run of it), unless ``overwrite``."""
    for item in planned:
        if (destination / item.cell.name).resolve() == item.folder.path.resolve():
            raise GwdetValueError(
                f"--export-records {destination}: the records of {item.cell.name} are read from there "
                f"({item.folder.path}), so exporting would replace them with themselves; nothing was copied. Give "
                "another folder (e.g. docs/study/records/<study>).")
    files = [item.cell.name for item in planned
             if (destination / item.cell.name).exists() and not (destination / item.cell.name).is_dir()]
    if files:
        raise GwdetValueError(f"--export-records {destination} holds a file named like the cell {files[0]}, where its "
                              "records go into a folder of that name; nothing was copied. Move the file away, or "
                              "export into another folder.")
    foreign = []
    for item in planned:
        target = destination / item.cell.name
        if target.is_dir() and not (target / RECORD_JSON).is_file():
            names = [name for record in RECORD_FILES for name in (record, Path(checksum_path(record)).name)
                     if (target / name).is_file() or (target / name).is_symlink()]
            names += [f"{INFERENCE_FOLDER}/"] * (target / INFERENCE_FOLDER).exists()
            if names:
                foreign.append(f"{target} ({', '.join(names)})")
    if foreign:
        raise GwdetValueError(
            f"--export-records {destination}: a cell's folder there holds files named as the records an export "
            f"copies, but no {RECORD_JSON}, so no export wrote them: {listed(foreign, 4, '; ')}; exporting would "
            "replace them; nothing was copied. Move those files away, or export into another folder.")
    other = []
    for item in planned:
        kept = read_record(RunFolder(destination / item.cell.name)) if (destination / item.cell.name).is_dir() else None
        exported = read_record(item.folder)
        if kept is not None and exported is not None:
            differences = config_differences(kept["config"], exported["config"])
            if differences:
                first = differences[0].replace("requested", "exported")
                other.append(f"{item.cell.name} ({first}{' ...' if len(differences) > 1 else ''})")
    if other:
        raise GwdetValueError(
            f"--export-records {destination} holds records of {listed(other, 4, '; ')} trained with another config "
            "than the exported cells; exporting would replace them; nothing was copied. Export into another folder, "
            "or move those records away first.")
    changed = [] if overwrite else differing_results(planned, destination)
    if changed:
        raise GwdetValueError(
            f"--export-records {destination} holds records of {listed(changed, 4, '; ')} with the same config but "
            "other results than the exported cells (another run of them); exporting would replace them; nothing was "
            "copied. Pass --overwrite to replace them with the exported records, export into another folder, or move "
            "those records away first.")
    written = []
    for item in planned:
        try:
            written.append(_export_cell(item, destination / item.cell.name))
        except OSError as error:  # a full disk: the cell's records there are cut short
            raise GwdetOSError(
                f"--export-records {destination}: copying the records of {item.cell.name} failed "
                f"({error.strerror or error}: {error.filename or 'a file'}); those there may be incomplete, and "
                f"{len(written)} cell(s) were copied before it. Free space (or fix what the error names) and export "
                "again.") from error
    return written


def _export_cell(item: PlannedCell, target: Path) -> Path:
    """Copy the records of the finished cell ``item`` into ``target`` (:func:`export_records`)."""
    source = item.folder.path
    target.mkdir(parents=True, exist_ok=True)
    for name in RECORD_FILES:
        for stale in (target / name, Path(checksum_path(str(target / name)))):
            stale.unlink(missing_ok=True)  # a record this cell no longer has does not stay beside the new ones
    shutil.rmtree(target / INFERENCE_FOLDER, ignore_errors=True)
    for name in RECORD_FILES:
        for path in (source / name, Path(checksum_path(str(source / name)))):
            if path.is_file():
                shutil.copy2(path, target / path.name)
        if name.endswith(".json") and (target / name).is_file() and not Path(checksum_path(str(target / name))).is_file():
            # read unchecked in the run folder (metrics.json is appended to; a kill before a record), checked here
            record_checksum(str(target / name))
    detections = source / INFERENCE_FOLDER / report_dataset(item.cfg) / DETECTIONS_JSON
    packed = target / INFERENCE_FOLDER / report_dataset(item.cfg) / (DETECTIONS_JSON + ".gz")
    if detections.is_file():
        packed.parent.mkdir(parents=True, exist_ok=True)
        # mtime 0: the same detections give the same bytes, so re-exporting changes nothing in git
        packed.write_bytes(gzip.compress(detections.read_bytes(), mtime=0))
    elif detections.with_name(packed.name).is_file():  # records exported before
        packed.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(detections.with_name(packed.name), packed)
    return target


def recorded_cells(records_dir: Path, only: Sequence[str] | None = None, flag: str = "--records",
                   only_flag: str = "--only") -> list[PlannedCell]:
    """The cells recorded in ``records_dir`` (sub-folders holding ``study_cell.json``: a records
    folder, or a study's run folder ``<out>/runs``; ``flag`` names it in messages), optionally only
    those named in ``only`` (the flag ``only_flag``), as finished cells with the config of their record.
    An entry at any depth that looks like a cell but would not be read (:func:`_unread_cell_entries`:
    cell records below the top level, a cell folder without ``study_cell.json``, an empty folder or a
    link to nothing named like a cell) is refused, naming it and the fix, so that no cell is left
    out of a report without a word. A path that is no folder is refused: a file there as such
    (:class:`~gwdet.errors.GwdetOSError`), nothing there as a missing folder."""
    if not records_dir.is_dir():
        kept = ("a study's records are kept in docs/study/records/<study>/" if flag == "--records"
                else "a study's run folders are in <its --out>/runs/")
        if records_dir.exists():
            given = "the folder of a study's records" if flag == "--records" else "a study's folder of run folders"
            raise GwdetOSError(f"{flag} {records_dir} is a file, not a folder: give {given} ({kept}).")
        raise GwdetFileNotFoundError(f"{flag} {records_dir}: no such folder ({kept})")
    cell_folders = sorted(p for p in records_dir.iterdir() if (p / RECORD_JSON).is_file())
    # with no cell beside them, the sub-folders are looked into for the message only (a folder of studies' records)
    unread = _unread_cell_entries(records_dir, cell_folders, only, deep=bool(cell_folders))
    found = {}
    for folder in cell_folders:
        cell_folder = RunFolder(folder, records=flag == "--records")
        record = read_record(cell_folder)
        assert record is not None  # the file exists; a damaged one raises DamagedFile
        details = dict(record["cell"], opts=tuple(record["cell"]["opts"]),
                       config_file=_relative_to_checkout(record["cell"]["config_file"], record.get("code", {})))
        cell = Cell(**details)
        if cell.name in found:
            versions = [name for name in (found[cell.name].folder.path.name, folder.name)
                        if re.fullmatch(rf"{re.escape(cell.name)}\.\d+", name)]
            why = (f"{', '.join(versions)} holds the cell trained with another config, as --on-mismatch new-folder "
                   "names it" if versions else "a copy kept beside the record?")
            raise GwdetValueError(
                f"{flag} {records_dir}: two records of the cell {cell.name}, {found[cell.name].folder.path.name}/ "
                f"and {folder.name}/ ({why}); the report would show one of them. Move the one you do not mean out of "
                "the folder (or export the records of the one you mean: --export-records); nothing was written.")
        cfg = CfgNode(yaml.safe_load(record["config"]) or {})
        found[cell.name] = PlannedCell(cell, tuple(record["opts"]), cfg, cell_folder)
    if not found:
        nested = _cells_below(unread)
        one = (f": it is the record of one cell itself; give the folder that holds it, {flag} {records_dir.parent} "
               f"{only_flag} {records_dir.name}" if (records_dir / RECORD_JSON).is_file() else "")
        beside = [entry for entry in unread if entry.kind != "nested" and len(entry.path.parts) == 1]
        if beside and not one:
            clauses, fixes = _unread_clauses(records_dir, beside)
            one = f"; {clauses}. {fixes}"
        if nested and not one:
            one = (f"; its sub-folders {listed([f'{sub}/' for sub in nested], 4)} hold cell records: give one of "
                   f"them, e.g. {flag} {records_dir / next(iter(nested))}")
        if not one:
            one = (": give the folder of a study's records (kept in docs/study/records/<study>/), or one that "
                   "--export-records wrote")
        raise GwdetFileNotFoundError(f"{flag} {records_dir}: no cell records in it (folders with {RECORD_JSON}){one}")
    if unread:
        clauses, fixes = _unread_clauses(records_dir, unread)
        raise GwdetValueError(f"{flag} {records_dir}: {clauses}: the report would leave those cells out. {fixes}; "
                              "nothing was written.")
    if only:
        unknown = sorted(set(only) - set(found))
        if unknown:
            raise GwdetValueError(f"{only_flag}: no record of {', '.join(unknown)} in {records_dir}; recorded: "
                                  + ", ".join(found))
        found = {name: found[name] for name in only}
    groups = list(dict.fromkeys([*PAPER_GROUPS, *(p.cell.group for p in found.values())]))
    return sorted(found.values(), key=lambda p: (p.cell.batch_size, p.cell.seed, groups.index(p.cell.group)))


# The name of a cell's folder: <group>-b<images>-s<seed> in the named studies, <name>-s<seed> in a
# custom one with --seeds, each with the version suffix --on-mismatch new-folder gives (.2, .3, ...).
_CELL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*?-(?:b\d+-)?s\d+(?:\.\d+)?")
# What a cell's folder holds beside its study_cell.json, in a records folder or a run folder (not the
# config.yaml any detectron2 run writes, which alone makes no cell).
_CELL_FILES = frozenset(
    [name for name in RECORD_FILES if name not in (RECORD_JSON, CONFIG_NAME)]
    + [Path(checksum_path(name)).name for name in RECORD_FILES if name != CONFIG_NAME]
    + [INFERENCE_FOLDER, LAST_CHECKPOINT, FINAL_WEIGHTS])


@dataclass(frozen=True)
class _Unread:
    """An entry of a records folder that looks like a cell but is not read (:func:`_unread_cell_entries`):
    its ``path`` relative to the folder, the ``kind`` of problem and what to name in the message."""

    path: Path
    kind: str  # nested, no record, named, link, file, unreadable
    detail: str = ""


def _unread_cell_entries(records_dir: Path, cell_folders: Sequence[Path], only: Sequence[str] | None = None,
                         deep: bool = True) -> list[_Unread]:
    """The entries of ``records_dir``, at any depth, that look like a cell but are not read as one:
    cell records (folders with ``study_cell.json``) below the top level, but for the cell folders
    ``cell_folders`` read there (a link to one of them reads nothing twice); a folder holding a cell's
    other records but no ``study_cell.json``; a folder, file, unreadable folder or link to nothing
    named like a cell. With ``only``, those named in it alone. A read cell's folder is not looked
    into, nor a link to a folder looked into already or to one holding ``records_dir``. ``deep``
    false: the top level and the sub-folders right below it only."""
    root = records_dir.resolve()
    read = {folder.resolve() for folder in cell_folders}
    seen = {root}
    found: list[_Unread] = []

    def wanted(name: str) -> bool:
        return only is None or re.sub(r"\.\d+$", "", name) in only

    def walk(folder: Path, depth: int) -> None:
        try:
            entries = sorted(folder.iterdir())
        except OSError:  # a folder that cannot be listed and is not named like a cell
            return
        for entry in entries:
            path = entry.relative_to(records_dir)
            named = bool(_CELL_NAME.fullmatch(entry.name)) and wanted(entry.name)
            if (entry / RECORD_JSON).is_file():
                if depth and wanted(entry.name) and entry.resolve() not in read:
                    found.append(_Unread(path, "nested"))
                continue
            if entry.is_symlink() and not entry.exists():
                if named:
                    try:
                        os.stat(entry)
                        why = "which cannot be followed"
                    except OSError as error:
                        why = ("which leads back to itself" if error.errno == errno.ELOOP
                               else "which does not exist (a disk that is not mounted?)")
                    found.append(_Unread(path, "link", f"{os.readlink(entry)}, {why}"))
                continue
            if not entry.is_dir():
                if named:
                    found.append(_Unread(path, "file"))
                continue
            try:
                names = sorted(p.name + ("/" if p.is_dir() else "") for p in entry.iterdir())
            except OSError as error:
                if named:
                    found.append(_Unread(path, "unreadable", error.strerror or str(error)))
                continue
            cell_files = [name for name in names if name.rstrip("/") in _CELL_FILES]
            if cell_files:
                if wanted(entry.name):  # the records themselves named, their checksums only where nothing else is
                    shown = [name for name in cell_files if not name.endswith(CHECKSUM_SUFFIX)] or cell_files
                    found.append(_Unread(path, "no record", listed(shown, 4)))
                continue
            before = len(found)
            resolved = entry.resolve()
            if (deep or depth == 0) and resolved not in seen and not root.is_relative_to(resolved):
                seen.add(resolved)
                walk(entry, depth + 1)
            if named and len(found) == before:
                found.append(_Unread(path, "named", listed(names, 3)))

    walk(records_dir, 0)
    return found


def _cells_below(unread: Sequence[_Unread]) -> dict[Path, list[str]]:
    """The folders (relative) holding the cell records of ``unread`` found below the top level,
    each with those cells' folder names."""
    below: dict[Path, list[str]] = {}
    for entry in unread:
        if entry.kind == "nested":
            below.setdefault(entry.path.parent, []).append(entry.path.name)
    return below


_LEVELS = {1: "one level", 2: "two levels", 3: "three levels"}


def _unread_clauses(records_dir: Path, unread: Sequence[_Unread]) -> tuple[str, str]:
    """What is wrong with each entry of ``unread`` (``"; "``-separated clauses) and what to do about
    them (sentences, the last without a full stop), for the messages of :func:`recorded_cells`."""
    clauses, fixes = [], []
    below = _cells_below(unread)
    for depth in sorted({len(folder.parts) for folder in below}):
        at = {folder: cells for folder, cells in below.items() if len(folder.parts) == depth}
        shown = "; ".join(f"{folder.as_posix()}/ ({listed(cells, 3)})" for folder, cells in at.items())
        clauses.append(f"{shown} {'holds' if len(at) == 1 else 'hold'} cell records "
                       f"{_LEVELS.get(depth, f'{depth} levels')} below the others, where they are not read")
    if below:
        fixes.append(f"Move their folders up into {records_dir} beside the others, or out of it if they are not of "
                     "this report")
    by_kind: dict[str, list[_Unread]] = {}
    for entry in unread:
        by_kind.setdefault(entry.kind, []).append(entry)
    for entry in by_kind.get("no record", []):
        clauses.append(f"{entry.path.as_posix()}/ holds a cell's records ({entry.detail}) but no {RECORD_JSON}, so "
                       "it is not read (a copy or export cut short?)")
    for entry in by_kind.get("named", []):
        clauses.append(f"{entry.path.as_posix()}/ is named like a cell but "
                       + (f"holds no {RECORD_JSON} (only {entry.detail})" if entry.detail else "is empty")
                       + " (a copy that never started?)")
    for entry in by_kind.get("file", []):
        clauses.append(f"{entry.path.as_posix()} is a file named like a cell, whose records are a folder")
    missing = [entry.path.as_posix() for kind in ("no record", "named", "file") for entry in by_kind.get(kind, [])]
    if missing:
        fixes.append(f"Copy the records of {listed(missing, 4)} again (a finished study exports them with its "
                     f"command and --report-only --export-records DIR), or move {'it' if len(missing) == 1 else 'them'}"
                     f" out of {records_dir} if not of this report")
    for entry in by_kind.get("link", []):
        clauses.append(f"{entry.path.as_posix()} is a link to {entry.detail}")
    if "link" in by_kind:
        links = [entry.path.as_posix() for entry in by_kind["link"]]
        fixes.append(f"Mount or restore what {listed(links, 4)} {'points' if len(links) == 1 else 'point'} to (or "
                     f"copy the records in {'its' if len(links) == 1 else 'their'} place), or remove "
                     f"{'the link' if len(links) == 1 else 'the links'} if not of this report")
    for entry in by_kind.get("unreadable", []):
        clauses.append(f"{entry.path.as_posix()}/ is named like a cell but cannot be read ({entry.detail})")
    if "unreadable" in by_kind:
        fixes.append("Let this user read those folders (chmod, or run as their owner), or move them out of "
                     f"{records_dir} if not of this report")
    return "; ".join(clauses), ". ".join(fixes)


def _relative_to_checkout(config_file: str, code: dict) -> str:
    """``config_file`` relative to the checkout the cell was trained from (the folder holding the
    recorded ``gwdet`` package), so that the report's commands read ``configs/...`` on any machine."""
    checkout = Path(code["gwdet"]).parent if "gwdet" in code else None
    path = Path(config_file)
    if checkout is not None and path.is_relative_to(checkout):
        return str(path.relative_to(checkout))
    return config_file
