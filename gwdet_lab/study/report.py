"""A study's report: ``table.md``, ``table.csv``, ``differences.csv``, ``cells.csv`` and plots.

Every AP is box AP on the report split (the config's last test dataset: shapes_test); the
selection split (shapes_val) only chooses the example weight. Tables, built with
:class:`gwdet_lab.tables.Table`:

* per configuration and batch size: mean and sample standard deviation over seeds, each seed's AP;
* paired differences (same seeds) for each of the six orderings the paper's numbers imply: t interval,
  p-value, Holm-adjusted verdict, the interval with the test images' noise, equivalence (TOST);
* example weighing of batch-norm models; batch norm's train/test gap (running statistics vs the
  test batch's statistics);
* AP against batch size when the study has several;
* one row per cell with its own numbers and the command that re-trains it; the cells still pending.

Plots (matplotlib's object API, no display needed): ``ap_bars.png`` (mean AP with standard
deviation error bars and each seed as a dot), ``loss_curves.png`` (training loss against images
seen) and, with several batch sizes, ``ap_vs_batch.png``.
"""
from __future__ import annotations

import contextlib
import csv
import dataclasses
import errno
import os
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

from matplotlib.figure import Figure

from gwdet.errors import listed
from gwdet.utils.atomic import WriteError, folder_held, path_written_atomically, remove_stale_partials, write_atomically
from gwdet_lab.tables import Column, Table
from gwdet_lab.reporting import format_duration
from gwdet_lab.study.cells import COMPARISONS, GROUP_LABELS, PAPER_AP, PAPER_GROUPS, PAPER_ORDERINGS
from gwdet_lab.study.image_bootstrap import MIN_IMAGES, RESAMPLES
from gwdet_lab.study.stats import (
    CONFIDENCE,
    EQUIVALENCE_MARGIN,
    PairedDifference,
    mean,
    paired_difference,
    std,
    with_holm,
)
from gwdet_lab.study.summary import CellResult

TABLE_MD, TABLE_CSV, DIFFERENCES_CSV, CELLS_CSV = "table.md", "table.csv", "differences.csv", "cells.csv"
AP_BARS_PNG, LOSS_PNG, AP_BATCH_PNG = "ap_bars.png", "loss_curves.png", "ap_vs_batch.png"


def label(group: str) -> str:
    return GROUP_LABELS.get(group, group)


def ordered_groups(results: Iterable[CellResult]) -> list[str]:
    """The paper's groups in the paper's order, then any others in order of appearance."""
    seen = list(dict.fromkeys(r.cell.group for r in results))
    return [g for g in PAPER_GROUPS if g in seen] + [g for g in seen if g not in PAPER_GROUPS]


@dataclass
class Group:
    """The finished cells of one configuration at one batch size."""

    group: str
    batch_size: int
    cells: list[CellResult]

    @property
    def trained(self) -> list[CellResult]:
        """The cells that did not diverge."""
        return [c for c in self.cells if not c.diverged]

    def values(self, get) -> list[float]:
        return [v for v in (get(c) for c in self.trained) if v is not None]

    def by_seed(self) -> dict[int, float]:
        """Test AP per seed (NaN for a diverged cell; paired differences leave those seeds out)."""
        return {c.cell.seed: c.test_ap for c in self.cells}

    def resampled_by_seed(self) -> dict[int, list[float]]:
        """Test AP per bootstrap resample of the test images, per seed (cells that have them)."""
        return {c.cell.seed: c.test_ap_resampled for c in self.cells if c.test_ap_resampled}


def grouped(results: Sequence[CellResult]) -> list[Group]:
    cells = defaultdict(list)
    for r in results:
        cells[(r.cell.group, r.cell.batch_size)].append(r)
    order = ordered_groups(results)
    keys = sorted(cells, key=lambda k: (order.index(k[0]), k[1]))
    return [Group(g, b, sorted(cells[(g, b)], key=lambda r: r.cell.seed)) for g, b in keys]


# The images per batch of the paper's from-scratch runs, the only batch size its numbers stand for
PAPER_BATCH = 2


