"""Your own COCO-format data, registered by name on the command line: no code to write.

    python tools/train_net.py --config configs/mask_rcnn_gw.yaml \\
        --register-coco mine_train=~/data/train.json:~/data/train_images \\
        --register-coco mine_val=~/data/val.json:~/data/val_images \\
        DATASETS.TRAIN "('mine_train',)" DATASETS.TEST "('mine_val',)" MODEL.ROI_HEADS.NUM_CLASSES 3

``--register-coco NAME=JSON:IMAGE_ROOT`` (repeatable) registers the COCO instances file JSON, whose
``file_name`` entries are relative to the folder IMAGE_ROOT, as dataset NAME with detectron2's
``register_coco_instances`` (how the paths are split: :meth:`CocoDataset.parse`). The files are
checked when the flag is read (:func:`inspect_coco_file`), the config against them before training
(:func:`check_config_against_datasets`); each failure is a :class:`DatasetError` that names the file
and the fix. Other processes get the registrations from ``$GWDET_REGISTER_COCO``, a JSON list of
``"NAME=JSON:IMAGE_ROOT"`` strings that :func:`gwdet.data.prepare_datasets` registers
(:func:`environment_datasets`, :func:`datasets_in_environment`).
"""
from __future__ import annotations

import argparse
import contextlib
import filecmp
import functools
import hashlib
import json
import logging
import math
import os
import re
import shlex
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Iterator, Sequence

from detectron2.config import CfgNode
from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.data.datasets import register_coco_instances
from detectron2.data.transforms import ResizeShortestEdge

from gwdet.config import SHAPES_PREFIX
from gwdet.errors import GwdetError, GwdetTypeError, listed
from gwdet.utils.atomic import cached_sha256
from gwdet.utils.cli_errors import (GZIP_MAGIC, as_override, gzip_decompression, link_dotdot_problem,
                                    unexpanded_variable_note)
from gwdet.data.boxes import box_problem
from gwdet.data.masks import short_repr
from gwdet.data.image_files import name_twin_note
from gwdet.layers.common import is_finite_number
from gwdet.data.coco_checks import (
    BOX_AREA_FACTOR,
    MASK_AREA_FACTOR,
    area_mismatches,
    corner_boxes,
    duplicate_ids,
    image_entry_problems,
    image_file_problems,
    linked_files,
    listed_problems,
    mask_problems,
    non_integer_ids,
    shared_file_names,
)
from gwdet.utils.fingerprints import file_fingerprint, split_fingerprints

FLAG = "--register-coco"
FORMAT = "NAME=JSON:IMAGE_ROOT"
EXAMPLE = "mine_train=~/data/train.json:~/data/train_images"
ENVIRONMENT_VARIABLE = "GWDET_REGISTER_COCO"
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")
COCO_LISTS = ("images", "annotations", "categories")
IMAGE_KEYS = ("id", "file_name", "height", "width")  # what detectron2's load_coco_json reads
ANNOTATION_KEYS = ("id", "image_id", "category_id", "bbox")
SHOWN = 6  # categories or differences listed in one message

logger = logging.getLogger(__name__)


def _shown(value: Any) -> str:
    """A value of a json as a message quotes it (:func:`~gwdet.data.masks.short_repr`, 120 characters)."""
    return short_repr(value, 120)


def _not_an_integer_id(value: Any) -> str:
    """``"'1', a string, not an integer id"``: an id (or category_id) of a JSON that is no integer,
    with its JSON type."""
    if value is None:
        return "null, not an integer id"
    kind = {str: "a string", float: "a number with a decimal point", bool: "a boolean (JSON true or false)",
            list: "a list", dict: "an object"}.get(type(value), f"a {type(value).__name__}")
    return f"{_shown(value)}, {kind}, not an integer id"


def _integral_id(value: Any) -> int | None:
    """The integer that ``value`` writes other than as an integer: ``1`` for ``'1'``, ``' 1 '`` or
    ``1.0``; None for anything else (``'cat'``, ``1.5``, ``true``, ``null``)."""
    if isinstance(value, str) and re.fullmatch(r"\s*[+-]?[0-9]+\s*", value):
        return int(value)
    if type(value) is float and math.isfinite(value) and value.is_integer():
        return int(value)
    return None


def _category_id_fix(value: Any, names: dict[int, str]) -> str:
    """What to write for an annotation's ``category_id`` ``value`` that is no integer, given the
    file's categories ``names`` (id: name)."""
    ids = f"(ids {listed([str(i) for i in sorted(names)], SHOWN)})"
    number = _integral_id(value)
    if number is not None and number in names:
        how = "without quotes" if isinstance(value, str) else "without a decimal point"
        return f"write it {how}, \"category_id\": {number} (category {names[number]!r})."
    by_name = [key for key, name in names.items() if isinstance(value, str) and name == value.strip()]
    if by_name:
        return (f"{value!r} is the name of category {by_name[0]}, and an annotation gives its category by id: "
                f"\"category_id\": {by_name[0]}.")
    return f"give the integer id of the annotation's category, one of the file's categories {ids}."


class DatasetError(GwdetError, ValueError):
    """A dataset given on the command line, or the config's use of it, that cannot train or be
    evaluated on as it is; the message names the dataset, the file or config key, and the fix."""


@dataclass(frozen=True)
class CocoContents:
    """What the checks need to know of a COCO instances file."""

    categories: tuple[tuple[int, str], ...]  # (id, name), by id: detectron2's class order
    images: int
    instances: int  # annotations that are not crowd regions (detectron2 trains on these only)
    rle_masks: int  # ... whose mask is RLE
    without_mask: int  # ... without a mask
    crowd: int = 0  # crowd regions (iscrowd 1): COCO evaluation ignores them, detectron2 does not train on them
    crowd_without_mask: int = 0  # ... without a mask (COCO's mask evaluation reads every annotation's mask)
    without_iscrowd: int = 0  # annotations without an 'iscrowd' (detectron2 reads 0; COCO evaluation needs it)
    without_area: int = 0  # annotations without an 'area' (detectron2 trains without it; COCO evaluation needs it)
    most_elongated: tuple[str, int, int] | None = None  # (file_name, width, height) of the largest side ratio
    json_sha256: str = ""  # of the file as it was read and checked
    json_content_sha256: str = ""  # of its JSON contents written in one canonical form (keys sorted, no spaces)
    # (real path, fingerprint) of each image file, sorted by path (gwdet.utils.fingerprints.file_fingerprint)
    image_prints: tuple[tuple[str, bytes], ...] = ()
    # what the checks warn of (EXIF orientations, areas far from their objects), logged when the dataset is
    # registered for a run (log_inspection_warnings): a --register-coco flag is read before the run's log exists
    warnings: tuple[str, ...] = ()

    @property
    def image_files(self) -> frozenset[str]:
        """The images' files, real paths."""
        return frozenset(path for path, _ in self.image_prints)

    @property
    def fingerprints(self) -> bytes:
        """The images' fingerprints joined in the order of their paths: what a checkpoint records."""
        return b"".join(fingerprint for _, fingerprint in self.image_prints)

    def images_among(self, fingerprints: bytes | frozenset[bytes]) -> list[str]:
        """The image files (real paths) whose fingerprint is among ``fingerprints`` (joined, as
        :attr:`fingerprints` gives them, or a set): copies and links of those images under any name."""
        known = fingerprints if isinstance(fingerprints, frozenset) else frozenset(split_fingerprints(fingerprints))
        return [path for path, fingerprint in self.image_prints if fingerprint in known]

    @property
    def class_names(self) -> list[str]:
        return [name for _, name in self.categories]


@dataclass(frozen=True)
class CocoDataset:
    """One ``--register-coco`` dataset: its name, its files (absolute), and what its JSON holds once
    read (:meth:`inspected`; not part of equality)."""

    name: str
    json_file: str
    image_root: str
    contents: CocoContents | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        # absolute from the start: a later os.chdir must not change which files the dataset names
        for name in ("json_file", "image_root"):
            path = getattr(self, name)
            if not isinstance(path, (str, os.PathLike)):
                raise GwdetTypeError(f"CocoDataset {self.name!r}: {name} is {path!r} ({type(path).__name__}): give a "
                                     "path (a string).")
            object.__setattr__(self, name, os.path.abspath(os.path.expanduser(os.fspath(path))))

    @classmethod
    def parse(cls, text: str) -> CocoDataset:
        """``NAME=JSON:IMAGE_ROOT`` with ``~`` expanded and relative paths made absolute; the ``:``
        that separates the paths is the one after which JSON is an existing file (the last ``:``
        when none is, or when several are and only the last leaves an existing folder), so a path may
        hold ``:`` itself. :class:`DatasetError` for any other form, or for a split that is ambiguous;
        NAME ends at the first ``=``, and a JSON that is not there whose text starts with a name and
        ``=`` is refused as a name meant to hold ``=``, which no dataset name may."""
        name, equals, paths = text.partition("=")
        json_file, colon, image_root = _split_paths(paths, text)
        name = name.strip()
        if not (equals and colon and name and json_file.strip() and image_root.strip()):
            raise DatasetError(f"expects {FORMAT}, e.g. {EXAMPLE}; got {text!r}")
        if not NAME_PATTERN.fullmatch(name):
            raise DatasetError(f"dataset name {name!r} (in {text!r}): use letters, digits, '_', '.' and '-', "
                               f"starting with a letter or digit, e.g. {EXAMPLE}")
        _check_no_equals_in_name(name, json_file, image_root, text)
        for path in (json_file, image_root):
            problem = link_dotdot_problem(f"{FLAG} {name}=...", os.path.expanduser(path.strip()))
            if problem is not None:
                raise DatasetError(problem)
        return cls(name, _absolute(json_file), _absolute(image_root))

    @property
    def spec(self) -> str:
        """The ``NAME=JSON:IMAGE_ROOT`` that :meth:`parse` reads back into this dataset."""
        return f"{self.name}={self.json_file}:{self.image_root}"

    def inspected(self) -> CocoDataset:
        """This dataset with :attr:`contents` read (:func:`inspect_coco_file`)."""
        return self if self.contents is not None else replace(self, contents=inspect_coco_file(self))

    @functools.cached_property
    def read(self) -> CocoContents:
        """:attr:`contents`, or what the JSON file holds, read on first use."""
        return self.contents if self.contents is not None else inspect_coco_file(self)


