"""What a training or evaluation run may do to its ``OUTPUT_DIR``.

* :func:`check_fresh_start`: a run that starts from iteration 0 does not write over another run's
  checkpoints, metrics and results unless told to (``--overwrite`` clears them first);
* :func:`check_resumed_run`: ``--resume`` continues a run only with the model it was trained with,
  and only when there is something left to train (:func:`check_resume_trains`);
* :func:`evaluation_folder`: ``--eval-only`` into a folder that holds a run writes under
  ``eval/<checkpoint>/`` and never touches the run's own config, results, vis or inference;
* :class:`OutputDirLock`: one run at a time per ``OUTPUT_DIR``.

A folder "holds a run" when a run trained there: checkpoints, metrics, results, evaluations. A
``config.yaml`` alone (a run that failed before its first iteration) is no claim: the next run
starts there and writes its own. A run's folders (:data:`RUN_FOLDERS`) are folders: a file of the
user's named ``vis`` or ``inference`` is no part of a run. A run's checkpoints are the names
detectron2's and gwdet's checkpointers give them (``model_0000099.pth``, ``model_final.pth``,
:data:`CHECKPOINT_NAME`, with their ``.sha256`` records) and the one ``last_checkpoint`` names; any other file, a
``model_best_by_me.pth`` of the user's included, is not the run's: it does not make the folder
hold a run and ``--overwrite`` keeps it (and says so). A file under a checkpoint's name that holds
no checkpoint (a text of the user's: no torch.save file, no ``.sha256`` record), or another run's
checkpoint (it records another run identity than the folder's ``run_id`` file), makes ``--overwrite``
refuse before it deletes anything.
"""
from __future__ import annotations

import codecs
import contextlib
import fcntl
import filecmp
import json
import logging
import math
import os
import pickle
import re
import shlex
import shutil
import struct
import sys
import unicodedata
from typing import IO, Any, Callable, Iterator, Mapping, NamedTuple, Sequence

import yaml
from detectron2.config import CfgNode

from gwdet.errors import (
    GwdetError,
    GwdetFileExistsError,
    GwdetIsADirectoryError,
    GwdetFileNotFoundError,
    GwdetOSError,
    GwdetRuntimeError,
    GwdetValueError,
    listed,
)
from gwdet.checkpoint.safe_load import UnsafeCheckpointError, load_torch_file, starts_like_torch_save_output
from gwdet.checkpoint.resilient import INITIAL_WEIGHTS_KEY, local_weights_path, lost_checkpoint_error
from gwdet.checkpoint.run_identity import folder_run_id, recorded_run_id
from gwdet.checkpoint.resume_order import CHECKPOINT_NAME, checkpoint_names, numbered_iteration, resume_order, tagged_name
from gwdet.utils.run_file_names import (LAST_CHECKPOINT, RUN_ID, LOCK_NAME, FINAL_WEIGHTS, CONFIG_NAME, RESULTS_MARKDOWN,
                                   RESULTS_JSON, EVALUATOR_FILES, CONFIG_FILES, RUN_FILES, SET_ASIDE_INFIX,
                                   EARLIER_RESULTS, EVAL_FOLDER, INFERENCE_FOLDER, VIS_FOLDER, RUN_FOLDERS, CONFIG_KEPT,
                                   CONFIG_KEEPING, SET_ASIDE, LOG_NAME, RANK_LOG, CONFIG_PAIR, METRICS_JSON)
from gwdet.config import ABSENT, flatten_config
from gwdet.config_checks import NORM_VALUE_SECTIONS, norm_keys_read
from gwdet.engine.run_environment import ENVIRONMENT_KEY
from gwdet.engine.visualize import is_prediction_drawing
from gwdet.model_zoo.lazy_loading import is_lazy_config
from gwdet.model_zoo.loading import load_config_yaml
from gwdet.positions import format_gw_positions, parse_gw_positions
from gwdet.utils.atomic import (
    CHECKSUM_SUFFIX,
    DamagedFileError,
    checksum_findings,
    checksum_path,
    checksum_problem,
    foreign_record,
    free_path,
    move_checksum_record,
    path_written_atomically,
    process_is_gone,
    record_checksum,
    remove_checksum,
    remove_stale_partials,
    shown_record,
    write_text_atomically,
)
from gwdet.utils.cli_errors import (as_override, edge_whitespace_problem, link_dotdot_problem, output_path_problem,
                                    unexpanded_variable_problem)

# Keys that may differ when a run is resumed: where it runs and where its first weights came from.
RESUMABLE_DIFFERENCES = ("MODEL.DEVICE", "MODEL.WEIGHTS")

logger = logging.getLogger(__name__)

# The checkpoints a resume kept, with their SHA-256 records (set_aside_later_checkpoints): the run's files,
# under names no resume continues from.
EARLIER_CHECKPOINT = re.compile(rf"^model_(\d{{7,}}|final){SET_ASIDE_INFIX}\d+(_\d+)?\.pth({re.escape(CHECKSUM_SUFFIX)})?$")


def _tagged_checkpoint_name(output_dir: str) -> str | None:
    """The file name ``output_dir/last_checkpoint`` holds, when it names a ``.pth`` file of the folder."""
    try:
        name = tagged_name(output_dir)
    except (OSError, UnicodeDecodeError):
        return None
    if not name.endswith(".pth") or os.sep in name or not os.path.isfile(os.path.join(output_dir, name)):
        return None
    return name


def is_checkpoint_name(name: str, tagged: str | None = None) -> bool:
    """Whether ``name`` is a checkpoint a run wrote: :data:`CHECKPOINT_NAME`, or ``tagged`` (the name
    ``last_checkpoint`` holds: a checkpointer of one's own may choose other names)."""
    return bool(CHECKPOINT_NAME.match(name)) or (tagged is not None and name == tagged)


def run_files(output_dir: str) -> list[str]:
    """The files and folders of an earlier run in ``output_dir`` (names, sorted): its checkpoints
    (:func:`is_checkpoint_name`) and their ``.sha256`` records, :data:`RUN_FILES` and the results and
    checkpoints a resume kept (:data:`EARLIER_RESULTS`, :data:`EARLIER_CHECKPOINT`) (files, not folders, of those names), :data:`RUN_FOLDERS` and
    TensorBoard's event files. Nothing else is a run's."""
    if not os.path.isdir(output_dir):
        return []
    tagged = _tagged_checkpoint_name(output_dir)
    names = []
    for name in os.listdir(output_dir):
        checkpoint = name[:-len(CHECKSUM_SUFFIX)] if name.endswith(CHECKSUM_SUFFIX) else name
        folder = os.path.isdir(os.path.join(output_dir, name))  # a folder named like a run's file is the user's
        run_file = not folder and (is_checkpoint_name(checkpoint, tagged) or name in RUN_FILES
                                   or bool(EARLIER_RESULTS.match(name)) or bool(EARLIER_CHECKPOINT.match(name)))
        if run_file or _is_run_folder(output_dir, name) or name.startswith("events.out.tfevents"):
            names.append(name)
    return sorted(names)


def _is_run_folder(output_dir: str, name: str) -> bool:
    """Whether ``output_dir/name`` is one of the folders runs write (:data:`RUN_FOLDERS`): a folder of
    that name, not a file or a link of the user's."""
    path = os.path.join(output_dir, name)
    return name in RUN_FOLDERS and os.path.isdir(path) and not os.path.islink(path)


def holds_run(output_dir: str) -> bool:
    """Whether a run trained or was evaluated in ``output_dir``: more than a ``config.yaml``, an empty
    ``metrics.json`` and empty run folders, which a run that stopped before its first step leaves."""
    return any(name not in CONFIG_FILES and not _empty(os.path.join(output_dir, name))
               for name in run_files(output_dir))


def _empty(path: str) -> bool:
    """Whether ``path`` is an empty ``metrics.json`` or a folder without files (in any subfolder)."""
    if os.path.isdir(path):
        return not any(files for _, _, files in os.walk(path))
    return os.path.basename(path) == METRICS_JSON and os.path.getsize(path) == 0


# What detectron2's evaluators write into their output folder besides EVALUATOR_FILES: LVISEvaluator's
# and SemSegEvaluator's results, the proposals of a proposal-only model, and COCOEvaluator's COCO-format
# cache of a dataset registered without a json file (<dataset>_coco_format.json, with its file lock).
_OTHER_EVALUATOR_FILES = ("lvis_instances_results.json", "sem_seg_predictions.json", "sem_seg_evaluation.pth",
                          "box_proposals.pkl")
_COCO_FORMAT_CACHE = re.compile(r"^.+_coco_format\.json(\.lock)?$")


def _written_by_a_run(parts: Sequence[str], output_dir: str = "") -> bool:
    """Whether the file at the relative path ``parts`` (of ``output_dir``) below a run's folder is
    one a run writes: below ``inference/`` what detectron2's evaluators write, by name
    (:data:`EVALUATOR_FILES`, :data:`_OTHER_EVALUATOR_FILES`, the COCO-format cache); below ``vis/``
    the prediction drawings (:func:`gwdet.engine.visualize.is_prediction_drawing`); and below
    ``eval/<evaluation>/`` the files of a run (:data:`RUN_FILES`, ``log.txt`` and its other
    processes' ``log.txt.rank<N>``, its lock) and its ``inference/`` and ``vis/``. Every other file
    is the user's."""
    if parts[0] == EVAL_FOLDER:
        if len(parts) == 3:
            return parts[2] in (*RUN_FILES, LOG_NAME, LOCK_NAME) or bool(RANK_LOG.match(parts[2]))
        return len(parts) > 3 and _written_by_a_run(parts[2:], os.path.join(output_dir, *parts[:2]))
    name = parts[-1]
    if parts[0] == INFERENCE_FOLDER:
        return name in EVALUATOR_FILES or name in _OTHER_EVALUATOR_FILES or bool(_COCO_FORMAT_CACHE.match(name))
    return parts[0] == VIS_FOLDER and is_prediction_drawing(os.path.join(output_dir, *parts))


def foreign_files(output_dir: str, folders: Sequence[str]) -> list[str]:
    """The files below the run folders ``folders`` of ``output_dir`` (:data:`RUN_FOLDERS`) that no
    run wrote (:func:`_written_by_a_run`), as paths relative to ``output_dir``."""
    found = []
    for folder in folders:
        for root, _, files in os.walk(os.path.join(output_dir, folder)):
            relative = os.path.relpath(root, output_dir)
            found += [os.path.join(relative, name) for name in files
                      if not _written_by_a_run([*relative.split(os.sep), name], output_dir)]
    return sorted(found)


def _shows_a_run(output_dir: str, existing: Sequence[str]) -> bool:
    """Whether the run files ``existing`` of ``output_dir`` include what only a run writes: the
    record of the config it saves first (:data:`CONFIG_NAME`), a checkpoint, or ``results.json``'s record.
    Without one of them a ``metrics.json`` or ``results.md`` there may be the user's own."""
    return (CONFIG_NAME + CHECKSUM_SUFFIX in existing or RESULTS_JSON + CHECKSUM_SUFFIX in existing
            or any(_written_as_a_checkpoint(os.path.join(output_dir, name)) for name in checkpoints_in(output_dir)))


def _written_as_a_checkpoint(path: str) -> bool:
    """Whether the file ``path``, named as a checkpoint, may have been saved by a run's checkpointer:
    its SHA-256 recorded beside it (gwdet's), or torch.save's file beside a ``last_checkpoint``
    (detectron2's checkpointer writes one with each checkpoint), or empty (nothing to lose). A file
    of the user's named ``model_final.pth``, a text or a ``torch.save`` of their own, is no sign of
    a run."""
    if os.path.isfile(checksum_path(path)):
        return True
    try:
        return os.path.getsize(path) == 0 or (
            os.path.isfile(os.path.join(os.path.dirname(path), LAST_CHECKPOINT)) and starts_like_torch_save_output(path))
    except OSError:
        return False


def _holds_a_checkpoint(path: str) -> bool:
    """Whether the file ``path``, named as a checkpoint in a folder that holds a run, is one a
    checkpointer may have written, which ``--overwrite`` deletes: its SHA-256 recorded beside it
    (gwdet's checkpointer records every checkpoint), or torch.save's output (a zip archive, or a
    legacy pickle: detectron2's checkpointer, or gwdet's stopped between the file and its record), or
    empty (nothing to lose). Anything else (a text of the user's) is no checkpoint."""
    if os.path.isfile(checksum_path(path)):
        return True
    try:
        return os.path.getsize(path) == 0 or starts_like_torch_save_output(path)
    except OSError:
        return False


def _not_checkpoints(output_dir: str, names: Sequence[str]) -> list[str]:
    """The files among ``names`` of ``output_dir`` named as checkpoints (:func:`is_checkpoint_name`,
    and as a resume keeps them, :data:`EARLIER_CHECKPOINT`) that hold no checkpoint
    (:func:`_holds_a_checkpoint`)."""
    return [name for name in _named_as_checkpoints(output_dir, names)
            if not _holds_a_checkpoint(os.path.join(output_dir, name))]


def _named_as_checkpoints(output_dir: str, names: Sequence[str]) -> list[str]:
    """The files among ``names`` of ``output_dir`` named as checkpoints (:func:`is_checkpoint_name`,
    and as a resume keeps them, :data:`EARLIER_CHECKPOINT`), their ``.sha256`` records aside."""
    tagged = _tagged_checkpoint_name(output_dir)
    return [name for name in names if not name.endswith(CHECKSUM_SUFFIX)
            and (is_checkpoint_name(name, tagged) or EARLIER_CHECKPOINT.match(name))
            and os.path.isfile(os.path.join(output_dir, name))]


def _other_runs_checkpoints(output_dir: str, names: Sequence[str]) -> tuple[str, dict[str, str]]:
    """The identity of the run in ``output_dir`` (its :data:`RUN_ID` file) and, with the identity
    each records (:func:`~gwdet.checkpoint.run_identity.recorded_run_id`), the files among ``names``
    named as its checkpoints (:func:`is_checkpoint_name`, :data:`EARLIER_CHECKPOINT`) that record
    another run's: another run's checkpoints copied there. Only where both are recorded: a folder
    without a :data:`RUN_ID` file, or a checkpoint without an identity (older gwdet, detectron2's
    checkpointer), is no finding; nor are checkpoints that all record one identity (more than one,
    vouching for each other) when none records the file's: then the file was replaced, and the
    checkpoints are the run's."""
    own = folder_run_id(output_dir)
    if own is None:
        return "", {}
    recorded = {name: recorded_run_id(os.path.join(output_dir, name))
                for name in _named_as_checkpoints(output_dir, names)}
    identities = {value for value in recorded.values() if value is not None}
    if own not in identities and len(identities) == 1 and sum(value is not None for value in recorded.values()) > 1:
        return own, {}
    return own, {name: value for name, value in recorded.items() if value is not None and value != own}


