"""Reading a torchvision-layout ImageNet checkpoint into a flat ``{name: tensor}`` state dict.

Files are read with ``torch.load(path, map_location="cpu", weights_only=True)``, which unpickles
only tensors and plain containers. A file that needs anything else (a class of the training code,
``argparse.Namespace``, a whole pickled ``nn.Module``) is refused with :class:`ConversionError`
unless the caller opts in with ``allow_unsafe_pickle=True``: full unpickling can run arbitrary
code, so that is for files from a trusted source only; so is a plain pickle of tensors (``pickle.dump``, not
``torch.save``), which only full unpickling reads.

The state dict may be the file's top-level object, or sit under ``"state_dict"`` or ``"model"``
(the layouts of ImageNet training scripts; a file with two different networks under both is refused,
since which one is meant cannot be told, while one network under both, with or without ``module.``
prefixes, is converted); ``module.`` prefixes left by ``DataParallel`` are removed.
"""
from __future__ import annotations

import errno
import os
import pickle
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch

from gwdet.utils.cli_errors import file_url_path, unexpanded_variable_note
from gwdet.layers.common import check_flag
from gwdet.errors import GwdetError, GwdetTypeError, listed
from gwdet.checkpoint.converted_weights import (ARCH_FIELD, AUTHOR_KEY, GW_POSITIONS_FIELD, SOURCE_FIELD, WEIGHTS_KEY,
                                               read_conversion_metadata)
from gwdet.checkpoint.safe_load import (SAFETENSORS_FIX, PickleProtocolError, UnsafeCheckpointError, is_numpy_archive,
                                        is_safetensors_file, is_torch_save_zip, is_torchscript_archive, load_pickle_file,
                                        load_torch_file, packed_file_problem, plain_pickle_globals,
                                        starts_like_torch_save_output, valueless_tensors_problem)

DATA_PARALLEL_PREFIX = "module."
STATE_DICT_ENTRIES = ("state_dict", "model")
UNSAFE_PICKLE_FLAG = "--allow-unsafe-pickle"



class ConversionError(GwdetError, ValueError):
    """A checkpoint cannot be converted; the message says what is wrong and how to fix it."""


@dataclass(frozen=True)
class SourceStateDict:
    """The tensors of a source checkpoint and where in the file they were found."""

    tensors: dict[str, torch.Tensor]
    wrapping: str  # "bare state_dict", "'state_dict' entry", "'model' entry", "pickled nn.Module"
    stripped_prefix: str  # "module." (repeated if nested) when removed, else ""


def read_source_state_dict(
    path: str | os.PathLike, allow_unsafe_pickle: bool = False
) -> SourceStateDict:
    """Load ``path`` and return its state dict, unwrapped and without ``module.`` prefixes.

    Raises:
        ConversionError: the path is not a readable file, the file is truncated or not a PyTorch
            checkpoint, it needs unsafe unpickling and ``allow_unsafe_pickle`` is false, or it
            holds no state dict; ``ValueError``: ``allow_unsafe_pickle`` is not True or False (``'no'``
            would be read as true, and unpickle a file that may run code).
    """
    check_flag("read_source_state_dict", "allow_unsafe_pickle", allow_unsafe_pickle)
    if not isinstance(path, (str, os.PathLike)):
        raise GwdetTypeError(f"read_source_state_dict: path must be the checkpoint file's path (a str or "
                             f"pathlib.Path), got {path!r} ({type(path).__name__}); for a state dict in memory, use "
                             "convert_state_dict(SourceStateDict(tensors=state_dict, wrapping='bare state_dict', "
                             "stripped_prefix='')).")
    path = local_input_path(os.fspath(path))
    _check_readable_file(path)
    loaded = _numpy_arrays_as_tensors(_torch_load(path, allow_unsafe_pickle))
    tensors, wrapping = _unwrap_state_dict(path, loaded)
    valueless = valueless_tensors_problem(tensors)
    if valueless is not None:
        raise ConversionError(f"{path}: {valueless} and convert that file.")
    tensors, stripped_prefix = _strip_data_parallel_prefix(tensors)
    return SourceStateDict(tensors=tensors, wrapping=wrapping, stripped_prefix=stripped_prefix)


