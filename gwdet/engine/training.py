"""What gwdet's two trainers add to detectron2's training loop, in one place.

:class:`gwdet.engine.trainer.Trainer` (a yacs config: detectron2's ``DefaultTrainer``) and
:class:`gwdet.engine.lazy.LazyTrainer` (a LazyConfig: the loop of detectron2's
``tools/lazyconfig_train_net.py``) differ only in how they build their parts. Both:

* check every training batch for non-finite pixels before the model sees it
  (:class:`~gwdet.data.finite_images.FiniteImageBatches` around the train loader);
* save a checkpoint of the current iteration on SIGTERM, SIGINT, SIGHUP and SIGUSR2 (:func:`with_signal_checkpoints`);
* write ``metrics.json`` with a writer that opens it only after a resume trimmed it (:func:`run_writers`);
* continue a resumed run where it stopped: its metrics trimmed to the iterations kept, its train
  loader positioned after the samples already trained (:func:`continue_after_resume`), its
  optimizer with the config's values (:func:`configured_optimizer_values`);
* checkpoint the inner ``SimpleTrainer``'s optimizer state where detectron2 does not (:class:`InnerTrainerState`).
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import traceback
import weakref
from typing import Any, Iterable, Iterator, Sequence

import torch
from fvcore.common.history_buffer import HistoryBuffer

from detectron2.engine import AMPTrainer, HookBase, SimpleTrainer, TrainerBase, create_ddp_model
from detectron2.engine.hooks import EvalHook, PeriodicWriter, PreciseBN
from detectron2.solver import LRMultiplier
from detectron2.utils import comm
from detectron2.utils.env import seed_all_rng
from detectron2.utils.events import CommonMetricPrinter, EventWriter, JSONWriter, TensorboardXWriter

from gwdet.checkpoint.resilient import CONTENTS_KEY, IMAGES_KEY, RandomState, ResilientCheckpointer
from gwdet.checkpoint.resume_order import checkpoint_names
from gwdet.checkpoint.signal_hook import CheckpointOnSignal
from gwdet.data.coco_registration import coco_dataset
from gwdet.data.datasets import dataset_classes
from gwdet.data.resumable import skip_trained_samples
from gwdet.layers.common import is_whole_number
from gwdet.errors import GwdetFileExistsError, GwdetRuntimeError, GwdetTypeError, GwdetValueError, listed
from gwdet.utils.cli_errors import output_path_problem
from gwdet.engine.output_dir import (OutputDirLock, OutputDirNotWritableError, config_differences, lock_holder,
                                     keep_replaced_final, set_aside_later_checkpoints, set_aside_results,
                                     trim_metrics)
from gwdet.engine.run_environment import annotation_files, run_segment
from gwdet.modeling.build import check_build_state
from gwdet.utils.run_file_names import METRICS_JSON

logger = logging.getLogger(__name__)


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
    return [CommonMetricPrinter(max_iter), MetricsFileWriter(os.path.join(output_dir, METRICS_JSON)),
            TensorboardXWriter(output_dir)]


def training_ddp_model(model: torch.nn.Module, **options) -> torch.nn.Module:
    """detectron2's ``create_ddp_model(model, **options)``; a CPU model is wrapped without
    ``device_ids`` (detectron2 pins a GPU index, which PyTorch rejects for a CPU model)."""
    on_cpu = next(model.parameters()).device.type == "cpu"
    return create_ddp_model(model, **options, **({"device_ids": None} if on_cpu else {}))


def training_loop(model: torch.nn.Module, loader: Iterable, optimizer: torch.optim.Optimizer, amp: bool,
                  **ddp_options: Any) -> SimpleTrainer:
    """detectron2's training loop (``AMPTrainer`` with ``amp``, else ``SimpleTrainer``) of ``model``
    as :func:`training_ddp_model` wraps it."""
    return (AMPTrainer if amp else SimpleTrainer)(training_ddp_model(model, **ddp_options), loader, optimizer)


def training_checkpointer(trainer: TrainerBase, output_dir: str, datasets: Sequence[str],
                          weights_setting: str = "MODEL.WEIGHTS") -> ResilientCheckpointer:
    """The checkpointer of ``trainer``'s model (built, its loop in ``trainer._trainer``): it saves the
    random streams and the trainer's state too, and records the class names and the annotation files
    of the training ``datasets`` (checked when the run resumes) and what each stretch of a resumed
    run trained with (:func:`~gwdet.engine.run_environment.run_segment` when it saves: Triton kernels
    that could not run by then are named)."""
    files = {name: {key: record[key] for key in ("json_file", "json_sha256", "image_root")}
             for name, record in annotation_files(datasets).items()}
    for name, record in files.items():  # a COCO dataset's images, told apart by their fingerprints
        dataset = coco_dataset(name)
        if dataset is not None:
            record[IMAGES_KEY] = dataset.read.fingerprints
            record[CONTENTS_KEY] = dataset.read.json_content_sha256
    return ResilientCheckpointer(trainer._trainer.model, output_dir, random_state=RandomState(),
                                 trainer=weakref.proxy(trainer), weights_setting=weights_setting,
                                 classes=dataset_classes(datasets), training_data=files, segment=run_segment)


@contextlib.contextmanager
def random_streams_kept() -> Iterator[None]:
    """Run the block (an evaluation during training) and then put torch's (CPU and CUDA), numpy's and
    Python's random generators back as they were: an evaluation draws from them (each test loader's
    iterator draws its seed from torch's), and would otherwise change every later sampling decision
    of the training, so that a run with periodic evaluations trained other weights than one without."""
    saved = RandomState().state_dict()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        RandomState.restore(saved)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


# Set on a config (an attribute beside its keys, copied with it by clone()) once detectron2's
# default_setup has seeded the random generators with its SEED / train.seed, as the tools call it
SEEDED_MARK = "_gwdet_seeded"


def mark_seeded(cfg: Any) -> None:
    """Note on ``cfg`` that detectron2's ``default_setup`` seeded the random generators with its seed."""
    object.__setattr__(cfg, SEEDED_MARK, True)  # not a config key


