"""GW in every meta-architecture of detectron2's model zoo, from detectron2's own zoo files.

For each architecture: the zoo yaml with NORM "GW" at every norm key stops with ONE message naming
every key to change; applying exactly those keys builds through gwdet's Trainer, with GW (and the
config's MODEL.GW.* values) in every part that has a norm; one training step and inference run.
Then: gwdet's RetinaNet parts are detectron2's, weight for weight, and the messages of the paths
that cannot build (detectron2's build_model, unknown names, a backbone without P7).
"""
from __future__ import annotations

import re
from collections import Counter
import pytest
import torch
from detectron2 import model_zoo
from detectron2.config import get_cfg
from detectron2.layers import ShapeSpec
from detectron2.modeling import build_model
from detectron2.structures import BitMasks, Boxes, Instances, Keypoints
from detectron2.utils.events import EventStorage

import gwdet
from gwdet import NormConfigError, UnknownNormError, add_gwdet_config
from gwdet.config_checks import DOC_FILE, DOC_SECTION, DOC_SECTION_TITLE, UnknownNormConfigError
from gwdet.engine.trainer import Trainer
from gwdet.model_zoo import build_config
from gwdet.layers import GroupWhitening
from gwdet.modeling import GWRetinaNet, GWSemSegFPNHead
from gwdet.solver import build_optimizer

from conftest import REPO

NORM_KEYS = ["MODEL.RESNETS.NORM", "MODEL.FPN.NORM", "MODEL.ROI_BOX_HEAD.NORM", "MODEL.ROI_MASK_HEAD.NORM",
             "MODEL.RETINANET.NORM", "MODEL.SEM_SEG_HEAD.NORM"]
GW_EVERYWHERE = [item for key in NORM_KEYS for item in (key, "GW")]
GROUPS, ITERATIONS = 8, 3  # not gwdet's defaults (64, 5): the layers must carry the config's values
# A ResNet-50 layout (3-4-6-3 bottlenecks) 8x narrower than detectron2's, small heads, few boxes.
SHRINK = [
    "MODEL.DEVICE", "cpu", "MODEL.WEIGHTS", "",
    "MODEL.GW.NUM_GROUPS", str(GROUPS), "MODEL.GW.T", str(ITERATIONS),
    "MODEL.RESNETS.DEPTH", "50", "MODEL.RESNETS.STEM_OUT_CHANNELS", "8",
    "MODEL.RESNETS.RES2_OUT_CHANNELS", "32", "MODEL.RESNETS.WIDTH_PER_GROUP", "8",
    "MODEL.FPN.OUT_CHANNELS", "16",
    "MODEL.RPN.PRE_NMS_TOPK_TRAIN", "100", "MODEL.RPN.POST_NMS_TOPK_TRAIN", "24",
    "MODEL.RPN.PRE_NMS_TOPK_TEST", "100", "MODEL.RPN.POST_NMS_TOPK_TEST", "24",
    "MODEL.RPN.BATCH_SIZE_PER_IMAGE", "64",
    "MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE", "16", "MODEL.ROI_HEADS.NUM_CLASSES", "3",
    "MODEL.ROI_BOX_HEAD.NUM_CONV", "1", "MODEL.ROI_BOX_HEAD.CONV_DIM", "16", "MODEL.ROI_BOX_HEAD.FC_DIM", "32",
    "MODEL.ROI_MASK_HEAD.NUM_CONV", "2", "MODEL.ROI_MASK_HEAD.CONV_DIM", "16",
    "MODEL.ROI_KEYPOINT_HEAD.CONV_DIMS", "(16,)", "MODEL.ROI_KEYPOINT_HEAD.NUM_KEYPOINTS", "4",
    "MODEL.RETINANET.NUM_CLASSES", "3", "MODEL.RETINANET.NUM_CONVS", "2",
    "MODEL.SEM_SEG_HEAD.CONVS_DIM", "16", "MODEL.SEM_SEG_HEAD.NUM_CLASSES", "4",
    "TEST.DETECTIONS_PER_IMAGE", "8", "SOLVER.IMS_PER_BATCH", "2",
    "INPUT.MIN_SIZE_TRAIN", "(64,)", "INPUT.MAX_SIZE_TRAIN", "96",
    "INPUT.MIN_SIZE_TEST", "64", "INPUT.MAX_SIZE_TEST", "96",
]
FPN_ANCHORS = ["MODEL.ANCHOR_GENERATOR.SIZES", "[[8], [16], [32], [64], [128]]"]
BACKBONE_GW = 1 + 16 * 3 + 4  # every norm of a ResNet-50: stem, 3 per bottleneck, 4 shortcuts

