"""Per-position GW backbones: GW exactly where asked, detectron2's keys, FREEZE_AT, tracing."""
import pytest
import torch
from detectron2.config import get_cfg
from detectron2.layers import Conv2d, FrozenBatchNorm2d, ShapeSpec
from detectron2.modeling import build_backbone
from detectron2.modeling.backbone.resnet import build_resnet_backbone

from gwdet import add_gwdet_config
from gwdet.layers import GroupWhitening
from gwdet.errors import GwdetTypeError, GwdetValueError
from gwdet.modeling import format_gw_positions, parse_gw_positions
from gwdet.positions import positions_with_norm

# position -> (number of GW layers in a ResNet-50, the block convs whose norm is GW)
EXPECTED = {
    "S1": (1, set()),
    "S1-B1": (17, {"conv1"}),
    "S1-B2": (17, {"conv2"}),
    "S1-B3": (17, {"conv3"}),
    "S1-B12": (33, {"conv1", "conv2"}),
    "B2": (16, {"conv2"}),
    "": (0, set()),
}


def resnet_cfg(positions: str, norm: str = "FrozenBN", depth: int = 50, freeze_at: int = 0):
    cfg = add_gwdet_config(get_cfg())
    cfg.MODEL.BACKBONE.NAME = "build_gw_resnet_backbone"
    cfg.MODEL.BACKBONE.FREEZE_AT = freeze_at
    cfg.MODEL.RESNETS.DEPTH = depth
    cfg.MODEL.RESNETS.NORM = norm
    cfg.MODEL.RESNETS.OUT_FEATURES = ["res2", "res3", "res4", "res5"]
    cfg.MODEL.RESNETS.GW_POSITIONS = positions
    return cfg


@pytest.mark.parametrize("positions", sorted(EXPECTED))
def test_gw_sits_exactly_at_the_requested_positions(positions):
    count, gw_convs = EXPECTED[positions]
    backbone = build_backbone(resnet_cfg(positions), ShapeSpec(channels=3))
    assert sum(isinstance(m, GroupWhitening) for m in backbone.modules()) == count
    assert isinstance(backbone.stem.conv1.norm, GroupWhitening) == positions.startswith("S1")
    for stage in backbone.stages:
        for block in stage:
            for conv_name in ("conv1", "conv2", "conv3"):
                norm = getattr(block, conv_name).norm
                expected = GroupWhitening if conv_name in gw_convs else FrozenBatchNorm2d
                assert type(norm) is expected, (positions, conv_name)
            if block.shortcut is not None:
                assert type(block.shortcut.norm) is FrozenBatchNorm2d
    # what the checkpoint checks read back from a model (gwdet.checkpoint.compatibility)
    assert positions_with_norm(backbone, (GroupWhitening,)) == parse_gw_positions(positions)
    assert positions_with_norm(backbone, (FrozenBatchNorm2d,)) == {"S1", "B1", "B2", "B3"} - parse_gw_positions(positions)


def test_checkpoint_keys_are_detectron2s():
    cfg = resnet_cfg("S1-B2", norm="BN")
    keys = set(build_backbone(cfg, ShapeSpec(channels=3)).state_dict())
    # beside its weights each GW layer records its settings (gwdet.layers.settings_state)
    settings = {k for k in keys if k.endswith(".norm._extra_state")}
    assert settings and all(".conv2.norm." in k or k.startswith("stem.") for k in settings)
    ours = keys - settings
    reference = set(build_resnet_backbone(cfg, ShapeSpec(channels=3)).state_dict())
    assert "res2.0.conv2.norm.weight" in ours and "stem.conv1.norm.bias" in ours
    # GW keeps weight/bias under the same names; only the replaced BN statistics are gone.
    missing = reference - ours
    assert ours < reference
    assert all(k.endswith(("running_mean", "running_var", "num_batches_tracked")) for k in missing)
    assert all(".conv2.norm." in k or k.startswith("stem.") for k in missing)


def test_freeze_at_freezes_stages_and_turns_bn_into_frozen_bn():
    backbone = build_backbone(resnet_cfg("S1-B2", norm="BN", freeze_at=2), ShapeSpec(channels=3))
    frozen_part = [backbone.stem, backbone.res2]
    assert all(not p.requires_grad for part in frozen_part for p in part.parameters())
    assert isinstance(backbone.res2[0].conv1.norm, FrozenBatchNorm2d)
    assert isinstance(backbone.res2[0].conv2.norm, GroupWhitening), "GW stays GW when frozen"
    assert isinstance(backbone.res3[0].conv1.norm, torch.nn.BatchNorm2d)
    assert all(p.requires_grad for p in backbone.res3.parameters())


