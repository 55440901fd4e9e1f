"""Properties of the checks that no other test pinned: each test here kills a mutation of the code
that the rest of the suite let pass (docs/reliability.md, "Mutation testing").
"""
import dataclasses
import functools
import logging
import os
import pickle
import types

import numpy as np
import pytest

from gwdet.norms import OWN_NAMES_NOTE
import torch
from detectron2.config import get_cfg

from gwdet import add_gwdet_config, check_gwdet_config, known_norm_names, norm
from gwdet.config_checks import NormConfigError, UnknownNormConfigError
from gwdet.config import config_default
from gwdet.engine.output_dir import check_resume_config
from gwdet.utils.run_file_names import CONFIG_NAME
from gwdet.layers import GroupWhitening
from gwdet.errors import GwdetValueError
from gwdet.norms import UnknownNormError

from conftest import REPO, logged_warnings


def gw_backbone_config():
    cfg = get_cfg()
    add_gwdet_config(cfg)
    cfg.MODEL.BACKBONE.NAME = "build_gw_resnet_fpn_backbone"
    cfg.MODEL.RESNETS.GW_POSITIONS = "S1-B2"
    cfg.MODEL.ROI_HEADS.NAME = "StandardROIHeads"  # FPN's heads: res5 is in the backbone
    return cfg


def test_gw_norm_with_an_unknown_name_is_refused_naming_the_key():
    cfg = gw_backbone_config()
    check_gwdet_config(cfg)  # the paper's S1-B2 with GW_NORM "GW": valid
    cfg.MODEL.RESNETS.GW_NORM = "GWW"
    with pytest.raises(UnknownNormError, match=r"MODEL\.RESNETS\.GW_NORM='GWW' is not a known norm name"):
        check_gwdet_config(cfg)


def test_defaults_are_the_papers_in_the_config_table_and_in_the_layer():
    # group_whitening_huang2021 Sec. 5: GW (g=64) with ItN, T=5 (and eps 1e-5 in its Algorithm 1).
    assert config_default("MODEL.GW.NUM_GROUPS") == 64
    assert config_default("MODEL.GW.T") == 5
    assert config_default("MODEL.GW.EPS") == 1e-5
    layer = GroupWhitening(256)
    assert (layer.num_groups, layer.T, layer.eps) == (64, 5, 1e-5)
    built = norm("GW")(256)
    assert (built.num_groups, built.T, built.eps) == (64, 5, 1e-5)
    cfg = get_cfg()
    add_gwdet_config(cfg)
    assert (cfg.MODEL.GW.NUM_GROUPS, cfg.MODEL.GW.T, cfg.MODEL.GW.EPS) == (64, 5, 1e-5)


