"""The numbers of one finished cell, gathered from its folder (see :mod:`gwdet_lab.study.run_folder`)."""
from __future__ import annotations

import math
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from detectron2.data import MetadataCatalog

from gwdet.config import SHAPES_PREFIX
from gwdet.errors import GwdetValueError
from gwdet.data import prepare_datasets
from gwdet.data.shapes import SPLITS, ShapesSpec, split_annotations
from gwdet.data.coco_registration import environment_datasets
from gwdet.utils.run_file_names import INFERENCE_FOLDER, RESULTS_JSON
from gwdet_lab.study.cells import Cell, model_overrides
from gwdet_lab.study.evaluation import report_dataset, selection_dataset, weight_key
from gwdet_lab.study.image_bootstrap import image_spread, resampled_box_ap
from gwdet_lab.study.record import PlannedCell
from gwdet_lab.study.run_folder import (
    BATCH_STATISTICS_JSON,
    COMPLETE_JSON,
    EXAMPLE_WEIGHING_JSON,
    IMAGE_BOOTSTRAP_JSON,
    STUDY_RUN_JSON,
    TIMING_JSON,
    final_loss,
    loss_curve,
    seconds_per_iteration,
)


@dataclass
class CellResult:
    """What the tables and plots show of one cell (AP in %, memory in MB, times in seconds).

    ``test_*`` are on the report split, ``val_*`` on the selection split (the same split when the
    config has a single test dataset)."""

    cell: Cell
    folder: str
    command: str
    report_dataset: str
    selection_dataset: str
    test_box: dict[str, float]
    val_box_ap: float | None
    final_loss: float | None
    seconds_per_iteration: float | None
    train_seconds: float | None
    wall_seconds: float | None
    peak_rss_mb: float | None
    peak_gpu_mb: float | None
    images_per_iteration: int
    loss_curve: list[tuple[int, float]] = field(default_factory=list)
    # Example weighing: box AP per weight on the selection split, the weight chosen there, and the
    # report split's box AP at that weight.
    weighing_val: dict[str, float] = field(default_factory=dict)
    weighing_weight: float | None = None
    weighing_test_ap: float | None = None
    # the weights the choice was made among (study_complete.json's sweep)
    weighing_weights: tuple[float, ...] = ()
    # Batch norm with the test batch's statistics (training batch size), report split.
    batch_statistics_ap: float | None = None
    # Training stopped on a non-finite loss: the AP values are NaN and left out of means.
    diverged: bool = False
    # Box AP on each bootstrap resample of the report split's images (gwdet_lab.study.image_bootstrap);
    # empty for a diverged cell.
    test_ap_resampled: list[float] = field(default_factory=list)
    # The overrides (common and the cell's own) that change the model of its config file
    # (gwdet_lab.study.cells.model_overrides): a cell with any gets no paper number in the report.
    model_overrides: tuple[str, ...] = ()

    @property
    def test_ap(self) -> float:
        return self.test_box["AP"]

    @property
    def image_noise_unknown(self) -> bool:
        """The cell trained, and its report split has too few images to resample
        (:data:`~gwdet_lab.study.image_bootstrap.MIN_IMAGES`): the test images' noise is unknown."""
        return not self.diverged and not self.test_ap_resampled

    @property
    def test_ap_image_se(self) -> float | None:
        """Standard error of the test AP over the test-image resamples (``None``: none)."""
        return image_spread(self.test_ap_resampled) if self.test_ap_resampled else None