def _check_no_equals_in_name(name: str, json_file: str, image_root: str, text: str) -> None:
    """Refuse ``text`` (``NAME=JSON:IMAGE_ROOT``) whose JSON, read after the first ``=``, is not there
    and itself starts with a name and ``=`` (``t=v=ds.json:img``): NAME was meant to hold ``=``,
    which no dataset name may (detectron2's ``DATASETS`` lists take names of letters, digits, ``_``,
    ``.`` and ``-``)."""
    rest, equals, meant_json = json_file.partition("=")
    if not equals or not NAME_PATTERN.fullmatch(rest.strip()) or os.path.exists(_absolute(json_file)):
        return
    meant, renamed = f"{name}={rest.strip()}", f"{name}_{rest.strip()}"
    raise DatasetError(
        f"dataset {name!r}: the annotation file {_absolute(json_file)} does not exist: NAME ends at the first '=' of "
        f"{text!r}, so the name is {name!r} and JSON is {json_file.strip()!r}. A dataset name cannot hold '=' (use "
        f"letters, digits, '_', '.' and '-'): if {meant!r} was meant as the name, give one without '=', e.g. {FLAG} "
        f"{shlex.quote(f'{renamed}={meant_json.strip()}:{image_root.strip()}')}, and the same name in DATASETS.TRAIN "
        "or DATASETS.TEST.")


def _absolute(path: str) -> str:
    return os.path.abspath(os.path.expanduser(path.strip()))


def _split_paths(paths: str, text: str) -> tuple[str, str, str]:
    """``(JSON, ":", IMAGE_ROOT)`` of ``JSON:IMAGE_ROOT`` (``("", "", paths)`` without a ``:``): at the
    ``:`` after which JSON is an existing file; of several such, the one whose IMAGE_ROOT is an
    existing folder; without any, the last ``:``."""
    splits = [(paths[:at], paths[at + 1:]) for at, char in enumerate(paths) if char == ":"]
    files = [(json_file, root) for json_file, root in splits if json_file.strip() and os.path.isfile(_absolute(json_file))]
    if len(files) > 1:
        files = [(json_file, root) for json_file, root in files if root.strip() and os.path.isdir(_absolute(root))]
        if len(files) > 1:
            raise DatasetError(f"{text!r} can be read as {' or as '.join(f'JSON {j!r} with IMAGE_ROOT {r!r}' for j, r in files)}: "
                               "rename the file or folder whose name holds ':' (or link it under a name without one).")
    json_file, root = files[0] if files else (splits[-1] if splits else ("", ""))
    return (json_file, ":", root) if splits else ("", "", paths)


def _read_json(dataset: CocoDataset) -> tuple[Any, str]:
    """What ``dataset``'s JSON file holds, and the SHA-256 of the bytes read; :class:`DatasetError`
    naming the problem when it cannot be read as JSON."""
    where = f"dataset {dataset.name!r}:"
    path = dataset.json_file
    if not os.path.exists(path):
        raise DatasetError(f"{where} the annotation file {path} does not exist.{unexpanded_variable_note(path)} "
                           f"Give the path of your COCO instances JSON ({FORMAT}).")
    if os.path.isdir(path):
        raise DatasetError(f"{where} {path} is a folder. Give the COCO instances JSON file ({FORMAT}).")
    if not os.path.isfile(path):  # reading a named pipe would wait for a writer
        raise DatasetError(f"{where} {path} is not a regular file (a named pipe or a device). Give the COCO instances "
                           f"JSON file ({FORMAT}).")
    try:
        with open(path, "rb") as file:
            data = file.read()
        if data.startswith(b"\xef\xbb\xbf"):  # json.loads refuses it, and so do pycocotools and detectron2
            raise DatasetError(
                f"{where} {path} starts with a UTF-8 byte order mark (BOM, the bytes EF BB BF, as Notepad and "
                "PowerShell's Out-File -Encoding utf8 write it), which JSON readers (pycocotools and detectron2 too) "
                f"refuse: remove it (sed -i '1s/^\\xEF\\xBB\\xBF//' {path}, or python -c \"import sys; p = sys.argv[1]; "
                f"t = open(p, encoding='utf-8-sig').read(); open(p, 'w', encoding='utf-8').write(t)\" {path}).")
        return json.loads(data.decode("utf-8"), object_pairs_hook=_refusing_repeated_keys), \
            hashlib.sha256(data).hexdigest()
    except _RepeatedKey as repeated:
        raise DatasetError(f"{where} {path} gives the key {repeated.args[0]!r} twice in one object: JSON readers keep "
                           "only the last (pycocotools and detectron2 too), so what the first holds would be dropped "
                           "without a word. Give each key once (merge the two lists).") from None
    except json.JSONDecodeError as error:
        raise DatasetError(f"{where} {path} is not valid JSON: {error.msg} at line {error.lineno}, column "
                           f"{error.colno}. Fix the file there (python -m json.tool {path} points at the same "
                           "place).") from None
    except UnicodeDecodeError as error:
        if data.startswith(GZIP_MAGIC):
            named, plain, command = gzip_decompression(path, f"{os.path.splitext(path)[0]}.plain.json")
            raise DatasetError(f"{where} {path} is gzip-compressed ({named}), and detectron2 reads plain JSON: "
                               f"decompress it ({command}) and give {plain}.") from None
        if data.startswith((b"\xff\xfe", b"\xfe\xff")):  # UTF-16's byte order marks
            raise DatasetError(f"{where} {path} is UTF-16 text (as PowerShell's > and Notepad's 'Unicode' write it), "
                               "and JSON files are read as UTF-8: save it as UTF-8 (e.g. iconv -f UTF-16 -t UTF-8 "
                               "IN > OUT, or Notepad's 'UTF-8'), then give that file.") from None
        raise DatasetError(f"{where} {path} is not UTF-8 text (byte {error.start} cannot be decoded): give the "
                           "COCO instances JSON file.") from None
    except OSError as error:
        raise DatasetError(f"{where} {path} cannot be read ({error.strerror or error}).") from None


class _RepeatedKey(GwdetError):
    """A key that one JSON object gives twice (its name the argument); turned into a DatasetError."""


def _refusing_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.load``'s object hook: the object as a dict, unless a key is given twice."""
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise _RepeatedKey(key)
        found[key] = value
    return found


def _shared_category_names(names: dict[int, str]) -> list[str]:
    """``"'a' (ids 1 and 2)"`` for each name that more than one category of ``names`` (id: name) has."""
    ids_by_name: dict[str, list[int]] = {}
    for category_id, name in sorted(names.items()):
        ids_by_name.setdefault(name, []).append(category_id)
    return [f"{name!r} (ids {' and '.join(map(str, ids))})" for name, ids in ids_by_name.items() if len(ids) > 1]


def _string_ids_among_integers(images: Sequence[dict]) -> list[str]:
    """``"'two' ('001.png')"`` for each image whose id is a string while other images' ids are
    integers (empty when the ids are of one type)."""
    strings = [image for image in images if isinstance(image["id"], str)]
    if len(strings) in (0, len(images)):
        return []
    return [f"{image['id']!r} ({image['file_name']!r})" for image in strings]


def _iscrowd_problem(annotation: dict) -> str:
    """Why an annotation's ``iscrowd`` (0 when absent) is neither 0 nor 1 ("" when it is one of them;
    ``true`` and ``false`` read as 1 and 0 everywhere)."""
    value = annotation.get("iscrowd", 0)
    if type(value) in (int, bool) and value in (0, 1):
        return ""
    return f"iscrowd {_shown(value)} ({type(value).__name__})"


def _area_problem(annotation: dict, image: dict | None) -> str:
    """Why an annotation's ``area``, when it has one, is not a finite number from 0 to its ``image``'s
    width x height ("" when it is; an image of unusable size is another check's; a missing area matters
    to evaluation only, :func:`_check_test_annotations`)."""
    if "area" not in annotation:
        return ""
    area = annotation["area"]
    if type(area) not in (int, float):
        return f"area {_shown(area)} is a {type(area).__name__}, not a number"
    if not math.isfinite(area):
        return f"area {area} is not finite"
    if area < 0:
        return f"area {area} is negative"
    bbox = annotation.get("bbox")
    if area == 0 and isinstance(bbox, (list, tuple)) and len(bbox) == 4 and all(is_finite_number(v) for v in bbox) \
            and bbox[2] * bbox[3] >= 1:
        return f"area 0 for a bbox of {bbox[2]:g} x {bbox[3]:g} pixels (a placeholder?)"
    width, height = (image or {}).get("width"), (image or {}).get("height")
    if type(width) is int and type(height) is int and area > width * height:
        return f"area {area} is larger than its image ({width} x {height} = {width * height} pixels)"
    return ""


