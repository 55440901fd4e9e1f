"""Constraint numbers of normalization (group_whitening_huang2021, Sec. 4, Table 1, Appendix D).

A normalizer ``phi`` makes its output ``X_hat in R^{d x m}`` satisfy a system of equations
``Upsilon_phi(X_hat) = 0``; the constraint number ``zeta(phi; X)`` is the number of independent
equations in it (Definition 1):

=========  ===================================  ==================================  ============
method     equations                            zeta(phi; X)                        range (Eq. 12)
=========  ===================================  ==================================  ============
BN         per feature: sum 0, sum of sq. m     2d (Eq. 11)                         m >= 2
BW         per group of k: X1 = 0,              d(k+3)/2 (Eqs. 20-21; k = d is BW)  m >= (k+3)/2
           X X^T = m I
GN         per sample and group of c = d/g:     2gm (Eq. 23)                        g <= d/2
           sum 0, sum of squares c
GW         per sample: X_G 1 = 0,               mg(g+3)/2 (Eqs. 27-28)              g <= (sqrt(8d+9)-3)/2
           X_G X_G^T = c I
=========  ===================================  ==================================  ============

Over a data set of N examples seen in batches of m, ``zeta(phi; D) = (N/m) zeta(phi; X)``. The
ranges come from Eq. 12, ``zeta(phi; X) <= md`` (no more independent equations than variables);
this counting condition is necessary. A solution exists only under the stricter
``m >= k + 1`` for BW and ``g (g + 1) <= d`` (``c >= g + 1``) for GW: the ``k`` (``g``) rows must
be orthogonal to each other and to the all-ones vector in ``R^m`` (``R^c``).

:func:`numerical_constraint_number` counts the independent equations directly: it writes down all
equations (the symmetric ``X X^T`` entries twice) and takes the rank of their Jacobian at a point
that satisfies them, the output of the normalizer itself on Gaussian input.

Every function checks its sizes with :func:`check_sizes`: ``d``, ``m``, ``g``, ``k`` and the data
set size ``N`` integers >= 1, ``g`` and ``k`` divisors of ``d``; anything else is refused
(``ValueError``) naming the function, the argument and its value.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from gwdet_lab.analysis.normalizers import make_norm

from gwdet.errors import GwdetTypeError, GwdetValueError
from gwdet.layers.common import check_int_at_least

METHODS = ("BN", "BW", "GN", "GW")


def check_sizes(
    owner: str, d: int, m: int | None = None, g: int | None = None, k: int | None = None, N: int | None = None
) -> None:
    """Refuse (``ValueError``, naming ``owner``, the argument and its value) a size that is not an
    integer >= 1 (``d`` features, batch size ``m``, data set size ``N``, group number ``g`` of GN/GW,
    group size ``k`` of BW), or a ``g`` or ``k`` that does not divide ``d``; ``None`` skips a size."""
    check_int_at_least(owner, "d", d, 1)
    for name, value in (("m", m), ("N", N), ("g", g), ("k", k)):
        if value is not None:
            check_int_at_least(owner, name, value, 1)
    for name, value, what in (("g", g, "the group number of GN/GW: the d features are split into g equal groups"),
                              ("k", k, "the group size of BW: the d features are whitened in groups of k")):
        if value is not None and d % value:
            raise GwdetValueError(f"{owner}: {name}={value} must divide d={d} ({what}); give a divisor of d such as "
                                  f"{' or '.join(map(str, divisors_near(d, value)))}, or another d")


def divisors_near(total: int, value: int) -> list[int]:
    """The divisors of ``total`` next to ``value``: the largest below it and the smallest above it
    (one of them where the other does not exist)."""
    below = [divisor for divisor in range(min(value, total), 0, -1) if total % divisor == 0][:1]
    above = [divisor for divisor in range(value + 1, total + 1) if total % divisor == 0][:1]
    return below + above


def constraint_number(method: str, d: int, m: int, g: int = 1, k: int | None = None) -> int:
    """``zeta(phi; X)`` of Table 1 for a batch of ``m`` examples with ``d`` features.

    ``g`` is the group number of GN/GW; ``k`` the group size of BW (``None``: ``k = d``).
    """
    check_sizes("constraint_number", d, m, g, k)
    k = d if k is None else k
    formulas = {"BN": 2 * d, "BW": d * (k + 3) // 2, "GN": 2 * g * m, "GW": m * g * (g + 3) // 2}
    return formulas[_check_method(method)]


def dataset_constraint_number(method: str, d: int, m: int, N: int, g: int = 1, k: int | None = None) -> float:
    """``zeta(phi; D)`` of Table 1: ``N / m`` batches of ``zeta(phi; X)`` each."""
    check_sizes("dataset_constraint_number", d, m, g, k, N)
    return N / m * constraint_number(method, d, m, g, k)


def counting_limit(method: str, d: int, k: int | None = None) -> float:
    """Table 1's range from Eq. 12: the least batch size m (BN, BW) or the largest group number g
    (GN, GW) with ``zeta(phi; X) <= md``."""
    check_sizes("counting_limit", d, k=k)
    k = d if k is None else k
    limits = {"BN": 2.0, "BW": (k + 3) / 2, "GN": d / 2, "GW": (math.sqrt(8 * d + 9) - 3) / 2}
    return limits[_check_method(method)]


def solvable_limit(method: str, d: int, k: int | None = None) -> float:
    """The range in which ``Upsilon_phi(X_hat) = 0`` has a solution at all (module docstring):
    least m for BN (2) and BW (``k + 1``), largest g for GN (``d / 2``) and GW (``g (g+1) <= d``)."""
    check_sizes("solvable_limit", d, k=k)
    k = d if k is None else k
    limits = {"BN": 2.0, "BW": float(k + 1), "GN": d / 2, "GW": (math.sqrt(4 * d + 1) - 1) / 2}
    return limits[_check_method(method)]


def in_counting_range(method: str, d: int, m: int, g: int = 1, k: int | None = None) -> bool:
    """Whether ``m`` (BN, BW) or ``g`` (GN, GW) lies in Table 1's range."""
    check_sizes("in_counting_range", d, m, g, k)
    return _inside(method, counting_limit(method, d, k), m, g)


