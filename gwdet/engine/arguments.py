"""The train tool's command line: detectron2's flags plus gwdet's (:func:`argument_parser`), read
so that flags may also follow the ``KEY VALUE`` overrides (:func:`parse_args`). The launcher's flags
are added by :func:`gwdet.cluster.training.argument_parser`."""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from detectron2.engine import default_argument_parser

from gwdet.data import add_register_coco_argument
from gwdet.model_zoo import resolve_config_argument
from gwdet.utils.cli_errors import add_verbose_argument
from gwdet.utils.command_line import parse_with_trailing_flags, refuse_repeated_flags
from gwdet.engine.threads import thread_request



def argument_parser() -> argparse.ArgumentParser:
    """detectron2's parser (``--config-file``, ``--resume``, ``--eval-only``, ``--num-gpus``, ...)
    plus ``--overwrite``, ``--threads``, ``--register-coco NAME=JSON:IMAGE_ROOT`` (repeatable: your
    own COCO-format data as dataset NAME, its files checked as the flag is read; see
    :mod:`gwdet.data.coco_registration`) and ``--verbose``. The train tool adds the launcher flags
    (:func:`gwdet.cluster.training.argument_parser`).

    ``--config`` works as well: argparse accepts it as the unambiguous prefix of ``--config-file``.
    """
    parser = default_argument_parser()
    add_register_coco_argument(parser)
    parser.add_argument("--threads", type=thread_request, default=None, metavar="N|auto-load",
                        help="CPU threads per process (default: the CPUs this process may use: affinity mask, "
                             "cgroup CPU quota, SLURM_CPUS_PER_TASK, shared by the --num-gpus processes; "
                             "auto-load: the CPUs other processes leave free at start; see gwdet.engine.threads)")
    parser.add_argument("--overwrite", action="store_true",
                        help="train from iteration 0 into an OUTPUT_DIR that holds an earlier run, deleting that "
                             "run's checkpoints, metrics, results and log once the new model is built and its "
                             "weights loaded (put back if the new run stops before)")
    add_verbose_argument(parser)
    return parser


def check_process_counts(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A usage error (``parser.error``) for a process or thread count no run can have: ``--num-gpus``,
    ``--num-machines`` or ``--threads`` below 1, a ``--machine-rank`` outside 0 .. --num-machines - 1,
    several machines meeting at the default ``--dist-url`` (this machine's loopback address) where
    the processes are started here (``--launcher local``, or a parser without launchers)."""
    if args.num_gpus < 1:
        parser.error(f"--num-gpus {args.num_gpus}: give the number of processes to start on this machine, at "
                     "least 1 (one per GPU; on a machine without a GPU, that many CPU processes).")
    if args.num_machines < 1:
        parser.error(f"--num-machines {args.num_machines}: give the number of machines of the run, at least 1.")
    if not 0 <= args.machine_rank < args.num_machines:
        parser.error(f"--machine-rank {args.machine_rank}: give this machine's index, from 0 to "
                     f"--num-machines - 1 = {args.num_machines - 1}.")
    # (a launcher other than local places the processes itself, and refuses --num-machines as such)
    if args.num_machines > 1 and args.dist_url == parser.get_default("dist_url") \
            and getattr(args, "launcher", "local") == "local":  # waited there for the others
        parser.error(f"--num-machines {args.num_machines} without --dist-url: the default, {args.dist_url}, reaches "
                     "this machine only. Give every machine the same --dist-url tcp://<machine 0's address>:PORT "
                     "(tcp://127.0.0.1:PORT for machines on this host).")
    if isinstance(args.threads, int) and args.threads < 1:
        parser.error(f"--threads {args.threads}: give the CPU threads of each process, at least 1 (or leave "
                     "the flag out to use the CPUs this process may use).")


def parse_args(argv: Sequence[str] | None = None, parser: argparse.ArgumentParser | None = None) -> argparse.Namespace:
    """The arguments of ``parser`` (default: :func:`argument_parser`); flags may also follow the
    ``KEY VALUE`` overrides (``... SOLVER.MAX_ITER 10 --resume``)."""
    parser = parser or argument_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    refuse_repeated_flags(parser, argv)
    args = parse_with_trailing_flags(parser, argv)
    check_process_counts(parser, args)
    resolve_config_argument(parser, args)
    return args
