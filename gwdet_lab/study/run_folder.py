"""What a cell's folder holds, and reading it.

Training (:mod:`gwdet.engine.trainer` and detectron2) writes ``metrics.json`` (one json object per logged
iteration, every 20 iterations: ``total_loss`` and the other losses as medians over the last 20
iterations, ``time`` the median seconds per iteration over the same window), ``log.txt``,
``config.yaml``, checkpoints with ``last_checkpoint`` naming the newest, and, once evaluated,
``results.json`` (COCO results per test dataset, and the run's package versions and dataset
files under ``environment``). The study adds:

* ``study_cell.json``: the cell, its full resolved config and the environment it was planned in,
  written before anything trains (:mod:`gwdet_lab.study.record`);
* ``example_weighing.json``, ``batch_statistics.json``: the extra evaluations of batch-norm models
  (:mod:`gwdet_lab.study.evaluation`);
* ``study_timing.json``: seconds spent training and evaluating (written by the worker);
* ``study_run.json``: peak memory and wall time of the worker processes (written by the scheduler);
* ``study_complete.json``: written last, when every evaluation the cell needs is there;
* ``image_bootstrap.json``: box AP on bootstrap resamples of the report split's images, written
  by the report (:mod:`gwdet_lab.study.image_bootstrap`) from ``inference/<dataset>/``;
* ``diverged.json``: instead of results, when training stopped on a non-finite loss;
* ``stdout.txt``: the worker's console output; ``.lock``: held while a worker uses the folder.

``config.yaml``, ``results.json`` and every json record above have their SHA-256 recorded beside
them (``<name>.sha256``, :mod:`gwdet.utils.atomic`): a record that no longer matches is damaged
(:class:`DamagedFile`), and damaged ``results.json`` does not count as trained. In a records
folder (``--records``), a json record without its ``.sha256`` is damaged too. ``metrics.json``
is appended to line by line and has no checksum in a run folder, where its damaged lines are
skipped; an export records its SHA-256, which a records folder checks as the others' (a study's
run folder read as records, ``--records <out>/runs``, is read as a run folder there).
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import math
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Mapping

from gwdet.errors import GwdetError
from gwdet.utils.atomic import (CHECKSUM_SUFFIX, checksum_path, checksum_problem, reading_record, shown_record,
                                write_text_with_checksum)
from gwdet.engine.output_dir import metrics_record
from gwdet.engine.run_environment import ENVIRONMENT_KEY
from gwdet.utils.run_file_names import FINAL_WEIGHTS, LAST_CHECKPOINT, LOG_NAME, METRICS_JSON, RESULTS_JSON

RECORD_JSON = "study_cell.json"
EXAMPLE_WEIGHING_JSON = "example_weighing.json"
BATCH_STATISTICS_JSON = "batch_statistics.json"
TIMING_JSON = "study_timing.json"
STUDY_RUN_JSON = "study_run.json"
COMPLETE_JSON = "study_complete.json"
IMAGE_BOOTSTRAP_JSON = "image_bootstrap.json"
DIVERGED_JSON = "diverged.json"
STDOUT_TXT = "stdout.txt"
LOCK_FILE = ".lock"

# detectron2's CommonMetricPrinter logs "max_mem: 1234M" (torch.cuda.max_memory_allocated) on GPUs.
_MAX_MEM = re.compile(r"max_mem: (\d+)M")


class FolderBusy(GwdetError, RuntimeError):
    """Another process holds the folder's lock."""


class DamagedFile(GwdetError, ValueError):
    """A record of the folder that cannot be read (the message names it and the fix)."""


def nan_for_null(tree: Any) -> Any:
    """``tree`` (nested dicts and lists of numbers, as the study's AP records hold them) with NaN
    for each ``None``: the inverse of :func:`null_for_nan`."""
    if isinstance(tree, dict):
        return {key: nan_for_null(value) for key, value in tree.items()}
    if isinstance(tree, list):
        return [nan_for_null(value) for value in tree]
    return math.nan if tree is None else tree


