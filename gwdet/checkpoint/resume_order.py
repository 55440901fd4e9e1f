"""A run folder's checkpoints (their names, ``last_checkpoint``) and the order in which ``--resume``
tries them: the one rule that
:meth:`~gwdet.checkpoint.resilient.ResilientCheckpointer.resume_candidates` resumes by and that the
run folder's checks before a resume (:mod:`gwdet.engine.output_dir`: the resumed iteration, the
schedule, the recorded initial weights) read the resumed checkpoint by.
"""
from __future__ import annotations

import os
import re
from typing import NamedTuple

from gwdet.checkpoint.safe_load import load_torch_file
from gwdet.utils.run_file_names import FINAL_WEIGHTS, LAST_CHECKPOINT

# The checkpoints a run writes: detectron2's PeriodicCheckpointer names them model_{iteration:07d}
# and model_final, gwdet's signal checkpoints (gwdet.checkpoint.signal_hook) likewise.
CHECKPOINT_NAME = re.compile(r"^model_(\d{7,}|final)\.pth$")


def checkpoint_names(folder: str) -> list[str]:
    """The names of the checkpoints in ``folder`` (:data:`CHECKPOINT_NAME`), sorted; none for a
    folder that is not there (or not local)."""
    if "://" in folder or not os.path.isdir(folder):
        return []
    return sorted(name for name in os.listdir(folder) if CHECKPOINT_NAME.match(name))


def numbered_iteration(name: str) -> int | None:
    """The iteration a numbered checkpoint's name gives (``model_0000004.pth``: 4); ``None`` for
    ``model_final.pth`` and any other name."""
    match = CHECKPOINT_NAME.match(name)
    return int(match.group(1)) if match and match.group(1).isdigit() else None


def tagged_name(save_dir: str) -> str:
    """The file name ``save_dir/last_checkpoint`` holds, stripped (not checked; a path of a file in
    ``save_dir``, absolute or relative to it as ``./model_0000001.pth``, as its name there); ``OSError``
    when it cannot be read, ``UnicodeDecodeError`` when it is not text."""
    with open(os.path.join(save_dir, LAST_CHECKPOINT), "rb") as f:
        name = f.read(4096).decode("utf-8").strip()
    if os.path.isabs(name) and os.path.realpath(os.path.dirname(name)) == os.path.realpath(save_dir):
        return os.path.basename(name)
    if name and not os.path.isabs(name) and os.path.dirname(os.path.normpath(name)) == "":
        return os.path.normpath(name)  # ./model_0000001.pth: detectron2 joins it to the folder
    return name


class ResumeOrder(NamedTuple):
    """The names of the checkpoints of a folder, in the order a resume tries them, and what is wrong
    with its ``last_checkpoint`` (a sentence to log; ``None`` when it names a checkpoint of the
    folder, or is not there)."""

    names: list[str]
    tag_problem: str | None


def _recorded_iteration(folder: str, name: str) -> int:
    """The iteration a checkpoint's name gives (``model_0000004.pth``: 4), else the one recorded
    inside it (mapped, not read: only the pickled values are loaded); -1 when neither tells one."""
    numbered = numbered_iteration(name)
    if numbered is not None:
        return numbered
    try:
        recorded = load_torch_file(os.path.join(folder, name), False, "", mmap=True).get("iteration")
    except Exception:  # damaged or cut short: its load says so, when it is tried
        return -1
    return recorded if isinstance(recorded, int) else -1


def resume_order(folder: str, tag_expected: bool | None = None) -> ResumeOrder:
    """The checkpoint ``folder/last_checkpoint`` names (when it is a file of the folder), then the
    other ``model_*.pth`` latest iteration first: a numbered one's from its name,
    ``model_final.pth``'s as recorded inside it (a finished run resumed to train further writes
    numbered checkpoints after it; a checkpoint copied back from a backup is as old as its
    iteration, whenever it was written). One whose iteration cannot be read is tried last.
    ``last_checkpoint`` is read where ``tag_expected`` (``None``: where the file is there); one that
    cannot be read, is empty, holds no checkpoint's name or names a file outside the folder is passed
    over, with the sentence that says so (:attr:`ResumeOrder.tag_problem`)."""
    others = checkpoint_names(folder)
    iterations = {name: _recorded_iteration(folder, name) for name in others}
    others.sort(key=lambda n: (-iterations[n], n != FINAL_WEIGHTS))
    if tag_expected is None:
        tag_expected = os.path.exists(os.path.join(folder, LAST_CHECKPOINT))
    problem = None
    try:
        tagged = tagged_name(folder) if tag_expected else None
    except (UnicodeDecodeError, OSError) as error:
        problem = f"last_checkpoint in {folder} cannot be read ({error}); trying the checkpoints there newest first."
        tagged = None
    if tagged is not None and not tagged:
        problem = f"last_checkpoint in {folder} is empty; trying the checkpoints there newest first."
        tagged = None
    elif tagged and not tagged.endswith(".pth") and not os.path.lexists(os.path.join(folder, tagged)):
        problem = (f"last_checkpoint in {folder} is damaged: it holds {tagged!r}, which is not the file name of a "
                   "checkpoint; trying the checkpoints there newest first.")
        tagged = None
    elif tagged and (os.sep in tagged or not os.path.isfile(os.path.join(folder, tagged))):
        problem = f"last_checkpoint names {tagged}, which is not in {folder}; trying the other checkpoints there."
        tagged = None
    ordered = ([tagged] if tagged else []) + [n for n in others if n != tagged]
    return ResumeOrder(ordered, problem)
