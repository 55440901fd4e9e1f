"""Signal propagation at initialization in a detectron2 model (beyond_batchnorm_lubana2021, Secs. 3-5).

For each norm compared, the model of the config with that norm is built (same seed, so the
convolutions start from the same weights), runs one training step's forward and backward pass on
the same batch of the config's training data, and hooks record, for every residual block of the
ResNet backbone (res2.0 ... res5.last):

* activation variance (Sec. 3, Fig. 2): per channel the variance of the block output over the
  samples and positions, averaged over channels;
* mean cosine similarity of the block output between the samples of the batch (Sec. 4, Figs. 5-6),
  each sample's output flattened into one vector;
* the norm of the loss gradient with respect to the block output (Sec. 5, Figs. 7-8);

and, for every convolution and linear layer of the whole model (in the order they run), the norm
of the loss gradient with respect to its weight. The loss is the sum of the model's training losses.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch
from detectron2.config import CfgNode
from detectron2.data import build_detection_train_loader
from detectron2.modeling import build_model
from detectron2.modeling.backbone import ResNet
from detectron2.utils.env import seed_all_rng
from detectron2.utils.events import EventStorage
from torch import Tensor, nn

from gwdet_lab.analysis.plotting import Curve, Panel, part_ticks, save_figure
from gwdet_lab.analysis.report import display_path, markdown_table, output_folder, write_markdown
from gwdet_lab.benchmark.model_level import adjusted_groups, adjusted_text
from gwdet.errors import GwdetValueError
from gwdet.config_checks import NORM_KEYS
from gwdet.data import prepare_datasets
from gwdet.model_zoo import build_config

AS_CONFIGURED = "config"
"""The norm entry that keeps the config's own norms."""


def norm_overrides(norm: str) -> list[str]:
    """``KEY VALUE`` pairs putting ``norm`` everywhere a norm is configured (none for ``"config"``).

    ``MODEL.RESNETS.GW_NORM`` is included, so the GW positions of gwdet's backbones change too.
    """
    if norm == AS_CONFIGURED:
        return []
    return [item for key in NORM_KEYS for item in (key, norm)]


def training_batch(cfg: CfgNode, seed: int) -> list[dict]:
    """The first batch of ``build_detection_train_loader`` (in this process, no workers)."""
    prepare_datasets(cfg)
    loader_cfg = cfg.clone()
    loader_cfg.defrost()
    loader_cfg.DATALOADER.NUM_WORKERS = 0
    seed_all_rng(seed)
    return next(iter(build_detection_train_loader(loader_cfg)))


def residual_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``("res2.0", block), ...``: every block of the model's first detectron2 ResNet."""
    resnet = next((module for module in model.modules() if isinstance(module, ResNet)), None)
    if resnet is None:
        raise GwdetValueError("propagation: the model has no detectron2 ResNet backbone to hook")
    stages = zip(resnet.stage_names, resnet.stages, strict=True)
    return [(f"{name}.{i}", block) for name, stage in stages for i, block in enumerate(stage)]


def activation_variance(y: Tensor) -> float:
    """Per channel, the variance over samples and positions; averaged over channels."""
    per_channel = y.detach().transpose(0, 1).reshape(y.shape[1], -1)
    return per_channel.var(dim=1).mean().item()


def mean_cosine_similarity(y: Tensor) -> float:
    """Mean over pairs of distinct samples of the cosine similarity of their flattened outputs."""
    flat = nn.functional.normalize(y.detach().reshape(y.shape[0], -1), dim=1)
    n = flat.shape[0]
    if n < 2:
        return math.nan
    gram = flat @ flat.T
    return ((gram.sum() - gram.diagonal().sum()) / (n * (n - 1))).item()


@dataclass
class PropagationStats:
    """What one norm's model showed: per block (variance, cosine, gradient norm), per layer
    weight-gradient norms, in execution order, the loss, and what its norm layers use where the
    group number asked for does not divide their channels (``adjusted``:
    :func:`gwdet_lab.benchmark.model_level.adjusted_groups`)."""

    norm: str
    blocks: dict[str, dict[str, float]] = field(default_factory=dict)
    layer_gradients: dict[str, float] = field(default_factory=dict)
    loss: float = math.nan
    adjusted: list[str] = field(default_factory=list)


def measure_propagation(cfg: CfgNode, batch: list[dict], norm: str, seed: int) -> PropagationStats:
    """Build ``cfg``'s model with ``seed``, run one forward/backward on ``batch``, collect stats."""
    torch.manual_seed(seed)
    model = build_model(cfg)
    model.train()
    stats = PropagationStats(norm, adjusted=adjusted_groups(model))
    layer_order: list[str] = []
    handles = []

    def block_hook(name: str):
        def hook(_module, _inputs, output: Tensor) -> None:
            entry = {
                "variance": activation_variance(output),
                "cosine": mean_cosine_similarity(output),
                "gradient": math.nan,
            }
            stats.blocks[name] = entry
            if output.requires_grad:
                output.register_hook(lambda grad: entry.update(gradient=grad.norm().item()))

        return hook

    def order_hook(name: str):
        def hook(_module, _inputs, _output) -> None:
            if name not in layer_order:
                layer_order.append(name)

        return hook

    for name, block in residual_blocks(model):
        handles.append(block.register_forward_hook(block_hook(name)))
    weighted = {name: module for name, module in model.named_modules() if isinstance(module, (nn.Conv2d, nn.Linear))}
    for name, module in weighted.items():
        handles.append(module.register_forward_hook(order_hook(name)))
    try:
        torch.manual_seed(seed)
        with EventStorage():  # detectron2's training losses log into one
            loss = sum(model(batch).values())
        loss.backward()
    finally:
        for handle in handles:
            handle.remove()
    stats.loss = loss.item()
    for name in layer_order:
        grad = weighted[name].weight.grad
        stats.layer_gradients[name] = grad.norm().item() if grad is not None else math.nan
    return stats


