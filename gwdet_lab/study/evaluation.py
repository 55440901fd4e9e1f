"""The study's evaluations of a trained batch-norm model, beyond the run's own test.

Splits: the config's first test dataset selects (``DATASETS.TEST[0]``, shapes_val), its last one
reports (``DATASETS.TEST[-1]``, shapes_test). With a single test dataset (COCO's val2017) the two
coincide, and a number chosen on it is optimistic; the report says so.

* Inference example weighing (four_things_batchnorm_summers2020, Sec. 3.1): every batch norm
  blends the example's own moments into its running ones with weight ``w``
  (:func:`gwdet.modeling.example_weighing.apply_example_weighing`). Each ``w`` is evaluated on
  the selection split, the best is chosen there (ties: the smaller weight), and only the chosen
  one is evaluated on the report split. ``w = 0`` is plain inference, whose numbers the run's own
  evaluation already holds.
* Batch statistics: every batch norm normalizes with the statistics of the test batch it is given
  (as in training), the report split is fed in batches of the training batch size (consecutive
  images in dataset order), running statistics are not used. Against the run's own AP (running
  statistics, one image at a time), this is batch norm's train/test gap.

Results are cached per dataset and weight in ``example_weighing.json`` and
``batch_statistics.json``, so an interrupted evaluation redoes only what is missing.
"""
from __future__ import annotations

import contextlib
import copy
import io
import math
from typing import Callable, Mapping, Sequence

import torch
import torch.nn.functional as F
from detectron2.config import CfgNode
from detectron2.data import DatasetCatalog, DatasetMapper
from detectron2.data.build import trivial_batch_collator
from detectron2.data.common import DatasetFromList, MapDataset
from detectron2.evaluation import inference_on_dataset
from torch import nn

from gwdet.engine.trainer import Trainer
from gwdet.modeling.example_weighing import apply_example_weighing, replace_weighable_norms, weighable_norms
from gwdet_lab.study.run_folder import BATCH_STATISTICS_JSON, EXAMPLE_WEIGHING_JSON, RunFolder

PAPER_WEIGHTS = (0.0, 0.1, 0.25, 0.5, 1.0)

Printer = Callable[[str], None]


def weight_key(weight: float) -> str:
    """How a weight is written in json files and folder names: ``0.25`` -> ``"0.25"``."""
    return f"{weight:g}"


def selection_dataset(cfg: CfgNode) -> str:
    return cfg.DATASETS.TEST[0]


def report_dataset(cfg: CfgNode) -> str:
    return cfg.DATASETS.TEST[-1]


def has_batch_norm(model: nn.Module) -> bool:
    return bool(weighable_norms(model))


class BatchStatisticsNorm(nn.Module):
    """A batch norm's affine parameters and eps, normalizing with the statistics of the batch it
    is given in train and eval mode alike; it keeps no running statistics."""

    def __init__(self, bn: nn.modules.batchnorm._BatchNorm):
        super().__init__()
        self.eps = bn.eps
        self.weight = bn.weight
        self.bias = bn.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.batch_norm(x, None, None, self.weight, self.bias, training=True, eps=self.eps)


def use_batch_statistics(model: nn.Module) -> int:
    """Replace, in place, every batch norm :func:`weighable_norms` lists by a
    :class:`BatchStatisticsNorm`; return how many were replaced."""
    return replace_weighable_norms(model, BatchStatisticsNorm)


def test_loader(cfg: CfgNode, dataset: str, batch_size: int) -> torch.utils.data.DataLoader:
    """``dataset`` in order, mapped for inference, ``batch_size`` images per batch (detectron2's
    ``build_detection_test_loader`` takes a batch size only after release 0.6)."""
    records = DatasetFromList(DatasetCatalog.get(dataset), copy=False)
    mapped = MapDataset(records, DatasetMapper(cfg, is_train=False))
    return torch.utils.data.DataLoader(mapped, batch_size=batch_size, shuffle=False, num_workers=0,
                                       collate_fn=trivial_batch_collator)


