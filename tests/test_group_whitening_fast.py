"""The fused custom op gwdet::group_whitening against the plain formulas, and tools/benchmark.py's quick mode.

The reference below is written out independently of gwdet: group division (Eq. 8), centring,
covariance plus ``eps I``, the paper's ItN (Eqs. 6-7, ``P_k = (3 P - P^3 Sigma_N) / 2``) or ZCA
by eigendecomposition (Eq. 5), the product, the per-channel affine; autograd differentiates it.
Everything is compared in float64. No test here measures time.
"""
import math
import os
import subprocess
import sys

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

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def reference_itn(cov, T):
    trace = cov.diagonal(dim1=-2, dim2=-1).sum(-1)[..., None, None]
    normalised = cov / trace
    p = torch.eye(cov.shape[-1], dtype=cov.dtype).expand_as(cov)
    for _ in range(T):
        p = 0.5 * (3.0 * p - p @ p @ p @ normalised)
    return p / trace.sqrt()


def reference_zca(cov):
    # differentiable eigh: fine for the well-separated random spectra used here
    eigenvalues, eigenvectors = torch.linalg.eigh(cov)
    return eigenvectors @ torch.diag_embed(eigenvalues.rsqrt()) @ eigenvectors.transpose(-1, -2)


def reference(x, weight, bias, groups, T, eps, method):
    rows = x.reshape(x.shape[0], groups, -1)
    centred = rows - rows.mean(-1, keepdim=True)
    cov = centred @ centred.transpose(-1, -2) / rows.shape[-1]
    cov = cov + eps * torch.eye(groups, dtype=x.dtype)
    whitening = reference_itn(cov, T) if method == "itn" else reference_zca(cov)
    out = (whitening @ centred).reshape(x.shape)
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


# (shape, groups): one channel per group (affine folded into the g x g matrices), several
# channels per group, a single group, 1 x 1 maps with m == g, and fewer columns than groups
# (m = C/g HW < g: the m x m Gram-matrix path), also with one channel per group and m = 1.
CASES = [
    ((3, 8, 4, 5), 8),
    ((3, 8, 4, 5), 4),
    ((2, 6, 3, 3), 1),
    ((3, 16, 1, 1), 4),
    ((5, 12), 4),
    ((4, 24), 8),
    ((2, 16, 1, 2), 16),
    ((3, 8), 8),
]


@pytest.mark.parametrize("method", ["itn", "zca"])
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("shape,groups", CASES)
@pytest.mark.parametrize("chunked", [False, True])
def test_function_matches_reference(shape, groups, method, affine, chunked, monkeypatch):
    if method == "zca" and shape[0] * groups == math.prod(shape):
        pytest.skip("m = 1 gives Sigma = eps I, whose eigh backward (the reference) is NaN")
    if chunked:  # one sample per chunk: exercises the chunk loop and its slicing
        monkeypatch.setattr(gw_function, "FORWARD_FRACTION", 1e-9)
        monkeypatch.setattr(gw_function, "BACKWARD_FRACTION", 1e-9)
    x, weight, bias, grad = random_inputs(shape, affine)
    T, eps = 5, 1e-3
    inputs = [t for t in (x, weight, bias) if t is not None]
    out = fused_group_whitening(x, weight, bias, groups, T, eps, method)
    grads = torch.autograd.grad(out, inputs, grad)
    expected = reference(x, weight, bias, groups, T, eps, method)
    expected_grads = torch.autograd.grad(expected, inputs, grad)
    assert out.dtype == torch.float64 and out.shape == x.shape
    assert torch.allclose(out, expected, rtol=0, atol=1e-10)
    for got, want in zip(grads, expected_grads):
        assert torch.allclose(got, want, rtol=0, atol=1e-9)