# name: (zoo file, extra opts, the keys the first message must name, GW layers per part, tasks)
ARCHITECTURES = {
    "faster_rcnn": ("COCO-Detection/faster_rcnn_R_50_FPN_1x.yaml", FPN_ANCHORS,
                    {"MODEL.BACKBONE.NAME": "build_gw_resnet_fpn_backbone",
                     "MODEL.ROI_BOX_HEAD.NAME": "GWFastRCNNConvFCHead"},
                    {"bottom_up": BACKBONE_GW, "fpn": 8, "box_head": 1}, {"boxes"}),
    "mask_rcnn": ("COCO-InstanceSegmentation/mask_rcnn_R_50_FPN_1x.yaml", FPN_ANCHORS,
                  {"MODEL.BACKBONE.NAME": "build_gw_resnet_fpn_backbone",
                   "MODEL.ROI_BOX_HEAD.NAME": "GWFastRCNNConvFCHead",
                   "MODEL.ROI_MASK_HEAD.NAME": "GWMaskRCNNConvUpsampleHead"},
                  {"bottom_up": BACKBONE_GW, "fpn": 8, "box_head": 1, "mask_head": 2}, {"boxes", "masks"}),
    "cascade_mask_rcnn": ("Misc/cascade_mask_rcnn_R_50_FPN_1x.yaml", FPN_ANCHORS,
                          {"MODEL.BACKBONE.NAME": "build_gw_resnet_fpn_backbone",
                           "MODEL.ROI_BOX_HEAD.NAME": "GWFastRCNNConvFCHead",
                           "MODEL.ROI_MASK_HEAD.NAME": "GWMaskRCNNConvUpsampleHead"},
                          {"bottom_up": BACKBONE_GW, "fpn": 8, "box_head": 3, "mask_head": 2},
                          {"boxes", "masks"}),
    # MASK_ON is off: ROI_MASK_HEAD.NORM is set but read by nothing, so the message leaves it out
    "keypoint_rcnn": ("COCO-Keypoints/keypoint_rcnn_R_50_FPN_1x.yaml", FPN_ANCHORS,
                      {"MODEL.BACKBONE.NAME": "build_gw_resnet_fpn_backbone",
                       "MODEL.ROI_BOX_HEAD.NAME": "GWFastRCNNConvFCHead"},
                      {"bottom_up": BACKBONE_GW, "fpn": 8, "box_head": 1}, {"boxes", "keypoints"}),
    "retinanet": ("COCO-Detection/retinanet_R_50_FPN_1x.yaml",
                  ["MODEL.ANCHOR_GENERATOR.SIZES", "[[8], [16], [32], [64], [128]]"],
                  {"MODEL.BACKBONE.NAME": "build_gw_retinanet_resnet_fpn_backbone",
                   "MODEL.META_ARCHITECTURE": "GWRetinaNet"},
                  {"bottom_up": BACKBONE_GW, "fpn": 6, "retinanet_head": 4}, {"boxes"}),
    "panoptic_fpn": ("COCO-PanopticSegmentation/panoptic_fpn_R_50_1x.yaml", FPN_ANCHORS,
                     {"MODEL.BACKBONE.NAME": "build_gw_resnet_fpn_backbone",
                      "MODEL.ROI_BOX_HEAD.NAME": "GWFastRCNNConvFCHead",
                      "MODEL.ROI_MASK_HEAD.NAME": "GWMaskRCNNConvUpsampleHead",
                      "MODEL.SEM_SEG_HEAD.NAME": "GWSemSegFPNHead"},
                     {"bottom_up": BACKBONE_GW, "fpn": 8, "box_head": 1, "mask_head": 2, "sem_seg_head": 7},
                     {"boxes", "masks", "sem_seg", "panoptic"}),
    # SemanticSegmentor builds no ROI heads: their NORM keys are left out of the message
    "semantic_fpn": ("Misc/semantic_R_50_FPN_1x.yaml", [],
                     {"MODEL.BACKBONE.NAME": "build_gw_resnet_fpn_backbone",
                      "MODEL.SEM_SEG_HEAD.NAME": "GWSemSegFPNHead"},
                     {"bottom_up": BACKBONE_GW, "fpn": 8, "sem_seg_head": 7}, {"sem_seg"}),
    # C4: res5 is built by the ROI heads; GW at S1-B2 there too, GN(8) at the other ResNet norms
    "faster_rcnn_c4": ("COCO-Detection/faster_rcnn_R_50_C4_1x.yaml",
                       ["MODEL.RESNETS.NORM", "GN", "MODEL.GN.NUM_GROUPS", "8", "MODEL.RESNETS.GW_POSITIONS",
                        "S1-B2", "MODEL.ANCHOR_GENERATOR.SIZES", "[[8, 16, 32]]"],
                       {"MODEL.BACKBONE.NAME": "build_gw_resnet_backbone",
                        "MODEL.ROI_HEADS.NAME": "GWRes5ROIHeads"},
                       {"bottom_up": 1 + 13, "res5_head": 3}, {"boxes"}),
}
PARTS = (("backbone.bottom_up.", "bottom_up"), ("backbone.fpn_", "fpn"), ("backbone.", "bottom_up"),  # C4: a ResNet
         ("roi_heads.box_head", "box_head"),
         ("roi_heads.mask_head", "mask_head"), ("roi_heads.res5", "res5_head"), ("head.", "retinanet_head"),
         ("sem_seg_head.", "sem_seg_head"))
