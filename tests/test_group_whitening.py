"""Tests for gwdet.layers.GroupWhitening / group_whitening (Huang et al. 2021, Eqs. 5-10).

ItN tolerance. ``P_T`` is a polynomial in ``Sigma_N = Sigma / tr(Sigma)``, so the whitened group
covariance ``(1/c) X_hat X_hat^T`` has the eigenvectors of ``Sigma`` and eigenvalues ``y_T(x_i)``
where ``x_i`` are the eigenvalues of ``Sigma_N`` and ``y_0 = x``,
``y_k = y_{k-1}(3 - y_{k-1})^2 / 4`` (up to the ``eps`` ridge, made negligible here). ``y_T``
rises monotonically to 1, so the deviation from the identity is at most ``1 - y_T(x_min)``. It
depends on the group count and conditioning: with 64 groups (``x ~ 1/64``) T=5 only reaches
``y ~ 0.59``. The exactness tests therefore use 4 groups whose covariance has eigenvalues
(0.8, 0.9, 1.1, 1.2), i.e. ``x in [0.2, 0.3]``: ``1 - y_5(0.2) = 3.3e-5``, and we assert
``|(1/c) X_hat X_hat^T - I| <= 1e-4`` (the bound plus margin), besides checking the eigenvalues
against ``y_5(x_i)`` to 1e-10.
"""
import pytest
import torch
import torch.nn.functional as F

from gwdet.layers import GroupWhitening, group_whitening

TINY_EPS = 1e-12  # makes the eps ridge's effect (eps / lambda) negligible in exactness tests


def newton_schulz_eigenvalue(x: float, T: int) -> float:
    """Eigenvalue of the ItN-whitened covariance for a trace-normalised eigenvalue ``x``."""
    y = x
    for _ in range(T):
        y = y * (3.0 - y) ** 2 / 4.0
    return y


def grouped(x: torch.Tensor, groups: int) -> torch.Tensor:
    """Eq. 8 done independently of the implementation: (N, C, H, W) -> (N, g, C/g * H * W)."""
    return x.reshape(x.shape[0], groups, -1)


def group_covariance(x: torch.Tensor, groups: int) -> torch.Tensor:
    rows = grouped(x, groups)
    centred = rows - rows.mean(-1, keepdim=True)
    return centred @ centred.transpose(-1, -2) / rows.shape[-1]


