"""The embedded shapes dataset: deterministic, valid COCO, consistent with its image files."""
import dataclasses
import json
import logging
import os
import shutil
import stat

import numpy as np
import pytest
from detectron2.config import get_cfg
from detectron2.data import DatasetCatalog, MetadataCatalog
from PIL import Image
from pycocotools.coco import COCO

from gwdet import add_gwdet_config
from gwdet.data import CLASSES, ShapesSpec, check_dataset_files, ensure_generated, register_shapes
from gwdet.data import shapes
from gwdet.data.shapes import CHECKSUMS_JSON, MIN_VISIBLE_AREA, SPEC_JSON, damaged_files, render_image

SPEC = ShapesSpec(image_size=64, num_train=6, num_val=3, seed=3, num_test=4)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return ensure_generated(SPEC, tmp_path_factory.mktemp("shapes"))


def test_json_loads_with_pycocotools_and_matches_images(folder):
    for split in ("train", "val", "test"):
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


def test_generation_says_what_it_generates_and_a_cached_dataset_says_nothing(tmp_path, caplog):
    # 20,000 images took 49 s without a line of the log
    with caplog.at_level("INFO", logger="gwdet.data.shapes"):
        folder = ensure_generated(SPEC, tmp_path)
    images = SPEC.num_train + SPEC.num_val + SPEC.num_test
    assert f"Generating the shapes dataset ({images} images of {SPEC.image_size} pixels a side) into {folder}" in caplog.text
    caplog.clear()
    with caplog.at_level("INFO", logger="gwdet.data.shapes"):
        ensure_generated(SPEC, tmp_path)
    assert "Generating" not in caplog.text


def test_registration_through_detectron2(tmp_path):
    cfg = add_gwdet_config(get_cfg())
    cfg.DATASETS.SHAPES.ROOT = str(tmp_path)
    cfg.DATASETS.SHAPES.IMAGE_SIZE, cfg.DATASETS.SHAPES.NUM_TRAIN, cfg.DATASETS.SHAPES.NUM_VAL = 64, 5, 2
    cfg.DATASETS.SHAPES.NUM_TEST = 3
    register_shapes(cfg)
    records = DatasetCatalog.get("shapes_train")
    assert len(records) == 5
    assert len(DatasetCatalog.get("shapes_test")) == 3
    assert MetadataCatalog.get("shapes_val").thing_classes == list(CLASSES)
    assert MetadataCatalog.get("shapes_test").thing_classes == list(CLASSES)
    assert all(isinstance(a["segmentation"], dict) for r in records for a in r["annotations"])
    # A different size re-registers the name onto the new files.
    cfg.DATASETS.SHAPES.NUM_TRAIN = 7
    register_shapes(cfg)
    assert len(DatasetCatalog.get("shapes_train")) == 7
    check_dataset_files(["shapes_train", "shapes_val", "shapes_test"])


def test_registering_again_in_one_process_keeps_the_id_map_and_checks_files_changed_since(tmp_path, caplog):
    # in one process: an evaluator made after a 64 -> 96 -> 64 round trip scored contiguous ids as category ids
    # (AP 2.44 -> 1.96); a model prepared for another spec left the other data registered for Trainer.test; an
    # image damaged after the first registration was read by the next run without a word
    from gwdet.data.datasets import register_configured_shapes

    cfg, other = add_gwdet_config(get_cfg()), add_gwdet_config(get_cfg())
    for config, size in ((cfg, 64), (other, 96)):
        config.DATASETS.SHAPES.ROOT = str(tmp_path)
        config.DATASETS.SHAPES.IMAGE_SIZE, config.DATASETS.SHAPES.NUM_TRAIN = size, 2
        config.DATASETS.SHAPES.NUM_VAL, config.DATASETS.SHAPES.NUM_TEST = 2, 2
    folder = register_shapes(cfg)
    register_shapes(other)
    register_configured_shapes(cfg, ["shapes_val"])  # as Trainer.test and build_train_loader do
    assert MetadataCatalog.get("shapes_val").json_file == str(folder / "val.json")
    assert MetadataCatalog.get("shapes_val").thing_dataset_id_to_contiguous_id == {1: 0, 2: 1, 3: 2, 4: 3}
    image = folder / "train" / "000001.png"
    intact = image.read_bytes()
    image.write_bytes(intact[:-40] + bytes(40))
    with caplog.at_level(logging.WARNING, logger="gwdet.data.shapes"):
        register_shapes(cfg)  # registered already, but a file changed since: checked again
    assert "is damaged (train/000001.png do not match" in caplog.text and image.read_bytes() == intact
    register_configured_shapes(other, ["coco_2017_val"])  # reads no shapes split: nothing registered
    assert MetadataCatalog.get("shapes_val").json_file == str(folder / "val.json")


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


