"""Short errors for gwdet's command-line tools: ``<tool>: error: <message>``, without a traceback.

Every entry point (``gwdet-train`` / ``tools/train_net.py``, ``gwdet-convert``, ``gwdet-export``,
``tools/analyze_model.py`` and the lab's ``compare_norms.py``, ``analyze.py``, ``benchmark.py``)
runs its work inside :func:`reported_errors`. An error that gwdet raised on purpose to tell the
user what is wrong (a config key, a file, a flag, and the fix) is printed as one
``<tool>: error: <message>`` paragraph on stderr, followed by one line saying that ``--verbose``
shows the traceback, and the tool exits with status 2 (as argparse does for a bad flag).
``--verbose`` anywhere on the command line prints the full traceback instead.

Which errors are "on purpose" (:func:`is_deliberate`): an ``Exception`` whose traceback ends at a
``raise`` statement (the instruction that raised it is ``RAISE_VARARGS``) in a source file of the
``gwdet`` or ``gwdet_lab`` package. Everything else keeps Python's traceback, because the
traceback is then where the information is:

* a bug in gwdet (``AttributeError``, ``NameError``, ``TypeError``, ...) ends at the expression
  that failed, not at a ``raise`` (also when that expression is the argument of a ``raise``);
* an error raised by detectron2, torch, fvcore, yacs or Python itself ends in their files;
* an error re-raised unchanged by gwdet (a bare ``raise``, ``raise error``) keeps the traceback of
  where it was first raised, so it counts where it came from;
* ``SystemExit`` (argparse's usage errors, the tools' ``raise SystemExit("...")`` messages) and
  ``KeyboardInterrupt`` pass through as before.

A training process started by ``--num-gpus N`` on CPUs reports its error to the first process as
:class:`gwdet.engine.launch.WorkerFailed`, raised on purpose: its message (which quotes the failed
process's own traceback) is printed the same way, without the first process's traceback on top.

:func:`output_path_problem` is the check of an output flag (``--out``) that tools run before any
work: a path that is a file where a folder is needed, or the other way round, or below a file.
"""
from __future__ import annotations

import contextlib
import dis
import os
import sys
from pathlib import Path
from types import CodeType, TracebackType
from typing import Iterator, Sequence

VERBOSE_FLAG = "--verbose"
EXIT_STATUS = 2  # argparse's status for a usage error; the tools already return 2 for their refusals
VERBOSE_HINT = f"{VERBOSE_FLAG} shows the Python traceback of this error"
VERBOSE_HELP = ("print the Python traceback of an error; without it an error that gwdet reports on purpose "
                "prints only its message (and the fix)")
# The packages whose deliberate errors are reported without a traceback: gwdet, and the lab package
# installed or checked out beside it (found by path; the plugin never imports the lab).
_GWDET = Path(__file__).resolve().parents[1]
PACKAGE_FOLDERS = (_GWDET, _GWDET.parent / "gwdet_lab")
_RAISE_OPCODES = frozenset(dis.opmap[name] for name in ("RAISE_VARARGS",) if name in dis.opmap)


def add_verbose_argument(parser) -> None:
    """Add ``--verbose`` to ``parser`` (an ``argparse`` parser or argument group), for ``--help``;
    :func:`reported_errors` reads the flag from the command line itself, before the parser runs."""
    parser.add_argument(VERBOSE_FLAG, action="store_true", help=VERBOSE_HELP)


def split_verbose(argv: Sequence[str]) -> tuple[list[str], bool]:
    """``argv`` without its ``--verbose`` tokens, and whether there was one. Taken out before the
    tool's parser runs, so that ``--verbose`` also works after the trailing ``KEY VALUE`` overrides
    (which some tools collect with ``argparse.REMAINDER``)."""
    kept = [token for token in argv if token != VERBOSE_FLAG]
    return kept, len(kept) != len(argv)


def _innermost(traceback: TracebackType) -> TracebackType:
    while traceback.tb_next is not None:
        traceback = traceback.tb_next
    return traceback


def _in_packages(filename: str) -> bool:
    try:
        path = Path(filename).resolve()
    except (OSError, RuntimeError):
        return False
    return any(path.is_relative_to(folder) for folder in PACKAGE_FOLDERS)


def _opcode_at(code: CodeType, offset: int) -> int | None:
    for instruction in dis.get_instructions(code):
        if instruction.offset == offset:
            return instruction.opcode
    return None


def is_deliberate(error: BaseException) -> bool:
    """Whether ``error`` is an ``Exception`` raised by a ``raise`` statement in gwdet or gwdet_lab
    (see the module docstring)."""
    if not isinstance(error, Exception) or error.__traceback__ is None:
        return False
    last = _innermost(error.__traceback__)
    code = last.tb_frame.f_code
    return _in_packages(code.co_filename) and _opcode_at(code, last.tb_lasti) in _RAISE_OPCODES


def message_of(error: BaseException) -> str:
    """The text of ``error`` as the user should read it (a ``KeyError``'s message without the
    quotes ``str`` puts around it; the type's name when there is no message)."""
    if isinstance(error, KeyError) and len(error.args) == 1 and isinstance(error.args[0], str):
        text = error.args[0]
    else:
        text = str(error)
    return text.strip() or type(error).__name__


def tool_name(prog: str | None = None) -> str:
    """``prog``, or the name the tool was started as (what argparse prints in its errors)."""
    return prog or os.path.basename(sys.argv[0]) or "gwdet"


@contextlib.contextmanager
def reported_errors(prog: str | None = None, verbose: bool = False) -> Iterator[None]:
    """Run the block; an error gwdet raised on purpose (:func:`is_deliberate`) becomes
    ``<prog>: error: <message>`` and a line on ``--verbose`` on stderr, then ``SystemExit(2)``.
    Any other exception, and every exception when ``verbose``, propagates unchanged."""
    try:
        yield
    except Exception as error:
        if verbose or not is_deliberate(error):
            raise
        name = tool_name(prog)
        sys.stdout.flush()
        print(f"{name}: error: {message_of(error)}\n{name}: {VERBOSE_HINT}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_STATUS) from None


def output_path_problem(flag: str, path: str | os.PathLike, folder: bool) -> str | None:
    """Why ``path``, given as ``flag``, cannot be written as a ``folder`` (else as a file); ``None``
    when it can be created or is already of the right kind. Checked before a tool does any work:
    a file where a folder is needed, a folder where a file is needed, a path below a file."""
    target = Path(path).expanduser()
    kind = "folder" if folder else "file"
    if target.exists():
        if folder and not target.is_dir():
            return (f"{flag} {path} is a file, not a folder: give a folder to write into (it is created "
                    "if it does not exist), or move the file away.")
        if not folder and target.is_dir():
            return f"{flag} {path} is a folder: give the path of a file to write, e.g. {Path(path) / 'report.md'}."
        return None
    for above in target.absolute().parents:
        if above.exists():
            if not above.is_dir():
                return (f"{flag} {path}: {above} is a file, so no {kind} can be created below it. Give a "
                        f"{kind} path whose parent folders are folders (or do not exist yet).")
            return None
    return None


__all__ = [
    "EXIT_STATUS", "VERBOSE_FLAG", "add_verbose_argument", "is_deliberate", "message_of", "output_path_problem",
    "reported_errors", "split_verbose", "tool_name",
]
