"""One run of ``tools/train_net.py`` / ``gwdet-train``, for yacs and LazyConfig configs alike.

:func:`main` is the whole run:

1. :func:`load_run_config` reads the config into a :class:`RunConfig` (yacs ``.yaml``:
   :class:`gwdet.engine.trainer.YacsRun`; LazyConfig ``.py``: :class:`gwdet.engine.lazy.LazyRun`),
   which checks that it holds what the request needs (:meth:`RunConfig.check_request`);
2. ``--eval-only``: :func:`evaluation_request` fixes exactly the weights to evaluate and a folder of
   their own when the output folder holds a run (:func:`gwdet.engine.output_dir.evaluation_folder`);
3. the config file must not be the ``config.yaml`` the run writes
   (:func:`gwdet.engine.output_dir.check_config_file_kept`), and the main process holds
   :class:`~gwdet.engine.output_dir.OutputDirLock` on the output folder for the whole run;
4. :func:`setup`: the command line's datasets registered, the request checked against the output
   folder (:func:`check_output_request`, :func:`gwdet.engine.output_dir.check_run_folders`),
   detectron2's ``default_setup`` (``config.yaml``, ``log.txt``, seeding) with the checksum
   ``--resume`` checks ``config.yaml`` against, the earlier ``config.yaml`` and checksum kept until
   both are written (:func:`gwdet.engine.output_dir.config_rewrite`), gwdet's messages in
   ``log.txt``, the datasets ready;
5. training (fresh or ``--resume``) with the config's trainer, or the evaluation of the weights;
6. ``results.md`` and ``results.json`` (with the package versions and dataset checksums), the
   prediction drawings, and a last log line saying where they are.

The rules are those of one run whatever the config's kind; a :class:`RunConfig` only says how its
kind of config names and builds things (``OUTPUT_DIR`` or ``train.output_dir``, ``MODEL.WEIGHTS``
or ``train.init_checkpoint``, detectron2's ``DefaultTrainer`` or the LazyConfig's nodes).
"""
from __future__ import annotations

import argparse
import contextlib
import errno
import hashlib
import json
import logging
import math
import os
import re
import sys
from abc import ABC, abstractmethod
from collections import OrderedDict
from typing import Any, Callable, ClassVar, Iterator, Mapping, Sequence

import torch
import torch.distributed as dist

from detectron2.engine import default_setup
from detectron2.utils import comm
from detectron2.utils.logger import setup_logger

from gwdet.checkpoint.signal_hook import drawing_stops, evaluation_stops
from gwdet.checkpoint.resilient import (CLASSES_KEY, DATA_KEY, EVALUATION_OUTCOME, IMAGES_KEY, INPUT_KEY,
                                        ResilientCheckpointer, absolute_weights_path, input_differences,
                                        local_weights_path, weights_record)
from gwdet.data.coco_registration import CocoDataset, DatasetError, coco_dataset, recorded_images
from gwdet.data.datasets import check_evaluated_classes
from gwdet.modeling.detectron2_failures import named_config_failures
from gwdet.errors import (GwdetError, GwdetFileExistsError, GwdetFileNotFoundError, GwdetOSError, GwdetRuntimeError,
                          GwdetValueError, listed)
from gwdet.layers.common import is_finite_number
from gwdet.layers.plans import describe_plans, fallback_reason
from gwdet.model_zoo.lazy_loading import is_lazy_config
from gwdet.utils.atomic import WriteError, write_text_atomically, write_text_with_checksum
from gwdet.utils.cli_errors import tool_name
from gwdet.engine.output_dir import (OutputDirLock, check_config_file_kept, check_config_not_users,
                                     check_final_weights_not_training, check_not_set_aside,
                                     check_run_folder_is_the_records, check_fresh_start, check_resume_source,
                                     check_config_record_kept,
                                     check_run_file_names, check_run_files_not_shared, check_run_folders,
                                     check_weights_are_the_runs, checkpoints_in, config_differences, config_rewrite,
                                     config_until_started, earlier_run_until_started, evaluation_folder,
                                     recorded_initial_weights, resumed_iteration, tagged_checkpoint)
from gwdet.utils.run_file_names import (CONFIG_NAME, EVALUATOR_FILES, FINAL_WEIGHTS, INFERENCE_FOLDER, RESULTS_JSON, RESULTS_MARKDOWN,
                                   VIS_FOLDER, LOG_NAME)
from gwdet.engine.run_environment import ENVIRONMENT_KEY, annotation_files, run_environment
from gwdet.engine.run_log import HeldRecords, RunWarnings, guard_log_files, unwritten_log_error
from gwdet.engine.training import RunFolderKept, check_torch_state, mark_seeded
from gwdet.engine.visualize import DRAWN_SCORE, drawings_asked, drawings_in, save_prediction_pngs

logger = logging.getLogger(__name__)


class TrainingDiverged(GwdetError, FloatingPointError):
    """A training whose loss or predictions became non-finite after its first iteration, named with
    the fix; a ``FloatingPointError`` as detectron2's trainer raises it."""


# The key of results.json's environment under which a run records the prediction drawings it makes after its results
DRAWINGS_KEY = "drawings"


# the characters of one config difference a warning shows (a LazyConfig's list of ResNet stages is kilobytes)
SHOWN_LENGTH = 300


# The attribute of a run's config holding the requests its checks accepted, {request: content}
# (RunConfig.checked_once): beside the config's keys, copied with it by clone().
_ACCEPTED_REQUESTS = "_gwdet_accepted_requests"


