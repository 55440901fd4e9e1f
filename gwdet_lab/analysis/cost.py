"""Cost of every GW layer of a detectron2 model relative to a 3x3 convolution (GW paper, Sec. 3).

For a ``d``-channel input of spatial size ``H x W``, GW with ``g`` groups and ItN (T iterations)
costs ``2 HW d g + T g^3`` multiply-adds per sample; a 3x3 convolution with d input and d output
channels costs ``9 HW d^2``, so the relative cost is ``2g / (9d) + T g^3 / (9 HW d^2)``.

The spatial size each GW layer sees is measured, not assumed: the model built from the config
runs one training-mode forward pass on a dummy image (with one ground-truth instance, so that the
box and mask heads run too) while forward hooks record every GW layer's input shape. For head
layers a "sample" is one region of interest (e.g. 7x7), for backbone/FPN layers one image.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from detectron2.config import CfgNode
from detectron2.modeling import build_model
from detectron2.structures import BitMasks, Boxes, Instances
from detectron2.utils.events import EventStorage
from torch import nn

from gwdet_lab.analysis.constraints import check_sizes

from gwdet.layers import GroupWhitening
from gwdet.layers.common import check_int_at_least, check_iterations
from gwdet.layers.cost import group_whitening_macs, group_whitening_relative_cost


def relative_cost(d: int, g: int, height: int, width: int, T: int) -> float:
    """``2g / (9d) + T g^3 / (9 HW d^2)``: GW (ItN, T iterations) over a 3x3 d -> d convolution
    (the plugin's formula, :func:`gwdet.layers.cost.group_whitening_relative_cost`).

    ``d``, ``g``, ``height`` and ``width`` are integers >= 1 and ``g`` divides ``d`` (the groups a
    layer whitens, e.g. its ``effective_num_groups``), ``T`` an integer from 1 to
    :data:`gwdet.layers.common.MAX_ITERATIONS`; others are refused (``ValueError``)."""
    owner = "relative_cost"
    check_sizes(owner, d, g=g)
    check_int_at_least(owner, "height", height, 1)
    check_int_at_least(owner, "width", width, 1)
    check_iterations(owner, T)
    return group_whitening_relative_cost((1, d, height, width), g, T)


@dataclass(frozen=True)
class GWLayerCost:
    """One GW layer: its module name, channels d, effective groups g, input H x W and costs."""

    name: str
    d: int
    g: int
    height: int
    width: int
    method: str
    T: int

    @property
    def ratio(self) -> float:
        """Relative cost against a 3x3 convolution at the same size (ItN formula)."""
        return relative_cost(self.d, self.g, self.height, self.width, self.T)

    @property
    def product_term(self) -> float:
        """``2g / (9d)``: covariance and whitening products over the activation."""
        return 2 * self.g / (9 * self.d)

    @property
    def newton_term(self) -> float:
        """``T g^3 / (9 HW d^2)``: the T Newton iterations on the ``g x g`` covariance."""
        return self.ratio - self.product_term

    @property
    def mega_ops_per_sample(self) -> float:
        """``(2 HW d g + T g^3) / 10^6`` multiply-adds per sample (image, or ROI in the heads)."""
        return group_whitening_macs((1, self.d, self.height, self.width), self.g, self.T) / 1e6


def dummy_training_batch(height: int, width: int, mask_on: bool) -> list[dict]:
    """One random ``height x width`` image with one box (and mask) covering its centre."""
    instances = Instances((height, width))
    box = [width / 4, height / 4, 3 * width / 4, 3 * height / 4]
    instances.gt_boxes = Boxes(torch.tensor([box]))
    instances.gt_classes = torch.zeros(1, dtype=torch.int64)
    if mask_on:
        mask = torch.zeros(1, height, width, dtype=torch.bool)
        mask[0, height // 4 : 3 * height // 4, width // 4 : 3 * width // 4] = True
        instances.gt_masks = BitMasks(mask)
    return [{"image": torch.rand(3, height, width) * 255, "instances": instances}]


def cost_model(cfg: CfgNode) -> nn.Module:
    """``build_model(cfg)`` with seed 0, in training mode: the model :func:`gw_layer_costs` runs."""
    torch.manual_seed(0)
    model = build_model(cfg)
    model.train()
    return model


def gw_layer_costs(cfg: CfgNode, height: int, width: int, model: nn.Module | None = None) -> list[GWLayerCost]:
    """Every :class:`GroupWhitening` layer of ``model`` (default: :func:`cost_model` of ``cfg``) in
    the order it runs, with the input size it sees on a ``height x width`` image.
    ``cfg.MODEL.DEVICE`` should be ``"cpu"``."""
    if model is None:
        model = cost_model(cfg)
    seen: dict[str, GWLayerCost] = {}

    def record(name: str):
        def hook(module: GroupWhitening, inputs: tuple, _output) -> None:
            spatial = tuple(inputs[0].shape[2:])  # () for (N, C) input
            height = spatial[0] if spatial else 1
            width = math.prod(spatial[1:])
            if name not in seen:
                seen[name] = GWLayerCost(
                    name, module.num_channels, module.effective_num_groups, height, width, module.method, module.T
                )

        return hook

    handles = [
        module.register_forward_hook(record(name))
        for name, module in model.named_modules()
        if isinstance(module, GroupWhitening)
    ]
    try:
        with torch.no_grad(), EventStorage():  # detectron2's training losses log into one
            model(dummy_training_batch(height, width, cfg.MODEL.MASK_ON))
    finally:
        for handle in handles:
            handle.remove()
    return list(seen.values())
