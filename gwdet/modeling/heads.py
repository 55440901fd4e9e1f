"""detectron2's heads, registered under gwdet's names, whose NORM carries the config's values.

detectron2's own heads pass their NORM string to ``get_norm``, which knows neither gwdet's names
nor ``MODEL.GW.*``. These subclasses change only ``from_config``: the NORM string becomes
:func:`gwdet.norm_from_config`'s callable. Everything else (layers, initialization, forward,
checkpoint keys) is detectron2's.

* ``MODEL.ROI_BOX_HEAD.NAME: "GWFastRCNNConvFCHead"`` (2fc and 4conv1fc box heads);
* ``MODEL.ROI_MASK_HEAD.NAME: "GWMaskRCNNConvUpsampleHead"``;
* ``MODEL.META_ARCHITECTURE: "GWRetinaNet"``, whose head keeps one norm module per FPN level for
  norms with batch statistics (:class:`GWRetinaNetHead`).
"""
from __future__ import annotations

from typing import Any, List

import torch
from detectron2.config import CfgNode, configurable
from detectron2.layers import ShapeSpec, get_norm
from detectron2.modeling import META_ARCH_REGISTRY
from detectron2.modeling.meta_arch.retinanet import RetinaNet, RetinaNetHead
from detectron2.modeling.roi_heads.box_head import ROI_BOX_HEAD_REGISTRY, FastRCNNConvFCHead
from detectron2.modeling.roi_heads.mask_head import ROI_MASK_HEAD_REGISTRY, MaskRCNNConvUpsampleHead
from torch import nn

from gwdet.norms import Norm, norm_from_config, norm_kind


class _ConvNormFromConfig:
    """Mixin for a detectron2 head taking ``conv_norm``: its NORM string becomes gwdet's callable."""

    @classmethod
    def from_config(cls, cfg: CfgNode, input_shape: ShapeSpec) -> dict:
        args = super().from_config(cfg, input_shape)
        args["conv_norm"] = norm_from_config(args["conv_norm"], cfg)
        return args


@ROI_BOX_HEAD_REGISTRY.register()
class GWFastRCNNConvFCHead(_ConvNormFromConfig, FastRCNNConvFCHead):
    """detectron2's ``FastRCNNConvFCHead`` with ``MODEL.ROI_BOX_HEAD.NORM`` resolved by gwdet."""


@ROI_MASK_HEAD_REGISTRY.register()
class GWMaskRCNNConvUpsampleHead(_ConvNormFromConfig, MaskRCNNConvUpsampleHead):
    """detectron2's ``MaskRCNNConvUpsampleHead`` with ``MODEL.ROI_MASK_HEAD.NORM`` resolved by gwdet."""


def has_batch_statistics(norm: Any) -> bool:
    """Whether ``norm`` (a name or a :class:`gwdet.Norm`) normalizes over several examples."""
    if isinstance(norm, Norm):
        return norm.batch_statistics
    return norm_kind(norm).batch_statistics if isinstance(norm, str) and norm else False


class PerLevelNorm(nn.Module):
    """One norm module per FPN level, used in turn: call ``i`` goes to module ``i % levels``.

    A RetinaNet head runs each of its convs once per level, level by level, so each module sees
    one level only and keeps that level's running statistics.
    """

    def __init__(self, norm: Any, channels: int, levels: int) -> None:
        super().__init__()
        self.levels = nn.ModuleList(get_norm(norm, channels) for _ in range(levels))
        self._next = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.levels[self._next](x)
        self._next = (self._next + 1) % len(self.levels)
        return out


class GWRetinaNetHead(RetinaNetHead):
    """detectron2's ``RetinaNetHead`` taking any norm of gwdet's; a norm with batch statistics gets
    one module per FPN level (:class:`PerLevelNorm`) instead of one shared by every level."""

    @configurable
    def __init__(self, *, input_shape: List[ShapeSpec], norm: Any = "", **kwargs: Any) -> None:
        if has_batch_statistics(norm) and norm not in ("BN", "SyncBN"):  # detectron2 handles those
            shared, levels = norm, len(input_shape)
            norm = lambda channels: PerLevelNorm(shared, channels, levels)  # noqa: E731
        super().__init__(input_shape=input_shape, norm=norm, **kwargs)

    @classmethod
    def from_config(cls, cfg: CfgNode, input_shape: List[ShapeSpec]) -> dict:
        args = super().from_config(cfg, input_shape)
        args["norm"] = norm_from_config(args["norm"], cfg)
        return args


@META_ARCH_REGISTRY.register()
class GWRetinaNet(RetinaNet):
    """detectron2's ``RetinaNet`` with :class:`GWRetinaNetHead` (``MODEL.RETINANET.NORM`` resolved
    by gwdet)."""

    @classmethod
    def from_config(cls, cfg: CfgNode) -> dict:
        without_norm = cfg.clone()
        without_norm.defrost()
        without_norm.MODEL.RETINANET.NORM = ""  # detectron2's head cannot make gwdet's norms
        args = super().from_config(without_norm)
        shapes = args["backbone"].output_shape()
        args["head"] = GWRetinaNetHead(cfg, [shapes[name] for name in args["head_in_features"]])
        return args
