"""How much a box AP depends on which test images were drawn: a bootstrap over the report split.

The t intervals of :mod:`gwdet_lab.study.stats` hold the test images fixed and vary the training
seed. The other source of noise is the test set itself: another 500 images from the same generator
would give other APs. The bootstrap (Efron) estimates it by resampling the test images with
replacement, ``RESAMPLES`` times, and recomputing box AP on each resample. Every cell of a study
uses the same resampled image lists (drawn from ``BOOTSTRAP_SEED``), so a difference between two
configurations is paired over images as well as over seeds, and its bootstrap interval is the
spread of ``mean over seeds (AP_A - AP_B)`` across resamples (:func:`image_interval`).

The AP of a resample is pycocotools' own: ``COCOeval.evaluate`` matches detections to ground truth
per image once (restricted to what box AP averages: area "all", at most 100 detections per image),
and ``COCOeval.accumulate`` runs on the resampled image list, an image drawn twice counting twice.
The list of all images in order gives the evaluation's box AP exactly. The APs are cached (in the
cell's folder, see :mod:`gwdet_lab.study.run_folder`), keyed by the dataset, the resampling and the
detections file's digest.
"""
from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import logging
import math
import zlib
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from gwdet.utils.run_file_names import RESULTS_JSON
from gwdet.errors import GwdetFileNotFoundError, GwdetValueError
from gwdet.utils.atomic import checksum_path, checksum_problem, write_text_with_checksum
from gwdet_lab.study.run_folder import nan_for_null, null_for_nan

logger = logging.getLogger(__name__)

RESAMPLES = 1000
BOOTSTRAP_SEED = 0
DETECTIONS_JSON = "coco_instances_results.json"
ALL_IMAGES_KEY = "box_ap_all_images"  # the cache's AP on every image once, which results.json records too
MIN_IMAGES = 2  # the fewest images whose resamples can differ


