"""ResNet/ResNeXt (+FPN) backbones whose norms get the config's hyper-parameters, with a chosen
norm (GW by default) at chosen positions (see :mod:`gwdet.positions`).

The network is detectron2's own ResNet, built by detectron2's ``build_resnet_backbone``; gwdet
only replaces norm modules, so checkpoint keys are detectron2's
(``backbone.bottom_up.res2.0.conv2.norm.weight``) and the convolutions are initialized exactly as
detectron2 initializes them. ``MODEL.BACKBONE.FREEZE_AT`` keeps its meaning: it is applied after
the replacement (BN in frozen stages becomes FrozenBN, every parameter there stops requiring
gradients; a GW layer in a frozen stage keeps whitening, with frozen affine parameters).

Registered: ``build_gw_resnet_backbone`` (C4), ``build_gw_resnet_fpn_backbone`` (P2-P6, R-CNN) and
``build_gw_retinanet_resnet_fpn_backbone`` (P3-P7, RetinaNet): detectron2's three ResNet builders.
For LazyConfig, :func:`place_norm` does the same to a ResNet built by ``L(ResNet)(...)``.
"""
from __future__ import annotations

import numbers
from typing import Any, Iterator, cast

from detectron2.config import CfgNode
from detectron2.layers import ShapeSpec, get_norm
from detectron2.modeling import BACKBONE_REGISTRY
from detectron2.modeling.backbone import FPN, ResNet
from detectron2.modeling.backbone.fpn import LastLevelMaxPool, LastLevelP6P7
from detectron2.modeling.backbone.resnet import build_resnet_backbone
import torch
from omegaconf import DictConfig
from torch import nn

from gwdet.config_checks import ensure_checked
from gwdet.modeling.detectron2_failures import detectron2_group_norm_failure
from gwdet.modeling.module_hooks import move_hooks, state_dict_hooks
from gwdet.positions import convs_at_positions, parse_gw_positions
from gwdet.errors import GwdetError, GwdetTypeError, GwdetValueError, listed
from gwdet.norms import (DETECTRON2_GN_GROUPS, check_detectron2_buildable, check_untied_norms, layer_types,
                         norm_from_config)

# Built in place of a norm detectron2 cannot make by name; every such module is replaced.
PLACEHOLDER_NORM = "BN"


def convs_with_norm(resnet: nn.Module) -> Iterator[nn.Module]:
    """Every conv of ``resnet`` (or of any part of one) that carries a norm (stem, block convs,
    shortcuts): detectron2's ``Conv2d`` and its deformable convs (``DeformConv``,
    ``ModulatedDeformConv``, of ``MODEL.RESNETS.DEFORM_ON_PER_STAGE``), each with a ``norm`` module."""
    for module in resnet.modules():
        if isinstance(getattr(module, "norm", None), nn.Module) and hasattr(module, "weight"):
            yield module


def place_norm(resnet: ResNet, positions: str, norm: Any, freeze_at: int = 0) -> ResNet:
    """Put ``norm`` at ``positions`` (e.g. ``"S1-B2"``) of ``resnet``, then freeze ``freeze_at``
    stages as ``ResNet(freeze_at=...)`` does; returns ``resnet``.

    ``norm`` is anything detectron2's ``get_norm`` takes: a detectron2 name or a callable such as
    ``gwdet.norm("GW", num_groups=64)``. Build ``resnet`` with ``freeze_at=0`` and give the
    freezing here, so that the replaced norms are frozen too. The new norms take the mode, device
    and float dtype of the convolutions they follow; forward and backward hooks on a replaced norm
    move to its replacement; one with state-dict hooks or a pruning is refused, and so is detectron2's
    name ``"GN"`` (32 groups) where 32 does not divide a position's channels, naming those layers
    and gwdet's ``GN``. LazyConfig::

        bottom_up=L(place_norm)(
            resnet=L(ResNet)(stem=..., stages=..., out_features=[...], freeze_at=0),
            positions="S1-B2", norm=L(gwdet.norm)(name="GW", num_groups=64), freeze_at=2)
    """
    return _place_norm(resnet, positions, norm, freeze_at, refuse_frozen_statistics=True)


