"""detectron2 model parts that gwdet registers: backbones with norms at chosen positions, and
detectron2's heads whose NORM carries the config's hyper-parameters."""
from gwdet.modeling.backbone import (
    build_gw_resnet_backbone,
    build_gw_resnet_fpn_backbone,
    build_gw_retinanet_resnet_fpn_backbone,
    place_norm,
)
from gwdet.modeling.example_weighing import apply_example_weighing, example_weighted_norm, weighable_norms
from gwdet.modeling.heads import (
    GWFastRCNNConvFCHead,
    GWMaskRCNNConvUpsampleHead,
    GWRes5ROIHeads,
    GWRetinaNet,
    GWRetinaNetHead,
    GWSemSegFPNHead,
    PerLevelNorm,
)
from gwdet.modeling.model_checks import check_model
from gwdet.modeling.build import build_model
from gwdet.positions import format_gw_positions, parse_gw_positions, reads_gw_positions

__all__ = [
    "GWFastRCNNConvFCHead",
    "GWMaskRCNNConvUpsampleHead",
    "GWRes5ROIHeads",
    "GWRetinaNet",
    "GWRetinaNetHead",
    "GWSemSegFPNHead",
    "PerLevelNorm",
    "apply_example_weighing",
    "build_gw_resnet_backbone",
    "build_gw_resnet_fpn_backbone",
    "build_gw_retinanet_resnet_fpn_backbone",
    "build_model",
    "check_model",
    "example_weighted_norm",
    "format_gw_positions",
    "parse_gw_positions",
    "place_norm",
    "reads_gw_positions",
    "weighable_norms",
]
