"""The ``accelerator`` plan: plain PyTorch operations over the whole batch at once.

The formulas run on all samples in one pass, so the operations dispatched do not grow with the
batch; samples are split into chunks only when the temporaries of one pass would exceed
:data:`TEMPORARY_BYTES`, an absolute budget. Nothing reads tensor data on the host.

Products over few samples (:meth:`AcceleratorPlan.product_chunks`): the ``g x g`` products
``X_C X_C^T`` and ``dY X^T`` of a few samples, with ``m = C/g HW`` inner columns, have too few output
tiles to fill the GPU. Below :data:`SPLIT_ROWS` stacked rows the plan cuts the columns into ``S``
slices, multiplies the stacked samples ``(n g) x m`` by themselves in one batched product of ``S``
``(n g) x (n g)`` outputs, adds the slices and keeps the ``n`` diagonal blocks (``n`` times the
multiply-adds, about :data:`WAVES` waves of tiles).
"""
import functools
import math

import torch

from ..common import largest_divisor_at_most
from .base import ExecutionPlan, clamp_chunk

TEMPORARY_BYTES = 2**30
SPLIT_ROWS = 256  # stacked rows n g up to which small batches are split (n <= 4 at g = 64)
TILE = 64  # edge of an output tile of a batched GEMM of these shapes
MIN_COLUMNS = 256  # columns per slice at least, so that each slice's product is worth a tile
WAVES = 2  # output tiles per multiprocessor that a split aims at
# multiprocessors assumed off CUDA (a plan forced on a CPU, in tests): an H100 SXM's 132
DEFAULT_MULTIPROCESSORS = 132


@functools.lru_cache(maxsize=None)
def _cuda_multiprocessors(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def multiprocessors(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA ``device``; :data:`DEFAULT_MULTIPROCESSORS` elsewhere."""
    if device.type == "cuda":
        return _cuda_multiprocessors(device)
    return DEFAULT_MULTIPROCESSORS


def split_columns(samples: int, rows: int, columns: int, units: int) -> int:
    """Slices ``S`` of the ``columns`` for the products ``A_b B_b^T`` of ``samples`` matrices of
    ``rows x columns`` on a GPU of ``units`` multiprocessors (module docstring): 1 (no split) when
    the unsplit product has at least ``units`` output tiles or the stacked samples exceed
    :data:`SPLIT_ROWS` rows; else the largest divisor of ``columns`` up to the slices that give
    :data:`WAVES` tiles per multiprocessor with at least :data:`MIN_COLUMNS` columns each (1 when
    that is below 2)."""
    tiles = samples * math.ceil(rows / TILE) ** 2
    if tiles >= units or samples * rows > SPLIT_ROWS or columns < 2 * MIN_COLUMNS:
        return 1
    stacked_tiles = math.ceil(samples * rows / TILE) ** 2
    wanted = min(math.ceil(WAVES * units / stacked_tiles), columns // MIN_COLUMNS)
    chunks = largest_divisor_at_most(columns, wanted)
    return chunks if chunks >= 2 else 1


class AcceleratorPlan(ExecutionPlan):
    """Whole-batch passes within an absolute memory budget, small batches' products split
    (module docstring)."""

    name = "accelerator"

    def chunk_size(
        self, samples: int, values_per_sample: int, matrix_values: int, itemsize: int, relative_budget: float
    ) -> int:
        return clamp_chunk(samples, TEMPORARY_BYTES // (values_per_sample * itemsize))

    def product_chunks(self, samples: int, rows: int, columns: int, device: torch.device) -> int:
        return split_columns(samples, rows, columns, multiprocessors(device))