def is_solvable(method: str, d: int, m: int, g: int = 1, k: int | None = None) -> bool:
    """Whether ``Upsilon_phi(X_hat) = 0`` has a solution at these sizes (:func:`solvable_limit`)."""
    check_sizes("is_solvable", d, m, g, k)
    return _inside(method, solvable_limit(method, d, k), m, g)


def _inside(method: str, limit: float, m: int, g: int) -> bool:
    return m >= limit if method in ("BN", "BW") else g <= limit


def constraint_residuals(method: str, x_hat: Tensor, g: int = 1, k: int | None = None) -> Tensor:
    """All equations ``Upsilon_phi(X_hat)`` as one vector, for ``x_hat`` of shape ``(m, d)``.

    Redundant equations are kept (both ``(i, j)`` and ``(j, i)`` entries of ``X X^T - n I``), so the
    number of independent ones has to be found numerically (:func:`numerical_constraint_number`).
    """
    if not isinstance(x_hat, Tensor):
        raise GwdetTypeError(f"constraint_residuals: x_hat must be a tensor of shape (m, d), got a "
                             f"{type(x_hat).__name__}; give the normalizer's output for m examples of d features")
    if x_hat.dim() != 2:
        raise GwdetValueError(f"constraint_residuals: x_hat must have shape (m, d), got shape {list(x_hat.shape)}; "
                              "give the normalizer's output for m examples of d features")
    m, d = x_hat.shape
    check_sizes("constraint_residuals", d, m, g, k)
    method = _check_method(method)
    if method in ("BN", "BW"):
        size = 1 if method == "BN" else (d if k is None else k)
        blocks = x_hat.T.reshape(d // size, size, m)  # feature groups x features x samples
        count = m
    else:
        size = d // g
        blocks = x_hat.reshape(m, g, size) if method == "GW" else x_hat.reshape(m * g, 1, size)
        count = size
    sums = blocks.sum(dim=-1)
    if method in ("BN", "GN"):
        second = (blocks**2).sum(dim=-1) - count
    else:
        identity = torch.eye(blocks.shape[1], dtype=x_hat.dtype)
        second = blocks @ blocks.transpose(-1, -2) - count * identity
    return torch.cat([sums.reshape(-1), second.reshape(-1)])


def satisfying_point(method: str, d: int, m: int, g: int = 1, k: int | None = None, seed: int = 0) -> Tensor:
    """A point on ``Upsilon_phi = 0``: the normalizer's output (eps 1e-12, float64) on Gaussian input.

    GW uses ZCA, whose output satisfies Eqs. 27-28 up to eps; ItN with T=5 only approximately.
    """
    check_sizes("satisfying_point", d, m, g, k)
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(m, d, generator=generator, dtype=torch.float64)
    kind = {"BN": "BN", "BW": "BW", "GN": "GN", "GW": "GW_ZCA"}[_check_method(method)]
    groups = d // (d if k is None else k) if method == "BW" else g
    norm = make_norm(kind, d, groups, affine=False, eps=1e-12).to(torch.float64).train()
    with torch.no_grad():
        return norm(x)


def numerical_constraint_number(
    method: str, d: int, m: int, g: int = 1, k: int | None = None, seed: int = 0
) -> tuple[int, float]:
    """(rank of the Jacobian of ``Upsilon_phi`` at :func:`satisfying_point`, max ``|Upsilon_phi|``).

    The residual says whether the point really satisfies the system (it does not outside the
    :func:`solvable_limit` range, where the rank then counts something else).
    """
    check_sizes("numerical_constraint_number", d, m, g, k)
    point = satisfying_point(method, d, m, g, k, seed)
    jacobian = torch.autograd.functional.jacobian(lambda x: constraint_residuals(method, x, g, k), point)
    rank = int(torch.linalg.matrix_rank(jacobian.reshape(jacobian.shape[0], -1)).item())
    residual = constraint_residuals(method, point, g, k).abs().max().item()
    return rank, residual


def _check_method(method: str) -> str:
    if method not in METHODS:
        raise GwdetValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    return method
