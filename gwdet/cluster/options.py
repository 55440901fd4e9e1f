"""The launcher flags shared by ``tools/train_net.py`` and ``tools/compare_norms.py``.

``--launcher local`` (the default) runs on this machine. ``--launcher slurm`` submits a job through
submitit's SLURM executor; ``--launcher submitit-local`` runs the very same job object through
submitit's local executor on this machine. The SLURM request (``--nodes``, ``--gpus-per-node``,
``--cpus-per-task``, ``--partition``, ``--account``, ``--timeout-min``, ``--slurm-extra KEY=VALUE``)
becomes the job's ``#SBATCH`` lines. This module only parses and checks them; it imports neither
submitit nor torch.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from datetime import timedelta

from detectron2.engine import default_argument_parser

from gwdet.errors import GwdetValueError

LAUNCHERS = ("local", "submitit-local", "slurm")
DEFAULT_TIMEOUT_MIN = 24 * 60
DEFAULT_RENDEZVOUS_SECONDS = 300.0


def seconds(text: str) -> float:
    """A waiting time flag's value: a number of seconds above 0 that a ``timedelta`` can hold."""
    try:
        value = float(text)
        timedelta(seconds=value)
    except (ValueError, OverflowError):
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"give a number of seconds above 0, e.g. {DEFAULT_RENDEZVOUS_SECONDS:g}; "
                                         f"got {text!r}")
    return value


def add_launcher_arguments(parser: argparse.ArgumentParser, multi_machine: bool = True) -> None:
    """Add the launcher flags (one argument group) to ``parser``; ``multi_machine`` adds
    ``--rendezvous-timeout`` for runs that span machines."""
    group = parser.add_argument_group(
        "cluster", "run through SLURM (submitit) instead of here; see docs/cluster.md")
    group.add_argument("--launcher", choices=LAUNCHERS, default="local",
                       help="local: run in this process (default); slurm: submit a SLURM job through "
                            "submitit and return (--wait waits); submitit-local: the same job through "
                            "submitit's local executor on this machine")
    group.add_argument("--nodes", type=int, default=1, help="SLURM nodes (machines) of the job (default 1)")
    group.add_argument("--gpus-per-node", type=int, default=None,
                       help="GPUs each node asks for: --num-gpus or 0 (CPU nodes, which still start --num-gpus "
                            "processes); default --num-gpus where the partition's nodes have GPUs (sinfo), else 0")
    group.add_argument("--cpus-per-task", type=int, default=None,
                       help="CPUs per node (one task per node; default: the partition's default)")
    group.add_argument("--partition", default=None, help="SLURM partition (default: the cluster's default)")
    group.add_argument("--account", default=None, help="SLURM account to charge")
    group.add_argument("--timeout-min", type=int, default=DEFAULT_TIMEOUT_MIN,
                       help="time limit of one job run in minutes (default %(default)s); at the limit the "
                            "job checkpoints, requeues itself and continues")
    group.add_argument("--slurm-extra", action="append", default=[], metavar="KEY=VALUE",
                       help="any other sbatch option, e.g. qos=high, constraint=volta32gb, mem=64G, or "
                            "exclusive (no value); repeatable")
    group.add_argument("--wait", action="store_true",
                       help="after submitting, wait for the job to end and print its result")
    if multi_machine:
        group.add_argument("--rendezvous-timeout", type=seconds, default=DEFAULT_RENDEZVOUS_SECONDS, metavar="SECONDS",
                           help="how long the processes of a run of several processes or machines wait for each "
                                "other at --dist-url before stopping with an error (default %(default)s)")


@dataclass(frozen=True)
class LauncherOptions:
    """The checked launcher flags: what to ask SLURM (or submitit's local executor) for."""

    launcher: str
    processes_per_node: int = 1
    nodes: int = 1
    gpus_per_node: int | None = None  # None: --num-gpus where the nodes have GPUs, else 0
    cpus_per_task: int | None = None
    partition: str | None = None
    account: str | None = None
    timeout_min: int = DEFAULT_TIMEOUT_MIN
    extra: dict[str, str | bool] = field(default_factory=dict)
    wait: bool = False

    @property
    def submits(self) -> bool:
        """Whether the run goes through submitit (not ``--launcher local``)."""
        return self.launcher != "local"


# sbatch options the launcher sets itself, and what to use instead of giving them in --slurm-extra.
SET_BY_THE_LAUNCHER = {
    "signal": "the launcher asks for SIGUSR2 before the time limit, on which the job saves a checkpoint and is "
              "requeued; another signal would end the job without either (the delay follows --timeout-min)",
    "time": "use --timeout-min", "nodes": "use --nodes", "partition": "use --partition", "account": "use --account",
    "cpus-per-task": "use --cpus-per-task", "gpus-per-node": "use --gpus-per-node",
    "ntasks-per-node": "the launcher starts one task per node, which starts --num-gpus processes",
    "job-name": "the job is named after the run", "output": "the job's logs go to the run's folder",
    "error": "the job's logs go to the run's folder",
}
# sbatch options that would defeat what the launcher does (by their long and short names), and why.
DEFEATS_THE_LAUNCHER = {
    "no-requeue": "the job requeues itself at its time limit and when it is preempted, continuing from the checkpoint "
                  "it saved; without requeueing it would end there, failed",
    "array": "one run folder takes one job, whose files submitit writes for one task only; submit each run with its "
             "own OUTPUT_DIR instead",
}
SHORT_NAMES = {"a": "array"}


