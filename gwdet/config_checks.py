"""Checks of a whole merged config, run before anything is built.

* every value of gwdet's config table passes its check (:func:`gwdet.config.check_config_values`);
* every NORM value is a known name (:class:`gwdet.norms.UnknownNormError`, naming the key);
* a NORM value only gwdet can build with the config's values (gwdet's names, GN with
  ``MODEL.GN.NUM_GROUPS`` other than 32) does not go to a detectron2 component that would build it
  without them; ``MODEL.RESNETS.GW_POSITIONS`` does not go to a backbone that ignores it;
* BGN example groups fit the batch.

Each failure names the key, the value and the fix.
"""
from __future__ import annotations

from dataclasses import dataclass

from detectron2.config import CfgNode

from gwdet.config import check_config_values, config_value, require_gwdet_config
from gwdet.positions import parse_gw_positions
from gwdet.norms import UnknownNormError, known_norm_names, norm_from_config

GW_BACKBONES = ("build_gw_resnet_backbone", "build_gw_resnet_fpn_backbone")


@dataclass(frozen=True)
class NormSite:
    """A NORM key, the key naming the component that reads it, detectron2's components that read
    it by name (without gwdet's values) and gwdet's replacement for them."""

    norm_key: str
    component_key: str
    detectron2_readers: tuple[str, ...]
    gwdet_reader: str


NORM_SITES = (
    NormSite("MODEL.RESNETS.NORM", "MODEL.BACKBONE.NAME",
             ("build_resnet_backbone", "build_resnet_fpn_backbone", "build_retinanet_resnet_fpn_backbone"),
             "build_gw_resnet_fpn_backbone (or build_gw_resnet_backbone)"),
    NormSite("MODEL.FPN.NORM", "MODEL.BACKBONE.NAME",
             ("build_resnet_fpn_backbone", "build_retinanet_resnet_fpn_backbone"),
             "build_gw_resnet_fpn_backbone"),
    NormSite("MODEL.ROI_BOX_HEAD.NORM", "MODEL.ROI_BOX_HEAD.NAME", ("FastRCNNConvFCHead",),
             "GWFastRCNNConvFCHead"),
    NormSite("MODEL.ROI_MASK_HEAD.NORM", "MODEL.ROI_MASK_HEAD.NAME", ("MaskRCNNConvUpsampleHead",),
             "GWMaskRCNNConvUpsampleHead"),
    NormSite("MODEL.RETINANET.NORM", "MODEL.META_ARCHITECTURE", ("RetinaNet",), "GWRetinaNet"),
)
NORM_KEYS = tuple(site.norm_key for site in NORM_SITES) + ("MODEL.RESNETS.GW_NORM",)
BATCH_GROUP_NORMS = {"BGN", "GhostBN"}


def _check_norm_names(cfg: CfgNode) -> set[str]:
    used = set()
    for key in NORM_KEYS:
        name = config_value(cfg, key)
        if name and name not in known_norm_names():
            raise UnknownNormError(
                f"{key}={name!r} is not a known norm name. Known names: "
                f"{', '.join(known_norm_names())} (or register one with gwdet.register_norm)."
            )
        used.add(name)
    return used


def _check_norm_readers(cfg: CfgNode) -> None:
    """A norm that needs the config's values must not go to a component that cannot take them."""
    for site in NORM_SITES:
        name = config_value(cfg, site.norm_key)
        component = config_value(cfg, site.component_key)
        if component not in site.detectron2_readers or isinstance(norm_from_config(name, cfg), str):
            continue
        if name == "GN":
            why = (f"MODEL.GN.NUM_GROUPS={cfg.MODEL.GN.NUM_GROUPS}, and detectron2's {component} "
                   "always builds GN with 32 groups")
        else:
            why = f"detectron2's {component} cannot build {name!r} with the config's values"
        raise ValueError(
            f"{site.norm_key}={name!r}, but {why}. Set {site.component_key} to gwdet's "
            f"{site.gwdet_reader}, which builds the same model with the configured norm."
        )


def _check_gw_positions(cfg: CfgNode) -> None:
    positions = cfg.MODEL.RESNETS.GW_POSITIONS
    parse_gw_positions(positions)
    if positions and not cfg.MODEL.RESNETS.GW_NORM:
        raise ValueError(
            f"MODEL.RESNETS.GW_POSITIONS={positions!r} with MODEL.RESNETS.GW_NORM='' would leave those "
            "positions without any normalization. Set GW_NORM to the norm to place there (e.g. 'GW'), "
            "or GW_POSITIONS to '' to keep MODEL.RESNETS.NORM everywhere.")
    if positions and cfg.MODEL.BACKBONE.NAME not in GW_BACKBONES:
        raise ValueError(
            f"MODEL.RESNETS.GW_POSITIONS={positions!r} is read by gwdet's backbones only, but "
            f"MODEL.BACKBONE.NAME={cfg.MODEL.BACKBONE.NAME!r} would build a model without GW there. "
            f"Set MODEL.BACKBONE.NAME to one of {', '.join(GW_BACKBONES)}, or GW_POSITIONS to ''."
        )


def _check_example_groups(cfg: CfgNode, used_norms: set[str]) -> None:
    """An example group larger than the whole batch never fills: BGN would silently become GN."""
    if not used_norms & BATCH_GROUP_NORMS:
        return
    examples, batch = cfg.MODEL.BGN.EXAMPLES_PER_GROUP, cfg.SOLVER.IMS_PER_BATCH
    if examples > batch:
        raise ValueError(
            f"config: MODEL.BGN.EXAMPLES_PER_GROUP={examples} is larger than SOLVER.IMS_PER_BATCH={batch}, "
            "so no example group can be filled. Use at most the images per GPU "
            "(SOLVER.IMS_PER_BATCH / number of GPUs)."
        )


def check_gwdet_config(cfg: CfgNode) -> None:
    """Raise (naming the key and the fix) for any config value gwdet cannot build as written."""
    require_gwdet_config(cfg, "gwdet")
    check_config_values(cfg)
    used_norms = _check_norm_names(cfg)
    _check_gw_positions(cfg)
    _check_norm_readers(cfg)
    _check_example_groups(cfg, used_norms)
