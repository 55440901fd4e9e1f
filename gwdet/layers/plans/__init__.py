"""Execution plans of gwdet's whitening layers: one mathematics, run the way a device likes it.

* ``cpu`` (:mod:`.cpu`): samples in cache-sized chunks, host-side shortcuts; the default for CPU
  tensors.
* ``accelerator`` (:mod:`.accelerator`): plain PyTorch operations over the whole batch, chunked
  only beyond an absolute memory budget; no host synchronisation, so few kernel launches and
  capturable by CUDA graphs. The default on a GPU without Triton and on other devices.
* ``triton`` (:mod:`.triton_plan`): ``accelerator`` with the ``g x g`` Newton iterations of ItN
  fused into one Triton kernel per direction; the default for CUDA tensors when Triton imports.

The environment variable ``GWDET_GW_PLAN=cpu|accelerator|triton`` forces a plan on every device
(so each plan can be tested and counted on a CPU); it is read at every call, not at import.
Plans differ in speed and in float rounding, never in what they compute. This module is the one
place that chooses.
"""
import functools
import importlib
import os
from typing import Dict

import torch

from .accelerator import AcceleratorPlan
from .base import ExecutionPlan
from .cpu import CpuPlan
from .triton_plan import TritonPlan, fallback_reason

PLAN_VARIABLE = "GWDET_GW_PLAN"
PLANS: Dict[str, ExecutionPlan] = {plan.name: plan for plan in (CpuPlan(), AcceleratorPlan(), TritonPlan())}


@functools.lru_cache(maxsize=None)
def triton_version() -> str:
    """The version of Triton when it imports, else ``""``."""
    try:
        return importlib.import_module("triton").__version__
    except Exception:  # a broken Triton install counts as none
        return ""


def plan_name(device: torch.device) -> str:
    """The plan that runs on ``device``: ``GWDET_GW_PLAN`` when set, else ``cpu`` for CPU
    tensors, ``triton`` for CUDA tensors when Triton imports and ``accelerator`` otherwise.
    Raises ``ValueError`` for an unknown name in ``GWDET_GW_PLAN``."""
    forced = os.environ.get(PLAN_VARIABLE, "")
    if forced:
        if forced not in PLANS:
            raise ValueError(
                f"{PLAN_VARIABLE}={forced!r} is not an execution plan; choose one of "
                f"{', '.join(PLANS)} (or unset it to choose by device)"
            )
        return forced
    if device.type == "cpu":
        return "cpu"
    if device.type == "cuda" and triton_version():
        return "triton"
    return "accelerator"


def plan_for(device: torch.device) -> ExecutionPlan:
    """The :class:`~.base.ExecutionPlan` of :func:`plan_name`."""
    return PLANS[plan_name(device)]


def describe_plans() -> str:
    """One line for logs and ``python -m gwdet.collect_env``: the plan for CPU and CUDA tensors,
    and why."""
    forced = os.environ.get(PLAN_VARIABLE, "")
    cpu, cuda = plan_name(torch.device("cpu")), plan_name(torch.device("cuda"))
    why = f"forced by {PLAN_VARIABLE}" if forced else f"by device; Triton {triton_version() or 'not importable'}"
    line = f"GW/BW execution plan: {cpu} for CPU tensors, {cuda} for CUDA tensors ({why})"
    if fallback_reason():
        line += f"; Triton kernels failed in this process ({fallback_reason()}), running 'accelerator'"
    return line


__all__ = ["PLANS", "PLAN_VARIABLE", "ExecutionPlan", "describe_plans", "plan_for", "plan_name", "triton_version"]
