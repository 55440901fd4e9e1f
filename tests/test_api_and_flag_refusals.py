"""Refusals of the Python API and the tools' flags that name the problem and the fix: a config that
is not a yacs CfgNode, a norm name that differs from a built-in only in case, a device string
PyTorch does not know, an unknown flag ahead of the config overrides, a list flag among them, and an
export folder that cannot be written; and ``--register-coco`` on the export and analyze tools."""
import re

import pytest
import torch

import gwdet
from gwdet.utils.command_line import parse_with_trailing_flags
from gwdet.errors import GwdetTypeError, GwdetValueError
from gwdet.export import analyze_model, export_model
from gwdet.modeling.build import check_device
from gwdet.norms import unregister_norm

from conftest import DEMO_CONFIG, REPO


def test_build_model_names_what_it_was_given_instead_of_a_cfgnode():
    from detectron2.config import LazyConfig

    with pytest.raises(GwdetTypeError, match="needs a detectron2 CfgNode .* got NoneType"):
        gwdet.build_model(None)
    lazy = LazyConfig.load(str(REPO / "configs" / "LazyConfig" / "mask_rcnn_R_50_FPN_gw_shapes.py"))
    with pytest.raises(GwdetTypeError, match=r"got a LazyConfig .*instantiate\(cfg.model\)"):
        gwdet.build_model(lazy)


@pytest.mark.parametrize("name, builtin", [("gw", "GW"), ("frozenbn", "FrozenBN"), ("Bgn", "BGN")])
def test_a_norm_name_equal_to_a_builtin_up_to_case_is_refused(name, builtin):
    with pytest.raises(GwdetValueError, match=f"{name!r} differs from the built-in norm name {builtin!r} only in case"):
        gwdet.register_norm(name, lambda channels: torch.nn.GroupNorm(2, channels))
    with pytest.raises(KeyError):  # nothing was registered
        gwdet.norm(name)


def test_a_name_that_differs_in_more_than_case_is_registered():
    gwdet.register_norm("gw_mine", lambda channels: torch.nn.GroupNorm(2, channels))
    try:
        assert isinstance(gwdet.norm("gw_mine")(4), torch.nn.GroupNorm)
    finally:
        unregister_norm("gw_mine")


@pytest.mark.parametrize("device", ["CPU", "gpu", "cuda0"])
def test_a_device_pytorch_does_not_know_is_named_with_its_setting(device):
    with pytest.raises(GwdetValueError, match=f"MODEL.DEVICE is {device!r}, which is not a PyTorch device"):
        check_device(device)
    with pytest.raises(GwdetValueError, match=f"train.device is {device!r}"):
        check_device(device, "train.device")
    check_device("cpu")


def test_an_unknown_flag_is_named_not_taken_as_the_start_of_the_overrides(capsys):
    parser = export_model.argument_parser()
    with pytest.raises(SystemExit):
        parse_with_trailing_flags(parser, ["--config-file", "c.yaml", "--bogus", "x", "--output", "out"])
    err = capsys.readouterr().err
    assert "unknown flag '--bogus'" in err and "required" not in err, err
    args = parse_with_trailing_flags(parser, ["--config", "c.yaml", "--out", "o", "--overw"])  # prefixes still work
    assert args.config_file == "c.yaml" and args.output == "o" and args.overwrite


def test_a_short_flag_after_the_overrides_is_read_as_a_flag(capsys):
    # before: "-h" or "-v" there ended in "the overrides have a key without its value"
    analyze = analyze_model.argument_parser()
    args = parse_with_trailing_flags(analyze, ["--config-file", "c.yaml", "MODEL.DEVICE", "cpu", "-n", "2",
                                               "SOLVER.BASE_LR", "-inf"])
    assert args.num_inputs == 2 and args.opts == ["MODEL.DEVICE", "cpu", "SOLVER.BASE_LR", "-inf"]
    with pytest.raises(SystemExit):
        parse_with_trailing_flags(analyze, ["--config-file", "c.yaml", "MODEL.DEVICE", "cpu", "-v"])
    assert "unknown flag '-v'; see --help for the flags of this tool" in capsys.readouterr().err
    with pytest.raises(SystemExit) as shown:
        parse_with_trailing_flags(analyze, ["--config-file", "c.yaml", "MODEL.DEVICE", "cpu", "-h"])
    assert shown.value.code == 0 and "usage:" in capsys.readouterr().out


