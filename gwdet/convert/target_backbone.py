"""The backbone that loads converted weights: its config, and the tensor shapes it expects.

The shapes are not derived by hand: detectron2 builds gwdet's registered ResNet backbone with the
config printed for the weights, on the meta device (no memory, no initialization), and its
``state_dict`` is what the converted weights must match, key for key and shape for shape. So the
check can never disagree with the model that will load the weights.
"""
from __future__ import annotations

import numpy as np
import torch
from detectron2.config import get_cfg
from detectron2.modeling import build_backbone

from gwdet.convert.architecture import Architecture
from gwdet.convert.loading import ConversionError, preview_names
from gwdet.config import add_gwdet_config
from gwdet.layers.settings_state import EXTRA_STATE_KEY
from gwdet.modeling.backbone import build_gw_resnet_backbone

TORCHVISION_PIXEL_MEAN = (123.675, 116.28, 103.53)  # ImageNet statistics, RGB, 0-255 units
TORCHVISION_PIXEL_STD = (58.395, 57.12, 57.375)
LAST_STAGE = "res5"  # asking for its output makes detectron2 build every stage


def loading_config(arch: Architecture, gw_positions: str, gn_style: bool) -> dict[str, object]:
    """The config keys (detectron2's and gwdet's) of a model loading weights of ``arch`` with GW
    at ``gw_positions`` (a GW_POSITIONS string), GN elsewhere if ``gn_style`` else BN.

    torchvision feeds RGB images normalized by its pixel mean/std and puts the stride in the 3x3
    conv (``STRIDE_IN_1X1: False``); the BN statistics are frozen (BN/SyncBN to train them).
    """
    return {
        "MODEL.RESNETS.DEPTH": arch.depth,
        "MODEL.RESNETS.NUM_GROUPS": arch.num_groups,
        "MODEL.RESNETS.WIDTH_PER_GROUP": arch.width_per_group,
        "MODEL.RESNETS.STRIDE_IN_1X1": False,
        "MODEL.RESNETS.NORM": "GN" if gn_style else "FrozenBN",
        "MODEL.RESNETS.GW_POSITIONS": gw_positions,
        "MODEL.PIXEL_MEAN": list(TORCHVISION_PIXEL_MEAN),
        "MODEL.PIXEL_STD": list(TORCHVISION_PIXEL_STD),
        "INPUT.FORMAT": "RGB",
    }


def expected_shapes(
    arch: Architecture, gw_positions: str, gn_style: bool
) -> dict[str, tuple[int, ...]]:
    """Every key of gwdet's backbone configured by :func:`loading_config`, with its shape.

    The names are the backbone's own (``stem.conv1.weight``, ``res2.0.conv2.norm.running_var``),
    as in converted weights; the backbone is built on the meta device, so this is cheap even for
    an X-101-32x8d.
    """
    config = loading_config(arch, gw_positions, gn_style)
    cfg = add_gwdet_config(get_cfg())
    cfg.merge_from_list([item for key_value in config.items() for item in key_value])
    cfg.MODEL.BACKBONE.NAME = build_gw_resnet_backbone.__name__
    cfg.MODEL.RESNETS.OUT_FEATURES = [LAST_STAGE]
    with torch.device("meta"):
        backbone = build_backbone(cfg)
    # not the settings gwdet's norm layers record in their state: converted weights have none to give
    return {key: tuple(value.shape) for key, value in backbone.state_dict().items()
            if not key.endswith(EXTRA_STATE_KEY)}


def check_fits_architecture(
    weights: dict[str, np.ndarray], expected: dict[str, tuple[int, ...]], arch: Architecture
) -> None:
    """Raise naming the missing, surplus and mis-shaped keys unless ``weights`` is ``expected``."""
    missing = [key for key in expected if key not in weights]
    surplus = [key for key in weights if key not in expected]
    misshaped = [
        f"{key} {list(weights[key].shape)} (needs {list(shape)})"
        for key, shape in expected.items()
        if key in weights and tuple(weights[key].shape) != shape
    ]
    findings = (("missing", missing), ("surplus", surplus), ("with a wrong shape", misshaped))
    problems = [f"{len(keys)} {what}: {preview_names(keys, 4)}" for what, keys in findings if keys]
    if problems:
        raise ConversionError(
            f"the checkpoint does not fit {arch.describe()} (keys in detectron2's names): "
            f"{'; '.join(problems)}. The file is incomplete or of another architecture."
        )
