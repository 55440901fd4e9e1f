"""The CUDA paths of gwdet's layers and of a GW model, where a GPU is present (skipped otherwise).

For GW (ItN and ZCA), BW (ZCA and ItN) and BGN, in training and evaluation mode: forward and
backward on CUDA against the same layer in float64 on the CPU, also at 1e20, where the layers
scale the statistics; under ``torch.autocast("cuda")`` with float16 and bfloat16 the output keeps
the input's dtype and is the float32 computation rounded once (so the statistics are float32);
a constant input stays finite. Then a training step of the demo's GW Faster R-CNN on CUDA, with
and without mixed precision, has finite losses and gradients. Execution plans
(gwdet.layers.plans): every plan forced on CUDA matches the float64 CPU result (the Triton kernels
running, not falling back), the GPU plans keep float32 statistics under autocast, and
``torch.compile(mode="reduce-overhead")`` captures a GW model in CUDA graphs (no host sync in the
``accelerator`` and ``triton`` plans); the kernels launch on their tensors' device, and the
products keep IEEE float32 under the user's TF32 setting. On a GPU the installed PyTorch has no
code for (a V100 under the CUDA 13 wheels) one test fails naming it and the others skip. No test
measures time.
"""
import copy

import pytest
import torch
from detectron2.modeling import build_model
from detectron2.structures import Boxes, Instances
from detectron2.utils.events import EventStorage

from gwdet.layers import GroupWhitening
from gwdet.model_zoo import build_config

from conftest import REPO
from layer_cases import CHANNELS, NAMES, RESULT_NAMES, assert_close_relative, forward_backward, inputs, make_layer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)")


def unsupported_gpus() -> list:
    """The messages of gwdet.layers.plans.gpu_support for the visible GPUs this PyTorch build has no
    code for (a V100 under the CUDA 13 wheels)."""
    from gwdet.layers.plans.gpu_support import unsupported_gpu_message

    messages = []
    for index in range(torch.cuda.device_count()):
        message = unsupported_gpu_message(torch.cuda.get_device_name(index), torch.cuda.get_device_capability(index),
                                          torch.cuda.get_arch_list())
        if message is not None:
            messages.append(f"cuda:{index}: {message}")
    return messages


@pytest.fixture(autouse=True)
def _runnable_gpu(request):
    """Every test but the one that names the problem skips on a GPU the installed PyTorch cannot
    run on (instead of failing inside a kernel with 'no kernel image is available')."""
    if request.node.name != "test_the_installed_pytorch_runs_on_this_gpu" and unsupported_gpus():
        pytest.skip("; ".join(unsupported_gpus()))


def test_the_installed_pytorch_runs_on_this_gpu():
    problems = unsupported_gpus()
    assert not problems, "\n".join(problems)
    # and the layers check it before their first launch: a supported GPU passes
    from gwdet.layers.plans.gpu_support import check_cuda_device

    check_cuda_device(torch.device(DEVICE))

DEVICE = "cuda"
GW_FASTER_RCNN = REPO / "configs" / "Demo" / "scratch_faster_rcnn_gw_shapes.yaml"
MODES = pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])


@pytest.mark.parametrize("scale", [1.0, 1e20])
@MODES
@pytest.mark.parametrize("name", NAMES)
def test_cuda_matches_cpu_float64(name, training, scale):
    layer = make_layer(name, training)
    reference = copy.deepcopy(layer).double()
    on_cuda = copy.deepcopy(layer).to(DEVICE)
    x, grad = inputs()
    x = x * scale
    got = forward_backward(on_cuda, x.to(DEVICE), grad.to(DEVICE))
    expected = forward_backward(reference, x.double(), grad.double())
    for what, a, b in zip(RESULT_NAMES, got, expected, strict=True):
        assert_close_relative(a, b, 1e-4, what)
    if scale == 1.0:  # (BGN's float32 running variance cannot hold the variance of 1e20-sized values)
        for (buffer_name, a), b in zip(on_cuda.named_buffers(), reference.buffers(), strict=True):
            assert a.dtype == torch.float32
            assert_close_relative(a.double().cpu(), b, 1e-4, buffer_name)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@MODES