def _area_beyond_box(annotation: dict) -> str:
    """Why an annotation's (usable) ``area`` does not fit its box ("" when it does): the object lies
    inside its box, so a larger area (beyond rounding) was not rescaled with the box and image."""
    area, bbox = annotation.get("area"), annotation.get("bbox")
    if type(area) not in (int, float) or not isinstance(bbox, (list, tuple)) or len(bbox) != 4 \
            or not all(is_finite_number(v) for v in bbox) or area <= 1.01 * bbox[2] * bbox[3] + 1:
        return ""
    return f"area {area:g} is larger than its bbox ({bbox[2]:g} x {bbox[3]:g} = {bbox[2] * bbox[3]:g} pixels)"


def _below_a_pixel(bbox: Sequence[float]) -> bool:
    """Whether a valid COCO ``bbox`` ``[x, y, width, height]`` is under a pixel wide and high."""
    return bbox[2] < 1 and bbox[3] < 1


@dataclass
class _AnnotationTally:
    """What :func:`inspect_coco_file` gathers of a file's annotations, one at a time (:meth:`add`):
    the counts :class:`CocoContents` keeps and the problems, each naming its annotation."""

    images: dict[Any, dict]  # image id: image entry
    instances: int = 0
    rle_masks: int = 0
    without_mask: int = 0
    crowd: int = 0
    crowd_without_mask: int = 0
    without_iscrowd: int = 0
    without_area: int = 0
    crowd_values: list[str] = field(default_factory=list)  # iscrowd neither 0 nor 1
    areas: list[str] = field(default_factory=list)  # area missing, not a number, not finite, negative
    degenerate: list[str] = field(default_factory=list)  # boxes that cannot be trained on
    below_a_pixel: list[str] = field(default_factory=list)  # valid boxes under a pixel in both sides
    first_of: dict[tuple, Any] = field(default_factory=dict)  # (image, category, box): the first annotation's id
    repeated: list[str] = field(default_factory=list)  # objects annotated again (same image, category and box)

    def named(self, annotation: dict) -> str:
        """``annotation id 7 of image 3 (003.png)``: how messages name an annotation."""
        image_id = annotation["image_id"]
        return (f"annotation id {annotation['id']} of image {image_id} "
                f"({self.images.get(image_id, {}).get('file_name', 'not in images')})")

    def add(self, annotation: dict) -> None:
        """Count ``annotation`` (an entry with :data:`ANNOTATION_KEYS`) and note its problems."""
        for problems, problem in ((self.crowd_values, _iscrowd_problem(annotation)),
                                  (self.areas, _area_problem(annotation, self.images.get(annotation["image_id"])))):
            if problem:
                problems.append(f"{self.named(annotation)}: {problem}")
        mask = annotation.get("segmentation")
        self.without_iscrowd += "iscrowd" not in annotation
        self.without_area += "area" not in annotation
        if annotation.get("iscrowd", 0):
            self.crowd += 1
            self.crowd_without_mask += not mask
            return
        problem = _box_problem(annotation["bbox"], self.images[annotation["image_id"]])
        if problem:
            self.degenerate.append(f"{self.named(annotation)}: {problem}")
        elif _below_a_pixel(annotation["bbox"]):
            self.below_a_pixel.append(f"{self.named(annotation)}: bbox {_shown(annotation['bbox'])}")
        self.instances += 1
        self.rle_masks += isinstance(mask, dict)
        self.without_mask += not mask
        if not problem:
            key = (annotation["image_id"], annotation["category_id"], tuple(annotation["bbox"]))
            if key in self.first_of:
                self.repeated.append(f"{self.named(annotation)} repeats annotation id {self.first_of[key]}")
            else:
                self.first_of[key] = annotation["id"]


def _file_name_advice(file_name: str, root: str) -> str:
    """The fix for an image ``file_name`` of a JSON that is not found under the image folder ``root``:
    a URL (a hosted export's) or a name with a URL's query, an absolute name (detectron2 reads it as
    it is, whatever IMAGE_ROOT) made relative, Windows separators written as '/', else IMAGE_ROOT."""
    scheme = file_name.split("://", 1)[0] if "://" in file_name else ""
    if scheme.isalpha():
        return (f"{file_name!r} is a URL ({scheme}://), but detectron2 reads images from files: download the images "
                "into one folder, give that folder as IMAGE_ROOT, and write each file_name as the image's name in it.")
    if "?" in file_name and os.path.isfile(os.path.join(root, file_name.split("?", 1)[0])):
        return (f"its name ends in a URL's query ({file_name[file_name.index('?'):]!r}, as a web export writes it), which "
                "the file's name does not have: remove it from the file names.")
    if os.path.isabs(file_name):
        return (f"{file_name!r} is an absolute path, which detectron2 reads as it is, whatever IMAGE_ROOT, and no "
                "such file exists. Write the file names relative to one image folder (e.g. strip their common "
                "leading folders) and give that folder as IMAGE_ROOT.")
    if "\\" in file_name and os.path.isfile(os.path.join(root, file_name.replace("\\", "/"))):
        return ("its name separates folders with '\\' (Windows), which this system reads as part of the name: write "
                "the file names with '/'.")
    twin = name_twin_note(os.path.join(root, file_name))
    if twin:
        return f"IMAGE_ROOT is the right folder{twin}."
    return "IMAGE_ROOT must be the folder that the JSON's file_name entries are relative to."


def _absolute_names_outside(images: Sequence[dict], root: str) -> list[str]:
    """The absolute file_names of ``images`` that lie outside the image folder ``root`` (neither as
    written nor as their real paths are): detectron2 reads such a name as it is, without ``root``."""
    real_root = os.path.realpath(root)

    def inside(path: str, folder: str) -> bool:
        return os.path.commonpath([path, folder]) == folder

    return [image["file_name"] for image in images
            if os.path.isabs(image["file_name"])
            and not inside(os.path.normpath(image["file_name"]), os.path.normpath(root))
            and not inside(os.path.realpath(image["file_name"]), real_root)]


def log_inspection_warnings(dataset: CocoDataset) -> None:
    """Log the warnings of the inspection of ``dataset`` (:attr:`CocoContents.warnings`); called where
    the dataset is registered for a run, whose log holds them."""
    for warning in dataset.read.warnings:
        logger.warning(warning)


def _rotation_warning(dataset: CocoDataset, rotations: dict[str, int]) -> str | None:
    """Which images of ``dataset`` detectron2 turns by their EXIF orientation (path: orientation) in
    a way their stated size cannot confirm, and what that means for their annotations; ``None``
    when there are none."""
    if not rotations:
        return None
    shown = [f"{os.path.relpath(path, dataset.image_root)!r} (orientation {orientation})"
             for path, orientation in rotations.items()]
    return (
        f"dataset {dataset.name!r}: {len(shown)} image(s) of {dataset.json_file} have an EXIF orientation other than 1 "
        f"that their size does not reveal: {listed(shown, 3)}. detectron2 turns (or flips) each image by its EXIF "
        "orientation when it reads it, so their boxes and masks must be in the turned frame, as an image viewer "
        "shows the image, not in the stored pixels. If your annotation tool ignored the orientation, remove it "
        "from the files (or turn the annotations).")


