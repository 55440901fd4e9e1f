"""gwdet's layers as one named op each in a ``torch.jit`` trace, for flop counting.

Traced as they are, gwdet's layers record their reference formulas in plain ATen operators
(:mod:`gwdet.layers.tracing`), which fvcore counts by its own rules or not at all. Inside
:func:`trace_named_ops` each gwdet layer of a model is replaced, in place, by a
:class:`CountingWrapper` that records one named custom op (its type's :class:`CountingOp` in
:data:`COUNTING_OPS`: ``gwdet::group_whitening``, ``gwdet::batch_whitening``,
``gwdet::batch_group_norm``), which :mod:`gwdet.export.flops` counts with :mod:`gwdet.layers.cost`.
A subclass of a gwdet layer is recorded as the layer it derives from.

The ops are registered when this module is imported (``import gwdet.export`` does); a trace holding
them is for counting only, and running it needs gwdet loaded.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Dict, Iterator, List, Mapping, NamedTuple, Optional, Protocol, Sequence, Tuple, Type

import torch
from torch import Tensor, nn

from gwdet.errors import GwdetValueError
from gwdet.layers import BatchGroupNorm, BatchWhitening, GroupWhitening, batch_group_norm, batch_whitening
from gwdet.layers.group_whitening_function import fused_group_whitening
from gwdet.layers.tracing import onnx_exporting
from gwdet.norms import layer_types


class CountingOp(NamedTuple):
    """How a trace records the layers of one gwdet layer type: as the op ``op`` named ``name``,
    called ``op(x, *buffers, weight, bias, *settings)`` with the layer's buffers named in
    ``buffers``, its affine parameters and the values of its attributes named in ``settings``
    (``"training"``: the counting wrapper's training flag, which ``train()`` / ``eval()`` of the
    model set while the wrapper stands for the layer). An op that is not ``differentiable`` (no
    autograd kernel) is called under ``torch.no_grad()``."""

    name: str
    op: Callable[..., Tensor]
    buffers: Tuple[str, ...]
    settings: Tuple[str, ...]
    differentiable: bool


def counting_op(name: str, function: Callable[..., Tensor], buffers: Sequence[str], settings: Sequence[str],
                schema: str) -> CountingOp:
    """Register ``function`` (a layer's functional form) as the custom op ``name`` with the given
    schema, which mutates the ``buffers``: the one node its counting wrapper leaves in a trace.

    The op has a fake (shape) kernel and no autograd kernel (the wrappers call it under
    ``torch.no_grad()``); its output is a fresh contiguous tensor, as a custom op's must be (no
    alias of an input, the strides the fake kernel gives).
    """

    def implementation(*args) -> Tensor:
        out = function(*args)
        return out.clone() if out is args[0] else out.contiguous()

    op = torch.library.custom_op(name, implementation, mutates_args=tuple(buffers), schema=schema)
    op.register_fake(lambda x, *args: x.new_empty(x.shape))
    return CountingOp(name, op, tuple(buffers), tuple(settings), differentiable=False)


# gwdet's layer types -> how a trace records them (a subclass: as the first type it derives from).
# GW runs its own fused op, the op its eager forward runs too; the two batch layers' functional
# forms are registered here.
COUNTING_OPS: Dict[Type[nn.Module], CountingOp] = {
    GroupWhitening: CountingOp(
        "gwdet::group_whitening", fused_group_whitening, (), ("effective_num_groups", "T", "eps", "method"),
        differentiable=True,
    ),
    BatchWhitening: counting_op(
        "gwdet::batch_whitening",
        batch_whitening,
        ("running_mean", "running_whitening"),
        ("training", "momentum", "T", "eps", "method"),
        "(Tensor x, Tensor(a!) running_mean, Tensor(b!) running_whitening, Tensor? weight, Tensor? bias, "
        "bool training, float momentum, int T, float eps, str method) -> Tensor",
    ),
    BatchGroupNorm: counting_op(
        "gwdet::batch_group_norm",
        batch_group_norm,
        ("running_mean", "running_var"),
        ("training", "effective_num_groups", "examples_per_group", "eps", "momentum", "eval_example_weight"),
        "(Tensor x, Tensor(a!) running_mean, Tensor(b!) running_var, Tensor? weight, Tensor? bias, "
        "bool training, int groups, int examples_per_group, float eps, float momentum, "
        "float eval_example_weight) -> Tensor",
    ),
}


def counting_op_of_type(kind: type) -> Optional[CountingOp]:
    """The :class:`CountingOp` of the layer class ``kind``: that of the first type of
    :data:`COUNTING_OPS` it derives from; ``None`` for any other class."""
    return next((counting for layer_type, counting in COUNTING_OPS.items() if issubclass(kind, layer_type)), None)


class _CatalogueLayerOps(Mapping[Type[nn.Module], str]):
    """``{layer type: the op a trace records it as}`` for every layer type of the norm catalogue
    (:func:`gwdet.norms.layer_types`) that has a :class:`CountingOp`: gwdet's layers, and a
    registered name's subclass of one. Read from the catalogue at each access, so that a name
    registered later is in it."""

    def _current(self) -> Dict[Type[nn.Module], str]:
        found = {}
        for kind in layer_types():
            counting = counting_op_of_type(kind)
            if counting is not None:
                found[kind] = counting.name
        return found

    def __getitem__(self, kind: Type[nn.Module]) -> str:
        return self._current()[kind]

    def __iter__(self) -> Iterator[Type[nn.Module]]:
        return iter(self._current())

    def __len__(self) -> int:
        return len(self._current())


# layer type -> the op a trace records it as (exact types; gwdet.export.flops names the layers by it)
LAYER_OPS: Mapping[Type[nn.Module], str] = _CatalogueLayerOps()


class CountedLayer(Protocol):
    """What a counting wrapper uses of the layer it stands for (besides the attributes its
    :class:`CountingOp` names)."""

    training: bool

    def __call__(self, x: Tensor) -> Tensor: ...

    def validate_input(self, x: Tensor) -> None: ...


class CountingWrapper(nn.Module):
    """Stands for a gwdet layer in its model while the model is traced for counting.

    It registers the layer's parameters and buffers (the same tensors and names, so ``state_dict``
    keys do not change) and copies its training flag; the layer is kept as :attr:`wrapped`, not as
    a submodule. While ``torch.jit.trace`` records (not under ``torch.onnx.export``), it calls the
    op of :attr:`counting`; otherwise it runs the layer.
    """

    # Set in __init__, outside nn.Module's registration (``wrapped``) or through it (the affine);
    # declared here for the type checker, which otherwise sees them as nn.Module.__getattr__'s.
    wrapped: CountedLayer
    counting: CountingOp
    weight: Optional[Tensor]
    bias: Optional[Tensor]

    def __init__(self, layer: nn.Module, counting: CountingOp) -> None:
        super().__init__()
        self.__dict__["wrapped"] = layer  # a plain attribute: not a submodule
        self.counting = counting
        for name in ("weight", "bias"):
            self.register_parameter(name, getattr(layer, name))
        for name in counting.buffers:
            self.register_buffer(name, getattr(layer, name))
        self.train(layer.training)

    @property
    def op_name(self) -> str:
        return self.counting.name

    def forward(self, x: Tensor) -> Tensor:
        if not torch.jit.is_tracing() or onnx_exporting():
            return self.wrapped(x)
        self.wrapped.validate_input(x)
        return self.named_op(x)

    def named_op(self, x: Tensor) -> Tensor:
        """The op of :attr:`counting` on ``x``, with the layer's tensors and settings."""
        counting = self.counting
        args = (
            x,
            *(getattr(self, name) for name in counting.buffers),
            self.weight,
            self.bias,
            *(self.training if name == "training" else getattr(self.wrapped, name) for name in counting.settings),
        )
        if counting.differentiable:
            return counting.op(*args)
        with torch.no_grad():
            return counting.op(*args)

    def extra_repr(self) -> str:
        return f"{self.op_name} for {self.wrapped!r}"


