"""Writing a file so that its final name never holds a partial file, with the real error on failure.

:func:`write_atomically` writes a local path under a unique temporary name in the same folder and
renames it into place when complete; a failure removes the temporary file and raises ``OSError``
naming the path and the operating system's reason (e.g. ``[Errno 28] No space left on device``),
whatever the writer reported. A non-local path (``scheme://...``) goes through detectron2's
``PathManager``, which cannot rename: it is written in place.

A file gwdet trusts when it reads it again also carries its SHA-256 beside it, in ``<file>.sha256``
in ``sha256sum``'s format (:func:`write_with_checksum`, :func:`path_written_with_checksum`,
:func:`record_checksum`); :func:`checksum_problem` checks a file against it, and callers refuse a
mismatch with a :class:`DamagedFileError`. A file without a record is not checked.
"""
from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import logging
import os
import re
import stat
import uuid
from typing import IO, Any, Callable, Iterator, cast

from detectron2.utils.file_io import PathManager

from gwdet.errors import GwdetError, GwdetOSError

logger = logging.getLogger(__name__)


class _RecordingFile:
    """A writable binary file that remembers the first ``OSError`` its writes raised, and passes
    what is written to ``digest`` (a ``hashlib`` object) when there is one."""

    def __init__(self, file: IO[bytes], digest: Any = None) -> None:
        self._file = file
        self._digest = digest
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        if self._digest is not None:
            self._digest.update(data)
        try:
            return self._file.write(data)
        except OSError as error:
            self.error = self.error or error
            raise

    def flush(self) -> None:
        self._file.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)


class WriteError(GwdetError, OSError):
    """Writing ``path`` failed; the message names the path and the operating system's reason
    (``errno`` its code)."""

    path: str | None = None


def _cannot_write(path: str, cause: OSError) -> WriteError:
    folder = os.path.dirname(path) or "."
    missing = f" (the folder {folder} does not exist: create it first, or write into an existing one)" \
        if cause.errno == errno.ENOENT and not os.path.isdir(folder) else ""
    error = WriteError(cause.errno, f"cannot write {path}: {cause.strerror or cause}{missing}")
    error.path = path
    return error


NAME_MAX = 255  # the longest file name Linux's file systems (and macOS's) take, in bytes


def _temporary_name(path: str) -> str:
    """A name in ``path``'s folder for the file being written: ``.<name>.<pid>.<random>.partial``,
    ``<name>`` shortened where the whole would be longer than a file name may be (a legal long
    output name gave "File name too long" for its temporary file)."""
    folder, name = os.path.split(os.path.abspath(path))
    tail = f".{os.getpid()}.{uuid.uuid4().hex[:12]}.partial"
    room = NAME_MAX - len(tail.encode()) - 1
    encoded = os.fsencode(name)
    if len(encoded) > room:
        name = encoded[:room].decode("utf-8", "ignore")  # a character cut in two is dropped
    return os.path.join(folder, f".{name}{tail}")


_PARTIAL = re.compile(r"^\..+\.(\d+)\.[0-9a-f]{12}\.partial(\.sha256)?$")  # a partial file, or its checksum record


