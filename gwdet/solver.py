"""Optimizer parameter groups in which every norm layer, gwdet's included, is a norm.

detectron2's ``get_default_optimizer_params`` gives ``weight_decay_norm`` (``SOLVER.WEIGHT_DECAY_NORM``)
only to modules of its own list of torch norm classes (:data:`gwdet.norms.DETECTRON2_OPTIMIZER_NORMS`),
which would decay gwdet's affine parameters like convolution weights, and those of detectron2's own
``LN`` (``detectron2.layers.LayerNorm``, which that list leaves out).
:func:`get_default_optimizer_params` here takes the same arguments and returns the same groups,
except that every norm layer :func:`is_norm_layer` recognises gets ``weight_decay_norm`` too; with no
norm in the model that detectron2's list leaves out the groups are detectron2's.

* yacs: gwdet's ``Trainer`` builds its optimizer with :func:`build_optimizer`. A trainer of your
  own (a ``DefaultTrainer`` subclass) adds one line::

      build_optimizer = classmethod(lambda cls, cfg, model: gwdet.build_optimizer(cfg, model))

* LazyConfig: gwdet's configs set, and a config of your own sets, ::

      optimizer.params._target_ = gwdet.get_default_optimizer_params
"""
from __future__ import annotations

import copy
import difflib
import functools
import inspect
import logging
from typing import Any, Callable, Iterable, Mapping

import torch
from detectron2.config import CfgNode
from detectron2.solver.build import get_default_optimizer_params as detectron2_optimizer_params
from detectron2.layers import FrozenBatchNorm2d
from detectron2.solver.build import maybe_add_gradient_clipping, reduce_param_groups
from torch import nn

from gwdet.config_checks import ensure_checked
from gwdet.errors import GwdetTypeError, GwdetValueError, did_you_mean, listed
from gwdet.layers.common import is_finite_number, is_real_number
from gwdet.norms import COMPUTING_MODULES, DETECTRON2_OPTIMIZER_NORMS, NORM_LAYER_MARK, layer_types, norm_classes

logger = logging.getLogger(__name__)


def optimizer_norm_types() -> tuple[type, ...]:
    """The classes whose modules are norms to the optimizer: detectron2's own list (which gwdet
    keeps as it is) and the layer types of every name of the catalogue: gwdet's layers, those of
    registered names, and those of detectron2's names that its list leaves out (``LN`` builds
    ``detectron2.layers.LayerNorm``, no subclass of torch's ``LayerNorm``). Per-level containers
    hold these as children."""
    return tuple(dict.fromkeys(DETECTRON2_OPTIMIZER_NORMS + layer_types()))


def is_norm_layer(module: nn.Module) -> bool:
    """Whether ``module``'s parameters are norm parameters to the optimizer: its class is one of
    :func:`optimizer_norm_types`, or a norm name registered with gwdet built it."""
    return isinstance(module, optimizer_norm_types()) or getattr(module, NORM_LAYER_MARK, False)


def norm_modules(model: nn.Module) -> list[nn.Module]:
    """The modules of ``model`` whose own parameters are norm parameters: every norm layer
    (:func:`is_norm_layer`) and the modules inside one, except a convolution, linear, embedding,
    recurrent or attention module inside it and what that module holds (a conditional norm's
    convolution keeps the ordinary weight decay, as in detectron2, which decays a parameter by the
    module that holds it); a norm layer inside such a module is a norm layer of its own."""
    found: dict[int, nn.Module] = {}

    def visit(module: nn.Module) -> None:
        if id(module) in found or isinstance(module, COMPUTING_MODULES):
            return
        found[id(module)] = module
        for child in module.children():
            visit(child)

    for module in model.modules():
        if is_norm_layer(module):
            visit(module)
    return list(found.values())


def norm_parameters(model: nn.Module) -> dict[nn.Parameter, tuple[str, str]]:
    """Every trainable parameter of a norm layer of ``model`` (held by one of :func:`norm_modules`):
    ``{parameter: (layer name, parameter name within the layer)}``. A parameter belongs to the first
    module that holds it in ``named_modules`` order, as in detectron2's grouping."""
    owners: dict[nn.Parameter, tuple[str, nn.Module, str]] = {}
    for module_name, module in model.named_modules():
        for param_name, param in module.named_parameters(recurse=False):
            owners.setdefault(param, (module_name, module, param_name))
    norms = {id(module) for module in norm_modules(model)}
    return {param: (module_name, param_name) for param, (module_name, module, param_name) in owners.items()
            if id(module) in norms and param.requires_grad}


