"""Flop counting with fvcore / detectron2: gwdet's layers are counted by gwdet.layers.cost, checked
against fvcore's own handles (3x3 convolution, matrix products of the reference formulas) and
against the input shapes each layer sees in the eager model; the counting wrappers of
gwdet.export.counting_ops, which stand for the layers while a model is traced, and leave it as it
was."""
import subprocess
import sys

import pytest

pytest.importorskip("detectron2.export", reason="detectron2 0.6's export module imports caffe2 (gwdet.export needs detectron2 >= 0.7)")

import torch
from detectron2.layers import ShapeSpec
from detectron2.utils.analysis import FlopCountAnalysis as Detectron2FlopCountAnalysis

from conftest import REPO
from gwdet import norm
from gwdet.export import FlopCountAnalysis, component_shares, trace_named_ops
from gwdet.export.analyze_model import share_markdown, share_rows
from gwdet.export.counting_ops import CountingWrapper
from gwdet.layers import BatchGroupNorm, BatchWhitening, GroupWhitening
from gwdet.layers.cost import (
    batch_group_norm_macs,
    batch_whitening_macs,
    group_whitening_macs,
    group_whitening_relative_cost,
)
from gwdet.modeling import GWRetinaNetHead, PerLevelNorm
from tiny_models import build_tiny_model

pytestmark = pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")


def layer_counts(model: torch.nn.Module, x: torch.Tensor, named_ops: bool):
    """fvcore's count per module: gwdet's layers as named ops, or their reference formulas traced
    as ATen ops and counted by fvcore's own handles."""
    analysis = (FlopCountAnalysis if named_ops else Detectron2FlopCountAnalysis)(model, (x,))
    analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
    return analysis


def test_paper_relative_cost_of_gw_against_fvcores_convolution_count():
    # GW paper Sec. 3: 2g/(9d) + T g^3 / (9 HW d^2), with fvcore counting the convolution
    d, g, h, w, T = 64, 16, 12, 10, 5
    model = torch.nn.Sequential(torch.nn.Conv2d(d, d, 3, padding=1, bias=False), GroupWhitening(d, g, T=T))
    x = torch.randn(2, d, h, w)
    counts = layer_counts(model.eval(), x, named_ops=True).by_model_module()
    assert counts["0"] == 2 * 9 * h * w * d * d  # fvcore's conv handle
    paper = 2 * g / (9 * d) + T * g**3 / (9 * h * w * d * d)
    assert counts["1"] / counts["0"] == pytest.approx(paper, rel=1e-12)
    assert group_whitening_relative_cost(x.shape, g, T) == pytest.approx(paper, rel=1e-12)


@pytest.mark.parametrize(
    "layer,shape,matrix_products",
    [
        # (layer, input shape, g x g (k x k) products per whitening matrix in the reference formulas):
        # ItN's coupled form, P R and Q R R per iteration and no Q after the last, 3 T - 2
        (GroupWhitening(24, 8, T=5), (3, 24, 5, 4), 3 * 5 - 2),
        (GroupWhitening(24, 8, T=3), (6, 24), 3 * 3 - 2),
        (BatchWhitening(24, 8, T=4, method="itn"), (3, 24, 5, 4), 3 * 4 - 2),
    ],
)
def test_named_op_counts_differ_from_fvcores_matmul_count_only_by_the_newton_products(layer, shape, matrix_products):
    # Counting the reference formulas, fvcore's matmul handle sees the 2 S d g (2 M C k) products
    # over the activation and 3T - 2 products of the Newton iterations; the paper's formula has T g^3.
    x = torch.randn(shape)
    layer.train()
    named = layer_counts(layer, x, named_ops=True)
    reference = layer_counts(layer, x, named_ops=False)
    size = layer.effective_num_groups if isinstance(layer, GroupWhitening) else layer.effective_group_size
    matrices = shape[0] if isinstance(layer, GroupWhitening) else shape[1] // size
    extra = matrices * (matrix_products - layer.T) * size**3
    assert reference.total() - named.total() == extra
    assert not named.unsupported_ops()  # the reference formulas leave fvcore ops it cannot count


