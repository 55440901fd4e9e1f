"""gwdet: group whitening and related normalizers for detectron2.

``import gwdet`` installs gwdet's norm names into detectron2's ``get_norm`` (see
:mod:`gwdet.norm_registry`) and registers the GW backbones in ``BACKBONE_REGISTRY``. Importing it
again, or importing detectron2's modeling code before or after it, is harmless.
"""
from gwdet.config import add_gwdet_config
from gwdet.norm_registry import install as _install_norms
from gwdet.norm_registry import known_norm_names, norm_config, register_norm

_install_norms()

from gwdet.modeling import build_gw_resnet_backbone, build_gw_resnet_fpn_backbone  # noqa: E402

__all__ = [
    "add_gwdet_config",
    "build_gw_resnet_backbone",
    "build_gw_resnet_fpn_backbone",
    "known_norm_names",
    "norm_config",
    "register_norm",
]
__version__ = "0.1.0"