@pytest.mark.parametrize("depth,groups,width", [(101, 1, 64), (50, 32, 4), (101, 32, 8)])
def test_deeper_and_resnext_backbones_count_gw_per_block(depth, groups, width):
    cfg = resnet_cfg("S1-B2", depth=depth)
    cfg.MODEL.RESNETS.NUM_GROUPS, cfg.MODEL.RESNETS.WIDTH_PER_GROUP = groups, width
    backbone = build_backbone(cfg, ShapeSpec(channels=3))
    num_blocks = sum(len(stage) for stage in backbone.stages)
    assert sum(isinstance(m, GroupWhitening) for m in backbone.modules()) == 1 + num_blocks
    assert backbone.res2[0].conv2.groups == groups


def test_traced_gw_backbone_matches_eager():
    cfg = resnet_cfg("S1-B2", norm="GN")
    cfg.MODEL.GN.NUM_GROUPS = 8
    cfg.MODEL.RESNETS.STEM_OUT_CHANNELS, cfg.MODEL.RESNETS.RES2_OUT_CHANNELS = 16, 64
    cfg.MODEL.RESNETS.WIDTH_PER_GROUP = 16
    backbone = build_backbone(cfg, ShapeSpec(channels=3)).eval()
    image = torch.randn(1, 3, 64, 64)
    traced = torch.jit.trace(backbone, (image,), strict=False)
    other = torch.randn(1, 3, 64, 64)
    # the trace records GW's reference formulas, eager mode runs the fused op: their float32
    # rounding differs by about 1e-5 of the features' scale (measured: at most 1.2e-5)
    for name, expected in backbone(other).items():
        difference = (traced(other)[name] - expected).abs().max()
        assert difference <= 1e-4 * expected.abs().max(), name


def test_bad_position_token_lists_valid_tokens():
    with pytest.raises(ValueError) as err:
        parse_gw_positions("S1-B4")
    assert "'B4'" in str(err.value) and all(t in str(err.value) for t in ("S1", "B1", "B2", "B3", "B12"))
    assert parse_gw_positions("S1-B12") == {"S1", "B1", "B2"}
    assert parse_gw_positions("") == frozenset()


@pytest.mark.parametrize("spec, named", [("S1-B2-B2", "position B2 is named twice"),
                                         ("B12-B2", "position B2 is named twice"),
                                         ("S1--B2", "an empty position"), ("S1-", "an empty position")])
def test_a_position_named_twice_or_an_empty_one_is_refused(spec, named):
    # 'S1-B2-B2' built S1-B2 without a word, where a typo for 'S1-B2-B3' is the likelier intent
    with pytest.raises(ValueError, match=f"GW_POSITIONS='{spec}': {named}"):
        parse_gw_positions(spec)


def test_b3_on_basic_blocks_is_a_clear_error():
    cfg = resnet_cfg("B3", norm="BN", depth=18)
    cfg.MODEL.RESNETS.RES2_OUT_CHANNELS = 64
    with pytest.raises(ValueError, match=r"^GW position B3 needs conv3 in every block, but BasicBlock has none: use "
                                         r"MODEL.RESNETS.DEPTH >= 50 \(bottleneck blocks\) or drop that position.$"):
        build_backbone(cfg, ShapeSpec(channels=3))


@pytest.mark.parametrize("positions, spelled", [
    ({"S1", "B1", "B2"}, "S1-B12"), ({"B2", "S1"}, "S1-B2"), ({"B1", "B2"}, "B12"), ({"B1"}, "B1"),
    ({"B2", "B3"}, "B2-B3"), ({"S1", "B1", "B2", "B3"}, "S1-B12-B3"), ({"B3"}, "B3"), (set(), ""),
])
def test_positions_have_one_canonical_spelling(positions, spelled):
    from gwdet.positions import format_gw_positions

    assert format_gw_positions(positions) == spelled
    assert parse_gw_positions(spelled) == positions


def test_every_conv_with_a_norm_gets_the_configured_norm_deformable_ones_too():
    # detectron2's DeformConv / ModulatedDeformConv are no Conv2d: MODEL.RESNETS.DEFORM_ON_PER_STAGE kept the
    # placeholder BatchNorm2d there. (Their class needs detectron2's compiled ops; this one has their shape.)
    from torch import nn

    from gwdet.modeling.backbone import convs_with_norm

    class DeformLike(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.zeros(8, 8, 3, 3))
            self.norm = nn.BatchNorm2d(8)

    block = nn.Sequential(Conv2d(8, 8, 1, norm=nn.BatchNorm2d(8)), DeformLike(), Conv2d(8, 8, 1), nn.BatchNorm2d(8))
    assert [type(conv).__name__ for conv in convs_with_norm(block)] == ["Conv2d", "DeformLike"]


