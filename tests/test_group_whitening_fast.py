"""The fused custom op gwdet::group_whitening against the reference implementation, both against
independent float64 computations.

``group_whitening_reference`` (plain tensor operations, differentiated by autograd) is what
TorchScript and ONNX graphs record; the custom op computes the same function with a closed-form
backward. The reference is checked against the whitening matrix taken from the float64
eigendecomposition of the group covariance (tests/spectral_whitening.py), its gradients against
autograd through that eigendecomposition or against finite differences; the op is then checked
against the reference in every layout it has a path for. No test here measures time.
"""
import copy
import math
import os

import pytest
import torch

import gwdet.layers.group_whitening_function as gw_function
from gwdet.layers import GroupWhitening, group_whitening, group_whitening_reference
from gwdet.layers.group_whitening_function import fused_group_whitening
from gwdet.layers.whitening_matrix import (
    itn_whitening,
    itn_whitening_vjp,
    zca_whitening,
    zca_whitening_vjp,
)
from gwdet_lab.benchmark.measure import peak_memory
from spectral_whitening import inverse_sqrt_by_eigh, row_covariance

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def whitened_by_eigh(x, weight, bias, groups, T, eps, method):
    """GW (Eqs. 8-10) plus the per-channel affine, whitening with the matrix that the spectrum of
    each sample's ridge covariance gives (ZCA exactly, or what T Newton iterations give)."""
    rows = x.reshape(x.shape[0], groups, -1)
    cov = row_covariance(rows) + eps * torch.eye(groups, dtype=x.dtype)
    centred = rows - rows.mean(-1, keepdim=True)
    out = (inverse_sqrt_by_eigh(cov, method, T) @ centred).reshape(x.shape)
    shape = [1, x.shape[1]] + [1] * (x.dim() - 2)
    if weight is not None:
        out = out * weight.reshape(shape)
    if bias is not None:
        out = out + bias.reshape(shape)
    return out


def random_inputs(shape, affine, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=generator, dtype=torch.float64) * 2.0 + 1.0).requires_grad_()
    channels = shape[1]
    weight = bias = None
    if affine:
        weight = (torch.rand(channels, generator=generator, dtype=torch.float64) + 0.5).requires_grad_()
        bias = torch.randn(channels, generator=generator, dtype=torch.float64).requires_grad_()
    grad = torch.randn(shape, generator=generator, dtype=torch.float64)
    return x, weight, bias, grad


def assert_same_values_and_gradients(out, expected, inputs, grad):
    assert out.dtype == expected.dtype and out.shape == expected.shape
    assert torch.allclose(out, expected, rtol=0, atol=1e-10)
    got_grads = torch.autograd.grad(out, inputs, grad)
    expected_grads = torch.autograd.grad(expected, inputs, grad)
    for got, want in zip(got_grads, expected_grads, strict=True):
        assert torch.allclose(got, want, rtol=0, atol=1e-9)


# (shape, groups): one channel per group (affine folded into the g x g matrices), several
# channels per group, a single group, 1 x 1 maps with m == g, and fewer columns than groups
# (m = C/g HW < g: the m x m Gram-matrix path), also with one channel per group and m = 2 (m = 1,
# a single value per group, is refused).
CASES = [
    ((3, 8, 4, 5), 8),
    ((3, 8, 4, 5), 4),
    ((2, 6, 3, 3), 1),
    ((3, 16, 1, 1), 4),
    ((5, 12), 4),
    ((4, 24), 8),
    ((2, 16, 1, 2), 16),
    ((3, 8, 1, 2), 8),
]


def values_per_group(shape, groups):
    return math.prod(shape[1:]) // groups