def paper_numbers(groups: Sequence[Group]) -> dict[tuple[str, int], float]:
    """The paper's box AP of each (configuration, batch size) that has one: one of the paper's
    configurations at its batch size whose cells' overrides change nothing of their config file's
    model (:attr:`CellResult.model_overrides`)."""
    return {(g.group, g.batch_size): PAPER_AP[g.group] for g in groups
            if g.group in PAPER_AP and g.batch_size == PAPER_BATCH and not any(c.model_overrides for c in g.cells)}


def other_model_note(results: Sequence[CellResult]) -> str | None:
    """A report note naming the configurations of the paper left without its number because their
    cells' overrides change the model (:func:`paper_numbers`), with those overrides; ``None`` when
    there is none."""
    overridden: dict[str, dict[str, None]] = {}
    for r in results:
        if r.cell.group in PAPER_AP and r.cell.batch_size == PAPER_BATCH and r.model_overrides:
            overridden.setdefault(label(r.cell.group), {}).update(dict.fromkeys(r.model_overrides))
    if not overridden:
        return None
    named = "; ".join(f"{name} (overrides {' '.join(overrides)})" for name, overrides in overridden.items())
    return (f"The paper column, and the paper's difference in each comparison with it, is left empty for {named}: "
            "an override of a MODEL key (other than MODEL.DEVICE) makes another model than the configuration's "
            "config file, so the paper's number is not that model's. To report such a model, give it a name of its "
            "own (--extra NAME=CONFIG KEY VALUE ...).")


def batch_sizes(results: Sequence[CellResult]) -> list[int]:
    return sorted({r.cell.batch_size for r in results})


# ---- tables --------------------------------------------------------------------------------------


AP = "{:.2f}"


def _seed_ap(ap: float | None) -> str:
    return "diverged" if ap is None else f"{ap:.2f}"


def per_seed_labelled(per_seed: Sequence[tuple[int, float | None]]) -> str:
    """The markdown cell of ``(seed, test AP)`` pairs (``None``: diverged), each named by its seed,
    so a group missing a seed shows which: ``s0: 24.49, s2: 25.41``."""
    return ", ".join(f"s{seed}: {_seed_ap(ap)}" for seed, ap in per_seed)


def per_seed_values(per_seed: Sequence[tuple[int, float | None]]) -> str:
    """The CSV cell of ``(seed, test AP)`` pairs: the APs in the order of the seeds (cells.csv
    names each cell's seed)."""
    return ", ".join(_seed_ap(ap) for _, ap in per_seed)


def summary_table(groups: Sequence[Group]) -> Table:
    paper = paper_numbers(groups)
    table = Table([
        Column("config", "configuration"), Column("batch", "images / batch"), Column("n", "seeds"),
        Column("paper_AP", "paper (COCO)", AP), Column("box_AP_mean", "box AP mean", AP),
        Column("box_AP_std", "std", AP), Column("box_AP_per_seed", "per seed", per_seed_labelled,
                                                                csv=per_seed_values),
        Column("image_se", "SE over test images", AP),
        Column("diverged", "diverged runs"),
        Column("AP50_mean", "AP50", AP), Column("AP75_mean", "AP75", AP),
        Column("val_AP_mean", "val AP (not reported; for choices)", AP),
        Column("sec_per_iter", "s/iter (median)", "{:.3f}"),
        Column("wall_per_run", "wall time / run", format_duration),
        Column("peak_rss_mb", "peak RSS (MB)", "{:.0f}"),
    ])
    for g in groups:
        aps = g.values(lambda c: c.test_ap)
        table.add({
            "config": label(g.group), "batch": g.batch_size, "n": len(g.cells),
            "paper_AP": paper.get((g.group, g.batch_size)),
            "box_AP_mean": mean(aps), "box_AP_std": std(aps),
            "box_AP_per_seed": tuple((c.cell.seed, None if c.diverged else c.test_ap) for c in g.cells),
            "diverged": sum(c.diverged for c in g.cells),
            "image_se": mean(g.values(lambda c: c.test_ap_image_se)),
            "AP50_mean": mean(g.values(lambda c: c.test_box["AP50"])),
            "AP75_mean": mean(g.values(lambda c: c.test_box["AP75"])),
            "val_AP_mean": mean(g.values(lambda c: c.val_box_ap)),
            "sec_per_iter": mean(g.values(lambda c: c.seconds_per_iteration)),
            "wall_per_run": mean(g.values(lambda c: c.wall_seconds)),
            "peak_rss_mb": max(g.values(lambda c: c.peak_rss_mb), default=None),
        })
    return table


