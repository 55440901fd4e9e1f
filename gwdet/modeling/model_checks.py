"""Checks of a built model that a config check cannot see (models built by LazyConfig, say):
norms with batch statistics shared across FPN levels, group numbers a layer could not use, and
norm layers that an optimizer decays otherwise than the config's norm setting."""
from __future__ import annotations

import math

import logging
from collections import defaultdict
from typing import Any, Mapping

from detectron2.modeling.backbone import ResNet
from detectron2.modeling.meta_arch.retinanet import RetinaNetHead
from detectron2.modeling.roi_heads.roi_heads import Res5ROIHeads
import torch
from torch import nn

from gwdet.config_checks import check_example_groups
from gwdet.errors import GwdetTypeError, GwdetValueError, listed
from gwdet.layers import BatchGroupNorm, GroupWhitening
from gwdet.layers.common import check_flag, is_finite_number
from gwdet.modeling.heads import GWRetinaNetHead, PerLevelNorm
from gwdet.norms import (
    DETECTRON2_PER_LEVEL_NORMS,
    TORCH_BATCH_NORMS,
    check_untied_norms,
    group_adjustment,
    layer_types,
)
from gwdet.positions import BLOCK_CONV_OF_POSITION, positions_with_norm
from gwdet.solver import (check_override_values, check_scripted_norms, expected_norm_decay, misdecayed_norm_layers,
                          norm_parameters, weight_decay_of)

# The containers that keep one norm per FPN level: gwdet's and detectron2's.
PER_LEVEL_CONTAINERS: tuple[type[nn.Module], ...] = (PerLevelNorm, *DETECTRON2_PER_LEVEL_NORMS)


def shared_batch_statistics(head: nn.Module) -> list[str]:
    """Names of the layers of ``head`` that keep batch statistics and are not kept per level: the
    layer types of the catalogue's names with ``batch_statistics`` (BN, BW, BGN, registered ones)
    and torch's batch norms of every kind."""
    batch_statistics = layer_types(batch_statistics=True) + TORCH_BATCH_NORMS
    per_level = {id(sub) for container in head.modules() if isinstance(container, PER_LEVEL_CONTAINERS)
                 for sub in container.modules()}
    return [name for name, module in head.named_modules()
            if isinstance(module, batch_statistics) and id(module) not in per_level]


def check_res5_positions(model: nn.Module) -> None:
    """Refuse a C4 model (a ``Res5ROIHeads``) whose backbone ResNet has GW at block positions (B1,
    B2, B3) that the head's res5 stage lacks: a model built otherwise than asked (a LazyConfig's
    ``place_norm`` reaches the backbone's stages only; gwdet's ``GWRes5ROIHeads`` places them in
    res5 from the yacs keys)."""
    resnet = next((module for module in model.modules() if isinstance(module, ResNet)), None)
    if resnet is None:
        return
    placed = sorted(positions_with_norm(resnet, (GroupWhitening,)) & set(BLOCK_CONV_OF_POSITION))
    for name, head in model.named_modules():
        if not placed or not isinstance(head, Res5ROIHeads):
            continue
        blocks = list(head.res5)
        missing = [position for position in placed if not all(
            isinstance(getattr(getattr(block, BLOCK_CONV_OF_POSITION[position], None), "norm", None), GroupWhitening)
            for block in blocks)]
        if missing:
            raise GwdetValueError(
                f"The backbone's ResNet has GW at {', '.join(placed)} of its blocks, but {name}.res5, the C4 head's "
                f"stage 5, has not at {', '.join(missing)}: its blocks would normalize otherwise than the backbone's. "
                "Place the norm there too: with a yacs config, MODEL.ROI_HEADS.NAME GWRes5ROIHeads (it reads "
                "MODEL.RESNETS.GW_POSITIONS and GW_NORM); in a LazyConfig, give the res5 stage's blocks the same norm "
                "(ResNet.make_stage(..., norm=...) puts it at all their norms), or an FPN model.")


def _component(name: str) -> str:
    parts = name.split(".")
    return ".".join(parts[:2]) if parts[0] in ("backbone", "roi_heads") and len(parts) > 2 else parts[0]


