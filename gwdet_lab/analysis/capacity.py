"""Batch size, group number and representational capacity (GW paper Sec. 4, Figs. 1 and 5).

The paper trains MLPs on MNIST; this runs the same experiments, shortened, on the 8x8 digits that
ship with scikit-learn (1797 images, 64 features, 10 classes; 80/20 stratified train/validation
split, features standardized with the training statistics). The model is an MLP
``64 -> depth x [Linear(width) -> norm -> ReLU] -> Linear(10)`` (default: three hidden layers of
256, i.e. four linear layers, the paper's "four-layer MLP with 256 neurons") trained by plain SGD
with cross entropy at the paper's learning rate 0.1; accuracies are measured in evaluation mode
(BN and BW with their running statistics) after the last epoch.

* Fig. 1 (a): training / validation accuracy against the batch size for BN, BW-C16 and, as
  batch-independent references, GN and GW at a fixed group number (any subset of these);
* Fig. 1 (b): the same against the group number of GN and GW at a fixed batch size;
* Fig. 5: training accuracy on random labels (a subset of the training images with labels drawn
  uniformly at random) against the group number, with the unnormalized MLP ("Base").
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch import Tensor, nn

from gwdet_lab.analysis.normalizers import make_norm, norm_label
from gwdet_lab.analysis.plotting import Curve, Panel, save_figure
from gwdet_lab.analysis.report import markdown_table, output_folder, write_markdown

from gwdet.errors import GwdetValueError
from gwdet.layers.common import check_int_at_least, is_finite_number

NUM_CLASSES = 10
SEED_LIMIT = 2**32 - 1


@dataclass
class Digits:
    """The digits split: float32 features (standardized) and int64 labels."""

    x_train: Tensor
    y_train: Tensor
    x_val: Tensor
    y_val: Tensor


def load_digits_split(seed: int = 0, train_samples: int | None = None, val_fraction: float = 0.2) -> Digits:
    """scikit-learn's 8x8 digits, split (stratified) and standardized; no download involved.

    ``seed`` (an integer from 0 to 2**32 - 1) seeds the split; ``val_fraction`` (a number in (0, 1))
    is the share of the images held out for validation; ``train_samples`` (an integer >= 1, at most
    the training split's size) keeps only the first that many training images (all when ``None``).
    Other values are refused (``ValueError``) before any data is loaded, a ``train_samples`` above
    the training split's size or a split that leaves a class out of either part once the split's
    sizes are known."""
    owner = "load_digits_split"
    check_int_at_least(owner, "seed", seed, 0)
    if seed > SEED_LIMIT:
        raise GwdetValueError(f"{owner}: seed must be an integer from 0 to 2**32 - 1 (numpy's seeds), got {seed!r}")
    if not is_finite_number(val_fraction) or not 0.0 < val_fraction < 1.0:
        raise GwdetValueError(f"{owner}: val_fraction must be a number in (0, 1), the share of the images held out for "
                              f"validation, got {val_fraction!r}; e.g. 0.2 (the default)")
    if train_samples is not None:
        check_int_at_least(owner, "train_samples", train_samples, 1)
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    num_val = math.ceil(val_fraction * len(data.target))  # as train_test_split rounds a fractional test_size
    num_train = len(data.target) - num_val
    if min(num_val, num_train) < NUM_CLASSES:
        raise GwdetValueError(f"{owner}: val_fraction={val_fraction!r} splits the {len(data.target)} digits images "
                              f"into {num_train} training and {num_val} validation images, and the stratified split "
                              f"needs at least one image of each of the {NUM_CLASSES} classes in both; give a "
                              f"val_fraction between {NUM_CLASSES / len(data.target):.3f} and "
                              f"{1 - NUM_CLASSES / len(data.target):.3f}")
    if train_samples is not None and train_samples > num_train:
        raise GwdetValueError(f"{owner}: train_samples={train_samples} is more than the {num_train} training images "
                              f"of the split (val_fraction={val_fraction!r}); give at most {num_train}, or None for all "
                              "of them")
    x_train, x_val, y_train, y_val = train_test_split(
        data.data.astype(np.float32), data.target, test_size=val_fraction, random_state=seed, stratify=data.target
    )
    mean, std = x_train.mean(axis=0), x_train.std(axis=0) + 1e-3  # border pixels are constant

    def standardized(features: np.ndarray) -> Tensor:
        return torch.from_numpy((features - mean) / std)

    keep = slice(train_samples)
    return Digits(
        standardized(x_train[keep]), torch.from_numpy(y_train[keep]), standardized(x_val), torch.from_numpy(y_val)
    )


def build_mlp(kind: str, num_groups: int, width: int, depth: int, in_features: int = 64) -> nn.Sequential:
    """``depth`` hidden layers ``Linear -> norm -> ReLU`` of ``width`` units, then a linear classifier."""
    layers: list[nn.Module] = []
    for i in range(depth):
        layers += [nn.Linear(in_features if i == 0 else width, width), make_norm(kind, width, num_groups), nn.ReLU()]
    layers.append(nn.Linear(width if depth else in_features, NUM_CLASSES))
    return nn.Sequential(*layers)


def train(model: nn.Module, x: Tensor, y: Tensor, batch_size: int, epochs: int, lr: float, seed: int) -> None:
    """Plain SGD on shuffled mini-batches; a last batch smaller than ``batch_size`` is dropped."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=generator)
        for start in range(0, len(x) - batch_size + 1, batch_size):
            batch = order[start : start + batch_size]
            loss = nn.functional.cross_entropy(model(x[batch]), y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


def accuracy(model: nn.Module, x: Tensor, y: Tensor) -> float:
    """Top-1 accuracy in evaluation mode."""
    model.eval()
    with torch.no_grad():
        return (model(x).argmax(dim=1) == y).float().mean().item()


@dataclass
class CapacitySetting:
    """Sweeps and schedule. The defaults are the committed run (docs/analysis/README.md)."""

    width: int = 256
    depth: int = 3
    epochs: int = 4
    lr: float = 0.1
    batch_sizes: Sequence[int] = (2, 8, 32, 128)
    batch_sweep_norms: Sequence[str] = ("BN", "BW", "GN", "GW")
    batch_sweep_groups: int = 16
    groups: Sequence[int] = (1, 4, 16, 64, 128)
    group_sweep_batch_size: int = 32
    random_label_samples: int = 256
    random_label_epochs: int = 20
    random_label_batch_size: int = 16
    train_samples: int | None = None
    seed: int = 0


QUICK_CAPACITY = CapacitySetting(
    width=32,
    depth=2,
    epochs=1,
    batch_sizes=(8, 32),
    batch_sweep_groups=4,
    groups=(1, 4),
    group_sweep_batch_size=32,
    random_label_samples=64,
    random_label_epochs=2,
    train_samples=128,
)
"""Seconds instead of minutes: for tests and for trying the command out."""


TrainVal = tuple[float, float]
"""(training accuracy, validation accuracy); validation is nan for random labels."""

Sweep = dict[str, list[tuple[int, TrainVal]]]
"""legend label -> [(swept value, accuracies), ...]."""


class Experiments:
    """Trains the sweeps' MLPs: freshly seeded, plain SGD, evaluated after the last epoch. A
    configuration requested twice (e.g. GW-g16 at the Fig. 1b batch size) is trained once."""

    def __init__(self, data: Digits, setting: CapacitySetting) -> None:
        self.data = data
        self.s = setting
        generator = torch.Generator().manual_seed(setting.seed)
        self.random_x = data.x_train[: setting.random_label_samples]
        self.random_y = torch.randint(NUM_CLASSES, (len(self.random_x),), generator=generator)
        self._done: dict[tuple, TrainVal] = {}

    def _fit(self, kind: str, groups: int, x: Tensor, y: Tensor, batch_size: int, epochs: int) -> nn.Module:
        torch.manual_seed(self.s.seed)
        model = build_mlp(kind, groups, self.s.width, self.s.depth)
        train(model, x, y, batch_size=batch_size, epochs=epochs, lr=self.s.lr, seed=self.s.seed)
        return model

    def on_digits(self, kind: str, groups: int, batch_size: int) -> TrainVal:
        """Accuracies on the digits' training and validation sets."""
        key = ("digits", kind, groups, batch_size)
        if key not in self._done:
            d = self.data
            model = self._fit(kind, groups, d.x_train, d.y_train, batch_size, self.s.epochs)
            self._done[key] = (accuracy(model, d.x_train, d.y_train), accuracy(model, d.x_val, d.y_val))
        return self._done[key]

    def on_random_labels(self, kind: str, groups: int) -> TrainVal:
        """Training accuracy on the random-label subset (validation: nan)."""
        key = ("random", kind, groups)
        if key not in self._done:
            s = self.s
            x, y = self.random_x, self.random_y
            model = self._fit(kind, groups, x, y, s.random_label_batch_size, s.random_label_epochs)
            self._done[key] = (accuracy(model, x, y), math.nan)
        return self._done[key]


def batch_sweep_group_numbers(s: CapacitySetting) -> dict[str, int]:
    """The group number of each of ``s.batch_sweep_norms`` in the batch-size sweep (BN: 1, BW: one
    whitening group per 16 units, GN and GW: ``s.batch_sweep_groups``); an unknown name is refused."""
    groups_of = {"BN": 1, "BW": max(1, s.width // 16), "GN": s.batch_sweep_groups, "GW": s.batch_sweep_groups}
    unknown = set(s.batch_sweep_norms) - set(groups_of)
    if unknown:
        raise GwdetValueError(f"batch-size sweep: unknown norms {sorted(unknown)}; choose from {', '.join(groups_of)}")
    return {kind: groups_of[kind] for kind in s.batch_sweep_norms}


def batch_size_sweep(runs: Experiments) -> Sweep:
    """Fig. 1 (a): the ``batch_sweep_norms`` against the batch size: BN, BW as BW-C16 (16 features
    per whitening group), GN and GW with ``batch_sweep_groups`` groups."""
    s = runs.s
    groups_of = batch_sweep_group_numbers(s)
    sweep: Sweep = {}
    for kind in s.batch_sweep_norms:
        groups = groups_of[kind]
        sweep[norm_label(kind, s.width, groups)] = [(m, runs.on_digits(kind, groups, m)) for m in s.batch_sizes]
    return sweep


def group_number_sweep(runs: Experiments) -> Sweep:
    """Fig. 1 (b): GN and GW against the group number at batch size ``group_sweep_batch_size``."""
    s = runs.s
    return {kind: [(g, runs.on_digits(kind, g, s.group_sweep_batch_size)) for g in s.groups] for kind in ("GN", "GW")}


def random_label_sweep(runs: Experiments) -> Sweep:
    """Fig. 5: training accuracy on random labels of GN and GW against the group number."""
    return {kind: [(g, runs.on_random_labels(kind, g)) for g in runs.s.groups] for kind in ("GN", "GW")}


def _curves(sweep: Sweep, with_validation: bool) -> list[Curve]:
    curves = []
    for index, (label, points) in enumerate(sweep.items()):
        xs = [value for value, _ in points]
        curves.append(Curve(f"{label} train", xs, [acc[0] for _, acc in points], "o-", f"C{index}"))
        if with_validation:
            curves.append(Curve(f"{label} val", xs, [acc[1] for _, acc in points], "x--", f"C{index}"))
    return curves


def _table(sweep: Sweep, swept: str, with_validation: bool) -> str:
    headers = ["norm", swept, "train acc"] + (["val acc"] if with_validation else [])
    rows = [
        [label, value, acc[0]] + ([acc[1]] if with_validation else [])
        for label, points in sweep.items()
        for value, acc in points
    ]
    return markdown_table(headers, rows)


def run_capacity(out: str | Path, setting: CapacitySetting) -> list[Path]:
    """Run the three sweeps; write ``<out>/capacity/{batch_size,group_number,random_labels}.png``
    and ``table.md``. Every value is checked and every model trained before the folder is written to,
    so a run refused or stopped before then leaves an earlier run's files as they were."""
    s = setting
    batch_sweep_group_numbers(s)  # an unknown norm name, before the data are loaded
    if s.random_label_samples < s.random_label_batch_size:  # no batch drawn: the untrained MLP's accuracy
        raise GwdetValueError(f"--random-samples {s.random_label_samples}: the random-label sweep trains on batches of "
                              f"{s.random_label_batch_size} images, so with fewer images no batch is drawn and the "
                              f"untrained MLP's accuracy would be reported; give at least {s.random_label_batch_size}.")
    data = load_digits_split(s.seed, s.train_samples)
    images = len(data.x_train)
    too_large = [f"{flag} {value}" for flag, value in (("--batch-sizes", max(s.batch_sizes)),
                                                       ("--random-samples", s.random_label_samples)) if value > images]
    if too_large:  # no batch would be drawn (chance accuracy reported as trained), or fewer images than titled
        raise GwdetValueError(f"{' and '.join(too_large)}: the sweeps train on {images} digits images "
                              f"({'--quick' if s.train_samples else 'the training split'}), so a batch or sample of "
                              f"more than {images} cannot be drawn; give at most {images}.")
    runs = Experiments(data, s)
    by_batch, by_groups, random = batch_size_sweep(runs), group_number_sweep(runs), random_label_sweep(runs)
    base = runs.on_random_labels("none", 1)[0]

    model = f"{s.depth}x{s.width} MLP, SGD lr {s.lr}, {s.epochs} epochs"
    random_setup = (
        f"{s.random_label_samples} images, batch {s.random_label_batch_size}, {s.random_label_epochs} epochs"
    )
    panels = {
        "batch_size.png": Panel(
            f"(a) {model}", "batch size m", "accuracy", _curves(by_batch, True), logx=True, xticks=list(s.batch_sizes)
        ),
        "group_number.png": Panel(
            f"(b) {model}, batch {s.group_sweep_batch_size}",
            "group number g",
            "accuracy",
            _curves(by_groups, True),
            logx=True,
            xticks=list(s.groups),
        ),
        "random_labels.png": Panel(
            f"random labels: {random_setup}",
            "group number g",
            "training accuracy",
            _curves(random, False),
            hlines={"Base train": base},
            logx=True,
            xticks=list(s.groups),
        ),
    }
    titles = {
        "batch_size.png": "Digits: effect of batch size (GW paper Fig. 1a)",
        "group_number.png": "Digits: effect of group number (GW paper Fig. 1b)",
        "random_labels.png": "Digits: fitting random labels (GW paper Fig. 5)",
    }
    sections = [
        (f"Fig. 1a: batch size ({model})", _table(by_batch, "batch size", True)),
        (f"Fig. 1b: group number ({model}, batch {s.group_sweep_batch_size})", _table(by_groups, "groups", True)),
        (
            f"Fig. 5: random labels ({s.depth}x{s.width} MLP, {random_setup})",
            _table(random, "groups", False) + f"\n\nBase (no normalization): training accuracy {base:.4g}.",
        ),
    ]
    title = "Representational capacity on scikit-learn's digits (GW paper Figs. 1, 5)"
    folder = output_folder(out, "capacity")
    written = [save_figure(folder / name, [panel], titles[name], columns=1) for name, panel in panels.items()]
    written.append(write_markdown(folder, title, sections))
    return written
