"""Tests for gwdet.layers.BatchWhitening (decorrelated batch norm, Huang et al. 2018).

ItN accuracy is checked exactly rather than with a loose tolerance: the ItN-whitened covariance
has eigenvalues ``y_T(x_i)`` (``x_i``: eigenvalues of ``Sigma / tr(Sigma)``,
``y_k = y_{k-1}(3 - y_{k-1})^2 / 4``), see tests/test_group_whitening.py for the derivation.
"""
import pytest
import torch

from gwdet.layers import BatchWhitening

TINY_EPS = 1e-12  # makes the eps ridge's effect (eps / lambda) negligible in exactness tests


def correlated_batch(num_examples=8, channels=8, size=4, seed=0):
    """Float64 (N, C, size, size) data with correlated channels and non-zero channel means."""
    generator = torch.Generator().manual_seed(seed)
    shape = (num_examples, channels, size, size)
    noise = torch.randn(shape, generator=generator, dtype=torch.float64)
    mixing = torch.eye(channels, dtype=torch.float64) + 0.3 * torch.randn(
        channels, channels, generator=generator, dtype=torch.float64
    )
    means = torch.randn(1, channels, 1, 1, generator=generator, dtype=torch.float64)
    return torch.einsum("dc,nchw->ndhw", mixing, noise) + 2.0 * means


