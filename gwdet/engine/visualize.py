"""PNGs of a model's predictions next to the ground truth, drawn with detectron2's Visualizer."""
from __future__ import annotations

import os

import numpy as np
import torch
from detectron2.config import CfgNode
from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.data import detection_utils
from detectron2.data.transforms import ResizeShortestEdge
from PIL import Image

MIN_DRAWN_SIDE = 384


@torch.no_grad()
def save_prediction_pngs(
    cfg: CfgNode, model: torch.nn.Module, dataset_name: str, num_images: int, out_dir: str,
    score_threshold: float = 0.5,
) -> list[str]:
    """Draw ground truth (left) and predictions above ``score_threshold`` (right) for the first
    ``num_images`` images of ``dataset_name``; return the written paths."""
    # detectron2's Visualizer needs OpenCV: imported only when drawings are asked for.
    from detectron2.utils.visualizer import Visualizer

    os.makedirs(out_dir, exist_ok=True)
    metadata = MetadataCatalog.get(dataset_name)
    resize = ResizeShortestEdge([cfg.INPUT.MIN_SIZE_TEST] * 2, cfg.INPUT.MAX_SIZE_TEST)
    was_training = model.training
    model.eval()
    paths = []
    try:
        for record in DatasetCatalog.get(dataset_name)[:num_images]:
            rgb = detection_utils.read_image(record["file_name"], format="RGB")
            model_input = rgb[:, :, ::-1] if cfg.INPUT.FORMAT == "BGR" else rgb
            resized = resize.get_transform(model_input).apply_image(model_input)
            tensor = torch.as_tensor(np.ascontiguousarray(resized.transpose(2, 0, 1)))
            height, width = rgb.shape[:2]
            instances = model([{"image": tensor, "height": height, "width": width}])[0]["instances"].to("cpu")
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
