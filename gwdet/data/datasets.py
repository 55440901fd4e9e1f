"""Preparing the datasets a config names, and checking their files before training starts.

detectron2 registers COCO under ``$DETECTRON2_DATASETS`` (default ``./datasets``) at import time,
whether or not the files exist; a missing file would otherwise surface only deep inside data
loading. :func:`check_dataset_files` turns that into an error naming the path and the fix.
"""
from __future__ import annotations

import os
from typing import Iterable

from detectron2.config import CfgNode
from detectron2.data import DatasetCatalog, MetadataCatalog

from gwdet.data.shapes import register_shapes

COCO_LAYOUT_HINT = (
    "For COCO, set DETECTRON2_DATASETS to the folder that holds coco/, laid out as "
    "coco/annotations/instances_{train,val}2017.json and coco/{train,val}2017/*.jpg. "
    "To run without COCO, use the embedded dataset: DATASETS.TRAIN ('shapes_train',) "
    "DATASETS.TEST ('shapes_val',) (or 'shapes_test', its held-out split)."
)


def config_dataset_names(cfg: CfgNode) -> list[str]:
    """Every dataset name the config trains or tests on, in order, without repeats."""
    return list(dict.fromkeys([*cfg.DATASETS.TRAIN, *cfg.DATASETS.TEST]))


def check_dataset_files(names: Iterable[str]) -> None:
    """Raise FileNotFoundError / KeyError, naming the path and the fix, for any missing dataset."""
    registered = set(DatasetCatalog.list())
    for name in names:
        if name not in registered:
            raise KeyError(
                f"Dataset {name!r} is not registered. Register it with "
                "detectron2.data.datasets.register_coco_instances(name, {}, json_file, image_root) "
                f"before training, or pick a registered one. {COCO_LAYOUT_HINT}"
            )
        metadata = MetadataCatalog.get(name)
        for field in ("json_file", "image_root"):
            path = metadata.get(field)
            if path is not None and not os.path.exists(path):
                raise FileNotFoundError(
                    f"Dataset {name!r}: its {field} {path!r} does not exist. {COCO_LAYOUT_HINT}"
                )


def prepare_datasets(cfg: CfgNode) -> None:
    """Generate and register the shapes dataset if the config uses it, then check every file."""
    names = config_dataset_names(cfg)
    if any(name.startswith("shapes_") for name in names):
        register_shapes(cfg)
    check_dataset_files(names)
