"""Training and evaluation entry points shared by gwdet's tools (``tools/train_net.py``).

:class:`Trainer` is detectron2's ``DefaultTrainer`` evaluating with ``COCOEvaluator`` (pycocotools'
COCOeval). :func:`setup` builds the config from the command line and prepares the datasets it names;
:func:`main` trains (or evaluates with ``--eval-only``), then writes the AP tables as markdown and,
when ``TEST.VIS_IMAGES`` > 0 and there is a test set, PNGs of predictions on its first images.

A LazyConfig (a ``.py`` config) takes the same way through :func:`main`, into
:mod:`gwdet.engine.lazy`, which shares this module's run-folder checks, results files, model
wrapping, writers and signal checkpointing (:func:`check_output_request`, :func:`evaluation_target`,
:func:`write_results_to`, :func:`training_ddp_model`, :func:`run_writers`, :func:`with_signal_checkpoints`).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import weakref
from collections import OrderedDict
from typing import Any, Callable, Mapping, Sequence

import torch

from detectron2.config import CfgNode
from detectron2.engine import (
    AMPTrainer,
    DefaultTrainer,
    SimpleTrainer,
    TrainerBase,
    create_ddp_model,
    default_argument_parser,
    default_setup,
)
from detectron2.engine.hooks import EvalHook
from detectron2.evaluation import COCOEvaluator
from detectron2.utils import comm
from detectron2.utils.events import CommonMetricPrinter, EventWriter, JSONWriter, TensorboardXWriter
from detectron2.utils.logger import setup_logger

from gwdet.errors import GwdetValueError
from gwdet.utils.atomic import write_text_atomically, write_text_with_checksum
from gwdet.utils.cli_errors import add_verbose_argument, tool_name
from gwdet.checkpoint.resilient import RandomState, ResilientCheckpointer
from gwdet.checkpoint.signal_hook import CheckpointOnSignal
from gwdet.config_checks import check_gwdet_config
from gwdet.data import prepare_datasets
from gwdet.data.datasets import config_dataset_names
from gwdet.layers.plans import describe_plans
from gwdet.data.finite_images import FiniteImageBatches
from gwdet.data.resumable import build_resumable_train_loader, skip_trained_samples
from gwdet.model_zoo import resolve_config_argument
from gwdet.model_zoo.loading import build_config
from gwdet.modeling import check_model
from gwdet.modeling.build import check_device
from gwdet.modeling.model_checks import check_norm_weight_decay
from gwdet.engine.output_dir import (
    OutputDirLock,
    check_fresh_start,
    check_resume_config,
    evaluation_folder,
    record_config_checksum,
    tagged_checkpoint,
    trim_metrics,
)
from gwdet.solver import build_optimizer
from gwdet.engine.run_environment import ENVIRONMENT_KEY, run_environment
from gwdet.engine.run_log import HeldRecords
from gwdet.engine.tables import Column, Table
from gwdet.engine.threads import thread_request
from gwdet.engine.visualize import save_prediction_pngs

RESULTS_MARKDOWN = "results.md"
RESULTS_JSON = "results.json"
VIS_FOLDER = "vis"


class MetricsFileWriter(EventWriter):
    """detectron2's ``JSONWriter`` of ``metrics.json`` that opens the file at its first write.

    The trainer's writers are built with its hooks, before ``--resume`` loads the checkpoint and
    :func:`gwdet.engine.output_dir.trim_metrics` replaces the file with the records the resumed run keeps:
    a ``JSONWriter`` opened before that would append to the replaced file and lose every record of
    the resumed run."""

    def __init__(self, path: str, window_size: int = 20) -> None:
        self.path, self.window_size = path, window_size
        self._writer: JSONWriter | None = None

    def write(self) -> None:
        if self._writer is None:
            self._writer = JSONWriter(self.path, self.window_size)
        self._writer.write()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def run_writers(output_dir: str, max_iter: int) -> list:
    """detectron2's ``default_writers`` (console, ``metrics.json``, TensorBoard events), with
    ``metrics.json`` written by a :class:`MetricsFileWriter`."""
    os.makedirs(output_dir, exist_ok=True)
    return [CommonMetricPrinter(max_iter), MetricsFileWriter(os.path.join(output_dir, "metrics.json")),
            TensorboardXWriter(output_dir)]


def training_ddp_model(model: torch.nn.Module, **options) -> torch.nn.Module:
    """detectron2's ``create_ddp_model(model, **options)``; a CPU model is wrapped without
    ``device_ids`` (detectron2 pins a GPU index, which PyTorch rejects for a CPU model)."""
    on_cpu = next(model.parameters()).device.type == "cpu"
    return create_ddp_model(model, **options, **({"device_ids": None} if on_cpu else {}))


def with_signal_checkpoints(hooks: list) -> list:
    """``hooks`` with :class:`CheckpointOnSignal` placed before the (first) ``EvalHook``: after the
    LR scheduler and the periodic checkpointer, before evaluation and the writers."""
    evaluation = next(i for i, hook in enumerate(hooks) if isinstance(hook, EvalHook))
    return hooks[:evaluation] + [CheckpointOnSignal()] + hooks[evaluation:]


class InnerTrainerState:
    """``TrainerBase``'s checkpointed state (iteration, hooks) plus that of the wrapped
    ``SimpleTrainer`` / ``AMPTrainer`` in ``_trainer`` (its optimizer: SGD momentum continues on
    ``--resume``). detectron2 0.7's ``DefaultTrainer`` does this itself; 0.6's and ``TrainerBase``
    do not (:class:`gwdet.engine.lazy.LazyTrainer`)."""

    _trainer: Any

    def state_dict(self) -> dict:
        state = super().state_dict()  # type: ignore[misc]
        state["_trainer"] = self._trainer.state_dict()
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)  # type: ignore[misc]
        if "_trainer" in state_dict:
            self._trainer.load_state_dict(state_dict["_trainer"])


_OPTIMIZER_STATE: tuple[type, ...] = () if "state_dict" in DefaultTrainer.__dict__ else (InnerTrainerState,)


class Trainer(*_OPTIMIZER_STATE, DefaultTrainer):  # type: ignore[misc]
    """``DefaultTrainer`` evaluating with ``COCOEvaluator`` (box, and mask when masks are on), whose
    checkpoints survive a killed run and whose ``--resume`` continues the data and random streams
    where they stopped (see :mod:`gwdet.checkpoint.resilient`, :mod:`gwdet.data.resumable`)."""

    def __init__(self, cfg: CfgNode) -> None:
        # DefaultTrainer's construction, in its order, with three differences: a CPU model is wrapped
        # in DistributedDataParallel without device_ids (detectron2 pins a GPU index, which PyTorch
        # rejects for a CPU model), the train loader's batches are checked for non-finite pixels
        # (gwdet.data.finite_images), and the checkpointer is gwdet's ResilientCheckpointer.
        TrainerBase.__init__(self)
        if not logging.getLogger("detectron2").isEnabledFor(logging.INFO):
            setup_logger()
        cfg = DefaultTrainer.auto_scale_workers(cfg, comm.get_world_size())
        model = self.build_model(cfg)
        optimizer = self.build_optimizer(cfg, model)
        data_loader = FiniteImageBatches(self.build_train_loader(cfg))
        model = training_ddp_model(model, broadcast_buffers=False)
        trainer_class = AMPTrainer if cfg.SOLVER.AMP.ENABLED else SimpleTrainer
        self._trainer = trainer_class(model, data_loader, optimizer)
        self.scheduler = self.build_lr_scheduler(cfg, optimizer)
        self.checkpointer = ResilientCheckpointer(
            model, cfg.OUTPUT_DIR, random_state=RandomState(), trainer=weakref.proxy(self)
        )
        self.start_iter = 0
        self.max_iter = cfg.SOLVER.MAX_ITER
        self.cfg = cfg
        self.register_hooks(self.build_hooks())

    @classmethod
    def build_model(cls, cfg: CfgNode) -> torch.nn.Module:
        """detectron2's ``build_model`` after :func:`gwdet.check_gwdet_config`, then
        :func:`gwdet.check_model` (norms with batch statistics shared across FPN levels, group
        numbers the layers could not use)."""
        check_gwdet_config(cfg)
        check_device(cfg)
        return check_model(super().build_model(cfg), strict_groups=cfg.MODEL.STRICT_NORM_GROUPS)

    @classmethod
    def build_optimizer(cls, cfg: CfgNode, model: torch.nn.Module) -> torch.optim.Optimizer:
        """detectron2's optimizer in which gwdet's norm layers get ``SOLVER.WEIGHT_DECAY_NORM`` like
        detectron2's own (:func:`gwdet.build_optimizer`), checked by :func:`check_norm_weight_decay`."""
        optimizer = build_optimizer(cfg, model)
        check_norm_weight_decay(model, optimizer, cfg.SOLVER.WEIGHT_DECAY_NORM, cfg.SOLVER.WEIGHT_DECAY_BIAS)
        return optimizer

    @classmethod
    def build_train_loader(cls, cfg: CfgNode):
        try:
            return build_resumable_train_loader(cfg)
        except AssertionError as err:
            if "No valid data" not in str(err):
                raise
            raise GwdetValueError(
                f"None of the images of {', '.join(cfg.DATASETS.TRAIN)} has an annotation to train on: "
                "check that the json's 'annotations' list is there and refers to its 'images' ids "
                "(or set DATALOADER.FILTER_EMPTY_ANNOTATIONS False to train on empty images)."
            ) from err

    def build_hooks(self) -> list:
        """detectron2's hooks plus :class:`CheckpointOnSignal` (SIGTERM, SIGINT and SIGUSR2 save a
        checkpoint of the current iteration before training stops), placed after the LR scheduler
        and the periodic checkpointer, before evaluation and the writers."""
        return with_signal_checkpoints(super().build_hooks())

    def build_writers(self) -> list:
        """detectron2's writers, ``metrics.json`` opened once a resume has trimmed it (:func:`run_writers`)."""
        return run_writers(self.cfg.OUTPUT_DIR, self.max_iter)

    def train(self):
        """Train; return the final COCO results (detectron2's EvalHook stores them on the trainer)."""
        super().train()
        return getattr(self, "_last_eval_results", None)

    def resume_or_load(self, resume: bool = True) -> None:
        super().resume_or_load(resume=resume)
        if self.start_iter > 0 and comm.is_main_process():
            trim_metrics(self.cfg.OUTPUT_DIR, self.start_iter)
        if self.start_iter > 0 and not skip_trained_samples(self._trainer.data_loader, self.cfg, self.start_iter):
            logging.getLogger(__name__).warning(
                "The train loader was not built by gwdet's build_train_loader: it restarts its sample "
                "stream on resume instead of continuing where the interrupted run stopped."
            )

    @classmethod
    def build_evaluator(cls, cfg: CfgNode, dataset_name: str, output_folder: str | None = None):
        output_folder = output_folder or os.path.join(cfg.OUTPUT_DIR, "inference", dataset_name)
        return COCOEvaluator(dataset_name, output_dir=output_folder)


