"""A LazyConfig's values checked before anything is built, as a yacs config's are by
:mod:`gwdet.config_checks`: the ``train``, ``optimizer`` and ``lr_multiplier`` values training
reads (:func:`check_training_values`), those every run reads (:func:`check_run_values`), the
loaders against the model (:func:`check_loader_values`, :func:`check_resize_nodes`) and the
datasets (:func:`check_datasets`). A value with a yacs twin is refused in the words of that
twin's check (:func:`check_twin`). Also the dataset names a LazyConfig trains and evaluates on
(:func:`dataset_names`).
"""
from __future__ import annotations

import copy
import inspect
import logging
import math
import sys
from typing import Any, Callable, Iterator, Sequence, cast

import torch
from omegaconf import DictConfig, ListConfig, OmegaConf, read_write
from omegaconf.errors import OmegaConfBaseException

from detectron2.config import CfgNode, instantiate
from detectron2.data.transforms import ResizeShortestEdge
from detectron2.solver import get_default_optimizer_params as detectron2_optimizer_params

from gwdet.config import ABSENT, CONFIG_KEYS
from gwdet.config_checks import (
    DETECTRON2_VALUE_RULES,
    SAMPLERS,
    SEED_LIMIT,
    ZERO_RATE,
    check_batch_split,
    check_example_groups,
    check_pixel_normalization,
    is_finite_number,
    is_whole_number,
    no_positive_samples,
)
from gwdet.data.coco_registration import DatasetUse, check_datasets_fit, known_class_names
from gwdet.data.shapes import SPEC_CONFIG_KEYS, ShapesSpec, check_image_size
from gwdet.errors import GwdetError, GwdetTypeError, GwdetValueError, listed
from gwdet.model_zoo.lazy_loading import argument_names, callable_of, refuse_numpy_values, select
from gwdet.norms import (Norm, UnknownNormError, check_norm_layer, known_norm_names, no_norm_message, norm,
                         norm_record, norm_records, unknown_params_message)
from gwdet.modeling.backbone import place_norm
from gwdet.modeling.build import check_mixed_precision, check_run_device, check_scratch_training
from gwdet.solver import check_override_values, get_default_optimizer_params
from gwdet.utils.cli_errors import output_path_problem

logger = logging.getLogger(__name__)

FREEZE_SETTING = "model.backbone.bottom_up.freeze_at"  # MODEL.BACKBONE.FREEZE_AT's twin
MASK_FORMAT_SETTING = "dataloader.train.mapper.instance_mask_format"  # INPUT.MASK_FORMAT's twin
# Settings that take the values of a yacs key gwdet checks (gwdet.config.CONFIG_KEYS,
# gwdet.config_checks.DETECTRON2_VALUE_RULES), as (setting, yacs key): those every run reads, and
# those only training reads. The arguments of each L(ShapesSpec) node are checked the same way
# (gwdet.data.shapes.SPEC_CONFIG_KEYS).
RUN_TWINS = (
    ("train.vis_images", "TEST.VIS_IMAGES"), ("dataloader.test.num_workers", "DATALOADER.NUM_WORKERS"),
    ("model.roi_heads.box_predictor.test_score_thresh", "MODEL.ROI_HEADS.SCORE_THRESH_TEST"),
    ("model.roi_heads.box_predictor.test_nms_thresh", "MODEL.ROI_HEADS.NMS_THRESH_TEST"),
    ("model.roi_heads.box_predictor.test_topk_per_image", "TEST.DETECTIONS_PER_IMAGE"),
    ("model.proposal_generator.nms_thresh", "MODEL.RPN.NMS_THRESH"),
    ("model.roi_heads.box_predictor.box2box_transform.weights", "MODEL.ROI_BOX_HEAD.BBOX_REG_WEIGHTS"),
    ("model.proposal_generator.box2box_transform.weights", "MODEL.RPN.BBOX_REG_WEIGHTS"),
)
# the model's counts, which detectron2 takes without a word or stops on with a raw error
MODEL_TWINS = (
    ("model.roi_heads.num_classes", "MODEL.ROI_HEADS.NUM_CLASSES"),
    ("model.backbone.out_channels", "MODEL.FPN.OUT_CHANNELS"),
)
TRAINING_TWINS = (
    ("dataloader.train.num_workers", "DATALOADER.NUM_WORKERS"),
    (FREEZE_SETTING, "MODEL.BACKBONE.FREEZE_AT"),
    ("model.roi_heads.batch_size_per_image", "MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE"),
    ("model.roi_heads.positive_fraction", "MODEL.ROI_HEADS.POSITIVE_FRACTION"),
    ("model.proposal_generator.batch_size_per_image", "MODEL.RPN.BATCH_SIZE_PER_IMAGE"),
    ("model.proposal_generator.positive_fraction", "MODEL.RPN.POSITIVE_FRACTION"),
    ("optimizer.params.weight_decay_norm", "SOLVER.WEIGHT_DECAY_NORM"),
    ("lr_multiplier.warmup_factor", "SOLVER.WARMUP_FACTOR"),
    ("lr_multiplier.warmup_method", "SOLVER.WARMUP_METHOD"),
    ("optimizer.params.bias_lr_factor", "SOLVER.BIAS_LR_FACTOR"),
)
# the loss_weight arguments of detectron2's heads: a number, or (box predictor, RPN) one per loss by its name
LOSS_WEIGHT_SETTINGS = ("model.roi_heads.box_predictor.loss_weight", "model.proposal_generator.loss_weight",
                        "model.roi_heads.mask_head.loss_weight", "model.roi_heads.keypoint_head.loss_weight",
                        "model.sem_seg_head.loss_weight")
# get_default_optimizer_params's arguments whose None means "the optimizer's own value"
OPTIONAL_TRAINING_TWINS = (
    ("optimizer.params.base_lr", "SOLVER.BASE_LR"),
    ("optimizer.params.weight_decay", "SOLVER.WEIGHT_DECAY"),
    ("optimizer.params.weight_decay_bias", "SOLVER.WEIGHT_DECAY_BIAS"),
)
# The arguments by which detectron2's components (and gwdet's) take a norm for get_norm
NORM_ARGUMENTS = ("norm", "conv_norm")
# GeneralizedRCNN's arguments that MODEL.PIXEL_MEAN, MODEL.PIXEL_STD and INPUT.FORMAT give in a yacs config
LAZY_PIXEL_KEYS = ("model.pixel_mean", "model.pixel_std", "model.input_format")


def evaluated_dataset(cfg: DictConfig) -> str:
    """The name of the dataset ``dataloader.evaluator`` evaluates (its ``dataset_name``, an
    ``L(...)`` node such as ``gwdet.data.shapes_dataset`` instantiated), or ``""``."""
    name = select(cfg, "dataloader.evaluator.dataset_name")
    if isinstance(name, DictConfig):
        name = instantiate(name)
    return name if isinstance(name, str) else ""


