"""A yacs config's run: :class:`Trainer` (detectron2's ``DefaultTrainer`` with gwdet's checks,
optimizer, checkpointer and evaluation) and :class:`YacsRun` (how the run of
:mod:`gwdet.engine.run` reads, builds and evaluates a yacs config).

:class:`Trainer` builds what detectron2's ``DefaultTrainer`` builds, through its ``build_*`` hooks
(``build_model``: :func:`gwdet.build_model`'s checks; ``build_optimizer``: gwdet's norm weight
decay, checked; ``build_train_loader``: seeded and resumable; ``build_evaluator``: COCOEvaluator),
then swaps in what gwdet adds (:mod:`gwdet.engine.training`): the checked training batches and the
:class:`~gwdet.checkpoint.resilient.ResilientCheckpointer`, whose checkpoints survive a killed run
and whose ``--resume`` continues the data and random streams where they stopped.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Any, Mapping, Sequence

import torch

from detectron2.config import CfgNode, get_cfg
from detectron2.engine import DefaultTrainer, TrainerBase
from detectron2.evaluation import COCOEvaluator, DatasetEvaluator, verify_results
from detectron2.solver import build_lr_scheduler
from detectron2.utils import comm
from detectron2.utils.logger import setup_logger
from fvcore.nn.precise_bn import BN_MODULE_TYPES

from gwdet.errors import GwdetValueError
from gwdet.checkpoint.compatibility import unwrapped
from gwdet.checkpoint.resilient import CLASSES_ATTRIBUTE, ResilientCheckpointer, absolute_weights_path
from gwdet.checkpoint.signal_hook import release_stop_signals
from gwdet.config import SHAPES_PREFIX, config_value, flatten_config
from gwdet.layers.common import is_whole_number
from gwdet.config_checks import (NORM_KEYS, ZERO_RATE, builds_norm, check_batch_split, check_detectron2_value,
                                 check_training_sampling, ensure_checked)
from gwdet.positions import parse_gw_positions
from gwdet.data import prepare_datasets, register_datasets
from gwdet.data.coco_registration import CocoDataset, check_config_against_datasets
from gwdet.data.datasets import (check_dataset_files, check_evaluated_classes, config_dataset_names, named_empty_training_set,
                                 register_configured_shapes)
from gwdet.data.resumable import build_resumable_train_loader
from gwdet.model_zoo.loading import build_config
from gwdet.modeling.build import (check_built_model, check_device, check_mixed_precision, check_run_device,
                                  check_scratch_training)
from gwdet.modeling.model_checks import (check_frozen_batch_statistics, check_model_example_groups,
                                         check_norm_weight_decay)
from gwdet.layers.settings_state import TEST_TIME_SETTINGS
from gwdet.norms import norm_record, synchronizes_cuda_only
from gwdet.solver import build_optimizer
from gwdet.engine.output_dir import (ScheduleAt, check_resume_config, check_resume_trains, check_run_detections_kept,
                                     model_differences, saved_run_config)
from gwdet.engine.output_dir import warn_of_a_moved_schedule as moved_schedule_warning
from gwdet.utils.run_file_names import INFERENCE_FOLDER
from gwdet.engine.run import RunConfig, warn_of_uncounted_detections
from gwdet.data.finite_images import FiniteImageBatches
from gwdet.engine.training import (
    InnerTrainerState,
    MetricHistoryKept,
    check_config_kind,
    check_fresh_training,
    check_not_over_another_run,
    check_output_folder,
    check_schedule_unchanged,
    check_torch_state,
    configured_optimizer_values,
    continue_precise_bn,
    precise_bn_streams_kept,
    continue_after_resume,
    note_built_config,
    random_streams_kept,
    run_writers,
    seed_as_the_tools_do,
    training_checkpointer,
    training_lock,
    training_loop,
    with_signal_checkpoints,
    writing_every_evaluation,
)

logger = logging.getLogger(__name__)
# the settings by which detectron2's optimizer groups the parameters, which a resume cannot change
OPTIMIZER_GROUPING = "SOLVER.WEIGHT_DECAY, WEIGHT_DECAY_NORM, WEIGHT_DECAY_BIAS and BIAS_LR_FACTOR"
_OPTIMIZER_STATE: tuple[type, ...] = () if "state_dict" in DefaultTrainer.__dict__ else (InnerTrainerState,)


class Trainer(*_OPTIMIZER_STATE, DefaultTrainer):  # type: ignore[misc]
    """``DefaultTrainer`` evaluating with ``COCOEvaluator`` (box, and mask when masks are on), whose
    checkpoints survive a killed run and whose ``--resume`` continues the data and random streams
    where they stopped (see :mod:`gwdet.checkpoint.resilient`, :mod:`gwdet.data.resumable`)."""

    def __init__(self, cfg: CfgNode) -> None:
        check_config_kind(cfg, yacs=True)
        check_output_folder(cfg.OUTPUT_DIR, "OUTPUT_DIR")
        check_torch_state(training=True)  # float64 or no gradients left by one's own code: refused by name
        YacsRun(cfg).check_training_request(comm.get_world_size())  # done already where the tools built it
        # datasets one's own code registered (register_coco_instances) get the --register-coco checks before training
        check_config_against_datasets(cfg, trains=True, evaluates=False)
        seed_as_the_tools_do(cfg, cfg.SEED, "SEED")  # the tools' default_setup did
        # Whatever build_train_loader (a subclass's too) returns reaches detectron2's SimpleTrainer
        # with its batches checked (gwdet.data.finite_images): during the construction the
        # instance's build_train_loader wraps the class's.
        self.build_train_loader = lambda cfg: FiniteImageBatches(type(self).build_train_loader(cfg))  # type: ignore[method-assign]
        try:
            if comm.get_world_size() > 1 and not str(cfg.MODEL.DEVICE).startswith("cuda"):
                self._construct_for_cpu_processes(cfg)
            else:
                super().__init__(cfg)
        finally:
            del self.build_train_loader
        # layers that see the images, however made (a registered name, a subclass's build_model), in whole groups
        check_model_example_groups(unwrapped(self.model), cfg.SOLVER.IMS_PER_BATCH, comm.get_world_size(),
                                   "SOLVER.IMS_PER_BATCH")
        check_frozen_batch_statistics(unwrapped(self.model))  # frozen by one's own code (detectron2's freeze())
        # whatever build_optimizer returned (a subclass's too): norm layers decayed otherwise than configured are named
        check_norm_weight_decay(unwrapped(self.model), self.optimizer, cfg.SOLVER.WEIGHT_DECAY_NORM,
                                cfg.SOLVER.WEIGHT_DECAY_BIAS)
        note_built_config(self, YacsRun(self.cfg))

    def _construct_for_cpu_processes(self, cfg: CfgNode) -> None:
        """``DefaultTrainer.__init__`` for several CPU processes, which detectron2 cannot construct:
        its ``create_ddp_model`` pins ``device_ids`` to the local rank, which PyTorch's
        DistributedDataParallel refuses for a CPU model. The same parts in the same order, the model
        wrapped without ``device_ids`` (:func:`~gwdet.engine.training.training_ddp_model`)."""
        TrainerBase.__init__(self)
        if not logging.getLogger("detectron2").isEnabledFor(logging.INFO):
            setup_logger()
        cfg = DefaultTrainer.auto_scale_workers(cfg, comm.get_world_size())
        model = self.build_model(cfg)
        optimizer = self.build_optimizer(cfg, model)
        data_loader = self.build_train_loader(cfg)
        self._trainer = training_loop(model, data_loader, optimizer, cfg.SOLVER.AMP.ENABLED, broadcast_buffers=False)
        self.scheduler = self.build_lr_scheduler(cfg, optimizer)
        self.checkpointer = training_checkpointer(self, cfg.OUTPUT_DIR, cfg.DATASETS.TRAIN)
        self.start_iter, self.max_iter, self.cfg = 0, cfg.SOLVER.MAX_ITER, cfg
        self.register_hooks(self.build_hooks())

    @classmethod
    def build_model(cls, cfg: CfgNode) -> torch.nn.Module:
        """detectron2's ``build_model`` after :func:`gwdet.check_gwdet_config` (unless it accepted
        this config already: :func:`gwdet.config_checks.ensure_checked`), then
        :func:`gwdet.modeling.build.check_built_model` (norms with batch statistics shared across FPN
        levels, group numbers the layers could not use or did not read)."""
        ensure_checked(cfg)
        check_device(cfg.MODEL.DEVICE)
        return check_built_model(super().build_model(cfg), cfg)

    @classmethod
    def build_optimizer(cls, cfg: CfgNode, model: torch.nn.Module) -> torch.optim.Optimizer:
        """detectron2's optimizer in which gwdet's norm layers get ``SOLVER.WEIGHT_DECAY_NORM`` like
        detectron2's own (:func:`gwdet.build_optimizer`); the constructor checks what this (or a
        subclass's) returns (:func:`check_norm_weight_decay`)."""
        return build_optimizer(cfg, model)

    @classmethod
    def build_train_loader(cls, cfg: CfgNode):
        """detectron2's train loader, seeded with ``SEED`` and positioned on ``--resume``
        (:func:`gwdet.data.resumable.build_resumable_train_loader`), of ``DATASETS.TRAIN`` checked
        as the tools check it (:func:`gwdet.data.datasets.check_dataset_files`: registered, files there)."""
        register_configured_shapes(cfg, cfg.DATASETS.TRAIN)
        check_dataset_files(cfg.DATASETS.TRAIN)  # registered, as the tools check them
        with named_empty_training_set(", ".join(cfg.DATASETS.TRAIN), "DATALOADER.FILTER_EMPTY_ANNOTATIONS False",
                                      "MODEL.KEYPOINT_ON True" if cfg.MODEL.KEYPOINT_ON else None):
            return build_resumable_train_loader(cfg)

    def build_hooks(self) -> list:
        """detectron2's hooks, its periodic checkpointer saving with gwdet's
        :class:`ResilientCheckpointer` (which takes the place of the ``DetectionCheckpointer``
        detectron2 built just before), plus :class:`~gwdet.checkpoint.signal_hook.CheckpointOnSignal`
        (SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2 and SIGXCPU save a checkpoint of the current
        iteration before training stops) after the LR scheduler and the periodic checkpointer, before evaluation and the writers.
        detectron2's PreciseBN passes (``TEST.PRECISE_BN``) run with the random generators kept, as the
        evaluations do (:func:`~gwdet.engine.training.random_streams_kept`), and after a resume draw
        the batches an uninterrupted run's would (:func:`~gwdet.engine.training.continue_precise_bn`). The
        writers' recent history is checkpointed and resumed (:class:`~gwdet.engine.training.MetricHistoryKept`)."""
        if not isinstance(self.checkpointer, ResilientCheckpointer):
            self.checkpointer = training_checkpointer(self, self.cfg.OUTPUT_DIR, self.cfg.DATASETS.TRAIN)
        hooks = with_signal_checkpoints(precise_bn_streams_kept(super().build_hooks()))
        return [*writing_every_evaluation(hooks, self.cfg.TEST.EVAL_PERIOD), MetricHistoryKept()]

    def build_writers(self) -> list:
        """detectron2's writers (written after every evaluation too:
        :func:`~gwdet.engine.training.writing_every_evaluation`), ``metrics.json`` opened once a resume has trimmed it
        (:func:`~gwdet.engine.training.run_writers`)."""
        return run_writers(self.cfg.OUTPUT_DIR, self.max_iter)

    def train(self):
        """Train, holding the output folder's lock (:func:`~gwdet.engine.training.training_lock`);
        return the final COCO results (detectron2's EvalHook stores them on the trainer)."""
        with training_lock(self, YacsRun(self.cfg)):
            check_schedule_unchanged(self.max_iter, self.cfg.SOLVER.MAX_ITER, "SOLVER.MAX_ITER")
            check_not_over_another_run(self, self.cfg.MODEL.WEIGHTS)
            try:
                super().train()
            finally:
                release_stop_signals(self._hooks)
        return getattr(self, "_last_eval_results", None)

    def resume_or_load(self, resume: bool = True) -> None:
        """detectron2's, the output folder's lock held meanwhile (:func:`~gwdet.engine.training.training_lock`)."""
        with training_lock(self, YacsRun(self.cfg)):
            check_fresh_training(self.cfg, resume, self.cfg.OUTPUT_DIR, "OUTPUT_DIR")
            if resume:  # another model, batch or seed; a finished run would train nothing, its results set aside
                YacsRun(self.cfg).check_trainer_resume()
                check_resume_trains(self.cfg.OUTPUT_DIR, self.max_iter, "SOLVER.MAX_ITER")
            with configured_optimizer_values(self.optimizer, self.scheduler, OPTIMIZER_GROUPING, "MODEL.WEIGHTS"):
                super().resume_or_load(resume=resume)
            images_per_process = self.cfg.SOLVER.IMS_PER_BATCH // comm.get_world_size()
            continue_after_resume(self.cfg.OUTPUT_DIR, self.start_iter, self._trainer.data_loader, images_per_process,
                                  "The train loader was not built by gwdet's build_train_loader")
            continue_precise_bn(self._hooks, self.start_iter, images_per_process)

    @classmethod
    def test(cls, cfg: CfgNode, model: torch.nn.Module, evaluators=None):
        """detectron2's evaluation, after which the random generators are as they were before it
        (:func:`~gwdet.engine.training.random_streams_kept`): periodic evaluations
        (``TEST.EVAL_PERIOD``) leave the training's random draws as they would be without them. The
        shapes dataset is the one ``cfg`` describes (:func:`~gwdet.data.datasets.register_configured_shapes`); the
        config's class count and the model's classes (:data:`~gwdet.checkpoint.resilient.CLASSES_ATTRIBUTE`)
        are checked against the test sets, which must be registered, as the tools check them. A list
        of ``evaluators`` holds one evaluator per test set, in their order."""
        given = 1 if isinstance(evaluators, DatasetEvaluator) else len(evaluators) if isinstance(
            evaluators, (list, tuple)) else None
        if given is not None and given != len(cfg.DATASETS.TEST):
            raise GwdetValueError(
                f"Trainer.test: evaluators holds {given} evaluator(s), but DATASETS.TEST names "
                f"{len(cfg.DATASETS.TEST)} test set(s) {tuple(cfg.DATASETS.TEST)!r}: detectron2 evaluates the i-th "
                "test set with evaluators[i]. Give one evaluator per test set (e.g. [COCOEvaluator(name, "
                "output_dir=...) for name in cfg.DATASETS.TEST]), one DatasetEvaluator for a single test set, or "
                "evaluators=None for gwdet's COCOEvaluator of each.")
        register_configured_shapes(cfg, cfg.DATASETS.TEST)
        check_dataset_files(cfg.DATASETS.TEST)  # registered, as the tools check them
        check_config_against_datasets(cfg, trains=False, evaluates=True)
        check_evaluated_classes(getattr(unwrapped(model), CLASSES_ATTRIBUTE, None), cfg.DATASETS.TEST, "The model")
        with random_streams_kept():
            return super().test(cfg, model, evaluators)

    @classmethod
    def build_test_loader(cls, cfg: CfgNode, dataset_name: str):
        """detectron2's test loader, its batches checked for non-finite pixels as training's are
        (:class:`~gwdet.data.finite_images.FiniteImageBatches`): such an image would give no
        detections without a word."""
        return FiniteImageBatches(super().build_test_loader(cfg, dataset_name))

    @classmethod
    def build_evaluator(cls, cfg: CfgNode, dataset_name: str, output_folder: str | None = None):
        """detectron2's ``COCOEvaluator``, writing into ``OUTPUT_DIR/inference/<dataset>`` (or
        ``output_folder``), refused where that holds a finished run's detections
        (:func:`~gwdet.engine.output_dir.check_run_detections_kept`)."""
        output_folder = output_folder or os.path.join(cfg.OUTPUT_DIR, INFERENCE_FOLDER, dataset_name)
        check_run_detections_kept(output_folder, cfg.OUTPUT_DIR, "Give the evaluation a folder of its own "
                                  "(Trainer.test(cfg, model, evaluators=[COCOEvaluator(name, output_dir=...)])), or "
                                  "evaluate with tools/train_net.py --eval-only, which writes eval/<checkpoint>/.")
        warn_of_uncounted_detections(cfg.TEST.DETECTIONS_PER_IMAGE, "TEST.DETECTIONS_PER_IMAGE")
        # a dataset without a json file is converted anew: a cache of an earlier evaluation may hold other annotations
        return COCOEvaluator(dataset_name, output_dir=output_folder, allow_cached_coco=False)


