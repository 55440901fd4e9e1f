"""Inference example weighing applied to a trained batch-norm model, without retraining.

Summers & Dinneen ("Four Things Everyone Should Know to Improve Batch Normalization", ICLR 2020,
Sec. 3.1, Eq. 3): example weighing blends the example's own per-channel moments into the running
ones with weight ``alpha``: ``mu = alpha E[x] + (1 - alpha) m_x`` and
``sigma^2 = alpha E[x^2] + (1 - alpha) m_{x^2} - mu^2``. ``alpha = 0`` is ordinary batch-norm
inference, ``alpha = 1`` instance normalization.

:func:`apply_example_weighing` swaps every layer of :func:`weighable_types` (torch's batch norms:
the classes of detectron2's "BN" and "SyncBN", BatchNorm1d/3d, subclasses included) that keeps running statistics for a
:class:`gwdet.layers.BatchGroupNorm` with one channel per group and the same affine parameters,
running statistics and ``eps``; ``FrozenBatchNorm2d`` is left alone (a model with nothing to
weigh is refused), and the layers an earlier call made get the new weight. A subclass whose class
(or object) has a ``forward`` of its own, not torch's or detectron2's, is refused, since the
replacement computes batch norm only; so is a layer with a ``torch.nn.utils.parametrize``
parametrization, which the replacement would not keep. gwdet's own BatchGroupNorm layers (BGN,
GhostBN) are not replaced: they weigh examples by their own ``eval_example_weight``. In
``train()`` mode the replacement normalizes over the whole batch per channel, as batch norm does
(a ``momentum=None`` cumulative average becomes ``momentum=0.1``, with a warning naming the layers).
"""
from __future__ import annotations

import logging
from typing import Callable

import torch
from detectron2.layers import FrozenBatchNorm2d
from torch import nn
from torch.nn.utils import parametrize
from torch.nn.utils.parametrize import type_before_parametrizations

from gwdet.modeling.module_hooks import move_hooks, state_dict_hooks
from gwdet.errors import GwdetTypeError, GwdetValueError, listed
from gwdet.layers import BatchGroupNorm
from gwdet.layers.batch_group_norm import WHOLE_BATCH
from gwdet.layers.common import check_unit_interval
from gwdet.norms import layer_types, shared_norm_layers

logger = logging.getLogger(__name__)

DEFAULT_MOMENTUM = 0.1


def example_weighted_norm(bn: nn.modules.batchnorm._BatchNorm, weight: float) -> BatchGroupNorm:
    """A :class:`BatchGroupNorm` computing ``bn``'s inference with example weight ``weight``.

    ``weight = 0`` gives ``bn``'s own inference output (same statistics, same formula up to
    float rounding). The result is on ``bn``'s device and in ``bn``'s training mode. A ``bn``
    without a bias (``bias=False``) gives a bias of zeros that does not require grad, so the
    norm computes and trains as ``bn`` does. One difference: a ``bn`` with ``momentum=None`` (a
    cumulative average of the batch statistics) gives a norm with ``momentum=0.1``, whose running
    statistics continue as a moving average if it trains further (``num_batches_tracked`` is not
    kept); a warning says so (gwdet's log). Inference is not affected. A ``bn`` with a ``forward``
    of its own (:func:`own_forward`) is refused (``GwdetTypeError``): the norm would not compute it; so is a
    ``bn`` with a ``torch.nn.utils.parametrize`` parametrization (:func:`parametrized_tensors`),
    which the norm would not keep.
    """
    norm = _example_weighted_norm(bn, weight)
    if bn.momentum is None:
        logger.warning(_cumulative_average_lost("example_weighted_norm", f"the {type(bn).__name__} has", 1))
    return norm


