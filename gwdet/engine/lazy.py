"""LazyConfig (``.py``) configs in gwdet's tools: loading them with checked ``key=value``
overrides, and training and evaluating them as :mod:`gwdet.engine.trainer` does yacs configs.

``tools/train_net.py --config-file X.py key=value ...`` reaches :func:`main` through
:func:`gwdet.engine.trainer.main`. A run follows the yacs path's rules, with the LazyConfig's settings in
place of the yacs keys (``train.output_dir`` for ``OUTPUT_DIR``, ``train.init_checkpoint`` for
``MODEL.WEIGHTS``, ``train.seed`` for ``SEED``, ``train.device`` for ``MODEL.DEVICE``):

* the run folder (:mod:`gwdet.engine.output_dir`): a fresh run refuses a folder that holds another run
  unless ``--overwrite``; ``--resume`` continues the run there and refuses another model (any
  difference under ``model`` from the run's ``config.yaml``); ``--eval-only`` needs weights
  (``train.init_checkpoint=...`` or ``--resume``) and writes beside a run, never over it; one run
  at a time per folder;
* :class:`~gwdet.checkpoint.resilient.ResilientCheckpointer` (atomic saves, checksums, random
  states, safe loading), a checkpoint on SIGTERM / SIGINT / SIGUSR2
  (:class:`~gwdet.checkpoint.signal_hook.CheckpointOnSignal`), and a train loader that continues
  its sample stream on resume (``dataloader.train`` built by detectron2's
  ``build_detection_train_loader``, seeded by ``train.seed``), its batches checked for non-finite
  pixels;
* the model checked by :func:`gwdet.check_model`, the optimizer's norm weight decay by
  :func:`gwdet.modeling.model_checks.check_norm_weight_decay`;
* ``results.md`` and ``results.json`` in the run folder, as :func:`gwdet.engine.trainer.write_results`
  writes them, after evaluation with ``dataloader.test`` and ``dataloader.evaluator``.

The LazyConfig is the layout of detectron2's ``tools/lazyconfig_train_net.py`` (``model``,
``dataloader.{train,test,evaluator}``, ``optimizer``, ``lr_multiplier``, ``train`` as in
detectron2's ``common/train.py``), so the same file runs there too. An override's key must exist in
the config, or name an argument of the callable of the ``L(...)`` node it is set on; ``+key=value``
adds a key on purpose. A misspelt key is an error naming the close ones, never a new key.
"""
from __future__ import annotations

import argparse
import contextlib
import difflib
import inspect
import logging
import os
import sys
import tempfile
import weakref
from collections import OrderedDict
from typing import Any, Iterable, Iterator, Sequence

import numpy as np
import torch
from omegaconf import DictConfig, ListConfig, OmegaConf

from detectron2.config import LazyConfig, instantiate
from detectron2.data import build_detection_train_loader
from detectron2.data.samplers import TrainingSampler
from detectron2.engine import AMPTrainer, SimpleTrainer, TrainerBase, default_setup, hooks
from detectron2.evaluation import inference_on_dataset, print_csv_format
from detectron2.solver import LRMultiplier
from detectron2.utils import comm
from detectron2.utils.logger import setup_logger
from detectron2.utils.registry import locate

from gwdet.errors import GwdetFileNotFoundError, GwdetValueError
from gwdet.checkpoint.resilient import RandomState, ResilientCheckpointer
from gwdet.data.boxes import check_dataset_boxes
from gwdet.data.finite_images import FiniteImageBatches
from gwdet.data.resumable import SkippingSampler, loader_accepts_seed, seed_loader_generator
from gwdet.utils.cli_errors import tool_name
from gwdet.engine.trainer import (
    VIS_FOLDER,
    InnerTrainerState,
    check_output_request,
    evaluation_target,
    log_outputs,
    run_writers,
    training_ddp_model,
    with_signal_checkpoints,
    write_results_to,
)
from gwdet.engine.run_log import HeldRecords
from gwdet.engine.visualize import save_prediction_pngs
from gwdet.layers.plans import describe_plans
from gwdet.modeling import check_model
from gwdet.modeling.model_checks import check_norm_weight_decay
from gwdet.engine.output_dir import (
    CONFIG_NAME,
    OutputDirLock,
    check_config_checksum,
    check_resume_trains,
    checkpoints_in,
    damaged_config,
    differing_values,
    record_config_checksum,
    trim_metrics,
)

