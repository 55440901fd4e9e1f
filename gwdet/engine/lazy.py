"""A LazyConfig's run: how the run of :mod:`gwdet.engine.run` reads, builds, trains and evaluates a
LazyConfig (``.py``) (:class:`LazyRun`), with :class:`LazyTrainer`, the loop of detectron2's
``tools/lazyconfig_train_net.py`` with what gwdet adds to training (:mod:`gwdet.engine.training`).

The LazyConfig is the layout of detectron2's ``tools/lazyconfig_train_net.py`` (``model``,
``dataloader.{train,test,evaluator}``, ``optimizer``, ``lr_multiplier``, ``train`` as in
detectron2's ``common/train.py``), so the same file runs there too. A run follows the yacs path's
rules, with the LazyConfig's settings in place of the yacs keys (``train.output_dir`` for
``OUTPUT_DIR``, ``train.init_checkpoint`` for ``MODEL.WEIGHTS``, ``train.seed`` for ``SEED``,
``train.device`` for ``MODEL.DEVICE``, ``train.vis_images`` for ``TEST.VIS_IMAGES``); ``--resume``
refuses another model (any difference under ``model`` from the run's ``config.yaml``), and values
the yacs path's checks refuse are refused under the LazyConfig's names before anything is built
(:mod:`gwdet.engine.lazy_checks`). Loading with checked ``key=value``
overrides is :mod:`gwdet.model_zoo.lazy_loading`.
"""
from __future__ import annotations

import copy
import inspect
import json
import logging
import os
import tempfile
from collections import OrderedDict
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf, open_dict

from detectron2.config import CfgNode, LazyConfig, instantiate
from detectron2.data import build_detection_train_loader
from detectron2.data.samplers import TrainingSampler
from detectron2.engine import TrainerBase, hooks
from detectron2.evaluation import COCOEvaluator, inference_on_dataset, print_csv_format
from detectron2.solver import LRMultiplier
from detectron2.utils import comm
from detectron2.utils.logger import setup_logger
from detectron2.utils.registry import locate

from gwdet.solver import check_trainable, warn_of_untrained_parts
from gwdet.errors import GwdetTypeError, GwdetValueError, listed
from gwdet.layers.settings_state import TEST_TIME_SETTINGS
from gwdet.utils.atomic import remove_checksum
from gwdet.checkpoint.compatibility import unwrapped
from gwdet.checkpoint.resilient import CLASSES_ATTRIBUTE, absolute_weights_path
from gwdet.checkpoint.resume_order import numbered_iteration
from gwdet.checkpoint.signal_hook import release_stop_signals
from gwdet.data.boxes import check_dataset_boxes
from gwdet.data.coco_registration import (
    CocoDataset,
    environment_datasets,
    register_coco_datasets,
    registered_coco_dataset,
    warn_of_test_sets_trained_on,
)
from gwdet.data.datasets import check_dataset_files, check_evaluated_classes, named_empty_training_set
from gwdet.data.resumable import resumable_train_loader
from gwdet.config import ABSENT, as_saved, flatten_config
from gwdet.model_zoo.lazy_loading import (
    OUTPUT_SETTING,
    argument_names,
    callable_of,
    check_keys,
    load_lazy_config,
    read_saved_config,
    select,
)
from gwdet.modeling import check_model
from gwdet.modeling.build import check_device
from gwdet.modeling.detectron2_failures import detectron2_group_norm_failure
from gwdet.modeling.model_checks import (check_frozen_batch_statistics, check_model_example_groups,
                                         check_norm_weight_decay)
from gwdet.engine.output_dir import (SavedRun, ScheduleAt, check_config_checksum, checkpoints_in, check_resume_trains,
                                     check_resumed_run, check_run_detections_kept, config_differences, damaged_config,
                                     leaves_the_model)
from gwdet.utils.run_file_names import CONFIG_NAME
from gwdet.engine.output_dir import warn_of_a_moved_schedule as moved_schedule_warning
from gwdet.config_checks import check_batch_split, is_whole_number
from gwdet.engine.lazy_checks import (
    NORM_ARGUMENTS,
    lazy_calls,
    check_example_group_nodes,
    check_call_arguments,
    check_model_values,
    check_optimizer_values,
    check_seed,
    check_datasets,
    dataset_use,
    check_norm_nodes,
    norm_checked_model,
    check_loader_values,
    check_resize_nodes,
    check_run_values,
    check_training_values,
    dataset_names,
    evaluated_dataset,
    names_at,
    warn_unused_head_norms,
)
from gwdet.engine.run import RunConfig, warn_of_uncounted_detections
from gwdet.data.finite_images import FiniteImageBatches
from gwdet.engine.training import (
    EvaluationWriter,
    InnerTrainerState,
    MetricHistoryKept,
    check_config_kind,
    check_fresh_training,
    check_not_over_another_run,
    check_output_folder,
    check_schedule_unchanged,
    check_torch_state,
    configured_optimizer_values,
    continue_after_resume,
    note_built_config,
    random_streams_kept,
    run_writers,
    seed_as_the_tools_do,
    training_checkpointer,
    training_lock,
    training_loop,
    with_signal_checkpoints,
)

