"""The ``triton`` plan's kernels compile ahead of time for real GPUs, with no GPU here, and use no
local memory.

Every (kernel, tile size) a layer can launch (:data:`LAUNCH_CONFIGURATIONS`, with the launch
options and the ``PRECISION`` it is launched with: ``ieee`` on sm_70, ``tf32x3`` from sm_80) is
compiled to a cubin for sm_70 (V100), sm_80 (A100) and sm_90 (H100), and must fit:

* shared memory (Triton's dynamic share from the compiled metadata plus the static share the cubin
  reports) within the largest a block may opt in to, and the registers of all its threads within
  the 64K-register file (a launch asking for more fails with "too many resources requested");
  limits: CUDA C++ Programming Guide, "Compute Capabilities", table "Technical Specifications per
  Compute Capability" (96 KB on 7.0, 163 KB on 8.0, 227 KB on 9.0; 64K 32-bit registers per block);
* no local memory: :data:`STACK_BOUND` bytes of stack per thread (the cubin's ``STACK``, as
  ``cuobjdump --dump-resource-usage`` reports it; the driver reserves that much for every
  resident thread of the GPU) and no spill stores or loads (``ptxas -v`` on the kernel's PTX with
  the options Triton compiles it with).

Both tools ship with Triton (``triton/backends/nvidia/bin``; gwdet_lab.benchmark.kernel_resources
runs them). Compiling takes a few seconds per kernel (Triton caches the results under
~/.triton/cache).
"""
import pytest

triton = pytest.importorskip("triton", reason="the triton plan needs Triton (pip install triton)")

from triton.backends.compiler import GPUTarget  # noqa: E402

from gwdet.layers.plans import triton_kernels  # noqa: E402
from gwdet_lab.benchmark.kernel_resources import local_memory, resource_usage  # noqa: E402

SHARED_MEMORY_LIMIT = {70: 96 * 1024, 80: 163 * 1024, 90: 227 * 1024}
PRECISION = {70: "ieee", 80: "tf32x3", 90: "tf32x3"}  # gwdet.layers.plans.triton_plan.input_precision
REGISTER_FILE = 64 * 1024
STACK_BOUND = 0


@pytest.mark.slow
@pytest.mark.parametrize("capability", sorted(SHARED_MEMORY_LIMIT), ids=lambda cap: f"sm_{cap}")
def test_every_kernel_configuration_compiles_within_the_limits_without_local_memory(capability):
    assert len(triton_kernels.LAUNCH_CONFIGURATIONS) == 6  # 2 kernels x tiles of 16, 32, 64
    for name, block in triton_kernels.LAUNCH_CONFIGURATIONS:
        options = triton_kernels.launch_options(block)
        compiled = triton.compile(triton_kernels.compile_source(name, block, PRECISION[capability]),
                                  target=GPUTarget("cuda", capability, 32), options=options)
        assert compiled.asm["cubin"], (name, block)
        usage = resource_usage(compiled.asm["cubin"])
        shared = compiled.metadata.shared + usage["SHARED"]
        assert 0 < shared <= SHARED_MEMORY_LIMIT[capability], (name, block, shared)
        threads = options["num_warps"] * 32
        assert usage["REG"] <= options["maxnreg"] and usage["REG"] * threads <= REGISTER_FILE, (name, block, usage)
        assert usage["STACK"] <= STACK_BOUND, (name, block, usage)
        assert local_memory(compiled.asm["ptx"], capability) == {"stack": 0, "stores": 0, "loads": 0}, (name, block)
        if PRECISION[capability] == "tf32x3":  # the products run on tensor cores
            assert "mma.sync.aligned" in compiled.asm["ptx"] or "wgmma" in compiled.asm["ptx"], (name, block)
