"""gwdet.engine.launch starts CPU processes in a gloo group with detectron2's per-machine group set up,
on every supported detectron2 (v0.6's own launch needs CUDA for that)."""
import json

import torch

from gwdet.engine.launch import launch


def record_rank(out_dir: str) -> None:
    """Runs in each spawned process (module-level so that spawn can import it)."""
    import torch.distributed as dist
    from detectron2.utils import comm

    total = torch.tensor([comm.get_rank() + 1])
    dist.all_reduce(total)
    facts = {"rank": comm.get_rank(), "world_size": comm.get_world_size(), "local_rank": comm.get_local_rank(),
             "local_size": comm.get_local_size(), "backend": dist.get_backend(), "sum": int(total)}
    with open(f"{out_dir}/rank{comm.get_rank()}.json", "w") as f:
        json.dump(facts, f)


def test_two_cpu_processes_form_a_gloo_group(tmp_path):
    launch(record_rank, 2, dist_url="auto", args=(str(tmp_path),))
    facts = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [f["rank"] for f in facts] == [0, 1]
    assert [f["local_rank"] for f in facts] == [0, 1]
    assert all(f["world_size"] == f["local_size"] == 2 for f in facts)
    assert all(f["backend"] == "gloo" for f in facts) or torch.cuda.is_available()
    assert all(f["sum"] == 3 for f in facts), "all_reduce went through the group"


def test_one_process_runs_in_this_process(tmp_path):
    from detectron2.utils import comm

    seen = []
    launch(lambda: seen.append(comm.get_world_size()), 1)
    assert seen == [1]


def kill_rank_one() -> None:
    """Rank 1 is killed from outside (as the out-of-memory killer would); rank 0 goes on working."""
    import os
    import signal
    import time

    from detectron2.utils import comm

    if comm.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)


def test_a_process_killed_from_outside_is_named_with_the_way_on():
    # it read "Training process 0 of this machine failed" with process 0's gloo traceback, and no next step
    import pytest

    from gwdet.engine.launch import WorkerFailed

    with pytest.raises(WorkerFailed) as failed:
        launch(kill_rank_one, 2, dist_url="auto")
    assert str(failed.value).startswith("Training process 1 of this machine was killed by SIGKILL (from outside the "
                                        "run: the out-of-memory killer, a scheduler, kill); the others were stopped. "
                                        "The checkpoints written before it are kept: continue with --resume.")


def abort_rank_one() -> None:
    """Rank 1 aborts (as C++'s std::terminate does); rank 0 goes on working."""
    import os
    import time

    from detectron2.utils import comm

    if comm.get_rank() == 1:
        os.abort()
    time.sleep(60)


def test_a_process_that_crashed_is_not_said_to_be_killed_from_outside():
    # SIGABRT read "killed by SIGABRT (from outside the run: the out-of-memory killer, ...)"
    import pytest

    from gwdet.engine.launch import WorkerFailed

    with pytest.raises(WorkerFailed) as failed:
        launch(abort_rank_one, 2, dist_url="auto")
    assert str(failed.value).startswith("Training process 1 of this machine was killed by SIGABRT (a crash inside it: "
                                        "a library that aborted, a memory fault); the others were stopped.")


def refuse_while_another_aborts() -> None:
    """Rank 1 refuses (as processes given different configs do) and is slow to exit; rank 0 then
    aborts (as gloo's teardown did now and then: "terminate called without an active exception"),
    so that torch notices rank 0's SIGABRT first."""
    import atexit
    import os
    import time

    from detectron2.utils import comm

    from gwdet.errors import GwdetValueError

    if comm.get_rank() == 0:
        time.sleep(1)
        os.abort()
    atexit.register(time.sleep, 4)
    raise GwdetValueError("the processes of this run hold different configs")


def test_a_refusal_is_reported_as_such_when_another_process_aborts():
    # the refusal was reported as "killed by SIGABRT (from outside the run ...)" with the traceback
    import pytest

    from gwdet.engine.launch import WorkerRefused

    with pytest.raises(WorkerRefused, match="^the processes of this run hold different configs$"):
        launch(refuse_while_another_aborts, 2, dist_url="auto")


def test_a_machine_rank_outside_the_machines_is_refused_before_anything_starts():
    # it waited for the first machine, then said "Nothing answers at --dist-url"
    import pytest

    from gwdet.errors import GwdetValueError

    with pytest.raises(GwdetValueError, match=r"^launch: machine_rank=3 names no machine of num_machines=2: give "
                                              r"each machine its rank, 0 to 1"):
        launch(print, 1, num_machines=2, machine_rank=3, dist_url="tcp://127.0.0.1:1")
    with pytest.raises(GwdetValueError, match=r"^launch: num_processes_per_machine=0: give a whole number of at least 1"):
        launch(print, 0)


def test_machines_started_with_other_process_counts_stop_saying_so():
    # machine 0 with one process, machine 1 with two: both waited without end in gloo's joining
    from datetime import timedelta

    import pytest
    import torch.distributed as dist

    from gwdet.engine.launch import RendezvousError, _check_same_layout

    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))
    url = f"tcp://127.0.0.1:{store.port}"
    with pytest.raises(RendezvousError, match=r"^Process 0 \(2 processes, 1 per machine\) waited 1 s at tcp://.* for "
                                              r"processes that did not come"):
        _check_same_layout(store, 0, 2, 1, url, timedelta(seconds=1))  # rank 1 of that count never writes
    with pytest.raises(RendezvousError, match=r"^Process 2 was started for 4 processes, 2 per machine, the first "
                                              r"machine's processes for 2 processes, 1 per machine. Start every machine "
                                              r"with the same --num-gpus"):
        _check_same_layout(store, 2, 4, 2, url, timedelta(seconds=1))
    _check_same_layout(store, 1, 2, 1, url, timedelta(seconds=1))  # the same counts: joins


