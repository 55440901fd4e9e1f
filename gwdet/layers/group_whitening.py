"""Group whitening (GW; Huang et al., "Group Whitening", CVPR 2021, Sec. 3 and Algorithm 1).

For every sample, the ``C * H * W`` values are split into ``g`` contiguous channel groups,
``X_G in R^{g x c}`` with ``c = C/g * H * W`` (Eq. 8); each group is centred and the groups are
whitened against each other, ``X_hat_G = Sigma^{-1/2} (X_G - mu 1^T)`` with the ``g x g`` covariance
``Sigma = (1/c) X_C X_C^T + eps I`` (Eq. 9, Algorithm 1 lines 5-9); the split is undone (Eq. 10) and
a per-channel affine applied. Training and evaluation compute the same function (no running
statistics); with ``g = 1`` GW is a layer norm over ``(C, H, W)``. ``g`` is the largest divisor of
``C`` that is ``<= num_groups`` (``C < num_groups`` gives one channel per group, paper Sec. 5.1.1).

Statistics run in float32 (float64 for float64 input) outside autocast (inside a recorded graph,
which cannot leave its caller's autocast region, by :func:`~.precision.float32_matmul`); the result
has the input dtype. A sample whose largest magnitude exceeds ``2**32`` (``2**256`` in float64) is
whitened as ``x / s`` with the ridge ``eps / s^2`` (:func:`~.common.magnitude_scales`). Two
implementations of the same function, chosen per call by :mod:`gwdet.layers.tracing`:
:func:`group_whitening_reference` (tensor operations that autograd differentiates; what TorchScript,
``torch.jit.trace`` and ``torch.onnx.export`` record) and the custom op ``gwdet::group_whitening``
(:func:`~.group_whitening_function.fused_group_whitening`, closed-form backward).
"""
from typing import Dict, List, Optional, Union

import torch
from torch import Tensor

from .common import (
    allocating_channels, autocast_disabled, check_hyper_parameters, check_input, check_per_channel, check_same_device,
    check_scripted_settings, check_values_per_group, divisor_at_most, factory_kwargs, largest_divisor_at_most,
    largest_magnitude, magnitude_scales, per_channel_affine, product, register_affine,
    reset_affine, reshape_with_samples, scaled_ridge, statistics_dtype,
)
from .group_whitening_function import fused_group_whitening
from .precision import float32_matmul
from .settings_state import SettingsInState
from .tracing import recording_reference_graph
from .whitening_matrix import check_whitening_method, check_zca_eps, ridge_covariance, whitening_matrix

from gwdet.errors import GwdetValueError


def group_whitening(
    x: Tensor, num_groups: int, T: int = 5, eps: float = 1e-5, method: str = "itn"
) -> Tensor:
    """Group-whiten ``x`` of shape ``(N, C)`` or ``(N, C, *spatial)`` (no affine; Eqs. 8-10).

    Args:
        x: input; ``(N, C)`` is treated as ``(N, C, 1, 1)``, ``N = 0`` gives an empty output, a
            zero spatial size is refused (``ValueError``, as torch's ``GroupNorm`` refuses it).
        num_groups: requested group count; the count used is the largest divisor of ``C``
            that is ``<= num_groups`` (see the module docstring).
        T: Newton iterations for ``method="itn"`` (Eqs. 6-7); ignored by ``"zca"``.
        eps: ridge added to the group covariance before whitening, ``> 0``.
        method: ``"itn"`` (Newton iteration) or ``"zca"`` (eigendecomposition, Eq. 5).

    Returns:
        A tensor of ``x``'s shape and dtype.
    """
    if torch.jit.is_scripting():
        _check_scripted_arguments("group_whitening", x, num_groups, T, eps, method)
        return _reference(x, divisor_at_most(x.shape[1], num_groups), T, eps, method, None, None)
    _check_arguments("group_whitening", x, num_groups, T, eps, method)
    return _run(x, None, None, largest_divisor_at_most(x.shape[1], num_groups), T, eps, method)


def _check_scripted_arguments(owner: str, x: Tensor, num_groups: int, T: int, eps: float, method: str) -> None:
    """What :func:`_check_arguments` checks of the functional forms' arguments, as TorchScript runs
    it (its typed arguments cannot be of another type)."""
    check_input(owner, x, 0)
    check_scripted_settings(owner, x.shape[1], torch.jit.annotate(Dict[str, List[int]], {}),
                            {"num_groups": num_groups, "T": T}, {"eps": eps}, torch.jit.annotate(Dict[str, float], {}),
                            method, "give a valid value")


