"""A norm study on a cluster: one submitit job per cell, submitted once.

``tools/compare_norms.py --launcher slurm`` (or ``submitit-local``) plans the study as the local
launcher does (every cell's config checked against its record before anything is submitted), then
:func:`submit_cells` submits a :class:`CellJob` for every cell that is not done and has no job that
is queued or running, and records the job in the cell's folder (``cluster_job.json``; submitit's
files and the job's log in ``<cell>/submitit/<job id>/``). Running the command again finds those
records and asks SLURM (``squeue``; no accounting database needed) whether each job is still
queued or running: only cells whose job has ended without finishing them are submitted again.
Submitting holds a lock in the runs folder, so two invocations at once cannot both submit a cell.

A :class:`CellJob` runs the study's worker (:mod:`gwdet_lab.study.worker`: train with ``--resume``,
evaluate, mark complete) in the job, requeues itself on preemption or at its time limit
(:class:`gwdet.cluster.jobs.RequeueableJob`), adds its wall time and peak memory to the cell's
``study_run.json`` (as the local scheduler does), and when its cell is done and every other cell of
the study is too, writes the study's report: the last cell to end writes it. Results are gathered
from the shared output folder, as the local launcher does.
"""
from __future__ import annotations

import datetime
import fcntl
import os
import resource
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

from gwdet.errors import GwdetRuntimeError
from gwdet.cluster.executor import describe, make_executor, submit, unstartable
from gwdet.cluster.jobs import NodePlacement, RequeueableJob
from gwdet.cluster.options import LauncherOptions
from gwdet.cluster.slurm import JobState, job_states
from gwdet_lab.study.record import PlannedCell, write_usage
from gwdet_lab.study.run_folder import STUDY_RUN_JSON, RunFolder
from gwdet_lab.study.scheduler import is_done
from gwdet_lab.study.worker import EXIT_BUSY, EXIT_MISMATCH, PARENT_ENV

JOB_RECORD = "cluster_job.json"
JOBS_FOLDER = "submitit"
SUBMIT_LOCK = ".submit.lock"
REPORT_LOCK = ".report.lock"

Printer = Callable[[str], None]


@dataclass(frozen=True)
class CellJob(RequeueableJob):
    """One cell of a study as a submitit job: the worker on its folder, then the report if the study
    is complete. ``study_argv`` is the study's command line (for the report), run from ``cwd``."""

    folder: str
    weights: tuple[float, ...]
    threads: int | None
    num_gpus: int
    study_argv: tuple[str, ...]
    repo_root: str
    cwd: str

    def __call__(self) -> dict:
        from gwdet_lab.study import worker
        from gwdet_lab.study.cli import report_if_complete

        placement = NodePlacement.from_environment()
        name = Path(self.folder).name
        print(f"[gwdet study] cell {name}, {placement.describe()}"
              + (": continuing from its newest checkpoint" if self.resumes(placement) else ""), flush=True)
        os.chdir(self.cwd)
        os.environ.pop(PARENT_ENV, None)  # the job's process is the worker's parent, not a scheduler
        argv = [self.folder, "--num-gpus", str(self.num_gpus), "--example-weights", *map(repr, self.weights)]
        started, status = time.monotonic(), None
        try:
            status = worker.main([*argv, *(["--threads", str(self.threads)] if self.threads else [])])
        finally:  # also when the job stops for a requeue; not when the worker refused to start
            if status not in (EXIT_BUSY, EXIT_MISMATCH):
                record_usage(RunFolder(Path(self.folder)), time.monotonic() - started)
        if status == EXIT_MISMATCH:
            raise GwdetRuntimeError(f"cell {name}: its config changed after the study was submitted (above); "
                                    "nothing was trained. Restore the config, or plan the study again.")
        if status == EXIT_BUSY:
            raise GwdetRuntimeError(f"cell {name}: another process works in {self.folder}; this job left it alone.")
        if status != 0:
            raise GwdetRuntimeError(f"cell {name}: the worker ended with exit status {status} (above)")
        try:
            report = report_if_complete(list(self.study_argv), Path(self.repo_root))
        except Exception as error:  # the cell is done either way: the report can be written later
            print(f"[gwdet study] the study's report could not be written ({type(error).__name__}: {error}); "
                  "write it with the study's command and --report-only", file=sys.stderr, flush=True)
            report = None
        return {"cell": name, "folder": self.folder, "report": [str(p) for p in report] if report else None}


def record_usage(folder: RunFolder, seconds: float) -> None:
    """Add this job run's wall time and peak memory (this process and the training processes it
    started, ``ru_maxrss`` in KiB) to the cell's ``study_run.json``, as the local scheduler does."""
    peak_kib = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                   resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    write_usage(folder, folder.read_json(STUDY_RUN_JSON), seconds, peak_kib / 1024.0)


@contextmanager
def folder_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on the file ``path`` (waiting for it) while the block runs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def read_job(planned: PlannedCell) -> dict:
    """The cell's job record (``{}`` when none was submitted)."""
    return planned.folder.read_json(JOB_RECORD)


def job_state_text(record: dict, states: dict[str, JobState]) -> str:
    """``RUNNING``, ``PENDING (Resources)``, ... from SLURM; ``ended`` when it no longer knows the job."""
    state = states.get(str(record.get("job_id")))
    if state is None:
        return "ended"
    return f"{state.state} ({state.reason})" if state.reason else state.state


