"""The identity of a run, so that a resume continues only from the run's own checkpoints.

A training started by :meth:`~gwdet.checkpoint.resilient.ResilientCheckpointer.resume_or_load`
draws a random identity; each checkpoint it saves records it under :data:`RUN_ID_KEY`, and the
output folder in the file :data:`~gwdet.utils.run_file_names.RUN_ID`. A resume from a checkpoint
recording another identity than the folder's (another run's checkpoint copied there, under any
name and iteration) is refused, as is a resume in a folder whose :data:`RUN_ID` file alone names
another run than all its checkpoints (the file replaced); a checkpoint or folder without a record
(older gwdet, detectron2's own checkpointer) is not checked, and the folder takes the identity of
the checkpoint resumed.
"""
from __future__ import annotations

import logging
import os
import re
import uuid
from typing import Mapping

from gwdet.checkpoint.safe_load import load_torch_file
from gwdet.errors import GwdetValueError, listed
from gwdet.utils.atomic import write_atomically
from gwdet.utils.run_file_names import RUN_ID

logger = logging.getLogger(__name__)

RUN_ID_KEY = "gwdet_run_id"  # the identity of the run that saved a checkpoint
_RUN_ID_FORM = re.compile(r"^[0-9a-f]{32}$")


def new_run_id() -> str:
    """A fresh random run identity (32 hexadecimal digits)."""
    return uuid.uuid4().hex


def folder_run_id(folder: str) -> str | None:
    """The run identity recorded in ``folder``'s :data:`RUN_ID` file; ``None`` where there is none
    (or the folder is not local). A file that holds no identity is warned of and read as none."""
    path = os.path.join(folder, RUN_ID)
    if "://" in folder or not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="ascii") as file:
            recorded = file.read(64).strip()
    except (OSError, UnicodeDecodeError) as error:
        logger.warning(f"{path} cannot be read ({error}): the run's checkpoints are not checked against it.")
        return None
    if not _RUN_ID_FORM.match(recorded):
        logger.warning(f"{path} holds no run identity (32 hexadecimal digits): the run's checkpoints are not checked "
                       "against it.")
        return None
    return recorded


def recorded_run_id(path: str) -> str | None:
    """The run identity the checkpoint file ``path`` records (:data:`RUN_ID_KEY`), read with its
    tensors mapped from the file, not read, and without unpickling code; ``None`` for a file that
    records none, or that cannot be read so (damaged, cut short, not torch.save's zip archive)."""
    try:
        data = load_torch_file(path, False, "", mmap=True)
    except Exception:  # a load of the file itself says what is wrong with it, when one is tried
        return None
    recorded = data.get(RUN_ID_KEY) if isinstance(data, dict) else None
    return recorded if isinstance(recorded, str) and _RUN_ID_FORM.match(recorded) else None


def record_run_id(folder: str, run_id: str) -> None:
    """Write ``run_id`` into ``folder``'s :data:`RUN_ID` file (atomically) unless it holds it already."""
    if "://" in folder or folder_run_id(folder) == run_id:
        return
    write_atomically(os.path.join(folder, RUN_ID), lambda file: file.write(run_id.encode("ascii")))


def check_same_run(checkpoint: str, saved: object, folder: str, weights_setting: str,
                   others: Mapping[str, object] | None = None) -> str | None:
    """The run identity a resume from ``checkpoint`` (which records ``saved``) continues in
    ``folder``: the checkpoint's, else the folder's (its :data:`RUN_ID` file; without one, what the
    folder's other checkpoints record, ``others`` by name: ``None`` for one that records none or
    cannot be read), else ``None``. Refused where both are
    recorded and differ: the checkpoint is another run's, copied into the folder; or, where every
    checkpoint of the folder records the checkpoint's identity (more than one, so that they vouch
    for each other) and only the :data:`RUN_ID` file another, that file was replaced."""
    recorded = saved if isinstance(saved, str) and _RUN_ID_FORM.match(saved) else None
    own, where = folder_run_id(folder), f"the folder's {RUN_ID} file"
    if own is None:
        named = {name: value for name, value in (others or {}).items()
                 if isinstance(value, str) and _RUN_ID_FORM.match(value)}
        if recorded is not None and named and recorded not in named.values():
            name, own = sorted(named.items())[-1]
            where = f"its other checkpoint {name}"
        elif named:
            own = sorted(named.items())[-1][1]
    if recorded and own and recorded != own:
        agreeing = sorted([*(others or {}), os.path.basename(checkpoint)])
        if where == f"the folder's {RUN_ID} file" and others and all(value == recorded for value in others.values()):
            path = os.path.join(folder, RUN_ID)
            raise GwdetValueError(
                f"--resume: {path} names another run ({own[:12]}...) than all {len(agreeing)} checkpoints of {folder} "
                f"({listed(agreeing, 3)}), which agree with each other on the run {recorded[:12]}...: the {RUN_ID} file "
                "was replaced, or copied from another output folder; nothing was changed. Write the identity the "
                f"checkpoints record back into it (the line {recorded} in {path}) to continue the run, or start a new "
                f"run from its weights ({weights_setting} {checkpoint}) into another output folder.")
        raise GwdetValueError(
            f"--resume: {checkpoint} was saved by another run than the one in {folder}: it records the run "
            f"{recorded[:12]}..., {where} the run {own[:12]}...; it is another run's checkpoint copied there, so "
            "continuing would train from other weights and write them into this run's records; nothing was "
            "changed. Put the run's own checkpoint back, or start a new run from that checkpoint's weights "
            f"({weights_setting} {checkpoint}) into another output folder.")
    return recorded or own