def run_folder_with(cfg, folder):
    """A run folder as training leaves it: its config.yaml and one checkpoint."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, CONFIG_NAME), "w") as f:
        f.write(cfg.dump())
    open(os.path.join(folder, "model_0000009.pth"), "wb").close()
    return str(folder)


def test_resume_allows_other_weights_and_device_but_not_another_model(tmp_path, caplog):
    trained = gw_backbone_config()
    folder = run_folder_with(trained, tmp_path / "run")

    moved = trained.clone()
    moved.MODEL.WEIGHTS = "elsewhere/model_final.pth"
    moved.MODEL.DEVICE = "cuda"
    check_resume_config(moved, folder)  # where the weights come from and where they run: no other model

    longer = trained.clone()
    longer.SOLVER.MAX_ITER = trained.SOLVER.MAX_ITER * 2
    with caplog.at_level(logging.WARNING):
        check_resume_config(longer, folder)  # a longer schedule: logged, not refused
    assert "SOLVER.MAX_ITER" in caplog.text

    for key, value in [("GW.NUM_GROUPS", 16), ("RESNETS.GW_POSITIONS", "S1"), ("PIXEL_STD", [57.0, 57.0, 57.0])]:
        other = trained.clone()
        other.merge_from_list([f"MODEL.{key}", value])
        with pytest.raises(ValueError, match=rf"trained with another model .*MODEL\.{key}"):
            check_resume_config(other, folder)


def test_the_combined_norm_error_lists_changes_then_every_finding_and_marks_the_ones_by_hand():
    cfg = get_cfg()
    add_gwdet_config(cfg)
    cfg.MODEL.META_ARCHITECTURE = "SemanticSegmentor"
    cfg.MODEL.BACKBONE.NAME = "build_resnet_fpn_backbone"
    cfg.MODEL.SEM_SEG_HEAD.NAME = "DeepLabV3Head"  # no gwdet replacement: a finding to fix by hand
    cfg.MODEL.SEM_SEG_HEAD.NORM = "GW"
    cfg.MODEL.FPN.NORM, cfg.MODEL.GN.NUM_GROUPS = "GN", 16  # detectron2's FPN would build 32 groups
    cfg.MODEL.ROI_BOX_HEAD.NORM = "GWW"
    with pytest.raises(UnknownNormConfigError) as err:
        check_gwdet_config(cfg)
    assert isinstance(err.value, KeyError) and isinstance(err.value, NormConfigError)
    assert err.value.changes == {"MODEL.BACKBONE.NAME": "build_gw_resnet_fpn_backbone"}
    assert len(err.value.problems) == 3
    assert str(err.value) == "\n".join([
        "The config's norms cannot be built as configured (3 finding(s)).",
        "Change these keys, all at once (and fix the findings below marked 'by hand'):",
        "  MODEL.BACKBONE.NAME: 'build_resnet_fpn_backbone' -> 'build_gw_resnet_fpn_backbone'",
        "  (command-line overrides: MODEL.BACKBONE.NAME build_gw_resnet_fpn_backbone)",
        "Findings:",
        "  - by hand: MODEL.ROI_BOX_HEAD.NORM='GWW' is not a known norm name: fix the name, or register it with "
        f"gwdet.register_norm ({OWN_NAMES_NOTE})",
        "  - MODEL.FPN.NORM='GN' with MODEL.GN.NUM_GROUPS=16, and detectron2's build_resnet_fpn_backbone "
        "(MODEL.BACKBONE.NAME) always builds GN with 32 groups; gwdet's build_gw_resnet_fpn_backbone builds the "
        "same network with the config's values (MODEL.BACKBONE.NAME build_gw_resnet_fpn_backbone)",
        "  - by hand: MODEL.SEM_SEG_HEAD.NORM='GW', but detectron2's DeepLabV3Head (MODEL.SEM_SEG_HEAD.NAME) cannot "
        "build 'GW' with the config's values (detectron2's get_norm would raise KeyError); gwdet has no replacement "
        "for DeepLabV3Head: set MODEL.SEM_SEG_HEAD.NORM to one of detectron2's names (BN, SyncBN, FrozenBN; GN with "
        "MODEL.GN.NUM_GROUPS 32), or build that part with gwdet.norm_from_config(name, cfg) in a subclass's "
        "from_config",
        f"Known names: {', '.join(known_norm_names())}.",
        "gwdet's components are detectron2's own with the norms built with the config's values; see docs/usage.md, "
        "section \"How norm hyper-parameters reach the layers\".",
    ])
    # fixed by hand, the rest is one change away: no 'by hand' marks, no list of names
    cfg.MODEL.ROI_BOX_HEAD.NORM, cfg.MODEL.SEM_SEG_HEAD.NAME = "", "SemSegFPNHead"
    with pytest.raises(NormConfigError) as err:
        check_gwdet_config(cfg)
    assert not isinstance(err.value, KeyError)
    lines = str(err.value).splitlines()
    assert lines[1] == "Change these keys, all at once:" and "Known names" not in str(err.value)
    assert lines[4] == ("  (command-line overrides: MODEL.BACKBONE.NAME build_gw_resnet_fpn_backbone "
                        "MODEL.SEM_SEG_HEAD.NAME GWSemSegFPNHead)")
    assert err.value.changes == {"MODEL.BACKBONE.NAME": "build_gw_resnet_fpn_backbone",
                                 "MODEL.SEM_SEG_HEAD.NAME": "GWSemSegFPNHead"}
    assert [line for line in lines if line.startswith("  - ")] == [f"  - {why}" for why in err.value.problems]
    restored = pickle.loads(pickle.dumps(err.value))  # e.g. from a worker process
    assert (str(restored), restored.changes, restored.problems) == (str(err.value), err.value.changes,
                                                                    err.value.problems)


def test_which_parts_each_meta_architecture_builds():
    from gwdet.config_checks import BOX_HEAD, MASK_HEAD, ROI_HEADS, SEM_SEG_HEAD, builds_part

    cfg = get_cfg()
    add_gwdet_config(cfg)
    cfg.MODEL.MASK_ON, cfg.MODEL.ROI_HEADS.NAME = True, "StandardROIHeads"
    expected = {  # meta-architecture -> (ROI heads, box head, mask head, semantic head)
        "GeneralizedRCNN": (True, True, True, False),
        "ProposalNetwork": (False, False, False, False),
        "RetinaNet": (False, False, False, False),
        "SemanticSegmentor": (False, False, False, True),
        "PanopticFPN": (True, True, True, True),
        "MyProjectsArch": (True, True, True, True),  # unknown: it may build any part, so all are checked
    }
    for arch, parts in expected.items():
        cfg.MODEL.META_ARCHITECTURE = arch
        assert tuple(builds_part(cfg, part) for part in (ROI_HEADS, BOX_HEAD, MASK_HEAD, SEM_SEG_HEAD)) == parts, arch
        assert builds_part(cfg, None), "the backbone is always built"


def test_an_unknown_name_at_a_key_detectron2_reads_is_one_finding_not_two():
    cfg = gw_backbone_config()
    cfg.MODEL.BACKBONE.NAME = "build_resnet_fpn_backbone"
    cfg.MODEL.RESNETS.GW_POSITIONS = ""
    cfg.MODEL.FPN.NORM = "GWW"
    with pytest.raises(UnknownNormConfigError) as err:
        check_gwdet_config(cfg)
    # a name registered in one's own code was not said to be unknown to gwdet's tools
    assert err.value.problems == ["MODEL.FPN.NORM='GWW' is not a known norm name: fix the name, or register it with "
                                  f"gwdet.register_norm ({OWN_NAMES_NOTE})"]
    assert "gwdet's tools cannot run it, nor can a run's saved config.yaml" in OWN_NAMES_NOTE


def test_hyper_parameters_a_name_does_not_take_or_lacks_are_named(registered):
    from gwdet.norms import register_norm

    with pytest.raises(TypeError) as err:
        norm("BN", num_groups=3)
    assert str(err.value) == ("gwdet.norm('BN') takes no hyper-parameters, not ['num_groups']. Leave num_groups out; in "
                              "a LazyConfig node that an override switched to 'BN', set it to null (<the node's "
                              "path>.num_groups=null), as an override cannot delete a value.")
    register_norm("TestNeedsWidth", lambda channels, width: torch.nn.GroupNorm(width, channels))
    registered.append("TestNeedsWidth")
    with pytest.raises(TypeError) as err:
        norm("TestNeedsWidth")
    assert str(err.value) == "gwdet.norm('TestNeedsWidth') needs a value for 'width'"
    assert norm("TestNeedsWidth", width=2)(4).num_groups == 2


def test_an_unknown_norm_name_is_named_with_every_known_one():
    from gwdet.norms import norm_record

    with pytest.raises(UnknownNormError) as err:
        norm_record("GWW")
    assert str(err.value) == (f"Unknown norm name 'GWW'. Known names: {', '.join(known_norm_names())}. Fix the NORM "
                              f"value, or register the name with gwdet.register_norm(name, build) ({OWN_NAMES_NOTE}).")



def test_gw_positions_in_a_c4_model_of_detectron2s_components_name_both_replacements():
    cfg = get_cfg()
    add_gwdet_config(cfg)
    cfg.MODEL.RESNETS.GW_POSITIONS = "S1-B2"  # detectron2's C4 defaults: build_resnet_backbone, Res5ROIHeads
    with pytest.raises(NormConfigError) as err:
        check_gwdet_config(cfg)
    assert err.value.changes == {"MODEL.BACKBONE.NAME": "build_gw_resnet_backbone",
                                 "MODEL.ROI_HEADS.NAME": "GWRes5ROIHeads"}
    assert err.value.problems == [
        "MODEL.RESNETS.GW_POSITIONS='S1-B2' is read by gwdet's backbones only (and by builders of your own marked "
        "with gwdet.modeling.reads_gw_positions), but MODEL.BACKBONE.NAME='build_resnet_backbone' is none of them: it "
        "would build a model without GW there; gwdet's build_gw_resnet_backbone builds the "
        "same network with GW there (MODEL.BACKBONE.NAME build_gw_resnet_backbone)",
        "MODEL.RESNETS.GW_POSITIONS='S1-B2' puts GW in every bottleneck block, but detectron2's Res5ROIHeads "
        "(MODEL.ROI_HEADS.NAME) would build the res5 blocks without it; gwdet's GWRes5ROIHeads builds the same "
        "network with GW there in res5 (MODEL.ROI_HEADS.NAME GWRes5ROIHeads)",
    ]
    cfg.MODEL.RESNETS.GW_POSITIONS = "S1"  # the stem only: res5 has no GW to lose
    with pytest.raises(NormConfigError) as err:
        check_gwdet_config(cfg)
    assert err.value.changes == {"MODEL.BACKBONE.NAME": "build_gw_resnet_backbone"}


def test_a_built_c4_model_whose_res5_lacks_the_backbones_gw_positions_is_refused():
    # a LazyConfig of detectron2's mask_rcnn_c4.py with place_norm on the backbone: res5 (in the ROI heads)
    # kept BN at B2 without a word
    from gwdet import build_model, check_model
    from gwdet.model_zoo import build_config

    cfg = build_config("configs/Demo/mask_rcnn_R_50_FPN_gw_shapes.yaml", [
        "MODEL.DEVICE", "cpu", "MODEL.BACKBONE.NAME", "build_gw_resnet_backbone", "MODEL.RESNETS.OUT_FEATURES",
        "['res4']", "MODEL.ROI_HEADS.NAME", "GWRes5ROIHeads", "MODEL.ROI_HEADS.IN_FEATURES", "['res4']",
        "MODEL.RPN.IN_FEATURES", "['res4']", "MODEL.ANCHOR_GENERATOR.SIZES", "[[32, 64]]", "MODEL.MASK_ON", "False",
        "MODEL.RESNETS.GW_POSITIONS", "S1-B2"])
    model = build_model(cfg)  # gwdet's GWRes5ROIHeads places GW in res5 too: accepted
    for block in model.roi_heads.res5:
        block.conv2.norm = torch.nn.BatchNorm2d(block.conv2.out_channels)
    with pytest.raises(ValueError, match=r"^The backbone's ResNet has GW at B2 of its blocks, but roi_heads.res5, the "
                                         r"C4 head's stage 5, has not at B2: .*MODEL.ROI_HEADS.NAME GWRes5ROIHeads"):
        check_model(model)


def test_gw_positions_with_a_backbone_gwdet_has_no_replacement_for_say_what_to_do_by_hand():
    cfg = get_cfg()
    add_gwdet_config(cfg)
    cfg.MODEL.BACKBONE.NAME = "build_resnet_deeplab_backbone"
    cfg.MODEL.RESNETS.GW_POSITIONS = "S1"
    with pytest.raises(NormConfigError) as err:
        check_gwdet_config(cfg)
    assert err.value.changes == {}
    assert err.value.problems == [
        "MODEL.RESNETS.GW_POSITIONS='S1' is read by gwdet's backbones only (and by builders of your own marked with "
        "gwdet.modeling.reads_gw_positions), but MODEL.BACKBONE.NAME='build_resnet_deeplab_backbone' is none of them: "
        "it would build a model without GW there; gwdet has no replacement for "
        "build_resnet_deeplab_backbone: set MODEL.BACKBONE.NAME to one of build_gw_resnet_backbone, "
        "build_gw_resnet_fpn_backbone, build_gw_retinanet_resnet_fpn_backbone, or MODEL.RESNETS.GW_POSITIONS to '', "
        "or build that part with gwdet.norm_from_config(name, cfg) in a subclass's from_config"]


def test_a_backbone_of_your_own_marked_as_reading_the_gw_positions_is_accepted():
    # a builder around gwdet's was refused as one that "would build a model without GW there", with no way through
    from detectron2.modeling import BACKBONE_REGISTRY

    from gwdet.modeling import build_gw_resnet_fpn_backbone, reads_gw_positions

    def test_own_gw_backbone(cfg, input_shape):
        return build_gw_resnet_fpn_backbone(cfg, input_shape)

    cfg = gw_backbone_config()
    cfg.MODEL.BACKBONE.NAME = "test_own_gw_backbone"
    BACKBONE_REGISTRY.register(test_own_gw_backbone)
    try:
        with pytest.raises(NormConfigError, match="'test_own_gw_backbone' is none of them"):
            check_gwdet_config(cfg)
        reads_gw_positions(test_own_gw_backbone)
        check_gwdet_config(cfg)
    finally:
        BACKBONE_REGISTRY._obj_map.pop("test_own_gw_backbone")
    with pytest.raises(TypeError, match=r"reads_gw_positions marks a backbone builder function .*, not int 5"):
        reads_gw_positions(5)  # a raw AttributeError


def test_a_marked_backbone_of_your_own_that_places_no_gw_is_refused_after_the_build():
    # a builder marked as reading GW_POSITIONS that built detectron2's backbone: a model without GW, no word
    from detectron2.modeling import BACKBONE_REGISTRY
    from detectron2.modeling.backbone.fpn import build_resnet_fpn_backbone

    import gwdet
    from gwdet.model_zoo import build_config
    from gwdet.modeling import reads_gw_positions

    from conftest import DEMO_CONFIG

    @reads_gw_positions
    def test_marked_plain_backbone(cfg, input_shape):
        return build_resnet_fpn_backbone(cfg, input_shape)

    BACKBONE_REGISTRY.register(test_marked_plain_backbone)
    try:
        cfg = build_config(str(DEMO_CONFIG), ["MODEL.BACKBONE.NAME", "test_marked_plain_backbone", "MODEL.DEVICE", "cpu",
                                              "MODEL.RESNETS.NORM", "BN", "MODEL.FPN.NORM", ""])
        with pytest.raises(ValueError, match=r"MODEL.BACKBONE.NAME 'test_marked_plain_backbone' is marked as reading "
                                             r"MODEL.RESNETS.GW_POSITIONS \('S1-B2'; gwdet.modeling.reads_gw_positions\), "
                                             r"but the backbone it built holds no GW layer"):
            gwdet.build_model(cfg)
    finally:
        BACKBONE_REGISTRY._obj_map.pop("test_marked_plain_backbone")


def test_gw_positions_without_a_gw_norm_and_example_groups_larger_than_the_batch_are_refused_in_full():
    cfg = gw_backbone_config()
    cfg.MODEL.RESNETS.GW_NORM = ""
    with pytest.raises(ValueError) as err:
        check_gwdet_config(cfg)
    assert str(err.value) == (
        "MODEL.RESNETS.GW_POSITIONS='S1-B2' with MODEL.RESNETS.GW_NORM='' would leave those positions without any "
        "normalization. Set GW_NORM to the norm to place there (e.g. 'GW'), or GW_POSITIONS to '' to keep "
        "MODEL.RESNETS.NORM everywhere.")
    cfg = gw_backbone_config()
    cfg.MODEL.FPN.NORM, cfg.SOLVER.IMS_PER_BATCH = "BGN", 2
    cfg.MODEL.BGN.EXAMPLES_PER_GROUP = 2
    check_gwdet_config(cfg)  # one example group of the whole batch: fine
    cfg.MODEL.BGN.EXAMPLES_PER_GROUP = 3
    with pytest.raises(ValueError) as err:
        check_gwdet_config(cfg)
    assert str(err.value) == (
        "config: MODEL.BGN.EXAMPLES_PER_GROUP=3 is larger than SOLVER.IMS_PER_BATCH=2, so no example group can be "
        "filled. Use at most the images per GPU (SOLVER.IMS_PER_BATCH / number of GPUs); to evaluate weights (a model "
        "of the config, which may be trained again), give the SOLVER.IMS_PER_BATCH they were trained with.")
    cfg.MODEL.FPN.NORM = "GN"  # no norm with example groups: the value is not read
    check_gwdet_config(cfg)


def test_a_config_without_gwdets_keys_and_bad_position_specs_are_refused_in_full():
    with pytest.raises(KeyError) as err:
        check_gwdet_config(get_cfg())
    assert str(err.value.args[0]).startswith("gwdet needs gwdet's config keys (MODEL.GW.*, ...), but the config has none")
    from gwdet.positions import parse_gw_positions

    with pytest.raises(ValueError) as err:
        parse_gw_positions(["S1"])
    assert str(err.value) == "MODEL.RESNETS.GW_POSITIONS must be a string like 'S1-B2', got ['S1']"
    with pytest.raises(ValueError) as err:
        parse_gw_positions("S1-B4")
    assert str(err.value) == ("MODEL.RESNETS.GW_POSITIONS='S1-B4': unknown position 'B4'. Valid tokens: S1, B1, B2, "
                              "B3, B12, joined by '-' (e.g. 'S1-B2'); '' means no GW.")


def test_the_python_api_names_what_it_was_given_instead_of_a_model_or_a_config():
    import gwdet
    from detectron2.config import get_cfg

    with pytest.raises(TypeError, match="check_model: give the built model .*got NoneType"):
        gwdet.check_model(None)
    with pytest.raises(TypeError, match="build_optimizer.*got CfgNode and NoneType; for a LazyConfig"):
        gwdet.build_optimizer(get_cfg(), None)
    with pytest.raises(TypeError, match=r"add_gwdet_config: give a yacs CfgNode .*got NoneType"):
        gwdet.add_gwdet_config(None)
    cfg = get_cfg()
    cfg.MODEL.GW = 5
    with pytest.raises(TypeError, match="add_gwdet_config: MODEL.GW is 5, where gwdet's keys"):
        gwdet.add_gwdet_config(cfg)


# ---- what gwdet.norm and a LazyConfig node say of values a norm does not take -------------------

@pytest.mark.parametrize("name, accepted, unknown, node, added, expected", [
    # two misspelt settings, in a LazyConfig node: both fixes, with the node's path
    ("GW", ["num_groups", "T", "eps"], ["num_group", "epss"], "model.backbone.norm", False,
     "gwdet.norm('GW') takes ['num_groups', 'T', 'eps'], not ['num_group', 'epss']. Did you mean "
     "model.backbone.norm.num_groups (not num_group), model.backbone.norm.eps (not epss)?"),
    # a misspelt setting and one no norm takes: one sentence each
    ("GN", ["num_groups"], ["num_group", "zz"], None, False,
     "gwdet.norm('GN') takes ['num_groups'], not ['num_group', 'zz']. Did you mean num_groups (not num_group)? "
     "No norm takes zz: leave zz out."),
    # values no norm takes, in a node: an override cannot delete them, so each is set to null ...
    ("GW", ["num_groups", "T", "eps"], ["qq", "zz"], "model.backbone.norm", False,
     "gwdet.norm('GW') takes ['num_groups', 'T', 'eps'], not ['qq', 'zz']. No norm takes qq, zz: set "
     "model.backbone.norm.qq=null model.backbone.norm.zz=null (an override cannot delete a value)."),
    # ... unless overrides are adding them (not in the node yet), or there is no node
    ("GW", ["num_groups", "T", "eps"], ["qq", "zz"], "model.backbone.norm", True,
     "gwdet.norm('GW') takes ['num_groups', 'T', 'eps'], not ['qq', 'zz']. No norm takes qq, zz: leave qq, zz out."),
    ("GW", ["num_groups", "T", "eps"], ["qq", "zz"], None, False,
     "gwdet.norm('GW') takes ['num_groups', 'T', 'eps'], not ['qq', 'zz']. No norm takes qq, zz: leave qq, zz out."),
    # 'method' in a node: the node's name chooses the method
    ("GW", ["num_groups", "T", "eps"], ["method"], "model.backbone.norm", False,
     "gwdet.norm('GW') takes ['num_groups', 'T', 'eps'], not ['method']. gwdet.norm chooses the whitening method by "
     "the norm's name: 'GW' whitens by ItN, 'GW_ZCA' by ZCA. Give the name of the method you want "
     "(model.backbone.norm.name=GW_ZCA), and set model.backbone.norm.method=null (an override cannot delete a "
     "value)."),
    # two arguments of the layer class the name does not set
    ("GN", ["num_groups"], ["affine", "bias"], None, False,
     "gwdet.norm('GN') takes ['num_groups'], not ['affine', 'bias']. affine, bias are arguments of GroupNorm that "
     "gwdet.norm('GN') does not set (its layers keep GroupNorm's affine=True, bias=True). For another value, "
     "register a norm name of your own whose build function sets it (gwdet.register_norm, docs/usage.md), or give, "
     "where the norm is taken, a function of the channel count that builds the GroupNorm with it; leave affine, "
     "bias out here."),
    # settings of other norms added to a node by overrides: who takes each, the first that takes the first
    ("GN", ["num_groups"], ["T", "group_size"], "model.fpn.norm", True,
     "gwdet.norm('GN') takes ['num_groups'], not ['T', 'group_size']. T is a setting of BW_ItN, GW; group_size is a "
     "setting of BW, BW_ItN, not of 'GN': give the node a norm that takes them (model.fpn.norm.name=BW_ItN), or "
     "leave them out."),
    # one such setting, taken by more norms than are listed
    ("GN", ["num_groups"], ["eps"], "model.fpn.norm", True,
     "gwdet.norm('GN') takes ['num_groups'], not ['eps']. eps is a setting of BGN, BW, BW_ItN, GW, ... (2 more), "
     "not of 'GN': give the node a norm that takes it (model.fpn.norm.name=BGN), or leave it out."),
    # settings of other norms kept by a node an override switched: set each to null
    ("GN", ["num_groups"], ["eps", "group_size"], "model.fpn.norm", False,
     "gwdet.norm('GN') takes ['num_groups'], not ['eps', 'group_size']. An override keeps the node's other values; "
     "set those the norm does not take to null to leave them out: model.fpn.norm.eps=null "
     "model.fpn.norm.group_size=null"),
    ("GN", ["num_groups"], ["eps", "group_size"], None, False,
     "gwdet.norm('GN') takes ['num_groups'], not ['eps', 'group_size']. Leave eps, group_size out; in a LazyConfig "
     "node that an override switched to 'GN', set them to null (<the node's path>.eps=null), as an override cannot "
     "delete a value."),
    # a name the catalogue does not know (e.g. unregistered meanwhile): no layer class to name
    ("TestNotRegistered", ["width"], ["zz"], None, False,
     "gwdet.norm('TestNotRegistered') takes ['width'], not ['zz']. No norm takes zz: leave zz out."),
])
def test_values_a_norm_does_not_take_are_named_with_the_fix_for_each(name, accepted, unknown, node, added, expected):
    from gwdet.norms import unknown_params_message

    assert unknown_params_message(name, accepted, unknown, node, added=added) == expected


def test_gwdet_norm_refuses_a_misspelt_setting_and_one_no_norm_takes_in_one_message():
    with pytest.raises(TypeError) as err:
        norm("GN", num_group=8, zz=1)
    assert str(err.value) == ("gwdet.norm('GN') takes ['num_groups'], not ['num_group', 'zz']. Did you mean num_groups "
                              "(not num_group)? No norm takes zz: leave zz out.")


# ---- no norm: None and '' ---------------------------------------------------------------------------

def no_norm_expected(name, place):
    none = (" None is no norm only to detectron2's get_norm and Conv2d in Python: its FPN keeps its convolutions' bias "
            "only for '' (bias = norm == ''), so with None they would have neither norm nor bias, and gwdet refuses "
            "None as a NORM value of a yacs config and as a LazyConfig's norm argument." if name is None else "")
    return (f"{name!r} names no norm, so there is nothing to build or look up. For no norm, give '' where the norm "
            f"goes: {place}.{none} Else give a norm's name: {', '.join(known_norm_names())}.")


def test_looking_up_no_norm_says_how_to_give_no_norm():
    from gwdet.norms import norm_record

    everywhere = ("NORM: \"\" in a yacs config, <the node's path>='' in a LazyConfig (e.g. model.backbone.norm=''), "
                  "norm='' to detectron2's and gwdet's components in Python, in place of gwdet.norm({})")
    with pytest.raises(UnknownNormError) as err:
        norm_record(None)
    assert str(err.value) == no_norm_expected(None, everywhere.format("None"))
    with pytest.raises(UnknownNormError) as err:
        norm("")
    assert str(err.value) == no_norm_expected("", everywhere.format("''"))


@pytest.mark.parametrize("name", [None, ""])
def test_no_norm_in_a_lazyconfig_node_names_the_node(name):
    from gwdet.norms import no_norm_message

    place = "model.fpn.norm='' (an override; model.fpn.norm = '' in Python), in place of the gwdet.norm node"
    assert no_norm_message(name, "model.fpn.norm") == no_norm_expected(name, place)


# ---- what a registered build that fails is said to have been given ------------------------------

def test_a_registered_build_that_fails_is_told_the_values_and_the_keys_they_came_from(registered):
    from gwdet.norms import add_registered_config_keys, norm_from_config, register_norm

    def test_failing_build(channels, groups=3, width=5):
        raise ValueError(f"{channels} channels cannot take {groups} groups of {width}")

    def test_failing_plain_build(channels):
        raise ValueError("no layer")

    register_norm("TestFailing", test_failing_build,
                  config_keys={"groups": "MODEL.TEST_FAILING.GROUPS", "width": "MODEL.TEST_FAILING.WIDTH"})
    registered.append("TestFailing")
    register_norm("TestFailingPlain", test_failing_plain_build)
    registered.append("TestFailingPlain")
    cfg = add_registered_config_keys(add_gwdet_config(get_cfg()))
    cases = [
        (norm_from_config("TestFailing", cfg), "TestFailing", test_failing_build,
         "groups=3, width=5 (groups from MODEL.TEST_FAILING.GROUPS, width from MODEL.TEST_FAILING.WIDTH in a yacs "
         "config)", "8 channels cannot take 3 groups of 5"),
        (norm("TestFailing", groups=2, width=4), "TestFailing", test_failing_build,
         "groups=2, width=4 (the values of gwdet.norm)", "8 channels cannot take 2 groups of 4"),
        # a name without settings read from a config: no values, and no keys to name
        (norm_from_config("TestFailingPlain", cfg), "TestFailingPlain", test_failing_plain_build, "no values",
         "no layer"),
    ]
    for built, name, build, values, why in cases:
        with pytest.raises(ValueError) as err:
            built(8)
        assert str(err.value) == (
            f"The norm {name!r} (a registered name) could not build a layer of 8 channels with {values}: its build "
            f"function {build.__qualname__} raised ValueError: {why}. Give values it can build with (--verbose shows "
            "where it failed).")


# before: MODEL.MY_GN.NUM_GROUPS 4 of a registered MyGN, with no MyGN layer built, was dropped without a word, where
# MODEL.BW.GROUP_SIZE 4 on the same config was warned of
def test_a_registered_names_config_key_no_built_norm_reads_is_warned_of_as_gwdets_are(registered):
    from gwdet.model_zoo import build_config
    from gwdet.norms import register_norm

    def test_my_gn(channels: int, num_groups: int = 16) -> torch.nn.Module:
        return torch.nn.GroupNorm(num_groups, channels)

    register_norm("TestMyGN", test_my_gn, config_keys={"num_groups": "MODEL.TEST_MY_GN.NUM_GROUPS"})
    registered.append("TestMyGN")
    config = str(REPO / "configs" / "Demo" / "scratch_faster_rcnn_gn_shapes.yaml")
    with logged_warnings("gwdet.config_checks") as warnings:
        build_config(config, ["MODEL.TEST_MY_GN.NUM_GROUPS", "4", "MODEL.BW.GROUP_SIZE", "4"])
    assert [warning for warning in warnings if "reads it" in warning] == [
        "MODEL.BW.GROUP_SIZE is 4 (default 16), but none of the norms the model builds (GN) reads it; BW and BW_ItN "
        "do: the value has no effect. Set MODEL.BW.GROUP_SIZE back to 16, or use a norm that reads it.",
        "MODEL.TEST_MY_GN.NUM_GROUPS is 4 (default 16), but none of the norms the model builds (GN) reads it; "
        "TestMyGN does: the value has no effect. Set MODEL.TEST_MY_GN.NUM_GROUPS back to 16, or use a norm that "
        "reads it."]
    with logged_warnings("gwdet.config_checks") as warnings:  # read where the name is built, at its default unsaid
        build_config(config, ["MODEL.TEST_MY_GN.NUM_GROUPS", "4", "MODEL.ROI_BOX_HEAD.NORM", "TestMyGN"])
        build_config(config, [])
    assert not [warning for warning in warnings if "reads it" in warning], warnings


# ---- a number override yacs read as text ----------------------------------------------------------

# before: MODEL.GW.NUM_GROUPS "'16'" gave "got 16 (a str)" (16 for an int key, without its quotes) with no fix, and
# SOLVER.WEIGHT_DECAY_NORM nan "got nan (a str)" without saying that a finite number is needed
@pytest.mark.parametrize("opts, told", [
    (["MODEL.GW.NUM_GROUPS", "'16'"], "MODEL.GW.NUM_GROUPS takes a value of type int (it is 16 before this value); got "
                                      "'16' (a str). Write it without quotes: MODEL.GW.NUM_GROUPS 16."),
    (["MODEL.GW.EPS", "'1e-4'"], "got '1e-4' (a str). Write it without quotes: MODEL.GW.EPS 1e-4."),
    (["MODEL.GW.EPS", "'1'"], "got '1' (a str). Write it without quotes: MODEL.GW.EPS 1.0."),
    (["MODEL.GW.NUM_GROUPS", "'0'"], "got '0' (a str). Written without quotes (MODEL.GW.NUM_GROUPS 0), it is refused "
                                     "too: config: MODEL.GW.NUM_GROUPS must be an integer >= 1, got 0"),
    (["MODEL.GW.NUM_GROUPS", "'16.0'"], "got '16.0' (a str). Write it as a whole number: MODEL.GW.NUM_GROUPS 16."),
    (["SOLVER.WEIGHT_DECAY_NORM", "nan"],
     "SOLVER.WEIGHT_DECAY_NORM takes a value of type float (it is 0.0 before this value); got 'nan' (a str). yacs "
     "reads nan as text, and the number NaN is refused too: config: SOLVER.WEIGHT_DECAY_NORM=nan is no weight decay "
     "of the norm layers: give a finite number at least 0."),
    (["MODEL.GW.EPS", "NaN"], "got 'NaN' (a str). yacs reads nan as text, and the number NaN is refused too: config: "
                              "MODEL.GW.EPS must be a finite number > 0, got nan"),
    (["MODEL.BW.MOMENTUM", "nan"], "got 'nan' (a str). yacs reads nan as text, and the number NaN is refused too: "
                                   "config: MODEL.BW.MOMENTUM must be a number in [0, 1], got nan"),
])
def test_a_number_override_read_as_text_is_shown_quoted_with_the_fix(opts, told):
    from gwdet.model_zoo import build_config

    with pytest.raises(GwdetValueError) as err:
        build_config(str(REPO / "configs" / "Demo" / "scratch_faster_rcnn_gw_shapes.yaml"), opts)
    assert str(err.value).endswith(told), str(err.value)


# before: "got nan (a str)" for a float key that no value check reads, without a fix
def test_a_nan_for_a_float_key_no_check_reads_asks_for_a_finite_number():
    from gwdet.model_zoo import build_config

    with pytest.raises(GwdetValueError) as err:
        build_config(str(REPO / "configs" / "Demo" / "scratch_faster_rcnn_gw_shapes.yaml"),
                     ["MODEL.RPN.SMOOTH_L1_BETA", "nan"])
    assert str(err.value).endswith("got 'nan' (a str). yacs reads nan as text: give a finite number, e.g. "
                                   "MODEL.RPN.SMOOTH_L1_BETA 0.0."), str(err.value)


# ---- the kind of a config value, as register_norm names it -----------------------------------------

@pytest.mark.parametrize("value, kind", [
    (True, "bool"), (3, "integer"), (0.5, "float"), ("GW", "string"), ([1, 2], "list"), ((1, 2), "list"),
    ({"a": 1}, "dict"), (None, "NoneType"),
])
def test_config_values_are_told_apart_by_kind_as_yacs_does(value, kind):
    from gwdet.norms import _kind

    assert _kind(value) == kind


def test_a_default_of_another_kind_than_detectron2s_key_is_refused_naming_both_kinds(registered):
    from gwdet.norms import register_norm

    def test_tuple_default_build(channels, sizes=(1, 2)):
        return torch.nn.GroupNorm(1, channels)

    registered.append("TestTupleDefault")  # unregistered after the test, were it registered
    with pytest.raises(ValueError) as err:
        register_norm("TestTupleDefault", test_tuple_default_build, config_keys={"sizes": "MODEL.FPN.NORM"})
    assert str(err.value) == (
        "register_norm('TestTupleDefault'): the config key MODEL.FPN.NORM holds string values (its default is ''), and "
        "'TestTupleDefault' reads its sizes (default (1, 2), list) from it: give sizes a key of list values, or of its "
        "own, e.g. MODEL.TESTTUPLEDEFAULT.SIZES.")


# ---- a norm registered again: the same registration (a LazyConfig file read again) or a taken name ----

class PlainSettings:
    """Settings a build reads, of a class without its own ``==``."""


@dataclasses.dataclass
class ArraySettings:
    """Settings holding an array: their ``==`` compares the arrays, whose truth is ambiguous."""
    weights: np.ndarray


def read_as_module(source: str, module_name: str, **names) -> types.ModuleType:
    """``source`` run as a module file read anew (a LazyConfig file, a reloaded plugin): every function
    and class in it a new object; ``names`` are the module-level names it finds already there."""
    module = types.ModuleType(module_name)
    module.__dict__.update(torch=torch, np=np, **names)
    exec(compile(source, f"{module_name}.py", "exec"), module.__dict__)
    return module


KEYWORD_ONLY = "def build(channels, *, groups=2):\n    return torch.nn.GroupNorm(groups, channels)\n"
FLOAT_DEFAULT = "def build(channels, eps=1e-5):\n    return torch.nn.GroupNorm(1, channels, eps=eps)\n"
RECURSIVE_HELPER = """
def groups_for(channels, groups):
    return groups if channels % groups == 0 else groups_for(channels, groups // 2)

def build(channels, groups=8):
    return torch.nn.GroupNorm(groups_for(channels, groups), channels)
"""
LAYER_CLASS = """
class build(torch.nn.GroupNorm):
    def __init__(self, channels, groups=2):
        super().__init__(self.groups_for(channels, groups), channels)

    @staticmethod
    def groups_for(channels, groups):
        return groups if channels % groups == 0 else 1

    @classmethod
    def of(cls, channels):
        return cls(channels)

    @property
    def group_count(self):
        return self.num_groups
"""
SLOTS_HELPER = """
class Groups:
    __slots__ = ("count",)

    def __init__(self, count):
        self.count = count

def build(channels):
    return torch.nn.GroupNorm(Groups(2).count, channels)
"""
READS_GLOBAL = "def build(channels):\n    return torch.nn.GroupNorm(int(SCALE.sum()) if SCALE is not None else 1, channels)\n"
READS_MODULE = "def build(channels):\n    return torch.nn.GroupNorm(helpers.GROUPS, channels)\n"


def same_or_taken(registered, first: types.ModuleType, second: types.ModuleType) -> bool:
    """Register ``first.build`` under a name, then ``second.build``: True if the second is taken as the
    same registration (it then takes the first's place), False if it is refused as a taken name."""
    from gwdet.norms import norm_record, register_norm

    registered.append("TestReadAgain")
    register_norm("TestReadAgain", first.build)
    try:
        register_norm("TestReadAgain", second.build)
    except ValueError as error:
        assert str(error) == (f"register_norm: 'TestReadAgain' is already registered (by {first.__name__}.build); "
                              "choose another name, or call gwdet.norms.unregister_norm('TestReadAgain') first")
        assert norm_record("TestReadAgain").build is first.build
        return False
    assert norm_record("TestReadAgain").build is second.build
    return True


@pytest.mark.parametrize("source", [KEYWORD_ONLY, FLOAT_DEFAULT, RECURSIVE_HELPER, LAYER_CLASS, SLOTS_HELPER],
                         ids=["keyword-only default", "float default", "recursive helper", "layer class",
                              "class with slots"])
def test_a_build_read_again_from_the_same_source_is_the_same_registration(registered, source):
    assert same_or_taken(registered, read_as_module(source, "lazy_first"), read_as_module(source, "lazy_second"))


@pytest.mark.parametrize("first, second", [
    (KEYWORD_ONLY, KEYWORD_ONLY.replace("groups=2", "groups=4")),
    (FLOAT_DEFAULT, FLOAT_DEFAULT.replace("1e-5", "1e-3")),
    ("def build(channels, groups=2):\n    return torch.nn.GroupNorm(groups, channels)\n",
     "def build(channels, groups=2.0):\n    return torch.nn.GroupNorm(groups, channels)\n"),  # 2 == 2.0, another kind
    (LAYER_CLASS, LAYER_CLASS.replace("else 1", "else 2")),  # another static method
    (LAYER_CLASS, LAYER_CLASS.replace("return cls(channels)", "return cls(channels, 4)")),  # another class method
    (LAYER_CLASS, LAYER_CLASS.replace("return self.num_groups", "return self.num_channels")),  # another getter
    (LAYER_CLASS, LAYER_CLASS + "\n    @group_count.setter\n    def group_count(self, value):\n"
                                "        self.num_groups = value\n"),  # a setter more
    (LAYER_CLASS, LAYER_CLASS + "\n    @group_count.deleter\n    def group_count(self):\n"
                                "        pass\n"),  # a deleter more
    (SLOTS_HELPER, SLOTS_HELPER.replace('("count",)', '("groups",)').replace("self.count", "self.groups")
     .replace(").count", ").groups")),
], ids=["keyword-only default", "float default", "default of another kind", "static method", "class method",
        "property getter", "property setter", "property deleter", "slot name"])
def test_a_build_of_another_source_under_a_taken_name_is_refused(registered, first, second):
    assert not same_or_taken(registered, read_as_module(first, "lazy_first"), read_as_module(second, "lazy_second"))


@pytest.mark.parametrize("first, second, same", [
    (torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0]), True),
    (torch.tensor([1.0, 2.0]), torch.tensor([1.0, 3.0]), False),
    (torch.tensor([1.0]), torch.tensor([1.0, 1.0]), False),  # equal where broadcast, of another shape
    (torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0], dtype=torch.float64), False),
    (np.array([1.0, 2.0]), np.array([1.0, 2.0]), True),
    (np.array([1.0, 2.0]), np.array([1.0, 2.0], dtype=np.float32), False),
    (ArraySettings(np.array([1.0, 2.0])), ArraySettings(np.array([1.0, 2.0])), False),  # == cannot tell: not the same
    (PlainSettings(), PlainSettings(), False),  # no == of its own: only itself is the same
])
def test_a_build_read_again_is_the_same_registration_only_if_the_values_it_reads_are(registered, first, second, same):
    modules = [read_as_module(READS_GLOBAL, f"lazy_{at}", SCALE=scale) for at, scale in enumerate([first, second])]
    assert same_or_taken(registered, *modules) is same


@pytest.mark.parametrize("second_name, same", [("gwdet_test_helpers", True), ("gwdet_test_others", False)])
def test_a_module_imported_anew_is_the_same_as_one_of_its_name(registered, second_name, same):
    first = read_as_module(READS_MODULE, "lazy_first", helpers=types.ModuleType("gwdet_test_helpers"))
    second = read_as_module(READS_MODULE, "lazy_second", helpers=types.ModuleType(second_name))
    assert same_or_taken(registered, first, second) is same


def test_classes_leading_back_to_themselves_are_the_same_only_if_both_do():
    from gwdet.norms import _same_value

    def node_class():
        class Node:
            pass
        return Node

    first, second, third, fourth = (node_class() for _ in range(4))
    first.partner, second.partner, third.partner = first, second, fourth
    assert _same_value(first, second, set())
    assert not _same_value(first, third, set())  # first's partner is itself, third's a Node without a partner
    assert not _same_value(third, first, set())


@pytest.mark.parametrize("function", [len, functools.partial(int, base=2)], ids=["builtin", "partial"])
def test_a_callable_without_python_code_reads_no_module_level_names(function):
    from gwdet.norms import _read_globals

    assert _read_globals(function) == {}


# settings of two other norms added to a GN node: the message named BGN (which takes eps but not
# group_size) as the norm to switch to
def test_settings_of_other_norms_added_to_a_node_name_a_norm_that_takes_them_all_or_none():
    from gwdet.norms import unknown_params_message

    assert unknown_params_message("GN", ["num_groups"], ["eps", "group_size"], "model.fpn.norm", added=True).endswith(
        "group_size is a setting of BW, BW_ItN, not of 'GN': give the node a norm that takes them "
        "(model.fpn.norm.name=BW), or leave them out.")
    assert unknown_params_message("GN", ["num_groups"], ["examples_per_group", "group_size"], "model.fpn.norm",
                                  added=True).endswith(
        "examples_per_group is a setting of BGN, GhostBN; group_size is a setting of BW, BW_ItN, not of 'GN', and no "
        "norm takes them all: leave them out.")
