"""The bootstrap over test images (gwdet_lab.study.image_bootstrap) against pycocotools' own
evaluation: the identity resample is the evaluation, and a resample that draws images twice is the
evaluation of a dataset holding those images twice."""
import json
import math
from pathlib import Path

import numpy as np
import pytest
from pycocotools.cocoeval import COCOeval

from gwdet_lab.study.image_bootstrap import (
    ImageLevelEvaluation,
    image_interval,
    quiet_coco,
    resampled_box_ap,
    resampled_positions,
)


def synthetic_dataset(images: int = 8, seed: int = 0):
    """COCO ground truth and detections: boxes of 2 categories, detections jittered from them with
    random scores, some missed and some false."""
    rng = np.random.default_rng(seed)
    gt = {"images": [], "annotations": [], "categories": [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]}
    detections = []
    for image_id in range(1, images + 1):
        gt["images"].append({"id": image_id, "width": 128, "height": 128})
        for _ in range(int(rng.integers(1, 4))):
            x, y, w, h = (float(v) for v in rng.uniform([0, 0, 8, 8], [90, 90, 36, 36]))
            category = int(rng.integers(1, 3))
            gt["annotations"].append({"id": len(gt["annotations"]) + 1, "image_id": image_id, "category_id": category,
                                      "bbox": [x, y, w, h], "area": w * h, "iscrowd": 0})
            if rng.uniform() < 0.8:  # found, more or less accurately
                jitter = rng.normal(0, 1, 4)
                detections.append({"image_id": image_id, "category_id": category, "score": float(rng.uniform()),
                                   "bbox": [x + jitter[0], y + jitter[1], w + abs(jitter[2]), h + abs(jitter[3])]})
        detections.append({"image_id": image_id, "category_id": int(rng.integers(1, 3)), "score": float(rng.uniform()),
                           "bbox": [float(v) for v in rng.uniform([0, 0, 8, 8], [90, 90, 36, 36])]})
    return gt, detections


def write(path, data):
    path.write_text(json.dumps(data))
    return str(path)


def full_box_ap(gt_file: str, detections_file: str) -> float:
    gt = quiet_coco(gt_file)
    evaluation = COCOeval(gt, gt.loadRes(detections_file), "bbox")
    evaluation.evaluate()
    evaluation.accumulate()
    evaluation.summarize()
    return evaluation.stats[0] * 100


def test_all_images_once_is_the_evaluation(tmp_path):
    gt, detections = synthetic_dataset()
    gt_file, detections_file = write(tmp_path / "gt.json", gt), write(tmp_path / "dt.json", detections)
    evaluation = ImageLevelEvaluation(quiet_coco(gt_file), detections)
    assert evaluation.images == 8
    expected = full_box_ap(gt_file, detections_file)
    assert 10 < expected < 90  # neither trivial nor perfect
    assert evaluation.box_ap(range(8)) == pytest.approx(expected, abs=1e-12)


def test_an_image_drawn_twice_counts_as_two_images(tmp_path):
    gt, detections = synthetic_dataset()
    evaluation = ImageLevelEvaluation(quiet_coco(write(tmp_path / "gt.json", gt)), detections)
    positions = [0, 0, 3, 5, 5, 5, 6, 7]  # image ids 1, 1, 4, 6, 6, 6, 7, 8
    # the same multiset as a dataset: each copy of an image gets its own id, annotations and detections
    copies = {"images": [], "annotations": [], "categories": gt["categories"]}
    copied_detections = []
    for copy_id, position in enumerate(positions, start=1):
        source = gt["images"][position]["id"]
        copies["images"].append({**gt["images"][position], "id": copy_id})
        for annotation in (a for a in gt["annotations"] if a["image_id"] == source):
            copies["annotations"].append({**annotation, "id": len(copies["annotations"]) + 1, "image_id": copy_id})
        copied_detections += [{**d, "image_id": copy_id} for d in detections if d["image_id"] == source]
    copies_file = write(tmp_path / "copies.json", copies)
    expected = full_box_ap(copies_file, write(tmp_path / "copied_dt.json", copied_detections))
    assert evaluation.box_ap(positions) == pytest.approx(expected, abs=1e-12)
    assert evaluation.box_ap(positions) != pytest.approx(evaluation.box_ap(range(8)), abs=1e-3)


