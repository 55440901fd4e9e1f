"""What BatchGroupNorm computes (Summers & Dinneen 2020, Secs. 3.1, 3.2, 3.4), against torch's
GroupNorm and BatchNorm and statistics taken by hand; what every gwdet layer does is in
test_layer_contract.py."""
import pickle
import warnings

import pytest
import torch
import torch.nn.functional as F

from gwdet.layers import BatchGroupNorm, batch_group_norm


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


def test_a_block_of_a_single_value_is_refused_in_training_as_batch_norm_refuses_one():
    # one channel per group (GhostBN) and (N, C) inputs: a block of one example holds one value,
    # which normalizes to 0 whatever it is (the output would be the bias for any input)
    with pytest.raises(ValueError, match="Expected more than 1 value per channel when training"):
        F.batch_norm(torch.randn(1, 4), None, None, training=True)
    cases = [
        (1, torch.randn(3, 4), "examples_per_group=1 puts each example in a group of its own"),
        (2, torch.randn(3, 4), "examples_per_group=2 does not divide the batch of 3 examples, whose last example "
                               "group has 1 example"),
        (2, torch.randn(1, 4, 1, 1), "the batch of 1 example is smaller than examples_per_group=2"),
    ]
    for examples, x, why in cases:
        layer = BatchGroupNorm(4, num_groups=4, examples_per_group=examples)
        with pytest.raises(ValueError) as refused:
            layer(x)
        assert str(refused.value) == (
            f"BatchGroupNorm: in training, an input of shape {list(x.shape)} leaves an (example group x channel "
            f"group) block of a single value: {why}, with one channel per group (num_groups=4 for 4 channels) and "
            "one position. A single value normalizes to 0 for any input (batch norm refuses it too: expected more "
            "than 1 value per channel when training). Use an examples_per_group of at least 2 that divides the "
            "batch size (the layer's examples_per_group argument; yacs: MODEL.BGN.EXAMPLES_PER_GROUP), a larger "
            "input (more than one position per channel: for a backbone or FPN level, larger images), or groups of "
            "several channels: a num_groups below 4 (yacs: MODEL.BGN.NUM_GROUPS) for BGN. GhostBN has one channel "
            "per group (it takes no num_groups; yacs: MODEL.BGN.NUM_GROUPS does not change it), so for GhostBN it is "
            "the examples_per_group or a larger input")
        assert torch.equal(layer.running_var, torch.ones(4)), "nothing was updated"
        assert torch.isfinite(layer.eval()(x)).all(), "evaluation uses the running statistics: nothing to refuse"
    # two values in every block: two examples, two channels or two positions
    assert torch.isfinite(BatchGroupNorm(4, num_groups=4, examples_per_group=2)(torch.randn(4, 4))).all()
    assert torch.isfinite(BatchGroupNorm(4, num_groups=2, examples_per_group=1)(torch.randn(3, 4))).all()
    assert torch.isfinite(BatchGroupNorm(4, num_groups=4, examples_per_group=1)(torch.randn(3, 4, 2))).all()


def test_the_functional_form_refuses_a_block_of_a_single_value_its_computation_has_no_bessel_correction():
    # batch_group_norm checks as the module does; the computation behind both keeps its running variance finite
    from gwdet.layers.batch_group_norm import _batch_group_norm

    running_mean, running_var = torch.zeros(4), torch.ones(4)
    with pytest.raises(ValueError, match=r"^batch_group_norm: in training, an input of shape \[3, 4\] leaves an "
                                         r"\(example group x channel group\) block of a single value"):
        batch_group_norm(torch.randn(3, 4), running_mean, running_var, None, None, True, 4, 1, 1e-5, 0.1, 0.0)
    _batch_group_norm(torch.randn(3, 4), running_mean, running_var, None, None, True, 4, 1, 1e-5, 0.1, 0.0)
    assert torch.isfinite(running_var).all() and torch.equal(running_var, torch.full((4,), 0.9))


def test_buffers_are_named_as_batch_norms():
    # a batch norm's statistics load into BGN under the same keys (beside them, BGN's settings)
    state = BatchGroupNorm(32).state_dict()
    batch_norm = torch.nn.BatchNorm2d(32).state_dict()
    assert {key: value.shape for key, value in state.items() if key != "_extra_state"} == {
        key: value.shape for key, value in batch_norm.items() if key != "num_batches_tracked"}


