"""Which implementation a gwdet layer runs, depending on how PyTorch is looking at it.

1. Eager mode, ``torch.compile`` and ``torch.export``: GW runs the custom op
   ``gwdet::group_whitening`` (fused forward, closed-form backward op); BW and BGN their tensor
   code. A ``torch.library`` custom op with registered fake (shape) and autograd kernels is
   opaque to Dynamo and AOTAutograd: it compiles with ``fullgraph=True`` and exports with its
   backward.
2. ``torch.jit.script``: the reference formulas (plain tensor ops); TorchScript compiles Python
   source, and the custom op's kernels are Python.
3. ``torch.jit.trace`` and ``torch.onnx.export``: the reference formulas. A deployment graph should
   hold only ATen operators: the saved TorchScript then loads in a process that never imported
   gwdet (or detectron2), and every operator maps onto ONNX. GW ZCA needs ``linalg_eigh``, which
   TorchScript has and ONNX does not (the ONNX export then stops with an error naming the ItN
   alternatives).

Flop counting is not the layers' business: :mod:`gwdet.export.counting_ops` registers one named
custom op per layer type (GW's is ``gwdet::group_whitening`` itself; ``gwdet::batch_whitening``
and ``gwdet::batch_group_norm`` are registered there) and, while it traces a model for fvcore,
replaces the model's gwdet layers with wrapper modules that call those ops
(:func:`gwdet.export.trace_named_ops`). The layers themselves never record a named op in a
trace.

The functions here are for eager Python code; the layers call them outside TorchScript only.
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
