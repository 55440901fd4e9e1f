"""The ItN whitening matrix of a batch of covariances as one custom op with a closed-form backward:
``gwdet::itn_whitening`` and ``gwdet::itn_whitening_backward``.

For layers whose other steps autograd differentiates (batch whitening), in place of autograd
through the paper's iteration (GW Eqs. 6-7, :func:`~.whitening_matrix.inverse_sqrt_itn`): the op
computes the same function with :func:`~.whitening_matrix.itn_whitening` and its gradient with
:func:`~.whitening_matrix.itn_whitening_vjp` (GW Eqs. 18-19), run by the execution plan of the
tensors' device (:mod:`gwdet.layers.plans`). The gradient is that of the symmetric part of
``dL/dW``, which is all a covariance ``X X^T / m + eps I`` passes on. It stays one node under
``torch.compile`` and ``torch.export``; its products run in IEEE float32
(:func:`~.precision.ieee_float32_products`).
"""
import torch
from torch import Tensor

from .common import refuse_second_derivative
from .plans import plan_for
from .precision import ieee_float32_products


@torch.library.custom_op("gwdet::itn_whitening", mutates_args=())
def itn_whitening_op(cov: Tensor, T: int) -> Tensor:
    """``cov^{-1/2}`` by ``T`` Newton iterations for symmetric ridge covariances ``(n, k, k)``."""
    with ieee_float32_products(cov.device):
        return plan_for(cov.device).itn_whitening(cov, T, 0.0)


@itn_whitening_op.register_fake
def _itn_whitening_fake(cov, T):
    return cov.new_empty(cov.shape)


@torch.library.custom_op("gwdet::itn_whitening_backward", mutates_args=())
def itn_whitening_backward(cov: Tensor, grad: Tensor, T: int) -> Tensor:
    """``dL/dcov`` (symmetric) of :func:`itn_whitening_op` for ``grad = dL/dW``."""
    with ieee_float32_products(cov.device):
        return plan_for(cov.device).itn_whitening_vjp(cov, grad, T, 0.0)[1]


@itn_whitening_backward.register_fake
def _itn_whitening_backward_fake(cov, grad, T):
    return cov.new_empty(cov.shape)


def _setup_context(ctx, inputs, output) -> None:
    cov, T = inputs
    ctx.save_for_backward(cov)
    ctx.T = T


def _backward_formula(ctx, grad):
    (cov,) = ctx.saved_tensors
    return itn_whitening_backward(cov, grad, ctx.T), None


itn_whitening_op.register_autograd(_backward_formula, setup_context=_setup_context)
# where the op has no formula (second derivatives, torch.func's transforms)
CPU_PLAN_ADVICE = ("for them, set GWDET_GW_PLAN=cpu, under which BW differentiates the paper's iteration by "
                   "autograd, to any order")
itn_whitening_backward.register_autograd(refuse_second_derivative("BatchWhitening (ItN)", CPU_PLAN_ADVICE))