WEIGHTS_SETTING = "train.init_checkpoint"
BATCH_SETTING = "dataloader.train.total_batch_size"
SEED_SETTING = "train.seed"
# the settings by which the optimizer groups the parameters, which a resume cannot change
OPTIMIZER_GROUPING = "optimizer.params' weight decays, bias_lr_factor and overrides"
# the test images' resizing, which an evaluation reads and training does not
TEST_AUGMENTATIONS = "dataloader.test.mapper.augmentations"
# What training needs besides dataloader.test / dataloader.evaluator (without them: no evaluation),
# as detectron2's common/train.py and tools/lazyconfig_train_net.py lay it out.
TRAINING_KEYS = (
    "model", "dataloader.train", "optimizer", "lr_multiplier", "train.output_dir", "train.init_checkpoint",
    "train.max_iter", "train.device", "train.amp.enabled", "train.ddp", "train.checkpointer", "train.eval_period",
    "train.log_period",
)
# how to give each key gwdet.engine.lazy's functions read, for a LazyConfig built in Python without it
KEY_EXAMPLES = {
    "model": "cfg.model = L(GeneralizedRCNN)(...), as configs/LazyConfig/ builds it",
    "train.device": "cfg.train.device = 'cpu', in a train node as detectron2's "
                    "model_zoo.get_config('common/train.py').train gives it",
    "optimizer": "cfg.optimizer = detectron2.model_zoo.get_config('common/optim.py').SGD",
    "dataloader.train": "cfg.dataloader.train = L(build_detection_train_loader)(...)",
}
EVALUATION_KEYS = ("model", "dataloader.test", "dataloader.evaluator", "train.output_dir", "train.init_checkpoint",
                   "train.device")

logger = logging.getLogger(__name__)


# ---- building ----------------------------------------------------------------------------------


def check_lazy_config_given(cfg: Any, function: str, keys: Sequence[str] = ()) -> None:
    """Refuse ``cfg`` unless it is a LazyConfig (an omegaconf ``DictConfig``) that holds ``keys``
    (what ``function`` of this module reads), naming ``function``, what it takes and what to use
    for a yacs config (gwdet's yacs entry points)."""
    if isinstance(cfg, DictConfig):
        missing = [key for key in keys if select(cfg, key) is ABSENT]
        if not missing:
            return
        if "model" in missing and "_target_" in cfg:  # a node of the LazyConfig, such as cfg.model
            raise GwdetTypeError(
                f"gwdet.engine.lazy.{function} takes the whole LazyConfig (the cfg that holds "
                f"{', '.join(keys)}), not one of its nodes: this one calls {cfg.get('_target_')!r} and has no "
                f"{', '.join(missing)}. Give {function}(cfg), not {function}(cfg.model).")
        raise GwdetValueError(
            f"gwdet.engine.lazy.{function} reads {', '.join(keys)} of the LazyConfig, but this one has no "
            f"{', '.join(missing)}. Add {' and '.join(missing)} (e.g. {'; '.join(KEY_EXAMPLES[key] for key in missing)}), "
            "as detectron2's common/train.py and gwdet's LazyConfigs (configs/LazyConfig/) lay them out.")
    yacs = isinstance(cfg, CfgNode)
    fix = (f"for a yacs config, use gwdet.{function if function in ('build_model', 'build_optimizer') else 'engine.trainer.Trainer'}"
           if yacs else "load the LazyConfig first: detectron2's LazyConfig.load(path), or gwdet.model_zoo.get_config(name) "
           "for one of gwdet's")
    raise GwdetTypeError(f"gwdet.engine.lazy.{function} takes a LazyConfig (an omegaconf DictConfig), not "
                         f"{'a yacs CfgNode' if yacs else repr(cfg) + ' (' + type(cfg).__name__ + ')'}: {fix}.")


def _check_model_given(model: Any, function: str) -> None:
    """Refuse a ``model`` that is not a ``torch.nn.Module``, naming ``function`` and how to build one."""
    if not isinstance(model, torch.nn.Module):
        raise GwdetTypeError(
            f"gwdet.engine.lazy.{function}(cfg, model) takes the model as a torch.nn.Module, got {model!r} "
            f"({type(model).__name__}). Build it first: model = gwdet.engine.lazy.build_model(cfg).")


