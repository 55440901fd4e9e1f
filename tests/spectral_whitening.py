"""Whitening computed independently of gwdet, from a float64 eigendecomposition.

gwdet whitens with matrix iterations (ItN) or with its own ZCA kernels; the tests compare them with
what the same functions are on the spectrum of the covariance ``Sigma = D diag(lambda) D^T``:

* ZCA (GW Eq. 5, DBN Eq. 4): ``Sigma^{-1/2} = D diag(lambda^{-1/2}) D^T``;
* ItN (GW Eqs. 6-7): every iterate ``P_k`` is a polynomial in ``Sigma_N = Sigma / tr(Sigma)``, so
  it has the eigenvectors of ``Sigma`` and, on a normalised eigenvalue ``x = lambda / tr(Sigma)``,
  the eigenvalue ``p_k(x)`` of the scalar Newton iteration ``p_0 = 1``,
  ``p_k = (3 p_{k-1} - p_{k-1}^3 x) / 2``; the whitening matrix is ``P_T / sqrt(tr(Sigma))``.
  The whitened covariance ``P_T Sigma_N P_T`` then has eigenvalues ``y_T(x) = x p_T(x)^2``, i.e.
  ``y_0 = x``, ``y_k = y_{k-1} (3 - y_{k-1})^2 / 4``, which rise monotonically to 1.

Autograd differentiates these through ``torch.linalg.eigh``, which is exact for a spectrum without
repeated eigenvalues (its backward divides by eigenvalue gaps).
"""
import torch
from torch import Tensor

TINY_EPS = 1e-12  # a ridge small enough that its effect (eps / lambda) vanishes in exactness tests


def newton_factor(x: Tensor, T: int) -> Tensor:
    """``p_T(x)``: the eigenvalue of ItN's ``P_T`` on a normalised eigenvalue ``x`` of ``Sigma``."""
    p = torch.ones_like(x)
    for _ in range(T):
        p = (3.0 * p - p**3 * x) / 2.0
    return p


def itn_whitened_eigenvalue(x: Tensor, T: int) -> Tensor:
    """``y_T(x) = x p_T(x)^2``: the eigenvalue that ItN's whitened covariance has for ``x``."""
    return x * newton_factor(x, T) ** 2


def inverse_sqrt_by_eigh(cov: Tensor, method: str, T: int = 5) -> Tensor:
    """The whitening matrix of the batch of covariances ``cov`` ``(..., g, g)`` that ``method``
    (``"zca"``: exact; ``"itn"``: ``T`` Newton iterations) gives, from ``cov``'s spectrum."""
    eigenvalues, eigenvectors = torch.linalg.eigh(cov)
    if method == "zca":
        scale = eigenvalues.rsqrt()
    else:
        trace = eigenvalues.sum(-1, keepdim=True)
        scale = newton_factor(eigenvalues / trace, T) / trace.sqrt()
    return eigenvectors @ torch.diag_embed(scale) @ eigenvectors.transpose(-1, -2)


def row_covariance(rows: Tensor) -> Tensor:
    """``(1/m) X_C X_C^T`` of row-major data ``(..., g, m)`` (rows centred here), no ridge."""
    centred = rows - rows.mean(-1, keepdim=True)
    return centred @ centred.transpose(-1, -2) / rows.shape[-1]


def distance_from_identity(cov: Tensor) -> float:
    """Largest entry of ``|cov - I|`` over a batch of covariances ``(..., g, g)``."""
    return (cov - torch.eye(cov.shape[-1], dtype=cov.dtype)).abs().max().item()
