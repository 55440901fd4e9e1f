"""torch.compile and torch.export of gwdet's layers and of a GW model's training step, compared with
eager mode: outputs, gradients and running statistics."""
import copy

import pytest
import torch
from detectron2.structures import BitMasks, Boxes, Instances
from detectron2.utils.events import EventStorage

from gwdet.layers import BatchGroupNorm, BatchWhitening, GroupWhitening
from tiny_models import build_tiny_model

GW_OP = torch.ops.gwdet.group_whitening.default
GW_BACKWARD_OP = torch.ops.gwdet.group_whitening_backward.default


def run(module, x, grad):
    """Output, input gradient and parameter gradients of one forward + backward."""
    x = x.clone().requires_grad_()
    out = module(x)
    out.backward(grad)
    return [out.detach(), x.grad] + [p.grad.clone() for p in module.parameters()]


def assert_all_close(got, expected, atol):
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert torch.allclose(a, b, rtol=0, atol=atol), (a - b).abs().max()


@pytest.mark.parametrize("method", ["itn", "zca"])
def test_group_whitening_compiles_as_one_graph_with_inductor(method):
    torch.manual_seed(0)
    layer = GroupWhitening(16, 4, method=method)
    with torch.no_grad():
        layer.weight.uniform_(0.5, 1.5)
        layer.bias.uniform_(-1.0, 1.0)
    eager = copy.deepcopy(layer)
    compiled = torch.compile(layer, fullgraph=True, backend="inductor")
    for shape in [(4, 16, 5, 5), (3, 16, 7, 2)]:  # a second shape: recompiled or dynamic
        x, grad = torch.randn(shape), torch.randn(shape)
        layer.zero_grad()
        eager.zero_grad()
        assert_all_close(run(compiled, x, grad), run(eager, x, grad), atol=1e-6)


def captured_graphs():
    """A torch.compile backend (aot_eager) that keeps the FX graphs Dynamo hands it."""
    graphs = []
    aot_eager = torch._dynamo.lookup_backend("aot_eager")

    def backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return aot_eager(graph_module, example_inputs)

    return graphs, backend


@pytest.mark.parametrize(
    "make",
    [lambda: BatchWhitening(16, 4, method="zca"), lambda: BatchWhitening(16, 4, method="itn"), lambda: BatchGroupNorm(16, 4)],
    ids=["BW", "BW_ItN", "BGN"],
)
def test_batch_layers_compile_in_training_with_their_running_statistics(make):
    torch.manual_seed(0)
    layer = make().train()
    eager = copy.deepcopy(layer)
    graphs, backend = captured_graphs()
    compiled = torch.compile(layer, fullgraph=True, backend=backend)
    x, grad = torch.randn(4, 16, 5, 5), torch.randn(4, 16, 5, 5)
    assert_all_close(run(compiled, x, grad), run(eager, x, grad), atol=1e-5)
    for name, buffer in eager.named_buffers():
        assert torch.allclose(layer.get_buffer(name), buffer, rtol=0, atol=1e-6), name
    assert len(graphs) == 1


def training_batch():
    generator = torch.Generator().manual_seed(1)
    batch = []
    for _ in range(2):
        instances = Instances((64, 64))
        instances.gt_boxes = Boxes(torch.tensor([[8.0, 8.0, 40.0, 40.0], [20.0, 24.0, 60.0, 56.0]]))
        instances.gt_classes = torch.tensor([0, 2])
        masks = torch.zeros(2, 64, 64, dtype=torch.bool)
        masks[0, 8:40, 8:40] = True
        masks[1, 24:56, 20:60] = True
        instances.gt_masks = BitMasks(masks)
        batch.append({"image": torch.rand(3, 64, 64, generator=generator) * 255, "instances": instances})
    return batch


