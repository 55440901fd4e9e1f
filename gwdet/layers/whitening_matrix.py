"""Covariance and inverse-square-root whitening matrices for batches of small matrices.

Shared by group whitening (GW; Huang et al. 2021) and batch whitening (DBN; Huang et al. 2018).
Every function works on a batch of row-major data matrices ``(..., g, m)`` (g variables,
m observations) or on their ``(..., g, g)`` covariances; callers pass float32 or float64 tensors.
The ridge ``eps`` comes as a tensor ``(..., 1, 1)`` with one value per matrix: a caller that scales
a matrix's data by ``1/s`` passes ``eps / s^2`` for it (:func:`~.common.magnitude_scales`).

The differentiable functions (what TorchScript and ``torch.jit.trace`` record) take their products
with :func:`~.precision.float32_matmul`, which keeps them in the operands' precision when a
recorded graph runs inside an autocast region.
"""
import warnings
from typing import Optional, Set, Tuple, Union

import torch
from torch import Tensor

from .common import check_choice, refuse_differentiating_transforms
from .precision import float32_matmul
from .tracing import onnx_exporting, recording_reference_graph

from gwdet.errors import GwdetRuntimeError, GwdetRuntimeWarning, GwdetValueError

ZCA_NOT_IN_ONNX = (
    "ZCA whitening cannot be exported to ONNX: it needs an eigendecomposition "
    "(torch.linalg.eigh), which ONNX has no operator for. Export a model that uses the ItN "
    "variants instead: norm 'GW' (GroupWhitening(method='itn')) in place of 'GW_ZCA', 'BW_ItN' "
    "(BatchWhitening(method='itn')) in place of 'BW' in training mode. BatchWhitening with ZCA "
    "exports in evaluation mode, where it applies its running whitening matrix. TorchScript "
    "(torch.jit.trace / torch.jit.script) keeps ZCA."
)


# The smallest eps ZCA whitening takes: its backward's divided differences reach
# ``1 / (2 eps^{3/2})`` on a group of rank below its size (``1e-30``: 5e44, beyond float32's 3.4e38,
# so the input gradient is inf); at 1e-20 they stay below 5e29, leaving the gradient's own magnitude
# and the products with the eigenvectors 8 orders of magnitude of float32's range.
ZCA_SMALLEST_EPS = 1e-20


def check_whitening_method(owner: str, method: str) -> None:
    """Raise ``ValueError`` unless ``method`` is ``"itn"`` or ``"zca"``."""
    check_choice(owner, "method", method, ["itn", "zca"])


def check_zca_eps(owner: str, method: str, eps: float) -> None:
    """Raise ``ValueError`` for ``"zca"`` with an ``eps`` below :data:`ZCA_SMALLEST_EPS` (ItN's
    gradients stay finite there). Not compiled: the layers check it when built, not in forward."""
    if method == "zca" and eps < ZCA_SMALLEST_EPS:
        raise GwdetValueError(
            f"{owner}: eps={eps!r} is too small for ZCA whitening: on a group whose covariance has rank below its size "
            f"(fewer values than channels), the gradient through its eigendecomposition reaches 1/(2 eps^(3/2)) = "
            f"{0.5 * eps ** -1.5:.2g}, too near or beyond float32's largest value (3.4e38), so the input gradient can "
            f"become inf. Give eps >= {ZCA_SMALLEST_EPS:g} (MODEL.GW.EPS, MODEL.BW.EPS in a config), or method 'itn' "
            "(the norm names GW, BW_ItN).")


def ridge_covariance(centred: Tensor, ridge: Tensor) -> Tensor:
    """``Sigma = (1/m) X_C X_C^T + eps I`` for centred data ``X_C`` of shape ``(..., g, m)`` and
    ``eps`` in ``ridge`` ``(..., 1, 1)``.

    GW Algorithm 1 line 7 / DBN Eq. 3. The ridge ``eps I`` makes ``Sigma`` positive definite, so a
    constant (zero-variance) set of rows still has a finite inverse square root.
    """
    num_rows = centred.shape[-2]
    num_observations = centred.shape[-1]
    cov = float32_matmul(centred, centred.transpose(-1, -2)) / num_observations
    identity = torch.eye(num_rows, dtype=cov.dtype, device=cov.device)
    return cov + ridge * identity


def inverse_sqrt_itn(cov: Tensor, T: int) -> Tensor:
    """Approximate ``cov^{-1/2}`` by ``T`` Newton iterations ('ItN', GW Eqs. 6-7 / Eq. 17).

    ``Sigma_N = Sigma / tr(Sigma)``, ``P_0 = I``, ``P_k = (3 P_{k-1} - P_{k-1}^3 Sigma_N) / 2``
    and the result is ``P_T / sqrt(tr(Sigma))``. Each ``P_k`` is a polynomial in ``Sigma_N``, so
    on an eigenvalue ``x = lambda / tr(Sigma)`` of ``Sigma_N`` the whitened covariance
    ``P_T Sigma_N P_T`` has eigenvalue ``y_T`` with ``y_0 = x``,
    ``y_k = y_{k-1} (3 - y_{k-1})^2 / 4``:
    ``y_T`` rises monotonically to 1, slowly while ``x`` is small (many groups or an
    ill-conditioned ``Sigma``) and quadratically once ``y`` is near 1. ``cov`` must include the
    ``eps`` ridge so that the trace is positive. Differentiable by autograd (the backward is
    GW Eqs. 18-19).

    Computed in the coupled form of :func:`itn_whitening` (``Q_k = P_k^2 Sigma_N``,
    ``R_k = (3I - Q_k) / 2``, ``P_{k+1} = P_k R_k``, ``Q_{k+1} = Q_k R_k^2``), the same function of
    ``Sigma`` in exact arithmetic: Eq. 17 as written multiplies rounding errors that do not commute
    with ``Sigma_N`` at every iteration, which an ill-conditioned ``Sigma`` turns into garbage after
    about 7 iterations in float32, where the coupled form stays at rounding level.
    """
    trace = cov.diagonal(dim1=-2, dim2=-1).sum(-1).unsqueeze(-1).unsqueeze(-1)
    normalised = cov / trace
    eye = torch.eye(cov.shape[-1], dtype=cov.dtype, device=cov.device)
    p = eye.expand_as(cov)
    q = normalised
    for k in range(T):
        r = 1.5 * eye - 0.5 * q
        p = float32_matmul(p, r)
        if k < T - 1:  # the last iteration's Q is not read
            q = float32_matmul(float32_matmul(q, r), r)
    return p / trace.sqrt()


def inverse_sqrt_zca(cov: Tensor, min_eigenvalue: Tensor) -> Tensor:
    """``cov^{-1/2} = D Lambda^{-1/2} D^T`` by eigendecomposition (ZCA; GW Eq. 5, DBN Eq. 4).

    Eigenvalues are floored at ``min_eigenvalue`` ``(..., 1, 1)`` (pass the ridge ``eps``, their
    exact lower bound). The eigendecomposition is not differentiated: its backward (DBN Eq. 5, GW
    Eqs. 14-16) divides by eigenvalue gaps. Eqs. 14-16 combined give ``dL/dSigma = D (K o (D^T G D))
    D^T`` for ``G = dL/dW`` (``o``: elementwise), ``K`` the divided differences of ``lambda^{-1/2}``:
    ``K_ij = -1 / (s_i s_j (s_i + s_j))`` with ``s = sqrt(lambda)``, finite for repeated eigenvalues.

    Eager code, ``torch.compile`` and ``torch.export`` run the custom op :func:`zca_whitening_op`,
    which refuses second derivatives (:data:`ZCA_SECOND_DERIVATIVES`); TorchScript graphs record
    :func:`_zca_recorded`, with the same first derivatives but second derivatives that are not those
    of ``cov^{-1/2}``.
    """
    if not torch.jit.is_scripting():
        if not recording_reference_graph():
            return _zca_by_op(cov, min_eigenvalue)
    return _zca_recorded(cov, min_eigenvalue)


def finite_eigh(cov: Tensor) -> Tuple[Tensor, Tensor]:
    """``torch.linalg.eigh`` of each symmetric matrix of ``cov`` ``(..., g, g)``, where a matrix
    holding a non-finite value gets NaN eigenvalues (and identity eigenvectors) instead of making
    ``eigh`` fail for the whole batch: its sample's whitening is NaN, the others' are unchanged."""
    finite = torch.isfinite(cov).all(-1).all(-1)
    identity = torch.eye(cov.shape[-1], dtype=cov.dtype, device=cov.device)
    eigenvalues, eigenvectors = torch.linalg.eigh(torch.where(finite.unsqueeze(-1).unsqueeze(-1), cov, identity))
    return torch.where(finite.unsqueeze(-1), eigenvalues, torch.full_like(eigenvalues, float("nan"))), eigenvectors


def _zca_recorded(cov: Tensor, min_eigenvalue: Tensor) -> Tensor:
    """:func:`inverse_sqrt_zca` as ATen operators, what a TorchScript graph records.

    The value is ``D Lambda^{-1/2} D^T`` of the detached ``cov``; the first-order term is added as
    ``D (K o (D^T (Sigma - Sigma.detach()) D)) D^T``, whose value is exactly zero and whose gradient
    is the ``dL/dSigma`` of :func:`inverse_sqrt_zca`. Its second derivatives are not those of
    ``cov^{-1/2}``: ``D`` and ``K`` are constants here. A ``torch.jit.trace`` records the term
    whether or not ``cov`` requires grad, so that the graph does not depend on it (trace's own
    check runs the module again, where the parameters' grad may differ).
    """
    eigenvalues, eigenvectors = finite_eigh(cov.detach())
    roots = eigenvalues.clamp_min(min_eigenvalue.squeeze(-1)).sqrt()
    eigenvectors_t = eigenvectors.transpose(-1, -2)
    whitening = float32_matmul(eigenvectors / roots.unsqueeze(-2), eigenvectors_t)
    if not cov.requires_grad and not torch.jit.is_tracing():  # a trace records one graph, with or without grad
        return whitening
    roots_i = roots.unsqueeze(-1)
    roots_j = roots.unsqueeze(-2)
    divided_differences = -1.0 / (roots_i * roots_j * (roots_i + roots_j))
    zero_carrying_gradient = cov - cov.detach()
    rotated = float32_matmul(float32_matmul(eigenvectors_t, zero_carrying_gradient), eigenvectors)
    first_order = float32_matmul(
        float32_matmul(eigenvectors, divided_differences * rotated), eigenvectors_t
    )
    return whitening + first_order


# ---- ZCA as a custom op with a closed-form backward that refuses second derivatives -------------

# what to use where ZCA's closed-form gradient has no formula (second derivatives, torch.func's transforms)
ITN_ADVICE = ("for them, use ItN whitening (method='itn'): gwdet.layers.group_whitening_reference(x, num_groups, T, "
              "eps, 'itn', weight, bias) for GW, BatchWhitening(method='itn') with GWDET_GW_PLAN=cpu for BW, which "
              "autograd differentiates to any order (BW under torch.func in evaluation mode only: in training it "
              "updates its running statistics in place, which torch.func's transforms refuse)")
ZCA_SECOND_DERIVATIVES = (
    "ZCA whitening (group_whitening_reference and BatchWhitening with method='zca'): second derivatives "
    "(a backward pass through gradients computed with create_graph=True) are not supported: its gradient is "
    "computed in closed form from the eigendecomposition (GW Eqs. 14-16), and that closed form is not "
    f"differentiated again; {ITN_ADVICE}"
)


