"""The run's log (``log.txt``, detectron2's ``setup_logger``) from its first message on.

A run's checks come before its log file exists: they compare the request with the run folder
(:func:`gwdet.engine.run.check_output_request`), and detectron2's set-up that creates ``log.txt``
also writes the new ``config.yaml`` over the one they read. :class:`HeldRecords` holds what gwdet
logs in the meantime (the ``--resume`` warning about changed config values, say) and hands it to
the run's handlers once they exist, so it reaches the console and ``log.txt`` like any later
message. :class:`RunWarnings` keeps the warnings gwdet logs while a run runs, for its
``results.md`` and ``results.json``: a warning that scrolled by among detectron2's lines is still
part of the run's record; the Python warnings gwdet's own code issues meanwhile (its layers'
:class:`~gwdet.errors.GwdetWarning`) are logged under ``gwdet`` too, so they are among them.
:func:`guard_log_files` makes the handlers that write ``log.txt`` say once, on one line, that its disk is full, then leave the file alone (the console keeps every
message), where Python's logging would print a traceback for every record. :func:`unwritten_log_error`
tells whether ``log.txt`` could be written at all.
"""
from __future__ import annotations

import errno
import logging
import os
import sys
import warnings
from types import TracebackType
from typing import Any, Callable, TextIO

from gwdet.errors import GwdetWarning

LOGGER = "gwdet"
# The loggers detectron2's setup_logger gives a handler that writes the run's log file
LOG_FILE_LOGGERS = ("detectron2", LOGGER)
# The loggers detectron2's default_setup and gwdet's set-up give a handler that writes the run's log file
GUARDED_LOGGERS = ("detectron2", "fvcore", LOGGER)
# The errors of a disk that cannot take more: the log file is left alone after the first
FULL_DISK_ERRORS = (errno.ENOSPC, errno.EDQUOT)


class _Holder(logging.Handler):
    def __init__(self, level: int = logging.DEBUG) -> None:
        super().__init__(level)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


class HeldRecords:
    """In its ``with`` block, the records logged under ``gwdet`` (at any level) are held instead of
    handled; :meth:`release` (at the latest when the block ends) restores the logger as it was and
    hands every held record, in order, to the logger's handlers of that moment. Release it right
    after the run's logger set-up to write them to ``log.txt``."""

    def __init__(self, name: str = LOGGER) -> None:
        self._logger = logging.getLogger(name)
        self._holder: _Holder | None = None
        self._saved: tuple[list[logging.Handler], int, bool] | None = None

    def __enter__(self) -> "HeldRecords":
        logger = self._logger
        self._saved = (list(logger.handlers), logger.level, logger.propagate)
        self._holder = _Holder()
        logger.handlers = [self._holder]
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
        return self

    def release(self) -> None:
        """Stop holding; hand the held records to the handlers ``gwdet`` has now. Only the first call acts."""
        if self._holder is None or self._saved is None:
            return
        holder, (handlers, level, propagate) = self._holder, self._saved
        self._holder = self._saved = None
        logger = self._logger
        added = [handler for handler in logger.handlers if handler is not holder and handler not in handlers]
        logger.handlers = [*handlers, *added]  # a logger set-up while holding keeps its handlers
        if not added:  # nobody set the logger up meanwhile: as it was
            logger.setLevel(level)
            logger.propagate = propagate
        for record in holder.records:
            source = logging.getLogger(record.name)
            if source.isEnabledFor(record.levelno):
                source.handle(record)

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.release()