def test_freeze_at_5_on_a_c4_backbone_freezes_every_stage_as_detectron2_does():
    # it was refused as "place_norm: freeze_at=5", a key the user never set
    from gwdet.model_zoo import build_config
    from gwdet.modeling.backbone import build_gw_resnet_backbone

    from conftest import DEMO_CONFIG

    cfg = build_config(str(DEMO_CONFIG), ["MODEL.BACKBONE.NAME", "build_gw_resnet_backbone", "MODEL.RESNETS.OUT_FEATURES",
                                          "['res4']", "MODEL.BACKBONE.FREEZE_AT", "5", "MODEL.WEIGHTS", "w.pkl"])
    backbone = build_gw_resnet_backbone(cfg, ShapeSpec(channels=3))
    assert len(backbone.stages) == 3 and not any(p.requires_grad for p in backbone.parameters())


def _marked_backbone_model(name, build, opts):
    """``gwdet.build_model`` of the demo config whose backbone is ``build``, registered as ``name`` and
    marked with ``reads_gw_positions``."""
    from detectron2.modeling import BACKBONE_REGISTRY

    import gwdet
    from gwdet.model_zoo import build_config
    from gwdet.modeling import reads_gw_positions

    from conftest import DEMO_CONFIG

    build.__name__ = name
    BACKBONE_REGISTRY.register(reads_gw_positions(build))
    try:
        return gwdet.build_model(build_config(str(DEMO_CONFIG), ["MODEL.BACKBONE.NAME", name, "MODEL.DEVICE", "cpu",
                                                                 *opts]))
    finally:
        BACKBONE_REGISTRY._obj_map.pop(name)


# a marked backbone that placed GW in its FPN but none at MODEL.RESNETS.GW_POSITIONS passed the build check
def test_a_marked_backbone_without_the_gw_norm_at_the_positions_is_refused_though_its_fpn_has_gw():
    from gwdet.modeling import build_gw_resnet_fpn_backbone

    def drops_the_positions(cfg, input_shape):
        cfg = cfg.clone()
        cfg.defrost()
        cfg.MODEL.RESNETS.GW_POSITIONS = ""
        return build_gw_resnet_fpn_backbone(cfg, input_shape)

    with pytest.raises(ValueError, match=r"MODEL.BACKBONE.NAME 'test_drops_the_positions' is marked as reading "
                                         r"MODEL.RESNETS.GW_POSITIONS \('S1-B2'; gwdet.modeling.reads_gw_positions\), "
                                         r"but the backbone it built holds no GW layer at S1, B2 of its ResNet bottom_up "
                                         r"\(there: GroupNorm\): build it with one of gwdet's backbone builders .*or set "
                                         r"MODEL.RESNETS.GW_POSITIONS ''\."):
        _marked_backbone_model("test_drops_the_positions", drops_the_positions, ["MODEL.FPN.NORM", "GW"])

    def keeps_the_stem_only(cfg, input_shape):
        cfg = cfg.clone()
        cfg.defrost()
        cfg.MODEL.RESNETS.GW_POSITIONS = "S1"
        return build_gw_resnet_fpn_backbone(cfg, input_shape)

    with pytest.raises(ValueError, match=r"holds no GW layer at B2 of its ResNet bottom_up \(there: GroupNorm\)"):
        _marked_backbone_model("test_keeps_the_stem_only", keeps_the_stem_only, [])


