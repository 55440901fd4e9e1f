"""Boxes that cannot be trained on: the one check behind ``--register-coco`` and the train loader.

A box is refused when it is not four finite numbers, has no area (width or height <= 0), or
reaches outside its image by more than a pixel: detectron2 would drop it or learn nothing from it,
without a word. :func:`box_problem` checks one COCO ``[x, y, width, height]`` box;
:func:`check_dataset_boxes` checks the dataset dicts of detectron2's ``DatasetCatalog``, however
the dataset was registered, before the train loader is built. Crowd annotations are not checked.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Iterable, Mapping

from detectron2.structures import BoxMode

from gwdet.errors import listed

SHOWN = 3  # problems quoted in one message


def _numbers(bbox: Any) -> list[float] | None:
    """``bbox`` as four finite floats (a list, tuple or array of real numbers), else ``None``."""
    values = bbox if type(bbox) in (list, tuple) else bbox.tolist() if hasattr(bbox, "tolist") else None
    if not isinstance(values, (list, tuple)) or len(values) != 4:
        return None
    for v in values:  # int and float first: this runs for every box of a dataset such as COCO
        if not (type(v) in (int, float) or (isinstance(v, numbers.Real) and not isinstance(v, bool))):
            return None
        if not math.isfinite(v):
            return None
    return [float(v) for v in values]


def _shown(bbox: Any) -> str:
    return repr(bbox.tolist() if hasattr(bbox, "tolist") else bbox)


def _fault(values: list[float] | None, width: float | None, height: float | None) -> str:
    """What is wrong with the COCO box ``values`` (``None``: not four finite numbers) in an image of
    ``width`` x ``height`` ("" when nothing; the image bounds are not checked without its size)."""
    if values is None:
        return "is not four finite numbers"
    x, y, box_width, box_height = values
    if box_width <= 0 or box_height <= 0:
        return "has no area (width and height must be > 0)"
    if width is not None and height is not None and (
            x < -1 or y < -1 or x + box_width > width + 1 or y + box_height > height + 1):
        return f"reaches outside the {width}x{height} image"
    return ""


def box_problem(bbox: Any, width: float | None = None, height: float | None = None) -> str:
    """What is wrong with the COCO box ``bbox`` ``[x, y, box width, box height]`` of an image of
    ``width`` x ``height`` pixels ("" when nothing): not four finite numbers, no area, or reaching
    outside the image by more than a pixel (not checked without the image size)."""
    fault = _fault(_numbers(bbox), width, height)
    return f"bbox {_shown(bbox)} {fault}" if fault else ""


def annotation_box_problem(annotation: Mapping, width: float | None, height: float | None) -> str:
    """:func:`box_problem` of a detectron2 dataset-dict annotation, whose ``bbox`` is in
    ``bbox_mode`` (``XYWH_ABS`` or ``XYXY_ABS``; other modes, rotated or relative boxes, are not
    checked)."""
    bbox = annotation.get("bbox")
    mode = annotation.get("bbox_mode", BoxMode.XYWH_ABS)
    values = _numbers(bbox)
    if mode == BoxMode.XYXY_ABS and values is not None:
        x0, y0, x1, y1 = values
        values = [x0, y0, x1 - x0, y1 - y0]
    elif mode != BoxMode.XYWH_ABS:
        return ""
    fault = _fault(values, width, height)
    return f"bbox {_shown(bbox)} ({BoxMode(mode).name}) {fault}" if fault else ""


def check_dataset_boxes(records: Iterable[Mapping], where: str) -> None:
    """Raise :class:`gwdet.data.DatasetError` naming the images (``file_name``, ``image_id``), their
    boxes and the fix when any record of ``records`` (detectron2 dataset dicts, e.g. of
    ``DatasetCatalog.get(name)``; ``where`` names them in the message) has a box that cannot be
    trained on (:func:`box_problem`)."""
    from gwdet.data.coco_registration import DatasetError

    problems: list[str] = []
    for record in records:
        annotations = record.get("annotations") if isinstance(record, Mapping) else None
        for annotation in annotations or ():
            if not isinstance(annotation, Mapping) or annotation.get("iscrowd", 0):
                continue
            problem = annotation_box_problem(annotation, record.get("width"), record.get("height"))
            if problem:
                problems.append(f"image {record.get('file_name', '?')!r} (image_id {record.get('image_id', '?')}): "
                                f"{problem}")
    if problems:
        raise DatasetError(
            f"{where}: {len(problems)} box(es) cannot be trained on (detectron2 would drop them or learn nothing "
            f"from them, without a word): {listed(problems, SHOWN, '; ')}. "
            "Correct or remove those annotations in the dataset (a COCO bbox is [x, y, width, height] in pixels, "
            "inside the image), or filter them out in the function that registers it.")
