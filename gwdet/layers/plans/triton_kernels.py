"""Triton kernels for the ``g x g`` Newton iterations of ItN whitening and their backward.

One program per matrix keeps the matrix and every iterate in registers (a FlashAttention-style
rule: 64 x 64 float32 is 16 KB) and loops over the ``T`` iterations there, so all the matrices of
a call take one launch per direction instead of ``3T - 3`` (forward) or ``9T - 9`` (backward)
batched products and their elementwise glue.

* :func:`itn_whitening_kernel`: ``W = P_T / sqrt(tau)`` (GW Eqs. 6-7 with ``tau = tr(Sigma)``),
  in the ``Q_k = P_k^2 Sigma_N`` form of :func:`gwdet.layers.whitening_matrix.itn_whitening`;
* :func:`itn_whitening_vjp_kernel`: ``W`` and ``dL/dSigma`` for ``dL/dW`` (GW Eqs. 18-19 in the
  forward-mode form of :func:`gwdet.layers.whitening_matrix.itn_whitening_vjp`, which derives it).

Matrices are ``(n, size, size)`` float32, contiguous; a program works on a ``BLOCK x BLOCK`` tile
(``BLOCK`` a power of two from 16, ``tl.dot``'s smallest size, to :data:`MAX_BLOCK`), padded with
zeros: the identity is restricted to the ``size`` real rows, so every iterate stays zero outside
them and the real block is exactly the iteration on ``size x size`` matrices. Products use
``input_precision="ieee"`` (float32 FMA, as ``torch.bmm`` with TF32 off; TF32's 10-bit mantissa
would cost the iteration three decimal digits). The trace the iteration normalizes by is
``tr(Sigma) + offset``, ``offset = offset_coefficient * offsets[i * offset_stride] +
offset_value`` (a caller iterating on an ``m x m`` Gram matrix passes the trace of the ``g x g``
covariance, see :mod:`gwdet.layers.group_whitening_function`, "Few columns").

No argument is specialised on its value or alignment (``do_not_specialize``), so the kernels a
layer launches are exactly one compiled variant per ``BLOCK``: :data:`LAUNCH_CONFIGURATIONS`,
which ``tests/test_triton_compile.py`` compiles ahead of time for sm_70, sm_80 and sm_90.
"""
from typing import Dict, Tuple

import triton
import triton.language as tl

MAX_BLOCK = 64
# Warps per program for each tile size, and the register cap that lets all of them be resident
# (65536 registers per multiprocessor on sm_70 to sm_90, at most 255 a thread). Without the cap
# ptxas gave the 64 x 64 backward kernel 32 registers and spilled the rest to local memory.
WARPS = {16: 4, 32: 8, 64: 16}