def check_training_values(cfg: DictConfig, world_size: int) -> None:
    """Refuse, before anything is built, ``train`` values a training run cannot start with
    (detectron2 would stop later with a bare ZeroDivisionError or TypeError): ``train.max_iter``,
    ``train.log_period`` and ``train.checkpointer.period`` below 1 or not whole numbers,
    ``train.eval_period`` below 0, an ``optimizer.lr`` or ``weight_decay`` below 0, an
    ``optimizer.momentum`` outside [0, 1), a ``dataloader.train.total_batch_size`` that the
    ``world_size`` processes cannot share evenly, a ``train.checkpointer.max_to_keep`` below 1, an
    ``lr_multiplier.warmup_length`` outside [0, 1], an ``lr_multiplier`` that cannot be built,
    ``train.amp.enabled`` without CUDA, and
    :data:`TRAINING_TWINS` (loader workers, frozen stages, sampling, warm-up, as their yacs keys)."""
    for key, least in (("train.max_iter", 1), ("train.log_period", 1), ("train.checkpointer.period", 1),
                       ("train.eval_period", 0)):
        value = select(cfg, key)
        if value is ABSENT:
            continue
        if not is_whole_number(value) or value < least:
            text = (" (str, as OmegaConf's ${oc.env:NAME} gives it: give the number itself, from a shell "
                    f"{key}=$NAME)") if isinstance(value, str) else ""
            raise GwdetValueError(f"{key}={value!r}{text}: give a whole number of iterations of at least {least}, "
                                  f"e.g. {key}={max(least, 1) * 100}.")
    check_optimizer_values(cfg)
    batch = select(cfg, "dataloader.train.total_batch_size")
    if batch is not ABSENT:
        check_batch_split(f"dataloader.train.total_batch_size={batch!r}", batch, world_size)
        check_example_group_nodes(cfg, batch, world_size)
    _check_checkpoints_kept(cfg)
    _check_warmup_length(cfg)
    enabled = select(cfg, "train.amp.enabled")
    check_mixed_precision(enabled is not ABSENT and enabled, select(cfg, "train.device"), "train.amp.enabled",
                          "train.device", "train.amp.enabled=False", "train.device=cuda")
    check_twins(cfg, TRAINING_TWINS)
    check_twins(cfg, OPTIONAL_TRAINING_TWINS, none_allowed=True)
    _check_loss_weights(cfg)
    if not select(cfg, "train.init_checkpoint"):  # from scratch (ABSENT is falsy too)
        frozen = frozen_norm_nodes(cfg)
        freeze_at = select(cfg, FREEZE_SETTING)
        check_scratch_training([listed(frozen, 3)] if frozen else [], freeze_at if is_whole_number(freeze_at) else 0,
                               "train.init_checkpoint", FREEZE_SETTING)
    _check_lr_schedule(cfg)  # after its values' own checks, which name the value
    nodes = {"ROI_HEADS": "model.roi_heads", "RPN": "model.proposal_generator"}  # the yacs sections' twins
    for section, samples, losses in SAMPLERS:
        node = nodes[section]
        batch, fraction = select(cfg, f"{node}.batch_size_per_image"), select(cfg, f"{node}.positive_fraction")
        problem = no_positive_samples(batch, fraction, f"{node}.batch_size_per_image", f"{node}.positive_fraction",
                                      samples, losses)
        if problem is not None:
            raise GwdetValueError(f"{node}.positive_fraction={fraction!r} {problem}")


def check_optimizer_values(cfg: DictConfig) -> None:
    """The ``optimizer`` values :func:`check_training_values` checks: an ``optimizer.lr`` as
    ``SOLVER.BASE_LR`` (a warning for 0), an ``optimizer.weight_decay`` below 0, an
    ``optimizer.momentum`` outside [0, 1), ``optimizer.nesterov=True`` without momentum, and an
    ``optimizer.params.overrides`` of gwdet's or detectron2's ``get_default_optimizer_params``
    that :func:`gwdet.solver.check_override_values` refuses, a misspelt group key with the keys of
    the config's optimizer class it may mean (its parameter names are checked against the model
    when the optimizer is built)."""
    optimizer_values: tuple[tuple[str, float | None, float], ...] = (
        ("optimizer.lr", None, 0.02), ("optimizer.weight_decay", None, 1e-4), ("optimizer.momentum", 1.0, 0.9))
    for key, below, example in optimizer_values:  # each at least 0, below ``below`` where given
        setting = select(cfg, key)
        if setting is ABSENT or isinstance(setting, DictConfig):
            continue
        if key == "optimizer.lr":  # SOLVER.BASE_LR's rule, and its warning for 0
            check_twin(key, setting, "SOLVER.BASE_LR")
            if setting == 0:
                logger.warning(ZERO_RATE.format(setting=f"{key}={setting!r}"))
        elif not (is_finite_number(setting) and setting >= 0 and (below is None or setting < below)):
            bound = f"from 0 to below {below:g}" if below is not None else "finite and at least 0"
            raise GwdetValueError(f"{key}={setting!r}: give a number {bound}, e.g. {key}={example:g} (torch's optimizer "
                                  "would refuse it, or train with it, once the model is built).")
    nesterov, momentum = select(cfg, "optimizer.nesterov"), select(cfg, "optimizer.momentum")
    if nesterov is True and is_finite_number(momentum) and momentum <= 0:
        raise GwdetValueError(f"optimizer.nesterov=True needs momentum, but optimizer.momentum is {momentum!r}: torch's "
                              "SGD refuses Nesterov momentum without it once the model is built. Set "
                              "optimizer.momentum above 0 (e.g. 0.9) or optimizer.nesterov=False.")
    overrides = select(cfg, "optimizer.params.overrides")
    if overrides not in (ABSENT, None) and callable_of(select(cfg, "optimizer.params")) in (
            get_default_optimizer_params, detectron2_optimizer_params):
        optimizer = callable_of(select(cfg, "optimizer"))
        check_override_values(OmegaConf.to_container(overrides, resolve=True) if isinstance(
            overrides, (DictConfig, ListConfig)) else overrides, "optimizer.params.overrides",
            optimizer if isinstance(optimizer, type) and issubclass(optimizer, torch.optim.Optimizer) else None)


def _check_loss_weights(cfg: DictConfig) -> None:
    """Each of :data:`LOSS_WEIGHT_SETTINGS` the config holds, and each weight of one given per loss
    (``{"loss_cls": 1.0, "loss_box_reg": 1.0}``), as its yacs twin (:func:`check_twin`): the rule of
    detectron2's yacs loss weights (:data:`gwdet.config_checks.LOSS_WEIGHT`)."""
    for key in LOSS_WEIGHT_SETTINGS:
        value = select(cfg, key)
        if value is ABSENT:
            continue
        weights = {f"{key}.{loss!s}": weight for loss, weight in value.items()} if isinstance(value, DictConfig) \
            else {key: value}
        for setting, weight in weights.items():
            check_twin(setting, weight, "MODEL.RPN.LOSS_WEIGHT")


def check_example_group_nodes(cfg: DictConfig, batch: int, world_size: int) -> None:
    """The example groups of each ``L(gwdet.norm)`` node of BGN or GhostBN outside the ROI heads
    (whose batches are their boxes) checked against the batch, as a yacs config's
    ``MODEL.BGN.EXAMPLES_PER_GROUP`` is (:func:`gwdet.config_checks.check_example_groups`)."""
    for path, node, called in lazy_calls(select(cfg, "model"), "model"):
        if called is not norm or path.startswith("model.roi_heads"):
            continue
        try:
            made = norm(**_call_arguments(node))
        except GwdetError:  # a node check_norm_nodes refuses, naming it
            continue
        if norm_record(made.name).example_groups:
            check_example_groups(made.params["examples_per_group"], batch, world_size, [path],
                                 f"{path}.examples_per_group", "dataloader.train.total_batch_size")


def frozen_norm_nodes(cfg: DictConfig) -> list[str]:
    """The model's norms that are FrozenBN: ``norm`` / ``conv_norm`` arguments of that name, and
    ``L(gwdet.norm)`` nodes of it, as dotted keys (a value shared by interpolation counted where used)."""
    found = []
    for path, node, called in lazy_calls(select(cfg, "model"), "model"):
        for argument in ("name",) if called is norm else NORM_ARGUMENTS:
            try:
                value = node.get(argument)
            except OmegaConfBaseException:  # an interpolation that does not resolve: named by other checks
                continue
            if value == "FrozenBN":
                found.append(path if called is norm else f"{path}.{argument}")
    return found


def _check_checkpoints_kept(cfg: DictConfig) -> None:
    """``train.checkpointer.max_to_keep``: None (every checkpoint kept) or a whole number >= 1
    (detectron2's PeriodicCheckpointer stops with a bare AssertionError otherwise)."""
    kept = select(cfg, "train.checkpointer.max_to_keep")
    if kept is ABSENT or kept is None or (is_whole_number(kept) and kept >= 1):
        return
    raise GwdetValueError(
        f"train.checkpointer.max_to_keep={kept!r}: give the number of periodic checkpoints to keep, a whole number "
        "of at least 1 (older ones are deleted), or null to keep every one, e.g. train.checkpointer.max_to_keep=3 "
        "(detectron2's PeriodicCheckpointer would stop with a bare AssertionError).")


