"""Line plots for the analyses: one figure of one or more panels, each panel a set of curves.

Matplotlib runs on the non-interactive Agg backend, so the analyses work without a display.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from gwdet.utils.atomic import write_atomically  # noqa: E402


@dataclass
class Curve:
    """One line: ``label`` at points ``(x, y)``; non-finite y values are left out of the line.
    ``color`` ``None`` takes the next colour of matplotlib's cycle."""

    label: str
    x: Sequence[float]
    y: Sequence[float]
    style: str = "o-"
    color: str | None = None


@dataclass
class Panel:
    """One set of axes. ``hlines`` draws constant reference values (label -> y) across the panel."""

    title: str
    xlabel: str
    ylabel: str
    curves: list[Curve] = field(default_factory=list)
    hlines: dict[str, float] = field(default_factory=dict)
    logx: bool = False
    logy: bool = False
    xticks: Sequence[float] | None = None
    xticklabels: Sequence[str] | None = None


def save_figure(path: Path, panels: Sequence[Panel], title: str = "", columns: int = 2) -> Path:
    """Draw ``panels`` on a grid of ``columns`` columns, save the PNG at ``path``, return ``path``."""
    columns = min(columns, len(panels))
    rows = math.ceil(len(panels) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(5.2 * columns, 3.9 * rows), squeeze=False)
    # strict=False: the grid can have more axes than panels; the spare ones are hidden below
    for ax, panel in zip(axes.flat, panels, strict=False):
        _draw(ax, panel)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(str(path), lambda file: figure.savefig(file, format="png", dpi=110))  # a full disk: one error
    plt.close(figure)
    return path


def model_part(layer_name: str) -> str:
    """The part of a detectron2 model a layer belongs to: ``stem``, ``res4``, ``fpn``, ``box_head``..."""
    parts = layer_name.split(".")
    for part in parts:
        if part == "stem" or (part.startswith("res") and part[3:].isdigit()) or part.endswith(("_head", "_predictor")):
            return part
        if part.startswith("fpn"):
            return "fpn"
    return parts[0]


def part_ticks(layer_names: Sequence[str]) -> tuple[list[int], list[str]]:
    """x ticks at the first of consecutive layers in the same model part, labelled by the part."""
    parts = [model_part(name) for name in layer_names]
    ticks = [i for i in range(len(parts)) if i == 0 or parts[i] != parts[i - 1]]
    return ticks, [parts[i] for i in ticks]


def _draw(ax, panel: Panel) -> None:
    """One panel; non-finite values (an infinite condition number) are left out of the drawing, and
    a panel with nothing finite to draw on its log y axis says so instead."""
    drawn, drawn_x = [], []
    for curve in panel.curves:
        points = [(x, y) for x, y in zip(curve.x, curve.y, strict=True) if math.isfinite(y)]
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        drawn, drawn_x = drawn + ys, drawn_x + xs
        ax.plot(xs, ys, curve.style, label=curve.label, markersize=4, color=curve.color)
    every_x = [x for curve in panel.curves for x in curve.x]
    if not drawn_x and every_x:  # the x range of the values left out, so that the axis still has one
        ax.set_xlim(min(every_x), max(every_x))
    for index, (label, value) in enumerate(panel.hlines.items()):
        if math.isfinite(value):
            drawn.append(value)
            ax.axhline(value, linestyle="--", color=f"C{(len(panel.curves) + index) % 10}", label=label)
    if panel.logx:
        ax.set_xscale("log", base=2)
    if panel.logy and any(value > 0 for value in drawn):
        ax.set_yscale("log")
    elif panel.logy:
        ax.text(0.5, 0.5, "no finite value to draw (see the table)", ha="center", va="center", transform=ax.transAxes)
    if panel.xticks is not None:
        ax.set_xticks(list(panel.xticks))
        if panel.xticklabels is not None:
            ax.set_xticklabels(list(panel.xticklabels), rotation=45, ha="right", fontsize=8)
        else:
            ax.set_xticklabels([f"{t:g}" for t in panel.xticks])
    ax.set_title(panel.title, fontsize=10)
    ax.set_xlabel(panel.xlabel)
    ax.set_ylabel(panel.ylabel)
    ax.grid(True, alpha=0.3)
    if panel.curves or panel.hlines:
        ax.legend(fontsize=7)
