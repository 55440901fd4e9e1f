"""The op-count level (``--op-counts``): what one forward + backward of each layer dispatches under
each execution plan (:mod:`gwdet.layers.plans`), counted on any device by
:mod:`~gwdet_lab.benchmark.op_counts`, and the ``accelerator`` plan's peak memory against GN's.

Counted at the layer level's shapes plus the box head with 2048 proposals (the same operations as
at 512 for the ``accelerator`` and ``triton`` plans). The ``triton`` plan runs its kernels in
Triton's interpreter on a CPU (``tools/benchmark.py --op-counts`` sets ``TRITON_INTERPRET=1``
before Triton is imported), at :data:`INTERPRETED_SAMPLES` samples at most (:func:`run_shape`); a
kernel launch counts as one operation. The GPU cost model of
:mod:`~gwdet_lab.benchmark.gpu_cost` turns these counts into predicted times.
"""
from __future__ import annotations

import argparse
import os
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

import gwdet
from gwdet.layers.plans import PLAN_VARIABLE
from gwdet.layers.plans.triton_plan import fallback_reason
from gwdet_lab.tables import Column, Table
from gwdet_lab.benchmark.cases import (
    CONV, GN, GW_ITN, AutogradGroupWhitening, format_shape, input_view, layer_factories,
)
from gwdet_lab.benchmark.layer_level import layer_shapes
from gwdet_lab.benchmark.measure import peak_memory, training_call
from gwdet_lab.benchmark.op_counts import OperationCount, count_operations
from gwdet_lab.benchmark.progress import Progress

Shape = Tuple[int, ...]
# (name, factory(channels, input_dim), plan forced while it runs; None: the layer has no plans)
OpCase = Tuple[str, Callable[[int, int], nn.Module], Optional[str]]

BOX_HEAD_2048: Shape = (2048, 256, 7, 7)
INTERPRETED_SAMPLES = 16
GW_AUTOGRAD_CASE = "GW autograd"


def _bw_itn(channels: int, dim: int) -> nn.Module:
    return gwdet.norm("BW_ItN")(channels)


def op_cases() -> List[OpCase]:
    """The counted cases: the convolution and GN(32) as yardsticks, GW (ItN, g=64, T=5) under each
    plan and as the autograd formulas (how the paper's code runs it), BW (ZCA) and BW_ItN."""
    factories = layer_factories(include_autograd=False)
    return [
        (CONV, factories[CONV], None),
        (GN, factories[GN], None),
        (GW_AUTOGRAD_CASE, lambda c, dim: AutogradGroupWhitening(c), None),
        *((f"GW {plan}", factories[GW_ITN], plan) for plan in ("cpu", "accelerator", "triton")),
        *((f"BW {plan}", factories["BW"], plan) for plan in ("cpu", "accelerator")),
        *((f"BW_ItN {plan}", _bw_itn, plan) for plan in ("cpu", "accelerator", "triton")),
    ]


MEMORY_CASES = (GN, "GW cpu", "GW accelerator", "GW triton")


def run_shape(plan: Optional[str], shape: Shape, device: torch.device) -> Shape:
    """The shape a case runs at: ``shape``, except for the ``triton`` plan off CUDA (its kernels in
    Triton's interpreter, about 0.1 to 0.3 s of CPU per 64 x 64 matrix and direction), which runs
    :data:`INTERPRETED_SAMPLES` samples at most; its launches do not depend on the sample count
    (tests/test_triton_kernels.py), its bytes and memory are scaled to ``shape`` (:func:`count_case`,
    :func:`run_op_counts`)."""
    if plan == "triton" and device.type != "cuda":
        return (min(shape[0], INTERPRETED_SAMPLES), *shape[1:])
    return tuple(shape)


def count_case(case: OpCase, shape: Shape, device: torch.device) -> OperationCount:
    """One forward + backward of ``case`` at ``shape`` on ``device``, counted (after one uncounted
    call, which also compiles Triton kernels), under the case's plan (at :func:`run_shape`, the
    bytes scaled to ``shape``)."""
    name, factory, plan = case
    ran = run_shape(plan, shape, device)
    with forced_plan(plan):
        call = _training_call(name, factory, ran, device)
        call()
        counted = count_operations(call)
    counted.bytes_moved = counted.bytes_moved * shape[0] // ran[0]
    return counted


def _training_call(name: str, factory, shape: Shape, device: torch.device) -> Callable[[], None]:
    torch.manual_seed(0)
    view = input_view(name, shape)
    module = factory(shape[1], len(shape)).to(device).train()
    x = torch.randn(view, device=device, requires_grad=True)
    return training_call(module, x, torch.randn(view, device=device))


class forced_plan:
    """``GWDET_GW_PLAN=plan`` inside the block (nothing for ``None``), the variable restored after."""

    def __init__(self, plan: Optional[str]) -> None:
        self.plan, self.before = plan, None

    def __enter__(self) -> None:
        self.before = os.environ.get(PLAN_VARIABLE)
        if self.plan is not None:
            os.environ[PLAN_VARIABLE] = self.plan

    def __exit__(self, *exc) -> None:
        if self.before is None:
            os.environ.pop(PLAN_VARIABLE, None)
        else:
            os.environ[PLAN_VARIABLE] = self.before


