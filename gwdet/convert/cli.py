"""``tools/convert_pretrained.py`` and the command ``gwdet-convert`` of an installed gwdet: convert a
torchvision-layout ImageNet checkpoint into detectron2 weights and print the report
(:func:`gwdet.convert.convert_checkpoint`)."""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from types import FrameType
from typing import Iterator, Sequence

from gwdet.errors import GwdetError
from gwdet.convert.converter import convert_checkpoint
from gwdet.convert.loading import ConversionError, refuse_standard_input
from gwdet.convert.architecture import ARCHITECTURES
from gwdet.utils.cli_errors import (EXIT_STATUS, TERMINATED_STATUS, add_verbose_argument, run_tool, tool_name,
                                    unexpanded_variable_problem)
from gwdet.utils.command_line import dashed_file_names_named, refuse_repeated_flags


def argument_parser() -> argparse.ArgumentParser:
    """IN, OUT and the flags that constrain or relax the conversion."""
    parser = argparse.ArgumentParser(
        description="Convert a torchvision-layout ImageNet ResNet/ResNeXt checkpoint (BN, or GW "
        "at some positions) into a detectron2 .pkl for gwdet's backbones."
    )
    parser.add_argument("input", metavar="IN", type=os.path.expanduser,
                        help="checkpoint written by torch.save (.pth/.pt)")
    parser.add_argument("output", metavar="OUT", type=os.path.expanduser, help="detectron2 weights to write (.pkl)")
    parser.add_argument(
        "--arch",
        choices=list(ARCHITECTURES),
        help="fail unless the checkpoint is this architecture (default: accept the inferred one)",
    )
    parser.add_argument(
        "--gw-positions",
        metavar="SPEC",
        help="fail unless GW sits exactly here, e.g. S1-B2 ('' = no GW, BN everywhere); "
        "default: accept the inferred positions",
    )
    parser.add_argument(
        "--allow-unsafe-pickle",
        action="store_true",
        help="load files that need full unpickling (arbitrary code execution!): trusted files only",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace OUT if it exists (by default an existing OUT is an error and stays as it is)",
    )
    parser.add_argument(
        "--allow-unexpected",
        action="store_true",
        help="drop keys outside torchvision's ResNet layout instead of failing (reported)",
    )
    add_verbose_argument(parser)
    return parser


class _Terminated(BaseException):
    """Raised by the SIGTERM handler of :func:`_sigterm_stops`; a ``BaseException``, so that no
    ``except Exception`` on the way turns it into a refusal, and the writing removes its partial file."""


@contextlib.contextmanager
def _sigterm_stops() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`_Terminated` where the conversion is, as Ctrl-C raises
    ``KeyboardInterrupt``: the output being written is removed on the way out
    (:func:`gwdet.utils.atomic.write_atomically`). Installed only in the main thread and only over
    the default action (a handler of the caller's own stays); the handler before is given back when
    the block ends."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return

    def stop(signum: int, frame: FrameType | None) -> None:
        raise _Terminated()

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    """``gwdet-convert`` / ``tools/convert_pretrained.py``: convert, print the report, return 0. A
    refusal (a :class:`~gwdet.convert.ConversionError`, or any other error gwdet raises on purpose) is
    printed by :mod:`gwdet.utils.cli_errors` as ``<tool>: error: <message>`` and a line on
    ``--verbose``, and returned as status 2; with ``--verbose`` its traceback is shown instead.
    SIGTERM ends the conversion as Ctrl-C does: the partial output file is removed, one line says so,
    and the status is 143 (128 + SIGTERM)."""
    try:
        with _sigterm_stops():
            return _main(argv)
    except _Terminated:
        sys.stdout.flush()
        print(f"{tool_name()}: terminated (SIGTERM) before the conversion finished: no output was written (it appears "
              "only once complete, and a partial file of it is removed). Run the command again to convert.",
              file=sys.stderr, flush=True)
        return TERMINATED_STATUS


def _main(argv: Sequence[str] | None) -> int:
    refused = []

    def convert(args: list[str]) -> int:
        try:
            return _convert(args)
        except GwdetError:
            refused.append(True)
            raise

    try:
        return run_tool(convert, argv)
    except SystemExit as stop:  # run_tool's ending of a refusal: the status this function returns
        if refused and stop.code == EXIT_STATUS:
            return EXIT_STATUS
        raise


def _convert(argv: Sequence[str]) -> int:
    parser = argument_parser()
    refuse_repeated_flags(parser, argv)  # argparse kept the last --arch / --gw-positions without a word
    with dashed_file_names_named(parser, argv):  # "-r50.pth OUT": argparse takes the file for a flag
        args = parser.parse_args(argv)
    refuse_standard_input(args.input)  # "IN < r50.pth": before any other check, so the stream is what is named
    unexpanded = unexpanded_variable_problem("OUT", args.output)
    if unexpanded is not None:
        raise ConversionError(unexpanded)
    report = convert_checkpoint(
        args.input,
        args.output,
        arch=args.arch,
        gw_positions=args.gw_positions,
        allow_unsafe_pickle=args.allow_unsafe_pickle,
        allow_unexpected=args.allow_unexpected,
        overwrite=args.overwrite,
    )
    print(report.format())
    return 0
