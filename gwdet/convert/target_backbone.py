"""The backbone that loads converted weights: its config, and the tensor shapes it expects.

The shapes are not derived by hand: detectron2 builds gwdet's registered ResNet backbone with the
config printed for the weights, on the meta device (no memory, no initialization), and its
``state_dict`` is what the converted weights must match, key for key and shape for shape. So the
check can never disagree with the model that will load the weights.
"""
from __future__ import annotations

import re

import numpy as np
import torch
from detectron2.config import get_cfg
from detectron2.modeling import build_backbone

from gwdet.convert.architecture import Architecture
from gwdet.convert.loading import ConversionError, preview_names
from gwdet.config import add_gwdet_config
from gwdet.layers.settings_state import EXTRA_STATE_KEY
from gwdet.modeling.backbone import build_gw_resnet_backbone
from gwdet.positions import POSITIONS, format_gw_positions

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
    """Raise naming the missing, surplus and mis-shaped keys unless ``weights`` is ``expected``; where
    the only keys missing are whole norms, naming those norms as holding no tensor in the file (a norm
    built with ``affine=False`` and no running statistics) and how to convert them."""
    missing = [key for key in expected if key not in weights]
    surplus = [key for key in weights if key not in expected]
    misshaped = [
        f"{key} {list(weights[key].shape)} (needs {list(shape)})"
        for key, shape in expected.items()
        if key in weights and tuple(weights[key].shape) != shape
    ]
    if missing and not surplus and not misshaped:
        _check_norms_present(weights, expected, missing, arch)
    findings = (("missing", missing), ("surplus", surplus), ("with a wrong shape", misshaped))
    problems = [f"{len(keys)} {what}: {preview_names(keys, 4)}" for what, keys in findings if keys]
    if problems:
        raise ConversionError(
            f"the checkpoint does not fit {arch.describe()} (keys in detectron2's names): "
            f"{'; '.join(problems)}. The file is incomplete or of another architecture."
        )


_NORM_MODULE = re.compile(r"(stem\.conv1|res(\d)\.(\d+)\.(conv[123]|shortcut))\.norm")
STATISTICS_KEY = "running_mean"


def _norm_position(module: str) -> str | None:
    """detectron2 norm module -> its GW position (S1, B1, B2, B3), "shortcut", or None if no norm."""
    match = _NORM_MODULE.fullmatch(module)
    if match is None:
        return None
    if match.group(2) is None:
        return "S1"
    part = match.group(4)
    return "shortcut" if part == "shortcut" else f"B{part[-1]}"


def _torchvision_norm(module: str) -> str:
    """detectron2 norm module -> torchvision's name of it (``res2.0.conv2.norm`` -> ``layer1.0.bn2``)."""
    match = _NORM_MODULE.fullmatch(module)
    if match is None:
        return module
    if match.group(2) is None:
        return "bn1"
    stage, block, part = int(match.group(2)) - 1, match.group(3), match.group(4)
    return f"layer{stage}.{block}.downsample.1" if part == "shortcut" else f"layer{stage}.{block}.bn{part[-1]}"


def _check_norms_present(
    weights: dict[str, np.ndarray], expected: dict[str, tuple[int, ...]], missing: list[str], arch: Architecture
) -> None:
    """Raise when the ``missing`` keys are whole norms, every other key being there: norms that
    hold no tensor at all, as a norm without affine parameters or running statistics (a
    GroupWhitening or GroupNorm built with ``affine=False``) keeps none in its state dict."""
    absent: dict[str, list[str]] = {}
    for key in missing:
        module, _, _leaf = key.rpartition(".")
        if _norm_position(module) is None:
            return
        absent.setdefault(module, []).append(key)
    if any(key.startswith(f"{module}.") for module in absent for key in weights):
        return  # a norm with some of its tensors: an incomplete norm, not one without state
    by_position: dict[str, list[str]] = {}
    for module in absent:
        by_position.setdefault(str(_norm_position(module)), []).append(module)
    where = "; ".join(f"{position} ({preview_names(modules, 3)})" for position, modules in by_position.items())
    source = preview_names([_torchvision_norm(module) for module in absent], 3)
    norms = {key.rpartition(".")[0] for key in expected if _norm_position(key.rpartition(".")[0]) is not None}
    with_statistics = {key.rpartition(".")[0] for key in expected if key.endswith(f".{STATISTICS_KEY}")}
    first = next(iter(absent))
    channels = expected[f"{first}.weight"][0]
    example = (f"e.g. state_dict['{_torchvision_norm(first)}.weight'] = torch.ones({channels}) and "
               f"state_dict['{_torchvision_norm(first)}.bias'] = torch.zeros({channels})")
    whole_positions = all(
        position in POSITIONS
        and all(module in absent for module in norms if _norm_position(module) == position)
        for position in by_position)
    if not with_statistics:  # GN-style: every norm of the file is affine-only
        fix = (f"If they are norms built with affine=False, give each a weight of ones and a bias of zeros (what "
               f"affine=False computes), {example}, torch.save the state dict and convert that file.")
    elif whole_positions:
        gw = {str(_norm_position(module)) for module in norms - with_statistics} | set(by_position)
        spec = format_gw_positions(gw)
        fix = (f"If they are GW layers built with affine=False, give each a weight of ones and a bias of zeros "
               f"(what affine=False computes; gwdet's GW layers always have both), {example}, torch.save the "
               f"state dict and convert that file with --gw-positions {spec!r} (in Python: gw_positions={spec!r}).")
    else:
        fix = ("gwdet's backbone has GW at whole positions (S1, B1, B2, B3: every block's norm there) and BN at "
               "the shortcuts, so norms without state at these places alone are not converted.")
    raise ConversionError(
        f"the checkpoint does not fit {arch.describe()}: {len(absent)} norm{'s' if len(absent) > 1 else ''} "
        f"hold{'' if len(absent) > 1 else 's'} no tensor in the file, at {where} (torchvision's {source}), while "
        "every other key is there. A norm without affine parameters or running statistics (a GroupWhitening or "
        "GroupNorm built with affine=False) keeps nothing in its state dict, so the file cannot show what these "
        f"norms compute, and the backbone that loads the weights needs a weight and a bias for each. {fix} If the "
        "file lost these tensors, convert the complete checkpoint.")