def inspect_coco_file(dataset: CocoDataset) -> CocoContents:
    """Read and check ``dataset``'s JSON and image folder; what the config checks need of them.

    :class:`DatasetError` naming the file and the fix when the JSON is not a COCO instances file that
    detectron2 can train and COCO evaluation can score on, or when an image is missing, unreadable or
    not as the JSON states (:mod:`gwdet.data.coco_checks`). Images turned by an EXIF orientation that
    their size cannot confirm are named in a warning.
    """
    where, path = f"dataset {dataset.name!r}:", dataset.json_file
    coco, digest = _read_json(dataset)
    content_digest = hashlib.sha256(json.dumps(coco, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
                                    .encode("utf-8")).hexdigest()  # the same file written otherwise: the same digest
    if not isinstance(coco, dict):
        raise DatasetError(f"{where} {path} holds a JSON {type(coco).__name__}, not a COCO object with "
                           "'images', 'annotations' and 'categories' lists.")
    missing = [key for key in COCO_LISTS if key not in coco and key != "annotations"]
    if missing:
        raise DatasetError(
            f"{where} {path} has no {' and '.join(repr(key) for key in missing)}: a COCO instances file holds "
            "'images', 'annotations' and 'categories' lists.")
    coco.setdefault("annotations", [])  # an image-info file (COCO's test-dev form): images to run a model on
    for key in COCO_LISTS:
        if not isinstance(coco[key], list):
            raise DatasetError(f"{where} '{key}' in {path} is a JSON {type(coco[key]).__name__}, not a list.")
    if not coco["categories"]:
        raise DatasetError(f"{where} {path} lists no categories: 'categories' names the classes, "
                           "e.g. [{\"id\": 1, \"name\": \"cat\"}].")
    if not coco["images"]:
        raise DatasetError(f"{where} {path} lists no images.")
    names: dict[int, str] = {}
    for index, category in enumerate(coco["categories"]):
        if isinstance(category, dict) and "id" in category and type(category["id"]) is not int:
            raise DatasetError(
                f"{where} category #{index} of {path} ({_shown(category)}) has id "
                f"{_not_an_integer_id(category['id'])}: write it "
                + (f"as the number {_integral_id(category['id'])}, \"id\": {_integral_id(category['id'])}, "
                   if _integral_id(category["id"]) is not None else "as an integer, e.g. \"id\": 1, ")
                + "and give its annotations that number as their category_id.")
        if not (isinstance(category, dict) and isinstance(category.get("id"), int)
                and isinstance(category.get("name"), str)):
            raise DatasetError(f"{where} category #{index} of {path} is {_shown(category)}: each category needs "
                               "an integer 'id' and a string 'name'.")
        if category["id"] in names:
            raise DatasetError(f"{where} category id {category['id']} appears twice in {path} "
                               f"({names[category['id']]!r} and {category['name']!r}): give each category its own id.")
        names[category["id"]] = category["name"]
    shared = _shared_category_names(names)
    if shared:
        raise DatasetError(
            f"{where} {len(shared)} category name(s) of {path} are given to more than one category: {listed(shared, SHOWN)}. "
            "detectron2 names the classes by these names (its thing_classes) and the per-class AP of the results by "
            "them, so those categories would be reported as one, the others' AP lost. Give each category its own "
            "name (or merge them into one category, their annotations with its id).")
    for index, image in enumerate(coco["images"]):
        absent = [key for key in IMAGE_KEYS if not isinstance(image, dict) or key not in image]
        if absent:
            raise DatasetError(f"{where} image #{index} of {path} has no {', '.join(map(repr, absent))} "
                               f"({_shown(image)}): detectron2 reads {', '.join(map(repr, IMAGE_KEYS))} of every image.")
    problems = image_entry_problems(coco["images"])
    if problems:
        raise DatasetError(f"{where} image entries of {path} cannot be read ({len(problems)} problem(s)): {listed_problems(problems)}. "
                           "Correct them (file_name: the image's path under IMAGE_ROOT; width, height: its size in pixels).")
    problems = non_integer_ids(coco["images"], lambda image: repr(image["file_name"]))
    if problems:
        raise DatasetError(
            f"{where} the image ids of {path} must be integers (COCO's format), and {len(problems)} are not: "
            f"{listed_problems(problems)}. Give each image an integer id, unique in the file (e.g. 1 for 1.0), and "
            "its annotations that image_id.")
    problems = duplicate_ids(coco["images"], lambda image: repr(image["file_name"]))
    if problems:
        raise DatasetError(
            f"{where} {len(problems)} image id(s) of {path} are not unique: {listed_problems(problems)}. detectron2 would "
            "attach the annotations of both images to one of the files. Give each image its own id, and its "
            "annotations that image_id.")
    strings = _string_ids_among_integers(coco["images"])
    if strings:
        raise DatasetError(
            f"{where} the image ids of {path} mix integers and strings: {len(strings)} image(s) have a string id, "
            f"{listed(strings, SHOWN)}, the others integers. COCO's image ids are integers, and detectron2 sorts them "
            "when it loads the file, which fails on a mix (TypeError: '<' not supported between 'str' and 'int'). "
            "Give those images integer ids, unique in the file, and their annotations those image_ids.")
    problems = shared_file_names(coco["images"])
    if problems:
        raise DatasetError(
            f"{where} {len(problems)} file name(s) of {path} are given to more than one image: "
            f"{listed_problems(problems)}. detectron2 would read the same pixels for each of those images, so the "
            "boxes and masks of all but one would be trained (and evaluated) on another image. Give each image "
            "entry its own file_name, or merge the entries into one image (one id) with all their annotations.")
    sizes = {image["id"]: image for image in coco["images"]}
    tally = _AnnotationTally(sizes)
    orphans = []
    for index, annotation in enumerate(coco["annotations"]):
        absent = [key for key in ANNOTATION_KEYS if not isinstance(annotation, dict) or key not in annotation]
        if absent:
            raise DatasetError(f"{where} annotation #{index} of {path} has no {', '.join(map(repr, absent))} "
                               f"({_shown(annotation)}): every annotation needs {', '.join(map(repr, ANNOTATION_KEYS))}.")
        if annotation.get("ignore", 0) != 0:  # detectron2's loader stops on it with a bare assertion
            raise DatasetError(
                f"{where} annotation id {annotation['id']} of {path} has \"ignore\": {_shown(annotation['ignore'])}, "
                "which detectron2 does not read (it stops with an assertion): mark a region to ignore as a crowd "
                "region, \"iscrowd\": 1 (COCO evaluation ignores detections matched to it), and remove \"ignore\".")
        category_id = annotation["category_id"]
        if type(category_id) is not int:  # '1', 1.0 and true are no category 1 to COCO (1.0 == True == 1 to Python)
            raise DatasetError(
                f"{where} annotation id {annotation['id']} of {path} has category_id "
                f"{_not_an_integer_id(category_id)}: {_category_id_fix(category_id, names)}")
        if category_id not in names:
            raise DatasetError(
                f"{where} annotation id {annotation['id']} of {path} has category_id {annotation['category_id']!r}, "
                f"which is not among its categories (ids {listed([str(i) for i in sorted(names)], SHOWN)}): add the "
                "category to 'categories' or correct the annotation.")
        if annotation["image_id"] in sizes:
            tally.add(annotation)
        else:
            kind = type(annotation["image_id"]).__name__
            orphans.append(f"annotation id {annotation['id']}: image_id {_shown(annotation['image_id'])} ("
                           + ("null" if annotation["image_id"] is None else f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}")
                           + ")")
    if orphans:
        example = next(iter(sizes), None)
        raise DatasetError(
            f"{where} {len(orphans)} annotation(s) of {path} name an image_id that no image of the file has: "
            f"{listed_problems(orphans)}. The images' ids are {type(example).__name__}s (e.g. {example!r}): each "
            "annotation's image_id must be the id of its image, of the same type (the number 1, not the string "
            "\"1\"); detectron2 would leave such annotations out without a word.")
    if tally.crowd_values:
        raise DatasetError(
            f"{where} {len(tally.crowd_values)} annotation(s) of {path} have an 'iscrowd' that is neither 0 nor 1: "
            f"{listed_problems(tally.crowd_values)}. detectron2 trains only on annotations whose iscrowd equals 0 (a "
            "string \"0\" counts as a crowd region, not trained on) and COCO evaluation reads int(iscrowd) (null "
            "stops it after training). Set iscrowd to the number 0 for an object, 1 for a crowd region.")
    if tally.areas:
        raise DatasetError(
            f"{where} {len(tally.areas)} annotation(s) of {path} have no usable 'area': {listed_problems(tally.areas)}. "
            "COCO evaluation reads every annotation's area, a number >= 0 in pixels: with a string it stops after "
            "training; with a negative one, or one above its largest area range (1e10), it ignores "
            "the object, so missing it costs no AP, and an area of 0 for an object of some size (or one larger than the "
            "image) puts the object in another size range (APs, APm, APl). Set area to the object's mask area (or box area) in pixels.")
    problems = non_integer_ids(coco["annotations"], lambda annotation: f"an annotation of image {annotation['image_id']}",
                               strings=False)
    if problems:
        raise DatasetError(
            f"{where} the annotation ids of {path} must be integers (COCO's format), and {len(problems)} are not: "
            f"{listed_problems(problems)}. COCO evaluation keeps the id of the annotation a detection matches as a "
            "number (a string stops it after training). Give each annotation an integer id, unique in the file (e.g. "
            "1 for 1.0).")
    zero = [tally.named(annotation) for annotation in coco["annotations"] if annotation["id"] == 0]
    if zero:
        raise DatasetError(
            f"{where} {path} has an {zero[0]}: COCO evaluation takes the annotation id 0 for \"no match\", so a "
            "detection of that object counts as a false positive and the AP is lower than the model's. Number the "
            "annotations from 1.")
    problems = duplicate_ids(coco["annotations"], lambda annotation: f"an annotation of image {annotation['image_id']}")
    if problems:
        raise DatasetError(
            f"{where} {len(problems)} annotation id(s) of {path} are not unique: {listed_problems(problems)}. detectron2 "
            "refuses such a file with a bare assertion and COCO evaluation mixes the annotations up. Give each "
            "annotation its own id.")
    if tally.repeated:
        raise DatasetError(
            f"{where} {len(tally.repeated)} annotation(s) of {path} repeat another of the same image, with the same "
            f"category and bbox: {listed_problems(tally.repeated)}. Each copy counts as one more object: COCO "
            "evaluation scores it as one no detection can match (a lower AP), and training weighs the object twice. "
            "Remove the copies (a merge of two annotation files leaves such twins).")
    # the image files' sizes before the boxes and masks, which are checked against the sizes the JSON states: a
    # wrong width or height there is named as such, not as boxes or masks that do not fit
    root = dataset.image_root
    if not os.path.exists(root):
        raise DatasetError(f"{where} the image folder {root} does not exist. Give the folder that the JSON's "
                           f"file_name entries are relative to ({FORMAT}).")
    if not os.path.isdir(root):
        raise DatasetError(f"{where} the image folder {root} is a file. Give the folder that the JSON's file_name "
                           f"entries are relative to ({FORMAT}).")
    first = coco["images"][0]["file_name"]
    if not os.path.exists(os.path.join(root, first)):  # a folder or other non-file: image_file_problems names it
        raise DatasetError(f"{where} the first image of {path}, {first!r}, is not in the image folder {root}: "
                           f"{_file_name_advice(first, root)}")
    outside = _absolute_names_outside(coco["images"], root)
    if outside:
        folder = os.path.commonpath([os.path.dirname(name) for name in outside])
        raise DatasetError(
            f"{where} {len(outside)} of the {len(coco['images'])} images of {path} have an absolute file_name outside "
            f"the image folder {root}, the first {outside[0]!r}: detectron2 reads an absolute path as it is, so "
            "IMAGE_ROOT would not be used and those images would be read from elsewhere than the folder given. Write "
            f"the file names relative to IMAGE_ROOT (e.g. strip their leading folders), or give as IMAGE_ROOT the "
            f"folder they are in ({folder}).")
    rotations: dict[str, int] = {}
    problems = image_file_problems(coco["images"], root, rotations)
    if problems:
        raise DatasetError(
            f"{where} {len(problems)} of the {len(coco['images'])} images of {path} cannot be read as it states (under "
            f"{root}): {listed_problems(problems)}. Fix or replace those files, or remove them and their annotations "
            "from the JSON.")
    degenerate = tally.degenerate
    if degenerate:
        raise DatasetError(
            f"{where} {len(degenerate)} box(es) of {path} cannot be trained on (detectron2 would drop them or learn "
            f"nothing from them, without a word): {listed(degenerate, 3, '; ')}. "
            "Correct or remove those annotations (bbox is [x, y, width, height] in pixels, inside the image).")
    if tally.instances and len(tally.below_a_pixel) == tally.instances:
        raise DatasetError(
            f"{where} every box of {path} is smaller than one pixel in both sides ({tally.instances} boxes, e.g. "
            f"{listed_problems(tally.below_a_pixel)}): the boxes (and masks) look normalized to 0..1, but COCO's are in "
            "pixels of the image, and detectron2 would learn nothing from them (loss_box_reg 0). Multiply x and width "
            "by the image's width, y and height by its height (the polygons' x and y the same way).")
    problems = mask_problems(coco["annotations"], sizes)
    if problems:
        raise DatasetError(
            f"{where} {len(problems)} mask(s) of {path} cannot be used: {listed_problems(problems)}. Correct or remove "
            "those masks (polygons: [[x1, y1, x2, y2, x3, y3, ...]] in pixels; RLE: {\"size\": [height, width], "
            "\"counts\": ...} as pycocotools.mask.encode writes it), or the 'segmentation' key to train boxes only.")
    corners, masked = corner_boxes(coco["annotations"], sizes)
    if corners and 2 * len(corners) >= masked:
        raise DatasetError(
            f"{where} the bboxes of {len(corners)} of the {masked} annotation(s) with a mask in {path} read as "
            f"[x1, y1, x2, y2], the corners of their masks, but COCO's bbox is [x, y, width, height]: "
            f"{listed_problems(corners)}. detectron2 would train and evaluate boxes that reach beyond their objects by "
            "x and y, without a word. Write each bbox as [x1, y1, x2 - x1, y2 - y1].")
    problems = linked_files(coco["images"], root)
    if problems:
        raise DatasetError(
            f"{where} {len(problems)} image file(s) of {path} are another image's file under another name (a symbolic "
            f"or hard link, under {root}): {listed_problems(problems)}. detectron2 would read the same pixels for each "
            "of those images, so the boxes and masks of all but one would be trained (and evaluated) on another "
            "image. Give each image entry a file of its own, or merge the entries into one image (one id) with all "
            "their annotations.")
    beyond = [f"{tally.named(annotation)}: {problem}" for annotation in coco["annotations"]
              for problem in [_area_beyond_box(annotation)] if problem]
    if beyond:
        raise DatasetError(
            f"{where} {len(beyond)} annotation(s) of {path} have an area larger than their box: {listed_problems(beyond)}. "
            "An object lies inside its box, so such an area was not rescaled with the box and image (a converter's "
            "resize): COCO evaluation files the objects under another size range (APs, APm, APl). Set area to the "
            "object's mask area (or box area) in pixels.")
    area_warning = _check_areas_fit_objects(dataset, coco["annotations"], sizes)
    paths = [os.path.realpath(os.path.join(root, image["file_name"])) for image in coco["images"]]
    elongated = max(coco["images"], key=lambda image: max(image["width"], image["height"])
                    / max(min(image["width"], image["height"]), 1))
    return CocoContents(tuple(sorted(names.items())), len(coco["images"]), tally.instances, tally.rle_masks,
                        tally.without_mask, tally.crowd, tally.crowd_without_mask, tally.without_iscrowd,
                        tally.without_area,
                        (str(elongated["file_name"]), int(elongated["width"]), int(elongated["height"])),
                        digest, content_digest, tuple((path, file_fingerprint(path)) for path in sorted(set(paths))),
                        tuple(warning for warning in (_rotation_warning(dataset, rotations), area_warning) if warning))


# ---- the catalog -----------------------------------------------------------------------------

_REGISTERED: dict[str, CocoDataset] = {}  # what this process registered, with its contents
_FROM_COMMAND_LINE: set[str] = set()  # of those, the names a --register-coco of this process gave


def _check_areas_fit_objects(dataset: CocoDataset, annotations: Sequence[dict], images: dict[Any, dict]) -> str | None:
    """Refuse ``dataset`` when at least half of its ``annotations`` have an area far from their
    object's (:func:`gwdet.data.coco_checks.area_mismatches`): the areas were scaled or written
    for something else. Fewer such annotations are named in the warning returned."""
    found, compared = area_mismatches(annotations, images)
    if not found:
        return None
    where, path = f"dataset {dataset.name!r}:", dataset.json_file
    what = (f"{len(found)} of the {compared} annotation(s) of {path} have an 'area' far from their object's pixel count "
            f"(more than {MASK_AREA_FACTOR:g} times off their mask's, or {BOX_AREA_FACTOR:g} times below their box's "
            f"without a mask): {listed_problems(found)}. COCO evaluation files each object under APs, APm or APl by "
            "its area, so these objects would be scored in another size range.")
    fix = ("Set each area to the object's mask area in pixels (pycocotools.mask.area of its mask), or its box area "
           "without a mask.")
    if 2 * len(found) >= compared:
        raise DatasetError(f"{where} {what} {fix}")
    return f"{where} {what} If these areas are not what you meant, {fix[0].lower()}{fix[1:]}"


def _box_problem(bbox: Any, image: dict) -> str:
    """What is wrong with a COCO ``bbox`` ``[x, y, width, height]`` of ``image`` ("" when nothing):
    :func:`gwdet.data.boxes.box_problem`."""
    return box_problem(bbox, image["width"], image["height"])


def registered_coco_dataset(name: str) -> CocoDataset | None:
    """The dataset registered as ``name`` through this module (``None``: not one of those)."""
    dataset = _REGISTERED.get(name)
    return dataset if dataset is not None and name in DatasetCatalog.list() else None


_OWN_CODE_DATASETS: dict[tuple[str, str, str], CocoDataset] = {}  # (name, json, image root): read and checked


def _own_code_key(name: str) -> tuple[str, str, str] | None:
    """``(name, json file, image root)``, absolute, of a dataset registered with detectron2's
    ``register_coco_instances`` (its metadata names a ``.json`` file and an image folder), else ``None``."""
    metadata = MetadataCatalog.get(name)
    json_file, image_root = metadata.get("json_file", None), metadata.get("image_root", None)
    if not (isinstance(json_file, str) and isinstance(image_root, str) and json_file.endswith(".json")):
        return None
    return name, os.path.abspath(json_file), os.path.abspath(image_root)


def coco_dataset(name: str) -> CocoDataset | None:
    """The COCO instances dataset registered as ``name``, read and checked: a ``--register-coco``
    one (:func:`registered_coco_dataset`), or one that one's own code registered with detectron2's
    ``register_coco_instances`` (its metadata names ``json_file`` and ``image_root``), checked as
    ``--register-coco``'s are (:func:`inspect_coco_file`; again when the file changes). detectron2's
    builtin datasets (COCO, LVIS) and gwdet's generated shapes are not read here."""
    ours = registered_coco_dataset(name)
    if (ours is not None or name.startswith(SHAPES_PREFIX) or name not in DatasetCatalog.list()
            or any(name == builtin or name.startswith(builtin + "_") for builtin in _builtin_names())):
        return ours  # detectron2 derives names from its splits' (coco_2017_val_panoptic_separated)
    key = _own_code_key(name)
    if key is None:
        return None
    known = _OWN_CODE_DATASETS.get(key)
    if known is None or not _json_unchanged(known):
        known = _OWN_CODE_DATASETS[key] = CocoDataset(*key).inspected()
        log_inspection_warnings(known)
    classes = MetadataCatalog.get(name).get("thing_classes", None)
    if classes is not None and list(classes) != known.read.class_names:  # detectron2's loader asserts on them
        raise DatasetError(
            f"dataset {name!r} is registered with thing_classes {listed([repr(c) for c in classes], SHOWN)} in its "
            f"metadata, but its annotation file {known.json_file} names the categories "
            f"{listed([repr(c) for c in known.read.class_names], SHOWN)} (by id): "
            f"{_difference(list(classes), known.read.class_names, 'the metadata', 'the file', repr)}. detectron2 "
            "takes the class names from the file when it loads it, and refuses other ones in the metadata. Register "
            "it without thing_classes (register_coco_instances(name, {}, json_file, image_root)), or with the file's.")
    return known


def sha256_as_read(name: str) -> str | None:
    """The SHA-256 of dataset ``name``'s JSON file as it was read and checked: a ``--register-coco``
    one, or one of one's own code that :func:`coco_dataset` read from the files its metadata names
    now; ``None`` when neither was read."""
    dataset = registered_coco_dataset(name)
    if dataset is None and name in MetadataCatalog.list():
        key = _own_code_key(name)
        dataset = _OWN_CODE_DATASETS.get(key) if key is not None else None
    if dataset is None or dataset.contents is None:
        return None
    return dataset.contents.json_sha256 or None


@functools.cache
def _builtin_names() -> frozenset[str]:
    """The names of detectron2's builtin datasets (``detectron2.data.datasets.builtin``'s splits)."""
    from detectron2.data.datasets import builtin

    names: set[str] = set()

    def collect(splits: dict) -> None:
        for key, value in splits.items():
            if isinstance(value, dict):
                collect(value)
            else:
                names.add(key)

    for attribute, value in vars(builtin).items():
        if attribute.startswith("_PREDEFINED_SPLITS") and isinstance(value, dict):
            collect(value)
    return frozenset(names)


def given_on_the_command_line(name: str) -> bool:
    """Whether ``name`` was registered by a ``--register-coco`` of this process (which
    ``$GWDET_REGISTER_COCO`` does not replace)."""
    return name in _FROM_COMMAND_LINE and registered_coco_dataset(name) is not None


def check_name_available(name: str) -> None:
    """:class:`DatasetError` unless ``name`` is free for a ``--register-coco`` dataset (a name this
    module registered before may be registered again)."""
    if name.startswith(SHAPES_PREFIX):
        raise DatasetError(f"dataset name {name!r} is taken: names starting with {SHAPES_PREFIX!r} are gwdet's "
                           "embedded shapes dataset. Pick another NAME.")
    if name in DatasetCatalog.list() and name not in _REGISTERED:
        raise DatasetError(f"dataset name {name!r} is taken: it is already registered (detectron2 registers its "
                           "builtin datasets, such as coco_2017_train, under DETECTRON2_DATASETS). Pick another NAME.")


def register_coco_datasets(datasets: Iterable[CocoDataset], command_line: bool = False) -> None:
    """Register each dataset (checked as :func:`inspect_coco_file` does, unless it was) with
    detectron2's ``register_coco_instances`` and its categories as ``thing_classes``; with
    ``command_line``, as given by ``--register-coco`` (:func:`given_on_the_command_line`). A dataset
    already registered here with the same files is left as it is; :class:`DatasetError` for a name
    that is taken (:func:`check_name_available`) or files that fail the checks; ``TypeError`` for
    anything but :class:`CocoDataset` items (a ``--register-coco`` string: :meth:`CocoDataset.parse`)."""
    datasets = [datasets] if isinstance(datasets, (str, CocoDataset)) else list(datasets)
    wrong = next((dataset for dataset in datasets if not isinstance(dataset, CocoDataset)), None)
    if wrong is not None:
        example = f"[CocoDataset.parse({wrong!r})]" if isinstance(wrong, str) else \
            "[CocoDataset.parse(\"NAME=JSON:IMAGE_ROOT\")]"
        raise GwdetTypeError(f"register_coco_datasets takes a list of gwdet.data.CocoDataset, not {wrong!r} "
                             f"({type(wrong).__name__}): e.g. register_coco_datasets({example}); nothing was registered.")
    for dataset in datasets:
        if command_line:
            _FROM_COMMAND_LINE.add(dataset.name)
        else:
            _FROM_COMMAND_LINE.discard(dataset.name)
        registered = registered_coco_dataset(dataset.name)
        if registered == dataset and registered is not None and _json_unchanged(registered):
            continue
        check_name_available(dataset.name)
        dataset = dataset.inspected()
        log_inspection_warnings(dataset)
        if dataset.name in DatasetCatalog.list():  # registered here before, onto other files or an older JSON
            DatasetCatalog.remove(dataset.name)
            MetadataCatalog.remove(dataset.name)
        register_coco_instances(dataset.name, {"thing_classes": dataset.read.class_names},
                                dataset.json_file, dataset.image_root)
        load = DatasetCatalog[dataset.name]
        DatasetCatalog.remove(dataset.name)
        DatasetCatalog.register(dataset.name, functools.partial(_load_unchanged, dataset, load))
        _REGISTERED[dataset.name] = dataset


def recorded_images(record: Any) -> frozenset[str]:
    """The image files (real paths) of the annotation file that a checkpoint's record of a training
    set names (``json_file``, ``json_sha256``, ``image_root``), while that file holds what it held;
    none otherwise (no such record, a file gone or changed, or not a COCO file)."""
    if not isinstance(record, dict):
        return frozenset()
    path, root, digest = record.get("json_file"), record.get("image_root"), record.get("json_sha256")
    if not (isinstance(path, str) and isinstance(root, str) and digest and os.path.isfile(path)) \
            or cached_sha256(path) != digest:
        return frozenset()
    try:
        with open(path, "rb") as file:
            images = json.load(file)["images"]
        return frozenset(os.path.realpath(os.path.join(root, image["file_name"])) for image in images)
    except (OSError, ValueError, KeyError, TypeError):
        return frozenset()


def _json_unchanged(dataset: CocoDataset) -> bool:
    """Whether ``dataset``'s JSON file holds what it held when it was checked."""
    return os.path.isfile(dataset.json_file) and cached_sha256(dataset.json_file) == dataset.read.json_sha256


def _load_unchanged(dataset: CocoDataset, load: Callable[[], list[dict]]) -> list[dict]:
    """detectron2's ``load`` of ``dataset``'s records, refused (:class:`DatasetError`) where its JSON
    file changed since it was checked at registration (replaced while a run trained): the run
    would train or be evaluated on annotations nothing checked."""
    if not os.path.isfile(dataset.json_file):
        raise DatasetError(
            f"dataset {dataset.name!r}: {dataset.json_file} is no longer there (moved or deleted since the dataset was "
            "registered at the start of the run). Put the file back, or register the dataset again from where it is "
            "now (run the command again); a training's checkpoints are kept (evaluate them with --eval-only).")
    if not _json_unchanged(dataset):
        raise DatasetError(
            f"dataset {dataset.name!r}: {dataset.json_file} changed since it was checked when the dataset was "
            "registered (at the start of the run): it would be read unchecked, for annotations other than the run "
            "started with. Put the file back as it was, or register it again (run the command again) so that it is "
            "checked; a training's checkpoints are kept (evaluate them with --eval-only).")
    return load()


# ---- other processes -------------------------------------------------------------------------


def environment_datasets() -> list[CocoDataset]:
    """The datasets ``$GWDET_REGISTER_COCO`` lists (not read yet); :class:`DatasetError` when it
    is not a JSON list of ``"NAME=JSON:IMAGE_ROOT"`` strings."""
    text = os.environ.get(ENVIRONMENT_VARIABLE, "").strip()
    if not text:
        return []
    try:
        specs = json.loads(text)
    except json.JSONDecodeError:
        specs = None
    if not isinstance(specs, list) or not all(isinstance(spec, str) for spec in specs):
        raise DatasetError(f"{ENVIRONMENT_VARIABLE} must be a JSON list of \"{FORMAT}\" strings, e.g. "
                           f"'[\"{EXAMPLE}\"]'; it is {_shown(text)}.")
    datasets: list[CocoDataset] = []
    for spec in specs:
        try:
            dataset = CocoDataset.parse(spec)
        except DatasetError as error:
            raise DatasetError(f"{ENVIRONMENT_VARIABLE}: {error}") from None
        if any(earlier.name == dataset.name for earlier in datasets):
            raise DatasetError(f"{ENVIRONMENT_VARIABLE}: dataset {dataset.name!r} is given twice: give each NAME once.")
        datasets.append(dataset)
    return datasets


@contextlib.contextmanager
def datasets_in_environment(datasets: Sequence[CocoDataset]) -> Iterator[None]:
    """Inside the block, ``$GWDET_REGISTER_COCO`` holds ``datasets`` too (replacing entries of the
    same names), so that the processes started there register them; afterwards it is as it was."""
    before = os.environ.get(ENVIRONMENT_VARIABLE)
    if datasets:
        given = {dataset.name for dataset in datasets}
        kept = [dataset.spec for dataset in environment_datasets() if dataset.name not in given]
        os.environ[ENVIRONMENT_VARIABLE] = json.dumps(kept + [dataset.spec for dataset in datasets])
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ENVIRONMENT_VARIABLE, None)
        else:
            os.environ[ENVIRONMENT_VARIABLE] = before


