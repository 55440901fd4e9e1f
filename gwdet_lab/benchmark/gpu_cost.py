"""A GPU cost model for the layers, fed by counts taken on a CPU (no GPU was available to measure).

A layer's forward + backward is a stream of kernels that the host enqueues while the device runs
the earlier ones, so its time is ``max(host, device)`` (a roofline with launch overhead):

* ``host = launches x L``: ``launches`` are the operations it dispatches plus its Triton kernels
  (:mod:`~gwdet_lab.benchmark.op_counts`; on a GPU each is at least one kernel launch), ``L`` is
  :data:`LAUNCH_SECONDS`, the host time PyTorch spends per operation in eager mode (Python,
  dispatcher, ``cudaLaunchKernel``): several microseconds on current CPUs (NVIDIA, "Getting
  Started with CUDA Graphs", developer.nvidia.com/blog/cuda-graphs, 2019; PyTorch, "Accelerating
  PyTorch with CUDA Graphs", pytorch.org/blog/accelerating-pytorch-with-cuda-graphs, 2021); 5 us
  is a round value in that range, an assumption of this model;
* ``device = launches x K + bytes / (B e_mem) + the products' time``: ``K``
  (:data:`KERNEL_SECONDS`) is the least a dependent kernel takes on the device, ``bytes`` what
  the operations move (estimated from their recorded input shapes), ``B`` the datasheet
  bandwidth at :data:`MEMORY_EFFICIENCY`, and each matrix product takes ``FLOPs / (rate x
  efficiency x occupancy)``, ``occupancy = min(1, output tiles / multiprocessors)``: a batched
  GEMM runs about one :data:`TILE` x :data:`TILE` output tile per multiprocessor at a time, so 2
  samples of 64 x 64 outputs keep 2 of 132 busy (:func:`group_whitening_device_seconds` lists the
  products of each plan; the ``accelerator`` and ``triton`` plans split such products over the
  columns, :func:`gwdet.layers.plans.accelerator.split_columns`).

Rates and efficiencies (assumptions, each a round value, stated so that a measurement can replace
it): cuBLAS float32 GEMM at :data:`GEMM_EFFICIENCY` of the FP32 peak; Triton's ``tf32x3``
products (three TF32 tensor-core products each, ``mma.sync`` from register operands) at
:data:`MMA_EFFICIENCY` of a third of the dense TF32 peak; Triton's ``ieee`` products (float32 FMA
with operands read from shared memory for every FMA, the path on a V100) at
:data:`FMA_DOT_EFFICIENCY` of the FP32 peak; local memory (register spills) as traffic at the
memory bandwidth (the kernels compile without spills, tests/test_triton_compile.py, so that term
is 0 here); a 3x3 convolution at :data:`CONV_EFFICIENCY` of the rate cuDNN runs it at by default
(TF32 tensor cores where present, PyTorch's default ``torch.backends.cudnn.allow_tf32 = True``),
the efficiency the GW paper's measured baseline implies (Appendix F.2: BN, 128 images of 224^2
per V100, 419 ms per iteration).

Sources of the peaks: NVIDIA Tesla V100 datasheet (SXM2: 15.7 TFLOPS FP32, 900 GB/s HBM2, 80
SMs; images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf)
and NVIDIA H100 Tensor Core GPU datasheet (SXM5: 67 TFLOPS FP32, 989 TFLOPS TF32 with sparsity,
i.e. 494.7 dense, 3.35 TB/s HBM3, 132 SMs;
resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet).

The model ranks the plans and names the bound (host launches or device work); absolute times
wait for a GPU (``make gpu-check`` writes measured times beside these predictions). Step ratios
need the rest of a training step, and there too the host's launches overlap the device's work:
``max(sum of host, sum of device)`` over the whole step. For ResNet-50 on ImageNet the rest is
the GW paper's measured baseline; for Faster R-CNN it is modelled: the operations a
GN-everywhere training step dispatches besides its GN layers (counted on the CPU at a small image
size; the count hardly depends on it) and the convolutions' training FLOPs at
:data:`CONV_EFFICIENCY`; memory traffic outside the norm layers is left out, so the rest is
underestimated and GW's share overestimated.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import torch

from gwdet.layers import largest_divisor_at_most
from gwdet.layers.group_shapes import keeps_covariance
from gwdet.layers.plans.accelerator import split_columns
from gwdet_lab.tables import Column, Table
from gwdet_lab.benchmark.cases import CONV, GN, GW_GROUPS, GW_T, format_shape
from gwdet_lab.benchmark.op_counts import OperationCount

Shape = Tuple[int, ...]
LAUNCH_SECONDS = 5e-6
KERNEL_SECONDS = 2e-6
TILE = 64
GEMM_EFFICIENCY = 0.7
MMA_EFFICIENCY = 0.5
FMA_DOT_EFFICIENCY = 0.25
MEMORY_EFFICIENCY = 0.8
# Triton kernels: programs per multiprocessor (gwdet.layers.plans.triton_plan) and the local
# memory each thread reads and writes per product (none: tests/test_triton_compile.py)
TRITON_PROGRAMS_PER_MULTIPROCESSOR = 2
TRITON_THREADS = 128
TRITON_SPILL_BYTES_PER_PRODUCT = 0


@dataclass(frozen=True)
class Gpu:
    name: str
    fp32_flops: float  # CUDA cores: cuBLAS float32 products, Triton's ieee products
    tf32_flops: float  # dense TF32 tensor cores (0: none)
    conv_flops: float  # convolutions as cuDNN runs them by default (TF32 tensor cores where present)
    bandwidth: float  # bytes per second
    multiprocessors: int


V100 = Gpu("V100", 15.7e12, 0.0, 15.7e12, 900e9, 80)
H100 = Gpu("H100", 67e12, 494.7e12, 494.7e12, 3.35e12, 132)
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


@dataclass(frozen=True)
class Cost:
    """Host and device seconds of a piece of work; it takes ``max(host, device)``."""

    host: float
    device: float

    @property
    def seconds(self) -> float:
        return max(self.host, self.device)

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(self.host + other.host, self.device + other.device)


def _gw_sizes(shape: Sequence[int], groups: int) -> Tuple[int, int, int]:
    """``(g, m, s = min(g, m))`` of GW at ``shape``."""
    g = largest_divisor_at_most(shape[1], groups)
    m = math.prod(shape[1:]) // g
    return g, m, min(g, m)


def group_whitening_flops(
    shape: Sequence[int], groups: int = GW_GROUPS, T: int = GW_T, autograd: bool = False
) -> float:
    """FLOPs of one GW forward + backward as the code runs it, ``s = min(g, m)``: the closed-form
    op does 6 products of ``g x s`` by ``s x m`` per sample (forward covariance and ``W X``,
    backward ``dY X^T``, two for the input gradient, ``W X`` again for the affine weight) and
    ``12 (T - 1)`` products of ``s x s`` (``3T - 3`` forward, ``9T - 9`` backward); autograd through
    the paper's iteration does the same 6 and ``9T``."""
    g, m, s = _gw_sizes(shape, groups)
    newton = 9 * T if autograd else 12 * (T - 1)
    return 2.0 * shape[0] * (6 * g * m * s + newton * s**3)


