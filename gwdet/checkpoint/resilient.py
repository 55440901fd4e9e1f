"""Checkpoints that survive a killed run and load without executing code.

:class:`ResilientCheckpointer` is detectron2's ``DetectionCheckpointer`` whose saves are atomic
(:mod:`gwdet.utils.atomic`) and carry checksums inside the file (:mod:`gwdet.checkpoint.integrity`)
and its SHA-256 beside it (``model_final.pth.sha256``), the norm layers' types and settings, and the
random generators' states, so that a resumed run draws the numbers an uninterrupted one would.
Files are read without executing code (:mod:`gwdet.checkpoint.safe_load`;
``GWDET_ALLOW_UNSAFE_PICKLE=1`` allows more); a damaged or unreadable checkpoint is refused by name,
or with ``--resume`` skipped for the previous one; weights that misfit the model or were trained with
other norm layers are refused before any weight is copied (:mod:`gwdet.checkpoint.compatibility`;
``GWDET_ALLOW_NORM_MISMATCH=1`` allows them).
"""
from __future__ import annotations

import contextlib
import difflib
import io
import logging
import os
import pickle
import random
import re
from itertools import zip_longest
from typing import Any, Callable, Mapping, Sequence
from urllib.parse import parse_qs, urlsplit

import numpy as np
import torch
from detectron2.checkpoint import DetectionCheckpointer
from detectron2.modeling.anchor_generator import DefaultAnchorGenerator
from detectron2.modeling.backbone.fpn import FPN
from detectron2.modeling.box_regression import Box2BoxTransform
from detectron2.modeling.backbone.resnet import BottleneckBlock
from detectron2.modeling.poolers import ROIPooler
from detectron2.utils import comm

from gwdet.config import SHAPES_PREFIX
from gwdet.utils.fingerprints import split_fingerprints
from gwdet.utils.cli_errors import (as_override, file_url_path, link_dotdot_problem, unexpanded_variable_note,
                                    unexpanded_variable_problem)
from gwdet.utils.run_file_names import LAST_CHECKPOINT
from gwdet.utils.atomic import (cached_sha256, checksum_findings, checksum_path, file_version, free_path,
                                move_checksum_record, same_file_version, shown_record, write_atomically,
                                write_with_checksum)
from gwdet.checkpoint.compatibility import (
    NORM_SETTINGS_KEY,
    NORM_TYPES_KEY,
    NormMismatchError,
    UnrecordableSettingError,
    uncompared_norm_settings,
    check_layer_settings,
    check_norm_settings,
    check_norm_types,
    check_statistics_have_a_layer,
    check_statistics_in_weights,
    check_unrecorded_weights,
    check_weights_fit_model,
    drop_layer_settings,
    norm_settings,
    norm_types,
    unrecorded_group_norms,
    unwrapped,
)
from gwdet.checkpoint.integrity import (
    CHECKSUMS_KEY,
    STATE_CHECKSUMS_KEY,
    DamagedFileError,
    verify_checksums,
    with_checksums,
)
from gwdet.checkpoint.optimizer_state import optimizer_state_problem
from gwdet.checkpoint.converted_weights import check_conversion_metadata, read_conversion_metadata
from gwdet.checkpoint.resume_order import CHECKPOINT_NAME, checkpoint_names, resume_order
from gwdet.checkpoint.run_identity import RUN_ID_KEY, check_same_run, new_run_id, record_run_id, recorded_run_id
from gwdet.layers.settings_state import EXTRA_STATE_KEY
from gwdet.norms import SYNCHRONIZED_NORMS, TORCH_BATCH_NORMS, layer_types
from gwdet.checkpoint.safe_load import (UnsafeCheckpointError, cut_within_magic, load_pickle_file, load_torch_file,
                                        numpy_number_globals, valueless_tensors_problem)
from gwdet.layers.common import check_flag
from gwdet.errors import (GwdetError, GwdetFileExistsError, GwdetFileNotFoundError, GwdetIsADirectoryError, GwdetRuntimeError, GwdetTypeError,
                          GwdetValueError, did_you_mean, listed)

logger = logging.getLogger(__name__)  # gwdet's own messages: a run lists its warnings (gwdet.engine.run_log)


def _check_iteration_of_its_name(path: str, iteration: int, save_dir: str) -> None:
    """Refuse to resume from a checkpoint whose name gives another iteration (``model_0000022.pth``)
    than it records: another run's checkpoint copied or renamed there, from which the run would go
    on with other weights and cut its metrics at the wrong iteration."""
    named = CHECKPOINT_NAME.match(os.path.basename(path))
    if named is None or named.group(1) == "final" or int(named.group(1)) == iteration:
        return
    raise GwdetValueError(
        f"--resume: {path} records iteration {iteration}, not {int(named.group(1))} as its name says: it is another "
        "run's checkpoint copied or renamed there (the run saves model_<iteration>.pth), so continuing would train "
        f"from other weights and rewrite this run's metrics from iteration {iteration + 1} on; nothing was changed. "
        "Put the run's own checkpoint back under that name, or write the name of a checkpoint of this run into "
        f"{os.path.join(save_dir, LAST_CHECKPOINT)}.")


def _check_checkpoint_name(name: Any, save_dir: str | None) -> None:
    """Refuse a name :meth:`ResilientCheckpointer.save` would not write as a file of its own in
    ``save_dir``: not a str, empty or blank, or holding a path separator (``../NAME``, an absolute
    path: a file outside ``save_dir`` or in a folder of it); nothing is written."""
    example = "e.g. save('model_final') or save('model_0000999')"
    if not isinstance(name, str):
        raise GwdetTypeError(f"Checkpoint name {name!r} ({type(name).__name__}) cannot be saved: save() takes the "
                             f"file's name as a str, to which it adds .pth; nothing was written. Give it as a str, "
                             f"{example}.")
    if not name.strip():
        raise GwdetValueError(f"Checkpoint name {name!r} is empty or blank (an unset variable?): save() would write a "
                              f"file named {name + '.pth'!r}; nothing was written. Give the checkpoint's name, "
                              f"{example}.")
    separators = {"/", os.sep, *([os.altsep] if os.altsep else [])}
    if any(separator in name for separator in separators):
        target = os.path.normpath(os.path.join(save_dir or ".", f"{name}.pth"))
        plain = os.path.basename(name.rstrip("/" + os.sep)) or "model_final"
        raise GwdetValueError(f"Checkpoint name {name!r} holds a path separator: save() writes NAME.pth in its "
                              f"save_dir ({save_dir!r}), and this name would write {target}, elsewhere; nothing was "
                              f"written. Give a plain file name (save({plain!r})), or a checkpointer whose save_dir is "
                              "the folder meant.")


# the types whose values weights-only unpickling always reads back (_plainly_loadable)
_PLAIN_TYPES = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device)


def _plainly_loadable(value: Any) -> bool:
    """Whether ``value`` is plain data that weights-only unpickling reads back whatever it holds:
    values of :data:`_PLAIN_TYPES`, dense tensors without attributes of their own, and lists,
    tuples and dicts (of str or int keys) of those, each of exactly these types (no subclass)."""
    kind = type(value)
    if kind in _PLAIN_TYPES:
        return True
    if kind is torch.Tensor:
        return value.layout == torch.strided and not value.is_quantized and not vars(value)
    if kind in (list, tuple):
        return all(_plainly_loadable(item) for item in value)
    if kind is dict:
        return all(type(key) in (str, int) and _plainly_loadable(item) for key, item in value.items())
    return False


def _unloadable_value_problem(value: Any) -> str | None:
    """Why gwdet's loader (``torch.load(weights_only=True)`` with numpy's numbers allowed,
    :mod:`gwdet.checkpoint.safe_load`) would refuse a checkpoint holding ``value``, or cannot
    have it written at all; ``None`` when it reads it back: plain values (numbers, str, bytes,
    None, lists, tuples, sets, dicts of them), tensors, torch dtypes and devices, numpy numbers.
    Plain data (:func:`_plainly_loadable`) is taken as it is; anything else is written to memory
    and read back as the loader reads it."""
    if _plainly_loadable(value):
        return None
    buffer = io.BytesIO()
    try:
        torch.save(value, buffer)
    except Exception as error:  # pickle refuses it: a lambda, a local class, an open file, a lock
        reason = str(error).splitlines()[0] if str(error).strip() else "no details"
        return f"cannot be pickled ({type(error).__name__}: {reason})"
    buffer.seek(0)
    try:
        with torch.serialization.safe_globals(numpy_number_globals()), contextlib.suppress(Warning):
            torch.load(buffer, map_location="cpu", weights_only=True)
    except Exception:  # what weights-only unpickling refuses: named by the globals the pickle needs
        buffer.seek(0)
        allowed = {f"{kind.__module__}.{kind.__qualname__}" for kind in numpy_number_globals()}
        try:
            needed = [name for name in torch.serialization.get_unsafe_globals_in_checkpoint(buffer)
                      if name not in allowed]
        except Exception:  # the globals cannot be listed: the value's type names it
            needed = []
        return (f"needs {', '.join(sorted(needed)) or 'more than weights-only loading'} to be read back, so gwdet's "
                "loader would refuse the file as unsafe (unpickling it can execute code)")
    return None


def _extra_fix(key: str, value: Any, problem: str) -> str:
    """How to save the extra ``key`` so that gwdet's loader reads it back."""
    if isinstance(value, os.PathLike) or "pathlib." in problem:
        return f"Save a path as a str: {key}=str(path)."
    if isinstance(value, np.ndarray) or "numpy." in problem:
        return f"Save a numpy array as a tensor: {key}=torch.from_numpy(array) (or array.tolist())."
    return ("Save plain values (numbers, str, None, lists, tuples and dicts of them) or tensors, e.g. the object's "
            f"state_dict() or a str describing it, as {key}=....")


def _check_extras(name: str, extra: Mapping[str, Any], written: Sequence[str]) -> None:
    """Refuse, before anything is written, extras of :meth:`ResilientCheckpointer.save` that would
    replace what the checkpointer writes itself (``written``: the model's weights, the
    checkpointables' states, gwdet's records), an ``iteration`` that is no whole number >= 0
    (what ``--resume`` continues after), and values gwdet's own loader would refuse."""
    replaced = [key for key in extra if key in written]
    if replaced:
        raise GwdetValueError(
            f"Checkpoint {name!r} cannot be saved with the extra {listed(map(repr, replaced), 3)}: the checkpointer "
            f"writes {'that key' if len(replaced) == 1 else 'those keys'} itself (the model's weights, the "
            "checkpointables' states and gwdet's records), which the extra would replace; nothing was written. Give "
            f"the extra another name (the keys the checkpointer writes: {listed(map(repr, written), 12)}).")
    if "iteration" in extra:
        iteration = extra["iteration"]
        if isinstance(iteration, (bool, np.bool_)) or not isinstance(iteration, (int, np.integer)) or iteration < 0:
            raise GwdetValueError(
                f"Checkpoint {name!r} cannot be saved with iteration={iteration!r} ({type(iteration).__name__}): the "
                "iteration is the last one trained, a whole number >= 0, after which --resume continues; nothing was "
                f"written. Give it as an int, e.g. save({name!r}, iteration=999).")
    for key, value in extra.items():
        problem = _unloadable_value_problem(value)
        if problem is not None:
            raise GwdetValueError(
                f"Checkpoint {name!r} cannot be saved: its extra {key!r} ({type(value).__name__}) {problem}; nothing "
                f"was written. "
                f"{_extra_fix(key, value, problem)}")


def checkpoint_files(folder: str) -> dict[str, tuple[int, int]]:
    """The checkpoints in ``folder`` (:func:`checkpoint_names`), each with its size and modification
    time in nanoseconds: what changes when a checkpoint is written again."""
    files = {}
    for name in checkpoint_names(folder):
        with contextlib.suppress(OSError):  # removed since listed
            info = os.stat(os.path.join(folder, name))
            files[name] = (info.st_size, info.st_mtime_ns)
    return files


UNSAFE_PICKLE_ENV = "GWDET_ALLOW_UNSAFE_PICKLE"
MISMATCH_ENV = "GWDET_ALLOW_NORM_MISMATCH"
_OPT_IN = f"set the environment variable {UNSAFE_PICKLE_ENV}=1"
_MISMATCH_OPT_IN = f"set the environment variable {MISMATCH_ENV}=1"


def _opted_in(variable: str, allows: str) -> bool:
    """Whether the environment variable ``variable`` is ``1``; unset, empty or ``0`` is no; any other
    value (``true``, ``yes``) is refused, naming it, rather than read as no."""
    value = os.environ.get(variable, "")
    if value.strip() not in ("", "0", "1"):
        raise GwdetValueError(f"{variable}={value!r} is neither 1 nor 0: set {variable}=1 to {allows}, or unset it.")
    return value.strip() == "1"


def unsafe_pickle_allowed() -> bool:
    return _opted_in(UNSAFE_PICKLE_ENV, "load files that need more than weights-only unpickling")


def mismatch_allowed() -> bool:
    return _opted_in(MISMATCH_ENV, "load weights trained with other norm layers or settings")


def load_pickle_weights(path: str) -> Any:
    """A ``.pkl`` weight file through the numpy-only unpickler (opt-in: ``GWDET_ALLOW_UNSAFE_PICKLE=1``);
    one that cannot be unpickled is a :class:`DamagedFileError` naming it."""
    try:
        return load_pickle_file(path, unsafe_pickle_allowed(), _OPT_IN)
    except (pickle.UnpicklingError, EOFError, UnicodeDecodeError, ValueError, TypeError, IndexError, KeyError,
            AttributeError, MemoryError) as error:  # what unpickling cut or changed bytes raises
        if isinstance(error, GwdetError):  # not a pickle of weights, or one that needs unsafe loading: named already
            raise
        raise _damaged(path, error) from error


def _damaged(path: str, error: BaseException | str) -> DamagedFileError:
    """The refusal of a weights file that cannot be read (``error``: what reading it raised, or what
    is wrong with it in words): damaged or cut short."""
    if isinstance(error, str):
        found = error
    else:
        reason = str(error).split(". ")[0].splitlines()[0] if str(error).strip() else "no details"
        found = f"{type(error).__name__}: {reason}"
    return DamagedFileError(
        f"{path} cannot be read: it is damaged or cut short ({found}); nothing was "
        "loaded from it. Restore the file from a copy or write it again (train, or convert the weights "
        "again); a training's --resume uses the previous checkpoint in the folder instead.", path)


