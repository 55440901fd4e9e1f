"""The ``triton`` plan: the ``accelerator`` plan with the ``g x g`` Newton iterations of ItN, forward
and backward, fused into one Triton kernel launch each for all the matrices of a call
(:mod:`.triton_kernels`); the products over the activation stay batched matrix products.

The kernels take float32 matrices of up to :data:`~.triton_kernels.MAX_BLOCK` rows (any size up
to that, padded). Other matrices (float64 statistics, larger groups) and ZCA run the
``accelerator`` plan's PyTorch operations. A kernel that fails (Triton missing, no compiler for
this GPU, a CPU tensor without ``TRITON_INTERPRET=1``, out of resources, ...) makes this process
fall back to the ``accelerator`` plan: once, with a warning naming the error; the call that failed
is computed again that way, so results never change, only speed.

Each launch is recorded as ``triton::<kernel name>`` (``torch.profiler.record_function``), which
names it in a profile and lets :mod:`gwdet_lab.benchmark.op_counts` count it as one launch.
"""
import warnings
from typing import Optional, Tuple, Union

import torch
from torch import Tensor
from torch.profiler import record_function

from .accelerator import AcceleratorPlan

_failure: Optional[str] = None  # the error that made this process give up on the kernels


def fallback_reason() -> Optional[str]:
    """Why this process runs the ``accelerator`` plan in place of ``triton`` (None: it does not)."""
    return _failure


def _fall_back(error: BaseException) -> None:
    global _failure
    _failure = f"{type(error).__name__}: {error}"
    warnings.warn(
        f"gwdet: a Triton kernel of the 'triton' execution plan failed ({_failure}); this process "
        "runs the 'accelerator' plan from now on (the same results, more kernel launches).",
        RuntimeWarning,
        stacklevel=4,
    )


def _offset_arguments(cov: Tensor, trace_offset: Union[float, Tensor]) -> Tuple[Tensor, int, float, float]:
    """``(offsets, stride, coefficient, value)`` of the kernels' trace offset: one value per
    matrix from a tensor, or a number (``cov`` then stands in for the unread pointer)."""
    if isinstance(trace_offset, Tensor):
        offsets = trace_offset.to(cov.dtype).contiguous()
        return offsets, 1 if offsets.numel() > 1 else 0, 1.0, 0.0
    return cov, 0, 0.0, float(trace_offset)


class TritonPlan(AcceleratorPlan):
    """``accelerator`` with the ItN whitening matrix and its gradient by Triton kernels."""

    name = "triton"

    def _runs_kernels(self, cov: Tensor) -> bool:
        return _failure is None and cov.dtype == torch.float32 and cov.shape[-1] <= 64

    def itn_whitening(self, cov: Tensor, T: int, trace_offset: Union[float, Tensor]) -> Tensor:
        if self._runs_kernels(cov):
            try:
                return _launch_whitening(cov, T, trace_offset)
            except Exception as error:  # any failure of Triton: fall back, results unchanged
                _fall_back(error)
        return super().itn_whitening(cov, T, trace_offset)

    def itn_whitening_vjp(
        self, cov: Tensor, grad: Tensor, T: int, trace_offset: Union[float, Tensor]
    ) -> Tuple[Tensor, Tensor]:
        if self._runs_kernels(cov):
            try:
                return _launch_whitening_vjp(cov, grad, T, trace_offset)
            except Exception as error:  # any failure of Triton: fall back, results unchanged
                _fall_back(error)
        return super().itn_whitening_vjp(cov, grad, T, trace_offset)


def _launch_whitening(cov: Tensor, T: int, trace_offset: Union[float, Tensor]) -> Tensor:
    from . import triton_kernels

    cov = cov.contiguous()
    whitening = torch.empty_like(cov)
    count, size = cov.shape[0], cov.shape[-1]
    if count:
        block = triton_kernels.block_size(size)
        offsets, stride, coefficient, value = _offset_arguments(cov, trace_offset)
        with record_function("triton::itn_whitening_kernel"):
            triton_kernels.itn_whitening_kernel[(count,)](
                cov, offsets, whitening, size, T, stride, coefficient, value,
                BLOCK=block, **triton_kernels.launch_options(block),
            )
    return whitening


def _launch_whitening_vjp(
    cov: Tensor, grad: Tensor, T: int, trace_offset: Union[float, Tensor]
) -> Tuple[Tensor, Tensor]:
    from . import triton_kernels

    cov, grad = cov.contiguous(), grad.to(cov.dtype).contiguous()
    whitening, grad_cov = torch.empty_like(cov), torch.empty_like(cov)
    count, size = cov.shape[0], cov.shape[-1]
    if count:
        block = triton_kernels.block_size(size)
        offsets, stride, coefficient, value = _offset_arguments(cov, trace_offset)
        with record_function("triton::itn_whitening_vjp_kernel"):
            triton_kernels.itn_whitening_vjp_kernel[(count,)](
                cov, grad, offsets, whitening, grad_cov, size, T, stride, coefficient, value,
                BLOCK=block, **triton_kernels.launch_options(block),
            )
    return whitening, grad_cov