def _numpy_arrays_as_tensors(loaded: Any) -> Any:
    """``loaded`` with the numeric numpy arrays of a dict, and of the dicts it holds (a state dict
    under 'state_dict' or 'model'), as tensors of their values and dtypes: a state dict saved as
    numpy arrays (``torch.save({k: v.numpy() ...})``), once unpickled, reads as one of tensors, as
    :func:`gwdet.convert.convert_state_dict` reads numpy arrays. Anything else is kept as it is."""
    def as_tensor(value: Any) -> Any:
        if isinstance(value, np.ndarray) and value.dtype.kind in "biufc":
            native = np.ascontiguousarray(value).astype(value.dtype.newbyteorder("="), copy=False)
            return torch.from_numpy(native.copy() if not native.flags.writeable else native)
        return value

    if not isinstance(loaded, Mapping) or isinstance(loaded, torch.nn.Module):
        return loaded
    return {key: ({inner: as_tensor(item) for inner, item in value.items()} if isinstance(value, dict)
                  else as_tensor(value)) for key, value in loaded.items()}


STANDARD_STREAM_PATH = "-"  # what many commands read as standard input (or write as standard output)


def refuse_standard_input(path: str) -> None:
    """Refuse the input path ``-``, which many commands read as standard input: the converter reads
    the checkpoint from a file (torch.load seeks in it), so the message asks for the file's path."""
    if path == STANDARD_STREAM_PATH:
        raise ConversionError(
            "the input path is '-', which many commands read as standard input, but the converter reads the "
            "checkpoint from a file, not from a stream: save the checkpoint to a file (e.g. r50.pth) and give its "
            "path (a file named '-' is given as ./-); nothing was converted.")


def local_input_path(path: str) -> str:
    """``path`` with a ``file://`` URL of this host turned into its path (detectron2's
    ``PathManager`` has no handler for ``file://``); any other path as it is. The path ``-``
    (standard input to many commands) is refused (:func:`refuse_standard_input`)."""
    refuse_standard_input(path)
    local, host = file_url_path(path)
    if host is not None:
        raise ConversionError(
            f"{path} names a file on the host {host!r}, which cannot be read from here (a file:// URL of "
            "this machine is file:///PATH, with three slashes). Copy the file to this machine and give its path.")
    return local


def _check_readable_file(path: str) -> None:
    if not path.strip():
        what = "is empty" if not path else f"is blank ({path!r})"
        raise ConversionError(
            f"the input path {what} (IN on the command line, input_path in Python; an unset shell variable, as in "
            "\"$IN\"?): give the checkpoint file to convert, e.g. resnet50.pth.")
    if "://" in path and not os.path.exists(path):
        raise ConversionError(
            f"{path}: the converter reads a local file, not a URL. Download it first (e.g. wget {path}, or in Python "
            "torch.hub.download_url_to_file(URL, 'weights.pth')), then give the downloaded file.")
    if not os.path.exists(path):
        if path.endswith(os.sep) and os.path.isfile(path.rstrip(os.sep)):  # a shell's completion of a folder, say
            raise ConversionError(f"{path}: names the file {path.rstrip(os.sep)} with a '{os.sep}' after it, which "
                                  "makes it a folder's path: give it without the trailing slash.")
        broken = broken_link(path)
        if broken is not None:
            meant = ("the checkpoint (ln -sfn /path/to/checkpoint.pth" if broken.link == path else
                     "the folder meant (ln -sfn /path/to/folder")
            raise ConversionError(
                f"{path}: {broken.describe(path)}: it leads to no file to read. Point the link at {meant} "
                f"{broken.link}), or give the checkpoint's own path.")
        _check_surrounding_whitespace(path)
        unexpanded = unexpanded_variable_note(path)  # a quoted '$HOME/r50.pth', or '~/r50.pth' in Python
        raise ConversionError(f"{path}: no such file." + (unexpanded or " Check the input path."))
    if not os.path.isfile(path):
        raise ConversionError(f"{path}: not a regular file. Pass the checkpoint file itself.")
    if not os.access(path, os.R_OK):
        raise ConversionError(f"{path}: permission denied. Make the file readable for this user.")
    if os.path.getsize(path) == 0:
        raise ConversionError(f"{path}: the file is empty (an interrupted download?).")
    packed = packed_file_problem(path)
    if packed is not None:
        raise ConversionError(packed)
    if is_torchscript_archive(path):
        raise ConversionError(
            f"{path}: a TorchScript model (written by torch.jit.save, e.g. an exported model.ts), not a "
            "checkpoint: its weights are compiled into the model. Convert the torch.save checkpoint (a "
            "state dict) the model was made from."
        )


