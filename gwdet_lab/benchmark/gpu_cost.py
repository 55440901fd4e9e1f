"""A GPU cost model for the layers, fed by counts taken on a CPU (no GPU was available to measure).

A layer's forward + backward takes ``launches x L + FLOPs / F + bytes / B`` seconds:

* ``launches``: the operations it dispatches plus its Triton kernels
  (:mod:`~gwdet_lab.benchmark.op_counts`; on a GPU each is at least one kernel launch);
* ``L``: :data:`LAUNCH_SECONDS`, the host time PyTorch spends per operation in eager mode (Python,
  dispatcher, ``cudaLaunchKernel``). Several microseconds on current CPUs: NVIDIA's "Getting
  Started with CUDA Graphs" (developer.nvidia.com/blog/cuda-graphs, 2019) measures launch
  overheads of a few microseconds per kernel, and PyTorch's "Accelerating PyTorch with CUDA
  Graphs" (pytorch.org/blog/accelerating-pytorch-with-cuda-graphs, 2021) names per-operation CPU
  overhead as what graphs remove. 5 us is a round value in that range, an assumption of this
  model, not a measurement here;
* ``FLOPs``: GW's multiply-adds times 2 (:func:`group_whitening_flops`: the products over the
  activation and the Newton iterations as the code runs them), ``3 x 2 x 9 N HW C^2`` for the
  3x3 convolution (forward, input and weight gradients), none for GN/BN;
* ``F``: the datasheet peak for how the products run: batched matrix products and Triton's
  ``ieee`` products in float32 on CUDA cores, convolutions in TF32 on tensor cores where the GPU
  has them (PyTorch's default ``torch.backends.cudnn.allow_tf32 = True``);
* ``bytes / B``: the bytes the operations move (estimated from their recorded input shapes) over
  the datasheet memory bandwidth.

Sources of ``F`` and ``B``: NVIDIA Tesla V100 datasheet (SXM2: 15.7 TFLOPS FP32, 900 GB/s HBM2;
images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf) and
NVIDIA H100 Tensor Core GPU datasheet (SXM5: 67 TFLOPS FP32, 989 TFLOPS TF32 with sparsity, i.e.
494.7 dense, 3.35 TB/s HBM3; resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet).

Every term is a lower bound of its kind (peak rates, no overlap lost), so the model predicts
which term dominates and how the plans compare, not absolute times. Step ratios need the rest of
a training step. For ResNet-50 on ImageNet it is the GW paper's measured baseline (Appendix F.2:
BN, 128 images of 224^2 per V100, 419 ms per iteration). For Faster R-CNN it is modelled: the
operations a GN-everywhere training step dispatches besides its GN layers (counted on the CPU at a
small image size; the count hardly depends on it) times ``L``, plus the convolutions' training
FLOPs at the efficiency the paper's baseline implies (:data:`CONV_EFFICIENCY` of the V100's FP32
peak), taken as the same fraction of each GPU's convolution peak; memory traffic outside the
norm layers is left out, so the rest is underestimated and GW's share overestimated.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import torch

from gwdet.layers import largest_divisor_at_most
from gwdet.engine.tables import Column, Table
from gwdet_lab.benchmark.cases import CONV, GN, GW_GROUPS, GW_T, format_shape
from gwdet_lab.benchmark.op_counts import OperationCount

Shape = Tuple[int, ...]
LAUNCH_SECONDS = 5e-6


@dataclass(frozen=True)
class Gpu:
    name: str
    fp32_flops: float  # CUDA cores: batched matrix products, Triton's ieee products
    conv_flops: float  # convolutions as cuDNN runs them by default (TF32 tensor cores where present)
    bandwidth: float  # bytes per second


V100 = Gpu("V100", 15.7e12, 15.7e12, 900e9)
H100 = Gpu("H100", 67e12, 494.7e12, 3.35e12)
GPUS = (V100, H100)

# ResNet-50 (BN), 128 images of 224^2 per GPU: 4.1 G multiply-adds per image forward, 3x for a
# training step, 2 FLOPs each; the paper's V100 takes 419 ms per iteration (Appendix F.2).
RESNET50_MACS_PER_IMAGE = 4.1e9
PAPER_BASELINE_SECONDS = 0.419
PAPER_IMAGES_PER_GPU = 128
CONV_EFFICIENCY = 3 * 2 * RESNET50_MACS_PER_IMAGE * PAPER_IMAGES_PER_GPU / PAPER_BASELINE_SECONDS / V100.conv_flops
PAPER_OVERHEADS = {"S1-B2": 0.227, "everywhere": 0.90}  # GW paper, Appendix F.2, Table A2 and text
# Faster R-CNN R-50-FPN with GN everywhere, one 800 x 1216 image: multiply-adds outside the norm
# layers (docs/benchmarks.md, "Flops": 355.9 G in all, 44.6 G of them in GW)
DETECTOR_MACS_PER_IMAGE = (355.9 - 44.62) * 1e9
DETECTOR_IMAGES_PER_GPU = 2


def group_whitening_flops(
    shape: Sequence[int], groups: int = GW_GROUPS, T: int = GW_T, autograd: bool = False
) -> float:
    """FLOPs of one GW forward + backward as the code runs it, ``s = min(g, m)``: the closed-form
    op does 6 products of ``g x s`` by ``s x m`` per sample (forward covariance and ``W X``,
    backward ``dY X^T``, two for the input gradient, ``W X`` again for the affine weight) and
    ``12 (T - 1)`` products of ``s x s`` (``3T - 3`` forward, ``9T - 9`` backward); autograd through
    the paper's iteration does the same 6 and ``9T``."""
    samples, channels = shape[0], shape[1]
    g = largest_divisor_at_most(channels, groups)
    m = math.prod(shape[1:]) // g
    s = min(g, m)
    newton = 9 * T if autograd else 12 * (T - 1)
    return 2.0 * samples * (6 * g * m * s + newton * s**3)


