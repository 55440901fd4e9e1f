"""Running a study's cells: up to ``jobs`` worker processes side by side, progress and ETAs.

Each unfinished cell runs as ``python -m gwdet_lab.study.worker <folder>`` (see
:mod:`gwdet_lab.study.worker`) with ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` set to ``threads`` and
``torch.set_num_threads(threads)`` in the worker, so ``jobs`` x ``threads`` cores are busy. A cell
whose folder says it is complete is skipped; one whose folder another process holds is left to
that process ("busy"); anything else runs and resumes from its last checkpoint if it has one.

Progress: while a worker trains, its ``metrics.json`` is polled; at most every
``progress_seconds`` a line shows the cell's iteration, loss, seconds per iteration, the cell's
ETA and the study's. The study's ETA adds, for every cell left, its images times the seconds per
image measured so far (same norm and batch size if one ran, else same norm, else any), plus the
evaluation time finished cells took beyond training, and divides by ``jobs``: a rough figure on
a shared machine, shown with ``~``.

Peak memory: ``os.wait4`` returns a worker's resource usage; ``ru_maxrss`` (KiB on Linux) is its
peak resident set size. A cell trained over several invocations reports its largest peak.
"""
from __future__ import annotations

import errno
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Callable, Sequence

from gwdet_lab.reporting import format_duration
from gwdet_lab.study.record import PlannedCell, write_usage
from gwdet_lab.study.evaluation import choose_weight, selection_dataset
from gwdet_lab.study.run_folder import COMPLETE_JSON, EXAMPLE_WEIGHING_JSON, STDOUT_TXT, STUDY_RUN_JSON, RunFolder, seconds_per_iteration
from gwdet_lab.study.worker import EXIT_BUSY, EXIT_MISMATCH, PARENT_ENV

FAILURE_TAIL_LINES = 30
LAB_ROOT = Path(__file__).resolve().parents[2]  # the folder holding the gwdet_lab package

Printer = Callable[[str], None]


def is_done(planned: PlannedCell, weights: Sequence[float]) -> bool:
    """Trained, evaluated, and example weighing covered every weight in ``weights`` and chose among
    them: its recorded weight is the one the recorded APs on the selection split give among
    ``weights`` (a sweep of more weights may have chosen one that ``weights`` leave out; the
    worker then chooses again from the recorded APs)."""
    folder = planned.folder
    if not folder.is_complete():
        return False
    marker = folder.read_json(COMPLETE_JSON)
    if marker.get("diverged"):
        return True
    if "example_weighing" not in marker.get("evaluations", []):
        return "batch_statistics" not in marker.get("evaluations", []) or not weights
    if not set(weights) <= set(marker.get("example_weights", [])):
        return False
    if not weights:
        return True
    weighing = folder.read_json(EXAMPLE_WEIGHING_JSON, null_is_nan=True)
    val_aps = {key: result["bbox"]["AP"] for key, result in weighing.get(selection_dataset(planned.cfg), {}).items()}
    return choose_weight(val_aps, weights) == weighing.get("chosen")


def worker_command(folder: RunFolder, threads: int | None, weights: Sequence[float], num_gpus: int) -> list[str]:
    command = [sys.executable, "-m", "gwdet_lab.study.worker", str(folder.path), "--num-gpus", str(num_gpus),
               "--example-weights", *(repr(w) for w in weights)]
    if threads:
        command += ["--threads", str(threads)]
    return command


def worker_environment(threads: int | None) -> dict[str, str]:
    environment = dict(os.environ)
    if threads:
        environment["OMP_NUM_THREADS"] = environment["MKL_NUM_THREADS"] = str(threads)
    path = environment.get("PYTHONPATH")
    environment["PYTHONPATH"] = str(LAB_ROOT) + (os.pathsep + path if path else "")
    environment[PARENT_ENV] = str(os.getpid())
    return environment


@dataclass
class Active:
    """A worker process and what the progress lines need about it."""

    planned: PlannedCell
    label: str
    process: subprocess.Popen
    stdout: IO
    started: float
    earlier: dict  # the folder's study_run.json from earlier invocations
    peak_mb: float = 0.0  # largest peak memory seen in this invocation
    shown_iteration: int | None = None
    shown_at: float = 0.0