def _pixels(folder, split):
    coco = json.loads((folder / f"{split}.json").read_text())
    return [np.asarray(Image.open(folder / split / image["file_name"])) for image in coco["images"]]


def test_test_split_holds_other_images_than_val_and_train(folder):
    """The held-out split draws from its own random stream: no test image repeats a val or train
    image, although all three are generated with the same seed and the same image indices."""
    test, val, train = _pixels(folder, "test"), _pixels(folder, "val"), _pixels(folder, "train")
    assert len(test) == SPEC.num_test
    for image in test:
        assert not any(np.array_equal(image, other) for other in val + train)
    # Same index, same seed, another split: other shapes, other annotations.
    coco_val = json.loads((folder / "val.json").read_text())
    coco_test = json.loads((folder / "test.json").read_text())
    first = lambda coco: [a["bbox"] for a in coco["annotations"] if a["image_id"] == 1]  # noqa: E731
    assert first(coco_val) != first(coco_test)


def test_val_and_train_images_do_not_depend_on_the_other_splits_sizes(tmp_path):
    """Adding a test split (or more train images) leaves every existing val and train image as it
    was: an image depends only on (seed, split, index)."""
    small = ensure_generated(ShapesSpec(64, num_train=2, num_val=2, seed=3, num_test=1), tmp_path)
    large = ensure_generated(ShapesSpec(64, num_train=3, num_val=2, seed=3, num_test=5), tmp_path)
    for split in ("train", "val"):
        # strict=False: large has one train image more; the images both have must be the same
        for a, b in zip(_pixels(small, split), _pixels(large, split), strict=False):
            assert np.array_equal(a, b)


def test_cache_key_changes_with_every_generator_parameter(monkeypatch):
    base = ShapesSpec(image_size=64, num_train=6, num_val=3, seed=3, num_test=4)
    names = {base.folder_name()}
    for field in dataclasses.fields(ShapesSpec):
        changed = dataclasses.replace(base, **{field.name: getattr(base, field.name) + 1})
        names.add(changed.folder_name())
    assert len(names) == 1 + len(dataclasses.fields(ShapesSpec))
    # Constants of the drawing code are part of the key too.
    for constant in ("GENERATOR_VERSION", "MIN_VISIBLE_AREA", "MAX_SHAPES_PER_IMAGE"):
        with monkeypatch.context() as patch:
            patch.setattr(shapes, constant, getattr(shapes, constant) + 1)
            assert base.folder_name() not in names


def test_cache_folder_with_other_parameters_is_regenerated_not_reused(tmp_path, monkeypatch):
    """A folder named like the spec's cache folder but recording other parameters (e.g. written by
    older drawing code before GENERATOR_VERSION was bumped) is replaced."""
    spec = ShapesSpec(image_size=64, num_train=2, num_val=2, seed=5, num_test=2)
    folder = ensure_generated(spec, tmp_path)
    recorded = json.loads((folder / SPEC_JSON).read_text())
    assert recorded == spec.parameters()
    stale = {**recorded, "generator_version": recorded["generator_version"] - 1}
    (folder / SPEC_JSON).write_text(json.dumps(stale))
    (folder / "val.json").write_text(json.dumps({"stale": True}))
    again = ensure_generated(spec, tmp_path)
    assert again == folder
    assert json.loads((again / SPEC_JSON).read_text()) == spec.parameters()
    assert "images" in json.loads((again / "val.json").read_text())



