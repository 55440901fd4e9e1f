"""Exporting detectron2 models with gwdet's layers to TorchScript and ONNX, the way detectron2's
``tools/deploy/export_model.py`` does it (``--export-method tracing``).

The model is wrapped in detectron2's :class:`~detectron2.export.TracingAdapter` (a
``GeneralizedRCNN`` returns boxes, scores, classes and 28x28 mask probabilities per detection) and
recorded with ``torch.jit.trace`` or the TorchScript-based ``torch.onnx.export``. While they record,
gwdet's layers run their reference formulas (:mod:`gwdet.layers.tracing`), so a TorchScript file
loads with ``import torch, torchvision`` alone and an ONNX file runs in onnxruntime. ZCA whitening
(``GW_ZCA``, and ``BW`` in training mode) has no ONNX form: exporting it is an error naming the ItN
alternatives.

Every export is written atomically with its SHA-256 beside it in ``<file>.sha256`` (``sha256sum``'s
format; :mod:`gwdet.utils.atomic`); :func:`load_export` and :func:`run_onnx` refuse a file that
differs from that record (:class:`DamagedExportError`).
"""
from __future__ import annotations

import contextlib
import inspect
import io
import math
import os
import re
import shlex
import warnings
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
from detectron2.export import TracingAdapter
from detectron2.export.flatten import InstancesSchema, ListSchema, Schema
from detectron2.modeling import META_ARCH_REGISTRY, GeneralizedRCNN

from gwdet.layers.common import check_flag, check_int_at_least
from gwdet.modeling.build import check_device
from gwdet.errors import (GwdetFileExistsError, GwdetFileNotFoundError, GwdetIsADirectoryError, GwdetOSError,
                          GwdetTypeError, GwdetUserWarning, GwdetValueError)
from gwdet.checkpoint.safe_load import is_torchscript_archive
from gwdet.utils.atomic import (
    CHECKSUM_SUFFIX,
    DamagedFileError,
    checksum_findings,
    checksum_path,
    foreign_record,
    path_written_atomically,
    path_written_with_checksum,
    reading_record,
    record_checksum,
    shown_record,
)

# ONNX opset of gwdet's exports (detectron2's STABLE_ONNX_OPSET_VERSION is 11).
ONNX_OPSET = 17
# The first opset with RoiAlign's coordinate_transformation_mode, which detectron2's aligned ROIAlign
# needs: an R-CNN exported at an older one computes other detections.
MIN_DETECTOR_OPSET = 16


def _rcnn_inference(model: GeneralizedRCNN, inputs: List[dict]) -> List[dict]:
    # detectron2's export_model: do_postprocess=False returns the 28x28 mask probabilities per detection
    instances = model.inference(inputs, do_postprocess=False)[0]
    return [{"instances": instances}]


@contextlib.contextmanager
def evaluation_mode(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """``model`` in evaluation mode inside the block; after it, however it ends, each of its modules
    has its own ``training`` flag back (a model in training mode with frozen parts, say)."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for module, training in modes:
            module.training = training


class EvalTracingAdapter(TracingAdapter):
    """detectron2's ``TracingAdapter`` whose every call runs the model in evaluation mode
    (:func:`evaluation_mode`), whatever mode the model is in between calls."""

    def forward(self, *args: torch.Tensor):
        if not any(module.training for module in self.model.modules()):
            return super().forward(*args)
        with evaluation_mode(self.model):
            return super().forward(*args)


def tracing_adapter(model: torch.nn.Module, image: torch.Tensor) -> TracingAdapter:
    """``model`` behind detectron2's ``TracingAdapter`` for one ``(3, H, W)`` image: it takes the
    image tensor and returns a tuple of tensors, running the model in evaluation mode
    (:class:`EvalTracingAdapter`). The model is put in evaluation mode, as ``torch.jit.trace`` of the
    adapter needs it; the export functions give it back in its own modes afterwards. An image of
    another layout (H, W, C), channel count or a dtype the model's pixel mean does not take in (float64
    for a float32 model), or a model on the meta device, is refused by name."""
    channels = len(getattr(model, "pixel_mean", ()))
    if not isinstance(image, torch.Tensor) or image.dim() != 3 or (channels and image.shape[0] != channels):
        shape = list(image.shape) if isinstance(image, torch.Tensor) else type(image).__name__
        raise GwdetValueError(
            f"The sample image has shape {shape}; the model takes one image as a (C, H, W) tensor of "
            f"{channels or 'its'} channels (as detectron2's test loader gives it: image.permute(2, 0, 1) turns an "
            "(H, W, C) array into one, in the model's INPUT.FORMAT).")
    mean = getattr(model, "pixel_mean", None)
    if isinstance(mean, torch.Tensor) and torch.promote_types(image.dtype, mean.dtype) != mean.dtype:
        raise GwdetValueError(
            f"The sample image is {image.dtype}, and the model normalizes it with its {mean.dtype} pixel mean, so it "
            f"would reach the model's {mean.dtype} layers as {torch.promote_types(image.dtype, mean.dtype)} (torch's "
            f"dtype error inside the trace): give it as uint8, as detectron2's test loader does, or as {mean.dtype} "
            f"(image.to({mean.dtype})).")
    if any(parameter.is_meta for parameter in model.parameters()):
        raise GwdetValueError("The model is on the meta device, whose tensors hold no values: build it on the CPU "
                              "(or a GPU) and load its weights before exporting it.")
    model.eval()
    inference = _rcnn_inference if isinstance(model, GeneralizedRCNN) else None
    adapter = EvalTracingAdapter(model, [{"image": image}], inference)
    return adapter.eval()


def export_torchscript(model: torch.nn.Module, image: torch.Tensor, path: str, *,
                       overwrite: bool = False) -> Tuple[torch.jit.ScriptModule, TracingAdapter]:
    """Trace ``model`` on ``image`` and save it to ``path`` (``torch.jit.save``).

    ``model`` is a detectron2 detector (a meta-architecture such as ``GeneralizedRCNN``) or another
    module that takes detectron2's inputs, a list of dicts (``[{"image": image}]``), which
    detectron2's tracing adapter gives it; ``image`` is one ``(C, H, W)`` tensor. A module that fails
    on that input (one that takes tensors: a layer, an ``nn.Sequential``) is refused, naming
    ``torch.jit.trace`` for it; nothing is written then.

    Returns the traced module and the adapter (``adapter.outputs_schema(traced(image))`` rebuilds
    detectron2's outputs; ``adapter(image)`` runs the eager model in evaluation mode). ``model`` is
    traced in evaluation mode and given back in the modes it had, whether the export succeeds or
    fails (:func:`evaluation_mode`). The file is written atomically, with its SHA-256 in ``path.sha256``; a file already at
    ``path`` is replaced only with ``overwrite``, and a ``path`` that does not end in ``.ts`` (the name
    :func:`load_export` reads TorchScript from) is refused (:func:`_check_output_file`).
    """
    _check_output_file(path, "model.ts", overwrite, "export_torchscript")
    if _is_detector(model):
        traced, adapter = trace_model(model, image)
    else:  # a module of the user's may take detectron2's inputs (a list of dicts) or fail on them
        try:
            traced, adapter = trace_model(model, image)
        except (TypeError, AttributeError, RuntimeError, IndexError, KeyError) as error:
            raise _not_a_detector_refusal(model, error) from error
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    with path_written_with_checksum(path) as temporary:
        save_script_module(traced, temporary)
    return traced, adapter


def trace_model(model: torch.nn.Module, image: torch.Tensor) -> Tuple[torch.jit.ScriptModule, TracingAdapter]:
    """``torch.jit.trace`` of detectron2's tracing adapter of ``model`` on ``image``: the traced
    module and the adapter, as :func:`export_torchscript` returns them, nothing written; ``model``
    is traced in evaluation mode and given back in its own modes."""
    with evaluation_mode(model):
        adapter = tracing_adapter(model, image)
        with torch.no_grad():
            # check_trace would run the model twice more to compare; callers compare with
            # max_abs_difference on inputs of their choice instead
            traced = torch.jit.trace(adapter, (image,), check_trace=False)
    return traced, adapter


def _check_output_file(path: str, example: str, overwrite: bool, writer: str) -> None:
    """Refuse, before any work, an output ``path`` that is a folder (``example``: a file name in it),
    that is empty, or that names a file already there unless ``overwrite`` (a user's notes, a
    checkpoint: replaced without a word before); an export inside ``torch.autocast``; and a ``path``
    whose suffix is not ``example``'s, the format ``writer`` writes (:func:`_check_export_suffix`).
    ``overwrite`` must be True or False (``'no'`` would be read as true and replace the file). A
    ``path`` below a file is refused too (:func:`_check_parent_folders`)."""
    check_flag(writer, "overwrite", overwrite)
    if not os.fspath(path):
        raise GwdetValueError(f"The export's path is empty: give the file to write, e.g. {example}; nothing was written.")
    if os.path.isdir(path):
        raise GwdetIsADirectoryError(f"{path} is a folder: give the path of the file to write, e.g. "
                                     f"{os.path.join(path, example)}; nothing was written.")
    _check_parent_folders(path)
    autocast = [device for device in ("cpu", "cuda") if torch.is_autocast_enabled(device)]
    if autocast:  # the traced graph would keep the autocast dtypes and fail when run without it
        raise GwdetValueError(f"The export runs inside torch.autocast ({', '.join(autocast)}): the exported model "
                              "would record its mixed dtypes and fail when run normally. Export outside the autocast "
                              "block; nothing was written.")
    foreign = foreign_record(path)
    if foreign is not None and not overwrite:
        raise GwdetFileExistsError(f"{foreign} is there and is no checksum record, but the export writes its own "
                                   "record under that name: it is left as it is. Move it away, or pass overwrite=True "
                                   "to replace it; nothing was written.")
    if os.path.lexists(path) and not overwrite:
        raise GwdetFileExistsError(f"{path} exists: an export replaces it only with overwrite=True (the file is then "
                                   f"replaced, and {os.path.basename(path)}{CHECKSUM_SUFFIX} with it); give another "
                                   "path to keep it. Nothing was written.")
    _check_export_suffix(path, os.path.splitext(example)[1], writer)


def _check_parent_folders(path: str) -> None:
    """Refuse an export ``path`` below a file (``notes.txt/model.ts``): the folders the export
    creates above the file cannot be made there. Worded as the export tool words ``--output`` below a
    file (:func:`gwdet.utils.cli_errors.output_path_problem`)."""
    for above in Path(os.path.abspath(path)).parents:  # ".." resolved, as os.makedirs creates the folders
        if above.exists():
            if not above.is_dir():
                raise GwdetFileExistsError(f"{path}: {above} is a file, so no folder can be created below it. Give a "
                                           "file path whose parent folders are folders (or do not exist yet); "
                                           "nothing was written.")
            return


TORCHSCRIPT_SUFFIX = ".ts"
ONNX_SUFFIX = ".onnx"
EXPORT_SUFFIXES = (TORCHSCRIPT_SUFFIX, ONNX_SUFFIX)  # model.ts, model.onnx: what tools/deploy/export_model.py writes
_FORMATS = {TORCHSCRIPT_SUFFIX: "a TorchScript archive", ONNX_SUFFIX: "an ONNX model"}
# what other suffixes name, for the message that refuses them
_NAMED_BY_SUFFIX = {".pth": "a checkpoint (torch.save)", ".pt": "a checkpoint (torch.save)",
                    ".pkl": "detectron2 weights", ".onnx": _FORMATS[ONNX_SUFFIX], ".ts": _FORMATS[TORCHSCRIPT_SUFFIX]}


def _check_export_suffix(path: str, suffix: str, writer: str) -> None:
    """Refuse an export ``path`` that does not end in ``suffix``, the suffix of the format ``writer``
    writes: :func:`load_export` reads an export's format from its name (``.onnx``: ONNX, else
    TorchScript) and lists a folder's exports by it."""
    shown = os.fspath(path)
    name = os.path.basename(shown)
    if name.endswith(suffix):
        return
    found = os.path.splitext(name)[1]
    named = f", the name of {_NAMED_BY_SUFFIX[found]}" if found in _NAMED_BY_SUFFIX else ""
    ends = f"ends in {found}{named}" if found else "has no suffix"
    raise GwdetValueError(
        f"{writer} writes {_FORMATS[suffix]}, which gwdet names {suffix} (gwdet.export.load_export reads an export's "
        f"format from its name), and {shown!r} {ends}. Give a path ending in {suffix}, e.g. "
        f"{shown[:len(shown) - len(found)] + suffix!r}; nothing was written.")


