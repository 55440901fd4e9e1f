"""The command-line reading every tool shares: a flag that keeps one value refused when given twice
(:func:`refuse_repeated_flags`), flags read wherever they stand among the ``KEY VALUE`` overrides
(:func:`parse_with_trailing_flags`), a job's command line with some flags set anew
(:func:`replace_flags`), and a file name starting with ``-`` named in argparse's usage errors
(:func:`dashed_file_names_named`). Plain argparse: nothing of detectron2 or of the tools' own flags."""
from __future__ import annotations

import argparse
import contextlib
import itertools
import logging
import os
from typing import Iterator, NoReturn, Sequence

logger = logging.getLogger(__name__)


# argparse's usage errors of a missing value or positional, or of words it took for unknown flags
_MISREAD_ARGUMENT_ERRORS = ("the following arguments are required", "expected one argument", "expected at least one",
                            "unrecognized arguments")


def dashed_file_hint(parser: argparse.ArgumentParser, argv: Sequence[str], message: str,
                     double_dash: bool = True) -> str:
    """What to add to argparse's usage error ``message`` (a missing positional or value, an unknown
    argument) when a word of ``argv`` that starts with ``-`` and is no flag of ``parser`` names an
    existing file: argparse read it as a flag. The hint names the file and the ways to give it
    (``--`` before the file names where ``double_dash``, or ``./``); the same for such a word that
    names no file (an output to write, ``-x.pkl``) where argparse misses a positional, unless it
    starts with ``--`` (a misspelt flag more likely); else ``""``."""
    if not any(error in message for error in _MISREAD_ARGUMENT_ERRORS):
        return ""
    unknown = [word for word in argv if word.startswith("-") and word != "--" and not _is_number(word)
               and _action_of(parser, word.split("=", 1)[0]) is None]
    existing = [word for word in unknown if os.path.exists(word)]
    named = [word for word in unknown if not word.startswith("--")] \
        if "the following arguments are required" in message else []
    if not (existing or named):
        return ""
    word = (existing or named)[0]
    ways = f"put -- before file names that start with '-' (-- {word} ...), or give it as ./{word}" if double_dash \
        else f"give it as ./{word}"
    if existing:
        return f" ({word} is a file, read as a flag because its name starts with '-': {ways})"
    return f" ({word} was read as a flag, of which there is none, because it starts with '-'; for a file name, {ways})"


@contextlib.contextmanager
def dashed_file_names_named(parser: argparse.ArgumentParser, argv: Sequence[str],
                            double_dash: bool = True) -> Iterator[None]:
    """Within the block, ``parser``'s usage errors end with :func:`dashed_file_hint`'s hint when a
    file of ``argv`` whose name starts with ``-`` was read as a flag (``-r50.pth``: argparse then
    says a positional after it is missing)."""
    error = parser.error

    def error_with_hint(message: str) -> NoReturn:
        error(message + dashed_file_hint(parser, argv, message, double_dash))

    parser.error = error_with_hint  # type: ignore[method-assign]
    try:
        yield
    finally:
        del parser.error


def replace_flags(parser: argparse.ArgumentParser, argv: Sequence[str], flags: Sequence[str]) -> list[str]:
    """``argv`` without the flags that ``flags`` gives (``["--launcher", "local", "--resume"]``),
    wherever and however often they stand there, values included, and with ``flags`` appended: the
    command line of a job that sets some flags itself (:class:`gwdet.cluster.training.TrainingJob`)."""
    replaced = {_action_of(parser, word) for word in flags if word.startswith("-") and not _is_number(word)}
    kept: list[str] = []
    index = 0
    while index < len(argv):
        name, equals, _ = argv[index].partition("=")
        action = _action_of(parser, name) if name.startswith("-") and not _is_number(name) else None
        if action is None or action not in replaced:
            kept.append(argv[index])
            index += 1
        elif equals or action.nargs == 0:
            index += 1
        elif action.nargs in ("+", "*"):
            index += 1 + len(_list_values(action, argv[index + 1:]))
        else:
            index += 2 if action.nargs is None else 1 + int(action.nargs)
    return kept + list(flags)


def _list_values(action: argparse.Action, words: Sequence[str]) -> list[str]:
    """The values a list flag (``nargs`` ``+`` or ``*``) takes from ``words``, those after it: up to
    the next flag, or the first word outside its choices (an override's KEY)."""
    return list(itertools.takewhile(
        lambda word: not word.startswith("-") and (action.choices is None or word in action.choices), words))