@pytest.mark.parametrize("name", NAMES)
def test_autocast_keeps_the_input_dtype_and_float32_statistics(name, training, dtype):
    layer = make_layer(name, training).to(DEVICE)
    with torch.no_grad():  # the affine at its start: BW and BGN apply it in the input dtype
        layer.weight.fill_(1.0)
        layer.bias.zero_()
    in_float32 = copy.deepcopy(layer)  # the same running statistics, run without autocast
    x = inputs()[0].to(DEVICE, dtype).requires_grad_()
    with torch.autocast(DEVICE, dtype=dtype):
        out = layer(x)
    expected = in_float32(x.detach().float()).detach()
    assert out.dtype == dtype and torch.isfinite(out).all()
    # computed in float32 and rounded once to the input dtype: within half a unit in the last place
    # (plus float32 rounding, as the two runs may group the samples differently)
    error = (out.detach().float() - expected).abs()
    assert (error <= torch.finfo(dtype).eps / 2 * expected.abs() + 1e-5 * expected.abs().max()).all()
    out.float().square().sum().backward()
    assert x.grad.dtype == dtype and torch.isfinite(x.grad).all()
    assert layer.weight.grad.dtype == torch.float32 and torch.isfinite(layer.weight.grad).all()
    assert all(buffer.dtype == torch.float32 and torch.isfinite(buffer).all() for buffer in layer.buffers())


@MODES
@pytest.mark.parametrize("name", NAMES)
def test_constant_input_gives_no_nan(name, training):
    layer = make_layer(name, training).to(DEVICE)
    x = torch.full((2, CHANNELS, 5, 5), 3.0, device=DEVICE, requires_grad=True)
    out = layer(x)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()


def detection_batch(size: int, device: str) -> list:
    """Two images of the demo's size with two boxes each, as detectron2's mapper gives them."""
    generator = torch.Generator().manual_seed(0)
    batch = []
    for _ in range(2):
        instances = Instances((size, size))
        instances.gt_boxes = Boxes(torch.tensor([[4.0, 6.0, 40.0, 50.0], [30.0, 20.0, 90.0, 100.0]], device=device))
        instances.gt_classes = torch.tensor([0, 3], device=device)
        image = torch.rand(3, size, size, generator=generator) * 255
        batch.append({"image": image.to(device), "instances": instances})
    return batch


@pytest.mark.parametrize("amp", [False, True], ids=["float32", "mixed-precision"])
def test_gw_faster_rcnn_training_step_on_cuda(amp):
    cfg = build_config(str(GW_FASTER_RCNN), ["MODEL.DEVICE", DEVICE])
    torch.manual_seed(0)
    model = build_model(cfg).train()
    batch = detection_batch(cfg.DATASETS.SHAPES.IMAGE_SIZE, DEVICE)
    with EventStorage(0), torch.autocast(DEVICE, dtype=torch.float16, enabled=amp):
        losses = model(batch)
    total = sum(losses.values())
    assert torch.isfinite(total), losses
    total.backward()
    gradients = [p.grad for p in model.parameters() if p.grad is not None]
    assert gradients
    if not amp:  # float16 activation gradients may overflow (AMPTrainer's GradScaler skips such steps)
        assert all(torch.isfinite(g).all() for g in gradients)


# ---- execution plans on CUDA (gwdet.layers.plans) --------------------------------------------------

PLANS = ["cpu", "accelerator", "triton"]
PLANNED = ["GW", "GW_ZCA", "BW", "BW_ItN"]


@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("name", PLANNED)
def test_every_plan_matches_cpu_float64_on_cuda(name, plan, monkeypatch):
    from gwdet.layers.plans.triton_plan import fallback_reason

    monkeypatch.setenv("GWDET_GW_PLAN", plan)
    layer = make_layer(name, training=True)
    reference = copy.deepcopy(layer).double()
    on_cuda = copy.deepcopy(layer).to(DEVICE)
    x, grad = inputs(shape=(7, CHANNELS, 5, 5))  # an odd sample count
    got = forward_backward(on_cuda, x.to(DEVICE), grad.to(DEVICE))
    monkeypatch.setenv("GWDET_GW_PLAN", "cpu")
    expected = forward_backward(reference, x.double(), grad.double())
    for what, a, b in zip(RESULT_NAMES, got, expected, strict=True):
        assert_close_relative(a, b, 1e-4, what)
    assert fallback_reason() is None  # the Triton kernels ran (a failure would have fallen back)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("plan", ["accelerator", "triton"])
