"""``tools/analyze_model.py``: flops, parameters and structure of a gwdet model, as detectron2's
``tools/analyze_model.py`` reports them, with gwdet's layers counted by :mod:`gwdet.layers.cost`::

    python tools/analyze_model.py --config-file configs/mask_rcnn_gw.yaml --tasks flop parameter \\
        --input-size 800 1216 MODEL.DEVICE cpu

``--tasks flop`` prints fvcore's per-module table (``--max-depth``), the flops per operator and the
share of gwdet's layers in each component of an R-CNN (a markdown table). Inputs are the first
``-n`` images of ``DATASETS.TEST[0]``, or with ``--input-size H W`` one random image of that size.
``--tasks structure`` prints the model, down to ``--max-depth`` levels when that is given.
Head flops depend on the number of proposals and detections. A LazyConfig (``.py``, ``key=value``
overrides) gives its model with ``train.init_checkpoint`` and the first ``-n`` batches of ``dataloader.test``.
"""
from __future__ import annotations

import argparse
import contextlib
import itertools
import logging
import math
import re
import statistics
from collections import Counter
from typing import Dict, Iterator, List, Optional, Sequence

import torch

from gwdet.errors import GwdetValueError
from gwdet.utils.command_line import parse_with_trailing_flags, refuse_repeated_flags
from gwdet.engine.run import RunConfig, load_run_config, warn_of_unused_coco
from gwdet.utils.cli_errors import as_override, at_least, run_tool

logger = logging.getLogger("gwdet.export")

# label -> module of a detectron2 R-CNN; "FPN" is the backbone without its bottom-up network.
RCNN_COMPONENTS = {
    "ResNet (backbone.bottom_up)": "backbone.bottom_up",
    "backbone (ResNet + FPN)": "backbone",
    "RPN (proposal_generator)": "proposal_generator",
    "box head (roi_heads.box_head)": "roi_heads.box_head",
    "mask head (roi_heads.mask_head)": "roi_heads.mask_head",
    "whole model": "",
}


# fvcore's and detectron2's tables go this deep when --max-depth is not given.
TABLE_DEPTH = 3


def argument_parser() -> argparse.ArgumentParser:
    from gwdet.export.export_model import add_opts, config_parser

    parser = config_parser("Flops, parameters and structure of a gwdet model.")
    parser.add_argument("--tasks", nargs="+", choices=["flop", "parameter", "structure"], default=["flop"])
    parser.add_argument("-n", "--num-inputs", type=at_least(1, "the image count"), default=1,
                        help="test images to average flops over")
    parser.add_argument("--input-size", type=input_side, nargs=2, metavar=("H", "W"), default=None,
                        help="count on one random image of this size instead of the test set")
    parser.add_argument("--max-depth", type=at_least(1, "the table depth"), default=None,
                        help=f"depth of the per-module tables (default {TABLE_DEPTH}) and, when given, of the "
                             "structure (default: every level); deeper modules are folded into their parent")
    return add_opts(parser)


# Above the largest test sizes of detectron2's configs (1333 pixels on the long side for COCO, 2048
# for Cityscapes) with room to spare; the model sees the image as given (no test resize), and its
# activations at 8192 x 8192 already take tens of GB.
MAX_INPUT_SIDE = 8192


# A config override's key, as detectron2 spells them: MODEL.WEIGHTS, DATASETS.SHAPES.NUM_TRAIN.
_OVERRIDE_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+")


def _side_hint(text: str) -> str:
    """What a side of ``--input-size`` that is no integer was, when that can be told: a number with
    a fraction (sizes are whole pixels), or a config override's key read as the width."""
    try:
        number = float(text)
    except ValueError:
        return " (a config override: give the width before it)" if _OVERRIDE_KEY.fullmatch(text.strip()) else ""
    if not math.isfinite(number):
        return ""
    if number == int(number):
        return f" ({text.strip()} is a whole number not written as an integer: give it as {int(number)})"
    return (f" ({text.strip()} has a fraction, and an image's sides are whole pixels: give an integer, e.g. "
            f"{max(1, round(number))})")


def input_side(text: str) -> int:
    """A side of ``--input-size``: an integer from 1 to :data:`MAX_INPUT_SIDE`."""
    if not text.strip().lstrip("+-").isdigit():
        raise argparse.ArgumentTypeError(
            f"takes two integers, the height and the width (e.g. --input-size 800 1216), got {text!r}"
            + _side_hint(text))
    value = at_least(1, "an image side")(text)
    if value > MAX_INPUT_SIDE:
        raise argparse.ArgumentTypeError(
            f"{value} pixels is above {MAX_INPUT_SIDE}: the model gets the image as given, without the test "
            "resize, and would not fit in memory. Give the size images have after the config's test resize "
            "(e.g. --input-size 800 1216 for COCO).")
    return value