@pytest.mark.parametrize("method", ["itn", "zca"])
@pytest.mark.parametrize("shape,groups", CASES)
def test_reference_matches_the_eigendecomposition(shape, groups, method):
    x, weight, bias, grad = random_inputs(shape, affine=True)
    out = group_whitening_reference(x, groups, 5, 1e-3, method, weight, bias)
    expected = whitened_by_eigh(x, weight, bias, groups, 5, 1e-3, method)
    if values_per_group(shape, groups) < groups:
        # m < g: the covariance has the eigenvalue eps at least twice, where the backward of eigh
        # divides by zero gaps; test_gradcheck takes the gradients of such layouts
        assert torch.allclose(out, expected, rtol=0, atol=1e-10)
    else:
        assert_same_values_and_gradients(out, expected, (x, weight, bias), grad)


@pytest.mark.parametrize("method", ["itn", "zca"])
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("shape,groups", CASES)
@pytest.mark.parametrize("chunked", [False, True])
def test_op_matches_the_reference(shape, groups, method, affine, chunked, monkeypatch):
    if chunked:  # one sample per chunk: exercises the chunk loop and its slicing
        monkeypatch.setattr(gw_function, "FORWARD_FRACTION", 1e-9)
        monkeypatch.setattr(gw_function, "BACKWARD_FRACTION", 1e-9)
    x, weight, bias, grad = random_inputs(shape, affine)
    inputs = [t for t in (x, weight, bias) if t is not None]
    out = fused_group_whitening(x, weight, bias, groups, 5, 1e-3, method)
    expected = group_whitening_reference(x, groups, 5, 1e-3, method, weight, bias)
    assert_same_values_and_gradients(out, expected, inputs, grad)


@pytest.mark.parametrize("method", ["itn", "zca"])
def test_layer_with_non_divisible_channels_runs_the_op_on_the_divisor(method):
    layer = GroupWhitening(24, num_groups=16, method=method, eps=1e-3).double()
    x, weight, bias, grad = random_inputs((2, 24, 3, 2), affine=True)
    with torch.no_grad():
        layer.weight.copy_(weight)
        layer.bias.copy_(bias)
    out = layer(x)
    (out * grad).sum().backward()
    expected = whitened_by_eigh(x, weight, bias, 12, layer.T, layer.eps, method)
    expected_grads = torch.autograd.grad(expected, (x, weight, bias), grad)
    assert torch.allclose(out, expected, rtol=0, atol=1e-10)
    for got, want in zip((x.grad, layer.weight.grad, layer.bias.grad), expected_grads, strict=True):
        assert torch.allclose(got, want, rtol=0, atol=1e-9)
    # the functional form without affine takes the same path
    plain = group_whitening(x.detach(), 16, eps=1e-3, method=method)
    assert torch.allclose(plain, whitened_by_eigh(x.detach(), None, None, 12, 5, 1e-3, method), atol=1e-10)


def reference_function(x, weight, bias, groups, T, eps, method):
    return group_whitening_reference(x, groups, T, eps, method, weight, bias)


@pytest.mark.parametrize("implementation", [fused_group_whitening, reference_function], ids=["op", "reference"])
@pytest.mark.parametrize("method", ["itn", "zca"])
@pytest.mark.parametrize("shape,groups", [((2, 8, 3, 2), 4), ((2, 4, 3, 3), 4), ((4, 6), 3)])
def test_gradcheck(implementation, method, shape, groups):
    x, weight, bias, _ = random_inputs(shape, affine=True, seed=1)

    def fn(x, weight, bias):
        return implementation(x, weight, bias, groups, 3, 1e-2, method)

    assert torch.autograd.gradcheck(fn, (x, weight, bias))


def random_covariances(groups, seed):
    generator = torch.Generator().manual_seed(seed)
    data = torch.randn(3, groups, 20, generator=generator, dtype=torch.float64)
    cov = data @ data.transpose(-1, -2) / 20 + 1e-3 * torch.eye(groups, dtype=torch.float64)
    return cov.requires_grad_(), torch.randn(3, groups, groups, generator=generator, dtype=torch.float64)


def symmetric_part(matrix):
    """The gradient that a symmetric Sigma(X) sees."""
    return 0.5 * (matrix + matrix.transpose(-1, -2))