def _example_weighted_norm(bn: nn.modules.batchnorm._BatchNorm, weight: float) -> BatchGroupNorm:
    """:func:`example_weighted_norm` without its warning for ``momentum=None`` (which
    :func:`apply_example_weighing` gives once for all its layers)."""
    if not isinstance(bn, nn.modules.batchnorm._BatchNorm):
        raise GwdetTypeError(f"example_weighted_norm: bn must be a torch batch norm (BatchNorm1d/2d/3d, SyncBatchNorm) "
                             f"with running statistics, got {type(bn).__name__} {_shown(bn)}; example weighing blends "
                             "an example's moments into a batch norm's running ones, which other norms do not keep. "
                             "For a whole model use apply_example_weighing(model, weight).")
    check_unit_interval("example_weighted_norm", "weight", weight)
    if own_forward(bn) is not None:
        raise GwdetTypeError(f"example_weighted_norm: {type(bn).__name__} {_own_forward_words(bn)}, which the "
                             "example-weighted BatchGroupNorm does not compute: its own computation would be lost. "
                             "Give it a batch norm of torch's or detectron2's classes (or a subclass that does not "
                             "override forward) with the same statistics and affine parameters, or weigh this layer's "
                             "computation yourself.")
    tensors = parametrized_tensors(bn)
    if tensors:
        raise GwdetTypeError(f"example_weighted_norm: {type_before_parametrizations(bn).__name__} is parametrized "
                             f"(torch.nn.utils.parametrize computes its {listed(tensors, 4)}), which the "
                             f"example-weighted BatchGroupNorm would not keep: {_parametrization_lost(tensors[0])}. "
                             "Apply example weighing before registering the parametrization (then register it on "
                             "the BatchGroupNorm), or remove it first, keeping its current values: "
                             f"torch.nn.utils.parametrize.remove_parametrizations(bn, {tensors[0]!r}).")
    if isinstance(bn, nn.modules.lazy.LazyModuleMixin) and bn.has_uninitialized_params():
        raise GwdetValueError(f"example_weighted_norm: {type(bn).__name__} is a lazy module whose channels are not "
                              "known yet: run the model once on an input (or call its initialize_parameters) first")
    running_mean, running_var = bn.running_mean, bn.running_var
    if running_mean is None or running_var is None:
        raise GwdetValueError(f"example_weighted_norm: {type(bn).__name__} keeps no running statistics "
                              "(track_running_stats=False), so there is no inference to weigh")
    channels = bn.num_features
    norm = BatchGroupNorm(
        channels,
        num_groups=channels,
        examples_per_group=WHOLE_BATCH,
        eps=bn.eps,
        momentum=DEFAULT_MOMENTUM if bn.momentum is None else bn.momentum,
        eval_example_weight=weight,
        affine=bn.affine,
    )
    norm.to(device=running_mean.device, dtype=running_mean.dtype)
    # get_buffer / get_parameter: typed as tensors, where nn.Module's attribute access is not
    with torch.no_grad():
        norm.get_buffer("running_mean").copy_(running_mean)
        norm.get_buffer("running_var").copy_(running_var)
        for name in ("weight", "bias") if bn.affine else ():
            value = getattr(bn, name)
            if value is None:  # torch's norms take bias=False: a bias of zeros that training leaves so
                norm.get_parameter(name).fill_(1.0 if name == "weight" else 0.0).requires_grad_(False)
            else:
                norm.get_parameter(name).copy_(value)
    return norm.train(bn.training)


def _cumulative_average_lost(function: str, layers: str, count: int) -> str:
    """The warning that ``count`` batch norm(s), named in ``layers`` (with their verb), had
    ``momentum=None`` and that their example-weighted replacements keep a moving average."""
    one = count == 1
    return (f"{function}: {layers} momentum=None (running statistics kept as the cumulative average of every batch); "
            f"{'its' if one else 'their'} example-weighted replacement{'' if one else 's'} (BatchGroupNorm) "
            f"continue{'s its' if one else ' their'} running statistics as a moving average with momentum "
            f"{DEFAULT_MOMENTUM}, not the cumulative average, if the model trains further (num_batches_tracked is "
            "not kept). Inference is not affected. To train further with the cumulative average, train the model "
            "before applying example weighing; to keep another rate, set layer.momentum on the replacements.")


def own_forward(module: nn.Module) -> str | None:
    """Where ``module``'s ``forward`` comes from when it is neither torch's nor detectron2's: the
    class defining it (``"MyBN.forward"``) or ``"the object's forward"`` for one set on the object
    itself; ``None`` for a forward of torch or detectron2 (BatchNorm2d's, NaiveSyncBatchNorm's, a
    subclass that does not override it)."""
    if "forward" in vars(module):
        return "the object's forward"
    definer = next(kind for kind in type(module).__mro__ if "forward" in vars(kind))
    if definer.__module__.partition(".")[0] in ("torch", "detectron2"):
        return None
    return f"{definer.__qualname__}.forward"


def parametrized_tensors(module: nn.Module) -> list[str]:
    """The names of ``module``'s tensors that a ``torch.nn.utils.parametrize`` parametrization
    computes (``["weight"]``); ``[]`` for a module without one."""
    if not parametrize.is_parametrized(module):
        return []
    return [name for name, _ in module.get_submodule("parametrizations").named_children()]


