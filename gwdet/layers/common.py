"""Pieces shared by the three normalization layers of :mod:`gwdet.layers`.

* argument validation that raises ``ValueError`` naming the argument and its allowed range;
* the rule that turns a requested channel-group size or count into one that divides the channels;
* the dtype in which statistics are computed, and leaving an autocast region for that computation;
* the per-channel affine transform ``y * weight + bias``.

Everything here is TorchScript-compatible so that the layers can be scripted.
"""
import contextlib
import math
from typing import ContextManager, List, Optional

import torch
from torch import Tensor


def check_int_at_least(owner: str, name: str, value: int, minimum: int) -> None:
    """Raise ``ValueError`` unless ``value`` is an integer (not a bool) ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{owner}: {name} must be an integer >= {minimum}, got {value}")


def check_positive(owner: str, name: str, value: float) -> None:
    """Raise ``ValueError`` unless ``value`` is a finite real number ``> 0``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not value > 0.0
        or math.isinf(value)
    ):
        raise ValueError(f"{owner}: {name} must be a finite number > 0, got {value}")


def check_unit_interval(owner: str, name: str, value: float) -> None:
    """Raise ``ValueError`` unless ``value`` is a real number in ``[0, 1]``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not 0.0 <= value <= 1.0
    ):
        raise ValueError(f"{owner}: {name} must be a number in [0, 1], got {value}")


def check_choice(owner: str, name: str, value: str, choices: List[str]) -> None:
    """Raise ``ValueError`` unless ``value`` is one of ``choices``."""
    if not isinstance(value, str) or value not in choices:
        allowed = ", ".join(["'" + choice + "'" for choice in choices])
        raise ValueError(f"{owner}: {name} must be one of {allowed}, got {value}")


def check_input(owner: str, x: Tensor, num_channels: int) -> None:
    """Raise ``ValueError`` unless ``x`` is floating point with shape ``(N, num_channels, *spatial)``
    (an integer input would be whitened and returned rounded to integers)."""
    if x.dim() < 2 or x.shape[1] != num_channels:
        raise ValueError(
            f"{owner}: expected input of shape (N, {num_channels}) or "
            f"(N, {num_channels}, *spatial), got {list(x.shape)}"
        )
    if not x.is_floating_point():
        raise ValueError(f"{owner}: expected a floating-point input, got {x.dtype}; convert it with .float()")


def check_values_per_group(owner: str, values: int, what: str) -> None:
    """Raise ``ValueError`` when each normalized group holds one value: normalizing it gives 0 for
    any input, so the layer would output its bias whatever it is given (batch norm refuses too)."""
    if values == 1:
        raise ValueError(
            f"{owner}: each {what} holds a single value, which normalizes to 0 for any input; use "
            "fewer groups, a larger input or (for batch statistics) more than one example"
        )


def largest_divisor_at_most(total: int, limit: int) -> int:
    """The largest divisor of ``total`` that is ``<= limit`` (``total``, ``limit`` >= 1).

    This is the rule all three layers use to split ``total`` channels into equal parts when the
    requested group count (or group size) ``limit`` does not divide them; a ``limit`` above
    ``total`` gives ``total`` (for group counts: one channel per group, GW paper Sec. 5.1.1).
    """
    candidate = min(total, limit)
    while total % candidate != 0:
        candidate -= 1
    return candidate


def statistics_dtype(dtype: torch.dtype) -> torch.dtype:
    """Dtype for covariances, moments and whitening matrices: float64 stays, all else float32."""
    if dtype == torch.float64:
        return torch.float64
    return torch.float32


def autocast_disabled(x: Tensor) -> ContextManager:
    """A context that switches autocast off on ``x``'s device (eager mode only); a context that
    does nothing when autocast is off there already.

    Entering no autocast region when none is needed keeps graphs captured by ``torch.export`` free
    of autocast regions (an in-place update of a running statistic inside one is not exported).
    TorchScript resolves autocast regions when it compiles, so inside a scripted graph this
    context cannot switch off an autocast region entered in eager code; callers skip it under
    ``torch.jit.is_scripting()``.
    """
    if torch.is_autocast_enabled(x.device.type):
        return torch.autocast(device_type=x.device.type, enabled=False)
    return contextlib.nullcontext()


def register_affine(module: torch.nn.Module, num_channels: int, affine: bool) -> None:
    """Give ``module`` learnable ``weight`` (ones) and ``bias`` (zeros) of shape ``[C]``, or
    register both as ``None`` when ``affine`` is false (names match detectron2's norm keys)."""
    if affine:
        module.weight = torch.nn.Parameter(torch.ones(num_channels))
        module.bias = torch.nn.Parameter(torch.zeros(num_channels))
    else:
        module.register_parameter("weight", None)
        module.register_parameter("bias", None)


def per_channel_affine(y: Tensor, weight: Optional[Tensor], bias: Optional[Tensor]) -> Tensor:
    """``y * weight + bias`` with ``weight``, ``bias`` of shape [C] broadcast over dim 1 of ``y``.

    The parameters are cast to ``y``'s dtype so a half-precision output stays half precision.
    """
    shape = [1, y.shape[1]] + [1] * (y.dim() - 2)
    if weight is not None:
        y = y * weight.to(y.dtype).reshape(shape)
    if bias is not None:
        y = y + bias.to(y.dtype).reshape(shape)
    return y