def differences(groups: Sequence[Group]) -> list[tuple[int, PairedDifference]]:
    """The comparisons (the paper's six orderings, the heads study's) at every batch size where
    both sides have a finished cell; those at one batch size are one family for Holm's adjustment."""
    by_key = {(g.group, g.batch_size): g for g in groups}
    found = []
    for batch in sorted({g.batch_size for g in groups}):
        family = []
        for better, worse in COMPARISONS:
            if (better, batch) in by_key and (worse, batch) in by_key:
                a, b = by_key[(better, batch)], by_key[(worse, batch)]
                values = {better: a.by_seed(), worse: b.by_seed()}
                resampled = {better: a.resampled_by_seed(), worse: b.resampled_by_seed()}
                unknown = any(c.image_noise_unknown for c in (*a.cells, *b.cells))
                family.append(dataclasses.replace(paired_difference(better, worse, values, resampled=resampled),
                                                  image_noise_unknown=unknown))
        found += [(batch, d) for d in with_holm(family)]
    return found


def _yes_no(value: bool | None) -> str:
    return "" if value is None else "yes" if value else "no"


def differences_table(found: Sequence[tuple[int, PairedDifference]],
                      paper: dict[tuple[str, int], float] | None = None) -> Table:
    """The comparisons ``found``, with the paper's difference where ``paper`` (:func:`paper_numbers`)
    has both sides' numbers and the paper orders the pair."""
    paper = paper or {}
    level = f"{100 * CONFIDENCE:.0f}%"
    table = Table([
        Column("ordering", "ordering (A > B)"), Column("batch", "images / batch"),
        Column("paper_diff", "paper A-B (COCO)", "{:+.2f}"), Column("n", "paired seeds"),
        Column("mean_diff", "mean A-B", "{:+.2f}"), Column("std_diff", "std", AP),
        Column("ci_low", f"{level} CI low", "{:+.2f}"), Column("ci_high", f"{level} CI high", "{:+.2f}"),
        Column("p", "p", "{:.3g}"), Column("verdict", "data (unadjusted)"),
        Column("holm_p", "Holm p", "{:.3g}"), Column("holm_verdict", "data (Holm)"),
        Column("images_low", f"{level} CI low, with test-image noise", "{:+.2f}"),
        Column("images_high", f"{level} CI high, with test-image noise", "{:+.2f}"),
        Column("equivalent", f"within ±{EQUIVALENCE_MARGIN:g} AP (TOST)", _yes_no),
        Column("per_seed", "per seed"),
        Column("image_low", f"test images only {level} low", "{:+.2f}"),
        Column("image_high", f"test images only {level} high", "{:+.2f}"),
    ])
    for batch, d in found:
        better, worse = paper.get((d.better, batch)), paper.get((d.worse, batch))
        paper_diff = (better - worse if (d.better, d.worse) in PAPER_ORDERINGS and better is not None
                      and worse is not None else None)
        combined = d.with_image_noise or (None, None)
        table.add({
            "ordering": f"{label(d.better)} > {label(d.worse)}", "batch": batch, "paper_diff": paper_diff, "n": d.n,
            "mean_diff": d.mean, "std_diff": d.std, "ci_low": d.low, "ci_high": d.high,
            "p": d.p_value, "verdict": d.verdict, "holm_p": d.holm_p, "holm_verdict": d.holm_verdict,
            "images_low": combined[0], "images_high": combined[1], "equivalent": d.equivalent(),
            "per_seed": ", ".join(f"s{s}: {v:+.2f}" for s, v in zip(d.seeds, d.differences, strict=True)),
            "image_low": d.image_low, "image_high": d.image_high,
        })
    return table


