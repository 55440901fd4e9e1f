"""The export and analyze tools refuse flags they cannot use before building anything, and read
their flags wherever they stand on the command line (after the config overrides too)."""
import os
import re

import pytest

from gwdet.utils.command_line import parse_with_trailing_flags
from gwdet.export import analyze_model, export_model

from conftest import DEMO_CONFIG, LAZY_CONFIG, REPO, logged_warnings


def export(capsys, tmp_path, *flags: str) -> str:
    """The export tool's one-line refusal (exit status 2) for ``flags``; nothing is written."""
    with pytest.raises(SystemExit) as exit_info:
        export_model.main(["--config-file", str(DEMO_CONFIG), "--output", str(tmp_path / "out"), *flags])
    lines = capsys.readouterr().err.strip().splitlines()
    err = next((line for line in lines if re.match(r"\S+: error: ", line)), lines[0])  # after logged lines
    assert exit_info.value.code == 2, err
    assert not (tmp_path / "out").exists()
    return err


def test_export_refuses_an_output_that_is_a_file(capsys, tmp_path):
    (tmp_path / "file").write_text("mine")
    with pytest.raises(SystemExit) as exit_info:
        export_model.main(["--config-file", str(DEMO_CONFIG), "--output", str(tmp_path / "file")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "--output" in err and "is a file, not a folder" in err, err
    assert (tmp_path / "file").read_text() == "mine"


@pytest.mark.parametrize("folder", ["model.ts", "model.ts.sha256"])
def test_export_refuses_a_folder_where_it_writes_a_file_before_building(capsys, tmp_path, folder):
    # after building and tracing: a raw IsADirectoryError (--overwrite, the advice given, did not help)
    (tmp_path / "out" / folder).mkdir(parents=True)
    with pytest.raises(SystemExit):
        export_model.main(["--config-file", str(DEMO_CONFIG), "--output", str(tmp_path / "out"), "--overwrite"])
    assert (f"--output {tmp_path / 'out'} holds a folder {folder}, where the export writes a file of that name"
            in capsys.readouterr().err)


def test_export_refuses_an_output_that_is_a_link_to_nowhere_and_expands_a_tilde(capsys, tmp_path, monkeypatch):
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    with pytest.raises(SystemExit):
        export_model.main(["--config-file", str(DEMO_CONFIG), "--output", str(tmp_path / "link")])
    assert f"is a link to {tmp_path / 'nowhere'}, which does not exist" in capsys.readouterr().err
    monkeypatch.setenv("HOME", str(tmp_path))  # --output=~/x: the shell leaves the ~ after '='
    args = parse_with_trailing_flags(export_model.argument_parser(),
                                     ["--config-file", "c.yaml", "--output=~/deploy", "--sample-image=~/x.png"])
    assert (args.output, args.sample_image) == (str(tmp_path / "deploy"), str(tmp_path / "x.png"))


def test_export_refuses_a_sample_image_that_is_missing_or_not_an_image(capsys, tmp_path):
    err = export(capsys, tmp_path, "--sample-image", str(tmp_path / "missing.png"))
    assert "--sample-image" in err and "missing.png" in err
    (tmp_path / "notes.png").write_text("not an image")
    err = export(capsys, tmp_path, "--sample-image", str(tmp_path / "notes.png"))
    assert "--sample-image" in err and "notes.png" in err


def test_export_without_a_test_set_or_a_sample_image_is_refused_before_building(capsys, tmp_path):
    # before: a raw IndexError where the sample was looked for
    err = export(capsys, tmp_path, "--untrained", "DATASETS.TEST", "()")
    assert ("The export is compared with the eager model on a test image, and DATASETS.TEST names no test set to "
            "take one from; nothing was written. Give --sample-image IMAGE") in err, err


@pytest.mark.parametrize("flags, message", [
    (["--format", "onnx", "--opset", "5"], "--opset 5: give an ONNX opset from 16"),
    # 13 to 15 exported detectron2's aligned ROIAlign as another function, refused only as "detections differ"
    (["--format", "onnx", "--opset", "13"], "--opset 13: give an ONNX opset from 16 (the first whose RoiAlign "
                                            "computes detectron2's aligned ROIAlign: an older one exports other "
                                            "detections)"),
    (["--format", "onnx", "--opset", "999"], "--opset 999: give an ONNX opset from 16"),
    (["--opset", "17"], "--opset 17 is an ONNX setting: add --format onnx"),
])
def test_export_refuses_an_opset_it_cannot_write(capsys, tmp_path, flags, message):
    assert message in export(capsys, tmp_path, *flags)


def test_flags_after_the_overrides_are_flags():
    parser = export_model.argument_parser()
    args = parse_with_trailing_flags(parser, ["--config-file", "c.yaml", "--output", "out", "MODEL.DEVICE", "cpu",
                                              "--overwrite", "--opset", "13", "SOLVER.MAX_ITER", "2"])
    assert args.overwrite and args.opset == 13
    assert args.opts == ["MODEL.DEVICE", "cpu", "SOLVER.MAX_ITER", "2"]
    with pytest.raises(SystemExit):
        parse_with_trailing_flags(parser, ["--config-file", "c.yaml", "--output", "out", "MODEL.DEVICE", "cpu",
                                           "--overwritten"])
    analyze = analyze_model.argument_parser()
    args = parse_with_trailing_flags(analyze, ["--config-file", "c.yaml", "MODEL.DEVICE", "cpu", "--input-size", "64",
                                               "96", "SOLVER.MAX_ITER", "2"])
    assert args.input_size == [64, 96] and args.opts == ["MODEL.DEVICE", "cpu", "SOLVER.MAX_ITER", "2"]
    with pytest.raises(SystemExit):  # a list of values: only before the overrides
        parse_with_trailing_flags(analyze, ["--config-file", "c.yaml", "MODEL.DEVICE", "cpu", "--tasks", "flop"])


@pytest.mark.parametrize("flag, message", [
    (["-n", "0"], "argument -n/--num-inputs: the image count must be >= 1, got 0"),
    (["--max-depth", "-1"], "argument --max-depth: the table depth must be >= 1, got -1"),
    (["--input-size", "0", "64"], "argument --input-size: an image side must be >= 1, got 0"),
    (["-n", "two"], "argument -n/--num-inputs: 'two' is not an integer"),
    # one side given: the override after it was read as the width ("'DATASETS...' is not an integer")
    (["--input-size", "64", "DATASETS.SHAPES.NUM_TRAIN", "8"], "argument --input-size: takes two integers, the height "
     "and the width (e.g. --input-size 800 1216), got 'DATASETS.SHAPES.NUM_TRAIN' (a config override: give the width "
     "before it)"),
])
def test_analyze_refuses_counts_below_one(capsys, flag, message):
    with pytest.raises(SystemExit) as exit_info:
        analyze_model.argument_parser().parse_args(["--config-file", str(DEMO_CONFIG), *flag])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_analyze_refuses_an_input_size_that_cannot_fit_before_building(capsys):
    # the model gets the image as given: 100000 x 100000 failed in the allocator after building
    with pytest.raises(SystemExit) as exit_info:
        analyze_model.argument_parser().parse_args(["--config-file", str(DEMO_CONFIG), "--input-size", "64",
                                                    str(analyze_model.MAX_INPUT_SIDE + 1)])
    assert exit_info.value.code == 2
    assert f"is above {analyze_model.MAX_INPUT_SIDE}" in capsys.readouterr().err
    args = analyze_model.argument_parser().parse_args(["--config-file", str(DEMO_CONFIG), "--input-size", "64",
                                                       str(analyze_model.MAX_INPUT_SIDE)])
    assert args.input_size == [64, analyze_model.MAX_INPUT_SIDE]


def test_analyze_refuses_a_count_of_test_images_beside_a_random_input_size(capsys):
    # -n 3 was ignored: "Total GFlops: 3.252 (over 1 input(s))"
    with pytest.raises(SystemExit) as exit_info:
        analyze_model.main(["--config-file", str(DEMO_CONFIG), "-n", "3", "--input-size", "64", "64"])
    assert exit_info.value.code == 2
    assert ("-n 3 averages over test images, and --input-size counts on one random image of that size (the count "
            "does not depend on its pixels): give one of them.") in capsys.readouterr().err
    # both were ignored without a word by the tasks that run the model on no image
    for flags in (["--input-size", "64", "64"], ["-n", "3"]):
        with pytest.raises(SystemExit) as exit_info:
            analyze_model.main(["--config-file", str(DEMO_CONFIG), "--tasks", "parameter", "structure", *flags])
        assert exit_info.value.code == 2
        flag = " ".join(flags[:2]) if flags[0] == "-n" else flags[0]
        assert (f"{flag} choose(s) the images --tasks flop counts on, and --tasks parameter structure runs the model on "
                f"no image: add flop to --tasks, or leave {flags[0]} out.") in capsys.readouterr().err


def test_the_tools_refuse_test_time_augmentation_they_would_not_apply(tmp_path, capsys):
    # the flop count of the plain model was printed for a config asking for test-time augmentation, without a word
    for tool, flags, task in ((analyze_model, ["--tasks", "flop"], "--tasks flop counts"),
                              (export_model, ["--output", str(tmp_path / "export")],
                               "the export holds \\(and --run-eval evaluates\\)")):
        with pytest.raises(SystemExit) as exit_info:
            tool.main(["--config-file", str(DEMO_CONFIG), *flags, "TEST.AUG.ENABLED", "True"])
        assert exit_info.value.code == 2
        assert re.search(rf"error: TEST.AUG.ENABLED is True, but {task} the plain model, without test-time "
                         r"augmentation .*: set TEST.AUG.ENABLED False.", capsys.readouterr().err)
    assert not (tmp_path / "export").exists()
    # the parameter table does not depend on it
    assert analyze_model.main(["--config-file", str(DEMO_CONFIG), "--tasks", "parameter", "TEST.AUG.ENABLED",
                               "True"]) == 0


def test_analyze_reads_no_weights_and_no_test_set_for_parameters_and_structure(tmp_path, capsys):
    # backbone-only weights (a converted ImageNet file, as the COCO configs name) were refused as "a partly random
    # model" for the parameter table, and an unregistered test set was required though no image is read
    import torch

    torch.save({"model": {"backbone.bottom_up.stem.conv1.weight": torch.zeros(1)}}, tmp_path / "partial.pth")
    assert analyze_model.main(["--config-file", str(DEMO_CONFIG), "--tasks", "parameter", "MODEL.WEIGHTS",
                               str(tmp_path / "partial.pth"), "DATASETS.TEST", "('not_registered',)"]) == 0
    assert "Parameters:" in capsys.readouterr().out
    with pytest.raises(SystemExit):  # the flop count reads the weights (and their test images): checked
        analyze_model.main(["--config-file", str(DEMO_CONFIG), "MODEL.WEIGHTS", str(tmp_path / "partial.pth")])
    assert "weights have another shape in the weights than in the model" in capsys.readouterr().err


def test_a_torchvision_detection_checkpoint_as_initial_weights_is_named_with_the_way_to_convert_it(tmp_path):
    # it was called a torchvision-layout ImageNet checkpoint to convert, and the converter refused it
    import torch

    import gwdet
    from gwdet.checkpoint.resilient import ResilientCheckpointer
    from gwdet.model_zoo import build_config

    model = gwdet.build_model(build_config(str(DEMO_CONFIG), ["MODEL.DEVICE", "cpu"]))
    torch.save({"backbone.body.conv1.weight": torch.zeros(16, 3, 7, 7), "roi_heads.box_head.fc6.weight": torch.zeros(1)},
               tmp_path / "fasterrcnn.pth")
    with pytest.raises(ValueError, match=r"a partly random backbone\. Those are a torchvision detection model's weights "
                                         r"\(its ResNet under 'backbone.body.', then its FPN and heads\)"):
        ResilientCheckpointer(model, save_dir=str(tmp_path)).load_weights(str(tmp_path / "fasterrcnn.pth"))


def test_weights_that_are_a_folder_or_a_numpy_archive_are_named(tmp_path):
    import numpy as np
    import torch

    from gwdet.checkpoint.resilient import ResilientCheckpointer
    from gwdet.checkpoint.safe_load import NotACheckpointError

    checkpointer = ResilientCheckpointer(torch.nn.Linear(2, 2), save_dir=str(tmp_path))
    with pytest.raises(IsADirectoryError, match=r"MODEL.WEIGHTS '.*' is a folder: give the checkpoint file in it"):
        checkpointer.load_weights(str(tmp_path))
    np.savez(tmp_path / "weights.npz", weight=np.zeros((2, 2)))
    with pytest.raises(NotACheckpointError, match="a zip archive, but not one torch.save writes"):
        checkpointer.load_weights(str(tmp_path / "weights.npz"))
    lazy = ResilientCheckpointer(torch.nn.Linear(2, 2), save_dir=str(tmp_path), weights_setting="train.init_checkpoint")
    with pytest.raises(FileNotFoundError, match=r"train.init_checkpoint file '.*missing.pth' does not exist.*"
                                                r"set train.init_checkpoint=\"\" to train from scratch"):
        lazy.load_weights(str(tmp_path / "missing.pth"))
    evaluating = ResilientCheckpointer(torch.nn.Linear(2, 2), save_dir=str(tmp_path), require_every_weight=True)
    with pytest.raises(FileNotFoundError) as refused:  # trained weights: no advice to train from scratch
        evaluating.load_weights(str(tmp_path / "missing.pth"))
    assert str(refused.value) == (f"MODEL.WEIGHTS file {str(tmp_path / 'missing.pth')!r} does not exist. Name the "
                                  "trained weights, e.g. MODEL.WEIGHTS output/run/model_final.pth.")


def test_the_python_checkpointer_loads_a_path_object_and_names_a_folder(tmp_path):
    import pathlib

    import torch

    from gwdet.checkpoint.resilient import ResilientCheckpointer

    model = torch.nn.Linear(2, 2)
    ResilientCheckpointer(model, save_dir=str(tmp_path)).save("model_final")
    loaded = torch.nn.Linear(2, 2)
    ResilientCheckpointer(loaded, save_dir=str(tmp_path)).load(pathlib.Path(tmp_path) / "model_final.pth")
    assert torch.equal(loaded.weight, model.weight)
    with pytest.raises(IsADirectoryError, match=r"is a folder: give the checkpoint file in it \(e.g. .*model_final.pth"):
        ResilientCheckpointer(loaded, save_dir=str(tmp_path)).load(str(tmp_path))  # before: "not found!"


def test_weights_that_are_a_pipe_or_a_link_loop_are_named_as_such(tmp_path):
    import torch

    from gwdet.checkpoint.resilient import ResilientCheckpointer

    os.mkfifo(tmp_path / "weights.pth")
    os.symlink(tmp_path / "loop_b.pth", tmp_path / "loop_a.pth")
    os.symlink(tmp_path / "loop_a.pth", tmp_path / "loop_b.pth")
    checkpointer = ResilientCheckpointer(torch.nn.Linear(2, 2), save_dir=str(tmp_path))
    for name in ("weights.pth", "loop_a.pth"):
        with pytest.raises(ValueError, match=r"MODEL.WEIGHTS '.*' is not a regular file \(a named pipe, a device, "
                                             r"or a link that leads nowhere or in a loop\): give the checkpoint file"):
            checkpointer.load_weights(str(tmp_path / name))




@pytest.mark.parametrize("override, world_size, message", [
    ("train.max_iter=0", 1, "train.max_iter=0: give a whole number of iterations of at least 1"),
    # a string: also what ${oc.env:NAME} gives (its '3' was refused without saying it is a string)
    ("train.max_iter=abc", 1, "train.max_iter='abc' (str, as OmegaConf's ${oc.env:NAME} gives it: give the number "
                              "itself, from a shell train.max_iter=$NAME): give a whole number"),
    ("train.checkpointer.period=0", 1, "train.checkpointer.period=0: give a whole number"),
    ("train.eval_period=-1", 1, "train.eval_period=-1: give a whole number of iterations of at least 0"),
    ("dataloader.train.total_batch_size=3", 2, "total_batch_size=3, which 2 process(es)"),
    # a string was refused as "not a positive multiple of 1"
    ('dataloader.train.total_batch_size="2"', 1, "dataloader.train.total_batch_size='2' is no whole number of images "
                                                 "(str): give the batch of all processes together as an integer"),
    # the annotations dropped: detectron2's "RPN requires gt_instances", blamed on another override
    ("dataloader.train.mapper.is_train=False", 1, "dataloader.train.mapper.is_train=False: detectron2's DatasetMapper "
                                                  "then drops the annotations"),
    ("optimizer.lr=-1", 1, "optimizer.lr=-1 is no learning rate: it must be a finite number >= 0"),
    ("lr_multiplier.scheduler.values=[1.0,0.0,0.0]", 1, "lr_multiplier.scheduler.values=[1.0, 0.0, 0.0]: each value "
                                                        "multiplies the learning rate from its milestone on"),
    ("optimizer.momentum=1.5", 1, "optimizer.momentum=1.5: give a number from 0 to below 1"),
    # torch's raw "Nesterov momentum requires a momentum and zero dampening" (the yacs twin refused it)
    ("optimizer.nesterov=True optimizer.momentum=0.0", 1, "optimizer.nesterov=True needs momentum, but "
                                                          "optimizer.momentum is 0.0"),
    # from scratch (train.init_checkpoint empty), as the yacs keys are refused: random stages, identity norms
    ("model.backbone.bottom_up.freeze_at=2", 1, "model.backbone.bottom_up.freeze_at is 2, which keeps the first 2 "
                                                "stage(s) of the backbone (the stem first) at their initial weights, "
                                                "and train.init_checkpoint is empty"),
    ("model.backbone.bottom_up.resnet.stem.norm=FrozenBN", 1,
     "model.backbone.bottom_up.resnet.stem.norm, model.backbone.bottom_up.resnet.stages.0.norm, "
     "model.backbone.bottom_up.resnet.stages.1.norm, ... (2 more) is FrozenBN, which normalizes with the fixed "
     "statistics and affine values of pretrained weights, and train.init_checkpoint is empty"),
    # BGN's example groups, as the yacs MODEL.BGN.EXAMPLES_PER_GROUP (LazyConfig runs trained without a word)
    ("model.backbone.norm.name=BGN model.backbone.norm.T=null model.backbone.norm.examples_per_group=3 "
     "dataloader.train.total_batch_size=2", 1,
     "config: model.backbone.norm.examples_per_group=3 is larger than dataloader.train.total_batch_size=2, so no "
     "example group can be filled"),
    ("model.backbone.norm.name=GhostBN model.backbone.norm.T=null model.backbone.norm.num_groups=null "
     "model.backbone.norm.examples_per_group=2 dataloader.train.total_batch_size=2", 2,
     "config: model.backbone.norm.examples_per_group=2 does not divide the 1 images each process trains on "
     "(dataloader.train.total_batch_size=2 over 2 process(es))"),
])
def test_lazy_training_values_are_refused_before_anything_is_built(override, world_size, message):
    from gwdet.engine.lazy import LazyRun

    run = LazyRun.load(str(LAZY_CONFIG), override.split(" "))
    run.check_request(eval_only=True, world_size=world_size)  # evaluation needs none of them
    with pytest.raises(ValueError) as refused:
        run.check_request(eval_only=False, world_size=world_size)
    assert message in str(refused.value)
    LazyRun.load(str(LAZY_CONFIG)).check_request(eval_only=False, world_size=1)  # the shipped values pass


@pytest.mark.parametrize("config, override, message", [
    # both failed with a traceback after the whole training (KeyError 'keypoints'; "Dataset '[...]' is not registered")
    (LAZY_CONFIG, "dataloader.evaluator.tasks=[keypoints]", "dataloader.evaluator.tasks=['keypoints']: COCO's "
     "evaluation scores the tasks the model predicts, and this model predicts bbox, segm"),
    (LAZY_CONFIG, "dataloader.evaluator.tasks=bbox", "dataloader.evaluator.tasks='bbox': COCO's evaluation"),
    (REPO / "configs" / "LazyConfig" / "mask_rcnn_R_50_FPN_gw.py",
     "dataloader.test.dataset.names=[coco_2017_val,coco_2017_train]",
     "dataloader.evaluator.dataset_name is ['coco_2017_val', 'coco_2017_train'] (the names of "
     "dataloader.test.dataset.names), but detectron2's COCOEvaluator evaluates one dataset"),
])
def test_lazy_evaluators_that_would_fail_after_training_are_refused_first(config, override, message):
    from gwdet.engine.lazy import LazyRun

    for eval_only in (True, False):
        with pytest.raises(ValueError) as refused:
            LazyRun.load(str(config), [override]).check_request(eval_only=eval_only, world_size=1)
        assert message in str(refused.value)
    LazyRun.load(str(LAZY_CONFIG), ["dataloader.evaluator.tasks=[bbox,segm]"]).check_request(False, 1)


def test_lazy_milestones_in_other_units_than_iterations_are_warned_of():
    # milestones=[5] with train.max_iter=10 stepped at iteration 1: they count in units of num_updates (1000)
    from gwdet.engine.lazy import LazyRun

    with logged_warnings("gwdet.engine.lazy_checks") as logged:
        LazyRun.load(str(LAZY_CONFIG), ["train.max_iter=10", "lr_multiplier.scheduler.milestones=[5]",
                                        "lr_multiplier.scheduler.values=[1.0,0.1]"]).check_request(False, 1)
        LazyRun.load(str(LAZY_CONFIG)).check_request(False, 1)  # num_updates is train.max_iter: no word
        # a milestone below 1 in iterations: the first value is never used (the words do not blame num_updates)
        LazyRun.load(str(LAZY_CONFIG), ["train.max_iter=10", "lr_multiplier.scheduler.num_updates=10",
                                        "lr_multiplier.scheduler.milestones=[0.5,5]",
                                        "lr_multiplier.scheduler.values=[1.0,0.1,0.01]"]).check_request(False, 1)
    assert logged == [
        "lr_multiplier.scheduler.num_updates=1000 is not train.max_iter=10: detectron2's LRMultiplier gives the "
        "scheduler the fraction of train.max_iter done, so its milestones [5] (in units of num_updates) fall at "
        "iterations 0.05. Give num_updates=${train.max_iter} (or 10) for milestones in iterations.",
        "lr_multiplier.scheduler.milestones [0.5, 5] hold a milestone before the first iteration: the scheduler's step "
        "there acts from the start of training, so its first value is never used. Remove that milestone, or give the "
        "milestones as iterations from 1 to train.max_iter=10."]


@pytest.mark.parametrize("node, scheduler, problem", [
    # a raw IndexError after the last iteration (the yacs twin was refused)
    ("lr_multiplier.scheduler", "StepWithFixedGammaParamScheduler(base_value=1.0, num_decays=2, gamma=0.1, "
     "num_updates=1000)", "lr_multiplier.scheduler is fvcore's StepWithFixedGammaParamScheduler, which stops the "
     "training after its last iteration"),
    # trained with a negative learning rate without a word (the yacs twin, SOLVER.BASE_LR_END, was refused)
    ("lr_multiplier.scheduler", "CosineParamScheduler(start_value=1.0, end_value=-0.5)",
     "lr_multiplier.scheduler gives the factor -0.00183529 of optimizer.lr at iteration 609 of train.max_iter=1000, "
     "and a negative factor turns the learning rate negative"),
    ("lr_multiplier.scheduler", "CosineParamScheduler(start_value=1.0, end_value=2.0)",  # a warning: the rate rises
     None),
    ("lr_multiplier.scheduler", "CosineParamScheduler(start_value=float('nan'), end_value=0.0)",  # not "negative"
     "and a factor that is no number makes the learning rate none: give factors of at least 0"),
    # set as lr_multiplier itself, the checks read lr_multiplier.scheduler only: these trained with a negative or
    # rising rate, or failed at the end
    ("lr_multiplier", "LinearParamScheduler(start_value=1.0, end_value=-1.0)",
     "lr_multiplier gives the factor -0.002 of optimizer.lr at iteration 501 of train.max_iter=1000"),
    # a constant rate: trained every iteration, then fvcore's raw RuntimeError, no model_final.pth
    ("lr_multiplier", "ConstantParamScheduler(value=1.0)", "lr_multiplier fails after the last iteration of "
     "train.max_iter=1000 (RuntimeError: where in ParamScheduler must be in [0, 1]: got 1.0)"),
    ("lr_multiplier", "StepWithFixedGammaParamScheduler(base_value=1.0, num_decays=2, gamma=0.1, num_updates=1000)",
     "lr_multiplier is fvcore's StepWithFixedGammaParamScheduler"),
    ("lr_multiplier", "MultiStepParamScheduler(values=[1.0, 0.0], milestones=[500], num_updates=1000)",
     "lr_multiplier.values=[1.0, 0.0]: each value multiplies the learning rate"),
    ("lr_multiplier", "ExponentialParamScheduler(start_value=1.0, decay=50)", None),  # a warning: the rate rises
])
def test_lazy_schedules_that_fail_or_turn_the_rate_negative_are_refused(tmp_path, node, scheduler, problem):
    from gwdet.engine.lazy import LazyRun

    config = tmp_path / "schedule.py"
    config.write_text(f"from detectron2.config import LazyConfig, LazyCall as L\n"
                      f"from fvcore.common.param_scheduler import {scheduler.split('(')[0]}\n"
                      f"_base = LazyConfig.load({str(LAZY_CONFIG)!r})\n"
                      "globals().update(_base)\n"
                      f"{node} = L({scheduler.split('(')[0]})({scheduler.split('(', 1)[1]}\n")
    run = LazyRun.load(str(config))
    if problem is None:
        with logged_warnings("gwdet.engine.lazy_checks") as logged:
            run.check_request(False, 1)
        rise = ("from 1.02447 at iteration 100 to 2 at iteration 1000" if node == "lr_multiplier.scheduler" else
                "from 1 at iteration 0 to 50 at iteration 1000")
        assert logged == [f"{node}'s factors of optimizer.lr rise ({rise}): the learning rate grows during the run; give "
                          "falling factors (e.g. [1.0, 0.1, 0.01]) to lower it."]
        return
    with pytest.raises(ValueError, match=re.escape(problem)):
        run.check_request(False, 1)


@pytest.mark.parametrize("device", ["xyz", "mps"])
def test_benchmark_refuses_a_device_it_cannot_measure(capsys, device):
    from gwdet_lab.benchmark.cli import parse_args

    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--device", device])
    assert exit_info.value.code == 2 and f"argument --device: {device!r}" in capsys.readouterr().err


RETINANET = ["MODEL.META_ARCHITECTURE", "GWRetinaNet", "MODEL.BACKBONE.NAME", "build_gw_retinanet_resnet_fpn_backbone",
             "MODEL.RETINANET.NUM_CLASSES", "4", "MODEL.MASK_ON", "False"]


# RetinaNet's head norm was not among the keys checked (its FrozenBN layers stayed identities)
@pytest.mark.parametrize("opts", [["MODEL.RESNETS.NORM", "FrozenBN"], ["MODEL.RESNETS.GW_NORM", "FrozenBN"],
                                  ["MODEL.RETINANET.NORM", "FrozenBN", *RETINANET]])
def test_frozen_norms_trained_from_scratch_are_refused(opts):
    from gwdet.engine.trainer import check_training_values
    from gwdet.model_zoo import build_config

    with pytest.raises(ValueError, match=rf"{opts[0]} is FrozenBN, .* MODEL.WEIGHTS is empty"):
        check_training_values(build_config(str(DEMO_CONFIG), [*opts, "MODEL.WEIGHTS", ""]), 1)
    check_training_values(build_config(str(DEMO_CONFIG), [*opts, "MODEL.WEIGHTS", "weights.pkl"]), 1)
    if opts[0] == "MODEL.RESNETS.GW_NORM":  # a GW_NORM at no position builds nothing
        check_training_values(build_config(str(DEMO_CONFIG), [*opts, "MODEL.RESNETS.GW_POSITIONS", ""]), 1)


@pytest.mark.parametrize("norm", ["BGN", "BW"])
def test_frozen_stages_whose_norms_detectron2_cannot_freeze_are_refused(norm):
    # their running statistics went on changing in train() while the stages were "frozen"
    from gwdet.engine.trainer import check_training_values
    from gwdet.model_zoo import build_config

    opts = ["MODEL.RESNETS.NORM", norm, "MODEL.BW.GROUP_SIZE", "8", "MODEL.WEIGHTS", "weights.pkl"]
    with pytest.raises(ValueError, match=rf"MODEL.BACKBONE.FREEZE_AT is 2, but the frozen stages' norms of "
                                         rf"MODEL.RESNETS.NORM \({norm}\) keep running statistics"):
        check_training_values(build_config(str(DEMO_CONFIG), [*opts, "MODEL.BACKBONE.FREEZE_AT", "2"]), 1)
    check_training_values(build_config(str(DEMO_CONFIG), [*opts, "MODEL.BACKBONE.FREEZE_AT", "0"]), 1)
    check_training_values(build_config(str(DEMO_CONFIG), ["MODEL.RESNETS.NORM", "BN", "MODEL.WEIGHTS", "w.pkl",
                                                          "MODEL.BACKBONE.FREEZE_AT", "2"]), 1)  # BN becomes FrozenBN
    # FREEZE_AT 1 freezes the stem only, whose norm is GW_NORM with GW at S1 (the demo's S1-B2), else
    # RESNETS.NORM: refused before whatever norm the stem held
    check_training_values(build_config(str(DEMO_CONFIG), [*opts, "MODEL.BACKBONE.FREEZE_AT", "1"]), 1)
    stem_only = ["MODEL.RESNETS.GW_NORM", norm, "MODEL.RESNETS.GW_POSITIONS", "B2", "MODEL.BW.GROUP_SIZE", "8",
                 "MODEL.WEIGHTS", "weights.pkl", "MODEL.BACKBONE.FREEZE_AT"]
    check_training_values(build_config(str(DEMO_CONFIG), [*stem_only, "1"]), 1)
    with pytest.raises(ValueError, match=rf"norms of MODEL.RESNETS.GW_NORM \({norm}\) keep running statistics"):
        check_training_values(build_config(str(DEMO_CONFIG), [*stem_only, "2"]), 1)


@pytest.mark.skipif(not __import__("os").path.exists("/dev/full"), reason="needs /dev/full (Linux), a device that is always full")
def test_an_export_into_a_full_disk_is_a_one_line_error():
    import torch

    from gwdet.errors import GwdetOSError
    from gwdet.export.deploy import save_script_module

    with pytest.raises(GwdetOSError, match=r"Cannot write the export \(.* MiB\) to /dev/full: .*Free space there"):
        save_script_module(torch.jit.script(torch.nn.Linear(2, 2)), "/dev/full")


def test_a_head_norm_without_convolutions_is_warned_about():
    import gwdet
    from gwdet.model_zoo import build_config

    from conftest import TINY_OPTS

    with logged_warnings("gwdet.modeling.heads") as messages:
        gwdet.build_model(build_config(str(DEMO_CONFIG), [*TINY_OPTS, "MODEL.DEVICE", "cpu"]))
        assert messages == []  # the demo's heads have convolutions for their GW
        gwdet.build_model(build_config(str(DEMO_CONFIG), [*TINY_OPTS, "MODEL.DEVICE", "cpu",
                                                          "MODEL.ROI_BOX_HEAD.NUM_CONV", "0"]))
    assert messages == ["MODEL.ROI_BOX_HEAD.NORM is 'GW', but MODEL.ROI_BOX_HEAD.NUM_CONV is 0: the head has no "
                        "convolution to normalize, so the model has no GW there. Give the head convolutions "
                        "(MODEL.ROI_BOX_HEAD.NUM_CONV, e.g. 4 for a 4conv1fc box head) or set "
                        "MODEL.ROI_BOX_HEAD.NORM \"\"."]


def test_a_norm_for_a_part_the_model_does_not_build_is_warned_about():
    # before: MODEL.ROI_MASK_HEAD.NORM 'BW' without MODEL.MASK_ON (or a box-head NORM of a C4 model)
    # was accepted without a word, and no such layer was built
    from gwdet.model_zoo import build_config

    with logged_warnings("gwdet.config_checks") as messages:
        build_config(str(DEMO_CONFIG))  # a mask head, with the GW its NORM names
        assert messages == []
        build_config(str(DEMO_CONFIG), ["MODEL.MASK_ON", "False", "MODEL.ROI_MASK_HEAD.NORM", "BW"])
        build_config(str(DEMO_CONFIG), ["MODEL.ROI_HEADS.NAME", "Res5ROIHeads", "MODEL.ROI_BOX_HEAD.NORM", "GN"])
        build_config(str(DEMO_CONFIG), ["MODEL.BACKBONE.NAME", "build_gw_resnet_backbone", "MODEL.FPN.NORM", "BW",
                                        "MODEL.ROI_HEADS.NAME", "GWRes5ROIHeads", "MODEL.ROI_BOX_HEAD.NORM", ""])
    assert messages[-1] == ("MODEL.FPN.NORM is 'BW', but the model has no FPN (MODEL.BACKBONE.NAME is "
                            "'build_gw_resnet_backbone'): no BW is built there. Set MODEL.FPN.NORM \"\" or build an "
                            "FPN backbone.")
    assert messages[0] == ("MODEL.ROI_MASK_HEAD.NORM is 'BW', but the model has no mask head (MODEL.MASK_ON is "
                           "False): no BW is built there. Set MODEL.ROI_MASK_HEAD.NORM \"\" or build that part.")
    assert messages[1].startswith("MODEL.ROI_BOX_HEAD.NORM is 'GN', but the model has no box head (MODEL.ROI_HEADS."
                                  "NAME is 'Res5ROIHeads', whose res5 stage is the box head)")
    # a meta-architecture without ROI heads: that is the reason (before: "MODEL.MASK_ON is False" with it True)
    with logged_warnings("gwdet.config_checks") as messages:
        build_config(str(DEMO_CONFIG), ["MODEL.META_ARCHITECTURE", "ProposalNetwork", "MODEL.ROI_BOX_HEAD.NORM", "GN"])
    assert any(line.startswith("MODEL.ROI_BOX_HEAD.NORM is 'GN', but the model has no box head (MODEL.META_ARCHITECTURE "
                               "is 'ProposalNetwork', which builds no ROI heads)") for line in messages), messages
    # RetinaNet's NORM in an R-CNN, GW_NORM without GW_POSITIONS: ignored without a word
    with logged_warnings("gwdet.config_checks") as messages:
        build_config(str(DEMO_CONFIG), ["MODEL.RETINANET.NORM", "GW"])
        build_config(str(DEMO_CONFIG), ["MODEL.RESNETS.GW_POSITIONS", "", "MODEL.RESNETS.GW_NORM", "GW_ZCA"])
    assert [line.split(":")[0] for line in messages] == [
        "MODEL.RETINANET.NORM is 'GW', but the model has no RetinaNet head (MODEL.META_ARCHITECTURE is "
        "'GeneralizedRCNN')", "MODEL.RESNETS.GW_NORM is 'GW_ZCA', but MODEL.RESNETS.GW_POSITIONS is empty"]


def test_test_loaders_check_their_images_as_train_loaders_do():
    import torch

    from gwdet.data import prepare_datasets
    from gwdet.data.finite_images import FiniteImageBatches, NonFiniteImageError
    from gwdet.engine.lazy import LazyRun
    from gwdet.engine.trainer import Trainer
    from gwdet.model_zoo import build_config

    from conftest import TINY_OPTS

    cfg = build_config(str(DEMO_CONFIG), TINY_OPTS)
    prepare_datasets(cfg)
    loader = Trainer.build_test_loader(cfg, "shapes_val")
    assert isinstance(loader, FiniteImageBatches) and len(loader) == 4  # inference_on_dataset reads len()
    assert isinstance(LazyRun.load(str(LAZY_CONFIG), ["dataloader.test.num_workers=0"]).test_loader(), FiniteImageBatches)
    image = torch.zeros(3, 8, 8)
    image[1, 2, 3] = float("nan")
    with pytest.raises(NonFiniteImageError, match=r"file_name 'x.npy' has pixels that are not finite.*before training or "
                                                  r"evaluating on it"):
        next(iter(FiniteImageBatches([[{"image": image, "file_name": "x.npy"}]])))


def test_required_flags_may_follow_the_overrides_and_each_flag_is_read_once(tmp_path, monkeypatch):
    from gwdet.data import coco_registration
    from gwdet.engine.arguments import argument_parser

    from test_coco_sweep_checks import write_dataset

    args = parse_with_trailing_flags(export_model.argument_parser(),
                                     ["--config-file", "c.yaml", "MODEL.DEVICE", "cpu", "--output", "out"])
    assert args.output == "out" and args.opts == ["MODEL.DEVICE", "cpu"]
    # A dataset's JSON is inspected once, also when a flag after the overrides moves the flags.
    inspected = []
    original = coco_registration.CocoDataset.inspected
    monkeypatch.setattr(coco_registration.CocoDataset, "inspected",
                        lambda dataset: inspected.append(dataset.name) or original(dataset))
    args = parse_with_trailing_flags(argument_parser(), [
        "--config-file", "c.yaml", "--register-coco", f"once_mine={write_dataset(tmp_path / 'mine')}",
        "--threads", "1", "SOLVER.MAX_ITER", "2", "--resume", "--num-gpus", "1"])
    assert inspected == ["once_mine"] and args.resume and args.threads == 1
    assert args.opts == ["SOLVER.MAX_ITER", "2"] and [d.name for d in args.register_coco] == ["once_mine"]


def test_export_refuses_an_empty_output_and_a_tolerance_that_accepts_any_export(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        export_model.main(["--config-file", str(DEMO_CONFIG), "--output", ""])
    assert exit_info.value.code == 2 and "--output is empty: give the folder" in capsys.readouterr().err
    for tolerance in ("1", "1e9", "0", "nan"):
        with pytest.raises(SystemExit):
            export_model.argument_parser().parse_args(["--config-file", "c.yaml", "--output", "o",
                                                       "--tolerance", tolerance])
        assert "give a number above 0 and below 1" in capsys.readouterr().err


def test_a_list_flag_before_the_overrides_stops_at_the_first_word_outside_its_choices():
    analyze = analyze_model.argument_parser()
    for between in ([], ["--"]):
        args = parse_with_trailing_flags(analyze, ["--config-file", "c.yaml", "--tasks", "parameter", *between,
                                                   "MODEL.WEIGHTS", "w"])
        assert args.tasks == ["parameter"] and args.opts == ["MODEL.WEIGHTS", "w"]


@pytest.mark.parametrize("word", ["speed", "MODEL.WEIGHTS"])
def test_a_list_flag_without_one_valid_value_names_the_word_it_got(capsys, word):
    # before: "--tasks speed KEY VALUE" took 'speed' for the first override and said that --tasks
    # expected at least one argument, which it had been given
    with pytest.raises(SystemExit) as refused:
        parse_with_trailing_flags(analyze_model.argument_parser(),
                                  ["--config-file", "c.yaml", "--tasks", word, "MODEL.WEIGHTS", "w"])
    assert refused.value.code == 2
    assert f"argument --tasks: invalid choice: '{word}' (choose from 'flop', 'parameter', 'structure')" in \
        capsys.readouterr().err


def test_analyze_refuses_flops_without_test_images_or_an_input_size(capsys):
    with pytest.raises(SystemExit) as exit_info:
        analyze_model.main(["--config-file", str(DEMO_CONFIG), "--tasks", "flop", "DATASETS.TEST", "()"])
    assert exit_info.value.code == 2
    assert "--tasks flop counts on images of the config's first test dataset, and the config has none: give " \
           "--input-size H W" in capsys.readouterr().err


def test_analyze_refuses_flops_of_a_model_on_the_meta_device(capsys):
    # before: a TypeError traceback from inside the model once the counting ran
    with pytest.raises(SystemExit) as exit_info:
        analyze_model.main(["--config-file", str(DEMO_CONFIG), "--tasks", "flop", "--input-size", "64", "64",
                            "MODEL.DEVICE", "meta"])
    assert exit_info.value.code == 2
    assert ("--tasks flop runs the model on images, and the config puts it on the meta device, whose tensors hold no "
            "values: set the device to cpu") in capsys.readouterr().err
    assert analyze_model.main(["--config-file", str(DEMO_CONFIG), "--tasks", "parameter", "MODEL.DEVICE", "meta"]) == 0


@pytest.mark.parametrize("content, message", [
    ("cut", r"cannot be read: it is damaged or cut short \((RuntimeError|EOFError|UnpicklingError): .*\); nothing "
            r"was loaded from it\. Restore the file from a copy or write it again"),
    ("tensor", r"holds a Tensor, not a checkpoint: a dict of weights .* Save the model's state_dict\(\) instead\."),
    ("pickle", r"holds no weights: its weights hold values that are neither tensors nor arrays, 'foo' \(int\)\. "
               r"Check the path"),
])
def test_weights_that_are_cut_short_or_hold_no_weights_are_named(content, message, tmp_path):
    import pickle

    import torch

    from gwdet.checkpoint.resilient import ResilientCheckpointer

    if content == "cut":
        path = tmp_path / "model_final.pth"
        torch.save({"model": {"weight": torch.zeros(4, 4)}}, path)
        path.write_bytes(path.read_bytes()[:300])
    elif content == "tensor":
        path = tmp_path / "tensor.pth"
        torch.save(torch.zeros(3), path)
    else:
        path = tmp_path / "weights.pkl"
        path.write_bytes(pickle.dumps({"foo": 1}))
    checkpointer = ResilientCheckpointer(torch.nn.Linear(4, 4), save_dir=str(tmp_path / "run"))
    with pytest.raises(ValueError, match=message):
        checkpointer.load_weights(str(path))


@pytest.mark.parametrize("variable", ["GWDET_ALLOW_NORM_MISMATCH", "GWDET_ALLOW_UNSAFE_PICKLE"])
def test_an_opt_in_variable_other_than_1_or_0_is_named_not_read_as_no(variable, monkeypatch):
    from gwdet.checkpoint import resilient

    allowed = {"GWDET_ALLOW_NORM_MISMATCH": resilient.mismatch_allowed,
               "GWDET_ALLOW_UNSAFE_PICKLE": resilient.unsafe_pickle_allowed}[variable]
    for value, expected in (("1", True), ("0", False), ("", False)):
        monkeypatch.setenv(variable, value)
        assert allowed() is expected
    monkeypatch.setenv(variable, "true")
    with pytest.raises(ValueError, match=rf"{variable}='true' is neither 1 nor 0: set {variable}=1 to .*, or unset it"):
        allowed()


def test_initial_or_evaluated_weights_holding_nan_are_refused_naming_the_tensors(tmp_path):
    import torch

    from gwdet.checkpoint.resilient import ResilientCheckpointer

    weights = {"weight": torch.ones(4, 4), "bias": torch.zeros(4)}
    weights["weight"][1, 2] = float("nan")
    torch.save({"model": weights}, tmp_path / "diverged.pth")
    checkpointer = ResilientCheckpointer(torch.nn.Linear(4, 4), save_dir=str(tmp_path / "run"))
    with pytest.raises(ValueError, match=r"MODEL.WEIGHTS .*diverged.pth holds NaN or infinite values in 1 tensor\(s\) "
                                         r"\(weight\): a model built from them computes NaN"):
        checkpointer.load_weights(str(tmp_path / "diverged.pth"))
    # a state dict of a model on the meta device: a raw "Tensor.item() cannot be called on meta tensors"
    torch.save({"model": {name: value.to("meta") for name, value in weights.items()}}, tmp_path / "meta.pth")
    with pytest.raises(ValueError, match=r"MODEL.WEIGHTS .*meta.pth: its tensors hold no values \(2 on the meta "
                                         r"device, e.g. 'weight'\): the state dict of a model built on"):
        checkpointer.load_weights(str(tmp_path / "meta.pth"))


def test_a_damaged_sha256_record_beside_an_intact_checkpoint_is_named_and_the_checkpoint_loaded(tmp_path, caplog):
    # it was called a damaged checkpoint, and a resume skipped it for an older one
    import torch

    from gwdet.checkpoint.resilient import ResilientCheckpointer

    model = torch.nn.Linear(4, 4)
    ResilientCheckpointer(model, save_dir=str(tmp_path)).save("model_final")
    record = tmp_path / "model_final.pth.sha256"
    record.write_text("not a record\n")
    loader = ResilientCheckpointer(torch.nn.Linear(4, 4), save_dir=str(tmp_path / "other"))
    with caplog.at_level("WARNING"):
        loader.load_weights(str(tmp_path / "model_final.pth"))
    assert torch.equal(loader.model.weight, model.weight)
    assert (f"{tmp_path / 'model_final.pth'}: its checksum record model_final.pth.sha256 is damaged, so the file is "
            "checked by the checksums recorded inside it only. Delete model_final.pth.sha256") in caplog.text
    record.write_text("0" * 64 + "  model_final.pth\n")  # a record that does not match: the file is refused
    with pytest.raises(ValueError, match=r"model_final.pth is damaged \(its SHA-256 differs from the one recorded"):
        loader.load_weights(str(tmp_path / "model_final.pth"))


def test_export_refuses_random_weights_unless_asked_and_untrained_beside_weights(capsys, tmp_path):
    assert export(capsys, tmp_path).split(": error: ")[1] == (
        "MODEL.WEIGHTS is empty: the export would hold a model of random weights, not a "
        "trained one; nothing was written. Give the trained weights (MODEL.WEIGHTS output/demo/model_final.pth), "
        "or pass --untrained to export random weights on purpose.")
    weights = tmp_path / "model_final.pth"
    assert export(capsys, tmp_path, "--untrained", "MODEL.WEIGHTS", str(weights)).split(": error: ")[1] == (
        f"--untrained exports random weights, but the config gives MODEL.WEIGHTS {weights}; "
        "nothing was written. Leave --untrained out to export those weights.")
    # a run's config.yaml given (OUTPUT_DIR holding its model_final.pth): the fixed example output/demo/model_final.pth
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "model_final.pth").write_bytes(b"")
    assert (f"Give the trained weights (MODEL.WEIGHTS {tmp_path / 'run' / 'model_final.pth'}), or pass --untrained"
            in export(capsys, tmp_path, "OUTPUT_DIR", str(tmp_path / "run")))


@pytest.mark.parametrize("architecture", [
    ["MODEL.META_ARCHITECTURE", "GWRetinaNet", "MODEL.BACKBONE.NAME", "build_gw_retinanet_resnet_fpn_backbone",
     "MODEL.RETINANET.NORM", "BGN", "MODEL.RETINANET.NUM_CLASSES", "4", "MODEL.RETINANET.SCORE_THRESH_TEST", "0.0"],
    ["MODEL.META_ARCHITECTURE", "ProposalNetwork"],
], ids=["GWRetinaNet", "ProposalNetwork"])
def test_the_export_tool_exports_the_detectors_without_an_rcnn_inference(capsys, tmp_path, architecture):
    # a raw AttributeError: 'GWRetinaNet' object has no attribute 'inference' where the sample's
    # detections were counted
    from conftest import TINY_OPTS

    out = tmp_path / "out"
    export_model.main(["--config-file", str(DEMO_CONFIG), "--untrained", "--output", str(out), *TINY_OPTS,
                       "MODEL.MASK_ON", "False", *architecture])
    printed = capsys.readouterr().out
    assert (out / "model.ts").is_file() and f"Exported {out / 'model.ts'}" in printed
    # which channel order the exported model takes: nothing said it (a BGR image gave other detections)
    if "GWRetinaNet" in architecture:  # a model with an input format (detectron2's ProposalNetwork has none)
        assert "The exported model takes an image as a uint8 (C, H, W) tensor of 0-255 pixel values (the type it " \
               "was exported with) with the channels in RGB order" in printed


def test_export_refuses_weights_trained_on_another_channel_order_than_the_config_gives(capsys, tmp_path):
    # the export's last line named the config's BGR for RGB-trained weights: fed BGR as told, the
    # deployed model gets the channels swapped from what its weights learned
    import gwdet
    from gwdet.checkpoint.resilient import ResilientCheckpointer
    from gwdet.model_zoo import build_config

    model = gwdet.build_model(build_config(str(DEMO_CONFIG), ["MODEL.DEVICE", "cpu"]))
    assert model.input_format == "RGB"
    ResilientCheckpointer(model, save_dir=str(tmp_path)).save("model_final")
    weights = tmp_path / "model_final.pth"
    assert export(capsys, tmp_path, "MODEL.WEIGHTS", str(weights), "INPUT.FORMAT", "BGR").split(": error: ")[1] == (
        f"INPUT.FORMAT: MODEL.WEIGHTS {weights} was trained on images in RGB channel order, and this config gives "
        "'BGR'. The exported model computes the same function either way (the format only tells a loader how to "
        "read image files), so its users would be told the wrong channel order; nothing was written. Set "
        "INPUT.FORMAT to 'RGB' for the export.")


def test_export_refuses_weights_trained_with_other_pixel_values_and_analyze_names_random_weights(capsys, tmp_path):
    # another MODEL.PIXEL_STD: a warning among ~400 lines, then "Exported ...; 100 matched" and exit 0: the
    # export's check compared the file with the same mis-set model
    import gwdet
    import torch
    from gwdet.checkpoint.resilient import ResilientCheckpointer
    from gwdet.model_zoo import build_config

    model = gwdet.build_model(build_config(str(DEMO_CONFIG), ["MODEL.DEVICE", "cpu"]))
    ResilientCheckpointer(model, save_dir=str(tmp_path)).save("model_final")
    weights = tmp_path / "model_final.pth"
    trained_std = [round(v, 3) for v in model.pixel_std.flatten().tolist()]
    refusal = export(capsys, tmp_path, "MODEL.WEIGHTS", str(weights), "MODEL.PIXEL_STD", "[1.0, 1.0, 1.0]")
    assert refusal.split(": error: ")[1].startswith(
        f"MODEL.WEIGHTS {weights} was trained with values this model has otherwise: pixel_std ")
    assert "another function than the one trained" in refusal and "nothing was written" in refusal
    assert str(trained_std[0]) in refusal and not (tmp_path / "out").exists()
    # backbone weights only: the analyze tool counts flops, it evaluates nothing, and counting a
    # model of random weights is its documented use
    state = {name: value for name, value in model.state_dict().items() if name.startswith("backbone.")}
    torch.save({"model": state}, tmp_path / "backbone.pth")
    with pytest.raises(SystemExit):
        analyze_model.main(["--config-file", str(DEMO_CONFIG), "--tasks", "flop", "--input-size", "64", "64",
                            "MODEL.DEVICE", "cpu", "MODEL.WEIGHTS", str(tmp_path / "backbone.pth")])
    err = capsys.readouterr().err
    assert "does not hold every weight of the model" in err and "evaluating" not in err
    assert 'the flops it counts would be those of a partly random model' in err
    assert 'set MODEL.WEIGHTS "" to count a model of random weights on purpose' in err


@pytest.mark.parametrize("norm", ["SyncBN", "naiveSyncBN"])
def test_export_by_scripting_refuses_synchronized_batch_norm_by_name(capsys, tmp_path, norm):
    # a raw 469-line TorchScript traceback, after the model was built and run on the sample
    refusal = export(capsys, tmp_path, "--untrained", "--export-method", "scripting", "MODEL.FPN.NORM", norm)
    assert refusal.split(": error: ")[1].startswith(
        "--export-method scripting: the model has synchronized batch norm layers (backbone.fpn_lateral2.norm, ")
    assert "Export with --export-method tracing (the default), or set those NORM keys to BN or FrozenBN" in refusal


def test_export_refuses_the_meta_device_before_reading_weights(capsys, tmp_path):
    # 878 lines of "copying from a non-meta parameter ... is a no-op", then "Tensor.item() cannot be
    # called on meta tensors"
    refusal = export(capsys, tmp_path, "--untrained", "MODEL.DEVICE", "meta")
    assert refusal.split(": error: ")[1].startswith(
        "The export runs the model on a sample image (to trace it and to check the exported file), and the config "
        "puts it on the meta device")


# before: "the following arguments are required: OUT", the input file -r50.pth having been taken for a flag
def test_a_file_whose_name_starts_with_a_dash_is_named_with_the_way_to_give_it(tmp_path, capsys, monkeypatch):
    from gwdet.convert.cli import main as convert

    monkeypatch.chdir(tmp_path)
    (tmp_path / "-r50.pth").write_bytes(b"")
    with pytest.raises(SystemExit):
        convert(["-r50.pth", "out/m.pkl"])
    assert ("error: the following arguments are required: OUT (-r50.pth is a file, read as a flag because its name "
            "starts with '-': put -- before file names that start with '-' (-- -r50.pth ...), or give it as "
            "./-r50.pth)") in capsys.readouterr().err
    with pytest.raises(SystemExit):
        export_model.main(["--config-file", "-r50.pth", "--output", str(tmp_path / "ex")])
    assert "(-r50.pth is a file, read as a flag because its name starts with '-': give it as ./-r50.pth)" in (
        capsys.readouterr().err)
    # a name of no file yet (an output) where argparse misses a positional: named too (before: argparse's message
    # alone, "OUT" being required though it was given)
    with pytest.raises(SystemExit):
        convert(["r50.pth", "-x.pkl"])
    assert capsys.readouterr().err.rstrip().endswith(
        "error: the following arguments are required: OUT (-x.pkl was read as a flag, of which there is none, because "
        "it starts with '-'; for a file name, put -- before file names that start with '-' (-- -x.pkl ...), or give "
        "it as ./-x.pkl)")
    with pytest.raises(SystemExit):
        convert(["r50.pth", "out/m.pkl", "--overwirte"])  # a misspelt flag: argparse's message alone
    assert capsys.readouterr().err.rstrip().endswith("error: unrecognized arguments: --overwirte")
