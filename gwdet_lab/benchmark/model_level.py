"""The model level: one training step of Faster R-CNN R-50-FPN with each norm placement.

A step is forward, losses, backward and an SGD step on 2 synthetic images of ``--image-size``
squared pixels with 3 random boxes each, of a model built from the repository's configs with
:func:`gwdet.model_zoo.build_config` and :func:`gwdet.build_model` (no weights loaded), with
``--model-opts`` applied (default :data:`DEFAULT_MODEL_OPTS`). The random seed is reset before
every step and the SGD step uses learning rate 0, so every repeat does the same work on the same
proposals. On CPU one more profiled step gives the share of a step spent in GW layers.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Set, Tuple

import torch
from torch import nn

from gwdet.errors import GwdetValueError
from gwdet_lab.tables import Column, Table
from gwdet_lab.benchmark.cases import verdict
from gwdet_lab.benchmark.measure import median_time, peak_memory
from gwdet_lab.benchmark.progress import Progress

if TYPE_CHECKING:
    from detectron2.config import CfgNode

REPO = Path(__file__).resolve().parents[2]

MODELS: List[Tuple[str, str]] = [
    ("FrozenBN", "configs/COCO-Detection/faster_rcnn_R_50_FPN_1x_bn.yaml"),
    ("FrozenBN + GW at S1-B2", "configs/COCO-Detection/faster_rcnn_R_50_FPN_1x_gw.yaml"),
    ("GN everywhere", "configs/Scratch/faster_rcnn_R_50_FPN_gn.yaml"),
    ("GW everywhere", "configs/Scratch/faster_rcnn_R_50_FPN_gw.yaml"),
]
# Config overrides for every model. detectron2's default adaptive ROIAlign sampling
# (POOLER_SAMPLING_RATIO 0: ceil(box size / output size) points per bin) makes the CPU cost of
# ROIAlign's backward depend on the sizes of the sampled proposals, which differ between randomly
# initialised models and between steps; it varied a step of the same FrozenBN model by more than
# the cost of all its GW layers. A fixed sampling ratio makes every model do the same pooling work.
DEFAULT_MODEL_OPTS = ["MODEL.ROI_BOX_HEAD.POOLER_SAMPLING_RATIO", "2"]
# (numerator, denominator, largest allowed ratio) of training-step times
MODEL_TARGETS = [
    ("FrozenBN + GW at S1-B2", "FrozenBN", 1.05),
    ("GW everywhere", "GN everywhere", 1.10),
]
AMP_DTYPES = {"none": None, "fp16": torch.float16, "bf16": torch.bfloat16}
GW_OPS = ("gwdet::group_whitening", "gwdet::group_whitening_backward")
BOXES_PER_IMAGE = 3
CLASSES = 80


def detector_config(config: str, device: torch.device, opts: List[str]) -> CfgNode:
    """The config ``config`` (relative to the repository) for ``device``, no weights, ``opts`` applied."""
    import gwdet  # noqa: F401  (registers gwdet's norms and backbones)
    from gwdet.model_zoo import build_config

    return build_config(str(REPO / config), ["MODEL.DEVICE", str(device), "MODEL.WEIGHTS", "", *opts])


def build_detector(config: str, device: torch.device, opts: List[str]) -> Tuple[nn.Module, torch.optim.Optimizer]:
    """The detectron2 model of :func:`detector_config`, randomly initialised with seed 0, and its
    training optimizer (:func:`gwdet.build_optimizer`: the config's SGD, momentum and weight decays)
    at learning rate 0, so that a step does the optimizer's work but repeated steps see one model."""
    from gwdet import build_model
    from gwdet.solver import build_optimizer

    cfg = detector_config(config, device, opts)
    torch.manual_seed(0)
    model = build_model(cfg)
    cfg.defrost()
    cfg.SOLVER.BASE_LR = 0.0
    return model, build_optimizer(cfg, model)


def synthetic_batch(size: int, images: int = 2) -> list:
    """detectron2 training inputs: ``images`` noise images with :data:`BOXES_PER_IMAGE` random boxes."""
    from detectron2.structures import Boxes, Instances

    generator = torch.Generator().manual_seed(0)
    batch = []
    for _ in range(images):
        corner = torch.rand(BOXES_PER_IMAGE, 2, generator=generator) * size * 0.5
        extent = torch.rand(BOXES_PER_IMAGE, 2, generator=generator) * size * 0.4 + 16
        instances = Instances((size, size))
        instances.gt_boxes = Boxes(torch.cat([corner, (corner + extent).clamp(max=size - 1)], dim=1))
        instances.gt_classes = torch.randint(0, CLASSES, (BOXES_PER_IMAGE,), generator=generator)
        image = torch.randint(0, 256, (3, size, size), generator=generator, dtype=torch.uint8)
        batch.append({"image": image, "instances": instances, "height": size, "width": size})
    return batch


def count_group_whitening(model: nn.Module) -> int:
    """GroupWhitening layers in ``model``."""
    return sum(type(module).__name__ == "GroupWhitening" for module in model.modules())


def gw_share(step: Callable[[], None]) -> float:
    """Fraction of one profiled training step's CPU time spent in GroupWhitening's forward and
    backward (the profiler's own overhead inflates both a little)."""
    from torch.profiler import ProfilerActivity, profile

    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    total = time.perf_counter() - start
    inside = sum(event.cpu_time_total for event in prof.key_averages() if event.key in GW_OPS)
    return inside * 1e-6 / total


def selected_models(names: Optional[List[str]]) -> List[Tuple[str, str]]:
    """``(name, config)`` of :data:`MODELS` that ``--model-names`` asks for (all by default)."""
    return [(name, path) for name, path in MODELS if names is None or name in names]


def check_models(args: argparse.Namespace, device: torch.device) -> None:
    """Build each model :func:`run_models` measures once, before any level runs: an override of
    ``--model-opts`` that no model can be built with is refused in gwdet's words before the other
    levels' minutes. ``MODEL.DEVICE`` is refused there: ``--device`` sets it; so are overrides that
    make two models one (their norms set alike for all: the table would name a model that is not
    measured)."""
    if "MODEL.DEVICE" in args.model_opts[::2]:
        raise GwdetValueError(f"--model-opts sets MODEL.DEVICE, which the benchmark sets to --device ({device}) for "
                              "every level: give --device instead, and leave MODEL.DEVICE out of --model-opts.")
    built: dict[str, str] = {}  # each model's layers (their repr): the first model of each
    for name, path in selected_models(args.model_names):
        text = repr(build_detector(path, device, list(args.model_opts))[0])
        if text in built:
            raise GwdetValueError(
                f"--model-opts {' '.join(args.model_opts)} make {built[text]!r} and {name!r} the same model (the "
                "overrides set what tells them apart, their norms, alike for both: the same layers): the table would "
                "report one model under two names, and their ratio as the cost of one norm over the other. Leave the "
                "norm keys out of --model-opts, or compare one model (--model-names).")
        built[text] = name


def run_models(args: argparse.Namespace, device: torch.device) -> dict:
    """``{"rows": [{"name", "config", "seconds", "peak", "finite", "gw_layers", "in_gw", "adjusted"}], ...}``
    (``adjusted``: :func:`adjusted_groups` of the model measured)."""
    models = selected_models(args.model_names)
    progress = Progress([1.0] * len(models))
    results = {"rows": [], "image_size": args.image_size, "amp": args.amp, "opts": list(args.model_opts)}
    for name, path in models:
        row = measure_model(name, path, args, device)  # the model is freed before the next is built
        results["rows"].append(row)
        progress.step(f"model {name}", f"{row['seconds']:.3f} s/step")
    return results


def measure_model(name: str, path: str, args: argparse.Namespace, device: torch.device) -> dict:
    """One row of :func:`run_models`: the training step of the model that config ``path`` builds."""
    from detectron2.utils.events import EventStorage

    amp_dtype = AMP_DTYPES[args.amp]
    model, optimizer = build_detector(path, device, list(args.model_opts))
    model.train()
    batch = synthetic_batch(args.image_size)
    finite = True

    def step() -> None:
        nonlocal finite
        torch.manual_seed(0)
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            losses = model(batch)
        loss = sum(losses.values())
        finite = finite and bool(torch.isfinite(loss))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    gw_layers = count_group_whitening(model)
    adjusted = adjusted_groups(model)
    with EventStorage(0):
        seconds = median_time(step, device, args.model_warmup, args.model_repeats, args.clock)
        peak = peak_memory(step, device) if device.type == "cuda" else None
        in_gw = gw_share(step) if device.type == "cpu" and gw_layers else None
    return {"name": name, "config": path, "seconds": seconds, "peak": peak, "finite": finite,
            "gw_layers": gw_layers, "in_gw": in_gw, "adjusted": adjusted}


def adjusted_groups(model: nn.Module) -> List[str]:
    """What the norm layers of ``model`` use where the group number (GW, BGN, GN) or group size (BW)
    asked for does not divide their channels (:func:`gwdet.norms.group_adjustment`), one entry per
    layer type and request: ``"66 GroupNorm layer(s) asked for 7 groups use 4"``."""
    from gwdet.norms import group_adjustment

    found: Dict[Tuple[str, str, int], Set[int]] = {}
    layers: Dict[Tuple[str, str, int], int] = {}
    for module in model.modules():
        adjusted = group_adjustment(module)
        if adjusted is not None:
            what, requested, used = adjusted
            key = (type(module).__name__, what, requested)
            found.setdefault(key, set()).add(used)
            layers[key] = layers.get(key, 0) + 1
    return [f"{layers[(kind, what, requested)]} {kind} layer(s) asked for {requested} {what} use "
            f"{'/'.join(map(str, sorted(used)))}" for (kind, what, requested), used in sorted(found.items())]


def adjusted_text(rows: List[dict]) -> str:
    """The caption's sentence on the group numbers the measured models' layers used instead of the
    ones asked for (a group number that does not divide the channels), ``""`` where none did."""
    adjusted = [f"{row['name']}: {', '.join(row['adjusted'])}" for row in rows if row.get("adjusted")]
    if not adjusted:
        return ""
    return (" Group numbers that do not divide the layers' channels were adjusted, and the table measures what the "
            f"layers use: {'; '.join(adjusted)}.")


def model_tables(results: dict) -> str:
    """The model level's markdown: seconds per step per model, then the ratios :data:`MODEL_TARGETS` limit."""
    size = results["image_size"]
    steps = Table([
        Column("name", "model"), Column("config", fmt=lambda path: f"`{path}`"),
        Column("gw_layers", "GW layers", align_right=True), Column("seconds", "s / step", "{:.3f}", align_right=True),
        Column("in_gw", "share of a step in GW layers (profiled)", align_right=True),
        Column("peak", "peak memory", align_right=True),
        Column("finite", "loss finite", lambda finite: "yes" if finite else "NO"),
    ])
    for row in results["rows"]:
        share, peak = row["in_gw"], row["peak"]
        cells = {key: value for key, value in row.items() if key != "adjusted"}  # said in the caption
        steps.add({**cells, "in_gw": f"{share * 100:.1f}%" if share is not None else "-",
                   "peak": f"{peak / 2**20:.0f} MiB" if peak is not None else "n/a (CPU)"})
    lines = [
        "#### Model level: one Faster R-CNN R-50-FPN training step", "",
        f"2 synthetic images of {size}x{size}, forward + losses + backward + SGD step (lr 0); median "
        f"seconds per step; autocast: {results['amp']}; config overrides: "
        f"`{' '.join(results['opts']) or 'none'}`.{adjusted_text(results['rows'])}", "",
        steps.markdown(),
    ]
    by_name = {row["name"]: row for row in results["rows"]}
    checks = [(a, b, limit) for a, b, limit in MODEL_TARGETS if a in by_name and b in by_name]
    if checks:
        targets = Table([Column("target"), Column("ratio", fmt="{:.3f}", align_right=True),
                         Column("limit", fmt="{:.2f}", align_right=True), Column("met")])
        for a, b, limit in checks:
            ratio = by_name[a]["seconds"] / by_name[b]["seconds"]
            targets.add({"target": f"{a} / {b}", "ratio": ratio, "limit": limit, "met": verdict(ratio, limit)})
        lines += ["", targets.markdown()]
    return "\n".join(lines) + "\n"
