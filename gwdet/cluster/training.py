"""``tools/train_net.py``: train here, or submit the same training as a SLURM job through submitit.

The tool's flags (:func:`argument_parser`) are the trainer's and the launcher's.
``--launcher local`` (default) starts ``--num-gpus`` processes here (:func:`train_here`).
``--launcher slurm`` / ``submitit-local`` checks everything it can first (submitit installed,
SLURM reachable, the config, the output folder), then submits one :class:`TrainingJob`, prints the
job id, its log files and how to follow it, and returns; ``--wait`` waits and prints the result.
On each node the job runs :func:`train_here` with that node's ``--machine-rank``, the number of
nodes and the first node's address (:class:`gwdet.cluster.jobs.NodePlacement`).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Callable, Iterator, Sequence

import torch
from detectron2.utils.logger import setup_logger

from gwdet.cluster.executor import (JobRefused, SubmissionRefused, active_jobs_in, check_launcher, describe,
                                    make_executor, submit, unstartable, wait)
from gwdet.cluster.jobs import NodePlacement, RequeueableJob, earlier_result, honour_stop_requests
from gwdet.cluster.options import add_launcher_arguments, launcher_options
from gwdet.cluster.slurm import ClusterUnavailable
from gwdet.errors import GwdetError, GwdetValueError
from gwdet.utils.cli_errors import run_tool, tool_name
from gwdet.utils.command_line import replace_flags
from gwdet.engine import arguments
from gwdet.engine.launch import launch
from gwdet.engine.output_dir import check_not_in_use
from gwdet.engine.run import RunConfig, check_config_unchanged, check_output_request, config_text, load_run_config, main
from gwdet.utils.run_file_names import EVAL_FOLDER, RESULTS_JSON, RESULTS_MARKDOWN
from gwdet.engine.threads import THREADS_VARIABLE, configure_threads

JOBS_FOLDER = "submitit"  # inside OUTPUT_DIR: <job id>/ with submitit's pickles and logs


def argument_parser() -> argparse.ArgumentParser:
    """The train tool's flags: the trainer's (:func:`gwdet.engine.arguments.argument_parser`) and the
    launcher's (``--launcher``, ``--nodes``, ``--partition``, ...: :mod:`gwdet.cluster.options`)."""
    parser = arguments.argument_parser()
    add_launcher_arguments(parser)
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """:func:`argument_parser`'s arguments, read as :func:`gwdet.engine.arguments.parse_args` reads them
    (flags may follow the ``KEY VALUE`` overrides)."""
    return arguments.parse_args(argv, argument_parser())


# The loggers detectron2's setup_logger gives handlers during a run (detectron2's, fvcore's, gwdet's).
RUN_LOGGERS = ("detectron2", "fvcore", "gwdet")


@contextlib.contextmanager
def process_left_as_found() -> Iterator[None]:
    """What a run changes in the process that calls it, put back when it returns (a second run from
    one's own code or a notebook then starts as in a fresh process): the thread settings (torch's
    count, ``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS``) and the log handlers detectron2's
    ``setup_logger`` adds (each run's log.txt holds that run only, its console lines printed once)."""
    variables = {name: os.environ.get(name) for name in (THREADS_VARIABLE, "MKL_NUM_THREADS")}
    threads = torch.get_num_threads()
    handlers = {name: list(logging.getLogger(name).handlers) for name in RUN_LOGGERS}
    try:
        yield
    finally:
        for name, value in variables.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        torch.set_num_threads(threads)
        for name, kept in handlers.items():
            logger = logging.getLogger(name)
            for handler in [handler for handler in logger.handlers if handler not in kept]:
                logger.removeHandler(handler)
                handler.close()
        setup_logger.cache_clear()  # it returns a logger without handlers once set up: set up again next time


def train_here(args: argparse.Namespace) -> None:
    """Train (or evaluate) with ``args`` on this machine: ``--num-gpus`` processes; the calling
    process is left as it was found (:func:`process_left_as_found`)."""
    print("Command Line Args:", args, flush=True)
    with process_left_as_found():
        configure_threads(args.threads, processes=args.num_gpus)
        launch(main, args.num_gpus, num_machines=args.num_machines, machine_rank=args.machine_rank,
               dist_url=args.dist_url, args=(args,), rendezvous_timeout=timedelta(seconds=args.rendezvous_timeout),
               evaluation=args.eval_only)