LAZY_SUFFIX = ".py"
OUTPUT_SETTING = "train.output_dir"
WEIGHTS_SETTING = "train.init_checkpoint"
# What training needs besides dataloader.test / dataloader.evaluator (without them: no evaluation),
# as detectron2's common/train.py and tools/lazyconfig_train_net.py lay it out.
TRAINING_KEYS = (
    "model", "dataloader.train", "optimizer", "lr_multiplier", "train.output_dir", "train.init_checkpoint",
    "train.max_iter", "train.device", "train.amp.enabled", "train.ddp", "train.checkpointer", "train.eval_period",
    "train.log_period",
)
EVALUATION_KEYS = ("model", "dataloader.test", "dataloader.evaluator", "train.output_dir", "train.init_checkpoint",
                   "train.device")

logger = logging.getLogger(__name__)
_ABSENT = object()


def is_lazy_config(config_file: str | os.PathLike | None) -> bool:
    """Whether ``config_file`` names a LazyConfig (a ``.py`` file) rather than a yacs config."""
    return bool(config_file) and str(config_file).endswith(LAZY_SUFFIX)


# ---- loading ---------------------------------------------------------------------------------


def _callable_of(node: Any) -> Any:
    """The callable an ``L(...)`` node calls (its ``_target_``, imported when it is a name), or None."""
    if not isinstance(node, DictConfig) or "_target_" not in node:
        return None
    target = node._target_
    if isinstance(target, str):
        try:
            target = locate(target)
        except Exception:  # a name that does not import: instantiate will say so
            return None
    return target if callable(target) else None


def _argument_names(target: Any) -> tuple[set[str], bool]:
    """The keyword arguments ``target`` takes, and whether it takes any (``**kwargs``)."""
    try:
        parameters = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):  # no signature to read: accept, as instantiate would try
        return set(), True
    names = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return names, any(p.kind is p.VAR_KEYWORD for p in parameters)


def _select(cfg: DictConfig, key: str) -> Any:
    return OmegaConf.select(cfg, key, default=_ABSENT, throw_on_resolution_failure=False)


def _reference_above(cfg: DictConfig, parts: Sequence[str]) -> tuple[str, str] | None:
    """The first level above the key ``parts`` that is a reference to another node
    (``"${...stem.norm}"``), and the reference; None when there is none."""
    container: Any = cfg
    for depth in range(1, len(parts)):
        name: str | int = parts[depth - 1]
        if isinstance(container, ListConfig) and str(name).isdigit():
            name = int(name)
        if not isinstance(container, (DictConfig, ListConfig)):
            return None
        try:
            if OmegaConf.is_interpolation(container, name):
                raw: Any = OmegaConf.to_container(container, resolve=False)
                return ".".join(parts[:depth]), str(raw[name])
        except (KeyError, IndexError, ValueError, TypeError):
            return None
        container = _select(cfg, ".".join(parts[:depth]))
    return None


