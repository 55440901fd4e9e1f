"""Every config key gwdet adds to detectron2's config, with its default.

``add_gwdet_config(cfg)`` follows detectron2's project convention (``add_pointrend_config`` and the
like): call it on a fresh ``get_cfg()`` before ``merge_from_file``. Calling it twice is harmless.
"""
from __future__ import annotations

from detectron2.config import CfgNode as CN


def add_gwdet_config(cfg: CN) -> CN:
    """Add gwdet's keys (norm hyper-parameters, GW positions, the shapes dataset) to ``cfg``.

    Returns ``cfg`` for chaining. Keys already present keep their values, so the call is idempotent.
    """
    _add_norm_keys(cfg)
    _add_backbone_keys(cfg)
    _add_dataset_keys(cfg)
    _add_output_keys(cfg)
    return cfg


def _ensure(node: CN, key: str) -> CN:
    if key not in node:
        node[key] = CN()
    return node[key]


def _set_default(node: CN, key: str, value) -> None:
    if key not in node:
        node[key] = value


def _add_norm_keys(cfg: CN) -> None:
    # Group whitening (group_whitening_huang2021, Eqs. 8-10): the names "GW" (ItN, Eqs. 6-7) and
    # "GW_ZCA" (Eq. 5). A layer with fewer channels than NUM_GROUPS uses one channel per group.
    gw = _ensure(cfg.MODEL, "GW")
    _set_default(gw, "NUM_GROUPS", 64)
    _set_default(gw, "T", 5)
    _set_default(gw, "EPS", 1e-5)

    # Group normalization behind the name "GN": detectron2 fixes 32 groups; this makes it a knob so
    # GN and GW can be compared at the same group number (group_whitening_huang2021, Fig. 6).
    gn = _ensure(cfg.MODEL, "GN")
    _set_default(gn, "NUM_GROUPS", 32)

    # Batch whitening (decorrelated_batchnorm_huang2018, Algorithm 1): "BW" (ZCA) and "BW_ItN".
    bw = _ensure(cfg.MODEL, "BW")
    _set_default(bw, "GROUP_SIZE", 16)
    _set_default(bw, "T", 5)
    _set_default(bw, "EPS", 1e-5)
    _set_default(bw, "MOMENTUM", 0.1)

    # Batch-group normalization (four_things_batchnorm_summers2020, Sec. 3.4): "BGN"; "GhostBN" is
    # the same layer with one channel per group (Sec. 3.2) and reads EXAMPLES_PER_GROUP, MOMENTUM,
    # EPS and EVAL_EXAMPLE_WEIGHT (inference example weighing, Sec. 3.1, Eq. 3) from here too.
    bgn = _ensure(cfg.MODEL, "BGN")
    _set_default(bgn, "NUM_GROUPS", 32)
    _set_default(bgn, "EXAMPLES_PER_GROUP", 2)
    _set_default(bgn, "EVAL_EXAMPLE_WEIGHT", 0.0)
    _set_default(bgn, "MOMENTUM", 0.1)
    _set_default(bgn, "EPS", 1e-5)


def _add_backbone_keys(cfg: CN) -> None:
    # Positions of GW in a ResNet/ResNeXt (group_whitening_huang2021, Sec. 5.1.1): tokens S1 (stem),
    # B1, B2, B3 (norm after conv1/conv2/conv3 of every bottleneck) and B12, joined by "-".
    # "" means none. GW_NORM is the norm name placed there; every other norm follows RESNETS.NORM.
    _set_default(cfg.MODEL.RESNETS, "GW_POSITIONS", "")
    _set_default(cfg.MODEL.RESNETS, "GW_NORM", "GW")


def _add_dataset_keys(cfg: CN) -> None:
    # The embedded synthetic dataset (gwdet/data/shapes.py), registered as "shapes_train" and
    # "shapes_val". ROOT "" means the cache folder ($GWDET_CACHE or ~/.cache/gwdet).
    shapes = _ensure(cfg.DATASETS, "SHAPES")
    _set_default(shapes, "ROOT", "")
    _set_default(shapes, "NUM_TRAIN", 200)
    _set_default(shapes, "NUM_VAL", 50)
    _set_default(shapes, "IMAGE_SIZE", 128)
    _set_default(shapes, "SEED", 0)


def _add_output_keys(cfg: CN) -> None:
    # After training/evaluation, draw predictions on this many images of DATASETS.TEST[0] into
    # OUTPUT_DIR/vis (detectron2's Visualizer). 0 turns it off.
    _set_default(cfg.TEST, "VIS_IMAGES", 0)
