"""Triton kernels for the ``g x g`` Newton iterations of ItN whitening and their backward, one launch
per direction for all the matrices of a call.

* :func:`itn_whitening_kernel`: ``W = P_T / sqrt(tau)`` (GW Eqs. 6-7 with ``tau = tr(Sigma)``),
  in the ``Q_k = P_k^2 Sigma_N`` form of :func:`gwdet.layers.whitening_matrix.itn_whitening`;
* :func:`itn_whitening_vjp_kernel`: ``W`` and ``dL/dSigma`` for ``dL/dW`` (GW Eqs. 18-19 in the
  forward-mode form of :func:`gwdet.layers.whitening_matrix.itn_whitening_vjp`, which derives it).

Matrices are ``(n, size, size)`` float32, contiguous; a program works on ``BLOCK x BLOCK`` tiles
(``BLOCK`` a power of two from 16 to 64) padded with zeros, the identity restricted to the ``size``
real rows, so the real block is exactly the iteration on ``size x size`` matrices. The trace the
iteration normalizes by is ``tr(Sigma) + offset``, ``offset = offset_coefficient * offsets[i *
offset_stride] + offset_value`` (the few-columns case of :mod:`gwdet.layers.group_whitening_function`).

The iterates live in a per-program scratch area in global memory (:data:`SLOTS` tiles per program)
and every product streams its operands from there in ``PANEL``-wide slices of the inner dimension
(:func:`_multiply`), so no thread needs local memory. The ``programs`` programs are persistent (they
loop over the matrices); ``tl.debug_barrier()`` separates writing a scratch tile from reading it and
reading it from overwriting it. ``PRECISION`` is ``"tf32x3"`` (``a_hi b_hi + a_hi b_lo + a_lo b_hi``
on TF32 tensor cores) from compute capability 8.0, ``"ieee"`` (float32 FMA) before; plain TF32 is
never used. No argument is specialised (``do_not_specialize``): one compiled variant per (``BLOCK``,
``PRECISION``), :data:`LAUNCH_CONFIGURATIONS`, which ``tests/test_triton_compile.py`` compiles ahead
of time.

The ops ``gwdet::triton_itn_whitening`` and ``gwdet::triton_itn_whitening_vjp`` (``torch.library.triton_op``)
launch the kernels through ``wrap_triton`` (Inductor compiles them with the graph; fake tensors give
shapes without a launch) with the configuration :mod:`.triton_plan` chooses. This module imports
Triton, so gwdet imports it only when a kernel is about to run.
"""
from typing import Dict, Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.library import triton_op, wrap_triton

ROWS = 16  # rows of a panel on a GPU, and inner indices per tl.dot (its smallest size)
WARPS = 4  # per program, at every tile size: a 16 x 64 panel is 8 values per thread
BLOCKS = (16, 32, 64)
SLOTS = {"itn_whitening_kernel": 4, "itn_whitening_vjp_kernel": 7}
# Register ceiling per thread (the most a thread may have), so that ptxas does not trade registers
# for resident programs by spilling to local memory (docs/benchmarks.md).
MAX_REGISTERS = 255


def launch_options(block: int) -> Dict[str, int]:
    """``num_warps`` and ``maxnreg`` for a ``block x block`` tile (launch and compile alike)."""
    return {"num_warps": WARPS, "maxnreg": MAX_REGISTERS}


_UNSPECIALISED = ["count", "size", "iterations", "offset_stride"]
_UNALIGNED = ["cov_ptr", "grad_ptr", "offsets_ptr", "whitening_ptr", "grad_cov_ptr", "scratch_ptr"]


@triton.jit
def _panel(row, PANEL: tl.constexpr, BLOCK: tl.constexpr):
    """Offsets of rows ``row .. row + PANEL - 1`` (all ``BLOCK`` columns) in a scratch tile."""
    return (row + tl.arange(0, PANEL))[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]