def _crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of ``data``, as TensorBoard's event files check their records."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def _starts_as_event_file(head: bytes) -> bool:
    """Whether ``head`` (a file's first bytes) starts as TensorBoard's event files do (TFRecord): an
    8-byte record length followed by its masked CRC-32C."""
    if len(head) < 12:
        return False
    crc = _crc32c(head[:8])
    masked = ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF
    return struct.unpack("<I", head[8:12])[0] == masked


# The first lines of results.md as gwdet.engine.run.results_markdown writes it (a table's title, then the table)
_RESULTS_MARKDOWN_START = re.compile(rb"^### [^\n]*\n\n\| ")
# A config as detectron2 writes it into a run (yacs' dump, or LazyConfig.save): a top-level model section
_CONFIG_MODEL_SECTION = re.compile(rb"^(MODEL|model):[ \t]*\r?$", re.MULTILINE)


def _unlike_what_runs_write(path: str) -> str | None:
    """Why the file at ``path``, named as a run writes such files (but not a checkpoint's name: see
    :func:`_holds_a_checkpoint`), holds no such file: words such as "no TensorBoard event file";
    ``None`` when it may be the run's. An empty file, and a file with its SHA-256 record beside it
    (a record a run writes with it), may be the run's; else the content decides, by the kind the
    name gives: a SHA-256 record (``*.sha256``), the results a resume kept (``results.md``'s table,
    ``results.json``'s object with its environment), the config a resume kept (a config with its
    model section, as detectron2 writes it) and TensorBoard's event file (a TFRecord). Names of
    other kinds (the run's :data:`RUN_FILES` and logs, which a run in the folder writes or appends
    to): ``None``."""
    name = os.path.basename(path)
    named = name[:-len(CHECKSUM_SUFFIX)] if name.endswith(CHECKSUM_SUFFIX) else name
    checked = named.startswith("events.out.tfevents") or bool(EARLIER_RESULTS.match(named))
    if not checked or not os.path.isfile(path) or os.path.islink(path):
        return None
    try:
        if os.path.getsize(path) == 0:
            return None
        if name.endswith(CHECKSUM_SUFFIX):
            return "no SHA-256 record" if foreign_record(path[:-len(CHECKSUM_SUFFIX)]) else None
        if os.path.isfile(checksum_path(path)) and foreign_record(path) is None:
            return None
        with open(path, "rb") as file:
            head = file.read(1 << 16)
    except OSError as error:
        return f"cannot be read: {error.strerror or error}"
    if name.startswith("events.out.tfevents"):
        return None if _starts_as_event_file(head) else "no TensorBoard event file"
    if name.endswith(".md"):
        return None if _RESULTS_MARKDOWN_START.match(head) else "no results table as a run writes it"
    if name.endswith(".yaml"):
        return None if _CONFIG_MODEL_SECTION.search(head) else "no run's config"
    try:
        with open(path, encoding="utf-8") as file:
            record = json.load(file)
    except (OSError, ValueError):
        record = None
    return None if isinstance(record, dict) and ENVIRONMENT_KEY in record else "no results record as a run writes it"


def _not_run_written(output_dir: str, names: Sequence[str]) -> list[str]:
    """The files among ``names`` of ``output_dir`` that are named as a run's files other than its
    checkpoints but hold no such file (:func:`_unlike_what_runs_write`), each as ``name (why)``."""
    found = []
    for name in names:
        why = _unlike_what_runs_write(os.path.join(output_dir, name))
        if why is not None:
            found.append(f"{name} ({why})")
    return found


def checkpoints_in(output_dir: str) -> list[str]:
    """The checkpoints a run wrote in ``output_dir`` (:func:`is_checkpoint_name`; names, sorted)."""
    tagged = _tagged_checkpoint_name(output_dir) if os.path.isdir(output_dir) else None
    return [name for name in run_files(output_dir) if is_checkpoint_name(name, tagged)]


def check_fresh_start(output_dir: str, overwrite: bool, setting: str = "OUTPUT_DIR", weights: str = "",
                      weights_setting: str = "MODEL.WEIGHTS", aside: bool = False) -> None:
    """Raise ``FileExistsError`` when ``output_dir`` (the config's ``setting``) holds another run;
    with ``overwrite``, delete that run's files (:func:`run_files`) instead, keep every other file,
    and say which were deleted and which kept; with ``aside``, move them into :data:`SET_ASIDE`
    instead (:func:`earlier_run_until_started` deletes or puts them back). The initial ``weights``
    (``weights_setting``) are never among them, nor files that nothing shows a run wrote
    (:func:`_shows_a_run`), nor files under a checkpoint's name that hold no checkpoint
    (:func:`_holds_a_checkpoint`) or another run's (:func:`_other_runs_checkpoints`): an overwrite
    that would delete them is refused before anything is deleted."""
    if not holds_run(output_dir):
        return
    existing = run_files(output_dir)
    shows_run = _shows_a_run(output_dir, existing)
    initial = os.path.realpath(local_weights_path(weights, weights_setting)) if weights else ""
    if (not overwrite and os.path.dirname(initial) == os.path.realpath(output_dir)  # (--overwrite: refused below)
            and os.path.basename(initial) in existing and CONFIG_NAME + CHECKSUM_SUFFIX not in existing):
        raise GwdetFileExistsError(
            f"{weights_setting} {weights!r} is in {setting} {output_dir!r} under a name the run's checkpoints take "
            f"({os.path.basename(initial)}), so the folder looks like a run's; nothing was changed. Move the initial "
            f"weights out of {setting} (or name them otherwise, e.g. initial_weights.pth) and give that path.")
    unproven = [] if shows_run else [name for name in existing if name not in RUN_FOLDERS]
    if unproven:
        raise GwdetFileExistsError(
            f"{setting} {output_dir!r} holds {listed(unproven, 5)}, named as a run's files, but nothing there shows that "
            f"a run of gwdet wrote them (no recorded {CONFIG_NAME} or {RESULTS_JSON}, no checkpoint), so --overwrite "
            f"would not delete them either; nothing was changed. Move them out of {setting}, or train into another "
            f"{setting}.")
    foreign = [] if shows_run else foreign_files(output_dir, [name for name in existing if name in RUN_FOLDERS])
    if foreign:  # folders named like a run's that hold the user's own files: no run that stopped
        raise GwdetFileExistsError(
            f"{setting} {output_dir!r} holds {listed([name for name in existing if name in RUN_FOLDERS], 5)}, named as "
            f"a run's folders, with files no run of gwdet writes ({listed(foreign, 5)}), and nothing there shows a run "
            f"(no recorded {CONFIG_NAME} or {RESULTS_JSON}, no checkpoint); --overwrite would not delete them either, "
            f"and nothing was changed. Move them out of {setting}, or train into another {setting}.")
    folders = [name for name in existing if name in RUN_FOLDERS]
    alike = [] if shows_run else [os.path.relpath(os.path.join(root, name), output_dir) for folder in folders
                                  for root, _, files in os.walk(os.path.join(output_dir, folder)) for name in files]
    if alike:  # a run records its config before it writes anything there: these may be the user's own
        raise GwdetFileExistsError(
            f"{setting} {output_dir!r} holds {listed(folders, 5)}, named as a run's folders, with files named as a run "
            f"writes them ({listed(sorted(alike), 5)}), but nothing there shows that a run of gwdet wrote them (no "
            f"recorded {CONFIG_NAME} or {RESULTS_JSON}, no checkpoint: a run records its config first); --overwrite "
            f"would not delete them either, and nothing was changed. Move them out of {setting}, or train into another "
            f"{setting}.")
    if shows_run:  # the logs of the run shown there (its other processes' too)
        logs = [name for name in os.listdir(output_dir) if (name == LOG_NAME or RANK_LOG.match(name))
                and os.path.isfile(os.path.join(output_dir, name))]
        existing = sorted([*existing, *logs])
    if not overwrite:
        shown = listed(existing, 6)
        if not checkpoints_in(output_dir):  # nothing to continue: --resume would start afresh over them
            if RESULTS_JSON not in existing:
                raise GwdetFileExistsError(
                    f"{setting} {output_dir!r} already holds a run that stopped before its first checkpoint ({shown}), "
                    f"nothing to continue; nothing was changed. Write to another {setting}, or pass --overwrite to "
                    "delete its files and train here.")
            raise GwdetFileExistsError(
                f"{setting} {output_dir!r} already holds results ({shown}) but no checkpoint to continue (an "
                f"evaluation's, or a training's whose checkpoints were removed); nothing was changed. Write to another "
                f"{setting}, or pass --overwrite to delete those results and train here.")
        raise GwdetFileExistsError(
            f"{setting} {output_dir!r} already holds a run ({shown}); nothing was changed. Continue "
            f"it with --resume, write to another {setting}, or pass --overwrite to delete that run "
            "and start again."
        )
    if EVAL_FOLDER in existing:  # an evaluation running there (its own lock) would write into deleted folders
        evaluations = os.path.join(output_dir, EVAL_FOLDER)
        for name in sorted(os.listdir(evaluations)):
            check_not_in_use(os.path.join(evaluations, name), setting)
    deleted = [os.path.realpath(os.path.join(output_dir, name)) for name in existing]
    source = os.path.realpath(os.path.expanduser(weights)) if weights and "://" not in weights else None
    if source is not None and any(source == path or source.startswith(path + os.sep) for path in deleted):
        raise GwdetFileExistsError(
            f"--overwrite would delete {weights_setting} {weights}, a file of the earlier run in {setting} "
            f"{output_dir!r}, before training starts from it; nothing was changed. Copy the weights out of that "
            f"folder and set {weights_setting} to the copy, or train into another {setting}.")
    foreign = foreign_files(output_dir, [name for name in existing if name in RUN_FOLDERS])
    if foreign:
        raise GwdetFileExistsError(
            f"--overwrite would delete {listed(foreign, 5)} in the earlier run's folders of {setting} "
            f"{output_dir!r}, which no run of gwdet wrote; nothing was changed. Move them out of {setting}, or "
            f"train into another {setting}.")
    # a file of the user's under a checkpoint's name, or under the name of a run's events, kept results or config
    for users, named_as, not_written in (
            (_not_checkpoints(output_dir, existing), "a run's checkpoints", "no checkpointer wrote {it} (no torch.save "
             f"file, no {CHECKSUM_SUFFIX} record beside {{it}})"),
            (_not_run_written(output_dir, existing), "a run's files", "no run of gwdet wrote {it} (no "
             f"{CHECKSUM_SUFFIX} record beside {{it}}, and not what a run writes under such a name)")):
        if users:
            it = "it" if len(users) == 1 else "them"
            raise GwdetFileExistsError(
                f"--overwrite would delete {listed(users, 5)} in {setting} {output_dir!r}: named as {named_as}, but "
                f"{not_written.format(it=it)}; nothing was changed. Move {it} out of {setting}, or delete {it}, then "
                f"run again (or train into another {setting}).")
    own, strangers = _other_runs_checkpoints(output_dir, existing)
    if strangers:
        it = "it" if len(strangers) == 1 else "them"
        first = sorted(strangers)[0]
        raise GwdetFileExistsError(
            f"--overwrite would delete {listed(sorted(strangers), 5)} in {setting} {output_dir!r}: named as a run's "
            f"checkpoints, but saved by another run ({'it' if len(strangers) == 1 else first} records the run "
            f"{strangers[first][:12]}..., the folder's {RUN_ID} file the run {own[:12]}...); nothing was changed. "
            f"Move {it} out of {setting}, or delete {it}, then run again (or train into another {setting}).")
    if aside:
        os.makedirs(os.path.join(output_dir, SET_ASIDE), exist_ok=True)
    for name in existing:
        path = os.path.join(output_dir, name)
        if aside:
            os.rename(path, os.path.join(output_dir, SET_ASIDE, name))
        else:
            _remove(path)
    kept = sorted(set(os.listdir(output_dir)) - {LOCK_NAME, SET_ASIDE})
    done = ("set aside the earlier run (deleted once the new run has started, put back if it stops before)" if aside
            else "deleted the earlier run")
    logger.warning(f"--overwrite: {done} in {output_dir}: {', '.join(existing)}"
                   + (f"; kept what no run of gwdet wrote there: {listed(kept, 10)}" if kept else ""))


def _remove(path: str) -> None:
    shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)


def put_back_set_aside(output_dir: str) -> list[str]:
    """Move the earlier run's files that ``--overwrite`` set aside (:data:`SET_ASIDE`) back into
    ``output_dir``, over what the new run wrote under their names; the names put back."""
    aside = os.path.join(output_dir, SET_ASIDE)
    if not os.path.isdir(aside):
        return []
    names = sorted(os.listdir(aside))
    for name in names:
        if os.path.lexists(os.path.join(output_dir, name)):
            _remove(os.path.join(output_dir, name))
        os.rename(os.path.join(aside, name), os.path.join(output_dir, name))
    os.rmdir(aside)
    return names


def set_aside_problem(output_dir: str) -> str | None:
    """Words for a refusal that finds no checkpoint in ``output_dir`` where ``--overwrite`` set an
    earlier run aside (:data:`SET_ASIDE`) and was stopped before training: where the files are and
    what puts them back; ``None`` where nothing is set aside."""
    aside = os.path.join(output_dir, SET_ASIDE)
    if not os.path.isdir(aside):
        return None
    return (f"an --overwrite run in {output_dir} was stopped before training and left the earlier run's files set "
            f"aside in {aside}/ ({', '.join(sorted(os.listdir(aside))[:4])}...): the next run that takes the folder "
            f"(e.g. tools/train_net.py with its config and --resume) puts them back, or name the file there.")


