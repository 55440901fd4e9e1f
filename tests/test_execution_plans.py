"""Execution plans of the whitening layers (gwdet.layers.plans), on a CPU.

``GWDET_GW_PLAN`` forces a plan on any device, so every plan runs here: which plan is chosen and
when, that the ``accelerator`` plan computes what the ``cpu`` plan computes (float64 tightly,
float32 to 1e-4 of the largest value), that it dispatches at most :data:`LAUNCH_BUDGET` operations
per forward + backward at every shape of the benchmark, as many at 512 as at 2048 samples, with
no host synchronisation (the proxy for kernel launches and CUDA-graph capture on a GPU), and that
the ``triton`` plan falls back to ``accelerator`` once when a kernel fails. The Triton kernels
themselves: test_triton_kernels.py (interpreter) and test_triton_compile.py (ahead of time).
"""
import copy
import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import gwdet.layers.plans.accelerator as accelerator
import gwdet.layers.plans.triton_plan as triton_plan
from gwdet.layers import BatchWhitening, GroupWhitening
from gwdet.layers.plans import PLAN_VARIABLE, describe_plans, plan_name, triton_version
from gwdet_lab.benchmark.cases import LAYER_SHAPES
from gwdet_lab.benchmark.op_counts import count_operations

LAUNCH_BUDGET = 150
# (shape, groups): several channels per group, one channel per group (affine folded into the
# g x g matrices), fewer columns than groups (the m x m Gram path), a single group
CASES = [((5, 16, 3, 3), 4), ((3, 8, 4, 5), 8), ((7, 24), 8), ((4, 6, 3, 3), 1)]


def random_case(shape, dtype, seed=0, scale=1.0):
    generator = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=generator, dtype=torch.float64) * 2.0 + 1.0) * scale
    grad = torch.randn(shape, generator=generator, dtype=torch.float64)
    return x.to(dtype), grad.to(dtype)


def forward_backward(layer, x, grad):
    """Output, input gradient and parameter gradients of one forward + backward."""
    x = x.clone().requires_grad_()
    layer.zero_grad()
    out = layer(x)
    out.backward(grad)
    return [out.detach(), x.grad] + [p.grad.clone() for p in layer.parameters()]


def under_plan(monkeypatch, plan, layer, x, grad):
    monkeypatch.setenv(PLAN_VARIABLE, plan)
    return forward_backward(layer, x, grad)


def assert_agree(got, expected, dtype):
    for a, b in zip(got, expected, strict=True):
        assert torch.isfinite(a).all()
        if dtype == torch.float64:
            assert torch.allclose(a, b, rtol=0, atol=1e-10 * b.abs().max())
        else:
            assert (a - b).abs().max() <= 1e-4 * b.abs().max()


# ---- choosing a plan --------------------------------------------------------------------------


def test_the_default_plan_follows_the_device(monkeypatch):
    monkeypatch.delenv(PLAN_VARIABLE, raising=False)
    assert plan_name(torch.device("cpu")) == "cpu"
    assert plan_name(torch.device("cuda")) == ("triton" if triton_version() else "accelerator")
    assert plan_name(torch.device("meta")) == "accelerator"
    assert describe_plans().startswith("GW/BW execution plan: cpu for CPU tensors")


def test_collect_env_reports_the_plans(monkeypatch):
    from gwdet.collect_env import collect_env_info

    monkeypatch.setenv(PLAN_VARIABLE, "accelerator")
    line = collect_env_info()["gwdet"]["execution plan"]
    assert line == describe_plans() and "accelerator for CPU tensors, accelerator for CUDA tensors" in line


def test_the_variable_is_read_at_every_call(monkeypatch):
    layer, (x, grad) = GroupWhitening(16, 4), random_case((4, 16, 3, 3), torch.float32)
    monkeypatch.setenv(PLAN_VARIABLE, "cpu")
    assert count_operations(lambda: forward_backward(layer, x, grad)).host_syncs > 0  # the host shortcuts
    monkeypatch.setenv(PLAN_VARIABLE, "accelerator")
    assert plan_name(torch.device("cpu")) == "accelerator"
    assert count_operations(lambda: forward_backward(layer, x, grad)).host_syncs == 0
    assert "forced by GWDET_GW_PLAN" in describe_plans()


