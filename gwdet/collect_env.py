"""What gwdet runs on: print it with ``python -m gwdet.collect_env`` (``--json`` for a machine-readable
form) and paste the output into a bug report. When ``import gwdet`` itself fails, run this file
directly (``python gwdet/collect_env.py``): it reports what it can.

Reports Python, PyTorch, torchvision and detectron2 (version, where it was imported from, and how it
was installed: gwdet's set-up of the ``sal-detectron2`` wheel, a pip install built from a source tree,
an editable install, or a source tree on ``sys.path``), whether detectron2's compiled extension
``detectron2._C`` loads and which detectron2 features are missing without it, which optional
detectron2 APIs gwdet relies on are there, gwdet's registered norm names and backbones, the
execution plan its whitening layers run on CPU and CUDA tensors (:mod:`gwdet.layers.plans`), and
the thread settings that decide CPU speed.

Every probe is guarded: a broken package shows up as a line saying what failed, never as a crash of
this report.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import os
import platform
import sys
from pathlib import Path
from typing import Callable

Report = dict[str, dict[str, str]]

# What needs detectron2._C, and the detectron2 API that would fail without it.
_C_FEATURES = {
    "rotated boxes": "detectron2.layers.nms_rotated, box_iou_rotated, ROIAlignRotated (RotatedRPN, RROIHeads)",
    "deformable convolution": "detectron2.layers.DeformConv, ModulatedDeformConv (DEFORM_ON_PER_STAGE)",
    "fast COCOeval": "detectron2.evaluation.fast_eval_api.COCOeval_opt (COCOEvaluator then uses pycocotools' COCOeval)",
}
_BUILD_FROM_SOURCE = (
    "build detectron2 from source into this environment: "
    "pip install --no-build-isolation 'git+https://github.com/facebookresearch/detectron2.git', "
    "then pip install -e . in the gwdet checkout (docs/install.md, 'detectron2 versions')"
)


def _error_text(err: BaseException) -> str:
    """How the report shows an exception: its type and the first line of its message."""
    return f"error: {type(err).__name__}: {_first_line(err)}"


def _guard(probe: Callable[[], str]) -> str:
    try:
        return probe()
    except Exception as err:  # the report must survive any broken package
        return _error_text(err)


def _text_of(function: Callable[[], object]) -> Callable[[], str]:
    """A probe for :func:`_guard`: ``str(function())`` of this ``function`` (not of a loop's variable)."""
    return lambda: str(function())


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else ""


def _distribution_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _module_dir(module) -> Path:
    return Path(module.__file__).resolve().parent


# ---------------------------------------------------------------------------------------------
# Python and the packages gwdet and detectron2 import


def _python_section() -> dict[str, str]:
    return {
        "Python": sys.version.split()[0],
        "executable": sys.executable,
        "platform": platform.platform(),
        "machine": platform.machine(),
    }


def _packages_section() -> dict[str, str]:
    names = ["numpy", "Pillow", "pycocotools", "fvcore", "iopath", "omegaconf", "setuptools"]
    section = {name: _distribution_version(name) for name in names}
    opencv = [name for name in ("opencv-python", "opencv-python-headless", "opencv-contrib-python",
                                "opencv-contrib-python-headless") if _distribution_version(name) != "not installed"]
    section["cv2 providers"] = ", ".join(f"{n} {_distribution_version(n)}" for n in opencv) or "none"
    if len(opencv) > 1:
        section["cv2 providers"] += " (more than one package owns cv2: removing one breaks the other)"
    return section


def _torch_section() -> dict[str, str]:
    try:
        import torch
    except Exception as err:
        return {"torch": _error_text(err)}
    section = {
        "torch": torch.__version__,
        "torch path": str(_module_dir(torch)),
        "torch built with CUDA": str(torch.version.cuda or "no"),
        "CUDA available": _guard(lambda: str(torch.cuda.is_available())),
    }
    if section["CUDA available"] == "True":
        section["GPUs"] = _guard(lambda: ", ".join(
            torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())))
    section["torchvision"] = _guard(_torchvision_version)
    section["torchvision ops"] = _guard(_torchvision_ops)
    return section


def _torchvision_version() -> str:
    import torchvision

    return f"{torchvision.__version__} ({_module_dir(torchvision)})"


def _torchvision_ops() -> str:
    import torch
    import torchvision

    torchvision.ops.nms(torch.zeros(1, 4), torch.zeros(1), 0.5)
    return "load (nms ran)"


# ---------------------------------------------------------------------------------------------
# detectron2: version, origin, compiled extension, the optional APIs gwdet uses


