"""The norm study (tools/compare_norms.py, gwdet_lab.study): a tiny study end to end with a kill and
a resume, the recorded-config check, the statistics, batch scaling and the study configs."""
import csv
import hashlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from gwdet.model_zoo import build_config
from gwdet.config import flatten_config
from gwdet_lab.study import worker
from gwdet_lab.study.cli import main as study_main
from gwdet_lab.study.cells import Cell, RunSpec, batch_scaling_opts, paper_specs, parse_extra, study_cells
from gwdet_lab.study.evaluation import choose_weight
from gwdet_lab.study.record import ConfigMismatch, comparable_dump, plan
from gwdet_lab.study.run_folder import (RECORD_JSON, DamagedFile, RunFolder, final_loss, loss_curve,
                                       seconds_per_iteration)
from gwdet_lab.study.stats import paired_difference, t_quantile
from gwdet_lab.study.report import write_report
from gwdet_lab.study.scheduler import is_done
from gwdet_lab.study.summary import summarize

from conftest import REPO, TINY_OPTS

STUDY = REPO / "configs" / "Study"
# The demo-sized overrides, with a test split and a schedule that scales to 1 and 8 images per batch.
TINY = [*TINY_OPTS, "DATASETS.SHAPES.NUM_TEST", "4", "SOLVER.CHECKPOINT_PERIOD", "2"]


def compare_norms(out: Path, *arguments: str, check: bool = True, **popen) -> subprocess.CompletedProcess:
    command = [sys.executable, str(REPO / "tools" / "compare_norms.py"), "--out", str(out), *arguments]
    completed = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600, **popen)
    if check:
        assert completed.returncode == 0, (completed.stdout + completed.stderr)[-4000:]
    return completed


def cells(names):
    specs = paper_specs("shapes", REPO)
    configs = [build_config(s.config_file, TINY) for s in specs]
    return [c for c in study_cells("paper", specs, configs, seeds=(0,)) if c.name in names]


# ---- end to end ------------------------------------------------------------------------------------


