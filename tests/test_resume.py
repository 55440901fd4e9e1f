"""Crash and resume: a run killed with SIGKILL resumes from its checkpoint and ends at the same
iteration as an uninterrupted one with bit-identical final weights (tolerance 0: CPU, one thread,
DATALOADER.NUM_WORKERS 0, fixed SEED); a truncated checkpoint makes the resume fall back to the
previous good one; a stop signal saves the current iteration, and a stop or an error in the last
iteration ends the run without the evaluation after training.
"""
import errno
import json
import os
import re
import signal
import subprocess
import sys
import shutil
import time

import pytest
import torch

from gwdet.checkpoint.resilient import ResilientCheckpointer
from gwdet.checkpoint.run_identity import new_run_id
from gwdet.checkpoint.signal_hook import TrainingInterrupted
from gwdet.data import prepare_datasets
from gwdet.data.resumable import skip_trained_samples
from gwdet.engine.run import main
from gwdet.engine.trainer import Trainer
from gwdet.model_zoo import build_config

from conftest import DEMO_CONFIG, REPO, TINY_OPTS, SignalAfter, logged_warnings, tiny_run_args

# 8 iterations, a checkpoint every 2 (model_0000001.pth, model_0000003.pth, ...), no evaluation.
RESUME_OPTS = TINY_OPTS + ["SOLVER.MAX_ITER", "8", "SOLVER.CHECKPOINT_PERIOD", "2", "DATASETS.TEST", "()"]
TRAIN_NET = [sys.executable, str(REPO / "tools" / "train_net.py"), "--config", str(DEMO_CONFIG)]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def run_train_net(output_dir, *extra):
    command = TRAIN_NET + list(extra) + RESUME_OPTS + ["OUTPUT_DIR", str(output_dir)]
    completed = subprocess.run(command, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=900)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return completed.stdout + completed.stderr


def final_weights(output_dir):
    return torch.load(output_dir / "model_final.pth", map_location="cpu", weights_only=True)


