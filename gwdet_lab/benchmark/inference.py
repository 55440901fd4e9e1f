"""The inference level: the demo model's per-image evaluation time with GW and with GN, and the
GW layer in evaluation mode against training mode.

Demo model: ``configs/Demo/mask_rcnn_R_50_FPN_gw_shapes.yaml`` as configured (GW at S1-B2 of the
backbone, in FPN, box and mask heads), and the same config with GN at every norm key (the GW
positions included; :func:`gwdet_lab.analysis.propagation.norm_overrides`). Both are randomly
initialised with seed 0 (no weights loaded) and run through detectron2's ``DefaultPredictor``, one
image per call as a user's inference does (resize, forward, post-processing with mask pasting), on
the first 4 images (1 with ``--quick``) of the demo's validation split, drawn in memory by
:func:`gwdet.data.shapes.render_image`. A random model's detections differ between the two, and so
does the mask head's work: the table gives the detections per image beside the time.

GW layer: GW (ItN, g=64, T=5) at the layer level's shapes, timed in interleaved rounds:
evaluation mode under ``torch.inference_mode`` (forward only), training mode forward (autograd
records the graph) and training mode forward + backward. GW has no running statistics, so both
modes compute the same function (GW paper, Sec. 3); what differs is what autograd keeps.
"""
from __future__ import annotations

import argparse
import statistics
from typing import TYPE_CHECKING, Callable, List, Tuple

import torch
from torch import nn

from gwdet_lab.tables import Column, Table
from gwdet_lab.benchmark.cases import GW_GROUPS, GW_T, format_shape, group_whitening
from gwdet_lab.benchmark.layer_level import layer_shapes
from gwdet_lab.benchmark.measure import call_times, median_ratio, timed_rounds, training_call
from gwdet_lab.benchmark.model_level import count_group_whitening, detector_config
from gwdet_lab.benchmark.progress import Progress

if TYPE_CHECKING:
    import numpy as np
    from detectron2.config import CfgNode
    from detectron2.engine import DefaultPredictor

DEMO_CONFIG = "configs/Demo/mask_rcnn_R_50_FPN_gw_shapes.yaml"
DEMO_IMAGES = 4
QUICK_DEMO_IMAGES = 1
GW_NAME = "demo, GW (as configured)"
GN_NAME = "demo, GN in place of GW"
DEMO_NORMS = [(GW_NAME, "config"), (GN_NAME, "GN")]

EVAL = "eval forward"
TRAIN_FORWARD = "train forward"
TRAIN_STEP = "train forward + backward"
MODES = (EVAL, TRAIN_FORWARD, TRAIN_STEP)


def demo_images(cfg: CfgNode, count: int) -> List[np.ndarray]:
    """The first ``count`` images of the demo's validation split, as ``DefaultPredictor`` takes
    them (H x W x 3 uint8, BGR)."""
    from gwdet.data.shapes import ShapesSpec, render_image

    spec = ShapesSpec.from_config(cfg)
    return [render_image(spec.seed, "val", index, spec.image_size)[0][:, :, ::-1] for index in range(count)]


def demo_predictor(norm: str, device: torch.device) -> Tuple[DefaultPredictor, CfgNode]:
    """detectron2's ``DefaultPredictor`` of the demo config with ``norm`` everywhere (``"config"``:
    as configured), randomly initialised with seed 0, and its config."""
    from detectron2.engine import DefaultPredictor

    from gwdet_lab.analysis.propagation import norm_overrides

    cfg = detector_config(DEMO_CONFIG, device, norm_overrides(norm))
    torch.manual_seed(0)
    return DefaultPredictor(cfg), cfg


def detection_pass(predictor: DefaultPredictor, images: List[np.ndarray], detections: List[int]) -> Callable[[], None]:
    """One pass of ``predictor`` over ``images``, which leaves the number of detections per image in
    ``detections``. A function of its own, so that the pass holds its own predictor and images rather
    than a loop's variables."""

    def evaluate_all() -> None:
        detections[:] = [len(predictor(image)["instances"]) for image in images]

    return evaluate_all


def run_demo(args: argparse.Namespace, device: torch.device, progress: Progress) -> dict:
    """``{"config", "image_size", "images", "rows": [{"name", "norm", "seconds", "detections", "gw_layers"}]}``;
    ``seconds`` per image: the median over ``--model-repeats`` passes over the images (after
    ``--model-warmup`` passes) of the pass's time divided by the number of images."""
    rows = []
    image_size = None
    count = QUICK_DEMO_IMAGES if args.quick else DEMO_IMAGES
    for name, norm in DEMO_NORMS:
        predictor, cfg = demo_predictor(norm, device)
        images = demo_images(cfg, count)
        image_size = cfg.DATASETS.SHAPES.IMAGE_SIZE
        detections: List[int] = []
        evaluate_all = detection_pass(predictor, images, detections)
        times = call_times(evaluate_all, device, args.model_warmup, args.model_repeats, args.clock)
        seconds = statistics.median(times) / len(images)
        rows.append({"name": name, "norm": norm, "seconds": seconds, "detections": statistics.mean(detections),
                     "gw_layers": count_group_whitening(predictor.model)})
        progress.step(f"inference {name}", f"{seconds * 1e3:.1f} ms/image")
    return {"config": DEMO_CONFIG, "image_size": image_size, "images": count, "rows": rows}


