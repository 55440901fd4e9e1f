"""Training each run of a study with ``tools/train_net.py``, resuming, and showing progress.

Every run trains in a child process, ``tools/train_net.py --config-file CONFIG [--resume]
[common overrides] [run overrides] OUTPUT_DIR <out>/<name>``: the same Trainer, COCOEvaluator and
outputs as a run started by hand, and a separate process per run so that one run's memory or
crash does not touch the others. A finished run (``results.json`` present) is skipped; an
unfinished one with a checkpoint continues from it (``--resume``); anything else starts afresh.

Progress: while the child trains, its ``metrics.json`` is polled and a line printed per logged
iteration with the run's ETA (from the latest seconds per iteration) and a rough ETA for the
study (the remaining runs' iterations at the same speed; evaluation time not included).

Peak memory: ``os.wait4`` returns the child's resource usage; ``ru_maxrss`` is the peak resident
set size of the largest process of the run (the trainer or one of its data-loader workers), in
KiB on Linux. A resumed run reports the largest peak over its sessions.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from detectron2.config import CfgNode

from gwdet.engine import build_config
from gwdet.study.run_folder import STDOUT_TXT, STUDY_RUN_JSON, RunFolder
from gwdet.study.runs import RunSpec

POLL_SECONDS = 0.5
FAILURE_TAIL_LINES = 30

Printer = Callable[[str], None]


@dataclass(frozen=True)
class PlannedRun:
    """A run with its full override list and the config it resolves to (checked before training)."""

    spec: RunSpec
    opts: tuple[str, ...]
    cfg: CfgNode
    folder: RunFolder

    @property
    def max_iter(self) -> int:
        return int(self.cfg.SOLVER.MAX_ITER)


def plan_runs(specs: Sequence[RunSpec], out_dir: Path, common_opts: Sequence[str]) -> list[PlannedRun]:
    """Resolve every run's config now, so a typo in a file or override fails before any training.

    Override order: the common ones, then the run's own (which win), then ``OUTPUT_DIR``. A bad
    key or value raises ``ValueError`` naming the run; a missing config file ``FileNotFoundError``.
    """
    planned = []
    for spec in specs:
        folder = RunFolder(out_dir / spec.name)
        opts = (*common_opts, *spec.opts, "OUTPUT_DIR", str(folder.path))
        try:
            cfg = build_config(spec.config_file, list(opts))
        except (AssertionError, KeyError, ValueError) as error:  # yacs asserts on unknown keys
            raise ValueError(f"Run {spec.name!r} ({spec.config_file}): {error}") from error
        planned.append(PlannedRun(spec, opts, cfg, folder))
    return planned


def format_duration(seconds: float) -> str:
    """``3725`` -> ``"1h02m05s"``, ``65`` -> ``"1m05s"``, ``7`` -> ``"7s"``."""
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class StudyTrainer:
    """Trains the planned runs one after the other, printing progress through ``echo``."""

    def __init__(self, runs: Sequence[PlannedRun], train_script: Path, num_gpus: int = 1,
                 threads: int | None = None, echo: Printer = print):
        """``threads``: CPU threads per training process (``OMP_NUM_THREADS``); ``None`` keeps
        the environment's setting (PyTorch's default: one per core)."""
        self.runs = list(runs)
        self.train_script = train_script
        self.num_gpus = num_gpus
        self.threads = threads
        self.echo = echo

    def train_all(self) -> list[str]:
        """Train every unfinished run; return the names of the runs that failed."""
        failed = []
        for index, run in enumerate(self.runs):
            label = f"[{index + 1}/{len(self.runs)}] {run.spec.name}"
            if run.folder.is_finished():
                self.echo(f"{label}: skipped, already finished ({run.folder.path})")
                continue
            if not self.train(run, index, label):
                failed.append(run.spec.name)
        return failed

    def command(self, run: PlannedRun, resume: bool) -> list[str]:
        """The ``tools/train_net.py`` command line of ``run``."""
        resume_flag = ["--resume"] if resume else []
        return [sys.executable, str(self.train_script), "--config-file", run.spec.config_file,
                "--num-gpus", str(self.num_gpus), *resume_flag, *run.opts]

    def child_environment(self) -> dict[str, str]:
        """This process's environment, with the thread count if one is set."""
        environment = dict(os.environ)
        if self.threads is not None:
            environment["OMP_NUM_THREADS"] = environment["MKL_NUM_THREADS"] = str(self.threads)
        return environment

    def train(self, run: PlannedRun, index: int, label: str) -> bool:
        """Train (or resume) one run in a child process; record its peak memory; ``True`` on success."""
        resume = run.folder.has_checkpoint()
        command = self.command(run, resume)
        self.echo(f"{label}: {'resuming from its last checkpoint' if resume else 'training'} "
                  f"({run.max_iter} iterations) -> {run.folder.path}")
        run.folder.path.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        with open(run.folder.file(STDOUT_TXT), "a") as stdout:
            stdout.write(f"\n$ {' '.join(command)}\n")
            stdout.flush()
            child = subprocess.Popen(
                command, stdout=stdout, stderr=subprocess.STDOUT, env=self.child_environment()
            )
            status, usage = self._wait_showing_progress(child, run, index, label)
        seconds = time.monotonic() - started
        self._record_session(run.folder, peak_rss_mb=usage.ru_maxrss / 1024.0, seconds=seconds)
        exit_code = os.waitstatus_to_exitcode(status)
        if exit_code != 0 or not run.folder.is_finished():
            tail = run.folder.file(STDOUT_TXT).read_text(errors="replace").splitlines()[-FAILURE_TAIL_LINES:]
            self.echo(f"{label}: FAILED (exit code {exit_code}); last lines of "
                      f"{run.folder.file(STDOUT_TXT)}:\n" + "\n".join(tail))
            return False
        self.echo(f"{label}: finished in {format_duration(seconds)}")
        return True

    def _wait_showing_progress(self, child: subprocess.Popen, run: PlannedRun, index: int, label: str):
        """Poll until the child exits, printing a progress line whenever a new iteration is logged;
        return its wait status and resource usage. The child is stopped if the study is interrupted."""
        shown = None
        try:
            while True:
                pid, status, usage = os.wait4(child.pid, os.WNOHANG)
                if pid:
                    child.returncode = os.waitstatus_to_exitcode(status)
                    return status, usage
                training_records = [r for r in run.folder.metrics() if "total_loss" in r]
                if training_records and training_records[-1]["iteration"] != shown:
                    shown = training_records[-1]["iteration"]
                    self.echo(self._progress_line(label, run, index, training_records[-1]))
                time.sleep(POLL_SECONDS)
        except BaseException:
            child.terminate()
            child.wait()
            raise

    def _progress_line(self, label: str, run: PlannedRun, index: int, latest: dict) -> str:
        """Iterations done, loss, speed and ETAs from the newest training record of ``metrics.json``."""
        done = latest["iteration"] + 1
        line = f"{label}: iter {done}/{run.max_iter} ({100.0 * done / run.max_iter:.0f}%)"
        line += f"  total_loss {latest['total_loss']:.3f}"
        seconds_per_iter = latest.get("time")
        if seconds_per_iter is not None:
            later = sum(r.max_iter for r in self.runs[index + 1:] if not r.folder.is_finished())
            run_left = (run.max_iter - done) * seconds_per_iter
            line += (f"  {seconds_per_iter:.2f} s/iter  ETA run {format_duration(run_left)}"
                     f"  ETA study ~{format_duration(run_left + later * seconds_per_iter)}")
        return line

    @staticmethod
    def _record_session(folder: RunFolder, peak_rss_mb: float, seconds: float) -> None:
        """Fold one training session into ``study_run.json`` (max peak memory, summed seconds)."""
        record = folder.read_json(STUDY_RUN_JSON)
        folder.write_json(STUDY_RUN_JSON, {
            "peak_rss_mb": max(peak_rss_mb, record.get("peak_rss_mb", 0.0)),
            "train_seconds": seconds + record.get("train_seconds", 0.0),
            "sessions": 1 + record.get("sessions", 0),
        })