def seed_as_the_tools_do(cfg: Any, seed: Any, setting: str) -> None:
    """Seed the random generators with the config's ``seed`` (``setting``) plus the process's rank,
    as detectron2's ``default_setup`` does in the tools, unless it did for this config
    (:func:`mark_seeded`): a trainer built from one's own code then draws the initial weights the
    tool's run of the config draws. A negative seed leaves them as they are (random)."""
    if getattr(cfg, SEEDED_MARK, False) or not is_whole_number(seed) or seed < 0:
        return
    seed_all_rng(seed + comm.get_rank())
    logger.info(f"Seeded the random generators with {setting} {seed} (plus the process's rank), as the tools do.")


def check_config_kind(cfg: Any, yacs: bool) -> None:
    """Refuse a trainer's config of the other kind, or given as a path: ``Trainer`` takes a yacs
    config (``CfgNode``), ``LazyTrainer`` a LazyConfig (omegaconf's ``DictConfig``)."""
    from detectron2.config import CfgNode
    from omegaconf import DictConfig

    if isinstance(cfg, CfgNode if yacs else DictConfig):
        return
    trainer, other = ("Trainer", "LazyTrainer") if yacs else ("LazyTrainer", "Trainer")
    wanted = "a yacs config (CfgNode)" if yacs else "a LazyConfig (omegaconf's DictConfig)"
    if isinstance(cfg, (str, os.PathLike)):
        fix = ("load the file first: gwdet.model_zoo.build_config(path, opts) for a yacs file, detectron2's "
               "LazyConfig.load(path) for a LazyConfig")
    elif isinstance(cfg, DictConfig if yacs else CfgNode):
        fix = f"for {'a LazyConfig' if yacs else 'a yacs config'}, build gwdet's {other} " \
              f"(gwdet.engine.{'lazy' if yacs else 'trainer'}.{other})"
    else:
        fix = f"give {trainer} the config of the run"
    given = f"the {type(cfg).__name__} {os.fspath(cfg)!r}" if isinstance(cfg, (str, os.PathLike)) else \
        f"a {type(cfg).__name__}" if isinstance(cfg, (CfgNode, DictConfig)) else f"{cfg!r} ({type(cfg).__name__})"
    raise GwdetTypeError(f"{trainer} takes {wanted}, not {given}: {fix}.")