def norm_settings(cfg: CfgNode) -> dict[str, str]:
    """The norm names by key of every NORM key whose layers the config's model builds
    (:func:`gwdet.config_checks.builds_norm`: no mask head without ``MODEL.MASK_ON``, RetinaNet's head
    in a RetinaNet, ``MODEL.RESNETS.GW_NORM`` where ``MODEL.RESNETS.GW_POSITIONS`` places it)."""
    return {key: config_value(cfg, key) for key in NORM_KEYS if builds_norm(cfg, key)}


def frozen_stage_norms(cfg: CfgNode) -> dict[str, str]:
    """The norm names by key of the layers in the backbone stages ``MODEL.BACKBONE.FREEZE_AT``
    freezes: the stem's (``MODEL.RESNETS.GW_NORM`` with GW at S1, else ``MODEL.RESNETS.NORM``) from
    1, res2's on (``MODEL.RESNETS.NORM``, and ``GW_NORM`` at a bottleneck position) from 2."""
    freeze_at = cfg.MODEL.BACKBONE.FREEZE_AT
    positions = parse_gw_positions(cfg.MODEL.RESNETS.GW_POSITIONS)
    keys = []
    if freeze_at >= 1:
        keys.append("MODEL.RESNETS.GW_NORM" if "S1" in positions else "MODEL.RESNETS.NORM")
    if freeze_at >= 2:
        keys += ["MODEL.RESNETS.NORM"] + (["MODEL.RESNETS.GW_NORM"] if positions - {"S1"} else [])
    return {key: config_value(cfg, key) for key in dict.fromkeys(keys)}


