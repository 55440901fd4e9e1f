"""Running statistics recomputed from data, for every layer of a model that keeps them.

:func:`update_running_statistics` is what ``torch.optim.swa_utils.update_bn`` does for torch's batch
norms (after weight averaging, or to replace the running averages of a training by those of the final
weights), for gwdet's :class:`~gwdet.layers.BatchWhitening` and :class:`~gwdet.layers.BatchGroupNorm`
too: each layer's running averages are reset and become the plain mean of the statistics of the
given batches (the running update ``running <- (1 - m) running + m batch`` with ``m = 1/k`` at the
k-th batch; DBN Algorithm 1 lines 10-11, and batch norm's, which BGN follows).
"""
from __future__ import annotations

import collections.abc
import copy
import itertools
import warnings
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch
from torch import nn

from gwdet.errors import GwdetRuntimeError, GwdetRuntimeWarning, GwdetTypeError, GwdetValueError, listed

from .batch_group_norm import BatchGroupNorm
from .batch_whitening import BatchWhitening
from .common import check_device_here

RUNNING_STATISTICS_LAYERS = (nn.modules.batchnorm._BatchNorm, BatchWhitening, BatchGroupNorm)
# detectron2's words when a model in training mode finds no event storage open (get_event_storage)
_EVENT_STORAGE = "has to be called inside a 'with EventStorage(...)' context"


def _run_model(model: nn.Module, batch: Any) -> Any:
    return model(batch)


# detectron2's classes that make a loader draw batches without end (a training loader's)
_ENDLESS = ("AspectRatioGroupedDataset", "TrainingSampler", "RepeatFactorTrainingSampler")


def _endless(loader: Any) -> bool:
    """Whether ``loader`` is (or wraps, through its ``dataset`` and ``sampler`` attributes) one of
    detectron2's endless training loaders; read from the objects' attributes, not their lengths."""
    waiting, looked = [loader], 0
    while waiting and looked < 16:
        found = waiting.pop()
        looked += 1
        kind = type(found)
        if kind.__module__.startswith("detectron2") and kind.__name__ in _ENDLESS:
            return True
        attributes = vars(found) if hasattr(found, "__dict__") else {}
        waiting += [attributes[name] for name in ("dataset", "sampler", "_sampler") if attributes.get(name) is not None]
    return False


def _endless_iterator(loader: Any) -> str | None:
    """The name of the ``itertools`` iterator ``loader`` is when it yields without end (``count``,
    ``cycle``, ``repeat`` without a number of times), told by its type; None otherwise."""
    if isinstance(loader, (itertools.count, itertools.cycle)):
        return f"itertools.{type(loader).__name__}"
    if isinstance(loader, itertools.repeat):
        try:
            loader.__length_hint__()
        except TypeError:  # repeat(x) has no length; repeat(x, n) has n
            return "itertools.repeat"
    return None


def _scripted_with_statistics(model: nn.Module) -> list[str]:
    """The outermost TorchScript (scripted or traced) modules of ``model`` that hold running statistics."""
    found: list[str] = []
    outer: list[str] = []
    for name, module in model.named_modules():
        if isinstance(module, torch.jit.ScriptModule) and not any(name.startswith(f"{o}.") or not o for o in outer):
            outer.append(name)
            if any(buffer.endswith("running_mean") for buffer, _ in module.named_buffers()):
                found.append(f"{name or 'the model'} ({module.original_name})")
    return found


def _first_line(error: BaseException, limit: int = 100) -> str:
    """The first line of ``error``'s message, cut short."""
    line = (str(error).splitlines() or [""])[0]
    return line if len(line) <= limit else line[:limit] + "..."


def _reads_as_device(value: Any) -> bool:
    """Whether ``value`` is what torch reads as a device (a ``torch.device``, a device string or
    index): what ``torch.optim.swa_utils.update_bn`` takes in third place."""
    if isinstance(value, torch.device):
        return True
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return False
    try:
        torch.device(value)
    except (RuntimeError, ValueError, TypeError):
        return False
    return True