def test_a_marked_backbone_that_places_the_gw_norm_is_accepted_frozen_and_c4_ones_too():
    from gwdet.modeling import build_gw_resnet_backbone, build_gw_resnet_fpn_backbone

    def wraps_gwdets(cfg, input_shape):
        return build_gw_resnet_fpn_backbone(cfg, input_shape)

    model = _marked_backbone_model("test_wraps_gwdets", wraps_gwdets, [])
    assert isinstance(model.backbone.bottom_up.stem.conv1.norm, GroupWhitening)
    # BN placed in frozen stages is FrozenBN there, as detectron2 freezes it
    model = _marked_backbone_model("test_wraps_gwdets_bn", wraps_gwdets, [
        "MODEL.RESNETS.NORM", "GN", "MODEL.RESNETS.GW_NORM", "BN", "MODEL.BACKBONE.FREEZE_AT", "2"])
    assert isinstance(model.backbone.bottom_up.stem.conv1.norm, FrozenBatchNorm2d)

    # a C4 backbone: the ResNet is the backbone itself
    from gwdet.model_zoo import build_config
    from gwdet.modeling.build import check_marked_backbone

    from conftest import DEMO_CONFIG

    cfg = build_config(str(DEMO_CONFIG), ["MODEL.BACKBONE.NAME", "build_gw_resnet_backbone",
                                          "MODEL.RESNETS.OUT_FEATURES", "['res4']"])
    holder = torch.nn.Module()
    holder.backbone = build_gw_resnet_backbone(cfg, ShapeSpec(channels=3))
    cfg.defrost()
    cfg.MODEL.BACKBONE.NAME = "test_wraps_gwdets_c4"
    check_marked_backbone(holder, cfg)
    holder.backbone.stem.conv1.norm = torch.nn.GroupNorm(8, 64)
    with pytest.raises(ValueError, match=r"holds no GW layer at S1 of the backbone, a ResNet \(there: GroupNorm\)"):
        check_marked_backbone(holder, cfg)


# build_gw_resnet_fpn_backbone(cfg, None) stopped with AttributeError: 'NoneType' object has no attribute 'channels'
@pytest.mark.parametrize("builder", ["build_gw_resnet_backbone", "build_gw_resnet_fpn_backbone",
                                     "build_gw_retinanet_resnet_fpn_backbone"])
@pytest.mark.parametrize("shape", [None, 3])
def test_a_backbone_builder_names_an_input_shape_that_is_no_shape_spec(builder, shape):
    import gwdet.modeling

    from gwdet.model_zoo import build_config

    from conftest import DEMO_CONFIG

    with pytest.raises(TypeError, match=rf"{builder}\(cfg, input_shape\): input_shape must be detectron2's ShapeSpec of "
                                        rf"the input images, got {shape!r} \({type(shape).__name__}\)\. Give "
                                        r"ShapeSpec\(channels=len\(cfg.MODEL.PIXEL_MEAN\)\)"):
        getattr(gwdet.modeling, builder)(build_config(str(DEMO_CONFIG), []), shape)


# Before: format_gw_positions('S1-B2') gave '' (no GW), {'S1', 'B4'} gave 'S1' and ['s1', 'b2'] gave ''.
def test_format_gw_positions_refuses_a_spec_string_and_unknown_tokens():
    assert format_gw_positions({"B2", "S1"}) == "S1-B2"
    assert format_gw_positions(["S1", "B12"]) == "S1-B12"
    assert format_gw_positions(set()) == ""
    with pytest.raises(GwdetTypeError, match=r"not the string 'S1-B2'; .*format_gw_positions\(parse_gw_positions"):
        format_gw_positions("S1-B2")
    with pytest.raises(GwdetValueError, match=r"unknown position token\(s\) 'B4' in "):
        format_gw_positions({"S1", "B4"})
    with pytest.raises(GwdetValueError, match=r"unknown position token\(s\) 's1', 'b2' in \['s1', 'b2'\]"):
        format_gw_positions(["s1", "b2"])
    # Before: raw TypeError: 'NoneType' object is not iterable.
    with pytest.raises(GwdetTypeError, match=r"got NoneType None; give an empty one \(set\(\)\) for no GW"):
        format_gw_positions(None)


# Before: place_norm ended in torch's raw RuntimeError ("Cannot re-assign modules in a ScriptModule ...") at the
# scripted module, with the norms before it already replaced.
@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("scripted, positions, named", [
    ("res2.0.conv1", "S1-B12", r"res2\.0\.conv1 \(Conv2d\)"),
    ("stem", "S1", r"stem \(BasicStem\)"),
    ("res2", "B2", r"res2 \(Sequential\)"),
])
def test_place_norm_refuses_a_scripted_module_at_the_positions_and_replaces_nothing(scripted, positions, named):
    from detectron2.modeling.backbone.resnet import BasicStem, ResNet

    from gwdet import norm
    from gwdet.modeling import place_norm

    torch.manual_seed(0)
    resnet = ResNet(BasicStem(3, 64, norm="BN"), ResNet.make_default_stages(50, norm="BN"), out_features=["res3"],
                    freeze_at=0)
    parent, _, name = scripted.rpartition(".")
    holder = resnet.get_submodule(parent)
    setattr(holder, name, torch.jit.script(getattr(holder, name)))
    if scripted in resnet.stage_names:  # a stage is replaced in the list the forward runs too
        resnet.stages[resnet.stage_names.index(scripted)] = getattr(resnet, scripted)
    with pytest.raises(GwdetTypeError, match=rf"^place_norm: the module\(s\) {named}, holding norms at the positions, "
                                             r"are scripted or traced \(torch\.jit\).*nothing was replaced\. Place the "
                                             r"norms on the eager ResNet, then script or trace the result"):
        place_norm(resnet, positions, norm("GW", num_groups=16))
    assert not any(isinstance(module, GroupWhitening) for module in resnet.modules())
    assert not any(isinstance(module, GroupWhitening) for stage in resnet.stages for module in stage.modules())
    # a scripted module away from the positions leaves them to place_norm
    placed = place_norm(resnet, "S1" if scripted == "res2" else "B3", norm("GW", num_groups=16))
    assert isinstance(placed.stem.conv1.norm if scripted == "res2" else placed.res3[0].conv3.norm, GroupWhitening)


