"""Command line of ``tools/compare_norms.py``: train, evaluate and tabulate a set of norm configs.

Steps: resolve every run's config (errors surface before any training); prepare the datasets
(the shapes dataset is generated once here); train the unfinished runs one by one
(:mod:`gwdet.study.runner`); sweep inference example weights on the finished runs that have
batch norms (:mod:`gwdet.study.weighing`); write the tables and plots (:mod:`gwdet.study.report`).
Everything is cached in the output folder, so running the same command again only does what is
missing. The exit status is 1 when a run failed (the report then covers the finished runs), and
130 when the study is interrupted (Ctrl-C or SIGTERM; the next invocation resumes).
"""
from __future__ import annotations

import argparse
import signal
from pathlib import Path
from typing import Sequence

import torch

from gwdet.data import prepare_datasets
from gwdet.study.report import write_report
from gwdet.study.runner import PlannedRun, StudyTrainer, plan_runs
from gwdet.study.runs import (
    DEFAULT_CONFIG_PATTERNS,
    RunSpec,
    check_unique_names,
    default_runs,
    parse_config_item,
    parse_extra,
)
from gwdet.study.summary import summarize
from gwdet.study.weighing import PAPER_WEIGHTS, sweep_example_weights

DEFAULT_OUT = "output/compare_norms"


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="compare_norms.py",
        description="Train norm configs with the same schedule, seed and data; evaluate each with "
                    "COCOEvaluator; write table.md, table.csv, loss_curves.png and ap_bars.png. "
                    "Re-running resumes.",
        epilog=(
            "examples:\n"
            "  compare_norms.py                                   # BN, BN+GW S1-B2, GN, GW on shapes (CPU)\n"
            "  compare_norms.py --opts SOLVER.MAX_ITER 300 SOLVER.STEPS '(240,)'\n"
            "  compare_norms.py --dataset coco --num-gpus 8 --out output/scratch_coco\n"
            "  compare_norms.py --extra bgn=configs/Demo/scratch_faster_rcnn_bn_shapes.yaml \\\n"
            "      MODEL.RESNETS.NORM BGN MODEL.FPN.NORM BGN MODEL.ROI_BOX_HEAD.NORM BGN\n"
            "  compare_norms.py --configs gn=configs/Demo/scratch_faster_rcnn_gn_shapes.yaml my.yaml"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    runs = parser.add_argument_group("runs")
    runs.add_argument("--dataset", choices=sorted(DEFAULT_CONFIG_PATTERNS), default=None,
                      help="default run set: the four from-scratch configs on the embedded shapes "
                           "dataset (configs/Demo, the default) or on COCO (configs/Scratch; needs "
                           "DETECTRON2_DATASETS)")
    runs.add_argument("--configs", nargs="+", metavar="[NAME=]CONFIG",
                      help="train these configs instead of a default set (run name: NAME, else the "
                           "file name)")
    runs.add_argument("--extra", nargs="+", action="append", default=[], metavar="ARG",
                      help="NAME=CONFIG [KEY VALUE ...]: add a run with overrides of its own, "
                           "e.g. a BGN run (repeatable)")
    runs.add_argument("--opts", nargs="+", default=[], metavar="KEY VALUE",
                      help="config overrides applied to every run (schedule, image size, ...)")
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    parser.add_argument("--num-gpus", type=int, default=1,
                        help="GPUs per run (passed to tools/train_net.py)")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads per process (OMP_NUM_THREADS of the training processes); on a "
                             "shared CPU, 1 avoids OpenMP threads spin-waiting on each other")
    parser.add_argument("--example-weights", nargs="+", type=float, default=list(PAPER_WEIGHTS),
                        metavar="W", help="inference example weights in [0, 1] swept on the runs with "
                                          "batch norms (default: %(default)s)")
    parser.add_argument("--no-example-weighing", action="store_true",
                        help="skip the example-weighing sweep")
    return parser


def resolve_specs(args: argparse.Namespace, repo_root: Path) -> list[RunSpec]:
    """The runs the arguments name: ``--configs`` or a default set, plus every ``--extra``."""
    if args.configs and args.dataset:
        raise ValueError("Pass either --dataset (a default run set) or --configs, not both.")
    if args.configs:
        specs = [parse_config_item(item) for item in args.configs]
    else:
        specs = default_runs(args.dataset or "shapes", repo_root)
    specs += [parse_extra(tokens) for tokens in args.extra]
    check_unique_names(specs)
    return specs


def main(argv: Sequence[str] | None = None, repo_root: Path | None = None) -> int:
    """Run the study the command line describes; return the exit status."""
    repo_root = repo_root or Path(__file__).resolve().parents[2]
    parser = argument_parser()
    args = parser.parse_args(argv)
    if len(args.opts) % 2:
        parser.error(f"--opts takes KEY VALUE pairs, got {args.opts}")
    if not all(0.0 <= w <= 1.0 for w in args.example_weights):
        parser.error(f"--example-weights must lie in [0, 1], got {args.example_weights}")
    try:
        specs = resolve_specs(args, repo_root)
        out_dir = Path(args.out).resolve()
        runs = plan_runs(specs, out_dir, args.opts)
        for run in runs:
            prepare_datasets(run.cfg)
    except (ValueError, FileNotFoundError, KeyError) as error:
        parser.error(str(error))
    echo(f"{len(runs)} runs into {out_dir}: " + ", ".join(f"{r.spec.name} ({r.max_iter} it)" for r in runs))
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    # `kill PID` stops the study like Ctrl-C does: the training process is stopped too (its last
    # checkpoint stays, for the next invocation to resume from).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    trainer = StudyTrainer(runs, repo_root / "tools" / "train_net.py", args.num_gpus, args.threads, echo)
    weights = [] if args.no_example_weighing else args.example_weights
    try:
        failed = trainer.train_all()
        finished = [run for run in runs if run.folder.is_finished()]
        if weights:
            weigh(finished, weights)
    except KeyboardInterrupt:
        echo("interrupted; run the same command again to resume")
        return 130
    if finished:
        notes = [f"Runs that did not finish (not in the table): {', '.join(failed)}."] if failed else []
        paths = write_report([summarize(run, weights) for run in finished], out_dir, notes)
        echo("wrote " + ", ".join(str(p) for p in paths))
    return 1 if failed else 0


def weigh(runs: Sequence[PlannedRun], weights: Sequence[float]) -> None:
    """The example-weighing sweep of every run with batch norms (cached per weight)."""
    for run in runs:
        sweep = sweep_example_weights(run, weights, echo)
        if not sweep:
            echo(f"{run.spec.name}: no batch norm, no example weighing")


def echo(line: str) -> None:
    """Progress goes to stdout at once, even when it is a pipe or a file."""
    print(f"[compare_norms] {line}", flush=True)