def _check_holds_weights(path: str, data: Any) -> None:
    """Refuse a file whose contents are no checkpoint: not a dict, or whose weights (its ``model``,
    as detectron2's checkpointer reads it) are empty or hold a value that is neither a tensor nor an array."""
    if not isinstance(data, dict):
        raise GwdetValueError(
            f"{path} holds a {type(data).__name__}, not a checkpoint: a dict of weights (a state dict, or "
            "{'model': state_dict, ...} as detectron2 and gwdet save). Save the model's state_dict() instead.")
    weights = data.get("model", data)
    if isinstance(weights, dict) and not weights:  # detectron2's name matching fails on no names (an IndexError)
        where = "its 'model' is an empty dict" if weights is not data else "it is an empty dict"
        raise GwdetValueError(
            f"{path} holds no weights: {where}, with no parameter name or tensor in it, so nothing could be loaded. "
            "Check the path; a weight file maps parameter names to tensors (or numpy arrays in a .pkl): write it "
            "again from the model's state_dict().")
    if isinstance(weights, dict):
        odd = [f"{key!r} ({type(value).__name__})" for key, value in weights.items()
               if not isinstance(value, (torch.Tensor, np.ndarray))]
        wrapped = [key for key, value in weights.items() if isinstance(value, dict) and value
                   and all(isinstance(leaf, (torch.Tensor, np.ndarray)) for leaf in value.values())]
        if wrapped and len(odd) == len(weights):  # no tensor at the top, a mapping of them below
            inner = [key.removeprefix("module.") for key in weights[wrapped[0]]]
            if any(key.startswith(TORCHVISION_RESNET_PREFIXES) for key in inner):  # the GW authors' ImageNet files
                raise GwdetValueError(
                    f"{path} holds a torchvision-layout ResNet under {wrapped[0]!r} (keys like {inner[0]!r}): ImageNet "
                    "weights that need converting into detectron2's names first, which the converter does with "
                    "that entry as it is. Convert them with tools/convert_pretrained.py IN OUT (docs/weights.md) and "
                    "give OUT as the weights.")
            raise GwdetValueError(
                f"{path} holds its weights under {wrapped[0]!r} (as some training frameworks save them), where "
                f"detectron2's checkpointer reads the file itself or its 'model'. Save that entry on its own, e.g. "
                f"torch.save(torch.load(path)[{wrapped[0]!r}], 'weights.pth'), and give that file.")
        if odd:
            raise GwdetValueError(
                f"{path} holds no weights: its weights hold values that are neither tensors nor arrays, "
                f"{listed(odd, 3)}. Check the path; a weight file maps parameter names to tensors (or numpy arrays "
                "in a .pkl).")


def _check_finite_weights(path: str, data: dict, setting: str, resumed_in: str | None = None) -> None:
    """Refuse weights whose tensors hold no values (a state dict of a model on the meta device),
    negative running variances, or NaN or infinite values (a model built from them computes NaN), naming the tensors, before
    any is loaded. ``setting``: what the message names the file as (``MODEL.WEIGHTS``; ``""``: by its
    path alone); ``resumed_in``: the run folder a ``--resume`` continues, whose earlier checkpoints
    the message points to."""
    weights = data.get("model", data)
    if not isinstance(weights, Mapping):
        return
    named = f"--resume: {path}" if resumed_in is not None else f"{setting} {path}" if setting else path
    valueless = valueless_tensors_problem(weights)
    if valueless is not None:
        raise GwdetValueError(f"{named}: {valueless} and give that file; nothing was loaded.")
    negative = [str(name) for name, value in weights.items() if str(name).endswith("running_var")
                and isinstance(value, (torch.Tensor, np.ndarray)) and bool((value < 0).any())]
    if negative:  # a variance below 0: normalizing by its square root computes NaN
        raise GwdetValueError(
            f"{named} holds negative running variances in {len(negative)} tensor(s) ({listed(negative, 3)}), which no "
            "training computes: a model built from them normalizes by the square root of a negative number (NaN); "
            "nothing was loaded. The file was written by other means or damaged: use another checkpoint.")
    broken = [str(name) for name, value in weights.items() if not _all_finite(value)]
    if not broken:
        return
    held = f"{named} holds NaN or infinite values in {len(broken)} tensor(s) ({listed(broken, 3)})"
    if resumed_in is not None:
        earlier = [name for name in checkpoint_names(resumed_in) if name != os.path.basename(path)]
        example = f" (e.g. {earlier[-1]})" if earlier else ""
        raise GwdetValueError(
            f"{held}: the run diverged before it saved them, and training on from them would compute NaN; nothing was "
            f"loaded. Continue from an earlier checkpoint of the run by writing its name into "
            f"{os.path.join(resumed_in, LAST_CHECKPOINT)}{example}, or train afresh (--overwrite instead of --resume).")
    raise GwdetValueError(
        f"{held}: a model built from them computes NaN, so its results would mean nothing; nothing was loaded. The "
        "run that wrote them diverged: use an earlier checkpoint of it, or other weights.")


def _meta_tensors(model: Any) -> list[str]:
    """The names of ``model``'s parameters and buffers on the meta device (built under
    ``torch.device('meta')`` or with ``MODEL.DEVICE meta``: shapes without values)."""
    if not isinstance(model, torch.nn.Module):
        return []
    return [name for name, tensor in (*model.named_parameters(), *model.named_buffers()) if tensor.is_meta]


class NonFiniteWeightsError(GwdetError, FloatingPointError):
    """A training's checkpoint refused because the model's weights hold NaN or inf (a training step
    that made them so: a ``FloatingPointError``, as detectron2's trainer raises for a non-finite
    loss). Loading refuses such weights from any file."""


def _non_finite_tensors(model: Any) -> list[str]:
    """The names of ``model``'s floating-point parameters and buffers that hold NaN or inf."""
    if not isinstance(model, torch.nn.Module):
        return []
    return [name for name, tensor in (*model.named_parameters(), *model.named_buffers())
            if tensor.is_floating_point() and not tensor.is_meta and not bool(torch.isfinite(tensor).all())]


def _warn_non_finite_saved(name: str, path: str, weights: Mapping[str, Any]) -> None:
    """Warn that checkpoint ``name`` (written to ``path``), whose state dict ``weights`` holds NaN
    or infinite values, is saved all the same (the state of a model that diverged is worth keeping
    to debug it) though a gwdet checkpointer refuses to load it. Each tensor is checked where it
    lies (on the GPU: no copy to the CPU)."""
    broken = [str(key) for key, value in weights.items() if not _all_finite(value)]
    if broken:
        logger.warning(
            f"Checkpoint {name!r} is saved, but the model's weights hold NaN or infinite values in {len(broken)} "
            f"tensor(s) ({listed(broken, 3)}): a model built from them computes NaN, and loading the file with gwdet "
            "(ResilientCheckpointer.load, MODEL.WEIGHTS, --resume) refuses it. It is kept to debug the model; read it "
            f"with torch.load({path!r}, weights_only=True)['model']. Find what made the values so (a learning "
            "rate too large, an input that is not finite) before saving again.")


def _build_off_meta(then: str) -> str:
    """What a refusal of a model on the meta device says to do, ending with ``then``."""
    return ("Build the model on the CPU or GPU (MODEL.DEVICE cpu or cuda; in Python, outside torch.device('meta')) "
            f"and {then} (model.to_empty() would leave what a checkpoint does not hold, detectron2's pixel mean and "
            "std and its anchors, uninitialized).")


def _on_meta(names: Sequence[str]) -> str:
    """What a refusal says of a model whose tensors ``names`` are on the meta device."""
    return (f"the model is on the meta device ({len(names)} of its tensors, e.g. {names[0]!r}: a model built under "
            "torch.device('meta') or with MODEL.DEVICE meta), whose tensors hold shapes but no values")


def _all_finite(value: Any) -> bool:
    """Whether a tensor or array holds no NaN or infinite value (True for other values and integers)."""
    if isinstance(value, torch.Tensor):
        return not value.is_floating_point() or bool(torch.isfinite(value).all())
    if isinstance(value, np.ndarray):
        return value.dtype.kind != "f" or bool(np.isfinite(value).all())
    return True


TORCHVISION_DETECTION_BACKBONE = "backbone.body."  # torchvision's detection models keep their ResNet there


def torchvision_detection_hint(names: Sequence[str]) -> str:
    """For weight ``names`` of a torchvision detection model (Faster/Mask R-CNN: its ResNet under
    :data:`TORCHVISION_DETECTION_BACKBONE`): what they are and how to convert their ResNet; else ``""``."""
    prefix = TORCHVISION_DETECTION_BACKBONE
    if not any(name.startswith(prefix) for name in names):
        return ""
    return (f" Those are a torchvision detection model's weights (its ResNet under {prefix!r}, then its FPN and heads), "
            f"which gwdet converts the ResNet of only: save it on its own ({{key.removeprefix({prefix!r}): value for "
            f"key, value in weights.items() if key.startswith({prefix!r})}}) and convert that file with "
            "tools/convert_pretrained.py.")


def load_torch_checkpoint(path: str) -> Any:
    """``torch.load(path, weights_only=True)`` (opt-in to more: ``GWDET_ALLOW_UNSAFE_PICKLE=1``)."""
    return load_torch_file(path, unsafe_pickle_allowed(), _OPT_IN)


class RandomState:
    """A checkpointable holding the torch, numpy and python random generators' states: those of the
    process that saves (rank 0). A run of several processes resumes each with them, which a warning
    says: the resumed run is then not the uninterrupted one bit for bit (docs/reliability.md)."""

    def state_dict(self) -> dict:
        numpy_state = np.random.get_state()  # legacy=True: the global MT19937 generator's tuple
        assert isinstance(numpy_state, tuple)
        name, keys, position, has_gauss, cached_gaussian = numpy_state
        version, internal, gauss_next = random.getstate()
        return {
            "torch": torch.get_rng_state(),
            "numpy": [name, keys.tolist(), position, has_gauss, cached_gaussian],
            "python": [version, list(internal), gauss_next],
        }

    def load_state_dict(self, state: dict) -> None:
        if comm.get_world_size() > 1 and comm.is_main_process():
            logging.getLogger(__name__).warning(
                f"--resume of a run of {comm.get_world_size()} processes: the checkpoint holds the random generators "
                "of process 0, and every process continues with them, so the resumed run's random draws (flips, "
                "box and mask sampling) differ from an uninterrupted run's: it is not that run bit for bit (one "
                "process resumes bit for bit).")
        self.restore(state)

    @staticmethod
    def restore(state: dict) -> None:
        """Set this process's generators to ``state`` (what :meth:`state_dict` gave)."""
        torch.set_rng_state(state["torch"])
        name, keys, position, has_gauss, cached_gaussian = state["numpy"]
        np.random.set_state((name, np.asarray(keys, dtype=np.uint32), position, has_gauss, cached_gaussian))
        version, internal, gauss_next = state["python"]
        random.setstate((version, tuple(internal), gauss_next))


def web_address(address: str) -> str:
    """The https address detectron2's PathManager fetches for ``address``: a ``catalog://`` name
    through detectron2's ``ModelCatalog``, a ``detectron2://`` one under detectron2's download prefix;
    any other address as it is."""
    from detectron2.checkpoint.catalog import ModelCatalog

    for prefix, resolve in (("catalog://", ModelCatalog.get),
                            ("detectron2://", lambda name: DETECTRON2_DOWNLOADS + name)):
        if address.startswith(prefix):
            try:
                return str(resolve(address[len(prefix):]))
            except (KeyError, RuntimeError, ValueError):  # a name the catalog does not know
                return address
    return address


# where detectron2's PathManager fetches detectron2:// names (detectron2.utils.file_io.Detectron2Handler)
DETECTRON2_DOWNLOADS = "https://dl.fbaipublicfiles.com/detectron2/"
# the names of torchvision's ImageNet ResNets' weights (layer1..4, the stem's conv1 and bn1, the classifier fc)
TORCHVISION_RESNET_PREFIXES = ("layer1.", "layer2.", "layer3.", "layer4.", "conv1.", "bn1.", "fc.")


class WeightsDownloadError(GwdetError, OSError):
    """Initial weights named by a URL that cannot be downloaded here."""


def local_weights_path(path: str, setting: str = "MODEL.WEIGHTS") -> str:
    """Initial weights ``path`` (the value of ``setting``) as the file it names on this machine: a
    leading ``~`` expanded to the home folder, as a quoted ``~`` of ``OUTPUT_DIR`` is
    (:func:`gwdet.model_zoo.build_config`); a ``file://`` URL (of this host) turned into its path,
    which detectron2's ``PathManager`` has no handler for. Anything else is returned as it is."""
    if path.startswith("~"):
        return os.path.expanduser(path)
    local, host = file_url_path(path)
    if host is not None:
        raise GwdetValueError(
            f"{setting} {path} names a file on the host {host!r}, which cannot be read from here. Copy "
            f"the file to this machine and set {setting} to its path.")
    return local


def without_query(path: str) -> str:
    """The file a checkpoint ``path`` names: without the ``?query`` detectron2 reads off it
    (``?matching_heuristics=True``)."""
    return urlsplit(path)._replace(query="").geturl() if "?" in path else path


def absolute_weights_path(path: str, setting: str = "MODEL.WEIGHTS") -> str:
    """Initial weights ``path`` as :func:`local_weights_path` reads it, a relative path made absolute:
    what a run's ``config.yaml`` records, so that the config read from another folder names the same
    file. URLs and ``""`` (no weights) are returned as they are."""
    local = local_weights_path(path, setting)
    problem = link_dotdot_problem(setting, local) if local else None
    if problem is not None:
        raise GwdetValueError(problem)
    return os.path.abspath(local) if local and "://" not in local else local


def weights_record(path: str) -> dict[str, str]:
    """``{"path", "sha256"}`` of the local weights file ``path`` (absolute): which weights a run
    started from or an evaluation scored, whatever later replaces a file of that name."""
    return {"path": os.path.abspath(path), "sha256": cached_sha256(path) if os.path.isfile(path) else "not a local file"}