def _check_surrounding_whitespace(path: str) -> None:
    """A ``ConversionError`` for a ``path`` that does not exist while the same path without its
    leading or trailing whitespace (a space or newline a quoted or pasted path kept) does, naming
    that whitespace and the file."""
    stripped = path.strip()
    if stripped == path or not os.path.exists(stripped):
        return
    leading, trailing = path[:len(path) - len(path.lstrip())], path[len(path.rstrip()):]
    where = " and ".join([*([f"starts with {leading!r}"] if leading else []),
                          *([f"ends in {trailing!r}"] if trailing else [])])
    raise ConversionError(
        f"{path!r}: no such file, but {stripped!r} exists: the path {where} (whitespace that a quoted or pasted path "
        "keeps). Give the path without it.")


SYMLINK_HOPS = 40  # Linux's limit on the links one path may go through (ELOOP beyond it)


@dataclass(frozen=True)
class BrokenLink:
    """A symbolic link through which a path leads to no file."""

    link: str  # the path itself, or the first of its folders that is the broken link
    loops: bool  # True: the links lead back to one already followed; False: to a path that does not exist
    followed: list[str]  # the link, then each target read: ['a.pth', 'b.pth', 'a.pth']

    def describe(self, path: str) -> str:
        """What the link is, for a message about ``path``: ``"a symbolic link that loops ('a.pth' ->
        'b.pth' -> 'a.pth')"``, ``"its folder F is a symbolic link to 'x', which does not exist"``."""
        what = "" if self.link == path else f"its folder {self.link} is "
        chain = " -> ".join(repr(step) for step in self.followed)
        if self.loops:
            return f"{what}a symbolic link that loops ({chain})"
        if len(self.followed) == 2:
            return f"{what}a symbolic link to {self.followed[1]!r}, which does not exist (a dangling link)"
        return f"{what}a symbolic link that ends at {self.followed[-1]!r}, which does not exist (a dangling link: {chain})"


def broken_link(path: str) -> BrokenLink | None:
    """The symbolic link through which ``path`` leads to no file, when there is one: ``path`` itself
    or the first of its folders that is a link, whose links loop or end at a path that does not exist
    (a dangling link). None when ``path`` exists, or is missing without a broken link on the way."""
    try:
        os.stat(path)
        return None
    except OSError as error:
        if error.errno not in (errno.ELOOP, errno.ENOENT):
            return None
    parts = [path]
    while os.path.dirname(parts[-1]) not in ("", parts[-1]):
        parts.append(os.path.dirname(parts[-1]))
    link = next((part for part in reversed(parts) if os.path.islink(part) and not os.path.exists(part)), None)
    if link is None:
        return None
    followed, seen, current = [link], set(), link
    while os.path.islink(current) and len(followed) <= SYMLINK_HOPS:
        place = os.path.join(os.path.realpath(os.path.dirname(current) or "."), os.path.basename(current))
        if place in seen:
            break
        seen.add(place)
        target = os.readlink(current)
        followed.append(target)
        current = os.path.join(os.path.dirname(current), target)
    return BrokenLink(link=link, loops=os.path.islink(current), followed=followed)