def check_evaluation_values(cfg: CfgNode) -> None:
    """Refuse ``TEST.AUG.ENABLED``: detectron2's own ``tools/train_net.py`` adds test-time
    augmentation results, gwdet's run evaluates the model as it is; the key would be ignored. Warn
    of test sizes that are not what they seem (``INPUT.MIN_SIZE_TEST`` 0 beside a maximum, a maximum
    below it: :func:`_warn_of_capped_test_size`)."""
    if cfg.TEST.AUG.ENABLED:
        raise GwdetValueError(
            "TEST.AUG.ENABLED is True, but gwdet's runs evaluate without test-time augmentation (detectron2's own "
            "tools/train_net.py adds it); the results would be those of the plain model. Set TEST.AUG.ENABLED False, "
            "or evaluate with detectron2.modeling.GeneralizedRCNNWithTTA in a script of your own.")
    if cfg.INPUT.MIN_SIZE_TEST == 0 and cfg.INPUT.MAX_SIZE_TEST != get_cfg().INPUT.MAX_SIZE_TEST:
        logger.warning(
            f"INPUT.MIN_SIZE_TEST is 0: detectron2 evaluates the images at their own size and resizes none, so "
            f"INPUT.MAX_SIZE_TEST {cfg.INPUT.MAX_SIZE_TEST} caps nothing (the results list MIN_SIZE_TEST alone). To "
            f"cap the test size, give INPUT.MIN_SIZE_TEST a size as well.")
    _warn_of_capped_test_size(cfg)


