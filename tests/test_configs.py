"""Every yaml under configs/ builds the model it describes, checked on the model and against
sources outside the config: the norm each NORM key names at every place, with the config's group
numbers; torchvision's ResNet/ResNeXt layout and input normalization where ImageNet weights are
loaded; detectron2's own schedules; a trainable model and no weights for the from-scratch study,
whose configs are the paper's rows.

The models are built on the meta device: the structure without memory or initialization, which
is all these tests read (tests that train or load weights build real models).
"""
import functools
from pathlib import Path

import detectron2
import pytest
import torch
import torchvision
from detectron2.checkpoint import DetectionCheckpointer
from detectron2.config import get_cfg
from detectron2.layers import Conv2d, FrozenBatchNorm2d
from detectron2.modeling import build_model

from gwdet.model_zoo import build_config
from gwdet.layers import GroupWhitening
from gwdet.positions import BLOCK_CONV_OF_POSITION, parse_gw_positions

from conftest import REPO

CONFIGS = sorted(p for p in (REPO / "configs").rglob("*.yaml") if not p.name.startswith("Base-"))
HEADLINE = REPO / "configs" / "mask_rcnn_gw.yaml"


@functools.lru_cache(maxsize=None)
def built(path: Path):
    """(config, model) of the yaml at ``path``, the model on the meta device."""
    cfg = build_config(str(path), ["MODEL.DEVICE", "meta"])
    with torch.device("meta"):
        return cfg, build_model(cfg)


def config_id(path: Path) -> str:
    return str(path.relative_to(REPO / "configs"))


# the paper's from-scratch study (COCO) and everything on the shapes dataset; the rest fine-tunes
# ImageNet weights converted by tools/convert_pretrained.py
FROM_SCRATCH_CONFIGS = [path for path in CONFIGS if path.parent.name in ("Scratch", "Demo", "Study")]
IMAGENET_CONFIGS = [path for path in CONFIGS if path not in FROM_SCRATCH_CONFIGS]


def test_all_configs_are_found():
    assert len(CONFIGS) >= 19, [p.name for p in CONFIGS]
    assert len(IMAGENET_CONFIGS) >= 7 and len(FROM_SCRATCH_CONFIGS) >= 12


# ---- the norm of every NORM key, at every place -------------------------------------------------

NORM_TYPES = {"GW": GroupWhitening, "GN": torch.nn.GroupNorm, "BN": torch.nn.BatchNorm2d,
              "SyncBN": torch.nn.SyncBatchNorm, "FrozenBN": FrozenBatchNorm2d, "": type(None)}
GROUPS_KEY = {GroupWhitening: "GW", torch.nn.GroupNorm: "GN"}


def expected_type(name: str, frozen: bool):
    kind = NORM_TYPES[name]
    return FrozenBatchNorm2d if frozen and kind is torch.nn.BatchNorm2d else kind


def backbone_expectations(cfg, resnet):
    """(conv, expected norm type) for every norm-carrying conv of the ResNet, from the config alone."""
    positions = parse_gw_positions(cfg.MODEL.RESNETS.GW_POSITIONS)
    freeze_at = cfg.MODEL.BACKBONE.FREEZE_AT
    yield resnet.stem.conv1, expected_type(
        cfg.MODEL.RESNETS.GW_NORM if "S1" in positions else cfg.MODEL.RESNETS.NORM, freeze_at >= 1)
    for index, stage in enumerate(resnet.stages, start=2):
        for block in stage:
            for conv_name in ("conv1", "conv2", "conv3", "shortcut"):
                conv = getattr(block, conv_name, None)
                if conv is None:
                    continue
                at_gw = any(BLOCK_CONV_OF_POSITION[p] == conv_name for p in positions if p != "S1")
                name = cfg.MODEL.RESNETS.GW_NORM if at_gw else cfg.MODEL.RESNETS.NORM
                yield conv, expected_type(name, freeze_at >= index)


def fpn_convs(model) -> list:
    return [conv for name, conv in model.backbone.named_children() if name.startswith(("fpn_lateral", "fpn_output"))]


