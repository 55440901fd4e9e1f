"""``--launcher`` without a cluster: submitit's local executor runs the same job; bad input (submitit
missing, no SLURM commands, no controller answering, flags that do not fit) is refused with a clear
message before anything is submitted or written."""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import multiprocessing
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import DEMO_CONFIG, REPO, TINY_OPTS
from gwdet.cluster.options import add_launcher_arguments, launcher_options, parse_slurm_extra
from gwdet.cluster.slurm import ClusterUnavailable, check_reachable
from gwdet.cluster.training import TrainingJob, run as train_net
from gwdet_lab.study.cli import main as compare_norms

TRAIN_NET = [sys.executable, str(REPO / "tools" / "train_net.py"), "--config", str(DEMO_CONFIG), "--threads", "1"]
SLURM_FLAGS = ["--launcher", "slurm"]


def run(command, timeout=300):
    """``command`` with the session's dataset cache (conftest sets it after this module is imported)."""
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(command, cwd=REPO, env=environment, capture_output=True, text=True, timeout=timeout)


def test_submitit_local_runs_the_training_job_and_waits_for_its_results(tmp_path):
    pytest.importorskip("submitit")
    out = tmp_path / "demo"
    completed = run([*TRAIN_NET, "--launcher", "submitit-local", "--wait", *TINY_OPTS,
                     "OUTPUT_DIR", str(out)])
    assert completed.returncode == 0, (completed.stdout + completed.stderr)[-4000:]
    job_id = re.search(r"submitted job (\d+) \(submitit-local\)", completed.stdout).group(1)
    assert f"job {job_id} finished" in completed.stdout and "### shapes_val bbox" in completed.stdout
    assert (out / "model_final.pth").is_file()
    log = (out / "submitit" / job_id / f"{job_id}_0_log.out").read_text()
    assert f"[gwdet] job {job_id}, node 0 of 1: starting" in log
    # an evaluation of the run with another test setting printed the training's results.md, not its own
    evaluated = run([*TRAIN_NET, "--launcher", "submitit-local", "--wait", "--eval-only", "--resume", *TINY_OPTS,
                     "MODEL.ROI_HEADS.SCORE_THRESH_TEST", "0.3", "OUTPUT_DIR", str(out)])
    assert evaluated.returncode == 0, (evaluated.stdout + evaluated.stderr)[-4000:]
    assert f"finished; results in {out / 'eval' / 'model_final'}\n" in evaluated.stdout, evaluated.stdout
    assert "`MODEL.ROI_HEADS.SCORE_THRESH_TEST 0.3`" in evaluated.stdout


def test_the_results_of_an_evaluation_are_found_in_the_folder_it_wrote(tmp_path):
    # a job's --eval-only answered OUTPUT_DIR, whose results.md is the training's, not the evaluation's
    from gwdet.cluster.training import newest_results_folder, results_files

    fresh = tmp_path / "fresh"
    fresh.mkdir()
    before = results_files(str(fresh))
    assert before == set() and newest_results_folder(str(fresh), before) is None
    (fresh / "results.json").write_text("{}")  # an evaluation into a folder without a run writes there
    assert newest_results_folder(str(fresh), before) == str(fresh)

    run_folder = tmp_path / "run"
    (run_folder / "eval" / "model_final").mkdir(parents=True)
    for folder in (run_folder, run_folder / "eval" / "model_final"):
        (folder / "results.json").write_text("{}")
    before = results_files(str(run_folder))
    assert len(before) == 2
    for name in ("model_final-3", "model_final-2"):  # written in this order: the later one is the newest
        (run_folder / "eval" / name).mkdir()
        (run_folder / "eval" / name / "results.json").write_text("{}")
        time.sleep(0.01)
    assert newest_results_folder(str(run_folder), before) == str(run_folder / "eval" / "model_final-2")


