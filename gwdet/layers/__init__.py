"""Normalization layers of gwdet, in pure PyTorch (no detectron2 import here).

* :class:`GroupWhitening` / :func:`group_whitening`: group whitening (Huang et al., CVPR 2021);
* :class:`BatchWhitening`: decorrelated batch normalization (Huang et al., CVPR 2018);
* :class:`BatchGroupNorm`: batch group normalization with ghost batches and inference example
  weighing (Summers & Dinneen, ICLR 2020).
"""
from .batch_group_norm import BatchGroupNorm
from .batch_whitening import BatchWhitening
from .group_whitening import GroupWhitening, group_whitening

__all__ = ["BatchGroupNorm", "BatchWhitening", "GroupWhitening", "group_whitening"]