def model_inputs(run: RunConfig, num_inputs: int, input_size: Optional[Sequence[int]]) -> List[List[Dict]]:
    """Batches of one image each: random ``input_size`` pixels, or the first test images
    (``DATASETS.TEST[0]``; a LazyConfig's ``dataloader.test``)."""
    if input_size is not None:
        generator = torch.Generator().manual_seed(0)
        image = torch.rand(3, input_size[0], input_size[1], generator=generator) * 255
        return [[{"image": image}]]
    return list(itertools.islice(run.test_batches(), num_inputs))


def share_rows(analysis, model: torch.nn.Module) -> List[Dict]:
    """gwdet's layers per R-CNN component (:data:`RCNN_COMPONENTS`, plus the FPN row)."""
    from gwdet.export.flops import component_shares

    present = {name for name, _ in model.named_modules()}
    components = {label: module for label, module in RCNN_COMPONENTS.items() if module in present}
    rows = component_shares(analysis, model, components)
    by_module = {row["module"]: row for row in rows}
    if "backbone" in by_module and "backbone.bottom_up" in by_module:
        backbone, bottom_up = by_module["backbone"], by_module["backbone.bottom_up"]
        flops = backbone["flops"] - bottom_up["flops"]
        inside = backbone["gwdet_flops"] - bottom_up["gwdet_flops"]
        by_op = Counter(backbone["by_op"])
        by_op.subtract(bottom_up["by_op"])
        fpn = {"component": "FPN (backbone without bottom_up)", "module": "backbone - backbone.bottom_up",
               "flops": flops, "gwdet_flops": inside, "by_op": dict(by_op), "share": inside / flops if flops else 0.0}
        rows.insert(rows.index(backbone), fpn)
    return rows