@pytest.mark.parametrize("method", ["itn", "zca"])
@pytest.mark.parametrize("shape,groups", CASES)
def test_public_reference_matches_the_formulas_written_out_here(shape, groups, method):
    # gwdet.layers.group_whitening_reference: what TorchScript and ONNX graphs record
    if method == "zca" and shape[0] * groups == math.prod(shape):
        pytest.skip("m = 1 gives Sigma = eps I, whose eigh backward (the reference) is NaN")
    x, weight, bias, grad = random_inputs(shape, affine=True)
    out = group_whitening_reference(x, groups, 5, 1e-3, method, weight, bias)
    expected = reference(x, weight, bias, groups, 5, 1e-3, method)
    assert out.dtype == x.dtype and torch.allclose(out, expected, rtol=0, atol=1e-10)
    got_grads = torch.autograd.grad(out, (x, weight, bias), grad)
    expected_grads = torch.autograd.grad(expected, (x, weight, bias), grad)
    for got, want in zip(got_grads, expected_grads):
        assert torch.allclose(got, want, rtol=0, atol=1e-9)


@pytest.mark.parametrize("method", ["itn", "zca"])
def test_layer_with_non_divisible_channels_matches_reference(method):
    layer = GroupWhitening(24, num_groups=16, method=method, eps=1e-3).double()
    assert layer.effective_num_groups == 12
    x, weight, bias, grad = random_inputs((2, 24, 3, 2), affine=True)
    with torch.no_grad():
        layer.weight.copy_(weight)
        layer.bias.copy_(bias)
    out = layer(x)
    (out * grad).sum().backward()
    expected = reference(x, weight, bias, 12, layer.T, layer.eps, method)
    expected_grads = torch.autograd.grad(expected, (x, weight, bias), grad)
    assert torch.allclose(out, expected, rtol=0, atol=1e-10)
    for got, want in zip((x.grad, layer.weight.grad, layer.bias.grad), expected_grads):
        assert torch.allclose(got, want, rtol=0, atol=1e-9)
    # the functional form without affine takes the same fast path
    plain = group_whitening(x.detach(), 16, eps=1e-3, method=method)
    assert torch.allclose(plain, reference(x.detach(), None, None, 12, 5, 1e-3, method), atol=1e-10)


@pytest.mark.parametrize("method", ["itn", "zca"])
@pytest.mark.parametrize("shape,groups", [((2, 8, 3, 2), 4), ((2, 4, 3, 3), 4), ((4, 6), 3)])
def test_gradcheck_function(method, shape, groups):
    x, weight, bias, _ = random_inputs(shape, affine=True, seed=1)

    def fn(x, weight, bias):
        return fused_group_whitening(x, weight, bias, groups, 3, 1e-2, method)

    assert torch.autograd.gradcheck(fn, (x, weight, bias))


@pytest.mark.parametrize("T", [1, 2, 5])
def test_itn_kernels_match_the_paper_iteration_and_its_autograd(T):
    generator = torch.Generator().manual_seed(2)
    data = torch.randn(3, 6, 20, generator=generator, dtype=torch.float64)
    cov = (data @ data.transpose(-1, -2) / 20 + 1e-3 * torch.eye(6, dtype=torch.float64)).requires_grad_()
    grad = torch.randn(3, 6, 6, generator=generator, dtype=torch.float64)
    expected = reference_itn(cov, T)
    (expected_grad,) = torch.autograd.grad(expected, cov, grad)
    assert torch.allclose(itn_whitening(cov.detach(), T), expected, atol=1e-12)
    value, grad_cov = itn_whitening_vjp(cov.detach(), grad, T)
    assert torch.allclose(value, expected, atol=1e-12)
    # gradient of the symmetric part: what a symmetric Sigma(X) sees
    assert torch.allclose(grad_cov, 0.5 * (expected_grad + expected_grad.transpose(-1, -2)), atol=1e-11)


