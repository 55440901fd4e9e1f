"""Execution plans of the whitening layers (gwdet.layers.plans), on a CPU.

``GWDET_GW_PLAN`` forces a plan on any device, so every plan runs here: which plan is chosen and
when, that the ``accelerator`` plan computes what the ``cpu`` plan computes (float64 tightly,
float32 to 1e-4 of the largest value), that it dispatches at most :data:`LAUNCH_BUDGET` operations
per forward + backward at every shape of the benchmark, as many at 512 as at 2048 samples, with
no host synchronisation (the proxy for kernel launches and CUDA-graph capture on a GPU), half
precision inputs included; which products of few samples it splits over the columns, and that the
split computes the same; which passes over the activation a forward and a backward make (the
scaling of huge inputs folded into the centring and the small matrices); which errors make the
``triton`` plan fall back (once per kernel, tile and device) and which propagate; which GPUs the
installed PyTorch runs on and which plan a GPU gets by default; the warning for ZCA above 32
groups on CUDA. The Triton kernels themselves:
test_triton_kernels.py (interpreter) and test_triton_compile.py (ahead of time).
"""
import contextlib
import copy
import math
import re
import subprocess
import warnings

import pytest
import torch
from torch.utils import _pytree as pytree
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


def test_the_default_gpu_plan_follows_the_gpu_generation():
    from gwdet.layers.plans import default_gpu_plan

    assert default_gpu_plan((9, 0), True) == default_gpu_plan((8, 0), True) == "triton"  # TF32 tensor cores
    assert default_gpu_plan((7, 5), True) == default_gpu_plan((7, 0), True) == "accelerator"  # FMA kernels
    assert default_gpu_plan((9, 0), False) == "accelerator"  # no Triton


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


# ---- products of few samples split over the columns (accelerator plan) --------------------------


@pytest.mark.parametrize("units,expected", [
    (132, {(2, 64, 200, 200): 64, (2, 256, 64, 64): 64, (2, 1024, 32, 32): 64, (2, 256, 100, 152): 64}),
    (80, {(2, 64, 200, 200): 40, (2, 256, 64, 64): 32, (2, 1024, 32, 32): 32, (2, 256, 100, 152): 40}),
], ids=["H100", "V100"])
def test_which_benchmark_shapes_split_their_products(units, expected):
    # the 2-image backbone and FPN shapes: 2 x 64 x 64 outputs over 16k-40k columns occupy 2
    # multiprocessors unsplit, so the columns are cut into S slices (stacked products, about 2
    # tiles per multiprocessor); the box head, the mask head and the 2-D shape have tiles enough
    splits = {}
    for _, shape in LAYER_SHAPES + [(None, (2048, 256, 7, 7))]:
        groups = min(64, shape[1])
        columns = math.prod(shape[1:]) // groups
        splits[shape] = accelerator.split_columns(shape[0], groups, columns, units)
    assert {shape: chunks for shape, chunks in splits.items() if chunks > 1} == expected
    for shape, chunks in expected.items():
        assert (math.prod(shape[1:]) // 64) % chunks == 0


class RecordProducts(TorchDispatchMode):
    """The batch sizes of the batched products, also inside gwdet's custom ops."""

    def __init__(self) -> None:
        super().__init__()
        self.batches = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.bmm, torch.ops.aten.baddbmm):
            self.batches.append(args[0].shape[0] if func.overloadpacket is torch.ops.aten.bmm else args[1].shape[0])
        if func.namespace != "gwdet":
            return func(*args, **(kwargs or {}))
        with self:
            return func.redispatch(torch._C.DispatchKeySet(torch._C.DispatchKey.CPU), *args, **(kwargs or {}))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("shape,groups,chunks", [((2, 16, 32, 32), 4, 16), ((2, 8, 32, 32), 8, 4)],
                         ids=["channels per group", "one channel per group"])
