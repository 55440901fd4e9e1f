"""The contracts of loading weights, pinned where a user meets them: which converted weights,
gwdet checkpoints and source files are refused (and which are not), what the refusals say, which
layouts of a source file are unwrapped.

gwdet.checkpoint.compatibility: converted weights record their architecture, GW positions and
input format, gwdet's checkpoints the type and hyper-parameters of every norm layer; all are
compared with the model before anything loads. gwdet.convert.loading: reading a source file for
tools/convert_pretrained.py. Everything here is in memory or in small files; the ResNets are built
once per module (detectron2's builders, FrozenBN: a fraction of a second each).
"""
import functools
import os
import pickle
import re

import numpy as np
import pytest
import torch
from detectron2.config import get_cfg
from detectron2.layers import FrozenBatchNorm2d, ShapeSpec
from detectron2.layers.batch_norm import LayerNorm as Detectron2LayerNorm
from detectron2.modeling import build_backbone
from detectron2.modeling.backbone.resnet import BasicStem, BottleneckBlock, ResNet
from torch import nn

from gwdet import add_gwdet_config
from gwdet.checkpoint.compatibility import (
    check_norm_settings,
    check_norm_types,
    check_weights_fit_model,
    norm_layer_types,
    norm_settings,
    norm_types,
)
from gwdet.convert.loading import (
    ConversionError,
    _unreadable_file_error,
    preview_names,
    read_source_state_dict,
)
from gwdet.layers import BatchGroupNorm, BatchWhitening, GroupWhitening
from gwdet.modeling.heads import PerLevelNorm

# What tools/convert_pretrained.py records as the input of torchvision's ImageNet weights.
TORCHVISION_INPUT = {"format": "RGB", "pixel_mean": [123.675, 116.28, 103.53],
                     "pixel_std": [58.395, 57.12, 57.375], "stride_in_1x1": False}
OPT_IN = "set the environment variable GWDET_ALLOW_NORM_MISMATCH=1"


def gw_resnet(positions: str, out_features: list, stride_in_1x1: bool, norm: str = "FrozenBN",
              gw_norm: str = "GW") -> ResNet:
    cfg = add_gwdet_config(get_cfg())
    cfg.MODEL.BACKBONE.NAME = "build_gw_resnet_backbone"
    cfg.MODEL.BACKBONE.FREEZE_AT = 0
    cfg.MODEL.RESNETS.NORM = norm
    cfg.MODEL.RESNETS.GW_NORM = gw_norm
    cfg.MODEL.ROI_HEADS.NAME = "StandardROIHeads"  # no C4 head, whose res5 the config check would send GW_NORM to
    cfg.MODEL.RESNETS.OUT_FEATURES = out_features
    cfg.MODEL.RESNETS.GW_POSITIONS = positions
    cfg.MODEL.RESNETS.STRIDE_IN_1X1 = stride_in_1x1
    return build_backbone(cfg, ShapeSpec(channels=3))


@pytest.fixture(scope="module")
def r50():
    """A ResNet-50 with GW at S1-B2, fed the torchvision way (stride in the 3x3 conv)."""
    return gw_resnet("S1-B2", ["res2", "res3", "res4", "res5"], stride_in_1x1=False)


@pytest.fixture(scope="module")
def r50_to_res3():
    """The first two stages of a ResNet-50 (OUT_FEATURES up to res3), no GW, stride in the 1x1 conv."""
    return gw_resnet("", ["res2", "res3"], stride_in_1x1=True)


class Detector(nn.Module):
    """What check_weights_fit_model reads off a detectron2 meta-architecture: the backbone's ResNet
    somewhere inside, and (when the model has them) input_format, pixel_mean and pixel_std."""

    def __init__(self, backbone, input_format=None, pixel_mean=None, pixel_std=None):
        super().__init__()
        self.backbone = backbone
        if input_format is not None:
            self.input_format = input_format
        for name, value in (("pixel_mean", pixel_mean), ("pixel_std", pixel_std)):
            if value is not None:
                self.register_buffer(name, torch.tensor(value).view(-1, 1, 1), persistent=False)


def torchvision_fed(backbone) -> Detector:
    return Detector(backbone, "RGB", TORCHVISION_INPUT["pixel_mean"], TORCHVISION_INPUT["pixel_std"])


def refusal(metadata, model) -> str:
    with pytest.raises(ValueError) as error:
        check_weights_fit_model(metadata, model)
    return str(error.value)


# ---- converted weights: architecture ---------------------------------------------------------

def test_weights_that_fit_the_model_load(r50):
    check_weights_fit_model({"arch": "R-50", "gw_positions": "S1-B2", "input": TORCHVISION_INPUT},
                            torchvision_fed(r50))


def test_a_model_without_a_resnet_is_not_checked():
    misfit = {"arch": "R-101", "gw_positions": "S1-B12", "input": {**TORCHVISION_INPUT, "format": "BGR"}}
    assert check_weights_fit_model(misfit, nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4))) is None


def test_another_depth_is_refused_naming_the_settings(r50):
    assert refusal({"arch": "R-101"}, r50) == (
        "The weights are R-101 (blocks per stage [3, 4, 23, 3], conv2 1 group x 64 channels), but the "
        "model's ResNet has blocks per stage [3, 4, 6, 3] and conv2 1 group(s) x 64 channels. Set "
        "MODEL.RESNETS.DEPTH 101, NUM_GROUPS 1, WIDTH_PER_GROUP 64, or load the weights converted for "
        "this architecture.")


def test_other_stem_and_res2_widths_are_named_with_the_blocks():
    # the demo's narrow ResNet (stem 16, res2 64, width 16): only WIDTH_PER_GROUP was named; set, the next refusal
    # called the converted file "a torchvision-layout ImageNet checkpoint" that "needs converting first"
    cfg = add_gwdet_config(get_cfg())
    cfg.MODEL.RESNETS.STEM_OUT_CHANNELS, cfg.MODEL.RESNETS.RES2_OUT_CHANNELS = 16, 64
    cfg.MODEL.RESNETS.WIDTH_PER_GROUP, cfg.MODEL.RESNETS.OUT_FEATURES = 16, ["res2"]
    narrow = build_backbone(cfg, ShapeSpec(channels=3))
    assert refusal({"arch": "R-50"}, narrow) == (
        "The weights are R-50 (blocks per stage [3, 4, 6, 3], conv2 1 group x 64 channels), but the model's ResNet has "
        "blocks per stage [3], conv2 1 group(s) x 16 channels, a stem of 16 channels and res2 of 64 channels. Set "
        "MODEL.RESNETS.DEPTH 50, NUM_GROUPS 1, WIDTH_PER_GROUP 64, STEM_OUT_CHANNELS 64, RES2_OUT_CHANNELS 256, or "
        "load the weights converted for this architecture.")


def test_another_grouping_of_conv2_is_refused(r50):
    assert refusal({"arch": "X-50-32x4d"}, torchvision_fed(r50)) == (
        "The weights are X-50-32x4d (blocks per stage [3, 4, 6, 3], conv2 32 groups x 4 channels), but "
        "the model's ResNet has blocks per stage [3, 4, 6, 3] and conv2 1 group(s) x 64 channels. Set "
        "MODEL.RESNETS.DEPTH 50, NUM_GROUPS 32, WIDTH_PER_GROUP 4, or load the weights converted for "
        "this architecture.")


def test_a_resnet_with_a_single_block_per_stage_gets_the_message_too():
    stem = BasicStem(3, 64, norm="FrozenBN")
    stage = ResNet.make_stage(BottleneckBlock, 1, in_channels=64, out_channels=256,
                              bottleneck_channels=64, norm="FrozenBN")
    resnet = ResNet(stem, [stage], out_features=["res2"])
    assert "the model's ResNet has blocks per stage [1] and conv2 1 group(s) x 64 channels. Set " \
           "MODEL.RESNETS.DEPTH 50," in refusal({"arch": "R-50"}, resnet)


def test_a_resnet_cut_after_res3_is_compared_on_the_stages_it_has(r50_to_res3):
    # R-50 and R-101 differ in res4 only: a backbone without res4 fits either.
    check_weights_fit_model({"arch": "R-101"}, r50_to_res3)
    assert "has blocks per stage [3, 4] and conv2 1 group(s) x 64 channels" in \
        refusal({"arch": "X-101-32x8d"}, r50_to_res3)


@pytest.mark.parametrize("arch", [None, "R-152"], ids=["unrecorded", "unknown"])
def test_weights_without_a_known_architecture_are_not_checked_for_one(r50, arch):
    check_weights_fit_model({"arch": arch}, r50)


# ---- converted weights: the norms outside GW -------------------------------------------------

def test_converted_norms_load_only_into_norms_of_their_kind(r50, r50_to_res3):
    check_weights_fit_model({"norm": "BN", "gw_positions": "S1-B2"}, r50)  # FrozenBN beside GW: statistics fit
    wrapped = Detector(r50)
    assert refusal({"norm": "GN"}, wrapped) == (
        "The weights were converted from a GN-style model (its norms outside GW have no running statistics), but "
        "the model's ResNet has FrozenBatchNorm2d there (backbone.res2.0.shortcut.norm, backbone.res2.0.conv1.norm, "
        "... (34 more)). Set MODEL.RESNETS.NORM GN, or load weights converted from a model with the ResNet's norms.")
    gn = gw_resnet("", ["res2", "res3"], stride_in_1x1=True, norm="GN")
    check_weights_fit_model({"norm": "GN"}, gn)
    assert refusal({"norm": "BN"}, gn).startswith(
        "The weights were converted from a BN model (its norms outside GW have running statistics), but the model's "
        "ResNet has GroupNorm there (stem.conv1.norm, res2.0.shortcut.norm, ... (")
    assert "Set MODEL.RESNETS.NORM FrozenBN, BN or SyncBN, or load" in refusal({"norm": "BN"}, gn)
    check_weights_fit_model({"norm": "unrecorded kind"}, gn)


# ---- converted weights: input format ---------------------------------------------------------

def test_every_input_difference_is_named_with_the_settings_to_set(r50_to_res3):
    model = Detector(r50_to_res3, "BGR", [103.53, 116.28, 123.675], [1.0, 1.0, 1.0])
    assert refusal({"input": TORCHVISION_INPUT}, model) == (
        "The weights were converted for images fed as torchvision feeds them, but the model differs: "
        "INPUT.FORMAT is 'BGR', the weights expect 'RGB'; "
        "MODEL.PIXEL_MEAN is [103.53, 116.28, 123.675], the weights expect [123.675, 116.28, 103.53]; "
        "MODEL.PIXEL_STD is [1.0, 1.0, 1.0], the weights expect [58.395, 57.12, 57.375]; "
        "MODEL.RESNETS.STRIDE_IN_1X1 is True, the weights expect False. "
        "Set INPUT.FORMAT 'RGB' MODEL.PIXEL_MEAN [123.675, 116.28, 103.53] "
        "MODEL.PIXEL_STD [58.395, 57.12, 57.375] MODEL.RESNETS.STRIDE_IN_1X1 False "
        "(configs/Base-RCNN-FPN.yaml sets all of them), or load weights converted for this input.")


def test_a_lazyconfig_runs_input_differences_are_named_by_its_keys(r50_to_res3):
    # a LazyConfig run was told to set MODEL.PIXEL_MEAN / MODEL.PIXEL_STD, yacs keys it has not
    model = Detector(r50_to_res3, "BGR", [103.53, 116.28, 123.675], [1.0, 1.0, 1.0])
    with pytest.raises(ValueError) as refused:
        check_weights_fit_model({"input": TORCHVISION_INPUT}, model, lazy=True)
    assert str(refused.value).endswith(
        "Set model.input_format='RGB' model.pixel_mean=[123.675, 116.28, 103.53] "
        "model.pixel_std=[58.395, 57.12, 57.375] the ResNet's stages.stride_in_1x1=False "
        "(configs/LazyConfig/mask_rcnn_R_50_FPN_gw.py sets all of them), or load weights converted for this input.")


def test_the_model_pixel_values_are_shown_to_three_decimals(r50):
    model = Detector(r50, "RGB", [127.12345, 116.28, 103.53], TORCHVISION_INPUT["pixel_std"])
    assert "MODEL.PIXEL_MEAN is [127.123, 116.28, 103.53], the weights expect [123.675, 116.28, 103.53]. " \
           "Set MODEL.PIXEL_MEAN [123.675, 116.28, 103.53] (configs" in refusal({"input": TORCHVISION_INPUT}, model)


def test_pixel_values_within_a_thousandth_fit_and_others_do_not(r50):
    close = Detector(r50, "RGB", [123.6754, 116.2796, 103.5304], [58.395, 57.12, 57.375])
    check_weights_fit_model({"input": TORCHVISION_INPUT}, close)
    off = Detector(r50, "RGB", [123.68, 116.28, 103.53], [58.395, 57.12, 57.375])
    assert "MODEL.PIXEL_MEAN is [123.68, 116.28, 103.53]" in refusal({"input": TORCHVISION_INPUT}, off)
    one_channel = Detector(r50, "RGB", [123.675], [58.395, 57.12, 57.375])
    assert "MODEL.PIXEL_MEAN is [123.675], the weights expect" in refusal({"input": TORCHVISION_INPUT}, one_channel)


def test_only_the_recorded_input_values_are_compared(r50_to_res3):
    model = Detector(r50_to_res3, "BGR", [103.53, 116.28, 123.675], [1.0, 1.0, 1.0])
    # the format, mean and stride are not recorded: only the std is compared
    only_std = {"pixel_std": TORCHVISION_INPUT["pixel_std"]}
    assert refusal({"input": only_std}, model) == (
        "The weights were converted for images fed as torchvision feeds them, but the model differs: "
        "MODEL.PIXEL_STD is [1.0, 1.0, 1.0], the weights expect [58.395, 57.12, 57.375]. "
        "Set MODEL.PIXEL_STD [58.395, 57.12, 57.375] (configs/Base-RCNN-FPN.yaml sets all of them), "
        "or load weights converted for this input.")
    check_weights_fit_model({"input": {"pixel_std": [1.0, 1.0, 1.0]}}, model)


def test_input_values_the_model_lacks_are_not_compared(r50, r50_to_res3):
    # a bare backbone has no input_format, pixel_mean, pixel_std: only the stride is compared
    check_weights_fit_model({"input": TORCHVISION_INPUT}, r50)
    assert "but the model differs: MODEL.RESNETS.STRIDE_IN_1X1 is True, the weights expect False. Set " \
           "MODEL.RESNETS.STRIDE_IN_1X1 False (configs" in refusal({"input": TORCHVISION_INPUT}, r50_to_res3)


def test_weights_without_an_input_record_are_not_checked_for_one(r50_to_res3):
    model = Detector(r50_to_res3, "BGR", [0.0, 0.0, 0.0], [1.0, 1.0, 1.0])
    check_weights_fit_model({}, model)
    check_weights_fit_model({"input": "RGB"}, model)


