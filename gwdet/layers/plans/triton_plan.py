"""The ``triton`` plan: the ``accelerator`` plan with the ``g x g`` Newton iterations of ItN, forward
and backward, fused into one Triton kernel launch each for all the matrices of a call
(:mod:`.triton_kernels`); the products over the activation stay batched matrix products.

The kernels take float32 matrices of up to :data:`MAX_BLOCK` rows (padded); other matrices
(float64 statistics, larger groups) and ZCA run the ``accelerator`` plan's PyTorch operations. This
plan chooses the launch configuration (:func:`programs`, :func:`input_precision`, :func:`panel_rows`)
and launches under ``torch.cuda.device`` of the tensors, recorded as ``triton::<kernel name>``
(``torch.profiler.record_function``).

Failures: a kernel that cannot be built, loaded or launched on a device (:func:`falls_back` decides
from the exception) is remembered per (kernel, tile, device), warned about once, and its calls there
are computed by the ``accelerator`` formulas, so results never change, only speed. Every other error
propagates: out of memory, an illegal memory access (the CUDA context is then unusable), a wrong
argument.
"""
import contextlib
import os
import subprocess
import warnings
from typing import Callable, ContextManager, Dict, Optional, Tuple, TypeVar, Union

import torch
from torch import Tensor
from torch.profiler import record_function

from gwdet.errors import GwdetRuntimeWarning

from .accelerator import AcceleratorPlan, multiprocessors

MAX_BLOCK = 64  # the largest matrices the kernels take
# persistent programs per multiprocessor: one computes while the other waits at a barrier (two
# programs of 128 threads fit a multiprocessor's 64K registers)
PROGRAMS_PER_MULTIPROCESSOR = 2
INTERPRETED_PROGRAMS = 2
# (kernel name, tile, device) -> the error that made the plan stop launching that kernel there
_failures: Dict[Tuple[str, int, str], str] = {}
# what the CUDA driver reports (cuGetErrorString, prefixed by Triton's launcher) when a kernel
# cannot be loaded or launched on this GPU; any other CUDA error propagates
CUDA_ERROR_PREFIX = "Triton Error [CUDA]: "
UNLOADABLE = (
    "no kernel image is available",  # CUDA_ERROR_NO_BINARY_FOR_GPU
    "PTX",  # CUDA_ERROR_INVALID_PTX, _UNSUPPORTED_PTX_VERSION, _JIT_COMPILER_NOT_FOUND
    "device kernel image is invalid",  # CUDA_ERROR_INVALID_IMAGE, _INVALID_SOURCE
    "too many resources requested for launch",  # CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
    "named symbol not found",  # CUDA_ERROR_NOT_FOUND (the kernel is not in the module)
)
# Triton's own messages when it cannot build the launcher of a kernel (triton/runtime/build.py)
NO_COMPILER = ("Failed to find C compiler", "Failed to find C++ compiler")


class KernelUnavailable(RuntimeError):
    """Triton cannot launch on the tensors' device (a CPU tensor without Triton's interpreter)."""


def fallback_reason() -> Optional[str]:
    """Why this process runs the ``accelerator`` formulas in place of some Triton kernels: one
    ``kernel (tile N) on device: error`` entry per failed (kernel, tile, device), or None."""
    if not _failures:
        return None
    return "; ".join(f"{kernel} (tile {tile}) on {device}: {error}"
                     for (kernel, tile, device), error in _failures.items())


def falls_back(error: BaseException) -> bool:
    """Whether ``error``, raised while compiling, loading or launching a Triton kernel, means that
    kernel cannot run on this device: Triton's compile, resource and ``ptxas`` errors, an import
    error, a failed or missing C compiler, the CUDA driver refusing the kernel image, and
    :class:`KernelUnavailable`; not out of memory or anything else."""
    if isinstance(error, torch.OutOfMemoryError):
        return False
    if isinstance(error, (KernelUnavailable, ImportError, subprocess.CalledProcessError)):
        return True
    if _is_triton_build_error(error):
        return True
    if type(error) is RuntimeError:
        message = str(error)
        if message.startswith(CUDA_ERROR_PREFIX):
            return any(reason in message[len(CUDA_ERROR_PREFIX):] for reason in UNLOADABLE)
        return message.startswith(NO_COMPILER)
    return False