def test_split_products_compute_what_the_cpu_plan_computes(shape, groups, chunks, dtype, monkeypatch):
    assert accelerator.split_columns(shape[0], groups, math.prod(shape[1:]) // groups, 132) == chunks
    torch.manual_seed(0)
    layer = GroupWhitening(shape[1], groups, eps=1e-3).to(dtype)
    with torch.no_grad():
        layer.weight.uniform_(0.5, 1.5)
        layer.bias.uniform_(-1.0, 1.0)
    x, grad = random_case(shape, dtype)
    expected = under_plan(monkeypatch, "cpu", layer, x, grad)
    with RecordProducts() as mode:
        got = under_plan(monkeypatch, "accelerator", layer, x, grad)
    assert chunks in mode.batches  # the covariance and dW X^T products ran as one product of the slices
    assert_agree(got, expected, dtype)


class RecordActivationPasses(TorchDispatchMode):
    """The operations that read or write a tensor of at least ``size`` values (not views, not
    allocations), also inside gwdet's custom ops: the passes over the activation."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size
        self.passes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "gwdet":
            with self:
                return func.redispatch(torch._C.DispatchKeySet(torch._C.DispatchKey.CPU), *args, **(kwargs or {}))
        out = func(*args, **(kwargs or {}))
        tensors = [leaf for leaf in pytree.tree_leaves((args, kwargs, out)) if isinstance(leaf, torch.Tensor)]
        if not func.is_view and not func.__name__.startswith("empty") and any(t.numel() >= self.size for t in tensors):
            self.passes.append(func.__name__.split(".")[0])
        return out


def test_the_scaling_of_huge_inputs_adds_no_pass_over_the_activation(monkeypatch):
    """Under ``accelerator`` every sample is scaled by its ``1/s`` (no look on the host), yet the
    passes are those of unscaled whitening plus one reduction for ``max |x|``: the centring reads
    the input once (means from float64 sums), the backward's factors go into the g x g matrices.
    The values stay those of the ``cpu`` plan, which scales only a batch with a huge sample."""
    shape = (8, 64, 14, 14)
    torch.manual_seed(0)
    layer = GroupWhitening(64, 16, eps=1e-3)
    x, grad = random_case(shape, torch.float32)
    x[1] *= 1e20
    expected = under_plan(monkeypatch, "cpu", layer, x, grad)
    monkeypatch.setenv(PLAN_VARIABLE, "accelerator")
    x = x.clone().requires_grad_()
    layer.zero_grad()
    with RecordActivationPasses(2 * x[0].numel()) as forward:
        out = layer(x)
    with RecordActivationPasses(2 * x[0].numel()) as backward:
        out.backward(grad)
    # max |x|, means, centring, covariance (split: products, sum), whitening, affine
    assert forward.passes == ["linalg_vector_norm", "mean", "addcmul", "bmm", "sum", "bmm", "addcmul"]
    # scaled input, bias and weight sums, dY = gamma dZ, dY X^T (split), input gradient (two
    # products), the affine's weight gradient (W X, times dZ, summed)
    assert backward.passes == ["mul", "sum", "mul", "bmm", "sum", "baddbmm", "baddbmm_", "bmm", "mul_", "sum"]
    assert_agree([out.detach(), x.grad, layer.weight.grad, layer.bias.grad], expected, torch.float32)


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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("shape", [shape for _, shape in LAYER_SHAPES], ids=str)
def test_accelerator_launch_budget_with_half_precision_inputs(shape, dtype, monkeypatch):
    # what GW gets under mixed precision: the casts to float32 and back are launches too
    monkeypatch.setenv(PLAN_VARIABLE, "accelerator")
    torch.manual_seed(0)
    layer = LAYERS["GW"](shape[1])
    samples = (min(shape[0], 64), *shape[1:])  # launches do not depend on the sample count
    x, grad = torch.randn(samples, dtype=dtype, requires_grad=True), torch.randn(samples, dtype=dtype)
    counted = count_operations(lambda: layer(x).backward(grad))
    assert counted.total <= LAUNCH_BUDGET, counted.operations.most_common(10)
    assert counted.host_syncs == 0


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


def triton_errors():
    """Real instances of the errors Triton raises when it cannot build or load a kernel."""
    import ast

    from triton.compiler.errors import CompilationError
    from triton.runtime.errors import OutOfResources, PTXASError

    node = ast.parse("x = tl.dot(a, b)").body[0]
    return [
        CompilationError("x = tl.dot(a, b)", node, "unsupported layout"),
        OutOfResources(232448, 101376, "shared memory"),
        PTXASError("`ptxas` failed with error code 255"),
    ]


FALLS_BACK = [
    triton_plan.KernelUnavailable("Triton kernels run on CUDA tensors"),
    ImportError("No module named 'triton'"),
    subprocess.CalledProcessError(1, ["gcc", "main.c"]),
    RuntimeError("Failed to find C compiler. Please specify via CC environment variable or set triton.knobs.build.impl."),
    RuntimeError("Triton Error [CUDA]: no kernel image is available for execution on the device"),
    RuntimeError("Triton Error [CUDA]: the provided PTX was compiled with an unsupported toolchain."),
    RuntimeError("Triton Error [CUDA]: too many resources requested for launch"),
]
PROPAGATES = [
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    RuntimeError("Triton Error [CUDA]: an illegal memory access was encountered"),
    RuntimeError("Triton Error [CUDA]: out of memory"),
    RuntimeError("CUDA error: device-side assert triggered"),
    ValueError("pointer argument cannot be accessed from Triton (cpu tensor?)"),
    TypeError("kernel() got an unexpected keyword argument 'BLOCK_SIZE'"),
]


def test_only_a_kernel_that_cannot_be_built_or_loaded_falls_back():
    pytest.importorskip("triton", reason="Triton's own error classes")
    for error in FALLS_BACK + triton_errors():
        assert triton_plan.falls_back(error), error
    for error in PROPAGATES:
        assert not triton_plan.falls_back(error), error


def failing(error, calls):
    def launch(*args):
        calls.append(args)
        raise error

    return launch


def test_a_kernel_failure_falls_back_once_per_kernel_tile_and_device_with_a_warning(monkeypatch):
    calls, backward_calls = [], []
    monkeypatch.setattr(triton_plan, "_failures", {})
    no_image = RuntimeError("Triton Error [CUDA]: no kernel image is available for execution on the device")
    monkeypatch.setattr(triton_plan, "_launch_whitening", failing(no_image, calls))
    monkeypatch.setattr(triton_plan, "_launch_whitening_vjp", failing(no_image, backward_calls))
    torch.manual_seed(0)
    layer = GroupWhitening(16, 4)
    x, grad = random_case((4, 16, 3, 3), torch.float32)
    expected = under_plan(monkeypatch, "accelerator", layer, x, grad)
    with pytest.warns(RuntimeWarning) as record:
        got = under_plan(monkeypatch, "triton", layer, x, grad)
    assert [str(warning.message).split(" (RuntimeError")[0] for warning in record] == [
        f"gwdet: the Triton kernel {kernel} (tile 16) cannot run on cpu"
        for kernel in ("itn_whitening_kernel", "itn_whitening_vjp_kernel")
    ]
    assert len(calls) == len(backward_calls) == 1 and torch.equal(got[0], expected[0])
    assert_agree(got, expected, torch.float32)
    assert "itn_whitening_vjp_kernel (tile 16) on cpu: RuntimeError: Triton Error [CUDA]: no kernel image" in describe_plans()
    with warnings.catch_warnings():  # no second warning, no second try for that kernel and tile
        warnings.simplefilter("error")
        under_plan(monkeypatch, "triton", layer, x, grad)
    assert len(calls) == len(backward_calls) == 1
    # another tile size is another kernel: it is still tried
    with pytest.warns(RuntimeWarning, match="tile 64"):
        under_plan(monkeypatch, "triton", GroupWhitening(64, 64), *random_case((2, 64, 9, 9), torch.float32))
    assert len(calls) == len(backward_calls) == 2


@pytest.mark.parametrize("error", PROPAGATES[:2], ids=["out of memory", "illegal address"])
def test_out_of_memory_and_other_errors_propagate_and_are_not_remembered(error, monkeypatch):
    monkeypatch.setattr(triton_plan, "_failures", {})
    monkeypatch.setattr(triton_plan, "_launch_whitening", failing(error, []))
    monkeypatch.setenv(PLAN_VARIABLE, "triton")
    with pytest.raises(type(error), match=re.escape(str(error))):
        GroupWhitening(16, 4)(torch.randn(2, 16, 3, 3))
    assert triton_plan.fallback_reason() is None


def test_kernels_on_cpu_tensors_without_the_interpreter_fall_back(monkeypatch):
    monkeypatch.setattr(triton_plan, "_failures", {})
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv(PLAN_VARIABLE, "triton")
    with pytest.warns(RuntimeWarning, match="KernelUnavailable: Triton kernels run on CUDA tensors"):
        GroupWhitening(16, 4)(torch.randn(2, 16, 3, 3))
    assert triton_plan.on_device(torch.zeros(1)).__class__ is contextlib.nullcontext


# ---- GPUs the installed PyTorch cannot run on ----------------------------------------------------

CU130_ARCHES = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]  # torch 2.14.1+cu130


@pytest.mark.parametrize("capability,arch_list,runs", [
    ((7, 0), CU130_ARCHES, False),  # V100
    ((6, 1), CU130_ARCHES, False),  # P40 / GTX 1080
    ((7, 5), CU130_ARCHES, True),  # T4
    ((8, 9), CU130_ARCHES, True),  # L4: sm_86 machine code runs on 8.9
    ((9, 0), CU130_ARCHES, True),  # H100
    ((10, 3), CU130_ARCHES, True),  # sm_100 machine code on a 10.3 GPU
    ((12, 1), ["sm_75", "sm_80", "sm_90"], False),  # machine code never crosses a major version
    ((12, 1), ["sm_80", "compute_90"], True),  # PTX is compiled by the driver for newer GPUs
    ((9, 0), ["sm_90a"], True),  # arch-specific code: exactly that GPU
    ((10, 0), ["sm_90a"], False),
    ((7, 0), ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"], True),  # a cu126 wheel
    ((7, 0), [], True),  # nothing listed: not judged
])
def test_which_gpus_the_installed_pytorch_runs_on(capability, arch_list, runs):
    from gwdet.layers.plans.gpu_support import unsupported_gpu_message

    message = unsupported_gpu_message("Tesla V100-SXM2-16GB", capability, arch_list)
    assert (message is None) == runs
    if not runs:
        sm = f"sm_{capability[0]}{capability[1]}"
        assert f"Tesla V100-SXM2-16GB (compute capability {capability[0]}.{capability[1]}, {sm})" in message
        assert f"GPU code for {', '.join(arch_list)} only" in message
        assert "cu126" in message and "docs/install.md" in message


# ---- ZCA with more than 32 groups on CUDA ------------------------------------------------------------


def test_zca_on_cuda_above_32_groups_is_named_as_looped_and_itn_recommended():
    from gwdet.layers.whitening_matrix import looped_eigh_warning

    message = looped_eigh_warning(torch.device("cuda", 0), 64)
    assert "64 x 64 matrices on CUDA" in message and "one matrix after another" in message
    assert "norm 'GW', method='itn'" in message
    assert looped_eigh_warning(torch.device("cuda", 0), 32) is None  # batched up to 32 x 32
    assert looped_eigh_warning(torch.device("cpu"), 64) is None