def test_the_advice_for_a_list_flag_among_the_overrides_can_be_followed(capsys):
    analyze = analyze_model.argument_parser()
    with pytest.raises(SystemExit):
        parse_with_trailing_flags(analyze, ["--config-file", "c.yaml", "MODEL.DEVICE", "cpu", "--tasks", "flop"])
    assert "put it before another flag" in capsys.readouterr().err
    args = parse_with_trailing_flags(analyze, ["--tasks", "flop", "--config-file", "c.yaml", "MODEL.DEVICE", "cpu"])
    assert args.tasks == ["flop"] and args.opts == ["MODEL.DEVICE", "cpu"]


def test_export_refuses_an_output_below_a_file_before_building(capsys, tmp_path):
    (tmp_path / "file").write_text("mine")
    with pytest.raises(SystemExit) as exit_info:
        export_model.main(["--config-file", str(DEMO_CONFIG), "--output", str(tmp_path / "file" / "sub")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and f"{tmp_path / 'file'} is a file, so no folder can be created below it" in err
    assert (tmp_path / "file").read_text() == "mine"


@pytest.mark.parametrize("tool, flags", [(export_model, ["--output", "o"]), (analyze_model, [])])
def test_the_export_and_analyze_tools_take_register_coco(tool, flags, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:  # read and checked as the flag is read, as in the train tool
        parse_with_trailing_flags(tool.argument_parser(), [
            "--config-file", "c.yaml", *flags, "--register-coco", f"mine={tmp_path / 'missing.json'}:{tmp_path}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--register-coco" in err and "missing.json" in err and "unrecognized" not in err, err


@pytest.mark.parametrize("flags", [["--conf", "a.yaml", "--config-file", "b.yaml"],
                                   ["--config-file=a.yaml", "--config-fi", "b.yaml"]])
def test_a_second_config_file_is_refused_whatever_prefix_names_it(flags, capsys):
    from gwdet.engine.arguments import parse_args

    with pytest.raises(SystemExit):
        parse_args([*flags, "--eval-only"])
    assert "--config-file is given more than once" in capsys.readouterr().err


def test_the_train_tool_refuses_any_repeated_flag_that_keeps_one_value(capsys):
    from gwdet.cluster.training import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--config-file", "a.yaml", "--num-gpus", "1", "SOLVER.MAX_ITER", "5", "--num-gpus", "2"])
    assert ("--num-gpus is given more than once; a second one would replace the first. Give it once, with the value "
            "you mean (given: 1, 2).") in capsys.readouterr().err


@pytest.mark.parametrize("overrides, key, values, used", [
    (["SOLVER.BASE_LR", "0.5", "SOLVER.MAX_ITER", "5", "SOLVER.BASE_LR", "0.001"], "SOLVER.BASE_LR", "0.5, 0.001", "0.001"),
    (["train.max_iter=5", "optimizer.lr=0.5", "+train.max_iter=7"], "train.max_iter", "5, 7", "7"),
])
def test_an_override_given_twice_is_named_with_the_value_used(overrides, key, values, used, caplog):
    from gwdet.engine.arguments import parse_args
    from gwdet.engine.run import load_run_config

    config = DEMO_CONFIG if "=" not in overrides[0] else REPO / "configs" / "LazyConfig" / "mask_rcnn_R_50_FPN_gw_shapes.py"
    with caplog.at_level("WARNING", logger="gwdet.utils.command_line"):
        args = parse_args(["--config-file", str(config), *overrides])
        load_run_config(args.config_file, args.opts)  # the loader says it, for the tools and Python alike
    assert args.opts == overrides  # merged as detectron2 merges them: the last one counts
    assert [r.getMessage() for r in caplog.records] == [
        f"The overrides set {key} more than once ({values}): the last, {used}, is used."]


def test_a_cluster_job_replaces_the_flags_it_sets_on_the_users_command_line():
    from gwdet.cluster.training import argument_parser
    from gwdet.utils.command_line import replace_flags

    argv = ["--config-file", "a.yaml", "--launcher=slurm", "--nodes", "2", "--num-machines", "3", "--launch", "slurm",
            "--resume", "SOLVER.MAX_ITER", "10", "--machine-rank", "1", "--num-gpus", "2"]
    job = ["--launcher", "local", "--num-machines", "2", "--machine-rank", "0", "--dist-url", "auto", "--resume"]
    assert replace_flags(argument_parser(), argv, job) == [
        "--config-file", "a.yaml", "--nodes", "2", "SOLVER.MAX_ITER", "10", "--num-gpus", "2", *job]


@pytest.mark.parametrize("value", ["-5", "nan", "0", "inf", "1e300"])
def test_a_rendezvous_timeout_that_cannot_be_waited_is_refused(value, capsys):
    # before: "Nothing answers ... after 0 s" at once, or raw ValueError / OverflowError
    from gwdet.cluster.training import parse_args  # tools/train_net.py's flags, the launcher's included

    with pytest.raises(SystemExit):
        parse_args(["--config-file", str(DEMO_CONFIG), "--rendezvous-timeout", value])
    assert f"argument --rendezvous-timeout: give a number of seconds above 0, e.g. 300; got '{value}'" in \
        capsys.readouterr().err
    assert parse_args(["--config-file", str(DEMO_CONFIG), "--rendezvous-timeout", "0.5"]).rendezvous_timeout == 0.5


# check_training_values(cfg, 0) raised a bare ZeroDivisionError, (cfg, "2") a TypeError
@pytest.mark.parametrize("world_size", [0, "2", 1.5, True])
def test_check_training_values_names_a_world_size_that_is_no_process_count(world_size):
    from gwdet.engine.trainer import check_training_values
    from gwdet.model_zoo import build_config

    with pytest.raises(GwdetValueError, match=r"^check_training_values\(cfg, world_size\): world_size is the number of "
                                              rf"training processes, a whole number >= 1 .*got {re.escape(repr(world_size))}$"):
        check_training_values(build_config(str(DEMO_CONFIG)), world_size)


@pytest.mark.parametrize("opts, message", [
    (["MODEL.BACKBONE.FREEZE_AT", "2", "MODEL.WEIGHTS", ""], "MODEL.BACKBONE.FREEZE_AT is 2, which keeps the first 2 "
                                                              "stage(s) of the backbone"),
    (["SOLVER.AMP.ENABLED", "True"], "SOLVER.AMP.ENABLED=True with MODEL.DEVICE='cpu'"),
])
def test_a_training_that_would_keep_random_stages_or_needs_a_gpu_is_refused(opts, message):
    from gwdet.engine.trainer import check_training_values
    from gwdet.model_zoo import build_config

    cfg = build_config(str(DEMO_CONFIG), opts)
    with pytest.raises(GwdetValueError, match=re.escape(message)):
        check_training_values(cfg, world_size=1)
    check_training_values(build_config(str(DEMO_CONFIG)), world_size=1)


@pytest.mark.parametrize("opts, message", [
    # PreciseBN takes torch's batch norms only: BW / BGN kept their running averages without a word
    (["MODEL.FPN.NORM", "BW"], "TEST.PRECISE_BN.ENABLED is True, but detectron2's PreciseBN recomputes the running "
                               "statistics of torch's batch norms only, and the layers of MODEL.FPN.NORM (BW) would "
                               "keep their running averages"),
    (["MODEL.RESNETS.GW_NORM", "BGN", "MODEL.ROI_BOX_HEAD.NORM", "GhostBN"],
     "the layers of MODEL.ROI_BOX_HEAD.NORM (GhostBN), MODEL.RESNETS.GW_NORM (BGN) would keep"),
    # RetinaNet's head norm was not among the keys checked
    (["MODEL.META_ARCHITECTURE", "GWRetinaNet", "MODEL.BACKBONE.NAME", "build_gw_retinanet_resnet_fpn_backbone",
      "MODEL.RETINANET.NUM_CLASSES", "4", "MODEL.MASK_ON", "False", "MODEL.RETINANET.NORM", "BGN"],
     "the layers of MODEL.RETINANET.NORM (BGN) would keep"),
    # 0 set every BN layer's running mean and variance to 0; -1 stopped with islice's error after the training
    (["MODEL.FPN.NORM", "BN", "TEST.PRECISE_BN.NUM_ITER", "0"], "TEST.PRECISE_BN.NUM_ITER is 0: PreciseBN averages "),
    (["TEST.PRECISE_BN.NUM_ITER", "-1"], "TEST.PRECISE_BN.NUM_ITER is -1: PreciseBN averages the batch statistics"),
])
def test_precise_bn_with_norms_it_does_not_recompute_is_refused(opts, message):
    from gwdet.engine.trainer import check_training_values
    from gwdet.model_zoo import build_config

    with pytest.raises(GwdetValueError, match=re.escape(message)):
        check_training_values(build_config(str(DEMO_CONFIG), ["TEST.PRECISE_BN.ENABLED", "True", *opts]), world_size=1)
    # the norms it recomputes (BN), or none with running statistics (GW, GN): PreciseBN runs, or has nothing to do
    for fine in (["MODEL.FPN.NORM", "BN"], []):
        check_training_values(build_config(str(DEMO_CONFIG), ["TEST.PRECISE_BN.ENABLED", "True", *fine]), world_size=1)


def test_precise_bn_asked_of_an_evaluation_is_warned_of():
    # --eval-only TEST.PRECISE_BN.ENABLED True evaluated the running statistics as they were, without a word
    from gwdet.engine.trainer import YacsRun
    from gwdet.model_zoo import build_config

    from conftest import logged_warnings

    with logged_warnings("gwdet.engine.trainer") as logged:
        YacsRun(build_config(str(DEMO_CONFIG), ["TEST.PRECISE_BN.ENABLED", "True"])).check_request(True, 1)  # no BN
        YacsRun(build_config(str(DEMO_CONFIG), ["TEST.PRECISE_BN.ENABLED", "True", "MODEL.FPN.NORM", "BN"])
                ).check_request(True, 1)
    assert [line[:90] for line in logged] == [
        "TEST.PRECISE_BN.ENABLED is True, but detectron2's PreciseBN runs during training only: --eval-only evaluates "
        "the weights' running statistics as they are."[:90]]


def test_test_time_augmentation_is_refused_for_training_and_evaluation():
    # gwdet's runs evaluate the plain model: TEST.AUG.ENABLED was ignored without a word
    from gwdet.engine.trainer import YacsRun
    from gwdet.model_zoo import build_config

    run = YacsRun(build_config(str(DEMO_CONFIG), ["TEST.AUG.ENABLED", "True"]))
    for eval_only in (False, True):
        with pytest.raises(GwdetValueError, match=r"TEST.AUG.ENABLED is True, but gwdet's runs evaluate without "
                                                  r"test-time augmentation .* Set TEST.AUG.ENABLED False"):
            run.check_request(eval_only, world_size=1)


def test_a_registered_dataset_no_run_uses_is_named_in_a_warning(tmp_path, caplog):
    import logging

    from gwdet.engine.arguments import parse_args
    from gwdet.engine.run import load_run_config, setup

    from conftest import TINY_OPTS
    from test_coco_sweep_checks import write_dataset

    overrides = [*TINY_OPTS, "OUTPUT_DIR", str(tmp_path / "run")]
    args = parse_args(["--config-file", str(DEMO_CONFIG), "--register-coco",
                       f"unused_mine={write_dataset(tmp_path / 'mine')}", *overrides])
    # detectron2's logger set-up (in setup) stops the "gwdet" logger's propagation to caplog's root
    # handler; attached to the logger itself, the handler sees the warning whatever ran before
    gwdet_logger = logging.getLogger("gwdet")
    gwdet_logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.WARNING, logger="gwdet"):
            setup(args, load_run_config(args.config_file, args.opts))
    finally:
        gwdet_logger.removeHandler(caplog.handler)
    assert "--register-coco registered 'unused_mine', but the run neither trains nor evaluates on it" in caplog.text


def test_a_registered_dataset_the_analyze_and_export_tools_do_not_read_is_named_in_a_warning(tmp_path, capsys):
    # flops counted on shapes_val (and an export sampled there) without a word about the dataset given
    from conftest import TINY_OPTS, logged_warnings
    from test_coco_sweep_checks import write_dataset

    mine = ["--register-coco", f"mine={write_dataset(tmp_path / 'mine')}"]
    with logged_warnings("gwdet") as warned:
        assert analyze_model.main(["--config-file", str(DEMO_CONFIG), "--tasks", "flop", "-n", "1", *mine,
                                   *TINY_OPTS]) == 0
    assert ("--register-coco registered 'mine', but --tasks flop counts on shapes_val (DATASETS.TEST's first dataset), "
            "not on it: name it first in DATASETS.TEST to count on it.") in warned
    with logged_warnings("gwdet") as warned, pytest.raises(SystemExit):  # warned before the model is built
        export_model.main(["--config-file", str(DEMO_CONFIG), "--untrained", "--output", str(tmp_path / "out"), *mine,
                           *TINY_OPTS, "MODEL.DEVICE", "meta"])
    assert ("--register-coco registered 'mine', but the export takes its sample image from shapes_val (DATASETS.TEST's "
            "first dataset), not from it: name it first in DATASETS.TEST to use it.") in warned
    capsys.readouterr()


def test_a_double_dash_ends_the_flags_and_a_flag_without_its_value_is_named(capsys):
    parser = export_model.argument_parser()
    args = parse_with_trailing_flags(parser, ["--config-file", "c.yaml", "--output", "o", "--", "MODEL.DEVICE", "cpu"])
    assert args.opts == ["MODEL.DEVICE", "cpu"]
    args = parse_with_trailing_flags(parser, ["--config-file", "c.yaml", "--output", "o", "MODEL.DEVICE", "cpu",
                                              "--overw", "--opset", "13"])  # a prefix among the overrides
    assert args.overwrite and args.opset == 13 and args.opts == ["MODEL.DEVICE", "cpu"]
    with pytest.raises(SystemExit):
        parse_with_trailing_flags(parser, ["--config-file", "c.yaml", "--output", "o", "MODEL.DEVICE", "cpu", "--opset"])
    assert "--opset needs a value after it" in capsys.readouterr().err


def test_an_override_of_detectrons_config_version_is_refused():
    from gwdet.model_zoo import build_config

    with pytest.raises(GwdetValueError, match=r"^config: VERSION=1 is not the version of detectron2's config format"):
        build_config(str(DEMO_CONFIG), ["VERSION", "1"])


def test_torchs_sync_batch_norm_in_several_cpu_processes_is_refused():
    # DDP stopped the workers with "SyncBatchNorm layers only work with GPU modules", naming no key
    from gwdet.engine.trainer import check_training_values
    from gwdet.model_zoo import build_config

    cfg = build_config(str(DEMO_CONFIG), ["MODEL.FPN.NORM", "SyncBN", "SOLVER.IMS_PER_BATCH", "2"])
    with pytest.raises(GwdetValueError, match=r"MODEL.FPN.NORM is SyncBN \(torch's SyncBatchNorm\), which synchronizes "
                                              r"CUDA tensors only: 2 processes on 'cpu' would stop"):
        check_training_values(cfg, world_size=2)
    check_training_values(cfg, world_size=1)  # one process: torch's SyncBatchNorm normalizes as BN


def test_a_run_on_the_meta_device_is_refused_for_yacs_and_lazy_configs():
    # trained to iteration 0, then "Tensor.item() cannot be called on meta tensors"
    from gwdet.engine.lazy import LazyRun
    from gwdet.engine.trainer import YacsRun
    from gwdet.model_zoo import build_config

    for run, setting in ((YacsRun(build_config(str(DEMO_CONFIG), ["MODEL.DEVICE", "meta"])), "MODEL.DEVICE"),
                         (LazyRun.load(str(REPO / "configs" / "LazyConfig" / "mask_rcnn_R_50_FPN_gw_shapes.py"),
                                       ["train.device=meta"]), "train.device")):
        for eval_only in (False, True):
            with pytest.raises(GwdetValueError, match=rf"{setting} is 'meta', which holds tensor shapes only: a run "
                                                      "cannot train or evaluate there"):
                run.check_request(eval_only=eval_only, world_size=1)


@pytest.mark.parametrize("opts, setting", [
    (["DATASETS.TEST", "()"], "DATASETS.TEST"),
])
def test_eval_only_without_a_test_set_is_refused_before_anything_is_written(opts, setting, tmp_path):
    # it evaluated nothing and exited 0, saying so in one log line
    from gwdet.engine.arguments import parse_args
    from gwdet.engine.run import check_output_request, load_run_config

    args = parse_args(["--config-file", str(DEMO_CONFIG), "--eval-only", "MODEL.WEIGHTS", "model_final.pth", *opts,
                       "OUTPUT_DIR", str(tmp_path / "out")])
    with pytest.raises(ValueError) as refused:
        check_output_request(args, load_run_config(args.config_file, args.opts))
    assert str(refused.value) == (f"--eval-only evaluates on the config's test set, and {setting} names none; nothing "
                                  f"was evaluated or written. Name the dataset to evaluate on in {setting}.")
    assert not (tmp_path / "out").exists()


def test_a_trainer_given_the_other_kind_of_config_or_a_path_names_the_one_to_use():
    # Trainer(<LazyConfig>): omegaconf's "Missing key clone"; LazyTrainer(<CfgNode>): omegaconf's ValueError;
    # Trainer("config.yaml"): "'str' object has no attribute 'clone'"
    from detectron2.config import LazyConfig, get_cfg

    from gwdet.engine.lazy import LazyTrainer
    from gwdet.engine.trainer import Trainer

    with pytest.raises(TypeError, match=r"^Trainer takes a yacs config \(CfgNode\), not the str 'c.yaml': load the file "
                                        r"first: gwdet.model_zoo.build_config\(path, opts\) for a yacs file"):
        Trainer("c.yaml")
    lazy = LazyConfig.load(str(REPO / "configs" / "LazyConfig" / "Study" / "gw.py"))
    with pytest.raises(TypeError, match=r"^Trainer takes a yacs config \(CfgNode\), not a DictConfig: for a LazyConfig, "
                                        r"build gwdet's LazyTrainer \(gwdet.engine.lazy.LazyTrainer\).$"):
        Trainer(lazy)
    with pytest.raises(TypeError, match=r"^LazyTrainer takes a LazyConfig \(omegaconf's DictConfig\), not a CfgNode: for "
                                        r"a yacs config, build gwdet's Trainer \(gwdet.engine.trainer.Trainer\).$"):
        LazyTrainer(get_cfg())


def test_the_names_that_synchronize_cuda_tensors_only_come_from_the_catalogue():
    # the layers a name builds decide, so a registered name building torch's SyncBatchNorm is refused too
    import gwdet
    from gwdet.norms import synchronizes_cuda_only, unregister_norm

    assert [name for name in ("SyncBN", "nnSyncBN", "naiveSyncBN", "BN", "GN", "GW", "", "NoSuchNorm")
            if synchronizes_cuda_only(name)] == ["SyncBN", "nnSyncBN"]
    gwdet.register_norm("MySyncBN", lambda channels: torch.nn.SyncBatchNorm(channels), batch_statistics=True,
                        layer_types=(torch.nn.SyncBatchNorm,))
    try:
        assert synchronizes_cuda_only("MySyncBN")
    finally:
        unregister_norm("MySyncBN")


def test_a_test_size_cap_without_a_test_size_is_named_and_not_listed(caplog):
    # INPUT.MIN_SIZE_TEST 0 with MAX_SIZE_TEST 32: images evaluated at full size, results.md listing MAX_SIZE_TEST 32
    import logging

    from gwdet.engine.trainer import YacsRun
    from gwdet.model_zoo import build_config

    run = YacsRun(build_config(str(DEMO_CONFIG), ["INPUT.MIN_SIZE_TEST", "0", "INPUT.MAX_SIZE_TEST", "32"]))
    with caplog.at_level(logging.WARNING, logger="gwdet.engine.trainer"):
        run.check_request(False, world_size=1)
    assert any(record.getMessage().startswith("INPUT.MIN_SIZE_TEST is 0: detectron2 evaluates the images at their own "
                                              "size and resizes none, so INPUT.MAX_SIZE_TEST 32 caps nothing")
               for record in caplog.records)
    assert "INPUT.MAX_SIZE_TEST" not in run.test_settings and run.test_settings["INPUT.MIN_SIZE_TEST"] == 0
    assert YacsRun(build_config(str(DEMO_CONFIG))).test_settings["INPUT.MAX_SIZE_TEST"] > 0