class RunConfig(ABC):
    """A config as a run and gwdet's tools use it: where the run writes, which weights it starts
    from, how its model, trainer, test images and evaluation are built. ``cfg`` is the config itself
    (a yacs ``CfgNode`` or a LazyConfig), as detectron2's functions take it."""

    output_setting: ClassVar[str]  # the setting of the output folder, as messages name it
    weights_setting: ClassVar[str]  # the setting of the initial weights
    weights_example: ClassVar[str]  # that setting given a value, as a message suggests it
    input_settings: ClassVar[str]  # the settings of the values a checkpoint records beside its weights
    input_format_setting: ClassVar[str]  # the setting of the images' channel order

    @property
    @abstractmethod
    def score_threshold_setting(self) -> str:
        """The setting of the score below which the model's detections are dropped at test time."""

    @property
    @abstractmethod
    def test_settings(self) -> dict[str, Any]:
        """The settings that change an evaluation of given weights (the test images' size, the
        detections' thresholds and numbers, the proposals' NMS), by key, as results.md lists them."""
    vis_setting: ClassVar[str]  # the setting of the number of prediction drawings
    test_setting: ClassVar[str]  # the setting that names the test set(s)

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg

    @property
    @abstractmethod
    def output_dir(self) -> str:
        """The run's folder."""

    @property
    @abstractmethod
    def weights(self) -> str:
        """The initial weights (a path or URL; ``""`` for none)."""

    @property
    @abstractmethod
    def vis_images(self) -> int:
        """How many test images the run draws its predictions on."""

    @abstractmethod
    def with_target(self, weights: str, output_dir: str) -> "RunConfig":
        """This config with initial weights ``weights`` and output folder ``output_dir``."""

    def for_processes(self, world_size: int) -> "RunConfig":
        """The config as a run of ``world_size`` processes trains with it (yacs:
        :meth:`gwdet.engine.trainer.YacsRun.for_processes`); this one where nothing is rescaled."""
        return self

    @abstractmethod
    def check_request(self, eval_only: bool, world_size: int) -> None:
        """Refuse, before anything is built, a config that lacks what training (or with
        ``eval_only`` evaluation) by ``world_size`` processes needs."""

    @abstractmethod
    def check_plain_model(self, task: str) -> None:
        """Refuse a config that asks for more than the model it builds where a tool's ``task`` (e.g.
        ``"--tasks flop counts"``) takes the model as built (yacs: test-time augmentation)."""

    @abstractmethod
    def check_resume(self, weights_named: bool) -> None:
        """Refuse a ``--resume`` of a run of another model, one that would train nothing, or one whose
        command line names other initial weights (``weights_named``), which it would not load."""

    @abstractmethod
    def request_content(self) -> str:
        """Every value of the config, as one string, the initial weights as an absolute path (which
        the tools make them once the request is checked: :meth:`with_target`)."""

    def checked_once(self, request: str, check: Callable[[], None], stricter: Sequence[str] = ()) -> None:
        """``check()``, the checks of ``request``, unless this config passed them, or those of a
        ``stricter`` request, with its present content (:meth:`request_content`): the tools check a
        request before they build anything, and the trainer they build finds it done; a trainer built
        from one's own code checks it then."""
        accepted = getattr(self.cfg, _ACCEPTED_REQUESTS, {})
        content = self.request_content()
        if any(accepted.get(name) == content for name in (request, *stricter)):
            return
        check()
        object.__setattr__(self.cfg, _ACCEPTED_REQUESTS, {**accepted, request: content})  # not a config key

    def check_training_request(self, world_size: int) -> None:
        """:meth:`check_request` of a training by ``world_size`` processes, once per content."""
        self.checked_once(f"training by {world_size} process(es)", lambda: self.check_request(False, world_size))

    def check_resume_request(self, weights_named: bool = False) -> None:
        """:meth:`check_resume`, once per content; a pass with ``weights_named`` (which checks the
        weights too) counts for the check without."""
        self.checked_once(f"resume (weights named: {weights_named})", lambda: self.check_resume(weights_named),
                          stricter=() if weights_named else ["resume (weights named: True)"])

    def check_trainer_resume(self) -> None:
        """:meth:`check_resume_request` of a trainer's ``resume_or_load(resume=True)``; where the
        checkpoints have no ``config.yaml`` beside them (a run trained from one's own code without
        detectron2's ``default_setup``, which writes it), a warning that nothing could be compared."""
        if checkpoints_in(self.output_dir) and not os.path.isfile(os.path.join(self.output_dir, CONFIG_NAME)):
            logger.warning(
                f"Resuming the run in {self.output_dir} without checking that its checkpoints were trained with this "
                f"config (model, batch, seed): {CONFIG_NAME}, the run's record of its config, is not there. "
                "detectron2's default_setup(cfg, args) and gwdet's tools write it when a run starts.")
            return
        self.check_resume_request()

    @abstractmethod
    def register_datasets(self, coco: Sequence[CocoDataset], *, trains: bool, evaluates: bool,
                          reads_tests: bool = True) -> None:
        """Register the ``--register-coco`` datasets ``coco`` and those of ``$GWDET_REGISTER_COCO``
        the config may name; :class:`~gwdet.data.coco_registration.DatasetError` for one the request
        cannot use: a training set where it ``trains``, a test set where it ``evaluates`` (a tool
        that reads test images only needs no annotations), an unregistered test set where it
        ``reads_tests`` (a tool given its own image reads none)."""

    @abstractmethod
    def prepare_datasets(self, *, trains: bool, evaluates: bool) -> None:
        """Make the datasets the request reads ready (the shapes dataset generated, files checked):
        the training sets where it ``trains``, the test sets always; the test sets' annotations are
        checked where it ``evaluates``."""

    @abstractmethod
    def build_model(self) -> torch.nn.Module:
        """The config's model, checked (:func:`gwdet.check_model`), on the config's device."""

    def load_weights(self, model: torch.nn.Module, evaluates: bool = True, exports: bool = False,
                     incomplete_outcome: str = EVALUATION_OUTCOME
                     ) -> dict[str, str] | None:
        """Load the initial weights into ``model``, every weight of the model required; where the
        request ``evaluates``, weights whose checkpoint records the class names they were trained on
        are refused for test data with those names in another order
        (:func:`gwdet.data.datasets.check_evaluated_classes`), and a test set that is their training
        data is warned of (:func:`warn_of_training_data_evaluated`). Where the request ``exports``
        (the exported file computes with the config's input values and tells its users the channel
        order), weights whose checkpoint records other input values than the model's are refused.
        ``incomplete_outcome``: what weights that leave part of the model unloaded would give, as
        their refusal says it (:class:`~gwdet.checkpoint.resilient.ResilientCheckpointer`).
        Returns the record of the weights loaded (:func:`~gwdet.checkpoint.resilient.weights_record`:
        a URL with the SHA-256 of its local copy; None without weights), whatever later replaces a file
        of that name."""
        checkpointer = ResilientCheckpointer(model, save_dir=self.output_dir, require_every_weight=True,
                                             incomplete_outcome=incomplete_outcome,
                                             weights_setting=self.weights_setting, compare_input=False)
        loaded = checkpointer.load_weights(self.weights)
        if exports:
            self._check_exported_input(loaded.get(INPUT_KEY), model)
        if evaluates:
            check_evaluated_classes(loaded.get(CLASSES_KEY), self.test_datasets(), self.weights)
            warn_of_training_data_evaluated(loaded.get(DATA_KEY), self.test_datasets(), self.weights)
        # the run's config.yaml, which holds the input values too, is compared where there is one
        if not self._warn_of_another_model(local_weights_path(self.weights, self.weights_setting)):
            differences = input_differences(loaded.get(INPUT_KEY), model)
            if differences:
                logger.warning(f"{self.weights_setting} {self.weights} was trained with values this model has "
                               f"otherwise: {'; '.join(differences)}. The model computes with this config's values, "
                               f"which changes its results; use the values the weights were trained with "
                               f"({self.input_settings}).")
        return checkpointer.initial_weights

    def _check_exported_input(self, saved: Any, model: torch.nn.Module) -> None:
        """Refuse weights whose input record (``saved``; nothing without one) gives another channel
        order than ``model`` reads images in, or other input values (pixel mean and std, the stem's
        stride): the export would hold another function than the one trained, and its own check,
        which compares it with the same model, would pass."""
        trained = saved.get("input_format") if isinstance(saved, dict) else None
        present = getattr(model, "input_format", None)
        if trained is not None and present is not None and trained != present:
            raise GwdetValueError(
                f"{self.input_format_setting}: {self.weights_setting} {self.weights} was trained on images in "
                f"{trained} channel order, and this config gives {present!r}. The exported model computes the same "
                f"function either way (the format only tells a loader how to read image files), so its users would "
                f"be told the wrong channel order; nothing was written. Set {self.input_format_setting} to {trained!r} "
                "for the export.")
        differences = input_differences(saved, model)
        if differences:
            raise GwdetValueError(
                f"{self.weights_setting} {self.weights} was trained with values this model has otherwise: "
                f"{'; '.join(differences)}. The exported file would compute with this config's values, another "
                "function than the one trained (and the export's check, which compares it with the same model, would "
                f"pass); nothing was written. Export with the values the weights were trained with "
                f"({self.input_settings}).")

    @abstractmethod
    def model_differences_from(self, path: str) -> list[str]:
        """``"KEY: saved -> current"`` for each value of the model that differs between the run
        config at ``path`` (a run's ``config.yaml``) and this config."""

    def _warn_of_another_model(self, weights: str) -> bool:
        """A warning when the weights sit in a run folder whose ``config.yaml`` gives the model other
        values than this config (a pixel mean: the weights evaluated in a model they were not trained
        in; a test threshold); nothing when there is no such record or it cannot be compared. Whether
        the record was compared."""
        if not weights or "://" in weights:
            return False
        record = os.path.join(os.path.dirname(os.path.abspath(weights)), CONFIG_NAME)
        if not os.path.isfile(record) and os.path.islink(weights):  # a link to a run's checkpoint: that run's record
            record = os.path.join(os.path.dirname(os.path.realpath(weights)), CONFIG_NAME)
        if not os.path.isfile(record):
            return False
        try:
            differences = self.model_differences_from(record)
        except (GwdetError, OSError):  # a damaged record, or one of the other kind of config
            return False
        if differences:
            shown = [line if len(line) <= SHOWN_LENGTH else f"{line[:SHOWN_LENGTH]} ..." for line in differences]
            logger.warning(f"{self.weights_setting} {weights} was trained in a run whose {record} gives the model other "
                           f"values: {listed(shown, 5, '; ')}. The weights "
                           "are evaluated with this config's values.")
        return True

    @abstractmethod
    def build_trainer(self) -> Any:
        """The trainer of the run (``resume_or_load``, then ``train`` returning the last results)."""

    @abstractmethod
    def evaluate(self, model: torch.nn.Module) -> Mapping:
        """``model`` evaluated on the config's test sets: ``{dataset: {task: {metric: value}}}``."""

    @abstractmethod
    def verify_results(self, results: Mapping) -> None:
        """After ``--eval-only``: the check of the config's expected results, as detectron2's tools
        make it."""

    @abstractmethod
    def test_datasets(self) -> list[str]:
        """The datasets the run evaluates on."""

    @abstractmethod
    def run_datasets(self, trains: bool = True) -> list[str]:
        """Every dataset the run trains (where it ``trains``) or evaluates on."""

    def test_batches(self) -> Iterator[list]:
        """The batches of the first test set, in the model's input format (:meth:`test_loader`)."""
        return iter(self.test_loader())

    def config_record(self) -> Mapping:
        """The config as the run's ``config.yaml`` records it (what :func:`check_same_config` compares)."""
        return self.cfg

    def evaluator_folders(self) -> list[str]:
        """The folders the config's evaluators write their files into where the config names them
        itself (a LazyConfig's ``dataloader.evaluator.output_dir``); a yacs config's evaluators write
        below its ``OUTPUT_DIR`` only."""
        return []

    @abstractmethod
    def describe_test_set(self) -> str:
        """How the tools name the first test set, e.g. ``"shapes_val (DATASETS.TEST[0])"``."""

    @abstractmethod
    def test_loader(self) -> Any:
        """The loader of the first test set."""

    @abstractmethod
    def evaluator(self, output_folder: str) -> Any:
        """The evaluator of the first test set, writing its files (predictions, results) into
        ``output_folder``: a tool's own folder, never a run's ``inference/``."""

    def build_trained_model(self, evaluates: bool = False, loads_weights: bool = True, exports: bool = False,
                            meta_refusal: str | None = None,
                            incomplete_outcome: str = EVALUATION_OUTCOME
                            ) -> torch.nn.Module:
        """The model with the initial weights loaded as ``--eval-only`` loads them, in evaluation
        mode (the export and analyze tools; their test sets checked as an evaluation's where it
        ``evaluates``: the export's ``--run-eval``; weights trained with other input values refused
        where it ``exports``); a warning when there are none. Without ``loads_weights`` (what does
        not depend on them: parameter counts, the structure) none are read. ``meta_refusal``: the
        error raised, before any weight is read, when the model is built on the meta device (whose
        tensors hold no values) and the caller runs it on images. ``incomplete_outcome``: as in
        :meth:`load_weights`."""
        with named_config_failures(self.cfg, "build the model"):
            model = self.build_model()
        if meta_refusal is not None and any(parameter.is_meta for parameter in model.parameters()):
            raise GwdetValueError(meta_refusal)
        if self.weights and not loads_weights:
            logger.warning(f"{self.weights_setting} {self.weights} is not read (nor checked): what is asked does not "
                           "depend on weights.")
        elif self.weights:
            self.load_weights(model, evaluates=evaluates, exports=exports, incomplete_outcome=incomplete_outcome)
        else:
            logger.warning(f"{self.weights_setting} is empty: the model is randomly initialized.")
        return model.eval()


