"""``gwdet.build_model``: detectron2's ``build_model`` with gwdet's checks before and after.

detectron2's own ``build_model`` runs only detectron2's code when the config names detectron2's
components: a NORM only gwdet can build (``GW``, ...) reaches detectron2's ``get_norm``, whose
lookup of the name in a dict written inside the function raises ``KeyError: 'GW'``. gwdet cannot
intercept that without changing detectron2's functions, which it never does. This function (like
gwdet's ``Trainer.build_model``) runs :func:`gwdet.check_gwdet_config` first, so such a config
stops with one message naming every key to change and gwdet's component for each.
"""
from __future__ import annotations

import logging

from typing import Callable, Sequence

from detectron2.config import CfgNode
from detectron2.layers import FrozenBatchNorm2d
from detectron2.modeling import build_model as detectron2_build_model
from detectron2.modeling.backbone import ResNet
import torch
from torch import nn

from gwdet.errors import GwdetValueError, listed
from gwdet.config_checks import GW_BACKBONES, ensure_checked
from gwdet.modeling.detectron2_failures import compiled_layers_named, named_config_failures
from gwdet.modeling.model_checks import check_model
from gwdet.norms import (DETECTRON2_GN_GROUPS, NORM_LAYER_MARK, NormRecord, built_by_detectron2_get_norm, norm_record,
                         refuse_a_mapping_as_a_config)
from gwdet.positions import BLOCK_CONV_OF_POSITION, POSITIONS, parse_gw_positions
from gwdet.utils.cli_errors import as_override


def check_device(device: str, setting: str = "MODEL.DEVICE",
                 fix: str = "add MODEL.DEVICE cpu to the command line (or cfg.MODEL.DEVICE = 'cpu' in Python)") -> None:
    """``ValueError`` naming the ``setting`` (a yacs config's ``MODEL.DEVICE``, a LazyConfig's
    ``train.device``) when ``device`` is not a PyTorch device string (``"CPU"``), and naming the
    ``fix`` too when it is a CUDA device this machine does not have
    (detectron2's default, and that of every COCO config, is ``cuda``); otherwise PyTorch stops deep
    inside the build with "Found no NVIDIA driver"."""
    device = str(device)
    try:
        torch.device(device)
    except RuntimeError:
        raise GwdetValueError(f"{setting} is {device!r}, which is not a PyTorch device: use 'cpu', 'cuda' or "
                              "'cuda:N' (lower case)") from None
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise GwdetValueError(
            f"{setting} is {device!r}, but this machine has no CUDA GPU that PyTorch can use: {fix} to build and "
            "run the model on the CPU.")
    if torch.device(device).type not in ("cpu", "cuda", "meta"):  # mps, xpu, ...: ask PyTorch whether it has one
        try:
            torch.empty(0, device=device)
        except RuntimeError as error:
            raise GwdetValueError(f"{setting} is {device!r}, which this PyTorch cannot use "
                                  f"({str(error).splitlines()[0]}): {fix}.") from None


def check_run_device(device: object, setting: str = "MODEL.DEVICE") -> None:
    """``ValueError`` naming ``setting`` for the meta device in a run: it holds tensor shapes only,
    so training stops at the first loss and an evaluation has nothing to score (building a model
    there with :func:`gwdet.build_model` to read its structure is fine). A device string that is no
    device is left to :func:`check_device`, which names it."""
    try:
        kind = torch.device(str(device)).type
    except RuntimeError:
        return
    if kind == "meta":
        raise GwdetValueError(
            f"{setting} is 'meta', which holds tensor shapes only: a run cannot train or evaluate there. Use 'cpu' "
            "or 'cuda' (gwdet.build_model builds on 'meta' to read a model's structure).")


def check_mixed_precision(enabled: object, device: object, amp_setting: str, device_setting: str,
                          float32_fix: str, cuda_fix: str) -> None:
    """``ValueError`` naming ``amp_setting`` (yacs ``SOLVER.AMP.ENABLED``, LazyConfig
    ``train.amp.enabled``) when it is on and ``device`` (of ``device_setting``) is no CUDA device:
    detectron2's AMPTrainer autocasts with CUDA's autocast only, stops without CUDA and would leave a
    model on the CPU in float32. A device string that is no device is left to :func:`check_device`,
    which names it. ``float32_fix`` / ``cuda_fix``: how to train in float32 / on a GPU."""
    if not enabled:
        return
    try:
        if torch.device(str(device)).type == "cuda":
            return
    except RuntimeError:
        return
    gpu = "" if torch.cuda.is_available() else ", and this machine has no CUDA GPU PyTorch can use"
    raise GwdetValueError(
        f"{amp_setting}={enabled!r} with {device_setting}={device!r}{gpu}: detectron2's AMPTrainer trains in mixed "
        "precision with CUDA's autocast only (it stops with '[AMPTrainer] CUDA is required for AMP training!' "
        f"without CUDA, and would leave a model on the CPU in float32). Set {float32_fix} to train in float32 "
        f"here, or {cuda_fix} on a machine with a GPU.")