class RunWarnings:
    """In its ``with`` block, every record logged under ``gwdet`` at WARNING or above is kept
    (beside the logger's other handlers, which handle it as before); :attr:`messages` lists their
    texts in the order first logged, each once.

    The Python warnings of category :class:`~gwdet.errors.GwdetWarning` shown in the block (after
    Python's warning filters, which still decide whether and how often one is shown) are logged
    under ``gwdet`` at WARNING with their message text instead of being printed on stderr, each
    text once in the block, so that the run's log, its console and :attr:`messages` have them. The block replaces
    ``warnings.showwarning`` (the hook Python documents for this) and restores it when it ends;
    warnings of every other category go to the hook it replaced, unchanged."""

    def __init__(self, name: str = LOGGER) -> None:
        self._logger = logging.getLogger(name)
        self._collector = _Holder(logging.WARNING)
        self._previous_hook: Callable[..., Any] = warnings.showwarning
        self._routing = False
        self._routed: set[str] = set()  # the texts of the warnings logged in the block

    def __enter__(self) -> "RunWarnings":
        self._logger.addHandler(self._collector)
        self._previous_hook = warnings.showwarning
        warnings.showwarning = self._show_warning
        self._routing = True
        return self

    def _show_warning(self, message: Warning | str, category: type[Warning], filename: str, lineno: int,
                      file: TextIO | None = None, line: str | None = None) -> None:
        """Log a :class:`~gwdet.errors.GwdetWarning` shown by ``warnings.warn`` under ``gwdet``;
        hand any other warning (or one shown to a given ``file``, or any once the block ended) to
        the hook replaced."""
        if self._routing and file is None and isinstance(category, type) and issubclass(category, GwdetWarning):
            if str(message) not in self._routed:
                self._routed.add(str(message))
                self._logger.warning("%s", message)
            return
        self._previous_hook(message, category, filename, lineno, file, line)

    @property
    def messages(self) -> list[str]:
        return list(dict.fromkeys(record.getMessage() for record in self._collector.records))

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self._logger.removeHandler(self._collector)
        if self._routing:
            self._routing = False
            warnings.showwarning = self._previous_hook


class _LogFileState:
    """What the handlers writing one log file share: the full-disk error that stopped them, if any."""

    def __init__(self) -> None:
        self.error: OSError | None = None


class LogFileHandler(logging.StreamHandler):
    """A handler writing a run's log file (the stream detectron2's ``setup_logger`` opened) that,
    when its disk is full, writes one line on stderr naming the file and the error, and from then on
    leaves the file alone: later records reach the console (the logger's other handler) only.
    Other errors are reported as Python's logging reports them."""

    def __init__(self, stream: Any, state: _LogFileState) -> None:
        super().__init__(stream)
        self.state = state

    def emit(self, record: logging.LogRecord) -> None:
        if self.state.error is None:
            super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 (logging's name)
        error = sys.exc_info()[1]
        if not isinstance(error, OSError) or error.errno not in FULL_DISK_ERRORS:
            super().handleError(record)
            return
        if self.state.error is None:
            self.state.error = error
            name = getattr(self.stream, "name", "the run's log file")
            try:
                sys.stderr.write(f"gwdet: the run's log file {name} cannot be written (disk full: "
                                 f"{error.strerror or error}); later messages go to the console only.\n")
                sys.stderr.flush()
            except (OSError, ValueError):
                pass


def guard_log_files(names: tuple[str, ...] = GUARDED_LOGGERS) -> None:
    """Replace each handler of the loggers ``names`` that writes a file (detectron2's ``setup_logger``
    gives them a ``StreamHandler`` on the file's stream) by a :class:`LogFileHandler` on the same
    stream, with the same level, formatter and filters, in the same place; the handlers of one file
    share whether its disk was found full. Console handlers, and handlers already replaced, are kept."""
    states: dict[int, _LogFileState] = {}
    for name in names:
        logger = logging.getLogger(name)
        for index, handler in enumerate(list(logger.handlers)):
            stream = getattr(handler, "stream", None)
            if (type(handler) is not logging.StreamHandler or stream is None
                    or not isinstance(getattr(stream, "name", None), str) or stream.name.startswith("<")):
                continue
            guarded = LogFileHandler(stream, states.setdefault(id(stream), _LogFileState()))
            guarded.setLevel(handler.level)
            guarded.setFormatter(handler.formatter)
            for log_filter in handler.filters:
                guarded.addFilter(log_filter)
            logger.handlers[index] = guarded


def unwritten_log_error(path: str) -> OSError | None:
    """The error that keeps the run's log file ``path`` from being written (a full disk, say), or
    ``None``: the handlers writing it (on :data:`LOG_FILE_LOGGERS`) are flushed, and a write that
    failed before still fails, its text still buffered (logging printed ``--- Logging error ---``
    each time and went on); a :class:`LogFileHandler` that stopped writing on a full disk gives
    the error that stopped it."""
    target = os.path.abspath(path)
    for name in LOG_FILE_LOGGERS:
        for handler in logging.getLogger(name).handlers:
            if isinstance(handler, LogFileHandler) and handler.state.error is not None:
                written = getattr(handler.stream, "name", None)
                if isinstance(written, str) and os.path.abspath(written) == target:
                    return handler.state.error
            stream = getattr(handler, "stream", None)
            written = getattr(stream, "name", None)
            if stream is None or not isinstance(written, str) or os.path.abspath(written) != target:
                continue
            try:
                stream.flush()
            except OSError as error:
                return error
    return None