def load_run_config(config_file: str, opts: Sequence[str] = (), *, tool: bool = False) -> RunConfig:
    """The config ``config_file`` with the command line's overrides ``opts`` (``KEY VALUE`` pairs
    for a yacs file, ``key=value`` for a LazyConfig ``.py``). ``tool``: for the export and analyze
    tools, which read a few test images in this process (no loader workers)."""
    if is_lazy_config(config_file):
        from gwdet.engine.lazy import LazyRun

        return LazyRun.load(config_file, opts, tool=tool)
    from gwdet.engine.trainer import YacsRun

    return YacsRun.load(config_file, opts, tool=tool)


# ---- the run request -------------------------------------------------------------------------


def check_output_request(args: argparse.Namespace, run: RunConfig) -> None:
    """Refuse, before anything is written or loaded, a run that would evaluate a model nobody chose
    or write over another run (``--eval-only`` / ``--resume`` / ``--overwrite`` of ``args``)."""
    output_setting = run.output_setting
    if args.resume and getattr(args, "overwrite", False):
        raise GwdetValueError(
            f"--resume continues the run in {output_setting} and --overwrite deletes it: give one of them.")
    if args.eval_only:
        if getattr(args, "overwrite", False):
            raise GwdetValueError(
                f"--overwrite deletes a run's files before a training starts, and --eval-only deletes nothing: an "
                f"evaluation writes into a folder of its own (in {output_setting}, or eval/<weights>/ beside a run "
                "there). Leave --overwrite out; nothing was evaluated.")
        if not run.test_datasets():
            raise GwdetValueError(
                f"--eval-only evaluates on the config's test set, and {run.test_setting} names none; nothing was "
                f"evaluated or written. Name the dataset to evaluate on in {run.test_setting}.")
        if args.resume:
            tagged_checkpoint(run.output_dir)
        elif not run.weights:
            raise GwdetValueError(
                f"--eval-only needs trained weights: add {run.weights_example} (or "
                f"--resume to evaluate the checkpoint {output_setting}/last_checkpoint names); without them the "
                "model would be randomly initialized.")
        return
    if args.resume:
        check_resume_source(run.output_dir, run.weights_setting)
        check_config_record_kept(run.output_dir, output_setting)
        if not checkpoints_in(run.output_dir):  # nothing to continue: it starts afresh, so a fresh start's checks
            check_fresh_start(run.output_dir, False, output_setting, run.weights, run.weights_setting)
        check_drawings_finished(run)
        run.check_resume_request(names_weights(run, args))
    else:
        check_fresh_start(run.output_dir, getattr(args, "overwrite", False), output_setting, run.weights,
                          run.weights_setting, aside=True)


# The detections per image COCO's AP counts (maxDets of detectron2's COCOEvaluator by default)
COCO_COUNTED_DETECTIONS = 100


def warn_of_uncounted_detections(per_image: Any, setting: str, counted: Any = None) -> None:
    """Warn where the model keeps more detections per image (``per_image``, its ``setting``) than
    the evaluator's AP counts (``counted``: its ``max_dets_per_image``; COCO's 100 when not given):
    the results are those of the best-scoring ones only."""
    listed_counts = isinstance(counted, Sequence) and not isinstance(counted, str) and len(counted) > 0
    last = counted[-1] if listed_counts else COCO_COUNTED_DETECTIONS
    if isinstance(per_image, int) and isinstance(last, int) and per_image > last:
        logger.warning(
            f"{setting} is {per_image}, but COCO's AP counts the {last} highest-scoring detections of each image "
            f"(maxDets {last}, as detectron2's COCOEvaluator computes it): the results are those of the best {last}, "
            f"while the detections file holds up to {per_image}.")


def warn_of_training_data_evaluated(trained_on: Any, test_datasets: Sequence[str], weights: str) -> None:
    """Warn of each of ``test_datasets`` whose annotation file holds what a file the ``weights`` were
    trained on held (their checkpoint's record ``trained_on``,
    :data:`~gwdet.checkpoint.resilient.DATA_KEY`; the same SHA-256), or whose images (of a
    ``--register-coco`` set) that file lists: its results measure the training data."""
    if not isinstance(trained_on, Mapping):
        return
    records = [(name, record) for name, record in trained_on.items() if isinstance(record, Mapping)]
    for name, test in annotation_files(test_datasets).items():
        registered = coco_dataset(name)
        for trained, record in records:
            if test["json_sha256"] and record.get("json_sha256") == test["json_sha256"]:
                logger.warning(
                    f"The test set {name!r} ({test['json_file']}) holds the annotations {weights} was trained on (its "
                    f"training set {trained!r}, the same file contents): its results measure the data the model "
                    "trained on, not how it does on unseen images. Evaluate on a held-out annotation file.")
                break
            prints = record.get(IMAGES_KEY)  # by contents: also after the training images' folder moved, and copies
            shared = (registered.read.image_files & recorded_images(dict(record))
                      | set(registered.read.images_among(prints if isinstance(prints, bytes) else b""))
                      if registered else frozenset())
            if registered and shared:
                logger.warning(
                    f"{len(shared)} of the {registered.read.images} images of the test set {name!r} are images "
                    f"{weights} was trained on (its training set {trained!r}: {listed(sorted(shared), 2)}): its "
                    "results measure, in part, the data the model trained on, not how it does on unseen images. "
                    "Evaluate on held-out images.")
                break


