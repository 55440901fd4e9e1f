"""Config values that detectron2 would take and fail on late (when the optimizer, the data loader
or the first checkpoint is made, at the first mask loaded) or never refuse, and config files that
YAML would read without a word, are refused when the config is read: the message names the key, its
value and the fix (gwdet.config_checks.check_detectron2_values, gwdet.model_zoo.loading)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from detectron2.config import get_cfg

import gwdet
import gwdet.model_zoo
from gwdet.config import add_gwdet_config
from gwdet.config_checks import (DETECTRON2_MASK_FORMATS, DETECTRON2_RESNET_DEPTHS, check_detectron2_values,
                                 check_gwdet_config)
from gwdet.errors import GwdetValueError
from gwdet.modeling.build import check_device
from gwdet.model_zoo.loading import build_config

from gwdet.engine.lazy import LazyRun
from gwdet.engine.trainer import check_training_values

from conftest import DEMO_CONFIG, LAZY_CONFIG, REPO, TINY_OPTS, logged_warnings

YACS_CONFIGS = sorted(path for path in (REPO / "configs").rglob("*.yaml") if "LazyConfig" not in path.parts)


def refusal(*opts: str) -> str:
    """The message with which the demo config with the ``KEY VALUE`` overrides ``opts`` is refused."""
    with pytest.raises(GwdetValueError) as refused:
        build_config(str(DEMO_CONFIG), list(opts))
    return str(refused.value)


# ---- what passes ---------------------------------------------------------------------------------

def test_detectron2s_and_gwdets_defaults_pass():
    cfg = add_gwdet_config(get_cfg())
    check_detectron2_values(cfg)
    check_gwdet_config(cfg)


@pytest.mark.parametrize("path", YACS_CONFIGS, ids=lambda path: str(path.relative_to(REPO / "configs")))
def test_every_shipped_yacs_config_passes(path: Path):
    check_gwdet_config(build_config(str(path)))


def test_the_values_detectron2_uses_pass():
    build_config(str(DEMO_CONFIG), ["SOLVER.CHECKPOINT_PERIOD", "1", "SOLVER.BASE_LR", "0.0",
                                    "DATALOADER.NUM_WORKERS", "0", "INPUT.MASK_FORMAT", "polygon"])
    for depth in DETECTRON2_RESNET_DEPTHS:
        build_config(str(DEMO_CONFIG), ["MODEL.RESNETS.DEPTH", str(depth)])
    for mask_format in DETECTRON2_MASK_FORMATS:
        build_config(str(DEMO_CONFIG), ["INPUT.MASK_FORMAT", mask_format])


def test_a_grey_image_format_with_one_mean_and_std_passes():
    build_config(str(DEMO_CONFIG), ["INPUT.FORMAT", "L", "MODEL.PIXEL_MEAN", "[127.5]", "MODEL.PIXEL_STD", "[64.0]"])


@pytest.mark.parametrize("image_format", ["YUV-BT.601", "P", "F", "I"])
def test_formats_detectron2_reads_but_cannot_train_on_are_refused(image_format):
    # accepted, then a generic failure at the first iteration: YUV-BT.601 gives float64 images, and
    # PIL's 1-channel modes but L lack the channel axis detectron2's mapper adds
    with pytest.raises(ValueError, match=f"INPUT.FORMAT='{image_format}' is not a format detectron2 reads images in and "
                                         "trains on: use one of BGR, RGB, YCbCr, HSV, LAB, L, RGBA, CMYK"):
        build_config(str(DEMO_CONFIG), ["INPUT.FORMAT", image_format, "MODEL.PIXEL_MEAN", "[1.0]",
                                        "MODEL.PIXEL_STD", "[2.0]"])


def test_random_subset_sampling_without_its_ratio_key_is_refused():
    # listed as valid, then detectron2's AttributeError: RANDOM_SUBSET_RATIO, a key this config cannot take
    cfg = build_config(str(DEMO_CONFIG))
    if "RANDOM_SUBSET_RATIO" in cfg.DATALOADER:
        pytest.skip("this detectron2's config has DATALOADER.RANDOM_SUBSET_RATIO")
    with pytest.raises(ValueError, match="reads DATALOADER.RANDOM_SUBSET_RATIO, which this detectron2's config does "
                                         "not have"):
        build_config(str(DEMO_CONFIG), ["DATALOADER.SAMPLER_TRAIN", "RandomSubsetTrainingSampler"])


def test_the_depth_of_a_backbone_that_is_no_resnet_is_not_checked():
    cfg = add_gwdet_config(get_cfg())
    cfg.MODEL.BACKBONE.NAME = "build_my_backbone"
    cfg.MODEL.RESNETS.DEPTH = 200
    # the depth rule comes first and says nothing; the unregistered name is what is refused
    with pytest.raises(GwdetValueError, match=r"^config: MODEL.BACKBONE.NAME='build_my_backbone' is not registered"):
        check_detectron2_values(cfg)


# ---- detectron2's keys: refused with the key, the value and the fix -----------------------------

@pytest.mark.parametrize("period", ["0", "-5"])
def test_a_checkpoint_period_below_1_is_refused(period):
    message = refusal("SOLVER.CHECKPOINT_PERIOD", period, "SOLVER.MAX_ITER", "300")
    assert message.startswith(f"config: SOLVER.CHECKPOINT_PERIOD={period} is no number of iterations between "
                              "checkpoints: detectron2's PeriodicCheckpointer saves one every")
    assert message.endswith("Use an integer >= 1; to save only the final model, use SOLVER.MAX_ITER (300).")


# TEST.EVAL_PERIOD -1 ran as 0 (one evaluation after training) without a word; train.eval_period=-1 is refused
def test_a_negative_evaluation_period_is_refused():
    assert refusal("TEST.EVAL_PERIOD", "-1") == (
        "config: TEST.EVAL_PERIOD=-1 is no number of iterations between evaluations: give a whole number of at least "
        "0 (0: evaluate once, after training), e.g. TEST.EVAL_PERIOD 1000.")


# SOLVER.BASE_LR 0 was refused as "a int" without the way to write it
def test_an_integer_for_a_float_key_names_the_decimal_point():
    with pytest.raises(GwdetValueError, match=r"SOLVER.BASE_LR takes a value of type float .*got 0 \(a int\)\. Write "
                                              r"it with a decimal point: SOLVER.BASE_LR 0.0\.$"):
        build_config(str(DEMO_CONFIG), ["SOLVER.BASE_LR", "0"])


# SOLVER.MAX_ITER 2.0 (or 2.5, 1e3) was refused as "got 2.0 (a float)." without the way to write it
@pytest.mark.parametrize("value, fix", [
    ("2.0", "got 2.0 (a float). Write it as a whole number: SOLVER.MAX_ITER 2."),
    ("2.5", "got 2.5 (a float). Give a whole number, e.g. SOLVER.MAX_ITER 2 or SOLVER.MAX_ITER 3."),
    ("1e3", "got 1000.0 (a float). Write it as a whole number: SOLVER.MAX_ITER 1000."),
    ("1e999", "got inf (a float). Give a whole number, e.g. SOLVER.MAX_ITER 1000.")])
def test_a_float_for_an_int_key_names_the_whole_number(value, fix):
    with pytest.raises(GwdetValueError, match=r"SOLVER.MAX_ITER takes a value of type int \(it is 1000 before this "
                                              r"value\); " + re.escape(fix) + "$"):
        build_config(str(DEMO_CONFIG), ["SOLVER.MAX_ITER", value])


# MAX_ITER: 1e3 in a config file was refused as "got 1000.0 (a float)." without the way to write it
def test_a_float_for_an_int_key_in_a_file_names_the_whole_number(tmp_path):
    config = tmp_path / "exponent.yaml"
    config.write_text(f'_BASE_: "{DEMO_CONFIG}"\nSOLVER:\n  MAX_ITER: 1e3\n', encoding="utf-8")
    with pytest.raises(GwdetValueError, match=r"\(or a _BASE_ it names\): SOLVER.MAX_ITER takes a value of type int .*"
                                              r"got 1000.0 \(a float\)\. Write it as a whole number: "
                                              r"SOLVER.MAX_ITER 1000\.$"):
        build_config(str(config))


def test_a_negative_learning_rate_is_refused():
    message = refusal("SOLVER.BASE_LR", "-0.01")
    assert message.startswith("config: SOLVER.BASE_LR=-0.01 is no learning rate: it must be a finite number >= 0")
    assert "Use a positive rate, e.g. 0.02 for a batch of 16 images" in message


def test_a_learning_rate_that_is_not_finite_is_refused():
    cfg = add_gwdet_config(get_cfg())
    cfg.SOLVER.BASE_LR = float("inf")
    with pytest.raises(GwdetValueError, match=r"^config: SOLVER.BASE_LR=inf is no learning rate"):
        check_gwdet_config(cfg)


def test_schedule_and_clipping_values_detectron2_fails_on_late_are_refused():
    # an IndexError after the last iteration (no model_final.pth), "AssertionError: -0.5", a ZeroDivisionError, a
    # 0-norm clipping accepted
    assert refusal("SOLVER.LR_SCHEDULER_NAME", "WarmupStepWithFixedGammaLR", "SOLVER.MAX_ITER", "400").endswith(
        "where fvcore's StepWithFixedGammaParamScheduler has no value (IndexError), so no model_final.pth and no "
        "results are written. The same schedule: SOLVER.LR_SCHEDULER_NAME WarmupMultiStepLR with SOLVER.STEPS "
        "\"(100, 200, 300)\" and the same SOLVER.GAMMA.")
    cosine = ["SOLVER.LR_SCHEDULER_NAME", "WarmupCosineLR"]
    for end in ("-0.5", "0.5"):
        assert refusal(*cosine, "SOLVER.BASE_LR_END", end).startswith(
            f"config: SOLVER.BASE_LR_END={end} is no final learning rate of WarmupCosineLR: it must be a number from 0 "
            "to SOLVER.BASE_LR (0.02)")
    assert "WarmupCosineLR divides SOLVER.BASE_LR_END by SOLVER.BASE_LR" in refusal(*cosine, "SOLVER.BASE_LR", "0.0")
    build_config(str(DEMO_CONFIG), ["SOLVER.BASE_LR_END", "-0.5"])  # not read by the multi-step schedule
    clipping = ["SOLVER.CLIP_GRADIENTS.ENABLED", "True", "SOLVER.CLIP_GRADIENTS.CLIP_TYPE", "norm"]
    for norm_type in ("0.0", "-1.0"):
        assert refusal(*clipping, "SOLVER.CLIP_GRADIENTS.NORM_TYPE", norm_type).startswith(
            f"config: SOLVER.CLIP_GRADIENTS.NORM_TYPE={norm_type} is no p of a p-norm")
    build_config(str(DEMO_CONFIG), [*clipping, "SOLVER.CLIP_GRADIENTS.NORM_TYPE", "1e999"])  # the largest value


def test_resnext_groups_of_a_basic_block_resnet_are_warned_of():
    # DEPTH 34 with NUM_GROUPS 4 built a plain ResNet-34 without a word
    basic = ["MODEL.RESNETS.DEPTH", "34", "MODEL.RESNETS.RES2_OUT_CHANNELS", "64", "MODEL.RESNETS.GW_POSITIONS", "S1"]
    with logged_warnings("gwdet.config_checks") as logged:
        build_config(str(DEMO_CONFIG), [*basic, "MODEL.RESNETS.NUM_GROUPS", "4"])
        build_config(str(DEMO_CONFIG), basic)
    assert logged == ["MODEL.RESNETS.NUM_GROUPS is 4, but MODEL.RESNETS.DEPTH 34 builds basic blocks, which detectron2 "
                      "builds without groups (nor WIDTH_PER_GROUP): the model is a plain ResNet-34. Use a depth of 50 or "
                      "more for a ResNeXt, or MODEL.RESNETS.NUM_GROUPS 1."]


def test_schedule_values_a_training_would_not_read_or_few_would_mean_are_warned_of():
    with logged_warnings("gwdet.engine.trainer") as logged:
        check_training_values(build_config(str(DEMO_CONFIG), ["SOLVER.LR_SCHEDULER_NAME", "WarmupCosineLR",
                                                              "SOLVER.STEPS", "(10,)", "SOLVER.BIAS_LR_FACTOR", "0.0"]), 1)
        check_training_values(build_config(str(DEMO_CONFIG), ["SOLVER.BASE_LR_END", "0.001", "SOLVER.STEPS", "(10,)",
                                                              "SOLVER.GAMMA", "10.0"]), 1)
    assert [line.split(":")[0] for line in logged] == [
        "SOLVER.BIAS_LR_FACTOR 0.0", "SOLVER.STEPS (10,) is not read by SOLVER.LR_SCHEDULER_NAME WarmupCosineLR, whose "
        "rate falls from SOLVER.BASE_LR to SOLVER.BASE_LR_END along a cosine", "SOLVER.GAMMA 10.0 is above 1",
        "SOLVER.BASE_LR_END 0.001 is read by WarmupCosineLR only, not by SOLVER.LR_SCHEDULER_NAME WarmupMultiStepLR"]


def test_a_shapes_dataset_generated_at_another_size_than_the_model_reads_is_warned_of():
    # DATASETS.SHAPES.IMAGE_SIZE 64 in the demo: trained and tested upsampled to 128 pixels without a word
    with logged_warnings("gwdet.engine.trainer") as logged:
        check_training_values(build_config(str(DEMO_CONFIG), ["DATASETS.SHAPES.IMAGE_SIZE", "64"]), 1)
        check_training_values(build_config(str(DEMO_CONFIG), TINY_OPTS), 1)  # all at 64: no word
    assert [line.split(". To")[0] for line in logged] == [
        "DATASETS.SHAPES.IMAGE_SIZE 64 generates images of 64 pixels a side, but the model reads them resized to a "
        "shorter side of 128 (INPUT.MIN_SIZE_TRAIN (128,), INPUT.MIN_SIZE_TEST 128)"]


@pytest.mark.parametrize("seed", ["4294967296", "10000000000000"])
def test_a_seed_beyond_numpys_is_refused(seed):
    # numpy's "Seed must be between 0 and 2**32 - 1" traceback when the run seeded its generators
    assert refusal("SEED", seed).startswith(f"config: SEED={seed} is no seed: give a whole number below 2**32")


def test_a_negative_number_of_workers_is_refused():
    message = refusal("DATALOADER.NUM_WORKERS", "-1")
    assert message.startswith("config: DATALOADER.NUM_WORKERS=-1 is no number of data-loading processes: torch's "
                              "DataLoader refuses a negative one")
    assert message.endswith("Use 0 (load the data in the training process) or more, e.g. 4.")


@pytest.mark.parametrize("depth", ["42", "0", "200"])
def test_a_resnet_depth_detectron2_does_not_build_is_refused(depth):
    message = refusal("MODEL.RESNETS.DEPTH", depth)
    assert message == (f"config: MODEL.RESNETS.DEPTH={depth} is not a depth of detectron2's ResNets, which "
                       "MODEL.BACKBONE.NAME='build_gw_resnet_fpn_backbone' builds (it would stop with a bare "
                       "KeyError). Use one of 18, 34, 50, 101, 152, e.g. 50.")


@pytest.mark.parametrize("mask_format", ["polygons", "rle", "Bitmask"])
def test_an_unknown_mask_format_is_refused(mask_format):
    message = refusal("INPUT.MASK_FORMAT", mask_format)
    assert message.startswith(f"config: INPUT.MASK_FORMAT={mask_format!r} is not a mask format detectron2 reads")
    assert message.endswith("Use 'polygon' (masks kept as polygons) or 'bitmask' (masks as images; COCO's RLE "
                            "masks need it).")


@pytest.mark.parametrize("std", ["[0.0, 64.0, 64.0]", "[64.0, -1.0, 64.0]"])
def test_a_pixel_std_at_or_below_0_is_refused(std):
    message = refusal("MODEL.PIXEL_STD", std)
    assert message.startswith(f"config: MODEL.PIXEL_STD={std} holds a value <= 0: the model divides each image "
                              "channel by its value")
    assert "Use the standard deviations of the pixel values, all > 0" in message


def test_pixel_values_that_are_not_numbers_are_refused():
    message = refusal("MODEL.PIXEL_MEAN", "['a', 1.0, 1.0]")
    assert message.startswith("config: MODEL.PIXEL_MEAN=['a', 1.0, 1.0] must be a list of finite numbers, one per "
                              "channel of the images (INPUT.FORMAT='RGB')")


@pytest.mark.parametrize("key", ["MODEL.PIXEL_MEAN", "MODEL.PIXEL_STD"])
def test_pixel_values_of_another_length_than_the_formats_channels_are_refused(key):
    message = refusal(key, "[1.0, 1.0]")
    assert message.startswith(f"config: {key}=[1.0, 1.0] has 2 values, but images of INPUT.FORMAT='RGB' have 3 "
                              "channels")
    assert message.endswith(f"Give {key} 3 values, one per channel.")


def test_three_channel_pixel_values_for_grey_images_are_refused():
    message = refusal("INPUT.FORMAT", "L")
    assert message.startswith("config: MODEL.PIXEL_MEAN=[127.5, 127.5, 127.5] and MODEL.PIXEL_STD=[64.0, 64.0, "
                              "64.0] have 3 values, but images of INPUT.FORMAT='L' have 1 channel")
    assert message.endswith("Give MODEL.PIXEL_MEAN and MODEL.PIXEL_STD 1 value each, one per channel, or set "
                            "INPUT.FORMAT to a format of 3 channels (BGR, RGB, YCbCr, HSV, LAB).")


def test_a_pixel_mean_and_std_of_different_lengths_are_refused():
    from gwdet.config_checks import check_pixel_normalization

    with pytest.raises(ValueError) as refused:  # a format of unknown channels (a LazyConfig's input_format)
        check_pixel_normalization([1.0, 2.0], [64.0, 64.0, 64.0], "P")
    message = str(refused.value)
    assert message == ("config: MODEL.PIXEL_MEAN=[1.0, 2.0] has 2 values and MODEL.PIXEL_STD=[64.0, 64.0, 64.0] "
                       "has 3: the model normalizes each image channel with one value of each. Give both one value "
                       "per channel of the images (INPUT.FORMAT='P').")


def test_pixel_statistics_of_images_from_0_to_1_are_refused():
    # torchvision's ImageNet statistics on detectron2's 0-255 inputs trained and evaluated without a word
    message = refusal("MODEL.PIXEL_MEAN", "[0.485, 0.456, 0.406]", "MODEL.PIXEL_STD", "[0.229, 0.224, 0.225]")
    assert message == ("config: MODEL.PIXEL_MEAN=[0.485, 0.456, 0.406] and MODEL.PIXEL_STD=[0.229, 0.224, 0.225] are "
                       "statistics of pixel values from 0 to 1 (torchvision's), but detectron2 gives the model values "
                       "from 0 to 255: the normalized inputs would reach about 1138. Multiply both by 255 (ImageNet's: "
                       "[103.53, 116.28, 123.675] and [57.375, 57.12, 58.395] in BGR order; [123.675, 116.28, 103.53] "
                       "and [58.395, 57.12, 57.375] in RGB).")
    # no normalization at all (a std of 1: detectron2's MSRA weights took it into their first conv) passes
    build_config(str(DEMO_CONFIG), ["MODEL.PIXEL_MEAN", "[0.0, 0.0, 0.0]", "MODEL.PIXEL_STD", "[1.0, 1.0, 1.0]"])
    lazy = LazyRun.load(str(LAZY_CONFIG), ["model.pixel_mean=[0.485,0.456,0.406]", "model.pixel_std=[0.229,0.224,0.225]"])
    with pytest.raises(GwdetValueError, match=r"^config: model.pixel_mean=\[0.485, 0.456, 0.406\] and model.pixel_std="):
        lazy.check_request(eval_only=True, world_size=1)


@pytest.mark.parametrize("key", ["MODEL.RPN.LOSS_WEIGHT", "MODEL.RPN.BBOX_REG_LOSS_WEIGHT",
                                 "MODEL.ROI_BOX_HEAD.BBOX_REG_LOSS_WEIGHT", "MODEL.ROI_KEYPOINT_HEAD.LOSS_WEIGHT"])
def test_a_negative_loss_weight_is_refused(key):
    # loss_box_reg -0.056: the box error maximized, without a word
    assert refusal(key, "-1.0") == (f"config: {key}=-1.0 is no loss weight (a negative one makes training increase its "
                                    "loss; 0 leaves it out): give a finite number at least 0.")
    build_config(str(DEMO_CONFIG), [key, "0.0"])


def test_a_lazy_configs_loss_weights_and_box_weights_are_checked_as_their_yacs_keys():
    # box2box weights of 3 numbers: an IndexError at the first iteration; negative loss weights trained
    cases = (("model.roi_heads.box_predictor.box2box_transform.weights=[10,10,5]",
              "model.roi_heads.box_predictor.box2box_transform.weights=[10, 10, 5] is no set of box regression "
              "weights: detectron2's Box2BoxTransform takes four numbers > 0"),
             ("model.roi_heads.box_predictor.loss_weight=-1.0",
              "model.roi_heads.box_predictor.loss_weight=-1.0 is no loss weight (a negative one makes training "
              "increase its loss; 0 leaves it out): give a finite number at least 0."),
             ("model.proposal_generator.loss_weight={loss_rpn_cls:1.0,loss_rpn_loc:-2}",
              "model.proposal_generator.loss_weight.loss_rpn_loc=-2 is no loss weight"))
    for override, message in cases:
        with pytest.raises(GwdetValueError) as refused:
            LazyRun.load(str(LAZY_CONFIG), [override]).check_request(eval_only=False, world_size=1)
        assert str(refused.value).startswith(message), str(refused.value)


def test_the_check_runs_where_gwdet_builds_too():
    cfg = add_gwdet_config(get_cfg())
    cfg.SOLVER.CHECKPOINT_PERIOD = 0
    with pytest.raises(GwdetValueError, match=r"^config: SOLVER.CHECKPOINT_PERIOD=0 "):
        check_gwdet_config(cfg)


# ---- keys spelled in lower case ------------------------------------------------------------------

@pytest.mark.parametrize("key", ["model.gw.num_groups", "MODEL.gw.NUM_GROUPS", "Model.Gw.Num_Groups"])
def test_a_lower_case_override_key_is_named_with_its_upper_case_spelling(key):
    assert refusal(key, "8") == (f"The KEY VALUE overrides: {key} is not a key of detectron2's or gwdet's config, "
                                 "whose keys are upper-case: did you mean MODEL.GW.NUM_GROUPS?")


def test_a_misspelled_lower_case_key_gets_the_close_upper_case_keys():
    message = refusal("solver.max_itr", "8")
    assert message == ("The KEY VALUE overrides: solver.max_itr is not a key of detectron2's or gwdet's config, "
                       "whose keys are upper-case: did you mean SOLVER.MAX_ITER?")


def test_a_lower_case_section_in_a_file_is_named_with_its_upper_case_spelling(tmp_path):
    config = tmp_path / "lower.yaml"
    config.write_text(f'_BASE_: "{DEMO_CONFIG}"\nMODEL:\n  gw:\n    NUM_GROUPS: 8\n', encoding="utf-8")
    with pytest.raises(GwdetValueError) as refused:
        build_config(str(config))
    assert str(refused.value) == (f"Config file {str(config)!r} (or a _BASE_ it names): MODEL.gw is not a key of "
                                  "detectron2's or gwdet's config, whose keys are upper-case: did you mean MODEL.GW?")


@pytest.mark.parametrize("section, line, key, part", [
    ("GW", '"NUM_GROUPS ": 8', "MODEL.GW.NUM_GROUPS ", "NUM_GROUPS "),
    ('"FPN "', "NORM: GW", "MODEL.FPN ", "FPN ")])
def test_a_quoted_key_with_spaces_at_its_end_is_named_with_them(tmp_path, section, line, key, part):
    # blamed on a VERSION upgrade (the key without its space is one), or called "MODEL.FPN is not a key"
    config = tmp_path / "spaced.yaml"
    config.write_text(f'_BASE_: "{DEMO_CONFIG}"\nMODEL:\n  {section}:\n    {line}\n', encoding="utf-8")
    with pytest.raises(GwdetValueError) as refused:
        build_config(str(config))
    assert str(refused.value) == (f"Config file {str(config)!r} (or a _BASE_ it names): {key!r} is not a key of "
                                  f"detectron2's or gwdet's config: its part {part!r} has spaces at an end, which no "
                                  f"key has. Write it as {part.strip()!r}.")


# ---- a key given twice in a YAML file ------------------------------------------------------------

def _refused_file(path: Path) -> str:
    with pytest.raises(GwdetValueError) as refused:
        build_config(str(path))
    return str(refused.value)


def test_a_section_given_twice_is_refused_with_both_lines(tmp_path):
    config = tmp_path / "twice.yaml"
    config.write_text(f'_BASE_: "{DEMO_CONFIG}"\nMODEL:\n  GW:\n    NUM_GROUPS: 8\nSOLVER:\n  MAX_ITER: 3\n'
                      "MODEL:\n  GN:\n    NUM_GROUPS: 4\n", encoding="utf-8")
    assert _refused_file(config) == (
        f"Config file {str(config)!r} gives the key MODEL twice, at line 2 and at line 7: YAML keeps only the last, "
        f"so what line 2 sets would be silently dropped. Give MODEL once in {config}: put the keys of both blocks "
        "under a single MODEL: block.")


def test_a_value_given_twice_in_a_section_is_refused_with_its_dotted_key(tmp_path):
    config = tmp_path / "twice.yaml"
    config.write_text(f'_BASE_: "{DEMO_CONFIG}"\nMODEL:\n  GW:\n    NUM_GROUPS: 8\n    T: 3\n    NUM_GROUPS: 4\n',
                      encoding="utf-8")
    assert _refused_file(config) == (
        f"Config file {str(config)!r} gives the key MODEL.GW.NUM_GROUPS twice, at line 4 and at line 6: YAML keeps "
        f"only the last, so what line 4 sets would be silently dropped. Give MODEL.GW.NUM_GROUPS once in {config}: "
        "delete the line you do not mean.")


def test_a_key_given_twice_in_a_base_is_refused_naming_the_base_and_the_config(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text(f'_BASE_: "{DEMO_CONFIG}"\nSOLVER:\n  MAX_ITER: 3\n  BASE_LR: 0.01\n  MAX_ITER: 5\n',
                    encoding="utf-8")
    config = tmp_path / "config.yaml"
    config.write_text('_BASE_: "base.yaml"\nSEED: 1\n', encoding="utf-8")
    assert _refused_file(config).startswith(
        f"Config file {str(base)!r} (a base of {str(config)!r}) gives the key SOLVER.MAX_ITER twice, at line 3 and "
        "at line 5: YAML keeps only the last")


@pytest.mark.parametrize("opts, message", [
    # trained with loss_box_reg and loss_mask 0 throughout: detectron2 samples int(1 x 0.25) = 0 foreground regions
    (["MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE", "1"], "config: MODEL.ROI_HEADS.POSITIVE_FRACTION=0.25 with "
                                                    "MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE=1 samples int(1 x 0.25) = 0 "
                                                    "foreground regions per image (detectron2 rounds the count down), "
                                                    "so the box regression and mask losses stay 0 for the whole "
                                                    "training: give a MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE of at least "
                                                    "4, or a larger MODEL.ROI_HEADS.POSITIVE_FRACTION."),
    (["MODEL.RPN.POSITIVE_FRACTION", "0.0"], "config: MODEL.RPN.POSITIVE_FRACTION=0.0 with "
                                             "MODEL.RPN.BATCH_SIZE_PER_IMAGE=128 samples int(128 x 0) = 0 foreground "
                                             "anchors per image (detectron2 rounds the count down), so the RPN's box "
                                             "regression loss stays 0 for the whole training: give a larger "
                                             "MODEL.RPN.POSITIVE_FRACTION."),
    # numpy's bare "low >= high" at the first iteration
    (["INPUT.MIN_SIZE_TRAIN_SAMPLING", "range", "INPUT.MIN_SIZE_TRAIN", "(96, 48)"],
     "config: INPUT.MIN_SIZE_TRAIN=(96, 48) is a range from its larger end: with INPUT.MIN_SIZE_TRAIN_SAMPLING 'range' "
     "give the ends from low to high, (48, 96)."),
])
def test_training_values_that_train_otherwise_than_asked_are_refused_for_a_training_only(opts, message):
    # an evaluation reads none of them: refusing it was a refusal of a config it can use
    from gwdet.engine.trainer import YacsRun
    from gwdet.model_zoo import build_config

    run = YacsRun(build_config(str(DEMO_CONFIG), opts))
    run.check_request(eval_only=True, world_size=1)
    with pytest.raises(GwdetValueError) as refused:
        run.check_request(eval_only=False, world_size=1)
    assert str(refused.value) == message
    if "ROI_HEADS" in opts[0]:  # a proposal network samples no regions: nothing to refuse
        YacsRun(build_config(str(DEMO_CONFIG), [*opts, "MODEL.META_ARCHITECTURE", "ProposalNetwork",
                                                "MODEL.MASK_ON", "False"])).check_request(eval_only=False, world_size=1)


def test_a_file_of_an_older_version_on_a_current_base_is_told_about_its_version(tmp_path):
    # "MODEL.ANCHOR_GENERATOR.SIZES is not a key ... Did you mean MODEL.ANCHOR_GENERATOR.SIZES?"
    config = tmp_path / "v1.yaml"
    config.write_text(f'_BASE_: "{DEMO_CONFIG}"\nVERSION: 1\n', encoding="utf-8")
    assert "is a key of detectron2's current config format, but a file says an older VERSION" in _refused_file(config)
    # a section at another level: MODEL.GW not suggested for GW: at the top, or under RESNETS:
    config.write_text(f'_BASE_: "{DEMO_CONFIG}"\nGW:\n  NUM_GROUPS: 8\n', encoding="utf-8")
    assert "GW is not a key of detectron2's or gwdet's config. Did you mean MODEL.GW?" in _refused_file(config)
    config.write_text(f'_BASE_: "{DEMO_CONFIG}"\nMODEL:\n  RESNETS:\n    GW:\n      NUM_GROUPS: 8\n', encoding="utf-8")
    assert "MODEL.RESNETS.GW is not a key of detectron2's or gwdet's config. Did you mean MODEL.GW or" in \
        _refused_file(config)
    config.write_text(f'_BASE_: "{DEMO_CONFIG}"\nWEIGHTS: ""\n', encoding="utf-8")  # a key at another level
    assert "WEIGHTS is not a key of detectron2's or gwdet's config. Did you mean MODEL.WEIGHTS?" in _refused_file(config)
    config.write_text(f'_BASE_: "{DEMO_CONFIG}"\nMODEL:\n  SOLVER:\n    MAX_ITER: 3\n', encoding="utf-8")
    assert "MODEL.SOLVER is not a key of detectron2's or gwdet's config. Did you mean SOLVER" in _refused_file(config)


def test_a_base_list_whose_later_base_puts_its_chains_value_back_is_warned_of(tmp_path):
    # _BASE_: [a.yaml, b.yaml], both on the demo: b's chain put the demo's GW group number back over a's 8
    from gwdet.model_zoo import build_config

    from conftest import logged_warnings

    (tmp_path / "a.yaml").write_text(f'_BASE_: "{DEMO_CONFIG}"\nMODEL:\n  GW:\n    NUM_GROUPS: 8\n', encoding="utf-8")
    (tmp_path / "b.yaml").write_text(f'_BASE_: "{DEMO_CONFIG}"\nSOLVER:\n  MAX_ITER: 7\n', encoding="utf-8")
    config = tmp_path / "both.yaml"
    config.write_text('_BASE_: ["a.yaml", "b.yaml"]\n', encoding="utf-8")
    with logged_warnings("gwdet.model_zoo.loading") as logged:
        cfg = build_config(str(config))
    assert cfg.MODEL.GW.NUM_GROUPS != 8 and cfg.SOLVER.MAX_ITER == 7  # fvcore's merge, as it is
    assert len(logged) == 1 and logged[0].startswith(
        f"Config file {str(config)!r}: its _BASE_ 'b.yaml' gives MODEL.GW.NUM_GROUPS the values of its own base chain "
        f"(MODEL.GW.NUM_GROUPS: {cfg.MODEL.GW.NUM_GROUPS}) over those 'a.yaml' gives (MODEL.GW.NUM_GROUPS: 8)")
    # the earlier base's value from a base of its own: dropped the same way, and warned of (it was not)
    (tmp_path / "a2.yaml").write_text('_BASE_: "a.yaml"\nTEST:\n  EVAL_PERIOD: 0\n', encoding="utf-8")
    config.write_text('_BASE_: ["a2.yaml", "b.yaml"]\n', encoding="utf-8")
    with logged_warnings("gwdet.model_zoo.loading") as logged:
        build_config(str(config))
    assert len(logged) == 1 and "over those 'a2.yaml' gives (MODEL.GW.NUM_GROUPS: 8)" in logged[0]
    config.write_text('_BASE_: ["a.yaml", "b.yaml"]\nMODEL:\n  GW:\n    NUM_GROUPS: 8\n', encoding="utf-8")
    with logged_warnings("gwdet.model_zoo.loading") as logged:  # the config itself says which: no word
        assert build_config(str(config)).MODEL.GW.NUM_GROUPS == 8
    assert logged == []


def test_a_tuple_split_by_a_one_line_mapping_is_named_as_such(tmp_path):
    # "gives the key DATASETS.) twice, at line 2 and at line 2 ... delete the line you do not mean"
    config = tmp_path / "flow.yaml"
    config.write_text(f'_BASE_: "{DEMO_CONFIG}"\nDATASETS: {{TRAIN: ("shapes_train",), TEST: ("shapes_val",)}}\n',
                      encoding="utf-8")
    assert _refused_file(config).endswith(
        "a value holding a comma inside a {...} mapping on one line is split there into keys of its own (a tuple such "
        'as ("a", "b") or ("a",)): quote the value, or write the mapping as a block, one key per line.')


def test_a_dotted_key_inside_a_block_is_refused_with_the_nesting_to_write(tmp_path):
    # was "MODEL.GW.T is not a key of detectron2's or gwdet's config. Did you mean MODEL.GW.T?"
    config = tmp_path / "dotted.yaml"
    config.write_text(f'_BASE_: "{DEMO_CONFIG}"\nMODEL:\n  GW.T: 3\n', encoding="utf-8")
    assert _refused_file(config) == (
        f"Config file {str(config)!r} gives the key 'GW.T' under MODEL: at line 3: a YAML config nests its keys in "
        "blocks, a key holds no dot. Write it as nested blocks, GW: then T: each on its own line, indented below the "
        "one before (or give the override MODEL.GW.T VALUE on the command line).")


def test_the_same_key_name_in_different_sections_is_no_duplicate(tmp_path):
    config = tmp_path / "distinct.yaml"
    config.write_text(f'_BASE_: "{DEMO_CONFIG}"\nMODEL:\n  GW:\n    NUM_GROUPS: 8\n  GN:\n    NUM_GROUPS: 4\n',
                      encoding="utf-8")
    cfg = build_config(str(config))
    assert (cfg.MODEL.GW.NUM_GROUPS, cfg.MODEL.GN.NUM_GROUPS) == (8, 4)


# ---- gwdet.model_zoo.get_config(..., trained=True) -----------------------------------------------

@pytest.mark.parametrize("name, weights_key", [("Demo/mask_rcnn_R_50_FPN_gw_shapes.yaml", "MODEL.WEIGHTS"),
                                               ("LazyConfig/mask_rcnn_R_50_FPN_gw.py", "train.init_checkpoint")])
def test_trained_weights_are_refused_saying_gwdet_ships_none(name, weights_key):
    with pytest.raises(GwdetValueError) as refused:
        gwdet.model_zoo.get_config(name, trained=True)
    message = str(refused.value)
    assert message.startswith(f"gwdet.model_zoo.get_config({name!r}, trained=True): gwdet ships no trained weights "
                              "for its configs")
    assert f"set {weights_key} to the run's model_final.pth" in message and "docs/weights.md" in message


def test_trained_false_loads_the_config_as_before():
    cfg = gwdet.model_zoo.get_config("Demo/mask_rcnn_R_50_FPN_gw_shapes.yaml", False)
    assert cfg.MODEL.WEIGHTS == build_config(str(DEMO_CONFIG)).MODEL.WEIGHTS


def test_one_of_detectron2s_configs_asked_of_gwdets_model_zoo_names_the_function_that_loads_it():
    # detectron2's pattern get_config("common/models/mask_rcnn_fpn.py"): "not among gwdet's configs", then a list
    with pytest.raises(FileNotFoundError) as refused:
        gwdet.model_zoo.get_config("common/models/mask_rcnn_fpn.py")
    assert "It is one of detectron2's packaged configs: load it with gwdet.model_zoo.detectron2_lazy_config(" \
        "'common/models/mask_rcnn_fpn.py'), as detectron2's model_zoo.get_config would." in str(refused.value)
    assert gwdet.model_zoo.detectron2_lazy_config("common/models/mask_rcnn_fpn.py").model is not None
    # a packaged yacs config: the advice pointed at detectron2_lazy_config, which refused it
    yacs = "COCO-Detection/faster_rcnn_R_50_FPN_1x.yaml"
    with pytest.raises(FileNotFoundError) as refused:
        gwdet.model_zoo.get_config(yacs)
    way = f"gwdet.model_zoo.build_config(str(gwdet.model_zoo.detectron2_config_file({yacs!r})))"
    assert f"It is one of detectron2's packaged configs: load it with {way}, which adds gwdet's keys" in \
        str(refused.value)
    with pytest.raises(ValueError, match=re.escape(f"for a .yaml one: {way}, which adds gwdet's keys")):
        gwdet.model_zoo.detectron2_lazy_config(yacs)
    assert eval(way, {"gwdet": gwdet}).MODEL.GW.NUM_GROUPS >= 1  # noqa: S307 (the advice, as written)
    # a name without its .py: "not a LazyConfig ... for a .yaml one"
    with pytest.raises(ValueError, match=r"^'common/models/mask_rcnn_fpn' is not among detectron2's packaged configs: "
                                         r"did you mean 'common/models/mask_rcnn_fpn.py'\?"):
        gwdet.model_zoo.detectron2_lazy_config("common/models/mask_rcnn_fpn")


def test_trained_must_be_a_bool():
    with pytest.raises(GwdetValueError, match=r"^gwdet.model_zoo.get_config: trained must be True or False, "
                                              r"got 'yes' \(str\)$"):
        gwdet.model_zoo.get_config("Demo/mask_rcnn_R_50_FPN_gw_shapes.yaml", trained="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize("key, value, start", [
    ("SOLVER.WARMUP_ITERS", "-1", "config: SOLVER.WARMUP_ITERS=-1 is no number of warm-up iterations"),
    ("SOLVER.STEPS", "(100, 50)", "config: SOLVER.STEPS=(100, 50) is no schedule of learning-rate steps"),
    ("SOLVER.STEPS", "(0,)", "config: SOLVER.STEPS=(0,) is no schedule of learning-rate steps"),
    ("SOLVER.GAMMA", "-1.0", "config: SOLVER.GAMMA=-1.0 is no learning-rate factor"),
    ("SOLVER.GAMMA", "0.0", "config: SOLVER.GAMMA=0.0 is no learning-rate factor"),
    ("SOLVER.MOMENTUM", "1.5", "config: SOLVER.MOMENTUM=1.5 is no SGD momentum"),
    ("SOLVER.MOMENTUM", "-0.1", "config: SOLVER.MOMENTUM=-0.1 is no SGD momentum"),
])
def test_schedule_values_detectron2_would_misuse_are_refused(key, value, start):
    assert refusal(key, value).startswith(start)


def test_a_proposal_size_no_test_proposal_can_have_is_refused():
    # MIN_SIZE 1000 on 64-pixel images: nothing detected, and the NaN warning named other causes
    assert refusal("MODEL.PROPOSAL_GENERATOR.MIN_SIZE", "1000").startswith(
        "config: MODEL.PROPOSAL_GENERATOR.MIN_SIZE=1000 drops every proposal at test time: a proposal must be wider "
        "and taller than it, and the test images' shorter side is resized to INPUT.MIN_SIZE_TEST=128 pixels")
    assert refusal("MODEL.PROPOSAL_GENERATOR.MIN_SIZE", "-1").startswith(
        "config: MODEL.PROPOSAL_GENERATOR.MIN_SIZE=-1 is no proposal size")
    build_config(str(DEMO_CONFIG), ["MODEL.PROPOSAL_GENERATOR.MIN_SIZE", "127"])
    build_config(str(DEMO_CONFIG), ["MODEL.PROPOSAL_GENERATOR.MIN_SIZE", "1000", "INPUT.MIN_SIZE_TEST", "0"])


def test_schedule_values_detectron2_uses_pass():
    build_config(str(DEMO_CONFIG), ["SOLVER.WARMUP_ITERS", "0", "SOLVER.STEPS", "()", "SOLVER.MOMENTUM", "0.0"])
    build_config(str(DEMO_CONFIG), ["SOLVER.STEPS", "(60000, 80000)", "SOLVER.MAX_ITER", "90000", "SOLVER.GAMMA", "0.1"])


# ---- detectron2's names, numbers, features and anchors (rows 68c-68f) ----------------------------

@pytest.mark.parametrize("opts, start", [
    (["SOLVER.LR_SCHEDULER_NAME", "WarmupFoo"], "SOLVER.LR_SCHEDULER_NAME='WarmupFoo' is not one of the values"),
    (["SOLVER.WARMUP_METHOD", "cosine"], "SOLVER.WARMUP_METHOD='cosine' is not one of the values"),
    (["SOLVER.CLIP_GRADIENTS.CLIP_TYPE", "foo"], "SOLVER.CLIP_GRADIENTS.CLIP_TYPE='foo' is not one of the values"),
    (["INPUT.FORMAT", "XYZ"], "INPUT.FORMAT='XYZ' is not a format detectron2 reads images in and trains on"),
    (["INPUT.RANDOM_FLIP", "diagonal"], "INPUT.RANDOM_FLIP='diagonal' is not one of the values"),
    (["INPUT.CROP.TYPE", "foo"], "INPUT.CROP.TYPE='foo' is not one of the values"),
    # detectron2's bare assertion at the first iteration, the key not named
    (["INPUT.CROP.ENABLED", "True", "INPUT.CROP.TYPE", "absolute_range", "INPUT.CROP.SIZE", "[80, 40]"],
     "INPUT.CROP.SIZE=[80, 40] is no crop size for INPUT.CROP.TYPE 'absolute_range': detectron2's RandomCrop reads "
     "two sizes in pixels >= 1, the smallest and the largest side, smallest first"),
    (["INPUT.CROP.ENABLED", "True", "INPUT.CROP.TYPE", "relative", "INPUT.CROP.SIZE", "[1.5, 1.5]"],
     "INPUT.CROP.SIZE=[1.5, 1.5] is no crop size for INPUT.CROP.TYPE 'relative'"),
    # detectron2's "Strides 16 16 are not log2 contiguous"; in a C4 model the value was ignored
    (["MODEL.RESNETS.RES5_DILATION", "2"], "MODEL.RESNETS.RES5_DILATION=2 keeps res5 at stride 16, as res4 is, which "
                                           "the FPN of MODEL.BACKBONE.NAME='build_gw_resnet_fpn_backbone' cannot take"),
    (["MODEL.RESNETS.RES5_DILATION", "2", "MODEL.BACKBONE.NAME", "build_gw_resnet_backbone", "MODEL.RESNETS.OUT_FEATURES",
      "['res4']", "MODEL.ROI_HEADS.NAME", "GWRes5ROIHeads", "MODEL.RPN.IN_FEATURES", "['res4']",
      "MODEL.ROI_HEADS.IN_FEATURES", "['res4']"],
     "MODEL.RESNETS.RES5_DILATION=2 is read by the backbone's res5 only, and MODEL.ROI_HEADS.NAME='GWRes5ROIHeads' "
     "builds res5 in its ROI heads, without dilation"),
    (["DATALOADER.SAMPLER_TRAIN", "FooSampler"], "DATALOADER.SAMPLER_TRAIN='FooSampler' is not one of the values"),
    (["MODEL.FPN.FUSE_TYPE", "max"], "MODEL.FPN.FUSE_TYPE='max' is not one of the values"),
    (["MODEL.META_ARCHITECTURE", "Foo"], "MODEL.META_ARCHITECTURE='Foo' is not registered in detectron2's "
                                         "META_ARCH_REGISTRY"),
    (["MODEL.BACKBONE.NAME", "build_foo_backbone"], "MODEL.BACKBONE.NAME='build_foo_backbone' is not registered"),
    (["MODEL.ROI_HEADS.NAME", "FooHeads"], "MODEL.ROI_HEADS.NAME='FooHeads' is not registered"),
    (["MODEL.ROI_MASK_HEAD.NAME", "FooHead"], "MODEL.ROI_MASK_HEAD.NAME='FooHead' is not registered"),
    (["SOLVER.WEIGHT_DECAY", "-1.0"], "SOLVER.WEIGHT_DECAY=-1.0 is no weight decay: give a finite number at least 0."),
    (["SOLVER.WEIGHT_DECAY_NORM", "-0.5"], "SOLVER.WEIGHT_DECAY_NORM=-0.5 is no weight decay of the norm layers"),
    (["SOLVER.BIAS_LR_FACTOR", "-1.0"], "SOLVER.BIAS_LR_FACTOR=-1.0 is no learning-rate factor of the biases"),
    (["SOLVER.WARMUP_FACTOR", "-2.0"], "SOLVER.WARMUP_FACTOR=-2.0 is no warm-up factor"),
    (["SOLVER.CLIP_GRADIENTS.ENABLED", "True", "SOLVER.CLIP_GRADIENTS.CLIP_VALUE", "-1.0"],
     "SOLVER.CLIP_GRADIENTS.CLIP_VALUE=-1.0 is no gradient clipping bound"),
    (["SOLVER.REFERENCE_WORLD_SIZE", "3"], "SOLVER.REFERENCE_WORLD_SIZE=3 is no number of processes"),
    (["DATALOADER.REPEAT_THRESHOLD", "-1.0"], "DATALOADER.REPEAT_THRESHOLD=-1.0 is no repeat-factor threshold"),
    (["MODEL.BACKBONE.FREEZE_AT", "9"], "MODEL.BACKBONE.FREEZE_AT=9 is no number of frozen backbone stages: give an "
                                        "integer of at least 0 and at most 5."),
    (["MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE", "0"], "MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE=0 is no number of regions"),
    (["MODEL.ROI_HEADS.POSITIVE_FRACTION", "2.0"], "MODEL.ROI_HEADS.POSITIVE_FRACTION=2.0 is no fraction"),
    (["MODEL.ROI_HEADS.SCORE_THRESH_TEST", "1.5"], "MODEL.ROI_HEADS.SCORE_THRESH_TEST=1.5 is no score threshold"),
    (["MODEL.ROI_HEADS.NMS_THRESH_TEST", "2.0"], "MODEL.ROI_HEADS.NMS_THRESH_TEST=2.0 is no NMS IoU threshold"),
    (["TEST.DETECTIONS_PER_IMAGE", "0"], "TEST.DETECTIONS_PER_IMAGE=0 is no number of detections kept per image"),
    (["INPUT.MIN_SIZE_TRAIN", "(-128,)"], "INPUT.MIN_SIZE_TRAIN=(-128,) is no list of training image sizes"),
    (["INPUT.MIN_SIZE_TRAIN_SAMPLING", "range", "INPUT.MIN_SIZE_TRAIN", "(96, 112, 128)"],
     "INPUT.MIN_SIZE_TRAIN=(96, 112, 128) is no list of training image sizes"),
    (["INPUT.MIN_SIZE_TEST", "-5"], "INPUT.MIN_SIZE_TEST=-5 is no test image size"),
    (["INPUT.MAX_SIZE_TRAIN", "0"], "INPUT.MAX_SIZE_TRAIN=0 is no longest image side"),
    (["MODEL.RESNETS.OUT_FEATURES", "['res9']"], "MODEL.RESNETS.OUT_FEATURES=['res9'] names no ResNet outputs"),
    (["MODEL.FPN.IN_FEATURES", "['res1', 'res2']"], "MODEL.FPN.IN_FEATURES=['res1', 'res2'] names features the "
                                                     "ResNet does not output"),
    (["MODEL.ANCHOR_GENERATOR.SIZES", "[[8], [16]]"], "MODEL.ANCHOR_GENERATOR.SIZES=[[8], [16]] is no list of anchor "
                                                      "settings per feature level: give one non-empty list of "
                                                      "positive numbers per level the proposal generator reads (5 "
                                                      "here: MODEL.RPN.IN_FEATURES="),
    (["MODEL.ANCHOR_GENERATOR.ASPECT_RATIOS", "[[]]"], "MODEL.ANCHOR_GENERATOR.ASPECT_RATIOS=[[]] is no list"),
    (["MODEL.ROI_HEADS.IOU_THRESHOLDS", "[0.5, 0.4]"], "MODEL.ROI_HEADS.IOU_THRESHOLDS=[0.5, 0.4] with "
                                                       "MODEL.ROI_HEADS.IOU_LABELS=[0, 1] is no matching rule"),
    (["MODEL.RPN.IOU_THRESHOLDS", "[0.3]"], "MODEL.RPN.IOU_THRESHOLDS=[0.3] with MODEL.RPN.IOU_LABELS=[0, -1, 1] is "
                                            "no matching rule"),
    (["OUTPUT_DIR", "None"], "OUTPUT_DIR is empty (None), where its default is './output': give it a value (an empty "
                             "YAML value, 'OUTPUT_DIR:' with nothing after it, YAML's ~ and null, or the override"),
    (["SOLVER.MAX_ITER", "None"], "SOLVER.MAX_ITER is empty (None), where its default is 40000"),
    (["MODEL.WEIGHTS", "None"], "MODEL.WEIGHTS is empty (None), where its default is ''"),
    (["SOLVER.MAX_ITER", "800"], "SOLVER.STEPS=(800, 950) holds SOLVER.MAX_ITER=800 itself"),
    (["DATASETS.TEST", "('shapes_val', 'shapes_val')"], "DATASETS.TEST=('shapes_val', 'shapes_val') names "
                                                        "'shapes_val' more than once: give each test dataset once"),
    # the copies were joined: their images drawn twice as often
    (["DATASETS.TRAIN", "('shapes_train', 'shapes_train')"], "DATASETS.TRAIN=('shapes_train', 'shapes_train') names "
                                                             "'shapes_train' more than once: give each training "
                                                             "dataset once"),
])
def test_detectron2_values_it_would_refuse_late_or_train_wrong_with_are_refused(opts, start):
    message = refusal(*opts)
    assert message.startswith("config: " + start), message


@pytest.mark.parametrize("opts", [
    ["INPUT.FORMAT", "BGR"], ["INPUT.FORMAT", "L", "MODEL.PIXEL_MEAN", "[1.0]", "MODEL.PIXEL_STD", "[2.0]"],
    ["SOLVER.LR_SCHEDULER_NAME", "WarmupCosineLR"], ["MODEL.ANCHOR_GENERATOR.SIZES", "[[32]]"],
    ["MODEL.MASK_ON", "False", "MODEL.ROI_MASK_HEAD.NAME", "NotUsed"], ["SOLVER.REFERENCE_WORLD_SIZE", "2"],
    ["MODEL.PROPOSAL_GENERATOR.NAME", "PrecomputedProposals"], ["MODEL.BACKBONE.FREEZE_AT", "5"],
])
def test_values_detectron2_can_use_pass(opts):
    build_config(str(DEMO_CONFIG), opts)


def test_detectrons_zoo_functions_and_odd_arguments_are_named():
    from gwdet.model_zoo import get, get_checkpoint_url  # detectron2's import: an ImportError that said nothing

    for function in (get, get_checkpoint_url):
        with pytest.raises(AttributeError, match=f"gwdet.model_zoo has no {function.__name__}\\(\\): detectron2's "
                                                 "model_zoo"):
            function("COCO-Detection/faster_rcnn_R_50_FPN_1x.yaml", trained=True)
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        gwdet.model_zoo.nothing  # noqa: B018
    with pytest.raises(TypeError, match=r"config_path must be a config's name .* got None \(NoneType\)"):
        gwdet.model_zoo.get_config(None)
    for opts in ("MODEL.GW.NUM_GROUPS 4", {"MODEL.GW.NUM_GROUPS": 4}, ["MODEL.GW.NUM_GROUPS", 4]):
        with pytest.raises(TypeError, match="opts must be a list of strings"):
            gwdet.model_zoo.get_config("Demo/mask_rcnn_R_50_FPN_gw_shapes.yaml", opts=opts)



@pytest.mark.parametrize("opts, message", [
    # each passed the checks, then stopped in detectron2 or torch (building the model, the optimizer or
    # at the first iteration) or, for the proposal counts, gave no detection without a word
    (["MODEL.RESNETS.STEM_OUT_CHANNELS", "0"], "config: MODEL.RESNETS.STEM_OUT_CHANNELS=0 is no number of channels: "
                                               "give an integer of at least 1."),
    (["MODEL.ROI_BOX_HEAD.FC_DIM", "0"], "config: MODEL.ROI_BOX_HEAD.FC_DIM=0 is no number of channels"),
    (["MODEL.RESNETS.NUM_GROUPS", "0"], "config: MODEL.RESNETS.NUM_GROUPS=0 is no number of ResNeXt groups"),
    (["MODEL.ROI_HEADS.NUM_CLASSES", "-1"], "config: MODEL.ROI_HEADS.NUM_CLASSES=-1 is no number of classes"),
    (["MODEL.RPN.PRE_NMS_TOPK_TEST", "0"], "config: MODEL.RPN.PRE_NMS_TOPK_TEST=0 is no number of proposals kept "
                                           "before NMS"),
    (["MODEL.RPN.POST_NMS_TOPK_TEST", "0"], "config: MODEL.RPN.POST_NMS_TOPK_TEST=0 is no number of proposals kept "
                                            "after NMS"),
    (["MODEL.ROI_BOX_HEAD.POOLER_RESOLUTION", "0"], "config: MODEL.ROI_BOX_HEAD.POOLER_RESOLUTION=0 is no pooled "
                                                    "region size"),
    (["MODEL.ROI_MASK_HEAD.POOLER_TYPE", "ROIAlignV3"], "config: MODEL.ROI_MASK_HEAD.POOLER_TYPE='ROIAlignV3' is not "
                                                        "one of the values detectron2's ROIPooler knows"),
    (["MODEL.RPN.BBOX_REG_LOSS_TYPE", "foo"], "config: MODEL.RPN.BBOX_REG_LOSS_TYPE='foo' is not one of the values "
                                              "detectron2's box regression loss knows"),
    (["MODEL.ROI_BOX_HEAD.BBOX_REG_WEIGHTS", "(10.0, 10.0)"], "config: MODEL.ROI_BOX_HEAD.BBOX_REG_WEIGHTS=(10.0, 10.0) "
                                                              "is no set of box regression weights"),
    (["MODEL.ANCHOR_GENERATOR.OFFSET", "1.5"], "config: MODEL.ANCHOR_GENERATOR.OFFSET=1.5 is no anchor offset"),
    (["SOLVER.NESTEROV", "True", "SOLVER.MOMENTUM", "0.0"], "config: SOLVER.NESTEROV=True needs momentum, but "
                                                            "SOLVER.MOMENTUM is 0.0"),
])
def test_model_sizes_and_detectron2_choices_are_refused_when_read(opts, message):
    assert message in refusal(*opts)


def test_a_device_this_pytorch_cannot_use_is_refused_with_the_fix():
    with pytest.raises(GwdetValueError, match=r"MODEL.DEVICE is 'mps', which this PyTorch cannot use \(.*\): add "
                                              r"MODEL.DEVICE cpu to the command line"):
        check_device("mps")


def test_a_learning_rate_of_0_is_said_when_training_starts():
    with logged_warnings("gwdet.engine.trainer") as logged:
        check_training_values(build_config(str(DEMO_CONFIG), ["SOLVER.BASE_LR", "0.0"]), 1)
    assert ("SOLVER.BASE_LR 0.0: training with a learning rate of 0 leaves the weights as they are through the whole "
            "run") in logged[0]
    with logged_warnings("gwdet.engine.lazy_checks") as logged:
        LazyRun.load(str(LAZY_CONFIG), ["optimizer.lr=0"]).check_request(eval_only=False, world_size=1)
    assert logged[0].startswith("optimizer.lr=0: training with a learning rate of 0 leaves the weights as they are")


def test_a_warm_up_longer_than_the_run_is_said():
    """detectron2 stretches such a warm-up over the whole run: the rate never reaches SOLVER.BASE_LR."""
    with logged_warnings("gwdet.engine.trainer") as logged:
        check_training_values(build_config(str(DEMO_CONFIG), ["SOLVER.MAX_ITER", "50"]), 1)
        # as long as the run: its last iteration (99) trains at 0.99 of the rate (said nothing)
        check_training_values(build_config(str(DEMO_CONFIG), ["SOLVER.MAX_ITER", "100"]), 1)
        check_training_values(build_config(str(DEMO_CONFIG), ["SOLVER.MAX_ITER", "101"]), 1)
    assert [m for m in logged if "WARMUP_ITERS" in m] == [
        "SOLVER.WARMUP_ITERS 100 is longer than SOLVER.MAX_ITER 50: detectron2 stretches the warm-up over the whole "
        "run, whose learning rate then never reaches SOLVER.BASE_LR. Shorten the warm-up (e.g. SOLVER.WARMUP_ITERS 5) "
        "to train at the base rate.",
        "SOLVER.WARMUP_ITERS 100 is as long as SOLVER.MAX_ITER 100: the warm-up lasts the whole run, whose learning "
        "rate then never reaches SOLVER.BASE_LR. Shorten the warm-up (e.g. SOLVER.WARMUP_ITERS 10) to train at the "
        "base rate."]
    with logged_warnings("gwdet.engine.lazy_checks") as logged:
        LazyRun.load(str(LAZY_CONFIG), ["lr_multiplier.warmup_length=1"]).check_request(eval_only=False, world_size=1)
    assert "lr_multiplier.warmup_length=1: the warm-up lasts the whole run, whose learning rate then never reaches " \
           "optimizer.lr." in "\n".join(logged), logged


@pytest.mark.parametrize("opts, message", [
    # the RPN's features were blamed on MODEL.ANCHOR_GENERATOR.SIZES alone
    (["MODEL.RPN.IN_FEATURES", "['p9']"], "(1 here: MODEL.RPN.IN_FEATURES=['p9']; if that is what is wrong, fix it "
                                          "instead)"),
    # detectron2's registry KeyError when the RPN was built
    (["MODEL.RPN.HEAD_NAME", "FooHead"], "config: MODEL.RPN.HEAD_NAME='FooHead' "),
])
def test_the_rpns_features_and_head_are_named(opts, message):
    assert message in refusal(*opts)


# ---- keys set from Python that nothing reads -----------------------------------------------------

@pytest.mark.parametrize("section, key, close", [
    ("GW", "NUM_GROUP", "MODEL.GW.NUM_GROUPS or MODEL.GN.NUM_GROUPS"),
    ("GW", "num_groups", "MODEL.GW.NUM_GROUPS"),
    ("RESNETS", "GW_POSITION", "MODEL.RESNETS.GW_POSITIONS"),
])
def test_a_misspelt_key_set_in_python_is_refused_with_the_close_keys(section, key, close):
    """yacs lets an unfrozen config take any new key: the model was built with the defaults of the
    keys the user meant (a config file's or override's misspelling is refused when merged)."""
    cfg = build_config(str(DEMO_CONFIG))
    cfg.defrost()
    setattr(cfg.MODEL[section], key, 8)
    with pytest.raises(KeyError) as refused:
        gwdet.build_model(cfg)
    assert refused.value.args[0] == (f"MODEL.{section}.{key} is not a key of gwdet's config (set in Python after the "
                                     f"config was read?), so nothing reads it. Did you mean {close}? gwdet's keys are "
                                     "listed in docs/usage.md.")


def test_a_users_own_key_in_detectron2s_sections_is_left_to_its_reader():
    cfg = build_config(str(DEMO_CONFIG))
    cfg.defrost()
    cfg.MODEL.RESNETS.MY_PROJECT_WIDTH = 8  # a project's add_*_config key, not gwdet's
    check_gwdet_config(cfg)


def test_a_section_replaced_by_a_value_in_python_is_named():
    cfg = build_config(str(DEMO_CONFIG))
    cfg.defrost()
    cfg.MODEL.GW = None  # before: TypeError: 'NoneType' object is not subscriptable
    with pytest.raises(TypeError, match=r"config: MODEL.GW is None, not a section of keys \(it holds "
                                        r"MODEL.GW.NUM_GROUPS\): set its keys instead of replacing it"):
        gwdet.build_model(cfg)


@pytest.mark.parametrize("lines, line, message", [
    # YAML 1.1 reads a leading zero as octal: MAX_ITER 010 trained 8 iterations without a word
    ("SOLVER:\n  STEPS: []\nMODEL:\n  GW:\n    NUM_GROUPS: 010\n", 6, "010 at line 6, which YAML reads as the octal "
     "number 8 (a leading zero): write 10 without the leading zero (or 8 if the octal value is meant)."),
    ("MODEL:\n  GW:\n    NUM_GROUPS: 016\n", 4, "016 at line 4, which YAML reads as the octal number 14"),
    # and colons as base 60: ASPECT_RATIOS [[1:2, 1:1, 2:1]] built anchors of ratios 62, 61 and 121
    ("MODEL:\n  ANCHOR_GENERATOR:\n    ASPECT_RATIOS: [[1:2, 1.0]]\n", 4, "1:2 at line 4, which YAML reads as the "
     "base-60 number 62 (1:30 is 90, as minutes and seconds): quote it if it is text, or write the number (a ratio "
     "such as 1:2 as 0.5)."),
    ("MODEL:\n  ANCHOR_GENERATOR:\n    ASPECT_RATIOS: [[1:0.5, 1.0]]\n", 4, "1:0.5 at line 4, which YAML reads as "
     "the base-60 number 60.5"),
])
def test_a_number_yaml_1_1_reads_otherwise_in_a_config_file_is_refused(tmp_path, lines, line, message):
    path = tmp_path / "numbers.yaml"
    path.write_text(f"_BASE_: {DEMO_CONFIG}\n{lines}")
    assert _refused_file(path).startswith(f"Config file {str(path)!r} gives {message}")


@pytest.mark.parametrize("lines, message", [
    # yacs's "Key OUTPUT_DIR with value <class 'datetime.date'> is not a valid type", with no line and no fix
    ("OUTPUT_DIR: 2026-12-01\n", "gives OUTPUT_DIR 2026-12-01 at line 2, which YAML reads as a date "
     "(datetime.date(2026, 12, 1)), not as text: a config holds no dates. Quote it: OUTPUT_DIR: \"2026-12-01\"."),
    ("SOLVER:\n  MAX_ITER: 3\nMODEL:\n  WEIGHTS: 2026-12-01 10:30:00\n", "gives MODEL.WEIGHTS 2026-12-01 10:30:00 "
     "at line 5, which YAML reads as a date and time (datetime.datetime(2026, 12, 1, 10, 30)), not as text: a config "
     "holds no dates. Quote it: WEIGHTS: \"2026-12-01 10:30:00\" (under MODEL:)."),
    ("DATASETS:\n  TRAIN: [shapes_train, 2026-12-01]\n", "gives 2026-12-01 in DATASETS.TRAIN at line 3, which YAML "
     "reads as a date (datetime.date(2026, 12, 1)), not as text: a config holds no dates. Quote it: \"2026-12-01\" (in "
     "the list of DATASETS.TRAIN)."),
    # a date that does not exist: a bare "ValueError: month must be in 1..12" while the file was told apart
    ("OUTPUT_DIR: 2026-13-01\n", "gives OUTPUT_DIR 2026-13-01 at line 2, which YAML reads as a date, one that does "
     "not exist (month must be in 1..12), not as text: a config holds no dates. Quote it: OUTPUT_DIR: \"2026-13-01\"."),
])
def test_an_unquoted_date_in_a_config_file_or_its_base_is_refused_naming_the_line_and_the_quoting(tmp_path, lines,
                                                                                                 message):
    path = tmp_path / "dated.yaml"
    path.write_text(f"_BASE_: {DEMO_CONFIG}\n{lines}")
    assert _refused_file(path) == f"Config file {str(path)!r} {message}"
    child = tmp_path / "child.yaml"
    child.write_text("_BASE_: dated.yaml\n")
    assert _refused_file(child) == f"Config file {str(path)!r} (a base of {str(child)!r}) {message}"
    path.write_text(f"_BASE_: {DEMO_CONFIG}\nOUTPUT_DIR: \"2026-12-01\"\n")
    assert build_config(str(path)).OUTPUT_DIR == "2026-12-01"
    assert build_config(str(DEMO_CONFIG), ["OUTPUT_DIR", "2026-12-01"]).OUTPUT_DIR == "2026-12-01"  # yacs: text


def test_a_norm_value_given_per_part_names_the_norms_own_key():
    # "Did you mean MODEL.BGN.NUM_GROUPS or MODEL.GN.NUM_GROUPS?" for an FPN whose NORM is GW
    assert refusal("MODEL.FPN.NUM_GROUPS", "8") == (
        "The KEY VALUE overrides: MODEL.FPN.NUM_GROUPS is not a key of detectron2's or gwdet's config: a norm's values "
        "are set per norm, not per part. MODEL.FPN.NORM is 'GW', whose num_groups is MODEL.GW.NUM_GROUPS, read by "
        "every GW layer of the model. For another value at this part only, build the model from a LazyConfig with "
        "L(gwdet.norm)(name='GW', num_groups=...) there (docs/usage.md).")


@pytest.mark.parametrize("opts, message", [
    # yacs paired the words differently: "has a key without its value" and the whole list
    (["SOLVER.MAX_ITER 3"], "The KEY VALUE overrides: 'SOLVER.MAX_ITER 3' is one argument holding a key and its "
                            "value: give them as two, SOLVER.MAX_ITER 3 (without quotes around both)."),
    # before: "is not a key ... Did you mean SOLVER.MAX_ITER?" for a name that looked the same
    (["SOLVER.MAX_ITER ", "3"], "The KEY VALUE overrides: the key 'SOLVER.MAX_ITER ' has spaces at an end, which no "
                                "config key has: write SOLVER.MAX_ITER."),
])
def test_an_override_key_holding_spaces_is_named_with_the_fix(opts, message):
    assert refusal(*opts) == message
    assert build_config(str(DEMO_CONFIG), ["OUTPUT_DIR", "my runs"]).OUTPUT_DIR == "my runs"  # a value may hold them


def test_digits_given_for_a_text_key_are_named_with_the_quoting_that_gives_them_as_text():
    assert refusal("OUTPUT_DIR", "123").endswith(
        "got 123 (a int). To give 123 as text, quote it for YAML as well as for the shell: OUTPUT_DIR \"'123'\".")
    assert build_config(str(DEMO_CONFIG), ["OUTPUT_DIR", "'123'"]).OUTPUT_DIR == "123"


def test_precomputed_proposals_without_a_file_per_dataset_are_refused():
    # a bare AssertionError (detectron2/data/build.py) with neither key named
    with pytest.raises(ValueError, match=r"MODEL.LOAD_PROPOSALS=True reads precomputed proposals, one file per "
                                         r"dataset, and DATASETS.PROPOSAL_FILES_TRAIN gives 0 for 1 dataset"):
        build_config(str(DEMO_CONFIG), ["MODEL.LOAD_PROPOSALS", "True"])
    build_config(str(DEMO_CONFIG), ["MODEL.LOAD_PROPOSALS", "True", "DATASETS.PROPOSAL_FILES_TRAIN", "('t.pkl',)",
                                    "DATASETS.PROPOSAL_FILES_TEST", "('v.pkl',)"])


def test_detectron2s_yacs_tools_read_a_gwdet_config_with_the_line_docs_usage_adds():
    # detectron2's tools/train_net.py and plain_train_net.py stopped with yacs's KeyError (docs/usage.md says the fix)
    from detectron2.config import get_cfg

    with pytest.raises(KeyError, match="Non-existent config key: MODEL."):
        get_cfg().merge_from_file(str(DEMO_CONFIG))
    cfg = gwdet.add_gwdet_config(get_cfg())
    cfg.merge_from_file(str(DEMO_CONFIG))
    assert cfg.MODEL.GW.NUM_GROUPS == build_config(str(DEMO_CONFIG)).MODEL.GW.NUM_GROUPS


def test_a_config_lacking_some_of_gwdets_keys_names_them():
    # "the config has none" was said of a config that had MODEL.GW.T and EPS but not NUM_GROUPS
    cfg = gwdet.model_zoo.get_config("Demo/mask_rcnn_R_50_FPN_gw_shapes.yaml")
    del cfg.MODEL.GW["NUM_GROUPS"]
    with pytest.raises(KeyError, match=r"needs gwdet's config keys, but the config lacks MODEL.GW.NUM_GROUPS "
                                       r"\(deleted from it\?\): gwdet.add_gwdet_config\(cfg\) adds them back"):
        gwdet.build_model(cfg)
    with pytest.raises(KeyError, match="but the config has none: call gwdet.add_gwdet_config"):
        gwdet.build_model(get_cfg())


def test_norm_from_config_refuses_a_value_that_is_no_norm():
    # 123 was passed through, and detectron2's get_norm failed with "'int' object is not callable"
    with pytest.raises(TypeError, match=r"norm_from_config: a NORM value is a norm name .* got 123 \(int\)"):
        gwdet.norm_from_config(123, add_gwdet_config(get_cfg()))
    assert gwdet.norm_from_config("", add_gwdet_config(get_cfg())) == ""


# a NUL character: ValueError: embedded null byte; a 5000-character name: OSError [Errno 36] File name too long
# with a path inside detectron2's packaged configs
def test_a_config_name_no_file_can_have_is_named_by_gwdets_model_zoo():
    with pytest.raises(GwdetValueError, match=r"config_path 'mask_rcnn_gw.yaml\\x00' holds a NUL character .*, which "
                                              r"no file name can hold: give the config's name, e.g. 'mask_rcnn_gw.yaml'"):
        gwdet.model_zoo.get_config_file("mask_rcnn_gw.yaml\x00")
    with pytest.raises(FileNotFoundError, match=r"'a{5000}.yaml' is not among gwdet's configs .*Available configs"):
        gwdet.model_zoo.get_config_file("a" * 5000 + ".yaml")


# "give a yacs CfgNode (detectron2.config.get_cfg()), got CfgNode" for a yacs CfgNode
def test_add_gwdet_config_of_a_plain_yacs_node_says_it_needs_detectron2s():
    from yacs.config import CfgNode

    with pytest.raises(TypeError, match=r"add_gwdet_config: give a yacs CfgNode of detectron2's "
                                        r"\(detectron2.config.CfgNode, from detectron2.config.get_cfg\(\)\), got "
                                        r"yacs.config.CfgNode, a yacs CfgNode but not detectron2's, without "
                                        r"detectron2's keys, .*cfg.merge_from_other_cfg\(yours\)\) and give that$"):
        add_gwdet_config(CfgNode())
    with pytest.raises(TypeError, match=r"got NoneType$"):
        add_gwdet_config(None)


# before: a Latin-1 byte in a comment of a yacs config (or of its _BASE_) was called "not text (a checkpoint or an export?)"
def test_a_config_saved_in_latin_1_is_named_as_not_utf_8(tmp_path):
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(f'_BASE_: "{DEMO_CONFIG}"\n# caf\xe9 latin-1 comment\nSOLVER:\n  BASE_LR: 0.01\n'.encode("latin-1"))
    with pytest.raises(GwdetValueError, match=rf"^Config file '{re.escape(str(latin))}' is not UTF-8 text \(byte 0xe9 "
                                              r"at line 2\), which YAML readers take as UTF-8 only: save it as UTF-8 "
                                              rf"\(e\.g\. iconv -f LATIN1 -t UTF-8 {re.escape(str(latin))} > OUT for a "
                                              r"Latin-1 file\), then give that file\.$"):
        build_config(str(latin))
    child = tmp_path / "child.yaml"
    child.write_text(f'_BASE_: "{latin}"\n')
    with pytest.raises(GwdetValueError, match=rf"names _BASE_: '{re.escape(str(latin))}', but {re.escape(str(latin))} "
                                              r"is not UTF-8 text \(byte 0xe9 at line 2\)"):
        build_config(str(child))


# before: the misspelt detectron2 key was ignored and the model built with the key meant at its default
@pytest.mark.parametrize("section, key, close", [
    ("MODEL.FPN", "NORMS", "MODEL.FPN.NORM"),
    ("MODEL.ROI_BOX_HEAD", "NROM", "MODEL.ROI_BOX_HEAD.NORM"),
    ("MODEL.RESNETS", "NORMS", "MODEL.RESNETS.NORM"),
    ("MODEL.FPN", "norm", "MODEL.FPN.NORM"),
    ("SOLVER", "WEIGHT_DECAY_NROM", "SOLVER.WEIGHT_DECAY_NORM"),
])
def test_a_misspelt_detectron2_key_set_in_python_is_refused_with_the_close_keys(section, key, close):
    cfg = add_gwdet_config(get_cfg())
    cfg.merge_from_file(str(DEMO_CONFIG))
    cfg.MODEL.DEVICE = "cpu"
    node = cfg
    for part in section.split("."):
        node = node[part]
    setattr(node, key, "GN")
    with pytest.raises(KeyError) as refused:
        gwdet.build_model(cfg)
    assert refused.value.args[0] == (
        f"{section}.{key} is not a key of detectron2's or gwdet's config (set in Python after the config was read?), "
        f"so nothing reads it. Did you mean {close}? Set that instead; a key a project of yours adds on purpose is "
        f"declared with gwdet.config.allow_config_keys('{section}.{key}') before the config is used.")


# before: a misspelt section (MODEL.RESNET for MODEL.RESNETS) was ignored, GW kept at S1-B2
def test_a_misspelt_detectron2_section_set_in_python_is_refused():
    import torch
    from detectron2.config import CfgNode
    cfg = build_config(str(DEMO_CONFIG))
    cfg.defrost()
    cfg.MODEL.RESNET = CfgNode()
    cfg.MODEL.RESNET.GW_POSITIONS = ""
    with pytest.raises(KeyError, match=r"MODEL.RESNET is not a section of detectron2's or gwdet's config .* Did you "
                                       r"mean MODEL.RESNETS\?"):
        gwdet.build_optimizer(cfg, torch.nn.Linear(2, 2))


def test_a_projects_own_keys_and_declared_keys_pass_the_gate(monkeypatch):
    from detectron2.config import CfgNode
    from gwdet import config as gwdet_config
    monkeypatch.setattr(gwdet_config, "_ALLOWED_KEYS", set())
    cfg = build_config(str(DEMO_CONFIG))
    cfg.defrost()
    cfg.MODEL.POINT_HEAD = CfgNode()  # PointRend's add_pointrend_config
    cfg.MODEL.POINT_HEAD.NUM_CLASSES = 3
    cfg.MODEL.ROI_MASK_HEAD.FC_DIM = 1024
    cfg.MODEL.RESNETS.RES4_DILATION = 1  # DeepLab's add_deeplab_config
    check_gwdet_config(cfg)
    cfg.MODEL.ROI_MASK_HEAD.NUM_CONVS = 2
    with pytest.raises(KeyError, match="Did you mean MODEL.ROI_MASK_HEAD.NUM_CONV"):
        check_gwdet_config(cfg)
    gwdet_config.allow_config_keys("MODEL.ROI_MASK_HEAD.NUM_CONVS")
    check_gwdet_config(cfg)
    # a key in gwdet's own sections was declared without a word, and the gate refused it all the same
    for name in ("MODEL.GW.NUM_GROUP", "model.bgn.my_key", "MODEL.RESNETS.GW_POSITION"):
        with pytest.raises(ValueError, match=rf"^allow_config_keys: '{name}' is in one of gwdet's own sections .* "
                                             "nothing would read it"):
            gwdet_config.allow_config_keys(name)


# before: a norm value read by none of the model's norms was ignored without a word
@pytest.mark.parametrize("opts, message", [
    (["MODEL.ROI_BOX_HEAD.NORM", "GhostBN", "MODEL.BGN.NUM_GROUPS", "4"],
     "MODEL.BGN.NUM_GROUPS is 4 (default 32), but none of the norms the model builds (GN, GW, GhostBN) reads it; BGN "
     "does: the value has no effect. Set MODEL.BGN.NUM_GROUPS back to 32, or use a norm that reads it."),
    (["MODEL.BW.T", "3"], "MODEL.BW.T is 3 (default 5), but none of the norms the model builds (GN, GW) reads it; "
                          "BW_ItN does: the value has no effect."),
    (["MODEL.GW.T", "3", "MODEL.FPN.NORM", "GW_ZCA", "MODEL.ROI_BOX_HEAD.NORM", "GW_ZCA", "MODEL.ROI_MASK_HEAD.NORM",
      "GW_ZCA", "MODEL.RESNETS.GW_NORM", "GW_ZCA"],
     "MODEL.GW.T is 3 (default 5), but none of the norms the model builds (GN, GW_ZCA) reads it; GW does"),
])
def test_a_norm_value_no_built_norm_reads_is_warned_of(opts, message):
    with logged_warnings("gwdet.config_checks") as warnings:
        build_config(str(DEMO_CONFIG), opts)
    assert any(message in warning for warning in warnings), warnings


def test_shared_group_numbers_of_norms_not_built_are_not_warned_of():
    with logged_warnings("gwdet.config_checks") as warnings:
        build_config(str(DEMO_CONFIG), ["MODEL.BGN.EPS", "1e-4", "MODEL.GW.NUM_GROUPS", "16", "MODEL.FPN.NORM", "GN",
                                        "MODEL.ROI_BOX_HEAD.NORM", "GN", "MODEL.ROI_MASK_HEAD.NORM", "GN",
                                        "MODEL.RESNETS.GW_POSITIONS", ""])
    assert [warning for warning in warnings if "reads it" in warning] == [
        "MODEL.BGN.EPS is 0.0001 (default 1e-05), but none of the norms the model builds (GN) reads it; BGN and "
        "GhostBN do: the value has no effect. Set MODEL.BGN.EPS back to 1e-05, or use a norm that reads it."]


# the Python loaders used the last value of a key given twice without a word, where the tools warn
@pytest.mark.parametrize("load, path, overrides, said", [
    (gwdet.model_zoo.get_config, "Demo/scratch_faster_rcnn_gw_shapes.yaml",
     ["SOLVER.BASE_LR", "0.25", "SOLVER.BASE_LR", "0.0025"], "SOLVER.BASE_LR more than once (0.25, 0.0025): the last, 0.0025"),
    (build_config, str(DEMO_CONFIG), ["SOLVER.MAX_ITER", "11", "SOLVER.MAX_ITER", "13"],
     "SOLVER.MAX_ITER more than once (11, 13): the last, 13"),
    (gwdet.model_zoo.get_config, "LazyConfig/mask_rcnn_R_50_FPN_gw_shapes.py", ["train.max_iter=15", "train.max_iter=17"],
     "train.max_iter more than once (15, 17): the last, 17"),
])
def test_the_python_loaders_warn_of_an_override_key_given_twice(load, path, overrides, said):
    with logged_warnings("gwdet.utils.command_line") as messages:
        load(path, opts=overrides) if load is gwdet.model_zoo.get_config else load(path, overrides)
    assert messages == [f"The overrides set {said}, is used."]


# a tool that parses its overrides and then loads its config with them would have warned twice
def test_a_tool_warns_once_of_an_override_key_given_twice():
    from gwdet.engine.arguments import parse_args

    overrides = ["SOLVER.MAX_ITER", "21", "SOLVER.MAX_ITER", "23"]
    with logged_warnings("gwdet.utils.command_line") as messages:
        args = parse_args(["--config-file", str(DEMO_CONFIG), *overrides])
        build_config(args.config_file, args.opts)
    assert messages == ["The overrides set SOLVER.MAX_ITER more than once (21, 23): the last, 23, is used."]


# a tool's own DATALOADER.NUM_WORKERS 0 before the user's overrides was warned of as the user's key given twice
def test_a_tools_in_process_loading_is_no_override_the_user_gave_twice():
    from gwdet.engine.run import load_run_config

    with logged_warnings("gwdet.utils.command_line") as messages:
        run = load_run_config(str(DEMO_CONFIG), ["DATALOADER.NUM_WORKERS", "2"], tool=True)
    assert messages == [] and run.cfg.DATALOADER.NUM_WORKERS == 2
    assert load_run_config(str(DEMO_CONFIG), [], tool=True).cfg.DATALOADER.NUM_WORKERS == 0


def _python_value(key: str, value: object, *opts: str):
    """The demo config (tiny, on the CPU, with ``opts``) with ``key`` set to ``value`` in Python, as
    a script does after reading it (a command line's value is typed by yacs)."""
    cfg = build_config(str(DEMO_CONFIG), [*TINY_OPTS, "MODEL.DEVICE", "cpu", *opts])
    cfg.defrost()
    section, _, leaf = key.rpartition(".")
    node = cfg
    for part in section.split("."):
        node = node[part]
    node[leaf] = value
    return cfg


# Before: cfg.SOLVER.MAX_ITER = 2.0 passed, Trainer(cfg) warned "SOLVER.WARMUP_ITERS 100 is longer than
# SOLVER.MAX_ITER 2.0", built the model, loader and optimizer, and train() stopped in detectron2's loop with the raw
# "TypeError: 'float' object cannot be interpreted as an integer", leaving metrics.json and .gwdet.lock behind.
def test_a_max_iter_that_is_no_integer_is_refused_before_the_trainer_builds_or_writes_anything(tmp_path):
    from gwdet.engine.trainer import Trainer

    output = tmp_path / "run"
    cfg = _python_value("SOLVER.MAX_ITER", 2.0, "OUTPUT_DIR", str(output))
    expected = ("config: SOLVER.MAX_ITER=2.0 is no whole number of iterations (float): give the number of iterations to "
                "train as an integer of at least 1, e.g. SOLVER.MAX_ITER 2 (detectron2's training loop counts them with "
                "range(), which takes no float).")
    with logged_warnings("gwdet") as warnings, pytest.raises(GwdetValueError) as refused:
        Trainer(cfg)
    assert str(refused.value) == expected
    assert not warnings, "refused before the schedule's warnings read it"
    assert not output.exists() or not any(output.iterdir()), "nothing written"
    with pytest.raises(GwdetValueError) as refused:  # the config gate of every build, too
        check_detectron2_values(cfg)
    assert str(refused.value) == expected
    cfg.SOLVER.MAX_ITER = "2"
    with pytest.raises(GwdetValueError, match=r"^config: SOLVER\.MAX_ITER='2' is no whole number of iterations \(str\): "
                                              r"give the number of iterations to train as an integer of at least 1, "
                                              r"unquoted \(detectron2's"):
        check_detectron2_values(cfg)


# Before: floats for these counts were refused with the words of a negative value ("detectron2's scheduler would
# stretch a negative warm-up ...", "torch's DataLoader refuses a negative one"); SOLVER.IMS_PER_BATCH was refused
# by the training's checks only, reading "SOLVER.IMS_PER_BATCH is 2.0 is no whole number of images".
@pytest.mark.parametrize("key, value, message", [
    ("SOLVER.IMS_PER_BATCH", 2.0, "config: SOLVER.IMS_PER_BATCH=2.0 is no whole number of images (float): give the "
                                  "batch of all processes together as an integer, a positive multiple of 1."),
    ("SOLVER.WARMUP_ITERS", 1.0, "config: SOLVER.WARMUP_ITERS=1.0 is no whole number of warm-up iterations (float): "
                                 "give an integer of at least 0 (0: no warm-up), e.g. 1000."),
    ("DATALOADER.NUM_WORKERS", 0.0, "config: DATALOADER.NUM_WORKERS=0.0 is no whole number of data-loading processes "
                                    "(float): give an integer of at least 0 (0: load the data in the training "
                                    "process), e.g. 4."),
])
def test_counts_that_are_no_integers_are_refused_as_such_by_the_gate_and_the_training(key, value, message):
    cfg = _python_value(key, value)
    with pytest.raises(GwdetValueError) as refused:
        check_detectron2_values(cfg)
    assert str(refused.value) == message
    if key.startswith("SOLVER."):  # read by the training's checks before the gate
        with pytest.raises(GwdetValueError) as refused:
            check_training_values(cfg, 1)
        assert str(refused.value) == message


# before: c = build_config(path); c.MODEL.DEVICE = "cpu" raised yacs's "Attempted to set DEVICE to cpu, but
# CfgNode is immutable", naming neither the key's section nor the ways to change it
def test_a_key_set_on_build_configs_frozen_config_is_refused_naming_the_key_and_the_fixes():
    import pickle

    from detectron2.config import CfgNode

    cfg = build_config(str(DEMO_CONFIG))
    with pytest.raises(AttributeError, match=re.escape(
            "Cannot set MODEL.RESNETS.GW_POSITIONS to 'B3': this config is frozen (gwdet.model_zoo.build_config "
            "returns it checked and frozen, as detectron2's tools freeze theirs). Give the change as an override, "
            "build_config(path, ['MODEL.RESNETS.GW_POSITIONS', 'B3']), or call cfg.defrost() first")):
        cfg.MODEL.RESNETS.GW_POSITIONS = "B3"
    with pytest.raises(AttributeError, match=re.escape("Cannot set SEED to 3: ") + ".*" + re.escape("['SEED', '3']")):
        cfg.SEED = 3
    assert isinstance(cfg, CfgNode) and cfg.is_frozen() and cfg.MODEL.RESNETS.GW_POSITIONS == "S1-B2"
    assert pickle.loads(pickle.dumps(cfg)) == cfg and cfg.clone().is_frozen()
    plain = add_gwdet_config(get_cfg())
    plain.merge_from_file(str(DEMO_CONFIG))
    assert cfg.dump() == plain.dump()  # the same keys and values as detectron2's own merge
    changed = cfg.clone()
    changed.defrost()
    changed.MODEL.RESNETS.GW_POSITIONS = "S9"
    with pytest.raises(GwdetValueError, match="unknown position 'S9'"):  # the builder checks the changed config
        gwdet.build_model(changed)


# before: add_gwdet_config on a frozen config added MODEL.GW, MODEL.BGN, ... unfrozen: cfg.MODEL.GW.T = 3 was accepted
def test_the_sections_added_to_a_frozen_config_are_frozen_with_it():
    cfg = get_cfg()
    cfg.freeze()
    assert add_gwdet_config(cfg) is cfg and cfg.is_frozen()
    assert cfg.MODEL.GW.is_frozen() and cfg.MODEL.BGN.is_frozen() and cfg.MODEL.GW.T == add_gwdet_config(get_cfg()).MODEL.GW.T
    with pytest.raises(AttributeError, match="immutable"):
        cfg.MODEL.GW.T = 3
    with pytest.raises(AttributeError, match="immutable"):
        cfg.MODEL.BGN.EVAL_EXAMPLE_WEIGHT = 0.5
    cfg.defrost()
    cfg.MODEL.GW.T = 3
    assert cfg.MODEL.GW.T == 3
    unfrozen = add_gwdet_config(get_cfg())
    unfrozen.MODEL.GW.T = 4  # a config that is not frozen keeps its added sections changeable
    assert not unfrozen.MODEL.GW.is_frozen() and unfrozen.MODEL.GW.T == 4


# MODEL.GW.T 1000000000 and gwdet.norm('GW', T=10**9) passed the config and norm checks; only the layer refused
# it, when the model was built, naming neither the key nor the norm
@pytest.mark.parametrize("key, norm_name", [("MODEL.GW.T", "GW"), ("MODEL.BW.T", "BW_ItN")])
def test_a_newton_iteration_count_above_the_layers_limit_is_refused_by_key_and_by_norm(key, norm_name):
    import gwdet

    with pytest.raises(GwdetValueError, match=rf"^config: {re.escape(key)} must be an integer from 1 to 1000 "
                                              r"\(Newton's iterations, Eqs\. 6-7; the default is 5\), got 1001$"):
        build_config(str(DEMO_CONFIG), [key, "1001"])
    with pytest.raises(GwdetValueError, match=rf"^gwdet.norm: T of norm '{norm_name}' must be an integer from 1 to "
                                              r"1000 .*got 1000000000$"):
        gwdet.norm(norm_name, T=10**9)
    assert build_config(str(DEMO_CONFIG), [key, "1000"]) is not None
    assert gwdet.norm(norm_name, T=1000).params["T"] == 1000


# MODEL.GW.EPS 0 was told to be written as MODEL.GW.EPS 0.0, which the range check refused next
@pytest.mark.parametrize("key, value, refusal", [
    ("MODEL.GW.EPS", "0", "config: MODEL.GW.EPS must be a finite number > 0, got 0.0"),
    ("SOLVER.BASE_LR", "-1", "config: SOLVER.BASE_LR=-1.0 is no learning rate: it must be a finite number >= 0")])
def test_an_int_for_a_float_key_is_not_told_to_become_a_float_the_range_check_refuses(key, value, refusal):
    with pytest.raises(GwdetValueError) as error:
        build_config(str(DEMO_CONFIG), [key, value])
    assert f"got {value} (a int). Written with a decimal point ({key} {value}.0), it is refused too: {refusal}" \
        in str(error.value)
    with pytest.raises(GwdetValueError, match=rf"got 1 \(a int\)\. Write it with a decimal point: {re.escape(key)} "
                                              r"1\.0\.$"):
        build_config(str(DEMO_CONFIG), [key, "1"])
