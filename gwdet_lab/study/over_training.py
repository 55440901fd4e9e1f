"""Box AP over training, and batch norm's train/test mismatch on training images, from the
checkpoints a finished study cell kept.

group_whitening_huang2021 (end of Sec. 5.2, citing the Group Normalization paper) attributes BN's
small-batch failure to "the inaccurate estimation between training and inference distributions":
batch norm normalizes with each training batch's statistics but with running averages at test
time. Two measurements separate that from a model that simply learned less:

* **AP over training**: the selection split (``DATASETS.TEST[0]``, shapes_val) evaluated at every
  kept checkpoint (``model_XXXXXXX.pth``, every ``SOLVER.CHECKPOINT_PERIOD`` iterations, and
  ``model_final.pth``), ordinary inference (running statistics, one image at a time).
* **A fixed training subset**: the first ``--subset`` images of ``DATASETS.TRAIN[0]`` (training
  data, so generalization plays no part), evaluated with the final weights twice for a model with
  batch norms: with running statistics, and with every batch norm normalizing over the batch it is
  given (:class:`gwdet_lab.study.evaluation.BatchStatisticsNorm`) in batches of the training batch
  size, as in training. If running statistics lose AP that batch statistics keep on images the
  model trained on, the loss is the train/test mismatch the paper names; if both are low, it is not.

Results are cached per cell in ``over_training.json`` (its checkpoints, subset and batch size are
the key), which the study's records keep (:mod:`gwdet_lab.study.records`); the report (a table and
``ap_over_training.png``) is written from those files, by ``--runs`` (evaluating what is missing)
or ``--records`` (reading only).
"""
from __future__ import annotations

import argparse
import copy
import os
import re
from pathlib import Path
from typing import Sequence

from detectron2.data import DatasetCatalog, MetadataCatalog
from matplotlib.figure import Figure

from gwdet.errors import GwdetValueError
from gwdet.utils.atomic import write_atomically
from gwdet.utils.cli_errors import add_verbose_argument, at_least, run_tool
from gwdet.checkpoint.resilient import ResilientCheckpointer
from gwdet.data import prepare_datasets
from gwdet_lab.tables import Column, Table
from gwdet.utils.command_line import refuse_repeated_flags
from gwdet.engine.trainer import Trainer
from gwdet_lab.study.evaluation import evaluate, has_batch_norm, selection_dataset, use_batch_statistics
from gwdet_lab.study.record import PlannedCell
from gwdet_lab.study.records import OVER_TRAINING_JSON, recorded_cells
from gwdet_lab.study.report import foreign_report_problem, label
from gwdet.utils.run_file_names import FINAL_WEIGHTS
from gwdet_lab.study.run_folder import RunFolder

TABLE_MD, CURVE_PNG = "table.md", "ap_over_training.png"
DEFAULT_SUBSET = 200
PROG = "python -m gwdet_lab.study.over_training"
TITLE = "Box AP over training, and batch norm's statistics on training images"
REPORT_NAMES = (TABLE_MD, CURVE_PNG)  # what write_report writes
_PERIODIC = re.compile(r"^model_(\d{7})\.pth$")


def kept_checkpoints(folder: RunFolder, max_iter: int) -> list[tuple[int, Path]]:
    """``(iterations trained, path)`` of every kept checkpoint, in training order: detectron2's
    periodic ``model_{iteration:07d}.pth`` holds the weights after ``iteration + 1`` iterations,
    ``model_final.pth`` those after ``max_iter``."""
    found = [(int(m.group(1)) + 1, p) for p in folder.path.iterdir() if (m := _PERIODIC.match(p.name))]
    final = folder.file(FINAL_WEIGHTS)
    if final.is_file():
        found = [item for item in found if item[0] != max_iter] + [(max_iter, final)]
    return sorted(found)


def training_subset(train_dataset: str, size: int) -> str:
    """Registers (once) and names the dataset of the first ``size`` images of ``train_dataset``,
    with its metadata; COCOEvaluator converts its records to COCO json by itself."""
    name = f"{train_dataset}_first{size}"
    if name not in DatasetCatalog.list():
        def first_images() -> list[dict]:
            records = DatasetCatalog.get(train_dataset)
            if len(records) < size:
                raise GwdetValueError(f"--subset {size}: {train_dataset} has only {len(records)} images")
            return records[:size]

        DatasetCatalog.register(name, first_images)
        source = MetadataCatalog.get(train_dataset).as_dict()
        MetadataCatalog.get(name).set(**{k: v for k, v in source.items() if k not in ("name", "json_file")})
    return name


def box_ap(results: dict) -> float:
    return float(results["bbox"]["AP"])