def adjusted_groups(model: nn.Module) -> list[str]:
    """One line per component and layer type whose requested group number (GW, BGN) or group size
    (BW) does not divide the channels, with what the layers use instead (the largest divisor of
    the channels not above the request; one channel per group when there are fewer channels)."""
    found: dict = defaultdict(lambda: {"layers": 0, "channels": set(), "used": set()})
    for name, module in model.named_modules():
        adjusted = group_adjustment(module)
        if adjusted is not None:
            what, requested, used = adjusted
            entry = found[(_component(name), type(module).__name__, what, requested)]
            entry["layers"] += 1
            entry["channels"].add(module.num_channels)
            entry["used"].add(used)
    return [f"{component}: {e['layers']} {kind} layer(s) asked for {requested} {what} use "
            f"{'/'.join(map(str, sorted(e['used'])))} ({'/'.join(map(str, sorted(e['channels'])))} channels)"
            for (component, kind, what, requested), e in sorted(found.items())]


def check_norm_weight_decay(model: nn.Module, optimizer: torch.optim.Optimizer, weight_decay_norm: float,
                            weight_decay_bias: float | None = None,
                            overrides: Mapping[str, Mapping[str, Any]] | None = None,
                            caller: str = "check_norm_weight_decay") -> list[str]:
    """Warn, naming them, about the norm layers of ``model`` whose parameters ``optimizer`` decays
    otherwise than ``weight_decay_norm`` (``SOLVER.WEIGHT_DECAY_NORM``; a bias: ``weight_decay_bias``
    when set; a parameter whose name ``overrides`` gives a ``weight_decay``, as
    :func:`gwdet.get_default_optimizer_params` takes them: the override's, which takes precedence);
    returns them. detectron2's own optimizer builders do this to gwdet's layers: build
    the optimizer with :func:`gwdet.build_optimizer` / :func:`gwdet.get_default_optimizer_params`.
    Where ``weight_decay_bias`` is not given and only the layers' biases differ, all by one value
    (an optimizer built with ``SOLVER.WEIGHT_DECAY_BIAS``, which detectron2 gives every bias, a
    norm's too), the warning says so and names the value to check against. Where the optimizer
    decays every norm layer of the model by one other value, and not as the model's other weights
    (as detectron2's builders decay gwdet's layers), the warning names that value as the optimizer's
    norm weight decay, to give to the check or to build the optimizer without. Where ``overrides``
    is not given and the optimizer decays every parameter of the model named as the misdecayed
    ones alike (as an override by parameter name does), the warning names the overrides that
    would, to give to the check. A scripted norm layer (``torch.jit.script`` of one inside the
    model) whose parameters the optimizer decays otherwise is refused with a ``GwdetTypeError``
    (:func:`gwdet.solver.check_scripted_norms`; ``caller`` begins the message): no optimizer
    builder can tell it is a norm layer."""
    check_scripted_norms(model, weight_decay_of(optimizer.param_groups, optimizer.defaults), weight_decay_norm,
                         weight_decay_bias, overrides, caller, "the optimizer gives")
    layers = misdecayed_norm_layers(model, optimizer, weight_decay_norm, weight_decay_bias, overrides)
    if not layers:
        return layers
    bias_decay = (_bias_only_decay(model, optimizer, weight_decay_norm, overrides) if weight_decay_bias is None
                  else None)
    if bias_decay is not None and math.isfinite(bias_decay) and bias_decay >= 0:  # a decay a setting can give
        logging.getLogger(__name__).warning(
            f"{len(layers)} norm layer(s) have their bias decayed by {bias_decay:g}, not by the norm weight decay "
            f"{weight_decay_norm:g} (SOLVER.WEIGHT_DECAY_NORM / weight_decay_norm), their other parameters by it: "
            f"{listed(layers, 5)}. An optimizer built with a bias weight decay (SOLVER.WEIGHT_DECAY_BIAS / "
            "weight_decay_bias) gives it to every bias, the norm layers' too, as detectron2's does. If that is "
            f"the setting, give it to the check (check_model(..., weight_decay_bias={bias_decay:g}), i.e. "
            "cfg.SOLVER.WEIGHT_DECAY_BIAS); else build the optimizer without it.")
        return layers
    norm_decay = _other_norm_decay(model, optimizer, weight_decay_norm, weight_decay_bias, overrides)
    if norm_decay is not None and not _decayed_as_detectron2_builds(model, optimizer, norm_decay):
        logging.getLogger(__name__).warning(
            f"{len(layers)} norm layer(s) are decayed by {norm_decay:g}, where the check was told the norm weight "
            f"decay {weight_decay_norm:g} (SOLVER.WEIGHT_DECAY_NORM / weight_decay_norm): {listed(layers, 5)}. The "
            f"optimizer decays every norm layer of the model by {norm_decay:g}, a norm weight decay other than the "
            f"check's. If {norm_decay:g} is the setting, give it to the check (check_model(..., "
            f"weight_decay_norm={norm_decay:g}), i.e. cfg.SOLVER.WEIGHT_DECAY_NORM); else build the optimizer again "
            f"with {weight_decay_norm:g} (SOLVER.WEIGHT_DECAY_NORM {weight_decay_norm:g}; in a LazyConfig "
            f"optimizer.params.weight_decay_norm={weight_decay_norm:g}).")
        return layers
    builders = ("detectron2's optimizer builders know only torch's norm classes: build the optimizer with "
                "gwdet.build_optimizer(cfg, model), or in a LazyConfig set optimizer.params._target_ = "
                "gwdet.get_default_optimizer_params.")
    guess = _name_overrides(model, optimizer, weight_decay_norm, weight_decay_bias) if overrides is None else None
    if guess:
        named = " and ".join(repr(name) for name in guess)
        builders = (f"The optimizer decays every parameter named {named} of the model alike, as an override by "
                    f"parameter name does: if overrides set these decays (get_default_optimizer_params(..., "
                    f"overrides={guess!r}), optimizer.params.overrides), that is as asked, an override taking "
                    "precedence over weight_decay_norm, and the check expects them when given them "
                    f"(check_model(..., overrides=...)). Else {builders}")
    logging.getLogger(__name__).warning(
        f"{len(layers)} norm layer(s) are decayed otherwise than the norm weight decay "
        f"{weight_decay_norm:g} (SOLVER.WEIGHT_DECAY_NORM / weight_decay_norm): {listed(layers, 5)}. {builders}")
    return layers