@pytest.mark.parametrize("damage", ["truncated image", "image bytes changed", "json cut short", "image removed"])
def test_a_damaged_cache_is_named_and_generated_again(tmp_path, caplog, damage):
    spec = ShapesSpec(image_size=64, num_train=2, num_val=2, seed=5, num_test=2)
    folder = ensure_generated(spec, tmp_path)
    assert damaged_files(folder) == []
    image, annotations = folder / "train" / "000001.png", folder / "val.json"
    intact = {image: image.read_bytes(), annotations: annotations.read_bytes()}
    if damage == "truncated image":
        image.write_bytes(intact[image][:100])
    elif damage == "image bytes changed":
        image.write_bytes(intact[image][:-40] + bytes(40))
    elif damage == "json cut short":
        annotations.write_bytes(intact[annotations][:-10])
    else:
        image.unlink()
    expected = {"truncated image": ["train/000001.png"], "image bytes changed": ["train/000001.png"],
                "json cut short": ["val.json"], "image removed": ["train/000001.png"]}[damage]
    assert damaged_files(folder) == expected
    with caplog.at_level(logging.WARNING, logger="gwdet.data.shapes"):
        again = ensure_generated(spec, tmp_path)
    assert again == folder and damaged_files(folder) == []
    assert image.read_bytes() == intact[image] and annotations.read_bytes() == intact[annotations]
    assert f"is damaged ({expected[0]} do not match" in caplog.text


def test_a_damaged_cache_holding_files_no_generation_wrote_is_not_replaced(tmp_path):
    # a run trained into the dataset's folder (OUTPUT_DIR $GWDET_CACHE/shapes_...): the damaged dataset was generated
    # again, and the folder moved aside and deleted with the run's checkpoints in it
    from gwdet.errors import GwdetError

    spec = ShapesSpec(image_size=64, num_train=2, num_val=2, seed=5, num_test=2)
    folder = ensure_generated(spec, tmp_path)
    (folder / "model_final.pth").write_bytes(b"a run's weights")
    (folder / "train" / "notes.txt").write_text("the user's")
    (folder / "val.json").write_bytes(b"{")
    with pytest.raises(GwdetError) as refused:
        ensure_generated(spec, tmp_path)
    assert str(refused.value) == (
        f"The shapes dataset in {folder} is to be generated again (it is incomplete, damaged or of other parameters), "
        "which replaces its folder, and the folder holds what no generation wrote (model_final.pth, train/notes.txt; a "
        f"run trained into it, say), which that would delete; nothing was changed. Move them out of {folder} (a run's "
        "OUTPUT_DIR belongs outside the dataset cache), then run again.")
    assert (folder / "model_final.pth").read_bytes() == b"a run's weights" and (folder / "val.json").read_bytes() == b"{"
    (folder / "model_final.pth").unlink()
    (folder / "train" / "notes.txt").unlink()
    assert damaged_files(ensure_generated(spec, tmp_path)) == []
    # a file of the user's under the folder's name: renamed to a hidden staging name, then lost without a word
    shutil.rmtree(folder)
    folder.write_text("the user's notes")
    with pytest.raises(GwdetError, match=rf"^The shapes dataset is generated into the folder {folder}, and a file \(or "
                                         r"link\) of that name is there, which generating would replace; nothing was "
                                         r"changed"):
        ensure_generated(spec, tmp_path)
    assert folder.read_text() == "the user's notes"


def test_the_cache_folder_follows_the_users_umask(tmp_path):
    previous = os.umask(0o022)
    try:
        folder = ensure_generated(ShapesSpec(image_size=64, num_train=2, num_val=2, seed=6, num_test=2), tmp_path)
    finally:
        os.umask(previous)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o755


def test_staging_folders_of_an_interrupted_generation_are_removed(tmp_path):
    import subprocess
    import sys
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)
    stale = tmp_path / f"{shapes.STAGING_PREFIX}{dead}-abc"
    running = tmp_path / f"{shapes.STAGING_PREFIX}{os.getpid()}-def"
    for folder in (stale, running):
        (folder / "train").mkdir(parents=True)
    ensure_generated(ShapesSpec(image_size=64, num_train=2, num_val=2, seed=7, num_test=2), tmp_path)
    assert not stale.exists(), "left by a process that no longer runs"
    # a running process's staging folder stays; this generation's own was renamed into place
    assert list(tmp_path.glob(f"{shapes.STAGING_PREFIX}*")) == [running]


def test_a_writable_cache_without_a_record_of_every_file_is_generated_again(tmp_path, caplog):
    """Files without a checksum record cannot be checked: a training image replaced by another
    split's image (which decodes) was read, and recorded as intact for every later run."""
    spec = ShapesSpec(image_size=64, num_train=2, num_val=2, seed=5, num_test=2)
    folder = ensure_generated(spec, tmp_path)
    image = folder / "train" / "000000.png"
    intact = image.read_bytes()
    for record in (None, "{}", json.dumps({"train.json": "0" * 64})):  # missing, empty, not every file
        image.write_bytes((folder / "val" / "000000.png").read_bytes())
        if record is None:
            (folder / CHECKSUMS_JSON).unlink()
        else:
            (folder / CHECKSUMS_JSON).write_text(record)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="gwdet.data.shapes"):
            assert ensure_generated(spec, tmp_path) == folder
        assert "has no checksum record of every file (checksums.json is missing, unreadable or incomplete), so its " \
               "files cannot be checked: generating it again." in caplog.text
        assert image.read_bytes() == intact and damaged_files(folder) == []


