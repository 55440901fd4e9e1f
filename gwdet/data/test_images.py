"""One image file as a config's test loader hands it to the model, for the tools that feed single
files (prediction drawings, the export's sample image).

A yacs config reads the file in ``INPUT.FORMAT`` and resizes it with detectron2's
``ResizeShortestEdge(INPUT.MIN_SIZE_TEST, INPUT.MAX_SIZE_TEST)``, as its ``DatasetMapper`` does at
test time; a LazyConfig reads it in ``dataloader.test.mapper.image_format`` and applies that
mapper's ``augmentations``.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from detectron2.config import CfgNode, instantiate
from detectron2.data import detection_utils
from detectron2.data import transforms as T

from gwdet.errors import GwdetValueError
from gwdet.data.image_files import image_file_problem


def _format_and_augmentations(cfg: Any) -> tuple[str, list]:
    if isinstance(cfg, CfgNode):
        size = cfg.INPUT.MIN_SIZE_TEST
        return cfg.INPUT.FORMAT, [T.ResizeShortestEdge([size, size], cfg.INPUT.MAX_SIZE_TEST)]
    mapper = cfg.dataloader.test.mapper
    return mapper.get("image_format", "BGR"), list(instantiate(mapper.get("augmentations", [])))


def read_test_image(cfg: Any, path: str) -> dict:
    """``{"image", "height", "width"}`` of the image file ``path`` as the test loader of ``cfg`` (a
    yacs ``CfgNode`` or a LazyConfig) gives it to the model: CHW in the model's input format,
    resized, of the dtype the loader gives (uint8, as detectron2's ``DatasetMapper``; a model traced
    on it takes that dtype); height and width of the file. ``ValueError`` naming the file and the fix for a
    file that is missing, not an image, cut short, or of a mode detectron2 would not read as it is
    (a 16-bit PNG would reach the model as a white image; :mod:`gwdet.data.image_files`), or so
    elongated that the resize leaves a side without a pixel."""
    problem = image_file_problem(path)
    if problem:
        raise GwdetValueError(f"{path} {problem}.")
    image_format, augmentations = _format_and_augmentations(cfg)
    original = detection_utils.read_image(path, format=image_format)
    height, width = original.shape[:2]
    inputs = T.AugInput(original)
    try:
        T.AugmentationList(augmentations)(inputs)
    except ValueError as error:
        if "height and width must be > 0" not in str(error):  # PIL's words for a side resized to no pixel
            raise
        raise GwdetValueError(
            f"{path} ({width}x{height} pixels) cannot be resized as the test loader resizes images ({error}): this "
            "elongated, one side would keep no pixel. Give a less elongated image.") from None
    image = np.ascontiguousarray(inputs.image.transpose(2, 0, 1))
    return {"image": torch.as_tensor(image), "height": height, "width": width}
