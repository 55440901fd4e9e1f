"""Command line of ``tools/compare_norms.py`` (also ``python -m gwdet_lab.study``).

Steps: build the study's cells (:mod:`gwdet_lab.study.cells`); resolve each one's config, check it
against its folder's record and record the new ones (:mod:`gwdet_lab.study.record`; a mismatch
stops here, before anything trains); prepare the datasets; run the cells that are not done,
``--jobs`` at a time (:mod:`gwdet_lab.study.scheduler`); write the report of every finished cell
(:mod:`gwdet_lab.study.report`). Cells live in ``<out>/runs/<cell>``, reports in
``<out>/<study>/``, so studies sharing a cell (same name, same config) train it once.

``--launcher slurm`` (or ``submitit-local``) checks that jobs can be submitted, plans and checks the
cells the same way, then submits one job per cell that is not done and has no queued or running job
(:mod:`gwdet_lab.study.cluster`) and returns (``--wait`` waits for them); the last cell to end
writes the report. ``--list`` shows each cell's job and its state from SLURM.

Exit status: 0 when every cell is done (or, on a cluster, submitted), 1 when some failed or are
pending (busy in another process), 2 for bad arguments, a cluster that cannot take jobs, or a config
that differs from a recorded one, 130 when interrupted (Ctrl-C or SIGTERM; run the same command
again to resume).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import signal
import sys
from collections import Counter
from pathlib import Path
from typing import Collection, Mapping, Sequence

from detectron2.config import CfgNode

from gwdet.config_checks import SEED_LIMIT, built_norm_names
from gwdet.errors import GwdetError, GwdetValueError
from gwdet.cluster.executor import SubmissionRefused, check_launcher
from gwdet.cluster.options import LauncherOptions, add_launcher_arguments, launcher_options
from gwdet.cluster.slurm import ClusterUnavailable
from gwdet.data import add_register_coco_argument, datasets_in_environment, prepare_datasets
from gwdet.utils.cli_errors import add_verbose_argument, at_least, output_path_problem, run_tool
from gwdet.model_zoo import build_config
from gwdet.modeling.example_weighing import weighable_types
from gwdet.norms import norm_record
from gwdet.utils.command_line import refuse_repeated_flags
from gwdet.engine.threads import AUTO_LOAD, THREADS_VARIABLE, ThreadChoice, choose_threads, thread_request
from gwdet_lab.study.cells import (
    CONFIG_PATTERNS,
    DEFAULT_BATCH_SIZES,
    STUDIES,
    STUDY_GROUPS,
    Cell,
    RunSpec,
    belongs_to_study,
    check_no_repeats,
    check_unique_names,
    paper_specs,
    parse_config_item,
    parse_extra,
    study_cells,
)
from gwdet_lab.study.cluster import REPORT_LOCK, folder_lock, list_jobs, submit_cells, wait_for_cells
from gwdet_lab.study.evaluation import PAPER_WEIGHTS
from gwdet_lab.study.record import (ON_MISMATCH, ConfigMismatch, PlannedCell, check_trained_as_recorded, code_note,
                                    check_seeds_of_one_configuration_alike, code_versions_note, common_overrides_note,
                                    confounded_note, machine_note, plan, plans_note, processes_note,
                                    resumed_loss_note, threads_note)
from gwdet_lab.study.records import (RecordsIncomplete, differing_results, export_records, missing_record_files,
                                    recorded_cells)
from gwdet_lab.study.report import (few_test_images_note, foreign_report_problem, other_model_note, reported_cells,
                                    write_report)
from gwdet_lab.study.run_folder import COMPLETE_JSON
from gwdet_lab.study.scheduler import Scheduler, is_done
from gwdet_lab.study.summary import display_path, summarize, train_command

DEFAULT_OUT = "output/study"
RUNS_FOLDER = "runs"
TITLES = {
    "paper": "From-scratch small-batch study: the paper's four configurations at 2 images per batch",
    "batch-sweep": "Batch-size sweep: box AP against images per batch, images seen held fixed",
    "heads": "BN + GW at S1-B2 with BN, GN or GW in the FPN and box head, beside all GN, at 2 images per batch",
    "custom": "Norm comparison",
}


PROG = "compare_norms.py"


DEFAULT_DATASET = "shapes"


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Train norm configurations from scratch over seeds and batch sizes, evaluate each "
                    "with COCOEvaluator, and report means, paired confidence intervals and plots. "
                    "Re-running resumes; a config that differs from a recorded run is refused.",
        epilog=(
            "examples:\n"
            "  compare_norms.py --study paper                       # BN, BN+GW, GN, GW x seeds 0,1,2\n"
            "  compare_norms.py --study batch-sweep --jobs 2        # the four x 1,2,4,8 images per batch\n"
            "  compare_norms.py --study heads                       # BN+GW with BN/GN/GW heads, GN x seeds 0-4\n"
            "  compare_norms.py --study paper --only gn-b2-s1       # one cell\n"
            "  compare_norms.py --study paper --list                # cells, their state and commands\n"
            "  compare_norms.py --study paper --launcher slurm --partition gpu --num-gpus 8  # one job per cell\n"
            "  compare_norms.py --configs gn=configs/Study/gn.yaml --extra bgn=configs/Study/bn.yaml \\\n"
            "      MODEL.RESNETS.NORM BGN MODEL.FPN.NORM BGN MODEL.ROI_BOX_HEAD.NORM BGN --seeds 0 1"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    runs = parser.add_argument_group("what to run")
    runs.add_argument("--study", choices=STUDIES, default=None,
                      help="a named study: 'paper' (the four configurations x --seeds, default 0 1 2) or "
                           "'batch-sweep' (the four x --batch-sizes, default 1 2 4 8, seed 0)")
    runs.add_argument("--dataset", choices=sorted(CONFIG_PATTERNS), default=DEFAULT_DATASET,
                      help="configs of the named studies: configs/Study (shapes, default) or "
                           "configs/Scratch (COCO; needs DETECTRON2_DATASETS)")
    runs.add_argument("--configs", nargs="+", metavar="[NAME=]CONFIG",
                      help="a custom set of configurations instead of a named study")
    runs.add_argument("--extra", nargs="+", action="append", default=[], metavar="ARG",
                      help="NAME=CONFIG [KEY VALUE ...]: add a configuration with overrides of its own "
                           "(repeatable)")
    # a negative seed would be detectron2's "draw a random seed" and be reported as a seed; zero
    # images per batch trains nothing
    runs.add_argument("--seeds", nargs="+", type=at_least(0, "a seed"), default=None,
                      help="seeds (SEED, each >= 0) of every configuration")
    runs.add_argument("--batch-sizes", nargs="+", type=at_least(1, "images per batch"), default=None,
                      help=f"batch-sweep: images per batch (default {' '.join(map(str, DEFAULT_BATCH_SIZES))}); "
                           "each cell scales the config's SOLVER.BASE_LR and iteration counts linearly from the "
                           "config's SOLVER.IMS_PER_BATCH, which --opts may set as the reference")
    runs.add_argument("--opts", nargs="+", default=[], metavar="KEY VALUE",
                      help="config overrides applied to every cell (they become part of its recorded config)")
    runs.add_argument("--only", nargs="+", metavar="CELL", help="run only these cells (names as --list shows)")
    # Each cell's process gets the registrations through $GWDET_REGISTER_COCO (gwdet.data.coco_registration).
    add_register_coco_argument(runs)
    parser.add_argument("--out", default=DEFAULT_OUT, type=os.path.expanduser,
                        help=f"output folder (default {DEFAULT_OUT})")
    parser.add_argument("--jobs", type=int, default=1, help="cells trained side by side (default 1)")
    parser.add_argument("--threads", type=thread_request, default=1, metavar="N|auto-load",
                        help="CPU threads per cell (OMP_NUM_THREADS and torch.set_num_threads; default 1, "
                             "which keeps a cell's numbers independent of the machine); 0 shares the CPUs this "
                             "process may use among --jobs, auto-load those other processes leave free at start "
                             "(gwdet.engine.threads); the study sets each cell's OMP_NUM_THREADS, whatever the "
                             "environment's")
    parser.add_argument("--num-gpus", type=int, default=1, help="GPUs per cell")
    parser.add_argument("--on-mismatch", choices=ON_MISMATCH, default="refuse",
                        help="when a cell's config differs from the one its folder recorded: stop before "
                             "training (refuse, default) or train into a new folder <cell>.2, ...")
    parser.add_argument("--example-weights", nargs="+", type=float, default=None, metavar="W",
                        help="inference example weights in [0, 1] swept on val for batch-norm models "
                             f"(default: {list(PAPER_WEIGHTS)})")
    parser.add_argument("--no-example-weighing", action="store_true", help="skip example weighing")
    parser.add_argument("--list", action="store_true", help="list the cells, their state and commands; train nothing")
    parser.add_argument("--report-only", action="store_true", help="write the report of the finished cells; train nothing")
    records = parser.add_argument_group("committed records (docs/study/records)")
    records.add_argument("--records", metavar="DIR", default=None, type=os.path.expanduser,
                         help="write the report from the cell records in DIR (e.g. docs/study/records/paper) "
                              "instead of run folders: configs come from the records; nothing is trained")
    records.add_argument("--report-to", metavar="DIR", default=None, type=os.path.expanduser,
                         help="folder of the report (default <out>/<study>)")
    records.add_argument("--export-records", metavar="DIR", default=None, type=os.path.expanduser,
                         help="after the report, copy each finished cell's records into DIR/<cell>/ "
                              "(what --records reads back; checkpoints are not copied)")
    records.add_argument("--overwrite", action="store_true",
                         help="with --export-records, replace the records kept in DIR of cells with the same config "
                              "but other results (refused without it)")
    add_verbose_argument(parser)
    add_launcher_arguments(parser, multi_machine=False)
    return parser


def study_name(args: argparse.Namespace) -> str:
    return args.study or "custom"


def resolve_specs(args: argparse.Namespace, repo_root: Path) -> list[RunSpec]:
    """The configurations the arguments name (config paths made absolute)."""
    if args.study and args.configs:
        raise GwdetValueError("Pass either --study (a named study) or --configs (your own set), not both.")
    if not args.study and args.dataset != DEFAULT_DATASET:
        raise GwdetValueError(f"--dataset {args.dataset} picks the configs of a named study (--study); your own "
                              "--configs and --extra train on the datasets their configs name. Leave --dataset out, or "
                              f"give configs of {args.dataset} (configs/Scratch for coco).")
    if not args.study and not args.configs and not args.extra:
        raise GwdetValueError("Name what to run: --study paper, --study batch-sweep, or --configs.")
    specs = paper_specs(args.dataset, repo_root, args.study) if args.study else []
    for flag, item in [*(("--configs", item) for item in args.configs or []),
                       *(("--extra", tokens[0]) for tokens in args.extra if tokens)]:
        _refuse_name_with_folder(flag, item)
    specs += [parse_config_item(item) for item in args.configs or []]
    specs += [parse_extra(tokens) for tokens in args.extra]
    check_unique_names(specs)
    return [RunSpec(s.name, str(Path(s.config_file).resolve()), s.opts) for s in specs]


def _refuse_name_with_folder(flag: str, item: str) -> None:
    """Refuse a ``NAME=CONFIG`` item of ``flag`` whose NAME holds a path separator while CONFIG is a
    file and the item as a whole is none: a run's name names its folder, so it cannot hold '/', and
    the item would be read as one config path that does not exist."""
    name, sep, path = item.partition("=")
    if not sep or not ("/" in name or os.sep in name) or not os.path.isfile(path) or os.path.isfile(item):
        return
    suggested = "".join(char if char.isascii() and (char.isalnum() or char in "_.+-") else "-" for char in name)
    suggested = suggested.lstrip("_.+-") or "mine"
    raise GwdetValueError(
        f"{flag} {item!r}: the run name {name!r} before '=' holds '/', and a run's name names its folder: it starts "
        "with an ASCII letter or digit and holds only ASCII letters, digits and _ . + -. Give NAME=CONFIG with such "
        f"a name, e.g. {suggested}={path}; nothing was run.")


def weighs_examples(cfg: CfgNode) -> bool:
    """Whether the model of ``cfg`` has layers example weighing applies to (torch's batch norms:
    :func:`gwdet.modeling.example_weighing.weighable_types`), as the worker's sweep needs."""
    weighable = weighable_types()
    return any(issubclass(kind, weighable) for name in built_norm_names(cfg) for kind in norm_record(name).layer_types)