def test_zca_kernels_match_eigh_autograd():
    generator = torch.Generator().manual_seed(3)
    data = torch.randn(3, 5, 20, generator=generator, dtype=torch.float64)
    cov = (data @ data.transpose(-1, -2) / 20 + 1e-3 * torch.eye(5, dtype=torch.float64)).requires_grad_()
    grad = torch.randn(3, 5, 5, generator=generator, dtype=torch.float64)
    expected = reference_zca(cov)
    (expected_grad,) = torch.autograd.grad(expected, cov, grad)
    assert torch.allclose(zca_whitening(cov.detach(), 1e-3), expected, atol=1e-12)
    value, grad_cov = zca_whitening_vjp(cov.detach(), grad, 1e-3)
    assert torch.allclose(value, expected, atol=1e-12)
    assert torch.allclose(grad_cov, 0.5 * (expected_grad + expected_grad.transpose(-1, -2)), atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_input_and_autocast_keep_float32_statistics(dtype):
    torch.manual_seed(0)
    layer = GroupWhitening(16, num_groups=4)
    with torch.no_grad():
        layer.weight.uniform_(0.5, 1.5)
        layer.bias.uniform_(-1.0, 1.0)
    x = torch.randn(3, 16, 5, 5).to(dtype).requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x)
    assert out.dtype == dtype
    expected = layer(x.detach().float())
    # computed in float32, rounded once: within half a unit in the last place
    assert ((out.float() - expected).abs() <= torch.finfo(dtype).eps / 2 * expected.abs() + 1e-6).all()
    out.float().square().sum().backward()
    assert x.grad.dtype == dtype and torch.isfinite(x.grad).all()
    assert layer.weight.grad.dtype == torch.float32 and torch.isfinite(layer.weight.grad).all()


def test_constant_input_in_float32_is_finite():
    layer = GroupWhitening(64, num_groups=64)
    x = torch.full((2, 64, 4, 4), 1000.0, requires_grad=True)
    out = layer(x)
    assert torch.allclose(out, torch.zeros_like(out))
    out.sum().backward()
    assert torch.isfinite(x.grad).all()


def test_benchmark_quick_mode_writes_markdown(tmp_path):
    out = tmp_path / "bench.md"
    result = subprocess.run(
        [sys.executable, os.path.join(REPO, "tools", "benchmark.py"), "--layers", "--quick", "--threads", "1", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    text = out.read_text()
    assert "| shape |" in text
    assert "GW (itn)" in text and "conv 3x3" in text
    assert "peak memory" in text
    assert "[1/" in result.stderr  # progress lines


def test_output_can_be_modified_in_place():
    # detectron2's blocks do F.relu_(norm(conv(x))): the output must not be a view
    layer = GroupWhitening(8, num_groups=4).double()
    x, _, _, grad = random_inputs((2, 8, 3, 3), affine=False)
    out = torch.nn.functional.relu_(layer(x))
    (out * grad).sum().backward()
    expected = torch.relu(reference(x, layer.weight, layer.bias, 4, 5, layer.eps, "itn"))
    (expected_grad,) = torch.autograd.grad(expected, x, grad)
    assert torch.allclose(out, expected, atol=1e-10)
    assert torch.allclose(x.grad, expected_grad, atol=1e-9)


def test_traced_layer_records_the_reference_formulas(tmp_path):
    # torch.jit.trace records plain ATen ops (no Python op), so the trace saves and reloads
    torch.manual_seed(0)
    layer = GroupWhitening(16, num_groups=4)
    traced = torch.jit.trace(layer, (torch.randn(2, 16, 3, 3),))
    kinds = {node.kind() for node in traced.graph.nodes()}
    assert not any(kind.startswith(("prim::PythonOp", "gwdet::")) for kind in kinds), kinds
    torch.jit.save(traced, str(tmp_path / "gw.pt"))
    loaded = torch.jit.load(str(tmp_path / "gw.pt"))
    other = torch.randn(3, 16, 4, 2)  # another batch size and spatial size
    assert torch.allclose(loaded(other), layer(other), rtol=0, atol=1e-5)


@pytest.mark.parametrize("flag", ["--norms", "--model-names"])
def test_benchmark_refuses_names_it_would_not_time(flag):
    result = subprocess.run([sys.executable, os.path.join(REPO, "tools", "benchmark.py"), flag, "FOO"],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and f"{flag}: unknown FOO; choose from" in result.stderr
