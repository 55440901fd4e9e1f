"""Time and peak memory of a call, on CPU or CUDA.

Time is the median over repeated calls after warm-up calls, by wall clock (``time.perf_counter``)
or by the process's CPU time (``time.process_time``, CPU only); CUDA work is synchronized before
and after each call. :func:`timed_rounds` times several calls in interleaved rounds, so that a
change of machine load hits all of them alike, and :func:`median_ratio` divides them round by round.

Peak memory is the most bytes allocated at once during a call, above what was allocated before it:
on CUDA from ``torch.cuda.max_memory_allocated``, on CPU by replaying the allocation events that
``torch.profiler`` records (``profile_memory=True``) in time order.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Dict, List, Mapping

import torch
from torch import nn

from gwdet.errors import GwdetValueError

CLOCKS: Dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (nothing to wait for on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def clock_for(device: torch.device, clock: str) -> Callable[[], float]:
    """The timer for ``clock`` (a key of :data:`CLOCKS`); CUDA always uses wall time."""
    if clock not in CLOCKS:
        raise GwdetValueError(f"clock must be one of {', '.join(sorted(CLOCKS))}, got {clock!r}")
    return CLOCKS["wall" if device.type == "cuda" else clock]


def call_times(fn: Callable[[], None], device: torch.device, warmup: int, repeats: int, clock: str = "wall") -> List[float]:
    """Seconds of each of ``repeats`` calls of ``fn``, after ``warmup`` untimed calls. ``clock="cpu"``
    measures the process's CPU time instead of wall time: on a shared machine with one thread it
    leaves out the time the process waited for a core."""
    timer = clock_for(device, clock)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = timer()
        fn()
        synchronize(device)
        times.append(timer() - start)
    return times


def median_time(fn: Callable[[], None], device: torch.device, warmup: int, repeats: int, clock: str = "wall") -> float:
    """Median of :func:`call_times`."""
    return statistics.median(call_times(fn, device, warmup, repeats, clock))


def timed_rounds(
    calls: Mapping[str, Callable[[], None]], device: torch.device, warmup: int, repeats: int, clock: str = "wall"
) -> Dict[str, List[float]]:
    """``{name: [seconds per round]}``: every call ``warmup`` times untimed, then ``repeats`` rounds
    that each time every call once, in the order given."""
    for fn in calls.values():
        for _ in range(warmup):
            fn()
    rounds: Dict[str, List[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, fn in calls.items():
            rounds[name] += call_times(fn, device, 0, 1, clock)
    return rounds


def median_ratio(times: List[float], reference: List[float]) -> float:
    """Median over rounds of ``times[i] / reference[i]``."""
    if len(times) != len(reference):
        raise ValueError(f"ratio of {len(times)} rounds to {len(reference)} rounds: time both in the same rounds")
    return statistics.median(t / r for t, r in zip(times, reference, strict=True))


def peak_memory(fn: Callable[[], None], device: torch.device) -> int:
    """Most bytes allocated at once during ``fn()`` above the amount allocated before it."""
    if device.type == "cuda":
        synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted(
        (event.start_ns(), event.nbytes())
        for event in prof.profiler.kineto_results.events()
        if event.name() == "[memory]"
    )
    current = peak = 0
    for _, nbytes in events:
        current += nbytes
        peak = max(peak, current)
    return peak


def training_call(module: nn.Module, x: torch.Tensor, grad: torch.Tensor) -> Callable[[], None]:
    """Forward of ``module`` on ``x`` and backward of ``grad`` (input and parameter gradients),
    clearing the gradients afterwards so that every call does the same work."""

    def call() -> None:
        out = module(x)
        out.backward(grad)
        x.grad = None
        for parameter in module.parameters():
            parameter.grad = None

    return call