def _name_overrides(model: nn.Module, optimizer: torch.optim.Optimizer, weight_decay_norm: float,
                    weight_decay_bias: float | None) -> dict[str, dict[str, float]] | None:
    """The overrides by parameter name (``{name: {"weight_decay": value}}``) that would give the
    norm parameters ``optimizer`` decays otherwise than ``weight_decay_norm`` their decay: where
    it decays every trainable parameter of ``model`` of each of their names alike, as an override
    by that name does (norm layers' and others' alike); None otherwise."""
    decays = weight_decay_of(optimizer.param_groups, optimizer.defaults)
    names = sorted({param_name for param, (_, param_name) in norm_parameters(model).items() if param in decays
                    and decays[param] != expected_norm_decay(param_name, weight_decay_norm, weight_decay_bias)})
    guess: dict[str, dict[str, float]] = {}
    for name in names:
        values = {decays[param] for module in model.modules() for param_name, param in
                  module.named_parameters(recurse=False) if param_name == name and param in decays}
        if len(values) != 1:
            return None
        guess[name] = {"weight_decay": values.pop()}
    return guess or None


def _other_norm_decay(model: nn.Module, optimizer: torch.optim.Optimizer, weight_decay_norm: float,
                      weight_decay_bias: float | None,
                      overrides: Mapping[str, Mapping[str, Any]] | None = None) -> float | None:
    """The one weight decay ``optimizer`` gives every parameter of every norm layer of ``model`` (a
    bias that ``weight_decay_bias`` is given for aside) where it differs from ``weight_decay_norm``
    and nothing else does: the optimizer has a norm weight decay, another one. None otherwise, and
    for a value no setting can give (negative, NaN). Parameters ``overrides`` sets the decay of are
    left out."""
    decays = weight_decay_of(optimizer.param_groups, optimizer.defaults)
    overridden = _overridden_names(overrides)
    values = {decays[param] for param, (_, param_name) in norm_parameters(model).items()
              if param in decays and not (param_name == "bias" and weight_decay_bias is not None)
              and param_name not in overridden}
    if len(values) != 1:
        return None
    (decay,) = values
    if decay == weight_decay_norm or not is_finite_number(decay) or decay < 0:
        return None
    return None if misdecayed_norm_layers(model, optimizer, decay, weight_decay_bias, overrides) else decay