def check_not_set_aside(path: str, setting: str) -> None:
    """Refuse weights ``path`` (the value of ``setting``) that are missing because ``--overwrite``
    set them aside (:func:`set_aside_problem`), naming where they are."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.exists(path) or not os.path.exists(os.path.join(folder, SET_ASIDE, os.path.basename(path))):
        return
    raise GwdetFileNotFoundError(f"{setting} {path} is not there: {set_aside_problem(folder)}")


@contextlib.contextmanager
def earlier_run_until_started(output_dir: str) -> Iterator[None]:
    """Around a run's start (set-up, model, weights): the earlier run that ``--overwrite`` set aside
    is deleted when the block ends, and put back when it raises (a weights file, a device or a model
    refused), so a run that never started loses nothing."""
    try:
        yield
    except BaseException:
        names = put_back_set_aside(output_dir)
        if names:
            logger.warning(f"--overwrite: the new run stopped before training, so the earlier run's files are back in "
                           f"{output_dir}: {', '.join(names)}")
        raise
    aside = os.path.join(output_dir, SET_ASIDE)
    if os.path.isdir(aside):
        names = sorted(os.listdir(aside))
        shutil.rmtree(aside)
        logger.warning(f"--overwrite: deleted the earlier run in {output_dir}: {', '.join(names)}")


def _compared(key: str, value: Any) -> Any:
    """``value`` of ``key`` as configs are compared: GW positions (``MODEL.RESNETS.GW_POSITIONS``, a
    LazyConfig's ``positions``) in their canonical spelling, ``B2-S1`` being ``S1-B2``."""
    if key.endswith((".GW_POSITIONS", ".positions")) and isinstance(value, str):
        try:
            return format_gw_positions(parse_gw_positions(value, key))
        except GwdetValueError:
            return value  # not positions: compared as written
    return value


def differing_values(old: Mapping, new: Mapping) -> list[tuple[str, Any, Any]]:
    """``(key, old value, new value)`` for every key of either config whose value differs (GW
    positions in any spelling of the same positions do not: :func:`_compared`), sorted by key;
    :data:`ABSENT` where a config lacks the key."""
    old, new = flatten_config(old), flatten_config(new)
    return [(key, old.get(key, ABSENT), new.get(key, ABSENT)) for key in sorted(set(old) | set(new))
            if _compared(key, old.get(key, ABSENT)) != _compared(key, new.get(key, ABSENT))]


def config_differences(saved: Mapping, current: Mapping) -> list[str]:
    """``"KEY: saved -> current"`` for every value that differs (keys of either config)."""
    return [f"{key}: {old!r} -> {new!r}" for key, old, new in differing_values(saved, current)]


class _PlainDumper(yaml.SafeDumper):
    """YAML without anchors and aliases: each key's value written out in full."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _write_without_aliases(path: str) -> None:
    """Rewrite the yacs ``config.yaml`` at ``path`` with each value in full where detectron2's dump
    wrote one list under two keys as a YAML anchor and alias (``MODEL.RPN.BBOX_REG_WEIGHTS:
    *id002``): an edit of the anchored value in a copy of the file would change the other key too.
    A LazyConfig's (Python tags; no such shared values) is left as it is."""
    with open(path, encoding="utf-8") as file:
        text = file.read()
    if not re.search(r"(^|\s)\*id\d+", text):
        return
    try:
        values = yaml.safe_load(text)
    except yaml.YAMLError:
        return
    write_text_atomically(path, yaml.dump(values, Dumper=_PlainDumper, default_flow_style=False))


def record_config_checksum(output_dir: str) -> None:
    """Record the SHA-256 of ``output_dir/config.yaml`` as detectron2's ``default_setup`` has just
    written it (in place; :func:`config_rewrite` keeps the earlier file and record until then, and a
    config.yaml that no longer matches its record is refused by ``--resume`` instead of trusting a
    cut-off config), its shared values written out in full (:func:`_write_without_aliases`)."""
    path = os.path.join(output_dir, CONFIG_NAME)
    if os.path.isfile(path):
        _write_without_aliases(path)
        record_checksum(path)


def written_by_a_run(path: str) -> bool:
    """Whether the ``config.yaml`` at ``path`` is as a run wrote it: its SHA-256 matches the record
    beside it (``config.yaml.sha256``)."""
    return os.path.isfile(checksum_path(path)) and checksum_problem(path) is None


def check_config_file_kept(config_file: str, output_dir: str, setting: str = "OUTPUT_DIR") -> None:
    """Refuse a run whose config file ``config_file`` is ``output_dir/config.yaml``, where detectron2's
    ``default_setup`` writes the run's full config: the user's file (its comments, its ``_BASE_``)
    would be replaced by the dump. A ``config.yaml`` a run wrote (:func:`written_by_a_run`) may be
    given: ``--resume --config-file <run>/config.yaml`` writes the same config there again."""
    path = os.path.join(output_dir, CONFIG_NAME)
    try:
        same = os.path.samefile(config_file, path)
    except OSError:  # either is missing: nothing to write over
        return
    if same and not written_by_a_run(path):
        raise GwdetFileExistsError(
            f"The config file {config_file} is {setting}/{CONFIG_NAME} ({path}), where the run writes its full "
            f"config: your file (its comments and _BASE_ too), which no run wrote (no {CONFIG_NAME}{CHECKSUM_SUFFIX} "
            f"beside it matches it), would be replaced; nothing was changed. Give the run another {setting}, or keep "
            f"the config file elsewhere (e.g. mv {path} {os.path.join(output_dir, 'my_config.yaml')} and pass that "
            "as --config-file).")


def check_run_folder_is_the_records(config_file: str, output_dir: str, setting: str = "OUTPUT_DIR",
                                    request: str = "--resume") -> None:
    """Refuse a run ``request`` (``--resume``, ``--eval-only``, ``--overwrite``, or ``""``: a new
    training) whose ``--config-file`` is the recorded ``config.yaml`` of the run in another folder
    than ``output_dir`` (the ``setting`` the file gives, not overridden): a copy of a run keeps the
    output folder of the run it was copied from, so resuming the copy by its config would continue,
    and replace the files of, the original, an evaluation would write its results there
    (re-creating a moved run's folder), and a new training with ``--overwrite`` would delete it."""
    folder = os.path.dirname(os.path.abspath(config_file))
    if os.path.basename(config_file) != CONFIG_NAME or not written_by_a_run(config_file) or not checkpoints_in(folder):
        return
    if os.path.realpath(folder) == os.path.realpath(output_dir):
        return
    flag, outcome, beside, other = {
        "--resume": ("--resume", "continue the run there", "continue the run beside the config file",
                     "resume the other folder"),
        "--eval-only": ("--eval-only", "write the evaluation there", "write it beside the config file",
                        "write it elsewhere"),
        "--overwrite": ("--overwrite", "delete the run there and train anew in its place", "train anew beside the "
                        "config file (replacing the run there)", "train into another folder"),
    }.get(request, ("A training", "train into that folder", "train anew beside the config file (with --overwrite, "
                    "replacing the run there)", "train into another folder"))
    raise GwdetValueError(
        f"{flag} with --config-file {config_file}, the record of the run in {folder}, whose {setting} is another "
        f"folder, {output_dir!r}: that would {outcome}, not beside the config file (a copy of a run keeps the "
        f"{setting} of the run it was copied from); nothing was changed. Add {as_override(setting, folder)} to "
        f"{beside}, or give {setting} on the command line to {other}.")


def check_weights_are_the_runs(config_file: str, weights: str, weights_setting: str, nothing_done: str) -> None:
    """Refuse an evaluation or export of the weights that ``--config-file``, a run's recorded
    ``config.yaml``, names in ``weights_setting`` (not given on the command line) where they are not
    a checkpoint of that run: they are the weights the run started from, while the folder beside the
    file holds what it trained (``nothing_done``: what the refusal says of the request)."""
    folder = os.path.dirname(os.path.abspath(config_file))
    if (os.path.basename(config_file) != CONFIG_NAME or not weights or not written_by_a_run(config_file)
            or not checkpoints_in(folder)):
        return
    if "://" not in weights and os.path.realpath(os.path.dirname(os.path.abspath(weights))) == os.path.realpath(folder):
        return
    trained = os.path.join(folder, FINAL_WEIGHTS if os.path.isfile(os.path.join(folder, FINAL_WEIGHTS))
                           else checkpoints_in(folder)[-1])
    raise GwdetValueError(
        f"--config-file {config_file} is the record of the run in {folder}, whose {weights_setting} ({weights}) names "
        f"the weights that run started from, not the ones it trained; {nothing_done}. Give "
        f"{as_override(weights_setting, trained)} for the trained model, or give {weights_setting} on the command line "
        "to use the weights it started from.")


# The first line detectron2's default_setup writes into a run's log.txt (its file format, then the rank)
_RUN_LOG_START = re.compile(rb"^\[\d\d/\d\d \d\d:\d\d:\d\d\] detectron2 INFO: Rank of current process: \d+\. ")


def is_a_runs_log(path: str) -> bool:
    """Whether the file at ``path`` starts as the log.txt of a run (its first line, as detectron2's
    ``default_setup`` writes it): a run that stopped before it wrote anything else left it, and the
    next run may add to it."""
    try:
        with open(path, "rb") as file:
            return bool(_RUN_LOG_START.match(file.read(200)))
    except OSError:
        return False


def check_config_not_users(output_dir: str, setting: str = "OUTPUT_DIR") -> None:
    """Refuse a run that starts in ``output_dir`` (fresh, or an evaluation) where a ``config.yaml``
    without its run's record is: the user's file, which detectron2's ``default_setup`` would replace
    with the run's config; or a ``log.txt`` beside nothing that shows a run (:func:`_shows_a_run`):
    the user's file, to which detectron2's logger would append the run's log."""
    path = os.path.join(output_dir, CONFIG_NAME)
    if os.path.lexists(path) and not os.path.lexists(checksum_path(path)):
        raise GwdetFileExistsError(
            f"{setting} {output_dir!r} holds a {CONFIG_NAME} that no run of gwdet wrote (no {CONFIG_NAME}{CHECKSUM_SUFFIX} "
            f"record beside it), where the run writes its full config: the file would be replaced; nothing was "
            f"changed. Move it (e.g. mv {path} {os.path.join(output_dir, 'my_config.yaml')}), or give the run another "
            f"{setting}.")
    log = os.path.join(output_dir, LOG_NAME)
    if os.path.lexists(log) and not _shows_a_run(output_dir, run_files(output_dir)) and not is_a_runs_log(log):
        raise GwdetFileExistsError(
            f"{setting} {output_dir!r} holds a {LOG_NAME} that no run of gwdet wrote (no recorded {CONFIG_NAME}, "
            f"checkpoint or {RESULTS_JSON} beside it), to which the run would append its log; nothing was changed. "
            f"Move it (e.g. mv {log} {os.path.join(output_dir, 'my_log.txt')}), or give the run another {setting}.")


def _cannot_write(output_dir: str, error: OSError, setting: str) -> GwdetOSError:
    """The refusal of a run whose first files (``config.yaml``, ``log.txt``) could not be written to
    ``output_dir`` (a full disk, ...): the folder, the operating system's reason and the fix."""
    return GwdetOSError(
        f"{setting} {output_dir!r}: writing the run's {CONFIG_NAME} and log there failed ({error}); {CONFIG_NAME} "
        f"and {CONFIG_NAME}{CHECKSUM_SUFFIX} there are as they were before this run, and nothing was trained. Free "
        f"space there (or fix what the error names), or give the run another {setting}.")


def _keep_config(output_dir: str) -> None:
    """Copy ``config.yaml`` and its record, those that are there, into :data:`CONFIG_KEPT` (made
    under :data:`CONFIG_KEEPING` and renamed when complete, so that :func:`restore_config` never
    takes a half-made copy for the files as they were)."""
    keeping, kept = os.path.join(output_dir, CONFIG_KEEPING), os.path.join(output_dir, CONFIG_KEPT)
    shutil.rmtree(keeping, ignore_errors=True)
    os.makedirs(keeping)
    try:
        for name in CONFIG_PAIR:
            if os.path.lexists(os.path.join(output_dir, name)):  # a link is kept as the link
                shutil.copyfile(os.path.join(output_dir, name), os.path.join(keeping, name), follow_symlinks=False)
        os.rename(keeping, kept)
    except BaseException:
        shutil.rmtree(keeping, ignore_errors=True)
        raise


def _foreign_in_kept_config(output_dir: str) -> list[str]:
    """What the folders :func:`_keep_config` writes hold besides its copies (:data:`CONFIG_PAIR`):
    files of the user's in a folder of that name (paths relative to ``output_dir``, sorted); a
    file (not a folder) of that name is listed itself."""
    found = []
    for folder in (CONFIG_KEPT, CONFIG_KEEPING):
        path = os.path.join(output_dir, folder)
        if os.path.lexists(path) and (os.path.islink(path) or not os.path.isdir(path)):
            found.append(folder)
        elif os.path.isdir(path):
            found += [os.path.join(folder, name) for name in os.listdir(path) if name not in CONFIG_PAIR
                      or not os.path.isfile(os.path.join(path, name))]
    return sorted(found)


def restore_config(output_dir: str) -> bool:
    """Put ``config.yaml`` and its record back as :func:`_keep_config` kept them (a name it did not
    keep was not there: it is removed), when a copy is kept; a half-made copy is removed. Whether
    anything was put back."""
    shutil.rmtree(os.path.join(output_dir, CONFIG_KEEPING), ignore_errors=True)
    kept = os.path.join(output_dir, CONFIG_KEPT)
    if not os.path.isdir(kept):
        return False
    for name in CONFIG_PAIR:
        if os.path.lexists(os.path.join(kept, name)):
            os.replace(os.path.join(kept, name), os.path.join(output_dir, name))
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(output_dir, name))
    shutil.rmtree(kept)
    return True


