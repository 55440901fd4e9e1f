"""CPU thread settings of the entry points (gwdet.engine.threads): the CPUs a process may use
(affinity mask, cgroup CPU quota from real cgroup files, SLURM_CPUS_PER_TASK), the choice and its
precedence, and the load-based choice of --threads auto-load."""
import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gwdet.engine.threads import (
    AUTO_LOAD,
    WAIT_POLICY_VARIABLE,
    CpuLimits,
    ThreadChoice,
    busy_cpus,
    cgroup_cpu_quota,
    choose_threads,
    cpu_limits,
    read_cfs_quota,
    read_cpu_max,
    thread_request,
)


def limits(affinity=None, quota=None, slurm=None):
    return lambda: CpuLimits(affinity, quota, slurm)


def no_load_reading():
    raise AssertionError("the default choice read the machine's load")


def choose(requested=None, processes=1, environ=None, cpus=4, busy=0) -> ThreadChoice:
    return choose_threads(requested, processes, environ or {}, limits=limits(affinity=cpus), busy=lambda: busy)


# ---- the CPUs this process may use ---------------------------------------------------------------


@pytest.mark.parametrize("content, expected", [("max 100000\n", None), ("200000 100000\n", 2.0),
                                               ("150000 100000", 1.5), ("50000 100000", 0.5)])
def test_cpu_max_gives_the_quota_in_cpus(tmp_path, content, expected):
    (tmp_path / "cpu.max").write_text(content)
    assert read_cpu_max(tmp_path / "cpu.max") == expected


def test_a_missing_cpu_max_is_no_limit_and_a_malformed_one_is_named(tmp_path):
    assert read_cpu_max(tmp_path / "cpu.max") is None
    (tmp_path / "cpu.max").write_text("lots\n")
    with pytest.raises(ValueError, match=r"cpu.max holds 'lots', not a cgroup v2 CPU limit.*--threads N"):
        read_cpu_max(tmp_path / "cpu.max")


def test_cfs_quota_gives_the_quota_in_cpus(tmp_path):
    (tmp_path / "cpu.cfs_period_us").write_text("100000\n")
    (tmp_path / "cpu.cfs_quota_us").write_text("-1\n")
    assert read_cfs_quota(tmp_path) is None
    (tmp_path / "cpu.cfs_quota_us").write_text("300000\n")
    assert read_cfs_quota(tmp_path) == 3.0
    assert read_cfs_quota(tmp_path / "elsewhere") is None


def cgroup_tree(tmp_path: Path, proc_lines: list[str], mount_lines: list[str]) -> tuple[Path, Path]:
    (tmp_path / "cgroup").write_text("\n".join(proc_lines) + "\n")
    (tmp_path / "mountinfo").write_text("\n".join(mount_lines) + "\n")
    return tmp_path / "cgroup", tmp_path / "mountinfo"


