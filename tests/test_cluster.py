"""Training and the norm study on a real SLURM cluster through submitit (docs/cluster.md).

These tests need a reachable cluster: ``SLURM_CONF`` set and ``sinfo`` answering, e.g. the one-node
cluster of ``scripts/local_slurm.sh start DIR`` (``.ci/run`` starts one). Without it they are skipped
with the reason. One cluster serves every test; jobs ask for one CPU and no GPU.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import DEMO_CONFIG, REPO, TINY_OPTS
from gwdet.cluster.slurm import ACTIVE_STATES
from gwdet.cluster.training import run as train_net_run
from gwdet.data import prepare_datasets
from gwdet.model_zoo import build_config
from gwdet_lab.study.cli import main as compare_norms_main

# No --gpus-per-node: the default asks for GPUs only where the partition's nodes have them.
JOB_FLAGS = ["--launcher", "slurm", "--cpus-per-task", "1", "--timeout-min", "10"]
DEMO = ["--config", str(DEMO_CONFIG), "--threads", "1"]
TRAIN_NET = [sys.executable, str(REPO / "tools" / "train_net.py"), *DEMO]
# Long enough to be signalled between checkpoints: 30 iterations, a checkpoint every 4, no evaluation.
PREEMPT_OPTS = TINY_OPTS + ["SOLVER.MAX_ITER", "30", "SOLVER.CHECKPOINT_PERIOD", "4", "DATASETS.TEST", "()"]
STUDY_OPTS = [*TINY_OPTS, "DATASETS.SHAPES.NUM_TEST", "4", "SOLVER.CHECKPOINT_PERIOD", "2"]
STUDY_CONFIGS = ["--configs", f"gn={REPO}/configs/Study/gn.yaml", f"gw={REPO}/configs/Study/gw.yaml",
                 "--seeds", "0", "--no-example-weighing"]


def child_env(**extra: str) -> dict:
    """The environment of the processes a test starts: the session's dataset cache (set by conftest
    after this module is imported), one thread."""
    return {**os.environ, "OMP_NUM_THREADS": "1", **extra}


def train_net(capsys, *arguments: str) -> tuple[int, str, str]:
    """``tools/train_net.py ARGUMENTS`` in this process (the tool is a thin wrapper of ``run``);
    the exit status, stdout and stderr. Jobs get this process's environment, as from a shell."""
    status = train_net_run([*DEMO, *arguments])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def compare_norms(capsys, *arguments: str) -> tuple[int, str, str]:
    """``tools/compare_norms.py ARGUMENTS`` in this process; the exit status, stdout and stderr."""
    status = compare_norms_main(list(arguments), repo_root=REPO)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.fixture(scope="session")