def _torch_batch_norm_layers(name: str) -> bool:
    """Whether every layer class of norm ``name`` is one of torch's batch norms (fvcore's
    ``BN_MODULE_TYPES``), whose running statistics detectron2's PreciseBN hook recomputes."""
    return all(issubclass(t, BN_MODULE_TYPES) for t in norm_record(name).layer_types)


def precise_bn_skips(name: str) -> bool:
    """Whether the layers of norm ``name`` keep running statistics that detectron2's PreciseBN hook
    leaves as they are: it recomputes those of torch's batch-norm classes only (BW and BGN are none
    of them)."""
    return norm_record(name).batch_statistics and not _torch_batch_norm_layers(name)


def precise_bn_recomputes(name: str) -> bool:
    """Whether detectron2's PreciseBN hook recomputes the running statistics of norm ``name``'s
    layers (BN, SyncBN and detectron2's naive SyncBN)."""
    record = norm_record(name)
    return record.batch_statistics and bool(record.layer_types) and _torch_batch_norm_layers(name)


def _warn_of_unread_schedule_values(cfg: CfgNode) -> None:
    """Warnings for solver values that leave part of the training as it would be without them, or
    that few would mean: biases that do not train (``SOLVER.BIAS_LR_FACTOR 0``), a rate that rises
    at each step (``SOLVER.GAMMA`` above 1), and the schedule keys the chosen scheduler does not read
    (``SOLVER.STEPS`` and ``GAMMA`` under ``WarmupCosineLR``, ``BASE_LR_END`` under the others)."""
    solver = cfg.SOLVER
    if solver.BIAS_LR_FACTOR == 0 and solver.BASE_LR != 0:
        logger.warning("SOLVER.BIAS_LR_FACTOR 0.0: every bias trains with a learning rate of 0 and keeps its initial "
                       "value through the whole run; give 1.0 (detectron2's default) to train them.")
    cosine = solver.LR_SCHEDULER_NAME == "WarmupCosineLR"
    if solver.GAMMA > 1 and not cosine and (solver.STEPS or solver.LR_SCHEDULER_NAME == "WarmupStepWithFixedGammaLR"):
        logger.warning(f"SOLVER.GAMMA {solver.GAMMA} is above 1: each step of the schedule multiplies the learning rate "
                       "by it, so the rate rises; give a factor below 1 (e.g. 0.1) to lower it.")
    if cosine and solver.STEPS:
        logger.warning(f"SOLVER.STEPS {tuple(solver.STEPS)} is not read by SOLVER.LR_SCHEDULER_NAME WarmupCosineLR, whose "
                       "rate falls from SOLVER.BASE_LR to SOLVER.BASE_LR_END along a cosine: set SOLVER.STEPS \"()\", or "
                       "use WarmupMultiStepLR for steps.")
    if not cosine and solver.BASE_LR_END != 0:
        logger.warning(f"SOLVER.BASE_LR_END {solver.BASE_LR_END} is read by WarmupCosineLR only, not by "
                       f"SOLVER.LR_SCHEDULER_NAME {solver.LR_SCHEDULER_NAME}: the rate ends where its steps leave it.")


def _warn_of_resized_shapes(cfg: CfgNode) -> None:
    """Warn when the shapes dataset is generated at another size than the model reads its images
    at (``DATASETS.SHAPES.IMAGE_SIZE`` against ``INPUT.MIN_SIZE_TRAIN`` / ``MIN_SIZE_TEST``): detectron2
    resizes them, so a smaller dataset (``IMAGE_SIZE 64``) is trained and tested upsampled."""
    names = [*cfg.DATASETS.TRAIN, *cfg.DATASETS.TEST]
    size = cfg.DATASETS.SHAPES.IMAGE_SIZE
    read = sorted({*cfg.INPUT.MIN_SIZE_TRAIN, *([cfg.INPUT.MIN_SIZE_TEST] if cfg.INPUT.MIN_SIZE_TEST else [])})
    if not any(name.startswith(SHAPES_PREFIX) for name in names) or read in ([], [size]):
        return
    logger.warning(f"DATASETS.SHAPES.IMAGE_SIZE {size} generates images of {size} pixels a side, but the model reads "
                   f"them resized to a shorter side of {', '.join(map(str, read))} (INPUT.MIN_SIZE_TRAIN "
                   f"{tuple(cfg.INPUT.MIN_SIZE_TRAIN)}, INPUT.MIN_SIZE_TEST {cfg.INPUT.MIN_SIZE_TEST}). To train and "
                   f"test at the images' own size, set INPUT.MIN_SIZE_TRAIN \"({size},)\" INPUT.MAX_SIZE_TRAIN {size} "
                   f"INPUT.MIN_SIZE_TEST {size} INPUT.MAX_SIZE_TEST {size} (a LazyConfig's dataloader.shapes.image_size "
                   "sets both).")


