"""detectron2 model parts that gwdet registers (backbones with GW at chosen positions)."""
from gwdet.modeling.backbone import build_gw_resnet_backbone, build_gw_resnet_fpn_backbone
from gwdet.modeling.example_weighing import apply_example_weighing, example_weighted_norm, weighable_norms
from gwdet.modeling.positions import parse_gw_positions

__all__ = [
    "apply_example_weighing",
    "build_gw_resnet_backbone",
    "build_gw_resnet_fpn_backbone",
    "example_weighted_norm",
    "parse_gw_positions",
    "weighable_norms",
]
