"""The ``cpu`` plan: chunks of samples sized for a CPU's cache, and shortcuts that read the data
on the host (free on a CPU, a device synchronisation elsewhere).

* Chunks: a chunk's temporaries stay within the layer's memory budget (a fraction of the
  activation, :mod:`gwdet.layers.group_whitening_function`), and its ``g x g`` work within
  :data:`CACHE_BYTES` per thread.
* Scaling: when no sample exceeds the safe magnitude (the input's extremes, read on the host), both
  passes skip the scaling steps.
* Affine: below :data:`SHORT_SPATIAL` positions per channel, a per-channel parameter is spread over
  the positions before broadcasting (docs/benchmarks.md).
"""
from typing import Optional

import torch
from torch import Tensor

from ..common import safe_exponent
from .base import ExecutionPlan, clamp_chunk

CACHE_BYTES = 4 * 2**20
SHORT_SPATIAL = 1024


class CpuPlan(ExecutionPlan):
    """Cache-sized chunks and host-side shortcuts (module docstring)."""

    name = "cpu"
    skips_unneeded_scaling = True
    # a batch with a huge sample is centred as its samples would be alone: bit for bit where s = 1
    centres_scaled_input_in_one_pass = False

    def chunk_size(
        self, samples: int, values_per_sample: int, matrix_values: int, itemsize: int, relative_budget: float
    ) -> int:
        chunk = int(relative_budget // values_per_sample)
        cache = CACHE_BYTES * torch.get_num_threads()
        return clamp_chunk(samples, min(chunk, cache // (matrix_values * itemsize)))

    def forward_scales(self, rows: Tensor, dtype: torch.dtype) -> Optional[Tensor]:
        limit = 2.0 ** safe_exponent(dtype)
        if max(float(rows.amax()), -float(rows.amin())) <= limit:
            return None
        return super().forward_scales(rows, dtype)

    def backward_scales(self, rows: Tensor, saved: Tensor, dtype: torch.dtype) -> Optional[Tensor]:
        """Found again from the input as in the forward pass (cheaper here than reading ``saved``)."""
        return self.forward_scales(rows, dtype)

    def spread(self, parameter: Tensor, spatial: int) -> Tensor:
        column = parameter.view(-1, 1)
        if spatial < SHORT_SPATIAL:
            return column.expand(parameter.shape[0], spatial).contiguous()
        return column