def argument_parser() -> argparse.ArgumentParser:
    """detectron2's parser (``--config-file``, ``--resume``, ``--eval-only``, ``--num-gpus``, ...)
    plus ``--overwrite``, ``--threads``, ``--register-coco NAME=JSON:IMAGE_ROOT`` (repeatable: your
    own COCO-format data as dataset NAME, its files checked as the flag is read; see
    :mod:`gwdet.data.coco_registration`) and ``--verbose``. The train tool adds the launcher flags
    (:func:`gwdet.cluster.training.argument_parser`).

    ``--config`` works as well: argparse accepts it as the unambiguous prefix of ``--config-file``.
    """
    from gwdet.data import add_register_coco_argument

    parser = default_argument_parser()
    add_register_coco_argument(parser)
    parser.add_argument("--threads", type=thread_request, default=None, metavar="N|auto-load",
                        help="CPU threads per process (default: the CPUs this process may use: affinity mask, "
                             "cgroup CPU quota, SLURM_CPUS_PER_TASK, shared by the --num-gpus processes; "
                             "auto-load: the CPUs other processes leave free at start; see gwdet.engine.threads)")
    parser.add_argument("--overwrite", action="store_true",
                        help="train from iteration 0 into an OUTPUT_DIR that holds an earlier run, "
                             "deleting that run's checkpoints, metrics and results first")
    add_verbose_argument(parser)
    return parser


