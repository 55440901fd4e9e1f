"""gwdet's registered heads: detectron2's heads with the config's norm; per-level batch statistics."""
import pytest
import torch
from detectron2.config import get_cfg
from detectron2.layers import ShapeSpec
from detectron2.modeling import build_model
from detectron2.modeling.meta_arch.retinanet import RetinaNetHead

import gwdet
from gwdet import add_gwdet_config, check_gwdet_config, check_model
from gwdet.layers import BatchWhitening, GroupWhitening
from gwdet.modeling import GWRetinaNetHead, PerLevelNorm

LEVELS = [ShapeSpec(channels=16, stride=s) for s in (8, 16, 32)]


def _retinanet_cfg(norm: str, meta: str = "GWRetinaNet"):
    cfg = add_gwdet_config(get_cfg())
    cfg.MODEL.DEVICE = "cpu"
    cfg.MODEL.META_ARCHITECTURE = meta
    cfg.MODEL.BACKBONE.NAME = "build_gw_resnet_fpn_backbone"
    cfg.MODEL.RESNETS.DEPTH = 18
    cfg.MODEL.RESNETS.RES2_OUT_CHANNELS = 64
    cfg.MODEL.RESNETS.OUT_FEATURES = cfg.MODEL.FPN.IN_FEATURES = ["res3", "res4", "res5"]
    cfg.MODEL.FPN.OUT_CHANNELS = 32
    cfg.MODEL.RETINANET.IN_FEATURES = ["p3", "p4", "p5", "p6"]
    cfg.MODEL.ANCHOR_GENERATOR.SIZES = [[16], [32], [64], [128]]
    cfg.MODEL.RETINANET.NUM_CONVS = 2
    cfg.MODEL.RETINANET.NORM = norm
    cfg.MODEL.BW.GROUP_SIZE = 8
    return cfg


def test_gw_retinanet_keeps_one_batch_statistics_norm_per_level():
    model = build_model(_retinanet_cfg("BW"))
    norms = [m for m in model.head.cls_subnet if isinstance(m, PerLevelNorm)]
    assert len(norms) == 2 and all(len(n.levels) == 4 for n in norms)
    assert all(isinstance(layer, BatchWhitening) and layer.group_size == 8 for n in norms for layer in n.levels)
    model.train()
    features = [torch.randn(2, 32, s, s) * (1 + i) for i, s in enumerate((16, 8, 4, 2))]
    model.head(features)
    means = [layer.running_mean.clone() for layer in norms[0].levels]
    assert all(not torch.allclose(means[0], m) for m in means[1:]), "each level keeps its own statistics"
    assert check_model(model) is model


def test_gw_retinanet_with_a_per_sample_norm_shares_it_as_detectron2_does():
    cfg = _retinanet_cfg("GW")
    cfg.MODEL.GW.NUM_GROUPS = 4
    model = build_model(cfg)
    gw = [m for m in model.head.cls_subnet if isinstance(m, GroupWhitening)]
    assert len(gw) == 2 and {m.num_groups for m in gw} == {4}


def test_a_shared_batch_statistics_norm_in_detectron2s_head_is_refused():
    head = RetinaNetHead(input_shape=LEVELS, num_classes=2, num_anchors=1, conv_dims=[16],
                         norm=gwdet.norm("BW", group_size=8))
    with pytest.raises(ValueError, match=r"mixes the levels' statistics.*GWRetinaNetHead.*a LazyConfig: the model's head as L\(GWRetinaNetHead\)"):
        check_model(torch.nn.Sequential(head))
    fine = RetinaNetHead(input_shape=LEVELS, num_classes=2, num_anchors=1, conv_dims=[16], norm=gwdet.norm("GW"))
    per_level = GWRetinaNetHead(input_shape=LEVELS, num_classes=2, num_anchors=1, conv_dims=[16],
                                norm=gwdet.norm("BGN", num_groups=4))
    check_model(torch.nn.ModuleList([fine, per_level]))
    # FCOS's head (a RetinaNetHead with a centerness output) was sent to GWRetinaNetHead, which cannot replace it
    from detectron2.modeling.meta_arch.fcos import FCOSHead

    fcos = FCOSHead(input_shape=LEVELS, conv_dims=[16], num_classes=2, norm=gwdet.norm("BW", group_size=8))
    with pytest.raises(ValueError, match=r"mixes the levels' statistics. Use a per-sample norm \(GW, GN\) in it "
                                         r"\(gwdet.modeling.GWRetinaNetHead, .* is RetinaNet's head, without what a "
                                         r"FCOSHead adds\)\.$"):
        check_model(torch.nn.Sequential(fcos))


