"""How many device operations a call dispatches: the proxy for its kernel launches on a GPU.

On a GPU every PyTorch operation that touches tensor data is at least one kernel launch of several
microseconds, so a layer made of many small operations is launch-bound however few flops it has.
This module counts those operations on any device (a CPU included) with ``torch.profiler``:

* an *operation* is an ``aten::`` event none of whose enclosing events is an ``aten::`` event or a
  Triton kernel (what the calling code dispatched; an operation's internal calls are not counted
  again);
* it is *kernel-launching* unless it and everything it calls are views, metadata or allocations
  (:data:`FREE_OPERATIONS`): ``aten::to`` or ``aten::contiguous`` count when they copy, never when
  they return their input;
* a region recorded as ``triton::<kernel>`` (``torch.profiler.record_function``, as
  :mod:`gwdet.layers.plans.triton` labels its launches) counts as one Triton kernel, whatever it
  runs inside (the Triton interpreter copies tensors there);
* ``aten::_local_scalar_dense`` is a host synchronisation (``.item()``, ``bool(tensor)``): on a GPU
  the host waits for the device there, and a CUDA graph cannot be captured;
* the bytes an operation moves are estimated from the shapes the profiler records: it reads its
  tensor inputs and writes as much as its largest input (exact for elementwise operations, an
  overestimate for reductions); Triton kernels, which read and write ``g x g`` matrices, count 0.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from torch.profiler import ProfilerActivity, profile

FREE_OPERATIONS = frozenset({
    # views
    "aten::alias", "aten::as_strided", "aten::chunk", "aten::detach", "aten::detach_", "aten::diagonal",
    "aten::expand", "aten::expand_as", "aten::flatten", "aten::narrow", "aten::permute", "aten::reshape",
    "aten::_reshape_alias", "aten::select", "aten::slice", "aten::split", "aten::squeeze", "aten::t",
    "aten::transpose", "aten::unflatten", "aten::unsqueeze", "aten::_unsafe_view", "aten::view",
    "aten::view_as", "aten::unbind",
    # metadata and allocation
    "aten::contiguous", "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::lift_fresh",
    "aten::new_empty", "aten::new_empty_strided", "aten::resize_", "aten::resolve_conj", "aten::resolve_neg",
    "aten::result_type", "aten::set_", "aten::to",
})
HOST_SYNC = "aten::_local_scalar_dense"
TRITON_PREFIX = "triton::"
# bytes per value of the dtype names the profiler records (others: 4)
DTYPE_BYTES = {"double": 8, "long int": 8, "c10::Half": 2, "c10::BFloat16": 2, "bool": 1, "unsigned char": 1}


@dataclass
class OperationCount:
    """Kernel-launching operations by name, Triton kernels by name, host synchronisations and the
    estimated bytes the operations move (module docstring)."""

    operations: Counter = field(default_factory=Counter)
    triton_kernels: Counter = field(default_factory=Counter)
    host_syncs: int = 0
    bytes_moved: int = 0

    @property
    def total(self) -> int:
        """PyTorch operations plus Triton kernels: the launches of the call."""
        return sum(self.operations.values()) + sum(self.triton_kernels.values())

    @property
    def pytorch_operations(self) -> int:
        return sum(self.operations.values())


def _launches(event) -> bool:
    """Whether the ``aten::`` event ``event`` or an ``aten::`` operation it calls does more than
    views, metadata and allocation (its other children are the profiler's internal labels)."""
    if event.name not in FREE_OPERATIONS:
        return True
    return any(_launches(child) for child in event.cpu_children if child.name.startswith("aten::"))


def _count(events: Iterable, result: OperationCount) -> None:
    for event in events:
        name = event.name
        if name.startswith(TRITON_PREFIX):
            result.triton_kernels[name[len(TRITON_PREFIX):]] += 1
        elif name.startswith("aten::"):
            if _launches(event):
                result.operations[name] += 1
                result.bytes_moved += _bytes_moved(event.input_shapes, event.input_dtypes)
            result.host_syncs += _syncs(event)
        else:
            _count(event.cpu_children, result)


def _bytes_moved(shapes: Sequence, dtypes: Sequence) -> int:
    """Inputs read plus the largest written once (module docstring); 0 without recorded shapes."""
    sizes = [math.prod(shape) * DTYPE_BYTES.get(dtype, 4)
             for shape, dtype in zip(shapes or (), dtypes or (), strict=True) if shape and dtype not in ("", "Scalar")]
    return sum(sizes) + max(sizes, default=0)


def _syncs(event) -> int:
    return (event.name == HOST_SYNC) + sum(_syncs(child) for child in event.cpu_children)


def count_operations(fn: Callable[[], object]) -> OperationCount:
    """The operations ``fn()`` dispatches (module docstring), counted from its profile."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        fn()
    result = OperationCount()
    _count([event for event in prof.events() if event.cpu_parent is None], result)
    return result