@torch.jit.unused
def _check_arguments(owner: str, x: Tensor, num_groups: int, T: int, eps: float, method: str,
                     weight: Optional[Tensor] = None, bias: Optional[Tensor] = None) -> None:
    check_hyper_parameters(owner, {"num_groups": num_groups}, iterations={"T": T}, positive={"eps": eps})
    check_whitening_method(owner, method)
    check_zca_eps(owner, method, eps)
    check_input(owner, x, 0)
    check_spatial_size(owner, x)
    check_per_channel(owner, {"weight": weight, "bias": bias}, x.shape[1])
    check_same_device(owner, x, {"weight": weight, "bias": bias})
    check_sample_group_values(owner, x, num_groups)


def check_sample_group_values(owner: str, x: Tensor, num_groups: int) -> None:
    """Raise ``ValueError`` when each group of a sample of ``x`` holds a single value (one channel
    per group of ``largest_divisor_at_most(C, num_groups)`` and one position), which normalizes to 0
    for any input: what :meth:`GroupWhitening.validate_input` refuses, for the functional forms."""
    groups = largest_divisor_at_most(x.shape[1], num_groups)
    positions = product(list(x.shape[2:]))
    per_group = x.shape[1] // groups
    check_values_per_group(
        owner, per_group * positions, "group of a sample",
        f"fewer groups (num_groups={num_groups} gives {groups} groups of {per_group} channel for the {x.shape[1]} "
        f"channels here) or a larger input (this one has {positions} position per channel)")


def check_spatial_size(owner: str, x: Tensor) -> None:
    """Raise ``ValueError`` for an input with a zero spatial size (a sample has no values), as torch's
    ``GroupNorm`` does; ``N = 0`` is fine. Not checked while ``torch.jit.trace`` records."""
    if not torch.jit.is_tracing() and 0 in x.shape[2:]:
        raise GwdetValueError(
            f"{owner}: input of shape {list(x.shape)} has a zero spatial size, so a sample has no values to "
            "whiten (torch's GroupNorm refuses it too); give feature maps of at least one position (an input "
            "image smaller than the network's stride leaves none)"
        )


def group_whitening_reference(
    x: Tensor,
    num_groups: int,
    T: int = 5,
    eps: float = 1e-5,
    method: str = "itn",
    weight: Optional[Tensor] = None,
    bias: Optional[Tensor] = None,
) -> Tensor:
    """The reference implementation of GW: Algorithm 1 (Eqs. 8-10) plus the per-channel affine,
    as plain tensor operations that autograd differentiates.

    Arguments as for :func:`group_whitening`, with ``weight`` and ``bias`` ``[C]`` (or ``None``). This
    is what TorchScript, ``torch.jit.trace`` and ``torch.onnx.export`` record; it keeps every
    intermediate for the backward pass, so train with :class:`GroupWhitening` or :func:`group_whitening`.
    """
    if torch.jit.is_scripting():
        _check_scripted_arguments("group_whitening_reference", x, num_groups, T, eps, method)
        return _reference(x, divisor_at_most(x.shape[1], num_groups), T, eps, method, weight, bias)
    _check_arguments("group_whitening_reference", x, num_groups, T, eps, method, weight, bias)
    return _reference_outside_autocast(x, largest_divisor_at_most(x.shape[1], num_groups), T, eps, method, weight, bias)


