"""The run's log (``log.txt``, detectron2's ``setup_logger``) from its first message on.

A run's checks come before its log file exists: they compare the request with the run folder
(:func:`gwdet.engine.run.check_output_request`), and detectron2's set-up that creates ``log.txt``
also writes the new ``config.yaml`` over the one they read. :class:`HeldRecords` holds what gwdet
logs in the meantime (the ``--resume`` warning about changed config values, say) and hands it to
the run's handlers once they exist, so it reaches the console and ``log.txt`` like any later
message. :class:`RunWarnings` keeps the warnings gwdet logs while a run runs, for its
``results.md`` and ``results.json``: a warning that scrolled by among detectron2's lines is still
part of the run's record. :func:`unwritten_log_error` tells whether ``log.txt`` could be written at
all: Python's logging reports a failed write on stderr and goes on.
"""
from __future__ import annotations

import logging
import os
from types import TracebackType

LOGGER = "gwdet"
# The loggers detectron2's setup_logger gives a handler that writes the run's log file
LOG_FILE_LOGGERS = ("detectron2", LOGGER)


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
    texts in the order first logged, each once."""

    def __init__(self, name: str = LOGGER) -> None:
        self._logger = logging.getLogger(name)
        self._collector = _Holder(logging.WARNING)

    def __enter__(self) -> "RunWarnings":
        self._logger.addHandler(self._collector)
        return self

    @property
    def messages(self) -> list[str]:
        return list(dict.fromkeys(record.getMessage() for record in self._collector.records))

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self._logger.removeHandler(self._collector)


def unwritten_log_error(path: str) -> OSError | None:
    """The error that keeps the run's log file ``path`` from being written (a full disk, say), or
    ``None``: the handlers writing it (on :data:`LOG_FILE_LOGGERS`) are flushed, and a write that
    failed before still fails, its text still buffered (logging printed ``--- Logging error ---``
    each time and went on)."""
    target = os.path.abspath(path)
    for name in LOG_FILE_LOGGERS:
        for handler in logging.getLogger(name).handlers:
            stream = getattr(handler, "stream", None)
            written = getattr(stream, "name", None)
            if stream is None or not isinstance(written, str) or os.path.abspath(written) != target:
                continue
            try:
                stream.flush()
            except OSError as error:
                return error
    return None
