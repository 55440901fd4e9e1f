"""Diagnostics of normalizers from the GW and "Beyond BatchNorm" papers, as PNGs + markdown tables.

    python tools/analyze.py conditioning [--dim 256 --samples 1024 --groups 1,2,4,8,16]
    python tools/analyze.py constraints  [--d 256 --m 64 --g 16 --N 60000] [--config CFG --input-size 800x1333]
    python tools/analyze.py propagation  [--config CFG] [--norms GN,GW,BN] [KEY VALUE ...]
    python tools/analyze.py capacity     [--quick] [--epochs 4 --batch-sizes 2,8,32,128 --groups 1,4,16,64,128]

Every subcommand writes ``<out>/<subcommand>/*.png`` and ``<out>/<subcommand>/table.md``
(``--out``, default ``output/analysis``) and prints the files. Trailing ``KEY VALUE`` pairs
override the config (constraints, propagation); flags may stand before or among them. The work
is done in :mod:`gwdet_lab.analysis`; ``docs/analysis/README.md`` has the commands behind the
committed examples.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from gwdet.utils.cli_errors import add_verbose_argument, at_least, output_path_problem, run_tool
from gwdet_lab.analysis.report import foreign_table_problem, percent_label

if TYPE_CHECKING:
    from gwdet_lab.analysis.capacity import CapacitySetting

REPO = Path(__file__).resolve().parents[2]
DEMO_CONFIG = REPO / "configs" / "Demo" / "mask_rcnn_R_50_FPN_gw_shapes.yaml"


def each_once(values: list, text: str) -> list:
    """``values`` of the list ``text``, refused when one repeats (its results would be computed and
    written twice)."""
    repeated = sorted({str(value) for value in values if values.count(value) > 1})
    if repeated:
        raise argparse.ArgumentTypeError(f"{text!r} names {', '.join(repeated)} more than once: give each once")
    return values


def counts_at_least(minimum: int, what: str):
    """The argparse type of a comma-separated list of distinct integers >= ``minimum`` each."""
    count = at_least(minimum, what)

    def counts(text: str) -> list[int]:
        values = [count(item.strip()) for item in text.split(",") if item.strip()]
        if not values:
            raise argparse.ArgumentTypeError(f"give at least one {what}, got {text!r}")
        return each_once(values, text)
    return counts


def float_list(text: str) -> list[float]:
    return [float(item) for item in text.split(",") if item]


def fractions(text: str) -> list[float]:
    """The argparse type of ``--percents``: comma-separated fractions of the spectrum in (0, 1]."""
    try:
        values = float_list(text)
    except ValueError:
        values = []
    if not values or not all(0 < value <= 1 for value in values):
        raise argparse.ArgumentTypeError(f"give fractions in (0, 1] of the eigenvalues kept, e.g. 0.9,0.8 (90% and "
                                         f"80%), got {text!r}")
    labels = [percent_label(value) for value in values]
    if len(set(labels)) < len(labels):  # one column name and one figure file for two values
        raise argparse.ArgumentTypeError(f"{text!r} names {', '.join(labels)}: the tables and figures name each "
                                         "fraction in whole percent, so give fractions at least 0.01 apart, each once")
    return values


def str_list(text: str) -> list[str]:
    """The argparse type of a comma-separated list of distinct names."""
    return each_once([item for item in text.split(",") if item], text)


def image_size(text: str) -> tuple[int, int]:
    """``--input-size``: ``HxW`` (or ``S`` for a square) of positive whole numbers."""
    height, _, width = text.lower().partition("x")
    try:
        size = int(height), int(width or height)
    except ValueError:
        size = (0, 0)
    if min(size) < 1:
        raise argparse.ArgumentTypeError(f"give HxW with positive whole sides, e.g. 800x1333; got {text!r}")
    return size


def positive_number(what: str):
    """An argparse type: a finite number > 0; ``what`` names the value in the refusal."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value) or value <= 0:
            raise argparse.ArgumentTypeError(f"{what} must be a finite number > 0, got {text}")
        return value

    return parse


