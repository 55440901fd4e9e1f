"""One table row per finished run, gathered from its folder (see :mod:`gwdet.study.run_folder`)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Sequence

from gwdet.study.run_folder import (
    EXAMPLE_WEIGHING_JSON,
    STUDY_RUN_JSON,
    final_loss,
    loss_curve,
    seconds_per_iteration,
)
from gwdet.study.runner import PlannedRun
from gwdet.study.weighing import choose_weight, weight_key

BOX_METRICS = ("AP", "AP50", "AP75")


@dataclass
class RunSummary:
    """What the tables and plots show of one finished run (AP in %, memory in MB)."""

    name: str
    config: str  # the config file, then the run's own overrides
    box: dict[str, float]
    mask_ap: float | None
    final_loss: float | None
    seconds_per_iteration: float | None
    peak_rss_mb: float | None
    peak_gpu_mb: float | None
    loss_curve: list[tuple[int, float]] = field(default_factory=list)
    # Example weighing: box AP per weight evaluated, and the weight chosen with its box AP.
    weighing_sweep: dict[str, float] = field(default_factory=dict)
    weighing_choice: tuple[float, float] | None = None


def summarize(run: PlannedRun, weights: Sequence[float]) -> RunSummary:
    """The numbers of the finished ``run``; the example weight is chosen among ``weights``."""
    folder = run.folder
    results = folder.results()
    records = folder.metrics()
    sweep = folder.read_json(EXAMPLE_WEIGHING_JSON)
    return RunSummary(
        name=run.spec.name,
        config=" ".join([display_path(run.spec.config_file), *run.spec.opts]),
        box={metric: results["bbox"][metric] for metric in BOX_METRICS},
        mask_ap=results["segm"]["AP"] if "segm" in results else None,
        final_loss=final_loss(records),
        seconds_per_iteration=seconds_per_iteration(records),
        peak_rss_mb=folder.read_json(STUDY_RUN_JSON).get("peak_rss_mb"),
        peak_gpu_mb=folder.peak_gpu_memory_mb(),
        loss_curve=loss_curve(records),
        weighing_sweep={
            weight_key(w): sweep[weight_key(w)]["bbox"]["AP"] for w in weights if weight_key(w) in sweep
        },
        weighing_choice=choose_weight(sweep, weights),
    )


def display_path(path: str) -> str:
    """``path`` relative to the working directory when it lies below it, else unchanged."""
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative
