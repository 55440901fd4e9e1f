"""Flop counting of models with gwdet's layers by fvcore / detectron2, with gwdet's cost formulas.

A trace made inside :func:`gwdet.export.counting_ops.trace_named_ops` records each gwdet layer as
one named op, which :func:`flop_handles` counts with :mod:`gwdet.layers.cost` from the shapes and
constants in the trace. :class:`FlopCountAnalysis` is detectron2's analysis (inputs in
detectron2's format) with both in place::

    from gwdet.export import FlopCountAnalysis
    from fvcore.nn import flop_count_table

    flops = FlopCountAnalysis(model.eval(), [{"image": image}])
    print(flops.total(), flops.by_module()["backbone.bottom_up.stem.norm"])
    print(flop_count_table(flops, max_depth=3))

Counts are multiply-adds, fvcore's unit. Those of detection heads depend on the input (proposals,
detections), as with detectron2's own models.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Callable, Dict, List, Mapping

import torch
from torch import Tensor
from detectron2.utils.analysis import FlopCountAnalysis as Detectron2FlopCountAnalysis
from fvcore.nn.jit_handles import get_shape

from gwdet.errors import GwdetTypeError, GwdetValueError
from gwdet.export.counting_ops import counting_op_of, trace_named_ops
from gwdet.layers.cost import batch_group_norm_macs, batch_whitening_macs, group_whitening_macs

Handle = Callable[[List[Any], List[Any]], int]

# detectron2's FlopCountAnalysis counts a TracingAdapter whose attribute "model" is the model.
ADAPTER_PREFIX = "model"


def _constant(value: Any) -> Any:
    return value.toIValue()


def _group_whitening_flops(inputs: List[Any], outputs: List[Any]) -> int:
    # gwdet::group_whitening(x, weight, bias, groups, T, eps, method)
    shape = get_shape(inputs[0])
    return group_whitening_macs(shape, _constant(inputs[3]), _constant(inputs[4]), _constant(inputs[6]))


def _batch_whitening_flops(inputs: List[Any], outputs: List[Any]) -> int:
    # gwdet::batch_whitening(x, running_mean, running_whitening, weight, bias, training,
    #                        momentum, T, eps, method)
    shape = get_shape(inputs[0])
    group_size = get_shape(inputs[2])[-1]
    return batch_whitening_macs(
        shape, group_size, _constant(inputs[7]), _constant(inputs[9]), training=_constant(inputs[5])
    )


def _batch_group_norm_flops(inputs: List[Any], outputs: List[Any]) -> int:
    # gwdet::batch_group_norm(x, running_mean, running_var, weight, bias, training, groups,
    #                         examples_per_group, eps, momentum, eval_example_weight)
    shape = get_shape(inputs[0])
    affine = get_shape(inputs[3]) is not None
    computes_statistics = bool(_constant(inputs[5])) or _constant(inputs[10]) > 0.0
    return batch_group_norm_macs(shape, affine, computes_statistics)


def flop_handles() -> Dict[str, Handle]:
    """fvcore op handles for gwdet's named ops: ``analysis.set_op_handle(**flop_handles())``.

    They apply to traces recorded inside :func:`gwdet.export.counting_ops.trace_named_ops`;
    :class:`FlopCountAnalysis` does both.
    """
    return {
        "gwdet::group_whitening": _group_whitening_flops,
        "gwdet::batch_whitening": _batch_whitening_flops,
        "gwdet::batch_group_norm": _batch_group_norm_flops,
    }


def check_detector_inputs(model: torch.nn.Module, inputs: Any) -> None:
    """Refuse, for one of detectron2's meta-architectures (a model with ``preprocess_image``), a
    model in training mode (whose inference needs annotations) and inputs other than detectron2's
    (a list of dicts with an ``"image"`` tensor of shape (C, H, W), alone or as the one argument of a
    tuple): detectron2 would fail inside the model with an error that names neither."""
    if not hasattr(model, "preprocess_image"):  # a layer or a part: counted on the inputs given
        return
    if model.training:
        raise GwdetValueError(f"FlopCountAnalysis counts the inference of a {type(model).__name__}, and the model is in "
                              "training mode (whose forward needs annotations): call model.eval() first.")
    batch = inputs[0] if isinstance(inputs, tuple) and len(inputs) == 1 else inputs
    if not (isinstance(batch, list) and batch and all(isinstance(item, dict) and isinstance(item.get("image"), Tensor)
                                                        and item["image"].dim() == 3 for item in batch)):
        shown = f"a Tensor of shape {tuple(inputs.shape)}" if isinstance(inputs, Tensor) else type(inputs).__name__
        raise GwdetTypeError(f"FlopCountAnalysis({type(model).__name__}, inputs): give the inputs as the model takes "
                             "them, a list of dicts with an 'image' tensor of shape (C, H, W), e.g. [{'image': image}]; "
                             f"got {shown}.")


class FlopCountAnalysis(Detectron2FlopCountAnalysis):
    """detectron2's ``FlopCountAnalysis`` that counts gwdet's layers with :mod:`gwdet.layers.cost`.

    Same arguments and queries (``total``, ``by_module``, ``by_operator``,
    ``unsupported_ops``, ...; fvcore's ``flop_count_table`` / ``flop_count_str`` print it).
    """

    def __init__(self, model: torch.nn.Module, inputs: Any) -> None:
        check_detector_inputs(model, inputs)
        super().__init__(model, inputs)
        self.set_op_handle(**flop_handles())

    def _analyze(self):
        # fvcore traces the model lazily, on the first query: this is where the trace happens,
        # with the gwdet layers swapped for counting wrappers under their names. fvcore names the
        # modules of the trace by the aliases it took from the model at construction, keyed by
        # module object: each wrapper takes its layer's.
        if self._stats is not None:
            return self._stats
        aliases = self._aliases
        with trace_named_ops(self._model) as layers:
            self._aliases = {**aliases, **{wrapper: aliases[layer] for wrapper, layer in layers.items()}}
            try:
                return super()._analyze()
            finally:
                self._aliases = aliases

    def unsupported_ops(self, module_name: str = "") -> Counter[str]:
        """fvcore's :meth:`unsupported_ops`: the ops of ``module_name`` (default the whole model) that
        no handle counts, by name. Like every other query it runs the analysis first where no query
        has yet (fvcore's own refuses until one has)."""
        self.by_module_and_operator()  # computes the analysis once; later queries reuse it
        return super().unsupported_ops(module_name)

    def by_model_module(self) -> Counter[str]:
        """:meth:`by_module` keyed by the module names of the model given to the constructor
        (detectron2 wraps it in a ``TracingAdapter``, whose names start with ``model.``)."""
        counts: Counter[str] = Counter()
        for name, value in self.by_module().items():
            if name == ADAPTER_PREFIX:
                counts[""] = value
            elif name.startswith(ADAPTER_PREFIX + "."):
                counts[name[len(ADAPTER_PREFIX) + 1 :]] = value
        return counts


def gwdet_layer_names(model: torch.nn.Module) -> Dict[str, str]:
    """``module name -> op name`` of every gwdet layer in ``model``, a subclass of one included:
    the op a trace records it as (:func:`gwdet.export.counting_ops.counting_op_of`), so that its
    flops count as that op's."""
    return {
        name: counting.name
        for name, module in model.named_modules()
        if (counting := counting_op_of(module)) is not None
    }


def component_shares(
    analysis: FlopCountAnalysis, model: torch.nn.Module, components: Mapping[str, str]
) -> List[Dict[str, Any]]:
    """For each ``label -> module name`` of ``components`` (``""`` is the whole model): the
    flops of that module, the flops of the gwdet layers inside it by op, and their share.
    ``model`` is the model given to ``analysis``."""
    by_module = analysis.by_model_module()
    layers = gwdet_layer_names(model)
    rows = []
    for label, prefix in components.items():
        total = by_module.get(prefix, 0)
        inside: Counter = Counter()
        for name, op in layers.items():
            if not prefix or name == prefix or name.startswith(prefix + "."):
                inside[op] += by_module.get(name, 0)
        gwdet_total = sum(inside.values())
        rows.append(
            {
                "component": label,
                "module": prefix,
                "flops": total,
                "gwdet_flops": gwdet_total,
                "by_op": dict(inside),
                "share": gwdet_total / total if total else 0.0,
            }
        )
    return rows
