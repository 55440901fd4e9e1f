"""Inference example weighing applied to trained batch norms (four_things_batchnorm_summers2020, Eq. 3)."""
import copy
import logging
import warnings

import pytest
import torch
from detectron2.layers import FrozenBatchNorm2d
from detectron2.modeling import build_model
from torch import nn

from gwdet.model_zoo import build_config
from gwdet.layers import BatchGroupNorm
from gwdet.errors import GwdetRuntimeWarning, GwdetTypeError, GwdetValueError
from gwdet.modeling.example_weighing import apply_example_weighing, example_weighted_norm, weighable_norms

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


# BatchNorm1d/3d of a model's own head were left as they were (0 replaced, no word), though example_weighted_norm
# takes them
def test_batch_norms_of_other_input_dimensions_are_replaced_and_compute_the_same_at_weight_zero():
    for bn, shape in ((nn.BatchNorm1d(4), (6, 4)), (nn.BatchNorm1d(4), (6, 4, 5)), (nn.BatchNorm3d(4), (6, 4, 2, 3, 3))):
        model = nn.Sequential(bn)
        model.train()(torch.randn(shape) * 3 + 1)  # running statistics away from their start
        x = torch.randn(shape)
        expected = model.eval()(x)
        assert apply_example_weighing(model, 0.0) == 1 and isinstance(model[0], BatchGroupNorm)
        torch.testing.assert_close(model.eval()(x), expected, rtol=1e-5, atol=1e-5)


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


# before: momentum=None (the cumulative average) became momentum 0.1 without a word, and the docstrings said the
# replacement "trains as bn does"
def test_a_cumulative_average_batch_norm_is_named_in_one_warning(caplog):
    model = nn.Sequential(*[nn.BatchNorm2d(4, momentum=None) for _ in range(5)], nn.BatchNorm2d(4))
    with caplog.at_level(logging.WARNING, logger="gwdet.modeling.example_weighing"):
        assert apply_example_weighing(model, 0.0) == 6
    assert [record.getMessage() for record in caplog.records] == [
        "apply_example_weighing: 5 batch norms (0, 1, 2, ... (2 more)) have momentum=None (running statistics kept "
        "as the cumulative average of every batch); their example-weighted replacements (BatchGroupNorm) continue "
        "their running statistics as a moving average with momentum 0.1, not the cumulative average, if the model "
        "trains further (num_batches_tracked is not kept). Inference is not affected. To train further with the "
        "cumulative average, train the model before applying example weighing; to keep another rate, set "
        "layer.momentum on the replacements."]
    assert [layer.momentum for layer in model] == [0.1] * 6
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gwdet.modeling.example_weighing"):
        example_weighted_norm(nn.BatchNorm2d(4, momentum=None), 0.5)
    (record,) = caplog.records
    assert record.getMessage().startswith(
        "example_weighted_norm: the BatchNorm2d has momentum=None (running statistics kept as the cumulative average "
        "of every batch); its example-weighted replacement (BatchGroupNorm) continues its running statistics as a "
        "moving average with momentum 0.1, not the cumulative average, if the model trains further")