def _warn_of_capped_test_size(cfg: CfgNode) -> None:
    """Warn of an ``INPUT.MAX_SIZE_TEST`` below ``INPUT.MIN_SIZE_TEST``: detectron2's resize caps the
    longer image side there, so the test images are evaluated smaller than the shorter side asked
    for."""
    test_size, test_max = cfg.INPUT.MIN_SIZE_TEST, cfg.INPUT.MAX_SIZE_TEST
    if is_whole_number(test_size) and is_whole_number(test_max) and 0 < test_max < test_size:
        logger.warning(
            f"INPUT.MAX_SIZE_TEST {test_max} is below INPUT.MIN_SIZE_TEST {test_size}: detectron2's resize caps the "
            f"longer image side at {test_max}, so the test images' shorter side reaches no more than {test_max} "
            f"(square images are evaluated at {test_max}x{test_max}, not {test_size}x{test_size}). Set "
            f"INPUT.MAX_SIZE_TEST to at least {test_size} (e.g. {test_size * 5 // 3}, detectron2's ratio), or lower "
            "INPUT.MIN_SIZE_TEST.")


# The smallest side a training image is resized to that a detector trains on: the stride of ResNet's
# coarsest stage (res5), to a multiple of which detectron2 pads the images. A smaller side leaves images
# of less than one position of that stage (a 1-pixel side stops detectron2's dataset mapper after a flip).
MIN_TRAINING_SIDE = 32


def check_training_image_sizes(cfg: CfgNode) -> None:
    """Refuse training image sizes too small to train on (``INPUT.MIN_SIZE_TRAIN``,
    ``INPUT.MAX_SIZE_TRAIN`` below :data:`MIN_TRAINING_SIDE`); warn of an ``INPUT.MAX_SIZE_TRAIN``
    below the largest ``INPUT.MIN_SIZE_TRAIN`` (detectron2's resize caps the longer side there, so
    those shorter sides are never reached), and of an absolute ``INPUT.CROP.SIZE`` not smaller than
    the shapes images it is given (the crop, applied before the resize, keeps them whole)."""
    sizes, max_size = tuple(cfg.INPUT.MIN_SIZE_TRAIN), cfg.INPUT.MAX_SIZE_TRAIN
    if not sizes or not all(is_whole_number(size) for size in (*sizes, max_size)):
        return  # gwdet.config_checks names what is no size
    small = [f"{key} {value}" for key, value in (("INPUT.MIN_SIZE_TRAIN", sizes), ("INPUT.MAX_SIZE_TRAIN", max_size))
             if (min(value) if isinstance(value, tuple) else value) < MIN_TRAINING_SIDE]
    if small:
        raise GwdetValueError(
            f"{' and '.join(small)} resizes the training images to less than {MIN_TRAINING_SIDE} pixels a side, too "
            f"small to train a detector on (less than one position of the backbone's coarsest stage, stride "
            f"{MIN_TRAINING_SIDE}; a 1-pixel side stops detectron2's data loader at the first flipped image). Give "
            f"training sizes of at least {MIN_TRAINING_SIDE} pixels, e.g. INPUT.MIN_SIZE_TRAIN \"({max(sizes[-1], 64)},)\" "
            f"INPUT.MAX_SIZE_TRAIN {max(max_size, sizes[-1], 64)}.")
    if max_size < max(sizes):
        test = f", while testing at INPUT.MIN_SIZE_TEST {cfg.INPUT.MIN_SIZE_TEST}" if cfg.INPUT.MIN_SIZE_TEST else ""
        logger.warning(
            f"INPUT.MAX_SIZE_TRAIN {max_size} is below INPUT.MIN_SIZE_TRAIN {sizes}: detectron2's resize caps the "
            f"longer image side at {max_size}, so no training image's shorter side reaches more than {max_size} "
            f"(square images train at {max_size}x{max_size}{test}). Set INPUT.MAX_SIZE_TRAIN to at least {max(sizes)} "
            f"(e.g. {max(max(sizes) * 5 // 3, max(sizes))}, detectron2's ratio), or lower INPUT.MIN_SIZE_TRAIN.")
    crop = cfg.INPUT.CROP
    shapes = [name for name in cfg.DATASETS.TRAIN if name.startswith(SHAPES_PREFIX)]
    image = cfg.DATASETS.SHAPES.IMAGE_SIZE
    if crop.ENABLED and shapes and crop.TYPE in ("absolute", "absolute_range") and len(crop.SIZE) == 2 and (
            min(crop.SIZE) >= image if crop.TYPE == "absolute" else crop.SIZE[0] >= image):
        logger.warning(
            f"INPUT.CROP.SIZE {list(crop.SIZE)} (INPUT.CROP.TYPE {crop.TYPE!r}) is not smaller than the "
            f"{image}x{image} images of {', '.join(shapes)} (DATASETS.SHAPES.IMAGE_SIZE {image}): detectron2's "
            "RandomCrop, applied before the resize, keeps every image whole, so nothing is cropped. Give a crop size "
            f"below {image} pixels (e.g. INPUT.CROP.SIZE [{max(1, image * 3 // 4)}, {max(1, image * 3 // 4)}]), or "
            "INPUT.CROP.TYPE 'relative_range' with fractions, or INPUT.CROP.ENABLED False.")


def _rate_factor(cfg: CfgNode, iteration: int) -> float:
    """The factor of ``SOLVER.BASE_LR`` detectron2's scheduler of ``cfg`` gives at ``iteration``."""
    scheduler = build_lr_scheduler(cfg, torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0))
    return scheduler._multiplier(min(iteration / cfg.SOLVER.MAX_ITER, 1.0))


