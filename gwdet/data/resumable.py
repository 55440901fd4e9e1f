"""A training data loader that continues the sample order where an interrupted run stopped.

detectron2's ``TrainingSampler`` yields an endless, seeded stream of indices; on ``--resume`` it
starts that stream from the beginning again, and without an explicit seed it draws one from numpy's
global generator, so a loader built at another moment shuffles differently. Here the sampler is
seeded with ``cfg.SEED`` (when it is >= 0) and, once a resume knows its start iteration,
:func:`skip_trained_samples` makes the stream skip the samples the earlier iterations consumed, so
a resumed run sees the batches an uninterrupted run would (exactly so when aspect-ratio grouping
cannot reorder them, e.g. for images of equal shape). Other samplers (``DATALOADER.SAMPLER_TRAIN``)
are skipped ahead the same way but keep their own seeding. With ``cfg.SEED`` >= 0 the loader also
gets its own seeded generator, so that starting to iterate it leaves torch's global generator
(restored from the checkpoint) untouched.
"""
from __future__ import annotations

import itertools
from typing import Iterable, Iterator

import numpy as np

from detectron2.config import CfgNode
from detectron2.data import build_detection_train_loader
from detectron2.data.build import _train_loader_from_config
from detectron2.data.samplers import TrainingSampler
from detectron2.utils import comm
from torch.utils.data import Sampler

_SAMPLER_ATTRIBUTE = "gwdet_skipping_sampler"


class SkippingSampler(Sampler):
    """``base`` sampler's stream without its first ``skip`` indices (read when iteration starts)."""

    def __init__(self, base: Sampler, skip: int = 0):
        self.base, self.skip = base, skip

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(iter(self.base), self.skip, None)


def build_resumable_train_loader(cfg: CfgNode) -> Iterable:
    """detectron2's train loader for ``cfg``, seeded, that :func:`skip_trained_samples` can position."""
    # detectron2 builds a default sampler here, drawing a seed from numpy's global generator; after
    # a resume restored that generator, the draw would shift every later augmentation decision.
    numpy_state = np.random.get_state()
    loader_args = _train_loader_from_config(cfg)
    np.random.set_state(numpy_state)
    if isinstance(loader_args["sampler"], TrainingSampler) and cfg.SEED >= 0:
        loader_args["sampler"] = TrainingSampler(len(loader_args["dataset"]), seed=cfg.SEED)
    sampler = loader_args["sampler"] = SkippingSampler(loader_args["sampler"])
    if cfg.SEED >= 0:
        # Without its own generator, starting to iterate the loader draws the workers' base seed
        # from torch's global generator: a resumed run would do so after the restore, shifting every
        # later torch draw (RPN and ROI sampling) away from the uninterrupted run's. Offset by rank
        # as detectron2's default_setup does, so ranks' workers augment differently.
        loader_args["seed"] = cfg.SEED + comm.get_rank()
    loader = build_detection_train_loader(**loader_args)
    setattr(loader, _SAMPLER_ATTRIBUTE, sampler)
    return loader


def skip_trained_samples(loader: Iterable, cfg: CfgNode, start_iter: int) -> bool:
    """Position a not yet iterated :func:`build_resumable_train_loader` loader after ``start_iter``
    iterations; False (nothing done) for a loader built otherwise."""
    sampler = getattr(loader, _SAMPLER_ATTRIBUTE, None)
    if sampler is None:
        return False
    sampler.skip = start_iter * (cfg.SOLVER.IMS_PER_BATCH // comm.get_world_size())
    return True
