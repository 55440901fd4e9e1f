"""End to end through detectron2's real Trainer, COCOEvaluator and tools/train_net.py."""
import json
import subprocess
import sys

import pytest
from PIL import Image

from gwdet.engine.arguments import argument_parser, parse_args
from gwdet.engine.run import flatten_results, main, results_markdown, write_results_to
from gwdet.engine.trainer import Trainer
from gwdet.model_zoo import build_config
from gwdet.data import prepare_datasets

from conftest import DEMO_CONFIG, REPO, TINY_OPTS


def test_tiny_config_trains_two_iterations_and_evaluates(tmp_path):
    cfg = build_config(str(DEMO_CONFIG), TINY_OPTS + ["OUTPUT_DIR", str(tmp_path)])
    prepare_datasets(cfg)
    trainer = Trainer(cfg)
    trainer.resume_or_load(resume=False)
    results = trainer.train()
    assert trainer.iter == cfg.SOLVER.MAX_ITER
    assert set(results) == {"bbox", "segm"}, "COCOEvaluator ran box and mask evaluation"
    assert {"AP", "AP50", "AP75"} <= set(results["bbox"])
    metrics = [json.loads(line) for line in (tmp_path / "metrics.json").read_text().splitlines()]
    assert any("total_loss" in m for m in metrics)
    write_results_to(cfg.OUTPUT_DIR, results, cfg.DATASETS.TEST)
    assert "### shapes_val bbox" in (tmp_path / "results.md").read_text()


def test_argument_parser_accepts_config_and_config_file():
    parser = argument_parser()
    for flag in ("--config", "--config-file"):
        args = parser.parse_args([flag, "x.yaml", "--resume", "SOLVER.MAX_ITER", "3"])
        assert args.config_file == "x.yaml" and args.resume and args.opts == ["SOLVER.MAX_ITER", "3"]


def test_missing_config_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        build_config(str(tmp_path / "nope.yaml"))


def test_results_markdown_has_one_table_per_task():
    text = results_markdown({"bbox": {"AP": 12.5, "AP50": 30.0, "AP-circle": 1.0}, "segm": {"AP": 10.0}})
    assert text == (
        "### bbox\n\n| AP | AP50 |\n| --- | --- |\n| 12.50 | 30.00 |\n\n"
        "### segm\n\n| AP |\n| --- |\n| 10.00 |\n"
    )
    assert "AP-circle" not in text, "per-class columns stay in results.json"


def test_results_with_and_without_the_dataset_level_flatten_alike():
    per_task = {"bbox": {"AP": 12.5, "AP50": float("nan")}}
    assert flatten_results(per_task) == {"": per_task}
    # detectron2 drops the level when it evaluated one dataset: its name comes back from DATASETS.TEST.
    assert flatten_results(per_task, ("shapes_val",)) == {"shapes_val": per_task}
    assert flatten_results({"shapes_val": per_task}, ("shapes_val",)) == {"shapes_val": per_task}
    assert flatten_results({"shapes_val": per_task}) == {"shapes_val": per_task}
    assert results_markdown({"shapes_val": per_task}).splitlines()[:5] == [
        "### shapes_val bbox", "", "| AP | AP50 |", "| --- | --- |", "| 12.50 | nan |",
    ]
    assert results_markdown(per_task).splitlines()[0] == "### bbox"


def test_train_net_script_end_to_end(tmp_path):
    """The command users type: train, evaluate, write AP tables, metrics, events and PNGs."""
    command = [sys.executable, str(REPO / "tools" / "train_net.py"), "--config", str(DEMO_CONFIG),
               *TINY_OPTS[:-2], "TEST.VIS_IMAGES", "2", "SOLVER.MAX_ITER", "1", "OUTPUT_DIR", str(tmp_path)]
    completed = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    log = completed.stdout + completed.stderr
    assert "Evaluation results for bbox" in log and "Evaluation results for segm" in log
    assert (tmp_path / "results.md").is_file() and (tmp_path / "metrics.json").is_file()
    assert list(tmp_path.glob("events.out.tfevents.*"))
    drawings = sorted((tmp_path / "vis").glob("*.png"))
    assert len(drawings) == 2
    with Image.open(drawings[0]) as drawing:  # two 384 px halves (64 px images enlarged), captions above
        assert drawing.width == 768 and drawing.height > 384
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results) == {"shapes_val", "environment"}
    assert set(results["environment"]["datasets"]) == {"shapes_train", "shapes_val"}
    last = (tmp_path / "log.txt").read_text().strip().splitlines()[-1]
    assert f"Results: {tmp_path / 'results.md'} and results.json (with the package versions and dataset checksums)" \
        in last and last.endswith(f"prediction drawings of shapes_val: {tmp_path / 'vis'}/ (2 PNG files)."), last


def test_a_run_without_a_test_set_trains_and_draws_nothing(tmp_path):
    args = parse_args(["--config", str(DEMO_CONFIG), *TINY_OPTS, "DATASETS.TEST", "()", "TEST.VIS_IMAGES", "2",
                       "SOLVER.MAX_ITER", "1", "OUTPUT_DIR", str(tmp_path)])
    assert main(args) == {}
    assert (tmp_path / "model_final.pth").is_file() and not (tmp_path / "vis").exists()