def test_study_killed_then_resumed_keeps_finished_cells_and_refuses_changed_configs(tmp_path, capsys):
    opts = [*TINY, "SOLVER.MAX_ITER", "6"]  # checkpoints after iterations 2, 4 and 6
    arguments = ["--study", "paper", "--seeds", "0", "--only", "bn-b2-s0", "gn-b2-s0",
                 "--example-weights", "0", "1", "--opts", *opts]
    first = subprocess.Popen([sys.executable, str(REPO / "tools" / "compare_norms.py"), "--out", str(tmp_path),
                              *arguments], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    bn, gn = RunFolder(tmp_path / "runs" / "bn-b2-s0"), RunFolder(tmp_path / "runs" / "gn-b2-s0")
    deadline = time.monotonic() + 300
    # Kill the study once the first cell is complete and the second has a checkpoint.
    while not (bn.is_complete() and gn.has_checkpoint()) and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    first.send_signal(signal.SIGTERM)  # the study stops its worker too
    output, _ = first.communicate(timeout=120)
    assert bn.is_complete(), output
    assert first.returncode in (0, 130), output
    assert not gn.is_busy()  # no worker left behind holding the folder
    # The stopped invocation's wall time and memory are recorded, to be added to the resumed one's.
    stopped = gn.read_json("study_run.json")
    assert stopped["sessions"] == 1 and stopped["wall_seconds"] > 0 and stopped["peak_rss_mb"] > 100

    # Both cells were recorded before anything trained, with the config they resolve to.
    for folder in (bn, gn):
        record = json.loads(folder.file(RECORD_JSON).read_text())
        assert yaml.safe_load(record["config"])["SOLVER"]["MAX_ITER"] == 6

    kept = [bn.file(name) for name in ("model_final.pth", "results.json", "example_weighing.json",
                                       "batch_statistics.json")]
    mtimes = [p.stat().st_mtime_ns for p in kept]
    capsys.readouterr()
    assert study_main(["--out", str(tmp_path), *arguments], repo_root=REPO) == 0  # the study again, in this process
    second = capsys.readouterr().out
    assert "[1/2 bn-b2-s0] done, skipped" in second
    assert "[2/2 gn-b2-s0] resuming from its last checkpoint" in second or \
        "[2/2 gn-b2-s0] done, skipped" in second  # the kill came after its last iteration
    assert [p.stat().st_mtime_ns for p in kept] == mtimes
    assert gn.is_complete()
    if "resuming" in second:
        resumed = gn.read_json("study_run.json")
        assert resumed["sessions"] == 2 and resumed["wall_seconds"] > stopped["wall_seconds"]

    report = tmp_path / "paper"
    table = (report / "table.md").read_text()
    assert "| BN | 2 | 1 |" in table and "| GN | 2 | 1 |" in table and "## Pending" not in table
    assert "| GN > BN | 2 | +3.09 |" in table and "fewer than 2 paired seeds" in table  # one seed: no interval
    weighing = bn.read_json("example_weighing.json", null_is_nan=True)  # strict JSON: an AP of NaN is null
    assert set(weighing["shapes_val"]) == {"0", "1"} and weighing["chosen"] in (0.0, 1.0)
    as_text = lambda results: json.dumps(results, sort_keys=True)  # noqa: E731  (NaN equal to NaN)
    assert as_text(weighing["shapes_val"]["0"]) == as_text(bn.results()["shapes_val"])
    for name in ("table.csv", "differences.csv", "cells.csv", "ap_bars.png", "loss_curves.png"):
        assert (report / name).stat().st_size > 100
    # the bootstrap over the test images, from each cell's own detections, in both tables
    assert "SE over test images" in table and "test images only 95% low" in table
    for folder in (bn, gn):
        assert len(folder.read_json("image_bootstrap.json")["box_ap"]) == 1000

    # The same cells with another schedule or group count: refused, nothing touched.
    changed = arguments[:-len(opts) - 1] + ["--opts", *opts, "SOLVER.MAX_ITER", "4", "MODEL.GN.NUM_GROUPS", "4"]
    capsys.readouterr()
    assert study_main(["--out", str(tmp_path), *changed], repo_root=REPO) == 2  # in this process: refused first
    refused = capsys.readouterr()
    assert "SOLVER.MAX_ITER: recorded 6, requested 4" in refused.err
    assert "MODEL.GN.NUM_GROUPS: recorded 8, requested 4" in refused.err
    assert "training" not in refused.out and [p.stat().st_mtime_ns for p in kept] == mtimes
    assert not (tmp_path / "runs" / "bn-b2-s0.2").exists()

    # A cell killed after its training but before its evaluations finished is evaluated by a new
    # worker process, which registers the datasets itself (no training there to do it).
    for name in ("study_complete.json", "study_complete.json.sha256", "batch_statistics.json",
                 "batch_statistics.json.sha256"):
        bn.file(name).unlink()
    capsys.readouterr()
    assert study_main(["--out", str(tmp_path), *arguments], repo_root=REPO) == 0
    third = capsys.readouterr().out
    assert "[1/2 bn-b2-s0] evaluating" in third and bn.is_complete(), third
    assert bn.file("batch_statistics.json").exists()

    # a finished cell run again with a subset of its weights without the chosen one was "done, skipped", and the
    # report showed the weight the command left out
    other = 1.0 if bn.read_json("example_weighing.json")["chosen"] == 0.0 else 0.0
    subset = [*arguments[:arguments.index("--example-weights") + 1], f"{other:g}", *arguments[arguments.index("--opts"):]]
    assert study_main(["--out", str(tmp_path), *subset], repo_root=REPO) == 0
    assert "[1/2 bn-b2-s0] evaluating" in capsys.readouterr().out
    assert bn.read_json("example_weighing.json")["chosen"] == other
    table = (report / "table.md").read_text()
    assert f"among the swept weights ({other:g})" in table
    with open(report / "cells.csv", newline="") as file:
        assert {row["cell"]: float(row["ew_weight"]) for row in csv.DictReader(file) if row["ew_weight"]} == \
            {"bn-b2-s0": other}
    # --records <out>/runs, which the tool advises for a study it cannot write into: "metrics.json is damaged (its
    # SHA-256 record ... is missing)" for every cell, as no run folder records one
    assert study_main(["--study", "paper", "--records", str(tmp_path / "runs"), "--example-weights", f"{other:g}",
                       "--report-to", str(tmp_path / "from-runs")], repo_root=REPO) == 0
    assert (tmp_path / "from-runs" / "cells.csv").read_text() == (report / "cells.csv").read_text()


def test_a_custom_comparison_with_one_test_dataset_ends_with_a_report(tmp_path):
    # The demo configs evaluate on one dataset, for which detectron2 drops the dataset level of its
    # results: the report still finds that dataset's AP by its name.
    # (one configuration: the paired comparisons of several are the kill-and-resume test's)
    demo = REPO / "configs" / "Demo"
    compare_norms(tmp_path, "--configs", f"gw={demo / 'scratch_faster_rcnn_gw_shapes.yaml'}", "--seeds", "0",
                  "--no-example-weighing", "--opts", *TINY_OPTS)
    results = json.loads((tmp_path / "runs" / "gw-s0" / "results.json").read_text())
    assert list(results) == ["shapes_val", "environment"]
    table = (tmp_path / "custom" / "table.md").read_text()
    ap = results["shapes_val"]["bbox"]["AP"]
    assert f"| GW | 2 | 1 | 28.79 | {ap:.2f} |" in table and "## Pending" not in table


# ---- the recorded config -----------------------------------------------------------------------------


def test_plan_records_every_cell_first_and_refuses_a_changed_config(tmp_path):
    bn, gn = cells({"bn-b2-s0", "gn-b2-s0"})
    planned = plan([bn, gn], tmp_path, TINY)
    assert all(p.folder.file(RECORD_JSON).is_file() for p in planned)
    environment = json.loads(planned[0].folder.file(RECORD_JSON).read_text())["environment"]
    assert {"python", "torch", "torchvision", "detectron2", "numpy", "Pillow", "pycocotools"} <= set(environment["versions"])
    names = [*planned[0].cfg.DATASETS.TRAIN, *planned[0].cfg.DATASETS.TEST]
    assert set(environment["datasets"]) == set(names) and "shapes_train" in names
    for files in environment["datasets"].values():  # the shapes splits, generated before the record was written
        assert files["json_sha256"] == hashlib.sha256(Path(files["json_file"]).read_bytes()).hexdigest()
    assert plan([bn, gn], tmp_path, TINY)[0].folder == planned[0].folder  # same config: accepted

    changed = [*TINY, "SOLVER.BASE_LR", "0.5"]
    with pytest.raises(ConfigMismatch) as refused:
        plan([bn, gn], tmp_path, changed)
    message = str(refused.value)
    assert "bn-b2-s0" in message and "gn-b2-s0" in message
    assert "SOLVER.BASE_LR: recorded 0.01, requested 0.5" in message

    # With new-folder, the changed config goes beside the recorded one, and finds it again later.
    moved = plan([bn, gn], tmp_path, changed, on_mismatch="new-folder")
    assert [p.folder.path.name for p in moved] == ["bn-b2-s0.2", "gn-b2-s0.2"]
    assert plan([bn], tmp_path, changed, on_mismatch="new-folder")[0].folder.path.name == "bn-b2-s0.2"
    assert plan([bn], tmp_path, TINY, on_mismatch="new-folder")[0].folder.path.name == "bn-b2-s0"
    # the changed config again without the flag: the advice was to "train the requested config into new
    # folders", as if nothing held it yet
    with pytest.raises(ConfigMismatch) as refused:
        plan([bn], tmp_path, changed)
    assert str(refused.value).endswith(
        "The requested config is already in bn-b2-s0.2 (for bn-b2-s0), which --on-mismatch new-folder made: pass "
        "--on-mismatch new-folder again to use those folders (what they hold is not trained again).")


def test_refused_plan_writes_nothing(tmp_path):
    (bn,) = cells({"bn-b2-s0"})
    (gn,) = cells({"gn-b2-s0"})
    plan([bn], tmp_path, TINY)
    with pytest.raises(ConfigMismatch):
        plan([gn, bn], tmp_path, [*TINY, "SOLVER.MAX_ITER", "3"])
    assert not (tmp_path / "gn-b2-s0").exists()


def test_cells_recorded_before_a_key_was_added_are_pointed_to_their_records(tmp_path):
    # advised to restore the config, use --on-mismatch new-folder (retraining everything) or another
    # --out, none of which fits a key the code added; --records <out>/runs reports them as recorded
    (gn,) = cells({"gn-b2-s0"})
    (planned,) = plan([gn], tmp_path, TINY)
    record = planned.folder.read_json(RECORD_JSON)
    dump = yaml.safe_load(record["config"])
    del dump["MODEL"]["STRICT_NORM_GROUPS"]  # as an earlier gwdet recorded it
    record["config"] = yaml.safe_dump(dump)
    planned.folder.write_json(RECORD_JSON, record)
    with pytest.raises(ConfigMismatch) as refused:
        plan([gn], tmp_path, TINY)
    assert str(refused.value).endswith(
        "MODEL.STRICT_NORM_GROUPS: requested False, the record has no such key\nEvery difference is a key this "
        "version of gwdet has and the records do not: the cells were recorded by an earlier version. Report the "
        f"finished cells as recorded with --records {tmp_path} (nothing is trained), or train them again into "
        "another --out.")


def test_folder_with_training_output_but_no_record_is_refused(tmp_path):
    (bn,) = cells({"bn-b2-s0"})
    legacy = tmp_path / "bn-b2-s0"
    legacy.mkdir()
    (legacy / "last_checkpoint").write_text("model_0000001.pth")
    with pytest.raises(ConfigMismatch, match="no study_cell.json: its config is unknown"):
        plan([bn], tmp_path, TINY)


def test_ignored_keys_do_not_count_as_a_difference():
    cfg = build_config(str(STUDY / "gn.yaml"), [*TINY, "OUTPUT_DIR", "/a", "DATASETS.SHAPES.ROOT", "/x"])
    other = build_config(str(STUDY / "gn.yaml"), [*TINY, "OUTPUT_DIR", "/b"])
    assert comparable_dump(cfg) == comparable_dump(other)


def test_worker_refuses_a_config_file_edited_after_planning(tmp_path, capsys):
    config = tmp_path / "gn.yaml"
    config.write_text(f'_BASE_: "{STUDY / "gn.yaml"}"\n')
    cell = Cell("gn-b2-s0", "gn", str(config), ("SEED", "0"), 0, 2)
    (planned,) = plan([cell], tmp_path / "runs", TINY)
    config.write_text(f'_BASE_: "{STUDY / "gn.yaml"}"\nSOLVER:\n  BASE_LR: 0.002\n')
    assert worker.run(planned.folder, weights=()) == worker.EXIT_MISMATCH
    assert "SOLVER.BASE_LR: recorded 0.01, requested 0.002" in capsys.readouterr().out
    assert not planned.folder.has_training_output()


def test_second_worker_on_a_folder_is_turned_away(tmp_path):
    folder = RunFolder(tmp_path / "cell")
    with folder.lock():
        assert folder.is_busy()
        completed = subprocess.run([sys.executable, "-m", "gwdet_lab.study.worker", str(folder.path)],
                                   cwd=REPO, capture_output=True, text=True, timeout=120,
                                   env={**os.environ, "PYTHONPATH": str(REPO)})
        assert completed.returncode == worker.EXIT_BUSY, completed.stdout + completed.stderr
        assert "in use by another process" in completed.stdout
    assert not folder.is_busy()


# ---- cells -------------------------------------------------------------------------------------------


def test_batch_scaling_keeps_images_seen_and_scales_the_learning_rate():
    cfg = build_config(str(STUDY / "gn.yaml"), ["SOLVER.MAX_ITER", "6000", "SOLVER.STEPS", "(4800, 5600)",
                                                "SOLVER.WARMUP_ITERS", "500", "SOLVER.CHECKPOINT_PERIOD", "500",
                                                "SOLVER.BASE_LR", "0.01"])
    assert batch_scaling_opts(cfg, 2) == ()
    assert batch_scaling_opts(cfg, 8) == (
        "SOLVER.IMS_PER_BATCH", "8", "SOLVER.BASE_LR", "0.04", "SOLVER.MAX_ITER", "1500",
        "SOLVER.WARMUP_ITERS", "125", "SOLVER.CHECKPOINT_PERIOD", "125", "SOLVER.STEPS", "(1200, 1400)")
    one = dict(zip(*[iter(batch_scaling_opts(cfg, 1))] * 2, strict=True))
    assert (one["SOLVER.BASE_LR"], one["SOLVER.MAX_ITER"], one["SOLVER.STEPS"]) == ("0.005", "12000", "(9600, 11200)")
    with pytest.raises(ValueError, match="SOLVER.WARMUP_ITERS = 500 .* 3 images"):
        batch_scaling_opts(cfg, 3)


def test_batch_sweep_shares_its_two_image_cells_with_the_paper_study(tmp_path):
    """The sweep's 2-image cells resolve to exactly the paper study's seed-0 cells, so they are
    trained once; the others keep the images seen."""
    sweep_opts = [*TINY, "SOLVER.MAX_ITER", "8", "SOLVER.STEPS", "(4,)", "SOLVER.WARMUP_ITERS", "4",
                  "SOLVER.CHECKPOINT_PERIOD", "4"]
    specs = paper_specs("shapes", REPO)
    configs = [build_config(s.config_file, sweep_opts) for s in specs]
    paper = study_cells("paper", specs, configs)
    sweep = study_cells("batch-sweep", specs, configs, batch_sizes=(1, 2, 8))
    assert [c.name for c in paper[:4]] == ["bn-b2-s0", "bn_gw_s1b2-b2-s0", "gn-b2-s0", "gw-b2-s0"]
    assert [c.seed for c in paper] == [0] * 4 + [1] * 4 + [2] * 4
    assert [c.batch_size for c in sweep] == [1] * 4 + [2] * 4 + [8] * 4
    plan([c for c in paper if c.seed == 0], tmp_path, sweep_opts)
    shared = plan([c for c in sweep if c.batch_size == 2], tmp_path, sweep_opts)  # no ConfigMismatch
    assert [p.folder.path.name for p in shared] == [c.name for c in paper[:4]]
    eight = plan([c for c in sweep if c.batch_size == 8][:1], tmp_path, sweep_opts)[0]
    assert eight.images == 8 * 2
    assert (eight.cfg.SOLVER.MAX_ITER, eight.cfg.SOLVER.STEPS, eight.cfg.SOLVER.BASE_LR) == (2, (1,), 0.04)


def test_extra_runs_need_key_value_pairs():
    assert parse_extra(["bgn=a.yaml", "K", "V"]) == RunSpec("bgn", "a.yaml", ("K", "V"))
    with pytest.raises(ValueError, match="NAME=CONFIG"):
        parse_extra(["a.yaml", "K", "V"])
    with pytest.raises(ValueError, match="KEY VALUE"):
        parse_extra(["a=a.yaml", "K"])
    with pytest.raises(ValueError, match="folder"):
        Cell("../up", "g", "a.yaml", (), 0, 2)


# ---- the study configs ---------------------------------------------------------------------------------


def flat_config(path: Path) -> dict:
    return flatten_config(yaml.safe_load(comparable_dump(build_config(str(path)))))


def test_study_configs_differ_only_in_their_norms():
    """The four study configs share data, schedule, model size and seed; only norm choices (and
    what the norm implies, such as a head's name) differ."""
    configs = {name: flat_config(STUDY / f"{name}.yaml") for name in ("bn", "bn_gw_s1b2", "gn", "gw")}
    keys = set().union(*configs.values())
    differing = {k for k in keys if len({repr(c.get(k)) for c in configs.values()}) > 1}
    allowed = {k for k in differing if "NORM" in k or k.endswith((".GW_POSITIONS", ".NAME"))}
    assert differing == allowed, sorted(differing - allowed)
    assert configs["gn"]["SOLVER.IMS_PER_BATCH"] == 2 and configs["gn"]["MODEL.BACKBONE.FREEZE_AT"] == 0
    assert configs["gn"]["DATASETS.TEST"] == ["shapes_val", "shapes_test"]


def test_study_configs_change_only_data_and_schedule_of_their_demo_base():
    for name in ("bn", "gw"):
        study = flat_config(STUDY / f"{name}.yaml")
        demo = flat_config(REPO / "configs" / "Demo" / f"scratch_faster_rcnn_{name}_shapes.yaml")
        differing = {k for k in set(study) | set(demo) if study.get(k) != demo.get(k)}
        assert all(k.startswith(("DATASETS.", "DATALOADER.", "SOLVER.", "TEST.", "SEED")) for k in differing), differing


# ---- statistics ----------------------------------------------------------------------------------------


def test_paired_t_interval_matches_hand_computation():
    values = {"gw": {0: 30.0, 1: 31.0, 2: 29.5, 3: 40.0}, "gn": {0: 28.0, 1: 28.5, 2: 28.5}}
    d = paired_difference("gw", "gn", values)
    # d = 2.0, 2.5, 1.0 (seed 3 has no partner); mean 11/6; sd = sqrt(7/12); t_{0.975, 2} = 4.302653.
    assert d.seeds == (0, 1, 2) and d.differences == (2.0, 2.5, 1.0)
    assert d.mean == pytest.approx(11 / 6)
    assert d.std == pytest.approx(math.sqrt(7 / 12))
    half = 4.302652729911275 * math.sqrt(7 / 12) / math.sqrt(3)
    assert (d.low, d.high) == (pytest.approx(11 / 6 - half), pytest.approx(11 / 6 + half))
    assert (round(d.low, 4), round(d.high, 4)) == (-0.064, 3.7306)
    assert d.verdict == "cannot resolve"


def test_verdicts_and_t_quantiles():
    assert t_quantile(0.95, 1) == pytest.approx(12.706204736)
    assert t_quantile(0.95, 4) == pytest.approx(2.776445105)
    clear = paired_difference("a", "b", {"a": {0: 3.0, 1: 3.2, 2: 3.1}, "b": {0: 1.0, 1: 1.1, 2: 1.0}})
    assert clear.verdict == "supports" and clear.low > 0
    reverse = paired_difference("b", "a", {"a": {0: 3.0, 1: 3.2, 2: 3.1}, "b": {0: 1.0, 1: 1.1, 2: 1.0}})
    assert reverse.verdict == "contradicts" and reverse.high < 0
    single = paired_difference("a", "b", {"a": {0: 3.0}, "b": {0: 1.0, 1: 2.0}})
    assert single.mean == 2.0 and single.low is None and single.verdict.startswith("cannot resolve")
    with_nan = paired_difference("a", "b", {"a": {0: math.nan, 1: 2.0, 2: 3.0}, "b": {0: 1.0, 1: 1.0, 2: 1.0}})
    assert with_nan.seeds == (1, 2)


def test_choose_weight_prefers_best_ap_then_smaller_weight():
    aps = {"0": 10.0, "0.1": 12.0, "0.5": 12.0, "1": math.nan}
    assert choose_weight(aps, [0.0, 0.1, 0.5, 1.0]) == 0.1
    assert choose_weight(aps, [0.0, 1.0]) == 0.0
    assert choose_weight(aps, [0.25]) is None


def test_metrics_of_a_resumed_run(tmp_path):
    lines = [
        '{"iteration": 19, "total_loss": 2.0, "time": 0.5}',
        '{"iteration": 39, "total_loss": 1.5, "time": 0.7}',
        '{"iteration": 39, "total_loss": 1.4, "time": 0.6}',  # logged again after a resume
        '{"iteration": 39, "bbox/AP": 3.0}',
        '{"iteration": 59, "total_',  # cut off by the interruption
    ]
    (tmp_path / "metrics.json").write_text("\n".join(lines))
    records = RunFolder(tmp_path).metrics()
    assert loss_curve(records) == [(19, 2.0), (39, 1.4)]
    assert final_loss(records) == 1.4 and seconds_per_iteration(records) == 0.6


def test_a_diverging_run_is_an_outcome_not_a_failure(tmp_path):
    """A learning rate far too high: the worker records the divergence, the cell counts as done,
    and the report shows it without averaging a number for it."""
    (cell,) = cells({"gn-b2-s0"})
    opts = [*TINY, "SOLVER.MAX_ITER", "4", "SOLVER.BASE_LR", "1e6", "SOLVER.WARMUP_ITERS", "0"]
    (planned,) = plan([cell], tmp_path / "runs", opts)
    assert worker.run(planned.folder, weights=()) == 0
    assert planned.folder.diverged() and planned.folder.is_complete() and is_done(planned, ())
    result = summarize(planned)
    assert result.diverged and math.isnan(result.test_ap)
    write_report("t", [result], [], tmp_path / "report")
    table = (tmp_path / "report" / "table.md").read_text()
    assert "| GN | 2 | 1 | 28.19 | – | – | s0: diverged | – | 1 |" in table


@pytest.mark.parametrize("flag, value, message", [("--seeds", "-1", "a seed must be >= 0, got -1"),
                                                 ("--batch-sizes", "0", "images per batch must be >= 1, got 0"),
                                                 ("--seeds", "x", "'x' is not an integer")])
def test_seeds_and_batch_sizes_out_of_range_are_refused_before_anything_runs(capsys, flag, value, message):
    from gwdet_lab.study.cli import argument_parser

    with pytest.raises(SystemExit):
        argument_parser().parse_args(["--study", "paper", flag, value])
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("damage", [b'{"shapes_test": {"bbox": {"AP": 1', b"\x00\xff\xfe", b"[1, 2]"])
def test_a_damaged_results_json_does_not_count_as_trained_and_is_named(tmp_path, damage):
    folder = RunFolder(tmp_path)
    (tmp_path / "results.json").write_text('{"shapes_test": {"bbox": {"AP": 1.0}}}')
    assert folder.is_trained()
    (tmp_path / "results.json").write_bytes(damage)
    assert not folder.is_trained()  # the cell resumes from its last checkpoint and is evaluated again
    with pytest.raises(DamagedFile, match=r"results.json is damaged .*Remove it and run the same command again"):
        folder.results()


def test_a_results_json_changed_after_it_was_written_does_not_count_as_trained(tmp_path):
    from gwdet.engine.run import write_results_to

    folder = RunFolder(tmp_path)
    write_results_to(str(tmp_path), {"bbox": {"AP": 12.5, "AP50": 30.0}}, ["shapes_test"])
    assert folder.is_trained() and folder.results()["shapes_test"]["bbox"]["AP"] == 12.5
    # still a json object, so only the SHA-256 recorded in results.json.sha256 tells
    path = tmp_path / "results.json"
    path.write_text(path.read_text().replace("12.5", "42.5"))
    assert not folder.is_trained()
    with pytest.raises(DamagedFile, match=r"results.json is damaged \(its SHA-256 differs from the one recorded in "
                                          r"results.json.sha256 when it was written\)\. Remove it and run the same"):
        folder.results()
    # the study's own records carry theirs too
    folder.write_json("study_timing.json", {"train_seconds": 3.0})
    (tmp_path / "study_timing.json").write_text('{"train_seconds": 1.0}')
    with pytest.raises(DamagedFile, match=r"study_timing.json is damaged \(its SHA-256 differs"):
        folder.read_json("study_timing.json")


def test_metrics_readers_skip_damaged_lines(tmp_path):
    (tmp_path / "metrics.json").write_bytes(b'{"iteration": 19, "total_loss": 2.0}\n[1, 2]\n7\n\xff\xfe\n'
                                            b'{"total_loss": 9.0}\n{"iteration": 39, "total_loss": 1.5}\n{"iter')
    assert loss_curve(RunFolder(tmp_path).metrics()) == [(19, 2.0), (39, 1.5)]


def test_a_cell_stopped_from_outside_or_by_a_full_disk_is_said_to_resume():
    # "FAILED (exit status -9)" and unrelated log lines: nothing said the checkpoints were kept
    from gwdet_lab.study.scheduler import failure_reason

    assert failure_reason(-9) == ("killed by SIGKILL; its checkpoints are kept, and running the study's command again "
                                  "resumes it")
    assert failure_reason(143).startswith("stopped by SIGTERM after saving a checkpoint; its checkpoints are kept")
    assert failure_reason(1) == "exit status 1"
    # a full disk: the worker's raw WriteError, and no word that the same command resumes the cell
    full = ["gwdet.utils.atomic.WriteError: [Errno 28] cannot write runs/gw-s0/model_0000024.pth: No space left on "
            "device"]
    assert failure_reason(1, full) == ("exit status 1: its disk is full (No space left on device); its checkpoints "
                                       "are kept, and running the study's command again resumes it once there is "
                                       "space again")
    assert failure_reason(worker.EXIT_MISMATCH) == "its config differs from the recorded one"


@pytest.mark.parametrize("argv, merged", [
    (["--configs", "gw=a.yaml", "--configs", "gn=b.yaml"], "--configs gw=a.yaml gn=b.yaml"),
    (["--seeds", "0", "--seeds", "1"], "--seeds 0 1"),
    (["--opts", "SOLVER.MAX_ITER", "2", "--opts", "SEED", "3"], "--opts SOLVER.MAX_ITER 2 SEED 3"),
])
def test_a_list_flag_given_twice_is_refused_with_the_merged_list(capsys, argv, merged):
    # argparse kept the last --configs / --seeds / --opts / --only without a word (a tiny --opts dropped:
    # the cell would have trained at full size)
    with pytest.raises(SystemExit):
        study_main(argv)
    assert f"is given more than once; a second one would replace the first. Give it once, with all the values: " \
           f"{merged}." in capsys.readouterr().err


@pytest.mark.parametrize("argv, key, flag", [
    (["--opts", "SEED", "5"], "SEED", "--opts"),
    (["--opts", "OUTPUT_DIR", "odx"], "OUTPUT_DIR", "--opts"),
    (["--extra", "gws=configs/Study/gw.yaml", "SEED", "7"], "SEED", "--extra"),
])
def test_an_override_the_study_sets_itself_is_refused(capsys, argv, key, flag):
    # the study's own value won without a word, while the report's notes listed the override
    with pytest.raises(SystemExit):
        study_main(["--configs", "gw=configs/Study/gw.yaml", *argv])
    assert f"{flag} gives {key}, which the study sets in every cell itself" in capsys.readouterr().err



@pytest.mark.parametrize("batch_sizes", [[], ["--batch-sizes", "1", "2", "4", "8"]])
def test_a_batch_sweeps_reference_lr_and_batch_are_scaled_with_default_or_given_batch_sizes(capsys, tmp_path,
                                                                                            batch_sizes):
    # with --batch-sizes typed out, --opts SOLVER.BASE_LR / IMS_PER_BATCH was refused as "would be ignored",
    # while the same cells from the default batch sizes took it as the reference that the study scales
    assert study_main(["--study", "batch-sweep", *batch_sizes, "--seeds", "0", "--out", str(tmp_path / "o"), "--list",
                       "--opts", "SOLVER.BASE_LR", "0.5", "SOLVER.IMS_PER_BATCH", "4"], repo_root=REPO) == 0
    listing = capsys.readouterr().out
    assert "SOLVER.IMS_PER_BATCH 1 SOLVER.BASE_LR 0.125 " in listing
    assert "SOLVER.IMS_PER_BATCH 8 SOLVER.BASE_LR 1.0 " in listing

@pytest.mark.parametrize("item", ["gw=", "=configs/Study/gw.yaml"])
def test_a_config_item_without_a_name_or_a_file_is_refused_naming_it(capsys, item):
    # "gw=" answered "Config file '<the current folder>' is a folder"
    with pytest.raises(SystemExit):
        study_main(["--configs", item])
    assert f"{item!r}: give NAME=CONFIG, a name and a config file" in capsys.readouterr().err


# ---- what a study's cells are called, and what its report pools -----------------------------------


def study_refusal(capsys, tmp_path, *arguments: str) -> str:
    """compare_norms.py's one-line refusal (exit status 2) when it plans ``arguments`` (--list)."""
    with pytest.raises(SystemExit) as stopped:
        study_main(["--out", str(tmp_path / "out"), "--list", *arguments], repo_root=REPO)
    assert stopped.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1].removeprefix("compare_norms.py: error: ")