def evaluate(cfg: CfgNode, model: nn.Module, dataset: str, output_folder: str, batch_size: int = 1) -> dict:
    """COCO results ``{task: {metric: value}}`` of ``model`` (in eval mode) on ``dataset``."""
    loader = test_loader(cfg, dataset, batch_size)
    evaluator = Trainer.build_evaluator(cfg, dataset, output_folder=output_folder)
    model.eval()
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its summary tables
        return dict(inference_on_dataset(model, loader, evaluator))


def choose_weight(val_aps: Mapping[str, float], weights: Sequence[float]) -> float | None:
    """The weight among ``weights`` with the best box AP in ``val_aps`` (keyed by
    :func:`weight_key`); ties go to the smaller weight; a NaN AP (COCOeval's value when nothing
    is detected) counts as the worst. ``None`` when no weight has a value."""
    candidates = [(_ap_or_minus_infinity(val_aps[weight_key(w)]), -w) for w in weights if weight_key(w) in val_aps]
    if not candidates:
        return None
    return -max(candidates)[1]


def _ap_or_minus_infinity(ap: float) -> float:
    return -math.inf if math.isnan(ap) else ap


def example_weighing(cfg: CfgNode, model: nn.Module, folder: RunFolder, weights: Sequence[float],
                     echo: Printer = print) -> dict:
    """Sweep ``weights`` on the selection split, evaluate the chosen one on the report split.

    Returns ``example_weighing.json``'s content: ``{dataset: {weight_key: {task: {metric: value}}},
    "chosen": weight}``. ``model`` is the trained model (left unchanged).
    """
    own = folder.results()
    done = folder.read_json(EXAMPLE_WEIGHING_JSON, null_is_nan=True)
    select, report = selection_dataset(cfg), report_dataset(cfg)

    def results_for(dataset: str, weight: float) -> dict:
        per_dataset = done.setdefault(dataset, {})
        key = weight_key(weight)
        if key not in per_dataset:
            if weight == 0.0 and dataset in own:
                per_dataset[key] = own[dataset]
            else:
                weighed = copy.deepcopy(model)
                apply_example_weighing(weighed, weight)
                per_dataset[key] = evaluate(cfg, weighed, dataset,
                                            str(folder.file(f"example_weighing/{dataset}/w{key}")))
                echo(f"example weight {key} on {dataset}: box AP {per_dataset[key]['bbox']['AP']:.2f}")
            folder.write_json(EXAMPLE_WEIGHING_JSON, done)
        return per_dataset[key]

    val_aps = {weight_key(w): results_for(select, w)["bbox"]["AP"] for w in weights}
    chosen = choose_weight(val_aps, weights)
    if chosen is not None:
        results_for(report, chosen)
        done["chosen"] = chosen
        folder.write_json(EXAMPLE_WEIGHING_JSON, done)
    return done


def batch_statistics(cfg: CfgNode, model: nn.Module, folder: RunFolder, echo: Printer = print) -> dict:
    """The report split evaluated with batch statistics at the training batch size (cached)."""
    batch_size = int(cfg.SOLVER.IMS_PER_BATCH)
    done = folder.read_json(BATCH_STATISTICS_JSON, null_is_nan=True)
    dataset = report_dataset(cfg)
    if dataset not in done or done.get("batch_size") != batch_size:
        model = copy.deepcopy(model)
        use_batch_statistics(model)
        results = evaluate(cfg, model, dataset, str(folder.file(f"batch_statistics/{dataset}")), batch_size)
        done = {"batch_size": batch_size, dataset: results}
        folder.write_json(BATCH_STATISTICS_JSON, done)
        echo(f"batch statistics ({batch_size} images per batch) on {dataset}: box AP {results['bbox']['AP']:.2f}")
    return done
