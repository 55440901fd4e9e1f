"""Inference example weighing applied to trained batch norms (four_things_batchnorm_summers2020, Eq. 3)."""
import copy

import pytest
import torch
from detectron2.layers import FrozenBatchNorm2d
from detectron2.modeling import build_model
from torch import nn

from gwdet.model_zoo import build_config
from gwdet.layers import BatchGroupNorm
from gwdet.modeling.example_weighing import apply_example_weighing, example_weighted_norm

from conftest import REPO


def trained_bn(channels: int = 6) -> nn.BatchNorm2d:
    """A batch norm with non-trivial affine parameters and running statistics, in eval mode."""
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(channels, eps=1e-3)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
        bn.running_mean.uniform_(-1.0, 1.0)
        bn.running_var.uniform_(0.5, 2.0)
    return bn.eval()


def small_model() -> nn.Sequential:
    torch.manual_seed(1)
    model = nn.Sequential(nn.Conv2d(3, 6, 3), trained_bn(6), nn.ReLU(), nn.Conv2d(6, 6, 3), trained_bn(6))
    return model.eval()


def test_weight_zero_is_batch_norm_inference():
    model = small_model()
    x = torch.randn(2, 3, 9, 9)
    expected = model(x)
    weighed = copy.deepcopy(model)
    assert apply_example_weighing(weighed, 0.0) == 2
    assert all(isinstance(weighed[i], BatchGroupNorm) for i in (1, 4))
    torch.testing.assert_close(weighed(x), expected, rtol=0, atol=1e-6)


def test_weight_one_uses_each_examples_own_statistics():
    bn = trained_bn()
    x = 3.0 * torch.randn(4, 6, 5, 7) + 1.0
    expected = nn.functional.instance_norm(x, weight=bn.weight, bias=bn.bias, eps=bn.eps)
    torch.testing.assert_close(example_weighted_norm(bn, 1.0)(x), expected, rtol=1e-5, atol=1e-5)


def test_intermediate_weight_follows_eq3():
    bn = trained_bn().double()
    alpha = 0.25
    x = torch.randn(3, 6, 4, 4, dtype=torch.float64)
    own_mean = x.mean(dim=(2, 3), keepdim=True)
    own_square = (x**2).mean(dim=(2, 3), keepdim=True)
    running_mean = bn.running_mean.view(1, -1, 1, 1)
    running_square = bn.running_var.view(1, -1, 1, 1) + running_mean**2
    mu = alpha * own_mean + (1 - alpha) * running_mean
    var = alpha * own_square + (1 - alpha) * running_square - mu**2
    expected = (x - mu) / torch.sqrt(var + bn.eps) * bn.weight.view(1, -1, 1, 1) + bn.bias.view(1, -1, 1, 1)
    torch.testing.assert_close(example_weighted_norm(bn, alpha)(x), expected)


@pytest.mark.parametrize("weight", [-0.1, 1.5])
def test_weight_outside_unit_interval_raises(weight):
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        apply_example_weighing(small_model(), weight)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        apply_example_weighing(nn.Sequential(nn.ReLU()), weight)


def test_only_batch_norms_with_running_statistics_are_replaced():
    frozen = FrozenBatchNorm2d(4)
    no_running_stats = nn.BatchNorm2d(4, track_running_stats=False)
    model = nn.Sequential(nn.BatchNorm2d(4), nn.SyncBatchNorm(4), frozen, no_running_stats, nn.GroupNorm(2, 4))
    assert apply_example_weighing(model, 0.5) == 2
    kept = [FrozenBatchNorm2d, nn.BatchNorm2d, nn.GroupNorm]
    assert [type(m) for m in model] == [BatchGroupNorm, BatchGroupNorm, *kept]
    assert model[2] is frozen
    assert model[0].eval_example_weight == 0.5


def test_a_bare_batch_norm_is_refused():
    with pytest.raises(ValueError, match="example_weighted_norm"):
        apply_example_weighing(trained_bn(), 0.5)


def test_training_mode_still_normalizes_over_the_batch():
    bn = trained_bn().train()
    reference = copy.deepcopy(bn)
    norm = example_weighted_norm(bn, 0.5)
    assert norm.training
    x = torch.randn(5, 6, 4, 4)
    torch.testing.assert_close(norm(x), reference(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(norm.running_mean, reference.running_mean)
    torch.testing.assert_close(norm.running_var, reference.running_var)


def test_detectron2_bn_model_at_weight_zero_keeps_its_predictions():
    cfg = build_config(str(REPO / "configs" / "Demo" / "scratch_faster_rcnn_bn_shapes.yaml"))
    model = build_model(cfg).eval()
    batch_norms = sum(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    image = torch.rand(3, 64, 64) * 255
    with torch.no_grad():
        expected = model.backbone(model.preprocess_image([{"image": image}]).tensor)
        assert apply_example_weighing(model, 0.0) == batch_norms > 0
        features = model.backbone(model.preprocess_image([{"image": image}]).tensor)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    for name in expected:
        torch.testing.assert_close(features[name], expected[name], rtol=1e-4, atol=1e-5)


def test_a_lazy_batch_norm_not_yet_run_is_named_as_such():
    # it said "BatchGroupNorm: num_channels must be an integer >= 1, got 0"
    with pytest.raises(ValueError, match=r"LazyBatchNorm2d is a lazy module whose channels are not known yet: run the "
                                         r"model once"):
        example_weighted_norm(nn.LazyBatchNorm2d(), 0.5)
    lazy = nn.LazyBatchNorm2d()
    lazy(torch.randn(2, 4, 3, 3))
    assert example_weighted_norm(lazy, 0.5).num_channels == 4
