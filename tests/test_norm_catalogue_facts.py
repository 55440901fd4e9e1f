"""Every fact gwdet's checks use about norm layer classes comes from the norm catalogue
(gwdet.norms): a norm registered with ``register_norm`` (``layer_types``, ``batch_statistics``) is
then a norm to the optimizer's weight decay, to the batch-statistics check of heads shared by FPN
levels, to gwdet's checkpoints and to flop counting, with no other edit; unregistered, it is
none of these again."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from detectron2.layers import ShapeSpec
from detectron2.modeling.meta_arch.retinanet import RetinaNetHead
from torch import nn

import gwdet
from gwdet.checkpoint.compatibility import norm_settings, norm_types
from gwdet.layers import BatchGroupNorm, GroupWhitening
from gwdet.modeling import GWRetinaNetHead, check_model
from gwdet.modeling.model_checks import shared_batch_statistics
from gwdet.norms import register_norm, unregister_norm
from gwdet.solver import get_default_optimizer_params, is_norm_layer

LEVELS = [ShapeSpec(channels=8, stride=s) for s in (8, 16, 32)]
WEIGHT_DECAY, WEIGHT_DECAY_NORM = 1e-4, 0.0


class BatchCentering(nn.Module):
    """Subtracts each channel's batch mean (its running mean in evaluation), then scales and
    shifts: a norm with batch statistics whose class derives from no norm class of torch's,
    detectron2's or gwdet's."""

    def __init__(self, channels: int, momentum: float = 0.1) -> None:
        super().__init__()
        self.momentum = momentum
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.register_buffer("running_mean", torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            mean = x.mean(dim=(0, 2, 3))
            with torch.no_grad():
                self.running_mean.lerp_(mean, self.momentum)
        else:
            mean = self.running_mean
        return (x - mean[:, None, None]) * self.weight[:, None, None] + self.bias[:, None, None]


class OwnBatchGroupNorm(BatchGroupNorm):
    """A layer class of its own that computes as gwdet's BatchGroupNorm."""


class ScaledGroupWhitening(GroupWhitening):
    """GW with one more setting that makes it the function it is (a scale of its output)."""

    HYPER_PARAMETERS = GroupWhitening.HYPER_PARAMETERS + ("scale",)

    def __init__(self, channels: int, scale: float = 2.0) -> None:
        super().__init__(channels, num_groups=2)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * self.scale


@pytest.fixture
def batch_centering() -> Iterator[str]:
    register_norm("TestBatchCentering", BatchCentering, batch_statistics=True, layer_types=(BatchCentering,))
    try:
        yield "TestBatchCentering"
    finally:
        unregister_norm("TestBatchCentering")


@pytest.fixture
def own_batch_group_norm() -> Iterator[str]:
    def build(channels: int, num_groups: int = 2) -> nn.Module:
        return OwnBatchGroupNorm(channels, num_groups=num_groups)

    register_norm("TestOwnBGN", build, batch_statistics=True, layer_types=(OwnBatchGroupNorm,))
    try:
        yield "TestOwnBGN"
    finally:
        unregister_norm("TestOwnBGN")


def norm_decays(model: nn.Module, layer: nn.Module) -> set[float]:
    """The weight decays gwdet's optimizer groups give the parameters of ``layer``."""
    groups = get_default_optimizer_params(model, base_lr=0.1, weight_decay=WEIGHT_DECAY,
                                          weight_decay_norm=WEIGHT_DECAY_NORM)
    mine = {id(param) for param in layer.parameters()}
    return {group.get("weight_decay", WEIGHT_DECAY) for group in groups for param in group["params"]
            if id(param) in mine}


def shared_head() -> RetinaNetHead:
    # detectron2's head runs one module on every level; the layers are built without a norm name
    return RetinaNetHead(input_shape=LEVELS, num_classes=2, num_anchors=1, conv_dims=[8],
                         norm=lambda channels: BatchCentering(channels))


def test_a_registered_layer_type_is_a_norm_to_the_optimizer_the_head_check_and_checkpoints(batch_centering):
    # the layers are made directly, so no mark of the norm name is on them: only their class counts
    layer = BatchCentering(8)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), layer)
    assert is_norm_layer(layer)
    assert norm_decays(model, layer) == {WEIGHT_DECAY_NORM}
    assert norm_types(model) == {"1": "BatchCentering"}
    head = shared_head()
    assert shared_batch_statistics(head) == ["cls_subnet.1", "bbox_subnet.1"]
    with pytest.raises(ValueError, match="mixes the levels' statistics"):
        check_model(nn.Sequential(head))
    per_level = GWRetinaNetHead(input_shape=LEVELS, num_classes=2, num_anchors=1, conv_dims=[8],
                                norm=gwdet.norm(batch_centering))
    assert check_model(per_level) is per_level  # gwdet's head keeps the norm per level

    unregister_norm(batch_centering)
    try:
        assert not is_norm_layer(layer)
        assert norm_decays(model, layer) == {WEIGHT_DECAY}
        assert norm_types(model) == {}
        assert shared_batch_statistics(shared_head()) == []
    finally:
        register_norm(batch_centering, BatchCentering, batch_statistics=True, layer_types=(BatchCentering,))


def test_a_registered_subclass_of_a_gwdet_layer_is_counted_as_that_layer(own_batch_group_norm):
    pytest.importorskip("detectron2.export", reason="gwdet.export needs detectron2 >= 0.7")
    from gwdet.export import FlopCountAnalysis, component_shares
    from gwdet.layers.cost import batch_group_norm_macs

    layer = gwdet.norm(own_batch_group_norm)(8)
    model = nn.Sequential(nn.Conv2d(8, 8, 1), layer).eval()
    x = torch.randn(2, 8, 3, 3, generator=torch.Generator().manual_seed(0))
    analysis = FlopCountAnalysis(model, (x,))
    (whole,) = component_shares(analysis, model, {"all": ""})
    expected = batch_group_norm_macs(x.shape, affine=True, computes_statistics=False)
    assert analysis.by_model_module()["1"] == expected
    assert whole["by_op"] == {"gwdet::batch_group_norm": expected}
    assert not analysis.unsupported_ops()
    assert is_norm_layer(layer) and norm_types(model) == {"1": "OwnBatchGroupNorm"}

    unregister_norm(own_batch_group_norm)
    try:
        (whole,) = component_shares(FlopCountAnalysis(model, (x,)), model, {"all": ""})
        # its own name gone, the layer is still a BatchGroupNorm, counted as one
        assert whole["by_op"] == {"gwdet::batch_group_norm": expected}
    finally:
        register_norm(own_batch_group_norm, lambda channels: OwnBatchGroupNorm(channels, num_groups=2),
                      batch_statistics=True, layer_types=(OwnBatchGroupNorm,))


def test_checkpoints_record_the_settings_a_registered_subclass_of_a_gwdet_layer_names():
    model = nn.Sequential(ScaledGroupWhitening(8, scale=3.0))
    gw_settings = {"num_groups": 2, "T": 5, "eps": 1e-5, "method": "itn"}
    assert norm_settings(model) == {"0": gw_settings}  # unregistered: the GW layer it derives from
    register_norm("TestScaledGW", ScaledGroupWhitening, layer_types=(ScaledGroupWhitening,))
    try:
        assert norm_settings(model) == {"0": {**gw_settings, "scale": 3.0}}
    finally:
        unregister_norm("TestScaledGW")