CHANGE_LINE = re.compile(r"^  (MODEL\.[A-Z0-9_.]+): '([^']*)' -> '([^']*)'$", re.MULTILINE)


def zoo_opts(name: str) -> tuple[str, list[str]]:
    zoo_file, extra, *_ = ARCHITECTURES[name]
    return model_zoo.get_config_file(zoo_file), GW_EVERYWHERE + SHRINK + extra


def unchecked_config(config_file: str, opts: list[str]):
    """The config as a user merges it (gwdet's keys first), not checked by anything yet."""
    cfg = add_gwdet_config(get_cfg())
    cfg.merge_from_file(config_file)
    cfg.merge_from_list(opts)
    return cfg


def changes_named_in(message: str) -> dict[str, str]:
    return {key: new for key, _old, new in CHANGE_LINE.findall(message)}


def part_of(name: str) -> str:
    return next((part for prefix, part in PARTS if name.startswith(prefix)), "other")


def norm_layers(model: torch.nn.Module) -> dict[str, Counter]:
    """{part: Counter(norm type name)} of every norm-like module of ``model``."""
    found: dict[str, Counter] = {}
    for name, module in model.named_modules():
        kind = type(module).__name__
        if isinstance(module, GroupWhitening) or "Norm" in kind:
            found.setdefault(part_of(name), Counter())[kind] += 1
    return found