def scripted_norm_class_names() -> frozenset[str]:
    """The class names a TorchScript module (``torch.jit.script`` or ``trace`` of a layer) made from
    a norm layer reports as its ``original_name``: those of :func:`optimizer_norm_types`, of
    torch's and detectron2's norm classes (:func:`gwdet.norms.norm_classes`: BatchNorm*,
    InstanceNorm*, GroupNorm, LayerNorm, SyncBatchNorm, FrozenBatchNorm2d, detectron2's
    LayerNorm, ...) and of their subclasses, torch's private base classes left out."""
    found: dict[type, None] = {}

    def visit(kind: type) -> None:
        if kind not in found:
            found[kind] = None
            subclasses: list[type] = kind.__subclasses__()
            for subclass in subclasses:
                visit(subclass)

    for kind in optimizer_norm_types() + norm_classes():
        visit(kind)
    return frozenset(kind.__name__ for kind in found if not kind.__name__.startswith("_"))


def scripted_norm_layers(model: nn.Module) -> list[tuple[str, torch.jit.ScriptModule]]:
    """``(path, module)`` of every TorchScript module of ``model`` (``model`` itself included, path
    ``""``) whose ``original_name`` is the class name of a norm layer
    (:func:`scripted_norm_class_names`), the outermost of nested ones. Such a module is no instance
    of its class, so :func:`is_norm_layer` does not count it, and which class it was made from can
    be told only by that name."""
    names = scripted_norm_class_names()
    found: list[tuple[str, torch.jit.ScriptModule]] = []
    for path, module in model.named_modules():
        if any(path == outer or path.startswith(f"{outer}.") or not outer for outer, _ in found):
            continue
        if isinstance(module, torch.jit.ScriptModule) and getattr(module, "original_name", None) in names:
            found.append((path, module))
    return found


def check_scripted_norms(model: nn.Module, decays: Mapping[nn.Parameter, Any], weight_decay_norm: float,
                         weight_decay_bias: float | None, overrides: Mapping[str, Mapping[str, Any]] | None,
                         caller: str, decayed: str) -> None:
    """Refuse a ``model`` holding a scripted norm layer (:func:`scripted_norm_layers`) whose
    trainable parameters ``decays`` (``{parameter: weight decay}``; None: the optimizer's default)
    does not decay as :func:`expected_norm_decay` says a norm layer's are (``weight_decay_norm``, or
    an override's): a scripted module is no instance of its class, so neither detectron2's
    grouping nor gwdet's can give it ``weight_decay_norm``. ``caller`` begins the message;
    ``decayed`` says what decays them (``"the groups give"``, ``"the optimizer gives"``)."""
    wrong: list[tuple[str, torch.jit.ScriptModule, list[str], Any]] = []
    for path, module in scripted_norm_layers(model):
        misdecayed = [(name, decays[param]) for name, param in module.named_parameters()
                      if param.requires_grad and param in decays and decays[param] != expected_norm_decay(
                          name.rsplit(".", 1)[-1], weight_decay_norm, weight_decay_bias, overrides)]
        if misdecayed:
            wrong.append((path, module, [name for name, _ in misdecayed], misdecayed[0][1]))
    if not wrong:
        return
    path, module, params, decay = wrong[0]
    kind = module.original_name
    where = f"the model's submodule {path!r}" if path else "the model"
    shown = f"the ordinary weight decay {decay!r}" if decay is not None else "the optimizer's default weight decay"
    more = (f" The model holds {len(wrong) - 1} more such scripted norm layer(s): "
            f"{listed([repr(other) for other, *_ in wrong[1:]], 3)}." if len(wrong) > 1 else "")
    raise GwdetTypeError(
        f"{caller}: {where} is a scripted {kind} (a TorchScript {type(module).__name__}, as "
        f"torch.jit.script makes), so its parameters {listed(params, 5)} cannot be given weight_decay_norm="
        f"{weight_decay_norm!r}: a scripted module is no instance of its class, and its original_name {kind!r} is "
        f"a class name only, not the class, so neither detectron2's optimizer grouping nor gwdet's counts it as a "
        f"norm layer ({decayed} them {shown}).{more} Keep the eager {kind} in the model and script the "
        "whole model after building the optimizer (the scripted model shares the eager one's parameters), or "
        "script it for export only.")