@triton.jit
def _identity(row, size, PANEL: tl.constexpr, BLOCK: tl.constexpr):
    """Rows ``row ..`` of the identity restricted to the ``size`` real rows."""
    rows = (row + tl.arange(0, PANEL))[:, None]
    return tl.where((rows == tl.arange(0, BLOCK)[None, :]) & (rows < size), 1.0, 0.0)


@triton.jit
def _load_matrix(ptr, matrix, row, size, PANEL: tl.constexpr, BLOCK: tl.constexpr, TRANSPOSED: tl.constexpr):
    """Rows ``row ..`` of the ``matrix``-th ``size x size`` matrix of a contiguous batch at ``ptr``
    (or of its transpose), zero beyond ``size``."""
    rows = (row + tl.arange(0, PANEL))[:, None]
    cols = tl.arange(0, BLOCK)[None, :]
    base = tl.cast(matrix, tl.int64) * size * size
    if TRANSPOSED:
        offsets = base + cols * size + rows
    else:
        offsets = base + rows * size + cols
    return tl.load(ptr + offsets, mask=(rows < size) & (cols < size), other=0.0)


@triton.jit
def _store_matrix(ptr, value, matrix, row, size, PANEL: tl.constexpr, BLOCK: tl.constexpr):
    """Writes rows ``row ..`` of the ``matrix``-th ``size x size`` matrix at ``ptr``."""
    rows = (row + tl.arange(0, PANEL))[:, None]
    cols = tl.arange(0, BLOCK)[None, :]
    offsets = tl.cast(matrix, tl.int64) * size * size + rows * size + cols
    tl.store(ptr + offsets, value, mask=(rows < size) & (cols < size))


@triton.jit
def _multiply(out_ptr, a_ptr, b_ptr, size, IN_PLACE: tl.constexpr, PANEL: tl.constexpr, BLOCK: tl.constexpr,
              PRECISION: tl.constexpr):
    """``OUT = A @ B`` for scratch tiles, panel by panel, ``PANEL`` inner indices at a time up to
    ``size`` (the padding beyond is zero), in loops the compiler cannot unroll (``size`` is not a
    compile-time constant), so that one slice of each operand is in registers at a time. ``OUT``
    is not ``B`` and, unless ``IN_PLACE``, not ``A``; in place, each panel is written once every
    thread has read that panel of ``A``."""
    inner = tl.arange(0, PANEL)
    cols = tl.arange(0, BLOCK)[None, :]
    for row in range(0, size, PANEL):
        rows = (row + inner)[:, None]
        acc = tl.zeros((PANEL, BLOCK), dtype=tl.float32)
        for k in range(0, size, PANEL):
            left = tl.load(a_ptr + rows * BLOCK + (k + inner)[None, :])
            right = tl.load(b_ptr + (k + inner)[:, None] * BLOCK + cols)
            acc = tl.dot(left, right, acc, input_precision=PRECISION)
        if IN_PLACE:
            tl.debug_barrier()
        tl.store(out_ptr + rows * BLOCK + cols, acc)


@triton.jit
def _multiply_pair(out_a_ptr, out_c_ptr, a_ptr, b_ptr, c_ptr, d_ptr, scale, size, IN_PLACE: tl.constexpr,
                   PANEL: tl.constexpr, BLOCK: tl.constexpr, PRECISION: tl.constexpr):
    """``OUT_A = A @ B`` and ``OUT_C = C @ B + scale * A @ D`` (a product and its derivative) as
    :func:`_multiply` computes one product, sharing the slices of ``A`` and ``B``; ``scale``
    multiplies slices of ``A`` (exact for the powers of two passed here). In place (``OUT_A`` is
    ``A``, ``OUT_C`` is ``C``) each panel is written once every thread has read those panels;
    ``B`` and ``D`` are never written."""
    inner = tl.arange(0, PANEL)
    cols = tl.arange(0, BLOCK)[None, :]
    for row in range(0, size, PANEL):
        rows = (row + inner)[:, None]
        acc_a = tl.zeros((PANEL, BLOCK), dtype=tl.float32)
        acc_c = tl.zeros((PANEL, BLOCK), dtype=tl.float32)
        for k in range(0, size, PANEL):
            left = tl.load(a_ptr + rows * BLOCK + (k + inner)[None, :])
            right = tl.load(b_ptr + (k + inner)[:, None] * BLOCK + cols)
            acc_a = tl.dot(left, right, acc_a, input_precision=PRECISION)
            acc_c = tl.dot(tl.load(c_ptr + rows * BLOCK + (k + inner)[None, :]), right, acc_c,
                           input_precision=PRECISION)
            acc_c = tl.dot(left * scale, tl.load(d_ptr + (k + inner)[:, None] * BLOCK + cols), acc_c,
                           input_precision=PRECISION)
        if IN_PLACE:
            tl.debug_barrier()
        tl.store(out_a_ptr + rows * BLOCK + cols, acc_a)
        tl.store(out_c_ptr + rows * BLOCK + cols, acc_c)