# Before: place_norm placed GW in the stage assigned as resnet.res3, which detectron2's ResNet.forward never runs (it
# runs the list resnet.stages), and check_model passed the model.
def test_a_stage_given_by_assignment_only_is_refused_as_one_the_forward_does_not_run():
    import copy

    from detectron2.modeling.backbone.resnet import BasicStem, ResNet

    from gwdet import norm
    from gwdet.modeling import place_norm

    resnet = ResNet(BasicStem(3, 64, norm="BN"), ResNet.make_default_stages(50, norm="BN"), out_features=["res3"],
                    freeze_at=0)
    resnet.res3 = copy.deepcopy(resnet.res3)
    with pytest.raises(GwdetValueError, match=r"^The ResNet's res3 \(Sequential\) is not the stage its forward runs: .*"
                                              r"Replace a stage in both places \(resnet\.res3 and resnet\.stages\[1\]\)"):
        place_norm(resnet, "B2", norm("GW", num_groups=16))
    assert not any(isinstance(module, GroupWhitening) for module in resnet.modules())
    assert isinstance(place_norm(resnet, "S1", norm("GW", num_groups=16)).stem.conv1.norm, GroupWhitening)
    resnet.stages[1] = resnet.res3  # replaced in both places: placed where the forward runs
    placed = place_norm(resnet, "B2", norm("GW", num_groups=16))
    assert isinstance(placed.stages[1][0].conv2.norm, GroupWhitening) and placed.stages[1] is placed.res3


# Before: place_norm(resnet, "B2-S1", "GN") on a 16-channel stem stopped with torch's bare "num_channels (16) must be
# divisible by num_groups (32)", naming neither the layers nor gwdet.norm('GN', num_groups=N).
def test_detectron2s_gn_name_on_channels_32_does_not_divide_names_the_layers_and_gwdets_gn():
    from detectron2.modeling.backbone.resnet import BasicStem, BottleneckBlock, ResNet

    from gwdet import norm
    from gwdet.modeling import place_norm

    stages = [ResNet.make_stage(BottleneckBlock, 2, in_channels=16 * 2 ** i, bottleneck_channels=8 * 2 ** i,
                                out_channels=32 * 2 ** i, stride_per_block=[1 if i == 0 else 2, 1], norm="BN")
              for i in range(2)]
    resnet = ResNet(BasicStem(3, 16, norm="BN"), stages, out_features=["res2", "res3"], freeze_at=0)
    with pytest.raises(GwdetValueError) as refused:
        place_norm(resnet, "B2-S1", "GN")
    message = str(refused.value)
    assert message.startswith("place_norm: norm='GN': 'GN' given as a name makes detectron2's get_norm build torch's "
                              "GroupNorm of 32 groups (detectron2/layers/batch_norm.py:")
    assert ("and 32 does not divide the channels of stem.conv1 (16 channels), res2.0.conv2 (8 channels), "
            "res2.1.conv2 (8 channels), ... (2 more); nothing was replaced. Give gwdet.norm('GN', num_groups=N) "
            "instead of the name (L(gwdet.norm)(name='GN', num_groups=N) in a LazyConfig): it builds torch's "
            "GroupNorm over the largest divisor of each layer's channels not above N (with N=32: 32 groups where the "
            "channels allow it, 16 on 16 channels).") in message
    assert isinstance(refused.value.__cause__, ValueError)
    assert all(isinstance(conv.norm, torch.nn.BatchNorm2d) for conv in (resnet.stem.conv1, resnet.res2[0].conv2))
    placed = place_norm(resnet, "B2-S1", norm("GN", num_groups=32))  # the fix the message gives
    assert (placed.stem.conv1.norm.num_groups, placed.res2[0].conv2.norm.num_groups) == (16, 8)
    assert placed.res3[0].conv2.norm.num_groups == 16