def cpu_ddp_with_device_ids() -> None:
    """What detectron2's DefaultTrainer does: DDP with the local rank as device_ids, here a CPU model."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    DistributedDataParallel(torch.nn.Linear(2, 2), device_ids=[0])


def test_a_trainer_that_wraps_a_cpu_model_with_device_ids_is_pointed_to_gwdets():
    # a DefaultTrainer of one's own on CPU processes ended in torch's raw DDP ValueError
    import pytest

    from gwdet.engine.launch import CPU_DDP_HINT, WorkerFailed

    with pytest.raises(WorkerFailed) as failed:
        launch(cpu_ddp_with_device_ids, 2, dist_url="auto")
    assert str(failed.value).startswith(CPU_DDP_HINT) and "gwdet.engine.trainer.Trainer" in CPU_DDP_HINT


def test_a_process_stopped_by_a_signal_sent_to_it_alone_is_named_with_the_way_on():
    # "error: process 1 terminated with exit code 143": torch's words for a process that saved and stopped on SIGTERM
    import torch.multiprocessing as mp

    from gwdet.engine.launch import _stopped_process

    stopped = mp.ProcessExitedException("process 1 terminated with exit code 143", error_index=1, error_pid=4321,
                                        exit_code=143)
    assert _stopped_process(stopped).startswith(
        "Training process 1 of this machine was stopped by SIGTERM (sent to it alone); the others were stopped. A "
        "checkpoint of its iteration was saved before it stopped when it was training: continue with --resume.")
    failed = mp.ProcessExitedException("process 1 terminated with exit code 1", error_index=1, error_pid=4321,
                                       exit_code=1)
    assert _stopped_process(failed) is None
    # an --eval-only: "continue with --resume" (nothing of it is kept, the same command runs it again)
    assert _stopped_process(stopped, evaluation=True).startswith(
        "Evaluation process 1 of this machine was stopped by SIGTERM (sent to it alone); the others were stopped. An "
        "evaluation keeps nothing of a stopped run: run the same --eval-only command again.")


def test_a_process_of_another_machine_that_went_away_is_named_with_the_way_on():
    # "Training process 0 of this machine failed" and gloo's raw "Connection reset by peer ... GLHF!" when
    # the other machine's process was killed: this machine's own process was blamed
    from gwdet.engine.launch import _peer_lost

    report = ("Training process 0 of this machine failed; the others were stopped:\nRuntimeError: [../third_party/gloo/"
              "gloo/transport/tcp/pair.cc:545] Read error [127.0.0.1]:157: Connection reset by peer")
    assert _peer_lost(report, num_machines=2).startswith(
        "A process of another machine of the run went away while the processes worked together (gloo: connection "
        "closed or reset by its peer): killed there (the out-of-memory killer, a scheduler, kill), or that machine "
        "lost; this machine's processes were stopped. The checkpoints written before are kept: continue with "
        "--resume on every machine.")
    assert "run the same --eval-only command again" in _peer_lost(report, 2, evaluation=True)
    assert _peer_lost(report, num_machines=1) is None  # one machine: its own processes are named as they are
    assert _peer_lost("Training process 0 of this machine failed:\nValueError: x", num_machines=2) is None


def terminate_rank_one() -> None:
    """Rank 1 ends by SIGTERM without a handler (an evaluation's process, sent a scheduler's signal)."""
    import os
    import signal
    import time

    from detectron2.utils import comm

    if comm.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(60)


def test_an_evaluation_process_ended_by_a_signal_is_not_told_to_resume_nor_blamed_on_the_oom_killer():
    # "Training process 1 ... killed by SIGTERM (from outside the run: the out-of-memory killer, a scheduler, kill)
    # ... continue with --resume", for an --eval-only (the out-of-memory killer sends SIGKILL only)
    import pytest

    from gwdet.engine.launch import WorkerFailed

    with pytest.raises(WorkerFailed) as failed:
        launch(terminate_rank_one, 2, dist_url="auto", evaluation=True)
    assert str(failed.value).startswith(
        "Evaluation process 1 of this machine was killed by SIGTERM (from outside the run: a scheduler, kill); the "
        "others were stopped. An evaluation keeps nothing of a stopped run: run the same --eval-only command again.")


def abort_at_exit_on_rank_zero(out_dir: str) -> None:
    """Every process finishes its work; rank 0 then aborts while its interpreter exits (as gloo's teardown
    did: "terminate called without an active exception")."""
    import atexit
    import os

    from detectron2.utils import comm

    if comm.get_rank() == 0:
        atexit.register(os.abort)
    open(os.path.join(out_dir, f"done{comm.get_rank()}"), "w").close()


def test_a_crash_at_exit_after_every_process_finished_its_work_is_a_warning_not_a_failure(tmp_path, caplog):
    # the run was reported as a crash (WorkerFailed) although both processes had returned from their work
    import logging

    with caplog.at_level(logging.WARNING, logger="gwdet.engine.launch"):
        launch(abort_at_exit_on_rank_zero, 2, dist_url="auto", args=(str(tmp_path),))
    assert sorted(path.name for path in tmp_path.iterdir()) == ["done0", "done1"]
    assert any("The processes finished their work; one then ended by" in record.getMessage() and "SIGABRT" in
               record.getMessage() for record in caplog.records), caplog.text