def gives_setting(opts: Sequence[str], setting: str) -> bool:
    """Whether the overrides ``opts`` (``KEY VALUE`` pairs or ``key=value`` items) set ``setting``."""
    return any(token.split("=", 1)[0] == setting for token in opts)


def names_weights(run: RunConfig, args: argparse.Namespace) -> bool:
    """Whether the command line's overrides set the initial weights (``MODEL.WEIGHTS`` or
    ``train.init_checkpoint``)."""
    return gives_setting(args.opts, run.weights_setting)


def evaluation_request(run: RunConfig, args: argparse.Namespace) -> tuple[RunConfig, argparse.Namespace]:
    """``--eval-only``: the config and arguments that evaluate exactly the chosen weights (the
    initial weights, or with ``--resume`` the checkpoint ``last_checkpoint`` names) into a folder of
    their own when the output folder holds a run (:func:`gwdet.engine.output_dir.evaluation_folder`,
    the main process's choice for all; logged when that is not the output folder). A run's recorded
    config.yaml does not stand for its trained weights
    (:func:`gwdet.engine.output_dir.check_weights_are_the_runs`)."""
    check_output_request(args, run)
    if not args.resume and not names_weights(run, args):
        check_weights_are_the_runs(args.config_file, run.weights, run.weights_setting, "nothing was evaluated")
    if not args.resume and run.weights:
        check_not_set_aside(local_weights_path(run.weights, run.weights_setting), run.weights_setting)
    weights = tagged_checkpoint(run.output_dir) if args.resume else run.weights
    if args.resume and names_weights(run, args) and os.path.abspath(run.weights) != os.path.abspath(weights):
        raise GwdetValueError(
            f"--eval-only --resume evaluates the checkpoint that {run.output_dir}/last_checkpoint names ({weights}), "
            f"not {run.weights_setting} {run.weights} given on the command line: leave out --resume to evaluate "
            f"{run.weights}, or leave out {run.weights_setting} to evaluate the run's checkpoint.")
    check_final_weights_not_training(run.output_dir, weights, run.output_setting)
    folder = evaluation_folder(run.output_dir, weights, run.output_setting)
    if comm.get_world_size() > 1:  # chosen once: a process that looked after the first took the folder would pick the next
        folder = comm.all_gather(folder)[0]
    if folder != run.output_dir:
        logger.info(f"{run.output_setting} {run.output_dir} holds a run or an evaluation: the evaluation of {weights} "
                    f"is written to {folder}, and the files already there stay as they are.")
    targeted = run.with_target(absolute_weights_path(weights, run.weights_setting), folder)  # config.yaml: the file itself
    check_evaluator_folders(targeted, folder, "nothing was evaluated")
    return targeted, argparse.Namespace(**{**vars(args), "resume": False})


def check_evaluator_folders(run: RunConfig, folder: str, outcome: str) -> None:
    """Refuse a run whose evaluators write outside its ``folder`` (a LazyConfig's
    ``dataloader.evaluator.output_dir``) into a folder holding detections (another run's or
    evaluation's ``inference/``), which the evaluation would replace; ``outcome`` says what was not done."""
    for written in run.evaluator_folders():
        held = [name for name in EVALUATOR_FILES if os.path.isfile(os.path.join(written, name))]
        inside = os.path.commonpath([os.path.realpath(written), os.path.realpath(folder)]) == os.path.realpath(folder)
        if held and not inside:
            raise GwdetFileExistsError(
                f"The evaluator writes into {written}, which holds an earlier evaluation's {', '.join(held)} (a run's "
                f"or an evaluation's detections): this evaluation would replace them; {outcome}. Leave "
                f"the evaluator's output_dir out (the evaluation then writes into {folder}), or give it a folder of its "
                "own.")


def config_text(run: RunConfig, record: Mapping | None = None) -> str:
    """The run's config (:meth:`RunConfig.config_record`, or ``record`` when the caller has read it)
    as one JSON text, keys sorted: what two readings of a config are compared by."""
    return json.dumps(run.config_record() if record is None else record, sort_keys=True, default=repr)


def check_config_unchanged(run: RunConfig, checked: str, when: str) -> None:
    """Refuse ``run`` when its config differs from ``checked`` (:func:`config_text` of the config
    as it was checked ``when``, e.g. "when the job was submitted"), naming the values that changed:
    a config file (or a base of it) edited in between would otherwise run unchecked."""
    now = config_text(run)
    if now == checked:
        return
    lines = config_differences(json.loads(checked), json.loads(now))
    raise GwdetValueError(
        f"The config changed since it was checked {when} (its file or a _BASE_ of it was edited in between): "
        f"{listed(lines, 5, '; ')} (the checked value first). Nothing was trained: run the command again, so that "
        "the config as it is now is checked, or put the file back as it was.")


def check_same_config(run: RunConfig, args: argparse.Namespace) -> None:
    """Refuse, in every process alike, a run whose processes hold different configs or requests
    (``--resume``, ``--eval-only``): the machines of a multi-machine run each read their own command
    line, and would otherwise train together with different models or schedules, or from different
    iterations (waiting on each other without end)."""
    if comm.get_world_size() == 1:
        return
    flags = [flag for flag, given in (("--resume", args.resume), ("--eval-only", args.eval_only)) if given]
    record = run.config_record()
    digest = hashlib.sha256(config_text(run, record).encode("utf-8")).hexdigest()
    requests, digests, threads = zip(*comm.all_gather((flags, digest, torch.get_num_threads())), strict=True)
    other = next((rank for rank, request in enumerate(requests) if request != requests[0]), None)
    if other is not None:
        raise GwdetValueError(
            f"The processes of this run were started with different requests (rank 0: {' '.join(requests[0]) or 'none'}; "
            f"rank {other}: {' '.join(requests[other]) or 'none'}): start every machine with the same flags "
            "(--resume, --eval-only) as well as the same config.")
    differing = [rank for rank, other in enumerate(digests) if other != digests[0]]
    if differing:
        records = comm.all_gather(record)  # every process, as every one found the difference
        lines = config_differences(records[0], records[differing[0]])
        raise GwdetValueError(
            f"The processes of this run hold different configs (rank {', '.join(map(str, differing))} against rank "
            f"0; rank {differing[0]}'s values, rank 0's first: {listed(lines, 4, '; ')}): start every machine with the "
            f"same config file and the same overrides ({run.output_setting} too: on disks of each machine's own, give "
            "the same path on each).")
    other = next((rank for rank, count in enumerate(threads) if count != threads[0]), None)
    if other is not None and dist.get_backend() == "gloo":
        raise GwdetValueError(
            f"The processes of this run compute on the CPU with different numbers of threads (rank 0: {threads[0]}; "
            f"rank {other}: {threads[other]}), which changes the order of their sums and so the weights' last bits, "
            "and results.json records one count: start every machine with the same --threads N.")


