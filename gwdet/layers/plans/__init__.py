"""Execution plans of gwdet's whitening layers: one mathematics, run the way a device likes it.

* ``cpu`` (:mod:`.cpu`): samples in cache-sized chunks, host-side shortcuts; the default for CPU
  tensors.
* ``accelerator`` (:mod:`.accelerator`): plain PyTorch operations over the whole batch, no host
  synchronisation (capturable by CUDA graphs); the default on other devices and GPUs without
  Triton or TF32.
* ``triton`` (:mod:`.triton_plan`): ``accelerator`` with the ``g x g`` Newton iterations of ItN as
  one Triton kernel per direction; the default for CUDA tensors by :func:`default_gpu_plan`.

``GWDET_GW_PLAN=cpu|accelerator|triton`` forces a plan on every device; it is read at every call.
Plans differ in speed and in float rounding, never in what they compute. This module is the one
place that chooses.
"""
import functools
import importlib
import os
from typing import Dict, Tuple

import torch

from .accelerator import AcceleratorPlan
from .base import ExecutionPlan
from .cpu import CpuPlan
from .gpu_support import check_cuda_device
from .triton_plan import TritonPlan, fallback_reason

from gwdet.errors import GwdetValueError

PLAN_VARIABLE = "GWDET_GW_PLAN"
PLANS: Dict[str, ExecutionPlan] = {plan.name: plan for plan in (CpuPlan(), AcceleratorPlan(), TritonPlan())}


@functools.lru_cache(maxsize=None)
def triton_version() -> str:
    """The version of Triton when it imports, else ``""``."""
    try:
        return importlib.import_module("triton").__version__
    except Exception:  # a broken Triton install counts as none
        return ""


def default_gpu_plan(capability: Tuple[int, int], triton_imports: bool) -> str:
    """The plan for CUDA tensors on a GPU of ``capability``: ``triton`` where Triton imports and
    the GPU has TF32 tensor cores (8.0 and later), for its kernels' ``tf32x3`` products; else
    ``accelerator`` (docs/benchmarks.md)."""
    return "triton" if triton_imports and capability >= (8, 0) else "accelerator"


def plan_name(device: torch.device) -> str:
    """The plan that runs on ``device``: ``GWDET_GW_PLAN`` when set, else ``cpu`` for CPU
    tensors, :func:`default_gpu_plan` for CUDA tensors (a GPU of compute capability 8.0 assumed
    where none is visible) and ``accelerator`` for other devices. Raises ``ValueError`` for an
    unknown name in ``GWDET_GW_PLAN``."""
    forced = os.environ.get(PLAN_VARIABLE, "")
    if forced:
        if forced not in PLANS:
            raise GwdetValueError(
                f"{PLAN_VARIABLE}={forced!r} is not an execution plan; choose one of "
                f"{', '.join(PLANS)} (or unset it to choose by device)"
            )
        return forced
    if device.type == "cpu":
        return "cpu"
    if device.type == "cuda":
        return default_gpu_plan(_capability(device), bool(triton_version()))
    return "accelerator"


def _capability(device: torch.device) -> Tuple[int, int]:
    if not torch.cuda.is_available():
        return (8, 0)
    return torch.cuda.get_device_capability(device)


def plan_for(device: torch.device) -> ExecutionPlan:
    """The :class:`~.base.ExecutionPlan` of :func:`plan_name`; for a CUDA device, after checking
    that the installed PyTorch has code for that GPU (:func:`~.gpu_support.check_cuda_device`)."""
    if device.type == "cuda":
        check_cuda_device(device)
    return PLANS[plan_name(device)]


def describe_plans() -> str:
    """One line for logs and ``python -m gwdet.collect_env``: the plan for CPU and CUDA tensors,
    and why."""
    forced = os.environ.get(PLAN_VARIABLE, "")
    cpu, cuda = plan_name(torch.device("cpu")), plan_name(torch.device("cuda"))
    why = f"forced by {PLAN_VARIABLE}" if forced else f"by device; Triton {triton_version() or 'not importable'}"
    line = f"GW/BW execution plan: {cpu} for CPU tensors, {cuda} for CUDA tensors ({why})"
    if fallback_reason():
        line += f"; Triton kernels that cannot run, computed by 'accelerator' instead: {fallback_reason()}"
    return line


__all__ = [
    "PLANS", "PLAN_VARIABLE", "ExecutionPlan", "default_gpu_plan", "describe_plans", "fallback_reason", "plan_for",
    "plan_name", "triton_version",
]
