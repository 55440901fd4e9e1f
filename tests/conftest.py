"""Shared fixtures: a per-session dataset cache, the tiny demo-config overrides tests train with, and a
hook that sends a stop signal during training."""
from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Callable, Iterator

import pytest

import torch
from detectron2.engine import HookBase

import gwdet  # noqa: F401  (before any test module binds detectron2's get_norm by name)
from gwdet.norms import norm_records

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `pytest -n N` (make test): N test processes share the machine's cores, so each computes with
    # one thread, and so do the tools the tests start (gwdet reads OMP_NUM_THREADS), instead of N
    # processes each spinning one thread per core.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

REPO = Path(__file__).resolve().parents[1]
DEMO_CONFIG = REPO / "configs" / "Demo" / "mask_rcnn_R_50_FPN_gw_shapes.yaml"
LAZY_CONFIG = REPO / "configs" / "LazyConfig" / "mask_rcnn_R_50_FPN_gw_shapes.py"

# The demo model at test size: 64x64 images, a handful of them, a couple of iterations.
TINY_OPTS = [
    "DATASETS.SHAPES.IMAGE_SIZE", "64",
    "DATASETS.SHAPES.NUM_TRAIN", "8",
    "DATASETS.SHAPES.NUM_VAL", "4",
    "INPUT.MIN_SIZE_TRAIN", "(64,)",
    "INPUT.MAX_SIZE_TRAIN", "64",
    "INPUT.MIN_SIZE_TEST", "64",
    "INPUT.MAX_SIZE_TEST", "64",
    "SOLVER.IMS_PER_BATCH", "2",
    "SOLVER.MAX_ITER", "2",
    "SOLVER.WARMUP_ITERS", "1",
    "SOLVER.STEPS", "()",
    "DATALOADER.NUM_WORKERS", "0",
    "TEST.VIS_IMAGES", "0",
]


def with_statistics(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """``model`` with the running statistics of a trained network in its batch norms (drawn from
    ``seed``), not a fresh model's mean 0 and variance 1, which the converter refuses as untrained."""
    generator = torch.Generator().manual_seed(seed)
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.copy_(torch.randn(module.num_features, generator=generator) * 0.1)
            module.running_var.copy_(torch.rand(module.num_features, generator=generator) * 1.5 + 0.5)
    return model


def tiny_run_args(output_dir, *extra: str, config_file=DEMO_CONFIG):
    """The train tool's arguments for the demo model at test size with a checkpoint every
    iteration into ``output_dir``, then ``extra``."""
    from gwdet.engine.arguments import parse_args

    return parse_args(["--config-file", str(config_file), *TINY_OPTS, "SOLVER.CHECKPOINT_PERIOD", "1",
                       "OUTPUT_DIR", str(output_dir), *extra])


class SignalAfter(HookBase):
    """Sends this process ``signum`` after iteration ``iteration`` (as a cluster's preemption would)."""

    def __init__(self, iteration: int, signum: int) -> None:
        self.iteration, self.signum = iteration, signum

    def after_step(self) -> None:
        if self.trainer.iter == self.iteration:
            os.kill(os.getpid(), self.signum)


def run_folder_with_a_link(tmp_path, name: str, text: str) -> tuple:
    """A user's file ``notes.txt`` holding ``text`` and a run folder ``run`` whose file ``name`` is a
    link to it: what a run must not write through. Returns ``(notes, run)``."""
    notes = tmp_path / "notes.txt"
    notes.write_text(text)
    run = tmp_path / "run"
    run.mkdir()
    (run / name).symlink_to(notes)
    return notes, run


@contextlib.contextmanager
def logged_warnings(name: str) -> Iterator[list[str]]:
    """The messages of the warnings (and worse) that logger ``name`` logs inside the block, caught
    by a handler of its own: detectron2's logger set-up stops propagation to pytest's caplog."""
    messages: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: messages.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger(name)
    logger.addHandler(handler)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A folder holding a finished run of :func:`tiny_run_args` (one per test module)."""
    from gwdet.engine.run import main

    output_dir = tmp_path_factory.mktemp("finished_run")
    main(tiny_run_args(output_dir))
    assert (output_dir / "model_final.pth").is_file() and (output_dir / "model_0000000.pth").is_file()
    return output_dir


@pytest.fixture(scope="session", autouse=True)
def dataset_cache(tmp_path_factory) -> Path:
    """Generated datasets go to a per-session folder, never the user's ~/.cache."""
    cache = tmp_path_factory.mktemp("gwdet_cache")
    os.environ["GWDET_CACHE"] = str(cache)
    return cache


@pytest.fixture(autouse=True)
def norm_catalogue_unchanged():
    """Every test leaves gwdet's norm catalogue as it found it: a test that registers a norm name
    unregisters it (gwdet.norms.unregister_norm), so no name leaks into the tests after it."""
    before = norm_records()
    yield
    after = norm_records()
    assert after == before, (f"the test left the norm catalogue changed: added "
                             f"{sorted({r.name for r in after} - {r.name for r in before})}, removed "
                             f"{sorted({r.name for r in before} - {r.name for r in after})}; unregister "
                             "what a test registers (gwdet.norms.unregister_norm)")


@pytest.fixture(autouse=True)
def datasets_registered_by_the_test_removed():
    """Dataset names a test registers in detectron2's catalogues (e.g. with register_coco_instances)
    are removed after it, so the same test can run again in one process (mutation testing reruns
    the suite in-process) and no name reaches a later test. The shapes datasets stay: gwdet
    registers them once per process and keeps them current itself (gwdet.data.shapes)."""
    from detectron2.data import DatasetCatalog, MetadataCatalog

    before = set(DatasetCatalog.list())
    yield
    for name in set(DatasetCatalog.list()) - before:
        if not name.startswith("shapes_"):
            DatasetCatalog.remove(name)
            MetadataCatalog.remove(name)


@pytest.fixture
def registered():
    """Norm names the test registers (it appends them), unregistered after it, pass or fail."""
    from gwdet.norms import known_norm_names, unregister_norm

    names: list[str] = []
    yield names
    for name in names:
        if name in known_norm_names():
            unregister_norm(name)


def error_in_child(limit: Callable[[], None], act: Callable[[], None]) -> str:
    """The message of the ``OSError`` that ``act`` raises in a forked child of this process after
    ``limit`` (a file size limit, another user), which this process keeps clear of; ``""`` when
    ``act`` raises none. The child has gwdet imported already."""
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            limit()
            try:
                act()
            except OSError as error:
                os.write(writer, str(error).encode())
        finally:
            os._exit(0)
    os.close(writer)
    os.waitpid(child, 0)
    with os.fdopen(reader, "rb") as answer:
        return answer.read().decode()