def conv_flops(shape: Sequence[int]) -> float:
    """FLOPs of a 3x3 ``C -> C`` convolution's forward + backward (input and weight gradients)."""
    samples, channels = shape[0], shape[1]
    return 3 * 2.0 * 9 * samples * math.prod(shape[2:]) * channels**2


def product_seconds(gpu: Gpu, flops: float, tiles: float, rate: float) -> float:
    """``FLOPs / (rate x occupancy)`` with ``occupancy = min(1, tiles / multiprocessors)``."""
    return flops / (rate * min(1.0, tiles / gpu.multiprocessors))


def _tiles(rows: int, columns: int) -> int:
    return math.ceil(rows / TILE) * math.ceil(columns / TILE)


def triton_newton_seconds(gpu: Gpu, samples: int, size: int, products: int) -> float:
    """The Triton kernels' time for ``products`` ``size x size`` products per matrix: persistent
    programs, :data:`TRITON_PROGRAMS_PER_MULTIPROCESSOR` per multiprocessor sharing its rate, each
    taking ``ceil(samples / programs)`` matrices in turn; ``tf32x3`` on tensor cores where the GPU
    has TF32, ``ieee`` FMA products otherwise; plus the local memory traffic of spills."""
    programs = min(samples, TRITON_PROGRAMS_PER_MULTIPROCESSOR * gpu.multiprocessors)
    if gpu.tf32_flops:
        rate = gpu.tf32_flops / 3 * MMA_EFFICIENCY
    else:
        rate = gpu.fp32_flops * FMA_DOT_EFFICIENCY
    per_program = rate / (TRITON_PROGRAMS_PER_MULTIPROCESSOR * gpu.multiprocessors)
    per_matrix = products * 2.0 * size**3 / per_program
    spills = products * TRITON_SPILL_BYTES_PER_PRODUCT * TRITON_THREADS * samples / gpu.bandwidth
    return math.ceil(samples / programs) * per_matrix + spills


