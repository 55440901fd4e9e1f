"""Inference example weighing of a finished run, swept over weights on the test split.

four_things_batchnorm_summers2020, Sec. 3.1: the example weight ``alpha`` of every batch norm is
a hyper-parameter chosen on a validation set, with no retraining. For each weight, the run's
``model_final.pth`` is loaded (without executing code from the file),
:func:`gwdet.modeling.example_weighing.apply_example_weighing` swaps its batch norms, and
:meth:`gwdet.engine.Trainer.test` evaluates it on ``DATASETS.TEST`` (COCOEvaluator; predictions
under ``<run>/example_weighing/w<weight>``). Results of the first test dataset are kept per
weight in ``<run>/example_weighing.json``, so a re-run evaluates only weights not done yet.

The weight is chosen by box AP on the same split it is reported on (the shapes dataset has only
train and val; so does the COCO setup), which makes the chosen number optimistic.
"""
from __future__ import annotations

import contextlib
import copy
import io
import math
from typing import Callable, Mapping, Sequence

from gwdet.checkpoint.resilient import ResilientCheckpointer
from gwdet.engine import Trainer
from gwdet.modeling.example_weighing import apply_example_weighing, weighable_norms
from gwdet.study.run_folder import EXAMPLE_WEIGHING_JSON, FINAL_WEIGHTS
from gwdet.study.runner import PlannedRun

PAPER_WEIGHTS = (0.0, 0.1, 0.25, 0.5, 1.0)


def weight_key(weight: float) -> str:
    """How a weight is written in ``example_weighing.json`` and folder names: ``0.25`` -> ``"0.25"``."""
    return f"{weight:g}"


def sweep_example_weights(
    run: PlannedRun, weights: Sequence[float], echo: Callable[[str], None] = print
) -> dict:
    """Evaluate the finished ``run`` with every weight in ``weights`` not evaluated yet.

    Returns ``{weight_key: {task: {metric: value}}}`` for all weights evaluated so far, or ``{}``
    when the model has no batch norm to weigh (nothing is written then).
    """
    done = run.folder.read_json(EXAMPLE_WEIGHING_JSON)
    todo = [w for w in weights if weight_key(w) not in done]
    if not todo:
        return done
    model = Trainer.build_model(run.cfg)
    if not weighable_norms(model):
        return {}
    ResilientCheckpointer(model).load(str(run.folder.file(FINAL_WEIGHTS)))
    for weight in todo:
        weighed = copy.deepcopy(model)
        apply_example_weighing(weighed, weight)
        weighed.eval()
        folder = run.folder.file(f"example_weighing/w{weight_key(weight)}")
        evaluators = [Trainer.build_evaluator(run.cfg, name, output_folder=str(folder))
                      for name in run.cfg.DATASETS.TEST]
        with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its summary tables
            results = Trainer.test(run.cfg, weighed, evaluators)
        done[weight_key(weight)] = _first_dataset(results, run.cfg.DATASETS.TEST)
        run.folder.write_json(EXAMPLE_WEIGHING_JSON, done)
        echo(f"{run.spec.name}: example weight {weight_key(weight)}: "
             f"box AP {done[weight_key(weight)]['bbox']['AP']:.2f}")
    return done


def _first_dataset(results: Mapping, dataset_names: Sequence[str]) -> dict:
    """``Trainer.test`` drops the dataset level for a single test dataset; restore one level."""
    return dict(results[dataset_names[0]] if len(dataset_names) > 1 else results)


def choose_weight(sweep: Mapping[str, Mapping], weights: Sequence[float]) -> tuple[float, float] | None:
    """``(weight, box AP)`` of the best weight among ``weights`` in ``sweep`` (ties: smaller weight;
    a NaN AP, COCOeval's value when there is no detection at all, counts as the worst)."""
    candidates = [
        (_ap_or_minus_infinity(sweep[weight_key(w)]["bbox"]["AP"]), -w)
        for w in weights
        if weight_key(w) in sweep
    ]
    if not candidates:
        return None
    ap, negative_weight = max(candidates)
    return -negative_weight, sweep[weight_key(-negative_weight)]["bbox"]["AP"]


def _ap_or_minus_infinity(ap: float) -> float:
    return -math.inf if math.isnan(ap) else ap