def comparison_table(groups: Sequence[Group], get: Callable[[CellResult], float | None], header: str,
                     difference: str, detail: Column | None = None,
                     describe: Callable[[list[CellResult]], str] | None = None) -> Table:
    """Per configuration and batch size, over the runs that have it: box AP with ordinary
    inference against box AP of another evaluation of the same models (``get``), and the mean of
    the paired differences; ``detail``/``describe`` add a column about those runs."""
    table = Table([
        Column("config", "configuration"), Column("batch", "images / batch"), Column("n", "seeds"),
        Column("plain_AP", "box AP, running statistics", AP), Column("other_AP", header, AP),
        Column("difference", difference, "{:+.2f}"), *([detail] if detail else []),
    ])
    for g in groups:
        cells = [c for c in g.cells if get(c) is not None]
        if not cells:
            continue
        row = {"config": label(g.group), "batch": g.batch_size, "n": len(cells),
               "plain_AP": mean([c.test_ap for c in cells]), "other_AP": mean([get(c) for c in cells]),
               "difference": mean([get(c) - c.test_ap for c in cells])}
        if detail:
            row[detail.key] = describe(cells)
        table.add(row)
    return table


def swept_weights(results: Sequence[CellResult]) -> str:
    """The example weights the cells with a weighing chose among: ``"0, 0.5, 1"``, or, where cells
    swept other weights, each sweep with its cells (``"0, 1: bn-s0; 0, 0.5, 1: bn-s1"``)."""
    sweeps: dict[str, list[str]] = {}
    for r in results:
        if r.weighing_weight is not None:
            sweeps.setdefault(", ".join(f"{w:g}" for w in sorted(r.weighing_weights)), []).append(r.cell.name)
    if len(sweeps) == 1:
        return next(iter(sweeps))
    return "; ".join(f"{sweep}: {listed(names, 4)}" for sweep, names in sweeps.items())


def weighing_table(groups: Sequence[Group]) -> Table:
    return comparison_table(groups, lambda c: c.weighing_test_ap, "box AP, example weighing",
                            "gain (mean of paired)", Column("weights", "w chosen on val, per seed"),
                            lambda cells: ", ".join(f"{c.weighing_weight:g}" for c in cells))


def gap_table(groups: Sequence[Group]) -> Table:
    return comparison_table(groups, lambda c: c.batch_statistics_ap, "box AP, test batch's statistics",
                            "batch - running")


def batch_table(groups: Sequence[Group], sizes: Sequence[int]) -> Table:
    table = Table([Column("config", "configuration"), *(Column(f"b{b}", f"{b} image{'s' * (b > 1)}") for b in sizes)])
    by_key = {(g.group, g.batch_size): g for g in groups}
    for group in dict.fromkeys(g.group for g in groups):
        row = {"config": label(group)}
        for b in sizes:
            g = by_key.get((group, b))
            if g and g.trained:
                aps = [c.test_ap for c in g.trained]
                row[f"b{b}"] = f"{mean(aps):.2f}" + (f" ± {std(aps):.2f}" if len(aps) > 1 else "")
                row[f"b{b}"] += f" ({len(g.cells) - len(aps)} diverged)" if len(aps) < len(g.cells) else ""
            elif g:
                row[f"b{b}"] = "diverged"
        table.add(row)
    return table