def head_expectations(cfg, model):
    for conv in fpn_convs(model):
        yield conv, expected_type(cfg.MODEL.FPN.NORM, False)
    for conv in getattr(model.roi_heads.box_head, "conv_norm_relus", []):
        yield conv, expected_type(cfg.MODEL.ROI_BOX_HEAD.NORM, False)
    if cfg.MODEL.MASK_ON:
        for conv in model.roi_heads.mask_head.conv_norm_relus:
            yield conv, expected_type(cfg.MODEL.ROI_MASK_HEAD.NORM, False)


@pytest.mark.parametrize("path", CONFIGS, ids=config_id)
def test_config_builds_every_norm_the_config_names_with_its_values(path):
    cfg, model = built(path)
    checked = 0
    for conv, kind in [*backbone_expectations(cfg, model.backbone.bottom_up), *head_expectations(cfg, model)]:
        assert type(conv.norm) is kind, (path.name, conv, kind)
        if kind in GROUPS_KEY:
            assert conv.norm.num_groups == cfg.MODEL[GROUPS_KEY[kind]].NUM_GROUPS
        checked += 1
    assert checked >= 60


# ---- ImageNet weights: torchvision's architectures and input ------------------------------------

TORCHVISION_RESNETS = ("resnet50", "resnet101", "resnext50_32x4d", "resnext101_32x8d")


def conv_signature(conv):
    if conv is None:
        return None
    return (conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding, conv.groups)


@functools.lru_cache(maxsize=None)
def torchvision_convs(arch: str) -> tuple:
    """The convs of torchvision's ``arch``, stem first, then conv1-3 and shortcut of each block."""
    with torch.device("meta"):
        model = getattr(torchvision.models, arch)()
    blocks = [block for layer in (model.layer1, model.layer2, model.layer3, model.layer4) for block in layer]
    shortcuts = [block.downsample[0] if block.downsample is not None else None for block in blocks]
    return (conv_signature(model.conv1),) + tuple(
        conv_signature(conv) for block, shortcut in zip(blocks, shortcuts, strict=True)
        for conv in (block.conv1, block.conv2, block.conv3, shortcut))


def torchvision_architecture(model) -> str | None:
    """The torchvision ResNet/ResNeXt whose convs (channels, kernel, stride, padding, groups) are
    the model's backbone's one by one, or None."""
    resnet = model.backbone.bottom_up
    blocks = [block for stage in resnet.stages for block in stage]
    convs = (conv_signature(resnet.stem.conv1),) + tuple(
        conv_signature(conv) for block in blocks for conv in (block.conv1, block.conv2, block.conv3, block.shortcut))
    matches = [arch for arch in TORCHVISION_RESNETS if torchvision_convs(arch) == convs]
    return matches[0] if len(matches) == 1 else None


@pytest.mark.parametrize("path", IMAGENET_CONFIGS, ids=config_id)
def test_imagenet_weight_configs_build_a_torchvision_network_fed_as_torchvision_feeds_it(path):
    # tools/convert_pretrained.py converts torchvision-layout checkpoints; such weights fit only
    # torchvision's convs (stride in the 3x3 conv) and the input torchvision normalizes
    cfg, model = built(path)
    arch = torchvision_architecture(model)
    assert arch is not None, f"{config_id(path)}: no torchvision ResNet/ResNeXt has this backbone's convs"
    preset = torchvision.models.get_model_weights(arch).DEFAULT.transforms()
    assert model.input_format == "RGB"
    assert cfg.MODEL.PIXEL_MEAN == pytest.approx([255 * value for value in preset.mean], abs=1e-3)
    assert cfg.MODEL.PIXEL_STD == pytest.approx([255 * value for value in preset.std], abs=1e-3)


def test_headline_config_builds_the_papers_table_5_model():
    # GW paper, Table 5 and Sec. 5.2: Mask R-CNN, ResNeXt-101 + FPN, '4conv1fc' box head, GW in
    # the backbone at S1-B2 (the stem and the 2nd norm of every bottleneck, Sec. 5.1) and in the
    # FPN, box and mask heads; a batch of 8 images (one per GPU on eight)
    cfg, model = built(HEADLINE)
    assert torchvision_architecture(model) == "resnext101_32x8d"
    assert model.roi_heads.mask_on
    box_head, mask_head = model.roi_heads.box_head, model.roi_heads.mask_head
    assert (len(box_head.conv_norm_relus), len(box_head.fcs)) == (4, 1)
    resnet = model.backbone.bottom_up
    at_s1_b2 = [resnet.stem.conv1] + [block.conv2 for stage in resnet.stages for block in stage]
    with_gw = at_s1_b2 + fpn_convs(model) + box_head.conv_norm_relus + mask_head.conv_norm_relus
    assert all(isinstance(conv.norm, GroupWhitening) for conv in with_gw)
    gw_layers = [module for module in model.modules() if isinstance(module, GroupWhitening)]
    assert len(gw_layers) == len(with_gw), "GW nowhere else"
    # GW with g = 64 (Sec. 5.1) and ItN with T = 5 (Sec. 5)
    assert {(layer.num_groups, layer.T, layer.method) for layer in gw_layers} == {(64, 5, "itn")}
    assert cfg.SOLVER.IMS_PER_BATCH == 8