def setup(args: argparse.Namespace, run: RunConfig, held: HeldRecords | None = None) -> None:
    """The command line's datasets registered, the run request checked, detectron2's logging and
    output set-up, the datasets ready.

    A dataset the config cannot use (a ``--register-coco`` file that fails its checks, a number of
    classes or categories that do not match, a dataset name nobody registered) stops here, before
    detectron2's set-up writes the run's config and log: ``PROG: error: ...`` on one line, no
    traceback, exit status 2, as the tools report their other refusals. What the checks log (the
    ``--resume`` warning about changed values), and what was logged before (``held``), is held until
    the run's logger writes ``log.txt``, then logged there and on the console
    (:class:`~gwdet.engine.run_log.HeldRecords`).
    """
    given = getattr(args, "register_coco", None) or ()
    try:
        run.register_datasets(given, trains=not args.eval_only, evaluates=True)
    except DatasetError as error:
        print(f"{tool_name()}: error: {error}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    # run_datasets() is empty where a LazyConfig's loaders name no dataset gwdet can read
    warn_of_unused_coco(given, run.run_datasets(), "the run neither trains nor evaluates on",
                        "name it in the config's datasets (DATASETS.TRAIN / DATASETS.TEST, or the LazyConfig's "
                        "dataloader) to use it.")
    check_same_config(run, args)
    main_process = comm.is_main_process()
    if main_process:
        check_run_folders(run.output_dir, written_folders(run), run.output_setting)
        check_run_file_names(run.output_dir, run.output_setting)
        check_run_files_not_shared(run.output_dir, run.output_setting)
        check_output_request(args, run)
        if not args.resume or not checkpoints_in(run.output_dir):
            check_config_not_users(run.output_dir, run.output_setting)
    # config.yaml with the checksum --resume checks it against; on failure both as they were
    with config_rewrite(run.output_dir, run.output_setting) if main_process else contextlib.nullcontext():
        default_setup(run.cfg, args)  # seeds the random generators with the config's seed
    mark_seeded(run.cfg)
    setup_logger(run.output_dir, distributed_rank=comm.get_rank(), name="gwdet")  # gwdet's messages in log.txt too
    guard_log_files()  # a full disk stops log.txt with one line, not a traceback per record
    if held is not None:
        held.release()
    logger.info(describe_plans())
    run.prepare_datasets(trains=not args.eval_only, evaluates=True)


def save_final_weights_of_a_finished_resume(trainer: Any, output_dir: str) -> None:
    """Save ``model_final.pth`` where a resume started at the last iteration (its last periodic
    checkpoint was of the final iteration, and ``model_final.pth`` could not be written, on a disk
    that was full, say): detectron2's checkpointer saves it only after the last iteration it
    trains, and there was none to train (main process)."""
    if (comm.is_main_process() and trainer.start_iter >= trainer.max_iter
            and not os.path.exists(os.path.join(output_dir, FINAL_WEIGHTS))):
        trainer.checkpointer.save(os.path.splitext(FINAL_WEIGHTS)[0], iteration=trainer.max_iter - 1)
        logger.info(f"The run's last checkpoint is of its final iteration: saved it as {FINAL_WEIGHTS}.")


def warn_of_unused_coco(given: Sequence[CocoDataset], read: Sequence[str], reader: str, fix: str) -> None:
    """A warning naming the ``--register-coco`` datasets among ``given`` that are not among
    ``read``, the datasets that ``reader`` reads (the words before "it": "the run neither trains
    nor evaluates on"); ``fix``: how to use them. Nothing when ``read`` is empty (no dataset name
    gwdet can tell)."""
    unused = [dataset.name for dataset in given if read and dataset.name not in read]
    if unused:
        logger.warning(f"--register-coco registered {', '.join(map(repr, unused))}, but {reader} "
                       f"{'it' if len(unused) == 1 else 'them'}: {fix}")


def warn_of_replaced_weights(config_file: str, run: RunConfig) -> None:
    """Warn when a training from a run's ``config.yaml`` starts from initial weights whose file now
    holds other bytes than that run started from (:func:`~gwdet.engine.output_dir.recorded_initial_weights`:
    its ``results.json``, or its checkpoint): the same config, another starting point."""
    folder = os.path.dirname(os.path.abspath(config_file))
    if os.path.basename(config_file) != CONFIG_NAME or not run.weights or not os.path.isfile(run.weights):
        return
    recorded = recorded_initial_weights(folder)
    if not recorded or recorded.get("path") != run.weights:
        return
    now = weights_record(run.weights)["sha256"]
    if now != recorded.get("sha256"):
        logger.warning(f"{run.weights_setting} {run.weights} holds other weights than the run of {config_file} started "
                       f"from (SHA-256 {now[:12]}... now, {str(recorded.get('sha256'))[:12]}... in that run's "
                       "records): the file was replaced since, and this run starts from it as it is now.")


def warn_of_saved_key_order(config_file: str) -> None:
    """Warn when a new training reads a LazyConfig saved as YAML (``LazyConfig.save``, whose keys are
    in alphabetical order): detectron2 builds a node's parts in the order of its keys, so the model's
    random initial weights are not those of the ``.py`` it was saved from under the same seed."""
    if config_file.endswith(".py") or not is_lazy_config(config_file):
        return
    logger.warning(f"{config_file} is a LazyConfig saved as YAML, whose keys LazyConfig.save writes in alphabetical "
                   "order, and detectron2 builds a model's parts in the order of their keys (a ResNet's stages before "
                   "its stem): the same seed draws other initial weights than the .py it was saved from, so this "
                   "training does not repeat that run's. To repeat a run, train from its .py with the same overrides.")


def written_folders(run: RunConfig) -> list[str]:
    """The folders the run writes in its output folder: ``inference/`` (the evaluation's files) and,
    when it draws predictions, ``vis/``; none without a test set."""
    if not run.test_datasets():
        return []
    return [INFERENCE_FOLDER, *([VIS_FOLDER] if run.vis_images > 0 else [])]


def main(args: argparse.Namespace):
    """Train (or evaluate with ``--eval-only``) the model ``args`` describe; return the results
    (module docstring: the steps). What gwdet logs before the run's log exists reaches ``log.txt``
    too, and its warnings are listed in ``results.md`` and ``results.json``."""
    with RunWarnings() as warned, HeldRecords() as held:
        return _train_or_evaluate(args, held, warned)


def _train_or_evaluate(args: argparse.Namespace, held: HeldRecords, warned: RunWarnings):
    run = load_run_config(args.config_file, args.opts).for_processes(comm.get_world_size())
    if args.eval_only:
        run.check_request(True, comm.get_world_size())
    else:
        run.check_training_request(comm.get_world_size())
    check_torch_state(training=not args.eval_only)
    if not gives_setting(args.opts, run.output_setting):
        request = ("--resume" if args.resume and not args.eval_only else "--eval-only" if args.eval_only
                   else "--overwrite" if getattr(args, "overwrite", False) else "")
        check_run_folder_is_the_records(args.config_file, run.output_dir, run.output_setting, request)
    if args.eval_only:
        run, args = evaluation_request(run, args)
    else:  # config.yaml names the file itself, wherever the config is read from again
        run = run.with_target(absolute_weights_path(run.weights, run.weights_setting), run.output_dir)
        check_evaluator_folders(run, run.output_dir, "nothing was trained")
    check_config_file_kept(args.config_file, run.output_dir, run.output_setting)
    lock = OutputDirLock(run.output_dir, run.output_setting, run.weights_setting)
    with lock if comm.is_main_process() else contextlib.nullcontext():
        # --overwrite: the earlier run is deleted once the model is built and its weights loaded; a run
        # refused before then leaves config.yaml as it was
        main_process = comm.is_main_process()
        with earlier_run_until_started(run.output_dir) if main_process else contextlib.nullcontext(), \
                config_until_started(run.output_dir) if main_process else contextlib.nullcontext():
            setup(args, run, held)
            if args.eval_only:
                with named_config_failures(run.cfg, "build the model", args.opts):
                    model = run.build_model()
                    # what was loaded, whatever replaces the file while the evaluation runs (a --resume's model_final)
                    scored = run.load_weights(model)
            else:
                if not (args.resume and checkpoints_in(run.output_dir)):
                    warn_of_replaced_weights(args.config_file, run)
                    warn_of_saved_key_order(args.config_file)
                with named_config_failures(run.cfg, "build the model and its training", args.opts):
                    trainer = run.build_trainer()
                    trainer.resume_or_load(resume=args.resume)
                if main_process:
                    trainer.register_hooks([RunFolderKept(run.output_dir, run.output_setting)])
        if args.eval_only:
            with named_full_disk(run.output_dir, "Evaluate again once it can be written."), \
                    named_lost_file("Then evaluate again."), evaluation_stops():
                results = run.evaluate(model)
        else:
            with named_config_failures(run.cfg, "train the first iteration", args.opts,
                                       applies=lambda: trainer.iter == trainer.start_iter), \
                    named_full_disk(run.output_dir, lambda: training_way_on(run.output_dir)), \
                    named_lost_file(lambda: stopped_training_way_on(run.output_dir)), \
                    named_killed_loader(lambda: stopped_training_way_on(run.output_dir)):
                try:
                    results = trainer.train()
                except FloatingPointError as error:  # detectron2's trainer: a non-finite loss
                    if trainer.iter == trainer.start_iter:
                        raise
                    raise TrainingDiverged(f"Training diverged: {error} {diverged_advice(run.output_dir)}") from error
                save_final_weights_of_a_finished_resume(trainer, run.output_dir)
            model = trainer.model
        test_datasets = run.test_datasets()
        initial = None if args.eval_only else getattr(trainer.checkpointer, "initial_weights", None)
        segments = [] if args.eval_only or not hasattr(trainer.checkpointer, "run_segments") else \
            trainer.checkpointer.run_segments()
        draws = comm.is_main_process() and run.vis_images > 0 and bool(test_datasets)  # no test set: nothing to draw
        asked = drawings_asked(test_datasets[0], run.vis_images) if draws else 0
        write_results_to(run.output_dir, results or {}, test_datasets, run.run_datasets(not args.eval_only),
                         scored if args.eval_only else None, initial, run.score_threshold_setting, run.test_settings,
                         segments, warned.messages, asked)
        drawings: list[str] = []
        if draws:
            drawings = draw_predictions(run, model, test_datasets[0], asked, args.eval_only)
    log_outputs(run.output_dir, bool(results), drawings, run.vis_setting, len(warned.messages), test_datasets)
    check_log_written(run.output_dir)
    if args.eval_only:  # (a training's: detectron2's trainer checks them)
        run.verify_results(results or {})
    return results


def draw_predictions(run: RunConfig, model: torch.nn.Module, dataset: str, asked: int, eval_only: bool) -> list[str]:
    """The run's ``asked`` prediction drawings of ``dataset`` in ``vis/`` (:func:`save_prediction_pngs`),
    made after its results are written; return their paths. A stop signal meanwhile ends the process with
    the signal's exit status (:func:`gwdet.checkpoint.signal_hook.drawing_stops`), logging how many
    drawings were written and how to make them all (``eval_only``: the run is an ``--eval-only``
    evaluation)."""
    folder = os.path.join(run.output_dir, VIS_FOLDER)

    def stopped(name: str) -> str:
        written = drawings_in(folder)
        return (f"Stopped by {name} while drawing: {written} of {asked} drawings written in {folder}{os.sep}; the "
                f"results are complete ({RESULTS_MARKDOWN}, {RESULTS_JSON}). {redraw_advice(run, eval_only, asked)}")

    with drawing_stops(stopped):
        return save_prediction_pngs(run.cfg, model, dataset, run.vis_images, folder, drawn_score(run))


def redraw_advice(run: RunConfig, eval_only: bool, asked: int) -> str:
    """How to get all ``asked`` prediction drawings of a run (an ``--eval-only`` evaluation where
    ``eval_only``) whose drawing step was stopped: an evaluation of the same weights again, which
    writes them in a folder of its own (for a training: the folder of ``--eval-only --resume``,
    :func:`gwdet.engine.output_dir.evaluation_folder`)."""
    if eval_only:
        return (f"To draw them, run the same command again: it evaluates the same weights again and writes its "
                f"results and its {asked} drawings in a folder of its own, leaving these files as they are.")
    try:
        checkpoint = tagged_checkpoint(run.output_dir)
        folder = os.path.join(evaluation_folder(run.output_dir, checkpoint, run.output_setting), VIS_FOLDER)
        weights = os.path.basename(checkpoint)
    except GwdetError:  # no checkpoint named, or eval/ taken: the refusal of --eval-only --resume says which
        folder, weights = os.path.join(run.output_dir, "eval", "<checkpoint>", VIS_FOLDER), "the last checkpoint"
    return (f"To draw them, run the same command with --eval-only --resume: it evaluates {weights} again and writes "
            f"its results and its {asked} drawings in {folder}{os.sep}, leaving the run's own files as they are.")


def schedule_end(run: RunConfig) -> int | None:
    """The iteration the run's training ends at (``SOLVER.MAX_ITER``, a LazyConfig's
    ``train.max_iter``); ``None`` where the config has neither as an integer."""
    cfg = run.cfg
    solver = cfg.get("SOLVER") if hasattr(cfg, "get") else None
    train = cfg.get("train") if hasattr(cfg, "get") else None
    end = solver.get("MAX_ITER") if solver is not None and hasattr(solver, "get") else \
        train.get("max_iter") if train is not None and hasattr(train, "get") else None
    return end if type(end) is int else None


def recorded_drawings(output_dir: str) -> int:
    """How many prediction drawings the run in ``output_dir`` made after its results, as its
    ``results.json`` records them (:func:`results_record`); 0 without a record."""
    try:
        with open(os.path.join(output_dir, RESULTS_JSON), "rb") as file:
            count = json.load(file)[ENVIRONMENT_KEY][DRAWINGS_KEY]["count"]
    except (OSError, ValueError, KeyError, TypeError):  # no results, or a run that drew nothing
        return 0
    return count if type(count) is int else 0


def check_drawings_finished(run: RunConfig) -> None:
    """Refuse a ``--resume`` of a finished run (its last checkpoint at the end of its schedule, its
    ``results.json`` written after it) whose drawing step was stopped: ``vis/`` holds fewer prediction
    drawings than its ``results.json`` records it was to make (:func:`recorded_drawings`). The resume
    would train nothing; the message says how to make the drawings (:func:`redraw_advice`). A resume
    that trains on makes all the drawings again at its end."""
    found = resumed_iteration(run.output_dir)
    results = os.path.join(run.output_dir, RESULTS_JSON)
    if found is None or found[1] != schedule_end(run) or not os.path.isfile(results) \
            or os.path.getmtime(results) < os.path.getmtime(found[0]):
        return
    folder = os.path.join(run.output_dir, VIS_FOLDER)
    written, asked = drawings_in(folder), recorded_drawings(run.output_dir)
    if written >= asked:
        return
    raise GwdetValueError(
        f"--resume: the run in {run.output_dir!r} has trained its {found[1]} iterations ({os.path.basename(found[0])}) "
        f"and its results are in {RESULTS_JSON}, but its drawing step was stopped: {folder}{os.sep} holds {written} of "
        f"the {asked} prediction drawings it was making ({run.vis_setting}). Resuming would train nothing; "
        f"nothing was changed. {redraw_advice(run, False, asked)}")


def drawn_score(run: RunConfig) -> float:
    """The score from which the prediction drawings show detections, as their caption says: 0.5,
    or the model's test score threshold where it is higher (no detection below it is kept)."""
    threshold: Any = run.test_settings.get(run.score_threshold_setting)
    return max(DRAWN_SCORE, float(threshold)) if is_finite_number(threshold) else DRAWN_SCORE


def training_way_on(output_dir: str) -> str:
    """What a training stopped by a full or unwritable disk keeps, and how to go on: its
    checkpoints and ``--resume``, or, before its first checkpoint, nothing (the stop's own
    checkpoint may be what could not be written) and a new start."""
    if checkpoints_in(output_dir):
        return ("Its checkpoints are kept: continue with --resume once it can be written (a finished training is "
                "evaluated again).")
    return ("The run had no checkpoint yet (the one being saved, a stop signal's too, is what could not be written), "
            "so nothing of its training is kept: once it can be written, start it again with --overwrite.")


def stopped_training_way_on(output_dir: str) -> str:
    """How to go on with a training in ``output_dir`` stopped by a lost file or a killed data loading
    process: ``--resume`` from its checkpoints, or, before its first, a new start."""
    if checkpoints_in(output_dir):
        return "The run's checkpoints are kept: continue it with --resume."
    return ("The run had saved no checkpoint yet, so nothing of its training is kept: start it again with --overwrite "
            "(which deletes the files it left).")


@contextlib.contextmanager
def named_full_disk(output_dir: str, way_on: str | Callable[[], str]) -> Iterator[None]:
    """A full disk while training or evaluating into ``output_dir`` (detectron2's writers, its
    evaluators' files; torch.save's archive writer reports it as a RuntimeError raised while the
    OSError was handled; detectron2's trainer runs its writers again after the failed one, whose
    own errors then replace it), or ``output_dir`` no longer writable (a disk remounted read-only,
    permissions changed: a file there refused), as one error naming the folder and ``way_on`` (or
    what it returns when the error comes: what is kept by then), instead of the writer's traceback."""
    try:
        yield
    except Exception as raised:
        if callable(way_on):
            way_on = way_on()
        error = next((cause for cause in _raised_while_handling(raised)
                      if isinstance(cause, OSError) and cause.errno in _UNWRITABLE), None)
        if error is None or (isinstance(raised, GwdetError) and not isinstance(raised, WriteError)):
            raise  # gwdet's own errors say it already (an atomic write's names the file only)
        filename = getattr(error, "path", None) or error.filename
        where = filename or "a file there"
        reason = os.strerror(error.errno) if isinstance(error, WriteError) and error.errno else error.strerror
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            raise GwdetOSError(f"The disk of {output_dir} is full ({reason}: {where}); files written at that "
                               f"moment may be cut short. Free space there. {way_on}") from raised
        inside = isinstance(filename, str) and os.path.abspath(filename).startswith(
            os.path.join(os.path.abspath(output_dir), ""))
        if error.errno in (errno.EROFS, errno.EACCES, errno.EPERM) and inside:
            raise GwdetOSError(f"{output_dir} can no longer be written ({reason}: {where}): its disk was made "
                               "read-only, or its permissions changed, while the run worked; files written at that "
                               f"moment may be cut short. Make it writable again. {way_on}") from raised
        raise


# What a file write fails with on a full disk or quota, and in a folder no longer writable
_UNWRITABLE = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)