@pytest.fixture(scope="module")
def killed_and_uninterrupted(tmp_path_factory):
    """An uninterrupted run, and a run SIGKILLed after its first checkpoint then resumed."""
    root = tmp_path_factory.mktemp("resume")
    uninterrupted, killed = root / "uninterrupted", root / "killed"
    run_train_net(uninterrupted)

    command = TRAIN_NET + RESUME_OPTS + ["OUTPUT_DIR", str(killed)]
    process = subprocess.Popen(command, cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 600
    while not (killed / "model_0000001.pth").exists() and process.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL, "the run was killed, not finished"
    assert not (killed / "model_final.pth").exists()
    log = run_train_net(killed, "--resume")
    return uninterrupted, killed, log


def test_sigkilled_run_resumes_from_its_checkpoint_to_the_end(killed_and_uninterrupted):
    uninterrupted, killed, log = killed_and_uninterrupted
    assert "Loading from" in log and "model_0000001.pth" in log
    assert final_weights(killed)["iteration"] == final_weights(uninterrupted)["iteration"] == 7


def test_sigkilled_run_resumes_to_the_same_weights(killed_and_uninterrupted):
    uninterrupted, killed, _ = killed_and_uninterrupted
    expected, resumed = final_weights(uninterrupted), final_weights(killed)
    for name, tensor in expected["model"].items():
        assert torch.equal(resumed["model"][name], tensor), name


def metrics_records(output_dir):
    """``metrics.json``'s records without the timings (which no two runs share)."""
    timings = {"time", "data_time", "rank_data_time", "eta_seconds"}
    return [{key: value for key, value in json.loads(line).items() if key not in timings}
            for line in (output_dir / "metrics.json").read_text().splitlines()]


# before: the resumed run's writers smoothed over the iterations since the resume only, so its metrics.json
# (and TensorBoard) held other losses than the uninterrupted run's, of the same weights
def test_sigkilled_run_resumes_to_the_same_metrics(killed_and_uninterrupted):
    uninterrupted, killed, _ = killed_and_uninterrupted
    expected = metrics_records(uninterrupted)
    assert len(expected) == 1 and expected[0]["iteration"] == 7 and "total_loss" in expected[0]
    assert metrics_records(killed) == expected


def trained_four_iterations(output_dir):
    """The config of a finished 4-iteration run in ``output_dir`` with checkpoints at iterations 1 and 3."""
    cfg = build_config(str(DEMO_CONFIG), TINY_OPTS + ["SOLVER.MAX_ITER", "4", "SOLVER.CHECKPOINT_PERIOD", "2",
                                                      "DATASETS.TEST", "()", "OUTPUT_DIR", str(output_dir)])
    prepare_datasets(cfg)
    trainer = Trainer(cfg)
    trainer.resume_or_load(resume=False)
    trainer.train()
    return cfg


def test_truncated_checkpoint_falls_back_to_the_previous_one(tmp_path, caplog):
    cfg = trained_four_iterations(tmp_path)
    newest = tmp_path / "model_final.pth"
    assert (tmp_path / "last_checkpoint").read_text().strip() == newest.name
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # a kill during saving

    resumed = Trainer(cfg)
    resumed.resume_or_load(resume=True)
    assert resumed.start_iter == 4, "model_0000003.pth (iteration 3) was the previous good checkpoint"
    assert any("Cannot read checkpoint" in r.message and "model_final.pth" in r.message for r in caplog.records)


def test_a_run_killed_before_it_named_its_checkpoint_resumes_at_that_checkpoints_iteration(tmp_path):
    """A kill between saving a checkpoint and writing ``last_checkpoint``: the resume loads that
    checkpoint (its optimizer and scheduler states too) and must continue at its iteration + 1, not
    at 0, where the scheduler ran past the schedule's end (fvcore: "where ... must be in [0, 1]")."""
    cfg = trained_four_iterations(tmp_path)
    for name in ("model_final.pth", "model_final.pth.sha256", "model_0000003.pth", "model_0000003.pth.sha256",
                 "last_checkpoint"):
        (tmp_path / name).unlink(missing_ok=True)

    resumed = Trainer(cfg)
    resumed.resume_or_load(resume=True)
    assert resumed.start_iter == 2, "model_0000001.pth (iteration 1) is the checkpoint left"
    resumed.train()
    assert torch.load(tmp_path / "model_final.pth", map_location="cpu", weights_only=True)["iteration"] == 3


def test_starting_the_train_loader_leaves_torch_global_generator_alone():
    """A resumed run starts iterating its loader after the random states were restored; a draw from
    torch's global generator there would shift every later RPN/ROI sampling decision."""
    cfg = build_config(str(DEMO_CONFIG), TINY_OPTS)
    prepare_datasets(cfg)
    loader = Trainer.build_train_loader(cfg)
    before = torch.get_rng_state()
    next(iter(loader))
    assert torch.equal(torch.get_rng_state(), before)


def test_a_random_seed_is_said_not_to_repeat_the_run_by_the_seed_detectron2_logs():
    # the seed a SEED -1 run logs gave another run when given as SEED (weights 0.0115 apart), without a word
    from conftest import logged_warnings

    cfg = build_config(str(DEMO_CONFIG), [*TINY_OPTS, "SEED", "-1"])
    prepare_datasets(cfg)
    with logged_warnings("gwdet.data.resumable") as logged:
        Trainer.build_train_loader(cfg)
    assert any(message.startswith("SEED -1: detectron2 draws a seed and logs it ('Using a generated random seed ...'), "
                                  "but giving that seed as SEED does not repeat this run") for message in logged), logged
    with logged_warnings("gwdet.data.resumable") as logged:
        Trainer.build_train_loader(build_config(str(DEMO_CONFIG), TINY_OPTS))
    assert not logged


def test_a_resumed_loader_continues_the_uninterrupted_sample_stream():
    cfg = build_config(str(DEMO_CONFIG), TINY_OPTS)
    prepare_datasets(cfg)
    uninterrupted = iter(Trainer.build_train_loader(cfg))
    batches = [[d["file_name"] for d in next(uninterrupted)] for _ in range(5)]
    resumed_loader = Trainer.build_train_loader(cfg)
    assert skip_trained_samples(resumed_loader, 3 * cfg.SOLVER.IMS_PER_BATCH)
    resumed = iter(resumed_loader)
    assert [[d["file_name"] for d in next(resumed)] for _ in range(2)] == batches[3:]


def test_a_loader_gwdet_did_not_build_gets_a_warning_on_resume(tmp_path, caplog):
    """A subclass with its own build_train_loader cannot be positioned: the resume says so."""
    from detectron2.data import build_detection_train_loader

    class OwnLoaderTrainer(Trainer):
        @classmethod
        def build_train_loader(cls, cfg):
            return build_detection_train_loader(cfg)

    opts = TINY_OPTS + ["SOLVER.CHECKPOINT_PERIOD", "1", "DATASETS.TEST", "()", "OUTPUT_DIR", str(tmp_path)]
    cfg = build_config(str(DEMO_CONFIG), opts)
    prepare_datasets(cfg)
    first = OwnLoaderTrainer(cfg)
    first.resume_or_load(resume=False)
    first.train()
    resumed = OwnLoaderTrainer(cfg)
    resumed.resume_or_load(resume=True)
    assert resumed.start_iter == 2
    assert any("restarts its sample stream" in r.message for r in caplog.records)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR2], ids=lambda s: s.name)
def test_a_stop_signal_saves_the_current_iteration_and_resume_ends_with_the_same_weights(
        killed_and_uninterrupted, tmp_path, signum):
    """A cluster's preemption (SIGTERM, SIGUSR2) or Ctrl-C (SIGINT) loses no iteration: no periodic
    checkpoint is due before the end, so the only one is the signal's. The checkpoint is the same
    whichever signal asked for it, so the resume to the uninterrupted run's weights is run once."""
    uninterrupted = killed_and_uninterrupted[0]
    output = tmp_path / "signalled"
    no_periodic = ["SOLVER.CHECKPOINT_PERIOD", "1000", "OUTPUT_DIR", str(output)]
    process = subprocess.Popen(TRAIN_NET + RESUME_OPTS + no_periodic, cwd=REPO, env=ENV,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    log, deadline = output / "log.txt", time.time() + 600
    while process.poll() is None and time.time() < deadline and not (
            log.exists() and "save a checkpoint of the current iteration" in log.read_text()):
        time.sleep(0.02)
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=600)
    assert process.returncode == 128 + signum, stderr[-3000:]
    saved = sorted(output.glob("model_*.pth"))
    assert len(saved) == 1 and saved[0].name != "model_final.pth", saved
    iteration = int(saved[0].stem.split("_")[1])
    assert torch.load(saved[0], map_location="cpu", weights_only=True)["iteration"] == iteration < 7
    assert f"Stopped by {signum.name} after iteration {iteration}" in log.read_text()
    if signum != signal.SIGTERM:
        return

    resumed_log = run_train_net(output, "--resume", *no_periodic)
    assert f"model_{iteration:07d}.pth" in resumed_log
    expected, resumed = final_weights(uninterrupted), final_weights(output)
    assert resumed["iteration"] == 7
    for name, tensor in expected["model"].items():
        assert torch.equal(resumed["model"][name], tensor), name