def _reference(
    x: Tensor, groups: int, T: int, eps: float, method: str, weight: Optional[Tensor], bias: Optional[Tensor]
) -> Tensor:
    """:func:`group_whitening_reference` with ``groups`` dividing ``C``."""
    # every size but the sample count explicit (reshape_with_samples): a recorded graph meets 0
    # samples (a mask head without ROIs), and then no other size could be inferred from the elements
    shape = list(x.shape)
    grouped = reshape_with_samples(x.to(statistics_dtype(x.dtype)), [shape[0], groups, product(shape[1:]) // groups])
    # the statistics of x / s with the ridge eps / s^2 (s = 1 unless a sample is huge): W X_C is
    # the same, so the output needs no rescaling
    scales = magnitude_scales(largest_magnitude(grouped, [1, 2]))
    grouped = grouped * scales
    centred = grouped - grouped.mean(dim=-1, keepdim=True)
    ridge = scaled_ridge(eps, scales)
    cov = ridge_covariance(centred, ridge)
    whitened = reshape_with_samples(float32_matmul(whitening_matrix(cov, method, T, ridge), centred), shape)
    return per_channel_affine(whitened, weight, bias).to(x.dtype)


@torch.jit.unused
def _reference_outside_autocast(
    x: Tensor, groups: int, T: int, eps: float, method: str, weight: Optional[Tensor], bias: Optional[Tensor]
) -> Tensor:
    with autocast_disabled(x):
        return _reference(x, groups, T, eps, method, weight, bias)


@torch.jit.unused
def _run(
    x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], groups: int, T: int, eps: float, method: str
) -> Tensor:
    """Outside TorchScript: the reference formulas while a deployment graph is being recorded,
    else the custom op (see :mod:`gwdet.layers.tracing`)."""
    if recording_reference_graph():
        return _reference_outside_autocast(x, groups, T, eps, method, weight, bias)
    return fused_group_whitening(x, weight, bias, groups, T, eps, method)


class GroupWhitening(SettingsInState):
    """Group whitening with a per-channel affine (Huang et al. 2021, Eqs. 8-10, Algorithm 1).

    Args:
        num_channels: ``C``, the size of dim 1 of the input.
        num_groups: requested number of channel groups ``g``; :attr:`effective_num_groups` is
            the count actually used (largest divisor of ``C`` that is ``<= num_groups``).
        T: Newton iterations for ``method="itn"``; ignored by ``"zca"``.
        eps: ridge added to the ``g x g`` group covariance, ``> 0``.
        method: ``"itn"`` (Newton iteration, Eqs. 6-7; the paper's choice, T=5) or ``"zca"``
            (eigendecomposition, Eq. 5).
        affine: learn ``weight`` and ``bias`` of shape ``[C]`` (initialised to 1 and 0).
        device, dtype: where and in which floating-point dtype ``weight`` and ``bias`` are created,
            as torch's norm layers take them (``None``: torch's defaults); ``device="meta"`` builds
            them without memory (``torch.nn.utils.skip_init`` uses it).

    Per sample the output has zero group means and ``(1/c) X_hat_G X_hat_G^T = I - eps Sigma^{-1}``
    for ZCA; ItN approaches this as ``T`` grows (see :func:`inverse_sqrt_itn`).

    Arguments are checked on construction (``ValueError``); the state dict records the settings, so a
    state of other settings is refused on loading (:mod:`~.settings_state`).
    """

    HYPER_PARAMETERS = ("num_groups", "T", "eps", "method")
    DERIVED = ("effective_num_groups",)
    weight: Optional[Tensor]
    bias: Optional[Tensor]

    def __init__(
        self,
        num_channels: int,
        num_groups: int = 64,
        T: int = 5,
        eps: float = 1e-5,
        method: str = "itn",
        affine: bool = True,
        device: Optional[Union[torch.device, str, int]] = None,
        dtype: Optional[torch.dtype] = None,
    ) -> None:
        super().__init__()
        owner = type(self).__name__
        check_hyper_parameters(owner, {"num_channels": num_channels, "num_groups": num_groups}, iterations={"T": T},
                               positive={"eps": eps}, flags={"affine": affine})
        factory = factory_kwargs(owner, device, dtype)
        check_whitening_method(owner, method)
        check_zca_eps(owner, method, eps)
        self.num_channels = int(num_channels)
        self.num_groups = int(num_groups)
        self.effective_num_groups = largest_divisor_at_most(self.num_channels, self.num_groups)
        self.T = int(T)
        self.eps = float(eps)
        self.method = method
        self.affine = bool(affine)
        with allocating_channels(owner, self.num_channels):
            register_affine(self, self.num_channels, affine, factory)

    def reset_parameters(self) -> None:
        """The affine weight and bias back to their initial ones and zeros (as torch's norm layers
        do: ``module.to_empty(device=...)`` after a build on the meta device needs it)."""
        reset_affine(self)

    def forward(self, x: Tensor) -> Tensor:
        if torch.jit.is_scripting():
            check_scripted_settings("GroupWhitening", self.num_channels,
                                    {"num_groups": [self.num_groups, self.effective_num_groups]},
                                    {"T": self.T}, {"eps": self.eps}, torch.jit.annotate(Dict[str, float], {}),
                                    self.method)
        self.validate_input(x)
        groups = self.effective_num_groups
        if torch.jit.is_scripting():
            return _reference(x, groups, self.T, self.eps, self.method, self.weight, self.bias)
        return _run(x, self.weight, self.bias, groups, self.T, self.eps, self.method)

    def validate_input(self, x: Tensor) -> None:
        """Raise ``ValueError`` for an input :meth:`forward` refuses (wrong shape or dtype, a
        single value per group of a sample)."""
        check_input("GroupWhitening", x, self.num_channels)
        if not torch.jit.is_scripting():  # a weight.data of another size, or one given to torch.func.functional_call
            check_per_channel("GroupWhitening", {"weight": self.weight, "bias": self.bias}, self.num_channels)
        check_spatial_size("GroupWhitening", x)
        positions = 1
        for size in x.shape[2:]:
            positions *= size
        per_group = self.num_channels // self.effective_num_groups
        check_values_per_group(
            "GroupWhitening", per_group * positions, "group of a sample",
            f"fewer groups (num_groups: MODEL.GW.NUM_GROUPS in a config; {per_group} channel per group here) or a "
            f"larger input (this one has {positions} position per channel): a backbone or FPN level of stride s has "
            "one position per s pixels of the padded image, so larger images (INPUT.MIN_SIZE_TRAIN / MIN_SIZE_TEST); "
            "an ROI head's input is its POOLER_RESOLUTION square (e.g. MODEL.ROI_MASK_HEAD.POOLER_RESOLUTION)")
