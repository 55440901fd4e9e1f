"""detectron2's heads, registered under gwdet's names, whose NORM carries the config's values.

detectron2's own heads pass their NORM string to ``get_norm``, which knows neither gwdet's names
nor ``MODEL.GW.*``. These subclasses change only ``from_config``: the NORM string becomes
:func:`gwdet.norm_from_config`'s callable. Everything else (layers, initialization, forward,
checkpoint keys) is detectron2's. Each first makes sure :func:`gwdet.check_gwdet_config` accepted the
config (:func:`gwdet.config_checks.ensure_checked`: once per config content), so a config
that sends a gwdet norm to one of detectron2's components elsewhere in the model stops with the
message naming every key to change, not with detectron2's ``KeyError``.

* ``MODEL.ROI_BOX_HEAD.NAME: "GWFastRCNNConvFCHead"`` (2fc and 4conv1fc box heads; Cascade R-CNN's
  stages too);
* ``MODEL.ROI_MASK_HEAD.NAME: "GWMaskRCNNConvUpsampleHead"``;
* ``MODEL.ROI_HEADS.NAME: "GWRes5ROIHeads"`` (C4 models: the res5 stage with ``MODEL.RESNETS.NORM``
  and ``GW_NORM`` at the block positions of ``GW_POSITIONS``);
* ``MODEL.SEM_SEG_HEAD.NAME: "GWSemSegFPNHead"`` (semantic FPN, panoptic FPN);
* ``MODEL.META_ARCHITECTURE: "GWRetinaNet"``, whose head keeps one norm module per FPN level for
  norms with batch statistics (:class:`GWRetinaNetHead`).
"""
from __future__ import annotations

import logging
import threading
from typing import Any, List

import torch
from detectron2.config import CfgNode, configurable
from detectron2.layers import ShapeSpec, get_norm
from detectron2.modeling import META_ARCH_REGISTRY, ROI_HEADS_REGISTRY, SEM_SEG_HEADS_REGISTRY, Backbone, build_backbone
from detectron2.modeling.anchor_generator import build_anchor_generator
from detectron2.modeling.box_regression import Box2BoxTransform
from detectron2.modeling.matcher import Matcher
from detectron2.modeling.meta_arch.retinanet import RetinaNet, RetinaNetHead
from detectron2.modeling.meta_arch.semantic_seg import SemSegFPNHead
from detectron2.modeling.roi_heads.box_head import ROI_BOX_HEAD_REGISTRY, FastRCNNConvFCHead
from detectron2.modeling.roi_heads.mask_head import ROI_MASK_HEAD_REGISTRY, MaskRCNNConvUpsampleHead
from detectron2.modeling.roi_heads.roi_heads import Res5ROIHeads
from torch import nn

from gwdet.errors import GwdetRuntimeError, GwdetValueError
from gwdet.config import config_value
from gwdet.config_checks import ensure_checked
from gwdet.modeling.backbone import PLACEHOLDER_NORM, convs_with_norm
from gwdet.norms import Norm, check_detectron2_buildable, norm_from_config, norm_record
from gwdet.positions import BLOCK_CONV_OF_POSITION, parse_gw_positions


class _NormFromConfig:
    """Mixin for a detectron2 head configured by ``from_config(cfg, input_shape)``: the NORM string
    it passes as ``norm_argument`` becomes gwdet's callable with the config's values."""

    norm_argument = "conv_norm"
    section = ""  # the head's config section, where a NORM may have no convolution to go to

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """The head built from its arguments (or, through detectron2's ``configurable``, from a
        config); a norm name only gwdet builds, passed by hand, is refused by name."""
        check_detectron2_buildable(f"{type(self).__name__}: {self.norm_argument}", kwargs.get(self.norm_argument))
        super().__init__(*args, **kwargs)

    @classmethod
    def from_config(cls, cfg: CfgNode, input_shape: Any) -> dict:
        ensure_checked(cfg)
        # a mixin: the detectron2 head after it in each subclass's MRO defines from_config
        args = super().from_config(cfg, input_shape)  # type: ignore[misc]
        args[cls.norm_argument] = norm_from_config(args[cls.norm_argument], cfg)
        if cls.section:
            warn_unused_norm(cfg, cls.section)
        return args


def warn_unused_norm(cfg: CfgNode, section: str) -> None:
    """A warning when the head of config section ``section`` (e.g. ``MODEL.ROI_BOX_HEAD``) has a
    NORM but no convolution to put it after (``NUM_CONV 0``): detectron2's heads normalize only
    their convolutions, so the model has no such norm."""
    head = config_value(cfg, section)
    if head.NORM and head.NUM_CONV == 0:
        logging.getLogger(__name__).warning(
            f"{section}.NORM is {head.NORM!r}, but {section}.NUM_CONV is 0: the head has no convolution to "
            f"normalize, so the model has no {head.NORM} there. Give the head convolutions ({section}.NUM_CONV, "
            f"e.g. 4 for a 4conv1fc box head) or set {section}.NORM \"\".")