def launch_options(block: int) -> Dict[str, int]:
    """``num_warps`` and ``maxnreg`` for a ``block x block`` tile (launch and compile alike)."""
    warps = WARPS[block]
    return {"num_warps": warps, "maxnreg": min(255, 65536 // (32 * warps))}
_UNSPECIALISED = ["size", "iterations", "offset_stride"]
_UNALIGNED = ["cov_ptr", "grad_ptr", "offsets_ptr", "whitening_ptr", "grad_cov_ptr"]


@triton.jit
def _dot(a, b):
    return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _load_matrix(ptr, matrix, size, BLOCK: tl.constexpr, TRANSPOSED: tl.constexpr):
    """The ``matrix``-th ``size x size`` matrix at ``ptr`` (or its transpose), zero-padded."""
    rows = tl.arange(0, BLOCK)[:, None]
    cols = tl.arange(0, BLOCK)[None, :]
    base = matrix.to(tl.int64) * size * size
    if TRANSPOSED:
        offsets = base + cols * size + rows
    else:
        offsets = base + rows * size + cols
    return tl.load(ptr + offsets, mask=(rows < size) & (cols < size), other=0.0)


@triton.jit
def _store_matrix(ptr, value, matrix, size, BLOCK: tl.constexpr):
    rows = tl.arange(0, BLOCK)[:, None]
    cols = tl.arange(0, BLOCK)[None, :]
    offsets = matrix.to(tl.int64) * size * size + rows * size + cols
    tl.store(ptr + offsets, value, mask=(rows < size) & (cols < size))


@triton.jit
def _identity(size, BLOCK: tl.constexpr):
    rows = tl.arange(0, BLOCK)[:, None]
    cols = tl.arange(0, BLOCK)[None, :]
    return tl.where((rows == cols) & (rows < size), 1.0, 0.0)


@triton.jit
def _trace(cov, eye, offsets_ptr, offset_stride, offset_coefficient, offset_value, matrix):
    """``tr(cov) + offset`` (module docstring); the offset's load is skipped by ``tl.where``'s
    choice, not its evaluation, so a non-finite value behind an unused pointer cannot leak in."""
    extra = tl.load(offsets_ptr + matrix.to(tl.int64) * offset_stride)
    offset = tl.where(offset_coefficient != 0.0, offset_coefficient * extra, 0.0) + offset_value
    return tl.sum(tl.sum(cov * eye, axis=1), axis=0) + offset


@triton.jit(do_not_specialize=_UNSPECIALISED, do_not_specialize_on_alignment=_UNALIGNED)
def itn_whitening_kernel(
    cov_ptr, offsets_ptr, whitening_ptr, size, iterations, offset_stride, offset_coefficient, offset_value,
    BLOCK: tl.constexpr,
):
    """``W = P_T(Sigma_N) / sqrt(tau)`` for the matrix of this program (GW Eqs. 6-7): with
    ``R_k = (3I - Q_k) / 2``, ``P_{k+1} = P_k R_k`` and ``Q_{k+1} = (Q_k R_k) R_k`` from
    ``P_0 = I``, ``Q_0 = Sigma_N = Sigma / tau``."""
    matrix = tl.program_id(0)
    eye = _identity(size, BLOCK)
    cov = _load_matrix(cov_ptr, matrix, size, BLOCK, False)
    trace = _trace(cov, eye, offsets_ptr, offset_stride, offset_coefficient, offset_value, matrix)
    a = cov / trace
    r = 1.5 * eye - 0.5 * a
    p = r
    if iterations > 1:
        q = _dot(_dot(a, r), r)
        for k in range(1, iterations):
            r = 1.5 * eye - 0.5 * q
            p = _dot(p, r)
            if k < iterations - 1:
                q = _dot(_dot(q, r), r)
    _store_matrix(whitening_ptr, p / tl.sqrt(trace), matrix, size, BLOCK)


@triton.jit(do_not_specialize=_UNSPECIALISED, do_not_specialize_on_alignment=_UNALIGNED)
def itn_whitening_vjp_kernel(
    cov_ptr, grad_ptr, offsets_ptr, whitening_ptr, grad_cov_ptr, size, iterations, offset_stride,
    offset_coefficient, offset_value, BLOCK: tl.constexpr,
):
    """``W`` and ``dL/dSigma`` (symmetric) for ``G = dL/dW`` of this program's matrix.

    ``E = sym(G) / sqrt(tau)`` is pushed through the iteration in forward mode, carrying
    ``dP / s`` with ``s = -1/2`` (``dR = -dQ / 2``, ``d(QR) = dQ R + Q dR``); then
    ``dL/dSigma = -dP / (2 tau) - (<dL/dSigma_N, Sigma_N> / tau + <G, P_T> / (2 tau^{3/2})) I``.
    ``Sigma`` and ``G`` are read again for the two inner products rather than kept in registers
    through the iteration.
    """
    matrix = tl.program_id(0)
    eye = _identity(size, BLOCK)
    cov = _load_matrix(cov_ptr, matrix, size, BLOCK, False)
    trace = _trace(cov, eye, offsets_ptr, offset_stride, offset_coefficient, offset_value, matrix)
    root = tl.sqrt(trace)
    a = cov / trace
    grad = _load_matrix(grad_ptr, matrix, size, BLOCK, False)
    e = (grad + _load_matrix(grad_ptr, matrix, size, BLOCK, True)) * (0.5 / root)
    r = 1.5 * eye - 0.5 * a
    p = r
    dp = e
    if iterations > 1:
        ar = _dot(a, r)
        dar = _dot(e, r) - 0.5 * _dot(a, e)
        q = _dot(ar, r)
        dq = _dot(dar, r) - 0.5 * _dot(ar, e)
        for k in range(1, iterations):
            r = 1.5 * eye - 0.5 * q
            dp = _dot(dp, r) + _dot(p, dq)
            p = _dot(p, r)
            if k < iterations - 1:
                qr = _dot(q, r)
                dqr = _dot(dq, r) - 0.5 * _dot(q, dq)
                q = _dot(qr, r)
                dq = _dot(dqr, r) - 0.5 * _dot(qr, dq)
    grad_cov = dp * (-0.5 / trace)
    shift = tl.sum(tl.sum(grad_cov * _load_matrix(cov_ptr, matrix, size, BLOCK, False), axis=1), axis=0) / trace
    grad_p = _load_matrix(grad_ptr, matrix, size, BLOCK, False) * p
    shift += 0.5 * tl.sum(tl.sum(grad_p, axis=1), axis=0) / (trace * root)
    _store_matrix(whitening_ptr, p / root, matrix, size, BLOCK)
    _store_matrix(grad_cov_ptr, grad_cov - shift * eye, matrix, size, BLOCK)


def block_size(size: int) -> int:
    """The tile a ``size x size`` matrix is padded to: the next power of two, at least 16."""
    return max(16, triton.next_power_of_2(size))


# Every (kernel, BLOCK) the layers launch, with the signature its arguments have (float32
# matrices, 32-bit sizes) and the launch options; the ahead-of-time compile test reads this.
SIGNATURES: Dict[str, Dict[str, str]] = {
    "itn_whitening_kernel": {
        "cov_ptr": "*fp32", "offsets_ptr": "*fp32", "whitening_ptr": "*fp32", "size": "i32",
        "iterations": "i32", "offset_stride": "i32", "offset_coefficient": "fp32", "offset_value": "fp32",
    },
    "itn_whitening_vjp_kernel": {
        "cov_ptr": "*fp32", "grad_ptr": "*fp32", "offsets_ptr": "*fp32", "whitening_ptr": "*fp32",
        "grad_cov_ptr": "*fp32", "size": "i32", "iterations": "i32", "offset_stride": "i32",
        "offset_coefficient": "fp32", "offset_value": "fp32",
    },
}
KERNELS = {"itn_whitening_kernel": itn_whitening_kernel, "itn_whitening_vjp_kernel": itn_whitening_vjp_kernel}
LAUNCH_CONFIGURATIONS: Tuple[Tuple[str, int], ...] = tuple((name, block) for name in KERNELS for block in WARPS)