def _overridden_names(overrides: Mapping[str, Mapping[str, Any]] | None) -> set[str]:
    """The parameter names whose weight decay ``overrides`` sets."""
    return {name for name, values in (overrides or {}).items() if isinstance(values, Mapping)
            and "weight_decay" in values}


def _decayed_as_detectron2_builds(model: nn.Module, optimizer: torch.optim.Optimizer, decay: float) -> bool:
    """Whether the norm layers' one weight decay ``decay`` is also that of the model's other weights
    (no norm parameter, no bias): the norm layers are decayed as the convolutions, as detectron2's
    optimizer builders decay a norm layer of a class they do not know (gwdet's), or an optimizer
    that decays every parameter alike."""
    decays = weight_decay_of(optimizer.param_groups, optimizer.defaults)
    norms = norm_parameters(model)
    return any(decays.get(param) == decay for name, param in model.named_parameters()
               if param not in norms and not name.endswith("bias"))


def _bias_only_decay(model: nn.Module, optimizer: torch.optim.Optimizer, weight_decay_norm: float,
                     overrides: Mapping[str, Mapping[str, Any]] | None = None) -> float | None:
    """The one weight decay ``optimizer`` gives the norm layers' biases where that is all that
    differs from ``weight_decay_norm`` (every other norm parameter has it, or the decay
    ``overrides`` sets); None otherwise, and where ``overrides`` sets the biases' decay."""
    if "bias" in _overridden_names(overrides):
        return None
    decays = weight_decay_of(optimizer.param_groups, optimizer.defaults)
    bias_decays = {decays[param] for param, (_, param_name) in norm_parameters(model).items()
                   if param_name == "bias" and param in decays and decays[param] != weight_decay_norm}
    if len(bias_decays) != 1:
        return None
    (bias_decay,) = bias_decays
    return None if misdecayed_norm_layers(model, optimizer, weight_decay_norm, bias_decay, overrides) else bias_decay


def check_model_example_groups(model: nn.Module, batch: int, processes: int, batch_setting: str) -> None:
    """The example groups of every :class:`~gwdet.layers.BatchGroupNorm` of ``model`` outside its ROI
    heads (whose batches are their boxes), however it was made (a registered name, a partial of the
    class, a node), checked against the images each of ``processes`` trains on of a batch of ``batch``
    (``batch_setting``), as the config's settings are (:func:`gwdet.config_checks.check_example_groups`)."""
    layers = defaultdict(list)
    for name, module in model.named_modules():
        if isinstance(module, BatchGroupNorm) and not name.startswith("roi_heads."):
            layers[module.examples_per_group].append(name)
    for examples, names in sorted(layers.items()):
        check_example_groups(examples, batch, processes, [listed(names, 3)], "examples_per_group", batch_setting)


def frozen_batch_statistics(model: nn.Module) -> list[str]:
    """``name (type)`` of every norm layer of ``model`` that normalizes with batch statistics and keeps
    running averages of them (gwdet's BW, BGN, GhostBN; registered names with batch statistics) and
    has every parameter frozen (``requires_grad`` False, as detectron2's ``freeze()`` of a backbone
    stage leaves them): in training its running statistics would go on moving."""
    kinds = layer_types(batch_statistics=True, detectron2=False)
    frozen = []
    for name, module in model.named_modules():
        if not isinstance(getattr(module, "running_mean", None), torch.Tensor):
            continue
        parameters = list(module.parameters())
        if isinstance(module, kinds) and parameters and not any(parameter.requires_grad for parameter in parameters):
            frozen.append(f"{name} ({type(module).__name__})")
    return frozen


def _frozen_batch_statistics_problem(frozen: list[str]) -> str:
    return (f"The norm layers {listed(frozen, 3)} have every parameter frozen (requires_grad False, as detectron2's "
            "freeze() of a backbone stage leaves them), but normalize with batch statistics and keep running "
            "statistics that training would go on updating: detectron2 freezes a stage by turning torch's batch "
            "norms into FrozenBN, which it does not do for these, so the frozen part would compute another function "
            "after every batch.")


