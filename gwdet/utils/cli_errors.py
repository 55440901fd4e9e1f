"""Short errors for gwdet's command-line tools: ``<tool>: error: <message>``, without a traceback.

Every entry point runs its work through :func:`run_tool`. A :class:`gwdet.errors.GwdetError` (an
error gwdet raises on purpose to tell the user what is wrong and the fix) is printed as one
``<tool>: error: <message>`` paragraph on stderr plus a line pointing at ``--verbose``, and the tool
exits with status 2, as argparse does for a bad flag; ``--verbose`` anywhere on the command line
prints the traceback instead. Every other exception keeps Python's traceback (a bug, or an error
of detectron2, torch or Python itself, is best read there); ``SystemExit`` passes through. Ctrl-C
(``KeyboardInterrupt``) ends the tool with one line saying so and status 130, as a shell reports
it (a training saves a checkpoint first: :mod:`gwdet.checkpoint.signal_hook`). Output cut short by
its reader (``| head``) ends the tool with one line saying so and status 141 (128 + SIGPIPE), or,
when only the last buffered lines found no reader, with the tool's own status.
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import sys
from pathlib import Path
from typing import IO, Callable, Iterator, Sequence
from urllib.parse import urlsplit
from urllib.request import url2pathname

from gwdet.errors import GwdetError, GwdetValueError

VERBOSE_FLAG = "--verbose"
EXIT_STATUS = 2  # argparse's status for a usage error; the tools already return 2 for their refusals
INTERRUPTED_STATUS = 130  # 128 + SIGINT, as a shell reports a command Ctrl-C stopped
TERMINATED_STATUS = 143  # 128 + SIGTERM, as a shell reports a command SIGTERM ended
BROKEN_PIPE_STATUS = 141  # 128 + SIGPIPE, as a shell reports a command whose output's reader went away
VERBOSE_HINT = f"{VERBOSE_FLAG} shows the Python traceback of this error"
VERBOSE_HELP = ("print the Python traceback of an error; without it an error that gwdet reports on purpose "
                "prints only its message (and the fix)")


def at_least(minimum: int, what: str) -> Callable[[str], int]:
    """An argparse type: an integer >= ``minimum``; ``what`` names the value in the refusal."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{what} must be >= {minimum}, got {value}")
        return value

    return parse


def add_verbose_argument(parser) -> None:
    """Add ``--verbose`` to ``parser`` (an ``argparse`` parser or argument group), for ``--help``;
    :func:`run_tool` reads the flag from the command line itself, before the parser runs."""
    parser.add_argument(VERBOSE_FLAG, action="store_true", help=VERBOSE_HELP)