# ---- converted weights: GW positions ---------------------------------------------------------

def test_other_gw_positions_are_refused_naming_the_setting(r50, r50_to_res3):
    check_weights_fit_model({"gw_positions": "S1-B2"}, r50)
    assert refusal({"gw_positions": ""}, r50) == (
        "The weights have GW at '' (norms without running statistics), but the model has GW at 'S1-B2'. "
        "Set MODEL.RESNETS.GW_POSITIONS '', so that BN statistics and GW parameters each load into their "
        "own kind of layer.")
    assert refusal({"gw_positions": "B12-S1"}, r50_to_res3) == (
        "The weights have GW at 'S1-B12' (norms without running statistics), but the model has GW at ''. "
        "Set MODEL.RESNETS.GW_POSITIONS 'S1-B12', so that BN statistics and GW parameters each load into "
        "their own kind of layer.")
    # GN-style weights (no GW) into a GW model of FrozenBN elsewhere: the first fix named led to a second refusal
    assert refusal({"gw_positions": "", "norm": "GN"}, r50) == (
        "The weights have GW at '' (norms without running statistics), but the model has GW at 'S1-B2'. "
        "Set MODEL.RESNETS.GW_POSITIONS '' and MODEL.RESNETS.NORM GN, as the weights were converted from a GN-style "
        "model (its norms outside GW have no running statistics), so that GN and GW parameters each load into their "
        "own kind of layer.")
    with pytest.raises(ValueError, match=r"Set model.backbone.bottom_up.positions='S1-B12'"):  # a LazyConfig's
        check_weights_fit_model({"gw_positions": "B12-S1"}, r50_to_res3, lazy=True)


def test_another_norm_at_the_weights_gw_positions_is_named_by_its_setting():
    # GW_NORM GN / BW_ItN / BGN at S1-B2 was told to "Set MODEL.RESNETS.NORM FrozenBN" (it was) or to
    # "Set MODEL.RESNETS.GW_POSITIONS 'S1-B2'" (it was)
    ghost = gw_resnet("S1-B2", ["res2", "res3"], stride_in_1x1=True, gw_norm="GN")
    message = refusal({"norm": "BN", "gw_positions": "S1-B2"}, ghost)
    assert message.startswith("The weights have GW at 'S1-B2', but the model has GroupNorm at those positions "
                              "(stem.conv1.norm, res2.0.conv2.norm, ... (")
    assert message.endswith("so GW's parameters would load into other layers. Place GW there: MODEL.RESNETS.GW_NORM GW "
                            "(or GW_ZCA), or load weights converted from a model with that norm.")
    with pytest.raises(ValueError, match=r"Place GW there: model.backbone.bottom_up.norm.name=GW"):
        check_weights_fit_model({"gw_positions": "S1-B2"}, ghost, lazy=True)


def test_gw_weights_into_a_resnet_of_gw_everywhere_name_the_resnets_norm():
    # "Set MODEL.RESNETS.GW_POSITIONS 'S1-B2'", the value it had: the ResNet's other norms were GW too
    everywhere = gw_resnet("S1-B2", ["res2", "res3"], stride_in_1x1=True, norm="GW")
    assert refusal({"norm": "BN", "gw_positions": "S1-B2"}, everywhere) == (
        "The weights have GW at 'S1-B2' (norms without running statistics) and other norms everywhere else, but "
        "every norm of the model's ResNet is GW, so those norms' values would load into GW layers. Set "
        "MODEL.RESNETS.NORM FrozenBN (or the norm the converter reported for the weights' other norms), keeping GW "
        "at 'S1-B2'.")


# ---- gwdet checkpoints: norm layer types and hyper-parameters --------------------------------

class Norms(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm2d(4)
        self.gn = nn.GroupNorm(2, 4)
        self.gw = GroupWhitening(4, num_groups=2)
        self.bw = BatchWhitening(4, group_size=2)
        self.bgn = BatchGroupNorm(4, num_groups=2)
        self.frozen = FrozenBatchNorm2d(4)
        self.instance = nn.InstanceNorm2d(4)
        self.ln = nn.LayerNorm(4)
        self.d2_ln = Detectron2LayerNorm(4)
        self.per_level = PerLevelNorm("BN", 4, 2)
        self.conv = nn.Conv2d(4, 4, 1)
        self.relu = nn.ReLU()


NORM_TYPES = {
    "bn": "BatchNorm2d", "gn": "GroupNorm", "gw": "GroupWhitening", "bw": "BatchWhitening",
    "bgn": "BatchGroupNorm", "frozen": "FrozenBatchNorm2d", "instance": "InstanceNorm2d", "ln": "LayerNorm",
    "d2_ln": "LayerNorm", "per_level": "PerLevelNorm", "per_level.levels.0": "BatchNorm2d",
    "per_level.levels.1": "BatchNorm2d",
}


def test_norm_types_records_every_norm_layer_by_name():
    assert norm_types(Norms()) == NORM_TYPES
    assert norm_types(nn.DataParallel(Norms())) == NORM_TYPES, "a parallel wrapper's module. dropped"
    assert norm_types(nn.BatchNorm2d(4)) == {}, "the model itself is no named layer"
    assert {nn.LayerNorm, PerLevelNorm, GroupWhitening, FrozenBatchNorm2d} <= set(norm_layer_types())


def test_norm_types_records_detectron2s_per_level_batch_norms():
    from detectron2.layers.batch_norm import CycleBatchNormList

    model = nn.Sequential(CycleBatchNormList(2, num_features=4))
    assert norm_types(model) == {"0": "CycleBatchNormList", "0.0": "BatchNorm2d", "0.1": "BatchNorm2d"}


def test_norm_settings_records_the_values_that_make_each_layer_its_function():
    assert norm_settings(nn.DataParallel(Norms())) == {
        "bn": {"eps": 1e-5, "momentum": 0.1, "affine": True, "track_running_stats": True},
        "gn": {"num_groups": 2, "eps": 1e-5, "affine": True},
        "gw": {"num_groups": 2, "T": 5, "eps": 1e-5, "method": "itn"},
        "bw": {"group_size": 2, "T": 5, "eps": 1e-5, "momentum": 0.1, "method": "zca"},
        "bgn": {"num_groups": 2, "examples_per_group": 2, "eps": 1e-5, "momentum": 0.1, "eval_example_weight": 0.0},
        "frozen": {"eps": 1e-5},
        "instance": {"eps": 1e-5, "momentum": 0.1, "affine": False, "track_running_stats": False},
        "ln": {"normalized_shape": [4], "eps": 1e-5, "elementwise_affine": True},
        "d2_ln": {"eps": 1e-6},
        "per_level.levels.0": {"eps": 1e-5, "momentum": 0.1, "affine": True, "track_running_stats": True},
        "per_level.levels.1": {"eps": 1e-5, "momentum": 0.1, "affine": True, "track_running_stats": True},
    }
    assert norm_settings(GroupWhitening(4)) == {}, "the model itself is no named layer"


def test_other_norm_types_are_refused_naming_up_to_three_layers():
    saved = dict(NORM_TYPES, bn="GroupWhitening", gn="BatchNorm2d", gw="GroupNorm", bw="GroupNorm",
                 removed="GroupNorm")
    with pytest.raises(ValueError) as error:
        check_norm_types(saved, Norms(), OPT_IN)
    assert str(error.value) == (
        "The checkpoint was trained with other norm layers than this config builds (4 layers, e.g. "
        "bn: GroupWhitening -> BatchNorm2d; gn: BatchNorm2d -> GroupNorm; gw: GroupNorm -> GroupWhitening); "
        "nothing was loaded. Load weights trained with this config's NORM values (a LazyConfig's norm nodes), or set the environment "
        "variable GWDET_ALLOW_NORM_MISMATCH=1 to load them anyway.")


def test_batch_norms_of_every_kind_take_each_others_weights_with_the_same_eps():
    # BN-trained weights into FrozenBN (detectron2's way of fine-tuning) or SyncBN were refused as other
    # norm layers, though the layers make one function of them at evaluation
    saved = dict(NORM_TYPES, bn="FrozenBatchNorm2d", frozen="SyncBatchNorm")
    check_norm_types(saved, Norms(), OPT_IN)
    check_norm_settings({"bn": {"eps": 1e-5}, "frozen": {"eps": 1e-5, "momentum": 0.3}}, Norms(), OPT_IN, saved)
    with pytest.raises(ValueError, match=r"\(1 values, e.g. frozen eps 0.001 -> 1e-05\)"):
        check_norm_settings({"frozen": {"eps": 1e-3, "momentum": 0.1}}, Norms(), OPT_IN, saved)
    with pytest.raises(ValueError, match=r"\(1 layers, e.g. gn: BatchNorm2d -> GroupNorm\)"):
        check_norm_types(dict(saved, gn="BatchNorm2d"), Norms(), OPT_IN)


def test_a_recorded_norms_place_holding_a_layer_of_no_known_norm_is_refused():
    # a registered name rebound to another class (without layer_types) between training and evaluation
    class OwnLayerNorm(nn.Module):
        def forward(self, x):
            return x

    model = Norms()
    model.gn = OwnLayerNorm()
    with pytest.raises(ValueError, match=r"\(1 layers, e.g. gn: GroupNorm -> OwnLayerNorm\)"):
        check_norm_types(NORM_TYPES, model, OPT_IN)


def test_the_same_norm_types_and_layers_unknown_to_the_checkpoint_pass():
    check_norm_types(NORM_TYPES, Norms(), OPT_IN)
    check_norm_types({"bn": "BatchNorm2d", "elsewhere.gn": "GroupNorm"}, Norms(), OPT_IN)
    check_norm_types({}, Norms(), OPT_IN)


def test_other_norm_hyper_parameters_are_refused_naming_up_to_three_values():
    saved = norm_settings(Norms())
    saved["gw"] = {**saved["gw"], "num_groups": 4, "T": 3}
    saved["bw"] = {**saved["bw"], "method": "itn"}
    saved["frozen"] = {"eps": 1e-3}
    with pytest.raises(ValueError) as error:
        check_norm_settings(saved, Norms(), OPT_IN)
    assert str(error.value) == (
        "The checkpoint was trained with other norm hyper-parameters than this config gives its layers "
        "(4 values, e.g. gw num_groups 4 -> 2; gw T 3 -> 5; bw method 'itn' -> 'zca'); nothing was loaded. "
        "Use the values the weights were trained with (the run's config.yaml: MODEL.GW.*, MODEL.BW.*, "
        "MODEL.BGN.*, MODEL.GN.NUM_GROUPS, and for a method the norm's name, GW or GW_ZCA, BW or BW_ItN, in "
        "MODEL.RESNETS.GW_NORM and "
        "the NORM keys; a LazyConfig's: the norm nodes' values, e.g. "
        "model.backbone.norm.num_groups), or set the environment variable GWDET_ALLOW_NORM_MISMATCH=1 to load them "
        "anyway.")


def test_the_same_norm_hyper_parameters_and_unrecorded_ones_pass():
    check_norm_settings(norm_settings(Norms()), Norms(), OPT_IN)
    # a layer or a value the checkpoint did not record (an older gwdet's) is not compared
    check_norm_settings({"gw": {"num_groups": 2}, "bn": None, "unknown": {"eps": 1.0}}, Norms(), OPT_IN)


# before: a BN checkpoint loaded into BatchNorm2d(affine=False) or (track_running_stats=False), and a GN one into
# GroupNorm(affine=False), with only detectron2's "keys not used" log: the weights or statistics were dropped
@pytest.mark.parametrize("trained, built, finding", [
    (lambda: nn.BatchNorm2d(8), lambda: nn.BatchNorm2d(8, affine=False), "1 affine True -> False"),
    (lambda: nn.BatchNorm2d(8, affine=False), lambda: nn.BatchNorm2d(8), "1 affine False -> True"),
    (lambda: nn.BatchNorm2d(8), lambda: nn.BatchNorm2d(8, track_running_stats=False),
     "1 track_running_stats True -> False"),
    (lambda: nn.GroupNorm(4, 8), lambda: nn.GroupNorm(4, 8, affine=False), "1 affine True -> False"),
    # a FrozenBN normalizes with running statistics, which a batch norm without them did not save
    (lambda: nn.BatchNorm2d(8, track_running_stats=False), lambda: FrozenBatchNorm2d(8),
     "1 track_running_stats False -> True"),
], ids=["BN affine", "BN not affine", "BN running statistics", "GN affine", "BN without statistics into FrozenBN"])
def test_batch_and_group_norms_without_the_trained_affine_or_statistics_are_refused(tmp_path, trained, built,
                                                                                      finding):
    from gwdet.checkpoint.resilient import ResilientCheckpointer

    ResilientCheckpointer(nn.Sequential(nn.Conv2d(3, 8, 1), trained()), str(tmp_path)).save("w")
    model = nn.Sequential(nn.Conv2d(3, 8, 1), built())
    before = {key: value.clone() for key, value in model.state_dict().items()}
    with pytest.raises(ValueError, match=rf"other norm hyper-parameters .*\(1 values, e\.g\. {finding}\); nothing "
                                         r"was loaded\. .*GWDET_ALLOW_NORM_MISMATCH=1"):
        ResilientCheckpointer(model).load(str(tmp_path / "w.pth"))
    assert all(torch.equal(value, before[key]) for key, value in model.state_dict().items())


# before: these loaded too (affine and track_running_stats were not recorded); kept so now that they are: a
# checkpoint of an older gwdet, and BN-trained weights into FrozenBN (which has neither attribute)
def test_records_without_affine_and_batch_norm_weights_into_frozen_batch_norm_still_load(tmp_path):
    from gwdet.checkpoint.compatibility import NORM_SETTINGS_KEY
    from gwdet.checkpoint.integrity import CHECKSUMS_KEY, STATE_CHECKSUMS_KEY
    from gwdet.checkpoint.resilient import ResilientCheckpointer

    torch.manual_seed(0)
    trained = nn.Sequential(nn.Conv2d(3, 8, 1), nn.BatchNorm2d(8), nn.GroupNorm(4, 8))
    trained.train()
    trained(torch.randn(4, 3, 4, 4) * 5 + 2)
    ResilientCheckpointer(trained, str(tmp_path)).save("w")
    path = str(tmp_path / "w.pth")
    checkpoint = torch.load(path, weights_only=False)
    assert checkpoint[NORM_SETTINGS_KEY]["1"] == {"eps": 1e-5, "momentum": 0.1, "affine": True,
                                                  "track_running_stats": True}
    # a checkpoint of an older gwdet records neither affine nor track_running_stats: not compared
    checkpoint[NORM_SETTINGS_KEY] = {"1": {"eps": 1e-5, "momentum": 0.1}, "2": {"num_groups": 4, "eps": 1e-5}}
    for key in (CHECKSUMS_KEY, STATE_CHECKSUMS_KEY):  # an older file without checksums of the records
        checkpoint.pop(key, None)
    torch.save(checkpoint, str(tmp_path / "old.pth"))
    ResilientCheckpointer(nn.Sequential(nn.Conv2d(3, 8, 1), nn.BatchNorm2d(8, affine=False), nn.GroupNorm(4, 8))).load(
        str(tmp_path / "old.pth"))
    # BN-trained weights (with or without affine) into FrozenBN load, its statistics and weights the trained ones
    frozen = nn.Sequential(nn.Conv2d(3, 8, 1), FrozenBatchNorm2d(8), nn.GroupNorm(4, 8))
    ResilientCheckpointer(frozen).load(path)
    assert torch.equal(frozen[1].running_var, trained[1].running_var)
    trained.eval()
    x = torch.randn(2, 3, 4, 4)
    assert torch.allclose(frozen(x), trained(x), atol=1e-5)
    ResilientCheckpointer(nn.Sequential(nn.BatchNorm2d(3, affine=False)), str(tmp_path)).save("no_affine")
    ResilientCheckpointer(nn.Sequential(FrozenBatchNorm2d(3))).load(str(tmp_path / "no_affine.pth"))


# before: a BN checkpoint loaded into FrozenBN (detectron2's FREEZE_AT) warned that momentum 0.1 was not compared and
# proposed gwdet.norm('NAME', momentum=0.1), which gwdet refuses for BN: a frozen batch norm has no momentum
def test_batch_norm_weights_into_frozen_batch_norm_warn_of_no_uncompared_values(tmp_path):
    from gwdet.checkpoint.compatibility import uncompared_norm_settings
    from gwdet.checkpoint.resilient import ResilientCheckpointer
    from conftest import logged_warnings

    ResilientCheckpointer(nn.Sequential(nn.Conv2d(3, 8, 1), nn.BatchNorm2d(8, momentum=0.3)), str(tmp_path)).save("w")
    with logged_warnings("gwdet.checkpoint.resilient") as messages:
        ResilientCheckpointer(nn.Sequential(nn.Conv2d(3, 8, 1), FrozenBatchNorm2d(8))).load(str(tmp_path / "w.pth"))
    assert messages == []
    saved = {"bn": {"eps": 1e-5, "momentum": 0.3, "affine": False, "track_running_stats": True}}
    assert uncompared_norm_settings(saved, nn.Module(), {"bn": "BatchNorm2d"}) == []
    model = nn.Sequential()
    model.add_module("bn", FrozenBatchNorm2d(4))
    assert uncompared_norm_settings(saved, model, {"bn": "BatchNorm2d"}) == []
    # a value of a registered norm a FrozenBN does not hold is still named
    found = uncompared_norm_settings({"bn": {**saved["bn"], "scale": 2.0}}, model, {"bn": "BatchNorm2d"})
    assert [(item.layer, item.kind, item.values) for item in found] == [("bn", "FrozenBatchNorm2d", {"scale": 2.0})]


class _ScaledGroupNorm(nn.GroupNorm):
    """A GroupNorm with a setting of its own (a registered norm's layer)."""

    def __init__(self, channels: int, scale: float) -> None:
        super().__init__(2, channels)
        self.scale = scale


# before: a registered norm's layer built by hand (not through gwdet.norm) loaded weights recorded with scale 2.0
# into its scale 3.0 without a word, while the same layer built with gwdet.norm was refused; registered without
# layer_types, it was not warned of either
@pytest.mark.parametrize("layer_types", [(_ScaledGroupNorm,), ()])
def test_recorded_norm_values_a_hand_built_layer_cannot_compare_are_warned_of(tmp_path, registered, layer_types):
    import gwdet
    from gwdet.checkpoint.resilient import ResilientCheckpointer
    from conftest import logged_warnings

    registered.append("TestScaledGN")
    gwdet.register_norm("TestScaledGN", lambda channels, scale=1.0: _ScaledGroupNorm(channels, scale),
                        layer_types=layer_types)
    ResilientCheckpointer(nn.Sequential(nn.Conv2d(3, 8, 3), gwdet.norm("TestScaledGN", scale=2.0)(8)),
                          str(tmp_path)).save("w")
    path = str(tmp_path / "w.pth")
    with logged_warnings("gwdet.checkpoint.resilient") as messages:
        ResilientCheckpointer(nn.Sequential(nn.Conv2d(3, 8, 3), _ScaledGroupNorm(8, 3.0))).load(path)
    assert messages == [
        f"{path} records norm values that were not compared for 1 layer(s) of this model (1 (_ScaledGroupNorm, of the "
        "norm 'TestScaledGN'): scale 2.0): the model's layer records no settings of its norm (it was built without "
        "gwdet.norm), so it loads weights trained with other values just as well. To have them compared, build the "
        "layer with gwdet.norm (e.g. gwdet.norm('TestScaledGN', scale=2.0)(channels), or a config's NORM key naming "
        "the norm), which records the values it builds with."]
    # built with gwdet.norm, the values are compared: the same ones load without a word, others are refused
    with logged_warnings("gwdet.checkpoint.resilient") as messages:
        ResilientCheckpointer(nn.Sequential(nn.Conv2d(3, 8, 3), gwdet.norm("TestScaledGN", scale=2.0)(8))).load(path)
    assert messages == []
    with pytest.raises(ValueError, match=r"other norm hyper-parameters .*1 scale 2.0 -> 3.0"):
        ResilientCheckpointer(nn.Sequential(nn.Conv2d(3, 8, 3), gwdet.norm("TestScaledGN", scale=3.0)(8))).load(path)
    gwdet.norms.unregister_norm("TestScaledGN")
    registered.remove("TestScaledGN")
    with logged_warnings("gwdet.checkpoint.resilient") as messages:  # the name is gone: the values alone are named
        ResilientCheckpointer(nn.Sequential(nn.Conv2d(3, 8, 3), _ScaledGroupNorm(8, 3.0))).load(path)
    assert len(messages) == 1 and "(1 (_ScaledGroupNorm): scale 2.0)" in messages[0] \
        and "gwdet.norm('NAME', scale=2.0)(channels)" in messages[0]


class _Affine(nn.Module):
    """A user's own norm layer of a class no norm name gives as its layer type: a learned per-channel affine."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((channels,), 3.0))
        self.bias = nn.Parameter(torch.full((channels,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight.view(1, -1, 1, 1) + self.bias.view(1, -1, 1, 1)


def _untyped_affine_saved(tmp_path, registered: list, how: str):
    """The norm of :class:`_Affine` layers, registered without ``layer_types`` or given as a bare
    callable (``how``), with a model of it saved by gwdet's checkpointer as ``tmp_path/w.pth``."""
    import gwdet
    from gwdet.checkpoint.resilient import ResilientCheckpointer

    if how == "a bare callable":
        norm = _Affine
    else:
        registered.append("TestAffine")
        gwdet.register_norm("TestAffine", lambda channels: _Affine(channels))
        norm = gwdet.norm("TestAffine")
    ResilientCheckpointer(nn.Sequential(nn.Conv2d(3, 8, 3), norm(8)), str(tmp_path)).save("w")
    return norm


# before: gwdet's own checkpoint of a norm registered without layer_types (or of a bare callable norm) recorded no type
# at the layer's place, and its weights loaded into a GW layer (gwdet.norm("GW")) there without a word, where the same
# weights in a plain torch.save file were refused
@pytest.mark.parametrize("how", ["registered without layer_types", "a bare callable"])
def test_weights_of_a_norm_whose_type_is_not_recorded_are_refused_for_a_gw_layer(tmp_path, registered, how):
    import gwdet
    from gwdet.checkpoint.resilient import ResilientCheckpointer

    _untyped_affine_saved(tmp_path, registered, how)
    path = str(tmp_path / "w.pth")
    gw = nn.Sequential(nn.Conv2d(3, 8, 3), gwdet.norm("GW", num_groups=2)(8))
    with pytest.raises(ValueError) as refused:
        ResilientCheckpointer(gw, str(tmp_path / "run")).load(path)
    assert str(refused.value) == (
        "The checkpoint holds weights for 1 gwdet norm layer(s) of this model (1 (GroupWhitening)) but not the "
        "settings these layers save with their weights (_extra_state), and the file's record of norm types has no "
        "norm layer at these places (it records every gwdet layer it holds): they come from layers of another kind "
        "with the same shapes (a norm registered without layer_types, or given as a callable, records no type: "
        "register it with layer_types=(TheClass,) to have its layers recorded), so they were not trained as these "
        "layers; nothing was loaded. Load weights trained with this config (gwdet's checkpoints record their norms), "
        "or set the environment variable GWDET_ALLOW_NORM_MISMATCH=1 to load them anyway.")
    assert torch.equal(gw[1].weight, torch.ones(8)), "nothing was loaded"


# before: loaded as well; pinned so that the refusal above leaves the same norm, its type recorded nowhere,
# loading into its own model
@pytest.mark.parametrize("how", ["registered without layer_types", "a bare callable"])
def test_weights_of_a_norm_whose_type_is_not_recorded_load_into_the_same_norm(tmp_path, registered, how):
    from conftest import logged_warnings
    from gwdet.checkpoint.resilient import ResilientCheckpointer

    norm = _untyped_affine_saved(tmp_path, registered, how)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), norm(8))
    with torch.no_grad():
        model[1].weight.fill_(1.0)
    with logged_warnings("gwdet.checkpoint.resilient") as messages:
        ResilientCheckpointer(model, str(tmp_path / "run")).load(str(tmp_path / "w.pth"))
    assert messages == []
    assert torch.equal(model[1].weight, torch.full((8,), 3.0))