def test_a_stop_in_the_last_iteration_stops_without_evaluating_and_resume_evaluates(tmp_path, monkeypatch):
    # before: the stop was logged, then the final evaluation ran anyway (detectron2 calls every hook's
    # after_train on the way out) and the process ended with 143 and no results
    build_hooks = Trainer.build_hooks
    # received after the hooks of iteration 0, so the stop comes after iteration 1, the last of 2
    monkeypatch.setattr(Trainer, "build_hooks", lambda self: build_hooks(self) + [SignalAfter(0, signal.SIGTERM)])
    with pytest.raises(TrainingInterrupted) as stop:
        main(tiny_run_args(tmp_path))
    assert stop.value.checkpoint == "model_0000001.pth" and stop.value.code == 128 + signal.SIGTERM
    assert not (tmp_path / "inference").exists() and not (tmp_path / "results.json").exists()
    assert "Evaluation results" not in (tmp_path / "log.txt").read_text()
    monkeypatch.setattr(Trainer, "build_hooks", build_hooks)

    results = main(tiny_run_args(tmp_path, "--resume"))
    assert set(results) == {"bbox", "segm"} and (tmp_path / "results.json").is_file()


def test_a_stop_signal_in_the_evaluation_after_training_says_so_and_resume_evaluates(tmp_path, monkeypatch):
    # before: the handler was given back before the evaluation, so SIGTERM there ended the process
    # with status 143 and not one line
    test = Trainer.test.__func__

    def stopped_test(cls, *args, **kwargs):
        signal.raise_signal(signal.SIGTERM)
        return test(cls, *args, **kwargs)

    before = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(Trainer, "test", classmethod(stopped_test))
    with pytest.raises(TrainingInterrupted) as stop, logged_warnings("gwdet") as warned:
        main(tiny_run_args(tmp_path))
    assert stop.value.code == 128 + signal.SIGTERM and signal.getsignal(signal.SIGTERM) == before
    assert "Stopped by SIGTERM in the evaluation after training: the trained weights are saved, not evaluated. " \
           "Evaluate them with the same command and --resume (in Python: the trainer's resume_or_load(resume=True), " \
           "then train())." in warned
    assert (tmp_path / "model_final.pth").is_file() and not (tmp_path / "results.json").exists()
    monkeypatch.setattr(Trainer, "test", classmethod(test))

    results = main(tiny_run_args(tmp_path, "--resume"))
    assert set(results) == {"bbox", "segm"} and (tmp_path / "results.json").is_file()
    assert signal.getsignal(signal.SIGTERM) == before  # given back after a training that evaluated too


def test_a_stop_signal_in_a_periodic_evaluation_stops_it_and_saves_its_iteration(tmp_path, monkeypatch):
    # before: the evaluation ran to its end and one more iteration trained before the checkpoint, which a
    # scheduler's grace period may not allow
    test = Trainer.test.__func__
    calls = []

    def stopped_test(cls, *args, **kwargs):
        calls.append(1)
        signal.raise_signal(signal.SIGTERM)
        return test(cls, *args, **kwargs)

    monkeypatch.setattr(Trainer, "test", classmethod(stopped_test))
    with pytest.raises(TrainingInterrupted) as stop, logged_warnings("gwdet") as warned:
        main(tiny_run_args(tmp_path, "SOLVER.MAX_ITER", "3", "TEST.EVAL_PERIOD", "1"))
    assert stop.value.code == 128 + signal.SIGTERM and stop.value.checkpoint == "model_0000000.pth" and calls == [1]
    assert "Received SIGTERM during the evaluation at iteration 0: the evaluation stops unrecorded." in warned
    assert sorted(path.name for path in tmp_path.glob("model_*.pth")) == ["model_0000000.pth"]
    assert "Evaluation results" not in (tmp_path / "log.txt").read_text()
    monkeypatch.setattr(Trainer, "test", classmethod(test))

    assert "bbox" in main(tiny_run_args(tmp_path, "--resume", "SOLVER.MAX_ITER", "3", "TEST.EVAL_PERIOD", "1"))
    assert torch.load(tmp_path / "model_final.pth", map_location="cpu", weights_only=True)["iteration"] == 2


