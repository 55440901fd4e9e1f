"""Batch whitening: decorrelated batch normalization (DBN; Huang et al., CVPR 2018).

Channels are split into contiguous groups of ``k`` channels (DBN Sec. 3.4) and each group is
whitened over the batch and spatial positions, every position of every example being one
observation (Sec. 3.3): for a group ``X in R^{k x m}`` with ``m = N * H * W``,
``X_hat = Sigma^{-1/2} (X - mu 1^T)`` with ``Sigma = (1/m) X_C X_C^T + eps I`` (Eq. 3). Training
uses the batch statistics and updates the running mean and running whitening matrix
(Algorithm 1 lines 10-11); evaluation uses the running ones. ``k`` is the largest divisor of ``C``
that is ``<= group_size`` (``group_size >= C`` whitens all channels together).

With ``k = 1`` training is batch norm. Evaluation is not quite: as DBN's Algorithm 1 does, the running
whitening matrix averages the batches' whitening matrices ``Sigma^{-1/2}``, of the biased (``1/m``)
covariance plus ``eps``, where torch's batch norm (and :class:`~.batch_group_norm.BatchGroupNorm`)
averages the unbiased (``1/(m - 1)``) variances and divides by ``sqrt(running_var + eps)``. With
momentum 1, BW's evaluation output is that of a batch norm of ``eps m / (m - 1)`` times
``sqrt(m / (m - 1))`` (1.069 for ``m = 8``, about ``1 + 1/(2m)`` for a large ``m``); with a smaller
momentum the two also differ by averaging inverse square roots rather than variances.

An empty input returns an empty output and leaves the running statistics untouched. Precision as in
:mod:`gwdet.layers.group_whitening`. In training, a channel group whose largest magnitude exceeds
``2**32`` (``2**256`` in float64) is whitened as ``X / s`` with the ridge ``eps / s^2``
(:func:`~.common.magnitude_scales`), and the running statistics get ``s mu'`` and ``W' / s``, the
mean and whitening matrix of ``X`` itself. Outside the ``cpu`` plan (:mod:`gwdet.layers.plans`) the
ItN whitening matrix is the closed-form op :func:`~.itn_whitening_op.itn_whitening_op`.
:mod:`gwdet.export.counting_ops` registers :func:`batch_whitening` as the custom op
``gwdet::batch_whitening`` for flop counting.
"""
import contextlib
import warnings
from typing import Optional, Union

import torch
from torch import Tensor

from gwdet.errors import GwdetRuntimeWarning, GwdetValueError

from .common import (
    allocating_channels, autocast_disabled, check_evaluation_statistics, check_floating_running, check_hyper_parameters, check_input,
    check_layer_evaluation_statistics, check_per_channel, check_running_updatable, check_same_device,
    check_scripted_settings, check_values_per_group, factory_kwargs, largest_divisor_at_most, largest_magnitude,
    magnitude_scales, per_channel_affine, refuse_differentiating_transforms, register_affine,
    reset_affine, reshape_with_samples, scaled_ridge, statistics_dtype,
)
from .itn_whitening_op import CPU_PLAN_ADVICE, itn_whitening_op
from .plans import plan_name
from .precision import float32_matmul, ieee_float32_products
from .settings_state import SettingsInState
from .tracing import recording_reference_graph
from .whitening_matrix import check_whitening_method, check_zca_eps, ridge_covariance, whitening_matrix