def save_script_module(module: torch.jit.ScriptModule, path: str) -> None:
    """``torch.jit.save(module)`` into memory, then to the file ``path`` by Python, so that a disk
    too full for it is an error naming the file and the space needed (torch's own file writer
    stops with a C++ error there)."""
    buffer = io.BytesIO()
    torch.jit.save(module, buffer)
    data = buffer.getbuffer()
    try:
        with open(path, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
    except OSError as error:
        raise GwdetOSError(
            f"Cannot write the export ({len(data) / 2**20:.1f} MiB) to {path}: {error.strerror or error}. Free "
            "space there or choose another --output; nothing was written.") from error


def export_onnx(
    module: torch.nn.Module,
    args: Tuple[torch.Tensor, ...] | torch.Tensor,
    path: str,
    opset: Optional[int] = None,
    dynamo: bool = False,
    input_names: Optional[Sequence[str]] = None,
    output_names: Optional[Sequence[str]] = None,
    dynamic_axes: Optional[Dict[str, Dict[int, str] | List[int]]] = None,
    overwrite: bool = False,
) -> None:
    """``torch.onnx.export`` of ``module(*args)`` into ``path``.

    ``args`` is a tuple of the module's inputs, e.g. ``(x,)``; a single tensor is taken as the
    one-tuple ``(x,)``, as ``torch.onnx.export`` takes it. Another type (a list, a dict) is refused
    before anything is traced or written.

    By default the TorchScript-based exporter at :data:`ONNX_OPSET` (``torch.export`` cannot capture
    a detectron2 R-CNN), its file then rewritten by :func:`drop_subgraph_shapes`; with ``dynamo=True``
    the ``torch.export``-based one, at its own default opset unless ``opset`` is given.
    ``input_names``, ``output_names`` and ``dynamic_axes`` are ``torch.onnx.export``'s (by default every input size is
    the example's): names go to the file's inputs and outputs in order, and those after the last name
    get automatic names. A name that is not a non-empty string, one given twice (among the inputs, the
    outputs, or both), more input names than the export has inputs (:func:`_onnx_input_count`) and
    more output names than it has outputs (known once the module is traced) are refused; nothing is
    written then. The file is written atomically, with its SHA-256 in ``path.sha256``; a file
    already at ``path`` is replaced only with ``overwrite``, and a ``path`` that does not end in
    ``.onnx`` is refused. ``module`` is exported in evaluation mode and given back in the modes it
    had, whether the export succeeds or fails (:func:`evaluation_mode`).

    ``dynamic_axes`` is a dict from an input's or output's name to its dynamic axes, as a dict of axis
    to axis name or a list of axes (:func:`_checked_dynamic_axes`); a key that names no input or
    output of the exported file (the names given, or the exporter's automatic names of the others) is
    refused before the file is written (:func:`_check_dynamic_axes_names`). An ``opset`` that a layer
    or the exporter cannot take (gwdet's layers need 13 or newer) is refused naming the default.
    """
    _check_output_file(path, "model.onnx", overwrite, "export_onnx")
    args = _onnx_args(args)
    check_flag("export_onnx", "dynamo", dynamo)
    if opset is not None:
        check_int_at_least("export_onnx", "opset", opset, 1)
        _check_roi_align_opset(module, opset)
    names, outputs = _checked_onnx_names(module, args, dynamo, input_names, output_names)
    axes = _checked_dynamic_axes(dynamic_axes)
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    with path_written_with_checksum(path) as temporary, evaluation_mode(module):
        write_onnx(module, args, temporary, path, opset, dynamo, names, outputs, axes)


def _check_roi_align_opset(module: torch.nn.Module, opset: int) -> None:
    """Refuse an ``opset`` below :data:`MIN_DETECTOR_OPSET` for a ``module`` that holds detectron2's
    aligned ``ROIAlign`` (a ``ROIPooler``'s, in an R-CNN's box or mask head): below that opset ONNX's
    RoiAlign computes the unaligned function, so the file would compute other detections."""
    from detectron2.layers import ROIAlign

    aligned = next((name for name, layer in module.named_modules()
                    if isinstance(layer, ROIAlign) and getattr(layer, "aligned", False)), None)
    if aligned is None or opset >= MIN_DETECTOR_OPSET:
        return
    raise GwdetValueError(
        f"export_onnx: opset {opset} is below {MIN_DETECTOR_OPSET}, the first whose RoiAlign computes detectron2's "
        f"aligned ROIAlign, which the module holds ({aligned or 'the module itself'}): an older one exports other "
        f"detections. Give opset {MIN_DETECTOR_OPSET} or newer (the default is {ONNX_OPSET}); nothing was written.")


_ANSI_CODE = re.compile(r"\x1b\[[0-9;]*m")


def _torch_export_refusal(module: torch.nn.Module, path: str, error: BaseException) -> GwdetValueError:
    """The refusal of ``dynamo=True`` when ``torch.export`` cannot capture ``module``: torch's first
    line (and its cause's), the documented limit (``torch.export`` cannot capture a whole detectron2
    R-CNN, docs/deploy.md, Limits) and the fix, the TorchScript-based exporter (``dynamo=False``)."""
    lines = [_ANSI_CODE.sub("", (str(error).strip().splitlines() or [type(error).__name__])[0])]
    cause = error.__cause__
    if cause is not None:
        lines.append(_ANSI_CODE.sub("", (str(cause).strip().splitlines() or [type(cause).__name__])[0]))
    detector = any(_is_detector(layer) for layer in module.modules())
    limit = ("torch.export cannot capture a whole detectron2 R-CNN, which the module holds" if detector else
             "torch.export cannot capture every module (a whole detectron2 R-CNN among them)")
    return GwdetValueError(
        f"export_onnx(dynamo=True) of {path}: torch.export could not capture the module (torch: "
        f"{' / '.join(lines)}). {limit} (docs/deploy.md, Limits). Export with dynamo=False (the default: the "
        "TorchScript-based exporter, as detectron2's own tool does; gwdet.export.export_model_onnx for a "
        "detector); nothing was written.")


def _onnx_args(args: Any) -> Tuple[Any, ...]:
    """:func:`export_onnx`'s ``args`` as a tuple: a tuple as it is, a tensor as ``(tensor,)``;
    another type is refused by name."""
    if isinstance(args, tuple):
        return args
    if isinstance(args, torch.Tensor):
        return (args,)
    if isinstance(args, list):
        shown, fix = f"a list of {len(args)}", "give them as a tuple, tuple(args): e.g. (x,) for [x]"
    else:
        shown, fix = f"{type(args).__name__} {args!r}"[:120], "give a tuple, e.g. (x,)"
    raise GwdetTypeError(
        f"export_onnx takes args as a tuple of the module's inputs (it exports module(*args)), not {shown}: {fix} "
        "(a single tensor x is taken as (x,)); nothing was written.")


def _checked_onnx_names(module: torch.nn.Module, args: Tuple[Any, ...], dynamo: bool, input_names: Any,
                        output_names: Any) -> Tuple[Optional[List[str]], Optional[List[str]]]:
    """:func:`export_onnx`'s ``input_names`` and ``output_names`` as lists, refused before anything is
    traced or written where torch.onnx.export would change them without a word: given as one string
    (read letter by letter) or as something else than a list or tuple, a name that is no string or
    is empty (the exporter's automatic name replaces it), a name given twice (the exporter renames
    the input ``a.1``), and more input names than the export has inputs (the extra names go to the
    module's weights or are left out). The output count is known once the module is traced:
    :func:`write_onnx` checks it."""
    checked: Dict[str, List[str]] = {}
    for argument, given in (("input_names", input_names), ("output_names", output_names)):
        if given is None:
            continue
        if isinstance(given, (str, bytes)) or not isinstance(given, Sequence):
            shown = f"the string {given!r}" if isinstance(given, (str, bytes)) else f"a {type(given).__name__}"
            example = given.decode() if isinstance(given, bytes) else given if isinstance(given, str) else "x"
            raise GwdetTypeError(
                f"export_onnx takes {argument} as a list of names, one per {argument[:-6]} in order, not {shown}"
                f"{' (torch.onnx.export would read it letter by letter)' if isinstance(given, str) else ''}: give "
                f"{argument}=[{example!r}]; nothing was written.")
        for index, name in enumerate(given):
            if not isinstance(name, str):
                raise GwdetTypeError(
                    f"export_onnx: {argument}[{index}] is {name!r} ({type(name).__name__}), not a string: give each "
                    f"{argument[:-6]}'s name as a str, e.g. {argument}=[{str(name)!r}]; nothing was written.")
            if not name:
                raise GwdetValueError(
                    f"export_onnx: {argument}[{index}] is an empty string, which torch.onnx.export replaces with an "
                    f"automatic name (such as 'onnx::Cast_0') without a word: give every listed {argument[:-6]} a "
                    f"name (names go to the {argument[:-6]}s in order; those after the last name get automatic "
                    "names); nothing was written.")
        checked[argument] = list(given)
    places: Dict[str, List[str]] = {}
    for argument, names in checked.items():
        for index, name in enumerate(names):
            places.setdefault(name, []).append(f"{argument}[{index}]")
    repeated = {name: where for name, where in places.items() if len(where) > 1}
    if repeated:
        shown = "; ".join(f"{name!r} ({' and '.join(where)})" for name, where in repeated.items())
        raise GwdetValueError(
            f"export_onnx: {'a name is' if len(repeated) == 1 else 'names are'} given twice: {shown}. The inputs and "
            "outputs of an ONNX file need names of their own, and torch.onnx.export renames one of a pair (an input "
            "'a' becomes 'a.1', which onnxruntime then expects) or fails: give each input and output a different "
            "name; nothing was written.")
    inputs = checked.get("input_names")
    count = None if inputs is None else _onnx_input_count(module, args, dynamo)
    if inputs is not None and count is not None and len(inputs) > count:
        raise _too_many_names("input", inputs, count, dynamo)
    return inputs, checked.get("output_names")


def _onnx_input_count(module: torch.nn.Module, args: Tuple[Any, ...], dynamo: bool) -> Optional[int]:
    """How many inputs the ONNX file of ``module(*args)`` has, as ``torch.onnx.export`` flattens
    ``args`` (a dict as their last item holds keyword arguments): with the TorchScript-based
    exporter, every tensor and number among them, in nested tuples, lists and dicts (``None`` and
    strings are none), and the default values of the ``forward`` arguments that ``args`` leaves out;
    with ``dynamo=True``, every tensor among them (numbers are built into the file). ``None`` where
    it cannot tell: a scripted module, an argument of another type."""
    if isinstance(module, (torch.jit.ScriptModule, torch.jit.ScriptFunction)):
        return None
    positional: List[Any] = list(args)
    keywords: Dict[str, Any] = {}
    if positional and isinstance(positional[-1], dict):
        keywords = positional.pop()
    if dynamo:
        return _leaf_count([positional, keywords], numbers=False)
    if not args:
        return 0
    try:
        parameters = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):  # torch.onnx.export then takes args as they are
        return _leaf_count(list(args), numbers=True)
    if parameters and parameters[0].name == "self":
        parameters = parameters[1:]
    for parameter in parameters[len(positional):]:  # torch.onnx.export fills them in, in order
        if parameter.name in keywords:
            positional.append(keywords[parameter.name])
        elif parameter.default is not inspect.Parameter.empty:
            positional.append(parameter.default)
    return _leaf_count(positional, numbers=True)