def _place_norm(resnet: ResNet, positions: str, norm: Any, freeze_at: int, refuse_frozen_statistics: bool) -> ResNet:
    """:func:`place_norm`; ``refuse_frozen_statistics``: refuse norms with running statistics in the
    frozen stages (:func:`_check_frozen_statistics`; a yacs config is checked by its keys before
    training instead, which leaves an evaluation, where freezing changes nothing, alone)."""
    if isinstance(norm, nn.Module):  # callable, but its forward takes a tensor, not a channel count
        raise GwdetTypeError(f"place_norm: norm={norm!r} is a layer, not what builds one for each position; nothing "
                             "was replaced. Give a name or a callable that returns a new layer for a channel count: "
                             f"gwdet.norm('GW', num_groups=64), or the class {type(norm).__name__} itself.")
    if isinstance(norm, (DictConfig, dict)) and "_target_" in norm:  # callable in neither form
        target = norm.get("_target_")
        named = getattr(target, "__qualname__", None)
        shown = f"{getattr(target, '__module__', '')}.{named}" if named else repr(target)
        raise GwdetTypeError(f"place_norm: norm is a LazyConfig node not instantiated ({shown} with "
                             f"{listed([repr(key) for key in norm if key != '_target_'], 4) or 'no arguments'}); nothing "
                             "was replaced. In Python, instantiate it first (detectron2.config.instantiate(node)) or "
                             "give the object itself, e.g. gwdet.norm('GW', num_groups=64); inside a LazyConfig, "
                             "instantiate() builds the whole L(place_norm)(...) node with it.")
    _check_placement(resnet, norm, freeze_at)
    parsed = parse_gw_positions(positions, "positions of gwdet.modeling.place_norm")
    convs = list(convs_at_positions(resnet, parsed))
    _check_eager_positions(resnet, parsed, convs)
    try:
        layers = [get_norm(norm, conv.out_channels) for conv in convs]
    except TypeError as error:  # a class or function that takes more than the channel count
        if isinstance(error, GwdetError):
            raise
        raise GwdetTypeError(
            f"place_norm: norm={norm!r} could not build a layer from a channel count ({type(error).__name__}: "
            f"{error}); nothing was replaced. Give a name or a callable that takes the channel count alone, e.g. "
            "gwdet.norm('GN', num_groups=32), or functools.partial / a lambda that fills in the other arguments "
            "(lambda channels: torch.nn.GroupNorm(32, channels)).") from error
    except ValueError as error:  # detectron2's "GN": GroupNorm of 32 groups, on channels 32 may not divide
        refusal = detectron2_group_norm_failure(error, f"place_norm: norm={norm!r}", _undivided_layers(resnet, convs),
                                                "; nothing was replaced") if norm == "GN" else None
        if refusal is None:
            raise
        raise refusal from error
    for layer in layers:
        if not isinstance(layer, nn.Module):  # None would remove the norm, anything else fail in forward
            raise GwdetTypeError(f"place_norm: norm={norm!r} gave {layer!r} (a {type(layer).__name__}), not a norm "
                                 "layer; nothing was replaced. Give a callable that returns a torch module for a "
                                 "channel count, e.g. gwdet.norm('GW', num_groups=64).")
        if isinstance(layer, nn.Identity):  # as norm='' would: no norm, and detectron2's convs there have no bias
            raise GwdetValueError(f"place_norm: norm={norm!r} gave an Identity, which would remove the norms at the "
                                  "positions (their convolutions have no bias: the norm's stands in for it); nothing "
                                  "was replaced. Give a norm, e.g. gwdet.norm('GW', num_groups=64), or leave the "
                                  "positions out.")
    if len({id(layer) for layer in layers}) < len(layers):  # one module at two places: one set of weights and statistics
        raise GwdetValueError(f"place_norm: norm={norm!r} gave the same layer object for more than one of the "
                              f"{len(layers)} positions, which would then share one set of weights (and statistics); "
                              "nothing was replaced. Give a callable that builds a new layer on each call, e.g. "
                              "gwdet.norm('GW', num_groups=64).")
    replaced = [(conv, conv.norm) for conv in convs]
    hooked = [f"{type(previous).__name__} ({', '.join(state_dict_hooks(previous))})" for _, previous in replaced
              if isinstance(previous, nn.Module) and state_dict_hooks(previous)]
    if hooked:
        raise GwdetValueError(f"place_norm: the norm(s) {listed(hooked, 3)} at the positions carry state-dict hooks "
                              "(or a pruning), written for their own state dict and weights, not the new norm's: remove "
                              "them (a hook's handle.remove(), prune.remove) first, and register them on the new norms "
                              "afterwards if needed; nothing was replaced.")
    for (conv, previous), layer in zip(replaced, layers, strict=True):
        if isinstance(previous, nn.Module):
            move_hooks(previous, layer)  # a forward hook on a norm (a feature probe) goes on with the new one
        # the new norm computes as the model around it does: in its mode, on its device, in its float dtype
        weight = conv.weight
        layer.to(device=weight.device, dtype=weight.dtype if weight.is_floating_point() else None)
        layer.train(previous.training if isinstance(previous, nn.Module) else resnet.training)
        conv.norm = layer
    if refuse_frozen_statistics:
        try:
            _check_frozen_statistics(resnet, int(freeze_at))
        except GwdetValueError:
            for conv, previous in replaced:
                conv.norm = previous
            raise
    return resnet.freeze(int(freeze_at))