def synthetic_batch(tasks: set[str], num_keypoints: int = 4, sem_classes: int = 4) -> list[dict]:
    generator = torch.Generator().manual_seed(0)
    batch = []
    for height, width in ((64, 64), (64, 80)):
        boxes = torch.tensor([[4.0, 6.0, 40.0, 44.0], [20.0, 18.0, 60.0, 58.0]])
        instances = Instances((height, width), gt_boxes=Boxes(boxes), gt_classes=torch.tensor([0, 2]))
        if "masks" in tasks:
            masks = torch.zeros(2, height, width, dtype=torch.bool)
            for mask, (x0, y0, x1, y1) in zip(masks, boxes.int().tolist(), strict=True):
                mask[y0:y1, x0:x1] = True
            instances.gt_masks = BitMasks(masks)
        if "keypoints" in tasks:
            xy = boxes[:, None, :2] + torch.rand(2, num_keypoints, 2, generator=generator) * 30
            instances.gt_keypoints = Keypoints(torch.cat([xy, torch.full((2, num_keypoints, 1), 2.0)], dim=2))
        sample = {"image": torch.rand(3, height, width, generator=generator) * 255, "instances": instances,
                  "height": height, "width": width}
        if "sem_seg" in tasks:
            sample["sem_seg"] = torch.randint(0, sem_classes, (height, width), generator=generator)
        batch.append(sample)
    return batch


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_zoo_architecture_with_gw_follows_one_message_then_trains_and_infers(name):
    config_file, opts = zoo_opts(name)
    _, _, expected_changes, expected_gw, tasks = ARCHITECTURES[name]

    # 1. gwdet's Trainer on the config as merged: one error naming every key at once
    with pytest.raises(NormConfigError) as err:
        Trainer.build_model(unchecked_config(config_file, opts))
    message = str(err.value)
    assert not isinstance(err.value, KeyError), message
    named = changes_named_in(message)
    assert named == expected_changes, message
    assert err.value.changes == named
    assert DOC_SECTION in message
    for key in named:
        assert f"{key} {named[key]}" in message  # the command-line form, ready to paste
    with pytest.raises(NormConfigError) as again:  # gwdet's config loader says the same
        build_config(config_file, opts)
    assert str(again.value) == message

    # 2. exactly those keys, and nothing else, make it build
    fixed = opts + [item for key, value in named.items() for item in (key, value)]
    cfg = build_config(config_file, fixed)
    torch.manual_seed(0)
    model = Trainer.build_model(cfg)
    layers = norm_layers(model)
    assert {part: counts.get("GroupWhitening", 0) for part, counts in layers.items()
            if counts.get("GroupWhitening")} == expected_gw
    if name == "faster_rcnn_c4":
        assert layers["bottom_up"]["GroupNorm"] == 29 and layers["res5_head"]["GroupNorm"] == 7
        assert {m.num_groups for m in model.modules() if type(m) is torch.nn.GroupNorm} == {8}
    else:  # every norm of the model is GW
        assert {kind for counts in layers.values() for kind in counts} == {"GroupWhitening"}, layers
    gw_layers = [m for m in model.modules() if isinstance(m, GroupWhitening)]
    assert {(m.num_groups, m.T) for m in gw_layers} == {(GROUPS, ITERATIONS)}

    # 3. one training step: losses, backward, an SGD step that moves GW's parameters in every part
    model.train()
    with EventStorage(0):  # detectron2's trainer provides one; its losses log into it
        losses = model(synthetic_batch(tasks))
    expected_losses = {"boxes": "loss_cls" if name == "retinanet" else "loss_box_reg", "masks": "loss_mask",
                       "keypoints": "loss_keypoint", "sem_seg": "loss_sem_seg"}
    for task in tasks & set(expected_losses):  # Cascade R-CNN: loss_box_reg_stage0, ...
        assert any(loss.startswith(expected_losses[task]) for loss in losses), (task, sorted(losses))
    total = sum(losses.values())
    assert torch.isfinite(total), losses
    optimizer = build_optimizer(cfg, model)
    optimizer.zero_grad()
    total.backward()
    trained = {name_: module for name_, module in model.named_modules()
               if isinstance(module, GroupWhitening) and module.weight.requires_grad}
    before = {name_: module.weight.detach().clone() for name_, module in trained.items()}
    optimizer.step()
    moved = {part_of(name_) for name_, module in trained.items() if not torch.equal(module.weight, before[name_])}
    assert moved == set(expected_gw), moved

    # 4. inference in eval mode
    model.eval()
    with torch.no_grad():
        outputs = model([{key: sample[key] for key in ("image", "height", "width")}
                         for sample in synthetic_batch(tasks)])
    assert len(outputs) == 2
    for output in outputs:
        if "boxes" in tasks:
            assert output["instances"].pred_boxes.tensor.shape[1] == 4
            assert len(output["instances"]) <= cfg.TEST.DETECTIONS_PER_IMAGE
        if "masks" in tasks:
            assert output["instances"].pred_masks.shape[1:] == (64, output["instances"].image_size[1])
        if "keypoints" in tasks:
            assert output["instances"].pred_keypoints.shape[1:] == (4, 3)
        if "sem_seg" in tasks:
            assert output["sem_seg"].shape[0] == cfg.MODEL.SEM_SEG_HEAD.NUM_CLASSES
        if "panoptic" in tasks:
            assert "panoptic_seg" in output


