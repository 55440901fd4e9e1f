"""Group whitening with a fused per-channel affine as ``torch.library`` custom ops with a
closed-form backward: ``gwdet::group_whitening`` and ``gwdet::group_whitening_backward``.

The ops compute :func:`gwdet.layers.group_whitening_reference` followed by ``y * weight + bias``
(GW Algorithm 1, Eqs. 8-10). With fake kernels and an autograd formula registered, they stay single
opaque nodes under ``torch.compile`` (``fullgraph=True``), ``torch.export`` and ``torch.jit.trace``
(:mod:`gwdet.layers.tracing`). The forward saves the input, the group means, the scaling factors and
(when small) the ``g x g`` covariances; the backward recomputes the whitening matrix with its gradient
(:func:`~.whitening_matrix.itn_whitening_vjp`). Per sample (``m = C/g HW``) the activation is read by
two ``g x g`` by ``g x m`` products forward and three backward (four for an affine on groups of several
channels); with one channel per group (``C == g``) the affine folds into the ``g x g`` matrices. How
samples are cut into passes and what computes the ItN matrix is the plan's choice
(:mod:`gwdet.layers.plans`); the formulas are the same for every plan.

Backward (Algorithm 2, one sample, ``X`` is ``g x m``, ``mu`` the row means,
``X_C = X - mu 1^T``, ``Y = W X_C``, ``Z = gamma o Y + beta``)::

    dbeta = sum dZ,  dgamma = sum dZ o Y,  dY = gamma o dZ
    dW    = dY X_C^T = dY X^T - (dY 1) mu^T
    dS    = psi_b(dW)                     (symmetric; ItN or ZCA backward of Sigma -> W)
    dX    = W^T dY + (2/m) dS X_C - (1/m) W^T dY 1 1^T
          = W^T dY + B X - (W^T f + B mu) 1^T,  B = 2 dS / m,  f = dY 1 / m

(the row means of ``(2/m) dS X_C`` are zero, so centring ``dL/dX_C`` (Algorithm 2, line 7) only
touches the ``W^T dY`` term).

Few columns (``m <= g``, :func:`~.group_shapes.few_columns`): with ``U = X_C / sqrt(m)``, ``p(U U^T + eps I) U = U p(U^T U + eps I)`` for
every polynomial ``p`` and for ``x^{-1/2}`` (SVD of ``U``), so ``W X_C = X_C W'`` with
``S = X_C^T X_C / m + eps I_m`` and ``W' = P_T(S / tau) / sqrt(tau)`` (ItN, ``tau = tr(Sigma) =
tr(S) + (g - m) eps``) or ``W' = S^{-1/2}`` (ZCA). Backward: ``dW' = X_C^T dY``, ``dS = psi_b(dW')``,
``dX_C = dY W'^T + (2/m) X_C dS`` and ``dX = dX_C`` minus its row means.

Precision: statistics, whitening matrix, products and affine run in float32 (float64 for float64
input), autocast off, float32 products in IEEE precision (:func:`~.precision.ieee_float32_products`);
the result is rounded to the input dtype.

Huge inputs: a sample whose largest magnitude exceeds ``2**32`` (``2**256`` in float64) is processed
as ``X' = X / s`` with the ridge ``eps / s^2`` (``s`` from :func:`~.common.magnitude_scales`); then
``W X_C = W' X'_C``, so the output needs no rescaling. The saved means and covariances are those of
``X'``, with the factors ``1/s``; the backward runs on ``X'`` and divides the input gradient by ``s``
(folded into the ``g x g`` matrices of ``dX``). A plan that scales every sample (no look on the
host) centres ``X'`` from ``X`` in one pass, its means from float64 sums (:func:`_scaled_centring`).
"""
import math
from typing import Iterator, NamedTuple, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from .common import refuse_differentiating_transforms, refuse_second_derivative, scaled_ridge, statistics_dtype
from .group_shapes import GroupShapes, few_columns, keeps_covariance
from .plans import ExecutionPlan, plan_for
from .precision import ieee_float32_products
from .whitening_matrix import zca_whitening, zca_whitening_vjp

from gwdet.errors import GwdetValueError

# Memory model of the formulas below, for the plans' chunk sizes. A pass over samples holds
# activation-sized temporaries (see _chunk_steps) and about GG_BUFFERS g x g matrices per sample
# (ItN backward). The ``cpu`` plan keeps temporaries within FORWARD_FRACTION of the activation in
# the forward pass (which holds the output) and BACKWARD_FRACTION, less any saved covariances, in
# the backward pass (which also holds the input gradient): the peak memory target of
# docs/benchmarks.md. The ``accelerator`` plan keeps to an absolute budget (plans.accelerator).
FORWARD_FRACTION = 1.1
BACKWARD_FRACTION = 0.6
GG_BUFFERS = 16


