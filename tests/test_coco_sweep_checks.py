"""The bad inputs of sweep B that passed ``--register-coco`` and then trained wrong without a word or
failed after training: each refused (or warned of) at registration or before training, naming the
file, the image or annotation id, the problem and the fix; and the prediction drawings that
overwrote each other or stopped a run after training."""
from __future__ import annotations

import json
import os
import re
import shutil
import warnings
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch
from detectron2.structures import Boxes, Instances
from PIL import Image

from gwdet.data import CocoDataset, DatasetError, check_config_against_datasets, register_coco_datasets
from gwdet.data.datasets import named_empty_training_set
from gwdet.engine.visualize import TRUTH_CAPTION, captioned, drawing_names, save_prediction_pngs, side_by_side
from gwdet.errors import GwdetValueError
from gwdet.model_zoo import build_config

from conftest import DEMO_CONFIG, TINY_OPTS, logged_warnings

SIZE = 64
EXIF_ORIENTATION = 0x0112


def write_dataset(folder: Path, change: Callable[[dict, Path], None] = lambda coco, root: None,
                  folders: tuple[str, ...] = ()) -> str:
    """4 PNGs of 64x64 pixels, each with one rectangle (categories "a" and "b" in turn: polygon, box,
    area, iscrowd 0), under ``folder/img`` (image i in ``folders[i]`` when given); ``change(coco,
    image_root)`` edits the dataset before the JSON is written. Returns ``JSON:IMAGE_ROOT``."""
    root = folder / "img"
    root.mkdir(parents=True)
    coco: dict = {"images": [], "annotations": [], "categories": [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]}
    for index in range(4):
        pixels = np.full((SIZE, SIZE, 3), 30, np.uint8)
        x, y, w, h = 8 + index, 10, 24, 20
        pixels[y:y + h, x:x + w] = (200, 50 + 40 * index, 50)
        file_name = f"{folders[index]}/x.png" if folders else f"{index:03d}.png"
        (root / file_name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(root / file_name)
        coco["images"].append({"id": index + 1, "file_name": file_name, "width": SIZE, "height": SIZE})
        coco["annotations"].append({"id": index + 1, "image_id": index + 1, "category_id": 1 + index % 2,
                                    "bbox": [x, y, w, h], "area": w * h, "iscrowd": 0,
                                    "segmentation": [[x, y, x + w, y, x + w, y + h, x, y + h]]})
    change(coco, root)
    json_file = folder / "train.json"
    json_file.write_text(json.dumps(coco))
    return f"{json_file}:{root}"


def refusal(tmp_path: Path, change: Callable[[dict, Path], None]) -> str:
    """The message of the DatasetError that registering the changed dataset raises."""
    with pytest.raises(DatasetError) as refused:
        CocoDataset.parse(f"m={write_dataset(tmp_path, change)}").inspected()
    return str(refused.value)


def registered(name: str, folder: Path, change: Callable[[dict, Path], None] = lambda coco, root: None,
               folders: tuple[str, ...] = ()) -> None:
    """Register the dataset of :func:`write_dataset` as ``name``."""
    register_coco_datasets([CocoDataset.parse(f"{name}={write_dataset(folder, change, folders)}")])


def config(train: str, test: str, *overrides: str):
    return build_config(str(DEMO_CONFIG), [*TINY_OPTS, "DATASETS.TRAIN", f"('{train}',)", "DATASETS.TEST",
                                           f"('{test}',)", "MODEL.ROI_HEADS.NUM_CLASSES", "2",
                                           "INPUT.MASK_FORMAT", "polygon", *overrides])


# ---- iscrowd and area (sweep B: SILENT 1, 4; RAW 1, 2, 3) -----------------------------------------

@pytest.mark.parametrize("value, shown", [("0", "iscrowd '0' (str)"), (None, "iscrowd None (NoneType)"),
                                          (2, "iscrowd 2 (int)")])
def test_an_iscrowd_other_than_0_or_1_is_refused_naming_the_annotation(tmp_path, value, shown):
    message = refusal(tmp_path, lambda coco, root: coco["annotations"][1].update(iscrowd=value))
    assert "1 annotation(s) of " in message and "have an 'iscrowd' that is neither 0 nor 1" in message, message
    assert f"annotation id 2 of image 2 (001.png): {shown}" in message, message
    assert "Set iscrowd to the number 0 for an object, 1 for a crowd region." in message, message


def test_iscrowd_true_and_false_are_read_as_1_and_0(tmp_path):
    def booleans(coco, root):
        coco["annotations"][0]["iscrowd"], coco["annotations"][1]["iscrowd"] = True, False
    contents = CocoDataset.parse(f"m={write_dataset(tmp_path, booleans)}").inspected().read
    assert (contents.instances, contents.crowd) == (3, 1)


@pytest.mark.parametrize("change, shown", [
    (lambda annotation: annotation.update(area="480"), "area '480' is a str, not a number"),
    (lambda annotation: annotation.update(area=-5), "area -5 is negative"),
    (lambda annotation: annotation.update(area=float("nan")), "area nan is not finite"),
    # COCO evaluation files such an object under another size range (above 1e10: under none)
    (lambda annotation: annotation.update(area=1e11), "area 100000000000.0 is larger than its image (64 x 64 = 4096 pixels)"),
    # a converter's placeholder: every object counted as small (APs of 2000-pixel objects)
    (lambda annotation: annotation.update(area=0), "area 0 for a bbox of 24 x 20 pixels (a placeholder?)"),
], ids=["string", "negative", "nan", "larger than the image", "zero"])
def test_an_area_coco_evaluation_cannot_use_is_refused_naming_the_annotation(tmp_path, change, shown):
    message = refusal(tmp_path, lambda coco, root: change(coco["annotations"][0]))
    assert "1 annotation(s) of " in message and "have no usable 'area'" in message and shown in message, message
    assert "COCO evaluation reads every annotation's area" in message, message
    assert "area to the object's mask area (or box area)" in message, message


def test_a_training_set_without_areas_is_read_as_detectron2_trains_on_it(tmp_path):
    # many converters leave area out: refused before for COCO evaluation, which reads test sets only
    def without_area(coco, root):
        for annotation in coco["annotations"]:
            del annotation["area"]
    contents = CocoDataset.parse(f"m={write_dataset(tmp_path, without_area)}").inspected().read
    assert (contents.without_area, contents.instances) == (4, 4)


def test_areas_larger_than_their_boxes_are_refused(tmp_path):
    # a converter that rescaled images and boxes but not areas: APs and APm moved without a word
    def rescaled(coco, root):
        for annotation in coco["annotations"]:
            annotation["area"] *= 4

    message = refusal(tmp_path, rescaled)
    assert message.startswith("dataset 'm': 4 annotation(s) of ") and ("have an area larger than their box: annotation "
                                                                      "id 1 of image 1 (000.png): area 1920 is larger "
                                                                      "than its bbox (24 x 20 = 480 pixels)") in message


def test_boxes_written_as_corners_are_refused_and_boxes_of_objects_at_the_origin_are_not(tmp_path):
    # [x1, y1, x2, y2] in COCO's [x, y, width, height]: every mask inside its (too large) box, trained and
    # evaluated without a word
    def corners(coco, root):
        for annotation in coco["annotations"]:
            x, y, w, h = annotation["bbox"]
            annotation["bbox"] = [x, y, x + w, y + h]

    message = refusal(tmp_path / "corners", corners)
    assert "the bboxes of 4 of the 4 annotation(s) with a mask in " in message, message
    assert ("read as [x1, y1, x2, y2], the corners of their masks, but COCO's bbox is [x, y, width, height]: "
            "annotation id 1 of image 1 (000.png): bbox [8, 10, 32, 30], its mask's bounding box [8.0, 10.0, 24.0, "
            "20.0]") in message, message
    assert message.endswith("Write each bbox as [x1, y1, x2 - x1, y2 - y1]."), message

    def at_the_origin(coco, root):  # corners and sizes are the same numbers: nothing to tell apart
        for annotation in coco["annotations"]:
            annotation["bbox"][:2] = [0, 0]
            annotation["segmentation"] = [[0, 0, 24, 0, 24, 20, 0, 20]]

    CocoDataset.parse(f"m={write_dataset(tmp_path / 'origin', at_the_origin)}").inspected()


def test_an_annotation_of_an_image_id_no_image_has_is_named_with_its_type(tmp_path):
    # a string "1" beside integer image ids was called a box problem of "image 1 (not in images)"
    message = refusal(tmp_path / "string", lambda coco, root: coco["annotations"][0].update(image_id="1"))
    assert message.endswith(
        "1 annotation(s) of " + str(tmp_path / "string" / "train.json") + " name an image_id that no image of the file "
        "has: annotation id 1: image_id '1' (a str). The images' ids are ints (e.g. 1): each annotation's image_id "
        "must be the id of its image, of the same type (the number 1, not the string \"1\"); detectron2 would leave "
        "such annotations out without a word."), message
    message = refusal(tmp_path / "absent", lambda coco, root: coco["annotations"][2].update(image_id=99))
    assert "annotation id 3: image_id 99 (an int)" in message, message


def test_a_crowd_region_needs_an_area_too(tmp_path):
    message = refusal(tmp_path, lambda coco, root: coco["annotations"][3].update(iscrowd=1, area=None))
    assert "annotation id 4 of image 4 (003.png): area None is a NoneType, not a number" in message, message


# ---- boxes in 0..1, category names, image ids (SILENT 2, 3; RAW 4) ---------------------------------

def _normalized(coco, root):
    for annotation in coco["annotations"]:
        annotation["bbox"] = [value / SIZE for value in annotation["bbox"]]
        annotation["segmentation"] = [[value / SIZE for value in annotation["segmentation"][0]]]


def test_boxes_all_below_a_pixel_are_refused_as_normalized(tmp_path):
    message = refusal(tmp_path, _normalized)
    assert "every box of " in message and "is smaller than one pixel in both sides (4 boxes, e.g. " in message, message
    assert "annotation id 1 of image 1 (000.png): bbox [0.125, 0.15625, 0.375, 0.3125]" in message, message
    assert "look normalized to 0..1, but COCO's are in pixels" in message, message
    assert "Multiply x and width by the image's width, y and height by its height" in message, message


def test_one_box_below_a_pixel_among_others_is_kept(tmp_path):
    def one_tiny_box(coco, root):
        coco["annotations"][0].update(bbox=[10, 10, 0.5, 0.5], segmentation=[[10, 10, 10.5, 10, 10.5, 10.5]],
                                      area=0.125)
    assert CocoDataset.parse(f"m={write_dataset(tmp_path, one_tiny_box)}").inspected().read.instances == 4


def test_two_categories_of_one_name_are_refused(tmp_path):
    message = refusal(tmp_path, lambda coco, root: coco["categories"][1].update(name="a"))
    assert "1 category name(s) of " in message and "are given to more than one category: 'a' (ids 1 and 2)" in message
    assert "thing_classes" in message and "per-class AP" in message and "Give each category its own name" in message


def test_image_ids_that_mix_integers_and_strings_are_refused_naming_the_strings(tmp_path):
    def mixed(coco, root):
        coco["images"][1]["id"] = coco["annotations"][1]["image_id"] = "two"
    message = refusal(tmp_path, mixed)
    assert "the image ids of " in message and "mix integers and strings: 1 image(s) have a string id, 'two' " \
        "('001.png'), the others integers" in message, message
    assert "COCO's image ids are integers" in message and "Give those images integer ids" in message, message


# ---- images: too large for PIL, turned by EXIF (RAW 6; SILENT 6) ------------------------------------

def test_an_image_larger_than_pil_opens_is_refused_naming_its_size_and_the_limit(tmp_path, monkeypatch):
    spec = write_dataset(tmp_path)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # 64x64 = 4096 pixels: over twice the limit
    with pytest.raises(DatasetError) as refused:
        CocoDataset.parse(f"m={spec}").inspected()
    message = str(refused.value)
    assert "image id 1 (000.png) is 64x64 = 4096 pixels, more than PIL opens" in message, message
    assert "(PIL.Image.MAX_IMAGE_PIXELS is 1000; PIL refuses more than twice that" in message, message
    assert "resize it" in message and "raise PIL.Image.MAX_IMAGE_PIXELS in your own code" in message, message
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 3000)  # over the limit, under twice it: PIL warns
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        assert CocoDataset.parse(f"m={spec}").inspected().read.images == 4, "detectron2 reads these: not refused"
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)  # the warning as an error: PIL refuses them
        with pytest.raises(DatasetError, match=r"000.png\) is 64x64 = 4096 pixels, more than PIL opens \(PIL.Image."
                                               "MAX_IMAGE_PIXELS is 3000; PIL warns above it, and a warnings filter "
                                               "made the warning an error"):
            CocoDataset.parse(f"m={spec}").inspected()