def build_cells(args: argparse.Namespace, repo_root: Path) -> list[Cell]:
    """The cells the arguments ask for; repeated ``--seeds`` or ``--batch-sizes`` are refused
    before any config is built."""
    check_no_repeats("--seeds", args.seeds)
    too_large = [seed for seed in args.seeds or () if seed >= SEED_LIMIT]
    if too_large:
        raise GwdetValueError(f"--seeds {too_large[0]}: give seeds from 0 to 2**32 - 1 = {SEED_LIMIT - 1} (numpy's "
                              "limit); each cell trains with SEED set to its seed.")
    check_no_repeats("--batch-sizes", args.batch_sizes)
    specs = resolve_specs(args, repo_root)
    base_configs = []
    for spec in specs:
        try:
            base_configs.append(build_config(spec.config_file, [*args.opts, *spec.opts]))
        except (AssertionError, KeyError, ValueError) as error:
            raise GwdetValueError(f"Run {spec.name!r} ({spec.config_file}): {error}") from error
    if args.batch_sizes and args.study != "batch-sweep":
        raise GwdetValueError("--batch-sizes belongs to --study batch-sweep.")
    cells = study_cells(study_name(args), specs, base_configs, args.seeds, args.batch_sizes)
    if args.only:
        unknown = set(args.only) - {c.name for c in cells}
        if unknown:
            raise GwdetValueError(f"--only: no cell named {', '.join(sorted(unknown))}; cells: "
                                  + ", ".join(c.name for c in cells))
        cells = [c for c in cells if c.name in args.only]
    return cells