@ROI_BOX_HEAD_REGISTRY.register()
class GWFastRCNNConvFCHead(_NormFromConfig, FastRCNNConvFCHead):
    """detectron2's ``FastRCNNConvFCHead`` with ``MODEL.ROI_BOX_HEAD.NORM`` resolved by gwdet."""

    section = "MODEL.ROI_BOX_HEAD"


@ROI_MASK_HEAD_REGISTRY.register()
class GWMaskRCNNConvUpsampleHead(_NormFromConfig, MaskRCNNConvUpsampleHead):
    """detectron2's ``MaskRCNNConvUpsampleHead`` with ``MODEL.ROI_MASK_HEAD.NORM`` resolved by gwdet."""

    section = "MODEL.ROI_MASK_HEAD"


@SEM_SEG_HEADS_REGISTRY.register()
class GWSemSegFPNHead(_NormFromConfig, SemSegFPNHead):
    """detectron2's ``SemSegFPNHead`` (semantic and panoptic FPN) with ``MODEL.SEM_SEG_HEAD.NORM``
    resolved by gwdet."""

    norm_argument = "norm"


@ROI_HEADS_REGISTRY.register()
class GWRes5ROIHeads(Res5ROIHeads):
    """detectron2's ``Res5ROIHeads`` (C4 models), whose res5 stage has ``MODEL.RESNETS.NORM``
    everywhere and ``MODEL.RESNETS.GW_NORM`` at the block positions (B1/B2/B3) of
    ``MODEL.RESNETS.GW_POSITIONS``, with the config's values, as gwdet's backbones place them in
    res2-res4. Built by detectron2 (same layers, initialization and keys), then the norms replaced."""

    @classmethod
    def from_config(cls, cfg: CfgNode, input_shape: Any) -> dict:
        ensure_checked(cfg)
        base_norm = norm_from_config(cfg.MODEL.RESNETS.NORM, cfg)
        stock = cfg
        if not isinstance(base_norm, str):
            stock = cfg.clone()
            stock.defrost()
            stock.MODEL.RESNETS.NORM = PLACEHOLDER_NORM
        args = super().from_config(stock, input_shape)
        res5 = args["res5"]
        if not isinstance(base_norm, str):
            for conv in convs_with_norm(res5):
                conv.norm = get_norm(base_norm, conv.out_channels)
        positions = parse_gw_positions(cfg.MODEL.RESNETS.GW_POSITIONS)
        gw_norm = norm_from_config(cfg.MODEL.RESNETS.GW_NORM, cfg)
        for block in res5:
            for position, conv_name in BLOCK_CONV_OF_POSITION.items():
                if position in positions:
                    conv = getattr(block, conv_name)
                    conv.norm = get_norm(gw_norm, conv.out_channels)
        return args


def has_batch_statistics(norm: Any) -> bool:
    """Whether ``norm`` (a name or a :class:`gwdet.Norm`) normalizes over several examples."""
    if isinstance(norm, Norm):
        return norm.batch_statistics
    return norm_record(norm).batch_statistics if isinstance(norm, str) and norm else False


