"""Pieces shared by the three normalization layers of :mod:`gwdet.layers`: argument validation (the
one home of these checks, which :mod:`gwdet.config` and :func:`gwdet.norm` use too), the channel-group
rule, the statistics dtype, the power-of-two scaling of huge inputs (:func:`magnitude_scales`), the
per-channel affine and reshapes of a batch that may be empty (:func:`reshape_with_samples`).

What the layers' forward passes call is TorchScript-compatible, so that the layers can be scripted.
"""
import contextlib
import math
import numbers
import struct
import warnings
from typing import Any, Callable, ContextManager, Dict, Iterator, List, Mapping, Optional, Tuple

import numpy as np
import torch
from torch import Tensor
from torch._C._functorch import TransformType
from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters
from torch.autograd import forward_ad
from torch.masked import MaskedTensor

from .tracing import onnx_exporting

from gwdet.errors import GwdetRuntimeError, GwdetRuntimeWarning, GwdetTypeError, GwdetValueError

# float32's smallest positive (subnormal) and largest finite value: the range of eps
FLOAT32_SMALLEST = 2.0 ** -149
FLOAT32_SMALLEST_NORMAL = 2.0 ** -126
FLOAT32_LARGEST = torch.finfo(torch.float32).max
# the most Newton iterations (T) a whitening layer takes (the default is 5)
MAX_ITERATIONS = 1000
# the largest integer torch holds (int64): its ops, TorchScript and ONNX take no larger count
INT64_MAX = 2 ** 63 - 1