# ---- schedules: detectron2's own ----------------------------------------------------------------

DETECTRON2_CONFIGS = Path(detectron2.__file__).parent / "model_zoo" / "configs"
# The COCO configs train with detectron2's 1x schedule (the paper's Tables 4 and 5: "1x lr
# scheduling"); from scratch too: the paper's from-scratch run "follow[s] the same setup as in the
# previous experiment" (Table 4).
SCHEDULE_OF_FOLDER = {"configs": "1x", "COCO-Detection": "1x", "COCO-InstanceSegmentation": "1x", "Scratch": "1x"}
COCO_CONFIGS = [path for path in CONFIGS if path.parent.name in SCHEDULE_OF_FOLDER]


def detectron2_schedule(name: str):
    """The SOLVER of detectron2's model-zoo Mask R-CNN R-50-FPN with schedule ``name``."""
    path = DETECTRON2_CONFIGS / "COCO-InstanceSegmentation" / f"mask_rcnn_R_50_FPN_{name}.yaml"
    assert path.is_file(), f"detectron2's model-zoo configs are not installed: {path}"
    cfg = get_cfg()
    cfg.merge_from_file(str(path))
    return cfg.SOLVER


@pytest.mark.parametrize("path", COCO_CONFIGS, ids=config_id)
def test_coco_configs_train_on_detectron2s_schedule(path):
    # at another batch size: as many images, the same learning rate per image, steps at the same images
    solver, reference = built(path)[0].SOLVER, detectron2_schedule(SCHEDULE_OF_FOLDER[path.parent.name])
    assert solver.MAX_ITER * solver.IMS_PER_BATCH == reference.MAX_ITER * reference.IMS_PER_BATCH
    assert solver.BASE_LR / solver.IMS_PER_BATCH == pytest.approx(reference.BASE_LR / reference.IMS_PER_BATCH)
    assert [step * solver.IMS_PER_BATCH for step in solver.STEPS] == [
        step * reference.IMS_PER_BATCH for step in reference.STEPS]


# ---- from scratch: the paper's small-batch study ------------------------------------------------

@pytest.mark.parametrize("path", FROM_SCRATCH_CONFIGS, ids=config_id)
def test_from_scratch_configs_train_every_parameter_and_load_nothing(path):
    cfg, model = built(path)
    assert all(parameter.requires_grad for parameter in model.parameters())
    assert not any(isinstance(module, FrozenBatchNorm2d) for module in model.modules())
    assert DetectionCheckpointer(model).resume_or_load(cfg.MODEL.WEIGHTS, resume=False) == {}


def backbone_norms(model) -> dict:
    """Norm type name -> how many of the backbone's convs carry it."""
    counts: dict = {}
    for module in model.backbone.bottom_up.modules():
        if isinstance(module, Conv2d) and module.norm is not None:
            kind = type(module.norm).__name__
            counts[kind] = counts.get(kind, 0) + 1
    return counts


# GW paper, end of Sec. 5.2: from scratch with all BN, BN with GW at S1-B2 (17 GW layers in a
# ResNet-50, Sec. 5.1), all GN, all GW. Every family of study configs has these four rows.
STUDY_FAMILIES = {
    "Scratch": sorted((REPO / "configs" / "Scratch").glob("faster_rcnn_*.yaml")),
    "Demo": sorted((REPO / "configs" / "Demo").glob("scratch_*.yaml")),
    "Study": [REPO / "configs" / "Study" / f"{row}.yaml" for row in ("bn", "bn_gw_s1b2", "gn", "gw")],
}


