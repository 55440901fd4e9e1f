"""Analytic cost of gwdet's normalization layers: the one place these formulas live.

Unit: one multiply-add, the unit fvcore and detectron2 report as a "flop" (a 3x3 convolution with
``d`` input and ``d`` output channels over ``S`` positions counts ``9 S d^2``). Shapes are the
layer's input shape ``(N, C, *spatial)``; ``(N, C)`` counts as one position per sample.

Group whitening (GW paper, Sec. 3, "Computational complexity"): per sample, the ``g x g``
covariance and the whitening product each take ``S d g`` multiply-adds, ItN adds ``T g^3``, so
GW costs ``N (2 S d g + T g^3)`` and, relative to the 3x3 convolution, ``2g / (9d) + T g^3 /
(9 S d^2)``. The paper writes ZCA's matrix cost as ``O(g^3)``; here it is made concrete as
``ZCA_CUBIC_MACS g^3``: a symmetric eigendecomposition with eigenvectors takes about ``9 g^3``
floating-point operations (Golub & Van Loan, *Matrix Computations*, Sec. 8.3, symmetric QR
algorithm), i.e. ``4.5 g^3`` multiply-adds, plus ``g^3`` for ``D Lambda^{-1/2} D^T``. The
per-channel affine is not counted (the paper's formula leaves it out). These are the paper's
formulas, not a count of what :mod:`gwdet.layers.group_whitening_function` executes.

Batch whitening (DBN, groups of ``k`` channels over the ``M = N S`` values of the batch): in
training, covariance and whitening product take ``M C k`` each, plus the whitening matrix of each
of the ``C / k`` groups (``T k^3`` or ``ZCA_CUBIC_MACS k^3``); in evaluation only the product
with the running whitening matrix remains, ``M C k``.

Batch-group normalization counts as fvcore counts ``aten::batch_norm``: ``5`` (``4`` without
affine) per value when it computes statistics (training, or evaluation with inference example
weighing ``alpha > 0``), ``2`` (``1``) per value when it only applies running statistics.
"""
import math
from typing import Sequence

from .common import largest_divisor_at_most

# g^3 coefficient of the ZCA whitening matrix (see the module docstring), as a fraction.
ZCA_CUBIC_MACS_NUMERATOR = 11
ZCA_CUBIC_MACS_DENOMINATOR = 2
ZCA_CUBIC_MACS = ZCA_CUBIC_MACS_NUMERATOR / ZCA_CUBIC_MACS_DENOMINATOR


def _samples_channels_positions(shape: Sequence[int]):
    if len(shape) < 2:
        raise ValueError(f"expected a shape (N, C) or (N, C, *spatial), got {list(shape)}")
    return int(shape[0]), int(shape[1]), math.prod(int(size) for size in shape[2:])


def whitening_matrix_macs(size: int, T: int, method: str) -> int:
    """Multiply-adds of one ``size x size`` inverse square root: ``T size^3`` for ``"itn"``,
    ``ZCA_CUBIC_MACS size^3`` (rounded down) for ``"zca"``."""
    if method == "itn":
        return T * size**3
    if method == "zca":
        return ZCA_CUBIC_MACS_NUMERATOR * size**3 // ZCA_CUBIC_MACS_DENOMINATOR
    raise ValueError(f"method must be 'itn' or 'zca', got {method!r}")


def group_whitening_macs(shape: Sequence[int], groups: int, T: int = 5, method: str = "itn") -> int:
    """``N (2 S C g + T g^3)`` (ItN; ZCA: ``ZCA_CUBIC_MACS g^3``) for an input of ``shape``.

    ``groups`` is the requested count; the count used is the layer's rule,
    ``largest_divisor_at_most(C, groups)``.
    """
    samples, channels, positions = _samples_channels_positions(shape)
    g = largest_divisor_at_most(channels, groups)
    return samples * (2 * positions * channels * g + whitening_matrix_macs(g, T, method))


def conv3x3_macs(shape: Sequence[int]) -> int:
    """``9 N S C^2``: a 3x3 convolution from ``C`` to ``C`` channels at the input's resolution."""
    samples, channels, positions = _samples_channels_positions(shape)
    return 9 * samples * positions * channels * channels


def group_whitening_relative_cost(shape: Sequence[int], groups: int, T: int = 5, method: str = "itn") -> float:
    """GW over a 3x3 ``C -> C`` convolution at the same shape; for ItN
    ``2g / (9d) + T g^3 / (9 S d^2)`` (GW paper, Sec. 3)."""
    return group_whitening_macs(shape, groups, T, method) / conv3x3_macs(shape)


def batch_whitening_macs(
    shape: Sequence[int], group_size: int, T: int = 5, method: str = "zca", training: bool = True
) -> int:
    """Batch whitening of an input of ``shape`` with ``largest_divisor_at_most(C, group_size)``
    channels per group: ``2 M C k + (C / k) matrix(k)`` in training, ``M C k`` in evaluation."""
    samples, channels, positions = _samples_channels_positions(shape)
    k = largest_divisor_at_most(channels, group_size)
    values = samples * positions
    if not training:
        return values * channels * k
    return 2 * values * channels * k + (channels // k) * whitening_matrix_macs(k, T, method)


def batch_group_norm_macs(
    shape: Sequence[int], affine: bool = True, computes_statistics: bool = True
) -> int:
    """``(5 or 4) N C S`` when statistics are computed, ``(2 or 1) N C S`` otherwise (fvcore's
    convention for ``aten::batch_norm``; the larger factor with the affine)."""
    samples, channels, positions = _samples_channels_positions(shape)
    if computes_statistics:
        per_value = 5 if affine else 4
    else:
        per_value = 2 if affine else 1
    return per_value * samples * channels * positions