def cluster_options(args: argparse.Namespace) -> LauncherOptions | None:
    """The checked launcher flags when cells are to be submitted as jobs (``None``: run them here);
    ``ValueError`` / ``ClusterUnavailable`` before anything is written."""
    options = launcher_options(args, args.num_gpus)
    if not options.submits or args.list or args.report_only:
        return None
    if options.nodes != 1:
        raise GwdetValueError("--nodes: a study cell runs on one node (its --num-gpus processes); "
                              "train a multi-node run with tools/train_net.py --launcher slurm --nodes N")
    check_launcher(options)
    return options


def main(argv: Sequence[str] | None = None, repo_root: Path | None = None) -> int:
    """Run the study the command line describes; return the exit status. An error gwdet raises on
    purpose ends it with ``compare_norms.py: error: <message>`` and status 2; ``--verbose`` shows
    tracebacks (:mod:`gwdet.utils.cli_errors`)."""
    return run_tool(lambda command: _run_study(command, repo_root or Path(__file__).resolve().parents[2]), argv, PROG)


def check_weights_given_once(weights: Sequence[float] | None) -> None:
    """Refuse ``--example-weights`` that gives a weight more than once (``0.5 0.5``, or ``0.5 .50``,
    the same number): each weight is one evaluation of every batch-norm cell on val, among which
    the best is chosen, so a repeated one would run the same evaluation twice."""
    repeated = [weight for weight, count in Counter(weights or ()).items() if count > 1]
    if repeated:
        once = " ".join(f"{weight:g}" for weight in dict.fromkeys(weights or ()))
        raise GwdetValueError(
            f"--example-weights gives {', '.join(f'{weight:g}' for weight in repeated)} more than once: each weight is "
            "one evaluation of every batch-norm cell on val, among which the best is chosen, so a repeated one would "
            f"run the same evaluation twice. Give each weight once, e.g. --example-weights {once}.")


