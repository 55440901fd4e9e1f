"""A training data loader that continues the sample order where an interrupted run stopped.

detectron2's ``TrainingSampler`` restarts its stream of indices on ``--resume``, seeded from numpy's
global generator unless given a seed. Here the sampler is seeded with ``cfg.SEED`` (when >= 0) and
:func:`skip_trained_samples` skips the samples the earlier iterations consumed, so a resumed run sees
the batches an uninterrupted run would (exactly so when aspect-ratio grouping cannot reorder them).
Other samplers (``DATALOADER.SAMPLER_TRAIN``) are skipped ahead the same way but keep their own
seeding. With ``cfg.SEED`` >= 0 the loader also gets its own seeded generator, leaving torch's
global one (restored from the checkpoint) untouched; on a detectron2 whose
``build_detection_train_loader`` takes no ``seed=`` it is set on the inner ``DataLoader``.
The training records' boxes are checked before the loader is built
(:func:`gwdet.data.boxes.check_dataset_boxes`).
"""
from __future__ import annotations

import inspect
import itertools
import logging
from typing import Iterable, Iterator, Sized

import numpy as np
import torch
from detectron2.config import CfgNode
from detectron2.data import build_detection_train_loader
from detectron2.data.build import _train_loader_from_config, build_batch_data_loader
from detectron2.data.samplers import TrainingSampler
from detectron2.utils import comm
from torch.utils.data import DataLoader, Sampler

from gwdet.errors import GwdetRuntimeError
from gwdet.data.boxes import check_dataset_boxes
from gwdet.utils.cli_errors import as_override

_SAMPLER_ATTRIBUTE = "gwdet_skipping_sampler"
logger = logging.getLogger(__name__)


class SkippingSampler(Sampler):
    """``base`` sampler's stream without its first ``skip`` indices (read when iteration starts)."""

    def __init__(self, base: Sampler, skip: int = 0):
        self.base, self.skip = base, skip

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(iter(self.base), self.skip, None)


def loader_accepts_seed() -> bool:
    """Whether this detectron2's ``build_detection_train_loader`` takes ``seed=`` (not in v0.6): as
    its own parameter, or through ``**kwargs`` that it hands to ``build_batch_data_loader``."""
    parameters = inspect.signature(build_detection_train_loader).parameters
    if "seed" in parameters:
        return True
    forwards_keywords = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    return forwards_keywords and "seed" in inspect.signature(build_batch_data_loader).parameters


def _inner_data_loaders(loader) -> list[DataLoader]:
    """The ``DataLoader`` objects inside what ``build_detection_train_loader`` returned: the loader
    itself, or the one wrapped by detectron2's ``AspectRatioGroupedDataset`` (``.dataset``) and
    ``MapDataset`` (``._dataset``)."""
    found, seen, todo = [], set(), [loader]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, DataLoader):
            found.append(current)
            continue
        todo.extend(getattr(current, attribute, None) for attribute in ("dataset", "_dataset"))
    return found


def seed_loader_generator(loader, seed: int) -> None:
    """Give the DataLoader inside ``loader`` the generator ``build_detection_train_loader(seed=seed)``
    would have given it (for a detectron2 without that argument)."""
    data_loaders = _inner_data_loaders(loader)
    if len(data_loaders) != 1:
        raise GwdetRuntimeError(
            f"gwdet cannot seed this detectron2's train loader ({type(loader).__name__}: found "
            f"{len(data_loaders)} torch DataLoaders inside, expected 1), and its build_detection_train_loader "
            "has no seed= argument; a reproducible, exactly resumable run needs one or the other. "
            "gwdet is tested with detectron2 v0.6 and with main (seed= since 2024-02); or set SEED -1 "
            "to train with an unseeded loader."
        )
    generator = torch.Generator()
    generator.manual_seed(seed)
    data_loaders[0].generator = generator


def build_resumable_train_loader(cfg: CfgNode) -> Iterable:
    """detectron2's train loader for ``cfg``, seeded with ``cfg.SEED``, that
    :func:`skip_trained_samples` can position (:func:`resumable_train_loader`)."""
    # detectron2 builds a default sampler here, drawing a seed from numpy's global generator; after
    # a resume restored that generator, the draw would shift every later augmentation decision.
    numpy_state = np.random.get_state()
    loader_args = _train_loader_from_config(cfg)
    np.random.set_state(numpy_state)
    if isinstance(loader_args["dataset"], list):
        check_dataset_boxes(loader_args["dataset"], f"DATASETS.TRAIN {tuple(cfg.DATASETS.TRAIN)}")
    if isinstance(loader_args["sampler"], TrainingSampler) and cfg.SEED >= 0:
        loader_args["sampler"] = TrainingSampler(len(loader_args["dataset"]), seed=cfg.SEED)
    return resumable_train_loader(loader_args, cfg.SEED, "SEED")


def resumable_train_loader(arguments: dict, seed: int, seed_setting: str = "SEED") -> Iterable:
    """``build_detection_train_loader(**arguments)`` (detectron2's keyword arguments, ``sampler``
    among them) with the sampler wrapped in a :class:`SkippingSampler` that
    :func:`skip_trained_samples` positions; with ``seed`` >= 0 the loader also gets its own
    generator, seeded with ``seed`` + the process's rank. A negative ``seed`` (``seed_setting``) is
    warned of: the seed detectron2 then draws and logs does not repeat the run."""
    if seed < 0:
        logger.warning(
            f"{as_override(seed_setting, str(seed))}: detectron2 draws a seed and logs it ('Using a generated random seed ...'), but "
            f"giving that seed as {seed_setting} does not repeat this run: with a negative {seed_setting} the data "
            "order comes from the generators that seed set, with a given one from the seed itself. Give "
            f"{seed_setting} a number >= 0 for a run that can be repeated and resumed exactly.")
    dataset, batch = arguments.get("dataset"), arguments.get("total_batch_size")
    images = batch // comm.get_world_size() if isinstance(batch, int) else None  # each process's batch
    if isinstance(dataset, Sized) and images is not None and images > len(dataset):
        logger.warning(f"Each process trains on batches of {images} images, more than the "
                       f"{len(dataset)} training images: every batch holds images twice or more, so the batch "
                       "statistics of its norm layers (BN, BGN, BW) see fewer distinct images than the batch size says. "
                       "Give a batch of at most the training images, or more training images.")
    sampler = arguments["sampler"] = SkippingSampler(arguments["sampler"])
    if seed >= 0:
        # Without its own generator, starting to iterate the loader draws the workers' base seed
        # from torch's global generator: a resumed run would do so after the restore, shifting every
        # later torch draw (RPN and ROI sampling) away from the uninterrupted run's. Offset by rank
        # as detectron2's default_setup does, so ranks' workers augment differently.
        rank_seed = seed + comm.get_rank()
        if loader_accepts_seed():
            loader = build_detection_train_loader(**arguments, seed=rank_seed)
        else:
            loader = build_detection_train_loader(**arguments)
            seed_loader_generator(loader, rank_seed)
    else:
        loader = build_detection_train_loader(**arguments)
    setattr(loader, _SAMPLER_ATTRIBUTE, sampler)
    return loader


def skip_trained_samples(loader: Iterable, samples: int) -> bool:
    """Position a not yet iterated :func:`resumable_train_loader` loader (or a wrapper passing its
    attributes on) after its first ``samples`` samples (this process's share of the iterations
    trained); False (nothing done) for a loader built otherwise."""
    sampler = getattr(loader, _SAMPLER_ATTRIBUTE, None)
    if sampler is None:
        return False
    sampler.skip = samples
    return True
