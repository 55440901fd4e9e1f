"""Speed and memory of gwdet's normalization layers, R-50-FPN Faster R-CNN training steps, and
inference of the demo model.

    python tools/benchmark.py                          # every level, printed
    python tools/benchmark.py --out docs/benchmarks.md # ... and written into that file
    python tools/benchmark.py --layers --repeats 9     # only the layer level
    python tools/benchmark.py --models --image-size 512 --device cuda --amp bf16
    python tools/benchmark.py --inference              # only the inference level
    python tools/benchmark.py --layers --busy 1        # with one competing CPU-bound process
    python tools/benchmark.py --layers --quick --out /tmp/b.md   # tiny shapes, a smoke test
    python tools/benchmark.py --op-counts              # operations per plan, GPU cost model

Layer level (gwdet_lab.benchmark.layer_level): forward + backward of BN, GN(32), GW (itn, g=64,
T=5; and zca), the direct autograd implementation of GW (the state before the fused op), BW (DBN,
ZCA, groups of 16), BGN and, as the yardstick, a 3x3 convolution C -> C at the same shape. Time is
the median over ``--repeats`` rounds after ``--warmup`` calls; ratios divide by the convolution's
time in the same round. Peak memory is the most bytes allocated at once during one forward +
backward, above the input, output gradient and parameters.

Model level (gwdet_lab.benchmark.model_level): one training step (forward, losses, backward, SGD
step with learning rate 0) of Faster R-CNN R-50-FPN on 2 synthetic images of ``--image-size``
squared pixels, for each norm placement, with ``--model-opts`` applied.

Inference level (gwdet_lab.benchmark.inference): per-image evaluation time of the demo Mask R-CNN
with GW (as configured) and with GN in its place; GW in evaluation mode against training mode at
the layer level's shapes.

Op-count level (gwdet_lab.benchmark.op_level): the operations one forward + backward dispatches
(each a kernel launch on a GPU) under each execution plan of gwdet's whitening layers, host
synchronisations, the accelerator plan's peak memory against GN's, and a GPU cost model's
predictions for a V100 and an H100 (gwdet_lab.benchmark.gpu_cost). On a CPU the triton plan's
kernels run in Triton's interpreter: tools/benchmark.py sets TRITON_INTERPRET=1 before anything
imports Triton when there is no GPU (without it the triton columns show the accelerator fallback,
and the report says so).

``--busy N`` starts N competing CPU-bound processes for the measured part and stops them after it
(gwdet_lab.benchmark.busy); the report says so. Progress goes to stderr, one line per measurement
with an ETA; the tables go to stdout and, with ``--out``, into a markdown file (between the
section's markers if the file has them, so text around them is kept). A flag the run would not use
is refused, as the report's command line would show it: ``--amp`` without the model level,
``--section`` without ``--out``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Callable, List, Optional, Sequence, Tuple

import torch

from gwdet.utils.cli_errors import add_verbose_argument, run_tool
from gwdet.engine.threads import configure_threads, thread_request
from gwdet_lab.benchmark.busy import competing_load, too_many_busy
from gwdet_lab.benchmark.cases import COMPILED, COMPILED_CASES, layer_factories
from gwdet_lab.benchmark.inference import inference_tables, run_inference
from gwdet_lab.benchmark.layer_level import layer_tables, run_layers
from gwdet_lab.benchmark.measure import CLOCKS
from gwdet_lab.benchmark.model_level import DEFAULT_MODEL_OPTS, MODELS, check_models, model_tables, run_models
from gwdet_lab.benchmark.op_level import op_count_tables, run_op_counts
from gwdet_lab.benchmark.report import (load_average, report, report_header, section_file_problem, section_problem,
                                         write_section)

# The smallest --image-size: the models (R-50-FPN) pad an image to a multiple of 32, their coarsest
# feature stride, so a smaller one is a 32 x 32 step, not one of the size the report states.
MIN_MODEL_IMAGE_SIZE = 32
DEFAULT_SECTION = "main"

Level = Tuple[str, Callable[[argparse.Namespace, torch.device], dict], Callable[[dict], str]]
LEVELS: List[Level] = [
    ("layers", run_layers, layer_tables),
    ("models", run_models, model_tables),
    ("inference", run_inference, inference_tables),
    ("op_counts", run_op_counts, op_count_tables),
]


def argument_parser() -> argparse.ArgumentParser:
    """The benchmark's command line (``tools/benchmark.py``)."""
    parser = argparse.ArgumentParser(
        prog="tools/benchmark.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", action="store_true", help="run the layer level (default: every level)")
    parser.add_argument("--models", action="store_true", help="run the model level (default: every level)")
    parser.add_argument("--inference", action="store_true", help="run the inference level (default: every level)")
    parser.add_argument("--op-counts", action="store_true",
                        help="count the operations per execution plan and predict GPU times (default: every level)")
    parser.add_argument("--device", type=device_argument, default=None,
                        help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--repeats", type=int, default=None, help="timed calls per layer (default 5, quick 1)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed calls first (default 1, quick 0)")
    parser.add_argument("--model-repeats", type=int, default=None,
                        help="timed training steps per model, and timed passes over the demo images (default 3)")
    parser.add_argument("--model-warmup", type=int, default=None,
                        help="untimed training steps (demo passes) first (default 1)")
    parser.add_argument(
        "--image-size", type=image_size_argument, default=None,
        help=f"square image side for the model level, at least {MIN_MODEL_IMAGE_SIZE} (default: 320 on CPU, 800 on CUDA)"
    )
    parser.add_argument("--norms", nargs="+", default=None, help="layer names to time (the conv is always timed)")
    parser.add_argument("--model-names", nargs="+", default=None, help="subset of: " + ", ".join(n for n, _ in MODELS))
    parser.add_argument("--no-autograd-gw", action="store_true", help="skip the slow autograd GW reference")
    parser.add_argument(
        "--compile", action="store_true",
        help=f"also time {', '.join(COMPILED_CASES)} under torch.compile (compiled in the warmup; with --norms, "
             "those of them it names)",
    )
    parser.add_argument(
        "--model-opts",
        nargs="*",
        default=DEFAULT_MODEL_OPTS,
        help="KEY VALUE config overrides for every model (default: %(default)s; give none to use the configs as they are)",
    )
    parser.add_argument("--amp", choices=["none", "fp16", "bf16"], default="none",
                        help="autocast of the model level (--models only)")
    parser.add_argument("--threads", type=thread_request, default=None, metavar="N|auto-load",
                        help="torch threads (default: the CPUs this process may use; auto-load: those other "
                             "processes leave free at start; see gwdet.engine.threads)")
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="wall time, or the process's CPU time (CPU only; use with --threads 1 on a shared machine)",
    )
    parser.add_argument("--busy", type=int, default=0, metavar="N",
                        help="start N competing CPU-bound processes for the measured part (default 0)")
    parser.add_argument("--quick", action="store_true", help="tiny shapes, 1 repeat (a smoke test)")
    parser.add_argument("--out", default=None, type=os.path.expanduser, help="markdown file to write the tables into")
    parser.add_argument(
        "--section", default=None,
        help=f"name of the generated section in --out (default {DEFAULT_SECTION}; several runs can share one file)"
    )
    add_verbose_argument(parser)
    return parser


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Parsed and checked arguments, with the defaults that depend on others filled in."""
    from gwdet.utils.command_line import refuse_repeated_flags

    parser = argument_parser()
    refuse_repeated_flags(parser, sys.argv[1:] if argv is None else argv)  # a second --norms replaced the first
    args = parser.parse_args(argv)
    known_norms = list(layer_factories(include_autograd=True, include_compiled=args.compile))
    asked = set(args.norms or ())
    compiled = sorted((asked - set(known_norms)) & set(layer_factories(True, include_compiled=True)))
    if compiled:
        parser.error(f"--norms: {', '.join(map(repr, compiled))} time(s) torch.compile of a layer, which only --compile "
                     "adds: add --compile, or leave them out.")
    autograd = asked & (set(layer_factories(include_autograd=True)) - set(layer_factories(include_autograd=False)))
    if args.no_autograd_gw and autograd and asked <= set(known_norms):
        parser.error(f"--norms asks for {', '.join(map(repr, sorted(autograd)))}, which --no-autograd-gw leaves out: "
                     "give one of them.")
    for flag, asked, known in (("--norms", args.norms, known_norms),
                               ("--model-names", args.model_names, [name for name, _ in MODELS])):
        unknown = sorted(set(asked or ()) - set(known))
        if unknown:
            parser.error(f"{flag}: unknown {', '.join(map(repr, unknown))}; choose from {', '.join(map(repr, known))}")
    if args.busy < 0:
        parser.error(f"--busy: {args.busy} is negative; give the number of competing processes (0 for none)")
    if too_many_busy(args.busy) is not None:  # refused before anything is measured
        parser.error(str(too_many_busy(args.busy)))
    for flag, value, least in (("--repeats", args.repeats, 1), ("--model-repeats", args.model_repeats, 1),
                               ("--warmup", args.warmup, 0), ("--model-warmup", args.model_warmup, 0)):
        if value is not None and value < least:
            parser.error(f"{flag}: {value} is less than {least}; give a count of at least {least}")
    if not (args.layers or args.models or args.inference or args.op_counts):
        args.layers = args.models = args.inference = args.op_counts = True
    problem = unused_flag_problem(args)
    if problem:
        parser.error(problem)
    if args.compile and args.norms is not None:
        args.norms = with_compiled_variants(args.norms)
        if not any(name.endswith(COMPILED) for name in args.norms):
            parser.error(f"--compile times {', '.join(COMPILED_CASES)} under torch.compile, and --norms "
                         f"{' '.join(map(repr, args.norms))} names none of them, so nothing would be compiled: add one "
                         "of them to --norms, or leave --compile out.")
    if args.section is None:
        args.section = DEFAULT_SECTION
    problem = section_problem(args.section)
    if problem:
        parser.error(f"--section {args.section!r} {problem}.")
    problem = section_file_problem(args.out, args.section) if args.out else None
    if problem:
        parser.error(problem)
    if args.model_repeats is None:
        args.model_repeats = 3
    if args.model_warmup is None:
        args.model_warmup = 1
    if args.repeats is None:
        args.repeats = 1 if args.quick else 5
    if args.warmup is None:
        args.warmup = 0 if args.quick else 1
    if args.compile:
        args.warmup = max(args.warmup, 1)  # the first call compiles
    return args


def with_compiled_variants(norms: Sequence[str]) -> List[str]:
    """``--norms`` under ``--compile``: each name of :data:`COMPILED_CASES` followed by its compiled
    variant (unless given already), the other names as they are."""
    chosen: List[str] = []
    for name in norms:
        chosen.append(name)
        if name in COMPILED_CASES and name + COMPILED not in norms:
            chosen.append(name + COMPILED)
    return chosen


def unused_flag_problem(args: argparse.Namespace) -> Optional[str]:
    """What is wrong with a flag the run would not use (``--amp``, ``--model-opts``, ``--model-names``
    or ``--image-size`` without the model level, ``--model-repeats`` or ``--model-warmup`` without
    the model or inference level, ``--norms``, ``--compile`` or ``--no-autograd-gw`` without the
    layer level, ``--repeats`` or ``--warmup`` without the layer or inference level, ``--section``
    without ``--out``), else None: the report's command line would show it, as if it had applied."""
    if args.amp != "none" and not args.models:
        levels = ", ".join(f"--{flag.replace('_', '-')}" for flag, _, _ in LEVELS if getattr(args, flag))
        return (f"--amp {args.amp} applies to the model level (--models) only, which this run does not measure "
                f"({levels}: in float32). Add --models, or leave --amp out.")
    level_flags = (
        (args.models, "the model level (--models)",
         {"--model-opts": args.model_opts != DEFAULT_MODEL_OPTS, "--model-names": args.model_names is not None,
          "--image-size": args.image_size is not None}),
        (args.models or args.inference, "the model and inference levels (--models, --inference)",
         {"--model-repeats": args.model_repeats is not None, "--model-warmup": args.model_warmup is not None}),
        (args.layers, "the layer level (--layers)",
         {"--norms": args.norms is not None, "--compile": args.compile, "--no-autograd-gw": args.no_autograd_gw}),
        (args.layers or args.inference, "the layer and inference levels (--layers, --inference)",
         {"--repeats": args.repeats is not None, "--warmup": args.warmup is not None}),
    )
    for used, where, flags in level_flags:
        given = " and ".join(flag for flag, is_given in flags.items() if is_given)
        if given and not used:
            levels = ", ".join(f"--{flag.replace('_', '-')}" for flag, _, _ in LEVELS if getattr(args, flag))
            verb = "apply" if " and " in given else "applies"
            return (f"{given} {verb} to {where} only, which this run does not measure ({levels}). Add that level, or "
                    f"leave {given} out.")
    if args.section is not None and not args.out:
        return (f"--section {args.section}: it names the section of --out the tables are written into, and there "
                "is no --out (the tables are printed only). Add --out FILE, or leave --section out.")
    return None


