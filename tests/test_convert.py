"""ImageNet checkpoint conversion (gwdet.convert, tools/convert_pretrained.py).

torchvision ResNet-50/ResNeXt-50 files (BN, and GW at S1-B2 as in the GW authors' models), in
every wrapping, converted and loaded into gwdet's backbone through detectron2's
DetectionCheckpointer must reproduce the source network's features; mismatched, broken or unsafe
files must be refused with a clear message and no output file.
"""
import argparse
import os
import pickle
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
import torchvision
from detectron2.checkpoint import DetectionCheckpointer
from detectron2.config import get_cfg
from detectron2.layers import ShapeSpec
from detectron2.modeling import build_backbone, build_model
from torch import nn

from gwdet.errors import GwdetValueError
from gwdet import add_gwdet_config
from gwdet.convert import (
    ConversionError,
    SourceStateDict,
    convert_checkpoint,
    convert_state_dict,
    read_source_state_dict,
)
from gwdet.checkpoint.safe_load import load_pickle_file
from gwdet.checkpoint.converted_weights import read_conversion_metadata
from gwdet.layers import group_whitening

REPO = Path(__file__).resolve().parents[1]
TOOL = REPO / "tools" / "convert_pretrained.py"

# arch -> (torchvision builder, MODEL.RESNETS.DEPTH, NUM_GROUPS, WIDTH_PER_GROUP)
ARCHS = {
    "R-50": (torchvision.models.resnet50, 50, 1, 64),
    "X-50-32x4d": (torchvision.models.resnext50_32x4d, 50, 32, 4),
}
WRAPPINGS = ("bare", "state_dict", "model", "module-prefixed")
STAGES = ("res2", "res3", "res4", "res5")


class AuthorsGroupWhitening(nn.Module):
    """Like the GW authors' ImageNet module: affine stored as [1, C, 1, 1], no statistics."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(1, channels, 1, 1).uniform_(0.2, 0.6))
        self.bias = nn.Parameter(torch.empty(1, channels, 1, 1).normal_(0, 0.1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        whitened = group_whitening(x, num_groups=64, T=5, eps=1e-5, method="itn")
        return whitened * self.weight + self.bias


def torchvision_model(arch: str, with_gw: bool) -> nn.Module:
    """A torchvision model with random BN statistics and affine; GW at S1-B2 if asked."""
    torch.manual_seed(0)
    model = ARCHS[arch][0](weights=None)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.normal_(0, 0.1)
            module.running_var.uniform_(0.5, 2.0)
            module.weight.data.uniform_(0.2, 0.6)  # keeps activations O(1) through 16 blocks
            module.bias.data.normal_(0, 0.1)
    if with_gw:
        model.bn1 = AuthorsGroupWhitening(model.bn1.num_features)
        for layer in (model.layer1, model.layer2, model.layer3, model.layer4):
            for block in layer:
                block.bn2 = AuthorsGroupWhitening(block.bn2.num_features)
    return model.eval()


@torch.no_grad()
def torchvision_features(model: nn.Module, image: torch.Tensor) -> dict:
    """layer1..layer4 outputs, named as detectron2's res2..res5."""
    x = model.maxpool(model.relu(model.bn1(model.conv1(image))))
    features = {}
    for stage, layer in zip(STAGES, (model.layer1, model.layer2, model.layer3, model.layer4), strict=True):
        x = features[stage] = layer(x)
    return features


class DetectorStub(nn.Module):
    """Holds the backbone as ``backbone`` like GeneralizedRCNN: keys are backbone.bottom_up.*."""

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone


def gwdet_detector(arch: str, gw_positions: str, gw_groups: int = 64) -> DetectorStub:
    """gwdet's ResNet+FPN backbone configured for converted torchvision weights (``gw_groups``: MODEL.GW.NUM_GROUPS)."""
    _, depth, num_groups, width_per_group = ARCHS[arch]
    cfg = add_gwdet_config(get_cfg())
    cfg.MODEL.BACKBONE.NAME = "build_gw_resnet_fpn_backbone"
    cfg.MODEL.BACKBONE.FREEZE_AT = 0
    cfg.MODEL.RESNETS.DEPTH = depth
    cfg.MODEL.RESNETS.NUM_GROUPS = num_groups
    cfg.MODEL.RESNETS.WIDTH_PER_GROUP = width_per_group
    cfg.MODEL.RESNETS.STRIDE_IN_1X1 = False
    cfg.MODEL.RESNETS.NORM = "FrozenBN"
    cfg.MODEL.RESNETS.GW_POSITIONS = gw_positions
    cfg.MODEL.GW.NUM_GROUPS = gw_groups
    cfg.MODEL.RESNETS.OUT_FEATURES = list(STAGES)
    cfg.MODEL.FPN.IN_FEATURES = list(STAGES)
    return DetectorStub(build_backbone(cfg, ShapeSpec(channels=3))).eval()


def save_wrapped(state_dict: dict, wrapping: str, path: Path, **save_kwargs) -> Path:
    """Save ``state_dict`` the way ImageNet training scripts do."""
    if wrapping == "bare":
        obj = state_dict
    elif wrapping == "state_dict":
        obj = {"epoch": 90, "arch": "resnet50", "state_dict": state_dict, "best_acc1": 76.1}
    elif wrapping == "model":
        obj = {"model": state_dict}
    else:  # saved from a (Distributed)DataParallel model
        obj = {"state_dict": {f"module.{key}": value for key, value in state_dict.items()}}
    torch.save(obj, path, **save_kwargs)
    return path


def in_memory(state_dict: dict) -> SourceStateDict:
    return SourceStateDict(state_dict, "bare state_dict", "")


