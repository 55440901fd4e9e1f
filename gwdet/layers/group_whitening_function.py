"""Group whitening with a fused per-channel affine as ``torch.library`` custom ops with a
closed-form backward: ``gwdet::group_whitening`` and ``gwdet::group_whitening_backward``.

What the ops compute is exactly :func:`gwdet.layers.group_whitening_reference` with the affine,
``y * weight + bias`` (GW Algorithm 1, Eqs. 8-10). Being custom ops with registered fake (shape)
kernels and an autograd formula that calls the backward op, they stay single opaque nodes under
``torch.compile`` (``fullgraph=True``), ``torch.export`` (training graphs included) and
``torch.jit.trace`` (see :mod:`gwdet.layers.tracing` for when the layers use them). What the ops
avoid, compared with differentiating the reference formulas by autograd:

* autograd keeps the centred copy of the input, the whitened output before the affine and the
  3T intermediate ``g x g`` products of ItN; here only the input, the group means and (when it is
  small) the ``g x g`` covariance are saved, and the whitening matrix is recomputed in the
  backward pass together with its gradient (:func:`~.whitening_matrix.itn_whitening_vjp`);
* the work over the activation is the minimum of ``g x g`` by ``g x m`` products per sample
  (``m = C/g HW``): forward covariance and ``W X_C`` (2), backward ``dY X^T``, ``W^T dY`` and
  ``S X`` (3, plus 1 to recompute ``W X_C`` for the affine weight's gradient when a group has
  more than one channel), with the centring of the backward folded into them as rank-one
  corrections;
* with one channel per group (``C == g``) the affine folds into the ``g x g`` matrices: forward
  ``Z = (diag(weight) W) X_C + bias``, backward ``(W^T diag(weight)) dZ``, and the weight's
  gradient comes from ``dZ X_C^T`` without a pass over the activation;
* with fewer columns than groups (``m < g``, e.g. ``(N, C)`` input with ``C < g^2``) the
  ``g x g`` covariance has rank at most ``m``, and the whole whitening runs on the ``m x m``
  Gram matrix instead (see "Few columns" below);
* samples are processed in chunks, so that temporaries (activation-sized buffers for the chunk
  and its ``g x g`` work) stay a fraction of the activation, and on CPU in cache.

Backward (Algorithm 2, one sample, ``X`` is ``g x m``, ``mu`` the row means,
``X_C = X - mu 1^T``, ``Y = W X_C``, ``Z = gamma o Y + beta``)::

    dbeta = sum dZ,  dgamma = sum dZ o Y,  dY = gamma o dZ
    dW    = dY X_C^T = dY X^T - (dY 1) mu^T
    dS    = psi_b(dW)                     (symmetric; ItN or ZCA backward of Sigma -> W)
    dX    = W^T dY + (2/m) dS X_C - (1/m) W^T dY 1 1^T
          = W^T dY + B X - (W^T f + B mu) 1^T,  B = 2 dS / m,  f = dY 1 / m

(the mean of ``(2/m) dS X_C`` over a row is zero, so subtracting the row mean of
``dL/dX_C`` (Algorithm 2, line 7) only touches the ``W^T dY`` term).

Few columns (``m < g``). With ``U = X_C / sqrt(m)``, ``Sigma = U U^T + eps I_g``; for every
polynomial ``p``, ``p(U U^T + eps I) U = U p(U^T U + eps I)``, and the same holds for
``x^{-1/2}`` through the SVD of ``U``. So ``W X_C = X_C W'`` with ``S = X_C^T X_C / m + eps I_m``
and ``W' = P_T(S / tau) / sqrt(tau)`` (ItN, ``tau = tr(Sigma) = tr(S) + (g - m) eps``, the trace
the ``g x g`` iteration normalizes by) or ``W' = S^{-1/2}`` (ZCA): exactly the same function,
with ``m x m`` instead of ``g x g`` matrices. Backward: ``dW' = X_C^T dY``,
``dS = psi_b(dW')``, ``dX_C = dY W'^T + (2/m) X_C dS`` and ``dX = dX_C`` minus its row means.

Precision: the statistics, whitening matrix and products run in float32 (float64 for float64
input) with autocast switched off; the affine is applied in that precision before the result is
rounded to the input dtype.

Huge inputs: a sample whose largest magnitude exceeds ``2**32`` (``2**256`` in float64) is
processed as ``X' = X / s`` with the ridge ``eps / s^2``, ``s`` the power of two of
:func:`~.common.magnitude_scales`. That is the same function: ``W X_C = W' X'_C`` for the
whitening matrix ``W'`` of the scaled covariance, so the forward pass needs no rescaling; the
saved means and covariances are those of ``X'``. The backward pass finds the same ``s`` from the
input, runs the formulas above on ``X'`` (the affine's gradients are unchanged, ``Y`` being the
same) and divides the input gradient by ``s``. Other samples are computed with ``s = 1``, i.e.
exactly as without scaling; on CPU a call in which no sample needs scaling (known there without a
device synchronisation) skips the scaling steps altogether.
"""
import math
from typing import Iterator, NamedTuple, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from .common import largest_magnitude, magnitude_scales, safe_exponent, scaled_ridge, statistics_dtype
from .whitening_matrix import (
    itn_whitening,
    itn_whitening_vjp,
    zca_whitening,
    zca_whitening_vjp,
)

