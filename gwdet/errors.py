"""The error types of gwdet's refusals: input that gwdet will not run with, named with the fix.

Every error that gwdet (and the lab beside it) raises on purpose to tell the user what is wrong (a
config key, a flag, a file, a value given to the Python API) is a :class:`GwdetError`. The tools
print such an error as ``<tool>: error: <message>`` without a traceback
(:mod:`gwdet.utils.cli_errors`); any other exception is a bug or comes from another package and
keeps its traceback.

Each class also derives from the built-in type that says what kind of refusal it is, so that
``except ValueError`` (or ``FileNotFoundError``, ``KeyError``, ...) catches it too. Errors of
their own kind (:class:`gwdet.config_checks.NormConfigError`, :class:`gwdet.data.DatasetError`,
:class:`gwdet.convert.ConversionError`, ...) derive from :class:`GwdetError` directly; the classes
below are for refusals that need nothing beyond their message.

A refusal that names many things names a few of them with :func:`listed`.

The Python warnings gwdet's own code issues (``warnings.warn``) are of a :class:`GwdetWarning`
category that also derives from the built-in one (:class:`GwdetRuntimeWarning` is a
``RuntimeWarning``), so that filters and ``pytest.warns`` naming the built-in category still match
them, and a run (:class:`gwdet.engine.run_log.RunWarnings`) can tell them from other packages'
warnings and write them to its log.

This module imports nothing of gwdet, so every part of the package can raise these.
"""
from __future__ import annotations

from typing import Iterable


class GwdetError(Exception):
    """A refusal by gwdet: the message names what is wrong and how to fix it.

    Every gwdet error pickles with its type, message and attributes, whatever its constructor
    takes (:meth:`__reduce__`), so that a refusal raised in a worker process (a
    ``ProcessPoolExecutor``, a ``multiprocessing.Pool``) reaches the parent as raised."""

    def __reduce__(self) -> tuple:
        """Rebuild without calling the class's ``__init__`` (whose arguments need not be the
        exception's ``args``): the ``args``, the attributes, and the values a built-in base keeps
        outside them (an ``OSError``'s ``errno``, ``strerror`` and file names, an ``ImportError``'s
        ``name`` and ``path``)."""
        kept = {name: getattr(self, name) for kind, names in _BUILT_IN_FIELDS if isinstance(self, kind)
                for name in names if getattr(self, name) is not None}  # set to None, an OSError prints "None"
        return _rebuilt, (type(self), self.args, dict(vars(self)), kept)


# the values of built-in exception types kept outside their args and attribute dict
_BUILT_IN_FIELDS: tuple[tuple[type, tuple[str, ...]], ...] = (
    (OSError, ("errno", "strerror", "filename", "filename2")),
    (ImportError, ("msg", "name", "path")),
)


def _rebuilt(kind: type[GwdetError], args: tuple, attributes: dict, kept: dict) -> GwdetError:
    """The :class:`GwdetError` of class ``kind`` with ``args``, ``attributes`` and the built-in
    values ``kept`` (:meth:`GwdetError.__reduce__`), built without its class's ``__init__``."""
    error = kind.__new__(kind)
    error.args = args
    for name, value in kept.items():
        setattr(error, name, value)
    error.__dict__.update(attributes)
    return error


class GwdetValueError(GwdetError, ValueError):
    """A value gwdet refuses: a config value, a flag, an argument or a file's content."""


class GwdetTypeError(GwdetError, TypeError):
    """An argument of a type (or a keyword) that gwdet's Python API does not take."""


class GwdetKeyError(GwdetError, KeyError):
    """A name that is not there: a config key, a dataset, a registered name."""


class GwdetAttributeError(GwdetError, AttributeError):
    """A name gwdet does not have, asked for as another library's (``hasattr`` stays False)."""


class GwdetRuntimeError(GwdetError, RuntimeError):
    """A run that cannot go on in this environment: a folder in use, unreadable checkpoints, a job that failed."""


class GwdetImportError(GwdetError, ImportError):
    """A package gwdet needs for a feature does not import here."""


class GwdetFileNotFoundError(GwdetError, FileNotFoundError):
    """A file or folder that the command or config names does not exist."""


class GwdetFileExistsError(GwdetError, FileExistsError):
    """A file or folder is already there, and gwdet does not write over it."""


class GwdetIsADirectoryError(GwdetError, IsADirectoryError):
    """A folder was given where a file is needed."""


class GwdetOSError(GwdetError, OSError):
    """A file could not be written (a full disk, a read-only folder), named with the fix."""


class GwdetWarning(Warning):
    """The category of every Python warning gwdet's own code issues: a run writes them to its log
    (:class:`gwdet.engine.run_log.RunWarnings`). gwdet warns with the subclasses below, which are
    also the built-in category of the warning's kind."""


class GwdetRuntimeWarning(GwdetWarning, RuntimeWarning):
    """A gwdet warning about how something runs or will compute (a ``RuntimeWarning`` too)."""


class GwdetUserWarning(GwdetWarning, UserWarning):
    """A gwdet warning about how the user's input will be taken (a ``UserWarning`` too)."""


__all__ = [
    "GwdetError",
    "GwdetFileExistsError",
    "GwdetFileNotFoundError",
    "GwdetImportError",
    "GwdetIsADirectoryError",
    "GwdetKeyError",
    "GwdetOSError",
    "GwdetRuntimeError",
    "GwdetRuntimeWarning",
    "GwdetTypeError",
    "GwdetUserWarning",
    "GwdetValueError",
    "GwdetWarning",
    "listed",
]


def did_you_mean(names: Iterable[str], quote: bool = True) -> str:
    """``" Did you mean 'a' or 'b'?"`` naming ``names`` (the names a misspelt one may mean, each
    quoted with ``repr`` when ``quote``), or ``""`` when there are none: how gwdet's messages
    suggest a name, after the sentence that refuses the given one."""
    shown = [repr(name) if quote else name for name in names]
    return f" Did you mean {' or '.join(shown)}?" if shown else ""


def listed(items: Iterable[str], most: int, separator: str = ", ") -> str:
    """At most ``most`` of ``items`` joined by ``separator``, then how many more there are:
    ``"a, b, ... (3 more)"``. How every message of gwdet names a list that may be long."""
    names = list(items)
    shown = separator.join(names[:most])
    rest = len(names) - most
    return f"{shown}{separator}... ({rest} more)" if rest > 0 else shown
