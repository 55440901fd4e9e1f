"""What a training or evaluation run may do to its ``OUTPUT_DIR``.

* :func:`check_fresh_start`: a run that starts from iteration 0 does not write over another run's
  checkpoints, metrics and results unless told to (``--overwrite`` clears them first);
* :func:`check_resume_config`: ``--resume`` continues a run only with the model it was trained with;
* :func:`evaluation_folder`: ``--eval-only`` into a folder that holds a run writes under
  ``eval/<checkpoint>/`` and never touches the run's own config, results, vis or inference;
* :class:`OutputDirLock`: one run at a time per ``OUTPUT_DIR``.

A folder "holds a run" when a run trained there: checkpoints, metrics, results, evaluations. A
``config.yaml`` alone (a run that failed before its first iteration) is no claim: the next run
starts there and writes its own.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
from typing import IO, Any, Mapping

from detectron2.config import CfgNode

from gwdet.engine.atomic import remove_stale_partials, write_text_atomically

LOCK_NAME = ".gwdet.lock"
CONFIG_NAME = "config.yaml"  # detectron2's default_setup writes the run's config here
# Files and folders of a run that a new run would replace or append to.
RUN_FILES = ("last_checkpoint", "metrics.json", "results.md", "results.json", CONFIG_NAME)
EVAL_FOLDER = "eval"  # --eval-only of a folder that holds a run writes to eval/<checkpoint>/
RUN_FOLDERS = ("inference", "vis", EVAL_FOLDER)
# Keys that may differ when a run is resumed: where it runs and where its first weights came from.
RESUMABLE_DIFFERENCES = ("MODEL.DEVICE", "MODEL.WEIGHTS")

logger = logging.getLogger(__name__)


def run_files(output_dir: str) -> list[str]:
    """The files and folders of an earlier run in ``output_dir`` (names, sorted)."""
    if not os.path.isdir(output_dir):
        return []
    names = []
    for name in os.listdir(output_dir):
        is_checkpoint = name.startswith("model_") and name.endswith(".pth")
        if is_checkpoint or name in RUN_FILES or name in RUN_FOLDERS or name.startswith("events.out.tfevents"):
            names.append(name)
    return sorted(names)


def holds_run(output_dir: str) -> bool:
    """Whether a run trained or was evaluated in ``output_dir`` (more than a ``config.yaml``)."""
    return any(name != CONFIG_NAME for name in run_files(output_dir))


def checkpoints_in(output_dir: str) -> list[str]:
    """The ``model_*.pth`` files of ``output_dir`` (names, sorted)."""
    return [name for name in run_files(output_dir) if name.startswith("model_")]


def check_fresh_start(output_dir: str, overwrite: bool) -> None:
    """Raise ``FileExistsError`` when ``output_dir`` holds another run; with ``overwrite``, delete
    that run's files instead (and say so)."""
    if not holds_run(output_dir):
        return
    existing = run_files(output_dir)
    if not overwrite:
        shown = ", ".join(existing[:6]) + (", ..." if len(existing) > 6 else "")
        raise FileExistsError(
            f"OUTPUT_DIR {output_dir!r} already holds a run ({shown}); nothing was changed. Continue "
            "it with --resume, write to another OUTPUT_DIR, or pass --overwrite to delete that run "
            "and start again."
        )
    for name in existing:
        path = os.path.join(output_dir, name)
        shutil.rmtree(path) if os.path.isdir(path) else os.unlink(path)
    logger.warning(f"--overwrite: deleted the earlier run in {output_dir}: {', '.join(existing)}")


class _Absent:
    """Stands for a key that one of two compared configs lacks (no config value can equal it)."""

    def __repr__(self) -> str:
        return "<absent>"


ABSENT = _Absent()


