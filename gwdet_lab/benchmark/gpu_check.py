"""``make gpu-check`` (tools/gpu_check.py): what to run first on a CUDA GPU, in at most about 5 minutes.

1. ``tests/test_cuda.py`` (the layers and a GW detector on CUDA against float64 on the CPU,
   autocast, every plan, CUDA graphs), its summary line recorded;
2. every execution plan of GW (ItN, g = 64, T = 5) against GroupNorm and the 3x3 convolution at
   the benchmark's shapes (:data:`~gwdet_lab.benchmark.cases.LAYER_SHAPES` and the box head with
   2048 proposals), forward + backward, timed with CUDA events (median of :data:`REPEATS` after
   :data:`WARMUP`), beside the cost model's prediction (:mod:`~gwdet_lab.benchmark.gpu_cost`) for
   the modelled GPU of the same kind, with the operations counted on this GPU;
3. one training step of the demo GW Faster R-CNN (:data:`DEMO_CONFIG`), without and with mixed
   precision (float16 autocast);
4. the device, the PyTorch build and its architectures, Triton's version, and the resources of
   every Triton kernel compiled here (registers and spills as the driver loaded them, shared
   memory, stack from the cubin);

then the results go into a dated section of docs/benchmarks.md (``gpu-check <date> <GPU>``,
replaced when run again on the same day and GPU). Past :data:`BUDGET_SECONDS` the remaining
measurements are skipped and the section says which. Without CUDA nothing is measured or
written: the check says so and exits with status 2.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from gwdet_lab.benchmark.cases import CONV, GN, LAYER_SHAPES, format_shape, input_view
from gwdet_lab.benchmark.model_level import REPO
from gwdet_lab.benchmark.report import section_file_problem, write_section

Shape = Tuple[int, ...]
REPO_TEST = "tests/test_cuda.py"
DEMO_CONFIG = "configs/Demo/scratch_faster_rcnn_gw_shapes.yaml"
SHAPES: List[Shape] = [shape for _, shape in LAYER_SHAPES] + [(2048, 256, 7, 7)]
CASES = (CONV, GN, "GW cpu", "GW accelerator", "GW triton")
WARMUP = 2
REPEATS = 5
TEST_TIMEOUT_SECONDS = 150
BUDGET_SECONDS = 280
STEP_IMAGE_SIZE = 128
NO_CUDA = ("gpu-check needs a CUDA GPU and torch.cuda.is_available() is False here: nothing was measured and "
           "{out} is unchanged. Run it where `python -c \"import torch; print(torch.cuda.is_available())\"` "
           "prints True.")


def no_cuda_message(out: str) -> Optional[str]:
    """:data:`NO_CUDA` (for the file ``out`` the section would go into) when PyTorch sees no CUDA GPU,
    else None."""
    return None if torch.cuda.is_available() else NO_CUDA.format(out=out)


def event_times(fn: Callable[[], None], warmup: int = WARMUP, repeats: int = REPEATS) -> List[float]:
    """Milliseconds of each of ``repeats`` calls of ``fn`` between two CUDA events, after
    ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return times


def model_gpu_name(device_name: str) -> Optional[str]:
    """The cost model's GPU (``"H100"``, ``"V100"``) for a device of that kind, else None."""
    for model, kinds in (("H100", ("H100", "H200", "GH200")), ("V100", ("V100",))):
        if any(kind in device_name for kind in kinds):
            return model
    return None


def run_cuda_tests(timeout: float) -> str:
    """``tests/test_cuda.py``'s summary line (or why there is none)."""
    try:
        completed = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", REPO_TEST],
                                   cwd=REPO, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"stopped after {timeout:.0f} s"
    lines = [line for line in completed.stdout.splitlines() if line.strip()]
    return f"exit status {completed.returncode}: {lines[-1] if lines else completed.stderr[-300:]}"


