"""PNGs of a model's predictions next to the ground truth, drawn with detectron2's Visualizer, each
half under a caption band that says what it shows: "ground truth", and "predictions, score >= T"
with the score threshold T of the drawn predictions. Both bands have the height of the taller one,
so the halves line up for any image size. Each drawing is named after its image's path below the
folder the drawn images share (``a/x.jpg`` -> ``a__x.png``), so images of the same name in other
folders get drawings of their own."""
from __future__ import annotations

import functools
import math
import os
from typing import Any, Sequence

import numpy as np
import torch
from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.data import detection_utils
from PIL import Image, ImageDraw, ImageFont
from PIL.PngImagePlugin import PngInfo

from gwdet.data.test_images import read_test_image
from gwdet.utils.atomic import write_atomically

MIN_DRAWN_SIDE = 384
CAPTION_PADDING = 6
TRUTH_CAPTION = "ground truth"
FOLDER_SEPARATOR = "__"  # stands for "/" in a drawing's name
# The PNG text chunk every drawing carries, by which a run's folder tells its drawings from the user's
# own pictures (gwdet.engine.output_dir: --overwrite deletes the run's drawings only).
DRAWING_KEY = "Software"
DRAWING_MARK = "gwdet prediction drawing"


def predictions_caption(score_threshold: float) -> str:
    """The caption of the predictions' half: which scores it shows."""
    return f"predictions, score >= {score_threshold:g}"


def _caption_font(size: int) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    """Pillow's default font at ``size`` pixels; Pillow < 10.1 has it at one size only."""
    try:
        return ImageFont.load_default(size=size)
    except TypeError:
        return ImageFont.load_default()


