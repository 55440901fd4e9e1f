"""CPU thread settings for gwdet's entry points (``tools/train_net.py``, ``tools/compare_norms.py``,
``tools/benchmark.py``): how many threads PyTorch uses and how idle threads wait.

On a machine that another CPU-bound process shares, PyTorch's defaults collapse. Its OpenMP pool
(GNU OpenMP on Linux) has as many threads as cores, and a thread that finishes its share of a
parallel region spins on the CPU for a while before it sleeps, waiting for the others. When one of
them is descheduled in favour of the other process, the spinning threads burn their time slices
waiting for it. Group whitening runs many small parallel operations, so it suffers most.

So the thread count (:func:`choose_threads`) is the CPUs this process may use less those that
other processes keep busy when the tool starts (:func:`busy_cpus`: the kernel's count of runnable
tasks, sampled for a moment), shared among the processes the run starts, at least 1.
``--threads N`` or ``OMP_NUM_THREADS`` chooses it instead; the choice is printed, because the thread
count changes the order of some floating-point sums and so the last bits of results.

The OpenMP wait policy is left as the user's environment sets it. Measured on the project's 2-core
machine (docs/benchmarks.md, "Busy machine"), ``OMP_WAIT_POLICY=PASSIVE`` (idle threads sleep at
once) avoids most of the collapse when a competing process starts after the tool, but makes a demo
training step 1.7x slower on an idle machine, slower than one thread; so it is advice for machines
whose load comes and goes, not a default.
"""
from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Mapping, MutableMapping

import torch

WAIT_POLICY_VARIABLE = "OMP_WAIT_POLICY"
THREADS_VARIABLE = "OMP_NUM_THREADS"


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
                f"Override with --threads N or {THREADS_VARIABLE}.")


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


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


def choose_threads(
    requested: int | None = None,
    processes: int = 1,
    environ: Mapping[str, str] = os.environ,
    cpus: Callable[[], int] = usable_cpus,
    busy: Callable[[], int] = busy_cpus,
) -> ThreadChoice:
    """Threads per process: ``requested`` if given, else ``OMP_NUM_THREADS``, else the usable CPUs
    other processes leave free, divided among ``processes`` (at least 1)."""
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
    threads = max(1, max(1, usable - taken) // processes)
    reason = f"{usable} usable CPUs, {taken} busy with other processes at start"
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