def _check_warmup_length(cfg: DictConfig) -> None:
    """``lr_multiplier.warmup_length`` (detectron2's WarmupParamScheduler): the fraction of
    ``train.max_iter`` the warm-up lasts, in [0, 1]."""
    length = select(cfg, "lr_multiplier.warmup_length")
    if is_finite_number(length) and length == 1:
        logger.warning("lr_multiplier.warmup_length=1: the warm-up lasts the whole run, whose learning rate then never "
                       "reaches optimizer.lr. Shorten the warm-up (e.g. lr_multiplier.warmup_length=0.1) to train at "
                       "the base rate.")
    if length is ABSENT or (is_finite_number(length) and 0 <= length <= 1):
        return
    max_iter = select(cfg, "train.max_iter")
    meant = (f"; for a warm-up of {length:g} iterations of train.max_iter={max_iter}, "
             f"lr_multiplier.warmup_length={length / max_iter:g}"
             if is_finite_number(length) and 1 < length <= (max_iter if is_whole_number(max_iter) else 0) else "")
    raise GwdetValueError(
        f"lr_multiplier.warmup_length={length!r}: give the fraction of train.max_iter the warm-up lasts, a number "
        f"from 0 (no warm-up) to 1, e.g. lr_multiplier.warmup_length=0.1{meant} (fvcore's scheduler would stop "
        "with 'where in ParamScheduler must be in [0, 1]' at the first iteration).")


def _check_lr_schedule(cfg: DictConfig) -> None:
    """``lr_multiplier`` builds (it holds values only: fvcore's schedulers check their milestones,
    values and length when constructed, which detectron2 does after building the model); no
    fixed-gamma steps (they fail after the last iteration); and, evaluated where detectron2's
    ``LRMultiplier`` evaluates it (each iteration's fraction of ``train.max_iter``, 1.0 after the
    last), it gives a factor everywhere and no negative one; a warning for factors that rise after
    the warm-up and for milestones before the first iteration. The schedule is
    ``lr_multiplier.scheduler`` under a warm-up, or ``lr_multiplier`` itself."""
    node = select(cfg, "lr_multiplier")
    if not isinstance(node, DictConfig):
        return
    path = "lr_multiplier.scheduler" if isinstance(select(cfg, "lr_multiplier.scheduler"), DictConfig) else "lr_multiplier"
    values = select(cfg, f"{path}.values")
    if isinstance(values, ListConfig) and not all(is_finite_number(value) and value > 0 for value in values):
        raise GwdetValueError(
            f"{path}.values={list(values)!r}: each value multiplies the learning rate from its "
            "milestone on, so each must be a finite number > 0 (0 stops training there, as SOLVER.GAMMA 0 would), "
            f"e.g. {path}.values=[1.0,0.1,0.01].")
    try:
        multiplier = instantiate(node)
    except Exception as error:  # fvcore's ValueErrors, an unknown argument's TypeError
        scheduler = callable_of(select(cfg, path))
        if getattr(scheduler, "__name__", "") == "MultiStepParamScheduler":
            example = ("a multi-step schedule takes increasing milestones below its num_updates and one value more "
                       f"than milestones, e.g. {path}.milestones=[800,950] with values=[1,0.1,0.01]")
        else:
            name = getattr(scheduler, "__qualname__", "its _target_")
            example = f"{path} builds {name}: give it values that class accepts"
        raise GwdetValueError(
            f"lr_multiplier cannot be built: {type(error).__name__}: {error}. Fix the lr_multiplier values the message "
            f"names ({example}).") from None
    if getattr(callable_of(select(cfg, path)), "__name__", "") == "StepWithFixedGammaParamScheduler":
        raise GwdetValueError(
            f"{path} is fvcore's StepWithFixedGammaParamScheduler, which stops the training after its "
            "last iteration: detectron2's LR hook steps the scheduler once more, at the end of the schedule, where it "
            "has no value (IndexError), so no model_final.pth and no results are written. Use a "
            "MultiStepParamScheduler with the same values (detectron2's common/optim.py and coco_schedule.py show one).")
    max_iter = select(cfg, "train.max_iter")
    if callable(multiplier) and is_whole_number(max_iter) and max_iter >= 1:
        warmup = select(cfg, "lr_multiplier.warmup_length") if path != "lr_multiplier" else 0
        _check_factors(multiplier, max_iter, path, warmup if is_finite_number(warmup) else 0)
    _warn_of_early_milestones(cfg, path)


# the most points of the schedule evaluated (each iteration's, up to this many iterations)
_SCHEDULE_POINTS = 100_000