def test_a_registered_batch_norm_without_batch_statistics_in_gwdets_head_names_the_flag(registered):
    # "Use gwdet.modeling.GWRetinaNetHead": the head that refused it
    from gwdet.norms import register_norm

    register_norm("TestPlainBN", torch.nn.BatchNorm2d)
    registered.append("TestPlainBN")
    head = GWRetinaNetHead(input_shape=LEVELS, num_classes=2, num_anchors=1, conv_dims=[16],
                           norm=gwdet.norm("TestPlainBN"))
    with pytest.raises(ValueError, match=r"their name was registered without batch_statistics=True. Register it with "
                                         r"gwdet.register_norm\(..., batch_statistics=True"):
        check_model(torch.nn.Sequential(head))


def test_gwdet_norm_in_detectron2s_retinanet_is_a_config_error():
    with pytest.raises(ValueError, match="MODEL.RETINANET.NORM='BW'.*GWRetinaNet"):
        check_gwdet_config(_retinanet_cfg("BW", meta="RetinaNet"))


def test_group_numbers_that_do_not_divide_are_reported_once_per_component(caplog):
    from gwdet.engine.trainer import Trainer
    from gwdet.model_zoo import build_config

    from conftest import DEMO_CONFIG, TINY_OPTS

    cfg = build_config(str(DEMO_CONFIG), TINY_OPTS + ["MODEL.GW.NUM_GROUPS", "7"])
    Trainer.build_model(cfg)
    lines = [r.getMessage() for r in caplog.records if "Group numbers adjusted" in r.getMessage()]
    assert len(lines) == 1
    assert "roi_heads.box_head: 4 GroupWhitening layer(s) asked for 7 groups use 4 (64 channels)" in lines[0]
    assert "backbone.bottom_up: 17 GroupWhitening layer(s) asked for 7 groups use" in lines[0]
    strict = build_config(str(DEMO_CONFIG), TINY_OPTS + ["MODEL.GW.NUM_GROUPS", "7", "MODEL.STRICT_NORM_GROUPS", "True"])
    with pytest.raises(ValueError, match="GW with 7 groups cannot divide .* channels.*MODEL.STRICT_NORM_GROUPS"):
        Trainer.build_model(strict)  # refused by the first layer that is built
    fine = build_config(str(DEMO_CONFIG), TINY_OPTS + ["MODEL.STRICT_NORM_GROUPS", "True"])
    Trainer.build_model(fine)  # g=16 divides every channel count of the demo


def test_gwdets_heads_built_by_hand_name_a_norm_only_gwdet_builds():
    """Built from arguments, the heads pass their norm to detectron2's get_norm, which raised a bare
    KeyError: 'GW'; a gwdet.norm callable builds them."""
    from gwdet.modeling.heads import GWFastRCNNConvFCHead

    shape = ShapeSpec(channels=16, height=7, width=7)
    with pytest.raises(ValueError, match=r"GWFastRCNNConvFCHead: conv_norm='GW' is built by gwdet, not by detectron2's "
                                         r"get_norm: give gwdet.norm\('GW', \.\.\.\)"):
        GWFastRCNNConvFCHead(shape, conv_dims=[16], fc_dims=[32], conv_norm="GW")
    head = GWFastRCNNConvFCHead(shape, conv_dims=[16], fc_dims=[32], conv_norm=gwdet.norm("GW", num_groups=4))
    assert isinstance(head.conv1.norm, GroupWhitening)
    with pytest.raises(ValueError, match=r"GWRetinaNetHead: norm='GW' is built by gwdet"):
        GWRetinaNetHead(input_shape=[shape], num_classes=2, num_anchors=1, conv_dims=[16], norm="GW")