def build_model(cfg: DictConfig) -> torch.nn.Module:
    """``instantiate(cfg.model)``, checked by :func:`gwdet.check_model`, on ``train.device``; a
    head's norm that the model cannot have is warned of (:func:`warn_unused_head_norms`), in the
    run's log as a yacs config's is. The config is checked first as :meth:`LazyRun.load` and
    :meth:`LazyRun.check_request` check it (a config built or changed in Python did not pass
    there): the norm and call nodes, the model's values (:func:`check_model_values`) and the
    example groups of its BGN / GhostBN nodes against ``dataloader.train.total_batch_size``."""
    check_lazy_config_given(cfg, "build_model", ("model", "train.device"))
    check_norm_nodes(cfg)
    check_call_arguments(cfg)
    check_model_values(cfg)
    batch = select(cfg, BATCH_SETTING)
    if is_whole_number(batch) and batch >= 1:  # another value is the loader's to refuse
        check_example_group_nodes(cfg, batch, comm.get_world_size())
    return _build_checked_model(cfg)


def _build_checked_model(cfg: DictConfig) -> torch.nn.Module:
    """:func:`build_model` of a LazyConfig whose norm and call nodes were checked
    (:meth:`LazyRun.load`), so that one run checks them once. A plain callable given as a norm
    argument has its layers checked as the model is built (:func:`norm_checked_model`).
    detectron2's norm name ``"GN"`` on a layer whose channels its 32 groups do not divide is refused
    naming the nodes that give it (:func:`~gwdet.modeling.detectron2_failures.detectron2_group_norm_failure`)."""
    check_device(cfg.train.device, "train.device", "run with train.device=cpu")
    warn_unused_head_norms(cfg)
    try:
        built = instantiate(norm_checked_model(cfg))
    except ValueError as error:  # detectron2's "GN" (32 groups) on channels 32 does not divide
        refusal = detectron2_group_norm_failure(error, _group_norm_nodes(cfg))
        if refusal is None:
            raise
        raise refusal from error
    model = check_model(built)
    logging.getLogger("detectron2").info(f"Model:\n{model}")
    return model.to(cfg.train.device)


def _group_norm_nodes(cfg: DictConfig) -> str:
    """The norm arguments of ``cfg.model``'s nodes that give detectron2's name ``"GN"``
    (``"model.backbone.bottom_up.stem.norm='GN'"``), for :func:`detectron2_group_norm_failure`;
    ``"model (a norm of a component)"`` when none does (a component's default)."""
    nodes = []
    for path, node, _ in lazy_calls(select(cfg, "model"), "model"):
        for argument in NORM_ARGUMENTS:
            if argument in node and not OmegaConf.is_interpolation(node, argument) and node.get(argument) == "GN":
                nodes.append(f"{path}.{argument}='GN'")
    if not nodes:
        return "model (a norm of a component)"
    return nodes[0] if len(nodes) == 1 else f"one of {listed(nodes, 4)}"