def test_the_stop_command_ends_a_submitit_local_job_before_its_training_starts(tmp_path):
    # submitit ignored SIGTERM ("Bypassing signal SIGTERM") until training began, and the job trained to its end
    pytest.importorskip("submitit")
    out = tmp_path / "stopped"
    submitted = run([*TRAIN_NET, "--launcher", "submitit-local", *TINY_OPTS, "SOLVER.MAX_ITER", "100000",
                     "OUTPUT_DIR", str(out)])
    assert submitted.returncode == 0, (submitted.stdout + submitted.stderr)[-4000:]
    job_id = int(re.search(r"stop:   kill -TERM (\d+)", submitted.stdout).group(1))
    log = out / "submitit" / str(job_id) / f"{job_id}_0_log.out"
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (log.exists() and "[gwdet] job" in log.read_text()):
            time.sleep(0.05)
        assert "[gwdet] job" in log.read_text(), "the job started"
        os.kill(job_id, signal.SIGTERM)  # the printed stop command, while the job reads its config
        deadline = time.time() + 60
        while time.time() < deadline and alive(job_id):
            time.sleep(0.2)
        assert not alive(job_id), "the job ended"
        assert not (out / "log.txt").exists() or "Starting training" not in (out / "log.txt").read_text()
    finally:
        tasks = subprocess.run(["pgrep", "-P", str(job_id)], capture_output=True, text=True).stdout.split()
        for pid in [job_id, *map(int, tasks)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_sbatch_options_that_defeat_the_launcher_are_refused():
    # no-requeue ended a preempted job in submitit's traceback; an array ran a second task that waited for ever
    with pytest.raises(ValueError, match=r"^--slurm-extra 'no-requeue': sbatch's --no-requeue would defeat the "
                                         r"launcher \(the job requeues itself .*Nothing was submitted\.$"):
        parse_slurm_extra(["no-requeue"])
    for item in ("array=0-1", "a=0-1", "--array=3"):
        with pytest.raises(ValueError, match=r"sbatch's --array would defeat the launcher \(one run folder takes one "
                                             r"job"):
            parse_slurm_extra([item])
    assert parse_slurm_extra(["requeue", "qos=high"]) == {"requeue": True, "qos": "high"}


def test_a_jobs_command_line_refused_when_it_starts_is_a_one_line_refusal(tmp_path):
    # a config file moved away before the job started: argparse's usage in the job's .err, and --wait said only FAILED
    import traceback

    from gwdet.cluster.executor import _gwdet_refusal
    from gwdet.cluster.training import parse_job_args
    from gwdet.errors import GwdetValueError

    gone = tmp_path / "my.yaml"
    with pytest.raises(GwdetValueError) as refused:
        parse_job_args(["--config", str(gone), "--launcher", "local"])
    message = str(refused.value)
    assert message.startswith("The job's command line, checked when it was submitted, was refused when the job "
                              "started") and f"submit the command again. Config file {str(gone)!r} does not exist" in message
    trace = "".join(traceback.format_exception(refused.value))  # what submitit reports of the job's error
    assert _gwdet_refusal(trace) == message
    assert parse_job_args(["--config", str(DEMO_CONFIG), "--launcher", "local"]).config_file == str(DEMO_CONFIG)


def test_ctrl_c_while_waiting_stops_the_waiting_and_says_how_to_stop_the_job(tmp_path):
    """Before: a raw KeyboardInterrupt traceback, and nothing said of the job that kept training."""
    pytest.importorskip("submitit")
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    errors = tmp_path / "stderr.txt"
    with open(errors, "w") as stderr:
        waiting = subprocess.Popen([*TRAIN_NET, "--launcher", "submitit-local", "--wait", *TINY_OPTS, "SOLVER.MAX_ITER",
                                    "100000", "OUTPUT_DIR", str(tmp_path / "long")], cwd=REPO, env=environment,
                                   stdout=subprocess.PIPE, stderr=stderr, text=True,
                                   # pytest-xdist's workers ignore SIGINT, which a child would inherit
                                   preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    job_id = None
    try:
        for line in waiting.stdout:  # the job's id, once submitted
            found = re.search(r"submitted job (\d+) \(submitit-local\)", line)
            if found:
                job_id = int(found.group(1))
                break
        # the job's controller writes into its own log, not the tool's output: a pipe (`... | tee`) held until the
        # job ended
        for descriptor in (1, 2):
            assert os.readlink(f"/proc/{job_id}/fd/{descriptor}") == str(tmp_path / "long" / "submitit" /
                                                                         "controller.log")
        time.sleep(1)  # into the waiting
        waiting.send_signal(signal.SIGINT)
        waiting.wait(timeout=60)
        err = errors.read_text()
        assert waiting.returncode == 130, err[-3000:]
        assert f"stopped waiting; job {job_id} still runs. To stop it too: stop:   kill -TERM {job_id}" in err
        assert "Traceback" not in err
        # the command given stops the job with a checkpoint (it said kill -INT: ignored by a script's background job,
        # and submitit's controller kills the training a second after passing SIGINT on)
        log, deadline = tmp_path / "long" / "log.txt", time.time() + 300
        while time.time() < deadline and not (log.exists() and "save a checkpoint of the current" in log.read_text()):
            time.sleep(0.1)
        os.kill(job_id, signal.SIGTERM)
        deadline = time.time() + 300
        while time.time() < deadline and subprocess.run(["kill", "-0", str(job_id)], capture_output=True).returncode == 0:
            time.sleep(0.2)
        assert "Stopped by SIGTERM after iteration" in log.read_text()
        assert [path.name for path in (tmp_path / "long").glob("model_*.pth")], "a checkpoint of the stop"
    finally:
        waiting.kill()
        if job_id is not None:  # the job's controller and the training process it started
            tasks = subprocess.run(["pgrep", "-P", str(job_id)], capture_output=True, text=True).stdout.split()
            for pid in [job_id, *map(int, tasks)]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def test_submitit_local_runs_a_lazy_config_and_refuses_its_occupied_folder(tmp_path):
    """A LazyConfig goes through the launcher as a yacs config does: the job trains it into its
    train.output_dir, and a second submission into that folder is refused before submitting."""
    pytest.importorskip("submitit")
    from test_lazy_training import LAZY_DEMO, LAZY_TINY

    out = tmp_path / "lazy"
    command = [sys.executable, str(REPO / "tools" / "train_net.py"), "--config-file", str(LAZY_DEMO), "--threads", "1",
               "--launcher", "submitit-local", *LAZY_TINY, f"train.output_dir={out}"]
    completed = run([*command, "--wait"])
    assert completed.returncode == 0, (completed.stdout + completed.stderr)[-4000:]
    assert re.search(r"job \d+ finished", completed.stdout) and "### shapes_val bbox" in completed.stdout
    assert (out / "model_final.pth").is_file()
    again = run(command)
    assert again.returncode == 2 and "already holds a run" in again.stderr, again.stdout + again.stderr
    jobs = [folder for folder in (out / "submitit").iterdir() if folder.name.isdigit()]
    assert len(jobs) == 1, "nothing submitted the second time"


def test_without_submitit_the_message_names_the_extra_and_nothing_is_written(tmp_path):
    out = tmp_path / "out"
    hide_submitit = ("import sys; sys.modules['submitit'] = None; sys.argv[0] = 'train_net.py'; "
                     "from gwdet.cluster.training import run; sys.exit(run(sys.argv[1:]))")
    completed = run([sys.executable, "-c", hide_submitit, "--config", str(DEMO_CONFIG), *SLURM_FLAGS, *TINY_OPTS,
                     "OUTPUT_DIR", str(out)])
    assert completed.returncode == 2, completed.stdout + completed.stderr
    assert "submitit, which is not installed" in completed.stderr and "pip install 'gwdet[cluster]'" in completed.stderr
    assert not out.exists()


def test_without_slurm_commands_the_message_names_the_missing_command_and_nothing_is_written(tmp_path, monkeypatch,
                                                                                            capsys):
    pytest.importorskip("submitit")
    out, study = tmp_path / "out", tmp_path / "study"
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no sbatch, squeue, ...
    assert train_net(["--config", str(DEMO_CONFIG), *SLURM_FLAGS, *TINY_OPTS, "OUTPUT_DIR", str(out)]) == 2
    assert "SLURM's command 'sbatch' is not on PATH" in capsys.readouterr().err
    assert not out.exists()
    assert compare_norms(["--out", str(study), "--configs", f"gn={REPO}/configs/Study/gn.yaml", *SLURM_FLAGS]) == 2
    assert "'sbatch' is not on PATH" in capsys.readouterr().err
    assert not study.exists()


@pytest.mark.skipif(shutil.which("scontrol") is None, reason="SLURM's client commands are not installed")
def test_without_a_controller_the_message_names_slurm_conf_and_nothing_is_written(tmp_path, monkeypatch, capsys):
    pytest.importorskip("submitit")
    conf = tmp_path / "slurm.conf"  # a cluster whose controller does not run
    conf.write_text("ClusterName=nowhere\nSlurmctldHost=localhost\nSlurmctldPort=9\nAuthType=auth/none\n"
                    "NodeName=localhost CPUs=1\nPartitionName=p Nodes=ALL Default=YES\n")
    out = tmp_path / "out"
    monkeypatch.setenv("SLURM_CONF", str(conf))
    assert train_net(["--config", str(DEMO_CONFIG), *SLURM_FLAGS, *TINY_OPTS, "OUTPUT_DIR", str(out)]) == 2
    assert f"No SLURM controller answered 'scontrol ping' (SLURM_CONF={conf})" in capsys.readouterr().err
    assert not out.exists()
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "none.conf"))
    with pytest.raises(ClusterUnavailable, match=f"SLURM_CONF={tmp_path / 'none.conf'} does not exist"):
        check_reachable()


