"""detectron2 model parts that gwdet registers (backbones with GW at chosen positions)."""
from gwdet.modeling.backbone import build_gw_resnet_backbone, build_gw_resnet_fpn_backbone
from gwdet.modeling.positions import parse_gw_positions

__all__ = ["build_gw_resnet_backbone", "build_gw_resnet_fpn_backbone", "parse_gw_positions"]