def _checked_device(device: Any) -> torch.device | None:
    """``device`` as the ``torch.device`` each batch is moved to (``None``: the batches as the loader
    gives them), refused unless it is one torch reads and this machine has (:func:`check_device_here`)."""
    if device is None:
        return None
    if not _reads_as_device(device):
        kind = GwdetValueError if isinstance(device, (str, int)) and not isinstance(device, bool) else GwdetTypeError
        raise kind(
            f"update_running_statistics: device must be a torch.device, a device string ('cpu', 'cuda:0') or index, "
            f"or None (the batches as the loader gives them), got {type(device).__name__} {device!r:.60}"
            f"{', which torch does not read as a device' if kind is GwdetValueError else ''}; each batch is moved "
            "there before the forward, as torch.optim.swa_utils.update_bn moves it. The running statistics are as "
            "they were.")
    checked = torch.device(device)
    check_device_here("update_running_statistics", checked, device,
                      fix="give a device this machine has (the model's), or leave device out to give the batches as "
                          "the loader makes them. The running statistics are as they were.")
    return checked


def _holds(given: torch.device, held: torch.device) -> bool:
    """Whether ``.to(given)`` puts a tensor on ``held``, a tensor's device: ``'cuda'`` without an
    index is the current CUDA device; another type without an index is any of its devices."""
    if given.type != held.type:
        return False
    if given.type == "cuda":
        return (torch.cuda.current_device() if given.index is None else given.index) == held.index
    return given.index is None or held.index is None or given.index == held.index


def _check_batches_reach(layers: Sequence[nn.Module], moved_to: torch.device, given: Any) -> None:
    """Refuse a ``device`` that the batches, run as ``model(batch)``, would carry to no statistics
    layer: the model stays where it is (as ``torch.optim.swa_utils.update_bn`` leaves it), so
    batches on another device than its layers' fail in the first layer; and ``'meta'``, whose
    tensors hold no values, so that no statistics can come of them."""
    held = list(dict.fromkeys(buffer.device for layer in layers
                              if isinstance(buffer := layer.get_buffer("running_mean"), torch.Tensor)))
    shown = repr(str(moved_to)) if isinstance(given, (str, torch.device)) else f"{given!r} ({moved_to})"
    where = " and ".join(str(device) for device in held)
    own = [device for device in held if device.type != "meta"]
    keep = (f"give device={str(own[0])!r} (the device of the model's layers)" if len(own) == 1 else
            f"give the device of the model's layers that takes the model's input ({where})")
    if moved_to.type == "meta":
        fix = (f"{keep}, or leave device out to give the batches as the loader makes them" if own else
               "materialize the model first (model.to_empty(device='cpu'), then load its weights) and give its device")
        raise GwdetValueError(
            f"update_running_statistics: device {shown} holds no values (a meta tensor has a shape and no data), so no "
            f"statistics can come of the batches moved there; the model's layers with running statistics are on "
            f"{where}: {fix}. The running statistics are as they were.")
    if not any(_holds(moved_to, device) for device in held):
        fix = (f"{keep[0].upper()}{keep[1:]} or leave device out, or move the model there first: "
               f"model.to({str(moved_to)!r})" if own else
               f"Materialize the model there first: model.to_empty(device={str(moved_to)!r}), then load its weights")
        raise GwdetValueError(
            f"update_running_statistics: device {shown} is not the device of the model's layers with running "
            f"statistics ({where}): each batch would be moved there while the model stays where it is (as with "
            f"torch.optim.swa_utils.update_bn), so the batches would not reach them. {fix}. The running statistics "
            "are as they were.")