def test_check_model_refuses_a_strict_groups_that_is_not_a_bool():
    with pytest.raises(ValueError, match=r"check_model: strict_groups must be True or False, got 'no'"):
        check_model(torch.nn.Sequential(GroupWhitening(16, num_groups=5)), strict_groups="no")


def test_per_level_norms_count_from_the_first_level_in_every_forward():
    # a forward stopped part-way (an exception, Ctrl-C) put every later level on another level's module
    head = GWRetinaNetHead(input_shape=LEVELS, num_classes=2, num_anchors=1, conv_dims=[16],
                           norm=gwdet.norm("BGN", num_groups=4)).train()
    features = [torch.randn(2, 16, s, s) * (1 + i) for i, s in enumerate((8, 4, 2))][:len(LEVELS)]
    head(features)
    expected = [tensor.detach() for tensor in head.eval()(features)[0]]
    broken = [*features[:1], torch.randn(2, 8, 4, 4), *features[2:]]
    with pytest.raises(RuntimeError):
        head(broken)
    for got, want in zip(head(features)[0], expected, strict=True):
        assert torch.equal(got, want)


# a head shared by the threads of an inference server: one call counter for every thread put levels on each other's
# modules (235 of 240 threaded forwards differed from the same forward run alone)
def test_per_level_norms_count_levels_in_each_thread_on_its_own():
    import copy
    import sys
    from concurrent.futures import ThreadPoolExecutor

    head = GWRetinaNetHead(input_shape=LEVELS, num_classes=2, num_anchors=1, conv_dims=[16],
                           norm=gwdet.norm("BGN", num_groups=4)).train()
    features = [torch.randn(2, 16, s, s) * (1 + i) + i for i, s in enumerate((8, 4, 2))][:len(LEVELS)]
    with torch.no_grad():
        for _ in range(3):
            head(features)
    head.eval()
    with torch.no_grad():
        expected = [tensor.clone() for tensor in head(features)[0]]

    def forwards(_: int) -> int:
        wrong = 0
        with torch.no_grad():
            for _ in range(30):
                wrong += not all(torch.equal(got, want) for got, want in zip(head(features)[0], expected, strict=True))
        return wrong

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch as often as they can
    try:
        with ThreadPoolExecutor(4) as pool:
            assert sum(pool.map(forwards, range(4))) == 0
    finally:
        sys.setswitchinterval(interval)
    copied = copy.deepcopy(head)  # the per-thread counters copy with the head
    assert all(torch.equal(got, want) for got, want in zip(copied(features)[0], expected, strict=True))


def test_activation_checkpointing_of_per_level_norms_is_refused():
    from torch.utils.checkpoint import checkpoint

    head = GWRetinaNetHead(input_shape=LEVELS, num_classes=2, num_anchors=1, conv_dims=[16],
                           norm=gwdet.norm("BGN", num_groups=4)).train()
    features = [torch.randn(2, 16, s, s, requires_grad=True) for s in (8, 4, 2)][:len(LEVELS)]
    outputs = [checkpoint(head.cls_subnet, feature, use_reentrant=False) for feature in features]
    with pytest.raises(RuntimeError, match="PerLevelNorm .* is run again during the backward pass, as activation "
                                           "checkpointing recomputes a forward"):
        sum(output.sum() for output in outputs).backward()


