"""CPU thread settings for gwdet's entry points (``tools/train_net.py``, ``tools/compare_norms.py``,
``tools/benchmark.py``): how many threads PyTorch uses.

The thread count of a process (:func:`choose_threads`), first that applies:

1. ``--threads N``: N (:func:`check_thread_count` refuses a count far above the usable CPUs);
2. ``--threads auto-load``: the CPUs this process may use less those other processes keep busy
   when the tool starts (:func:`busy_cpus`: the kernel's count of runnable tasks in
   ``/proc/loadavg``, sampled for a moment), so it depends on the machine's load at that moment;
3. ``OMP_NUM_THREADS``;
4. by default, the CPUs this process may use (:func:`cpu_limits`): the smallest of its affinity
   mask (``os.sched_getaffinity``), its cgroup's CPU quota (cgroup v2 ``cpu.max``, cgroup v1
   ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, of the process's own cgroup and the cgroups
   above it, rounded down, at least 1) and ``SLURM_CPUS_PER_TASK``; without any of them,
   ``os.cpu_count()``. It does not depend on what else runs on the machine.

A choice other than ``--threads N`` is divided among the processes a run starts on this machine
(``--num-gpus``; the study's ``--jobs``), at least 1 each. The choice is logged, because the thread
count changes the order of some floating-point sums and so the last bits of results. The OpenMP
wait policy (``OMP_WAIT_POLICY``) is left as the user's environment sets it; docs/benchmarks.md
("Busy machine") has the measurements behind these rules.
"""
from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, MutableMapping, Union

import torch

from gwdet.errors import GwdetValueError

WAIT_POLICY_VARIABLE = "OMP_WAIT_POLICY"
THREADS_VARIABLE = "OMP_NUM_THREADS"
SLURM_VARIABLE = "SLURM_CPUS_PER_TASK"
AUTO_LOAD = "auto-load"
PROC_CGROUP = Path("/proc/self/cgroup")
PROC_MOUNTINFO = Path("/proc/self/mountinfo")

# --threads: a number of threads, AUTO_LOAD, or None (the default rule)
ThreadRequest = Union[int, str, None]


def thread_request(text: str) -> int | str:
    """``--threads``'s argparse type: an integer (its range is the tool's to check) or ``auto-load``."""
    if text == AUTO_LOAD:
        return AUTO_LOAD
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a number of threads nor {AUTO_LOAD}: give --threads N (N >= 1) or --threads "
            f"{AUTO_LOAD} (the CPUs other processes leave free at start)") from None


@dataclass(frozen=True)
class ThreadChoice:
    """How many threads each process uses, and why."""

    threads: int
    reason: str

    def describe(self, environ: Mapping[str, str] = os.environ) -> str:
        """One line for the log: the count, its reason and the wait policy in effect."""
        policy = environ.get(WAIT_POLICY_VARIABLE) or "unset (OpenMP's default: idle threads spin a while)"
        waiting = f"{WAIT_POLICY_VARIABLE} {policy}"
        return (f"CPU threads: {self.threads} per process ({self.reason}); {waiting}. "
                f"Override with --threads N, --threads {AUTO_LOAD} or {THREADS_VARIABLE}.")


# ---- the CPUs this process may use ------------------------------------------------------------


def read_cpu_max(path: Path) -> float | None:
    """The CPUs a cgroup v2 ``cpu.max`` file (``"$MAX $PERIOD"``, ``"max $PERIOD"`` without a
    limit) allows; ``None`` without a limit or without the file. ``ValueError`` names a file of
    another format."""
    try:
        fields = path.read_text().split()
    except FileNotFoundError:
        return None
    if len(fields) == 2 and fields[0] == "max" and fields[1].isdigit():
        return None
    if len(fields) == 2 and all(field.isdigit() for field in fields) and int(fields[1]) > 0:
        return int(fields[0]) / int(fields[1])
    raise GwdetValueError(f"{path} holds {' '.join(fields)!r}, not a cgroup v2 CPU limit ('QUOTA PERIOD' or 'max "
                          f"PERIOD'): choose the thread count with --threads N or {THREADS_VARIABLE}.")


