"""The headline chain end to end, as a user runs it on COCO, shrunk to seconds:

ImageNet torchvision-layout ResNeXt-101 32x8d with GW at S1-B2 (random weights, the GW authors'
module layout) -> tools/convert_pretrained.py -> tools/train_net.py --config configs/mask_rcnn_gw.yaml
on a COCO-layout dataset under DETECTRON2_DATASETS (polygons, COCO's 80 category ids) ->
COCOEvaluator -> --eval-only from the trained checkpoint, which must give the same detections.
"""
import json
import os
import subprocess
import sys

import numpy as np
import torch
import torchvision
from detectron2.data.datasets.builtin_meta import COCO_CATEGORIES
from PIL import Image, ImageDraw

from conftest import REPO, with_statistics
from test_convert import AuthorsGroupWhitening

SIZE = 64
OVERRIDES = [
    "MODEL.DEVICE", "cpu", "INPUT.MIN_SIZE_TRAIN", f"({SIZE},)", "INPUT.MAX_SIZE_TRAIN", str(SIZE),
    "INPUT.MIN_SIZE_TEST", str(SIZE), "INPUT.MAX_SIZE_TEST", str(SIZE), "SOLVER.IMS_PER_BATCH", "2",
    "SOLVER.MAX_ITER", "2", "SOLVER.WARMUP_ITERS", "1", "SOLVER.STEPS", "()", "DATALOADER.NUM_WORKERS", "0",
    "MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE", "32", "MODEL.RPN.POST_NMS_TOPK_TRAIN", "64",
    "MODEL.RPN.POST_NMS_TOPK_TEST", "32", "TEST.DETECTIONS_PER_IMAGE", "20",
    "MODEL.ROI_HEADS.SCORE_THRESH_TEST", "0.0",
]


def authors_gw_resnext101(path) -> None:
    """torchvision's resnext101_32x8d with the GW authors' GW modules at S1-B2, saved as they ship it."""
    torch.manual_seed(0)
    model = torchvision.models.resnext101_32x8d(weights=None)
    model.bn1 = AuthorsGroupWhitening(model.bn1.num_features)
    for layer in (model.layer1, model.layer2, model.layer3, model.layer4):
        for block in layer:
            block.bn2 = AuthorsGroupWhitening(block.bn2.num_features)
    torch.save(with_statistics(model).state_dict(), path)


def coco_layout_dataset(root, split: str, count: int, seed: int) -> None:
    """``root/coco/{split}2017/*.jpg`` and ``annotations/instances_{split}2017.json`` with polygons."""
    rng = np.random.default_rng(seed)
    images_dir = root / "coco" / f"{split}2017"
    images_dir.mkdir(parents=True)
    things = [c for c in COCO_CATEGORIES if c["isthing"]]
    images, annotations = [], []
    for index in range(count):
        image = Image.new("RGB", (SIZE, SIZE), tuple(int(v) for v in rng.integers(0, 80, 3)))
        draw = ImageDraw.Draw(image)
        for _ in range(2):
            x0, y0 = (int(v) for v in rng.integers(2, SIZE // 2, 2))
            x1, y1 = x0 + int(rng.integers(12, SIZE // 2)), y0 + int(rng.integers(12, SIZE // 2))
            draw.rectangle([x0, y0, x1, y1], fill=tuple(int(v) for v in rng.integers(120, 255, 3)))
            annotations.append({
                "id": len(annotations) + 1, "image_id": index + 1, "category_id": things[index % 3]["id"],
                "bbox": [x0, y0, x1 - x0, y1 - y0], "area": float((x1 - x0) * (y1 - y0)), "iscrowd": 0,
                "segmentation": [[x0, y0, x1, y0, x1, y1, x0, y1]],
            })
        name = f"{index:012d}.jpg"
        image.save(images_dir / name)
        images.append({"id": index + 1, "file_name": name, "height": SIZE, "width": SIZE})
    categories = [{"id": c["id"], "name": c["name"], "supercategory": "thing"} for c in things]
    (root / "coco" / "annotations").mkdir(exist_ok=True)
    with open(root / "coco" / "annotations" / f"instances_{split}2017.json", "w") as f:
        json.dump({"images": images, "annotations": annotations, "categories": categories}, f)


def run(*args: str, env=None) -> str:
    result = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True,
                            timeout=900, env=env)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return result.stdout + result.stderr


def test_imagenet_weights_to_coco_evaluation_and_back(tmp_path):
    source, weights = tmp_path / "resnext101_32x8d_gw.pth", tmp_path / "X-101-32x8d-GW.pkl"
    authors_gw_resnext101(source)
    report = run("tools/convert_pretrained.py", str(source), str(weights), "--arch", "X-101-32x8d",
                 "--gw-positions", "S1-B2")
    assert "X-101-32x8d" in report and weights.is_file()
    source.unlink()

    datasets = tmp_path / "datasets"
    coco_layout_dataset(datasets, "train", 4, seed=0)
    coco_layout_dataset(datasets, "val", 2, seed=1)
    env = {**os.environ, "DETECTRON2_DATASETS": str(datasets), "OMP_NUM_THREADS": "1"}
    output = tmp_path / "run"
    common = ["tools/train_net.py", "--config", "configs/mask_rcnn_gw.yaml", *OVERRIDES, "OUTPUT_DIR", str(output)]
    log = run(*common, "MODEL.WEIGHTS", str(weights), env=env)
    assert "Evaluation results for bbox" in log and "Evaluation results for segm" in log
    missing = log.split("not found in the checkpoint:", 1)[-1].split("\n[", 1)[0] if "not found in the checkpoint" in log else ""
    assert "roi_heads" in missing and "bottom_up" not in missing, "every backbone weight came from ImageNet"
    trained = json.loads((output / "results.json").read_text())
    detections = output / "inference" / "coco_2017_val" / "coco_instances_results.json"
    after_training = json.loads(detections.read_text())
    assert after_training, "the trained model detects something to compare"

    run(*common, "--eval-only", "MODEL.WEIGHTS", str(output / "model_final.pth"), env=env)
    assert json.loads((output / "results.json").read_text()) == trained
    assert json.loads(detections.read_text()) == after_training
