"""The layer level: forward + backward time and peak memory of every case of :mod:`.cases`.

Per shape, every case is timed once per round, ``repeats`` rounds after ``warmup`` untimed calls
each (:func:`~.measure.timed_rounds`), so that a change of machine load hits all cases of a round
alike; a case's time is its median over rounds and its ratio the median over rounds of its time
divided by the convolution's in that round.
"""
from __future__ import annotations

import argparse
import math
import statistics
from typing import List

import torch

from gwdet_lab.tables import Column, Table
from gwdet_lab.benchmark.cases import (
    CONV,
    GN,
    GN_GROUPS,
    GW_AUTOGRAD,
    GW_GROUPS,
    GW_ITN,
    GW_T,
    LAYER_SHAPES,
    MEMORY_LIMIT,
    QUICK_LAYER_SHAPES,
    TIME_FLOOR,
    TIME_SLACK,
    analytic_ratio,
    format_shape,
    input_view,
    layer_factories,
    time_target,
    verdict,
)
from gwdet_lab.benchmark.measure import median_ratio, peak_memory, timed_rounds, training_call
from gwdet_lab.benchmark.progress import Progress

MIB = 2**20


def layer_shapes(quick: bool) -> list:
    """``[(where, shape)]`` the layer levels run at: tiny shapes with ``--quick``."""
    return QUICK_LAYER_SHAPES if quick else LAYER_SHAPES


def selected_names(args: argparse.Namespace) -> List[str]:
    """The cases ``--norms`` asks for (all by default), the convolution always."""
    factories = layer_factories(include_autograd=not args.no_autograd_gw, include_compiled=args.compile)
    return [name for name in factories if args.norms is None or name in args.norms or name == CONV]


def run_layers(args: argparse.Namespace, device: torch.device) -> dict:
    """``{"shapes", "names", "rounds", "time", "ratio", "memory"}``; the last four keyed by
    ``(shape, name)``: seconds per round, median seconds, median ratio to the conv, peak bytes."""
    shapes = layer_shapes(args.quick)
    factories = layer_factories(include_autograd=not args.no_autograd_gw, include_compiled=args.compile)
    names = selected_names(args)
    # ETA weights: activation size times a rough per-case cost (convolution ~ channels)
    weights = []
    for _, shape in shapes:
        size = math.prod(shape)
        for name in names:
            cost = size * (shape[1] / 16 if name == CONV else 4 if "autograd" in name else 1)
            weights += [cost * (args.warmup + args.repeats), cost]
    progress = Progress(weights)
    results: dict = {"shapes": shapes, "names": names, "rounds": {}, "time": {}, "ratio": {}, "memory": {}}
    for _, shape in shapes:
        generator = torch.Generator().manual_seed(0)
        x_cpu = torch.randn(shape, generator=generator)
        grad_cpu = torch.randn(shape, generator=generator)
        calls = {}
        for name in names:
            torch.manual_seed(0)
            module = factories[name](shape[1], len(shape)).to(device).train()
            view = input_view(name, shape)
            x = x_cpu.to(device).view(view).requires_grad_()
            calls[name] = training_call(module, x, grad_cpu.to(device).view(view))
        rounds = timed_rounds(calls, device, args.warmup, args.repeats, args.clock)
        for name in names:
            results["rounds"][(shape, name)] = rounds[name]
            results["time"][(shape, name)] = statistics.median(rounds[name])
            results["ratio"][(shape, name)] = median_ratio(rounds[name], rounds[CONV])
            progress.step(f"time {name} {tuple(shape)}", f"{results['time'][(shape, name)] * 1e3:.2f} ms")
        for name in names:
            nbytes = peak_memory(calls[name], device)
            results["memory"][(shape, name)] = nbytes
            progress.step(f"memory {name} {tuple(shape)}", f"{nbytes / MIB:.1f} MiB")
        del calls
    return results


def time_table(results: dict) -> Table:
    """Median ms per shape and case; in parentheses the ratio to the convolution."""
    names, times, ratios = results["names"], results["time"], results["ratio"]

    def cell(shape, name: str) -> str:
        milliseconds = f"{times[(shape, name)] * 1e3:.1f}"
        return milliseconds if name == CONV else f"{milliseconds} ({ratios[(shape, name)]:.3f})"

    table = Table([Column("shape"), Column("where"), *(Column(name, align_right=True) for name in names)])
    for where, shape in results["shapes"]:
        table.add({"shape": format_shape(shape), "where": where, **{name: cell(shape, name) for name in names}})
    return table


