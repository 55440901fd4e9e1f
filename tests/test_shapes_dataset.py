"""The embedded shapes dataset: deterministic, valid COCO, consistent with its image files."""
import json

import numpy as np
import pytest
from detectron2.config import get_cfg
from detectron2.data import DatasetCatalog, MetadataCatalog
from PIL import Image
from pycocotools.coco import COCO

from gwdet import add_gwdet_config
from gwdet.data import CLASSES, ShapesSpec, check_dataset_files, ensure_generated, register_shapes
from gwdet.data.shapes import MIN_VISIBLE_AREA, render_image

SPEC = ShapesSpec(image_size=64, num_train=6, num_val=3, seed=3)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return ensure_generated(SPEC, tmp_path_factory.mktemp("shapes"))


def test_json_loads_with_pycocotools_and_matches_images(folder):
    for split in ("train", "val"):
        coco = COCO(str(folder / f"{split}.json"))
        assert len(coco.getImgIds()) == SPEC.num_images(split)
        assert [c["name"] for c in coco.loadCats(coco.getCatIds())] == list(CLASSES)
        for image_info in coco.loadImgs(coco.getImgIds()):
            pixels = np.asarray(Image.open(folder / split / image_info["file_name"]))
            assert pixels.shape == (image_info["height"], image_info["width"], 3)
            for ann in coco.loadAnns(coco.getAnnIds(imgIds=image_info["id"])):
                mask = coco.annToMask(ann)
                assert mask.shape == pixels.shape[:2]
                assert mask.sum() == ann["area"] >= MIN_VISIBLE_AREA
                ys, xs = np.nonzero(mask)
                x, y, w, h = ann["bbox"]
                assert (x, y, x + w, y + h) == (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1)


def test_visible_masks_do_not_overlap_and_match_painted_pixels():
    image, instances = render_image(seed=1, split="train", index=5, size=96)
    assert instances, "every image has at least one visible shape"
    stacked = np.stack([inst["mask"] for inst in instances])
    assert stacked.sum(axis=0).max() == 1, "occlusion: each pixel belongs to at most one instance"
    # The visible part of a shape shows only that shape's colour (plus mild shading).
    for inst in instances:
        inside = image[inst["mask"]].astype(float)
        assert inside.std(axis=0).max() < 20


def test_generation_is_deterministic(tmp_path):
    first = ensure_generated(SPEC, tmp_path / "a")
    second = ensure_generated(SPEC, tmp_path / "b")
    assert (first / "train.json").read_text() == (second / "train.json").read_text()
    assert (first / "val" / "000002.png").read_bytes() == (second / "val" / "000002.png").read_bytes()
    other_seed = ensure_generated(ShapesSpec(64, 6, 3, seed=4), tmp_path / "a")
    assert (other_seed / "train.json").read_text() != (first / "train.json").read_text()


def test_registration_through_detectron2(tmp_path):
    cfg = add_gwdet_config(get_cfg())
    cfg.DATASETS.SHAPES.ROOT = str(tmp_path)
    cfg.DATASETS.SHAPES.IMAGE_SIZE, cfg.DATASETS.SHAPES.NUM_TRAIN, cfg.DATASETS.SHAPES.NUM_VAL = 64, 5, 2
    register_shapes(cfg)
    records = DatasetCatalog.get("shapes_train")
    assert len(records) == 5
    assert MetadataCatalog.get("shapes_val").thing_classes == list(CLASSES)
    assert all(isinstance(a["segmentation"], dict) for r in records for a in r["annotations"])
    # A different size re-registers the name onto the new files.
    cfg.DATASETS.SHAPES.NUM_TRAIN = 7
    register_shapes(cfg)
    assert len(DatasetCatalog.get("shapes_train")) == 7
    check_dataset_files(["shapes_train", "shapes_val"])


def test_missing_dataset_path_names_the_path_and_the_fix(tmp_path):
    from detectron2.data.datasets import register_coco_instances

    missing = tmp_path / "nowhere" / "instances.json"
    register_coco_instances("gwdet_test_missing", {}, str(missing), str(tmp_path))
    with pytest.raises(FileNotFoundError) as err:
        check_dataset_files(["gwdet_test_missing"])
    assert str(missing) in str(err.value) and "DETECTRON2_DATASETS" in str(err.value)
    with pytest.raises(KeyError, match="not registered"):
        check_dataset_files(["no_such_dataset"])


def test_interrupted_generation_is_redone(tmp_path):
    target = tmp_path / SPEC.folder_name()
    target.mkdir(parents=True)
    (target / "train.json").write_text(json.dumps({"partial": True}))  # no val.json: incomplete
    folder = ensure_generated(SPEC, tmp_path)
    assert "images" in json.loads((folder / "train.json").read_text())
