"""What GroupWhitening / group_whitening compute (Huang et al. 2021, Eqs. 5-10), against
independent float64 computations; what every gwdet layer does is in test_layer_contract.py.

ItN tolerance. ItN's whitened group covariance ``(1/c) X_hat X_hat^T`` has the eigenvectors of
``Sigma`` and eigenvalues ``y_T(x_i)``, ``x_i`` the eigenvalues of ``Sigma / tr(Sigma)``
(tests/spectral_whitening.py; up to the ``eps`` ridge, made negligible here). ``y_T`` rises
monotonically to 1, so the deviation from the identity is at most ``1 - y_T(x_min)``. It depends
on the group count and conditioning: with 64 groups (``x ~ 1/64``) T=5 only reaches ``y ~ 0.59``.
The exactness tests therefore use 4 groups whose covariance has eigenvalues (0.8, 0.9, 1.1, 1.2),
i.e. ``x in [0.2, 0.3]``: ``1 - y_5(0.2) = 3.3e-5``, and we assert
``|(1/c) X_hat X_hat^T - I| <= 1e-4`` (the bound plus margin), besides checking the eigenvalues
against ``y_5(x_i)`` to 1e-10.
"""
import pytest
import torch
import torch.nn.functional as F

from gwdet.layers import GroupWhitening, group_whitening
from spectral_whitening import TINY_EPS, distance_from_identity, itn_whitened_eigenvalue, row_covariance


def grouped(x: torch.Tensor, groups: int) -> torch.Tensor:
    """Eq. 8 done independently of the implementation: (N, C, H, W) -> (N, g, C/g * H * W)."""
    return x.reshape(x.shape[0], groups, -1)


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
    assert not torch.allclose(row_covariance(grouped(x, 4)), torch.eye(4, dtype=torch.float64), atol=0.05)
    rows = grouped(group_whitening(x, 4, eps=TINY_EPS, method="zca"), 4)
    assert rows.mean(-1).abs().max() < 1e-10
    assert distance_from_identity(row_covariance(rows)) < 1e-6


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
    normalised_eigenvalues = torch.linalg.eigvalsh(row_covariance(grouped(x, 4)))
    normalised_eigenvalues = normalised_eigenvalues / normalised_eigenvalues.sum(-1, keepdim=True)
    out = grouped(group_whitening(x, 4, T=5, eps=TINY_EPS, method="itn"), 4)
    assert out.mean(-1).abs().max() < 1e-10
    cov = row_covariance(out)
    expected = itn_whitened_eigenvalue(normalised_eigenvalues, 5)
    assert torch.allclose(torch.linalg.eigvalsh(cov), expected, atol=1e-10)
    assert 1.0 - itn_whitened_eigenvalue(torch.tensor(0.2, dtype=torch.float64), 5) < 1e-4
    assert distance_from_identity(cov) <= 1e-4
    # ...and T=5 is genuinely approximate here, so the tolerance is not vacuous.
    assert distance_from_identity(cov) > 1e-7


def test_itn_approaches_zca_as_T_grows():
    x = samples_with_group_covariance(WELL_CONDITIONED)
    zca = group_whitening(x, 4, method="zca")
    distances = [
        (group_whitening(x, 4, T=T, method="itn") - zca).abs().max().item() for T in range(1, 9)
    ]
    assert all(later < earlier for earlier, later in zip(distances[:5], distances[1:6], strict=True))
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


def test_fewer_channels_than_groups_uses_one_channel_per_group():
    layer = GroupWhitening(8, num_groups=64, method="zca", eps=TINY_EPS).double()
    assert layer.effective_num_groups == 8
    x = torch.randn(2, 8, 5, 5, dtype=torch.float64)
    assert distance_from_identity(row_covariance(grouped(layer(x), 8))) < 1e-6


def test_channels_not_divisible_use_largest_divisor():
    layer = GroupWhitening(24, num_groups=16, method="zca", eps=TINY_EPS).double()
    assert layer.effective_num_groups == 12
    assert "effective_num_groups=12" in repr(layer)
    x = torch.randn(2, 24, 4, 4, dtype=torch.float64)
    assert distance_from_identity(row_covariance(grouped(layer(x), 12))) < 1e-6
    # the functional form applies the same rule
    assert torch.equal(group_whitening(x, 16, method="zca", eps=TINY_EPS), layer(x))
    assert GroupWhitening(7, num_groups=4).effective_num_groups == 1


def test_the_functional_form_is_the_layer_without_affine():
    x = torch.randn(2, 32, 3, 3)
    assert torch.equal(GroupWhitening(32, num_groups=8, affine=False)(x), group_whitening(x, 8))