def build_optimizer(cfg: DictConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    """``cfg.optimizer`` for ``model`` (given as ``optimizer.params.model``, as detectron2's tool
    does, and taken out again), its values checked first as the tools check them
    (:func:`check_optimizer_values`), its norm weight decay checked against ``params.weight_decay_norm``."""
    check_lazy_config_given(cfg, "build_optimizer", ("optimizer",))
    _check_model_given(model, "build_optimizer")
    check_optimizer_values(cfg)
    return _build_checked_optimizer(cfg, model)


def _build_checked_optimizer(cfg: DictConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    """:func:`build_optimizer` of a LazyConfig whose values were checked (:meth:`LazyRun.check_request`);
    a model without a trainable parameter is refused (:func:`gwdet.solver.check_trainable`)."""
    check_trainable(model)
    warn_of_untrained_parts(model, cfg.train.get("init_checkpoint", "") if "train" in cfg else "",
                            "train.init_checkpoint")
    params = cfg.optimizer.params
    previous = params.get("model", ABSENT)
    params.model = model
    try:
        optimizer = instantiate(cfg.optimizer)
    finally:
        if previous is ABSENT:
            params.pop("model")
        else:
            params.model = previous
    if params.get("weight_decay_norm") is not None:
        overrides: Any = params.get("overrides")  # checked by check_optimizer_values: a mapping of mappings, or None
        if isinstance(overrides, DictConfig):
            overrides = OmegaConf.to_container(overrides)
        check_norm_weight_decay(model, optimizer, params.weight_decay_norm, params.get("weight_decay_bias"), overrides)
    return optimizer


def _instantiate_dataset(node: Any) -> Any:
    """``dataloader.train.dataset``, its boxes checked (:func:`gwdet.data.boxes.check_dataset_boxes`)
    when it is a list of detectron2 dataset dicts."""
    with named_empty_training_set("dataloader.train.dataset", "dataloader.train.dataset.filter_empty=False"):
        dataset = instantiate(node)
    if isinstance(dataset, list):
        check_dataset_boxes(dataset, "dataloader.train.dataset")
    return dataset


def build_train_loader(cfg: DictConfig) -> Any:
    """``dataloader.train``.

    A node that calls detectron2's ``build_detection_train_loader`` is built as
    :func:`gwdet.data.resumable.resumable_train_loader` builds yacs loaders: its sampler (default:
    ``TrainingSampler`` seeded with ``train.seed`` when it is >= 0) positioned on resume, and with a
    seed its own seeded generator. Any other loader is instantiated as it is, and restarts its
    sample stream on resume (with a warning then).
    """
    check_lazy_config_given(cfg, "build_train_loader", ("dataloader.train",))
    check_seed(cfg)
    batch = select(cfg, BATCH_SETTING)
    if batch is not ABSENT:
        check_batch_split(f"{BATCH_SETTING}={batch!r}", batch, comm.get_world_size())
    return _build_checked_train_loader(cfg)


def _build_checked_train_loader(cfg: DictConfig) -> Any:
    """:func:`build_train_loader` of a LazyConfig whose values were checked (:meth:`LazyRun.check_request`)."""
    node = cfg.dataloader.train
    if callable_of(node) is not build_detection_train_loader:
        return instantiate(node)
    arguments = {str(key): instantiate(node[key]) for key in node if key not in ("_target_", "dataset")}
    dataset = arguments["dataset"] = _instantiate_dataset(node.dataset)
    if isinstance(dataset, torch.utils.data.IterableDataset):
        return build_detection_train_loader(**arguments)
    seed = select(cfg, SEED_SETTING)
    seed = -1 if seed is ABSENT else int(seed)
    if arguments.get("sampler") is None:
        numpy_state = np.random.get_state()  # an unseeded TrainingSampler draws its seed from numpy
        arguments["sampler"] = TrainingSampler(len(dataset), seed=seed if seed >= 0 else None)
        np.random.set_state(numpy_state)
    return resumable_train_loader(arguments, seed, "train.seed")


def evaluate(cfg: DictConfig, model: torch.nn.Module) -> "OrderedDict[str, Any]":
    """``model`` evaluated by ``dataloader.evaluator`` on ``dataloader.test`` (as detectron2's
    ``lazyconfig_train_net.py`` does): ``{dataset: {task: {metric: value}}}``; empty without them. The
    model's classes (:data:`~gwdet.checkpoint.resilient.CLASSES_ATTRIBUTE`) are checked against the
    evaluated dataset's first."""
    check_lazy_config_given(cfg, "evaluate")
    _check_model_given(model, "evaluate")
    if select(cfg, "dataloader.test") is ABSENT or select(cfg, "dataloader.evaluator") is ABSENT:
        logger.info("The config has no dataloader.test / dataloader.evaluator: nothing is evaluated.")
        return OrderedDict()
    written, output_dir = select(cfg, "dataloader.evaluator.output_dir"), select(cfg, "train.output_dir")
    if isinstance(written, str) and isinstance(output_dir, str):
        check_run_detections_kept(written, output_dir, "Give the evaluator a folder of its own "
                                  "(dataloader.evaluator.output_dir), or evaluate with tools/train_net.py --eval-only, "
                                  "which writes eval/<checkpoint>/.")
    check_dataset_files(dataset_names(cfg, trains=False))  # registered, as the tools check them
    name = evaluated_dataset(cfg)
    warn_of_uncounted_detections(select(cfg, "model.roi_heads.box_predictor.test_topk_per_image"),
                                 "model.roi_heads.box_predictor.test_topk_per_image",
                                 select(cfg, "dataloader.evaluator.max_dets_per_image"))
    check_evaluated_classes(getattr(unwrapped(model), CLASSES_ATTRIBUTE, None), [name] if name else [], "The model")
    loader = FiniteImageBatches(instantiate(cfg.dataloader.test))  # batches checked as in training
    evaluator = cfg.dataloader.evaluator
    if evaluator.get("_target_") in (COCOEvaluator, "detectron2.evaluation.COCOEvaluator") \
            and "allow_cached_coco" not in evaluator:  # converted anew: an earlier evaluation's cache may be stale
        evaluator = copy.deepcopy(evaluator)
        with open_dict(evaluator):
            evaluator.allow_cached_coco = False
    results = inference_on_dataset(model, loader, instantiate(evaluator))
    if comm.is_main_process() and results:
        print_csv_format(results)
    return OrderedDict([(name, results)]) if name and results else OrderedDict(results or {})


class RunPeriodicCheckpointer(hooks.PeriodicCheckpointer):
    """detectron2's periodic checkpoints, whose ``max_to_keep`` counts the run's checkpoints, not
    only this process's: a resumed run counts the numbered checkpoints it wrote before the resumed
    iteration first (oldest first), so at most ``max_to_keep`` are kept across resumes. The SHA-256
    record beside a checkpoint it deletes goes with it."""

    def step(self, iteration: int, **kwargs: Any) -> None:
        kept = list(self.recent_checkpoints)
        super().step(iteration, **kwargs)
        for path in set(kept) - set(self.recent_checkpoints):
            if not os.path.lexists(path):
                remove_checksum(path)

    def before_train(self) -> None:
        super().before_train()
        if self.max_to_keep is None:
            return
        save_dir = self.checkpointer.save_dir
        earlier = sorted((iteration, name) for name in checkpoints_in(save_dir)
                         if (iteration := numbered_iteration(name)) is not None)
        self.recent_checkpoints = [os.path.join(save_dir, name) for iteration, name in earlier
                                   if iteration < self.trainer.iter]


class LazyTrainer(InnerTrainerState, TrainerBase):
    """gwdet's :class:`~gwdet.engine.trainer.Trainer` for a LazyConfig: detectron2's trainer loop and
    hooks as ``tools/lazyconfig_train_net.py`` sets them up (timer, LR scheduler, periodic
    checkpointer, evaluation, writers), with what gwdet adds to training
    (:mod:`gwdet.engine.training`) and the final results returned by :meth:`train`."""

    def __init__(self, cfg: DictConfig) -> None:
        check_config_kind(cfg, yacs=False)
        check_output_folder(select(cfg, "train.output_dir"), "train.output_dir")
        check_torch_state(training=True)  # float64 or no gradients left by one's own code: refused by name
        LazyRun(cfg).check_training_request(comm.get_world_size())  # done already where the tools built it
        # datasets one's own code registered (register_coco_instances) get the --register-coco checks before training
        check_datasets(cfg, trains=True, evaluates=False)
        seed_as_the_tools_do(cfg, select(cfg, "train.seed"), "train.seed")  # the tools' default_setup did
        super().__init__()
        if not logging.getLogger("detectron2").isEnabledFor(logging.INFO):
            setup_logger()
        model = build_model(cfg)
        batch = int(cfg.dataloader.train.get("total_batch_size", 0))
        check_model_example_groups(model, batch, comm.get_world_size(), BATCH_SETTING)  # a partial's layers too
        check_frozen_batch_statistics(model)  # frozen by one's own code (detectron2's freeze())
        optimizer = _build_checked_optimizer(cfg, model)  # its values checked by check_training_request
        loader = _build_checked_train_loader(cfg)
        self._images_per_rank = batch // comm.get_world_size()
        self._trainer = training_loop(model, FiniteImageBatches(loader), optimizer, cfg.train.amp.enabled, **cfg.train.ddp)
        self.scheduler = LRMultiplier(optimizer, multiplier=instantiate(cfg.lr_multiplier), max_iter=cfg.train.max_iter)
        self.checkpointer = training_checkpointer(self, cfg.train.output_dir,
                                                  names_at(cfg, "dataloader.train.dataset.names"), WEIGHTS_SETTING)
        self.start_iter, self.max_iter, self.cfg = 0, cfg.train.max_iter, cfg
        self.register_hooks(self.build_hooks())
        note_built_config(self, LazyRun(cfg))

    @property
    def model(self) -> torch.nn.Module:
        return self._trainer.model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self._trainer.optimizer

    @property
    def data_loader(self) -> Any:
        return self._trainer.data_loader

    def build_hooks(self) -> list:
        cfg = self.cfg

        def test_and_save_results():
            with random_streams_kept():  # training draws on as if no evaluation had run
                self._last_eval_results = evaluate(cfg, self.model)
            return self._last_eval_results

        main = comm.is_main_process()
        hook_list = [
            hooks.IterationTimer(),
            MetricHistoryKept(),
            hooks.LRScheduler(),
            RunPeriodicCheckpointer(self.checkpointer, **cfg.train.checkpointer) if main else None,
            hooks.EvalHook(cfg.train.eval_period, test_and_save_results),
            EvaluationWriter(run_writers(cfg.train.output_dir, self.max_iter), cfg.train.log_period,
                             cfg.train.eval_period) if main else None,
        ]
        return with_signal_checkpoints([hook for hook in hook_list if hook is not None])

    def resume_or_load(self, resume: bool = True) -> None:
        """``--resume``: continue from the newest readable checkpoint of ``train.output_dir`` (its
        iteration, optimizer, scheduler, random and data states); else load
        ``train.init_checkpoint`` and start at iteration 0; the output folder's lock held meanwhile
        (:func:`~gwdet.engine.training.training_lock`)."""
        with training_lock(self, LazyRun(self.cfg)):
            check_fresh_training(self.cfg, resume, self.cfg.train.output_dir, "train.output_dir")
            if resume:  # another model, batch or seed; a finished run would train nothing, its results set aside
                LazyRun(self.cfg).check_trainer_resume()
                check_resume_trains(self.cfg.train.output_dir, self.max_iter, "train.max_iter")
            with configured_optimizer_values(self.optimizer, self.scheduler, OPTIMIZER_GROUPING, WEIGHTS_SETTING):
                self.checkpointer.resume_or_load(self.cfg.train.init_checkpoint, resume=resume)
            if resume and self.checkpointer.has_checkpoint():
                self.start_iter = self.iter + 1
            continue_after_resume(self.cfg.train.output_dir, self.start_iter, self.data_loader, self._images_per_rank,
                                  "dataloader.train is not built by detectron2's build_detection_train_loader")

    def run_step(self) -> None:
        self._trainer.iter = self.iter
        self._trainer.run_step()

    def train(self):
        """Train from :attr:`start_iter` to ``train.max_iter``, holding the output folder's lock
        (:func:`~gwdet.engine.training.training_lock`); return the last evaluation's results."""
        with training_lock(self, LazyRun(self.cfg)):
            check_schedule_unchanged(self.max_iter, select(self.cfg, "train.max_iter"), "train.max_iter")
            check_not_over_another_run(self, self.cfg.train.init_checkpoint)
            try:
                super().train(self.start_iter, self.max_iter)
            finally:
                release_stop_signals(self._hooks)
        return getattr(self, "_last_eval_results", None)


# ---- the run -------------------------------------------------------------------------------------


EVALUATOR_DETECTIONS = "dataloader.evaluator.max_dets_per_image"


def target_defaults(flat: Mapping[str, Any]) -> dict[str, Any]:
    """For each node of the flattened config ``flat`` that names a class or function (``_target_``),
    the default values of its keyword arguments, under their keys (``NODE.ARGUMENT``): what
    ``instantiate`` gives an argument the config leaves out."""
    defaults: dict[str, Any] = {}
    for key, target in flat.items():
        if not key.endswith("._target_") or not isinstance(target, str):
            continue
        try:
            parameters = inspect.signature(locate(target)).parameters.values()
        except (ImportError, TypeError, ValueError):  # nothing to read: the config's values alone
            continue
        node = key[:-len("._target_")]
        defaults.update({f"{node}.{parameter.name}": as_saved(parameter.default) for parameter in parameters
                         if parameter.default is not inspect.Parameter.empty
                         and isinstance(parameter.default, (bool, int, float, str, tuple, list))})
    return defaults


def saved_tree(cfg: DictConfig) -> dict:
    """``cfg`` as a ``config.yaml`` written by detectron2's ``default_setup`` holds it
    (``LazyConfig.save``, then read back), interpolations resolved. What ``LazyConfig.save`` logs of
    this copy in a temporary folder (where it pickled a config YAML cannot hold) is not passed on:
    the run's own save says it of the run's file."""
    saving = logging.getLogger(LazyConfig.__module__)
    def quiet(record: logging.LogRecord) -> bool:
        return False
    saving.addFilter(quiet)
    try:
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, CONFIG_NAME)
            LazyConfig.save(cfg, path)
            tree = read_saved_config(path)
    finally:
        saving.removeFilter(quiet)
    if not isinstance(tree, dict):
        raise TypeError(f"A LazyConfig is a mapping of keys, not {type(tree).__name__}.")
    return tree


def model_differences(saved: Mapping, current: Mapping) -> list[str]:
    """``"model.KEY: saved -> current"`` for each value under ``model`` that differs between two
    trees of :func:`read_saved_config` and builds another model: all but the settings that leave the
    model as it is (:func:`~gwdet.engine.output_dir.leaves_the_model`), as a yacs config's model
    differences."""
    return [line for line in _model_lines(saved, current) if not leaves_the_model(line)]


def _model_lines(saved: Mapping, current: Mapping) -> list[str]:
    return config_differences({"model": saved["model"]}, {"model": current["model"]})


def compare_with_run(cfg: DictConfig, output_dir: str, path: str) -> SavedRun:
    """The run's ``config.yaml`` at ``path`` (checked against its checksum) compared with ``cfg``:
    every difference under ``model`` is another model. A damaged file, or one of a yacs config, is
    refused."""
    check_config_checksum(path, output_dir, OUTPUT_SETTING)
    try:
        saved = read_saved_config(path)
    except Exception as error:  # yaml's and omegaconf's errors, bytes that are not text
        raise damaged_config(path, output_dir, error, OUTPUT_SETTING) from None
    if not isinstance(saved, dict) or not isinstance(saved.get("model"), dict):
        raise GwdetValueError(
            f"--resume: the run in {output_dir!r} was not trained from a LazyConfig ({path} has no model), so "
            "this config cannot continue it. Resume it with the config it was trained with, or train into "
            "another train.output_dir.")
    current = saved_tree(cfg)
    saved_batch, current_batch = (OmegaConf.select(OmegaConf.create(tree), BATCH_SETTING) for tree in (saved, current))
    saved_seed, current_seed = (OmegaConf.select(OmegaConf.create(tree), SEED_SETTING) for tree in (saved, current))
    others = config_differences({key: value for key, value in saved.items() if key != "model"},
                                {key: value for key, value in current.items() if key != "model"})
    unchanged_model = [line for line in _model_lines(saved, current) if leaves_the_model(line)]
    return SavedRun((saved_batch, current_batch), (saved_seed, current_seed), model_differences(saved, current),
                    [*unchanged_model, *others])


def check_resume_config(cfg: DictConfig, output_dir: str, weights_named: bool = False) -> None:
    """:func:`~gwdet.engine.output_dir.check_resumed_run` of a LazyConfig (:func:`compare_with_run`)."""
    check_lazy_config_given(cfg, "check_resume_config")
    check_resumed_run(output_dir, lambda path: compare_with_run(cfg, output_dir, path), cfg.train.max_iter,
                      output_setting=OUTPUT_SETTING, batch_setting=BATCH_SETTING, seed_setting=SEED_SETTING,
                      max_iter_setting="train.max_iter", weights_setting=WEIGHTS_SETTING, weights_named=weights_named)


def warn_of_a_moved_schedule(cfg: DictConfig, output_dir: str) -> None:
    """:func:`gwdet.engine.output_dir.warn_of_a_moved_schedule` of a LazyConfig: its
    ``lr_multiplier`` is called with the fraction of ``train.max_iter`` done, so its warm-up and
    steps move with it."""
    def factors(path: str, iteration: int) -> ScheduleAt | None:
        saved = read_saved_config(path)
        saved_max_iter = int(saved["train"]["max_iter"])
        changes = ((f"train.max_iter {saved_max_iter} -> {cfg.train.max_iter}",) if saved_max_iter != cfg.train.max_iter
                   else ()) + (("lr_multiplier (another schedule)",) if saved_tree(cfg)["lr_multiplier"] !=
                               saved["lr_multiplier"] else ())
        if not changes:
            return None
        return ScheduleAt(saved_max_iter, cfg.train.max_iter,
                          instantiate(OmegaConf.create(saved["lr_multiplier"]))(min(iteration / saved_max_iter, 1.0)),
                          instantiate(cfg.lr_multiplier)(min(iteration / cfg.train.max_iter, 1.0)), changes)

    moved_schedule_warning(output_dir, factors, max_iter_setting="train.max_iter", schedule="the lr_multiplier schedule",
                           rate_setting="optimizer.lr", keep="train.max_iter={}",
                           alternative="give lr_multiplier steps in absolute iterations of the new length")


class LazyRun(RunConfig):
    """A LazyConfig (:func:`gwdet.model_zoo.lazy_loading.load_lazy_config`) in the run of
    :mod:`gwdet.engine.run`, trained by :class:`LazyTrainer`."""

    output_setting = OUTPUT_SETTING
    weights_setting = WEIGHTS_SETTING
    weights_example = f"{WEIGHTS_SETTING}=path/to/model_final.pth"
    input_format_setting = "model.input_format"
    input_settings = ("model.input_format, model.pixel_mean, model.pixel_std, the ResNet's stride_in_1x1, "
                      "model.proposal_generator.anchor_generator.sizes, aspect_ratios and offset, "
                      "model.backbone.fuse_type, the box2box_transform weights of model.proposal_generator and "
                      "model.roi_heads.box_predictor, the poolers of model.roi_heads (box_pooler, mask_pooler) and "
                      "model.roi_heads.in_features")
    vis_setting = "train.vis_images"
    test_setting = "dataloader.test.dataset.names"
    cfg: DictConfig

    @classmethod
    def load(cls, config_file: str, opts: Sequence[str] = (), *, tool: bool = False) -> "LazyRun":
        """The LazyConfig with its ``key=value`` overrides; ``tool``: its test loader reading in this
        process (``num_workers=0``), as the export and analyze tools read a few images only."""
        cfg = load_lazy_config(config_file, list(opts), model=True)
        check_norm_nodes(cfg)
        check_call_arguments(cfg)
        if tool and isinstance(select(cfg, "dataloader.test"), DictConfig) and "num_workers" in cfg.dataloader.test:
            cfg.dataloader.test.num_workers = 0
        return cls(cfg)

    @property
    def output_dir(self) -> str:
        return self.cfg.train.output_dir

    @property
    def weights(self) -> str:
        return self.cfg.train.init_checkpoint

    @property
    def vis_images(self) -> int:
        return int(self.cfg.train.get("vis_images", 0))

    @property
    def score_threshold_setting(self) -> str:
        model = self.cfg.model
        if "test_score_thresh" in model:  # detectron2's RetinaNet node
            return "model.test_score_thresh"
        return "model.roi_heads.box_predictor.test_score_thresh"

    @property
    def test_settings(self) -> dict[str, Any]:
        """The values the results are evaluated with: the test images' resizing, the model's test-time
        arguments (those the config leaves out with the defaults of their classes) and the evaluator's
        detections per image where the config gives them."""
        flat = flatten_config(saved_tree(self.cfg))
        flat = {**flat, **{key: value for key, value in target_defaults(flat).items() if key not in flat}}
        settings = {key: value for key, value in flat.items()
                    if key == TEST_AUGMENTATIONS or key.startswith("model.")
                    and (key.rsplit(".", 1)[-1].startswith("test_") or key.endswith("_nms_topk")
                         or key == "model.proposal_generator.nms_thresh"
                         or key.rsplit(".", 1)[-1] in TEST_TIME_SETTINGS)}
        if EVALUATOR_DETECTIONS in flat:  # COCO's AP over that many detections per image (detectron2: 100)
            settings[EVALUATOR_DETECTIONS] = flat[EVALUATOR_DETECTIONS]
        return settings

    def with_target(self, weights: str, output_dir: str) -> "LazyRun":
        self.cfg.train.init_checkpoint, self.cfg.train.output_dir = weights, output_dir
        return self

    def check_request(self, eval_only: bool, world_size: int) -> None:
        if eval_only:
            check_keys(self.cfg, EVALUATION_KEYS, "evaluation (--eval-only)")
        else:
            check_keys(self.cfg, TRAINING_KEYS, "training")
            check_training_values(self.cfg, world_size)
        check_run_values(self.cfg)
        check_loader_values(self.cfg, training=not eval_only)
        if not eval_only:  # after the shapes dataset's checks: its image size may be the resize's
            check_resize_nodes(self.cfg, "dataloader.train")

    def check_plain_model(self, task: str) -> None:
        pass  # a LazyConfig's test-time augmentation is a model of the user's own, which the config builds

    def check_resume(self, weights_named: bool) -> None:
        check_resume_config(self.cfg, self.output_dir, weights_named)
        warn_of_a_moved_schedule(self.cfg, self.output_dir)

    def request_content(self) -> str:
        tree = OmegaConf.to_container(self.cfg)
        assert isinstance(tree, dict)
        if isinstance(tree.get("train"), dict) and isinstance(tree["train"].get("init_checkpoint"), str):
            tree["train"]["init_checkpoint"] = absolute_weights_path(tree["train"]["init_checkpoint"],
                                                                     self.weights_setting)
        return json.dumps(tree, sort_keys=True, default=repr)

    def register_datasets(self, coco: Sequence[CocoDataset], *, trains: bool, evaluates: bool,
                          reads_tests: bool = True) -> None:
        register_coco_datasets(coco)  # checked against the config by prepare_datasets
        register_coco_datasets([d for d in environment_datasets() if registered_coco_dataset(d.name) is None])

    def config_record(self) -> Mapping:
        return saved_tree(self.cfg)

    def prepare_datasets(self, *, trains: bool, evaluates: bool) -> None:
        """:func:`check_datasets`, then every dataset the request reads is registered and its files
        are there (:func:`gwdet.data.datasets.check_dataset_files`; its dataset nodes,
        ``gwdet.data.shapes_dataset``, ..., register their datasets when built), as for a yacs config."""
        check_datasets(self.cfg, trains=trains, evaluates=evaluates)
        check_dataset_files(dataset_names(self.cfg, trains))
        if trains:
            warn_of_test_sets_trained_on(dataset_use(self.cfg, evaluates=evaluates))

    def build_model(self) -> torch.nn.Module:
        return _build_checked_model(self.cfg)

    def model_differences_from(self, path: str) -> list[str]:
        saved = read_saved_config(path)
        if not isinstance(saved, dict) or not isinstance(saved.get("model"), dict):  # a yacs run's: not comparable
            raise GwdetValueError(f"{path} is not a LazyConfig run's config.yaml, so its model cannot be compared "
                                  "with this LazyConfig's")
        return model_differences(saved, saved_tree(self.cfg))

    def build_trainer(self) -> LazyTrainer:
        return LazyTrainer(self.cfg)

    def verify_results(self, results: Mapping) -> None:
        """Nothing: a LazyConfig names no expected results (detectron2's lazyconfig_train_net.py checks none)."""

    def evaluate(self, model: torch.nn.Module) -> Mapping:
        return evaluate(self.cfg, model)

    def test_datasets(self) -> list[str]:
        return [name for name in [evaluated_dataset(self.cfg)] if name]

    def run_datasets(self, trains: bool = True) -> list[str]:
        return dataset_names(self.cfg, trains)

    def describe_test_set(self) -> str:
        name = evaluated_dataset(self.cfg)
        return f"{name} (dataloader.test)" if name else "dataloader.test"

    def test_loader(self) -> Any:
        check_keys(self.cfg, ("dataloader.test",), "reading test images")
        return FiniteImageBatches(instantiate(self.cfg.dataloader.test))

    def evaluator_folders(self) -> list[str]:
        folder = select(self.cfg, "dataloader.evaluator.output_dir")
        return [folder] if isinstance(folder, str) and folder else []

    def evaluator(self, output_folder: str) -> Any:
        check_keys(self.cfg, ("dataloader.evaluator",), "evaluation")
        node = copy.deepcopy(self.cfg.dataloader.evaluator)
        if "output_dir" in argument_names(callable_of(node))[0]:  # detectron2's COCOEvaluator writes its files there
            node.output_dir = output_folder
        return instantiate(node)
