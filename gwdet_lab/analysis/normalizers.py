"""The normalizers the analyses compare, as modules acting on feature matrices of shape (m, d).

Convention (group_whitening_huang2021, Sec. 2): the paper writes a mini-batch as
``X in R^{d x m}`` (d features, m samples); here it is stored transposed, as an ``(m, d)`` tensor,
which is the ``(N, C)`` layout every layer accepts. Then

* ``BN`` (Eq. 1) and ``BW`` (Eq. 5, group-based with ``d / num_groups`` features per group)
  normalize each feature (group) over the m samples, using batch statistics in train mode;
* ``GN`` (Eq. 4) and ``GW`` / ``GW_ZCA`` (Eqs. 8-10) normalize each sample's d features,
  split into ``num_groups`` contiguous groups;
* ``none`` is the identity (the papers' "Base").

Every whitening layer is gwdet's own, built by :func:`gwdet.norm` under the same name (``BW``,
``GW``, ``GW_ZCA``; what the call leaves out takes gwdet's config defaults). GN and BN are torch's:
the analyses need their ``eps`` and ``affine``, which gwdet's names do not take.
"""
from __future__ import annotations

from torch import nn

import gwdet

from gwdet.errors import GwdetValueError
from gwdet.layers.settings_state import SettingsInState

NORM_KINDS = ("none", "BN", "BW", "GN", "GW", "GW_ZCA")
GROUPED_KINDS = ("GN", "GW", "GW_ZCA")


def make_norm(
    kind: str, num_features: int, num_groups: int = 1, affine: bool = True, T: int = 5, eps: float = 1e-5
) -> nn.Module:
    """A normalizer of kind ``kind`` for ``(m, num_features)`` inputs.

    Args:
        kind: one of :data:`NORM_KINDS`.
        num_features: d.
        num_groups: for GN/GW the number of feature groups g of each sample; for BW the number of
            whitening groups (``num_groups=1`` whitens all d features together, "BW"; ``d / 16``
            groups is the paper's "BW-C16", Fig. 1); ignored by ``none`` and ``BN``.
        affine: learnable per-feature scale and shift (initialised to 1 and 0).
        T: Newton iterations of ``GW`` (ItN, Eqs. 6-7); ZCA (``BW``, ``GW_ZCA``) has none.
        eps: the ridge / variance floor of every normalizer.
    """
    if kind not in NORM_KINDS:
        raise GwdetValueError(f"make_norm: kind must be one of {', '.join(NORM_KINDS)}, got {kind!r}")
    if num_groups < 1 or num_features % num_groups != 0:
        raise GwdetValueError(f"make_norm: num_groups={num_groups} must divide num_features={num_features}")
    if kind == "none":
        return nn.Identity()
    if kind == "BN":
        return nn.BatchNorm1d(num_features, eps=eps, affine=affine)
    if kind == "GN":
        return nn.GroupNorm(num_groups, num_features, eps=eps, affine=affine)
    if kind == "BW":
        params = {"group_size": num_features // num_groups}
    elif kind == "GW":
        params = {"num_groups": num_groups, "T": T}
    else:
        params = {"num_groups": num_groups}
    layer = gwdet.norm(kind, eps=eps, **params)(num_features)
    return layer if affine else _without_affine(layer)


def _without_affine(layer: nn.Module) -> nn.Module:
    """``layer`` as gwdet's layers are with ``affine=False``: ``weight`` and ``bias`` registered as
    ``None``. :func:`gwdet.norm` has no such switch (a norm in a detector always learns its affine),
    so the analyses, which look at the bare normalization, take it off here: a gwdet layer is built
    again with its settings and ``affine=False``."""
    if isinstance(layer, SettingsInState):
        return type(layer)(**{**layer.settings(), "affine": False})
    layer.register_parameter("weight", None)
    layer.register_parameter("bias", None)
    layer.affine = False
    return layer


def norm_label(kind: str, num_features: int, num_groups: int) -> str:
    """The papers' legend names: ``BN``, ``BW`` / ``BW-C16``, ``GN-g8``, ``GW-g8``, ``Base``."""
    if kind == "none":
        return "Base"
    if kind == "BN":
        return "BN"
    if kind == "BW":
        return "BW" if num_groups == 1 else f"BW-C{num_features // num_groups}"
    return f"{kind}-g{num_groups}"