def parse_slurm_extra(items: list[str]) -> dict[str, str | bool]:
    """``["qos=high", "exclusive"]`` -> ``{"qos": "high", "exclusive": True}`` (sbatch's option
    names, without the leading dashes); an option the launcher sets itself
    (:data:`SET_BY_THE_LAUNCHER`) is refused rather than silently replacing the launcher's, and one
    that would defeat it (:data:`DEFEATS_THE_LAUNCHER`, also by its short name) is refused too."""
    extra: dict[str, str | bool] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().lstrip("-")
        if not key or " " in key:
            raise GwdetValueError(f"--slurm-extra {item!r}: give an sbatch option as KEY=VALUE (e.g. qos=high) "
                                  "or KEY alone for a flag (e.g. exclusive)")
        name = SHORT_NAMES.get(key, key.replace("_", "-"))
        why = SET_BY_THE_LAUNCHER.get(name)
        if why is not None:
            raise GwdetValueError(f"--slurm-extra {item!r}: the launcher sets sbatch's --{name} "
                                  f"itself ({why}); leave it out of --slurm-extra.")
        if name in DEFEATS_THE_LAUNCHER:
            raise GwdetValueError(f"--slurm-extra {item!r}: sbatch's --{name} would defeat the launcher "
                                  f"({DEFEATS_THE_LAUNCHER[name]}); leave it out of --slurm-extra. Nothing was "
                                  "submitted.")
        extra[key] = value if sep else True
    return extra


def unused_launcher_flags(args: argparse.Namespace) -> list[str]:
    """The launcher flags given in ``args`` that its ``--launcher`` does not use: SLURM's requests
    (``--partition``, ``--account``, ``--cpus-per-task``, ``--slurm-extra``) outside ``slurm``, and
    the job's ``--gpus-per-node`` and ``--timeout-min`` with ``local`` too."""
    given = {"--partition": args.partition is not None, "--account": args.account is not None,
             "--cpus-per-task": args.cpus_per_task is not None, "--slurm-extra": bool(args.slurm_extra)}
    if args.launcher == "local":
        given.update({"--gpus-per-node": args.gpus_per_node is not None,
                      "--timeout-min": args.timeout_min != DEFAULT_TIMEOUT_MIN})
    return [flag for flag, is_given in given.items() if is_given] if args.launcher != "slurm" else []


def placement_flags_given(args: argparse.Namespace) -> list[str]:
    """detectron2's flags that place the processes of a run on machines (``--num-machines``,
    ``--machine-rank``, ``--dist-url``) which ``args`` gives other values than their defaults."""
    defaults = default_argument_parser()
    return [flag for flag, name in (("--num-machines", "num_machines"), ("--machine-rank", "machine_rank"),
                                    ("--dist-url", "dist_url"))
            if hasattr(args, name) and getattr(args, name) != defaults.get_default(name)]


def launcher_options(args: argparse.Namespace, processes_per_node: int) -> LauncherOptions:
    """Check the launcher flags of ``args`` (``processes_per_node``: the processes each node starts,
    ``--num-gpus``); ``ValueError`` naming the flag and the fix."""
    if args.nodes < 1:
        raise GwdetValueError(f"--nodes must be at least 1, got {args.nodes}")
    if args.timeout_min < 1:
        raise GwdetValueError(f"--timeout-min must be at least 1 minute, got {args.timeout_min}")
    if args.cpus_per_task is not None and args.cpus_per_task < 1:
        raise GwdetValueError(f"--cpus-per-task must be at least 1, got {args.cpus_per_task}")
    gpus = args.gpus_per_node
    if gpus is not None and gpus < 0:
        raise GwdetValueError(f"--gpus-per-node must be 0 or more, got {gpus}")
    if gpus and gpus != processes_per_node and args.launcher != "local":  # local: refused below as unused
        raise GwdetValueError(
            f"--gpus-per-node {gpus} with --num-gpus {processes_per_node}: each node starts one process per "
            "GPU, so give the same number to both (or --gpus-per-node 0 on CPU nodes).")
    if args.launcher == "submitit-local" and args.nodes != 1:
        raise GwdetValueError("--launcher submitit-local runs on this machine only: use --nodes 1, or --launcher slurm")
    if args.launcher == "local" and (args.nodes != 1 or args.wait):
        raise GwdetValueError("--nodes and --wait belong to --launcher slurm or submitit-local; for several "
                              "machines without SLURM, start each with --num-machines, --machine-rank and --dist-url")
    placed = placement_flags_given(args)
    if placed and args.launcher != "local":
        one = len(placed) == 1
        raise GwdetValueError(
            f"{', '.join(placed)}: --launcher {args.launcher} places the processes itself (the machines --nodes asks "
            f"for, their ranks and rendezvous from the job's allocation), so {'it' if one else 'they'} would be "
            f"replaced; nothing was submitted. Leave {'it' if one else 'them'} out, and give the number of machines "
            "as --nodes.")
    unused = unused_launcher_flags(args)
    if unused:
        raise GwdetValueError(
            f"{', '.join(unused)}: --launcher {args.launcher} does not use {'it' if len(unused) == 1 else 'them'} "
            f"({'a run here asks SLURM for nothing' if args.launcher == 'local' else 'a job on this machine asks SLURM for nothing'}). "
            "Add --launcher slurm to submit the run as a SLURM job, or leave "
            f"{'it' if len(unused) == 1 else 'them'} out.")
    return LauncherOptions(args.launcher, processes_per_node, args.nodes, gpus, args.cpus_per_task, args.partition,
                           args.account, args.timeout_min, parse_slurm_extra(args.slurm_extra), args.wait)