@pytest.fixture(scope="module", autouse=True)
def one_cpu_thread():
    """Small convs run fastest single-threaded, by far so when other processes use the CPUs."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def image() -> torch.Tensor:
    return torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(1))


@pytest.fixture(
    scope="module",
    params=[("R-50", ""), ("R-50", "S1-B2"), ("X-50-32x4d", ""), ("X-50-32x4d", "S1-B2")],
    ids=lambda param: f"{param[0]}-{'GW-' + param[1] if param[1] else 'BN'}",
)
def source(request, image):
    """(arch, GW positions, source state dict, its res2..res5 features, a gwdet detector)."""
    arch, positions = request.param
    model = torchvision_model(arch, with_gw=bool(positions))
    features = torchvision_features(model, image)
    return arch, positions, model.state_dict(), features, gwdet_detector(arch, positions)


@pytest.fixture(scope="module")
def r50_files(tmp_path_factory):
    """A torchvision ResNet-50 (BN) and one with GW at S1-B2, saved once for the other tests."""
    folder = tmp_path_factory.mktemp("r50")
    files = {
        name: save_wrapped(torchvision_model("R-50", with_gw).state_dict(), "bare", folder / name)
        for name, with_gw in (("bn.pth", False), ("gw.pth", True))
    }
    yield {name[:2]: path for name, path in files.items()}
    for path in files.values():
        path.unlink()


def config_value(cfg, dotted_key: str):
    """``cfg.MODEL.PIXEL_MEAN`` for ``"MODEL.PIXEL_MEAN"``."""
    node = cfg
    for part in dotted_key.split("."):
        node = node[part]
    return node


def poison(module: nn.Module) -> None:
    """Fill every parameter and buffer with NaN, so that anything a load leaves out shows."""
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            tensor.fill_(float("nan"))


def weights_of(module: torch.nn.Module) -> dict:
    """``module``'s state dict without the settings its GW layers record (converted weights have
    none to give: gwdet.layers.settings_state)."""
    return {key: value for key, value in module.state_dict().items() if not key.endswith("._extra_state")}


@pytest.mark.parametrize("wrapping", WRAPPINGS)
def test_converted_backbone_reproduces_torchvision_features(source, wrapping, image, tmp_path):
    arch, positions, state_dict, expected, detector = source
    src = save_wrapped(state_dict, wrapping, tmp_path / "imagenet.pth")
    out = tmp_path / "converted.pkl"

    report = convert_checkpoint(src, out, arch=arch, gw_positions=positions)
    assert (report.arch, report.gw_positions) == (arch, positions)

    poison(detector.backbone.bottom_up)
    extra = DetectionCheckpointer(detector).load(str(out))
    assert extra["gwdet"] == {
        "arch": arch, "gw_positions": positions, "norm": "BN", "source": src.name,
        "input": {"format": "RGB", "pixel_mean": [123.675, 116.28, 103.53], "pixel_std": [58.395, 57.12, 57.375],
                  "stride_in_1x1": False},
    }
    with open(out, "rb") as f:
        converted = pickle.load(f)["model"]
    loaded = weights_of(detector.backbone.bottom_up)
    assert set(loaded) == set(converted), "every backbone key loaded, nothing left over"
    for key, value in loaded.items():
        assert torch.equal(value, torch.from_numpy(converted[key])), key
    with torch.no_grad():
        features = detector.backbone.bottom_up(image)
    for stage in STAGES:
        torch.testing.assert_close(features[stage], expected[stage], atol=1e-4, rtol=0)
    src.unlink()  # ~100 MB each
    out.unlink()


@pytest.mark.parametrize(
    "config,checkpoint",
    [("faster_rcnn_R_50_FPN_1x_bn.yaml", "bn"), ("faster_rcnn_R_50_FPN_1x_gw.yaml", "gw")],
)
def test_coco_configs_load_every_backbone_weight(r50_files, tmp_path, config, checkpoint):
    cfg = add_gwdet_config(get_cfg())
    cfg.merge_from_file(str(REPO / "configs" / "COCO-Detection" / config))
    cfg.MODEL.DEVICE = "cpu"
    out = tmp_path / "converted.pkl"
    positions = cfg.MODEL.RESNETS.GW_POSITIONS
    report = convert_checkpoint(r50_files[checkpoint], out, arch="R-50", gw_positions=positions)
    for key, value in report.config().items():
        assert config_value(cfg, key) == value, f"{config} sets {key} unlike the report"

    model = build_model(cfg)
    poison(model.backbone.bottom_up)
    DetectionCheckpointer(model).load(str(out))
    with open(out, "rb") as f:
        converted = pickle.load(f)["model"]
    loaded = weights_of(model.backbone.bottom_up)
    assert set(loaded) == set(converted)
    assert all(torch.isfinite(value).all() for value in loaded.values())
    out.unlink()


@pytest.mark.parametrize("legacy_format", [False, True], ids=["zip", "legacy"])
@pytest.mark.parametrize("wrapping", ("bare", "state_dict", "model"))
@pytest.mark.parametrize("prefixed", [False, True], ids=["", "module."])
def test_every_wrapping_is_unwrapped(tmp_path, wrapping, prefixed, legacy_format):
    state_dict = {"conv1.weight": torch.ones(2), "layer1.0.bn2.bias": torch.zeros(2)}
    if prefixed:
        state_dict = {f"module.{key}": value for key, value in state_dict.items()}
    path = save_wrapped(
        state_dict, wrapping, tmp_path / "in.pth", _use_new_zipfile_serialization=not legacy_format
    )
    source = read_source_state_dict(path)
    assert sorted(source.tensors) == ["conv1.weight", "layer1.0.bn2.bias"]
    assert source.stripped_prefix == ("module." if prefixed else "")
    assert source.wrapping == ("bare state_dict" if wrapping == "bare" else f"'{wrapping}' entry")


def test_a_data_parallel_prefix_on_some_names_only_is_named(tmp_path):
    # before: "norm bn1 has ['bias', 'running_var']: neither a BatchNorm ... nor a GW layer"
    state_dict = {"module.conv1.weight": torch.ones(2), "bn1.bias": torch.zeros(2), "bn1.running_var": torch.ones(2)}
    torch.save(state_dict, tmp_path / "mixed.pth")
    with pytest.raises(ConversionError, match=r"1 of the 3 tensors' names start with 'module.' \(the prefix "
                                              r"\(Distributed\)DataParallel adds\), the others do not: "
                                              r"\['module.conv1.weight'\] beside \['bn1.bias', 'bn1.running_var'\]"):
        read_source_state_dict(tmp_path / "mixed.pth")


def test_report_counts_what_was_converted_and_dropped(r50_files):
    weights, report = convert_state_dict(in_memory(torch.load(r50_files["gw"], weights_only=True)))
    assert (report.arch, report.gw_positions, report.gn_style) == ("R-50", "S1-B2", False)
    assert (report.converted_convs, report.converted_bn_norms) == (53, 36)
    assert (report.converted_affine_norms, report.reshaped_affine) == (17, 34)
    assert report.converted_keys == 53 + 36 * 4 + 17 * 2 == len(weights)
    assert report.dropped_classifier == ["fc.bias", "fc.weight"]
    assert report.dropped_num_batches_tracked == 36
    assert weights["res3.0.conv2.norm.weight"].shape == (128,)
    assert "res3.0.conv2.norm.running_mean" not in weights
    text = report.format()
    assert "GW positions  : S1-B2" in text and 'MODEL.RESNETS.GW_POSITIONS: "S1-B2"' in text
    # the GW authors' layers keep no record of their settings: nothing said so, and other counts loaded silently
    # (it named GN's 32 groups for GW weights, and not GW's method: ItN weights fine-tuned in ZCA layers silently)
    assert text.endswith("Not in the weights, so not checked when they load: their GW layers' method, group count, "
                         "iterations and eps (MODEL.RESNETS.GW_NORM, MODEL.GW.NUM_GROUPS, T, EPS). Set them to the "
                         "source model's (the GW paper's ImageNet models whiten by ItN (GW_NORM GW) with 64 groups and "
                         "T 5, gwdet's defaults; check the source's own): other values load without a word into layers "
                         "that compute another function than the source's.")


def test_wrong_depth_is_refused(r50_files, tmp_path):
    out = tmp_path / "out.pkl"
    with pytest.raises(ConversionError) as error:
        convert_checkpoint(r50_files["bn"], out, arch="R-101")
    message = str(error.value)
    assert "--arch R-101" in message and "it is R-50" in message and "[3, 4, 23, 3]" in message
    assert not out.exists()


@pytest.mark.parametrize(
    "checkpoint,requested,inferred,consequence",
    [
        ("bn", "S1-B2", "no position", "BN statistics would go into GW layers at 'S1-B2'"),
        ("gw", "", "'S1-B2'", "GW parameters would go into BN layers at 'S1-B2'"),
        ("gw", "S1-B12", "'S1-B2'", "BN statistics would go into GW layers at 'B1'"),
    ],
)
def test_wrong_gw_positions_are_refused(
    r50_files, tmp_path, checkpoint, requested, inferred, consequence
):
    out = tmp_path / "out.pkl"
    out.write_bytes(b"previous weights")
    with pytest.raises(ConversionError) as error:
        convert_checkpoint(r50_files[checkpoint], out, gw_positions=requested, overwrite=True)
    message = str(error.value)
    assert f"--gw-positions {requested!r}" in message
    assert f"has GW (norms without running statistics) at {inferred}" in message
    assert consequence in message
    assert out.read_bytes() == b"previous weights", "a failed conversion leaves the output alone"
    assert os.listdir(tmp_path) == ["out.pkl"], "no temporary file left behind"


def test_gw_in_some_blocks_only_is_refused():
    state_dict = torchvision_model("R-50", with_gw=False).state_dict()
    for leaf in ("running_mean", "running_var", "num_batches_tracked"):
        del state_dict[f"layer3.2.bn2.{leaf}"]
    with pytest.raises(ConversionError, match="inconsistent GW positions: 1 of 16 norms at B2"):
        convert_state_dict(in_memory(state_dict))


def test_checkpoint_without_any_statistics_is_gn_style():
    state_dict = torchvision_model("R-50", with_gw=False).state_dict()
    for key in [k for k in state_dict if k.endswith(("running_mean", "running_var"))]:
        del state_dict[key]
    weights, report = convert_state_dict(in_memory(state_dict), gw_positions="")
    assert report.gn_style and report.gw_positions == "" and report.converted_affine_norms == 53
    assert report.config()["MODEL.RESNETS.NORM"] == "GN"
    # the reason named BN statistics, which a GN-style file has none of
    with pytest.raises(ConversionError, match=r"statistics\) at no position, so GN parameters would go into GW "
                                              r"layers at 'S1-B2'"):
        convert_state_dict(in_memory(state_dict), gw_positions="S1-B2")


def test_incomplete_checkpoint_is_refused():
    state_dict = torchvision_model("R-50", with_gw=False).state_dict()
    del state_dict["layer2.1.conv3.weight"]
    with pytest.raises(ConversionError, match=r"does not fit R-50.*1 missing: \['res3.1.conv3"):
        convert_state_dict(in_memory(state_dict))


def test_basic_block_resnet_is_refused():
    state_dict = torchvision.models.resnet18(weights=None).state_dict()
    with pytest.raises(ConversionError, match=r"basic-block ResNet .*converts the bottleneck architectures of the papers. "
                                              r"models only .*gwdet builds ResNet-18/34 backbones, with GW at S1, B1"):
        convert_state_dict(in_memory(state_dict))


def test_unexpected_keys_fail_unless_allowed(r50_files):
    state_dict = torch.load(r50_files["bn"], weights_only=True)
    state_dict["layer1.0.se.fc1.weight"] = torch.zeros(4, 256)
    with pytest.raises(ConversionError, match=r"layer1\.0\.se\.fc1\.weight.*--allow-unexpected"):
        convert_state_dict(in_memory(state_dict))
    weights, report = convert_state_dict(in_memory(state_dict), allow_unexpected=True)
    assert report.unexpected == ["layer1.0.se.fc1.weight"]
    assert "unexpected    : 1 dropped" in report.format()
    assert not any(".se." in key for key in weights)


@pytest.mark.parametrize("legacy_format", [False, True], ids=["zip", "legacy"])
def test_unsafe_pickle_is_refused_unless_allowed(r50_files, tmp_path, legacy_format):
    state_dict = torch.load(r50_files["bn"], weights_only=True)
    src = tmp_path / "with_args.pth"
    checkpoint = {"state_dict": state_dict, "args": argparse.Namespace(lr=0.1)}
    torch.save(checkpoint, src, _use_new_zipfile_serialization=not legacy_format)
    out = tmp_path / "out.pkl"
    with pytest.raises(ConversionError) as error:
        convert_checkpoint(src, out)
    message = str(error.value)
    assert "argparse.Namespace" in message and "arbitrary code" in message
    assert "--allow-unsafe-pickle" in message and not out.exists()
    report = convert_checkpoint(src, out, allow_unsafe_pickle=True)
    assert report.wrapping == "'state_dict' entry" and out.exists()
    src.unlink()
    out.unlink()


def test_pickled_module_needs_the_unsafe_flag(tmp_path):
    src = tmp_path / "module.pth"
    torch.save(nn.Sequential(nn.Conv2d(3, 4, 1)), src)
    with pytest.raises(ConversionError, match="torch.nn.modules"):
        read_source_state_dict(src)
    source = read_source_state_dict(src, allow_unsafe_pickle=True)
    assert source.wrapping == "pickled nn.Module"
    assert sorted(source.tensors) == ["0.bias", "0.weight"]


@pytest.mark.parametrize("legacy_format", [False, True], ids=["zip", "legacy"])
def test_truncated_file_is_refused(tmp_path, legacy_format):
    src = tmp_path / "in.pth"
    weights = {"conv1.weight": torch.zeros(64, 3, 7, 7)}
    torch.save(weights, src, _use_new_zipfile_serialization=not legacy_format)
    src.write_bytes(src.read_bytes()[: src.stat().st_size // 2])
    with pytest.raises(ConversionError, match="truncated or corrupted"):
        convert_checkpoint(src, tmp_path / "out.pkl")


@pytest.mark.parametrize(
    "content,expected",
    [
        (b"conv1.weight 0.1 0.2\n", "not a PyTorch checkpoint"),
        (b"", "the file is empty"),
        ({"epoch": 90, "arch": "resnet50"}, r"no state dict found.*'epoch', 'arch'"),
        ({"weight": torch.zeros(3)}, "not a torchvision-layout ResNet"),
        # no hint: a detectron2 model's weights need no conversion; a compiled model's carry _orig_mod.
        ({"backbone.bottom_up.stem.conv1.weight": torch.zeros(3)},
         r"detectron2 model's weights, which need no conversion: give the file as MODEL.WEIGHTS"),
        ({"_orig_mod.conv1.weight": torch.zeros(3)}, r"torch.compile'd model's weights: save the uncompiled module's"),
        # a torchvision Faster R-CNN's: "not a torchvision-layout ResNet" only, after the train tool sent it here
        ({"backbone.body.conv1.weight": torch.zeros(3), "rpn.head.conv.0.0.weight": torch.zeros(3)},
         r"torchvision detection model's weights \(its ResNet under 'backbone.body.', .*save it on its own "
         r"\(\{key.removeprefix\('backbone.body.'\): value"),
    ],
    ids=["text", "empty", "dict-without-tensors", "other-network", "detectron2-weights", "compiled",
         "torchvision-detection"],
)
def test_non_checkpoint_files_are_refused(tmp_path, content, expected):
    src = tmp_path / "input.pth"
    if isinstance(content, bytes):
        src.write_bytes(content)
    else:
        torch.save(content, src)
    with pytest.raises(ConversionError, match=expected):
        convert_checkpoint(src, tmp_path / "out.pkl")
    assert os.listdir(tmp_path) == ["input.pth"]


def test_bad_paths_are_refused(r50_files, tmp_path):
    with pytest.raises(ConversionError, match="no such file"):
        convert_checkpoint(tmp_path / "missing.pth", tmp_path / "out.pkl")
    with pytest.raises(ConversionError, match="not a regular file"):
        convert_checkpoint(tmp_path, tmp_path / "out.pkl")
    with pytest.raises(ConversionError, match="must end with .pkl"):
        convert_checkpoint(r50_files["bn"], tmp_path / "out.pth")
    with pytest.raises(ConversionError, match="does not exist"):
        convert_checkpoint(r50_files["bn"], tmp_path / "no" / "out.pkl")
    # before: a folder named .pkl was advised --overwrite, then "Is a directory"; a dangling link was converted,
    # then "written by another conversion while this one ran"
    (tmp_path / "dir.pkl").mkdir()
    with pytest.raises(ConversionError, match=r"dir.pkl is a folder: give the path of the .pkl file to write"):
        convert_checkpoint(r50_files["bn"], tmp_path / "dir.pkl", overwrite=True)
    (tmp_path / "dangling.pkl").symlink_to(tmp_path / "nowhere" / "x.pkl")
    with pytest.raises(ConversionError, match=r"dangling.pkl is a link to .*nowhere/x.pkl, which does not exist; "
                                              r"nothing was converted"):
        convert_checkpoint(r50_files["bn"], tmp_path / "dangling.pkl")


def test_flags_that_are_not_bools_and_odd_paths_are_refused_before_anything_is_replaced(r50_files, tmp_path):
    existing = tmp_path / "existing.pkl"
    existing.write_bytes(b"the user's weights")
    for flag in ("overwrite", "allow_unexpected", "allow_unsafe_pickle"):
        with pytest.raises(ValueError, match=f"convert_checkpoint: {flag} must be True or False, got 'no'"):
            convert_checkpoint(r50_files["bn"], existing, **{flag: "no"})
    assert existing.read_bytes() == b"the user's weights"
    with pytest.raises(ConversionError, match=r"output_path must be a str or os.PathLike path, got b'out.pkl'"):
        convert_checkpoint(r50_files["bn"], b"out.pkl")
    with pytest.raises(ConversionError, match="source must be a SourceStateDict .*got dict"):
        convert_state_dict({"conv1.weight": torch.zeros(1)})


@pytest.mark.parametrize("damage, expected", [
    (lambda sd: sd["layer1.0.conv1.weight"].view(-1)[3:5].fill_(float("nan")),
     r"res2.0.conv1.weight holds 2 non-finite value\(s\) \(NaN or inf\)"),
    (lambda sd: sd["bn1.running_var"].fill_(-1.0), r"bn1.running_var holds 64 negative value\(s\)"),
], ids=["nan-weight", "negative-variance"])
def test_damaged_weights_are_refused(tmp_path, damage, expected):
    state_dict = torchvision_model("R-50", with_gw=False).state_dict()
    damage(state_dict)
    with pytest.raises(ConversionError, match=expected):
        convert_state_dict(in_memory(state_dict))


def test_a_torchscript_model_is_named_as_such(tmp_path):
    src = tmp_path / "model.ts"
    torch.jit.save(torch.jit.script(nn.Linear(2, 2)), src)
    with pytest.raises(ConversionError, match="a TorchScript model .*torch.jit.save.*not a checkpoint"):
        convert_checkpoint(src, tmp_path / "out.pkl")


@pytest.mark.parametrize(
    "request_,expected",
    [({"arch": "R-152"}, "unknown architecture 'R-152'"), ({"gw_positions": "S1-B4"}, "'B4'")],
)
def test_bad_requests_are_refused_before_reading(tmp_path, request_, expected):
    with pytest.raises(ConversionError, match=expected):
        convert_checkpoint(tmp_path / "missing.pth", tmp_path / "out.pkl", **request_)


def run_tool(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(TOOL), *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=300)


def test_command_line(r50_files, tmp_path):
    out = tmp_path / "R-50-GW.pkl"
    done = run_tool(str(r50_files["gw"]), str(out), "--arch", "R-50", "--gw-positions", "S1-B2")
    assert done.returncode == 0, done.stderr
    assert "architecture  : R-50; inferred, matches --arch" in done.stdout
    assert "17 GW norms" in done.stdout and "STRIDE_IN_1X1: False" in done.stdout
    out.unlink()

    refused = run_tool(str(r50_files["bn"]), str(out), "--arch", "X-101-32x8d")
    assert refused.returncode == 2
    assert "does not fit --arch X-101-32x8d" in refused.stderr
    assert "Traceback" not in refused.stderr and not out.exists()


@pytest.mark.parametrize("override, named", [
    (("INPUT.FORMAT", "BGR"), "INPUT.FORMAT is 'BGR', the weights expect 'RGB'"),
    (("MODEL.PIXEL_MEAN", [103.53, 116.28, 123.675]), "MODEL.PIXEL_MEAN is [103.53, 116.28, 123.675]"),
    (("MODEL.PIXEL_STD", [1.0, 1.0, 1.0]), "MODEL.PIXEL_STD is [1.0, 1.0, 1.0]"),
    (("MODEL.RESNETS.STRIDE_IN_1X1", True), "MODEL.RESNETS.STRIDE_IN_1X1 is True, the weights expect False"),
])
def test_converted_weights_refuse_a_model_fed_other_inputs(r50_files, tmp_path, override, named):
    from gwdet.checkpoint.resilient import ResilientCheckpointer

    cfg = add_gwdet_config(get_cfg())
    cfg.merge_from_file(str(REPO / "configs" / "COCO-Detection" / "faster_rcnn_R_50_FPN_1x_bn.yaml"))
    cfg.MODEL.DEVICE = "cpu"
    out = tmp_path / "converted.pkl"
    convert_checkpoint(r50_files["bn"], out, arch="R-50", gw_positions="")
    ResilientCheckpointer(build_model(cfg)).load(str(out))  # the config the converter reports: loads
    key, value = override
    cfg.merge_from_list([key, value])
    with pytest.raises(ValueError, match=re.escape(named) + r".*configs/Base-RCNN-FPN.yaml sets all of them"):
        ResilientCheckpointer(build_model(cfg)).load(str(out))


def _dead_pid() -> int:
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)


def test_partial_files_of_a_killed_conversion_into_the_output_are_removed(r50_files, tmp_path, caplog):
    dead, alive = _dead_pid(), os.getpid()
    stale = tmp_path / f".out.pkl.{dead}.0123456789ab.partial"
    other_output = tmp_path / f".other.pkl.{dead}.0123456789ab.partial"  # another conversion's: not this one's to judge
    running = tmp_path / f".out.pkl.{alive}.ba9876543210.partial"
    for path in (stale, other_output, running):
        path.write_bytes(b"half a conversion")
    with caplog.at_level("WARNING", logger="gwdet.utils.atomic"):
        convert_checkpoint(r50_files["bn"], tmp_path / "out.pkl")
    assert not stale.exists() and other_output.exists() and running.exists()
    assert f"Removed 1 partial file(s) an interrupted conversion left in {tmp_path}: {stale.name}" in caplog.text


def test_of_two_conversions_into_one_new_output_exactly_one_succeeds(r50_files, tmp_path):
    import threading

    out, outcomes = tmp_path / "out.pkl", {}

    def convert(name: str) -> None:
        try:
            outcomes[name] = convert_checkpoint(r50_files[name], out).arch
        except ConversionError as error:
            outcomes[name] = str(error)

    threads = [threading.Thread(target=convert, args=(name,)) for name in ("bn", "gw")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    succeeded = [name for name, outcome in outcomes.items() if outcome == "R-50"]
    assert len(succeeded) == 1, outcomes
    (refused,) = [outcome for outcome in outcomes.values() if outcome != "R-50"]
    assert re.search(r"out.pkl (already exists; it is left as it is|was written by another conversion while this one "
                     r"ran; it is left as it is and this conversion's output discarded)\..*--overwrite", refused), refused
    positions = read_conversion_metadata(load_pickle_file(str(out), False, ""))["gw_positions"]
    assert positions == ("S1-B2" if succeeded == ["gw"] else ""), "the file is the successful conversion's"
    assert sorted(os.listdir(tmp_path)) == ["out.pkl"], "the refused conversion leaves no partial file"


def test_of_two_conversions_replacing_one_output_the_second_to_finish_is_refused(r50_files, tmp_path, monkeypatch):
    # two --overwrite conversions (R-50, X-50) into one existing .pkl at once: both said "Converted", the file held one
    import gwdet.convert.converter as converter

    out = tmp_path / "out.pkl"
    out.write_bytes(b"an earlier conversion")
    writes = []
    write = converter.write_detectron2_pkl

    def another_conversion_finishes_first(*args, **kwargs):  # as when both read the output before either wrote it
        if not writes:
            writes.append("other")
            convert_checkpoint(r50_files["gw"], out, overwrite=True)
        return write(*args, **kwargs)

    monkeypatch.setattr(converter, "write_detectron2_pkl", another_conversion_finishes_first)
    with pytest.raises(ConversionError) as refused:
        convert_checkpoint(r50_files["bn"], out, overwrite=True)
    assert str(refused.value) == (
        f"{out} was written by another conversion while this one ran; it is left as it is and this conversion's "
        "output discarded. Check which conversion you want there; run this conversion again to replace it, or choose "
        "another output file.")
    metadata = read_conversion_metadata(load_pickle_file(str(out), False, ""))
    assert metadata["gw_positions"] == "S1-B2", "the file is the conversion that finished first"
    assert sorted(os.listdir(tmp_path)) == ["out.pkl"], "the refused conversion leaves no partial file"
    convert_checkpoint(r50_files["bn"], out, overwrite=True)  # run again: replaces it
    assert read_conversion_metadata(load_pickle_file(str(out), False, ""))["gw_positions"] == ""


def test_a_gwdet_layers_recorded_settings_travel_into_the_converted_weights(tmp_path):
    # they were called keys outside torchvision's layout; dropped (--allow-unexpected), the weights of a 16-group
    # GW loaded into the config's 64 groups without a word
    import gwdet
    from gwdet.checkpoint.resilient import ResilientCheckpointer

    model = torchvision_model("R-50", with_gw=False)
    model.bn1 = gwdet.norm("GW", num_groups=16)(model.bn1.num_features)
    for layer in (model.layer1, model.layer2, model.layer3, model.layer4):
        for block in layer:
            block.bn2 = gwdet.norm("GW", num_groups=16)(block.bn2.num_features)
    weights, report = convert_state_dict(in_memory(model.state_dict()))
    assert report.gw_positions == "S1-B2" and report.settings_records == 17 and not report.unexpected
    assert {report.config()[key] for key in ("MODEL.GW.NUM_GROUPS", "MODEL.GW.T")} == {16, 5}
    assert "17 gwdet norm layers' recorded settings carried" in report.format()
    assert "Not in the weights" not in report.format()  # recorded, and checked as they load
    path = tmp_path / "gw16.pkl"
    path.write_bytes(pickle.dumps({"model": weights, "__author__": "test", "matching_heuristics": True}))
    ResilientCheckpointer(gwdet_detector("R-50", "S1-B2", gw_groups=16)).load(str(path))
    # refused before loading, one line in the tools (was torch's RuntimeError listing all 17 layers, a traceback)
    with pytest.raises(GwdetValueError, match=r"The checkpoint was trained with other norm hyper-parameters than this "
                                              r"config gives its layers \(17 values, e.g. backbone.bottom_up.stem.conv1.norm "
                                              r"num_groups 16 -> 64"):
        ResilientCheckpointer(gwdet_detector("R-50", "S1-B2", gw_groups=64)).load(str(path))


def _gw16_resnet() -> nn.Module:
    """A torchvision ResNet-50 with gwdet's GW layers of 16 groups at S1-B2, BN elsewhere."""
    import gwdet

    model = torchvision_model("R-50", with_gw=False)
    model.bn1 = gwdet.norm("GW", num_groups=16)(model.bn1.num_features)
    for layer in (model.layer1, model.layer2, model.layer3, model.layer4):
        for block in layer:
            block.bn2 = gwdet.norm("GW", num_groups=16)(block.bn2.num_features)
    return model