# ---- the command line ------------------------------------------------------------------------


class RegisterCocoAction(argparse.Action):
    """``--register-coco NAME=JSON:IMAGE_ROOT``, repeatable: a tuple of checked :class:`CocoDataset`
    (:func:`inspect_coco_file`; nothing registered yet). A bad value, a taken NAME or a NAME given
    twice is an argparse error: one line, exit status 2."""

    def __init__(self, option_strings, dest, **kwargs):
        kwargs.setdefault("default", ())
        kwargs.setdefault("metavar", FORMAT)
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        given = tuple(getattr(namespace, self.dest, None) or ())
        try:
            dataset = CocoDataset.parse(values)
            if any(earlier.name == dataset.name for earlier in given):
                raise DatasetError(f"dataset {dataset.name!r} is given twice: give each NAME once.")
            check_name_available(dataset.name)
            dataset = dataset.inspected()
        except DatasetError as error:
            raise argparse.ArgumentError(self, str(error)) from None
        setattr(namespace, self.dest, (*given, dataset))


def add_register_coco_argument(parser) -> None:
    """Add ``--register-coco`` to ``parser`` (an ``ArgumentParser`` or an argument group)."""
    parser.add_argument(
        FLAG, dest="register_coco", action=RegisterCocoAction,
        help="register your own COCO-format data as dataset NAME, to use in DATASETS.TRAIN/TEST "
             f"(repeatable; e.g. {EXAMPLE}). JSON is the annotation file, IMAGE_ROOT the folder its file_name "
             "entries are relative to; they are split at the ':' after which JSON names an existing file, so "
             "either path may hold ':' (a value that reads two ways is refused). The number of classes (MODEL.ROI_HEADS.NUM_CLASSES) must "
             "equal the JSON's number of categories, and train and test datasets must have the same categories.")