# What a rate or decay that torch's optimizers take into a parameter group unchecked would do.
UNCHECKED_RATE = ("torch's optimizers do not check a parameter group's values: a negative rate or decay climbs the "
                  "loss, a NaN makes the weights NaN")
# The values of a parameter group that must be finite numbers >= 0 (the others: booleans, pairs, ...).
RATE_KEYS = ("lr", "weight_decay")


def check_rate(setting: str, value: Any, fix: str, none_allowed: bool = False) -> None:
    """Refuse a learning rate, rate factor or weight decay (``setting``, as the message names it)
    that is not a finite number >= 0 (:data:`UNCHECKED_RATE`; with ``none_allowed``, the message
    says None is taken too), with ``fix``, the sentence saying what to give instead."""
    if not is_finite_number(value) or value < 0:
        shown = repr(value) if is_real_number(value) else f"{value!r} ({type(value).__name__})"
        raise GwdetValueError(f"{setting} must be a finite number >= 0{' or None' if none_allowed else ''}, got "
                              f"{shown}: {UNCHECKED_RATE}. {fix}")


@functools.cache
def optimizer_group_keys() -> tuple[str, ...]:
    """The keys a parameter group of torch's optimizers takes: the arguments (but ``params``) of
    every optimizer class of ``torch.optim`` (``lr``, ``weight_decay``, ``momentum``, ``betas``, ...)."""
    keys: set[str] = set()
    for name in dir(torch.optim):
        kind = getattr(torch.optim, name)
        if isinstance(kind, type) and issubclass(kind, torch.optim.Optimizer) and kind is not torch.optim.Optimizer:
            keys.update(argument for argument, parameter in inspect.signature(kind.__init__).parameters.items()
                        if argument not in ("self", "params")
                        and parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD))
    return tuple(sorted(keys))


# Well-known short or other names of torch's parameter group keys, suggested before a close spelling.
GROUP_KEY_ABBREVIATIONS = {
    "wd": "weight_decay", "decay": "weight_decay", "weightdecay": "weight_decay", "l2": "weight_decay",
    "mom": "momentum", "learning_rate": "lr", "rate": "lr", "beta": "betas", "epsilon": "eps",
}
# The optimizers whose keys are suggested first when the one the overrides are for is not known:
# detectron2's (SGD, which gwdet's build_optimizer builds) and the LazyConfigs' usual AdamW.
USUAL_OPTIMIZERS = (torch.optim.SGD, torch.optim.AdamW)


def keys_of(optimizer: type) -> tuple[str, ...]:
    """The parameter group keys ``optimizer`` (a class of torch's optimizers, or of one's own)
    takes: the arguments of its ``__init__`` but ``params``."""
    try:
        parameters = inspect.signature(optimizer.__init__).parameters  # type: ignore[misc]
    except (TypeError, ValueError):
        return ()
    return tuple(argument for argument, parameter in parameters.items() if argument not in ("self", "params")
                 and parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD))


def group_key_suggestions(key: Any, optimizer: type | None = None) -> list[str]:
    """The group keys an unknown ``key`` of an override may mean: the key a well-known
    abbreviation stands for (:data:`GROUP_KEY_ABBREVIATIONS`, ``wd`` -> ``weight_decay``) or the
    key spelt in other case (``LR`` -> ``lr``); else the close spellings among the keys of
    ``optimizer`` (the optimizer the overrides are for; when not known, SGD's and AdamW's), and
    only when none is close, among those of every optimizer of torch."""
    text = str(key).strip().lower()
    every = optimizer_group_keys()
    preferred = keys_of(optimizer) if optimizer is not None else tuple(
        dict.fromkeys(name for kind in USUAL_OPTIMIZERS for name in keys_of(kind)))
    preferred = preferred or every
    for candidates in (preferred, every):
        if text in GROUP_KEY_ABBREVIATIONS and GROUP_KEY_ABBREVIATIONS[text] in candidates:
            return [GROUP_KEY_ABBREVIATIONS[text]]
        if text in candidates:
            return [text]
    return (difflib.get_close_matches(str(key), preferred) or difflib.get_close_matches(str(key), every))