def test_the_tool_writes_gwdet_layers_settings_records_and_the_printed_config_loads_them(tmp_path, capsys):
    # write_detectron2_pkl refused the records convert_state_dict adds ("dtype uint8 ... dequantized values"), rc 2
    from gwdet.checkpoint.resilient import ResilientCheckpointer
    from gwdet.convert.cli import main
    from gwdet.layers.settings_state import decode_settings

    model = _gw16_resnet()
    src, out = tmp_path / "gw16.pth", tmp_path / "gw16.pkl"
    torch.save(model.state_dict(), src)
    assert main([str(src), str(out), "--arch", "R-50", "--gw-positions", "S1-B2"]) == 0
    printed = capsys.readouterr().out
    assert "17 gwdet norm layers' recorded settings carried" in printed and "MODEL.GW.NUM_GROUPS: 16" in printed
    weights = load_pickle_file(str(out), False, "")["model"]
    records = {key: decode_settings(value) for key, value in weights.items() if key.endswith("._extra_state")}
    assert len(records) == 17 and records["stem.conv1.norm._extra_state"]["num_groups"] == 16
    # the GW config with the printed keys: loads, GW layers of 16 groups holding the source's weights
    cfg = add_gwdet_config(get_cfg())
    cfg.merge_from_file(str(REPO / "configs" / "COCO-Detection" / "faster_rcnn_R_50_FPN_1x_gw.yaml"))
    cfg.MODEL.DEVICE = "cpu"
    for line in printed.split("Config for these weights:\n")[1].splitlines():
        key, _, value = line.strip().partition(": ")
        cfg.merge_from_list([key, value])
    detector = build_model(cfg).eval()
    ResilientCheckpointer(detector).load(str(out))
    stem_norm = detector.backbone.bottom_up.stem.conv1.norm
    assert stem_norm.num_groups == 16
    assert torch.equal(stem_norm.weight, model.bn1.weight) and torch.equal(stem_norm.bias, model.bn1.bias)
    # the records are read back as the weights load: a model of other settings is refused
    cfg.merge_from_list(["MODEL.GW.NUM_GROUPS", 64])
    with pytest.raises(GwdetValueError, match=r"The checkpoint was trained with other norm hyper-parameters than this "
                                              r"config gives its layers \(17 values, e.g. backbone.bottom_up.stem.conv1.norm "
                                              r"num_groups 16 -> 64"):
        ResilientCheckpointer(build_model(cfg)).load(str(out))
    # the same through the library's convert_checkpoint
    report = convert_checkpoint(src, tmp_path / "api.pkl", arch="R-50", gw_positions="S1-B2")
    assert report.settings_records == 17 and report.config()["MODEL.GW.NUM_GROUPS"] == 16
    assert load_pickle_file(str(tmp_path / "api.pkl"), False, "")["model"].keys() == weights.keys()


def test_the_writer_refuses_other_integer_arrays_beside_the_settings_records(tmp_path):
    # an integer array under '._extra_state' that is no settings record was refused as a weight to dequantize
    import numpy as np

    from gwdet.convert import write_detectron2_pkl

    weights, _ = convert_state_dict(in_memory(_gw16_resnet().state_dict()))
    out = tmp_path / "out.pkl"
    for key, value, named in [
        ("stem.conv1.norm._extra_state", np.zeros(512, np.uint8), r"dtype uint8 and shape \[512\], not the settings "
                                                                   r"record a gwdet norm layer writes"),
        ("stem.conv1.norm._extra_state", weights["stem.conv1.norm._extra_state"][:256], r"dtype uint8 and shape \[256\], not the"),
        ("stem.conv1.norm._extra_state", weights["stem.conv1.norm._extra_state"].astype(np.int64),
         r"dtype int64 and shape \[512\], not the settings record"),
        ("res2.0.conv1.weight", weights["res2.0.conv1.weight"].astype(np.uint8), r"dtype uint8, but weights are floating"),
    ]:
        with pytest.raises(ConversionError, match=r"^write_detectron2_pkl: weights\[" + re.escape(repr(key)) + r"\] is a "
                                                  r"numpy array of " + named + r".*nothing was written\.$"):
            write_detectron2_pkl({**weights, key: value}, out, author="test")
        assert not out.exists()
    write_detectron2_pkl(weights, out, author="test")  # the records as convert_state_dict gives them
    assert out.exists()


def test_the_command_lines_paths_expand_a_tilde_the_shell_left(monkeypatch, tmp_path):
    # OUT=~/x.pkl from a script: the advice was to create a folder named ~
    from gwdet.convert.cli import argument_parser

    monkeypatch.setenv("HOME", str(tmp_path))
    args = argument_parser().parse_args(["~/r50.pth", "~/r50.pkl"])
    assert (args.input, args.output) == (str(tmp_path / "r50.pth"), str(tmp_path / "r50.pkl"))


def test_a_state_dict_in_memory_is_named_with_the_ways_to_convert_it(tmp_path):
    # a notebook's convert_checkpoint(model.state_dict(), ...): os.fspath's raw TypeError
    from gwdet.convert import ConversionError, SourceStateDict, convert_state_dict, write_detectron2_pkl

    state_dict = torchvision_model("R-50", False).state_dict()
    with pytest.raises(ConversionError, match=r"^convert_checkpoint: input_path is a state dict, not a file's path: "
                                              r"torch.save\(state_dict, path\) and give that path, or convert it in "
                                              r"memory with gwdet.convert.convert_state_dict\(SourceStateDict\("):
        convert_checkpoint(state_dict, tmp_path / "out.pkl")
    assert not (tmp_path / "out.pkl").exists()
    # the way it names, as written
    weights, _ = convert_state_dict(SourceStateDict(tensors=state_dict, wrapping="bare state_dict", stripped_prefix=""))
    write_detectron2_pkl(weights, tmp_path / "out.pkl", author="test")
    assert (tmp_path / "out.pkl").stat().st_size > 1000


@pytest.mark.parametrize("norm_layer, held", [
    (None, "running mean 0 and variance 1 in every batch norm"),
    (lambda channels: nn.GroupNorm(32, channels), "an affine weight of ones and a bias of zeros in every norm"),
], ids=["batch norm", "group norm"])
def test_a_resnet_that_was_never_trained_is_refused(norm_layer, held):
    # torchvision.models.resnet50() saved without weights=: converted and fine-tuned from without a word
    model = torchvision.models.resnet50(**({"norm_layer": norm_layer} if norm_layer else {}))
    with pytest.raises(ConversionError, match=rf"holds the weights of a ResNet that was never trained \({held}, as a "
                                              r"model is built\).*resnet50\(weights='IMAGENET1K_V1'\)"):
        convert_state_dict(in_memory(model.state_dict()))
    with torch.no_grad():  # one layer that learned something is a trained model's
        next(m for m in model.modules() if isinstance(m, (nn.BatchNorm2d, nn.GroupNorm))).bias.add_(0.5)
    if norm_layer is not None:
        convert_state_dict(in_memory(model.state_dict()))


def test_an_output_below_a_file_is_named_so(r50_files, tmp_path):
    # "folder .../R-50.pkl does not exist. Create it first.", which the file of that name keeps one from doing
    (tmp_path / "R-50.pkl").write_bytes(b"converted before")
    with pytest.raises(ConversionError, match=rf"{tmp_path / 'R-50.pkl'} is a file, not a folder: give the output a "
                                              r"path in a folder"):
        convert_checkpoint(r50_files["bn"], tmp_path / "R-50.pkl" / "deeper" / "x.pkl")
    assert (tmp_path / "R-50.pkl").read_bytes() == b"converted before"


@pytest.mark.parametrize("prefix", ["encoder.", "model.encoder."])
def test_a_resnet_under_one_prefix_is_named_with_the_line_that_strips_it(r50_files, tmp_path, capsys, prefix):
    # every key under 'encoder.': "not a torchvision-layout ResNet/ResNeXt ... found ['encoder.conv1.weight', ...]"
    # without a word on the prefix (a torchvision detection model's 'backbone.body.' got the line that strips it)
    from gwdet.convert.cli import main
    from gwdet.convert.torchvision_keys import shared_layout_prefix

    weights = {prefix + key: value for key, value in torch.load(r50_files["bn"], weights_only=True).items()}
    src, out = tmp_path / "enc.pth", tmp_path / "enc.pkl"
    torch.save(weights, src)
    assert main([str(src), str(out)]) == 2
    printed = capsys.readouterr().err
    line = f"{{key.removeprefix({prefix!r}): value for key, value in weights.items()}}"
    assert (f"not a torchvision-layout ResNet/ResNeXt: expected keys like 'conv1.weight', 'bn1.running_mean', "
            f"'layer1.0.conv2.weight', 'layer1.0.downsample.0.weight' (after removing 'module.' prefixes), found "
            f"['{prefix}conv1.weight', ") in printed
    assert (f"Every key is under the prefix {prefix!r}, before a torchvision layout: save the weights without it "
            f"({line}) and convert that file with tools/convert_pretrained.py.") in printed
    assert not out.exists()
    # the line as printed gives a file that converts
    torch.save(eval(line, {"weights": weights}), src)
    assert main([str(src), str(out), "--arch", "R-50", "--gw-positions", ""]) == 0 and out.exists()
    # keys of another network beside them: not one prefix to strip
    assert shared_layout_prefix([*weights, "decoder.conv.weight"]) is None and shared_layout_prefix(weights) == prefix



def test_verbose_shows_the_traceback_of_a_conversion_refusal(r50_files, tmp_path, capsys):
    # before: --verbose printed only "convert_pretrained.py: error: ..." (the tool caught its refusals itself)
    from gwdet.convert.cli import main

    out = tmp_path / "R-50.pkl"
    out.write_bytes(b"converted before")
    assert main([str(r50_files["bn"]), str(out)]) == 2
    printed = capsys.readouterr().err
    assert re.search(r": error: .*R-50.pkl already exists; it is left as it is", printed)
    assert printed.rstrip().endswith(": --verbose shows the Python traceback of this error")
    for argv in ([str(r50_files["bn"]), str(out), "--verbose"], ["--verbose", str(r50_files["bn"]), str(out)]):
        with pytest.raises(ConversionError, match=r"R-50.pkl already exists; it is left as it is"):
            main(argv)
    assert out.read_bytes() == b"converted before"
    with pytest.raises(SystemExit) as usage:  # argparse's usage errors stay its own
        main([str(r50_files["bn"])])
    assert usage.value.code == 2


