"""The shapes of one group-whitening call and the views the formulas take of its tensors.

An input ``(N, C, *spatial)`` is ``N`` samples of ``g`` rows (channel groups) by ``m = C/g HW``
columns (GW Eq. 8); the per-channel affine sees the same memory as ``(N, C, HW)``. Holds no
tensors, decides nothing about how the call is run (that is :mod:`gwdet.layers.plans`).
"""
import math

import torch
from torch import Tensor

from .common import statistics_dtype


def few_columns(values_per_sample: int, groups: int) -> bool:
    """Whether the call whitens through the ``m x m`` Gram matrix instead of the ``g x g``
    covariance: ``m <= g``, where the covariance has rank ``m - 1 < g`` (its centred rows sum to
    zero), so ZCA's ``eps^{-1/2}`` would amplify rounding along the missing directions; the Gram form
    raises the one such eigenvalue it has (:func:`~.group_whitening_function._gram`). At ``m < g`` it
    is also the smaller matrix."""
    return values_per_sample // groups <= groups


def keeps_covariance(values_per_sample: int, groups: int) -> bool:
    """Save the ``g x g`` covariance for the backward pass when it is at most a third of the
    sample's size; otherwise recompute it from the saved input."""
    return 3 * groups * groups <= values_per_sample


class GroupShapes:
    """Sizes of ``x`` ``(N, C, *spatial)`` cut into ``groups`` rows per sample."""

    def __init__(self, x: Tensor, groups: int) -> None:
        self.input_dtype = x.dtype
        self.dtype = statistics_dtype(x.dtype)
        self.samples = x.shape[0]
        self.channels = x.shape[1]
        self.values = math.prod(x.shape[1:])
        self.spatial = self.values // self.channels
        self.groups = groups
        self.m = self.values // groups  # columns of X_G
        self.one_channel_per_group = self.channels == groups
        self.few_columns = few_columns(self.values, groups)
        self.keeps_covariance = not self.few_columns and keeps_covariance(self.values, groups)

    @property
    def casts(self) -> bool:
        """Whether the input is cast to the statistics dtype (a temporary copy)."""
        return self.input_dtype != self.dtype

    @property
    def itemsize(self) -> int:
        """Bytes per value in the statistics dtype."""
        return torch.finfo(self.dtype).bits // 8

    def rows(self, t: Tensor) -> Tensor:
        """``(N, C, *spatial)`` -> ``(N, g, m)`` (Eq. 8), a view of a contiguous tensor."""
        return t.contiguous().view(self.samples, self.groups, self.m)

    def per_channel(self, t: Tensor) -> Tensor:
        """``(n, g, m)`` -> ``(n, C, HW)``: the same memory seen per channel."""
        return t.view(t.shape[0], self.channels, self.spatial)