def _caption_layout(image: np.ndarray, caption: str) -> tuple[ImageFont.ImageFont | ImageFont.FreeTypeFont, float, int]:
    """The font of ``caption`` over ``image`` (its size follows the image's height), the text's left
    offset, and the height of the band it needs."""
    font = _caption_font(max(12, image.shape[0] // 24))
    left, top, right, bottom = ImageDraw.Draw(Image.new("RGB", (1, 1))).textbbox((0, 0), caption, font=font)
    return font, left, math.ceil(bottom) + 2 * CAPTION_PADDING


def captioned(image: np.ndarray, caption: str, band_height: int = 0) -> np.ndarray:
    """``image`` (uint8 HxWx3) below a white band holding ``caption`` in black; the band is as high
    as the caption needs, or ``band_height`` where that is more."""
    font, left, height = _caption_layout(image, caption)
    band = Image.new("RGB", (image.shape[1], max(height, band_height)), "white")
    ImageDraw.Draw(band).text((CAPTION_PADDING - left, CAPTION_PADDING), caption, fill="black", font=font)
    return np.concatenate([np.asarray(band), image], axis=0)


def _padded_to(panel: np.ndarray, height: int) -> np.ndarray:
    """``panel`` with white rows below it up to ``height``."""
    return np.pad(panel, ((0, height - panel.shape[0]), (0, 0), (0, 0)), constant_values=255)


def side_by_side(truth: np.ndarray, predicted: np.ndarray, score_threshold: float) -> np.ndarray:
    """The ground-truth drawing (left) and the prediction drawing (right), each under its caption,
    in bands of one height (the taller caption's: the two captions' texts can need heights a pixel
    apart); a drawing shorter than the other is padded below with white."""
    halves = ((truth, TRUTH_CAPTION), (predicted, predictions_caption(score_threshold)))
    band = max(_caption_layout(image, caption)[2] for image, caption in halves)
    panels = [captioned(image, caption, band) for image, caption in halves]
    height = max(panel.shape[0] for panel in panels)
    return np.concatenate([_padded_to(panel, height) for panel in panels], axis=1)


def drawing_names(file_names: Sequence[str]) -> list[str]:
    """A distinct PNG name for the drawing of each image of ``file_names``: its path below the
    folder the images share, without its extension, folders joined by :data:`FOLDER_SEPARATOR`
    (``a/x.jpg`` -> ``a__x.png``; the images of one folder keep their names), ``-2``, ``-3``, ...
    added where two names would still be the same (``x.jpg`` and ``x.png``; letter case ignored)."""
    paths = [os.path.abspath(name) for name in file_names]
    shared = os.path.commonpath([os.path.dirname(path) for path in paths]) if paths else ""
    names: list[str] = []
    taken: set[str] = set()
    for path in paths:
        stem = os.path.splitext(os.path.relpath(path, shared))[0].replace(os.sep, FOLDER_SEPARATOR)
        name, repeat = f"{stem}.png", 1
        while name.lower() in taken:
            repeat += 1
            name = f"{stem}-{repeat}.png"
        taken.add(name.lower())
        names.append(name)
    return names


def is_prediction_drawing(path: str) -> bool:
    """Whether the file ``path`` is a drawing :func:`save_prediction_pngs` wrote: a ``.png`` name
    (:func:`drawing_names`) and the PNG text :data:`DRAWING_KEY` = :data:`DRAWING_MARK`, or an empty
    ``.png`` (nothing to lose). Any other file, a PNG of the user's included, is not a drawing."""
    if not path.endswith(".png") or os.path.islink(path) or not os.path.isfile(path):
        return False
    try:
        if os.path.getsize(path) == 0:
            return True
        with Image.open(path) as image:
            return image.format == "PNG" and image.info.get(DRAWING_KEY) == DRAWING_MARK
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        return False


def drawings_asked(dataset_name: str, num_images: int) -> int:
    """How many drawings :func:`save_prediction_pngs` makes of the first ``num_images`` images of
    ``dataset_name``: fewer than ``num_images`` where the dataset holds fewer images."""
    return len(DatasetCatalog.get(dataset_name)[:num_images]) if num_images > 0 else 0


def drawings_in(out_dir: str) -> int:
    """How many drawings (:func:`is_prediction_drawing`, not empty) ``out_dir`` holds, its
    subfolders left out."""
    if not os.path.isdir(out_dir):
        return 0
    paths = [os.path.join(out_dir, name) for name in os.listdir(out_dir)]
    return sum(1 for path in paths if is_prediction_drawing(path) and os.path.getsize(path) > 0)


# The score from which predictions are drawn (a model's test threshold above it takes its place).
DRAWN_SCORE = 0.5


@torch.no_grad()
def save_prediction_pngs(
    cfg: Any, model: torch.nn.Module, dataset_name: str, num_images: int, out_dir: str,
    score_threshold: float = DRAWN_SCORE,
) -> list[str]:
    """Draw ground truth (left) and predictions scoring at least ``score_threshold`` (right), each
    under its caption (:func:`side_by_side`), for the first ``num_images`` images of
    ``dataset_name``, each fed to the model as the test loader of ``cfg`` (yacs or LazyConfig)
    feeds it (:func:`gwdet.data.test_images.read_test_image`), each under its own name
    (:func:`drawing_names`) and marked as a drawing (:func:`is_prediction_drawing`); return the
    written paths."""
    # detectron2's Visualizer needs OpenCV: imported only when drawings are asked for.
    from detectron2.utils.visualizer import Visualizer

    os.makedirs(out_dir, exist_ok=True)
    metadata = MetadataCatalog.get(dataset_name)
    was_training = model.training
    model.eval()
    paths = []
    try:
        records = DatasetCatalog.get(dataset_name)[:num_images]
        for record, name in zip(records, drawing_names([record["file_name"] for record in records]), strict=True):
            rgb = detection_utils.read_image(record["file_name"], format="RGB")
            height, width = rgb.shape[:2]
            instances = model([read_test_image(cfg, record["file_name"])])[0]["instances"].to("cpu")
            instances = instances[instances.scores >= score_threshold]
            scale = max(1.0, MIN_DRAWN_SIDE / min(height, width))  # small images get enlarged
            truth = Visualizer(rgb, metadata, scale=scale).draw_dataset_dict(record).get_image()
            predicted = Visualizer(rgb, metadata, scale=scale).draw_instance_predictions(instances).get_image()
            path = os.path.join(out_dir, name)
            drawing = Image.fromarray(side_by_side(truth, predicted, score_threshold))
            mark = PngInfo()
            mark.add_text(DRAWING_KEY, DRAWING_MARK)
            write_atomically(path, functools.partial(drawing.save, format="PNG", pnginfo=mark))  # a full disk: one error
            paths.append(path)
    finally:
        model.train(was_training)
    return paths
