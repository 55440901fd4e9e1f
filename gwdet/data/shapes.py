"""The embedded synthetic instance-segmentation dataset ("shapes"): runs anywhere, offline.

Each image has a textured background (colour gradient, stripes and noise) and 1-6 filled shapes of
four classes (circle, square, triangle, star) with random sizes, colours and rotations. Shapes are
painted in order, so later ones occlude earlier ones; every annotation is the *visible* part of its
shape (RLE mask, tight box, area), and shapes hidden below ``MIN_VISIBLE_AREA`` pixels are dropped.

Images (PNG) and annotations (COCO json, ``INPUT.MASK_FORMAT: "bitmask"``) are generated once into
a cache folder (``$GWDET_CACHE`` or ``~/.cache/gwdet``) and registered as ``shapes_train``,
``shapes_val`` and ``shapes_test`` (yacs: :func:`register_shapes`; LazyConfig:
:func:`shapes_dataset`). An image depends only on (seed, split, image index), each split drawing
from its own random stream, so the test split never repeats a val or train image and any two
machines produce identical files. The folder's name holds every generator parameter
(:meth:`ShapesSpec.cache_key`), ``spec.json`` records them and ``checksums.json`` the SHA-256 of
every file: a folder that differs or is damaged is generated again, never reused. A cache root that
cannot be written raises :class:`CacheNotWritableError`.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import math
import numbers
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pycocotools.mask as mask_util
from detectron2.config import CfgNode
from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.data.datasets import register_coco_instances
from PIL import Image, ImageDraw

from gwdet.config import require_gwdet_config
from gwdet.errors import GwdetError, GwdetFileExistsError, GwdetTypeError, GwdetValueError, listed
from gwdet.layers.common import check_int_at_least
from gwdet.utils.atomic import file_sha256, process_is_gone
from gwdet.utils.cli_errors import unexpanded_variable_problem

CLASSES = ("circle", "square", "triangle", "star")
# Order matters: a split's index here seeds its random stream (train 0, val 1, test 2).
SPLITS = ("train", "val", "test")
MIN_VISIBLE_AREA = 16
MAX_SHAPES_PER_IMAGE = 6
# A shape's radius is drawn from [MIN_RADIUS_FRACTION, MAX_RADIUS_FRACTION) times the image side.
MIN_RADIUS_FRACTION = 0.08
MAX_RADIUS_FRACTION = 0.25
# The smallest image side a shape can keep MIN_VISIBLE_AREA pixels in: the largest shape drawn is a
# circle of radius MAX_RADIUS_FRACTION x side (area pi r^2; the other classes cover less at the
# same radius), so below sqrt(MIN_VISIBLE_AREA / pi) / MAX_RADIUS_FRACTION pixels none reaches it.
MAX_IMAGE_SIZE = 4096  # pixels a side: an image of 48 MiB drawn in memory
MIN_IMAGE_SIZE = math.ceil(math.sqrt(MIN_VISIBLE_AREA / math.pi) / MAX_RADIUS_FRACTION)
# Bump when a change of the drawing code changes the images or annotations it produces: the
# version is part of the cache key, so caches drawn by older code are not reused.
GENERATOR_VERSION = 1
SPEC_JSON = "spec.json"
CHECKSUMS_JSON = "checksums.json"

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShapesSpec:
    """What to generate: image side in pixels, images per split, and the seed."""

    image_size: int = 128
    num_train: int = 200
    num_val: int = 50
    seed: int = 0
    num_test: int = 50

    def __post_init__(self) -> None:
        """Each value checked as its config key (``DATASETS.SHAPES.*``) is: image counts >= 1, a
        seed >= 0 (each a whole number), an image side that holds a shape (:func:`check_image_size`)."""
        for field in ("num_train", "num_val", "num_test"):
            check_int_at_least("ShapesSpec", field, getattr(self, field), 1)
        check_int_at_least("ShapesSpec", "seed", self.seed, 0)
        check_image_size(self.image_size)
        for field in ("image_size", "num_train", "num_val", "num_test", "seed"):  # numpy's integers as Python's
            object.__setattr__(self, field, int(getattr(self, field)))

    def num_images(self, split: str) -> int:
        return {"train": self.num_train, "val": self.num_val, "test": self.num_test}[split]

    def parameters(self) -> dict:
        """Everything the generated files depend on: this spec plus the generator's constants."""
        return {
            **asdict(self),
            "generator_version": GENERATOR_VERSION,
            "splits": list(SPLITS),
            "classes": list(CLASSES),
            "min_visible_area": MIN_VISIBLE_AREA,
            "max_shapes_per_image": MAX_SHAPES_PER_IMAGE,
        }

    def cache_key(self) -> str:
        """A short hash of :meth:`parameters` (any change of any parameter changes it)."""
        text = json.dumps(self.parameters(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:10]

    def folder_name(self) -> str:
        """Readable parameters plus :meth:`cache_key`, e.g. ``shapes_s128_n400-50-50_seed0_<hash>``."""
        counts = "-".join(str(self.num_images(split)) for split in SPLITS)
        return f"shapes_s{self.image_size}_n{counts}_seed{self.seed}_{self.cache_key()}"

    @classmethod
    def from_config(cls, cfg: CfgNode) -> "ShapesSpec":
        """The spec a yacs config's ``DATASETS.SHAPES`` keys give (:data:`SPEC_CONFIG_KEYS`); an image
        size too small is refused naming its key."""
        check_image_size(cfg.DATASETS.SHAPES.IMAGE_SIZE, SPEC_CONFIG_KEYS["image_size"])
        return cls(**{field: cfg.DATASETS.SHAPES[key.rsplit(".", 1)[1]] for field, key in SPEC_CONFIG_KEYS.items()})


# each field of ShapesSpec -> the yacs key that gives it (the LazyConfig's L(ShapesSpec) node takes the same values)
SPEC_CONFIG_KEYS = {"image_size": "DATASETS.SHAPES.IMAGE_SIZE", "num_train": "DATASETS.SHAPES.NUM_TRAIN",
                    "num_val": "DATASETS.SHAPES.NUM_VAL", "num_test": "DATASETS.SHAPES.NUM_TEST",
                    "seed": "DATASETS.SHAPES.SEED"}
SPEC_SIZE_SETTING = "the ShapesSpec's image_size"  # what an image size given to the Python API is called


def check_image_size(image_size: Any, setting: str = SPEC_SIZE_SETTING) -> None:
    """Raise ``ValueError`` naming ``setting`` unless ``image_size`` is an integer of at least
    :data:`MIN_IMAGE_SIZE` (in a smaller image no shape covers :data:`MIN_VISIBLE_AREA` pixels, so
    the dataset would hold (almost) no annotation to train or evaluate on) and at most
    :data:`MAX_IMAGE_SIZE` (each image and mask is drawn in memory)."""
    whole = isinstance(image_size, numbers.Integral) and not isinstance(image_size, bool)
    if not whole:
        raise GwdetValueError(
            f"{setting}={image_size!r} ({type(image_size).__name__}): the image side is a number of pixels, an "
            f"integer of at least {MIN_IMAGE_SIZE}, e.g. 64 (the demo's images are 128 pixels a side).")
    if int(image_size) > MAX_IMAGE_SIZE:
        raise GwdetValueError(
            f"{setting}={image_size!r}: the shapes dataset draws each image and its masks in memory "
            f"({int(image_size) ** 2 * 3 / 2**30:.1f} GiB for one image of that side), and is meant for small images: "
            f"use at most {MAX_IMAGE_SIZE} (the demo's images are 128 pixels a side), or train on your own data "
            "(--register-coco).")
    if int(image_size) >= MIN_IMAGE_SIZE:
        return
    raise GwdetValueError(
        f"{setting}={image_size!r}: the shapes dataset needs images of at least {MIN_IMAGE_SIZE} pixels a side. Its "
        f"shapes have radii of {MIN_RADIUS_FRACTION:.0%} to {MAX_RADIUS_FRACTION:.0%} of the image side, and a shape covering fewer than {MIN_VISIBLE_AREA} pixels is left out of the annotations: in a "
        "smaller image even its largest shape covers fewer, so (almost) no image would hold an annotation to train "
        f"or evaluate on. Use at least {MIN_IMAGE_SIZE}, e.g. 64 (the demo's images are 128 pixels a side).")


CACHE_VARIABLE = "GWDET_CACHE"
# the setting register_shapes passes on: a config's folder for the dataset, used instead of the cache
ROOT_KEY = "DATASETS.SHAPES.ROOT"


def default_cache_root() -> Path:
    """``$GWDET_CACHE`` if set and not empty (shells often export an empty variable, which would
    otherwise be the current folder), else ``~/.cache/gwdet``; as an absolute path."""
    return Path(os.environ.get(CACHE_VARIABLE) or Path.home() / ".cache" / "gwdet").expanduser().absolute()


class CacheNotWritableError(GwdetError, OSError):
    """The folder the shapes dataset is generated into cannot be created or written."""


def _unwritable_root_message(root: Path, setting: str | None, error: OSError) -> str:
    """The error text for a dataset folder ``root`` that cannot be written; ``setting`` names where
    ``root`` came from (``None``: ``$GWDET_CACHE`` or its default)."""
    reason = f"{error.strerror or error}: {error.filename!r}" if error.filename else str(error)
    writable = f"a writable directory, e.g. export {CACHE_VARIABLE}=/tmp/gwdet-cache"
    if setting is None and os.environ.get(CACHE_VARIABLE):
        source = f"{CACHE_VARIABLE}={os.environ[CACHE_VARIABLE]!r}"
        fix = f"Point {CACHE_VARIABLE} at {writable}."
    elif setting is None:
        unset = "is empty" if CACHE_VARIABLE in os.environ else "is not set"
        source = f"the default cache folder {str(root)!r}, as {CACHE_VARIABLE} {unset}"
        fix = f"Point {CACHE_VARIABLE} at {writable}."
    else:
        source, fix = f"{setting}={str(root)!r}", f"Set {setting} to a writable directory"
        fix += f", or to \"\" to use ${CACHE_VARIABLE}." if setting == ROOT_KEY else "."
    if error.errno in (errno.ENOSPC, errno.EDQUOT):  # writable, but full: room there is one fix
        fix = f"Free space there (its disk or quota is full), or: {fix[0].lower()}{fix[1:]}"
    if error.errno == errno.EFBIG:  # the process's limit on a file's size, wherever it writes
        fix = ("A limit on the size of the files this process may write stops it (the shell's ulimit -f): raise or "
               "lift it (ulimit -f unlimited), then run again.")
    return f"The shapes dataset cannot be written to {source} ({reason}). {fix}"


@contextlib.contextmanager
def _writing_into(root: Path, setting: str | None) -> Iterator[None]:
    """Turn an ``OSError`` while creating or writing the dataset under ``root`` into a
    :class:`CacheNotWritableError` that names ``setting`` (``None``: ``$GWDET_CACHE`` or its
    default) and the fix."""
    try:
        yield
    except OSError as error:
        raise CacheNotWritableError(_unwritable_root_message(root, setting, error)) from error


# ---- drawing ---------------------------------------------------------------------------------


def _textured_background(rng: np.random.Generator, size: int) -> np.ndarray:
    """A colour gradient plus oriented stripes plus pixel noise, as float RGB in [0, 255]."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    corner_a, corner_b = rng.uniform(40, 215, size=(2, 3))
    angle = rng.uniform(0, math.pi)
    ramp = (xx * math.cos(angle) + yy * math.sin(angle) + 1) / 2
    image = corner_a + (corner_b - corner_a) * ramp[..., None]
    stripe_angle, stripe_freq = rng.uniform(0, math.pi), rng.uniform(4, 16)
    stripes = np.sin(2 * math.pi * stripe_freq * (xx * math.cos(stripe_angle) + yy * math.sin(stripe_angle)))
    image += rng.uniform(5, 25) * stripes[..., None]
    image += rng.normal(0, rng.uniform(2, 10), size=image.shape)
    return image


def _regular_polygon(center, radius: float, sides: int, rotation: float, inner_ratio: float = 1.0):
    """Vertices of a regular polygon; ``inner_ratio`` < 1 alternates radii to make a star."""
    points = []
    steps = sides * (2 if inner_ratio < 1.0 else 1)
    for k in range(steps):
        r = radius if k % 2 == 0 or inner_ratio == 1.0 else radius * inner_ratio
        theta = rotation + 2 * math.pi * k / steps
        points.append((center[0] + r * math.cos(theta), center[1] + r * math.sin(theta)))
    return points


def _shape_mask(rng: np.random.Generator, size: int, class_id: int) -> np.ndarray:
    """A boolean mask of one random shape of class ``class_id``."""
    radius = rng.uniform(MIN_RADIUS_FRACTION, MAX_RADIUS_FRACTION) * size
    center = rng.uniform(0.1 * size, 0.9 * size, size=2)
    rotation = rng.uniform(0, 2 * math.pi)
    canvas = Image.new("L", (size, size), 0)
    draw = ImageDraw.Draw(canvas)
    name = CLASSES[class_id]
    if name == "circle":
        draw.ellipse([center[0] - radius, center[1] - radius, center[0] + radius, center[1] + radius], fill=1)
    elif name == "square":
        draw.polygon(_regular_polygon(center, radius * 1.2, 4, rotation), fill=1)
    elif name == "triangle":
        draw.polygon(_regular_polygon(center, radius * 1.3, 3, rotation), fill=1)
    else:
        draw.polygon(_regular_polygon(center, radius * 1.4, 5, rotation, inner_ratio=0.45), fill=1)
    return np.asarray(canvas, dtype=bool)


def render_image(seed: int, split: str, index: int, size: int) -> tuple[np.ndarray, list[dict]]:
    """One image (uint8 HxWx3) and its instances ``{"category_id", "mask"}`` (visible parts)."""
    rng = np.random.default_rng([seed, SPLITS.index(split), index])
    image = _textured_background(rng, size)
    masks, class_ids = [], []
    for _ in range(rng.integers(1, MAX_SHAPES_PER_IMAGE + 1)):
        class_id = int(rng.integers(len(CLASSES)))
        mask = _shape_mask(rng, size, class_id)
        colour = rng.uniform(0, 255, size=3)
        shading = rng.normal(0, 6, size=(int(mask.sum()), 3))
        image[mask] = colour + shading
        masks.append(mask)
        class_ids.append(class_id)
    instances = []
    covered_by_later = np.zeros((size, size), dtype=bool)
    for mask, class_id in zip(reversed(masks), reversed(class_ids), strict=True):
        visible = mask & ~covered_by_later
        covered_by_later |= mask
        if visible.sum() >= MIN_VISIBLE_AREA:
            instances.append({"category_id": class_id, "mask": visible})
    instances.reverse()
    return np.clip(image, 0, 255).astype(np.uint8), instances


# ---- writing ---------------------------------------------------------------------------------


def _coco_annotation(mask: np.ndarray, category_id: int, image_id: int, annotation_id: int) -> dict:
    rle = mask_util.encode(np.asfortranarray(mask.astype(np.uint8)))
    return {
        "id": annotation_id,
        "image_id": image_id,
        "category_id": category_id + 1,
        "segmentation": {"size": list(rle["size"]), "counts": rle["counts"].decode("ascii")},
        "area": float(mask_util.area(rle)),
        "bbox": [float(v) for v in mask_util.toBbox(rle)],
        "iscrowd": 0,
    }


def _image_name(index: int) -> str:
    """The file name of a split's ``index``-th image."""
    return f"{index:06d}.png"


def split_annotations(spec: ShapesSpec, split: str, image_dir: Path | None = None) -> dict:
    """The COCO instances of ``split`` of the dataset ``spec`` describes, as ``<split>.json`` holds
    them; each image is rendered (its shapes' masks come from drawing them) and, with
    ``image_dir``, written there."""
    images: list[dict] = []
    annotations: list[dict] = []
    for index in range(spec.num_images(split)):
        pixels, instances = render_image(spec.seed, split, index, spec.image_size)
        file_name = _image_name(index)
        if image_dir is not None:
            Image.fromarray(pixels).save(image_dir / file_name)
        image_id = index + 1
        images.append({"id": image_id, "file_name": file_name, "height": spec.image_size, "width": spec.image_size})
        for instance in instances:
            annotations.append(
                _coco_annotation(instance["mask"], instance["category_id"], image_id, len(annotations) + 1)
            )
    return {
        "info": {"description": f"gwdet synthetic shapes ({split}, seed {spec.seed})"},
        "images": images,
        "annotations": annotations,
        "categories": [{"id": i + 1, "name": name, "supercategory": "shape"} for i, name in enumerate(CLASSES)],
    }


def write_split(spec: ShapesSpec, split: str, out_dir: Path) -> None:
    """Write ``out_dir/<split>/*.png`` and ``out_dir/<split>.json`` (COCO instances)."""
    image_dir = out_dir / split
    image_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{split}.json").write_text(json.dumps(split_annotations(spec, split, image_dir)))


def _record_checksums(folder: Path) -> None:
    """``checksums.json``: the SHA-256 of every image and json file of the generated ``folder``."""
    files = sorted(path for path in folder.rglob("*") if path.is_file() and path.suffix in (".png", ".json"))
    checksums = {path.relative_to(folder).as_posix(): file_sha256(str(path)) for path in files}
    (folder / CHECKSUMS_JSON).write_text(json.dumps(checksums, sort_keys=True, indent=0))


def damaged_files(folder: Path) -> list[str]:
    """The files of the generated ``folder`` that are missing or differ from ``checksums.json``
    (``[CHECKSUMS_JSON]`` when that record itself is missing or unreadable)."""
    try:
        checksums = json.loads((folder / CHECKSUMS_JSON).read_text())
    except (OSError, ValueError):
        return [CHECKSUMS_JSON]
    if not isinstance(checksums, dict):
        return [CHECKSUMS_JSON]
    damaged = []
    for name, digest in sorted(checksums.items()):
        try:
            if file_sha256(str(folder / name)) != digest:
                damaged.append(name)
        except OSError:
            damaged.append(name)
    return damaged


def _records_every_file(folder: Path, spec: ShapesSpec) -> bool:
    """Whether ``checksums.json`` of ``folder`` is a record holding every file ``spec`` generates
    (each split's json and images), which :func:`damaged_files` then compares."""
    try:
        checksums = json.loads((folder / CHECKSUMS_JSON).read_text())
    except (OSError, ValueError):
        return False
    expected = {f"{split}.json" for split in SPLITS} | {
        f"{split}/{_image_name(index)}" for split in SPLITS for index in range(spec.num_images(split))}
    return isinstance(checksums, dict) and expected <= checksums.keys()


def _files_read(folder: Path) -> bool:
    """Whether every json of ``folder`` parses and every PNG it lists decodes."""
    try:
        for split in SPLITS:
            coco = json.loads((folder / f"{split}.json").read_text())
            for image in coco["images"]:
                with Image.open(folder / split / image["file_name"]) as png:
                    png.load()
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return True


def _is_complete(folder: Path, spec: ShapesSpec) -> bool:
    """``spec.json`` (written last) records ``spec``'s parameters and every file matches its
    checksum; damaged files are logged by name."""
    record = folder / SPEC_JSON
    if not record.is_file():
        return False
    try:
        if json.loads(record.read_text()) != spec.parameters():
            return False
    except (OSError, ValueError):
        return False
    if not _records_every_file(folder, spec):
        # files without a record cannot be checked (one may be another split's image): a cache
        # that can be written is generated again, atomically (runs reading it find every file at
        # its path again); one that cannot is read as it is where every file decodes
        if os.access(folder.parent, os.W_OK) and os.access(folder, os.W_OK):
            logger.warning("The shapes dataset in %s has no checksum record of every file (%s is missing, unreadable "
                           "or incomplete), so its files cannot be checked: generating it again.", folder,
                           CHECKSUMS_JSON)
            return False
        if not _files_read(folder):
            return False
        logger.warning("The shapes dataset in %s has no checksum record of every file, and none can be written there: "
                       "it is read as it is (every file decodes).", folder)
        return True
    damaged = damaged_files(folder)
    if damaged:
        logger.warning("The shapes dataset in %s is damaged (%s do not match the checksums recorded when it "
                       "was generated): generating it again.", folder, listed(damaged, 5))
        return False
    return True


STAGING_PREFIX = ".staging-"


def _foreign_entries(folder: Path) -> list[str]:
    """The entries of the dataset folder ``folder`` that no generation writes (anything but
    ``spec.json``, ``checksums.json``, each split's json and its folder of PNG files), by relative
    path: a run trained into the folder, say."""
    if not folder.is_dir():
        return []
    ours = {SPEC_JSON, CHECKSUMS_JSON, *(f"{split}.json" for split in SPLITS), *SPLITS}
    foreign = [entry.name for entry in folder.iterdir() if entry.name not in ours or
               (entry.name in SPLITS) != entry.is_dir()]
    for split in SPLITS:
        if (folder / split).is_dir():
            foreign += [f"{split}/{entry.name}" for entry in (folder / split).iterdir()
                        if entry.suffix != ".png" or not entry.is_file()]
    return sorted(foreign)


def _remove_stale_staging(root: Path) -> None:
    """Remove the staging folders (``.staging-<pid>-*``) that generations killed on their way left
    in ``root``; those of running processes stay (they are being written)."""
    for folder in root.glob(f"{STAGING_PREFIX}*"):
        pid = folder.name[len(STAGING_PREFIX):].split("-", 1)[0]
        if folder.is_dir() and pid.isdigit() and process_is_gone(int(pid)):
            logger.warning("Removing %s, left by a dataset generation that was interrupted.", folder)
            shutil.rmtree(folder, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def ensure_generated(spec: ShapesSpec, root: Path | None = None, setting: str | None = None) -> Path:
    """Generate the dataset once (atomically: a temp folder renamed into place); return its folder.

    ``root``: the folder to generate into (default :func:`default_cache_root`); ``setting`` names
    where ``root`` came from, for :class:`CacheNotWritableError`. A folder of the same name that is
    incomplete, damaged or records other parameters is replaced.
    """
    if root:
        root, setting = Path(root), setting or "root"
    else:
        root, setting = default_cache_root(), None
    target = root / spec.folder_name()
    if _is_complete(target, spec):
        return target
    if os.path.lexists(target) and not target.is_dir():
        raise GwdetFileExistsError(
            f"The shapes dataset is generated into the folder {target}, and a file (or link) of that name is there, "
            "which generating would replace; nothing was changed. Move it out of the cache (GWDET_CACHE, or "
            "DATASETS.SHAPES.ROOT), then run again.")
    foreign = _foreign_entries(target)
    if foreign:
        raise GwdetFileExistsError(
            f"The shapes dataset in {target} is to be generated again (it is incomplete, damaged or of other "
            f"parameters), which replaces its folder, and the folder holds what no generation wrote "
            f"({listed(foreign, 3)}; a run trained into it, say), which that would delete; nothing was changed. Move "
            f"them out of {target} (a run's OUTPUT_DIR belongs outside the dataset cache), then run again.")
    with _writing_into(root, setting):
        root.mkdir(parents=True, exist_ok=True)
        _remove_stale_staging(root)
        staging = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}-", dir=root))
        images = spec.num_train + spec.num_val + spec.num_test
        logger.info(f"Generating the shapes dataset ({images} images of {spec.image_size} pixels a side) into {target}")
        aside: Path | None = None
        try:
            os.chmod(staging, 0o777 & ~_umask())  # mkdtemp makes it 0700: unusable when the cache is shared
            for split in SPLITS:
                write_split(spec, split, staging)
            _record_checksums(staging)
            (staging / SPEC_JSON).write_text(json.dumps(spec.parameters(), sort_keys=True, indent=1))
            if _is_complete(target, spec):  # another process finished first, and may be reading it
                return target
            # What an interrupted or older version left is moved aside, not deleted first: runs
            # reading it find every file at its path again right after the rename.
            aside = root / f"{STAGING_PREFIX}{os.getpid()}-replaced-{target.name}"
            with contextlib.suppress(FileNotFoundError):
                os.rename(target, aside)
            try:
                os.replace(staging, target)
            except OSError:
                if not _is_complete(target, spec):  # not just another process finishing first
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
            if aside is not None:
                shutil.rmtree(aside, ignore_errors=True)
    return target


def register_shapes(cfg: CfgNode) -> Path:
    """Generate (if needed) the dataset ``cfg.DATASETS.SHAPES`` asks for and register its splits.

    Re-registering with a different size or seed replaces the earlier registration.
    """
    require_gwdet_config(cfg, "gwdet.data.register_shapes")
    root = cfg.DATASETS.SHAPES.ROOT or None
    return register_shapes_spec(ShapesSpec.from_config(cfg), root, ROOT_KEY if root else None)


def shapes_dataset(split: str, spec: ShapesSpec, root: str | None = None) -> str:
    """The shapes dataset from a LazyConfig: generate (if needed) the dataset ``spec`` describes,
    register its splits, and return the registered name of ``split`` (``"shapes_<split>"``), for
    any argument that takes a dataset name::

        dataloader.shapes = L(ShapesSpec)(image_size=128, num_train=400, num_val=50, num_test=50, seed=0)
        dataloader.train.dataset = L(get_detection_dataset_dicts)(
            names=L(shapes_dataset)(split="train", spec="${dataloader.shapes}"))
        dataloader.evaluator = L(COCOEvaluator)(dataset_name="${..test.dataset.names}")

    Every node that names a split should refer to the one ``spec`` (as above), since the names are
    registered once per process: registering another spec replaces the earlier registration.
    ``root`` is the folder to generate into (default: ``$GWDET_CACHE`` or ``~/.cache/gwdet``).
    """
    if split not in SPLITS:
        raise GwdetValueError(f"shapes_dataset: split {split!r} is not one of the shapes splits {', '.join(SPLITS)}.")
    if not isinstance(spec, ShapesSpec):
        raise GwdetTypeError(f"shapes_dataset: spec must be a gwdet.data.ShapesSpec (in a LazyConfig, "
                             f"L(ShapesSpec)(image_size=..., num_train=..., num_val=..., num_test=..., seed=...)), "
                             f"not {type(spec).__name__} {spec!r}.")
    register_shapes_spec(spec, root or None, "root of gwdet.data.shapes_dataset" if root else None)
    return f"shapes_{split}"


def register_shapes_spec(spec: ShapesSpec, root: Path | str | None = None, setting: str | None = None) -> Path:
    """Generate (if needed) the dataset ``spec`` describes into ``root`` (:func:`ensure_generated`;
    ``setting`` names where ``root`` came from) and
    register its splits as ``shapes_<split>``, replacing a registration of other files; return its
    folder."""
    given = os.fspath(root) if root else os.environ.get(CACHE_VARIABLE, "")
    unexpanded = unexpanded_variable_problem(setting or CACHE_VARIABLE, given, environment=not root)
    if unexpanded is not None:
        raise GwdetValueError(unexpanded)
    root = Path(root).expanduser().absolute() if root else None  # registered and recorded as absolute paths
    registered = {split: MetadataCatalog.get(f"shapes_{split}").get("json_file")
                  for split in SPLITS if f"shapes_{split}" in DatasetCatalog.list()}
    folder = root / spec.folder_name() if root else default_cache_root() / spec.folder_name()
    if (registered == {split: str(folder / f"{split}.json") for split in SPLITS}
            and MetadataCatalog.get(f"shapes_{SPLITS[0]}").get(_FINGERPRINT) == _fingerprint(folder)):
        return folder  # checked (or generated) and registered by this process, unchanged since: not hashed again
    folder = ensure_generated(spec, root, setting)
    fingerprint = _fingerprint(folder)
    for split in SPLITS:
        name = f"shapes_{split}"
        json_file = str(folder / f"{split}.json")
        if name in DatasetCatalog.list():
            DatasetCatalog.remove(name)
            MetadataCatalog.remove(name)
        # the category ids' map given now, as load_coco_json sets it when the dicts are first loaded: an
        # evaluator made before then would score the contiguous ids as category ids
        metadata = {"thing_classes": list(CLASSES), _FINGERPRINT: fingerprint,
                    "thing_dataset_id_to_contiguous_id": {index + 1: index for index in range(len(CLASSES))}}
        register_coco_instances(name, metadata, json_file, str(folder / split))
    return folder


# The metadata key of a registered shapes split holding :func:`_fingerprint` of its folder when checked.
_FINGERPRINT = "gwdet_files_checked"


def _fingerprint(folder: Path) -> str:
    """The SHA-256 of each file name of ``folder`` with its size and modification time: a change
    since a registration (a damaged or replaced image) makes the next one check the checksums again."""
    files = []
    for path, _, names in os.walk(folder):
        for name in names:
            try:
                stat = os.stat(os.path.join(path, name))
            except OSError:
                continue
            files.append((os.path.join(path, name), stat.st_size, stat.st_mtime_ns))
    return hashlib.sha256(repr(sorted(files)).encode()).hexdigest()