def test_the_messages_doc_section_exists():
    text = (REPO / DOC_FILE).read_text(encoding="utf-8")
    assert re.search(rf"^#+ {re.escape(DOC_SECTION_TITLE)}$", text, re.MULTILINE), DOC_SECTION


def _retinanet_cfg(backbone: str, meta: str, norm: str = ""):
    cfg = unchecked_config(*zoo_opts("retinanet"))
    for key in NORM_KEYS:
        cfg.merge_from_list([key, norm])
    cfg.MODEL.BACKBONE.NAME, cfg.MODEL.META_ARCHITECTURE = backbone, meta
    return cfg


def test_gw_retinanet_parts_are_detectron2s_weight_for_weight_with_detectron2s_norms():
    # FrozenBN in the ResNet, no FPN/head norm: gwdet's builders must give detectron2's model exactly
    # (same layers, same initialization order), P3-P7 included, and build its head only once
    models = {}
    for backbone, meta in (("build_retinanet_resnet_fpn_backbone", "RetinaNet"),
                           ("build_gw_retinanet_resnet_fpn_backbone", "GWRetinaNet")):
        cfg = _retinanet_cfg(backbone, meta)
        cfg.MODEL.RESNETS.NORM = "FrozenBN"
        torch.manual_seed(0)
        models[meta] = build_model(cfg)
    stock, gw = models["RetinaNet"].state_dict(), models["GWRetinaNet"].state_dict()
    assert list(stock) == list(gw)
    assert all(torch.equal(stock[key], gw[key]) for key in stock)
    assert sorted(models["GWRetinaNet"].backbone.output_shape()) == ["p3", "p4", "p5", "p6", "p7"]
    # every other argument of detectron2's RetinaNet comes from the same keys
    cfg = _retinanet_cfg("build_gw_retinanet_resnet_fpn_backbone", "GWRetinaNet")
    ours, theirs = GWRetinaNet.from_config(cfg), models["RetinaNet"]
    assert set(ours) == set(type(theirs).from_config(cfg))
    for key in ("num_classes", "head_in_features", "focal_loss_alpha", "focal_loss_gamma", "smooth_l1_beta",
                "box_reg_loss_type", "test_score_thresh", "test_topk_candidates", "test_nms_thresh",
                "max_detections_per_image", "vis_period", "input_format"):
        assert getattr(theirs, key) == ours[key], key