# The values of detectron2's learning-rate schedule (SOLVER.BASE_LR aside: a resume trains with the config's).
SCHEDULE_KEYS = ("SOLVER.MAX_ITER", "SOLVER.LR_SCHEDULER_NAME", "SOLVER.STEPS", "SOLVER.GAMMA", "SOLVER.WARMUP_ITERS",
                 "SOLVER.WARMUP_FACTOR", "SOLVER.WARMUP_METHOD", "SOLVER.BASE_LR_END", "SOLVER.NUM_DECAYS",
                 "SOLVER.RESCALE_INTERVAL")


def warn_of_a_moved_schedule(cfg: CfgNode, output_dir: str) -> None:
    """:func:`gwdet.engine.output_dir.warn_of_a_moved_schedule` of a yacs config: detectron2's cosine
    schedule, the warm-up (and the fixed-gamma steps) are fractions of ``SOLVER.MAX_ITER``; multi-step
    ``STEPS`` stay where they are. Every value of :data:`SCHEDULE_KEYS` that differs is named."""
    def factors(path: str, iteration: int) -> ScheduleAt | None:
        saved = saved_run_config(cfg, output_dir, path)
        values, now = flatten_config(saved), flatten_config(cfg)
        changes = tuple(f"{key} {values[key]} -> {now[key]}" for key in SCHEDULE_KEYS
                        if key in values and key in now and values[key] != now[key])
        if not changes:
            return None
        return ScheduleAt(saved.SOLVER.MAX_ITER, cfg.SOLVER.MAX_ITER, _rate_factor(saved, iteration),
                          _rate_factor(cfg, iteration), changes)

    steps = cfg.SOLVER.LR_SCHEDULER_NAME == "WarmupMultiStepLR"
    moved_schedule_warning(output_dir, factors, max_iter_setting="SOLVER.MAX_ITER",
                           schedule=cfg.SOLVER.LR_SCHEDULER_NAME, rate_setting="SOLVER.BASE_LR",
                           keep="SOLVER.MAX_ITER {}",
                           alternative=None if steps else "use WarmupMultiStepLR, whose SOLVER.STEPS are iterations")


def check_training_values(cfg: CfgNode, world_size: int) -> None:
    """Refuse, before anything is built, solver and dataset values a training run cannot start
    with (detectron2 would stop later with a bare assertion): a ``SOLVER.MAX_ITER``,
    ``WARMUP_ITERS`` or ``IMS_PER_BATCH`` that is no integer (the config gate's rules, before they
    are read here), no training dataset, no iteration, a batch of no images or one that cannot be
    split evenly over the ``world_size`` processes; a
    training from scratch (no ``MODEL.WEIGHTS``) with FrozenBN layers, which would stay identities,
    or with frozen backbone stages (``MODEL.BACKBONE.FREEZE_AT``), which would stay random; mixed
    precision (``SOLVER.AMP.ENABLED``) on a device that is no CUDA GPU; and detectron2's PreciseBN
    (``TEST.PRECISE_BN.ENABLED``) with norms of batch statistics whose running statistics it does
    not recompute (it takes torch's batch norms only: BW and BGN would keep their running averages);
    frozen backbone stages whose norms of batch statistics detectron2 does not freeze (BW, BGN); and
    torch's SyncBatchNorm in several processes off CUDA. ``world_size`` must be a whole number >= 1."""
    if not is_whole_number(world_size) or world_size < 1:
        raise GwdetValueError(f"check_training_values(cfg, world_size): world_size is the number of training "
                              f"processes, a whole number >= 1 (detectron2.utils.comm.get_world_size()), got "
                              f"{world_size!r}")
    for key in ("SOLVER.MAX_ITER", "SOLVER.WARMUP_ITERS", "SOLVER.IMS_PER_BATCH"):  # read below, before the gate
        check_detectron2_value(cfg, key)
    if not cfg.DATASETS.TRAIN:
        raise GwdetValueError("DATASETS.TRAIN is empty: name the dataset(s) to train on, e.g. DATASETS.TRAIN "
                              "\"('shapes_train',)\" (or evaluate weights with --eval-only).")
    if cfg.SOLVER.MAX_ITER < 1:
        raise GwdetValueError(f"SOLVER.MAX_ITER is {cfg.SOLVER.MAX_ITER}: a run trains for at least 1 iteration.")
    if cfg.SOLVER.BASE_LR == 0:
        logger.warning(ZERO_RATE.format(setting="SOLVER.BASE_LR 0.0"))
    if cfg.SOLVER.WARMUP_ITERS >= cfg.SOLVER.MAX_ITER:  # the last iteration, MAX_ITER - 1, is still warming up
        if cfg.SOLVER.WARMUP_ITERS == cfg.SOLVER.MAX_ITER:
            how = f"is as long as SOLVER.MAX_ITER {cfg.SOLVER.MAX_ITER}: the warm-up lasts the whole run"
        else:
            how = (f"is longer than SOLVER.MAX_ITER {cfg.SOLVER.MAX_ITER}: detectron2 stretches the warm-up over the "
                   "whole run")
        logger.warning(f"SOLVER.WARMUP_ITERS {cfg.SOLVER.WARMUP_ITERS} {how}, whose learning rate then never reaches "
                       "SOLVER.BASE_LR. Shorten the warm-up (e.g. SOLVER.WARMUP_ITERS "
                       f"{cfg.SOLVER.MAX_ITER // 10}) to train at the base rate.")
    check_training_sampling(cfg)
    check_training_image_sizes(cfg)
    _warn_of_unread_schedule_values(cfg)
    _warn_of_resized_shapes(cfg)
    norms = norm_settings(cfg)
    if not cfg.MODEL.WEIGHTS:
        check_scratch_training([key for key, name in norms.items() if name == "FrozenBN"], cfg.MODEL.BACKBONE.FREEZE_AT,
                               "MODEL.WEIGHTS", "MODEL.BACKBONE.FREEZE_AT")
    if cfg.MODEL.BACKBONE.FREEZE_AT >= 1:
        drifting = [f"{key} ({name})" for key, name in frozen_stage_norms(cfg).items() if name and precise_bn_skips(name)]
        if drifting:
            raise GwdetValueError(
                f"MODEL.BACKBONE.FREEZE_AT is {cfg.MODEL.BACKBONE.FREEZE_AT}, but the frozen stages' norms of "
                f"{', '.join(drifting)} keep running statistics that training would go on updating: detectron2 freezes "
                "a stage by turning its batch norms into FrozenBN, which it does for torch's batch norms only, so the "
                "frozen stages would compute another function after every batch. Train those stages too "
                "(MODEL.BACKBONE.FREEZE_AT 0), or use FrozenBN / BN there.")
    check_mixed_precision(cfg.SOLVER.AMP.ENABLED, cfg.MODEL.DEVICE, "SOLVER.AMP.ENABLED", "MODEL.DEVICE",
                          "SOLVER.AMP.ENABLED False", "MODEL.DEVICE cuda")
    if cfg.TEST.PRECISE_BN.ENABLED:
        missed = [f"{key} ({name})" for key, name in norms.items() if name and precise_bn_skips(name)]
        if missed:
            raise GwdetValueError(
                f"TEST.PRECISE_BN.ENABLED is True, but detectron2's PreciseBN recomputes the running statistics of "
                f"torch's batch norms only, and the layers of {', '.join(missed)} would keep their running averages. Set "
                "TEST.PRECISE_BN.ENABLED False, or use BN / SyncBN there.")
        iterations = cfg.TEST.PRECISE_BN.NUM_ITER
        if not is_whole_number(iterations) or iterations < 1:
            raise GwdetValueError(
                f"TEST.PRECISE_BN.NUM_ITER is {iterations!r}: PreciseBN averages the batch statistics of that many "
                "batches (0 would set every BN layer's running mean and variance to 0, a negative count stops after "
                "the training); give at least 1, e.g. TEST.PRECISE_BN.NUM_ITER 200, or TEST.PRECISE_BN.ENABLED False.")
    synchronized = [key for key, name in norms.items() if synchronizes_cuda_only(name)]
    if synchronized and world_size > 1 and not str(cfg.MODEL.DEVICE).startswith("cuda"):
        raise GwdetValueError(
            f"{', '.join(synchronized)} is {norms[synchronized[0]]} (torch's SyncBatchNorm), which synchronizes CUDA "
            f"tensors only: {world_size} processes on {cfg.MODEL.DEVICE!r} would stop when training starts. Train "
            "with one process, on GPUs (MODEL.DEVICE cuda), or with another norm there (BN, GN, GW, ...).")
    check_batch_split(f"SOLVER.IMS_PER_BATCH is {cfg.SOLVER.IMS_PER_BATCH}", cfg.SOLVER.IMS_PER_BATCH, world_size)


