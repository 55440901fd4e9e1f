"""Whether the installed PyTorch can run on a GPU, asked before gwdet's first launch on it.

A PyTorch wheel carries GPU code for a list of architectures (``torch.cuda.get_arch_list()``):
machine code (``sm_XY``) runs on GPUs of the same major generation and at least that minor
version, PTX (``compute_XY``) is compiled by the driver for any GPU of at least that capability
(NVIDIA, CUDA C++ Programming Guide, "Binary Compatibility" and "PTX Compatibility"). On a GPU the
wheel has no code for, every operation fails with "no kernel image is available":
:func:`unsupported_gpu_message` names that case, and :func:`check_cuda_device` raises it before a
layer's first operation on such a device (docs/install.md, "GPU generations and PyTorch builds").
"""
import functools
import re
from typing import Optional, Sequence, Tuple

import torch

from gwdet.errors import GwdetRuntimeError

INSTALL_SECTION = "docs/install.md, section 'GPU generations and PyTorch builds'"


def _runs(capability: Tuple[int, int], arch: str) -> bool:
    """Whether code for ``arch`` (``sm_86``, ``compute_90``; arch-specific ``sm_90a`` only on
    exactly that GPU) runs on a GPU of ``capability``."""
    match = re.fullmatch(r"(sm|compute)_(\d+?)(\d)([af]?)", arch)
    if match is None:
        return False
    kind, major, minor, suffix = match.group(1), int(match.group(2)), int(match.group(3)), match.group(4)
    if suffix:
        return (major, minor) == capability
    if kind == "compute":
        return (major, minor) <= capability
    return major == capability[0] and minor <= capability[1]


def unsupported_gpu_message(name: str, capability: Tuple[int, int], arch_list: Sequence[str]) -> Optional[str]:
    """None when code of ``arch_list`` runs on a GPU of ``capability``, else the message that says
    which GPU, which build and what to install instead. An empty list (a build without CUDA
    kernels to list) is not judged here: None."""
    if not arch_list or any(_runs(capability, arch) for arch in arch_list):
        return None
    sm = f"sm_{capability[0]}{capability[1]}"
    return (
        f"the GPU {name} (compute capability {capability[0]}.{capability[1]}, {sm}) cannot run this PyTorch "
        f"build (torch {torch.__version__}, CUDA {torch.version.cuda}): it carries GPU code for "
        f"{', '.join(arch_list)} only, so every operation on this GPU would fail with 'no kernel image is "
        f"available'. Install a PyTorch built for {sm} into the environment first (a V100, sm_70, needs a "
        f"CUDA 12 build such as the cu126 wheels and a Triton that still targets sm_70): see {INSTALL_SECTION}."
    )


@functools.lru_cache(maxsize=None)
def _device_message(index: int) -> Optional[str]:
    return unsupported_gpu_message(
        torch.cuda.get_device_name(index), torch.cuda.get_device_capability(index), torch.cuda.get_arch_list()
    )


def check_cuda_device(device: torch.device) -> None:
    """Raise a ``RuntimeError`` (:class:`gwdet.errors.GwdetRuntimeError`) with
    :func:`unsupported_gpu_message` when the installed PyTorch cannot run on the CUDA ``device``
    (asked once per device and process)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    message = _device_message(index)
    if message is not None:
        raise GwdetRuntimeError(f"gwdet: {message}")