def test_gw_sem_seg_head_is_detectron2s_with_detectron2s_norm():
    cfg = unchecked_config(*zoo_opts("semantic_fpn"))
    cfg.MODEL.BACKBONE.NAME, cfg.MODEL.SEM_SEG_HEAD.NAME = "build_gw_resnet_fpn_backbone", "GWSemSegFPNHead"
    cfg.MODEL.SEM_SEG_HEAD.NORM, cfg.MODEL.SEM_SEG_HEAD.CONVS_DIM = "GN", 32
    shapes = {f"p{i}": ShapeSpec(channels=16, stride=2 ** i) for i in range(2, 6)}
    from detectron2.modeling.meta_arch.semantic_seg import SemSegFPNHead

    torch.manual_seed(0)
    stock = SemSegFPNHead(cfg, shapes).state_dict()
    torch.manual_seed(0)
    ours = GWSemSegFPNHead(cfg, shapes).state_dict()
    assert list(stock) == list(ours) and all(torch.equal(stock[k], ours[k]) for k in stock)
    cfg.MODEL.GN.NUM_GROUPS = 4  # detectron2's head would build 32 groups; gwdet's takes the config's
    assert {m.num_groups for m in GWSemSegFPNHead(cfg, shapes).modules()
            if isinstance(m, torch.nn.GroupNorm)} == {4}


def test_a_retinanet_backbone_without_p7_is_named_not_a_bare_key_error():
    cfg = _retinanet_cfg("build_gw_resnet_fpn_backbone", "GWRetinaNet", "GW")
    cfg.MODEL.RESNETS.OUT_FEATURES = cfg.MODEL.FPN.IN_FEATURES = ["res2", "res3", "res4", "res5"]
    with pytest.raises(ValueError) as err:
        build_model(cfg)
    assert "'p7'" in str(err.value) and "build_gw_retinanet_resnet_fpn_backbone" in str(err.value)


def test_plain_detectron2_build_model_gets_the_message_when_a_gwdet_component_is_built_first():
    # detectron2's own build_model, after import gwdet: gwdet's meta-architecture, backbone or head
    # checks the whole config before detectron2's component that would end in KeyError 'GW' is built
    cases = {
        "retinanet": _retinanet_cfg("build_retinanet_resnet_fpn_backbone", "GWRetinaNet", "GW"),
        "mask_rcnn": unchecked_config(*zoo_opts("mask_rcnn")),
    }
    cases["mask_rcnn"].MODEL.BACKBONE.NAME = "build_gw_resnet_fpn_backbone"
    expected = {"retinanet": {"MODEL.BACKBONE.NAME": "build_gw_retinanet_resnet_fpn_backbone"},
                "mask_rcnn": {"MODEL.ROI_BOX_HEAD.NAME": "GWFastRCNNConvFCHead",
                              "MODEL.ROI_MASK_HEAD.NAME": "GWMaskRCNNConvUpsampleHead"}}
    for case, cfg in cases.items():
        with pytest.raises(NormConfigError) as err:
            build_model(cfg)
        assert not isinstance(err.value, KeyError)
        assert changes_named_in(str(err.value)) == expected[case], str(err.value)
        assert DOC_SECTION in str(err.value)


def test_only_detectron2s_own_components_reach_its_get_norm_and_gwdet_build_model_stops_before():
    # With detectron2's components only, detectron2's build_model runs no gwdet code: its get_norm
    # looks the name up in a dict literal inside the function and raises KeyError('GW'); gwdet does
    # not patch that (tests/test_detectron2_untouched.py). Every gwdet entry point checks first.
    cfg = unchecked_config(*zoo_opts("faster_rcnn"))
    with pytest.raises(KeyError) as bare:
        build_model(cfg)
    assert bare.value.args == ("GW",)
    for build in (gwdet.build_model, Trainer.build_model):
        with pytest.raises(NormConfigError) as err:
            build(cfg)
        assert changes_named_in(str(err.value)) == ARCHITECTURES["faster_rcnn"][2]