@pytest.mark.parametrize("weight, folds", [(0.0, True), (0.5, False)])
def test_conv_bn_folding_holds_for_running_statistics_alone_as_docs_deploy_says(weight, folds):
    # torch's fuse_conv_bn_eval reads BGN's running statistics as batch norm's: right for evaluation on them
    # alone (eval_example_weight 0), another function with each image's statistics mixed in
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 16, 3, padding=1)
    layer = BatchGroupNorm(16, num_groups=4, eval_example_weight=weight)
    with torch.no_grad():
        for _ in range(5):
            layer(conv(torch.randn(4, 3, 8, 8)))
    conv.eval(), layer.eval()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        difference = (torch.nn.utils.fuse_conv_bn_eval(conv, layer)(x) - layer(conv(x))).abs().max().item()
    assert (difference < 1e-4) == folds


def test_example_groups_that_do_not_divide_the_images_per_process_are_refused_where_layers_see_images():
    from detectron2.config import get_cfg

    from gwdet import add_gwdet_config, check_gwdet_config

    cfg = add_gwdet_config(get_cfg())
    cfg.MODEL.BACKBONE.NAME = "build_gw_resnet_fpn_backbone"
    cfg.MODEL.FPN.NORM, cfg.SOLVER.IMS_PER_BATCH, cfg.MODEL.BGN.EXAMPLES_PER_GROUP = "BGN", 4, 3
    with pytest.raises(ValueError) as refused:
        check_gwdet_config(cfg)
    assert str(refused.value) == (
        "config: MODEL.BGN.EXAMPLES_PER_GROUP=3 does not divide the 4 images each process trains on "
        "(SOLVER.IMS_PER_BATCH=4 over 1 process(es)), so the layers of MODEL.FPN.NORM would normalize the last 1 "
        "image(s) of every batch as an example group of their own. Use a MODEL.BGN.EXAMPLES_PER_GROUP that divides 4, "
        "or a SOLVER.IMS_PER_BATCH that is a multiple of 3.")
    cfg.MODEL.BGN.EXAMPLES_PER_GROUP = 2
    check_gwdet_config(cfg)
    # in the ROI heads the batch is the boxes sampled from the images: the layer's rule (a smaller last group)
    cfg.MODEL.FPN.NORM, cfg.MODEL.BGN.EXAMPLES_PER_GROUP = "GN", 3
    cfg.MODEL.ROI_BOX_HEAD.NAME, cfg.MODEL.ROI_BOX_HEAD.NORM = "GWFastRCNNConvFCHead", "BGN"
    check_gwdet_config(cfg)


def test_the_example_group_rules_read_only_the_norms_the_model_builds():
    # refused "no example group can be filled" for BGN in parts never built (GW_NORM at no position, a mask
    # head without MASK_ON) and in the box head, whose batch is its boxes
    from gwdet.model_zoo import build_config

    from conftest import DEMO_CONFIG

    one_image = ["SOLVER.IMS_PER_BATCH", "1", "MODEL.BGN.EXAMPLES_PER_GROUP", "2"]
    build_config(str(DEMO_CONFIG), [*one_image, "MODEL.RESNETS.GW_NORM", "BGN", "MODEL.RESNETS.GW_POSITIONS", ""])
    build_config(str(DEMO_CONFIG), [*one_image, "MODEL.MASK_ON", "False", "MODEL.ROI_MASK_HEAD.NORM", "BGN"])
    build_config(str(DEMO_CONFIG), [*one_image, "MODEL.ROI_BOX_HEAD.NORM", "BGN"])
    with pytest.raises(ValueError, match=r"EXAMPLES_PER_GROUP=2 is larger than SOLVER.IMS_PER_BATCH=1"):
        build_config(str(DEMO_CONFIG), [*one_image, "MODEL.FPN.NORM", "BGN"])