def _raised_while_handling(raised: BaseException) -> Iterator[BaseException]:
    """``raised``, then the exceptions it was raised while handling (``__context__``), innermost last."""
    seen: list[BaseException] = []
    cause: BaseException | None = raised
    while cause is not None and not any(cause is earlier for earlier in seen):
        seen.append(cause)
        yield cause
        cause = cause.__context__


# How PIL says that an image file it opened or decodes is damaged (OSError, or its UnidentifiedImageError)
UNDECODABLE_IMAGE_WORDS = ("image file is truncated", "cannot identify image file", "broken PNG file",
                           "Truncated File Read")


@contextlib.contextmanager
def named_lost_file(way_on: str | Callable[[], str]) -> Iterator[None]:
    """A file gone or an image damaged while training or evaluating (a dataset's images or the
    shapes cache moved, deleted or overwritten during the run; a data loader worker's error
    carries it as text) as one error naming the file (PIL names none for a cut-short image) and
    ``way_on`` (or what it returns when the error comes), instead of the loader's traceback."""
    try:
        yield
    except OSError as error:
        if isinstance(error, GwdetError):
            raise
        if callable(way_on):
            way_on = way_on()
        lines = [line for line in str(error).splitlines() if line.strip()]
        last = lines[-1] if lines else ""
        if isinstance(error, FileNotFoundError):
            what = (f"{error.strerror}: {error.filename}" if error.filename
                    else last.removeprefix("FileNotFoundError: ") if lines else "no such file")
            raise GwdetFileNotFoundError(
                f"A file the run reads or writes is gone ({what}): moved or deleted while the run was working (a "
                "dataset's images, its annotation file, $GWDET_CACHE, its output folder)? Put it back (or register "
                f"the dataset where it is now). {way_on}") from error
        said = next((line for line in reversed(lines) if any(words in line for words in UNDECODABLE_IMAGE_WORDS)), None)
        if said is None:
            raise
        raise GwdetOSError(
            f"An image the run reads cannot be decoded ({said.split('Error: ', 1)[-1]}): damaged or overwritten while "
            "the run was working (a dataset's images, $GWDET_CACHE)? The images were checked to decode when the run "
            "started. Put the intact files back (the shapes dataset is generated again where its files differ from "
            f"their checksums). {way_on}") from error


