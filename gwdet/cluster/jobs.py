"""What gwdet's submitit jobs share: where this node sits in the job, and requeueing on a signal.

A gwdet job runs one task per node, which starts the node's training processes with detectron2's
launch (:func:`gwdet.engine.launch.launch`) as ``tools/train_net.py --num-gpus N`` does on one
machine, so a job runs the same code as a local run. :class:`NodePlacement` reads this node's rank,
the number of nodes and the first node's name from submitit's ``JobEnvironment``.

Preemption and time limits follow submitit's checkpoint protocol: on the job's signal (SIGUSR2)
submitit calls the job's ``checkpoint()``, which returns the same job marked as requeued, after
gwdet's trainer has saved the iteration in progress (:mod:`gwdet.checkpoint.signal_hook`). A
requeued job, also one SLURM itself requeued (``SLURM_RESTART_COUNT``), continues with ``--resume``.
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import time
import zlib
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from submitit.helpers import DelayedSubmission

PORT_BASE, PORT_SPAN = 20000, 20000
STOP_SECONDS = 60.0  # how long the training processes get to save their checkpoint and end
LOCAL_EXECUTOR = "local"


@dataclass(frozen=True)
class NodePlacement:
    """This node's place in a running job."""

    job_id: str
    machine_rank: int
    num_machines: int
    first_node: str
    restarts: int

    @classmethod
    def from_environment(cls) -> "NodePlacement":
        """Read from the job's environment (only inside a submitit job)."""
        import submitit

        environment = submitit.JobEnvironment()
        return cls(str(environment.job_id), environment.node, environment.num_nodes,
                   environment.hostnames[0], int(os.environ.get("SLURM_RESTART_COUNT") or 0))

    @property
    def dist_url(self) -> str:
        """``auto`` (a free local port) on one node; otherwise a port on the first node derived from
        the job id and restart count, so every node computes the same one without talking."""
        if self.num_machines == 1:
            return "auto"
        port = PORT_BASE + zlib.crc32(f"{self.job_id}:{self.restarts}".encode()) % PORT_SPAN
        return f"tcp://{self.first_node}:{port}"

    def machine_flags(self) -> list[str]:
        """``tools/train_net.py`` flags that place this node's processes in the job."""
        return ["--num-machines", str(self.num_machines), "--machine-rank", str(self.machine_rank),
                "--dist-url", self.dist_url]

    def describe(self) -> str:
        text = f"job {self.job_id}, node {self.machine_rank} of {self.num_machines}"
        return text + (f", restart {self.restarts}" if self.restarts else "")


@dataclass(frozen=True)
class RequeueableJob:
    """Base of gwdet's submitit jobs: ``checkpoint()`` resubmits the job, marked ``requeued``."""

    requeued: bool = field(default=False, kw_only=True)

    def __call__(self) -> object:
        """The job's work, run where submitit starts it; each kind of job defines its own."""
        raise NotImplementedError(f"{type(self).__name__} defines no __call__")

    def resumes(self, placement: NodePlacement) -> bool:
        """Whether this run continues an earlier one: requeued by its own checkpoint or by SLURM."""
        return self.requeued or placement.restarts > 0

    def checkpoint(self, *args: object, **kwargs: object) -> "DelayedSubmission":
        """submitit's hook on the job's signal: let the training processes end, then hand back the
        job to run after the requeue (the same job, continuing from its newest checkpoint)."""
        import submitit

        stop_spawned_processes()
        return submitit.helpers.DelayedSubmission(replace(self, requeued=True))


def earlier_result() -> tuple[bool, Any]:
    """Whether this node's task of the running job ended successfully before (submitit's result file
    of the task holds a result, not an error: a finished job that SLURM requeued, e.g. after its
    controller restarted), and that result."""
    import submitit
    from submitit.core.utils import pickle_load

    path = submitit.JobEnvironment().paths.result_pickle
    if not path.is_file():
        return False, None
    outcome, result = pickle_load(path)
    return outcome == "success", result


def honour_stop_requests() -> None:
    """In a job of submitit's local executor, SIGTERM ends the job's process (its default action, as
    in a run started here) until the training takes it over to save a checkpoint first: submitit's
    handler, which ignores it (SLURM's own SIGTERM after a requeue), would drop the stop the launcher
    tells the user to send (``kill -TERM <job id>``, which the executor's controller passes on)."""
    if os.environ.get("SUBMITIT_EXECUTOR") == LOCAL_EXECUTOR:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def stop_spawned_processes(timeout: float = STOP_SECONDS) -> None:
    """Give the training processes this one started (detectron2's launch with several processes)
    ``timeout`` seconds to save and end, then stop what is left.

    They are this process's non-daemonic children; DataLoader workers are daemonic and end with the
    process that reads from them. SLURM delivers a job's signal to every process of the job step, so
    the training processes already have it; the local executor signals only the job's own process,
    so there it is passed on to them.
    """
    children = [child for child in multiprocessing.active_children() if not child.daemon]
    if not children:
        return
    if os.environ.get("SUBMITIT_EXECUTOR") == LOCAL_EXECUTOR:
        for child in children:
            if child.pid is not None:  # always set: active children have been started
                os.kill(child.pid, signal.SIGUSR2)
    deadline = time.monotonic() + timeout
    for child in children:
        child.join(max(deadline - time.monotonic(), 0.0))
    for child in (child for child in children if child.is_alive()):
        child.terminate()
        child.join(10)
        if child.is_alive():
            child.kill()