def test_batch_whitening_in_evaluation_is_the_product_with_the_running_matrix():
    layer = BatchWhitening(24, 8).eval()
    x = torch.randn(3, 24, 5, 4)
    named = layer_counts(layer, x, named_ops=True)
    reference = layer_counts(layer, x, named_ops=False)  # one matmul: fvcore's own count
    assert named.total() == reference.total() == batch_whitening_macs(x.shape, 8, training=False)


@pytest.mark.parametrize("training,weight,expected_per_value", [(True, 0.0, 5), (False, 0.0, 2), (False, 0.5, 5)])
def test_batch_group_norm_counts_like_fvcores_batch_norm(training, weight, expected_per_value):
    layer = BatchGroupNorm(16, 4, eval_example_weight=weight).train(training)
    x = torch.randn(4, 16, 3, 3)
    assert layer_counts(layer, x, named_ops=True).total() == expected_per_value * x.numel()
    # fvcore's aten::batch_norm handle gives BatchNorm2d the same counts (5 and 2 with the affine)
    if weight == 0.0:
        bn = torch.nn.BatchNorm2d(16).train(training)
        assert Detectron2FlopCountAnalysis(bn, (x,)).total() == expected_per_value * x.numel()


def test_every_gwdet_layer_of_a_model_is_counted_with_the_shape_it_sees():
    model = build_tiny_model("all_norms")
    image = torch.rand(3, 64, 64, generator=torch.Generator().manual_seed(0)) * 255
    seen = {}

    def recorder(name):
        def record(module, inputs, output) -> None:
            seen.setdefault(name, tuple(inputs[0].shape))

        return record

    hooks = [
        module.register_forward_hook(recorder(name))
        for name, module in model.named_modules()
        if isinstance(module, (GroupWhitening, BatchWhitening, BatchGroupNorm))
    ]
    with torch.no_grad():
        model([{"image": image}])
    for hook in hooks:
        hook.remove()
    analysis = FlopCountAnalysis(model, [{"image": image}])
    analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
    counts = analysis.by_model_module()
    assert len(seen) == 17 + 36 + 4 + 8 + 4  # GW_ZCA, BGN in ResNet and box head, BW, GW
    for name, shape in seen.items():
        module = model.get_submodule(name)
        if isinstance(module, GroupWhitening):
            expected = group_whitening_macs(shape, module.num_groups, module.T, module.method)
        elif isinstance(module, BatchWhitening):
            expected = batch_whitening_macs(shape, module.group_size, module.T, module.method, training=False)
        else:
            expected = batch_group_norm_macs(shape, affine=True, computes_statistics=True)
        assert counts[name] == expected, name
        assert not analysis.unsupported_ops("model." + name), name
    # the shares add up: all gwdet flops of the model are inside its components
    rows = {row["module"]: row for row in share_rows(analysis, model)}
    parts = ("backbone", "proposal_generator", "roi_heads.box_head", "roi_heads.mask_head")
    assert sum(rows[p]["gwdet_flops"] for p in parts) == rows[""]["gwdet_flops"] == sum(counts[n] for n in seen)
    assert 0.0 < rows[""]["share"] < 1.0
    assert "| whole model |" in share_markdown(list(rows.values()))
    (whole,) = component_shares(analysis, model, {"all": ""})
    assert whole["flops"] == analysis.total()


def model_state(model: torch.nn.Module):
    """Everything counting could leave changed: the module tree (objects under their names), the
    tensors of the state dict (objects and values; not the settings records of gwdet's layers, which
    each state_dict call makes anew), the hooks and the training flags."""
    return {
        "modules": [(name, module) for name, module in model.named_modules(remove_duplicate=False)],
        "tensors": {key: (value, value.detach().clone()) for key, value in model.state_dict(keep_vars=True).items()
                    if not key.endswith("_extra_state")},
        "hooks": [
            (len(module._forward_hooks), len(module._forward_pre_hooks), module.training)
            for module in model.modules()
        ],
    }


def assert_same_state(before, after) -> None:
    assert [name for name, _ in after["modules"]] == [name for name, _ in before["modules"]]
    assert all(a is b for (_, a), (_, b) in zip(after["modules"], before["modules"], strict=True))
    assert after["tensors"].keys() == before["tensors"].keys()
    for key, (tensor, value) in before["tensors"].items():
        assert after["tensors"][key][0] is tensor and torch.equal(after["tensors"][key][1], value), key
    assert after["hooks"] == before["hooks"]