# --example-weights for a study of GN cells only: accepted, while the worker sweeps weights for batch norms only
def test_example_weights_for_a_study_without_batch_norms_are_refused(capsys, tmp_path):
    assert study_refusal(capsys, tmp_path, "--configs", f"mine={STUDY / 'gn.yaml'}", "--seeds", "0",
                         "--example-weights", "0.5", "--opts", *TINY) == (
        "--example-weights 0.5: example weighing applies to batch norms (BN, SyncBN), and no cell's model has one (its "
        "norms: GN), so the weights would be swept nowhere. Leave --example-weights out, or add a configuration with "
        "batch norms.")
    assert study_main(["--out", str(tmp_path / "out"), "--list", "--configs", f"mine={STUDY / 'gn.yaml'}",
                       f"b={STUDY / 'bn.yaml'}", "--seeds", "0", "--example-weights", "0.5", "--opts", *TINY],
                      repo_root=REPO) == 0


# --example-weights 0.5 0.5 was accepted and training began, while --seeds 0 0 was refused
def test_an_example_weight_given_twice_is_refused_as_a_repeated_seed_is(capsys, tmp_path):
    with pytest.raises(SystemExit) as stopped:
        study_main(["--out", str(tmp_path / "out"), "--list", "--study", "paper", "--seeds", "0",
                    "--example-weights", "0.5", "0", ".50", "--opts", *TINY], repo_root=REPO)
    assert stopped.value.code == 2
    assert capsys.readouterr().err.splitlines()[0] == (
        "compare_norms.py: error: --example-weights gives 0.5 more than once: each weight is one evaluation of every batch-norm cell on val, "
        "among which the best is chosen, so a repeated one would run the same evaluation twice. Give each weight "
        "once, e.g. --example-weights 0.5 0.")
    assert not (tmp_path / "out").exists()
    assert study_main(["--out", str(tmp_path / "out"), "--list", "--study", "paper", "--seeds", "0",
                       "--example-weights", "0.5", "0", "--opts", *TINY], repo_root=REPO) == 0