def _check_factors(multiplier: Callable[[float], Any], max_iter: int, path: str, warmup: float) -> None:
    """The factors ``multiplier`` gives at each iteration ``i`` of ``max_iter`` (at ``i / max_iter``,
    as detectron2's ``LRMultiplier`` asks, 1.0 after the last iteration): refused where it fails or
    is negative; a warning where it rises after the ``warmup`` fraction."""
    step = max(1, max_iter // _SCHEDULE_POINTS)
    iterations = [*range(0, max_iter, step), max_iter]
    factors = []
    for iteration in iterations:
        try:
            factor = float(multiplier(iteration / max_iter))
        except Exception as error:  # fvcore's RuntimeError at where 1.0, an IndexError past the last value
            when = "after the last iteration" if iteration == max_iter else f"at iteration {iteration}"
            raise GwdetValueError(
                f"lr_multiplier fails {when} of train.max_iter={max_iter} ({type(error).__name__}: {error}): "
                "detectron2's LR hook evaluates it at each iteration's fraction of the run, up to 1.0 after the last, "
                "so the training would stop there without model_final.pth or results. Give a schedule defined on the "
                "whole run, e.g. fvcore's MultiStepParamScheduler, or CosineParamScheduler(start_value=1.0, "
                "end_value=1.0) for a constant rate.") from None
        if not factor >= 0:
            why = ("a factor that is no number makes the learning rate none" if math.isnan(factor) else
                   "a negative factor turns the learning rate negative (the loss would climb)")
            raise GwdetValueError(
                f"{path} gives the factor {factor:g} of optimizer.lr at iteration {iteration} of train.max_iter="
                f"{max_iter}, and {why}: give factors of at least 0 over the whole run.")
        factors.append(factor)
    after = [(iteration, factor) for iteration, factor in zip(iterations, factors, strict=True)
             if iteration >= warmup * max_iter]
    start = next((index for index, (a, b) in enumerate(zip(after, after[1:], strict=False))
                  if b[1] > a[1] * (1 + 1e-9) + 1e-12), None)
    if start is not None:
        (low_at, low), (high_at, high) = after[start], max(after[start:], key=lambda point: point[1])
        logger.warning(f"{path}'s factors of optimizer.lr rise (from {low:g} at iteration {low_at} to {high:g} at "
                       f"iteration {high_at}): the learning rate grows during the run; give falling factors (e.g. "
                       "[1.0, 0.1, 0.01]) to lower it.")


def _warn_of_early_milestones(cfg: DictConfig, path: str = "lr_multiplier.scheduler") -> None:
    """A warning when a milestone of the schedule at ``path`` (in units of its ``num_updates``)
    falls before the first iteration of ``train.max_iter``: detectron2's ``LRMultiplier`` gives the
    scheduler the fraction of ``train.max_iter`` done, so milestones meant as iterations of a
    longer ``num_updates`` all act at once (a shorter run of a shipped config keeps its steps'
    proportions, as intended)."""
    updates, milestones = select(cfg, f"{path}.num_updates"), select(cfg, f"{path}.milestones")
    max_iter = select(cfg, "train.max_iter")
    if not (is_whole_number(updates) and is_whole_number(max_iter) and isinstance(milestones, ListConfig)):
        return
    at = [milestone * max_iter / updates for milestone in milestones if is_finite_number(milestone)]
    if any(iteration < 1 for iteration in at) and updates == max_iter:
        logger.warning(
            f"{path}.milestones {list(milestones)} hold a milestone before the first iteration: the "
            f"scheduler's step there acts from the start of training, so its first value is never used. Remove that "
            f"milestone, or give the milestones as iterations from 1 to train.max_iter={max_iter}.")
    elif any(iteration < 1 for iteration in at):
        logger.warning(
            f"{path}.num_updates={updates} is not train.max_iter={max_iter}: detectron2's LRMultiplier "
            f"gives the scheduler the fraction of train.max_iter done, so its milestones {list(milestones)} (in units of "
            f"num_updates) fall at iterations {', '.join(f'{iteration:g}' for iteration in at)}. Give "
            f"num_updates=${{train.max_iter}} (or {max_iter}) for milestones in iterations.")


def check_twin(key: str, value: Any, twin: str) -> None:
    """Raise ``ValueError`` naming the LazyConfig setting ``key`` for a ``value`` that gwdet's check
    of its yacs twin ``twin`` refuses, in that check's words: a key of :data:`gwdet.config.CONFIG_KEYS`,
    or of :data:`gwdet.config_checks.DETECTRON2_VALUE_RULES` (whose rule is given an empty config:
    the twins here read their own value only)."""
    gwdet_checks = {config_key.name: config_key.check for config_key in CONFIG_KEYS}
    if twin in gwdet_checks:
        try:
            gwdet_checks[twin]("config", key, value)
        except GwdetValueError as error:
            raise GwdetValueError(f"{error} (as {twin} in a yacs config)") from None
        return
    problem = {rule.key: rule.problem for rule in DETECTRON2_VALUE_RULES}[twin](CfgNode(), value)
    if problem is not None:
        raise GwdetValueError(f"{key}={value!r} {problem}")


def check_twins(cfg: DictConfig, twins: Sequence[tuple[str, str]], none_allowed: bool = False) -> None:
    """:func:`check_twin` for each ``(setting, yacs key)`` of ``twins`` that ``cfg`` holds (and
    that is not None, with ``none_allowed``)."""
    for key, twin in twins:
        value = select(cfg, key)
        if value is not ABSENT and not (none_allowed and value is None):
            check_twin(key, value, twin)


def nodes_calling(node: DictConfig | ListConfig, target: Any, path: str = "") -> Iterator[tuple[str, DictConfig]]:
    """The ``L(target)(...)`` nodes in ``node`` and their dotted keys (below ``path``), each found
    where it is defined: references to a node (``"${dataloader.shapes}"``) are not followed."""
    return ((key, call) for key, call, called in lazy_calls(node, path) if called is target)


def lazy_calls(node: DictConfig | ListConfig, path: str = "") -> Iterator[tuple[str, DictConfig, Any]]:
    """Every ``L(...)`` node in ``node`` with its dotted key (below ``path``) and the callable it
    calls, each found where it is defined: references to a node are not followed."""
    called = callable_of(node)  # None for a list, or a node that calls nothing
    if isinstance(node, DictConfig) and called is not None:
        yield path, node, called
    keys: list[Any] = [str(key) for key in node.keys()] if isinstance(node, DictConfig) else list(range(len(node)))
    for key in keys:
        if OmegaConf.is_interpolation(node, key) or OmegaConf.is_missing(node, key):
            continue
        child = node[key]
        if isinstance(child, (DictConfig, ListConfig)):
            yield from lazy_calls(child, f"{path}.{key}" if path else str(key))


def check_call_arguments(cfg: DictConfig) -> None:
    """Every ``L(...)`` node of ``cfg`` gives only arguments its callable takes (unless it takes
    ``**kwargs``), refused naming the node, the key and what the callable takes, before anything is
    written or built: ``instantiate`` would stop with ``TypeError: ... unexpected keyword argument``
    once the model is built (e.g. an optimizer whose ``_target_`` became ``torch.optim.Adam`` keeps
    SGD's ``momentum``)."""
    for path, node, called in lazy_calls(cfg):
        what = getattr(called, "__qualname__", repr(called))
        if "_args_" in node:  # hydra's positional arguments: detectron2's instantiate passes them on as a keyword
            raise GwdetValueError(
                f"{path}._args_: detectron2's instantiate calls {what} with keyword arguments only, and passes "
                "_args_ on as one more of them (hydra reads it as positional arguments; detectron2 does not). Give "
                f"the arguments by name (a norm: L(gwdet.norm)(name='GN', num_groups=4), or a name detectron2's "
                "get_norm knows).")
        names, takes_any = argument_names(called)
        given = [str(key) for key in node.keys() if key != "_target_"]
        unknown = [key for key in given if key not in names]
        if unknown and not takes_any and names:
            raise GwdetValueError(
                f"{path}: {what} takes no argument {listed(map(repr, unknown), 5)}; it takes "
                f"{', '.join(sorted(names))}. Remove {', '.join(f'{path}.{key}' for key in unknown)} from the config "
                "(in a .py config of your own, e.g. del cfg." + f"{path}.{unknown[0]}; a key=value override cannot "
                f"remove a key), or set {path}._target_ to a callable that takes {'them' if len(unknown) > 1 else 'it'}.")


def warn_unused_head_norms(cfg: DictConfig) -> None:
    """A warning for each ROI head node of the model with a ``conv_norm`` but no convolution to put
    it after (``conv_dims=[]``; a mask head's last dim is its deconvolution), as a yacs config's
    NORM on a head of ``NUM_CONV 0`` is warned of: detectron2's heads normalize their convolutions only."""
    from detectron2.modeling.roi_heads import FastRCNNConvFCHead, MaskRCNNConvUpsampleHead

    for path, node, called in lazy_calls(select(cfg, "model"), "model"):
        if not isinstance(called, type) or not issubclass(called, (FastRCNNConvFCHead, MaskRCNNConvUpsampleHead)):
            continue
        norm_given = node.get("conv_norm") if not OmegaConf.is_interpolation(node, "conv_norm") else True
        dims = node.get("conv_dims")
        if not norm_given or not isinstance(dims, ListConfig):
            continue
        convs = len(dims) - (1 if issubclass(called, MaskRCNNConvUpsampleHead) else 0)
        if convs <= 0:
            logger.warning(f"{path}.conv_norm is given, but {path}.conv_dims={list(dims)} gives the head no convolution "
                           "to normalize, so the model has no norm there. Give the head convolutions (e.g. "
                           f"{path}.conv_dims=[256,256,256,256]) or leave out {path}.conv_norm.")


def _call_arguments(node: DictConfig) -> dict[str, Any]:
    """The keyword arguments an ``L(...)`` node passes to its callable, interpolations resolved."""
    values = cast(dict, OmegaConf.to_container(node, resolve=True))  # a DictConfig's container
    return {str(key): value for key, value in values.items() if key != "_target_"}


def check_norm_nodes(cfg: DictConfig) -> None:
    """The model's norms checked before anything is written or built, as a yacs config's NORM
    values are: every ``L(gwdet.norm)(...)`` node is made (:class:`gwdet.norms.Norm` checks its
    name and settings; the error names the node), and a norm that a detectron2 or gwdet component
    takes by name (its ``norm`` or ``conv_norm`` argument) must be one detectron2's ``get_norm``
    builds: gwdet's names need a ``gwdet.norm`` node with their settings. ``None`` is refused
    (``''`` is no norm). A plain callable given as a norm argument (:func:`bare_norm_callables`)
    must take the channel count alone (:func:`_check_norm_callable`); its layers are checked as
    the model is built (:func:`norm_checked_model`)."""
    detectron2_names = ["", *(record.name for record in norm_records() if record.detectron2_values is not None)]
    for path, node, called in lazy_calls(select(cfg, "model"), "model"):
        if called is norm:
            arguments = _call_arguments(node)
            try:
                norm(**arguments)
            except GwdetTypeError as error:  # values of the norm the node named before (name=GW_ZCA over GW's T)
                taken = norm_record(str(arguments.get("name"))).params() if "name" in arguments else []
                left = [key for key, value in arguments.items()
                        if key not in ("name", "strict") and key not in taken and value is not None]
                said = (unknown_params_message(str(arguments["name"]), taken, sorted(left), path) if left and taken
                        else error.args[0])
                raise GwdetTypeError(f"{path}: {said}") from None
            except (UnknownNormError, GwdetValueError) as error:
                name = arguments.get("name")
                said = _no_norm_said(cfg, path, name) if name is None or name == "" else error.args[0]
                raise type(error)(f"{path}: {said}") from None
            continue
        if not _takes_norms_by_get_norm(called):
            continue  # the user's own component: its arguments are its own
        for argument in NORM_ARGUMENTS:
            given = node.get(argument) if argument in node and not OmegaConf.is_interpolation(node, argument) else ""
            if isinstance(given, torch.nn.Module):  # get_norm would call the layer with the channel count
                raise GwdetTypeError(
                    f"{path}.{argument} is a layer, {type(given).__name__}, not what builds one: detectron2's get_norm "
                    "calls a norm argument with each layer's channel count, and this one layer object would be shared "
                    f"by every part given it. Give L(gwdet.norm)(name=..., ...) with the settings you want (e.g. "
                    f"{path}.{argument}=L(gwdet.norm)(name='GW', num_groups=16)), or a name detectron2's get_norm knows.")
            if given is None and called is place_norm:  # place_norm needs a norm for its positions
                raise GwdetValueError(
                    f"{path}.{argument}=None: place_norm puts a norm at {path}.positions and would remove the norms "
                    f"there without one. Give a norm, e.g. {path}.{argument}=L(gwdet.norm)(name='GW', num_groups=64), "
                    f"or leave the positions out (build {path}.resnet alone).")
            if argument in node and not OmegaConf.is_interpolation(node, argument) and node.get(argument) is None:
                raise GwdetValueError(
                    f"{path}.{argument}=None: give '' for no norm ({path}.{argument}=''), or a norm's name. "
                    "detectron2's get_norm takes None for no norm too, but its components differ in what they do "
                    "with it (its FPN leaves out the bias it gives its convolutions with '': bias = norm == '', so "
                    "they would have neither), where '' is no norm with a bias in every one; a NORM None is refused "
                    "in a yacs config too.")
            name = node.get(argument) if not OmegaConf.is_interpolation(node, argument) else None
            if isinstance(name, DictConfig):
                _check_norm_call(f"{path}.{argument}", name)
            if not isinstance(name, str) or name in detectron2_names:
                continue
            if name not in known_norm_names():
                raise UnknownNormError(
                    f"{path}.{argument}={name!r} is not a norm name. detectron2's get_norm builds "
                    f"{', '.join(detectron2_names[1:])} (or '' for none) from a name; gwdet's norms need their settings: "
                    f"give L(gwdet.norm)(name=..., ...), e.g. L(gwdet.norm)(name='GW', num_groups=16).")
            raise GwdetValueError(
                f"{path}.{argument}={name!r}: detectron2's get_norm builds only its own names from a string; give "
                f"L(gwdet.norm)(name={name!r}, ...) with the settings you want (gwdet.norm({name!r}, ...) in Python).")
    for path, _, argument, build in bare_norm_callables(select(cfg, "model")):
        _check_norm_callable(f"{path}.{argument}", build)


def _takes_norms_by_get_norm(called: Any) -> bool:
    """Whether the norm arguments (:data:`NORM_ARGUMENTS`) of a node calling ``called`` go to
    detectron2's ``get_norm``: a detectron2 or gwdet component's do; a user's own component's
    arguments are its own."""
    return getattr(called, "__module__", "").startswith(("detectron2.", "gwdet."))


def _is_bare_callable(value: Any) -> bool:
    """Whether a norm argument's value is a plain callable: neither a name, a node, a :class:`Norm`
    (which checks its own layers), a layer (refused by :func:`check_norm_nodes`) nor a
    :class:`CheckedNorm` already."""
    return callable(value) and not isinstance(value, (str, DictConfig, ListConfig, torch.nn.Module, Norm, CheckedNorm))


def bare_norm_callables(model: Any, path: str = "model") -> list[tuple[str, DictConfig, str, Any]]:
    """Each norm argument of a detectron2 or gwdet component in ``model`` (the LazyConfig's ``model``
    node, at ``path``) given as a plain callable (``lambda channels: ...``, a class, a yaml
    ``!!python/name:`` value), as ``(node path, node, argument, callable)``; an interpolated argument
    (``${...stem.norm}``) by the value it resolves to, at the node that uses it."""
    if not isinstance(model, (DictConfig, ListConfig)):
        return []
    found = []
    for node_path, node, called in lazy_calls(model, path):
        if called is norm or not _takes_norms_by_get_norm(called):
            continue
        for argument in NORM_ARGUMENTS:
            if argument not in node or OmegaConf.is_missing(node, argument):
                continue
            try:
                value = node[argument]
            except OmegaConfBaseException:  # an interpolation that does not resolve: instantiate names it
                continue
            if _is_bare_callable(value):
                found.append((node_path, node, argument, value))
    return found


def _check_norm_callable(path: str, build: Any) -> None:
    """Refuse a plain callable given as the norm argument at ``path`` that cannot be called with the
    channel count alone, as detectron2's ``get_norm`` calls it: a class such as ``torch.nn.GroupNorm``
    that takes its group count first. A callable whose signature Python cannot read is left to the
    checks of its layers when the model is built (:class:`CheckedNorm`)."""
    try:
        inspect.signature(build).bind(256)
    except ValueError:  # no signature to read
        return
    except TypeError as error:
        shown = f"{getattr(build, '__module__', None) or ''}.{getattr(build, '__qualname__', repr(build))}".lstrip(".")
        raise GwdetTypeError(
            f"{path}={shown}: detectron2's get_norm calls a norm argument with the channel count alone "
            f"({getattr(build, '__qualname__', 'norm')}(256)), which it cannot take ({error}). A norm argument takes a "
            "name detectron2's get_norm knows, L(gwdet.norm)(name=..., ...) (e.g. L(gwdet.norm)(name='GN', "
            "num_groups=32) for torch's GroupNorm of 32 groups), or a callable of the channel count that returns a "
            "normalization module of that many channels (lambda channels: torch.nn.GroupNorm(32, channels)); for no "
            f"norm, give {path}=''.") from None


class CheckedNorm:
    """A plain callable given as a LazyConfig's norm argument (at ``path``), called as detectron2's
    ``get_norm`` calls it, with each layer's channel count, and its layer checked as a registered
    norm's is (:func:`gwdet.norms.check_norm_layer`): ``None``, an ``Identity``, a layer of other
    channels or of another dtype, or no module at all, refused naming ``path``, as is a ``TypeError``,
    ``ValueError`` or ``ArithmeticError`` of the callable itself (torch's ``GroupNorm(32, 16)``). Only
    :func:`norm_checked_model` makes it, in the copy of the config that is instantiated."""

    def __init__(self, path: str, build: Callable[[int], Any]) -> None:
        self.path, self.build = path, build

    def __call__(self, channels: int) -> torch.nn.Module:
        try:
            layer = self.build(channels)
        except (TypeError, ValueError, ArithmeticError) as error:  # GroupNorm(32, 16): its channels not divided
            if isinstance(error, GwdetError):
                raise
            raise GwdetValueError(
                f"{self.path}: the callable {getattr(self.build, '__qualname__', self.build)} could not build a layer "
                f"of {channels} channels: it raised {type(error).__name__}: {error}. Make it build a norm layer for "
                f"each channel count it is given (here {channels}), e.g. L(gwdet.norm)(name='GN', num_groups=32), "
                "which takes the largest group count up to 32 that divides the channels.") from error
        check_norm_layer(layer, channels, self.build, path=self.path)
        return layer

    def __repr__(self) -> str:  # as the component's own messages name its norm: the callable given
        return repr(self.build)


def norm_checked_model(cfg: DictConfig) -> DictConfig:
    """``cfg.model`` as gwdet instantiates it: the node itself when no norm argument of a detectron2
    or gwdet component is a plain callable, else a copy in which each such callable is wrapped in a
    :class:`CheckedNorm`. The channel counts a norm is built for are known only as the components
    call it, so its layers are checked then. Only the config's own nodes are copied: every object
    they hold (a module, the callables themselves) is the same object in the copy, as
    ``instantiate(cfg.model)`` would use it, and ``cfg`` is left as it was (``LazyConfig.save``
    writes the callables given)."""
    model = cfg.model
    if not bare_norm_callables(model):
        return model
    kept = {id(value): value for value in _held_objects(OmegaConf.to_container(model, resolve=False))}
    copied = copy.deepcopy(model, kept)
    for node_path, node, argument, build in bare_norm_callables(copied):
        with read_write(node):
            node[argument] = CheckedNorm(f"{node_path}.{argument}", build)
    return copied


def _held_objects(value: Any) -> Iterator[Any]:
    """The objects (rather than plain values) among ``value``, a config node as
    ``OmegaConf.to_container(node, resolve=False)`` gives it (interpolations as they are written)."""
    if isinstance(value, dict):
        for item in value.values():
            yield from _held_objects(item)
    elif isinstance(value, list):
        for item in value:
            yield from _held_objects(item)
    elif not isinstance(value, (str, int, float, bool, type(None))):
        yield value


def _no_norm_said(cfg: DictConfig, path: str, name: Any) -> str:
    """What the ``gwdet.norm`` node at ``path`` whose name is ``None`` or ``""`` is told: give ``''``
    in its place (:func:`gwdet.norms.no_norm_message`), unless it is a ``place_norm`` node's norm,
    which needs a norm for its positions."""
    parent_path, _, argument = path.rpartition(".")
    if argument == "norm" and parent_path and callable_of(select(cfg, parent_path)) is place_norm:
        return (f"{name!r} names no norm, and place_norm puts a norm at {parent_path}.positions (it would remove the "
                f"norms there without one, as it refuses '' and None). Give a norm's name, e.g. {path}.name=GW, or "
                f"leave the positions out (build {parent_path}.resnet alone).")
    return no_norm_message(name, path)


def _check_norm_call(path: str, node: DictConfig) -> None:
    """Refuse a norm argument's ``L(...)`` node (at ``path``; not ``gwdet.norm``'s, which
    :func:`check_norm_nodes` makes) that leaves out a required argument of its callable: detectron2
    calls the node's result with the channel count, so the node itself must build a callable of it
    (``L(torch.nn.GroupNorm)(num_groups=4)`` calls GroupNorm without its channels)."""
    called = callable_of(node)
    if called is None or called is norm:
        return
    try:
        parameters = inspect.signature(called).parameters.values()
    except (TypeError, ValueError):  # no signature to read
        return
    missing = [p.name for p in parameters if p.default is p.empty and p.name not in node
               and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if missing:
        what = getattr(called, "__qualname__", repr(called))
        raise GwdetValueError(
            f"{path}: instantiating it calls {what} without its required argument(s) {listed(map(repr, missing), 5)}. "
            "A norm argument takes a name detectron2's get_norm knows, a callable of the channel count, or a node "
            "that builds one: L(gwdet.norm)(name=..., ...), e.g. L(gwdet.norm)(name='GN', num_groups=4) for "
            "torch's GroupNorm of 4 groups.")


def check_loader_values(cfg: DictConfig, training: bool) -> None:
    """Refuse loader settings the model would read in another way than the config says, or that
    fail only once the loop runs: a ``dataloader.test.batch_size`` below 1; a
    ``dataloader.evaluator.output_dir`` below a file; a loader's ``mapper.image_format`` other than
    ``model.input_format`` (gwdet's check of converted weights reads the model's, the model gets the
    loader's; one ``INPUT.FORMAT`` in a yacs config); and, when ``training``, a training mapper
    without instance masks (``use_instance_mask=False``) for a model with a mask head."""
    batch = select(cfg, "dataloader.test.batch_size")
    if batch is not ABSENT and not (is_whole_number(batch) and batch >= 1):
        raise GwdetValueError(f"dataloader.test.batch_size={batch!r}: give a whole number of images of at least 1, "
                              "e.g. dataloader.test.batch_size=1 (torch's DataLoader would refuse it at evaluation).")
    folder = select(cfg, "dataloader.evaluator.output_dir")
    problem = output_path_problem("dataloader.evaluator.output_dir", folder, folder=True) if isinstance(folder, str) \
        and folder else None
    if problem is not None:
        raise GwdetValueError(problem)
    model_format = select(cfg, "model.input_format")
    for loader in ("dataloader.train", "dataloader.test") if training else ("dataloader.test",):
        image_format = select(cfg, f"{loader}.mapper.image_format")
        if ABSENT not in (model_format, image_format) and image_format != model_format:
            raise GwdetValueError(
                f"{loader}.mapper.image_format={image_format!r}, but model.input_format={model_format!r}: the model "
                f"gets images in the loader's format, while its input format says {model_format!r} (and gwdet's check "
                "of converted weights reads it). Give both the same format, as INPUT.FORMAT does in a yacs config.")
    _check_evaluator_node(cfg)
    if training and select(cfg, "dataloader.train.mapper.is_train") is False:
        raise GwdetValueError(
            "dataloader.train.mapper.is_train=False: detectron2's DatasetMapper then drops the annotations (boxes, "
            "masks) the model trains on, and training would stop at the first iteration (\"RPN requires gt_instances "
            "in training\"). Set dataloader.train.mapper.is_train=True for the training loader (False is the test "
            "loader's).")
    if training and isinstance(select(cfg, "model.roi_heads.mask_head"), DictConfig) \
            and select(cfg, "dataloader.train.mapper.use_instance_mask") is False:
        raise GwdetValueError(
            "dataloader.train.mapper.use_instance_mask=False, but the model has a mask head "
            "(model.roi_heads.mask_head), whose loss needs the instance masks: training would stop at the first "
            "iteration with \"Cannot find field 'gt_masks'\". Set dataloader.train.mapper.use_instance_mask=True, or "
            "train a model without a mask head.")


def _check_evaluator_node(cfg: DictConfig) -> None:
    """detectron2's COCOEvaluator (``dataloader.evaluator``) takes one dataset name, and ``tasks``
    among those the model predicts (``bbox``; ``segm`` with a mask head, ``keypoints`` with a
    keypoint head); otherwise it fails when the evaluation runs, after the whole training."""
    evaluator = select(cfg, "dataloader.evaluator")
    if not isinstance(evaluator, DictConfig):
        return
    name = select(cfg, "dataloader.evaluator.dataset_name")
    if isinstance(name, (ListConfig, list, tuple)):
        raise GwdetValueError(
            f"dataloader.evaluator.dataset_name is {list(name)!r} (the names of dataloader.test.dataset.names), but "
            "detectron2's COCOEvaluator evaluates one dataset, and would fail with \"not registered\" once the "
            "training is done. Give one test set (e.g. dataloader.test.dataset.names="
            f"{list(name)[0] if len(name) else 'NAME'}), and evaluate the others with --eval-only "
            "runs, one per test set.")
    tasks = select(cfg, "dataloader.evaluator.tasks")
    if tasks in (ABSENT, None):  # detectron2 takes them from the model's predictions
        return
    heads = select(cfg, "model.roi_heads")
    predicted = ["bbox", *(["segm"] if isinstance(heads, DictConfig) and isinstance(heads.get("mask_head"), DictConfig)
                           else []),
                 *(["keypoints"] if isinstance(heads, DictConfig) and isinstance(heads.get("keypoint_head"), DictConfig)
                   else [])]
    listed = list(tasks) if isinstance(tasks, (ListConfig, list, tuple)) else None
    if listed is None or not listed or any(task not in predicted for task in listed):
        raise GwdetValueError(
            f"dataloader.evaluator.tasks={tasks!r}: COCO's evaluation scores the tasks the model predicts, and this "
            f"model predicts {', '.join(predicted)}; another task fails once the training is done. Give a list of "
            f"them, e.g. dataloader.evaluator.tasks={predicted!r}, or leave tasks out (detectron2 then takes them "
            "from the model's predictions).")


def check_resize_nodes(cfg: DictConfig, loader: str) -> None:
    """Each ``L(ResizeShortestEdge)`` node of the loader at ``loader`` (``dataloader.train`` or
    ``dataloader.test``) takes sizes detectron2 can resize to: ``short_edge_length`` whole numbers
    >= 0 (0: no resizing; exactly two with ``sample_style="range"``), ``max_size`` as
    ``INPUT.MAX_SIZE_TRAIN`` (PIL stops at the first image otherwise, detectron2 with a bare assertion).
    Warns of a ``max_size`` that caps the shorter side asked for, or caps nothing
    (:func:`_warn_of_a_capped_resize`)."""
    node = select(cfg, loader)
    if not isinstance(node, DictConfig):
        return
    for path, resize in nodes_calling(node, ResizeShortestEdge, loader):
        sizes = resize.get("short_edge_length")
        listed = list(sizes) if isinstance(sizes, ListConfig) else [sizes]
        ranged = resize.get("sample_style", "range") == "range"
        if sizes is not None and not (all(is_whole_number(size) and size >= 0 for size in listed)
                                      and (not ranged or not isinstance(sizes, ListConfig) or len(listed) == 2)):
            raise GwdetValueError(
                f"{path}.short_edge_length={sizes!r}: give the shorter image side as a whole number >= 0 (0: no "
                "resizing), or a list of them to choose from, e.g. [640, 672, 704] with sample_style='choice' "
                "(sample_style='range', ResizeShortestEdge's default, takes exactly two: the range's ends).")
        if ranged and sizes is not None and len(listed) == 2 and listed[0] > listed[1]:  # numpy: "low >= high"
            raise GwdetValueError(f"{path}.short_edge_length={sizes!r} is a range from its larger end: with "
                                  f"sample_style='range' give the ends from low to high, [{listed[1]}, {listed[0]}].")
        if "max_size" in resize:
            check_twin(f"{path}.max_size", resize.max_size, "INPUT.MAX_SIZE_TRAIN")
        if sizes is not None:
            _warn_of_a_capped_resize(path, sizes, resize.get("max_size", sys.maxsize), loader == "dataloader.test")


def _warn_of_a_capped_resize(path: str, sizes: Any, max_size: Any, test: bool) -> None:
    """Warn of the ``L(ResizeShortestEdge)`` node at ``path`` (of the test loader with ``test``)
    whose ``max_size`` is below its largest ``short_edge_length`` (``sample_style="choice"``: the
    largest size, ``"range"``: the upper end), as of ``INPUT.MAX_SIZE_TRAIN`` / ``MAX_SIZE_TEST`` below
    their ``MIN_SIZE_*`` in a yacs config: detectron2's resize caps the longer image side there, so
    the images are read smaller than asked. A ``max_size`` given with ``short_edge_length`` 0 (no
    resizing) caps nothing, and is warned of as ``INPUT.MIN_SIZE_TEST 0`` is."""
    listed = list(sizes) if isinstance(sizes, ListConfig) else [sizes]
    if not is_whole_number(max_size) or max_size == sys.maxsize:  # sys.maxsize: ResizeShortestEdge's default
        return
    largest = max(listed)
    if largest == 0:
        own = "evaluates the images" if test else "trains on the images"
        logger.warning(
            f"{path}.short_edge_length={sizes!r}: detectron2 {own} at their own size and resizes none, so "
            f"{path}.max_size={max_size} caps nothing. To cap the image size, give short_edge_length a size as well.")
        return
    if max_size >= largest:
        return
    named = f"{listed} (largest {largest})" if isinstance(sizes, ListConfig) else f"{largest}"
    read = (f"the test images' shorter side reaches no more than {max_size} (square images are evaluated at "
            f"{max_size}x{max_size}, not {largest}x{largest})") if test else \
        (f"no training image's shorter side reaches more than {max_size} (square images train at "
         f"{max_size}x{max_size}, not {largest}x{largest})")
    logger.warning(
        f"{path}.max_size={max_size} is below its short_edge_length {named}: detectron2's resize caps the longer "
        f"image side at {max_size}, so {read}. Set {path}.max_size to at least {largest} (e.g. {largest * 5 // 3}, "
        f"detectron2's ratio), or lower {path}.short_edge_length.")


def check_shapes_specs(cfg: DictConfig) -> None:
    """Each ``L(ShapesSpec)`` node's arguments take the values of their yacs twins
    (``DATASETS.SHAPES.*``), and its ``image_size`` is large enough to hold a shape
    (:func:`gwdet.data.shapes.check_image_size`), refused before anything is generated; two nodes
    of other settings are refused: each registers the same names (``shapes_train``, ...), so the run
    would read one dataset and record the other."""
    specs = {}
    for path, node in nodes_calling(cfg, ShapesSpec):
        for field, twin in SPEC_CONFIG_KEYS.items():
            key = f"{path}.{field}" if path else field
            value = select(cfg, key)
            if value is ABSENT:
                continue
            check_twin(key, value, twin)
            if field == "image_size":
                check_image_size(value, key)
        specs[path] = instantiate(node)
    if len(set(specs.values())) > 1:
        shown = [f"{path} ({spec})" for path, spec in specs.items()]
        raise GwdetValueError(
            f"The config has shapes datasets of other settings, {listed(shown, 3)}, and each registers the same names "
            "(shapes_train, shapes_val, shapes_test): the run would read one and record the other as its data. Give "
            "them the same settings: gwdet's LazyConfigs keep one in dataloader.shapes, which both loaders refer to "
            "(${dataloader.shapes}); set its values (dataloader.shapes.seed=1).")


def check_run_values(cfg: DictConfig) -> None:
    """Refuse, before anything is built, values that training and evaluation both read and
    detectron2 or gwdet would fail on later, or take without a word: a ``train.seed`` that is not a
    whole number (detectron2's ``default_setup`` compares it with 0), a ``train.output_dir`` that is not
    a path, :data:`RUN_TWINS`
    (``train.vis_images`` below 0, a test score or NMS threshold outside [0, 1], ..., as their yacs keys), a ``train.init_checkpoint`` of ``None``,
    the shapes dataset's settings (:func:`check_shapes_specs`), ``model.pixel_mean`` and
    ``model.pixel_std`` (:func:`gwdet.config_checks.check_pixel_normalization`); numpy values, which the
    run's saved ``config.yaml`` could not hold (:func:`gwdet.model_zoo.lazy_loading.refuse_numpy_values`)."""
    refuse_numpy_values(cfg, "The LazyConfig")
    check_seed(cfg)
    output_dir = select(cfg, "train.output_dir")
    if output_dir is not ABSENT and not (isinstance(output_dir, str) and output_dir.strip()):
        raise GwdetValueError(f"train.output_dir={output_dir!r}: give the run's folder as a path, e.g. "
                              "train.output_dir=output/run1 (a name of digits quoted: train.output_dir=\"'123'\").")
    if select(cfg, "train.init_checkpoint") is None:
        raise GwdetValueError("train.init_checkpoint=None: give '' to start from detectron2's initialization, or the "
                              "path of weights (e.g. train.init_checkpoint=output/demo/model_final.pth).")
    check_twins(cfg, [(key, twin) for key, twin in RUN_TWINS if not key.startswith("model.")])
    check_model_values(cfg)
    check_shapes_specs(cfg)
    check_resize_nodes(cfg, "dataloader.test")


def check_seed(cfg: DictConfig) -> None:
    """``train.seed``: a whole number below 2**32 (negative: a random seed), as ``SEED``."""
    seed = select(cfg, "train.seed")
    if seed is not ABSENT and not (is_whole_number(seed) and seed < SEED_LIMIT):
        raise GwdetValueError(f"train.seed={seed!r}: give a whole number below 2**32 (numpy's limit), e.g. train.seed=0 "
                              "(a negative seed draws a random one, as SEED -1 does in a yacs config).")


def check_model_values(cfg: DictConfig) -> None:
    """The values :func:`check_run_values` checks that building the model reads: the ``model``
    settings of :data:`RUN_TWINS` and :data:`MODEL_TWINS` (thresholds, box2box weights, class and
    channel counts, as their yacs keys), the RPN's ``pre_nms_topk`` and ``post_nms_topk``,
    ``train.device``, ``model.pixel_mean`` and ``model.pixel_std``
    (:func:`gwdet.config_checks.check_pixel_normalization`)."""
    check_twins(cfg, [*((key, twin) for key, twin in RUN_TWINS if key.startswith("model.")), *MODEL_TWINS])
    for key, twin in (("model.proposal_generator.pre_nms_topk", "MODEL.RPN.PRE_NMS_TOPK_TEST"),
                      ("model.proposal_generator.post_nms_topk", "MODEL.RPN.POST_NMS_TOPK_TEST")):
        counts = select(cfg, key)  # (training, test)
        if isinstance(counts, ListConfig):
            for index, count in enumerate(counts):
                check_twin(f"{key}.{index}", count, twin)
    check_run_device(select(cfg, "train.device"), "train.device")
    mean, std, image_format = (select(cfg, key) for key in LAZY_PIXEL_KEYS)
    if mean is not ABSENT and std is not ABSENT:
        mean, std = (OmegaConf.to_container(value) if isinstance(value, ListConfig) else value for value in (mean, std))
        check_pixel_normalization(mean, std, None if image_format is ABSENT else image_format, LAZY_PIXEL_KEYS)


def dataset_names(cfg: DictConfig, trains: bool = True) -> list[str]:
    """The datasets the LazyConfig trains (where a request ``trains``) and evaluates on: the ``names``
    of ``dataloader.train.dataset`` and ``dataloader.test.dataset`` (``L(...)`` nodes such as
    ``gwdet.data.shapes_dataset`` instantiated) and the evaluator's dataset; a loader built otherwise
    names none."""
    return _distinct_names(names_at(cfg, "dataloader.train.dataset.names") if trains else [],
                           names_at(cfg, "dataloader.test.dataset.names"), evaluated_dataset(cfg))


def _distinct_names(trained: Sequence[str], tested: Sequence[str], evaluated: str | None) -> list[str]:
    """The names of the training sets, the test sets and the evaluator's dataset, each once, in order."""
    return [name for name in dict.fromkeys([*trained, *tested, evaluated]) if name]


def names_at(cfg: DictConfig, key: str) -> list[str]:
    """The dataset names at ``key`` (one or a list; an ``L(...)`` node instantiated)."""
    value = select(cfg, key)
    if isinstance(value, DictConfig):
        value = instantiate(value)
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple, ListConfig)):
        return [name for name in value if isinstance(name, str)]
    return []