def batch_whitening(
    x: Tensor,
    running_mean: Tensor,
    running_whitening: Tensor,
    weight: Optional[Tensor],
    bias: Optional[Tensor],
    training: bool,
    momentum: float,
    T: int,
    eps: float,
    method: str,
) -> Tensor:
    """Batch whitening of ``x`` ``(N, C, *spatial)`` (DBN Algorithm 1) plus the per-channel affine.

    The channel groups are those of ``running_whitening`` (``[C / k, k, k]``). In training the
    batch statistics whiten ``x`` and ``running_mean`` ``[C]`` and ``running_whitening`` are
    updated in place (``running <- (1 - momentum) running + momentum batch``); in evaluation the
    running ones whiten ``x``. ``T``, ``eps`` and ``method`` as for :class:`BatchWhitening`; every
    argument is checked as the layer checks it (``ValueError``).
    """
    if not torch.jit.is_scripting():
        _check_arguments(x, running_mean, running_whitening, weight, bias, training, momentum, T, eps, method)
    return _batch_whitening(x, running_mean, running_whitening, weight, bias, training, momentum, T, eps, method)


@torch.jit.unused
def _check_arguments(x: Tensor, running_mean: Tensor, running_whitening: Tensor, weight: Optional[Tensor],
                     bias: Optional[Tensor], training: bool, momentum: float, T: int, eps: float, method: str) -> None:
    """:func:`batch_whitening`'s arguments checked as :class:`BatchWhitening` checks its own."""
    owner = "batch_whitening"
    check_hyper_parameters(owner, {}, iterations={"T": T}, positive={"eps": eps}, unit_interval={"momentum": momentum},
                           flags={"training": training})
    check_whitening_method(owner, method)
    check_zca_eps(owner, method, eps)
    check_input(owner, x, 0)
    channels = x.shape[1]
    if running_mean is None:
        both = running_whitening is None
        also = (f", and running_whitening one k x k matrix per group of k channels, shape [{channels} / k, k, k]"
                if both else "")
        raise GwdetValueError(
            f"{owner}: running_mean must be a tensor of one value per channel, shape [{channels}]{also} (training "
            f"updates the running statistics, evaluation whitens with them), got None{' for both' if both else ''}; "
            "pass the layer's buffers (running_mean, running_whitening of a BatchWhitening)"
            + ("" if both else f", or create running_mean as torch.zeros({channels})"))
    check_per_channel(owner, {"running_mean": running_mean, "weight": weight, "bias": bias}, channels)
    if (not isinstance(running_whitening, Tensor) or running_whitening.dim() != 3
            or running_whitening.shape[1] != running_whitening.shape[2]
            or running_whitening.shape[0] * running_whitening.shape[1] != channels):
        shape = list(running_whitening.shape) if isinstance(running_whitening, Tensor) else running_whitening
        raise GwdetValueError(f"{owner}: running_whitening must hold one k x k matrix per group of k channels, "
                              f"shape [{channels} / k, k, k], got {shape}")
    check_same_device(owner, x, {"running_mean": running_mean, "running_whitening": running_whitening,
                                 "weight": weight, "bias": bias})
    groups, k = running_whitening.shape[0], running_whitening.shape[1]
    check_floating_running(owner, {"running_mean": (running_mean, f"torch.zeros({channels})"),
                                   "running_whitening": (running_whitening, f"torch.eye({k}).repeat({groups}, 1, 1)")})
    if training:
        check_running_updatable(owner, {"running_mean": running_mean, "running_whitening": running_whitening})
        samples = x.numel() // channels
        check_values_per_group(owner, samples, "channel of the batch")
        if 0 < samples <= running_whitening.shape[1]:  # as the layer warns
            _warn_singular_covariance(samples, running_whitening.shape[1], eps, owner)
    elif not torch.jit.is_tracing():  # a traced graph would keep the check's outcome as a constant
        check_evaluation_statistics(owner, {"running_mean": running_mean, "running_whitening": running_whitening})


