"""Batch whitening: decorrelated batch normalization (DBN; Huang et al., CVPR 2018).

Channels are split into contiguous groups of ``k`` channels (DBN Sec. 3.4) and each group is
whitened over the batch and spatial positions, every position of every example being one
observation (Sec. 3.3): for a group ``X in R^{k x m}`` with ``m = N * H * W``,
``X_hat = Sigma^{-1/2} (X - mu 1^T)`` with ``Sigma = (1/m) X_C X_C^T + eps I`` (Eq. 3). Training
uses the batch statistics and updates the running mean and running whitening matrix
(Algorithm 1 lines 10-11); evaluation uses the running ones. With ``k = 1`` this is batch norm.

Channel-group rule: the group size used is ``largest_divisor_at_most(C, group_size)``, the
largest size ``<= group_size`` that divides ``C`` (``group_size >= C`` whitens all channels
together; e.g. ``C = 24, group_size = 16`` gives 2 groups of 12 channels).

An input with no elements (``N = 0``) returns an empty output and leaves the running statistics
untouched. Precision as in :mod:`gwdet.layers.group_whitening`: float32 (float64 for float64
input) outside autocast, output in the input dtype.
"""
import torch
from torch import Tensor, nn

from ._common import (
    autocast_disabled,
    check_input,
    check_int_at_least,
    check_positive,
    check_unit_interval,
    largest_divisor_at_most,
    per_channel_affine,
    register_affine,
    statistics_dtype,
)
from .whitening_matrix import check_whitening_method, ridge_covariance, whitening_matrix


class BatchWhitening(nn.Module):
    """Group-wise ZCA/ItN whitening over ``(N, H, W)`` with running statistics (DBN).

    Args:
        num_channels: ``C``, the size of dim 1 of the input.
        group_size: requested channels per whitening group ``k``; :attr:`effective_group_size`
            is the size actually used (largest divisor of ``C`` that is ``<= group_size``).
        T: Newton iterations for ``method="itn"``; ignored by ``"zca"``.
        eps: ridge added to each ``k x k`` covariance, ``> 0``.
        momentum: ``lambda`` of the running averages (DBN Algorithm 1 lines 10-11), in [0, 1].
        method: ``"zca"`` (eigendecomposition, DBN Eq. 4) or ``"itn"`` (Newton iteration).
        affine: learn ``weight`` and ``bias`` of shape ``[C]`` (initialised to 1 and 0).

    Buffers: ``running_mean`` ``[C]`` (starts at 0) and ``running_whitening``
    ``[C / k, k, k]`` (starts at the identity).
    """

    def __init__(
        self,
        num_channels: int,
        group_size: int = 16,
        T: int = 5,
        eps: float = 1e-5,
        momentum: float = 0.1,
        method: str = "zca",
        affine: bool = True,
    ) -> None:
        super().__init__()
        owner = type(self).__name__
        check_int_at_least(owner, "num_channels", num_channels, 1)
        check_int_at_least(owner, "group_size", group_size, 1)
        check_int_at_least(owner, "T", T, 1)
        check_positive(owner, "eps", eps)
        check_unit_interval(owner, "momentum", momentum)
        check_whitening_method(owner, method)
        self.num_channels = num_channels
        self.group_size = group_size
        self.effective_group_size = largest_divisor_at_most(num_channels, group_size)
        self.num_groups = num_channels // self.effective_group_size
        self.T = T
        self.eps = float(eps)
        self.momentum = float(momentum)
        self.method = method
        self.affine = affine
        register_affine(self, num_channels, affine)
        self.register_buffer("running_mean", torch.zeros(num_channels))
        identity = torch.eye(self.effective_group_size)
        self.register_buffer("running_whitening", identity.repeat(self.num_groups, 1, 1))

    def forward(self, x: Tensor) -> Tensor:
        check_input("BatchWhitening", x, self.num_channels)
        if x.numel() == 0:
            whitened = x
        elif torch.jit.is_scripting():
            whitened = self._whiten(x)
        else:
            with autocast_disabled(x):
                whitened = self._whiten(x)
        return per_channel_affine(whitened, self.weight, self.bias)

    def _whiten(self, x: Tensor) -> Tensor:
        """DBN Algorithm 1 on all channel groups at once, batched over the groups."""
        dtype = statistics_dtype(x.dtype)
        channels_first = x.to(dtype).transpose(0, 1)
        rows = channels_first.reshape(self.num_groups, self.effective_group_size, -1)
        if self.training:
            mean = rows.mean(dim=-1, keepdim=True)
            centred = rows - mean
            cov = ridge_covariance(centred, self.eps)
            whitening = whitening_matrix(cov, self.method, self.T, self.eps)
            self._update_running_statistics(mean, whitening)
        else:
            running_mean = self.running_mean.to(dtype)
            centred = rows - running_mean.reshape(self.num_groups, self.effective_group_size, 1)
            whitening = self.running_whitening.to(dtype)
        whitened = torch.matmul(whitening, centred).reshape(channels_first.shape)
        return whitened.transpose(0, 1).to(x.dtype)

    def _update_running_statistics(self, mean: Tensor, whitening: Tensor) -> None:
        """DBN Algorithm 1 lines 10-11: ``running <- (1 - momentum) running + momentum batch``."""
        with torch.no_grad():
            batch_mean = mean.reshape(self.num_channels).to(self.running_mean.dtype)
            self.running_mean.lerp_(batch_mean, self.momentum)
            batch_whitening = whitening.detach().to(self.running_whitening.dtype)
            self.running_whitening.lerp_(batch_whitening, self.momentum)

    def extra_repr(self) -> str:
        return (
            f"{self.num_channels}, group_size={self.group_size}, "
            f"effective_group_size={self.effective_group_size}, T={self.T}, eps={self.eps}, "
            f"momentum={self.momentum}, method={self.method!r}, affine={self.affine}"
        )