def _undivided_layers(resnet: ResNet, convs: list[nn.Module]) -> str:
    """The convolutions among ``convs`` (of ``resnet``) whose channels detectron2's 32 groups of
    ``"GN"`` do not divide, named with their channels: ``"stem.conv1 (16 channels)"``."""
    names = {id(module): name for name, module in resnet.named_modules()}
    channels = [(conv, cast(int, conv.out_channels)) for conv in convs]
    undivided = [f"{names.get(id(conv), type(conv).__name__)} ({count} channels)" for conv, count in channels
                 if count % DETECTRON2_GN_GROUPS]
    return listed(undivided, 3)


def _check_eager_positions(resnet: ResNet, positions: frozenset[str], convs: list[nn.Module]) -> None:
    """Refuse, before anything is replaced, a scripted or traced module (``torch.jit``) holding a
    norm at ``positions``: a conv at a position, or the stem or a stage the positions reach, given
    as its TorchScript version (a TorchScript module takes no eager module in place of its own)."""
    outer: list[tuple[str, nn.Module]] = []  # the scripted modules found, whose submodules are theirs
    for name, module in resnet.named_modules():
        if isinstance(module, torch.jit.ScriptModule) and not any(name.startswith(f"{o}.") for o, _ in outer):
            outer.append((name, module))
    if not outer:
        return
    parts = (["stem"] if "S1" in positions else []) + (list(resnet.stage_names) if positions - {"S1"} else [])
    at_positions = {id(conv) for conv in convs}
    found = [f"{name} ({getattr(module, 'original_name', type(module).__name__)})" for name, module in outer
             if name in parts or any(id(inner) in at_positions for inner in module.modules())]
    if found:
        raise GwdetTypeError(
            f"place_norm: the module(s) {listed(found, 3)}, holding norms at the positions, are scripted or traced "
            "(torch.jit), and a TorchScript module takes no eager norm in place of its own; nothing was replaced. Place the norms on the eager "
            "ResNet, then script or trace the result (torch.jit.script(place_norm(resnet, ...))).")


def unfrozen_statistics_layers() -> tuple[type, ...]:
    """The layer classes of the catalogue's norms with batch statistics (BW, BGN, a registered name
    with ``batch_statistics=True``) that detectron2's freezing leaves as they are: it turns torch's
    batch norms into FrozenBN only."""
    return tuple(kind for kind in layer_types(batch_statistics=True)
                 if not issubclass(kind, (nn.BatchNorm2d, nn.SyncBatchNorm)))