def test_an_output_with_a_variable_nothing_expanded_is_refused(r50_files, tmp_path, monkeypatch, capsys):
    # before: "folder .../$HOME does not exist. Create it first."; with a folder '$HOME' there, written into it
    from gwdet.convert.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", "/home/someone")
    (tmp_path / "$HOME").mkdir()
    assert main([str(r50_files["bn"]), "$HOME/w.pkl"]) == 2
    assert ("error: OUT '$HOME/w.pkl' holds '$HOME', an environment variable that nothing expanded (a quoted "
            "command-line value and a config file keep it as it is): the run would write into a folder named '$HOME'. "
            "Let the shell expand it (double quotes), or give the path itself (OUT /home/someone/w.pkl); nothing was "
            "written.") in capsys.readouterr().err
    with pytest.raises(ConversionError, match=r"^output_path '\$HOME/w.pkl' holds '\$HOME', an environment variable "
                                              r"that nothing expanded .*\(output_path=/home/someone/w.pkl\); nothing "
                                              r"was written.$"):
        convert_checkpoint(r50_files["bn"], "$HOME/w.pkl")
    assert os.listdir(tmp_path / "$HOME") == []


def test_a_deep_stem_resnet_is_named_as_one_gwdets_backbone_has_no_place_for():
    # before: "not a torchvision-layout ResNet/ResNeXt: expected keys like 'conv1.weight', 'bn1.running_mean' ...,
    # found ['layer1.0.conv1.weight', ...]", naming neither the deep stem's keys nor that it cannot be converted
    state_dict = {key: value for key, value in torchvision_model("R-50", False).state_dict().items()
                  if not key.startswith("conv1.")}
    stem = {"conv1.0.weight": (32, 3, 3, 3), "conv1.3.weight": (32, 32, 3, 3), "conv1.6.weight": (64, 32, 3, 3)}
    state_dict.update({key: torch.randn(shape) for key, shape in stem.items()})
    for index in (1, 4):  # the stem's batch norms, between its convs (timm's resnet50d)
        state_dict.update({f"conv1.{index}.{leaf}": torch.rand(32) for leaf in ("weight", "bias", "running_mean",
                                                                                 "running_var")})
    with pytest.raises(ConversionError, match=r"^conv1.weight is missing, and 3 stem convs stand in its place "
                                              r"\(conv1.0.weight 32x3x3x3, conv1.3.weight 32x32x3x3, conv1.6.weight "
                                              r"64x32x3x3\): a deep stem, as timm's resnet50d and other ResNet-C/D "
                                              r"models have. gwdet's backbone \(detectron2's ResNet\) has a single 7x7 "
                                              r"stem conv, so these weights cannot be converted into it. Convert a "
                                              r"torchvision-layout ResNet/ResNeXt \(one 7x7 conv1"):
        convert_state_dict(in_memory(state_dict))


@pytest.mark.parametrize("flags, given", [(["--arch", "R-101", "--arch", "R-50"], "R-101, R-50"),
                                          (["--gw-positions", "", "--gw-positions", "S1-B2"], ", S1-B2")])
def test_a_flag_of_the_converter_given_twice_is_refused(tmp_path, capsys, flags, given):
    # the converter took the last --arch and said the weights "match --arch": the first check asked for was dropped
    from gwdet.convert.cli import main

    with pytest.raises(SystemExit) as stopped:
        main([str(tmp_path / "in.pth"), str(tmp_path / "out.pkl"), *flags])
    assert stopped.value.code == 2
    assert (f"error: {flags[0]} is given more than once; a second one would replace the first. Give it once, with the "
            f"value you mean (given: {given}).") in capsys.readouterr().err
    assert not (tmp_path / "out.pkl").exists()


def gwdet_norm_resnet50(norm: str, **params) -> dict:
    """The state dict of a torchvision ResNet-50 built with ``gwdet.norm(norm, **params)`` everywhere."""
    import gwdet

    torch.manual_seed(0)
    return torchvision.models.resnet50(weights=None, norm_layer=gwdet.norm(norm, **params)).state_dict()


# BGN (eval_example_weight 0.5) weights were reported as BN with a FrozenBN config, another function
@pytest.mark.parametrize("norm, params", [("BGN", {"eval_example_weight": 0.5}), ("BGN", {})])
def test_a_resnet_of_gwdet_batch_group_norms_is_refused_naming_the_layer(norm, params):
    state_dict = gwdet_norm_resnet50(norm, **params)
    with pytest.raises(ConversionError, match=r"53 of the 53 norms are gwdet BatchGroupNorm layers, by the settings "
                                              r"they recorded \(e\.g\. bn1: BatchGroupNorm\(num_channels=64, .*"
                                              r"nothing was converted\. Convert a ResNet trained with BN or GN"):
        convert_state_dict(in_memory(state_dict))


# GW / GW_ZCA everywhere were reported as a GN-style model ("53 GN norms", MODEL.RESNETS.NORM GN)
@pytest.mark.parametrize("norm, params", [("GW", {"num_groups": 16}), ("GW_ZCA", {})])
def test_a_resnet_of_gw_everywhere_is_refused_not_called_gn_style(norm, params):
    state_dict = gwdet_norm_resnet50(norm, **params)
    with pytest.raises(ConversionError, match=r"no norm of the checkpoint has running statistics, and 53 of the 53 "
                                              r"are gwdet GroupWhitening layers.*the shortcuts among them "
                                              r"\(\['layer1\.0\.downsample\.1'.*GroupNorm layers, another function, "
                                              r"so nothing was converted"):
        convert_state_dict(in_memory(state_dict))


# BW weights: "neither a BatchNorm nor a GW layer ... incomplete or not a torchvision-layout ResNet"
def test_a_resnet_of_batch_whitening_is_refused_as_bw():
    state_dict = gwdet_norm_resnet50("BW")
    with pytest.raises(ConversionError, match=r"53 of the 53 norms are gwdet BatchWhitening layers"):
        convert_state_dict(in_memory(state_dict))
    state_dict = {key: value for key, value in state_dict.items() if not key.endswith("._extra_state")}
    with pytest.raises(ConversionError, match=re.escape(
            "norm bn1 has ['bias', 'running_mean', 'running_whitening', 'weight']: a batch whitening (BW) layer's "
            "state, whose running_whitening is the whitening matrix")):
        convert_state_dict(in_memory(state_dict))


# every layer3.2.* key left out was refused as an "unsupported architecture" with blocks per stage [3, 4, 5, 3]
def test_a_resnet_missing_a_whole_block_is_named_incomplete():
    state_dict = torchvision_model("R-50", with_gw=False).state_dict()
    state_dict = {key: value for key, value in state_dict.items() if not key.startswith("layer3.2.")}
    with pytest.raises(ConversionError, match=re.escape(
            "the checkpoint misses block layer3.2: layer3 has blocks 0, 1, 3, 4, 5, and a torchvision ResNet numbers "
            "the blocks of a stage from 0 without gaps, so the file is incomplete (no key of that block is in it)")):
        convert_state_dict(in_memory(state_dict))


# an .npz was called "truncated or corrupted (NotACheckpointError: ... a NumPy .npz, say) ... download or save it again"
def test_a_numpy_npz_is_named_with_the_line_that_saves_it_as_a_checkpoint(tmp_path):
    import numpy as np

    src = tmp_path / "r50.npz"
    np.savez(src, **{"conv1.weight": np.zeros((64, 3, 7, 7), np.float32)})
    with pytest.raises(ConversionError) as error:
        convert_checkpoint(src, tmp_path / "out.pkl")
    assert str(error.value) == (
        f"{src}: a NumPy .npz archive (np.savez's zip of .npy arrays), not a file written by torch.save (whose zip "
        "holds a data.pkl); nothing was converted. Save its arrays as a state dict of torch tensors, "
        f"torch.save({{name: torch.from_numpy(array) for name, array in numpy.load({str(src)!r}).items()}}, "
        "'weights.pth'), and convert that file.")
    assert os.listdir(tmp_path) == ["r50.npz"]
    other = tmp_path / "other.pth"  # a zip of other files: no data.pkl either
    with zipfile.ZipFile(other, "w") as archive:
        archive.writestr("weights.txt", "conv1.weight 0.1")
    with pytest.raises(ConversionError, match=re.escape(
            f"{other}: a zip archive, but not one written by torch.save (no data.pkl inside); nothing was converted.")):
        convert_checkpoint(other, tmp_path / "out.pkl")


# a pickle.dump'ed state dict "does not start like a file written by torch.save (a zip archive or a pickle)",
# with --allow-unsafe-pickle too
@pytest.mark.parametrize("protocol", [2, pickle.DEFAULT_PROTOCOL])
def test_a_plain_pickle_of_tensors_needs_the_unsafe_flag_and_converts_with_it(r50_files, tmp_path, protocol):
    src = tmp_path / "r50_plainpickle.pth"
    with open(src, "wb") as file:
        pickle.dump(torch.load(r50_files["bn"], weights_only=True), file, protocol=protocol)
    out = tmp_path / "out.pkl"
    with pytest.raises(ConversionError, match=re.escape(
            f"{src}: a plain pickle (written by pickle.dump, not torch.save), naming ")) as error:
        convert_checkpoint(src, out)
    assert ("torch._utils._rebuild_tensor_v2" in str(error.value) and "pass --allow-unsafe-pickle "
            f"(allow_unsafe_pickle=True) to convert it as it is; otherwise, where the file is trusted, load it with "
            f"pickle and save it with torch.save (torch.save(pickle.load(open({str(src)!r}, 'rb')), 'weights.pth'))"
            in str(error.value))
    assert not out.exists()
    report = convert_checkpoint(src, out, allow_unsafe_pickle=True)
    assert report.wrapping == "bare state_dict" and report.arch == "R-50" and out.exists()


# the same network under 'state_dict' (module.-prefixed) and 'model' was refused as "different networks"
def test_one_network_under_state_dict_and_model_apart_from_the_data_parallel_prefix_is_converted(r50_files, tmp_path):
    state_dict = torch.load(r50_files["bn"], weights_only=True)
    src = tmp_path / "both.pth"
    torch.save({"state_dict": {f"module.{key}": value for key, value in state_dict.items()}, "model": state_dict}, src)
    source = read_source_state_dict(src)
    assert (source.wrapping, source.stripped_prefix) == ("'state_dict' entry", "module.")
    assert source.tensors.keys() == state_dict.keys()
    state_dict["fc.bias"] = state_dict["fc.bias"] + 1  # another network: still refused
    torch.save({"state_dict": {f"module.{key}": value for key, value in state_dict.items()},
                "model": torch.load(r50_files["bn"], weights_only=True)}, src)
    with pytest.raises(ConversionError, match="holds different networks, under 'state_dict' and 'model'"):
        read_source_state_dict(src)


# torch.save(..., _use_new_zipfile_serialization=False, pickle_protocol=4) "does not start like a file written by
# torch.save"
def test_a_legacy_format_file_of_another_pickle_protocol_is_named_so(tmp_path):
    src = tmp_path / "legacy4.pth"
    torch.save({"conv1.weight": torch.zeros(2)}, src, _use_new_zipfile_serialization=False, pickle_protocol=4)
    with pytest.raises(ConversionError, match=re.escape(
            f"{src} was written by torch.save in its legacy format (_use_new_zipfile_serialization=False) with pickle "
            "protocol 4, which torch's weights-only loading cannot read; nothing was loaded from it.")) as error:
        read_source_state_dict(src)
    assert "pass --allow-unsafe-pickle (allow_unsafe_pickle=True) to load it as it is" in str(error.value)
    assert read_source_state_dict(src, allow_unsafe_pickle=True).tensors.keys() == {"conv1.weight"}


# the converter's own .pkl given back to it "does not start like a file written by torch.save (a zip archive or a
# pickle)"
def test_detectron2_weights_given_to_the_converter_are_named_as_needing_no_conversion(r50_files, tmp_path):
    converted = tmp_path / "x.pkl"
    convert_checkpoint(r50_files["bn"], converted)
    with pytest.raises(ConversionError, match=re.escape(
            f"{converted}: already detectron2 weights (")) as error:
        convert_checkpoint(converted, tmp_path / "x2.pkl", allow_unsafe_pickle=True)
    assert ("written by gwdet's converter (from 'bn.pth' as R-50, GW at none): there is nothing to convert, and "
            "nothing was written. Use the file as it is as MODEL.WEIGHTS" in str(error.value))
    assert not (tmp_path / "x2.pkl").exists()
    zoo = tmp_path / "zoo.pth"  # a model zoo's layout, without gwdet's record, under another suffix
    checkpoint = load_pickle_file(str(converted), allow_unsafe=False, how_to_opt_in="")
    with open(zoo, "wb") as file:
        pickle.dump({"model": checkpoint["model"], "__author__": "MSRA", "matching_heuristics": True}, file, protocol=2)
    with pytest.raises(ConversionError, match=re.escape(
            "a detectron2 weights file, as in detectron2's model zoo (__author__ 'MSRA'): there is nothing to convert")
            ) as error:
        read_source_state_dict(zoo)
    assert "under a name ending in .pkl, which detectron2's checkpointer reads as pickled weights" in str(error.value)


# an intact torch.save(..., pickle_protocol=5) file: torch's raw UserWarning, then "the file is truncated or corrupted
# (UnpicklingError: Unsupported operand 149)"
def test_a_zip_file_of_another_pickle_protocol_is_named_so(tmp_path, recwarn):
    src = tmp_path / "p5.pth"
    torch.save({"conv1.weight": torch.zeros(2)}, src, pickle_protocol=5)
    with pytest.raises(ConversionError, match=re.escape(
            f"{src} was written by torch.save with pickle protocol 5 (pickle_protocol=5), which torch's weights-only "
            "loading cannot read; nothing was loaded from it. Save it again with torch.save's default protocol")
            ) as error:
        read_source_state_dict(src)
    assert "pass --allow-unsafe-pickle (allow_unsafe_pickle=True) to load it as it is" in str(error.value)
    assert read_source_state_dict(src, allow_unsafe_pickle=True).tensors.keys() == {"conv1.weight"}
    assert not [str(warning.message) for warning in recwarn if "pickle protocol" in str(warning.message)]


def small_weights():
    """Weights enough for write_detectron2_pkl (it writes what it is given)."""
    import numpy as np

    return {"stem.conv1.weight": np.ones((4, 3, 3, 3), np.float32)}