def _leaf_count(value: Any, numbers: bool) -> Optional[int]:
    """The tensors (and, with ``numbers``, the bools, ints and floats) in ``value``, through tuples,
    lists and dict values; ``None`` when it holds something else (a type the exporters flatten their
    own way, if at all)."""
    if isinstance(value, torch.Tensor):
        return 1
    if value is None or isinstance(value, str):
        return 0
    if isinstance(value, (bool, int, float)):
        return int(numbers)
    if isinstance(value, (list, tuple, dict)):
        counts = [_leaf_count(item, numbers) for item in (value.values() if isinstance(value, dict) else value)]
        return None if None in counts else sum(counts)  # type: ignore[arg-type]
    return None


def _too_many_names(kind: str, names: Sequence[str], count: int, dynamo: bool) -> GwdetValueError:
    """The refusal of more ``kind`` names (``"input"`` or ``"output"``) than the ``count`` the
    export has, for the exporter ``dynamo`` chooses."""
    if kind == "input":
        counted = ("the tensors among args; numbers are built into the file" if dynamo else
                   "the tensors and numbers among args, nested tuples, lists and dicts flattened, with the default "
                   "values of the forward arguments args leaves out")
    else:
        counted = "the tensors module(*args) returns, nested tuples, lists and dicts flattened"
    extra = ", ".join(repr(name) for name in names[count:])
    them = "it" if len(names) - count == 1 else "them"
    if kind == "input" and not dynamo:
        fate = f"torch.onnx.export would give {extra} to the module's weights (the file's initializers) or leave {them} out"
    else:
        fate = f"{extra} would name no {kind} of the file"
    fix = (f"Give at most {count} {kind} name{'' if count == 1 else 's'}, one per {kind} in order ({kind}s after the "
           "last name get automatic names)" if count else f"Leave {kind}_names out")
    return GwdetValueError(
        f"export_onnx: {kind}_names has {len(names)} name{'' if len(names) == 1 else 's'} "
        f"({', '.join(repr(name) for name in names)}), but the export has {count} {kind}{'' if count == 1 else 's'} "
        f"({counted}), so {fate}. {fix}; nothing was written.")


