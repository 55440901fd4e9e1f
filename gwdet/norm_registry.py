"""Norm names -> layer factories, installed into detectron2's ``get_norm``.

detectron2 components (ResNet, FPN, FastRCNNConvFCHead, MaskRCNNConvUpsampleHead, ...) build their
norms with ``get_norm(name, channels)``. :func:`install` replaces that function, in
``detectron2.layers`` and in every already-imported detectron2 module that bound it by name, with
one that first looks the name up in gwdet's registry. Modules imported later pick the replacement
up from ``detectron2.layers``, so the import order of gwdet and ``detectron2.modeling`` does not
matter.

Layer hyper-parameters come from the config being built: :func:`norm_config` makes ``cfg.MODEL``
the active source for the duration of a build, and ``build_model`` is wrapped to enter it. Outside
a build the defaults of :func:`gwdet.config.add_gwdet_config` apply. Nothing is kept after a build,
so two models built from different configs in one process get different layers.

Registering a name of your own::

    from gwdet import register_norm

    @register_norm("MyNorm")
    def _my_norm(channels: int, model_cfg) -> torch.nn.Module:
        return torch.nn.GroupNorm(model_cfg.GN.NUM_GROUPS, channels)
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import sys
from typing import Callable, Iterator

import torch
from detectron2.config import CfgNode, get_cfg

from gwdet.config import add_gwdet_config
from gwdet.layers import BatchGroupNorm, BatchWhitening, GroupWhitening

NormFactory = Callable[[int, CfgNode], torch.nn.Module]

# Names detectron2's own get_norm resolves (listed for error messages only).
DETECTRON2_NORMS = ("BN", "SyncBN", "FrozenBN", "GN", "nnSyncBN", "naiveSyncBN", "naiveSyncBN_N", "LN")

_FACTORIES: dict[str, NormFactory] = {}
_ACTIVE_MODEL_CFG: contextvars.ContextVar[CfgNode | None] = contextvars.ContextVar(
    "gwdet_active_model_cfg", default=None
)


def register_norm(name: str, factory: NormFactory | None = None):
    """Register ``factory(channels, model_cfg) -> nn.Module`` under ``name``.

    Usable as ``register_norm("X", fn)`` or as the decorator ``@register_norm("X")``. A name that
    is already registered is replaced (so re-importing a module is harmless).
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"register_norm: name must be a non-empty string, got {name!r}")

    def _register(fn: NormFactory) -> NormFactory:
        _FACTORIES[name] = fn
        return fn

    return _register if factory is None else _register(factory)


def known_norm_names() -> list[str]:
    """All names ``get_norm`` accepts once gwdet is installed, sorted."""
    return sorted(set(DETECTRON2_NORMS) | set(_FACTORIES))


@functools.lru_cache(maxsize=1)
def _default_model_cfg() -> CfgNode:
    cfg = add_gwdet_config(get_cfg())
    cfg.freeze()
    return cfg.MODEL


def active_model_cfg() -> CfgNode:
    """``cfg.MODEL`` of the build in progress, or gwdet's defaults outside a build."""
    model_cfg = _ACTIVE_MODEL_CFG.get()
    return model_cfg if model_cfg is not None else _default_model_cfg()


@contextlib.contextmanager
def norm_config(cfg: CfgNode) -> Iterator[None]:
    """Make ``cfg.MODEL`` the source of norm hyper-parameters inside the ``with`` block.

    A config without gwdet's keys gets them with their defaults (on a copy; ``cfg`` is untouched).
    """
    model_cfg = cfg.MODEL
    if "GW" not in model_cfg:
        complete = cfg.clone()
        complete.defrost()
        model_cfg = add_gwdet_config(complete).MODEL
    token = _ACTIVE_MODEL_CFG.set(model_cfg)
    try:
        yield
    finally:
        _ACTIVE_MODEL_CFG.reset(token)