def test_cells_named_as_another_configuration_or_made_alike_by_overrides_are_refused(capsys, tmp_path):
    # the GN config reported as "GW" beside the paper's GW number; --opts setting every cell's norms to GN,
    # and the report testing "GN > BN" between identical models
    assert study_refusal(capsys, tmp_path, "--configs", f"gw={STUDY / 'gn.yaml'}", f"gn={STUDY / 'gw.yaml'}",
                         "--seeds", "0", "--opts", *TINY).startswith(
        f"Cell gw-s0 is named 'gw', one of gwdet's configurations (GW, whose report row carries the paper's numbers), "
        f"but its config {STUDY / 'gn.yaml'} places other norms: MODEL.FPN.NORM: 'GN' where gw's own config has 'GW'; ")
    norms = ["MODEL.RESNETS.NORM", "GN", "MODEL.FPN.NORM", "GN", "MODEL.ROI_BOX_HEAD.NORM", "GN",
             "MODEL.RESNETS.GW_POSITIONS", ""]
    assert study_refusal(capsys, tmp_path, "--study", "paper", "--seeds", "0", "--opts", *TINY, *norms).startswith(
        "Cells bn-b2-s0 (BN) and bn_gw_s1b2-b2-s0 (BN+GW S1-B2) have the same config (--opts ")
    # a name of one's own for that config, the same norms with another rate: planned
    assert study_main(["--out", str(tmp_path / "out"), "--list", "--configs", f"mine={STUDY / 'gn.yaml'}",
                       "--extra", f"gn={STUDY / 'gn.yaml'}", "SOLVER.BASE_LR", "0.005", "--seeds", "0", "--opts",
                       *TINY], repo_root=REPO) == 0