def _moved(batch: Any, device: torch.device) -> Any:
    """``batch`` with what it holds on ``device``: a tensor, and an object with a ``to`` method
    (detectron2's ``Instances``), moved with ``.to(device)``; a list, tuple or (mutable) mapping
    copied with its items moved; anything else (a number, a string, a file name) as it is."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, collections.abc.MutableMapping):
        moved = copy.copy(batch)
        for key, value in batch.items():
            moved[key] = _moved(value, device)
        return moved
    if isinstance(batch, list):
        return [_moved(item, device) for item in batch]
    if isinstance(batch, tuple):
        items = [_moved(item, device) for item in batch]
        return type(batch)(*items) if hasattr(batch, "_fields") else type(batch)(items)  # a namedtuple's fields
    if callable(getattr(batch, "to", None)) and not isinstance(batch, (type, nn.Module)):
        return batch.to(device)
    return batch


_METHOD_OF_DTYPE = {torch.float16: "half", torch.bfloat16: "bfloat16", torch.float32: "float",
                    torch.float64: "double"}


def _floating_tensors(batch: Any, depth: int = 0) -> list[torch.Tensor]:
    """The floating-point tensors ``batch`` holds: itself, or in its lists, tuples and mappings."""
    if isinstance(batch, torch.Tensor):
        return [batch] if batch.is_floating_point() else []
    if depth > 3:
        return []
    if isinstance(batch, Mapping):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        return [tensor for item in batch[:64] for tensor in _floating_tensors(item, depth + 1)]
    return []


def _explained_failure(error: Exception, loader: Any, batch: Any, model: nn.Module,
                       forward: Callable[[nn.Module, Any], Any]) -> Exception | None:
    """The error to raise in place of ``error``, raised by ``forward(model, batch)``, when its cause
    is one the caller can be told: batches of another floating-point dtype than the model's weights,
    a single batch given as the loader, or a tuple of inputs and targets run as ``model(batch)``;
    None otherwise."""
    kept = "The running statistics are as they were."
    if isinstance(error, RuntimeError) and "type" in str(error).lower():
        held = {tensor.dtype for tensor in itertools.chain(model.parameters(), model.buffers())
                if tensor.is_floating_point()}
        given = {tensor.dtype for tensor in _floating_tensors(batch)}
        if len(held) == 1 and given and not given <= held:
            (own,) = held
            batches = " and ".join(sorted(str(dtype) for dtype in given))
            method = _METHOD_OF_DTYPE.get(min(given, key=str))
            other = f" (or the model to the batches': model.{method}())" if method and len(given) == 1 else ""
            return GwdetTypeError(
                f"update_running_statistics: the batches are {batches} and the model's weights {own}, and torch's "
                f"layers take inputs of their weights' dtype ({type(error).__name__}: {_first_line(error)}). Convert "
                f"the batches to the model's dtype, e.g. forward=lambda m, b: m(b.to({own})){other}. {kept}")
    if isinstance(loader, torch.Tensor) and loader.dim() > 0:
        return GwdetTypeError(
            f"update_running_statistics: the loader is a single tensor of shape {list(loader.shape)}, iterating over "
            f"which gives its items one by one (of shape {list(loader.shape[1:])}), and the model failed on the first "
            f"({type(error).__name__}: {_first_line(error)}): for one batch give [batch]; for several, an iterable "
            f"of batches (a data loader, a list of batches). {kept}")
    if (isinstance(error, (TypeError, AttributeError)) and forward is _run_model and isinstance(batch, (list, tuple))
            and batch and isinstance(batch[0], torch.Tensor)):
        items = ("tensors" if all(isinstance(item, torch.Tensor) for item in batch) else "items, the first a tensor")
        return GwdetTypeError(
            f"update_running_statistics: {type(model).__name__} failed on a batch that is a {type(batch).__name__} "
            f"of {len(batch)} {items} (as a DataLoader of a TensorDataset gives: inputs and targets), run as "
            f"model(batch) ({type(error).__name__}: {_first_line(error)}); pass the forward that runs the model on "
            f"it, e.g. forward=lambda m, b: m(b[0]) for the inputs first. {kept}")
    return None


def _non_finite_statistics(layers: Sequence[nn.Module], names: Mapping[int, str], model: nn.Module, batch: Any,
                           number: int) -> GwdetValueError | None:
    """The refusal to raise when the running statistics of ``layers`` hold NaN or infinite values
    after batch ``number`` (``batch``), with its likely cause; None when they are all finite."""
    flags: dict[torch.device, list[torch.Tensor]] = {}
    for layer in layers:
        for buffer in layer.buffers(recurse=False):
            if buffer.is_floating_point() and buffer.device.type != "meta":
                flags.setdefault(buffer.device, []).append(torch.isfinite(buffer).all())
    if all(bool(torch.stack(found).all()) for found in flags.values()):  # one synchronization per device
        return None
    bad: list[str] = []
    dtype = None
    for layer in layers:
        held = [name for name, buffer in layer.named_buffers(recurse=False) if buffer.is_floating_point()
                and buffer.device.type != "meta" and not bool(torch.isfinite(buffer).all())]
        if held:
            bad.append(f"{names.get(id(layer), '?')} ({type(layer).__name__}: {', '.join(held)})")
            dtype = dtype or layer.get_buffer(held[0]).dtype
    weights = [name for name, parameter in model.named_parameters()
               if parameter.is_floating_point() and not bool(torch.isfinite(parameter).all())]
    given = _floating_tensors(batch)
    if any(not bool(torch.isfinite(tensor).all()) for tensor in given):
        cause = ("the batch holds NaN or infinite values (a corrupt image or feature). Leave such batches out of the "
                 "loader (torch.isfinite(batch).all() tells them), or repair the data")
    elif weights:
        cause = (f"the model's weights hold NaN or infinite values ({listed(weights, 3)}), so its layers' inputs do. "
                 "Load the weights of a run that did not diverge")
    else:
        cause = (f"the batch's values, or the features the model makes of them, are so large that their variance "
                 f"overflows {dtype} (in float32, values beyond about 1e19, whose squares pass its largest value "
                 f"3.4e38){'' if given else ', or the batch holds NaN or infinite values'}. Give batches of the range "
                 "the model takes (e.g. normalized images), or leave that batch out")
    return GwdetValueError(
        f"update_running_statistics: batch {number} of the loader made the running statistics of {len(bad)} "
        f"layer(s) NaN or infinite ({listed(bad, 3)}): {cause}. The running statistics are as they were.")


def _keep_uncalled(layers: Sequence[nn.Module], saved: Sequence[Mapping[str, torch.Tensor]], calls: Mapping[int, int],
                   names: Mapping[int, str], batches: int) -> None:
    """After the pass of :func:`update_running_statistics`: refuse one in which ``forward`` called no
    layer in training mode (it never ran the model, or set it to evaluation first), and put back the
    running statistics (``saved``) of the layers it never called, with a warning naming them."""
    uncalled = [index for index, layer in enumerate(layers) if calls[id(layer)] == 0]
    if len(uncalled) == len(layers):
        raise GwdetValueError(
            f"update_running_statistics: the forward called none of the model's layers with running statistics in "
            f"training mode over {batches} batch(es): it does not run the model, or sets it to evaluation first "
            "(model.eval()), where they compute with their running statistics and update none. Give a forward that "
            "runs the model as it is (update_running_statistics sets it to training mode). The running statistics are "
            "as they were.")
    for index in uncalled:
        for name, value in saved[index].items():
            getattr(layers[index], name).copy_(value)
    if uncalled:
        shown = [names[id(layers[index])] for index in uncalled]
        warnings.warn(f"update_running_statistics: the forward never called {len(uncalled)} of the layers with running "
                      f"statistics in training mode ({listed(shown, 3)}: a branch the batches do not reach?); their "
                      "running statistics are kept as they were.", GwdetRuntimeWarning, stacklevel=3)


def _detectron2_like(model: nn.Module) -> bool:
    """Whether ``model`` looks like a detectron2 model, which takes a list of image records (dicts)
    and never a single one; a model of one's own may take a dict (whatever its keys, ``"image"``
    among them)."""
    return hasattr(model, "proposal_generator") or type(model).__module__.startswith(("detectron2.", "gwdet."))


def update_running_statistics(loader: Iterable[Any], model: nn.Module,
                              forward: Callable[[nn.Module, Any], Any] = _run_model, *,
                              device: torch.device | str | int | None = None) -> int:
    """Recompute the running statistics of every torch batch norm, BW and BGN/GhostBN layer of
    ``model`` as the mean of their batch statistics over their calls while the batches of ``loader``
    are each given to ``forward(model, batch)`` (default ``model(batch)``; a detectron2 model takes a
    loader's list of dicts as it is; a dict the loader gives is refused with the default, as iterating
    over one detectron2 batch gives its images' records: a model whose forward takes a dict is run
    with ``forward=lambda m, b: m(b)``) in training mode without gradients: a layer called twice per
    batch, or on some batches only, averages the calls it had; one the forward never calls keeps its
    statistics, with a warning, and a forward that calls none in training mode is refused. ``device``, as
    ``torch.optim.swa_utils.update_bn``'s: where each batch is moved before it is given to the
    forward (its tensors, and those in its lists, tuples and dicts, with ``.to(device)``); the model
    stays where it is, so with the default forward a device other than its statistics layers', or
    ``'meta'`` (no values), is refused. ``None`` gives the batches as the loader makes them. The training mode of every module (each
    one's own, as the user set it) and the layers' momenta are restored; when ``forward`` or the loader fails, the running statistics are put back as they were.
    A batch after which a layer's running statistics hold NaN or infinite values (a batch with such
    values, or values whose variance overflows the layer's dtype, or diverged weights) is refused
    with ``GwdetValueError`` naming the layers, the running statistics put back likewise.
    Layers of other classes that keep running statistics with a momentum (a norm of one's own) are
    left as they were, with a warning naming them: how their momentum updates them is theirs to say.
    Returns the number of batches."""
    if not isinstance(model, nn.Module):
        swapped = " (the loader and the model given the other way round?)" if isinstance(loader, nn.Module) else ""
        raise GwdetTypeError(f"update_running_statistics: model must be a torch.nn.Module (the model whose layers it "
                             f"recomputes), got {type(model).__name__}{swapped}; call it as "
                             "update_running_statistics(loader, model).")
    if not isinstance(loader, collections.abc.Iterable) or isinstance(loader, (str, bytes)):
        raise GwdetTypeError(f"update_running_statistics: loader must be an iterable of batches (a data loader, a list "
                             f"of batches, itertools.islice(loader, 200)), got {type(loader).__name__}; the running "
                             "statistics are as they were.")
    if not callable(forward):
        fix = ("leave it out for model(batch), or give e.g. forward=lambda m, b: m(b[0])" if not _reads_as_device(forward)
               else f"the device torch.optim.swa_utils.update_bn takes in third place goes by keyword here: "
                    f"update_running_statistics(loader, model, device={forward!r})")
        raise GwdetTypeError(f"update_running_statistics: forward must be a callable forward(model, batch) that runs "
                             f"the model on one batch, got {type(forward).__name__} {forward!r:.60}; {fix}. The running "
                             "statistics are as they were.")
    moved_to = _checked_device(device)
    scripted = _scripted_with_statistics(model)
    if scripted:
        raise GwdetTypeError(f"update_running_statistics: {listed(scripted, 3)} is scripted or traced (torch.jit) and "
                             "holds layers with running statistics, which it cannot reach inside a TorchScript module: "
                             "recompute them on the eager model first, then script or trace it. The running "
                             "statistics are as they were.")
    layers = [module for module in model.modules() if isinstance(module, RUNNING_STATISTICS_LAYERS)
              and module.running_mean is not None]
    others = {name: module for name, module in model.named_modules()
              if not isinstance(module, RUNNING_STATISTICS_LAYERS) and hasattr(module, "momentum")
              and isinstance(getattr(module, "running_mean", None), torch.Tensor)}
    if others:
        named = [f"{name} ({type(module).__name__})" for name, module in others.items()]
        warnings.warn(f"update_running_statistics: {len(others)} layer(s) of classes it does not know keep running "
                      f"statistics ({listed(named, 3)}): they are left as they were (it recomputes torch's batch "
                      "norms, BW, BGN and GhostBN). Recompute theirs as their class defines its momentum.",
                      GwdetRuntimeWarning, stacklevel=2)
    if not layers:
        raise GwdetValueError(f"update_running_statistics: {type(model).__name__} has no layer with running statistics "
                              "(torch's batch norms, BW, BGN, GhostBN), so there is nothing to recompute.")
    if moved_to is not None and forward is _run_model:
        _check_batches_reach(layers, moved_to, device)
    if _endless(loader):
        raise GwdetValueError(
            "update_running_statistics: the loader is detectron2's training loader, which draws batches without end "
            "(its TrainingSampler repeats the dataset), so the recomputation would never finish: give a number of its "
            "batches, e.g. itertools.islice(loader, 200). The running statistics are as they were.")
    endless = _endless_iterator(loader)
    if endless is not None:
        raise GwdetValueError(
            f"update_running_statistics: the loader is an {endless} object, which yields batches "
            "without end, so the recomputation would never finish: give a finite number of batches, e.g. "
            f"itertools.islice(loader, 200), or a list of them ([batch] * 200 for one batch 200 times"
            f"{', itertools.repeat(batch, 200)' if endless == 'itertools.repeat' else ''}). The running statistics are "
            "as they were.")
    saved = [{name: buffer.clone() for name, buffer in layer.named_buffers(recurse=False)} for layer in layers]
    kept = [{name: buffer.clone() for name, buffer in layer.named_buffers(recurse=False)} for layer in others.values()]
    momenta = [layer.momentum for layer in layers]
    modes = [(module, module.training) for module in model.modules()]
    names = {id(module): name or "the model" for name, module in model.named_modules()}
    batches = 0
    calls = {id(layer): 0 for layer in layers}  # the calls of each layer in training mode so far

    def average_over_calls(layer: Any, inputs: Any) -> None:
        """Before a layer's call in training mode: the momentum that makes its running statistics the
        mean over its calls so far (1/k at the k-th), however often a batch's forward calls it."""
        if layer.training:
            calls[id(layer)] += 1
            layer.momentum = 1.0 / calls[id(layer)]

    hooks = [layer.register_forward_pre_hook(average_over_calls) for layer in layers]
    try:
        for layer in layers:
            layer.reset_running_stats()
        model.train()
        with torch.no_grad():
            for batches, batch in enumerate(loader, start=1):
                if forward is _run_model and isinstance(batch, Mapping):  # a detectron2 model takes a list of them
                    keywords = ("" if _detectron2_like(model) else
                                "for a model whose forward takes the dict's entries as keyword arguments, pass "
                                "forward=lambda m, b: m(**b); for one whose forward takes the dict itself, "
                                "forward=lambda m, b: m(b); for one that takes a list of such dicts, ")
                    raise GwdetTypeError(
                        "update_running_statistics: the loader gave a dict (one image's record, as iterating over a "
                        f"single batch gives), not a batch: {keywords}give an iterable of batches, each a list of such dicts (a "
                        "detectron2 loader, itertools.islice of one, or [batch] for one batch). The running statistics "
                        "are as they were.")
                if (forward is _run_model and hasattr(model, "proposal_generator") and isinstance(batch, list)
                        and any(isinstance(item, Mapping) and "instances" not in item for item in batch)):
                    raise GwdetValueError(
                        "update_running_statistics: the batches carry no annotations ('instances' in each image's "
                        "dict), and a detectron2 detector's forward in training mode needs them (its proposal "
                        "generator and heads): give it training batches (gwdet's Trainer.build_train_loader(cfg), or "
                        "detectron2's build_detection_train_loader), not a test loader's. The running statistics are "
                        "as they were.")
                given = batch if moved_to is None else _moved(batch, moved_to)
                try:
                    forward(model, given)
                except Exception as error:
                    explained = _explained_failure(error, loader, given, model, forward)
                    if explained is not None:
                        raise explained from error
                    raise
                refused = _non_finite_statistics(layers, names, model, given, batches)
                if refused is not None:
                    raise refused
        if batches == 0:
            raise GwdetValueError("update_running_statistics: the loader gave no batch; give it the training "
                                  "batches to average the statistics over.")
        _keep_uncalled(layers, saved, calls, names, batches)
    except BaseException as error:
        for layer, buffers in zip(layers, saved, strict=True):
            for name, value in buffers.items():
                getattr(layer, name).copy_(value)
        if isinstance(error, AssertionError) and _EVENT_STORAGE in str(error):
            raise GwdetRuntimeError(
                "update_running_statistics: the model records its training statistics in detectron2's event storage "
                "(a detectron2 model in training mode does), and none is open: call it inside "
                "`with detectron2.utils.events.EventStorage():`. The running statistics are as they were.") from error
        raise
    finally:
        for hook in hooks:
            hook.remove()
        for layer, momentum in zip(layers, momenta, strict=True):
            layer.momentum = momentum
        for layer, buffers in zip(others.values(), kept, strict=True):  # their own forward moved them
            for name, value in buffers.items():
                getattr(layer, name).copy_(value)
        for module, training in modes:
            module.training = training
    return batches