def test_a_checkpoint_that_cannot_be_saved_in_the_last_iteration_ends_the_run_without_evaluating(tmp_path, monkeypatch):
    # a full disk at model_final.pth: before, detectron2's evaluation after training ran on and
    # failed with its own traceback (or hid the error), after the save had failed
    save = ResilientCheckpointer.save

    def save_or_fail(self, name, **extra):
        if name == "model_final":
            raise OSError(errno.ENOSPC, f"cannot write {self.save_dir}/model_final.pth: No space left on device")
        return save(self, name, **extra)

    monkeypatch.setattr(ResilientCheckpointer, "save", save_or_fail)
    with pytest.raises(OSError, match="model_final.pth: No space left on device"):
        main(tiny_run_args(tmp_path))
    assert not (tmp_path / "inference").exists() and "Evaluation results" not in (tmp_path / "log.txt").read_text()
    assert (tmp_path / "model_0000000.pth").is_file()  # the iteration before: --resume continues from it


def test_periodic_evaluations_leave_the_trained_weights_as_they_are(tmp_path):
    # TEST.EVAL_PERIOD changed every weight: the evaluation drew from the generators training samples with
    plain, evaluated = tmp_path / "plain", tmp_path / "evaluated"
    main(tiny_run_args(plain, "SOLVER.MAX_ITER", "3", "SEED", "3"))
    main(tiny_run_args(evaluated, "SOLVER.MAX_ITER", "3", "SEED", "3", "TEST.EVAL_PERIOD", "1"))
    assert "Evaluation results" in (evaluated / "log.txt").read_text()
    expected, got = final_weights(plain), final_weights(evaluated)
    for name, tensor in expected["model"].items():
        assert torch.equal(got["model"][name], tensor), name


def test_a_stop_signal_received_twice_at_once_is_one_request(monkeypatch):
    # a terminal's Ctrl-C reaches every process of a --num-gpus run, and the launcher forwards the one it gets:
    # the second SIGINT within the same moment stopped the processes at once, without their checkpoint
    from gwdet.checkpoint.signal_hook import SAME_REQUEST_SECONDS, CheckpointOnSignal

    called = []
    hook = CheckpointOnSignal(signals=(signal.SIGUSR2,))
    hook._previous = {signal.SIGUSR2: lambda signum, frame: called.append(signum)}
    before = signal.getsignal(signal.SIGUSR2)
    try:
        hook._handle(signal.SIGUSR2, None)
        hook._handle(signal.SIGUSR2, None)  # the same request
        assert called == [] and hook._received == signal.SIGUSR2
        # a study forwards a Ctrl-C its worker got too, as SIGTERM: it stopped the worker at once, without its checkpoint
        hook._handle(signal.SIGTERM, None)
        assert called == [] and hook._received == signal.SIGUSR2
        hook._received_at -= SAME_REQUEST_SECONDS  # asked again later: the previous handler runs at once
        hook._handle(signal.SIGUSR2, None)
        assert called == [signal.SIGUSR2]
    finally:
        signal.signal(signal.SIGUSR2, before)


class _SignalsItself(torch.utils.data.Dataset):
    """Four samples; the process that loads sample 1 sends itself ``signum`` ``times`` times first."""

    def __init__(self, signum, times=1):
        self.signum, self.times = signum, times

    def __len__(self):
        return 4

    def __getitem__(self, index):
        if index == 1:
            for _ in range(self.times):
                os.kill(os.getpid(), self.signum)
        return index


# SIGINT sent to a data-loader worker alone: the worker, forked with the training's stop handler,
# logged "Received SIGINT: the current iteration finishes, a checkpoint is saved, then training stops"
# into the run's log, and training went on to its end (SIGXCPU, which the kernel repeats, likewise)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGXCPU], ids=lambda s: s.name)
def test_a_stop_signal_to_a_data_loader_worker_alone_says_that_training_goes_on(tmp_path, signum):
    import logging

    from gwdet.checkpoint.signal_hook import CheckpointOnSignal

    log = tmp_path / "log.txt"  # the run's log, which the worker inherits
    handler = logging.FileHandler(log)
    handler.setLevel(logging.WARNING)
    logger = logging.getLogger("gwdet.checkpoint.signal_hook")
    logger.addHandler(handler)
    hook = CheckpointOnSignal()
    hook.before_train()
    try:
        repeats = 2 if signum == signal.SIGXCPU else 1  # the kernel repeats SIGXCPU every CPU second
        loader = torch.utils.data.DataLoader(_SignalsItself(signum, repeats), batch_size=None, num_workers=1,
                                             multiprocessing_context="fork")
        batches = [int(batch) for batch in loader]  # the worker goes on serving
    finally:
        hook.release()
        logger.removeHandler(handler)
        handler.close()
    assert batches == [0, 1, 2, 3] and hook._received is None  # no stop asked of the training process
    main_pid = os.getpid()
    lines = log.read_text().splitlines()
    assert len(lines) == 1, lines  # one warning, for SIGXCPU's repeat too
    worker = re.fullmatch(rf"Received {signum.name} in process (\d+), a data-loader worker of the training process "
                          rf"{main_pid}: (.*)", lines[0])
    assert worker is not None and int(worker[1]) != main_pid, lines[0]
    if signum == signal.SIGINT:
        assert worker[2] == (f"this process does not stop training. If the signal reached process {main_pid} too (a "
                             f"Ctrl-C, a signal to the process group), that process stops; sent to process {worker[1]} "
                             f"alone, it leaves training going on: to stop training, send the signal to process "
                             f"{main_pid} (kill -INT {main_pid}).")
    else:
        assert worker[2].endswith(f"which ends training with an error. Training goes on until then: give the run higher "
                                  f"CPU-time limits, or stop it sooner (kill -INT {main_pid}).")