def test_evaluation_on_the_examples_own_single_values_is_refused_as_training_is():
    # eval_example_weight=1 on one value per channel group returned the bias for any input
    import gwdet

    for layer in (BatchGroupNorm(16, num_groups=16, eval_example_weight=1.0),
                  gwdet.norm("GhostBN", eval_example_weight=1.0)(16)):
        layer.eval()
        for shape in ((3, 16), (2, 16, 1, 1)):
            with pytest.raises(ValueError, match=r"in evaluation with eval_example_weight=1 each example is "
                                                 r"normalized by its own statistics.*normalizes to 0 for any input"):
                layer(torch.randn(shape))
        assert layer(torch.randn(2, 16, 2, 2)).shape == (2, 16, 2, 2)  # four values per group: normalized
    blended = BatchGroupNorm(16, num_groups=16, eval_example_weight=0.5).eval()
    x = torch.randn(3, 16)
    assert not torch.equal(blended(x), blended(x * 10))  # the running statistics give the value its place


@pytest.mark.parametrize("scale", [1.0, 1e14, 1e17, 1e30])
def test_evaluation_on_running_statistics_alone_is_batch_norms_for_any_input_magnitude(scale):
    # eval_example_weight=0 (the default): 0.89 x batch norm's output at 1e15, 0 at 1e30 (the ridge floor of the
    # scaled values outweighed the scaled running variance)
    layer = BatchGroupNorm(16, num_groups=16, eval_example_weight=0.0)
    generator = torch.Generator().manual_seed(5)
    for _ in range(3):
        layer(torch.randn(4, 16, 3, 3, generator=generator) * 3 + 1)
    layer.eval()
    bn = torch.nn.BatchNorm2d(16).eval()
    bn.running_mean.copy_(layer.running_mean)
    bn.running_var.copy_(layer.running_var)
    x = torch.randn(2, 16, 3, 3, generator=generator) * scale
    with torch.no_grad():
        torch.testing.assert_close(layer(x), bn(x), rtol=1e-5, atol=1e-5)


def test_example_groups_of_layers_made_otherwise_than_by_a_config_name_are_checked_in_the_built_model(tmp_path):
    # a registered name building BatchGroupNorm, or a LazyConfig's functools.partial of the class, trained with
    # 3 images per process and examples_per_group=2 without a word (the config checks read gwdet's names and nodes)
    import functools

    from gwdet.engine.lazy import LazyTrainer
    from gwdet.model_zoo.lazy_loading import load_lazy_config
    from gwdet.modeling.model_checks import check_model_example_groups

    from conftest import LAZY_CONFIG

    model = torch.nn.Module()
    model.backbone = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 1), BatchGroupNorm(8, examples_per_group=2))
    model.roi_heads = torch.nn.Sequential(BatchGroupNorm(8, examples_per_group=3))  # its batch: the boxes
    with pytest.raises(ValueError) as refused:
        check_model_example_groups(model, 3, 1, "SOLVER.IMS_PER_BATCH")
    assert str(refused.value) == (
        "config: examples_per_group=2 does not divide the 3 images each process trains on (SOLVER.IMS_PER_BATCH=3 "
        "over 1 process(es)), so the layers of backbone.1 would normalize the last 1 image(s) of every batch as an "
        "example group of their own. Use a examples_per_group that divides 3, or a SOLVER.IMS_PER_BATCH that is a "
        "multiple of 2.")
    check_model_example_groups(model, 4, 1, "SOLVER.IMS_PER_BATCH")
    check_model_example_groups(model, 4, 2, "SOLVER.IMS_PER_BATCH")  # 2 images in each of 2 processes
    with pytest.raises(ValueError, match=r"does not divide the 3 images each process trains on \(SOLVER.IMS_PER_BATCH=6 "
                                         r"over 2 process\(es\)\)"):
        check_model_example_groups(model, 6, 2, "SOLVER.IMS_PER_BATCH")
    lazy = load_lazy_config(str(LAZY_CONFIG), ["dataloader.train.total_batch_size=3",
                                               f"train.output_dir={tmp_path / 'lazy'}"])
    lazy.model.backbone.norm = functools.partial(BatchGroupNorm, num_groups=8, examples_per_group=2)
    with pytest.raises(ValueError, match=r"config: examples_per_group=2 does not divide the 3 images each process "
                                         r"trains on \(dataloader.train.total_batch_size=3 over 1 process\(es\)\), so "
                                         r"the layers of backbone.fpn_lateral2.norm, "):
        LazyTrainer(lazy)


