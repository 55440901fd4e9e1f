"""submitit executors for gwdet's jobs: the checks before submitting, submitting with SLURM's own
message when it refuses, the lines that tell the user where the job is, and waiting for it.

submitit, gwdet's optional ``cluster`` extra, is imported only when a job is submitted (here) or
runs (:mod:`gwdet.cluster.jobs`). A job's files (submitit's pickles, ``<job id>_0_log.out`` / ``.err``) go to
``<folder>/<job id>/``, where ``folder`` is beside the run it trains (``OUTPUT_DIR/submitit``).
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Iterator

from gwdet.errors import GwdetError, GwdetRuntimeError
from gwdet.cluster.options import LauncherOptions
from gwdet.cluster.slurm import ClusterUnavailable, check_reachable, job_states, partition_has_gpus

if TYPE_CHECKING:
    import submitit

MAX_TIMEOUTS = 20  # time limits a job may reach and still requeue itself (preemptions do not count)
SIGNAL_DELAY_S = 120  # SIGUSR2 this long before the time limit: time to save and requeue
POLL_SECONDS = 2.0
RESULT_GRACE_SECONDS = 15.0  # a finished job's result file may appear a moment after squeue says so


class SubmissionRefused(GwdetError, RuntimeError):
    """sbatch (or submitit's executor) refused the job; nothing was submitted."""


def require_submitit(launcher: str) -> ModuleType:
    """``import submitit``, or an error naming the extra to install."""
    try:
        import submitit
    except ImportError:
        raise ClusterUnavailable(
            f"--launcher {launcher} runs jobs through submitit, which is not installed: install gwdet's "
            "'cluster' extra (pip install 'gwdet[cluster]', or pip install submitit), or use --launcher local."
        ) from None
    return submitit


def check_launcher(options: LauncherOptions) -> None:
    """Everything that can be checked before a job is submitted: submitit for both launchers, and for
    ``slurm`` SLURM's commands and a controller that answers. Writes nothing."""
    require_submitit(options.launcher)
    if options.launcher == "slurm":
        check_reachable()


def _signal_delay(options: LauncherOptions) -> int:
    return min(SIGNAL_DELAY_S, options.timeout_min * 15)  # a quarter of very short time limits


def gpus_per_node(options: LauncherOptions) -> int:
    """``--gpus-per-node``, or by default ``--num-gpus`` where the nodes have GPUs (SLURM: the
    partition's nodes list a ``gpu`` GRES in ``sinfo``; local executor: CUDA is available), else 0."""
    if options.gpus_per_node is not None:
        return options.gpus_per_node
    if options.launcher == "slurm":
        has_gpus = partition_has_gpus(options.partition)
    else:
        import torch

        has_gpus = torch.cuda.is_available()
    return options.processes_per_node if has_gpus else 0


def make_executor(options: LauncherOptions, folder: Path, job_name: str) -> "submitit.Executor":
    """A submitit executor for ``options`` writing the job's files to ``folder/<job id>``."""
    submitit = require_submitit(options.launcher)
    gpus = gpus_per_node(options)
    if options.launcher == "slurm":
        executor = submitit.SlurmExecutor(folder=str(folder / "%j"), max_num_timeout=MAX_TIMEOUTS)
        parameters: dict[str, Any] = {
            "job_name": job_name, "nodes": options.nodes, "ntasks_per_node": 1, "time": options.timeout_min,
            "signal_delay_s": _signal_delay(options),
        }
        optional = {"gpus_per_node": gpus or None, "cpus_per_task": options.cpus_per_task,
                    "partition": options.partition, "account": options.account,
                    "additional_parameters": dict(options.extra) or None}
        parameters.update({key: value for key, value in optional.items() if value is not None})
    elif options.launcher == "submitit-local":
        executor = submitit.LocalExecutor(folder=str(folder / "%j"), max_num_timeout=MAX_TIMEOUTS)
        parameters = {"timeout_min": options.timeout_min, "tasks_per_node": 1,
                      "gpus_per_node": gpus, "signal_delay_s": _signal_delay(options)}
    else:
        raise ValueError(f"--launcher {options.launcher} does not submit jobs")
    executor.update_parameters(**parameters)
    return executor


def submit(executor: "submitit.Executor", job: Callable[[], Any], folder: Path) -> "submitit.Job":
    """``executor.submit(job)``; when sbatch refuses it, :class:`SubmissionRefused` with sbatch's
    message, and the files submitit wrote for it (and folders it made) are removed again."""
    from submitit.core.utils import FailedJobError  # the caller has checked that submitit is there

    existing = _first_existing(folder)
    before = set(folder.rglob("*")) if folder.is_dir() else set()
    try:
        if type(executor).__name__ == "LocalExecutor":
            with _output_into(folder / CONTROLLER_LOG):
                return executor.submit(job)
        return executor.submit(job)
    except FailedJobError as error:
        _remove_new(folder, before, existing)
        message = str(error).strip() or "no message"
        raise SubmissionRefused(f"SLURM refused the job: {message}") from None


# Where submitit's local controller (the process that runs a submitit-local job and lives as long as
# it) writes: the job's own output goes to its log files
CONTROLLER_LOG = "controller.log"


@contextlib.contextmanager
def _output_into(log: Path) -> Iterator[None]:
    """This process's stdout and stderr (file descriptors 1 and 2) appended to ``log`` while the
    block runs: a process started in it (submitit's local controller, which gets no output of its
    own) does not hold the tool's output open, so that ``... | tee run.log`` ends when the tool does,
    not when the job does."""
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        with open(log, "ab") as file:
            os.dup2(file.fileno(), 1)
            os.dup2(file.fileno(), 2)
        yield
    finally:
        for descriptor, copy in ((1, saved[0]), (2, saved[1])):
            os.dup2(copy, descriptor)
            os.close(copy)


def _first_existing(path: Path) -> Path:
    while not path.exists():
        path = path.parent
    return path


def _remove_new(folder: Path, before: set, existing: Path) -> None:
    """Remove what appeared under ``folder`` since ``before``, and the folders up to ``existing``
    that submitting created."""
    if folder.is_dir():
        for path in sorted(set(folder.rglob("*")) - before, reverse=True):
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    path = folder
    while path != existing and path.is_dir() and not any(path.iterdir()):
        path.rmdir()
        path = path.parent


def describe(job: "submitit.Job", launcher: str) -> list[str]:
    """Where the job is and how to follow it: its id, log files and the commands to watch it."""
    stdout, stderr = job.paths.stdout, job.paths.stderr
    lines = [f"submitted job {job.job_id} ({launcher})", f"  log:    {stdout}", f"  errors: {stderr}",
             f"  follow: tail -f {stdout}"]
    if launcher == "slurm":
        lines += [f"  state:  squeue -j {job.job_id}   (scontrol show job {job.job_id})",
                  f"  cancel: scancel {job.job_id}"]
    else:
        # submitit's local controller passes SIGTERM on to the training and waits for it (a Ctrl-C's SIGINT
        # kills the training a second later, and a script's background job ignores it)
        lines.append(f"  stop:   kill -TERM {job.job_id}   (the job's process on this machine: the training saves a "
                     "checkpoint, then stops)")
    return lines


def unstartable(job_id: str, checks: int = 3, poll_seconds: float = 1.0) -> str | None:
    """Why the SLURM job ``job_id``, just submitted, can never start as asked
    (:meth:`~gwdet.cluster.slurm.JobState.never_starts`), from its state in the first seconds (the
    controller gives the reason when it first schedules); ``None`` when it may run."""
    for check in range(checks):
        state = job_states([job_id]).get(job_id)
        if state is None or state.state != "PENDING":
            return None
        if state.reason:
            return state.never_starts()
        if check + 1 < checks:
            time.sleep(poll_seconds)
    return None


def active_jobs_in(folder: Path) -> list[str]:
    """The SLURM jobs of ``folder`` (submitit's ``<job id>/`` folders) that are still queued or running."""
    ids = [entry.name for entry in folder.iterdir() if entry.is_dir() and entry.name.isdigit()] if folder.is_dir() else []
    return sorted(job_id for job_id, state in job_states(ids).items() if state.active)


def wait(job: "submitit.Job", launcher: str, poll_seconds: float = POLL_SECONDS) -> Any:
    """Wait for the job to end (requeues included) and return its result; ``RuntimeError`` with the
    job's error, or with its last state and log path when it ended without a result."""
    if launcher == "slurm":
        ended_since = None
        while not job.paths.result_pickle.exists():
            state = job_states([job.job_id]).get(job.job_id)
            stuck = state.never_starts() if state is not None else None
            if stuck is not None:
                raise GwdetRuntimeError(f"stopped waiting: {stuck}")
            if state is not None and state.active:
                ended_since = None
            elif ended_since is None:
                ended_since, last_state = time.monotonic(), state
            elif time.monotonic() - ended_since > RESULT_GRACE_SECONDS:
                shown = last_state.state if last_state else "no longer known to SLURM"
                raise GwdetRuntimeError(f"job {job.job_id} ended ({shown}) without a result; see {job.paths.stdout} "
                                        f"and {job.paths.stderr}")
            time.sleep(poll_seconds)
    else:
        while not job.done():
            time.sleep(poll_seconds)
    error = job.exception()
    if error is not None:
        refusal = _gwdet_refusal(str(error))
        if refusal is not None:
            raise JobRefused(refusal)
        raise GwdetRuntimeError(f"job {job.job_id} failed: {error}")
    return job.result()


class JobRefused(GwdetError, RuntimeError):
    """The job's training refused its request (a :class:`~gwdet.errors.GwdetError`, whose message this
    is), as it would have here."""


_GWDET_ERROR_LINE = re.compile(r"^gwdet\.[\w.]+: ", re.MULTILINE)


def _gwdet_refusal(trace: str) -> str | None:
    """The message of the gwdet error a job's traceback ``trace`` ends with (submitit reports a job's
    exception as its traceback text), or ``None`` for another error."""
    found = list(_GWDET_ERROR_LINE.finditer(trace))
    return trace[found[-1].end():].strip() if found else None