def resolve_norm(norm, out_channels: int, detectron2_get_norm: Callable) -> torch.nn.Module | None:
    """gwdet's lookup first, then detectron2's; an unknown name gets a message listing the known."""
    if isinstance(norm, str) and norm in _FACTORIES:
        return _FACTORIES[norm](out_channels, active_model_cfg())
    try:
        return detectron2_get_norm(norm, out_channels)
    except KeyError:
        raise ValueError(
            f"Unknown norm name {norm!r}. Known names: {', '.join(known_norm_names())}. "
            "Fix the NORM value in the config, or register a new name with "
            "gwdet.register_norm(name, factory)."
        ) from None


def _rebind_everywhere(original: Callable, replacement: Callable) -> None:
    """Point every detectron2 module attribute bound to ``original`` at ``replacement``."""
    for module_name, module in list(sys.modules.items()):
        if module is None or not module_name.startswith("detectron2"):
            continue
        for attr, value in list(vars(module).items()):
            if value is original:
                setattr(module, attr, replacement)


def install() -> None:
    """Install gwdet's ``get_norm`` and config-aware ``build_model`` into detectron2. Idempotent."""
    import detectron2.layers.batch_norm as d2_batch_norm
    import detectron2.modeling.meta_arch.build as d2_build

    original_get_norm = d2_batch_norm.get_norm
    if not getattr(original_get_norm, "__gwdet__", False):

        @functools.wraps(original_get_norm)
        def get_norm(norm, out_channels):
            return resolve_norm(norm, out_channels, original_get_norm)

        get_norm.__gwdet__ = True
        _rebind_everywhere(original_get_norm, get_norm)

    original_build_model = d2_build.build_model
    if not getattr(original_build_model, "__gwdet__", False):

        @functools.wraps(original_build_model)
        def build_model(cfg):
            with norm_config(cfg):
                return original_build_model(cfg)

        build_model.__gwdet__ = True
        _rebind_everywhere(original_build_model, build_model)


# ---- gwdet's names ---------------------------------------------------------------------------


@register_norm("GW")
def _group_whitening_itn(channels: int, model_cfg: CfgNode) -> torch.nn.Module:
    gw = model_cfg.GW
    return GroupWhitening(channels, num_groups=gw.NUM_GROUPS, T=gw.T, eps=gw.EPS, method="itn")


@register_norm("GW_ZCA")
def _group_whitening_zca(channels: int, model_cfg: CfgNode) -> torch.nn.Module:
    gw = model_cfg.GW
    return GroupWhitening(channels, num_groups=gw.NUM_GROUPS, T=gw.T, eps=gw.EPS, method="zca")


@register_norm("GN")
def _group_norm(channels: int, model_cfg: CfgNode) -> torch.nn.Module:
    return torch.nn.GroupNorm(model_cfg.GN.NUM_GROUPS, channels)


def _batch_whitening(method: str) -> NormFactory:
    def factory(channels: int, model_cfg: CfgNode) -> torch.nn.Module:
        bw = model_cfg.BW
        return BatchWhitening(
            channels, group_size=bw.GROUP_SIZE, T=bw.T, eps=bw.EPS, momentum=bw.MOMENTUM, method=method
        )

    return factory


register_norm("BW", _batch_whitening("zca"))
register_norm("BW_ItN", _batch_whitening("itn"))


def _batch_group_norm(one_channel_per_group: bool) -> NormFactory:
    def factory(channels: int, model_cfg: CfgNode) -> torch.nn.Module:
        bgn = model_cfg.BGN
        return BatchGroupNorm(
            channels,
            num_groups=channels if one_channel_per_group else bgn.NUM_GROUPS,
            examples_per_group=bgn.EXAMPLES_PER_GROUP,
            eps=bgn.EPS,
            momentum=bgn.MOMENTUM,
            eval_example_weight=bgn.EVAL_EXAMPLE_WEIGHT,
        )

    return factory


register_norm("BGN", _batch_group_norm(one_channel_per_group=False))
register_norm("GhostBN", _batch_group_norm(one_channel_per_group=True))