def image_size_argument(text: str) -> int:
    """``--image-size``: an integer of at least :data:`MIN_MODEL_IMAGE_SIZE`."""
    try:
        size = int(text)
    except ValueError:
        size = 0
    if size < MIN_MODEL_IMAGE_SIZE:
        raise argparse.ArgumentTypeError(
            f"give an integer of at least {MIN_MODEL_IMAGE_SIZE}, got {text!r}: the models pad their images to "
            f"multiples of {MIN_MODEL_IMAGE_SIZE} (the FPN's coarsest stride), so a smaller side would be measured as "
            f"{MIN_MODEL_IMAGE_SIZE} x {MIN_MODEL_IMAGE_SIZE}")
    return size


def device_argument(text: str) -> str:
    """``--device``: ``cpu``, or ``cuda`` / ``cuda:N`` where PyTorch has a CUDA GPU."""
    try:
        device = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a device: give cpu or cuda (cuda:N for another GPU)") from None
    if device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"{text!r}: the benchmark measures cpu or cuda, not {device.type}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{text!r}: this machine has no CUDA GPU that PyTorch can use; give cpu")
    return text


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the levels the arguments ask for, print the report and write it into ``--out``. An error
    gwdet raises on purpose ends it with ``<tool>: error: <message>`` and status 2; ``--verbose``
    shows tracebacks (:mod:`gwdet.utils.cli_errors`)."""
    return run_tool(_benchmark, argv)


def _benchmark(command: List[str]) -> int:
    args = parse_args(command)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    # Randomly initialised models without normalization (FrozenBN keeps mean 0 / var 1) shrink
    # activations into the denormal range, which is many times slower on x86 CPUs.
    flushed = torch.set_flush_denormal(True)
    if args.image_size is None:
        args.image_size = 64 if args.quick else (800 if device.type == "cuda" else 320)
    load_before = load_average()
    start = time.perf_counter()
    if args.models:
        check_models(args, device)
    with competing_load(args.busy):
        # chosen with the competing load running (--threads auto-load counts it), as on a busy machine
        configure_threads(args.threads, log=lambda line: print(line, file=sys.stderr))
        tables = [to_markdown(run(args, device)) for flag, run, to_markdown in LEVELS if getattr(args, flag)]
    header = report_header(args, command, device, load_before, load_average(), time.perf_counter() - start, flushed)
    body = report(header, tables)
    print(body)
    if args.out:
        write_section(args.out, body, args.section)
        print(f"written to {args.out}", file=sys.stderr)
    return 0
