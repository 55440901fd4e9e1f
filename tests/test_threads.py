"""CPU thread settings of the entry points (gwdet.threads): the choice and its precedence, and the
OpenMP wait policy set before torch is imported."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gwdet.threads import DEFAULT_WAIT_POLICY, WAIT_POLICY_VARIABLE, ThreadChoice, choose_threads

REPO = Path(__file__).resolve().parents[1]
ENTRY_POINTS = ("tools/train_net.py", "tools/compare_norms.py", "tools/benchmark.py")


def choose(requested=None, processes=1, environ=None, cpus=4, busy=0) -> ThreadChoice:
    return choose_threads(requested, processes, environ or {}, cpus=lambda: cpus, busy=lambda: busy)


@pytest.mark.parametrize(
    "cpus, busy, processes, expected",
    [(4, 0, 1, 4), (4, 1, 1, 3), (2, 1, 1, 1), (2, 5, 1, 1), (8, 2, 2, 3), (2, 0, 4, 1)],
)
def test_free_cpus_are_shared_among_processes(cpus, busy, processes, expected):
    choice = choose(processes=processes, cpus=cpus, busy=busy)
    assert choice.threads == expected
    assert f"{cpus} usable CPUs" in choice.reason and f"about {busy} busy" in choice.reason


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


def test_description_names_the_wait_policy_or_the_missing_setting():
    choice = ThreadChoice(2, "test")
    assert f"{WAIT_POLICY_VARIABLE}=PASSIVE" in choice.describe({WAIT_POLICY_VARIABLE: "PASSIVE"})
    unset = choice.describe({})
    assert "unset" in unset and DEFAULT_WAIT_POLICY in unset


# Runs an entry point's module-level code (not its main) and records the wait policy in the
# environment at the moment torch is first imported.
PROBE = """
import importlib.abc, json, os, runpy, sys
seen = {}
class Probe(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and "at_torch_import" not in seen:
            seen["at_torch_import"] = os.environ.get("OMP_WAIT_POLICY")
        return None
sys.meta_path.insert(0, Probe())
runpy.run_path(sys.argv[1], run_name="entry_point_under_test")
print(json.dumps(seen))
"""


def probe(script: str, environ: dict) -> dict:
    result = subprocess.run([sys.executable, "-c", PROBE, str(REPO / script)], cwd=REPO, env=environ,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("script", ENTRY_POINTS)
def test_entry_points_set_a_passive_wait_policy_before_torch_loads(script):
    environ = {k: v for k, v in os.environ.items() if k != WAIT_POLICY_VARIABLE}
    assert probe(script, environ) == {"at_torch_import": DEFAULT_WAIT_POLICY}


def test_an_exported_wait_policy_is_kept():
    environ = dict(os.environ, **{WAIT_POLICY_VARIABLE: "ACTIVE"})
    assert probe("tools/train_net.py", environ) == {"at_torch_import": "ACTIVE"}
