"""What BatchGroupNorm computes (Summers & Dinneen 2020, Secs. 3.1, 3.2, 3.4), against torch's
GroupNorm and BatchNorm and statistics taken by hand; what every gwdet layer does is in
test_layer_contract.py."""
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


def test_channels_not_divisible_use_largest_divisor():
    layer = BatchGroupNorm(24, num_groups=16, examples_per_group=1).double()
    assert layer.effective_num_groups == 12
    assert "effective_num_groups=12" in repr(layer)
    x = batch(channels=24)
    assert torch.allclose(layer(x), F.group_norm(x, 12, eps=layer.eps), atol=1e-10)
    assert BatchGroupNorm(8, num_groups=32).effective_num_groups == 8


def test_a_block_of_a_single_value_gets_no_bessel_correction():
    # one example per group and one channel per group, (N, C) input: every block holds one value
    single = BatchGroupNorm(4, num_groups=4, examples_per_group=1)
    assert torch.isfinite(single(torch.randn(3, 4))).all()
    assert torch.isfinite(single.running_var).all()


def test_buffers_are_named_as_batch_norms():
    # a batch norm's statistics load into BGN under the same keys
    state = BatchGroupNorm(32).state_dict()
    batch_norm = torch.nn.BatchNorm2d(32).state_dict()
    assert {key: value.shape for key, value in state.items()} == {
        key: value.shape for key, value in batch_norm.items() if key != "num_batches_tracked"}