def group_whitening_device_seconds(gpu: Gpu, name: str, shape: Sequence[int], groups: int = GW_GROUPS,
                                   T: int = GW_T) -> float:
    """The products of GW case ``name`` (``GW autograd``, ``GW cpu``, ``GW accelerator``, ``GW
    triton``) on ``gpu``: the ``g x g`` outputs (covariance, ``dY X^T`` and, when the covariance is
    not kept, its recomputation; split over the columns under ``accelerator`` and ``triton``), the
    ``g x m`` outputs (``W X``, ``W^T dY``, ``B X``, ``W X`` again), and the Newton products
    (batched GEMMs of ``samples`` tiles, or the Triton kernels)."""
    samples = shape[0]
    g, m, s = _gw_sizes(shape, groups)
    gemm = gpu.fp32_flops * GEMM_EFFICIENCY
    small_outputs = 2 if keeps_covariance(math.prod(shape[1:]), g) or m < g else 3
    chunks = split_columns(samples, g, m, gpu.multiprocessors) if name in ("GW accelerator", "GW triton") else 1
    if chunks > 1:  # the stacked samples: samples times the work, chunks x (n g)^2 tiles
        small = product_seconds(gpu, 2.0 * samples * samples * g * g * m, chunks * _tiles(samples * g, samples * g),
                                gemm)
    else:
        small = product_seconds(gpu, 2.0 * samples * g * s * m, samples * _tiles(s, s), gemm)
    wide = product_seconds(gpu, 2.0 * samples * g * s * m, samples * _tiles(g, m), gemm)
    newton_products = 9 * T if name == "GW autograd" else 12 * (T - 1)
    if name == "GW triton" and s <= 64:
        newton = triton_newton_seconds(gpu, samples, s, newton_products)
    else:
        newton = product_seconds(gpu, 2.0 * samples * newton_products * s**3, samples * _tiles(s, s), gemm)
    return small_outputs * small + (6 - small_outputs) * wide + newton


def layer_cost(gpu: Gpu, name: str, shape: Shape, counted: OperationCount, scale: float = 1.0) -> Cost:
    """Host and device time of case ``name`` (:func:`~.op_level.op_cases`) at ``shape``; ``scale``
    multiplies the bytes (counts taken at fewer samples)."""
    launches = counted.total
    memory = scale * counted.bytes_moved / (gpu.bandwidth * MEMORY_EFFICIENCY)
    device = launches * KERNEL_SECONDS + memory
    if name == CONV:
        device += conv_flops(shape) / (gpu.conv_flops * CONV_EFFICIENCY)
    elif name.startswith("GW"):
        device += group_whitening_device_seconds(gpu, name, shape)
    return Cost(launches * LAUNCH_SECONDS, device)


def layer_seconds(gpu: Gpu, name: str, shape: Shape, counted: OperationCount, scale: float = 1.0) -> float:
    """The model's time of the case ``name`` at ``shape``: ``max(host, device)``."""
    return layer_cost(gpu, name, shape, counted, scale).seconds


GW_MODELLED = ("GW autograd", "GW cpu", "GW accelerator", "GW triton")
GPU_PLANS = ("GW accelerator", "GW triton")


def faster_plan(gpu: Gpu, shape: Shape, counts: Dict[Tuple[Shape, str], OperationCount]) -> str:
    """The plan of :data:`GPU_PLANS` (without the ``GW `` prefix) that the model predicts faster at
    ``shape``."""
    return min(GPU_PLANS, key=lambda name: layer_seconds(gpu, name, shape, counts[(shape, name)]))[3:]


