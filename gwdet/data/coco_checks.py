"""The entries and files of a COCO instances dataset, checked before detectron2 reads them.

Each function returns the problems it finds as phrases naming the image or annotation id and its
file (empty: nothing wrong); :func:`gwdet.data.coco_registration.inspect_coco_file` turns them
into one error naming the JSON and the fix. What they catch would otherwise pass registration and
then go wrong without a word or stop a run late.
"""
from __future__ import annotations

import math
import os
from typing import Any, Iterable, Mapping, Sequence

from gwdet.errors import listed
from gwdet.layers.common import is_finite_number
from gwdet.data.image_files import image_file_problem
from gwdet.data.masks import ends_as_corners, mask_area, mask_box, segmentation_problem

SHOWN = 3  # problems quoted in one message
# How far an annotation's area may lie from its mask's pixel count (either way), or below its box's
# area when it has no mask (a thin slanted object covers little of its box), before it is named;
# differences of up to AREA_SLACK pixels pass whatever the ratio (a few pixels' object rasterized).
MASK_AREA_FACTOR = 4.0
BOX_AREA_FACTOR = 10.0
AREA_SLACK = 16.0


def shown_name(name: str) -> str:
    """A ``file_name`` as a message shows it: as it is, unless it holds characters a reader does not
    see (white space at an end, a newline, control characters), then quoted with them written out."""
    if name.isprintable() and name == name.strip():
        return name
    return f"{name!r}, a name with characters one does not see"


def listed_problems(problems: Sequence[str]) -> str:
    """The first :data:`SHOWN` problems joined by ``"; "``, then how many more there are."""
    return listed(problems, SHOWN, "; ")


def image_entry_problems(images: Iterable[Mapping[str, Any]]) -> list[str]:
    """Image entries whose ``file_name`` is not a non-empty string or whose ``width``/``height``
    are not positive integers."""
    problems = []
    for index, image in enumerate(images):
        name, width, height = image["file_name"], image["width"], image["height"]
        if not isinstance(name, str) or not name:
            problems.append(f"image #{index} (id {image['id']!r}) has file_name {name!r}, not a file name")
        for key, value in (("width", width), ("height", height)):
            if type(value) is not int or value < 1:
                problems.append(f"image #{index} (id {image['id']!r}, {name!r}) has {key} {value!r}, not a positive "
                                "integer number of pixels")
    return problems


def non_integer_ids(entries: Iterable[Mapping[str, Any]], describe, strings: bool = True) -> list[str]:
    """``"<id> of <entry> (#<index>), a <type>"`` for each of ``entries`` whose id is neither an
    integer nor (with ``strings``) a string (``describe(entry)`` names an entry): COCO's ids are
    integers (a file of string image ids, which detectron2 and COCO evaluation read too, is let
    through), and ``1.0`` or ``true`` is neither."""
    problems = []
    for index, entry in enumerate(entries):
        key = entry["id"]
        if type(key) not in ((int, str) if strings else (int,)):
            kind = "null" if key is None else f"a {type(key).__name__}"
            problems.append(f"{key!r} of {describe(entry)} (#{index}), {kind}")
    return problems


def linked_files(images: Iterable[Mapping[str, Any]], root: str) -> list[str]:
    """``"'b.png' (image 2) is 'a.png' (image 1)"`` for each image entry whose file (under ``root``)
    is the file of an earlier entry under another name: a symbolic or hard link (the same device and
    inode); files that cannot be read are left to the readability check."""
    seen: dict[tuple[int, int], tuple[str, Any]] = {}
    problems = []
    for image in images:
        try:
            status = os.stat(os.path.join(root, image["file_name"]))
        except OSError:
            continue
        first = seen.setdefault((status.st_dev, status.st_ino), (image["file_name"], image["id"]))
        if first[0] != image["file_name"]:
            problems.append(f"{image['file_name']!r} (image {image['id']!r}) is {first[0]!r} (image {first[1]!r})")
    return problems


def shared_file_names(images: Iterable[Mapping[str, Any]]) -> list[str]:
    """``"'a.png' of images 1 and 2"`` for each file that more than one image entry names (the
    paths compared as ``os.path.normpath`` gives them: ``./a.png`` is ``a.png``)."""
    ids: dict[str, list[Any]] = {}
    names: dict[str, str] = {}
    for image in images:
        key = os.path.normpath(image["file_name"])
        ids.setdefault(key, []).append(image["id"])
        names.setdefault(key, image["file_name"])
    problems = []
    for key, shared in ids.items():
        if len(shared) > 1:
            listed = [repr(image_id) for image_id in shared]
            problems.append(f"{names[key]!r} of images {', '.join(listed[:-1])} and {listed[-1]}")
    return problems


def duplicate_ids(entries: Iterable[Mapping[str, Any]], describe) -> list[str]:
    """``"<id>: <first> and <second>"`` for each id that two ``entries`` share (``describe(entry)``
    names an entry); an id that is not a number or string is a problem of its own."""
    seen: dict[Any, Mapping[str, Any]] = {}
    problems = []
    for entry in entries:
        key = entry["id"]
        if type(key) not in (int, str):
            problems.append(f"id {key!r} of {describe(entry)} is not an integer")
            continue
        if key in seen:
            problems.append(f"id {key!r} of both {describe(seen[key])} and {describe(entry)}")
        else:
            seen[key] = entry
    return problems


def mask_problems(annotations: Iterable[Mapping[str, Any]], images: Mapping[Any, Mapping[str, Any]]) -> list[str]:
    """The masks (``segmentation``) of ``annotations`` that cannot be used (:func:`segmentation_problem`),
    a crowd region's mask checked for fitting its image only (its box is not trained on)."""
    problems = []
    for annotation in annotations:
        segmentation = annotation.get("segmentation")
        image = images.get(annotation["image_id"])
        if not segmentation or image is None:  # no mask; an unknown image is the box check's to name
            continue
        bbox = None if annotation.get("iscrowd", 0) else annotation["bbox"]
        problem = segmentation_problem(segmentation, image["width"], image["height"], bbox)
        if problem:
            problems.append(f"annotation id {annotation['id']} of image {annotation['image_id']} "
                            f"({shown_name(image['file_name'])}): its mask {problem}")
    return problems


def corner_boxes(annotations: Iterable[Mapping[str, Any]], images: Mapping[Any, Mapping[str, Any]]) -> tuple[list[str], int]:
    """``(annotations whose bbox reads as [x1, y1, x2, y2] of its mask, annotations with a mask and a
    box)`` (:func:`gwdet.data.masks.ends_as_corners`): a file whose boxes were written as corners
    (COCO's are ``[x, y, width, height]``) keeps every mask inside its box, so the mask check passes."""
    found, masked = [], 0
    for annotation in annotations:
        segmentation = annotation.get("segmentation")
        image = images.get(annotation["image_id"])
        if not segmentation or image is None or annotation.get("iscrowd", 0):
            continue
        problem, box = mask_box(segmentation, image["width"], image["height"])
        if problem:
            continue
        masked += 1
        if ends_as_corners(box, annotation["bbox"]):
            found.append(f"annotation id {annotation['id']} of image {annotation['image_id']} "
                         f"({shown_name(image['file_name'])}): "
                         f"bbox {list(annotation['bbox'])}, its mask's bounding box {[round(v, 1) for v in box]}")
    return found, masked


def area_mismatches(annotations: Iterable[Mapping[str, Any]],
                    images: Mapping[Any, Mapping[str, Any]]) -> tuple[list[str], int]:
    """``(annotations whose area disagrees with their object, annotations compared)``: an area more
    than :data:`MASK_AREA_FACTOR` times off its mask's pixel count (:func:`gwdet.data.masks.mask_area`),
    or, without a mask, more than :data:`BOX_AREA_FACTOR` times below its box's area (an area above
    the box is :func:`gwdet.data.coco_registration._area_beyond_box`'s), and more than
    :data:`AREA_SLACK` pixels off. COCO evaluation files each object under APs, APm or APl by this
    area, so a scaled or mixed-up area moves it to another range. Annotations without a usable area,
    mask or box (other checks' problems) are not compared."""
    found, compared = [], 0
    for annotation in annotations:
        given, image = annotation.get("area"), images.get(annotation.get("image_id"))
        if not isinstance(given, (int, float)) or isinstance(given, bool) or image is None:
            continue
        area = float(given)
        if not math.isfinite(area):
            continue
        segmentation, bbox = annotation.get("segmentation"), annotation.get("bbox")
        if segmentation:
            reference = mask_area(segmentation, image["width"], image["height"])
            if reference is None:
                continue
            what, off = f"its mask covers {reference:g} pixels", not (
                reference / MASK_AREA_FACTOR <= area <= reference * MASK_AREA_FACTOR)
        elif isinstance(bbox, (list, tuple)) and len(bbox) == 4 and all(is_finite_number(v) for v in bbox) \
                and bbox[2] > 0 and bbox[3] > 0:
            reference = float(bbox[2] * bbox[3])
            what, off = (f"its bbox covers {bbox[2]:g} x {bbox[3]:g} = {reference:g} pixels (no mask)",
                         area < reference / BOX_AREA_FACTOR)
        else:
            continue
        compared += 1
        if off and abs(area - reference) > AREA_SLACK:
            found.append(f"annotation id {annotation['id']} of image {annotation['image_id']} "
                         f"({shown_name(image['file_name'])}): area {area:g}, {what}")
    return found, compared


def image_file_problems(images: Sequence[Mapping[str, Any]], root: str,
                        rotations: dict[str, int] | None = None) -> list[str]:
    """The images whose file under ``root`` detectron2 could not read as the entry states
    (:func:`gwdet.data.image_files.image_file_problem`, which adds to ``rotations`` the images
    turned by an EXIF orientation their size cannot confirm)."""
    problems = []
    for image in images:
        name = image["file_name"]
        problem = image_file_problem(os.path.join(root, name), image["width"], image["height"], rotations)
        if problem and name.strip() != name and os.path.isfile(os.path.join(root, name.strip())):
            problem += f" (a file named {name.strip()!r} is there: remove the white space from the JSON's file_name)"
        if problem:
            problems.append(f"image id {image['id']} ({shown_name(name)}) {problem}")
    return problems