def _block_panel(results: Sequence[PropagationStats], key: str, title: str, ylabel: str, logy: bool) -> Panel:
    """One line per norm of the per-block statistic ``key``, ticks at the first block of a stage."""
    names = list(results[0].blocks)
    index = list(range(len(names)))
    curves = [Curve(r.norm, index, [r.blocks.get(n, {}).get(key, math.nan) for n in names]) for r in results]
    ticks = [i for i, n in enumerate(names) if n.endswith(".0")]
    labels = [names[i] for i in ticks]
    return Panel(title, "residual block", ylabel, curves, logy=logy, xticks=ticks, xticklabels=labels)


def _layer_panel(results: Sequence[PropagationStats]) -> Panel:
    """One line per norm of the weight-gradient norm of every conv/linear layer."""
    layers = list(results[0].layer_gradients)
    index = list(range(len(layers)))
    curves = [Curve(r.norm, index, [r.layer_gradients.get(n, math.nan) for n in layers], style=".-") for r in results]
    ticks, labels = part_ticks(layers)
    title = "||dL/dW|| per conv/linear layer"
    return Panel(title, "layer (execution order)", "gradient norm", curves, logy=True, xticks=ticks, xticklabels=labels)


def _figures(folder: Path, results: Sequence[PropagationStats]) -> list[Path]:
    variance_title = "Activation variance at initialization (Lubana Sec. 3)"
    cosine_title = "Cosine similarity across samples at initialization (Lubana Sec. 4)"
    variance = _block_panel(results, "variance", variance_title, "activation variance", True)
    cosine = _block_panel(results, "cosine", cosine_title, "mean cosine similarity", False)
    gradient = _block_panel(results, "gradient", "||dL/d(block output)|| (Lubana Sec. 5)", "gradient norm", True)
    gradient_panels = [gradient, _layer_panel(results)]
    return [
        save_figure(folder / "activation_variance.png", [variance], columns=1),
        save_figure(folder / "cosine_similarity.png", [cosine], columns=1),
        save_figure(folder / "gradient_norms.png", gradient_panels, "Gradient norms at initialization"),
    ]


def _sections(results: Sequence[PropagationStats], config: str, batch_size: int, opts: Sequence[str],
              seed: int) -> list[tuple[str, str]]:
    names = list(results[0].blocks)
    headers = ["block"] + [f"{r.norm} {q}" for q in ("var", "cos", "grad") for r in results]
    keys = ("variance", "cosine", "gradient")
    rows = [[n] + [r.blocks.get(n, {}).get(key, math.nan) for key in keys for r in results] for n in names]
    losses = ", ".join(f"{r.norm}: {r.loss:.4g}" for r in results)
    overrides = f" with `{' '.join(opts)}`" if opts else ""
    note = (
        f"Config `{display_path(config)}`{overrides}, seed {seed}, one batch of {batch_size} training images; "
        f"training loss at initialization: {losses}."
        + adjusted_text([{"name": r.norm, "adjusted": r.adjusted} for r in results])
    )
    blocks = markdown_table(headers, rows) + "\n\n" + note
    layers = list(results[0].layer_gradients)
    layer_rows = [[i, f"`{n}`"] + [r.layer_gradients.get(n, math.nan) for r in results] for i, n in enumerate(layers)]
    layer_table = markdown_table(["#", "layer"] + [r.norm for r in results], layer_rows)
    return [
        ("Residual blocks: activation variance, cosine similarity, gradient norm", blocks),
        ("||dL/dW|| per conv/linear layer", layer_table),
    ]


def run_propagation(
    out: str | Path, config: str, norms: Sequence[str], opts: Sequence[str] = (), seed: int = 0
) -> list[Path]:
    """Compare ``norms`` on ``config`` (with ``opts`` applied to every variant) and write
    ``<out>/propagation/{activation_variance,cosine_similarity,gradient_norms}.png`` and ``table.md``.
    Every config is built and every model measured before the folder is written to, so a run refused
    or stopped before then leaves an earlier run's files as they were."""
    if not norms:
        raise GwdetValueError("propagation: give at least one norm")
    cfgs = [build_config(config, [*opts, *norm_overrides(norm), "MODEL.DEVICE", "cpu"]) for norm in norms]
    batch = training_batch(cfgs[0], seed)
    results = [measure_propagation(cfg, batch, norm, seed) for cfg, norm in zip(cfgs, norms, strict=True)]
    folder = output_folder(out, "propagation")
    written = _figures(folder, results)
    title = "Signal propagation at initialization (beyond_batchnorm_lubana2021 Secs. 3-5)"
    written.append(write_markdown(folder, title, _sections(results, config, len(batch), opts, seed)))
    return written