def check_output_folder(output_dir: Any, setting: str) -> None:
    """Refuse, before a trainer builds anything, an output folder it could not write: none (empty), a
    file, a link to nothing, a path below a file (:func:`~gwdet.utils.cli_errors.output_path_problem`)."""
    if isinstance(output_dir, os.PathLike):  # detectron2's code joins and compares it as a str
        raise GwdetTypeError(f"{setting} is {output_dir!r}, a path object: give it as a string, "
                             f"{setting} = {os.fspath(output_dir)!r} (str(path) in Python).")
    if not isinstance(output_dir, str) or not output_dir.strip():
        raise GwdetValueError(f"{setting} is {output_dir!r}: give the folder the run writes its checkpoints, metrics "
                              f"and results into (e.g. {setting} output/my_run).")
    problem = output_path_problem(setting, output_dir, folder=True)
    if problem is not None:
        raise OutputDirNotWritableError(f"{problem} Nothing was changed.")


def check_fresh_training(cfg: Any, resume: Any, output_dir: str, setting: str) -> None:
    """Refuse, for a trainer's ``resume_or_load(resume)``, a ``resume`` that is not a bool (the string
    ``"False"`` would resume), and, for a new training from one's own code (the tools check their
    folders before: :func:`mark_seeded`), an output folder holding the ``metrics.json`` or TensorBoard
    event files of an earlier training that wrote no checkpoint (stopped before its first): the new
    metrics would join them, two runs' curves in one file or one TensorBoard folder."""
    if not isinstance(resume, bool):
        raise GwdetTypeError(f"resume_or_load(resume={resume!r}): give resume as True (continue the run in the output "
                             "folder) or False (start a new one from the initial weights).")
    if resume or getattr(cfg, SEEDED_MARK, False) or not os.path.isdir(output_dir) or checkpoint_names(output_dir):
        return  # with checkpoints: another run's, refused by the checkpointer
    earlier = sorted(name for name in os.listdir(output_dir)
                     if name == METRICS_JSON or name.startswith("events.out.tfevents"))
    if earlier:
        raise GwdetFileExistsError(
            f"{setting} {output_dir!r} holds {', '.join(earlier)} of an earlier training that wrote no checkpoint (it "
            "stopped before its first): a new training there would add its metrics to them. Remove them, or train "
            f"into another {setting}.")


def check_torch_state(training: bool) -> None:
    """Refuse a run in a process whose torch state a run cannot use, as one's own code or a notebook
    may leave it: another default dtype than float32 or the meta device as the default one
    (:func:`~gwdet.modeling.build.check_build_state`), or gradients switched off (``inference_mode``
    too) for a training."""
    check_build_state("the run")
    if training and torch.is_inference_mode_enabled():
        raise GwdetValueError(
            "The run is inside torch.inference_mode() in this process, where no tensor records gradients (even with "
            "torch.set_grad_enabled(True)), so the training could not compute any: run it outside the "
            "inference_mode block.")
    if training and not torch.is_grad_enabled():
        raise GwdetValueError(
            "Gradients are switched off in this process (torch.set_grad_enabled(False), or a torch.no_grad() block "
            "around the run), so the training could not compute any: call torch.set_grad_enabled(True) before the "
            "run, or run it outside the block.")


# Set on a trainer when its train() starts: a second train() is refused, whether the first returned or stopped
TRAINED_MARK = "_gwdet_trained"
# Set on a trainer by its constructor: (its config's content, its output folder's real path) as built
BUILT_CONFIG = "_gwdet_built_config"


def note_built_config(trainer: Any, run: Any) -> None:
    """Note on ``trainer`` the config it was built from (``run``: its
    :class:`~gwdet.engine.run.RunConfig`), which :func:`training_lock` compares the config with."""
    setattr(trainer, BUILT_CONFIG, (run.request_content(), os.path.realpath(run.output_dir)))