def check_override_key(cfg: DictConfig, key: str) -> None:
    """Raise ``ValueError`` unless ``key`` (dotted) is in ``cfg`` or names an argument of the
    callable of the ``L(...)`` node it would be set on, and is not below a reference to a shared
    node (which the override would replace); the message names the close keys or the fix."""
    parts = key.split(".")
    reference = _reference_above(cfg, parts)
    if reference is not None:
        level, target = reference
        raise GwdetValueError(
            f"LazyConfig override {key!r}: {level!r} is {target}, a reference to a node other settings share, "
            f"and setting a value under it would replace the reference. Set the value where it points, or give "
            f"{level} a node of its own ({level}={{_target_: ..., ...}}).")
    if _select(cfg, key) is not _ABSENT:
        return
    depth = len(parts) - 1  # the deepest level of the key that the config has
    while depth > 0 and _select(cfg, ".".join(parts[:depth])) is _ABSENT:
        depth -= 1
    parent_key, name = ".".join(parts[:depth]), parts[depth]
    parent = _select(cfg, parent_key) if parent_key else cfg
    target = _callable_of(parent)
    arguments, any_keyword = _argument_names(target) if target is not None else (set(), False)
    if depth == len(parts) - 1 and (name in arguments or any_keyword):
        return  # an argument the node's callable takes, left at its default by the config
    present = {str(k) for k in parent.keys()} if isinstance(parent, DictConfig) else set()
    close = difflib.get_close_matches(name, sorted(present | arguments), n=3, cutoff=0.6)
    where = f"under {parent_key!r}" if parent_key else "at the top of the config"
    hint = f" Did you mean {' or '.join(repr('.'.join([*parts[:depth], c])) for c in close)}?" if close else ""
    takes = f" ({getattr(target, '__qualname__', target)} takes {', '.join(sorted(arguments))})" if arguments else ""
    raise GwdetValueError(f"LazyConfig override {key!r}: the config has no {name!r} {where}{takes}.{hint} "
                          f"Write +{key}=... to add a new key on purpose.")


def apply_overrides(cfg: DictConfig, overrides: Iterable[str]) -> DictConfig:
    """detectron2's ``LazyConfig.apply_overrides`` after every key is checked
    (:func:`check_override_key`; ``+key=value`` adds a key without the check)."""
    overrides = list(overrides)
    for override in overrides:
        key, equals, _ = override.partition("=")
        if not equals or not key.strip():
            raise GwdetValueError(
                f"LazyConfig override {override!r} is not key=value. A LazyConfig takes dotted keys with '=', "
                "e.g. train.max_iter=100 train.output_dir=output/run (KEY VALUE pairs are for yacs configs).")
        if key.startswith("~"):
            raise GwdetValueError(f"LazyConfig override {override!r}: deleting a key is not supported.")
        if not key.startswith("+"):
            check_override_key(cfg, key.strip())
    return LazyConfig.apply_overrides(cfg, [o[1:] if o.startswith("+") else o for o in overrides])


def load_lazy_config(config_file: str, overrides: Sequence[str] = ()) -> DictConfig:
    """The LazyConfig ``config_file`` with the ``key=value`` ``overrides`` applied (checked by
    :func:`apply_overrides`); a ``~`` in ``train.output_dir`` is expanded."""
    if not config_file:
        raise GwdetValueError("No config given: pass --config-file configs/<file>.py (see configs/LazyConfig/).")
    if not os.path.isfile(config_file):
        raise GwdetFileNotFoundError(f"Config file {config_file!r} does not exist (run from the repository root?).")
    cfg = apply_overrides(LazyConfig.load(config_file), overrides or ())
    output_dir = _select(cfg, OUTPUT_SETTING)
    if isinstance(output_dir, str) and output_dir.startswith("~"):
        cfg.train.output_dir = os.path.expanduser(output_dir)
    return cfg


def check_keys(cfg: DictConfig, keys: Sequence[str], purpose: str) -> None:
    """Raise ``ValueError`` naming every one of ``keys`` the config lacks for ``purpose``."""
    missing = [key for key in keys if _select(cfg, key) is _ABSENT]
    if missing:
        raise GwdetValueError(
            f"This LazyConfig cannot be used for {purpose}: it has no {', '.join(missing)}. A LazyConfig for "
            "gwdet's tools (and detectron2's tools/lazyconfig_train_net.py) defines model, dataloader.train, "
            "dataloader.test, dataloader.evaluator, optimizer, lr_multiplier and train (detectron2's "
            "common/train.py: train = get_config('common/train.py').train); see configs/LazyConfig/.")


