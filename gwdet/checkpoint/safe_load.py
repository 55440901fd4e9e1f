"""Reading weights and checkpoints without executing code from the file.

``.pth`` files go through ``torch.load(weights_only=True)``, which builds only tensors and plain
containers; ``.pkl`` weight files through an unpickler that builds only numpy arrays and plain
containers. A file that needs anything else (a training script's class, ``argparse.Namespace``, a
pickled ``nn.Module``) raises :class:`UnsafeCheckpointError` naming what it needs, unless the
caller opts in (``allow_unsafe=True``): full unpickling can run arbitrary code, so that is for
trusted files only.
"""
from __future__ import annotations

import io
import os
import pickle
import pickletools
import re
import warnings
import zipfile
from typing import Any, Mapping

import torch

from gwdet.errors import GwdetError
from gwdet.utils.cli_errors import GZIP_MAGIC, gzip_decompression

ZIP_MAGIC = b"PK\x03\x04"  # torch.save's format since PyTorch 1.6
LEGACY_MAGIC = b"\x80\x02"  # the legacy format: a pickle stream, protocol 2
_UNSUPPORTED_GLOBAL = re.compile(r"Unsupported global: GLOBAL ([\w.]+)")
# (module, name) pairs a .pkl of numpy weights needs, and nothing else: numpy's array and number
# constructors (``_frombuffer``: arrays under pickle protocol 5), and ``_codecs.encode``, by which
# Python 3 writes bytes under protocol 2 (a string encoded to bytes, as torch's weights-only loader allows).
_NUMPY_PICKLE_GLOBALS = {
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"),
    ("_codecs", "encode"),
    ("collections", "OrderedDict"),
}


def numpy_number_globals() -> list[Any]:
    """What ``torch.load(weights_only=True)`` must be allowed to build numpy numbers (an ``np.float64``
    learning rate in an optimizer's state, an ``np.int64`` iteration): numpy's scalar constructor,
    ``np.dtype`` and the dtype classes of booleans, integers, floats and complex numbers; they hold
    numbers, never code."""
    import numpy

    try:
        from numpy._core.multiarray import scalar  # numpy >= 2
    except ImportError:
        from numpy.core.multiarray import scalar  # type: ignore[no-redef]
    kinds = (numpy.bool_, numpy.int8, numpy.int16, numpy.int32, numpy.int64, numpy.uint8, numpy.uint16, numpy.uint32,
             numpy.uint64, numpy.float16, numpy.float32, numpy.float64, numpy.complex64, numpy.complex128)
    return [scalar, numpy.dtype, *(type(numpy.dtype(kind)) for kind in kinds)]


class UnsafeCheckpointError(GwdetError, RuntimeError):
    """A file that can only be read by unpickling arbitrary objects (which can run code)."""

    def __init__(self, path: str, needed: list[str], how_to_opt_in: str, pickle_of_arrays: bool = False):
        """``pickle_of_arrays``: a ``.pkl`` weight file (read as numpy arrays), not a ``torch.save``
        file (read as tensors); each holds the other's arrays only through unsafe unpickling."""
        held, other = (("numpy arrays", "torch tensors") if pickle_of_arrays else ("tensors", "numpy arrays"))
        swapped = any(name.startswith("torch." if pickle_of_arrays else "numpy.") for name in needed)
        suffix = (f" ({other} in a .pkl weight file, which holds numpy arrays: save tensors with torch.save in a .pth "
                  f"file)" if pickle_of_arrays else f" ({other} in a .pth file, which holds tensors: save them as "
                  f"tensors, or numpy arrays pickled in a .pkl file)") if swapped else ""
        super().__init__(
            f"{path}: refusing to load this file. It needs unsafe unpickling: besides {held} it contains "
            f"{', '.join(needed)}{suffix}, and unpickling that can execute arbitrary code. "
            f"If you trust where the file comes from, {how_to_opt_in}; otherwise re-save only the "
            "state dict (torch.save(model.state_dict(), path)) where the file is trusted."
        )