class _Scale(nn.Module):
    """A registered norm's layer with a setting of its own, of a class no norm name gives as its layer type."""

    def __init__(self, channels: int, scale: float) -> None:
        super().__init__()
        self.scale = scale
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale * self.weight.view(1, -1, 1, 1) + self.bias.view(1, -1, 1, 1)


# before: weights of a registered norm 'Scale' (scale 2.0, no layer_types) loaded into a GW, GN or BN layer built
# with gwdet.norm with only a warning that the model's layer "was built without gwdet.norm", naming neither kind
@pytest.mark.parametrize("loading, kind", [(("GW", {"num_groups": 2}), "GroupWhitening"),
                                           (("GN", {"num_groups": 2}), "GroupNorm"),
                                           (("BN", {}), "BatchNorm2d")])
def test_a_registered_norms_recorded_values_at_a_place_of_another_norm_are_refused_naming_both(
        tmp_path, registered, monkeypatch, loading, kind):
    import gwdet
    from conftest import logged_warnings
    from gwdet.checkpoint.resilient import ResilientCheckpointer

    registered.append("TestScale")
    gwdet.register_norm("TestScale", lambda channels, scale=1.0: _Scale(channels, scale))
    ResilientCheckpointer(nn.Sequential(nn.Conv2d(3, 8, 3), gwdet.norm("TestScale", scale=2.0)(8)),
                          str(tmp_path)).save("w")
    path = str(tmp_path / "w.pth")
    name, values = loading
    finding = (f"The checkpoint was trained with other norm layers than this config builds (1 layers, e.g. 1: a layer "
               f"of the norm 'TestScale' (scale 2.0), of a class the checkpoint does not record -> {kind})")
    with pytest.raises(ValueError) as refused:
        ResilientCheckpointer(nn.Sequential(nn.Conv2d(3, 8, 3), gwdet.norm(name, **values)(8))).load(path)
    assert str(refused.value).startswith(finding + "; nothing was loaded.")
    monkeypatch.setenv("GWDET_ALLOW_NORM_MISMATCH", "1")  # loaded as asked: no word of a layer built without gwdet.norm
    with logged_warnings("gwdet.checkpoint.resilient") as messages:
        ResilientCheckpointer(nn.Sequential(nn.Conv2d(3, 8, 3), gwdet.norm(name, **values)(8))).load(path)
    assert finding in messages[0] and not [line for line in messages if "built without gwdet.norm" in line], messages


# ---- source files: readable files -------------------------------------------------------------

def test_missing_and_unreadable_paths_are_refused_saying_what_to_do(tmp_path, monkeypatch):
    missing = tmp_path / "missing.pth"
    with pytest.raises(ConversionError) as error:
        read_source_state_dict(missing)
    assert str(error.value) == f"{missing}: no such file. Check the input path."
    # torchvision's URL (docs/weights.md downloads it) was "no such file. Check the input path."
    url = "https://download.pytorch.org/models/resnet50-0676ba61.pth"
    with pytest.raises(ConversionError, match=r"the converter reads a local file, not a URL. Download it first \(e.g. "
                                              r"wget https://"):
        read_source_state_dict(url)
    with pytest.raises(ConversionError) as error:
        read_source_state_dict(tmp_path)
    assert str(error.value) == f"{tmp_path}: not a regular file. Pass the checkpoint file itself."
    empty = tmp_path / "empty.pth"
    empty.write_bytes(b"")
    with pytest.raises(ConversionError) as error:
        read_source_state_dict(empty)
    assert str(error.value) == f"{empty}: the file is empty (an interrupted download?)."
    unreadable = tmp_path / "unreadable.pth"
    torch.save({"conv1.weight": torch.ones(1)}, unreadable)
    real_access = os.access
    # chmod does not stop root, who runs these tests in containers: the check asks os.access
    monkeypatch.setattr(os, "access", lambda path, mode: mode != os.R_OK and real_access(path, mode))
    with pytest.raises(ConversionError) as error:
        read_source_state_dict(str(unreadable))
    assert str(error.value) == f"{unreadable}: permission denied. Make the file readable for this user."


def test_a_file_torch_save_did_not_write_is_refused(tmp_path):
    text = tmp_path / "weights.pth"
    text.write_bytes(b"conv1.weight 0.1 0.2\n")
    with pytest.raises(ConversionError) as error:
        read_source_state_dict(text)
    assert str(error.value) == (
        f"{text}: not a PyTorch checkpoint: it does not start like a file written by torch.save (a zip archive "
        "or a pickle). Expected a .pth/.pt file written by torch.save, holding a torchvision-layout ResNet/ResNeXt "
        "state dict.")


def test_a_detectron2_pkl_is_pointed_to_model_weights(tmp_path):
    zoo = tmp_path / "R-50.pkl"
    zoo.write_bytes(pickle.dumps({"model": {}}, protocol=4))
    with pytest.raises(ConversionError) as error:
        read_source_state_dict(zoo)
    assert str(error.value).endswith(
        "holding a torchvision-layout ResNet/ResNeXt state dict. A .pkl from detectron2's model zoo needs "
        "no conversion: use it as MODEL.WEIGHTS.")


def test_a_truncated_file_names_what_torch_found(tmp_path):
    source = tmp_path / "in.pth"
    torch.save({"conv1.weight": torch.zeros(64, 3, 7, 7)}, source, _use_new_zipfile_serialization=False)
    source.write_bytes(source.read_bytes()[:-5])
    with pytest.raises(ConversionError) as error:
        read_source_state_dict(source)
    message = str(error.value)  # torch's own words: its first sentence only
    assert message.startswith(f"{source}: the file is truncated or corrupted (RuntimeError: unexpected EOF")
    assert message.endswith(
        "). It starts like a torch.save file but cannot be read to the end; download or save it again.")
    assert "might be corrupted" not in message, "torch's second sentence"


