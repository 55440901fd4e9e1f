"""A config value gwdet does not check and detectron2 cannot use is named, not left as detectron2's
bare error: the failure's place in detectron2, the values given on the command line and the values
of the config sections that place reads (gwdet.modeling.detectron2_failures); errors that are not
detectron2 failing on a config value keep their own type and traceback."""
import os

import detectron2
import pytest
import torch

import gwdet
from gwdet.modeling.detectron2_failures import failure_site, named_config_failures
from gwdet.engine.output_dir import check_fresh_start
from gwdet.engine.run import main
from gwdet.errors import GwdetValueError
from gwdet.model_zoo import build_config

from conftest import DEMO_CONFIG, TINY_OPTS, tiny_run_args


def test_a_value_detectron2_fails_on_while_building_is_named_by_gwdet_build_model():
    cfg = build_config(str(DEMO_CONFIG), [*TINY_OPTS, "MODEL.DEVICE", "cpu", "MODEL.ROI_BOX_HEAD.NUM_CONV", "0",
                                          "MODEL.ROI_BOX_HEAD.NUM_FC", "0"])
    with pytest.raises(GwdetValueError) as refused:
        gwdet.build_model(cfg)
    message = str(refused.value)
    assert message.startswith("detectron2 could not build the model with this config: AssertionError "
                              "(detectron2/modeling/roi_heads/box_head.py:")
    assert "Values of MODEL.ROI_BOX_HEAD that differ from detectron2's defaults: " in message
    assert isinstance(refused.value.__cause__, AssertionError), "detectron2's error stays chained (--verbose)"


def test_a_component_giving_get_norm_a_gwdet_name_is_told_to_use_norm_from_config():
    # a project's own head passing NORM "GW" to get_norm: "KeyError: 'GW'" among 32 listed values
    from detectron2.layers import get_norm

    from gwdet.modeling.detectron2_failures import detectron2_config_failure

    cfg = build_config(str(DEMO_CONFIG), TINY_OPTS)
    with pytest.raises(KeyError) as raised:
        get_norm("GW", 16)
    refusal = detectron2_config_failure(raised.value, cfg, "build the model")
    assert refusal is not None and str(refusal).startswith(
        "detectron2 could not build the model with this config: a component gave detectron2's get_norm the norm name "
        "'GW' (detectron2/layers/batch_norm.py:")
    assert "Give that component gwdet.norm_from_config('GW', cfg) instead of the name" in str(refusal)


def test_a_component_building_detectron2s_32_group_gn_against_the_configs_groups_is_named():
    # an own backbone wrapping detectron2's builder with RESNETS.NORM GN and MODEL.GN.NUM_GROUPS 8: torch's
    # "num_channels (16) must be divisible by num_groups (32)" and 39 values of MODEL, not that the component
    # ignores MODEL.GN.NUM_GROUPS
    from detectron2.layers import get_norm

    from gwdet.modeling.detectron2_failures import detectron2_config_failure

    cfg = build_config(str(DEMO_CONFIG), [*TINY_OPTS, "MODEL.GN.NUM_GROUPS", "8"])
    with pytest.raises(ValueError) as raised:
        get_norm("GN", 16)
    assert str(detectron2_config_failure(raised.value, cfg, "build the model")) == (
        "detectron2 could not build the model with this config: a component built GroupNorm with detectron2's "
        f"get_norm('GN', channels) (detectron2/layers/batch_norm.py:{failure_site(raised.value)[1]}), which takes 32 "
        "groups whatever MODEL.GN.NUM_GROUPS (8) says, and num_channels (16) must be divisible by num_groups (32). "
        "Give that component gwdet.norm_from_config('GN', cfg) instead of the name, e.g. in its from_config "
        "(docs/usage.md), so that it builds the config's groups.")
    cfg = build_config(str(DEMO_CONFIG), [*TINY_OPTS, "MODEL.GN.NUM_GROUPS", "32"])  # detectron2's words on the value
    assert "gwdet does not check that value itself" in str(detectron2_config_failure(raised.value, cfg, "build the model"))


def test_the_train_tool_names_the_command_lines_values_first_and_the_folder_stays_usable(tmp_path):
    args = tiny_run_args(tmp_path, "MODEL.ROI_BOX_HEAD.NUM_CONV", "0", "MODEL.ROI_BOX_HEAD.NUM_FC", "0")
    with pytest.raises(GwdetValueError) as refused:
        main(args)
    message = str(refused.value)
    assert message.startswith("detectron2 could not build the model and its training with this config: "
                              "AssertionError (detectron2/modeling/roi_heads/box_head.py:")
    assert ("Given on the command line: MODEL.ROI_BOX_HEAD.NUM_CONV=0, MODEL.ROI_BOX_HEAD.NUM_FC=0. Other values of "
            "MODEL.ROI_BOX_HEAD that differ from detectron2's defaults: ") in message
    assert "OUTPUT_DIR" not in message, "only the values of the sections the failing module reads"
    check_fresh_start(str(tmp_path), overwrite=False)  # the corrected command may start in the same folder


def test_a_loader_workers_traceback_in_the_message_is_read_for_detectron2s_frame():
    path = os.path.join(os.path.dirname(detectron2.__file__), "data", "transforms", "augmentation_impl.py")
    worker = RuntimeError(f'Caught AssertionError in DataLoader worker process 0.\nOriginal Traceback (most recent '
                          f'call last):\n  File "{path}", line 12, in get_transform\n    assert x\nAssertionError\n')
    assert failure_site(worker) == ("data/transforms/augmentation_impl.py", 12)