def training_mask_format(cfg: DictConfig) -> str | None:
    """How the training loader's mapper reads masks: its ``instance_mask_format``, else the default
    of the callable it calls (detectron2's ``DatasetMapper``: ``"polygon"``); ``None`` where neither
    is known."""
    value = select(cfg, MASK_FORMAT_SETTING)
    if isinstance(value, str):
        return value
    target = callable_of(select(cfg, "dataloader.train.mapper"))
    try:
        parameter = inspect.signature(target).parameters.get("instance_mask_format") if target else None
    except (TypeError, ValueError):  # no signature to read
        return None
    default = parameter.default if parameter is not None else None
    return default if isinstance(default, str) else None


# The heads' own class counts, which follow model.roi_heads.num_classes in detectron2's configs
CLASS_COUNT_KEYS = ("model.roi_heads.box_predictor.num_classes", "model.roi_heads.mask_head.num_classes")
# the head whose count of 1 is detectron2's class-agnostic mask (MODEL.ROI_MASK_HEAD.CLS_AGNOSTIC_MASK in yacs)
CLASS_AGNOSTIC_MASK_KEY = "model.roi_heads.mask_head.num_classes"


def dataset_use(cfg: DictConfig, *, trains: bool = True, evaluates: bool = True) -> DatasetUse:
    """The datasets a LazyConfig's request reads, with the settings that name them: the training
    loader's where it ``trains``, the evaluator's where it ``evaluates``."""
    evaluated = evaluated_dataset(cfg) if evaluates else None
    return DatasetUse(
        tuple(names_at(cfg, "dataloader.train.dataset.names") if trains else []),
        tuple(name for name in [evaluated] if name), isinstance(select(cfg, "model.roi_heads.mask_head"), DictConfig),
        "dataloader.train.dataset.names", "dataloader.evaluator.dataset_name",
        "the model has a mask head (model.roi_heads.mask_head)",
        "with a model without one (model.roi_heads.mask_in_features=None, as detectron2's Faster R-CNN LazyConfigs)",
        mask_format=training_mask_format(cfg), mask_format_setting=MASK_FORMAT_SETTING)