def test_a_truncated_file_without_torchs_words_says_no_details(tmp_path):
    source = tmp_path / "in.pth"
    torch.save({"conv1.weight": torch.zeros(4)}, source, _use_new_zipfile_serialization=False)
    source.write_bytes(source.read_bytes()[:20])
    with pytest.raises(ConversionError) as error:
        read_source_state_dict(source)
    assert "the file is truncated or corrupted (EOFError: no details). It starts" in str(error.value)


def test_a_corrupted_pickle_names_the_unpicklers_error_not_torchs_wrapper(tmp_path):
    # torch.load(weights_only=True) raises "Weights only load failed..." from the unpickler's own
    # error; the message names the latter, which says what is wrong with the file.
    source = tmp_path / "in.pth"
    source.write_bytes(b"\x80\x02\xff\xff\xff")
    with pytest.raises(ConversionError) as error:
        read_source_state_dict(source)
    message = str(error.value)
    assert message.startswith(f"{source}: the file is truncated or corrupted (UnpicklingError: Unsupported "
                              "operand 255). It starts like a torch.save file")
    assert "Weights only load failed" not in message


def test_other_errors_are_named_as_raised_by_their_first_sentence(tmp_path):
    source = tmp_path / "in.pkl"
    source.write_bytes(b"PK\x03\x04 a damaged archive")
    try:
        try:
            raise KeyError("data.pkl")
        except KeyError:  # an error raised while handling another names itself, not the other
            raise RuntimeError("PytorchStreamReader failed reading zip archive: not a ZIP archive. This is "
                               "an internal miniz error.") from None
    except RuntimeError as raised:
        error = _unreadable_file_error(str(source), raised)
    assert str(error) == (
        f"{source}: the file is truncated or corrupted (RuntimeError: PytorchStreamReader failed reading zip "
        "archive: not a ZIP archive). It starts like a torch.save file but cannot be read to the end; "
        "download or save it again. A .pkl from detectron2's model zoo needs no conversion: use it as "
        "MODEL.WEIGHTS.")
    # the first line, without its full stop (and only that: the sentence's own letters stay)
    first_line = _unreadable_file_error(str(source), ValueError("Written by another platform: UNIX.\nSee the docs."))
    assert "(ValueError: Written by another platform: UNIX). It starts" in str(first_line)


def test_a_file_that_needs_unsafe_unpickling_names_the_flag(tmp_path):
    source = tmp_path / "module.pth"
    torch.save(nn.Sequential(nn.Conv2d(3, 4, 1)), source)
    with pytest.raises(ConversionError) as error:
        read_source_state_dict(source)
    message = str(error.value)
    assert message.startswith(f"{source}: refusing to load this file. It needs unsafe unpickling")
    assert "If you trust where the file comes from, pass --allow-unsafe-pickle (allow_unsafe_pickle=True);" in message
    assert error.value.__cause__ is None and error.value.__suppress_context__


# ---- source files: unwrapping -----------------------------------------------------------------

def saved(tmp_path, content, name="in.pth"):
    path = tmp_path / name
    torch.save(content, path)
    return path


def test_two_different_networks_under_state_dict_and_model_are_refused_and_two_copies_of_one_are_read(tmp_path):
    # before: the 'state_dict' entry was converted and the other network passed over without a word
    path = saved(tmp_path, {"model": {"fc.weight": torch.ones(1)}, "state_dict": {"conv1.weight": torch.ones(1)}})
    with pytest.raises(ConversionError, match=r"different networks, under 'state_dict' and 'model'.*Save the one"):
        read_source_state_dict(path)
    path = saved(tmp_path, {"state_dict": {"conv1.weight": torch.ones(2)}, "model": {"conv1.weight": torch.ones(2)}})
    assert read_source_state_dict(path).wrapping == "'state_dict' entry"
    # an EMA copy beside the model ('model_ema', timm's 'state_dict_ema') was passed over without a word
    path = saved(tmp_path, {"model": {"conv1.weight": torch.ones(2)}, "model_ema": {"conv1.weight": torch.zeros(2)}})
    with pytest.raises(ConversionError, match=r"different networks, under 'model' and 'model_ema'; .*"
                                              r"torch.load\(.*\)\['model'\], 'weights.pth'\)"):
        read_source_state_dict(path)


def test_a_state_dict_of_meta_tensors_is_named(tmp_path):
    # a raw TypeError: can't convert meta device type tensor to numpy
    path = saved(tmp_path, {"conv1.weight": torch.empty(2, 3, device="meta")})
    with pytest.raises(ConversionError, match=r"its tensors hold no values \(1 on the meta device, e.g. "
                                              r"'conv1.weight'\)"):
        read_source_state_dict(path)


def test_an_entry_that_is_not_a_dict_of_tensors_is_passed_over(tmp_path):
    path = saved(tmp_path, {"state_dict": {"conv1.weight": torch.ones(1), "epoch": 3},
                            "model": {"conv1.weight": torch.ones(1)}, "epoch": 3})
    assert read_source_state_dict(path).wrapping == "'model' entry"
    path = saved(tmp_path, {"state_dict": [torch.ones(1)], "model": {"conv1.weight": torch.ones(1)}})
    assert read_source_state_dict(path).wrapping == "'model' entry"


def test_a_pickled_module_in_an_entry_is_unwrapped_when_allowed(tmp_path):
    path = saved(tmp_path, {"model": nn.Linear(2, 3), "epoch": 1})
    with pytest.raises(ConversionError, match="torch.nn.modules.linear.Linear"):
        read_source_state_dict(path)
    source = read_source_state_dict(path, allow_unsafe_pickle=True)
    assert (sorted(source.tensors), source.wrapping) == (["bias", "weight"], "pickled nn.Module in 'model'")


def test_a_pickled_module_without_parameters_gives_no_tensors(tmp_path):
    source = read_source_state_dict(saved(tmp_path, nn.ReLU()), allow_unsafe_pickle=True)
    assert (source.tensors, source.wrapping, source.stripped_prefix) == ({}, "pickled nn.Module", "")


def test_a_file_holding_no_dict_is_refused(tmp_path):
    path = saved(tmp_path, [torch.ones(1)])
    with pytest.raises(ConversionError) as error:
        read_source_state_dict(path)
    assert str(error.value) == (
        f"{path}: holds a list, not a state dict. Expected a dict of tensors, or a dict with the state "
        "dict under 'state_dict' or 'model'.")


# an integer key among tensors was refused as "neither are all its values tensors", which they were
@pytest.mark.parametrize("content, keys, odd", [
    ({}, "[]", "no entries"),
    ({0: torch.ones(1)}, "['0']", "entries whose keys are not parameter names (0)"),
    ({"conv1.weight": torch.ones(1), 0: torch.zeros(1)}, "['conv1.weight', '0']",
     "entries whose keys are not parameter names (0)"),
    ({"state_dict": {}, "model": {}}, "['state_dict', 'model']", "entries that are not tensors ('state_dict', 'model')"),
    ({f"tensor{i}": torch.ones(1) for i in range(9)} | {"epoch": 90},
     "['tensor0', 'tensor1', 'tensor2', 'tensor3', 'tensor4', 'tensor5', 'tensor6', 'tensor7', ... (2 more)]",
     "entries that are not tensors ('epoch')"),
], ids=["empty", "int-keys", "tensors-and-an-int-key", "empty-entries", "nine-tensors-and-an-epoch"])
def test_a_dict_without_a_state_dict_is_refused_naming_its_keys(tmp_path, content, keys, odd):
    path = saved(tmp_path, content)
    with pytest.raises(ConversionError) as error:
        read_source_state_dict(path)
    assert str(error.value) == (
        f"{path}: no state dict found. The file holds a dict with keys {keys}, with {odd}, so it is no state dict "
        "(parameter names to tensors), nor does it have a 'state_dict' or 'model' entry that is one. Save the "
        "network's state_dict() alone (without the extra entries) and convert that file.")


def test_data_parallel_prefixes_are_removed_as_often_as_every_key_has_them(tmp_path):
    nested = {"module.module.conv1.weight": torch.ones(1), "module.module.fc.bias": torch.ones(1)}
    source = read_source_state_dict(saved(tmp_path, {"model": nested}))
    assert (sorted(source.tensors), source.stripped_prefix) == (["conv1.weight", "fc.bias"], "module.module.")
    partly = {"module.conv1.weight": torch.ones(1), "fc.bias": torch.ones(1)}  # two models' names mixed
    with pytest.raises(ConversionError, match=r"1 of the 2 tensors' names start with 'module.'"):
        read_source_state_dict(saved(tmp_path, partly))


def test_preview_names_shows_eight_names_then_a_count():
    names = [f"n{i}" for i in range(10)]
    assert preview_names(names[:8]) == "['n0', 'n1', 'n2', 'n3', 'n4', 'n5', 'n6', 'n7']"
    assert preview_names(names[:9]) == "['n0', 'n1', 'n2', 'n3', 'n4', 'n5', 'n6', 'n7', ... (1 more)]"
    assert preview_names(names, 3) == "['n0', 'n1', 'n2', ... (7 more)]"
    assert preview_names([]) == "[]"


# ---- sweep 12: numpy numbers in a checkpoint, a child named "module", a checkpointer without a folder ----