def starts_like_torch_save_output(path: str) -> bool:
    """True for a zip archive (torch.save since PyTorch 1.6) or a protocol-2 pickle (legacy)."""
    with open(path, "rb") as f:
        head = f.read(len(ZIP_MAGIC))
    return head.startswith(ZIP_MAGIC) or head.startswith(LEGACY_MAGIC)


def cut_within_magic(path: str) -> int | None:
    """The length of a file shorter than the first bytes ``torch.save`` writes (:data:`ZIP_MAGIC`,
    :data:`LEGACY_MAGIC`) whose bytes begin them (an empty file included): a checkpoint cut short
    before anything of it but its start; ``None`` for any other file."""
    with open(path, "rb") as f:
        head = f.read(len(ZIP_MAGIC))
    if len(head) < len(ZIP_MAGIC) and (ZIP_MAGIC.startswith(head) or LEGACY_MAGIC.startswith(head)):
        return len(head)
    return None


def valueless_tensors_problem(weights: Mapping[str, Any]) -> str | None:
    """What is wrong with a state dict ``weights`` whose tensors are on the meta device (a model
    built on ``torch.device('meta')`` saved: no values), ending where the caller's next step goes;
    ``None`` when none is."""
    valueless = [str(name) for name, value in weights.items() if isinstance(value, torch.Tensor) and value.is_meta]
    if not valueless:
        return None
    return (f"its tensors hold no values ({len(valueless)} on the meta device, e.g. {valueless[0]!r}): the state dict "
            "of a model built on torch.device('meta'). Save the weights of a model on the CPU (after loading or "
            "training them)")


def is_safetensors_file(path: str) -> bool:
    """Whether ``path`` is a safetensors file (Hugging Face's format: an 8-byte little-endian
    length, then a JSON header of that length)."""
    with open(path, "rb") as f:
        head = f.read(9)
    return len(head) == 9 and head[8:9] == b"{" and 2 <= int.from_bytes(head[:8], "little") <= os.path.getsize(path)


SAFETENSORS_FIX = ("load it with safetensors.torch.load_file(path) and save that state dict with torch.save(state, "
                   "'weights.pth')")


GIT_LFS_POINTER = b"version https://git-lfs.github.com/spec/"  # the first line of a Git LFS pointer file


def packed_file_problem(path: str, what: str = "the file torch.save wrote") -> str | None:
    """What ``path`` is when it holds a checkpoint only in packed form, read off its first bytes: a
    gzip-compressed file (to decompress) or a Git LFS pointer (a few lines of text standing for a
    file that ``git lfs pull`` fetches), with the fix; ``what`` names the file expected. ``None`` for
    any other file."""
    with open(path, "rb") as f:
        head = f.read(1024)
    if head.startswith(GZIP_MAGIC):
        stem, suffix = os.path.splitext(path)
        named, plain, command = gzip_decompression(path, f"{stem}.unpacked{suffix}")
        return (f"{path} is gzip-compressed ({named}), and {what} is read uncompressed; nothing was read from "
                f"it. Decompress it ({command}) and give {plain}.")
    if head.startswith(GIT_LFS_POINTER):
        size = re.search(rb"^size (\d+)", head, re.MULTILINE)
        real = f" of {int(size.group(1))} bytes" if size is not None else ""
        return (f"{path} is a Git LFS pointer ({os.path.getsize(path)} bytes of text standing for the real file"
                f"{real}), not {what} itself: the repository was cloned or pulled without fetching its Git LFS files. Run "
                "git lfs pull in the repository (git lfs install first, where Git LFS is not set up), then give the "
                "file again.")
    return None


def legacy_format_protocol(path: str) -> int | None:
    """The pickle protocol of a file ``torch.save`` wrote in its legacy format with another protocol
    than its default 2 (its first pickle is torch's magic number), else ``None``."""
    with open(path, "rb") as f:
        head = f.read(2)
        if len(head) < 2 or head[0] != 0x80 or head[1] == 2:  # PROTO and its number; protocol 2: torch.load reads it
            return None
        f.seek(0)
        try:
            first = _NumpyOnlyUnpickler(f).load()
        except Exception:  # not a pickle whose first object is a plain value
            return None
    return head[1] if first == torch.serialization.MAGIC_NUMBER else None