def measure(planned: PlannedCell, subset: int, echo=print) -> dict:
    """The cell's measurements (read from ``over_training.json`` where it already holds them)."""
    cfg, folder = planned.cfg, planned.folder
    checkpoints = kept_checkpoints(folder, planned.max_iter)
    batch_size = int(cfg.SOLVER.IMS_PER_BATCH)
    key = {"checkpoints": [it for it, _ in checkpoints], "subset": subset, "batch_size": batch_size}
    done = folder.read_json(OVER_TRAINING_JSON, null_is_nan=True)
    if done.get("key") != key:
        done = {"key": key}
    prepare_datasets(cfg)
    train_subset = training_subset(cfg.DATASETS.TRAIN[0], subset)
    DatasetCatalog.get(train_subset)  # too few training images: refused before any checkpoint is evaluated
    model = Trainer.build_model(cfg)
    val = selection_dataset(cfg)
    curve = done.setdefault("val_box_ap", {})
    for iteration, path in checkpoints:
        if str(iteration) not in curve:
            ResilientCheckpointer(model).load(str(path), checkpointables=[])
            curve[str(iteration)] = box_ap(evaluate(cfg, model, val, str(folder.file(f"over_training/{iteration}"))))
            echo(f"{planned.cell.name}: {val} box AP after {iteration} iterations: {curve[str(iteration)]:.2f}")
            folder.write_json(OVER_TRAINING_JSON, done)
    subset_aps = done.setdefault("train_subset_box_ap", {})
    modes = ["running", "batch"] if has_batch_norm(model) else ["running"]
    for mode in (m for m in modes if m not in subset_aps):
        ResilientCheckpointer(model).load(str(checkpoints[-1][1]), checkpointables=[])
        evaluated, images = model, 1
        if mode == "batch":
            evaluated, images = copy.deepcopy(model), batch_size
            use_batch_statistics(evaluated)
        out = str(folder.file(f"over_training/{train_subset}-{mode}"))
        subset_aps[mode] = box_ap(evaluate(cfg, evaluated, train_subset, out, images))
        echo(f"{planned.cell.name}: {train_subset} box AP, {mode} statistics: {subset_aps[mode]:.2f}")
        folder.write_json(OVER_TRAINING_JSON, done)
    return done


def subset_table(cells: Sequence[tuple[PlannedCell, dict]]) -> Table:
    table = Table([
        Column("cell"), Column("config", "configuration"),
        Column("val_final", "val box AP, final", "{:.2f}"),
        Column("running", "training subset, running statistics", "{:.2f}"),
        Column("batch", "training subset, batch statistics", "{:.2f}"),
        Column("gap", "batch - running", "{:+.2f}"),
    ])
    for planned, done in cells:
        curve, aps = done["val_box_ap"], done["train_subset_box_ap"]
        table.add({"cell": planned.cell.name, "config": label(planned.cell.group),
                   "val_final": curve[str(max(map(int, curve)))], "running": aps.get("running"),
                   "batch": aps.get("batch"),
                   "gap": aps["batch"] - aps["running"] if "batch" in aps else None})
    return table


def curve_table(cells: Sequence[tuple[PlannedCell, dict]]) -> Table:
    iterations = sorted({int(i) for _, done in cells for i in done["val_box_ap"]})
    table = Table([Column("cell"), *(Column(str(i), f"{i}", "{:.2f}") for i in iterations)])
    for planned, done in cells:
        table.add({"cell": planned.cell.name, **{i: v for i, v in done["val_box_ap"].items()}})
    return table