# write_detectron2_pkl replaced an existing file (the user's own) without a word: it defaulted to replacing
def test_write_detectron2_pkl_keeps_an_existing_file_unless_told_to_overwrite(tmp_path):
    from gwdet.convert import write_detectron2_pkl

    user = tmp_path / "user.pkl"
    user.write_text("user data\n")
    with pytest.raises(ConversionError, match=re.escape(
            f"write_detectron2_pkl: {user} already exists; it is left as it is. Pass overwrite=True (the tool's "
            "--overwrite) to replace it, or choose another output file.")):
        write_detectron2_pkl(small_weights(), user, author="me")
    assert user.read_text() == "user data\n"
    assert sorted(os.listdir(tmp_path)) == ["user.pkl"]
    write_detectron2_pkl(small_weights(), user, author="me", overwrite=True)
    assert load_pickle_file(str(user), False, "")["__author__"] == "me"
    with pytest.raises(GwdetValueError, match="overwrite"):
        write_detectron2_pkl(small_weights(), user, author="me", overwrite="yes")


# a file there before the call was "written by another conversion while this one ran; ... pass --overwrite" (a flag
# of the tool, not of the function); the race is now named only for a file that appeared during the call
def test_write_detectron2_pkl_names_a_file_that_appeared_during_the_call_as_a_race(tmp_path, monkeypatch):
    import gwdet.convert.converter as converter

    out = tmp_path / "out.pkl"
    checksums = converter.with_checksums

    def another_conversion_writes_it(*args, **kwargs):  # after the output was looked at, before the rename
        out.write_bytes(b"another conversion")
        return checksums(*args, **kwargs)

    monkeypatch.setattr(converter, "with_checksums", another_conversion_writes_it)
    with pytest.raises(ConversionError, match=re.escape(
            f"{out} was written by another conversion while this one ran; it is left as it is and this conversion's "
            "output discarded. Check which conversion you want there; pass overwrite=True (the tool's --overwrite) "
            "to replace it, or choose another output file.")):
        converter.write_detectron2_pkl(small_weights(), out, author="me")
    assert out.read_bytes() == b"another conversion"
    assert sorted(os.listdir(tmp_path)) == ["out.pkl"], "no partial file is left"


# write_detectron2_pkl wrote a pickle under a .pth name without a word (the tool refused it; detectron2 then refused
# the file as MODEL.WEIGHTS)
def test_write_detectron2_pkl_refuses_a_name_detectron2_would_not_read_as_converted_weights(tmp_path, r50_files,
                                                                                            capsys):
    from gwdet.convert import write_detectron2_pkl
    from gwdet.convert.cli import main

    message = (f"{tmp_path / 'x.pth'}: the output must end with .pkl; detectron2 reads converted weights (numpy arrays, "
               f"matching heuristics) only from .pkl files. Name it '{tmp_path / 'x.pkl'}' (or another name ending "
               "in .pkl); nothing was written.")
    with pytest.raises(ConversionError, match=re.escape(message)):
        write_detectron2_pkl(small_weights(), tmp_path / "x.pth", author="me")
    assert main([str(r50_files["bn"]), str(tmp_path / "x.pth")]) == 2
    assert message in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


# gwdet's own converted .pkl renamed to .pth: "not a PyTorch checkpoint: it does not start like a file written by
# torch.save (a zip archive or a pickle)"
def test_converted_weights_under_a_pth_name_are_named_as_needing_no_conversion(r50_files, tmp_path, capsys):
    from gwdet.convert.cli import main

    convert_checkpoint(r50_files["bn"], tmp_path / "nofc.pkl")
    renamed = tmp_path / "conv_as.pth"
    renamed.write_bytes((tmp_path / "nofc.pkl").read_bytes())
    assert main([str(renamed), str(tmp_path / "ca.pkl")]) == 2
    err = capsys.readouterr().err
    assert (f"{renamed}: already detectron2 weights (265 numpy arrays under 'model'), written by gwdet's converter "
            "(from 'bn.pth' as R-50, GW at none): there is nothing to convert, and nothing was written. Use the file "
            "as it is as MODEL.WEIGHTS (a LazyConfig's train.init_checkpoint) under a name ending in .pkl") in err
    assert "does not start like" not in err
    assert not (tmp_path / "ca.pkl").exists()


# allow_unsafe_pickle='no' (a string is true) unpickled a whole pickled module, which may run code
def test_read_source_state_dict_refuses_a_flag_that_is_not_a_bool(tmp_path):
    from gwdet.convert import read_source_state_dict

    path = tmp_path / "model.pth"
    torch.save(torch.nn.Linear(2, 2), path)  # a whole module: unsafe unpickling
    with pytest.raises(ValueError, match=r"^read_source_state_dict: allow_unsafe_pickle must be True or False, got "
                                         r"'no' \(str\)$"):
        read_source_state_dict(str(path), allow_unsafe_pickle="no")


# a GW affine saved as [C, 1, 1] or [1, C] was refused: "the checkpoint does not fit R-50 ...: 34 with a wrong shape:
# ['stem.conv1.norm.weight [64, 1, 1] (needs [64])' ...]" (only [1, C, 1, 1] was reshaped to [C])
@pytest.mark.parametrize("shape, shown", [(lambda c: (c, 1, 1), "[C,1,1]"), (lambda c: (1, c), "[1,C]")],
                         ids=["C11", "1C"])
def test_a_gw_affine_of_c_values_in_any_broadcasting_shape_is_reshaped(r50_files, shape, shown):
    state_dict = torch.load(r50_files["gw"], weights_only=True)
    expected, _ = convert_state_dict(in_memory(state_dict))
    reshaped = {key: value.reshape(shape(value.shape[1])) if value.dim() == 4 and value.shape[0] == 1 else value
                for key, value in state_dict.items()}
    weights, report = convert_state_dict(in_memory(reshaped))
    assert (report.reshaped_affine, report.reshaped_from) == (34, [shown])
    assert f"(weight, bias; 34 reshaped {shown} -> [C])" in report.format()
    assert weights.keys() == expected.keys()
    assert all((weights[key] == expected[key]).all() and weights[key].shape == expected[key].shape for key in weights)


# numpy arrays as the source's values (an .npz's) failed with a raw "AttributeError: 'numpy.ndarray' object has no
# attribute 'dim'"
def test_a_state_dict_of_numpy_arrays_converts_as_its_tensors(r50_files):
    state_dict = torch.load(r50_files["bn"], weights_only=True)
    expected, _ = convert_state_dict(in_memory(state_dict))
    weights, _ = convert_state_dict(in_memory({key: value.numpy() for key, value in state_dict.items()}))
    assert weights.keys() == expected.keys() and all((weights[key] == expected[key]).all() for key in weights)
    with pytest.raises(ConversionError, match=re.escape("convert_state_dict: source.tensors['conv1.weight'] is a list, "
                                                        "not a torch tensor or numpy array; give the state dict's "
                                                        "tensors")):
        convert_state_dict(in_memory({**state_dict, "conv1.weight": [1.0]}))


# file:// outputs were read as relative paths: "folder .../file:/tmp/... does not exist" (convert_checkpoint),
# "cannot write the output ([Errno 2] No such file or directory: 'file:/tmp/...')" (write_detectron2_pkl, whose
# docstring said a PathManager URL is written in place)
def test_a_file_url_output_is_written_to_its_path_and_other_urls_are_refused(r50_files, tmp_path):
    from gwdet.convert import write_detectron2_pkl

    report = convert_checkpoint(f"file://{r50_files['bn']}", f"file://{tmp_path / 'url.pkl'}")
    assert report.output == str(tmp_path / "url.pkl")
    assert load_pickle_file(str(tmp_path / "url.pkl"), False, "")["model"].keys() == convert_state_dict(
        in_memory(torch.load(r50_files["bn"], weights_only=True)))[0].keys()
    write_detectron2_pkl(small_weights(), f"file://localhost{tmp_path / 'w.pkl'}", author="me")
    assert load_pickle_file(str(tmp_path / "w.pkl"), False, "")["__author__"] == "me"
    with pytest.raises(ConversionError, match=re.escape(
            "https://example.com/w.pkl: the converter writes local files (file:///PATH included), not https:// URLs; "
            "nothing was written.")):
        convert_checkpoint(r50_files["bn"], "https://example.com/w.pkl")
    with pytest.raises(ConversionError, match=re.escape("s3://bucket/w.pkl: the converter writes local files")):
        write_detectron2_pkl(small_weights(), "s3://bucket/w.pkl", author="me")
    with pytest.raises(ConversionError, match=re.escape("file://host/w.pkl names a file on the host 'host', which "
                                                        "cannot be written from here")):
        write_detectron2_pkl(small_weights(), "file://host/w.pkl", author="me")
    assert sorted(os.listdir(tmp_path)) == ["url.pkl", "w.pkl"]


# an open file as the input (or write_detectron2_pkl's output) failed with a raw "TypeError: expected str, bytes or
# os.PathLike object, not BufferedReader"
def test_an_open_file_as_the_input_is_named_with_the_fix(r50_files, tmp_path):
    from gwdet.errors import GwdetTypeError

    with open(r50_files["bn"], "rb") as file, pytest.raises(GwdetTypeError, match=re.escape(
            "convert_checkpoint: input_path must be a file's path (a str or pathlib.Path), got a BufferedReader (an "
            "open file): give the path of the file itself. To convert a state dict in memory, use "
            "gwdet.convert.convert_state_dict(")):
        convert_checkpoint(file, tmp_path / "f.pkl")
    from gwdet.convert import write_detectron2_pkl

    with open(tmp_path / "f.pkl", "wb") as file, pytest.raises(GwdetTypeError, match=re.escape(
            "write_detectron2_pkl: output_path must be a file's path (a str or pathlib.Path), got a BufferedWriter")):
        write_detectron2_pkl(small_weights(), file, author="me")
    assert os.listdir(tmp_path) == ["f.pkl"] and (tmp_path / "f.pkl").read_bytes() == b""


# tensors, lists and an empty dict were written without a word, and gwdet's own loading then refused the file
# ("torch tensors in a .pkl weight file", "holds no weights")
@pytest.mark.parametrize("weights, expected", [
    (lambda: {key: torch.from_numpy(value) for key, value in small_weights().items()},
     "weights['stem.conv1.weight'] is a torch tensor; a detectron2 .pkl holds numpy arrays (detectron2's and gwdet's "
     "loading refuse tensors in a .pkl). Give the arrays ({name: value.detach().cpu().numpy() for name, value in "
     "weights.items()}), or convert_state_dict's output; nothing was written."),
    (lambda: {key: value.tolist() for key, value in small_weights().items()},
     "weights['stem.conv1.weight'] is a list, not a numpy array of numbers"),
    (lambda: {}, "weights must be a non-empty dict of parameter names to numpy arrays (what convert_state_dict "
                 "returns), got an empty dict; nothing was written"),
    # integer arrays (quantized weights) were written, and loading copied them unscaled into the float layers
    (lambda: {key: (value * 100).astype("int8") for key, value in small_weights().items()},
     "weights['stem.conv1.weight'] is a numpy array of dtype int8, but weights are floating point"),
], ids=["tensors", "lists", "empty", "integers"])
def test_write_detectron2_pkl_refuses_weights_its_loading_would_refuse(tmp_path, weights, expected):
    from gwdet.convert import write_detectron2_pkl

    with pytest.raises(ConversionError, match=re.escape(f"write_detectron2_pkl: {expected}")):
        write_detectron2_pkl(weights(), tmp_path / "w.pkl", author="me")
    assert os.listdir(tmp_path) == []


# a function in the metadata failed with a raw "AttributeError: Can't pickle local object '<lambda>...'"
def test_write_detectron2_pkl_refuses_metadata_that_is_not_plain_data(tmp_path):
    from gwdet.convert import write_detectron2_pkl

    with pytest.raises(ConversionError, match=re.escape(
            "write_detectron2_pkl: metadata['steps'][1] is a function (<function ")) as error:
        write_detectron2_pkl(small_weights(), tmp_path / "w.pkl", author="me",
                             metadata={"epochs": 90, "steps": ["ok", lambda x: x]})
    assert "not plain data: metadata holds str, int, float, bool, None, and lists, tuples and dicts of them" in str(
        error.value)
    assert os.listdir(tmp_path) == []
    write_detectron2_pkl(small_weights(), tmp_path / "w.pkl", author="me", metadata={"a": [1, 2.5, None, {"b": True}]})
    assert load_pickle_file(str(tmp_path / "w.pkl"), False, "")["gwdet"] == {
        "a": [1, 2.5, None, {"b": True}]}


# read_source_state_dict(None): a raw TypeError; 'r50.pth/' (a trailing slash): "no such file"
def test_a_path_that_is_no_path_or_a_file_with_a_trailing_slash_is_named(tmp_path):
    from gwdet.convert import read_source_state_dict

    with pytest.raises(TypeError, match=r"^read_source_state_dict: path must be the checkpoint file's path .* got None"):
        read_source_state_dict(None)
    path = tmp_path / "r50.pth"
    torch.save({"conv1.weight": torch.zeros(1)}, path)
    with pytest.raises(ConversionError, match=rf"names the file {re.escape(str(path))} with a '/' after it, which makes "
                                              r"it a folder's path: give it without the trailing slash\.$"):
        read_source_state_dict(f"{path}/")


# before: the first refusal advised --allow-unsafe-pickle, which then ended in "no state dict found ... entries that
# are not tensors"
def test_a_pth_of_numpy_arrays_converts_with_the_unsafe_flag_it_is_advised(r50_files, tmp_path):
    state_dict = torch.load(r50_files["bn"], weights_only=True)
    expected, _ = convert_state_dict(in_memory(state_dict))
    src, out = tmp_path / "numpy.pth", tmp_path / "numpy.pkl"
    torch.save({key: value.numpy() for key, value in state_dict.items()}, src)
    with pytest.raises(ConversionError, match="--allow-unsafe-pickle"):
        read_source_state_dict(src)
    source = read_source_state_dict(src, allow_unsafe_pickle=True)
    assert source.wrapping == "bare state_dict" and all(isinstance(value, torch.Tensor)
                                                        for value in source.tensors.values())
    assert source.tensors["bn1.num_batches_tracked"].dtype == torch.int64
    convert_checkpoint(src, out, allow_unsafe_pickle=True)
    weights = load_pickle_file(str(out), False, "")["model"]
    assert weights.keys() == expected.keys() and all((weights[key] == expected[key]).all() for key in weights)
    torch.save({"model": {key: value.numpy() for key, value in state_dict.items()}, "epoch": 3}, src)
    assert read_source_state_dict(src, allow_unsafe_pickle=True).wrapping == "'model' entry"