def check_override_values(overrides: Any, setting: str = "get_default_optimizer_params: overrides",
                          optimizer: type | None = None) -> None:
    """Refuse an ``overrides`` of :func:`get_default_optimizer_params` (``setting``, as the message
    names it) that is not a mapping of ``{parameter name: {group key: value}}``, a group key that
    no parameter group of torch's optimizers takes (:func:`optimizer_group_keys`; SGD would carry a
    misspelt ``weight_decy`` and ignore it; the message suggests the keys it may mean,
    :func:`group_key_suggestions`, among those of ``optimizer``, the optimizer class the overrides
    are for, where given), and an ``lr`` or ``weight_decay`` that is not a finite number >= 0
    (:func:`check_rate`). The parameter names are checked against a model by
    :func:`check_overrides`."""
    example = "{'bias': {'weight_decay': 0.0}}"
    if not isinstance(overrides, Mapping):
        raise GwdetTypeError(
            f"{setting} must be a dict of {{parameter name: {{'lr': ..., 'weight_decay': ...}}}}, e.g. {example}, got "
            f"{overrides!r} ({type(overrides).__name__})")
    keys = optimizer_group_keys()
    for name, values in overrides.items():
        if not isinstance(values, Mapping):
            raise GwdetTypeError(
                f"{setting}[{name!r}] is {values!r} ({type(values).__name__}), but an override is a dict of the "
                f"parameter group's values for the parameters named {name!r} (the group keys of torch's optimizers, "
                f"such as 'lr' and 'weight_decay'). Give e.g. {{{name!r}: {{'weight_decay': {values!r}}}}} for a "
                f"weight decay, or {{{name!r}: {{'lr': ...}}}} for a learning rate.")
        for key, value in values.items():
            if key not in keys:
                raise GwdetValueError(
                    f"{setting}[{name!r}][{key!r}] is no key of a parameter group of torch's optimizers, so the "
                    f"optimizer would carry it and ignore it.{did_you_mean(group_key_suggestions(key, optimizer))} "
                    "The keys they take: "
                    f"{listed([repr(known) for known in keys], 40)}. Use one of them (an optimizer of your own that "
                    "reads other keys: add them to the groups get_default_optimizer_params returns).")
            if key in RATE_KEYS:
                check_rate(f"{setting}[{name!r}][{key!r}]", value,
                           f"Give e.g. {{{name!r}: {{{key!r}: 0.0}}}}, or leave the key out for the default.")


def check_overrides(model: nn.Module, overrides: Mapping[str, Mapping[str, float]]) -> None:
    """Refuse an ``overrides`` of :func:`get_default_optimizer_params` that
    :func:`check_override_values` refuses, or with a key that is the name of no parameter of
    ``model`` (detectron2 matches a key against a parameter's own name within its module,
    ``weight``, ``bias``, ..., and drops a key that matches none), naming the key and the names it
    could mean."""
    check_override_values(overrides)
    names = sorted({name for module in model.modules() for name, _ in module.named_parameters(recurse=False)})
    unknown = [key for key in overrides if key not in names]
    if not unknown:
        return
    key = unknown[0]
    last = key.rsplit(".", 1)[-1] if isinstance(key, str) else None
    if isinstance(key, str) and "." in key and last in names:
        hint = (f" An override names a parameter by its own name within its module, not by its path: {last!r} "
                f"(which sets every parameter of that name), not {key!r}.")
    else:
        hint = did_you_mean(difflib.get_close_matches(str(key), names, n=3))
    raise GwdetValueError(
        f"get_default_optimizer_params: overrides key {key!r} is the name of no parameter of the model, so it would "
        f"change nothing (detectron2 matches a key against a parameter's own name within its module).{hint} The "
        f"model's parameter names: {listed([repr(name) for name in names], 10) if names else 'none (it has no parameter)'}."
        f" Use one of them as the key, or leave the key out."
        + (f" {'The key' if len(unknown) == 2 else 'The keys'} {listed([repr(other) for other in unknown[1:]], 5)} "
           f"{'names' if len(unknown) == 2 else 'name'} no parameter either." if unknown[1:] else ""))