def process_is_gone(pid: int) -> bool:
    """Whether no process ``pid`` runs on this machine (a pid of another user's process counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def remove_stale_partials(folder: str, interrupted: str, of: str | None = None) -> list[str]:
    """Remove the temporary files of :func:`write_atomically` in ``folder`` that a process which no
    longer runs left behind (killed during a save); only those of the file named ``of`` when it is
    given; warn naming them and what was ``interrupted`` (``"save"``, ``"export"``, ...), and return
    their names. Files of running processes are kept: they may still become a checkpoint."""
    removed: list[str] = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in names:
        match = _PARTIAL.match(name)
        if of is not None and not name.startswith(f".{of}."):
            continue
        if match and process_is_gone(int(match.group(1))):
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(folder, name))
                removed.append(name)
    removed.sort()
    if removed:
        logger.warning("Removed %d partial file(s) an interrupted %s left in %s: %s", len(removed), interrupted, folder,
                       ", ".join(removed))
    return removed


@contextlib.contextmanager
def path_written_atomically(path: str) -> Iterator[str]:
    """For writers that take a path, not a file (``torch.jit.save``, ``torch.onnx.export``): yields a
    temporary path in ``path``'s folder that becomes ``path`` when the block ends without an error
    (checks of the written file belong inside the block); otherwise it is removed and ``path``,
    if it existed, is untouched."""
    temporary = _temporary_name(path)
    try:
        yield temporary
        _keep_mode_of(path, temporary)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def _keep_mode_of(path: str, temporary: str) -> None:
    """Give ``temporary``, the new file about to replace ``path``, the permission bits of the file
    there (a private ``600`` file stays private, a read-only one read-only; a new file keeps the
    umask's), and warn where ``path`` is one of several hard links of one file: the new file takes
    this name only, and the other names keep the old content."""
    try:
        there = os.stat(path)
    except OSError:  # nothing there (or nothing readable): the new file keeps the umask's mode
        return
    if not stat.S_ISREG(there.st_mode):
        return
    os.chmod(temporary, stat.S_IMODE(there.st_mode))
    if there.st_nlink > 1:
        logging.getLogger(__name__).warning(
            f"{path} is one of {there.st_nlink} hard links of one file: the new file replaces this name only, and "
            "the file's other names keep the old content. Link them to the new file again if they are meant to follow it.")


class OutputExistsError(GwdetError, FileExistsError):
    """:func:`write_atomically` with ``exclusive``: another process wrote ``path`` meanwhile."""


def same_file_version(first: os.stat_result | None, second: os.stat_result | None) -> bool:
    """Whether two ``os.stat`` results (``None``: no file) are of one file unchanged: its inode, size
    and modification time."""
    if first is None or second is None:
        return first is second
    return (first.st_dev, first.st_ino, first.st_size, first.st_mtime_ns) == \
        (second.st_dev, second.st_ino, second.st_size, second.st_mtime_ns)


def file_version(path: str) -> os.stat_result | None:
    """``os.stat(path)``, or ``None`` where nothing is there."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None


@contextlib.contextmanager
def folder_held(folder: str) -> Iterator[None]:
    """An exclusive ``flock`` on ``folder`` for the block (waiting for another holder): the writers
    of :func:`write_atomically` that replace a file they saw check and replace it one at a time,
    and so do writers that check a folder's files before they write into it."""
    import fcntl

    descriptor = os.open(folder or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # releases the lock


def _finish(temporary: str, path: str, exclusive: bool, replacing: os.stat_result | None = None) -> None:
    """Give the complete file ``temporary`` its name ``path``: replacing what is there; with
    ``exclusive`` only if nothing is (a hard link, which fails when the name exists, then the
    temporary name removed; :class:`OutputExistsError` otherwise); with ``replacing`` only if
    ``path`` is still that file (:func:`same_file_version`)."""
    taken = OutputExistsError(errno.EEXIST, f"{path} was written by another process while this one wrote it; "
                              "that file is kept and this one's output discarded", path)
    _keep_mode_of(path, temporary)
    if replacing is not None:
        with folder_held(os.path.dirname(path)):
            if not same_file_version(file_version(path), replacing):
                raise taken
            os.replace(temporary, path)
        return
    if not exclusive:
        os.replace(temporary, path)
        return
    try:
        os.link(temporary, path)
    except FileExistsError:
        raise taken from None
    except OSError as error:  # a file system without hard links: the check and the rename are two steps there
        if error.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
            raise
        if os.path.lexists(path):
            raise taken from None
        os.replace(temporary, path)
        return
    os.unlink(temporary)


def write_atomically(path: str, write: Callable[[IO[bytes]], object], path_manager=PathManager,
                     exclusive: bool = False, digest: Any = None, replacing: os.stat_result | None = None) -> None:
    """Call ``write(file)`` on a binary file that becomes ``path`` only once ``write`` returned
    (what it returns, such as the count ``file.write`` gives, is ignored). With ``exclusive``, a
    ``path`` that exists by then is kept and :class:`OutputExistsError` raised instead (two
    processes writing one new file: exactly one succeeds; local paths only); with ``replacing``
    (the ``os.stat`` of the file this writer means to replace) likewise a ``path`` that is no
    longer that file (two processes replacing one file at once: the second to finish is refused). A ``digest``
    (``hashlib`` object) of a local path receives the bytes as they are written."""
    path = os.fspath(path)
    if "://" in path:
        with path_manager.open(path, "wb") as file:
            write(file)
        return
    temporary = _temporary_name(path)
    try:
        with open(temporary, "xb") as raw:
            recording = _RecordingFile(raw, digest)
            try:
                write(cast(IO[bytes], recording))  # a file to ``write``: it passes on what it does not wrap
                recording.flush()
                os.fsync(raw.fileno())
            except Exception as error:
                cause = recording.error or error
                if not isinstance(cause, OSError):
                    raise
                raise _cannot_write(path, cause) from error
        _finish(temporary, path, exclusive, replacing)
    except (WriteError, OutputExistsError):
        raise
    except OSError as error:
        raise _cannot_write(path, error) from error
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def write_text_atomically(path: str, text: str, path_manager=PathManager) -> None:
    """:func:`write_atomically` for UTF-8 text."""
    write_atomically(path, lambda file: file.write(text.encode("utf-8")), path_manager)


# ---- checksums recorded beside a file --------------------------------------------------------------

CHECKSUM_SUFFIX = ".sha256"
# sha256sum's line (upper-case hex too, as sha256sum -c takes it), or the BSD form that
# `shasum --tag` and `openssl dgst -sha256` write: "SHA256 (name) = hex"
_CHECKSUM_RECORD = re.compile(rb"([0-9a-fA-F]{64}) [ *]|SHA2?-?256 ?\([^\n]*\) ?= ?([0-9a-fA-F]{64})\s*$")


class DamagedFileError(GwdetError, ValueError):
    """A file no longer holds what gwdet wrote (or cannot be read as what it should be); the
    message names the file and the fix. ``path`` is the file."""

    def __init__(self, message: str, path: str) -> None:
        super().__init__(message)
        self.path = path


def checksum_path(path: str) -> str:
    """Where the checksum of ``path`` is recorded: ``path.sha256``."""
    return os.fspath(path) + CHECKSUM_SUFFIX


def reading_record(path: str) -> str:
    """The SHA-256 record that checks ``path`` when it is read: ``path.sha256``; for a link without
    one beside it, the record beside the file the link leads to (``best.pth -> run/model_final.pth``
    is checked by the run's record)."""
    record = checksum_path(path)
    if "://" not in os.fspath(path) and not os.path.lexists(record) and os.path.islink(path):
        target = checksum_path(os.path.realpath(path))
        if os.path.isfile(target):
            return target
    return record


def shown_record(path: str) -> str:
    """:func:`reading_record` of ``path`` as a message names it: its file name beside ``path``, its
    whole path beside a link's target."""
    record = reading_record(path)
    return os.path.basename(record) if record == checksum_path(path) else record


def file_sha256(path: str) -> str:
    """The SHA-256 of the file at ``path`` (hex digits)."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@functools.lru_cache(maxsize=None)
def _sha256_of_version(path: str, size: int, modified_ns: int) -> str:
    return file_sha256(path)


def cached_sha256(path: str) -> str:
    """The SHA-256 of the file ``path``, hashed once per process for each size and modification time."""
    status = os.stat(path)
    return _sha256_of_version(path, status.st_size, status.st_mtime_ns)


def free_path(folder: str, stem: str, extension: str = "") -> str:
    """``folder/<stem><extension>``, or where that is taken, the first free of ``<stem>_2<extension>``,
    ``<stem>_3<extension>``, ...: what a file or folder set aside is moved to (a resumed run's earlier
    results, a checkpoint of another run or model that a save would replace)."""
    target, number = os.path.join(folder, stem + extension), 1
    while os.path.lexists(target):
        number += 1
        target = os.path.join(folder, f"{stem}_{number}{extension}")
    return target


def record_checksum(path: str, digest: str | None = None) -> None:
    """Write ``path.sha256`` (atomically) with ``digest``, the SHA-256 of the bytes the caller wrote
    to ``path``, or else of the file as it is now. Nothing for a non-local path."""
    path = os.fspath(path)
    if "://" in path:
        return
    line = (digest or file_sha256(path)).encode("ascii") + b"  " + os.fsencode(os.path.basename(path)) + b"\n"
    write_atomically(checksum_path(path), lambda file: file.write(line))


def move_checksum_record(path: str, target: str) -> None:
    """Move the SHA-256 record of ``path`` to ``target``'s (after the file was renamed there), the
    recorded digest kept and the file name in it now ``target``'s, so that ``sha256sum -c`` checks
    the renamed file; a record whose digest cannot be read moves as it is."""
    digest = _recorded_sha256(path)[0]
    if digest is None:
        os.replace(checksum_path(path), checksum_path(target))
        return
    record_checksum(target, digest)
    remove_checksum(path)


def remove_checksum(path: str) -> None:
    """Remove ``path.sha256`` if it is there."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(checksum_path(path))


def _entry_lines(file: IO[bytes], start: bytes) -> int:
    """How many lines that are not blank the open record ``file`` holds, ``start`` being the bytes
    already read from it; read in blocks, so that a large file is counted without being held."""
    count, counted, block = 0, False, start
    while block:
        for index, part in enumerate(block.split(b"\n")):
            counted = counted and index == 0  # a part after a newline starts a line
            if not counted and part.strip():
                count, counted = count + 1, True
        block = file.read(1 << 20)
    return count


def _recorded_sha256(path: str) -> tuple[str | None, str | None]:
    """``(SHA-256, None)`` as recorded beside ``path``, ``(None, None)`` when nothing is recorded (or
    ``path`` is not local), ``(None, why)`` when the record cannot be read, is damaged, or holds
    other than the one entry gwdet writes (``<hash>  <name>``, as ``sha256sum`` writes it; blank lines
    aside): a record of several lines is not checked on one of them."""
    record = reading_record(path)
    if "://" in path or not os.path.isfile(record):
        return None, None
    name = shown_record(path)
    try:
        with open(record, "rb") as file:
            start = file.read(256)
            match = _CHECKSUM_RECORD.match(start)
            lines = _entry_lines(file, start) if match is not None else 1
    except OSError as error:
        return None, f"its checksum record {name} cannot be read: {error.strerror or error}"
    if match is None:
        return None, f"its checksum record {name} is damaged"
    if lines != 1:
        checked = name[:-len(CHECKSUM_SUFFIX)]
        return None, (f"its checksum record {name} holds {lines} lines; gwdet writes one (sha256sum {checked} > "
                      f"{name} writes it anew)")
    return (match.group(1) or match.group(2)).decode("ascii").lower(), None


def foreign_record(path: str | os.PathLike) -> str | None:
    """The checksum record's path beside ``path`` when a file is there that is no SHA-256 record (a
    user's file named like one), which writing ``path`` with its record would replace; else ``None``
    (no file there, or a record, even a stale one, of a file gwdet wrote)."""
    record = checksum_path(os.fspath(path))
    if not os.path.lexists(record):
        return None
    try:
        with open(record, "rb") as file:
            return None if _CHECKSUM_RECORD.match(file.read(256)) else record
    except OSError:  # a folder, a link to nothing, unreadable: not a record gwdet wrote
        return record


def checksum_findings(path: str) -> tuple[str | None, str | None]:
    """``(why the SHA-256 record beside path cannot be used, why the file differs from it)``, each as
    words to put in a message or ``None``: a record that is unreadable or damaged, or a file whose
    SHA-256 is not the recorded one (both ``None`` when it matches, and when nothing is recorded).
    For readers that load a file unchecked, with a warning, when only its record is unusable."""
    path = os.fspath(path)
    recorded, unusable = _recorded_sha256(path)
    if os.path.isfile(path) and not os.access(path, os.R_OK):
        raise GwdetOSError(f"{path} cannot be read by this user (permission denied): ask its owner to make it readable "
                           "(chmod a+r), or copy the file to where you may read it; nothing was loaded from it.")
    if recorded is not None and file_sha256(path) != recorded:
        named = _recorded_name(path)
        other = (f" (a record of another file: it names {named}, not {os.path.basename(os.path.realpath(path))}; if "
                 "that record was copied here by mistake, the file may be whole and the record wrong)"
                 if named and named not in (os.path.basename(path), os.path.basename(os.path.realpath(path))) else "")
        return None, f"its SHA-256 differs from the one recorded in {shown_record(path)} when it was written{other}"
    return unusable, None


def _recorded_name(path: str) -> str | None:
    """The file name a ``sha256sum``-style record beside ``path`` gives after its digest, if any."""
    try:
        with open(reading_record(path), "rb") as file:
            line = file.read(4096).split(b"\n", 1)[0]
    except OSError:
        return None
    match = re.match(rb"[0-9a-fA-F]{64} [ *](.+)", line)
    return os.path.basename(match.group(1).decode("utf-8", "replace").strip()) if match else None


def checksum_problem(path: str) -> str | None:
    """Why the file at ``path`` does not hold what was written, by the SHA-256 recorded beside it,
    or why that record cannot be used (:func:`checksum_findings`, either); ``None`` when it matches,
    and when nothing is recorded."""
    unusable, differs = checksum_findings(path)
    return differs or unusable


def write_with_checksum(path: str, write: Callable[[IO[bytes]], object], path_manager=PathManager) -> None:
    """:func:`write_atomically`, then ``path.sha256`` recorded from the bytes as they were written
    (a non-local path gets no record). An earlier record is removed first: whichever moment a kill
    comes, the file is the old or the new one, complete, and its record is absent (the file is then
    read unchecked) or right."""
    path = os.fspath(path)
    if "://" in path:
        write_atomically(path, write, path_manager)
        return
    earlier = _recorded_sha256(path)[0] if os.path.isfile(checksum_path(path)) else None  # the record beside it
    try:
        remove_checksum(path)
    except OSError as error:  # a read-only folder, a file where the folder should be: the file is what failed
        raise _cannot_write(path, error) from None
    digest = hashlib.sha256()
    try:
        write_atomically(path, write, digest=digest)
    except BaseException:
        # a write that failed (a full disk, a size limit) left the earlier file: its record goes back
        if earlier is not None and os.path.isfile(path) and file_sha256(path) == earlier:
            record_checksum(path, earlier)
        raise
    record_checksum(path, digest.hexdigest())


def write_text_with_checksum(path: str, text: str) -> None:
    """:func:`write_with_checksum` for UTF-8 text."""
    write_with_checksum(path, lambda file: file.write(text.encode("utf-8")))


@contextlib.contextmanager
def path_written_with_checksum(path: str) -> Iterator[str]:
    """:func:`path_written_atomically`, then ``path.sha256`` recorded once the file has its name
    (an earlier record is removed before the rename, as in :func:`write_with_checksum`). A
    record that a writer inside made for the temporary name goes with the temporary file."""
    with path_written_atomically(path) as temporary:
        try:
            yield temporary
            digest = file_sha256(temporary)
        finally:
            remove_checksum(temporary)
        remove_checksum(path)
    record_checksum(path, digest)