@contextlib.contextmanager
def config_rewrite(output_dir: str, setting: str = "OUTPUT_DIR") -> Iterator[None]:
    """Around detectron2's ``default_setup``, which writes the run's ``config.yaml`` in place: the
    ``config.yaml`` and ``config.yaml.sha256`` there are kept aside first (:func:`_keep_config`); when
    the block ends, the new file's SHA-256 is recorded (:func:`record_config_checksum`); the copy is
    removed once the run has started (:func:`config_until_started`). An error in the block or in
    recording puts both files back as they were
    (:func:`restore_config`; an ``OSError``, such as a full disk, becomes a
    :class:`~gwdet.errors.GwdetOSError` naming the folder and the fix); a kill is undone by the next run that
    takes the folder's lock (:class:`OutputDirLock`). So ``--resume`` always finds the config and
    record of one run, never a config cut short beside an older record."""
    try:
        _keep_config(output_dir)
    except OSError as error:
        raise _cannot_write(output_dir, error, setting) from None
    try:
        yield
        record_config_checksum(output_dir)
    except BaseException as error:
        restore_config(output_dir)
        if isinstance(error, OSError):
            raise _cannot_write(output_dir, error, setting) from error
        raise


@contextlib.contextmanager
def config_until_started(output_dir: str) -> Iterator[None]:
    """Around a run's start (its checks, detectron2's set-up, the model built and its weights or
    checkpoint loaded): a run refused or stopped there puts back the ``config.yaml`` and record that
    :func:`config_rewrite` kept (a refused ``--resume`` left the run's config.yaml describing another
    request); once started, the kept copy is removed."""
    try:
        yield
    except BaseException:
        restore_config(output_dir)
        raise
    shutil.rmtree(os.path.join(output_dir, CONFIG_KEPT), ignore_errors=True)


RUN_FOLDER_PURPOSES = {INFERENCE_FOLDER: "the evaluation's files", VIS_FOLDER: "the prediction drawings"}


def check_run_folders(output_dir: str, names: Sequence[str], setting: str = "OUTPUT_DIR") -> None:
    """Refuse, before training, a run that would write its folders ``names`` (of :data:`RUN_FOLDERS`)
    in ``output_dir`` where a file of that name is: creating the folder would fail after training."""
    for name in names:
        path = os.path.join(output_dir, name)
        if os.path.lexists(path) and not _is_run_folder(output_dir, name):
            purpose = RUN_FOLDER_PURPOSES.get(name, "its files")
            what = f"a link {name} (to {os.readlink(path)})" if os.path.islink(path) else f"a file {name}"
            raise GwdetFileExistsError(
                f"{setting} {output_dir!r} holds {what}, but the run writes {purpose} into a folder of that "
                f"name, which it could not create after training; nothing was changed. Move or rename {path} (no run "
                f"wrote it: --overwrite keeps it), or give the run another {setting}.")


# The files a run writes in its output folder, and what each holds (named in refusals)
RUN_FILE_PURPOSES = {LAST_CHECKPOINT: "the name of its latest checkpoint", RUN_ID: "its identity",
                     METRICS_JSON: "its training metrics",
                     LOG_NAME: "its log", RESULTS_MARKDOWN: "its results", RESULTS_JSON: "its results"}


def check_run_file_names(output_dir: str, setting: str = "OUTPUT_DIR") -> None:
    """Refuse, before training, a run in ``output_dir`` where a folder has the name of a file the run
    writes (:data:`RUN_FILE_PURPOSES`, a checkpoint's): writing that file would fail later, some after
    training."""
    checkpoints = checkpoint_names(output_dir)
    for name, purpose in [*RUN_FILE_PURPOSES.items(), *((name, "a checkpoint") for name in checkpoints)]:
        path = os.path.join(output_dir, name)
        if os.path.isdir(path):
            raise GwdetIsADirectoryError(
                f"{setting} {output_dir!r} holds a folder {name}, but the run writes {purpose} into a file of that "
                f"name, which would fail once it is written; nothing was changed. Move or rename {path} (no run wrote "
                f"it: --overwrite keeps it), or give the run another {setting}.")
    for name in sorted(os.listdir(output_dir)) if os.path.isdir(output_dir) else ():
        recorded = name[:-len(CHECKSUM_SUFFIX)] if name.endswith(CHECKSUM_SUFFIX) else None
        if (recorded is not None and (CHECKPOINT_NAME.match(recorded) or recorded == RESULTS_JSON)
                and os.path.isdir(os.path.join(output_dir, name))):
            raise GwdetIsADirectoryError(
                f"{setting} {output_dir!r} holds a folder {name}, but the run records the SHA-256 of its "
                f"{'results' if recorded == RESULTS_JSON else 'checkpoint'} {recorded} in a file of that name, which "
                f"would fail when the run writes {recorded}, some only after training; nothing was changed. Move or rename "
                f"{os.path.join(output_dir, name)} (no run wrote it: --overwrite keeps it), or give the run another "
                f"{setting}.")


# The files of a run written in place (opened for writing or appending, not replaced): detectron2's
# config dump, log, metrics and last_checkpoint.
IN_PLACE_FILES = (CONFIG_NAME, LOG_NAME, METRICS_JSON, LAST_CHECKPOINT)


def check_run_files_not_shared(output_dir: str, setting: str = "OUTPUT_DIR") -> None:
    """Refuse a run in ``output_dir`` whose files written in place (:data:`IN_PLACE_FILES`) are
    symbolic links to files (or to nothing) or share their data with another name (hard links):
    writing them would change the other files too, another run's records where the folder is a
    copy made with ``cp -s`` or ``cp -l``."""
    shared = []
    for name in IN_PLACE_FILES:
        path = os.path.join(output_dir, name)
        if os.path.islink(path) and (os.path.isfile(path) or not os.path.exists(path)):  # a device is no run's file
            shared.append(f"{name} (a link to {os.readlink(path)})")
        elif os.path.isfile(path) and (links := os.stat(path).st_nlink) > 1:
            shared.append(f"{name} (a hard link: its data has {links - 1} other name(s))")
    if shared:
        raise GwdetFileExistsError(
            f"{setting} {output_dir!r} holds {', '.join(shared)}: the run writes into these files in place, so it "
            "would change the files they share their data with (another run's records, where this folder is a copy "
            "made with cp -s or cp -l); nothing was changed. Give the folder its own copies (cp -a of the run, or "
            f"cp --remove-destination of those files), or give the run another {setting}.")


def damaged_config(path: str, output_dir: str, reason: Exception | str, output_setting: str = "OUTPUT_DIR") -> DamagedFileError:
    """The refusal of ``--resume`` over a run whose ``config.yaml`` at ``path`` is damaged (``reason``:
    the checksum's words, or the error reading it gave)."""
    if isinstance(reason, Exception):
        reason = f"{type(reason).__name__}: {str(reason).splitlines()[0] if str(reason) else ''}"
    return DamagedFileError(
        f"--resume: {path} is damaged, so which model the run in {output_dir!r} trained cannot be checked "
        f"({reason}). Restore that file, or train afresh into this {output_setting} with --overwrite (which "
        "deletes the run) or into another one.", path)


def check_config_checksum(path: str, output_dir: str, output_setting: str = "OUTPUT_DIR") -> None:
    """Refuse (:func:`damaged_config`) a run's ``config.yaml`` that differs from its recorded SHA-256,
    and one whose record is unusable (damaged, unreadable), naming the record, not the file."""
    unusable, differs = checksum_findings(path)
    if differs is not None:
        raise damaged_config(path, output_dir, differs, output_setting)
    if unusable is not None:
        record = checksum_path(path)
        raise DamagedFileError(
            f"--resume: {path} cannot be checked against what the run in {output_dir!r} wrote: {unusable}; nothing "
            f"was trained. If {path} is the run's config as the run wrote it, record it again (cd {output_dir} && "
            f"sha256sum {CONFIG_NAME} > {os.path.basename(record)}) and resume again; otherwise restore both files, or "
            "train into another output folder.", record)


def _resumed_checkpoint_contents(output_dir: str) -> tuple[str, dict] | None:
    """``(path, contents)`` of the checkpoint a ``--resume`` in ``output_dir`` takes, read without
    loading its tensors: the first of the folder's checkpoints in the order the resume tries them
    (:func:`~gwdet.checkpoint.resume_order.resume_order`: the one ``last_checkpoint`` names, else
    the others newest first) that the resume does not pass over, as the checkpointer passes over one
    that differs from its SHA-256 record or cannot be read (damaged, cut short, not a checkpoint).
    ``None`` when there is no such checkpoint, or the resume refuses the first it would take (one
    that needs unsafe loading, or holds no dict): the resume itself then says why."""
    if not os.path.isdir(output_dir):
        return None
    for name in resume_order(output_dir).names:
        path = os.path.join(output_dir, name)
        reading = _read_for_resume(path)
        if reading.passed_over is None:
            return (path, reading.contents) if isinstance(reading.contents, dict) else None
    return None


class _ResumeReading(NamedTuple):
    """A checkpoint read as ``--resume`` reads it (:func:`_read_for_resume`): its ``contents`` (``None``
    where the resume refuses it or passes it over), and why the resume passes it over (words to put in a
    message; ``None`` where it does not), and whether that is its SHA-256 record's difference."""

    contents: Any
    passed_over: str | None
    differs_from_record: bool = False


def _read_for_resume(path: str) -> _ResumeReading:
    """The checkpoint at ``path`` read without loading its tensors, as the checkpointer's ``--resume``
    reads it: passed over where it differs from its SHA-256 record or cannot be read (damaged, cut
    short, not a checkpoint), with the reason; no contents and no reason where the resume refuses it
    (one that needs unsafe loading, an error the resume names)."""
    try:
        differs = checksum_findings(path)[1]
        if differs is not None:  # the resume takes the previous checkpoint
            return _ResumeReading(None, differs, differs_from_record=True)
        return _ResumeReading(load_torch_file(path, allow_unsafe=False, how_to_opt_in="", mmap=True), None)
    except UnsafeCheckpointError:  # the resume refuses it, naming the opt-in
        return _ResumeReading(None, None)
    except (OSError, EOFError, RuntimeError, pickle.UnpicklingError, DamagedFileError) as error:  # as the resume skips
        reason = str(error).split(". ")[0].splitlines()[0] if str(error).strip() else "no details"
        return _ResumeReading(None, f"reading it fails with {type(error).__name__}: {reason}")
    except Exception:  # torch.load reports bad files with many exception types; the resume names them
        return _ResumeReading(None, None)


def resumed_iteration(output_dir: str) -> tuple[str, int] | None:
    """``(checkpoint, iteration)``: the checkpoint a ``--resume`` in ``output_dir`` takes (the one
    ``last_checkpoint`` names, else the newest readable one there: :func:`_resumed_checkpoint_contents`)
    and the iteration the resume starts from (the one recorded in it, + 1, as detectron2's
    ``DefaultTrainer.resume_or_load`` counts), read without loading its tensors. ``None`` when that
    cannot be told (no checkpoint the resume takes; no iteration recorded): the resume itself then
    decides."""
    found = _resumed_checkpoint_contents(output_dir)
    if found is None:
        return None
    path, data = found
    iteration = _checkpoint_iteration(data)
    return (path, iteration + 1) if iteration is not None else None


def recorded_initial_weights(output_dir: str) -> Mapping[str, Any] | None:
    """The initial weights (``{"path", "sha256"}``) the run in ``output_dir`` started from: as its
    ``results.json`` records them, or before its results as the checkpoint a ``--resume`` takes
    (:func:`_resumed_checkpoint_contents`) carries them
    (:data:`~gwdet.checkpoint.resilient.INITIAL_WEIGHTS_KEY`); ``None`` without a record."""
    try:
        with open(os.path.join(output_dir, RESULTS_JSON), "rb") as file:
            recorded = json.load(file)[ENVIRONMENT_KEY]["initial_weights"]
        if isinstance(recorded, dict):
            return recorded
    except (OSError, ValueError, KeyError, TypeError):  # no results yet, an evaluation's, an older run's
        pass
    found = _resumed_checkpoint_contents(output_dir)
    recorded = found[1].get(INITIAL_WEIGHTS_KEY) if found is not None else None
    return recorded if isinstance(recorded, dict) else None


def check_resume_trains(output_dir: str, max_iter: int, setting: str = "SOLVER.MAX_ITER") -> None:
    """Raise ``ValueError`` when ``--resume`` of the run in ``output_dir`` would train nothing because
    its checkpoint is past ``max_iter`` (the config's ``setting``): the run would only be evaluated
    again, and its ``config.yaml`` and results rewritten with a schedule its weights never had; or
    because the run is finished (resumed at exactly ``max_iter`` with its results written after its
    last checkpoint). A run stopped after its last checkpoint but before its results (a job
    preempted during the final evaluation) is evaluated, as a resume at ``max_iter`` does. A run with
    results whose ``last_checkpoint`` names a checkpoint that is gone is refused too: the resume
    would take an older checkpoint and write the records of the finished run again."""
    _check_tagged_checkpoint_kept(output_dir)
    found = resumed_iteration(output_dir)
    if found is None:
        return
    path, start = found
    if max_iter > start:
        _check_no_final_evaluation_running(output_dir)
    if max_iter == start and _results_written_after(output_dir, path):
        name, final = os.path.basename(path), os.path.join(output_dir, FINAL_WEIGHTS)
        if name != FINAL_WEIGHTS and os.path.isfile(final) and os.path.getmtime(final) > os.path.getmtime(path):
            _check_final_weights_readable(output_dir, name, start, setting)
            raise GwdetValueError(
                f"--resume: the run in {output_dir!r} is finished, and its {LAST_CHECKPOINT} names {name} (iteration "
                f"{start}), an earlier checkpoint than its {FINAL_WEIGHTS}, whose results {RESULTS_JSON} holds; "
                f"resuming would train nothing and write its {CONFIG_NAME}, metrics and results again; nothing was "
                f"changed. To evaluate {name}, give it as the weights of an --eval-only into another folder; to train "
                f"on from it, resume with {setting} above {start}.")
        raise GwdetValueError(
            f"--resume: the run in {output_dir!r} is finished: it trained its {start} iterations "
            f"({name}) and its results are in {RESULTS_JSON}; resuming would train nothing and write "
            f"its {CONFIG_NAME}, metrics and results again; nothing was changed. To evaluate it again, use --eval-only "
            f"--resume; to train it further, resume with {setting} above {start}.")
    if max_iter < start:
        raise GwdetValueError(
            f"--resume: the run in {output_dir!r} has trained {start} iterations ({os.path.basename(path)}), more "
            f"than {setting} {max_iter}: resuming would train nothing and write the run's {CONFIG_NAME} and results "
            f"again with a schedule its weights did not have; nothing was changed. To train it further, resume with "
            f"{setting} above {start}; to evaluate it, use --eval-only --resume.")