# torch's DataLoader, when one of its worker processes ended by a signal (the out-of-memory killer's SIGKILL)
KILLED_LOADER_WORKER = re.compile(r"DataLoader worker \(pid (\d+)\) is killed by signal: ([^.\n]+)")


@contextlib.contextmanager
def named_killed_loader(way_on: str | Callable[[], str]) -> Iterator[None]:
    """A data loading process killed while the run worked (torch's ``DataLoader worker (pid N) is
    killed by signal``) as one error naming it, the likely cause and ``way_on`` (or what it returns
    when the error comes), instead of torch's traceback."""
    try:
        yield
    except RuntimeError as error:  # torch's "... exited unexpectedly" arises while handling the signal's report
        searched = (KILLED_LOADER_WORKER.search(str(cause)) for cause in (error, error.__context__)
                    if cause is not None)
        found = next((match for match in searched if match is not None), None)
        if found is None or isinstance(error, GwdetError):
            raise
        if callable(way_on):
            way_on = way_on()
        raise GwdetRuntimeError(
            f"A data loading process of the run (pid {found.group(1)}) was killed by signal {found.group(2)}: the "
            "out-of-memory killer, most likely (each loading process holds its own copy of the dataset's records), or "
            "a kill from outside. Use fewer of them (DATALOADER.NUM_WORKERS; a LazyConfig's dataloader.train."
            f"num_workers) or free memory. {way_on}") from error


def diverged_advice(output_dir: str) -> str:
    """What a run that diverged after its first iteration leaves in ``output_dir`` and what to do."""
    if checkpoints_in(output_dir):
        return (f"The checkpoints written before it are kept in {output_dir}. Lower the learning rate or lengthen the "
                "warm-up and train again; --resume would continue from the last checkpoint, which may diverge the "
                "same way.")
    return (f"No checkpoint was written before it: {output_dir} holds none to continue from. Lower the learning rate "
            "or lengthen the warm-up and train again.")


# ---- results -----------------------------------------------------------------------------------


def flatten_results(results: Mapping, datasets: Sequence[str] = ()) -> "OrderedDict[str, Mapping]":
    """``{dataset: {task: {metric: value}}}`` whether or not detectron2 dropped the dataset level.

    detectron2's ``DefaultTrainer.test`` drops it when it evaluated one dataset; given the names
    evaluated (``DATASETS.TEST``), that one dataset's name comes back as the key, else ``""``."""
    if results and all(isinstance(v, Mapping) and all(isinstance(m, float) for m in v.values()) for v in results.values()):
        return OrderedDict([(datasets[0] if len(datasets) == 1 else "", results)])
    return OrderedDict(results)


def results_markdown(results: Mapping, datasets: Sequence[str] = ()) -> str:
    """COCO AP tables (one per dataset and task) as markdown."""
    lines = []
    for dataset, tasks in flatten_results(results, datasets).items():
        for task, metrics in tasks.items():
            names = [name for name in metrics if "-" not in name]  # AP, AP50, ... not per-class
            title = f"{dataset} {task}".strip()
            values = ["nan" if math.isnan(metrics[name]) else f"{metrics[name]:.2f}" for name in names]
            lines += [f"### {title}", "", *(f"| {' | '.join(cells)} |" for cells in (names, ["---"] * len(names), values)),
                      ""]
    return "\n".join(lines)