def test_a_checkpoint_holding_numpy_numbers_resumes_without_unsafe_unpickling(tmp_path):
    # an np.logspace learning rate was refused as "needs unsafe unpickling", advice that dropped the optimizer
    import numpy as np

    from gwdet.checkpoint.resilient import ResilientCheckpointer

    model = nn.Sequential(nn.Conv2d(3, 16, 3), GroupWhitening(16, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=np.logspace(-3, -1, 3)[1], momentum=0.9)
    ResilientCheckpointer(model, save_dir=str(tmp_path), optimizer=optimizer).save("model_0000009",
                                                                                   iteration=np.int64(9))
    fresh = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    loaded = ResilientCheckpointer(model, save_dir=str(tmp_path), optimizer=fresh).resume_or_load("", resume=True)
    assert loaded["iteration"] == 9 and fresh.param_groups[0]["lr"] == pytest.approx(0.01)


def test_only_a_parallel_wrapper_is_unwrapped_not_a_child_named_module():
    class Holder(nn.Module):  # EMA and wrapper code name a child "module"
        def __init__(self):
            super().__init__()
            self.module = nn.Sequential(nn.Conv2d(3, 16, 1), GroupWhitening(16, 4))
            self.head = GroupWhitening(16, 2)

    holder = Holder()
    assert norm_types(holder) == {"module.1": "GroupWhitening", "head": "GroupWhitening"}
    assert norm_types(nn.DataParallel(holder)) == norm_types(holder)


def test_a_checkpointer_without_a_folder_says_it_saved_nothing(caplog):
    from gwdet.checkpoint.resilient import ResilientCheckpointer

    # a warning on fvcore's logger went unseen in a script without logging set up: refused
    with pytest.raises(ValueError, match=r"^Checkpoint 'model_final' cannot be saved: the checkpointer has no "
                                         r"save_dir \(the folder to save into\); nothing was written"):
        ResilientCheckpointer(nn.Sequential(GroupWhitening(16, 4))).save("model_final")
    caplog.clear()
    with caplog.at_level("WARNING"):  # another process of a run: its main process saves
        ResilientCheckpointer(nn.Sequential(GroupWhitening(16, 4)), save_to_disk=False).save("model_final")
    assert "not saved" not in caplog.text


@pytest.mark.parametrize("saved, loading", [
    ({"num_groups": 64}, {"num_groups": 16}),  # both 16 groups of one channel
    ({"num_groups": 4, "method": "zca", "T": 3}, {"num_groups": 4, "method": "zca", "T": 7}),  # ZCA does not iterate
])
def test_the_checkpointer_loads_what_the_layer_itself_takes_as_the_same_function(tmp_path, saved, loading):
    from gwdet.checkpoint.resilient import ResilientCheckpointer

    source = nn.Sequential(nn.Conv2d(3, 16, 1), GroupWhitening(16, **saved))
    ResilientCheckpointer(source, save_dir=str(tmp_path)).save("model_final")
    target = nn.Sequential(nn.Conv2d(3, 16, 1), GroupWhitening(16, **loading))
    ResilientCheckpointer(target).load(str(tmp_path / "model_final.pth"))
    assert torch.equal(target[0].weight, source[0].weight)
    other = nn.Sequential(nn.Conv2d(3, 16, 1), GroupWhitening(16, num_groups=2))
    with pytest.raises(ValueError, match=r"other norm hyper-parameters .*1 num_groups"):
        ResilientCheckpointer(other).load(str(tmp_path / "model_final.pth"))


def test_batch_norm_statistics_for_a_layer_without_any_are_refused(tmp_path, monkeypatch):
    # detectron2's convert-torchvision-to-d2.py output (no gwdet record) loaded BN's scale and shift as GW's affine
    from gwdet.checkpoint.resilient import MISMATCH_ENV, ResilientCheckpointer

    source = nn.Sequential(nn.Conv2d(3, 16, 1), nn.BatchNorm2d(16))
    weights = {name.replace("1.", "norm.", 1): tensor.numpy() for name, tensor in source.state_dict().items()
               if "num_batches" not in name}
    path = tmp_path / "bn.pkl"
    path.write_bytes(pickle.dumps({"model": weights, "__author__": "torchvision", "matching_heuristics": True}))

    class Model(nn.Module):
        def __init__(self, norm):
            super().__init__()
            self.conv, self.norm = nn.Conv2d(3, 16, 1), norm

    with pytest.raises(ValueError, match=r"hold batch norm statistics \(running_mean, running_var\) for 1 layer\(s\) "
                                         r"that keep none in this model \(norm\)"):
        ResilientCheckpointer(Model(GroupWhitening(16, 4))).load(str(path))
    ResilientCheckpointer(Model(nn.BatchNorm2d(16))).load(str(path))  # BN where the weights have it
    monkeypatch.setenv(MISMATCH_ENV, "1")
    ResilientCheckpointer(Model(GroupWhitening(16, 4))).load(str(path))


def test_weights_this_user_may_not_read_are_named_not_a_raw_permission_error(tmp_path):
    # a shared lab folder: a raw PermissionError traceback from the checksum code
    import shutil
    import tempfile

    from gwdet.utils.atomic import checksum_findings

    from conftest import error_in_child

    folder = tempfile.mkdtemp(prefix="gwdet-unreadable-")  # pytest's folders are closed to other users
    os.chmod(folder, 0o755)
    weights = os.path.join(folder, "model_final.pth")
    torch.save({"model": {}}, weights)
    os.chmod(weights, 0o000)
    def as_nobody() -> None:  # root reads any file: the check runs as another user
        if os.geteuid() == 0:
            os.setuid(65534)

    said = error_in_child(as_nobody, lambda: checksum_findings(weights))
    shutil.rmtree(folder)
    assert said.startswith(f"{weights} cannot be read by this user (permission denied): ask its owner"), said


def test_group_norm_weights_without_gwdets_records_are_said_to_be_unchecked(tmp_path, caplog):
    # weights of detectron2's own training (GN with 8 groups) evaluated with 4 groups without a word
    from gwdet.checkpoint.resilient import ResilientCheckpointer

    trained = nn.Sequential(nn.Conv2d(3, 8, 1), nn.GroupNorm(8, 8))
    torch.save({"model": trained.state_dict()}, tmp_path / "plain.pth")
    other = nn.Sequential(nn.Conv2d(3, 8, 1), nn.GroupNorm(4, 8))
    with caplog.at_level("WARNING"):
        ResilientCheckpointer(other, str(tmp_path)).load_weights(str(tmp_path / "plain.pth"))
    assert "holds the weights of 1 GroupNorm layer(s) (1 (4 groups)) without gwdet's record of their group numbers" \
        in caplog.text
    # a norm one registered reads its own key, not MODEL.GN.NUM_GROUPS
    assert "(MODEL.GN.NUM_GROUPS; a norm of one's own: its own key; a LazyConfig's num_groups)" in caplog.text
    caplog.clear()
    ResilientCheckpointer(trained, str(tmp_path)).save("recorded")  # gwdet's checkpoints record them: checked
    with caplog.at_level("WARNING"):
        ResilientCheckpointer(trained, str(tmp_path)).load_weights(str(tmp_path / "recorded.pth"))
    assert "GroupNorm layer(s)" not in caplog.text


def test_a_pkl_of_detectron2s_layout_without_its_author_loads(tmp_path):
    # {"model": arrays} without "__author__" was wrapped once more: "Unsupported type found in checkpoint! model: dict"
    from gwdet.checkpoint.resilient import ResilientCheckpointer

    model = nn.Sequential(nn.Linear(2, 2))
    weights = {key: value.numpy() + 1 for key, value in model.state_dict().items()}
    with open(tmp_path / "weights.pkl", "wb") as file:
        pickle.dump({"model": weights}, file)
    ResilientCheckpointer(model, str(tmp_path)).load_weights(str(tmp_path / "weights.pkl"))
    assert torch.equal(model[0].weight.detach(), torch.from_numpy(weights["0.weight"]))


def test_weights_at_a_scheme_no_handler_reads_are_named(tmp_path):
    # s3:// (no iopath handler): "AssertionError: Checkpoint s3://bucket/model_final.pth not found!"
    from gwdet.checkpoint.resilient import ResilientCheckpointer, WeightsDownloadError

    with pytest.raises(WeightsDownloadError, match=r"MODEL.WEIGHTS s3://bucket/model_final.pth cannot be downloaded: "
                                                   r"s3:// is not a scheme detectron2's PathManager reads here"):
        ResilientCheckpointer(nn.Linear(2, 2), str(tmp_path)).load_weights("s3://bucket/model_final.pth")


def test_detectron2s_matching_heuristics_query_is_honoured_for_local_files(tmp_path):
    # "f.pkl?matching_heuristics=True" was refused as a missing file; in Python the .pkl was read without the
    # heuristics it asks for ("The weights leave 159 of the backbone's 159 weights unloaded")
    from gwdet.checkpoint.resilient import ResilientCheckpointer

    model = nn.Module()
    model.backbone = nn.Module()
    model.backbone.bottom_up = gw_resnet("S1-B2", ["res2"], False)
    model.eval()
    saved = {key.removeprefix("backbone.bottom_up."): value + 1 if torch.is_tensor(value) and value.is_floating_point()
             else value for key, value in model.state_dict().items()}
    pkl, pth = tmp_path / "stripped.pkl", tmp_path / "stripped.pth"
    with open(pkl, "wb") as file:
        pickle.dump({"model": {key: value.numpy() if torch.is_tensor(value) else value for key, value in saved.items()},
                     "__author__": "me"}, file)
    torch.save({"model": saved}, pth)
    with pytest.raises(ValueError, match="The weights leave .* of the backbone's .* weights unloaded"):
        ResilientCheckpointer(model, str(tmp_path)).load_weights(str(pkl))
    for path in (pkl, pth):
        checkpointer = ResilientCheckpointer(model, str(tmp_path))
        checkpointer.load_weights(f"{path}?matching_heuristics=True")
        assert torch.equal(model.backbone.bottom_up.stem.conv1.weight, saved["stem.conv1.weight"])
        assert checkpointer.initial_weights["path"] == f"{path}?matching_heuristics=True"
        assert len(checkpointer.initial_weights["sha256"]) == 64  # the file's, read without its query
    for path in (pkl, pth):  # a .pth's other query: detectron2's bare "Unsupported query remaining"
        with pytest.raises(ValueError, match=r"the query \['strict'\] of .*stripped.p\w+\?strict=1 is not one "
                                             r"detectron2's checkpointer reads \(it reads \?matching_heuristics=True "
                                             r"only, spelled so\): remove it"):
            ResilientCheckpointer(model, str(tmp_path)).load_weights(f"{path}?strict=1")
        # "true": detectron2 reads it as no heuristics, which the record would have claimed
        with pytest.raises(ValueError, match=r"the query \['matching_heuristics=true'\]"):
            ResilientCheckpointer(model, str(tmp_path)).load_weights(f"{path}?matching_heuristics=true")


# ---- weights from files without gwdet's records: the whole messages --------------------------

def test_gw_weights_without_their_settings_are_refused_naming_the_layers_even_a_bare_one():
    from collections import OrderedDict

    from gwdet.checkpoint.compatibility import check_unrecorded_weights

    bare = GroupWhitening(8, num_groups=2)
    plain = {name: value for name, value in bare.state_dict().items() if name == "weight" or name == "bias"}
    with pytest.raises(ValueError) as refused:
        check_unrecorded_weights(plain, bare, OPT_IN)
    assert str(refused.value) == (
        "The checkpoint holds weights for 1 gwdet norm layer(s) of this model (the model (GroupWhitening)) but not the "
        "settings these layers save with their weights (_extra_state), nor gwdet's record of the norm types: they "
        "come from other layers with the same shapes (a GN model's, saved by detectron2's own checkpointer) or from a "
        "file gwdet did not write, so whether they were trained as these layers cannot be checked; nothing was "
        "loaded. Load weights trained with this config (gwdet's checkpoints record their norms), or "
        f"{OPT_IN} to load them anyway.")
    check_unrecorded_weights(bare.state_dict(), bare, OPT_IN)  # the settings beside the weights: checked on load
    # four layers (one whose name ends in an X), saved through DistributedDataParallel's "module."
    model = nn.Sequential(OrderedDict((name, GroupWhitening(8, num_groups=2)) for name in ("a", "b", "cX", "d")))
    wrapped = {f"module.{name}": value for name, value in model.state_dict().items() if "_extra_state" not in name}
    with pytest.raises(ValueError, match=r"^The checkpoint holds weights for 4 gwdet norm layer\(s\) of this model "
                                         r"\(a \(GroupWhitening\), b \(GroupWhitening\), cX \(GroupWhitening\), "
                                         r"\.\.\. \(1 more\)\) but not"):
        check_unrecorded_weights(wrapped, model, OPT_IN)


def test_batch_norm_statistics_name_each_layer_without_any_by_the_weights_key_or_its_tail():
    from gwdet.checkpoint.compatibility import check_statistics_have_a_layer

    class Stage(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Module(), nn.Module()
            self.a.norm, self.b.norm = GroupWhitening(8, num_groups=2), nn.GroupNorm(2, 8)
            self.c, self.d = GroupWhitening(8, num_groups=2), GroupWhitening(8, num_groups=2)

    model = nn.Sequential(Stage())
    statistic = torch.zeros(8)
    # a full key, a tail of one (a converted backbone's, as detectron2 matches it), mean or variance alone
    weights = {"0.a.norm.running_mean": statistic, "b.norm.running_var": statistic, "c.running_mean": statistic,
               "d.running_var": statistic, "a.running_mean": statistic}
    with pytest.raises(ValueError) as refused:
        check_statistics_have_a_layer(weights, model, OPT_IN)
    assert str(refused.value) == (
        "The weights hold batch norm statistics (running_mean, running_var) for 4 layer(s) that keep none in this "
        "model (0.a.norm, 0.b.norm, 0.c, ... (1 more)): BN's scale and shift would load as their affine and the "
        "statistics be dropped, another function; nothing was loaded. Build the model with BN where the weights have "
        "it (MODEL.RESNETS.GW_POSITIONS to where they have GW, \"\" for none; MODEL.RESNETS.NORM), or load weights "
        "trained or converted for this model (tools/convert_pretrained.py), or "
        f"{OPT_IN} to load them anyway.")
    for key in ("0.a.norm.running_mean", "b.norm.running_var", "c.running_mean"):
        with pytest.raises(ValueError, match=r"for 1 layer\(s\)"):
            check_statistics_have_a_layer({key: statistic}, model, OPT_IN)
    # a key's first part alone, or a name that only ends with the key's letters, is another layer
    check_statistics_have_a_layer({"0.running_mean": statistic, "xc.running_var": statistic,
                                   "0.a.norm.weight": statistic}, model, OPT_IN)


def test_affine_weights_for_layers_with_statistics_but_none_saved_are_refused_naming_them():
    from gwdet.checkpoint.compatibility import check_statistics_in_weights

    model = nn.Sequential(*(nn.BatchNorm2d(8) for _ in range(4)))
    affine = {f"{index}.{name}": torch.ones(8) for index in range(4) for name in ("weight", "bias")}
    with pytest.raises(ValueError) as refused:
        check_statistics_in_weights(affine, model, OPT_IN)
    assert str(refused.value) == (
        "The checkpoint holds the affine weights of 4 layer(s) that keep running statistics in this model "
        "(0 (BatchNorm2d), 1 (BatchNorm2d), 2 (BatchNorm2d), ... (1 more)) but no statistics for them: they were "
        "trained in norm layers without any (GN, GW, ...), and these layers would normalize with mean 0 and variance "
        "1; nothing was loaded. Build the model with the norms the weights were trained with (MODEL.RESNETS.NORM GN, "
        f"say; a LazyConfig's norm nodes), or {OPT_IN} to load them anyway.")


def test_settings_of_a_layer_saved_as_another_kind_are_left_to_the_type_check():
    model = nn.Sequential(GroupWhitening(8, num_groups=2))
    saved = {"0": {"num_groups": 4}}
    check_norm_settings(saved, model, OPT_IN, saved_types={"0": "BatchWhitening"})  # check_norm_types names it
    with pytest.raises(ValueError, match=r"1 values, e.g. 0 num_groups 4 -> 2"):
        check_norm_settings(saved, model, OPT_IN, saved_types={"0": "GroupWhitening"})


def test_converted_norms_for_a_resnet_without_norms_name_every_conv():
    bare = gw_resnet("", ["res2"], stride_in_1x1=True, norm="")
    assert refusal({"norm": "BN"}, bare) == (
        "The weights were converted from a BN model (its norms outside GW have running statistics), but the model's "
        "ResNet has no norm there (every conv). Set MODEL.RESNETS.NORM FrozenBN, BN or SyncBN, or load weights "
        "converted from a model with the ResNet's norms.")


def test_gw_weights_of_a_file_recording_norm_types_but_no_settings_are_refused(tmp_path):
    # a checkpoint of gwdet's first format (norm types recorded, no settings, none in the weights): its 16-group GW
    # weights loaded into 8 groups without a word, where a file without the types record is refused
    from collections import OrderedDict

    from gwdet.checkpoint.compatibility import NORM_SETTINGS_KEY, NORM_TYPES_KEY
    from gwdet.checkpoint.resilient import ResilientCheckpointer

    def model(groups: int) -> nn.Module:
        return nn.Sequential(OrderedDict((name, GroupWhitening(32, num_groups=groups)) for name in ("a", "b")))

    ResilientCheckpointer(model(16), str(tmp_path)).save("trained")
    saved = torch.load(tmp_path / "trained.pth", weights_only=False)
    assert NORM_TYPES_KEY in saved and NORM_SETTINGS_KEY in saved
    saved = {key: value for key, value in saved.items() if not key.startswith("gwdet_") or key == NORM_TYPES_KEY}
    saved["model"] = {key: value for key, value in saved["model"].items() if not key.endswith("_extra_state")}
    torch.save(saved, tmp_path / "types_only.pth")
    with pytest.raises(ValueError) as refused:
        ResilientCheckpointer(model(8), str(tmp_path / "run")).load(str(tmp_path / "types_only.pth"))
    assert ("holds weights for 2 gwdet norm layer(s) of this model (a (GroupWhitening), b (GroupWhitening)) but not "
            "the settings these layers save with their weights (_extra_state), nor gwdet's record of the norm settings "
            "(the file records the norm types only), so whether they were trained with these layers' settings (their "
            "group numbers) cannot be checked; nothing was loaded.") in str(refused.value)


def test_gw_weights_refused_for_group_norm_layers_are_not_also_called_group_norm_weights(tmp_path):
    # before the refusal ("trained with other norm layers ... GroupWhitening -> GroupNorm"), a warning said the file
    # held GroupNorm layers that "load unchecked into this config's groups", pointing at MODEL.GN.NUM_GROUPS
    import logging

    from gwdet.checkpoint.resilient import ResilientCheckpointer

    torch.save({"model": nn.Sequential(GroupWhitening(32, num_groups=4)).state_dict()}, tmp_path / "gw.pth")
    said = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    checkpointer = ResilientCheckpointer(nn.Sequential(nn.GroupNorm(4, 32)), str(tmp_path / "run"))
    told = logging.getLogger("gwdet.checkpoint.resilient")  # where gwdet's checkpointer says what it finds
    told.addHandler(handler)
    try:
        with pytest.raises(ValueError, match="GroupWhitening"):
            checkpointer.load(str(tmp_path / "gw.pth"))
    finally:
        told.removeHandler(handler)
    assert not [line for line in said if "GroupNorm layer(s)" in line], said


class TaggedGW(GroupWhitening):
    """A subclass of gwdet's layer with a setting of its own, named in HYPER_PARAMETERS (docs/usage.md)."""

    HYPER_PARAMETERS = GroupWhitening.HYPER_PARAMETERS + ("tag",)

    def __init__(self, channels: int, tag=None, **settings) -> None:
        self.tag = tag
        super().__init__(channels, num_groups=2, **settings)


@pytest.mark.parametrize("tag, refusal", [
    ("x" * 600, r"^TaggedGW: its settings take 723 bytes as JSON, more than the 512 the layer's state records them in "
                r"\(tag='xxx.*xxx' takes 602 of them\): give tag a shorter value, or leave it out of HYPER_PARAMETERS "
                r"if it does not change what the layer computes.$"),
    (torch.device("cpu"), r"^TaggedGW: its setting tag=device\(type='cpu'\) \(device\) cannot be recorded in the "
                          r"layer's state, which holds its settings as JSON \(.*\): give tag a number, string, "
                          r"True/False, None, or a list or dict of them .*, or leave it out of HYPER_PARAMETERS"),
], ids=["too long", "not JSON"])
def test_a_subclass_setting_its_state_cannot_record_is_refused_when_the_layer_is_built(tag, refusal):
    # the layer was built and trained, then state_dict() (every checkpoint save) failed: a bare "takes 724 bytes ...
    # more than the 512 a state records" naming no fix, or a raw "Object of type device is not JSON serializable"
    with pytest.raises(ValueError, match=refusal):
        TaggedGW(8, tag=tag)


def test_a_subclass_naming_a_setting_it_never_sets_is_refused_when_built():
    # the layer was built, then its first state_dict() failed with a raw AttributeError
    class Untagged(GroupWhitening):
        HYPER_PARAMETERS = GroupWhitening.HYPER_PARAMETERS + ("tag",)

    with pytest.raises(AttributeError, match=r"^Untagged: its settings \(num_channels, HYPER_PARAMETERS, affine\) name "
                                             r"tag, which the layer does not have once built: set self.tag in its "
                                             r"__init__, or leave it out of HYPER_PARAMETERS.$"):
        Untagged(8)


@pytest.mark.parametrize("tag", [(1, 2), float("nan"), {"scales": (1.0, float("nan"))}, np.int64(3)],
                         ids=["tuple", "nan", "nested", "numpy number"])
def test_a_subclass_setting_loads_back_as_its_state_records_it(tag):
    # a tuple came back from the state's JSON as a list and NaN unequal to itself: the layer refused its own state
    # ("saved with tag=[1, 2], but this layer has tag=(1, 2)"); a numpy number failed to save
    TaggedGW(8, tag=tag).load_state_dict(TaggedGW(8, tag=tag).state_dict())
    with pytest.raises(RuntimeError, match=r"TaggedGW was saved with tag=.*, but this layer has tag='other'"):
        TaggedGW(8, tag="other").load_state_dict(TaggedGW(8, tag=tag).state_dict())


# before: a BGN checkpoint loaded into a GhostBN model was refused as other MODEL.BGN.* values, which cannot fix it
@pytest.mark.parametrize("trained, loading, finding, fix", [
    (("BGN", {"num_groups": 4}), ("GhostBN", {}), "1: BGN with num_groups 4 -> GhostBN", "gwdet.norm('BGN', num_groups=4)"),
    (("GhostBN", {}), ("BGN", {"num_groups": 4}), "1: GhostBN -> BGN with num_groups 4", "gwdet.norm('GhostBN')"),
])
def test_a_bgn_checkpoint_into_a_ghost_bn_is_named_as_another_norm(tmp_path, trained, loading, finding, fix):
    from gwdet import norm
    from gwdet.checkpoint.resilient import ResilientCheckpointer

    source = nn.Sequential(nn.Conv2d(3, 16, 1), norm(trained[0], **trained[1])(16))
    ResilientCheckpointer(source, save_dir=str(tmp_path)).save("model_final")
    target = nn.Sequential(nn.Conv2d(3, 16, 1), norm(loading[0], **loading[1])(16))
    with pytest.raises(ValueError, match=(
            r"^The checkpoint was trained with another norm than this config builds \(1 layers, e\.g\. "
            f"{re.escape(finding)}\\): both names build a BatchGroupNorm, .* they differ in the norm's name, not in a "
            r"MODEL\.BGN value .*; nothing was loaded\. Build the norm the weights were trained with: set its name "
            f".*{re.escape(fix)}\\), or set the environment variable GWDET_ALLOW_NORM_MISMATCH=1 to load them anyway\\.$")):
        ResilientCheckpointer(target).load(str(tmp_path / "model_final.pth"))
    other_groups = nn.Sequential(nn.Conv2d(3, 16, 1), norm("BGN", num_groups=8)(16))
    if trained[0] == "BGN":  # another group count of BGN is still named by its value
        with pytest.raises(ValueError, match=r"other norm hyper-parameters .* 1 num_groups 4 -> 8"):
            ResilientCheckpointer(other_groups).load(str(tmp_path / "model_final.pth"))


# a converted .pkl's records (backbone names without backbone.bottom_up.) of BGN layers loaded into FrozenBN without a word
def test_a_converted_files_records_of_gwdet_norms_meet_the_layer_at_their_suffix():
    from gwdet.checkpoint.compatibility import NormMismatchError, check_layer_settings

    def nested(layer):
        return nn.ModuleDict({"backbone": nn.ModuleDict({"bottom_up": nn.ModuleDict({"stem": nn.ModuleDict(
            {"conv1": nn.ModuleDict({"norm": layer})})})})})

    bgn = BatchGroupNorm(8, eval_example_weight=0.5)
    weights = {"stem.conv1.norm._extra_state": bgn.get_extra_state().numpy(),
               "stem.conv1.norm.weight": np.ones(8, np.float32)}
    with pytest.raises(NormMismatchError, match=re.escape(
            "(1 layers, e.g. backbone.bottom_up.stem.conv1.norm: BatchGroupNorm -> FrozenBatchNorm2d)")):
        check_layer_settings(weights, nested(FrozenBatchNorm2d(8)), OPT_IN)
    check_layer_settings(weights, nested(BatchGroupNorm(8, eval_example_weight=0.5)), OPT_IN)


class _Holder(nn.Module):
    """Holds a model as ``module``, as a wrapper other than DDP does: its weights' names start with ``module.``."""

    def __init__(self, model):
        super().__init__()
        self.module = model


_WRAPPED_NORMS = {"GW g=4": lambda: GroupWhitening(16, num_groups=4), "GW g=8": lambda: GroupWhitening(16, num_groups=8),
                  "GN(8)": lambda: nn.GroupNorm(8, 16), "GN(4)": lambda: nn.GroupNorm(4, 16),
                  "BN": lambda: nn.BatchNorm2d(16)}


# a wrapped model's checkpoint (weights module.*) into the unwrapped model with other norms loaded without a word:
# its records of the norm layers, kept under module.1, were matched to no layer, while fvcore loaded the weights into 1
@pytest.mark.parametrize("saved, loading, finding", [
    ("GW g=4", "GW g=8", "other norm hyper-parameters than this config gives its layers (1 values, e.g. 1 num_groups 4 -> 8)"),
    ("GW g=4", "GN(4)", "other norm layers than this config builds (1 layers, e.g. 1: GroupWhitening -> GroupNorm)"),
    ("GN(8)", "GN(4)", "other norm hyper-parameters than this config gives its layers (1 values, e.g. 1 num_groups 8 -> 4)"),
    ("GN(8)", "BN", "other norm layers than this config builds (1 layers, e.g. 1: GroupNorm -> BatchNorm2d)"),
])
def test_a_wrapped_models_checkpoint_is_checked_against_the_layers_its_weights_load_into(tmp_path, saved, loading, finding):
    from gwdet.checkpoint.compatibility import NormMismatchError
    from gwdet.checkpoint.resilient import ResilientCheckpointer

    source = nn.Sequential(nn.Conv2d(3, 16, 1), _WRAPPED_NORMS[saved]())
    ResilientCheckpointer(_Holder(source), save_dir=str(tmp_path)).save("wrapped")
    data = torch.load(tmp_path / "wrapped.pth", weights_only=True)
    assert set(data["gwdet_norm_types"]) == {"module.1"}
    # without the records gwdet's layers keep in their state (as an older gwdet saved them): the file's records only
    data = {key: value for key, value in data.items() if "checksums" not in key}
    data["model"] = {key: value for key, value in data["model"].items() if not key.endswith("_extra_state")}
    torch.save(data, tmp_path / "without_layer_records.pth")
    for path in (tmp_path / "wrapped.pth", tmp_path / "without_layer_records.pth"):
        with pytest.raises(NormMismatchError, match=re.escape(f"The checkpoint was trained with {finding}; nothing was loaded")):
            ResilientCheckpointer(nn.Sequential(nn.Conv2d(3, 16, 1), _WRAPPED_NORMS[loading]())).load(str(path))
        same = nn.Sequential(nn.Conv2d(3, 16, 1), _WRAPPED_NORMS[saved]())
        ResilientCheckpointer(same).load(str(path))  # the norms it was trained with: loaded
        assert torch.equal(same[0].weight, source[0].weight)


def test_a_checkpoint_name_with_the_suffix_save_adds_is_refused(tmp_path):
    # save("model_final.pth") wrote model_final.pth.pth (fvcore adds .pth to any name) and named it in last_checkpoint
    from gwdet.checkpoint.resilient import ResilientCheckpointer

    with pytest.raises(ValueError, match=re.escape(
            "Checkpoint 'model_final.pth' cannot be saved under that name: save() adds .pth itself, so it would write "
            "model_final.pth.pth; nothing was written. Give the name without the suffix: save('model_final').")):
        ResilientCheckpointer(nn.Sequential(nn.Conv2d(3, 16, 1)), save_dir=str(tmp_path)).save("model_final.pth")
    assert os.listdir(tmp_path) == []


def test_loading_a_missing_checkpoint_names_the_path(tmp_path, monkeypatch):
    # before: fvcore's bare AssertionError "Checkpoint .../nope.pth not found!"
    from gwdet.checkpoint.resilient import ResilientCheckpointer
    from gwdet.errors import GwdetFileNotFoundError

    checkpointer = ResilientCheckpointer(nn.Sequential(nn.Conv2d(3, 16, 1)))
    missing = str(tmp_path / "ck" / "nope.pth")
    with pytest.raises(GwdetFileNotFoundError, match=re.escape(
            f"ResilientCheckpointer.load: the checkpoint {missing!r} does not exist; nothing was loaded. Check the path: "
            "a training saves its checkpoints in its output folder as model_<iteration>.pth and model_final.pth")):
        checkpointer.load(missing)
    monkeypatch.chdir(tmp_path)  # a relative path: the folder it was looked for in is named
    with pytest.raises(GwdetFileNotFoundError, match=re.escape(f"the checkpoint 'ck/nope.pth' does not exist (in "
                                                               f"{tmp_path / 'ck'}); nothing was loaded")):
        checkpointer.load("ck/nope.pth")


def test_batch_norm_weights_into_an_example_weighted_model_name_the_order_to_load_in(tmp_path):
    # before: the config-run advice "Load weights trained with this config's NORM values", no word of example weighing
    from gwdet.checkpoint.resilient import ResilientCheckpointer
    from gwdet.modeling.example_weighing import apply_example_weighing

    def net() -> nn.Module:
        return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU())

    trained = net().eval()
    ResilientCheckpointer(trained, save_dir=str(tmp_path)).save("bn")
    weighed = net()
    apply_example_weighing(weighed, 0.0)
    with pytest.raises(ValueError, match=re.escape(
            "this model has example-weighted BatchGroupNorm layers: apply_example_weighing replaced them before the "
            "weights were loaded (1 layers, e.g. 1: BatchNorm2d -> BatchGroupNorm); nothing was loaded. Load the "
            "batch-norm weights into the model first and apply apply_example_weighing(model, weight) afterwards")):
        ResilientCheckpointer(weighed).load(str(tmp_path / "bn.pth"))
    in_order = net()
    ResilientCheckpointer(in_order).load(str(tmp_path / "bn.pth"))
    apply_example_weighing(in_order, 0.0)
    assert torch.equal(in_order[1].running_var, trained[1].running_var)
    other = net()  # a BatchGroupNorm of the model's own config keeps the config-run advice
    other[1] = BatchGroupNorm(8, num_groups=2)
    with pytest.raises(ValueError, match=r"Load weights trained with this config's NORM values"):
        ResilientCheckpointer(other).load(str(tmp_path / "bn.pth"))


def test_a_malformed_gwdet_record_of_a_pkl_is_named_with_the_file_and_field(tmp_path):
    # before: "MODEL.RESNETS.GW_POSITIONS must be a string like 'S1-B2', got 7", blaming the config for the file's record;
    # write_detectron2_pkl wrote such a record
    from gwdet.checkpoint.resilient import ResilientCheckpointer
    from gwdet.convert import ConversionError, write_detectron2_pkl
    from gwdet.errors import GwdetValueError

    model = nn.Sequential(nn.Conv2d(3, 4, 1))
    weights = {key: value.numpy() for key, value in model.state_dict().items()}
    path = str(tmp_path / "w.pkl")
    for metadata, field, value in [({"arch": "R-50", "gw_positions": 7}, "gw_positions", "7 (int)"),
                                   ({"gw_positions": "S9"}, "gw_positions", "'S9' (str)"),
                                   ({"arch": 5}, "arch", "5 (int)"), ({"input": "x"}, "input", "'x' (str)"),
                                   ({"input": {"pixel_mean": 5}}, "input.pixel_mean", "5 (int)")]:
        with pytest.raises(ConversionError, match=r"^write_detectron2_pkl: metadata\[.* gwdet's loading reads that "
                                                  r"field of the record .* nothing was written\.$"):
            write_detectron2_pkl(weights, path, author="me", metadata=metadata, overwrite=True)
        with open(path, "wb") as file:  # a file written by other means
            pickle.dump({"model": weights, "__author__": "me", "matching_heuristics": True, "gwdet": metadata}, file)
        with pytest.raises(GwdetValueError, match=re.escape(
                f"{path}: the file's 'gwdet' record is malformed: its field {field!r} is {value}, where gwdet's "
                "converter writes ")) as error:
            ResilientCheckpointer(model).load(path)
        assert "nothing was loaded. Convert the weights again with tools/convert_pretrained.py" in str(error.value)
    write_detectron2_pkl(weights, path, author="me", metadata={"arch": "R-50", "gw_positions": "S1-B2"}, overwrite=True)
    ResilientCheckpointer(model).load(path)  # a well-formed record of a model without a ResNet: not compared


def test_integer_values_for_floating_weights_are_refused_and_integer_buffers_load(tmp_path):
    # before: an int8 (quantized) or int64 array in a .pkl, or an integer tensor in a .pth, loaded unscaled into float layers
    from gwdet.checkpoint.resilient import ResilientCheckpointer
    from gwdet.errors import GwdetValueError

    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4))
    state = model.state_dict()
    quantized = {key: value.numpy() for key, value in state.items()}
    quantized["0.weight"] = np.round(quantized["0.weight"] * 127).astype(np.int8)
    pkl = tmp_path / "int8.pkl"
    with open(pkl, "wb") as file:
        pickle.dump({"model": quantized, "__author__": "me"}, file)
    with pytest.raises(GwdetValueError, match=re.escape(
            f"{pkl} holds integer or bool values for 1 floating-point weight(s) of the model (0.weight: int8 for the "
            "model's float32 0.weight): they would load as the numbers they are (a quantized array without its scale")):
        ResilientCheckpointer(model).load(str(pkl))
    pth = tmp_path / "int.pth"
    torch.save({"model": dict(state, **{"1.running_mean": torch.ones(4, dtype=torch.int64),
                                        "1.weight": torch.ones(4, dtype=torch.bool)})}, pth)
    with pytest.raises(GwdetValueError, match=r"for 2 floating-point weight\(s\) of the model \(.*1.weight: bool "
                                              r"for the model's float32 1.weight.*nothing was loaded. Save the weights "
                                              r"as floating-point arrays"):
        ResilientCheckpointer(model).load(str(pth))
    assert torch.equal(model[1].running_mean, torch.zeros(4)), "nothing was loaded"
    counted = tmp_path / "counted.pth"  # num_batches_tracked is an integer buffer: its integer value loads
    torch.save({"model": dict(state, **{"1.num_batches_tracked": torch.tensor(7)})}, counted)
    ResilientCheckpointer(model).load(str(counted))
    assert int(model[1].num_batches_tracked) == 7