def time_layers(device: torch.device, deadline: float) -> Dict[Tuple[Shape, str], float]:
    """Median ms of one forward + backward of each case at each shape, until ``deadline``."""
    from gwdet_lab.benchmark.measure import training_call
    from gwdet_lab.benchmark.op_level import forced_plan, op_cases

    cases = {name: (factory, plan) for name, factory, plan in op_cases() if name in CASES}
    times: Dict[Tuple[Shape, str], float] = {}
    for shape in SHAPES:
        for name in CASES:
            if time.monotonic() > deadline:
                return times
            factory, plan = cases[name]
            with forced_plan(plan):
                torch.manual_seed(0)
                view = input_view(name, shape)
                module = factory(shape[1], len(shape)).to(device).train()
                x = torch.randn(view, device=device, requires_grad=True)
                times[(shape, name)] = statistics.median(event_times(training_call(module, x, torch.randn_like(x))))
    return times


def predicted_layers(device: torch.device, gpu_name: Optional[str],
                     measured: Dict[Tuple[Shape, str], float]) -> Dict[Tuple[Shape, str], float]:
    """The cost model's ms for the measured cases, with the operations counted on ``device``."""
    if gpu_name is None:
        return {}
    from gwdet_lab.benchmark.gpu_cost import GPUS, layer_seconds
    from gwdet_lab.benchmark.op_level import count_case, op_cases

    gpu = next(gpu for gpu in GPUS if gpu.name == gpu_name)
    cases = {case[0]: case for case in op_cases()}
    return {(shape, name): 1e3 * layer_seconds(gpu, name, shape, count_case(cases[name], shape, device))
            for shape, name in measured}


def time_training_steps(device: torch.device) -> Dict[str, float]:
    """Median ms of a training step (forward, backward, optimizer) of the demo GW Faster R-CNN on 2
    synthetic images, in float32 and under float16 autocast."""
    from detectron2.utils.events import EventStorage

    from gwdet_lab.benchmark.model_level import build_detector, synthetic_batch

    model, optimizer = build_detector(DEMO_CONFIG, device, [])
    model.train()
    batch = synthetic_batch(STEP_IMAGE_SIZE)
    results = {}
    for label, amp in (("float32", False), ("float16 autocast", True)):
        def step(amp: bool = amp) -> None:
            torch.manual_seed(0)
            with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
                loss = sum(model(batch).values())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

        with EventStorage(0):
            results[label] = statistics.median(event_times(step, warmup=1, repeats=3))
    return results


def triton_kernels_loaded() -> List[Dict[str, object]]:
    """Each Triton kernel of the ``triton`` plan compiled in this process: name, warps, registers
    and spills as the driver loaded it, shared memory, and the cubin's stack per thread."""
    from gwdet.layers.plans import triton_kernels
    from gwdet_lab.benchmark.kernel_resources import resource_usage

    rows: List[Dict[str, object]] = []
    for name, kernel in triton_kernels.KERNELS.items():
        for cache in kernel.device_caches.values():
            for compiled in cache[0].values():
                compiled._init_handles()
                rows.append({"kernel": name, "warps": compiled.metadata.num_warps, "registers": compiled.n_regs,
                             "spills": compiled.n_spills, "shared": compiled.metadata.shared,
                             "stack": resource_usage(compiled.asm["cubin"])["STACK"]})
    return rows


def environment(device: torch.device) -> List[str]:
    """Markdown list items: the GPU, the PyTorch build and its architectures, Triton, Python."""
    from gwdet.layers.plans import describe_plans, triton_version

    capability = torch.cuda.get_device_capability(device)
    properties = torch.cuda.get_device_properties(device)
    return [
        f"- device: {torch.cuda.get_device_name(device)}, compute capability {capability[0]}.{capability[1]}, "
        f"{properties.multi_processor_count} multiprocessors, {properties.total_memory / 2**30:.0f} GiB",
        f"- torch {torch.__version__} (CUDA {torch.version.cuda}, architectures {', '.join(torch.cuda.get_arch_list())}), "
        f"Triton {triton_version() or 'not importable'}, Python {platform.python_version()}",
        f"- {describe_plans()}",
    ]


