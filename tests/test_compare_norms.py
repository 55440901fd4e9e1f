"""tools/compare_norms.py end to end on two tiny runs, its resume rules, and its pieces."""
import csv
import math
import subprocess
import sys
from pathlib import Path

import pytest

from gwdet.study.cli import argument_parser, resolve_specs
from gwdet.study.run_folder import RunFolder, final_loss, loss_curve, seconds_per_iteration
from gwdet.study.runner import StudyTrainer, format_duration, plan_runs
from gwdet.study.runs import RunSpec, check_unique_names, default_runs, parse_config_item, parse_extra
from gwdet.study.weighing import choose_weight

from conftest import REPO, TINY_OPTS

DEMO = REPO / "configs" / "Demo"
BN_CONFIG = DEMO / "scratch_faster_rcnn_bn_shapes.yaml"
GN_CONFIG = DEMO / "scratch_faster_rcnn_gn_shapes.yaml"
OUTPUT_PNGS = ("loss_curves.png", "ap_bars.png")


def compare_norms(out: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, str(REPO / "tools" / "compare_norms.py"), "--out", str(out),
               "--configs", f"bn={BN_CONFIG}", f"gn={GN_CONFIG}", "--example-weights", "0", "1",
               "--threads", "1",
               "--opts", *TINY_OPTS]
    completed = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, (completed.stdout + completed.stderr)[-4000:]
    return completed


def test_two_runs_end_to_end_then_resume_skips_them(tmp_path):
    first = compare_norms(tmp_path)
    assert "[1/2] bn: training (2 iterations)" in first.stdout
    assert "bn: example weight 1: box AP" in first.stdout

    table = (tmp_path / "table.md").read_text()
    main_table = table.split("## Inference example weighing")[0]
    rows = [line for line in main_table.splitlines() if line.startswith(("| bn ", "| gn "))]
    assert len(rows) == 2, table
    assert "example weighing (w chosen on val)" in table and "| w=0 | w=1 |" in table
    with open(tmp_path / "table.csv") as f:
        records = list(csv.DictReader(f))
    assert [r["run"] for r in records] == ["bn", "gn"]
    assert records[0]["ew_weight"] in {"0.0", "1.0"} and records[1]["ew_weight"] == ""
    assert float(records[0]["box_AP_ew_w0"]) == pytest.approx(float(records[0]["box_AP"]))
    assert float(records[0]["peak_rss_mb"]) > 100 and float(records[0]["final_loss"]) > 0
    for png in OUTPUT_PNGS:
        assert (tmp_path / png).stat().st_size > 1000

    produced = [tmp_path / run / name for run in ("bn", "gn") for name in ("model_final.pth", "results.json")]
    produced.append(tmp_path / "bn" / "example_weighing.json")
    mtimes = [p.stat().st_mtime_ns for p in produced]
    second = compare_norms(tmp_path)
    assert "[1/2] bn: skipped, already finished" in second.stdout
    assert "[2/2] gn: skipped, already finished" in second.stdout
    assert "training" not in second.stdout and "example weight" not in second.stdout
    assert [p.stat().st_mtime_ns for p in produced] == mtimes
    assert (tmp_path / "table.md").read_text() == table


def test_interrupted_run_resumes_from_its_checkpoint(tmp_path):
    (run,) = plan_runs([RunSpec("bn", str(BN_CONFIG))], tmp_path, TINY_OPTS)
    trainer = StudyTrainer([run], REPO / "tools" / "train_net.py")
    assert "--resume" not in trainer.command(run, resume=run.folder.has_checkpoint())
    run.folder.path.mkdir()
    (run.folder.path / "last_checkpoint").write_text("model_0000099.pth")
    assert run.folder.has_checkpoint() and not run.folder.is_finished()
    command = trainer.command(run, resume=run.folder.has_checkpoint())
    assert "--resume" in command and command[-2:] == ["OUTPUT_DIR", str(tmp_path / "bn")]


def test_run_overrides_win_over_common_ones(tmp_path):
    spec = parse_extra([f"long={BN_CONFIG}", "SOLVER.MAX_ITER", "7", "MODEL.RESNETS.NORM", "GN"])
    (run,) = plan_runs([spec], tmp_path, ["SOLVER.MAX_ITER", "3", "SOLVER.BASE_LR", "0.5"])
    assert (run.max_iter, run.cfg.SOLVER.BASE_LR, run.cfg.MODEL.RESNETS.NORM) == (7, 0.5, "GN")
    assert run.cfg.OUTPUT_DIR == str(tmp_path / "long")


def test_bad_override_fails_before_training(tmp_path):
    with pytest.raises(ValueError, match="Run 'bn'.*SOLVER.NO_SUCH_KEY"):
        plan_runs([RunSpec("bn", str(BN_CONFIG))], tmp_path, ["SOLVER.NO_SUCH_KEY", "1"])
    with pytest.raises(FileNotFoundError):
        plan_runs([RunSpec("x", str(tmp_path / "missing.yaml"))], tmp_path, [])


def test_default_run_sets_are_the_papers_four_configs():
    for dataset in ("shapes", "coco"):
        specs = default_runs(dataset, REPO)
        assert [s.name for s in specs] == ["bn", "bn_gw_s1b2", "gn", "gw"]
        assert all(Path(s.config_file).is_file() for s in specs)


def test_run_selection_arguments():
    parser = argument_parser()
    args = parser.parse_args(["--configs", "a.yaml", "x=b.yaml", "--extra", "bgn=a.yaml", "K", "V"])
    assert [(s.name, s.config_file, s.opts) for s in resolve_specs(args, REPO)] == [
        ("a", "a.yaml", ()), ("x", "b.yaml", ()), ("bgn", "a.yaml", ("K", "V"))]
    with pytest.raises(ValueError, match="not both"):
        resolve_specs(parser.parse_args(["--dataset", "coco", "--configs", "a.yaml"]), REPO)
    assert resolve_specs(parser.parse_args([]), REPO)[0].config_file == str(BN_CONFIG)


def test_run_spec_validation():
    assert parse_config_item("configs/x/my_run.yaml").name == "my_run"
    with pytest.raises(ValueError, match="NAME=CONFIG"):
        parse_extra(["a.yaml", "K", "V"])
    with pytest.raises(ValueError, match="KEY VALUE"):
        parse_extra(["a=a.yaml", "K"])
    with pytest.raises(ValueError, match="folder"):
        RunSpec("../up", "a.yaml")
    with pytest.raises(ValueError, match="Two runs"):
        check_unique_names([RunSpec("a", "x.yaml"), RunSpec("a", "y.yaml")])


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


def test_choose_weight_prefers_best_ap_then_smaller_weight():
    sweep = {"0": {"bbox": {"AP": 10.0}}, "0.1": {"bbox": {"AP": 12.0}}, "0.5": {"bbox": {"AP": 12.0}},
             "1": {"bbox": {"AP": math.nan}}}
    assert choose_weight(sweep, [0.0, 0.1, 0.5, 1.0]) == (0.1, 12.0)
    assert choose_weight(sweep, [0.0, 1.0]) == (0.0, 10.0)
    assert choose_weight(sweep, [0.25]) is None


def test_format_duration():
    assert [format_duration(s) for s in (7, 65, 3725)] == ["7s", "1m05s", "1h02m05s"]