def check_frozen_batch_statistics(model: nn.Module) -> None:
    """Refuse to train ``model`` when it holds layers of :func:`frozen_batch_statistics`: detectron2
    freezes torch's batch norms by turning them into FrozenBN, not these, whose running statistics
    training would go on updating, so the frozen part would compute another function after every
    batch (the twin of the ``MODEL.BACKBONE.FREEZE_AT`` check of the config)."""
    frozen = frozen_batch_statistics(model)
    if frozen:
        raise GwdetValueError(f"{_frozen_batch_statistics_problem(frozen)} Train those layers too, or use FrozenBN / "
                              "BN there; nothing was trained.")


def check_model(model: nn.Module, strict_groups: bool = False, optimizer: torch.optim.Optimizer | None = None,
                weight_decay_norm: float | None = None, weight_decay_bias: float | None = None,
                overrides: Mapping[str, Mapping[str, Any]] | None = None) -> nn.Module:
    """Check a built model; returns ``model``.

    * Raise ``ValueError`` when a head shared by every FPN level holds one norm with batch
      statistics for all levels (its running statistics would mix the levels). gwdet's
      ``GWRetinaNetHead`` keeps such norms per level; detectron2's ``RetinaNetHead`` does so for
      its names "BN" and "SyncBN" only.
    * Raise ``ValueError`` when one norm layer object sits at several places of the model
      (:func:`check_untied_norms`; gwdet's backbone builders check theirs too).
    * Log, once, every component whose norm layers could not use the requested group number
      (:func:`adjusted_groups`); with ``strict_groups`` (``MODEL.STRICT_NORM_GROUPS``) raise instead.
    * With an ``optimizer`` (and the config's ``weight_decay_norm``, ``weight_decay_bias``, and the
      ``overrides`` it was built with by :func:`gwdet.get_default_optimizer_params`), raise when it
      does not hold every trainable parameter of ``model``, and warn about norm layers it decays
      otherwise (:func:`check_norm_weight_decay`; a scripted norm layer it decays otherwise is
      refused, no optimizer builder can tell it is a norm layer). ``weight_decay_norm``,
      ``weight_decay_bias`` or ``overrides`` without an ``optimizer`` is refused (nothing to check
      them against).
    * Norm layers with batch statistics whose parameters are all frozen
      (:func:`frozen_batch_statistics`, e.g. by detectron2's ``ResNet.freeze``), whose running
      statistics training would go on updating: with an ``optimizer`` (the model is to be trained),
      raise ``ValueError`` as gwdet's trainers do; without one, warn naming them (a model built for
      evaluation alone may hold them: in ``eval()`` mode they change nothing).
    """
    if not isinstance(model, nn.Module):
        raise GwdetTypeError(f"check_model: give the built model (a torch.nn.Module), got {type(model).__name__}")
    check_flag("check_model", "strict_groups", strict_groups)
    unused = [f"{name}={value!r}" for name, value in (("weight_decay_norm", weight_decay_norm),
                                                      ("weight_decay_bias", weight_decay_bias),
                                                      ("overrides", overrides)) if value is not None]
    if optimizer is None and unused:
        raise GwdetTypeError(
            f"check_model: {' and '.join(unused)} given without an optimizer: the value is what the optimizer's weight "
            "decay of the norm layers is checked against, and there is no optimizer to check. Give the optimizer too "
            "(check_model(model, optimizer=optimizer, weight_decay_norm=cfg.SOLVER.WEIGHT_DECAY_NORM)), or leave "
            f"{' and '.join(value.split('=')[0] for value in unused)} out.")
    if overrides is not None:
        check_override_values(overrides, "check_model: overrides")
    if optimizer is not None:
        if weight_decay_norm is None:
            raise GwdetTypeError("check_model: with an optimizer, give weight_decay_norm (SOLVER.WEIGHT_DECAY_NORM) "
                                 "to check the norm layers' weight decay against")
        for name, value in (("weight_decay_norm", weight_decay_norm), ("weight_decay_bias", weight_decay_bias)):
            if value is not None and not is_finite_number(value):
                raise GwdetTypeError(f"check_model: {name} must be a number (the weight decay the optimizer should "
                                     f"give), got {value!r} ({type(value).__name__})")
            if value is not None and value < 0:  # torch's optimizers refuse one
                raise GwdetValueError(f"check_model: {name} must be a weight decay >= 0 (the one the optimizer should "
                                      f"give; torch's optimizers refuse a negative one), got {value!r}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise GwdetTypeError(f"check_model: optimizer must be the torch optimizer that trains the model, got "
                                 f"{type(optimizer).__name__} (a learning-rate scheduler? give its .optimizer)")
        held = {id(parameter) for group in optimizer.param_groups for parameter in group["params"]}
        untrained = [name for name, parameter in model.named_parameters() if parameter.requires_grad
                     and id(parameter) not in held]
        if untrained:
            holds_some = any(id(parameter) in held for parameter in model.parameters())
            cause = ("were they made trainable (requires_grad_(True), an unfreezing) after the optimizer was built? Add "
                     "them with optimizer.add_param_group, or build the optimizer again" if holds_some else
                     "was it built for another model (one built before this one)? Build the optimizer from this model")
            raise GwdetValueError(
                f"check_model: the optimizer does not hold {len(untrained)} trainable parameter(s) of the model (e.g. "
                f"{listed(untrained, 3)}), so they would not train: {cause} (gwdet.build_optimizer(cfg, model)).")
        check_norm_weight_decay(model, optimizer, weight_decay_norm, weight_decay_bias, overrides, caller="check_model")
    frozen = frozen_batch_statistics(model)
    if frozen and optimizer is not None:
        raise GwdetValueError(f"check_model: {_frozen_batch_statistics_problem(frozen)} Train those layers too (make "
                              "their parameters trainable before the optimizer is built), or use FrozenBN / BN there.")
    if frozen:
        logging.getLogger(__name__).warning(
            f"check_model: {_frozen_batch_statistics_problem(frozen)} To train this model, train those layers too, or "
            "use FrozenBN / BN there (check_model(model, optimizer=...) refuses it); evaluated alone (model.eval()), "
            "they change nothing.")
    check_untied_norms(model)
    check_res5_positions(model)
    adjusted = adjusted_groups(model)
    if adjusted and strict_groups:
        raise GwdetValueError("Norm layers cannot use the requested group number (MODEL.STRICT_NORM_GROUPS "
                              "is on): " + "; ".join(adjusted) + ". Choose group numbers that divide the "
                              "channels, or turn MODEL.STRICT_NORM_GROUPS off.")
    if adjusted:
        logging.getLogger(__name__).warning("Group numbers adjusted to the channels: " + "; ".join(adjusted))
    for name, module in model.named_modules():
        if isinstance(module, RetinaNetHead):
            shared = shared_batch_statistics(module)
            if shared and isinstance(module, GWRetinaNetHead):  # a registered norm it cannot tell has batch statistics
                raise GwdetValueError(
                    f"{name} ({type(module).__name__}) runs on every FPN level and keeps one norm per level for the "
                    f"names registered with batch statistics, but its norm layers {listed(shared, 3)} keep batch "
                    "statistics shared by all levels: their name was registered without batch_statistics=True. "
                    "Register it with gwdet.register_norm(..., batch_statistics=True, layer_types=(...)), or use a "
                    "per-sample norm (GW, GN).")
            if shared and type(module) is not RetinaNetHead:  # FCOS's head: GWRetinaNetHead lacks its outputs
                raise GwdetValueError(
                    f"{name} ({type(module).__name__}) runs on every FPN level, but its norm layers "
                    f"{listed(shared, 3)} keep batch statistics shared by all levels, which mixes the levels' "
                    "statistics. Use a per-sample norm (GW, GN) in it (gwdet.modeling.GWRetinaNetHead, which keeps one "
                    f"norm per level, is RetinaNet's head, without what a {type(module).__name__} adds).")
            if shared:
                raise GwdetValueError(
                    f"{name} ({type(module).__name__}) runs on every FPN level, but its norm layers "
                    f"{listed(shared, 3)} keep batch statistics "
                    "shared by all levels, which mixes the levels' statistics. Use "
                    "gwdet.modeling.GWRetinaNetHead, which keeps one norm per level (a yacs config: "
                    "MODEL.META_ARCHITECTURE 'GWRetinaNet'; a LazyConfig: the model's head as "
                    "L(GWRetinaNetHead)(...) with RetinaNetHead's arguments), or a per-sample norm (GW, GN)."
                )
    return model