# The values detectron2's DefaultTrainer.auto_scale_workers rescales to the number of processes
SCALED_KEYS = ("SOLVER.IMS_PER_BATCH", "SOLVER.BASE_LR", "SOLVER.MAX_ITER", "SOLVER.WARMUP_ITERS", "SOLVER.STEPS",
               "TEST.EVAL_PERIOD", "SOLVER.CHECKPOINT_PERIOD")


class YacsRun(RunConfig):
    """A yacs config (:func:`gwdet.model_zoo.build_config`) in the run of :mod:`gwdet.engine.run`,
    trained by :class:`Trainer`."""

    output_setting = "OUTPUT_DIR"
    weights_setting = "MODEL.WEIGHTS"
    weights_example = "MODEL.WEIGHTS path/to/model_final.pth"
    input_format_setting = "INPUT.FORMAT"
    input_settings = ("INPUT.FORMAT, MODEL.PIXEL_MEAN, MODEL.PIXEL_STD, MODEL.RESNETS.STRIDE_IN_1X1, "
                      "MODEL.ANCHOR_GENERATOR.SIZES, ASPECT_RATIOS and OFFSET, MODEL.FPN.FUSE_TYPE, the "
                      "BBOX_REG_WEIGHTS of MODEL.RPN and MODEL.ROI_BOX_HEAD, the POOLER_TYPE, POOLER_RESOLUTION and "
                      "POOLER_SAMPLING_RATIO of MODEL.ROI_BOX_HEAD and MODEL.ROI_MASK_HEAD, MODEL.ROI_HEADS.IN_FEATURES")
    vis_setting = "TEST.VIS_IMAGES"
    test_setting = "DATASETS.TEST"
    cfg: CfgNode

    @classmethod
    def load(cls, config_file: str, opts: Sequence[str] = (), *, tool: bool = False) -> "YacsRun":
        """The config file with its ``KEY VALUE`` overrides; ``tool``: test images read in this process
        (``DATALOADER.NUM_WORKERS 0``) unless the overrides set the key."""
        in_process = tool and "DATALOADER.NUM_WORKERS" not in list(opts)[::2]
        return cls(build_config(config_file, [*(["DATALOADER.NUM_WORKERS", "0"] if in_process else []), *opts]))

    @property
    def output_dir(self) -> str:
        return self.cfg.OUTPUT_DIR

    @property
    def weights(self) -> str:
        return self.cfg.MODEL.WEIGHTS

    @property
    def vis_images(self) -> int:
        return self.cfg.TEST.VIS_IMAGES

    @property
    def score_threshold_setting(self) -> str:
        head = "RETINANET" if "RetinaNet" in self.cfg.MODEL.META_ARCHITECTURE else "ROI_HEADS"
        return f"MODEL.{head}.SCORE_THRESH_TEST"

    @property
    def test_settings(self) -> dict[str, Any]:
        cfg = self.cfg
        if "RetinaNet" in cfg.MODEL.META_ARCHITECTURE:
            heads = [f"MODEL.RETINANET.{key}" for key in ("SCORE_THRESH_TEST", "NMS_THRESH_TEST", "TOPK_CANDIDATES_TEST")]
        else:
            heads = [*(f"MODEL.RPN.{key}" for key in ("PRE_NMS_TOPK_TEST", "POST_NMS_TOPK_TEST", "NMS_THRESH")),
                     *(f"MODEL.ROI_HEADS.{key}" for key in ("SCORE_THRESH_TEST", "NMS_THRESH_TEST"))]
        # INPUT.MIN_SIZE_TEST 0: detectron2 evaluates the images at their own size, and MAX_SIZE_TEST caps nothing
        sizes = ["INPUT.MIN_SIZE_TEST"] + (["INPUT.MAX_SIZE_TEST"] if cfg.INPUT.MIN_SIZE_TEST else [])
        keys = [*sizes, *heads, "TEST.DETECTIONS_PER_IMAGE"]
        # the norms' settings read at test time only, as their records name them (BGN's example weighing)
        keys += sorted({key for name in norm_settings(cfg).values() if name
                        for param, key in norm_record(name).config_keys.items() if param in TEST_TIME_SETTINGS})
        return {key: config_value(cfg, key) for key in keys}

    def with_target(self, weights: str, output_dir: str) -> "YacsRun":
        cfg = self.cfg.clone()
        cfg.defrost()
        cfg.MODEL.WEIGHTS, cfg.OUTPUT_DIR = weights, output_dir
        cfg.freeze()
        return type(self)(cfg)

    def for_processes(self, world_size: int) -> "YacsRun":
        """The config as detectron2's trainer rescales it to ``world_size`` processes when
        ``SOLVER.REFERENCE_WORLD_SIZE`` names another number (batch, learning rate, schedule:
        ``DefaultTrainer.auto_scale_workers``, which logs the new values), so that the checks, the
        run's ``config.yaml`` and ``--resume`` see the values the run trains with."""
        if self.cfg.SOLVER.REFERENCE_WORLD_SIZE in (0, world_size):
            return self
        scaled = DefaultTrainer.auto_scale_workers(self.cfg, world_size)
        changes = [f"{key} {config_value(self.cfg, key)} -> {config_value(scaled, key)}" for key in SCALED_KEYS
                   if config_value(self.cfg, key) != config_value(scaled, key)]
        logger.warning(f"SOLVER.REFERENCE_WORLD_SIZE is {self.cfg.SOLVER.REFERENCE_WORLD_SIZE}, and the run has "
                       f"{world_size} process(es): detectron2 rescales the config to them ({'; '.join(changes)}), and "
                       "the run trains with those values. Set SOLVER.REFERENCE_WORLD_SIZE 0 (or "
                       f"{world_size}) to train with the values as given.")
        return YacsRun(scaled)

    def check_request(self, eval_only: bool, world_size: int) -> None:
        check_run_device(self.cfg.MODEL.DEVICE)
        check_evaluation_values(self.cfg)
        if not eval_only:
            check_training_values(self.cfg, world_size)
        elif self.cfg.TEST.PRECISE_BN.ENABLED and any(name and precise_bn_recomputes(name)
                                                      for name in norm_settings(self.cfg).values()):
            logger.warning("TEST.PRECISE_BN.ENABLED is True, but detectron2's PreciseBN runs during training only: "
                           "--eval-only evaluates the weights' running statistics as they are. Recompute them first "
                           "with gwdet.layers.update_running_statistics (docs/usage.md), or set it False.")

    def check_plain_model(self, task: str) -> None:
        if self.cfg.TEST.AUG.ENABLED:
            raise GwdetValueError(
                f"TEST.AUG.ENABLED is True, but {task} the plain model, without test-time augmentation (detectron2's "
                "GeneralizedRCNNWithTTA, which detectron2's own tools/train_net.py adds at evaluation): set "
                "TEST.AUG.ENABLED False.")

    def check_resume(self, weights_named: bool) -> None:
        check_resume_config(self.cfg, self.cfg.OUTPUT_DIR, weights_named)
        warn_of_a_moved_schedule(self.cfg, self.cfg.OUTPUT_DIR)

    def request_content(self) -> str:
        cfg = self.cfg.clone()
        cfg.defrost()
        cfg.MODEL.WEIGHTS = absolute_weights_path(cfg.MODEL.WEIGHTS, self.weights_setting)
        return json.dumps(cfg, sort_keys=True, default=repr)

    def register_datasets(self, coco: Sequence[CocoDataset], *, trains: bool, evaluates: bool,
                          reads_tests: bool = True) -> None:
        register_datasets(self.cfg, coco, trains=trains, evaluates=evaluates, reads_tests=reads_tests)

    def prepare_datasets(self, *, trains: bool, evaluates: bool) -> None:
        prepare_datasets(self.cfg, trains=trains, evaluates=evaluates)

    def build_model(self) -> torch.nn.Module:
        return Trainer.build_model(self.cfg)

    def model_differences_from(self, path: str) -> list[str]:
        return model_differences(saved_run_config(self.cfg, os.path.dirname(path), path), self.cfg)

    def build_trainer(self) -> Trainer:
        return Trainer(self.cfg)

    def verify_results(self, results: Mapping) -> None:
        """detectron2's ``verify_results`` of ``TEST.EXPECTED_RESULTS``: status 1 (after its error lines)
        when a metric is off by more than its tolerance."""
        if self.cfg.TEST.EXPECTED_RESULTS and comm.is_main_process():
            verify_results(self.cfg, results)

    def evaluate(self, model: torch.nn.Module) -> Mapping:
        return Trainer.test(self.cfg, model)

    def test_datasets(self) -> list[str]:
        return list(self.cfg.DATASETS.TEST)

    def run_datasets(self, trains: bool = True) -> list[str]:
        return config_dataset_names(self.cfg, trains)

    def describe_test_set(self) -> str:
        return f"{self.cfg.DATASETS.TEST[0]} (DATASETS.TEST[0])"

    def test_loader(self) -> Any:
        self.prepare_datasets(trains=False, evaluates=False)  # a tool's: the evaluation's checks came before
        return Trainer.build_test_loader(self.cfg, self.cfg.DATASETS.TEST[0])

    def evaluator(self, output_folder: str) -> Any:
        return Trainer.build_evaluator(self.cfg, self.cfg.DATASETS.TEST[0], output_folder)