# Samples are processed in chunks whose temporaries stay within a fraction of the activation's
# size (in the compute dtype): FORWARD_FRACTION while the forward pass holds only the output,
# BACKWARD_FRACTION (less any saved covariances) while the backward pass also holds the input
# gradient, so that the peak stays near GroupNorm's (output + input gradient, about 2.05
# activations): at most 2.6 activations, within the 1.3x of GroupNorm that docs/benchmarks.md
# targets. A sample's g x g work takes about GG_BUFFERS matrices (ItN backward). On CPU a
# chunk's g x g work is also kept within CACHE_BYTES per thread: batched 64 x 64 products run
# about 1.5x faster on 16 samples per thread than on 512, while much smaller chunks pay
# per-operation overhead (measured on a 2-core Xeon: 16 samples per chunk on 1 thread, 32 on 2).
# At least one sample at a time.
FORWARD_FRACTION = 1.1
BACKWARD_FRACTION = 0.6
GG_BUFFERS = 16
CACHE_BYTES = 4 * 2**20
# Below this many positions per channel, per-channel affine parameters are spread over the
# positions before broadcasting (see _Layout.spread; at most C x SHORT_SPATIAL values).
SHORT_SPATIAL = 1024


def keeps_covariance(values_per_sample: int, groups: int) -> bool:
    """Save the ``g x g`` covariance for the backward pass when it is at most a third of the
    sample's size; otherwise recompute it from the saved input."""
    return 3 * groups * groups <= values_per_sample


def saved_covariance_shape(shape: Sequence[int], groups: int) -> Tuple[int, ...]:
    """Shape of the covariances the forward op returns for the backward op: ``(N, g, g)`` when
    they are kept (see :func:`keeps_covariance`), else ``(0,)`` (recomputed in the backward)."""
    samples, values = shape[0], math.prod(shape[1:])
    few_columns = values // groups < groups
    if not few_columns and keeps_covariance(values, groups):
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
) -> Tuple[Tensor, Tensor, Tensor]:
    """``(group_whitening(x) * weight + bias, group means, covariances)``; ``groups`` divides ``C``.

    The means ``(N, g, 1)`` and covariances (:func:`saved_covariance_shape`), in the statistics
    dtype, are what the backward op needs besides the input; they are not differentiable.
    """
    layout = _Layout(x, weight is not None, groups, T, eps, method)
    with torch.autocast(device_type=x.device.type, enabled=False):
        out, mean, cov = _forward(x, layout.affine(weight), layout.affine(bias), layout)
    if cov is None:
        cov = torch.empty(0, dtype=layout.dtype, device=x.device)
    return out, mean, cov