@pytest.mark.parametrize("family", sorted(STUDY_FAMILIES))
def test_each_study_family_has_the_papers_four_from_scratch_rows(family):
    family_norms = [backbone_norms(built(path)[1]) for path in STUDY_FAMILIES[family]]
    rows = {tuple(sorted(norms)): norms for norms in family_norms}
    assert sorted(rows) == [("BatchNorm2d",), ("BatchNorm2d", "GroupWhitening"), ("GroupNorm",), ("GroupWhitening",)]
    assert rows[("BatchNorm2d", "GroupWhitening")]["GroupWhitening"] == 17


@pytest.mark.parametrize("base", ["null", "[1]", '""', "[]"])
def test_a_base_that_is_no_path_is_named(tmp_path, base):
    # fvcore's raw AttributeError ('NoneType' object has no attribute 'startswith'); "" got a nonsense hint
    from gwdet.model_zoo import build_config

    config = tmp_path / "mine.yaml"
    config.write_text(f"_BASE_: {base}\nSEED: 1\n")
    with pytest.raises(ValueError, match=r"gives _BASE_: .*: give the path of a base config"):
        build_config(str(config))


@pytest.mark.parametrize("content", ["", "# only a comment\n", "- a list\n"])
def test_a_base_that_holds_no_mapping_is_named(tmp_path, content):
    # fvcore's raw TypeError: argument of type 'NoneType' is not iterable
    from gwdet.model_zoo import build_config

    (tmp_path / "base.yaml").write_text(content)
    config = tmp_path / "mine.yaml"
    config.write_text("_BASE_: base.yaml\nSEED: 1\n")
    with pytest.raises(ValueError, match=r"names _BASE_: 'base.yaml', but .*base.yaml holds no KEY: VALUE mapping"):
        build_config(str(config))


# a plain dict was taken for a config without gwdet's keys: "call gwdet.add_gwdet_config(cfg)", which refuses a dict
def test_build_model_refuses_a_plain_dict_naming_its_type_and_the_fix():
    import gwdet
    from gwdet.errors import GwdetTypeError

    with pytest.raises(GwdetTypeError, match=r"^gwdet.build_model needs a detectron2 CfgNode \(a yacs config\), got a "
                                             r"dict: \{'MODEL': \{\}\}.*get_cfg\(\); gwdet.add_gwdet_config.*"
                                             r"gwdet.model_zoo.get_config\(path\).*CfgNode\(your_dict\)"):
        gwdet.build_model({"MODEL": {}})


# a saved LazyConfig's gwdet.norm tag with strict: 'false' (a string) was read as strict=True, its truth value
@pytest.mark.parametrize("written, shown", [("'false'", "'false' (str)"), ("1", "1 (int)"), ("null", "None (NoneType)")])
def test_a_saved_lazy_configs_norm_strict_that_is_no_yaml_bool_is_refused_naming_the_file(tmp_path, written, shown):
    import re

    from detectron2.config import LazyConfig

    import gwdet
    from conftest import LAZY_CONFIG
    from gwdet.errors import GwdetValueError
    from gwdet.model_zoo.lazy_loading import load_lazy_config

    cfg = LazyConfig.load(str(LAZY_CONFIG))
    cfg.model.backbone.norm = gwdet.norm("GW", num_groups=4, T=3)
    saved = tmp_path / "config.yaml"
    LazyConfig.save(cfg, str(saved))
    text = saved.read_text()
    assert text.count("strict: false") == 1, text
    assert load_lazy_config(str(saved), []).model.backbone.norm.get("strict", False) is False
    saved.write_text(text.replace("strict: false", "strict: true"))
    assert load_lazy_config(str(saved), []).model.backbone.norm.strict is True
    saved.write_text(text.replace("strict: false", f"strict: {written}"))
    line = 1 + text[:text.index("strict: false")].count("\n")
    with pytest.raises(GwdetValueError, match=rf"^Config file {re.escape(repr(str(saved)))} is a LazyConfig saved as "
                       rf"YAML, but the 'GW' norm in it \(the tag !!python/object:gwdet\.norms\.Norm, its strict at line "
                       rf"{line}, column \d+\): strict must be True or False, got {re.escape(shown)}, whose truth value "
                       rf"would make it strict=.*LazyConfig\.save writes YAML's true or false: write strict: false"):
        load_lazy_config(str(saved), [])
