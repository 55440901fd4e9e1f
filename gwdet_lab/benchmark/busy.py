"""Competing CPU-bound processes for ``--busy N``: a reproducible busy machine.

:func:`competing_load` starts ``N`` Python processes that each keep one core busy with a plain
loop, and stops them when its block ends, by an error or Ctrl-C included. Each process also
watches its parent: when the benchmark dies without running its clean-up (``kill -9``), the
process sees that it has been handed to another parent and exits, so none is left behind.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from typing import Iterator, List

from gwdet.errors import GwdetValueError

# argv[1]: the benchmark's process id. A million empty iterations take a few tens of milliseconds,
# so the loop notices within that time that its parent is gone.
BUSY_LOOP = """
import os, sys
parent = int(sys.argv[1])
while os.getppid() == parent:
    for _ in range(1000000):
        pass
"""
STOP_SECONDS = 5.0

# the most competing processes --busy starts per CPU
BUSY_PER_CPU = 8


def start_busy_process() -> subprocess.Popen:
    """One process looping on one core until it is stopped or its parent (this process) exits."""
    return subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", BUSY_LOOP, str(os.getpid())],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def stop_processes(processes: List[subprocess.Popen]) -> None:
    """Terminate ``processes`` and wait for them (killing any that outlasts :data:`STOP_SECONDS`)."""
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def too_many_busy(processes: int) -> str | None:
    """Why ``--busy processes`` is refused when it is more than :data:`BUSY_PER_CPU` per CPU of this
    machine; ``None`` otherwise."""
    cpus = os.cpu_count() or 1
    if processes <= BUSY_PER_CPU * cpus:
        return None
    return (f"--busy {processes} is more than {BUSY_PER_CPU} competing processes per CPU ({cpus} CPUs here): the "
            "measurement would be of the machine's scheduler, and everything else on it would crawl. Give --busy from "
            f"0 to {BUSY_PER_CPU * cpus}.")


@contextlib.contextmanager
def competing_load(processes: int) -> Iterator[List[subprocess.Popen]]:
    """``with competing_load(n) as started:`` ``n`` busy processes run while the block runs."""
    if processes < 0:
        raise GwdetValueError(f"--busy takes a number of competing processes >= 0, got {processes}")
    too_many = too_many_busy(processes)
    if too_many is not None:
        raise GwdetValueError(too_many)
    started: List[subprocess.Popen] = []
    try:
        for _ in range(processes):
            started.append(start_busy_process())
        yield started
    finally:
        stop_processes(started)


def describe_load(processes: int) -> str:
    """The report's words for ``--busy N``."""
    plural = "es" if processes != 1 else ""
    return f"with {processes} competing CPU-bound process{plural} (`--busy {processes}`: a Python loop each)"