@group_whitening_forward.register_fake
def _group_whitening_forward_fake(x, weight, bias, groups, T, eps, method):
    dtype = statistics_dtype(x.dtype)
    out = x.new_empty(x.shape)
    mean = x.new_empty((x.shape[0], groups, 1), dtype=dtype)
    cov = x.new_empty(saved_covariance_shape(x.shape, groups), dtype=dtype)
    return out, mean, cov


@torch.library.custom_op("gwdet::group_whitening_backward", mutates_args=())
def group_whitening_backward(
    grad_out: Tensor,
    x: Tensor,
    weight: Optional[Tensor],
    mean: Tensor,
    cov: Tensor,
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
    layout = _Layout(x, weight is not None, groups, T, eps, method)
    saved_cov = cov if cov.numel() else None
    with torch.autocast(device_type=x.device.type, enabled=False):
        grad_x, grad_weight, grad_bias = _backward(
            grad_out, x, layout.affine(weight), mean, saved_cov, layout,
            needs_x, needs_weight and weight is not None, needs_bias,
        )
    return (
        x.new_empty(0) if grad_x is None else grad_x,
        mean.new_empty(0) if grad_weight is None else grad_weight,
        mean.new_empty(0) if grad_bias is None else grad_bias,
    )


@group_whitening_backward.register_fake
def _group_whitening_backward_fake(grad_out, x, weight, mean, cov, groups, T, eps, method, needs_x, needs_weight, needs_bias):
    channels = x.shape[1]
    grad_x = x.new_empty(x.shape) if needs_x else x.new_empty(0)
    grad_weight = mean.new_empty(channels if needs_weight and weight is not None else 0)
    grad_bias = mean.new_empty(channels if needs_bias else 0)
    return grad_x, grad_weight, grad_bias


def _setup_context(ctx, inputs, output) -> None:
    x, weight, bias, groups, T, eps, method = inputs
    _, mean, cov = output
    ctx.save_for_backward(x, weight, mean, cov)
    ctx.bias_dtype = None if bias is None else bias.dtype
    ctx.hyper_parameters = (groups, T, eps, method)
    ctx.mark_non_differentiable(mean, cov)
    # the means and covariances get no gradient: without this autograd would allocate zeros of
    # their shape for the backward formula (the covariances' are (N, g, g), a third of the input)
    ctx.set_materialize_grads(False)


def _backward_formula(ctx, grad_out, grad_mean, grad_cov):
    del grad_mean, grad_cov  # not differentiable outputs
    if grad_out is None:  # nothing flows back (grads are not materialised, see _setup_context)
        return (None,) * 7
    x, weight, mean, cov = ctx.saved_tensors
    needs_x, needs_weight, needs_bias = ctx.needs_input_grad[:3]
    needs_weight = needs_weight and weight is not None
    needs_bias = needs_bias and ctx.bias_dtype is not None
    grad_x, grad_weight, grad_bias = group_whitening_backward(
        grad_out, x, weight, mean, cov, *ctx.hyper_parameters, needs_x, needs_weight, needs_bias
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


def fused_group_whitening(
    x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], groups: int, T: int, eps: float, method: str
) -> Tensor:
    """``group_whitening(x) * weight + bias`` by the custom op (``groups`` must divide ``C``)."""
    return group_whitening_forward(x, weight, bias, groups, T, eps, method)[0]


class _Layout:
    """Shapes, hyper-parameters and chunk sizes of one call (holds no tensors)."""

    def __init__(self, x: Tensor, has_weight: bool, groups: int, T: int, eps: float, method: str):
        self.dtype = statistics_dtype(x.dtype)
        self.samples = x.shape[0]
        self.channels = x.shape[1]
        self.values = math.prod(x.shape[1:])
        self.spatial = self.values // self.channels
        self.groups = groups
        self.m = self.values // groups  # columns of X_G
        self.T, self.eps, self.method = T, eps, method
        self.one_channel_per_group = self.channels == groups
        self.few_columns = self.m < groups
        self.keeps_covariance = not self.few_columns and keeps_covariance(self.values, groups)
        # activation-sized temporaries per sample: centred copy, dY and Y buffers, casts; and in the
        # backward pass the scaled copy of the input in place of a cast, which on CPU is made only
        # for huge inputs (:meth:`scales`) and is left out of the budget there
        device_type = x.device.type
        casts = 0 if x.dtype == self.dtype else 1
        forward_temps = 1 + 2 * casts
        if self.few_columns:
            backward_temps = 3 + 3 * casts
        else:
            affine_buffer = 0 if self.one_channel_per_group or not has_weight else 1
            scaled_copy = 0 if device_type == "cpu" else 1 - casts
            backward_temps = affine_buffer + 3 * casts + scaled_copy
        small = min(self.m, groups)
        saved = self.samples * groups * groups if self.keeps_covariance else 0
        activation = self.samples * self.values
        self.forward_step = self._chunk(FORWARD_FRACTION * activation - saved, forward_temps, small, device_type)
        self.backward_step = self._chunk(BACKWARD_FRACTION * activation - saved, backward_temps, small, device_type)

    def _chunk(self, budget: float, temps: int, small: int, device_type: str) -> int:
        gg_values = GG_BUFFERS * small * small
        chunk = int(budget // (temps * self.values + gg_values))
        if device_type == "cpu":
            cache = CACHE_BYTES * torch.get_num_threads()
            chunk = min(chunk, cache // (gg_values * torch.finfo(self.dtype).bits // 8))
        return max(1, min(self.samples, chunk))

    def scales(self, rows: Tensor) -> Optional[Tensor]:
        """The factors ``1/s`` of :func:`~.common.magnitude_scales` for the samples ``rows``
        ``(N, g, m)``, ``(N, 1, 1)`` in the compute dtype; ``None`` when every one is 1 and the
        input is on the CPU, where finding that out needs no device synchronisation: the samples
        are then processed unscaled. (Checked once per call, not per chunk: a small layer can run
        many chunks.)"""
        limit = 2.0 ** safe_exponent(self.dtype)
        if rows.device.type == "cpu" and max(float(rows.amax()), -float(rows.amin())) <= limit:
            return None
        return magnitude_scales(largest_magnitude(rows, [1, 2]).to(self.dtype))

    def ridge(self, scales: Optional[Tensor]) -> Union[float, Tensor]:
        """``eps``, or ``eps / s^2`` per sample (:func:`~.common.scaled_ridge`)."""
        return self.eps if scales is None else scaled_ridge(self.eps, scales)

    def affine(self, parameter: Optional[Tensor]) -> Optional[Tensor]:
        """An affine parameter in the compute dtype (``None`` stays ``None``)."""
        return None if parameter is None else parameter.detach().to(self.dtype)

    def rows(self, t: Tensor) -> Tensor:
        """``(N, C, *spatial)`` -> ``(N, g, m)`` (Eq. 8), a view of a contiguous tensor."""
        return t.contiguous().view(self.samples, self.groups, self.m)

    def spread(self, parameter: Tensor) -> Tensor:
        """A ``[C]`` parameter shaped to broadcast over :meth:`per_channel` views: ``(C, HW)``,
        materialised, when the spatial extent is short (a broadcast over a short innermost
        dimension runs 2-6x slower than one over the samples; measured at 7 x 7), else ``(C, 1)``."""
        column = parameter.view(-1, 1)
        if self.spatial < SHORT_SPATIAL:
            return column.expand(self.channels, self.spatial).contiguous()
        return column

    def per_channel(self, t: Tensor) -> Tensor:
        """``(n, g, m)`` -> ``(n, C, HW)``: the same memory seen per channel."""
        return t.view(t.shape[0], self.channels, self.spatial)

    @staticmethod
    def chunks(samples: int, step: int) -> Iterator[Tuple[int, int]]:
        for start in range(0, samples, step):
            yield start, min(start + step, samples)

    def whitening(self, cov: Tensor, ridge: Union[float, Tensor]) -> Tensor:
        """``cov^{-1/2}`` for covariances holding ``ridge`` (:meth:`ridge`); for few columns
        ``cov`` is the ``m x m`` Gram matrix ``S``."""
        if self.method == "itn":
            return itn_whitening(cov, self.T, self.trace_offset(ridge))
        return zca_whitening(cov, ridge)

    def whitening_vjp(self, cov: Tensor, grad: Tensor, ridge: Union[float, Tensor]) -> Tuple[Tensor, Tensor]:
        if self.method == "itn":
            return itn_whitening_vjp(cov, grad, self.T, self.trace_offset(ridge))
        return zca_whitening_vjp(cov, grad, ridge)

    def trace_offset(self, ridge: Union[float, Tensor]) -> Union[float, Tensor]:
        """``tr(Sigma) - tr(S)`` for few columns (0 otherwise): ItN normalizes by ``tr(Sigma)``."""
        return (self.groups - self.m) * ridge if self.few_columns else 0.0


def _add_ridge(matrices: Tensor, ridge: Union[float, Tensor]) -> Tensor:
    """Add ``ridge`` (a number or one value per matrix, ``(n, 1, 1)``) to the diagonals, in place."""
    diagonals = matrices.diagonal(dim1=1, dim2=2)
    diagonals.add_(ridge.squeeze(-1) if isinstance(ridge, Tensor) else ridge)
    return matrices


def _ridge_covariance(centred: Tensor, ridge: Union[float, Tensor], out: Optional[Tensor] = None) -> Tensor:
    """``(1/m) X_C X_C^T + eps I`` for a centred chunk ``(n, g, m)``. Centring explicitly (a
    temporary of the chunk's size) rather than using ``X X^T / m - mu mu^T`` avoids catastrophic
    cancellation in float32 when the means are large compared with the spread."""
    cov = torch.bmm(centred, centred.transpose(1, 2), out=out).mul_(1.0 / centred.shape[2])
    return _add_ridge(cov, ridge)


def _gram(centred: Tensor, ridge: Union[float, Tensor]) -> Tensor:
    """``S = (1/m) X_C^T X_C + eps I_m`` (few columns)."""
    gram = torch.bmm(centred.transpose(1, 2), centred).mul_(1.0 / centred.shape[2])
    return _add_ridge(gram, ridge)


def _apply_affine(y: Tensor, gamma: Optional[Tensor], beta: Optional[Tensor], layout: _Layout) -> None:
    """``y = y * gamma + beta`` per channel, in place on ``(n, g, m)``."""
    per_channel = layout.per_channel(y)
    if gamma is not None and beta is not None:
        torch.addcmul(layout.spread(beta), per_channel, layout.spread(gamma), out=per_channel)
    elif gamma is not None:
        per_channel.mul_(layout.spread(gamma))
    elif beta is not None:
        per_channel.add_(layout.spread(beta))


# ---- forward ----------------------------------------------------------------------------------


def _forward(
    x: Tensor, gamma: Optional[Tensor], beta: Optional[Tensor], layout: _Layout
) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    # The result must not be a view (detectron2's blocks apply relu_ to a norm's output).
    result = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    mean = torch.empty(layout.samples, layout.groups, 1, dtype=layout.dtype, device=x.device)
    cov = None
    if layout.keeps_covariance:
        cov = torch.empty(layout.samples, layout.groups, layout.groups, dtype=layout.dtype, device=x.device)
    if layout.samples:
        rows, out = layout.rows(x), result.view(layout.samples, layout.groups, layout.m)
        scales = layout.scales(rows)
        for start, stop in layout.chunks(layout.samples, layout.forward_step):
            _forward_chunk(
                rows[start:stop], out[start:stop], mean[start:stop],
                None if cov is None else cov[start:stop],
                None if scales is None else scales[start:stop], gamma, beta, layout,
            )
    return result, mean, cov


def _forward_chunk(
    x: Tensor,
    out: Tensor,
    mean_out: Tensor,
    cov_out: Optional[Tensor],
    scales: Optional[Tensor],
    gamma: Optional[Tensor],
    beta: Optional[Tensor],
    layout: _Layout,
) -> None:
    """Algorithm 1 and the affine for samples ``x`` ``(n, g, m)``, written into ``out``; the
    means (and covariances) of the samples scaled by ``scales`` (:meth:`_Layout.scales`) go to
    ``mean_out`` (``cov_out``) for the backward pass."""
    if scales is None:
        x = x.to(layout.dtype)
        mean = torch.mean(x, dim=2, keepdim=True, out=mean_out)
        centred = x - mean
    else:
        centred = x * scales
        mean = torch.mean(centred, dim=2, keepdim=True, out=mean_out)
        centred.sub_(mean)
    ridge = layout.ridge(scales)
    target = out if out.dtype == layout.dtype else torch.empty_like(centred)
    if layout.few_columns:
        torch.bmm(centred, layout.whitening(_gram(centred, ridge), ridge), out=target)
        _apply_affine(target, gamma, beta, layout)
    elif layout.one_channel_per_group:
        # rows are channels: Z = (diag(gamma) W) X_C + beta 1^T in one product
        whitening = layout.whitening(_ridge_covariance(centred, ridge, cov_out), ridge)
        if gamma is not None:
            whitening = whitening * gamma.view(-1, 1)
        if beta is not None:
            torch.baddbmm(beta.view(-1, 1), whitening, centred, out=target)
        else:
            torch.bmm(whitening, centred, out=target)
    else:
        whitening = layout.whitening(_ridge_covariance(centred, ridge, cov_out), ridge)
        torch.bmm(whitening, centred, out=target)
        _apply_affine(target, gamma, beta, layout)
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
    grad_weight: Optional[Tensor]
    grad_bias: Optional[Tensor]


def _backward(
    grad_out: Tensor,
    x: Tensor,
    gamma: Optional[Tensor],
    mean: Tensor,
    cov: Optional[Tensor],
    layout: _Layout,
    needs_x: bool,
    needs_weight: bool,
    needs_bias: bool,
) -> Tuple[Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
    device = x.device
    grad_weight = torch.zeros(layout.channels, dtype=layout.dtype, device=device) if needs_weight else None
    grad_bias = torch.zeros(layout.channels, dtype=layout.dtype, device=device) if needs_bias else None
    grad_x = torch.empty(x.shape, dtype=x.dtype, device=device) if needs_x else None
    if not layout.samples:
        return grad_x, grad_weight, grad_bias
    rows, grad_rows = layout.rows(x), layout.rows(grad_out)
    grad_x_rows = grad_x.view(rows.shape) if grad_x is not None else None
    scales = layout.scales(rows)  # the forward pass's, found again from the input
    chunk_backward = _backward_few_columns if layout.few_columns else _backward_chunk
    for start, stop in layout.chunks(layout.samples, layout.backward_step):
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
        chunk_backward(chunk, layout)
    return grad_x, grad_weight, grad_bias


def _backward_chunk(chunk: _BackwardChunk, layout: _Layout) -> None:
    """Algorithm 2 plus the affine for samples ``(n, g, m)`` (formulas in the module docstring),
    scaled by ``scales`` as in the forward pass: writes ``grad_x`` and accumulates into
    ``grad_weight`` and ``grad_bias``."""
    x, grad_z, mean, cov, scales, grad_x, gamma, grad_weight, grad_bias = chunk
    x = x.to(layout.dtype) if scales is None else x * scales
    ridge = layout.ridge(scales)
    grad_z = grad_z.to(layout.dtype)
    if cov is None:
        cov = _ridge_covariance(x - mean, ridge)
    m = layout.m
    if layout.one_channel_per_group:
        # rows are channels: dW = diag(gamma) dZ X_C^T, dgamma = row sums of W o (dZ X_C^T),
        # and W^T dY = (W^T diag(gamma)) dZ, so no activation-sized temporary is needed.
        row_sums = grad_z.sum(dim=2, keepdim=True)
        cross = torch.baddbmm(-row_sums * mean.transpose(1, 2), grad_z, x.transpose(1, 2))
        grad_whitening = cross * gamma.view(-1, 1) if gamma is not None else cross
        whitening, grad_cov = layout.whitening_vjp(cov, grad_whitening, ridge)
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
    channel_sums = layout.per_channel(grad_z).sum(dim=2)  # (n, C): dbeta and the sums of dY
    grad_y = grad_z
    if gamma is not None:
        grad_y = layout.per_channel(grad_z).mul(layout.spread(gamma)).view(grad_z.shape)
        row_sums = (channel_sums * gamma).view(n, layout.groups, -1).sum(dim=2, keepdim=True)
    else:
        row_sums = channel_sums.view(n, layout.groups, -1).sum(dim=2, keepdim=True)
    grad_whitening = torch.baddbmm(-row_sums * mean.transpose(1, 2), grad_y, x.transpose(1, 2))
    whitening, grad_cov = layout.whitening_vjp(cov, grad_whitening, ridge)
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
        grad_weight += layout.per_channel(products.mul_(grad_z)).sum(dim=(0, 2))
        shifts = torch.bmm(whitening, mean).expand(n, layout.groups, layout.channels // layout.groups)
        grad_weight -= (channel_sums * shifts.reshape(n, layout.channels)).sum(dim=0)


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
    (``1 / s``: ``X`` is the scaled input) unless that is ``None``."""
    scaled = grad_cov * (2.0 / m)
    offset = -(torch.bmm(left, grad_means) + torch.bmm(scaled, mean))
    if target.dtype == x.dtype:
        torch.baddbmm(offset, left, grad_y, out=target)
        target.baddbmm_(scaled, x)
        if scales is not None:
            target.mul_(scales)
    else:
        result = torch.baddbmm(offset, left, grad_y).baddbmm_(scaled, x)
        target.copy_(result if scales is None else result.mul_(scales))


def _backward_few_columns(chunk: _BackwardChunk, layout: _Layout) -> None:
    """The backward of ``Y = X_C W'(S)`` (module docstring, "Few columns") plus the affine,
    scaled by ``scales`` as in the forward pass (the m x m Gram matrix is recomputed, so
    ``chunk.cov`` is not used)."""
    x, grad_z, mean, _, scales, grad_x, gamma, grad_weight, grad_bias = chunk
    centred = x.to(layout.dtype) - mean if scales is None else (x * scales).sub_(mean)
    ridge = layout.ridge(scales)
    grad_z = grad_z.to(layout.dtype)
    grad_y = grad_z
    if gamma is not None:
        grad_y = layout.per_channel(grad_z).mul(layout.spread(gamma)).view(grad_z.shape)
    gram = _gram(centred, ridge)
    whitening, grad_gram = layout.whitening_vjp(gram, torch.bmm(centred.transpose(1, 2), grad_y), ridge)
    if grad_x is not None:
        target = grad_x if grad_x.dtype == layout.dtype else torch.empty_like(centred)
        torch.bmm(grad_y, whitening.transpose(1, 2), out=target)
        target.baddbmm_(centred, grad_gram, alpha=2.0 / layout.m)
        target.sub_(target.mean(dim=2, keepdim=True))
        if scales is not None:
            target.mul_(scales)
        if target is not grad_x:
            grad_x.copy_(target)
        del target
    if grad_bias is not None:
        grad_bias += layout.per_channel(grad_z).sum(dim=(0, 2))
    if grad_weight is not None:
        whitened = torch.bmm(centred, whitening)
        grad_weight += layout.per_channel(whitened.mul_(grad_z)).sum(dim=(0, 2))