def _is_triton_build_error(error: BaseException) -> bool:
    try:
        from triton.compiler.errors import CompilationError
        from triton.runtime.errors import OutOfResources, PTXASError
    except ImportError:  # no Triton: none of its errors can have been raised
        return False
    return isinstance(error, (CompilationError, OutOfResources, PTXASError))


def _remember(key: Tuple[str, int, str], error: BaseException) -> None:
    kernel, tile, device = key
    _failures[key] = f"{type(error).__name__}: {error}"
    warnings.warn(
        f"gwdet: the Triton kernel {kernel} (tile {tile}) cannot run on {device} ({_failures[key]}); "
        "the 'triton' plan computes its calls there by the 'accelerator' plan's operations from now on "
        "(the same results, more kernel launches).",
        GwdetRuntimeWarning,
        stacklevel=2,
    )


def _offset_arguments(cov: Tensor, trace_offset: Union[float, Tensor]) -> Tuple[Tensor, int, float, float]:
    """``(offsets, stride, coefficient, value)`` of the kernels' trace offset: one value per
    matrix from a tensor, or a number (``cov`` then stands in for the unread pointer)."""
    if isinstance(trace_offset, Tensor):
        offsets = trace_offset.to(cov.dtype).contiguous()
        return offsets, 1 if offsets.numel() > 1 else 0, 1.0, 0.0
    return cov, 0, 0.0, float(trace_offset)


def on_device(tensor: Tensor) -> ContextManager:
    """``torch.cuda.device(tensor.device)`` for a CUDA tensor (Triton launches on the current
    device), a context that does nothing otherwise."""
    if tensor.is_cuda:
        return torch.cuda.device(tensor.device)
    return contextlib.nullcontext()


def _check_launchable(tensor: Tensor) -> None:
    """Raise :class:`KernelUnavailable` unless Triton can launch on ``tensor``'s device."""
    if not tensor.is_cuda and os.environ.get("TRITON_INTERPRET", "0") != "1":
        raise KernelUnavailable(
            f"Triton kernels run on CUDA tensors, or on CPU tensors in Triton's interpreter "
            f"(TRITON_INTERPRET=1 before Triton is imported); these are on {tensor.device}"
        )


class TritonPlan(AcceleratorPlan):
    """``accelerator`` with the ItN whitening matrix and its gradient by Triton kernels."""

    name = "triton"

    def itn_whitening(self, cov: Tensor, T: int, trace_offset: Union[float, Tensor]) -> Tensor:
        return _with_fallback("itn_whitening_kernel", cov, lambda: _launch_whitening(cov, T, trace_offset),
                              lambda: AcceleratorPlan.itn_whitening(self, cov, T, trace_offset))

    def itn_whitening_vjp(
        self, cov: Tensor, grad: Tensor, T: int, trace_offset: Union[float, Tensor]
    ) -> Tuple[Tensor, Tensor]:
        return _with_fallback("itn_whitening_vjp_kernel", cov, lambda: _launch_whitening_vjp(cov, grad, T, trace_offset),
                              lambda: AcceleratorPlan.itn_whitening_vjp(self, cov, grad, T, trace_offset))


Result = TypeVar("Result")


def _with_fallback(kernel: str, cov: Tensor, launch: Callable[[], Result], fallback: Callable[[], Result]) -> Result:
    """``launch()`` for the matrices ``cov`` unless their (kernel, tile, device) has failed before
    or the kernels do not take them, else ``fallback()``; a failure that :func:`falls_back` is
    remembered and warned about, then computed by ``fallback``, any other error propagates."""
    key = _kernel_key(kernel, cov)
    if key is not None and key not in _failures:
        try:
            return launch()
        except Exception as error:
            if not falls_back(error):
                raise
            _remember(key, error)
    return fallback()