def share_markdown(rows: List[Dict]) -> str:
    """The rows of :func:`share_rows` as a markdown table (GFlops = 10^9 multiply-adds)."""
    lines = [
        "| component | GFlops | in gwdet layers (GFlops) | share | by layer op |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for row in rows:
        ops = ", ".join(f"{op.split('::')[-1]} {value / 1e9:.3f}" for op, value in sorted(row["by_op"].items()) if value)
        lines.append(
            f"| {row['component']} | {row['flops'] / 1e9:.3f} | {row['gwdet_flops'] / 1e9:.3f} | "
            f"{100 * row['share']:.1f}% | {ops or '-'} |"
        )
    return "\n".join(lines)


def do_flop(model, batches, max_depth: int) -> Dict:
    from fvcore.nn import flop_count_table

    from gwdet.export.flops import FlopCountAnalysis

    totals: List[int] = []
    by_operator: Counter[str] = Counter()
    for index, batch in enumerate(batches):
        analysis = FlopCountAnalysis(model, batch)
        if index > 0:
            analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
        totals.append(analysis.total())
        by_operator += analysis.by_operator()
        if index == 0:
            first = analysis
    print("Flops (multiply-adds) of the first input:\n" + flop_count_table(first, max_depth=max_depth))
    print("GFlops per operator, averaged: " + str({op: round(v / len(batches) / 1e9, 4) for op, v in by_operator.items()}))
    mean = sum(totals) / len(totals)
    spread = f" +- {statistics.pstdev(totals) / 1e9:.3f}" if len(totals) > 1 else ""
    print(f"GFlops per input: {mean / 1e9:.3f}{spread} (the mean over {len(totals)} input(s), each one image)")
    rows = share_rows(first, model)
    print("gwdet layers per component (first input):\n" + share_markdown(rows))
    return {"total": mean, "rows": rows}


class _ModelLogFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Model:\n")


@contextlib.contextmanager
def model_log_left_out() -> Iterator[None]:
    """Leave out the whole model that building it logs (detectron2's ``Model:`` message): this tool
    prints the structure with ``--tasks structure``, down to ``--max-depth`` when given."""
    loggers = [logging.getLogger("detectron2"), logging.getLogger("detectron2.engine.defaults")]
    left_out = _ModelLogFilter()
    for each in loggers:
        each.addFilter(left_out)
    try:
        yield
    finally:
        for each in loggers:
            each.removeFilter(left_out)


def structure_text(module: torch.nn.Module, max_depth: Optional[int], depth: int = 0) -> str:
    """``str(module)`` down to ``max_depth`` levels (the model is level 0, as in fvcore's tables): a
    module at that level with modules inside is one line, its own settings and the count of the
    modules it holds; every level when ``max_depth`` is None."""
    children = list(module.named_children())
    if not children or max_depth is None:
        return repr(module)
    if depth >= max_depth:
        inside = sum(1 for _ in module.modules()) - 1
        extra = " ".join(module.extra_repr().split())
        return (f"{module._get_name()}({extra + ', ' if extra else ''}"
                f"... {inside} module{'s' if inside != 1 else ''} inside)")
    lines = [f"{module._get_name()}("]
    lines += ["  " + line for line in module.extra_repr().splitlines()]
    for name, child in children:
        lines.append(f"  ({name}): " + structure_text(child, max_depth, depth + 1).replace("\n", "\n  "))
    return "\n".join(lines) + "\n)"


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``tools/analyze_model.py``: the exit status. An error gwdet raises on purpose ends it with
    ``<tool>: error: <message>`` and status 2; ``--verbose`` shows tracebacks
    (:mod:`gwdet.utils.cli_errors`)."""
    return run_tool(_analyze, argv)


def _analyze(argv: Sequence[str]) -> int:
    from detectron2.utils.analysis import parameter_count_table
    from detectron2.utils.logger import setup_logger

    from gwdet.modeling.detectron2_failures import compiled_layers_named

    parser = argument_parser()
    refuse_repeated_flags(parser, argv)
    args = parse_with_trailing_flags(parser, argv)
    if args.input_size is not None and args.num_inputs != 1:
        raise GwdetValueError(f"-n {args.num_inputs} averages over test images, and --input-size counts on one random "
                              "image of that size (the count does not depend on its pixels): give one of them.")
    unread = [flag for flag, given in (("--input-size", args.input_size is not None),
                                       (f"-n {args.num_inputs}", args.num_inputs != 1)) if given]
    if unread and "flop" not in args.tasks:
        raise GwdetValueError(f"{' and '.join(unread)} choose(s) the images --tasks flop counts on, and --tasks "
                              f"{' '.join(args.tasks)} runs the model on no image: add flop to --tasks, or leave "
                              f"{' and '.join(flag.split()[0] for flag in unread)} out.")
    table_depth = TABLE_DEPTH if args.max_depth is None else args.max_depth
    setup_logger(name="fvcore")
    setup_logger(name="detectron2")
    run = load_run_config(args.config_file, args.opts, tool=True)
    if "flop" in args.tasks:
        run.check_plain_model("--tasks flop counts")
    counts_on_test_images = "flop" in args.tasks and args.input_size is None
    run.register_datasets(args.register_coco, trains=False, evaluates=False, reads_tests=counts_on_test_images)
    if counts_on_test_images and not run.test_datasets():
        raise GwdetValueError("--tasks flop counts on images of the config's first test dataset, and the config has "
                              "none: give --input-size H W (random pixels of that size), or a test dataset.")
    if counts_on_test_images:
        first = run.test_datasets()[0]
        warn_of_unused_coco(args.register_coco or (), [first],
                            f"--tasks flop counts on {first} ({run.test_setting}'s first dataset), not on",
                            f"name it first in {run.test_setting} to count on it.")
    meta_refusal = ("--tasks flop runs the model on images, and the config puts it on the meta device, whose tensors "
                    "hold no values: set the device to cpu (MODEL.DEVICE cpu, or train.device=cpu); --tasks parameter "
                    "and structure work on meta.")
    random_weights = as_override(run.weights_setting, '""')
    with compiled_layers_named(run.cfg), model_log_left_out():
        model = run.build_trained_model(
            loads_weights="flop" in args.tasks, meta_refusal=meta_refusal if "flop" in args.tasks else None,
            incomplete_outcome=(f"the flops it counts would be those of a partly random model (the heads' follow its "
                                f"detections); set {random_weights} to count a model of random weights on purpose"))
    if "flop" in args.tasks:
        with torch.no_grad():
            do_flop(model, model_inputs(run, args.num_inputs, args.input_size), table_depth)
    if "parameter" in args.tasks:
        print("Parameters:\n" + parameter_count_table(model, max_depth=table_depth))
    if "structure" in args.tasks:
        print("Model structure:\n" + structure_text(model, args.max_depth))
    return 0