# SIGTERM (multiprocessing's terminate()) to a process forked from the training one: it logged that
# training stops, and went on
def test_sigterm_ends_a_process_forked_from_the_training_one_as_without_the_stop_handler():
    from gwdet.checkpoint.signal_hook import CheckpointOnSignal

    hook = CheckpointOnSignal()
    before = signal.getsignal(signal.SIGTERM)
    hook.before_train()
    try:
        child = os.fork()
        if child == 0:  # the forked process: ends by the signal, or exits 0 when it goes on
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(2)
            finally:
                os._exit(0)
        _, status = os.waitpid(child, 0)
    finally:
        hook.release()
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM
    assert hook._received is None and signal.getsignal(signal.SIGTERM) == before


def test_a_stop_after_an_iteration_whose_periodic_evaluation_was_due_says_it_was_not_made():
    # a stop while the checkpoint of an evaluation iteration was saved: the evaluation was skipped for good (the
    # resumed run starts after it), without a word
    import types

    from detectron2.engine.hooks import EvalHook

    from gwdet.checkpoint.signal_hook import CheckpointOnSignal

    hook = CheckpointOnSignal(evaluations=[EvalHook(4, lambda: {})])
    hook.trainer = types.SimpleNamespace(max_iter=200)
    assert hook._skipped_evaluation(3, "model_0000003") == (
        " The periodic evaluation due after iteration 3 was not made, and the resumed run starts after it: evaluate "
        "model_0000003.pth with --eval-only (MODEL.WEIGHTS; a LazyConfig's train.init_checkpoint) for its results.")
    assert hook._skipped_evaluation(4, "model_0000004") == ""
    hook.trainer.max_iter = 4  # the last iteration's evaluation is the one after training
    assert hook._skipped_evaluation(3, "model_0000003") == ""


def test_a_stop_signal_during_an_evaluation_says_so():
    # SIGTERM to a single-process --eval-only: status 143 and not one line
    from gwdet.checkpoint.signal_hook import TrainingInterrupted, evaluation_stops

    before = signal.signal(signal.SIGTERM, signal.SIG_DFL)  # as in the tool's process
    try:
        with logged_warnings("gwdet") as warned, pytest.raises(TrainingInterrupted) as stop:
            with evaluation_stops():
                signal.raise_signal(signal.SIGTERM)
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # given back
    finally:
        signal.signal(signal.SIGTERM, before)
    assert stop.value.code == 128 + signal.SIGTERM
    assert warned == ["Stopped by SIGTERM during the evaluation: nothing of it is kept. Run the same command again to "
                      "evaluate."]


# last_checkpoint holding "model_0000003.pth\nmodel_final.pth" (both there) in a finished run: --resume said that
# checkpoint "is not there (deleted or moved)" and told to put it back
def test_a_last_checkpoint_of_several_lines_is_named_as_such(tmp_path):
    from gwdet.engine.output_dir import check_resume_trains, tagged_checkpoint
    from gwdet.errors import GwdetValueError

    for name in ("model_0000003.pth", "model_final.pth", "results.json"):
        (tmp_path / name).write_bytes(b"{}")
    (tmp_path / "last_checkpoint").write_text("model_0000003.pth\nmodel_final.pth")
    expected = (r"last_checkpoint in '.*' holds 2 lines, 'model_0000003.pth\\nmodel_final.pth', where it holds the "
                r"file name of one checkpoint \(detectron2 writes the name of the run's last checkpoint alone.*\), so "
                r"which checkpoint is the run's last is unknown; nothing was changed. Keep the one name of the run's "
                r"last checkpoint in it \(one of model_0000003.pth, model_final.pth\)")
    with pytest.raises(GwdetValueError, match=r"^--resume: " + expected):
        check_resume_trains(str(tmp_path), 4)
    with pytest.raises(GwdetValueError, match=r"^--eval-only --resume: " + expected):
        tagged_checkpoint(str(tmp_path))
    (tmp_path / "results.json").unlink()  # a run stopped before its results: the same
    with pytest.raises(GwdetValueError, match=r"^--resume: " + expected):
        check_resume_trains(str(tmp_path), 4)
    (tmp_path / "last_checkpoint").write_text("model_final.pth\n")  # one name, a line end after it: detectron2's
    assert tagged_checkpoint(str(tmp_path)) == str(tmp_path / "model_final.pth")


# a run whose model_final.pth could not be written (a full disk) after its last periodic checkpoint, the one of the
# final iteration: --resume trained nothing and ended without model_final.pth, reporting results
def test_a_resume_at_the_final_iteration_saves_the_final_weights(finished_run, tmp_path):
    from gwdet.engine.run import main

    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    for written_at_the_end in ("model_final.pth", "model_final.pth.sha256", "results.json", "results.md"):
        (run / written_at_the_end).unlink()
    last = sorted(path.name for path in run.glob("model_0*.pth"))[-1]
    (run / "last_checkpoint").write_text(last)
    main(tiny_run_args(run, "--resume"))
    assert torch.load(run / "model_final.pth", map_location="cpu", weights_only=False)["iteration"] == 1
    assert (run / "last_checkpoint").read_text() == "model_final.pth"