def check_scratch_training(frozen_norms: Sequence[str], freeze_at: int, weights_setting: str,
                           freeze_setting: str) -> None:
    """``ValueError`` for a training from scratch (its initial weights ``weights_setting`` empty)
    with FrozenBN layers (at the settings ``frozen_norms``), which would stay identities, or with
    ``freeze_at`` frozen backbone stages (``freeze_setting``), which would stay random."""
    if frozen_norms:
        raise GwdetValueError(
            f"{', '.join(frozen_norms)} is FrozenBN, which normalizes with the fixed statistics and affine values of "
            f"pretrained weights, and {weights_setting} is empty: trained from scratch, those layers would stay "
            "identities. Use a norm that learns (BN, GN, GW, ...: configs/Study/ trains from scratch), or set "
            f"{weights_setting} to pretrained weights (docs/weights.md).")
    if freeze_at > 0:
        raise GwdetValueError(
            f"{freeze_setting} is {freeze_at}, which keeps the first {freeze_at} stage(s) of the backbone (the stem "
            f"first) at their initial weights, and {weights_setting} is empty: trained from scratch, they would stay "
            f"random. Use {as_override(freeze_setting, '0')} (configs/Study/ trains from scratch), or set "
            f"{weights_setting} to pretrained weights (docs/weights.md).")


def check_build_state(when: str) -> None:
    """Refuse to build a model (``when``: "the run", "the build") in a process whose torch state one's
    own code or a notebook left unusable for it: another default dtype than float32 (detectron2's
    layers and torchvision's operators mix it with the images' float32), or the meta device as the
    default one."""
    if torch.get_default_dtype() != torch.float32:
        raise GwdetValueError(
            f"torch's default dtype is {torch.get_default_dtype()} in this process (torch.set_default_dtype was called "
            f"before {when}): detectron2 would build the model in it and fail on the images' float32. Call "
            f"torch.set_default_dtype(torch.float32) before {when}.")
    try:
        device = torch.get_default_device()
    except RuntimeError as error:  # set to a device this machine lacks: torch fails making a tensor there
        raise GwdetValueError(
            f"torch's default device cannot be used in this process ({str(error).splitlines()[0]}): "
            f"torch.set_default_device was called with a device this machine lacks before {when}. Call "
            f"torch.set_default_device(None) (or 'cpu') before {when}.") from None
    if device.type == "meta":
        raise GwdetValueError(
            f"torch's default device is meta in this process (torch.set_default_device('meta') was called before "
            f"{when}): detectron2 would build the model there, as tensors without values. Call "
            f"torch.set_default_device(None) (or 'cpu') before {when}.")


def build_model(cfg: CfgNode) -> nn.Module:
    """:func:`gwdet.check_gwdet_config` (unless it accepted this config already:
    :func:`gwdet.config_checks.ensure_checked`), :func:`check_build_state`, :func:`check_device`,
    detectron2's ``build_model`` (a layer of detectron2's compiled ops this detectron2 lacks named:
    :func:`~gwdet.modeling.detectron2_failures.compiled_layers_named`), then :func:`gwdet.check_model`
    (with ``MODEL.STRICT_NORM_GROUPS``).
    A plain dict given as ``cfg`` is refused first (:func:`gwdet.norms.refuse_a_mapping_as_a_config`)."""
    refuse_a_mapping_as_a_config("gwdet.build_model", cfg)
    ensure_checked(cfg)
    check_build_state("the build")
    check_device(cfg.MODEL.DEVICE)
    with compiled_layers_named(cfg), named_config_failures(cfg, "build the model"):
        model = detectron2_build_model(cfg)
    return check_built_model(model, cfg)


def _is_layer_of(record: NormRecord) -> Callable[[object], bool]:
    """Whether a module is a layer the norm name of ``record`` builds: of its ``layer_types`` (a
    torch batch norm also as the FrozenBN detectron2's freezing turns it into); for a registered
    name without them, any layer a registered name built (gwdet marks those)."""
    kinds = record.layer_types
    if any(issubclass(kind, (nn.BatchNorm2d, nn.SyncBatchNorm)) for kind in kinds):
        kinds = (*kinds, FrozenBatchNorm2d)
    if kinds:
        return lambda module: isinstance(module, kinds)
    return lambda module: bool(getattr(module, NORM_LAYER_MARK, False))