def test_counting_leaves_the_model_exactly_as_it_was():
    model = build_tiny_model("all_norms")
    image = torch.rand(3, 64, 64, generator=torch.Generator().manual_seed(0)) * 255
    before = model_state(model)
    analysis = FlopCountAnalysis(model, [{"image": image}])
    analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
    assert analysis.total() > 0 and analysis.by_operator()["batch_whitening"] > 0
    assert_same_state(before, model_state(model))
    with torch.no_grad():
        model([{"image": image}])  # the layers run again in the model


def test_a_detector_in_training_mode_or_given_a_bare_tensor_is_refused_naming_the_fix():
    # gwdet.build_model's model is in training mode: detectron2's "RPN requires gt_instances in training!";
    # a bare image tensor: an IndexError from inside the model
    model = build_tiny_model("all_norms")
    image = torch.rand(3, 64, 64) * 255
    with pytest.raises(ValueError, match=r"^FlopCountAnalysis counts the inference of a GeneralizedRCNN, and the model "
                                         r"is in training mode .*: call model.eval\(\) first.$"):
        FlopCountAnalysis(model.train(), [{"image": image}])
    with pytest.raises(TypeError, match=r"give the inputs as the model takes them, a list of dicts with an 'image' "
                                        r"tensor of shape \(C, H, W\), e.g. \[\{'image': image\}\]; got a Tensor of "
                                        r"shape \(3, 64, 64\).$"):
        FlopCountAnalysis(model.eval(), image)
    FlopCountAnalysis(model, ([{"image": image}],))  # the list as the one argument of a tuple: detectron2's form too


def test_inside_trace_named_ops_wrappers_take_the_layers_places_until_an_error_leaves_it():
    model = build_tiny_model("itn_bw_bgn", training=True)
    before = model_state(model)
    layer_types = (GroupWhitening, BatchWhitening, BatchGroupNorm)
    layers = {name for name, module in model.named_modules() if isinstance(module, layer_types)}
    with pytest.raises(RuntimeError, match="stop"):
        with trace_named_ops(model) as wrappers:
            inside = dict(model.named_modules())
            assert {name for name, module in inside.items() if isinstance(module, CountingWrapper)} == layers
            assert len(wrappers) == len(layers)
            assert all(inside[name].wrapped is wrappers[inside[name]] for name in layers)
            # the same tensors under the same names, the same training flags
            tensors = model.state_dict(keep_vars=True)
            assert tensors.keys() == before["tensors"].keys()
            assert all(value is before["tensors"][key][0] for key, value in tensors.items())
            assert all(inside[name].training for name in layers)
            raise RuntimeError("stop")
    assert_same_state(before, model_state(model))