def refuse_repeated_flags(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """A usage error (``parser.error``) for a flag of ``parser`` that keeps one value (``--config-file``,
    ``--tasks``, ``--output``, ...) given more than once in ``argv``, where argparse would keep the
    last one without a word. Repeatable flags (``--register-coco``) and switches are not counted."""
    given: dict[argparse.Action, list[list[str]]] = {}  # the values of each time a flag is given
    tokens = list(argv)
    for index, token in enumerate(tokens):
        name, equals, value = token.partition("=")
        action = _action_of(parser, name) if token.startswith("-") and not _is_number(token) else None
        if action is None or type(action) is not argparse._StoreAction:
            continue
        if equals:
            values = [value]
        elif action.nargs in ("+", "*"):
            values = _list_values(action, tokens[index + 1:])
        else:
            values = [" ".join(tokens[index + 1:index + 1 + (1 if action.nargs is None else int(action.nargs))])]
        given.setdefault(action, []).append(values)
    for action, occurrences in given.items():
        if len(occurrences) < 2:
            continue
        flag = action.option_strings[0]
        if flag == "--config-file":
            fix = "Give one config file, and put what the other changes in it (_BASE_) or as KEY VALUE overrides."
        elif action.nargs in ("+", "*"):
            merged = dict.fromkeys(value for values in occurrences for value in values)
            fix = f"Give it once, with all the values: {flag} {' '.join(merged)}."
        else:
            fix = f"Give it once, with the value you mean (given: {', '.join(' '.join(v) for v in occurrences)})."
        parser.error(f"{flag} is given more than once; a second one would replace the first. {fix}")


def parse_with_trailing_flags(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """``parser.parse_args(argv)`` for a parser whose last argument, ``opts``, takes the remaining
    config overrides: flags of ``parser`` found among the overrides are moved before them, so that
    argparse reads every flag once, wherever it was given; an unknown flag is a usage error (not an
    override), and ``--`` is dropped (what follows it are overrides and flags as anywhere else)."""
    argv = list(argv)
    for token in argv:  # before argparse, whose overrides would take an unknown flag and every flag after it
        name = token.split("=", 1)[0]
        if _is_flag(name) and _action_of(parser, name) is None:
            parser.error(f"unknown flag {name!r}; see --help for the flags of this tool")
    start = _start_of_overrides(parser, argv)
    flags, opts = [], []
    tokens = iter(argv[start:])
    for token in tokens:
        if token == "--":
            continue
        if not _is_flag(token.split("=", 1)[0]):
            opts.append(token)
            continue
        flag = token.split("=", 1)[0]
        action = _action_of(parser, flag)
        assert action is not None, flag  # unknown flags were refused above
        flags.append(token)
        if "=" in token:
            continue
        if action.nargs is None or isinstance(action.nargs, int):  # the flag takes one value, or that many
            count = 1 if action.nargs is None else action.nargs
            values = list(itertools.islice(tokens, count))
            if len(values) < count:
                parser.error(f"{flag} needs {'a value' if count == 1 else f'{count} values'} after it, and the "
                             "command line ends before")
            flags += values
        elif action.nargs in ("+", "*"):  # how many values it takes cannot be told from the overrides after it
            parser.error(f"{flag} takes a list of values, every word up to the next flag: put it before another "
                         f"flag, ahead of the KEY VALUE overrides (e.g. {flag} A B --config-file FILE KEY VALUE)")
    leading = [token for token in argv[:start] if token != "--"]
    # "--" before the overrides: argparse then takes no override as a value of a list flag before it
    with dashed_file_names_named(parser, argv, double_dash=False):  # "--" here starts no file names
        args = parser.parse_args(leading + flags + (["--"] if opts else []) + opts)
    args.opts = opts
    return args


def warn_of_repeated_overrides(opts: Sequence[str]) -> None:
    """A warning for each config key that the overrides ``opts`` set more than once (``KEY VALUE``
    pairs of a yacs config, ``key=value`` of a LazyConfig), naming the values and the one used (the
    last, as detectron2 merges them): a command line built by appending overrides is common, a key
    typed twice by mistake is not, and neither goes without a word. The config loaders call it
    (:func:`gwdet.model_zoo.build_config`, :func:`gwdet.model_zoo.load_lazy_config`), which every
    tool and Python entry reads its overrides through."""
    if any("=" in word for word in opts):
        pairs = [(word.partition("=")[0].lstrip("+"), word.partition("=")[2]) for word in opts]
    else:
        pairs = list(zip(opts[::2], opts[1::2], strict=False))  # an odd count: yacs names it
    values: dict[str, list[str]] = {}
    for key, value in pairs:
        values.setdefault(key, []).append(value)
    for key, given in values.items():
        if len(given) > 1:
            logger.warning("The overrides set %s more than once (%s): the last, %s, is used.", key, ", ".join(given),
                           given[-1])


def _start_of_overrides(parser: argparse.ArgumentParser, argv: Sequence[str]) -> int:
    """The index in ``argv`` of the first ``KEY VALUE`` override, where argparse would begin ``opts``:
    the first word that is neither a flag nor one of a flag's values (``len(argv)`` if there is none)."""
    position = 0
    while position < len(argv):
        token = argv[position]
        if token == "--":
            return position
        if not token.startswith("-") or _is_number(token):
            return position
        position += 1
        action = _action_of(parser, token.split("=", 1)[0])
        if action is None or "=" in token:  # a value given in the token itself, or a usage error argparse names
            continue
        if action.nargs is None or isinstance(action.nargs, int):
            position += 1 if action.nargs is None else action.nargs
        elif action.nargs == "?":
            position += int(position < len(argv) and not argv[position].startswith("-"))
        else:  # "+" or "*": every word up to the next flag, or up to the first word outside its choices
            first = position
            while position < len(argv) and (not argv[position].startswith("-") or _is_number(argv[position])):
                if action.choices is not None and argv[position] not in action.choices:
                    break  # an override's KEY (argparse would take it as a value and refuse it)
                position += 1
            if position == first and action.nargs == "+" and position < len(argv) and not argv[position].startswith("-"):
                position += 1  # not one value: argparse names the word as an invalid choice (`--tasks speed`)
    return len(argv)


def _is_flag(name: str) -> bool:
    """Whether the word ``name`` is a flag: ``--name``, or ``-x`` (a dash and letters, not a number
    such as ``-inf``)."""
    return (name.startswith("--") and name != "--") or (
        len(name) > 1 and name[0] == "-" and name[1].isalpha() and name[1:].isalnum() and not _is_number(name))


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def _action_of(parser: argparse.ArgumentParser, name: str) -> argparse.Action | None:
    """The action argparse reads flag ``name`` as (the flag itself or an unambiguous prefix of one),
    ``None`` for a name that is no flag of ``parser``."""
    flags = parser._option_string_actions
    if name in flags:
        return flags[name]
    actions = {flags[flag] for flag in flags if flag.startswith(name)} if parser.allow_abbrev else set()
    return actions.pop() if len(actions) == 1 else None
