"""The ``accelerator`` plan: plain PyTorch operations over the whole batch at once.

On a GPU every operation is a kernel launch of several microseconds, so the formulas run on all
samples in one pass, whatever the batch size: one GW forward + backward dispatches the same few
operations at 512 samples as at 2048 (docs/benchmarks.md, "Dispatched operations"). Samples are
split into chunks only when the temporaries of one pass would exceed :data:`TEMPORARY_BYTES`, an
absolute budget: about 1/16 of a 16 GB V100 and 1/80 of an 80 GB H100, above the 0.63 GB
(forward) and 0.73 GB (backward) that GW (g = 64) needs at the box head with 2048 proposals,
(2048, 256, 7, 7) in float32. Nothing reads tensor data on the host.
"""
from .base import ExecutionPlan, clamp_chunk

TEMPORARY_BYTES = 2**30


class AcceleratorPlan(ExecutionPlan):
    """Whole-batch passes within an absolute memory budget (module docstring)."""

    name = "accelerator"

    def chunk_size(
        self, samples: int, values_per_sample: int, matrix_values: int, itemsize: int, relative_budget: float
    ) -> int:
        return clamp_chunk(samples, TEMPORARY_BYTES // (values_per_sample * itemsize))