@triton.jit
def _set_r(r_ptr, q_ptr, size, PANEL: tl.constexpr, BLOCK: tl.constexpr):
    """``R = (3I - Q) / 2``."""
    for row in range(0, size, PANEL):
        panel = _panel(row, PANEL, BLOCK)
        tl.store(r_ptr + panel, 1.5 * _identity(row, size, PANEL, BLOCK) - 0.5 * tl.load(q_ptr + panel))


@triton.jit
def _trace(cov_ptr, matrix, size, offsets_ptr, offset_stride, offset_coefficient, offset_value,
           PANEL: tl.constexpr, BLOCK: tl.constexpr):
    """``tr(Sigma) + offset`` (module docstring); the offset's load is skipped by ``tl.where``'s
    choice, not its evaluation, so a non-finite value behind an unused pointer cannot leak in."""
    total = 0.0
    for row in range(0, size, PANEL):
        cov = _load_matrix(cov_ptr, matrix, row, size, PANEL, BLOCK, False)
        total += tl.sum(tl.sum(cov * _identity(row, size, PANEL, BLOCK), axis=1), axis=0)
    extra = tl.load(offsets_ptr + tl.cast(matrix, tl.int64) * offset_stride)
    return total + tl.where(offset_coefficient != 0.0, offset_coefficient * extra, 0.0) + offset_value


@triton.jit
def _iteration_slots(scratch_ptr, count: tl.constexpr, BLOCK: tl.constexpr):
    """This program's scratch tiles ``P``, ``R``, ``Q`` and ``QR``: the first four of its ``count``
    tiles (the backward kernel keeps the derivatives in the tiles after them)."""
    tile: tl.constexpr = BLOCK * BLOCK
    p_slot = scratch_ptr + tl.program_id(0).to(tl.int64) * count * BLOCK * BLOCK
    r_slot = p_slot + tile
    q_slot = r_slot + tile
    return p_slot, r_slot, q_slot, q_slot + tile


@triton.jit
def _start_iteration(cov_ptr, p_slot, r_slot, q_slot, matrix, row, trace, size, PANEL: tl.constexpr,
                     BLOCK: tl.constexpr):
    """Rows ``row ..`` of the iteration's start for the ``matrix``-th covariance: ``Q_0 = Sigma_N =
    Sigma / tau``, ``R_0 = (3I - Q_0) / 2`` and ``P_1 = R_0`` (``P_0 = I``) into their scratch tiles.
    Returns the panel's offsets in a tile."""
    a = _load_matrix(cov_ptr, matrix, row, size, PANEL, BLOCK, False) / trace
    r = 1.5 * _identity(row, size, PANEL, BLOCK) - 0.5 * a
    panel = _panel(row, PANEL, BLOCK)
    tl.store(q_slot + panel, a)
    tl.store(r_slot + panel, r)
    tl.store(p_slot + panel, r)
    return panel


