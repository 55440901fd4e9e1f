"""Builds a config's model on every detectron2 build path and prints what each GW layer holds.

    python tests/build_paths_worker.py {detectron2-first|gwdet-first} CONFIG[,CONFIG...] [KEY VALUE ...]

Run in a fresh process by tests/test_build_paths.py, because the order of the imports is the point:
``detectron2-first`` binds ``build_model`` and ``get_norm`` before gwdet is imported.
"""
import json
import sys
from collections import Counter

order, config_files, *opts = sys.argv[1:]
if order == "detectron2-first":
    from detectron2.layers import get_norm  # noqa: F401
    from detectron2.modeling import build_model

    import gwdet  # noqa: F401
else:
    import gwdet  # noqa: F401
    from detectron2.modeling import build_model

import torch  # noqa: E402
from detectron2.engine import DefaultTrainer  # noqa: E402
from detectron2.layers import ShapeSpec  # noqa: E402
from detectron2.modeling import build_backbone, build_roi_heads  # noqa: E402

from gwdet.engine.trainer import Trainer  # noqa: E402
from gwdet.model_zoo import build_config  # noqa: E402
from gwdet.layers import GroupWhitening  # noqa: E402
from gwdet.modeling import GWFastRCNNConvFCHead, GWMaskRCNNConvUpsampleHead  # noqa: E402

PARTS = ("bottom_up", "fpn", "box_head", "mask_head")


def part_of(name: str) -> str:
    if "bottom_up" in name:
        return "bottom_up"
    if name.startswith("fpn_") or ".fpn_" in name:
        return "fpn"
    return next((part for part in PARTS if part in name), "other")


def describe(module: torch.nn.Module, prefix: str = "") -> dict:
    """{part: {"norms": {type: count}, "gw": [[num_groups, T, eps], ...] distinct}}."""
    found: dict = {}
    for name, layer in module.named_modules(prefix=prefix):
        kind = type(layer).__name__
        if not (isinstance(layer, GroupWhitening) or "Norm" in kind):
            continue
        entry = found.setdefault(part_of(name), {"norms": Counter(), "gw": set()})
        entry["norms"][kind] += 1
        if isinstance(layer, GroupWhitening):
            entry["gw"].add((layer.num_groups, layer.T, layer.eps))
    return {part: {"norms": dict(e["norms"]), "gw": sorted(e["gw"])} for part, e in found.items()}


def build_paths(config_file: str) -> dict:
    """{build path: what :func:`describe` finds in the model, or the parts, it builds}."""
    cfg = build_config(config_file, ["MODEL.DEVICE", "meta", *opts])
    backbone = build_backbone(cfg)
    shapes = backbone.output_shape()
    heads = build_roi_heads(cfg, shapes)
    channels = cfg.MODEL.FPN.OUT_CHANNELS
    return {
        "build_model": describe(build_model(cfg)),
        "DefaultTrainer.build_model": describe(DefaultTrainer.build_model(cfg)),
        "gwdet.Trainer.build_model": describe(Trainer.build_model(cfg)),
        "build_backbone+build_roi_heads": {**describe(backbone, "backbone"), **describe(heads, "roi_heads")},
        "from_config": {
            **describe(GWFastRCNNConvFCHead(cfg, ShapeSpec(channels=channels, height=7, width=7)), "box_head"),
            **describe(GWMaskRCNNConvUpsampleHead(cfg, ShapeSpec(channels=channels, height=14, width=14)),
                       "mask_head"),
        },
    }


# Built on the meta device: the layers and their settings as on the CPU, without initializing
# the weights of a ResNeXt-101 five times.
torch.set_default_device("meta")
print(json.dumps({config_file: build_paths(config_file) for config_file in config_files.split(",")}))
