"""The ``triton`` plan's kernels as ``torch.library`` Triton ops, checked without a GPU.

The launches are the ops ``gwdet::triton_itn_whitening`` and ``gwdet::triton_itn_whitening_vjp``
(:mod:`gwdet.layers.plans.triton_kernels`), whose bodies call the kernels through
``torch.library.wrap_triton``. Here: the ops are registered with their kernels; on fake tensors
(CPU and CUDA) they give the outputs' shapes and dtypes without launching; the plan's launch
functions reach the kernels through ``wrap_triton`` with the launch configuration the plan
chooses; ``torch.compile`` traces an op into a ``triton_kernel_wrapper_functional`` node naming the
kernel; ``torch.export`` keeps the op whole; and a layer under the ``triton`` plan dispatches the ops
in Triton's interpreter (a subprocess: ``TRITON_INTERPRET=1`` must be set before Triton is
imported).

What needs a GPU (and is not checked here): a real launch through the op on CUDA tensors, the
kernel-mutation analysis ``torch.compile`` runs on the traced node (it generates the kernel's TTIR
for the current GPU; without a driver PyTorch assumes every tensor argument is mutated), and
Inductor compiling and launching the traced kernel. ``torch.library.opcheck`` needs real launches
and fake tracing in one process: on a CPU Triton's interpreter gives the first and cannot run on
fake tensors, so it needs a GPU too.
"""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton", reason="the triton plan needs Triton (pip install triton)")

import torch  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from conftest import REPO  # noqa: E402
from gwdet.layers.plans import triton_kernels, triton_plan  # noqa: E402

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"
needs_compiled_kernels = pytest.mark.skipif(
    INTERPRETED, reason="with TRITON_INTERPRET=1 the kernels are interpreted functions, which wrap_triton passes through")


def covariances(count=3, size=20, device="cpu"):
    return torch.randn(count, size, size, device=device)


def test_the_kernels_are_registered_as_triton_ops():
    whitening = torch.ops.gwdet.triton_itn_whitening.default
    vjp = torch.ops.gwdet.triton_itn_whitening_vjp.default
    assert str(whitening._schema) == (
        "gwdet::triton_itn_whitening(Tensor cov, Tensor offsets, SymInt T, SymInt offset_stride, "
        "float offset_coefficient, float offset_value, SymInt programs, SymInt panel, SymInt block, "
        "str precision) -> Tensor")
    assert str(vjp._schema).endswith("SymInt block, str precision) -> (Tensor, Tensor)")


@needs_compiled_kernels
def test_each_op_names_its_kernel_for_compiled_graph_caches():
    # torch 2.14: torch._library.triton.get_triton_kernels_for_op is what AOTAutograd's cache
    # hashes a graph's Triton ops by (the kernels' source): an op whose kernels it cannot find
    # would not invalidate a cached graph when a kernel changes
    kernels_for_op = torch._library.triton.get_triton_kernels_for_op
    assert kernels_for_op("gwdet::triton_itn_whitening") == [triton_kernels.itn_whitening_kernel]
    assert kernels_for_op("gwdet::triton_itn_whitening_vjp") == [triton_kernels.itn_whitening_vjp_kernel]


@needs_compiled_kernels
@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("size,block", [(1, 16), (20, 32), (64, 64)])
def test_on_fake_tensors_the_ops_give_shapes_and_dtypes_without_launching(size, block, device):
    with FakeTensorMode():
        cov = covariances(5, size, device)[:, :, :].transpose(1, 2)  # not contiguous: the op makes it so
        offsets = torch.empty(5, 1, 1, device=device)
        whitening = triton_kernels.triton_itn_whitening(cov, offsets, 5, 1, 1.0, 0.0, 2, 16, block, "tf32x3")
        value, grad_cov = triton_kernels.triton_itn_whitening_vjp(
            cov, cov, offsets, 5, 1, 1.0, 0.0, 2, 16, block, "ieee")
    for out in (whitening, value, grad_cov):
        assert out.shape == (5, size, size) and out.dtype == torch.float32
        assert out.device.type == device and out.is_contiguous()


class Launches:
    """Stands for ``wrap_triton``: records what would be launched, launches nothing."""

    def __init__(self):
        self.calls = []

    def __call__(self, kernel):
        calls = self.calls

        class Launcher:
            def __getitem__(self, grid):
                def launch(*args, **kwargs):
                    calls.append({"kernel": kernel, "grid": grid, "args": args, "kwargs": kwargs})

                return launch

        return Launcher()