@triton.jit(do_not_specialize=_UNSPECIALISED, do_not_specialize_on_alignment=_UNALIGNED)
def itn_whitening_kernel(
    cov_ptr, offsets_ptr, whitening_ptr, scratch_ptr, count, size, iterations, offset_stride, offset_coefficient,
    offset_value, PANEL: tl.constexpr, BLOCK: tl.constexpr, PRECISION: tl.constexpr,
):
    """``W = P_T(Sigma_N) / sqrt(tau)`` for the matrices ``program, program + programs, ...``
    (GW Eqs. 6-7): with ``R_k = (3I - Q_k) / 2``, ``P_{k+1} = P_k R_k`` and ``Q_{k+1} =
    (Q_k R_k) R_k`` from ``P_0 = I``, ``Q_0 = Sigma_N = Sigma / tau``, so ``P_1 = R_0``.
    Scratch tiles: P, R, Q and QR (the last two trade places at every step)."""
    p_slot, r_slot, q_slot, qr_slot = _iteration_slots(scratch_ptr, 4, BLOCK)
    for matrix in range(tl.program_id(0), count, tl.num_programs(0)):
        trace = _trace(cov_ptr, matrix, size, offsets_ptr, offset_stride, offset_coefficient, offset_value,
                       PANEL, BLOCK)
        for row in range(0, size, PANEL):
            _start_iteration(cov_ptr, p_slot, r_slot, q_slot, matrix, row, trace, size, PANEL, BLOCK)
        for k in range(0, iterations):
            tl.debug_barrier()
            if k > 0:  # P_{k+1} = P_k R_k
                _multiply(p_slot, p_slot, r_slot, size, True, PANEL, BLOCK, PRECISION)
            if k < iterations - 1:  # Q_{k+1} = (Q_k R_k) R_k, then R_{k+1}
                _multiply(qr_slot, q_slot, r_slot, size, False, PANEL, BLOCK, PRECISION)
                tl.debug_barrier()
                _multiply(qr_slot, qr_slot, r_slot, size, True, PANEL, BLOCK, PRECISION)
                q_slot, qr_slot = qr_slot, q_slot
                tl.debug_barrier()
                _set_r(r_slot, q_slot, size, PANEL, BLOCK)
        tl.debug_barrier()
        root = tl.sqrt(trace)
        for row in range(0, size, PANEL):
            p = tl.load(p_slot + _panel(row, PANEL, BLOCK))
            _store_matrix(whitening_ptr, p / root, matrix, row, size, PANEL, BLOCK)
        tl.debug_barrier()  # this matrix's reads of the scratch tiles, before the next one's writes