def test_batch_statistics_layers_frozen_by_ones_own_code_are_refused_before_training(tmp_path):
    # detectron2's ResNet.freeze(2) in a Trainer subclass's build_model: the "frozen" stem's BGN kept moving its
    # running mean (0.026 in 2 iterations) while its weights stayed, without a word (FREEZE_AT is refused so)
    from gwdet.engine.trainer import Trainer
    from gwdet.model_zoo import build_config

    from conftest import DEMO_CONFIG, TINY_OPTS

    class FreezingStages(Trainer):
        @classmethod
        def build_model(cls, cfg):
            model = super().build_model(cfg)
            model.backbone.bottom_up.freeze(2)
            return model

    cfg = build_config(str(DEMO_CONFIG), [*TINY_OPTS, "MODEL.RESNETS.NORM", "BGN", "MODEL.BGN.NUM_GROUPS", "8",
                                          "OUTPUT_DIR", str(tmp_path)])
    with pytest.raises(ValueError, match=r"^The norm layers backbone.bottom_up.res2.0.shortcut.norm \(BatchGroupNorm\), "
                                         r".* have every parameter frozen \(requires_grad False, as detectron2's "
                                         r"freeze\(\) of a backbone stage leaves them\)"):
        FreezingStages(cfg)
    Trainer(cfg)  # the same model, trained whole


