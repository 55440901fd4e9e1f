"""PNGs of a model's predictions next to the ground truth, drawn with detectron2's Visualizer."""
from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.data import detection_utils
from PIL import Image

from gwdet.data.test_images import read_test_image

MIN_DRAWN_SIDE = 384


@torch.no_grad()
def save_prediction_pngs(
    cfg: Any, model: torch.nn.Module, dataset_name: str, num_images: int, out_dir: str,
    score_threshold: float = 0.5,
) -> list[str]:
    """Draw ground truth (left) and predictions above ``score_threshold`` (right) for the first
    ``num_images`` images of ``dataset_name``, each fed to the model as the test loader of ``cfg``
    (yacs or LazyConfig) feeds it (:func:`gwdet.data.test_images.read_test_image`); return the
    written paths."""
    # detectron2's Visualizer needs OpenCV: imported only when drawings are asked for.
    from detectron2.utils.visualizer import Visualizer

    os.makedirs(out_dir, exist_ok=True)
    metadata = MetadataCatalog.get(dataset_name)
    was_training = model.training
    model.eval()
    paths = []
    try:
        for record in DatasetCatalog.get(dataset_name)[:num_images]:
            rgb = detection_utils.read_image(record["file_name"], format="RGB")
            height, width = rgb.shape[:2]
            instances = model([read_test_image(cfg, record["file_name"])])[0]["instances"].to("cpu")
            instances = instances[instances.scores >= score_threshold]
            scale = max(1.0, MIN_DRAWN_SIDE / min(height, width))  # small images get enlarged
            truth = Visualizer(rgb, metadata, scale=scale).draw_dataset_dict(record).get_image()
            predicted = Visualizer(rgb, metadata, scale=scale).draw_instance_predictions(instances).get_image()
            path = os.path.join(out_dir, os.path.splitext(os.path.basename(record["file_name"]))[0] + ".png")
            Image.fromarray(np.concatenate([truth, predicted], axis=1)).save(path)
            paths.append(path)
    finally:
        model.train(was_training)
    return paths