@needs_compiled_kernels
@pytest.mark.parametrize("offset", [0.0, "per matrix"])
def test_the_plan_launches_each_kernel_through_wrap_triton(offset, monkeypatch):
    launches = Launches()
    monkeypatch.setattr(triton_kernels, "wrap_triton", launches)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # lets the plan launch on CPU tensors (the spy launches nothing)
    cov, grad = covariances(5, 20), covariances(5, 20)
    trace_offset = torch.rand(5, 1, 1) if offset == "per matrix" else offset
    with torch.profiler.profile() as profile:
        triton_plan._launch_whitening(cov, 5, trace_offset)
        triton_plan._launch_whitening_vjp(cov, grad, 5, trace_offset)
    forward, backward = launches.calls
    assert forward["kernel"] is triton_kernels.itn_whitening_kernel
    assert backward["kernel"] is triton_kernels.itn_whitening_vjp_kernel
    for call, slots in ((forward, 4), (backward, 7)):
        assert call["grid"] == (2,)  # two persistent programs in the interpreter (triton_plan.programs)
        assert call["kwargs"] == {"PANEL": 32, "BLOCK": 32, "PRECISION": "tf32x3", "num_warps": 4, "maxnreg": 255}
        args = call["args"]
        assert torch.equal(args[0], cov)
        scratch = args[5] if call is backward else args[3]
        assert scratch.shape == (2, slots, 32, 32)
    assert torch.equal(backward["args"][1], grad)
    # count, size, T, offset stride, coefficient, value
    per_matrix = offset == "per matrix"
    assert forward["args"][4:] == (5, 20, 5, 1 if per_matrix else 0, 1.0 if per_matrix else 0.0, 0.0)
    assert backward["args"][6:] == forward["args"][4:]
    names = [event.name for event in profile.events()]
    for kernel in ("itn_whitening_kernel", "itn_whitening_vjp_kernel"):
        assert names.count(f"triton::{kernel}") == 1
        assert names.count(f"gwdet::triton_{kernel.replace('_kernel', '')}") == 1


class Stop(Exception):
    """Raised by the compiled graph in place of running it (nothing can launch without a GPU)."""


@needs_compiled_kernels
def test_torch_compile_traces_the_op_into_its_kernel():
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

    graphs = []

    def keep(graph_module, example_inputs):
        graphs.append(graph_module)

        def refuse(*args):
            raise Stop

        return refuse

    def backend(graph_module, example_inputs):
        return aot_module_simplified(graph_module, example_inputs, fw_compiler=keep)

    def whiten(cov, offsets):
        return 2.0 * triton_kernels.triton_itn_whitening(cov, offsets, 5, 1, 1.0, 0.0, 2, 16, 32, "tf32x3")

    torch._dynamo.reset()
    compiled = torch.compile(whiten, backend=backend, fullgraph=True)
    with pytest.raises(Stop):
        compiled(covariances(5, 20), torch.rand(5, 1, 1))
    (graph,) = graphs
    nodes = [node for node in graph.graph.nodes
             if node.target is torch.ops.higher_order.triton_kernel_wrapper_functional]
    assert len(nodes) == 1
    assert not any("gwdet" in str(node.target) for node in graph.graph.nodes), "the op is decomposed"
    node = nodes[0]
    # torch 2.14 moves the launch's num_warps into a one-configuration autotuner around the kernel
    kernel = kernel_side_table.get_kernel(node.kwargs["kernel_idx"])
    assert kernel.fn is triton_kernels.itn_whitening_kernel
    assert [config.num_warps for config in kernel.configs] == [triton_kernels.WARPS]
    arguments = {**node.kwargs["kwargs"], **kernel_side_table.get_constant_args(node.kwargs["constant_args_idx"])}
    assert {key: arguments[key] for key in ("count", "size", "iterations", "PANEL", "BLOCK", "PRECISION", "maxnreg")} == {
        "count": 5, "size": 20, "iterations": 5, "PANEL": 16, "BLOCK": 32, "PRECISION": "tf32x3",
        "maxnreg": triton_kernels.MAX_REGISTERS}
    assert node.kwargs["grid"] == [(2, 1, 1)]
    torch._dynamo.reset()


@needs_compiled_kernels
def test_torch_export_keeps_the_op_whole():
    class Whiten(torch.nn.Module):
        def forward(self, cov, offsets):
            return triton_kernels.triton_itn_whitening(cov, offsets, 5, 1, 1.0, 0.0, 2, 16, 32, "tf32x3")

    program = torch.export.export(Whiten(), (covariances(5, 20), torch.rand(5, 1, 1)))
    targets = [node.target for node in program.graph.nodes if node.op == "call_function"]
    assert torch.ops.gwdet.triton_itn_whitening.default in targets


INTERPRETER_RUN = """
import os
os.environ["TRITON_INTERPRET"] = "1"
os.environ["GWDET_GW_PLAN"] = "triton"
import json
import torch
from gwdet.layers import GroupWhitening
from gwdet.layers.plans.triton_plan import fallback_reason

torch.manual_seed(0)
layer = GroupWhitening(32, 8)
x = torch.randn(3, 32, 4, 4, requires_grad=True)
with torch.profiler.profile() as profile:
    layer(x).square().sum().backward()
names = [event.name for event in profile.events()]
print(json.dumps({"names": sorted(set(name for name in names if "triton" in name)),
                  "finite": bool(torch.isfinite(x.grad).all()), "fallbacks": fallback_reason()}))
"""


def test_a_layer_under_the_triton_plan_dispatches_the_ops_in_the_interpreter():
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    completed = subprocess.run([sys.executable, "-c", INTERPRETER_RUN], cwd=REPO, env=env,
                               capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    report = json.loads(completed.stdout.strip().splitlines()[-1])
    assert report["fallbacks"] is None and report["finite"]
    assert report["names"] == ["gwdet::triton_itn_whitening", "gwdet::triton_itn_whitening_vjp",
                               "triton::itn_whitening_kernel", "triton::itn_whitening_vjp_kernel"]