def render(date: str, environment_lines: Sequence[str], tests: str, layers: Dict[Tuple[Shape, str], float],
           predicted: Dict[Tuple[Shape, str], float], model: Optional[str], steps: Dict[str, float],
           kernels: Sequence[Dict[str, object]], skipped: Sequence[str]) -> str:
    """The section's markdown (pure: every value is passed in)."""
    from gwdet_lab.tables import Column, Table

    lines = [f"### GPU check ({date})", "", "Command: `make gpu-check` (tools/gpu_check.py)", "",
             *environment_lines, f"- tests/test_cuda.py: {tests}", ""]
    shapes = [shape for shape in SHAPES if any((shape, name) in layers for name in CASES)]
    table = Table([Column("shape"), *(Column(name, align_right=True) for name in CASES)])
    for shape in shapes:
        row = {"shape": format_shape(shape)}
        for name in CASES:
            if (shape, name) in layers:
                cell = f"{layers[(shape, name)]:.3f}"
                if (shape, name) in predicted:
                    cell += f" ({predicted[(shape, name)]:.3f})"
                row[name] = cell
            else:
                row[name] = "-"
        table.add(row)
    lines += ["#### Forward + backward per layer (ms, CUDA events, median of "
              f"{REPEATS} after {WARMUP} warm-up)", "",
              f"In parentheses the cost model's prediction for a{'n' if model == 'H100' else ''} {model} "
              "(gwdet_lab/benchmark/gpu_cost.py, operations counted on this GPU)." if model else
              "The cost model has no GPU of this kind (it models a V100 and an H100).", "",
              table.markdown(), ""]
    if steps:
        lines += [f"#### Training step of the demo GW Faster R-CNN (ms, 2 images of {STEP_IMAGE_SIZE} x "
                  f"{STEP_IMAGE_SIZE}, median of 3 after 1 warm-up)", "",
                  *(f"- {label}: {value:.1f}" for label, value in steps.items()), ""]
    if kernels:
        kernel_table = Table([Column("kernel"), *(Column(key, align_right=True)
                                                  for key in ("warps", "registers", "spills", "shared", "stack"))])
        for row in kernels:
            kernel_table.add({key: str(value) for key, value in row.items()})
        lines += ["#### Triton kernels loaded on this GPU", "", kernel_table.markdown(), ""]
    if skipped:
        lines += [f"Not measured (past the {BUDGET_SECONDS} s budget): {', '.join(skipped)}.", ""]
    return "\n".join(lines).rstrip("\n")


def section_name(date: str, device_name: str) -> str:
    """The markers' name of the section: ``gpu-check <date> <GPU>``."""
    return f"gpu-check {date} {device_name}"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="docs/benchmarks.md", type=os.path.expanduser,
                        help="the markdown file the section goes into")
    parser.add_argument("--skip-tests", action="store_true", help="do not run tests/test_cuda.py first")
    args = parser.parse_args(argv)
    problem = section_file_problem(args.out)  # before minutes of measuring, not after
    if problem:
        parser.error(problem)
    refusal = no_cuda_message(args.out)
    if refusal is not None:
        print(refusal, file=sys.stderr)
        return 2
    started = time.monotonic()
    deadline = started + BUDGET_SECONDS
    device = torch.device("cuda", torch.cuda.current_device())
    tests = "not run (--skip-tests)" if args.skip_tests else run_cuda_tests(TEST_TIMEOUT_SECONDS)
    layers = time_layers(device, deadline)
    skipped = [f"{format_shape(shape)} {name}" for shape in SHAPES for name in CASES if (shape, name) not in layers]
    model = model_gpu_name(torch.cuda.get_device_name(device))
    predicted = predicted_layers(device, model, layers) if time.monotonic() < deadline else {}
    steps = time_training_steps(device) if time.monotonic() < deadline else {}
    if not steps:
        skipped.append("the training steps")
    date = datetime.date.today().isoformat()
    body = render(date, environment(device), tests, layers, predicted, model, steps, triton_kernels_loaded(), skipped)
    print(body)  # first: a section that cannot be written into --out (a full disk) is not lost
    write_section(args.out, body, section_name(date, torch.cuda.get_device_name(device)))
    print(f"gpu-check: {time.monotonic() - started:.0f} s; section written to {args.out}", file=sys.stderr)
    return 0