def check_process_counts(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A usage error (``parser.error``) for a process or thread count no run can have: ``--num-gpus``,
    ``--num-machines`` or ``--threads`` below 1, a ``--machine-rank`` outside 0 .. --num-machines - 1."""
    if args.num_gpus < 1:
        parser.error(f"--num-gpus {args.num_gpus}: give the number of processes to start on this machine, at "
                     "least 1 (one per GPU; on a machine without a GPU, that many CPU processes).")
    if args.num_machines < 1:
        parser.error(f"--num-machines {args.num_machines}: give the number of machines of the run, at least 1.")
    if not 0 <= args.machine_rank < args.num_machines:
        parser.error(f"--machine-rank {args.machine_rank}: give this machine's index, from 0 to "
                     f"--num-machines - 1 = {args.num_machines - 1}.")
    if isinstance(args.threads, int) and args.threads < 1:
        parser.error(f"--threads {args.threads}: give the CPU threads of each process, at least 1 (or leave "
                     "the flag out to use the CPUs this process may use).")


def parse_args(argv: Sequence[str] | None = None, parser: argparse.ArgumentParser | None = None) -> argparse.Namespace:
    """The arguments of ``parser`` (default: :func:`argument_parser`); flags may also follow the
    ``KEY VALUE`` overrides (``... SOLVER.MAX_ITER 10 --resume``)."""
    parser = parser or argument_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    given = [token for token in argv if token.split("=", 1)[0] in ("--config-file", "--config")]
    if len(given) > 1:
        parser.error("--config-file is given more than once; a second one would replace the first. Give one "
                     "config file, and put what the other changes in it (_BASE_) or as KEY VALUE overrides.")
    args = parser.parse_args(argv)
    opts, flags = [], []
    tokens = iter(args.opts)
    for token in tokens:
        if not token.startswith("--"):
            opts.append(token)
            continue
        action = parser._option_string_actions.get(token.split("=", 1)[0])
        if action is None:
            parser.error(f"unknown flag {token!r} among the KEY VALUE overrides")
        flags.append(token)
        if action.nargs is None and "=" not in token:  # the flag takes one value
            flags.append(next(tokens, ""))
    if flags:
        args = parser.parse_args(flags, namespace=args)
    args.opts = opts
    check_process_counts(parser, args)
    resolve_config_argument(parser, args)
    return args


def check_training_values(cfg: CfgNode, world_size: int) -> None:
    """Refuse, before anything is built, solver and dataset values a training run cannot start
    with (detectron2 would stop later with a bare assertion): no training dataset, no iteration,
    a batch of no images or one that cannot be split evenly over the ``world_size`` processes."""
    if not cfg.DATASETS.TRAIN:
        raise GwdetValueError("DATASETS.TRAIN is empty: name the dataset(s) to train on, e.g. DATASETS.TRAIN "
                              "\"('shapes_train',)\" (or evaluate weights with --eval-only).")
    if cfg.SOLVER.MAX_ITER < 1:
        raise GwdetValueError(f"SOLVER.MAX_ITER is {cfg.SOLVER.MAX_ITER}: a run trains for at least 1 iteration.")
    batch = cfg.SOLVER.IMS_PER_BATCH
    if batch < 1 or batch % world_size:
        raise GwdetValueError(
            f"SOLVER.IMS_PER_BATCH is {batch}, which {world_size} process(es) (--num-gpus x --num-machines) "
            f"cannot share evenly: use a positive multiple of {world_size} (it is the batch of all processes together).")


def check_output_request(args: argparse.Namespace, output_dir: str, weights: str, *,
                         check_resume: Callable[[], None], weights_setting: str = "MODEL.WEIGHTS path/to/model_final.pth",
                         output_setting: str = "OUTPUT_DIR") -> None:
    """Refuse, before anything is written or loaded, a run that would evaluate a model nobody chose
    or write over another run (``--eval-only`` / ``--resume`` / ``--overwrite`` of ``args``), for a
    run into ``output_dir`` whose initial weights are ``weights``. ``check_resume`` refuses a
    ``--resume`` of another model; ``weights_setting`` and ``output_setting`` are how the messages
    name the config's settings (yacs: ``MODEL.WEIGHTS ...``, ``OUTPUT_DIR``)."""
    if args.resume and getattr(args, "overwrite", False):
        raise GwdetValueError(
            f"--resume continues the run in {output_setting} and --overwrite deletes it: give one of them.")
    if args.eval_only:
        if args.resume:
            tagged_checkpoint(output_dir)
        elif not weights:
            raise GwdetValueError(
                f"--eval-only needs trained weights: add {weights_setting} (or "
                f"--resume to evaluate the checkpoint {output_setting}/last_checkpoint names); without them the "
                "model would be randomly initialized.")
        return
    if args.resume:
        check_resume()
    else:
        check_fresh_start(output_dir, getattr(args, "overwrite", False))


def check_run_request(cfg: CfgNode, args: argparse.Namespace) -> None:
    """Refuse, before anything is written or loaded, a run that would evaluate a model nobody chose
    or write over another run (``--eval-only`` / ``--resume`` / ``--overwrite`` of ``args``)."""
    check_output_request(args, cfg.OUTPUT_DIR, cfg.MODEL.WEIGHTS,
                         check_resume=lambda: check_resume_config(cfg, cfg.OUTPUT_DIR))


def evaluation_target(args: argparse.Namespace, output_dir: str, weights: str, output_setting: str = "OUTPUT_DIR") -> tuple[str, str]:
    """``--eval-only``: the weights to evaluate (``weights``, or with ``--resume`` the checkpoint
    ``output_dir/last_checkpoint`` names) and the folder to write to
    (:func:`gwdet.engine.output_dir.evaluation_folder`), logged when that is not ``output_dir``."""
    weights = tagged_checkpoint(output_dir) if args.resume else weights
    folder = evaluation_folder(output_dir, weights)
    if folder != output_dir:
        logging.getLogger(__name__).info(
            f"{output_setting} {output_dir} holds a run: the evaluation of {weights} is written to {folder}, "
            "and the run's own files stay as they are.")
    return weights, folder


def evaluation_request(cfg: CfgNode, args: argparse.Namespace) -> tuple[CfgNode, argparse.Namespace]:
    """``--eval-only``: the config and arguments that evaluate exactly the chosen weights
    (``MODEL.WEIGHTS``, or with ``--resume`` the checkpoint ``last_checkpoint`` names) into a folder
    of their own when ``OUTPUT_DIR`` holds a run (:func:`gwdet.engine.output_dir.evaluation_folder`)."""
    check_run_request(cfg, args)
    weights, output_dir = evaluation_target(args, cfg.OUTPUT_DIR, cfg.MODEL.WEIGHTS)
    cfg = cfg.clone()
    cfg.defrost()
    cfg.MODEL.WEIGHTS, cfg.OUTPUT_DIR = weights, output_dir
    cfg.freeze()
    return cfg, argparse.Namespace(**{**vars(args), "resume": False})


def setup(args: argparse.Namespace, cfg: CfgNode | None = None) -> CfgNode:
    """Config from the command line (or ``cfg``), its datasets registered and checked
    (``--register-coco``), the run request checked, detectron2's logging/output set-up, datasets ready.

    A dataset the config cannot use (a ``--register-coco`` file that fails its checks, a number of
    classes or categories that do not match, a dataset name nobody registered) stops here, before
    detectron2's set-up writes the run's config and log: ``PROG: error: ...`` on one line, no
    traceback, exit status 2, as the tools report their other refusals (:class:`gwdet.data.DatasetError`).
    What the checks log (the ``--resume`` warning about changed values) is held until the run's
    logger writes ``log.txt``, then logged there and on the console (:class:`HeldRecords`).
    """
    from gwdet.data import DatasetError, register_datasets

    cfg = cfg if cfg is not None else build_config(args.config_file, args.opts)
    with HeldRecords():
        try:
            register_datasets(cfg, getattr(args, "register_coco", ()))
        except DatasetError as error:
            print(f"{tool_name()}: error: {error}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None
        if comm.is_main_process():
            check_run_request(cfg, args)
        default_setup(cfg, args)
        if comm.is_main_process():
            record_config_checksum(cfg.OUTPUT_DIR)  # what --resume checks config.yaml against
        setup_logger(cfg.OUTPUT_DIR, distributed_rank=comm.get_rank(), name="gwdet")  # gwdet's messages in log.txt too
    logging.getLogger(__name__).info(describe_plans())
    prepare_datasets(cfg)
    return cfg


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
            table = Table([Column(name, fmt="{:.2f}") for name in names], [{name: metrics[name] for name in names}])
            lines += [f"### {title}", "", table.markdown(), ""]
    return "\n".join(lines)


def results_record(results: Mapping, datasets: Sequence[str] = (), run_datasets: Sequence[str] = ()) -> dict:
    """What ``results.json`` holds: ``{dataset: {task: {metric: value}}}`` of ``results`` for the
    test sets ``datasets`` (:func:`flatten_results`), and under ``"environment"`` the package
    versions and the annotation files of ``run_datasets`` (every dataset the run trained or
    evaluated on) with their SHA-256 (:func:`gwdet.engine.run_environment.run_environment`)."""
    record = dict(flatten_results(results, datasets))
    if ENVIRONMENT_KEY in record:
        raise GwdetValueError(f"A test dataset is named {ENVIRONMENT_KEY!r}, the key under which results.json records "
                              f"the run's environment: register the dataset under another name. (results.md holds "
                              f"its results.)")
    record[ENVIRONMENT_KEY] = run_environment([*run_datasets, *datasets])
    return record


def write_results_to(output_dir: str, results: Mapping, datasets: Sequence[str] = (),
                     run_datasets: Sequence[str] = ()) -> None:
    """``output_dir/results.md`` and ``results.json`` (:func:`results_record`) of ``results`` for the
    test sets ``datasets`` of a run on ``run_datasets`` (main process only; nothing without results)."""
    if not comm.is_main_process() or not results:
        return
    os.makedirs(output_dir, exist_ok=True)
    datasets = tuple(datasets)
    write_text_atomically(os.path.join(output_dir, RESULTS_MARKDOWN), results_markdown(results, datasets))
    # results.json is what gwdet reads again (the study counts a cell done by it): its SHA-256 is recorded beside it
    write_text_with_checksum(os.path.join(output_dir, RESULTS_JSON),
                             json.dumps(results_record(results, datasets, run_datasets), indent=2))


def write_results(cfg: CfgNode, results: Mapping) -> None:
    """``OUTPUT_DIR/results.md`` and ``results.json`` (main process only)."""
    write_results_to(cfg.OUTPUT_DIR, results, cfg.DATASETS.TEST, config_dataset_names(cfg))


def log_outputs(output_dir: str, wrote_results: bool, drawings: Sequence[str], drawings_setting: str) -> None:
    """The run's last log line (main process): where ``results.md`` / ``results.json`` are (when
    ``wrote_results``) and the prediction drawings ``drawings``, or why there are none
    (``drawings_setting``: the setting that asks for them, e.g. ``TEST.VIS_IMAGES``)."""
    if not comm.is_main_process():
        return
    if wrote_results:
        where = (f"Results: {os.path.join(output_dir, RESULTS_MARKDOWN)} and {RESULTS_JSON} (with the package "
                 "versions and dataset checksums)")
    else:
        where = f"No results: nothing was evaluated (no test set); the run is in {output_dir}"
    if drawings:
        count = f"{len(drawings)} PNG file{'' if len(drawings) == 1 else 's'}"
        pictures = f"prediction drawings: {os.path.dirname(drawings[0])}{os.sep} ({count})"
    else:
        pictures = f"no prediction drawings ({drawings_setting} is 0 or there is no test set)"
    logging.getLogger(__name__).info(f"{where}; {pictures}.")


def main(args: argparse.Namespace):
    """Train (or evaluate with ``--eval-only``) the model ``args`` describe; return COCO results.

An evaluation of weights into a folder that holds a run writes to ``OUTPUT_DIR/eval/<checkpoint>/``
(:func:`evaluation_request`).
    The main process holds a lock on OUTPUT_DIR for the whole run. A LazyConfig (``.py``) is
    trained by :func:`gwdet.engine.lazy.main` with the same rules.
    """
    from gwdet.engine.lazy import is_lazy_config

    if is_lazy_config(args.config_file):
        from gwdet.engine.lazy import main as lazy_main

        return lazy_main(args)
    cfg = build_config(args.config_file, args.opts)
    if args.eval_only:
        cfg, args = evaluation_request(cfg, args)
    with OutputDirLock(cfg.OUTPUT_DIR) if comm.is_main_process() else contextlib.nullcontext():
        cfg = setup(args, cfg)
        if args.eval_only:
            model = Trainer.build_model(cfg)
            checkpointer = ResilientCheckpointer(model, save_dir=cfg.OUTPUT_DIR, require_every_weight=True)
            checkpointer.load_weights(cfg.MODEL.WEIGHTS)
            results = Trainer.test(cfg, model)
        else:
            check_training_values(cfg, comm.get_world_size())
            trainer = Trainer(cfg)
            trainer.resume_or_load(resume=args.resume)
            results = trainer.train()
            model = trainer.model
        write_results(cfg, results)
        drawings: list[str] = []
        if comm.is_main_process() and cfg.TEST.VIS_IMAGES > 0 and cfg.DATASETS.TEST:  # no test set: nothing to draw
            vis_folder = os.path.join(cfg.OUTPUT_DIR, VIS_FOLDER)
            drawings = save_prediction_pngs(cfg, model, cfg.DATASETS.TEST[0], cfg.TEST.VIS_IMAGES, vis_folder)
    log_outputs(cfg.OUTPUT_DIR, bool(results), drawings, "TEST.VIS_IMAGES")
    return results