def parse(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_launcher_arguments(parser)
    return parser.parse_args(list(flags))


def test_launcher_flags_that_do_not_fit_are_refused_with_the_fix():
    options = launcher_options(parse("--launcher", "slurm", "--nodes", "2", "--partition", "gpu",
                                     "--slurm-extra", "qos=high", "--slurm-extra", "exclusive"), 8)
    assert (options.nodes, options.processes_per_node, options.gpus_per_node, options.partition) == (2, 8, None, "gpu")
    assert options.extra == {"qos": "high", "exclusive": True}
    assert launcher_options(parse("--launcher", "slurm", "--gpus-per-node", "0"), 2).gpus_per_node == 0
    with pytest.raises(ValueError, match="--gpus-per-node 4 with --num-gpus 8"):
        launcher_options(parse("--launcher", "slurm", "--gpus-per-node", "4"), 8)
    with pytest.raises(ValueError, match="submitit-local runs on this machine only"):
        launcher_options(parse("--launcher", "submitit-local", "--nodes", "2"), 1)
    with pytest.raises(ValueError, match="--nodes and --wait belong to --launcher slurm"):
        launcher_options(parse("--wait"), 1)
    # flags the launcher would ignore are refused, never dropped
    with pytest.raises(ValueError, match=r"^--partition, --account: --launcher local does not use them .*--launcher slurm"):
        launcher_options(parse("--partition", "gpu", "--account", "lab"), 1)
    with pytest.raises(ValueError, match=r"^--timeout-min: --launcher local does not use it"):
        launcher_options(parse("--timeout-min", "5"), 1)
    with pytest.raises(ValueError, match=r"^--slurm-extra: --launcher submitit-local does not use it"):
        launcher_options(parse("--launcher", "submitit-local", "--slurm-extra", "qos=high"), 1)
    assert launcher_options(parse("--launcher", "submitit-local", "--timeout-min", "5"), 1).timeout_min == 5
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_slurm_extra(["=high"])


@pytest.mark.parametrize("launcher", ["slurm", "submitit-local"])
def test_machine_flags_a_launcher_would_replace_are_refused(launcher):
    # before: the job ran with num_machines=1, machine_rank=0 and its own rendezvous, without a word
    from gwdet.cluster.training import parse_args

    given = parse_args(["--config", str(DEMO_CONFIG), "--launcher", launcher, "--num-machines", "2",
                        "--dist-url", "tcp://127.0.0.1:29517"])
    with pytest.raises(ValueError) as refused:
        launcher_options(given, 1)
    assert str(refused.value) == (
        f"--num-machines, --dist-url: --launcher {launcher} places the processes itself (the machines --nodes asks for, "
        "their ranks and rendezvous from the job's allocation), so they would be replaced; nothing was submitted. "
        "Leave them out, and give the number of machines as --nodes.")
    launcher_options(parse_args(["--config", str(DEMO_CONFIG), "--launcher", launcher]), 1)  # the defaults: none given
    # without --dist-url: the same refusal (it advised adding --dist-url, which is then refused as above)
    with pytest.raises(ValueError, match=r"^--num-machines: --launcher .* places the processes itself"):
        launcher_options(parse_args(["--config", str(DEMO_CONFIG), "--launcher", launcher, "--num-machines", "2"]), 1)
    local = parse_args(["--config", str(DEMO_CONFIG), "--num-machines", "2", "--machine-rank", "1", "--dist-url",
                        "tcp://127.0.0.1:29517"])
    assert launcher_options(local, 1).launcher == "local"  # a run here takes them, as detectron2 does
    # an sbatch option the launcher sets: given again it replaced the launcher's without a word
    with pytest.raises(ValueError, match=r"^--slurm-extra 'signal=USR1@60': the launcher sets sbatch's --signal "
                                         r"itself \(the launcher asks for SIGUSR2 before the time limit"):
        parse_slurm_extra(["signal=USR1@60"])
    with pytest.raises(ValueError, match="sets sbatch's --cpus-per-task itself .*use --cpus-per-task"):
        parse_slurm_extra(["cpus_per_task=4"])


def free_port_pair() -> int:
    """A port whose successor is free too (slurmctld's and slurmd's ports)."""
    for _ in range(20):
        with socket.socket() as first, socket.socket() as second:
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            try:
                second.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port
    raise RuntimeError("no two adjacent free ports")


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("slurmctld") is None or shutil.which("munged") is None,
                    reason="the local cluster needs root and SLURM's and MUNGE's daemons (slurm-wlm, munge)")