# a sparse weight (a pruned model's .to_sparse()) ended in a raw "TypeError: can't convert Sparse layout tensor to
# numpy" from deep inside the conversion
@pytest.mark.parametrize("make", [torch.Tensor.to_sparse, torch.Tensor.to_mkldnn], ids=["sparse", "mkldnn"])
def test_a_tensor_that_is_not_dense_is_refused_naming_it_and_the_fix(tmp_path, make):
    state_dict = torchvision_model("R-50", with_gw=False).state_dict()
    state_dict["layer1.0.conv1.weight"] = make(state_dict["layer1.0.conv1.weight"])
    layout = state_dict["layer1.0.conv1.weight"].layout
    with pytest.raises(ConversionError, match=re.escape(
            f"layer1.0.conv1.weight is a {str(layout).removeprefix('torch.').removeprefix('_')} tensor (layout "
            f"{layout}), and the converter reads dense tensors only: save the checkpoint with dense tensors, e.g. "
            "torch.save({k: v.to_dense() if v.layout != torch.strided else v")):
        convert_state_dict(in_memory(state_dict))
    if make is torch.Tensor.to_sparse:  # a file as tools/convert_pretrained.py reads it: nothing is written
        torch.save(state_dict, tmp_path / "sparse.pth")
        with pytest.raises(ConversionError, match=r"sparse\.pth: layer1\.0\.conv1\.weight is a sparse_coo tensor"):
            convert_checkpoint(tmp_path / "sparse.pth", tmp_path / "out.pkl")
        assert not (tmp_path / "out.pkl").exists()


def _trained_looking_r50() -> dict:
    """A torchvision ResNet-50's state dict with its BN statistics moved off their initial values."""
    torch.manual_seed(0)
    state_dict = torchvision.models.resnet50().state_dict()
    for key, value in state_dict.items():
        if key.endswith("running_mean"):
            value.normal_(0, 0.1)
        if key.endswith("running_var"):
            value.uniform_(0.5, 2.0)
    return state_dict


@pytest.mark.parametrize("variance", [0.0, 1e-30], ids=["zero", "tiny"])
def test_a_batch_norm_of_zero_variance_in_every_channel_is_warned_about(variance, tmp_path):
    # a layer1.0.bn1.running_var of all zeros (or 1e-30) converted without a word (FrozenBN then scales it by ~316)
    state_dict = _trained_looking_r50()
    state_dict["layer1.0.bn1.running_var"] = torch.full((64,), variance)
    path = save_wrapped(state_dict, "bare", tmp_path / "var0.pth")
    result = run_tool(str(path), str(tmp_path / "var0.pkl"))
    assert result.returncode == 0, result.stderr
    err = result.stderr
    assert re.search(r"1 batch norm\(s\) of .*var0\.pth hold a running variance of zero in every channel: "
                     r"\['layer1\.0\.bn1'\]\. Converted, such a layer scales its input by 1/sqrt\(eps\), about 316", err)
    assert (tmp_path / "var0.pkl").exists()


def test_batch_norms_at_their_initial_statistics_are_named(caplog):
    # 52 of 53 BN layers at mean 0 / var 1 converted as trained: only a network with every layer at init was refused
    state_dict = torchvision.models.resnet50().state_dict()
    state_dict["bn1.running_mean"].normal_(0, 0.1)
    state_dict["bn1.running_var"].uniform_(0.5, 2.0)
    with pytest.raises(ConversionError, match=r"52 of the 53 batch norms of <state dict> hold the running statistics of "
                                              r"a layer that never saw data .*\['layer1\.0\.bn1', .*Most of the network "
                                              r"was never trained"):
        convert_state_dict(in_memory(state_dict))
    state_dict = _trained_looking_r50()  # one layer at init in a trained network: converted, and named
    state_dict["layer3.1.bn2.running_mean"].zero_()
    state_dict["layer3.1.bn2.running_var"].fill_(1.0)
    with caplog.at_level("WARNING", logger="gwdet.convert.converter"):
        convert_state_dict(in_memory(state_dict))
    assert "1 of the 53 batch norms of <state dict> hold the running statistics of a layer that never saw data" \
        in caplog.text and "['layer3.1.bn2']" in caplog.text


def test_write_detectron2_pkl_refuses_a_record_its_weights_contradict(tmp_path):
    # R-50 BN weights written under {'arch': 'R-101', 'gw_positions': 'S1-B2'}; loading then advised DEPTH 101
    from gwdet.convert import write_detectron2_pkl
    weights, report = convert_state_dict(in_memory(_trained_looking_r50()))
    with pytest.raises(ConversionError, match=r"the metadata's 'gwdet' record contradicts the weights: its arch 'R-101' "
                                              r"has blocks per stage \[3, 4, 23, 3\], the weights \[3, 4, 6, 3\]; its "
                                              r"gw_positions 'S1-B2' puts GW at S1, B2, where the weights hold running "
                                              r"statistics \(BN\).*nothing was written"):
        write_detectron2_pkl(weights, tmp_path / "lie.pkl", author="me",
                             metadata={"arch": "R-101", "gw_positions": "S1-B2", "norm": "BN"})
    assert not (tmp_path / "lie.pkl").exists()
    with pytest.raises(ConversionError, match=r"its norm 'GN' has no running statistics, and the weights hold some"):
        write_detectron2_pkl(weights, tmp_path / "lie.pkl", author="me", metadata={"arch": "R-50", "norm": "GN"})
    write_detectron2_pkl(weights, tmp_path / "true.pkl", author="me", metadata=report.metadata())
    assert (tmp_path / "true.pkl").exists()


def test_unexpected_keys_inside_the_blocks_are_named_as_another_architecture():
    # an SE-ResNet's layerN.M.se.* keys were refused with the advice --allow-unexpected, which converts another network
    state_dict = _trained_looking_r50()
    state_dict["layer1.0.se.fc1.weight"] = torch.zeros(16, 256, 1, 1)
    with pytest.raises(ConversionError, match=r"1 key\(s\) inside the residual blocks .*\['layer1\.0\.se\.fc1\.weight'\]"
                                              r"\. They are modules of the blocks \(\['se\.fc1'\]\) that gwdet's ResNet "
                                              r".* does not have, so the checkpoint is of another architecture"):
        convert_state_dict(in_memory(state_dict))
    del state_dict["layer1.0.se.fc1.weight"]
    state_dict["aux_head.weight"] = torch.zeros(10, 2048)  # outside the blocks: the flag is the way out
    with pytest.raises(ConversionError, match=r"\['aux_head\.weight'\]\. Check that this is the checkpoint you meant; "
                                              r"pass --allow-unexpected"):
        convert_state_dict(in_memory(state_dict))


# convert_checkpoint(..., gw_positions=['S1', 'B2']) named the config key MODEL.RESNETS.GW_POSITIONS, and
# convert_state_dict(..., source_name=None) failed in os.path with a raw TypeError
def test_the_python_arguments_are_named_in_their_refusals():
    source = SourceStateDict(tensors={"conv1.weight": torch.zeros(64, 3, 7, 7)}, wrapping="bare state_dict",
                             stripped_prefix="")
    with pytest.raises(ConversionError, match=re.escape("--gw-positions (gw_positions= in Python) must be a string "
                                                        "like 'S1-B2', got ['S1', 'B2']")):
        convert_state_dict(source, gw_positions=["S1", "B2"])
    with pytest.raises(ConversionError, match=re.escape("convert_state_dict: source_name is how the report names the "
                                                        "source, a str (e.g. the checkpoint's path), got None")):
        convert_state_dict(source, source_name=None)


def _group_norm_stem_r50() -> dict:
    """A trained-looking torchvision ResNet-50 whose stem norm is a torch GroupNorm(32, 64), BN elsewhere."""
    state_dict = _trained_looking_r50()
    group_norm = nn.GroupNorm(32, 64)
    with torch.no_grad():
        group_norm.weight.uniform_(0.5, 1.5)
        group_norm.bias.normal_(0, 0.1)
    for leaf in ("running_mean", "running_var", "num_batches_tracked"):
        del state_dict[f"bn1.{leaf}"]
    state_dict.update({f"bn1.{name}": value for name, value in group_norm.state_dict().items()})
    return state_dict


# a GroupNorm stem among BN norms was reported as "GW positions : S1; inferred" and converted into GW weights, with
# MODEL.RESNETS.GW_POSITIONS "S1" advised: a GW model built from GroupNorm parameters, without a word
def test_norms_without_statistics_that_may_be_group_norm_need_the_gw_positions_named(tmp_path, capsys):
    from gwdet.convert.cli import main

    state_dict = _group_norm_stem_r50()
    with pytest.raises(ConversionError, match=re.escape(
            "the norms at S1 (['bn1']) have no running statistics, carry no gwdet GW layer's record of its settings "
            "(_extra_state) and keep their weight and bias as [C] values (['bn1.bias', 'bn1.weight']), as torch's "
            "GroupNorm does")) as refused:
        convert_state_dict(in_memory(state_dict))
    message = str(refused.value)
    assert "the weights cannot tell GW from GroupNorm (or another norm without running statistics) there" in message
    assert "pass --gw-positions 'S1' (in Python: gw_positions='S1')" in message
    assert "If it has GroupNorm there, gwdet's conversion does not map it" in message
    # the tool: refused, nothing written
    src, out = save_wrapped(state_dict, "bare", tmp_path / "stemgn.pth"), tmp_path / "stemgn.pkl"
    assert main([str(src), str(out)]) == 2 and not out.exists()
    assert "the weights cannot tell GW from GroupNorm" in capsys.readouterr().err
    # asking for BN there: the refusal no longer says the checkpoint "has GW" there
    with pytest.raises(ConversionError, match=re.escape(
            "the checkpoint does not fit --gw-positions '': it has norms without running statistics at 'S1' (GW or "
            "GroupNorm: they carry no gwdet GW record and keep their affine as [C], as GroupNorm does, so the weights "
            "cannot tell which), so the parameters of norms without running statistics would go into BN layers at "
            "'S1'. Pass --gw-positions 'S1'")):
        convert_state_dict(in_memory(state_dict), gw_positions="")
    # named GW by the caller: converted as GW
    weights, report = convert_state_dict(in_memory(state_dict), gw_positions="S1")
    assert report.gw_positions == "S1" and report.gw_positions_requested == "S1"
    assert weights["stem.conv1.norm.weight"].shape == (64,)
    # the GW authors' [1, C, 1, 1] affine shows GW: inferred as before
    authors = {**state_dict, **{f"bn1.{leaf}": state_dict[f"bn1.{leaf}"].reshape(1, 64, 1, 1)
                                for leaf in ("weight", "bias")}}
    assert convert_state_dict(in_memory(authors))[1].gw_positions == "S1"


# convert_state_dict of 'module.'-prefixed keys said "expected keys like 'conv1.weight' ... (after removing 'module.'
# prefixes), found ['module.conv1.weight', ...]", while convert_state_dict removes no prefix
def test_data_parallel_prefixes_given_in_memory_are_named_as_left_on():
    state_dict = _trained_looking_r50()
    with pytest.raises(ConversionError) as refused:
        convert_state_dict(SourceStateDict(tensors={f"module.{key}": value for key, value in state_dict.items()},
                                           wrapping="", stripped_prefix=""))
    message = str(refused.value)
    assert "after removing" not in message
    assert ("'layer1.0.downsample.0.weight', found ['module.conv1.weight', " in message
            and "Every key starts with 'module.', the prefix (Distributed)DataParallel adds, which convert_state_dict "
                "leaves on the keys it is given (read_source_state_dict removes it when it reads a file): give the keys "
                "without it, SourceStateDict(tensors={key.removeprefix('module.'): value for key, value in "
                "state_dict.items()}, wrapping='bare state_dict', stripped_prefix='module.')" in message)
    # the line as printed converts
    line = message.split("give the keys without it, ")[1].split("), or torch.save")[0] + ")"
    wrapped = {f"module.{key}": value for key, value in state_dict.items()}
    source = eval(line, {"SourceStateDict": SourceStateDict, "state_dict": wrapped})
    assert convert_state_dict(source)[1].arch == "R-50"
    # some keys prefixed, some not: named as two models' names mixed
    mixed = {(f"module.{key}" if key.startswith("layer") else key): value for key, value in state_dict.items()}
    with pytest.raises(ConversionError, match=r"312 of the 320 keys start with 'module.' .* the others do not: .* "
                                              r"give the state dict of one model"):
        convert_state_dict(in_memory(mixed))


# a BatchNorm2d(affine=False) (running statistics, no weight or bias) was refused as "norm layer1.0.bn1 has
# ['running_mean', 'running_var']: neither a BatchNorm (...) nor a GW layer (...)", with no way out
def test_a_batch_norm_without_affine_converts_as_weight_one_and_bias_zero(image, tmp_path):
    model = torchvision_model("R-50", with_gw=False)
    affine_free = ("layer1.0.bn1", "layer3.0.downsample.1", "bn1")
    for name in affine_free:
        parent, _, child = name.rpartition(".")
        holder = model.get_submodule(parent) if parent else model
        norm = nn.BatchNorm2d(getattr(holder, child).num_features, affine=False).eval()
        norm.running_mean.normal_(0, 0.1)
        norm.running_var.uniform_(0.5, 2.0)
        setattr(holder, child, norm)
    expected = torchvision_features(model, image)
    state_dict = model.state_dict()
    assert f"{affine_free[0]}.weight" not in state_dict and f"{affine_free[0]}.running_mean" in state_dict
    src, out = save_wrapped(state_dict, "bare", tmp_path / "no_affine.pth"), tmp_path / "no_affine.pkl"

    report = convert_checkpoint(src, out)
    assert (report.arch, report.gw_positions, report.converted_bn_norms) == ("R-50", "", 53)
    assert report.identity_affine == ["bn1", "layer1.0.bn1", "layer3.0.downsample.1"]
    assert ("  no affine     : ['bn1', 'layer1.0.bn1', 'layer3.0.downsample.1'] had no weight or bias "
            "(BatchNorm2d(affine=False)):\n                  written with weight 1, bias 0, which compute the same"
            in report.format())
    with open(out, "rb") as f:
        converted = pickle.load(f)["model"]
    assert (converted["res2.0.conv1.norm.weight"] == 1).all() and not converted["res2.0.conv1.norm.bias"].any()
    assert converted["res2.0.conv1.norm.weight"].shape == (64,) and converted["res4.0.shortcut.norm.bias"].shape == (1024,)
    # loaded into gwdet's backbone (FrozenBN), the converted weights compute the source network's features
    detector = gwdet_detector("R-50", "")
    poison(detector.backbone.bottom_up)
    DetectionCheckpointer(detector).load(str(out))
    with torch.no_grad():
        features = detector.backbone.bottom_up(image)
    for stage in STAGES:
        torch.testing.assert_close(features[stage], expected[stage], atol=1e-4, rtol=0)
    # a norm with part of the statistics is still named incomplete
    del state_dict["layer1.0.bn1.running_var"]
    with pytest.raises(ConversionError, match=r"norm layer1.0.bn1 has \['running_mean'\]: neither a BatchNorm .*"
                                              r"or \['running_mean', 'running_var'\] without an affine\) nor a GW"):
        convert_state_dict(in_memory(state_dict))


