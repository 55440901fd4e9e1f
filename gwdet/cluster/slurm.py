"""Talking to SLURM through its own commands: is a controller reachable (``scontrol ping``), and
what state is a job in.

Job states come from ``squeue`` (every job the controller still remembers, finished ones included
for ``MinJobAge``, 300 s by default) and not from ``sacct``, which needs an accounting database that
many small clusters, and the local test cluster (scripts/local_slurm.sh), do not run. A job the
controller has forgotten has no state here: callers decide from the files it left.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Iterable

from gwdet.errors import GwdetError

CLIENT_COMMANDS = ("sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo")
# States in which a job will still run (or is running): see `man squeue`, JOB STATE CODES.
ACTIVE_STATES = frozenset({
    "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD",
    "RESIZING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD", "PREEMPTED",
})
QUERY_SECONDS = 30.0


class ClusterUnavailable(GwdetError, RuntimeError):
    """SLURM cannot be used from here: a command is missing or no controller answers."""


@dataclass(frozen=True)
class JobState:
    """What ``squeue`` says about one job: its state (``RUNNING``, ``COMPLETED``, ...) and reason."""

    job_id: str
    state: str
    reason: str = ""

    @property
    def active(self) -> bool:
        """Queued, running or about to run again (a requeued job counts)."""
        return self.state in ACTIVE_STATES

    def never_starts(self) -> str | None:
        """Why the job, pending, cannot start as it was asked for (:data:`UNSTARTABLE_REASONS`; it
        would wait until an administrator changes the partition), else ``None``."""
        if self.state != "PENDING" or self.reason not in UNSTARTABLE_REASONS:
            return None
        return (f"job {self.job_id} is pending for the reason {self.reason}: {UNSTARTABLE_REASONS[self.reason]}, so "
                f"it will wait as long as the partition stays as it is. Cancel it (scancel {self.job_id}) and submit "
                "it again within the partition's limits (sinfo -o '%P %c %G %l %D' shows CPUs, GPUs, time limit and "
                "nodes), or to another --partition.")


# squeue's reasons of a pending job that asked for more than its partition offers (man squeue, JOB
# REASON CODES), and what each says
UNSTARTABLE_REASONS = {
    "PartitionConfig": "it asks for more than the partition's nodes have (CPUs per task, GPUs, memory) or its "
                       "account may not use the partition",
    "PartitionNodeLimit": "it asks for more nodes than the partition allows",
    "PartitionTimeLimit": "its time limit is above the partition's",
    "BadConstraints": "no node of the partition meets its constraints",
}


def _config_hint() -> str:
    conf = os.environ.get("SLURM_CONF")
    if conf:
        return f"SLURM_CONF={conf}"
    return "SLURM_CONF is not set (SLURM's built-in default config path is used)"


def check_reachable(timeout: float = QUERY_SECONDS) -> None:
    """Raise :class:`ClusterUnavailable` unless SLURM's client commands are on PATH and the controller
    answers ``scontrol ping`` within ``timeout`` seconds. Writes nothing."""
    missing = [name for name in CLIENT_COMMANDS if shutil.which(name) is None]
    if missing:
        raise ClusterUnavailable(
            f"SLURM's command {missing[0]!r} is not on PATH (missing: {', '.join(missing)}): run on a machine "
            "of the cluster (a login node), add SLURM's bin folder to PATH, or use --launcher submitit-local "
            "to run the same job on this machine. For a test cluster on this machine: scripts/local_slurm.sh.")
    conf = os.environ.get("SLURM_CONF")
    if conf and not os.path.isfile(conf):
        raise ClusterUnavailable(f"SLURM_CONF={conf} does not exist: point it at the cluster's slurm.conf "
                                 "(or unset it to use SLURM's default).")
    try:
        answer = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ClusterUnavailable(f"No SLURM controller answered 'scontrol ping' within {timeout:.0f} s "
                                 f"({_config_hint()}): is slurmctld running and reachable?") from None
    if answer.returncode != 0:
        message = [line for line in (answer.stdout + answer.stderr).splitlines() if line.strip(" *")]
        raise ClusterUnavailable(
            f"No SLURM controller answered 'scontrol ping' ({_config_hint()}): "
            f"{message[0].strip() if message else 'no output'}. Check that slurmctld runs and that SLURM_CONF "
            "names its slurm.conf (a test cluster on this machine: scripts/local_slurm.sh start DIR prints "
            "the line to export).")


def partition_has_gpus(partition: str | None = None, timeout: float = QUERY_SECONDS) -> bool:
    """Whether nodes of ``partition`` (default: every partition) offer GPUs: a ``gpu`` GRES in ``sinfo``."""
    command = ["sinfo", "-h", "-o", "%G", *(["-p", partition] if partition else [])]
    try:
        answer = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ClusterUnavailable(f"sinfo did not answer ({_config_hint()}): {error}") from None
    return "gpu" in answer.stdout


def job_states(job_ids: Iterable[str], timeout: float = QUERY_SECONDS) -> dict[str, JobState]:
    """The state of each of ``job_ids`` the controller still knows (one ``squeue`` call); jobs it has
    forgotten are absent. ``ClusterUnavailable`` when ``squeue`` fails."""
    wanted = {str(job_id) for job_id in job_ids}
    if not wanted:
        return {}
    try:
        answer = subprocess.run(["squeue", "-h", "--states=all", "-o", "%i|%T|%r"],
                                capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ClusterUnavailable(f"squeue did not answer ({_config_hint()}): {error}") from None
    if answer.returncode != 0:
        raise ClusterUnavailable(f"squeue failed ({_config_hint()}): {answer.stderr.strip()}")
    states = {}
    for line in answer.stdout.splitlines():
        job_id, _, rest = line.strip().partition("|")
        state, _, reason = rest.partition("|")
        if job_id in wanted:
            states[job_id] = JobState(job_id, state, "" if reason == "None" else reason)
    return states
