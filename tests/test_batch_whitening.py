"""What BatchWhitening computes (decorrelated batch norm, Huang et al. 2018), against independent
float64 computations and torch's BatchNorm; what every gwdet layer does is in
test_layer_contract.py.

ItN accuracy is checked exactly rather than with a loose tolerance: the ItN-whitened covariance
has eigenvalues ``y_T(x_i)`` (``x_i``: eigenvalues of ``Sigma / tr(Sigma)``), see
tests/spectral_whitening.py.
"""
import re
import warnings

import pytest
import torch

from gwdet.errors import GwdetValueError
from gwdet.layers import BatchWhitening, batch_whitening
from spectral_whitening import (
    TINY_EPS,
    distance_from_identity,
    inverse_sqrt_by_eigh,
    itn_whitened_eigenvalue,
    row_covariance,
)


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


def test_zca_training_whitens_the_batch():
    x = correlated_batch()
    assert distance_from_identity(row_covariance(channel_groups(x, 4))) > 0.1
    layer = BatchWhitening(8, group_size=4, method="zca", eps=TINY_EPS).double()
    rows = channel_groups(layer(x), 4)
    assert rows.mean(-1).abs().max() < 1e-10
    assert distance_from_identity(row_covariance(rows)) < 1e-6


def test_itn_training_whitens_to_the_newton_eigenvalues():
    x = correlated_batch()
    layer = BatchWhitening(8, group_size=4, method="itn", T=5, eps=TINY_EPS).double()
    rows = channel_groups(layer(x), 4)
    assert rows.mean(-1).abs().max() < 1e-10
    normalised = torch.linalg.eigvalsh(row_covariance(channel_groups(x, 4)))
    normalised = normalised / normalised.sum(-1, keepdim=True)
    expected = itn_whitened_eigenvalue(normalised, 5)
    assert torch.allclose(torch.linalg.eigvalsh(row_covariance(rows)), expected, atol=1e-10)
    # with more iterations ItN converges to the exact whitening
    converged = BatchWhitening(8, group_size=4, method="itn", T=12, eps=TINY_EPS).double()
    assert distance_from_identity(row_covariance(channel_groups(converged(x), 4))) < 1e-6


def test_vector_input_is_whitened_over_the_batch():
    x = correlated_batch(num_examples=64, size=1).view(64, 8)
    layer = BatchWhitening(8, group_size=8, eps=TINY_EPS).double()
    out = layer(x)
    assert out.shape == (64, 8)
    centred = out - out.mean(0)
    assert distance_from_identity(centred.T @ centred / 64) < 1e-6


@pytest.mark.parametrize("method", ["itn", "zca"])
def test_running_statistics_follow_dbn_algorithm_1(method):
    x = correlated_batch()
    layer = BatchWhitening(8, group_size=4, method=method, momentum=0.1).double()
    layer(x)
    rows = channel_groups(x, 4)
    batch_mean = rows.mean(-1).reshape(8)
    sigma = row_covariance(rows) + layer.eps * torch.eye(4, dtype=torch.float64)
    batch_whitening = inverse_sqrt_by_eigh(sigma, method, layer.T)  # DBN Algorithm 1 lines 6-9
    assert torch.allclose(layer.running_mean, 0.1 * batch_mean, atol=1e-12)
    expected = 0.9 * torch.eye(4, dtype=torch.float64) + 0.1 * batch_whitening
    assert torch.allclose(layer.running_whitening, expected, atol=1e-10)


def test_an_untrained_layer_in_evaluation_passes_its_input_through():
    # running statistics start at mean 0 and the identity whitening matrix
    layer = BatchWhitening(8, group_size=4).double().eval()
    x = correlated_batch()
    assert torch.equal(layer(x), x)


def test_eval_uses_running_statistics():
    x = correlated_batch()
    layer = BatchWhitening(8, group_size=4, momentum=1.0).double()
    train_out = layer(x)
    layer.eval()
    # momentum 1: the running statistics are this batch's, so eval reproduces training
    assert torch.allclose(layer(x), train_out, atol=1e-10)
    # eval is a fixed affine map of each example: the running whitening matrix times the centred example
    new = correlated_batch(num_examples=3, seed=1)
    by_hand = layer.running_whitening @ (channel_groups(new, 4) - layer.running_mean.view(2, 4, 1))
    by_hand = by_hand.reshape(8, 3, 4, 4).transpose(0, 1)
    assert torch.allclose(layer(new), by_hand, atol=1e-12)


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
    assert distance_from_identity(row_covariance(channel_groups(layer(x), 6))) < 1e-6
    assert BatchWhitening(7, group_size=4).effective_group_size == 1
    assert BatchWhitening(8, group_size=64).effective_group_size == 8


