"""The ``triton`` plan's kernels compile ahead of time for real GPUs, with no GPU here.

Every (kernel, tile size) a layer can launch (:data:`LAUNCH_CONFIGURATIONS`, with the launch
options it is launched with) is compiled to a cubin for sm_70 (V100), sm_80 (A100) and sm_90
(H100), and must fit the architecture: shared memory (Triton's dynamic share from the compiled
metadata plus the static share ptxas reports) within the largest a block may opt in to, and the
registers of all its threads within the 64K-register file (a launch asking for more fails with
"too many resources requested"). Limits: CUDA C++ Programming Guide, "Compute Capabilities",
table "Technical Specifications per Compute Capability" (maximum shared memory per thread block:
96 KB on 7.0, 163 KB on 8.0, 227 KB on 9.0; 64K 32-bit registers per thread block).

Compiling takes about 5 s per architecture (Triton caches the results under ~/.triton/cache).
"""
import os
import re
import subprocess
import tempfile

import pytest

triton = pytest.importorskip("triton", reason="the triton plan needs Triton (pip install triton)")

from triton.backends.compiler import GPUTarget  # noqa: E402

from gwdet.layers.plans import triton_kernels  # noqa: E402

SHARED_MEMORY_LIMIT = {70: 96 * 1024, 80: 163 * 1024, 90: 227 * 1024}
REGISTER_FILE = 64 * 1024
CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def resource_usage(cubin: bytes) -> dict:
    """``{"REG": registers per thread, "SHARED": static shared bytes, ...}`` of the cubin's kernel,
    as ``cuobjdump --dump-resource-usage`` (shipped with Triton) reports them."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
        handle.write(cubin)
        handle.flush()
        text = subprocess.run([CUOBJDUMP, "--dump-resource-usage", handle.name],
                              capture_output=True, text=True, check=True).stdout
    line = next(line for line in text.splitlines() if "REG:" in line)
    return {key: int(value) for key, value in re.findall(r"(\w+):(\d+)", line)}


@pytest.mark.slow
@pytest.mark.parametrize("capability", sorted(SHARED_MEMORY_LIMIT), ids=lambda cap: f"sm_{cap}")
def test_every_kernel_configuration_compiles_within_the_architectures_limits(capability):
    assert len(triton_kernels.LAUNCH_CONFIGURATIONS) == 6  # 2 kernels x tiles of 16, 32, 64
    for name, block in triton_kernels.LAUNCH_CONFIGURATIONS:
        signature = {**triton_kernels.SIGNATURES[name], "BLOCK": "constexpr"}
        source = triton.compiler.ASTSource(fn=triton_kernels.KERNELS[name], signature=signature,
                                           constexprs={"BLOCK": block})
        options = triton_kernels.launch_options(block)
        compiled = triton.compile(source, target=GPUTarget("cuda", capability, 32), options=options)
        assert compiled.asm["cubin"], (name, block)
        usage = resource_usage(compiled.asm["cubin"])
        shared = compiled.metadata.shared + usage["SHARED"]
        assert 0 < shared <= SHARED_MEMORY_LIMIT[capability], (name, block, shared)
        threads = options["num_warps"] * 32
        assert usage["REG"] <= options["maxnreg"] and usage["REG"] * threads <= REGISTER_FILE, (name, block, usage)