def is_whole_number(value: Any) -> bool:
    """Whether ``value`` is an integer (a bool is not)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real_number(value: Any) -> bool:
    """Whether ``value`` is a real number (a bool is not)."""
    return type(value) in (int, float) or (isinstance(value, numbers.Real) and not isinstance(value, bool))


def is_finite_number(value: Any) -> bool:
    """Whether ``value`` is a finite real number (a bool is not)."""
    return is_real_number(value) and math.isfinite(value)


def _shown(value: Any, of_right_type: bool) -> str:
    """A refused value as its message shows it: its ``repr``, followed by its type where the type
    is what is wrong (``'4' (str)``, a string that reads like a number; ``True (bool)``)."""
    return repr(value) if of_right_type else f"{value!r} ({type(value).__name__})"


def check_int_at_least(owner: str, name: str, value: Any, minimum: int) -> None:
    """Raise ``ValueError`` unless ``value`` is an integer ``>= minimum``: an ``int`` or another
    integral type (numpy's), never a bool or a string; and at most :data:`INT64_MAX`, the largest
    integer torch holds (a larger one is kept by Python, then fails where torch reads it:
    ``torch.jit.script``, a tensor, an op's argument)."""
    if not is_whole_number(value) or value < minimum:
        raise GwdetValueError(
            f"{owner}: {name} must be an integer >= {minimum}, got {_shown(value, is_whole_number(value))}")
    if int(value) > INT64_MAX:
        raise GwdetValueError(
            f"{owner}: {name} must be an integer from {minimum} to {INT64_MAX} (2**63 - 1, the largest integer torch "
            f"holds: a larger one fails in torch.jit.script and torch's ops), got {value}; give a value of at most "
            f"{INT64_MAX}")


def check_positive(owner: str, name: str, value: Any) -> None:
    """Raise ``ValueError`` unless ``value`` is a real number (not a bool) ``> 0`` that stays finite
    and nonzero in float32, the precision the norm layers compute their statistics in (float64
    only for float64 inputs): ``1e300`` is ``inf`` there, ``1e-50`` is 0; and a normal number
    there (``>= 2**-126``): a subnormal one (``1e-40``) is 0 when subnormals are flushed to zero."""
    if not is_real_number(value) or not value > 0.0 or math.isinf(value):
        raise GwdetValueError(
            f"{owner}: {name} must be a finite number > 0, got {_shown(value, is_real_number(value))}")
    rounded = _as_float32(float(value))
    if math.isinf(rounded) or rounded == 0.0:
        flushed = _as_float32(FLOAT32_SMALLEST) == 0.0  # torch.set_flush_denormal(True): subnormals are 0
        smallest = FLOAT32_SMALLEST_NORMAL  # a subnormal eps is refused below
        mode = " with subnormal numbers flushed to zero (torch.set_flush_denormal(True))" if flushed else ""
        raise GwdetValueError(
            f"{owner}: {name} must be a finite number > 0 in float32, the precision the norm layers compute "
            f"in, got {value!r}, which float32 rounds to {rounded}{mode}; use a value within float32's range "
            f"({smallest:.2g} to {FLOAT32_LARGEST:.3g})")
    if abs(rounded) < FLOAT32_SMALLEST_NORMAL:
        raise GwdetValueError(
            f"{owner}: {name} must be at least float32's smallest normal number, {FLOAT32_SMALLEST_NORMAL:.8g}, got "
            f"{value!r}, which float32 holds only as a subnormal number: with subnormal numbers flushed to zero "
            f"(torch.set_flush_denormal(True), or a device's fast-math mode) it becomes 0, and a constant input "
            f"normalizes to NaN; use a value >= {FLOAT32_SMALLEST_NORMAL:.8g} (e.g. 1e-5, the default)")


def _as_float32(value: float) -> float:
    """``value`` rounded to float32 (``inf`` beyond its range), without a tensor: the check runs
    under ``torch.device("meta")`` too."""
    try:
        return struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)


def check_unit_interval(owner: str, name: str, value: Any) -> None:
    """Raise ``ValueError`` unless ``value`` is a real number (not a bool) in ``[0, 1]``."""
    if not is_real_number(value) or not 0.0 <= value <= 1.0:
        raise GwdetValueError(
            f"{owner}: {name} must be a number in [0, 1], got {_shown(value, is_real_number(value))}")


def check_flag(owner: str, name: str, value: Any) -> None:
    """Raise ``ValueError`` unless ``value`` is ``True`` or ``False``, or numpy's ``np.True_`` or
    ``np.False_`` (``'no'`` or ``0`` would be read as a truth value without a word); a caller that
    keeps the value keeps ``bool(value)``."""
    if not isinstance(value, (bool, np.bool_)):
        raise GwdetValueError(f"{owner}: {name} must be True or False, got {_shown(value, False)}")


def check_iterations(owner: str, T: Any, name: str = "T") -> None:
    """Raise ``ValueError`` unless the Newton iteration count ``T`` (the setting ``name``) is an
    integer from 1 to :data:`MAX_ITERATIONS`: each iteration is a few products of a group's
    covariance, so a count in the millions runs for days (and one past int64 cannot reach the op at
    all)."""
    if is_whole_number(T) and T > MAX_ITERATIONS:  # before check_int_at_least, whose upper bound is int64's
        raise GwdetValueError(
            f"{owner}: {name} must be an integer from 1 to {MAX_ITERATIONS} (Newton's iterations, Eqs. 6-7; the "
            f"default is 5), got {T}")
    check_int_at_least(owner, name, T, 1)


def check_hyper_parameters(
    owner: str,
    counts: Mapping[str, Any],
    positive: Optional[Mapping[str, Any]] = None,
    unit_interval: Optional[Mapping[str, Any]] = None,
    flags: Optional[Mapping[str, Any]] = None,
    iterations: Optional[Mapping[str, Any]] = None,
) -> None:
    """A layer's constructor checks, each naming ``owner``, the argument, its value and the range
    (``ValueError``): every ``counts`` value an integer from 1 to :data:`INT64_MAX`, then every
    ``iterations`` value (the Newton iteration count ``T``) an integer from 1 to :data:`MAX_ITERATIONS`
    (:func:`check_iterations`), every ``positive`` value finite and > 0 in float32, every
    ``unit_interval`` value in [0, 1], every ``flags`` value a bool."""
    for name, count in counts.items():
        check_int_at_least(owner, name, count, 1)
    for count in (iterations or {}).values():
        check_iterations(owner, count)
    for name, number in (positive or {}).items():
        check_positive(owner, name, number)
    for name, fraction in (unit_interval or {}).items():
        check_unit_interval(owner, name, fraction)
    for name, flag in (flags or {}).items():
        check_flag(owner, name, flag)


def check_scripted_settings(owner: str, num_channels: int, groups: Dict[str, List[int]], counts: Dict[str, int],
                            positive: Dict[str, float], unit_interval: Dict[str, float],
                            method: Optional[str] = None, fix: str = "") -> None:
    """The settings of a layer running under TorchScript, where assignments to a scripted layer
    bypass the checks of :class:`~.settings_state.SettingsInState`: each ``counts`` value ``>= 1``
    (``T`` at most :data:`MAX_ITERATIONS`), each ``positive`` one a normal float32 number ``> 0``,
    each ``unit_interval`` one in ``[0, 1]``, ``method`` (where given) ``"itn"`` or ``"zca"``, and
    each ``groups`` entry ``name: [requested, used]`` a request whose largest divisor of
    ``num_channels`` at most it is the one the layer was built with. Raises ``ValueError`` (a
    ``torch.jit.Error`` to the Python caller) naming the setting, its value and ``fix`` (by default:
    how to script a layer of other settings)."""
    if fix == "":
        fix = (f"a scripted layer's settings are not checked when assigned (s.setting = value): script a layer built "
               f"with the settings you want, torch.jit.script({owner}(..., setting=value)), which checks them")
    for name, count in counts.items():
        if count < 1:
            raise GwdetValueError(f"{owner}: {name} must be an integer >= 1, got {count}; {fix}")
        if name == "T" and count > 1000:  # MAX_ITERATIONS, which TorchScript cannot read as a global
            raise GwdetValueError(f"{owner}: T must be an integer from 1 to 1000 (Newton's iterations, Eqs. 6-7; the "
                                  f"default is 5), got {count}; {fix}")
    # FLOAT32_SMALLEST_NORMAL and FLOAT32_LARGEST, which TorchScript cannot read as globals
    smallest, largest_finite = 1.1754943508222875e-38, 3.4028234663852886e38
    for name, number in positive.items():
        if not (smallest <= number <= largest_finite):
            raise GwdetValueError(f"{owner}: {name} must be a number from 1.1754944e-38 to 3.4e+38, got {number}; "
                                  f"{fix}")
    for name, fraction in unit_interval.items():
        if not (0.0 <= fraction <= 1.0):
            raise GwdetValueError(f"{owner}: {name} must be a number in [0, 1], got {fraction}; {fix}")
    if method is not None and method not in ["itn", "zca"]:
        raise GwdetValueError(f"{owner}: method must be 'itn' or 'zca', got '{method}'; {fix}")
    for name, requested_used in groups.items():
        requested, used = requested_used[0], requested_used[1]
        if requested < 1 or divisor_at_most(num_channels, requested) != used:
            raise GwdetValueError(
                f"{owner}: {name}={requested} does not give the {used} the layer was built with (its group layout "
                f"and buffers are fixed when it is built); {fix}")


def check_choice(owner: str, name: str, value: str, choices: List[str]) -> None:
    """Raise ``ValueError`` unless ``value`` is one of ``choices`` (shown with its ``repr``)."""
    if torch.jit.is_scripting():  # a scripted graph passes only strings, and has no repr
        if value not in choices:
            raise GwdetValueError(f"{owner}: {name} must be one of {choices}, got {value}")
        return
    _check_choice_eagerly(owner, name, value, choices)


@torch.jit.unused
def _check_choice_eagerly(owner: str, name: str, value: Any, choices: List[str]) -> None:
    if not isinstance(value, str) or value not in choices:
        allowed = ", ".join(repr(choice) for choice in choices)
        raise GwdetValueError(f"{owner}: {name} must be one of {allowed}, got {_shown(value, isinstance(value, str))}")


def refuse_second_derivative(op: str, alternative: str) -> Callable[..., Any]:
    """An autograd formula for the backward op of a fused layer op that has none: it raises
    ``RuntimeError`` naming ``op`` and ``alternative`` (rather than torch's "no autograd formula was
    registered ... use register_autograd", which reads as if the user were to write one).

    Registered on a backward op, it runs only when a gradient computed with ``create_graph=True``
    is itself differentiated (double backward, gradient penalties, Hessian-vector products); first
    derivatives never reach it."""
    def second_derivative(ctx: Any, *grads: Any) -> Any:
        raise GwdetRuntimeError(
            f"{op}: second derivatives (a backward pass through gradients computed with create_graph=True) "
            f"are not supported by its fused op; {alternative}")

    return second_derivative


# torch.func transforms that differentiate (grad, vjp, jacrev, hessian: Grad; jvp, jacfwd: Jvp)
_DIFFERENTIATING_TRANSFORMS = (TransformType.Grad, TransformType.Jvp)


def refuse_differentiating_transforms(op: str, alternative: str, *tensors: Optional[Tensor]) -> None:
    """Raise ``RuntimeError`` naming ``op`` and ``alternative`` when a fused op is called inside a
    ``torch.func`` transform that differentiates, or on forward-mode dual ``tensors``: its gradient
    formula cannot run there (PyTorch refuses it under ``grad``, and under ``jvp`` the tangent
    would come out as zeros without a word). ``torch.vmap`` alone runs the op; nothing is checked
    while ``torch.compile`` traces."""
    if torch.compiler.is_compiling():
        return
    transforms = [interpreter.key() for interpreter in retrieve_all_functorch_interpreters()]
    dual = any(t is not None and forward_ad.unpack_dual(t).tangent is not None for t in tensors)
    if dual or any(key in _DIFFERENTIATING_TRANSFORMS for key in transforms):
        raise GwdetRuntimeError(
            f"{op}: its fused op has a backward formula only: torch.func transforms that differentiate (grad, "
            f"jvp, vjp, jacrev, jacfwd, hessian) and forward-mode AD cannot run it; {alternative}")


def check_input(owner: str, x: Tensor, num_channels: int) -> None:
    """Raise ``ValueError`` unless ``x`` is of a floating-point type the layers compute in (not
    float8) with shape ``(N, num_channels, *spatial)`` (``num_channels`` < 1: any channel count; an
    integer input would be whitened and returned rounded to integers); ``TypeError`` unless ``x`` is
    a tensor (a numpy array, a list of tensors, a number)."""
    if not torch.jit.is_scripting():  # a scripted graph passes only tensors here
        _check_is_tensor(owner, x, num_channels)
    if x.is_nested:
        raise GwdetValueError(
            f"{owner}: expected a dense input, got a nested tensor (tensors of different sizes); pad them into one "
            "tensor with torch.nested.to_padded_tensor(x, 0.0), or run the layer on each of them")
    if x.dim() < 2 or (num_channels >= 1 and x.shape[1] != num_channels):
        channels = str(num_channels) if num_channels >= 1 else "C"
        raise GwdetValueError(
            f"{owner}: expected input of shape (N, {channels}) or "
            f"(N, {channels}, *spatial), got {list(x.shape)}"
        )
    if not x.is_floating_point():
        raise GwdetValueError(f"{owner}: expected a floating-point input, got {x.dtype}; convert it with .float()")
    if not (x.dtype == torch.float16 or x.dtype == torch.bfloat16 or x.dtype == torch.float32
            or x.dtype == torch.float64):  # float8: a storage type, which torch's reductions do not compute in
        raise GwdetValueError(f"{owner}: expected a float16, bfloat16, float32 or float64 input, got {x.dtype}; "
                              "convert it with .float()")
    if x.is_sparse:
        raise GwdetValueError(f"{owner}: expected a dense input, got a sparse tensor; convert it with .to_dense()")
    if not torch.jit.is_scripting():
        _check_input_eagerly(owner, x)


@torch.jit.unused
def _check_is_tensor(owner: str, x: Any, num_channels: int) -> None:
    """Raise ``TypeError`` naming the type of ``x`` (and the conversion to a tensor) unless it is a
    ``torch.Tensor`` or a ``torch.fx`` proxy (``torch.fx.symbolic_trace`` records with those, and
    names its own limits: docs/deploy.md)."""
    if isinstance(x, (Tensor, torch.fx.Proxy)):
        return
    shape = f"(N, {num_channels if num_channels >= 1 else 'C'}, *spatial)"
    if isinstance(x, np.ndarray):
        got, fix = (f"a numpy.ndarray of shape {list(x.shape)} ({x.dtype})",
                    "convert it with torch.from_numpy(x) (then .to(device) for another device than the CPU)")
    elif isinstance(x, (list, tuple)) and x and all(isinstance(item, Tensor) for item in x):
        got = f"a {type(x).__name__} of {len(x)} tensor{'' if len(x) == 1 else 's'}"
        fix = (f"join them into one tensor of shape {shape} with torch.cat(x) (tensors of shape (n, C, ...)) or "
               "torch.stack(x) (tensors of shape (C, ...)), or run the layer on each of them")
    elif isinstance(x, (list, tuple)):
        got = f"a {type(x).__name__} of {len(x)} item{'' if len(x) == 1 else 's'}"
        fix = f"convert it with torch.tensor(x) to a tensor of shape {shape}"
    else:
        shown = repr(x)
        got = f"{shown if len(shown) <= 60 else shown[:57] + '...'} ({type(x).__name__})"
        fix = f"pass a tensor of shape {shape}"
    raise GwdetTypeError(f"{owner}: expected a torch.Tensor input of shape {shape}, got {got}; {fix}")


@torch.jit.unused
def _check_input_eagerly(owner: str, x: Tensor) -> None:
    """Raise ``ValueError`` for a ``torch.masked`` tensor, whose masked-out values have no place in
    a group's statistics; warn when ``torch.jit.trace`` records a layer on a float16 or bfloat16
    input: the trace holds the casts of that dtype as constants, so it returns that dtype for every
    input (a float16 trace turns a float32 input into float16 without a word)."""
    if isinstance(x, MaskedTensor):
        raise GwdetValueError(f"{owner}: expected a dense input, got a torch.masked MaskedTensor, whose masked-out "
                              "values the statistics cannot leave out; fill them (x.to_tensor(0.0)) and pass that")
    if x.dtype in (torch.float16, torch.bfloat16) and torch.jit.is_tracing() and not onnx_exporting():
        warnings.warn(
            f"{owner}: traced on a {x.dtype} input, the trace holds the casts to and from that dtype as constants "
            f"and returns {x.dtype} whatever dtype it is given later, a float32 input rounded to it. Trace with a "
            "float32 input, the dtype the layers whiten in, and give the traced model float32 inputs.",
            GwdetRuntimeWarning, stacklevel=3)


@torch.jit.unused
def check_per_channel(owner: str, tensors: Mapping[str, Optional[Tensor]], channels: int) -> None:
    """Raise ``ValueError`` for a tensor of ``tensors`` (None: absent, allowed) that is not one value
    per channel, shape ``[channels]`` (a functional form's affine and running statistics)."""
    for name, tensor in tensors.items():
        if tensor is not None and (not isinstance(tensor, Tensor) or list(tensor.shape) != [channels]):
            shape = list(tensor.shape) if isinstance(tensor, Tensor) else type(tensor).__name__
            raise GwdetValueError(f"{owner}: {name} must hold one value per channel, shape [{channels}], got {shape}")


@torch.jit.unused
def check_running_updatable(owner: str, tensors: Mapping[str, Tensor]) -> None:
    """Raise ``ValueError`` for a running statistic of ``tensors`` that training cannot update in
    place: one that requires grad (autograd refuses in-place changes of such a leaf), or a view
    whose elements share memory (``torch.zeros(1).expand(16)``: one write would change them all)."""
    for name, tensor in tensors.items():
        if tensor.requires_grad:
            raise GwdetValueError(
                f"{owner}: {name} requires grad, but training updates it in place (a running average, which "
                f"no gradient flows into); pass {name}.detach(), or create it without requires_grad=True")
        if any(stride == 0 and size > 1 for stride, size in zip(tensor.stride(), tensor.shape, strict=True)):
            raise GwdetValueError(
                f"{owner}: {name} is a view whose elements share memory (stride 0, as .expand() makes), but "
                f"training updates each of its values in place; pass {name}.clone()")


@torch.jit.unused
def check_floating_running(owner: str, running: Mapping[str, tuple[Tensor, str]]) -> None:
    """Raise ``ValueError`` naming each integer tensor of ``running`` (name: (tensor, the expression
    that creates it)): running statistics hold running averages, which training updates in place."""
    integral = [(name, tensor.dtype, initial) for name, (tensor, initial) in running.items()
                if not tensor.is_floating_point()]
    if not integral:
        return
    named = " and ".join(f"{name} ({dtype})" for name, dtype, _ in integral)
    it, they = ("it", "it holds a running average") if len(integral) == 1 else ("them", "they hold running averages")
    raise GwdetValueError(f"{owner}: {named} must be floating-point: {they}, which training updates in place; create "
                          f"{it} as {' and '.join(initial for _, _, initial in integral)}, or convert {it} with "
                          ".float()")


@torch.jit.unused
def check_same_device(owner: str, x: Tensor, tensors: Mapping[str, Optional[Tensor]]) -> None:
    """Raise ``ValueError`` for a tensor of ``tensors`` (None: absent) on another device than the
    input ``x``: a functional form computes with them together."""
    for name, tensor in tensors.items():
        if tensor is not None and tensor.device != x.device:
            raise GwdetValueError(f"{owner}: {name} is on {tensor.device}, the input on {x.device}; move it with "
                                  f"{name}.to(x.device)")


def check_values_per_group(owner: str, values: int, what: str,
                           fix: str = "fewer groups, a larger input or (for batch statistics) more than one example"
                           ) -> None:
    """Raise ``ValueError`` when each normalized group holds one value: normalizing it gives 0 for
    any input, so the layer would output its bias whatever it is given (batch norm refuses too);
    the message ends with ``fix``."""
    if values == 1:
        raise GwdetValueError(f"{owner}: each {what} holds a single value, which normalizes to 0 for any input; use {fix}")


def largest_divisor_at_most(total: int, limit: int) -> int:
    """The largest divisor of ``total`` that is ``<= limit`` (``total``, ``limit`` >= 1).

    This is the rule all three layers use to split ``total`` channels into equal parts when the
    requested group count (or group size) ``limit`` does not divide them; a ``limit`` above
    ``total`` gives ``total`` (for group counts: one channel per group, GW paper Sec. 5.1.1).
    """
    whole = all(is_whole_number(value) or isinstance(value, torch.SymInt)  # a size while torch.export traces
                or (isinstance(value, Tensor) and value.dim() == 0 and not value.is_floating_point())  # jit.trace's
                for value in (total, limit))
    if not whole or total < 1 or limit < 1:
        raise GwdetValueError(f"largest_divisor_at_most: total and limit must be integers >= 1, got {total!r} "
                              f"({type(total).__name__}) and {limit!r} ({type(limit).__name__})")
    return divisor_at_most(total, limit)


def divisor_at_most(total: int, limit: int) -> int:
    """:func:`largest_divisor_at_most` of checked integers ``>= 1`` (TorchScript compiles it: the
    scripted layers' own check of their group counts runs it)."""
    candidate = min(total, limit)
    while total % candidate != 0:
        candidate -= 1
    return candidate


def statistics_dtype(dtype: torch.dtype) -> torch.dtype:
    """Dtype for covariances, moments and whitening matrices: float64 stays, all else float32."""
    if dtype == torch.float64:
        return torch.float64
    return torch.float32


def safe_exponent(dtype: torch.dtype) -> int:
    """``E`` such that values up to ``2**E`` in magnitude enter the statistics of ``dtype`` unscaled:
    a quarter of its exponent range, ``2**32`` for float32 and ``2**256`` for float64.

    Below it every intermediate stays finite (the largest finite value is about ``2**(4E)``):
    centred values are at most ``2**(E+1)``, so sums of up to ``2**(2E-2)`` of their products
    (covariances, variances) fit, and so does ItN's ``tr(Sigma)**1.5`` in the backward pass
    (:func:`~.whitening_matrix.itn_whitening_vjp`) for up to ``2**19`` groups.
    """
    if dtype == torch.float64:
        return 256
    return 32


def largest_magnitude(x: Tensor, dims: List[int]) -> Tensor:
    """``max |x|`` over ``dims`` (kept as size-1 dimensions), detached from autograd: one reduction
    without a temporary (NaN where a NaN is among the values)."""
    return torch.linalg.vector_norm(x.detach(), ord=float("inf"), dim=dims, keepdim=True)


def magnitude_scales(largest: Tensor) -> Tensor:
    """Factors ``1/s`` that bring values of largest magnitude ``largest`` into range for their
    statistics: ``s`` is the power of two with ``largest / s`` in ``(2**(E-1), 2**E]``
    (``E = safe_exponent``) where ``largest > 2**E``, and ``s = 1`` (exactly unscaled) elsewhere.

    Normalization depends on the scale of its centred input only through ``eps``:
    ``(s^2 C + eps I)^{-1/2} s X_C = (C + (eps/s^2) I)^{-1/2} X_C`` and ``(s x - s mu) / sqrt(s^2 var
    + eps) = (x - mu) / sqrt(var + eps/s^2)``, so a layer computes the statistics of ``x / s`` with
    :func:`scaled_ridge` and gets the same function without overflowing squares; a power of two
    scales exactly. An infinite ``largest`` gets the factor 0, a NaN one NaN: non-finite inputs stay
    non-finite.
    """
    exponent = safe_exponent(largest.dtype)
    return torch.pow(2.0, (exponent - torch.ceil(torch.log2(largest))).clamp_max(0.0))


def scaled_ridge(eps: float, scales: Tensor) -> Tensor:
    """``eps / s^2`` for the factors ``scales = 1/s`` of :func:`magnitude_scales`, in their dtype.

    Where ``s > 1`` the ridge is at least ``2**(-E-8)`` (``E = safe_exponent``). A smaller one is far
    below the resolution of the scaled values, which reach ``2**(E-1)``, so the floor changes no
    result; it keeps finite the derivatives of whitening or standardizing a constant group, which
    grow like ``ridge**-1.5`` (``eps / s^2`` underflows for inputs near float32's largest value).
    Where ``s = 1`` the ridge is ``eps``.
    """
    ridge = eps * scales * scales
    floor = 2.0 ** (-safe_exponent(scales.dtype) - 8)
    return torch.where(scales < 1.0, ridge.clamp_min(floor), ridge)


def autocast_disabled(x: Tensor) -> ContextManager:
    """A context that switches autocast off on ``x``'s device (eager mode only); a context that
    does nothing when autocast is off there already, or when the device has no autocast (``meta``).

    Entering no autocast region when none is needed keeps graphs captured by ``torch.export`` free
    of autocast regions (an in-place update of a running statistic inside one is not exported).
    TorchScript resolves autocast regions when it compiles, so inside a scripted graph this
    context cannot switch off an autocast region entered in eager code; callers skip it under
    ``torch.jit.is_scripting()``.
    """
    if torch.amp.is_autocast_available(x.device.type) and torch.is_autocast_enabled(x.device.type):
        return torch.autocast(device_type=x.device.type, enabled=False)
    return contextlib.nullcontext()


# the dtypes a layer's parameters and running statistics may be created in (its ``dtype=`` argument)
FACTORY_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def factory_kwargs(owner: str, device: Any, dtype: Any) -> Dict[str, Any]:
    """A layer's ``device`` and ``dtype`` constructor arguments, as torch's norm layers take them,
    checked and returned as the keywords of torch's factory functions (``torch.ones(C, **kw)``).

    ``device``: ``None`` (torch's default device), a ``torch.device``, a device string or index;
    ``dtype``: ``None`` (torch's default dtype) or one of :data:`FACTORY_DTYPES` (the parameters and
    running statistics are learned and averaged in floating point). Raises ``ValueError`` naming
    the value and what to give otherwise; a device of a kind this machine does not have (``'cuda'``
    without CUDA, ``'cuda:3'`` with fewer GPUs, ``'mps'`` without MPS, ``'xpu'`` without XPU) is refused too
    (:func:`check_device_here`)."""
    if device is not None:
        if isinstance(device, bool) or not isinstance(device, (str, int, torch.device)):
            raise GwdetValueError(
                f"{owner}: device must be a torch.device, a device string ('cpu', 'cuda:0', 'meta') or None (torch's "
                f"default device), got {_shown(device, False)}")
        given = device
        try:
            device = torch.device(device)
        except (RuntimeError, ValueError, TypeError):
            raise GwdetValueError(
                f"{owner}: device must be a torch.device, a device string ('cpu', 'cuda:0', 'meta') or None (torch's "
                f"default device), got {device!r}, which torch does not read as a device") from None
        check_device_here(owner, device, given)
    if dtype is not None and dtype not in FACTORY_DTYPES:
        allowed = ", ".join(str(choice) for choice in FACTORY_DTYPES)
        raise GwdetValueError(
            f"{owner}: dtype must be a floating-point dtype ({allowed}) or None (torch's default dtype), got "
            f"{_shown(dtype, isinstance(dtype, torch.dtype))}: the layer's parameters and running statistics are "
            "learned and averaged in floating point; leave dtype out, or give e.g. dtype=torch.float64")
    return {"device": device, "dtype": dtype}


def check_device_here(owner: str, device: torch.device, given: Any = None, fix: str | None = None) -> None:
    """Raise ``GwdetValueError`` when ``device`` is a device that this machine does not have: CUDA or
    MPS not available, a CUDA index past ``torch.cuda.device_count()``, another accelerator (``'xpu'``,
    ``'mtia'``, ...) that is not available or cannot hold a tensor (:func:`_check_accelerator_here`).
    ``'cpu'`` and ``'meta'`` are always accepted. ``given``: the value the user gave
    (a string, an index or the device itself), named in the message; ``fix``: what the message
    advises (by default, a layer's: build it on the CPU)."""
    shown = repr(str(device)) if given is None or isinstance(given, (str, torch.device)) else f"{given!r} ({device})"
    fix = fix or ("give device='cpu' (or leave it out), or build the layer on the CPU and move it with .to(device) "
                  "on a machine that has that device")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise GwdetValueError(
                f"{owner}: device {shown} is a CUDA device, but CUDA is not available on this machine "
                f"(torch.cuda.is_available() is False); {fix}")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise GwdetValueError(
                f"{owner}: device {shown} names CUDA device {device.index}, but this machine has "
                f"{count} CUDA device{'' if count == 1 else 's'} (indices 0 to {count - 1}); give an index below "
                f"{count}, or {fix}")
    elif device.type == "mps":
        if not torch.backends.mps.is_available():
            raise GwdetValueError(
                f"{owner}: device {shown} is an Apple MPS device, but MPS is not available on this machine "
                f"(torch.backends.mps.is_available() is False); {fix}")
    elif device.type not in ("cpu", "meta"):
        _check_accelerator_here(owner, device, shown, fix)


def _check_accelerator_here(owner: str, device: torch.device, shown: str, fix: str) -> None:
    """:func:`check_device_here` for a device type other than cpu, meta, cuda and mps (xpu, mtia,
    hpu, xla, a backend of one's own): refused when its torch module (``torch.xpu``) says it is not
    available, or its index is past the module's ``device_count()``, or when torch cannot create an
    empty tensor on it."""
    kind = device.type
    article = "an" if kind[0].upper() in "AEFHILMNORSX" else "a"  # as the letters are spoken: an XPU, a VE
    module = getattr(torch, kind, None)
    is_available = getattr(module, "is_available", None)
    if callable(is_available) and not is_available():
        raise GwdetValueError(
            f"{owner}: device {shown} is {article} {kind.upper()} device, but {kind.upper()} is not available on this machine "
            f"(torch.{kind}.is_available() is False); {fix}")
    device_count = getattr(module, "device_count", None)
    if callable(device_count) and device.index is not None:
        count = device_count()
        if isinstance(count, int) and device.index >= count:
            raise GwdetValueError(
                f"{owner}: device {shown} names {kind.upper()} device {device.index}, but this machine has {count} "
                f"{kind.upper()} device{'' if count == 1 else 's'}; give an index below {count}, or {fix}")
    try:
        torch.empty(0, device=device)
    except Exception as error:  # torch's "Could not run ... from the 'HIP' backend", "not compiled with ..."
        line = (str(error).splitlines() or [""])[0]
        line = line if len(line) <= 100 else line[:100] + "..."
        raise GwdetValueError(
            f"{owner}: device {shown} cannot be used on this machine: torch cannot create a tensor there "
            f"(torch.empty(0, device={str(device)!r}) fails with {type(error).__name__}: {line}); {fix}") from None


@contextlib.contextmanager
def allocating_channels(owner: str, num_channels: int) -> Iterator[None]:
    """A context for a layer's constructor that creates its per-channel parameters and running
    statistics: torch's allocator error (a ``num_channels`` too large for the device's memory) is
    raised as ``GwdetValueError`` naming the argument, with torch's words kept."""
    try:
        yield
    except RuntimeError as error:  # torch.OutOfMemoryError on a GPU; the CPU allocator's enforce failure
        line = (str(error).splitlines() or [""])[0]
        if "allocate" not in line and "size calculation overflowed" not in line:
            raise
        raise GwdetValueError(
            f"{owner}(num_channels={num_channels}): its parameters and running statistics do not fit in this device's "
            f"memory ({line.strip()}): a norm layer has as many channels as the convolution it follows (64 to 2048 in a "
            "ResNet); check num_channels.") from error


def register_affine(module: torch.nn.Module, num_channels: int, affine: bool,
                    factory: Optional[Dict[str, Any]] = None) -> None:
    """Give ``module`` learnable ``weight`` (ones) and ``bias`` (zeros) of shape ``[C]``, created
    with ``factory`` (:func:`factory_kwargs`: the device and dtype), or register both as ``None``
    when ``affine`` is false (names match detectron2's norm keys)."""
    if affine:
        module.weight = torch.nn.Parameter(torch.ones(num_channels, **(factory or {})))
        module.bias = torch.nn.Parameter(torch.zeros(num_channels, **(factory or {})))
    else:
        module.register_parameter("weight", None)
        module.register_parameter("bias", None)


def reset_affine(module: torch.nn.Module) -> None:
    """Set the ``weight`` and ``bias`` of :func:`register_affine` back to ones and zeros (nothing
    without them)."""
    weight, bias = module.weight, module.bias
    if isinstance(weight, Tensor) and isinstance(bias, Tensor):
        torch.nn.init.ones_(weight)
        torch.nn.init.zeros_(bias)


def reshape_with_samples(t: Tensor, sizes: List[int], sample_dim: int = 0) -> Tensor:
    """``t.reshape(sizes)`` where ``sizes[sample_dim]`` is a sample count that may be 0 when a
    recorded graph runs (no ROI in a head); every other size must be nonzero.

    While ``torch.onnx.export`` records, the sample count is written as ``-1`` and the other sizes
    as given: in ONNX a size of 0 means "copy the input's size" (``allowzero=0``), and onnxruntime
    may rewrite traced sizes into such copies and a ``-1``, which cannot be resolved for 0 samples.
    """
    if not torch.jit.is_scripting():
        if onnx_exporting():
            sizes = sizes[:sample_dim] + [-1] + sizes[sample_dim + 1:]
    return t.reshape(sizes)


def product(sizes: List[int]) -> int:
    """The product of ``sizes`` (1 for none), without an in-place ``*=``: under ``torch.jit.trace``
    the sizes can be traced values, and ``*=`` would change the size it started from."""
    result = 1
    for size in sizes:
        result = result * size
    return result


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


# what a functional form's refusal of a running statistic suggests in its place: its plural and its untrained value
_UNTRAINED_STATISTICS = {
    "running_mean": ("running means", "torch.zeros(C)"),
    "running_var": ("running variances", "torch.ones(C)"),
    "running_whitening": ("running whitening matrices", "torch.eye(k).repeat(C // k, 1, 1)"),
}


def whitening_asymmetry(whitening: Tensor) -> Tensor:
    """The largest difference between entries ``(i, j)`` and ``(j, i)`` of each matrix of
    ``whitening`` ``[groups, k, k]``, relative to that matrix's largest entry (float32, ``[groups]``)."""
    value = whitening.detach().float()
    difference = (value - value.transpose(-1, -2)).abs().amax(dim=(-2, -1))
    return difference / value.abs().amax(dim=(-2, -1)).clamp_min(torch.finfo(torch.float32).tiny)


def asymmetry_tolerance(dtype: torch.dtype) -> float:
    """The relative asymmetry (:func:`whitening_asymmetry`) rounding can give a symmetric matrix
    stored in ``dtype``: ``1e-3``, or 8 units of the dtype's precision where that is more (fp16, bf16)."""
    return max(1e-3, 8 * torch.finfo(dtype).eps)


def _is_whitening_stack(name: str, value: Tensor) -> bool:
    return name == "running_whitening" and value.dim() == 3 and value.shape[-1] == value.shape[-2]


def _statistic_acceptable(name: str, value: Tensor) -> Tensor:
    """A 0-dim bool tensor: whether :func:`running_statistics_problem` finds nothing in ``value``
    (reductions without a device sync)."""
    acceptable = torch.isfinite(value).all()
    if name == "running_var":
        acceptable = acceptable & (value >= 0).all()
    elif _is_whitening_stack(name, value):
        acceptable = (acceptable & (torch.diagonal(value, dim1=-2, dim2=-1) > 0).all()
                      & ~(whitening_asymmetry(value) > asymmetry_tolerance(value.dtype)).any())
    return acceptable


def _statistic_problem(name: str, value: Tensor) -> Optional[Tuple[str, str, Optional[str]]]:
    """``(why, effect, overflow)`` for one running statistic (:func:`running_statistics_problem`)."""
    def where(mask: Tensor) -> str:
        first = int(mask.nonzero()[0, 0])
        return f"in the matrix of group {first}" if value.dim() == 3 else f"at channel {first}"

    nan = torch.isnan(value)
    if bool(nan.any()):
        what = "variances" if name == "running_var" else "values"
        return f"NaN {what} ({where(nan)})", "the output would be NaN", None
    infinite = torch.isinf(value)
    if bool(infinite.any()):
        return f"inf values (the first {where(infinite)})", "the output would be NaN", _overflow_cause(name, value)
    if name == "running_var" and bool((value < 0).any()):
        return (f"negative variances (the smallest {value.min().item():.3g}, {where(value < 0)})",
                "the output would be NaN", None)
    if _is_whitening_stack(name, value):
        diagonal = torch.diagonal(value, dim1=-2, dim2=-1)
        if bool((diagonal <= 0).any()):
            return (f"a whitening matrix whose diagonal is not positive ({where(diagonal <= 0)}; an all-zero one maps "
                    "every input to 0)", "the layer's outputs would not be whitened", None)
        asymmetry = whitening_asymmetry(value)
        tolerance = asymmetry_tolerance(value.dtype)
        if bool((asymmetry > tolerance).any()):
            return (f"a whitening matrix that is not symmetric (entries (i, j) and (j, i) differ by up to "
                    f"{float(asymmetry.max()):.3g} of its largest entry; training keeps the inverse square root of a "
                    "covariance plus eps I, Eq. 5, which is symmetric)", "the layer's outputs would not be whitened",
                    None)
    return None


def _overflow_cause(name: str, value: Tensor) -> str:
    """The likely cause of an ``inf`` (without a NaN) in the running statistic ``name`` stored as
    ``value``: training overflowed it (a batch statistic beyond the dtype's largest value); and how
    to keep it finite (float32 buffers for a float16 one), ending with how to recompute the statistics."""
    largest = torch.finfo(value.dtype).max
    dtype = str(value.dtype).replace("torch.", "")
    follows = {"running_var": "variance", "running_mean": "mean"}.get(name, "statistic")
    inputs = f" (inputs beyond about {math.sqrt(largest):.3g} in magnitude)" if name == "running_var" else ""
    cause = (f"The likely cause: the {dtype} running statistic overflowed in training, as it does once a batch's "
             f"{follows} exceeds {largest:.6g}, the largest {dtype}{inputs}.")
    if largest < FLOAT32_LARGEST:
        keep = (f"Keep the layer's buffers in float32: build it in float32 (or call layer.float()) and give it {dtype} "
                f"inputs under torch.autocast, which computes in {dtype} while the running statistics stay float32")
    elif value.dtype == torch.float32:
        keep = "Scale the layer's inputs down, or keep the layer in float64 (layer.double())"
    else:
        keep = "Scale the layer's inputs down"
    return (f"{cause} {keep}; then recompute the running statistics: train again, or "
            "gwdet.layers.update_running_statistics(loader, model)")


@torch.jit.unused
def running_statistics_problem(tensors: Mapping[str, Optional[Tensor]]) -> Optional[Tuple[str, str, str, Optional[str]]]:
    """``(name, why, effect, overflow)`` for the first running statistic of ``tensors``
    (``running_mean``, ``running_var``, ``running_whitening``; None, an empty, integer or meta tensor:
    skipped) that a layer cannot normalize with. A NaN value, a negative variance, a whitening matrix
    (``[groups, k, k]``) whose diagonal is not positive (an all-zero one maps every input to 0) or
    that is not symmetric beyond rounding (:func:`whitening_asymmetry`; training keeps the inverse
    square root of a covariance plus ``eps I``) no training computes: ``overflow`` is ``None``. An
    ``inf`` value is what training leaves when a batch statistic
    overflows the buffer's dtype (a float16 ``running_var`` once a batch's variance exceeds 65504):
    ``overflow`` says so and how to keep the statistics finite. ``why`` names the value and where it
    is, ``effect`` what a layer normalizing with it computes. ``None`` where all are acceptable,
    found with one device sync."""
    present = [(name, tensor.detach()) for name, tensor in tensors.items()
               if isinstance(tensor, Tensor) and tensor.is_floating_point() and tensor.numel() and not tensor.is_meta]
    if not present:
        return None
    device = present[0][1].device
    flags = [_statistic_acceptable(name, value).to(device) for name, value in present]
    if bool(torch.stack(flags).all()):
        return None
    for name, value in present:
        problem = _statistic_problem(name, value)
        if problem is not None:
            return (name,) + problem
    return None


@torch.jit.unused
def check_evaluation_statistics(owner: str, tensors: Mapping[str, Optional[Tensor]], fix: str = "",
                                when: str = "in evaluation (training=False)") -> None:
    """Raise ``ValueError`` naming ``owner``, the running statistic, what is wrong with it and where
    (:func:`running_statistics_problem`) when an evaluation is to normalize with ``tensors``. For
    values no training computes the message ends with ``fix``; by default, what a functional form's
    caller passes in its place (the layer's buffer, or the untrained value). For ``inf`` values,
    with which the output would be NaN too, it names the likely cause, a running statistic that
    overflowed its dtype in training, and how to keep it finite."""
    problem = running_statistics_problem(tensors)
    if problem is None:
        return
    name, why, effect, overflow = problem
    if overflow is not None:
        raise GwdetValueError(f"{owner}: {name} holds {why}: {when} {effect}. {overflow}")
    if not fix:
        plural, untrained = _UNTRAINED_STATISTICS.get(name, (name, "the untrained values"))
        fix = f"Pass the {plural} of a trained layer (e.g. its {name} buffer), or {untrained} for untrained statistics"
    raise GwdetValueError(f"{owner}: {name} holds {why}, which no training computes: {when} {effect}. {fix}")


# the attribute of a layer that holds the running statistics its last evaluation checked
CHECKED_STATISTICS_ATTRIBUTE = "_checked_statistics"


@torch.jit.unused
def check_layer_evaluation_statistics(layer: torch.nn.Module, tensors: Mapping[str, Tensor]) -> None:
    """:func:`check_evaluation_statistics` for a layer's evaluation with its running statistics
    ``tensors``, skipped where the layer's last evaluation checked the very same ones: the layer's
    own buffers (not tensors given in their place, as by ``torch.func.functional_call``, which are
    checked at each call), at the same storage (``data_ptr()``) and version counter (``_version``,
    which every in-place write moves: ``fill_``, ``copy_``, a training update, ``load_state_dict``).
    The layer keeps the checked tensors with their versions (attribute
    :data:`CHECKED_STATISTICS_ATTRIBUTE`), so an evaluation syncs with the device for the check
    once after the statistics change, not at every call. Nothing is checked while ``torch.jit.trace``
    or ``torch.compile`` / ``torch.export`` records (the check's outcome would be a constant of the graph)."""
    if torch.jit.is_tracing() or torch.compiler.is_compiling():
        return
    own = all(layer._buffers.get(name) is tensor for name, tensor in tensors.items())
    versions = tuple((tensor.data_ptr(), tensor._version) for tensor in tensors.values())
    checked = getattr(layer, CHECKED_STATISTICS_ATTRIBUTE, None)
    if own and checked is not None and checked[1] == versions and all(
            kept is tensor for kept, tensor in zip(checked[0], tensors.values(), strict=True)):
        return
    check_evaluation_statistics(
        type(layer).__name__, tensors,
        "Load the running statistics of a trained layer (its load_state_dict refuses such values too), or call "
        "layer.reset_running_stats() for untrained ones", when="in evaluation (eval mode)")
    if own:  # the tensors are kept, so that a later tensor cannot take a checked one's place unseen
        object.__setattr__(layer, CHECKED_STATISTICS_ATTRIBUTE, (tuple(tensors.values()), versions))