def _dist_info_owning(package_dir: Path) -> Path | None:
    """The ``*.dist-info`` folder beside ``package_dir`` whose RECORD lists its ``__init__.py``."""
    wanted = f"{package_dir.name}/__init__.py"
    for info in sorted(package_dir.parent.glob("*.dist-info")):
        record = info / "RECORD"
        if record.is_file() and any(line.split(",", 1)[0] == wanted
                                    for line in record.read_text(encoding="utf-8", errors="replace").splitlines()):
            return info
    return None


def _editable_owner(package_dir: Path) -> tuple[str, dict] | None:
    """(distribution name, direct_url) of an editable install whose source folder holds ``package_dir``."""
    for dist in importlib.metadata.distributions():
        text = dist.read_text("direct_url.json")
        if not text:
            continue
        try:
            direct = json.loads(text)
        except ValueError:
            continue
        if not direct.get("dir_info", {}).get("editable"):
            continue
        url = direct.get("url", "")
        if url.startswith("file://") and package_dir.is_relative_to(Path(url[len("file://"):]).resolve()):
            return dist.metadata["Name"], direct
    return None


def _metadata_field(info: Path, field: str) -> str:
    for line in (info / "METADATA").read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith(f"{field}: "):
            return line.split(": ", 1)[1]
        if not line:
            break
    return "?"


def detectron2_origin(package_dir: Path) -> str:
    """How the detectron2 in ``package_dir`` came to be installed, in words."""
    if package_dir.parent.name == "detectron2-dist":
        info = _dist_info_owning(package_dir)
        wheel = f"{_metadata_field(info, 'Name')} {_metadata_field(info, 'Version')}" if info else "a wheel"
        return (f"wheel: {wheel} unpacked by gwdet's scripts/setup_env.sh (Python sources only; its "
                "compiled _C was built for another torch)")
    info = _dist_info_owning(package_dir)
    if info is not None:
        name = f"{_metadata_field(info, 'Name')} {_metadata_field(info, 'Version')}"
        direct_file = info / "direct_url.json"
        direct = json.loads(direct_file.read_text(encoding="utf-8")) if direct_file.is_file() else None
        if direct is None:
            return f"wheel: {name} from a package index"
        url = direct.get("url", "?")
        if "vcs_info" in direct:
            commit = direct["vcs_info"].get("commit_id", "?")
            return f"source build: {name} from {url} at commit {commit}"
        if "dir_info" in direct:
            return f"source build: {name} from the folder {url.removeprefix('file://')}"
        return f"archive: {name} from {url}"
    editable = _editable_owner(package_dir)
    if editable is not None:
        name, direct = editable
        return f"editable source install: {name} from {direct.get('url', '?').removeprefix('file://')}"
    return "source tree on sys.path (no installed distribution owns it)"


def _detectron2_section() -> dict[str, str]:
    try:
        import detectron2
    except Exception as err:
        return {"detectron2": f"{_error_text(err)} (gwdet needs detectron2: run make setup, see docs/install.md)"}
    package_dir = _module_dir(detectron2)
    section = {
        "detectron2": getattr(detectron2, "__version__", "?"),
        "detectron2 path": str(package_dir),
        "detectron2 origin": _guard(lambda: detectron2_origin(package_dir)),
    }
    section.update(_compiled_extension())
    section.update(_feature_probes())
    return section


def _compiled_extension() -> dict[str, str]:
    try:
        from detectron2 import _C
    except Exception as err:  # ImportError, or an OSError/undefined symbol from a mismatched build
        return {
            "detectron2._C": f"does not load ({type(err).__name__}: {_first_line(err)})",
            "features needing _C": "missing: " + "; ".join(f"{feature} ({where})" for feature, where in _C_FEATURES.items()),
            "to get _C": _BUILD_FROM_SOURCE,
        }
    details = []
    for probe, label in (("get_compiler_version", "compiler"), ("get_cuda_version", "CUDA")):
        function = getattr(_C, probe, None)
        if function is not None:
            details.append(f"{label} {_guard(_text_of(function))}")
    return {
        "detectron2._C": f"loads ({_C.__file__}{'; ' + ', '.join(details) if details else ''})",
        "features needing _C": "available: " + ", ".join(_C_FEATURES),
    }