def write_onnx(module: torch.nn.Module, args: Tuple[torch.Tensor, ...], file: str, path: str,
               opset: Optional[int] = None, dynamo: bool = False, input_names: Optional[List[str]] = None,
               output_names: Optional[List[str]] = None,
               dynamic_axes: Optional[Dict[str, Any]] = None) -> None:
    """What :func:`export_onnx` writes, into ``file`` as it is (the caller makes it ``path``, the
    name messages give): the export, its subgraph shapes dropped, checked by ``onnx``'s checker, with
    its SHA-256 recorded beside it (``file.sha256``; :func:`~gwdet.utils.atomic.path_written_with_checksum`
    takes that record away with a temporary ``file``), so that :func:`run_onnx` reads ``file`` checked."""
    if dynamo:
        # the weights inside the file: torch writes them beside it under the name it is given (a temporary
        # name, which the file would then reference) where external_data is on
        try:
            torch.onnx.export(module, args, file, opset_version=opset, dynamo=True, external_data=False,
                              input_names=input_names, output_names=output_names, dynamic_axes=dynamic_axes)
        except torch.onnx.errors.OnnxExporterError as error:
            if type(error).__name__ != "TorchExportError":  # torch.export captured it; a later step failed
                raise
            raise _torch_export_refusal(module, path, error) from error
        except RuntimeError as error:
            if not str(error).startswith("# Failed to convert 'dynamic_axes'"):
                raise
            cause = error.__cause__
            first = (str(cause).strip().splitlines() or [type(cause).__name__])[0].rstrip(".") if cause else ""
            reason = f" (torch: {first})" if cause else ""
            raise GwdetValueError(
                f"export_onnx(dynamo=True) of {path}: torch could not turn dynamic_axes {dynamic_axes!r} into "
                f"torch.export's dynamic shapes{reason}. With dynamo=True, key dynamic_axes by the names given in "
                "input_names (in the order of the module's inputs) or output_names, or export with dynamo=False "
                "(the default); nothing was written.") from error
        _check_written_name_counts(file, input_names, output_names)  # the dynamo exporter drops extra names
    else:
        returned: List[Optional[int]] = []  # the output count of each call of the module in the trace
        hook = None if isinstance(module, torch.jit.ScriptModule) else module.register_forward_hook(
            lambda _, __, output: returned.append(_leaf_count(output, True)))
        try:
            torch.onnx.export(module, args, file, opset_version=opset or ONNX_OPSET, dynamo=False,
                              input_names=input_names, output_names=output_names, dynamic_axes=dynamic_axes)
        except (torch.onnx.errors.UnsupportedOperatorError, RuntimeError) as error:
            outputs = returned[-1] if returned else None
            if output_names is not None and outputs is not None and len(output_names) > outputs:
                raise _too_many_names("output", output_names, outputs, dynamo) from None
            reason = (str(error).strip().splitlines() or [type(error).__name__])[0].rstrip(".")
            if not _names_the_opset(error, reason):
                raise
            raise GwdetValueError(f"The ONNX export of {path} at opset {opset or ONNX_OPSET} failed: {reason}. Export at "
                                  f"an opset the exporter and every layer support (the default, {ONNX_OPSET}; gwdet's "
                                  "layers need 13 or newer); nothing was written.") from None
        finally:
            if hook is not None:
                hook.remove()
        drop_subgraph_shapes(file)
    _check_dynamic_axes_names(file, dynamic_axes, input_names, output_names)
    check_onnx_file(file, path, _float64_tensors(module, args))
    record_checksum(file)


def _names_the_opset(error: BaseException, reason: str) -> bool:
    """Whether the TorchScript-based exporter's ``error`` (its first line ``reason``) is about the
    opset: an operator it cannot export at that opset (``UnsupportedOperatorError``, or its
    ``OnnxExporterError`` "ONNX export failed on where, which is not implemented for opset 7") or an
    opset it does not know (``Unsupported onnx_opset_version``)."""
    if isinstance(error, torch.onnx.errors.UnsupportedOperatorError) or "opset_version" in reason:
        return True
    return isinstance(error, torch.onnx.errors.OnnxExporterError) and "for opset" in reason


def _checked_dynamic_axes(dynamic_axes: Any) -> Optional[Dict[str, Any]]:
    """:func:`export_onnx`'s ``dynamic_axes`` as a new dict (``torch.onnx.export`` rewrites the lists in
    the dict it is given), refused before anything is traced when it is not ``torch.onnx.export``'s
    form: a dict from an input's or output's name (a str) to its dynamic axes, a dict of axis (an int)
    to the axis' name or a list of axes (named automatically). A list of names, which the exporter
    cannot read, is refused naming the dict form."""
    if dynamic_axes is None:
        return None
    if not isinstance(dynamic_axes, Mapping):
        names = [item for item in dynamic_axes if isinstance(item, str)] if isinstance(dynamic_axes, (list, tuple)) else []
        first = names[0] if names else "image"
        shown = f"the {type(dynamic_axes).__name__} {dynamic_axes!r}"[:120]
        raise GwdetTypeError(
            f"export_onnx takes dynamic_axes as a dict from an input's or output's name to its dynamic axes, as "
            f"torch.onnx.export does, not {shown}: give e.g. dynamic_axes={{{first!r}: {{0: 'batch'}}}} (axis 0 free, "
            f"named 'batch'), or the free axes as a list, {{{first!r}: [0, 1, 2, 3]}} for every axis of a 4-d input "
            "(named automatically); nothing was written.")
    for key, axes in dynamic_axes.items():
        if not isinstance(key, str):
            raise GwdetTypeError(
                f"export_onnx: the dynamic_axes key {key!r} ({type(key).__name__}) is not a string: key each entry "
                f"by the name of an input or output (input_names, output_names), e.g. {{'image': {{0: 'batch'}}}}; "
                "nothing was written.")
        listed = list(axes) if isinstance(axes, (Mapping, list)) else None
        if listed is None or any(isinstance(axis, bool) or not isinstance(axis, int) for axis in listed):
            raise GwdetTypeError(
                f"export_onnx: dynamic_axes[{key!r}] is {axes!r}, but the dynamic axes of an input or output are a "
                f"dict of axis (an int) to its name, e.g. {{0: 'batch'}}, or a list of axes, e.g. [0, 2]: give "
                f"dynamic_axes={{{key!r}: {{0: 'batch'}}}}; nothing was written.")
    return {key: dict(axes) if isinstance(axes, Mapping) else list(axes) for key, axes in dynamic_axes.items()}


def _check_dynamic_axes_names(file: str, dynamic_axes: Optional[Dict[str, Any]], input_names: Optional[List[str]],
                              output_names: Optional[List[str]]) -> None:
    """Refuse ``dynamic_axes`` (of the ONNX file ``file``, written under a temporary name) that has a key
    naming no input or output of ``file``: the exporter leaves such a key out with no more than a
    warning, and the axes it meant stay fixed to the example's sizes. The file's names are those given
    in ``input_names`` and ``output_names`` and the exporter's automatic names of the others. Without
    the ``onnx`` package the file's names cannot be read, and the keys are not checked."""
    if not dynamic_axes:
        return
    try:
        import onnx
    except ImportError:
        return
    graph = onnx.load(file, load_external_data=False).graph
    inputs = [value.name for value in graph.input]
    outputs = [value.name for value in graph.output]
    unknown = [key for key in dynamic_axes if key not in inputs and key not in outputs]
    if not unknown:
        return
    given = [f"{argument}={names!r}" for argument, names in (("input_names", input_names),
                                                              ("output_names", output_names)) if names]
    named = f"named by {' and '.join(given)}; " if given else ""
    raise GwdetValueError(
        f"export_onnx: dynamic_axes names {', '.join(repr(key) for key in unknown)}, which "
        f"{'is' if len(unknown) == 1 else 'are'} no input or output of the export, so the axes meant would stay "
        f"fixed to the example's sizes. The export's inputs are {', '.join(repr(name) for name in inputs) or 'none'} "
        f"and its outputs {', '.join(repr(name) for name in outputs) or 'none'} ({named}the others get the "
        "exporter's automatic names): key dynamic_axes by those names, or give input_names/output_names for the "
        "names you use; nothing was written.")


def _check_written_name_counts(file: str, input_names: Optional[List[str]], output_names: Optional[List[str]]) -> None:
    """Refuse the ONNX file ``file`` of ``dynamo=True`` when it has fewer inputs or outputs than
    names were given for them: that exporter names them in order and leaves the extra names out
    without a word. Without the ``onnx`` package the file is not checked."""
    if input_names is None and output_names is None:
        return
    try:
        import onnx
    except ImportError:
        return
    graph = onnx.load(file, load_external_data=False).graph
    for kind, names, values in (("input", input_names, graph.input), ("output", output_names, graph.output)):
        if names is not None and len(names) > len(values):
            raise _too_many_names(kind, names, len(values), dynamo=True)


def _float64_tensors(module: torch.nn.Module, args: Tuple[Any, ...]) -> bool:
    """Whether ``module``'s parameters and buffers or the tensors among ``args`` hold float64."""
    tensors = [*module.parameters(), *module.buffers(), *(arg for arg in args if isinstance(arg, torch.Tensor))]
    return any(tensor.dtype == torch.float64 for tensor in tensors)