@dataclass(frozen=True)
class TrainingJob(RequeueableJob):
    """``tools/train_net.py ARGV`` on every node of a submitit job, run from folder ``cwd``."""

    argv: tuple[str, ...]
    cwd: str
    config: str = ""  # the config as checked when the job was submitted (gwdet.engine.run.config_text)

    def __call__(self) -> dict:
        honour_stop_requests()
        placement = NodePlacement.from_environment()
        if placement.restarts:
            finished, result = earlier_result()
            if finished:  # --resume would be refused: the run is finished
                print(f"[gwdet] {placement.describe()}: the job had finished before it was requeued; nothing to do "
                      "(its result is kept)", flush=True)
                return result
        resumes = self.resumes(placement)
        flags = ["--launcher", "local", *placement.machine_flags(), *(["--resume"] if resumes else [])]
        print(f"[gwdet] {placement.describe()}: "
              + ("continuing from the newest checkpoint (--resume)" if resumes else "starting"), flush=True)
        os.chdir(self.cwd)
        args = parse_job_args(replace_flags(argument_parser(), self.argv, flags))
        run = load_run_config(args.config_file, args.opts)
        if self.config:  # the files are read again here, perhaps long after the submission
            check_config_unchanged(run, self.config, "when the job was submitted")
        output_dir = os.path.abspath(run.output_dir)
        before = results_files(output_dir) if args.eval_only else set()
        train_here(args)
        # an --eval-only writes into a folder of its own where OUTPUT_DIR holds a run (eval/<checkpoint>[-N]/)
        folder = newest_results_folder(output_dir, before) if args.eval_only else output_dir
        results = Path(folder, RESULTS_JSON) if folder else None
        return {"output_dir": folder or output_dir,
                "results": json.loads(results.read_text()) if results and results.is_file() else None}


def parse_job_args(argv: Sequence[str]) -> argparse.Namespace:
    """:func:`parse_args` of a job's command line, read again where the job starts: argparse's refusal
    there (a config file moved or deleted since the submission) is raised as a
    :class:`~gwdet.errors.GwdetValueError`, which ``--wait`` prints as the one-line error it is here."""
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            args = parse_args(argv)
    except SystemExit:
        message = errors.getvalue().partition(": error: ")[2].strip()  # after argparse's usage lines
        raise GwdetValueError("The job's command line, checked when it was submitted, was refused when the job "
                              "started (a file it names was moved, deleted or changed in between?); nothing was run: "
                              f"put the file back, or submit the command again. {message}") from None
    sys.stderr.write(errors.getvalue())  # what parsing warned of
    return args


def results_files(output_dir: str) -> set[str]:
    """The results files (``results.json``) of ``output_dir`` and of its evaluations (``eval/*/``)."""
    evaluations = os.path.join(output_dir, EVAL_FOLDER)
    folders = [output_dir, *([entry.path for entry in os.scandir(evaluations) if entry.is_dir()]
                             if os.path.isdir(evaluations) else [])]
    return {path for path in (os.path.join(folder, RESULTS_JSON) for folder in folders) if os.path.isfile(path)}


def newest_results_folder(output_dir: str, before: set[str]) -> str | None:
    """The folder of the newest results file of ``output_dir`` (:func:`results_files`) not among
    ``before``: where an ``--eval-only`` of it started after ``before`` was taken wrote its results
    (``output_dir`` itself, or ``eval/<checkpoint>[-N]/`` where it holds a run), the newest being
    the evaluation that ended last; ``None`` when none was written."""
    written = results_files(output_dir) - before
    return os.path.dirname(max(written, key=lambda path: os.stat(path).st_mtime_ns)) if written else None


