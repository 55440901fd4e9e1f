"""Your own COCO-format data without code: ``--register-coco NAME=JSON:IMAGE_ROOT`` on
tools/train_net.py and tools/compare_norms.py, trained and evaluated on a COCO JSON written here,
and each way the files or the config can be wrong refused on one line naming the file or key."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from detectron2.data import DatasetCatalog, MetadataCatalog
from PIL import Image

from gwdet.data import (CocoDataset, DatasetError, check_config_against_datasets, register_coco_datasets,
                        register_datasets)
from gwdet.data.coco_registration import ENVIRONMENT_VARIABLE, registered_coco_dataset
from gwdet.engine.trainer import build_config, parse_args, setup

from conftest import DEMO_CONFIG, REPO, TINY_OPTS

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
    assert list(results) == ["mine_val"]
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
    no_annotations = tmp_path / "no_annotations.json"
    no_annotations.write_text(json.dumps({"images": [], "categories": CATEGORIES}))
    cases = {
        "a missing json": (f"m={tmp_path / 'nope.json'}:{images}", ["'m'", "nope.json", "does not exist"]),
        "invalid json": (f"m={broken}:{images}", ["broken.json", "not valid JSON", "line 3, column 1"]),
        "no annotations": (f"m={no_annotations}:{images}", ["no_annotations.json", "has no 'annotations'"]),
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
        setup(parse_args(argv))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and ": error: " in err, err
    assert not (tmp_path / "out" / "config.yaml").exists(), "refused before anything of the run is written"
    return err


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
    cfg.MODEL.META_ARCHITECTURE = "RetinaNet"
    with pytest.raises(DatasetError, match="MODEL.RETINANET.NUM_CLASSES is 80.*MODEL.RETINANET.NUM_CLASSES 2"):
        check_config_against_datasets(cfg)
    cfg.MODEL.RETINANET.NUM_CLASSES = 2
    check_config_against_datasets(cfg)


def test_the_environment_variable_registers_what_the_config_names(data, tmp_path, monkeypatch):
    """$GWDET_REGISTER_COCO: how processes started by a tool (study cells, jobs) get the datasets."""
    unused = spec("env_unused", (tmp_path / "nope.json", tmp_path))
    monkeypatch.setenv(ENVIRONMENT_VARIABLE, json.dumps([spec("env_train", data["train"]), unused]))
    cfg = build_config(str(DEMO_CONFIG), tiny("DATASETS.TRAIN", "('env_train',)", "DATASETS.TEST", "()",
                                              "MODEL.ROI_HEADS.NUM_CLASSES", "2", "INPUT.MASK_FORMAT", "polygon"))
    register_datasets(cfg)
    assert registered_coco_dataset("env_train") is not None and registered_coco_dataset("env_unused") is None
    monkeypatch.setenv(ENVIRONMENT_VARIABLE, "env_train=a.json:images")
    with pytest.raises(DatasetError, match="GWDET_REGISTER_COCO must be a JSON list"):
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
    assert json.loads(os.environ[ENVIRONMENT_VARIABLE]) == \
        [registered_coco_dataset(name).spec for name in ("study_train", "study_val")]
    results = json.loads((tmp_path / "runs" / "gn-s0" / "results.json").read_text())
    assert list(results) == ["study_val"] and "AP" in results["study_val"]["bbox"]
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
