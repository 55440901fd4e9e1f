"""A training data loader that continues the sample order where an interrupted run stopped.

detectron2's ``TrainingSampler`` yields an endless, seeded stream of indices; on ``--resume`` it
starts that stream from the beginning again, and without an explicit seed it draws one from numpy's
global generator, so a loader built at another moment shuffles differently. Here the sampler is
seeded with ``cfg.SEED`` (when it is >= 0) and the stream skips the samples the first ``start_iter``
iterations consumed, so a resumed run sees the batches an uninterrupted run would (exactly so when
aspect-ratio grouping cannot reorder them, e.g. for images of equal shape). Other samplers
(``DATALOADER.SAMPLER_TRAIN``) are skipped ahead the same way but keep their own seeding.
"""
from __future__ import annotations

import itertools
from typing import Iterator

import numpy as np

from detectron2.config import CfgNode
from detectron2.data import build_detection_train_loader
from detectron2.data.build import _train_loader_from_config
from detectron2.data.samplers import TrainingSampler
from detectron2.utils import comm
from torch.utils.data import Sampler


class SkippingSampler(Sampler):
    """``base`` sampler's stream without its first ``skip`` indices."""

    def __init__(self, base: Sampler, skip: int):
        self.base, self.skip = base, skip

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(iter(self.base), self.skip, None)


def build_resumed_train_loader(cfg: CfgNode, start_iter: int):
    """detectron2's train loader for ``cfg``, positioned after ``start_iter`` iterations."""
    # detectron2 builds a default sampler here, drawing a seed from numpy's global generator; after
    # a resume restored that generator, the draw would shift every later augmentation decision.
    numpy_state = np.random.get_state()
    loader_args = _train_loader_from_config(cfg)
    np.random.set_state(numpy_state)
    if isinstance(loader_args["sampler"], TrainingSampler) and cfg.SEED >= 0:
        loader_args["sampler"] = TrainingSampler(len(loader_args["dataset"]), seed=cfg.SEED)
    images_per_process = cfg.SOLVER.IMS_PER_BATCH // comm.get_world_size()
    loader_args["sampler"] = SkippingSampler(loader_args["sampler"], start_iter * images_per_process)
    return build_detection_train_loader(**loader_args)