@triton.jit(do_not_specialize=_UNSPECIALISED, do_not_specialize_on_alignment=_UNALIGNED)
def itn_whitening_vjp_kernel(
    cov_ptr, grad_ptr, offsets_ptr, whitening_ptr, grad_cov_ptr, scratch_ptr, count, size, iterations,
    offset_stride, offset_coefficient, offset_value, PANEL: tl.constexpr, BLOCK: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """``W`` and ``dL/dSigma`` (symmetric) for ``G = dL/dW`` of the matrices ``program, program +
    programs, ...``.

    ``E = sym(G) / sqrt(tau)`` is pushed through the iteration in forward mode, carrying
    ``dP / s`` with ``s = -1/2`` (``dR = -dQ / 2``, ``d(QR) = dQ R + Q dR``): ``dP_1 = E``,
    ``dQ_0 = E`` and, beside the iteration of :func:`itn_whitening_kernel`,
    ``dP_{k+1} = dP_k R_k + P_k dQ_k``, ``dQ_{k+1} = (dQ_k R_k - Q_k dQ_k / 2) R_k - (Q_k R_k)
    dQ_k / 2``; then ``dL/dSigma = -dP_T / (2 tau) - (<dL/dSigma_N, Sigma_N> / tau + <G, P_T> /
    (2 tau^{3/2})) I``. Scratch tiles: P, R, Q, QR as in :func:`itn_whitening_kernel`, then dP, dQ,
    dQR (Q and dQ trade places with QR and dQR at every step).
    """
    tile: tl.constexpr = BLOCK * BLOCK
    p_slot, r_slot, q_slot, qr_slot = _iteration_slots(scratch_ptr, 7, BLOCK)
    dp_slot = qr_slot + tile
    dq_slot = dp_slot + tile
    dqr_slot = dq_slot + tile
    for matrix in range(tl.program_id(0), count, tl.num_programs(0)):
        trace = _trace(cov_ptr, matrix, size, offsets_ptr, offset_stride, offset_coefficient, offset_value,
                       PANEL, BLOCK)
        root = tl.sqrt(trace)
        for row in range(0, size, PANEL):
            e = _load_matrix(grad_ptr, matrix, row, size, PANEL, BLOCK, False)
            e = (e + _load_matrix(grad_ptr, matrix, row, size, PANEL, BLOCK, True)) * (0.5 / root)
            panel = _start_iteration(cov_ptr, p_slot, r_slot, q_slot, matrix, row, trace, size, PANEL, BLOCK)
            tl.store(dq_slot + panel, e)
            tl.store(dp_slot + panel, e)
        for k in range(0, iterations):
            tl.debug_barrier()
            if k > 0:  # P_{k+1} = P_k R_k, dP_{k+1} = dP_k R_k + P_k dQ_k
                _multiply_pair(p_slot, dp_slot, p_slot, r_slot, dp_slot, dq_slot, 1.0, size, True,
                               PANEL, BLOCK, PRECISION)
            if k < iterations - 1:  # (Q_{k+1}, dQ_{k+1}) from (Q_k, dQ_k), then R_{k+1}
                _multiply_pair(qr_slot, dqr_slot, q_slot, r_slot, dq_slot, dq_slot, -0.5, size, False,
                               PANEL, BLOCK, PRECISION)
                tl.debug_barrier()
                _multiply_pair(qr_slot, dqr_slot, qr_slot, r_slot, dqr_slot, dq_slot, -0.5, size, True,
                               PANEL, BLOCK, PRECISION)
                q_slot, qr_slot = qr_slot, q_slot
                dq_slot, dqr_slot = dqr_slot, dq_slot
                tl.debug_barrier()
                _set_r(r_slot, q_slot, size, PANEL, BLOCK)
        tl.debug_barrier()
        shift = 0.0
        for row in range(0, size, PANEL):
            panel = _panel(row, PANEL, BLOCK)
            grad_cov = tl.load(dp_slot + panel) * (-0.5 / trace)
            cov = _load_matrix(cov_ptr, matrix, row, size, PANEL, BLOCK, False)
            grad_p = _load_matrix(grad_ptr, matrix, row, size, PANEL, BLOCK, False) * tl.load(p_slot + panel)
            shift += tl.sum(tl.sum(grad_cov * cov, axis=1), axis=0) / trace
            shift += 0.5 * tl.sum(tl.sum(grad_p, axis=1), axis=0) / (trace * root)
        for row in range(0, size, PANEL):
            panel = _panel(row, PANEL, BLOCK)
            grad_cov = tl.load(dp_slot + panel) * (-0.5 / trace) - shift * _identity(row, size, PANEL, BLOCK)
            p = tl.load(p_slot + panel)
            _store_matrix(whitening_ptr, p / root, matrix, row, size, PANEL, BLOCK)
            _store_matrix(grad_cov_ptr, grad_cov, matrix, row, size, PANEL, BLOCK)
        tl.debug_barrier()  # this matrix's reads of the scratch tiles, before the next one's writes


# ---- the launches, as torch.library Triton ops ------------------------------------------------


@triton_op("gwdet::triton_itn_whitening", mutates_args=())
def triton_itn_whitening(
    cov: Tensor, offsets: Tensor, T: int, offset_stride: int, offset_coefficient: float, offset_value: float,
    programs: int, panel: int, block: int, precision: str,
) -> Tensor:
    """``W = P_T(Sigma_N) / sqrt(tau)`` for float32 covariances ``cov`` ``(n, size, size)``
    (``1 <= n``, ``size <= block``) by one launch of :func:`itn_whitening_kernel` with
    ``programs`` persistent programs, ``PANEL = panel``, ``BLOCK = block`` and
    ``PRECISION = precision``. The trace offset per matrix ``i`` is ``offset_coefficient *
    offsets[i * offset_stride] + offset_value`` (``offsets`` is not read where the coefficient is
    0)."""
    cov = cov.contiguous()
    whitening = torch.empty_like(cov)
    scratch = torch.empty(programs, SLOTS["itn_whitening_kernel"], block, block, dtype=torch.float32,
                          device=cov.device)
    wrap_triton(itn_whitening_kernel)[(programs,)](
        cov, offsets, whitening, scratch, cov.shape[0], cov.shape[-1], T, offset_stride, offset_coefficient,
        offset_value, PANEL=panel, BLOCK=block, PRECISION=precision, **launch_options(block),
    )
    return whitening


@triton_op("gwdet::triton_itn_whitening_vjp", mutates_args=())
def triton_itn_whitening_vjp(
    cov: Tensor, grad: Tensor, offsets: Tensor, T: int, offset_stride: int, offset_coefficient: float,
    offset_value: float, programs: int, panel: int, block: int, precision: str,
) -> Tuple[Tensor, Tensor]:
    """``(W, dL/dSigma)`` for ``grad = dL/dW`` (float32, the shape of ``cov``) by one launch of
    :func:`itn_whitening_vjp_kernel`; the other arguments as for :func:`triton_itn_whitening`."""
    cov, grad = cov.contiguous(), grad.contiguous()
    whitening, grad_cov = torch.empty_like(cov), torch.empty_like(cov)
    scratch = torch.empty(programs, SLOTS["itn_whitening_vjp_kernel"], block, block, dtype=torch.float32,
                          device=cov.device)
    wrap_triton(itn_whitening_vjp_kernel)[(programs,)](
        cov, grad, offsets, whitening, grad_cov, scratch, cov.shape[0], cov.shape[-1], T, offset_stride,
        offset_coefficient, offset_value, PANEL=panel, BLOCK=block, PRECISION=precision, **launch_options(block),
    )
    return whitening, grad_cov


# Every (kernel, BLOCK) the layers launch, with the signature its arguments have (float32
# matrices, 32-bit sizes) and the launch options; the ahead-of-time compile test reads this.
SIGNATURES: Dict[str, Dict[str, str]] = {
    "itn_whitening_kernel": {
        "cov_ptr": "*fp32", "offsets_ptr": "*fp32", "whitening_ptr": "*fp32", "scratch_ptr": "*fp32",
        "count": "i32", "size": "i32", "iterations": "i32", "offset_stride": "i32", "offset_coefficient": "fp32",
        "offset_value": "fp32",
    },
    "itn_whitening_vjp_kernel": {
        "cov_ptr": "*fp32", "grad_ptr": "*fp32", "offsets_ptr": "*fp32", "whitening_ptr": "*fp32",
        "grad_cov_ptr": "*fp32", "scratch_ptr": "*fp32", "count": "i32", "size": "i32", "iterations": "i32",
        "offset_stride": "i32", "offset_coefficient": "fp32", "offset_value": "fp32",
    },
}
KERNELS = {"itn_whitening_kernel": itn_whitening_kernel, "itn_whitening_vjp_kernel": itn_whitening_vjp_kernel}
LAUNCH_CONFIGURATIONS: Tuple[Tuple[str, int], ...] = tuple((name, block) for name in KERNELS for block in BLOCKS)


def compile_source(name: str, block: int, precision: str, panel: int = ROWS) -> "triton.compiler.ASTSource":
    """What ``triton.compile`` takes to build kernel ``name`` for ``block``, ``precision`` and
    ``panel`` ahead of time, exactly as a launch on a GPU specialises it."""
    signature = {**SIGNATURES[name], "PANEL": "constexpr", "BLOCK": "constexpr", "PRECISION": "constexpr"}
    return triton.compiler.ASTSource(fn=KERNELS[name], signature=signature,
                                     constexprs={"PANEL": panel, "BLOCK": block, "PRECISION": precision})
