"""Properties of the checks that no other test pinned: each test here kills a mutation of the code
that the rest of the suite let pass (docs/reliability.md, "Mutation testing").
"""
import logging
import os
import pickle

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
from gwdet.norms import UnknownNormError


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
