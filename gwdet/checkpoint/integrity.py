"""Checksums that make a damaged weight file or checkpoint an error instead of a silently different model.

``torch.save`` archives and pickles carry no check of their tensor bytes, so bytes overwritten
inside a tensor load without a word. :func:`with_checksums` records, in a checkpoint or converted
weight file, a CRC-32 of every weight (:data:`CHECKSUMS_KEY`, ``{weight name: CRC}``) and of every
other value (:data:`STATE_CHECKSUMS_KEY`, nested dicts followed, e.g.
``trainer/_trainer/optimizer/state/3/momentum_buffer``). :func:`verify_checksums` compares them when
the file is read again, naming the file and the damaged values; training state removed whole from a
file can be accepted where only the weights are loaded. Files without checksums load unchecked.
"""
from __future__ import annotations

import zlib
import os
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import torch

from gwdet.errors import listed
from gwdet.utils.atomic import DamagedFileError

CHECKSUMS_KEY = "gwdet_checksums"
STATE_CHECKSUMS_KEY = "gwdet_state_checksums"
_SEPARATOR = "/"  # between the keys of nested dicts in STATE_CHECKSUMS_KEY's names
SHOWN = 4  # damaged names quoted in one message


class DamagedTensorsError(DamagedFileError):
    """A weight file or checkpoint whose values differ from those recorded when it was written (the
    :class:`gwdet.utils.atomic.DamagedFileError` of weight files; ``damaged``: the weights' names,
    ``state``: the other values' names; ``dtypes``: the dtypes the damaged weights have now, named
    when they all share one other than float32, as a conversion such as ``.half()`` leaves them).
    The message also says how to keep a file that was changed on purpose (:func:`without_checksums_recipe`)."""

    def __init__(self, path: str, damaged: list[str], state: list[str] | None = None,
                 dtypes: Sequence[str] = ()) -> None:
        state = state or []
        parts = []
        if damaged:
            shown = listed(damaged, SHOWN)
            converted = {str(dtype).replace("torch.", "") for dtype in dtypes}
            if len(converted) == 1 and converted != {"float32"}:
                shown += f"; every one of them is {converted.pop()} now"
            parts.append(f"{len(damaged)} tensor(s) differ from what was written ({shown})")
        if state:
            parts.append(f"{len(state)} value(s) of its training state or metadata differ from what was written "
                         f"or are gone ({listed(state, SHOWN)})")
        super().__init__(
            f"{path} is damaged: {'; '.join(parts)}; nothing was loaded from it. Restore the file from a copy or "
            "write it again (train, or convert the weights again); a training's --resume uses the previous checkpoint "
            "in the folder instead. If the file was changed on purpose (its training state removed to publish the "
            "weights, the weights converted to another dtype), the checksums gwdet recorded in it no longer apply: "
            f"save it without them (its keys {CHECKSUMS_KEY} and {STATE_CHECKSUMS_KEY}), e.g. "
            f"{without_checksums_recipe(path)}", path)
        self.damaged = damaged
        self.state = state


def without_checksums_recipe(path: str) -> str:
    """The Python line that writes the weight file ``path`` again without gwdet's checksums
    (:data:`CHECKSUMS_KEY`, :data:`STATE_CHECKSUMS_KEY`), everything else kept: ``torch.load`` /
    ``torch.save`` for a checkpoint, ``pickle`` for converted ``.pkl`` weights."""
    stem, suffix = os.path.splitext(path)
    target = f"{stem}_unchecked{suffix or '.pth'}"
    drop = f'{{k: v for k, v in d.items() if k not in ("{CHECKSUMS_KEY}", "{STATE_CHECKSUMS_KEY}")}}'
    if suffix == ".pkl":
        return (f'import pickle; d = pickle.load(open("{path}", "rb")); '
                f'pickle.dump({drop}, open("{target}", "wb"))')
    return f'import torch; d = torch.load("{path}", weights_only=True); torch.save({drop}, "{target}")'