def test_a_trace_in_training_mode_warns_that_it_keeps_the_batchs_example_groups():
    # the trace failed on another batch size with TorchScript's "shape '[2, 2, 4, 36]' is invalid", unexplained
    layer = BatchGroupNorm(16, num_groups=4, examples_per_group=2).train()
    with pytest.warns(RuntimeWarning, match=r"BatchGroupNorm: traced in training mode, the trace splits every batch "
                                            r"into the example groups of this one \(4 examples, 2 per group\) and fails "
                                            r"on a batch of another size. Trace in evaluation mode"):
        torch.jit.trace(layer, torch.randn(4, 16, 3, 3), check_trace=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        traced = torch.jit.trace(layer.eval(), torch.randn(4, 16, 3, 3))  # evaluation mode: any batch size
        assert traced(torch.randn(5, 16, 3, 3)).shape == (5, 16, 3, 3)


# a running_mean requiring grad in training: raw "a leaf Variable that requires grad is being used in an in-place operation"
def test_functional_running_statistics_requiring_grad_are_refused_in_training():
    x = batch(channels=16)
    running_var = torch.ones(16, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"batch_group_norm: running_mean requires grad, but training updates it in "
                                         r"place.*pass running_mean.detach\(\)"):
        batch_group_norm(x, torch.zeros(16, dtype=torch.float64, requires_grad=True), running_var, None, None, True,
                         4, 2, 1e-5, 0.1, 0.0)
    # evaluation only reads them
    batch_group_norm(x, torch.zeros(16, dtype=torch.float64, requires_grad=True), running_var, None, None, False,
                     4, 2, 1e-5, 0.1, 0.0)


# an expanded running_mean and one on the meta device: torch's "more than one element of the written-to tensor refers
# to a single memory location" and "Tensor on device cpu is not on the expected device meta!", naming no argument
def test_functional_running_statistics_sharing_memory_or_on_another_device_are_named():
    from gwdet.layers import batch_whitening

    x = batch(channels=16)
    running_var = torch.ones(16, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"batch_group_norm: running_mean is a view whose elements share memory "
                                         r"\(stride 0, as .expand\(\) makes\).*pass running_mean.clone\(\)"):
        batch_group_norm(x, torch.zeros(1, dtype=torch.float64).expand(16), running_var, None, None, True,
                         4, 2, 1e-5, 0.1, 0.0)
    with pytest.raises(ValueError, match=r"batch_whitening: running_whitening is a view whose elements share memory"):
        batch_whitening(x, torch.zeros(16, dtype=torch.float64), torch.eye(4, dtype=torch.float64).expand(4, 4, 4),
                        None, None, True, 0.1, 5, 1e-5, "itn")
    with pytest.raises(ValueError, match=r"batch_group_norm: running_var is on meta, the input on cpu; move it with "
                                         r"running_var.to\(x.device\)"):
        batch_group_norm(x, torch.zeros(16, dtype=torch.float64), running_var.to("meta"), None, None, False,
                         4, 2, 1e-5, 0.1, 0.0)


# bgn.register_buffer('running_mean', None) then a training step: raw "'NoneType' object has no attribute 'lerp_'"
def test_running_statistics_of_the_layer_cannot_be_set_to_none():
    layer = BatchGroupNorm(16, num_groups=4)
    with pytest.raises(AttributeError, match=r"BatchGroupNorm: the running statistic running_var cannot be set to None"):
        layer.register_buffer("running_var", None)
    with pytest.raises(AttributeError, match=r"running_mean cannot be set to None"):
        layer.running_mean = None
    layer(batch(channels=16).float())


# a scripted BGN with examples_per_group = 0 killed the process (SIGFPE); momentum = 5 extrapolated running_var
def test_a_scripted_batch_group_norm_refuses_settings_assigned_to_it():
    x = batch(channels=16).float()
    for name, value, message in [("examples_per_group", 0, r"examples_per_group must be an integer >= 1, got 0"),
                                 ("momentum", 5.0, r"momentum must be a number in \[0, 1\], got 5"),
                                 ("eval_example_weight", -0.5, r"eval_example_weight must be a number in \[0, 1\]")]:
        scripted = torch.jit.script(BatchGroupNorm(16, num_groups=4))
        setattr(scripted, name, value)
        running_var = scripted.running_var.clone()
        with pytest.raises(torch.jit.Error, match=r"BatchGroupNorm: " + message + r".*torch\.jit\.script\("
                                                  r"BatchGroupNorm\(\.\.\., setting=value\)\)"):
            scripted(x)
        assert torch.equal(scripted.running_var, running_var)


# eps=1e-40 (subnormal in float32) was accepted, and with flush-to-zero switched on later every output was NaN
def test_a_subnormal_eps_is_refused_when_the_layer_is_built():
    # (where a library loaded into the process flushes subnormals, torch.compile's C++ kernels built with fast math
    # say, 1e-40 is 0 in float32 and refused as such)
    with pytest.raises(ValueError, match=r"BatchGroupNorm: eps must be (at least float32's smallest normal number, "
                                         r"1.1754944e-38, got 1e-40, which float32 holds only as a subnormal number|"
                                         r"a finite number > 0 in float32, .* got 1e-40, which float32 rounds to 0.0 "
                                         r"with subnormal numbers flushed to zero)"):
        BatchGroupNorm(16, num_groups=4, eps=1e-40)
    BatchGroupNorm(16, num_groups=4, eps=1.2e-38)


# functional batch_group_norm in evaluation with eval_example_weight=1 and one value per channel group gave
# zeros without a word, where the layer refuses the same input
def test_functional_evaluation_refuses_one_value_per_own_group_as_the_layer_does():
    x, running_mean, running_var = torch.randn(3, 4), torch.zeros(4), torch.ones(4)
    with pytest.raises(ValueError, match=r"^batch_group_norm: in evaluation with eval_example_weight=1 each example is "
                                         r"normalized by its own statistics, and an input of shape \[3, 4\] gives each "
                                         r"of its channel groups a single value \(groups=4 for 4 channels, one "
                                         r"position\), which normalizes to 0 for any input. Use an eval_example_weight "
                                         r"below 1, .* or fewer channel groups \(a smaller groups that divides the 4 "
                                         r"channels\)$"):
        batch_group_norm(x, running_mean, running_var, None, None, False, 4, 2, 1e-5, 0.1, 1.0)
    with pytest.raises(ValueError, match=r"^BatchGroupNorm: in evaluation with eval_example_weight=1"):
        BatchGroupNorm(4, num_groups=4, eval_example_weight=1.0).eval()(x)
    # two values per group, or the running statistics blended in: computed
    assert batch_group_norm(x, running_mean, running_var, None, None, False, 2, 2, 1e-5, 0.1, 1.0).abs().max() > 0
    assert batch_group_norm(x, running_mean, running_var, None, None, False, 4, 2, 1e-5, 0.1, 0.5).abs().max() > 0


# the evaluation refusal advised "fewer channel groups (MODEL.BGN.NUM_GROUPS)" for GhostBN too, which has one
# channel per group whatever that key says, and named only yacs keys for a layer built in Python
def test_single_value_refusals_name_the_layer_s_arguments_and_what_ghostbn_can_change():
    import gwdet

    for layer in (BatchGroupNorm(16, num_groups=16, eval_example_weight=1.0),
                  gwdet.norm("GhostBN", eval_example_weight=1.0)(16)):
        with pytest.raises(ValueError) as refused:
            layer.eval()(torch.randn(1, 16, 1, 1))
        message = str(refused.value)
        assert message.endswith(
            "(num_groups=16 for 16 channels: one channel per group, and one position), which normalizes to 0 for any "
            "input. Use an eval_example_weight below 1 (the layer's eval_example_weight argument; yacs: "
            "MODEL.BGN.EVAL_EXAMPLE_WEIGHT), which blends in the running statistics, a larger input (more than one "
            "position per channel: for a backbone or FPN level, larger images), or groups of several channels: a "
            "num_groups below 16 (yacs: MODEL.BGN.NUM_GROUPS) for BGN. GhostBN has one channel per group (it takes "
            "no num_groups; yacs: MODEL.BGN.NUM_GROUPS does not change it), so for GhostBN it is the "
            "eval_example_weight or a larger input"), message
        assert "fewer channel groups (MODEL.BGN.NUM_GROUPS)" not in message
    with pytest.raises(ValueError, match=r"GhostBN has one channel per group \(it takes no num_groups; .*so for "
                                         r"GhostBN it is the examples_per_group or a larger input$"):
        gwdet.norm("GhostBN", examples_per_group=1)(16).train()(torch.randn(3, 16))
    # the functional form names its own groups argument, no config key
    with pytest.raises(ValueError, match=r"^batch_group_norm: in training.*Use an examples_per_group of at least 2 "
                                         r"that divides the batch size, a larger input \(more than one position per "
                                         r"channel\), or a smaller groups that divides the 4 channels$"):
        batch_group_norm(torch.randn(3, 4), torch.zeros(4), torch.ones(4), None, None, True, 4, 1, 1e-5, 0.1, 0.0)


# the functional form given a negative running variance in evaluation returned all NaN without a word, while
# BatchGroupNorm.load_state_dict refuses the same statistics
def test_the_functional_form_refuses_negative_or_nan_running_variances_in_evaluation():
    from gwdet.errors import GwdetValueError

    x = torch.randn(4, 16, 5, 5)
    with pytest.raises(GwdetValueError, match=r"batch_group_norm: running_var holds negative variances \(the smallest "
                       r"-1, at channel 0\), which no training computes: in evaluation \(training=False\) the output "
                       r"would be NaN\. Pass the running variances of a trained layer"):
        batch_group_norm(x, torch.zeros(16), -torch.ones(16), None, None, False, 4, 2, 1e-5, 0.1, 0.0)
    variances = torch.ones(16)
    variances[5] = float("nan")
    with pytest.raises(GwdetValueError, match=r"running_var holds NaN variances"):
        batch_group_norm(x, torch.zeros(16), variances, None, None, False, 4, 2, 1e-5, 0.1, 0.0)
    variances[5] = 0.0  # a dead channel's zero variance is legitimate
    assert torch.isfinite(batch_group_norm(x, torch.zeros(16), variances, None, None, False, 4, 2, 1e-5, 0.1,
                                           0.0)).all()


# a BatchNorm2d's state loaded strictly into BGN failed with torch's bare "Unexpected key(s) in state_dict:
# "num_batches_tracked"", which named neither the BatchNorm nor what to do (inside a model, loaded by the model's
# load_state_dict, torch's message stays: gwdet's checkpointer compares the norm layers first)
@pytest.mark.parametrize("num_groups, examples_per_group", [(16, 8), (4, 2)])
def test_a_batch_norms_state_is_refused_by_name_and_loads_without_num_batches_tracked(num_groups, examples_per_group):
    from gwdet.errors import GwdetValueError

    torch.manual_seed(0)
    bn = torch.nn.BatchNorm2d(16)
    bn(torch.randn(4, 16, 5, 5) * 2 + 1)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5), bn.bias.uniform_(-1.0, 1.0)
    layer = BatchGroupNorm(16, num_groups=num_groups, examples_per_group=examples_per_group)
    with pytest.raises(GwdetValueError, match=r"^BatchGroupNorm: the state is a torch BatchNorm's, not a BatchGroupNorm's: "
                       r"it holds 'num_batches_tracked', which a BatchGroupNorm does not keep, and no record of a gwdet "
                       r"layer's settings; nothing was loaded into the layer\. To load its running statistics and "
                       r"affine into this layer, delete 'num_batches_tracked' from the state dict: in evaluation with "
                       r"eval_example_weight=0 \(this layer has 0\.0\) .* Or build a torch\.nn\.BatchNorm2d\(16\)"):
        layer.load_state_dict(bn.state_dict())
    assert torch.equal(layer.running_var, torch.ones(16)), "nothing loaded"
    # strict=False: torch's loading, the key reported unexpected
    loose = BatchGroupNorm(16, num_groups=num_groups, examples_per_group=examples_per_group)
    assert loose.load_state_dict(bn.state_dict(), strict=False).unexpected_keys == ["num_batches_tracked"]
    assert torch.equal(loose.running_var, bn.running_var)
    # the fix the message names: without num_batches_tracked, evaluation with eval_example_weight 0 is the BatchNorm's
    state = bn.state_dict()
    del state["num_batches_tracked"]
    layer.load_state_dict(state)
    layer.eval(), bn.eval()
    x = torch.randn(3, 16, 5, 5)
    assert torch.allclose(layer(x), bn(x), atol=1e-5)