def cells_table(results: Sequence[CellResult]) -> Table:
    table = Table([
        Column("cell"), Column("config", "configuration"), Column("batch", "images / batch"), Column("seed"),
        Column("box_AP", "box AP", AP), Column("image_se", "SE over test images", AP),
        Column("AP50", "AP50", AP), Column("AP75", "AP75", AP),
        Column("val_box_AP", "val AP", AP), Column("ew_weight", "EW w (val)", "{:g}"),
        Column("ew_box_AP", "box AP + EW", AP), Column("batch_stats_AP", "box AP, batch stats", AP),
        Column("final_loss", "final loss", "{:.3f}"), Column("diverged", "diverged", lambda v: "yes" if v else "no"),
        Column("sec_per_iter", "s/iter", "{:.3f}"),
        Column("wall_seconds", "wall time", format_duration), Column("peak_rss_mb", "peak RSS (MB)", "{:.0f}"),
        Column("command", "re-train this cell alone", lambda c: f"`{c}`"),
    ])
    for r in results:
        table.add({
            "cell": r.cell.name, "config": label(r.cell.group), "batch": r.cell.batch_size, "seed": r.cell.seed,
            "box_AP": r.test_ap, "image_se": r.test_ap_image_se, "AP50": r.test_box["AP50"], "AP75": r.test_box["AP75"],
            "val_box_AP": r.val_box_ap, "ew_weight": r.weighing_weight, "ew_box_AP": r.weighing_test_ap,
            "batch_stats_AP": r.batch_statistics_ap, "final_loss": r.final_loss, "diverged": r.diverged,
            "sec_per_iter": r.seconds_per_iteration, "wall_seconds": r.wall_seconds,
            "peak_rss_mb": r.peak_rss_mb, "command": r.command,
        })
    return table


def markdown(title: str, results: Sequence[CellResult], pending: Sequence[str], notes: Sequence[str] = ()) -> str:
    groups = grouped(results)
    sizes = batch_sizes(results)
    lines = [f"# {title}", ""]
    if results:
        report, select = results[0].report_dataset, results[0].selection_dataset
        lines += [f"Box AP in % on `{report}` (COCOEvaluator). `{select}` only chooses the example weight."
                  + (" The two are the same split here, so chosen numbers are optimistic." if report == select else ""),
                  ""]
    lines += ["## Box AP per configuration (mean and sample std over seeds)", "",
              f"'SE over test images': the standard deviation of a cell's box AP over {RESAMPLES} bootstrap "
              "resamples of the test images (mean over the configuration's cells), i.e. how much the AP "
              "would move with another test set of the same size.", "", summary_table(groups).markdown(), ""]
    found = differences(groups)
    if found:
        lines += ["## Paired differences", "",
                  "The paper's four numbers order the configurations GW > BN + GW at S1-B2 > GN > BN; every "
                  "pair of them is an ordering, and each is tested here where both have cells (the heads "
                  "study adds its own comparisons). Mean of A - B over the seeds both "
                  f"have; {100 * CONFIDENCE:.0f}% two-sided paired Student t interval over seeds (df = seeds - 1) "
                  "and its p-value. 'supports': the interval lies above 0; 'contradicts': below 0; 'cannot "
                  "resolve': it contains 0. 'Holm': the verdict again with p-values adjusted by Holm's "
                  "step-down method over the orderings at the same batch size, so that the chance of any "
                  f"false verdict among them stays below {1 - CONFIDENCE:.2f}. The seed interval covers "
                  "training-seed variation on this one test set; 'with test-image noise' adds the variance "
                  f"of the mean difference over {RESAMPLES} bootstrap resamples of the test images (the same "
                  "resamples for every cell), the part of the difference that all seeds share because they "
                  f"are scored on the same images. 'within ±{EQUIVALENCE_MARGIN:g} AP': two one-sided t tests "
                  f"at alpha {1 - CONFIDENCE:.2f} (the {100 * (1 - 2 * (1 - CONFIDENCE)):.0f}% interval lies "
                  "inside the margin). 'test images only': the percentile interval over the resamples with "
                  "the trained models fixed.", "", differences_table(found, paper_numbers(groups)).markdown(), ""]
    weighing = weighing_table(groups)
    if weighing.rows:
        lines += ["## Inference example weighing (batch-norm models)", "",
                  f"The weight w is chosen per run on the selection split among the swept weights "
                  f"({swept_weights(results)}); the table reports the report split at that w.", "",
                  weighing.markdown(), ""]
    gaps = gap_table(groups)
    if gaps.rows:
        lines += ["## Batch norm's train/test gap", "",
                  "Running statistics: ordinary inference, one image at a time. Test batch's statistics: "
                  "every batch norm normalizes with the statistics of the test batch, fed in batches of the "
                  "training batch size, as in training.", "", gaps.markdown(), ""]
    if len(sizes) > 1:
        lines += ["## Box AP against images per batch (images seen held fixed, LR scaled linearly)", "",
                  batch_table(groups, sizes).markdown(), ""]
    lines += ["## Every cell", "", cells_table(results).markdown(), ""]
    if pending:
        lines += ["## Pending", "", "Not finished yet (not in the tables above): " + ", ".join(pending) + ".", ""]
    if notes:
        lines += ["## Notes", "", *(f"- {note}" for note in notes), ""]
    return "\n".join(lines)