@pytest.mark.parametrize("method", ["itn", "zca"])
def test_constant_groups_beside_varying_ones_give_finite_output_and_gradient(method):
    # two constant groups next to two random ones: the covariance has the repeated eigenvalue eps
    layer = GroupWhitening(8, num_groups=4, method=method).double()
    mixed = torch.randn(2, 8, 3, 3, dtype=torch.float64)
    mixed[:, :4] = -1.0
    mixed.requires_grad_(True)
    out = layer(mixed)
    assert torch.allclose(out[:, :4], layer.bias[:4].view(1, 4, 1, 1).expand(2, 4, 3, 3))
    (out * torch.randn(2, 8, 3, 3, dtype=torch.float64)).sum().backward()
    assert torch.isfinite(mixed.grad).all()


def test_constant_input_with_the_papers_64_groups_in_float32_is_finite():
    # g = C = 64: Sigma = eps I, so ItN normalizes by a trace of 64 eps, in float32
    layer = GroupWhitening(64, num_groups=64)
    x = torch.full((2, 64, 4, 4), 1000.0, requires_grad=True)
    out = layer(x)
    assert torch.allclose(out, torch.zeros_like(out))
    out.sum().backward()
    assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("scale", [1.0, 1e2, 1e4])
@pytest.mark.parametrize("shape,groups", [((16, 1024), 64), ((16, 24), 8)], ids=["fc 1024 / 64", "fc 24 / 8"])
def test_zca_with_fewer_values_than_groups_keeps_float32_accuracy(shape, groups, scale):
    """Fewer values per group than groups (an fc layer's features): the rounding of the centred
    values is not multiplied by eps^{-1/2} (it was 2% of the output at values near 100 and the
    whole output near 1e4); output and input gradient in float32 match float64 to 1e-5."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=generator, dtype=torch.float64) * scale + 3 * scale
    grad = torch.randn(shape, generator=generator, dtype=torch.float64)
    results = []
    for dtype in (torch.float32, torch.float64):
        layer = GroupWhitening(shape[1], num_groups=groups, method="zca").to(dtype)
        inputs = x.to(dtype).requires_grad_(True)
        out = layer(inputs)
        out.backward(grad.to(dtype))
        results.append((out.detach().double(), inputs.grad.double()))
    (out_32, grad_32), (out_64, grad_64) = results
    assert (out_32 - out_64).abs().max() <= 1e-5 * out_64.abs().max()
    assert (grad_32 - grad_64).abs().max() <= 1e-5 * grad_64.abs().max()


def test_invalid_functional_arguments():
    with pytest.raises(ValueError, match="group_whitening: num_groups must be an integer >= 1"):
        group_whitening(torch.randn(2, 8), 0)
    with pytest.raises(ValueError, match="group_whitening: method must be one of"):
        group_whitening(torch.randn(2, 8), 2, method="svd")
    with pytest.raises(ValueError, match=r"group_whitening: expected input of shape \(N, C\)"):
        group_whitening(torch.randn(8), 2)


@pytest.mark.parametrize("method", ["itn", "zca"])
def test_second_derivatives_through_the_layer_are_refused_by_name(method):
    # the fused op's backward has no derivative of its own: a gradient penalty or double backward is
    # refused naming the layer and what has second derivatives, not with torch's "register_autograd"
    layer = GroupWhitening(8, num_groups=4, method=method).double()
    x = torch.randn(3, 8, 2, 2, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(layer(x).pow(3).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError) as refused:
        grad.square().sum().backward()
    assert str(refused.value) == (
        "GroupWhitening: second derivatives (a backward pass through gradients computed with create_graph=True) "
        "are not supported by its fused op; for them, compute GW (method 'itn') with "
        "gwdet.layers.group_whitening_reference(x, num_groups, T, eps, 'itn', weight, bias), the same function as "
        "tensor operations that autograd differentiates to any order")


def test_the_reference_named_for_second_derivatives_has_them():
    from gwdet.layers import group_whitening_reference

    x = torch.randn(2, 4, 3, dtype=torch.float64, requires_grad=True)
    weight = (torch.rand(4, dtype=torch.float64) + 0.5).requires_grad_()
    assert torch.autograd.gradgradcheck(lambda t, w: group_whitening_reference(t, 2, 5, 1e-5, "itn", w), (x, weight))
    layer = GroupWhitening(4, num_groups=2).double()
    with torch.no_grad():
        layer.weight.copy_(weight)
    (fused,) = torch.autograd.grad(layer(x).pow(3).sum(), x)
    (reference,) = torch.autograd.grad(group_whitening_reference(x, 2, weight=weight).pow(3).sum(), x)
    assert torch.allclose(fused, reference, atol=1e-10), "the same first derivative"



@pytest.mark.parametrize("T", [9, 12])
def test_itn_of_an_ill_conditioned_covariance_stays_at_rounding_level_for_many_iterations(T):
    # Eq. 17 as written (P^3 Sigma_N) multiplied rounding at every iteration: BW_ItN on the CPU and GW's
    # scripted, traced and exported formulas were off by 12 at T=9 where the whitened values are ~4
    from gwdet.layers.whitening_matrix import inverse_sqrt_itn, itn_whitening

    torch.manual_seed(0)
    basis, _ = torch.linalg.qr(torch.randn(16, 16, dtype=torch.float64))
    cov = (basis * torch.logspace(0, -6, 16, dtype=torch.float64)) @ basis.T  # condition 1e6
    exact = inverse_sqrt_itn(cov, T)
    got = inverse_sqrt_itn(cov.float(), T).double()
    assert float((got - exact).abs().max() / exact.abs().max()) < 1e-3
    assert torch.allclose(itn_whitening(cov[None], T)[0], exact, rtol=1e-9, atol=1e-9), "the plans' form, the same value"


def test_zca_with_as_many_values_per_group_as_groups_is_computed_through_the_gram_matrix():
    # m == g: the g x g covariance has rank g - 1, and ZCA's eps^-1/2 amplified rounding there (off by 0.086
    # on outputs ~4); only m < g took the m x m form, which raises that one direction
    from gwdet.layers.group_shapes import few_columns

    assert few_columns(64 * 64, 64) and few_columns(60 * 64, 64) and not few_columns(72 * 64, 64)  # m = values / g
    torch.manual_seed(0)
    x = torch.randn(2, 256, 4, 4, dtype=torch.float64) * 100 + 300  # m = 256 / 64 * 16 = 64 = g
    layer = GroupWhitening(256, 64, method="zca")
    exact = layer.double()(x)
    assert float((layer.float()(x.float()).double() - exact).abs().max()) < 5e-3


# functional group_whitening / group_whitening_reference with one value per group gave all zeros (and a zero
# input gradient) without a word, where the layer refuses the same input
@pytest.mark.parametrize("name", ["group_whitening", "group_whitening_reference"])
@pytest.mark.parametrize("shape,num_groups", [((4, 16), 16), ((4, 16, 1, 1), 64)])
def test_functional_forms_refuse_one_value_per_group_as_the_layer_does(name, shape, num_groups):
    import gwdet.layers

    function = getattr(gwdet.layers, name)
    x = torch.randn(shape)
    with pytest.raises(ValueError, match=rf"^{name}: each group of a sample holds a single value, which "
                                         rf"normalizes to 0 for any input; use fewer groups \(num_groups={num_groups} "
                                         r"gives 16 groups of 1 channel for the 16 channels here\) or a larger input"):
        function(x, num_groups)
    with pytest.raises(ValueError, match=r"^GroupWhitening: each group of a sample holds a single value"):
        GroupWhitening(16, num_groups)(x)
    assert function(x, 8).abs().max() > 0  # two values per group
    assert function(torch.randn(2, 16, 2, 1), 16).abs().max() > 0  # one channel, two positions per group


# torch.jit.script(group_whitening) failed to compile ("Unknown type constructor Mapping" in the argument checks)
def test_the_scripted_functional_forms_compute_the_eager_ones_and_check_their_arguments():
    from gwdet.layers import group_whitening_reference

    x = torch.randn(3, 12, 4, 4, dtype=torch.float64)
    weight, bias = torch.rand(12, dtype=torch.float64) + 0.5, torch.randn(12, dtype=torch.float64)
    scripted, scripted_reference = torch.jit.script(group_whitening), torch.jit.script(group_whitening_reference)
    assert torch.allclose(scripted(x, 5), group_whitening(x, 5), rtol=0, atol=1e-10)  # 5 -> the 4 groups that divide 12
    assert torch.allclose(scripted_reference(x, 4, 3, 1e-4, "zca", weight, bias),
                          group_whitening_reference(x, 4, 3, 1e-4, "zca", weight, bias), rtol=0, atol=1e-10)
    for arguments, message in [((x, 0), "num_groups must be an integer >= 1, got 0"),
                               ((x, 4, 5000), r"T must be an integer from 1 to 1000 .*, got 5000"),
                               ((x, 4, 5, -1.0), "eps must be a number from 1.1754944e-38 to 3.4e\\+38"),
                               ((x, 4, 5, 1e-5, "pca"), "method must be 'itn' or 'zca', got 'pca'"),
                               ((x.int(), 4), "expected a floating-point input")]:
        with pytest.raises(torch.jit.Error, match="group_whitening: " + message):
            scripted(*arguments)


# group_whitening(numpy_array, 4) failed with a raw "AttributeError: 'numpy.ndarray' object has no attribute
# 'is_nested'"
def test_the_functional_form_refuses_a_numpy_array_by_name():
    import re

    import numpy as np

    from gwdet.errors import GwdetTypeError

    with pytest.raises(GwdetTypeError, match=re.escape(
            "group_whitening: expected a torch.Tensor input of shape (N, C, *spatial), got a numpy.ndarray of shape "
            "[4, 16, 5, 5] (float32); convert it with torch.from_numpy(x)")):
        group_whitening(np.zeros((4, 16, 5, 5), np.float32), 4)