def _run_study(argv: list[str], repo_root: Path) -> int:
    parser = argument_parser()
    refuse_repeated_flags(parser, argv)  # argparse keeps the last --configs, --seeds, --opts, ... without a word
    args = parser.parse_args(argv)
    if len(args.opts) % 2:
        parser.error(f"--opts takes KEY VALUE pairs, got {args.opts}")
    problem = set_by_the_study(args)
    if problem:
        parser.error(problem)
    if args.no_example_weighing and args.example_weights is not None:
        parser.error("--example-weights chooses among weights that --no-example-weighing skips: give one of them.")
    if not all(0.0 <= w <= 1.0 for w in chosen_weights(args)):
        parser.error(f"--example-weights must lie in [0, 1], got {args.example_weights}")
    check_weights_given_once(args.example_weights)
    if args.list:
        refuse_flags_list_ignores(parser, args)
    elif args.report_only and flags_of_training(parser, args, LIST_IGNORED_DESTS):
        raise GwdetValueError(
            f"--report-only writes the report of the cells' results and trains nothing (here or on a cluster), so "
            f"{', '.join(flags_of_training(parser, args, LIST_IGNORED_DESTS))} would be ignored: drop them, or run the "
            "same command without --report-only to train the cells; nothing was written.")
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    if isinstance(args.threads, int) and args.threads < 0:
        parser.error(f"--threads {args.threads}: give the CPU threads of each cell, at least 1 (0: share the CPUs "
                     f"this process may use among --jobs; {AUTO_LOAD}: those other processes leave free)")
    if args.threads == AUTO_LOAD and args.launcher != "local":
        parser.error(f"--threads {AUTO_LOAD} reads this machine's load, not that of the nodes the cells run on: "
                     "give --threads N with --launcher " + args.launcher)
    if args.num_gpus < 1:
        parser.error(f"--num-gpus {args.num_gpus}: give the processes (GPUs) of each cell, at least 1")
    problem = output_path_problem("--out", args.out, folder=True)
    if problem:
        parser.error(problem + read_only_study_hint(args))
    runs = Path(args.out) / RUNS_FOLDER
    if runs.exists() and not runs.is_dir():
        parser.error(f"--out {args.out} holds a file named {RUNS_FOLDER}, where the study keeps its cells' run "
                     "folders: move the file away, or give another --out; nothing was written.")
    if args.export_records:
        problem = output_path_problem("--export-records", args.export_records, folder=True)
        if problem:
            parser.error(problem)
    if args.overwrite and not args.export_records:
        parser.error("--overwrite replaces the records --export-records DIR would otherwise refuse to replace, but no "
                     "--export-records was given: add --export-records DIR, or leave --overwrite out.")
    if args.report_to is not None:
        problem = (output_path_problem("--report-to", args.report_to, folder=True)
                   or foreign_report_problem("--report-to", Path(args.report_to), list(TITLES.values())))
        if problem:
            parser.error(problem)
    weights = chosen_weights(args)
    out_dir = Path(args.out).resolve()
    if args.records:
        given = [flag for flag, value in (("--configs", args.configs), ("--extra", args.extra), ("--opts", args.opts),
                                          ("--seeds", args.seeds), ("--batch-sizes", args.batch_sizes),
                                          ("--dataset", args.dataset != parser.get_default("dataset")),
                                          ("--no-example-weighing", args.no_example_weighing)) if value]
        given += flags_of_training(parser, args)
        if given:
            parser.error(f"{', '.join(given)}: --records reports the cells as their records hold them (configs, "
                         "overrides, seeds, batch sizes, datasets, the evaluations they ran) and trains nothing, here "
                         "or on a cluster, so these would not apply; drop them (--only picks recorded cells).")
        if args.list:  # what the records hold; no report (it wrote one into --out's default)
            planned = recorded_cells(Path(args.records), args.only)
            list_cells(planned, records_weights(args, planned, weights))
            return 0
        return report_from_records(args, Path(args.records), weights, out_dir)
    with datasets_in_environment(args.register_coco):  # for prepare_datasets here and in every cell's process
        return _plan_and_run(args, argv, parser, weights, out_dir, repo_root)