def test_buffers_are_the_running_mean_of_batch_norm_and_one_whitening_matrix_per_group():
    state = BatchWhitening(32, group_size=16).state_dict()
    # beside them, the settings (gwdet.layers.settings_state)
    assert set(state) - {"weight", "bias", "_extra_state"} == {"running_mean", "running_whitening"}
    assert state["running_mean"].shape == torch.nn.BatchNorm2d(32).state_dict()["running_mean"].shape
    assert state["running_whitening"].shape == (2, 16, 16)


def test_second_derivatives_through_bws_itn_op_are_refused_by_name():
    from gwdet.layers.itn_whitening_op import itn_whitening_op

    cov = (torch.eye(3, dtype=torch.float64) * 2 + 0.1).repeat(2, 1, 1).requires_grad_()
    (grad,) = torch.autograd.grad(itn_whitening_op(cov, 5).square().sum(), cov, create_graph=True)
    with pytest.raises(RuntimeError, match=r"BatchWhitening \(ItN\): second derivatives .* set GWDET_GW_PLAN=cpu"):
        grad.sum().backward()


def test_training_on_fewer_samples_than_a_groups_channels_is_warned_of():
    """m <= k: the covariance is singular and ZCA's running whitening matrix keeps eps^-1/2 along
    the missing directions, so evaluation on other inputs amplifies them (std in the hundreds)."""
    torch.manual_seed(0)
    layer = BatchWhitening(16, group_size=16).train()
    with pytest.warns(RuntimeWarning, match=r"2 samples \(N x H x W\) per group of 16 channels in training: the group "
                                            r"covariance has rank at most 1, .* Train with more than 16 samples"):
        for _ in range(50):
            layer(torch.randn(2, 16))
    assert layer.eval()(torch.randn(64, 16)).std() > 50  # what the warning is about
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        BatchWhitening(16, group_size=16).train()(torch.randn(17, 16))  # m > k: full rank, no warning
    # the functional form said nothing where the layer warns
    with pytest.warns(RuntimeWarning, match=r"^batch_whitening: 2 samples \(N x H x W\) per group of 16 channels in "
                                            r"training: the group covariance has rank at most 1"):
        batch_whitening(torch.randn(2, 16), torch.zeros(16), torch.eye(16)[None].clone(), None, None, True, 0.1, 5, 1e-5,
                        "zca")