def get_default_optimizer_params(
    model: nn.Module,
    base_lr: float | None = None,
    weight_decay: float | None = None,
    weight_decay_norm: float | None = None,
    bias_lr_factor: float | None = 1.0,
    weight_decay_bias: float | None = None,
    lr_factor_func: Callable[[str], float] | None = None,
    overrides: Mapping[str, Mapping[str, float]] | None = None,
) -> list[dict[str, Any]]:
    """detectron2's ``get_default_optimizer_params`` (same arguments, same groups) in which the
    parameters of every norm layer (:func:`is_norm_layer`) get ``weight_decay_norm``.

    As in detectron2, an override by parameter name (``overrides``, or ``weight_decay_bias`` for
    biases) that sets a weight decay takes precedence over ``weight_decay_norm``. A ``model`` that is
    no torch module, a rate, factor or decay that is not a finite number >= 0 (SGD does not check a
    group's values; :func:`check_rate`), an ``lr_factor_func`` result that is not one (checked as
    the groups are made, naming the parameter), a ``bias_lr_factor`` other than 1 or an
    ``lr_factor_func`` without the ``base_lr`` they multiply, or ``overrides`` that
    :func:`check_overrides` refuses (not a mapping of mappings, a group key torch's optimizers do
    not take, an ``lr`` or ``weight_decay`` below 0 or not finite, a key that is the name of no
    parameter of ``model``) is refused, and so is a ``model`` holding a scripted norm layer
    (``torch.jit.script`` of one) that would not get ``weight_decay_norm``
    (:func:`check_scripted_norms`: no instance of its class, it cannot be told to be a norm layer).
    """
    if not isinstance(model, nn.Module):
        raise GwdetTypeError(f"get_default_optimizer_params: model must be a torch module, got {type(model).__name__}")
    for name, value in (("base_lr", base_lr), ("weight_decay", weight_decay), ("weight_decay_norm", weight_decay_norm),
                        ("bias_lr_factor", bias_lr_factor), ("weight_decay_bias", weight_decay_bias)):
        if value is not None:
            check_rate(f"get_default_optimizer_params: {name}", value,
                       f"Give e.g. {name}={1.0 if name == 'bias_lr_factor' else 0.0}, or None for the default.",
                       none_allowed=True)
    asks_rate = (f"bias_lr_factor={bias_lr_factor!r}" if bias_lr_factor is not None and bias_lr_factor != 1.0 else
                 "lr_factor_func" if lr_factor_func is not None else None)
    if overrides is not None:
        check_overrides(model, overrides)
    if asks_rate is not None and base_lr is None:  # detectron2: a bare "bias_lr_factor requires base_lr"
        raise GwdetValueError(f"get_default_optimizer_params: {asks_rate} multiplies base_lr, which is not given: give "
                              "the optimizer's rate as base_lr too (in a LazyConfig: "
                              "optimizer.params.base_lr=${optimizer.lr}).")
    groups = detectron2_optimizer_params(
        model, base_lr=base_lr, weight_decay=weight_decay, weight_decay_norm=weight_decay_norm,
        bias_lr_factor=bias_lr_factor, weight_decay_bias=weight_decay_bias,
        lr_factor_func=checked_factors(lr_factor_func, base_lr) if lr_factor_func is not None else None,
        overrides=copy.deepcopy(dict(overrides)) if overrides is not None else None,  # detectron2 adds "bias" to it
    )
    if weight_decay_norm is None:
        return groups
    groups = norm_decayed_groups(model, groups, weight_decay_norm, weight_decay_bias, overrides)
    check_scripted_norms(model, {param: group.get("weight_decay") for group in groups for param in group["params"]},
                         weight_decay_norm, weight_decay_bias, overrides, "get_default_optimizer_params",
                         "the groups give")
    return groups


def norm_decayed_groups(model: nn.Module, groups: list[dict[str, Any]], weight_decay_norm: float,
                        weight_decay_bias: float | None,
                        overrides: Mapping[str, Mapping[str, float]] | None) -> list[dict[str, Any]]:
    """detectron2's parameter ``groups`` of ``model`` in which the parameters of every norm layer
    (:func:`norm_parameters`) have ``weight_decay_norm``, those an override by name (``overrides``,
    ``weight_decay_bias`` for biases) gives a weight decay aside; ``groups`` as they are where
    detectron2 already gives every one of them ``weight_decay_norm``."""
    overridden = {name for name, values in (overrides or {}).items() if "weight_decay" in values}
    if weight_decay_bias is not None:
        overridden.add("bias")
    norms = {param for param, (_, param_name) in norm_parameters(model).items() if param_name not in overridden}
    changed = [group for group in groups if any(param in norms and group.get("weight_decay") != weight_decay_norm
                                                for param in group["params"])]
    if not changed:
        return groups
    per_parameter = []
    for group in groups:
        values = {key: value for key, value in group.items() if key not in ("params", "param_names")}
        for param in group["params"]:
            decay = {"weight_decay": weight_decay_norm} if param in norms else {}
            per_parameter.append({"params": [param], **values, **decay})
    return reduce_param_groups(per_parameter)