def flatten_config(tree: Mapping, prefix: str = "") -> dict[str, Any]:
    """``{"A": {"B": 1}}`` -> ``{"A.B": 1}`` for a CfgNode or the dict a config's YAML dump loads
    to; sequences become lists, as a YAML round trip gives them back."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            flat.update(flatten_config(value, name))
        else:
            flat[name] = _as_saved(value)
    return flat


def _as_saved(value: Any) -> Any:
    return [_as_saved(item) for item in value] if isinstance(value, (list, tuple)) else value


def differing_values(old: Mapping, new: Mapping) -> list[tuple[str, Any, Any]]:
    """``(key, old value, new value)`` for every key of either config whose value differs, sorted
    by key; :data:`ABSENT` where a config lacks the key."""
    old, new = flatten_config(old), flatten_config(new)
    return [(key, old.get(key, ABSENT), new.get(key, ABSENT)) for key in sorted(set(old) | set(new))
            if old.get(key, ABSENT) != new.get(key, ABSENT)]


def config_differences(saved: CfgNode, current: CfgNode) -> list[str]:
    """``"KEY: saved -> current"`` for every value that differs (keys of either config)."""
    return [f"{key}: {old!r} -> {new!r}" for key, old, new in differing_values(saved, current)]


def check_resume_config(cfg: CfgNode, output_dir: str) -> None:
    """Raise ``ValueError`` when ``--resume`` would continue a run of another model.

    The run's ``config.yaml`` (written when it started) is compared with ``cfg``: any difference
    under ``MODEL`` (but ``MODEL.DEVICE`` and ``MODEL.WEIGHTS``) stops the run before anything is
    loaded; other differences (a longer schedule, say) are logged.
    """
    path = os.path.join(output_dir, CONFIG_NAME)
    if not os.path.isfile(path) or not checkpoints_in(output_dir):  # nothing to resume: a fresh start
        return
    saved = cfg.clone()
    saved.defrost()
    try:
        saved.merge_from_file(path)
    except Exception as error:  # yaml's errors, a key cfg does not have, bytes that are not text
        raise ValueError(
            f"--resume: {path} is damaged, so which model the run in {output_dir!r} trained cannot be checked "
            f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}). Restore that file, or "
            "train afresh into this OUTPUT_DIR with --overwrite (which deletes the run) or into another one."
        ) from None
    differences = config_differences(saved, cfg)
    model = [d for d in differences if d.startswith("MODEL.") and not d.startswith(RESUMABLE_DIFFERENCES)]
    if model:
        raise ValueError(
            f"--resume: the run in {output_dir!r} was trained with another model ({CONFIG_NAME} "
            f"there): {'; '.join(model[:5])}{'; ...' if len(model) > 5 else ''}. Resume with the "
            "same config and overrides, or train the new model into another OUTPUT_DIR."
        )
    if differences:
        logger.warning(f"--resume with config values that differ from {path}: {'; '.join(differences)}")


def tagged_checkpoint(output_dir: str) -> str:
    """The checkpoint ``output_dir/last_checkpoint`` names (a path); an error naming the fix when
    there is none or it is gone: ``--eval-only --resume`` evaluates exactly that file, never an
    older one in its place."""
    tag = os.path.join(output_dir, "last_checkpoint")
    available = checkpoints_in(output_dir)
    if not available:
        raise FileNotFoundError(f"--eval-only --resume: OUTPUT_DIR {output_dir!r} holds no checkpoint to "
                                "evaluate. Check OUTPUT_DIR, or name the weights with MODEL.WEIGHTS "
                                "path/to/model_final.pth.")
    choose = f"Name the weights to evaluate, e.g. MODEL.WEIGHTS {os.path.join(output_dir, available[-1])}"
    try:
        with open(tag, "rb") as f:
            name = f.read().decode("utf-8").strip()
    except FileNotFoundError:
        raise FileNotFoundError(f"--eval-only --resume: OUTPUT_DIR {output_dir!r} has no last_checkpoint "
                                f"file, so which checkpoint is the run's is unknown. {choose}.") from None
    except UnicodeDecodeError:
        raise ValueError(f"--eval-only --resume: {tag} is damaged (not text). {choose}.") from None
    path = os.path.join(output_dir, name)
    if not name or os.sep in name or not os.path.isfile(path):
        raise FileNotFoundError(f"--eval-only --resume: {tag} names {name!r}, which is not a file in "
                                f"{output_dir!r}. {choose}.")
    return path


def evaluation_folder(output_dir: str, weights: str) -> str:
    """Where ``--eval-only`` of ``weights`` writes: ``output_dir`` itself when it holds no run,
    else ``output_dir/eval/<checkpoint>`` (``<folder>-<checkpoint>`` for weights from elsewhere),
    so that the run's own files stay as its training left them."""
    if not holds_run(output_dir):
        return output_dir
    weights = os.path.abspath(os.path.expanduser(weights))
    stem = os.path.splitext(os.path.basename(weights))[0] or "weights"
    if os.path.dirname(weights) != os.path.abspath(output_dir):
        stem = f"{os.path.basename(os.path.dirname(weights))}-{stem}"
    return os.path.join(output_dir, EVAL_FOLDER, stem)