# ---- the config ------------------------------------------------------------------------------


@dataclass(frozen=True)
class DatasetUse:
    """The datasets a run trains and tests on and whether its model predicts masks, with the words
    the refusals use for them: a yacs config's keys (:meth:`of_config`) or a LazyConfig's settings."""

    train: tuple[str, ...]
    test: tuple[str, ...]
    mask_on: bool
    train_setting: str = "DATASETS.TRAIN"
    test_setting: str = "DATASETS.TEST"
    masks_asked: str = "MODEL.MASK_ON is True"  # why masks are needed
    without_masks: str = "with MODEL.MASK_ON False"  # how to do without them
    mask_format: str | None = None  # how the training loader reads masks (None: not known)
    mask_format_setting: str = "INPUT.MASK_FORMAT"

    @classmethod
    def of_config(cls, cfg: CfgNode, *, trains: bool = True, evaluates: bool = True) -> "DatasetUse":
        """The datasets of ``cfg`` a request reads: its training sets where it ``trains``, its test
        sets where it ``evaluates`` (a tool that reads test images only needs no annotations)."""
        return cls(tuple(cfg.DATASETS.TRAIN) if trains else (), tuple(cfg.DATASETS.TEST) if evaluates else (),
                   bool(cfg.MODEL.MASK_ON), mask_format=cfg.INPUT.MASK_FORMAT)

    def role(self, name: str) -> str:
        return self.train_setting if name in self.train else self.test_setting

    def names(self) -> list[str]:
        return list(dict.fromkeys([*self.train, *self.test]))