def _local_job_alive(job_id: str) -> bool:
    """submitit's local executor: the job id is the pid of its controller process."""
    try:
        command = Path(f"/proc/{int(job_id)}/cmdline").read_bytes()
    except (OSError, ValueError):
        return False
    return b"submitit.local._local" in command


def current_states(records: Sequence[dict]) -> dict[str, JobState]:
    """The state of every recorded job: from ``squeue`` for SLURM jobs (one call), from the process
    table for jobs of submitit's local executor."""
    slurm_ids = [str(r["job_id"]) for r in records if r.get("launcher") == "slurm"]
    states = job_states(slurm_ids) if slurm_ids else {}
    for record in records:
        if record.get("launcher") == "submitit-local" and _local_job_alive(str(record["job_id"])):
            states[str(record["job_id"])] = JobState(str(record["job_id"]), "RUNNING")
    return states


def submit_cells(planned: Sequence[PlannedCell], options: LauncherOptions, weights: Sequence[float],
                 threads: int | None, num_gpus: int, study_argv: Sequence[str], repo_root: Path,
                 runs_dir: Path, echo: Printer) -> list[str]:
    """Submit a job for every cell that is not done and has no queued or running job; the ids of
    the jobs submitted. The caller has checked the launcher (:func:`check_launcher`)."""
    submitted = []
    with folder_lock(runs_dir / SUBMIT_LOCK):
        records = {p.cell.name: read_job(p) for p in planned}
        states = current_states([r for r in records.values() if r])
        for item in planned:
            name, record = item.cell.name, records[item.cell.name]
            if is_done(item, weights):
                echo(f"{name}: done" + (f" (job {record['job_id']})" if record else ""))
                continue
            state = states.get(str(record.get("job_id")))
            if state is not None and state.active:
                echo(f"{name}: job {record['job_id']} is {job_state_text(record, states)}; not submitted again")
                continue
            if record:
                echo(f"{name}: job {record['job_id']} ended ({job_state_text(record, states)}) without finishing "
                     f"the cell (see {record.get('log')}); submitting it again")
            if item.folder.is_busy():
                echo(f"{name}: another process works in {item.folder.path}; not submitted")
                continue
            submitted.append(submit_cell(item, options, weights, threads, num_gpus, study_argv, repo_root, echo))
    return submitted


def submit_cell(item: PlannedCell, options: LauncherOptions, weights: Sequence[float], threads: int | None,
                num_gpus: int, study_argv: Sequence[str], repo_root: Path, echo: Printer) -> str:
    """Submit one cell's job and record it in the cell's folder; its job id."""
    folder = item.folder.path / JOBS_FOLDER
    executor = make_executor(options, folder, job_name=f"gwdet-{item.cell.name}")
    job = submit(executor, CellJob(str(item.folder.path), tuple(weights), threads, num_gpus, tuple(study_argv),
                                   str(repo_root), os.getcwd()), folder)
    item.folder.write_json(JOB_RECORD, {
        "job_id": str(job.job_id), "launcher": options.launcher, "log": str(job.paths.stdout),
        "errors": str(job.paths.stderr),
        "submitted": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
    })
    lines = describe(job, options.launcher)
    echo(f"{item.cell.name}: {lines[0]}\n" + "\n".join(lines[1:]))
    stuck = unstartable(str(job.job_id)) if options.launcher == "slurm" else None
    if stuck is not None:
        echo(f"{item.cell.name}: {stuck}")
    return str(job.job_id)


def wait_for_cells(planned: Sequence[PlannedCell], weights: Sequence[float], echo: Printer,
                   poll_seconds: float = 5.0) -> list[str]:
    """Wait until every cell is done or its job has ended; the names of the cells whose job ended
    without finishing them."""
    shown: dict[str, str] = {}
    while True:
        records = {p.cell.name: read_job(p) for p in planned}
        states = current_states([r for r in records.values() if r])
        waiting, failed = [], []
        for item in planned:
            name, record = item.cell.name, records[item.cell.name]
            if is_done(item, weights):
                text = "done"
            elif record and states.get(str(record["job_id"])) is not None and states[str(record["job_id"])].active:
                stuck = states[str(record["job_id"])].never_starts()
                text = stuck or job_state_text(record, states)
                (failed if stuck else waiting).append(name)
            else:
                text = "ended without finishing" + (f": see {record['log']}" if record else "")
                failed.append(name)
            if shown.get(name) != text:
                echo(f"{name}: {text}")
                shown[name] = text
        if not waiting:
            return failed
        time.sleep(poll_seconds)


def list_jobs(planned: Sequence[PlannedCell]) -> dict[str, str]:
    """``{cell: "job 12 RUNNING"}`` for the cells with a recorded job (state from SLURM)."""
    records = {p.cell.name: read_job(p) for p in planned}
    recorded = [r for r in records.values() if r]
    if not recorded:
        return {}
    try:
        states = current_states(recorded)
    except RuntimeError as error:  # SLURM not reachable from here
        return {name: f"job {r['job_id']} (state unknown: {error})" for name, r in records.items() if r}
    return {name: f"job {r['job_id']} {job_state_text(r, states)}" for name, r in records.items() if r}