# before: the check compared with gwdet's config under the same --opts, so --opts giving "bn" GN everywhere
# trained GN reported as BN beside the paper's 25.10, and --opts emptying GW_POSITIONS passed as BN + GW
def test_a_configuration_made_another_by_common_overrides_is_refused(capsys, tmp_path):
    demo = REPO / "configs" / "Demo"
    gn_everywhere = ["MODEL.RESNETS.NORM", "GN", "MODEL.FPN.NORM", "GN", "MODEL.ROI_BOX_HEAD.NORM", "GN"]
    assert study_refusal(capsys, tmp_path, "--configs", f"bn={demo / 'scratch_faster_rcnn_bn_shapes.yaml'}", "--seeds",
                         "0", "--opts", "SOLVER.MAX_ITER", "2", *gn_everywhere) == (
        f"Cell bn-s0 is named 'bn', one of gwdet's configurations (BN, whose report row carries the paper's numbers), "
        f"but its config {demo / 'scratch_faster_rcnn_bn_shapes.yaml'}, with the overrides --opts MODEL.RESNETS.NORM "
        "GN MODEL.FPN.NORM GN MODEL.ROI_BOX_HEAD.NORM GN, places other norms: MODEL.FPN.NORM: 'GN' where bn's own "
        "config has 'BN'; MODEL.RESNETS.NORM: 'GN' where bn's own config has 'BN'; MODEL.ROI_BOX_HEAD.NORM: 'GN' where "
        "bn's own config has 'BN'. Name it by what it is (--configs NAME=CONFIG with a name of your own), or give it "
        "the config of BN (leave MODEL.FPN.NORM, MODEL.RESNETS.NORM, MODEL.ROI_BOX_HEAD.NORM out of the overrides); "
        "nothing was trained.")
    assert study_refusal(capsys, tmp_path, "--configs",
                         f"bn_gw_s1b2={demo / 'scratch_faster_rcnn_bn_gw_s1b2_shapes.yaml'}", "--opts",
                         "MODEL.RESNETS.GW_POSITIONS", "").startswith(
        "Cell bn_gw_s1b2 is named 'bn_gw_s1b2', one of gwdet's configurations (BN+GW S1-B2, whose report row carries "
        f"the paper's numbers), but its config {demo / 'scratch_faster_rcnn_bn_gw_s1b2_shapes.yaml'}, with the "
        "overrides --opts MODEL.RESNETS.GW_POSITIONS '', places other norms: MODEL.RESNETS.GW_POSITIONS: '' where "
        "bn_gw_s1b2's own config has 'S1-B2'.")
    # a cell's own override is named with its flag; overrides that keep every configuration's norms are planned
    assert "with the overrides --extra MODEL.FPN.NORM GN, places other norms" in study_refusal(
        capsys, tmp_path, "--extra", f"gw={STUDY / 'gw.yaml'}", "MODEL.FPN.NORM", "GN", "--seeds", "0")
    assert study_main(["--out", str(tmp_path / "out"), "--list", "--study", "paper", "--seeds", "0", "--opts", *TINY],
                      repo_root=REPO) == 0


