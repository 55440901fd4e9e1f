"""Conditioning of normalized activations (group_whitening_huang2021, Sec. 3, Fig. 2 and Fig. A3).

Activations ``X = f(X_0)`` are simulated by a randomly initialised MLP ``f`` with 1 or 2 layers
applied to Gaussian ``X_0`` (256 features x 1024 samples in the paper), normalized by each
normalizer, and the generalized condition number ``kappa_p = lambda_max / lambda_p`` of the
``d x d`` covariance of the output is reported, ``lambda_p`` being its ``ceil(p d)``-th largest
eigenvalue. GN and GW are swept over the group number g; Base (no normalization), BN and BW (all
features whitened together, so ``kappa = 1`` up to eps) are single values.

Note on large g: GN/GW centre each of a sample's g groups, so every output row satisfies g linear
equations and the covariance has rank at most ``d - g``; once ``g > (1 - p) d`` the eigenvalue
``lambda_p`` is zero and ``kappa_p`` is reported as ``inf``.

The paper does not name the MLP's nonlinearity; ``activation`` selects it (``relu``, ``linear``
or ``tanh``), weights are drawn from ``N(0, 1/d)``, and everything is computed in float64.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
from torch import Tensor

from gwdet_lab.analysis.normalizers import GROUPED_KINDS, make_norm
from gwdet_lab.analysis.plotting import Curve, Panel, save_figure
from gwdet_lab.analysis.report import markdown_table, output_folder, percent_label, write_markdown

from gwdet.errors import GwdetTypeError, GwdetValueError
from gwdet.layers.common import is_real_number

ACTIVATIONS = {"relu": torch.relu, "linear": lambda x: x, "tanh": torch.tanh}
REFERENCE_KINDS = ("none", "BN", "BW")
REFERENCE_LABELS = {"none": "Base", "BN": "BN", "BW": "BW"}
GROUPED_LABELS = {"GN": "GN", "GW": "GW (ItN)", "GW_ZCA": "GW (ZCA)"}
TABLE_LABELS = {"GN": "GN", "GW": "GW-ItN", "GW_ZCA": "GW-ZCA"}


def condition_number(x: Tensor, p: float) -> float:
    """``kappa_p = lambda_max / lambda_p`` of the covariance of the rows of ``x`` (shape (m, d)).

    ``lambda_p`` is the ``ceil(p d)``-th eigenvalue in descending order (Fig. 2's caption); an
    eigenvalue at rounding-error level (the covariance is rank deficient there) gives ``inf``: at most
    ``d eps lambda_max`` (``eps`` of the dtype computed in), or within the rounding of ``x``'s own values
    (``(eps_x / 2)^2 sum(x^2) / m``, which bounds how far rounding moves a zero eigenvalue).
    ``x`` must be a float16, bfloat16, float32 or float64 tensor (anything else is refused, naming the
    conversion); float32 and float64 are computed in their own dtype, float16 and bfloat16 in float64
    (their values are exact there; torch has no eigenvalue solver for them). ``x`` must hold finite
    values: one NaN or inf makes every covariance entry of its feature undefined, and the input is
    refused (``ValueError``).
    """
    if not is_real_number(p) or not 0.0 < p <= 1.0:
        shown = f"{p!r} ({type(p).__name__})" if not is_real_number(p) else str(p)
        raise GwdetValueError(f"condition_number: p must be a number in (0, 1], the fraction of the eigenvalues up "
                              f"to lambda_p, got {shown}")
    if not isinstance(x, Tensor):
        module = type(x).__module__
        kind = type(x).__name__ if module == "builtins" else f"{module}.{type(x).__name__}"
        raise GwdetTypeError(f"condition_number: x must be a torch.Tensor of shape (m, d), got a value of type {kind}; "
                             "convert it with torch.as_tensor(x).double()")
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise GwdetValueError(f"condition_number: x must be a float16, bfloat16, float32 or float64 tensor, got "
                              f"{x.dtype}; convert it with x.double() (or x.float())")
    if x.dim() != 2 or x.numel() == 0:
        raise GwdetValueError(f"condition_number: x must have shape (m, d), m >= 1 samples of d >= 1 features, got "
                              f"shape {list(x.shape)}; give the activations as a 2-D tensor, one row per sample")
    finite = torch.isfinite(x)
    if not bool(finite.all()):
        bad = int((~finite).sum())
        raise GwdetValueError(f"condition_number: x holds NaN or inf values ({bad} of {x.numel()}), so its covariance "
                              "and condition number are undefined; give finite activations (check the normalizer's "
                              "output with torch.isfinite(x).all())")
    values = x.double() if x.dtype in (torch.float16, torch.bfloat16) else x
    centred = values - values.mean(dim=0, keepdim=True)
    cov = centred.T @ centred / x.shape[0]
    eigenvalues = torch.linalg.eigvalsh(cov).flip(0)
    largest = eigenvalues[0].item()
    at_p = eigenvalues[math.ceil(p * x.shape[1]) - 1].item()
    computing = largest * x.shape[1] * torch.finfo(values.dtype).eps
    rounding = (torch.finfo(x.dtype).eps / 2) ** 2 * float(values.double().square().sum()) / x.shape[0]
    if at_p <= max(computing, rounding):
        return math.inf
    return largest / at_p


def simulate_activations(
    depth: int, num_features: int, num_samples: int, activation: str, generator: torch.Generator
) -> Tensor:
    """``f(X_0)`` as an ``(num_samples, num_features)`` float64 tensor: ``depth`` layers of
    ``activation(X W^T)``, ``W ~ N(0, 1/d)``, applied to standard Gaussian ``X_0``."""
    act = ACTIVATIONS[activation]
    x = torch.randn(num_samples, num_features, generator=generator, dtype=torch.float64)
    for _ in range(depth):
        weight = torch.randn(num_features, num_features, generator=generator, dtype=torch.float64)
        x = act(x @ weight.T / math.sqrt(num_features))
    return x


def normalized(x: Tensor, kind: str, num_groups: int, T: int) -> Tensor:
    """``x`` (m, d) through a freshly built, affine-free normalizer using batch statistics."""
    norm = make_norm(kind, x.shape[1], num_groups, affine=False, T=T).to(torch.float64).train()
    with torch.no_grad():
        return norm(x)


@dataclass
class ConditioningSetting:
    """What to simulate and measure; defaults are the paper's Fig. 2 (d=256, m=1024)."""

    num_features: int = 256
    num_samples: int = 1024
    depths: Sequence[int] = (1, 2)
    activations: Sequence[str] = ("relu", "linear")
    groups: Sequence[int] = (1, 2, 4, 8, 16)
    percents: Sequence[float] = (0.9, 0.8)
    seeds: int = 3
    T: int = 5


Kappas = dict[tuple[str, int, str, int], dict[float, float]]
"""(activation, depth, kind, g) -> {p: kappa_p averaged over seeds}; g is 0 for reference kinds."""


def measure(setting: ConditioningSetting) -> Kappas:
    """``kappa_p`` of every normalizer's output, averaged over ``setting.seeds`` simulations."""
    for activation in setting.activations:
        if activation not in ACTIVATIONS:
            raise GwdetValueError(f"unknown activation {activation!r}; choose from {', '.join(ACTIVATIONS)}")
    sums: Kappas = {}
    for seed in range(setting.seeds):
        generator = torch.Generator().manual_seed(seed)
        for activation in setting.activations:
            for depth in setting.depths:
                x = simulate_activations(depth, setting.num_features, setting.num_samples, activation, generator)
                jobs = [(kind, 0) for kind in REFERENCE_KINDS]
                jobs += [(kind, g) for kind in GROUPED_KINDS for g in setting.groups]
                for kind, g in jobs:
                    y = normalized(x, kind, max(g, 1), setting.T)
                    entry = sums.setdefault((activation, depth, kind, g), {p: 0.0 for p in setting.percents})
                    for p in setting.percents:
                        entry[p] += condition_number(y, p) / setting.seeds
    return sums


def _figure(folder: Path, setting: ConditioningSetting, kappas: Kappas, p: float) -> Path:
    groups = list(setting.groups)
    panels = []
    for activation in setting.activations:
        for depth in setting.depths:
            curves = [
                Curve(GROUPED_LABELS[kind], groups, [kappas[(activation, depth, kind, g)][p] for g in groups])
                for kind in GROUPED_KINDS
            ]
            hlines = {REFERENCE_LABELS[kind]: kappas[(activation, depth, kind, 0)][p] for kind in REFERENCE_KINDS}
            panels.append(
                Panel(
                    title=f"{depth}-layer MLP ({activation})",
                    xlabel="group number g",
                    ylabel=f"kappa_{percent_label(p)}",
                    curves=curves,
                    hlines=hlines,
                    logx=True,
                    logy=True,
                    xticks=groups,
                )
            )
    name = f"kappa_{percent_label(p).rstrip('%')}.png"
    title = (
        f"kappa_{percent_label(p)} of the covariance of the normalized output "
        f"(d={setting.num_features}, m={setting.num_samples}, mean of {setting.seeds} seeds)"
    )
    return save_figure(folder / name, panels, title, columns=len(setting.depths))


def _tables(setting: ConditioningSetting, kappas: Kappas) -> list[tuple[str, str]]:
    sections = []
    for activation in setting.activations:
        for depth in setting.depths:
            columns = [(p, kind) for p in setting.percents for kind in GROUPED_KINDS]
            headers = ["g"] + [f"{TABLE_LABELS[kind]} kappa_{percent_label(p)}" for p, kind in columns]
            rows = [[g] + [kappas[(activation, depth, kind, g)][p] for p, kind in columns] for g in setting.groups]
            references = "; ".join(
                f"{REFERENCE_LABELS[kind]}: " + ", ".join(
                    f"kappa_{percent_label(p)} = {kappas[(activation, depth, kind, 0)][p]:.4g}" for p in setting.percents
                )
                for kind in REFERENCE_KINDS
            )
            body = markdown_table(headers, rows) + "\n\n" + references + "."
            sections.append((f"{depth}-layer MLP, {activation}", body))
    return sections


def run_conditioning(out: str | Path, setting: ConditioningSetting) -> list[Path]:
    """Measure, then write ``<out>/conditioning/kappa_<p>.png`` per p and ``table.md``. The folder is
    written to only once every value is checked and measured, so a run refused or stopped before
    then leaves an earlier run's files as they were."""
    kappas = measure(setting)
    folder = output_folder(out, "conditioning")
    written = [_figure(folder, setting, kappas, p) for p in setting.percents]
    title = (
        f"Conditioning of normalized activations (GW paper Fig. 2): d={setting.num_features}, "
        f"m={setting.num_samples}, T={setting.T}, mean over {setting.seeds} seeds"
    )
    written.append(write_markdown(folder, title, _tables(setting, kappas)))
    return written