def argument_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--out", default="output/analysis", type=os.path.expanduser,
                        help="output root; files go to OUT/<subcommand>/")
    common.add_argument("--threads", type=at_least(1, "--threads"), default=None,
                        help="torch CPU threads (default: torch's choice)")
    add_verbose_argument(common)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)

    p = commands.add_parser("conditioning", parents=[common], help="GW paper Fig. 2: kappa_p vs group number")
    p.add_argument("--dim", type=at_least(1, "the feature count"), default=256, help="features d")
    p.add_argument("--samples", type=at_least(2, "the sample count (a covariance needs two samples)"), default=1024,
                   help="samples m")
    p.add_argument("--depths", type=counts_at_least(1, "depth"), default=[1, 2],
                   help="MLP depths simulating the activations")
    p.add_argument(
        "--activations", type=str_list, default=["relu", "linear"], help="MLP nonlinearities: relu, linear, tanh"
    )
    p.add_argument("--groups", type=counts_at_least(1, "group number"), default=[1, 2, 4, 8, 16],
                   help="group numbers of GN/GW")
    p.add_argument("--percents", type=fractions, default=[0.9, 0.8],
                   help="p of kappa_p: fractions in (0, 1] of the eigenvalues kept, e.g. 0.9,0.8")
    p.add_argument("--seeds", type=at_least(1, "the seed count"), default=3, help="simulations averaged")
    p.add_argument("--T", type=at_least(1, "T"), default=5, help="Newton iterations of GW (ItN)")

    p = commands.add_parser("constraints", parents=[common], help="GW paper Table 1 and GW cost of a config")
    p.add_argument("--d", type=at_least(1, "d"), default=256, help="features d")
    p.add_argument("--m", type=at_least(1, "m"), default=64, help="batch size m")
    p.add_argument("--g", type=at_least(1, "g"), default=16, help="group number g of GN/GW")
    p.add_argument("--N", type=at_least(1, "N"), default=60000, help="training set size N")
    p.add_argument("--k", type=at_least(1, "k"), default=None, help="BW group size (default: d, plain BW)")
    p.add_argument("--config", default=str(DEMO_CONFIG), help="detectron2 config for the GW cost table; '' skips it")
    p.add_argument("--input-size", type=image_size, default=None,
                   help="HxW of the dummy image of --config's cost table (default 800x1333)")
    p.add_argument("opts", nargs=argparse.REMAINDER, help="KEY VALUE config overrides")

    p = commands.add_parser("propagation", parents=[common], help="Lubana et al.: variance, cosine, gradients at init")
    p.add_argument("--config", default=str(DEMO_CONFIG), help="detectron2 config (its training data is used)")
    p.add_argument(
        "--norms", type=str_list, default=["GN", "GW", "BN"], help="norm names to compare ('config': as configured)"
    )
    p.add_argument("--seed", type=at_least(0, "--seed"), default=0)
    p.add_argument("opts", nargs=argparse.REMAINDER, help="KEY VALUE config overrides, applied to every norm")

    p = commands.add_parser("capacity", parents=[common], help="GW paper Figs. 1 and 5 on scikit-learn's digits")
    p.add_argument("--quick", action="store_true", help="tiny MLP and sweeps (seconds; for tests)")
    p.add_argument("--width", type=at_least(1, "--width"), default=None, help="hidden units (default 256)")
    p.add_argument("--depth", type=at_least(1, "--depth"), default=None, help="hidden layers (default 3)")
    p.add_argument("--epochs", type=at_least(1, "--epochs"), default=None, help="epochs of Figs. 1a/1b (default 4)")
    p.add_argument("--lr", type=positive_number("--lr"), default=None, help="SGD learning rate (default 0.1)")
    p.add_argument("--batch-sizes", type=counts_at_least(2, "batch size"), default=None,
                   help="Fig. 1a sweep (default 2,8,32,128)")
    p.add_argument("--batch-norms", type=str_list, default=None, help="Fig. 1a norms (default BN,BW,GN,GW)")
    p.add_argument("--groups", type=counts_at_least(1, "group number"), default=None,
                   help="Figs. 1b and 5 sweep (default 1,4,16,64,128)")
    p.add_argument("--random-samples", type=at_least(1, "--random-samples"), default=None,
                   help="images with random labels (default 256)")
    p.add_argument("--random-epochs", type=at_least(1, "--random-epochs"), default=None,
                   help="epochs on random labels (default 20)")
    p.add_argument("--seed", type=at_least(0, "--seed"), default=None, help="(default 0)")
    return parser