def training_lock(trainer: Any, run: Any) -> contextlib.AbstractContextManager:
    """The output folder's lock (:class:`~gwdet.engine.output_dir.OutputDirLock`) for a trainer's
    ``resume_or_load`` and ``train()`` (``run``: the :class:`~gwdet.engine.run.RunConfig` of its
    config): taken by the main process unless it holds it already (the tools hold it for the whole
    run), so that a training from one's own code and a tool's run never write one folder at once.
    Refused where the config changed since the trainer was built (:func:`note_built_config`): its
    model, loader, optimizer, schedule and writers hold the values of the build; an output folder
    that is another one now (another value, or a relative one after a change of the working folder)
    would split the run over two folders."""
    built = getattr(trainer, BUILT_CONFIG, None)
    if built is not None:
        content, folder = built
        if os.path.realpath(run.output_dir) != folder:  # a link to the same folder is the same folder
            raise GwdetValueError(
                f"{run.output_setting} {run.output_dir!r} is now {os.path.abspath(run.output_dir)!r}, but this trainer "
                f"was built to write {folder!r} (its checkpointer, metrics and event writers write there): the run "
                f"would be split over the two folders. Build the trainer again after changing {run.output_setting} "
                "(or the working folder a relative one is read in), or set it back.")
        now = run.request_content()
        if now != content:
            changed = config_differences(json.loads(content), json.loads(now))
            raise GwdetValueError(
                f"The config changed since this trainer was built ({listed(changed, 4, '; ')}; the built value "
                "first): its model, data loader, optimizer and schedule hold the values of the build and would train "
                "with them, not with the config's. Build the trainer again after changing the config, or set it back.")
    if not comm.is_main_process() or lock_holder(run.output_dir) == f"pid {os.getpid()}":
        return contextlib.nullcontext()
    return OutputDirLock(run.output_dir, run.output_setting, run.weights_setting, note="(a trainer started from Python)")


def check_schedule_unchanged(max_iter: int, configured: Any, setting: str) -> None:
    """Refuse a ``train()`` whose trainer's ``max_iter`` is not its config's ``setting`` any more
    (either changed on a built trainer): the learning-rate schedule was built for the config's and
    would fail past its end, or stop the decay early."""
    if max_iter != configured:
        raise GwdetValueError(
            f"This trainer's max_iter is {max_iter}, but its config's {setting} is {configured!r}: the trainer and its "
            "learning-rate schedule were built for the value the config had then, and one changed since. To train "
            f"for another number of iterations, build a new trainer from a config with {setting} set to it (and call "
            "resume_or_load(resume=True) to continue this run).")


def check_not_over_another_run(trainer: Any, weights: str) -> None:
    """Before a trainer of gwdet's trains: refused where it has trained its iterations already (a
    second ``train()``, which detectron2's hooks cannot run again), and, without ``resume_or_load``
    (which checks it), where its output folder holds another run's checkpoints, which the training
    would replace, or where the config names initial ``weights``, which only ``resume_or_load``
    loads; with it, where checkpoints were written in the folder since (another trainer's)."""
    if trainer.iter >= trainer.max_iter > 0:
        raise GwdetValueError(
            f"This trainer has trained its {trainer.max_iter} iterations already (train() returned); its hooks "
            "cannot run again. To train further, build a new trainer with more iterations and call "
            "resume_or_load(resume=True) before train().")
    if getattr(trainer, TRAINED_MARK, False):  # stopped by a signal or an error: its hooks cannot run again
        raise GwdetValueError(
            f"This trainer's train() ran already and stopped at iteration {trainer.iter} (a stop signal or an error); "
            "its hooks cannot run again, and it would train over the run's checkpoints. Continue the run with a new "
            "trainer: build it and call resume_or_load(resume=True), then train().")
    setattr(trainer, TRAINED_MARK, True)
    checkpointer = getattr(trainer, "checkpointer", None)
    if isinstance(checkpointer, ResilientCheckpointer) and not checkpointer.started:
        checkpointer.check_no_earlier_run()
        if weights:
            raise GwdetValueError(
                f"{checkpointer.weights_setting} names initial weights ({weights}), which only resume_or_load loads: "
                "without it the model would train from its random initialization. Call "
                "trainer.resume_or_load(resume=False) before train() (resume=True to continue the run in the output "
                f"folder), or set {checkpointer.weights_setting} to '' to train from scratch. A subclass's own "
                "resume_or_load must call gwdet's (super().resume_or_load(resume)), which loads through the trainer's "
                "checkpointer, takes the output folder's lock and positions the data stream.")
    if isinstance(checkpointer, ResilientCheckpointer):
        checkpointer.check_folder_unchanged()
        start = checkpointer.resumed_start
        if start is not None and trainer.start_iter != start:  # detectron2's trick of setting start_iter again
            raise GwdetValueError(
                f"This trainer resumed the run at iteration {start}, but its start_iter is {trainer.start_iter} now: it "
                "would train those iterations again with the resumed schedule and optimizer state and write over the "
                "run's checkpoints of them. To start over from the weights, build a new trainer with MODEL.WEIGHTS (a "
                "LazyConfig's train.init_checkpoint) naming the checkpoint, into another output folder.")


