"""A training data loader that continues the sample order where an interrupted run stopped.

detectron2's ``TrainingSampler`` yields an endless, seeded stream of indices; on ``--resume`` it
starts that stream from the beginning again. Here the stream skips the samples the first
``start_iter`` iterations consumed, so a resumed run sees the batches an uninterrupted run would
(exactly so when aspect-ratio grouping cannot reorder them, e.g. for images of equal shape).
"""
from __future__ import annotations

import itertools
from typing import Iterator

from detectron2.config import CfgNode
from detectron2.data import build_detection_train_loader
from detectron2.data.build import _train_loader_from_config
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
    loader_args = _train_loader_from_config(cfg)
    images_per_process = cfg.SOLVER.IMS_PER_BATCH // comm.get_world_size()
    loader_args["sampler"] = SkippingSampler(loader_args["sampler"], start_iter * images_per_process)
    return build_detection_train_loader(**loader_args)