def null_for_nan(tree: Any) -> Any:
    """``tree`` with ``None`` (JSON's ``null``) for each NaN float, so that it is written as strict
    JSON (which has no NaN; an AP is NaN where a model detects nothing)."""
    if isinstance(tree, Mapping):
        return {key: null_for_nan(value) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [null_for_nan(value) for value in tree]
    return None if isinstance(tree, float) and math.isnan(tree) else tree


@dataclass(frozen=True)
class RunFolder:
    """The folder a cell trains into (its ``OUTPUT_DIR``); ``records``: read as a cell's records
    (``--records``), where nothing trains, so that a damaged file is to be restored, not re-trained."""

    path: Path
    records: bool = False

    def file(self, name: str) -> Path:
        return self.path / name

    def exists(self) -> bool:
        return self.path.is_dir()

    def is_trained(self) -> bool:
        """Trained and evaluated: ``results.json`` is written last by :func:`gwdet.engine.run.main`. A
        damaged one does not count in a run folder: the cell resumes from its last checkpoint and is
        evaluated again; in a records folder it is :class:`DamagedFile`, to be copied again."""
        try:
            return bool(self.read_json(RESULTS_JSON))
        except DamagedFile:
            if self.records:
                raise
            return False

    def is_complete(self) -> bool:
        """Every study evaluation done (``study_complete.json``) after training finished or diverged."""
        return self.file(COMPLETE_JSON).is_file() and (self.is_trained() or self.diverged())

    def diverged(self) -> bool:
        """Training stopped on a non-finite loss (``diverged.json``): a result, not a failure."""
        return self.file(DIVERGED_JSON).is_file()

    def has_checkpoint(self) -> bool:
        return self.file(LAST_CHECKPOINT).is_file()

    def has_training_output(self) -> bool:
        """Anything training leaves behind: a checkpoint, metrics or results."""
        return any(self.file(name).exists() for name in (LAST_CHECKPOINT, METRICS_JSON, RESULTS_JSON, FINAL_WEIGHTS))

    def metrics(self) -> list[dict]:
        """Every record of ``metrics.json`` (empty before the first write); a damaged line (cut off
        by an interruption, or the line training is writing now; not UTF-8; not a record with an
        ``iteration``: :func:`gwdet.engine.output_dir.metrics_record`) is skipped. ``--resume``
        removes such lines from the file, naming them in a warning. In a records folder the file is
        whole, checked by the SHA-256 its export recorded (:class:`DamagedFile` otherwise)."""
        path = self.file(METRICS_JSON)
        if not path.is_file():
            return []
        if self.records:
            self._check_recorded(path)
        records = (metrics_record(line) for line in path.read_bytes().split(b"\n"))
        return [record for record in records if record is not None]

    def results(self) -> dict[str, dict[str, dict[str, float]]]:
        """``{dataset: {task: {metric: value}}}`` from ``results.json`` (COCO AP in %; NaN where the
        file has ``null``, or ``NaN`` as earlier runs wrote it), without the run's ``environment`` record."""
        return {name: nan_for_null(tasks) for name, tasks in self.read_json(RESULTS_JSON).items()
                if name != ENVIRONMENT_KEY}

    def read_json(self, name: str, null_is_nan: bool = False) -> dict:
        """A json object file of the folder, ``{}`` when it is not there; :class:`DamagedFile` when
        it is not a json object (cut short by a full disk or a kill, overwritten). With
        ``null_is_nan`` (the records of APs), each ``null`` is read as NaN (:func:`nan_for_null`)."""
        path = self.file(name)
        if not path.is_file():
            return {}
        self._check_recorded(path)
        try:
            data = json.loads(path.read_bytes())
        except ValueError as error:  # JSONDecodeError, UnicodeDecodeError
            raise DamagedFile(f"{path} is damaged ({error}). {self._restore_advice()}") from None
        if not isinstance(data, dict):
            raise DamagedFile(f"{path} is damaged (a json {type(data).__name__}, not an object). "
                              f"{self._restore_advice()}")
        return nan_for_null(data) if null_is_nan else data

    def _check_recorded(self, path: Path) -> None:
        """:class:`DamagedFile` for a file of the folder that differs from the SHA-256 recorded beside
        it, or, in a records folder, has none (a run folder's may lack it: a kill between the write
        and its record; exported ones never do). A study's run folder read as records (``--records
        <out>/runs``: it holds the ``last_checkpoint`` training writes, which no export copies) keeps
        its ``metrics.json`` without a record, as every run folder does."""
        problem = checksum_problem(str(path))  # results.json and the study's records carry their SHA-256
        if problem is None and self.records and not Path(checksum_path(str(path))).is_file() \
                and not (path.name == METRICS_JSON and self.has_checkpoint()):
            problem = f"its SHA-256 record {path.name}{CHECKSUM_SUFFIX}, which exported records keep beside it, is missing"
        if problem is not None and crlf_of_recorded(path):
            raise DamagedFile(
                f"{path} has CRLF (Windows) line endings where it was written with LF ones: with its lines ending in "
                f"LF it matches the SHA-256 recorded in {shown_record(str(path))}, which is over the bytes as written. "
                "A git checkout with core.autocrlf=true (or a copy that converts line endings) does this to committed "
                "records. Check them out again unconverted (a fresh clone keeps them as committed, its .gitattributes "
                "marking them -text; or git config core.autocrlf false, then delete the records folder and git "
                "checkout -- it), or convert the files back to LF line endings (dos2unix), then run "
                "the same command again.")
        if problem is not None:
            raise DamagedFile(f"{path} is damaged ({problem}). {self._restore_advice()}")

    def _restore_advice(self) -> str:
        """What to do about a damaged file of this folder."""
        if self.records:
            return ("Records are only read, never trained into: copy the cell's records again from where they came "
                    "from (a study's runs folder, exported with compare_norms.py --records <out>/runs "
                    "--export-records DIR), then run the same command again.")
        if self.holds_export():
            return (f"{self.path} holds a cell's exported records (its {METRICS_JSON} has the SHA-256 that an export "
                    "records, and there is no checkpoint), where nothing trains: move that folder away (or remove it) "
                    "and run the export (--export-records) again, which writes the cell's records anew from those it "
                    "copies; or export into another folder.")
        return "Remove it and run the same command again: the cell resumes from its last checkpoint and writes it anew."

    def holds_export(self) -> bool:
        """Whether the folder holds a cell's exported records (:func:`gwdet_lab.study.records.export_records`)
        rather than a training run: the SHA-256 of its ``metrics.json`` is recorded beside it, which an
        export does and training (appending to the file) never does, and it has no checkpoint."""
        return Path(checksum_path(str(self.file(METRICS_JSON)))).is_file() and not self.has_checkpoint()

    def write_json(self, name: str, data: Mapping) -> None:
        """Write ``data`` as strict JSON (NaN as ``null``: :func:`null_for_nan`) through a temporary
        file renamed into place, so a kill leaves the old or the new file, and record its SHA-256
        beside it (``<name>.sha256``), which :meth:`read_json` checks."""
        self.path.mkdir(parents=True, exist_ok=True)
        text = json.dumps(null_for_nan(data), indent=2, sort_keys=True, allow_nan=False)
        write_text_with_checksum(str(self.file(name)), text + "\n")

    def peak_gpu_memory_mb(self) -> float | None:
        """Largest ``max_mem`` detectron2 logged (GPU runs only), else ``None``."""
        path = self.file(LOG_NAME)
        if not path.is_file():
            return None
        values = [float(m) for m in _MAX_MEM.findall(path.read_text(errors="replace"))]
        return max(values) if values else None

    def lock(self) -> IO:
        """Take the folder's lock (``FolderBusy`` if another process holds it); it is released when
        the returned file is closed or the process ends, however it ends."""
        self.path.mkdir(parents=True, exist_ok=True)
        handle = open(self.file(LOCK_FILE), "a")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise FolderBusy(f"{self.path} is in use by another process (its {LOCK_FILE} is locked).") from None
        return handle

    def is_busy(self) -> bool:
        """Whether another process holds the lock now."""
        if not self.file(LOCK_FILE).exists():
            return False
        try:
            self.lock().close()
        except FolderBusy:
            return True
        return False


_DIGEST = re.compile(rb"[0-9a-fA-F]{64}")


def crlf_of_recorded(path: Path) -> bool:
    """Whether the file at ``path`` differs from the SHA-256 recorded beside it only in its line
    endings: it holds CRLF, and with each CRLF read as LF its SHA-256 is the recorded one."""
    try:
        data = path.read_bytes()
        with open(reading_record(str(path)), "rb") as file:
            recorded = _DIGEST.search(file.read(256))
    except OSError:
        return False
    if recorded is None or b"\r\n" not in data:
        return False
    return hashlib.sha256(data.replace(b"\r\n", b"\n")).hexdigest() == recorded.group(0).decode("ascii").lower()


def loss_curve(records: list[dict]) -> list[tuple[int, float]]:
    """``(iteration, total_loss)`` sorted by iteration; where a resumed run logged an iteration
    twice, the later record wins."""
    by_iteration = {r["iteration"]: r["total_loss"] for r in records if "total_loss" in r}
    return sorted(by_iteration.items())


def final_loss(records: list[dict]) -> float | None:
    """The last logged ``total_loss`` (a median over the last 20 iterations), ``None`` if none."""
    curve = loss_curve(records)
    return curve[-1][1] if curve else None


def seconds_per_iteration(records: list[dict]) -> float | None:
    """Median of the logged ``time`` values (detectron2 skips the first iterations' timing)."""
    times = [r["time"] for r in records if "time" in r]
    return statistics.median(times) if times else None