def conv_flops(shape: Sequence[int]) -> float:
    """FLOPs of a 3x3 ``C -> C`` convolution's forward + backward (input and weight gradients)."""
    samples, channels = shape[0], shape[1]
    return 3 * 2.0 * 9 * samples * math.prod(shape[2:]) * channels**2


def seconds(gpu: Gpu, counted: OperationCount, flops: float, flop_rate: float, scale: float = 1.0) -> float:
    """The model's time; ``scale`` multiplies the bytes (counts taken at fewer samples)."""
    return counted.total * LAUNCH_SECONDS + flops / flop_rate + scale * counted.bytes_moved / gpu.bandwidth


def layer_seconds(gpu: Gpu, name: str, shape: Shape, counted: OperationCount, scale: float = 1.0) -> float:
    """The model's time of the case ``name`` (:func:`~.op_level.op_cases`) at ``shape``."""
    if name == CONV:
        return seconds(gpu, counted, conv_flops(shape), gpu.conv_flops, scale)
    if name.startswith("GW"):
        flops = group_whitening_flops(shape, autograd="autograd" in name)
        return seconds(gpu, counted, flops, gpu.fp32_flops, scale)
    return seconds(gpu, counted, 0.0, gpu.fp32_flops, scale)


GW_MODELLED = ("GW autograd", "GW cpu", "GW accelerator", "GW triton")


def layer_table(results: dict, gpu: Gpu) -> Table:
    """Predicted ms per shape for the convolution, GN and GW under each plan; in parentheses
    GW / conv, and the share of launches in GW's time."""
    table = Table([Column("shape"), *(Column(name, align_right=True) for name in (CONV, GN, *GW_MODELLED))])
    for _, shape in results["shapes"]:
        counts = results["counts"]
        conv = layer_seconds(gpu, CONV, shape, counts[(shape, CONV)])
        row = {"shape": format_shape(shape), CONV: f"{conv * 1e3:.2f}",
               GN: f"{layer_seconds(gpu, GN, shape, counts[(shape, GN)]) * 1e3:.2f}"}
        for name in GW_MODELLED:
            counted = counts[(shape, name)]
            time = layer_seconds(gpu, name, shape, counted)
            launches = counted.total * LAUNCH_SECONDS / time
            row[name] = f"{time * 1e3:.2f} ({time / conv:.2f}; {launches:.0%})"
        table.add(row)
    return table