def known_class_names(name: str) -> list[str] | None:
    """The class names of a dataset, where known before it is loaded: a ``--register-coco``
    dataset's categories, gwdet's shapes, a registered dataset whose metadata names them."""
    ours = coco_dataset(name)
    if ours is not None:
        return list(ours.read.class_names)
    if name.startswith(SHAPES_PREFIX):
        from gwdet.data.shapes import CLASSES

        return list(CLASSES)
    if name not in DatasetCatalog.list():
        return None
    classes = MetadataCatalog.get(name).get("thing_classes", None)
    return list(classes) if classes is not None else None


def _difference(first: Sequence, second: Sequence, first_name: str, second_name: str, show) -> str:
    """What only one of two category lists has, or that they order the same categories otherwise."""
    first_set, second_set = set(first), set(second)
    only_first = [show(item) for item in first if item not in second_set]
    only_second = [show(item) for item in second if item not in first_set]
    parts = [f"only {name} has {listed(items, SHOWN)}"
             for name, items in ((first_name, only_first), (second_name, only_second)) if items]
    return "; ".join(parts) or "the same categories in another order"


def class_name(category: tuple[int, str] | str) -> str:
    """The class name of a category: ``(id, name)`` of a COCO file, or a name."""
    return category if isinstance(category, str) else category[1]


def _show_category(category: tuple[int, str]) -> str:
    return f"{category[0]} {category[1]!r}"


def _check_same_categories(use: DatasetUse, reference: CocoDataset, name: str) -> None:
    """:class:`DatasetError` unless dataset ``name`` has ``reference``'s categories: the same class
    names in the same order (detectron2 numbers each dataset's classes by its category ids, in
    order, so the ids themselves may differ) for any dataset whose classes are known before loading
    (another ``--register-coco`` dataset, whose ids the message shows; shapes, detectron2's builtin
    COCO)."""
    dataset = coco_dataset(name)
    first: Sequence[Any]
    second: Sequence[Any] | None
    if dataset is not None:  # both JSON files: ids and names
        first, second = reference.read.categories, dataset.read.categories
        show: Callable[[Any], str] = _show_category
        described = f"{use.role(name)} {name!r} ({dataset.json_file})"
    else:
        second = known_class_names(name)
        if second is None:
            return
        first = reference.read.class_names
        show = repr
        described = f"{use.role(name)} {name!r}"
    first_names, second_names = [class_name(item) for item in first], [class_name(item) for item in second]
    if first_names == second_names:
        return
    detail = ("the same names in another order of their ids: " + ", ".join(map(show, first)) + " against "
              + ", ".join(map(show, second)) if sorted(first_names) == sorted(second_names)
              else _difference(first, second, repr(reference.name), repr(name), show))
    raise DatasetError(
        f"{use.role(reference.name)} {reference.name!r} ({reference.json_file}) and {described} have "
        f"different categories ({detail}): train and test on datasets with the same categories, the same names in "
        "the same order of their ids (the ids themselves may differ).")


# What MODEL.*.NUM_CLASSES means for the meta-architectures whose class count gwdet checks against any
# dataset's categories (a --register-coco dataset's for every architecture but these without classes).
_CLASS_COUNT_KEYS = {"GeneralizedRCNN": "ROI_HEADS", "PanopticFPN": "ROI_HEADS", "RetinaNet": "RETINANET",
                     "GWRetinaNet": "RETINANET"}
_WITHOUT_CLASSES = ("ProposalNetwork", "SemanticSegmentor")  # class-agnostic proposals; no ROI heads


def _check_num_classes(cfg: CfgNode, name: str, classes: Sequence[str], source: str = "",
                       any_architecture: bool = False, trains: bool = True) -> None:
    """:class:`DatasetError` unless the model's number of classes is the number of ``classes`` of
    dataset ``name`` (``source``: its JSON, in the message). Checked for the architectures of
    :data:`_CLASS_COUNT_KEYS`, or with ``any_architecture`` for all but :data:`_WITHOUT_CLASSES`.
    A request that does not train (an evaluation) has its class count from the weights: the fix
    is then the dataset's."""
    architecture = cfg.MODEL.META_ARCHITECTURE
    key = _CLASS_COUNT_KEYS.get(architecture)
    if key is None:
        if not any_architecture or architecture in _WITHOUT_CLASSES:
            return
        key = "ROI_HEADS"
    value, count = cfg.MODEL[key].NUM_CLASSES, len(classes)
    if value != count and not trains:
        raise DatasetError(
            f"MODEL.{key}.NUM_CLASSES is {value}, but {DatasetUse.of_config(cfg).role(name)} {name!r}"
            f"{f' ({source})' if source else ''} has {count} categories ({listed(classes, SHOWN)}). An evaluation "
            "takes its class count from the weights (their outputs): "
            + ("if they were trained on more categories, give the dataset all of them, with the ids and names they "
               "were trained on (a category without annotations is fine)" if value > count else
               f"if they were trained on {value} categories, evaluate them on a dataset of those {value} (a copy of the "
               "annotation file that keeps only them and their annotations, with the ids and names they were trained "
               "on)")
            + f"; if they were trained on these {count}, add MODEL.{key}.NUM_CLASSES {count} to the command line.")
    if value != count:
        raise DatasetError(
            f"MODEL.{key}.NUM_CLASSES is {value}, but {DatasetUse.of_config(cfg).role(name)} {name!r}"
            f"{f' ({source})' if source else ''} "
            f"has {count} categories ({listed(classes, SHOWN)}): with fewer classes a category would train as "
            f"background, with more the evaluation fails. Add MODEL.{key}.NUM_CLASSES {count} to the command line (or "
            "set it in the config).")


def _check_masks_present(use: DatasetUse, dataset: CocoDataset, without_mask: int, annotations: int, why: str,
                         boxes_only: str) -> None:
    """:class:`DatasetError` when ``without_mask`` of the ``annotations`` of ``dataset`` (a training
    or test set of ``use``) have no mask: ``why`` that matters (or ""), ``boxes_only``: what to do
    without masks."""
    if without_mask:
        raise DatasetError(
            f"{use.masks_asked}, but {without_mask} of the {annotations} annotations of {use.role(dataset.name)} "
            f"{dataset.name!r} ({dataset.json_file}) have no 'segmentation' mask{why}: add their masks (polygons or "
            f"RLE), or {boxes_only} {use.without_masks}.")


def _check_test_annotations(use: DatasetUse, dataset: CocoDataset) -> None:
    """:class:`DatasetError` unless test ``dataset`` has objects to evaluate against and, when the
    model predicts masks, a mask for every annotation (COCO's mask evaluation reads each one's)."""
    contents, described = dataset.read, f"{use.test_setting} {dataset.name!r} ({dataset.json_file})"
    if not contents.instances:
        crowd = (f" (its {contents.crowd} annotation(s) are all crowd regions, iscrowd 1, which COCO evaluation "
                 "ignores)" if contents.crowd else "")
        raise DatasetError(
            f"{described} has no annotations to evaluate against{crowd}: COCO evaluation would report every AP of it "
            "as nan. Give a test set with annotations (its JSON's 'annotations' list, each with the 'image_id' of one "
            "of its images and iscrowd 0), or leave it out of DATASETS.TEST.")
    if contents.without_iscrowd:
        raise DatasetError(
            f"{contents.without_iscrowd} of the {contents.instances + contents.crowd} annotations of {described} have "
            "no 'iscrowd': detectron2 trains on them as iscrowd 0, but COCO evaluation reads every test annotation's "
            "and would stop with KeyError: 'iscrowd' after training. Add \"iscrowd\": 0 to them (1 for crowd "
            "regions).")
    if contents.without_area:
        raise DatasetError(
            f"{contents.without_area} of the {contents.instances + contents.crowd} annotations of {described} have no "
            "'area': detectron2 trains without it, but COCO evaluation reads every test annotation's area (a number >= 0 "
            "in pixels, which files the object under APs, APm or APl) and would stop with KeyError: 'area' after "
            "training. Add each object's mask area (or box area) in pixels as its \"area\".")
    if use.mask_on:
        _check_masks_present(use, dataset, contents.without_mask + contents.crowd_without_mask,
                             contents.instances + contents.crowd,
                             " (COCO's mask evaluation reads every annotation's mask: it would stop with KeyError: "
                             "'segmentation' after training)", "evaluate boxes only")


def _check_training_masks(use: DatasetUse, dataset: CocoDataset) -> None:
    """:class:`DatasetError` unless every annotation of training ``dataset`` has a mask."""
    _check_masks_present(use, dataset, dataset.read.without_mask, dataset.read.instances, "", "train boxes only")