# an mmpretrain/mmcls checkpoint ('backbone.' + the ResNet's keys, 'head.fc.*' beside them) was refused as "not a
# torchvision-layout ResNet/ResNeXt ... found ['backbone.conv1.weight', ...]" without a word on the prefix
def test_a_resnet_under_a_prefix_beside_a_head_is_named_with_the_line_that_keeps_it(r50_files, tmp_path, capsys):
    from gwdet.convert.cli import main

    state_dict = torch.load(r50_files["bn"], weights_only=True)
    weights = {("head." + key if key.startswith("fc.") else "backbone." + key): value
               for key, value in state_dict.items()}
    weights["neck.gap.scale"] = torch.ones(1)
    src, out = tmp_path / "mmcls.pth", tmp_path / "mmcls.pkl"
    torch.save({"meta": {"epoch": 100}, "state_dict": weights}, src)
    assert main([str(src), str(out)]) == 2
    printed = capsys.readouterr().err
    line = ("{key.removeprefix('backbone.'): value for key, value in weights.items() if "
            "key.startswith('backbone.')}")
    assert ("found ['backbone.conv1.weight', 'backbone.bn1.weight', 'backbone.bn1.bias', " in printed
            and "318 of the 321 keys are a torchvision ResNet's under the prefix 'backbone.', beside 3 of another "
                "part of the network (['head.fc.weight', 'head.fc.bias', 'neck.gap.scale']) (the layout of "
                f"mmpretrain's and mmcls' checkpoints): save the ResNet's weights alone without the prefix ({line}) "
                f"and convert that file with tools/convert_pretrained.py." in printed)
    assert not out.exists()
    # the line as printed gives a file that converts
    torch.save(eval(line, {"weights": torch.load(src, weights_only=True)["state_dict"]}), src)
    assert main([str(src), str(out), "--arch", "R-50", "--gw-positions", ""]) == 0 and out.exists()
    # two ResNets (a model and its EMA copy): both prefixes named, the one meant to be kept
    both = {**{f"ema.{key}": value for key, value in state_dict.items()}, **{f"model.{key}": value
                                                                             for key, value in state_dict.items()}}
    with pytest.raises(ConversionError, match=r"The keys hold 2 torchvision-layout ResNets, under the prefixes "
                                              r"\['ema.', 'model.'\]: save the one you mean alone without its prefix "
                                              r"\(for 'ema.': \{key.removeprefix\('ema.'\): value for key, value in "
                                              r"weights.items\(\) if key.startswith\('ema.'\)\}\)"):
        convert_state_dict(in_memory(both))


# an input path that is a symbolic link loop (`ln -s loop loop`) was refused as "no such file. Check the input
# path", while `ls` shows it; as the output, a loop was "a link to loop2.pkl, which does not exist", and a folder
# link to nothing "folder ... does not exist. Create it first." (or "... is a file, not a folder")
def test_a_path_through_a_broken_symbolic_link_is_named_as_one(r50_files, tmp_path):
    (tmp_path / "loop1.pth").symlink_to("loop2.pth")
    (tmp_path / "loop2.pth").symlink_to("loop1.pth")
    (tmp_path / "self").symlink_to("self")
    (tmp_path / "gone.pth").symlink_to("moved.pth")
    (tmp_path / "via.pth").symlink_to("gone.pth")
    out = tmp_path / "out.pkl"
    fix = r"Point the link at the checkpoint \(ln -sfn /path/to/checkpoint.pth .*\), or give the checkpoint's own path"
    with pytest.raises(ConversionError, match=rf"loop1.pth: a symbolic link that loops \('.*loop1.pth' -> "
                                              rf"'loop2.pth' -> 'loop1.pth'\): it leads to no file to read. {fix}"):
        convert_checkpoint(tmp_path / "loop1.pth", out)
    with pytest.raises(ConversionError, match=rf"gone.pth: a symbolic link to 'moved.pth', which does not exist \(a "
                                              rf"dangling link\): it leads to no file to read. {fix}"):
        convert_checkpoint(tmp_path / "gone.pth", out)
    with pytest.raises(ConversionError, match=r"via.pth: a symbolic link that ends at 'moved.pth', which does not "
                                              r"exist \(a dangling link: '.*via.pth' -> 'gone.pth' -> 'moved.pth'\)"):
        read_source_state_dict(tmp_path / "via.pth")
    with pytest.raises(ConversionError, match=r"self/r50.pth: its folder .*self is a symbolic link that loops \(.*\): "
                                              r"it leads to no file to read. Point the link at the folder meant \(ln "
                                              r"-sfn /path/to/folder .*self\)"):
        convert_checkpoint(tmp_path / "self" / "r50.pth", out)
    with pytest.raises(ConversionError, match="missing.pth: no such file. Check the input path."):
        convert_checkpoint(tmp_path / "missing.pth", out)
    # as the output
    (tmp_path / "loop1.pkl").symlink_to("loop2.pkl")
    (tmp_path / "loop2.pkl").symlink_to("loop1.pkl")
    with pytest.raises(ConversionError, match=r"loop1.pkl is a symbolic link that loops \('.*loop1.pkl' -> "
                                              r"'loop2.pkl' -> 'loop1.pkl'\), which leads to no file; nothing was "
                                              r"converted. Remove the link, or give another output file."):
        convert_checkpoint(r50_files["bn"], tmp_path / "loop1.pkl", overwrite=True)
    (tmp_path / "runs").symlink_to("deleted_runs")
    for folder, what in (("self", "a symbolic link that loops"), ("runs", "a symbolic link to 'deleted_runs', which "
                                                                          "does not exist")):
        with pytest.raises(ConversionError, match=rf"out.pkl: its folder .*{folder} is {what}.*, so there is no "
                                                  r"folder to write into; nothing was converted. Point the link at the "
                                                  rf"folder meant \(ln -sfn /path/to/folder .*{folder}\)"):
            convert_checkpoint(r50_files["bn"], tmp_path / folder / "out.pkl")
    assert sorted(os.listdir(tmp_path)) == ["gone.pth", "loop1.pkl", "loop1.pth", "loop2.pkl", "loop2.pth", "runs",
                                            "self", "via.pth"]


# an existing folder as OUT was told "out/: the output must end with .pkl ... Name it 'out/.pkl'" (in Python,
# write_detectron2_pkl(w, 'out') was told to name it 'out.pkl'), a sibling or hidden file instead of a name in it
def test_an_output_that_is_a_folder_is_asked_for_a_file_name_in_it(r50_files, tmp_path, monkeypatch, capsys):
    import numpy as np

    from gwdet.convert import write_detectron2_pkl
    from gwdet.convert.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    for given in ("out/", "out", "missing/"):
        assert main([str(r50_files["bn"]), given]) == 2
        what = "names a folder (it ends in '/')" if given == "missing/" else "is a folder"
        assert (f"error: {given} {what}: give the path of the .pkl file to write, a file name in it (e.g. "
                f"{given.rstrip('/')}/R-50-GW.pkl); nothing was written.") in capsys.readouterr().err
    with pytest.raises(ConversionError, match=r"^out is a folder: give the path of the .pkl file to write, a file "
                                              r"name in it \(e.g. out/R-50-GW.pkl\); nothing was written.$"):
        write_detectron2_pkl({"w": np.zeros(2, np.float32)}, "out", author="me")
    assert os.listdir(tmp_path / "out") == []


# a BN whose weight and bias were saved as [1, C, 1, 1] was refused: "2 with a wrong shape: ['stem.conv1.norm.weight
# [1, 64, 1, 1] (needs [64])', ...]. The file is incomplete or of another architecture." (GW's were reshaped)
def test_a_bn_affine_saved_as_1c11_is_reshaped_and_reported(r50_files):
    state_dict = torch.load(r50_files["bn"], weights_only=True)
    expected, _ = convert_state_dict(in_memory(state_dict))
    broadcast = {key: value.reshape(1, -1, 1, 1) if key in ("bn1.weight", "bn1.bias") else value
                 for key, value in state_dict.items()}
    weights, report = convert_state_dict(in_memory(broadcast))
    assert report.reshaped_bn == ["bn1"] and report.reshaped_affine == 0
    assert ("  reshaped BN   : ['bn1'] kept weight/bias as [1,C,1,1] (or another broadcasting shape):\n"
            "                  reshaped to [C], the same values") in report.format()
    assert weights.keys() == expected.keys()
    assert all((weights[key] == expected[key]).all() and weights[key].shape == expected[key].shape for key in weights)


# an input path holding a '~' or '$HOME' that nothing expanded was "no such file. Check the input path." though the
# file was there (the output side named the unexpanded '~' or variable)
@pytest.mark.parametrize("given", ["~/h.pth", "$HOME/h.pth"])
def test_an_input_with_a_home_or_variable_nothing_expanded_is_named(r50_files, tmp_path, monkeypatch, capsys, given):
    from gwdet.convert.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "h.pth").write_bytes(r50_files["bn"].read_bytes())
    held = "a leading '~'" if given.startswith("~") else "'$HOME'"
    shell = ("leave the '~' outside quotes (~/'my file.pth')" if given.startswith("~") else
             "let the shell expand it (double quotes)")
    message = (f"{given}: no such file. It holds {held}, which nothing expanded (a quoted command-line value and a "
               f"config file keep it as it is): {shell}, or write the path out ({tmp_path / 'home' / 'h.pth'}).")
    with pytest.raises(ConversionError, match=f"^{re.escape(message)}$"):
        convert_checkpoint(given, tmp_path / "out.pkl")
    if given.startswith("$"):  # the tool expands a '~' of IN itself
        assert main([given, "out.pkl"]) == 2
        assert f"error: {message}" in capsys.readouterr().err
    assert not (tmp_path / "out.pkl").exists()


# a gzip-compressed checkpoint and a Git LFS pointer were "not a PyTorch checkpoint: it does not start like a file
# written by torch.save ..." without naming the compression or the pointer
def test_a_gzip_compressed_checkpoint_and_a_git_lfs_pointer_are_named(r50_files, tmp_path):
    import gzip

    packed = tmp_path / "r50.pth.gz"
    packed.write_bytes(gzip.compress(r50_files["bn"].read_bytes()))
    with pytest.raises(ConversionError, match=rf"^{re.escape(str(packed))} is gzip-compressed \(its name ends in "
                                              r"\.gz\), and the file torch.save wrote is read uncompressed; nothing "
                                              rf"was read from it. Decompress it \(gunzip -k {re.escape(str(packed))}\) "
                                              rf"and give {re.escape(str(packed)[:-3])}.$"):
        convert_checkpoint(packed, tmp_path / "out.pkl")
    renamed = tmp_path / "r50z.pth"
    renamed.write_bytes(packed.read_bytes())
    with pytest.raises(ConversionError, match=r"r50z.pth is gzip-compressed \(though its name does not end in \.gz\).* "
                                              r"\(gunzip -c .*r50z.pth > .*r50z.unpacked.pth\) and give "):
        convert_checkpoint(renamed, tmp_path / "out.pkl")
    pointer = tmp_path / "lfs.pth"
    pointer.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:" + "4d" * 32 + "\nsize 102530333\n")
    with pytest.raises(ConversionError, match=r"lfs.pth is a Git LFS pointer \(134 bytes of text standing for the real "
                                              r"file of 102530333 bytes\), not the file torch.save wrote itself: the "
                                              r"repository was cloned or pulled without fetching its Git LFS files. "
                                              r"Run git lfs pull in the repository"):
        convert_checkpoint(pointer, tmp_path / "out.pkl")
    assert not (tmp_path / "out.pkl").exists()


# OUT '' was ": the output must end with .pkl ... Name it '.pkl'", and OUT '-' was told to be named '-.pkl' (which
# argparse then reads as a flag)
@pytest.mark.parametrize("given, said", [
    ("", "the output path is empty (OUT on the command line, output_path in Python; an unset shell variable, as in "
         "\"$OUT\"?): give the .pkl file to write, e.g. R-50.pkl; nothing was written."),
    ("  ", "the output path is blank ('  ') (OUT on the command line, output_path in Python; an unset shell variable, "
           "as in \"$OUT\"?): give the .pkl file to write, e.g. R-50.pkl; nothing was written."),
    ("-", "the output path is '-', which many commands read as standard output, but the converter writes a file: "
          "detectron2 reads converted weights from a .pkl file, not from a stream. Give the .pkl file to write, e.g. "
          "R-50.pkl; nothing was written."),
], ids=["empty", "blank", "dash"])
def test_an_output_that_names_no_file_is_named_with_an_example_name(r50_files, tmp_path, monkeypatch, capsys,
                                                                     given, said):
    from gwdet.convert import write_detectron2_pkl
    from gwdet.convert.cli import main

    monkeypatch.chdir(tmp_path)
    assert main([str(r50_files["bn"]), given]) == 2
    assert f"error: {said}\n" in capsys.readouterr().err
    with pytest.raises(ConversionError, match=f"^{re.escape(said)}$"):
        convert_checkpoint(r50_files["bn"], given)
    with pytest.raises(ConversionError, match=f"^{re.escape(said)}$"):
        write_detectron2_pkl(small_weights(), given, author="me")
    assert os.listdir(tmp_path) == []


# an IN of 'r50.pth ' (a trailing space) was "r50.pth : no such file. Check the input path." while r50.pth was there;
# an empty IN was ": no such file. Check the input path."
def test_an_input_path_with_surrounding_whitespace_or_none_at_all_is_named(r50_files, tmp_path, monkeypatch, capsys):
    from gwdet.convert.cli import main

    monkeypatch.chdir(r50_files["bn"].parent)
    with pytest.raises(ConversionError, match=re.escape(
            "'bn.pth ': no such file, but 'bn.pth' exists: the path ends in ' ' (whitespace that a quoted or pasted "
            "path keeps). Give the path without it.")):
        convert_checkpoint("bn.pth ", tmp_path / "out.pkl")
    with pytest.raises(ConversionError, match=re.escape(
            "' bn.pth\\n': no such file, but 'bn.pth' exists: the path starts with ' ' and ends in '\\n'")):
        convert_checkpoint(" bn.pth\n", tmp_path / "out.pkl")
    assert main(["bn.pth ", str(tmp_path / "out.pkl")]) == 2
    assert "error: 'bn.pth ': no such file, but 'bn.pth' exists" in capsys.readouterr().err
    assert main(["", str(tmp_path / "out.pkl")]) == 2
    assert ("error: the input path is empty (IN on the command line, input_path in Python; an unset shell variable, "
            "as in \"$IN\"?): give the checkpoint file to convert, e.g. resnet50.pth.") in capsys.readouterr().err
    with pytest.raises(ConversionError, match=r"^missing\.pth : no such file\. Check the input path\.$"):
        convert_checkpoint("missing.pth ", tmp_path / "out.pkl")  # no file without the space either: as before
    assert os.listdir(tmp_path) == []