# Flags of how cells are trained (where, how many side by side, with what threads and GPUs, into
# which folder on a mismatch), which a ``--records`` report, training nothing, does not read.
TRAINING_DESTS = ("jobs", "threads", "num_gpus", "on_mismatch", "launcher", "nodes", "gpus_per_node", "cpus_per_task",
                  "partition", "account", "timeout_min", "slurm_extra", "wait")


# The flags of TRAINING_DESTS that ``--list`` does not read either: all but --on-mismatch, which
# picks the folder each cell is listed with (<cell>.2 for a config that differs from its record).
LIST_IGNORED_DESTS = tuple(dest for dest in TRAINING_DESTS if dest != "on_mismatch")


def flags_of_training(parser: argparse.ArgumentParser, args: argparse.Namespace,
                      dests: Collection[str] = TRAINING_DESTS) -> list[str]:
    """The flags of ``dests`` (by default :data:`TRAINING_DESTS`) that ``args`` gives other values
    than their defaults, each as the command line names it with its value (``--launcher slurm``,
    ``--wait``)."""
    flags = []
    for action in parser._actions:
        if action.dest not in dests:
            continue
        value = getattr(args, action.dest)
        if value == parser.get_default(action.dest):
            continue
        flag = action.option_strings[-1]
        if isinstance(value, bool):
            flags.append(flag)
        elif isinstance(value, list):
            flags.append(" ".join(f"{flag} {item}" for item in value))
        else:
            flags.append(f"{flag} {value}")
    return flags