def _check_frozen_statistics(resnet: ResNet, freeze_at: int) -> None:
    """Refuse norms of :func:`unfrozen_statistics_layers` in the parts ``freeze_at`` freezes (the
    stem from 1, then one stage more for each): training would go on updating their running
    statistics, so the frozen stages would compute another function after every batch."""
    unfrozen = unfrozen_statistics_layers()
    frozen = [("stem", resnet.stem)] if freeze_at >= 1 else []
    frozen += [(name, stage) for name, stage in zip(resnet.stage_names, resnet.stages, strict=True)][:max(freeze_at - 1, 0)]
    found = [f"{part}.{name} ({type(module).__name__})" for part, block in frozen
             for name, module in block.named_modules() if isinstance(module, unfrozen)]
    if found:
        parts = ", ".join(part for part, _ in frozen)
        raise GwdetValueError(
            f"place_norm: freeze_at={freeze_at} freezes {parts}, whose norms {listed(found, 3)} keep running "
            "statistics that training would go on updating (detectron2 freezes torch's batch norms only, as "
            "FrozenBN), so the frozen stages would compute another function after every batch; nothing was "
            "replaced. Train those stages too (a smaller freeze_at; at evaluation freezing changes nothing, so "
            "freeze_at=0 there), or put FrozenBN / BN in them.")


def _check_placement(resnet: ResNet, norm: Any, freeze_at: Any) -> None:
    """:func:`place_norm`'s refusals (``ValueError``), before anything is replaced: no norm (it would
    remove the norms at the positions), a name only gwdet builds (``get_norm`` cannot), a
    ``freeze_at`` outside 0 .. stages + 1, and a ResNet with frozen parameters already (the norms
    placed in its frozen stages would stay trainable)."""
    if not isinstance(resnet, ResNet):
        raise GwdetTypeError(
            f"place_norm takes detectron2's ResNet (detectron2.modeling.backbone.ResNet), got {type(resnet).__module__}."
            f"{type(resnet).__name__}. A torchvision ResNet takes its norm when built: "
            "torchvision.models.resnet50(norm_layer=gwdet.norm('GW', num_groups=64)).")
    if norm is None or norm == "":
        raise GwdetValueError(f"place_norm: norm={norm!r} would remove the norms at the positions; give a norm, "
                              "e.g. gwdet.norm('GW', num_groups=64), or leave the positions out.")
    check_detectron2_buildable("place_norm: norm", norm)
    stages = len(resnet.stages)
    if isinstance(freeze_at, bool) or not isinstance(freeze_at, numbers.Integral) or not 0 <= int(freeze_at) <= stages + 1:
        raise GwdetValueError(f"place_norm: freeze_at={freeze_at!r}: give 0 (nothing frozen) to {stages + 1} (the "
                              f"stem and all {stages} stages of this ResNet).")
    if any(not parameter.requires_grad for parameter in resnet.parameters()):
        raise GwdetValueError("place_norm: the ResNet has frozen parameters already (built with freeze_at > 0?), so "
                              "norms placed in its frozen stages would stay trainable: build it with freeze_at=0 and "
                              "give the freezing to place_norm(..., freeze_at=N).")