@pytest.mark.parametrize("T", [1, 2, 5])
def test_itn_kernels_match_the_eigendecomposition_and_its_autograd(T):
    cov, grad = random_covariances(6, seed=2)
    expected = inverse_sqrt_by_eigh(cov, "itn", T)
    (expected_grad,) = torch.autograd.grad(expected, cov, grad)
    assert torch.allclose(itn_whitening(cov.detach(), T), expected, atol=1e-12)
    value, grad_cov = itn_whitening_vjp(cov.detach(), grad, T)
    assert torch.allclose(value, expected, atol=1e-12)
    assert torch.allclose(grad_cov, symmetric_part(expected_grad), atol=1e-11)


def test_zca_kernels_match_the_eigendecomposition_and_its_autograd():
    cov, grad = random_covariances(5, seed=3)
    expected = inverse_sqrt_by_eigh(cov, "zca")
    (expected_grad,) = torch.autograd.grad(expected, cov, grad)
    assert torch.allclose(zca_whitening(cov.detach(), 1e-3), expected, atol=1e-12)
    value, grad_cov = zca_whitening_vjp(cov.detach(), grad, 1e-3)
    assert torch.allclose(value, expected, atol=1e-12)
    assert torch.allclose(grad_cov, symmetric_part(expected_grad), atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_output_is_rounded_once_after_the_affine(dtype):
    # the op applies the affine in float32 and rounds the result once to the input dtype
    torch.manual_seed(0)
    layer = GroupWhitening(16, num_groups=4)
    with torch.no_grad():
        layer.weight.uniform_(0.5, 1.5)
        layer.bias.uniform_(-1.0, 1.0)
    x = torch.randn(3, 16, 5, 5).to(dtype)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x)
    expected = layer(x.float())
    assert out.dtype == dtype
    assert ((out.float() - expected).abs() <= torch.finfo(dtype).eps / 2 * expected.abs() + 1e-6).all()


def test_training_memory_of_the_box_head_shape_stays_near_group_norm():
    # At ROI shapes (C = 256 at 7 x 7 with g = 64) the op saves the (N, g, g) covariances, a third
    # of the input. Its peak, forward + backward, holds the output, the input gradient, those
    # covariances and chunk temporaries: about 1.23x GroupNorm's, under the 1.3x target of
    # docs/benchmarks.md. Autograd materialising zero gradients for the saved covariances would
    # add another third of the input (1.39x).
    torch.manual_seed(0)
    x = torch.randn(512, 256, 7, 7, requires_grad=True)  # the benchmark's box-head shape
    grad = torch.randn_like(x)

    def training_peak(layer: torch.nn.Module) -> int:
        # the benchmark's measure: the profiler's allocation events replayed in time order
        return peak_memory(lambda: layer(x).backward(grad), torch.device("cpu"))

    gw, gn = training_peak(GroupWhitening(256, num_groups=64)), training_peak(torch.nn.GroupNorm(32, 256))
    activation = x.numel() * x.element_size()
    assert gn >= 2 * activation  # output and input gradient
    assert gw <= 1.3 * gn, (gw / activation, gn / activation)


# ---- precision policy (gwdet.layers.precision) ------------------------------------------------