def resnet50_norm_shapes(samples: int, height: int, width: int) -> List[Tuple[str, Shape]]:
    """``(position, input shape)`` of the 53 norm layers of a ResNet-50 (stride in the 3x3
    convolution): the stem (S1), B1/B2/B3 of each bottleneck and the 4 projection shortcuts."""
    shapes = [("S1", (samples, 64, height // 2, width // 2))]
    size = (height // 4, width // 4)
    for stage, (blocks, planes) in enumerate(((3, 64), (4, 128), (6, 256), (3, 512))):
        out = size if stage == 0 else (size[0] // 2, size[1] // 2)
        for block in range(blocks):
            shapes.append(("B1", (samples, planes, *(size if block == 0 else out))))
            shapes.append(("B2", (samples, planes, *out)))
            shapes.append(("B3", (samples, 4 * planes, *out)))
            if block == 0:
                shapes.append(("shortcut", (samples, 4 * planes, *out)))
        size = out
    return shapes


def detector_norm_shapes() -> List[Tuple[str, Shape]]:
    """The 65 norm layers of Faster R-CNN R-50-FPN with a 4conv1fc box head, 2 images of 800 x 1216
    per GPU and 512 sampled proposals each: the backbone's 53, FPN's lateral and output norms on
    P2-P5, the box head's 4 at 7 x 7."""
    shapes = resnet50_norm_shapes(DETECTOR_IMAGES_PER_GPU, 800, 1216)
    for level in range(2, 6):
        size = (800 // 2**level, 1216 // 2**level)
        shapes += [("FPN", (DETECTOR_IMAGES_PER_GPU, 256, *size))] * 2
    shapes += [("box head", (512 * DETECTOR_IMAGES_PER_GPU, 256, 7, 7))] * 4
    return shapes


STEP_IMPLEMENTATIONS = ("GW autograd", "GW accelerator", "GW triton")
PROXY_SAMPLES = 2  # counts are taken at 2 samples: launches do not depend on N, bytes scale with it


def norm_layer_seconds(gpu: Gpu, name: str, shape: Shape, count_at) -> float:
    """The model's time of ``name`` at ``shape``, counted at :data:`PROXY_SAMPLES` samples."""
    proxy = (min(shape[0], PROXY_SAMPLES), *shape[1:])
    return layer_seconds(gpu, name, shape, count_at(name, proxy), scale=shape[0] / proxy[0])


def detector_rest_operations(image_size: int = 128) -> int:
    """Operations one training step of Faster R-CNN R-50-FPN with GN everywhere dispatches besides
    its GN layers (CPU, 2 synthetic images of ``image_size`` squared pixels)."""
    from detectron2.utils.events import EventStorage

    from gwdet_lab.benchmark.model_level import MODELS, build_detector, synthetic_batch
    from gwdet_lab.benchmark.op_counts import count_operations

    config = dict(MODELS)["GN everywhere"]
    model, optimizer = build_detector(config, torch.device("cpu"), [])
    model.train()
    batch = synthetic_batch(image_size)

    def step() -> None:
        torch.manual_seed(0)
        loss = sum(model(batch).values())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    with EventStorage(0):
        step()
        counted = count_operations(step)
    gn_layers = sum(isinstance(module, torch.nn.GroupNorm) for module in model.modules())
    norm_operations = counted.operations["aten::group_norm"] + counted.operations["aten::native_group_norm_backward"]
    assert norm_operations == 2 * gn_layers, (norm_operations, gn_layers)
    return counted.total - norm_operations


def step_predictions(count_at, rest_operations: int) -> Dict[str, Dict[str, float]]:
    """Predicted training-step ratios: ``{setting: {implementation: value}}``.

    ``count_at(name, shape)`` counts a case. ResNet-50 on ImageNet (the paper's setting, V100):
    GW in place of BN at S1-B2 and everywhere, over the paper's measured 419 ms. Faster R-CNN
    R-50-FPN: GW everywhere / GN everywhere, the rest of the step being ``rest_operations``
    launches plus the convolutions' FLOPs at :data:`CONV_EFFICIENCY` of each GPU's peak."""
    cache: Dict[Tuple[str, Shape], OperationCount] = {}

    def cached(name: str, shape: Shape) -> OperationCount:
        if (name, shape) not in cache:
            cache[(name, shape)] = count_at(name, shape)
        return cache[(name, shape)]

    predictions: Dict[str, Dict[str, float]] = {}
    imagenet = resnet50_norm_shapes(PAPER_IMAGES_PER_GPU, 224, 224)
    for setting, positions in (("S1-B2", {"S1", "B2"}), ("everywhere", {"S1", "B1", "B2", "B3", "shortcut"})):
        chosen = [shape for position, shape in imagenet if position in positions]
        baseline = sum(norm_layer_seconds(V100, "BN", shape, cached) for shape in chosen)
        predictions[f"ResNet-50, V100, GW at {setting} / BN"] = {
            name: 1 + (sum(norm_layer_seconds(V100, name, shape, cached) for shape in chosen) - baseline)
            / PAPER_BASELINE_SECONDS
            for name in STEP_IMPLEMENTATIONS
        }
    detector = [shape for _, shape in detector_norm_shapes()]
    for gpu in GPUS:
        flops = 3 * 2 * DETECTOR_MACS_PER_IMAGE * DETECTOR_IMAGES_PER_GPU
        rest = rest_operations * LAUNCH_SECONDS + flops / (CONV_EFFICIENCY * gpu.conv_flops)
        gn = sum(norm_layer_seconds(gpu, GN, shape, cached) for shape in detector)
        predictions[f"Faster R-CNN R-50-FPN, {gpu.name}, GW / GN everywhere"] = {
            name: (rest + sum(norm_layer_seconds(gpu, name, shape, cached) for shape in detector)) / (rest + gn)
            for name in STEP_IMPLEMENTATIONS
        }
    return predictions


def step_table(predictions: Dict[str, Dict[str, float]]) -> Table:
    table = Table([Column("setting"), *(Column(name, align_right=True) for name in STEP_IMPLEMENTATIONS),
                   Column("paper (V100, measured)", align_right=True)])
    for setting, values in predictions.items():
        measured = next((f"{1 + overhead:.3f}" for key, overhead in PAPER_OVERHEADS.items()
                         if f"GW at {key} " in setting), "-")
        table.add({"setting": setting, **{name: f"{values[name]:.3f}" for name in STEP_IMPLEMENTATIONS},
                   "paper (V100, measured)": measured})
    return table


def cost_tables(results: dict) -> str:
    """The cost model's markdown: per-shape predictions on each GPU and, unless the shapes are the
    quick ones, the step predictions (these count the layers again at 2 samples per shape, on the
    CPU)."""
    from gwdet_lab.benchmark.op_level import layer_count

    def count_at(name: str, shape: Shape) -> OperationCount:
        return layer_count(name, shape, torch.device("cpu"))

    lines = [
        "#### GPU cost model: predicted forward + backward per layer", "",
        f"launches x {LAUNCH_SECONDS * 1e6:.0f} us + FLOPs / peak + bytes / bandwidth "
        "(gwdet_lab/benchmark/gpu_cost.py, constants and sources there), from the counts above. ms; in "
        "parentheses GW / conv and the share of launches in GW's time.", "",
    ]
    for gpu in GPUS:
        lines += [f"{gpu.name}:", "", layer_table(results, gpu).markdown(), ""]
    if results.get("quick"):
        return "\n".join(lines + ["(Training-step predictions: not with --quick.)"]) + "\n"
    rest_operations = detector_rest_operations()
    lines += [
        "#### GPU cost model: predicted training steps", "",
        f"ResNet-50: 1 + the GW layers' predicted time less BN's over the paper's measured 419 ms step "
        f"(128 images per V100); the paper measured +22.7% (S1-B2) and +90% (everywhere). Faster R-CNN "
        f"(2 images of 800 x 1216, 512 proposals each): the rest of the step as the {rest_operations} "
        f"other operations a GN-everywhere step dispatches plus the convolutions' training FLOPs at "
        f"{CONV_EFFICIENCY:.0%} of peak (the efficiency the paper's baseline implies).", "",
        step_table(step_predictions(count_at, rest_operations)).markdown(),
    ]
    return "\n".join(lines) + "\n"
