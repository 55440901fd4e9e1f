"""LazyConfigs trained and evaluated end to end: by gwdet's tools/train_net.py (the yacs path's run
folder, checks, resume, signal checkpoint and results files; gwdet.engine.lazy) and by detectron2's
own tools/lazyconfig_train_net.py, unmodified, on the demo LazyConfig at test size."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gwdet.checkpoint.compatibility import NORM_TYPES_KEY
from gwdet.checkpoint.signal_hook import TrainingInterrupted
from gwdet.engine.arguments import parse_args
from gwdet.engine.run import main
from gwdet.engine.lazy import LazyTrainer
from gwdet.utils.atomic import record_checksum

from conftest import REPO, SignalAfter, logged_warnings

LAZY_DEMO = REPO / "configs" / "LazyConfig" / "mask_rcnn_R_50_FPN_gw_shapes.py"
# The demo LazyConfig at test size (conftest.TINY_OPTS as LazyConfig overrides): 64x64 images, 8 to
# train on, 4 to evaluate, 2 per batch, 2 iterations, no loader processes.
LAZY_TINY = [
    "dataloader.shapes.image_size=64",
    "dataloader.shapes.num_train=8",
    "dataloader.shapes.num_val=4",
    "dataloader.train.total_batch_size=2",
    "dataloader.train.num_workers=0",
    "dataloader.test.num_workers=0",
    "train.max_iter=2",
    "train.vis_images=0",
]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def run(output_dir: Path, *extra: str) -> dict:
    """gwdet's train tool (its main, in this process) on the tiny demo LazyConfig."""
    args = parse_args(["--config-file", str(LAZY_DEMO), *LAZY_TINY, f"train.output_dir={output_dir}", *extra])
    return main(args)


def iteration_of(checkpoint: Path) -> int:
    return torch.load(checkpoint, map_location="cpu", weights_only=False)["iteration"]


def test_train_net_trains_and_evaluates_a_lazy_config(tmp_path):
    """The command users type, with a .py config and key=value overrides."""
    command = [sys.executable, str(REPO / "tools" / "train_net.py"), "--config-file", str(LAZY_DEMO), *LAZY_TINY,
               f"train.output_dir={tmp_path}", "train.vis_images=2", "--threads", "1"]
    completed = subprocess.run(command, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    log = completed.stdout + completed.stderr
    assert "Evaluation results for bbox" in log and "Evaluation results for segm" in log
    assert "save a checkpoint of the current iteration before training stops" in log  # CheckpointOnSignal
    markdown = (tmp_path / "results.md").read_text()
    assert "### shapes_val bbox" in markdown and "### shapes_val segm" in markdown
    # the settings the evaluation read, which a later evaluation of the weights may give otherwise
    assert "`model.roi_heads.box_predictor.test_score_thresh 0.05`" in markdown
    assert "`dataloader.test.mapper.augmentations [{'_target_': 'detectron2.data.transforms.ResizeShortestEdge'" in markdown
    assert len(list((tmp_path / "vis").glob("*.png"))) == 2  # train.vis_images drawings of shapes_val
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results) == {"shapes_val", "environment"} and set(results["shapes_val"]) == {"bbox", "segm"}
    assert {"AP", "AP50", "AP75"} <= set(results["shapes_val"]["bbox"])
    assert set(results["environment"]["datasets"]) == {"shapes_train", "shapes_val"}  # dataloader.train / .test
    assert (tmp_path / "log.txt").read_text().strip().splitlines()[-1].endswith(
        f"prediction drawings of shapes_val: {tmp_path / 'vis'}/ (2 PNG files).")
    metrics = [json.loads(line) for line in (tmp_path / "metrics.json").read_text().splitlines()]
    assert any("total_loss" in m for m in metrics)
    checkpoint = torch.load(tmp_path / "model_final.pth", map_location="cpu", weights_only=False)
    assert checkpoint["iteration"] == 1 and NORM_TYPES_KEY in checkpoint, "gwdet's ResilientCheckpointer saved it"
    assert "gwdet.norm" in (tmp_path / "config.yaml").read_text()
    assert list((tmp_path / "inference").glob("coco_instances_results.json"))