def check_datasets(cfg: DictConfig, *, trains: bool = True, evaluates: bool = True) -> None:
    """Refuse, before training or evaluating, an evaluator of another dataset than the test loader
    reads (it would score the predictions on those images against the other dataset's annotations),
    a dataset named twice in a loader (as ``DATASETS.TRAIN`` / ``DATASETS.TEST``), ``--register-coco``
    datasets that do not fit the run (:func:`gwdet.data.coco_registration.check_datasets_fit`), and a
    ``model.roi_heads.num_classes`` other than the categories of a dataset whose classes are known
    (:func:`gwdet.data.coco_registration.known_class_names`), as a yacs config's
    ``MODEL.ROI_HEADS.NUM_CLASSES`` is refused, or a head's own count (:data:`CLASS_COUNT_KEYS`)
    other than ``model.roi_heads.num_classes``. The training sets are checked where the request
    ``trains``, the test sets where it ``evaluates``."""
    trained = names_at(cfg, "dataloader.train.dataset.names") if trains else []
    tested = names_at(cfg, "dataloader.test.dataset.names") if evaluates else []
    evaluated = evaluated_dataset(cfg) if evaluates else None
    if evaluated and tested and evaluated not in tested:
        raise GwdetValueError(
            f"dataloader.evaluator.dataset_name={evaluated!r}, but dataloader.test.dataset.names is "
            f"{', '.join(map(repr, tested))}: the evaluator would score the predictions on those images against "
            f"{evaluated!r}'s annotations. Give both the same dataset.")
    check_twin("dataloader.train.dataset.names", trained, "DATASETS.TRAIN")
    check_twin("dataloader.test.dataset.names", tested, "DATASETS.TEST")
    check_datasets_fit(dataset_use(cfg, trains=trains, evaluates=evaluates))
    count = select(cfg, "model.roi_heads.num_classes")
    if not is_whole_number(count):
        return
    for key in CLASS_COUNT_KEYS:
        value = select(cfg, key)
        if key == CLASS_AGNOSTIC_MASK_KEY and value == 1:  # one mask for every class (CLS_AGNOSTIC_MASK in yacs)
            continue
        if is_whole_number(value) and value != count:
            raise GwdetValueError(
                f"{key}={value}, but model.roi_heads.num_classes={count}: the heads would predict other classes than "
                "the model's (a class trained as background, or an evaluation that fails). Leave it to follow "
                f"model.roi_heads.num_classes, as detectron2's configs do ({key}='${{..num_classes}}'), or give both "
                "the same value.")
    for name in _distinct_names(trained, tested, evaluated):
        classes = known_class_names(name)
        if classes is not None and len(classes) != count:
            raise GwdetValueError(
                f"model.roi_heads.num_classes={count}, but dataset {name!r} has {len(classes)} categories: with fewer "
                "classes a category would train as background, with more the evaluation fails. Add "
                f"model.roi_heads.num_classes={len(classes)} to the overrides (or set it in the LazyConfig).")
