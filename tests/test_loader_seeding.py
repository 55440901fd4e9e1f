"""The train loader is seeded on every supported detectron2: through ``seed=`` where
``build_detection_train_loader`` takes it, otherwise (detectron2 v0.6) by giving the DataLoader inside
the same generator afterwards. Both paths are exercised here whatever detectron2 is installed."""
import pytest
import torch

from gwdet.data import prepare_datasets
from gwdet.data import resumable
from gwdet.engine.trainer import Trainer
from gwdet.model_zoo import build_config

from conftest import DEMO_CONFIG, TINY_OPTS


@pytest.fixture(params=["detected", "fallback"])
def seeding_path(request, monkeypatch):
    """'detected': whatever this detectron2 offers; 'fallback': as if it had no seed= (v0.6)."""
    if request.param == "fallback":
        monkeypatch.setattr(resumable, "loader_accepts_seed", lambda: False)
    return request.param


def _config(*opts):
    cfg = build_config(str(DEMO_CONFIG), TINY_OPTS + list(opts))
    prepare_datasets(cfg)
    return cfg


def _generator(loader) -> torch.Generator:
    (data_loader,) = resumable._inner_data_loaders(loader)
    assert data_loader.generator is not None, "the loader's DataLoader has its own generator"
    return data_loader.generator


def test_the_loader_gets_a_generator_seeded_with_cfg_seed(seeding_path):
    cfg = _config("SEED", "7")
    expected = torch.Generator()
    expected.manual_seed(7)  # rank 0
    assert torch.equal(_generator(Trainer.build_train_loader(cfg)).get_state(), expected.get_state())


def test_both_paths_give_the_same_generator(monkeypatch):
    cfg = _config("SEED", "3")
    detected = _generator(Trainer.build_train_loader(cfg)).get_state()
    monkeypatch.setattr(resumable, "loader_accepts_seed", lambda: False)
    assert torch.equal(_generator(Trainer.build_train_loader(cfg)).get_state(), detected)


def test_a_worker_process_loader_repeats_its_stream_and_spares_torch_global_generator(seeding_path):
    """With a worker process, augmentation randomness comes from the worker seed, which the seeded
    generator fixes: two loaders built alike yield the same tensors."""
    cfg = _config("SEED", "5", "DATALOADER.NUM_WORKERS", "1", "INPUT.RANDOM_FLIP", "horizontal")
    before = torch.get_rng_state()
    streams = []
    for _ in range(2):
        iterator = iter(Trainer.build_train_loader(cfg))
        streams.append([torch.stack([d["image"] for d in next(iterator)]) for _ in range(3)])
        del iterator
    assert torch.equal(torch.get_rng_state(), before)
    for first, second in zip(*streams, strict=True):
        assert torch.equal(first, second)


def test_a_loader_without_a_reachable_dataloader_fails_naming_the_versions():
    with pytest.raises(RuntimeError, match=r"seed=.*detectron2 v0\.6"):
        resumable.seed_loader_generator(object(), 0)


def test_an_unseeded_config_leaves_the_generator_unset(seeding_path):
    cfg = _config("SEED", "-1")
    (data_loader,) = resumable._inner_data_loaders(Trainer.build_train_loader(cfg))
    assert data_loader.generator is None
