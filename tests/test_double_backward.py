"""Second derivatives (double backward, gradient penalties, Hessian-vector products) of every
whitening and normalization path, in every mode: either the true ones (torch.autograd.gradgradcheck
in float64, which compares them with finite differences of the first derivative) or a refusal by a
:class:`~gwdet.errors.GwdetError` that names what has them. Never numbers that are not the second
derivative.

* ``GroupWhitening`` (ItN and ZCA): the fused op refuses (its backward op has no derivative).
* ``group_whitening_reference``: ItN has them (autograd through the iteration); ZCA refuses
  (``gwdet::zca_whitening``, :func:`gwdet.layers.whitening_matrix.inverse_sqrt_zca`).
* ``BatchWhitening`` in training: ZCA refuses under every plan; ItN has them under the ``cpu``
  plan and refuses under the others (the closed-form op ``gwdet::itn_whitening``). In evaluation
  the running statistics are constants and both have them.
* ``BatchGroupNorm``: plain autograd, so it has them in training and evaluation.

The same fused ops under ``torch.func``'s differentiating transforms (grad, jvp) and forward-mode
AD are refused by name too (before: torch's "must override the setup_context staticmethod", or,
under ``jvp``, a tangent of zeros without a word); ``torch.vmap`` alone runs them.

The ZCA op keeps first derivatives exactly as the ATen formulation (what TorchScript records)
computes them: checked bit for bit here, and against finite differences.
"""
import re

import pytest
import torch

from gwdet.errors import GwdetError, GwdetRuntimeError
from gwdet.layers import BatchGroupNorm, BatchWhitening, GroupWhitening, group_whitening_reference
from gwdet.layers.plans import PLAN_VARIABLE
from gwdet.layers.whitening_matrix import (
    ZCA_SECOND_DERIVATIVES,
    _zca_recorded,
    inverse_sqrt_zca,
    whitening_matrix,
    zca_whitening_op,
)

GW_REFUSAL = re.escape("GroupWhitening: second derivatives (a backward pass through gradients computed with create_graph=True)")
BW_ITN_REFUSAL = re.escape("BatchWhitening (ItN): second derivatives")


def double_backward(function, *inputs):
    """A backward pass through a gradient computed with ``create_graph=True``."""
    out = function(*inputs)
    grads = torch.autograd.grad(out.pow(3).sum(), inputs, create_graph=True)
    sum(grad.square().sum() for grad in grads).backward()


def sample(shape, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=generator, dtype=torch.float64) * 2.0 + 0.5
    return x.requires_grad_()


def with_affine(layer):
    torch.manual_seed(1)
    with torch.no_grad():
        layer.weight.uniform_(0.5, 1.5)
        layer.bias.uniform_(-1.0, 1.0)
    return layer.double()


def covariances(count=3, size=4, seed=0, dtype=torch.float64):
    generator = torch.Generator().manual_seed(seed)
    data = torch.randn(count, size, 2 * size + 1, generator=generator, dtype=dtype)
    return data @ data.transpose(1, 2) / data.shape[-1] + 1e-3 * torch.eye(size, dtype=dtype)


# ---- refusals ---------------------------------------------------------------------------------


def under_grad(function, x):
    return torch.func.grad(lambda t: function(t).pow(2).sum())(x)


def under_jvp(function, x):
    return torch.func.jvp(function, (x,), (torch.ones_like(x),))[1]


def under_forward_ad(function, x):
    with torch.autograd.forward_ad.dual_level():
        dual = torch.autograd.forward_ad.make_dual(x, torch.ones_like(x))
        return torch.autograd.forward_ad.unpack_dual(function(dual)).tangent


FUSED_OPS = {  # name: (plan, function of a (4, 8, 2, 2) float64 input), each through a fused op
    "GW": ("cpu", lambda: with_affine(GroupWhitening(8, num_groups=4))),
    "GW_ZCA": ("cpu", lambda: with_affine(GroupWhitening(8, num_groups=4, method="zca"))),
    "zca reference": ("cpu", lambda: (lambda t: group_whitening_reference(t, 2, method="zca"))),
    "BW": ("cpu", lambda: with_affine(BatchWhitening(8, group_size=4, method="zca")).train()),
    "BW_ItN, accelerator plan": ("accelerator",
                                 lambda: with_affine(BatchWhitening(8, group_size=4, method="itn")).train()),
}


