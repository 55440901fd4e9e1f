"""Checkpoints that survive a killed run and load without executing code.

:class:`ResilientCheckpointer` is detectron2's ``DetectionCheckpointer`` with four changes:

* ``save`` writes to a temporary file and renames it into place, so a kill during saving never
  leaves a truncated ``model_*.pth`` under a real name;
* ``resume_or_load(resume=True)`` tries the checkpoint ``last_checkpoint`` names, then the other
  ``model_*.pth`` files newest first, and skips (with a warning) any that cannot be read;
* files are read without executing code (:mod:`gwdet.checkpoint.safe_load`); a file that needs
  more is refused with an explanation, unless the user opts in with ``GWDET_ALLOW_UNSAFE_PICKLE=1``;
* converted ImageNet weights that misfit the model (architecture, GW positions) are refused
  (:mod:`gwdet.checkpoint.compatibility`);
* the random number generators (torch, numpy, python) are saved with each checkpoint and restored
  on resume, so a resumed run draws the same random numbers as an uninterrupted one.
"""
from __future__ import annotations

import os
import pickle
import random
import re
from typing import Any

import numpy as np
import torch
from detectron2.checkpoint import DetectionCheckpointer

from gwdet.checkpoint.compatibility import check_weights_fit_model
from gwdet.checkpoint.convert import METADATA_KEY
from gwdet.checkpoint.safe_load import UnsafeCheckpointError, load_pickle_file, load_torch_file

UNSAFE_PICKLE_ENV = "GWDET_ALLOW_UNSAFE_PICKLE"
_OPT_IN = f"set the environment variable {UNSAFE_PICKLE_ENV}=1"
_CHECKPOINT_NAME = re.compile(r"^model_(\d+|final)\.pth$")


def unsafe_pickle_allowed() -> bool:
    return os.environ.get(UNSAFE_PICKLE_ENV, "") == "1"


def load_pickle_weights(path: str) -> Any:
    """A ``.pkl`` weight file through the numpy-only unpickler (opt-in: ``GWDET_ALLOW_UNSAFE_PICKLE=1``)."""
    return load_pickle_file(path, unsafe_pickle_allowed(), _OPT_IN)


def load_torch_checkpoint(path: str) -> Any:
    """``torch.load(path, weights_only=True)`` (opt-in to more: ``GWDET_ALLOW_UNSAFE_PICKLE=1``)."""
    return load_torch_file(path, unsafe_pickle_allowed(), _OPT_IN)


class RandomState:
    """A checkpointable holding the torch, numpy and python random generators' states."""

    def state_dict(self) -> dict:
        name, keys, position, has_gauss, cached_gaussian = np.random.get_state()
        version, internal, gauss_next = random.getstate()
        return {
            "torch": torch.get_rng_state(),
            "numpy": [name, keys.tolist(), position, has_gauss, cached_gaussian],
            "python": [version, list(internal), gauss_next],
        }

    def load_state_dict(self, state: dict) -> None:
        torch.set_rng_state(state["torch"])
        name, keys, position, has_gauss, cached_gaussian = state["numpy"]
        np.random.set_state((name, np.asarray(keys, dtype=np.uint32), position, has_gauss, cached_gaussian))
        version, internal, gauss_next = state["python"]
        random.setstate((version, tuple(internal), gauss_next))


class ResilientCheckpointer(DetectionCheckpointer):
    """``DetectionCheckpointer`` with atomic saves, fallback on unreadable files and safe loading."""

    def save(self, name: str, **extra: Any) -> None:
        if not self.save_dir or not self.save_to_disk:
            return
        data = {"model": self.model.state_dict()}
        data.update({key: obj.state_dict() for key, obj in self.checkpointables.items()})
        data.update(extra)
        basename = f"{name}.pth"
        final_path = os.path.join(self.save_dir, basename)
        partial_path = final_path + ".partial"
        self.logger.info(f"Saving checkpoint to {final_path}")
        with open(partial_path, "wb") as f:
            torch.save(data, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial_path, final_path)
        self.tag_last_checkpoint(basename)

    def resume_candidates(self) -> list[str]:
        """The checkpoint ``last_checkpoint`` names, then the other ``model_*.pth`` newest first."""
        others = [n for n in os.listdir(self.save_dir) if _CHECKPOINT_NAME.match(n)] if os.path.isdir(self.save_dir) else []
        others.sort(key=lambda n: (n != "model_final.pth", -int(n[6:-4]) if n[6:-4].isdigit() else 0))
        tagged = os.path.basename(self.get_checkpoint_file()) if self.has_checkpoint() else None
        ordered = ([tagged] if tagged else []) + [n for n in others if n != tagged]
        return [os.path.join(self.save_dir, n) for n in ordered]

    def load_weights(self, path: str) -> dict:
        """Initial weights (``MODEL.WEIGHTS``): a missing local file is an error naming the fix."""
        if path and "://" not in path and not os.path.isfile(path):
            raise FileNotFoundError(
                f"MODEL.WEIGHTS file {path!r} does not exist. Convert ImageNet weights with "
                "tools/convert_pretrained.py IN OUT (see README), or set MODEL.WEIGHTS \"\" to train from scratch."
            )
        return self.load(path, checkpointables=[]) if path else {}

    def resume_or_load(self, path: str, *, resume: bool = True) -> dict:
        if not resume:
            return self.load_weights(path)
        candidates = self.resume_candidates()
        for candidate in candidates:
            try:
                return self.load(candidate)
            except (OSError, EOFError, RuntimeError, pickle.UnpicklingError) as err:
                if isinstance(err, UnsafeCheckpointError):
                    raise
                self._parsed_url_during_load = None  # detectron2's load leaves it set when it raises
                self.logger.warning(f"Cannot read checkpoint {candidate} ({err}); trying the previous one.")
        if candidates:
            raise RuntimeError(
                f"None of the checkpoints in {self.save_dir} can be read ({', '.join(candidates)}). "
                "Delete them to start over, or restore one from a backup."
            )
        return self.load_weights(path)

    def _load_model(self, checkpoint: dict):
        if isinstance(checkpoint.get(METADATA_KEY), dict):
            check_weights_fit_model(checkpoint[METADATA_KEY], self.model)
        return super()._load_model(checkpoint)

    def _load_file(self, filename: str) -> dict:
        if filename.endswith(".pkl"):
            data = load_pickle_weights(filename)
            if "model" in data and "__author__" in data:
                return data
            return {"model": data, "__author__": "unknown", "matching_heuristics": True}
        return super()._load_file(filename)

    def _torch_load(self, f: str) -> Any:
        return load_torch_checkpoint(f)