def _check_final_weights_readable(output_dir: str, name: str, start: int, setting: str) -> None:
    """Refuse the ``--resume`` of a finished run whose ``model_final.pth`` (its results' weights) the
    resume passes over as damaged (:func:`_read_for_resume`), so that it would take ``name``, an earlier
    checkpoint (resumed at ``start``, the run's ``setting``): naming the damage, the file that
    ``last_checkpoint`` names, and the fixes (restore the file, or train on from ``name``)."""
    final = os.path.join(output_dir, FINAL_WEIGHTS)
    reading = _read_for_resume(final)
    if reading.passed_over is None:
        return
    try:
        tagged = tagged_name(output_dir)
    except (OSError, UnicodeDecodeError):  # no last_checkpoint, or one the resume passed over
        tagged = None
    deliberate = f" (if you replaced it on purpose, delete {shown_record(final)})" if reading.differs_from_record else ""
    which = (f"its {LAST_CHECKPOINT} names {FINAL_WEIGHTS}, which is damaged" if tagged == FINAL_WEIGHTS else
             f"its {FINAL_WEIGHTS} is damaged")
    raise GwdetValueError(
        f"--resume: the run in {output_dir!r} is finished, and {which} ({reading.passed_over}), so the resume would take its newest "
        f"readable checkpoint, {name} (iteration {start}), an earlier checkpoint than the {FINAL_WEIGHTS} whose "
        f"results {RESULTS_JSON} holds; resuming would train nothing and write its {CONFIG_NAME}, metrics and results "
        f"again; nothing was changed. Restore {FINAL_WEIGHTS} from a copy{deliberate}; to train on from {name}, resume "
        f"with {setting} above {start}; to evaluate {name}, give it as the weights of an --eval-only into another "
        "folder.")


def _several_names_problem(output_dir: str, name: str) -> str | None:
    """What is wrong with ``name``, the content of ``output_dir/last_checkpoint``, when it holds more
    than one line (detectron2 writes the one file name of the last checkpoint); None otherwise."""
    lines = [line.strip() for line in name.splitlines() if line.strip()]
    if len(lines) < 2:
        return None
    return (f"{LAST_CHECKPOINT} in {output_dir!r} holds {len(lines)} lines, {name!r}, where it holds the file name of "
            "one checkpoint (detectron2 writes the name of the run's last checkpoint alone, and reads the whole "
            "file as one name), so which checkpoint is the run's last is unknown; nothing was changed. Keep the one "
            f"name of the run's last checkpoint in it (one of {', '.join(lines)}).")


def newest_checkpoint(output_dir: str) -> str | None:
    """The name of the checkpoint of ``output_dir`` written last (:func:`checkpoints_in`, by
    modification time; ``model_final.pth`` of those written at the same time); ``None`` without one."""
    names = checkpoints_in(output_dir)
    if not names:
        return None
    return max(names, key=lambda name: (os.path.getmtime(os.path.join(output_dir, name)), name == FINAL_WEIGHTS))


def damaged_tag_problem(output_dir: str, name: str) -> str:
    """What is wrong with ``output_dir/last_checkpoint`` holding ``name``, which is not the file name
    of a checkpoint (no ``.pth`` name, no file of the folder: the file was overwritten), and the fix:
    writing the name of the folder's newest checkpoint (:func:`newest_checkpoint`) into it."""
    path = os.path.join(output_dir, LAST_CHECKPOINT)
    newest = newest_checkpoint(output_dir)
    fix = (f"Write the name of the run's newest checkpoint into it (the newest there is {newest}: echo {newest} > "
           f"{shlex.quote(path)}), then resume again." if newest is not None else
           "The folder holds no checkpoint to name: restore the run's checkpoints (from a copy), or train afresh with "
           "--overwrite.")
    return (f"{LAST_CHECKPOINT} in {output_dir!r} is damaged: it holds {name!r}, which is not the file name of a "
            f"checkpoint (detectron2 writes there the name of the run's last one, e.g. {FINAL_WEIGHTS}), so which "
            f"checkpoint is the run's last is unknown; nothing was changed. {fix}")


def _check_tagged_checkpoint_kept(output_dir: str) -> None:
    """Refuse a ``--resume`` whose ``last_checkpoint`` holds more than one line, or, in a run with its
    results, holds no checkpoint's name (:func:`damaged_tag_problem`) or names a checkpoint that is
    gone (the resume would take an older one)."""
    try:
        name = tagged_name(output_dir) if os.path.isfile(os.path.join(output_dir, LAST_CHECKPOINT)) else None
    except (OSError, UnicodeDecodeError):  # the resume names it
        return
    several = _several_names_problem(output_dir, name) if name else None
    if several is not None:
        raise GwdetValueError(f"--resume: {several}")
    if (name and not name.endswith(".pth") and not os.path.lexists(os.path.join(output_dir, name))
            and os.path.isfile(os.path.join(output_dir, RESULTS_JSON))):
        raise GwdetValueError(f"--resume: {damaged_tag_problem(output_dir, name)}")
    if (not name or os.sep in name or os.path.lexists(os.path.join(output_dir, name))
            or not os.path.isfile(os.path.join(output_dir, RESULTS_JSON))):
        return
    raise GwdetValueError(
        f"--resume: {LAST_CHECKPOINT} in {output_dir!r} names {name}, the run's last checkpoint, which is not there "
        f"(deleted or moved), and the run has its results ({RESULTS_JSON}): the resume would start from an older "
        f"checkpoint and write the run's {CONFIG_NAME}, metrics and results again, its weights no longer those of the "
        f"results; nothing was changed. Put {name} back to evaluate or train the run further; to train again from "
        f"an older checkpoint, start a new run in another output folder with it as the initial weights.")


def _results_written_after(output_dir: str, checkpoint: str) -> bool:
    """Whether ``output_dir`` holds a ``results.json`` (whole, by its SHA-256 record where there is
    one) written after ``checkpoint``."""
    results = os.path.join(output_dir, RESULTS_JSON)
    return (os.path.isfile(results) and checksum_problem(results) is None
            and os.path.getmtime(results) >= os.path.getmtime(checkpoint))


class SavedRun(NamedTuple):
    """A run's ``config.yaml`` compared with the config that resumes it (:func:`check_resumed_run`)."""

    batches: tuple[Any, Any]  # the batch size of the run and of the config
    seeds: tuple[Any, Any]  # the seed of the run and of the config
    model: list[str]  # "KEY: saved -> current" for each value that builds another model
    others: list[str]  # the same for the other values that differ


class ScheduleAt(NamedTuple):
    """The learning-rate factor at a resumed iteration under the run's schedule and this config's,
    and the schedule values that differ (``"KEY saved -> now"``; the number of iterations first)."""

    saved_max_iter: int
    max_iter: int
    before: float
    after: float
    changes: tuple[str, ...] = ()


def warn_of_a_moved_schedule(output_dir: str, factors: Callable[[str, int], ScheduleAt | None], *,
                             max_iter_setting: str, schedule: str, rate_setting: str, keep: str,
                             alternative: str | None) -> None:
    """Warn when ``--resume`` with other schedule values (another number of iterations,
    ``max_iter_setting``, or another warm-up, steps, ...) changes the learning rate at the resumed
    iteration: detectron2's ``LRMultiplier`` calls the ``schedule`` with the fraction of the
    iterations done, so what is a fraction of them (a cosine, a warm-up, a LazyConfig's milestones)
    moves, and a decayed rate can rise again. ``factors(config.yaml, iteration)`` gives the factors
    under both and the values that differ (``None``: none does); a schedule that cannot be built
    that way is left to the resume's own checks. ``keep`` is the override that keeps the schedule's
    length, with ``{}`` for the run's number of iterations; ``alternative`` a schedule whose steps do
    not move (``None`` where the config has one already)."""
    resumed = resumed_iteration(output_dir)
    path = os.path.join(output_dir, CONFIG_NAME)
    if resumed is None or not os.path.isfile(path):
        return
    try:
        found = factors(path, resumed[1])
    except Exception:  # a schedule that cannot be built or called this way: nothing to compare
        return
    if found is None or math.isclose(found.before, found.after, rel_tol=1e-6):
        return
    longer = found.saved_max_iter != found.max_iter
    changes = found.changes or (f"{max_iter_setting} {found.saved_max_iter} -> {found.max_iter}",)
    only_length = longer and len(changes) == 1
    cause = (f"{schedule} is in fractions of {max_iter_setting}, so " if only_length else "")
    others = [change.split(" ")[0] for change in changes if not change.startswith(max_iter_setting + " ")]
    if not longer:
        advice = f"Resume with the run's {', '.join(others)} (its {CONFIG_NAME}) to keep its schedule."
    elif others and resumed[1] < found.saved_max_iter:
        advice = (f"Resume with {keep.format(found.saved_max_iter)} and the run's {', '.join(others)} (its "
                  f"{CONFIG_NAME}) to keep its schedule.")
    elif others:  # a finished run trained further: its length moves the rate too
        advice = (f"The run had finished its schedule; the run's {', '.join(others)} (its {CONFIG_NAME}) keep those "
                  f"values, and the new {max_iter_setting} still moves what is in fractions of it"
                  + (f": to go on from where it ended, {alternative}." if alternative else "."))
    elif resumed[1] >= found.saved_max_iter:
        advice = (f"The run had finished its schedule; to go on from where it ended, {alternative}." if alternative else
                  "The run had finished its schedule.")
    else:
        advice = f"Resume with {keep.format(found.saved_max_iter)} to keep the schedule" + (
            f", or {alternative}." if alternative else ".")
    logger.warning(f"--resume with {', '.join(changes)}: {cause}at the resumed iteration {resumed[1]} the learning rate "
                   f"becomes {found.after:g} x {rate_setting}, where the run had {found.before:g} x. {advice}")


def check_resumed_run(output_dir: str, compare: Callable[[str], SavedRun], max_iter: int, *,
                      output_setting: str, batch_setting: str, seed_setting: str, max_iter_setting: str,
                      weights_setting: str, weights_named: bool) -> None:
    """Refuse ``--resume`` of the run in ``output_dir`` (its checkpoints there) whose ``config.yaml``
    is missing, or that ``compare`` (reading it: its checksum, its kind) finds trained with another
    batch size, seed, model or data stream (:data:`DATA_STREAM_SETTINGS`), or that would train
    nothing (:func:`check_resume_trains`), or that names other initial weights on the command line
    (``weights_named``), which a resume does not load; other differences (a longer schedule, say) are
    logged. No checkpoint: a fresh start, nothing to check."""
    if not checkpoints_in(output_dir):
        return
    path = os.path.join(output_dir, CONFIG_NAME)
    check_config_present(path, output_dir, output_setting)
    saved = compare(path)
    check_resumed_batch(*saved.batches, output_dir, batch_setting)
    check_resumed_seed(*saved.seeds, output_dir, seed_setting)
    if saved.model:
        raise GwdetValueError(
            f"--resume: the run in {output_dir!r} was trained with another model ({CONFIG_NAME} there): "
            f"{listed(saved.model, 5, '; ')}. Resume with the same config and overrides, or train the new model into "
            f"another {output_setting}.")
    stream = [line for line in saved.others if changes_the_data_stream(line)]
    if stream:
        raise GwdetValueError(
            f"--resume: the run in {output_dir!r} read its training images otherwise than this config would "
            f"({listed(stream, 3, '; ')}): the resumed data stream continues the run's after the images it read, and "
            "another training set, sampler or grouping of images orders them otherwise, so it would skip or repeat "
            "images, or read others. Resume with the run's values, or start a new run in another folder from the "
            "run's last checkpoint as its initial weights.")
    weights = [line for line in saved.others if line.startswith(weights_setting + ":")]
    if weights_named and weights:
        raise GwdetValueError(
            f"--resume continues the run in {output_dir!r} from its last checkpoint, so {weights_setting} given on the "
            f"command line would not be loaded ({weights[0]}, against {path}). Leave out --resume to train from those "
            f"weights into another {output_setting}, or leave out {weights_setting} to continue the run.")
    if saved.others:
        logger.warning(f"--resume with config values that differ from {path}: {'; '.join(saved.others)}")
    check_resume_trains(output_dir, max_iter, max_iter_setting)


# The settings that choose which training images a run reads and in what order (yacs keys; a
# LazyConfig's under dataloader.train): a resumed data stream continues the run's.
DATA_STREAM_SETTINGS = ("DATASETS.TRAIN", "DATALOADER.SAMPLER_TRAIN", "DATALOADER.ASPECT_RATIO_GROUPING",
                        "DATALOADER.FILTER_EMPTY_ANNOTATIONS", "DATALOADER.REPEAT_THRESHOLD", "DATALOADER.REPEAT_SQRT",
                        "DATALOADER.RANDOM_SUBSET_RATIO", "dataloader.train.dataset", "dataloader.train.sampler",
                        "dataloader.train.aspect_ratio_grouping")


def changes_the_data_stream(difference: str) -> bool:
    """Whether the line ``difference`` (``"KEY: saved -> current"``) is of a setting of
    :data:`DATA_STREAM_SETTINGS` (or one under it)."""
    key = difference.split(":", 1)[0]
    return any(key == setting or key.startswith(setting + ".") for setting in DATA_STREAM_SETTINGS)


def check_resume_config(cfg: CfgNode, output_dir: str, weights_named: bool = False) -> None:
    """:func:`check_resumed_run` of a yacs config: every difference under ``MODEL`` (but
    :data:`RESUMABLE_DIFFERENCES`) is another model."""
    def compare(path: str) -> SavedRun:
        saved = saved_run_config(cfg, output_dir, path)
        differences = config_differences(saved, cfg)
        model = _of_the_model(differences)
        return SavedRun((saved.SOLVER.IMS_PER_BATCH, cfg.SOLVER.IMS_PER_BATCH), (saved.SEED, cfg.SEED), model,
                        [d for d in differences if d not in model])

    check_resumed_run(output_dir, compare, cfg.SOLVER.MAX_ITER, output_setting="OUTPUT_DIR",
                      batch_setting="SOLVER.IMS_PER_BATCH", seed_setting="SEED", max_iter_setting="SOLVER.MAX_ITER",
                      weights_setting="MODEL.WEIGHTS", weights_named=weights_named)


