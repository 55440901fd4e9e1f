"""Group whitening with a fused per-channel affine as one autograd Function (closed-form backward).

What the Function computes is exactly :func:`gwdet.layers.group_whitening` followed by
``y * weight + bias`` (GW Algorithm 1, Eqs. 8-10). What it avoids, compared with differentiating
those formulas by autograd:

* autograd keeps the centred copy of the input, the whitened output before the affine and the
  3T intermediate ``g x g`` products of ItN; here only the input, the group means and (when it is
  small) the ``g x g`` covariance are saved, and the whitening matrix is recomputed in the
  backward pass together with its gradient (:func:`~.whitening_matrix.itn_whitening_vjp`);
* the work over the activation is the minimum of ``g x g`` by ``g x (C/g HW)`` products per
  sample: forward covariance and ``W X_C`` (2), backward ``dY X^T``, ``W^T dY`` and ``S X``
  (3, plus 1 to recompute ``W X_C`` for the affine weight's gradient when a group has more than
  one channel), with the centring of the backward folded into them as rank-one corrections;
* with one channel per group (``C == g``) the affine folds into the ``g x g`` matrices: forward
  ``Z = (diag(weight) W) X_C + bias``, backward ``(W^T diag(weight)) dZ``, and the weight's
  gradient comes from ``dZ X_C^T`` without a pass over the activation;
* samples are processed in chunks, so that temporaries (one activation-sized buffer for the
  chunk plus the ``g x g`` work of the chunk) stay a fraction of the activation.

Backward (Algorithm 2, one sample, ``X`` is ``g x m`` with ``m = C/g HW``, ``mu`` the row means,
``X_C = X - mu 1^T``, ``Y = W X_C``, ``Z = gamma o Y + beta``)::

    dbeta = sum dZ,  dgamma = sum dZ o Y,  dY = gamma o dZ
    dW    = dY X_C^T = dY X^T - (dY 1) mu^T
    dS    = psi_b(dW)                     (symmetric; ItN or ZCA backward of Sigma -> W)
    dX    = W^T dY + (2/m) dS X_C - (1/m) W^T dY 1 1^T
          = W^T dY + B X - (W^T f + B mu) 1^T,  B = 2 dS / m,  f = dY 1 / m

(the mean of ``(2/m) dS X_C`` over a row is zero, so subtracting the row mean of
``dL/dX_C`` (Algorithm 2, line 7) only touches the ``W^T dY`` term).

Precision: the statistics, whitening matrix and products run in float32 (float64 for float64
input) with autocast switched off; the affine is applied in that precision before the result is
rounded to the input dtype.
"""
import math
from typing import Optional, Tuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ._common import statistics_dtype
from .whitening_matrix import (
    itn_whitening,
    itn_whitening_vjp,
    zca_whitening,
    zca_whitening_vjp,
)

# Temporaries of one chunk (an activation-sized buffer per sample and the g x g work) may use up
# to this fraction of the activation's size (in the compute dtype); at least one sample is done
# at a time. The g x g work per sample is about GG_BUFFERS matrices of g x g during the ItN
# backward.
CHUNK_FRACTION = 0.5
GG_BUFFERS = 16