def _registered_once(registry, name: str, base: type) -> str:
    """A project's subclass of ``base`` registered as ``name`` (once per process)."""
    if name not in registry:
        registry.register(type(name, (base,), {}))
    return name


def test_a_projects_subclass_of_detectron2s_head_is_checked_as_detectron2s_head():
    # it built GN with 32 groups (not MODEL.GN.NUM_GROUPS 8), and a C4 res5 without the GW_POSITIONS asked for
    from detectron2.modeling import ROI_HEADS_REGISTRY
    from detectron2.modeling.roi_heads import ROI_BOX_HEAD_REGISTRY, FastRCNNConvFCHead, Res5ROIHeads

    from gwdet.modeling import GWFastRCNNConvFCHead
    from gwdet.model_zoo import build_config

    from conftest import DEMO_CONFIG

    box_head = _registered_once(ROI_BOX_HEAD_REGISTRY, "TestProjectBoxHead", FastRCNNConvFCHead)
    with pytest.raises(ValueError, match=r"TestProjectBoxHead, a subclass of detectron2's FastRCNNConvFCHead, "
                                         r"\(MODEL.ROI_BOX_HEAD.NAME\) always builds GN with 32 groups"):
        build_config(str(DEMO_CONFIG), ["MODEL.ROI_BOX_HEAD.NAME", box_head, "MODEL.ROI_BOX_HEAD.NORM", "GN",
                                        "MODEL.GN.NUM_GROUPS", "8"])
    gwdet_based = _registered_once(ROI_BOX_HEAD_REGISTRY, "TestProjectGWBoxHead", GWFastRCNNConvFCHead)
    build_config(str(DEMO_CONFIG), ["MODEL.ROI_BOX_HEAD.NAME", gwdet_based, "MODEL.ROI_BOX_HEAD.NORM", "GN",
                                    "MODEL.GN.NUM_GROUPS", "8"])  # gwdet's head, extended: the config's values
    res5 = _registered_once(ROI_HEADS_REGISTRY, "TestProjectRes5ROIHeads", Res5ROIHeads)
    with pytest.raises(ValueError, match=r"TestProjectRes5ROIHeads \(MODEL.ROI_HEADS.NAME\) would build the res5 "
                                         r"blocks without it"):
        build_config(str(DEMO_CONFIG), ["MODEL.BACKBONE.NAME", "build_gw_resnet_backbone", "MODEL.ROI_HEADS.NAME", res5,
                                        "MODEL.ROI_HEADS.IN_FEATURES", "['res4']", "MODEL.RESNETS.OUT_FEATURES",
                                        "['res4']", "MODEL.RESNETS.GW_POSITIONS", "S1-B2", "MODEL.MASK_ON", "False"])


def test_a_projects_head_that_builds_its_norm_with_norm_from_config_is_built():
    # docs/usage.md's recipe (a subclass's from_config giving gwdet.norm_from_config) was refused as
    # "a subclass of detectron2's FastRCNNConvFCHead ... cannot build 'GW'"
    from detectron2.modeling.roi_heads import ROI_BOX_HEAD_REGISTRY, FastRCNNConvFCHead

    import gwdet
    from gwdet.layers import GroupWhitening
    from gwdet.model_zoo import build_config

    from conftest import DEMO_CONFIG, TINY_OPTS

    class TestProjectNormFromConfigHead(FastRCNNConvFCHead):
        @classmethod
        def from_config(cls, cfg, input_shape):
            arguments = super().from_config(cfg, input_shape)
            arguments["conv_norm"] = gwdet.norm_from_config(cfg.MODEL.ROI_BOX_HEAD.NORM, cfg)
            return arguments

    if "TestProjectNormFromConfigHead" not in ROI_BOX_HEAD_REGISTRY:
        ROI_BOX_HEAD_REGISTRY.register(TestProjectNormFromConfigHead)
    cfg = build_config(str(DEMO_CONFIG), [*TINY_OPTS, "MODEL.ROI_BOX_HEAD.NAME", "TestProjectNormFromConfigHead",
                                          "MODEL.ROI_BOX_HEAD.NORM", "GW", "MODEL.ROI_BOX_HEAD.NUM_CONV", "2"])
    head = gwdet.build_model(cfg).roi_heads.box_head
    assert [type(conv.norm) for conv in head.conv_norm_relus] == [GroupWhitening, GroupWhitening]