def _other_backbone_shapes(other_shapes: Sequence[tuple[str, tuple, tuple]], backbone: int) -> GwdetValueError:
    """The refusal of weights whose backbone weights ``other_shapes`` (name, shape in the weights,
    in the model) of the ``backbone`` weights of the model have other shapes."""
    key, saved, present = other_shapes[0]
    return GwdetValueError(
        f"{len(other_shapes)} of the backbone's {backbone} weights have another shape in the weights than "
        f"in the model (e.g. {key}: {saved} in the weights, {present} in the model), so the model would run "
        "with a partly random backbone. The model's ResNet is built with other sizes than "
        "the weights': give the depth, groups and widths they were trained or converted with "
        "(MODEL.RESNETS.DEPTH, NUM_GROUPS, WIDTH_PER_GROUP, STEM_OUT_CHANNELS, RES2_OUT_CHANNELS; a "
        "LazyConfig's ResNet arguments).")


def _non_floating_weights(weights: Mapping[str, Any], model: torch.nn.Module) -> list[tuple[str, str, str, str]]:
    """``(key, dtype, model name, model dtype)`` of every array or tensor of ``weights`` with
    integer or bool values whose place in ``model`` (its own name, without DDP's ``module.``, else
    the one name ending with ``"." + key``, as detectron2's matching heuristics place a ``.pkl``'s
    names) is a floating-point parameter or buffer; integer buffers (``num_batches_tracked``,
    counters) take integer values."""
    state = unwrapped(model).state_dict()
    found = []
    for key, value in weights.items():
        if isinstance(value, np.ndarray):
            kind = value.dtype
            non_floating = not (np.issubdtype(kind, np.floating) or np.issubdtype(kind, np.complexfloating))
            dtype = str(kind)
        elif isinstance(value, torch.Tensor):
            non_floating = not (value.is_floating_point() or value.is_complex())
            dtype = str(value.dtype).removeprefix("torch.")
        else:
            continue
        if not non_floating or not isinstance(key, str):
            continue
        name = key.removeprefix(WRAPPER_PREFIX) if key.removeprefix(WRAPPER_PREFIX) in state else key
        targets = [name] if name in state else [own for own in state if own.endswith("." + name)]
        if len(targets) != 1 or not isinstance(state[targets[0]], torch.Tensor):
            continue
        target = state[targets[0]]
        if target.is_floating_point():
            found.append((key, dtype, targets[0], str(target.dtype).removeprefix("torch.")))
    return found


def lost_checkpoint_error(save_dir: str, weights_setting: str = "MODEL.WEIGHTS") -> GwdetFileNotFoundError:
    """The refusal of ``--resume`` in ``save_dir`` where ``last_checkpoint`` is left but the checkpoint
    it names is not there, nor any other: detectron2 counts a folder with ``last_checkpoint`` as one
    to resume (``has_checkpoint``) and would start at iteration 1, from ``weights_setting``."""
    tag = os.path.join(save_dir, LAST_CHECKPOINT)
    try:
        with open(tag, "rb") as f:
            name = f.read(4096).decode("utf-8").strip()
        named = f"names {name!r}, which is not a checkpoint file in {save_dir!r}," if name else "is empty,"
        restore = f"Restore {os.path.basename(name)} into {save_dir}" if name else "Restore the run's checkpoint"
    except UnicodeDecodeError:
        named, restore = "is not text (damaged),", "Restore the run's checkpoint"
    return GwdetFileNotFoundError(
        f"--resume: {tag} {named} and no other checkpoint is there, so there is nothing to resume: detectron2 "
        f"would still count the run as resumed and start training at iteration 1, from {weights_setting}; nothing "
        f"was changed. {restore} (from a copy) to continue the run, or train afresh with --overwrite instead of "
        "--resume (which deletes the earlier run's files).")


# The class names a checkpoint's model was trained on, in the order of its outputs.
CLASSES_KEY = "gwdet_classes"
# The same list set on the model (its attribute of this name) by gwdet's checkpointer when it loads a
# checkpoint that records it, or is built for a training that knows it: what an evaluation of the model
# from Python checks its test data against (gwdet.data.datasets.check_evaluated_classes).
CLASSES_ATTRIBUTE = "gwdet_classes"
# in a training set's record (DATA_KEY): its image files' fingerprints, joined in the order of their paths
# (gwdet.data.coco_registration.CocoContents.fingerprints)
IMAGES_KEY = "image_fingerprints"
# ... and the SHA-256 of the annotation file's JSON contents in one canonical form (the same contents
# written otherwise, re-indented say, give the same digest)
CONTENTS_KEY = "json_content_sha256"
# The input a model was trained on: GeneralizedRCNN's input_format, pixel_mean and pixel_std, which
# its state dict does not hold (its pixel buffers are not saved).
INPUT_KEY = "gwdet_input"
INPUT_ATTRIBUTES = ("input_format", "pixel_mean", "pixel_std")
# the counter torch.optim.swa_utils.AveragedModel keeps beside the averaged model's weights (under "module.")
AVERAGED_COUNT = "n_averaged"
# what detectron2's trainers save of a run beside the weights (gwdet's add their random and data state)
DETECTRON2_STATE = frozenset({"iteration", "optimizer", "scheduler"})
# The training datasets' annotation files, {name: {"json_file": path, "json_sha256": digest, "image_root":
# folder}}: what a resume checks that it continues on, and an evaluation that it is not evaluated on.
DATA_KEY = "gwdet_training_data"
# What each stretch of a resumed training ran with, [{"from_iteration": i, ...the values the trainer gave
# as its segment}], the last the stretch that saved the checkpoint: carried from checkpoint to checkpoint.
RUN_SEGMENTS_KEY = "gwdet_run_segments"
# The initial weights a training started from, {"path": absolute path or URL, "sha256": digest}
# (weights_record): carried from checkpoint to checkpoint, so that a resumed run still names them.
INITIAL_WEIGHTS_KEY = "gwdet_initial_weights"
# What torch.compile puts in the names of a compiled module's weights (its OptimizedModule wraps the
# original module as _orig_mod).
COMPILED = "_orig_mod."
# the prefix of the weights of a wrapped model, which fvcore's loading strips when every name has it
WRAPPER_PREFIX = "module."


def input_record(model: torch.nn.Module) -> dict[str, Any]:
    """``model``'s (DDP's ``module``'s) input format and pixel normalization, as lists of numbers,
    and, for a ResNet of bottleneck blocks, whether its downsampling blocks stride in the 1x1 conv
    (``stride_in_1x1``, ``MODEL.RESNETS.STRIDE_IN_1X1``: another function with the same weight
    shapes), the anchors of its anchor generator (:func:`anchor_record`), its FPN's fuse type, the
    weights its box regressions decode with (RPN's and the box heads' ``BBOX_REG_WEIGHTS``, by module
    name) and its ROI heads' poolers (:func:`pooler_record`): values its state dict does not hold and
    the weights were trained with; empty for a model without them."""
    model = unwrapped(model)
    values = {name: getattr(model, name) for name in INPUT_ATTRIBUTES if hasattr(model, name)}
    record = {name: value.flatten().tolist() if isinstance(value, torch.Tensor) else value
              for name, value in values.items()}
    downsampling = next((module for module in model.modules() if isinstance(module, BottleneckBlock)
                         and module.conv1.stride != module.conv2.stride), None)
    if downsampling is not None:
        record["stride_in_1x1"] = downsampling.conv1.stride != (1, 1)
    generator = next((module for module in model.modules() if isinstance(module, DefaultAnchorGenerator)), None)
    if generator is not None:
        record.update(anchor_record(generator))
    fpn = next((module for module in model.modules() if isinstance(module, FPN)), None)
    if fpn is not None:
        record["fpn_fuse_type"] = fpn._fuse_type
    weights = {name: [float(w) for w in module.box2box_transform.weights] for name, module in model.named_modules()
               if isinstance(getattr(module, "box2box_transform", None), Box2BoxTransform)}
    if weights:
        record["box_regression_weights"] = weights
    poolers = {name: pooler_record(module) for name, module in model.named_modules() if isinstance(module, ROIPooler)}
    if poolers:
        record["roi_poolers"] = poolers
    return record


def pooler_record(pooler: ROIPooler) -> dict[str, Any]:
    """What a ROI head's ``pooler`` computes its features with (``MODEL.ROI_BOX_HEAD.POOLER_TYPE``,
    ``POOLER_RESOLUTION``, ``POOLER_SAMPLING_RATIO``; the levels ``MODEL.ROI_HEADS.IN_FEATURES`` give, as
    their scales): its own state dict holds none of it."""
    first = pooler.level_poolers[0]
    return {"type": type(first).__name__, "aligned": bool(getattr(first, "aligned", False)),
            "output_size": list(pooler.output_size), "sampling_ratio": getattr(first, "sampling_ratio", None),
            "scales": [float(getattr(level, "spatial_scale", 0.0)) for level in pooler.level_poolers]}


def anchor_record(generator: DefaultAnchorGenerator) -> dict[str, Any]:
    """The anchors of ``generator`` (buffers its state dict does not hold), per feature level:
    ``anchor_sizes`` (the square roots of their areas) and ``anchor_aspect_ratios`` (height / width),
    each sorted and rounded as ``MODEL.ANCHOR_GENERATOR.SIZES`` / ``ASPECT_RATIOS`` give them, and
    ``anchor_offset``: what the box regression of the weights was trained against."""
    sizes, ratios = [], []
    for anchors in generator.cell_anchors:
        widths, heights = anchors[:, 2] - anchors[:, 0], anchors[:, 3] - anchors[:, 1]
        sizes.append(sorted({round(float(v), 2) for v in torch.sqrt(widths * heights)}))
        ratios.append(sorted({round(float(v), 3) for v in heights / widths}))
    return {"anchor_sizes": sizes, "anchor_aspect_ratios": ratios, "anchor_offset": float(generator.offset)}


def without_compiled(name: str) -> str:
    """``name`` (a weight's or module's) without the ``_orig_mod.`` parts ``torch.compile`` puts in
    the names of a compiled module's weights and submodules."""
    return (name + ".").replace("." + COMPILED, ".").removeprefix(COMPILED)[:-1]


# the records of input_record that map module names to values
_RECORDS_BY_MODULE = ("box_regression_weights", "roi_poolers")


def input_differences(saved: Any, model: torch.nn.Module) -> list[str]:
    """``"NAME saved -> present"`` for each input value :func:`input_record` recorded for weights
    (``saved``; nothing without a record) that ``model`` has otherwise. The module names of a record
    saved from a ``torch.compile``d model are compared without their ``_orig_mod.`` where the
    model's have none, as its weights are loaded; those records are compared on the modules both
    have (a mask head's pooler is no difference for a model built without that head)."""
    if not isinstance(saved, dict):
        return []
    present = input_record(model)
    saved = dict(saved)
    for name in _RECORDS_BY_MODULE:
        record, own = saved.get(name), present.get(name)
        if isinstance(record, dict) and isinstance(own, dict) and not any(COMPILED in str(key) for key in own):
            saved[name] = record = {without_compiled(key) if isinstance(key, str) else key: value
                                    for key, value in record.items()}
        if isinstance(record, dict) and isinstance(own, dict) and record.keys() & own.keys():
            # the modules both have: a head the model is built without (MODEL.MASK_ON False) computes nothing
            saved[name] = {key: value for key, value in record.items() if key in own}
            present[name] = {key: value for key, value in own.items() if key in record}
    return [f"{name} {saved[name]!r} -> {present[name]!r}" for name in present
            if name in saved and saved[name] != present[name]]


def _prefix_of_model_keys(keys: Sequence[str], model_keys: set[str]) -> str | None:
    """The first dotted part that every one of ``keys`` starts with where the rest of each is a key
    of the model (a wrapper's attribute: Lightning's ``model.``), or None."""
    first = keys[0].split(".", 1)[0] + "." if keys and "." in keys[0] else None
    if first is None or not all(key.startswith(first) and key[len(first):] in model_keys for key in keys):
        return None
    return first


def _prefix_missing_from_keys(keys: Sequence[str], model_keys: set[str]) -> str | None:
    """The model part (``backbone.``, ``backbone.bottom_up.``) whose name, put before each of
    ``keys``, makes every one a key of the model: a state dict saved from that part (e.g.
    ``model.backbone.state_dict()``); None when there is none."""
    for prefix in ("backbone.bottom_up.", "backbone."):
        if keys and all(prefix + key in model_keys for key in keys):
            return prefix
    return None


def _backbone_prefix_swap(keys: Sequence[str], missing: Sequence[str]) -> tuple[str, str] | None:
    """``(the file's prefix, the model's)`` when the ResNet of a file's ``keys`` is under the other of
    ``backbone.bottom_up.`` (an FPN model's) and ``backbone.`` (a C4 model's) than the model's
    ``missing`` backbone weights: every missing weight is there under the file's prefix."""
    held = set(keys)
    for saved, built in (("backbone.bottom_up.", "backbone."), ("backbone.", "backbone.bottom_up.")):
        if missing and all(key.startswith(built) and saved + key[len(built):] in held for key in missing):
            return saved, built
    return None


def _prefix_swap_hint(swap: tuple[str, str], missing: str) -> str:
    """What a refusal says of weights whose ResNet is under the other backbone prefix (``swap``:
    :func:`_backbone_prefix_swap`), ``missing`` one of the model's weights they leave unloaded."""
    saved, built = swap
    fpn = "bottom_up" in saved
    return (f" The file's ResNet is under {saved!r} (e.g. {saved + missing[len(built):]!r}), the model's under "
            f"{built!r}: the weights of a model {'with' if fpn else 'without'} an FPN for one "
            f"{'without' if fpn else 'with'} (a C4 model's backbone is the ResNet itself). Save them under the model's "
            f"names ({{key.replace({saved!r}, {built!r}, 1): value for key, value in weights.items()}}) and load that "
            "file.")