def refuse_flags_list_ignores(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse, with ``--list``, the flags it would ignore without a word: those of the report
    (``--report-only``, ``--report-to``, ``--export-records``), and those of how cells train
    (:data:`LIST_IGNORED_DESTS`: ``--jobs``, ``--threads``, ``--num-gpus`` and the launcher's),
    the latter where given other values than their defaults. A listing reads neither: it trains
    nothing, here or on a cluster (a cell's job and its state come from the job recorded in its
    folder), and writes no report."""
    report_flags = [flag for flag, given in (("--report-only", args.report_only),
                                             (f"--report-to {args.report_to}", args.report_to is not None),
                                             (f"--export-records {args.export_records}",
                                              args.export_records is not None)) if given]
    training_flags = flags_of_training(parser, args, LIST_IGNORED_DESTS)
    if not report_flags and not training_flags:
        return
    does = " and ".join((["trains nothing (here or on a cluster)"] if training_flags else [])
                        + (["writes no report"] if report_flags else []))
    then = " or ".join((["train the cells"] if training_flags else []) + (["write the report"] if report_flags else []))
    raise GwdetValueError(
        f"--list only lists the cells and {does}, so {', '.join(report_flags + training_flags)} would be ignored: "
        f"run --list alone to see the cells, and the same command without --list to {then}; nothing was written.")


def set_by_the_study(args: argparse.Namespace) -> str | None:
    """Why an override of ``--opts`` or ``--extra`` would be ignored: a key the study sets in every
    cell itself (the seed, the output folder), which the cell's own value replaces; ``None`` when
    there is none. ``SOLVER.IMS_PER_BATCH`` and ``SOLVER.BASE_LR`` are not among them: in a batch
    sweep (default or given ``--batch-sizes`` alike) they are the reference batch and learning rate
    that each cell's batch scales linearly."""
    owners = {"SEED": "--seeds", "OUTPUT_DIR": "--out: each cell trains in <out>/runs/<cell>"}
    given = [("--opts", key) for key in args.opts[::2]]
    given += [("--extra", key) for tokens in args.extra for key in tokens[1::2]]
    for flag, key in given:
        if key in owners:
            return (f"{flag} gives {key}, which the study sets in every cell itself ({owners[key]}), so the value "
                    f"would be ignored while the report lists it; leave {key} out of {flag}.")
    return None


def read_only_study_hint(args: argparse.Namespace) -> str:
    """For a report or list of a study whose --out may not be written: the way that reads its cells
    without writing there (``--records <out>/runs``), when that folder holds them; else nothing."""
    runs = Path(args.out) / RUNS_FOLDER
    if not (args.report_only or args.list) or args.records or not runs.is_dir():
        return ""
    return (f" To report the cells this study holds without writing into --out, read them as records: --records "
            f"{runs} --report-to DIR (a DIR this process may write), without --configs, --seeds and the other "
            "training flags.")


def _plan_and_run(args: argparse.Namespace, argv: Sequence[str], parser: argparse.ArgumentParser,
                  weights: Sequence[float], out_dir: Path, repo_root: Path) -> int:
    """Plan the cells, then list them, submit them as jobs, or run them here, and write the report;
    the exit status."""
    try:
        options = cluster_options(args)
    except (ValueError, ClusterUnavailable) as error:
        print(f"compare_norms.py: error: {error}", file=sys.stderr)
        return 2
    try:
        cells = build_cells(args, repo_root)
        # --only runs some of the study's cells: the others' reports are this study's, not another's
        study = {cell.name for cell in build_cells(argparse.Namespace(**{**vars(args), "only": None}), repo_root)}
        if not args.list:  # before anything trains or is recorded
            check_no_other_study(report_folder(args, out_dir), study)
        # --report-only trains nothing, so it records no cell either (a mistyped --out stays empty)
        planned = plan(cells, out_dir / RUNS_FOLDER, args.opts, args.on_mismatch,
                       record=not (args.list or args.report_only))
        for item in planned:  # a listing reads no image: the shapes dataset is generated by the cells that train
            prepare_datasets(item.cfg, shapes=not args.list)
    except ConfigMismatch as error:
        print(f"compare_norms.py: error: {error}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError, KeyError) as error:
        parser.error(str(error))
    if args.example_weights is not None and not any(weighs_examples(item.cfg) for item in planned):
        parser.error(f"--example-weights {' '.join(f'{w:g}' for w in args.example_weights)}: example weighing applies "
                     "to batch norms (BN, SyncBN), and no cell's model has one (its norms: "
                     f"{', '.join(sorted({name for item in planned for name in built_norm_names(item.cfg)})) or 'none'}"
                     "), so the weights would be swept nowhere. Leave --example-weights out, or add a configuration "
                     "with batch norms.")
    if args.list:
        list_cells(planned, weights)
        return 0
    if options is not None:
        return run_on_cluster(args, argv, options, planned, weights, out_dir, repo_root)
    threads = cell_threads(args.threads, args.jobs)
    echo(f"study {study_name(args)}: {len(planned)} cells into {out_dir / RUNS_FOLDER}, {args.jobs} at a time; "
         + threads_line(threads))
    outcome = None
    if not args.report_only:
        # `kill PID` stops the study as Ctrl-C does; its workers stop too, their checkpoints stay.
        previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
        scheduler = Scheduler(planned, args.jobs, threads.threads, weights, args.num_gpus, echo)
        try:
            outcome = scheduler.run()
        except KeyboardInterrupt:
            echo("interrupted; run the same command again to resume")
            return 130
        finally:
            signal.signal(signal.SIGTERM, previous)  # main() may run inside another program (a test)
    try:
        written = report(args, planned, weights, out_dir, study)
    except ValueError as error:  # a damaged record of a cell (DamagedFile) or results without the report split
        print(f"compare_norms.py: error: no report written: {error}", file=sys.stderr)
        return 2
    if outcome is None:
        if written is None:  # --report-only of a study none of whose cells finished: a mistyped --out?
            print(f"compare_norms.py: error: --report-only: no cell of this study has finished in "
                  f"{out_dir / RUNS_FOLDER}, so there is no report; nothing was written. Check --out and the study's "
                  "flags (--list shows each cell's state), or train the cells first (the same command without "
                  "--report-only).", file=sys.stderr)
            return 2
        return 0
    return 1 if outcome.failed or outcome.busy else 0


def cell_threads(requested: int | str, jobs: int, environ: Mapping[str, str] = os.environ) -> ThreadChoice:
    """The CPU threads of each cell run here for ``--threads`` ``requested``: a number as it is;
    ``auto-load`` the usable CPUs other processes leave free, and 0 the usable CPUs (cgroup quota,
    affinity, ``SLURM_CPUS_PER_TASK``), each divided among ``jobs``. The study sets every cell's
    ``OMP_NUM_THREADS`` itself, so that variable of ``environ`` chooses nothing; for 0 the reason
    says when it was set aside."""
    if requested != 0:
        return choose_threads(requested, processes=jobs, environ=environ)
    rest = {key: value for key, value in environ.items() if key != THREADS_VARIABLE}
    choice = choose_threads(None, processes=jobs, environ=rest)
    reason = f"--threads 0: {choice.reason}"
    if environ.get(THREADS_VARIABLE):
        reason += (f"; {THREADS_VARIABLE}={environ[THREADS_VARIABLE]} of the environment set aside, as --threads "
                   "sets each cell's")
    return dataclasses.replace(choice, reason=reason)


def threads_line(choice: ThreadChoice, environ: Mapping[str, str] = os.environ) -> str:
    """The log's line of the cells' threads: :meth:`ThreadChoice.describe` with the ways a study
    overrides them (``--threads``; not ``OMP_NUM_THREADS``, which the study sets in each cell)."""
    return choice.describe(environ).replace(f", --threads {AUTO_LOAD} or {THREADS_VARIABLE}.",
                                            f" or --threads {AUTO_LOAD}.")


def run_on_cluster(args: argparse.Namespace, argv: Sequence[str], options: LauncherOptions,
                   planned: Sequence[PlannedCell], weights: Sequence[float], out_dir: Path, repo_root: Path) -> int:
    """Submit the cells' jobs (:mod:`gwdet_lab.study.cluster`); with ``--wait``, wait for them and
    write the report."""
    echo(f"study {study_name(args)}: {len(planned)} cells into {out_dir / RUNS_FOLDER}, one {options.launcher} "
         "job each")
    try:
        submitted = submit_cells(planned, options, weights, args.threads or None, args.num_gpus, argv, repo_root,
                                 out_dir / RUNS_FOLDER, echo)
    except (SubmissionRefused, ClusterUnavailable) as error:
        print(f"compare_norms.py: error: {error}", file=sys.stderr)
        return 2
    echo(f"submitted {len(submitted)} job(s)" + (f": {', '.join(submitted)}" if submitted else "")
         + f"; the last cell to end writes the report in {out_dir / study_name(args)}. "
         "Follow with --list (the study's flags without the launcher's); --report-only writes it at any time.")
    if not options.wait:
        return 0
    failed = wait_for_cells(planned, weights, echo)
    report(args, planned, weights, out_dir)
    return 1 if failed else 0


def chosen_weights(args: argparse.Namespace) -> list[float]:
    """The example weights the study sweeps: none with ``--no-example-weighing``, else
    ``--example-weights`` (default: the paper's)."""
    if args.no_example_weighing:
        return []
    return list(PAPER_WEIGHTS) if args.example_weights is None else args.example_weights


def report_if_complete(argv: Sequence[str], repo_root: Path) -> list[Path] | None:
    """Write the report of the study ``argv`` describes if every one of its cells is done (what a
    cell's job does when it ends: the last one to end writes it); the files written, else ``None``."""
    args = argument_parser().parse_args(list(argv))
    weights = chosen_weights(args)
    out_dir = Path(args.out).resolve()
    with datasets_in_environment(args.register_coco):
        planned = plan(build_cells(args, repo_root), out_dir / RUNS_FOLDER, args.opts, args.on_mismatch, record=False)
        with folder_lock(out_dir / REPORT_LOCK):
            if not all(is_done(p, weights) for p in planned):
                return None
            return report(args, planned, weights, out_dir)


def report(args: argparse.Namespace, planned: Sequence[PlannedCell], weights: Sequence[float],
           out_dir: Path, study: Collection[str] = ()) -> list[Path] | None:
    """Write the report of the finished cells; the files written (``None`` when none is finished).
    A report folder holding the report of other cells is refused, but for cells of ``study`` (the
    names of the whole study, of which ``--only`` ran some)."""
    done = [p for p in planned if is_done(p, weights)]
    pending = [p.cell.name for p in planned if p not in done]
    if not done:
        echo("no finished cell yet: no report")
        return None
    check_trained_as_recorded(done)
    check_seeds_of_one_configuration_alike(done)
    name = study_name(args)
    folder = report_folder(args, out_dir)
    own = {p.cell.name for p in planned} | set(study)
    check_no_other_study(folder, own)  # before the cells' test images are resampled
    results = [summarize(p) for p in done]
    notes = []
    if args.only:
        notes.append(f"Only the cells {', '.join(args.only)} were requested.")
    notes += [note for note in (common_overrides_note(done, args.opts), code_note(done), code_versions_note(done),
                                confounded_note(done), threads_note(done), processes_note(done), plans_note(done),
                                machine_note(done), resumed_loss_note(done), few_test_images_note(results),
                                other_model_note(results))
              if note]
    # checked again with the folder held: another report written there meanwhile
    paths = write_report(TITLES[name], results, pending, folder, notes, check=lambda: check_no_other_study(folder, own))
    echo("wrote " + ", ".join(display_path(str(p)) for p in paths))
    if args.export_records:
        try:
            replaced = differing_results(done, Path(args.export_records)) if args.overwrite else []
            exported = export_records(done, Path(args.export_records), overwrite=args.overwrite)
        except ValueError as error:  # the report stands: say so, not "no report written"
            raise RecordsNotExported(f"the report is written ({display_path(str(paths[0].parent))}), the records were "
                                     f"not exported: {error}") from None
        if replaced:
            echo(f"--overwrite: replaced the records of {len(replaced)} cell(s) in {display_path(args.export_records)} "
                 f"that held other results: {'; '.join(replaced)}")
        echo(f"records of {len(exported)} cell(s) copied into {display_path(args.export_records)}")
    return list(paths)


def check_no_other_study(folder: Path, own: Collection[str]) -> None:
    """Refuse a report into ``folder`` when it holds the report of cells other than ``own`` (the
    names of the whole study, of which ``--only`` runs some): another study's in the same place
    (two studies sharing one ``--out`` report into the same folder)."""
    others = reported_cells(folder) - set(own)
    if others:
        raise GwdetValueError(
            f"{folder} holds the report of other cells ({', '.join(sorted(others)[:4])}"
            f"{', ...' if len(others) > 4 else ''}): another study's in the same place, which this study's report would "
            "replace. Give this study a folder of its own (--report-to DIR, or another --out); nothing was written.")


class RecordsNotExported(GwdetError, RuntimeError):
    """The report was written, the ``--export-records`` copy refused (the message says both)."""


def report_folder(args: argparse.Namespace, out_dir: Path) -> Path:
    return Path(args.report_to) if args.report_to else out_dir / study_name(args)


def swept_weights(planned: Sequence[PlannedCell]) -> list[float] | None:
    """The example weights the recorded cells ``planned`` swept, as their ``study_complete.json``
    lists them: those of the cells example weighing applies to (the cells that evaluated batch
    statistics), an empty list when they swept none (a study run with ``--no-example-weighing``);
    ``None`` when no cell applies or the cells swept different weights."""
    sweeps = []
    for item in planned:
        marker = item.folder.read_json(COMPLETE_JSON) if item.folder.file(COMPLETE_JSON).is_file() else {}
        if "batch_statistics" in marker.get("evaluations", []):
            sweeps.append([float(weight) for weight in marker.get("example_weights", [])])
    if not sweeps or any(set(sweep) != set(sweeps[0]) for sweep in sweeps):
        return None
    return sweeps[0]


def records_weights(args: argparse.Namespace, planned: Sequence[PlannedCell], weights: Sequence[float]) -> list[float]:
    """The example weights a ``--records`` report or list uses: ``--example-weights`` when given,
    else the weights the records swept (:func:`swept_weights`), else ``weights`` (the default)."""
    swept = swept_weights(planned) if args.example_weights is None else None
    return list(weights) if swept is None else swept


def report_from_records(args: argparse.Namespace, records_dir: Path, weights: Sequence[float], out_dir: Path) -> int:
    """``--records``: the report of the cells recorded in ``records_dir`` (every one, or ``--only``),
    with the configs their records hold and the example weights they swept (:func:`records_weights`);
    the cells must be finished."""
    planned = recorded_cells(records_dir, args.only)
    weights = records_weights(args, planned, weights)
    if args.study:
        foreign = [p.cell.name for p in planned if not belongs_to_study(p.cell, args.study)]
        if foreign:
            raise GwdetValueError(
                f"--study {args.study} --records {records_dir}: {', '.join(foreign)} are not cells of that study "
                f"(its cells are {'/'.join(STUDY_GROUPS[args.study])}-b<images>-s<seed> from the study's config files"
                + (" at their own batch size" if args.study != "batch-sweep" else "")
                + "), so the report's title would misname them; nothing was written. Give the --study they were "
                "trained as, or no --study (a custom study's report).")
    if args.example_weights is not None:  # the records chose among the weights they swept, which the report shows
        markers = {p.cell.name: p.folder.read_json(COMPLETE_JSON) for p in planned}
        other = [f"{name} ({', '.join(f'{w:g}' for w in marker.get('example_weights', []))})"
                 for name, marker in markers.items() if "example_weighing" in marker.get("evaluations", [])
                 and set(marker.get("example_weights", [])) != set(weights)]
        if other:
            raise GwdetValueError(
                f"--example-weights {' '.join(f'{w:g}' for w in weights)}: the records chose their example weight on "
                f"val among other weights ({'; '.join(other[:3])}{'; ...' if len(other) > 3 else ''}), and the report "
                "shows that choice; records hold no results for another sweep. Leave --example-weights out, or "
                "run the cells again with these weights; nothing was written.")
    incomplete = {p.cell.name: missing for p in planned if (missing := missing_record_files(p))}
    if incomplete:
        raise RecordsIncomplete(
            f"--records {records_dir}: " + "; ".join(f"{name} not finished in the records (no {', '.join(missing)})"
                                                      for name, missing in incomplete.items())
            + ": a copy or export cut short, or records of a cell that had not finished. Export the finished cells "
            "again (the study's command with --report-only --export-records DIR), or copy their records again; "
            "nothing was written.")
    unfinished = [p.cell.name for p in planned if not is_done(p, weights)]
    if unfinished:
        swept = swept_weights(planned)
        if swept == []:
            fix = ("they swept none (a study run with --no-example-weighing): leave --example-weights out to report "
                   "them without example weighing")
        elif swept is not None and set(swept) == set(weights):
            fix = ("their recorded example weight is not the one their recorded val APs choose among them: export or "
                   "copy their records again")
        elif swept is not None:
            fix = f"give the weights they swept (--example-weights {' '.join(f'{w:g}' for w in swept)}), or leave it out"
        else:
            fix = ("the cells swept different weights (each study_complete.json lists its own): report the cells of "
                   "one sweep together (--only)")
        raise RecordsIncomplete(
            f"--records {records_dir}: {', '.join(unfinished)} not finished in the records (their example weighing "
            f"did not sweep --example-weights {' '.join(f'{w:g}' for w in weights)}"
            f"{' (the default)' if args.example_weights is None else ''}); {fix}; nothing was written.")
    report(args, planned, weights, out_dir)
    return 0


def list_cells(planned: Sequence[PlannedCell], weights: Sequence[float]) -> None:
    """Each cell's state (done, busy, to weigh: trained and evaluated, its example weighing over
    ``weights`` pending; interrupted, not started), folder, cluster job (id and state from SLURM)
    and its train_net command."""
    jobs = list_jobs(planned)
    for item in planned:
        folder = item.folder
        state = ("done" if is_done(item, weights) else "busy" if folder.is_busy()
                 else "to weigh" if folder.is_complete() else "interrupted" if folder.has_checkpoint() else "not started")
        print(f"{item.cell.name:<22} {state:<12} {display_path(str(folder.path))}")
        if item.cell.name in jobs:
            print(f"    {jobs[item.cell.name]}")
        print(f"    {train_command(item)}")


def echo(line: str) -> None:
    """Progress goes to stdout at once, even when it is a pipe or a file."""
    print(f"[compare_norms {datetime.datetime.now():%m-%d %H:%M:%S}] {line}", flush=True)