@pytest.mark.parametrize("transform", [under_grad, under_jvp, under_forward_ad], ids=lambda f: f.__name__)
@pytest.mark.parametrize("name", list(FUSED_OPS))
def test_differentiating_function_transforms_are_refused_by_name(name, transform, monkeypatch):
    plan, build = FUSED_OPS[name]
    monkeypatch.setenv(PLAN_VARIABLE, plan)
    with pytest.raises(GwdetRuntimeError, match="torch.func transforms that differentiate .* cannot run it; for them"):
        transform(build(), sample((4, 8, 2, 2)).detach())


def test_vmap_runs_the_fused_op_and_the_itn_reference_has_function_transform_gradients():
    layer, x = with_affine(GroupWhitening(8, num_groups=4)), sample((4, 8, 2, 2)).detach()
    assert torch.equal(torch.func.vmap(layer)(x.unsqueeze(1)).squeeze(1), torch.cat([layer(s[None]) for s in x]))
    reference = lambda t: group_whitening_reference(t, 4, 5, 1e-5, "itn", layer.weight, layer.bias)  # noqa: E731
    expected, = torch.autograd.grad(reference(x.requires_grad_()).pow(2).sum(), x)
    assert torch.allclose(under_grad(reference, x.detach()), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("plan", ["cpu", "accelerator"])
@pytest.mark.parametrize("method", ["itn", "zca"])
def test_group_whitening_layer_refuses_second_derivatives(method, plan, monkeypatch):
    monkeypatch.setenv(PLAN_VARIABLE, plan)
    layer = with_affine(GroupWhitening(8, num_groups=4, method=method))
    with pytest.raises(GwdetRuntimeError, match=GW_REFUSAL):
        double_backward(layer, sample((3, 8, 2, 2)))


def test_zca_reference_refuses_second_derivatives_by_name():
    x = sample((3, 4, 5))
    with pytest.raises(GwdetRuntimeError) as refused:
        double_backward(lambda t: group_whitening_reference(t, 2, method="zca"), x)
    assert str(refused.value) == ZCA_SECOND_DERIVATIVES
    assert isinstance(refused.value, GwdetError) and isinstance(refused.value, RuntimeError)
    assert "group_whitening_reference(x, num_groups, T, eps, 'itn', weight, bias)" in ZCA_SECOND_DERIVATIVES
    # the advice for BW led, in training, to torch's refusal of the running statistics' in-place update
    assert "BW under torch.func in evaluation mode only" in ZCA_SECOND_DERIVATIVES


@pytest.mark.parametrize("plan", ["cpu", "accelerator"])
def test_batch_whitening_zca_refuses_second_derivatives_under_every_plan(plan, monkeypatch):
    monkeypatch.setenv(PLAN_VARIABLE, plan)
    layer = with_affine(BatchWhitening(8, group_size=4, method="zca")).train()
    with pytest.raises(GwdetRuntimeError) as refused:
        double_backward(layer, sample((4, 8, 2, 2)))
    assert str(refused.value) == ZCA_SECOND_DERIVATIVES


def test_batch_whitening_itn_refuses_second_derivatives_outside_the_cpu_plan(monkeypatch):
    monkeypatch.setenv(PLAN_VARIABLE, "accelerator")
    layer = with_affine(BatchWhitening(8, group_size=4, method="itn")).train()
    with pytest.raises(GwdetRuntimeError, match=BW_ITN_REFUSAL):
        double_backward(layer, sample((4, 8, 2, 2)))


def test_zca_refuses_even_where_the_incoming_gradient_does_not_depend_on_the_covariance():
    # L = <C, W(Sigma)> with a constant C: dL/dW = C is no function of Sigma, but dL/dSigma is,
    # through the eigenvectors; a gradient penalty on it must not treat it as a constant
    cov = covariances().requires_grad_()
    weights = torch.randn(cov.shape, dtype=torch.float64)
    (grad,) = torch.autograd.grad((inverse_sqrt_zca(cov, torch.full((3, 1, 1), 1e-3, dtype=torch.float64))
                                   * weights).sum(), cov, create_graph=True)
    assert grad.requires_grad
    with pytest.raises(GwdetRuntimeError, match="ZCA whitening"):
        grad.square().sum().backward()


# ---- true second derivatives ---------------------------------------------------------------------


def test_itn_reference_has_true_second_derivatives():
    x = sample((2, 4, 3))
    weight = (torch.rand(4, dtype=torch.float64) + 0.5).requires_grad_()
    bias = torch.randn(4, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradgradcheck(
        lambda t, w, b: group_whitening_reference(t, 2, 3, 1e-3, "itn", w, b), (x, weight, bias))


def test_batch_whitening_itn_under_the_cpu_plan_has_true_second_derivatives(monkeypatch):
    monkeypatch.setenv(PLAN_VARIABLE, "cpu")
    layer = with_affine(BatchWhitening(4, group_size=2, T=3, eps=1e-3, method="itn")).train()
    assert torch.autograd.gradgradcheck(layer, (sample((3, 4, 2, 1)),))


@pytest.mark.parametrize("method", ["itn", "zca"])
def test_batch_whitening_in_evaluation_has_true_second_derivatives(method):
    layer = with_affine(BatchWhitening(4, group_size=2, method=method))
    layer(sample((6, 4, 3, 3)).detach())  # running statistics that are not the identity
    layer.eval()
    assert torch.autograd.gradgradcheck(layer, (sample((2, 4, 2, 1)),))


@pytest.mark.parametrize("training", [True, False], ids=["training", "evaluation"])
def test_batch_group_norm_has_true_second_derivatives(training):
    layer = with_affine(BatchGroupNorm(4, num_groups=2, examples_per_group=2, eval_example_weight=0.5))
    layer(sample((4, 4, 3, 3)).detach())
    layer.train(training)
    assert torch.autograd.gradgradcheck(layer, (sample((4, 4, 2, 1)),))


# ---- ZCA's first derivatives are what they were ---------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("size", [4, 16, 64])
def test_zca_op_gives_the_recorded_formulation_s_value_and_gradient_bit_for_bit(size, dtype):
    cov = covariances(count=3, size=size, dtype=dtype)
    floor = torch.full((3, 1, 1), 1e-3, dtype=dtype)
    grad = torch.randn(cov.shape, generator=torch.Generator().manual_seed(5), dtype=dtype)
    by_op, recorded = cov.clone().requires_grad_(), cov.clone().requires_grad_()
    value, expected_value = inverse_sqrt_zca(by_op, floor), _zca_recorded(recorded, floor)
    (got,) = torch.autograd.grad(value, by_op, grad)
    (expected,) = torch.autograd.grad(expected_value, recorded, grad)
    assert torch.equal(value, expected_value)
    assert torch.equal(got, expected)


def test_zca_first_derivatives_match_finite_differences():
    # through a symmetric Sigma(X) = X X^T / m + eps I, as every layer forms it
    data = torch.randn(2, 4, 9, dtype=torch.float64, requires_grad=True)
    floor = torch.full((2, 1, 1), 1e-3, dtype=torch.float64)

    def whitened(x):
        centred = x - x.mean(dim=-1, keepdim=True)
        cov = centred @ centred.transpose(1, 2) / x.shape[-1] + 1e-3 * torch.eye(4, dtype=x.dtype)
        return whitening_matrix(cov, "zca", 5, floor) @ centred

    assert torch.autograd.gradcheck(whitened, (data,))


def test_zca_op_passes_opcheck():
    cov = covariances().requires_grad_()
    floor = torch.full((3, 1, 1), 1e-3, dtype=torch.float64)
    torch.library.opcheck(zca_whitening_op, (cov, floor))


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
def test_a_trace_of_the_zca_reference_with_gradients_holds_only_aten_ops():
    # the op is for eager mode, torch.compile and torch.export; a recorded graph keeps ATen ops
    x = sample((3, 4, 5))
    # (the trace's own check reruns it without gradients, where the graph has no first-order term)
    traced = torch.jit.trace(lambda t: group_whitening_reference(t, 2, method="zca"), (x,), check_trace=False)
    kinds = {node.kind() for node in traced.graph.nodes()}
    assert "aten::linalg_eigh" in kinds and not any(kind.startswith(("gwdet::", "prim::PythonOp")) for kind in kinds)
    (got,) = torch.autograd.grad(traced(x).pow(3).sum(), x)
    (expected,) = torch.autograd.grad(group_whitening_reference(x, 2, method="zca").pow(3).sum(), x)
    assert torch.allclose(got, expected, rtol=0, atol=1e-12)


def test_the_recorded_formulation_s_second_derivatives_are_not_zca_s():
    # why eager mode runs the op: differentiated twice, the ATen formulation treats the
    # eigenvectors and divided differences as constants, and finite differences disagree
    data = torch.randn(1, 3, 7, dtype=torch.float64, requires_grad=True)
    floor = torch.full((1, 1, 1), 1e-3, dtype=torch.float64)

    def recorded(x):
        return _zca_recorded(x @ x.transpose(1, 2) / 7 + 1e-3 * torch.eye(3, dtype=x.dtype), floor)

    assert torch.autograd.gradcheck(recorded, (data,))
    assert not torch.autograd.gradgradcheck(recorded, (data,), raise_exception=False)