def _unloaded_backbone_hint(unexpected: Sequence[str], missing: Sequence[str], backbone_size: int,
                            model_keys: set[str]) -> str:
    """What the refusal of weights that leave ``missing`` of the model's ``backbone_size`` backbone
    weights unloaded says of the file's ``unexpected`` keys (those no weight of the model took), in
    the order the causes are told apart: another backbone prefix, the model's keys without or
    behind a prefix (a part's state dict, a wrapper's, an EMA's), a torchvision detector or
    ImageNet checkpoint, else other names or shapes; "" without unexpected keys."""
    averaged = AVERAGED_COUNT in unexpected  # torch.optim.swa_utils.AveragedModel's state dict (EMA, SWA)
    prefix = _prefix_of_model_keys([key for key in unexpected if key != AVERAGED_COUNT] if averaged else unexpected,
                                   model_keys)
    nothing_loaded = len(missing) == backbone_size  # (a .pkl's names matched by their ends load some)
    part = _prefix_missing_from_keys(unexpected, model_keys) if nothing_loaded and not prefix else None
    swap = _backbone_prefix_swap(unexpected, missing) if nothing_loaded and not (prefix or part) else None
    if swap:
        return _prefix_swap_hint(swap, missing[0])
    if part:
        return (f" The file holds the model's keys without their {part!r} (e.g. {unexpected[0]!r} is the model's "
                f"{part + unexpected[0]!r}): the state dict of model.{part[:-1]}, not of the model. Save the whole "
                f"model's weights (model.state_dict()), or these with the prefix put back ({{{part!r} + key: value for "
                "key, value in weights.items()}) and load that file.")
    if averaged and prefix:
        return (f" The file is the state dict of torch's AveragedModel (EMA or SWA: its {AVERAGED_COUNT!r} and the "
                f"model's keys behind {prefix!r}): save the averaged model's own weights (averaged.module.state_dict()) "
                "and load that file.")
    if prefix:
        return (f" The file holds the model's keys behind the prefix {prefix!r} (e.g. {unexpected[0]!r}): save its "
                f"weights with the prefix taken off ({{key.removeprefix({prefix!r}): value for key, value in "
                "weights.items()}) and load that file.")
    if not unexpected:
        return ""
    detector = torchvision_detection_hint(unexpected)
    if detector:
        return detector
    if any(key.startswith(TORCHVISION_RESNET_PREFIXES) for key in unexpected):
        return (f" The file holds keys like {', '.join(map(repr, unexpected[:3]))}, not the model's: a "
                "torchvision-layout ImageNet checkpoint needs converting first.")
    return (f" The file holds keys like {', '.join(map(repr, unexpected[:3]))} that no weight of the model took: "
            "named otherwise, or of other shapes (detectron2 matches a .pkl's names by their ends and their shapes); "
            "compare them with the model's (MODEL.RESNETS' widths, say).")


def _deeper_stage(backbone: Sequence[str], missing: Sequence[str]) -> tuple[str, int, int] | None:
    """``(stage, blocks held, blocks built)`` of the first ResNet stage (``res4`` of
    ``backbone.bottom_up.res4.6.conv1.weight``) whose first blocks the weights hold and whose last
    ones they lack, the mark of weights of a shallower ResNet; None when the missing weights are
    not whole blocks at the end of a stage."""
    def block(name: str) -> tuple[str, int] | None:
        parts = name.split(".")
        for index, part in enumerate(parts[:-1]):
            if part.startswith("res") and part[3:].isdigit() and parts[index + 1].isdigit():
                return ".".join(parts[:index + 1]), int(parts[index + 1])
        return None

    built: dict[str, set[int]] = {}
    for name in backbone:
        found = block(name)
        if found is not None:
            built.setdefault(found[0], set()).add(found[1])
    lacking: dict[str, set[int]] = {}
    for name in missing:
        found = block(name)
        if found is None:
            return None
        lacking.setdefault(found[0], set()).add(found[1])
    for stage, blocks in lacking.items():
        held = built[stage] - blocks
        if held and max(held) < min(blocks):
            return stage.rsplit(".", 1)[-1], len(held), len(built[stage])
    return None


# The ends of state dict keys that are no weight of a layer: a batch norm's step count (which eval mode
# never reads) and the records of a layer's settings (gwdet.layers.settings_state)
_NOT_WEIGHTS = ("num_batches_tracked", EXTRA_STATE_KEY)
# The heads a model may leave out on its own (MODEL.MASK_ON, MODEL.KEYPOINT_ON): the settings that build them
_OPTIONAL_HEADS = {"mask_head": ("MODEL.MASK_ON False", "model.roi_heads.mask_in_features=None"),
                   "keypoint_head": ("MODEL.KEYPOINT_ON False", "model.roi_heads.keypoint_in_features=None")}
# The layers detectron2's heads number (conv1, fc2, mask_fcn3), with the settings that give how many
_NUMBERED_LAYERS = (
    ("roi_heads.box_head.", "conv", "MODEL.ROI_BOX_HEAD.NUM_CONV", "model.roi_heads.box_head.conv_dims"),
    ("roi_heads.box_head.", "fc", "MODEL.ROI_BOX_HEAD.NUM_FC", "model.roi_heads.box_head.fc_dims"),
    ("roi_heads.mask_head.", "mask_fcn", "MODEL.ROI_MASK_HEAD.NUM_CONV", "model.roi_heads.mask_head.conv_dims"),
)


def unused_weights(unexpected: Sequence[str]) -> list[str]:
    """The keys of ``unexpected`` (a checkpoint's keys the model has no place for) that are weights
    of a layer: not a batch norm's ``num_batches_tracked`` nor a layer's record of its settings."""
    return [key for key in unexpected if key.rsplit(".", 1)[-1] not in _NOT_WEIGHTS]


def absent_head(model: torch.nn.Module, key: str) -> str | None:
    """The path of the submodule named ``*_head`` that the weight ``key`` lies under and that
    ``model`` does not have at all (``roi_heads.mask_head`` of a model built with ``MODEL.MASK_ON
    False``), where the model has every module above it; ``None`` for any other key."""
    parts = key.split(".")
    module = model
    for index, part in enumerate(parts[:-1]):
        child = module._modules.get(part)
        if child is None:
            return ".".join(parts[:index + 1]) if part.endswith("_head") else None
        module = child
    return None


def numbered_layers_held(unused: Sequence[str], model_keys: Sequence[str], lazy: bool) -> list[str]:
    """How many numbered layers (``conv1`` ... ``conv4`` of ``roi_heads.box_head``) the weights hold
    where ``unused`` (weights the model does not use) has some the model lacks, each as the setting
    that builds that many: ``MODEL.ROI_BOX_HEAD.NUM_CONV 4`` (``lazy``: a LazyConfig's
    ``model.roi_heads.box_head.conv_dims`` of 4 entries)."""
    found = []
    for prefix, name, setting, lazy_setting in _NUMBERED_LAYERS:
        pattern = re.compile(rf"^{re.escape(prefix)}{name}(\d+)\.")
        extra = {int(match.group(1)) for match in map(pattern.match, unused) if match}
        if extra:
            held = max(extra | {int(match.group(1)) for match in map(pattern.match, model_keys) if match})
            found.append(f"{lazy_setting} of {held} entries" if lazy else f"{setting} {held}")
    return found


# What weights that leave part of the model unloaded would give an evaluation (the refusal's words)
EVALUATION_OUTCOME = "evaluating it would report a partly random model"


# The keys of an optimizer's parameter group that are not values it trains with: its parameters (and
# their names), and the rate an LR scheduler starts from (the scheduler's, set when it is built).
NOT_GROUP_VALUES = frozenset({"params", "param_names", "initial_lr"})


def _group_values(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """The values of each parameter group of ``optimizer`` (``lr``, ``weight_decay``, ``momentum``,
    ...; not :data:`NOT_GROUP_VALUES`)."""
    return [{key: value for key, value in group.items() if key not in NOT_GROUP_VALUES}
            for group in optimizer.param_groups]


def _shown_value(value: Any) -> str:
    """A parameter group's value as a message shows it (a one-number tensor as its number)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return repr(value.item())
    return repr(value)


def _same_group_value(old: Any, new: Any) -> bool:
    """Whether two values of a parameter group are equal (NaN as NaN; a tensor as its number)."""
    if _shown_value(old) == _shown_value(new):
        return True
    try:
        return bool(old == new)
    except (RuntimeError, TypeError, ValueError):  # tensors of several numbers, values that do not compare
        return False


def replaced_group_values(before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]]) -> list[str]:
    """What loading an optimizer state changed of its parameter groups' values (``before`` and
    ``after``: :func:`_group_values`), one entry per key and change, e.g. ``"weight_decay of 65
    parameter group(s) 0.3 -> 0.0"``; a key the groups hold on one side only is not compared."""
    changes: dict[tuple[str, str, str], int] = {}
    for old_values, new_values in zip(before, after, strict=False):  # torch keeps the number of groups
        for key, old in old_values.items():
            if key in new_values and not _same_group_value(old, new_values[key]):
                change = (key, _shown_value(old), _shown_value(new_values[key]))
                changes[change] = changes.get(change, 0) + 1
    return [f"{key} of {count} parameter group(s) {old} -> {new}" for (key, old, new), count in changes.items()]


def _check_checkpointer_arguments(args: Sequence[Any], kwargs: Mapping[str, Any], segment: Any,
                                  training_data: Any) -> None:
    """Refuse :class:`ResilientCheckpointer`'s arguments of a type it cannot use, naming the argument,
    before detectron2's checkpointer takes them: ``model`` (an ``nn.Module``), ``save_dir`` (a str or
    ``os.PathLike``; ``None`` or ``""``: none), ``save_to_disk`` (``None``, ``True`` or ``False``), the
    checkpointables (objects with ``state_dict()`` and ``load_state_dict()``), ``segment`` (a mapping,
    a function giving one, or ``None``) and ``training_data`` (a mapping or ``None``)."""
    model = args[0] if args else kwargs.get("model")
    if not isinstance(model, torch.nn.Module):
        raise GwdetTypeError(
            f"ResilientCheckpointer: model must be a torch.nn.Module (the model whose weights it saves and loads), got "
            f"{type(model).__name__} {model!r}. Build the model first, e.g. ResilientCheckpointer(gwdet.build_model(cfg), "
            "save_dir=...).")
    save_dir = args[1] if len(args) > 1 else kwargs.get("save_dir", "")
    if save_dir is not None and not isinstance(save_dir, (str, os.PathLike)):
        raise GwdetTypeError(
            f"ResilientCheckpointer: save_dir must be a str or os.PathLike (the folder checkpoints are saved in), got "
            f"{type(save_dir).__name__} {save_dir!r}. Give the folder's path, e.g. save_dir='output/run' (or "
            "str(folder)).")
    if "save_to_disk" in kwargs and kwargs["save_to_disk"] is not None:
        check_flag("ResilientCheckpointer", "save_to_disk", kwargs["save_to_disk"])
    for key, value in kwargs.items():
        if key not in ("model", "save_dir", "save_to_disk") and not (
                hasattr(value, "state_dict") and hasattr(value, "load_state_dict")):
            raise GwdetTypeError(
                f"ResilientCheckpointer: the checkpointable {key}={value!r} ({type(value).__name__}) has no "
                "state_dict() and load_state_dict(), which the checkpointer saves and restores it by. Give an object "
                "with both (an optimizer, a scheduler), or leave it out.")
    if segment is not None and not callable(segment) and not isinstance(segment, Mapping):
        raise GwdetTypeError(
            f"ResilientCheckpointer: segment must be a mapping of what this process trains with (versions, threads, "
            f"...), a function giving one, or None; got {type(segment).__name__} {segment!r}. Give e.g. "
            "segment={'torch': torch.__version__}.")
    if training_data is not None and not isinstance(training_data, Mapping):
        raise GwdetTypeError(
            f"ResilientCheckpointer: training_data must be a mapping of the training datasets' names to their "
            f"annotation files' records, or None; got {type(training_data).__name__} {training_data!r}.")


def _another_models_checkpoint(path: str, data: Mapping[str, Any]) -> str | None:
    """What makes the checkpoint file ``path`` another run's or another model's than the checkpoint
    ``data`` about to be saved in its place, in words: another run identity (both recorded), or other
    norm layers or norm settings (both recorded); ``None`` where neither is so, or where the file
    cannot be read so (then it is only replaced, as a file of the same run is)."""
    if "://" in path or os.path.islink(path) or not os.path.isfile(path):
        return None
    try:
        saved = load_torch_file(path, False, "", mmap=True)
    except Exception:  # a damaged or foreign file: nothing recorded to compare
        return None
    if not isinstance(saved, dict):
        return None
    theirs, ours = saved.get(RUN_ID_KEY), data.get(RUN_ID_KEY)
    if isinstance(theirs, str) and isinstance(ours, str) and theirs != ours:
        return f"another run's checkpoint (run {theirs[:12]}..., this save's {ours[:12]}...)"
    for key, what in ((NORM_TYPES_KEY, "norm layers"), (NORM_SETTINGS_KEY, "norm settings")):
        if isinstance(saved.get(key), dict) and saved[key] != data[key]:
            return f"the checkpoint of a model with other {what}"
    return None


def _keep_another_models_checkpoint(path: str, data: Mapping[str, Any]) -> None:
    """Before ``data`` is saved as ``path``: a checkpoint there of another run or model
    (:func:`_another_models_checkpoint`; a ``save`` of another checkpointer into the same folder and
    name) is renamed to ``<name>_replaced.pth`` (a free name: ``_2``, ...) with its SHA-256 record,
    and a warning names both, so that the save loses no file of the user's; the save's own earlier
    file (a periodic name saved again, ``model_final`` of a resumed run) is replaced as it is."""
    other = _another_models_checkpoint(path, data)
    if other is None:
        return
    stem, extension = os.path.splitext(os.path.basename(path))
    target = free_path(os.path.dirname(path), f"{stem}_replaced", extension)
    os.replace(path, target)
    if os.path.isfile(checksum_path(path)):
        move_checksum_record(path, target)
    logger.warning(f"{path} held {other}; it is kept as {os.path.basename(target)}, and this checkpoint is "
                   f"saved as {os.path.basename(path)}. Give each model or run its own save_dir or checkpoint name to "
                   "keep them apart.")