def check_config_present(path: str, output_dir: str, output_setting: str = "OUTPUT_DIR") -> None:
    """Refuse ``--resume`` of a run whose checkpoints are there but whose ``config.yaml`` (at
    ``path``) is not: which model the checkpoints hold could not be checked."""
    if not os.path.isfile(path):
        raise GwdetFileNotFoundError(
            f"--resume: the run in {output_dir!r} has checkpoints but no {CONFIG_NAME}, so which model it trained "
            f"cannot be checked against this config. Restore {path} (the run's record of its config), or start from "
            f"its weights in another {output_setting}, or train afresh here with --overwrite (which deletes the run). "
            f"A run trained from one's own code (gwdet's Trainer or LazyTrainer without detectron2's default_setup, "
            f"which writes {CONFIG_NAME}) continues from there: Trainer(cfg) (LazyTrainer(cfg) for a LazyConfig), "
            "resume_or_load(resume=True), then train().")


def check_config_record_kept(output_dir: str, output_setting: str = "OUTPUT_DIR") -> None:
    """Refuse the tools' ``--resume`` of the run in ``output_dir`` (its checkpoints there) whose
    ``config.yaml`` is there without its SHA-256 record (``config.yaml.sha256``, which the tools
    write with it: it was removed): an edited ``config.yaml`` would pass for the config the run
    trained with, and a changed value would go unnamed. The checkpoints do not record the config."""
    path = os.path.join(output_dir, CONFIG_NAME)
    record = checksum_path(path)
    if not checkpoints_in(output_dir) or not os.path.isfile(path) or os.path.lexists(record):
        return
    folder = shlex.quote(output_dir)
    raise GwdetFileNotFoundError(
        f"--resume: the run in {output_dir!r} has its checkpoints and {CONFIG_NAME}, but not {record}, the SHA-256 "
        f"record written with {CONFIG_NAME} when the run started, so whether {CONFIG_NAME} still holds the values the "
        "run trained with cannot be checked (an edited value would be taken for the run's own, and its change not "
        f"named); nothing was changed. Restore {CONFIG_NAME}{CHECKSUM_SUFFIX} (from a copy of the run); if {path} is "
        f"as the run wrote it, record it again (cd {folder} && sha256sum {CONFIG_NAME} > {CONFIG_NAME}{CHECKSUM_SUFFIX}) "
        f"and resume again; or train afresh with --overwrite (which deletes the run) or into another {output_setting}.")


def check_resume_source(output_dir: str, weights_setting: str = "MODEL.WEIGHTS") -> None:
    """Refuse ``--resume`` in ``output_dir`` where ``last_checkpoint`` is there but no checkpoint is
    (:func:`gwdet.checkpoint.resilient.lost_checkpoint_error`): detectron2 would count the run as
    resumed and start at iteration 1 from ``weights_setting``, not at 0 as a fresh start does."""
    if os.path.exists(os.path.join(output_dir, LAST_CHECKPOINT)) and not checkpoints_in(output_dir):
        raise lost_checkpoint_error(output_dir, weights_setting)


def saved_run_config(cfg: CfgNode, output_dir: str, path: str) -> CfgNode:
    """The config of the run in ``output_dir`` from its ``config.yaml`` at ``path`` (checked against
    its recorded checksum, read as plain YAML), as ``cfg``'s keys hold it; the ``--resume``
    refusal of a damaged file or of a LazyConfig's run."""
    check_config_checksum(path, output_dir)
    if is_lazy_config(path):  # a python tag of its own would otherwise be named first
        raise GwdetValueError(
            f"--resume: the run in {output_dir!r} was trained from a LazyConfig ({path} holds its model, train "
            "and dataloader), so this yacs config cannot continue it. Resume it with the LazyConfig it was "
            "trained with, or train into another OUTPUT_DIR.")
    saved = cfg.clone()
    saved.defrost()
    try:
        with open(path, encoding="utf-8") as f:
            content = load_config_yaml(path, f.read())  # plain YAML only: detectron2 would unpickle a python tag
        if not isinstance(content, dict) or not isinstance(content.get("MODEL"), dict):
            raise damaged_config(path, output_dir, "it holds no MODEL section")
        saved.merge_from_other_cfg(type(saved)(content))  # a run's config.yaml: no _BASE_, this detectron2's VERSION
    except GwdetError:  # a python tag, a key given twice, no MODEL section
        raise
    except KeyError as error:  # a key cfg does not have
        if os.path.isfile(checksum_path(path)):  # whole by its record: another version of the code wrote it
            raise GwdetValueError(
                f"--resume: {path} is whole (it matches its recorded SHA-256) but holds a key this gwdet and "
                f"detectron2 do not have ({str(error).strip(chr(39))}): another version of them trained the run in "
                f"{output_dir!r}, so which model it trained cannot be checked; nothing was changed. Resume it with the "
                f"version that trained it, or train afresh into another OUTPUT_DIR.") from None
        raise damaged_config(path, output_dir, error) from None
    except Exception as error:  # yaml's errors, bytes that are not text
        raise damaged_config(path, output_dir, error) from None
    return saved


# The settings of the model's sampling of proposals and ROIs in training (yacs, LazyConfig): how the
# model is trained, not which layers and weights it has.
TRAINING_SAMPLING_SETTINGS = ("BATCH_SIZE_PER_IMAGE", "POSITIVE_FRACTION", "batch_size_per_image", "positive_fraction")


def is_test_setting(difference: str) -> bool:
    """Whether the line ``difference`` (``"KEY: saved -> current"``) is of a setting the model reads at
    test time only (``MODEL.ROI_HEADS.SCORE_THRESH_TEST``; a LazyConfig's ``...test_score_thresh``),
    which leaves the trained model as it is."""
    name = difference.split(":", 1)[0].rsplit(".", 1)[-1]
    return name.endswith("_TEST") or name.startswith("test_")


def leaves_the_model(difference: str) -> bool:
    """Whether the line ``difference`` is of a setting that leaves the model's layers and weights as
    they are: read at test time only (:func:`is_test_setting`), or only in training, by the sampling
    of proposals and ROIs (:data:`TRAINING_SAMPLING_SETTINGS`, ``MODEL.RPN.POST_NMS_TOPK_TRAIN``)."""
    name = difference.split(":", 1)[0].rsplit(".", 1)[-1]
    return is_test_setting(difference) or name.endswith("_TRAIN") or name in TRAINING_SAMPLING_SETTINGS


def _of_the_model(differences: Sequence[str]) -> list[str]:
    """The lines of ``differences`` (:func:`config_differences`) of ``MODEL.*`` keys, but
    :data:`RESUMABLE_DIFFERENCES` and settings that leave the model as it is
    (:func:`leaves_the_model`), and of ``INPUT.FORMAT`` (the model's input channels)."""
    return [d for d in differences if d.startswith(("MODEL.", "INPUT.FORMAT:"))
            and not d.startswith(RESUMABLE_DIFFERENCES) and not leaves_the_model(d)]


def model_differences(saved: CfgNode, cfg: CfgNode) -> list[str]:
    """The differences of :func:`config_differences` that build another model (``MODEL.*`` but
    :data:`RESUMABLE_DIFFERENCES`, and norm hyper-parameters that none of the norms either config
    builds reads: :func:`gwdet.config_checks.norm_keys_read`)."""
    read = norm_keys_read(saved) | norm_keys_read(cfg)
    return [difference for difference in _of_the_model(config_differences(saved, cfg))
            if not difference.startswith(NORM_VALUE_SECTIONS) or difference.split(":", 1)[0] in read]


def check_resumed_batch(saved: Any, current: Any, output_dir: str, setting: str) -> None:
    """Refuse ``--resume`` with another batch size ``current`` than the run's ``saved`` one (its
    ``setting``): the resumed data stream skips the images the run read, counted as iterations
    times the batch, so another batch would skip or repeat images."""
    if saved != current:
        raise GwdetValueError(
            f"--resume: the run in {output_dir!r} trained with {setting} {saved!r}, this config gives {current!r}: the "
            "data stream continues after the images the run read, counted as iterations times the batch, so it "
            f"would skip or repeat images. Resume with {as_override(setting, repr(saved))}, or start a new run in another folder "
            "from the run's last checkpoint as its initial weights.")


def check_resumed_seed(saved: Any, current: Any, output_dir: str, setting: str) -> None:
    """Refuse ``--resume`` with another seed ``current`` than the run's ``saved`` one (its ``setting``)
    where the run's seed was fixed (>= 0): the resumed data stream is the run's order of images with
    the images it read skipped, so another seed's order would skip or repeat images. A run with a
    random seed (negative) had no order to continue: any seed resumes it, with a warning that the
    resumed stream is another order."""
    if isinstance(saved, int) and saved < 0:
        logger.warning(
            f"--resume: the run in {output_dir!r} trained with {setting} {saved!r}, a seed drawn at random, so the "
            "resumed data stream is another order of images with as many skipped as the run read: in the epoch it "
            f"stopped in, some images are seen twice and others not at all. Train with a fixed {setting} (>= 0) for "
            "resumes that continue the same stream.")
    if isinstance(saved, int) and saved >= 0 and current != saved:
        raise GwdetValueError(
            f"--resume: the run in {output_dir!r} trained with {setting} {saved!r}, this config gives {current!r}: the "
            "data stream continues the run's order of images after those it read, and another seed orders them "
            f"otherwise, so it would skip or repeat images. Resume with {as_override(setting, repr(saved))}, or start a "
            "new run in another folder from the run's last checkpoint as its initial weights.")


def tagged_checkpoint(output_dir: str) -> str:
    """The checkpoint ``output_dir/last_checkpoint`` names (a path); an error naming the fix when
    there is none or it is gone: ``--eval-only --resume`` evaluates exactly that file, never an
    older one in its place."""
    tag = os.path.join(output_dir, LAST_CHECKPOINT)
    available = checkpoints_in(output_dir)
    set_aside = None if available else set_aside_problem(output_dir)
    if set_aside:
        raise GwdetFileNotFoundError(f"--eval-only --resume: OUTPUT_DIR {output_dir!r} holds no checkpoint to "
                                     f"evaluate: {set_aside}")
    if not available:
        raise GwdetFileNotFoundError(f"--eval-only --resume: OUTPUT_DIR {output_dir!r} holds no checkpoint to "
                                     "evaluate (with --resume, --eval-only evaluates the run's last checkpoint there). "
                                     "Check OUTPUT_DIR, or leave --resume out to evaluate the weights MODEL.WEIGHTS names "
                                     "(MODEL.WEIGHTS path/to/model_final.pth).")
    choose = f"Name the weights to evaluate, e.g. MODEL.WEIGHTS {os.path.join(output_dir, available[-1])}"
    try:
        name = tagged_name(output_dir)
    except FileNotFoundError:
        raise GwdetFileNotFoundError(f"--eval-only --resume: OUTPUT_DIR {output_dir!r} has no last_checkpoint "
                                     f"file, so which checkpoint is the run's is unknown. {choose}.") from None
    except UnicodeDecodeError:
        raise GwdetValueError(f"--eval-only --resume: {tag} is damaged (not text). {choose}.") from None
    except OSError as error:  # e.g. a folder of that name
        raise GwdetOSError(f"--eval-only --resume: {tag} cannot be read ({error.strerror}). {choose}.") from None
    several = _several_names_problem(output_dir, name)
    if several is not None:
        raise GwdetValueError(f"--eval-only --resume: {several}")
    path = os.path.join(output_dir, name)
    if not name or os.sep in name or not os.path.isfile(path):
        raise GwdetFileNotFoundError(f"--eval-only --resume: {tag} names {name!r}, which is not a file in "
                                     f"{output_dir!r}. {choose}.")
    return path


def evaluation_folder(output_dir: str, weights: str, setting: str = "OUTPUT_DIR") -> str:
    """Where ``--eval-only`` of ``weights`` writes: ``output_dir`` itself when it holds neither a
    run nor an earlier evaluation, else ``output_dir/eval/<checkpoint>`` (``<folder>-<checkpoint>``
    for weights from elsewhere), so that the run's own files stay as its training left them; where
    that folder holds an evaluation already, or one still running (its lock held), ``<checkpoint>-2``,
    ``-3``, ...: no evaluation replaces another or waits for it."""
    if not holds_run(output_dir) and not os.path.exists(os.path.join(output_dir, RESULTS_JSON)):
        return output_dir
    evaluations = os.path.join(output_dir, EVAL_FOLDER)
    if os.path.lexists(evaluations) and not _is_run_folder(output_dir, EVAL_FOLDER):
        raise GwdetFileExistsError(
            f"{setting} {output_dir!r} holds a run and a {'link' if os.path.islink(evaluations) else 'file'} "
            f"{EVAL_FOLDER}, where --eval-only writes its evaluations of the run's weights (in {EVAL_FOLDER}/<checkpoint>/, "
            f"beside the run's own files); nothing was changed. Move or rename {evaluations}, or give the evaluation "
            f"another {setting}.")
    weights = os.path.abspath(local_weights_path(weights))
    stem = os.path.splitext(os.path.basename(weights))[0]
    if os.path.dirname(weights) != os.path.abspath(output_dir):
        stem = f"{os.path.basename(os.path.dirname(weights))}-{stem}"
    folder = candidate = os.path.join(output_dir, EVAL_FOLDER, stem)
    number = 1
    while os.path.exists(os.path.join(candidate, RESULTS_JSON)) or lock_holder(candidate) is not None:
        number += 1
        candidate = f"{folder}-{number}"
    return candidate


def _set_aside_drawings(output_dir: str, start_iter: int) -> list[str]:
    """Move the prediction drawings in ``vis/`` (:func:`gwdet.engine.visualize.is_prediction_drawing`;
    pictures of the user's stay) of a run resumed at ``start_iter`` (of its earlier model) into
    ``vis/before_resuming_at_<start_iter>[_<n>]/``, so that ``vis/`` shows no drawing of another model
    than the run's results; the folder moved into, relative to ``output_dir``, or nothing to move."""
    folder = os.path.join(output_dir, VIS_FOLDER)
    drawings = sorted(name for name in os.listdir(folder)
                      if is_prediction_drawing(os.path.join(folder, name))) if os.path.isdir(folder) else []
    if not drawings:
        return []
    target = free_path(folder, SET_ASIDE_INFIX.lstrip("_") + str(start_iter))
    os.makedirs(target)
    for name in drawings:
        os.replace(os.path.join(folder, name), os.path.join(target, name))
    return [os.path.relpath(target, output_dir) + os.sep]