# ---- plots ---------------------------------------------------------------------------------------


def plot_ap_bars(results: Sequence[CellResult], path: Path) -> None:
    """Mean box AP per configuration and batch size, std error bars, each seed as a dot; next to
    batch-norm configurations, their AP with example weighing (hatched)."""
    bars = []
    for g in grouped(results):
        colour = f"C{ordered_groups(results).index(g.group) % 10}"
        suffix = f"\n{g.batch_size} img" if len(batch_sizes(results)) > 1 else ""
        if not g.trained:
            continue
        bars.append((label(g.group) + suffix, [c.test_ap for c in g.trained], {"color": colour}))
        weighed = [c.weighing_test_ap for c in g.cells if c.weighing_test_ap is not None]
        if weighed:
            bars.append((f"{label(g.group)}{suffix}\n+EW", weighed, {"color": colour, "hatch": "//", "alpha": 0.55}))
    figure = Figure(figsize=(max(6.0, 0.9 * len(bars) + 1), 4.5), layout="constrained")
    axis = figure.add_subplot()
    for x, (_name, values, style) in enumerate(bars):
        m, s = mean(values), std(values)
        axis.bar(x, m, yerr=s, capsize=4, edgecolor="black", **style)
        axis.scatter([x] * len(values), values, color="black", s=10, zorder=3)
        axis.annotate(f"{m:.2f}", (x, m + (s or 0)), ha="center", va="bottom", fontsize=8,
                      xytext=(0, 2), textcoords="offset points")
    axis.set_xticks(range(len(bars)), [name for name, _, _ in bars], fontsize=8)
    axis.set_ylabel(f"box AP (%) on {results[0].report_dataset}")
    axis.set_title("Box AP, mean over seeds; error bars: sample std; dots: seeds\n"
                   "(+EW: inference example weighing, w chosen on the selection split)", fontsize=9)
    axis.grid(axis="y", alpha=0.3)
    write_atomically(str(path), lambda file: figure.savefig(file, format="png", dpi=120))


def plot_loss_curves(results: Sequence[CellResult], path: Path) -> None:
    """Training loss (detectron2's 20-iteration median of total_loss) against images seen; one
    colour per configuration, one line style per batch size, one line per seed."""
    groups = ordered_groups(results)
    sizes = batch_sizes(results)
    styles = ["-", "--", ":", "-."]
    figure = Figure(figsize=(8, 5), layout="constrained")
    axis = figure.add_subplot()
    labelled = set()
    for r in results:
        if not r.loss_curve:
            continue
        iterations, losses = zip(*r.loss_curve, strict=True)
        key = (r.cell.group, r.cell.batch_size)
        name = label(r.cell.group) + (f", {r.cell.batch_size} img" if len(sizes) > 1 else "")
        axis.plot([(i + 1) * r.images_per_iteration for i in iterations], losses,
                  color=f"C{groups.index(r.cell.group) % 10}", linestyle=styles[sizes.index(r.cell.batch_size) % 4],
                  linewidth=0.8, alpha=0.8, label=None if key in labelled else name)
        labelled.add(key)
    axis.set_xlabel("images seen")
    axis.set_ylabel("total_loss (median of 20 iterations)")
    axis.set_yscale("log")
    axis.set_title("Training loss (one line per seed)")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    write_atomically(str(path), lambda file: figure.savefig(file, format="png", dpi=120))