def test_unknown_names_and_misplaced_norms_come_in_one_error():
    config_file, opts = zoo_opts("mask_rcnn")
    with pytest.raises(UnknownNormError) as err:
        build_config(config_file, opts + ["MODEL.FPN.NORM", "GWW", "MODEL.ROI_MASK_HEAD.NORM", "BGM"])
    message = str(err.value)
    assert isinstance(err.value, UnknownNormConfigError) and isinstance(err.value, ValueError)
    assert "MODEL.FPN.NORM='GWW' is not a known norm name" in message
    assert "MODEL.ROI_MASK_HEAD.NORM='BGM' is not a known norm name" in message
    assert "Known names:" in message and "GW_ZCA" in message
    # the keys whose names are known still get their change in the same message
    assert changes_named_in(message) == {"MODEL.BACKBONE.NAME": "build_gw_resnet_fpn_backbone",
                                         "MODEL.ROI_BOX_HEAD.NAME": "GWFastRCNNConvFCHead"}


def test_gn_groups_reach_the_semantic_head_only_where_one_is_built():
    # detectron2's SEM_SEG_HEAD.NORM default is "GN": with MODEL.GN.NUM_GROUPS 8, SemSegFPNHead would
    # build 32 groups. A panoptic FPN is told; a Mask R-CNN (no semantic head) is not bothered.
    gn8 = ["MODEL.GN.NUM_GROUPS", "8", "MODEL.DEVICE", "cpu"]
    with pytest.raises(NormConfigError) as err:
        build_config(model_zoo.get_config_file(ARCHITECTURES["panoptic_fpn"][0]), gn8)
    assert changes_named_in(str(err.value)) == {"MODEL.SEM_SEG_HEAD.NAME": "GWSemSegFPNHead"}
    assert "always builds GN with 32 groups" in str(err.value)
    build_config(model_zoo.get_config_file(ARCHITECTURES["mask_rcnn"][0]), gn8)


def test_gw_positions_reach_res5_of_c4_models_only_through_gwdets_roi_heads():
    config_file, opts = zoo_opts("faster_rcnn_c4")
    opts = opts + ["MODEL.BACKBONE.NAME", "build_gw_resnet_backbone"]
    with pytest.raises(NormConfigError) as err:
        build_config(config_file, opts)
    assert changes_named_in(str(err.value)) == {"MODEL.ROI_HEADS.NAME": "GWRes5ROIHeads"}
    assert "GW_POSITIONS='S1-B2'" in str(err.value)


def test_a_detectron2_reader_gwdet_cannot_replace_is_a_fix_by_hand_and_the_error_pickles():
    # detectron2's DeepLab backbone (detectron2.projects.deeplab) reads MODEL.RESNETS.NORM by name
    import pickle

    cfg = unchecked_config(*zoo_opts("semantic_fpn"))
    cfg.MODEL.BACKBONE.NAME, cfg.MODEL.SEM_SEG_HEAD.NAME = "build_resnet_deeplab_backbone", "GWSemSegFPNHead"
    with pytest.raises(NormConfigError) as err:
        gwdet.check_gwdet_config(cfg)
    message = str(err.value)
    assert err.value.changes == {} and changes_named_in(message) == {}
    assert "MODEL.RESNETS.NORM='GW'" in message and "gwdet has no replacement for build_resnet_deeplab_backbone" in message
    copy = pickle.loads(pickle.dumps(err.value))
    assert type(copy) is NormConfigError and str(copy) == message and copy.changes == {}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without a CUDA GPU")
def test_a_cuda_config_on_a_machine_without_a_gpu_names_model_device(tmp_path):
    cfg = add_gwdet_config(get_cfg())
    cfg.merge_from_file(str(REPO / "configs" / "COCO-Detection" / "faster_rcnn_R_50_FPN_1x_gw.yaml"))
    assert cfg.MODEL.DEVICE == "cuda"
    for build in (gwdet.build_model, Trainer.build_model):
        with pytest.raises(ValueError, match=r"MODEL.DEVICE is 'cuda', but this machine has no CUDA GPU.*"
                                             r"add MODEL.DEVICE cpu"):
            build(cfg)
