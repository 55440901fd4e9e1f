"""What the layer level times, and the targets it is held to.

The cases: BN, GN(32), GW (ItN, g=64, T=5; and ZCA), the autograd implementation of GW (the state
before the fused op), BW (DBN, ZCA, groups of 16), BGN and, as the yardstick, a 3x3 convolution
C -> C, at the activation shapes of a Faster R-CNN R-50-FPN (:data:`LAYER_SHAPES`); 2-D inputs
``(N, C)`` are fed to the convolution as ``(N, C, 1, 1)``.

The targets: GW (ItN) forward + backward at most ``max(0.20, 1.5 x analytic)`` of the convolution,
where the analytic ratio is the GW paper's cost model (Sec. 3, ``2g/(9d) + T g^3/(9 HW d^2)``) as
:func:`gwdet.layers.cost.group_whitening_relative_cost` computes it; peak memory at most 1.3 x
GN(32)'s.

Every norm layer but BN is built by :func:`gwdet.norm` with gwdet's config defaults (GW: g =
``MODEL.GW.NUM_GROUPS``, T = ``MODEL.GW.T``; BW: ``MODEL.BW.GROUP_SIZE``; BGN:
``MODEL.BGN.NUM_GROUPS`` and ``MODEL.BGN.EXAMPLES_PER_GROUP``; GN: ``MODEL.GN.NUM_GROUPS``, cut
to a divisor of C). BN is torch's: the 2-D shape needs ``BatchNorm1d``.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Sequence, Tuple

import torch
from torch import nn

import gwdet
from gwdet.config import config_default
from gwdet.layers import GroupWhitening, group_whitening_reference, largest_divisor_at_most
from gwdet.layers.cost import group_whitening_relative_cost

GW_GROUPS: int = config_default("MODEL.GW.NUM_GROUPS")
GW_T: int = config_default("MODEL.GW.T")
GN_GROUPS: int = config_default("MODEL.GN.NUM_GROUPS")

Shape = Tuple[int, ...]
LayerFactory = Callable[[int, int], nn.Module]

LAYER_SHAPES: List[Tuple[str, Shape]] = [
    ("backbone", (2, 64, 200, 200)),
    ("backbone", (2, 256, 64, 64)),
    ("backbone", (2, 1024, 32, 32)),
    ("FPN", (2, 256, 100, 152)),
    ("ROI heads", (512, 256, 7, 7)),
    ("ROI heads", (256, 256, 14, 14)),
    ("2-D", (1024, 1024)),
]
QUICK_LAYER_SHAPES: List[Tuple[str, Shape]] = [
    ("backbone", (2, 16, 12, 12)),
    ("ROI heads", (8, 64, 4, 4)),
    ("2-D", (16, 128)),
]

CONV = "conv 3x3"
GW_ITN = "GW (itn)"
GW_AUTOGRAD = "GW (itn), autograd"
GN = f"GN({GN_GROUPS})"
COMPILED = ", compiled"
COMPILED_CASES = (GW_ITN, "BW", "BGN")

TIME_FLOOR = 0.20
TIME_SLACK = 1.5
MEMORY_LIMIT = 1.3


class AutogradGroupWhitening(nn.Module):
    """GW written as plain tensor operations and differentiated by autograd
    (:func:`gwdet.layers.group_whitening_reference`): what :class:`gwdet.layers.GroupWhitening`
    ran before its fused op."""

    def __init__(self, num_channels: int) -> None:
        super().__init__()
        self.inner = group_whitening(num_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inner = self.inner
        return group_whitening_reference(
            x, inner.effective_num_groups, inner.T, inner.eps, inner.method, inner.weight, inner.bias
        )


def group_whitening(channels: int) -> GroupWhitening:
    """The GW layer every level of the benchmark times: ItN, g = :data:`GW_GROUPS`, T = :data:`GW_T`
    (gwdet's defaults)."""
    return gwdet.norm("GW")(channels)


def layer_factories(include_autograd: bool, include_compiled: bool = False) -> Dict[str, LayerFactory]:
    """``name -> factory(channels, input_dim) -> module``, the convolution first; with
    ``include_compiled`` also ``torch.compile`` (inductor, fullgraph) of :data:`COMPILED_CASES`
    (GW stays the opaque custom op)."""
    factories: Dict[str, LayerFactory] = {
        CONV: lambda c, dim: nn.Conv2d(c, c, 3, padding=1, bias=False),
        "BN": lambda c, dim: nn.BatchNorm1d(c) if dim == 2 else nn.BatchNorm2d(c),
        GN: lambda c, dim: gwdet.norm("GN", num_groups=largest_divisor_at_most(c, GN_GROUPS))(c),
        GW_ITN: lambda c, dim: group_whitening(c),
        "GW (zca)": lambda c, dim: gwdet.norm("GW_ZCA")(c),
        "BW": lambda c, dim: gwdet.norm("BW")(c),
        "BGN": lambda c, dim: gwdet.norm("BGN")(c),
    }
    if include_autograd:
        factories[GW_AUTOGRAD] = lambda c, dim: AutogradGroupWhitening(c)
    if include_compiled:
        for name in COMPILED_CASES:
            factories[name + COMPILED] = lambda c, dim, make=factories[name]: torch.compile(make(c, dim), fullgraph=True)
    return factories


def input_view(name: str, shape: Sequence[int]) -> Shape:
    """The shape case ``name`` is fed at ``shape``: the convolution sees ``(N, C)`` as ``(N, C, 1, 1)``."""
    if name == CONV and len(shape) == 2:
        return (shape[0], shape[1], 1, 1)
    return tuple(shape)


def analytic_ratio(shape: Sequence[int]) -> float:
    """GW's cost relative to a 3x3 conv (GW paper, Sec. 3): ``2g/(9d) + T g^3 / (9 HW d^2)``."""
    return group_whitening_relative_cost(shape, GW_GROUPS, GW_T)


def time_target(shape: Sequence[int]) -> float:
    """The largest GW (ItN) / conv time ratio allowed at ``shape``."""
    return max(TIME_FLOOR, TIME_SLACK * analytic_ratio(shape))


def verdict(value: float, limit: float) -> str:
    """``"yes"`` when ``value <= limit``, else by how much it misses: ``"no (+26%)"``."""
    if value <= limit:
        return "yes"
    return f"no (+{(value / limit - 1) * 100:.0f}%)"


def format_shape(shape: Sequence[int]) -> str:
    """``(2, 64, 200, 200)``."""
    return "(" + ", ".join(str(size) for size in shape) + ")"