# a finished run whose last_checkpoint was pointed back at an older checkpoint: --resume wrote its model_0000001.pth and
# model_final.pth (the weights its kept results describe) again without a word, the finished run's weights lost
def test_a_resume_from_an_older_checkpoint_keeps_the_later_checkpoints_aside(finished_run, tmp_path):
    import hashlib

    from gwdet.engine.output_dir import check_fresh_start, later_checkpoints, run_files
    from gwdet.utils.atomic import checksum_problem

    assert later_checkpoints(str(finished_run), 2) == [], "a resume from the newest checkpoint sets nothing aside"
    run = tmp_path / "run"
    shutil.copytree(finished_run, run, ignore=shutil.ignore_patterns(".gwdet.lock"))
    md5 = lambda path: hashlib.md5(path.read_bytes()).hexdigest()
    final, later = md5(run / "model_final.pth"), md5(run / "model_0000001.pth")
    (run / "last_checkpoint").write_text("model_0000000.pth")
    with logged_warnings("gwdet") as warned:
        main(tiny_run_args(run, "--resume", "SOLVER.MAX_ITER", "3"))
    kept_final, kept_later = run / "model_final_before_resuming_at_1.pth", run / "model_0000001_before_resuming_at_1.pth"
    assert md5(kept_final) == final and md5(kept_later) == later
    assert checksum_problem(str(kept_final)) is None and checksum_problem(str(kept_later)) is None
    assert md5(run / "model_final.pth") != final, "the resumed run's own final weights"
    assert any("this resume starts at iteration 1, and the run's checkpoints of later iterations, which it would write "
               "over, are kept under names no resume continues from: model_0000001.pth as "
               "model_0000001_before_resuming_at_1.pth, model_final.pth as model_final_before_resuming_at_1.pth"
               in message for message in warned), warned
    assert {kept_final.name, kept_later.name, kept_final.name + ".sha256"} <= set(run_files(str(run)))
    check_fresh_start(str(run), overwrite=True)  # the run's files: --overwrite removes them
    assert not list(run.glob("*before_resuming*"))


# last_checkpoint overwritten with '{"broken' in a finished run: --resume said it names a checkpoint "which is not
# there (deleted or moved)" and told to put '{"broken' back
def test_a_damaged_last_checkpoint_is_named_with_the_newest_checkpoint_to_write_into_it(tmp_path):
    import re

    from gwdet.engine.output_dir import check_resume_trains
    from gwdet.errors import GwdetValueError

    for age, name in enumerate(("model_0000003.pth", "model_final.pth", "results.json")):
        (tmp_path / name).write_bytes(b"{}")
        os.utime(tmp_path / name, (1000 + age, 1000 + age))
    (tmp_path / "last_checkpoint").write_text('{"broken\n')
    tag = re.escape(str(tmp_path / "last_checkpoint"))
    with pytest.raises(GwdetValueError, match=(
            r"^--resume: last_checkpoint in '.*' is damaged: it holds '\{\"broken', which is not the file name of a "
            r"checkpoint \(detectron2 writes there the name of the run's last one, e\.g\. model_final\.pth\), so which "
            r"checkpoint is the run's last is unknown; nothing was changed\. Write the name of the run's newest "
            r"checkpoint into it \(the newest there is model_final\.pth: echo model_final\.pth > " + tag +
            r"\), then resume again\.$")):
        check_resume_trains(str(tmp_path), 6)
    os.utime(tmp_path / "model_0000003.pth", (2000, 2000))  # a checkpoint written after model_final.pth
    with pytest.raises(GwdetValueError, match=r"the newest there is model_0000003\.pth: echo model_0000003\.pth"):
        check_resume_trains(str(tmp_path), 6)


# a finished run whose config.yaml.sha256 was deleted and config.yaml edited (BATCH_SIZE_PER_IMAGE 64 -> 32): --resume
# with 32 said nothing, and config_before_resuming_at_N.yaml gave 32 for the iterations trained with 64
def test_a_resume_of_a_run_whose_config_record_was_removed_is_refused(finished_run, tmp_path):
    from gwdet.errors import GwdetFileNotFoundError

    run = tmp_path / "run"
    shutil.copytree(finished_run, run, ignore=shutil.ignore_patterns(".gwdet.lock"))
    (run / "config.yaml.sha256").unlink()
    config = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text(config.replace("BATCH_SIZE_PER_IMAGE: ", "BATCH_SIZE_PER_IMAGE: 1"))
    before = {path.name: path.read_bytes() for path in run.iterdir() if path.is_file() and path.name != ".gwdet.lock"}
    with pytest.raises(GwdetFileNotFoundError, match=(
            r"^--resume: the run in '.*' has its checkpoints and config.yaml, but not .*config\.yaml\.sha256, the "
            r"SHA-256 record written with config.yaml when the run started, so whether config.yaml still holds the "
            r"values the run trained with cannot be checked .*; nothing was changed\. Restore config\.yaml\.sha256 "
            r"\(from a copy of the run\); if .* is as the run wrote it, record it again \(cd .* && sha256sum "
            r"config\.yaml > config\.yaml\.sha256\) and resume again; or train afresh")):
        main(tiny_run_args(run, "--resume", "SOLVER.MAX_ITER", "3"))
    assert {path.name: path.read_bytes() for path in run.iterdir() if path.is_file() and path.name != ".gwdet.lock"} == before