def split_verbose(argv: Sequence[str]) -> tuple[list[str], bool]:
    """``argv`` without its ``--verbose`` tokens, and whether there was one. Taken out before the
    tool's parser runs, so that ``--verbose`` also works after the trailing ``KEY VALUE`` overrides
    (which some tools collect with ``argparse.REMAINDER``)."""
    kept = [token for token in argv if token != VERBOSE_FLAG]
    return kept, len(kept) != len(argv)


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
    """Run the block; a :class:`~gwdet.errors.GwdetError` becomes ``<prog>: error: <message>`` and
    a line on ``--verbose`` on stderr, then ``SystemExit(2)``; ``KeyboardInterrupt`` (also as
    TorchScript's interpreter reports it, a ``RuntimeError``) one line and ``SystemExit(130)``. Any
    other exception, and every exception when ``verbose``, propagates unchanged."""
    try:
        yield
    except GwdetError as error:
        if verbose:
            raise
        name = tool_name(prog)
        sys.stdout.flush()
        print(f"{name}: error: {message_of(error)}\n{name}: {VERBOSE_HINT}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_STATUS) from None
    except BrokenPipeError:
        if verbose:
            raise
        _to_devnull(sys.stdout)
        message = (f"{tool_name(prog)}: stopped: the program reading its output closed it (e.g. | head) while the tool "
                   "was still printing, so whatever the tool had left to do after that line was not done. Run it again "
                   "with its output in a file (> out.txt), then read that.")
        try:
            print(message, file=sys.stderr, flush=True)
        except BrokenPipeError:  # stderr went to the same reader (2>&1 | head): the run's log.txt is left
            _to_devnull(sys.stderr)
        logging.getLogger("gwdet").error(message)  # into the log files of a run's set-up (log.txt), where there are
        raise SystemExit(BROKEN_PIPE_STATUS) from None
    except (KeyboardInterrupt, RuntimeError) as error:
        # TorchScript's interpreter turns a Ctrl-C while it runs into a RuntimeError ending in "KeyboardInterrupt"
        if verbose or not (isinstance(error, KeyboardInterrupt) or _last_line(error).startswith(
                ("KeyboardInterrupt", "RuntimeError: KeyboardInterrupt"))):
            raise
        sys.stdout.flush()
        print(f"{tool_name(prog)}: interrupted (Ctrl-C); run the command again to finish what it had not finished "
              f"(a training: with --resume; {VERBOSE_FLAG} shows where it stopped).", file=sys.stderr, flush=True)
        raise SystemExit(INTERRUPTED_STATUS) from None


def _last_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[-1].strip() if lines else ""


def run_tool(work: Callable[[list[str]], int], argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """A tool's command line: ``work`` called with ``argv`` (default: ``sys.argv[1:]``) less its
    ``--verbose`` tokens, inside :func:`reported_errors` (``prog``: the tool's name in the errors,
    default the name it was started as); returns what ``work`` returns, the exit status. Called
    without ``argv`` in a Jupyter kernel (whose own command line ``sys.argv`` holds), it is refused
    naming ``argv``."""
    if argv is None and os.path.basename(sys.argv[0]) in _KERNEL_LAUNCHERS:
        with reported_errors(prog, False):
            raise GwdetValueError(
                f"no flags given, and this process's command line is a Jupyter kernel's ({' '.join(sys.argv[:2])} ...), "
                "not the tool's: give the tool's flags as a list, e.g. run(['--config-file', 'configs/mask_rcnn_gw.yaml', "
                "'OUTPUT_DIR', 'output/run']).")
    kept, verbose = split_verbose(sys.argv[1:] if argv is None else argv)
    with reported_errors(prog, verbose):
        status = work(kept)
    try:
        sys.stdout.flush()  # what is still buffered, here rather than at exit (where Python reports a closed pipe)
    except BrokenPipeError:  # the work is done; only the end of its output found no reader (| head)
        _to_devnull(sys.stdout)
    return status


def _to_devnull(stream: IO[str]) -> None:
    """Point ``stream`` (stdout, stderr) at /dev/null: its reader is gone, and Python's flush at exit
    (or a logger's next line) would fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, stream.fileno())
    os.close(devnull)


# The programs that start a Jupyter (IPython) kernel: their sys.argv is the kernel's, not a tool's.
_KERNEL_LAUNCHERS = ("ipykernel_launcher.py",)


_UNEXPANDED_VARIABLE = re.compile(r"\$(\{[A-Za-z_][A-Za-z0-9_]*\}|[A-Za-z_][A-Za-z0-9_]*)")  # $NAME, ${NAME}
_HOME_PREFIX = re.compile(r"~[\w.-]*(/|$)")  # ~, ~/runs, ~user/runs: a home folder a shell would expand
_UNRUN_COMMAND = re.compile(r"\$\([^)]*\)?|`[^`]*`")  # $(date +%F), `date`: a command substitution


def unexpanded_variable_problem(flag: str, path: str | os.PathLike, environment: bool = False) -> str | None:
    """Why ``path``, given as ``flag`` (an ``environment`` variable's name, or a setting), holds an
    environment variable nobody expanded (a quoted ``'$SCRATCH/run'``, or one written in a config
    file), which would name a folder ``$SCRATCH``, a command substitution nobody ran (``$(date +%F)``,
    a backquoted command), or (not of an ``environment`` variable, which gwdet expands) a leading ``~``;
    ``None`` when it holds none of them."""
    text = os.fspath(path)
    command = _UNRUN_COMMAND.search(text)
    if command is not None:
        return (f"{flag} {text!r} holds {command.group(0)!r}, a shell command that nothing ran (a quoted "
                "command-line value and a config file keep it as it is): the run would write into a folder named "
                f"{command.group(0)!r}. Let the shell run it (double quotes), or give the path itself; nothing was "
                "written.")
    if not environment and _HOME_PREFIX.match(text):
        home = as_override(flag, os.path.expanduser(text))
        return (f"{flag} {text!r} begins with '~', a home folder that nothing expanded (a quoted command-line value "
                "and a config file keep it as it is): the run would write into a folder named '~' here. Let the shell "
                f"expand it (no quotes around ~), or give the path itself ({home}); nothing was written.")
    variable = _UNEXPANDED_VARIABLE.search(text)
    if variable is None:
        return None
    expanded = os.path.expandvars(text)
    given = f"{flag}={expanded}" if environment else as_override(flag, expanded)
    fix = f"give the path itself ({given})" if expanded != text else "set the variable, or give the path itself"
    return (f"{flag} {text!r} holds {variable.group(0)!r}, an environment variable that nothing expanded "
            "(a quoted command-line value and a config file keep it as it is): the run would write into a folder "
            f"named {variable.group(0)!r}. Let the shell expand it (double quotes), or {fix}; nothing was written.")


FILE_URL = "file://"


def file_url_path(path: str) -> tuple[str, str | None]:
    """``(the local path, None)`` of a ``file://`` URL of this host (detectron2's ``PathManager`` has
    no handler for ``file://``), ``(path, host)`` of one naming another host, whose file cannot be
    reached from here, and ``(path, None)`` of anything else."""
    if not path.startswith(FILE_URL):
        return path, None
    address = urlsplit(path)
    if address.netloc not in ("", "localhost"):
        return path, address.netloc
    return url2pathname(address.path), None


def unexpanded_variable_note(path: str | os.PathLike) -> str:
    """For a ``path`` that does not exist: words naming the environment variable (``$HOME``) or the
    leading ``~`` in it that nothing expanded (a quoted command-line value or a config file keeps
    it), with the path as the shell would have made it; ``""`` when it holds none."""
    text = os.fspath(path)
    variable = _UNEXPANDED_VARIABLE.search(text)
    if variable is None and not _HOME_PREFIX.match(text):
        return ""
    held = repr(variable.group(0)) if variable is not None else "a leading '~'"
    expanded = os.path.expanduser(os.path.expandvars(text))
    leading = variable is None or variable.start() == 0  # (a path made absolute has the folder before it)
    meant = f" ({expanded})" if expanded != text and leading else ""
    shell = ("leave the '~' outside quotes (~/'my file.pth')" if variable is None else
             "let the shell expand it (double quotes)")
    return (f" It holds {held}, which nothing expanded (a quoted command-line value and a config file keep it as it "
            f"is): {shell}, or write the path out{meant}.")


GZIP_MAGIC = b"\x1f\x8b"  # the first bytes of a gzip stream (gzip, .gz, .tgz)


def gzip_decompression(path: str, unpacked: str) -> tuple[str, str, str]:
    """For a gzip-compressed file ``path`` (it starts with :data:`GZIP_MAGIC`): how its name shows it
    (or does not), the plain file to give instead (``path`` without its ``.gz``, else ``unpacked``)
    and the command that writes it, for a refusal's words."""
    if path.endswith(".gz"):
        return "its name ends in .gz", path[:-3], f"gunzip -k {path}"
    return "though its name does not end in .gz", unpacked, f"gunzip -c {path} > {unpacked}"


def edge_whitespace_problem(flag: str, path: str | os.PathLike, kind: str = "folder") -> str | None:
    """Why a new ``path`` (given as ``flag``) that begins or ends with whitespace is refused: the
    whitespace would become part of the new ``kind``'s name (a YAML value's or a pasted path's, not
    the name meant); ``None`` for any other path, or for one that exists as given."""
    text = os.fspath(path)
    if text == text.strip() or os.path.lexists(os.path.expanduser(text)):
        return None
    return (f"{flag} {text!r} begins or ends with whitespace, which would become part of the new {kind}'s name "
            f"(not {text.strip()!r}): give the path without it.")


def output_path_problem(flag: str, path: str | os.PathLike, folder: bool) -> str | None:
    """Why ``path``, given as ``flag``, cannot be written as a ``folder`` (else as a file); ``None``
    when it can be created or is already of the right kind. Checked before a tool does any work:
    an environment variable nobody expanded (:func:`unexpanded_variable_problem`), a file where a
    folder is needed, a folder where a file is needed, a link that leads nowhere, a path below a
    file, a place this process may not write, a new path that begins or ends with whitespace (a YAML
    value's or a pasted path's: another name than the one meant)."""
    unexpanded = unexpanded_variable_problem(flag, path)
    if unexpanded is not None:
        return unexpanded
    kind = "folder" if folder else "file"
    if not os.fspath(path):  # Path("") is the current folder
        return (f"{flag} is empty (a shell variable that is not set, as in {flag} \"$OUT\"?): give the {kind} to "
                + ("write into." if folder else "write."))
    target = Path(path).expanduser()
    whitespace = edge_whitespace_problem(flag, path, kind)
    if whitespace is not None:
        return whitespace
    if target.is_symlink() and not target.exists():
        return (f"{flag} {path} is a link to {os.readlink(target)}, which does not exist: create what it points to "
                f"(or fix the link), or give another {flag}.")
    if target.exists():
        if folder and not target.is_dir():
            return (f"{flag} {path} is a file, not a folder: give a folder to write into (it is created "
                    "if it does not exist), or move the file away.")
        if not folder and target.is_dir():
            return f"{flag} {path} is a folder: give the path of a file to write, e.g. {Path(path) / 'report.md'}."
        if not os.access(target, os.W_OK | (os.X_OK if folder else 0)):
            return (f"{flag} {path} cannot be written: this process may not write into it (a read-only disk, or "
                    f"another owner's {kind}). Give a {kind} this process may write.")
        return None
    for above in target.absolute().parents:
        if above.exists():
            if not above.is_dir():
                return (f"{flag} {path}: {above} is a file, so no {kind} can be created below it. Give a "
                        f"{kind} path whose parent folders are folders (or do not exist yet).")
            if not os.access(above, os.W_OK | os.X_OK):
                return (f"{flag} {path} cannot be written: {above} is a folder this process may not write into (a "
                        f"read-only disk, or another owner's folder). Give a {kind} path in a writable folder.")
            return None
    return None


def link_dotdot_problem(flag: str, path: str | os.PathLike) -> str | None:
    """Why ``path`` (given as ``flag``) is read two ways: a ``..`` after a link (``lnk/../x``) leads
    the system to the link's target's parent, while dropping ``lnk/..`` from the text, as absolute
    paths are made, names another file; ``None`` when both readings are the same."""
    text = os.fspath(path)
    if "://" in text or ".." not in Path(text).parts:
        return None
    system, textual = os.path.realpath(text), os.path.realpath(os.path.abspath(text))
    if system == textual:
        return None
    return (f"{flag} {text!r} has '..' after a link, so it names two places: the system reads it as {system}, and "
            f"{textual} once the '..' is taken off the text, as gwdet (and most tools) make paths absolute. Give the "
            f"path without '..' (e.g. {system}); nothing was read or written.")


def as_override(setting: str, value: str) -> str:
    """``setting`` given ``value`` as the command line writes it: ``key=value`` for a LazyConfig's
    settings (lower-case keys), ``KEY VALUE`` for a yacs config's."""
    return f"{setting}={value}" if setting.islower() else f"{setting} {value}"


__all__ = [
    "EXIT_STATUS", "VERBOSE_FLAG", "add_verbose_argument", "as_override", "link_dotdot_problem", "message_of",
    "output_path_problem",
    "reported_errors", "run_tool", "split_verbose", "tool_name",
]