def test_resamples_are_cached_per_detections_and_the_same_for_every_cell(tmp_path):
    gt, detections = synthetic_dataset()
    gt_file = write(tmp_path / "gt.json", gt)
    inference = tmp_path / "inference"
    (inference / "test").mkdir(parents=True)
    detections_file = write(inference / "test" / "coco_instances_results.json", detections)
    recorded = full_box_ap(gt_file, detections_file)  # what the cell's results.json holds
    cache = tmp_path / "image_bootstrap.json"
    aps = resampled_box_ap(inference, "test", gt_file, cache, recorded, resamples=50)
    assert len(aps) == 50 and np.std(aps) > 0
    evaluation = ImageLevelEvaluation(quiet_coco(gt_file), detections)
    assert aps[7] == evaluation.box_ap(resampled_positions(8, 50)[7])
    # read back, not recomputed: the cache holds what was computed
    from gwdet.utils.atomic import checksum_path, write_text_with_checksum

    stored = json.loads(cache.read_text())
    assert stored["box_ap_all_images"] == pytest.approx(recorded, abs=1e-9)
    stored["box_ap"][0] = -1.0
    cache.write_text(json.dumps(stored))  # edited beside its SHA-256 record: computed again, not read
    assert resampled_box_ap(inference, "test", gt_file, cache, recorded, resamples=50)[0] == aps[0]
    write_text_with_checksum(str(cache), json.dumps(stored))
    assert resampled_box_ap(inference, "test", gt_file, cache, recorded, resamples=50)[0] == -1.0
    # without its SHA-256 record (an edited cache whose record was deleted): computed again
    Path(checksum_path(str(cache))).unlink()
    assert resampled_box_ap(inference, "test", gt_file, cache, recorded, resamples=50)[0] == aps[0]
    write_text_with_checksum(str(cache), json.dumps(stored))
    # the cache of a cell with another AP (another cell's cache beside its own detections): not read
    stored["box_ap_all_images"] = recorded + 1
    write_text_with_checksum(str(cache), json.dumps(stored))
    assert resampled_box_ap(inference, "test", gt_file, cache, recorded, resamples=50)[0] == aps[0]
    # other detections: recomputed, and refused where the cell's results.json records another AP
    detections_file = write(inference / "test" / "coco_instances_results.json", detections[1:])
    other = full_box_ap(gt_file, detections_file)
    assert resampled_box_ap(inference, "test", gt_file, cache, other, resamples=50)[0] != aps[0]
    before = cache.read_bytes()
    with pytest.raises(ValueError, match=(
            rf"coco_instances_results.json gives a box AP of {other:.4f} on test's images, but the cell's results.json "
            rf"records {recorded:.4f}: these are not the detections its results were computed from .*nothing was "
            r"written. Put the cell's own detections back")):
        resampled_box_ap(inference, "test", gt_file, cache, recorded, resamples=50)
    assert cache.read_bytes() == before
    # no detections at all: NaN, as COCOEvaluator reports
    write(inference / "test" / "coco_instances_results.json", [])
    assert all(math.isnan(v) for v in resampled_box_ap(inference, "test", gt_file, cache, math.nan, resamples=5))
    # ... written as strict JSON (null, which every JSON reader takes) and read back as NaN
    strict = json.loads(cache.read_text(), parse_constant=lambda name: pytest.fail(f"{name} in {cache}"))
    assert strict["box_ap"] == [None] * 5 and strict["box_ap_all_images"] is None
    assert all(math.isnan(v) for v in resampled_box_ap(inference, "test", gt_file, cache, math.nan, resamples=5))
    # a dataset the cell was never evaluated on: an error naming the file and the fix
    with pytest.raises(FileNotFoundError, match=r"val/coco_instances_results.json \(or coco_instances_results.json.gz\): no detections to resample.*the cell is evaluated on val again"):
        resampled_box_ap(inference, "val", gt_file, tmp_path / "other.json", recorded)
    assert not (tmp_path / "other.json").exists()


def test_damaged_detections_are_named_not_a_raw_traceback(tmp_path):
    # a records folder's coco_instances_results.json.gz cut short: gzip's EOFError traceback, no file named
    import gzip

    gt, detections = synthetic_dataset()
    gt_file = write(tmp_path / "gt.json", gt)
    folder = tmp_path / "inference" / "test"
    folder.mkdir(parents=True)
    packed = gzip.compress(json.dumps(detections).encode())
    (folder / "coco_instances_results.json.gz").write_bytes(packed[: len(packed) // 2])
    with pytest.raises(ValueError, match=r"coco_instances_results.json.gz is damaged \(EOFError: .*\): the cell's "
                                         r"detections cannot be read, .*Copy the cell's records again"):
        resampled_box_ap(tmp_path / "inference", "test", gt_file, tmp_path / "cache.json", 0.0, resamples=5)
    (folder / "coco_instances_results.json.gz").unlink()
    (folder / "coco_instances_results.json").write_text(json.dumps(detections)[:-40])
    with pytest.raises(ValueError, match=r"coco_instances_results.json is damaged \(not the JSON list of detections "
                                         r"COCOEvaluator writes: "):
        resampled_box_ap(tmp_path / "inference", "test", gt_file, tmp_path / "cache.json", 0.0, resamples=5)
    assert not (tmp_path / "cache.json").exists()


def test_image_interval_pairs_resamples_and_averages_seeds():
    base = np.linspace(40, 60, 1000)
    # A is B + 2 on every resample of seed 0 and B + 4 on seed 1: the mean difference is 3 exactly,
    # however much the resamples move each AP
    better = {0: base + 2, 1: base[::-1] + 4}
    worse = {0: base, 1: base[::-1]}
    assert image_interval(better, worse, [0, 1], 0.95) == pytest.approx((3.0, 3.0))
    low, high = image_interval({0: base}, {0: np.full(1000, 50.0)}, [0], 0.95)
    assert low == pytest.approx(np.percentile(base - 50, 2.5)) and high == pytest.approx(np.percentile(base - 50, 97.5))
    assert image_interval(better, {0: base}, [0, 1], 0.95) is None  # seed 1 has no resamples for B


def test_resamples_of_records_that_cannot_be_written_to_are_computed_without_a_cache(tmp_path):
    # records on a read-only disk: the report stopped with "[Errno 30] cannot write .../image_bootstrap.json"
    gt, detections = synthetic_dataset()
    gt_file = write(tmp_path / "gt.json", gt)
    inference = tmp_path / "inference"
    (inference / "test").mkdir(parents=True)
    recorded = full_box_ap(gt_file, write(inference / "test" / "coco_instances_results.json", detections))
    (tmp_path / "unwritable").write_text("a file where the cache's folder would be")  # (root writes read-only folders)
    cache = tmp_path / "unwritable" / "image_bootstrap.json"
    aps = resampled_box_ap(inference, "test", gt_file, cache, recorded, resamples=20)
    assert aps == resampled_box_ap(inference, "test", gt_file, tmp_path / "image_bootstrap.json", recorded, resamples=20)
    assert not cache.exists()
