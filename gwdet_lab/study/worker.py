"""One cell, start to finish, in this process: ``python -m gwdet_lab.study.worker FOLDER``.

The scheduler (:mod:`gwdet_lab.study.scheduler`) starts one worker process per cell, so that a
cell's memory, threads and crashes stay its own and two cells can train side by side. The worker:

1. takes the folder's lock (exit status 75 if another process holds it);
2. resolves the cell from ``FOLDER/study_cell.json`` again and refuses (exit status 3, the keys
   that differ) unless the config equals the recorded one: config files edited since the study
   was planned cannot slip into a cell;
3. trains with :func:`gwdet.engine.run.main` (``--resume``: continues from the last checkpoint, or
   starts afresh when there is none), which evaluates on ``DATASETS.TEST`` and writes
   ``results.json``; skipped when that file is there. A non-finite loss (detectron2's
   ``FloatingPointError``) is an outcome of the configuration, not a crash: it is recorded in
   ``diverged.json`` and the cell is complete, without evaluations;
4. for a model with batch norms: inference example weighing and the batch-statistics evaluation
   (:mod:`gwdet_lab.study.evaluation`);
5. writes ``study_complete.json``.

Threads: ``--threads N`` sets ``torch.set_num_threads(N)``; the scheduler also sets
``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` in the worker's environment, which must happen before
the process starts. The worker stops when the scheduler that started it dies (Linux
``PR_SET_PDEATHSIG``), so killing a study stops its cells; their checkpoints stay for the resume.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
import time
from pathlib import Path
from typing import Sequence

import torch

from gwdet.engine.arguments import argument_parser
from gwdet.engine.run import main as engine_main
from gwdet.engine.trainer import Trainer
from gwdet.checkpoint.resilient import ResilientCheckpointer
from gwdet.data.datasets import prepare_datasets
from gwdet_lab.study.cells import Cell
from gwdet_lab.study.evaluation import PAPER_WEIGHTS, batch_statistics, example_weighing, has_batch_norm
from gwdet_lab.study.record import comparable_dump, config_differences, read_record, resolve
from gwdet.utils.run_file_names import FINAL_WEIGHTS
from gwdet_lab.study.run_folder import (
    COMPLETE_JSON,
    DIVERGED_JSON,
    TIMING_JSON,
    FolderBusy,
    RunFolder,
)

EXIT_MISMATCH = 3
EXIT_BUSY = 75
PARENT_ENV = "GWDET_STUDY_PARENT_PID"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gwdet_lab.study.worker",
                                description="Train and evaluate one planned cell of a norm study.")
    p.add_argument("folder", help="the cell's folder (holds study_cell.json)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads for this process")
    p.add_argument("--num-gpus", type=int, default=1)
    p.add_argument("--example-weights", nargs="*", type=float, default=list(PAPER_WEIGHTS),
                   help="example weights swept for batch-norm models (none: skip)")
    return p


def stop_with_parent() -> None:
    """Ask Linux to send SIGTERM when the parent dies; exit now if it already did."""
    parent = os.environ.get(PARENT_ENV)
    if not parent or not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        return
    if os.getppid() != int(parent):
        sys.exit("the study that started this worker has ended")


def add_seconds(folder: RunFolder, key: str, seconds: float) -> None:
    timing = folder.read_json(TIMING_JSON)
    timing[key] = timing.get(key, 0.0) + seconds
    folder.write_json(TIMING_JSON, timing)


def train(cell: Cell, opts: Sequence[str], num_gpus: int) -> None:
    """``gwdet.engine.run.main`` with ``--resume``, exactly as ``tools/train_net.py`` would run it."""
    args = argument_parser().parse_args(
        ["--config-file", cell.config_file, "--num-gpus", str(num_gpus), "--resume", *opts])
    if num_gpus > 1:
        from detectron2.engine import launch

        launch(engine_main, num_gpus, num_machines=args.num_machines, machine_rank=args.machine_rank,
               dist_url=args.dist_url, args=(args,))
    else:
        engine_main(args)


def run(folder: RunFolder, weights: Sequence[float], num_gpus: int = 1) -> int:
    """Steps 2-5 of the module docstring for the cell in ``folder``; the exit status."""
    record = read_record(folder)
    if record is None:
        print(f"{folder.path} has no study_cell.json: plan the study first (tools/compare_norms.py).")
        return EXIT_MISMATCH
    cell = Cell(**{**record["cell"], "opts": tuple(record["cell"]["opts"])})
    opts, cfg = resolve(cell, folder, record["common_opts"])
    differences = config_differences(record["config"], comparable_dump(cfg))
    if differences:
        print(f"{cell.name}: the config now differs from the one recorded in {folder.path}; not training:")
        print("\n".join(f"  {line}" for line in differences))
        return EXIT_MISMATCH
    if folder.diverged():
        folder.write_json(COMPLETE_JSON, {"evaluations": [], "diverged": True})
        return 0
    if not folder.is_trained():
        started = time.monotonic()
        try:
            train(cell, opts, num_gpus)
        except FloatingPointError as error:
            add_seconds(folder, "train_seconds", time.monotonic() - started)
            print(f"{cell.name}: training diverged: {error}")
            folder.write_json(DIVERGED_JSON, {"error": str(error)})
            folder.write_json(COMPLETE_JSON, {"evaluations": [], "diverged": True})
            return 0
        add_seconds(folder, "train_seconds", time.monotonic() - started)
    started = time.monotonic()
    prepare_datasets(cfg)  # a cell trained by an earlier process registered them there, not here
    model = Trainer.build_model(cfg)
    evaluations = []
    if has_batch_norm(model):
        ResilientCheckpointer(model).load(str(folder.file(FINAL_WEIGHTS)))
        model.eval()
        echo = lambda line: print(f"[{cell.name}] {line}", flush=True)  # noqa: E731
        if weights:
            example_weighing(cfg, model, folder, weights, echo)
            evaluations.append("example_weighing")
        batch_statistics(cfg, model, folder, echo)
        evaluations.append("batch_statistics")
        add_seconds(folder, "extra_eval_seconds", time.monotonic() - started)
    folder.write_json(COMPLETE_JSON, {"evaluations": evaluations, "example_weights": list(weights)})
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    stop_with_parent()
    if args.threads:
        torch.set_num_threads(args.threads)
    folder = RunFolder(Path(args.folder).resolve())
    try:
        lock = folder.lock()
    except FolderBusy as busy:
        print(busy)
        return EXIT_BUSY
    with lock:
        return run(folder, args.example_weights, args.num_gpus)


if __name__ == "__main__":
    sys.exit(main())