def test_errors_outside_detectron2_and_after_the_first_step_keep_their_type():
    cfg = build_config(str(DEMO_CONFIG), TINY_OPTS)
    with pytest.raises(ZeroDivisionError):  # raised here, not in detectron2: a bug, not a config value
        with named_config_failures(cfg, "build the model"):
            raise ZeroDivisionError("a bug")
    from detectron2.modeling.backbone.fpn import _assert_strides_are_log2_contiguous

    with pytest.raises(AssertionError):  # in detectron2, but not while the condition holds
        with named_config_failures(cfg, "train the first iteration", applies=lambda: False):
            _assert_strides_are_log2_contiguous([4, 4])
    with pytest.raises(GwdetValueError, match=r"detectron2/modeling/backbone/fpn.py:\d+"):
        with named_config_failures(cfg, "train the first iteration"):
            _assert_strides_are_log2_contiguous([4, 4])


def test_a_lazy_configs_failure_names_its_overrides_of_the_failing_part(tmp_path):
    from gwdet.engine.arguments import parse_args

    lazy = DEMO_CONFIG.parents[1] / "LazyConfig" / "mask_rcnn_R_50_FPN_gw_shapes.py"
    args = parse_args(["--config-file", str(lazy), f"train.output_dir={tmp_path}", "train.max_iter=2",
                       "model.backbone.bottom_up.resnet.stages.0.num_blocks=0"])
    with pytest.raises(GwdetValueError) as refused:
        main(args)
    assert str(refused.value).startswith(
        "detectron2 could not build the model and its training with this config: AssertionError: 0 "
        "(detectron2/modeling/backbone/resnet.py:")
    assert "Given on the command line: model.backbone.bottom_up.resnet.stages.0.num_blocks=0. Change" in str(refused.value)


# gwdet.build_model of a config with deformable convolutions, on a detectron2 without its compiled ops: detectron2's
# raw ImportError, where the export and analyze tools named MODEL.RESNETS.DEFORM_ON_PER_STAGE and the fix
def test_gwdet_build_model_names_deformable_convolutions_this_detectron2_cannot_build():
    try:
        import detectron2._C  # noqa: F401
        pytest.skip("this detectron2 has its compiled ops: its DeformConv builds")
    except ImportError:
        pass
    cfg = build_config(str(DEMO_CONFIG), [*TINY_OPTS, "MODEL.RESNETS.DEFORM_ON_PER_STAGE", "[False,True,True,True]",
                                          "MODEL.RESNETS.GW_POSITIONS", "B2"])
    with pytest.raises(ImportError, match=r"^MODEL.RESNETS.DEFORM_ON_PER_STAGE \[False, True, True, True\] asks for "
                                          r"deformable convolutions: detectron2's DeformConv needs detectron2's "
                                          r"compiled ops \(detectron2._C\), .* Set it to all False"):
        gwdet.build_model(cfg)


# Before: lazy.build_model of a LazyConfig giving detectron2's 'GN' name to the 16-channel stem (or to place_norm's
# positions) stopped with torch's bare "num_channels (16) must be divisible by num_groups (32)", naming neither the
# node nor gwdet's GN.
@pytest.mark.parametrize("config, override, start", [
    ("gn.py", "model.backbone.bottom_up.stem.norm=GN", "model.backbone.bottom_up.stem.norm='GN': "),
    ("bn_gw_s1b2.py", "model.backbone.bottom_up.norm=GN", "place_norm: norm='GN': "),
])
def test_a_lazy_configs_gn_name_on_channels_32_does_not_divide_names_the_node_and_gwdets_gn(config, override, start):
    from gwdet.engine import lazy
    from gwdet.model_zoo.lazy_loading import load_lazy_config

    cfg = load_lazy_config(str(DEMO_CONFIG.parents[1] / "LazyConfig" / "Study" / config), [override, "train.device=cpu"])
    with pytest.raises(GwdetValueError) as refused:
        lazy.build_model(cfg)
    message = str(refused.value)
    assert message.startswith(f"{start}'GN' given as a name makes detectron2's get_norm build torch's GroupNorm of 32 "
                              "groups (detectron2/layers/batch_norm.py:")
    assert "and 32 does not divide the " in message and "16 channels" in message
    assert message.endswith("Give gwdet.norm('GN', num_groups=N) instead of the name (L(gwdet.norm)(name='GN', "
                            "num_groups=N) in a LazyConfig): it builds torch's GroupNorm over the largest divisor of "
                            "each layer's channels not above N (with N=32: 32 groups where the channels allow it, 16 on "
                            "16 channels).")
    assert isinstance(refused.value.__cause__, ValueError), "torch's error stays chained"


def test_the_gn_explanation_leaves_other_errors_alone():
    from gwdet.modeling.detectron2_failures import detectron2_group_norm_failure

    with pytest.raises(ValueError) as raised:  # torch's own, outside detectron2's get_norm
        torch.nn.GroupNorm(32, 16)
    assert detectron2_group_norm_failure(raised.value, "model.x.norm='GN'") is None
    assert detectron2_group_norm_failure(KeyError("GN"), "model.x.norm='GN'") is None