def _small_model():
    from gwdet.layers import GroupWhitening

    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), GroupWhitening(8, num_groups=2))


@pytest.mark.parametrize("name, refusal", [
    ("", r"Checkpoint name '' is empty or blank \(an unset variable\?\): save\(\) would write a file named '\.pth'; "
         r"nothing was written\. Give the checkpoint's name, e\.g\. save\('model_final'\)"),
    ("  ", r"Checkpoint name '  ' is empty or blank .* named '  \.pth'; nothing was written"),
    (None, r"Checkpoint name None \(NoneType\) cannot be saved: save\(\) takes the file's name as a str, to which it "
           r"adds \.pth; nothing was written\. Give it as a str, e\.g\. save\('model_final'\)"),
])
def test_an_empty_blank_or_missing_checkpoint_name_is_refused(tmp_path, name, refusal):
    # before: save("") wrote save_dir/.pth, save("  ") save_dir/  .pth and save(None) save_dir/None.pth
    from gwdet.errors import GwdetTypeError, GwdetValueError

    with pytest.raises(GwdetTypeError if name is None else GwdetValueError, match=refusal):
        ResilientCheckpointer(_small_model(), save_dir=str(tmp_path)).save(name)
    assert os.listdir(tmp_path) == []


def test_a_checkpoint_name_leading_out_of_save_dir_is_refused_and_the_file_there_kept(tmp_path):
    # before: save("../user") replaced the user's file save_dir/../user.pth
    from gwdet.errors import GwdetValueError

    run = tmp_path / "run"
    run.mkdir()
    (tmp_path / "user.pth").write_bytes(b"user data")
    checkpointer = ResilientCheckpointer(_small_model(), save_dir=str(run))
    with pytest.raises(GwdetValueError, match=re.escape(
            f"Checkpoint name '../user' holds a path separator: save() writes NAME.pth in its save_dir ({str(run)!r}), "
            f"and this name would write {tmp_path / 'user.pth'}, elsewhere; nothing was written. Give a plain file "
            "name (save('user')), or a checkpointer whose save_dir is the folder meant.")):
        checkpointer.save("../user")
    with pytest.raises(GwdetValueError, match=re.escape(f"would write {tmp_path / 'elsewhere.pth'}, elsewhere")):
        checkpointer.save(str(tmp_path / "elsewhere"))
    assert (tmp_path / "user.pth").read_bytes() == b"user data"
    assert os.listdir(run) == [] and sorted(os.listdir(tmp_path)) == ["run", "user.pth"]


def test_save_dir_expands_a_leading_tilde_and_names_an_unexpanded_variable(tmp_path, monkeypatch):
    # before: save_dir="~/ckt" was refused as a folder that does not exist; "$HOME/ckv" too, without naming $HOME
    from gwdet.errors import GwdetValueError

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "ckt").mkdir()
    ResilientCheckpointer(_small_model(), save_dir="~/ckt").save("m")
    assert (tmp_path / "ckt" / "m.pth").is_file()
    ResilientCheckpointer(_small_model()).load("~/ckt/m.pth")
    with pytest.raises(GwdetValueError, match=re.escape(
            "Checkpoint 'm' cannot be saved: save_dir '$HOME/ckv' holds '$HOME', an environment variable that nothing "
            f"expanded (a quoted command-line value and a config file keep it as it is): the run would write into a "
            f"folder named '$HOME'. Let the shell expand it (double quotes), or give the path itself "
            f"(save_dir={tmp_path}/ckv); nothing was written.")):
        ResilientCheckpointer(_small_model(), save_dir="$HOME/ckv").save("m")


# a run whose last training step made weights NaN (its loss, computed before the step, finite) saved them as
# model_final.pth, evaluated them to NaN APs and ended with exit status 0
def test_weights_a_last_step_made_non_finite_are_not_saved_and_the_run_is_named_diverged(tmp_path, monkeypatch):
    from detectron2.engine import HookBase

    from gwdet.checkpoint.resilient import NonFiniteWeightsError
    from gwdet.engine.run import TrainingDiverged

    class NonFiniteLastStep(HookBase):
        """Makes a weight NaN after the last iteration's step, before the checkpointer's hook saves it."""

        def after_step(self):
            if self.trainer.iter == self.trainer.max_iter - 1:
                with torch.no_grad():
                    next(self.trainer.model.parameters()).view(-1)[0] = float("nan")

    build_hooks = Trainer.build_hooks
    monkeypatch.setattr(Trainer, "build_hooks", lambda self: [NonFiniteLastStep()] + build_hooks(self))
    with pytest.raises(TrainingDiverged, match=r"^Training diverged: checkpoint '(model_0000001|model_final)' was not "
                                               r"saved: the model's weights hold NaN or inf in 1 tensor\(s\) \(backbone"
                                               r".*\), which a model cannot compute with: .* The checkpoints written "
                                               r"before it are kept in"):
        main(tiny_run_args(tmp_path))
    assert not (tmp_path / "model_final.pth").exists() and not (tmp_path / "results.json").exists()
    assert issubclass(NonFiniteWeightsError, FloatingPointError)  # what the run names as diverged


