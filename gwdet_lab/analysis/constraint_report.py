"""The ``constraints`` analysis: GW paper Table 1 for given sizes, its numerical check, the
constraint density against batch size / group number, and the GW cost table of a config.

Writes ``<out>/constraints/``: ``constraint_density.png``, ``gw_cost.png`` (when a config is given
and has GW layers) and ``table.md``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from detectron2.config import CfgNode

from gwdet_lab.analysis.constraints import (
    METHODS,
    constraint_number,
    counting_limit,
    dataset_constraint_number,
    in_counting_range,
    is_solvable,
    numerical_constraint_number,
    solvable_limit,
)
from gwdet_lab.analysis.cost import GWLayerCost, cost_model, gw_layer_costs
from gwdet_lab.analysis.plotting import Curve, Panel, part_ticks, save_figure
from gwdet_lab.analysis.report import display_path, markdown_table, output_folder, write_markdown
from gwdet_lab.benchmark.model_level import adjusted_groups

# (method, d, m, g, k) checked numerically: small sizes inside the solvable range, plus one BW and
# one GW case that pass Table 1's counting range but have no solution (residual far from 0).
SMALL_CASES: tuple[tuple[str, int, int, int, int | None], ...] = (
    ("BN", 3, 4, 1, None),
    ("BN", 5, 2, 1, None),
    ("BW", 3, 5, 1, None),
    ("BW", 4, 6, 1, 2),
    ("BW", 4, 4, 1, None),
    ("GN", 6, 3, 2, None),
    ("GN", 8, 2, 4, None),
    ("GW", 12, 2, 3, None),
    ("GW", 20, 2, 4, None),
    ("GW", 16, 2, 4, None),
)


@dataclass
class ConstraintSetting:
    """Table 1's sizes: d features, batch size m, group number g (GN/GW), data set size N and BW
    group size k (``None``: all d features, plain BW). Defaults: the MNIST MLP of Fig. 1."""

    d: int = 256
    m: int = 64
    g: int = 16
    N: int = 60000
    k: int | None = None


def _range_text(method: str, limit: float) -> str:
    return f"m >= {limit:.4g}" if method in ("BN", "BW") else f"g <= {limit:.4g}"


def _yes_no(flag: bool) -> str:
    return "yes" if flag else "no"


def table1_section(s: ConstraintSetting) -> str:
    """Table 1 evaluated at ``s``, with both ranges and whether ``s`` lies inside them."""
    headers = ["method", "zeta(phi; X)", "variables md", "zeta(phi; D)"]
    headers += ["Table 1 range", "inside", "solvable range", "inside"]
    rows = []
    for method in METHODS:
        label = f"BW-C{s.k}" if method == "BW" and s.k not in (None, s.d) else method
        rows.append([
            label,
            constraint_number(method, s.d, s.m, s.g, s.k),
            s.d * s.m,
            dataset_constraint_number(method, s.d, s.m, s.N, s.g, s.k),
            _range_text(method, counting_limit(method, s.d, s.k)),
            _yes_no(in_counting_range(method, s.d, s.m, s.g, s.k)),
            _range_text(method, solvable_limit(method, s.d, s.k)),
            _yes_no(is_solvable(method, s.d, s.m, s.g, s.k)),
        ])
    note = (
        f"d={s.d}, m={s.m}, g={s.g} (GN/GW), N={s.N}. Table 1 range: Eq. 12, zeta(phi; X) <= md. "
        "Solvable range: where the constraint system has a solution at all (BW needs m >= k+1, "
        "GW needs g(g+1) <= d); see gwdet_lab/analysis/constraints.py."
    )
    return markdown_table(headers, rows) + "\n\n" + note


def numerical_check_section(cases: Sequence[tuple[str, int, int, int, int | None]] = SMALL_CASES) -> str:
    """Table 1's formula against the Jacobian rank of all equations at the normalizer's output."""
    headers = ["method", "d", "m", "g", "k", "formula zeta", "Jacobian rank", "max |residual|", "solvable"]
    rows = []
    for method, d, m, g, k in cases:
        rank, residual = numerical_constraint_number(method, d, m, g, k)
        formula = constraint_number(method, d, m, g, k)
        solvable = _yes_no(is_solvable(method, d, m, g, k))
        rows.append([method, d, m, g, "-" if k is None else k, formula, rank, residual, solvable])
    note = (
        "Inside the solvable range the rank equals the formula and the normalizer's output satisfies "
        "every equation (residual ~ 0); outside it (last BW and GW rows) the output cannot satisfy "
        "them and the rank at that point is not the constraint number."
    )
    return markdown_table(headers, rows) + "\n\n" + note


def density_figure(folder: Path, s: ConstraintSetting) -> Path:
    """``zeta(phi; D) / (N d)``, the constrained fraction of the data set's values, against the
    batch size (BN, BW, BW-C16) and the group number (GN, GW); 1 is Eq. 12's limit."""
    batch_sizes = [2**i for i in range(1, 11)]
    groups = [2**i for i in range(0, 9) if 2**i <= max(s.d // 2, 1) and s.d % 2**i == 0]
    per_value = s.N * s.d

    def density(method: str, m: int, g: int = 1, k: int | None = None) -> float:
        return dataset_constraint_number(method, s.d, m, s.N, g, k) / per_value

    batch_curves = [Curve("BN", batch_sizes, [density("BN", m) for m in batch_sizes])]
    group_sizes = {s.d, s.k or s.d} | ({16} if s.d % 16 == 0 else set())
    for k in sorted(group_sizes, reverse=True):
        label = "BW" if k == s.d else f"BW-C{k}"
        batch_curves.append(Curve(label, batch_sizes, [density("BW", m, k=k) for m in batch_sizes]))
    group_curves = [Curve(method, groups, [density(method, s.m, g) for g in groups]) for method in ("GN", "GW")]
    limit = {"zeta = md (Eq. 12)": 1.0}
    ylabel = "zeta(phi; D) / (N d)"
    panels = [
        Panel("(a) batch normalization methods", "batch size m", ylabel, batch_curves, limit, True, True, batch_sizes),
        Panel("(b) group normalization methods", "group number g", ylabel, group_curves, limit, True, True, groups),
    ]
    return save_figure(folder / "constraint_density.png", panels, f"Constraint density (GW paper Table 1), d={s.d}")


def cost_section(costs: Sequence[GWLayerCost], config: str, height: int, width: int, opts: Sequence[str] = (),
                 adjusted: Sequence[str] = ()) -> str:
    """Per-layer relative cost table (ItN formula; for ZCA layers the g^3 term is an estimate) of
    ``config`` with the overrides ``opts``; ``adjusted``: what the layers use where the group number
    asked for does not divide their channels (:func:`gwdet_lab.benchmark.model_level.adjusted_groups`)."""
    overrides = f" with `{' '.join(opts)}`" if opts else ""
    if not costs:
        return f"`{display_path(config)}`{overrides} has no GroupWhitening layer."
    headers = ["#", "layer", "method", "d", "g", "H", "W", "2g/(9d)", "Tg^3/(9HWd^2)", "relative cost", "MMAC/sample"]
    rows = [
        [i, f"`{c.name}`", c.method, c.d, c.g, c.height, c.width]
        + [c.product_term, c.newton_term, c.ratio, c.mega_ops_per_sample]
        for i, c in enumerate(costs)
    ]
    mean = sum(c.ratio for c in costs) / len(costs)
    iterations = "/".join(str(t) for t in sorted({c.T for c in costs}))
    note = (
        f"Config `{display_path(config)}`{overrides}, input {height}x{width}, T = {iterations} (Newton iterations). "
        "Relative cost = 2g/(9d) + Tg^3/(9HWd^2) against a dense 3x3 d->d convolution at the layer's input size "
        f"(GW paper Sec. 3); mean over {len(costs)} GW layers: {mean:.3g}. A sample is an image for "
        "backbone/FPN layers and a region for head layers."
        + (" Group numbers that do not divide the layers' channels were adjusted, and the g column is what the "
           f"layers use: {'; '.join(adjusted)}." if adjusted else "")
    )
    return markdown_table(headers, rows) + "\n\n" + note


def cost_figure(folder: Path, costs: Sequence[GWLayerCost], config: str, height: int, width: int) -> Path:
    """Relative cost of each GW layer, in execution order, ticks at the first layer of each part."""
    index = list(range(len(costs)))
    curves = [Curve("2g/(9d) + Tg^3/(9HWd^2)", index, [c.ratio for c in costs])]
    ticks, labels = part_ticks([c.name for c in costs])
    panel = Panel(
        f"{Path(config).name}, input {height}x{width}",
        "GW layer (execution order)",
        "cost / 3x3 conv",
        curves,
        logy=True,
        xticks=ticks,
        xticklabels=labels,
    )
    title = "GW cost relative to a 3x3 convolution (GW paper Sec. 3)"
    return save_figure(folder / "gw_cost.png", [panel], title, columns=1)


def run_constraints(
    out: str | Path,
    setting: ConstraintSetting,
    cfg: CfgNode | None = None,
    config: str = "",
    input_size: tuple[int, int] = (800, 1333),
    opts: Sequence[str] = (),
) -> list[Path]:
    """Write the constraints report; with ``cfg`` (built with ``MODEL.DEVICE cpu`` from ``config``
    and the overrides ``opts``, which the table names) also the cost of its GW layers on a
    ``input_size`` (H, W) image. Everything is computed (the model built and run) before the folder
    is written to, so a run refused or stopped before then leaves an earlier run's files as they were."""
    sections = [
        ("Table 1 at the given sizes", table1_section(setting)),
        ("Numerical check: Jacobian rank of the constraint system", numerical_check_section()),
    ]
    costs: list[GWLayerCost] = []
    height, width = input_size
    if cfg is not None:
        model = cost_model(cfg)
        costs = gw_layer_costs(cfg, height, width, model)
        heading = "GW layers of the config: cost relative to a 3x3 convolution"
        sections.append((heading, cost_section(costs, config, height, width, opts, adjusted_groups(model))))
    folder = output_folder(out, "constraints")
    written = [density_figure(folder, setting)]
    if costs:
        written.append(cost_figure(folder, costs, config, height, width))
    title = "Constraint numbers of normalization (GW paper Sec. 4, Table 1)"
    written.append(write_markdown(folder, title, sections))
    return written