# an R-50 with one stray key layer4.3.conv1.weight was "unsupported architecture: the checkpoint has blocks per stage
# [3, 4, 6, 4] ...", with or without --allow-unexpected
def test_stray_keys_of_a_block_beyond_the_architecture_are_named_and_dropped_when_allowed():
    state_dict = _trained_looking_r50()
    state_dict["layer4.3.conv1.weight"] = torch.zeros(512, 2048, 1, 1)
    with pytest.raises(ConversionError, match=re.escape(
            "stray key of a block that the network does not have: layer4.3 holds only ['layer4.3.conv1.weight'] "
            "(keys of 1 of the 6 modules of a bottleneck block: conv1, bn1, conv2, bn2, conv3, bn3). The other blocks "
            "are R-50 (blocks per stage [3, 4, 6, 3], conv2 1 group x 64 channels), which has 3 blocks in layer4 "
            "(layer4.0-layer4.2), so this block is no part of the network (a whole block holds all six modules). Check "
            "that this is the checkpoint you meant; pass --allow-unexpected (in Python: allow_unexpected=True) to drop "
            "these keys and convert the rest as R-50; nothing was written.")):
        convert_state_dict(in_memory(state_dict))
    expected, _ = convert_state_dict(in_memory({key: value for key, value in state_dict.items()
                                                if not key.startswith("layer4.3.")}))
    weights, report = convert_state_dict(in_memory(state_dict), allow_unexpected=True)
    assert report.arch == "R-50" and report.unexpected == ["layer4.3.conv1.weight"]
    assert "unexpected    : 1 dropped (--allow-unexpected): ['layer4.3.conv1.weight']" in report.format()
    assert weights.keys() == expected.keys()
    # two such blocks, one holding a norm's statistics alone
    state_dict["layer2.4.bn1.running_mean"] = torch.zeros(128)
    with pytest.raises(ConversionError, match=r"stray keys of blocks that the network does not have: layer2\.4 holds "
                                              r"only \['layer2\.4\.bn1\.running_mean'\] .*; layer4\.3 holds only .*"
                                              r"which has 4 blocks in layer2 \(layer2\.0-layer2\.3\) and 3 blocks in "
                                              r"layer4 \(layer4\.0-layer4\.2\), so these blocks are no part"):
        convert_state_dict(in_memory(state_dict))
    assert convert_state_dict(in_memory(state_dict), allow_unexpected=True)[1].unexpected == [
        "layer2.4.bn1.running_mean", "layer4.3.conv1.weight"]


# a whole 4th block in layer4 (or half of one) is another architecture: refused as before, flag or not
@pytest.mark.parametrize("modules", [("conv1", "bn1", "conv2", "bn2", "conv3", "bn3"), ("conv1", "bn1", "conv2")],
                         ids=["whole", "half"])
def test_a_block_beyond_the_architecture_holding_half_its_modules_or_more_is_another_architecture(modules):
    state_dict = _trained_looking_r50()
    state_dict.update({key.replace("layer4.2.", "layer4.3."): value for key, value in list(state_dict.items())
                       if key.startswith("layer4.2.") and key.split(".")[2] in modules})
    for allow in (False, True):
        with pytest.raises(ConversionError, match=r"unsupported architecture: the checkpoint has blocks per stage "
                                                  r"\[3, 4, 6, 4\]"):
            convert_state_dict(in_memory(state_dict), allow_unexpected=allow)


# SIGTERM while the output was written ended the converter with no word, its 94 MB hidden .partial file left
def test_sigterm_while_the_output_is_written_removes_the_partial_file_and_says_so(r50_files, tmp_path, monkeypatch,
                                                                                   capsys):
    import signal
    import time

    import gwdet.convert.converter as converter
    from gwdet.convert.cli import main
    from gwdet.utils.cli_errors import TERMINATED_STATUS

    written = converter.write_atomically

    def terminated_while_writing(path, write, **kwargs):
        def write_then_terminate(file):
            file.write(b"\0" * 4096)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)  # the handler raises at once
        return written(path, write_then_terminate, **kwargs)

    monkeypatch.setattr(converter, "write_atomically", terminated_while_writing)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    started = time.monotonic()
    assert main([str(r50_files["bn"]), str(tmp_path / "out.pkl")]) == TERMINATED_STATUS == 143
    assert time.monotonic() - started < 30
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # no handler left installed
    assert ": terminated (SIGTERM) before the conversion finished: no output was written (it appears only once " \
        "complete, and a partial file of it is removed). Run the command again to convert." in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


# Before: a BN's running_mean/running_var saved as [1, C, 1, 1] was refused: "1 with a wrong shape:
# ['res2.0.conv1.norm.running_var [1, 64, 1, 1] (needs [64])']. The file is incomplete or of another architecture."
def test_bn_running_statistics_saved_as_1c11_are_reshaped_and_reported(r50_files):
    state_dict = torch.load(r50_files["bn"], weights_only=True)
    expected, _ = convert_state_dict(in_memory(state_dict))
    leaves = ("layer1.0.bn1.running_var", "bn1.running_mean", "bn1.running_var")
    broadcast = {key: value.reshape(1, -1, 1, 1) if key in leaves else value for key, value in state_dict.items()}
    weights, report = convert_state_dict(in_memory(broadcast))
    assert report.reshaped_bn_statistics == ["bn1", "layer1.0.bn1"] and report.reshaped_bn == []
    assert ("  reshaped stats: ['bn1', 'layer1.0.bn1'] kept running_mean/running_var as [1,C,1,1] (or another "
            "broadcasting shape):\n                  reshaped to [C], the same values") in report.format()
    assert weights.keys() == expected.keys()
    assert all((weights[key] == expected[key]).all() and weights[key].shape == expected[key].shape for key in weights)
    # a BatchNorm2d(affine=False) with such statistics: its weight 1 and bias 0 are written per channel, [C]
    no_affine = {key: value for key, value in broadcast.items() if key not in ("bn1.weight", "bn1.bias")}
    weights, report = convert_state_dict(in_memory(no_affine))
    assert report.identity_affine == ["bn1"] and report.reshaped_bn == []
    assert weights["stem.conv1.norm.weight"].shape == weights["stem.conv1.norm.running_var"].shape == (64,)
    assert (weights["stem.conv1.norm.weight"] == 1).all() and (weights["stem.conv1.norm.bias"] == 0).all()


# before: norms with no tensor at all (GW built with affine=False) were refused as "68 missing: [...running_mean...]
# ... The file is incomplete or of another architecture", listing running statistics GW layers never have
def test_norms_without_any_tensor_are_named_as_parameter_free_with_the_way_to_convert_them():
    state_dict = _trained_looking_r50()
    at_s1_b2 = [key for key in state_dict if key.rsplit(".", 1)[0] == "bn1" or
                (key.startswith("layer") and key.rsplit(".", 1)[0].endswith(".bn2"))]
    without = {key: value for key, value in state_dict.items() if key not in at_s1_b2}
    with pytest.raises(ConversionError) as refused:
        convert_state_dict(in_memory(without))
    message = str(refused.value)
    assert re.search(r"does not fit R-50 .*: 17 norms hold no tensor in the file, at S1 \(\['stem\.conv1\.norm'\]\); "
                     r"B2 \(\['res2\.0\.conv2\.norm', .*\(torchvision's \['bn1', 'layer1\.0\.bn2', .*while every other "
                     r"key is there\. A norm without affine parameters or running statistics \(a GroupWhitening or "
                     r"GroupNorm built with affine=False\) keeps nothing in its state dict", message)
    assert ("e.g. state_dict['bn1.weight'] = torch.ones(64) and state_dict['bn1.bias'] = torch.zeros(64), torch.save "
            "the state dict and convert that file with --gw-positions 'S1-B2' (in Python: gw_positions='S1-B2')") in message
    assert "running_mean" not in message and "incomplete or of another architecture" not in message
    for key in at_s1_b2:  # the way the message gives converts it
        if key.endswith((".weight", ".bias")):
            without[key] = torch.ones_like(state_dict[key]) if key.endswith(".weight") else torch.zeros_like(state_dict[key])
    weights, report = convert_state_dict(in_memory(without), gw_positions="S1-B2")
    assert report.gw_positions == "S1-B2" and (weights["stem.conv1.norm.weight"] == 1).all()
    one = {key: value for key, value in state_dict.items() if not key.startswith("layer1.0.bn2.")}
    with pytest.raises(ConversionError, match=r"1 norm holds no tensor in the file, at B2 \(\['res2\.0\.conv2\.norm'\]\)"
                                              r".*norms without state at these places alone are not converted"):
        convert_state_dict(in_memory(one))


# before: IN '-' (the checkpoint on standard input) was refused as "-: no such file. Check the input path.",
# after the output's checks, while OUT '-' got a message naming standard output
def test_the_input_dash_is_refused_as_standard_input_before_anything_else(tmp_path, capsys):
    from gwdet.convert.cli import main

    expected = ("the input path is '-', which many commands read as standard input, but the converter reads the "
                "checkpoint from a file, not from a stream: save the checkpoint to a file (e.g. r50.pth) and give its "
                "path (a file named '-' is given as ./-); nothing was converted.")
    (tmp_path / "out.pkl").write_bytes(b"kept")  # an existing output is refused later
    with pytest.raises(ConversionError, match=f"^{re.escape(expected)}$"):
        convert_checkpoint("-", tmp_path / "out.pkl")
    assert main(["-", str(tmp_path / "out.pkl"), "--gw-positions", "S9"]) == 2
    assert f"error: {expected}" in capsys.readouterr().err
    assert (tmp_path / "out.pkl").read_bytes() == b"kept"


# a source whose GW layers whiten by ZCA printed no MODEL.RESNETS.GW_NORM, so the printed config built ItN layers
# (GW_NORM's default), which then refused the weights (method 'zca' -> 'itn')
@pytest.mark.parametrize("name", ["GW_ZCA", "GW"])
def test_the_printed_config_names_the_recorded_whitening_method(tmp_path, name):
    import gwdet
    from gwdet.checkpoint.resilient import ResilientCheckpointer

    model = torchvision_model("R-50", with_gw=False)
    model.bn1 = gwdet.norm(name, num_groups=8)(model.bn1.num_features)
    for layer in (model.layer1, model.layer2, model.layer3, model.layer4):
        for block in layer:
            block.bn2 = gwdet.norm(name, num_groups=8)(block.bn2.num_features)
    weights, report = convert_state_dict(in_memory(model.state_dict()))
    assert report.config()["MODEL.RESNETS.GW_NORM"] == name and f'MODEL.RESNETS.GW_NORM: "{name}"' in report.format()
    path = tmp_path / "gw8.pkl"
    path.write_bytes(pickle.dumps({"model": weights, "__author__": "test", "matching_heuristics": True}))
    cfg = add_gwdet_config(get_cfg())
    cfg.merge_from_file(str(REPO / "configs" / "COCO-Detection" / "faster_rcnn_R_50_FPN_1x_gw.yaml"))
    cfg.MODEL.DEVICE = "cpu"
    cfg.merge_from_list([item for key, value in report.config().items() for item in (key, value)])
    detector = build_model(cfg)
    ResilientCheckpointer(detector).load(str(path))
    assert detector.backbone.bottom_up.stem.conv1.norm.method == ("zca" if name == "GW_ZCA" else "itn")


# a checkpoint stored in float8 stopped in the zero-variance check with torch's bare NotImplementedError
# ("lt_cpu" not implemented for 'Float8_e5m2'), a traceback in the tool
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_a_float8_checkpoint_converts_to_its_float32_values(dtype):
    import numpy as np

    model = torchvision_model("R-50", with_gw=False)
    state = {key: value.to(dtype) if value.is_floating_point() else value for key, value in model.state_dict().items()}
    weights, report = convert_state_dict(in_memory(state))
    assert report.arch == "R-50"
    assert np.array_equal(weights["stem.conv1.weight"], state["conv1.weight"].float().numpy())
    assert np.array_equal(weights["res2.0.conv1.norm.running_var"], state["layer1.0.bn1.running_var"].float().numpy())


# GW at the shortcuts only was refused as "... gwdet's backbone keeps BN at shortcuts." without the way out
def test_gw_at_the_shortcuts_only_is_refused_naming_what_converts():
    import gwdet

    model = torchvision_model("R-50", with_gw=False)
    for layer in (model.layer1, model.layer2, model.layer3, model.layer4):
        layer[0].downsample[1] = gwdet.norm("GW", num_groups=16)(layer[0].downsample[1].num_features)
    with pytest.raises(ConversionError, match=re.escape(
            "while other norms are BN: gwdet's backbone keeps BN at shortcuts, so no model of it computes this "
            "checkpoint's function; nothing was converted. Convert a ResNet with GW (gwdet.norm('GW') or an authors' "
            "GW layer) at block positions only and BN at the shortcuts, or one with BN everywhere.")):
        convert_state_dict(in_memory(model.state_dict()))


# an input record whose pixel_std held 2 values was written, and loading then advised MODEL.PIXEL_STD [1.0, 2.0]
def test_the_writer_refuses_pixel_statistics_of_another_channel_count(tmp_path):
    import numpy as np

    from gwdet.convert.converter import write_detectron2_pkl

    weights = {"stem.conv1.weight": np.zeros((64, 3, 7, 7), np.float32)}
    with pytest.raises(ConversionError, match=re.escape(
            "write_detectron2_pkl: metadata['input']['pixel_std'] is [1.0, 2.0] (list): gwdet's loading reads that "
            "field of the record to check the weights against the model, and takes a list of 3 numbers, one per "
            "colour channel of the RGB images there.")):
        write_detectron2_pkl(weights, tmp_path / "out.pkl", author="test", metadata={
            "input": {"format": "RGB", "pixel_mean": [1.0, 2.0, 3.0], "pixel_std": [1.0, 2.0]}})
    assert not (tmp_path / "out.pkl").exists()
    write_detectron2_pkl(weights, tmp_path / "out.pkl", author="test", metadata={
        "input": {"format": "RGB", "pixel_mean": [1.0, 2.0, 3.0], "pixel_std": [1.0, 2.0, 3.0]}})