def test_group_norms_that_did_not_read_the_configs_group_number_are_named():
    # an own head building detectron2's get_norm("GN", C) got 32 groups where MODEL.GN.NUM_GROUPS was 8, without a word
    from detectron2.layers import get_norm

    from gwdet.model_zoo import build_config
    from gwdet.modeling.build import check_built_model

    from conftest import DEMO_CONFIG, logged_warnings

    cfg = build_config(str(DEMO_CONFIG))
    assert cfg.MODEL.GN.NUM_GROUPS == 8
    model = torch.nn.Sequential(torch.nn.Sequential(get_norm("GN", 64)), gwdet.norm_from_config("GN", cfg)(64))
    with logged_warnings("gwdet.modeling.build") as logged:
        check_built_model(model, cfg)
        gwdet.build_model(build_config(str(DEMO_CONFIG), ["MODEL.DEVICE", "cpu"]))  # gwdet's components read it
    assert logged == ["1 GroupNorm layer(s) (0.0) have 32 groups, detectron2's get_norm's own number, where "
                      "MODEL.GN.NUM_GROUPS is 8: a component built them with detectron2's get_norm, which does not read "
                      "the key. Build them with gwdet.norm_from_config(name, cfg) (docs/usage.md), or set "
                      "MODEL.GN.NUM_GROUPS 32."]


def _frozen_stem_resnet():
    """A small detectron2 ResNet with BGN everywhere whose stem detectron2's ResNet.freeze(1) froze."""
    from detectron2.modeling.backbone.resnet import BasicBlock, BasicStem, ResNet

    bgn = gwdet.norm("BGN", num_groups=4, examples_per_group=2)
    stages = [ResNet.make_stage(BasicBlock, 1, in_channels=8, out_channels=8, stride_per_block=[1], norm=bgn)]
    return ResNet(BasicStem(3, 8, norm=bgn), stages, out_features=["res2"]).freeze(1)


# check_model passed without a word a ResNet whose stem detectron2's freeze() froze with BGN in it, whose running
# mean then moved on every training forward (gwdet's trainers refuse it)
def test_check_model_reports_batch_statistics_norms_with_frozen_parameters(caplog):
    from gwdet.layers import BatchGroupNorm

    model = _frozen_stem_resnet()
    assert isinstance(model.stem.conv1.norm, BatchGroupNorm) and not model.stem.conv1.norm.weight.requires_grad
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    with pytest.raises(ValueError, match=r"^check_model: The norm layers stem.conv1.norm \(BatchGroupNorm\) have every "
                                         r"parameter frozen \(requires_grad False, as detectron2's freeze\(\) of a "
                                         r"backbone stage leaves them\), but normalize with batch statistics .* Train "
                                         r"those layers too \(make their parameters trainable before the optimizer is "
                                         r"built\), or use FrozenBN / BN there.$"):
        check_model(model, optimizer=optimizer, weight_decay_norm=0.0)
    caplog.clear()
    with caplog.at_level("WARNING", logger="gwdet.modeling.model_checks"):
        assert check_model(model) is model  # a model built for evaluation alone may hold them: warned of
    assert "check_model: The norm layers stem.conv1.norm (BatchGroupNorm) have every parameter frozen" in caplog.text
    assert "evaluated alone (model.eval()), they change nothing" in caplog.text
    model.requires_grad_(True)
    caplog.clear()
    with caplog.at_level("WARNING", logger="gwdet.modeling.model_checks"):
        check_model(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), weight_decay_norm=0.0)
    assert "frozen" not in caplog.text