def write_report(cells: Sequence[tuple[PlannedCell, dict]], out_dir: Path) -> list[Path]:
    """``table.md`` and ``ap_over_training.png`` of the measured ``cells`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    subset = cells[0][1]["key"]["subset"]
    val = selection_dataset(cells[0][0].cfg)
    train = f"{cells[0][0].cfg.DATASETS.TRAIN[0]}_first{subset}"
    text = [
        f"# {TITLE}", "",
        f"Box AP (%) on `{val}` at every kept checkpoint (running statistics, one image at a time), "
        "columns: iterations trained.", "", curve_table(cells).markdown(), "",
        f"With the final weights on `{train}` (the first {subset} training images, seen in training): "
        "running statistics, one image at a time, against every batch norm normalizing over its batch "
        "of the training batch size, as in training (models with batch norms only).", "",
        subset_table(cells).markdown(), "",
    ]
    paths = [out_dir / TABLE_MD, out_dir / CURVE_PNG]
    paths[0].write_text("\n".join(text))
    figure = Figure(figsize=(7, 4.5), layout="constrained")
    axis = figure.add_subplot()
    for planned, done in cells:
        points = sorted((int(i), ap) for i, ap in done["val_box_ap"].items())
        axis.plot(*zip(*points, strict=True), marker="o", label=f"{label(planned.cell.group)} ({planned.cell.name})")
    axis.set_xlabel("iterations trained")
    axis.set_ylabel(f"box AP (%) on {val}")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    write_atomically(str(paths[1]), lambda file: figure.savefig(file, format="png", dpi=120))
    return paths


def reported_cells(out_dir: Path) -> set[str]:
    """The cells whose rows the report in ``out_dir`` (its ``table.md``) holds; none without one."""
    try:
        lines = (out_dir / TABLE_MD).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return set()
    cells, in_table = set(), False
    for line in lines:
        if line.startswith("| cell |"):
            in_table = True
        elif in_table and line.startswith("| ") and not line.startswith("| ---"):
            cells.add(line.split("|")[1].strip())
        elif not line.startswith("|"):
            in_table = False
    return cells


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=" ".join(__doc__.split("\n\n")[0].split()))
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--runs", help="a study's run folder (<out>/runs): evaluate the cells' kept checkpoints (the "
                                       "measurements are kept in each cell's folder, over_training.json, and its "
                                       "over_training/ evaluations)")
    source.add_argument("--records", type=os.path.expanduser,
                        help="a records folder: write the report from its over_training.json files")
    parser.add_argument("--cells", nargs="+", required=True, help="the cells, e.g. bn-b2-s0 gn-b2-s0")
    parser.add_argument("--subset", type=at_least(1, "--subset (training images)"), default=DEFAULT_SUBSET,
                        help=f"training images (default {DEFAULT_SUBSET})")
    parser.add_argument("--out", required=True, type=os.path.expanduser, help="the report's folder")
    add_verbose_argument(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The tool's command line; an error gwdet raises on purpose ends it with one line naming the
    problem and status 2 (``--verbose`` shows the traceback: :mod:`gwdet.utils.cli_errors`)."""
    return run_tool(_over_training, argv, PROG)


def _over_training(argv: list[str]) -> int:
    parser = argument_parser()
    refuse_repeated_flags(parser, argv)
    args = parser.parse_args(argv)
    problem = foreign_report_problem("--out", Path(args.out), [TITLE], REPORT_NAMES, PROG)
    if problem:
        raise GwdetValueError(problem)
    others = reported_cells(Path(args.out)) - set(args.cells)
    if others:  # compare_norms.py refuses a report of other cells in its folder so too
        raise GwdetValueError(
            f"--out {args.out} holds the report of other cells ({', '.join(sorted(others)[:4])}"
            f"{', ...' if len(others) > 4 else ''}), which this report would replace; nothing was written. Give this "
            "report a folder of its own (another --out), or name those cells in --cells too.")
    if args.records:
        if args.subset != parser.get_default("subset"):  # the records' subset is the one they were measured on
            raise GwdetValueError(f"--subset {args.subset}: --records reports what the records hold, measured on the "
                                  "subset they were measured on, so it would not apply; drop it (it is read with "
                                  "--runs, which evaluates the checkpoints again).")
        recorded = recorded_cells(Path(args.records), args.cells, only_flag="--cells")
        cells = [(p, p.folder.read_json(OVER_TRAINING_JSON, null_is_nan=True)) for p in recorded]
        missing = [p.cell.name for p, done in cells if "val_box_ap" not in done]
        if missing:
            raise GwdetValueError(f"--records {args.records}: no {OVER_TRAINING_JSON} for {', '.join(missing)}: those "
                                  "cells were not measured; measure them from their run folders with --runs")
        partial = [f"{p.cell.name} (to iteration {max(map(int, done['val_box_ap']))} of {p.max_iter})"
                   for p, done in cells if max(map(int, done["val_box_ap"])) != p.max_iter]
        if partial:
            raise GwdetValueError(f"--records {args.records}: the {OVER_TRAINING_JSON} of {', '.join(partial)} was "
                                  "measured before the cell's training ended, so its last point is not the final "
                                  "weights; measure the finished cells again from their run folders with --runs")
    else:
        planned = recorded_cells(Path(args.runs), args.cells, flag="--runs", only_flag="--cells")
        training = [p.cell.name for p in planned if p.folder.is_busy() or not p.folder.file(FINAL_WEIGHTS).is_file()]
        if training:
            raise GwdetValueError(f"--runs {args.runs}: {', '.join(training)} have not finished training (no "
                                  f"{FINAL_WEIGHTS}, or a process works in the folder): measure them once the study "
                                  "has trained them (a records folder, which keeps no checkpoints, is read with "
                                  "--records); nothing was measured")
        locked = [p.cell.name for p in planned if not os.access(p.folder.path, os.W_OK | os.X_OK)]
        if locked:
            raise GwdetValueError(f"--runs {args.runs}: the run folders of {', '.join(locked)} cannot be written (a "
                                  "read-only disk, or another owner's folders), and the measurements are kept in "
                                  f"each cell's folder ({OVER_TRAINING_JSON}, over_training/): copy the study's "
                                  "runs folder to a disk this process may write (cp -a) and give that as --runs; "
                                  "nothing was measured")
        cells = [(p, measure(p, args.subset)) for p in planned]
    for path in write_report(cells, Path(args.out)):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