@torch.library.custom_op("gwdet::zca_whitening", mutates_args=())
def zca_whitening_op(cov: Tensor, min_eigenvalue: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """``(cov^{-1/2}, D, s)`` for symmetric covariances ``cov`` ``(..., g, g)``: the ZCA whitening
    matrix ``D diag(1/s) D^T`` (GW Eq. 5), the eigenvectors ``D`` and the square roots ``s`` of the
    eigenvalues floored at ``min_eigenvalue`` ``(..., 1, 1)`` (not differentiable). The gradient
    w.r.t. ``cov`` is :func:`zca_whitening_backward`'s; its gradient is refused."""
    eigenvalues, eigenvectors = finite_eigh(cov)
    roots = eigenvalues.clamp_min(min_eigenvalue.squeeze(-1)).sqrt()
    whitening = torch.matmul(eigenvectors / roots.unsqueeze(-2), eigenvectors.transpose(-1, -2))
    return whitening, eigenvectors, roots


@zca_whitening_op.register_fake
def _zca_whitening_fake(cov, min_eigenvalue):
    # eigh's own fake kernel gives the eigenvectors the strides (column-major) the real one has
    eigenvalues, eigenvectors = torch.linalg.eigh(cov)
    return cov.new_empty(cov.shape), eigenvectors, eigenvalues


@torch.library.custom_op("gwdet::zca_whitening_backward", mutates_args=())
def zca_whitening_backward(cov: Tensor, grad: Tensor, eigenvectors: Tensor, roots: Tensor) -> Tensor:
    """``dL/dSigma = D (K o (D^T G D)) D^T`` for ``G = grad = dL/dW`` of :func:`zca_whitening_op`,
    with its eigenvectors ``D`` and roots ``s``, ``K_ij = -1 / (s_i s_j (s_i + s_j))`` (see
    :func:`inverse_sqrt_zca`). The products run in the order autograd takes through
    :func:`_zca_recorded`, so both give the same numbers.

    ``cov`` is not read: it is an input so that a gradient computed with ``create_graph=True``
    depends on it whatever ``grad`` depends on, and a backward pass through that gradient reaches
    this op's autograd formula, which refuses (:data:`ZCA_SECOND_DERIVATIVES`).
    """
    del cov
    roots_i = roots.unsqueeze(-1)
    roots_j = roots.unsqueeze(-2)
    divided_differences = -1.0 / (roots_i * roots_j * (roots_i + roots_j))
    eigenvectors_t = eigenvectors.transpose(-1, -2)
    rotated = torch.matmul(eigenvectors_t, torch.matmul(grad, eigenvectors))
    return torch.matmul(eigenvectors, torch.matmul(divided_differences * rotated, eigenvectors_t))


@zca_whitening_backward.register_fake
def _zca_whitening_backward_fake(cov, grad, eigenvectors, roots):
    return eigenvectors.new_empty(eigenvectors.shape)


def _zca_setup_context(ctx, inputs, output) -> None:
    cov, _ = inputs
    _, eigenvectors, roots = output
    ctx.save_for_backward(cov, eigenvectors, roots)
    ctx.mark_non_differentiable(eigenvectors, roots)
    ctx.set_materialize_grads(False)


def _zca_backward_formula(ctx, grad, grad_eigenvectors, grad_roots):
    del grad_eigenvectors, grad_roots  # not differentiable outputs
    if grad is None:
        return None, None
    cov, eigenvectors, roots = ctx.saved_tensors
    return zca_whitening_backward(cov, grad, eigenvectors, roots), None


def _refuse_zca_second_derivative(ctx, grad):
    raise GwdetRuntimeError(ZCA_SECOND_DERIVATIVES)


zca_whitening_op.register_autograd(_zca_backward_formula, setup_context=_zca_setup_context)
zca_whitening_backward.register_autograd(_refuse_zca_second_derivative)


@torch.jit.unused
def _zca_by_op(cov: Tensor, min_eigenvalue: Tensor) -> Tensor:
    """The whitening matrix of :func:`zca_whitening_op`."""
    return zca_whitening_op(cov, min_eigenvalue)[0]


def whitening_matrix(cov: Tensor, method: str, T: int, ridge: Tensor) -> Tensor:
    """``cov^{-1/2}`` by ``method``: ``"itn"`` (``T`` Newton iterations) or ``"zca"`` (exact).

    ``cov`` must already contain the ridge ``eps I``, ``eps`` given in ``ridge`` ``(..., 1, 1)``
    (see :func:`ridge_covariance`).
    """
    check_whitening_method("whitening_matrix", method)
    if method == "itn":
        return inverse_sqrt_itn(cov, T)
    if not torch.jit.is_scripting():
        _refuse_onnx_export()
        _refuse_differentiating_transforms(cov)
    return inverse_sqrt_zca(cov, ridge)


@torch.jit.unused
def _refuse_differentiating_transforms(cov: Tensor) -> None:
    refuse_differentiating_transforms("ZCA whitening", ITN_ADVICE, cov)


@torch.jit.unused
def _refuse_onnx_export() -> None:
    if onnx_exporting():
        raise GwdetRuntimeError(ZCA_NOT_IN_ONNX)


# ---- Closed-form value-and-gradient kernels for custom autograd Functions ------------------------
#
# The functions above are differentiated by autograd, which for ItN keeps every one of the 3T
# intermediate (..., g, g) products alive until the backward pass. The kernels below run without
# autograd on a batch of symmetric ridge covariances ``(n, g, g)``: ``*_whitening`` returns
# ``cov^{-1/2}``, ``*_whitening_vjp`` recomputes it and returns the gradient w.r.t. ``cov`` as
# well, so a caller only keeps ``cov`` (or what it is made from). The ridge-dependent arguments
# (``trace_offset``, ``min_eigenvalue``) are a number or one value per matrix, ``(n, 1, 1)``.
# Not TorchScript-able.


def _sym(matrix: Tensor) -> Tensor:
    return 0.5 * (matrix + matrix.transpose(-1, -2))


def _trace(matrix: Tensor) -> Tensor:
    """``tr`` over the last two dims, shaped ``(..., 1, 1)`` for broadcasting."""
    return matrix.diagonal(dim1=-2, dim2=-1).sum(-1)[..., None, None]


def _offset_trace(cov: Tensor, trace_offset: Union[float, Tensor]) -> Tensor:
    """``tr(cov) + trace_offset`` (no operation for an offset of 0)."""
    trace = _trace(cov)
    if isinstance(trace_offset, Tensor) or trace_offset != 0.0:
        trace = trace + trace_offset
    return trace


def itn_whitening(cov: Tensor, T: int, trace_offset: Union[float, Tensor] = 0.0) -> Tensor:
    """The value of :func:`inverse_sqrt_itn` with ``3T - 3`` instead of ``3T`` products.

    Every iterate of Eq. 17 is a polynomial in ``Sigma_N``, so they all commute and the iteration
    can carry ``Q_k = P_k^2 Sigma_N`` instead of forming ``P_k^3 Sigma_N``: with
    ``R_k = (3I - Q_k) / 2``, ``P_{k+1} = P_k R_k`` and ``Q_{k+1} = (Q_k R_k) R_k``
    (``P_0 = I``, ``Q_0 = Sigma_N``, so ``P_1 = R_0`` costs nothing). In exact arithmetic this
    is the same function of ``Sigma`` as Eq. 17.

    ``trace_offset`` is added to ``tr(cov)`` wherever the trace enters (``Sigma_N`` and the final
    scale): a caller that iterates on a smaller matrix with the same nonzero spectrum (see
    :mod:`gwdet.layers.group_whitening_function`) passes the trace the full matrix would have.
    """
    trace = _offset_trace(cov, trace_offset)
    normalised = cov / trace
    eye_3_2 = torch.eye(cov.shape[-1], dtype=cov.dtype, device=cov.device).mul_(1.5)
    r = torch.add(eye_3_2, normalised, alpha=-0.5)
    p = r
    if T > 1:
        q = torch.bmm(torch.bmm(normalised, r), r)
        for k in range(1, T):
            r = torch.add(eye_3_2, q, alpha=-0.5)
            p = torch.bmm(p, r)
            if k < T - 1:
                q = torch.bmm(torch.bmm(q, r), r)
    return p.div_(trace.sqrt()) if T > 1 else p / trace.sqrt()


def itn_whitening_vjp(
    cov: Tensor, grad: Tensor, T: int, trace_offset: Union[float, Tensor] = 0.0
) -> Tuple[Tensor, Tensor]:
    """``(W, dL/dSigma)`` for ``W = itn_whitening(cov, T, trace_offset)`` and ``grad = dL/dW``.

    The returned gradient is that of the symmetric part of ``grad``, and is itself symmetric:
    exactly what a caller needs whose ``Sigma`` is a symmetric function of its input
    (``Sigma = X X^T / c + eps I``), since then only ``dL/dSigma + dL/dSigma^T`` enters.

    Derivation (an equivalent of GW Eqs. 18-19 with fewer products). ``W = P_T(A) / sqrt(tau)``
    with ``tau = tr(Sigma)``, ``A = Sigma / tau`` and ``P_T`` a polynomial with real
    coefficients. For such a polynomial the Frechet derivative ``L(A, E)`` satisfies
    ``<L(A, E), G> = <E, L(A^T, G)>``, so for symmetric ``A`` the adjoint of the derivative is
    the derivative itself: ``dL/dA = L(A, G / sqrt(tau))`` with ``G = sym(grad)``. ``L(A, E)``
    is computed in forward mode, differentiating the recursion of :func:`itn_whitening` alongside
    it (``dR = -dQ / 2``, ``dP' = dP R + P dR``, ``d(QR) = dQ R + Q dR``,
    ``dQ' = d(QR) R + (QR) dR``): ``6T - 6`` products besides the ``3T - 3`` of the value, and
    nothing stored per iteration. The trace enters twice: through ``A`` (``-<dL/dA, A> / tau``)
    and through ``1 / sqrt(tau)`` (``-<G, P_T> / (2 tau^{3/2})``); both multiply the identity.
    """
    trace = _offset_trace(cov, trace_offset)
    root = trace.sqrt()
    a = cov / trace
    eye_3_2 = torch.eye(cov.shape[-1], dtype=cov.dtype, device=cov.device).mul_(1.5)
    # E = sym(grad) / sqrt(tau); the iteration carries dP / s with s = -1/2 (dP_1 = dR_0 = -E/2)
    e = torch.add(grad, grad.transpose(1, 2)).mul_(0.5 / root)
    r = torch.add(eye_3_2, a, alpha=-0.5)
    p = r
    dp = e
    if T > 1:
        # k = 0: P_0 = I, Q_0 = A, dQ_0 = E, dR_0 = -E / 2
        ar = torch.bmm(a, r)
        dar = torch.bmm(e, r).baddbmm_(a, e, alpha=-0.5)
        q = torch.bmm(ar, r)
        dq = torch.bmm(dar, r).baddbmm_(ar, e, alpha=-0.5)
        for k in range(1, T):
            r = torch.add(eye_3_2, q, alpha=-0.5)
            next_p = torch.bmm(p, r)
            # dP' = dP R + P dR = s (dP/s R + P dQ) since dR = -dQ/2 and s = -1/2
            dp = torch.bmm(dp, r).baddbmm_(p, dq)
            p = next_p
            if k < T - 1:
                qr = torch.bmm(q, r)
                dqr = torch.bmm(dq, r).baddbmm_(q, dq, alpha=-0.5)
                q = torch.bmm(qr, r)
                dq = torch.bmm(dqr, r).baddbmm_(qr, dq, alpha=-0.5)
    # dL/dA = -dp / 2; dL/dSigma = dL/dA / tau - (<dL/dA, A> / tau + <G, P_T> / (2 tau^{3/2})) I
    grad_cov = dp.mul(-0.5 / trace)
    shift = (grad_cov * a).sum((1, 2), keepdim=True)
    shift += 0.5 * (grad * p).sum((1, 2), keepdim=True) / (trace * root)
    grad_cov.diagonal(dim1=1, dim2=2).sub_(shift.view(-1, 1))
    return p.div_(root), grad_cov


# PyTorch's CUDA eigh solves a batch of matrices up to this size in one batched call (cuSOLVER's
# syevjBatched) and larger ones one matrix after another
BATCHED_EIGH_LIMIT = 32
_warned_eigh_sizes: Set[Tuple[str, int]] = set()


def looped_eigh_warning(device: torch.device, size: int) -> Optional[str]:
    """The warning for ZCA whitening of ``size x size`` matrices on ``device``, or None: on CUDA,
    ``torch.linalg.eigh`` of a batch of matrices larger than :data:`BATCHED_EIGH_LIMIT` runs one
    eigendecomposition per matrix."""
    if device.type != "cuda" or size <= BATCHED_EIGH_LIMIT:
        return None
    return (
        f"gwdet: ZCA whitening of {size} x {size} matrices on CUDA: torch.linalg.eigh decomposes a batch of "
        f"matrices larger than {BATCHED_EIGH_LIMIT} x {BATCHED_EIGH_LIMIT} one matrix after another (and checks "
        "its result on the host), so each GW_ZCA layer costs a solver call per sample, forward and backward: "
        "milliseconds to seconds per layer for the hundreds of samples of a detector's heads. ItN whitening "
        "(norm 'GW', method='itn') computes the same whitening by batched products; GW_ZCA with at most "
        f"{BATCHED_EIGH_LIMIT} groups stays batched."
    )


def _zca_factors(cov: Tensor, min_eigenvalue: Union[float, Tensor]) -> Tuple[Tensor, Tensor]:
    message = looped_eigh_warning(cov.device, cov.shape[-1])
    if message is not None and (str(cov.device), cov.shape[-1]) not in _warned_eigh_sizes:
        _warned_eigh_sizes.add((str(cov.device), cov.shape[-1]))
        warnings.warn(message, GwdetRuntimeWarning, stacklevel=2)
    eigenvalues, eigenvectors = finite_eigh(cov)
    if isinstance(min_eigenvalue, Tensor):
        min_eigenvalue = min_eigenvalue.squeeze(-1)
    return eigenvectors, eigenvalues.clamp_min(min_eigenvalue).sqrt()


def zca_whitening(cov: Tensor, min_eigenvalue: Union[float, Tensor]) -> Tensor:
    """The value of :func:`inverse_sqrt_zca` (``D Lambda^{-1/2} D^T``), without autograd."""
    eigenvectors, roots = _zca_factors(cov, min_eigenvalue)
    return torch.matmul(eigenvectors / roots.unsqueeze(-2), eigenvectors.transpose(-1, -2))


def zca_whitening_vjp(
    cov: Tensor, grad: Tensor, min_eigenvalue: Union[float, Tensor]
) -> Tuple[Tensor, Tensor]:
    """``(W, dL/dSigma)`` for ``W = zca_whitening(cov)``: ``D (K o (D^T G D)) D^T`` with
    ``G = sym(grad)`` and the divided differences ``K`` of :func:`inverse_sqrt_zca` (GW
    Eqs. 14-16 combined; finite for repeated eigenvalues). Symmetric, like
    :func:`itn_whitening_vjp`.
    """
    eigenvectors, roots = _zca_factors(cov, min_eigenvalue)
    eigenvectors_t = eigenvectors.transpose(-1, -2)
    whitening = torch.matmul(eigenvectors / roots.unsqueeze(-2), eigenvectors_t)
    roots_i = roots.unsqueeze(-1)
    roots_j = roots.unsqueeze(-2)
    divided_differences = -1.0 / (roots_i * roots_j * (roots_i + roots_j))
    rotated = torch.matmul(torch.matmul(eigenvectors_t, _sym(grad)), eigenvectors)
    grad_cov = torch.matmul(torch.matmul(eigenvectors, divided_differences * rotated), eigenvectors_t)
    return whitening, grad_cov
