"""CPU thread settings for gwdet's entry points (``tools/train_net.py``, ``tools/compare_norms.py``,
``tools/benchmark.py``): how many threads PyTorch uses and how idle threads wait.

On a machine that another CPU-bound process shares, PyTorch's defaults collapse. Its OpenMP pool
(GNU OpenMP on Linux) has as many threads as cores, and a thread that finishes its share of a
parallel region spins on the CPU for a while before it sleeps, waiting for the others. When one of
them is descheduled in favour of the other process, the spinning threads burn their time slices
waiting for it, and every parallel region costs a scheduler time slice. Group whitening runs many
small parallel operations, so it suffers most (docs/benchmarks.md, "Busy machine").

Two settings avoid that:

* the wait policy: ``OMP_WAIT_POLICY=PASSIVE`` makes idle OpenMP threads sleep at once. GNU
  OpenMP reads it once, when PyTorch loads it, so an entry point sets it before importing torch
  (:data:`WAIT_POLICY_VARIABLE`, :data:`DEFAULT_WAIT_POLICY`); a value the user exported is kept;
* the thread count (:func:`choose_threads`): the CPUs this process may use, less those that other
  processes keep busy (the 1-minute load average), shared among the processes the run starts.
  ``--threads N`` or ``OMP_NUM_THREADS`` chooses it instead.

The thread count changes the order of some floating-point sums, so results can differ in the last
bits between thread counts; the chosen count is printed so that a run can be repeated with it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Mapping, MutableMapping

import torch

WAIT_POLICY_VARIABLE = "OMP_WAIT_POLICY"
DEFAULT_WAIT_POLICY = "PASSIVE"
THREADS_VARIABLE = "OMP_NUM_THREADS"


@dataclass(frozen=True)
class ThreadChoice:
    """How many threads each process uses, and why."""

    threads: int
    reason: str

    def describe(self, environ: Mapping[str, str] = os.environ) -> str:
        """One line for the log: the count, its reason and the wait policy in effect."""
        policy = environ.get(WAIT_POLICY_VARIABLE)
        waiting = (f"{WAIT_POLICY_VARIABLE}={policy}" if policy else
                   f"{WAIT_POLICY_VARIABLE} unset (idle threads spin; set it to {DEFAULT_WAIT_POLICY} "
                   "before torch is imported on a shared machine)")
        return (f"CPU threads: {self.threads} per process ({self.reason}); {waiting}. "
                f"Override with --threads N or {THREADS_VARIABLE}.")


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def busy_cpus() -> int:
    """CPUs that other processes keep busy: the 1-minute load average, rounded (0 where the OS
    has none)."""
    try:
        return round(os.getloadavg()[0])
    except (AttributeError, OSError):
        return 0


def choose_threads(
    requested: int | None = None,
    processes: int = 1,
    environ: Mapping[str, str] = os.environ,
    cpus: Callable[[], int] = usable_cpus,
    busy: Callable[[], int] = busy_cpus,
) -> ThreadChoice:
    """Threads per process: ``requested`` if given, else ``OMP_NUM_THREADS``, else the usable CPUs
    that other processes leave free, divided among ``processes`` (at least 1)."""
    if processes < 1:
        raise ValueError(f"processes must be at least 1, got {processes}")
    if requested is not None:
        if requested < 1:
            raise ValueError(f"--threads must be at least 1, got {requested}")
        return ThreadChoice(requested, "--threads")
    if environ.get(THREADS_VARIABLE):
        value = environ[THREADS_VARIABLE]
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"{THREADS_VARIABLE}={value!r} is not a positive integer: unset it or set it to a "
                             "number of threads such as 1")
        return ThreadChoice(int(value), f"from {THREADS_VARIABLE}")
    usable, taken = cpus(), busy()
    free = max(1, usable - taken)
    threads = max(1, free // processes)
    reason = f"{usable} usable CPUs, about {taken} busy with other processes (1-minute load average)"
    if processes > 1:
        reason += f", shared by {processes} processes"
    return ThreadChoice(threads, reason)


def apply_threads(choice: ThreadChoice, environ: MutableMapping[str, str] = os.environ) -> None:
    """Use ``choice`` in this process (``torch.set_num_threads``) and in the processes it starts
    afterwards (``OMP_NUM_THREADS``/``MKL_NUM_THREADS``, read when they import torch)."""
    torch.set_num_threads(choice.threads)
    environ[THREADS_VARIABLE] = environ["MKL_NUM_THREADS"] = str(choice.threads)


def configure_threads(requested: int | None = None, processes: int = 1, log: Callable[[str], None] = print) -> ThreadChoice:
    """:func:`choose_threads`, :func:`apply_threads`, and one line to ``log`` saying what was chosen."""
    choice = choose_threads(requested, processes)
    apply_threads(choice)
    log(choice.describe())
    return choice
