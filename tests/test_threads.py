"""CPU thread settings of the entry points (gwdet.engine.threads): the choice, its precedence and the
sensing of competing processes."""
import subprocess
import sys
import time

import pytest

from gwdet.engine.threads import WAIT_POLICY_VARIABLE, ThreadChoice, busy_cpus, choose_threads


def choose(requested=None, processes=1, environ=None, cpus=4, busy=0) -> ThreadChoice:
    return choose_threads(requested, processes, environ or {}, cpus=lambda: cpus, busy=lambda: busy)


@pytest.mark.parametrize(
    "cpus, busy, processes, expected",
    [(4, 0, 1, 4), (4, 1, 1, 3), (2, 1, 1, 1), (2, 5, 1, 1), (8, 2, 2, 3), (2, 0, 4, 1)],
)
def test_free_cpus_are_shared_among_processes(cpus, busy, processes, expected):
    choice = choose(processes=processes, cpus=cpus, busy=busy)
    assert choice.threads == expected
    assert f"{cpus} usable CPUs, {busy} busy" in choice.reason


def test_a_competing_process_is_seen_as_a_busy_cpu():
    competitor = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        assert busy_cpus() >= 1
    finally:
        competitor.kill()
        competitor.wait()


def test_request_beats_environment_beats_load():
    assert choose(requested=3, environ={"OMP_NUM_THREADS": "2"}, busy=3).threads == 3
    from_env = choose(environ={"OMP_NUM_THREADS": "2"}, cpus=8)
    assert from_env.threads == 2 and "OMP_NUM_THREADS" in from_env.reason


@pytest.mark.parametrize("value", ["0", "two", "-1", "1.5"])
def test_bad_environment_value_is_named(value):
    with pytest.raises(ValueError, match="OMP_NUM_THREADS"):
        choose(environ={"OMP_NUM_THREADS": value})


def test_bad_request_and_process_count_are_refused():
    with pytest.raises(ValueError, match="--threads"):
        choose(requested=0)
    with pytest.raises(ValueError, match="processes"):
        choose(processes=0)


def test_description_names_the_count_its_reason_and_the_wait_policy():
    choice = ThreadChoice(2, "test reason")
    assert choice.describe({WAIT_POLICY_VARIABLE: "PASSIVE"}).startswith("CPU threads: 2 per process (test reason)")
    assert f"{WAIT_POLICY_VARIABLE} PASSIVE" in choice.describe({WAIT_POLICY_VARIABLE: "PASSIVE"})
    assert "unset" in choice.describe({})
