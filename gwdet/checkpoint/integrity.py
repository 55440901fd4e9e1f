"""Checksums that make a damaged weight file an error instead of a silently different model.

``torch.save`` archives carry no check of their tensor bytes, and a pickle of numpy arrays none at
all: bytes overwritten inside a tensor (a bad disk, an interrupted copy) load without a word. gwdet
records a CRC-32 of every tensor's bytes next to the tensors when it writes a checkpoint or a
converted weight file (:func:`with_checksums`), and :func:`verify_checksums` compares them when the
file is read again, naming the file and the damaged tensors. Files without checksums (detectron2's
own, older ones) load as before.
"""
from __future__ import annotations

import zlib
from typing import Any, Mapping

import numpy as np
import torch

from gwdet.engine.atomic import DamagedFileError

CHECKSUMS_KEY = "gwdet_checksums"


class DamagedTensorsError(DamagedFileError):
    """A weight file whose tensor bytes differ from those recorded when it was written (the
    :class:`gwdet.engine.atomic.DamagedFileError` of weight files; ``damaged``: the tensors' names)."""

    def __init__(self, path: str, damaged: list[str]) -> None:
        shown = ", ".join(damaged[:4]) + (", ..." if len(damaged) > 4 else "")
        super().__init__(
            f"{path} is damaged: {len(damaged)} tensor(s) differ from what was written ({shown}); nothing "
            "was loaded from it. Restore the file from a copy or write it again (train, or convert the "
            "weights again); with --resume, the previous checkpoint in the folder is used instead.", path)
        self.damaged = damaged


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


def with_checksums(data: dict, weights_key: str = "model") -> dict:
    """``data`` with :data:`CHECKSUMS_KEY` holding the checksums of ``data[weights_key]``."""
    return {**data, CHECKSUMS_KEY: checksums(data[weights_key])}


def verify_checksums(path: str, data: Mapping, weights_key: str = "model") -> None:
    """Raise :class:`DamagedTensorsError` when a tensor of ``data[weights_key]`` no longer has the
    checksum recorded in ``data``; nothing to check when none was recorded. Weights a user removed
    from the file are not damage (the loader reports them as missing)."""
    recorded = data.get(CHECKSUMS_KEY)
    if not isinstance(recorded, Mapping):
        return
    weights = data.get(weights_key, {})
    damaged = [name for name, expected in recorded.items()  # a missing weight is the loader's to report
               if name in weights and tensor_checksum(weights[name]) != expected]
    if damaged:
        raise DamagedTensorsError(path, damaged)