def test_a_listing_generates_no_shapes_dataset(tmp_path, monkeypatch):
    # --list of the paper's study generated the 6000 images of its shapes dataset (a minute, 206 MB) to list cells
    monkeypatch.setenv("GWDET_CACHE", str(tmp_path / "cache"))
    assert study_main(["--out", str(tmp_path / "out"), "--list", "--study", "paper", "--seeds", "0", "--only",
                       "gw-b2-s0"], repo_root=REPO) == 0
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_study_flags_that_would_pair_random_seeds_or_misname_cells_are_refused(capsys, tmp_path):
    config = tmp_path / "gw_random.yaml"
    config.write_text(f'_BASE_: "{STUDY / "gw.yaml"}"\nSEED: -1\n')
    # cells of a config of SEED -1 each drew a random seed, paired in the report as seed "-1"
    assert study_refusal(capsys, tmp_path, "--configs", f"mine={config}", "--opts", *TINY) == (
        f"Run 'mine' ({config}) has SEED -1, so each of its runs would draw a random seed that the report cannot pair "
        "with the other configurations' or repeat. Give the seeds: --seeds 0 1 2.")
    # names that differ in case only: two rows labelled alike, one folder on a disk that ignores case
    assert study_refusal(capsys, tmp_path, "--configs", f"mine={STUDY / 'gw.yaml'}", f"Mine={STUDY / 'gn.yaml'}",
                         "--seeds", "0") == ("Two runs are named 'Mine' ('mine' and 'Mine' differ in case only: one "
                                             "folder on a disk that ignores case, one label in the report); name them "
                                             "apart with NAME=CONFIG.")
    # --dataset with one's own configs was ignored without a word
    assert study_refusal(capsys, tmp_path, "--configs", f"mine={STUDY / 'gw.yaml'}", "--dataset", "coco").startswith(
        "--dataset coco picks the configs of a named study (--study); your own --configs and --extra train on the "
        "datasets their configs name.")
    # an unset shell variable: the cells were planned into runs/ of the current folder
    with pytest.raises(SystemExit):
        study_main(["--out", "", "--list", "--study", "paper"], repo_root=REPO)
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "compare_norms.py: error: --out is empty (a shell variable that is not set, as in --out \"$OUT\"?): give the "
        "folder to write into.")


def test_seeds_of_one_configuration_with_other_configs_are_not_pooled(tmp_path):
    # a 2-iteration check study's cell exported among a long study's records was averaged with them
    from gwdet_lab.study.record import PlannedCell, check_seeds_of_one_configuration_alike

    (seed0,) = cells({"gw-b2-s0"})
    seed1 = Cell("gw-b2-s1", "gw", seed0.config_file, ("SEED", "1"), 1, 2)
    alike = [PlannedCell(cell, cell.opts, build_config(cell.config_file, [*TINY, *cell.opts]), RunFolder(tmp_path / cell.name))
             for cell in (seed0, seed1)]
    check_seeds_of_one_configuration_alike(alike)
    shorter = PlannedCell(seed1, seed1.opts, build_config(seed1.config_file, [*TINY, *seed1.opts, "SOLVER.MAX_ITER", "3"]),
                          RunFolder(tmp_path / seed1.name))
    with pytest.raises(ValueError, match=r"^Cells gw-b2-s0 and gw-b2-s1 are seeds of one configuration \(GW at 2 images\) "
                                         r"in the report, but their configs differ in more than the seed: "
                                         r"SOLVER.MAX_ITER \(2 in gw-b2-s0, 3 in gw-b2-s1\)\. Their mean"):
        check_seeds_of_one_configuration_alike([alike[0], shorter])


def test_a_cell_resumed_with_another_thread_count_or_near_its_end_is_noted(tmp_path):
    from gwdet.utils.atomic import write_text_with_checksum
    from gwdet_lab.study.record import PlannedCell, resumed_loss_note, threads_note

    (cell,) = cells({"gw-b2-s0"})
    folder = RunFolder(tmp_path / cell.name)
    folder.path.mkdir()
    planned = PlannedCell(cell, cell.opts, build_config(cell.config_file, TINY), folder)
    segments = [{"from_iteration": 0, "threads": 1}, {"from_iteration": 1, "threads": 2}]  # of 2 iterations
    write_text_with_checksum(str(folder.file("results.json")), json.dumps({"environment": {"segments": segments}}))
    assert threads_note([planned]) == (
        "Cells resumed with another thread count than they started with: gw-b2-s0 (1, then 2). A CPU sums in another "
        "order with other threads, so their weights differ from those of a run with one count.")
    # its final loss, detectron2's median over the process's last 20 iterations, covers the last one only
    assert resumed_loss_note([planned]) == (
        "Final losses are detectron2's medians over the last 20 iterations a process trained; for cells resumed near "
        "their end they cover only the iterations since the resume: gw-b2-s0 (its last 1).")
    write_text_with_checksum(str(folder.file("results.json")), json.dumps({"environment": {"threads": 1}}))
    assert threads_note([planned]) is None and resumed_loss_note([planned]) is None


def test_a_cell_resumed_with_other_processes_code_machine_or_plans_is_noted(tmp_path):
    # seeds resumed with --num-gpus 2, planned by another commit, trained with another torch and CPU, or under
    # GWDET_GW_PLAN=accelerator were pooled without a note
    from gwdet.utils.atomic import write_text_with_checksum
    from gwdet_lab.study.record import (PlannedCell, code_versions_note, machine_note, plans_note, processes_note,
                                        write_record)

    specs = paper_specs("shapes", REPO)
    two_seeds = study_cells("paper", specs, [build_config(s.config_file, TINY) for s in specs], seeds=(0, 1))
    planned = []
    for cell in [cell for cell in two_seeds if cell.name in ("gw-b2-s0", "gw-b2-s1")]:
        folder = RunFolder(tmp_path / cell.name)
        other = cell.name.endswith("s1")
        machine = {"versions": {"torch": "2.5.1" if other else "2.6.0"}, "cpu": {"torch_capability": "AVX2"}}
        segments = [{"from_iteration": 0, "processes": 1}, {"from_iteration": 1, "processes": 2 if other else 1}]
        forced = "accelerator" if other else None
        plans = {"cpu": forced or "cpu", "cuda": "triton", "forced": forced}
        folder.path.mkdir()
        write_text_with_checksum(str(folder.file("results.json")), json.dumps(
            {"environment": {**machine, "segments": segments, "execution_plans": plans}}))
        item = PlannedCell(cell, cell.opts, build_config(cell.config_file, TINY), folder)
        write_record(item, TINY)
        record = folder.read_json("study_cell.json")
        record["code"] = {"git_commit": ("b" if other else "a") * 40}
        folder.write_json("study_cell.json", record)
        planned.append(item)
    planned.sort(key=lambda item: item.cell.name)
    assert processes_note(planned) == (
        "Cells resumed with another process count (--num-gpus) than they started with: gw-b2-s1 (1, then 2). "
        "Gradients are summed over other processes in another order, so their weights differ from those of a run "
        "with one count.")
    assert code_versions_note(planned) == (
        f"Cells run by other versions of the code than others: gw-b2-s0 ({'a' * 12}); gw-b2-s1 ({'b' * 12}). The means "
        "and comparisons over them mix the versions; a change of the code between them may change their numbers.")
    assert machine_note(planned) == (
        "Cells trained with other torch versions or CPU capabilities than others: gw-b2-s0 (torch 2.6.0, CPU "
        "capability AVX2); gw-b2-s1 (torch 2.5.1, CPU capability AVX2). Other kernels sum in another order, so their "
        "weights differ, and means over them mix the machines.")
    assert processes_note(planned[:1]) is None and code_versions_note(planned[:1]) is None
    assert machine_note(planned[:1]) is None
    assert plans_note(planned) == (
        "Cells trained under other GW execution plans than others: gw-b2-s0 (cpu plan 'cpu', cuda plan 'triton'); "
        "gw-b2-s1 (cpu plan 'accelerator', cuda plan 'triton', forced by GWDET_GW_PLAN=accelerator). Another plan "
        "computes GW and BW with other operations, so their weights differ, and means over them mix the plans.")
    assert plans_note(planned[:1]) is None


