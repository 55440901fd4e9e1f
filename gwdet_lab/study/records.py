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

import gzip
import re
import shutil
from pathlib import Path
from typing import Sequence

import yaml
from detectron2.config import CfgNode

from gwdet.errors import GwdetError, GwdetFileNotFoundError, GwdetOSError, GwdetValueError, listed
from gwdet.utils.atomic import checksum_path, record_checksum
from gwdet.utils.run_file_names import CONFIG_NAME, INFERENCE_FOLDER, METRICS_JSON, RESULTS_JSON, RESULTS_MARKDOWN
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


def export_records(planned: Sequence[PlannedCell], destination: Path) -> list[Path]:
    """Copy the records of the finished cells ``planned`` into ``destination/<cell>/`` (each file
    with its ``.sha256``, recorded for a json record whose run folder lacks it; the report split's detections as
    ``.json.gz``); returns the cell folders written. In a cell folder already there, the record
    files are replaced and anything else is kept; a destination that is where the records are read
    from, or that holds a record of the cell with another config, is refused before anything is
    written."""
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
    those named in ``only`` (the flag ``only_flag``), as finished cells with the config of their record."""
    if not records_dir.is_dir():
        kept = ("a study's records are kept in docs/study/records/<study>/" if flag == "--records"
                else "a study's run folders are in <its --out>/runs/")
        raise GwdetFileNotFoundError(f"{flag} {records_dir}: no such folder ({kept})")
    nested = _records_one_level_down(records_dir, only)
    found = {}
    for folder in sorted(p for p in records_dir.iterdir() if (p / RECORD_JSON).is_file()):
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
        one = (f": it is the record of one cell itself; give the folder that holds it, {flag} {records_dir.parent} "
               f"{only_flag} {records_dir.name}" if (records_dir / RECORD_JSON).is_file() else "")
        if nested and not one:
            one = (f"; its sub-folders {listed([f'{sub.name}/' for sub in nested], 4)} hold cell records: give one of "
                   f"them, e.g. {flag} {next(iter(nested))}")
        raise GwdetFileNotFoundError(f"{flag} {records_dir}: no cell records in it (folders with {RECORD_JSON}){one}")
    if nested:
        shown = "; ".join(f"{sub.name}/ ({listed(cells, 3)})" for sub, cells in nested.items())
        raise GwdetValueError(
            f"{flag} {records_dir}: {shown} {'holds' if len(nested) == 1 else 'hold'} cell records one level below "
            f"the others, where they are not read: the report would leave those cells out. Move their folders up "
            f"into {records_dir} beside the others, or out of it if they are not of this report; nothing was written.")
    if only:
        unknown = sorted(set(only) - set(found))
        if unknown:
            raise GwdetValueError(f"{only_flag}: no record of {', '.join(unknown)} in {records_dir}; recorded: "
                                  + ", ".join(found))
        found = {name: found[name] for name in only}
    groups = list(dict.fromkeys([*PAPER_GROUPS, *(p.cell.group for p in found.values())]))
    return sorted(found.values(), key=lambda p: (p.cell.batch_size, p.cell.seed, groups.index(p.cell.group)))


def _records_one_level_down(records_dir: Path, only: Sequence[str] | None = None) -> dict[Path, list[str]]:
    """The sub-folders of ``records_dir`` that are no cell record themselves but hold cell records
    (folders with ``study_cell.json``) in folders of their own, each with those folders' names
    (with ``only``: those named in it); a sub-folder that cannot be read is passed over."""
    nested = {}
    for sub in sorted(p for p in records_dir.iterdir() if p.is_dir() and not (p / RECORD_JSON).is_file()):
        try:
            cells = sorted(p.name for p in sub.iterdir() if (p / RECORD_JSON).is_file())
        except OSError:
            continue
        cells = [name for name in cells if only is None or name in only]
        if cells:
            nested[sub] = cells
    return nested


def _relative_to_checkout(config_file: str, code: dict) -> str:
    """``config_file`` relative to the checkout the cell was trained from (the folder holding the
    recorded ``gwdet`` package), so that the report's commands read ``configs/...`` on any machine."""
    checkout = Path(code["gwdet"]).parent if "gwdet" in code else None
    path = Path(config_file)
    if checkout is not None and path.is_relative_to(checkout):
        return str(path.relative_to(checkout))
    return config_file
