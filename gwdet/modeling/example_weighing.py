"""Inference example weighing applied to a trained batch-norm model, without retraining.

Summers & Dinneen ("Four Things Everyone Should Know to Improve Batch Normalization", ICLR 2020,
Sec. 3.1, Eq. 3): example weighing blends the example's own per-channel moments into the running
ones with weight ``alpha``: ``mu = alpha E[x] + (1 - alpha) m_x`` and
``sigma^2 = alpha E[x^2] + (1 - alpha) m_{x^2} - mu^2``. ``alpha = 0`` is ordinary batch-norm
inference, ``alpha = 1`` instance normalization.

:func:`apply_example_weighing` swaps every layer of :func:`weighable_types` (the classes of
detectron2's "BN" and "SyncBN", subclasses included) that keeps running statistics for a
:class:`gwdet.layers.BatchGroupNorm` with one channel per group and the same affine parameters,
running statistics and ``eps``; ``FrozenBatchNorm2d`` is left alone. In ``train()`` mode the
replacement normalizes over the whole batch per channel, as batch norm does (a ``momentum=None``
cumulative average becomes ``momentum=0.1``).
"""
from __future__ import annotations

import sys

from typing import Callable

import torch
from torch import nn

from gwdet.errors import GwdetValueError
from gwdet.layers import BatchGroupNorm
from gwdet.layers.common import check_unit_interval
from gwdet.norms import layer_types

DEFAULT_MOMENTUM = 0.1
# Example groups this large hold every batch, so BatchGroupNorm trains as batch norm.
WHOLE_BATCH = sys.maxsize


def example_weighted_norm(bn: nn.modules.batchnorm._BatchNorm, weight: float) -> BatchGroupNorm:
    """A :class:`BatchGroupNorm` computing ``bn``'s inference with example weight ``weight``.

    ``weight = 0`` gives ``bn``'s own inference output (same statistics, same formula up to
    float rounding). The result is on ``bn``'s device and in ``bn``'s training mode.
    """
    check_unit_interval("example_weighted_norm", "weight", weight)
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
        if bn.affine:
            norm.get_parameter("weight").copy_(bn.weight)
            norm.get_parameter("bias").copy_(bn.bias)
    return norm.train(bn.training)


def weighable_types() -> tuple[type[nn.modules.batchnorm._BatchNorm], ...]:
    """The classes example weighing applies to: the torch batch norms among the layer types of the
    catalogue's names that detectron2 builds and that normalize with batch statistics."""
    return tuple(kind for kind in layer_types(batch_statistics=True, detectron2=True)
                 if issubclass(kind, nn.modules.batchnorm._BatchNorm))


def weighable_norms(model: nn.Module) -> list[tuple[str, nn.modules.batchnorm._BatchNorm]]:
    """``(name, module)`` of every batch norm of ``model`` that example weighing applies to: a
    layer of :func:`weighable_types` (subclasses too) keeping running statistics."""
    kinds = weighable_types()
    return [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, kinds) and module.track_running_stats
    ]


def apply_example_weighing(model: nn.Module, weight: float) -> int:
    """Replace, in place, every layer :func:`weighable_norms` lists by its example-weighted
    version (:func:`example_weighted_norm`); return how many were replaced.

    Args:
        model: a trained model; evaluate it in ``eval()`` mode afterwards.
        weight: ``alpha`` of Eq. 3; ``ValueError`` unless it is in [0, 1], checked even when
            the model has no batch norm.

    To compare several weights, apply each one to its own copy of the trained model
    (``copy.deepcopy``): layers already replaced are not batch norms any more.
    """
    check_unit_interval("apply_example_weighing", "weight", weight)
    if isinstance(model, weighable_types()):
        raise GwdetValueError("apply_example_weighing replaces layers inside a model; for a single "
                              "batch norm layer use example_weighted_norm(bn, weight)")
    return replace_weighable_norms(model, lambda bn: example_weighted_norm(bn, weight))


def replace_weighable_norms(model: nn.Module, replacement: Callable[[nn.modules.batchnorm._BatchNorm], nn.Module]) -> int:
    """Replace, in place, every layer :func:`weighable_norms` lists by ``replacement(layer)``;
    return how many were replaced."""
    targets = weighable_norms(model)
    for name, bn in targets:
        parent_name, _, child_name = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child_name, replacement(bn))
    return len(targets)