def check_onnx_file(written: str, path: str, float64: bool = False) -> None:
    """Refuse the ONNX file ``written`` (the file that is to become ``path``) when ``onnx``'s checker,
    with its type and shape inference, finds it invalid: onnxruntime would refuse to load it.
    ``float64``: the model was exported in float64, where the TorchScript-based exporter writes some
    ops (the ``If`` of a GW layer) in float32, and the fix is an export in float32. Without the
    ``onnx`` package the file is not checked (:func:`drop_subgraph_shapes` warns of it)."""
    try:
        import onnx
    except ImportError:
        return
    try:
        onnx.checker.check_model(written, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        fix = ("The model or its inputs are float64, which the TorchScript-based exporter does not write "
               "consistently: export in float32 (module.float() and float32 inputs), or with dynamo=True"
               if float64 else "Export the model again with another opset, or with dynamo=True")
        raise GwdetValueError(f"The ONNX file exported for {path} is invalid, and onnxruntime would refuse to load it "
                              f"(onnx.checker: {reason}). {fix}; nothing was written.") from None


def drop_subgraph_shapes(path: str) -> int:
    """Remove the shapes that the TorchScript-based exporter wrote for the outputs (and value
    infos) of subgraphs in the ONNX file at ``path``; returns how many it removed.

    The exporter may give sizes that differ at run time (counts of ROIs, of detections) one name,
    and onnxruntime plans its buffers by those names; without them it infers the shapes from the
    branches. Element types, and the shapes of the graph's own inputs and outputs, stay. Without the
    ``onnx`` package (the ``deploy`` extra) the file stays as written, with a warning. The file is
    rewritten atomically; one with a checksum record is checked against it first and recorded anew.
    """
    try:
        import onnx
    except ImportError:
        warnings.warn(f"onnx is not installed: {path} keeps the shapes the exporter guessed for its subgraphs, "
                      "which onnxruntime may stop on (install gwdet's deploy extra)", GwdetUserWarning, stacklevel=2)
        return 0
    verify_export(path)
    recorded = os.path.isfile(checksum_path(path))  # a record (even an unusable one) is written anew with the file
    model = onnx.load(path, load_external_data=False)
    removed = _drop_shapes_in_subgraphs(model.graph)
    if removed:
        with (path_written_with_checksum if recorded else path_written_atomically)(path) as temporary:
            onnx.save(model, temporary)
    return removed


def _drop_shapes_in_subgraphs(graph) -> int:
    import onnx

    removed = 0
    for node in graph.node:
        for attribute in node.attribute:
            subgraphs = [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else list(attribute.graphs)
            for subgraph in subgraphs:
                for value in list(subgraph.output) + list(subgraph.value_info):
                    if value.type.HasField("tensor_type") and value.type.tensor_type.HasField("shape"):
                        value.type.tensor_type.ClearField("shape")
                        removed += 1
                removed += _drop_shapes_in_subgraphs(subgraph)
    return removed


def flattened_names(schema: Schema) -> list[str]:
    """The name of each tensor a ``TracingAdapter`` returns, in order, from its ``outputs_schema``:
    the field or key each one holds (``pred_boxes``, ``scores``, ..., ``image_size`` for an
    R-CNN's ``Instances``); the whole path (``0.instances.scores``) where leaf names repeat."""
    def paths(node: Schema, at: tuple[str, ...]) -> list[tuple[str, ...]]:
        if isinstance(node, ListSchema):
            keys = getattr(node, "keys", None) or [str(index) for index in range(len(node.schemas))]
            found = [path for key, child in zip(keys, node.schemas, strict=True) for path in paths(child, (*at, str(key)))]
            return [*found, (*at, "image_size")] if isinstance(node, InstancesSchema) else found
        return [at]

    leaves = paths(schema, ())
    short = [path[-1] if path else "output" for path in leaves]
    return short if len(set(short)) == len(short) else [".".join(path) for path in leaves]


def export_model_onnx(model: torch.nn.Module, image: torch.Tensor, path: str, opset: int = ONNX_OPSET, *,
                      overwrite: bool = False) -> TracingAdapter:
    """Export the whole ``model`` (detectron2's tracing adapter on ``image``) to ONNX, at ``opset``
    :data:`MIN_DETECTOR_OPSET` or newer (detectron2's aligned ROIAlign is exported as another
    function below it); a file already at ``path`` is replaced only with ``overwrite``, and a ``path``
    that does not end in ``.onnx`` is refused. The file's
    input is named ``image`` and its outputs by :func:`flattened_names` (an R-CNN's: ``pred_boxes``,
    ``pred_classes``, [``pred_masks``,] ``scores``, ``image_size``). ``model`` must be a detectron2
    meta-architecture (a class registered in ``META_ARCH_REGISTRY``, such as ``GeneralizedRCNN``);
    another module is refused before anything is traced or written (:func:`export_onnx` exports one)."""
    _check_detector_opset(opset)
    _check_output_file(path, "model.onnx", overwrite, "export_model_onnx")  # before the model is traced
    _check_detector(model)
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    with path_written_with_checksum(path) as temporary:
        return write_model_onnx(model, image, temporary, path, opset)


def write_model_onnx(model: torch.nn.Module, image: torch.Tensor, file: str, path: str,
                     opset: int = ONNX_OPSET) -> TracingAdapter:
    """What :func:`export_model_onnx` writes, into ``file`` as it is (the caller makes it ``path``):
    the tracing adapter of ``model`` on ``image`` exported by :func:`write_onnx`; returns the adapter.
    ``model`` is exported in evaluation mode and given back in its own modes."""
    _check_detector_opset(opset)
    with evaluation_mode(model):
        adapter = tracing_adapter(model, image)
        with torch.no_grad():
            adapter(image)  # its outputs' schema, which names the file's outputs
        adapter.eval()
        write_onnx(adapter, (image,), file, path, opset, input_names=["image"],
                   output_names=flattened_names(adapter.outputs_schema))
    return adapter


def _is_detector(model: Any) -> bool:
    """Whether ``model`` is an instance of a class registered in detectron2's ``META_ARCH_REGISTRY``."""
    architectures = tuple(architecture for _, architecture in META_ARCH_REGISTRY if isinstance(architecture, type))
    return isinstance(model, architectures)


def _not_a_detector_refusal(model: Any, error: BaseException) -> GwdetTypeError:
    """The refusal of :func:`export_torchscript` for a ``model`` that is no detectron2 detector and
    failed with ``error`` on detectron2's inputs (a list of dicts) while it was traced."""
    reason = (str(error).strip().splitlines() or [""])[0].rstrip(":")
    return GwdetTypeError(
        f"export_torchscript traces a detectron2 detector (a meta-architecture such as GeneralizedRCNN, built by "
        f"gwdet.build_model) through detectron2's tracing adapter, which gives the model its input as a list of dicts, "
        f"[{{'image': image}}]; the {type(model).__name__} given failed on it ({type(error).__name__}: {reason}), so it "
        "takes tensors. Trace such a module with torch.jit.trace(module, (x,)) and torch.jit.save, x a sample batch "
        "tensor of its input (or export it to ONNX with gwdet.export.export_onnx(module, (x,), path)); nothing was "
        "written.")


def _check_detector(model: Any) -> None:
    """Refuse a ``model`` that is not a detectron2 meta-architecture (an instance of a class registered
    in ``META_ARCH_REGISTRY``: ``GeneralizedRCNN``, ``RetinaNet``, ...), whose inputs detectron2's
    tracing adapter gives as a list of dicts."""
    if _is_detector(model):
        return
    architectures = tuple(architecture for _, architecture in META_ARCH_REGISTRY if isinstance(architecture, type))
    names = ", ".join(sorted(architecture.__name__ for architecture in architectures))
    raise GwdetTypeError(
        f"export_model_onnx exports a detectron2 detector, a meta-architecture ({names}) built by gwdet.build_model, "
        f"whose input detectron2's tracing adapter gives as a list of dicts; got a {type(model).__name__}. Export a "
        "module that takes tensors with gwdet.export.export_onnx(module, (x,), path) (or torch.onnx.export), x a "
        "sample batch tensor of its input; nothing was written.")


def _check_detector_opset(opset: int) -> None:
    """Refuse an ``opset`` that is no whole number, or one below :data:`MIN_DETECTOR_OPSET`, where a
    detector's ROIAlign is another function."""
    check_int_at_least("export_model_onnx", "opset", opset, 1)
    if opset < MIN_DETECTOR_OPSET:
        raise GwdetValueError(
            f"opset {opset}: a detector's ROIAlign (aligned, as detectron2 pools regions) is exported as ONNX "
            f"RoiAlign from opset {MIN_DETECTOR_OPSET} on; below it the file computes other detections. Give opset "
            f"{MIN_DETECTOR_OPSET} or newer (the default is {ONNX_OPSET}); nothing was written.")


class DamagedExportError(DamagedFileError):
    """An exported file that no longer holds what was exported (or cannot be read as an export);
    nothing was loaded from it. The message names the file and the fix: export the model again."""


REEXPORT = ("Export the model again (tools/deploy/export_model.py with --overwrite, or "
            "gwdet.export.export_torchscript / export_model_onnx); nothing was loaded from it.")


def _exports_in(folder: str) -> str:
    """What to pass instead of ``folder``: the export files in it (names ending in
    :data:`EXPORT_SUFFIXES`), or how to make one when there is none."""
    try:
        names = sorted(name for name in os.listdir(folder)
                       if name.endswith(EXPORT_SUFFIXES) and os.path.isfile(os.path.join(folder, name)))
    except OSError as error:
        names, reason = [], f" (it cannot be listed: {error.strerror or error})"
    else:
        reason = ""
    if names:
        return f"pass the export file in it, {' or '.join(os.path.join(folder, name) for name in names)}."
    return (f"it holds no export (no .ts or .onnx file){reason}. Pass the path of an export file, written by "
            "tools/deploy/export_model.py (model.ts / model.onnx in its --output folder), "
            "gwdet.export.export_torchscript or export_model_onnx.")


def verify_export(path: str, *, stacklevel: int = 3) -> bool:
    """Check the export at ``path`` against the SHA-256 recorded in ``path.sha256`` when it was
    written: :class:`DamagedExportError` when they differ. Returns whether it was checked: not
    without a record, nor when the record is unreadable or damaged (with a warning, as
    checkpoints are, at ``stacklevel``: by default for the caller of this function's caller). A
    folder is refused naming the exports in it, and so is an export whose record is there but is no
    regular file (a folder, a link that leads nowhere: :func:`_check_record_is_a_file`)."""
    if os.path.isdir(path):
        raise GwdetIsADirectoryError(f"{path} is a folder, not an export: {_exports_in(path)}")
    if not os.path.isfile(path):
        raise GwdetFileNotFoundError(f"{path}: no such export (a file written by tools/deploy/export_model.py, "
                                     "gwdet.export.export_torchscript or export_model_onnx).")
    _check_record_is_a_file(path)
    unusable, differs = checksum_findings(path)
    if unusable is not None:
        warnings.warn(f"{path}: {unusable}, so the export is loaded unchecked. Delete "
                      f"{shown_record(path)} (or export again) to load it without this warning.",
                      GwdetUserWarning, stacklevel=stacklevel)
        return False
    if differs is not None:
        raise DamagedExportError(
            f"{path} is damaged ({differs}). {REEXPORT} If you replaced it on purpose (a newer export copied over it), "
            f"copy its {shown_record(path)} with it, or delete the old one.", path)
    return os.path.isfile(reading_record(path))


def _record_kind(record: str) -> Optional[str]:
    """What is at the checksum record's path ``record`` when it is no regular file a reader could
    check an export against (a folder, a link that leads nowhere or to a folder, a device or pipe);
    ``None`` for a regular file (or a link to one) and where nothing is."""
    if not os.path.lexists(record) or os.path.isfile(record):
        return None
    if os.path.islink(record):
        target = os.readlink(record)
        if not os.path.exists(record):
            return f"a symbolic link to {target!r}, which does not exist"
        return f"a symbolic link to {target!r}, a folder" if os.path.isdir(record) else \
            f"a symbolic link to {target!r}, which is not a regular file"
    return "a folder" if os.path.isdir(record) else "not a regular file (a device, pipe or socket)"


def _check_record_is_a_file(path: str) -> None:
    """Refuse the export at ``path`` when its checksum record ``path.sha256`` is there but is no
    regular file (:func:`_record_kind`): the export cannot be checked against it, and loading it
    unchecked would accept a damaged file without a word."""
    record = checksum_path(path)
    kind = _record_kind(record)
    if kind is not None:
        name = os.path.basename(path)
        raise GwdetValueError(
            f"{path}: its checksum record {record} is {kind}, not a file holding the SHA-256 written with the export, "
            "so the export cannot be checked; nothing was loaded. Remove it (an export without a record loads "
            "unchecked, with a warning), export the model again, or, if you know the export is whole, write the "
            f"record again (rm -r {shlex.quote(record)} && cd {shlex.quote(os.path.dirname(os.path.abspath(path)))} "
            f"&& sha256sum {shlex.quote(name)} > {shlex.quote(name + CHECKSUM_SUFFIX)}).")


def _verify_or_warn(path: str) -> None:
    """:func:`verify_export` for a reader of exports (:func:`load_export`, :func:`run_onnx`), and a
    warning, for the reader's caller, where no checksum record is beside the file (a copy without it)."""
    if not verify_export(path, stacklevel=4) and not os.path.lexists(reading_record(path)):
        warnings.warn(f"{path} has no checksum record ({os.path.basename(checksum_path(path))} beside it), so "
                      "it is loaded unchecked; gwdet's exports record one when they are written.", GwdetUserWarning,
                      stacklevel=3)


def _content_format(path: str) -> Optional[str]:
    """``"torchscript"`` or ``"onnx"`` as the file's first bytes say, ``None`` when they say neither:
    TorchScript is a zip archive; ONNX a protobuf message, which starts with its ir_version field."""
    with open(path, "rb") as f:
        head = f.read(4)
    return "torchscript" if head.startswith(b"PK") else "onnx" if head.startswith(b"\x08") else None


def _named_format(path: str) -> str:
    """``"onnx"`` or ``"torchscript"``, as the file's name says (``.onnx``: ONNX); a file whose first
    bytes say the other format is refused (one cut short or of other bytes is left to the reader)."""
    named = "onnx" if path.endswith(".onnx") else "torchscript"
    found = _content_format(path) or named
    if found != named:
        what, suffix = ("an ONNX model", ".onnx") if found == "onnx" else ("a TorchScript archive", ".ts")
        raise GwdetValueError(f"{path} holds {what}, which its name does not say: rename it to end in {suffix} "
                              "(gwdet reads the format from the name); nothing was loaded.")
    return named


def load_export(path: str | os.PathLike, map_location: Any = None, providers: Optional[Sequence[str]] = None) -> Any:
    """An export, loaded once it matches the SHA-256 recorded beside it (:func:`verify_export`): a
    TorchScript file (``model.ts``) as ``torch.jit.load(path, map_location)`` gives it, an ONNX file
    (``.onnx``) as an onnxruntime ``InferenceSession`` (``providers``, a list, by default the CPU).

    Each format takes its own device argument: ``providers`` is onnxruntime's and is refused for
    TorchScript; ``map_location`` of an ONNX file is ``'cpu'`` (``CPUExecutionProvider``) or
    ``'cuda[:N]'`` (``CUDAExecutionProvider`` on GPU N), refused when onnxruntime lacks that provider
    or together with ``providers``. A provider this onnxruntime lacks is refused, not replaced.

    A damaged file raises :class:`DamagedExportError` naming it and the fix, also one without a
    record that cannot be read as TorchScript or ONNX; a file without a record loads with a warning.
    TorchScript exports need ``import torchvision`` (its ``nms`` and ``roi_align``) before they run.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise GwdetTypeError(f"load_export takes the path of an export (a str or pathlib.Path), not {path!r}.")
    path = os.fspath(path)
    if providers is not None and (isinstance(providers, (str, bytes)) or not isinstance(providers, (list, tuple))):
        raise GwdetTypeError(f"providers takes a list of onnxruntime execution providers, not {providers!r}: give "
                             "e.g. providers=['CPUExecutionProvider'] (a list, even for one).")
    if path.endswith(CHECKSUM_SUFFIX):
        raise GwdetValueError(f"{path} is the checksum record of an export, not the export: pass "
                              f"{path[:-len(CHECKSUM_SUFFIX)]}.")
    _verify_or_warn(path)
    if _named_format(path) == "onnx":
        if map_location is not None:
            if providers is not None:
                raise GwdetValueError(f"load_export got both map_location={map_location!r} and providers={providers!r} "
                                      f"for the ONNX file {path}: give one of them (map_location='cpu' or 'cuda[:N]', "
                                      "or onnxruntime's providers list).")
            providers = _providers_for_device(map_location, path)
        return _onnx_session(path, providers)
    if providers is not None:
        raise GwdetValueError(f"providers={providers!r} are onnxruntime's execution providers, which {path} (a "
                              "TorchScript export) does not use: give its device as map_location, e.g. "
                              "map_location='cuda', or load the model.onnx of an ONNX export with providers.")
    if map_location is not None and not isinstance(map_location, (str, torch.device)):
        raise GwdetTypeError(f"load_export: map_location of a TorchScript file is a device (a str such as 'cpu' or "
                             f"'cuda:0', or a torch.device), got {map_location!r} ({type(map_location).__name__}): "
                             "torch.jit.load takes no mapping of devices, as torch.load does; give the device to load "
                             "onto.")
    if isinstance(map_location, (str, torch.device)):  # a device this machine lacks is no damaged file
        if str(map_location).split(":")[0] == "meta":
            raise GwdetValueError("map_location='meta' gives tensors without values, which a TorchScript model "
                                  "cannot be loaded into: load it with map_location='cpu' (or a GPU).")
        check_device(str(map_location), "map_location", "load it with map_location='cpu'")
    if zipfile.is_zipfile(path) and not is_torchscript_archive(path):
        raise GwdetValueError(f"{path} is a checkpoint (a torch.save archive), not a TorchScript export: export the "
                              "model with tools/deploy/export_model.py (MODEL.WEIGHTS this file), then load model.ts.")
    try:
        return torch.jit.load(path, map_location=map_location)
    except RuntimeError as error:  # not a TorchScript archive (cut short, other bytes)
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0].split(". ")[0]
        raise DamagedExportError(f"{path} cannot be read as TorchScript ({reason}). {REEXPORT}", path) from None


def _providers_for_device(map_location: Any, path: str) -> List[Any]:
    """onnxruntime's providers for a ``map_location`` of ``'cpu'`` or ``'cuda[:N]'`` (a str or a
    ``torch.device``); another device or form is refused."""
    import onnxruntime

    device = None
    if isinstance(map_location, (str, torch.device)):
        try:
            device = torch.device(map_location)
        except RuntimeError:
            pass
    if device is None or device.type not in ("cpu", "cuda"):
        raise GwdetValueError(f"map_location={map_location!r} has no ONNX form: {path} runs in onnxruntime, on "
                              "map_location='cpu' or 'cuda[:N]' (or providers=[...], onnxruntime's list).")
    if device.type == "cpu":
        return ["CPUExecutionProvider"]
    available = onnxruntime.get_available_providers()
    if "CUDAExecutionProvider" not in available:
        raise GwdetValueError(f"map_location={map_location!r} runs {path} on onnxruntime's CUDAExecutionProvider, "
                              f"which this onnxruntime lacks (it has {available}): install onnxruntime-gpu, or "
                              "load it with map_location='cpu'.")
    return [("CUDAExecutionProvider", {"device_id": device.index or 0})]


def _onnx_session(path: str, providers: Optional[Sequence[Any]] = None) -> Any:
    import onnxruntime

    available = onnxruntime.get_available_providers()
    for provider in providers or []:
        name = provider[0] if isinstance(provider, tuple) and provider else provider
        if name not in available:  # onnxruntime would fall back to the CPU
            raise GwdetValueError(f"providers names {name!r}, which this onnxruntime lacks (it has {available}): give "
                                  "providers from that list (onnxruntime-gpu brings CUDAExecutionProvider).")
    options = onnxruntime.SessionOptions()
    # errors only: onnxruntime warns when its buffer reuse meets the data-dependent shapes of an
    # R-CNN (detections), which does not change the results
    options.log_severity_level = 3
    try:
        return onnxruntime.InferenceSession(path, options, providers=list(providers or ["CPUExecutionProvider"]))
    except Exception as error:  # onnxruntime's own error types (InvalidProtobuf, Fail, ...)
        if "protobuf" not in str(error).lower():
            raise
        raise DamagedExportError(f"{path} cannot be read as ONNX ({str(error).strip().splitlines()[0]}). "
                                 f"{REEXPORT}", path) from None


# numpy's dtype names -> ONNX's (onnxruntime's input types read "tensor(<name>)")
ONNX_TYPE_NAMES = {"float32": "float", "float64": "double", "float16": "float16"}


def run_onnx(path: str | os.PathLike | Any, inputs: Sequence[Any]) -> List[Any]:
    """Outputs (numpy arrays) of an ONNX export: the file at ``path``, run in onnxruntime on the CPU,
    or an onnxruntime ``InferenceSession`` (as :func:`load_export` gives it), run as it is. A file
    that differs from its recorded SHA-256 is refused, and one without a record runs with a warning,
    as :func:`load_export` checks it (:func:`verify_export`). ``inputs`` is a list of tensors or
    numpy arrays (a flipped view, of negative strides, is copied), in the export's order; a dict
    (``session.run``'s form) is refused."""
    if isinstance(inputs, torch.Tensor) or hasattr(inputs, "__array_interface__"):  # a tensor, a numpy array
        raise GwdetValueError(f"run_onnx takes a list of the export's inputs, e.g. [image], not one "
                              f"{type(inputs).__name__} of shape {list(torch.as_tensor(inputs).shape)}: put the image "
                              "in a list.")
    if isinstance(inputs, Mapping):  # onnxruntime's session.run form
        raise GwdetTypeError(f"run_onnx takes a list of the export's inputs in their order, e.g. [image], not a dict "
                             f"(keys {list(inputs)!r}): give run_onnx(path, [image]); a dict of input names goes to "
                             "session.run(None, feeds) of gwdet.export.load_export(path).")
    session: Any
    if _is_onnx_session(path):
        session = path
        path = _session_name(session)
    elif isinstance(path, (str, os.PathLike)):
        path = os.fspath(path)
        _verify_or_warn(path)
        if _content_format(path) == "torchscript":  # by content: the export tool checks its file under a temporary name
            raise GwdetValueError(f"{path} is a TorchScript export, not ONNX: run it with "
                                  "gwdet.export.load_export(path), or give run_onnx the model.onnx of an ONNX export.")
        session = _onnx_session(path)
    else:
        raise GwdetTypeError(f"run_onnx runs an ONNX export given as the path of its file (a str or pathlib.Path) or "
                             f"as the onnxruntime InferenceSession gwdet.export.load_export(path) gives, not {path!r}: "
                             "give run_onnx('model.onnx', [image]).")
    entries = session.get_inputs()
    if len(inputs) > len(entries):  # e.g. several images for an export of one image per call
        raise GwdetValueError(
            f"run_onnx got {len(inputs)} inputs, but {path} takes {len(entries)} "
            f"({', '.join(repr(entry.name) for entry in entries)}): an export of one image per call runs once per "
            "image, run_onnx(path, [image]). Extra inputs would be left out.")
    feeds = {}
    for index, (entry, given) in enumerate(zip(entries, inputs, strict=False)):
        if isinstance(given, np.ndarray):  # a flipped view (image[..., ::-1]) has negative strides
            array = np.ascontiguousarray(given)
        else:
            array = torch.as_tensor(given).detach().cpu().numpy()  # a tensor
        dtype = f"tensor({ONNX_TYPE_NAMES.get(array.dtype.name, array.dtype.name)})"
        fixed = [size if isinstance(size, int) else None for size in entry.shape]
        if dtype != entry.type or len(fixed) != array.ndim or any(
                size is not None and size != actual for size, actual in zip(fixed, array.shape, strict=True)):
            _refuse_channels_last(index, entry, path, array, dtype, fixed)
            raise GwdetValueError(
                f"input {index} ({entry.name!r}) of {path} takes {entry.type} of shape {list(entry.shape)}, got "
                f"{dtype} of shape {list(array.shape)}: the export is fixed to the dtype and size of the sample image "
                "it was traced with. Give an image of that dtype and size (the test loader's resize, as the export "
                "tool's sample), or export again with --sample-image of the size you need"
                f"{_python_export_advice(fixed, array.shape, dtype != entry.type)}.")
        feeds[entry.name] = array
    return session.run(None, feeds)


def _refuse_channels_last(index: int, entry: Any, path: str, array: np.ndarray, dtype: str,
                          fixed: list[int | None]) -> None:
    """A ``GwdetValueError`` for an image given to :func:`run_onnx` in ``(H, W, C)`` layout where
    the export takes ``(C, H, W)``: its last axis has the channels of the export's first and its
    first does not. The message names the layout and ``image.permute(2, 0, 1)``, and what else
    differs after it (the dtype or size the export is fixed to)."""
    channels = fixed[0] if len(fixed) == 3 else None
    if array.ndim != 3 or channels is None or array.shape[2] != channels or array.shape[0] == channels:
        return
    permuted = (array.shape[2], array.shape[0], array.shape[1])
    still = [f"size {list(permuted)} (the export takes {list(entry.shape)})"
             for size, actual in zip(fixed, permuted, strict=True) if size is not None and size != actual][:1]
    if dtype != entry.type:
        still.append(f"dtype {dtype} (the export takes {entry.type})")
    then = ("" if not still else
            f" After it, the image still differs in {' and '.join(still)}: the export is fixed to the dtype and size "
            "of the sample image it was traced with; give an image of those (the test loader's resize, as the export "
            "tool's sample), or export again with --sample-image of the size you need"
            f"{_python_export_advice(fixed, permuted, dtype != entry.type)}.")
    raise GwdetValueError(
        f"input {index} ({entry.name!r}) of {path} takes {entry.type} of shape {list(entry.shape)}, got {dtype} of "
        f"shape {list(array.shape)}: an image in (H, W, C) layout, with its {channels} channels last, where the "
        "export takes (C, H, W), as detectron2's models do. Give image.permute(2, 0, 1) (of a numpy array: "
        f"image.transpose(2, 0, 1)).{then}")


def _python_export_advice(fixed: list[int | None], shape: Sequence[int], other_dtype: bool) -> str:
    """The words of :func:`run_onnx`'s refusal of an input of another dtype or size that name the
    way out for a file :func:`export_onnx` wrote in Python: a sample of the dtype or number of axes
    needed, and ``input_names`` with ``dynamic_axes`` for the axes whose size differs (each named; of
    a 4-d input: batch, channels, height, width), as ``", or, for an export_onnx(...) in Python, ..."``."""
    ways = []
    if other_dtype:
        ways.append("a sample of the dtype you need")
    if len(fixed) != len(shape):  # no axis of the export can take another number of axes
        ways.append("a sample of the number of axes you need")
    else:
        names = {4: ("batch", "channels", "height", "width"), 3: ("channels", "height", "width")}.get(len(fixed))
        varying = [axis for axis, (size, actual) in enumerate(zip(fixed, shape, strict=True))
                   if size is not None and size != actual]
        if varying:
            axes = ", ".join(f"{axis}: {names[axis] if names else f'dim{axis}'!r}" for axis in varying)
            ways.append("the sizes that vary left free: export_onnx(module, (sample,), path, input_names=['image'], "
                        f"dynamic_axes={{'image': {{{axes}}}}})")
    return f", or, for an export_onnx(module, (sample,), path) in Python, export again with {' and '.join(ways)}"


def _is_onnx_session(value: Any) -> bool:
    """Whether ``value`` is an onnxruntime ``InferenceSession`` (without importing onnxruntime for a path)."""
    return (type(value).__module__.split(".")[0] == "onnxruntime" and callable(getattr(value, "run", None))
            and callable(getattr(value, "get_inputs", None)))


def _session_name(session: Any) -> str:
    """How messages name the model of an onnxruntime session: its file, where the session tells it."""
    model_path = getattr(session, "_model_path", None)
    return model_path if isinstance(model_path, str) and model_path else "the ONNX session's model"


def max_abs_difference(expected: Any, actual: Any) -> float:
    """Largest absolute difference between two equally long sequences of outputs: tensors, numpy
    arrays or numbers of equal shapes (a shape mismatch raises ``ValueError``). An output that is
    itself a list or tuple (detectron2's outputs nest) is compared item by item, named by its place
    (``output 0.1``), and a dict (detectron2's outputs are dicts) key by key (``output 0['scores']``;
    both sides need the same keys). Anything else (a str, ``None``, an ``Instances``) is refused by
    its place and type (``GwdetTypeError``).

    Integers and bools (as 0 and 1) are compared exactly (an int64 above 2**53 too); complex
    values by the modulus of their difference; integers against floats, and floats, in float64. A
    NaN on either side, or infinities that differ, count as an infinite difference."""
    if isinstance(expected, Mapping) or isinstance(actual, Mapping):
        return _difference(expected, actual, "")
    return _largest_difference(expected, actual, "")


def _is_number(value: Any) -> bool:
    """Whether ``value`` is one plain number (a Python or numpy bool, int, float or complex)."""
    return isinstance(value, (bool, int, float, complex, np.number, np.bool_))


def _holds_arrays(value: Any) -> bool:
    """Whether ``value`` is a list or tuple with something else than a number in it (a tensor, an
    array, a list, a dict, or a value that is no number): a nested output, compared item by item (a
    list of plain numbers is one array)."""
    return isinstance(value, (list, tuple)) and not all(_is_number(item) for item in value)


def _largest_difference(expected: Sequence[Any], actual: Sequence[Any], place: str) -> float:
    """:func:`max_abs_difference` of the outputs at ``place`` (``""`` at the top, ``"0."`` in output 0)."""
    if len(expected) != len(actual):
        where = f" in output {place[:-1]}" if place else ""
        raise GwdetValueError(f"{len(expected)} outputs expected{where}, got {len(actual)}")
    largest = 0.0
    for index, (want, got) in enumerate(zip(expected, actual, strict=True)):
        largest = max(largest, _difference(want, got, f"{place}{index}"))
    return largest


def _difference(want: Any, got: Any, name: str) -> float:
    """:func:`max_abs_difference` of the expected output ``want`` and the actual ``got`` at the place
    ``name`` (``"0"``, ``"0.1"``, ``"0['scores']"``; ``""``: the dicts given at the top)."""
    shown = f"output {name}" if name else "the outputs"
    if isinstance(want, Mapping) or isinstance(got, Mapping):
        if not (isinstance(want, Mapping) and isinstance(got, Mapping)):
            raise GwdetValueError(f"{shown}: a {type(got).__name__}, expected a {type(want).__name__}: give both "
                                  "sides' outputs nested alike")
        missing = [key for key in want if key not in got]
        extra = [key for key in got if key not in want]
        if missing or extra:
            differences = [f"{', '.join(map(repr, missing))} missing" if missing else "",
                           f"{', '.join(map(repr, extra))} not expected" if extra else ""]
            raise GwdetValueError(
                f"{shown}: keys {list(got)!r}, expected {list(want)!r} ({' and '.join(filter(None, differences))}): "
                "give both sides' outputs with the same keys")
        return max((_difference(want[key], got[key], f"{name}[{key!r}]") for key in want), default=0.0)
    if _holds_arrays(want) or _holds_arrays(got):
        if not (isinstance(want, (list, tuple)) and isinstance(got, (list, tuple))):
            raise GwdetValueError(f"{shown}: a {type(got).__name__}, expected a {type(want).__name__}: give both "
                                  "sides' outputs nested alike")
        return _largest_difference(want, got, f"{name}.")
    expected = _compared_tensor(want, shown, "expected")
    actual = _compared_tensor(got, shown, "actual")
    if expected.shape != actual.shape:
        raise GwdetValueError(f"{shown}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}")
    if not expected.numel():
        return 0.0
    if expected.is_complex() or actual.is_complex():
        expected, actual = expected.to(torch.complex128), actual.to(torch.complex128)
        real = _float_difference(expected.real, actual.real)
        imaginary = _float_difference(expected.imag, actual.imag)
        return torch.hypot(real, imaginary).max().item()
    if not (expected.is_floating_point() or actual.is_floating_point()):
        return _integer_difference(expected, actual)
    return _float_difference(expected.double(), actual.double()).max().item()


def _compared_tensor(value: Any, shown: str, side: str) -> torch.Tensor:
    """``value`` (a tensor, a numpy array, a number or a list of numbers) as a CPU tensor for
    :func:`_difference`; a Python float or complex keeps float64 precision. Anything else, or an
    array of no numbers (strings, objects), is refused naming ``shown``, the place, and ``side``."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    array = None
    if isinstance(value, (np.ndarray, list, tuple)) or _is_number(value):
        try:
            array = np.asarray(value)
        except (TypeError, ValueError):  # a ragged list
            array = None
    if array is not None and array.dtype.kind in "biufc":
        return torch.from_numpy(np.ascontiguousarray(array))
    text = repr(value)
    kind = f"a numpy array of {array.dtype}" if isinstance(value, np.ndarray) and array is not None else \
        type(value).__name__
    raise GwdetTypeError(
        f"{shown}: the {side} side is {text if len(text) <= 80 else text[:77] + '...'} ({kind}), which "
        "max_abs_difference cannot compare: it compares tensors, numpy arrays and numbers, and lists, tuples and "
        "dicts of them. Give both sides' numeric outputs (e.g. the tensors of an Instances' fields), or compare "
        "other values with ==.")


def _float_difference(want: torch.Tensor, got: torch.Tensor) -> torch.Tensor:
    """``|want - got|`` of two float64 tensors, 0 where they are equal (equal infinities) and infinite
    where either holds NaN."""
    difference = torch.where(want == got, 0.0, (want - got).abs())
    return torch.nan_to_num(difference, nan=math.inf)


def _integer_difference(want: torch.Tensor, got: torch.Tensor) -> float:
    """The largest ``|want - got|`` of two integer (or bool) tensors, computed exactly without the
    wrap-around of an int64 subtraction: each value split into its upper and lower 32 bits, whose
    differences fit int64 and add up exactly in float64 up to 2**53 (beyond it, the float64 nearest
    to the true difference). uint64 values are compared as Python integers."""
    if torch.uint64 in (want.dtype, got.dtype):
        pairs = zip(want.flatten().tolist(), got.flatten().tolist(), strict=True)
        return float(max(abs(int(a) - int(b)) for a, b in pairs))
    want, got = want.to(torch.int64), got.to(torch.int64)
    upper = (want >> 32) - (got >> 32)
    lower = (want & 0xFFFFFFFF) - (got & 0xFFFFFFFF)
    return (upper.double() * 2.0 ** 32 + lower.double()).abs().max().item()