def _norms_at(resnet: ResNet, position: str) -> list[object]:
    """The norms at ``position`` of ``resnet`` (``None`` for a block without the position's conv)."""
    if position == "S1":
        return [getattr(getattr(resnet.stem, "conv1", None), "norm", None)]
    return [getattr(getattr(block, BLOCK_CONV_OF_POSITION[position], None), "norm", None)
            for stage in resnet.stages for block in stage]


def check_marked_backbone(model: nn.Module, cfg: CfgNode) -> None:
    """Refuse a backbone of your own (``MODEL.BACKBONE.NAME``, marked with
    :func:`gwdet.modeling.reads_gw_positions`) that did not place ``MODEL.RESNETS.GW_NORM`` at
    ``MODEL.RESNETS.GW_POSITIONS``: with one of detectron2's ResNets in the backbone (a bottom-up
    one under an FPN, as gwdet's builders make it), none of them has a layer of ``GW_NORM`` at
    every norm of every position (the stem's norm for S1, those of every block's conv1/conv2/conv3
    for B1/B2/B3); with no such ResNet, the backbone holds no layer of ``GW_NORM`` at all."""
    backbone, spec, built = cfg.MODEL.BACKBONE.NAME, cfg.MODEL.RESNETS.GW_POSITIONS, getattr(model, "backbone", None)
    if not spec or backbone in GW_BACKBONES or not isinstance(built, nn.Module):
        return
    gw_norm = cfg.MODEL.RESNETS.GW_NORM  # the config gate has refused positions without a known GW_NORM
    is_gw = _is_layer_of(norm_record(gw_norm))
    positions = [position for position in POSITIONS if position in parse_gw_positions(spec)]
    resnets = [(f"its ResNet {name}" if name else "the backbone, a ResNet", module)
               for name, module in built.named_modules() if isinstance(module, ResNet)]
    found = []
    for name, resnet in resnets:
        missing = [position for position in positions
                   if not all(is_gw(norm) for norm in _norms_at(resnet, position))]
        if not missing:
            return
        there = sorted({type(norm).__name__ if norm is not None else "no norm" for position in missing
                        for norm in _norms_at(resnet, position) if not is_gw(norm)})
        found.append(f"at {', '.join(missing)} of {name} (there: {', '.join(there)})")
    if not resnets and any(is_gw(module) for module in built.modules()):
        return
    where = "; ".join(found) if found else "anywhere (it holds none of detectron2's ResNets to look at the positions of)"
    raise GwdetValueError(
        f"MODEL.BACKBONE.NAME {backbone!r} is marked as reading MODEL.RESNETS.GW_POSITIONS "
        f"({spec!r}; gwdet.modeling.reads_gw_positions), but the backbone it built holds no {gw_norm} layer "
        f"{where}: build it with one of gwdet's backbone builders (e.g. build_gw_resnet_fpn_backbone) with this "
        "config's MODEL.RESNETS.GW_POSITIONS, or set MODEL.RESNETS.GW_POSITIONS ''.")


def check_built_model(model: nn.Module, cfg: CfgNode) -> nn.Module:
    """:func:`gwdet.check_model` with ``MODEL.STRICT_NORM_GROUPS``; a refusal of a backbone of your
    own marked as reading ``MODEL.RESNETS.GW_POSITIONS`` that did not place ``GW_NORM`` there
    (:func:`check_marked_backbone`); a
    warning naming the ``GroupNorm`` layers of detectron2's own 32 groups where
    ``MODEL.GN.NUM_GROUPS`` gives another number: a component of your own built them with
    detectron2's ``get_norm``, which does not read the key (gwdet's components and
    ``gwdet.norm_from_config`` do). Returns ``model``."""
    check_marked_backbone(model, cfg)
    configured = cfg.MODEL.GN.NUM_GROUPS
    if configured != DETECTRON2_GN_GROUPS:
        unread = [name for name, module in model.named_modules() if built_by_detectron2_get_norm(module)]
        if unread:
            logging.getLogger(__name__).warning(
                f"{len(unread)} GroupNorm layer(s) ({listed(unread, 3)}) have {DETECTRON2_GN_GROUPS} groups, detectron2's "
                f"get_norm's own number, where MODEL.GN.NUM_GROUPS is {configured}: a component built them with "
                "detectron2's get_norm, which does not read the key. Build them with gwdet.norm_from_config(name, cfg) "
                "(docs/usage.md), or set MODEL.GN.NUM_GROUPS 32.")
    return check_model(model, strict_groups=cfg.MODEL.STRICT_NORM_GROUPS)
