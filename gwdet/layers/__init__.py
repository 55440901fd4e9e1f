"""Normalization layers of gwdet, in pure PyTorch (no detectron2 import here).

* :class:`GroupWhitening` / :func:`group_whitening`: group whitening (Huang et al., CVPR 2021),
  run by the custom op ``gwdet::group_whitening``; :func:`group_whitening_reference` is the same
  function as plain tensor operations (what TorchScript and ONNX graphs record);
* :class:`BatchWhitening` / :func:`batch_whitening`: decorrelated batch normalization (Huang et
  al., CVPR 2018);
* :class:`BatchGroupNorm` / :func:`batch_group_norm`: batch group normalization with ghost
  batches and inference example weighing (Summers & Dinneen, ICLR 2020);
* :func:`update_running_statistics`: the running statistics of those and of torch's batch norms
  recomputed from data (``torch.optim.swa_utils.update_bn`` for gwdet's layers too).

Each records its settings in its state dict and refuses a state of other settings
(:mod:`gwdet.layers.settings_state`).

:mod:`gwdet.layers.cost` holds their analytic cost (the formulas; counting a model's flops with
them is :mod:`gwdet.export.flops`'s), :mod:`gwdet.layers.tracing` which implementation runs under
``torch.jit``, ``torch.onnx``, ``torch.compile`` and ``torch.export``, :mod:`gwdet.layers.plans`
how GW and BW run on each device (execution plans: ``cpu``, ``accelerator``, ``triton``;
``GWDET_GW_PLAN`` forces one), and :mod:`gwdet.layers.common` the argument checks and the
channel-group rule they share. Nothing here depends on :mod:`gwdet.export`.
"""
from .batch_group_norm import BatchGroupNorm, batch_group_norm
from .batch_whitening import BatchWhitening, batch_whitening
from .common import largest_divisor_at_most
from .group_whitening import GroupWhitening, group_whitening, group_whitening_reference
from .running_statistics import update_running_statistics

__all__ = [
    "BatchGroupNorm",
    "BatchWhitening",
    "GroupWhitening",
    "batch_group_norm",
    "batch_whitening",
    "group_whitening",
    "group_whitening_reference",
    "largest_divisor_at_most",
    "update_running_statistics",
]