def summarize(planned: PlannedCell) -> CellResult:
    """The numbers of the finished cell ``planned``."""
    folder, cfg = planned.folder, planned.cfg
    results = folder.results()
    report, select = report_dataset(cfg), selection_dataset(cfg)
    if set(results) == {""} and len(cfg.DATASETS.TEST) == 1:
        results = {report: results[""]}  # written before results.json named a lone test dataset
    if report not in results and not folder.diverged():
        raise GwdetValueError(
            f"{folder.file(RESULTS_JSON)} has no results for the report dataset {report!r} (DATASETS.TEST[-1]); "
            f"it holds {sorted(results) or 'none'}. Check DATASETS.TEST of the configuration, or remove that file "
            "and run the same command again: the cell resumes from its last checkpoint and is evaluated again."
        )
    records = folder.metrics()
    weighing = folder.read_json(EXAMPLE_WEIGHING_JSON, null_is_nan=True)
    statistics = folder.read_json(BATCH_STATISTICS_JSON, null_is_nan=True)
    chosen = weighing.get("chosen")
    run = folder.read_json(STUDY_RUN_JSON)
    if folder.diverged():
        results = {report: {"bbox": {metric: math.nan for metric in ("AP", "AP50", "AP75")}}}
    return CellResult(
        cell=planned.cell,
        folder=display_path(str(folder.path)),
        command=train_command(planned),
        report_dataset=report,
        selection_dataset=select,
        test_box={metric: results[report]["bbox"][metric] for metric in ("AP", "AP50", "AP75")},
        val_box_ap=results.get(select, {}).get("bbox", {}).get("AP"),
        final_loss=final_loss(records),
        seconds_per_iteration=seconds_per_iteration(records),
        train_seconds=folder.read_json(TIMING_JSON).get("train_seconds"),
        wall_seconds=run.get("wall_seconds"),
        peak_rss_mb=run.get("peak_rss_mb"),
        peak_gpu_mb=folder.peak_gpu_memory_mb(),
        images_per_iteration=int(cfg.SOLVER.IMS_PER_BATCH),
        loss_curve=loss_curve(records),
        weighing_val={w: r["bbox"]["AP"] for w, r in weighing.get(select, {}).items()},
        weighing_weight=chosen,
        weighing_test_ap=(weighing.get(report, {}).get(weight_key(chosen), {}).get("bbox", {}).get("AP")
                          if chosen is not None else None),
        weighing_weights=tuple(folder.read_json(COMPLETE_JSON).get("example_weights", ())) if chosen is not None else (),
        batch_statistics_ap=statistics.get(report, {}).get("bbox", {}).get("AP"),
        diverged=folder.diverged(),
        test_ap_resampled=[] if folder.diverged() else resampled_test_ap(planned, report, results[report]["bbox"]["AP"]),
        model_overrides=model_overrides(planned.opts),
    )


def resampled_test_ap(planned: PlannedCell, report: str, recorded_ap: float) -> list[float]:
    """The cell's box AP on each bootstrap resample of ``report``'s images (cached in its folder;
    the annotations are read only when the cache does not hold them: a shapes split's rendered
    alone, without generating the dataset's images); ``recorded_ap``: its box AP there in
    results.json."""
    def annotations() -> str | dict:
        split = report[len(SHAPES_PREFIX):]
        if report.startswith(SHAPES_PREFIX) and split in SPLITS:
            return split_annotations(ShapesSpec.from_config(planned.cfg), split)
        prepare_datasets(planned.cfg)  # registers the datasets, so that their annotation file is known
        found = MetadataCatalog.get(report).get("json_file")
        if found is None:
            raise GwdetValueError(f"dataset {report!r} has no COCO annotation file (metadata json_file) to resample")
        return found

    folder = planned.folder
    return resampled_box_ap(folder.file(INFERENCE_FOLDER), report, annotations, folder.file(IMAGE_BOOTSTRAP_JSON),
                            recorded_ap)


def train_command(planned: PlannedCell) -> str:
    """The ``tools/train_net.py`` line, run from the repository root (its config as
    :func:`command_config_path` gives it), that trains and evaluates this cell by itself (without the
    study's extra evaluations) into a fresh folder ``output/rerun/<cell>``, with the ``--register-coco``
    datasets of the study (``$GWDET_REGISTER_COCO``, as its cells get them) that the cell reads."""
    opts = list(planned.opts)
    if opts[-2:-1] == ["OUTPUT_DIR"]:
        opts[-1] = f"output/rerun/{planned.cell.name}"
    read = {*planned.cfg.DATASETS.TRAIN, *planned.cfg.DATASETS.TEST}
    datasets = [item for dataset in environment_datasets() if dataset.name in read
                for item in ("--register-coco", dataset.spec)]
    return shlex.join(["python", "tools/train_net.py", "--config", command_config_path(planned.cell.config_file),
                       *datasets, *opts])


# The checkout this code runs from, where docs/study/README.md runs the recorded commands.
REPO_ROOT = Path(__file__).resolve().parents[2]


def command_config_path(path: str) -> str:
    """``path`` as the recorded ``tools/train_net.py`` command gives it, which runs from the repository
    root: relative to the root when the config lies inside it, else absolute (a config of the user's
    elsewhere, found from any folder). A relative ``path`` is already relative to the checkout that
    trained the cell (records read back) and is kept."""
    if not os.path.isabs(path):
        return Path(path).as_posix()
    resolved = Path(path).resolve()
    if resolved.is_relative_to(REPO_ROOT):
        return resolved.relative_to(REPO_ROOT).as_posix()
    return path


def display_path(path: str) -> str:
    """``path`` relative to the working directory when it lies below it, else unchanged."""
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative
