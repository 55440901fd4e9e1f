"""Your own COCO-format data without code: ``--register-coco NAME=JSON:IMAGE_ROOT`` on
tools/train_net.py and tools/compare_norms.py, trained and evaluated on a COCO JSON written here,
and each way the files or the config can be wrong refused on one line naming the file or key."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from detectron2.data import DatasetCatalog, MetadataCatalog
from PIL import Image

from gwdet.data import (CocoDataset, DatasetError, check_config_against_datasets, register_coco_datasets,
                        register_datasets)
from gwdet.data.coco_registration import ENVIRONMENT_VARIABLE, registered_coco_dataset
from gwdet.engine.arguments import parse_args
from gwdet.engine.run import load_run_config, setup
from gwdet.model_zoo import build_config

from conftest import DEMO_CONFIG, REPO, TINY_OPTS, logged_warnings

# Non-contiguous ids, listed out of order: detectron2 orders classes by id.
CATEGORIES = [{"id": 7, "name": "bar"}, {"id": 3, "name": "block"}]
OTHER_CATEGORIES = [{"id": 3, "name": "block"}, {"id": 7, "name": "ring"}]
SIZE = 64


def _rectangle(x0: int, y0: int, x1: int, y1: int) -> list[list[float]]:
    return [[float(x0), float(y0), float(x1), float(y0), float(x1), float(y1), float(x0), float(y1)]]


def write_coco(folder: Path, images: int, categories=CATEGORIES, seed: int = 0, rle: bool = False) -> tuple[Path, Path]:
    """``folder/instances.json`` and ``folder/images/*.png``: noisy images, each with a square of the
    category "block" and a wide rectangle of the other category, masks as polygons (or RLE);
    returns (json, image folder)."""
    import pycocotools.mask as mask_util

    rng = np.random.default_rng(seed)
    image_root = folder / "images"
    image_root.mkdir(parents=True)
    coco = {"images": [], "annotations": [], "categories": categories}
    ids = {category["name"]: category["id"] for category in categories}
    wide = next(name for name in ids if name != "block")
    for index in range(images):
        pixels = rng.integers(0, 80, size=(SIZE, SIZE, 3), dtype=np.uint8)
        x, y = rng.integers(4, 24, size=2)
        shapes = {"block": (x, y, x + 16, y + 16), wide: (8, 48, 56, 56)}
        file_name = f"{index:03d}.png"
        coco["images"].append({"id": index + 1, "file_name": file_name, "height": SIZE, "width": SIZE})
        for colour, (name, (x0, y0, x1, y1)) in zip(((230, 60, 60), (60, 230, 60)), shapes.items(), strict=True):
            pixels[y0:y1, x0:x1] = colour
            mask = np.zeros((SIZE, SIZE), dtype=np.uint8)
            mask[y0:y1, x0:x1] = 1
            if rle:
                encoded = mask_util.encode(np.asfortranarray(mask))
                segmentation = {"size": [SIZE, SIZE], "counts": encoded["counts"].decode("ascii")}
            else:
                segmentation = _rectangle(x0, y0, x1, y1)
            coco["annotations"].append({
                "id": len(coco["annotations"]) + 1, "image_id": index + 1, "category_id": ids[name],
                "bbox": [float(x0), float(y0), float(x1 - x0), float(y1 - y0)], "area": float((x1 - x0) * (y1 - y0)),
                "iscrowd": 0, "segmentation": segmentation,
            })
        Image.fromarray(pixels).save(image_root / file_name)
    json_file = folder / "instances.json"
    json_file.write_text(json.dumps(coco, indent=1))
    return json_file, image_root


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """Train and val splits, a val split with other categories, a train split with RLE masks."""
    root = tmp_path_factory.mktemp("own_coco")
    return {
        "train": write_coco(root / "train", 4, seed=0),
        "val": write_coco(root / "val", 2, seed=1),
        "other": write_coco(root / "other", 2, categories=OTHER_CATEGORIES, seed=2),
        "rle": write_coco(root / "rle", 2, seed=3, rle=True),
    }


def spec(name: str, files: tuple[Path, Path]) -> str:
    return f"{name}={files[0]}:{files[1]}"


def tiny(*overrides: str) -> list[str]:
    return [*TINY_OPTS, *overrides]


def test_train_net_trains_and_evaluates_on_registered_coco_data(data, tmp_path):
    """The command a user types, two iterations: results.json holds the registered test set's
    box and mask AP (polygon masks, INPUT.MASK_FORMAT polygon)."""
    command = [sys.executable, str(REPO / "tools" / "train_net.py"), "--config", str(DEMO_CONFIG),
               "--register-coco", spec("mine_train", data["train"]),
               *tiny("DATASETS.TRAIN", "('mine_train',)", "DATASETS.TEST", "('mine_val',)",
                     "MODEL.ROI_HEADS.NUM_CLASSES", "2", "INPUT.MASK_FORMAT", "polygon", "OUTPUT_DIR", str(tmp_path)),
               "--register-coco", spec("mine_val", data["val"]), "--threads", "1"]  # a flag after the overrides too
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert list(results) == ["mine_val", "environment"]
    recorded = results["environment"]["datasets"]  # the registered files the run trained and evaluated on
    assert {name: (files["json_file"], files["json_sha256"]) for name, files in recorded.items()} == {
        name: (str(data[split][0]), hashlib.sha256(data[split][0].read_bytes()).hexdigest())
        for name, split in (("mine_train", "train"), ("mine_val", "val"))}
    assert {"bbox", "segm"} <= set(results["mine_val"])
    assert {"AP-bar", "AP-block"} <= set(results["mine_val"]["bbox"]), "classes named by the JSON, in id order"


def test_registered_dataset_loads_with_its_categories(data):
    register_coco_datasets([CocoDataset.parse(spec("own_loaded", data["train"]))])
    assert MetadataCatalog.get("own_loaded").thing_classes == ["block", "bar"]  # by id: 3, 7
    records = DatasetCatalog.get("own_loaded")
    assert len(records) == 4 and {a["category_id"] for r in records for a in r["annotations"]} == {0, 1}
    # the same registration again is a no-op; the name onto other files is re-registered
    register_coco_datasets([CocoDataset.parse(spec("own_loaded", data["train"]))])
    register_coco_datasets([CocoDataset.parse(spec("own_loaded", data["val"]))])
    assert len(DatasetCatalog.get("own_loaded")) == 2


def test_paths_expand_home_and_the_last_colon_separates_them(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    dataset = CocoDataset.parse("mine=~/a:b/instances.json:~/images")
    assert dataset.json_file == str(tmp_path / "a:b" / "instances.json")
    assert dataset.image_root == str(tmp_path / "images")
    assert CocoDataset.parse(dataset.spec) == dataset


def _parse_error(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--config", str(DEMO_CONFIG), *argv])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(lines)
    return lines[-1]


def test_files_are_checked_as_the_flag_is_read(data, tmp_path, capsys):
    json_file, images = data["train"]
    broken = tmp_path / "broken.json"
    broken.write_text('{"images": [],\n "annotations": [\n}')
    no_images = tmp_path / "no_images.json"
    no_images.write_text(json.dumps({"images": [], "annotations": [], "categories": CATEGORIES}))
    cases = {
        "a missing json": (f"m={tmp_path / 'nope.json'}:{images}", ["'m'", "nope.json", "does not exist"]),
        "invalid json": (f"m={broken}:{images}", ["broken.json", "not valid JSON", "line 3, column 1"]),
        "no images": (f"m={no_images}:{images}", ["no_images.json", "lists no images"]),
        "a missing image folder": (f"m={json_file}:{tmp_path / 'pics'}", ["image folder", "pics", "does not exist"]),
        "the wrong image folder": (f"m={json_file}:{tmp_path}", ["'000.png'", "is not in the image folder"]),
        "no image folder": (f"m={json_file}", ["expects NAME=JSON:IMAGE_ROOT"]),
        "detectron2's builtin name": (f"coco_2017_train={json_file}:{images}", ["'coco_2017_train' is taken"]),
        "gwdet's shapes names": (f"shapes_mine={json_file}:{images}", ["'shapes_mine' is taken", "shapes"]),
    }
    for case, (value, fragments) in cases.items():
        line = _parse_error(capsys, ["--register-coco", value])
        assert ": error: argument --register-coco: " in line, (case, line)
        for fragment in fragments:
            assert fragment in line, (case, line)
    twice = _parse_error(capsys, ["--register-coco", f"m={json_file}:{images}", "--register-coco", f"m={json_file}:{images}"])
    assert "'m' is given twice" in twice


def _setup_error(capsys, tmp_path, registrations: list[str], overrides: list[str]) -> str:
    argv = ["--config", str(DEMO_CONFIG), *[t for r in registrations for t in ("--register-coco", r)],
            *tiny(*overrides, "OUTPUT_DIR", str(tmp_path / "out"))]
    with pytest.raises(SystemExit) as exit_info:
        args = parse_args(argv)
        setup(args, load_run_config(args.config_file, args.opts))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and ": error: " in err, err
    assert not (tmp_path / "out" / "config.yaml").exists(), "refused before anything of the run is written"
    return err


def test_an_image_info_file_registers_for_inference_and_is_refused_as_a_test_set(data, tmp_path):
    # COCO's test-dev form (images and categories, no 'annotations'): refused before by the export and
    # analysis tools too, which only run the model on the images
    coco, json_file, root = _copy(data["val"], tmp_path)
    del coco["annotations"]
    json_file.write_text(json.dumps(coco))
    dataset = CocoDataset.parse(f"info_te={json_file}:{root}")
    assert (dataset.inspected().read.images, dataset.read.instances) == (len(coco["images"]), 0)
    register_coco_datasets([dataset])
    assert len(DatasetCatalog.get("info_te")) == len(coco["images"])
    cfg = build_config(str(DEMO_CONFIG), tiny("DATASETS.TEST", "('info_te',)", "MODEL.ROI_HEADS.NUM_CLASSES", "2"))
    with pytest.raises(DatasetError, match="DATASETS.TEST 'info_te' .* has no annotations to evaluate against"):
        check_config_against_datasets(cfg, trains=False)


def test_the_config_is_checked_against_the_registered_datasets(data, tmp_path, capsys):
    train, val = spec("chk_train", data["train"]), spec("chk_val", data["val"])
    both = ["DATASETS.TRAIN", "('chk_train',)", "DATASETS.TEST", "('chk_val',)"]
    err = _setup_error(capsys, tmp_path, [train, val], both)  # the demo config has 4 classes
    assert "MODEL.ROI_HEADS.NUM_CLASSES is 4" in err and "2 categories (block, bar)" in err
    assert "MODEL.ROI_HEADS.NUM_CLASSES 2" in err and "instances.json" in err

    err = _setup_error(capsys, tmp_path, [train, spec("chk_other", data["other"])],
                       ["DATASETS.TRAIN", "('chk_train',)", "DATASETS.TEST", "('chk_other',)",
                        "MODEL.ROI_HEADS.NUM_CLASSES", "2"])
    assert "different categories" in err and "7 'bar'" in err and "7 'ring'" in err

    err = _setup_error(capsys, tmp_path, [spec("chk_rle", data["rle"])],
                       ["DATASETS.TRAIN", "('chk_rle',)", "DATASETS.TEST", "()", "MODEL.ROI_HEADS.NUM_CLASSES", "2",
                        "INPUT.MASK_FORMAT", "polygon"])
    assert "RLE masks" in err and "INPUT.MASK_FORMAT bitmask" in err

    err = _setup_error(capsys, tmp_path, [train], ["DATASETS.TRAIN", "('chk_train',)", "DATASETS.TEST", "('chk_vall',)",
                                                   "MODEL.ROI_HEADS.NUM_CLASSES", "2"])
    assert "'chk_vall' is not registered" in err and "--register-coco chk_vall=" in err

    # shapes (4 classes) as the test set of a 2-category dataset
    err = _setup_error(capsys, tmp_path, [train], ["DATASETS.TRAIN", "('chk_train',)", "DATASETS.TEST", "('shapes_val',)",
                                                   "MODEL.ROI_HEADS.NUM_CLASSES", "2"])
    assert "'shapes_val' have different categories" in err


def test_retinanet_and_box_only_models_are_checked_by_their_own_keys(data):
    register_coco_datasets([CocoDataset.parse(spec("keys_train", data["train"]))])
    cfg = build_config(str(DEMO_CONFIG), tiny("DATASETS.TRAIN", "('keys_train',)", "DATASETS.TEST", "()",
                                              "MODEL.ROI_HEADS.NUM_CLASSES", "2", "INPUT.MASK_FORMAT", "polygon"))
    check_config_against_datasets(cfg)
    cfg = cfg.clone()
    cfg.defrost()
    for architecture in ("RetinaNet", "GWRetinaNet"):  # gwdet's own RetinaNet was not checked at all
        cfg.MODEL.META_ARCHITECTURE = architecture
        cfg.MODEL.RETINANET.NUM_CLASSES = 80
        with pytest.raises(DatasetError, match="MODEL.RETINANET.NUM_CLASSES is 80.*MODEL.RETINANET.NUM_CLASSES 2"):
            check_config_against_datasets(cfg)
        cfg.MODEL.RETINANET.NUM_CLASSES = 2
        check_config_against_datasets(cfg)


def test_one_annotation_file_under_two_training_names_is_refused(data):
    # each image was trained twice as often, without a word (a name given twice is refused)
    from gwdet.data import prepare_datasets

    register_coco_datasets([CocoDataset.parse(spec("twice_a", data["train"])),
                            CocoDataset.parse(spec("twice_b", data["train"]))])
    cfg = build_config(str(DEMO_CONFIG), tiny("DATASETS.TRAIN", "('twice_a', 'twice_b')", "DATASETS.TEST", "()",
                                              "MODEL.ROI_HEADS.NUM_CLASSES", "2", "INPUT.MASK_FORMAT", "polygon"))
    with pytest.raises(ValueError, match=r"DATASETS.TRAIN names 'twice_a' and 'twice_b', registered from one annotation "
                                         r"file .*twice as often"):
        prepare_datasets(cfg)
    prepare_datasets(cfg, trains=False)  # an evaluation reads no training set


def test_the_environment_variable_registers_what_the_config_names(data, tmp_path, monkeypatch):
    """$GWDET_REGISTER_COCO: how processes started by a tool (study cells, jobs) get the datasets."""
    unused = spec("env_unused", (tmp_path / "nope.json", tmp_path))
    monkeypatch.setenv(ENVIRONMENT_VARIABLE, json.dumps([spec("env_train", data["train"]), unused]))
    cfg = build_config(str(DEMO_CONFIG), tiny("DATASETS.TRAIN", "('env_train',)", "DATASETS.TEST", "()",
                                              "MODEL.ROI_HEADS.NUM_CLASSES", "2", "INPUT.MASK_FORMAT", "polygon"))
    register_datasets(cfg)
    assert registered_coco_dataset("env_train") is not None and registered_coco_dataset("env_unused") is None
    # the variable changed in the same process (a notebook): its current files, not the ones registered first
    monkeypatch.setenv(ENVIRONMENT_VARIABLE, json.dumps([spec("env_train", data["val"])]))
    register_datasets(cfg)
    assert MetadataCatalog.get("env_train").json_file == str(data["val"][0])
    # the run's own --register-coco of the name comes first, also when the datasets are registered again later
    register_datasets(cfg, [CocoDataset.parse(spec("env_train", data["train"]))])
    register_datasets(cfg)
    assert MetadataCatalog.get("env_train").json_file == str(data["train"][0])
    monkeypatch.setenv(ENVIRONMENT_VARIABLE, "env_train=a.json:images")
    with pytest.raises(DatasetError, match="^GWDET_REGISTER_COCO must be a JSON list"):
        register_datasets(cfg)
    monkeypatch.setenv(ENVIRONMENT_VARIABLE, json.dumps([spec("coco_2017_val", data["val"])]))
    cfg = build_config(str(DEMO_CONFIG), tiny("DATASETS.TRAIN", "('env_train',)", "DATASETS.TEST", "('coco_2017_val',)"))
    with pytest.raises(DatasetError, match="^GWDET_REGISTER_COCO: dataset name 'coco_2017_val' is taken"):
        register_datasets(cfg)


def test_the_tool_refuses_a_config_that_does_not_fit_on_one_line(data, tmp_path):
    command = [sys.executable, str(REPO / "tools" / "train_net.py"), "--config", str(DEMO_CONFIG),
               "--register-coco", spec("mine_train", data["train"]),
               *tiny("DATASETS.TRAIN", "('mine_train',)", "DATASETS.TEST", "()", "OUTPUT_DIR", str(tmp_path))]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(
        "train_net.py: error: MODEL.ROI_HEADS.NUM_CLASSES is 4, but DATASETS.TRAIN 'mine_train'")


def test_the_study_takes_the_flag_and_hands_it_to_its_cells(data, tmp_path, monkeypatch, capsys):
    """compare_norms.py checks the registrations against every cell's config, and its cells, trained
    in processes of their own, get them from the environment ($GWDET_REGISTER_COCO)."""
    from gwdet_lab.study import cli

    monkeypatch.delenv(ENVIRONMENT_VARIABLE, raising=False)
    train_json = tmp_path / "train.json"  # a copy, changed below
    train_json.write_text(data["train"][0].read_text())
    names = ["DATASETS.TRAIN", "('study_train',)", "DATASETS.TEST", "('study_val',)"]
    argv = ["--configs", f"gn={REPO / 'configs' / 'Study' / 'gn.yaml'}", "--seeds", "0", "--out", str(tmp_path),
            "--register-coco", spec("study_train", (train_json, data["train"][1])),
            "--register-coco", spec("study_val", data["val"]),
            "--no-example-weighing", "--threads", "1", "--opts", *tiny(*names)]
    with pytest.raises(SystemExit) as exit_info:
        cli.main([*argv, "--list"], repo_root=REPO)
    assert exit_info.value.code == 2
    assert "MODEL.ROI_HEADS.NUM_CLASSES is 4" in capsys.readouterr().err
    assert cli.main([*argv, "MODEL.ROI_HEADS.NUM_CLASSES", "2"], repo_root=REPO) == 0
    assert ENVIRONMENT_VARIABLE not in os.environ  # set for the study's processes only; they trained on them:
    results = json.loads((tmp_path / "runs" / "gn-s0" / "results.json").read_text())
    assert list(results) == ["study_val", "environment"] and "AP" in results["study_val"]["bbox"]
    # The cell's record names the datasets' files; a changed JSON no longer matches it.
    recorded = json.loads((tmp_path / "runs" / "gn-s0" / "study_cell.json").read_text())["datasets"]
    assert recorded["study_train"]["json_file"] == str(train_json) and len(recorded["study_train"]["json_sha256"]) == 64
    assert set(recorded) == {"study_train", "study_val"}
    coco = json.loads(train_json.read_text())
    coco["annotations"] = coco["annotations"][:-1]
    train_json.write_text(json.dumps(coco))
    capsys.readouterr()
    assert cli.main([*argv, "MODEL.ROI_HEADS.NUM_CLASSES", "2", "--list"], repo_root=REPO) == 2
    assert f"dataset study_train: {train_json} changed since the cell was recorded" in capsys.readouterr().err


@pytest.mark.parametrize("bbox, problem", [
    ([10, 10, 0, 5], "has no area"),
    ([10, 10, -4, 5], "has no area"),
    ([10, 10, float("nan"), 5], "is not four finite numbers"),
    ([60, 10, 30, 5], "reaches outside the 64x64 image"),
    ([10, 10, 5], "is not four finite numbers"),
])
def test_degenerate_boxes_are_refused_naming_the_annotation_and_image(data, tmp_path, capsys, bbox, problem):
    json_file, images = data["train"]
    coco = json.loads(Path(json_file).read_text())
    coco["annotations"][1]["bbox"] = bbox
    damaged = tmp_path / "boxes.json"
    damaged.write_text(json.dumps(coco))  # NaN written as JSON's NaN, as Python's json reads it back
    line = _parse_error(capsys, ["--register-coco", f"m={damaged}:{images}"])
    annotation = coco["annotations"][1]
    assert f"annotation id {annotation['id']} of image {annotation['image_id']}" in line, line
    assert problem in line and "1 box(es)" in line and "Correct or remove" in line, line


# ---- ids, masks and image files, checked as the flag is read -----------------------------------------

def test_the_records_name_the_annotations_the_run_read_when_the_file_changed_since(data, tmp_path):
    # an annotation tool saving the json while a run trained or evaluated: results.json and the checkpoints recorded the
    # SHA-256 of the edited file, though the run had read the earlier one
    from gwdet.engine.run_environment import annotation_files

    coco, json_file, root = _copy(data["val"], tmp_path / "edited")
    json_file.write_text(json.dumps(coco))
    read = hashlib.sha256(json_file.read_bytes()).hexdigest()
    register_coco_datasets([CocoDataset.parse(f"own_edited={json_file}:{root}")])
    json_file.write_text(json.dumps({**coco, "annotations": coco["annotations"][:1]}))
    with logged_warnings("gwdet") as warned:
        assert annotation_files(["own_edited"])["own_edited"]["json_sha256"] == read
    assert warned == [f"{json_file} ('own_edited') holds other contents than the run read (SHA-256 {read[:12]}... then, "
                      f"{hashlib.sha256(json_file.read_bytes()).hexdigest()[:12]}... now: changed while the run ran): the "
                      "records name the contents the run read."]


def test_own_code_thing_classes_other_than_the_files_categories_are_refused_naming_both(data):
    # two warnings about an evaluation that could not happen, then detectron2's raw AssertionError ("cannot be set to
    # a different value")
    from detectron2.data.datasets import register_coco_instances

    from gwdet.data.coco_registration import known_class_names

    json_file, root = data["val"]
    register_coco_instances("own_meta_val", {"thing_classes": ["a", "block"]}, str(json_file), str(root))
    try:
        with pytest.raises(DatasetError, match=r"^dataset 'own_meta_val' is registered with thing_classes 'a', "
                                               r"'block' in its metadata, but its annotation file .* names the "
                                               r"categories 'block', 'bar' \(by id\): only the metadata has 'a'; "
                                               r"only the file has 'bar'. .* Register it without thing_classes"):
            known_class_names("own_meta_val")
    finally:
        DatasetCatalog.remove("own_meta_val")
        MetadataCatalog.remove("own_meta_val")


def _copy(files: tuple[Path, Path], folder: Path) -> tuple[dict, Path, Path]:
    """A copy of a dataset's JSON (loaded) and images in ``folder``."""
    json_file, images = files
    root = folder / "images"
    root.mkdir(parents=True)
    for image in images.iterdir():
        (root / image.name).write_bytes(image.read_bytes())
    return json.loads(json_file.read_text()), folder / "instances.json", root


def _sixteen_bit(coco, root):
    pixels = (np.arange(SIZE * SIZE, dtype=np.uint16).reshape(SIZE, SIZE) * 16)
    Image.fromarray(pixels).save(root / coco["images"][1]["file_name"])  # PIL mode I;16: read as white by detectron2


def _cut_short(coco, root):
    path = root / coco["images"][1]["file_name"]
    path.write_bytes(path.read_bytes()[:-200])


def _cut_short_jpeg(coco, root):
    Image.open(root / coco["images"][1]["file_name"]).convert("RGB").save(root / "001.jpg", quality=90)
    coco["images"][1]["file_name"] = "001.jpg"
    data = (root / "001.jpg").read_bytes()
    (root / "001.jpg").write_bytes(data[:len(data) * 2 // 3])


def _linked(root, coco, link):
    first, second = (root / coco["images"][index]["file_name"] for index in (0, 1))
    second.unlink()
    link(first.name if link is os.symlink else first, second)


def _renamed(coco, root, index, on_disk, in_json):
    """Image ``index``'s file renamed to ``on_disk`` while the JSON names it ``in_json``."""
    os.rename(root / coco["images"][index]["file_name"], root / on_disk)
    coco["images"][index]["file_name"] = in_json


def _rle_counts(coco, counts):
    coco["annotations"][2]["segmentation"] = {"size": [SIZE, SIZE], "counts": counts}


DATA_CASES = {
    "16-bit png": (_sixteen_bit, ["1 of the 4 images", "image id 2 (001.png) is a 16-bit grayscale image (PIL mode "
                                  "'I;16')", "white image", "convert it to 8-bit"]),
    "stated size": (lambda coco, root: coco["images"][1].update(width=80),
                    ["image id 2 (001.png) is 64x64 pixels (width x height), but the JSON states 80x64", "correct"]),
    "missing image after the first": (lambda coco, root: (root / coco["images"][2]["file_name"]).unlink(),
                                      ["image id 3 (002.png) does not exist", "Fix or replace those files"]),
    # "image id 3 (002.png\n) does not exist" over two lines, where 002.png is
    "file name ending in a newline": (lambda coco, root: coco["images"][2].update(file_name="002.png\n"),
                                      ["image id 3 ('002.png\\n', a name with characters one does not see) does not "
                                       "exist (a file named '002.png' is there: remove the white space from the JSON's "
                                       "file_name)"]),
    # names compared byte by byte: a dataset made on macOS (NFD names, no letter case) named only "does not exist"
    "file name in another letter case": (lambda coco, root: _renamed(coco, root, 2, "002.png", "002.PNG"),
                                         ["image id 3 (002.PNG) does not exist; the folder holds '002.png', the same name "
                                          "but in letter case", "write the JSON's file_name as the file is named"]),
    "file name in another unicode form": (lambda coco, root: _renamed(coco, root, 2, "cafe\u0301.png", "caf\u00e9.png"),
                                          ["does not exist; the folder holds 'cafe\u0301.png', the same name but in the "
                                           "Unicode form of its accented letters (composed NFC in one, decomposed NFD"]),
    "first file name in another letter case": (lambda coco, root: _renamed(coco, root, 0, "000.png", "000.PNG"),
                                               ["the first image of", "'000.PNG', is not in the image folder",
                                                "IMAGE_ROOT is the right folder; the folder holds '000.png', the same "
                                                "name but in letter case"]),
    "png cut short": (_cut_short, ["image id 2 (001.png) cannot be decoded", "cut short or damaged"]),
    "jpeg cut short": (_cut_short_jpeg, ["image id 2 (001.jpg) cannot be decoded", "cut short or damaged"]),
    "image id twice": (lambda coco, root: coco["images"][2].update(id=2),
                       ["1 image id(s)", "id 2 of both '001.png' and '002.png'", "Give each image its own id"]),
    "annotation id twice": (lambda coco, root: coco["annotations"][3].update(id=1),
                            ["1 annotation id(s)", "id 1 of both an annotation of image 1 and an annotation of image 2",
                             "Give each annotation its own id"]),
    "polygon of two points": (lambda coco, root: coco["annotations"][2].update(segmentation=[[1.0, 2.0, 3.0, 4.0]]),
                              ["annotation id 3 of image 2 (001.png): its mask has polygon #0 of 4 values",
                               "at least 3 points", "Correct or remove those masks"]),
    "polygon of strings": (lambda coco, root: coco["annotations"][2].update(segmentation=[["1", 2, 3, 4, 5, 6]]),
                           ["annotation id 3", "polygon #0 that is not a list of finite numbers"]),
    "rle not decodable": (lambda coco, root: _rle_counts(coco, "0000000000\x7f"),
                          ["annotation id 3", "its mask is RLE whose 'counts' string is not COCO's compressed RLE"]),
    "rle of another size": (lambda coco, root: _rle_counts(coco, [100, 20]),
                            ["its mask is RLE whose runs cover 120 pixels, not the 64x64 = 4096"]),
    # one file under two names: row 138's refusal compared the names only (box AP 1.73 -> 0.83 without a word)
    "image as a symbolic link to another": (lambda coco, root: _linked(root, coco, os.symlink),
                                            ["1 image file(s)", "'001.png' (image 2) is '000.png' (image 1)",
                                             "a symbolic or hard link", "Give each image entry a file of its own"]),
    "image as a hard link to another": (lambda coco, root: _linked(root, coco, os.link),
                                        ["'001.png' (image 2) is '000.png' (image 1)"]),
    "mask far outside its box": (lambda coco, root: coco["annotations"][2].update(bbox=[40.0, 2.0, 10.0, 10.0]),
                                 ["annotation id 3 of image 2 (001.png): its mask lies outside its bbox [40.0, 2.0, "
                                  "10.0, 10.0]", "the box and the mask must describe the same object"]),
}


@pytest.mark.parametrize("case", list(DATA_CASES))
def test_data_that_would_train_wrong_or_fail_late_is_refused_naming_the_id_the_file_and_the_fix(data, tmp_path, capsys,
                                                                                                case):
    damage, fragments = DATA_CASES[case]
    coco, json_file, root = _copy(data["train"], tmp_path)
    damage(coco, root)
    json_file.write_text(json.dumps(coco))
    line = _parse_error(capsys, ["--register-coco", f"m={json_file}:{root}"])
    assert "argument --register-coco: dataset 'm': " in line and str(json_file) in line, line
    for fragment in fragments:
        assert fragment in line, (case, line)


# before: with RLE masks, a width the JSON stated wrong (80 for a 64-pixel PNG) was refused as masks that do not fit
# "its image is 64x80", and the fix offered was to correct or remove the (right) masks; a width stated too small
# was refused as boxes outside the image
@pytest.mark.parametrize("split, width", [("rle", 80), ("train", 50)])
def test_an_image_size_stated_wrong_is_named_before_the_boxes_and_masks_checked_against_it(data, tmp_path, capsys,
                                                                                           split, width):
    coco, json_file, root = _copy(data[split], tmp_path)
    coco["images"][0]["width"] = width
    json_file.write_text(json.dumps(coco))
    line = _parse_error(capsys, ["--register-coco", f"m={json_file}:{root}"])
    assert line.endswith(
        f"1 of the {len(coco['images'])} images of {json_file} cannot be read as it states (under {root}): image id 1 (000.png) is 64x64 "
        f"pixels (width x height), but the JSON states {width}x64: correct the image's width and height in the JSON (or "
        "the file). Fix or replace those files, or remove them and their annotations from the JSON."), line
    assert "mask" not in line and "box" not in line, line


def test_an_image_root_holding_a_colon_is_split_where_the_json_file_is(data, tmp_path):
    coco, _, root = _copy(data["train"], tmp_path / "c:d")
    json_file = tmp_path / "a:b.json"  # a ':' in both paths
    json_file.write_text(json.dumps(coco))
    dataset = CocoDataset.parse(f"colons={json_file}:{root}")
    assert (dataset.json_file, dataset.image_root) == (str(json_file), str(root))
    assert CocoDataset.parse(dataset.spec) == dataset
    register_coco_datasets([dataset])
    assert len(DatasetCatalog.get("colons")) == 4


def test_paths_that_can_be_split_at_two_colons_are_refused_naming_both_readings(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("x", "x:y"):  # two JSON files and two folders: 'x:y:z' reads both ways
        (tmp_path / name).write_text("{}")
    for name in ("y:z", "z"):
        (tmp_path / name).mkdir()
    with pytest.raises(DatasetError) as refused:
        CocoDataset.parse("amb=x:y:z")
    assert str(refused.value) == ("'amb=x:y:z' can be read as JSON 'x' with IMAGE_ROOT 'y:z' or as JSON 'x:y' with "
                                  "IMAGE_ROOT 'z': rename the file or folder whose name holds ':' (or link it under a "
                                  "name without one).")


def test_an_exif_rotated_image_is_checked_at_the_size_detectron2_reads_it(data, tmp_path):
    coco, json_file, root = _copy(data["train"], tmp_path)
    rotated = Image.new("RGB", (SIZE // 2, SIZE))  # stored 32 wide, 64 high; EXIF orientation 6 turns it to 64x32
    exif = Image.Exif()
    exif[0x0112] = 6
    rotated.save(root / "rotated.jpg", exif=exif)
    coco["images"][1].update(file_name="rotated.jpg", width=SIZE, height=SIZE // 2)
    coco["annotations"] = [a for a in coco["annotations"] if a["image_id"] != 2]
    json_file.write_text(json.dumps(coco))
    CocoDataset.parse(f"turned={json_file}:{root}").inspected()  # as detectron2 reads it: no error
    coco["images"][1].update(width=SIZE // 2, height=SIZE)  # the stored size, which detectron2 does not read
    json_file.write_text(json.dumps(coco))
    with pytest.raises(DatasetError, match=r"rotated.jpg\) is stored 32x64 pixels, as the JSON states, with an EXIF "
                                           r"orientation \(6\) that turns it to 64x32, as detectron2 reads it"):
        CocoDataset.parse(f"turned={json_file}:{root}").inspected()


@pytest.mark.parametrize("names, overrides, expected", [
    (("shapes_train", "shapes_val"), ["MODEL.ROI_HEADS.NUM_CLASSES", "3"],
     "MODEL.ROI_HEADS.NUM_CLASSES is 3, but DATASETS.TRAIN 'shapes_train' has 4 categories (circle, square, triangle, "
     "star): with fewer classes a category would train as background, with more the evaluation fails. Add "
     "MODEL.ROI_HEADS.NUM_CLASSES 4 to the command line (or set it in the config)."),
    (("coco_2017_train", "coco_2017_val"), ["MODEL.ROI_HEADS.NUM_CLASSES", "81"],
     "MODEL.ROI_HEADS.NUM_CLASSES is 81, but DATASETS.TRAIN 'coco_2017_train' has 80 categories (person, bicycle, "),
])
def test_the_number_of_classes_is_checked_against_datasets_not_registered_here(names, overrides, expected):
    cfg = build_config(str(DEMO_CONFIG), tiny("DATASETS.TRAIN", f"('{names[0]}',)", "DATASETS.TEST", f"('{names[1]}',)",
                                              *overrides))
    with pytest.raises(DatasetError) as refused:
        register_datasets(cfg)  # before any file of the datasets is read
    assert str(refused.value).startswith(expected)
    cfg = build_config(str(DEMO_CONFIG), tiny("DATASETS.TRAIN", f"('{names[0]}',)", "DATASETS.TEST", f"('{names[1]}',)",
                                              "MODEL.META_ARCHITECTURE", "ProposalNetwork", *overrides))
    register_datasets(cfg)  # class-agnostic proposals: no number of classes to check


def test_a_resume_on_another_annotation_file_under_the_same_name_is_refused(data, tmp_path):
    # before: it continued on the new file without a word, results.json naming only that one
    from gwdet.engine.run import main

    first = ["--config", str(DEMO_CONFIG), "--register-coco", spec("resumed_train", data["train"]),
             *tiny("DATASETS.TRAIN", "('resumed_train',)", "DATASETS.TEST", "()", "MODEL.ROI_HEADS.NUM_CLASSES", "2",
                   "INPUT.MASK_FORMAT", "polygon", "SOLVER.CHECKPOINT_PERIOD", "1", "OUTPUT_DIR", str(tmp_path))]
    main(parse_args(first))
    other = [word if word != spec("resumed_train", data["train"]) else spec("resumed_train", data["rle"])
             for word in first]
    with pytest.raises(ValueError) as refused:
        main(parse_args([*other, "--resume", "SOLVER.MAX_ITER", "4", "INPUT.MASK_FORMAT", "bitmask"]))
    assert str(refused.value).startswith(
        f"--resume: the run in {tmp_path} trained on 'resumed_train' from {data['train'][0]} (SHA-256 ")
    assert (f"but 'resumed_train' is now {data['rle'][0]} with other contents (SHA-256 " in str(refused.value)
            and str(refused.value).endswith("nothing was trained. Register 'resumed_train' from the same annotation "
                                            "file as before, or train on the new data into another output folder."))
    main(parse_args([*first, "--resume", "SOLVER.MAX_ITER", "3"]))  # the same file: resumed
    assert json.loads((tmp_path / "metrics.json").read_text().splitlines()[-1])["iteration"] == 2


def test_a_resume_on_its_annotation_file_written_again_with_the_same_contents_goes_on(data, tmp_path):
    # only re-indented (json.dump(..., indent=2)): refused as "other contents"
    from gwdet.checkpoint.resilient import CONTENTS_KEY, ResilientCheckpointer

    coco, json_file, root = _copy(data["train"], tmp_path)
    json_file.write_text(json.dumps(coco))
    compact = CocoDataset.parse(f"m={json_file}:{root}").inspected().read
    json_file.write_text(json.dumps(coco, indent=2))
    indented = CocoDataset.parse(f"m={json_file}:{root}").inspected().read
    assert compact.json_sha256 != indented.json_sha256 and compact.json_content_sha256 == indented.json_content_sha256
    coco["annotations"][0]["bbox"][0] += 1
    json_file.write_text(json.dumps(coco, indent=2))
    assert CocoDataset.parse(f"m={json_file}:{root}").inspected().read.json_content_sha256 != compact.json_content_sha256

    def record(contents):
        return {"m": {"json_file": str(json_file), "json_sha256": contents.json_sha256,
                      CONTENTS_KEY: contents.json_content_sha256}}
    checkpointer = ResilientCheckpointer(torch.nn.Linear(1, 1), str(tmp_path), training_data=record(indented))
    checkpointer._check_same_training_data(record(compact), str(tmp_path / "model_final.pth"))  # resumed
    saved = record(compact)
    saved["m"][CONTENTS_KEY] = "0" * 64  # other contents
    with pytest.raises(ValueError, match="with other contents"):
        checkpointer._check_same_training_data(saved, str(tmp_path / "model_final.pth"))


def test_a_resume_on_other_shapes_data_names_the_settings_that_generate_it(tmp_path):
    # "Register 'shapes_train' from the same annotation file as before": a name gwdet refuses to register
    from gwdet.checkpoint.resilient import ResilientCheckpointer

    checkpointer = ResilientCheckpointer(torch.nn.Linear(1, 1), str(tmp_path), training_data={
        "shapes_train": {"json_file": "/cache/shapes_seed1/train.json", "json_sha256": "b" * 64}})
    saved = {"shapes_train": {"json_file": "/cache/shapes_seed0/train.json", "json_sha256": "a" * 64}}
    with pytest.raises(ValueError) as refused:
        checkpointer._check_same_training_data(saved, str(tmp_path / "model_final.pth"))
    assert str(refused.value).endswith(
        "nothing was trained. Give the shapes settings the run trained with (DATASETS.SHAPES.*, a LazyConfig's "
        "dataloader.shapes.*: its config.yaml), which generate 'shapes_train', or train on the new data into another "
        "output folder.")