def _batch_whitening(x: Tensor, running_mean: Tensor, running_whitening: Tensor, weight: Optional[Tensor],
                     bias: Optional[Tensor], training: bool, momentum: float, T: int, eps: float, method: str) -> Tensor:
    """:func:`batch_whitening` of checked arguments (what :class:`BatchWhitening` runs)."""
    if x.numel() == 0:
        whitened = x
    elif torch.jit.is_scripting():
        whitened = _whiten(x, running_mean, running_whitening, training, momentum, T, eps, method)
    else:
        whitened = _whiten_outside_autocast(x, running_mean, running_whitening, training, momentum, T, eps, method)
    # the affine in the statistics dtype, then one rounding to the input's (as the fused GW op)
    return per_channel_affine(whitened, weight, bias).to(x.dtype)


def _whiten(
    x: Tensor, running_mean: Tensor, running_whitening: Tensor, training: bool, momentum: float, T: int, eps: float, method: str
) -> Tensor:
    """DBN Algorithm 1 on all channel groups at once, batched over the groups; the result is in the
    statistics dtype."""
    num_groups = running_whitening.shape[0]
    group_size = running_whitening.shape[1]
    dtype = statistics_dtype(x.dtype)
    channels_first = x.to(dtype).transpose(0, 1)
    # (C, N, *spatial) -> (C/k, k, N HW): "-1" is the observation count, which may be 0 in a recorded
    # graph (no ROI), and the sizes beside it never are
    rows = channels_first.reshape(num_groups, group_size, -1)
    if training:
        # the statistics of X / s with the ridge eps / s^2 (s = 1 unless a group is huge)
        scales = magnitude_scales(largest_magnitude(rows, [1, 2]))
        rows = rows * scales
        mean = rows.mean(dim=-1, keepdim=True)
        centred = rows - mean
        ridge = scaled_ridge(eps, scales)
        cov = ridge_covariance(centred, ridge)
        if torch.jit.is_scripting():
            whitening = whitening_matrix(cov, method, T, ridge)
        else:
            whitening = _planned_whitening_matrix(cov, method, T, ridge)
        # DBN Algorithm 1 lines 10-11 with the mean s mu' and whitening matrix W' / s of X (detached:
        # torch.export cannot serialize a no_grad region)
        batch_mean = mean.detach() / scales
        running_mean.lerp_(batch_mean.reshape(running_mean.shape).to(running_mean.dtype), momentum)
        running_whitening.lerp_((whitening.detach() * scales).to(running_whitening.dtype), momentum)
    else:
        centred = rows - running_mean.to(dtype).reshape(num_groups, group_size, 1)
        whitening = running_whitening.to(dtype)
    whitened = reshape_with_samples(float32_matmul(whitening, centred), list(channels_first.shape), sample_dim=1)
    return whitened.transpose(0, 1)


@torch.jit.unused
def _planned_whitening_matrix(cov: Tensor, method: str, T: int, ridge: Tensor) -> Tensor:
    """The whitening matrix by the execution plan of ``cov``'s device: outside the ``cpu`` plan, ItN
    is the closed-form op ``gwdet::itn_whitening``; the ``cpu`` plan, ZCA and graphs being recorded
    take :func:`~.whitening_matrix.whitening_matrix`, differentiated by autograd."""
    if method == "itn" and not recording_reference_graph() and plan_name(cov.device) != "cpu":
        refuse_differentiating_transforms("BatchWhitening (ItN)", CPU_PLAN_ADVICE, cov)
        return itn_whitening_op(cov, T)
    return whitening_matrix(cov, method, T, ridge)


@torch.jit.unused
def _whiten_outside_autocast(
    x: Tensor, running_mean: Tensor, running_whitening: Tensor, training: bool, momentum: float, T: int, eps: float, method: str
) -> Tensor:
    # torch.compile cannot trace the backend settings: a compiled graph keeps the user's
    products = contextlib.nullcontext() if torch.compiler.is_compiling() else ieee_float32_products(x.device)
    with autocast_disabled(x), products:
        return _whiten(x, running_mean, running_whitening, training, momentum, T, eps, method)