def _parametrization_lost(tensor: str) -> str:
    """What the replacement of a batch norm whose ``tensor`` is parametrized would lose, in words."""
    return ("it would copy the values the parametrization computes into plain parameters, so training would no "
            "longer keep the parametrization's constraint, and the state dict would have other keys "
            f"({tensor} for parametrizations.{tensor}.original)")


def _own_forward_words(module: nn.Module) -> str:
    """``module``'s own forward (:func:`own_forward`) in words."""
    where = own_forward(module)
    return ("has a forward set on the object itself" if where == "the object's forward"
            else f"has a forward of its own ({where})")


def _shown(value: object) -> str:
    """``repr(value)``, cut short."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_model(function: str, model: object) -> None:
    """Refuse a ``model`` that is not an eager torch module (a scripted or traced one hides its layers)."""
    if not isinstance(model, nn.Module):
        raise GwdetTypeError(f"{function}: model must be a torch.nn.Module, got {type(model).__name__} "
                             f"{_shown(model)}; give it the model itself (e.g. a detectron2 model built by "
                             "build_model(cfg)).")
    scripted: list[str] = []
    outer: list[str] = []  # the scripted modules found, whose submodules are theirs
    for name, module in model.named_modules():
        if isinstance(module, torch.jit.ScriptModule) and not any(name.startswith(f"{o}.") or not o for o in outer):
            outer.append(name)
            if any(buffer.endswith("running_mean") for buffer, _ in module.named_buffers()):
                scripted.append(f"{name or 'the model'} ({module.original_name})")
    if scripted:
        raise GwdetTypeError(f"{function}: {listed(scripted, 3)} is scripted or traced (torch.jit) and holds batch "
                             "norms, which example weighing cannot replace inside a TorchScript module; apply it to "
                             "the eager model first, then script or trace the result.")


def weighable_types() -> tuple[type[nn.modules.batchnorm._BatchNorm], ...]:
    """The classes example weighing applies to: the torch batch norms among the layer types of the
    catalogue's names that detectron2 builds and that normalize with batch statistics, and torch's
    batch norms of other input dimensions (BatchNorm1d, BatchNorm3d: a model's own heads), which
    :func:`example_weighted_norm` replaces alike."""
    catalogue = tuple(kind for kind in layer_types(batch_statistics=True, detectron2=True)
                      if issubclass(kind, nn.modules.batchnorm._BatchNorm))
    return catalogue + (nn.BatchNorm1d, nn.BatchNorm3d)


def weighable_norms(model: nn.Module) -> list[tuple[str, nn.modules.batchnorm._BatchNorm]]:
    """``(name, module)`` of every batch norm of ``model`` that example weighing applies to: a
    layer of :func:`weighable_types` (subclasses too) keeping running statistics. A subclass with a
    ``forward`` of its own (:func:`own_forward`) or a parametrization (:func:`parametrized_tensors`)
    is listed, and :func:`apply_example_weighing` refuses it."""
    _check_model("weighable_norms", model)
    kinds = weighable_types()
    return [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, kinds) and module.track_running_stats
    ]


def apply_example_weighing(model: nn.Module, weight: float) -> int:
    """Replace, in place, every layer :func:`weighable_norms` lists by its example-weighted
    version (:func:`example_weighted_norm`), and set ``weight`` on the layers an earlier call made
    (:func:`example_weighted_layers`); return how many layers weigh with ``weight`` now.

    Args:
        model: a trained model; evaluate it in ``eval()`` mode afterwards.
        weight: ``alpha`` of Eq. 3; ``ValueError`` unless it is in [0, 1], checked even when
            the model has no batch norm.

    A model with no layer to weigh is refused (``GwdetValueError``), the model left as it is:
    detectron2's ``FrozenBatchNorm2d`` layers (fixed statistics, which example weighing does not
    mix), batch norms without running statistics, or no batch norm at all; :func:`weighable_norms`
    tells beforehand. gwdet's BatchGroupNorm layers (BGN, GhostBN) are left as they are: they
    weigh examples by their own ``eval_example_weight`` (``MODEL.BGN.EVAL_EXAMPLE_WEIGHT``), and a
    model with no other layer to weigh is refused naming that setting. A batch norm subclass with a
    ``forward`` of its own (:func:`own_forward`) is refused (``GwdetTypeError``), the model left
    as it is: the replacement would not compute it; subclasses that do not override ``forward``
    are replaced as torch's classes are. So is a batch norm with a ``torch.nn.utils.parametrize``
    parametrization (:func:`parametrized_tensors`), which the replacement would not keep. A replacement
    trains as its batch norm does but for one thing: a batch norm with ``momentum=None`` (a cumulative
    average) is replaced by one with ``momentum=0.1``, whose running statistics continue as a moving
    average if the model trains further (``num_batches_tracked`` is not kept); one warning (gwdet's
    log) names those layers. Inference is not affected. To compare
    several weights, apply each one to its own copy of the trained model (``copy.deepcopy``), or
    apply them one after the other to the same model: each call sets its weight on every weighed
    layer.
    """
    check_unit_interval("apply_example_weighing", "weight", weight)
    _check_model("apply_example_weighing", model)
    if isinstance(model, weighable_types()):
        raise GwdetValueError("apply_example_weighing replaces layers inside a model; for a single "
                              "batch norm layer use example_weighted_norm(bn, weight)")
    weighed, weighable = example_weighted_layers(model), weighable_norms(model)
    if not weighed and not weighable:
        raise GwdetValueError(_nothing_to_weigh(model, weight))
    cumulative = [name for name, bn in weighable if bn.momentum is None]
    replaced = replace_weighable_norms(model, lambda bn: _example_weighted_norm(bn, weight))
    for _, layer in weighed:
        layer.eval_example_weight = weight
    if cumulative:
        count = len(cumulative)
        layers = (f"the batch norm {cumulative[0]} has" if count == 1
                  else f"{count} batch norms ({listed(cumulative, 3)}) have")
        logger.warning(_cumulative_average_lost("apply_example_weighing", layers, count))
    return replaced + len(weighed)


def is_example_weighted(module: nn.Module) -> bool:
    """Whether ``module`` is a batch norm :func:`example_weighted_norm` made: a
    :class:`BatchGroupNorm` with one channel per group whose example groups hold every batch."""
    return isinstance(module, BatchGroupNorm) and module.replaces_batch_norm()


def example_weighted_layers(model: nn.Module) -> list[tuple[str, BatchGroupNorm]]:
    """``(name, layer)`` of every layer of ``model`` that :func:`example_weighted_norm` made
    (:func:`is_example_weighted`)."""
    return [(name, module) for name, module in model.named_modules() if is_example_weighted(module)]


def _nothing_to_weigh(model: nn.Module, weight: float) -> str:
    """Why ``model`` has no layer for :func:`apply_example_weighing` to weigh, and what to do."""
    frozen = [name or "the model" for name, module in model.named_modules() if isinstance(module, FrozenBatchNorm2d)]
    untracked = [name or "the model" for name, module in model.named_modules()
                 if isinstance(module, nn.modules.batchnorm._BatchNorm) and not module.track_running_stats]
    grouped = [(name or "the model", module) for name, module in model.named_modules()
               if isinstance(module, BatchGroupNorm)]
    if grouped:
        weights = sorted({float(module.eval_example_weight) for _, module in grouped})
        return (f"apply_example_weighing: {type(model).__name__} has no batch norm to weigh with weight {weight!r}: "
                f"its {len(grouped)} BatchGroupNorm layer(s) (BGN / GhostBN, at {listed([n for n, _ in grouped], 3)}) "
                f"weigh examples by their own eval_example_weight (now {listed([repr(w) for w in weights], 3)}): set "
                f"it there, MODEL.BGN.EVAL_EXAMPLE_WEIGHT {weight!r} in the config the model is built from (or "
                f"gwdet.norm('BGN', eval_example_weight={weight!r}) / ('GhostBN', ...)), or on the built layers: "
                f"layer.eval_example_weight = {weight!r} for each BatchGroupNorm of model.modules(). Example "
                "weighing replaces torch's batch norms (BatchNorm1d/2d/3d, SyncBatchNorm) only. The model is as it was.")
    found = []
    if frozen:
        found.append(f"{len(frozen)} detectron2 FrozenBatchNorm2d layer(s) (at {listed(frozen, 3)}), whose statistics "
                     "are fixed (a frozen affine transform) and which example weighing does not mix")
    if untracked:
        found.append(f"{len(untracked)} batch norm(s) keeping no running statistics (track_running_stats=False, at "
                     f"{listed(untracked, 3)}), which have no inference to weigh")
    what = (f"only {' and '.join(found)}" if found else
            "no batch norm layer at all (example weighing blends an example's moments into a batch norm's "
            "running ones, which other norms do not keep)")
    fix = ("build the model with trainable batch norms (NORM 'BN' or 'SyncBN', e.g. MODEL.RESNETS.NORM) to weigh them"
           if frozen else "train the model with batch norms that keep them (track_running_stats=True)" if untracked
           else "apply it to a model with batch norms")
    return (f"apply_example_weighing: {type(model).__name__} has no batch norm to weigh with weight {weight!r}: it "
            f"has {what}. Example weighing replaces torch's batch norms (BatchNorm1d/2d/3d, SyncBatchNorm) that keep "
            f"running statistics; {fix}, or check with weighable_norms(model) before applying it. The model is as "
            "it was.")


def replace_weighable_norms(model: nn.Module, replacement: Callable[[nn.modules.batchnorm._BatchNorm], nn.Module]) -> int:
    """Replace, in place, every layer :func:`weighable_norms` lists by ``replacement(layer)``;
    return how many were replaced. Every replacement is built before the first is put in, so a
    layer refused leaves the model as it was. The forward and backward hooks registered on a layer
    move to its replacement (their handles still remove them); a layer with state-dict hooks is
    refused, since its replacement's state dict differs. A layer object at several places of the
    model (``m.a = m.b = bn``, ``Sequential(conv, bn, conv, bn)``) is refused, since replacing it at
    one place would leave the others a batch norm. A layer with a ``forward`` of its own
    (:func:`own_forward`) is refused, since its replacement would not compute it; so is a layer with
    a ``torch.nn.utils.parametrize`` parametrization, which its replacement would not keep."""
    targets = weighable_norms(model)
    target_ids = {id(bn) for _, bn in targets}
    tied = [places for places in shared_norm_layers(model) if id(model.get_submodule(places[0])) in target_ids]
    if tied:
        first = tied[0]
        kind = type(model.get_submodule(first[0])).__name__
        raise GwdetValueError(
            f"One batch norm layer object ({kind}) sits at {len(first)} places, {listed(first, 3)}"
            + (f" ({len(tied) - 1} more such layer(s))" if len(tied) > 1 else "")
            + f": replacing it would put the replacement at one place and leave the {kind} at the others, so the "
            "model would be weighed at some of its norms only. Give each place its own layer (a copy: "
            "copy.deepcopy(layer), which keeps its weights and running statistics) before replacing the layers. "
            "The model is as it was.")
    own = [f"{name} ({type(bn).__name__}: {own_forward(bn)})" for name, bn in targets if own_forward(bn) is not None]
    if own:
        raise GwdetTypeError(
            f"the batch norm(s) {listed(own, 3)} have a forward of their own, not torch's or detectron2's: the "
            "example-weighted replacement (a BatchGroupNorm computing torch's batch norm) would not compute it, so "
            "their own computation would be lost. Apply example weighing to models whose batch norms are torch's or "
            "detectron2's classes (or subclasses that do not override forward), or convert those layers yourself. "
            "The model is as it was.")
    parametrized = [(name, tensors) for name, bn in targets if (tensors := parametrized_tensors(bn))]
    if parametrized:
        place, tensors = parametrized[0]
        shown = [f"{name} ({type_before_parametrizations(model.get_submodule(name)).__name__}: {listed(names, 4)})"
                 for name, names in parametrized]
        raise GwdetTypeError(
            f"the batch norm(s) {listed(shown, 3)} are parametrized (torch.nn.utils.parametrize computes those "
            f"tensors), which the example-weighted replacement (a BatchGroupNorm) would not keep: "
            f"{_parametrization_lost(tensors[0])}. Apply example weighing before registering the parametrizations "
            "(then register them on the replacements), or remove them first, keeping their current values: "
            f"torch.nn.utils.parametrize.remove_parametrizations(model.get_submodule({place!r}), {tensors[0]!r}), "
            "and so for each parametrized tensor. The model is as it was.")
    hooked = [f"{name} ({', '.join(state_dict_hooks(bn))})" for name, bn in targets if state_dict_hooks(bn)]
    if hooked:
        raise GwdetValueError(f"the batch norm(s) {listed(hooked, 3)} carry state-dict hooks (or a pruning), which are "
                              "written for the batch norm's state dict and weights, not its replacement's: remove them "
                              "(a hook's handle.remove(), prune.remove) before replacing the layers, and register them "
                              "on the replacements afterwards if needed. The model is as it was.")
    replacements = [replacement(bn) for _, bn in targets]
    for (name, bn), new in zip(targets, replacements, strict=True):
        move_hooks(bn, new)
        parent_name, _, child_name = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child_name, new)
    return len(targets)