def _torch_load(path: str, allow_unsafe_pickle: bool) -> Any:
    """``torch.load`` to CPU, weights-only unless opted out; any failure becomes ConversionError. A
    plain pickle of torch objects (``pickle.dump``, not ``torch.save``) is unpickled in full with
    ``allow_unsafe_pickle``, and refused without it."""
    _check_zip_written_by_torch_save(path)
    needed = plain_pickle_globals(path)
    if needed is not None and not any(name.startswith("torch.") for name in needed):
        _refuse_detectron2_weights(path)
    if needed and any(name.startswith("torch.") for name in needed):
        if not allow_unsafe_pickle:
            raise ConversionError(
                f"{path}: a plain pickle (written by pickle.dump, not torch.save), naming {listed(needed, 4)}: "
                "torch's weights-only loading reads only files torch.save wrote, and unpickling a plain pickle can "
                "execute arbitrary code; nothing was loaded from it. If you trust where the file comes from, pass "
                f"{UNSAFE_PICKLE_FLAG} (allow_unsafe_pickle=True) to convert it as it is; otherwise, where the file is "
                f"trusted, load it with pickle and save it with torch.save (torch.save(pickle.load(open({path!r}, "
                "'rb')), 'weights.pth')), and convert that file.")
        try:
            with open(path, "rb") as f:
                return pickle.load(f)
        except Exception as error:  # a damaged pickle: named like any unreadable file
            raise _unreadable_file_error(path, error) from None
    try:
        return load_torch_file(path, allow_unsafe_pickle, f"pass {UNSAFE_PICKLE_FLAG} (allow_unsafe_pickle=True)")
    except UnsafeCheckpointError as refused:
        raise ConversionError(str(refused)) from None
    except Exception as error:  # torch.load reports bad files with many exception types
        if isinstance(error, PickleProtocolError):
            # a pickle protocol torch's weights-only loading cannot read: the refusal names the re-save and the flag
            raise ConversionError(str(error)) from None
        raise _unreadable_file_error(path, error) from None


def _refuse_detectron2_weights(path: str) -> None:
    """A ``ConversionError`` for a pickle of detectron2 weights (numpy arrays under ``'model'``, or
    ``'blobs'`` in Caffe2's layout): the converter's own output or a model-zoo ``.pkl``, which need no
    conversion. The file is read by the unpickler that builds only numpy arrays and plain
    containers; anything else returns for the loader to name."""
    try:
        loaded = load_pickle_file(path, allow_unsafe=False, how_to_opt_in="")
    except Exception:  # not a pickle of numpy arrays only: the loader names what it is
        return
    if not isinstance(loaded, Mapping):
        return
    entry = next((key for key in (WEIGHTS_KEY, "blobs") if isinstance(loaded.get(key), Mapping)), None)
    weights = loaded.get(entry) if entry is not None else None
    if not (isinstance(weights, Mapping) and weights and all(isinstance(value, np.ndarray) for value in weights.values())):
        return
    record = read_conversion_metadata(loaded)
    if record is not None:
        positions = record.get(GW_POSITIONS_FIELD) or "none"
        origin = (f"written by gwdet's converter (from {record.get(SOURCE_FIELD)!r} as {record.get(ARCH_FIELD)}, GW at "
                  f"{positions})")
    else:
        author = loaded.get(AUTHOR_KEY)
        origin = ("a detectron2 weights file, as in detectron2's model zoo"
                  + (f" (__author__ {author!r})" if author is not None else ""))
    suffix = ("" if path.endswith(".pkl") else
              " under a name ending in .pkl, which detectron2's checkpointer reads as pickled weights")
    raise ConversionError(
        f"{path}: already detectron2 weights ({len(weights)} numpy arrays under {entry!r}), {origin}: there is nothing "
        f"to convert, and nothing was written. Use the file as it is as MODEL.WEIGHTS (a LazyConfig's "
        f"train.init_checkpoint){suffix}.")