def tensor_checksum(value: Any) -> int | None:
    """CRC-32 of a tensor's or array's bytes (``None`` for anything else)."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().contiguous()
        if value.dtype == torch.bfloat16:
            value = value.view(torch.int16)
        return zlib.crc32(value.numpy().tobytes()) if value.numel() else 0
    if isinstance(value, np.ndarray):
        return zlib.crc32(np.ascontiguousarray(value).tobytes())
    return None


def checksums(weights: Mapping[str, Any]) -> dict[str, int]:
    """``{name: CRC-32}`` of every tensor or array of a (state) dict."""
    found = {name: tensor_checksum(value) for name, value in weights.items()}
    return {name: value for name, value in found.items() if value is not None}


def value_checksum(value: Any) -> int:
    """CRC-32 of any value a checkpoint holds: a tensor's or array's dtype, shape and bytes, a
    number's or string's type and ``repr`` (exact for floats), dicts and sequences item by item (with
    their keys), in order."""
    crc = 0
    for piece in _value_pieces(value):
        crc = zlib.crc32(piece, crc)
    return crc


def _value_pieces(value: Any) -> Iterator[bytes]:
    if isinstance(value, (torch.Tensor, np.ndarray)):
        yield f"{type(value).__name__}:{value.dtype}:{tuple(value.shape)}:".encode()
        yield str(tensor_checksum(value)).encode()
    elif isinstance(value, Mapping):  # dict or OrderedDict alike
        yield f"{{{len(value)}:".encode()
        for key, item in value.items():
            yield from _value_pieces(key)
            yield from _value_pieces(item)
        yield b"}"
    elif isinstance(value, (list, tuple)):  # list or tuple alike
        yield f"[{len(value)}:".encode()
        for item in value:
            yield from _value_pieces(item)
        yield b"]"
    else:  # numbers, strings, bytes, None, and whatever else a file holds: by its repr
        yield f"{type(value).__name__}:{value!r};".encode()


def state_checksums(data: Mapping[str, Any], weights_key: str = "model") -> dict[str, int]:
    """``{name: CRC-32}`` (:func:`value_checksum`) of every value of ``data`` but its weights
    (``data[weights_key]``) and checksums; nested dicts are followed, ``a/b/c`` names a value."""
    found: dict[str, int] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping) and value:
            for key, item in value.items():
                walk(f"{prefix}{_SEPARATOR}{key}", item)
        else:
            found[prefix] = value_checksum(value)

    for key, value in data.items():
        if key not in (weights_key, CHECKSUMS_KEY, STATE_CHECKSUMS_KEY):
            walk(str(key), value)
    return found


def _state_value(value: Any, name: str) -> tuple[bool, Any]:
    """``(found, value)`` of the value :func:`state_checksums` named ``name`` inside ``value`` (a
    key may hold the separator itself: every key the name starts with is tried)."""
    if not isinstance(value, Mapping):
        return False, None
    for key, item in value.items():
        key = str(key)
        if name == key:
            return True, item
        if name.startswith(key + _SEPARATOR):
            found, inner = _state_value(item, name[len(key) + 1:])
            if found:
                return True, inner
    return False, None


def with_checksums(data: dict, weights_key: str = "model") -> dict:
    """``data`` with :data:`CHECKSUMS_KEY` holding the checksums of ``data[weights_key]`` and
    :data:`STATE_CHECKSUMS_KEY` those of every other value (:func:`state_checksums`)."""
    return {**data, CHECKSUMS_KEY: checksums(data[weights_key]),
            STATE_CHECKSUMS_KEY: state_checksums(data, weights_key)}


def removed_entries(data: Mapping, names: Sequence[str]) -> list[str]:
    """The entries of ``data`` (a checkpoint's top-level keys: ``optimizer``, ``trainer``,
    ``random_state``, ...) removed altogether, when every one of the recorded values ``names``
    (:func:`state_checksums`' names of the values that differ or are gone) lies in such an entry;
    ``[]`` when any of them lies in an entry that is still there (a changed value: damage)."""
    present = [str(key) for key in data]
    if any(name == key or name.startswith(key + _SEPARATOR) for name in names for key in present):
        return []
    return sorted({name.split(_SEPARATOR)[0] for name in names})


def verify_checksums(path: str, data: Mapping, weights_key: str = "model",
                     accept_removed_state: bool = False) -> list[str]:
    """Raise :class:`DamagedTensorsError` when a tensor of ``data[weights_key]`` no longer has the
    checksum recorded in ``data``, or another recorded value differs or is gone; nothing to check
    where nothing was recorded. Weights a user removed from the file are not damage (the loader
    reports them as missing); a value of the training state that is gone is, unless
    ``accept_removed_state`` (only the weights are loaded) and every such value went with a whole
    entry of the file (:func:`removed_entries`) while every weight is intact: the names of those
    entries are returned then (``[]`` for an intact file), for the caller to say so."""
    recorded = data.get(CHECKSUMS_KEY)
    damaged: list[str] = []
    weights = data.get(weights_key, {})
    if isinstance(recorded, Mapping):
        damaged = [name for name, expected in recorded.items()  # a missing weight is the loader's to report
                   if name in weights and tensor_checksum(weights[name]) != expected]
    state = data.get(STATE_CHECKSUMS_KEY)
    changed: list[str] = []
    if isinstance(state, Mapping):
        for name, expected in state.items():
            found, value = _state_value(data, name)
            if not found or value_checksum(value) != expected:
                changed.append(name)
    if not damaged and not changed:
        return []
    removed = removed_entries(data, changed) if accept_removed_state and not damaged else []
    if not removed:
        dtypes = [str(getattr(weights[name], "dtype", "")) for name in damaged]
        raise DamagedTensorsError(path, damaged, changed, dtypes)
    return removed
