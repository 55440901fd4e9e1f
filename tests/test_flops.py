"""Flop counting with fvcore / detectron2: gwdet's layers are counted by gwdet.layers.cost, checked
against fvcore's own handles (3x3 convolution, matrix products of the reference formulas) and
against the input shapes each layer sees in the eager model."""
import pytest

pytest.importorskip("detectron2.export", reason="detectron2 0.6's export module imports caffe2 (gwdet.export needs detectron2 >= 0.7)")

import torch
from detectron2.utils.analysis import FlopCountAnalysis as Detectron2FlopCountAnalysis

from gwdet.export import FlopCountAnalysis, component_shares
from gwdet.export.analyze_model import share_markdown, share_rows
from gwdet.layers import BatchGroupNorm, BatchWhitening, GroupWhitening
from gwdet.layers.cost import (
    batch_group_norm_macs,
    batch_whitening_macs,
    group_whitening_macs,
    group_whitening_relative_cost,
)
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
        # (layer, input shape, g x g (k x k) products per whitening matrix in the reference formulas)
        (GroupWhitening(24, 8, T=5), (3, 24, 5, 4), 3 * 5),  # paper's ItN: 3 products per iteration
        (GroupWhitening(24, 8, T=3), (6, 24), 3 * 3),
        (BatchWhitening(24, 8, T=4, method="itn"), (3, 24, 5, 4), 3 * 4),
    ],
)
def test_named_op_counts_differ_from_fvcores_matmul_count_only_by_the_newton_products(layer, shape, matrix_products):
    # Counting the reference formulas, fvcore's matmul handle sees the 2 S d g (2 M C k) products
    # over the activation and 3T products per Newton iteration; the paper's formula has T g^3.
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
