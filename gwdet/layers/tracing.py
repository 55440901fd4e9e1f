"""Which implementation a gwdet layer runs, depending on how PyTorch is looking at it.

1. Eager mode, ``torch.compile`` and ``torch.export``: GW runs the custom op
   ``gwdet::group_whitening`` (opaque to Dynamo and AOTAutograd, exported with its backward); BW
   and BGN their tensor code.
2. ``torch.jit.script``: the reference formulas (TorchScript cannot compile the op's Python kernels).
3. ``torch.jit.trace`` and ``torch.onnx.export``: the reference formulas, so that a deployment graph
   holds only ATen operators (it loads without gwdet; GW ZCA's ``linalg_eigh`` has no ONNX operator).

Flop counting (:mod:`gwdet.export.counting_ops`) swaps the layers for wrappers that call named ops;
the layers themselves never record a named op in a trace. The functions here are for eager Python
code; the layers call them outside TorchScript only.
"""
import torch


@torch.jit.unused
def onnx_exporting() -> bool:
    """True while ``torch.onnx.export`` (TorchScript-based or ``dynamo=True``) captures the model."""
    return bool(torch.onnx.is_in_onnx_export())


@torch.jit.unused
def recording_reference_graph() -> bool:
    """True while ``torch.jit.trace`` or ``torch.onnx.export`` records a graph: the layers then run
    their reference formulas, which are plain ATen ops."""
    return onnx_exporting() or torch.jit.is_tracing()