def read_cfs_quota(folder: Path) -> float | None:
    """The CPUs a cgroup v1 ``cpu`` folder's ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` allow;
    ``None`` without a limit (quota -1) or without the files. ``ValueError`` names a file of
    another format."""
    quota_file, period_file = folder / "cpu.cfs_quota_us", folder / "cpu.cfs_period_us"
    try:
        quota, period = quota_file.read_text().strip(), period_file.read_text().strip()
    except FileNotFoundError:
        return None
    if quota == "-1":
        return None
    if quota.isdigit() and period.isdigit() and int(period) > 0:
        return int(quota) / int(period)
    raise GwdetValueError(f"{quota_file} ({quota!r}) and {period_file} ({period!r}) are not a cgroup v1 CPU limit: "
                          f"choose the thread count with --threads N or {THREADS_VARIABLE}.")


@dataclass(frozen=True)
class _Mount:
    root: str
    point: Path
    version: int  # 2: the unified hierarchy, 1: a v1 hierarchy with the cpu controller


_ESCAPE = re.compile(r"\\([0-7]{3})")


def _cgroup_mounts(mountinfo: Path) -> list[_Mount]:
    """The cgroup2 mounts and the cgroup v1 mounts of the ``cpu`` controller listed in ``mountinfo``
    (``/proc/self/mountinfo``: ``ID PARENT MAJOR:MINOR ROOT POINT OPTIONS [OPTIONAL...] - TYPE
    SOURCE SUPER_OPTIONS``; spaces in paths written as ``\\040``)."""
    mounts = []
    for line in mountinfo.read_text().splitlines():
        fields = line.split()
        if "-" not in fields[6:]:
            continue
        separator = fields.index("-", 6)
        kind, options = fields[separator + 1], fields[separator + 3].split(",") if len(fields) > separator + 3 else []
        root, point = (_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field) for field in fields[3:5])
        if kind == "cgroup2":
            mounts.append(_Mount(root, Path(point), 2))
        elif kind == "cgroup" and "cpu" in options:
            mounts.append(_Mount(root, Path(point), 1))
    return mounts


def _cgroup_paths(proc_cgroup: Path) -> dict[int, str]:
    """The process's cgroup in the unified hierarchy (key 2: the ``0::PATH`` line) and in the v1
    hierarchy of the ``cpu`` controller (key 1), from ``proc_cgroup`` (``/proc/self/cgroup``)."""
    paths = {}
    for line in proc_cgroup.read_text().splitlines():
        hierarchy, controllers, path = line.split(":", 2)
        if hierarchy == "0" and controllers == "":
            paths[2] = path
        elif "cpu" in controllers.split(","):
            paths[1] = path
    return paths


def _folders_up(mount: _Mount, path: str) -> list[Path]:
    """The folders of cgroup ``path`` and of every cgroup above it, within ``mount``; none when the
    cgroup is outside what ``mount`` shows."""
    root = mount.root.rstrip("/")
    if root and path != root and not path.startswith(root + "/"):
        return []
    relative = Path(path[len(root):].lstrip("/"))
    return [mount.point / relative, *(mount.point / above for above in relative.parents)]


def cgroup_cpu_quota(proc_cgroup: Path = PROC_CGROUP, mountinfo: Path = PROC_MOUNTINFO) -> float | None:
    """The CPUs the cgroup CPU quota allows this process: the smallest limit set on its cgroup or
    a cgroup above it, in the unified (v2) hierarchy and the v1 ``cpu`` hierarchy, found through
    ``proc_cgroup`` and ``mountinfo``; ``None`` when no limit is set or the files are not there."""
    try:
        paths, mounts = _cgroup_paths(proc_cgroup), _cgroup_mounts(mountinfo)
    except FileNotFoundError:
        return None
    limits = []
    for mount in mounts:
        if mount.version not in paths:
            continue
        for folder in _folders_up(mount, paths[mount.version]):
            limit = read_cpu_max(folder / "cpu.max") if mount.version == 2 else read_cfs_quota(folder)
            if limit is not None:
                limits.append(limit)
    return min(limits, default=None)


