"""Checkpoints and weights gwdet reads itself never execute code unless the user opts in."""
import pickle

import numpy as np
import pytest
import torch

from gwdet.checkpoint.resilient import (
    UNSAFE_PICKLE_ENV,
    UnsafeCheckpointError,
    load_pickle_weights,
    load_torch_checkpoint,
)


class Payload:
    """Stands for any class a malicious file could ask the unpickler to build."""


def test_plain_checkpoint_loads(tmp_path):
    path = tmp_path / "ok.pth"
    torch.save({"model": {"w": torch.ones(2)}, "iteration": 3}, path)
    assert load_torch_checkpoint(str(path))["iteration"] == 3


def test_checkpoint_with_arbitrary_objects_is_refused_unless_opted_in(tmp_path, monkeypatch):
    path = tmp_path / "unsafe.pth"
    torch.save({"model": {"w": torch.ones(2)}, "extra": Payload()}, path)
    monkeypatch.delenv(UNSAFE_PICKLE_ENV, raising=False)
    with pytest.raises(UnsafeCheckpointError) as err:
        load_torch_checkpoint(str(path))
    assert "execute arbitrary code" in str(err.value) and UNSAFE_PICKLE_ENV in str(err.value)
    monkeypatch.setenv(UNSAFE_PICKLE_ENV, "1")
    assert isinstance(load_torch_checkpoint(str(path))["extra"], Payload)


def test_numpy_pickle_weights_load_and_code_is_refused(tmp_path, monkeypatch):
    good = tmp_path / "good.pkl"
    good.write_bytes(pickle.dumps({"model": {"stem.conv1.weight": np.ones((2, 3), np.float32)}, "__author__": "t"}))
    assert load_pickle_weights(str(good))["model"]["stem.conv1.weight"].shape == (2, 3)
    bad = tmp_path / "bad.pkl"
    bad.write_bytes(pickle.dumps({"model": Payload()}))
    monkeypatch.delenv(UNSAFE_PICKLE_ENV, raising=False)
    with pytest.raises(UnsafeCheckpointError, match="Payload"):
        load_pickle_weights(str(bad))