def samples_per_chunk(num_samples: int, values_per_sample: int, groups: int) -> int:
    """How many samples to process together (see :data:`CHUNK_FRACTION`)."""
    per_sample = 2 * values_per_sample + GG_BUFFERS * groups * groups
    budget = CHUNK_FRACTION * num_samples * values_per_sample
    return max(1, min(num_samples, int(budget // per_sample)))


def keeps_covariance(values_per_sample: int, groups: int) -> bool:
    """Save the ``g x g`` covariance for the backward pass only when it is small (at most 1/8 of
    the sample); otherwise recompute it from the saved input."""
    return 8 * groups * groups <= values_per_sample


def _whitening(cov: Tensor, method: str, T: int, eps: float) -> Tensor:
    if method == "itn":
        return itn_whitening(cov, T)
    return zca_whitening(cov, eps)


def _whitening_vjp(cov: Tensor, grad: Tensor, method: str, T: int, eps: float) -> Tuple[Tensor, Tensor]:
    if method == "itn":
        return itn_whitening_vjp(cov, grad, T)
    return zca_whitening_vjp(cov, grad, eps)


def _centred_covariance(x: Tensor, mean: Tensor, eps: float) -> Tuple[Tensor, Tensor]:
    """``X_C`` and ``(1/m) X_C X_C^T + eps I`` for a chunk ``x`` ``(n, g, m)`` with means
    ``(n, g, 1)``. Centred explicitly (a temporary of the chunk's size) rather than as
    ``X X^T / m - mu mu^T``, which cancels catastrophically in float32 when means are large."""
    centred = x - mean
    ridge = torch.eye(x.shape[1], dtype=x.dtype, device=x.device).mul_(eps)
    cov = torch.baddbmm(
        ridge.expand(x.shape[0], -1, -1), centred, centred.transpose(1, 2), alpha=1.0 / x.shape[2]
    )
    return centred, cov


class GroupWhiteningFunction(torch.autograd.Function):
    """``apply(x, weight, bias, groups, T, eps, method)`` -> ``group_whitening(x) * weight + bias``.

    ``x`` is ``(N, C, *spatial)`` with ``C`` divisible by ``groups``; ``weight`` and ``bias`` are
    ``[C]`` or ``None``. First derivatives only (``once_differentiable``).
    """

    @staticmethod
    def forward(ctx, x, weight, bias, groups, T, eps, method):
        with torch.autocast(device_type=x.device.type, enabled=False):
            out, mean, cov = _forward(x, weight, bias, groups, T, eps, method)
        ctx.groups, ctx.T, ctx.eps, ctx.method = groups, T, eps, method
        ctx.save_for_backward(x, weight, bias, mean, cov)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        x, weight, bias, mean, cov = ctx.saved_tensors
        needs_x, needs_weight, needs_bias = ctx.needs_input_grad[:3]
        with torch.autocast(device_type=x.device.type, enabled=False):
            grad_x, grad_weight, grad_bias = _backward(
                grad_out, x, weight, mean, cov, ctx.groups, ctx.T, ctx.eps, ctx.method,
                needs_x, needs_weight and weight is not None, needs_bias and bias is not None,
            )
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        if grad_bias is not None:
            grad_bias = grad_bias.to(bias.dtype)
        return grad_x, grad_weight, grad_bias, None, None, None, None


def _forward(
    x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], groups: int, T: int, eps: float, method: str
) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    num_samples, channels = x.shape[0], x.shape[1]
    dtype = statistics_dtype(x.dtype)
    values = math.prod(x.shape[1:])
    rows = x.contiguous().view(num_samples, groups, values // groups)
    m = rows.shape[2]
    spatial = values // channels
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    mean_all = torch.empty(num_samples, groups, 1, dtype=dtype, device=x.device)
    cov_all = (
        torch.empty(num_samples, groups, groups, dtype=dtype, device=x.device)
        if keeps_covariance(values, groups)
        else None
    )
    if num_samples == 0:
        return out.view(x.shape), mean_all, cov_all
    gamma = weight.to(dtype) if weight is not None else None
    beta = bias.to(dtype) if bias is not None else None
    one_channel_per_group = channels == groups
    step = samples_per_chunk(num_samples, values, groups)
    for start in range(0, num_samples, step):
        stop = min(start + step, num_samples)
        chunk = rows[start:stop].to(dtype)
        mean = chunk.mean(dim=2, keepdim=True)
        centred, cov = _centred_covariance(chunk, mean, eps)
        whitening = _whitening(cov, method, T, eps)
        in_place = out.dtype == dtype
        target = out[start:stop] if in_place else torch.empty_like(centred)
        if one_channel_per_group and gamma is not None:
            whitening = whitening * gamma.view(groups, 1)
        if one_channel_per_group and beta is not None:
            torch.baddbmm(beta.view(groups, 1), whitening, centred, out=target)
        else:
            torch.bmm(whitening, centred, out=target)
            if not one_channel_per_group and (gamma is not None or beta is not None):
                per_channel = target.view(stop - start, channels, spatial)
                if gamma is not None and beta is not None:
                    torch.addcmul(beta.view(channels, 1), per_channel, gamma.view(channels, 1), out=per_channel)
                elif gamma is not None:
                    per_channel.mul_(gamma.view(channels, 1))
                else:
                    per_channel.add_(beta.view(channels, 1))
        del centred
        if not in_place:
            out[start:stop].copy_(target)
        mean_all[start:stop] = mean
        if cov_all is not None:
            cov_all[start:stop] = cov
    return out.view(x.shape), mean_all, cov_all


def _backward(
    grad_out: Tensor,
    x: Tensor,
    weight: Optional[Tensor],
    mean_all: Tensor,
    cov_all: Optional[Tensor],
    groups: int,
    T: int,
    eps: float,
    method: str,
    needs_x: bool,
    needs_weight: bool,
    needs_bias: bool,
) -> Tuple[Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
    num_samples, channels = x.shape[0], x.shape[1]
    dtype = mean_all.dtype
    device = x.device
    grad_weight = torch.zeros(channels, dtype=dtype, device=device) if needs_weight else None
    grad_bias = torch.zeros(channels, dtype=dtype, device=device) if needs_bias else None
    grad_x = torch.empty(x.shape, dtype=x.dtype, device=device) if needs_x else None
    if num_samples == 0:
        if grad_x is not None:
            grad_x.zero_()
        return grad_x, grad_weight, grad_bias
    values = math.prod(x.shape[1:])
    rows = x.contiguous().view(num_samples, groups, values // groups)
    grad_rows = grad_out.contiguous().view(rows.shape)
    grad_x_rows = grad_x.view(rows.shape) if grad_x is not None else None
    m = rows.shape[2]
    spatial = values // channels
    gamma = weight.to(dtype) if weight is not None else None
    one_channel_per_group = channels == groups
    step = samples_per_chunk(num_samples, values, groups)
    for start in range(0, num_samples, step):
        stop = min(start + step, num_samples)
        n = stop - start
        chunk = rows[start:stop].to(dtype)
        grad_chunk = grad_rows[start:stop].to(dtype)
        mean = mean_all[start:stop]
        cov = cov_all[start:stop] if cov_all is not None else _centred_covariance(chunk, mean, eps)[1]
        if one_channel_per_group:
            # dZ X_C^T gives dW (rows scaled by gamma) and dgamma (row sums of W o dZ X_C^T).
            row_sums = grad_chunk.sum(dim=2, keepdim=True)
            cross = torch.baddbmm(-row_sums * mean.transpose(1, 2), grad_chunk, chunk.transpose(1, 2))
            grad_whitening = cross * gamma.view(groups, 1) if gamma is not None else cross
            whitening, grad_cov = _whitening_vjp(cov, grad_whitening, method, T, eps)
            if grad_weight is not None:
                grad_weight += (whitening * cross).sum(dim=(0, 2))
            if grad_bias is not None:
                grad_bias += row_sums.sum(dim=0).view(channels)
            if grad_x_rows is not None:
                left = whitening.transpose(1, 2)
                grad_means = row_sums / m
                if gamma is not None:
                    left = left * gamma.view(1, 1, groups)
                _input_gradient(grad_x_rows[start:stop], left, grad_chunk, grad_means, grad_cov, chunk, mean, m)
            continue
        if gamma is not None:
            grad_y = (grad_chunk.view(n, channels, spatial) * gamma.view(channels, 1)).view(grad_chunk.shape)
        else:
            grad_y = grad_chunk
        row_sums = grad_y.sum(dim=2, keepdim=True)
        grad_whitening = torch.baddbmm(-row_sums * mean.transpose(1, 2), grad_y, chunk.transpose(1, 2))
        whitening, grad_cov = _whitening_vjp(cov, grad_whitening, method, T, eps)
        if grad_x_rows is not None:
            _input_gradient(
                grad_x_rows[start:stop], whitening.transpose(1, 2), grad_y, row_sums / m, grad_cov, chunk, mean, m
            )
        if grad_bias is not None:
            grad_bias += grad_chunk.view(n, channels, spatial).sum(dim=(0, 2))
        if grad_weight is not None:
            # Recompute Y = W X_C into grad_y's buffer when it is a temporary.
            buffer = grad_y if grad_y is not grad_chunk else torch.empty_like(grad_chunk)
            del grad_y
            whitened = torch.baddbmm(-torch.bmm(whitening, mean), whitening, chunk, out=buffer)
            grad_weight += whitened.mul_(grad_chunk).view(n, channels, spatial).sum(dim=(0, 2))
    return grad_x, grad_weight, grad_bias


def _input_gradient(
    target: Tensor,
    left: Tensor,
    grad_y: Tensor,
    grad_means: Tensor,
    grad_cov: Tensor,
    chunk: Tensor,
    mean: Tensor,
    m: int,
) -> None:
    """``target = left dY + B X - (left f + B mu) 1^T`` with ``B = 2 dS / m`` (module docstring;
    ``left`` is ``W^T``, times ``diag(gamma)`` when the affine is folded in)."""
    scaled = grad_cov * (2.0 / m)
    offset = -(torch.bmm(left, grad_means) + torch.bmm(scaled, mean))
    if target.dtype == chunk.dtype:
        torch.baddbmm(offset, left, grad_y, out=target)
        target.baddbmm_(scaled, chunk)
    else:
        result = torch.baddbmm(offset, left, grad_y)
        result.baddbmm_(scaled, chunk)
        target.copy_(result)