def test_gpu_plans_under_autocast_keep_float32_statistics(plan, dtype, monkeypatch):
    monkeypatch.setenv("GWDET_GW_PLAN", plan)
    layer = make_layer("GW", training=True).to(DEVICE)
    x = inputs(shape=(64, CHANNELS, 7, 7))[0].to(DEVICE, dtype).requires_grad_()
    with torch.autocast(DEVICE, dtype=dtype):
        out = layer(x)
    expected = copy.deepcopy(layer)(x.detach().float()).detach()
    assert out.dtype == dtype
    error = (out.detach().float() - expected).abs()
    assert (error <= torch.finfo(dtype).eps / 2 * expected.abs() + 1e-5 * expected.abs().max()).all()
    out.float().square().sum().backward()
    assert x.grad.dtype == dtype and torch.isfinite(x.grad).all()


class CapturedNet(torch.nn.Module):
    """Convolutions and GW layers: what torch.compile(mode="reduce-overhead") must capture."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, CHANNELS, 3, padding=1)
        self.gw1 = make_layer("GW", training=True)
        self.conv2 = torch.nn.Conv2d(CHANNELS, CHANNELS, 3, padding=1)
        self.gw2 = make_layer("GW", training=True, seed=1)

    def forward(self, x):
        return self.gw2(self.conv2(self.gw1(self.conv1(x)).relu_()))


@pytest.mark.parametrize("plan", ["accelerator", "triton"])
def test_reduce_overhead_compile_captures_gw_in_cuda_graphs(plan, monkeypatch):
    from torch._dynamo.utils import counters

    monkeypatch.setenv("GWDET_GW_PLAN", plan)
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    net = CapturedNet().to(DEVICE)
    eager = copy.deepcopy(net)
    compiled = torch.compile(net, mode="reduce-overhead")
    x = torch.randn(8, 3, 16, 16, device=DEVICE)
    for _ in range(3):  # warm-up, recording, replay
        out = compiled(x)
        out.square().mean().backward()
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])
    assert torch.allclose(out, eager(x), rtol=0, atol=1e-4)


def test_zca_with_64_groups_warns_once_about_the_looped_eigendecomposition():
    from gwdet.layers.whitening_matrix import _warned_eigh_sizes

    _warned_eigh_sizes.clear()
    wide = GroupWhitening(64, 64, method="zca").to(DEVICE)
    x = torch.randn(4, 64, 5, 5, device=DEVICE, requires_grad=True)
    with pytest.warns(RuntimeWarning, match="one matrix after another") as record:
        wide(x).sum().backward()
    assert len(record) == 1  # forward and backward: one warning per device and size


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
@pytest.mark.parametrize("plan", ["accelerator", "triton"])
def test_a_layer_on_the_second_gpu_runs_there_while_the_first_is_current(plan, monkeypatch):
    from gwdet.layers.plans.triton_plan import fallback_reason

    monkeypatch.setenv("GWDET_GW_PLAN", plan)
    layer = make_layer("GW", training=True)
    x, grad = inputs(shape=(7, CHANNELS, 5, 5))
    expected = forward_backward(copy.deepcopy(layer).double(), x.double(), grad.double())
    with torch.cuda.device(0):
        got = forward_backward(copy.deepcopy(layer).to("cuda:1"), x.to("cuda:1"), grad.to("cuda:1"))
        torch.cuda.synchronize(1)
    for what, a, b in zip(RESULT_NAMES, got, expected, strict=True):
        assert a.device == torch.device("cuda:1")
        assert_close_relative(a, b, 1e-4, what)
    assert fallback_reason() is None


@pytest.mark.parametrize("plan", ["accelerator", "triton"])
def test_the_user_tf32_setting_does_not_reach_the_layers_products(plan, monkeypatch):
    monkeypatch.setenv("GWDET_GW_PLAN", plan)
    layer = make_layer("GW", training=True)
    x, grad = inputs(shape=(64, CHANNELS, 7, 7))
    expected = forward_backward(copy.deepcopy(layer).double(), x.double(), grad.double())
    on_cuda = copy.deepcopy(layer).to(DEVICE)
    previous = torch.backends.cuda.matmul.fp32_precision
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    try:
        got = forward_backward(on_cuda, x.to(DEVICE), grad.to(DEVICE))
        assert torch.backends.cuda.matmul.fp32_precision == "tf32"
    finally:
        torch.backends.cuda.matmul.fp32_precision = previous
    for what, a, b in zip(RESULT_NAMES, got, expected, strict=True):
        assert_close_relative(a, b, 1e-4, what)