def run(args: argparse.Namespace) -> list[Path]:
    import torch

    import gwdet  # noqa: F401  (registers gwdet's norms before any model is built)

    if args.threads:
        torch.set_num_threads(args.threads)

    if args.command == "conditioning":
        from gwdet_lab.analysis.conditioning import ConditioningSetting, run_conditioning

        setting = ConditioningSetting(
            args.dim, args.samples, args.depths, args.activations, args.groups, args.percents, args.seeds, args.T
        )
        return run_conditioning(args.out, setting)
    if args.command == "constraints":
        from gwdet.model_zoo import build_config
        from gwdet_lab.analysis.constraint_report import ConstraintSetting, run_constraints

        cfg = build_config(args.config, [*args.opts, "MODEL.DEVICE", "cpu"]) if args.config else None
        constraint_setting = ConstraintSetting(args.d, args.m, args.g, args.N, args.k)
        return run_constraints(args.out, constraint_setting, cfg, args.config, args.input_size or (800, 1333), args.opts)
    if args.command == "propagation":
        from gwdet.errors import GwdetValueError
        from gwdet.norms import known_norm_names
        from gwdet_lab.analysis.propagation import run_propagation

        unknown = [name for name in args.norms if name != "config" and name not in known_norm_names()]
        if unknown:
            raise GwdetValueError(f"--norms {','.join(args.norms)}: {', '.join(map(repr, unknown))} is no norm name; "
                                  f"give names of {', '.join(known_norm_names())}, or 'config' (the config's norms).")
        return run_propagation(args.out, args.config, args.norms, args.opts, args.seed)
    from gwdet_lab.analysis.capacity import run_capacity

    return run_capacity(args.out, capacity_setting(args))


def capacity_setting(args: argparse.Namespace) -> CapacitySetting:
    """The capacity sweeps of ``args``: ``--quick``'s or the default ones, with the flags given."""
    from gwdet_lab.analysis.capacity import QUICK_CAPACITY, CapacitySetting

    overrides = {
        "width": args.width,
        "depth": args.depth,
        "epochs": args.epochs,
        "lr": args.lr,
        "batch_sizes": args.batch_sizes,
        "batch_sweep_norms": args.batch_norms,
        "groups": args.groups,
        "random_label_samples": args.random_samples,
        "random_label_epochs": args.random_epochs,
        "seed": args.seed,
    }
    base = QUICK_CAPACITY if args.quick else CapacitySetting()
    return dataclasses.replace(base, **{name: value for name, value in overrides.items() if value is not None})