def eval_call(module: nn.Module, x: torch.Tensor) -> Callable[[], None]:
    """Forward of ``module`` in evaluation mode under ``torch.inference_mode``."""

    def call() -> None:
        with torch.inference_mode():
            module(x)

    return call


def forward_call(module: nn.Module, x: torch.Tensor) -> Callable[[], None]:
    """Forward of ``module`` with autograd recording (``x`` requires grad); the graph is dropped."""

    def call() -> None:
        module(x)

    return call


def run_gw_modes(args: argparse.Namespace, device: torch.device, progress: Progress) -> dict:
    """``{"shapes", "rounds", "time"}``, the last two keyed by ``(shape, mode)`` for every mode of :data:`MODES`."""
    results: dict = {"shapes": layer_shapes(args.quick), "rounds": {}, "time": {}}
    for _, shape in results["shapes"]:
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(shape, generator=generator).to(device)
        grad = torch.randn(shape, generator=generator).to(device)
        torch.manual_seed(0)
        evaluating = group_whitening(shape[1]).to(device).eval()
        training = group_whitening(shape[1]).to(device).train()
        x_train = x.clone().requires_grad_()
        calls = {
            EVAL: eval_call(evaluating, x),
            TRAIN_FORWARD: forward_call(training, x_train),
            TRAIN_STEP: training_call(training, x_train, grad),
        }
        rounds = timed_rounds(calls, device, args.warmup, args.repeats, args.clock)
        for mode in MODES:
            results["rounds"][(shape, mode)] = rounds[mode]
            results["time"][(shape, mode)] = statistics.median(rounds[mode])
        progress.step(f"GW eval/train {tuple(shape)}", f"{results['time'][(shape, EVAL)] * 1e3:.2f} ms eval")
    return results


def run_inference(args: argparse.Namespace, device: torch.device) -> dict:
    """``{"demo": run_demo(...), "gw": run_gw_modes(...)}``."""
    progress = Progress([1.0] * (len(DEMO_NORMS) + len(layer_shapes(args.quick))))
    return {"demo": run_demo(args, device, progress), "gw": run_gw_modes(args, device, progress)}


def demo_table(demo: dict) -> Table:
    """Per demo variant: GW layers, ms per image, detections per image; and the ratio to GN."""
    by_name = {row["name"]: row for row in demo["rows"]}
    table = Table([
        Column("name", "model"), Column("gw_layers", "GW layers", align_right=True),
        Column("seconds", "ms / image", lambda s: f"{s * 1e3:.1f}", align_right=True),
        Column("detections", "detections / image", "{:.1f}", align_right=True),
        Column("ratio", "time / GN's", "{:.3f}", align_right=True),
    ])
    for row in demo["rows"]:
        table.add({key: row[key] for key in ("name", "gw_layers", "seconds", "detections")}
                  | {"ratio": row["seconds"] / by_name[GN_NAME]["seconds"]})
    return table


def gw_modes_table(gw: dict) -> Table:
    """Per shape: median ms of each mode, and evaluation over training time (median over rounds)."""
    rounds, times = gw["rounds"], gw["time"]
    table = Table([
        Column("shape"), *(Column(mode, f"{mode} (ms)", lambda s: f"{s * 1e3:.2f}", align_right=True) for mode in MODES),
        Column("eval_forward", f"{EVAL} / {TRAIN_FORWARD}", "{:.3f}", align_right=True),
        Column("eval_step", f"{EVAL} / {TRAIN_STEP}", "{:.3f}", align_right=True),
    ])
    for _, shape in gw["shapes"]:
        table.add({
            "shape": format_shape(shape), **{mode: times[(shape, mode)] for mode in MODES},
            "eval_forward": median_ratio(rounds[(shape, EVAL)], rounds[(shape, TRAIN_FORWARD)]),
            "eval_step": median_ratio(rounds[(shape, EVAL)], rounds[(shape, TRAIN_STEP)]),
        })
    return table


def inference_tables(results: dict) -> str:
    """The inference level's markdown: the demo model, then the GW layer's modes."""
    demo = results["demo"]
    return "\n".join([
        "#### Inference: the demo Mask R-CNN, per image", "",
        f"`{demo['config']}` as configured and with GN at every norm key, randomly initialised (seed 0); "
        f"detectron2's DefaultPredictor on the first {demo['images']} validation images "
        f"({demo['image_size']}x{demo['image_size']}), one image per call; median over passes of the time "
        "per image.", "",
        demo_table(demo).markdown(), "",
        f"#### Inference: GW (itn, g={GW_GROUPS}, T={GW_T}) in evaluation mode against training mode", "",
        "Median ms over rounds; evaluation mode runs under torch.inference_mode; the ratios are medians "
        "over rounds of the evaluation time divided by the training time in the same round.", "",
        gw_modes_table(results["gw"]).markdown(),
    ]) + "\n"