class _DetHolder(nn.Module):
    """A user's module holding a detector as ``self.det``."""

    def __init__(self, det: nn.Module) -> None:
        super().__init__()
        self.det = det


@pytest.mark.parametrize("how", ["load", "load_weights", "resume_or_load"])
def test_weights_none_of_which_land_in_a_compiled_or_wrapped_model_are_refused(tmp_path, how):
    # before: a plain checkpoint loaded into a torch.compile'd model or a wrapper's returned normally and loaded nothing
    from gwdet.checkpoint.resilient import ResilientCheckpointer
    from gwdet.errors import GwdetValueError

    ResilientCheckpointer(nn.Sequential(nn.Conv2d(3, 4, 1), GroupWhitening(4, num_groups=2)),
                          save_dir=str(tmp_path)).save("m")
    path = str(tmp_path / "m.pth")

    def loaded_into(model):
        checkpointer = ResilientCheckpointer(model)
        if how == "resume_or_load":
            checkpointer.resume_or_load(path, resume=False)
        else:
            getattr(checkpointer, how)(path)

    inner = nn.Sequential(nn.Conv2d(3, 4, 1), GroupWhitening(4, num_groups=2))
    before = inner[0].weight.clone()
    with pytest.raises(GwdetValueError, match=re.escape(
            f"{path} holds none of the model's weights: no name of its 5 weights is one of the model's 5 (the file's "
            "keys are like '0.weight', the model's like '_orig_mod.0.weight'), so loading it would leave every weight "
            "as it is; nothing was loaded. The model's names carry the prefix '_orig_mod.' that the file's lack: load "
            "into the uncompiled module, which shares the torch.compile'd model's parameters, "
            "ResilientCheckpointer(model._orig_mod)")):
        loaded_into(torch.compile(inner, backend="eager"))
    with pytest.raises(GwdetValueError, match=re.escape(
            "the model's like 'det.0.weight'), so loading it would leave every weight as it is; nothing was loaded. "
            "The model's names carry the prefix 'det.' that the file's lack: load into the module the model holds "
            "(the detector of a wrapper), ResilientCheckpointer(model.det)")):
        loaded_into(_DetHolder(inner))
    assert torch.equal(inner[0].weight, before)
    loaded_into(inner)  # the module itself takes them
    assert not torch.equal(inner[0].weight, before)