def _turned_jpeg(orientation: int, width: int = SIZE, height: int = SIZE):
    def change(coco, root):
        exif = Image.Exif()
        exif[EXIF_ORIENTATION] = orientation
        Image.open(root / "000.png").convert("RGB").resize((width, height)).save(root / "000.jpg", exif=exif)
        turned = (height, width) if orientation in (5, 6, 7, 8) else (width, height)
        coco["images"][0].update(file_name="000.jpg", width=turned[0], height=turned[1])
        coco["annotations"][0].update(bbox=[1, 1, 10, 10], segmentation=[[1, 1, 11, 1, 11, 11, 1, 11]], area=100)
    return change


@pytest.fixture
def registration_warnings():
    """The warnings that registration logs (gwdet.data.coco_registration's logger)."""
    with logged_warnings("gwdet.data.coco_registration") as lines:
        yield lines


def test_a_square_image_turned_by_its_exif_orientation_is_named_in_a_warning(tmp_path, registration_warnings):
    # the warning was logged when --register-coco was parsed, before the run's log existed: on the console only, not
    # in log.txt or results.md; now when the dataset is registered for the run
    inspected = CocoDataset.parse(f"m={write_dataset(tmp_path / 'parsed', _turned_jpeg(6))}").inspected()
    assert registration_warnings == [] and len(inspected.read.warnings) == 1
    registered("turned", tmp_path, _turned_jpeg(6))
    assert len(registration_warnings) == 1, registration_warnings
    warning = registration_warnings[0]
    assert "1 image(s) of " in warning and "have an EXIF orientation other than 1" in warning, warning
    assert "'000.jpg' (orientation 6)" in warning and "detectron2 turns (or flips) each image by its EXIF " \
        "orientation" in warning and "must be in the turned frame" in warning, warning


