"""What a run ran with: the versions of the packages that decide its numbers, and the annotation
files of the datasets it trained and evaluated on with their SHA-256.

:func:`run_environment` is the one record of it: gwdet's ``results.json`` (under the key
``"environment"``, :func:`gwdet.engine.run.write_results_to`, yacs and LazyConfig runs) and
the study's ``study_cell.json`` hold it. Two runs whose records agree ran the same library versions
on the same annotations; the shapes dataset's images are pinned by its own digest test
(tests/test_shapes_digest.py).
"""
from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
import platform
from typing import Any, Iterable

import torch
from detectron2.data import MetadataCatalog
from detectron2.utils import comm

from gwdet.checkpoint.resilient import MISMATCH_ENV, UNSAFE_PICKLE_ENV
from gwdet.data.coco_registration import sha256_as_read
from gwdet.layers.plans import PLAN_VARIABLE, fallback_reason, plan_name
from gwdet.utils.atomic import cached_sha256

logger = logging.getLogger(__name__)

ENVIRONMENT_KEY = "environment"
# (distribution name, module): the packages whose versions a run records, besides python and gwdet
PACKAGES = (("torch", "torch"), ("torchvision", "torchvision"), ("detectron2", "detectron2"), ("numpy", "numpy"),
            ("Pillow", "PIL"), ("pycocotools", "pycocotools"))


def package_version(distribution: str, module: str) -> str:
    """The version of ``module`` (its ``__version__``, else that of the installed ``distribution``),
    ``"not installed"`` when neither is there."""
    try:
        version = getattr(importlib.import_module(module), "__version__", None)
    except ImportError:
        version = None
    if version is not None:
        return str(version)
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def package_versions() -> dict[str, str]:
    """``{"python": ..., "gwdet": ..., "torch": ..., "torchvision": ..., "detectron2": ..., "numpy": ...,
    "Pillow": ..., "pycocotools": ...}``."""
    import gwdet

    versions = {"python": platform.python_version(), "gwdet": str(getattr(gwdet, "__version__", "?"))}
    versions.update((name, package_version(name, module)) for name, module in PACKAGES)
    return versions


def annotation_files(names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """For each registered dataset of ``names``: ``json_file`` (its metadata's annotation file, as
    detectron2's ``register_coco_instances`` records it; ``None`` for a dataset registered without
    one), ``json_sha256`` (of the contents the run read, where gwdet read and checked the file
    (:func:`~gwdet.data.coco_registration.sha256_as_read`), with a warning when the file holds other
    contents now; else of the file now; ``None`` without a file, or when it is gone: the results of
    a run whose annotation file was moved after it was read are still written) and ``image_root``. A
    name that is not registered is left out."""
    registered = set(MetadataCatalog.list())
    files: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(names):
        if name not in registered:
            continue
        metadata = MetadataCatalog.get(name)
        json_file = metadata.get("json_file")
        now = cached_sha256(json_file) if json_file and os.path.isfile(json_file) else None
        read = sha256_as_read(name)
        if read is not None and now is not None and now != read:
            logger.warning(f"{json_file} ({name!r}) holds other contents than the run read (SHA-256 {read[:12]}... "
                           f"then, {now[:12]}... now: changed while the run ran): the records name the contents the "
                           "run read.")
        files[name] = {"json_file": json_file, "json_sha256": read or now, "image_root": metadata.get("image_root")}
    return files


# The environment variables that limit the vector extensions of the CPU kernels: PyTorch's own
# (ATen), MKL's (Conditional Numerical Reproducibility branch) and oneDNN's (`make demo` sets all three).
CPU_KERNEL_VARIABLES = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA")


def processor() -> dict[str, Any]:
    """The CPU that computed the run: its model name, its vector extensions that PyTorch's CPU
    kernels choose between (``torch.backends.cpu.get_cpu_capability()``), the limits set on the
    kernels' extensions (:data:`CPU_KERNEL_VARIABLES`, ``None`` where unset) and its core count. The
    same seed and library versions give other floating-point results on a CPU whose kernels differ."""
    import torch

    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            name = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), name)
    except OSError:
        pass
    return {"model": name, "torch_capability": torch.backends.cpu.get_cpu_capability(),
            "kernel_limits": {variable: os.environ.get(variable) for variable in CPU_KERNEL_VARIABLES},
            "cores": os.cpu_count()}


def execution_plans() -> dict[str, Any]:
    """The GW/BW execution plan for CPU and CUDA tensors (:func:`gwdet.layers.plans.plan_name`), the
    value of ``GWDET_GW_PLAN`` that forced them (``None``: chosen by device), and, once a Triton
    kernel could not run in this process, ``"fallbacks"``: which, where and why (their calls were
    computed by the ``accelerator`` plan's operations: :func:`gwdet.layers.plans.fallback_reason`)."""
    plans = {"cpu": plan_name(torch.device("cpu")), "cuda": plan_name(torch.device("cuda")),
             "forced": os.environ.get(PLAN_VARIABLE) or None}
    fallbacks = fallback_reason()
    return {**plans, "fallbacks": fallbacks} if fallbacks else plans


def run_segment() -> dict[str, Any]:
    """``{"versions": package_versions(), "cpu": processor(), "execution_plans": execution_plans(),
    "processes": ..., "threads": ...}``: what this process computes with; the number of processes of
    the run and of torch's threads in each change the sums' order, so the weights' last bits. A
    resumed training's checkpoints keep one per stretch of iterations."""
    return {"versions": package_versions(), "cpu": processor(), "execution_plans": execution_plans(),
            "processes": comm.get_world_size(), "threads": torch.get_num_threads()}


def run_environment(dataset_names: Iterable[str]) -> dict[str, Any]:
    """:func:`run_segment` and ``"datasets": annotation_files(dataset_names)``: what a run on the
    datasets ``dataset_names`` (train and test) ran with; and ``"opt_ins"``, the checks it was told to
    let pass (``GWDET_ALLOW_NORM_MISMATCH``, ``GWDET_ALLOW_UNSAFE_PICKLE``), where any was."""
    environment = {**run_segment(), "datasets": annotation_files(dataset_names)}
    opt_ins = {name: os.environ[name] for name in (MISMATCH_ENV, UNSAFE_PICKLE_ENV) if os.environ.get(name, "0") != "0"}
    return {**environment, "opt_ins": opt_ins} if opt_ins else environment