def op_count_shapes(quick: bool) -> List[Tuple[str, Shape]]:
    """The layer level's shapes, and the box head with 2048 proposals (unless ``quick``)."""
    shapes = list(layer_shapes(quick))
    return shapes if quick else shapes + [("ROI heads, 2048 proposals", BOX_HEAD_2048)]


def run_op_counts(args: argparse.Namespace, device: torch.device) -> dict:
    """``{"shapes", "names", "counts", "memory", "quick", "fallback"}``: counts keyed by
    ``(shape, name)``, peak bytes keyed the same for :data:`MEMORY_CASES`, whether the shapes are
    the quick ones, the Triton fallback reason (or None)."""
    shapes = op_count_shapes(args.quick)
    cases = op_cases()
    progress = Progress([1.0] * len(shapes) * (len(cases) + len(MEMORY_CASES)))
    results: dict = {"shapes": shapes, "names": [name for name, _, _ in cases], "counts": {}, "memory": {},
                     "quick": args.quick}
    by_name = {case[0]: case for case in cases}
    for _, shape in shapes:
        for case in cases:
            counted = count_case(case, shape, device)
            results["counts"][(shape, case[0])] = counted
            progress.step(f"ops {case[0]} {shape}", f"{counted.total} ({counted.host_syncs} syncs)")
        for name in MEMORY_CASES:
            case = by_name[name]
            ran = run_shape(case[2], shape, device)
            with forced_plan(case[2]):
                nbytes = peak_memory(_training_call(name, case[1], ran, device), device) * shape[0] // ran[0]
            results["memory"][(shape, name)] = nbytes
            progress.step(f"memory {name} {shape}", f"{nbytes / 2**20:.1f} MiB")
    results["fallback"] = fallback_reason()
    return results


def describe_count(counted: OperationCount) -> str:
    """``"140"``, ``"49 + 2 Triton"``, with ``", 2 syncs"`` when it synchronises with the host."""
    text = str(counted.pytorch_operations)
    kernels = sum(counted.triton_kernels.values())
    if kernels:
        text += f" + {kernels} Triton"
    if counted.host_syncs:
        text += f", {counted.host_syncs} syncs"
    return text


def op_count_table(results: dict) -> Table:
    names = results["names"]
    table = Table([Column("shape"), Column("where"), *(Column(name, align_right=True) for name in names)])
    for where, shape in results["shapes"]:
        row = {"shape": format_shape(shape), "where": where}
        row.update({name: describe_count(results["counts"][(shape, name)]) for name in names})
        table.add(row)
    return table


def memory_table(results: dict) -> Table:
    table = Table([Column("shape"), *(Column(name, align_right=True) for name in MEMORY_CASES)])
    for _, shape in results["shapes"]:
        reference = results["memory"][(shape, GN)]
        row = {"shape": format_shape(shape)}
        for name in MEMORY_CASES:
            nbytes = results["memory"][(shape, name)]
            row[name] = f"{nbytes / 2**20:.1f} ({nbytes / max(reference, 1):.2f})"
        table.add(row)
    return table


def op_count_tables(results: dict) -> str:
    """The op-count level's markdown: operations per plan and shape, peak memory, the cost model."""
    from gwdet_lab.benchmark.gpu_cost import cost_tables

    fallback = results.get("fallback")
    lines = [
        "#### Dispatched operations per forward + backward", "",
        "Kernel-launching PyTorch operations (views, metadata and allocations excluded; "
        "gwdet_lab/benchmark/op_counts.py) of one forward + backward, Triton kernel launches and host "
        "synchronisations (`aten::_local_scalar_dense`). GW: ItN, g=64, T=5; BW: ZCA, groups of 16; "
        "BW_ItN: ItN, groups of 16. `cpu`, `accelerator`, `triton`: the execution plan "
        "(`GWDET_GW_PLAN`); `GW autograd`: the formulas differentiated by autograd, as the paper's code runs.", "",
        op_count_table(results).markdown(), "",
        *([f"The Triton kernels fell back to the accelerator plan: {fallback}.", ""] if fallback else []),
        "#### Peak memory of forward + backward, by plan", "",
        f"Peak MiB allocated above the input, output gradient and parameters; in parentheses the ratio to {GN}. "
        f"Off CUDA the triton plan runs at most {INTERPRETED_SAMPLES} samples (its kernels in Triton's interpreter), "
        "its bytes and peak scaled to the shape's sample count.", "",
        memory_table(results).markdown(), "",
        cost_tables(results),
    ]
    return "\n".join(lines) + "\n"


def layer_count(name: str, shape: Shape, device: torch.device) -> OperationCount:
    """Count the case ``name`` of :func:`op_cases` at ``shape`` (for the cost model's step sums)."""
    cases: Dict[str, OpCase] = {case[0]: case for case in op_cases()}
    cases["BN"] = ("BN", layer_factories(include_autograd=False)["BN"], None)
    return count_case(cases[name], shape, device)