class ResilientCheckpointer(DetectionCheckpointer):
    """``DetectionCheckpointer`` with atomic saves, fallback on unreadable files, safe loading,
    and a refusal to load weights trained with other norm layers.

    ``require_every_weight=True`` (evaluation) makes a checkpoint that leaves any model weight
    missing or of another shape an error instead of a logged warning; ``incomplete_outcome`` says
    in that error what the partly loaded model would give (by default an evaluation's results). ``weights_setting`` is how
    messages name the setting the initial weights come from (``train.init_checkpoint`` for a LazyConfig).
    ``classes``: the class names of the training data, in the order of the model's outputs, saved
    under :data:`CLASSES_KEY` (what an evaluation checks its test data against). ``training_data``:
    the training datasets' annotation files, saved under :data:`DATA_KEY` and checked on resume.
    ``compare_input``: warn when the loaded checkpoint's record of the model's input values
    (:func:`input_record`) differs from the model's (off where the caller compares them itself).
    ``segment``: what this process trains with (versions, threads, ...; or a function giving it
    when a checkpoint is saved), saved with the earlier stretches of a resumed run under
    :data:`RUN_SEGMENTS_KEY` (:meth:`run_segments`).
    ``compare_optimizer_values``: warn when loading the state of an optimizer among the
    checkpointables replaces its parameter groups' values (``lr``, ``weight_decay``, ...) by the
    checkpoint's, as torch's ``Optimizer.load_state_dict`` does (off where the caller sets its own
    values again after the load).
    """

    def __init__(self, *args: Any, require_every_weight: bool = False,
                 incomplete_outcome: str = EVALUATION_OUTCOME,
                 weights_setting: str = "MODEL.WEIGHTS",
                 classes: Sequence[str] | None = None, training_data: Mapping[str, Mapping[str, Any]] | None = None,
                 compare_input: bool = True, compare_optimizer_values: bool = True,
                 segment: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None = None, **kwargs: Any) -> None:
        _check_checkpointer_arguments(args, kwargs, segment, training_data)
        check_flag("ResilientCheckpointer", "require_every_weight", require_every_weight)
        check_flag("ResilientCheckpointer", "compare_input", compare_input)
        check_flag("ResilientCheckpointer", "compare_optimizer_values", compare_optimizer_values)
        super().__init__(*args, **kwargs)
        folder: Any = self.save_dir
        if isinstance(folder, (str, os.PathLike)) and os.fspath(folder):  # ~ expanded, as load() expands its path
            self.save_dir: str = os.path.expanduser(os.fspath(folder))
        self.require_every_weight = bool(require_every_weight)
        self.incomplete_outcome = incomplete_outcome
        self.compare_input = bool(compare_input)
        self.compare_optimizer_values = bool(compare_optimizer_values)
        self.weights_setting = weights_setting
        names = list(classes) if classes is not None and not isinstance(classes, str) else classes  # read once
        if names is not None and (isinstance(names, str) or not all(isinstance(name, str) for name in names)):
            raise GwdetTypeError(f"ResilientCheckpointer: classes must be a list of class names (the model's outputs "
                                 f"in order), got {classes!r}")
        self.classes = names or None
        if self.classes and isinstance(self.model, torch.nn.Module):
            setattr(unwrapped(self.model), CLASSES_ATTRIBUTE, list(self.classes))
        self.training_data = dict(training_data) if training_data else None
        self.segment = segment if callable(segment) else dict(segment) if segment else None
        self._earlier_segments: list[dict] = []  # of the checkpoint resumed from
        self._segment_start = 0  # the first iteration this process trains
        self._loading_initial_weights = False  # set by load_weights: training state removed from the file is no loss
        self._resuming = False  # set while resume_or_load loads a checkpoint of save_dir
        self.initial_weights: dict[str, str] | None = None  # what training started from (INITIAL_WEIGHTS_KEY)
        self._loading: str | None = None  # the file load() reads, for its messages
        self._resumed = False  # set when resume_or_load has loaded a checkpoint of save_dir
        self.started = False  # set by resume_or_load: a trainer that trains without it starts a new run
        self._folder_seen: dict[str, tuple[int, int]] | None = None  # save_dir's checkpoints after resume_or_load
        self._file_keys: set = set()  # the keys of the file _load_file read last
        self._asked_checkpointables: list[str] = []  # the checkpointables load() restores by name
        self._restoring: list[str] = []  # the checkpointables load() restores (by name, or all the file holds)
        self.run_id: str | None = None  # set by resume_or_load: the run's identity, recorded with each save

    @property
    def resumed_start(self) -> int | None:
        """The iteration after the checkpoint :meth:`resume_or_load` resumed (where the training
        continues), or None when it resumed none."""
        return self._segment_start if self._resumed else None

    def has_checkpoint(self) -> bool:
        """Whether ``last_checkpoint`` names a checkpoint, or :meth:`resume_or_load` has resumed one
        (a run killed after saving its first checkpoint but before naming it): detectron2's trainers
        then continue at the checkpoint's iteration + 1, as its optimizer and scheduler states do."""
        return self._resumed or super().has_checkpoint()

    def save(self, name: str, **extra: Any) -> None:
        if not self.save_to_disk:  # another process of the run saves
            return
        _check_checkpoint_name(name, self.save_dir)
        if not self.save_dir:  # refused, not logged: fvcore's logger may have no handler outside a run
            raise GwdetValueError(f"Checkpoint {name!r} cannot be saved: the checkpointer has no save_dir (the folder "
                                  "to save into); nothing was written. Give one: ResilientCheckpointer(model, "
                                  "save_dir=...).")
        unexpanded = (unexpanded_variable_problem("save_dir", self.save_dir)
                      if "://" not in self.save_dir and not os.path.isdir(self.save_dir) else None)
        if unexpanded is not None:
            raise GwdetValueError(f"Checkpoint {name!r} cannot be saved: {unexpanded}")
        records = (NORM_TYPES_KEY, NORM_SETTINGS_KEY, CLASSES_KEY, DATA_KEY, INITIAL_WEIGHTS_KEY, RUN_SEGMENTS_KEY,
                   RUN_ID_KEY, INPUT_KEY, CHECKSUMS_KEY, STATE_CHECKSUMS_KEY)
        _check_extras(name, extra, ["model", *self.checkpointables, *records])
        if isinstance(name, str) and name.lower().endswith(".pth"):  # fvcore's save adds the suffix to any name
            raise GwdetValueError(f"Checkpoint {name!r} cannot be saved under that name: save() adds .pth itself, so "
                                  f"it would write {name}.pth; nothing was written. Give the name without the suffix: "
                                  f"save({name[:-4]!r}).")
        valueless = _meta_tensors(self.model)
        if valueless:
            raise GwdetValueError(
                f"Checkpoint {name!r} cannot be saved: {_on_meta(valueless)}, so there is nothing to save; nothing was "
                f"written. {_build_off_meta('save its weights once they are trained or loaded')}")
        non_finite = _non_finite_tensors(self.model) if "trainer" in self.checkpointables else []
        if non_finite:  # a training step that diverged after the loss detectron2 checks was computed
            raise NonFiniteWeightsError(
                f"checkpoint {name!r} was not saved: the model's weights hold NaN or inf in {len(non_finite)} "
                f"tensor(s) ({listed(non_finite, 3)}), which a model cannot compute with: a training step made them so "
                "(a learning rate too large for the model, or an input that is not finite).")
        try:
            settings = norm_settings(self.model, for_saving=True)
        except UnrecordableSettingError as error:
            raise UnrecordableSettingError(f"Checkpoint {name!r} cannot be saved; nothing was written. {error}") from None
        data = {"model": self.model.state_dict(), NORM_TYPES_KEY: norm_types(self.model), NORM_SETTINGS_KEY: settings}
        if "trainer" not in self.checkpointables:  # a training's model was checked above; this one is kept to debug
            _warn_non_finite_saved(name, os.path.join(self.save_dir, f"{name}.pth"), data["model"])
        if self.classes:
            data[CLASSES_KEY] = self.classes
        if self.training_data:
            data[DATA_KEY] = self.training_data
        if self.initial_weights:
            data[INITIAL_WEIGHTS_KEY] = self.initial_weights
        if self.segment:
            data[RUN_SEGMENTS_KEY] = self.run_segments()
        if self.run_id:
            data[RUN_ID_KEY] = self.run_id
        record = input_record(self.model)
        if record:
            data[INPUT_KEY] = record
        data.update({key: obj.state_dict() for key, obj in self.checkpointables.items()})
        data.update(extra)
        data = with_checksums(data)
        basename = f"{name}.pth"
        path = os.path.join(self.save_dir, basename)
        _keep_another_models_checkpoint(path, data)
        self.logger.info(f"Saving checkpoint to {path}")
        # a kill while saving leaves no record or a right one (read unchecked but for the checksums inside)
        write_with_checksum(path, lambda file: torch.save(data, file), self.path_manager)
        if self.run_id:
            record_run_id(self.save_dir, self.run_id)
        self.tag_last_checkpoint(basename)
        if self._folder_seen is not None:
            self._folder_seen = checkpoint_files(self.save_dir or "")

    def run_segments(self) -> list[dict]:
        """What each stretch of the run trained with: the resumed checkpoint's record (none for a
        checkpoint saved without it), then this process's ``segment``, each with the first iteration
        it trained (``from_iteration``)."""
        segment = self.segment() if callable(self.segment) else self.segment
        current = [{"from_iteration": self._segment_start, **segment}] if segment else []
        return [*self._earlier_segments, *current]

    def tag_last_checkpoint(self, last_filename_basename: str) -> None:
        """fvcore's ``last_checkpoint``, written atomically: a kill leaves the old or the new name,
        and a link in its place is replaced, not written through (the file it leads to is kept)."""
        path = os.path.join(self.save_dir, LAST_CHECKPOINT)
        if "://" in path:
            super().tag_last_checkpoint(last_filename_basename)
            return
        write_atomically(path, lambda file: file.write(last_filename_basename.encode("utf-8")))

    def resume_candidates(self) -> list[str]:
        """The paths of the checkpoints of ``save_dir`` in the order a resume tries them
        (:func:`~gwdet.checkpoint.resume_order.resume_order`): the one ``last_checkpoint`` names (when
        it is a file of the folder), then the others latest iteration first. A ``last_checkpoint``
        that cannot be read, is empty, holds no checkpoint's name or names a file outside the folder
        is passed over with a warning that says so."""
        order = resume_order(self.save_dir, tag_expected=self.has_checkpoint())
        if order.tag_problem is not None:
            logger.warning(order.tag_problem)
        return [os.path.join(self.save_dir, n) for n in order.names]

    def _recorded_run_ids(self, resumed: str) -> dict[str, str | None]:
        """The run identity each other checkpoint of ``save_dir`` than ``resumed`` records
        (:func:`~gwdet.checkpoint.run_identity.recorded_run_id`), by name; ``None`` for one that
        records none or cannot be read."""
        return {name: recorded_run_id(os.path.join(self.save_dir, name))
                for name in checkpoint_names(self.save_dir or "") if name != os.path.basename(resumed)}

    def _check_same_training_data(self, saved: Any, checkpoint: str) -> None:
        """Refuse to resume the checkpoint ``checkpoint``, whose run trained on the annotation files
        ``saved`` (:data:`DATA_KEY`; nothing is checked without a record), on a dataset of the same
        name whose annotation file now holds other contents (another ``--register-coco`` file)."""
        if not isinstance(saved, dict) or not self.training_data:
            return
        for name, now in self.training_data.items():
            before = saved.get(name)
            if not isinstance(before, dict) or None in (before.get("json_sha256"), now.get("json_sha256")):
                continue
            same_contents = before.get(CONTENTS_KEY) is not None and before.get(CONTENTS_KEY) == now.get(CONTENTS_KEY)
            if before["json_sha256"] != now["json_sha256"] and same_contents:
                logger.info(f"--resume: {now.get('json_file')} ({name!r}) was written again since the run read it, "
                            "with the same contents (formatted otherwise): resumed on it.")
            elif before["json_sha256"] != now["json_sha256"]:
                fix = (f"Give the shapes settings the run trained with (DATASETS.SHAPES.*, a LazyConfig's "
                       f"dataloader.shapes.*: its config.yaml), which generate {name!r}"
                       if name.startswith(SHAPES_PREFIX) else f"Register {name!r} from the same annotation file as before")
                raise GwdetValueError(
                    f"--resume: the run in {self.save_dir} trained on {name!r} from {before.get('json_file')} (SHA-256 "
                    f"{before['json_sha256'][:12]}...), but {name!r} is now {now.get('json_file')} with other contents "
                    f"(SHA-256 {now['json_sha256'][:12]}...): it would continue on other data than it started with "
                    f"({os.path.basename(checkpoint)}); nothing was trained. {fix}, or train on the new data into "
                    "another output folder.")
            prints, recorded = now.get(IMAGES_KEY), before.get(IMAGES_KEY)
            if isinstance(prints, bytes) and isinstance(recorded, bytes) and prints != recorded:
                changed = sum(a != b for a, b in zip_longest(split_fingerprints(prints), split_fingerprints(recorded)))
                raise GwdetValueError(
                    f"--resume: the run in {self.save_dir} trained on {name!r}, whose annotation file is as it was, but "
                    f"{changed} of its image files under {now.get('image_root')} now hold other contents (the same "
                    f"names; images exported or edited again): it would continue on other images than it started with "
                    f"({os.path.basename(checkpoint)}); nothing was trained. Put the images back as they were, or "
                    "train on the new images into another output folder.")

    def _check_same_processes(self, saved: Any, checkpoint: str) -> None:
        """Refuse to resume the checkpoint ``checkpoint``, trained by ``saved`` processes (its last
        run segment's, :data:`RUN_SEGMENTS_KEY`; nothing is checked without a record), with another number of
        processes where the model has norm layers with batch statistics over a process's own images
        (BN, BW, BGN, GhostBN; not synchronized batch norms): each would normalize over another
        share of the batch. Otherwise (per-image norms) the change is logged."""
        now = comm.get_world_size()
        if not isinstance(saved, int) or isinstance(saved, bool) or saved == now:
            return
        per_process = layer_types(batch_statistics=True) + TORCH_BATCH_NORMS
        layers = [name for name, module in self.model.named_modules()
                  if isinstance(module, per_process) and not isinstance(module, SYNCHRONIZED_NORMS)]
        if layers:
            raise GwdetValueError(
                f"--resume: the run in {self.save_dir} trained with {saved} process(es) ({os.path.basename(checkpoint)}), "
                f"but this resume has {now}: each process would train on another share of SOLVER.IMS_PER_BATCH, so the "
                f"norm layers with batch statistics ({listed(layers, 3)}) would normalize over other batches than the "
                f"run's, and its records would describe neither; nothing was trained. Resume with {saved} process(es) "
                f"(--num-gpus x --num-machines), or start a new run from its weights ({self.weights_setting} "
                f"{checkpoint}) into another output folder.")
        logger.warning(
            f"--resume with {now} process(es) of a run trained with {saved} ({os.path.basename(checkpoint)}): its norm "
            "layers normalize each image on its own, so the model trains on as before, with other random draws.")

    def load_weights(self, path: str) -> dict:
        """Initial weights (``MODEL.WEIGHTS``, or the setting ``weights_setting`` names), ``~`` and
        ``file://`` read as local paths (:func:`local_weights_path`): a missing local file is an error
        naming the fix. Only the weights are loaded, so a file whose training state was removed is
        accepted with a warning (:meth:`_load_file`)."""
        path = local_weights_path(path, self.weights_setting)
        file = without_query(path)
        if path and os.path.isdir(file):
            raise GwdetIsADirectoryError(
                f"{self.weights_setting} {path!r} is a folder: give the checkpoint file in it (e.g. "
                f"{os.path.join(path, 'model_final.pth')}).")
        if path and "://" not in path and not os.path.isfile(file):
            setting = self.weights_setting
            if os.path.lexists(file):
                raise GwdetValueError(f"{setting} {path!r} is not a regular file (a named pipe, a device, or a link "
                                      "that leads nowhere or in a loop): give the checkpoint file itself.")
            if self.require_every_weight:  # trained weights to evaluate or export
                fix = f"Name the trained weights, e.g. {as_override(setting, 'output/run/model_final.pth')}"
            else:
                empty = as_override(setting, '""')
                fix = (f"Convert ImageNet weights with tools/convert_pretrained.py IN OUT (see docs/weights.md), or "
                       f"set {empty} to train from scratch")
            raise GwdetFileNotFoundError(f"{setting} file {path!r} does not exist.{unexpanded_variable_note(path)} "
                                         f"{fix}.")
        local = (self.download(path) if "://" in path else file) if path else ""
        before = file_version(local) if local else None
        if path:
            self.initial_weights = dict(weights_record(local), path=path if "://" in path else os.path.abspath(path))
        self._loading_initial_weights = True
        try:
            loaded = self.load(path, checkpointables=[]) if path else {}
        finally:
            self._loading_initial_weights = False
        if before is not None and not same_file_version(before, file_version(local)):  # replaced or written since hashed
            raise GwdetRuntimeError(
                f"{self.weights_setting} {path} was replaced or written to while it was read (a conversion with "
                "--overwrite into it, or a copy?), so the weights loaded may not be those its SHA-256 records: "
                "nothing was trained or evaluated. Start again once the file is complete and stays as it is.")
        trained = loaded.get(CLASSES_KEY)
        if (self.classes and isinstance(trained, list) and trained != self.classes
                and sorted(map(str, trained)) == sorted(self.classes)):
            raise GwdetValueError(
                f"{self.weights_setting} {path} was trained on the classes {trained} (the order of its outputs), but "
                f"the training data has them in the order {self.classes} (by category id): the box and mask "
                "predictors would start on the wrong classes. Give the training json the category ids of the one the "
                "weights were trained on (the same id for each name).")
        return loaded

    def download(self, url: str) -> str:
        """The local copy of the weights at ``url`` (downloaded once into iopath's cache, where
        detectron2's ``load`` then finds it); :class:`WeightsDownloadError` naming the URL, the
        reason and the fix when it cannot be downloaded."""
        address = urlsplit(url)._replace(query="").geturl()  # detectron2 strips its ?matching_heuristics=
        try:
            local = self.path_manager.get_local_path(address)
        except OSError as error:  # urllib's URLError/HTTPError, socket errors, timeouts
            raise self._not_downloaded(url, address, getattr(error, "reason", None) or error) from None
        if not os.path.isfile(local):  # a scheme no handler reads: iopath takes it for a local path
            raise self._not_downloaded(url, address, f"{urlsplit(address).scheme}:// is not a scheme detectron2's "
                                       "PathManager reads here (it reads http://, https://, detectron2://, catalog:// "
                                       "and file://)")
        return local

    def _not_downloaded(self, url: str, address: str, reason: Any) -> WeightsDownloadError:
        """The refusal of weights at ``url`` that cannot be downloaded, for ``reason``: with the web
        address a ``catalog://`` or ``detectron2://`` name stands for (:func:`web_address`)."""
        web = web_address(address)
        name = os.path.basename(urlsplit(web).path) or "weights.pkl"
        at = f" ({web})" if web != address else ""
        return WeightsDownloadError(
            f"{self.weights_setting} {url} cannot be downloaded: {reason}. Without access to it from this "
            f"machine (no internet, a firewall, or a wrong address), download the file{at} on a machine that "
            f"has internet access, copy it here (e.g. to weights/{name}) and set {self.weights_setting} to "
            "that local file.")

    def check_no_earlier_run(self) -> None:
        """Refuse a new training into ``save_dir`` where it holds another run's checkpoints, which
        the training would replace (the tools refuse it before; a trainer of one's own code meets
        it here)."""
        earlier = checkpoint_names(self.save_dir) if self.save_dir else []
        if earlier:
            raise GwdetFileExistsError(
                f"{self.save_dir} holds the checkpoints of another run ({listed(earlier, 3)}), which a new training "
                "there would replace: continue that run (resume_or_load(resume=True); the tools' --resume), train "
                "into another output folder, or remove them (the tools' --overwrite).")

    def check_folder_unchanged(self) -> None:
        """Refuse a training where checkpoints appeared or changed in ``save_dir`` since
        :meth:`resume_or_load` (another trainer trained there in between, as two trainers built one
        after the other in a notebook can): the training would replace them."""
        if self._folder_seen is None or not self.save_to_disk:
            return
        now = checkpoint_files(self.save_dir or "")
        changed = [name for name in sorted(now) if self._folder_seen.get(name) != now[name]]
        if changed:
            raise GwdetFileExistsError(
                f"{self.save_dir} holds checkpoints written since this trainer's resume_or_load ({listed(changed, 3)}): "
                "another run trained there in between, and this training would replace its files. Build the trainer "
                "again and call resume_or_load(resume=True) to continue from them, or train into another output "
                "folder.")

    def resume_or_load(self, path: str, *, resume: bool = True) -> dict:
        """``resume``: the newest readable checkpoint of ``save_dir`` (:meth:`resume_candidates`),
        else the initial weights ``path``; without ``resume``, the initial weights, refused where
        ``save_dir`` holds another run's checkpoints, which the new training would replace. The
        folder's checkpoints are noted for :meth:`check_folder_unchanged`. The run's identity
        (:attr:`run_id`, :mod:`gwdet.checkpoint.run_identity`) is the resumed checkpoint's or the
        folder's, else a new one."""
        self.started = True
        self.run_id = None
        loaded = self._resume_or_load(path, resume)
        self.run_id = self.run_id or new_run_id()
        self._folder_seen = checkpoint_files(self.save_dir or "")
        return loaded

    def _resume_or_load(self, path: str, resume: bool) -> dict:
        if not resume:
            self.check_no_earlier_run()
            return self.load_weights(path)
        candidates = self.resume_candidates()
        for candidate in candidates:
            try:
                self._resuming = True
                try:
                    loaded = self.load(candidate)
                finally:
                    self._resuming = False
                lacking = [key for key in ("iteration", *self.checkpointables) if key not in self._file_keys]
                ours = checkpoint_names(self.save_dir or "") if lacking else []
                if ours and os.path.basename(candidate) not in ours:  # written by a hook's of one's own, say
                    raise GwdetValueError(
                        f"--resume: {self.save_dir}/{LAST_CHECKPOINT} names {os.path.basename(candidate)}, which holds "
                        f"no {', '.join(lacking)} state: another checkpointer wrote it (a hook of one's own, say), not "
                        f"the run's, so the run cannot continue from it. The run's checkpoints are {listed(ours, 3)}: "
                        f"write the name of the one to continue from into {LAST_CHECKPOINT} (e.g. {ours[-1]}), and let "
                        "other checkpointers save into a folder of their own (detectron2's name what they save in "
                        f"{LAST_CHECKPOINT}).")
                if lacking and NORM_TYPES_KEY not in self._file_keys and not {*lacking} & DETECTRON2_STATE:
                    raise GwdetValueError(
                        f"--resume: {candidate} was written by another trainer (detectron2's own tools, say: it holds "
                        f"detectron2's training state but no {', '.join(lacking)} state and none of gwdet's records), "
                        "so gwdet's tool cannot continue that run as it would have gone on. Continue it with the tool "
                        f"that trained it, or start a new run from its weights ({self.weights_setting} {candidate}) "
                        "into another output folder.")
                if lacking:  # a checkpoint slimmed to its weights: the schedule would restart
                    raise GwdetValueError(
                        f"--resume: {candidate} holds no {', '.join(lacking)} state (a checkpoint slimmed to its "
                        f"weights), so the run cannot continue from it: its iteration, schedule and momentum would "
                        f"start again. Start a new run from it ({self.weights_setting} {candidate}) into another output "
                        "folder, or restore the checkpoint as the run wrote it.")
                run_id = check_same_run(candidate, loaded.get(RUN_ID_KEY), self.save_dir or "", self.weights_setting,
                                        self._recorded_run_ids(candidate))
                _check_iteration_of_its_name(candidate, int(loaded["iteration"]), self.save_dir or "")
                self._check_same_training_data(loaded.get(DATA_KEY), candidate)
                recorded = loaded.get(INITIAL_WEIGHTS_KEY)
                self.initial_weights = recorded if isinstance(recorded, dict) else None
                segments = loaded.get(RUN_SEGMENTS_KEY)
                self._earlier_segments = [dict(item) for item in segments] if isinstance(segments, list) else []
                self._check_same_processes(self._earlier_segments[-1].get("processes") if self._earlier_segments
                                           else None, candidate)
                self._segment_start = int(loaded["iteration"]) + 1
                self._resumed = True
                self.run_id = run_id
                return loaded
            except (OSError, EOFError, RuntimeError, pickle.UnpicklingError, DamagedFileError) as err:
                if isinstance(err, UnsafeCheckpointError):
                    raise
                logger.warning(f"Cannot read checkpoint {candidate} ({err}); trying the previous one.")
        if candidates:
            raise GwdetRuntimeError(
                f"None of the checkpoints in {self.save_dir} can be read ({', '.join(candidates)}). "
                "Delete them to start over, or restore one from a backup."
            )
        if self.has_checkpoint():  # detectron2's trainers would start at iteration 1, not 0
            raise lost_checkpoint_error(self.save_dir, self.weights_setting)
        logger.warning(f"--resume: no checkpoint in {self.save_dir}; starting at iteration 0 "
                       f"from {self.weights_setting} ({path or 'none: random initialization'}).")
        return self.load_weights(path)

    def load(self, path: str | os.PathLike, checkpointables: list[str] | None = None) -> dict:
        """detectron2's ``load`` of the file ``path`` (a ``pathlib.Path`` too, ``~`` expanded; ``None``
        or ``""``: nothing); a folder is refused by name (detectron2 says the checkpoint is not found).
        ``checkpointables``: the names of the checkpointables to restore (``None``: all the file holds;
        ``[]``: the weights only); a name the checkpointer does not have, or one the file holds no
        state of, is refused before any weight is loaded.
        A load that raises leaves the checkpointer as it was, ready for the next one."""
        if path is not None and not isinstance(path, (str, os.PathLike)):
            raise GwdetTypeError(f"ResilientCheckpointer.load: give the checkpoint's path as a str or pathlib.Path, "
                                 f"not {type(path).__name__} {path!r}.")
        path = os.path.expanduser(os.fspath(path)) if path else ""  # detectron2's load takes no path as none
        if path and not path.strip():
            raise GwdetValueError(f"ResilientCheckpointer.load: the path {path!r} is blank: give the checkpoint's "
                                  "path, or \"\" (or None) to load nothing.")
        if path and os.path.isdir(path):
            raise GwdetIsADirectoryError(f"{path!r} is a folder: give the checkpoint file in it (e.g. "
                                         f"{os.path.join(path, 'model_final.pth')}).")
        file = without_query(path)
        if path and "://" not in path and not os.path.isfile(file) and os.path.lexists(file):
            raise GwdetValueError(f"ResilientCheckpointer.load: {path!r} is not a regular file (a named pipe, a device, "
                                  "or a link that leads nowhere or in a loop); nothing was loaded. Give the checkpoint "
                                  "file itself.")
        if path and "://" not in path and not os.path.lexists(file):  # fvcore: a bare AssertionError
            raise GwdetFileNotFoundError(
                f"ResilientCheckpointer.load: the checkpoint {path!r} does not exist"
                f"{f' (in {os.path.abspath(os.path.dirname(file))})' if not os.path.isabs(file) else ''}; nothing was "
                f"loaded.{unexpanded_variable_note(path)} Check the path: a training saves its checkpoints in its "
                "output folder as model_<iteration>.pth and model_final.pth (its last_checkpoint names the latest).")
        valueless = _meta_tensors(self.model) if path else []
        if valueless:
            raise GwdetValueError(
                f"ResilientCheckpointer.load: {path} cannot be loaded into the model: {_on_meta(valueless)}, so no "
                f"value could be loaded into them; nothing was loaded. {_build_off_meta('load the checkpoint into it')}")
        self._asked_checkpointables = self._checked_checkpointables(checkpointables)
        self._restoring = list(self.checkpointables) if checkpointables is None else self._asked_checkpointables
        self._loading = path
        watched = {key: _group_values(obj) for key, obj in self.checkpointables.items()
                   if self.compare_optimizer_values and isinstance(obj, torch.optim.Optimizer)}
        try:
            loaded = super().load(path, checkpointables)
            for key, before in watched.items():
                self._warn_of_replaced_group_values(key, path, before)
            return loaded
        finally:
            self._loading = None
            self._asked_checkpointables = []
            self._restoring = []
            self._parsed_url_during_load = None  # detectron2's load leaves it set when it raises: every later load failed

    def _warn_of_replaced_group_values(self, key: str, path: str, before: list[dict[str, Any]]) -> None:
        """Warn when loading ``path`` replaced the parameter groups' values of the optimizer
        checkpointable ``key`` (``before``: its values before the load) by the checkpoint's."""
        optimizer = self.checkpointables[key]
        changes = replaced_group_values(before, _group_values(optimizer))
        if not changes:
            return
        scheduled = any("initial_lr" in group for group in optimizer.param_groups)
        rate = (" (lr: the rate the run's LR scheduler had set when the checkpoint was saved; the scheduler sets the "
                "next ones from its base_lrs)" if scheduled and any(change.startswith("lr ") for change in changes)
                else "")
        logger.warning(
            f"ResilientCheckpointer.load: the {key!r} state of {path} replaced the optimizer's parameter-group values "
            f"by the checkpoint's, as torch's Optimizer.load_state_dict loads an optimizer state: {listed(changes, 6)}"
            f"{rate}. The optimizer trains on with the checkpoint's values, not those it was built with. To train "
            "with your own values, set them on optimizer.param_groups after the load (e.g. group['weight_decay'] = "
            "...; under an LR scheduler, its base_lrs for the rate), or resume with gwdet's Trainer / "
            "tools/train_net.py (LazyTrainer / tools/lazyconfig_train_net.py for a LazyConfig), which keep the "
            "config's values; ResilientCheckpointer(..., compare_optimizer_values=False) where your code sets them.")

    def _checked_checkpointables(self, checkpointables: Any) -> list[str]:
        """The checkpointables :meth:`load` is asked to restore by name (``None``: whichever the file
        holds, none asked); a name that is not one of this checkpointer's is refused (a typo would
        restore nothing without a word), and so is a str in place of a list."""
        if checkpointables is None:
            return []
        own = list(self.checkpointables)
        if isinstance(checkpointables, (str, bytes)) or not isinstance(checkpointables, (list, tuple)):
            example = [checkpointables] if isinstance(checkpointables, str) else own[:1]
            raise GwdetTypeError(
                f"ResilientCheckpointer.load: checkpointables must be a list of the names of the checkpointables to "
                f"restore, got {type(checkpointables).__name__} {checkpointables!r}; nothing was loaded. Give a list, "
                f"e.g. checkpointables={example!r} (None: all the file holds; []: the weights only).")
        unknown = [key for key in checkpointables if key not in self.checkpointables]
        if unknown:
            key = unknown[0]
            close = difflib.get_close_matches(str(key), own, n=1) if isinstance(key, str) else []
            raise GwdetValueError(
                f"ResilientCheckpointer.load: checkpointables names {key!r}, which is not one of this checkpointer's "
                f"checkpointables ({listed(map(repr, own), 8) if own else 'it has none'}), so nothing could restore it; "
                f"nothing was loaded.{did_you_mean(close)} Name checkpointables the checkpointer was given "
                "(ResilientCheckpointer(model, optimizer=..., scheduler=...)), or None to restore all the file holds.")
        return list(checkpointables)

    def _check_asked_checkpointables_held(self, checkpoint: dict) -> None:
        """Refuse a checkpoint that holds no state of a checkpointable :meth:`load` was asked for by
        name (detectron2 skips it without a word), before any weight is loaded; without names
        (``checkpointables=None``) whatever the file holds is restored."""
        absent = [key for key in self._asked_checkpointables if key not in checkpoint]
        if not absent:
            return
        held = [key for key in checkpoint if key in self.checkpointables]
        holds = (f"the state of {listed(map(repr, held), 8)} only" if held else
                 f"no checkpointable's state, only {listed(map(repr, map(str, checkpoint)), 8)}")
        rest = [key for key in self._asked_checkpointables if key not in absent]
        raise GwdetValueError(
            f"ResilientCheckpointer.load: {self._loading} holds no {listed(map(repr, absent), 8)} state, which "
            f"checkpointables={self._asked_checkpointables!r} asks to restore: it holds {holds}, saved by a "
            "checkpointer without it; nothing was loaded. Load a checkpoint saved with it, or leave it out "
            f"(checkpointables={rest!r}).")

    def _check_optimizer_states_fit(self, checkpoint: dict) -> None:
        """Refuse, before any weight is loaded, an optimizer state that the optimizer it would be
        restored into does not fit (:func:`optimizer_state_problem`): torch would refuse it after
        the model's weights were replaced, or load another model's buffers."""
        names = {id(parameter): name for name, parameter in unwrapped(self.model).named_parameters()}
        for key in self._restoring:
            problem = optimizer_state_problem(self.checkpointables.get(key), checkpoint.get(key), names)
            if problem:
                raise GwdetValueError(
                    f"ResilientCheckpointer.load: the {key!r} state in {self._loading} does not fit the optimizer given "
                    f"as {key!r}: {problem}. It was saved for another model or other trainable parameters (a frozen "
                    "backbone, MODEL.BACKBONE.FREEZE_AT, other SOLVER settings that group the parameters); nothing was "
                    f"loaded. Build the optimizer as the run that saved it did (gwdet.build_optimizer(cfg, model) with "
                    f"that run's config), or load the weights only (checkpointables=[]).")

    def _load_model(self, checkpoint: dict):
        self._check_asked_checkpointables_held(checkpoint)
        self._check_optimizer_states_fit(checkpoint)
        self._read_compiled_names(checkpoint)
        self._read_wrapped_records(checkpoint)
        self._check_some_weight_lands(checkpoint)
        metadata = read_conversion_metadata(checkpoint)
        if metadata is not None:
            check_conversion_metadata(metadata, self._loading)
            check_weights_fit_model(metadata, self.model, lazy=self.weights_setting.islower())
        weights = checkpoint.get("model")
        integers = _non_floating_weights(weights, self.model) if isinstance(weights, Mapping) else []
        if integers:
            shown = [f"{key}: {dtype} for the model's {own} {target}" for key, dtype, target, own in integers]
            raise GwdetValueError(
                f"{self._loading or 'The checkpoint'} holds integer or bool values for {len(integers)} floating-point "
                f"weight(s) of the model ({listed(shown, 3)}): they would load as the numbers they are (a quantized "
                "array without its scale, or float weights cast to integers, which truncates them); nothing was "
                "loaded. Save the weights as floating-point arrays (numpy's float32: dequantize quantized ones with "
                "their scale first), or convert the original weights again with tools/convert_pretrained.py.")
        self._check_backbone_shapes(checkpoint)
        self._check_norms(checkpoint, metadata is None)
        checkpoint.pop(NORM_TYPES_KEY, None)
        checkpoint.pop(NORM_SETTINGS_KEY, None)
        differences = input_differences(checkpoint.get(INPUT_KEY), self.model) if self.compare_input else []
        if differences:
            logger.warning(
                f"{self._loading} was trained with values this model has otherwise: {'; '.join(differences)}. The model "
                "computes with its own values, which changes its results; build it with those the weights were "
                "trained with (its input format, pixel mean and std, the ResNet's stride_in_1x1, the anchors, the FPN's "
                "fuse type, the box regressions' weights, the ROI heads' poolers and feature levels).")
        self._drop_records_of_reshaped_layers(checkpoint)
        incompatible = super()._load_model(checkpoint)
        classes, model = checkpoint.get(CLASSES_KEY), unwrapped(self.model)
        if self._loading_initial_weights and self.classes:  # a training's start: it learns its own data's classes
            setattr(model, CLASSES_ATTRIBUTE, list(self.classes))
        elif isinstance(classes, list) and all(isinstance(name, str) for name in classes):
            setattr(model, CLASSES_ATTRIBUTE, list(classes))
        elif hasattr(model, CLASSES_ATTRIBUTE):  # other weights now: what the attribute said no longer holds
            delattr(model, CLASSES_ATTRIBUTE)
        return incompatible

    def _check_some_weight_lands(self, checkpoint: dict) -> None:
        """Refuse, before loading, weights none of whose names is one of the model's (after the
        ``module.`` fvcore strips and the ``_orig_mod.`` :meth:`_read_compiled_names` strips), which
        fvcore's loading would leave all unloaded with a log line only: weights of the detector loaded
        into a ``torch.compile``d one or into a module holding it (``wrapper.det``). A model whose
        backbone weights the loading checks (:meth:`_log_incompatible_keys`) is refused there, and
        names matched by detectron2's heuristics (``.pkl`` files) are not compared here."""
        weights = checkpoint.get("model")
        if not isinstance(weights, dict) or not weights or checkpoint.get("matching_heuristics"):
            return
        model_keys = list(self.model.state_dict())
        if not model_keys or self._backbone_parameters():
            return
        keys = [str(key) for key in weights]
        if all(key.startswith(WRAPPER_PREFIX) or not key for key in keys):  # fvcore's loading strips it
            keys = [key.removeprefix(WRAPPER_PREFIX) for key in keys]
        held = set(keys)
        if held & set(model_keys):
            return
        named = self._loading or "The checkpoint"
        example = f"the file's keys are like {keys[0]!r}, the model's like {model_keys[0]!r}"
        outer = self._prefix_before(model_keys, held)
        inner = self._prefix_before(keys, set(model_keys))
        if outer is not None:
            module = f"model.{outer[:-1]}"
            what = ("the uncompiled module, which shares the torch.compile'd model's parameters"
                    if outer.endswith(COMPILED) else "the module the model holds (the detector of a wrapper)")
            fix = (f"The model's names carry the prefix {outer!r} that the file's lack: load into {what}, "
                   f"ResilientCheckpointer({module}), whose names are the file's.")
        elif inner is not None:
            fix = (f"The file's names carry the prefix {inner!r} the model's lack: save its weights with the prefix "
                   f"taken off ({{key.removeprefix({inner!r}): value for key, value in weights.items()}}) and load "
                   "that file.")
        else:
            fix = ("Give weights saved from a model of this architecture (its state_dict()), or build the model "
                   "they were saved from.")
        raise GwdetValueError(
            f"{named} holds none of the model's weights: no name of its {len(keys)} weights is one of the model's "
            f"{len(model_keys)} ({example}), so loading it would leave every weight as it is; nothing was loaded. {fix}")

    @staticmethod
    def _prefix_before(longer: Sequence[str], shorter: set[str]) -> str | None:
        """The prefix (``_orig_mod.``, ``det.``) that, put before the keys of ``shorter``, gives
        keys of ``longer``: for most of ``shorter``'s keys, and the same for each; None when none does."""
        found: dict[str, int] = {}
        for key in longer:
            for name in shorter:
                if key.endswith("." + name):
                    prefix = key[: -len(name)]
                    found[prefix] = found.get(prefix, 0) + 1
        if not found:
            return None
        prefix, count = max(found.items(), key=lambda item: item[1])
        return prefix if count * 2 >= len(shorter) else None

    def _drop_records_of_reshaped_layers(self, checkpoint: dict) -> None:
        """fvcore's loading skips, with a warning, the tensors whose shapes differ from the model's (a
        head made wider, whose layers a fine-tuning starts afresh, as it does batch norms'). The
        settings record of a gwdet layer whose tensors are skipped so (another channel count) is
        dropped with them: the layer keeps its own settings and initial values, instead of the
        record refusing the whole file."""
        weights = checkpoint.get("model")
        if not isinstance(weights, dict):
            return
        own = unwrapped(self.model).state_dict()
        for key in [key for key in weights if key.endswith("." + EXTRA_STATE_KEY)]:
            prefix = key[: -len(EXTRA_STATE_KEY)]
            layer = prefix.removeprefix("module.")
            if any(name != key and name.startswith(prefix) and layer + name[len(prefix):] in own
                   and tuple(getattr(value, "shape", ())) != tuple(own[layer + name[len(prefix):]].shape)
                   for name, value in weights.items()):
                del weights[key]

    def _check_backbone_shapes(self, checkpoint: dict) -> None:
        """Refuse weights whose backbone weights of the model's names have other shapes (a ResNet of
        another depth or width), before the norm layers' recorded settings (which then differ too)
        are compared while loading; names matched by detectron2's heuristics are compared after."""
        weights = checkpoint.get("model")
        if not isinstance(weights, dict) or checkpoint.get("matching_heuristics"):
            return
        backbone, state = self._backbone_parameters(), self.model.state_dict()
        other_shapes = [(key, tuple(weights[key].shape), tuple(state[key].shape)) for key in backbone
                        if hasattr(weights.get(key), "shape") and tuple(weights[key].shape) != tuple(state[key].shape)]
        if other_shapes:
            raise _other_backbone_shapes(other_shapes, len(backbone))

    def _check_norms(self, checkpoint: dict, unconverted: bool) -> None:
        """The checkpoint's norm layers against the model's: their types and settings as gwdet's
        checkpointer records them, the settings gwdet's layers record in the weights, batch norm
        statistics for layers without any, and (``unconverted`` files without gwdet's records, or whose
        record of norm types has no norm layer at their places) gwdet layers' weights without settings.
        A finding is refused; with ``GWDET_ALLOW_NORM_MISMATCH=1`` it is logged as a warning (the weights
        then load, the layers' records dropped)."""
        checks: list[Callable[[], None]] = []
        if isinstance(checkpoint.get(NORM_TYPES_KEY), dict):
            settings = checkpoint.get(NORM_SETTINGS_KEY)
            checks.append(lambda: check_norm_types(checkpoint[NORM_TYPES_KEY], self.model, _MISMATCH_OPT_IN,
                                                   settings if isinstance(settings, dict) else None))
        if isinstance(checkpoint.get(NORM_SETTINGS_KEY), dict):
            types = checkpoint.get(NORM_TYPES_KEY)
            checks.append(lambda: check_norm_settings(checkpoint[NORM_SETTINGS_KEY], self.model, _MISMATCH_OPT_IN,
                                                      types if isinstance(types, dict) else None))
        weights = checkpoint.get("model")
        if isinstance(weights, dict):  # the settings gwdet's layers record in the weights
            checks.append(lambda: check_layer_settings(weights, self.model, _MISMATCH_OPT_IN))
            checks.append(lambda: check_statistics_have_a_layer(weights, self.model, _MISMATCH_OPT_IN))
            types_recorded = isinstance(checkpoint.get(NORM_TYPES_KEY), dict)
            if unconverted and not types_recorded:
                checks.append(lambda: check_unrecorded_weights(weights, self.model, _MISMATCH_OPT_IN))
                checks.append(lambda: check_statistics_in_weights(weights, self.model, _MISMATCH_OPT_IN,
                                                                  bool(checkpoint.get("matching_heuristics"))))
            elif unconverted and not isinstance(checkpoint.get(NORM_SETTINGS_KEY), dict):  # types, no settings
                checks.append(lambda: check_unrecorded_weights(weights, self.model, _MISMATCH_OPT_IN,
                                                               types_recorded=True))
            elif unconverted:  # types and settings: gwdet layers at places whose record has no norm layer
                checks.append(lambda: check_unrecorded_weights(weights, self.model, _MISMATCH_OPT_IN,
                                                               saved_types=checkpoint[NORM_TYPES_KEY]))
        allowed = mismatch_allowed()
        for check in checks:
            try:
                check()
            except GwdetValueError as error:
                if not allowed:
                    raise
                finding = error.finding if isinstance(error, NormMismatchError) else str(error)
                logger.warning(f"{MISMATCH_ENV}=1: {self._loading or 'the checkpoint'} is loaded as asked, though "
                               f"its norm layers differ from the model's: {finding}.")
        if isinstance(checkpoint.get(NORM_SETTINGS_KEY), dict):
            self._warn_of_uncompared_settings(checkpoint[NORM_SETTINGS_KEY], checkpoint.get(NORM_TYPES_KEY))
        if isinstance(weights, dict) and not isinstance(checkpoint.get(NORM_SETTINGS_KEY), dict):
            # after the checks: weights of other layers (GW's, loaded into GroupNorm) are refused above, not named here
            unchecked = unrecorded_group_norms(weights, self.model)
            if unchecked:
                logger.warning(
                    f"{self._loading or 'The checkpoint'} holds the weights of {len(unchecked)} GroupNorm layer(s) "
                    f"({listed(unchecked, 3)}) without gwdet's record of their group numbers (a file gwdet's "
                    "checkpointer did not write, e.g. detectron2's): they load unchecked into this config's groups. "
                    "Give the group number they were trained with (MODEL.GN.NUM_GROUPS; a norm of one's own: its own key; a "
                    "LazyConfig's num_groups).")
        if allowed and isinstance(weights, dict):
            drop_layer_settings(weights, self.model)

    def _warn_of_uncompared_settings(self, saved: dict, types: Any) -> None:
        """Warn once, naming the layers, the norm names and the values, of the recorded norm values
        that no layer of the model holds to compare them with: a registered norm's layer built
        without :func:`gwdet.norm` (:func:`~gwdet.checkpoint.compatibility.uncompared_norm_settings`),
        which loads weights trained with any such values."""
        found = uncompared_norm_settings(saved, self.model, types if isinstance(types, dict) else None)
        if not found:
            return
        shown = [f"{item.layer} ({item.kind}" + (f", of the norm {' or '.join(map(repr, item.names))}" if item.names
                                                 else "") + "): "
                 + ", ".join(f"{key} {value!r}" for key, value in item.values.items()) for item in found]
        first = found[0]
        given = ", ".join(f"{key}={value!r}" for key, value in first.values.items())
        example = f"gwdet.norm({first.names[0] if first.names else 'NAME'!r}, {given})(channels)"
        logger.warning(
            f"{self._loading or 'The checkpoint'} records norm values that were not compared for {len(found)} layer(s) "
            f"of this model ({listed(shown, 3, '; ')}): the model's layer records no settings of its norm (it was built "
            "without gwdet.norm), so it loads weights trained with other values just as well. To have them "
            f"compared, build the layer with gwdet.norm (e.g. {example}, or a config's NORM key naming the "
            "norm), which records the values it builds with.")

    def _read_wrapped_records(self, checkpoint: dict) -> None:
        """gwdet's records of the norm layers (:data:`NORM_TYPES_KEY`, :data:`NORM_SETTINGS_KEY`) of
        weights whose every name starts with ``module.`` (saved from a model held by a wrapper other
        than DDP or DataParallel, whose ``module.`` these records keep too) are read without it, as
        fvcore's loading reads those weights: the records are then compared with the layers the
        weights load into."""
        weights = checkpoint.get("model")
        if not isinstance(weights, dict) or not weights or not all(
                isinstance(key, str) and (not key or key.startswith(WRAPPER_PREFIX)) for key in weights):
            return
        for record in (NORM_TYPES_KEY, NORM_SETTINGS_KEY):
            names = checkpoint.get(record)
            if isinstance(names, dict) and names and all(isinstance(key, str) and key.startswith(WRAPPER_PREFIX)
                                                         for key in names):
                checkpoint[record] = {key.removeprefix(WRAPPER_PREFIX): value for key, value in names.items()}

    def _read_compiled_names(self, checkpoint: dict) -> None:
        """Weights saved from a ``torch.compile``d module (or submodule) carry ``_orig_mod.`` in
        their names; loaded into a model that is not compiled there, they are read without it (the
        same weights, as detectron2 reads DDP's ``module.``), and the log says so."""
        weights = checkpoint.get("model")
        if not isinstance(weights, dict) or any(COMPILED in key for key in self.model.state_dict()):
            return
        found = False
        for record in ("model", NORM_TYPES_KEY, NORM_SETTINGS_KEY):  # the weights and gwdet's records of their layers
            names = checkpoint.get(record)
            if not isinstance(names, dict):
                continue
            renamed = {without_compiled(key): value for key, value in names.items()}
            if renamed.keys() != names.keys() and len(renamed) == len(names):
                checkpoint[record], found = renamed, True
        if found:
            logger.info(f"The weights were saved from a torch.compile'd module: their names are read without "
                        f"{COMPILED!r}.")

    def _backbone_parameters(self) -> list[str]:
        """Names of the parameters of the model's bottom-up network (the ResNet of an FPN backbone,
        or the whole backbone), as they appear in the model's state dict."""
        backbone = getattr(self.model, "backbone", None)
        if backbone is None:
            return []
        prefix = "backbone.bottom_up." if hasattr(backbone, "bottom_up") else "backbone."
        return [name for name, _ in self.model.named_parameters() if name.startswith(prefix)]

    def _log_incompatible_keys(self, incompatible) -> None:
        backbone = self._backbone_parameters()
        in_backbone = set(backbone)
        missing = [key for key in incompatible.missing_keys if key in in_backbone]
        other_shapes = [(key, tuple(saved), tuple(present)) for key, saved, present in incompatible.incorrect_shapes
                        if key in in_backbone]
        if missing and other_shapes:  # detectron2 lists a weight of another shape as missing too
            raise _other_backbone_shapes(other_shapes, len(backbone))
        if missing:
            outcome = ("the model would run with" if self.require_every_weight else "training would start from")
            deeper = _deeper_stage(backbone, missing)
            if deeper is not None:
                stage, held, built = deeper
                raise GwdetValueError(
                    f"The weights leave {len(missing)} of the backbone's {len(backbone)} weights unloaded (e.g. "
                    f"{missing[0]}), so {outcome} a partly random backbone: they hold {held} blocks of {stage}, the "
                    f"model has {built}. The model's ResNet is deeper than the one they were trained with: give its "
                    "depth (MODEL.RESNETS.DEPTH; a LazyConfig's ResNet depth).")
            hint = _unloaded_backbone_hint(list(incompatible.unexpected_keys), missing, len(backbone),
                                           set(self.model.state_dict()))
            raise GwdetValueError(
                f"The weights leave {len(missing)} of the backbone's {len(backbone)} weights unloaded (e.g. "
                f"{missing[0]}), so {outcome} a partly random backbone.{hint} Convert ImageNet "
                "weights with tools/convert_pretrained.py IN OUT and give OUT as MODEL.WEIGHTS (docs/weights.md), "
                "or set MODEL.WEIGHTS \"\" to train from scratch.")
        if self.require_every_weight and (incompatible.missing_keys or incompatible.incorrect_shapes):
            reshaped = {key for key, _, _ in incompatible.incorrect_shapes}  # detectron2 lists them missing too
            problems = [f"missing: {key}" for key in incompatible.missing_keys if key not in reshaped]
            problems += [f"{key}: shape {tuple(ck)} in the checkpoint, {tuple(mk)} in the model"
                         for key, ck, mk in incompatible.incorrect_shapes]
            masks = incompatible.missing_keys and all(key.startswith("roi_heads.mask_head.")
                                                      for key in incompatible.missing_keys)
            hint = (" The weights have no mask head: they were trained without masks (MODEL.MASK_ON False; a "
                    "LazyConfig's model without roi_heads.mask_head): evaluate them so." if masks else "")
            raise GwdetValueError(
                f"The checkpoint {self._loading or ''} ({self.weights_setting}) does not hold every weight of the "
                f"model ({len(problems)} problems: {listed(problems, 4, '; ')}); {self.incomplete_outcome}.{hint} "
                f"Give weights trained with this config: a training run's model_final.pth "
                "(converted ImageNet weights hold the backbone only)."
            )
        if self.require_every_weight:
            self._check_every_weight_used(unused_weights(incompatible.unexpected_keys))
        super()._log_incompatible_keys(incompatible)

    def _check_every_weight_used(self, unused: Sequence[str]) -> None:
        """Refuse, where every weight is required (evaluation, export), a checkpoint holding weights
        ``unused`` the model has no place for (trained with a deeper head: ``MODEL.ROI_BOX_HEAD.NUM_CONV``
        4 evaluated with 2): the model run would be another one than the one trained. Weights of a
        whole ``*_head`` the model does not build (a mask head's, evaluated with ``MODEL.MASK_ON
        False``) leave the rest of the trained model as it was: they are left out with a warning."""
        if not unused:
            return
        named = f"{self._loading or 'The checkpoint'} ({self.weights_setting})"
        lazy = self.weights_setting.islower()
        heads = [absent_head(self.model, key) for key in unused]
        if all(heads):
            for head in dict.fromkeys(str(head) for head in heads):
                count = sum(found == head for found in heads)
                settings = _OPTIONAL_HEADS.get(head.rsplit(".", 1)[-1])
                built = f" (it is built without it: {settings[lazy]})" if settings else ""
                logger.warning(
                    f"{named} holds the weights of {head} ({count} weights), which this model does not have{built}: "
                    f"they are left out, and the model runs without that head, its other weights the trained ones. "
                    f"Build the model with that head to use them.")
            return
        layers = list(dict.fromkeys(key.rsplit(".", 1)[0] for key in unused))
        held = numbered_layers_held(unused, list(self.model.state_dict()), lazy)
        values = (f"here {' and '.join(held)}" if held else
                  f"e.g. {'model.roi_heads.box_head.conv_dims' if lazy else 'MODEL.ROI_BOX_HEAD.NUM_CONV'} for the box "
                  "head's convolutions")
        raise GwdetValueError(
            f"{named} holds {len(unused)} weights that the model does not use, of {len(layers)} layers it does not "
            f"have ({listed(layers, 4)}): without these trained layers the model would be another one than the one "
            "trained, and its results not the weights'. Build the model they were trained with: give the config.yaml "
            f"that their training wrote into its output folder as the config, or its values ({values}).")

    def _load_file(self, filename: str) -> dict:
        """The file's contents, checked against the SHA-256 recorded beside it (``<file>.sha256``,
        where there is one) and the checksums recorded inside it (:mod:`gwdet.checkpoint.integrity`)."""
        record = shown_record(filename)
        unusable, differs = checksum_findings(filename)
        if unusable is not None:  # the checksums inside the file still check it
            logger.warning(f"{filename}: {unusable}, so the file is checked by the checksums recorded inside it "
                           f"only. Delete {record} to load it without this warning.")
        elif differs is not None:
            raise DamagedFileError(
                f"{filename} is damaged ({differs}); nothing was loaded from it. Restore the file from a copy or write "
                f"it again (train, or convert the weights again); if you replaced it on purpose, delete {record}. "
                "A training's --resume uses the previous checkpoint in the folder instead. (A checkpointer other than "
                "gwdet's writing a file of the same name, as detectron2's PeriodicCheckpointer in a hook of one's own "
                f"does with its prefix 'model', leaves {record} behind: give it a prefix of its own.)", filename)
        heuristics = self._heuristics_asked(filename)  # another query: named here (detectron2: a bare ValueError)
        if filename.endswith(".pkl"):
            data = load_pickle_weights(filename)
            _check_holds_weights(filename, data)
            if "model" in data and isinstance(data["model"], dict) and "__author__" not in data:
                data = {**data, "__author__": "unknown"}  # detectron2's layout ({"model": arrays}) without its author
            elif not ("model" in data and "__author__" in data):
                data = {"model": data, "__author__": "unknown", "matching_heuristics": True}
            if heuristics:  # detectron2's own reading honours the query for .pth files only
                data = {**data, "matching_heuristics": True}
        else:
            data = super()._load_file(filename)  # calls _torch_load
        removed = verify_checksums(filename, data, accept_removed_state=self._loading_initial_weights)
        if removed:
            were = "was" if len(removed) == 1 else "were"
            logger.warning(
                f"{filename}: {', '.join(removed)} {were} removed from the file after gwdet wrote it (as when a "
                "checkpoint's training state is removed to publish its weights). Its weights match the checksums "
                f"recorded with them and are loaded as {self.weights_setting}; the file cannot continue a training "
                "with --resume.")
        data.pop(CHECKSUMS_KEY, None)
        data.pop(STATE_CHECKSUMS_KEY, None)
        if isinstance(data.get("model"), torch.nn.Module):  # torch.save({"model": model}), read with the unsafe opt-in
            logger.warning(f"{filename} holds a whole pickled {type(data['model']).__name__} under 'model', not "
                           "its state dict: its state dict is loaded (save model.state_dict() to load the file "
                           "without unpickling code).")
            data["model"] = data["model"].state_dict()
        self._file_keys = set(data)  # what the file holds, before load() takes the checkpointables out
        _check_finite_weights(filename, data, self.weights_setting if self._loading_initial_weights else "",
                              self.save_dir if self._resuming else None)
        return data

    def _heuristics_asked(self, filename: str) -> bool:
        """Whether the path being loaded asks for detectron2's name-matching heuristics
        (``?matching_heuristics=True``, which detectron2's own reading honours for ``.pth`` files
        only); another query is refused, as detectron2 refuses it."""
        address = self._parsed_url_during_load
        queries: dict[str, list[str]] = parse_qs(address.query) if address is not None else {}
        value = queries.pop("matching_heuristics", ["False"])
        if queries or value not in (["True"], ["False"]):  # detectron2 takes "True" only, and "true" as no
            asked = sorted(queries) or [f"matching_heuristics={value[-1]}"]
            raise GwdetValueError(
                f"{filename}: the query {asked} of {address.geturl() if address else filename} is not one "
                "detectron2's checkpointer reads (it reads ?matching_heuristics=True only, spelled so): remove it.")
        return value == ["True"]

    def _torch_load(self, f: str) -> Any:
        """The ``torch.save`` file ``f``, read without executing code; one cut short or damaged (torch's
        reader raises a ``RuntimeError``, ``EOFError``, unpickling error or a plain ``OSError``, as
        ``[Errno 22] Invalid argument`` for an archive cut inside its tensors) is a
        :class:`DamagedFileError` naming it, and so is a file cut before the first bytes every
        ``torch.save`` file starts with (an empty one included)."""
        held = cut_within_magic(f)
        if held is not None:
            raise _damaged(f, "the file is empty: 0 bytes" if held == 0 else
                           f"the file ends after {held} byte(s), within the first bytes of a torch.save file")
        try:
            data = load_torch_checkpoint(f)
            _check_holds_weights(f, data)
            return data
        except (RuntimeError, EOFError, pickle.UnpicklingError, OSError) as error:
            if isinstance(error, GwdetError):  # not a checkpoint, or one that needs unsafe loading: named already
                raise
            if isinstance(error, OSError) and type(error) is not OSError:  # not found, permission denied: no damage
                raise
            raise _damaged(f, error) from error