def channel_groups(x, group_size):
    """(N, C, *spatial) -> (C / k, k, N * spatial): every position of every example a column."""
    return x.transpose(0, 1).reshape(x.shape[1] // group_size, group_size, -1)


def covariance(rows):
    centred = rows - rows.mean(-1, keepdim=True)
    return centred @ centred.transpose(-1, -2) / rows.shape[-1]


def newton_schulz_eigenvalue(x: float, T: int) -> float:
    y = x
    for _ in range(T):
        y = y * (3.0 - y) ** 2 / 4.0
    return y


def test_zca_training_whitens_the_batch():
    x = correlated_batch()
    assert (covariance(channel_groups(x, 4)) - torch.eye(4, dtype=torch.float64)).abs().max() > 0.1
    layer = BatchWhitening(8, group_size=4, method="zca", eps=TINY_EPS).double()
    rows = channel_groups(layer(x), 4)
    assert rows.mean(-1).abs().max() < 1e-10
    assert (covariance(rows) - torch.eye(4, dtype=torch.float64)).abs().max() < 1e-6


def test_itn_training_whitens_to_the_newton_eigenvalues():
    x = correlated_batch()
    layer = BatchWhitening(8, group_size=4, method="itn", T=5, eps=TINY_EPS).double()
    rows = channel_groups(layer(x), 4)
    assert rows.mean(-1).abs().max() < 1e-10
    normalised = torch.linalg.eigvalsh(covariance(channel_groups(x, 4)))
    normalised = normalised / normalised.sum(-1, keepdim=True)
    expected = torch.tensor(
        [[newton_schulz_eigenvalue(v, 5) for v in group] for group in normalised.tolist()],
        dtype=torch.float64,
    )
    assert torch.allclose(torch.linalg.eigvalsh(covariance(rows)), expected, atol=1e-10)
    # with more iterations ItN converges to the exact whitening
    converged = BatchWhitening(8, group_size=4, method="itn", T=12, eps=TINY_EPS).double()
    cov = covariance(channel_groups(converged(x), 4))
    assert (cov - torch.eye(4, dtype=torch.float64)).abs().max() < 1e-6


def test_vector_input_is_whitened_over_the_batch():
    x = correlated_batch(num_examples=64, size=1).view(64, 8)
    layer = BatchWhitening(8, group_size=8, eps=TINY_EPS).double()
    out = layer(x)
    assert out.shape == (64, 8)
    centred = out - out.mean(0)
    assert (centred.T @ centred / 64 - torch.eye(8, dtype=torch.float64)).abs().max() < 1e-6


@pytest.mark.parametrize("method", ["itn", "zca"])
def test_running_statistics_follow_dbn_algorithm_1(method):
    x = correlated_batch()
    layer = BatchWhitening(8, group_size=4, method=method, momentum=0.1).double()
    layer(x)
    rows = channel_groups(x, 4)
    batch_mean = rows.mean(-1).reshape(8)
    sigma = covariance(rows) + layer.eps * torch.eye(4, dtype=torch.float64)
    if method == "zca":  # DBN Algorithm 1 lines 6-9
        evals, evecs = torch.linalg.eigh(sigma)
        batch_whitening = evecs @ torch.diag_embed(evals.rsqrt()) @ evecs.transpose(-1, -2)
    else:  # GW Eqs. 6-7
        trace = sigma.diagonal(dim1=-2, dim2=-1).sum(-1).view(-1, 1, 1)
        p = torch.eye(4, dtype=torch.float64).repeat(2, 1, 1)
        for _ in range(layer.T):
            p = 1.5 * p - 0.5 * torch.linalg.matrix_power(p, 3) @ (sigma / trace)
        batch_whitening = p / trace.sqrt()
    assert torch.allclose(layer.running_mean, 0.1 * batch_mean, atol=1e-12)
    expected = 0.9 * torch.eye(4, dtype=torch.float64) + 0.1 * batch_whitening
    assert torch.allclose(layer.running_whitening, expected, atol=1e-10)


def test_eval_uses_running_statistics():
    x = correlated_batch()
    layer = BatchWhitening(8, group_size=4, momentum=1.0).double()
    train_out = layer(x)
    layer.eval()
    # momentum 1: the running statistics are this batch's, so eval reproduces training
    assert torch.allclose(layer(x), train_out, atol=1e-10)
    # eval is a fixed affine map of each example, independent of the rest of the batch
    new = correlated_batch(num_examples=3, seed=1)
    by_hand = layer.running_whitening @ (channel_groups(new, 4) - layer.running_mean.view(2, 4, 1))
    by_hand = by_hand.reshape(8, 3, 4, 4).transpose(0, 1)
    buffers = [b.clone() for b in layer.buffers()]
    assert torch.allclose(layer(new), by_hand, atol=1e-12)
    assert torch.allclose(layer(new[:1]), by_hand[:1], atol=1e-12)
    assert all(torch.equal(a, b) for a, b in zip(buffers, layer.buffers()))


@pytest.mark.parametrize("method", ["itn", "zca"])
def test_group_size_one_is_batch_norm(method):
    x = correlated_batch()
    layer = BatchWhitening(8, group_size=1, method=method).double()
    bn = torch.nn.BatchNorm2d(8).double()
    with torch.no_grad():
        layer.weight.uniform_(0.5, 1.5)
        layer.bias.uniform_(-1.0, 1.0)
        bn.weight.copy_(layer.weight)
        bn.bias.copy_(layer.bias)
    assert torch.allclose(layer(x), bn(x), atol=1e-10)
    assert torch.allclose(layer.running_mean, bn.running_mean, atol=1e-12)


def test_channels_not_divisible_use_largest_divisor():
    layer = BatchWhitening(12, group_size=8, eps=TINY_EPS).double()
    assert layer.effective_group_size == 6
    assert layer.running_whitening.shape == (2, 6, 6)
    assert "effective_group_size=6" in repr(layer)
    x = correlated_batch(channels=12)
    cov = covariance(channel_groups(layer(x), 6))
    assert (cov - torch.eye(6, dtype=torch.float64)).abs().max() < 1e-6
    assert BatchWhitening(7, group_size=4).effective_group_size == 1
    assert BatchWhitening(8, group_size=64).effective_group_size == 8


def test_empty_batch_leaves_running_statistics_untouched():
    layer = BatchWhitening(8, group_size=4)
    for shape in [(0, 8, 5, 5), (0, 8)]:
        out = layer(torch.randn(shape))
        assert out.shape == shape
    assert torch.equal(layer.running_mean, torch.zeros(8))
    assert torch.equal(layer.running_whitening, torch.eye(4).repeat(2, 1, 1))
    layer.eval()
    assert layer(torch.randn(0, 8, 5, 5)).shape == (0, 8, 5, 5)


@pytest.mark.parametrize("method", ["itn", "zca"])
def test_constant_input_gives_finite_output_and_gradient(method):
    layer = BatchWhitening(8, group_size=4, method=method).double()
    with torch.no_grad():
        layer.bias.fill_(0.5)
    x = torch.full((4, 8, 3, 3), -2.0, dtype=torch.float64, requires_grad=True)
    out = layer(x)
    assert torch.allclose(out, torch.full_like(out, 0.5))
    (out * torch.randn_like(out)).sum().backward()
    assert torch.isfinite(x.grad).all()
    assert torch.isfinite(layer.running_whitening).all()


@pytest.mark.parametrize("method", ["itn", "zca"])
def test_gradcheck(method):
    layer = BatchWhitening(8, group_size=4, method=method).double()
    with torch.no_grad():
        layer.weight.uniform_(0.5, 1.5)
        layer.bias.uniform_(-1.0, 1.0)
    x = torch.randn(2, 8, 3, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(layer, (x,))
    layer.eval()
    assert torch.autograd.gradcheck(layer, (x,))


@pytest.mark.parametrize("method", ["itn", "zca"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_under_autocast(method, dtype):
    layer = BatchWhitening(16, group_size=4, method=method)
    x = correlated_batch(channels=16).float()
    reference = layer(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast_fp32 = layer(x)
        low = layer(x.to(dtype))
    assert autocast_fp32.dtype == torch.float32
    assert torch.allclose(autocast_fp32, reference, atol=1e-5)
    assert low.dtype == dtype
    assert torch.isfinite(low).all()
    # computed in float32, only the final rounding to ``dtype`` remains (half an ulp)
    on_rounded_input = layer(x.to(dtype).float())
    rounding = torch.finfo(dtype).eps / 2 * on_rounded_input.abs() + 1e-6
    assert ((low.float() - on_rounded_input).abs() <= rounding).all()
    assert layer.running_whitening.dtype == torch.float32
    layer.eval()
    eval_reference = layer(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        eval_autocast = layer(x)
    assert eval_autocast.dtype == torch.float32
    assert torch.allclose(eval_autocast, eval_reference, atol=1e-6)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
def test_torchscript():
    layer = BatchWhitening(8, group_size=4)
    scripted = torch.jit.script(BatchWhitening(8, group_size=4))
    x = torch.randn(6, 8, 3, 3)
    assert torch.allclose(scripted(x), layer(x), atol=1e-5)
    assert torch.allclose(scripted.running_whitening, layer.running_whitening, atol=1e-6)
    layer.eval()
    scripted.eval()
    assert torch.allclose(scripted(x), layer(x), atol=1e-5)


def test_state_dict_names():
    state = BatchWhitening(32, group_size=16).state_dict()
    assert set(state) == {"weight", "bias", "running_mean", "running_whitening"}
    assert state["weight"].shape == (32,) and state["running_whitening"].shape == (2, 16, 16)
    without_affine = BatchWhitening(32, affine=False).state_dict()
    assert set(without_affine) == {"running_mean", "running_whitening"}


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"group_size": 0}, "group_size must be an integer >= 1, got 0"),
        ({"T": 0}, "T must be an integer >= 1, got 0"),
        ({"eps": 0.0}, "eps must be a finite number > 0, got 0.0"),
        ({"momentum": 1.5}, r"momentum must be a number in \[0, 1\], got 1.5"),
        ({"momentum": -0.1}, r"momentum must be a number in \[0, 1\]"),
        ({"method": "cholesky"}, "method must be one of 'itn', 'zca', got cholesky"),
    ],
)
def test_invalid_arguments(kwargs, message):
    with pytest.raises(ValueError, match="BatchWhitening: " + message):
        BatchWhitening(16, **kwargs)
    with pytest.raises(ValueError, match="BatchWhitening: num_channels must be an integer >= 1"):
        BatchWhitening(0)