@pytest.mark.parametrize("values, message", [
    ({"num_train": 2.5}, r"ShapesSpec: num_train must be an integer >= 1, got 2.5 \(float\)"),
    ({"seed": -1}, "ShapesSpec: seed must be an integer >= 0, got -1"),
    ({"num_test": 0}, "ShapesSpec: num_test must be an integer >= 1, got 0"),
])
def test_a_shapes_spec_made_in_python_checks_its_values_as_the_config_keys_do(values, message):
    """Before: numpy's and Python's raw errors while generating (or a seed numpy refused)."""
    with pytest.raises(ValueError, match=message):
        ShapesSpec(image_size=32, **values)


def test_an_image_side_too_large_to_draw_in_memory_is_refused_naming_the_key(tmp_path):
    """Before: numpy's raw _ArrayMemoryError for 53.6 GiB (DATASETS.SHAPES.IMAGE_SIZE 60000)."""
    cfg = add_gwdet_config(get_cfg())
    cfg.DATASETS.SHAPES.IMAGE_SIZE, cfg.DATASETS.SHAPES.ROOT = 60000, str(tmp_path / "shapes")
    with pytest.raises(ValueError, match=r"^DATASETS.SHAPES.IMAGE_SIZE=60000: the shapes dataset draws each image and "
                                         r"its masks in memory \(10.1 GiB for one image of that side\)"):
        register_shapes(cfg)
    assert not (tmp_path / "shapes").exists()


def test_a_cache_without_its_checksum_record_that_cannot_take_one_is_read_as_it_is():
    # a shared cache made by an older gwdet, which this user may not write: a raw OSError where the
    # record was written; read by another user, in a forked child (root writes any folder)
    import shutil
    import tempfile

    root = tempfile.mkdtemp(prefix="gwdet-shared-cache-")  # pytest's folders are closed to other users
    generated = ensure_generated(SPEC, root)
    before = {path.name: path.stat().st_mtime_ns for path in generated.rglob("*.png")}
    (generated / CHECKSUMS_JSON).unlink()
    for folder in (root, generated, *generated.iterdir()):
        if os.path.isdir(folder):
            os.chmod(folder, 0o555)
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            if os.geteuid() == 0:
                os.setuid(65534)
            handler = logging.StreamHandler(os.fdopen(writer, "w"))
            logging.getLogger("gwdet.data.shapes").addHandler(handler)
            print(ensure_generated(SPEC, root), file=handler.stream, flush=True)
        finally:
            os._exit(0)
    os.close(writer)
    os.waitpid(child, 0)
    with os.fdopen(reader) as answer:
        said = answer.read()
    after = {path.name: path.stat().st_mtime_ns for path in generated.rglob("*.png")}
    for folder in (root, generated, *generated.iterdir()):
        if os.path.isdir(folder):
            os.chmod(folder, 0o755)
    shutil.rmtree(root)
    assert said.endswith(f"{generated}\n"), said
    assert f"The shapes dataset in {generated} has no checksum record of every file, and none can be written there: " \
           "it is read as it is (every file decodes)." in said
    assert after == before  # not generated again


def test_an_unregistered_name_gets_the_closest_registered_one_and_shapes_names_their_splits():
    # "shapes_vall" was advised to be registered with --register-coco, which refuses shapes_ names
    from gwdet.data.datasets import unregistered_message

    message = unregistered_message("shapes_vall")
    assert ("Names starting with 'shapes_' are gwdet's shapes dataset's: its splits are shapes_train, shapes_val, "
            "shapes_test; give your own data another name") in message and "--register-coco shapes_vall" not in message
    DatasetCatalog.register("sweep_unregistered_probe", list)
    try:
        assert "is not registered. Did you mean 'sweep_unregistered_probe'?" in unregistered_message(
            "sweep_unregisterd_probe")
    finally:
        DatasetCatalog.remove("sweep_unregistered_probe")