def layer_table(results: dict, gpu: Gpu) -> Table:
    """Predicted ms per shape for the convolution, GN and GW under each plan; in parentheses GW /
    conv and what bounds GW's time (``host``: its launches, ``device``: its work)."""
    columns = [Column("shape"), *(Column(name, align_right=True) for name in (CONV, GN, *GW_MODELLED)),
               Column("faster GPU plan")]
    table = Table(columns)
    counts = results["counts"]
    for _, shape in results["shapes"]:
        conv = layer_seconds(gpu, CONV, shape, counts[(shape, CONV)])
        row = {"shape": format_shape(shape), CONV: f"{conv * 1e3:.3f}",
               GN: f"{layer_seconds(gpu, GN, shape, counts[(shape, GN)]) * 1e3:.3f}",
               "faster GPU plan": faster_plan(gpu, shape, counts)}
        for name in GW_MODELLED:
            cost = layer_cost(gpu, name, shape, counts[(shape, name)])
            bound = "host" if cost.host >= cost.device else "device"
            row[name] = f"{cost.seconds * 1e3:.3f} ({cost.seconds / conv:.2f}; {bound})"
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


def norm_layer_cost(gpu: Gpu, name: str, shapes: Sequence[Shape], count_at) -> Cost:
    """The model's host and device time of ``name`` at each of ``shapes`` added up, counted at
    :data:`PROXY_SAMPLES` samples."""
    total = Cost(0.0, 0.0)
    for shape in shapes:
        proxy = (min(shape[0], PROXY_SAMPLES), *shape[1:])
        total += layer_cost(gpu, name, shape, count_at(name, proxy), scale=shape[0] / proxy[0])
    return total


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
    launches on the host and the convolutions' FLOPs at :data:`CONV_EFFICIENCY` of each GPU's
    peak on the device. A step takes ``max(host, device)`` of all its work (module docstring)."""
    cache: Dict[Tuple[str, Shape], OperationCount] = {}

    def cached(name: str, shape: Shape) -> OperationCount:
        if (name, shape) not in cache:
            cache[(name, shape)] = count_at(name, shape)
        return cache[(name, shape)]

    predictions: Dict[str, Dict[str, float]] = {}
    imagenet = resnet50_norm_shapes(PAPER_IMAGES_PER_GPU, 224, 224)
    for setting, positions in (("S1-B2", {"S1", "B2"}), ("everywhere", {"S1", "B1", "B2", "B3", "shortcut"})):
        chosen = [shape for position, shape in imagenet if position in positions]
        baseline = norm_layer_cost(V100, "BN", chosen, cached)
        # the rest of the measured step is device work; the host's launches overlap it
        rest = Cost(0.0, PAPER_BASELINE_SECONDS - baseline.device)
        predictions[f"ResNet-50, V100, GW at {setting} / BN"] = {
            name: (rest + norm_layer_cost(V100, name, chosen, cached)).seconds / (rest + baseline).seconds
            for name in STEP_IMPLEMENTATIONS
        }
    detector = [shape for _, shape in detector_norm_shapes()]
    for gpu in GPUS:
        flops = 3 * 2 * DETECTOR_MACS_PER_IMAGE * DETECTOR_IMAGES_PER_GPU
        rest = Cost(rest_operations * LAUNCH_SECONDS, flops / (CONV_EFFICIENCY * gpu.conv_flops))
        gn = (rest + norm_layer_cost(gpu, GN, detector, cached)).seconds
        predictions[f"Faster R-CNN R-50-FPN, {gpu.name}, GW / GN everywhere"] = {
            name: (rest + norm_layer_cost(gpu, name, detector, cached)).seconds / gn for name in STEP_IMPLEMENTATIONS
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
        f"max(host, device): host = launches x {LAUNCH_SECONDS * 1e6:.0f} us; device = launches x "
        f"{KERNEL_SECONDS * 1e6:.0f} us + bytes / ({MEMORY_EFFICIENCY:.0%} of the bandwidth) + each product's "
        f"FLOPs / (rate x efficiency x occupancy), occupancy = output tiles / multiprocessors (cuBLAS "
        f"{GEMM_EFFICIENCY:.0%} of FP32, Triton tf32x3 {MMA_EFFICIENCY:.0%} of TF32 / 3, Triton ieee "
        f"{FMA_DOT_EFFICIENCY:.0%} of FP32, convolutions {CONV_EFFICIENCY:.0%} of cuDNN's default rate; "
        "gwdet_lab/benchmark/gpu_cost.py, constants and sources there), from the counts above. ms; in "
        "parentheses GW / conv and whether the host's launches or the device's work bound GW's time; the last "
        "column: the GPU plan the model predicts faster.", "",
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
