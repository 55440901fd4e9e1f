"""What a run's folder holds, and reading it.

``tools/train_net.py`` (through :mod:`gwdet.engine` and detectron2) writes ``metrics.json`` (one
json object per logged iteration, every 20 iterations: ``total_loss`` and the other losses as
medians over the last 20 iterations, ``time`` the median seconds per iteration over the same
window), ``log.txt``, checkpoints with ``last_checkpoint`` naming the newest, and, once evaluated,
``results.json``. The study adds ``study_run.json`` (peak memory and wall time of the training
process), ``stdout.txt`` (the trainer's console output) and ``example_weighing.json``.
"""
from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from gwdet.engine import RESULTS_JSON

METRICS_JSON = "metrics.json"
LAST_CHECKPOINT = "last_checkpoint"
FINAL_WEIGHTS = "model_final.pth"
DETECTRON2_LOG = "log.txt"
STUDY_RUN_JSON = "study_run.json"
STDOUT_TXT = "stdout.txt"
EXAMPLE_WEIGHING_JSON = "example_weighing.json"

# detectron2's CommonMetricPrinter logs "max_mem: 1234M" (torch.cuda.max_memory_allocated) on GPUs.
_MAX_MEM = re.compile(r"max_mem: (\d+)M")


@dataclass(frozen=True)
class RunFolder:
    """The folder a run trains into (``OUTPUT_DIR``)."""

    path: Path

    def file(self, name: str) -> Path:
        return self.path / name

    def is_finished(self) -> bool:
        """Trained and evaluated: ``results.json`` is written last, by :func:`gwdet.engine.write_results`."""
        return self.file(RESULTS_JSON).is_file()

    def has_checkpoint(self) -> bool:
        """An interrupted run can continue (``tools/train_net.py --resume``)."""
        return self.file(LAST_CHECKPOINT).is_file()

    def metrics(self) -> list[dict]:
        """Every record of ``metrics.json`` (empty before the first write); a line cut off by an
        interruption is skipped."""
        path = self.file(METRICS_JSON)
        if not path.is_file():
            return []
        records = []
        for line in path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return records

    def results(self) -> dict[str, Mapping[str, float]]:
        """``{task: {metric: value}}`` of the first test dataset in ``results.json`` (COCO AP in %)."""
        datasets = json.loads(self.file(RESULTS_JSON).read_text())
        return next(iter(datasets.values()), {})

    def read_json(self, name: str) -> dict:
        """A json file of the folder, ``{}`` when it is not there."""
        path = self.file(name)
        return json.loads(path.read_text()) if path.is_file() else {}

    def write_json(self, name: str, data: Mapping) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        self.file(name).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")

    def peak_gpu_memory_mb(self) -> float | None:
        """Largest ``max_mem`` detectron2 logged (GPU runs only), else ``None``."""
        path = self.file(DETECTRON2_LOG)
        if not path.is_file():
            return None
        values = [float(m) for m in _MAX_MEM.findall(path.read_text(errors="replace"))]
        return max(values) if values else None


def loss_curve(records: list[dict]) -> list[tuple[int, float]]:
    """``(iteration, total_loss)`` sorted by iteration; where a resumed run logged an iteration
    twice, the later record wins."""
    by_iteration = {r["iteration"]: r["total_loss"] for r in records if "total_loss" in r}
    return sorted(by_iteration.items())


def final_loss(records: list[dict]) -> float | None:
    """The last logged ``total_loss`` (a median over the last 20 iterations), ``None`` if none."""
    curve = loss_curve(records)
    return curve[-1][1] if curve else None


def seconds_per_iteration(records: list[dict]) -> float | None:
    """Median of the logged ``time`` values (detectron2 skips the first iterations' timing)."""
    times = [r["time"] for r in records if "time" in r]
    return statistics.median(times) if times else None

