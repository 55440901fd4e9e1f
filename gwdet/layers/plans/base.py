"""What an execution plan decides, and the choices every plan but ``cpu`` shares.

A plan never changes the mathematics (:mod:`gwdet.layers.group_whitening_function`,
:mod:`gwdet.layers.whitening_matrix`), only how it is run: samples per pass, whether the scaling of
huge inputs may be skipped after a look at the data on the host, the layout of the affine
parameters, the split of the ``g x g`` products, and what computes the ItN whitening matrix
(:class:`ExecutionPlan`'s methods). The defaults here never synchronise with the device and never
branch in Python on tensor values, so that a CUDA graph can capture them
(``torch.compile(mode="reduce-overhead")``).
"""
from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from ..common import largest_magnitude, magnitude_scales
from ..whitening_matrix import itn_whitening, itn_whitening_vjp


class ExecutionPlan:
    """The plan interface, with the host-sync-free defaults (module docstring)."""

    name = ""
    # True when :meth:`forward_scales` may return None (samples processed unscaled): the memory
    # model then leaves the scaled copy of the input out of the backward pass's temporaries.
    skips_unneeded_scaling = False
    # True when scaled samples are centred from the input in one pass, their means from float64
    # sums where the device has them (no scaled copy; the means round otherwise than the unscaled
    # path's float32 means): see group_whitening_function._scaled_centring.
    centres_scaled_input_in_one_pass = True

    def chunk_size(
        self, samples: int, values_per_sample: int, matrix_values: int, itemsize: int, relative_budget: float
    ) -> int:
        """Samples per pass, at least 1 and at most ``samples``: a sample needs
        ``values_per_sample`` temporary values, ``matrix_values`` of them in small matrices,
        ``itemsize`` bytes each; ``relative_budget`` is the values the formulas may hold at once
        by the layer's memory target (a fraction of the activation)."""
        raise NotImplementedError

    def product_chunks(self, samples: int, rows: int, columns: int, device: torch.device) -> int:
        """Slices of the inner dimension for the products ``A_b B_b^T`` of ``samples`` matrices of
        ``rows x columns`` on ``device``: 1, one batched product (see
        :meth:`~.accelerator.AcceleratorPlan.product_chunks` for the split)."""
        return 1

    def forward_scales(self, rows: Tensor, dtype: torch.dtype) -> Optional[Tensor]:
        """Factors ``1/s`` ``(N, 1, 1)`` in ``dtype`` for the samples ``rows`` ``(N, g, m)``, or
        None when the plan knows every one is 1."""
        return magnitude_scales(largest_magnitude(rows, [1, 2]).to(dtype))

    def backward_scales(self, rows: Tensor, saved: Tensor, dtype: torch.dtype) -> Optional[Tensor]:
        """The forward pass's factors for the backward pass: ``saved`` (the forward op's output)."""
        return saved

    def spread(self, parameter: Tensor, spatial: int) -> Tensor:
        """A ``[C]`` parameter shaped to broadcast over ``(n, C, HW)``: ``(C, 1)``."""
        return parameter.view(-1, 1)

    def itn_whitening(self, cov: Tensor, T: int, trace_offset: Union[float, Tensor]) -> Tensor:
        """:func:`~gwdet.layers.whitening_matrix.itn_whitening` (GW Eqs. 6-7)."""
        return itn_whitening(cov, T, trace_offset)

    def itn_whitening_vjp(
        self, cov: Tensor, grad: Tensor, T: int, trace_offset: Union[float, Tensor]
    ) -> Tuple[Tensor, Tensor]:
        """:func:`~gwdet.layers.whitening_matrix.itn_whitening_vjp` (GW Eqs. 18-19)."""
        return itn_whitening_vjp(cov, grad, T, trace_offset)


def clamp_chunk(samples: int, chunk: float) -> int:
    """``chunk`` rounded down, within ``[1, samples]``."""
    return max(1, min(samples, int(chunk)))
