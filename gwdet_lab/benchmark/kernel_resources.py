"""What a compiled Triton kernel needs of a GPU, read with the tools Triton ships
(``triton/backends/nvidia/bin``): registers, static shared memory and stack per thread from the
cubin (``cuobjdump --dump-resource-usage``), and the local memory ptxas spills to (``ptxas -v`` on
the kernel's PTX, with the options Triton assembles it with). No GPU is needed; tests/
test_triton_compile.py and tools/gpu_check.py read them."""
from __future__ import annotations

import os
import re
import subprocess
import tempfile
from typing import Dict


def triton_tool(name: str) -> str:
    """The path of ``name`` (``cuobjdump``, ``ptxas``) in the installed Triton's NVIDIA backend."""
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def resource_usage(cubin: bytes) -> Dict[str, int]:
    """``{"REG": registers per thread, "STACK": bytes, "SHARED": static shared bytes, ...}`` of the
    cubin's kernel, as ``cuobjdump --dump-resource-usage`` reports them."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
        handle.write(cubin)
        handle.flush()
        text = subprocess.run([triton_tool("cuobjdump"), "--dump-resource-usage", handle.name],
                              capture_output=True, text=True, check=True).stdout
    line = next(line for line in text.splitlines() if "REG:" in line)
    return {key: int(value) for key, value in re.findall(r"(\w+):(\d+)", line)}


def local_memory(ptx: str, capability: int) -> Dict[str, int]:
    """``{"stack": bytes, "stores": bytes, "loads": bytes}`` of local memory (stack frame, spill
    stores and loads per thread) that ``ptxas -v`` reports for ``ptx`` on ``sm_<capability>``,
    assembled with the options Triton uses (line info, its register allocation setting)."""
    with tempfile.TemporaryDirectory() as folder:
        source = os.path.join(folder, "kernel.ptx")
        with open(source, "w") as handle:
            handle.write(ptx)
        arch = f"sm_{capability}a" if capability == 90 else f"sm_{capability}"
        log = subprocess.run([triton_tool("ptxas"), "-lineinfo", "-v", "--regAllocOptLevel=2", f"--gpu-name={arch}",
                              source, "-o", os.path.join(folder, "kernel.cubin")],
                             capture_output=True, text=True, check=True).stderr
    found = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log)
    if found is None:
        raise RuntimeError(f"ptxas -v printed no stack and spill line: {log[-500:]}")
    return dict(zip(("stack", "stores", "loads"), map(int, found.groups()), strict=True))