def checked_factors(lr_factor_func: Callable[[str], float], base_lr: float | None) -> Callable[[str], float]:
    """``lr_factor_func`` whose factor for each parameter (detectron2 calls it with the parameter's
    full name, e.g. ``backbone.bottom_up.stem.conv1.weight``) is refused unless it is a finite
    number >= 0 (:func:`check_rate`), naming the parameter."""
    @functools.wraps(lr_factor_func)
    def factor(name: str) -> float:
        value = lr_factor_func(name)
        check_rate(f"get_default_optimizer_params: lr_factor_func({name!r}), the factor of base_lr={base_lr!r} for "
                   f"parameter {name!r},", value,
                   "Make lr_factor_func return a finite number >= 0 for every parameter name (1.0 keeps base_lr).")
        return value
    return factor


def check_trainable(model: nn.Module) -> None:
    """Refuse a ``model`` without a trainable parameter (none, or all frozen), for which torch would
    stop with "optimizer got an empty parameter list"."""
    if any(parameter.requires_grad for parameter in model.parameters()):
        return
    held = sum(1 for _ in model.parameters())
    what = f"all {held} of its parameters are frozen (requires_grad False)" if held else "it has no parameters"
    raise GwdetValueError(
        f"build_optimizer: the model ({type(model).__name__}) has no trainable parameter: {what}, so an optimizer "
        "would have nothing to train. Build the optimizer for the model that trains (a model made frozen on "
        "purpose is evaluated without one), or make its parameters trainable first (model.requires_grad_(True)).")


def build_optimizer(cfg: CfgNode, model: nn.Module) -> torch.optim.Optimizer:
    """detectron2's ``build_optimizer`` for a yacs config (SGD with ``SOLVER.*``, gradient clipping
    when ``SOLVER.CLIP_GRADIENTS`` is on) over :func:`get_default_optimizer_params`' groups, after
    the config gate (:func:`gwdet.config_checks.ensure_checked`: ``SOLVER`` values such as a
    negative weight decay are refused, naming the key). A model without a trainable parameter is
    refused (torch would stop with "optimizer got an empty parameter list"), and so is a
    ``SOLVER.OPTIMIZER`` (a key of other projects' configs) other than SGD."""
    if not isinstance(cfg, CfgNode) or not isinstance(model, nn.Module):
        raise GwdetTypeError(
            f"build_optimizer(cfg, model) takes a yacs CfgNode and a torch.nn.Module, got {type(cfg).__name__} and "
            f"{type(model).__name__}; for a LazyConfig, build the optimizer with "
            "gwdet.get_default_optimizer_params(model, ...) in its optimizer node")
    ensure_checked(cfg)
    named = cfg.SOLVER.get("OPTIMIZER", "SGD")  # a key of other projects' configs (DETR's, Sparse R-CNN's)
    if not isinstance(named, str) or named.strip().upper() != "SGD":
        raise GwdetValueError(
            f"build_optimizer: SOLVER.OPTIMIZER is {named!r}, but this function builds detectron2's SGD (SOLVER.BASE_LR, "
            "MOMENTUM, NESTEROV, WEIGHT_DECAY), so the optimizer asked for would not be the one trained with. Build "
            "that optimizer over gwdet.get_default_optimizer_params(model, ...) (e.g. torch.optim.AdamW(params, ...)), "
            "which gives the norm layers SOLVER.WEIGHT_DECAY_NORM, or remove SOLVER.OPTIMIZER to train with SGD.")
    check_trainable(model)
    warn_of_untrained_parts(model, cfg.MODEL.WEIGHTS, "MODEL.WEIGHTS")
    params = get_default_optimizer_params(
        model,
        base_lr=cfg.SOLVER.BASE_LR,
        weight_decay_norm=cfg.SOLVER.WEIGHT_DECAY_NORM,
        bias_lr_factor=cfg.SOLVER.BIAS_LR_FACTOR,
        weight_decay_bias=cfg.SOLVER.WEIGHT_DECAY_BIAS,
    )
    sgd = torch.optim.SGD(params, lr=cfg.SOLVER.BASE_LR, momentum=cfg.SOLVER.MOMENTUM,
                          nesterov=cfg.SOLVER.NESTEROV, weight_decay=cfg.SOLVER.WEIGHT_DECAY, foreach=True)
    return maybe_add_gradient_clipping(cfg, sgd)