def _check_zip_written_by_torch_save(path: str) -> None:
    """A ``ConversionError`` for a zip archive that ``torch.save`` did not write (no ``data.pkl``): a
    NumPy ``.npz``, named with the line that saves its arrays as a checkpoint, or another zip."""
    if is_torch_save_zip(path):
        return
    if is_numpy_archive(path):
        raise ConversionError(
            f"{path}: a NumPy .npz archive (np.savez's zip of .npy arrays), not a file written by torch.save (whose "
            "zip holds a data.pkl); nothing was converted. Save its arrays as a state dict of torch tensors, "
            f"torch.save({{name: torch.from_numpy(array) for name, array in numpy.load({path!r}).items()}}, "
            "'weights.pth'), and convert that file.")
    raise ConversionError(
        f"{path}: a zip archive, but not one written by torch.save (no data.pkl inside); nothing was converted. "
        "Give the .pth/.pt file torch.save wrote, holding a torchvision-layout ResNet/ResNeXt state dict.")


def _unreadable_file_error(path: str, error: Exception) -> ConversionError:
    hint = (
        " A .pkl from detectron2's model zoo needs no conversion: use it as MODEL.WEIGHTS."
        if path.endswith(".pkl")
        else ""
    )
    if starts_like_torch_save_output(path):
        cause = error.__context__ if isinstance(error, pickle.UnpicklingError) else None
        detail = f"{type(cause or error).__name__}: {_first_sentence(cause or error)}"
        return ConversionError(
            f"{path}: the file is truncated or corrupted ({detail}). It starts like a torch.save "
            f"file but cannot be read to the end; download or save it again.{hint}"
        )
    if is_safetensors_file(path):
        return ConversionError(f"{path}: a safetensors file (Hugging Face's format), which the converter does not "
                               f"read: {SAFETENSORS_FIX}, and convert that file.")
    return ConversionError(
        f"{path}: not a PyTorch checkpoint: it does not start like a file written by torch.save (a zip "
        f"archive or a pickle). Expected a .pth/.pt file written by torch.save, holding a "
        f"torchvision-layout ResNet/ResNeXt state dict.{hint}"
    )


def _first_sentence(error: BaseException) -> str:
    text = str(error).strip() or "no details"
    return text.splitlines()[0].split(". ")[0].rstrip(".")