class RecordProductPrecision(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the oneDNN float32 matmul precision in force at each batched product, also inside
    gwdet's custom ops (their kernels run with the mode active)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.bmm, torch.ops.aten.baddbmm):
            self.seen.add(torch.backends.mkldnn.matmul.fp32_precision)
        if func.namespace != "gwdet":
            return func(*args, **(kwargs or {}))
        with self:
            return func.redispatch(torch._C.DispatchKeySet(torch._C.DispatchKey.CPU), *args, **(kwargs or {}))


@pytest.mark.parametrize("plan", ["cpu", "accelerator"])
def test_the_ops_run_ieee_products_whatever_the_tf32_setting_and_restore_it(plan, monkeypatch):
    monkeypatch.setenv("GWDET_GW_PLAN", plan)
    torch.manual_seed(0)
    layer = GroupWhitening(16, num_groups=4)
    x, grad = torch.randn(3, 16, 5, 5), torch.randn(3, 16, 5, 5)

    def forward_backward():
        inputs = x.clone().requires_grad_()
        layer.zero_grad()
        out = layer(inputs)
        out.backward(grad)
        return [out.detach(), inputs.grad, layer.weight.grad.clone()]

    highest = forward_backward()
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")  # TF32 for CUDA and oneDNN products
    try:
        with RecordProductPrecision() as mode:
            high = forward_backward()
        assert mode.seen == {"ieee"}  # inside the ops, every product ran in IEEE float32
        assert torch.get_float32_matmul_precision() == "high"  # the user's setting is back
        assert torch.backends.mkldnn.matmul.fp32_precision == "tf32"
    finally:
        torch.set_float32_matmul_precision(previous)
    for a, b in zip(high, highest, strict=True):
        assert torch.equal(a, b)


def test_the_precision_context_restores_each_backends_setting_exactly_also_after_an_error():
    from gwdet.layers.precision import ieee_float32_products

    cuda_matmul = torch.backends.cuda.matmul
    previous = cuda_matmul.fp32_precision
    cuda_matmul.fp32_precision = "tf32"  # the newer interface: a plain restore must not mix in the legacy one
    try:
        with pytest.raises(RuntimeError, match="inside"), ieee_float32_products(torch.device("cuda")):
            assert cuda_matmul.fp32_precision == "ieee"
            raise RuntimeError("inside")
        assert cuda_matmul.fp32_precision == "tf32"
        with ieee_float32_products(torch.device("meta")):  # a device without such a setting: untouched
            assert cuda_matmul.fp32_precision == "tf32"
    finally:
        cuda_matmul.fp32_precision = previous


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning", "ignore:`torch.jit.(trace|script)` is deprecated:FutureWarning")
@pytest.mark.parametrize("recording", ["trace", "script"])
@pytest.mark.parametrize("method", ["itn", "zca"])
def test_recorded_models_keep_float32_statistics_under_bfloat16_autocast(recording, method):
    # A recorded graph cannot leave an autocast region entered by its caller: without
    # gwdet.layers.precision.float32_matmul its covariance and Newton products ran in bfloat16
    # (error 5e-3 instead of 5e-7 for ItN).
    torch.manual_seed(0)
    layer = GroupWhitening(64, num_groups=16, method=method).eval()
    x = torch.randn(4, 64, 6, 6) * 3.0 + 1.0
    expected = copy.deepcopy(layer).double()(x.double())
    recorded = torch.jit.trace(layer, (x,)) if recording == "trace" else torch.jit.script(layer)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for _ in range(2):  # the profiling executor optimizes the graph at the second call
            out = recorded(x)
    assert out.dtype == torch.float32
    assert (out.double() - expected).abs().max() <= 1e-5 * expected.abs().max()
    # with a gradient to compute the products run in float64 there, which autocast leaves alone
    inputs = x.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = recorded(inputs)
    out.square().sum().backward()
    assert (out.double() - expected).abs().max() <= 1e-5 * expected.abs().max()
    assert inputs.grad.dtype == torch.float32 and torch.isfinite(inputs.grad).all()


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
def test_the_scripted_products_shape_is_the_broadcast_one():
    # torch.broadcast_shapes is no TorchScript builtin in torch 2.11: scripting GW failed there
    from gwdet.layers.precision import _product_shape

    scripted = torch.jit.script(_product_shape)
    assert "broadcast_shapes" not in scripted.code
    for left, right in (((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((3, 4), (7, 4, 5)), ((1, 3, 4), (6, 4, 2)),
                        ((6, 1, 3, 4), (5, 4, 2)), ((2, 3, 4), (2, 4, 1))):
        a, b = torch.empty(left), torch.empty(right)
        expected = list(torch.matmul(a, b).shape)
        assert _product_shape(a, b) == expected and scripted(a, b) == expected