def plot_ap_vs_batch(results: Sequence[CellResult], path: Path) -> None:
    """Box AP against images per batch per configuration (GN paper's Fig. 1, for detection);
    dashed: batch-norm models evaluated with the test batch's statistics."""
    groups = grouped(results)
    figure = Figure(figsize=(7, 4.5), layout="constrained")
    axis = figure.add_subplot()
    order = ordered_groups(results)
    for group in order:
        mine = [g for g in groups if g.group == group and g.trained]
        sizes = [g.batch_size for g in mine]
        colour = f"C{order.index(group) % 10}"
        aps = [[c.test_ap for c in g.trained] for g in mine]
        axis.errorbar(sizes, [mean(a) for a in aps], yerr=[std(a) or 0.0 for a in aps], color=colour,
                      marker="o", capsize=3, label=label(group))
        with_batch = [(g.batch_size, mean([c.batch_statistics_ap for c in g.cells]))
                      for g in mine if all(c.batch_statistics_ap is not None for c in g.cells)]
        if with_batch:
            xs, ys = zip(*with_batch, strict=True)
            axis.plot(xs, ys, color=colour, marker="x", linestyle="--",
                      label=f"{label(group)}, test batch's statistics")
    axis.set_xscale("log", base=2)
    all_sizes = batch_sizes(results)
    axis.set_xticks(all_sizes, [str(b) for b in all_sizes])
    axis.set_xlabel("images per batch (images seen fixed, LR scaled linearly)")
    axis.set_ylabel(f"box AP (%) on {results[0].report_dataset}")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    write_atomically(str(path), lambda file: figure.savefig(file, format="png", dpi=120))


def few_test_images_note(results: Sequence[CellResult]) -> str | None:
    """A report note naming the cells whose report split has too few images to resample
    (:attr:`CellResult.image_noise_unknown`), ``None`` when there is none."""
    cells = [r.cell.name for r in results if r.image_noise_unknown]
    if not cells:
        return None
    return (f"The report split of {listed(cells, 4)} holds fewer than {MIN_IMAGES} images: every bootstrap resample "
            "of one image is that image, so the test images' noise cannot be estimated. 'SE over test images' and "
            "the interval with test-image noise are left empty, and no equivalence (TOST) is claimed; evaluate on "
            "more test images to measure them.")


REPORT_FILES = (TABLE_MD, TABLE_CSV, DIFFERENCES_CSV, CELLS_CSV, AP_BARS_PNG, LOSS_PNG, AP_BATCH_PNG)


def foreign_report_problem(flag: str, folder: Path, titles: Sequence[str], names: Sequence[str] = REPORT_FILES,
                           tool: str = "compare_norms.py") -> str | None:
    """Why a report of ``tool`` must not be written into ``folder`` (given as ``flag``): a file
    there, not a folder; or files of the report's ``names`` beside no ``table.md`` of such a report
    (its first line is ``# `` and one of ``titles``), which the report would replace: the user's
    own. ``None`` otherwise."""
    if folder.exists() and not folder.is_dir():
        return f"{flag} {folder} is a file, not a folder: give the folder to write the report into (created when missing)."
    existing = [name for name in names if (folder / name).exists()]
    if not existing:
        return None
    table = folder / TABLE_MD
    if table.is_file():
        with open(table, encoding="utf-8", errors="replace") as f:
            if f.readline().rstrip("\n") in {f"# {title}" for title in titles}:
                return None  # an earlier report of this tool
    return (f"{flag} {folder} holds {', '.join(existing)}, which the report would replace, and no {TABLE_MD} there is "
            f"one of {tool}'s reports: they are not the tool's. Give another folder, or move those files "
            "away; nothing was written.")


def reported_cells(folder: Path) -> set[str]:
    """The cells of the report in ``folder`` (its ``cells.csv``; none without one)."""
    path = folder / CELLS_CSV
    if not path.is_file():
        return set()
    with open(path, newline="", encoding="utf-8", errors="replace") as file:
        return {row["cell"] for row in csv.DictReader(file) if row.get("cell")}