def checked_run(args: argparse.Namespace) -> tuple[RunConfig, Callable[[], None]]:
    """The run ``args`` describe (its output folder: ``OUTPUT_DIR`` of a yacs config,
    ``train.output_dir`` of a LazyConfig), and the check of the request against that folder."""
    run = load_run_config(args.config_file, args.opts)
    return run, lambda: check_output_request(args, run)


def check_before_submitting(args: argparse.Namespace) -> RunConfig:
    """The config builds, its datasets fit it (classes, categories, names registered: what a run
    checks before it writes anything; the device is the job's nodes', not checked here) and the
    output folder fits the request, as the job will check them; returns the run. ``--overwrite`` is
    left to the job (it deletes the earlier run when it starts)."""
    run, check_request = checked_run(args)
    run.register_datasets(getattr(args, "register_coco", None) or (), trains=not args.eval_only, evaluates=True)
    if args.eval_only or args.resume or not args.overwrite:
        check_request()
    return run


def submit_training(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Submit ``argv`` as a :class:`TrainingJob`; the exit status (2: refused, nothing submitted)."""
    try:
        options = launcher_options(args, args.num_gpus)
        check_launcher(options)
        run = check_before_submitting(args)
        output_dir = Path(run.output_dir).resolve()
        if options.launcher == "submitit-local":  # the job starts at once: it would find the folder in use
            check_not_in_use(str(output_dir))
        folder = output_dir / JOBS_FOLDER
        queued = active_jobs_in(folder) if options.launcher == "slurm" else []
        if queued:  # it would find the folder in use when it starts, and fail in its own log only
            raise SubmissionRefused(
                f"OUTPUT_DIR {output_dir} is the folder of job {', '.join(queued)}, still queued or running "
                f"(squeue -j {','.join(queued)}): a second job would find it in use when it starts. Wait for that job "
                f"to end (then submit with --resume to continue it), cancel it (scancel {' '.join(queued)}), or give "
                "another OUTPUT_DIR; nothing was submitted.")
        executor = make_executor(options, folder, job_name=f"gwdet-{Path(args.config_file).stem}")
        job = submit(executor, TrainingJob(tuple(argv), os.getcwd(), config_text(run)), folder)
    except (ClusterUnavailable, SubmissionRefused, ValueError, KeyError, FileNotFoundError, FileExistsError,
            GwdetError) as error:
        print(f"{tool_name()}: error: {error}", file=sys.stderr)
        return 2
    print("\n".join([*describe(job, options.launcher), f"  output: {output_dir}"]), flush=True)
    stuck = unstartable(job.job_id) if options.launcher == "slurm" else None
    if stuck is not None:
        print(f"{tool_name()}: error: {stuck}", file=sys.stderr)
        return 1
    if not options.wait:
        return 0
    try:
        result = wait(job.task(0), options.launcher)
    except JobRefused as error:  # as the same request here would end
        print(f"{tool_name()}: error: {error}", file=sys.stderr)
        return 2
    except RuntimeError as error:
        print(f"{tool_name()}: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C stops the waiting, not the job
        stop = describe(job, options.launcher)[-1].strip()
        print(f"{tool_name()}: stopped waiting; job {job.job_id} still runs. To stop it too: {stop}", file=sys.stderr)
        return 130
    print(f"job {job.job_id} finished; results in {result['output_dir']}")
    table = Path(result["output_dir"], RESULTS_MARKDOWN)
    if result["results"] is not None and table.is_file():
        print(table.read_text())
    return 0


def run(argv: Sequence[str] | None = None) -> int:
    """The command line of ``gwdet-train`` and ``tools/train_net.py``; the exit status. An error
    gwdet raises on purpose ends the tool with ``<program>: error: <message>`` and status 2, its
    traceback shown only with ``--verbose`` (:mod:`gwdet.utils.cli_errors`); ``<program>`` is the
    name the tool was started as (``gwdet-train``, ``train_net.py``), as in argparse's errors."""
    return run_tool(_train, argv)


def _train(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.launcher == "local":
        try:
            launcher_options(args, args.num_gpus)
        except ValueError as error:
            print(f"{tool_name()}: error: {error}", file=sys.stderr)
            return 2
        train_here(args)
        return 0
    return submit_training(args, argv)