def results_record(results: Mapping, datasets: Sequence[str] = (), run_datasets: Sequence[str] = (),
                   evaluated: Mapping[str, str] | None = None, initial: Mapping[str, str] | None = None,
                   segments: Sequence[Mapping[str, Any]] = (), test_settings: Mapping[str, Any] | None = None,
                   warnings: Sequence[str] = (), drawings: int = 0) -> dict:
    """What ``results.json`` holds: ``{dataset: {task: {metric: value}}}`` of ``results`` for the
    test sets ``datasets`` (:func:`flatten_results`; an AP detectron2 reports as NaN is ``None``,
    JSON's ``null``, as strict JSON has no NaN), and under ``"environment"`` the package
    versions and the annotation files of ``run_datasets`` (every dataset the run trained or
    evaluated on) with their SHA-256 (:func:`gwdet.engine.run_environment.run_environment`); for an
    evaluation, the weights file it scored (``evaluated``), for a training the weights it started
    from (``initial``), each as :func:`~gwdet.checkpoint.resilient.weights_record` gives it; for a
    resumed training, what each stretch of its iterations ran with (``segments``, from its
    checkpoints: :meth:`~gwdet.checkpoint.resilient.ResilientCheckpointer.run_segments`), the values
    beside them being the last stretch's; the ``test_settings`` the results were evaluated with; and
    the ``warnings`` gwdet logged in the run; and the prediction drawings the run makes after writing
    them (``drawings``, under :data:`DRAWINGS_KEY`: their folder and count), by which a ``--resume``
    tells drawings cut short (:func:`check_drawings_finished`)."""
    record: dict = {dataset: {task: {name: None if isinstance(value, float) and math.isnan(value) else value
                                     for name, value in metrics.items()} for task, metrics in tasks.items()}
                    for dataset, tasks in flatten_results(results, datasets).items()}
    if ENVIRONMENT_KEY in record:
        raise GwdetValueError(f"A test dataset is named {ENVIRONMENT_KEY!r}, the key under which results.json records "
                              f"the run's environment: register the dataset under another name. (results.md holds "
                              f"its results.)")
    environment = run_environment([*run_datasets, *datasets])
    if test_settings:
        environment["test_settings"] = dict(test_settings)
    if evaluated:
        environment["weights"] = dict(evaluated)
    if initial:
        environment["initial_weights"] = dict(initial)
    if len(segments) > 1:
        environment["segments"] = [dict(segment) for segment in segments]
    if warnings:
        environment["warnings"] = list(warnings)
    if drawings:
        environment[DRAWINGS_KEY] = {"folder": VIS_FOLDER, "count": drawings}
    record[ENVIRONMENT_KEY] = environment
    return record


def write_results_to(output_dir: str, results: Mapping, datasets: Sequence[str] = (),
                     run_datasets: Sequence[str] = (), evaluated: Mapping[str, str] | None = None,
                     initial: Mapping[str, str] | None = None,
                     threshold_setting: str = "MODEL.ROI_HEADS.SCORE_THRESH_TEST",
                     test_settings: Mapping[str, Any] | None = None, segments: Sequence[Mapping[str, Any]] = (),
                     warnings: Sequence[str] = (), drawings: int = 0) -> None:
    """``output_dir/results.md`` and ``results.json`` (:func:`results_record`) of ``results`` for the
    test sets ``datasets`` of a run on ``run_datasets`` (main process only; nothing without results);
    an evaluation's name the weights file it scored and its SHA-256 (``evaluated``, taken when they
    were loaded), a training's the weights it started from (``initial``, as its checkpoints carry
    them); both as :func:`~gwdet.checkpoint.resilient.weights_record` gives them. A test set on which
    the model detected nothing is warned of, naming the ``threshold_setting`` of its scores.
    results.md lists the ``test_settings`` the results were evaluated with, and both the ``warnings``
    gwdet logged in the run (:class:`~gwdet.engine.run_log.RunWarnings`; that NaN warning with them).
    ``drawings``: how many prediction drawings the run makes after its results (recorded in
    results.json, named in results.md)."""
    if not comm.is_main_process() or not results:
        return
    os.makedirs(output_dir, exist_ok=True)
    datasets = tuple(datasets)
    warnings = list(warnings)
    for dataset, tasks in flatten_results(results, datasets).items():
        values = [value for metrics in tasks.values() for value in metrics.values()]
        if values and all(isinstance(value, float) and math.isnan(value) for value in values):
            warnings.append(f"Every AP on {dataset or 'the test set'} is NaN (written nan in results.md, null in "
                            "results.json): detectron2 reports NaN when the model detected nothing (a model early in "
                            f"its training, or a score threshold ({threshold_setting}) above every score; no masks are "
                            "scored then), or when the test set has no annotation COCO's evaluation counts (none, or "
                            "every one iscrowd).")
            logger.warning(warnings[-1])
    markdown = results_markdown(results, datasets)
    if test_settings:
        markdown += "\nTest settings: " + ", ".join(f"`{key} {value!r}`" for key, value in test_settings.items()) + "\n"
    if evaluated:
        markdown += f"\nWeights evaluated: `{evaluated['path']}` (SHA-256 {evaluated['sha256']})\n"
    if drawings:
        markdown += f"\nPrediction drawings: {drawings} in `{VIS_FOLDER}{os.sep}`, made after these results\n"
    if warnings:
        markdown += "\n## Warnings\n\ngwdet warned of these while the run ran (log.txt has them in their place):\n\n" + \
            "".join(f"- {message}\n" for message in dict.fromkeys(warnings))
    write_text_atomically(os.path.join(output_dir, RESULTS_MARKDOWN), markdown)
    # results.json is what gwdet reads again (the study counts a cell done by it): its SHA-256 is recorded beside it
    write_text_with_checksum(os.path.join(output_dir, RESULTS_JSON),
                             json.dumps(results_record(results, datasets, run_datasets, evaluated, initial, segments,
                                                        test_settings, list(dict.fromkeys(warnings)), drawings),
                                         indent=2))


def check_log_written(output_dir: str) -> None:
    """Refuse to report success for a run whose ``log.txt`` could not be written (main process):
    Python's logging prints each failed write on stderr and goes on, so the run would end with exit
    status 0 and a ``results.md`` that sends the reader to a log that is not there."""
    path = os.path.join(output_dir, LOG_NAME)
    error = unwritten_log_error(path) if comm.is_main_process() else None
    if error is None:
        return
    reason = error.strerror or str(error)
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        raise GwdetOSError(f"The disk of {output_dir} is full ({reason}: {path}): the run's log could not be written, "
                           f"so {path} lacks its lines (the console had them). Free space there; the run's other files "
                           "were written (a write that failed would have stopped it).") from error
    raise GwdetOSError(f"{path} could not be written ({reason}): the run's log lacks its lines (the console had them). "
                       "Check that file and its disk; the run's other files were written (a write that failed would "
                       "have stopped it).") from error


def log_outputs(output_dir: str, wrote_results: bool, drawings: Sequence[str], drawings_setting: str,
                warnings: int = 0, test_datasets: Sequence[str] = ()) -> None:
    """The run's last log lines (main process): the Triton kernels that could not run and were
    computed by the ``accelerator`` plan instead, if any; where ``results.md`` / ``results.json`` are (when
    ``wrote_results``), with the number of ``warnings`` gwdet logged that they list, and the prediction
    drawings ``drawings`` (of the first of ``test_datasets``, the others named as not drawn), or why
    there are none (``drawings_setting``: the setting that asks for them, e.g. ``TEST.VIS_IMAGES``)."""
    if not comm.is_main_process():
        return
    if fallback_reason():  # said at the first call, on stderr only; log.txt holds it from here
        logger.warning(describe_plans())
    if wrote_results:
        where = (f"Results: {os.path.join(output_dir, RESULTS_MARKDOWN)} and {RESULTS_JSON} (with the package "
                 "versions and dataset checksums)")
        if warnings:
            where += (f"; gwdet warned {'once' if warnings == 1 else f'{warnings} times'} in this run (read the "
                      f"warning{'' if warnings == 1 else 's'} under Warnings in {RESULTS_MARKDOWN})")
    else:
        where = f"No results: nothing was evaluated (no test set); the run is in {output_dir}"
    if drawings:
        count = f"{len(drawings)} PNG file{'' if len(drawings) == 1 else 's'}"
        drawn = f" of {test_datasets[0]}" if test_datasets else ""
        pictures = f"prediction drawings{drawn}: {os.path.dirname(drawings[0])}{os.sep} ({count})"
        if len(test_datasets) > 1:
            pictures += (f"; {', '.join(test_datasets[1:])} not drawn (the drawings are of the first test set, "
                         f"{test_datasets[0]})")
    else:
        pictures = f"no prediction drawings ({drawings_setting} is 0 or there is no test set)"
    logger.info(f"{where}; {pictures}.")
