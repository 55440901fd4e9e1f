"""gwdet's layers as one named op each in a ``torch.jit`` trace, for flop counting.

fvcore counts a traced graph operator by operator. Traced as they are, gwdet's layers record their
reference formulas (plain ATen operators, :mod:`gwdet.layers.tracing`): fvcore counts those it has
handles for by its own rules (ItN as its ``3T`` matrix products, not the paper's ``T g^3``) and
reports the others as unsupported. Inside
:func:`trace_named_ops`, the gwdet layers of a model are replaced, in place, by counting wrappers
whose forward, while ``torch.jit.trace`` records, calls one named custom op with the layer's
parameters, buffers and hyper-parameters; :mod:`gwdet.export.flops` counts each such node with
:mod:`gwdet.layers.cost`. On leaving the block every layer is back in its place.

* ``GroupWhitening`` (ItN and ZCA): ``gwdet::group_whitening``, GW's own fused op
  (:mod:`gwdet.layers.group_whitening_function`), which the layer's eager forward runs too;
* ``BatchWhitening``: ``gwdet::batch_whitening``, :func:`gwdet.layers.batch_whitening` registered
  here as an op, run under ``torch.no_grad()``;
* ``BatchGroupNorm``: ``gwdet::batch_group_norm``, :func:`gwdet.layers.batch_group_norm`
  registered here as an op, run under ``torch.no_grad()``.

The two ops of this module are registered when it is imported (``import gwdet.export`` does). A
trace holding them is for counting only: running it needs gwdet loaded.

Wrappers replace the layers where their parents hold them as submodules (attributes,
``Sequential``, ``ModuleList`` and ``ModuleDict`` entries), so a container of layers keeps working
unchanged: the :class:`gwdet.modeling.PerLevelNorm` of a RetinaNet head (one norm per FPN level)
calls the wrappers in its list. A layer held only in a plain Python list or dict is not replaced.
A wrapper holds the layer's parameters and buffers (the same tensors, under the same names, so the
model's ``state_dict`` keys do not change) and its training flag; a layer held under several names
gets one wrapper, placed under each of them. Outside ``torch.jit.trace``, and under
``torch.onnx.export``, a wrapper runs the layer it stands for.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Type, Union

import torch
from torch import Tensor, nn

from gwdet.errors import GwdetValueError
from gwdet.layers import BatchGroupNorm, BatchWhitening, GroupWhitening, batch_group_norm, batch_whitening
from gwdet.layers.group_whitening_function import fused_group_whitening
from gwdet.layers.tracing import onnx_exporting


def counting_op(name: str, function: Callable[..., Tensor], mutates_args: Sequence[str], schema: str):
    """Register ``function`` (a layer's functional form) as the custom op ``name`` with the given
    schema: the one node its counting wrapper leaves in a trace.

    The op has a fake (shape) kernel and no autograd kernel (the wrappers call it under
    ``torch.no_grad()``); its output is a fresh contiguous tensor, as a custom op's must be (no
    alias of an input, the strides the fake kernel gives).
    """

    def implementation(*args) -> Tensor:
        out = function(*args)
        return out.clone() if out is args[0] else out.contiguous()

    op = torch.library.custom_op(name, implementation, mutates_args=tuple(mutates_args), schema=schema)
    op.register_fake(lambda x, *args: x.new_empty(x.shape))
    return op


batch_whitening_op = counting_op(
    "gwdet::batch_whitening",
    batch_whitening,
    ("running_mean", "running_whitening"),
    "(Tensor x, Tensor(a!) running_mean, Tensor(b!) running_whitening, Tensor? weight, Tensor? bias, "
    "bool training, float momentum, int T, float eps, str method) -> Tensor",
)

batch_group_norm_op = counting_op(
    "gwdet::batch_group_norm",
    batch_group_norm,
    ("running_mean", "running_var"),
    "(Tensor x, Tensor(a!) running_mean, Tensor(b!) running_var, Tensor? weight, Tensor? bias, "
    "bool training, int groups, int examples_per_group, float eps, float momentum, "
    "float eval_example_weight) -> Tensor",
)


class CountingWrapper(nn.Module):
    """Stands for a gwdet layer in its model while the model is traced for counting.

    It registers the layer's parameters and buffers (the same tensors, the same names) and copies
    its training flag; the layer itself is kept as the attribute :attr:`wrapped`, not as a
    submodule, so the wrapper's module names are the layer's. Subclasses name their layer type,
    the op and the buffers, and call the op in :meth:`named_op`.
    """

    layer_type: Type[nn.Module]
    op_name: str
    buffer_names: Tuple[str, ...] = ()
    # Set in __init__, outside nn.Module's registration (``wrapped``) or through it (the affine);
    # declared here for the type checker, which otherwise sees them as nn.Module.__getattr__'s.
    wrapped: Union[GroupWhitening, BatchWhitening, BatchGroupNorm]
    weight: Optional[Tensor]
    bias: Optional[Tensor]

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.__dict__["wrapped"] = layer  # a plain attribute: not a submodule
        for name in ("weight", "bias"):
            self.register_parameter(name, getattr(layer, name))
        for name in self.buffer_names:
            self.register_buffer(name, getattr(layer, name))
        self.train(layer.training)

    def forward(self, x: Tensor) -> Tensor:
        if not torch.jit.is_tracing() or onnx_exporting():
            return self.wrapped(x)
        self.wrapped.validate_input(x)
        return self.named_op(x)

    def named_op(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def extra_repr(self) -> str:
        return f"{self.op_name} for {self.wrapped!r}"


class CountingGroupWhitening(CountingWrapper):
    """:class:`~gwdet.layers.GroupWhitening` (ItN or ZCA) as ``gwdet::group_whitening``, the op its
    eager forward runs."""

    layer_type = GroupWhitening
    op_name = "gwdet::group_whitening"
    wrapped: GroupWhitening

    def named_op(self, x: Tensor) -> Tensor:
        layer = self.wrapped
        return fused_group_whitening(
            x, self.weight, self.bias, layer.effective_num_groups, layer.T, layer.eps, layer.method
        )


class CountingBatchWhitening(CountingWrapper):
    """:class:`~gwdet.layers.BatchWhitening` as ``gwdet::batch_whitening``."""

    layer_type = BatchWhitening
    op_name = "gwdet::batch_whitening"
    buffer_names = ("running_mean", "running_whitening")
    wrapped: BatchWhitening
    running_mean: Tensor
    running_whitening: Tensor

    def named_op(self, x: Tensor) -> Tensor:
        layer = self.wrapped
        with torch.no_grad():
            return batch_whitening_op(
                x, self.running_mean, self.running_whitening, self.weight, self.bias,
                self.training, layer.momentum, layer.T, layer.eps, layer.method,
            )


class CountingBatchGroupNorm(CountingWrapper):
    """:class:`~gwdet.layers.BatchGroupNorm` as ``gwdet::batch_group_norm``."""

    layer_type = BatchGroupNorm
    op_name = "gwdet::batch_group_norm"
    buffer_names = ("running_mean", "running_var")
    wrapped: BatchGroupNorm
    running_mean: Tensor
    running_var: Tensor

    def named_op(self, x: Tensor) -> Tensor:
        layer = self.wrapped
        with torch.no_grad():
            return batch_group_norm_op(
                x, self.running_mean, self.running_var, self.weight, self.bias, self.training,
                layer.effective_num_groups, layer.examples_per_group, layer.eps, layer.momentum,
                layer.eval_example_weight,
            )


WRAPPERS: Tuple[Type[CountingWrapper], ...] = (
    CountingGroupWhitening, CountingBatchWhitening, CountingBatchGroupNorm,
)

# layer type -> the op a trace records it as
LAYER_OPS: Dict[Type[nn.Module], str] = {wrapper.layer_type: wrapper.op_name for wrapper in WRAPPERS}


def counting_wrapper_type(module: nn.Module) -> Optional[Type[CountingWrapper]]:
    """The wrapper class for ``module`` when it is a gwdet layer (or a subclass of one), else ``None``."""
    for wrapper in WRAPPERS:
        if isinstance(module, wrapper.layer_type):
            return wrapper
    return None


@contextlib.contextmanager
def trace_named_ops(model: nn.Module) -> Iterator[Dict[nn.Module, nn.Module]]:
    """Inside this block ``torch.jit.trace`` of ``model`` records every gwdet layer as one named
    custom op (for flop counting, see :mod:`gwdet.export.flops`); on leaving it, even by an
    exception, the layers are back in their places and ``model`` is as it was.

    The gwdet layers of ``model`` are replaced by counting wrappers (module docstring); the block
    gets ``{wrapper: layer}``. ``model`` itself must not be a gwdet layer (trace a container
    holding it, e.g. ``nn.Sequential(layer)``).
    """
    if counting_wrapper_type(model) is not None:
        raise GwdetValueError(
            f"trace_named_ops: the model is itself a gwdet layer ({type(model).__name__}) and cannot be "
            "replaced in place; pass a module that holds it, e.g. torch.nn.Sequential(layer)"
        )
    places = [
        (name.rpartition(".")[0], name.rpartition(".")[2], module, wrapper_type)
        for name, module in model.named_modules(remove_duplicate=False)
        if name and (wrapper_type := counting_wrapper_type(module)) is not None
    ]
    wrappers: Dict[int, CountingWrapper] = {}
    replaced: List[Tuple[nn.Module, str, nn.Module]] = []
    try:
        for parent_name, attribute, layer, wrapper_type in places:
            parent = model.get_submodule(parent_name)
            if id(layer) not in wrappers:
                wrappers[id(layer)] = wrapper_type(layer)
            setattr(parent, attribute, wrappers[id(layer)])
            replaced.append((parent, attribute, layer))
        yield {wrapper: wrapper.wrapped for wrapper in wrappers.values()}
    finally:
        for parent, attribute, layer in reversed(replaced):
            setattr(parent, attribute, layer)