def slurm():
    """The reachable SLURM cluster (its SLURM_CONF), or skip with the reason."""
    pytest.importorskip("submitit", reason="submitit is not installed (pip install 'gwdet[cluster]')")
    if not os.environ.get("SLURM_CONF"):
        pytest.skip("no SLURM cluster: SLURM_CONF is not set (start one with "
                    "'eval $(scripts/local_slurm.sh start /tmp/gwdet-slurm)'; .ci/run does)")
    try:
        answer = subprocess.run(["sinfo", "-h"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        pytest.skip(f"no SLURM cluster reachable (SLURM_CONF={os.environ['SLURM_CONF']}): sinfo: {error}")
    if answer.returncode != 0:
        pytest.skip(f"no SLURM cluster reachable (SLURM_CONF={os.environ['SLURM_CONF']}): {answer.stderr.strip()}")
    return os.environ["SLURM_CONF"]


def run(command, timeout=300, check=True):
    completed = subprocess.run(command, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=timeout)
    if check:
        assert completed.returncode == 0, (completed.stdout + completed.stderr)[-4000:]
    return completed


def job_ids(output: str) -> list[str]:
    return re.findall(r"submitted job (\d+)", output)


def squeue_state(job_id: str) -> str | None:
    line = run(["squeue", "-h", "--states=all", "-j", job_id, "-o", "%T"], check=False).stdout.strip()
    return line or None


def wait_for_job_end(job_id: str, timeout: float = 240) -> str:
    """Poll until SLURM says the job ended; its final state."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = squeue_state(job_id)
        if state not in ACTIVE_STATES:
            return state
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} still {squeue_state(job_id)} after {timeout} s")


def restarts(job_id: str) -> int:
    details = run(["scontrol", "show", "job", "-o", job_id]).stdout
    return int(re.search(r"\bRestarts=(\d+)", details).group(1))


def final_model(output_dir: Path) -> dict:
    return torch.load(output_dir / "model_final.pth", map_location="cpu", weights_only=True)["model"]


def test_train_net_through_slurm_prints_the_job_and_waits_for_its_results(slurm, tmp_path, capsys):
    out = tmp_path / "demo"
    status, stdout, stderr = train_net(capsys, *JOB_FLAGS, "--wait", *TINY_OPTS, "OUTPUT_DIR", str(out))
    assert status == 0, stdout + stderr
    (job_id,) = job_ids(stdout)
    log = out / "submitit" / job_id / f"{job_id}_0_log.out"
    assert f"tail -f {log}" in stdout and f"squeue -j {job_id}" in stdout
    assert f"job {job_id} finished" in stdout and "### shapes_val bbox" in stdout
    assert (out / "model_final.pth").is_file() and (out / "results.json").is_file()
    assert f"[gwdet] job {job_id}, node 0 of 1: starting" in log.read_text()
    request = (out / "submitit" / job_id / f"{job_id}_submission.sh").read_text()
    assert "#SBATCH --signal=USR2@120" in request and "#SBATCH --ntasks-per-node=1" in request
    assert "gpus" not in request, "the local cluster's node has no GPU: none asked for"
    assert wait_for_job_end(job_id) == "COMPLETED"
    # SLURM requeued the finished job (as after its controller restarted): it ran again, refused to resume, FAILED
    run(["scontrol", "requeue", job_id])
    assert wait_for_job_end(job_id) == "COMPLETED" and restarts(job_id) == 1
    assert f"[gwdet] job {job_id}, node 0 of 1, restart 1: the job had finished before it was requeued; nothing to " \
           "do" in log.read_text()


def test_signalled_job_requeues_and_ends_with_the_weights_of_an_uninterrupted_run(slurm, tmp_path, capsys):
    reference, signalled = tmp_path / "uninterrupted", tmp_path / "signalled"
    prepare_datasets(build_config(str(DEMO_CONFIG), PREEMPT_OPTS))  # before two processes would generate it
    uninterrupted = subprocess.Popen([*TRAIN_NET, *PREEMPT_OPTS, "OUTPUT_DIR", str(reference)], cwd=REPO,
                                     env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    status, stdout, stderr = train_net(capsys, *JOB_FLAGS, *PREEMPT_OPTS, "OUTPUT_DIR", str(signalled))
    assert status == 0, stdout + stderr
    (job_id,) = job_ids(stdout)
    deadline = time.monotonic() + 180
    while not (signalled / "model_0000003.pth").exists():  # the first periodic checkpoint
        assert time.monotonic() < deadline and squeue_state(job_id) in ("PENDING", "RUNNING"), squeue_state(job_id)
        time.sleep(0.05)
    assert not (signalled / "model_final.pth").exists()
    run(["scancel", "--signal=USR2", job_id])  # what a time limit or preemption sends (--signal=USR2@...)
    assert wait_for_job_end(job_id) == "COMPLETED"

    assert uninterrupted.wait(timeout=300) == 0, uninterrupted.stderr.read()[-3000:]
    assert restarts(job_id) == 1, "SLURM requeued the job once"
    log = (signalled / "submitit" / job_id / f"{job_id}_0_log.out").read_text()
    assert f"Requeued job {job_id}" in log
    assert f"[gwdet] job {job_id}, node 0 of 1, restart 1: continuing from the newest checkpoint (--resume)" in log
    resumed_from = int(re.search(r"Loading from \S+model_(\d+)\.pth", log).group(1))
    assert 3 <= resumed_from < 29, "the second run continued from a checkpoint before the end"
    expected, resumed = final_model(reference), final_model(signalled)
    assert expected.keys() == resumed.keys()
    for name, tensor in expected.items():
        assert torch.equal(resumed[name], tensor), name


def test_study_submits_each_cell_once_and_the_last_cell_writes_the_report(slurm, tmp_path, capsys):
    study = ["--out", str(tmp_path), *STUDY_CONFIGS]
    status, stdout, stderr = compare_norms(capsys, *study, *JOB_FLAGS, "--opts", *STUDY_OPTS)
    assert status == 0, stdout + stderr
    jobs = job_ids(stdout)
    assert len(jobs) == 2, stdout
    records = {cell: json.loads((tmp_path / "runs" / cell / "cluster_job.json").read_text())["job_id"]
               for cell in ("gn-s0", "gw-s0")}
    assert sorted(records.values()) == sorted(jobs)

    status, again, _ = compare_norms(capsys, *study, *JOB_FLAGS, "--opts", *STUDY_OPTS)  # queued, running or done
    assert status == 0 and job_ids(again) == [] and "submitted 0 job(s)" in again
    for cell, job_id in records.items():
        assert re.search(rf"{cell}: (job {job_id} is [A-Z]+.*; not submitted again|done \(job {job_id}\))", again), again
    status, listed, _ = compare_norms(capsys, *study, "--list", "--opts", *STUDY_OPTS)
    for cell, job_id in records.items():
        assert re.search(rf"^{cell} .*\n    job {job_id} [A-Z]+", listed, re.MULTILINE), listed

    status, stdout, stderr = compare_norms(capsys, *study, *JOB_FLAGS, "--opts", *STUDY_OPTS, "SOLVER.BASE_LR", "0.5")
    assert status == 2 and "SOLVER.BASE_LR: recorded 0.01, requested 0.5" in stderr
    assert job_ids(stdout) == []

    for job_id in jobs:
        assert wait_for_job_end(job_id) == "COMPLETED"
    table = (tmp_path / "custom" / "table.md").read_text()
    assert "| GN | 2 | 1 |" in table and "| GW | 2 | 1 |" in table and "## Pending" not in table
    logs = [(tmp_path / "runs" / cell / "submitit" / job_id / f"{job_id}_0_log.out").read_text()
            for cell, job_id in records.items()]
    assert sum("wrote " in log and "table.md" in log for log in logs) >= 1, "a cell's job wrote the report"
    for cell in records:  # each job recorded its wall time and memory for the report, as local runs do
        usage = json.loads((tmp_path / "runs" / cell / "study_run.json").read_text())
        assert usage["sessions"] == 1 and usage["wall_seconds"] > 0 and usage["peak_rss_mb"] > 100

    status, done, _ = compare_norms(capsys, *study, *JOB_FLAGS, "--opts", *STUDY_OPTS)
    assert status == 0 and job_ids(done) == []
    assert all(f"{cell}: done (job {job_id})" in done for cell, job_id in records.items()), done


def test_an_option_slurm_rejects_is_shown_and_nothing_is_left(slurm, tmp_path, capsys):
    out = tmp_path / "refused"
    status, _, stderr = train_net(capsys, *JOB_FLAGS, "--partition", "no_such_partition", *TINY_OPTS,
                                  "OUTPUT_DIR", str(out))
    assert status == 2
    assert "SLURM refused the job" in stderr and "invalid partition specified: no_such_partition" in stderr
    assert not out.exists(), sorted(out.rglob("*"))


def test_a_job_that_can_never_start_and_a_second_job_into_a_busy_folder_are_named(slurm, tmp_path, capsys):
    # more CPUs per task than any node has: "submitted job N", exit 0, and a job pending forever
    out = tmp_path / "stuck"
    flags = [flag if flag != "1" else "64" for flag in JOB_FLAGS]  # --cpus-per-task 64
    status, stdout, stderr = train_net(capsys, *flags, *TINY_OPTS, "OUTPUT_DIR", str(out))
    (job_id,) = job_ids(stdout)
    try:
        assert status == 1, stdout + stderr
        assert f"job {job_id} is pending for the reason PartitionConfig: it asks for more than the partition's nodes " \
               "have" in stderr and f"Cancel it (scancel {job_id})" in stderr
        # a second job into the folder of a queued one failed later, in its own log only
        status, _, stderr = train_net(capsys, *JOB_FLAGS, *TINY_OPTS, "OUTPUT_DIR", str(out))
        assert status == 2 and f"OUTPUT_DIR {out} is the folder of job {job_id}, still queued or running" in stderr
        assert job_ids(stderr) == [] and [p.name for p in (out / "submitit").iterdir() if p.is_dir()] == [job_id]
    finally:
        run(["scancel", job_id], check=False)
    # a request a run refuses before it writes anything was submitted, and failed in the job's own log
    classes = tmp_path / "classes"
    status, stdout, stderr = train_net(capsys, *JOB_FLAGS, *TINY_OPTS, "MODEL.ROI_HEADS.NUM_CLASSES", "5",
                                       "OUTPUT_DIR", str(classes))
    assert status == 2 and "MODEL.ROI_HEADS.NUM_CLASSES is 5" in stderr and not job_ids(stdout)