def test_names_that_are_no_folder_name_are_refused_by_their_rule(capsys, tmp_path):
    # "é is a letter", yet refused as if not; a 300-character name ended in a raw OSError (File name too long)
    assert "ASCII letter (a-z, A-Z) or digit and hold only ASCII letters" in study_refusal(
        capsys, tmp_path, "--configs", f"gé={STUDY / 'gw.yaml'}", "--seeds", "0", "--opts", *TINY)
    assert "is 303 characters long: it names a folder" in study_refusal(
        capsys, tmp_path, "--configs", f"{'g' * 300}={STUDY / 'gw.yaml'}", "--seeds", "0", "--opts", *TINY)
    assert not (tmp_path / "out").exists()


def test_another_studys_report_and_an_empty_out_are_found_before_anything_is_written(capsys, tmp_path):
    # the cell trained first (hours in a real study), then "holds the report of other cells"; --report-only of a
    # mistyped --out exited 0 and recorded the study's cells there
    (tmp_path / "out" / "custom").mkdir(parents=True)
    (tmp_path / "out" / "custom" / "cells.csv").write_text("cell,config\ngw-s0,GW\n")
    with pytest.raises(SystemExit) as stopped:
        study_main(["--out", str(tmp_path / "out"), "--configs", f"gn={STUDY / 'gn.yaml'}", "--seeds", "0",
                    "--opts", *TINY], repo_root=REPO)
    assert stopped.value.code == 2
    assert "custom holds the report of other cells (gw-s0): another study's" in capsys.readouterr().err
    assert not (tmp_path / "out" / "runs").exists()
    assert study_main(["--out", str(tmp_path / "typo"), "--configs", f"gn={STUDY / 'gn.yaml'}", "--seeds", "0",
                       "--opts", *TINY, "--report-only"], repo_root=REPO) == 2  # a refusal: exit status 2, as every tool's
    assert "--report-only: no cell of this study has finished in" in capsys.readouterr().err
    assert not (tmp_path / "typo" / "runs" / "gn-s0").exists()


def test_a_file_where_a_cells_folder_goes_is_refused_naming_it(capsys, tmp_path):
    # a raw FileExistsError traceback from record.write_record
    (tmp_path / "out" / "runs").mkdir(parents=True)
    (tmp_path / "out" / "runs" / "gw-s0").write_text("the user's")
    with pytest.raises(SystemExit):
        study_main(["--out", str(tmp_path / "out"), "--list", "--configs", f"gw={STUDY / 'gw.yaml'}", "--seeds", "0",
                    "--opts", *TINY], repo_root=REPO)
    refusal = next(line for line in capsys.readouterr().err.splitlines() if line.startswith("compare_norms.py: error: "))
    assert refusal.removeprefix("compare_norms.py: error: ") == (
        f"{tmp_path / 'out' / 'runs' / 'gw-s0'}: a file (or link) is where the study keeps the cell's folder, which "
        f"the study would have to replace; nothing was written. Move it out of {tmp_path / 'out' / 'runs'}, or give the "
        "study another --out.")
    assert (tmp_path / "out" / "runs" / "gw-s0").read_text() == "the user's"


def test_threads_0_shares_the_usable_cpus_whatever_omp_num_threads_says(monkeypatch):
    # --threads 0 gave way to OMP_NUM_THREADS ("1 per process (from OMP_NUM_THREADS)"), not the CPUs --help promised
    from gwdet.engine.threads import choose_threads
    from gwdet_lab.study.cli import cell_threads, threads_line

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    usable = choose_threads(None, processes=1, environ={}).threads
    log = threads_line(cell_threads(0, jobs=1))  # what the study prints before it trains its cells
    assert f"CPU threads: {usable} per process (--threads 0: " in log
    assert "OMP_NUM_THREADS=1 of the environment set aside, as --threads sets each cell's" in log
    assert "from OMP_NUM_THREADS" not in log and "Override with --threads N or --threads auto-load." in log


def test_a_cells_folder_holding_the_users_run_files_is_refused_before_the_study_writes(capsys, tmp_path):
    # the study recorded the cell, then its train_net failed with a 27-line traceback that named OUTPUT_DIR (which a
    # study refuses in --opts) and said "nothing was changed" beside the files the study had just written
    mine = tmp_path / "out" / "runs" / "gn-s0"
    mine.mkdir(parents=True)
    (mine / "results.md").write_text("mine")
    (mine / "log.txt").write_text("mine")
    with pytest.raises(SystemExit):
        study_main(["--out", str(tmp_path / "out"), "--configs", f"gn={STUDY / 'gn.yaml'}", "--seeds", "0",
                    "--opts", *TINY], repo_root=REPO)
    refusal = next(line for line in capsys.readouterr().err.splitlines() if line.startswith("compare_norms.py: error: "))
    assert refusal.removeprefix("compare_norms.py: error: ") == (
        f"{mine} holds results.md, named as a training run's files, but nothing there shows that a run of gwdet wrote "
        "them (no recorded config.yaml or results.json, no checkpoint), so the cell cannot train there; nothing was "
        "written. Move them out of the cell's folder, or give the study another --out.")
    assert sorted(p.name for p in mine.iterdir()) == ["log.txt", "results.md"]


# --list --report-only --report-to DIR listed the cells with exit status 0 and wrote no report, without a word
def test_list_with_report_flags_is_refused_naming_them(capsys, tmp_path):
    def refusal(*arguments: str) -> str:
        with pytest.raises(SystemExit) as stopped:
            study_main(["--out", str(tmp_path / "out"), "--list", "--study", "paper", *arguments], repo_root=REPO)
        assert stopped.value.code == 2
        return capsys.readouterr().err.strip().splitlines()[0].removeprefix("compare_norms.py: error: ")

    report = tmp_path / "report"
    assert refusal("--report-only", "--report-to", str(report)) == (
        f"--list only lists the cells and writes no report, so --report-only, --report-to {report} would be ignored: "
        "run --list alone to see the cells, and the same command without --list to write the report; nothing was "
        "written.")
    assert not report.exists() and not (tmp_path / "out").exists()
    exported = refusal("--records", str(tmp_path / "rec"), "--export-records", str(tmp_path / "exp"))
    assert exported.startswith(f"--list only lists the cells and writes no report, so --export-records {tmp_path / 'exp'} ")