# What table.md holds while the other files of a report are put in place: a report stopped there leaves a
# folder that says so (its first line stays the report's title, so the same command writes it again)
UNFINISHED = ("**Unfinished**: this report stopped before its table was written; the other files here may be of "
              "another report. Run the same command again.")


def write_report(title: str, results: Sequence[CellResult], pending: Sequence[str], out_dir: Path,
                 notes: Sequence[str] = (), check: Callable[[], None] | None = None) -> list[Path]:
    """Every file of the report into ``out_dir``; returns their paths. ``out_dir`` is held
    (:func:`~gwdet.utils.atomic.folder_held`) while ``check`` (a refusal that writes nothing) runs
    and the files are written, so that two reports into one folder are checked and written one
    after the other. Each file is written under a temporary name beside its place and put in place
    only once every one is complete (:func:`_write_report_files`). When a file cannot be written (a
    full disk), the earlier report there is kept as it was, no file of the new one in place, and
    :class:`~gwdet.utils.atomic.WriteError` names the folder and the fix."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with folder_held(str(out_dir)):
            if check is not None:
                check()
            return _write_report_files(title, results, pending, out_dir, notes)
    except OSError as error:
        reason = os.strerror(error.errno) if error.errno else (error.strerror or str(error))
        fix = ("Make space (or give another --report-to)" if error.errno in (errno.ENOSPC, errno.EDQUOT) else
               "Give a --report-to this process may write")
        raise WriteError(error.errno, f"cannot write the report into {out_dir}: {reason}; no file of the new report "
                         f"was put there, and what was there is kept as it was. {fix} and run the same command "
                         "again: the cells' results are kept and nothing trains again.") from None


@contextlib.contextmanager
def _once_written(action: Callable[[], None]) -> Iterator[None]:
    """Call ``action`` when the block ends without an error."""
    yield
    action()


def _write_report_files(title: str, results: Sequence[CellResult], pending: Sequence[str], out_dir: Path,
                        notes: Sequence[str]) -> list[Path]:
    """The report's files, each written first under a temporary name in ``out_dir``
    (:func:`~gwdet.utils.atomic.path_written_atomically`); once all are complete they are renamed
    into place: ``table.md`` saying the report is unfinished (:data:`UNFINISHED`), then the other
    files, then (a figure this report does not draw removed) ``table.md`` with the report. A file
    that cannot be written raises before any is renamed, its temporary files removed."""
    remove_stale_partials(str(out_dir), "report")
    groups = grouped(results)
    paths = [out_dir / TABLE_MD, out_dir / TABLE_CSV, out_dir / DIFFERENCES_CSV, out_dir / CELLS_CSV]
    if results:
        paths += [out_dir / AP_BARS_PNG, out_dir / LOSS_PNG]
        if len(batch_sizes(results)) > 1:
            paths.append(out_dir / AP_BATCH_PNG)
    undrawn = [out_dir / name for name in (AP_BARS_PNG, LOSS_PNG, AP_BATCH_PNG) if out_dir / name not in paths]
    with contextlib.ExitStack() as stack:  # left in reverse order: the renames happen in that order

        def beside(path: Path) -> Path:
            return Path(stack.enter_context(path_written_atomically(str(path))))

        def remove_undrawn() -> None:  # an earlier report's figure
            for path in undrawn:
                path.unlink(missing_ok=True)

        beside(paths[0]).write_text(markdown(title, results, pending, notes))
        stack.enter_context(_once_written(remove_undrawn))
        summary_table(groups).write_csv(beside(paths[1]))
        differences_table(differences(groups), paper_numbers(groups)).write_csv(beside(paths[2]))
        cells_table(results).write_csv(beside(paths[3]))
        drawings = (plot_ap_bars, plot_loss_curves, plot_ap_vs_batch)
        for draw, path in zip(drawings[:len(paths) - 4], paths[4:], strict=True):
            draw(results, beside(path))
        beside(paths[0]).write_text(f"# {title}\n\n{UNFINISHED}\n")
    return paths
