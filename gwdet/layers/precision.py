"""The precision of the matrix products inside gwdet's operations, whatever the user's settings.

gwdet's layers compute their statistics and whitening in float32 (float64 for float64 input). Two
process-wide settings would silently lower that:

* TensorFloat-32 (``torch.set_float32_matmul_precision("high")``, ``allow_tf32`` or
  ``fp32_precision = "tf32"`` on CUDA, ``torch.backends.mkldnn.matmul.fp32_precision`` on a CPU):
  inside gwdet's custom ops and batch whitening's forward pass :func:`ieee_float32_products` sets
  the device's backend to IEEE float32 and restores the user's value afterwards, also after an
  error. Batch whitening's backward pass is autograd's, after the forward has returned, and a graph
  of ``torch.compile`` cannot read the setting: their products follow the user's.
* Autocast: eager code switches it off (:func:`~.common.autocast_disabled`), but a graph recorded
  by ``torch.jit.trace`` or ``torch.jit.script`` cannot leave its caller's autocast region.
  :func:`float32_matmul` is the product such graphs record: autocast leaves alone products written
  into an ``out=`` tensor and float64 products (AMP documentation, "Autocasting"), so a scripted
  graph writes into ``out=`` or, where it needs the gradient under autocast, computes in float64; a
  traced graph computes in float64.
"""
import contextlib
from typing import Any, Iterator, List

import torch
from torch import Tensor

from .tracing import onnx_exporting

IEEE = "ieee"


def _matmul_backend(device_type: str) -> Any:
    """The ``torch.backends`` object whose ``fp32_precision`` governs float32 products on
    ``device_type`` (None for devices without one)."""
    if device_type == "cuda":
        return torch.backends.cuda.matmul
    if device_type == "cpu":
        return getattr(torch.backends.mkldnn, "matmul", None)
    return None


@contextlib.contextmanager
def ieee_float32_products(device: torch.device) -> Iterator[None]:
    """Float32 products on ``device`` run in IEEE float32 (no TF32, no bfloat16 inside oneDNN)
    while the context is open; the previous setting is restored on exit (module docstring). A
    PyTorch without the per-backend setting (before 2.9) has only CUDA's ``allow_tf32``, which is
    switched off and restored instead."""
    backend = _matmul_backend(device.type)
    if backend is None:
        yield
        return
    previous: Any
    wanted: Any
    if hasattr(backend, "fp32_precision"):
        name, previous, wanted = "fp32_precision", backend.fp32_precision, IEEE
    elif device.type == "cuda":
        name, previous, wanted = "allow_tf32", backend.allow_tf32, False
    else:
        yield
        return
    if previous == wanted:
        yield
        return
    setattr(backend, name, wanted)
    try:
        yield
    finally:
        setattr(backend, name, previous)


def _product_shape(a: Tensor, b: Tensor) -> List[int]:
    """The shape of ``a @ b``: the batch dimensions broadcast, then ``a``'s rows and ``b``'s columns.
    Written out: ``torch.broadcast_shapes`` is no TorchScript builtin in every torch release (2.11:
    ``Unknown builtin op: aten::broadcast_shapes``)."""
    left, right = a.shape[:-2], b.shape[:-2]
    size = max(len(left), len(right))
    batch: List[int] = []
    for i in range(size):
        x = left[i + len(left) - size] if i + len(left) >= size else 1
        y = right[i + len(right) - size] if i + len(right) >= size else 1
        batch.append(y if x == 1 else x)
    return batch + [a.shape[-2], b.shape[-1]]


def _autocast_proof_matmul(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` in the inputs' precision even inside an autocast region, decided when a TorchScript
    graph runs (module docstring).

    Without a gradient to compute, the product goes into an ``out=`` tensor (the same kernel as
    a plain product). With one, a 1 x 1 product shows whether autocast is on for the operands'
    device (asking ``torch.is_autocast_enabled`` inside a TorchScript graph crashes PyTorch's JIT
    autocast pass), and only then the product runs in float64.
    """
    if not (torch.is_grad_enabled() and (a.requires_grad or b.requires_grad)):
        return torch.matmul(a, b, out=torch.empty(_product_shape(a, b), dtype=a.dtype, device=a.device))
    probe = torch.ones([1, 1], dtype=a.dtype, device=a.device)
    if torch.matmul(probe, probe).dtype == a.dtype:
        return torch.matmul(a, b)
    return torch.matmul(a.double(), b.double()).to(a.dtype)


@torch.jit.unused
def _traced_matmul(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` as ``torch.jit.trace`` records it: in float64, rounded back to the operands'
    dtype (module docstring). A trace cannot choose at run time as a scripted graph does, and an
    ``out=`` product can be neither differentiated nor counted by fvcore as ``aten::matmul``."""
    if a.dtype == torch.float64:
        return torch.matmul(a, b)
    return torch.matmul(a.double(), b.double()).to(a.dtype)


def float32_matmul(a: Tensor, b: Tensor) -> Tensor:
    """``torch.matmul(a, b)`` for float32 or float64 operands of the same dtype, computed in
    that dtype also where a recorded graph runs inside an autocast region (module docstring).

    TorchScript compiles :func:`_autocast_proof_matmul` into the graph, which decides when it
    runs; ``torch.jit.trace`` records :func:`_traced_matmul`; eager code (which switches autocast
    off itself) and ``torch.onnx.export`` (ONNX has no autocast) get the plain product.
    """
    if torch.jit.is_scripting():
        return _autocast_proof_matmul(a, b)
    if torch.jit.is_tracing() and not onnx_exporting():
        return _traced_matmul(a, b)
    return torch.matmul(a, b)
