"""gwdet_lab.benchmark (tools/benchmark.py) on tiny shapes: what the tables say is what was measured,
the section writer keeps the rest of the file, the competing load never outlives the run.
No test asserts a time."""
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from gwdet.layers.cost import conv3x3_macs, group_whitening_macs, group_whitening_relative_cost
from gwdet_lab.benchmark.busy import competing_load
from gwdet_lab.benchmark.cases import CONV, GW_ITN, LAYER_SHAPES, analytic_ratio, time_target
from gwdet_lab.benchmark.cli import main, parse_args
from gwdet_lab.benchmark.layer_level import layer_tables, run_layers
from gwdet_lab.benchmark.model_level import model_tables
from gwdet_lab.benchmark.report import markers, report_header, write_section

from conftest import REPO

CPU = torch.device("cpu")


def table_rows(text: str, heading: str) -> list:
    """The body rows (as lists of cells) of the first markdown table from the line holding ``heading`` on."""
    lines = text.splitlines()
    found = next(i for i, line in enumerate(lines) if heading in line)
    start = next(i for i in range(found, len(lines)) if lines[i].startswith("|"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_a_section_replaces_only_its_own_markers(tmp_path):
    path = tmp_path / "benchmarks.md"
    a_begin, a_end = markers("a")
    b_begin, b_end = markers("b")
    before = "# title\n\nintro\n\n"
    between = "\n\n### next\n\ntext\n\n"
    after = "\n\nclosing words\n"
    path.write_text(f"{before}{a_begin}\nold a\n{a_end}{between}{b_begin}\nold b\n{b_end}{after}")
    write_section(path, "new a\nsecond line", "a")
    assert path.read_text() == f"{before}{a_begin}\nnew a\nsecond line\n{a_end}{between}{b_begin}\nold b\n{b_end}{after}"
    kept = path.read_text()
    write_section(path, "c", "c")
    assert path.read_text() == kept.rstrip("\n") + f"\n\n{markers('c')[0]}\nc\n{markers('c')[1]}\n"
    fresh = tmp_path / "sub" / "new.md"
    write_section(fresh, "body", "main")
    assert fresh.read_text().startswith("# gwdet benchmarks\n\n" + markers("main")[0])


def test_a_file_with_windows_line_endings_keeps_them(tmp_path):
    # Path.read_text turned every CRLF of the user's text into LF ("byte for byte" outside the section)
    path = tmp_path / "notes.md"
    path.write_bytes(b"# My notes\r\n\r\nSome text\r\n")
    write_section(path, "table\nrow", "mine")
    begin, end = markers("mine")
    assert path.read_bytes() == f"# My notes\r\n\r\nSome text\r\n\r\n{begin}\r\ntable\r\nrow\r\n{end}\r\n".encode()
    write_section(path, "new", "mine")
    assert path.read_bytes() == f"# My notes\r\n\r\nSome text\r\n\r\n{begin}\r\nnew\r\n{end}\r\n".encode()


@pytest.mark.parametrize("layout", ["begin only", "begin twice", "end before begin"])
def test_markers_that_do_not_delimit_one_section_are_refused_before_measuring(tmp_path, capsys, layout):
    """A begin line without its end: the second run replaced everything from it to its own new end
    line, the user's text after it included."""
    begin, end = markers("mine")
    lines = {"begin only": [begin, "old table"], "begin twice": [begin, "old", end, begin, "old"],
             "end before begin": [end, "old", begin]}[layout]
    path = tmp_path / "notes.md"
    text = "# Notes\n\n" + "\n".join(lines) + "\n\n## My own section\nimportant text\n"
    path.write_text(text)
    with pytest.raises(SystemExit) as refused:
        main(["--layers", "--quick", "--norms", "BN", "--out", str(path), "--section", "mine"])
    assert refused.value.code == 2 and "of its markers, so the text between them is not one section" in \
        capsys.readouterr().err
    assert path.read_text() == text
    with pytest.raises(ValueError) as refused:  # markers pasted while the benchmark measured: said so
        write_section(path, "new", "mine")
    assert str(refused.value).endswith(f"{path} was left as it is (it changed while the benchmark measured; the "
                                       "tables are printed above)")
    assert path.read_text() == text


def test_layer_ratios_are_per_round_ratios_to_the_conv_of_the_same_results():
    args = parse_args(["--layers", "--quick", "--repeats", "3", "--no-autograd-gw", "--norms", GW_ITN, "GN(32)"])
    results = run_layers(args, CPU)
    assert results["names"] == [CONV, "GN(32)", GW_ITN]
    text = layer_tables(results)
    rows = table_rows(text, "#### Layer level: forward + backward time")
    for (_where, shape), row in zip(results["shapes"], rows, strict=True):
        conv_rounds = results["rounds"][(shape, CONV)]
        assert len(conv_rounds) == 3
        for name, cell in zip(results["names"], row[2:], strict=True):
            rounds = results["rounds"][(shape, name)]
            ratio = statistics.median(t / c for t, c in zip(rounds, conv_rounds, strict=True))
            assert results["time"][(shape, name)] == statistics.median(rounds)
            assert results["ratio"][(shape, name)] == pytest.approx(ratio, rel=1e-12)
            expected = f"{results['time'][(shape, name)] * 1e3:.1f}"
            assert cell == (expected if name == CONV else f"{expected} ({ratio:.3f})")
    targets = table_rows(text, "#### Layer-level targets")
    assert [row[1] for row in targets] == [f"{analytic_ratio(shape):.3f}" for _, shape in results["shapes"]]
    assert [row[3] for row in targets] == [f"{results['ratio'][(shape, GW_ITN)]:.3f}" for _, shape in results["shapes"]]


@pytest.mark.parametrize("_, shape", LAYER_SHAPES)
def test_the_analytic_ratio_is_gwdet_layers_cost_and_the_papers_formula(_, shape):
    g, T = 64, 5
    assert analytic_ratio(shape) == group_whitening_relative_cost(shape, g, T)
    assert analytic_ratio(shape) == group_whitening_macs(shape, g, T) / conv3x3_macs(shape)
    d, positions = shape[1], (shape[2] * shape[3] if len(shape) == 4 else 1)
    assert analytic_ratio(shape) == pytest.approx(2 * g / (9 * d) + T * g**3 / (9 * positions * d**2), rel=1e-12)
    assert time_target(shape) == max(0.20, 1.5 * analytic_ratio(shape))


@pytest.mark.parametrize("argv, message", [
    (["--norms", "GW (itn)", "FOO"], "--norms: unknown 'FOO'; choose from 'conv 3x3', 'BN', 'GN(32)'"),
    (["--model-names", "FOO"], "--model-names: unknown 'FOO'; choose from 'FrozenBN', 'FrozenBN + GW at S1-B2'"),
    (["--busy", "-1"], "--busy: -1 is negative"),
    # 1000 competing processes were started on a 2-CPU machine, which then measured nothing for minutes
    (["--busy", str(8 * (os.cpu_count() or 1) + 1)], f"is more than 8 competing processes per CPU ({os.cpu_count() or 1} "
                                                     "CPUs here)"),
    (["--model-repeats", "0"], "--model-repeats: 0 is less than 1"),
    # the second replaced the first, while the report's Command: line showed both
    (["--norms", "BN", "--norms", "GN(32)"], "--norms is given more than once; a second one would replace the first."),
])
def test_bad_names_and_counts_stop_with_the_choices(argv, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        parse_args(argv)
    assert stopped.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("opts, message", [
    (["MODEL.GW.NUM_GROUPS", "0"], "error: config: MODEL.GW.NUM_GROUPS must be an integer >= 1, got 0"),
    (["MODEL.RESNETS.DEPTH", "18"], "error: detectron2 could not build the model with this config: AssertionError: "
                                    "Must set MODEL.RESNETS.RES2_OUT_CHANNELS = 64 for R18/R34"),
    (["MODEL.DEVICE", "cpu"], "error: --model-opts sets MODEL.DEVICE, which the benchmark sets to --device (cpu)"),
])
def test_model_overrides_that_build_no_model_are_refused_before_any_level(opts, message, capsys, monkeypatch):
    # before: the layer level's minutes ran first; a detectron2 assertion or MODEL.DEVICE cuda gave a raw traceback
    from gwdet_lab.benchmark import cli

    monkeypatch.setattr(cli, "LEVELS", [("layers", lambda *args: pytest.fail("the layer level ran"), None),
                                        *cli.LEVELS[1:]])
    with pytest.raises(SystemExit) as stopped:
        main(["--layers", "--models", "--quick", "--model-names", "FrozenBN", "--model-opts", *opts])
    assert stopped.value.code == 2 and message in capsys.readouterr().err


def test_model_overrides_that_make_two_models_one_are_refused(capsys, monkeypatch):
    # every norm set to GN: "GW everywhere / GN everywhere 1.130, limit 1.10, met: no", a GN timing as GW's cost
    from gwdet_lab.benchmark import cli

    monkeypatch.setattr(cli, "LEVELS", [("layers", lambda *args: pytest.fail("the layer level ran"), None),
                                        *cli.LEVELS[1:]])
    with pytest.raises(SystemExit) as stopped:
        main(["--models", "--model-names", "GN everywhere", "GW everywhere", "--image-size", "64", "--model-opts",
              "MODEL.RESNETS.NORM", "GN", "MODEL.FPN.NORM", "GN", "MODEL.ROI_BOX_HEAD.NORM", "GN"])
    assert stopped.value.code == 2
    assert ("error: --model-opts MODEL.RESNETS.NORM GN MODEL.FPN.NORM GN MODEL.ROI_BOX_HEAD.NORM GN make 'GN "
            "everywhere' and 'GW everywhere' the same model") in capsys.readouterr().err


def test_model_targets_divide_the_seconds_of_the_rows_shown():
    rows = [
        {"name": name, "config": f"{name}.yaml", "seconds": seconds, "peak": None, "finite": True,
         "gw_layers": 0, "in_gw": None}
        for name, seconds in (("FrozenBN", 2.0), ("FrozenBN + GW at S1-B2", 2.5), ("GN everywhere", 4.0))
    ]
    text = model_tables({"rows": rows, "image_size": 64, "amp": "none", "opts": []})
    targets = table_rows(text, "| target |")
    assert targets == [["FrozenBN + GW at S1-B2 / FrozenBN", "1.250", "1.05", "no (+19%)"]]
    assert [row[3] for row in table_rows(text, "#### Model level")] == ["2.000", "2.500", "4.000"]


def test_competing_processes_run_in_the_block_and_stop_on_an_error():
    with pytest.raises(RuntimeError, match="stop"):
        with competing_load(2) as started:
            assert len(started) == 2 and all(process.poll() is None for process in started)
            raise RuntimeError("stop")
    assert all(process.returncode is not None for process in started)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
def test_competing_processes_exit_when_the_benchmark_is_killed():
    # os._exit skips every clean-up, as kill -9 does: the busy process must notice on its own
    script = ("import os\nfrom gwdet_lab.benchmark.busy import competing_load\n"
              "started = competing_load(1).__enter__()\nprint(started[0].pid, flush=True)\nos._exit(0)\n")
    completed = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    pid = int(completed.stdout.split()[0])
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid), f"busy process {pid} outlived the benchmark"


def test_the_report_states_the_competing_load():
    for busy, stated in ((0, False), (2, True)):
        args = parse_args(["--layers", "--busy", str(busy)])
        header = report_header(args, ["--busy", str(busy)], CPU, "1.00", "2.00", 1.0, True)
        assert ("with 2 competing CPU-bound processes" in header) is stated
        assert header.startswith(f"Command: `python tools/benchmark.py --busy {busy}`")
    header = report_header(parse_args(["--layers"]), ["--norms", "GW (itn)", "BN"], CPU, "1.00", "1.00", 1.0, True)
    assert header.startswith("Command: `python tools/benchmark.py --norms 'GW (itn)' BN`")  # runs again as shown
    # the plan that computed GW and BW (a forced one was not named: its times read as the cpu plan's)
    assert "\n- GW/BW execution plan: cpu for CPU tensors" in header
    assert "Triton's interpreter" not in header


def test_a_triton_plan_forced_on_a_cpu_is_said_to_time_the_interpreter(monkeypatch):
    # GWDET_GW_PLAN=triton on a CPU: interpreter times of 147x-998x a 3x3 conv, read as the plan's own
    from gwdet_lab.benchmark.report import INTERPRETED_TRITON

    monkeypatch.setenv("GWDET_GW_PLAN", "triton")
    header = report_header(parse_args(["--layers"]), [], CPU, "1.00", "1.00", 1.0, True)
    assert "\n- GW/BW execution plan: triton for CPU tensors" in header and f"\n{INTERPRETED_TRITON}\n" in header


def test_inference_level_end_to_end_into_a_section(tmp_path, capsys):
    out = tmp_path / "benchmarks.md"
    out.write_text("# kept\n")
    argv = ["--inference", "--quick", "--threads", "1", "--model-repeats", "1", "--model-warmup", "0", "--busy", "1",
            "--out", str(out), "--section", "smoke"]
    assert main(argv) == 0
    text = out.read_text()
    assert text.startswith("# kept\n\n" + markers("smoke")[0]) and text.endswith(markers("smoke")[1] + "\n")
    assert "with 1 competing CPU-bound process " in text
    demo = {row[0]: row for row in table_rows(text, "#### Inference: the demo Mask R-CNN")}
    gw, gn = demo["demo, GW (as configured)"], demo["demo, GN in place of GW"]
    assert int(gw[1]) > 0 and gn[1] == "0", "the GN variant replaces every GW layer, the S1-B2 ones included"
    assert gn[4] == "1.000" and float(gw[4]) == pytest.approx(float(gw[2]) / float(gn[2]), rel=0.05, abs=2e-3)
    modes = table_rows(text, "evaluation mode against training mode")
    assert len(modes) == 3 and all(len(row) == 6 for row in modes)
    for row in modes:
        eval_ms, forward_ms, step_ms = (float(cell) for cell in row[1:4])
        assert float(row[4]) > 0 and float(row[5]) > 0 and step_ms > 0 and forward_ms > 0 and eval_ms > 0


def test_benchmark_quick_mode_writes_markdown(tmp_path):
    out = tmp_path / "bench.md"
    result = subprocess.run(
        [sys.executable, str(REPO / "tools" / "benchmark.py"), "--layers", "--quick", "--threads", "1", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    text = out.read_text()
    assert "| shape |" in text
    assert "GW (itn)" in text and "conv 3x3" in text
    assert "peak memory" in text
    assert "[1/" in result.stderr  # progress lines
    # torch profiler (Kineto) lines on a machine without a GPU: each kind is one docs/benchmarks.md explains
    others = [line for line in result.stderr.splitlines() if line.startswith(("USDT:", "ERROR:", "WARNING:"))]
    explained = (REPO / "docs" / "benchmarks.md").read_text()
    assert all(line.startswith("USDT:") and "profiler_st" in line or "gpuGetDeviceCount failed" in line
               for line in others), others
    assert "`USDT: ...\nprofiler_start` and `ERROR: ... gpuGetDeviceCount failed with code 35`" in explained


def test_the_op_count_level_tables_show_the_counts_and_the_cost_model_adds_them_up(monkeypatch):
    import gwdet.layers.plans.triton_plan as triton_plan
    from gwdet_lab.benchmark.gpu_cost import (
        KERNEL_SECONDS, LAUNCH_SECONDS, MEMORY_EFFICIENCY, V100, group_whitening_device_seconds, layer_seconds,
    )
    from gwdet_lab.benchmark.op_level import describe_count, op_count_tables, run_op_counts

    monkeypatch.setattr(triton_plan, "_failures", {})  # this process's Triton falls back: keep that local
    with pytest.warns(RuntimeWarning, match="cannot run on cpu"):
        results = run_op_counts(parse_args(["--op-counts", "--quick"]), CPU)
    text = op_count_tables(results)
    rows = table_rows(text, "#### Dispatched operations per forward + backward")
    for (_where, shape), row in zip(results["shapes"], rows, strict=True):
        cells = dict(zip(results["names"], row[2:], strict=True))
        assert cells == {name: describe_count(results["counts"][(shape, name)]) for name in results["names"]}
        assert cells[CONV] == cells["GN(32)"] == "2"
        assert "syncs" in cells["GW cpu"] and "syncs" not in cells["GW accelerator"]
    assert "fell back to the accelerator plan" in text  # no interpreter here: the report says so
    shape = results["shapes"][0][1]
    counted = results["counts"][(shape, "GW accelerator")]
    host = counted.total * LAUNCH_SECONDS  # the launches overlap the device's work: the larger one counts
    device = (counted.total * KERNEL_SECONDS + counted.bytes_moved / (V100.bandwidth * MEMORY_EFFICIENCY)
              + group_whitening_device_seconds(V100, "GW accelerator", shape))
    assert layer_seconds(V100, "GW accelerator", shape, counted) == pytest.approx(max(host, device), rel=1e-12)
    assert counted.bytes_moved >= 4 * 4 * math.prod(shape)  # at least input, output and gradients once


def test_the_cost_model_overlaps_launches_and_charges_idle_multiprocessors():
    from gwdet_lab.benchmark.gpu_cost import H100, Cost, group_whitening_device_seconds, product_seconds

    assert Cost(3.0, 2.0).seconds == 3.0 and (Cost(3.0, 2.0) + Cost(0.0, 4.0)).seconds == 6.0
    # 2 output tiles on 132 multiprocessors: 66 times the full-occupancy time
    assert product_seconds(H100, 1e9, 2, 1e12) == pytest.approx(66 * product_seconds(H100, 1e9, 132, 1e12))
    # the FPN shape with 2 images: the split products of the accelerator plan take a fraction of the
    # unsplit ones of the autograd formulas (the same FLOPs but for the stacked samples' extra)
    shape = (2, 256, 100, 152)
    assert group_whitening_device_seconds(H100, "GW accelerator", shape) < 0.3 * group_whitening_device_seconds(
        H100, "GW autograd", shape)


def test_the_default_gpu_plan_is_the_one_the_cost_model_predicts_faster():
    # until a GPU measures them: the launches of docs/benchmarks.md ("Dispatched operations": 134
    # for accelerator, 48 + 2 kernels for triton) and the accelerator plan's bytes, counted here at 2
    # samples and scaled, for both (the triton plan moves fewer)
    from collections import Counter

    from gwdet.layers.plans import default_gpu_plan
    from gwdet_lab.benchmark.cases import LAYER_SHAPES
    from gwdet_lab.benchmark.gpu_cost import H100, V100, faster_plan
    from gwdet_lab.benchmark.op_counts import OperationCount
    from gwdet_lab.benchmark.op_level import layer_count

    disagreements = {}
    for gpu, capability in ((H100, (9, 0)), (V100, (7, 0))):
        for _, shape in LAYER_SHAPES + [(None, (2048, 256, 7, 7))]:
            proxy = layer_count("GW accelerator", (2, *shape[1:]), CPU)
            moved = proxy.bytes_moved * shape[0] // 2
            counts = {(shape, "GW accelerator"): OperationCount(Counter(bmm=134), Counter(), 0, moved),
                      (shape, "GW triton"): OperationCount(Counter(bmm=48), Counter(kernel=2), 0, moved)}
            if faster_plan(gpu, shape, counts) != default_gpu_plan(capability, True):
                disagreements[(gpu.name, shape)] = faster_plan(gpu, shape, counts)
    # on a V100 the kernels' FMA products beat cuBLAS's launches only for the 16 x 16 matrices
    assert disagreements == {("V100", (1024, 1024)): "triton"}


def test_gw_flops_of_the_cost_model_count_the_products_the_code_runs():
    from gwdet_lab.benchmark.gpu_cost import group_whitening_flops

    # (512, 256, 7, 7), g = 64, m = 196: 6 products of 64 x 64 by 64 x 196 and 48 of 64 x 64 per sample
    assert group_whitening_flops((512, 256, 7, 7)) == 2.0 * 512 * (6 * 64 * 196 * 64 + 48 * 64**3)
    # few columns (1024, 1024): m = 16 < g, so 16 x 16 matrices
    assert group_whitening_flops((1024, 1024)) == 2.0 * 1024 * (6 * 64 * 16 * 16 + 48 * 16**3)


def test_the_memory_caption_gives_the_ratio_to_gn_only_when_gn_was_measured():
    # --norms "GW (itn)": "in parentheses the ratio to GN(32)" over a table without GN(32) and without ratios
    shape = (2, 16, 12, 12)
    results = {"shapes": [("backbone", shape)], "names": [CONV, GW_ITN],
               "time": {(shape, CONV): 1e-3, (shape, GW_ITN): 2e-3}, "ratio": {(shape, GW_ITN): 2.0},
               "memory": {(shape, CONV): 2**20, (shape, GW_ITN): 2**21}}
    text = layer_tables(results)
    assert ("Peak MiB allocated above the input, output gradient and parameters; no ratio to GN(32), which was not "
            "measured (not in --norms).") in text and "in parentheses the ratio to GN(32)" not in text
    # 16 channels (--quick): the columns GN(32) and GW (itn) (g=64) normalize fewer groups than they say
    assert ("At (2, 16, 12, 12) the channels are fewer than the groups asked (GW (itn): g=64), so there "
            "those layers normalize fewer groups than their names say") in text
    assert table_rows(text, "#### Layer level: peak memory") == [["(2, 16, 12, 12)", "1.0", "2.0"]]
    results["names"].insert(1, "GN(32)")
    results["time"][(shape, "GN(32)")], results["ratio"][(shape, "GN(32)")] = 1e-3, 1.0
    results["memory"][(shape, "GN(32)")] = 2**20
    text = layer_tables(results)
    assert "parameters; in parentheses the ratio to GN(32)." in text
    assert table_rows(text, "#### Layer level: peak memory") == [["(2, 16, 12, 12)", "1.0 (1.00)", "1.0 (1.00)",
                                                                  "2.0 (2.00)"]]


# --norms BN: the time caption spoke of GN(32) and GW (itn) reducing their groups, layers the table did not hold
def test_the_time_caption_names_only_measured_layers_with_fewer_channels_than_groups():
    shape = (2, 16, 12, 12)
    results = {"shapes": [("backbone", shape)], "names": [CONV, "BN"],
               "time": {(shape, CONV): 1e-3, (shape, "BN"): 2e-3}, "ratio": {(shape, "BN"): 2.0},
               "memory": {(shape, CONV): 2**20, (shape, "BN"): 2**21}}
    text = layer_tables(results)
    assert "fewer than the groups" not in text and "GW" not in text
    assert "GN(32)" not in text.split("#### Layer level: peak")[0]
    gn = "GN(32)"
    results["names"].append(gn)
    results["time"][(shape, gn)], results["ratio"][(shape, gn)], results["memory"][(shape, gn)] = 1e-3, 1.0, 2**20
    text = layer_tables(results)
    assert "the channels are fewer than the groups asked (GN(32): 32), so there those layers" in text


@pytest.mark.parametrize("argv, repeats", [
    (["--layers", "--quick"], "repeats: 1 (layers, after 0 warm-up); wall time"),
    (["--models"], "repeats: 3 (models, after 1 warm-up); wall time"),
    (["--inference", "--repeats", "2", "--model-repeats", "4"],
     "repeats: 2 (inference GW modes, after 1 warm-up), 4 (inference demo passes, after 1 warm-up); wall time"),
    ([], "repeats: 5 (layers and inference GW modes, after 1 warm-up), 3 (models and inference demo passes, after 1 "
         "warm-up); wall time"),
    (["--op-counts"], "clock: wall time; nothing timed (the op-count level counts operations); wall time"),
])
def test_the_header_states_the_repeats_of_the_levels_that_ran(argv, repeats):
    # --layers only: "repeats: 1 (layers, after 0 warm-up), 3 (models, after 1 warm-up)" for a run without models
    header = report_header(parse_args(argv), argv, CPU, "1.00", "1.00", 1.0, True)
    assert repeats in header


def test_the_model_level_says_the_group_numbers_its_layers_used(capsys):
    # MODEL.GN.NUM_GROUPS 7: a warning on stderr that GN used 4 groups; the report said only the override
    argv = ["--models", "--quick", "--threads", "1", "--image-size", "32", "--model-repeats", "1", "--model-warmup",
            "0", "--model-names", "GN everywhere", "--model-opts", "MODEL.GN.NUM_GROUPS", "7"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert ("config overrides: `MODEL.GN.NUM_GROUPS 7`. Group numbers that do not divide the layers' channels were "
            "adjusted, and the table measures what the layers use: GN everywhere: 65 GroupNorm layer(s) asked for 7 "
            "groups use 4.") in printed
    rows = [{"name": "FrozenBN", "config": "a.yaml", "seconds": 1.0, "peak": None, "finite": True, "gw_layers": 0,
             "in_gw": None, "adjusted": []}]
    assert "Group numbers" not in model_tables({"rows": rows, "image_size": 64, "amp": "none", "opts": []})


# before: --compile with --norms timed nothing compiled (no compiled name passed the --norms filter), without a word
def test_compile_with_norms_times_the_compiled_variants_of_the_chosen_norms(capsys):
    from gwdet_lab.benchmark.layer_level import selected_names

    args = parse_args(["--layers", "--quick", "--norms", "GW (itn)", "BN", "BW", "--no-autograd-gw", "--compile"])
    assert selected_names(args) == [CONV, "BN", "GW (itn)", "BW", "GW (itn), compiled", "BW, compiled"]
    with pytest.raises(SystemExit) as refused:
        parse_args(["--layers", "--norms", "BN", "GN(32)", "--compile"])
    assert refused.value.code == 2 and ("--compile times GW (itn), BW, BGN under torch.compile, and --norms 'BN' "
                                        "'GN(32)' names none of them, so nothing would be compiled") in \
        capsys.readouterr().err


# before: a section another run wrote between this run's read and its replace of the file was lost
def test_runs_writing_sections_into_one_file_at_once_keep_each_others(tmp_path, monkeypatch):
    import threading

    from gwdet_lab.benchmark import report as report_module

    out = tmp_path / "race.md"
    out.write_text("# mine\n")
    real_write = report_module.write_text_atomically
    other = threading.Thread(target=write_section, args=(out, "tables two", "two"))

    def write_while_another_run_writes(path, text):
        if not other.is_alive() and other.ident is None:
            other.start()  # the second run reads and writes while this one has read the file
            other.join(timeout=1.0)
        real_write(path, text)

    monkeypatch.setattr(report_module, "write_text_atomically", write_while_another_run_writes)
    write_section(out, "tables one", "one")
    other.join(timeout=10)
    text = out.read_text()
    assert text.startswith("# mine\n") and "tables one" in text and "tables two" in text
    assert text.count(markers("one")[0]) == 1 and text.count(markers("two")[0]) == 1


# marker lines shown as an example inside a fenced code block were taken for the section: the example was replaced
# by the tables
@pytest.mark.parametrize("fence", ["```", "~~~", "````markdown"])
def test_markers_inside_a_fenced_code_block_are_the_files_text(tmp_path, fence):
    begin, end = markers("main")
    closing = fence.removesuffix("markdown")
    example = f"# My doc\n\nPaste these lines:\n\n{fence}\n{begin}\nEXAMPLE CONTENT\n{end}\n{closing}\n\nmore text\n"
    path = tmp_path / "doc.md"
    path.write_text(example)
    write_section(path, "tables", "main")
    assert path.read_text() == f"{example.rstrip()}\n\n{begin}\ntables\n{end}\n"
    write_section(path, "new tables", "main")  # the real section, outside the fence, is replaced; the example kept
    assert path.read_text() == f"{example.rstrip()}\n\n{begin}\nnew tables\n{end}\n"
    unclosed = tmp_path / "unclosed.md"
    unclosed.write_text(f"# Doc\n\n{fence}\nsome code\n")
    with pytest.raises(ValueError, match=r"its fenced code block opened on line 3 is not closed, so the section 'main' "
                                         r"appended at the end of the file would be inside it: close the block"):
        write_section(unclosed, "tables", "main")
    assert unclosed.read_text() == f"# Doc\n\n{fence}\nsome code\n"


# two hand-written short begin lines with their end lines were counted as "0 begin and 2 end line(s)"
def test_short_hand_written_begin_lines_are_counted_and_delimit_a_section(tmp_path):
    from gwdet_lab.benchmark.report import section_file_problem

    short_begin, end = "<!-- benchmark:begin main -->", markers("main")[1]
    path = tmp_path / "dup.md"
    text = f"# Two\n{short_begin}\nA\n{end}\nmiddle\n{short_begin}\nB\n{end}\ntail\n"
    path.write_text(text)
    assert section_file_problem(path, "main") == (
        f"--out {path}: the section 'main' has 2 begin and 2 end line(s) of its markers, so the text between them is "
        "not one section of the benchmark's: make it one begin line, the tables, one end line (or remove its marker "
        "lines), or give another --section; nothing was measured or changed")
    path.write_text(f"# One\n{short_begin}\nold\n{end}\ntail\n")  # one hand-written section: replaced in place
    assert section_file_problem(path, "main") is None
    write_section(path, "new", "main")
    assert path.read_text() == f"# One\n{markers('main')[0]}\nnew\n{end}\ntail\n"
    path.write_text("# Other\n<!-- benchmark:begin main2 -->\nkept\n")  # another section's begin line is text
    write_section(path, "new", "main")
    assert path.read_text() == f"# Other\n<!-- benchmark:begin main2 -->\nkept\n\n{markers('main')[0]}\nnew\n{end}\n"