def _feature_probes() -> dict[str, str]:
    """The detectron2 APIs whose presence differs between versions and that gwdet adapts to."""
    section = {}

    def data_import() -> str:
        importlib.import_module("detectron2.data")
        return "imports"

    section["detectron2.data"] = _guard(data_import)
    if "LINEAR" in section["detectron2.data"]:
        section["detectron2.data"] += (" -- this detectron2 (v0.6 or older) needs Pillow < 10: "
                                       "pip install 'Pillow<10'")

    def loader_seed() -> str:
        from gwdet.data.resumable import loader_accepts_seed

        if loader_accepts_seed():
            return "build_detection_train_loader(seed=) present"
        return ("build_detection_train_loader has no seed= (detectron2 v0.6 or older): gwdet seeds "
                "the loader's DataLoader itself")

    section["train loader seeding"] = _guard(loader_seed)

    def launch_path() -> str:
        import torch

        if torch.cuda.is_available():
            return "tools/train_net.py --num-gpus N: detectron2's launch (NCCL)"
        return "tools/train_net.py --num-gpus N on CPU: gwdet.engine.launch starts gloo processes (detectron2 v0.6's launch needs CUDA)"

    section["multi-process launch"] = _guard(launch_path)
    return section


# ---------------------------------------------------------------------------------------------
# gwdet and threads


def _gwdet_section() -> dict[str, str]:
    try:
        import gwdet
    except Exception as err:
        return {"gwdet": _error_text(err)}
    section = {
        "gwdet": getattr(gwdet, "__version__", "?"),
        "gwdet path": str(_module_dir(gwdet)),
    }
    names = getattr(gwdet, "known_norm_names", None)
    section["norm names"] = _guard(lambda: ", ".join(names())) if callable(names) else \
        "gwdet.known_norm_names is not available in this gwdet"
    section["gwdet backbones"] = _guard(_gwdet_backbones)
    section["other gwdet components"] = _guard(_other_registrations)
    section["execution plan"] = _guard(_execution_plan)
    return section


def _execution_plan() -> str:
    from gwdet.layers.plans import describe_plans

    return describe_plans()


def _gwdet_backbones() -> str:
    return ", ".join(_gwdet_registrations().get("BACKBONE_REGISTRY", [])) or "none registered"


def _gwdet_registrations() -> dict[str, list[str]]:
    """Names gwdet put into detectron2's model registries, per registry."""
    import detectron2.modeling as modeling

    found = {}
    for registry_name in ("BACKBONE_REGISTRY", "META_ARCH_REGISTRY", "PROPOSAL_GENERATOR_REGISTRY",
                          "ROI_HEADS_REGISTRY", "ROI_BOX_HEAD_REGISTRY", "ROI_MASK_HEAD_REGISTRY"):
        registry = getattr(modeling, registry_name, None)
        if registry is None:
            continue
        names = sorted(name for name, obj in registry
                       if getattr(obj, "__module__", "").split(".")[0] == "gwdet")
        if names:
            found[registry_name] = names
    return found


def _other_registrations() -> str:
    others = {k: v for k, v in _gwdet_registrations().items() if k != "BACKBONE_REGISTRY"}
    return "; ".join(f"{k}: {', '.join(v)}" for k, v in others.items()) or "none"


def _threads_section() -> dict[str, str]:
    section = {"os.cpu_count": str(os.cpu_count())}
    if hasattr(os, "sched_getaffinity"):
        section["CPUs this process may use"] = str(len(os.sched_getaffinity(0)))
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        section[variable] = os.environ.get(variable, "unset")
    try:
        import torch
    except Exception:
        return section
    section["torch.get_num_threads"] = str(torch.get_num_threads())
    section["torch.get_num_interop_threads"] = str(torch.get_num_interop_threads())
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if torch.get_num_threads() > usable:
        section["note"] = (f"torch uses {torch.get_num_threads()} threads on {usable} usable CPUs: "
                           "set OMP_NUM_THREADS to at most that")
    return section


def _environment_section() -> dict[str, str]:
    return {name: os.environ.get(name, "unset") for name in ("DETECTRON2_DATASETS", "GWDET_CACHE", "CUDA_VISIBLE_DEVICES")}


def collect_env_info() -> Report:
    """Everything this module reports, as ``{section: {key: value}}`` (all strings)."""
    return {
        "Python": _python_section(),
        "PyTorch": _torch_section(),
        "detectron2": _detectron2_section(),
        "gwdet": _gwdet_section(),
        "packages": _packages_section(),
        "threads": _threads_section(),
        "environment": _environment_section(),
    }


def format_report(report: Report) -> str:
    width = max(len(key) for section in report.values() for key in section)
    lines = []
    for title, section in report.items():
        lines.append(f"[{title}]")
        lines.extend(f"  {key.ljust(width)}  {value}" for key, value in section.items())
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gwdet.collect_env", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    report = collect_env_info()
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0


if __name__ == "__main__":
    if not __package__:  # run as a file (python gwdet/collect_env.py): works even when gwdet fails to import
        sys.path[0] = str(Path(__file__).resolve().parents[1])  # the checkout, not gwdet/ itself
    sys.exit(main())