@pytest.mark.parametrize(
    "norm_name,kwargs", [("BW", {"group_size": 8}), ("BGN", {"num_groups": 4, "eval_example_weight": 0.5})]
)
def test_the_per_level_norms_of_a_retinanet_head_are_counted_level_by_level(norm_name, kwargs):
    levels = [ShapeSpec(channels=16, stride=stride) for stride in (8, 16, 32)]
    torch.manual_seed(0)
    head = GWRetinaNetHead(
        input_shape=levels, num_classes=2, num_anchors=1, conv_dims=[16, 16], norm=norm(norm_name, **kwargs)
    )
    per_level = [name for name, module in head.named_modules() if isinstance(module, PerLevelNorm)]
    assert len(per_level) == 4  # two convs in each of the two subnets

    class Head(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = head

        def forward(self, *features):
            return self.head(list(features))

    model = Head().eval()
    sizes = (8, 4, 2)
    features = tuple(
        torch.randn(2, 16, size, size, generator=torch.Generator().manual_seed(size)) for size in sizes
    )
    before = model_state(model)
    analysis = FlopCountAnalysis(model, features)
    counts = analysis.by_model_module()
    for container in per_level:
        for level, size in enumerate(sizes):
            layer = head.get_submodule(f"{container}.levels.{level}")
            shape = (2, 16, size, size)
            if isinstance(layer, BatchWhitening):
                expected = batch_whitening_macs(shape, layer.group_size, layer.T, layer.method, training=False)
            else:
                expected = batch_group_norm_macs(shape, affine=True, computes_statistics=True)
            assert counts[f"head.{container}.levels.{level}"] == expected, (container, level)
        assert counts[f"head.{container}"] == sum(counts[f"head.{container}.levels.{level}"] for level in range(3))
    assert not analysis.unsupported_ops() and not analysis.uncalled_modules()
    assert_same_state(before, model_state(model))


@pytest.mark.parametrize(
    "layer,op",
    [
        (GroupWhitening(12, 4), "gwdet::group_whitening"),
        (GroupWhitening(12, 4, method="zca", affine=False), "gwdet::group_whitening"),
        (BatchWhitening(12, 4).eval(), "gwdet::batch_whitening"),
        (BatchGroupNorm(12, 3), "gwdet::batch_group_norm"),
    ],
)
def test_a_trace_inside_trace_named_ops_holds_one_named_op_per_layer_and_none_outside(layer, op):
    model = torch.nn.Sequential(torch.nn.Conv2d(12, 12, 1), layer, torch.nn.ReLU(), layer)  # a layer used twice
    x = torch.randn(4, 12, 3, 3, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(x)
    with trace_named_ops(model):
        with torch.no_grad():
            eager = model(x)  # outside a trace the wrappers run the layers
        traced = torch.jit.trace(model, (x,), check_trace=False)
    assert torch.equal(eager, expected)
    kinds = [node.kind() for node in traced.inlined_graph.nodes()]
    assert kinds.count(op) == 2 and not any(kind.startswith("gwdet::") and kind != op for kind in kinds)
    assert torch.allclose(traced(x), expected, rtol=0, atol=1e-5)
    plain = torch.jit.trace(model, (x,), check_trace=False)
    assert not any(node.kind().startswith("gwdet::") for node in plain.inlined_graph.nodes())
    with pytest.raises(ValueError, match="itself a gwdet layer"):
        with trace_named_ops(layer):
            pass


def test_a_counting_wrapper_refuses_the_inputs_its_layer_refuses():
    model = torch.nn.Sequential(GroupWhitening(8, 8))
    with trace_named_ops(model), pytest.raises(ValueError, match="single value"):
        torch.jit.trace(model, (torch.randn(2, 8),), check_trace=False)


@pytest.mark.parametrize("training", [True, False])
def test_counting_ops_of_the_batch_layers_pass_opcheck(training):
    x = torch.randn(4, 16, 3, 3)
    bw, bgn = BatchWhitening(16, 4, method="itn"), BatchGroupNorm(16, 4, eval_example_weight=0.5)
    torch.library.opcheck(
        torch.ops.gwdet.batch_whitening.default,
        (x, bw.running_mean, bw.running_whitening, bw.weight.detach(), bw.bias.detach(), training, 0.1, 5, 1e-5,
         "itn"),
        test_utils=("test_schema", "test_faketensor"),
    )
    torch.library.opcheck(
        torch.ops.gwdet.batch_group_norm.default,
        (x, bgn.running_mean, bgn.running_var, bgn.weight.detach(), bgn.bias.detach(), training, 4, 2, 1e-5, 0.1,
         0.5),
        test_utils=("test_schema", "test_faketensor"),
    )


def test_the_layers_register_no_counting_op():
    # gwdet.layers registers the ops its layers run (GW's fused op, ItN's whitening op) and no more
    script = (
        "import sys, torch, gwdet.layers\n"
        "ops = sorted(name for name in dir(torch.ops.gwdet) if not name.startswith('_') and name != 'name')\n"
        "print(ops, 'gwdet.export' in sys.modules)\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert completed.returncode == 0, completed.stderr
    expected = ["group_whitening", "group_whitening_backward", "itn_whitening", "itn_whitening_backward",
                "zca_whitening", "zca_whitening_backward"]
    assert completed.stdout.strip().splitlines()[-1] == f"{expected} False"


# the MAC counters took T=-5 (3456, fewer than T=0's 4096) and a negative size (-3456) without a word
@pytest.mark.parametrize("call,match", [
    (lambda: group_whitening_macs([2, 16, 4, 4], 4, T=-5), r"^group_whitening_macs: T must be an integer >= 1, got -5$"),
    (lambda: group_whitening_macs([2, 16, 4, 4], 4, T=0), r"^group_whitening_macs: T must be an integer >= 1, got 0$"),
    (lambda: batch_whitening_macs([2, 16, 4, 4], 4, T=0, method="itn"), r"^batch_whitening_macs: T must be an integer"),
    (lambda: group_whitening_macs([2, 16, -4, 4], 4),
     r"^group_whitening_macs: shape must be a layer input's shape \(N, C\) or \(N, C, \*spatial\) of whole sizes >= 0 "
     r"with C >= 1, got \[2, 16, -4, 4\]; give x.shape"),
    (lambda: batch_group_norm_macs([-2, 16]), r"^batch_group_norm_macs: shape must be .* got \[-2, 16\]"),
    (lambda: group_whitening_relative_cost([2, 16, 4, 4], 0), r"^group_whitening_macs: groups must be an integer >= 1"),
    # a zero spatial size (GroupWhitening refuses it) counted 640 MACs; T past the layers' bound was taken
    (lambda: group_whitening_macs([2, 16, 0, 4], 4), r"^group_whitening_macs: shape \[2, 16, 0, 4\] has a zero spatial "
                                                     r"size, which GroupWhitening refuses"),
    (lambda: group_whitening_macs([2, 16, 4, 4], 4, T=2**63), r"^group_whitening_macs: T must be an integer from 1 to "
                                                              r"1000"),
])
def test_mac_counters_refuse_what_the_layers_refuse(call, match):
    with pytest.raises(ValueError, match=match):
        call()
    assert group_whitening_macs([0, 16, 4, 4], 4) == 0  # an empty batch counts nothing


# training="no" was counted as training (5504, not 2048), affine="no" as an affine (2560, not 2048)
def test_mac_counters_refuse_a_string_for_a_flag():
    shape = [2, 16, 4, 4]
    with pytest.raises(ValueError, match=r"^batch_whitening_macs: training must be True or False, got 'no' \(str\)$"):
        batch_whitening_macs(shape, 4, training="no")
    with pytest.raises(ValueError, match=r"^batch_group_norm_macs: affine must be True or False, got 'no' \(str\)$"):
        batch_group_norm_macs(shape, affine="no")
    with pytest.raises(ValueError, match=r"^batch_group_norm_macs: computes_statistics must be True or False, got 0 "):
        batch_group_norm_macs(shape, computes_statistics=0)
    assert batch_whitening_macs(shape, 4, training=False) == 2048
    assert batch_group_norm_macs(shape, affine=False) == 2048


# unsupported_ops() as the first query of an analysis ended in fvcore's raw RuntimeError "Analysis results should be
# computed before calling unsupported_ops()"
def test_unsupported_ops_as_the_first_query_runs_the_analysis():
    model = torch.nn.Sequential(GroupWhitening(32, num_groups=4), torch.nn.GELU()).eval()
    x = torch.randn(2, 32, 8, 8, generator=torch.Generator().manual_seed(0))
    first = FlopCountAnalysis(model, (x,)).unsupported_ops_warnings(False)
    assert first.unsupported_ops() == {"aten::gelu": 1}
    assert first.unsupported_ops("model.0") == {} and first.uncalled_modules() == set()
    after = FlopCountAnalysis(model, (x,)).unsupported_ops_warnings(False)
    assert after.total() == first.total() > 0 and after.unsupported_ops() == first.unsupported_ops()


class _OwnGroupWhitening(GroupWhitening):
    pass


class _OwnBatchGroupNorm(BatchGroupNorm):
    pass


# before: gwdet_layer_names matched the layers' exact classes, so a subclass's flops were left out: gwdet_flops 0, share 0.0
def test_the_flops_of_a_subclass_of_a_gwdet_layer_count_as_the_layer_it_derives_from():
    def model(gw: type, bgn: type) -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), gw(16, num_groups=4), torch.nn.Conv2d(16, 16, 1),
                                   bgn(16, num_groups=4)).eval()

    x = torch.randn(2, 3, 12, 12)
    rows = {}
    for gw, bgn in ((GroupWhitening, BatchGroupNorm), (_OwnGroupWhitening, _OwnBatchGroupNorm)):
        net = model(gw, bgn)
        (rows[gw],) = component_shares(layer_counts(net, x, named_ops=True), net, {"all": ""})
    plain, own = rows[GroupWhitening], rows[_OwnGroupWhitening]
    assert own["gwdet_flops"] > 0 and set(own["by_op"]) == {"gwdet::group_whitening", "gwdet::batch_group_norm"}
    assert own == plain and 0.0 < own["share"] < 1.0