def test_the_input_record_of_a_compiled_model_compares_equal_to_the_plain_models():
    # before: weights saved from a torch.compile'd model were said to differ in box_regression_weights and roi_poolers
    from detectron2.modeling.box_regression import Box2BoxTransform
    from detectron2.modeling.poolers import ROIPooler

    from gwdet.checkpoint.resilient import input_differences, input_record

    class Heads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pooler = ROIPooler((7, 7), (1 / 4,), 0, "ROIAlignV2")
            self.box2box_transform = Box2BoxTransform((10.0, 10.0, 5.0, 5.0))
            self.conv = nn.Conv2d(3, 4, 1)

    model = nn.Sequential(Heads())
    saved = input_record(torch.compile(model, backend="eager"))
    assert "_orig_mod.0" in saved["box_regression_weights"] and "_orig_mod.0.pooler" in saved["roi_poolers"]
    assert input_differences(saved, model) == []
    other = nn.Sequential(Heads())
    other[0].box2box_transform = Box2BoxTransform((1.0, 1.0, 1.0, 1.0))
    assert input_differences(saved, other) == [
        "box_regression_weights {'0': [10.0, 10.0, 5.0, 5.0]} -> {'0': [1.0, 1.0, 1.0, 1.0]}"]


def _demo_detector(*opts: str) -> nn.Module:
    """The demo Mask R-CNN (4conv1fc GW box head) at test size on the CPU, with ``opts``."""
    import gwdet
    from gwdet.model_zoo import build_config

    from conftest import DEMO_CONFIG, TINY_OPTS

    return gwdet.build_model(build_config(str(DEMO_CONFIG), [*TINY_OPTS, "MODEL.DEVICE", "cpu", *opts]))


@pytest.fixture(scope="module")
def demo_weights(tmp_path_factory):
    """A checkpoint of :func:`_demo_detector`, as a training writes it, copied out of its run folder."""
    from gwdet.checkpoint.resilient import ResilientCheckpointer

    folder = tmp_path_factory.mktemp("demo_weights")
    ResilientCheckpointer(_demo_detector(), str(folder)).save("model_final")
    return str(folder / "model_final.pth")


# before: an evaluation of 4conv1fc weights with MODEL.ROI_BOX_HEAD.NUM_CONV 2 or 0 (mask head: its NUM_CONV 2) loaded
# them partly, without the trained conv3/conv4 and their GW, and only fvcore's "not used by the model" line said so
@pytest.mark.parametrize("opts, unused, layers, held", [
    (["MODEL.ROI_BOX_HEAD.NUM_CONV", "2"], 6,
     "roi_heads.box_head.conv3, roi_heads.box_head.conv3.norm, roi_heads.box_head.conv4, roi_heads.box_head.conv4.norm",
     "MODEL.ROI_BOX_HEAD.NUM_CONV 4"),
    (["MODEL.ROI_BOX_HEAD.NUM_CONV", "0"], 12,
     r"roi_heads.box_head.conv1, roi_heads.box_head.conv1.norm, roi_heads.box_head.conv2, "
     r"roi_heads.box_head.conv2.norm, \.\.\. \(4 more\)", "MODEL.ROI_BOX_HEAD.NUM_CONV 4"),
    (["MODEL.ROI_MASK_HEAD.NUM_CONV", "2"], 6, r"roi_heads.mask_head.mask_fcn3, .*mask_fcn4.norm",
     "MODEL.ROI_MASK_HEAD.NUM_CONV 4"),
], ids=["box-NUM_CONV-2", "box-NUM_CONV-0", "mask-NUM_CONV-2"])
def test_an_evaluation_refuses_trained_layers_its_model_does_not_have(demo_weights, opts, unused, layers, held):
    from gwdet.checkpoint.resilient import ResilientCheckpointer
    from gwdet.errors import GwdetValueError

    with pytest.raises(GwdetValueError, match=(
            rf"^{re.escape(demo_weights)} \(MODEL.WEIGHTS\) holds {unused} weights that the model does not use, of "
            rf"\d+ layers it does not have \({layers}\): without these trained layers the model would be another one "
            r"than the one trained, and its results not the weights'\. Build the model they were trained with: give "
            rf"the config.yaml that their training wrote into its output folder as the config, or its values "
            rf"\(here {held}\)\.$")):
        ResilientCheckpointer(_demo_detector(*opts), require_every_weight=True).load_weights(demo_weights)
    # a training (fine-tuning) from them loads what fits, as detectron2 does
    ResilientCheckpointer(_demo_detector(*opts), save_dir=os.path.dirname(demo_weights)).load_weights(demo_weights)


# before: the LazyConfig twin (model.roi_heads.box_head.conv_dims=[64,64] for weights of 4 convs) was evaluated without
# the trained conv3/conv4 and their GW, without a word
def test_a_lazy_evaluation_refuses_trained_layers_its_model_does_not_have(tmp_path):
    from gwdet.checkpoint.resilient import ResilientCheckpointer
    from gwdet.engine.lazy import LazyRun, build_model
    from gwdet.errors import GwdetValueError

    from conftest import LAZY_CONFIG

    ResilientCheckpointer(build_model(LazyRun.load(str(LAZY_CONFIG)).cfg), str(tmp_path)).save("model_final")
    weights = str(tmp_path / "model_final.pth")
    shallower = build_model(LazyRun.load(str(LAZY_CONFIG), ["model.roi_heads.box_head.conv_dims=[64,64]"]).cfg)
    with pytest.raises(GwdetValueError, match=r"\(train.init_checkpoint\) holds 6 weights that the model does not use, "
                                              r".*\(here model.roi_heads.box_head.conv_dims of 4 entries\)\.$"):
        ResilientCheckpointer(shallower, require_every_weight=True,
                              weights_setting="train.init_checkpoint").load_weights(weights)


# before: Mask R-CNN weights evaluated with MODEL.MASK_ON False (a box-only evaluation of the trained model) were said
# nowhere but in fvcore's "not used by the model" line to leave the mask head out, and their record of the mask head's
# pooler was warned of as a value "this model has otherwise"
def test_weights_of_a_head_the_evaluated_model_is_built_without_are_left_out_with_one_warning(demo_weights):
    from gwdet.checkpoint.resilient import ResilientCheckpointer
    from gwdet.engine.run_log import RunWarnings

    boxes_only = _demo_detector("MODEL.MASK_ON", "False", "MODEL.ROI_MASK_HEAD.NORM", "")
    with RunWarnings() as warned:  # what a run lists under Warnings in its results.md
        ResilientCheckpointer(boxes_only, require_every_weight=True).load_weights(demo_weights)
    assert warned.messages == [
        f"{demo_weights} (MODEL.WEIGHTS) holds the weights of roi_heads.mask_head (16 weights), which this model does "
        "not have (it is built without it: MODEL.MASK_ON False): they are left out, and the model runs without that "
        "head, its other weights the trained ones. Build the model with that head to use them."]
    saved = torch.load(demo_weights, weights_only=True)["model"]
    assert all(torch.equal(value, saved[key]) for key, value in boxes_only.state_dict().items() if key in saved)


def test_an_evaluation_of_a_runs_own_weights_leaves_no_key_unused(demo_weights):
    # the refusal of unused weights keeps the evaluations it must not touch: the model's own weights (fvcore and
    # detectron2 report no key as unused), and batch norm weights in frozen batch norms (no num_batches_tracked)
    from gwdet.checkpoint.resilient import ResilientCheckpointer, unused_weights

    reported = []

    class Reporting(ResilientCheckpointer):
        def _log_incompatible_keys(self, incompatible) -> None:
            reported.append(incompatible)
            super()._log_incompatible_keys(incompatible)

    Reporting(_demo_detector(), require_every_weight=True).load_weights(demo_weights)
    assert reported[-1].unexpected_keys == [] and reported[-1].missing_keys == []
    assert unused_weights(["a.num_batches_tracked", "b.norm._extra_state", "c.weight"]) == ["c.weight"]
    trained = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4))
    folder = os.path.dirname(demo_weights)
    ResilientCheckpointer(trained, folder).save("batch_norm")
    Reporting(nn.Sequential(nn.Conv2d(3, 4, 1), FrozenBatchNorm2d(4)), require_every_weight=True).load_weights(
        os.path.join(folder, "batch_norm.pth"))
    assert reported[-1].unexpected_keys == ["1.num_batches_tracked"]  # loaded all the same


def _checkpointed_model():
    return nn.Sequential(nn.Conv2d(3, 16, 3), GroupWhitening(16, num_groups=4))


# before: load(p, checkpointables=['optimzer']) (a typo) returned normally and restored nothing, without a word
def test_load_refuses_a_checkpointable_name_the_checkpointer_does_not_have(tmp_path):
    from gwdet.checkpoint.resilient import ResilientCheckpointer
    from gwdet.errors import GwdetError

    model = _checkpointed_model()
    ResilientCheckpointer(model, str(tmp_path), optimizer=torch.optim.SGD(model.parameters(), lr=0.123)).save("opt")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    checkpointer = ResilientCheckpointer(model, optimizer=optimizer)
    with pytest.raises(GwdetError, match=r"^ResilientCheckpointer\.load: checkpointables names 'optimzer', which is "
                                         r"not one of this checkpointer's checkpointables \('optimizer'\).*nothing was "
                                         r"loaded\. Did you mean 'optimizer'\?"):
        checkpointer.load(str(tmp_path / "opt.pth"), checkpointables=["optimzer"])
    with pytest.raises(GwdetError, match=r"checkpointables must be a list .*got str 'optimizer'.*checkpointables="
                                         r"\['optimizer'\]"):
        checkpointer.load(str(tmp_path / "opt.pth"), checkpointables="optimizer")
    checkpointer.load(str(tmp_path / "opt.pth"), checkpointables=["optimizer"])
    assert optimizer.param_groups[0]["lr"] == 0.123


# before: load(p, checkpointables=['optimizer']) of a file holding no optimizer restored nothing, without a word
def test_load_refuses_a_named_checkpointable_the_file_does_not_hold(tmp_path):
    from gwdet.checkpoint.resilient import ResilientCheckpointer
    from gwdet.errors import GwdetError

    model = _checkpointed_model()
    ResilientCheckpointer(model, str(tmp_path)).save("no_opt")
    path = str(tmp_path / "no_opt.pth")
    loading = _checkpointed_model()
    before = {key: value.clone() for key, value in loading.state_dict().items()}
    checkpointer = ResilientCheckpointer(loading, optimizer=torch.optim.SGD(loading.parameters(), lr=0.01))
    with pytest.raises(GwdetError, match=rf"^ResilientCheckpointer\.load: {re.escape(path)} holds no 'optimizer' "
                                         r"state, which checkpointables=\['optimizer'\] asks to restore: it holds no "
                                         r"checkpointable's state, only 'model', .*nothing was loaded\. .*"
                                         r"checkpointables=\[\]"):
        checkpointer.load(path, checkpointables=["optimizer"])
    assert all(torch.equal(value, before[key]) for key, value in loading.state_dict().items())
    checkpointer.load(path)  # without names: whatever the file holds, as detectron2 does
    assert all(torch.equal(value, model.state_dict()[key]) for key, value in loading.state_dict().items())


# before: an optimizer state of other parameter groups reached torch's "loaded state dict has a different number
# of parameter groups" after the model's weights were already replaced; momentum buffers of another model's
# shapes loaded, and the first step failed
def test_load_refuses_an_optimizer_state_that_does_not_fit_before_loading_weights(tmp_path):
    from gwdet.checkpoint.resilient import ResilientCheckpointer
    from gwdet.errors import GwdetError

    model = _checkpointed_model()
    groups = [{"params": list(model[0].parameters())}, {"params": list(model[1].parameters()), "weight_decay": 0.0}]
    trained = torch.optim.SGD(groups, lr=0.1, momentum=0.9)
    model(torch.randn(2, 3, 8, 8)).sum().backward()
    trained.step()
    ResilientCheckpointer(model, str(tmp_path), optimizer=trained).save("opt")
    path = str(tmp_path / "opt.pth")

    def refused(optimizer_of, finding):
        loading = _checkpointed_model()
        before = {key: value.clone() for key, value in loading.state_dict().items()}
        with pytest.raises(GwdetError, match=rf"^ResilientCheckpointer\.load: the 'optimizer' state in {re.escape(path)} "
                                             rf"does not fit the optimizer given as 'optimizer': {finding}\. .*nothing "
                                             r"was loaded\. .*checkpointables=\[\]"):
            ResilientCheckpointer(loading, optimizer=optimizer_of(loading)).load(path)
        assert all(torch.equal(value, before[key]) for key, value in loading.state_dict().items())

    refused(lambda m: torch.optim.SGD(m.parameters(), lr=0.1), r"the saved state has 2 parameter group\(s\) of 2, 2 "
            r"parameter\(s\), this optimizer 1 of 4")
    refused(lambda m: torch.optim.SGD([{"params": list(m[0].parameters())}, {"params": [m[1].weight]}], lr=0.1),
            r"the saved state has 2 parameter group\(s\) of 2, 2 parameter\(s\), this optimizer 2 of 2, 1")
    refused(lambda m: torch.optim.SGD([{"params": [m[0].bias, m[0].weight]}, {"params": list(m[1].parameters())}],
                                      lr=0.1),
            r"the saved momentum_buffer of parameter 0 has shape \[16, 3, 3, 3\], but this optimizer's parameter at "
            r"that place \(0\.bias\) has shape \[16\]")
    loading = _checkpointed_model()
    fitting = torch.optim.SGD([{"params": list(loading[0].parameters())}, {"params": list(loading[1].parameters())}],
                              lr=0.5, momentum=0.9)
    ResilientCheckpointer(loading, optimizer=fitting).load(path)
    assert fitting.param_groups[1]["weight_decay"] == 0.0 and fitting.param_groups[0]["lr"] == 0.1
    other = _checkpointed_model()  # the weights only: the optimizer's state is not read
    ResilientCheckpointer(other, optimizer=torch.optim.SGD(other.parameters(), lr=0.5)).load(path, checkpointables=[])
    assert all(torch.equal(value, model.state_dict()[key]) for key, value in other.state_dict().items())


# before: require_every_weight='no' and compare_input='no' were read as True
@pytest.mark.parametrize("flag", ["require_every_weight", "compare_input", "save_to_disk"])
def test_checkpointer_flags_must_be_true_or_false(flag):
    from gwdet.checkpoint.resilient import ResilientCheckpointer
    from gwdet.errors import GwdetError

    with pytest.raises(GwdetError, match=rf"^ResilientCheckpointer: {flag} must be True or False, got 'no'"):
        ResilientCheckpointer(_checkpointed_model(), **{flag: "no"})
    assert getattr(ResilientCheckpointer(_checkpointed_model(), **{flag: False}), flag) is False


# before: segment=5, save_dir=123 and a model of None raised bare TypeErrors and AttributeErrors naming no argument
@pytest.mark.parametrize("arguments, message", [
    ({"segment": 5}, r"segment must be a mapping .*got int 5"),
    ({"save_dir": 123}, r"save_dir must be a str or os\.PathLike .*got int 123"),
    ({"model": None}, r"model must be a torch\.nn\.Module .*got NoneType None"),
    ({"training_data": ["a.json"]}, r"training_data must be a mapping .*got list \['a\.json'\]"),
    ({"optimizer": 5}, r"the checkpointable optimizer=5 \(int\) has no state_dict\(\) and load_state_dict\(\)"),
])
def test_checkpointer_arguments_of_another_type_are_refused_by_name(arguments, message):
    from gwdet.checkpoint.resilient import ResilientCheckpointer
    from gwdet.errors import GwdetTypeError

    arguments = dict(arguments)  # the parameter's own dict stays whole for a test run again in this process
    model = arguments.pop("model", _checkpointed_model())
    with pytest.raises(GwdetTypeError, match=rf"^ResilientCheckpointer: {message}"):
        ResilientCheckpointer(model, **arguments)


# ---- what a weight file is, by its first bytes -------------------------------------------------------

def written(folder, name, content):
    path = os.path.join(folder, name)
    with open(path, "wb") as file:
        file.write(content)
    return path


@pytest.mark.parametrize("name, head, expected", [
    ("model.onnx", b"\x08\x07\x12\x04none", True),
    ("MODEL.ONNX", b"\x08\x07\x12\x04none", True),
    ("model.onnx", b"\x0a\x07\x12\x04none", False),  # not ir_version first: no ONNX model
    ("model.bin", b"\x08\x07\x12\x07pytorch\x1a\x032.1", True),  # PyTorch's exporter, whatever the name
    ("model.bin", b"\x08\x07\x12\x04none", False),
    ("PYTORCH.bin", b"\x08\x07\x12\x04none", False),  # the producer is read from the content, not the name
    # only the first 64 bytes are read: a producer named past them is not seen
    ("model.bin", b"\x08" + b"\x00" * 57 + b"pytorch", False),
    ("model.bin", b"\x08" + b"\x00" * 56 + b"pytorch", True),
])
def test_an_onnx_model_is_told_by_its_first_field_and_its_name_or_producer(tmp_path, name, head, expected):
    from gwdet.checkpoint.safe_load import _looks_like_onnx

    assert _looks_like_onnx(written(str(tmp_path), name, head)) is expected


def zip_of(folder, name, entries):
    import zipfile

    path = os.path.join(folder, name)
    with zipfile.ZipFile(path, "w") as archive:
        for entry, data in entries.items():
            archive.writestr(entry, data)
    return path


def test_the_pickle_protocol_of_a_torch_save_archive_is_read_from_its_data_pkl(tmp_path):
    """torch.save's archive gives its protocol; an archive without data.pkl, or whose data.pkl does not
    start with pickle's PROTO opcode (or is too short to), and a file that is no zip, give None."""
    from gwdet.checkpoint.safe_load import zip_pickle_protocol

    torch.save({"weight": torch.zeros(2)}, tmp_path / "saved.pth")
    assert zip_pickle_protocol(str(tmp_path / "saved.pth")) == 2
    torch.save({"weight": torch.zeros(2)}, tmp_path / "saved4.pth", pickle_protocol=4)
    assert zip_pickle_protocol(str(tmp_path / "saved4.pth")) == 4
    folder = str(tmp_path)
    assert zip_pickle_protocol(zip_of(folder, "other.zip", {"archive/notes.txt": b"notes"})) is None
    assert zip_pickle_protocol(zip_of(folder, "text.zip", {"archive/data.pkl": b"ab"})) is None
    assert zip_pickle_protocol(zip_of(folder, "short.zip", {"archive/data.pkl": b"\x80"})) is None
    assert zip_pickle_protocol(zip_of(folder, "empty.zip", {"archive/data.pkl": b""})) is None
    assert zip_pickle_protocol(written(folder, "plain.pth", b"\x80\x02notazip")) is None


def test_a_numpy_archive_is_a_zip_of_npy_arrays_only(tmp_path):
    """np.savez's archive is one; torch.save's, a damaged zip (its directory unreadable) and a file that is
    no zip are not."""
    import struct

    from gwdet.checkpoint.safe_load import is_numpy_archive

    np.savez(tmp_path / "arrays.npz", a=np.zeros(2), b=np.ones(3))
    assert is_numpy_archive(str(tmp_path / "arrays.npz"))
    torch.save({"weight": torch.zeros(2)}, tmp_path / "saved.pth")
    assert not is_numpy_archive(str(tmp_path / "saved.pth"))
    assert not is_numpy_archive(written(str(tmp_path), "text.npz", b"no archive at all"))
    # an end-of-archive record pointing at a central directory that is not one
    damaged = b"J" * 46 + struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 1, 1, 46, 0, 0)
    assert not is_numpy_archive(written(str(tmp_path), "damaged.npz", damaged))


@pytest.mark.parametrize("path, recipe", [
    ("w/model.pth", 'import torch; d = torch.load("w/model.pth", weights_only=True); torch.save({k: v for k, v in '
                    'd.items() if k not in ("gwdet_checksums", "gwdet_state_checksums")}, "w/model_unchecked.pth")'),
    ("w/model", 'import torch; d = torch.load("w/model", weights_only=True); torch.save({k: v for k, v in '
                'd.items() if k not in ("gwdet_checksums", "gwdet_state_checksums")}, "w/model_unchecked.pth")'),
    ("w/model.pt", 'import torch; d = torch.load("w/model.pt", weights_only=True); torch.save({k: v for k, v in '
                   'd.items() if k not in ("gwdet_checksums", "gwdet_state_checksums")}, "w/model_unchecked.pt")'),
    ("w/model.pkl", 'import pickle; d = pickle.load(open("w/model.pkl", "rb")); pickle.dump({k: v for k, v in '
                    'd.items() if k not in ("gwdet_checksums", "gwdet_state_checksums")}, '
                    'open("w/model_unchecked.pkl", "wb"))'),
])
def test_the_recipe_without_checksums_keeps_the_suffix_and_pickles_converted_weights(path, recipe):
    from gwdet.checkpoint.integrity import without_checksums_recipe

    assert without_checksums_recipe(path) == recipe


class _Named:
    """An object with a ``__name__`` of its own but no ``__qualname__``."""

    __name__ = "scale"


@pytest.mark.parametrize("value, path", [
    (torch.nn.ReLU, "torch.nn.modules.activation.ReLU"),
    (torch.nn.Module.to, "torch.nn.modules.module.Module.to"),  # the qualified name, not the bare one
    (torch.nn.functional, "torch.nn.functional"),
    (str.upper, "str.upper"),  # no __module__: the qualified name alone
    ("abc".upper, "str.upper"),  # __module__ None
    (_Named(), f"{__name__}.scale"),
    (functools.partial(max, 1), "functools.functools.partial(<built-in function max>, 1)"),
])
def test_the_import_path_is_module_and_qualified_name_falling_back_to_name_then_repr(value, path):
    from gwdet.checkpoint.compatibility import _import_path

    assert _import_path(value) == path


def test_a_method_descriptor_setting_is_recorded_by_its_qualified_name():
    from gwdet.checkpoint.compatibility import plain_setting

    assert plain_setting(str.upper) == "str.upper"
    assert plain_setting(torch.nn.Module.to) == "torch.nn.modules.module.Module.to"


def _scaler(factor: float):
    """A factory of functions: each it makes has the same qualified name, ``_scaler.<locals>.scale``."""
    def scale(x):
        return x * factor
    return scale


def _module_level_scale(x):
    return x * 2


class _Scaling:
    def __init__(self, factor: float):
        self.factor = factor

    def __repr__(self) -> str:
        return f"_Scaling({self.factor})"

    def apply(self, x):
        return x * self.factor


def _code_of(function) -> str:
    from gwdet.checkpoint.compatibility import _code_digest

    return f"code {_code_digest(function.__code__)}"


_DOUBLE, _TRIPLE = (lambda x: x * 2), (lambda x: x * 3)


@pytest.mark.parametrize("value, record", [
    (_scaler(0.5), f"{__name__}._scaler.<locals>.scale {_code_of(_scaler(0.5))} closure [0.5]"),
    (lambda x, s=3: x * s, f"{__name__}.<lambda> {{code}} defaults [3]"),
    (lambda x, *, s=4: x * s, f"{__name__}.<lambda> {{code}} keyword defaults {{{{'s': 4}}}}"),
    (_DOUBLE, f"{__name__}.<lambda> {_code_of(_DOUBLE)}"),
    (_module_level_scale, f"{__name__}._module_level_scale"),  # its path names it: no values added
    (_Scaling(2.0).apply, f"{__name__}._Scaling.apply of '_Scaling(2.0)'"),
])
def test_a_function_setting_is_recorded_with_the_values_its_path_does_not_name(value, record):
    from gwdet.checkpoint.compatibility import plain_setting

    assert plain_setting(value) == record.replace("{code}", _code_of(value)).replace("{{", "{").replace("}}", "}")


# before: `lambda t: t * 2` and `lambda t: t * 3` (or a script's function edited between saving and loading) were both
# recorded as `module.<lambda>`, so weights trained with one loaded into a layer built with the other without a word
def test_two_lambdas_of_other_code_are_recorded_apart_and_one_code_alike_wherever_it_stands():
    from gwdet.checkpoint.compatibility import _code_digest, plain_setting

    assert plain_setting(_DOUBLE) != plain_setting(_TRIPLE)
    again = eval(compile("\n\n\n(lambda x: x * 2)", "elsewhere.py", "eval"))  # other file and line, same code
    assert _code_digest(again.__code__) == _code_digest(_DOUBLE.__code__)
    nested = [eval(f"lambda x: (lambda y: y * {factor})(x)") for factor in (2, 3)]  # the difference in nested code
    assert _code_digest(nested[0].__code__) != _code_digest(nested[1].__code__)
    scripts = []
    for factor in (2, 3):  # a script's own function (module __main__), edited between two runs
        scope: dict = {"__name__": "__main__"}
        exec(f"def act(t):\n    return t * {factor}\n", scope)
        scripts.append(plain_setting(scope["act"]))
    assert scripts[0].startswith("__main__.act code ") and scripts[0] != scripts[1]


def test_a_bound_method_of_an_object_no_record_can_tell_apart_is_refused():
    from gwdet.checkpoint.compatibility import UnrecordableSettingError, plain_setting

    class Opaque:
        def apply(self, x):
            return x

    with pytest.raises(UnrecordableSettingError, match="repr names where it is in memory"):
        plain_setting(Opaque().apply)


# before: a setting made by a factory (make(0.5) and make(2.0), both `make.<locals>.scale`) was recorded by its
# name alone, so weights trained with one loaded into a model built with the other without a word
def test_weights_of_a_norm_built_with_one_factory_made_function_are_refused_for_another(tmp_path, registered):
    import gwdet
    from gwdet.checkpoint.resilient import ResilientCheckpointer

    registered.append("TestScaledByGN")
    gwdet.register_norm("TestScaledByGN", lambda channels, by=None: torch.nn.GroupNorm(2, channels))
    ResilientCheckpointer(nn.Sequential(nn.Conv2d(3, 8, 3), gwdet.norm("TestScaledByGN", by=_scaler(0.5))(8)),
                          str(tmp_path)).save("w")
    path = str(tmp_path / "w.pth")
    ResilientCheckpointer(nn.Sequential(nn.Conv2d(3, 8, 3),
                                        gwdet.norm("TestScaledByGN", by=_scaler(0.5))(8))).load(path)
    with pytest.raises(ValueError, match=r"other norm hyper-parameters .*closure \[0\.5\]' -> '.*closure \[2\.0\]"):
        ResilientCheckpointer(nn.Sequential(nn.Conv2d(3, 8, 3),
                                            gwdet.norm("TestScaledByGN", by=_scaler(2.0))(8))).load(path)