def peak_rss_mb(pid: int) -> float:
    """Peak resident set size so far of a running process (``VmHWM`` in ``/proc``; 0 where the
    OS does not say)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def record_usage(active: Active, peak_mb: float) -> None:
    """Write the cell's ``study_run.json`` (:func:`gwdet_lab.study.record.write_usage`) with the wall
    time of this invocation up to now. Written while the worker runs too, so that a study killed
    with its workers loses at most one progress interval of a cell's wall time."""
    active.peak_mb = max(active.peak_mb, peak_mb)
    write_usage(active.planned.folder, active.earlier, time.monotonic() - active.started, active.peak_mb)


def failure_reason(code: int, last_lines: Sequence[str] = ()) -> str:
    """Why a cell's worker ended with exit ``code`` (negative: killed by that signal) and its output's
    ``last_lines``, and, where it was stopped from outside or by a full disk, that the study resumes it."""
    if code == EXIT_MISMATCH:
        return "its config differs from the recorded one"
    resumes = "its checkpoints are kept, and running the study's command again resumes it"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}; {resumes}"
    if code - 128 in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR2):
        return f"stopped by {signal.Signals(code - 128).name} after saving a checkpoint; {resumes}"
    if any(os.strerror(errno.ENOSPC) in line for line in last_lines):
        return (f"exit status {code}: its disk is full ({os.strerror(errno.ENOSPC)}); {resumes} once there is "
                "space again")
    return f"exit status {code}"


@dataclass
class Outcome:
    done: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    busy: list[str] = field(default_factory=list)