# a BatchGroupNorm whose running_var was filled with -1 or whose running_mean was NaN evaluated to NaN everywhere
# without a word, and so did torch.func.functional_call given negative running variances
def test_evaluation_refuses_running_statistics_no_training_computes():
    from gwdet.errors import GwdetValueError

    x = torch.randn(4, 16, 5, 5)
    layer = BatchGroupNorm(16, num_groups=4).eval()
    layer.running_var.fill_(-1.0)
    with pytest.raises(GwdetValueError, match=r"^BatchGroupNorm: running_var holds negative variances \(the smallest "
                       r"-1, at channel 0\), which no training computes: in evaluation \(eval mode\) the output would "
                       r"be NaN\. Load the running statistics of a trained layer"):
        layer(x)
    layer.reset_running_stats()
    assert torch.isfinite(layer(x)).all()
    layer.running_mean[3] = float("nan")
    with pytest.raises(GwdetValueError, match=r"^BatchGroupNorm: running_mean holds NaN values \(at channel 3\), "
                                              r"which no training computes"):
        layer(x)
    fine = BatchGroupNorm(16, num_groups=4).eval()
    with pytest.raises(GwdetValueError, match=r"^BatchGroupNorm: running_var holds negative variances"):
        torch.func.functional_call(fine, {"running_var": -torch.ones(16)}, (x,))
    assert torch.isfinite(fine(x)).all()  # its own statistics again
    # the functional form refuses a NaN running mean as well
    with pytest.raises(GwdetValueError, match=r"^batch_group_norm: running_mean holds NaN values \(at channel 0\), "
                       r"which no training computes: in evaluation \(training=False\) the output would be NaN\. Pass "
                       r"the running means of a trained layer"):
        batch_group_norm(x, torch.full((16,), float("nan")), torch.ones(16), None, None, False, 4, 2, 1e-5, 0.1, 0.0)
    # eval_example_weight=1 gives the running statistics no weight: nothing to refuse, the output is group norm's
    own = BatchGroupNorm(16, num_groups=4, eval_example_weight=1.0).eval()
    own.running_var.fill_(-1.0)
    assert torch.isfinite(own(x)).all()
    # training does not read them
    layer.train()
    layer(x)


