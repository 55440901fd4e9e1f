"""A checkpoint at the current iteration when training is told to stop.

:class:`CheckpointOnSignal`, a detectron2 hook, turns SIGTERM, SIGINT, SIGHUP (unless ignored, as
under ``nohup``), SIGUSR1, SIGUSR2 (SLURM's ``--signal`` warnings before a time limit) and SIGXCPU (a
CPU-time limit's soft limit, ``ulimit -St``: the kernel repeats it every CPU second, which counts
as the same request) into a request: the iteration in progress finishes, a checkpoint of it
is saved as a periodic one would be (``model_<iteration>.pth``), and the process stops with
:class:`TrainingInterrupted`; ``--resume`` then continues at the next iteration. A signal during a
periodic evaluation (``TEST.EVAL_PERIOD``) of a one-process run stops the evaluation at once, unrecorded,
and the checkpoint of its iteration is saved (with several processes the evaluation, whose results the
processes gather, finishes first, then the next iteration). In the evaluation
after training the same signals stop at once, saying that the trained weights are saved and not yet
evaluated (``--resume`` evaluates them); :func:`release_stop_signals` then gives the handlers back
when training has returned. While a run draws its predictions after writing its results
(:func:`drawing_stops`), and during an ``--eval-only`` evaluation (:func:`evaluation_stops`), the
same signals end the process at once with their exit status, saying what is left to do. A handler installed
before training (submitit's, which requeues a SLURM job) is called after the checkpoint is written;
a second stop signal runs it at once (one within :data:`SAME_REQUEST_SECONDS` of the first, of
any kind, is the same request). With several processes every rank stops after the same iteration.

The handlers know the process that installed them: a process forked from it afterwards (a
data-loader worker) inherits them, and there a stop signal asks nothing (:func:`_outside_the_installer`):
the process goes on, saying that only the signal the training process receives stops training.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from types import FrameType
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.distributed as dist
from torch.utils.data import get_worker_info
from detectron2.engine import HookBase
from detectron2.engine.hooks import EvalHook
from detectron2.utils import comm

STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2,
                                            signal.SIGXCPU)
# Signals the kernel sends again while the condition lasts (SIGXCPU: every CPU second past the soft
# limit, until the hard limit's SIGKILL): a repeat is the same request, however late.
REPEATED_SIGNALS = (signal.SIGXCPU,)
# A second stop signal within this many seconds is the same request, not a second one: a terminal's
# Ctrl-C reaches every process of the group, and the launcher (or the study, as SIGTERM) forwards the
# one it receives.
SAME_REQUEST_SECONDS = 1.0
# how a training built in one's own code (gwdet's Trainer or LazyTrainer) is resumed
_IN_PYTHON = " (in Python: the trainer's resume_or_load(resume=True), then train())"
logger = logging.getLogger(__name__)


def install_stop_handlers(handler: Callable[[int, FrameType | None], Any],
                          signals: Sequence[signal.Signals] = STOP_SIGNALS,
                          replaces: Callable[[Any], bool] = lambda current: True) -> dict[int, Any]:
    """Give each of ``signals`` whose present handler ``replaces`` accepts to ``handler``, all but
    SIGHUP where it is ignored (``nohup``: a closed terminal is not to stop the process); the
    handlers replaced, by signal, for :func:`restore_handlers`."""
    previous: dict[int, Any] = {}
    for signum in signals:
        current = signal.getsignal(signum)
        if (signum == signal.SIGHUP and current == signal.SIG_IGN) or not replaces(current):
            continue
        previous[signum] = signal.signal(signum, handler)
    return previous


def _outside_the_installer(signum: int, installer: int, previous: dict[int, Any], role: str, work: str,
                           warned: set[int]) -> bool:
    """Whether this process is not ``installer``, the process that installed the stop handlers, but
    one forked from it afterwards that inherited them (a data-loader worker): there a stop signal
    asks nothing, and the process goes on (the signal reaches the main process too where it is sent to
    the process group, as a terminal's Ctrl-C or SLURM's signals are). SIGTERM, a process's own
    ending (multiprocessing's ``terminate()``), gets back the handler it had before (``previous``)
    and ends the process as it would have (a data-loader worker never gets here: PyTorch's own
    SIGTERM handler ends it, and the run stops with an error naming it); every other signal is
    logged as what it is, once for SIGXCPU (which the kernel repeats every CPU second; ``warned``:
    the signals logged), and otherwise ignored. ``role``: what ``installer`` does ("training"), ``work``:
    what goes on ("training")."""
    if os.getpid() == installer:
        return False
    if signum == signal.SIGTERM:
        restore_handlers({signum: previous.get(signum)})
        signal.raise_signal(signum)
        return True
    if signum in REPEATED_SIGNALS and signum in warned:
        return True
    warned.add(signum)
    name, pid = signal.Signals(signum).name, os.getpid()
    worker = get_worker_info() is not None  # set in a data-loader worker alone
    process = (f"process {pid}, " + ("a data-loader worker of" if worker else "a process forked from")
               + f" the {role} process {installer}")
    if signum == signal.SIGXCPU:
        logger.warning(f"Received SIGXCPU in {process}: this process has used the CPU time of its soft limit (ulimit -St), "
                       f"and at the hard limit (ulimit -Ht) the kernel kills it, which ends {work} with an error. "
                       f"{work[0].upper() + work[1:]} goes on until then: give the run higher CPU-time limits, or stop "
                       f"it sooner (kill -INT {installer}).")
    else:
        logger.warning(f"Received {name} in {process}: this process does not stop {work}. If the signal reached process "
                       f"{installer} too (a Ctrl-C, a signal to the process group), that process stops; sent to process "
                       f"{pid} alone, it leaves {work} going on: to stop {work}, send the signal to process {installer} "
                       f"(kill -{name[3:]} {installer}).")
    return True


def restore_handlers(previous: dict[int, Any]) -> None:
    """Give the signals back to the handlers :func:`install_stop_handlers` replaced."""
    for signum, handler in previous.items():
        signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


class _EvaluationStopped(Exception):
    """Raised by the stop handler inside a periodic evaluation, which is not finished."""


class TrainingInterrupted(SystemExit):
    """Training stopped on a signal after saving a checkpoint; the exit status is 128 + the signal."""

    def __init__(self, signum: int, checkpoint: str | None) -> None:
        super().__init__(128 + signum)
        self.signum = signum
        self.checkpoint = checkpoint


def _chained_handler(previous: Any) -> Callable[[int, FrameType | None], Any] | None:
    """The earlier Python-level handler to call after the checkpoint (``None``: exit ourselves)."""
    if callable(previous) and previous is not signal.default_int_handler:
        return previous
    return None


class CheckpointOnSignal(HookBase):
    """Saves ``model_<iteration>.pth`` after the step in which one of ``signals`` arrived, then stops.

    ``evaluations``: the run's detectron2 ``EvalHook``s, whose evaluation after training a stop or
    an error in a step turns off (as ``eval_after_train=False`` would), so that the process stops
    when asked and an error is not hidden by an evaluation."""

    def __init__(self, signals: Sequence[signal.Signals] = STOP_SIGNALS, evaluations: Sequence[EvalHook] = ()) -> None:
        self.signals = tuple(signals)
        self.evaluations = tuple(evaluations)
        self._received: int | None = None
        self._received_at = 0.0  # time.monotonic() of the first signal
        self._previous: dict[int, Any] = {}
        self._in_step = False  # from the step's start until this hook's after_step has run
        self._evaluating = False  # inside a periodic evaluation that a stop signal ends at once
        self._pid = os.getpid()  # the process whose training a stop signal stops (before_train: the installer's)
        self._warned: set[int] = set()  # the signals a process forked from it logged (_outside_the_installer)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if _outside_the_installer(signum, self._pid, self._previous, "training", "training", self._warned):
            return
        if self._received is not None and (time.monotonic() - self._received_at < SAME_REQUEST_SECONDS
                                           or signum == self._received and signum in REPEATED_SIGNALS):
            return  # the same request twice: sent to the process group and forwarded by the launcher or study
        if self._received is not None:  # asked twice: the previous handler runs at once
            self._restore()
            previous = self._previous.get(signum)
            if callable(previous):
                previous(signum, frame)
            else:
                signal.raise_signal(signum)
            return
        self._received, self._received_at = signum, time.monotonic()
        if self._evaluating:
            raise _EvaluationStopped()
        logger.warning(f"Received {signal.Signals(signum).name}: the current iteration finishes, a checkpoint "
                       "is saved, then training stops (send the signal again to stop at once).")

    def before_train(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            logger.warning("Training runs outside the main thread: signals cannot be caught there, so a "
                           "stop signal ends it without a checkpoint.")
            return
        self._pid = os.getpid()
        self._previous = install_stop_handlers(self._handle, self.signals)
        if comm.get_world_size() == 1:
            for evaluation in self.evaluations:
                evaluation._func = self._stoppable(evaluation._func)  # the attribute of EvalHook's eval_function
        logger.info(f"{', '.join(signal.Signals(s).name for s in self._previous)} save a checkpoint of the current "
                    "iteration before training stops.")

    def _stoppable(self, evaluate: Callable[[], Any]) -> Callable[[], Any]:
        """``evaluate``, which a stop signal during a periodic evaluation ends at once: the checkpoint
        of the iteration is saved and training stops (:meth:`after_step`)."""
        def periodic_evaluation() -> Any:
            self._evaluating = True
            try:
                return evaluate()
            except _EvaluationStopped:
                self._evaluating = False
                logger.warning(f"Received {signal.Signals(self._received or 0).name} during the evaluation at "
                               f"iteration {self.trainer.iter}: the evaluation stops unrecorded.")
                self.after_step()
            finally:
                self._evaluating = False
        return periodic_evaluation

    def _restore(self) -> None:
        restore_handlers(self._previous)

    def before_step(self) -> None:
        self._in_step = True

    def _skipped_evaluation(self, iteration: int, name: str) -> str:
        """What the stop message adds where a periodic evaluation (``TEST.EVAL_PERIOD``) was due after
        ``iteration``: this hook runs before the evaluation hooks, and a resume starts after it."""
        next_iter = iteration + 1
        due = any(evaluation._period > 0 and next_iter % evaluation._period == 0 and next_iter != self.trainer.max_iter
                  for evaluation in self.evaluations)  # EvalHook's own rule (its _period: eval_period)
        if not due:
            return ""
        return (f" The periodic evaluation due after iteration {iteration} was not made, and the resumed run starts "
                f"after it: evaluate {name}.pth with --eval-only (MODEL.WEIGHTS; a LazyConfig's train.init_checkpoint) "
                "for its results.")

    def _skip_evaluations(self) -> None:
        for evaluation in self.evaluations:
            evaluation._eval_after_train = False  # the attribute of EvalHook's eval_after_train argument

    def after_train(self) -> None:
        if self._in_step:  # an error ended the step (or a hook's after_step before this one)
            self._skip_evaluations()
        if not self._previous:
            return
        if any(evaluation._eval_after_train for evaluation in self.evaluations):
            for signum in self._previous:  # until release(): the evaluation hooks run after this one
                signal.signal(signum, self._stop_evaluation)
        else:
            self.release()

    def release(self) -> None:
        """Give the stop signals back to the handlers they had before training (nothing when done)."""
        if self._previous:
            self._restore()
            self._previous = {}

    def _stop_evaluation(self, signum: int, frame: FrameType | None) -> None:
        """A stop signal in the evaluation after training: stop at once, saying what is left to do."""
        if _outside_the_installer(signum, self._pid, self._previous, "training", "the evaluation after training",
                                  self._warned):
            return
        previous = _chained_handler(self._previous.get(signum))
        self.release()
        logger.warning(f"Stopped by {signal.Signals(signum).name} in the evaluation after training: the trained "
                       f"weights are saved, not evaluated. Evaluate them with the same command and --resume{_IN_PYTHON}.")
        if previous is not None:
            previous(signum, frame)
        raise TrainingInterrupted(signum, None)

    def _requested(self) -> int | None:
        """The signal number any rank received (every rank gets the same answer)."""
        if comm.get_world_size() == 1:
            return self._received
        flag = torch.tensor([self._received or 0], dtype=torch.int64)
        if dist.get_backend() == "nccl":
            flag = flag.cuda()
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag.item()) or None

    def after_step(self) -> None:
        signum = self._requested()
        if signum is None:
            self._in_step = False
            return
        iteration = self.trainer.iter
        name = f"model_{iteration:07d}"
        if comm.is_main_process():
            self.trainer.checkpointer.save(name, iteration=iteration)
        comm.synchronize()
        logger.warning(f"Stopped by {signal.Signals(signum).name} after iteration {iteration}; saved {name}.pth. "
                       f"Continue with the same command and --resume{_IN_PYTHON}." + self._skipped_evaluation(iteration, name))
        self._skip_evaluations()
        previous = _chained_handler(self._previous.get(signum))
        self.release()
        if previous is not None:
            previous(signum, None)
        raise TrainingInterrupted(signum, f"{name}.pth")


@contextlib.contextmanager
def evaluation_stops() -> Iterator[None]:
    """Within the block (an ``--eval-only`` evaluation), a stop signal that would end the process
    without a word (SIGTERM, SIGHUP, SIGUSR1, SIGUSR2, SIGXCPU at their default) ends it at once, saying so: the
    evaluation keeps nothing, and the same command runs it again. A process forked from it in the block
    (a data-loader worker) goes on, saying so (:func:`_outside_the_installer`)."""
    with _stops_at_once(lambda name: f"Stopped by {name} during the evaluation: nothing of it is kept. Run the same "
                        "command again to evaluate.", "evaluating", "the evaluation"):
        yield


@contextlib.contextmanager
def drawing_stops(stopped: Callable[[str], str]) -> Iterator[None]:
    """Within the block (the prediction drawings a run makes after writing its results), a stop signal
    that would end the process without a word (SIGTERM, SIGHUP, SIGUSR1, SIGUSR2, SIGXCPU at their
    default) ends it at once with the signal's exit status (:class:`TrainingInterrupted`), logging
    ``stopped(<signal name>)``: what was drawn and how to draw the rest. A process forked from it in the
    block goes on, saying so (:func:`_outside_the_installer`)."""
    with _stops_at_once(stopped, "drawing", "the drawings"):
        yield


@contextlib.contextmanager
def _stops_at_once(stopped: Callable[[str], str], role: str, work: str) -> Iterator[None]:
    """Within the block, a stop signal at its default action ends the process at once, logging
    ``stopped(<signal name>)`` and raising :class:`TrainingInterrupted`; Ctrl-C's KeyboardInterrupt and
    one's own handlers stay. ``role`` and ``work``: what the process does, as
    :func:`_outside_the_installer` names it to a process forked from it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    installer = os.getpid()  # a process forked from it (a data-loader worker) goes on (_outside_the_installer)
    warned: set[int] = set()

    def stop(signum: int, frame: FrameType | None) -> None:
        if _outside_the_installer(signum, installer, previous, role, work, warned):
            return
        logger.warning(stopped(signal.Signals(signum).name))
        raise TrainingInterrupted(signum, None)

    previous = install_stop_handlers(stop, replaces=lambda current: current == signal.SIG_DFL)
    try:
        yield
    finally:
        restore_handlers(previous)


def release_stop_signals(hooks: Sequence[HookBase]) -> None:
    """After a trainer's ``train()`` with ``hooks`` has returned or raised: every
    :class:`CheckpointOnSignal` among them gives the stop signals back (it keeps them through the
    evaluation after training, which runs in later hooks)."""
    for hook in hooks:
        if isinstance(hook, CheckpointOnSignal):
            hook.release()