class Scheduler:
    """Runs the planned cells that are not done, ``jobs`` at a time."""

    def __init__(self, cells: Sequence[PlannedCell], jobs: int = 1, threads: int | None = 1,
                 weights: Sequence[float] = (), num_gpus: int = 1, echo: Printer = print,
                 poll_seconds: float = 2.0, progress_seconds: float = 60.0):
        if jobs < 1:
            raise ValueError(f"jobs must be at least 1, got {jobs}")
        self.cells = list(cells)
        self.jobs, self.threads, self.weights, self.num_gpus = jobs, threads, list(weights), num_gpus
        self.echo = echo
        self.poll_seconds, self.progress_seconds = poll_seconds, progress_seconds
        self.active: list[Active] = []

    def label(self, planned: PlannedCell) -> str:
        return f"[{self.cells.index(planned) + 1}/{len(self.cells)} {planned.cell.name}]"

    def run(self) -> Outcome:
        outcome = Outcome()
        queue = []
        for planned in self.cells:
            if is_done(planned, self.weights):
                self.echo(f"{self.label(planned)} done, skipped ({planned.folder.path})")
                outcome.done.append(planned.cell.name)
            else:
                queue.append(planned)
        try:
            while queue or self.active:
                while queue and len(self.active) < self.jobs:
                    planned = queue.pop(0)
                    if planned.folder.is_busy():
                        self.echo(f"{self.label(planned)} busy: another process is working in {planned.folder.path}")
                        outcome.busy.append(planned.cell.name)
                        continue
                    self.start(planned, queue)
                for active in list(self.active):
                    pid, status, usage = os.wait4(active.process.pid, os.WNOHANG)
                    if pid:
                        self.finish(active, status, usage, outcome)
                    else:
                        self.show_progress(active, queue)
                if self.active:
                    time.sleep(self.poll_seconds)
        except BaseException:
            self.stop_all()
            raise
        return outcome

    def start(self, planned: PlannedCell, queue: Sequence[PlannedCell]) -> None:
        folder = planned.folder
        state = "resuming from its last checkpoint" if folder.has_checkpoint() else "starting"
        if folder.is_trained():
            state = "evaluating"
        command = worker_command(folder, self.threads, self.weights, self.num_gpus)
        stdout = open(folder.file(STDOUT_TXT), "a")
        stdout.write(f"\n$ {' '.join(command)}\n")
        stdout.flush()
        process = subprocess.Popen(command, stdout=stdout, stderr=subprocess.STDOUT,
                                   env=worker_environment(self.threads))
        active = Active(planned, self.label(planned), process, stdout, time.monotonic(), folder.read_json(STUDY_RUN_JSON))
        self.active.append(active)
        self.echo(f"{active.label} {state} ({planned.max_iter} iterations of {planned.cfg.SOLVER.IMS_PER_BATCH} "
                  f"images) -> {folder.path}; {self.eta_text(queue)}")

    def finish(self, active: Active, status: int, usage, outcome: Outcome) -> None:
        self.active.remove(active)
        active.stdout.close()
        folder, name = active.planned.folder, active.planned.cell.name
        seconds = time.monotonic() - active.started
        record_usage(active, usage.ru_maxrss / 1024.0)
        code = os.waitstatus_to_exitcode(status)
        if code == 0 and is_done(active.planned, self.weights):
            self.echo(f"{active.label} finished in {format_duration(seconds)}")
            outcome.done.append(name)
            return
        if code == EXIT_BUSY:
            self.echo(f"{active.label} busy: another process took {folder.path} first")
            outcome.busy.append(name)
            return
        tail = folder.file(STDOUT_TXT).read_text(errors="replace").splitlines()[-FAILURE_TAIL_LINES:]
        reason = failure_reason(code, tail)
        self.echo(f"{active.label} FAILED ({reason}); last lines of {folder.file(STDOUT_TXT)}:\n" + "\n".join(tail))
        outcome.failed.append(name)

    def stop_all(self) -> None:
        """Stop every worker (SIGTERM, then SIGKILL after 30 s); their checkpoints stay."""
        for active in self.active:
            active.process.send_signal(signal.SIGTERM)
        for active in self.active:
            try:
                active.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                active.process.kill()
                active.process.wait()
            record_usage(active, 0.0)
            active.stdout.close()
        self.active = []

    # ---- progress ----------------------------------------------------------------------------

    def show_progress(self, active: Active, queue: Sequence[PlannedCell]) -> None:
        now = time.monotonic()
        if active.shown_iteration is not None and now - active.shown_at < self.progress_seconds:
            return
        record_usage(active, peak_rss_mb(active.process.pid))
        records = [r for r in active.planned.folder.metrics() if "total_loss" in r]
        if not records or records[-1]["iteration"] == active.shown_iteration:
            return
        latest = records[-1]
        active.shown_iteration, active.shown_at = latest["iteration"], now
        done, total = latest["iteration"] + 1, active.planned.max_iter
        line = f"{active.label} iter {done}/{total} ({100.0 * done / total:.0f}%)  total_loss {latest['total_loss']:.3f}"
        if latest.get("time") is not None:
            line += f"  {latest['time']:.2f} s/iter  ETA run {format_duration(self.remaining_seconds(active.planned))}"
        self.echo(f"{line}  {self.eta_text(queue)}")

    def eta_text(self, queue: Sequence[PlannedCell]) -> str:
        left = len(queue) + len(self.active)
        estimates = [self.remaining_seconds(p) for p in [*(a.planned for a in self.active), *queue]]
        if any(e is None for e in estimates):
            return f"study: {left} run(s) left, ETA once speeds are measured"
        return f"study: {left} run(s) left, ETA ~{format_duration(sum(estimates) / self.jobs)}"

    def remaining_seconds(self, planned: PlannedCell) -> float | None:
        """Seconds ``planned`` still needs: its iterations left at the measured speed, plus the
        evaluation time of finished cells; ``None`` while no speed is known."""
        records = planned.folder.metrics()
        done = max((r["iteration"] + 1 for r in records if "total_loss" in r), default=0)
        own = seconds_per_iteration(records)
        per_image = own / planned.cfg.SOLVER.IMS_PER_BATCH if own else self.seconds_per_image(planned)
        if per_image is None:
            return None
        images_left = (planned.max_iter - done) * planned.cfg.SOLVER.IMS_PER_BATCH
        evaluation = 0.0 if planned.folder.is_complete() else self.evaluation_seconds()
        return images_left * per_image + evaluation

    def seconds_per_image(self, planned: PlannedCell) -> float | None:
        """Median seconds per training image over cells measured so far: same group and batch
        size if any, else same group, else all."""
        measured = []
        for other in self.cells:
            speed = seconds_per_iteration(other.folder.metrics())
            if speed:
                measured.append((other.cell, speed / other.cfg.SOLVER.IMS_PER_BATCH))
        for same in (lambda c: c.group == planned.cell.group and c.batch_size == planned.cell.batch_size,
                     lambda c: c.group == planned.cell.group, lambda c: True):
            values = [value for cell, value in measured if same(cell)]
            if values:
                return statistics.median(values)
        return None

    def evaluation_seconds(self) -> float:
        """Median wall time finished cells spent beyond their training iterations (0 if none)."""
        extra = []
        for other in self.cells:
            run = other.folder.read_json(STUDY_RUN_JSON)
            speed = seconds_per_iteration(other.folder.metrics())
            if other.folder.is_complete() and run.get("sessions") == 1 and speed:
                extra.append(max(run["wall_seconds"] - other.max_iter * speed, 0.0))
        return statistics.median(extra) if extra else 0.0