_FINAL_EVALUATION = re.compile(r"^model_final(-\d+)?$")  # eval/<checkpoint>[-N] of model_final.pth


def _final_evaluations(output_dir: str) -> list[str]:
    """The folders ``eval/model_final[-N]/`` of ``output_dir`` (names, sorted): the evaluations of
    its ``model_final.pth``."""
    folder = os.path.join(output_dir, EVAL_FOLDER)
    return sorted(name for name in os.listdir(folder) if _FINAL_EVALUATION.match(name)
                  and os.path.isdir(os.path.join(folder, name))) if _is_run_folder(output_dir, EVAL_FOLDER) else []


def _check_no_final_evaluation_running(output_dir: str) -> None:
    """Refuse a resume that would train while an ``--eval-only`` of the run's ``model_final.pth``
    runs (its ``eval/model_final[-N]/`` locked): the resumed run replaces the file it scores, and
    its results would name the path of other weights."""
    for name in _final_evaluations(output_dir):
        holder = lock_holder(os.path.join(output_dir, EVAL_FOLDER, name))
        if holder is not None:
            raise GwdetValueError(
                f"--resume: an evaluation of the run's {FINAL_WEIGHTS} is running in "
                f"{os.path.join(output_dir, EVAL_FOLDER, name)} ({holder}), and the resumed run would replace the file "
                "it scores while it reads it; nothing was changed. Resume once that evaluation has ended (or stop it).")


def check_final_weights_not_training(output_dir: str, weights: str, setting: str = "OUTPUT_DIR") -> None:
    """Refuse an ``--eval-only`` of the ``model_final.pth`` of the run in ``output_dir`` while a
    training holds that run (its lock: a ``--resume`` of the finished run): the training writes the
    file again at its end, and the evaluation would score weights that are no longer the file."""
    final = os.path.join(os.path.abspath(output_dir), FINAL_WEIGHTS)
    if os.path.abspath(local_weights_path(weights)) != final:
        return
    holder = lock_holder(output_dir)
    if holder is not None:
        raise GwdetValueError(
            f"--eval-only of {final}: a training holds the run in {setting} {output_dir!r} ({holder}; a --resume of "
            f"the finished run), and writes its {FINAL_WEIGHTS} again at its end, which would leave this evaluation "
            "scoring weights that are no longer the file; nothing was evaluated. Evaluate once that training has "
            "ended, or evaluate a copy of the file given as the weights.")


def _set_aside_final_evaluations(output_dir: str, start_iter: int) -> list[str]:
    """Rename the finished evaluations ``eval/model_final[-N]/`` of a run resumed at ``start_iter``
    to ``eval/model_final_before_resuming_at_<start_iter>[-N]/``: they scored the ``model_final.pth``
    that the resumed run replaces, which their names would otherwise stand for (one still running,
    its lock held, stays); the folders' new names, relative to ``output_dir``."""
    folder = os.path.join(output_dir, EVAL_FOLDER)
    moved = []
    for name in _final_evaluations(output_dir):
        if lock_holder(os.path.join(folder, name)) is not None:
            continue
        target = free_path(folder, name.replace("model_final", f"model_final{SET_ASIDE_INFIX}{start_iter}", 1))
        os.replace(os.path.join(folder, name), target)
        moved.append(os.path.relpath(target, output_dir) + os.sep)
    return moved


def _keep_earlier_config(output_dir: str, start_iter: int) -> None:
    """Keep the run's ``config.yaml`` as it was before this resume at ``start_iter`` (the copy
    :func:`config_rewrite` kept, with its record) as ``config_before_resuming_at_<start_iter>.yaml``
    where the resumed config differs: ``config.yaml`` then holds the config of the iterations from
    ``start_iter`` on, and the earlier one those before."""
    kept = os.path.join(output_dir, CONFIG_KEPT, CONFIG_NAME)
    current = os.path.join(output_dir, CONFIG_NAME)
    if not os.path.isfile(kept) or not os.path.isfile(current) or filecmp.cmp(kept, current, shallow=False):
        return
    stem, extension = os.path.splitext(CONFIG_NAME)
    target = free_path(output_dir, f"{stem}{SET_ASIDE_INFIX}{start_iter}", extension)
    shutil.copyfile(kept, target)
    if os.path.isfile(checksum_path(kept)) and checksum_problem(kept) is None:  # as the run wrote it
        record_checksum(target)
    logger.warning(f"--resume with other config values: {CONFIG_NAME} now holds the config of the iterations from "
                   f"{start_iter} on; that of the iterations before is kept as {os.path.basename(target)}.")


def _rename_aside(output_dir: str, name: str, start_iter: int, what: str) -> str:
    """Rename ``output_dir/name`` to ``<stem>_before_resuming_at_<start_iter><extension>`` (a free
    name: :func:`~gwdet.utils.atomic.free_path`) and return the new path; a file that cannot be renamed stops the
    resume, ``what`` (e.g. "the run's earlier results") naming it."""
    path = os.path.join(output_dir, name)
    stem, extension = os.path.splitext(name)
    target = free_path(output_dir, f"{stem}{SET_ASIDE_INFIX}{start_iter}", extension)
    try:
        os.replace(path, target)
    except OSError as error:  # a file made read-only or immutable (chattr +i), a folder without write access
        raise GwdetOSError(
            f"--resume keeps {what} as {os.path.basename(target)}, but {path} cannot be renamed "
            f"({error.strerror or error}); nothing was trained. Make the run's files and folder writable (an "
            "immutable file: chattr -i), then resume again.") from None
    return target


def set_aside_results(output_dir: str, start_iter: int) -> None:
    """Rename the ``results.md`` and ``results.json`` (with its SHA-256 record) of a run resumed at
    iteration ``start_iter`` to ``results_before_resuming_at_<start_iter>.*``: they score the model
    the run had before, and a stop before the resumed run writes its own (a kill during its final
    evaluation) would otherwise leave them beside the new ``model_final.pth`` as its results. They
    are kept, under names that say so; a free name gets ``_2``, ``_3``, ... . A file that no longer
    matches its SHA-256 record keeps that record (and the warning says so), so the change stays visible.
    The prediction drawings of that model (``vis/*.png``) go into ``vis/before_resuming_at_<start_iter>/``
    (:func:`_set_aside_drawings`), and the evaluations of its ``model_final.pth``, which the resumed run
    replaces, are renamed (:func:`_set_aside_final_evaluations`)."""
    moved = _set_aside_drawings(output_dir, start_iter) + _set_aside_final_evaluations(output_dir, start_iter)
    _keep_earlier_config(output_dir, start_iter)
    for name in (RESULTS_MARKDOWN, RESULTS_JSON):
        path = os.path.join(output_dir, name)
        if not os.path.isfile(path) or os.path.islink(path):
            continue
        has_record = os.path.isfile(checksum_path(path))
        recorded = has_record and checksum_problem(path) is None
        target = _rename_aside(output_dir, name, start_iter, "the run's earlier results")
        if has_record and not recorded:  # changed since it was written: its record goes with it, showing so
            move_checksum_record(path, target)
            logger.warning(f"{path} no longer matches the SHA-256 recorded when the run wrote it (it was changed since); "
                           f"it is kept as {os.path.basename(target)} with that record, which a reader of it checks.")
        remove_checksum(path)
        if recorded:
            record_checksum(target)
        moved.append(os.path.basename(target))
    if moved:
        logger.warning(f"{output_dir}: the results the run wrote before this resume at iteration {start_iter} (of "
                       f"the model it had when it wrote them, which may be past that iteration) are kept as "
                       f"{' and '.join(moved)}; the train tool writes the run's {RESULTS_MARKDOWN} and {RESULTS_JSON} anew "
                       "when it ends (a trainer of one's own code writes none: tools/train_net.py --eval-only --resume "
                       "evaluates its last checkpoint).")


def _recorded_iteration(path: str) -> int | None:
    """The iteration the checkpoint ``path`` records (its tensors mapped, not read); ``None`` when it
    cannot be read or records none."""
    try:
        data = load_torch_file(path, allow_unsafe=False, how_to_opt_in="", mmap=True)
    except Exception:  # torch.load reports bad files with many exception types
        return None
    return _checkpoint_iteration(data) if isinstance(data, dict) else None


def _checkpoint_iteration(data: dict) -> int | None:
    """The iteration a checkpoint's contents ``data`` record (detectron2's ``iteration``, or its
    trainer state's), or ``None`` for none that is an integer."""
    trainer = data.get("trainer")  # the trainer's state holds the iteration too
    iteration = data.get("iteration", trainer.get("iteration") if isinstance(trainer, dict) else None)
    return iteration if type(iteration) is int else None


def later_checkpoints(output_dir: str, start_iter: int) -> list[str]:
    """The checkpoints of ``output_dir`` (:data:`CHECKPOINT_NAME`; names, sorted) that a run resumed at
    iteration ``start_iter`` would write over: the numbered ones of iteration ``start_iter`` or later,
    and ``model_final.pth`` where it records such an iteration or none that can be read (the resumed
    checkpoint, of iteration ``start_iter - 1``, is never one)."""
    later = []
    for name in checkpoint_names(output_dir):
        path = os.path.join(output_dir, name)
        if os.path.islink(path) or not os.path.isfile(path):
            continue
        iteration = numbered_iteration(name)
        if iteration is None:  # model_final.pth: its iteration as recorded inside it
            iteration = _recorded_iteration(path)
        if iteration is None or iteration >= start_iter:
            later.append(name)
    return later


def set_aside_later_checkpoints(output_dir: str, start_iter: int) -> None:
    """Rename the checkpoints a run resumed at iteration ``start_iter`` would write over
    (:func:`later_checkpoints`: those of the iterations it trains again, and a ``model_final.pth``
    it did not resume from) to ``model_<iteration|final>_before_resuming_at_<start_iter>.pth`` (a free
    name gets ``_2``, ``_3``, ...), with their SHA-256 records (:func:`move_checksum_record`: the
    renamed file still checks), and warn, naming them. The names are no checkpoint names
    (:data:`CHECKPOINT_NAME`), so no resume continues from them, and they are the run's files
    (:data:`EARLIER_CHECKPOINT`): ``--overwrite`` removes them."""
    moved = []
    for name in later_checkpoints(output_dir, start_iter):
        path = os.path.join(output_dir, name)
        target = _rename_aside(output_dir, name, start_iter, f"the run's checkpoint {name} (of an iteration past "
                               f"{start_iter - 1}, which the resumed run writes again)")
        if os.path.isfile(checksum_path(path)):
            move_checksum_record(path, target)
        moved.append(f"{name} as {os.path.basename(target)}")
    if moved:
        logger.warning(f"{output_dir}: this resume starts at iteration {start_iter}, and the run's checkpoints of "
                       f"later iterations, which it would write over, are kept under names no resume continues from: "
                       f"{', '.join(moved)}.")


def keep_replaced_final(output_dir: str, start_iter: int) -> None:
    """Keep a copy of the run's ``model_final.pth`` that a run resumed at iteration ``start_iter``
    writes over when it ends (a finished run continued to a larger ``SOLVER.MAX_ITER``: it resumes
    from that file, and the results and evaluations it had are kept as of "before resuming") as
    ``model_final_before_resuming_at_<start_iter>.pth`` (a free name gets ``_2``, ...), with its
    SHA-256 record where the file matches its own, and warn, naming it; nothing where a kept copy of
    the same bytes is there already (the run was resumed before). A copy, not a rename: the file
    stays the run's checkpoint until the resumed run writes its next one. A final of a later
    iteration is renamed aside by :func:`set_aside_later_checkpoints` before."""
    path = os.path.join(output_dir, FINAL_WEIGHTS)
    if os.path.islink(path) or not os.path.isfile(path):
        return
    stem, extension = os.path.splitext(FINAL_WEIGHTS)
    kept = [name for name in sorted(os.listdir(output_dir)) if EARLIER_CHECKPOINT.match(name)
            and name.startswith(stem) and not name.endswith(CHECKSUM_SUFFIX)]
    if any(filecmp.cmp(path, os.path.join(output_dir, name), shallow=False) for name in kept):
        return
    target = free_path(output_dir, f"{stem}{SET_ASIDE_INFIX}{start_iter}", extension)
    try:
        with path_written_atomically(target) as temporary:
            shutil.copyfile(path, temporary)
    except OSError as error:
        raise GwdetOSError(
            f"--resume keeps the run's {FINAL_WEIGHTS}, which the resumed run writes over when it ends, as "
            f"{os.path.basename(target)}, but it cannot be copied ({error.strerror or error}); nothing was trained. "
            "Free space or make the run's folder writable, then resume again.") from None
    if os.path.isfile(checksum_path(path)) and checksum_problem(path) is None:
        record_checksum(target)
    logger.warning(f"{output_dir}: the run's {FINAL_WEIGHTS}, which this run resumed at iteration {start_iter} writes "
                   f"over when it ends, is kept as {os.path.basename(target)} (the weights of the results and "
                   "evaluations kept as of before this resume).")


def trim_metrics(output_dir: str, start_iter: int) -> None:
    """Make ``output_dir/metrics.json`` (detectron2's JSON lines, appended to on resume) hold what an
    uninterrupted run would have at ``start_iter``: damaged lines (a line a kill cut short, which
    would otherwise stay in the middle of the file, bytes that are not UTF-8, anything but a JSON
    object with an integer ``iteration``, which every record of detectron2's ``JSONWriter`` has) and
    records of iterations the resumed run repeats are removed, with a warning naming how many and
    the damaged lines' numbers. (detectron2 appends the lines one by one, so no checksum of the
    whole file can be recorded: a changed value that leaves a valid record is not detected.)"""
    path = os.path.join(output_dir, METRICS_JSON)
    if not os.path.isfile(path):
        return
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    kept, broken, repeated = [], [], 0
    for number, line in enumerate(lines, start=1):
        record = metrics_record(line)
        if record is None:
            if line.strip():
                broken.append(number)
            continue
        if record["iteration"] >= start_iter:
            repeated += 1
            continue
        kept.append(line.decode("utf-8"))
    if broken or repeated:
        write_text_atomically(path, "".join(f"{line}\n" for line in kept))
        numbers = listed(map(str, broken), 10)
        logger.warning(f"{path}: removed {len(broken)} damaged line(s){f' (line {numbers})' if broken else ''} and "
                       f"{repeated} record(s) of iterations from {start_iter} on, which this resumed run writes again.")