def trim_metrics(output_dir: str, start_iter: int) -> None:
    """Make ``output_dir/metrics.json`` (detectron2's JSON lines, appended to on resume) hold what an
    uninterrupted run would have at ``start_iter``: lines a kill cut short, which would otherwise
    stay in the middle of the file, and records of iterations the resumed run repeats are removed
    (with a warning naming how many)."""
    path = os.path.join(output_dir, "metrics.json")
    if not os.path.isfile(path):
        return
    with open(path, "rb") as f:
        lines = f.read().decode("utf-8", errors="replace").splitlines()
    kept, broken, repeated = [], 0, 0
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            broken += bool(line.strip())
            continue
        if isinstance(record, dict) and isinstance(record.get("iteration"), int) and record["iteration"] >= start_iter:
            repeated += 1
            continue
        kept.append(line)
    if broken or repeated:
        write_text_atomically(path, "".join(f"{line}\n" for line in kept))
        logger.warning(f"{path}: removed {broken} damaged line(s) and {repeated} record(s) of iterations from "
                       f"{start_iter} on, which this resumed run writes again.")


class OutputDirNotWritableError(PermissionError):
    """OUTPUT_DIR cannot be created or written (read-only disk, permissions, a file in its place)."""


class OutputDirLock:
    """An exclusive lock on ``OUTPUT_DIR`` for the duration of a run (``with OutputDirLock(dir):``).

    A second run on the same folder fails at once, naming the process that holds it. The lock is
    released when the process ends, however it ends.
    """

    def __init__(self, output_dir: str) -> None:
        self.path = os.path.join(output_dir, LOCK_NAME)
        self._file: IO[str] | None = None

    def __enter__(self) -> "OutputDirLock":
        output_dir = os.path.dirname(self.path)
        try:
            os.makedirs(output_dir, exist_ok=True)
            self._file = open(self.path, "a+")
        except OSError as error:
            raise OutputDirNotWritableError(
                f"OUTPUT_DIR {output_dir!r} cannot be written ({error.strerror or error}); nothing was "
                "changed. Give the run a writable OUTPUT_DIR; to evaluate or export a run kept on a read-only "
                "disk, name its weights and write elsewhere: MODEL.WEIGHTS <run>/model_final.pth OUTPUT_DIR "
                "<writable folder>.") from None
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.seek(0)
            holder = self._file.read().strip() or "another process"
            self._file.close()
            raise RuntimeError(
                f"OUTPUT_DIR {os.path.dirname(self.path)!r} is in use by another run ({holder}). "
                "Wait for it to finish, or give this run another OUTPUT_DIR."
            ) from None
        self._file.seek(0)
        self._file.truncate()
        self._file.write(f"pid {os.getpid()}\n")
        self._file.flush()
        removed = remove_stale_partials(os.path.dirname(self.path))
        if removed:
            logger.warning("Removed %d partial file(s) an interrupted save left in %s: %s", len(removed),
                           os.path.dirname(self.path), ", ".join(removed))
        return self

    def __exit__(self, *exc_info) -> None:
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None