# --list --jobs 3 --threads 2 (or --num-gpus, --launcher slurm --partition P, ...) listed the cells with exit status 0,
# the flags ignored without a word
def test_list_with_training_flags_is_refused_naming_them(capsys, tmp_path):
    def refusal(*arguments: str) -> str:
        with pytest.raises(SystemExit) as stopped:
            study_main(["--out", str(tmp_path / "out"), "--list", "--study", "paper", "--seeds", "0", *arguments],
                       repo_root=REPO)
        assert stopped.value.code == 2
        return capsys.readouterr().err.strip().splitlines()[0].removeprefix("compare_norms.py: error: ")

    assert refusal("--jobs", "3", "--threads", "2") == (
        "--list only lists the cells and trains nothing (here or on a cluster), so --jobs 3, --threads 2 would be "
        "ignored: run --list alone to see the cells, and the same command without --list to train the cells; nothing "
        "was written.")
    assert refusal("--launcher", "slurm", "--partition", "gpu", "--num-gpus", "8", "--wait").startswith(
        "--list only lists the cells and trains nothing (here or on a cluster), so --num-gpus 8, --launcher slurm, "
        "--partition gpu, --wait would be ignored: ")
    assert refusal("--report-only", "--threads", "auto-load") == (
        "--list only lists the cells and trains nothing (here or on a cluster) and writes no report, so --report-only, "
        "--threads auto-load would be ignored: run --list alone to see the cells, and the same command without --list "
        "to train the cells or write the report; nothing was written.")
    assert not (tmp_path / "out").exists()
    # a flag at its default value changes nothing; --on-mismatch picks the folder each cell is listed with
    assert study_main(["--out", str(tmp_path / "out"), "--list", "--study", "paper", "--seeds", "0", "--jobs", "1",
                       "--threads", "1", "--on-mismatch", "new-folder"], repo_root=REPO) == 0
    assert "gw-b2-s0" in capsys.readouterr().out


# --report-only --jobs 3 (or --threads, the launcher's flags) wrote the report, the flags ignored without a word
def test_report_only_with_training_flags_is_refused_naming_them(capsys, tmp_path):
    with pytest.raises(SystemExit) as stopped:
        study_main(["--out", str(tmp_path / "out"), "--report-only", "--study", "paper", "--seeds", "0", "--jobs", "3",
                    "--launcher", "slurm"], repo_root=REPO)
    assert stopped.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[0] == (
        "compare_norms.py: error: --report-only writes the report of the cells' results and trains nothing (here or "
        "on a cluster), so --jobs 3, --launcher slurm would be ignored: drop them, or run the same command without "
        "--report-only to train the cells; nothing was written.")
    assert not (tmp_path / "out").exists()


# before: a config path holding '=' was split there into NAME and CONFIG: "Config file '.../b.yaml' does not exist"
def test_a_config_path_holding_an_equals_sign_is_read_as_a_path(tmp_path, monkeypatch):
    import re

    from gwdet.errors import GwdetValueError
    from gwdet_lab.study.cells import parse_config_item

    folder = tmp_path / "lr=0.1"
    folder.mkdir()
    (folder / "gw.yaml").write_text("_BASE_: x.yaml\n")
    assert parse_config_item(str(folder / "gw.yaml")) == RunSpec("gw", str(folder / "gw.yaml"))
    assert parse_config_item(f"mine={folder / 'gw.yaml'}") == RunSpec("mine", str(folder / "gw.yaml"))
    (tmp_path / "a=b.yaml").write_text("_BASE_: x.yaml\n")
    monkeypatch.chdir(tmp_path)
    for item in (str(tmp_path / "a=b.yaml"), "a=b.yaml"):
        with pytest.raises(GwdetValueError, match=(
                rf"^'{re.escape(item)}' is read as a config file, and its file name gives the run name 'a=b', which a run cannot "
                r"take \(it names a folder: ASCII letters, digits and _ \. \+ -\)\. Name the run yourself with "
                rf"NAME=CONFIG, e\.g\. mine={re.escape(item)}\.$")):
            parse_config_item(item)
    (tmp_path / "b.yaml").write_text("_BASE_: x.yaml\n")
    assert parse_config_item("a=b.yaml") == RunSpec("a", "b.yaml")  # NAME=CONFIG where CONFIG is a file


# "a/b=configs/Study/gw.yaml" was read as one config path: "Config file '.../a/b=configs/Study/gw.yaml' does not exist"
@pytest.mark.parametrize("flag", ["--configs", "--extra"])
def test_a_config_name_holding_a_slash_is_named_with_the_name_rule(capsys, monkeypatch, flag):
    monkeypatch.chdir(REPO)
    with pytest.raises(SystemExit):
        study_main([flag, "a/b=configs/Study/gw.yaml", "--list"])
    assert (f"error: {flag} 'a/b=configs/Study/gw.yaml': the run name 'a/b' before '=' holds '/', and a run's name "
            "names its folder: it starts with an ASCII letter or digit and holds only ASCII letters, digits and "
            "_ . + -. Give NAME=CONFIG with such a name, e.g. a-b=configs/Study/gw.yaml; nothing was run."
            ) in capsys.readouterr().err


# --gpus-per-node 2 with the local launcher was told to match --num-gpus; doing so gave a second refusal, that the
# local launcher does not use --gpus-per-node
@pytest.mark.parametrize("num_gpus", [[], ["--num-gpus", "2"]])
def test_gpus_per_node_with_the_local_launcher_is_named_as_unused_first(capsys, num_gpus):
    assert study_main(["--study", "paper", "--gpus-per-node", "2", "--only", "gn-b2-s0", *num_gpus]) == 2
    printed = capsys.readouterr().err
    assert ("error: --gpus-per-node: --launcher local does not use it (a run here asks SLURM for nothing). Add "
            "--launcher slurm to submit the run as a SLURM job, or leave it out.") in printed
    assert "give the same number to both" not in printed


# before: a batch size the schedule did not divide was refused one setting at a time (SOLVER.MAX_ITER, then
# SOLVER.WARMUP_ITERS, ...), each saying "pick a schedule divisible by both" without the flag that sets it
def test_a_batch_size_the_schedule_does_not_fit_names_every_count_with_the_values_and_flag_that_fit(tmp_path, capsys):
    cfg = build_config(str(STUDY / "gn.yaml"), ["SOLVER.MAX_ITER", "4000", "SOLVER.STEPS", "(3200, 3700)",
                                                "SOLVER.WARMUP_ITERS", "500", "SOLVER.CHECKPOINT_PERIOD", "600"])
    expected = (
        "batch size 3: SOLVER.MAX_ITER = 4000 (fits: 3999), SOLVER.WARMUP_ITERS = 500 (fits: 501), SOLVER.STEPS = "
        "(3200, 3700) (fits: (3201, 3699)): iteration counts of the config's 2 images per batch that are no whole "
        "number of iterations of 3 images (each must be a multiple of 3 iterations of 2 images). Give counts that fit "
        "with --opts (in iterations of 2 images; applied to every cell), e.g. --opts SOLVER.MAX_ITER 3999 "
        "SOLVER.WARMUP_ITERS 501 SOLVER.STEPS '(3201, 3699)', or batch sizes this schedule fits as it is "
        "(--batch-sizes, up to 32): 1 2 4 5 8 10 20 25.")
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
        batch_scaling_opts(cfg, 3)
    fixed = build_config(str(STUDY / "gn.yaml"), ["SOLVER.MAX_ITER", "3999", "SOLVER.STEPS", "(3201, 3699)",
                                                  "SOLVER.WARMUP_ITERS", "501", "SOLVER.CHECKPOINT_PERIOD", "600"])
    scaled = dict(zip(*[iter(batch_scaling_opts(fixed, 3))] * 2, strict=True))
    assert (scaled["SOLVER.MAX_ITER"], scaled["SOLVER.STEPS"]) == ("2666", "(2134, 2466)")
    with pytest.raises(SystemExit):
        study_main(["--out", str(tmp_path / "st"), "--study", "batch-sweep", "--list", "--batch-sizes", "3"])
    err = capsys.readouterr().err
    assert "SOLVER.MAX_ITER = 4000 (fits: 3999), SOLVER.WARMUP_ITERS = 500 (fits: 501), SOLVER.CHECKPOINT_PERIOD" in err
    assert "e.g. --opts SOLVER.MAX_ITER 3999" in err