# before: no warning for any layer (kept so for layers with a momentum and layers weighed by an earlier call)
def test_batch_norms_with_a_momentum_give_no_warning(caplog):
    model = nn.Sequential(nn.BatchNorm2d(4), nn.BatchNorm2d(4, momentum=0.3), nn.BatchNorm2d(4, momentum=None))
    with caplog.at_level(logging.WARNING, logger="gwdet.modeling.example_weighing"):
        apply_example_weighing(model, 0.5)
    assert [record.getMessage()[:70] for record in caplog.records] == [
        "apply_example_weighing: the batch norm 2 has momentum=None (running st"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gwdet.modeling.example_weighing"):
        apply_example_weighing(model, 0.2)
        example_weighted_norm(nn.BatchNorm2d(4, momentum=0.3), 0.5)
    assert caplog.records == []
    assert [layer.momentum for layer in model] == [0.1, 0.3, 0.1]


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


# Before: a BatchNorm2d(bias=False) raised a raw TypeError from copy_(None).
def test_batch_norm_without_bias_gives_a_fixed_zero_bias():
    bn = nn.BatchNorm2d(6, bias=False)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.running_mean.uniform_(-1.0, 1.0)
        bn.running_var.uniform_(0.5, 2.0)
    bn.eval()
    x = torch.randn(2, 6, 5, 5)
    norm = example_weighted_norm(bn, 0.0)
    assert not norm.bias.requires_grad and not norm.bias.any()
    torch.testing.assert_close(norm(x), bn(x), rtol=0, atol=1e-6)


# Before: the raw TypeError came after the first BN was replaced, leaving the model half converted.
def test_a_refused_layer_leaves_the_model_as_it_was():
    model = small_model()
    model[4] = nn.modules.batchnorm.BatchNorm2d(6, track_running_stats=True)
    model[4].running_mean = None  # keeps no statistics, while its class says it tracks them
    with pytest.raises(GwdetValueError, match="keeps no running statistics"):
        apply_example_weighing(model, 0.3)
    assert [type(module).__name__ for module in model] == ["Conv2d", "BatchNorm2d", "ReLU", "Conv2d", "BatchNorm2d"]


# Before: a model whose second BN had bias=False was left half converted after a raw TypeError.
def test_model_with_a_bias_free_batch_norm_is_converted():
    model = small_model()
    model[4] = nn.BatchNorm2d(6, bias=False).eval()
    x = torch.randn(2, 3, 9, 9)
    expected = model(x)
    assert apply_example_weighing(model, 0.0) == 2
    torch.testing.assert_close(model(x), expected, rtol=0, atol=1e-6)


# Before: the BN's forward hook was dropped with the BN, without a word.
def test_forward_hooks_move_to_the_replacement():
    model = small_model()
    calls = []
    handle = model[1].register_forward_hook(lambda module, args, output: calls.append(type(module).__name__))
    apply_example_weighing(model, 0.3)
    model(torch.randn(1, 3, 9, 9))
    assert calls == ["BatchGroupNorm"]
    handle.remove()
    model(torch.randn(1, 3, 9, 9))
    assert calls == ["BatchGroupNorm"]


# Before: state-dict hooks were dropped with the BN, without a word.
def test_state_dict_hooks_are_refused():
    model = small_model()
    model[4].register_state_dict_pre_hook(lambda module, prefix, keep_vars: None)
    with pytest.raises(GwdetValueError, match=r"^the batch norm\(s\) 4 \(_state_dict_pre_hooks\) carry state-dict hooks.*as it was"):
        apply_example_weighing(model, 0.3)
    assert isinstance(model[1], nn.BatchNorm2d)
    # a pruned batch norm: replaced, its pruning hook moved, and the first forward failed without weight_mask
    from torch.nn.utils import prune
    pruned = small_model()
    prune.l1_unstructured(pruned[1], "weight", 0.5)
    with pytest.raises(GwdetValueError, match=r"^the batch norm\(s\) 1 \(a pruning of torch.nn.utils.prune: "):
        apply_example_weighing(pruned, 0.3)
    assert isinstance(pruned[1], nn.BatchNorm2d)


# Before: raw AttributeError 'GroupNorm' object has no attribute 'running_mean' / 'str' object ...
@pytest.mark.parametrize("bn", [nn.GroupNorm(2, 8), "bn"])
def test_example_weighted_norm_refuses_what_is_not_a_batch_norm(bn):
    with pytest.raises(GwdetTypeError, match="bn must be a torch batch norm .* got (GroupNorm|str)"):
        example_weighted_norm(bn, 0.3)


# Before: raw AttributeError: 'str' object has no attribute 'named_modules'.
def test_model_that_is_not_a_module_is_refused():
    with pytest.raises(GwdetTypeError, match="apply_example_weighing: model must be a torch.nn.Module, got str 'model'"):
        apply_example_weighing("model", 0.3)
    with pytest.raises(GwdetTypeError, match="weighable_norms: model must be a torch.nn.Module, got str"):
        weighable_norms("model")


# Before: a scripted model came back unchanged and 0 was returned, without a word.
def test_scripted_model_is_refused():
    scripted = torch.jit.script(small_model())
    with pytest.raises(GwdetTypeError, match="the model .Sequential. is scripted or traced .*eager model first"):
        apply_example_weighing(scripted, 0.3)


# Before: one batch norm object at two places was replaced at one of them only, without a word.
@pytest.mark.parametrize("shape", ["attributes", "sequential", "module_list"])
def test_a_batch_norm_object_at_two_places_is_refused_and_the_model_left_as_it_was(shape):
    bn = trained_bn(6)
    if shape == "attributes":
        model = nn.Module()
        model.a = bn
        model.b = bn
        places = "a, b"
    elif shape == "sequential":
        model = nn.Sequential(nn.Conv2d(6, 6, 1), bn, nn.Conv2d(6, 6, 1), bn)
        places = "1, 3"
    else:
        model = nn.ModuleList([bn, bn])
        places = "0, 1"
    with pytest.raises(GwdetValueError, match=rf"^One batch norm layer object \(BatchNorm2d\) sits at 2 places, "
                                              rf"{places}: .*Give each place its own layer .*The model is as it was\.$"):
        apply_example_weighing(model, 0.5)
    assert [module for module in model.modules() if isinstance(module, BatchGroupNorm)] == []
    assert all(module is bn for module in model.modules() if isinstance(module, nn.BatchNorm2d))


def test_a_block_reused_whole_is_weighed_with_its_batch_norm():
    block = nn.Sequential(nn.Conv2d(3, 6, 1), trained_bn(6))
    model = nn.Sequential(block, block)
    assert apply_example_weighing(model, 0.5) == 1
    assert isinstance(model[0][1], BatchGroupNorm) and model[1][1] is model[0][1]


# Before: the second call returned 0 without a word and the layers kept the first weight (0.3).
def test_a_second_call_sets_its_weight_on_the_layers_already_weighed():
    model = small_model()
    x = torch.randn(2, 3, 9, 9)
    fresh = copy.deepcopy(model)
    assert apply_example_weighing(fresh, 0.5) == 2
    assert apply_example_weighing(model, 0.3) == 2
    assert apply_example_weighing(model, 0.5) == 2
    assert [m.eval_example_weight for m in model.modules() if isinstance(m, BatchGroupNorm)] == [0.5, 0.5]
    torch.testing.assert_close(model(x), fresh(x))


# before: torch's bare 'Unexpected key(s) in state_dict: "1.num_batches_tracked"', naming no fix
def test_a_state_saved_before_weighing_is_named_as_such_when_loaded_after():
    model = small_model()
    state = copy.deepcopy(model.state_dict())
    apply_example_weighing(model, 0.5)
    with pytest.warns(GwdetRuntimeWarning) as caught, pytest.raises(
            RuntimeError, match=r'Unexpected key\(s\) in state_dict: "1.num_batches_tracked", "4.num_batches_tracked"'):
        model.load_state_dict(state)
    assert [str(warning.message) for warning in caught] == [
        "1 (BatchGroupNorm): the state's '1.num_batches_tracked' is of the torch batch norm that example weighing "
        "(apply_example_weighing or example_weighted_norm) replaced with this example-weighted BatchGroupNorm, which "
        "keeps no num_batches_tracked: the state was saved before example weighing, and torch names that key "
        "unexpected (an error with strict=True; torch's unexpected keys name every such key). Load the weights into "
        "the model first, then apply example weighing (model.load_state_dict(state), then "
        "apply_example_weighing(model, weight)), or delete the num_batches_tracked keys from the state dict; with "
        "strict=False the rest (running statistics and affine) loads as it is."]
    with pytest.warns(GwdetRuntimeWarning, match="saved before example weighing"):
        result = model.load_state_dict(state, strict=False)
    assert result.unexpected_keys == ["1.num_batches_tracked", "4.num_batches_tracked"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.load_state_dict({key: value for key, value in state.items() if not key.endswith("num_batches_tracked")})
        model.load_state_dict(model.state_dict())
    with warnings.catch_warnings():  # a BatchGroupNorm of the user's own is not named as example weighing's
        warnings.simplefilter("error")
        grouped = nn.Sequential(nn.Conv2d(3, 6, 3), BatchGroupNorm(6, num_groups=6, examples_per_group=8))
        with pytest.raises(RuntimeError, match=r'Unexpected key\(s\) in state_dict: "1.num_batches_tracked"'):
            grouped.load_state_dict({key: value for key, value in state.items() if key.startswith(("0.", "1."))})


# Before: 0 returned without a word (FrozenBatchNorm2d, BN without running statistics, no batch norm at all).
@pytest.mark.parametrize("norm, message", [
    (FrozenBatchNorm2d(16), r"it has only 1 detectron2 FrozenBatchNorm2d layer\(s\) \(at 1\), whose statistics are "
                            r"fixed .*which example weighing does not mix\. .*build the model with trainable batch norms"),
    (nn.BatchNorm2d(16, track_running_stats=False), r"it has only 1 batch norm\(s\) keeping no running statistics "
                                                    r"\(track_running_stats=False, at 1\).*track_running_stats=True"),
    (nn.GroupNorm(4, 16), r"it has no batch norm layer at all"),
], ids=["FrozenBN", "untracked", "GN"])
def test_a_model_with_nothing_to_weigh_is_refused_saying_why(norm, message):
    model = nn.Sequential(nn.Conv2d(3, 16, 3), norm)
    with pytest.raises(GwdetValueError, match=rf"^apply_example_weighing: Sequential has no batch norm to weigh with "
                                              rf"weight 0.3: {message}.*weighable_norms\(model\).*The model is as it was\.$"):
        apply_example_weighing(model, 0.3)
    assert model[1] is norm


class _ScaledBN(nn.BatchNorm2d):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * 2 + 1


class _PlainSubclassBN(nn.BatchNorm2d):
    pass


# before: a BatchNorm2d subclass with its own forward was replaced by a plain BatchGroupNorm without a word (3.30 away at weight 0)
def test_a_batch_norm_subclass_with_its_own_forward_is_refused_and_the_model_left_as_it_was():
    x = torch.randn(4, 16, 5, 5)
    model = nn.Sequential(nn.Conv2d(16, 16, 1), _ScaledBN(16), nn.Conv2d(16, 16, 1), _PlainSubclassBN(16))
    model(x)
    model.eval()
    own, plain = model[1], model[3]
    with pytest.raises(GwdetTypeError, match=r"^the batch norm\(s\) 1 \(_ScaledBN: _ScaledBN\.forward\) have a forward "
                                             r"of their own, not torch's or detectron2's: .*their own computation would "
                                             r"be lost\. Apply example weighing to models whose batch norms are torch's "
                                             r"or detectron2's classes .*convert those layers yourself\. The model is as "
                                             r"it was\.$"):
        apply_example_weighing(model, 0.0)
    assert model[1] is own and model[3] is plain
    with pytest.raises(GwdetTypeError, match=r"^example_weighted_norm: _ScaledBN has a forward of its own "
                                             r"\(_ScaledBN\.forward\), .*own computation would be lost"):
        example_weighted_norm(own, 0.0)
    bare = trained_bn(16)
    bare.forward = lambda x: x  # a forward set on the object
    with pytest.raises(GwdetTypeError, match="has a forward set on the object itself"):
        example_weighted_norm(bare, 0.0)
    model[1] = nn.BatchNorm2d(16).eval()  # left: torch's class and a subclass not overriding forward, both converted
    reference = model(x).detach()
    assert apply_example_weighing(model, 0.0) == 2
    assert isinstance(model[1], BatchGroupNorm) and isinstance(model[3], BatchGroupNorm)
    torch.testing.assert_close(model(x), reference)


class _Positive(nn.Module):
    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight.abs()


# before: a batch norm with a parametrized weight (register_parametrization) was replaced by a BatchGroupNorm without
# the parametrization, without a word: the constraint was gone in training and the state-dict keys changed
def test_a_parametrized_batch_norm_is_refused_and_the_model_left_as_it_was():
    from torch.nn.utils import parametrize

    x = torch.randn(2, 3, 9, 9)
    model = small_model()
    parametrize.register_parametrization(model[4], "weight", _Positive())
    first, parametrized = model[1], model[4]
    with pytest.raises(GwdetTypeError, match=r"^the batch norm\(s\) 4 \(BatchNorm2d: weight\) are parametrized "
                                             r"\(torch.nn.utils.parametrize computes those tensors\), .*no longer keep "
                                             r"the parametrization's constraint, and the state dict would have other "
                                             r"keys \(weight for parametrizations.weight.original\)\. Apply example "
                                             r"weighing before registering the parametrizations .*"
                                             r"remove_parametrizations\(model.get_submodule\('4'\), 'weight'\), "
                                             r".*The model is as it was\.$"):
        apply_example_weighing(model, 0.3)
    assert model[1] is first and model[4] is parametrized and parametrize.is_parametrized(model[4], "weight")
    assert "4.parametrizations.weight.original" in model.state_dict()
    with pytest.raises(GwdetTypeError, match=r"^example_weighted_norm: BatchNorm2d is parametrized "
                                             r"\(torch.nn.utils.parametrize computes its weight\), .*"
                                             r"remove_parametrizations\(bn, 'weight'\)\.$"):
        example_weighted_norm(parametrized, 0.3)
    # the fix the message gives: the parametrization removed, its current values kept, the model is weighed
    reference = model(x).detach()
    parametrize.remove_parametrizations(model[4], "weight")
    assert apply_example_weighing(model, 0.0) == 2
    torch.testing.assert_close(model(x), reference)


# before: "has no batch norm layer at all ... which other norms do not keep", though BGN keeps running statistics
# and weighs examples by its own eval_example_weight
@pytest.mark.parametrize("name, kwargs", [("BGN", {"num_groups": 4}), ("GhostBN", {})])
def test_a_model_of_batch_group_norms_is_refused_naming_their_own_example_weight(name, kwargs):
    from gwdet import norm

    model = nn.Sequential(nn.Conv2d(16, 16, 1), norm(name, **kwargs)(16))
    model(torch.randn(4, 16, 4, 4))
    model.eval()
    layer = model[1]
    with pytest.raises(GwdetValueError, match=r"^apply_example_weighing: Sequential has no batch norm to weigh with "
                                              r"weight 0.4: its 1 BatchGroupNorm layer\(s\) \(BGN / GhostBN, at 1\) "
                                              r"weigh examples by their own eval_example_weight \(now 0.0\): set it "
                                              r"there, MODEL.BGN.EVAL_EXAMPLE_WEIGHT 0.4 .*layer.eval_example_weight = "
                                              r"0.4 .*The model is as it was\.$"):
        apply_example_weighing(model, 0.4)
    assert model[1] is layer and layer.eval_example_weight == 0.0