def setting_problem(args: argparse.Namespace) -> str | None:
    """What in a subcommand's flags cannot give its tables, naming the flags and the fix, or None."""
    if args.command == "conditioning":
        apart = [groups for groups in args.groups if args.dim % groups]
        if apart:
            return (f"--groups {', '.join(map(str, apart))}: each group number must divide --dim {args.dim} (the "
                    "features are split into equal groups); give divisors of --dim, or another --dim")
        if args.dim in args.groups:
            return (f"--groups {args.dim}: one feature per group with --dim {args.dim}, which GN and GW normalize to 0 "
                    f"for any input, so its condition numbers would mean nothing; give group numbers below --dim "
                    f"{args.dim}, or a larger --dim")
        if args.samples <= args.dim:
            return (f"--samples {args.samples} is not more than --dim {args.dim}: the covariance of m samples has rank "
                    "m - 1 at most, so with m <= d it is singular and every condition number is inf; give --samples "
                    f"above --dim (e.g. --samples {4 * args.dim})")
    if args.command == "constraints":
        apart = [f"--{flag} {value}" for flag, value in (("g", args.g), ("k", args.k)) if value and args.d % value]
        if apart:
            return (f"{' and '.join(apart)}: the group number g of GN/GW and the group size k of BW split the d "
                    f"features into equal groups, so each must divide --d {args.d}; give divisors of --d, or another "
                    "--d")
        if args.m > args.N:
            return (f"--m {args.m} is larger than --N {args.N}: a batch holds at most the whole training set; give "
                    f"--m of at most --N")
        if args.input_size is not None and not args.config:
            return ("--input-size sets the image of --config's GW cost table, and --config '' skips that table: "
                    "give a config, or leave --input-size out")
        if args.opts and args.opts[0].isdigit():  # tools/analyze_model.py's two-number form
            return (f"--input-size takes HxW as one word, e.g. --input-size {args.opts[0]}x{args.opts[0]}; a number "
                    f"after it ({args.opts[0]}) is read as the start of the KEY VALUE overrides")
    if args.command == "capacity":
        setting = capacity_setting(args)
        width = f"--width {setting.width}" if args.width else f"the width of {setting.width} hidden units"
        apart = [groups for groups in setting.groups if setting.width % groups]
        if apart:
            return (f"--groups {', '.join(map(str, apart))}: each group number must divide {width} (GN and GW split the "
                    "units into equal groups); give divisors of the width, or another --width")
        if setting.width in setting.groups:
            return (f"--groups {setting.width}: one unit per group with {width}, which GN and GW normalize to 0 for "
                    f"any input, so nothing could be learnt; give group numbers below the width, or a larger --width")
        if setting.width % setting.batch_sweep_groups and {"GN", "GW"} & set(setting.batch_sweep_norms):
            return (f"{width}: the batch-size sweep's GN and GW use {setting.batch_sweep_groups} groups, which must "
                    f"divide it; give a --width that is a multiple of {setting.batch_sweep_groups}")
        if setting.width == setting.batch_sweep_groups and {"GN", "GW"} & set(setting.batch_sweep_norms):
            return (f"{width}: the batch-size sweep's GN and GW use {setting.batch_sweep_groups} groups, one unit per "
                    f"group, which they normalize to 0 for any input; give a --width above {setting.batch_sweep_groups} "
                    "(a multiple of it), or --batch-norms without GN and GW")
        whitening_groups = max(1, setting.width // 16)  # BW-C16: about 16 units per whitening group
        if setting.width % whitening_groups and "BW" in setting.batch_sweep_norms:
            return (f"{width}: the batch-size sweep's BW whitens groups of about 16 units (BW-C16), "
                    f"{whitening_groups} groups here, which must divide it; give a --width that is a multiple of 16 "
                    "(or below 32, one group), or --batch-norms without BW")
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the subcommand ``argv`` names (default: the command line) and print the files it wrote.
    An error gwdet raises on purpose ends it with ``<tool>: error: <message>`` and status 2;
    ``--verbose`` shows tracebacks (:mod:`gwdet.utils.cli_errors`)."""
    return run_tool(_analyze, argv)


def refuse_repeated_subcommand_flags(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """A usage error of the subcommand ``argv`` names for a flag of it that keeps one value (``--out``,
    ``--d``, ``--norms``, ...) given more than once, which argparse would take the last of without a
    word (:func:`gwdet.utils.command_line.refuse_repeated_flags`, on the subcommand's parser)."""
    from gwdet.utils.command_line import refuse_repeated_flags

    commands = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    for index, word in enumerate(argv):
        if word in commands.choices:
            refuse_repeated_flags(commands.choices[word], argv[index + 1:])
            return


def parse_arguments(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """The arguments of ``argv``; a subcommand that takes ``KEY VALUE`` overrides (constraints,
    propagation) reads its flags wherever they stand, before or among the overrides
    (:func:`gwdet.utils.command_line.parse_with_trailing_flags`), as tools/export_model.py does."""
    from gwdet.utils.command_line import parse_with_trailing_flags

    commands = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    command = commands.choices.get(argv[0]) if argv else None
    if command is None or not any(action.dest == "opts" for action in command._actions):
        return parser.parse_args(argv)
    args = parse_with_trailing_flags(command, argv[1:])
    args.command = argv[0]
    return args


def _analyze(argv: Sequence[str]) -> int:
    parser = argument_parser()
    refuse_repeated_subcommand_flags(parser, argv)
    args = parse_arguments(parser, list(argv))
    problem = output_path_problem("--out", args.out, folder=True) or foreign_table_problem(args.out, args.command)
    problem = problem or setting_problem(args)
    if problem:
        parser.error(problem)
    written = run(args)
    print(f"{args.command}: wrote")
    for path in written:
        print(f"  {path}")
    # the folder is the tool's (foreign_table_problem): figures of an earlier run that this one did not
    # draw (other --percents, say) would sit beside a table that no longer describes them
    kept = {Path(path).resolve() for path in written}
    stale = sorted(path for path in (Path(args.out) / args.command).glob("*.png") if path.resolve() not in kept)
    for path in stale:
        path.unlink()
    if stale:
        print(f"{args.command}: removed the earlier run's figures {', '.join(path.name for path in stale)}")
    return 0
