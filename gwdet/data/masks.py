"""Instance masks that cannot be trained on: checked before detectron2 meets them.

A COCO ``segmentation`` is a list of polygons (each ``[x1, y1, x2, y2, ...]`` in pixels) or a
run-length encoding (RLE: ``{"size": [height, width], "counts": ...}``, the counts a list of
integers or COCO's compressed string). detectron2 silently drops polygons of fewer than 3 points
or an odd number of values, fails late on coordinates that are not numbers and on RLE that does
not fit its image (pycocotools' decoder writes past its buffer), and trains the mask head on a mask
far from its box. :func:`segmentation_problem` names what is wrong with one annotation's mask,
reading RLE counts without decoding the mask (:func:`compressed_counts`).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from gwdet.layers.common import is_finite_number

# A mask is "far outside" its box when less than this share of the mask's bounding box lies in the
# box grown by BOX_MARGIN of its width and height (at least MIN_MARGIN pixels) on each side.
INSIDE_SHARE = 0.5
BOX_MARGIN = 0.1
MIN_MARGIN = 2.0


def compressed_counts(text: str) -> np.ndarray | None:
    """The run lengths that COCO's compressed RLE string ``text`` encodes, or ``None`` when it is not
    one (a character outside ``'0'..'o'``, or a count cut short at the end).

    The format (pycocotools' ``maskApi``): each count is a signed integer written in groups of 5 bits,
    least significant first, each group as the character ``48 + group``, with ``0x20`` set on every
    group but a count's last, whose ``0x10`` bit is the sign; from the fourth count on, a count is
    stored as its difference from the count two places before it.
    """
    raw = np.frombuffer(text.encode("latin-1", "replace"), dtype=np.uint8).astype(np.int64) - 48
    if raw.size == 0:
        return np.zeros(0, dtype=np.int64)
    if raw.min() < 0 or raw.max() > 63:
        return None
    more = (raw & 0x20) != 0
    if more[-1]:
        return None
    ends = np.flatnonzero(~more)
    starts = np.concatenate(([0], ends[:-1] + 1))
    lengths = ends - starts + 1
    if lengths.max() > 12:  # beyond 60 bits: no mask has such a count
        return None
    group = np.arange(raw.size) - np.repeat(starts, lengths)
    values = np.add.reduceat((raw & 0x1F) << (5 * group), starts)
    values = np.where((raw[ends] & 0x10) != 0, values - (np.int64(1) << (5 * lengths)), values)
    counts = values.copy()
    counts[1::2] = np.cumsum(values[1::2])  # count i (i > 2) = stored value + count i - 2
    counts[2::2] = np.cumsum(values[2::2])
    return counts


def _rle_problem(rle: dict, width: int, height: int) -> tuple[str, Any]:
    """``(problem, pycocotools RLE)`` of an RLE segmentation of a ``width`` x ``height`` image."""
    size, counts = rle.get("size"), rle.get("counts")
    if not (isinstance(size, (list, tuple)) and len(size) == 2 and all(type(v) is int for v in size)):
        return f"is RLE whose 'size' is {size!r}, not [height, width]", None
    if list(size) != [height, width]:
        return f"is RLE of size {list(size)} (height, width), but its image is {height}x{width}", None
    runs: np.ndarray | None
    if isinstance(counts, list):
        if not all(type(v) is int for v in counts):
            return "is RLE whose 'counts' are not all integers", None
        runs = np.asarray(counts, dtype=np.int64)
    elif isinstance(counts, str):
        runs = compressed_counts(counts)
        if runs is None:
            return "is RLE whose 'counts' string is not COCO's compressed RLE (damaged or cut short)", None
    else:
        return f"is RLE whose 'counts' is a {type(counts).__name__}, not a list of integers or a string", None
    if runs.size and runs.min() < 0:
        return "is RLE with a negative run length (damaged counts)", None
    if int(runs.sum()) != height * width:
        return (f"is RLE whose runs cover {int(runs.sum())} pixels, not the {height}x{width} = {height * width} of its "
                "image (damaged counts, or counts of another image)"), None
    import pycocotools.mask as mask_util

    encoded = mask_util.frPyObjects(rle, height, width) if isinstance(counts, list) else \
        {"size": [height, width], "counts": counts.encode("ascii")}
    return "", encoded


def _polygons_problem(polygons: list) -> tuple[str, list[np.ndarray]]:
    """``(problem, polygons as (n, 2) arrays)`` of a polygon segmentation."""
    arrays = []
    for index, polygon in enumerate(polygons):
        if not isinstance(polygon, list) or not all(is_finite_number(v) for v in polygon):
            return f"has polygon #{index} that is not a list of finite numbers ({short_repr(polygon)})", []
        if len(polygon) % 2 or len(polygon) < 6:
            return (f"has polygon #{index} of {len(polygon)} values: a polygon is [x1, y1, x2, y2, ...] with at least "
                    "3 points (detectron2 drops it without a word)"), []
        arrays.append(np.asarray(polygon, dtype=np.float64).reshape(-1, 2))
    return "", arrays


def short_repr(value: Any, limit: int = 60) -> str:
    """``repr(value)``, cut after ``limit`` characters (then ending in ``...``)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _on_one_line(points: np.ndarray) -> bool:
    """Whether the polygon of ``points`` (``(N, 2)``) lies on one line (or one point), so that it
    covers no area: its points' spread about their mean has no second direction. (Its signed area
    may be 0 otherwise: the two lobes of a self-intersecting figure eight cancel, and pycocotools
    fills both.)"""
    spread = np.linalg.svd(points - points.mean(axis=0), compute_uv=False)
    return bool(spread[1] <= 1e-9 * max(float(spread[0]), 1.0))


def _inside_share(mask_box: Sequence[float], box: Sequence[float]) -> float:
    """The share of the box ``mask_box`` (x, y, width, height) inside ``box`` grown by the margin."""
    share = 1.0
    for start, length, box_start, box_length in ((mask_box[0], mask_box[2], box[0], box[2]),
                                                 (mask_box[1], mask_box[3], box[1], box[3])):
        margin = max(MIN_MARGIN, BOX_MARGIN * box_length)
        low, high = box_start - margin, box_start + box_length + margin
        if length <= 0:
            share *= float(low <= start <= high)
        else:
            share *= max(0.0, min(start + length, high) - max(start, low)) / length
    return share


def mask_box(segmentation: Any, width: int, height: int) -> tuple[str, list[float]]:
    """``(problem, bounding box)`` of the COCO ``segmentation`` of an annotation of a ``width`` x
    ``height`` image: the problem as in :func:`segmentation_problem` ("" when none), else the mask's
    bounding box ``[x, y, width, height]`` (``[]`` with a problem)."""
    if isinstance(segmentation, dict):
        problem, rle = _rle_problem(segmentation, width, height)
        if problem:
            return problem, []
        import pycocotools.mask as mask_util

        if float(mask_util.area(rle)) == 0:
            return "is RLE of no pixel (an empty mask)", []
        return "", [float(v) for v in mask_util.toBbox(rle)]
    if isinstance(segmentation, list):
        problem, polygons = _polygons_problem(segmentation)
        if problem:
            return problem, []
        if all(_on_one_line(points) for points in polygons):
            return "has polygons of no area (all points on one line)", []
        points = np.concatenate(polygons)
        low, high = points.min(axis=0), points.max(axis=0)
        return "", [float(low[0]), float(low[1]), float(high[0] - low[0]), float(high[1] - low[1])]
    return f"is a {type(segmentation).__name__}, not a list of polygons or an RLE dict", []


def mask_area(segmentation: Any, width: int, height: int) -> float | None:
    """The pixels the COCO ``segmentation`` of an annotation of a ``width`` x ``height`` image covers,
    as COCO's tools count them (pycocotools' area of the RLE, or of the polygons rasterized and
    merged); ``None`` for no mask or one :func:`mask_box` finds a problem with."""
    if not segmentation or mask_box(segmentation, width, height)[0]:
        return None
    import pycocotools.mask as mask_util

    if isinstance(segmentation, dict):
        rle = _rle_problem(segmentation, width, height)[1]
    else:
        rle = mask_util.merge(mask_util.frPyObjects([list(map(float, polygon)) for polygon in segmentation],
                                                    height, width))
    return float(mask_util.area(rle))


def segmentation_problem(segmentation: Any, width: int, height: int, bbox: Sequence[float] | None = None) -> str:
    """What is wrong with the COCO ``segmentation`` of an annotation of a ``width`` x ``height``
    image ("" when nothing, and for no mask at all): polygons that are not lists of finite numbers
    or have fewer than 3 points, RLE that does not fit the image (size, counts), a mask of no area,
    and, given the annotation's ``bbox`` ``[x, y, width, height]``, a mask whose bounding box lies
    mostly outside it (less than :data:`INSIDE_SHARE` inside the box grown by :data:`BOX_MARGIN`).
    The words follow "its mask" in a message."""
    if not segmentation:
        return ""
    problem, box = mask_box(segmentation, width, height)
    if problem:
        return problem
    if bbox is not None and _inside_share(box, bbox) < INSIDE_SHARE:
        shown = [round(v, 1) for v in box]
        return (f"lies outside its bbox {list(bbox)}: the mask's bounding box is {shown} (x, y, width, height); "
                "the box and the mask must describe the same object")
    return ""


def ends_as_corners(box: Sequence[float], bbox: Sequence[float]) -> bool:
    """Whether the annotation's ``bbox`` reads as ``[x1, y1, x2, y2]`` of the mask's bounding box
    ``box`` (``[x, y, width, height]``) and not as COCO's ``[x, y, width, height]``: it starts where
    the mask starts, its third and fourth values are where the mask ends, within the mask-box
    margin, and they are not its width and height."""
    x, y, width, height = box
    margin_x, margin_y = max(MIN_MARGIN, BOX_MARGIN * width), max(MIN_MARGIN, BOX_MARGIN * height)
    corners = (abs(bbox[0] - x) <= margin_x and abs(bbox[1] - y) <= margin_y
               and abs(bbox[2] - (x + width)) <= margin_x and abs(bbox[3] - (y + height)) <= margin_y)
    return corners and (abs(bbox[2] - width) > margin_x or abs(bbox[3] - height) > margin_y)
