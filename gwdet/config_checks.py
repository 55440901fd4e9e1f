"""Checks on gwdet's config values, run before anything is built.

Each failure is a ``ValueError`` naming the config key, the value and the allowed range or names,
so a typo in a yaml file is reported as such instead of surfacing deep inside a layer.
"""
from __future__ import annotations

from detectron2.config import CfgNode

from gwdet.layers._common import check_int_at_least, check_positive, check_unit_interval
from gwdet.modeling.positions import parse_gw_positions
from gwdet.norm_registry import known_norm_names

OWNER = "config"
NORM_KEYS = (
    "MODEL.RESNETS.NORM",
    "MODEL.RESNETS.GW_NORM",
    "MODEL.FPN.NORM",
    "MODEL.ROI_BOX_HEAD.NORM",
    "MODEL.ROI_MASK_HEAD.NORM",
)
BATCH_GROUP_NORMS = {"BGN", "GhostBN"}


def _value(cfg: CfgNode, dotted_key: str):
    node = cfg
    for part in dotted_key.split("."):
        node = node[part]
    return node


def _check_norm_names(cfg: CfgNode) -> set[str]:
    known = known_norm_names()
    used = set()
    for key in NORM_KEYS:
        name = _value(cfg, key)
        if name and name not in known:
            raise ValueError(
                f"{OWNER}: {key}={name!r} is not a known norm name. Known names: {', '.join(known)} "
                "(or register one with gwdet.register_norm)."
            )
        used.add(name)
    return used


def _check_hyper_parameters(cfg: CfgNode) -> None:
    model = cfg.MODEL
    for key, value in (
        ("MODEL.GW.NUM_GROUPS", model.GW.NUM_GROUPS),
        ("MODEL.GW.T", model.GW.T),
        ("MODEL.GN.NUM_GROUPS", model.GN.NUM_GROUPS),
        ("MODEL.BW.GROUP_SIZE", model.BW.GROUP_SIZE),
        ("MODEL.BW.T", model.BW.T),
        ("MODEL.BGN.NUM_GROUPS", model.BGN.NUM_GROUPS),
        ("MODEL.BGN.EXAMPLES_PER_GROUP", model.BGN.EXAMPLES_PER_GROUP),
    ):
        check_int_at_least(OWNER, key, value, 1)
    for key, value in (("MODEL.GW.EPS", model.GW.EPS), ("MODEL.BW.EPS", model.BW.EPS), ("MODEL.BGN.EPS", model.BGN.EPS)):
        check_positive(OWNER, key, value)
    for key, value in (
        ("MODEL.BW.MOMENTUM", model.BW.MOMENTUM),
        ("MODEL.BGN.MOMENTUM", model.BGN.MOMENTUM),
        ("MODEL.BGN.EVAL_EXAMPLE_WEIGHT", model.BGN.EVAL_EXAMPLE_WEIGHT),
    ):
        check_unit_interval(OWNER, key, value)


def _check_example_groups(cfg: CfgNode, used_norms: set[str]) -> None:
    """An example group larger than the whole batch never fills: BGN would silently become GN."""
    if not used_norms & BATCH_GROUP_NORMS:
        return
    examples, batch = cfg.MODEL.BGN.EXAMPLES_PER_GROUP, cfg.SOLVER.IMS_PER_BATCH
    if examples > batch:
        raise ValueError(
            f"{OWNER}: MODEL.BGN.EXAMPLES_PER_GROUP={examples} is larger than SOLVER.IMS_PER_BATCH={batch}, "
            "so no example group can be filled. Use at most the images per GPU "
            "(SOLVER.IMS_PER_BATCH / number of GPUs)."
        )


def check_gwdet_config(cfg: CfgNode) -> None:
    """Raise ``ValueError`` naming the key for any gwdet config value that cannot work."""
    used_norms = _check_norm_names(cfg)
    _check_hyper_parameters(cfg)
    parse_gw_positions(cfg.MODEL.RESNETS.GW_POSITIONS)
    _check_example_groups(cfg, used_norms)
