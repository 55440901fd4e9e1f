"""The ``triton`` plan's kernels, run on CPU tensors by Triton's interpreter with the rounding of the
GPU's ``tf32x3`` products emulated: values against float64 PyTorch, and what a layer call
dispatches besides its kernels.

The interpreter must be switched on (``TRITON_INTERPRET=1``) before Triton is imported, so
everything runs once in a separate process (tests/triton_interpreter_worker.py); the tests here
check its report. That the kernels also compile for real GPUs: test_triton_compile.py.
"""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton", reason="the triton plan needs Triton (pip install triton)")

from conftest import REPO  # noqa: E402

KERNEL_TOLERANCE = 1e-5  # float32 kernels against float64, relative to the largest value
FLAT_BUDGET = 30  # PyTorch operations of one layer call (forward op or backward op) besides its kernels


@pytest.fixture(scope="module")
def report() -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    completed = subprocess.run([sys.executable, str(REPO / "tests" / "triton_interpreter_worker.py")],
                               cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout)


def test_the_kernels_ran_without_falling_back(report):
    assert report["fallbacks"] is None


def test_the_tf32x3_emulation_rounds_between_tf32_and_float32(report):
    # the interpreter's products are rounded as a GPU's tensor cores round "tf32x3": far better
    # than plain TF32 (10-bit mantissa), within a few float32 roundings
    check = report["tf32x3_check"]
    assert check["tf32x3"] < 4 * check["float32"] and check["tf32"] > 100 * check["tf32x3"], check


def test_kernels_match_float64_for_every_group_size(report):
    # g in {1, 4, 8, 16, 32, 64} (padded to tiles of 16, 32, 64), T in {1, 2, 5}, constant data
    # (the covariance is the ridge alone), the few-columns trace offset per matrix, 2 matrices;
    # the whole tile at once and, as on a GPU, in panels of 16 rows (g = 20 and 64)
    cases = report["kernels"]
    assert sorted({case["size"] for case in cases}) == [1, 4, 8, 16, 20, 32, 64]
    assert sorted(case["size"] for case in cases if case["panel"] == 16 and case["size"] > 16) == [20, 64]
    for case in cases:
        worst = max(case["whitening"], case["vjp_whitening"], case["vjp_grad"])
        assert worst <= KERNEL_TOLERANCE, case


def test_layers_under_the_triton_plan_are_as_accurate_as_the_cpu_plan_in_float32(report):
    # output, input gradient, weight and bias gradients against the cpu plan in float64; odd
    # sample counts, a constant sample, one channel per group, few columns, BW_ItN
    assert len(report["layers"]) == 9
    for case in report["layers"]:
        for error, cpu_error in zip(case["errors"], case["cpu_float32_errors"], strict=True):
            assert error <= max(2 * cpu_error, KERNEL_TOLERANCE), case


@pytest.mark.parametrize("layer", ["GW", "BW_ItN"])
def test_a_layer_call_dispatches_few_operations_besides_its_kernels_flat_in_the_samples(report, layer):
    calls = [entry for entry in report["launches"] if entry["layer"] == layer]
    for direction, kernel in (("forward", "itn_whitening_kernel"), ("backward", "itn_whitening_vjp_kernel")):
        fewer, more = (entry for entry in calls if entry["direction"] == direction)
        assert fewer["samples"] == 4 and more["samples"] == 8
        assert fewer["operations"] == more["operations"]
        assert fewer["pytorch_operations"] <= FLAT_BUDGET, fewer["operations"]
        assert fewer["triton_kernels"] == more["triton_kernels"] == {kernel: 1}
        assert fewer["host_syncs"] == more["host_syncs"] == 0
