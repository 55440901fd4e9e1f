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

from .common import check_flag, check_int_at_least, check_iterations, is_whole_number, largest_divisor_at_most
from .whitening_matrix import check_whitening_method

from gwdet.errors import GwdetValueError

# g^3 coefficient of the ZCA whitening matrix (see the module docstring), as a fraction.
ZCA_CUBIC_MACS_NUMERATOR = 11
ZCA_CUBIC_MACS_DENOMINATOR = 2
ZCA_CUBIC_MACS = ZCA_CUBIC_MACS_NUMERATOR / ZCA_CUBIC_MACS_DENOMINATOR


def _samples_channels_positions(owner: str, shape: Sequence[int]):
    """``(N, C, S)`` of a layer input's ``shape``: a sequence of at least two whole sizes, none
    negative and ``C >= 1`` (``N = 0`` counts nothing; a zero spatial size too, where the layer
    takes it); ``ValueError``
    naming ``owner`` otherwise."""
    sizes = list(shape) if isinstance(shape, Sequence) and not isinstance(shape, str) else None
    if sizes is None or len(sizes) < 2 or not all(is_whole_number(size) and size >= 0 for size in sizes) \
            or sizes[1] < 1:
        raise GwdetValueError(
            f"{owner}: shape must be a layer input's shape (N, C) or (N, C, *spatial) of whole sizes >= 0 with "
            f"C >= 1, got {shape!r}; give x.shape of the input the layer sees")
    return int(sizes[0]), int(sizes[1]), math.prod(int(size) for size in sizes[2:])


def _check_whitening(owner: str, T: int, method: str) -> None:
    """``T`` and ``method`` checked as the whitening layers check theirs (``T`` whatever the method,
    as the layers do)."""
    check_iterations(owner, T)
    check_whitening_method(owner, method)


def whitening_matrix_macs(size: int, T: int, method: str) -> int:
    """Multiply-adds of one ``size x size`` inverse square root: ``T size^3`` for ``"itn"``,
    ``ZCA_CUBIC_MACS size^3`` (rounded down) for ``"zca"``; ``size`` and ``T`` integers >= 1,
    checked as the layers check theirs (``ValueError``)."""
    owner = "whitening_matrix_macs"
    check_int_at_least(owner, "size", size, 1)
    _check_whitening(owner, T, method)
    if method == "itn":
        return T * size**3
    return ZCA_CUBIC_MACS_NUMERATOR * size**3 // ZCA_CUBIC_MACS_DENOMINATOR


def group_whitening_macs(shape: Sequence[int], groups: int, T: int = 5, method: str = "itn") -> int:
    """``N (2 S C g + T g^3)`` (ItN; ZCA: ``ZCA_CUBIC_MACS g^3``) for an input of ``shape``.

    ``groups`` is the requested count; the count used is the layer's rule,
    ``largest_divisor_at_most(C, groups)``. The arguments are checked as :class:`~.GroupWhitening`
    checks its own (``ValueError``).
    """
    owner = "group_whitening_macs"
    samples, channels, positions = _samples_channels_positions(owner, shape)
    if positions == 0:  # GroupWhitening refuses such an input: a sample has no values to whiten
        raise GwdetValueError(f"{owner}: shape {list(shape)} has a zero spatial size, which GroupWhitening refuses (a "
                              "sample has no values to whiten); give the shape of an input the layer takes")
    check_int_at_least(owner, "groups", groups, 1)
    _check_whitening(owner, T, method)
    g = largest_divisor_at_most(channels, groups)
    return samples * (2 * positions * channels * g + whitening_matrix_macs(g, T, method))


def conv3x3_macs(shape: Sequence[int]) -> int:
    """``9 N S C^2``: a 3x3 convolution from ``C`` to ``C`` channels at the input's resolution."""
    samples, channels, positions = _samples_channels_positions("conv3x3_macs", shape)
    return 9 * samples * positions * channels * channels


def group_whitening_relative_cost(shape: Sequence[int], groups: int, T: int = 5, method: str = "itn") -> float:
    """GW over a 3x3 ``C -> C`` convolution at the same shape; for ItN
    ``2g / (9d) + T g^3 / (9 S d^2)`` (GW paper, Sec. 3). An input without values (a dimension of
    0) has no ratio: refused (``ValueError``)."""
    conv = conv3x3_macs(shape)
    if conv == 0:
        raise GwdetValueError(f"group_whitening_relative_cost: the input of shape {list(shape)} holds no values, so "
                              "neither GW nor the convolution costs anything and their ratio is undefined; give a shape "
                              "of sizes >= 1, e.g. (2, 256, 64, 64)")
    return group_whitening_macs(shape, groups, T, method) / conv


def batch_whitening_macs(
    shape: Sequence[int], group_size: int, T: int = 5, method: str = "zca", training: bool = True
) -> int:
    """Batch whitening of an input of ``shape`` with ``largest_divisor_at_most(C, group_size)``
    channels per group: ``2 M C k + (C / k) matrix(k)`` in training, ``M C k`` in evaluation. The
    arguments are checked as :class:`~.BatchWhitening` checks its own (``ValueError``)."""
    owner = "batch_whitening_macs"
    samples, channels, positions = _samples_channels_positions(owner, shape)
    check_int_at_least(owner, "group_size", group_size, 1)
    _check_whitening(owner, T, method)
    check_flag(owner, "training", training)
    k = largest_divisor_at_most(channels, group_size)
    values = samples * positions
    if not training:
        return values * channels * k
    return 2 * values * channels * k + (channels // k) * whitening_matrix_macs(k, T, method)


def batch_group_norm_macs(
    shape: Sequence[int], affine: bool = True, computes_statistics: bool = True
) -> int:
    """``(5 or 4) N C S`` when statistics are computed, ``(2 or 1) N C S`` otherwise (fvcore's
    convention for ``aten::batch_norm``; the larger factor with the affine). ``affine`` and
    ``computes_statistics`` are ``True`` or ``False`` (``ValueError`` otherwise, as the layer refuses
    ``affine='no'``)."""
    owner = "batch_group_norm_macs"
    samples, channels, positions = _samples_channels_positions(owner, shape)
    check_flag(owner, "affine", affine)
    check_flag(owner, "computes_statistics", computes_statistics)
    if computes_statistics:
        per_value = 5 if affine else 4
    else:
        per_value = 2 if affine else 1
    return per_value * samples * channels * positions
