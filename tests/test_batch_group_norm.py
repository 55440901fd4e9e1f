"""Tests for gwdet.layers.BatchGroupNorm (Summers & Dinneen 2020, Secs. 3.1, 3.2, 3.4)."""
import pytest
import torch
import torch.nn.functional as F

from gwdet.layers import BatchGroupNorm


def batch(num_examples=6, channels=8, size=3, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num_examples, channels, size, size, generator=generator, dtype=torch.float64)
    scale = torch.rand(1, channels, 1, 1, generator=generator, dtype=torch.float64) + 0.5
    shift = torch.randn(1, channels, 1, 1, generator=generator, dtype=torch.float64)
    return x * scale + shift


def with_random_affine(layer):
    with torch.no_grad():
        layer.weight.uniform_(0.5, 1.5)
        layer.bias.uniform_(-1.0, 1.0)
    return layer


def examples_side_by_side(x, examples):
    """(N, C, H, W) -> (N / examples, C, examples * H * W): each example group as one example,
    so that GroupNorm on it computes statistics over the group's examples and channels."""
    n, c = x.shape[:2]
    return x.reshape(n // examples, examples, c, -1).transpose(1, 2).reshape(n // examples, c, -1)


def test_one_example_per_group_is_group_norm():
    x = batch()
    layer = with_random_affine(BatchGroupNorm(8, num_groups=4, examples_per_group=1).double())
    expected = F.group_norm(x, 4, layer.weight, layer.bias, layer.eps)
    assert torch.allclose(layer(x), expected, atol=1e-10)


def test_example_groups_share_statistics_across_examples_and_channels():
    x = batch()
    layer = with_random_affine(BatchGroupNorm(8, num_groups=2, examples_per_group=3).double())
    side_by_side = F.group_norm(examples_side_by_side(x, 3), 2, eps=layer.eps)
    expected = side_by_side.reshape(2, 8, 3, 9).transpose(1, 2).reshape(x.shape)
    expected = expected * layer.weight.view(1, 8, 1, 1) + layer.bias.view(1, 8, 1, 1)
    assert torch.allclose(layer(x), expected, atol=1e-10)
    per_example = F.group_norm(x, 2, layer.weight, layer.bias, layer.eps)
    assert not torch.allclose(layer(x), per_example, atol=1e-3)


def test_one_channel_per_group_is_ghost_batch_norm():
    x = batch()
    layer = BatchGroupNorm(8, num_groups=8, examples_per_group=2).double()
    ghost = torch.cat(
        [F.batch_norm(x[i : i + 2], None, None, training=True, eps=layer.eps) for i in (0, 2, 4)]
    )
    assert torch.allclose(layer(x), ghost, atol=1e-10)


def test_one_channel_per_group_whole_batch_matches_batch_norm_in_train_and_eval():
    bn = torch.nn.BatchNorm2d(8).double()
    layer = with_random_affine(BatchGroupNorm(8, num_groups=8, examples_per_group=6).double())
    with torch.no_grad():
        bn.weight.copy_(layer.weight)
        bn.bias.copy_(layer.bias)
    for step in range(3):
        x = batch(seed=step)
        assert torch.allclose(layer(x), bn(x), atol=1e-10)
    assert torch.allclose(layer.running_mean, bn.running_mean, atol=1e-12)
    assert torch.allclose(layer.running_var, bn.running_var, atol=1e-12)
    layer.eval()
    bn.eval()
    x = batch(num_examples=2, seed=10)
    # eval_example_weight = 0: batch-norm inference with the running statistics
    assert torch.allclose(layer(x), bn(x), atol=1e-10)


def test_examples_per_group_larger_than_batch_uses_the_whole_batch():
    x = batch(num_examples=3)
    layer = BatchGroupNorm(8, num_groups=8, examples_per_group=16).double()
    expected = F.batch_norm(x, None, None, training=True, eps=layer.eps)
    assert torch.allclose(layer(x), expected, atol=1e-10)


def test_batch_not_divisible_normalizes_last_examples_as_a_smaller_group():
    x = batch(num_examples=5)
    layer = BatchGroupNorm(8, num_groups=2, examples_per_group=2).double()
    out = layer(x)
    reference = BatchGroupNorm(8, num_groups=2, examples_per_group=2).double()
    assert torch.allclose(out[:4], reference(x[:4]), atol=1e-10)
    assert torch.allclose(out[4:], F.group_norm(x[4:], 2, eps=layer.eps), atol=1e-10)
    remainder_of_two = BatchGroupNorm(8, num_groups=2, examples_per_group=3).double()(x)
    assert torch.allclose(remainder_of_two[3:], reference(x[3:]), atol=1e-10)


def test_running_statistics_average_the_statistics_used_in_training():
    x = batch(num_examples=4, size=2)
    layer = BatchGroupNorm(8, num_groups=4, examples_per_group=2, momentum=0.25).double()
    layer(x)
    # (example group, example, channel group, channel, position)
    #   -> (example group, channel group, values)
    blocks = x.reshape(2, 2, 4, 2, 4).transpose(1, 2).reshape(2, 4, 16)
    block_mean = blocks.mean(-1).mean(0).repeat_interleave(2)
    block_var = blocks.var(-1, unbiased=True).mean(0).repeat_interleave(2)
    assert torch.allclose(layer.running_mean, 0.25 * block_mean, atol=1e-12)
    assert torch.allclose(layer.running_var, 0.75 + 0.25 * block_var, atol=1e-12)


def test_eval_example_weight_one_uses_only_the_example_statistics():
    x = batch()
    layer = with_random_affine(BatchGroupNorm(8, num_groups=4, eval_example_weight=1.0).double())
    layer.eval()
    with torch.no_grad():
        layer.running_mean.uniform_(-5.0, 5.0)
        layer.running_var.uniform_(0.1, 10.0)
    expected = F.group_norm(x, 4, layer.weight, layer.bias, layer.eps)
    assert torch.allclose(layer(x), expected, atol=1e-10)


def test_eval_example_weight_blends_moments_as_in_eq_3():
    x = batch()
    alpha = 0.3
    layer = BatchGroupNorm(8, num_groups=4, eval_example_weight=alpha).double()
    with torch.no_grad():
        layer.running_mean.uniform_(-1.0, 1.0)
        layer.running_var.uniform_(0.5, 2.0)
    layer.eval()
    groups = x.reshape(6, 4, -1)
    own_first = groups.mean(-1).repeat_interleave(2, dim=1)  # E[x] per example and channel
    own_second = (groups**2).mean(-1).repeat_interleave(2, dim=1)  # E[x^2]
    running_second = layer.running_var + layer.running_mean**2  # m_{x^2}
    mu = alpha * own_first + (1 - alpha) * layer.running_mean
    sigma2 = alpha * own_second + (1 - alpha) * running_second - mu**2
    expected = (x - mu[..., None, None]) / torch.sqrt(sigma2[..., None, None] + layer.eps)
    assert torch.allclose(layer(x), expected, atol=1e-10)
    buffers = [b.clone() for b in layer.buffers()]
    layer(x)
    assert all(torch.equal(a, b) for a, b in zip(buffers, layer.buffers()))


def test_channels_not_divisible_use_largest_divisor():
    layer = BatchGroupNorm(24, num_groups=16, examples_per_group=1).double()
    assert layer.effective_num_groups == 12
    assert "effective_num_groups=12" in repr(layer)
    x = batch(channels=24)
    assert torch.allclose(layer(x), F.group_norm(x, 12, eps=layer.eps), atol=1e-10)
    assert BatchGroupNorm(8, num_groups=32).effective_num_groups == 8


def test_empty_batch_and_constant_input():
    layer = BatchGroupNorm(8, num_groups=4)
    for shape in [(0, 8, 5, 5), (0, 8)]:
        assert layer(torch.randn(shape)).shape == shape
    assert torch.equal(layer.running_mean, torch.zeros(8))
    assert torch.equal(layer.running_var, torch.ones(8))
    with torch.no_grad():
        layer.bias.fill_(0.5)
    constant = torch.full((4, 8, 3, 3), 7.0, requires_grad=True)
    out = layer(constant)
    assert torch.allclose(out, torch.full_like(out, 0.5))
    out.sum().backward()
    assert torch.isfinite(constant.grad).all()
    # a single value per block: finite output, no Bessel correction of a zero variance
    single = BatchGroupNorm(4, num_groups=4, examples_per_group=1)
    assert torch.isfinite(single(torch.randn(3, 4))).all()
    assert torch.isfinite(single.running_var).all()
    layer.eval()
    assert layer(torch.randn(0, 8, 5, 5)).shape == (0, 8, 5, 5)


@pytest.mark.parametrize("eval_example_weight", [0.0, 0.4])
def test_gradcheck(eval_example_weight):
    layer = BatchGroupNorm(
        8, num_groups=4, examples_per_group=2, eval_example_weight=eval_example_weight
    )
    layer = with_random_affine(layer.double())
    x = torch.randn(5, 8, 2, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(layer, (x,))
    layer.eval()
    assert torch.autograd.gradcheck(layer, (x,))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision(dtype):
    layer = BatchGroupNorm(16, num_groups=4)
    x = batch(channels=16).float()
    reference = layer(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = layer(x.to(dtype))
    assert low.dtype == dtype
    assert torch.isfinite(low).all()
    on_rounded_input = layer(x.to(dtype).float())
    rounding = torch.finfo(dtype).eps / 2 * on_rounded_input.abs() + 1e-6
    assert ((low.float() - on_rounded_input).abs() <= rounding).all()
    tolerance = 8 * torch.finfo(dtype).eps * reference.abs().max()
    assert (low.float() - reference).abs().max() < tolerance
    assert layer.running_mean.dtype == torch.float32


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
def test_torchscript():
    def make():
        return BatchGroupNorm(8, num_groups=4, examples_per_group=2, eval_example_weight=0.5)

    layer = make()
    scripted = torch.jit.script(make())
    x = torch.randn(5, 8, 3, 3)
    assert torch.allclose(scripted(x), layer(x), atol=1e-5)
    assert torch.allclose(scripted.running_var, layer.running_var, atol=1e-6)
    layer.eval()
    scripted.eval()
    assert torch.allclose(scripted(x), layer(x), atol=1e-5)


def test_state_dict_names():
    state = BatchGroupNorm(32).state_dict()
    assert set(state) == {"weight", "bias", "running_mean", "running_var"}
    assert all(value.shape == (32,) for value in state.values())


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"num_groups": 0}, "num_groups must be an integer >= 1, got 0"),
        ({"examples_per_group": 0}, "examples_per_group must be an integer >= 1, got 0"),
        ({"eps": -1.0}, "eps must be a finite number > 0, got -1.0"),
        ({"momentum": 2.0}, r"momentum must be a number in \[0, 1\], got 2.0"),
        ({"eval_example_weight": 1.5}, r"eval_example_weight must be a number in \[0, 1\], got 1."),
        ({"eval_example_weight": -0.1}, r"eval_example_weight must be a number in \[0, 1\]"),
    ],
)
def test_invalid_arguments(kwargs, message):
    with pytest.raises(ValueError, match="BatchGroupNorm: " + message):
        BatchGroupNorm(16, **kwargs)