def warn_of_untrained_parts(model: nn.Module, weights: str, weights_setting: str) -> None:
    """Warn, when the initial weights (``weights`` of ``weights_setting``) are empty, of the parts
    of ``model`` that training leaves as they are built: frozen parameters (``requires_grad`` off,
    as ``MODEL.BACKBONE.FREEZE_AT`` leaves the first stages) stay random, FrozenBN layers stay
    identities. The training tools refuse such a config; built in Python, the model may still get
    weights loaded by the caller, so this is a warning."""
    if weights:
        return
    frozen = [name for name, parameter in model.named_parameters() if not parameter.requires_grad]
    fixed = [name for name, module in model.named_modules() if isinstance(module, FrozenBatchNorm2d)]
    if not frozen and not fixed:
        return
    parts = ([f"{len(frozen)} frozen parameter(s) ({listed(frozen, 2)}), which would stay random"] if frozen else []) + \
        ([f"{len(fixed)} FrozenBN layer(s) ({listed(fixed, 2)}), which would stay identities"] if fixed else [])
    logger.warning(
        f"{weights_setting} is empty (training from scratch), and the model has {' and '.join(parts)}: training "
        "leaves them as they are built. Load pretrained weights into the model before training (docs/weights.md), "
        "or build it without frozen parts (MODEL.BACKBONE.FREEZE_AT 0 and a norm that learns, as configs/Study/ "
        "does); tools/train_net.py refuses such a config.")


def weight_decay_of(param_groups: Iterable[Mapping[str, Any]], defaults: Mapping[str, Any]) -> dict[nn.Parameter, float]:
    """``{parameter: weight decay}`` of an optimizer's (or a parameter list's) groups; a group
    without its own value takes ``defaults["weight_decay"]`` (0 when the optimizer has none)."""
    return {param: group.get("weight_decay", defaults.get("weight_decay", 0.0))
            for group in param_groups for param in group["params"]}


def expected_norm_decay(param_name: str, weight_decay_norm: float, weight_decay_bias: float | None = None,
                        overrides: Mapping[str, Mapping[str, Any]] | None = None) -> float:
    """The weight decay :func:`get_default_optimizer_params` gives a norm layer's parameter named
    ``param_name`` (within its layer): the ``weight_decay`` of an override by that name
    (``overrides``), for a bias ``weight_decay_bias`` when that is set (detectron2 makes it the
    override of ``bias``), else ``weight_decay_norm``: an override takes precedence over it."""
    if param_name == "bias" and weight_decay_bias is not None:
        return weight_decay_bias
    override = (overrides or {}).get(param_name)
    if isinstance(override, Mapping) and "weight_decay" in override:
        return override["weight_decay"]
    return weight_decay_norm


def misdecayed_norm_layers(model: nn.Module, optimizer: torch.optim.Optimizer, weight_decay_norm: float,
                           weight_decay_bias: float | None = None,
                           overrides: Mapping[str, Mapping[str, Any]] | None = None) -> list[str]:
    """The norm layers of ``model`` with a parameter that ``optimizer`` decays by another value than
    the config's norm setting, each as ``"<layer> (<value>)"``: ``weight_decay_norm``, or where an
    override sets the parameter's weight decay (``overrides`` by parameter name, for a bias
    ``weight_decay_bias`` when that is set), the override's (:func:`expected_norm_decay`)."""
    decays = weight_decay_of(optimizer.param_groups, optimizer.defaults)
    found: dict[str, float] = {}
    for param, (layer, param_name) in norm_parameters(model).items():
        expected = expected_norm_decay(param_name, weight_decay_norm, weight_decay_bias, overrides)
        decay = decays.get(param)
        if decay is not None and decay != expected:
            found.setdefault(layer, decay)
    return [f"{layer} ({decay:g})" for layer, decay in found.items()]