def saved_covariance_shape(shape: Sequence[int], groups: int) -> Tuple[int, ...]:
    """Shape of the covariances the forward op returns for the backward op: ``(N, g, g)`` when
    they are kept (see :func:`~.group_shapes.keeps_covariance`), else ``(0,)`` (recomputed in the
    backward)."""
    samples, values = shape[0], math.prod(shape[1:])
    if not few_columns(values, groups) and keeps_covariance(values, groups):
        return (samples, groups, groups)
    return (0,)


@torch.library.custom_op("gwdet::group_whitening", mutates_args=())
def group_whitening_forward(
    x: Tensor,
    weight: Optional[Tensor],
    bias: Optional[Tensor],
    groups: int,
    T: int,
    eps: float,
    method: str,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(group_whitening(x) * weight + bias, group means, covariances, scales)``; ``groups``
    divides ``C``.

    The means ``(N, g, 1)``, covariances (:func:`saved_covariance_shape`) and factors ``1/s``
    ``(N, 1, 1)`` of the huge-input scaling, in the statistics dtype, are what the backward op
    needs besides the input; they are not differentiable.
    """
    call = _Call(x, weight is not None, groups, T, eps, method)
    with torch.autocast(device_type=x.device.type, enabled=False), ieee_float32_products(x.device):
        out, mean, cov, scales = _forward(x, call.affine(weight), call.affine(bias), call)
    if cov is None:
        cov = torch.empty(0, dtype=call.shapes.dtype, device=x.device)
    if scales is None:
        scales = torch.ones(call.shapes.samples, 1, 1, dtype=call.shapes.dtype, device=x.device)
    return out, mean, cov, scales


@group_whitening_forward.register_fake
def _group_whitening_forward_fake(x, weight, bias, groups, T, eps, method):
    dtype = statistics_dtype(x.dtype)
    out = x.new_empty(x.shape)
    mean = x.new_empty((x.shape[0], groups, 1), dtype=dtype)
    cov = x.new_empty(saved_covariance_shape(x.shape, groups), dtype=dtype)
    scales = x.new_empty((x.shape[0], 1, 1), dtype=dtype)
    return out, mean, cov, scales


@torch.library.custom_op("gwdet::group_whitening_backward", mutates_args=())
def group_whitening_backward(
    grad_out: Tensor,
    x: Tensor,
    weight: Optional[Tensor],
    mean: Tensor,
    cov: Tensor,
    scales: Tensor,
    groups: int,
    T: int,
    eps: float,
    method: str,
    needs_x: bool,
    needs_weight: bool,
    needs_bias: bool,
) -> Tuple[Tensor, Tensor, Tensor]:
    """Gradients w.r.t. ``x`` (in ``x``'s dtype), ``weight`` and ``bias`` (in the statistics
    dtype) of :func:`group_whitening_forward` (Algorithm 2 and the affine, formulas in the module
    docstring). A gradient that is not asked for comes back as an empty tensor. First derivatives
    only: this op has no autograd kernel."""
    call = _Call(x, weight is not None, groups, T, eps, method)
    saved_cov = cov if cov.numel() else None
    with torch.autocast(device_type=x.device.type, enabled=False), ieee_float32_products(x.device):
        grad_x, grad_weight, grad_bias = _backward(
            grad_out, x, call.affine(weight), mean, saved_cov, scales, call,
            needs_x, needs_weight and weight is not None, needs_bias,
        )
    return (
        x.new_empty(0) if grad_x is None else grad_x,
        mean.new_empty(0) if grad_weight is None else grad_weight,
        mean.new_empty(0) if grad_bias is None else grad_bias,
    )


@group_whitening_backward.register_fake
def _group_whitening_backward_fake(
    grad_out, x, weight, mean, cov, scales, groups, T, eps, method, needs_x, needs_weight, needs_bias
):
    channels = x.shape[1]
    grad_x = x.new_empty(x.shape) if needs_x else x.new_empty(0)
    grad_weight = mean.new_empty(channels if needs_weight and weight is not None else 0)
    grad_bias = mean.new_empty(channels if needs_bias else 0)
    return grad_x, grad_weight, grad_bias


def _setup_context(ctx, inputs, output) -> None:
    x, weight, bias, groups, T, eps, method = inputs
    _, mean, cov, scales = output
    ctx.save_for_backward(x, weight, mean, cov, scales)
    ctx.bias_dtype = None if bias is None else bias.dtype
    ctx.hyper_parameters = (groups, T, eps, method)
    ctx.mark_non_differentiable(mean, cov, scales)
    # the statistics get no gradient: without this autograd would allocate zeros of their shape
    # for the backward formula (the covariances' are (N, g, g), a third of the input)
    ctx.set_materialize_grads(False)


def _backward_formula(ctx, grad_out, grad_mean, grad_cov, grad_scales):
    del grad_mean, grad_cov, grad_scales  # not differentiable outputs
    if grad_out is None:  # nothing flows back (grads are not materialised, see _setup_context)
        return (None,) * 7
    x, weight, mean, cov, scales = ctx.saved_tensors
    needs_x, needs_weight, needs_bias = ctx.needs_input_grad[:3]
    needs_weight = needs_weight and weight is not None
    needs_bias = needs_bias and ctx.bias_dtype is not None
    grad_x, grad_weight, grad_bias = group_whitening_backward(
        grad_out, x, weight, mean, cov, scales, *ctx.hyper_parameters, needs_x, needs_weight, needs_bias
    )
    return (
        grad_x if needs_x else None,
        grad_weight.to(weight.dtype) if needs_weight else None,
        grad_bias.to(ctx.bias_dtype) if needs_bias else None,
        None,
        None,
        None,
        None,
    )


group_whitening_forward.register_autograd(_backward_formula, setup_context=_setup_context)
# What to use where the fused op has no formula (second derivatives, torch.func's transforms): the
# reference's ItN formulas have them, its ZCA ones do not.
REFERENCE_ADVICE = ("for them, compute GW (method 'itn') with gwdet.layers.group_whitening_reference(x, num_groups, "
                    "T, eps, 'itn', weight, bias), the same function as tensor operations that autograd "
                    "differentiates to any order")
group_whitening_backward.register_autograd(refuse_second_derivative("GroupWhitening", REFERENCE_ADVICE))


def fused_group_whitening(
    x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], groups: int, T: int, eps: float, method: str
) -> Tensor:
    """``group_whitening(x) * weight + bias`` by the custom op (``groups`` must divide ``C``); the
    affine parameters must lie on ``x``'s device (the op reads them there)."""
    for name, parameter in (("weight", weight), ("bias", bias)):
        if parameter is not None and parameter.device != x.device:
            raise GwdetValueError(f"GroupWhitening: the input is on {x.device}, the {name} on {parameter.device}; "
                                  "move the layer and its input to one device (module.to(device), x.to(device))")
    refuse_differentiating_transforms("GroupWhitening", REFERENCE_ADVICE, x, weight, bias)
    return group_whitening_forward(x, weight, bias, groups, T, eps, method)[0]


class _Whitening:
    """Which inverse square root a call takes: ``method`` (ItN by the plan's kernels, or ZCA) of
    the ``g x g`` covariance, or of the ``m x m`` Gram matrix for few columns."""

    def __init__(self, shapes: GroupShapes, T: int, method: str, plan: ExecutionPlan) -> None:
        self.T, self.method, self.plan = T, method, plan
        # tr(Sigma) - tr(S) per unit of ridge for few columns: ItN normalizes by tr(Sigma)
        self.missing_diagonal = shapes.groups - shapes.m if shapes.few_columns else 0

    def value(self, cov: Tensor, ridge: Union[float, Tensor]) -> Tensor:
        """``cov^{-1/2}`` for covariances holding ``ridge`` (:meth:`_Call.ridge`)."""
        if self.method == "itn":
            return self.plan.itn_whitening(cov, self.T, self.trace_offset(ridge))
        return zca_whitening(cov, ridge)

    @property
    def needs_ridge(self) -> bool:
        """Whether :meth:`vjp` reads its ``ridge`` (ZCA's eigenvalue floor, the few-columns trace)."""
        return self.method == "zca" or self.missing_diagonal > 0

    def vjp(self, cov: Tensor, grad: Tensor, ridge: Union[None, float, Tensor]) -> Tuple[Tensor, Tensor]:
        if self.method == "itn":
            return self.plan.itn_whitening_vjp(cov, grad, self.T, self.trace_offset(ridge))
        assert ridge is not None, "ZCA's vjp reads the ridge (needs_ridge)"
        return zca_whitening_vjp(cov, grad, ridge)

    def trace_offset(self, ridge: Union[None, float, Tensor]) -> Union[float, Tensor]:
        """ItN's trace offset; ``ridge`` is read only with missing diagonal entries (few columns),
        where :attr:`needs_ridge` makes the callers pass it."""
        if not self.missing_diagonal:
            return 0.0
        assert ridge is not None, "the few-columns trace reads the ridge (needs_ridge)"
        return self.missing_diagonal * ridge


class _Call:
    """One call of the op: its shapes, execution plan, whitening and chunk sizes (no tensors)."""

    def __init__(self, x: Tensor, has_weight: bool, groups: int, T: int, eps: float, method: str) -> None:
        self.shapes = GroupShapes(x, groups)
        self.plan = plan_for(x.device)
        self.whitening = _Whitening(self.shapes, T, method, self.plan)
        self.eps = eps
        self.forward_step, self.backward_step = _chunk_steps(self.shapes, self.plan, has_weight)

    def ridge(self, scales: Optional[Tensor]) -> Union[float, Tensor]:
        """``eps``, or ``eps / s^2`` per sample (:func:`~.common.scaled_ridge`)."""
        return self.eps if scales is None else scaled_ridge(self.eps, scales)

    def affine(self, parameter: Optional[Tensor]) -> Optional[Tensor]:
        """An affine parameter in the compute dtype (``None`` stays ``None``)."""
        return None if parameter is None else parameter.detach().to(self.shapes.dtype)

    def spread(self, parameter: Tensor) -> Tensor:
        """A ``[C]`` parameter laid out by the plan to broadcast over ``(n, C, HW)`` views."""
        return self.plan.spread(parameter, self.shapes.spatial)

    def chunks(self, rows: Tensor) -> int:
        """The plan's slices of the columns for the ``g x g`` products of ``rows`` ``(n, g, m)``."""
        return self.plan.product_chunks(rows.shape[0], self.shapes.groups, self.shapes.m, rows.device)


def _chunk_steps(shapes: GroupShapes, plan: ExecutionPlan, has_weight: bool) -> Tuple[int, int]:
    """Samples per forward and backward pass, from the memory model (see GG_BUFFERS).

    Activation-sized temporaries per sample: centred copy, dY and Y buffers, casts; and in the
    backward pass the scaled copy of the input in place of a cast, left out of the budget for a
    plan that makes it only for huge inputs."""
    casts = 1 if shapes.casts else 0
    forward_temps = 1 + 2 * casts
    if shapes.few_columns:
        backward_temps = 3 + 3 * casts
    else:
        affine_buffer = 0 if shapes.one_channel_per_group or not has_weight else 1
        scaled_copy = 0 if plan.skips_unneeded_scaling else 1 - casts
        backward_temps = affine_buffer + 3 * casts + scaled_copy
    small = min(shapes.m, shapes.groups)
    matrix_values = GG_BUFFERS * small * small
    saved = shapes.samples * shapes.groups * shapes.groups if shapes.keeps_covariance else 0
    activation = shapes.samples * shapes.values
    steps = []
    for fraction, temps in ((FORWARD_FRACTION, forward_temps), (BACKWARD_FRACTION, backward_temps)):
        per_sample = temps * shapes.values + matrix_values
        steps.append(plan.chunk_size(shapes.samples, per_sample, matrix_values, shapes.itemsize,
                                     fraction * activation - saved))
    return steps[0], steps[1]


def _chunks(samples: int, step: int) -> Iterator[Tuple[int, int]]:
    for start in range(0, samples, step):
        yield start, min(start + step, samples)


def _add_ridge(matrices: Tensor, ridge: Union[float, Tensor]) -> Tensor:
    """Add ``ridge`` (a number or one value per matrix, ``(n, 1, 1)``) to the diagonals, in place."""
    diagonals = matrices.diagonal(dim1=1, dim2=2)
    diagonals.add_(ridge.squeeze(-1) if isinstance(ridge, Tensor) else ridge)
    return matrices


def _cross_products(a: Tensor, b: Tensor, chunks: int) -> Tensor:
    """``A_i B_i^T`` for every sample of ``a`` and ``b`` ``(n, g, m)`` (contiguous), ``(n, g, g)``.

    With ``chunks`` ``S > 1`` (the plan's :meth:`~.plans.base.ExecutionPlan.product_chunks`, for
    few samples on a GPU): the stacked samples ``(n g) x m`` cut into ``S`` slices of ``m / S``
    columns, one batched product of the slices ``(S, n g, n g)``, their sum, and the ``n``
    diagonal blocks of it (a view). The same sums in another order: equal up to rounding."""
    if chunks == 1:
        return torch.bmm(a, b.transpose(1, 2))
    n, g, m = a.shape
    stacked = torch.bmm(a.reshape(n * g, chunks, m // chunks).transpose(0, 1),
                        b.reshape(n * g, chunks, m // chunks).permute(1, 2, 0)).sum(dim=0)
    return stacked.view(n, g, n, g).diagonal(dim1=0, dim2=2).permute(2, 0, 1)


def _ridge_covariance(
    centred: Tensor, ridge: Union[float, Tensor], chunks: int, out: Optional[Tensor] = None
) -> Tensor:
    """``(1/m) X_C X_C^T + eps I`` for a centred chunk ``(n, g, m)`` (``chunks``: see
    :func:`_cross_products`). Centring explicitly (a temporary of the chunk's size) rather than
    using ``X X^T / m - mu mu^T`` avoids catastrophic cancellation in float32 when the means are
    large compared with the spread."""
    scale = 1.0 / centred.shape[2]
    if chunks == 1:
        cov = torch.bmm(centred, centred.transpose(1, 2), out=out).mul_(scale)
    else:
        cov = torch.mul(_cross_products(centred, centred, chunks), scale, out=out)
    return _add_ridge(cov, ridge)


def _gradient_cross_products(grad_y: Tensor, x: Tensor, row_sums: Tensor, mean: Tensor, chunks: int) -> Tensor:
    """``dY X_C^T = dY X^T - (dY 1) mu^T`` for ``(n, g, m)`` chunks (``chunks``: see
    :func:`_cross_products`)."""
    if chunks == 1:
        return torch.baddbmm(-row_sums * mean.transpose(1, 2), grad_y, x.transpose(1, 2))
    return torch.addcmul(_cross_products(grad_y, x, chunks), row_sums, mean.transpose(1, 2), value=-1.0)


def _gram(centred: Tensor, ridge: Union[float, Tensor], method: str) -> Tensor:
    """``S = (1/m) X_C^T X_C + eps I_m`` (few columns); for ZCA ``S + (tr(S)/m) 1 1^T / m``.

    The rows of ``X_C`` sum to zero, so ``1`` is an eigenvector of ``S`` with eigenvalue ``eps``,
    and ``X_C f(S)`` does not depend on ``f`` there. In floating point the rows sum to rounding
    errors, which ZCA's ``S^{-1/2}`` multiplies by ``eps^{-1/2}`` (about 2% of the output for
    float32 values near 100); raising that eigenvalue to the mean eigenvalue leaves the exact
    result and its gradient unchanged (the row means of ``dX`` are removed) and drops the error to
    rounding. ItN's polynomial stays bounded there and normalizes by the trace, so it keeps ``S``."""
    gram = torch.bmm(centred.transpose(1, 2), centred).mul_(1.0 / centred.shape[2])
    gram = _add_ridge(gram, ridge)
    if method == "zca":
        m = gram.shape[-1]
        gram.add_(gram.diagonal(dim1=1, dim2=2).sum(dim=1).view(-1, 1, 1) / (m * m))
    return gram


def _apply_affine(y: Tensor, gamma: Optional[Tensor], beta: Optional[Tensor], call: _Call) -> None:
    """``y = y * gamma + beta`` per channel, in place on ``(n, g, m)``."""
    per_channel = call.shapes.per_channel(y)
    if gamma is not None and beta is not None:
        torch.addcmul(call.spread(beta), per_channel, call.spread(gamma), out=per_channel)
    elif gamma is not None:
        per_channel.mul_(call.spread(gamma))
    elif beta is not None:
        per_channel.add_(call.spread(beta))


# ---- forward ----------------------------------------------------------------------------------


def _forward(
    x: Tensor, gamma: Optional[Tensor], beta: Optional[Tensor], call: _Call
) -> Tuple[Tensor, Tensor, Optional[Tensor], Optional[Tensor]]:
    shapes = call.shapes
    # The result must not be a view (detectron2's blocks apply relu_ to a norm's output).
    result = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    mean = torch.empty(shapes.samples, shapes.groups, 1, dtype=shapes.dtype, device=x.device)
    cov = scales = None
    if shapes.keeps_covariance:
        cov = torch.empty(shapes.samples, shapes.groups, shapes.groups, dtype=shapes.dtype, device=x.device)
    if shapes.samples:
        rows, out = shapes.rows(x), result.view(shapes.samples, shapes.groups, shapes.m)
        scales = call.plan.forward_scales(rows, shapes.dtype)
        for start, stop in _chunks(shapes.samples, call.forward_step):
            _forward_chunk(
                rows[start:stop], out[start:stop], mean[start:stop],
                None if cov is None else cov[start:stop],
                None if scales is None else scales[start:stop], gamma, beta, call,
            )
    return result, mean, cov, scales


def _scaled_centring(x: Tensor, scales: Tensor, mean_out: Tensor, one_pass: bool) -> Tuple[Tensor, Tensor]:
    """``(X' - mu' 1^T, mu')`` for ``X' = X / s`` (``scales`` ``1/s``, powers of two, so ``X / s`` is
    exact), the row means ``mu'`` written into ``mean_out``.

    With ``one_pass``, where float64 sums exist (CPU and CUDA) and the input is narrower,
    ``mu' = mean(X) / s`` from a float64 sum, which cannot overflow, and the centred values come from
    ``X`` in one pass: no scaled copy of the input is made. Otherwise ``X'`` is formed first and
    centred in place."""
    if one_pass and x.dtype != torch.float64 and x.device.type in ("cpu", "cuda"):
        mean = mean_out.copy_(torch.mean(x, dim=2, keepdim=True, dtype=torch.float64).mul_(scales))
        return torch.addcmul(mean.neg(), x, scales), mean
    scaled = x * scales
    mean = torch.mean(scaled, dim=2, keepdim=True, out=mean_out)
    return scaled.sub_(mean), mean


def _forward_chunk(
    x: Tensor,
    out: Tensor,
    mean_out: Tensor,
    cov_out: Optional[Tensor],
    scales: Optional[Tensor],
    gamma: Optional[Tensor],
    beta: Optional[Tensor],
    call: _Call,
) -> None:
    """Algorithm 1 and the affine for samples ``x`` ``(n, g, m)``, written into ``out``; the
    means (and covariances) of the samples scaled by ``scales`` (``None``: unscaled) go to
    ``mean_out`` (``cov_out``) for the backward pass."""
    shapes, whitening = call.shapes, call.whitening
    if scales is None:
        x = x.to(shapes.dtype)
        mean = torch.mean(x, dim=2, keepdim=True, out=mean_out)
        centred = x - mean
    else:
        centred, mean = _scaled_centring(x, scales, mean_out, call.plan.centres_scaled_input_in_one_pass)
    ridge = call.ridge(scales)
    target = out if out.dtype == shapes.dtype else torch.empty_like(centred)
    if shapes.few_columns:
        torch.bmm(centred, whitening.value(_gram(centred, ridge, whitening.method), ridge), out=target)
        _apply_affine(target, gamma, beta, call)
    elif shapes.one_channel_per_group:
        # rows are channels: Z = (diag(gamma) W) X_C + beta 1^T in one product
        matrix = whitening.value(_ridge_covariance(centred, ridge, call.chunks(centred), cov_out), ridge)
        if gamma is not None:
            matrix = matrix * gamma.view(-1, 1)
        if beta is not None:
            torch.baddbmm(beta.view(-1, 1), matrix, centred, out=target)
        else:
            torch.bmm(matrix, centred, out=target)
    else:
        matrix = whitening.value(_ridge_covariance(centred, ridge, call.chunks(centred), cov_out), ridge)
        torch.bmm(matrix, centred, out=target)
        _apply_affine(target, gamma, beta, call)
    if target is not out:
        out.copy_(target)


# ---- backward ---------------------------------------------------------------------------------


class _BackwardChunk(NamedTuple):
    """What the backward pass of one chunk of samples ``(n, g, m)`` reads and writes: its input,
    output gradient, saved means and covariances (``None``: recomputed), scales (``None``: 1), the
    slice of the input gradient to write (``None``: not needed), the affine weight, and the
    weight and bias gradients it accumulates into (``None``: not needed)."""

    x: Tensor
    grad_z: Tensor
    mean: Tensor
    cov: Optional[Tensor]
    scales: Optional[Tensor]
    grad_x: Optional[Tensor]
    gamma: Optional[Tensor]
    grad_weight: Optional["_Sum"]
    grad_bias: Optional["_Sum"]


class _Sum:
    """A gradient summed over chunks, starting from the first chunk's part (a whole-batch pass
    needs no zero-filled buffer and no addition)."""

    def __init__(self) -> None:
        self.value: Optional[Tensor] = None

    def __iadd__(self, part: Tensor) -> "_Sum":
        self.value = part if self.value is None else self.value.add_(part)
        return self

    def __isub__(self, part: Tensor) -> "_Sum":
        self.value = part.neg() if self.value is None else self.value.sub_(part)
        return self

    def total(self, size: int, like: Tensor) -> Tensor:
        """The sum, or zeros ``[size]`` of ``like``'s dtype and device when no chunk added to it."""
        if self.value is None:
            return torch.zeros(size, dtype=like.dtype, device=like.device)
        return self.value


def _backward(
    grad_out: Tensor,
    x: Tensor,
    gamma: Optional[Tensor],
    mean: Tensor,
    cov: Optional[Tensor],
    saved_scales: Tensor,
    call: _Call,
    needs_x: bool,
    needs_weight: bool,
    needs_bias: bool,
) -> Tuple[Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
    shapes = call.shapes
    grad_weight = _Sum() if needs_weight else None
    grad_bias = _Sum() if needs_bias else None
    grad_x = torch.empty(x.shape, dtype=x.dtype, device=x.device) if needs_x else None
    if shapes.samples:
        _backward_chunks(grad_out, x, gamma, mean, cov, saved_scales, call, grad_x, grad_weight, grad_bias)
    return (
        grad_x,
        None if grad_weight is None else grad_weight.total(shapes.channels, mean),
        None if grad_bias is None else grad_bias.total(shapes.channels, mean),
    )


def _backward_chunks(
    grad_out: Tensor,
    x: Tensor,
    gamma: Optional[Tensor],
    mean: Tensor,
    cov: Optional[Tensor],
    saved_scales: Tensor,
    call: _Call,
    grad_x: Optional[Tensor],
    grad_weight: Optional[_Sum],
    grad_bias: Optional[_Sum],
) -> None:
    shapes = call.shapes
    rows, grad_rows = shapes.rows(x), shapes.rows(grad_out)
    grad_x_rows = grad_x.view(rows.shape) if grad_x is not None else None
    scales = call.plan.backward_scales(rows, saved_scales, shapes.dtype)
    chunk_backward = _backward_few_columns if shapes.few_columns else _backward_chunk
    for start, stop in _chunks(shapes.samples, call.backward_step):
        chunk = _BackwardChunk(
            rows[start:stop],
            grad_rows[start:stop],
            mean[start:stop],
            None if cov is None else cov[start:stop],
            None if scales is None else scales[start:stop],
            None if grad_x_rows is None else grad_x_rows[start:stop],
            gamma,
            grad_weight,
            grad_bias,
        )
        chunk_backward(chunk, call)


def _backward_chunk(chunk: _BackwardChunk, call: _Call) -> None:
    """Algorithm 2 plus the affine for samples ``(n, g, m)`` (formulas in the module docstring),
    scaled by ``scales`` as in the forward pass: writes ``grad_x`` and accumulates into
    ``grad_weight`` and ``grad_bias``."""
    x, grad_z, mean, cov, scales, grad_x, gamma, grad_weight, grad_bias = chunk
    shapes = call.shapes
    x = x.to(shapes.dtype) if scales is None else x * scales
    # the ridge enters only through a recomputed covariance or a whitening that reads it
    ridge = call.ridge(scales) if cov is None or call.whitening.needs_ridge else None
    grad_z = grad_z.to(shapes.dtype)
    if cov is None:
        assert ridge is not None  # computed above whenever cov is None
        cov = _ridge_covariance(x - mean, ridge, call.chunks(x))
    m = shapes.m
    if shapes.one_channel_per_group:
        # rows are channels: dW = diag(gamma) dZ X_C^T, dgamma = row sums of W o (dZ X_C^T),
        # and W^T dY = (W^T diag(gamma)) dZ, so no activation-sized temporary is needed.
        row_sums = grad_z.sum(dim=2, keepdim=True)
        cross = _gradient_cross_products(grad_z, x, row_sums, mean, call.chunks(x))
        grad_whitening = cross * gamma.view(-1, 1) if gamma is not None else cross
        whitening, grad_cov = call.whitening.vjp(cov, grad_whitening, ridge)
        if grad_weight is not None:
            grad_weight += (whitening * cross).sum(dim=(0, 2))
        if grad_bias is not None:
            grad_bias += row_sums.sum(dim=0).view(-1)
        if grad_x is not None:
            left = whitening.transpose(1, 2)
            if gamma is not None:
                left = left * gamma.view(1, 1, -1)
            _input_gradient(grad_x, left, grad_z, row_sums / m, grad_cov, x, mean, m, scales)
        return
    n = x.shape[0]
    channel_sums = shapes.per_channel(grad_z).sum(dim=2)  # (n, C): dbeta and the sums of dY
    grad_y = grad_z
    if gamma is not None:
        grad_y = shapes.per_channel(grad_z).mul(call.spread(gamma)).view(grad_z.shape)
        row_sums = (channel_sums * gamma).view(n, shapes.groups, -1).sum(dim=2, keepdim=True)
    else:
        row_sums = channel_sums.view(n, shapes.groups, -1).sum(dim=2, keepdim=True)
    grad_whitening = _gradient_cross_products(grad_y, x, row_sums, mean, call.chunks(x))
    whitening, grad_cov = call.whitening.vjp(cov, grad_whitening, ridge)
    if grad_x is not None:
        _input_gradient(grad_x, whitening.transpose(1, 2), grad_y, row_sums / m, grad_cov, x, mean, m, scales)
    if grad_bias is not None:
        grad_bias += channel_sums.sum(dim=0)
    if grad_weight is not None:
        # dgamma = sum dZ o Y with Y = W X - (W mu) 1^T: sum dZ o (W X) (into dY's buffer if it
        # has one) minus the channel sums of dZ times W mu
        buffer = grad_y if grad_y is not grad_z else torch.empty_like(grad_z)
        del grad_y
        products = torch.bmm(whitening, x, out=buffer)
        grad_weight += shapes.per_channel(products.mul_(grad_z)).sum(dim=(0, 2))
        shifts = torch.bmm(whitening, mean).expand(n, shapes.groups, shapes.channels // shapes.groups)
        grad_weight -= (channel_sums * shifts.reshape(n, shapes.channels)).sum(dim=0)


def _input_gradient(
    target: Tensor,
    left: Tensor,
    grad_y: Tensor,
    grad_means: Tensor,
    grad_cov: Tensor,
    x: Tensor,
    mean: Tensor,
    m: int,
    scales: Optional[Tensor],
) -> None:
    """``target = left dY + B X - (left f + B mu) 1^T`` with ``B = 2 dS / m`` (module docstring;
    ``left`` is ``W^T``, times ``diag(gamma)`` when the affine is folded in), times ``scales``
    (``1 / s``: ``X`` is the scaled input) unless that is ``None``, folded into the ``g x g``
    matrices ``left`` and ``B`` rather than applied to the result."""
    scaled = grad_cov * (2.0 / m)
    if scales is not None:
        left, scaled = left * scales, scaled * scales
    offset = -(torch.bmm(left, grad_means) + torch.bmm(scaled, mean))
    if target.dtype == x.dtype:
        torch.baddbmm(offset, left, grad_y, out=target).baddbmm_(scaled, x)
    else:
        target.copy_(torch.baddbmm(offset, left, grad_y).baddbmm_(scaled, x))


def _backward_few_columns(chunk: _BackwardChunk, call: _Call) -> None:
    """The backward of ``Y = X_C W'(S)`` (module docstring, "Few columns") plus the affine,
    scaled by ``scales`` as in the forward pass (the m x m Gram matrix is recomputed, so
    ``chunk.cov`` is not used)."""
    x, grad_z, mean, _, scales, grad_x, gamma, grad_weight, grad_bias = chunk
    shapes = call.shapes
    centred = x.to(shapes.dtype) - mean if scales is None else (x * scales).sub_(mean)
    ridge = call.ridge(scales)
    grad_z = grad_z.to(shapes.dtype)
    grad_y = grad_z
    if gamma is not None:
        grad_y = shapes.per_channel(grad_z).mul(call.spread(gamma)).view(grad_z.shape)
    gram = _gram(centred, ridge, call.whitening.method)
    whitening, grad_gram = call.whitening.vjp(gram, torch.bmm(centred.transpose(1, 2), grad_y), ridge)
    if grad_x is not None:
        # the factors 1/s of the scaled input go into the m x m matrices, not the result
        right, grad_right = (whitening, grad_gram) if scales is None else (whitening * scales, grad_gram * scales)
        target = grad_x if grad_x.dtype == shapes.dtype else torch.empty_like(centred)
        torch.bmm(grad_y, right.transpose(1, 2), out=target)
        target.baddbmm_(centred, grad_right, alpha=2.0 / shapes.m)
        target.sub_(target.mean(dim=2, keepdim=True))
        if target is not grad_x:
            grad_x.copy_(target)
        del target
    if grad_bias is not None:
        grad_bias += shapes.per_channel(grad_z).sum(dim=(0, 2))
    if grad_weight is not None:
        whitened = torch.bmm(centred, whitening)
        grad_weight += shapes.per_channel(whitened.mul_(grad_z)).sum(dim=(0, 2))
