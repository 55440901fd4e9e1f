"""Training and evaluation entry points shared by gwdet's tools (``tools/train_net.py``).

:class:`Trainer` is detectron2's ``DefaultTrainer`` evaluating with ``COCOEvaluator`` (pycocotools'
COCOeval). :func:`setup` builds the config from the command line and prepares the datasets it names;
:func:`main` trains (or evaluates with ``--eval-only``), then writes the AP tables as markdown and,
when ``TEST.VIS_IMAGES`` > 0, PNGs of predictions on the first test images.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
from collections import OrderedDict
from typing import Mapping

import detectron2.engine.defaults as _d2_defaults
from detectron2.config import CfgNode, get_cfg
from detectron2.engine import DefaultTrainer, default_argument_parser, default_setup
from detectron2.evaluation import COCOEvaluator
from detectron2.utils import comm

from gwdet.checkpoint.resilient import RandomState, ResilientCheckpointer
from gwdet.config import add_gwdet_config
from gwdet.config_checks import check_gwdet_config
from gwdet.data import prepare_datasets
from gwdet.data.resumable import build_resumable_train_loader, skip_trained_samples
from gwdet.visualize import save_prediction_pngs

RESULTS_MARKDOWN = "results.md"
RESULTS_JSON = "results.json"


def _allow_cpu_ddp() -> None:
    """detectron2's ``create_ddp_model`` pins ``device_ids`` to the local GPU, which PyTorch rejects
    for a CPU model; a CPU model (gloo backend, ``MODEL.DEVICE cpu``) gets ``device_ids=None``."""
    original = _d2_defaults.create_ddp_model
    if getattr(original, "__gwdet__", False):
        return

    def create_ddp_model(model, **kwargs):
        if next(model.parameters()).device.type == "cpu":
            kwargs.setdefault("device_ids", None)
        return original(model, **kwargs)

    create_ddp_model.__gwdet__ = True
    _d2_defaults.create_ddp_model = create_ddp_model


_allow_cpu_ddp()


class Trainer(DefaultTrainer):
    """``DefaultTrainer`` evaluating with ``COCOEvaluator`` (box, and mask when masks are on), whose
    checkpoints survive a killed run and whose ``--resume`` continues the data and random streams
    where they stopped (see :mod:`gwdet.checkpoint.resilient`, :mod:`gwdet.data.resumable`)."""

    @classmethod
    def build_train_loader(cls, cfg: CfgNode):
        try:
            return build_resumable_train_loader(cfg)
        except AssertionError as err:
            if "No valid data" not in str(err):
                raise
            raise ValueError(
                f"None of the images of {', '.join(cfg.DATASETS.TRAIN)} has an annotation to train on: "
                "check that the json's 'annotations' list is there and refers to its 'images' ids "
                "(or set DATALOADER.FILTER_EMPTY_ANNOTATIONS False to train on empty images)."
            ) from err

    def build_hooks(self):
        # Swap the checkpointer before detectron2's PeriodicCheckpointer hook captures it.
        plain = self.checkpointer
        self.checkpointer = ResilientCheckpointer(
            plain.model, plain.save_dir, save_to_disk=plain.save_to_disk,
            random_state=RandomState(), **plain.checkpointables,
        )
        return super().build_hooks()

    def train(self):
        """Train; return the final COCO results (detectron2's EvalHook stores them on the trainer)."""
        super().train()
        return getattr(self, "_last_eval_results", None)

    def resume_or_load(self, resume: bool = True) -> None:
        super().resume_or_load(resume=resume)
        if self.start_iter > 0 and not skip_trained_samples(self._trainer.data_loader, self.cfg, self.start_iter):
            logging.getLogger(__name__).warning(
                "The train loader was not built by gwdet's build_train_loader: it restarts its sample "
                "stream on resume instead of continuing where the interrupted run stopped."
            )

    @classmethod
    def build_evaluator(cls, cfg: CfgNode, dataset_name: str, output_folder: str | None = None):
        output_folder = output_folder or os.path.join(cfg.OUTPUT_DIR, "inference", dataset_name)
        return COCOEvaluator(dataset_name, output_dir=output_folder)


def argument_parser() -> argparse.ArgumentParser:
    """detectron2's parser (``--config-file``, ``--resume``, ``--eval-only``, ``--num-gpus``, ...).

    ``--config`` works as well: argparse accepts it as the unambiguous prefix of ``--config-file``.
    """
    return default_argument_parser()


def build_config(config_file: str, opts: list[str] | None = None) -> CfgNode:
    """detectron2's defaults + gwdet's keys + ``config_file`` + ``KEY VALUE`` overrides, checked, frozen."""
    if not config_file:
        raise ValueError("No config given: pass --config configs/<file>.yaml (see configs/).")
    if not os.path.isfile(config_file):
        raise FileNotFoundError(f"Config file {config_file!r} does not exist (run from the repository root?).")
    cfg = add_gwdet_config(get_cfg())
    cfg.merge_from_file(config_file)
    cfg.merge_from_list(opts or [])
    check_gwdet_config(cfg)
    cfg.freeze()
    return cfg


def setup(args: argparse.Namespace) -> CfgNode:
    """Config from the command line, detectron2's logging/output set-up, datasets ready."""
    cfg = build_config(args.config_file, args.opts)
    default_setup(cfg, args)
    prepare_datasets(cfg)
    return cfg


def flatten_results(results: Mapping) -> "OrderedDict[str, Mapping]":
    """``{dataset: {task: {metric: value}}}`` whether or not detectron2 dropped the dataset level."""
    if results and all(isinstance(v, Mapping) and all(isinstance(m, float) for m in v.values()) for v in results.values()):
        return OrderedDict([("", results)])
    return OrderedDict(results)


def results_markdown(results: Mapping) -> str:
    """COCO AP tables (one per dataset and task) as markdown."""
    lines = []
    for dataset, tasks in flatten_results(results).items():
        for task, metrics in tasks.items():
            names = [name for name in metrics if "-" not in name]  # AP, AP50, ... not per-class
            title = f"{dataset} {task}".strip()
            lines += [f"### {title}", "", "| " + " | ".join(names) + " |", "|" + "---|" * len(names)]
            lines += ["| " + " | ".join(f"{metrics[name]:.2f}" for name in names) + " |", ""]
    return "\n".join(lines)


def write_results(cfg: CfgNode, results: Mapping) -> None:
    """``OUTPUT_DIR/results.md`` and ``results.json`` (main process only)."""
    if not comm.is_main_process() or not results:
        return
    os.makedirs(cfg.OUTPUT_DIR, exist_ok=True)
    with open(os.path.join(cfg.OUTPUT_DIR, RESULTS_MARKDOWN), "w") as f:
        f.write(results_markdown(results))
    with open(os.path.join(cfg.OUTPUT_DIR, RESULTS_JSON), "w") as f:
        json.dump(flatten_results(results), f, indent=2)


def main(args: argparse.Namespace):
    """Train (or evaluate with ``--eval-only``) the model ``args`` describe; return COCO results."""
    cfg = setup(args)
    if args.eval_only:
        model = Trainer.build_model(cfg)
        ResilientCheckpointer(model, save_dir=cfg.OUTPUT_DIR).resume_or_load(cfg.MODEL.WEIGHTS, resume=args.resume)
        results = Trainer.test(cfg, model)
    else:
        trainer = Trainer(cfg)
        trainer.resume_or_load(resume=args.resume)
        results = trainer.train()
        model = trainer.model
    write_results(cfg, results)
    if comm.is_main_process() and cfg.TEST.VIS_IMAGES > 0:
        save_prediction_pngs(cfg, model, cfg.DATASETS.TEST[0], cfg.TEST.VIS_IMAGES, os.path.join(cfg.OUTPUT_DIR, "vis"))
    return results