def test_evaluation_checks_the_running_statistics_once_until_they_change(monkeypatch):
    from gwdet.layers import common

    checked = []
    original = common.running_statistics_problem

    def counting(tensors):
        checked.append(sorted(tensors))
        return original(tensors)

    monkeypatch.setattr(common, "running_statistics_problem", counting)
    x = torch.randn(4, 16, 3, 3)
    layer = BatchGroupNorm(16, num_groups=4).eval()
    layer(x)
    layer(x)
    assert len(checked) == 1  # the same buffers: checked once
    layer.running_var.fill_(2.0)  # an in-place write moves the version counter
    layer(x)
    layer(x)
    assert len(checked) == 2
    layer.train()(x)  # training updates them in place: not checked there, checked at the next evaluation
    assert len(checked) == 2
    layer.eval()(x)
    assert len(checked) == 3
    given = torch.ones(16)
    torch.func.functional_call(layer, {"running_var": given}, (x,))  # another tensor in place of its own: checked
    torch.func.functional_call(layer, {"running_var": given}, (x,))  # the same tensor, unchanged
    assert len(checked) == 4
    layer(x)  # its own again: checked
    assert len(checked) == 5
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's deprecation and tracer warnings
        torch.jit.trace(layer, (x,))  # a trace keeps no check
    assert len(checked) == 5
    copied = pickle.loads(pickle.dumps(layer))  # a copy's buffers are new storage: checked once
    copied(x)
    copied(x)
    assert len(checked) == 6 and torch.equal(copied(x), layer(x))