def block_size(size: int) -> int:
    """The tile a ``size x size`` matrix is padded to: the next power of two, at least 16
    (``tl.dot``'s smallest size)."""
    return max(16, 1 << (size - 1).bit_length())


def _kernel_key(kernel: str, cov: Tensor) -> Optional[Tuple[str, int, str]]:
    """``(kernel, tile, device)`` of a call the kernels take (float32 matrices of at most
    :data:`MAX_BLOCK` rows, at least one), else None."""
    size = cov.shape[-1]
    if cov.dtype != torch.float32 or not 0 < size <= MAX_BLOCK or cov.shape[0] == 0:
        return None
    return kernel, block_size(size), str(cov.device)


def input_precision(device: torch.device) -> str:
    """The kernels' ``PRECISION``: ``"tf32x3"`` (tensor cores) on GPUs of compute capability 8.0
    and later and in Triton's interpreter on a CPU (which runs it by NumPy in float32), ``"ieee"``
    (float32 FMA) on older GPUs, which have no TF32."""
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 0):
        return "ieee"
    return "tf32x3"


def programs(device: torch.device, count: int) -> int:
    """Persistent programs for ``count`` matrices: :data:`PROGRAMS_PER_MULTIPROCESSOR` per
    multiprocessor of a GPU (:data:`INTERPRETED_PROGRAMS` in Triton's interpreter), at most one
    per matrix."""
    if device.type == "cuda":
        return min(count, PROGRAMS_PER_MULTIPROCESSOR * multiprocessors(device))
    return min(count, INTERPRETED_PROGRAMS)


def panel_rows(device: torch.device, block: int) -> int:
    """The kernels' ``PANEL``: :data:`~.triton_kernels.ROWS` rows at a time on a GPU (what keeps
    a thread's registers bounded), the whole tile at once in Triton's interpreter, whose cost is
    per operation rather than per element (the same arithmetic in a different order)."""
    return 16 if device.type == "cuda" else block


def _launch_whitening(cov: Tensor, T: int, trace_offset: Union[float, Tensor]) -> Tensor:
    """:func:`~.triton_kernels.triton_itn_whitening` (the op ``gwdet::triton_itn_whitening``) in this
    plan's launch configuration, on the tensors' device, recorded as one kernel."""
    _check_launchable(cov)
    from . import triton_kernels

    cov = cov.contiguous()
    with record_function("triton::itn_whitening_kernel"), on_device(cov):
        return triton_kernels.triton_itn_whitening(cov, *_launch_arguments(cov, T, trace_offset))


def _launch_whitening_vjp(
    cov: Tensor, grad: Tensor, T: int, trace_offset: Union[float, Tensor]
) -> Tuple[Tensor, Tensor]:
    """:func:`~.triton_kernels.triton_itn_whitening_vjp` (the op ``gwdet::triton_itn_whitening_vjp``)
    as :func:`_launch_whitening` launches the forward kernel."""
    _check_launchable(cov)
    from . import triton_kernels

    cov, grad = cov.contiguous(), grad.to(cov.dtype).contiguous()
    with record_function("triton::itn_whitening_vjp_kernel"), on_device(cov):
        return triton_kernels.triton_itn_whitening_vjp(cov, grad, *_launch_arguments(cov, T, trace_offset))


def _launch_arguments(
    cov: Tensor, T: int, trace_offset: Union[float, Tensor]
) -> Tuple[Tensor, int, int, float, float, int, int, int, str]:
    """The kernels' arguments after the matrices, for the contiguous matrices ``cov``: the trace
    offsets (:func:`_offset_arguments`), ``T``, and the launch configuration (programs, panel rows,
    tile, precision)."""
    offsets, stride, coefficient, value = _offset_arguments(cov, trace_offset)
    block = block_size(cov.shape[-1])
    return (offsets, T, stride, coefficient, value, programs(cov.device, cov.shape[0]),
            panel_rows(cov.device, block), block, input_precision(cov.device))