# ---- building ----------------------------------------------------------------------------------


def check_device(device: str) -> None:
    """A ``train.device`` that cannot be used here is an error naming the fix."""
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise GwdetValueError(
            f"train.device is {device!r}, but this machine has no usable GPU: run with train.device=cpu.")


def build_model(cfg: DictConfig) -> torch.nn.Module:
    """``instantiate(cfg.model)``, checked by :func:`gwdet.check_model`, on ``train.device``."""
    check_device(cfg.train.device)
    model = check_model(instantiate(cfg.model))
    logging.getLogger("detectron2").info(f"Model:\n{model}")
    return model.to(cfg.train.device)


def build_optimizer(cfg: DictConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    """``cfg.optimizer`` for ``model`` (given as ``optimizer.params.model``, as detectron2's tool
    does, and taken out again), its norm weight decay checked against ``params.weight_decay_norm``."""
    params = cfg.optimizer.params
    previous = params.get("model", _ABSENT)
    params.model = model
    try:
        optimizer = instantiate(cfg.optimizer)
    finally:
        if previous is _ABSENT:
            params.pop("model")
        else:
            params.model = previous
    if params.get("weight_decay_norm") is not None:
        check_norm_weight_decay(model, optimizer, params.weight_decay_norm, params.get("weight_decay_bias"))
    return optimizer


def _instantiate_dataset(node: Any) -> Any:
    """``dataloader.train.dataset``, its boxes checked (:func:`gwdet.data.boxes.check_dataset_boxes`)
    when it is a list of detectron2 dataset dicts."""
    try:
        dataset = instantiate(node)
        if isinstance(dataset, list):
            check_dataset_boxes(dataset, "dataloader.train.dataset")
        return dataset
    except AssertionError as err:
        if "No valid data" not in str(err):
            raise
        raise GwdetValueError(
            "None of the images of dataloader.train.dataset has an annotation to train on: check that the "
            "json's 'annotations' list is there and refers to its 'images' ids (or set "
            "dataloader.train.dataset.filter_empty=False to train on empty images).") from err


def build_train_loader(cfg: DictConfig) -> tuple[Any, SkippingSampler | None]:
    """``dataloader.train`` and the sampler :meth:`LazyTrainer.resume_or_load` positions.

    A node that calls detectron2's ``build_detection_train_loader`` is built with a
    :class:`~gwdet.data.resumable.SkippingSampler` around its sampler (default: ``TrainingSampler``
    seeded with ``train.seed`` when it is >= 0) and, with a seed, its own seeded generator, as
    :func:`gwdet.data.resumable.build_resumable_train_loader` builds yacs loaders. Any other loader
    is instantiated as it is, and restarts its sample stream on resume (with a warning then).
    """
    node = cfg.dataloader.train
    if _callable_of(node) is not build_detection_train_loader:
        return instantiate(node), None
    arguments = {str(key): instantiate(node[key]) for key in node if key not in ("_target_", "dataset")}
    dataset = arguments["dataset"] = _instantiate_dataset(node.dataset)
    if isinstance(dataset, torch.utils.data.IterableDataset):
        return build_detection_train_loader(**arguments), None
    seed = int(cfg.train.get("seed", -1))
    if arguments.get("sampler") is None:
        numpy_state = np.random.get_state()  # an unseeded TrainingSampler draws its seed from numpy
        arguments["sampler"] = TrainingSampler(len(dataset), seed=seed if seed >= 0 else None)
        np.random.set_state(numpy_state)
    sampler = arguments["sampler"] = SkippingSampler(arguments["sampler"])
    if seed < 0:
        return build_detection_train_loader(**arguments), sampler
    rank_seed = seed + comm.get_rank()  # as detectron2's default_setup offsets it
    if loader_accepts_seed():
        return build_detection_train_loader(**arguments, seed=rank_seed), sampler
    loader = build_detection_train_loader(**arguments)
    seed_loader_generator(loader, rank_seed)
    return loader, sampler


def evaluated_dataset(cfg: DictConfig) -> str:
    """The name of the dataset ``dataloader.evaluator`` evaluates (its ``dataset_name``, an
    ``L(...)`` node such as ``gwdet.data.shapes_dataset`` instantiated), or ``""``."""
    name = _select(cfg, "dataloader.evaluator.dataset_name")
    if isinstance(name, DictConfig):
        name = instantiate(name)
    return name if isinstance(name, str) else ""


def evaluate(cfg: DictConfig, model: torch.nn.Module) -> "OrderedDict[str, Any]":
    """``model`` evaluated by ``dataloader.evaluator`` on ``dataloader.test`` (as detectron2's
    ``lazyconfig_train_net.py`` does): ``{dataset: {task: {metric: value}}}``; empty without them."""
    if _select(cfg, "dataloader.test") is _ABSENT or _select(cfg, "dataloader.evaluator") is _ABSENT:
        logger.info("The config has no dataloader.test / dataloader.evaluator: nothing is evaluated.")
        return OrderedDict()
    loader = instantiate(cfg.dataloader.test)
    results = inference_on_dataset(model, loader, instantiate(cfg.dataloader.evaluator))
    if comm.is_main_process() and results:
        print_csv_format(results)
    name = evaluated_dataset(cfg)
    return OrderedDict([(name, results)]) if name and results else OrderedDict(results or {})


def _check_weights_file(path: str) -> None:
    if path and "://" not in path and not os.path.isfile(path):
        raise GwdetFileNotFoundError(
            f"train.init_checkpoint file {path!r} does not exist. Convert ImageNet weights with "
            "tools/convert_pretrained.py IN OUT (see docs/weights.md), or set train.init_checkpoint=\"\" to train "
            "from scratch.")


def load_weights(cfg: DictConfig, model: torch.nn.Module) -> torch.nn.Module:
    """``train.init_checkpoint`` loaded into ``model`` as ``--eval-only`` loads it (every weight
    required; see :class:`ResilientCheckpointer`); nothing for an empty setting."""
    path = cfg.train.init_checkpoint
    _check_weights_file(path)
    ResilientCheckpointer(model, save_dir=cfg.train.output_dir, require_every_weight=True,
                          weights_setting="train.init_checkpoint").load_weights(path)
    return model


def build_trained_model(cfg: DictConfig) -> torch.nn.Module:
    """The config's model with ``train.init_checkpoint`` loaded as ``--eval-only`` loads it, in
    evaluation mode (for the export and analyze tools; a warning when there are no weights)."""
    model = build_model(cfg)
    if cfg.train.init_checkpoint:
        load_weights(cfg, model)
    else:
        logger.warning("train.init_checkpoint is empty: the model is randomly initialized.")
    return model.eval()


def without_loader_workers(cfg: DictConfig) -> DictConfig:
    """``cfg`` with its test loader reading in the calling process (``num_workers=0``), as gwdet's
    export and analyze tools read a few images only."""
    if isinstance(_select(cfg, "dataloader.test"), DictConfig) and "num_workers" in cfg.dataloader.test:
        cfg.dataloader.test.num_workers = 0
    return cfg


def build_test_loader(cfg: DictConfig) -> Any:
    """``dataloader.test`` instantiated."""
    check_keys(cfg, ("dataloader.test",), "reading test images")
    return instantiate(cfg.dataloader.test)


def iter_test_batches(cfg: DictConfig) -> Iterator[list]:
    """The batches of ``dataloader.test`` (the model's inputs, in detectron2's format)."""
    return iter(build_test_loader(cfg))


def describe_test_set(cfg: DictConfig) -> str:
    """How the tools name the test set: the evaluated dataset, e.g. ``"shapes_val (dataloader.test)"``."""
    name = evaluated_dataset(cfg)
    return f"{name} (dataloader.test)" if name else "dataloader.test"


def build_evaluator(cfg: DictConfig) -> Any:
    """``dataloader.evaluator`` instantiated."""
    check_keys(cfg, ("dataloader.evaluator",), "evaluation")
    return instantiate(cfg.dataloader.evaluator)


class LazyTrainer(InnerTrainerState, TrainerBase):
    """gwdet's :class:`~gwdet.engine.trainer.Trainer` for a LazyConfig: detectron2's trainer loop and
    hooks as ``tools/lazyconfig_train_net.py`` sets them up (timer, LR scheduler, periodic
    checkpointer, evaluation, writers) plus :class:`CheckpointOnSignal`, with
    :class:`ResilientCheckpointer`, a resumable train loader whose batches are checked for
    non-finite pixels, and the final results returned by :meth:`train`."""

    def __init__(self, cfg: DictConfig) -> None:
        super().__init__()
        if not logging.getLogger("detectron2").isEnabledFor(logging.INFO):
            setup_logger()
        model = build_model(cfg)
        optimizer = build_optimizer(cfg, model)
        loader, self._sampler = build_train_loader(cfg)
        self._images_per_rank = int(cfg.dataloader.train.get("total_batch_size", 0)) // comm.get_world_size()
        model = training_ddp_model(model, **cfg.train.ddp)
        trainer_class = AMPTrainer if cfg.train.amp.enabled else SimpleTrainer
        self._trainer = trainer_class(model, FiniteImageBatches(loader), optimizer)
        self.scheduler = LRMultiplier(optimizer, multiplier=instantiate(cfg.lr_multiplier), max_iter=cfg.train.max_iter)
        self.checkpointer = ResilientCheckpointer(
            model, cfg.train.output_dir, random_state=RandomState(), trainer=weakref.proxy(self),
            weights_setting="train.init_checkpoint",
        )
        self.start_iter = 0
        self.max_iter = cfg.train.max_iter
        self.cfg = cfg
        self.register_hooks(self.build_hooks())

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
            self._last_eval_results = evaluate(cfg, self.model)
            return self._last_eval_results

        main = comm.is_main_process()
        hook_list = [
            hooks.IterationTimer(),
            hooks.LRScheduler(),
            hooks.PeriodicCheckpointer(self.checkpointer, **cfg.train.checkpointer) if main else None,
            hooks.EvalHook(cfg.train.eval_period, test_and_save_results),
            hooks.PeriodicWriter(run_writers(cfg.train.output_dir, self.max_iter), period=cfg.train.log_period)
            if main else None,
        ]
        return with_signal_checkpoints([hook for hook in hook_list if hook is not None])

    def resume_or_load(self, resume: bool = True) -> None:
        """``--resume``: continue from the newest readable checkpoint of ``train.output_dir`` (its
        iteration, optimizer, scheduler, random and data states); else load
        ``train.init_checkpoint`` and start at iteration 0."""
        if not resume:
            _check_weights_file(self.cfg.train.init_checkpoint)
        self.checkpointer.resume_or_load(self.cfg.train.init_checkpoint, resume=resume)
        if resume and self.checkpointer.has_checkpoint():
            self.start_iter = self.iter + 1
        if self.start_iter == 0:
            return
        if comm.is_main_process():
            trim_metrics(self.cfg.train.output_dir, self.start_iter)
        if self._sampler is not None:
            self._sampler.skip = self.start_iter * self._images_per_rank
        else:
            logger.warning("dataloader.train is not built by detectron2's build_detection_train_loader: it restarts "
                           "its sample stream on resume instead of continuing where the interrupted run stopped.")

    def run_step(self) -> None:
        self._trainer.iter = self.iter
        self._trainer.run_step()

    def train(self):
        """Train from :attr:`start_iter` to ``train.max_iter``; return the last evaluation's results."""
        super().train(self.start_iter, self.max_iter)
        return getattr(self, "_last_eval_results", None)


# ---- the run: checks, set-up, main ---------------------------------------------------------------


def saved_tree(cfg: DictConfig) -> dict:
    """``cfg`` as a ``config.yaml`` written by detectron2's ``default_setup`` holds it
    (``LazyConfig.save``, then loaded back), interpolations resolved."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, CONFIG_NAME)
        LazyConfig.save(cfg, path)
        tree = OmegaConf.to_container(LazyConfig.load(path), resolve=True)
    if not isinstance(tree, dict):
        raise TypeError(f"A LazyConfig is a mapping of keys, not {type(tree).__name__}.")
    return tree


def check_resume_config(cfg: DictConfig, output_dir: str) -> None:
    """Raise ``ValueError`` when ``--resume`` would continue a run of another model: any
    difference under ``model`` from the run's ``config.yaml`` stops the run before anything is
    loaded; other differences (a longer schedule, another device) are logged. A resume that would
    train nothing (``train.max_iter`` below the checkpoint's iteration) is refused too
    (:func:`gwdet.engine.output_dir.check_resume_trains`)."""
    path = os.path.join(output_dir, CONFIG_NAME)
    if not os.path.isfile(path) or not checkpoints_in(output_dir):  # nothing to resume: a fresh start
        return
    check_config_checksum(path, output_dir, OUTPUT_SETTING)
    try:
        saved = LazyConfig.load(path)
        saved = OmegaConf.to_container(saved, resolve=True) if isinstance(saved, DictConfig) else None
    except Exception as error:  # yaml's and omegaconf's errors, bytes that are not text
        raise damaged_config(path, output_dir, error, OUTPUT_SETTING) from None
    if not isinstance(saved, dict) or not isinstance(saved.get("model"), dict):
        raise GwdetValueError(
            f"--resume: the run in {output_dir!r} was not trained from a LazyConfig ({path} has no model), so "
            "this config cannot continue it. Resume it with the config it was trained with, or train into "
            "another train.output_dir.")
    current = saved_tree(cfg)
    model = [f"model.{key}: {old!r} -> {new!r}" for key, old, new in differing_values(saved["model"], current["model"])]
    if model:
        raise GwdetValueError(
            f"--resume: the run in {output_dir!r} was trained with another model ({CONFIG_NAME} there): "
            f"{'; '.join(model[:5])}{'; ...' if len(model) > 5 else ''}. Resume with the same config and "
            "overrides, or train the new model into another train.output_dir."
        )
    others = {key: value for key, value in saved.items() if key != "model"}
    differences = differing_values(others, {key: value for key, value in current.items() if key != "model"})
    if differences:
        logger.warning(f"--resume with config values that differ from {path}: "
                       + "; ".join(f"{key}: {old!r} -> {new!r}" for key, old, new in differences))
    check_resume_trains(output_dir, cfg.train.max_iter, "train.max_iter")


def check_run_request(cfg: DictConfig, args: argparse.Namespace) -> None:
    """:func:`gwdet.engine.trainer.check_output_request` for a LazyConfig's ``train.output_dir`` and
    ``train.init_checkpoint``."""
    output_dir = cfg.train.output_dir
    check_output_request(args, output_dir, cfg.train.init_checkpoint,
                         check_resume=lambda: check_resume_config(cfg, output_dir),
                         weights_setting=f"{WEIGHTS_SETTING}=path/to/model_final.pth", output_setting=OUTPUT_SETTING)


def evaluation_request(cfg: DictConfig, args: argparse.Namespace) -> tuple[DictConfig, argparse.Namespace]:
    """``--eval-only``: the config and arguments that evaluate exactly the chosen weights
    (``train.init_checkpoint``, or with ``--resume`` the checkpoint ``last_checkpoint`` names) into
    a folder of their own when ``train.output_dir`` holds a run (:func:`gwdet.engine.trainer.evaluation_target`)."""
    check_run_request(cfg, args)
    weights, output_dir = evaluation_target(args, cfg.train.output_dir, cfg.train.init_checkpoint, OUTPUT_SETTING)
    cfg.train.init_checkpoint, cfg.train.output_dir = weights, output_dir
    return cfg, argparse.Namespace(**{**vars(args), "resume": False})


def register_command_line_datasets(args: argparse.Namespace) -> None:
    """The ``--register-coco`` datasets and those of ``$GWDET_REGISTER_COCO`` (not registered yet),
    for a LazyConfig's nodes to name; a dataset that fails its checks stops the tool as the yacs
    path does (one line, exit status 2)."""
    from gwdet.data.coco_registration import (
        DatasetError,
        environment_datasets,
        register_coco_datasets,
        registered_coco_dataset,
    )

    try:
        register_coco_datasets(getattr(args, "register_coco", None) or ())
        register_coco_datasets([d for d in environment_datasets() if registered_coco_dataset(d.name) is None])
    except DatasetError as error:
        print(f"{tool_name()}: error: {error}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


def setup(args: argparse.Namespace, cfg: DictConfig) -> DictConfig:
    """The command line's datasets registered, the run request checked, detectron2's logging and
    output set-up (``config.yaml``, seeding with ``train.seed``), gwdet's messages in ``log.txt``
    (also those of the checks, held until it exists: :class:`~gwdet.engine.run_log.HeldRecords`)."""
    with HeldRecords():
        register_command_line_datasets(args)
        if comm.is_main_process():
            check_run_request(cfg, args)
        default_setup(cfg, args)
        if comm.is_main_process():
            record_config_checksum(cfg.train.output_dir)  # what --resume checks config.yaml against
        setup_logger(cfg.train.output_dir, distributed_rank=comm.get_rank(), name="gwdet")
    logger.info(describe_plans())
    return cfg


def dataset_names(cfg: DictConfig) -> list[str]:
    """The datasets the LazyConfig trains and evaluates on: the ``names`` of ``dataloader.train.dataset``
    and ``dataloader.test.dataset`` (``L(...)`` nodes such as ``gwdet.data.shapes_dataset``
    instantiated) and the evaluator's dataset; a loader built otherwise names none."""
    names: list[str] = []
    for key in ("dataloader.train.dataset.names", "dataloader.test.dataset.names"):
        value = _select(cfg, key)
        if isinstance(value, DictConfig):
            value = instantiate(value)
        if isinstance(value, str):
            names.append(value)
        elif isinstance(value, (list, tuple, ListConfig)):
            names += [name for name in value if isinstance(name, str)]
    return [name for name in dict.fromkeys([*names, evaluated_dataset(cfg)]) if name]


def main(args: argparse.Namespace):
    """Train (or evaluate with ``--eval-only``) the LazyConfig ``args.config_file`` with the
    ``key=value`` overrides ``args.opts``; write ``results.md`` / ``results.json`` to
    ``train.output_dir``; return the results. The main process holds a lock on the folder."""
    cfg = load_lazy_config(args.config_file, args.opts)
    if args.eval_only:
        check_keys(cfg, EVALUATION_KEYS, "evaluation (--eval-only)")
        cfg, args = evaluation_request(cfg, args)
    else:
        check_keys(cfg, TRAINING_KEYS, "training")
    output_dir = cfg.train.output_dir
    with OutputDirLock(output_dir) if comm.is_main_process() else contextlib.nullcontext():
        setup(args, cfg)
        if args.eval_only:
            model = load_weights(cfg, build_model(cfg))
            results = evaluate(cfg, model)
        else:
            trainer = LazyTrainer(cfg)
            trainer.resume_or_load(resume=args.resume)
            results = trainer.train()
            model = trainer.model
        evaluated = evaluated_dataset(cfg)
        write_results_to(output_dir, results or {}, [name for name in [evaluated] if name], dataset_names(cfg))
        vis_images = int(cfg.train.get("vis_images", 0))
        drawings: list[str] = []
        if comm.is_main_process() and vis_images > 0 and evaluated:  # no evaluated dataset: nothing to draw
            drawings = save_prediction_pngs(cfg, model, evaluated, vis_images, os.path.join(output_dir, VIS_FOLDER))
    log_outputs(output_dir, bool(results), drawings, "train.vis_images")
    return results