# a finished run's run_id file replaced by another run's: "model_final.pth was saved by another run ... it is another
# run's checkpoint copied there ... Put the run's own checkpoint back", though every checkpoint was the run's own
def test_a_run_id_file_naming_another_run_than_all_the_checkpoints_is_named_as_the_one_replaced(tmp_path):
    def run(folder, *names):
        folder.mkdir()
        model = torch.nn.Linear(2, 2)
        checkpointer = ResilientCheckpointer(model, str(folder), optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
        checkpointer.resume_or_load("", resume=False)
        for iteration, name in enumerate(names, start=1):
            checkpointer.save(name, iteration=iteration)
        return checkpointer

    def resume(folder):
        model = torch.nn.Linear(2, 2)
        checkpointer = ResilientCheckpointer(model, str(folder), optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
        return checkpointer, checkpointer.resume_or_load("", resume=True)

    ours, other = run(tmp_path / "ours", "model_0000000", "model_final"), run(tmp_path / "other", "model_final")
    shutil.copy(tmp_path / "other" / "run_id", tmp_path / "ours" / "run_id")
    folder = tmp_path / "ours"
    with pytest.raises(ValueError, match=rf"^--resume: {re.escape(str(folder / 'run_id'))} names another run "
                                         rf"\({other.run_id[:12]}\.\.\.\) than all 2 checkpoints of {re.escape(str(folder))} "
                                         rf"\(model_0000000.pth, model_final.pth\), which agree with each other on the run "
                                         rf"{ours.run_id[:12]}\.\.\.: the run_id file was replaced, or copied from another "
                                         rf"output folder; nothing was changed. Write the identity the checkpoints record "
                                         rf"back into it \(the line {ours.run_id} in .*run_id\) to continue the run, or "
                                         rf"start a new run from its weights \(MODEL.WEIGHTS .*model_final.pth\) into "
                                         rf"another output folder\.$"):
        resume(folder)
    assert (folder / "run_id").read_text() == other.run_id  # nothing was changed
    (folder / "run_id").write_text(ours.run_id + "\n")  # what the message says: the run resumes as its own
    resumed, state = resume(folder)
    assert state["iteration"] == 2 and resumed.run_id == ours.run_id
    # checkpoints that disagree among themselves: the one resumed is another run's, copied there
    shutil.copy(tmp_path / "other" / "model_final.pth", folder / "model_final.pth")
    shutil.copy(tmp_path / "other" / "model_final.pth.sha256", folder / "model_final.pth.sha256")
    with pytest.raises(ValueError, match=rf"model_final.pth was saved by another run than the one in .*ours: it records "
                                         rf"the run {other.run_id[:12]}\.\.\., the folder's run_id file the run "
                                         rf"{ours.run_id[:12]}\.\.\.; it is another run's checkpoint copied there"):
        resume(folder)


# before: a save of another checkpointer into the same folder and name (a model with other norm settings, or another
# run) replaced the run's checkpoint without a word
def test_a_save_over_another_models_or_runs_checkpoint_keeps_that_file_aside(tmp_path):
    from gwdet.layers import GroupWhitening
    from gwdet.utils.atomic import checksum_problem

    def gw_model(groups):
        return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 1), GroupWhitening(8, groups))

    run = ResilientCheckpointer(gw_model(4), save_dir=str(tmp_path))
    run.save("model_final")
    run.save("model_final")  # its own file again: replaced as it is
    assert sorted(os.listdir(tmp_path)) == ["last_checkpoint", "model_final.pth", "model_final.pth.sha256"]
    earlier = (tmp_path / "model_final.pth").read_bytes()
    with logged_warnings("gwdet.checkpoint.resilient") as warnings:
        ResilientCheckpointer(gw_model(2), save_dir=str(tmp_path)).save("model_final")
    kept = tmp_path / "model_final_replaced.pth"
    assert kept.read_bytes() == earlier and checksum_problem(str(kept)) is None
    assert torch.load(tmp_path / "model_final.pth", weights_only=True)["gwdet_norm_settings"]["1"]["num_groups"] == 2
    assert warnings == [
        f"{tmp_path / 'model_final.pth'} held the checkpoint of a model with other norm settings; it is kept "
        "as model_final_replaced.pth, and this checkpoint is saved as model_final.pth. Give each model or run its own "
        "save_dir or checkpoint name to keep them apart."]
    # the same model saved by another run (other run identities recorded)
    (tmp_path / "runs").mkdir()
    first, second = (ResilientCheckpointer(gw_model(2), save_dir=str(tmp_path / "runs")) for _ in range(2))
    for checkpointer in (first, second):
        checkpointer.run_id = new_run_id()
        checkpointer.save("model_final")
    assert sorted(path.name for path in (tmp_path / "runs").glob("*.pth")) == ["model_final.pth",
                                                                                "model_final_replaced.pth"]