def affinity_cpus() -> int | None:
    """The CPUs of this process's affinity mask; ``None`` where the OS has none."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


def slurm_cpus(environ: Mapping[str, str] = os.environ) -> int | None:
    """``SLURM_CPUS_PER_TASK`` of ``environ``; ``None`` when unset; ``ValueError`` when it is not a
    positive integer."""
    value = environ.get(SLURM_VARIABLE)
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise GwdetValueError(f"{SLURM_VARIABLE}={value!r} is not a positive integer: unset it, or choose the thread "
                              f"count with --threads N or {THREADS_VARIABLE}.")
    return int(value)


@dataclass(frozen=True)
class CpuLimits:
    """What limits the CPUs this process may use: ``None`` where a limit does not apply."""

    affinity: int | None
    cgroup_quota: float | None
    slurm_cpus_per_task: int | None

    def usable(self) -> int:
        """The smallest limit (a fractional quota rounded down, at least 1); ``os.cpu_count()``
        when none applies."""
        quota = None if self.cgroup_quota is None else max(1, math.floor(self.cgroup_quota))
        limits = [limit for limit in (self.affinity, quota, self.slurm_cpus_per_task) if limit is not None]
        return min(limits) if limits else os.cpu_count() or 1

    def describe(self) -> str:
        """``"N CPUs this process may use (affinity mask A, cgroup CPU quota Q, SLURM_CPUS_PER_TASK S)"``,
        naming the limits that apply."""
        parts = [f"affinity mask {self.affinity}" if self.affinity is not None else None,
                 f"cgroup CPU quota {self.cgroup_quota:g}" if self.cgroup_quota is not None else None,
                 f"{SLURM_VARIABLE} {self.slurm_cpus_per_task}" if self.slurm_cpus_per_task is not None else None]
        named = ", ".join(part for part in parts if part) or "os.cpu_count()"
        usable = self.usable()
        return f"{usable} CPU{'' if usable == 1 else 's'} this process may use ({named})"


def cpu_limits(environ: Mapping[str, str] = os.environ, proc_cgroup: Path = PROC_CGROUP,
               mountinfo: Path = PROC_MOUNTINFO) -> CpuLimits:
    """The affinity mask, the cgroup CPU quota (read through ``proc_cgroup`` and ``mountinfo``) and
    ``SLURM_CPUS_PER_TASK`` of ``environ``."""
    return CpuLimits(affinity_cpus(), cgroup_cpu_quota(proc_cgroup, mountinfo), slurm_cpus(environ))


def usable_cpus() -> int:
    """The CPUs this process may use (:func:`cpu_limits`)."""
    return cpu_limits().usable()


def busy_cpus(samples: int = 10, interval: float = 0.02) -> int:
    """CPUs other processes keep busy now: the median, over ``samples`` readings of
    ``/proc/loadavg``, of the runnable tasks less this process (0 where the OS has no such file)."""
    counts = []
    for _ in range(samples):
        try:
            with open("/proc/loadavg") as loadavg:
                counts.append(int(loadavg.read().split()[3].split("/")[0]))
        except (OSError, IndexError, ValueError):
            return 0
        time.sleep(interval)
    return max(0, round(statistics.median(counts)) - 1)


# ---- the choice ------------------------------------------------------------------------------


# --threads N above this many times the usable CPUs is refused: no count anyone means, and PyTorch
# stops with a MemoryError while it starts threads by the hundred thousand
OVERSUBSCRIPTION_LIMIT = 16


def check_thread_count(requested: int, limits: Callable[[], CpuLimits]) -> str:
    """Raise ``ValueError`` for ``--threads N`` below 1 or above :data:`OVERSUBSCRIPTION_LIMIT`
    times the CPUs this process may use (``limits``; where those cannot be read, which ``--threads
    N`` is the way around, its affinity mask or ``os.cpu_count()``); the reason to log for N: more
    than the usable CPUs is allowed (a thread count of another machine, repeated for its
    floating-point sums) and said."""
    if requested < 1:
        raise GwdetValueError(f"--threads must be at least 1, got {requested}")
    try:
        found = limits()
    except GwdetValueError:  # an unreadable cgroup file or SLURM_CPUS_PER_TASK
        found = CpuLimits(affinity_cpus(), None, None)
    if requested > OVERSUBSCRIPTION_LIMIT * found.usable():
        raise GwdetValueError(
            f"--threads {requested} is more than {OVERSUBSCRIPTION_LIMIT} times the {found.describe()}: give --threads "
            f"{found.usable()} or fewer (more threads than CPUs only take turns on them), or leave --threads out to "
            "use one thread per usable CPU.")
    if requested > found.usable():
        return f"--threads, more than the {found.describe()}: the threads take turns on them"
    return "--threads"


def choose_threads(
    requested: ThreadRequest = None,
    processes: int = 1,
    environ: Mapping[str, str] = os.environ,
    limits: Callable[[], CpuLimits] | None = None,
    busy: Callable[[], int] = busy_cpus,
) -> ThreadChoice:
    """Threads per process (the module docstring's rules): ``requested`` (a number, or
    ``"auto-load"``: the usable CPUs ``busy`` leaves free), else ``OMP_NUM_THREADS`` of ``environ``,
    else the usable CPUs (``limits``, default :func:`cpu_limits` of ``environ``); all but a number
    divided among ``processes``, at least 1."""
    if processes < 1:
        raise ValueError(f"processes must be at least 1, got {processes}")
    shared = f", shared by {processes} processes" if processes > 1 else ""
    usable = (limits or (lambda: cpu_limits(environ)))
    if isinstance(requested, int):
        return ThreadChoice(requested, check_thread_count(requested, usable))
    if requested is not None and requested != AUTO_LOAD:
        raise GwdetValueError(f"--threads {requested!r}: give a number of threads (at least 1) or {AUTO_LOAD}")
    if requested == AUTO_LOAD:
        cpus, taken = usable().usable(), busy()
        return ThreadChoice(max(1, max(1, cpus - taken) // processes),
                            f"--threads {AUTO_LOAD}: {cpus} usable CPUs, {taken} busy with other processes at start{shared}")
    if environ.get(THREADS_VARIABLE):
        value = environ[THREADS_VARIABLE]
        if not value.isdigit() or int(value) < 1:
            raise GwdetValueError(f"{THREADS_VARIABLE}={value!r} is not a positive integer: unset it or set it to a "
                                  "number of threads such as 1")
        return ThreadChoice(int(value), f"from {THREADS_VARIABLE}")
    found = usable()
    return ThreadChoice(max(1, found.usable() // processes), found.describe() + shared)


def apply_threads(choice: ThreadChoice, environ: MutableMapping[str, str] = os.environ) -> None:
    """Use ``choice`` in this process (``torch.set_num_threads``) and in the processes it starts
    afterwards (``OMP_NUM_THREADS``/``MKL_NUM_THREADS``, read when they import torch)."""
    torch.set_num_threads(choice.threads)
    environ[THREADS_VARIABLE] = environ["MKL_NUM_THREADS"] = str(choice.threads)


# OpenMP's thread binding settings (GNU's and Intel's too): each process binds its threads to the
# places they give, counted from the first in every process alike
BINDING_VARIABLES = ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY", "KMP_AFFINITY")


def binding_note(processes: int, environ: Mapping[str, str] = os.environ) -> str | None:
    """A line for the log when ``processes`` CPU processes of one machine would each bind their
    threads by the settings of :data:`BINDING_VARIABLES` in ``environ`` (as HPC module set-ups
    export them): every process binds to the same first CPUs, which they then share; ``None`` for
    one process or no binding."""
    bound = [name for name in BINDING_VARIABLES
             if environ.get(name) and environ[name].strip().lower() not in ("false", "disabled", "none")]
    if processes < 2 or not bound:
        return None
    return (f"{', '.join(f'{name}={environ[name]}' for name in bound)}: OpenMP binds the threads of each of the {processes} processes of this machine to the "
            "same CPUs, counted from the first in every process, so they share those CPUs and the others idle (the "
            f"training runs at a fraction of its speed; its results are the same). Unset {' and '.join(bound)} "
            "before starting several CPU processes.")


def configure_threads(requested: ThreadRequest = None, processes: int = 1,
                      log: Callable[[str], None] = print) -> ThreadChoice:
    """:func:`choose_threads`, :func:`apply_threads`, and one line to ``log`` saying what was chosen
    (and one more where several processes would bind their threads to the same CPUs: :func:`binding_note`)."""
    choice = choose_threads(requested, processes)
    apply_threads(choice)
    log(choice.describe())
    note = binding_note(processes)
    if note is not None:
        log(note)
    return choice
