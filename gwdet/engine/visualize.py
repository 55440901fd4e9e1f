"""PNGs of a model's predictions next to the ground truth, drawn with detectron2's Visualizer, each
half under a caption band that says what it shows: "ground truth", and "predictions, score >= T"
with the score threshold T of the drawn predictions."""
from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
import torch
from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.data import detection_utils
from PIL import Image, ImageDraw, ImageFont

from gwdet.data.test_images import read_test_image

MIN_DRAWN_SIDE = 384
CAPTION_PADDING = 6
TRUTH_CAPTION = "ground truth"


def predictions_caption(score_threshold: float) -> str:
    """The caption of the predictions' half: which scores it shows."""
    return f"predictions, score >= {score_threshold:g}"


def _caption_font(size: int) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    """Pillow's default font at ``size`` pixels; Pillow < 10.1 has it at one size only."""
    try:
        return ImageFont.load_default(size=size)
    except TypeError:
        return ImageFont.load_default()


def captioned(image: np.ndarray, caption: str) -> np.ndarray:
    """``image`` (uint8 HxWx3) below a white band holding ``caption`` in black."""
    font = _caption_font(max(12, image.shape[0] // 24))
    left, top, right, bottom = ImageDraw.Draw(Image.new("RGB", (1, 1))).textbbox((0, 0), caption, font=font)
    band = Image.new("RGB", (image.shape[1], math.ceil(bottom) + 2 * CAPTION_PADDING), "white")
    ImageDraw.Draw(band).text((CAPTION_PADDING - left, CAPTION_PADDING), caption, fill="black", font=font)
    return np.concatenate([np.asarray(band), image], axis=0)


def side_by_side(truth: np.ndarray, predicted: np.ndarray, score_threshold: float) -> np.ndarray:
    """The ground-truth drawing (left) and the prediction drawing (right), each under its caption."""
    return np.concatenate([captioned(truth, TRUTH_CAPTION),
                           captioned(predicted, predictions_caption(score_threshold))], axis=1)


@torch.no_grad()
def save_prediction_pngs(
    cfg: Any, model: torch.nn.Module, dataset_name: str, num_images: int, out_dir: str,
    score_threshold: float = 0.5,
) -> list[str]:
    """Draw ground truth (left) and predictions scoring at least ``score_threshold`` (right), each
    under its caption (:func:`side_by_side`), for the first ``num_images`` images of
    ``dataset_name``, each fed to the model as the test loader of ``cfg`` (yacs or LazyConfig)
    feeds it (:func:`gwdet.data.test_images.read_test_image`); return the written paths."""
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
            Image.fromarray(side_by_side(truth, predicted, score_threshold)).save(path)
            paths.append(path)
    finally:
        model.train(was_training)
    return paths