def precise_bn_streams_kept(hooks: list) -> list:
    """``hooks`` with each of detectron2's ``PreciseBN`` hooks running its passes with the random
    generators kept (:func:`random_streams_kept`), as the evaluations do: its batches would otherwise
    draw from the training's streams, and a run with PreciseBN would train other weights."""
    for hook in hooks:
        if isinstance(hook, PreciseBN):
            hook.update_stats = random_streams_kept()(hook.update_stats)
    return hooks


def continue_precise_bn(hooks: list, start_iter: int, images_per_process: int) -> None:
    """After a resume at iteration ``start_iter``, position the loader of each of detectron2's
    ``PreciseBN`` hooks after the batches its earlier passes drew (``start_iter // period`` passes
    of ``NUM_ITER`` batches of ``images_per_process`` images): its passes draw from one stream over
    the run, which a resumed process would otherwise restart, averaging other batches than an
    uninterrupted run's. Nothing for a loader :func:`skip_trained_samples` cannot position."""
    for hook in hooks:
        if isinstance(hook, PreciseBN) and not hook._disabled and hook._period > 0 and hook._data_iter is None:
            skip_trained_samples(hook._data_loader, start_iter // hook._period * hook._num_iter * images_per_process)


class RunFolderKept(HookBase):
    """Stops a training whose ``output_dir`` was replaced while it trained (the folder moved or
    renamed and another made at its path): its later checkpoints and results would go into the new
    folder, apart from the config, log and metrics the run keeps open in the moved one. The folder
    is held open from the start of training and compared with the one at the path before each
    iteration; a folder that is gone is left to the writes that fail (:func:`named_lost_file`)."""

    def __init__(self, output_dir: str, setting: str = "OUTPUT_DIR") -> None:
        self.output_dir, self.setting = output_dir, setting
        self._held: int | None = None

    def before_train(self) -> None:
        self._held = os.open(self.output_dir, os.O_RDONLY)

    def before_step(self) -> None:
        if self._held is None:
            return
        held = os.fstat(self._held)
        try:
            here = os.stat(self.output_dir)
        except OSError:
            return
        if (held.st_dev, held.st_ino) == (here.st_dev, here.st_ino):
            return
        try:
            now = os.readlink(f"/proc/self/fd/{self._held}")  # where the run's folder is now (Linux)
        except OSError:
            now = "another path"
        raise GwdetRuntimeError(
            f"{self.setting} {self.output_dir!r} was replaced while the run trained: the run's folder is now {now}, and "
            f"another folder took its path, into which the run would write its later checkpoints and results apart "
            f"from its config, log and metrics; stopped before iteration {self.trainer.iter}. Move the run's folder "
            f"back to {self.output_dir} (with any checkpoint of the run in the new one), then continue it with "
            "--resume.")

    def after_train(self) -> None:
        if self._held is not None:
            os.close(self._held)
            self._held = None


class EvaluationWriter(PeriodicWriter):
    """detectron2's ``PeriodicWriter`` that also writes after each periodic evaluation
    (``eval_period``): its writers keep only the latest value of each metric between two writes,
    so an evaluation more frequent than the writer's period would be replaced by the next one
    before it reached ``metrics.json`` and TensorBoard."""

    def __init__(self, writers: list, period: int, eval_period: int) -> None:
        super().__init__(writers, period)
        self._eval_period = eval_period

    def after_step(self) -> None:
        if self._eval_period > 0 and (self.trainer.iter + 1) % self._eval_period == 0 \
                and (self.trainer.iter + 1) % self._period != 0 and self.trainer.iter != self.trainer.max_iter - 1:
            for writer in self._writers:
                writer.write()
        super().after_step()


# detectron2's writers smooth each scalar over its last 20 samples (CommonMetricPrinter) or over the samples of its
# last 20 iterations (JSONWriter, TensorboardXWriter: their window_size)
WRITERS_WINDOW = 20


class MetricHistoryKept(HookBase):
    """Checkpoints the recent history of each scalar of the trainer's event storage (the samples
    detectron2's writers smooth over, :data:`WRITERS_WINDOW`: the last ones and those of the last
    iterations, as ``(value, iteration)`` pairs) and puts it back into the storage of a run resumed
    from that checkpoint before its first iteration: the smoothed values the resumed run writes
    (``metrics.json``, TensorBoard, the console) are then an uninterrupted run's, where a fresh
    storage would hold the iterations since the resume only."""

    def __init__(self) -> None:
        self._resumed: dict[str, list] = {}

    def state_dict(self) -> dict:
        storage = getattr(self.trainer, "storage", None)
        if storage is None:  # not training: no history to keep
            return {}
        kept = {}
        for name, history in storage.histories().items():
            count = max(WRITERS_WINDOW, storage.count_samples(name, WRITERS_WINDOW))
            kept[name] = [[float(value), int(iteration)] for value, iteration in history.values()[-count:]]
        return {"histories": kept} if kept else {}

    def load_state_dict(self, state: dict) -> None:
        self._resumed = dict(state.get("histories", {}))

    def before_train(self) -> None:
        histories = self.trainer.storage.histories()
        for name, samples in self._resumed.items():
            history = histories.setdefault(name, HistoryBuffer())
            for value, iteration in samples:
                history.update(value, iteration)
        self._resumed = {}


def writing_every_evaluation(hooks: list, eval_period: int) -> list:
    """``hooks`` with detectron2's ``PeriodicWriter`` replaced by an :class:`EvaluationWriter` of the
    same writers and period, so that each evaluation every ``eval_period`` iterations (after the
    ``EvalHook``, which puts its results in the event storage) reaches the writers."""
    return [EvaluationWriter(hook._writers, hook._period, eval_period) if type(hook) is PeriodicWriter else hook
            for hook in hooks]


def with_signal_checkpoints(hooks: list) -> list:
    """``hooks`` with :class:`CheckpointOnSignal` placed before the (first) ``EvalHook``: after the
    LR scheduler and the periodic checkpointer, before evaluation and the writers; a stop also
    skips the evaluation after training."""
    evaluation = next(i for i, hook in enumerate(hooks) if isinstance(hook, EvalHook))
    stop = CheckpointOnSignal(evaluations=[hook for hook in hooks if isinstance(hook, EvalHook)])
    return hooks[:evaluation] + [stop] + hooks[evaluation:]


# torch's refusals of an optimizer state whose parameter groups another config built
OTHER_GROUPS = ("loaded state dict has a different number of parameter groups",
                "loaded state dict contains a parameter group that doesn't match the size")


@contextlib.contextmanager
def configured_optimizer_values(optimizer: torch.optim.Optimizer, scheduler: Any, grouping_settings: str,
                                weights_setting: str) -> Iterator[None]:
    """Around a resume: the optimizer's values as the config gives them (each group's learning
    rate, weight decay, momentum, ...), which loading the checkpoint's optimizer and scheduler
    states would otherwise replace by the run's, are set again after it. A group's learning rate
    becomes the config's base rate times the multiplier at the resumed iteration (detectron2's
    ``LRMultiplier``: ``base_lrs`` set to the config's). A config that groups the parameters otherwise
    (``grouping_settings``), or another optimizer, cannot resume the run's optimizer: refused, naming them."""
    configured = [{key: value for key, value in group.items() if key != "params"} for group in optimizer.param_groups]
    try:
        yield
    except KeyError as error:  # torch's optimizer reading another optimizer's state (SGD's into Adam: no 'step')
        if not any(os.sep + os.path.join("torch", "optim") in frame.filename
                   for frame in traceback.extract_tb(error.__traceback__)):
            raise
        raise _another_optimizer(optimizer, repr(error.args[0]) if error.args else "its values", weights_setting) from None
    except ValueError as error:
        if not any(refusal in str(error) for refusal in OTHER_GROUPS):
            raise
        raise GwdetValueError(
            f"--resume: the run's optimizer state groups the parameters otherwise than this trainer's "
            f"{type(optimizer).__name__} of {len(optimizer.param_groups)} group(s) (torch: {error}); "
            f"{grouping_settings} split the parameters into groups, as does a build_optimizer of one's own (a "
            "subclass's builds another optimizer), and a resume cannot regroup the optimizer's state. Resume with the "
            f"run's values and optimizer, or start a new run from its last checkpoint ({weights_setting} "
            "<run>/model_XXXXXXX.pth).") from None
    lacking = sorted(set(configured[0]) - set(optimizer.param_groups[0]) - {"initial_lr"}) if configured else []
    if lacking:  # torch loaded another optimizer's groups: its first step would fail
        raise _another_optimizer(optimizer, ", ".join(lacking), weights_setting)
    for group, values in zip(optimizer.param_groups, configured, strict=True):
        group.update({key: value for key, value in values.items() if key != "lr"})
    if isinstance(scheduler, LRMultiplier):
        scheduler.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        for group, rate in zip(optimizer.param_groups, scheduler.get_lr(), strict=True):
            group["lr"] = rate


def _another_optimizer(optimizer: torch.optim.Optimizer, lacking: str, weights_setting: str) -> GwdetValueError:
    """The refusal of a resume whose checkpoint holds another optimizer's state than ``optimizer``'s
    (it has no ``lacking``)."""
    return GwdetValueError(
        f"--resume: the run's optimizer state is another optimizer's than this config's {type(optimizer).__name__} "
        f"(it has no {lacking}), and a resume cannot change the optimizer. Resume with the run's optimizer, or start a "
        f"new run from its last checkpoint ({weights_setting} <run>/model_XXXXXXX.pth).")


def continue_after_resume(output_dir: str, start_iter: int, loader: Iterable, images_per_process: int,
                          loader_origin: str) -> None:
    """After a resume at iteration ``start_iter`` (nothing at 0): ``metrics.json`` keeps the records
    of the iterations the checkpoint holds, the checkpoints of later iterations, which the run writes
    again (:func:`set_aside_later_checkpoints`), and earlier results are renamed (:func:`set_aside_results`),
    a finished run's ``model_final.pth`` is copied aside (:func:`keep_replaced_final`),
    and ``loader`` skips the samples those iterations
    consumed (``images_per_process`` each), or a warning says it restarts its stream
    (``loader_origin`` names what built it, e.g. "dataloader.train is not built by ...")."""
    if start_iter == 0:
        return
    if comm.is_main_process():
        trim_metrics(output_dir, start_iter)
        set_aside_later_checkpoints(output_dir, start_iter)
        keep_replaced_final(output_dir, start_iter)
        set_aside_results(output_dir, start_iter)
    if not skip_trained_samples(loader, start_iter * images_per_process):
        logger.warning(f"{loader_origin}: it restarts its sample stream on resume instead of continuing where "
                       "the interrupted run stopped.")


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
