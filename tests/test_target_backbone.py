"""The shapes converted weights are checked against (gwdet.convert.target_backbone).

They come from gwdet's backbone built on the meta device; here they are compared with two other
sources: the same backbone built for real on the CPU (as a user's FPN config builds it), and
torchvision's own models (built on the meta device) mapped onto detectron2's names.
"""
import pytest
import torch
import torchvision
from detectron2.config import get_cfg
from detectron2.modeling import build_backbone

from gwdet import add_gwdet_config
from gwdet.convert import ARCHITECTURES, ConversionError, SourceStateDict, convert_state_dict
from gwdet.convert.architecture import infer_architecture
from gwdet.convert.target_backbone import expected_shapes, loading_config
from gwdet.convert.torchvision_keys import parse_torchvision_layout

TORCHVISION_BUILDERS = {
    "R-50": torchvision.models.resnet50,
    "R-101": torchvision.models.resnet101,
    "X-50-32x4d": torchvision.models.resnext50_32x4d,
    "X-101-32x8d": torchvision.models.resnext101_32x8d,
}
STAGES = ["res2", "res3", "res4", "res5"]


def cpu_backbone_shapes(arch: str, gw_positions: str, gn_style: bool) -> dict:
    """Shapes of the weights of ``backbone.bottom_up`` of an FPN model configured with the printed
    config (not the settings its norm layers record beside them)."""
    cfg = add_gwdet_config(get_cfg())
    config = loading_config(ARCHITECTURES[arch], gw_positions, gn_style)
    cfg.merge_from_list([item for key_value in config.items() for item in key_value])
    cfg.MODEL.BACKBONE.NAME = "build_gw_resnet_fpn_backbone"
    cfg.MODEL.RESNETS.OUT_FEATURES = STAGES
    cfg.MODEL.FPN.IN_FEATURES = STAGES
    bottom_up = build_backbone(cfg).bottom_up
    assert next(bottom_up.parameters()).device.type == "cpu"
    return {key: tuple(value.shape) for key, value in bottom_up.state_dict().items()
            if not key.endswith("._extra_state")}


@pytest.mark.parametrize(
    "arch,gw_positions,gn_style",
    [("R-50", "", False), ("R-50", "S1-B2", False), ("R-50", "", True), ("X-101-32x8d", "S1-B12", False)],
    ids=["R-50-BN", "R-50-GW", "R-50-GN", "X-101-32x8d-GW"],
)
def test_meta_shapes_equal_the_real_backbone(arch, gw_positions, gn_style):
    expected = expected_shapes(ARCHITECTURES[arch], gw_positions, gn_style)
    assert expected == cpu_backbone_shapes(arch, gw_positions, gn_style)
    leaves = {key.rsplit(".", 1)[1] for key in expected if key.startswith("res3.0.conv2.norm.")}
    assert leaves == ({"weight", "bias"} if gw_positions or gn_style else
                      {"weight", "bias", "running_mean", "running_var"})


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_torchvision_models_map_onto_the_expected_shapes(arch):
    with torch.device("meta"):
        state_dict = TORCHVISION_BUILDERS[arch]().state_dict()
    layout = parse_torchvision_layout(state_dict)
    assert infer_architecture(layout) == ARCHITECTURES[arch]
    found = {key: tuple(value.shape) for key, value in layout.convs.items()}
    for norm in layout.norms.values():
        found.update({f"{norm.target}.{leaf}": tuple(t.shape) for leaf, t in norm.tensors.items()})
    assert found == expected_shapes(ARCHITECTURES[arch], "", False)


@pytest.fixture(scope="module")
def resnet50_state_dict() -> dict:
    torch.manual_seed(0)
    return torchvision.models.resnet50(weights=None).state_dict()


@pytest.mark.parametrize(
    "source_key,shape,named",
    [
        ("layer3.1.conv2.weight", (256, 128, 3, 3), "res4.1.conv2.weight [256, 128, 3, 3] (needs [256, 256, 3, 3])"),
        ("layer4.0.bn1.running_var", (100,), "res5.0.conv1.norm.running_var [100] (needs [512])"),
    ],
)
def test_one_wrong_shape_is_refused_naming_the_tensor(resnet50_state_dict, source_key, shape, named):
    state_dict = dict(resnet50_state_dict)
    state_dict[source_key] = torch.zeros(shape)
    with pytest.raises(ConversionError) as error:
        convert_state_dict(SourceStateDict(state_dict, "bare state_dict", ""))
    message = str(error.value)
    assert "does not fit R-50 (blocks per stage [3, 4, 6, 3]" in message
    assert f"1 with a wrong shape: ['{named}']" in message
    assert "missing" not in message and "surplus" not in message
    assert "incomplete or of another architecture" in message
