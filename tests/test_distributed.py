"""Two CPU processes (gloo) through gwdet's launch: all ranks end with identical parameters.

BN buffers (running statistics) are per process, as in the paper's per-GPU BN (detectron2 does not
broadcast buffers); only parameters are synchronised by DistributedDataParallel and compared here.
"""
import subprocess
import sys

import torch

import distributed_worker
from conftest import DEMO_CONFIG, REPO, TINY_OPTS
from gwdet.engine.launch import launch

BN_GW_S1B2 = ["MODEL.RESNETS.NORM", "BN", "MODEL.RESNETS.GW_POSITIONS", "S1-B2", "MODEL.FPN.NORM", "BN",
              "MODEL.ROI_BOX_HEAD.NORM", "BN", "MODEL.ROI_MASK_HEAD.NORM", "BN"]


def test_two_process_training_keeps_ranks_identical(tmp_path):
    # GW at S1-B2 and BN everywhere else: the parameters of both kinds of layer, in one run
    opts = TINY_OPTS + ["SOLVER.MAX_ITER", "3", "DATASETS.TEST", "()"] + BN_GW_S1B2
    launch(distributed_worker.train_and_save_parameters, 2, dist_url="auto", args=(str(DEMO_CONFIG), opts, str(tmp_path)))
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pth", weights_only=True) for r in (0, 1))
    assert rank0["world_size"] == rank1["world_size"] == 2
    assert (rank0["local_rank"], rank1["local_rank"]) == (0, 1)
    assert rank0["local_size"] == rank1["local_size"] == 2
    assert (tmp_path / "model_final.pth").exists(), "rank 0 saved the final checkpoint"
    for name, value in rank0["parameters"].items():
        assert torch.equal(value, rank1["parameters"][name]), name
    # the checkpoint holds process 0's random generators, which every process resumes with: said, not silent
    assert "--resume of a run of 2 processes: the checkpoint holds the random generators of process 0" in \
        (tmp_path / "resume0.txt").read_text()


def test_processes_started_with_different_configs_are_refused_in_every_process(tmp_path):
    launch(distributed_worker.check_rank_configs, 2, dist_url="auto", args=(str(DEMO_CONFIG), str(tmp_path)))
    threads = int((tmp_path / "threads0.txt").read_text())
    for rank in (0, 1):
        # the values that differ were not named (an OUTPUT_DIR of each machine's own disk, say)
        assert (tmp_path / f"rank{rank}.txt").read_text().splitlines() == [
            "The processes of this run hold different configs (rank 1 against rank 0; rank 1's values, rank 0's first: "
            "MODEL.GW.NUM_GROUPS: 16 -> 8): start every machine with the same config file and the same overrides "
            "(OUTPUT_DIR too: on disks of each machine's own, give the same path on each).",
            "The processes of this run were started with different requests (rank 0: none; rank 1: --resume): start "
            "every machine with the same flags (--resume, --eval-only) as well as the same config.",
            # results.json recorded rank 0's count as the run's
            f"The processes of this run compute on the CPU with different numbers of threads (rank 0: {threads}; rank 1: "
            f"{threads + 1}), which changes the order of their sums and so the weights' last bits, and results.json "
            "records one count: start every machine with the same --threads N."]


def test_the_processes_of_an_evaluation_beside_a_run_write_into_one_folder(tmp_path):
    # --num-gpus 2 --eval-only beside a run: each process chose its own eval/ folder (the second found the first's
    # taken), and the run was refused as one of processes holding different configs
    from gwdet.model_zoo import build_config
    from gwdet.utils.atomic import write_text_with_checksum

    run = tmp_path / "run"  # what the choice reads of a run's folder: its recorded config and its checkpoint
    run.mkdir()
    write_text_with_checksum(str(run / "config.yaml"), build_config(str(DEMO_CONFIG), [*TINY_OPTS, "OUTPUT_DIR",
                                                                                        str(run)]).dump())
    torch.save({"model": {}, "iteration": 0}, run / "model_final.pth")
    (run / "last_checkpoint").write_text("model_final.pth")
    launch(distributed_worker.choose_evaluation_folders, 2, dist_url="auto", args=(str(run), str(tmp_path)))
    assert (tmp_path / "rank0.txt").read_text() == (tmp_path / "rank1.txt").read_text() == \
        str(run / "eval" / "model_final")


def launcher_stopped_by_sigterm(tmp_path, mode: str) -> str:
    """What the two-process launcher of ``distributed_worker.py <mode>`` printed when SIGTERM reached it once
    both processes were ready; it ended with status 143."""
    import signal
    import time

    process = subprocess.Popen([sys.executable, str(REPO / "tests" / "distributed_worker.py"), mode, str(tmp_path)],
                               cwd=REPO, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not all((tmp_path / f"ready{rank}").exists() for rank in (0, 1)) and time.monotonic() < deadline:
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    _, printed = process.communicate(timeout=120)
    assert process.returncode == 143, printed[-3000:]
    return printed


def test_a_stop_signal_to_the_launcher_reaches_the_processes_and_waits_for_their_checkpoints(tmp_path):
    # SIGTERM to the tool of a --num-gpus 2 run: it ended at once with 143 while its processes were still saving
    # their checkpoint (torch then stopped them by SIGINT), which anything acting on its exit could lose
    printed = launcher_stopped_by_sigterm(tmp_path, "--stop-signal")
    assert (tmp_path / "saved0").exists() and (tmp_path / "saved1").exists()  # before the launcher ended
    assert "Stopped by SIGTERM: the processes were told to stop and did. They saved a checkpoint" in printed


def test_a_stop_signal_before_the_checkpoint_hook_is_not_reported_as_a_checkpoint(tmp_path):
    # SIGTERM to the launcher while its processes had no checkpoint hook yet (or a second signal, which stops them at
    # once): "They saved a checkpoint of their iteration", and the folder held none
    printed = launcher_stopped_by_sigterm(tmp_path, "--stop-unprotected")
    assert "Stopped by SIGTERM: the processes were told to stop and did, at once, without a checkpoint of their " \
           "iteration" in printed
    assert "They saved a checkpoint" not in printed
