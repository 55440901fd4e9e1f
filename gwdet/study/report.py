"""A study's tables (``table.md``, ``table.csv``) and plots (``loss_curves.png``, ``ap_bars.png``).

Columns: COCO box AP / AP50 / AP75 (and mask AP when any run has masks) from ``results.json``;
box AP with inference example weighing at the weight chosen on the test split (runs with batch
norms); the last logged training loss; the median seconds per iteration; the peak resident memory
of the training process (and detectron2's peak GPU memory on GPUs). Plots use matplotlib's
object API (no pyplot, no display needed).
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from matplotlib.figure import Figure

from gwdet.study.summary import RunSummary

TABLE_MD = "table.md"
TABLE_CSV = "table.csv"
LOSS_PNG = "loss_curves.png"
AP_PNG = "ap_bars.png"
EXAMPLE_WEIGHING_HEADER = "box AP + example weighing (w chosen on val)"


@dataclass(frozen=True)
class Column:
    """A table column: markdown header, csv key, the value of a row, and its markdown format."""

    header: str
    key: str
    value: Callable[[RunSummary], object]
    fmt: str = "{:.2f}"

    def markdown(self, row: RunSummary) -> str:
        value = self.value(row)
        if value is None:
            return "–"
        return value if isinstance(value, str) else self.fmt.format(value)


def columns(rows: Sequence[RunSummary]) -> list[Column]:
    """The columns ``rows`` have data for (mask AP, example weighing and GPU memory only if any)."""
    table = [
        Column("run", "run", lambda r: r.name),
        Column("box AP", "box_AP", lambda r: r.box["AP"]),
        Column("AP50", "box_AP50", lambda r: r.box["AP50"]),
        Column("AP75", "box_AP75", lambda r: r.box["AP75"]),
    ]
    if any(r.mask_ap is not None for r in rows):
        table.append(Column("mask AP", "mask_AP", lambda r: r.mask_ap))
    if any(r.weighing_choice for r in rows):
        table.append(Column(EXAMPLE_WEIGHING_HEADER, "ew_box_AP", lambda r: _choice(r, 1)))
        table.append(Column("w", "ew_weight", lambda r: _choice(r, 0), "{:g}"))
    table.append(Column("final loss", "final_loss", lambda r: r.final_loss, "{:.3f}"))
    table.append(Column("s/iter", "sec_per_iter", lambda r: r.seconds_per_iteration, "{:.3f}"))
    table.append(Column("peak RSS (MB)", "peak_rss_mb", lambda r: r.peak_rss_mb, "{:.0f}"))
    if any(r.peak_gpu_mb is not None for r in rows):
        table.append(Column("peak GPU mem (MB)", "peak_gpu_mb", lambda r: r.peak_gpu_mb, "{:.0f}"))
    table.append(Column("config (+ run overrides)", "config", lambda r: r.config))
    return table


def sweep_weights(rows: Sequence[RunSummary]) -> list[str]:
    """Every example weight evaluated for some row, in increasing order."""
    return sorted({w for r in rows for w in r.weighing_sweep}, key=float)


def markdown(rows: Sequence[RunSummary], notes: Sequence[str] = ()) -> str:
    """The main table, the example-weighing sweep (if any), then ``notes`` as a list."""
    table = columns(rows)
    lines = ["## Results", "", _md_row([c.header for c in table]), _md_row(["---"] * len(table))]
    lines += [_md_row([c.markdown(r) for c in table]) for r in rows]
    weights = sweep_weights(rows)
    if weights:
        lines += ["", "## Inference example weighing: box AP per weight w (val split)", ""]
        lines += [_md_row(["run", *(f"w={w}" for w in weights)]), _md_row(["---"] * (len(weights) + 1))]
        for r in rows:
            if r.weighing_sweep:
                lines.append(_md_row([r.name, *(_fmt_ap(r.weighing_sweep.get(w)) for w in weights)]))
        lines += ["", "w=0 is plain batch-norm inference. The weight is chosen and reported on the same "
                  "split, so the chosen number is optimistic."]
    if notes:
        lines += ["", *(f"- {note}" for note in notes)]
    return "\n".join(lines) + "\n"


def write_csv(rows: Sequence[RunSummary], path: Path) -> None:
    """The main table's values (unrounded) plus one ``box_AP_ew_w<weight>`` column per weight swept."""
    table = columns(rows)
    weights = sweep_weights(rows)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([c.key for c in table] + [f"box_AP_ew_w{w}" for w in weights])
        for r in rows:
            values = [c.value(r) for c in table] + [r.weighing_sweep.get(w) for w in weights]
            writer.writerow(["" if v is None else v for v in values])


def plot_loss_curves(rows: Sequence[RunSummary], path: Path) -> None:
    """Training loss (detectron2's 20-iteration median of total_loss) of every run on one axis."""
    figure = Figure(figsize=(7, 4.5), layout="constrained")
    axis = figure.add_subplot()
    for r in rows:
        if r.loss_curve:
            iterations, losses = zip(*r.loss_curve)
            axis.plot([i + 1 for i in iterations], losses, label=r.name)
    axis.set_xlabel("iteration")
    axis.set_ylabel("total_loss (median of 20 iterations)")
    axis.set_title("Training loss")
    axis.grid(alpha=0.3)
    axis.legend()
    figure.savefig(path, dpi=120)


def plot_ap_bars(rows: Sequence[RunSummary], path: Path) -> None:
    """Box AP per run; next to a batch-norm run, its box AP with example weighing (hatched);
    mask AP bars when masks are on."""
    bars: list[tuple[str, float, dict]] = []
    for index, r in enumerate(rows):
        color = f"C{index % 10}"
        bars.append((r.name, r.box["AP"], {"color": color}))
        if r.weighing_choice:
            weight, ap = r.weighing_choice
            bars.append((f"{r.name}\n+EW w={weight:g}", ap, {"color": color, "hatch": "//", "alpha": 0.6}))
        if r.mask_ap is not None:
            bars.append((f"{r.name}\nmask", r.mask_ap, {"color": color, "alpha": 0.35}))
    figure = Figure(figsize=(max(6.0, 1.1 * len(bars)), 4.5), layout="constrained")
    axis = figure.add_subplot()
    for x, (label, value, style) in enumerate(bars):
        height = 0.0 if math.isnan(value) else value
        axis.bar(x, height, edgecolor="black", **style)
        axis.annotate(_fmt_ap(value), (x, height), ha="center", va="bottom", fontsize=8)
    axis.set_xticks(range(len(bars)), [label for label, _, _ in bars], fontsize=8)
    axis.set_ylabel("COCO AP (%)")
    axis.set_title("Box AP (EW: inference example weighing, w chosen on val)")
    axis.grid(axis="y", alpha=0.3)
    figure.savefig(path, dpi=120)


def write_report(rows: Sequence[RunSummary], out_dir: Path, notes: Sequence[str] = ()) -> list[Path]:
    """Write the tables and plots of ``rows`` into ``out_dir``; return the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / TABLE_MD, out_dir / TABLE_CSV, out_dir / LOSS_PNG, out_dir / AP_PNG]
    paths[0].write_text(markdown(rows, notes))
    write_csv(rows, paths[1])
    plot_loss_curves(rows, paths[2])
    plot_ap_bars(rows, paths[3])
    return paths


def _choice(row: RunSummary, index: int) -> float | None:
    """The chosen example weight (``index`` 0) or its box AP (1); ``None`` if not weighed."""
    return row.weighing_choice[index] if row.weighing_choice else None


def _md_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _fmt_ap(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"