def _unwrap_state_dict(path: str, loaded: Any) -> tuple[dict[str, torch.Tensor], str]:
    """Find the state dict: ``loaded`` itself, its "state_dict"/"model" entry, or a module's."""
    if isinstance(loaded, torch.nn.Module):
        return dict(loaded.state_dict()), "pickled nn.Module"
    if not isinstance(loaded, Mapping):
        raise ConversionError(
            f"{path}: holds a {type(loaded).__name__}, not a state dict. Expected a dict of "
            "tensors, or a dict with the state dict under 'state_dict' or 'model'."
        )
    if _is_tensor_mapping(loaded):
        return dict(loaded), "bare state_dict"
    found = {}
    for entry in STATE_DICT_ENTRIES:
        inner = loaded.get(entry)
        if isinstance(inner, torch.nn.Module):
            found[entry] = dict(inner.state_dict()), f"pickled nn.Module in '{entry}'"
        elif isinstance(inner, Mapping) and _is_tensor_mapping(inner):
            found[entry] = dict(inner), f"'{entry}' entry"
    if found:  # another network beside it (an EMA copy under 'model_ema', 'state_dict_ema') is one too
        found.update({entry: (dict(inner), f"'{entry}' entry") for entry, inner in loaded.items()
                      if entry not in found and isinstance(inner, Mapping) and _is_tensor_mapping(inner)})
    # compared without the prefix that (Distributed)DataParallel adds, which is stripped from the one converted
    networks = [_without_data_parallel_prefix(tensors) for tensors, _ in found.values()]
    if not all(_same_tensors(networks[0], other) for other in networks[1:]):
        first = next(iter(found))
        raise ConversionError(
            f"{path}: holds different networks, under {' and '.join(repr(entry) for entry in found)}; "
            "which one to convert cannot be told. Save the one you mean alone, e.g. "
            f"torch.save(torch.load({path!r})[{first!r}], 'weights.pth'), and convert that file.")
    if found:
        return next(iter(found.values()))
    unnamed = [repr(key) for key in loaded if not isinstance(key, str)]
    untensored = [repr(key) for key, value in loaded.items() if not isinstance(value, torch.Tensor)]
    what = ("no entries" if not loaded else
            f"entries whose keys are not parameter names ({listed(unnamed, 3)})" if unnamed else
            f"entries that are not tensors ({listed(untensored, 3)})")
    raise ConversionError(
        f"{path}: no state dict found. The file holds a dict with keys "
        f"{preview_names([str(key) for key in loaded])}, with {what}, so it is no state dict (parameter names "
        "to tensors), nor does it have a 'state_dict' or 'model' entry that is one. Save the network's "
        "state_dict() alone (without the extra entries) and convert that file."
    )


def _without_data_parallel_prefix(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``tensors`` with ``module.`` removed from the names as often as every name has it."""
    while tensors and all(key.startswith(DATA_PARALLEL_PREFIX) for key in tensors):
        tensors = {key[len(DATA_PARALLEL_PREFIX):]: value for key, value in tensors.items()}
    return tensors


def _same_tensors(first: Mapping[str, torch.Tensor], second: Mapping[str, torch.Tensor]) -> bool:
    """Whether two state dicts hold the same names with equal tensors."""
    return first.keys() == second.keys() and all(
        first[name].shape == second[name].shape and torch.equal(first[name], second[name]) for name in first)


def _is_tensor_mapping(mapping: Mapping) -> bool:
    """A non-empty dict from names to tensors."""
    return bool(mapping) and all(
        isinstance(key, str) and isinstance(value, torch.Tensor) for key, value in mapping.items()
    )


def _strip_data_parallel_prefix(
    tensors: dict[str, torch.Tensor]
) -> tuple[dict[str, torch.Tensor], str]:
    """Remove ``module.`` (as often as every key has it) left by (Distributed)DataParallel;
    :class:`ConversionError` when only some keys have it (names of two models mixed)."""
    unwrapped = _without_data_parallel_prefix(tensors)
    first = next(iter(tensors), "")  # the same name in both, with and without the prefixes removed
    stripped = first[:len(first) - len(next(iter(unwrapped), ""))]
    tensors = unwrapped
    prefixed = [key for key in tensors if key.startswith(DATA_PARALLEL_PREFIX)]
    if prefixed:
        bare = [key for key in tensors if not key.startswith(DATA_PARALLEL_PREFIX)]
        raise ConversionError(
            f"{len(prefixed)} of the {len(tensors)} tensors' names start with {DATA_PARALLEL_PREFIX!r} (the prefix "
            f"(Distributed)DataParallel adds), the others do not: {preview_names(prefixed, 3)} beside "
            f"{preview_names(bare, 3)}. The file mixes the names of a wrapped and an unwrapped model; save the "
            "state dict of one model (model.module.state_dict() of a wrapped one) and convert that.")
    return tensors, stripped


def preview_names(names: list[str], limit: int = 8) -> str:
    """``['a', 'b', ... (3 more)]``: at most ``limit`` names, then a count of the rest."""
    return f"[{listed(map(repr, names), limit)}]"