def metrics_record(line: bytes) -> dict | None:
    """One line of ``metrics.json`` as detectron2's ``JSONWriter`` writes it (a JSON object with an
    integer ``iteration``), or ``None`` for a damaged line: cut short, not UTF-8, anything else."""
    try:
        record = json.loads(line.decode("utf-8"))
    except ValueError:  # JSONDecodeError, UnicodeDecodeError
        return None
    if not isinstance(record, dict) or type(record.get("iteration")) is not int:
        return None
    return record


class OutputDirNotWritableError(GwdetError, PermissionError):
    """OUTPUT_DIR cannot be created or written (read-only disk, permissions, a file in its place)."""


class OutputDirNameError(GwdetError, ValueError):
    """OUTPUT_DIR's name cannot reach every writer of a run unchanged under this locale."""


def check_output_dir_name(output_dir: str, encoding: str | None = None, setting: str = "OUTPUT_DIR") -> None:
    """Refuse an empty OUTPUT_DIR, one holding an environment variable nobody expanded
    (``'$SCRATCH/run'``) or a control character (a newline: ``last_checkpoint`` and the other
    records name files line by line), and one whose name the writers of a run would not all find: TensorBoard's event
    writer encodes folder names as UTF-8 itself, so a name with characters beyond ASCII must be
    UTF-8 in Python's file system encoding (``encoding``, by default ``sys.getfilesystemencoding()``).
    That holds in Python's UTF-8 mode, which Python 3.7+ turns on in the C and POSIX locales
    (``LC_ALL=C``); it fails where the locale is ASCII with that mode off (``PYTHONUTF8=0``), where
    such a name reaches Python as undecodable bytes that TensorBoard's writer cannot encode
    (``surrogates not allowed``), and in a Latin-1 locale, where the writer's folder is another one."""
    if not output_dir.strip():
        raise OutputDirNameError(
            f"{setting} is empty ({output_dir!r}): give the folder the run writes into, e.g. "
            f"{as_override(setting, 'output/run')} (it is created if it does not exist); nothing was written.")
    unexpanded = (unexpanded_variable_problem(setting, output_dir) or link_dotdot_problem(setting, output_dir)
                  or edge_whitespace_problem(setting, output_dir))
    if unexpanded is not None:
        raise OutputDirNameError(unexpanded)
    control = next((char for char in output_dir if unicodedata.category(char) == "Cc"), None)
    if control is not None:
        plain = "".join(char for char in output_dir if unicodedata.category(char) != "Cc").strip() or "output/run"
        raise OutputDirNameError(
            f"{setting} {output_dir!r} holds a control character ({control!r}, e.g. a newline pasted into the name): "
            f"the run's records name its files line by line ({LAST_CHECKPOINT} names its last checkpoint), so a "
            "--resume or an evaluation of the run would not find its checkpoints; nothing was written. Give a folder "
            f"name without it, e.g. {as_override(setting, plain)}.")
    encoding = codecs.lookup(encoding or sys.getfilesystemencoding()).name
    try:
        output_dir.encode("utf-8")
        representable = output_dir.isascii() or encoding == "utf-8"
    except UnicodeEncodeError:  # bytes the file system encoding could not decode (surrogate escapes)
        representable = False
    if not representable:
        raise OutputDirNameError(
            f"{setting} {output_dir!r} has characters beyond ASCII, which this Python cannot pass on unchanged "
            f"(its file system encoding is {encoding!r}, not UTF-8): TensorBoard's writer would fail or write "
            "elsewhere. Run Python in UTF-8 mode (export PYTHONUTF8=1, or a UTF-8 locale such as LC_ALL=C.UTF-8), "
            f"or choose an {setting} of ASCII characters; nothing was written.")


def _in_use(output_dir: str, holder: str, setting: str) -> GwdetRuntimeError:
    """The refusal of a run in ``output_dir`` while ``holder`` (``"pid N"``) holds its lock; when no
    process N runs here, the processes it started (data loader workers of a killed run, which hold
    the lock until they end) are named as the likely holders."""
    pid = holder[4:] if holder.startswith("pid ") else ""
    if pid.isdigit() and process_is_gone(int(pid)):
        return GwdetRuntimeError(
            f"{setting} {output_dir!r} is in use by another run ({holder}, which no longer runs on this machine: "
            "processes it started, such as the data loader workers of a run that was killed, hold the lock until "
            "they end, within seconds; or it runs on another machine that shares this folder). Run the command "
            f"again in a moment, or give this run another {setting}.")
    return GwdetRuntimeError(f"{setting} {output_dir!r} is in use by another run ({holder}). Wait for it to finish, or "
                             f"give this run another {setting}.")


def folder_locked(output_dir: str) -> bool:
    """Whether a process holds a lock on the folder itself: a run's :class:`OutputDirLock` (which stays
    when its lock file is deleted, as a clean-up of "stale" locks does), or an export's."""
    try:
        descriptor = os.open(output_dir, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(descriptor)  # closing releases a shared lock taken here
    return False


def lock_holder(output_dir: str) -> str | None:
    """The process holding the lock of ``output_dir`` (:class:`OutputDirLock`; ``"pid N"``, with a
    note for a trainer started from one's own code, or ``"another process"``), or None when no run
    holds it."""
    path = os.path.join(output_dir, LOCK_NAME)
    if not os.path.isfile(path) or os.path.islink(path):
        return "another process (its lock file was deleted)" if os.path.isdir(output_dir) and \
            folder_locked(output_dir) else None
    with open(path, encoding="utf-8", errors="replace") as file:
        try:
            fcntl.flock(file, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return file.read().strip() or "another process"
        fcntl.flock(file, fcntl.LOCK_UN)
    return None


def check_not_in_use(output_dir: str, setting: str = "OUTPUT_DIR") -> None:
    """Refuse, before a job that starts at once is submitted, a run in ``output_dir`` while another
    run holds its lock (:class:`OutputDirLock`), as the job would be at its start."""
    holder = lock_holder(output_dir)
    if holder is not None:
        raise _in_use(output_dir, holder, setting)


def _missing_folders(path: str) -> list[str]:
    """The folders of ``path`` and of each path it is written below (``a/b/../c``: ``a/b/../c``,
    ``a/b/..``, ``a/b``, ``a``) that do not exist yet, deepest first: what ``os.makedirs(path)`` may make."""
    missing, part = [], path
    while part and not os.path.lexists(part):
        missing.append(part)
        parent = os.path.dirname(part)
        if parent == part:
            break
        part = parent
    return missing


def _remove_empty(folders: Sequence[str]) -> None:
    """Remove each of ``folders`` (deepest first) that is now an empty folder; keep anything else."""
    for folder in folders:
        try:
            os.rmdir(folder)
        except OSError:  # not there, not empty, not a folder: left as it is
            pass


class OutputDirLock:
    """An exclusive lock on ``OUTPUT_DIR`` for the duration of a run (``with OutputDirLock(dir):``).

    A second run on the same folder fails at once, naming the process that holds it (``note`` beside
    its pid: a trainer started from one's own code says so). The lock is released when the process
    ends, however it ends. The folder itself is locked too, so a run is refused while another holds
    it even when the lock file was deleted (a clean-up of "stale" locks).
    """

    def __init__(self, output_dir: str, setting: str = "OUTPUT_DIR", weights_setting: str = "MODEL.WEIGHTS",
                 note: str = "") -> None:
        self.path = os.path.join(output_dir, LOCK_NAME)
        self.setting, self.weights_setting = setting, weights_setting  # how the messages name them
        self.note = note
        self._file: IO[str] | None = None
        self._folder: int | None = None  # the descriptor of the folder, locked

    def __enter__(self) -> "OutputDirLock":
        output_dir = os.path.dirname(self.path)
        check_output_dir_name(output_dir, setting=self.setting)
        if os.path.exists(output_dir) and not os.path.isdir(output_dir):
            raise OutputDirNotWritableError(f"{output_path_problem(self.setting, output_dir, folder=True)} Nothing "
                                            "was changed.")
        if os.path.islink(output_dir) and not os.path.exists(output_dir):
            raise OutputDirNotWritableError(
                f"{self.setting} {output_dir!r} is a link to {os.readlink(output_dir)}, which does not exist: create "
                f"that folder (or fix the link), or give the run another {self.setting}; nothing was changed.")
        if os.path.islink(self.path) or os.path.isdir(self.path):
            what = f"a link {LOCK_NAME} (to {os.readlink(self.path)})" if os.path.islink(self.path) else \
                f"a folder {LOCK_NAME}"
            raise OutputDirNotWritableError(
                f"{self.setting} {output_dir!r} holds {what}, where a run keeps its lock file, which it writes: "
                "nothing was changed. Remove it (a copy of a run made with cp -s links every file: copy it with "
                f"cp -a), or give the run another {self.setting}.")
        missing = _missing_folders(output_dir)
        try:
            os.makedirs(output_dir, exist_ok=True)
            self._file = open(self.path, "a+")
        except OSError as error:
            _remove_empty(missing)  # "nothing was changed": the folders made on the way go again
            raise OutputDirNotWritableError(
                f"{self.setting} {output_dir!r} cannot be written ({error.strerror or error}); nothing was "
                f"changed. Give the run a writable {self.setting}; to evaluate or export a run kept on a read-only "
                f"disk, name its weights and write elsewhere: {as_override(self.weights_setting, '<run>/model_final.pth')} "
                f"{as_override(self.setting, '<writable folder>')}.") from None
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.seek(0)
            holder = self._file.read().strip() or "another process"
            self._file.close()
            raise _in_use(output_dir, holder, self.setting) from None
        try:
            self._folder = os.open(output_dir, os.O_RDONLY)
            fcntl.flock(self._folder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # a run whose lock file was deleted holds the folder
            self.__exit__(None, None, None)
            raise _in_use(output_dir, "another process (its lock file was deleted)", self.setting) from None
        except OSError:  # a folder that cannot be opened for reading: its lock file alone guards it
            if self._folder is not None:
                os.close(self._folder)
            self._folder = None
        try:
            self._file.seek(0)
            self._file.truncate()
            self._file.write(f"pid {os.getpid()}{' ' + self.note if self.note else ''}\n")
            self._file.flush()
        except OSError as error:  # a full disk
            with contextlib.suppress(OSError):  # closing flushes the unwritten line again
                self._file.close()
            self._file = None
            self.__exit__(None, None, None)  # the folder's lock
            raise OutputDirNotWritableError(
                f"{self.setting} {output_dir!r}: writing the run's lock file {LOCK_NAME} failed "
                f"({error.strerror or error}); nothing was changed. Free space there (or fix what the error names) "
                f"and run again, or give the run another {self.setting}.") from None
        foreign = _foreign_in_kept_config(os.path.dirname(self.path))
        if foreign:
            self.__exit__(None, None, None)
            raise GwdetFileExistsError(
                f"{self.setting} {output_dir!r} holds {listed(foreign, 5)}, in a folder of the name gwdet keeps a run's "
                f"{CONFIG_NAME} and its record in while detectron2 rewrites them ({CONFIG_KEPT}, {CONFIG_KEEPING}), "
                "and a run would put those back and remove the folder; nothing was changed. Move that folder out of "
                f"{self.setting} (or rename it), or give the run another {self.setting}.")
        if restore_config(os.path.dirname(self.path)):
            logger.warning(f"{os.path.dirname(self.path)}: put {CONFIG_NAME} and {CONFIG_NAME}{CHECKSUM_SUFFIX} back "
                           "as they were before a run that stopped while writing them.")
        put_back = put_back_set_aside(os.path.dirname(self.path))
        if put_back:
            logger.warning(f"{os.path.dirname(self.path)}: put back the earlier run's files, which a run with "
                           f"--overwrite had set aside when it was stopped before training: {', '.join(put_back)}")
        remove_stale_partials(os.path.dirname(self.path), "save")
        return self

    def __exit__(self, *exc_info) -> None:
        if self._folder is not None:
            fcntl.flock(self._folder, fcntl.LOCK_UN)
            os.close(self._folder)
            self._folder = None
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None


def check_run_detections_kept(folder: str, output_dir: str, fix: str) -> None:
    """Refuse an evaluation from one's own code (``Trainer.test``, ``gwdet.engine.lazy.evaluate``)
    that would write its detections into ``folder`` where they are the finished run's in
    ``output_dir`` (its ``inference/``, which its ``results.json`` describes); ``fix`` says where to
    write instead. A training's own evaluations write before the run's results exist, and the tools
    evaluate into folders of their own. A run without ``results.json`` (trained from one's own code)
    is finished where its detections are as new as its ``model_final.pth`` (its final evaluation).
    The run's own evaluation (this process holds the folder's lock: a tool's run, a trainer's
    ``train()``) replaces them: a run stopped after its final detections but before its results is
    evaluated again when it resumes."""
    inference = os.path.realpath(os.path.join(output_dir, INFERENCE_FOLDER))
    if os.path.commonpath([os.path.realpath(folder), inference]) != inference:
        return  # a folder of the evaluation's own (a study's batch_statistics/, a tool's eval/): not the run's
    if (lock_holder(output_dir) or "").split()[:2] == ["pid", str(os.getpid())]:
        return
    held = [name for name in EVALUATOR_FILES if os.path.isfile(os.path.join(folder, name))]
    final = os.path.join(output_dir, FINAL_WEIGHTS)
    # a run trained from one's own code writes no results.json: its final evaluation comes after model_final.pth
    finals = os.path.isfile(final) and any(os.path.getmtime(os.path.join(folder, name)) >= os.path.getmtime(final)
                                           for name in held)
    if held and (os.path.isfile(os.path.join(output_dir, RESULTS_JSON)) or finals):
        described = f"which its {RESULTS_JSON} describes" if not finals else f"its evaluation of {FINAL_WEIGHTS}"
        raise GwdetFileExistsError(
            f"The evaluation writes into {folder}, which holds the detections of the finished run in {output_dir} "
            f"({', '.join(held)}, {described}): this evaluation would replace them; nothing was "
            f"evaluated. {fix}")