def test_the_smallest_quota_of_the_process_cgroup_and_those_above_it_counts_v2(tmp_path):
    mount = tmp_path / "fs cgroup"  # a space in the mount point: \040 in mountinfo
    (mount / "job" / "step").mkdir(parents=True)
    (mount / "job" / "cpu.max").write_text("300000 100000\n")
    (mount / "job" / "step" / "cpu.max").write_text("max 100000\n")
    point = str(mount).replace(" ", "\\040")
    proc, mountinfo = cgroup_tree(tmp_path, ["0::/job/step"], [
        f"31 23 0:28 / {tmp_path} rw,relatime - tmpfs tmpfs rw",
        f"41 31 0:38 / {point} rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate"])
    assert cgroup_cpu_quota(proc, mountinfo) == 3.0
    (mount / "job" / "step" / "cpu.max").write_text("150000 100000\n")
    assert cgroup_cpu_quota(proc, mountinfo) == 1.5
    (mount / "job" / "cpu.max").write_text("max 100000\n")
    (mount / "job" / "step" / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_quota(proc, mountinfo) is None


def test_a_v1_cpu_hierarchy_mounted_at_the_process_cgroup_counts(tmp_path):
    """A container's view of cgroup v1: /proc/self/cgroup names /docker/<id>, which is the root of
    the cpu hierarchy's mount; the v2 mount of a hybrid set-up holds no cpu controller."""
    cpu, unified = tmp_path / "cpu,cpuacct", tmp_path / "unified"
    cpu.mkdir(), unified.mkdir()
    (cpu / "cpu.cfs_quota_us").write_text("200000\n")
    (cpu / "cpu.cfs_period_us").write_text("100000\n")
    proc, mountinfo = cgroup_tree(tmp_path, ["4:memory:/docker/abc", "2:cpu,cpuacct:/docker/abc", "0::/docker/abc"], [
        f"32 31 0:29 /docker/abc {cpu} rw,relatime - cgroup cgroup rw,cpu,cpuacct",
        f"35 31 0:32 /docker/abc {tmp_path / 'memory'} rw,relatime - cgroup cgroup rw,memory",
        f"41 31 0:38 /docker/abc {unified} rw,relatime - cgroup2 cgroup2 rw"])
    assert cgroup_cpu_quota(proc, mountinfo) == 2.0


def test_without_cgroup_files_there_is_no_quota(tmp_path):
    assert cgroup_cpu_quota(tmp_path / "no cgroup", tmp_path / "no mountinfo") is None


def test_this_machines_cgroup_files_are_read():
    quota = cgroup_cpu_quota()  # /proc/self/cgroup and /proc/self/mountinfo of the machine running the tests
    assert quota is None or quota > 0


@pytest.mark.parametrize("affinity, quota, slurm, usable", [
    (8, None, None, 8), (8, 2.5, None, 2), (8, 0.5, None, 1), (8, 6.0, 3, 3), (2, 6.0, 4, 2), (None, None, 5, 5)])
def test_the_usable_cpus_are_the_smallest_limit(affinity, quota, slurm, usable):
    assert CpuLimits(affinity, quota, slurm).usable() == usable


def test_slurm_cpus_per_task_limits_the_default(tmp_path):
    found = cpu_limits({"SLURM_CPUS_PER_TASK": "1"}, tmp_path / "none", tmp_path / "none")
    assert found.slurm_cpus_per_task == 1 and found.usable() == 1
    assert "SLURM_CPUS_PER_TASK 1" in found.describe()
    assert cpu_limits({}, tmp_path / "none", tmp_path / "none").slurm_cpus_per_task is None
    with pytest.raises(ValueError, match="SLURM_CPUS_PER_TASK='two' is not a positive integer"):
        cpu_limits({"SLURM_CPUS_PER_TASK": "two"})
    choice = choose_threads(environ={"SLURM_CPUS_PER_TASK": "1"})
    assert choice.threads == 1 and "SLURM_CPUS_PER_TASK 1" in choice.reason


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no affinity masks on this OS")
def test_the_affinity_mask_limits_the_default():
    """On Linux an affinity mask belongs to a thread (pid 0: the calling one), so a thread of its own
    narrows its mask to one CPU without touching the test process's other threads."""
    seen, mask = {}, os.sched_getaffinity(0)

    def on_one_cpu():
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        seen["choice"] = choose_threads(environ={})

    worker = threading.Thread(target=on_one_cpu)
    worker.start()
    worker.join()
    choice = seen["choice"]
    assert choice.threads == 1 and choice.reason.startswith("1 CPU this process may use (affinity mask 1"), choice
    assert os.sched_getaffinity(0) == mask, "the test process's own mask is as it was"


# ---- the choice --------------------------------------------------------------------------------


@pytest.mark.parametrize("cpus, processes, expected", [(4, 1, 4), (8, 2, 4), (3, 2, 1), (2, 4, 1)])
def test_the_default_is_the_usable_cpus_shared_among_processes_without_reading_the_load(cpus, processes, expected):
    choice = choose_threads(None, processes, {}, limits=limits(affinity=cpus), busy=no_load_reading)
    assert choice.threads == expected
    assert choice.reason.startswith(f"{cpus} CPUs this process may use (affinity mask {cpus})")
    assert ("shared by" in choice.reason) == (processes > 1)


def test_the_default_is_the_same_with_a_competing_process():
    quiet = choose_threads(environ={})
    competitor = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        assert choose_threads(environ={}) == quiet
    finally:
        competitor.kill()
        competitor.wait()


@pytest.mark.parametrize(
    "cpus, busy, processes, expected",
    [(4, 0, 1, 4), (4, 1, 1, 3), (2, 1, 1, 1), (2, 5, 1, 1), (8, 2, 2, 3), (2, 0, 4, 1)],
)
def test_auto_load_shares_the_free_cpus_among_processes(cpus, busy, processes, expected):
    choice = choose(AUTO_LOAD, processes=processes, cpus=cpus, busy=busy)
    assert choice.threads == expected
    assert f"--threads auto-load: {cpus} usable CPUs, {busy} busy" in choice.reason


def test_a_competing_process_is_seen_as_a_busy_cpu():
    competitor = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        assert busy_cpus() >= 1
    finally:
        competitor.kill()
        competitor.wait()


def test_request_beats_environment_beats_default():
    assert choose(requested=3, environ={"OMP_NUM_THREADS": "2"}, busy=3).threads == 3
    assert choose(requested=AUTO_LOAD, environ={"OMP_NUM_THREADS": "2"}, cpus=8).threads == 8
    from_env = choose(environ={"OMP_NUM_THREADS": "2"}, cpus=8)
    assert from_env.threads == 2 and "OMP_NUM_THREADS" in from_env.reason


@pytest.mark.parametrize("value", ["0", "two", "-1", "1.5"])
def test_bad_environment_value_is_named(value):
    with pytest.raises(ValueError, match="OMP_NUM_THREADS"):
        choose(environ={"OMP_NUM_THREADS": value})


def test_bad_request_and_process_count_are_refused():
    with pytest.raises(ValueError, match="--threads"):
        choose(requested=0)
    with pytest.raises(ValueError, match="--threads 'auto': give a number of threads"):
        choose(requested="auto")
    with pytest.raises(ValueError, match="processes"):
        choose(processes=0)


def test_the_flag_takes_a_number_or_auto_load():
    assert thread_request("3") == 3 and thread_request("0") == 0 and thread_request(AUTO_LOAD) == AUTO_LOAD
    with pytest.raises(argparse.ArgumentTypeError, match="'auto' is neither a number of threads nor auto-load"):
        thread_request("auto")


def test_description_names_the_count_its_reason_and_the_wait_policy():
    choice = ThreadChoice(2, "test reason")
    assert choice.describe({WAIT_POLICY_VARIABLE: "PASSIVE"}).startswith("CPU threads: 2 per process (test reason)")
    assert f"{WAIT_POLICY_VARIABLE} PASSIVE" in choice.describe({WAIT_POLICY_VARIABLE: "PASSIVE"})
    assert "unset" in choice.describe({})
    assert "--threads auto-load" in choice.describe({})


def test_the_tools_take_auto_load_and_refuse_other_words(capsys):
    from gwdet.engine.arguments import parse_args
    from gwdet_lab.study import cli as study

    from conftest import DEMO_CONFIG

    assert parse_args(["--config", str(DEMO_CONFIG), "--threads", AUTO_LOAD]).threads == AUTO_LOAD
    assert parse_args(["--config", str(DEMO_CONFIG), "SEED", "1", "--threads", "2"]).threads == 2
    with pytest.raises(SystemExit) as stop:
        parse_args(["--config", str(DEMO_CONFIG), "--threads", "many"])
    assert stop.value.code == 2
    assert "argument --threads: 'many' is neither a number of threads nor auto-load" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        study.main(["--study", "paper", "--threads", AUTO_LOAD, "--launcher", "slurm"])
    assert stop.value.code == 2
    assert "--threads auto-load reads this machine's load" in capsys.readouterr().err


def test_several_processes_binding_their_threads_to_the_same_cpus_are_named():
    # OMP_PROC_BIND=true (as HPC module set-ups export it) put both processes of --num-gpus 2 on CPU 0,
    # at half speed, while the CPU threads line said nothing
    from gwdet.engine.threads import binding_note

    note = binding_note(2, {"OMP_PROC_BIND": "true", "OMP_PLACES": "cores"})
    assert note == (
        "OMP_PROC_BIND=true, OMP_PLACES=cores: OpenMP binds the threads of each of the 2 processes of this machine to "
        "the same CPUs, counted from the first in every process, so they share those CPUs and the others idle (the "
        "training runs at a fraction of its speed; its results are the same). Unset OMP_PROC_BIND and OMP_PLACES "
        "before starting several CPU processes.")
    assert binding_note(1, {"OMP_PROC_BIND": "true"}) is None  # one process binds alone
    assert binding_note(2, {"OMP_PROC_BIND": "false"}) is None and binding_note(2, {}) is None