class BatchWhitening(SettingsInState):
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
        device, dtype: where and in which floating-point dtype the parameters and buffers are
            created, as torch's batch norm takes them (``None``: torch's defaults);
            ``device="meta"`` builds them without memory (``torch.nn.utils.skip_init`` uses it).

    Buffers: ``running_mean`` ``[C]`` (starts at 0) and ``running_whitening``
    ``[C / k, k, k]`` (starts at the identity).

    Arguments are checked as :class:`~.group_whitening.GroupWhitening`'s, and the state dict records
    the settings (:mod:`~.settings_state`). In evaluation, running statistics no training computes (a
    NaN, a whitening matrix whose diagonal is not positive or that is not symmetric) and ones that
    overflowed to inf are refused,
    checked once after each change (:func:`~.common.check_layer_evaluation_statistics`).
    """

    HYPER_PARAMETERS = ("group_size", "T", "eps", "momentum", "method")
    DERIVED = ("effective_group_size", "num_groups")
    weight: Optional[Tensor]
    bias: Optional[Tensor]
    running_mean: Tensor
    running_whitening: Tensor

    def __init__(
        self,
        num_channels: int,
        group_size: int = 16,
        T: int = 5,
        eps: float = 1e-5,
        momentum: float = 0.1,
        method: str = "zca",
        affine: bool = True,
        device: Optional[Union[torch.device, str, int]] = None,
        dtype: Optional[torch.dtype] = None,
    ) -> None:
        super().__init__()
        owner = type(self).__name__
        check_hyper_parameters(owner, {"num_channels": num_channels, "group_size": group_size}, iterations={"T": T},
                               positive={"eps": eps}, unit_interval={"momentum": momentum},
                               flags={"affine": affine})
        factory = factory_kwargs(owner, device, dtype)
        check_whitening_method(owner, method)
        check_zca_eps(owner, method, eps)
        self.num_channels = int(num_channels)
        self.group_size = int(group_size)
        self.effective_group_size = largest_divisor_at_most(self.num_channels, self.group_size)
        self.num_groups = self.num_channels // self.effective_group_size
        self.T = int(T)
        self.eps = float(eps)
        self.momentum = float(momentum)
        self.method = method
        self.affine = bool(affine)
        with allocating_channels(owner, self.num_channels):
            register_affine(self, self.num_channels, affine, factory)
            self.register_buffer("running_mean", torch.zeros(self.num_channels, **factory))
            identity = torch.eye(self.effective_group_size, **factory)
            self.register_buffer("running_whitening", identity.repeat(self.num_groups, 1, 1))

    def reset_running_stats(self) -> None:
        """The running mean back to zeros and the running whitening matrices to identities; raises
        ``ValueError`` when ``running_whitening`` no longer has the layer's shape
        (:meth:`_check_running_whitening`)."""
        self._check_running_whitening()
        with torch.no_grad():
            self.running_mean.zero_()
            self.running_whitening.copy_(torch.eye(self.effective_group_size).expand_as(self.running_whitening))

    def reset_parameters(self) -> None:
        """Every parameter and buffer back to its initial value (as torch's batch norm does:
        ``module.to_empty(device=...)`` after a build on the meta device needs it)."""
        self.reset_running_stats()
        reset_affine(self)

    def forward(self, x: Tensor) -> Tensor:
        if torch.jit.is_scripting():
            check_scripted_settings("BatchWhitening", self.num_channels,
                                    {"group_size": [self.group_size, self.effective_group_size]},
                                    {"T": self.T}, {"eps": self.eps}, {"momentum": self.momentum}, self.method)
        self.validate_input(x)
        return _batch_whitening(
            x, self.running_mean, self.running_whitening, self.weight, self.bias,
            self.training, self.momentum, self.T, self.eps, self.method,
        )

    @torch.jit.unused
    def _check_running_whitening(self) -> None:
        """Raise ``ValueError`` unless ``running_whitening`` has the shape the layer was built with,
        ``[num_groups, k, k]`` (``k``: :attr:`effective_group_size`): a tensor of another shape put
        in after the build (``running_whitening.data = ...``, or one given to
        ``torch.func.functional_call``) would whiten other channel groups than the layer's settings say."""
        expected = [self.num_groups, self.effective_group_size, self.effective_group_size]
        running_whitening = self.running_whitening
        if not isinstance(running_whitening, Tensor) or list(running_whitening.shape) != expected:
            got = (list(running_whitening.shape) if isinstance(running_whitening, Tensor)
                   else type(running_whitening).__name__)
            k = self.effective_group_size
            raise GwdetValueError(
                f"BatchWhitening: running_whitening must hold one {k} x {k} matrix per group of {k} channels, as the "
                f"layer was built (num_channels={self.num_channels}, group_size={self.group_size}), shape {expected}, "
                f"got {got}; assign a tensor of that shape (torch.eye({k}).repeat({self.num_groups}, 1, 1) is the "
                "initial one), or build a BatchWhitening with the group_size you want")

    def validate_input(self, x: Tensor) -> None:
        """Raise ``ValueError`` for an input :meth:`forward` refuses (wrong shape or dtype; in
        training, a single value per channel), and in evaluation for running statistics no training
        computes; warn when ``torch.jit.trace`` records the layer in training mode (the trace keeps the
        batch statistics and the running updates whatever mode it is later put in)."""
        check_input("BatchWhitening", x, self.num_channels)
        if not torch.jit.is_scripting():  # a weight.data of another size, or one given to torch.func.functional_call
            check_per_channel("BatchWhitening", {"weight": self.weight, "bias": self.bias,
                                                 "running_mean": self.running_mean}, self.num_channels)
            self._check_running_whitening()
            if not self.training:
                check_layer_evaluation_statistics(self, {"running_mean": self.running_mean,
                                                         "running_whitening": self.running_whitening})
        if not torch.jit.is_scripting() and self.training and torch.jit.is_tracing():
            warnings.warn(
                "BatchWhitening: traced in training mode, the trace whitens every batch with that batch's own "
                "statistics, whatever .eval() says later, and each run of it moves the layer's running mean and "
                "running whitening matrix. Trace in evaluation mode (model.eval()), which whitens with the running "
                "statistics.", GwdetRuntimeWarning, stacklevel=2)
        if self.training:
            samples = x.numel() // self.num_channels
            check_values_per_group("BatchWhitening", samples, "channel of the batch")
            if 0 < samples <= self.effective_group_size and not torch.jit.is_scripting():  # an empty batch: nothing
                _warn_singular_covariance(samples, self.effective_group_size, self.eps, "BatchWhitening")


@torch.jit.unused
def _warn_singular_covariance(samples: int, group_size: int, eps: float, owner: str) -> None:
    """Warn (once per message, Python's default) of a training batch of ``samples`` observations
    (``m = N * H * W``) per group of ``group_size`` channels, ``m <= k``: the centred covariance
    (Eq. 3) has rank at most ``m - 1 < k``, so the whitening matrix takes ``eps^{-1/2}`` (ZCA) along
    the missing directions, the running whitening matrix averages it in, and evaluation amplifies
    whatever lies there (DBN Sec. 3.4 asks for ``m > k``). Not inside ``torch.compile``, whose
    graphs hold no Python warning (``fullgraph=True`` would fail on it)."""
    if torch.compiler.is_compiling():
        return
    warnings.warn(
        f"{owner}: {samples} samples (N x H x W) per group of {group_size} channels in training: the group "
        f"covariance has rank at most {samples - 1}, so the running whitening matrix keeps up to eps^-1/2 = "
        f"{eps ** -0.5:.3g} along the {group_size - samples + 1} missing directions, and evaluation amplifies them. "
        f"Train with more than {group_size} samples per batch, or a group_size below {samples}.",
        GwdetRuntimeWarning, stacklevel=3)