@pytest.mark.parametrize("orientation, width, height, warned", [
    (1, SIZE, SIZE, False),  # as stored
    (3, SIZE, SIZE // 2, True),  # upside down: the size cannot tell
    (6, SIZE, SIZE // 2, False),  # a quarter turn of a non-square image: the JSON states the turned size
])
def test_only_orientations_the_stated_size_cannot_confirm_are_warned_of(tmp_path, registration_warnings, orientation,
                                                                       width, height, warned):
    registered("turned", tmp_path, _turned_jpeg(orientation, width, height))
    assert bool(registration_warnings) == warned, registration_warnings


# ---- test sets: no annotations, no masks (SILENT 5; RAW 5) -----------------------------------------

def test_an_object_annotated_twice_is_refused_naming_both_ids(tmp_path):
    # a merge of two annotation files: box AP 56.7 became 43.4 without a word
    def repeat_two(coco, root):
        coco["annotations"] += [dict(annotation, id=100 + annotation["id"]) for annotation in coco["annotations"][:2]]
    message = refusal(tmp_path, repeat_two)
    assert "2 annotation(s) of " in message and "annotation id 101 of image 1 (000.png) repeats annotation id 1" in message
    assert "Remove the copies" in message
    # the same box of another category, or a crowd region over an object, is no copy
    CocoDataset.parse(f"m={write_dataset(tmp_path / 'other', lambda coco, root: coco['annotations'].append(dict(coco['annotations'][0], id=50, category_id=2)))}").inspected()


def test_an_evaluation_on_fewer_categories_than_the_model_says_where_the_count_comes_from(tmp_path):
    # --eval-only advised NUM_CLASSES 3, which then failed as weights missing from the checkpoint
    def without_b(coco, root):
        coco["categories"].pop()
        coco["annotations"] = [annotation for annotation in coco["annotations"] if annotation["category_id"] == 1]
    registered("sub_of_four", tmp_path, without_b)
    cfg = config("sub_of_four", "sub_of_four", "MODEL.ROI_HEADS.NUM_CLASSES", "4")
    with pytest.raises(DatasetError, match=r"An evaluation takes its class count from the weights .*give the dataset "
                                           r"all of them, with the ids and names they were trained on"):
        check_config_against_datasets(cfg, trains=False)
    with pytest.raises(DatasetError, match=r"with fewer classes a category would train as background"):
        check_config_against_datasets(cfg)
    # weights of fewer classes than the test set's: neither branch of the advice fitted them
    registered("four_of_two", tmp_path / "two")
    cfg = config("four_of_two", "four_of_two", "MODEL.ROI_HEADS.NUM_CLASSES", "1")
    with pytest.raises(DatasetError, match=r"if they were trained on 1 categories, evaluate them on a dataset of those 1 "
                                           r"\(a copy of the annotation file that keeps only them"):
        check_config_against_datasets(cfg, trains=False)


def test_datasets_whose_categories_differ_in_their_ids_only_train_and_test_together(tmp_path):
    # refused as "different categories", while detectron2 numbers each dataset's classes by its ids in order
    def renumbered(coco, root):
        for category in coco["categories"]:
            category["id"] *= 10
        for annotation in coco["annotations"]:
            annotation["category_id"] *= 10
    registered("ids_1_2", tmp_path / "plain")
    registered("ids_10_20", tmp_path / "renumbered", renumbered)
    check_config_against_datasets(config("ids_10_20", "ids_1_2"))

    def swapped(coco, root):
        coco["categories"] = [{"id": 1, "name": "b"}, {"id": 2, "name": "a"}]
    registered("ids_swapped", tmp_path / "swapped", swapped)
    with pytest.raises(DatasetError, match=r"different categories \(the same names in another order of their ids: "
                                           r"1 'a', 2 'b' against 1 'b', 2 'a'\)"):
        check_config_against_datasets(config("ids_1_2", "ids_swapped"))


def test_a_turned_image_stated_at_its_stored_size_names_both_causes(tmp_path):
    # the advice to correct width and height led to boxes placed in the wrong frame
    def stored_size(coco, root):
        _turned_jpeg(6, SIZE, SIZE // 2)(coco, root)
        coco["images"][0].update(width=SIZE, height=SIZE // 2)  # the stored size, as a tool ignoring EXIF writes
    message = refusal(tmp_path, stored_size)
    assert f"is stored {SIZE}x{SIZE // 2} pixels, as the JSON states, with an EXIF orientation (6) that turns it to " \
           f"{SIZE // 2}x{SIZE}" in message and "remove it from the file" in message


@pytest.mark.parametrize("case", ["absolute", "windows", "dangling link", "url", "query"])
def test_image_names_no_image_root_can_fix_are_named_for_what_they_are(tmp_path, case):
    def change(coco, root):
        if case == "absolute":  # Label Studio's names
            coco["images"][0]["file_name"] = "/data/upload/1/000.png"
        elif case == "url":  # a hosted export's (IMAGE_ROOT was blamed)
            coco["images"][0]["file_name"] = "http://example.com/data/000.png"
        elif case == "query":  # as copied from a web export
            coco["images"][0]["file_name"] = "000.png?raw=true"
        elif case == "windows":
            (root / "sub").mkdir()
            (root / "000.png").rename(root / "sub" / "000.png")
            coco["images"][0]["file_name"] = "sub\\000.png"
        else:
            (root / "001.png").unlink()
            (root / "001.png").symlink_to(root / "gone.png")
    message = refusal(tmp_path, change)
    expected = {"absolute": "'/data/upload/1/000.png' is an absolute path, which detectron2 reads as it is, whatever "
                            "IMAGE_ROOT",
                "windows": "its name separates folders with '\\' (Windows)",
                "dangling link": "001.png) is a link to ",
                "url": "'http://example.com/data/000.png' is a URL (http://), but detectron2 reads images from files",
                "query": "its name ends in a URL's query ('?raw=true', as a web export writes it)"}[case]
    assert expected in message, message


@pytest.mark.skipif(shutil.which("gs") is not None, reason="Ghostscript is here: PIL reads EPS")
def test_an_eps_image_without_ghostscript_is_not_called_damaged(tmp_path):
    def eps(coco, root):
        Image.open(root / "000.png").convert("RGB").save(root / "000.eps")
        coco["images"][0]["file_name"] = "000.eps"
    message = refusal(tmp_path, eps)
    assert "PIL reads this format with Ghostscript, which this machine lacks" in message and "damaged" not in message


def test_a_test_set_that_is_a_training_sets_file_is_warned_of(tmp_path):
    from gwdet.data.coco_registration import DatasetUse, warn_of_test_sets_trained_on

    spec = write_dataset(tmp_path)
    register_coco_datasets([CocoDataset.parse(f"leak_train={spec}"), CocoDataset.parse(f"leak_test={spec}")])
    with logged_warnings("gwdet.data.coco_registration") as warned:
        warn_of_test_sets_trained_on(DatasetUse(("leak_train",), ("leak_test",), False))
    assert any("DATASETS.TEST 'leak_test' reads the annotation file of DATASETS.TRAIN 'leak_train'" in message
               for message in warned), warned


def test_a_test_set_that_is_a_training_set_or_its_file_is_warned_of_shapes_splits_too(tmp_path):
    # DATASETS.TEST '("shapes_train",)', a shapes split in both lists, or --register-coco of the shapes cache's
    # train.json as the test set: AP of training data, without a word (only --register-coco pairs were compared)
    from detectron2.data import MetadataCatalog

    from gwdet.data import prepare_datasets

    def warned_for(*opts: str) -> list[str]:
        cfg = build_config(str(DEMO_CONFIG), [*TINY_OPTS, *opts])
        with logged_warnings("gwdet.data.coco_registration") as warned:
            prepare_datasets(cfg)
        return warned

    assert warned_for("DATASETS.TEST", "('shapes_train',)") == [
        "DATASETS.TEST 'shapes_train' is also in DATASETS.TRAIN: its results measure the data the model trains on, "
        "not how it does on unseen images. Evaluate on a held-out dataset."]
    assert warned_for("DATASETS.TRAIN", "('shapes_train', 'shapes_val')")[0].startswith(
        "DATASETS.TEST 'shapes_val' is also in DATASETS.TRAIN")
    assert warned_for() == []  # the shapes splits are registered by now
    train_json = MetadataCatalog.get("shapes_train").json_file
    register_coco_datasets([CocoDataset.parse(f"copied_val={train_json}:{os.path.dirname(train_json)}/train")])
    assert warned_for("DATASETS.TEST", "('copied_val',)") == [
        f"DATASETS.TEST 'copied_val' reads the annotation file of DATASETS.TRAIN 'shapes_train' ({train_json}): its "
        "results measure the data the model trains on, not how it does on unseen images. Evaluate on a held-out "
        "annotation file."]


def _second_file_of_the_same_images(tmp_path: Path, name: str, keep: slice = slice(None)) -> str:
    """Another annotation file, ``name``, of the images of ``tmp_path``'s dataset (those of
    ``keep``), the first image without its object."""
    coco = json.loads((tmp_path / "train.json").read_text())
    coco["images"] = coco["images"][keep]
    kept = {image["id"] for image in coco["images"]}
    coco["annotations"] = [annotation for annotation in coco["annotations"] if annotation["image_id"] in kept][1:]
    (tmp_path / name).write_text(json.dumps(coco))
    return f"{tmp_path / name}:{tmp_path / 'img'}"


def test_two_training_files_of_the_same_images_are_refused_and_a_test_set_of_training_images_warned_of(tmp_path):
    # two annotation passes of the same 8 images trained together without a word (an object the second pass lacked
    # trained as background); a test file of 12 of the 60 training images scored as held-out data
    from gwdet.data.coco_registration import DatasetUse, check_datasets_fit, warn_of_test_sets_trained_on

    spec = write_dataset(tmp_path)
    second = _second_file_of_the_same_images(tmp_path, "second.json")
    register_coco_datasets([CocoDataset.parse(f"pass_one={spec}"), CocoDataset.parse(f"pass_two={second}")])
    with pytest.raises(DatasetError, match=r"^DATASETS.TRAIN 'pass_one' and 'pass_two' list the same 4 image file\(s\) "
                                           r"\(.*/img/000.png, .*/img/001.png, ... \(2 more\)\) with the annotations of "
                                           r"two files .* Merge the two files' annotations into one entry per image"):
        check_datasets_fit(DatasetUse(("pass_one", "pass_two"), (), False))
    part = _second_file_of_the_same_images(tmp_path, "part.json", slice(0, 2))
    register_coco_datasets([CocoDataset.parse(f"part_test={part}")])
    with logged_warnings("gwdet.data.coco_registration") as warned:
        warn_of_test_sets_trained_on(DatasetUse(("pass_one",), ("part_test",), False))
    assert [message.split(": its results")[0].split(" (", 1)[0] for message in warned] == [
        "2 of the 2 images of DATASETS.TEST 'part_test' are images"], warned
    assert "are images (the files, links or copies of them) of DATASETS.TRAIN 'pass_one'" in warned[0], warned
    # all of them: the test json's IMAGE_ROOT may be the training images' folder (a test json given the wrong one)
    assert "its IMAGE_ROOT" in warned[0] and "is the training images' folder: give the folder of the test images" \
        in warned[0], warned
    # copies and hard links of training images under other names, in a folder of the test set's own: no word before
    (tmp_path / "held").mkdir()
    coco = json.loads((tmp_path / "part.json").read_text())
    for index, image in enumerate(coco["images"]):
        source = tmp_path / "img" / image["file_name"]
        image["file_name"] = f"val_{index}.png"
        (shutil.copy if index == 0 else os.link)(source, tmp_path / "held" / image["file_name"])
    (tmp_path / "copies.json").write_text(json.dumps(coco))
    register_coco_datasets([CocoDataset.parse(f"copies_test={tmp_path / 'copies.json'}:{tmp_path / 'held'}")])
    with logged_warnings("gwdet.data.coco_registration") as warned:
        warn_of_test_sets_trained_on(DatasetUse(("pass_one",), ("copies_test",), False))
    assert len(warned) == 1 and warned[0].startswith("2 of the 2 images of DATASETS.TEST 'copies_test' are images (the "
                                                     "files, links or copies of them) of DATASETS.TRAIN 'pass_one'")
    assert "its IMAGE_ROOT" not in warned[0]


def test_an_evaluation_of_weights_on_their_own_training_data_is_warned_of(tmp_path):
    # --eval-only on the very annotation file the weights trained on (their checkpoint records it), or on a file
    # of their training images, gave no word
    from gwdet.engine.run import warn_of_training_data_evaluated
    from gwdet.engine.run_environment import annotation_files

    spec = write_dataset(tmp_path)
    part = _second_file_of_the_same_images(tmp_path, "part.json", slice(0, 2))
    register_coco_datasets([CocoDataset.parse(f"trained={spec}"), CocoDataset.parse(f"evaluated={spec}"),
                            CocoDataset.parse(f"evaluated_part={part}")])
    record = {"trained": annotation_files(["trained"])["trained"]}  # as a checkpoint holds it
    with logged_warnings("gwdet.engine.run") as warned:
        warn_of_training_data_evaluated(record, ["evaluated", "evaluated_part"], "w.pth")
        # the record of a checkpoint that names no image folder: the file's contents are compared only
        warn_of_training_data_evaluated({"trained": {**record["trained"], "image_root": None}}, ["evaluated_part"],
                                        "w.pth")
    assert [message.split(" (")[0] for message in warned] == [
        "The test set 'evaluated'", "2 of the 2 images of the test set 'evaluated_part' are images w.pth was trained on"]


def test_a_dataset_registered_by_detectron2s_register_coco_instances_is_checked_as_register_cocos(tmp_path):
    # a test set registered in one's own code (register_coco_instances, then gwdet's run) skipped every check:
    # boxes written as corners scored box AP 0.41 for 5.66, a missing iscrowd stopped pycocotools after inference
    from detectron2.data import DatasetCatalog, MetadataCatalog
    from detectron2.data.datasets import register_coco_instances

    def corners(coco, root):
        for annotation in coco["annotations"]:
            x, y, w, h = annotation["bbox"]
            annotation["bbox"] = [x, y, x + w, y + h]

    json_file, image_root = write_dataset(tmp_path / "own", corners).split(":")
    register_coco_instances("own_corners", {}, json_file, image_root)
    try:
        with pytest.raises(DatasetError, match=r"^dataset 'own_corners': the bboxes of 4 of the 4 annotation\(s\) with "
                                               r"a mask in .* read as \[x1, y1, x2, y2\]"):
            check_config_against_datasets(config("shapes_train", "own_corners"), trains=False, evaluates=True)
        # detectron2's builtin datasets are not read (their files need not be here): the class count is checked only
        with pytest.raises(DatasetError, match=r"^MODEL.ROI_HEADS.NUM_CLASSES is 2, but DATASETS.TEST 'coco_2017_val' "
                                               r"has 80 categories"):
            check_config_against_datasets(config("shapes_train", "coco_2017_val"), trains=False, evaluates=True)
    finally:
        DatasetCatalog.remove("own_corners")
        MetadataCatalog.remove("own_corners")


def test_an_evaluation_from_python_checks_the_models_classes_and_the_class_count(tmp_path):
    # Trainer.test(cfg, model) from Python scored a 3-class model on the 4 shapes categories, and a model on a test
    # json whose category ids swap two of its classes, without a word (the train tool refuses both)
    from gwdet.checkpoint.resilient import CLASSES_ATTRIBUTE, ResilientCheckpointer
    from gwdet.engine.trainer import Trainer

    registered("classes_ab", tmp_path)
    cfg = config("shapes_train", "classes_ab")
    model = Trainer.build_model(cfg)
    ResilientCheckpointer(model, str(tmp_path), classes=["b", "a"]).save("trained")
    loaded = Trainer.build_model(cfg)
    ResilientCheckpointer(loaded).load(str(tmp_path / "trained.pth"))
    assert getattr(loaded, CLASSES_ATTRIBUTE) == ["b", "a"]  # recorded on the model it loaded into
    with pytest.raises(GwdetValueError, match=r"^The model was trained on the classes \['b', 'a'\] \(the order of its "
                                              r"outputs\), but dataset 'classes_ab' has them in the order \['a', 'b'\]"):
        Trainer.test(cfg, loaded)
    other = cfg.clone()
    other.defrost()
    other.MODEL.ROI_HEADS.NUM_CLASSES = 3
    with pytest.raises(DatasetError, match=r"^MODEL.ROI_HEADS.NUM_CLASSES is 3, but DATASETS.TEST 'classes_ab'"):
        Trainer.test(other, loaded)
    # registered by one's own code: detectron2 sets thing_classes only when the data is loaded, after the check
    from detectron2.data import DatasetCatalog, MetadataCatalog
    from detectron2.data.datasets import register_coco_instances

    json_file, image_root = write_dataset(tmp_path / "own").split(":")
    register_coco_instances("own_classes_ab", {}, json_file, image_root)
    try:
        with pytest.raises(GwdetValueError, match=r"but dataset 'own_classes_ab' has them in the order \['a', 'b'\]"):
            Trainer.test(config("shapes_train", "own_classes_ab"), loaded)
    finally:
        DatasetCatalog.remove("own_classes_ab")
        MetadataCatalog.remove("own_classes_ab")
    torch.save({"model": loaded.state_dict()}, tmp_path / "plain.pth")  # no record: the attribute goes
    ResilientCheckpointer(loaded).load(str(tmp_path / "plain.pth"))
    assert not hasattr(loaded, CLASSES_ATTRIBUTE)


def test_an_annotation_file_replaced_after_registration_is_not_read_unchecked(tmp_path):
    # a test json replaced while the run trained (a converter run again, annotation ids from 0) was read unchecked
    # by the evaluation after training: box AP 13.97 for 15.56, and results.json recorded the new file
    from detectron2.data import DatasetCatalog

    spec = write_dataset(tmp_path)
    register_coco_datasets([CocoDataset.parse(f"swapped={spec}")])
    assert len(DatasetCatalog.get("swapped")) == 4
    coco = json.loads((tmp_path / "train.json").read_text())
    for annotation in coco["annotations"]:
        annotation["id"] -= 1
    (tmp_path / "train.json").write_text(json.dumps(coco))
    with pytest.raises(DatasetError, match=rf"^dataset 'swapped': {tmp_path / 'train.json'} changed since it was checked "
                                           r"when the dataset was registered \(at the start of the run\)"):
        DatasetCatalog.get("swapped")
    with pytest.raises(DatasetError, match=r"has an annotation .* id 0"):  # registered again: checked again
        register_coco_datasets([CocoDataset.parse(f"swapped={spec}")])


def test_a_dataset_names_the_same_files_after_a_chdir_and_a_moved_file_is_not_called_changed(tmp_path, monkeypatch):
    # CocoDataset built directly kept relative paths: after os.chdir the same file was "changed since it was
    # checked"; a JSON moved away after registration was called "changed" too
    from detectron2.data import DatasetCatalog

    json_file, image_root = write_dataset(tmp_path).split(":")
    monkeypatch.chdir(tmp_path)
    dataset = CocoDataset("relative", os.path.relpath(json_file), os.path.relpath(image_root))
    assert (dataset.json_file, dataset.image_root) == (json_file, image_root)
    register_coco_datasets([dataset])
    monkeypatch.chdir(tmp_path / "img")
    assert len(DatasetCatalog.get("relative")) == 4
    os.rename(json_file, tmp_path / "moved.json")
    with pytest.raises(DatasetError, match=rf"^dataset 'relative': {json_file} is no longer there \(moved or deleted"):
        DatasetCatalog.get("relative")


def test_register_coco_datasets_given_the_flags_string_names_what_it_takes(tmp_path):
    # AttributeError: 'str' object has no attribute 'name'
    spec = f"flag={write_dataset(tmp_path)}"
    with pytest.raises(TypeError, match=rf"^register_coco_datasets takes a list of gwdet.data.CocoDataset, not "
                                        rf"'{re.escape(spec)}' \(str\): e.g. register_coco_datasets\(\[CocoDataset.parse"):
        register_coco_datasets(spec)


def test_the_environment_variable_naming_a_dataset_twice_is_refused(tmp_path, monkeypatch):
    from gwdet.data.coco_registration import ENVIRONMENT_VARIABLE, environment_datasets

    spec = write_dataset(tmp_path)
    monkeypatch.setenv(ENVIRONMENT_VARIABLE, json.dumps([f"m={spec}", f"m={spec}"]))
    with pytest.raises(DatasetError, match=rf"^{ENVIRONMENT_VARIABLE}: dataset 'm' is given twice: give each NAME once"):
        environment_datasets()


def test_a_test_set_without_annotations_is_refused_before_training(tmp_path):
    registered("sweep_train", tmp_path / "train")
    registered("sweep_empty", tmp_path / "empty", lambda coco, root: coco.update(annotations=[]))
    with pytest.raises(DatasetError) as refused:
        check_config_against_datasets(config("sweep_train", "sweep_empty"))
    message = str(refused.value)
    assert message.startswith("DATASETS.TEST 'sweep_empty' (") and "has no annotations to evaluate against: COCO " \
        "evaluation would report every AP of it as nan. Give a test set with annotations" in message, message
    registered("sweep_crowd_test", tmp_path / "crowd",
               lambda coco, root: [annotation.update(iscrowd=1) for annotation in coco["annotations"]])
    with pytest.raises(DatasetError, match=r"has no annotations to evaluate against \(its 4 annotation\(s\) are all "
                                           r"crowd regions, iscrowd 1, which COCO evaluation ignores\)"):
        check_config_against_datasets(config("sweep_train", "sweep_crowd_test"))
    check_config_against_datasets(config("sweep_train", "sweep_train"))


def test_only_the_datasets_a_request_reads_are_checked(tmp_path, capsys):
    """--eval-only reads no training set, the export (without --run-eval) and analyze tools evaluate
    nothing: the checks of what they do not read do not apply (before: --eval-only of a COCO config
    needed coco_2017_train on disk; the tools refused unlabelled test images for want of annotations)."""
    from gwdet.export.analyze_model import main as analyze

    registered("sweep_unlabelled", tmp_path / "unlabelled", lambda coco, root: coco.update(annotations=[]))
    registered("sweep_no_masks", tmp_path / "no_masks",
               lambda coco, root: [annotation.pop("segmentation") for annotation in coco["annotations"]])
    unlabelled = config("sweep_no_masks", "sweep_unlabelled")
    check_config_against_datasets(unlabelled, trains=False, evaluates=False)
    with pytest.raises(DatasetError, match="'sweep_no_masks' .* have no 'segmentation' mask"):
        check_config_against_datasets(unlabelled, trains=True, evaluates=False)
    with pytest.raises(DatasetError, match="'sweep_unlabelled' .* has no annotations to evaluate against"):
        check_config_against_datasets(unlabelled, trains=False, evaluates=True)
    assert analyze(["--config-file", str(DEMO_CONFIG), "--tasks", "parameter", "--register-coco",
                    f"tool_unlabelled={write_dataset(tmp_path / 'tool', lambda coco, root: coco.update(annotations=[]))}",
                    *TINY_OPTS, "DATASETS.TEST", "('tool_unlabelled',)"]) == 0
    assert "Parameters:" in capsys.readouterr().out


def test_a_test_set_without_masks_is_refused_before_training_when_masks_are_evaluated(tmp_path):
    registered("sweep_masks", tmp_path / "train")
    registered("sweep_no_masks", tmp_path / "boxes",
               lambda coco, root: [annotation.pop("segmentation") for annotation in coco["annotations"]])
    with pytest.raises(DatasetError) as refused:
        check_config_against_datasets(config("sweep_masks", "sweep_no_masks"))
    message = str(refused.value)
    assert message.startswith("MODEL.MASK_ON is True, but 4 of the 4 annotations of DATASETS.TEST 'sweep_no_masks' (")
    assert "KeyError: 'segmentation'" in message and "or evaluate boxes only with MODEL.MASK_ON False" in message
    check_config_against_datasets(config("sweep_masks", "sweep_no_masks", "MODEL.MASK_ON", "False"))


def test_a_test_set_without_iscrowd_is_refused_before_training_but_trained_on(tmp_path):
    registered("sweep_no_crowd_key", tmp_path / "plain",
               lambda coco, root: [annotation.pop("iscrowd") for annotation in coco["annotations"]])
    with pytest.raises(DatasetError, match=r"4 of the 4 annotations of DATASETS.TEST 'sweep_no_crowd_key' .* have no "
                                           r"'iscrowd'.*KeyError: 'iscrowd' after training. Add \"iscrowd\": 0"):
        check_config_against_datasets(config("sweep_no_crowd_key", "sweep_no_crowd_key"))
    registered("sweep_test_ok", tmp_path / "test")
    check_config_against_datasets(config("sweep_no_crowd_key", "sweep_test_ok"))  # detectron2 trains on them


# ---- every annotation a crowd region (MISLEADING 8) ---------------------------------------------

def test_a_training_set_of_crowd_regions_only_is_named_as_such(tmp_path):
    registered("sweep_all_crowd", tmp_path,
               lambda coco, root: [annotation.update(iscrowd=1) for annotation in coco["annotations"]])
    with pytest.raises(GwdetValueError) as refused:
        with named_empty_training_set("sweep_all_crowd", "DATALOADER.FILTER_EMPTY_ANNOTATIONS False"):
            raise AssertionError("No valid data found in sweep_all_crowd.")  # what detectron2's loader raises
    assert str(refused.value) == (
        "None of the images of sweep_all_crowd has an annotation to train on: all 4 of the annotations are crowd "
        "regions (iscrowd 1), which detectron2 does not train on. Set iscrowd 0 on the annotations of single "
        "objects (or set DATALOADER.FILTER_EMPTY_ANNOTATIONS False to train on empty images).")
    with pytest.raises(GwdetValueError, match="check that the json's 'annotations' list is there"):
        with named_empty_training_set("dataloader.train.dataset", "dataloader.train.dataset.filter_empty=False"):
            raise AssertionError("No valid data found.")


# ---- prediction drawings: names, caption bands (SILENT 7; RAW 7) ----------------------------------

def test_drawings_are_named_by_the_image_path_below_the_shared_folder():
    assert drawing_names(["/r/img/a/x.png", "/r/img/b/x.png"]) == ["a__x.png", "b__x.png"]
    assert drawing_names(["/r/img/000.png", "/r/img/001.jpg"]) == ["000.png", "001.png"], "one folder: the names"
    assert drawing_names(["/r/x.jpg", "/r/x.png", "/r/X.png"]) == ["x.png", "x-2.png", "X-3.png"]
    assert drawing_names([]) == []


class _NoDetections(torch.nn.Module):
    """A model that detects nothing: enough to draw."""

    def forward(self, inputs: list[dict]) -> list[dict]:
        return [{"instances": Instances((item["height"], item["width"]), scores=torch.zeros(0),
                                        pred_classes=torch.zeros(0, dtype=torch.long), pred_boxes=Boxes(torch.zeros(0, 4)))}
                for item in inputs]


def test_drawings_of_images_of_one_name_in_two_folders_are_two_files(tmp_path):
    registered("sweep_same_name", tmp_path / "data", folders=("s0", "s1", "s2", "s3"))
    out = tmp_path / "vis"
    paths = save_prediction_pngs(config("sweep_same_name", "sweep_same_name"), _NoDetections(), "sweep_same_name", 4,
                                 str(out))
    assert sorted(path.name for path in out.iterdir()) == ["s0__x.png", "s1__x.png", "s2__x.png", "s3__x.png"]
    assert sorted(paths) == sorted(str(path) for path in out.iterdir()), "as many paths as files"


@pytest.mark.parametrize("height", [384, 870, 1000, 1080, 1500, 2160])
def test_both_halves_of_a_drawing_have_one_caption_band_at_any_height(height):
    truth = np.full((height, 96, 3), 200, np.uint8)
    predicted = np.full((height, 96, 3), 100, np.uint8)
    drawing = side_by_side(truth, predicted, 0.5)
    band = drawing.shape[0] - height
    assert np.array_equal(drawing[band:, :96], truth) and np.array_equal(drawing[band:, 96:], predicted)
    assert (drawing[:band] == 255).mean() > 0.5 and np.array_equal(drawing[:band, :96][:band - 1],
                                                                    captioned(truth, TRUTH_CAPTION)[:band - 1])


def test_a_shorter_drawing_is_padded_below():
    drawing = side_by_side(np.zeros((100, 50, 3), np.uint8), np.zeros((90, 50, 3), np.uint8), 0.5)
    assert drawing.shape[1] == 100 and (drawing[-10:, 50:] == 255).all() and (drawing[-10:, :50] == 0).all()


def _one_image_3000_by_20(coco: dict, root: Path) -> None:
    """The last image made 3000x20 pixels (its box and polygon kept inside it)."""
    Image.fromarray(np.full((20, 3000, 3), 30, np.uint8)).save(root / "003.png")
    coco["images"][3].update(width=3000, height=20)
    coco["annotations"][3].update(bbox=[8, 2, 24, 10], area=240, segmentation=[[8, 2, 32, 2, 32, 12, 8, 12]])


def test_an_image_the_test_resize_leaves_without_a_pixel_side_is_refused_before_training(tmp_path):
    # it trained, then PIL stopped the evaluation with "height and width must be > 0": no results
    registered("plain_r", tmp_path / "plain")
    registered("wide_r", tmp_path / "wide", _one_image_3000_by_20)
    with pytest.raises(DatasetError, match=r"dataset 'wide_r': image '003.png' of .*train.json \(3000x20 pixels\) "
                                           r"would be resized to 64x0 by INPUT.MIN_SIZE_TEST 64 and INPUT.MAX_SIZE_TEST 64: "
                                           r"one side would keep no pixel.*Raise INPUT.MAX_SIZE_TEST"):
        check_config_against_datasets(config("plain_r", "wide_r"))
    check_config_against_datasets(config("plain_r", "wide_r", "INPUT.MAX_SIZE_TEST", "4000"))


def test_a_category_id_of_true_is_no_category_one(tmp_path):
    # True == 1 to Python: the annotation was trained as category 1 without a word
    message = refusal(tmp_path, lambda coco, root: coco["annotations"][2].update(category_id=True))
    assert "annotation id 3 of " in message and message.endswith(
        "has category_id True, a boolean (JSON true or false), not an integer id: give the integer id of the "
        "annotation's category, one of the file's categories (ids 1, 2).")


# "category_id": "1" was refused as "has category_id '1', which is not among its categories (ids 1, 2): add the
# category to 'categories' ...", and 1.0 was trained as category 1 without a word
@pytest.mark.parametrize("category_id, words", [
    ("1", "'1', a string, not an integer id: write it without quotes, \"category_id\": 1 (category 'a')."),
    (1.0, "1.0, a number with a decimal point, not an integer id: write it without a decimal point, "
          "\"category_id\": 1 (category 'a')."),
    ("b", "'b', a string, not an integer id: 'b' is the name of category 2, and an annotation gives its category "
          "by id: \"category_id\": 2."),
    ("7", "'7', a string, not an integer id: give the integer id of the annotation's category, one of the file's "
          "categories (ids 1, 2)."),
    (None, "null, not an integer id: give the integer id of the annotation's category, one of the file's "
           "categories (ids 1, 2).")])
def test_a_category_id_that_is_no_integer_is_named_as_such(tmp_path, category_id, words):
    message = refusal(tmp_path, lambda coco, root: coco["annotations"][2].update(category_id=category_id))
    assert message.endswith(f"annotation id 3 of {tmp_path / 'train.json'} has category_id {words}")


# a category's "id": "1" was refused as "needs an integer 'id'" without the fix, and "id": true was taken as id 1
@pytest.mark.parametrize("category_id, words", [
    ("1", "'1', a string, not an integer id: write it as the number 1, \"id\": 1, and give"),
    (True, "True, a boolean (JSON true or false), not an integer id: write it as an integer, e.g. \"id\": 1, and "
           "give")])
def test_a_category_whose_id_is_no_integer_is_named_as_such(tmp_path, category_id, words):
    message = refusal(tmp_path, lambda coco, root: coco["categories"][0].update(id=category_id))
    assert f"category #0 of {tmp_path / 'train.json'} ({{'id': {category_id!r}, 'name': 'a'}}) has id {words}" in message
    assert message.endswith("its annotations that number as their category_id.")


# ---- the LazyConfig path: the same dataset checks as a yacs config's ------------------------------

SHAPES_CATEGORIES = [{"id": index + 1, "name": name} for index, name in enumerate(("circle", "square", "triangle",
                                                                                   "star"))]


def _lazy_refusal(*overrides: str, edit: Callable = lambda cfg: None) -> str:
    from gwdet.engine.lazy_checks import check_datasets
    from gwdet.model_zoo.lazy_loading import load_lazy_config

    lazy = Path(__file__).resolve().parents[1] / "configs" / "LazyConfig" / "mask_rcnn_R_50_FPN_gw_shapes.py"
    cfg = load_lazy_config(str(lazy), ["dataloader.shapes.image_size=64", *overrides])
    edit(cfg)
    with pytest.raises((DatasetError, GwdetValueError)) as refused:
        check_datasets(cfg)
    return str(refused.value)


def _as_shapes(change: Callable[[dict, Path], None]) -> Callable[[dict, Path], None]:
    """``change`` of a dataset that has the shapes dataset's categories (trained on with them)."""
    def changed(coco: dict, root: Path) -> None:
        coco["categories"] = SHAPES_CATEGORIES
        change(coco, root)
    return changed


@pytest.mark.parametrize("change, message", [
    # before: every AP nan, and a warning that the model detected nothing
    (lambda coco, root: coco["annotations"].clear(),
     "dataloader.evaluator.dataset_name 'lazy_m' (.*) has no annotations to evaluate against"),
    # before: KeyError: 'iscrowd' after inference
    (lambda coco, root: [annotation.pop("iscrowd") for annotation in coco["annotations"]],
     "4 of the 4 annotations of dataloader.evaluator.dataset_name 'lazy_m' .* have no 'iscrowd'"),
    # a training set's missing area is read (above); a test set's stopped COCO evaluation with KeyError: 'area'
    (lambda coco, root: coco["annotations"][1].pop("area"),
     "1 of the 4 annotations of dataloader.evaluator.dataset_name 'lazy_m' .* have no 'area': detectron2 trains without "
     "it, but COCO evaluation reads every test annotation's area"),
    # before: KeyError: 'segmentation' after inference
    (lambda coco, root: coco["annotations"][0].pop("segmentation"),
     r"the model has a mask head \(model.roi_heads.mask_head\), but 1 of the 4 annotations of "
     "dataloader.evaluator.dataset_name 'lazy_m'"),
])
def test_a_lazyconfig_test_set_of_your_own_is_checked_as_a_yacs_one(tmp_path, change, message):
    registered("lazy_m", tmp_path, _as_shapes(change))
    found = _lazy_refusal("dataloader.test.dataset.names=lazy_m", "dataloader.evaluator.dataset_name=lazy_m")
    assert re.search(message, found), found


def test_a_lazyconfig_trained_on_rle_masks_read_as_polygons_is_refused_before_the_run(tmp_path):
    # before: a run folder, the model built, then "detectron2 could not train the first iteration
    # with this config: ValueError: Failed to use mask_format=='polygon'" with no setting named
    from pycocotools import mask as mask_util

    def rle(coco, root):
        for annotation in coco["annotations"]:
            x, y, w, h = annotation["bbox"]
            pixels = np.zeros((SIZE, SIZE), np.uint8, order="F")
            pixels[y:y + h, x:x + w] = 1
            annotation["segmentation"] = {"size": [SIZE, SIZE],
                                          "counts": mask_util.encode(pixels)["counts"].decode("ascii")}

    registered("lazy_rle", tmp_path, _as_shapes(rle))
    found = _lazy_refusal("dataloader.train.dataset.names=lazy_rle", "dataloader.train.mapper.instance_mask_format=polygon")
    assert ("4 annotations of dataloader.train.dataset.names 'lazy_rle' (" in found
            and "have RLE masks, which detectron2 reads only as bitmasks, and dataloader.train.mapper.instance_mask_format "
                "is 'polygon': add dataloader.train.mapper.instance_mask_format=bitmask to the command line" in found), found
    # detectron2's COCO LazyConfigs leave the setting out: DatasetMapper's default, polygon
    found = _lazy_refusal("dataloader.train.dataset.names=lazy_rle",
                          edit=lambda cfg: cfg.dataloader.train.mapper.pop("instance_mask_format"))
    assert "dataloader.train.mapper.instance_mask_format is 'polygon'" in found, found


def test_a_lazyconfig_request_that_does_not_evaluate_needs_no_annotations(tmp_path):
    from gwdet.engine.lazy_checks import check_datasets
    from gwdet.model_zoo.lazy_loading import load_lazy_config

    registered("lazy_unlabelled", tmp_path, _as_shapes(lambda coco, root: coco["annotations"].clear()))
    lazy = Path(__file__).resolve().parents[1] / "configs" / "LazyConfig" / "mask_rcnn_R_50_FPN_gw_shapes.py"
    cfg = load_lazy_config(str(lazy), ["dataloader.shapes.image_size=64", "dataloader.test.dataset.names=lazy_unlabelled",
                                       "dataloader.evaluator.dataset_name=lazy_unlabelled"])
    check_datasets(cfg, trains=True, evaluates=False)
    with pytest.raises(DatasetError, match="has no annotations to evaluate against"):
        check_datasets(cfg, trains=False, evaluates=True)


def test_a_lazyconfig_trained_and_tested_on_datasets_of_other_categories_is_refused(tmp_path):
    """Before: the results named the model's star class after the test set's pentagon."""
    registered("lazy_renamed", tmp_path, _as_shapes(lambda coco, root: coco["categories"][3].update(name="pentagon")))
    message = _lazy_refusal("dataloader.test.dataset.names=lazy_renamed",
                            "dataloader.evaluator.dataset_name=lazy_renamed")
    assert message.startswith("dataloader.evaluator.dataset_name 'lazy_renamed' ("), message
    assert ("and dataloader.train.dataset.names 'shapes_train' have different categories (only 'lazy_renamed' has "
            "'pentagon'; only 'shapes_train' has 'star')") in message, message


def test_a_lazyconfig_training_set_named_twice_is_refused():
    def twice(cfg):
        cfg.dataloader.train.dataset.names = ["shapes_train", "shapes_train"]

    assert _lazy_refusal(edit=twice).startswith(
        "dataloader.train.dataset.names=['shapes_train', 'shapes_train'] names 'shapes_train' more than once")


def test_the_studys_rerun_commands_register_the_datasets_they_read(tmp_path, capsys, monkeypatch):
    # printed without --register-coco, each was refused as printed: "Dataset 't' is not registered"
    from gwdet.data.coco_registration import ENVIRONMENT_VARIABLE
    from gwdet_lab.study import cli

    monkeypatch.delenv(ENVIRONMENT_VARIABLE, raising=False)
    spec = write_dataset(tmp_path)
    assert cli.main(["--study", "paper", "--seeds", "0", "--list", "--out", str(tmp_path / "study"),
                     "--register-coco", f"study_t={spec}", "--opts", "DATASETS.TRAIN", "('study_t',)",
                     "DATASETS.TEST", "('study_t',)", "MODEL.ROI_HEADS.NUM_CLASSES", "2"]) == 0
    assert ENVIRONMENT_VARIABLE not in os.environ  # set for the study's processes only, not left to its caller
    commands = [line for line in capsys.readouterr().out.splitlines() if "tools/train_net.py" in line]
    assert commands and all(f"--register-coco 'study_t={spec}'" in line or f"--register-coco study_t={spec}" in line
                            for line in commands), commands


def test_a_keypoint_head_on_data_without_keypoints_is_named_as_such():
    # blamed on the json's annotations list, with advice (FILTER_EMPTY_ANNOTATIONS False) that changed nothing
    from gwdet.data import prepare_datasets
    from gwdet.engine.trainer import Trainer
    from gwdet.model_zoo import build_config

    from conftest import DEMO_CONFIG, TINY_OPTS

    cfg = build_config(str(DEMO_CONFIG), TINY_OPTS + ["MODEL.KEYPOINT_ON", "True"])
    prepare_datasets(cfg)
    with pytest.raises(GwdetValueError, match=r"None of the images of shapes_train has the keypoints MODEL.KEYPOINT_ON "
                                              r"True trains on .*MIN_KEYPOINTS_PER_IMAGE"):
        Trainer.build_train_loader(cfg)


def test_a_dataset_without_a_json_file_is_converted_anew_for_each_evaluation(tmp_path):
    # a dataset registered by a function (DatasetCatalog.register) whose annotations changed: after --resume the
    # evaluation scored against detectron2's cached <name>_coco_format.json of the first evaluation (AP 0.09 for 0.01)
    from detectron2.data import DatasetCatalog, MetadataCatalog
    from detectron2.data.datasets import load_coco_json

    from gwdet.engine.trainer import Trainer

    json_file, image_root = write_dataset(tmp_path / "data").split(":")
    kept = {"count": 4}
    DatasetCatalog.register("by_function", lambda: load_coco_json(json_file, image_root, "by_function")[:kept["count"]])
    MetadataCatalog.get("by_function").set(thing_classes=["a", "b"], evaluator_type="coco")
    try:
        cfg = config("shapes_train", "by_function", "OUTPUT_DIR", str(tmp_path / "run"))
        folder = str(tmp_path / "run" / "inference")
        assert len(Trainer.build_evaluator(cfg, "by_function", folder)._coco_api.getImgIds()) == 4
        kept["count"] = 2
        MetadataCatalog.remove("by_function")  # a new process (the resumed run's): no json file in the metadata
        MetadataCatalog.get("by_function").set(thing_classes=["a", "b"], evaluator_type="coco")
        assert len(Trainer.build_evaluator(cfg, "by_function", folder)._coco_api.getImgIds()) == 2
    finally:
        DatasetCatalog.remove("by_function")
        MetadataCatalog.remove("by_function")


def test_the_export_and_analyze_tools_check_the_class_order_only_where_they_evaluate(tmp_path):
    # analyze_model.py, and the export without --run-eval, refused a test set of the classes in another order, saying
    # "each prediction would be scored as another class": neither scores anything
    from gwdet.checkpoint.resilient import ResilientCheckpointer
    from gwdet.engine.trainer import Trainer, YacsRun

    registered("order_ab", tmp_path)
    cfg = config("shapes_train", "order_ab")
    ResilientCheckpointer(Trainer.build_model(cfg), str(tmp_path), classes=["b", "a"]).save("trained")
    weighted = config("shapes_train", "order_ab", "MODEL.WEIGHTS", str(tmp_path / "trained.pth"))
    YacsRun(weighted).build_trained_model()
    with pytest.raises(GwdetValueError, match=r"each prediction would be scored as another class"):
        YacsRun(weighted).build_trained_model(evaluates=True)


@pytest.mark.parametrize("change, message", [
    (lambda coco, root: coco["annotations"][0].update(iscrowd="0"), "have an 'iscrowd' that is neither 0 nor 1"),
    (lambda coco, root: coco["images"][1].update(file_name=coco["images"][0]["file_name"]),
     "are given to more than one image"),
])
def test_gwdets_trainer_checks_the_training_sets_ones_own_code_registered(tmp_path, change, message):
    # register_coco_instances + Trainer(cfg).train(): a string iscrowd trained objects as background, two images of
    # one file trained one's boxes on the other's pixels, without a word (the tool refused both files)
    from detectron2.data.datasets import register_coco_instances

    from gwdet.engine.trainer import Trainer

    json_file, image_root = write_dataset(tmp_path, change).split(":")
    name = f"own_code_{tmp_path.name}"
    register_coco_instances(name, {}, json_file, image_root)
    with pytest.raises(DatasetError, match=message):
        Trainer(config(name, name, "OUTPUT_DIR", str(tmp_path / "run")))
    assert not (tmp_path / "run").exists()


def test_a_resume_on_training_images_changed_under_their_names_is_refused_and_an_evaluation_finds_moved_ones(
        tmp_path, monkeypatch):
    # the images re-exported (inverted) under the same names: --resume went on with other pixels without a word
    # (a changed annotation file is refused); an --eval-only on some training images, after their folder moved, no
    # longer warned (the checkpoint named them by the old path only)
    from conftest import tiny_run_args
    from gwdet.engine.run import main

    json_file, image_root = write_dataset(tmp_path / "data").split(":")
    own = ["--register-coco", f"own_tr={json_file}:{image_root}", "DATASETS.TRAIN", "('own_tr',)", "DATASETS.TEST",
           "()", "MODEL.ROI_HEADS.NUM_CLASSES", "2", "INPUT.MASK_FORMAT", "polygon"]
    main(tiny_run_args(tmp_path / "run", *own))
    moved = tmp_path / "moved"
    shutil.copytree(tmp_path / "data", moved)
    coco = json.loads((moved / "train.json").read_text())
    coco["images"], coco["annotations"] = coco["images"][:2], coco["annotations"][:2]
    (moved / "part.json").write_text(json.dumps(coco))
    shutil.rmtree(tmp_path / "data")
    with logged_warnings("gwdet.engine.run") as warned:
        main(tiny_run_args(tmp_path / "eval", "--eval-only", "--register-coco", f"own_te={moved / 'part.json'}:"
                           f"{moved / 'img'}", "DATASETS.TEST", "('own_te',)", "MODEL.ROI_HEADS.NUM_CLASSES", "2",
                           "INPUT.MASK_FORMAT", "polygon", "MODEL.WEIGHTS", str(tmp_path / "run" / "model_final.pth")))
    assert any(message.startswith("2 of the 2 images of the test set 'own_te' are images") for message in warned), warned
    shutil.copytree(moved, tmp_path / "data")
    for image in (tmp_path / "data" / "img").iterdir():
        Image.fromarray(255 - np.asarray(Image.open(image))).save(image)
    from detectron2.data import DatasetCatalog, MetadataCatalog

    from gwdet.data import coco_registration

    monkeypatch.setattr(coco_registration, "_REGISTERED", {})  # as a new process registers them
    DatasetCatalog.remove("own_tr")
    MetadataCatalog.remove("own_tr")
    with pytest.raises(ValueError, match=r"--resume: the run in .* trained on 'own_tr', whose annotation file is as it "
                                         r"was, but 4 of its image files under .* now hold other contents"):
        main(tiny_run_args(tmp_path / "run", "--resume", *own, "SOLVER.MAX_ITER", "3"))


def _frames(coco: dict, root: Path) -> None:
    """Image 2 an animated GIF and image 3 a two-page TIFF, each a black first frame before the picture
    annotated; image 4 a TIFF whose second page is a reduced-resolution copy of the first."""
    black = Image.new("RGB", (SIZE, SIZE))
    for index, suffix in ((1, "gif"), (2, "tif")):
        picture = Image.open(root / coco["images"][index]["file_name"]).convert("RGB")
        black.save(root / f"{index:03d}.{suffix}", save_all=True, append_images=[picture])
        coco["images"][index]["file_name"] = f"{index:03d}.{suffix}"
    picture = Image.open(root / "003.png").convert("RGB")
    thumbnail = picture.resize((SIZE // 2, SIZE // 2))
    thumbnail.encoderinfo = {"tiffinfo": {254: 1}}  # NewSubfileType: a reduced-resolution copy
    picture.save(root / "003.tif", save_all=True, append_images=[thumbnail])
    coco["images"][3]["file_name"] = "003.tif"


# before: both were registered, trained and evaluated on their black first frame without a word
def test_images_of_several_frames_or_pages_are_refused_naming_each_file(tmp_path):
    message = refusal(tmp_path, _frames)
    assert "2 of the 4 images" in message, message
    assert ("image id 2 (001.gif) holds 2 frames (an animated GIF), of which detectron2's read_image reads only the "
            "first, without a word: save the frame meant as a single-frame PNG or JPEG (PIL: im.seek(N), N the "
            "frame's index from 0, then im.convert('RGB').save(...))") in message
    assert ("image id 3 (002.tif) holds 2 pages (a multi-page TIFF), of which detectron2's read_image reads only the "
            "first, without a word: save the page meant") in message
    assert "003.tif" not in message  # its second page is a thumbnail of its first


def test_a_camera_jpeg_holding_previews_passes(tmp_path):
    def previews(coco: dict, root: Path) -> None:  # an MPO: the picture, then a preview, as phones write them
        picture = Image.open(root / "001.png").convert("RGB")
        picture.save(root / "001.jpg", format="MPO", save_all=True, append_images=[picture.resize((16, 16))])
        coco["images"][1]["file_name"] = "001.jpg"

    assert CocoDataset.parse(f"m={write_dataset(tmp_path, previews)}").inspected().contents is not None


# before: a gzip-compressed annotation file was "not UTF-8 text (byte 1 cannot be decoded): give the COCO instances JSON file"
def test_a_gzip_compressed_annotation_file_is_named_with_how_to_decompress_it(tmp_path):
    import gzip

    json_file, root = write_dataset(tmp_path).rsplit(":", 1)
    packed = tmp_path / "train.json.gz"
    packed.write_bytes(gzip.compress(Path(json_file).read_bytes()))
    with pytest.raises(DatasetError, match=rf"^dataset 'm': {re.escape(str(packed))} is gzip-compressed \(its name ends "
                                           r"in \.gz\), and detectron2 reads plain JSON: decompress it \(gunzip -k "
                                           rf"{re.escape(str(packed))}\) and give {re.escape(json_file)}\.$"):
        CocoDataset.parse(f"m={packed}:{root}").inspected()
    inside = tmp_path / "inside.json"
    inside.write_bytes(packed.read_bytes())
    plain = tmp_path / "inside.plain.json"
    with pytest.raises(DatasetError, match=rf"is gzip-compressed \(though its name does not end in \.gz\), and detectron2 "
                                           rf"reads plain JSON: decompress it \(gunzip -c {re.escape(str(inside))} > "
                                           rf"{re.escape(str(plain))}\) and give {re.escape(str(plain))}\.$"):
        CocoDataset.parse(f"m={inside}:{root}").inspected()


# ---- areas that disagree with their objects, a folder as the first image, a BOM, shapes read as polygons

# before: areas of 1% of the masks were accepted, and COCO evaluation filed every object as small
def test_areas_far_below_their_masks_are_refused_naming_the_annotations(tmp_path):
    def shrunk(coco, root):
        for annotation in coco["annotations"]:
            annotation["area"] *= 0.01

    message = refusal(tmp_path, shrunk)
    assert message.startswith("dataset 'm': 4 of the 4 annotation(s) of ") and (
        "have an 'area' far from their object's pixel count (more than 4 times off their mask's, or 10 times below "
        "their box's without a mask): annotation id 1 of image 1 (000.png): area 4.8, its mask covers 480 pixels") \
        in message, message
    assert message.endswith("Set each area to the object's mask area in pixels (pycocotools.mask.area of its mask), "
                            "or its box area without a mask."), message


# before: one annotation's area (of an object without a mask) a tenth of its box passed without a word
def test_one_area_far_from_its_object_is_named_in_a_warning(tmp_path, registration_warnings):
    def one(coco, root):
        coco["annotations"][2].pop("segmentation")
        coco["annotations"][2]["area"] = 30

    registered("m_one_area", tmp_path, one)  # logged at registration (in the run's log): row of the EXIF warning
    assert len(registration_warnings) == 1 and ("1 of the 4 annotation(s) of " in registration_warnings[0]) and (
        "annotation id 3 of image 3 (002.png): area 30, its bbox covers 24 x 20 = 480 pixels (no mask)"
        in registration_warnings[0]), registration_warnings


def test_areas_of_masks_as_coco_counts_them_pass_without_a_warning(tmp_path, registration_warnings):
    def circle(coco, root):  # a polygon's area as COCO counts it, a tiny object's off by a few pixels
        coco["annotations"][0].update(segmentation=[[20, 20, 30, 20, 30, 30]], bbox=[20, 20, 10, 10], area=50)
        coco["annotations"][1].update(segmentation=[[8, 10, 9, 10, 9, 11]], bbox=[8, 10, 1, 1], area=0.5)

    registered("m_circle", tmp_path, circle)
    assert registration_warnings == []


# before: "the first image of ..., '000.png', is not in the image folder ...: IMAGE_ROOT must be the folder ..."
def test_a_first_image_that_is_a_folder_is_named_as_a_folder(tmp_path):
    def folder(coco, root):
        (root / "000.png").unlink()
        (root / "000.png").mkdir()

    message = refusal(tmp_path, folder)
    assert "image id 1 (000.png) is a folder, not an image file" in message and "IMAGE_ROOT" not in message, message


# before: "is not valid JSON: Unexpected UTF-8 BOM (decode using utf-8-sig) at line 1, column 1", no way to remove it
def test_an_annotation_file_with_a_utf8_bom_is_named_with_how_to_remove_it(tmp_path):
    import subprocess

    json_file, root = write_dataset(tmp_path).rsplit(":", 1)
    Path(json_file).write_bytes(b"\xef\xbb\xbf" + Path(json_file).read_bytes())
    with pytest.raises(DatasetError) as refused:
        CocoDataset.parse(f"m={json_file}:{root}").inspected()
    message = str(refused.value)
    assert message.startswith(f"dataset 'm': {json_file} starts with a UTF-8 byte order mark (BOM, the bytes EF BB BF"), \
        message
    command = re.search(r"remove it \((sed .*), or python", message)
    assert command, message
    subprocess.run(command.group(1), shell=True, check=True)  # the fix given removes it
    assert CocoDataset.parse(f"m={json_file}:{root}").inspected().read.instances == 4


# before: the model built, then "detectron2 could not train the first iteration with this config: ValueError:
# Failed to use mask_format=='polygon'"
def test_the_shapes_dataset_read_as_polygons_is_refused_before_the_run():
    cfg = build_config(str(DEMO_CONFIG), [*TINY_OPTS, "INPUT.MASK_FORMAT", "polygon"])
    with pytest.raises(DatasetError, match=r"^DATASETS.TRAIN 'shapes_train' is gwdet's shapes dataset, whose masks are "
                                           r"RLE, which detectron2 reads only as bitmasks, and INPUT.MASK_FORMAT is "
                                           r"'polygon': add INPUT.MASK_FORMAT bitmask to the command line"):
        check_config_against_datasets(cfg, trains=True, evaluates=False)
    check_config_against_datasets(build_config(str(DEMO_CONFIG), [*TINY_OPTS, "MODEL.MASK_ON", "False",
                                                                  "INPUT.MASK_FORMAT", "polygon"]))
    found = _lazy_refusal("dataloader.train.mapper.instance_mask_format=polygon")
    assert ("'shapes_train' is gwdet's shapes dataset" in found and "dataloader.train.mapper.instance_mask_format is "
            "'polygon': add dataloader.train.mapper.instance_mask_format=bitmask" in found), found


# ---- absolute file_names and copied training files ---------------------------------------------

def test_absolute_file_names_outside_image_root_are_refused_and_those_inside_it_kept(tmp_path):
    # absolute file_names of existing images elsewhere were read as they were, IMAGE_ROOT ignored without a word
    # (results.json recorded the IMAGE_ROOT given, whose images were never read)
    old = tmp_path / "old"
    write_dataset(old)

    def elsewhere(coco, root):
        for image in coco["images"]:
            image["file_name"] = str(old / "img" / image["file_name"])

    message = refusal(tmp_path / "new", elsewhere)
    assert re.search(
        rf"^dataset 'm': 4 of the 4 images of .*train.json have an absolute file_name outside the image folder "
        rf"{re.escape(str(tmp_path / 'new' / 'img'))}, the first '{re.escape(str(old / 'img' / '000.png'))}': "
        r"detectron2 reads an absolute path as it is, so IMAGE_ROOT would not be used .* Write the file names "
        rf"relative to IMAGE_ROOT .*, or give as IMAGE_ROOT the folder they are in \({re.escape(str(old / 'img'))}\)\.$",
        message), message

    def inside(coco, root):  # absolute names of the images IMAGE_ROOT holds: read from IMAGE_ROOT
        for image in coco["images"]:
            image["file_name"] = str(root / image["file_name"])

    assert CocoDataset.parse(f"m={write_dataset(tmp_path / 'inside', inside)}").inspected().read.images == 4


def test_a_copied_training_file_under_another_name_is_refused_as_one_file_twice(tmp_path):
    # a byte-identical copy of a training json, registered under another name, trained its images twice as often
    # without a word (only one file under two names was refused)
    from gwdet.data import prepare_datasets

    spec = write_dataset(tmp_path)
    shutil.copy(tmp_path / "train.json", tmp_path / "copy.json")
    register_coco_datasets([CocoDataset.parse(f"orig_tr={spec}"),
                            CocoDataset.parse(f"copy_tr={tmp_path / 'copy.json'}:{tmp_path / 'img'}")])
    cfg = build_config(str(DEMO_CONFIG), [*TINY_OPTS, "DATASETS.TRAIN", "('orig_tr', 'copy_tr')", "DATASETS.TEST",
                                          "()", "MODEL.ROI_HEADS.NUM_CLASSES", "2", "INPUT.MASK_FORMAT", "polygon"])
    with pytest.raises(DatasetError, match=(
            rf"DATASETS.TRAIN names 'orig_tr' and 'copy_tr', registered from two annotation files of the same contents "
            rf"\({re.escape(str(tmp_path / 'train.json'))} and {re.escape(str(tmp_path / 'copy.json'))}, byte for "
            r"byte\) over the same \d+ image file\(s\): detectron2 would join them .* twice as often as the others'. "
            r"Give one of them once")):
        prepare_datasets(cfg)
    prepare_datasets(cfg, trains=False)  # an evaluation reads no training set