# a float16 BatchGroupNorm trained on finite inputs beyond 256 in magnitude overflowed running_var to inf, and its
# evaluation then returned NaN without a word (BatchWhitening with an inf running statistic too)
def test_evaluation_refuses_running_statistics_that_overflowed_to_inf_naming_the_float16_cause():
    from gwdet.errors import GwdetValueError
    from gwdet.layers import BatchWhitening, batch_whitening

    torch.manual_seed(0)
    x = (torch.randn(4, 8, 4, 4).clamp(-2, 2) * 30000).half()  # finite float16 values
    layer = BatchGroupNorm(8, 8, dtype=torch.float16)
    layer(x)
    assert torch.isinf(layer.running_var).all()
    layer.eval()
    with pytest.raises(GwdetValueError, match=r"^BatchGroupNorm: running_var holds inf values \(the first at channel "
                       r"0\): in evaluation \(eval mode\) the output would be NaN\. The likely cause: the float16 "
                       r"running statistic overflowed in training, as it does once a batch's variance exceeds 65504, "
                       r"the largest float16 \(inputs beyond about 256 in magnitude\)\. Keep the layer's buffers in "
                       r"float32: build it in float32 \(or call layer\.float\(\)\) and give it float16 inputs under "
                       r"torch\.autocast.*gwdet\.layers\.update_running_statistics\(loader, model\)$"):
        layer(x)
    with pytest.raises(GwdetValueError, match=r"^batch_group_norm: running_var holds inf values \(the first at channel "
                                              r"0\): in evaluation \(training=False\) the output would be NaN\. The likely "
                                              r"cause: the float16 running statistic overflowed"):
        batch_group_norm(x, layer.running_mean, layer.running_var, None, None, False, 8, 2, 1e-5, 0.1, 0.0)
    # the fix the message names: float32 buffers for float16 inputs stay finite, and evaluation returns float16
    kept = BatchGroupNorm(8, 8)
    kept(x)
    assert torch.isfinite(kept.running_var).all()
    out = kept.eval()(x)
    assert out.dtype == torch.float16 and torch.isfinite(out).all()
    # eval_example_weight=1 gives the running statistics no weight: nothing to refuse
    layer.eval_example_weight = 1.0
    assert torch.isfinite(layer(x)).all()
    # a traced graph does not record the check (its outcome would be a constant of the graph)
    layer.eval_example_weight = 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(layer.float(), (x.float(),), check_trace=False)
    layer.reset_running_stats()
    assert torch.isfinite(traced(x.float())).all()
    # BatchWhitening goes through the same check: an inf running mean (float32, so the fix is another)
    bw = BatchWhitening(8, group_size=4).eval()
    bw.running_mean[5] = float("inf")
    with pytest.raises(GwdetValueError, match=r"^BatchWhitening: running_mean holds inf values \(the first at channel "
                                              r"5\): in evaluation \(eval mode\) the output would be NaN\. The likely "
                                              r"cause: the float32 running statistic overflowed in training, as it does "
                                              r"once a batch's mean exceeds 3\.40282e\+38, the largest float32\. Scale the "
                                              r"layer's inputs down, or keep the layer in float64"):
        bw(torch.randn(4, 8, 3, 3))
    with pytest.raises(GwdetValueError, match=r"^batch_whitening: running_mean holds inf values"):
        batch_whitening(torch.randn(4, 8, 3, 3), bw.running_mean, bw.running_whitening, None, None, False, 0.1, 5,
                        1e-5, "zca")
    # a NaN is still one no training computes
    bw.running_mean[5] = float("nan")
    with pytest.raises(GwdetValueError, match=r"^BatchWhitening: running_mean holds NaN values \(at channel 5\), which no "
                                              r"training computes"):
        bw(torch.randn(4, 8, 3, 3))
