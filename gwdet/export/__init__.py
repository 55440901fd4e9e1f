"""Deploying and analysing models with gwdet's layers by detectron2's and PyTorch's own tools.

* :mod:`gwdet.export.deploy`: TorchScript and ONNX export, each file with its SHA-256 beside it;
* :mod:`gwdet.export.flops` and :mod:`gwdet.export.counting_ops`: flop counting with gwdet's cost
  formulas (:mod:`gwdet.layers.cost`);
* :mod:`gwdet.export.export_model` and :mod:`gwdet.export.analyze_model`: the command-line tools
  ``tools/deploy/export_model.py`` and ``tools/analyze_model.py``.
"""
from gwdet.errors import GwdetImportError

try:
    import detectron2.export  # noqa: F401
except ModuleNotFoundError as error:  # detectron2 0.6's export module imports caffe2
    raise GwdetImportError(
        f"gwdet.export needs detectron2's export module, which does not import here ({error}). "
        "detectron2 0.6 imports caffe2 there, which PyTorch no longer ships: use detectron2 0.7 "
        "or newer (the default set-up's wheel, or detectron2 built from main; docs/install.md)."
    ) from error

from gwdet.export.deploy import (  # noqa: E402
    ONNX_OPSET,
    DamagedExportError,
    export_model_onnx,
    export_onnx,
    export_torchscript,
    load_export,
    max_abs_difference,
    run_onnx,
    tracing_adapter,
    verify_export,
)
from gwdet.export.counting_ops import trace_named_ops  # noqa: E402
from gwdet.export.flops import FlopCountAnalysis, component_shares, flop_handles  # noqa: E402

__all__ = [
    "DamagedExportError",
    "FlopCountAnalysis",
    "ONNX_OPSET",
    "component_shares",
    "export_model_onnx",
    "export_onnx",
    "export_torchscript",
    "flop_handles",
    "load_export",
    "max_abs_difference",
    "run_onnx",
    "trace_named_ops",
    "tracing_adapter",
    "verify_export",
]
