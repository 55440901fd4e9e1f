"""Which implementation a gwdet layer runs, depending on how PyTorch is looking at it.

1. Eager mode, ``torch.compile`` and ``torch.export``: GW runs the custom op
   ``gwdet::group_whitening`` (fused forward, closed-form backward op); BW and BGN their tensor
   code. A ``torch.library`` custom op with registered fake (shape) and autograd kernels is
   opaque to Dynamo and AOTAutograd: it compiles with ``fullgraph=True`` and exports with its
   backward.
2. ``torch.jit.script``: the reference formulas (plain tensor ops); TorchScript compiles Python
   source, and the custom op's kernels are Python.
3. ``torch.jit.trace`` and ``torch.onnx.export``: the reference formulas. A deployment graph should
   hold only ATen operators: the saved TorchScript then loads in a process that never imported
   gwdet (or detectron2), and every operator maps onto ONNX. GW ZCA needs ``linalg_eigh``, which
   TorchScript has and ONNX does not (the ONNX export then stops with an error naming the ItN
   alternatives).
4. ``torch.jit.trace`` inside :func:`trace_named_ops`: one named custom op per layer,
   ``gwdet::group_whitening``, ``gwdet::batch_whitening``, ``gwdet::batch_group_norm``. fvcore
   counts a traced graph operator by operator; a named op per layer lets
   :mod:`gwdet.export.flops` count each layer with :mod:`gwdet.layers.cost`. Such a trace is for
   counting only: running it needs gwdet loaded.

The functions here are for eager Python code; the layers call them outside TorchScript only.
"""
import contextlib
import contextvars
from typing import Callable, Iterator, Sequence

import torch
from torch import Tensor

_NAMED_OPS = contextvars.ContextVar("gwdet_trace_named_ops", default=False)


@contextlib.contextmanager
def trace_named_ops() -> Iterator[None]:
    """Inside this block ``torch.jit.trace`` records every gwdet layer as one named custom op
    (for flop counting, see :mod:`gwdet.export.flops`); outside it, as the reference formulas."""
    token = _NAMED_OPS.set(True)
    try:
        yield
    finally:
        _NAMED_OPS.reset(token)


@torch.jit.unused
def onnx_exporting() -> bool:
    """True while ``torch.onnx.export`` (TorchScript-based or ``dynamo=True``) captures the model."""
    return bool(torch.onnx.is_in_onnx_export())


@torch.jit.unused
def tracing_named_ops() -> bool:
    """True while ``torch.jit.trace`` records inside :func:`trace_named_ops` (not for ONNX)."""
    return torch.jit.is_tracing() and _NAMED_OPS.get() and not onnx_exporting()


@torch.jit.unused
def recording_reference_graph() -> bool:
    """True while ``torch.jit.trace`` (outside :func:`trace_named_ops`) or ``torch.onnx.export``
    records a graph: the layers then run their reference formulas, which are plain ATen ops."""
    if onnx_exporting():
        return True
    return torch.jit.is_tracing() and not _NAMED_OPS.get()


def counting_op(name: str, function: Callable[..., Tensor], mutates_args: Sequence[str], schema: str):
    """Register ``function`` (a layer's functional form) as the custom op ``name`` with the given
    schema: the one node a layer leaves in a trace recorded inside :func:`trace_named_ops`.

    The op has a fake (shape) kernel and no autograd kernel (the layers call it under
    ``torch.no_grad()``, for counting); its output is a fresh contiguous tensor, as a custom op's
    must be (no alias of an input, the strides the fake kernel gives).
    """

    def implementation(*args) -> Tensor:
        out = function(*args)
        return out.clone() if out is args[0] else out.contiguous()

    op = torch.library.custom_op(name, implementation, mutates_args=tuple(mutates_args), schema=schema)
    op.register_fake(lambda x, *args: x.new_empty(x.shape))
    return op