def build_gw_resnet(cfg: CfgNode, input_shape: ShapeSpec, builder: str = "build_gw_resnet") -> ResNet:
    """detectron2's ResNet with ``MODEL.RESNETS.NORM`` everywhere and ``MODEL.RESNETS.GW_NORM`` at
    ``MODEL.RESNETS.GW_POSITIONS``, each carrying ``cfg``'s hyper-parameters. An ``input_shape``
    that is no detectron2 ``ShapeSpec`` is refused, naming ``builder`` (the function called)."""
    ensure_checked(cfg)
    if not isinstance(input_shape, ShapeSpec):
        raise GwdetTypeError(
            f"{builder}(cfg, input_shape): input_shape must be detectron2's ShapeSpec of the input images, got "
            f"{input_shape!r} ({type(input_shape).__name__}). Give "
            "ShapeSpec(channels=len(cfg.MODEL.PIXEL_MEAN)) (from detectron2.layers), as detectron2's "
            "build_backbone(cfg) does, or build the backbone with build_backbone(cfg).")
    base_norm = norm_from_config(cfg.MODEL.RESNETS.NORM, cfg)
    stock = cfg.clone()
    stock.defrost()
    stock.MODEL.BACKBONE.FREEZE_AT = 0
    if not isinstance(base_norm, str):
        stock.MODEL.RESNETS.NORM = PLACEHOLDER_NORM
    resnet = build_resnet_backbone(stock, input_shape)
    if not isinstance(base_norm, str):
        for conv in convs_with_norm(resnet):
            conv.norm = get_norm(base_norm, conv.out_channels)
    gw_norm = norm_from_config(cfg.MODEL.RESNETS.GW_NORM, cfg)
    # detectron2 takes FREEZE_AT above the stages built (a C4 backbone has no res5) as all of them frozen
    freeze_at = min(cfg.MODEL.BACKBONE.FREEZE_AT, len(resnet.stages) + 1)
    placed = _place_norm(resnet, cfg.MODEL.RESNETS.GW_POSITIONS, gw_norm, freeze_at, refuse_frozen_statistics=False)
    check_untied_norms(placed)  # here too for detectron2's own build_model, which runs no check_model
    return placed


@BACKBONE_REGISTRY.register()
def build_gw_resnet_backbone(cfg: CfgNode, input_shape: ShapeSpec) -> ResNet:
    """``MODEL.BACKBONE.NAME: "build_gw_resnet_backbone"`` (C4-style heads)."""
    return build_gw_resnet(cfg, input_shape, "build_gw_resnet_backbone")


def build_gw_fpn(cfg: CfgNode, bottom_up: ResNet, top_block: Any) -> FPN:
    """detectron2's FPN on ``bottom_up`` with ``MODEL.FPN.*``, its norm carrying the config's values."""
    fpn = FPN(
        bottom_up=bottom_up,
        in_features=cfg.MODEL.FPN.IN_FEATURES,
        out_channels=cfg.MODEL.FPN.OUT_CHANNELS,
        norm=norm_from_config(cfg.MODEL.FPN.NORM, cfg),
        top_block=top_block,
        fuse_type=cfg.MODEL.FPN.FUSE_TYPE,
    )
    check_untied_norms(fpn)  # here too for detectron2's own build_model, which runs no check_model
    return fpn


@BACKBONE_REGISTRY.register()
def build_gw_resnet_fpn_backbone(cfg: CfgNode, input_shape: ShapeSpec) -> FPN:
    """``MODEL.BACKBONE.NAME: "build_gw_resnet_fpn_backbone"``: the GW ResNet under an FPN whose
    norm (``MODEL.FPN.NORM``) carries the config's hyper-parameters too; P2-P6 (P6 by max pooling),
    as detectron2's ``build_resnet_fpn_backbone``."""
    return build_gw_fpn(cfg, build_gw_resnet(cfg, input_shape, "build_gw_resnet_fpn_backbone"), LastLevelMaxPool())


@BACKBONE_REGISTRY.register()
def build_gw_retinanet_resnet_fpn_backbone(cfg: CfgNode, input_shape: ShapeSpec) -> FPN:
    """``MODEL.BACKBONE.NAME: "build_gw_retinanet_resnet_fpn_backbone"``: detectron2's
    ``build_retinanet_resnet_fpn_backbone`` (P3-P7, P6 and P7 by detectron2's ``LastLevelP6P7``
    from C5) on the GW ResNet, the FPN's norm carrying the config's values. Built in detectron2's
    order, so with detectron2's norms it is that backbone, weight for weight."""
    bottom_up = build_gw_resnet(cfg, input_shape, "build_gw_retinanet_resnet_fpn_backbone")
    top_block = LastLevelP6P7(bottom_up.output_shape()["res5"].channels, cfg.MODEL.FPN.OUT_CHANNELS)
    return build_gw_fpn(cfg, bottom_up, top_block)