def training_step(model, batch):
    """Losses and parameter gradients of one step (the sampling of proposals seeded)."""
    model.zero_grad()
    torch.manual_seed(0)
    with EventStorage():
        losses = model(batch)
    sum(losses.values()).backward()
    return losses, {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def test_batch_whitening_of_few_samples_compiles_as_one_graph_and_warns_in_eager():
    # the few-samples warning (m <= k) ended torch.compile(fullgraph=True) with Dynamo's Unsupported on warnings.warn
    layer = BatchWhitening(16, group_size=16).train()
    compiled = torch.compile(copy.deepcopy(layer), backend="aot_eager", fullgraph=True)
    x = torch.randn(8, 16)
    torch.testing.assert_close(compiled(x), layer(x), rtol=1e-5, atol=1e-5)
    with pytest.warns(RuntimeWarning, match="8 samples .* per group of 16 channels"):
        layer(x)


def test_demo_model_training_step_with_a_compiled_backbone_matches_eager():
    model = build_tiny_model("demo", training=True)
    eager = copy.deepcopy(model)
    graphs, backend = captured_graphs()
    model.backbone = torch.compile(model.backbone, backend=backend)
    batch = training_batch()
    losses, grads = training_step(model, batch)
    expected_losses, expected_grads = training_step(eager, batch)
    for name, value in expected_losses.items():
        assert torch.allclose(losses[name], value, rtol=0, atol=1e-5), name
    names = {name.replace("._orig_mod", "") for name in grads}
    assert names == set(expected_grads) and len(names) > 100
    for name, grad in grads.items():
        assert torch.allclose(grad, expected_grads[name.replace("._orig_mod", "")], rtol=0, atol=1e-5), name
    # the whole backbone (ResNet + FPN, 25 GW layers) in one graph, GW as the opaque op
    assert len(graphs) == 1
    assert sum(node.target is GW_OP for node in graphs[0].graph.nodes) == 17 + 8


class SmallNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.gw = GroupWhitening(16, 4)
        self.bw = BatchWhitening(16, 4, method="itn")
        self.bgn = BatchGroupNorm(16, 4)

    def forward(self, x):
        return self.bgn(self.bw(self.gw(self.conv(x)))).square().mean()


def test_torch_export_in_training_mode_keeps_the_backward(tmp_path):
    torch.manual_seed(0)
    net = SmallNet().train()
    eager = copy.deepcopy(net)
    x = torch.randn(4, 3, 6, 6)
    program = torch.export.export(net, (x,))
    assert sum(node.target is GW_OP for node in program.graph.nodes) == 1
    torch.export.save(program, str(tmp_path / "net.pt2"))
    exported = torch.export.load(str(tmp_path / "net.pt2")).module()
    loss = exported(x)
    loss.backward()
    expected = eager(x)
    expected.backward()
    assert torch.allclose(loss, expected, rtol=0, atol=1e-6)
    parameters = dict(exported.named_parameters())
    for name, parameter in eager.named_parameters():
        assert torch.allclose(parameters[name].grad, parameter.grad, rtol=0, atol=1e-6), name
    buffers = dict(exported.named_buffers())
    for name, buffer in eager.named_buffers():
        assert torch.allclose(buffers[name], buffer, rtol=0, atol=1e-6), name


def test_torch_export_joint_forward_backward_graph_holds_both_ops():
    experimental = pytest.importorskip("torch.export.experimental")
    if not hasattr(experimental, "_export_forward_backward"):
        pytest.skip("this PyTorch has no torch.export.experimental._export_forward_backward")
    torch.manual_seed(0)
    joint = experimental._export_forward_backward(torch.export.export(SmallNet().train(), (torch.randn(4, 3, 6, 6),)))
    targets = [node.target for node in joint.graph.nodes]
    assert targets.count(GW_OP) == 1 and targets.count(GW_BACKWARD_OP) == 1


# the covariance kept for the backward (values per sample >= 3 g^2), and the few-columns path
# (m = C HW / g < g), where the forward op returns an empty covariance
@pytest.mark.parametrize("shape,groups,affine", [((3, 8, 4, 5), 4, True), ((5, 12), 4, False)])
def test_group_whitening_op_registration_passes_opcheck(shape, groups, affine):
    # schema, fake (shape) kernel, autograd registration and AOT dispatch, as torch.library checks
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=generator, requires_grad=True)
    weight = torch.rand(shape[1], generator=generator, requires_grad=True) if affine else None
    bias = torch.randn(shape[1], generator=generator, requires_grad=True) if affine else None
    torch.library.opcheck(GW_OP, (x, weight, bias, groups, 5, 1e-5, "itn"))