def memory_table(results: dict) -> Table:
    """Peak MiB per shape and case; in parentheses the ratio to GN(32) (when it was measured)."""
    names, memory = results["names"], results["memory"]
    table = Table([Column("shape"), *(Column(name, align_right=True) for name in names)])
    for _, shape in results["shapes"]:
        reference = memory.get((shape, GN))
        row = {"shape": format_shape(shape)}
        for name in names:
            nbytes = memory[(shape, name)]
            row[name] = f"{nbytes / MIB:.1f}" + (f" ({nbytes / reference:.2f})" if reference else "")
        table.add(row)
    return table


def targets_table(results: dict) -> Table:
    """Per shape: the analytic ratio, the time target, GW (itn) / conv and GW / GN memory, met or not."""
    names, ratios, memory = results["names"], results["ratio"], results["memory"]
    with_autograd = GW_AUTOGRAD in names
    table = Table([
        Column("shape"), Column("analytic", fmt="{:.3f}", align_right=True),
        Column("target", "time target", "{:.2f}", align_right=True),
        Column("ratio", f"{GW_ITN} / conv", "{:.3f}", align_right=True), Column("time_met", "met"),
        *([Column("autograd", "autograd GW / conv (before)", "{:.3f}", align_right=True)] if with_autograd else []),
        Column("memory", "GW mem / GN mem", "{:.2f}", align_right=True), Column("memory_met", "met"),
    ])
    for _, shape in results["shapes"]:
        ratio, target = ratios[(shape, GW_ITN)], time_target(shape)
        memory_ratio = memory[(shape, GW_ITN)] / max(memory[(shape, GN)], 1)
        row = {
            "shape": format_shape(shape), "analytic": analytic_ratio(shape), "target": target, "ratio": ratio,
            "time_met": verdict(ratio, target), "memory": memory_ratio, "memory_met": verdict(memory_ratio, MEMORY_LIMIT),
        }
        if with_autograd:
            row["autograd"] = ratios[(shape, GW_AUTOGRAD)]
        table.add(row)
    return table


def asked_groups(name: str) -> int:
    """The group count case ``name`` asks for: GN's, GW's (every GW case) or 0 for a case without groups
    cut to the channels."""
    if name.startswith(GN):
        return GN_GROUPS
    if name.startswith("GW"):
        return GW_GROUPS
    return 0


def fewer_groups_note(results: dict) -> str:
    """The caption's sentence on the measured cases whose channels at some shape are fewer than the
    groups they ask for (gwdet cuts the count to the channels); empty when there are none."""
    few = [shape for _, shape in results["shapes"]
           if any(shape[1] < asked_groups(name) for name in results["names"])]
    if not few:
        return ""
    asked = [name for name in results["names"] if any(shape[1] < asked_groups(name) for shape in few)]
    groups = ", ".join(f"{name}: {'g=' if name.startswith('GW') else ''}{asked_groups(name)}" for name in asked)
    return (f" At {', '.join(format_shape(shape) for shape in few)} the channels are fewer than the groups asked "
            f"({groups}), so there those layers normalize fewer groups than their names say (gwdet adjusts a "
            "group count to the channels).")


def layer_tables(results: dict) -> str:
    """The layer level's markdown: time, peak memory (in ratio to GN(32) when it ran) and, when GW (itn)
    and GN(32) ran, the targets."""
    adjusted = fewer_groups_note(results)
    lines = [
        "#### Layer level: forward + backward time", "",
        "Median time in ms; in parentheses the median over rounds of the time divided by the 3x3 "
        f"convolution's in the same round (every round times each layer once at that shape).{adjusted}", "",
        time_table(results).markdown(), "",
        "#### Layer level: peak memory of forward + backward", "",
        "Peak MiB allocated above the input, output gradient and parameters; "
        + (f"in parentheses the ratio to {GN}." if GN in results["names"] else
           f"no ratio to {GN}, which was not measured (not in --norms)."), "",
        memory_table(results).markdown(),
    ]
    if GW_ITN in results["names"] and GN in results["names"]:
        lines += [
            "", "#### Layer-level targets", "",
            f"{GW_ITN} (g={GW_GROUPS}, T={GW_T}): time / conv at most max({TIME_FLOOR:.2f}, {TIME_SLACK} x the "
            f"paper's 2g/(9d) + Tg^3/(9HWd^2)); peak memory at most {MEMORY_LIMIT} x {GN}'s.", "",
            targets_table(results).markdown(),
        ]
    return "\n".join(lines) + "\n"