def test_the_local_cluster_starts_once_and_stops_exactly_its_own_daemons(tmp_path):
    script = ["bash", str(REPO / "scripts" / "local_slurm.sh")]
    env = {**os.environ, "GWDET_SLURM_PORT": str(free_port_pair())}
    started = subprocess.run([*script, "start", str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
    pid_files = {name: tmp_path / "run" / f"{name}.pid" for name in ("munged", "slurmctld", "slurmd")}
    try:
        assert started.returncode == 0, started.stderr
        assert started.stdout == f"export SLURM_CONF={tmp_path / 'slurm.conf'}\n"
        pids = {name: int(path.read_text()) for name, path in pid_files.items()}
        again = subprocess.run([*script, "start", str(tmp_path)], env=env, capture_output=True, text=True, timeout=60)
        assert again.returncode == 0 and "already running" in again.stderr and again.stdout == started.stdout
        assert {name: int(path.read_text()) for name, path in pid_files.items()} == pids
        answer = subprocess.run(["sinfo", "-h", "-o", "%T"], env={**env, "SLURM_CONF": str(tmp_path / "slurm.conf")},
                                capture_output=True, text=True, timeout=30)
        assert answer.stdout.strip() == "idle", answer.stderr
    finally:
        stopped = subprocess.run([*script, "stop", str(tmp_path)], env=env, capture_output=True, text=True, timeout=120)
    assert stopped.returncode == 0, stopped.stderr
    assert not any(alive(pid) for pid in pids.values()) and not any(path.exists() for path in pid_files.values())
    if os.environ.get("SLURM_CONF"):  # the session's cluster, if any, was left alone
        assert subprocess.run(["sinfo", "-h"], capture_output=True, timeout=30).returncode == 0


def test_checkpoint_resubmits_the_job_resumed_after_its_training_processes_end(monkeypatch):
    """What submitit calls on the job's signal: training processes (non-daemonic children) get the
    signal passed on by the local executor and are waited for; DataLoader workers (daemonic) are not."""
    pytest.importorskip("submitit")
    context = multiprocessing.get_context("fork")
    loader_worker = context.Process(target=time.sleep, args=(60,), daemon=True)
    training = context.Process(target=time.sleep, args=(60,))
    loader_worker.start(), training.start()
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "local")
    try:
        started = time.monotonic()
        resubmitted = TrainingJob(("--config", "c.yaml"), "/somewhere").checkpoint()
        assert time.monotonic() - started < 10
        assert training.exitcode == -signal.SIGUSR2, "the signal was passed on and the process waited for"
        assert loader_worker.is_alive(), "a DataLoader worker is left to its process"
    finally:
        loader_worker.kill()
    assert resubmitted.function == TrainingJob(("--config", "c.yaml"), "/somewhere", requeued=True)
    assert (resubmitted.args, resubmitted.kwargs) == ((), {})


def test_a_submitit_local_job_into_a_folder_in_use_is_refused_before_it_is_submitted(tmp_path, capsys):
    # it said "submitted job N" and exited 0, while the job failed at once in its error log
    pytest.importorskip("submitit")
    from gwdet.engine.output_dir import OutputDirLock

    with OutputDirLock(str(tmp_path)):
        status = train_net(["--config", str(DEMO_CONFIG), "--launcher", "submitit-local", *TINY_OPTS,
                            "OUTPUT_DIR", str(tmp_path)])
    assert status == 2
    err = capsys.readouterr().err
    assert f"OUTPUT_DIR {str(tmp_path)!r} is in use by another run (pid {os.getpid()})" in err, err
    assert not (tmp_path / "submitit").exists()


def test_a_jobs_gwdet_refusal_is_one_line_as_here():
    # --wait printed submitit's "failed during processing with trace" and the whole traceback, exit 1
    from gwdet.cluster.executor import _gwdet_refusal

    trace = ("submitit.core.utils.FailedJobError: Job (task=0) failed during processing with trace:\n"
             "----------------------\nTraceback (most recent call last):\n  File \"x.py\", line 1, in f\n"
             "gwdet.errors.GwdetRuntimeError: OUTPUT_DIR 'r' is in use by another run (pid 7). Wait for it to finish.\n")
    assert _gwdet_refusal(trace) == "OUTPUT_DIR 'r' is in use by another run (pid 7). Wait for it to finish."
    assert _gwdet_refusal("Traceback ...\nRuntimeError: CUDA out of memory\n") is None


def test_a_run_leaves_the_calling_process_as_it_found_it(tmp_path, monkeypatch):
    # a second run() in one process appended its log to the first run's log.txt (its console lines twice), and
    # trained with the threads the first run's --threads left in OMP_NUM_THREADS
    import logging

    import torch
    from detectron2.utils.logger import setup_logger

    from gwdet.cluster.training import process_left_as_found
    from gwdet.engine.threads import configure_threads

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    threads, handlers = torch.get_num_threads(), list(logging.getLogger("gwdet").handlers)
    for run in ("first", "second"):
        with process_left_as_found():
            configure_threads(2, log=lambda line: None)
            setup_logger(str(tmp_path / run), name="gwdet")
            logging.getLogger("gwdet").info(f"the {run} run")
        assert (os.environ["OMP_NUM_THREADS"], os.environ.get("MKL_NUM_THREADS")) == ("1", None)
        assert torch.get_num_threads() == threads and logging.getLogger("gwdet").handlers == handlers
    assert "the second run" not in (tmp_path / "first" / "log.txt").read_text()
    assert "the second run" in (tmp_path / "second" / "log.txt").read_text()


def test_run_without_flags_in_a_jupyter_kernel_says_to_give_them_as_a_list(monkeypatch, capsys):
    # "ipykernel_launcher.py: error: unknown flag '-f'": the kernel's own command line, read as the tool's flags
    import pytest

    from gwdet.cluster.training import run

    monkeypatch.setattr(sys, "argv", ["/env/lib/ipykernel_launcher.py", "-f", "/run/kernel-1a2b.json"])
    with pytest.raises(SystemExit) as exited:
        run()
    assert exited.value.code == 2
    assert ("error: no flags given, and this process's command line is a Jupyter kernel's (/env/lib/"
            "ipykernel_launcher.py -f ...), not the tool's: give the tool's flags as a list, e.g. run(['--config-file'"
            in capsys.readouterr().err)