def counting_op_of(module: nn.Module) -> Optional[CountingOp]:
    """The :class:`CountingOp` for ``module`` when it is a gwdet layer (or a subclass of one),
    else ``None``."""
    return counting_op_of_type(type(module))


@contextlib.contextmanager
def trace_named_ops(model: nn.Module) -> Iterator[Dict[nn.Module, nn.Module]]:
    """Inside this block ``torch.jit.trace`` of ``model`` records every gwdet layer as one named
    custom op (for flop counting, see :mod:`gwdet.export.flops`); on leaving it, even by an
    exception, the layers are back in their places and ``model`` is as it was.

    Layers are replaced where their parents hold them as submodules (attributes, ``Sequential``,
    ``ModuleList``, ``ModuleDict``), not in plain lists or dicts; a layer held under several names
    gets one wrapper. The block gets ``{wrapper: layer}``. ``model`` itself must not be a gwdet
    layer (trace a container holding it, e.g. ``nn.Sequential(layer)``).
    """
    if counting_op_of(model) is not None:
        raise GwdetValueError(
            f"trace_named_ops: the model is itself a gwdet layer ({type(model).__name__}) and cannot be "
            "replaced in place; pass a module that holds it, e.g. torch.nn.Sequential(layer)"
        )
    places = [
        (name.rpartition(".")[0], name.rpartition(".")[2], module, counting)
        for name, module in model.named_modules(remove_duplicate=False)
        if name and (counting := counting_op_of(module)) is not None
    ]
    wrappers: Dict[int, CountingWrapper] = {}
    replaced: List[Tuple[nn.Module, str, nn.Module]] = []
    try:
        for parent_name, attribute, layer, counting in places:
            parent = model.get_submodule(parent_name)
            if id(layer) not in wrappers:
                wrappers[id(layer)] = CountingWrapper(layer, counting)
            setattr(parent, attribute, wrappers[id(layer)])
            replaced.append((parent, attribute, layer))
        yield {wrappers[id(layer)]: layer for _, _, layer, _ in places}
    finally:
        for parent, attribute, layer in reversed(replaced):
            setattr(parent, attribute, layer)