def samples_with_group_covariance(eigenvalues, num_samples=2, channels=8, size=6, seed=0):
    """Float64 samples (N, C, size, size) whose g x g group covariance has ``eigenvalues``
    exactly (random eigenvectors and group means), g = len(eigenvalues)."""
    generator = torch.Generator().manual_seed(seed)
    groups = len(eigenvalues)
    values_per_group = channels // groups * size * size
    def randn(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    noise = randn(num_samples, groups, values_per_group)
    noise = noise - noise.mean(-1, keepdim=True)
    evals, evecs = torch.linalg.eigh(noise @ noise.transpose(-1, -2) / values_per_group)
    white = evecs @ torch.diag_embed(evals.rsqrt()) @ evecs.transpose(-1, -2) @ noise
    rotation, _ = torch.linalg.qr(randn(num_samples, groups, groups))
    spectrum = torch.tensor(eigenvalues, dtype=torch.float64).sqrt()
    mixing = rotation @ torch.diag_embed(spectrum.expand(num_samples, groups))
    mixing = mixing @ rotation.transpose(-1, -2)
    means = randn(num_samples, groups, 1)
    return (mixing @ white + 3.0 * means).reshape(num_samples, channels, size, size)


WELL_CONDITIONED = (0.8, 0.9, 1.1, 1.2)


def test_zca_output_has_zero_group_means_and_identity_covariance():
    x = samples_with_group_covariance(WELL_CONDITIONED)
    assert not torch.allclose(group_covariance(x, 4), torch.eye(4, dtype=torch.float64), atol=0.05)
    out = group_whitening(x, 4, eps=TINY_EPS, method="zca")
    rows = grouped(out, 4)
    assert rows.mean(-1).abs().max() < 1e-10
    cov = rows @ rows.transpose(-1, -2) / rows.shape[-1]
    assert (cov - torch.eye(4, dtype=torch.float64)).abs().max() < 1e-6


def test_zca_is_the_symmetric_whitening():
    # ZCA whitens with the symmetric Sigma^{-1/2}, so (1/c) X_hat X_C^T = Sigma^{1/2} is symmetric
    # positive definite; a PCA or other rotated whitening would not be.
    x = samples_with_group_covariance(WELL_CONDITIONED)
    out = grouped(group_whitening(x, 4, eps=TINY_EPS, method="zca"), 4)
    centred = grouped(x, 4) - grouped(x, 4).mean(-1, keepdim=True)
    cross = out @ centred.transpose(-1, -2) / out.shape[-1]
    assert torch.allclose(cross, cross.transpose(-1, -2), atol=1e-10)
    assert torch.linalg.eigvalsh(cross).min() > 0


def test_itn_T5_whitens_within_newton_bound():
    x = samples_with_group_covariance(WELL_CONDITIONED)
    normalised_eigenvalues = torch.linalg.eigvalsh(group_covariance(x, 4))
    normalised_eigenvalues = normalised_eigenvalues / normalised_eigenvalues.sum(-1, keepdim=True)
    out = grouped(group_whitening(x, 4, T=5, eps=TINY_EPS, method="itn"), 4)
    assert out.mean(-1).abs().max() < 1e-10
    cov = out @ out.transpose(-1, -2) / out.shape[-1]
    expected = torch.tensor(
        [[newton_schulz_eigenvalue(v, 5) for v in row] for row in normalised_eigenvalues.tolist()],
        dtype=torch.float64,
    )
    assert torch.allclose(torch.linalg.eigvalsh(cov), expected, atol=1e-10)
    assert 1.0 - newton_schulz_eigenvalue(0.2, 5) < 1e-4
    assert (cov - torch.eye(4, dtype=torch.float64)).abs().max() <= 1e-4
    # ...and T=5 is genuinely approximate here, so the tolerance is not vacuous.
    assert (cov - torch.eye(4, dtype=torch.float64)).abs().max() > 1e-7


def test_itn_approaches_zca_as_T_grows():
    x = samples_with_group_covariance(WELL_CONDITIONED)
    zca = group_whitening(x, 4, method="zca")
    distances = [
        (group_whitening(x, 4, T=T, method="itn") - zca).abs().max().item() for T in range(1, 9)
    ]
    assert all(later < earlier for earlier, later in zip(distances[:5], distances[1:6]))
    assert distances[0] > 0.1
    assert distances[-1] < 1e-10


@pytest.mark.parametrize("method", ["itn", "zca"])
def test_single_group_is_layer_norm(method):
    x = torch.randn(3, 6, 4, 5, dtype=torch.float64) * 2.0 + 1.0
    layer = GroupWhitening(6, num_groups=1, method=method).double()
    with torch.no_grad():
        layer.weight.uniform_(0.5, 1.5)
        layer.bias.uniform_(-1.0, 1.0)
    expected = F.layer_norm(x, x.shape[1:], eps=layer.eps)
    expected = expected * layer.weight.view(1, 6, 1, 1) + layer.bias.view(1, 6, 1, 1)
    assert torch.allclose(layer(x), expected, atol=1e-10)


def test_samples_are_whitened_independently_and_train_equals_eval():
    x = torch.randn(4, 8, 3, 3, dtype=torch.float64)
    layer = GroupWhitening(8, num_groups=4).double()
    batched = layer(x)
    one_by_one = torch.cat([layer(x[i : i + 1]) for i in range(4)])
    assert torch.allclose(batched, one_by_one, atol=1e-12)
    layer.eval()
    assert torch.allclose(layer(x), batched, atol=0)
    assert list(dict(layer.named_buffers())) == []


def test_vector_input_is_treated_as_one_by_one_map():
    x = torch.randn(5, 16, dtype=torch.float64)
    out = group_whitening(x, 4)
    assert out.shape == x.shape
    assert torch.equal(out, group_whitening(x.view(5, 16, 1, 1), 4).view(5, 16))


def test_fewer_channels_than_groups_uses_one_channel_per_group():
    layer = GroupWhitening(8, num_groups=64, method="zca", eps=TINY_EPS).double()
    assert layer.effective_num_groups == 8
    x = torch.randn(2, 8, 5, 5, dtype=torch.float64)
    rows = grouped(layer(x), 8)
    cov = rows @ rows.transpose(-1, -2) / rows.shape[-1]
    assert (cov - torch.eye(8, dtype=torch.float64)).abs().max() < 1e-6


def test_channels_not_divisible_use_largest_divisor():
    layer = GroupWhitening(24, num_groups=16, method="zca", eps=TINY_EPS).double()
    assert layer.effective_num_groups == 12
    assert "effective_num_groups=12" in repr(layer)
    x = torch.randn(2, 24, 4, 4, dtype=torch.float64)
    rows = grouped(layer(x), 12)
    cov = rows @ rows.transpose(-1, -2) / rows.shape[-1]
    assert (cov - torch.eye(12, dtype=torch.float64)).abs().max() < 1e-6
    # the functional form applies the same rule
    assert torch.equal(group_whitening(x, 16, method="zca", eps=TINY_EPS), layer(x))
    assert GroupWhitening(7, num_groups=4).effective_num_groups == 1


@pytest.mark.parametrize("method", ["itn", "zca"])
def test_constant_groups_give_finite_output_and_gradient(method):
    layer = GroupWhitening(8, num_groups=4, method=method).double()
    with torch.no_grad():
        layer.bias.fill_(0.25)
    constant = torch.full((2, 8, 3, 3), 3.0, dtype=torch.float64, requires_grad=True)
    out = layer(constant)
    assert torch.allclose(out, torch.full_like(out, 0.25))
    # two constant groups next to two random ones: repeated covariance eigenvalue eps
    mixed = torch.randn(2, 8, 3, 3, dtype=torch.float64)
    mixed[:, :4] = -1.0
    mixed.requires_grad_(True)
    for x in (constant, mixed):
        (layer(x) * torch.randn(2, 8, 3, 3, dtype=torch.float64)).sum().backward()
        assert torch.isfinite(x.grad).all()


def test_empty_batch():
    layer = GroupWhitening(8, num_groups=4)
    for shape in [(0, 8, 5, 5), (0, 8)]:
        x = torch.randn(shape, requires_grad=True)
        out = layer(x)
        assert out.shape == x.shape
        out.sum().backward()
        assert x.grad.shape == x.shape


@pytest.mark.parametrize("method", ["itn", "zca"])
def test_gradcheck(method):
    layer = GroupWhitening(8, num_groups=4, method=method).double()
    with torch.no_grad():
        layer.weight.uniform_(0.5, 1.5)
        layer.bias.uniform_(-1.0, 1.0)
    x = torch.randn(2, 8, 3, 3, dtype=torch.float64, requires_grad=True)

    def layer_output(x, weight, bias):
        return torch.func.functional_call(layer, {"weight": weight, "bias": bias}, (x,))

    assert torch.autograd.gradcheck(layer_output, (x, layer.weight, layer.bias))


@pytest.mark.parametrize("method", ["itn", "zca"])
@pytest.mark.parametrize("dtype,tolerance", [(torch.bfloat16, 0.05), (torch.float16, 0.005)])
def test_low_precision_under_autocast(method, dtype, tolerance):
    torch.manual_seed(0)
    layer = GroupWhitening(16, num_groups=4, method=method)
    x = torch.randn(2, 16, 6, 6)
    reference = layer(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        # float32 input: statistics must stay float32, so the result matches closely
        autocast_fp32 = layer(x)
        low = layer(x.to(dtype))
    assert autocast_fp32.dtype == torch.float32
    assert torch.allclose(autocast_fp32, reference, atol=1e-5)
    assert low.dtype == dtype
    assert torch.isfinite(low).all()
    # Computed in float32, the only error left on the rounded input is the final rounding
    # to ``dtype``: at most half a unit in the last place, finfo(dtype).eps / 2 relative.
    on_rounded_input = layer(x.to(dtype).float())
    rounding = torch.finfo(dtype).eps / 2 * on_rounded_input.abs() + 1e-6
    assert ((low.float() - on_rounded_input).abs() <= rounding).all()
    # Against the float32 result on the unrounded input, input rounding adds about as much.
    assert (low.float() - reference).abs().max() < tolerance
    assert layer(x.to(dtype)).dtype == dtype


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
@pytest.mark.parametrize("method", ["itn", "zca"])
def test_torchscript(method):
    layer = GroupWhitening(16, num_groups=6, method=method)
    scripted = torch.jit.script(layer)
    x = torch.randn(2, 16, 4, 4)
    assert torch.allclose(scripted(x), layer(x), atol=1e-6)


def test_parameters_are_named_for_detectron2_checkpoints():
    layer = GroupWhitening(32, num_groups=8)
    state = layer.state_dict()
    assert set(state) == {"weight", "bias"}
    assert state["weight"].shape == (32,) and state["bias"].shape == (32,)
    assert set(GroupWhitening(32, affine=False).state_dict()) == set()
    x = torch.randn(2, 32, 3, 3)
    assert torch.equal(GroupWhitening(32, num_groups=8, affine=False)(x), group_whitening(x, 8))


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"num_groups": 0}, "num_groups must be an integer >= 1, got 0"),
        ({"num_groups": 2.5}, "num_groups must be an integer >= 1"),
        ({"T": 0}, "T must be an integer >= 1, got 0"),
        ({"eps": 0.0}, "eps must be a finite number > 0, got 0.0"),
        ({"eps": -1e-5}, "eps must be a finite number > 0"),
        ({"method": "pca"}, "method must be one of 'itn', 'zca', got pca"),
    ],
)
def test_invalid_arguments(kwargs, message):
    with pytest.raises(ValueError, match="GroupWhitening: " + message):
        GroupWhitening(16, **kwargs)


def test_invalid_functional_arguments_and_input():
    with pytest.raises(ValueError, match="group_whitening: num_groups must be an integer >= 1"):
        group_whitening(torch.randn(2, 8), 0)
    with pytest.raises(ValueError, match="group_whitening: method must be one of"):
        group_whitening(torch.randn(2, 8), 2, method="svd")
    with pytest.raises(ValueError, match=r"expected input of shape \(N, 8\)"):
        GroupWhitening(8)(torch.randn(2, 6, 3, 3))
