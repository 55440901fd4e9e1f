"""Several machines without a cluster: two ``tools/train_net.py`` processes on localhost acting as
two machines end with the weights of one machine running two processes; an address nobody answers,
a machine left alone and a rank that dies all stop with a clear error in bounded time."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

from conftest import DEMO_CONFIG, REPO, TINY_OPTS
from gwdet.data import prepare_datasets
from gwdet.model_zoo import build_config
from gwdet.engine.launch import WorkerFailed, WorkerRefused, launch
from gwdet.errors import GwdetValueError

TRAIN_NET = [sys.executable, str(REPO / "tools" / "train_net.py"), "--config", str(DEMO_CONFIG), "--threads", "1"]
OPTS = TINY_OPTS + ["SOLVER.MAX_ITER", "4", "DATASETS.TEST", "()"]


def child_env(**extra: str) -> dict:
    """The environment of the processes a test starts: the session's dataset cache (set by conftest
    after this module is imported), one thread."""
    return {**os.environ, "OMP_NUM_THREADS": "1", **extra}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start(*arguments: str) -> subprocess.Popen:
    return subprocess.Popen([*TRAIN_NET, *arguments], cwd=REPO, env=child_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def finish(process: subprocess.Popen, timeout: float = 600) -> str:
    output, _ = process.communicate(timeout=timeout)
    assert process.returncode == 0, output[-4000:]
    return output


@pytest.fixture(scope="module", autouse=True)
def generated_dataset():
    """The shapes dataset generated once, before processes that would all generate it at once start."""
    prepare_datasets(build_config(str(DEMO_CONFIG), OPTS))


def test_two_machines_on_localhost_end_with_the_weights_of_one_machine_with_two_processes(tmp_path):
    one, two = tmp_path / "one_machine", tmp_path / "two_machines"
    url = f"tcp://127.0.0.1:{free_port()}"
    runs = [start("--num-gpus", "2", *OPTS, "OUTPUT_DIR", str(one))]
    runs += [start("--num-gpus", "1", "--num-machines", "2", "--machine-rank", str(rank), "--dist-url", url,
                   *OPTS, "OUTPUT_DIR", str(two)) for rank in (1, 0)]  # the second machine may start first
    for run in runs:
        finish(run)
    expected = torch.load(one / "model_final.pth", map_location="cpu", weights_only=True)["model"]
    trained = torch.load(two / "model_final.pth", map_location="cpu", weights_only=True)["model"]
    assert expected.keys() == trained.keys()
    for name, tensor in expected.items():
        assert torch.equal(trained[name], tensor), name


def test_machines_that_cannot_meet_stop_with_a_clear_error_in_bounded_time(tmp_path):
    """The second machine when nothing answers at --dist-url; the first when nobody joins it."""
    alone, unanswered = (f"tcp://127.0.0.1:{free_port()}" for _ in range(2))
    started = time.monotonic()
    first = start("--num-machines", "2", "--machine-rank", "0", "--dist-url", alone, "--rendezvous-timeout", "2",
                  *OPTS, "OUTPUT_DIR", str(tmp_path / "first"))
    second = start("--num-machines", "2", "--machine-rank", "1", "--dist-url", unanswered,
                   "--rendezvous-timeout", "2", *OPTS, "OUTPUT_DIR", str(tmp_path / "second"))
    first_output, _ = first.communicate(timeout=120)
    second_output, _ = second.communicate(timeout=120)
    assert time.monotonic() - started < 90
    assert second.returncode != 0
    assert f"Nothing answers at --dist-url {unanswered} after 2 s" in second_output
    assert "--machine-rank 0" in second_output
    assert first.returncode != 0
    assert f"Process 0 of 2 could not meet the others at {alone} within 2 s" in first_output
    assert not (tmp_path / "first" / "model_final.pth").exists()


def fail_on_rank_one() -> None:
    """Rank 1 fails; rank 0 waits for it in a collective (module level: spawned processes import it)."""
    if dist.get_rank() == 1:
        raise ValueError("rank 1 failed on purpose")
    dist.barrier()


def test_a_rank_that_dies_stops_the_others_with_its_error():
    started = time.monotonic()
    with pytest.raises(WorkerFailed, match=r"process 1 of this machine failed(.|\n)*rank 1 failed on purpose"):
        launch(fail_on_rank_one, 2, dist_url="auto")
    assert time.monotonic() - started < 60


def refuse_on_rank_one() -> None:
    """Rank 1 refuses the run as gwdet does (module level: spawned processes import it)."""
    if dist.get_rank() == 1:
        raise GwdetValueError("MODEL.WEIGHTS file 'nope.pth' does not exist.")
    dist.barrier()


def test_a_rank_that_refuses_the_run_reports_the_refusal_alone():
    """The tools print a refusal as one line: a worker's came with its whole traceback."""
    with pytest.raises(WorkerRefused) as refused:
        launch(refuse_on_rank_one, 2, dist_url="auto")
    assert str(refused.value) == "MODEL.WEIGHTS file 'nope.pth' does not exist."
    assert "Training process 1 of this machine failed" in str(refused.value.__cause__)  # --verbose shows it


def stop_after_meeting() -> None:
    """Both machines meet; machine 0's process then ends as gwdet's checkpoint hook ends a stopped
    training (128 + SIGTERM, after saving), a stop its peer on machine 1 received and shared."""
    dist.barrier()
    if dist.get_rank() == 0:
        sys.exit(128 + 15)


def test_a_stop_received_on_another_machine_ends_this_machine_as_a_stop():
    # machine 0 ended with "error: Training process 0 of this machine was stopped by SIGTERM (sent to it alone)"
    # and status 2 when the SIGTERM went to machine 1's process, whose stop the run shares
    from gwdet.checkpoint.signal_hook import TrainingInterrupted

    url = f"tcp://127.0.0.1:{free_port()}"
    other = subprocess.Popen(
        [sys.executable, "-c", "import sys; from test_cluster_machines import stop_after_meeting; "
         "from gwdet.engine.launch import launch; "
         f"launch(stop_after_meeting, 1, num_machines=2, machine_rank=1, dist_url={url!r})"],
        cwd=REPO / "tests", env=child_env(PYTHONPATH=str(REPO)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    try:
        with pytest.raises(TrainingInterrupted) as stopped:
            launch(stop_after_meeting, 1, num_machines=2, machine_rank=0, dist_url=url)
        assert stopped.value.code == 128 + 15
    finally:
        output, _ = other.communicate(timeout=120)
    assert other.returncode == 0, output[-3000:]