def zip_pickle_protocol(path: str) -> int | None:
    """The pickle protocol of the ``data.pkl`` in a ``torch.save`` zip archive (its first bytes:
    pickle's PROTO opcode and the number); ``None`` for another file, or an archive whose pickle
    cannot be read."""
    if not zipfile.is_zipfile(path):
        return None
    try:
        with zipfile.ZipFile(path) as archive:
            name = next((n for n in archive.namelist() if n.endswith("data.pkl")), None)
            if name is None:
                return None
            with archive.open(name) as data:
                head = data.read(2)
    except (zipfile.BadZipFile, OSError, EOFError):
        return None
    return head[1] if len(head) == 2 and head[0] == 0x80 else None


def is_torchscript_archive(path: str) -> bool:
    """True for a file written by ``torch.jit.save`` (a zip archive with TorchScript code and
    ``constants.pkl``), which ``torch.load`` cannot read as a checkpoint."""
    if not zipfile.is_zipfile(path):
        return False
    try:
        with zipfile.ZipFile(path) as archive:
            return any(name.endswith("/constants.pkl") for name in archive.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def _globals_refused(path: str, error: Exception) -> list[str]:
    """The classes/functions a torch.save file needs beyond what weights-only loading allows."""
    if not starts_like_torch_save_output(path):
        return []
    if zipfile.is_zipfile(path):
        if not _pickle_is_complete(path):
            return []  # a cut pickle names cut globals: the error is the damage, not a global
        try:
            names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
        except Exception:  # a damaged archive: fall back to the error message
            names = []
        allowed = {f"{kind.__module__}.{kind.__qualname__}" for kind in numpy_number_globals()}
        names = [name for name in names if name not in allowed]
        if names:
            return sorted(names)
    messages = f"{error} {error.__context__ or ''}"
    return sorted(set(_UNSUPPORTED_GLOBAL.findall(messages)))


def _pickle_is_complete(path: str) -> bool:
    """Whether the pickle of a torch.save archive ends with pickle's STOP opcode (``.``); False for
    one cut short, or an archive whose pickle cannot be read."""
    try:
        with zipfile.ZipFile(path) as archive:
            name = next((n for n in archive.namelist() if n.endswith("data.pkl")), None)
            return name is not None and archive.read(name).endswith(pickle.STOP)
    except (zipfile.BadZipFile, OSError, EOFError):
        return False


def _holds_a_pickle(path: str) -> bool:
    """Whether the zip archive ``path`` has the ``data.pkl`` entry of a torch.save archive (its
    readable end is :func:`_pickle_is_complete`'s question)."""
    try:
        with zipfile.ZipFile(path) as archive:
            return any(name.endswith("data.pkl") for name in archive.namelist())
    except (zipfile.BadZipFile, OSError):
        return True  # a damaged archive: torch.load names the damage


def is_numpy_archive(path: str) -> bool:
    """True for a NumPy ``.npz`` archive (``np.savez``: a zip archive of ``.npy`` arrays only), which
    ``torch.save`` never writes."""
    if not zipfile.is_zipfile(path):
        return False
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (OSError, zipfile.BadZipFile):
        return False
    return bool(names) and all(name.endswith(".npy") for name in names)


def is_torch_save_zip(path: str) -> bool:
    """False for a zip archive without the ``data.pkl`` entry that every ``torch.save`` archive has
    (a NumPy ``.npz``, a zip of other files); True for anything else, a damaged archive included."""
    return not zipfile.is_zipfile(path) or _holds_a_pickle(path)


def plain_pickle_globals(path: str) -> list[str] | None:
    """The classes and functions (``module.name``) that a pickle written by ``pickle.dump``, not by
    ``torch.save``, names (``torch._utils._rebuild_tensor_v2`` for tensors), read off its opcodes
    without running any; ``None`` for a file that is no such pickle: not a pickle, a legacy-format
    ``torch.save`` file (whose first pickle is torch's magic number), or one that cannot be read to
    its end."""
    with open(path, "rb") as f:
        if f.read(1) != b"\x80":  # pickle's PROTO opcode, which pickle.dump writes first since protocol 2
            return None
        f.seek(0)
        names: set[str] = set()
        strings: list[str] = []
        try:
            for index, (opcode, argument, _) in enumerate(pickletools.genops(f)):
                if index < 3 and opcode.name == "LONG1" and argument == torch.serialization.MAGIC_NUMBER:
                    return None  # torch.save's legacy format
                if opcode.name in ("GLOBAL", "INST"):
                    names.add(str(argument).replace(" ", "."))
                elif opcode.name == "STACK_GLOBAL" and len(strings) >= 2:
                    names.add(f"{strings[-2]}.{strings[-1]}")
                elif isinstance(argument, str) and "UNICODE" in opcode.name:
                    strings.append(argument)
        except Exception:  # a damaged or cut pickle: the loader names the damage
            return None
    return sorted(names)


class NotACheckpointError(GwdetError, pickle.UnpicklingError):
    """A file that does not start like anything ``torch.save`` writes."""


class PickleProtocolError(NotACheckpointError):
    """A whole ``torch.save`` file written with a pickle protocol that torch's weights-only loading
    cannot read (``torch.save(..., pickle_protocol=4)``)."""


def load_torch_file(path: str, allow_unsafe: bool, how_to_opt_in: str, mmap: bool = False) -> Any:
    """``torch.load`` to CPU, weights-only unless ``allow_unsafe``; with ``mmap`` the tensors are
    mapped from the file, not read (a zip archive only, as ``torch.save`` writes).

    Raises :class:`NotACheckpointError` for a file that ``torch.save`` did not write,
    :class:`UnsafeCheckpointError` for a file that needs more than weights-only loading; any other
    failure (truncated, corrupted) propagates as torch raised it.
    """
    legacy_protocol = legacy_format_protocol(path)
    if legacy_protocol is not None and not allow_unsafe:
        raise PickleProtocolError(
            f"{path} was written by torch.save in its legacy format (_use_new_zipfile_serialization=False) with pickle "
            f"protocol {legacy_protocol}, which torch's weights-only loading cannot read; nothing was loaded from it. "
            "Save it again in torch.save's default format (for a file you trust: torch.save(torch.load(path, "
            f"weights_only=False), 'weights.pth')) and give that file, or {how_to_opt_in} to load it as it is.")
    if is_safetensors_file(path):
        raise NotACheckpointError(
            f"{path} is a safetensors file (Hugging Face's format), which detectron2's checkpointer does not read: "
            f"{SAFETENSORS_FIX}, then give that file (ImageNet weights of a ResNet: convert that file with "
            "tools/convert_pretrained.py).")
    if not starts_like_torch_save_output(path) and legacy_protocol is None:
        with open(path, "rb") as f:
            pickled = f.read(1) == b"\x80"  # a pickle's PROTO opcode, another protocol than torch.save's 2
        if _looks_like_onnx(path):
            raise NotACheckpointError(
                f"{path} is an ONNX model (e.g. an exported model.onnx), not a checkpoint: detectron2's checkpointer "
                "does not read ONNX's format; nothing was loaded from it. Give the torch.save checkpoint the model was "
                "exported from (e.g. output/run/model_final.pth); onnxruntime runs the export (docs/deploy.md).")
        if pickled:
            raise NotACheckpointError(
                f"{path} is a pickle, as detectron2's .pkl weights are (gwdet's converter writes those), not a file "
                "torch.save writes: name it with the .pkl suffix, which detectron2's checkpointer reads as pickled "
                "weights.")
        raise NotACheckpointError(
            f"{path} is not a PyTorch checkpoint: it does not start like a file written by torch.save (a zip archive "
            "or a pickle). Check the path (MODEL.WEIGHTS, OUTPUT_DIR; a LazyConfig's train.init_checkpoint, "
            "train.output_dir), or convert ImageNet weights with tools/convert_pretrained.py."
        )
    if is_torchscript_archive(path):
        raise NotACheckpointError(
            f"{path} is a TorchScript model (written by torch.jit.save, e.g. an exported model.ts), not a checkpoint: "
            "its weights are compiled into the model; nothing was loaded from it. Give the torch.save checkpoint the "
            "model was exported from (e.g. output/run/model_final.pth); gwdet.export.load_export runs the export.")
    if zipfile.is_zipfile(path) and not _holds_a_pickle(path):
        raise NotACheckpointError(
            f"{path} is not a PyTorch checkpoint: it is a zip archive, but not one torch.save writes (no data.pkl "
            "inside; a NumPy .npz, say). Check the path (MODEL.WEIGHTS, OUTPUT_DIR; a LazyConfig's "
            "train.init_checkpoint, train.output_dir), or convert the weights to a state dict saved with torch.save "
            "(ImageNet weights: tools/convert_pretrained.py)."
        )
    try:
        with torch.serialization.safe_globals(numpy_number_globals()), warnings.catch_warnings():
            # torch's own warning for a protocol other than 2; a file it cannot read is named below
            warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
            return torch.load(path, map_location="cpu", weights_only=not allow_unsafe, mmap=mmap)
    except Exception as error:  # torch.load reports bad files with many exception types
        needed = [] if allow_unsafe else _globals_refused(path, error)
        if needed:
            raise UnsafeCheckpointError(path, needed, how_to_opt_in) from None
        protocol = zip_pickle_protocol(path)
        if not allow_unsafe and protocol not in (None, 2) and _pickle_is_complete(path):
            raise PickleProtocolError(
                f"{path} was written by torch.save with pickle protocol {protocol} (pickle_protocol={protocol}), "
                "which torch's weights-only loading cannot read; nothing was loaded from it. Save it again with "
                "torch.save's default protocol (for a file you trust: torch.save(torch.load(path, weights_only=False), "
                f"'weights.pth')) and give that file, or {how_to_opt_in} to load it as it is.") from None
        raise


def _looks_like_onnx(path: str) -> bool:
    """Whether ``path`` starts as an ONNX model does: a protobuf ``ModelProto`` whose first field is
    ``ir_version`` (tag byte 0x08), named ``.onnx`` or produced by PyTorch's exporter."""
    with open(path, "rb") as file:
        head = file.read(64)
    return head[:1] == b"\x08" and (path.lower().endswith(".onnx") or b"pytorch" in head)


class _NumpyOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _NUMPY_PICKLE_GLOBALS:
            return super().find_class(module, name)
        raise UnsafeGlobal(f"{module}.{name}")


class UnsafeGlobal(pickle.UnpicklingError):
    """Raised by the numpy-only unpickler for a global it will not build."""


def load_pickle_file(path: str, allow_unsafe: bool, how_to_opt_in: str) -> Any:
    """Unpickle a ``.pkl`` weight file, building only numpy arrays and plain containers; a file that
    ``torch.save`` wrote under that name is refused naming the suffix to give it."""
    with open(path, "rb") as f:
        raw = f.read()
    if raw.startswith(ZIP_MAGIC):
        raise NotACheckpointError(
            f"{path} is a file torch.save writes (a zip archive: a checkpoint of a training, gwdet's model_*.pth), "
            "not a pickle as detectron2's .pkl weights are: name it (or the link to it) with the .pth suffix, which "
            "detectron2's checkpointer reads with torch.load.")
    try:
        return _NumpyOnlyUnpickler(io.BytesIO(raw), encoding="latin1").load()
    except UnsafeGlobal as refused:
        if not allow_unsafe:
            raise UnsafeCheckpointError(path, [str(refused)], how_to_opt_in, pickle_of_arrays=True) from None
        return pickle.loads(raw, encoding="latin1")