def test_a_lazy_run_folder_follows_the_yacs_rules(tmp_path):
    results = run(tmp_path)
    assert set(results) == {"shapes_val"} and set(results["shapes_val"]) == {"bbox", "segm"}
    final = tmp_path / "model_final.pth"
    trained = final.stat().st_mtime_ns
    with pytest.raises(FileExistsError, match="already holds a run.*--resume.*--overwrite"):
        run(tmp_path)
    with pytest.raises(ValueError, match=r"another model .*model.backbone.norm.num_groups: 16 -> 8"):
        run(tmp_path, "--resume", "model.backbone.norm.num_groups=8")
    with pytest.raises(ValueError, match=r"trained with train.seed 0, this config gives 5: the data stream continues "
                                         r"the run's order of images .*Resume with train.seed=0, or start a new run"):
        run(tmp_path, "--resume", "train.max_iter=3", "train.seed=5")
    with pytest.raises(ValueError, match="--resume continues the run in train.output_dir and --overwrite deletes it"):
        run(tmp_path, "--resume", "--overwrite")
    with pytest.raises(ValueError, match=r"--eval-only needs trained weights: add train.init_checkpoint=path/to"):
        run(tmp_path, "--eval-only")
    assert final.stat().st_mtime_ns == trained, "no refused request touched the run"
    config = tmp_path / "config.yaml"
    written = config.read_bytes()
    config.write_bytes(written + b"# still valid YAML, but not what the run wrote\n")
    with pytest.raises(ValueError, match=r"config.yaml is damaged, .*\(its SHA-256 differs from the one recorded in "
                                         r"config.yaml.sha256 when it was written\)\. .*this train.output_dir"):
        run(tmp_path, "--resume")
    # The run's config.yaml is read without running its tags (detectron2's LazyConfig.load would
    # run them: yaml.unsafe_load); its own ShapeSpec tags still compare equal.
    witness = tmp_path.parent / "ran"
    config.write_bytes(written + f'X: !!python/object/apply:os.system ["touch {witness}"]\n'.encode())
    record_checksum(str(config))

    with logged_warnings("gwdet.engine.output_dir") as logged:
        run(tmp_path, "--resume", "train.max_iter=3")  # one more iteration
    assert iteration_of(final) == 2
    # the schedule is in fractions of train.max_iter: the decayed rate at iteration 2 of 2 rises at 2 of 3
    assert any("--resume with train.max_iter 2 -> 3: the lr_multiplier schedule is in fractions of train.max_iter, so "
               "at the resumed iteration 2 the learning rate becomes 1 x optimizer.lr, where the run had 0.01 x" in line
               for line in logged), logged
    assert any("train.max_iter: 2 -> 3" in message for message in logged), "a difference outside the model is logged"
    assert not witness.exists() and any("X.python_tag: 'object/apply:os.system' -> <absent>" in message
                                        for message in logged)
    iterations = [json.loads(line).get("iteration") for line in (tmp_path / "metrics.json").read_text().splitlines()]
    # iterations 1 (first run) and 2 (resumed; written to the trimmed file), then the resumed run's
    # evaluation, recorded after the last iteration; the first run's evaluation record (at 2) is gone
    assert iterations == [1, 2, 3]

    run_results = (tmp_path / "results.json").read_text()
    evaluated = run(tmp_path, "--eval-only", "--resume")  # the checkpoint last_checkpoint names, beside the run
    assert set(evaluated) == {"shapes_val"}
    assert json.loads((tmp_path / "eval" / "model_final" / "results.json").read_text()).keys() == {"shapes_val",
                                                                                                 "environment"}
    assert (tmp_path / "results.json").read_text() == run_results

    run(tmp_path, "--overwrite")
    assert iteration_of(final) == 1 and not (tmp_path / "eval").exists()


def test_a_lazy_runs_saved_config_yaml_evaluates_its_weights_as_the_py_config_does(tmp_path):
    """The run's config.yaml (written by LazyConfig.save, as detectron2's default_setup does) is a
    config file of its own, read without yaml.unsafe_load; a tag that would build another object
    is refused by name."""
    trained = run(tmp_path / "run")
    saved = tmp_path / "run" / "config.yaml"
    weights = f"train.init_checkpoint={tmp_path / 'run' / 'model_final.pth'}"
    again = main(parse_args(["--config-file", str(saved), "--eval-only", weights, f"train.output_dir={tmp_path / 'eval'}"]))
    assert json.dumps(again, sort_keys=True) == json.dumps(trained, sort_keys=True)  # NaN where no objects
    tampered = tmp_path / "tampered.yaml"
    tampered.write_text(saved.read_text().replace("_target_: detectron2.modeling.StandardROIHeads",
                                                  "_target_: !!python/object/apply:os.getcwd []", 1))
    with pytest.raises(ValueError, match=r"is a LazyConfig saved as YAML, but the tag !!python/object/apply:os.getcwd "
                                         r"would build a Python object that a saved LazyConfig does not hold"):
        main(parse_args(["--config-file", str(tampered), "--eval-only", weights]))
    # a norm given as a lambda, which LazyConfig.save writes as !!python/name:None.<lambda>: hydra's raw ImportError
    tampered.write_text(saved.read_text().replace("_target_: detectron2.modeling.StandardROIHeads",
                                                  "_target_: !!python/name:None.%3Clambda%3E ''", 1))
    with pytest.raises(ValueError, match=r"is a LazyConfig saved as YAML, but the tag !!python/name:None.<lambda> "
                                         r"names no importable object \(a lambda or a function defined inside "
                                         r"another, which YAML cannot hold\) .*Use the .py LazyConfig the run was made"):
        main(parse_args(["--config-file", str(tampered), "--eval-only", weights]))
    # the yacs loader (build_config, tools/analyze.py) called it a YAML tag to remove
    from gwdet.model_zoo import build_config

    with pytest.raises(ValueError, match=r"is a LazyConfig \(a LazyConfig run's saved config: model, train, "
                                         r"dataloader\), not a yacs config"):
        build_config(str(saved))
    # a model trained afresh from the YAML drew other initial weights than from the .py, without a word: its keys
    # are in alphabetical order, and detectron2 builds a node's parts in key order (the stages before the stem)
    from detectron2.config import instantiate

    from gwdet.engine.run import warn_of_saved_key_order
    from gwdet.model_zoo.lazy_loading import load_lazy_config

    stems = []
    for config in (LAZY_DEMO, saved):
        torch.manual_seed(0)
        stems.append(instantiate(load_lazy_config(str(config)).model).backbone.bottom_up.stem.conv1.weight)
    assert not torch.equal(*stems)
    with logged_warnings("gwdet.engine.run") as warned:
        warn_of_saved_key_order(str(LAZY_DEMO))
        warn_of_saved_key_order(str(saved))
    assert len(warned) == 1 and warned[0].startswith(f"{saved} is a LazyConfig saved as YAML, whose keys "
                                                     "LazyConfig.save writes in alphabetical order")


def test_a_lazy_run_stopped_by_a_signal_resumes_to_the_weights_of_an_uninterrupted_one(tmp_path, monkeypatch):
    uninterrupted, stopped = tmp_path / "uninterrupted", tmp_path / "stopped"
    run(uninterrupted, "train.max_iter=4")

    build_hooks = LazyTrainer.build_hooks
    monkeypatch.setattr(LazyTrainer, "build_hooks",  # a closed terminal (SIGUSR2 and the rest: test_resume.py)
                        lambda self: build_hooks(self) + [SignalAfter(1, signal.SIGHUP)])
    hangup = signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as in a terminal, not under nohup
    try:
        with pytest.raises(TrainingInterrupted) as stop:
            run(stopped, "train.max_iter=4")
    finally:
        signal.signal(signal.SIGHUP, hangup)
    assert stop.value.checkpoint == "model_0000002.pth" and not (stopped / "model_final.pth").exists()
    monkeypatch.setattr(LazyTrainer, "build_hooks", build_hooks)

    run(stopped, "train.max_iter=4", "--resume")
    expected = torch.load(uninterrupted / "model_final.pth", map_location="cpu", weights_only=False)
    resumed = torch.load(stopped / "model_final.pth", map_location="cpu", weights_only=False)
    assert resumed["iteration"] == expected["iteration"] == 3
    for name, tensor in expected["model"].items():  # same data order, random draws and optimizer state
        assert torch.equal(resumed["model"][name], tensor), name


def detectron2_lazyconfig_train_net() -> Path | None:
    """detectron2's tools/lazyconfig_train_net.py where gwdet's set-up leaves it: beside the
    detectron2 package of the sal-detectron2 wheel (``.venv/detectron2-dist/tools``)."""
    import detectron2

    tool = Path(detectron2.__file__).resolve().parents[1] / "tools" / "lazyconfig_train_net.py"
    return tool if tool.is_file() else None


@pytest.mark.skipif(detectron2_lazyconfig_train_net() is None,
                    reason="detectron2's tools/ are not beside this detectron2 (a source build keeps them in its checkout)")
def test_detectron2s_own_lazyconfig_train_net_trains_and_evaluates_the_demo_config(tmp_path):
    tool = detectron2_lazyconfig_train_net()
    assert tool == REPO / ".venv" / "detectron2-dist" / "tools" / "lazyconfig_train_net.py" or ".venv" not in str(tool)
    command = [sys.executable, str(tool), "--config-file", str(LAZY_DEMO), *LAZY_TINY, f"train.output_dir={tmp_path}"]
    completed = subprocess.run(command, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    log = completed.stdout + completed.stderr
    assert "Evaluation results for bbox" in log and "Evaluation results for segm" in log
    assert (tmp_path / "model_final.pth").is_file() and (tmp_path / "metrics.json").is_file()


def test_a_resumed_yacs_run_keeps_its_metrics_too(tmp_path):
    """The writers both paths share (gwdet.engine.training.run_writers) open metrics.json after --resume has
    trimmed it: before, a resumed run appended its records to the replaced file and lost them."""
    from conftest import DEMO_CONFIG, TINY_OPTS

    def yacs_run(*extra):
        return main(parse_args(["--config", str(DEMO_CONFIG), *TINY_OPTS, "DATASETS.TEST", "()",
                                "OUTPUT_DIR", str(tmp_path), *extra]))

    yacs_run()
    (tmp_path / "metrics.json").write_text((tmp_path / "metrics.json").read_text() + '{"iteration": 2, "cut')
    yacs_run("--resume", "SOLVER.MAX_ITER", "3")  # trims the damaged line, then writes iteration 2
    iterations = [json.loads(line)["iteration"] for line in (tmp_path / "metrics.json").read_text().splitlines()]
    assert iterations == [1, 2]


# ---- gwdet's export and analyze tools with a LazyConfig ----

@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
def test_a_lazy_configs_model_exports_by_scripting(tmp_path, capsys):
    # TorchScript refused the ResNet's _out_features, an OmegaConf ListConfig that instantiate leaves
    pytest.importorskip("detectron2.export", reason="gwdet.export needs detectron2 >= 0.7")
    from gwdet.export.export_model import main as export

    torch.manual_seed(0)
    assert export(["--config-file", str(LAZY_DEMO), "--untrained", "--export-method", "scripting", "--output",
                   str(tmp_path / "ts"), *LAZY_TINY[:3], "model.roi_heads.box_predictor.test_score_thresh=0.0"]) == 0
    printed = capsys.readouterr().out
    assert (tmp_path / "ts" / "model.ts").is_file()
    assert float(printed.split("on the sample input: ")[1].split()[0]) <= 1e-3


def test_export_and_analyze_tools_take_a_lazy_config(tmp_path, capsys):
    pytest.importorskip("detectron2.export", reason="gwdet.export needs detectron2 >= 0.7")
    from detectron2.data import DatasetCatalog

    from gwdet.export.analyze_model import main as analyze
    from gwdet.export.export_model import main as export

    config = ["--config-file", str(LAZY_DEMO)]
    tiny = [*LAZY_TINY[:3], f"train.output_dir={tmp_path / 'out'}"]
    # TorchScript by tracing, compared on the first test image with detections, then evaluated.
    # A model of seeded random weights: with barely trained weights, detections of equal scores can
    # come out in another order from the traced model, as with a yacs config.
    torch.manual_seed(0)
    assert export([*config, "--untrained", "--format", "torchscript", "--output", str(tmp_path / "ts"), "--run-eval", *tiny]) == 0
    printed = capsys.readouterr().out
    assert float(printed.split("on the sample input: ")[1].split()[0]) <= 1e-3
    assert "COCO evaluation of the export on shapes_val (dataloader.test):" in printed  # the AP names its dataset
    assert (tmp_path / "ts" / "model.ts").is_file()
    # the evaluation's files beside the export: a training run's inference/ in train.output_dir was replaced
    assert (tmp_path / "ts" / "inference" / "instances_predictions.pth").is_file()
    assert not (tmp_path / "out").exists()
    # a sample image, read as dataloader.test reads its images (format, resize)
    sample = DatasetCatalog.get("shapes_val")[0]["file_name"]
    torch.manual_seed(0)
    assert export([*config, "--untrained", "--sample-image", sample, "--output", str(tmp_path / "sample"), *tiny]) == 0
    assert float(capsys.readouterr().out.split("on the sample input: ")[1].split()[0]) <= 1e-3

    # flops of trained weights on the first two test images, every GW layer counted
    run(tmp_path / "run", "train.max_iter=1")
    capsys.readouterr()
    weights = f"train.init_checkpoint={tmp_path / 'run' / 'model_final.pth'}"
    assert analyze([*config, "--tasks", "flop", "parameter", "-n", "2", weights, *tiny]) == 0
    printed = capsys.readouterr().out
    # "Total GFlops: X (over 2 input(s))" read as a sum over the inputs: it is each input's mean
    assert "GFlops per input: " in printed and "(the mean over 2 input(s), each one image)" in printed
    whole = next(line for line in printed.splitlines() if line.startswith("| whole model |"))
    assert "group_whitening" in whole
    with pytest.raises(SystemExit) as stopped:  # the tool's one-line error (gwdet.utils.cli_errors)
        analyze([*config, f"train.init_checkpoint={tmp_path / 'missing.pth'}", *tiny])
    assert stopped.value.code == 2
    assert re.search(r"error: train.init_checkpoint file .*missing.pth' does not exist", capsys.readouterr().err)
    with pytest.raises(ValueError, match="is not key=value"):  # --verbose: the exception itself
        analyze([*config, "MODEL.WEIGHTS", "x.pth", "--verbose"])


# a model whose parameters were all frozen was warned of, then ended in torch's raw "ValueError: optimizer got an
# empty parameter list"
def test_lazy_build_optimizer_refuses_a_model_without_a_trainable_parameter_as_the_yacs_one_does():
    from gwdet.engine import lazy
    from gwdet.errors import GwdetValueError
    from gwdet.model_zoo.lazy_loading import load_lazy_config
    from conftest import LAZY_CONFIG

    cfg = load_lazy_config(str(LAZY_CONFIG), ["train.device=cpu"], model=True)
    frozen = torch.nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(GwdetValueError, match=re.escape(
            "build_optimizer: the model (Linear) has no trainable parameter: all 2 of its parameters are frozen "
            "(requires_grad False), so an optimizer would have nothing to train. Build the optimizer for the model "
            "that trains (a model made frozen on purpose is evaluated without one), or make its parameters trainable "
            "first (model.requires_grad_(True)).")):
        lazy.build_optimizer(cfg, frozen)
    with pytest.raises(GwdetValueError, match=r"^build_optimizer: the model \(Identity\) has no trainable parameter: "
                                              r"it has no parameters, so an optimizer"):
        lazy.build_optimizer(cfg, torch.nn.Identity())
    optimizer = lazy.build_optimizer(cfg, frozen.requires_grad_(True))
    assert sum(len(group["params"]) for group in optimizer.param_groups) == 2
