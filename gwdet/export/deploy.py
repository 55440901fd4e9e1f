"""Exporting detectron2 models with gwdet's layers to TorchScript and ONNX, the way detectron2's
``tools/deploy/export_model.py`` does it (``--export-method tracing``).

The model is wrapped in detectron2's :class:`~detectron2.export.TracingAdapter` (a
``GeneralizedRCNN`` runs ``inference(..., do_postprocess=False)``: boxes, scores, classes and the
28x28 mask probabilities of each detection, in the input image's coordinates) and recorded with
``torch.jit.trace`` or the TorchScript-based ``torch.onnx.export``. While they record, gwdet's
layers run their reference formulas (:mod:`gwdet.layers.tracing`), so the files hold only ATen
(and torchvision) operators:

* a TorchScript file loads with ``import torch, torchvision`` alone (torchvision registers
  ``nms`` and ``roi_align``, as for any detectron2 model), no gwdet or detectron2;
* an ONNX file runs in onnxruntime. ZCA whitening (``GW_ZCA``, and ``BW`` in training mode)
  needs an eigendecomposition ONNX does not have: exporting it stops with an error naming the
  ItN alternatives (``GW``, ``BW_ItN``).

:func:`max_abs_difference` compares what the exported file computes with the eager model.
"""
from __future__ import annotations

import os
from typing import Any, List, Optional, Sequence, Tuple

import torch
from detectron2.export import TracingAdapter
from detectron2.modeling import GeneralizedRCNN

# ONNX opset of gwdet's exports (detectron2's STABLE_ONNX_OPSET_VERSION is 11).
ONNX_OPSET = 17


def _rcnn_inference(model: GeneralizedRCNN, inputs: List[dict]) -> List[dict]:
    # detectron2's export_model: do_postprocess=False returns the 28x28 mask probabilities per detection
    instances = model.inference(inputs, do_postprocess=False)[0]
    return [{"instances": instances}]


def tracing_adapter(model: torch.nn.Module, image: torch.Tensor) -> TracingAdapter:
    """``model`` (in evaluation mode) behind detectron2's ``TracingAdapter`` for one ``(3, H, W)``
    image: it takes the image tensor and returns a tuple of tensors."""
    model.eval()
    inference = _rcnn_inference if isinstance(model, GeneralizedRCNN) else None
    adapter = TracingAdapter(model, [{"image": image}], inference)
    return adapter.eval()


def export_torchscript(model: torch.nn.Module, image: torch.Tensor, path: str) -> Tuple[torch.jit.ScriptModule, TracingAdapter]:
    """Trace ``model`` on ``image`` and save it to ``path`` (``torch.jit.save``).

    Returns the traced module and the adapter (``adapter.outputs_schema(traced(image))`` rebuilds
    detectron2's outputs).
    """
    adapter = tracing_adapter(model, image)
    with torch.no_grad():
        # check_trace would run the model twice more to compare; callers compare with
        # max_abs_difference on inputs of their choice instead
        traced = torch.jit.trace(adapter, (image,), check_trace=False)
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    torch.jit.save(traced, path)
    return traced, adapter


def export_onnx(
    module: torch.nn.Module,
    args: Tuple[torch.Tensor, ...],
    path: str,
    opset: Optional[int] = None,
    dynamo: bool = False,
) -> None:
    """``torch.onnx.export`` of ``module(*args)`` into ``path``.

    By default the TorchScript-based exporter at :data:`ONNX_OPSET` (detectron2's choice:
    ``torch.export`` cannot capture a detectron2 R-CNN, with gwdet's layers or without); with
    ``dynamo=True`` the ``torch.export``-based one, at its own default opset unless ``opset`` is
    given (asked for 17, it converts its opset-18 graph down and, for ``ReduceMean``, fails and
    keeps 18).
    """
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    module.eval()
    if dynamo:
        torch.onnx.export(module, args, path, opset_version=opset, dynamo=True)
    else:
        torch.onnx.export(module, args, path, opset_version=opset or ONNX_OPSET, dynamo=False)


def export_model_onnx(model: torch.nn.Module, image: torch.Tensor, path: str, opset: int = ONNX_OPSET) -> TracingAdapter:
    """Export the whole ``model`` (detectron2's tracing adapter on ``image``) to ONNX."""
    adapter = tracing_adapter(model, image)
    export_onnx(adapter, (image,), path, opset)
    return adapter


def run_onnx(path: str, inputs: Sequence[torch.Tensor]) -> List[Any]:
    """Outputs (numpy arrays) of the ONNX file at ``path`` in onnxruntime on the CPU."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    # errors only: onnxruntime warns when its buffer reuse meets the data-dependent shapes of an
    # R-CNN (detections), which does not change the results
    options.log_severity_level = 3
    session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    names = [entry.name for entry in session.get_inputs()]
    # the exporter drops inputs the graph does not use; keep the order of the rest
    feeds = {name: tensor.detach().cpu().numpy() for name, tensor in zip(names, inputs)}
    return session.run(None, feeds)


def max_abs_difference(expected: Sequence[Any], actual: Sequence[Any]) -> float:
    """Largest absolute difference between two equally long sequences of tensors/arrays of equal
    shapes (a shape mismatch raises ``ValueError``)."""
    if len(expected) != len(actual):
        raise ValueError(f"{len(expected)} outputs expected, got {len(actual)}")
    largest = 0.0
    for index, (want, got) in enumerate(zip(expected, actual)):
        want = torch.as_tensor(want).detach().cpu()
        got = torch.as_tensor(got).detach().cpu()
        if want.shape != got.shape:
            raise ValueError(f"output {index}: shape {tuple(got.shape)}, expected {tuple(want.shape)}")
        if want.numel():
            largest = max(largest, (want.double() - got.double()).abs().max().item())
    return largest