def test_batch_whitening_computes_its_products_in_ieee_float32_whatever_the_users_setting():
    # with TF32 on (a GPU) or bf16 products (oneDNN), BW was 50-70x less accurate without a word (an H200:
    # docs/reliability.md, section GPU); here the setting each product of the forward pass runs under is read
    from torch.overrides import TorchFunctionMode

    from gwdet.layers import BatchWhitening

    backend = torch.backends.mkldnn.matmul
    seen = []

    class Products(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func in (torch.matmul, torch.bmm, torch.Tensor.matmul, torch.Tensor.__matmul__):
                seen.append(backend.fp32_precision)
            return func(*args, **(kwargs or {}))

    users = backend.fp32_precision
    backend.fp32_precision = "bf16"
    try:
        with Products():
            BatchWhitening(16, 8)(torch.randn(4, 16, 3, 3))
        assert seen and set(seen) == {"ieee"}, seen
        assert backend.fp32_precision == "bf16", "the user's setting is restored"
    finally:
        backend.fp32_precision = users


# batch_whitening(x, None, running_whitening, ...) raised a raw "AttributeError: 'NoneType' object has no
# attribute 'requires_grad'"
@pytest.mark.parametrize("training", [True, False])
def test_the_functional_form_refuses_running_mean_none_by_name(training):
    x = torch.randn(8, 4, 3, 3)
    running_whitening = torch.eye(2).repeat(2, 1, 1)
    with pytest.raises(GwdetValueError, match=re.escape(
            "batch_whitening: running_mean must be a tensor of one value per channel, shape [4] (training updates the "
            "running statistics, evaluation whitens with them), got None; pass the layer's buffers (running_mean, "
            "running_whitening of a BatchWhitening), or create running_mean as torch.zeros(4)")):
        batch_whitening(x, None, running_whitening, None, None, training, 0.1, 5, 1e-5, "zca")
    with pytest.raises(GwdetValueError, match=re.escape(
            "running_mean must be a tensor of one value per channel, shape [4], and running_whitening one k x k "
            "matrix per group of k channels, shape [4 / k, k, k] (training updates the running statistics, "
            "evaluation whitens with them), got None for both; ")):
        batch_whitening(x, None, None, None, None, training, 0.1, 5, 1e-5, "zca")
    assert batch_whitening(x, torch.zeros(4), running_whitening, None, None, training, 0.1, 5, 1e-5, "zca").shape \
        == x.shape


# running_whitening.data = torch.eye(8).repeat(2, 1, 1) on BatchWhitening(16, group_size=4) (or the same
# through torch.func.functional_call) whitened groups of 8 without a word; reset_running_stats then failed
# with torch's raw "The expanded size of the tensor (8) must match ..."
@pytest.mark.parametrize("training", [True, False])
def test_a_running_whitening_of_another_group_layout_is_refused_at_the_forward_and_the_reset(training):
    layer, x = BatchWhitening(16, group_size=4).train(training), torch.randn(4, 16, 3, 3)
    message = re.escape(
        "BatchWhitening: running_whitening must hold one 4 x 4 matrix per group of 4 channels, as the layer was built "
        "(num_channels=16, group_size=4), shape [4, 4, 4], got [2, 8, 8]; assign a tensor of that shape "
        "(torch.eye(4).repeat(4, 1, 1) is the initial one), or build a BatchWhitening with the group_size you want")
    with pytest.raises(GwdetValueError, match=message):
        torch.func.functional_call(layer, {"running_whitening": torch.eye(8).repeat(2, 1, 1)}, (x,))
    layer.running_whitening.data = torch.eye(8).repeat(2, 1, 1)
    with pytest.raises(GwdetValueError, match=message):
        layer(x)
    with pytest.raises(GwdetValueError, match=message):
        layer.reset_running_stats()
    layer.running_whitening.data = torch.eye(4).repeat(4, 1, 1)  # the layer's shape: runs, and the reset too
    assert layer(x).shape == x.shape
    layer.reset_running_stats()
    assert torch.equal(layer.running_whitening, torch.eye(4).repeat(4, 1, 1))


# a running_whitening of shape [2, 8, 8] for a [4, 4, 4] layer got torch's raw "size mismatch for running_whitening"
def test_a_state_whose_running_whitening_has_another_group_layout_is_refused_naming_it():
    state = BatchWhitening(16, group_size=4).state_dict()
    state["running_whitening"] = torch.eye(8).expand(2, 8, 8).clone()
    layer = BatchWhitening(16, group_size=4)
    before = {key: value.clone() for key, value in layer.state_dict().items()}
    with pytest.raises(RuntimeError, match=re.escape(
            "BatchWhitening: the state's running_whitening has shape [2, 8, 8] (groups x group size x group size): "
            "the running statistics of a BatchWhitening of 2 groups of 8 channels: num_channels=16, group_size=8, "
            "while this layer's has shape [4, 4, 4] (4 groups of 4 channels: num_channels=16, group_size=4). The "
            "state's own record says num_channels=16, group_size=4, as this layer has, so its running_whitening does "
            "not match its record: the file may be damaged, or the tensor taken from another layer. Build the layer "
            "with num_channels=16, group_size=8 to use these statistics, or load the state of a layer of "
            "num_channels=16, group_size=4")) as refused:
        layer.load_state_dict(state)
    assert "size mismatch" not in str(refused.value)
    assert all(torch.equal(value, before[key]) for key, value in layer.state_dict().items())
    built = BatchWhitening(16, group_size=8)  # the fix it names loads the statistics
    del state["_extra_state"]
    built.load_state_dict(state)
    assert torch.equal(built.running_whitening, state["running_whitening"])
    with pytest.raises(RuntimeError, match=r"^Error\(s\) in loading state_dict for Sequential:\n\t0: the state's "
                                           r"running_whitening has shape \[16, 16\], which is not the groups x group "
                                           r"size x group size of a BatchWhitening's whitening matrices, while this "
                                           r"layer's has shape \[4, 4, 4\].*\(the file may be damaged\)$"):
        torch.nn.Sequential(BatchWhitening(16, group_size=4)).load_state_dict(
            {f"0.{key}": (torch.eye(16) if key == "running_whitening" else value) for key, value in state.items()})


# a non-symmetric running_whitening (I + an upper triangle of ones), which neither ZCA nor ItN computes, loaded
# without a word, and the layer's evaluation output was then 5.4 away from the identity's
def test_a_state_whose_running_whitening_is_not_symmetric_is_refused():
    state = BatchWhitening(16, group_size=4).state_dict()
    state["running_whitening"] = torch.eye(4).repeat(4, 1, 1) + torch.triu(torch.ones(4, 4), 1)
    layer = BatchWhitening(16, group_size=4)
    with pytest.raises(RuntimeError, match=re.escape(
            "BatchWhitening: the state's running_whitening holds a whitening matrix that is not symmetric (entries "
            "(i, j) and (j, i) differ by up to 1 of its largest entry; training keeps the inverse square root of a "
            "covariance plus eps I, Eq. 5, which is symmetric), which no training computes: the layer's outputs "
            "would not be whitened. Load the state of a trained layer")):
        layer.load_state_dict(state)
    assert torch.equal(layer.running_whitening, torch.eye(4).repeat(4, 1, 1))
    # rounding's asymmetry loads: a symmetric matrix stored in half precision, or off by float32 rounding
    symmetric = torch.eye(4) + 0.3 * torch.ones(4, 4)
    state["running_whitening"] = (symmetric + 1e-6 * torch.triu(torch.ones(4, 4), 1)).repeat(4, 1, 1)
    layer.load_state_dict(state)
    half = BatchWhitening(16, group_size=4).half()
    half.load_state_dict({**state, "running_whitening": (symmetric / 3).half().repeat(4, 1, 1)})


# the docstring said "With k = 1 this is batch norm", while in evaluation BW differs from BN by sqrt(m / (m - 1))
@pytest.mark.parametrize("method", ["itn", "zca"])
def test_group_size_one_trains_as_batch_norm_and_evaluates_with_the_biased_variance(method):
    torch.manual_seed(0)
    x = torch.randn(2, 8, 2, 2, dtype=torch.float64) * 3
    m, eps = 2 * 2 * 2, 1e-5
    layer = BatchWhitening(8, group_size=1, eps=eps, momentum=1.0, method=method, affine=False).double()
    bn = torch.nn.BatchNorm2d(8, eps=eps, momentum=1.0, affine=False).double()
    # a batch norm of eps m / (m - 1), whose running_var + eps is m / (m - 1) times BW's biased variance + eps
    scaled_eps_bn = torch.nn.BatchNorm2d(8, eps=eps * m / (m - 1), momentum=1.0, affine=False).double()
    assert torch.allclose(layer(x), bn(x), rtol=0, atol=1e-12)  # training: batch norm
    scaled_eps_bn(x)
    layer.eval(), bn.eval(), scaled_eps_bn.eval()
    new = torch.randn(2, 8, 2, 2, dtype=torch.float64)
    factor = (m / (m - 1)) ** 0.5
    assert torch.allclose(layer(new), scaled_eps_bn(new) * factor, rtol=0, atol=1e-12)
    assert not torch.allclose(layer(new), bn(new), rtol=0.05, atol=0)  # 1.069 times BN's output, eps aside
    # with a smaller momentum the running whitening averages inverse square roots of the biased variance + eps
    half = BatchWhitening(8, group_size=1, eps=eps, momentum=0.5, method=method, affine=False).double()
    half(x)
    biased = x.transpose(0, 1).reshape(8, -1).var(dim=1, unbiased=False)
    assert torch.allclose(half.running_whitening.flatten(), 0.5 + 0.5 * (biased + eps).rsqrt(), rtol=0, atol=1e-12)


# a BatchWhitening whose running_whitening was zeroed evaluated to 0 everywhere, one with a NaN running_mean to NaN, and
# the functional form in evaluation took NaN or zero running whitening matrices, all without a word
def test_evaluation_refuses_running_statistics_no_training_computes():
    x = torch.randn(4, 16, 5, 5)
    layer = BatchWhitening(16, group_size=4).eval()
    layer.running_whitening.zero_()
    with pytest.raises(GwdetValueError, match=re.escape(
            "BatchWhitening: running_whitening holds a whitening matrix whose diagonal is not positive (in the matrix "
            "of group 0; an all-zero one maps every input to 0), which no training computes: in evaluation (eval mode) "
            "the layer's outputs would not be whitened. Load the running statistics of a trained layer")):
        layer(x)
    layer.reset_running_stats()
    layer.running_mean[5] = float("nan")
    with pytest.raises(GwdetValueError, match=r"^BatchWhitening: running_mean holds NaN values \(at channel 5\), "
                                              r"which no training computes: in evaluation \(eval mode\) the output "
                                              r"would be NaN"):
        layer(x)
    layer.reset_running_stats()
    layer.train()(x)  # trained statistics evaluate
    assert torch.isfinite(layer.eval()(x)).all()
    with pytest.raises(GwdetValueError, match=re.escape(
            "batch_whitening: running_whitening holds NaN values (in the matrix of group 0), which no training "
            "computes: in evaluation (training=False) the output would be NaN. Pass the running whitening matrices of "
            "a trained layer (e.g. its running_whitening buffer), or torch.eye(k).repeat(C // k, 1, 1) for untrained "
            "statistics")):
        batch_whitening(x, torch.zeros(16), torch.full((4, 4, 4), float("nan")), None, None, False, 0.1, 5, 1e-5, "zca")
    with pytest.raises(GwdetValueError, match=r"^batch_whitening: running_whitening holds a whitening matrix whose "
                                              r"diagonal is not positive"):
        batch_whitening(x, torch.zeros(16), torch.zeros(4, 4, 4), None, None, False, 0.1, 5, 1e-5, "zca")
    identity = torch.eye(4).repeat(4, 1, 1)
    assert torch.isfinite(batch_whitening(x, torch.zeros(16), identity, None, None, False, 0.1, 5, 1e-5, "zca")).all()
    batch_whitening(x, torch.zeros(16), torch.zeros(4, 4, 4), None, None, True, 0.1, 5, 1e-5, "zca")  # training


@pytest.mark.parametrize("method", ["zca", "itn"])
def test_a_trace_in_training_mode_warns_that_it_keeps_the_batch_statistics(method):
    # the trace kept whitening with batch statistics after .eval() and moved the running ones, without a word
    x = torch.randn(4, 16, 4, 4)
    layer = BatchWhitening(16, group_size=4, method=method)
    with pytest.warns(RuntimeWarning, match=re.escape(
            "BatchWhitening: traced in training mode, the trace whitens every batch with that batch's own statistics, "
            "whatever .eval() says later, and each run of it moves the layer's running mean and running whitening "
            "matrix. Trace in evaluation mode (model.eval()), which whitens with the running statistics.")):
        torch.jit.trace(layer, x)
    layer.eval()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        traced = torch.jit.trace(layer, x)
    assert not [w for w in caught if "traced in training mode" in str(w.message)]  # evaluation mode: no warning
    assert torch.allclose(traced(x + 3), layer(x + 3))


@pytest.mark.parametrize("training", [True, False])
def test_the_functional_form_refuses_integer_running_statistics_by_name(training):
    # training stopped in torch's NotImplementedError "lerp_kernel_scalar" not implemented for 'Long'
    x = torch.randn(4, 16, 4, 4)
    identity = torch.eye(4).repeat(4, 1, 1)
    with pytest.raises(GwdetValueError, match=re.escape(
            "batch_whitening: running_mean (torch.int64) must be floating-point: it holds a running average, which "
            "training updates in place; create it as torch.zeros(16), or convert it with .float()")):
        batch_whitening(x, torch.zeros(16, dtype=torch.long), identity, None, None, training, 0.1, 5, 1e-5, "zca")
    with pytest.raises(GwdetValueError, match=re.escape(
            "batch_whitening: running_mean (torch.int32) and running_whitening (torch.int64) must be floating-point: "
            "they hold running averages, which training updates in place; create them as torch.zeros(16) and "
            "torch.eye(4).repeat(4, 1, 1), or convert them with .float()")):
        batch_whitening(x, torch.zeros(16, dtype=torch.int32), identity.long(), None, None, training, 0.1, 5, 1e-5,
                        "zca")
    batch_whitening(x, torch.zeros(16), identity, None, None, training, 0.1, 5, 1e-5, "zca")