class PerLevelNorm(nn.Module):
    """One norm module per FPN level, used in turn: call ``i`` goes to module ``i % levels``, counted
    from the start of the head's forward (:meth:`GWRetinaNetHead.forward`) in each thread (a model
    shared by the threads of an inference server counts each forward on its own).

    A RetinaNet head runs each of its convs once per level, level by level, so each module sees
    one level only and keeps that level's running statistics. A recomputation during the backward
    pass (activation checkpointing) would take the modules in another order, and is refused.
    """

    def __init__(self, norm: Any, channels: int, levels: int) -> None:
        super().__init__()
        self.levels = nn.ModuleList(get_norm(norm, channels) for _ in range(levels))
        self._next: dict[int, int] = {}  # thread identifier -> the level of its next call

    def restart(self) -> None:
        """The next call of this thread is the first level's."""
        self._next.pop(threading.get_ident(), None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and _in_backward_pass():
            raise GwdetRuntimeError(
                "PerLevelNorm (a GWRetinaNetHead's norm with batch statistics, one module per FPN level) is run again "
                "during the backward pass, as activation checkpointing recomputes a forward: it takes its levels' "
                "modules in call order, which a recomputation does not keep, so each level would be normalized by "
                "another's. Leave the head's subnets out of activation checkpointing, or use a norm without batch "
                "statistics there (GW, GN).")
        thread = threading.get_ident()
        level = self._next.get(thread, 0)
        out = self.levels[level](x)
        self._next[thread] = (level + 1) % len(self.levels)
        return out


def _in_backward_pass() -> bool:
    """Whether autograd is running a backward pass in this thread (where activation checkpointing
    recomputes forwards)."""
    current_task = getattr(torch._C, "_current_graph_task_id", None)
    return current_task is not None and current_task() != -1


class GWRetinaNetHead(RetinaNetHead):
    """detectron2's ``RetinaNetHead`` taking any norm of gwdet's; a norm with batch statistics gets
    one module per FPN level (:class:`PerLevelNorm`) instead of one shared by every level."""

    @configurable
    def __init__(self, *, input_shape: List[ShapeSpec], norm: Any = "", **kwargs: Any) -> None:
        check_detectron2_buildable("GWRetinaNetHead: norm", norm)
        detectron2_per_level = isinstance(norm, str) and bool(norm) and norm_record(norm).detectron2_per_level
        if has_batch_statistics(norm) and not detectron2_per_level:  # detectron2's head handles those
            shared, levels = norm, len(input_shape)
            norm = lambda channels: PerLevelNorm(shared, channels, levels)  # noqa: E731
        super().__init__(input_shape=input_shape, norm=norm, **kwargs)

    @classmethod
    def from_config(cls, cfg: CfgNode, input_shape: List[ShapeSpec]) -> dict:
        ensure_checked(cfg)
        args = super().from_config(cfg, input_shape)
        args["norm"] = norm_from_config(args["norm"], cfg)
        return args

    def forward(self, features: List[torch.Tensor]) -> Any:
        """detectron2's forward, each :class:`PerLevelNorm` counting from the first level: a forward
        that stopped part-way (an exception) leaves no later one on other levels' modules."""
        for module in self.modules():
            if isinstance(module, PerLevelNorm):
                module.restart()
        return super().forward(features)


def head_feature_shapes(cfg: CfgNode, backbone: Backbone) -> List[ShapeSpec]:
    """The backbone's shapes of ``MODEL.RETINANET.IN_FEATURES``; an error naming both sides when
    the backbone does not make one of them (e.g. P7 from a backbone that ends at P6)."""
    shapes = backbone.output_shape()
    missing = [name for name in cfg.MODEL.RETINANET.IN_FEATURES if name not in shapes]
    if missing:
        raise GwdetValueError(
            f"MODEL.RETINANET.IN_FEATURES={list(cfg.MODEL.RETINANET.IN_FEATURES)} needs {missing}, but "
            f"MODEL.BACKBONE.NAME={cfg.MODEL.BACKBONE.NAME!r} makes only {sorted(shapes)}. RetinaNet's "
            "P3-P7 come from build_gw_retinanet_resnet_fpn_backbone (detectron2's "
            "build_retinanet_resnet_fpn_backbone with the config's norms).")
    return [shapes[name] for name in cfg.MODEL.RETINANET.IN_FEATURES]


@META_ARCH_REGISTRY.register()
class GWRetinaNet(RetinaNet):
    """detectron2's ``RetinaNet`` with :class:`GWRetinaNetHead` (``MODEL.RETINANET.NORM`` resolved
    by gwdet). ``from_config`` reads the same keys as detectron2's and builds the backbone, the
    head and the anchors in detectron2's order, each once."""

    @classmethod
    def from_config(cls, cfg: CfgNode) -> dict:
        ensure_checked(cfg)
        backbone = build_backbone(cfg)
        feature_shapes = head_feature_shapes(cfg, backbone)
        head = GWRetinaNetHead(cfg, feature_shapes)
        anchor_generator = build_anchor_generator(cfg, feature_shapes)
        retinanet = cfg.MODEL.RETINANET
        return {
            "backbone": backbone,
            "head": head,
            "anchor_generator": anchor_generator,
            "box2box_transform": Box2BoxTransform(weights=retinanet.BBOX_REG_WEIGHTS),
            "anchor_matcher": Matcher(retinanet.IOU_THRESHOLDS, retinanet.IOU_LABELS,
                                      allow_low_quality_matches=True),
            "pixel_mean": cfg.MODEL.PIXEL_MEAN,
            "pixel_std": cfg.MODEL.PIXEL_STD,
            "num_classes": retinanet.NUM_CLASSES,
            "head_in_features": retinanet.IN_FEATURES,
            "focal_loss_alpha": retinanet.FOCAL_LOSS_ALPHA,
            "focal_loss_gamma": retinanet.FOCAL_LOSS_GAMMA,
            "smooth_l1_beta": retinanet.SMOOTH_L1_LOSS_BETA,
            "box_reg_loss_type": retinanet.BBOX_REG_LOSS_TYPE,
            "test_score_thresh": retinanet.SCORE_THRESH_TEST,
            "test_topk_candidates": retinanet.TOPK_CANDIDATES_TEST,
            "test_nms_thresh": retinanet.NMS_THRESH_TEST,
            "max_detections_per_image": cfg.TEST.DETECTIONS_PER_IMAGE,
            "vis_period": cfg.VIS_PERIOD,
            "input_format": cfg.INPUT.FORMAT,
        }