def test_an_unknown_plan_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(PLAN_VARIABLE, "gpu")
    message = "GWDET_GW_PLAN='gpu' is not an execution plan; choose one of cpu, accelerator, triton"
    with pytest.raises(ValueError, match=message):
        GroupWhitening(16, 4)(torch.randn(2, 16, 3, 3))


# ---- the accelerator plan computes what the cpu plan computes ----------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("method", ["itn", "zca"])
@pytest.mark.parametrize("shape,groups", CASES)
def test_group_whitening_accelerator_matches_cpu(shape, groups, method, dtype, monkeypatch):
    torch.manual_seed(0)
    layer = GroupWhitening(shape[1], groups, method=method, eps=1e-3).to(dtype)
    with torch.no_grad():
        layer.weight.uniform_(0.5, 1.5)
        layer.bias.uniform_(-1.0, 1.0)
    x, grad = random_case(shape, dtype)
    x[1] = 3.0  # a constant sample: every group constant
    x[-1] *= 1e20 if dtype == torch.float32 else 1e200  # a huge sample: scaled statistics
    expected = under_plan(monkeypatch, "cpu", layer, x, grad)
    assert_agree(under_plan(monkeypatch, "accelerator", layer, x, grad), expected, dtype)
    # chunks of one sample, as a batch beyond the absolute memory budget is cut
    monkeypatch.setattr(accelerator, "TEMPORARY_BYTES", 1)
    assert_agree(under_plan(monkeypatch, "accelerator", layer, x, grad), expected, dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("method", ["itn", "zca"])
def test_batch_whitening_accelerator_matches_cpu(method, dtype, monkeypatch):
    layer = BatchWhitening(24, 8, method=method).to(dtype)
    x, grad = random_case((6, 24, 3, 3), dtype, seed=1)
    on_cpu_plan = copy.deepcopy(layer)
    expected = under_plan(monkeypatch, "cpu", on_cpu_plan, x, grad)
    assert_agree(under_plan(monkeypatch, "accelerator", layer, x, grad), expected, dtype)
    for got, want in zip(layer.buffers(), on_cpu_plan.buffers(), strict=True):
        assert torch.allclose(got, want, rtol=0, atol=1e-6 if dtype == torch.float32 else 1e-12)


def test_the_closed_form_whitening_op_of_batch_whitening_passes_opcheck():
    generator = torch.Generator().manual_seed(0)
    data = torch.randn(3, 5, 12, generator=generator)
    cov = (data @ data.transpose(1, 2) / 12 + 1e-3 * torch.eye(5)).requires_grad_()
    torch.library.opcheck(torch.ops.gwdet.itn_whitening.default, (cov, 5))


def test_batch_whitening_compiles_as_one_graph_under_the_accelerator_plan(monkeypatch):
    monkeypatch.setenv(PLAN_VARIABLE, "accelerator")
    graphs = []

    def backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return torch._dynamo.lookup_backend("aot_eager")(graph_module, example_inputs)

    torch._dynamo.reset()
    layer = BatchWhitening(16, 8, method="itn")
    x, grad = random_case((4, 16, 3, 3), torch.float32)
    expected = forward_backward(copy.deepcopy(layer), x, grad)
    compiled = torch.compile(layer, fullgraph=True, backend=backend)
    assert_agree(forward_backward(compiled, x, grad), expected, torch.float32)
    assert len(graphs) == 1
    assert any(node.target is torch.ops.gwdet.itn_whitening.default for node in graphs[0].graph.nodes)


# ---- launches and host synchronisations ---------------------------------------------------------

LAYERS = {
    "GW": lambda channels: GroupWhitening(channels, 64),
    "GW_ZCA": lambda channels: GroupWhitening(channels, 64, method="zca"),
    "BW": lambda channels: BatchWhitening(channels, 16),
    "BW_ItN": lambda channels: BatchWhitening(channels, 16, method="itn"),
}
# host synchronisations that PyTorch's torch.linalg.eigh makes (it checks its result on the host),
# per forward + backward: ZCA whitens by an eigendecomposition in each pass of GW, in BW's forward
EIGH_SYNCS = {"GW": 0, "GW_ZCA": 2, "BW": 1, "BW_ItN": 0}


def accelerator_count(name, shape, monkeypatch):
    monkeypatch.setenv(PLAN_VARIABLE, "accelerator")
    torch.manual_seed(0)
    layer = LAYERS[name](shape[1])
    x, grad = torch.randn(shape, requires_grad=True), torch.randn(shape)
    return count_operations(lambda: layer(x).backward(grad))


@pytest.mark.parametrize("name", sorted(LAYERS))
@pytest.mark.parametrize("shape", [shape for _, shape in LAYER_SHAPES], ids=str)
def test_accelerator_launch_budget_at_the_benchmark_shapes(name, shape, monkeypatch):
    counted = accelerator_count(name, shape, monkeypatch)
    assert counted.total <= LAUNCH_BUDGET, counted.operations.most_common(10)
    assert counted.host_syncs == EIGH_SYNCS[name]


@pytest.mark.parametrize("name", ["GW", "BW_ItN"])
def test_accelerator_launches_do_not_grow_with_the_samples(name, monkeypatch):
    # the box head with 512 and with 2048 proposals: one pass over the whole batch either way
    small = accelerator_count(name, (512, 256, 7, 7), monkeypatch)
    large = accelerator_count(name, (2048, 256, 7, 7), monkeypatch)
    assert small.operations == large.operations and small.total <= LAUNCH_BUDGET


class RefuseHostSync(TorchDispatchMode):
    """Fails on any operation that reads a tensor's value on the host (a device synchronisation on
    a GPU; a CUDA graph cannot capture it), also inside gwdet's custom ops: their kernels run with
    the mode active, so the operations they call come here too."""

    SYNCS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default, torch.ops.aten.is_nonzero.default}

    def __init__(self) -> None:
        super().__init__()
        self.seen = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.add(str(func))
        if func in self.SYNCS:
            raise AssertionError(f"host synchronisation: {func}")
        if func.namespace != "gwdet":
            return func(*args, **(kwargs or {}))
        below_this_mode = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)  # the kernel itself
        with self:
            return func.redispatch(below_this_mode, *args, **(kwargs or {}))


class SmallNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.gw = GroupWhitening(16, 4)
        self.bw = BatchWhitening(16, 8, method="itn")

    def forward(self, x):
        return self.bw(self.gw(self.conv(x)).relu_()).square().mean()


def test_accelerator_plan_never_synchronises_with_the_host(monkeypatch):
    net, x = SmallNet(), torch.randn(3, 3, 6, 6)
    x[0] *= 1e20  # the scaled path too
    monkeypatch.setenv(PLAN_VARIABLE, "accelerator")
    with RefuseHostSync() as mode:
        net(x).backward()
    assert all(torch.isfinite(p.grad).all() for p in net.parameters())
    assert "aten.bmm.default" in mode.seen  # the operations inside the custom ops were checked
    monkeypatch.setenv(PLAN_VARIABLE, "cpu")  # the mode does catch the cpu plan's shortcuts
    with pytest.raises(AssertionError, match="host synchronisation"), RefuseHostSync():
        net(x).backward()


# ---- the triton plan's fallback -----------------------------------------------------------------


def test_a_failing_triton_kernel_falls_back_to_accelerator_once(monkeypatch):
    calls = []

    def failing_launch(*args):
        calls.append(args)
        raise RuntimeError("no kernel image is available for execution on the device")

    monkeypatch.setattr(triton_plan, "_failure", None)
    monkeypatch.setattr(triton_plan, "_launch_whitening", failing_launch)
    torch.manual_seed(0)
    layer = GroupWhitening(16, 4)
    x, grad = random_case((4, 16, 3, 3), torch.float32)
    expected = under_plan(monkeypatch, "accelerator", layer, x, grad)
    with pytest.warns(RuntimeWarning, match="no kernel image is available.*runs the 'accelerator' plan"):
        got = under_plan(monkeypatch, "triton", layer, x, grad)
    assert len(calls) == 1 and torch.equal(got[0], expected[0])
    assert_agree(got, expected, torch.float32)
    assert "no kernel image" in describe_plans()
    with warnings.catch_warnings():  # no second warning, no second try
        warnings.simplefilter("error")
        under_plan(monkeypatch, "triton", layer, x, grad)
    assert len(calls) == 1