def resampled_positions(images: int, resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """``(resamples, images)`` positions drawn with replacement: the same for every cell."""
    return np.random.default_rng(seed).integers(0, images, size=(resamples, images))


def quiet_coco(annotations: str | dict) -> COCO:
    """pycocotools' ground truth from a COCO annotation file (or the dict such a file holds),
    without its progress prints."""
    with contextlib.redirect_stdout(io.StringIO()):
        if isinstance(annotations, str):
            return COCO(annotations)
        coco = COCO()
        coco.dataset = annotations
        coco.createIndex()
        return coco


class ImageLevelEvaluation:
    """Box detections of one model on one dataset, matched to the ground truth image by image."""

    def __init__(self, ground_truth: COCO, detections: list[dict]):
        """``detections``: COCO result records (what COCOEvaluator writes to its results json)."""
        with contextlib.redirect_stdout(io.StringIO()):
            self._eval = COCOeval(ground_truth, ground_truth.loadRes(detections), "bbox")
            params = self._eval.params
            params.areaRng, params.areaRngLbl, params.maxDets = params.areaRng[:1], params.areaRngLbl[:1], [100]
            self._eval.evaluate()
        self._image_ids = list(self._eval.params.imgIds)
        self._per_image = list(self._eval.evalImgs)  # category-major, then image

    @property
    def images(self) -> int:
        return len(self._image_ids)

    def box_ap(self, positions: Sequence[int]) -> float:
        """Box AP in % (IoU 0.50:0.95, area all, 100 detections) over the images at ``positions``
        of the sorted image ids, repeats counted as often as they occur."""
        images, categories = self.images, len(self._eval.params.catIds)
        image_ids = [self._image_ids[p] for p in positions]
        self._eval.params.imgIds = self._eval._paramsEval.imgIds = image_ids
        self._eval.evalImgs = [self._per_image[k * images + p] for k in range(categories) for p in positions]
        with contextlib.redirect_stdout(io.StringIO()):
            self._eval.accumulate()
        precision = self._eval.eval["precision"][..., 0, 0]  # (IoU, recall, category)
        valid = precision[precision > -1]
        return float(valid.mean()) * 100 if valid.size else float("nan")


def resampled_box_ap(inference_dir: Path, dataset: str, annotations: str | Callable[[], str | dict], cache: Path,
                     recorded_ap: float, resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED) -> list[float]:
    """Box AP of each resample of ``dataset``'s images for the detections that detectron2's
    COCOEvaluator wrote to ``inference_dir/<dataset>/`` (or their gzip copy, ``.json.gz``, as the
    study's committed records keep them); read from ``cache`` when it holds them for the same
    detections and resampling, else computed and written there. ``annotations``: the dataset's
    COCO annotation file, or a function returning its path (or the dict it holds), called only
    when the APs are computed. ``recorded_ap``: the cell's
    box AP on ``dataset`` in its results.json, which the detections must give on all images (else
    they are another cell's: :class:`GwdetValueError`); the cache keeps it to be read back only
    beside that AP. A dataset of fewer than :data:`MIN_IMAGES` images gives no resamples (an empty
    list): every resample of one image is that image, so its spread says nothing of the test
    images' noise."""
    detections = inference_dir / dataset / DETECTIONS_JSON
    packed = detections.with_name(DETECTIONS_JSON + ".gz")
    if detections.is_file():
        raw = detections.read_bytes()
    elif packed.is_file():
        try:
            raw = gzip.decompress(packed.read_bytes())
        except (EOFError, OSError, zlib.error) as error:  # cut short, or not gzip at all
            raise GwdetValueError(
                f"{packed} is damaged ({type(error).__name__}: {error}): the cell's detections cannot be read, so its "
                "APs cannot be resampled; nothing was written. Copy the cell's records again (exported with their "
                f"{packed.name}), then run the same command again.") from None
    else:
        raise GwdetFileNotFoundError(
            f"{detections} (or {packed.name}): no detections to resample, which the resampled APs are checked "
            f"against. Restore the file (a cell's exported records keep it as {packed.name}); or, in a study's run "
            f"folder that holds the cell's checkpoints, remove its {RESULTS_JSON} and run the study's command again: "
            f"the cell is evaluated on {dataset} again.")
    digest = hashlib.sha256(raw).hexdigest()
    key = {"dataset": dataset, "resamples": resamples, "seed": seed, "detections_sha256": digest}
    # an edited cache, or one without its SHA-256 record, is computed again
    if cache.is_file() and Path(checksum_path(str(cache))).is_file() and checksum_problem(str(cache)) is None:
        stored = json.loads(cache.read_text())
        if stored.get("key") == key and _same_ap(nan_for_null(stored.get(ALL_IMAGES_KEY)), recorded_ap):
            return nan_for_null(stored["box_ap"])
    ground_truth = annotations() if callable(annotations) else annotations
    try:
        records = json.loads(raw)
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError: cut short or overwritten
        shown = detections if detections.is_file() else packed
        raise GwdetValueError(
            f"{shown} is damaged (not the JSON list of detections COCOEvaluator writes: {error}); nothing was written. "
            f"Copy the cell's records again (exported with their {packed.name}), or, in a study's run folder that "
            f"holds the cell's checkpoints, remove its {RESULTS_JSON} and run the study's command again.") from None
    coco = quiet_coco(ground_truth)
    evaluation = ImageLevelEvaluation(coco, records) if records else None
    # no detections: COCOEvaluator reports NaN, and so does every resample
    all_images = evaluation.box_ap(range(evaluation.images)) if evaluation else math.nan
    if not _same_ap(all_images, recorded_ap):
        shown = detections if detections.is_file() else packed
        raise GwdetValueError(
            f"{shown} gives a box AP of {all_images:.4f} on {dataset}'s images, but the cell's {RESULTS_JSON} records "
            f"{recorded_ap:.4f}: these are not the detections its results were computed from (another cell's, or "
            f"another evaluation's), so resampling them would misreport the cell; nothing was written. Put the cell's "
            f"own detections back (copy its records again, exported with their {packed.name}); or, in a study's run "
            f"folder that holds the cell's checkpoints, remove its {RESULTS_JSON} and run the study's command again.")
    if len(coco.getImgIds()) < MIN_IMAGES:  # every resample of one image is that image: no spread to see
        aps = []
    else:
        aps = ([evaluation.box_ap(p) for p in resampled_positions(evaluation.images, resamples, seed)] if evaluation
               else [math.nan] * resamples)
    stored = {"key": key, ALL_IMAGES_KEY: null_for_nan(all_images), "box_ap": null_for_nan(aps)}
    try:
        write_text_with_checksum(str(cache), json.dumps(stored, allow_nan=False))
    except OSError as error:  # records on a read-only disk, say: the APs are computed each time instead
        logger.info(f"The resampled APs were not kept in {cache} ({error.strerror or error}): they are computed "
                    "again by each report of these records.")
    return aps


def _same_ap(found: float | None, recorded: float) -> bool:
    """Whether a box AP computed from detections is the one recorded (both NaN: no detections)."""
    if found is None:
        return False
    return (math.isnan(found) and math.isnan(recorded)) or abs(found - recorded) <= 1e-6


def mean_differences(better: Mapping[int, Sequence[float]], worse: Mapping[int, Sequence[float]],
                     seeds: Sequence[int]) -> np.ndarray | None:
    """Per resample, ``mean over seeds (better[s][r] - worse[s][r])``; ``None`` when a seed lacks
    resampled APs."""
    if not seeds or any(s not in better or s not in worse for s in seeds):
        return None
    return np.mean([np.subtract(better[s], worse[s]) for s in seeds], axis=0)


def image_interval(better: Mapping[int, Sequence[float]], worse: Mapping[int, Sequence[float]],
                   seeds: Sequence[int], confidence: float) -> tuple[float, float] | None:
    """Percentile interval over resamples of the mean difference (:func:`mean_differences`)."""
    differences = mean_differences(better, worse, seeds)
    if differences is None:
        return None
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(differences, [tail, 100 - tail])
    return float(low), float(high)


def image_variance(better: Mapping[int, Sequence[float]], worse: Mapping[int, Sequence[float]],
                   seeds: Sequence[int]) -> float | None:
    """Variance (``n - 1``) over resamples of the mean difference (:func:`mean_differences`)."""
    differences = mean_differences(better, worse, seeds)
    return None if differences is None else float(np.var(differences, ddof=1))


def image_spread(aps: Sequence[float]) -> float:
    """Standard deviation of a cell's box AP over the resamples (the bootstrap standard error)."""
    return float(np.std(aps, ddof=1))