def _check_mask_format(use: DatasetUse, dataset: CocoDataset) -> None:
    """:class:`DatasetError` unless the masks of training ``dataset`` are in a format the training
    loader reads (``INPUT.MASK_FORMAT``; a LazyConfig's mapper setting)."""
    contents, described = dataset.read, f"{use.train_setting} {dataset.name!r} ({dataset.json_file})"
    if contents.rle_masks and use.mask_format is not None and use.mask_format != "bitmask":
        raise DatasetError(
            f"{contents.rle_masks} annotations of {described} have RLE masks, which detectron2 reads only as "
            f"bitmasks, and {use.mask_format_setting} is {use.mask_format!r}: add "
            f"{as_override(use.mask_format_setting, 'bitmask')} to the command line (or set it in the config).")


def _check_shapes_mask_format(use: DatasetUse, name: str) -> None:
    """:class:`DatasetError` when training set ``name`` of ``use`` is a split of gwdet's shapes
    dataset, whose masks are all RLE, and the training loader reads masks as anything but bitmasks."""
    from gwdet.data.shapes import SPLITS

    if name in {f"{SHAPES_PREFIX}{split}" for split in SPLITS} and use.mask_format is not None \
            and use.mask_format != "bitmask":
        raise DatasetError(
            f"{use.train_setting} {name!r} is gwdet's shapes dataset, whose masks are RLE, which detectron2 reads only "
            f"as bitmasks, and {use.mask_format_setting} is {use.mask_format!r}: add "
            f"{as_override(use.mask_format_setting, 'bitmask')} to the command line (or set it in the config).")


def _check_resizable(cfg: CfgNode, dataset: CocoDataset) -> None:
    """:class:`DatasetError` when the dataset's most elongated image would keep no pixel in one
    direction after the resize of its loader (detectron2's ``ResizeShortestEdge``: the test sizes
    for a test dataset, the smallest training size for a training one); PIL would stop there, at
    the evaluation after training or at the first epoch that draws it."""
    if dataset.read.most_elongated is None:
        return
    file_name, width, height = dataset.read.most_elongated
    resizes = []
    if dataset.name in cfg.DATASETS.TEST and cfg.INPUT.MIN_SIZE_TEST > 0:
        resizes.append(("INPUT.MIN_SIZE_TEST", cfg.INPUT.MIN_SIZE_TEST, "INPUT.MAX_SIZE_TEST", cfg.INPUT.MAX_SIZE_TEST))
    if dataset.name in cfg.DATASETS.TRAIN:
        resizes.append(("INPUT.MIN_SIZE_TRAIN", min(cfg.INPUT.MIN_SIZE_TRAIN), "INPUT.MAX_SIZE_TRAIN",
                        cfg.INPUT.MAX_SIZE_TRAIN))
    for short_key, short, long_key, longest in resizes:
        new_height, new_width = ResizeShortestEdge.get_output_shape(height, width, short, longest)
        if min(new_height, new_width) < 1:
            raise DatasetError(
                f"dataset {dataset.name!r}: image {file_name!r} of {dataset.json_file} ({width}x{height} pixels) would "
                f"be resized to {new_width}x{new_height} by {short_key} {short} and {long_key} {longest}: one side "
                f"would keep no pixel, and PIL would stop there. Raise {long_key}, or crop or remove that image.")


def check_config_against_datasets(cfg: CfgNode, *, trains: bool = True, evaluates: bool = True) -> None:
    """:class:`DatasetError` unless the config fits the ``--register-coco`` datasets it trains on
    (where it ``trains``) or evaluates on (where it ``evaluates``): same categories across them, as
    many classes as categories, annotations (and, with ``MODEL.MASK_ON``, masks) to train and
    evaluate on. Without such a dataset, only the number of classes is checked, against every one of
    them whose classes are known before loading."""
    use = DatasetUse.of_config(cfg, trains=trains, evaluates=evaluates)
    check_datasets_fit(use)
    ours = [dataset for dataset in map(coco_dataset, use.names()) if dataset is not None]
    if not ours:
        for name in use.names():  # the datasets whose classes are known before loading: shapes, detectron2's builtin ones
            classes = known_class_names(name)
            if classes is not None:
                _check_num_classes(cfg, name, classes, trains=trains)
        return
    reference = ours[0]
    _check_num_classes(cfg, reference.name, reference.read.class_names, reference.json_file, any_architecture=True,
                       trains=trains)
    for dataset in ours:
        _check_resizable(cfg, dataset)


def check_datasets_fit(use: DatasetUse) -> None:
    """:class:`DatasetError` unless the ``--register-coco`` datasets of ``use`` fit the run as
    :func:`check_config_against_datasets` checks what a yacs config alone does not say (for a
    LazyConfig, whose class count its own checks read): the same categories across its
    datasets, masks to train on, annotations (and masks) to evaluate against."""
    ours = [dataset for dataset in map(coco_dataset, use.names()) if dataset is not None]
    for name in use.names() if ours else ():
        if name != ours[0].name:
            _check_same_categories(use, ours[0], name)
    for name in use.train:
        if use.mask_on and coco_dataset(name) is None:
            _check_shapes_mask_format(use, name)
    for dataset in ours:
        if use.mask_on and dataset.name in use.train:
            _check_training_masks(use, dataset)
            _check_mask_format(use, dataset)
        if dataset.name in use.test:  # evaluated against the JSON itself
            _check_test_annotations(use, dataset)
    _check_no_shared_training_images(use, ours)


def _check_no_shared_training_images(use: DatasetUse, ours: Sequence[CocoDataset]) -> None:
    """Refuse two training sets of ``use`` (two annotation files) that list the same image files:
    each image would be trained once per file, with that file's annotations, so an object one file
    lacks trains as background; where the files are copies of each other (the same bytes), each
    image would be drawn twice as often as the others'."""
    training = [dataset for dataset in ours if dataset.name in use.train]
    for index, first in enumerate(training):
        for second in training[index + 1:]:
            shared = set(first.read.images_among(frozenset(f for _, f in second.read.image_prints)))
            if not shared or os.path.realpath(first.json_file) == os.path.realpath(second.json_file):
                continue  # one file under two names: refused by its own rule (check_distinct_training_files)
            if _same_file(first.json_file, second.json_file):  # a copy: the same annotations of the same images
                raise DatasetError(
                    f"{use.train_setting} names {first.name!r} and {second.name!r}, registered from two annotation "
                    f"files of the same contents ({first.json_file} and {second.json_file}, byte for byte) over the "
                    f"same {len(shared)} image file(s): detectron2 would join them and draw those images twice as "
                    "often as the others'. Give one of them once (to weigh images, set DATALOADER.SAMPLER_TRAIN "
                    "RepeatFactorTrainingSampler).")
            raise DatasetError(
                f"{use.train_setting} {first.name!r} and {second.name!r} list the same {len(shared)} image "
                f"file(s) ({listed(sorted(shared), 2)}) with the annotations of two files ({first.json_file}, "
                f"{second.json_file}): each such image would be trained twice, once with each file's objects, "
                "and an object one file lacks would train as background. Merge the two files' annotations into "
                "one entry per image, or train on one of them.")


def registered_annotation_file(name: str) -> str | None:
    """The annotation file a registered dataset's metadata names (``json_file``: shapes,
    ``--register-coco``, detectron2's builtin COCO sets), or None."""
    return MetadataCatalog.get(name).get("json_file") if name in MetadataCatalog.list() else None


def warn_of_test_sets_trained_on(use: DatasetUse) -> None:
    """Warn of each test set of ``use`` that is a training set, whose annotation file is (by path
    or by contents) that of a training set (shapes splits and ``--register-coco`` datasets alike:
    every dataset registered by now), or (``--register-coco`` datasets) whose images are training
    images: its results measure the training data."""
    read = {dataset.name: dataset for dataset in map(coco_dataset, use.names()) if dataset is not None}
    for test_name in use.test:
        if test_name in use.train:
            logger.warning(
                f"{use.test_setting} {test_name!r} is also in {use.train_setting}: its results measure the data the "
                "model trains on, not how it does on unseen images. Evaluate on a held-out dataset.")
            continue
        test_json = registered_annotation_file(test_name)
        for train_name in use.train:
            train_json = registered_annotation_file(train_name)
            if test_json and train_json and _same_file(test_json, train_json):
                logger.warning(
                    f"{use.test_setting} {test_name!r} reads the annotation file of {use.train_setting} {train_name!r} "
                    f"({test_json}): its results measure the data the model trains on, not how it does on "
                    "unseen images. Evaluate on a held-out annotation file.")
                continue
            test, train = read.get(test_name), read.get(train_name)
            if test is None or train is None:
                continue
            shared = set(test.read.images_among(frozenset(fingerprint for _, fingerprint in train.read.image_prints)))
            if shared:
                folder = (f" (if the test json names images of its own, its IMAGE_ROOT {test.image_root} is the "
                          "training images' folder: give the folder of the test images)"
                          if len(shared) == test.read.images
                          and os.path.realpath(test.image_root) == os.path.realpath(train.image_root) else "")
                logger.warning(
                    f"{len(shared)} of the {test.read.images} images of {use.test_setting} {test.name!r} are images "
                    "(the files, links or copies of them) of "
                    f"{use.train_setting} {train.name!r} ({listed(sorted(shared), 2)}): its results measure, in part, "
                    f"the data the model trains on, not how it does on unseen images. Evaluate on held-out images{folder}.")


def _same_file(first: str, second: str) -> bool:
    """Whether the files ``first`` and ``second`` are one file or hold the same bytes."""
    try:
        return os.path.samefile(first, second) or filecmp.cmp(first, second, shallow=False)
    except OSError:
        return False
