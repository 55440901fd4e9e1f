"""Batch group normalization (Summers & Dinneen, "Four Things Everyone Should Know to Improve
Batch Normalization", ICLR 2020, Secs. 3.1, 3.2 and 3.4).

Training (Sec. 3.4): every value is standardized (Eq. 1) with the mean and biased variance of its
block of ``examples_per_group`` consecutive examples x one of ``G`` contiguous channel groups.
``examples_per_group = 1`` is group normalization; one channel per group is ghost batch
normalization (Sec. 3.2, Eq. 4) and, with ``examples_per_group >= N``, batch normalization.
``running_mean`` and ``running_var`` follow batch norm's ``running <- (1 - momentum) running +
momentum batch``, ``batch`` averaging over the examples the block statistics each was normalized
with (the variance with Bessel's correction for the block size).

Evaluation, inference example weighing (Sec. 3.1, Eq. 3) with ``alpha = eval_example_weight``:
``mu = alpha E[x] + (1 - alpha) m_x``, ``sigma^2 = alpha E[x^2] + (1 - alpha) m_{x^2} - mu^2`` over
the example's channel group, ``m_{x^2} = running_var + running_mean^2``, computed without
cancellation as ``alpha var_own + (1 - alpha) running_var + alpha (1 - alpha) (E[x] - running_mean)^2``.
``alpha = 0`` is batch-norm inference, ``alpha = 1`` group norm.

``G`` is the largest divisor of ``C`` that is ``<= num_groups``; the last ``N mod examples_per_group``
examples form one smaller example group. An empty input returns an empty output and leaves the
running statistics untouched. Statistics run in float32 (float64 for float64 input); the output has
the input dtype. A block whose largest magnitude exceeds ``2**32`` (``2**256`` in float64) is
standardized as ``x / s`` with the ridge ``eps / s^2`` (:func:`~.common.magnitude_scales`), the
running moments scaled along in evaluation; a ``running_var`` that overflowed to ``inf`` (a float16
one once a batch's variance exceeds 65504) is refused in evaluation with ``alpha < 1``, where the
output would be NaN. :mod:`gwdet.export.counting_ops` registers
:func:`batch_group_norm` as the custom op ``gwdet::batch_group_norm`` for flop counting.
"""
import warnings
from typing import Any, Dict, List, Optional, Tuple, Union

import torch
from torch import Tensor

from .common import (
    allocating_channels, check_evaluation_statistics, check_floating_running, check_hyper_parameters, check_input,
    check_layer_evaluation_statistics, check_per_channel, check_running_updatable, check_same_device,
    check_scripted_settings, factory_kwargs, INT64_MAX, largest_divisor_at_most, largest_magnitude, magnitude_scales,
    per_channel_affine, product, register_affine, reset_affine, reshape_with_samples,
    scaled_ridge, statistics_dtype,
)
from .settings_state import EXTRA_STATE_KEY, SettingsInState

from gwdet.errors import GwdetRuntimeWarning, GwdetValueError

# Example groups this large hold every batch, so a BatchGroupNorm with one channel per group trains as batch norm
# (gwdet.modeling.example_weighing builds such layers in place of a model's batch norms).
WHOLE_BATCH = INT64_MAX
# the key of a torch batch norm's state that no BatchGroupNorm keeps
_BATCHES_TRACKED = "num_batches_tracked"


def batch_group_norm(
    x: Tensor,
    running_mean: Tensor,
    running_var: Tensor,
    weight: Optional[Tensor],
    bias: Optional[Tensor],
    training: bool,
    groups: int,
    examples_per_group: int,
    eps: float,
    momentum: float,
    eval_example_weight: float,
) -> Tensor:
    """Batch-group normalization of ``x`` ``(N, C, *spatial)`` plus the per-channel affine.

    ``groups`` channel groups (it must divide ``C``); in training, blocks of
    ``examples_per_group`` consecutive examples, and ``running_mean``/``running_var`` ``[C]``
    are updated in place; in evaluation, inference example weighing with
    ``alpha = eval_example_weight`` (module docstring). Every argument is checked as the layer checks
    it (``ValueError``).
    """
    if not torch.jit.is_scripting():
        _check_arguments(x, running_mean, running_var, weight, bias, training, groups, examples_per_group, eps,
                         momentum, eval_example_weight)
    return _batch_group_norm(x, running_mean, running_var, weight, bias, training, groups, examples_per_group, eps,
                             momentum, eval_example_weight)


@torch.jit.unused
def _check_arguments(x: Tensor, running_mean: Tensor, running_var: Tensor, weight: Optional[Tensor],
                     bias: Optional[Tensor], training: bool, groups: int, examples_per_group: int, eps: float,
                     momentum: float, eval_example_weight: float) -> None:
    """:func:`batch_group_norm`'s arguments checked as :class:`BatchGroupNorm` checks its own."""
    owner = "batch_group_norm"
    check_hyper_parameters(owner, {"groups": groups, "examples_per_group": examples_per_group}, positive={"eps": eps},
                           unit_interval={"momentum": momentum, "eval_example_weight": eval_example_weight},
                           flags={"training": training})
    check_input(owner, x, 0)
    channels = x.shape[1]
    if channels % groups:
        raise GwdetValueError(f"{owner}: groups={groups} must divide the {channels} channels of the input (the layer "
                              f"uses largest_divisor_at_most({channels}, num_groups) = "
                              f"{largest_divisor_at_most(channels, groups)})")
    missing = [name for name, tensor in (("running_mean", running_mean), ("running_var", running_var)) if tensor is None]
    if missing:
        raise GwdetValueError(f"{owner}: {' and '.join(missing)} must be tensors of one value per channel, shape "
                              f"[{channels}] (training updates them, evaluation normalizes with them), got None")
    check_per_channel(owner, {"running_mean": running_mean, "running_var": running_var, "weight": weight, "bias": bias},
                      channels)
    check_same_device(owner, x, {"running_mean": running_mean, "running_var": running_var, "weight": weight,
                                 "bias": bias})
    check_floating_running(owner, {"running_mean": (running_mean, f"torch.zeros({channels})"),
                                   "running_var": (running_var, f"torch.ones({channels})")})
    if training:
        check_running_updatable(owner, {"running_mean": running_mean, "running_var": running_var})
        check_single_values(owner, x, groups, groups, examples_per_group)
    else:
        check_own_single_values(owner, x, groups, eval_example_weight)
        # a traced graph would keep the check's outcome as a constant; alpha = 1 gives the running statistics no weight
        if not torch.jit.is_tracing() and eval_example_weight < 1.0:
            check_evaluation_statistics(owner, {"running_mean": running_mean, "running_var": running_var})


def check_own_single_values(owner: str, x: Tensor, groups: int, eval_example_weight: float) -> None:
    """Raise ``ValueError`` when, in evaluation with ``eval_example_weight=1`` (each example
    normalized by its own statistics alone, Eq. 3 with alpha = 1), each of the ``groups`` channel
    groups of an example of ``x`` holds a single value, which normalizes to 0 for any input: what
    :meth:`BatchGroupNorm.validate_input` refuses, for the functional form."""
    if eval_example_weight == 1.0 and x.numel() and x.numel() // x.shape[0] == groups:
        raise GwdetValueError(
            f"{owner}: in evaluation with eval_example_weight=1 each example is normalized by its own statistics, and "
            f"an input of shape {list(x.shape)} gives each of its channel groups a single value (groups={groups} for "
            f"{x.shape[1]} channels, one position), which normalizes to 0 for any input. Use an eval_example_weight "
            f"below 1, which blends in the running statistics, or fewer channel groups (a smaller groups that divides "
            f"the {x.shape[1]} channels)")


def check_single_values(owner: str, x: Tensor, num_groups: int, groups: int, examples_per_group: int) -> None:
    """Raise ``ValueError`` when a training input ``x`` leaves an (example group x channel group)
    block of a single value, which normalizes to 0 whatever it holds (as torch's batch norm refuses):
    one channel per group (``groups`` of the channels, asked as ``num_groups``), one position and an
    example group of one example."""
    if x.numel() == 0:
        return
    examples, num_channels = x.shape[0], x.shape[1]
    # the smallest example group: the whole batch, the remainder at its end, or a full one
    smallest = examples if examples < examples_per_group else examples % examples_per_group
    if smallest == 0:
        smallest = examples_per_group
    channels = num_channels // groups
    positions = x.numel() // (examples * num_channels)
    if smallest * channels * positions == 1:
        if examples_per_group == 1:
            why = "examples_per_group=1 puts each example in a group of its own"
        elif examples < examples_per_group:
            why = f"the batch of 1 example is smaller than examples_per_group={examples_per_group}"
        else:
            why = (f"examples_per_group={examples_per_group} does not divide the batch of {examples} "
                   "examples, whose last example group has 1 example")
        raise GwdetValueError(
            f"{owner}: in training, an input of shape {list(x.shape)} leaves an (example group x "
            f"channel group) block of a single value: {why}, with one channel per group "
            f"(num_groups={num_groups} for {num_channels} channels) and one position. A single "
            "value normalizes to 0 for any input (batch norm refuses it too: expected more than 1 value "
            "per channel when training). "
            + _single_value_fixes(owner, "an examples_per_group of at least 2 that divides the batch size",
                                  "EXAMPLES_PER_GROUP", num_channels))


def _single_value_fixes(owner: str, first: str, key: str, channels: int, effect: str = "") -> str:
    """The fixes of a refused single value per block, as a sentence: ``first`` (the setting of
    ``key``: the layer's argument of that name in lower case, ``MODEL.BGN.<key>`` in a yacs config;
    ``effect`` says what it does), a larger input, or groups of several channels: for the layer a
    ``num_groups`` below the channel count, which BGN reads and GhostBN (one channel per group
    whatever it is given) does not; for the functional form (``owner`` other than the layer's) its
    ``groups`` argument."""
    if owner != "BatchGroupNorm":
        return (f"Use {first}{effect}, a larger input (more than one position per channel), or a smaller groups "
                f"that divides the {channels} channels")
    return (f"Use {first} (the layer's {key.lower()} argument; yacs: MODEL.BGN.{key}){effect}, a larger input "
            "(more than one position per channel: for a backbone or FPN level, larger images), or groups of several "
            "channels: "
            f"a num_groups below {channels} (yacs: MODEL.BGN.NUM_GROUPS) for BGN. GhostBN has one channel per group "
            "(it takes no num_groups; yacs: MODEL.BGN.NUM_GROUPS does not change it), so for GhostBN it is "
            f"the {key.lower()} or a larger input")


def _batch_group_norm(x: Tensor, running_mean: Tensor, running_var: Tensor, weight: Optional[Tensor],
                      bias: Optional[Tensor], training: bool, groups: int, examples_per_group: int, eps: float,
                      momentum: float, eval_example_weight: float) -> Tensor:
    """:func:`batch_group_norm` of checked arguments (what :class:`BatchGroupNorm` runs)."""
    if x.numel() == 0:
        normalized = x
    else:
        # (N, C, S) with every size but N explicit (reshape_with_samples): a recorded graph meets
        # N = 0 (a head without ROIs), and then the positions could not be inferred from the elements
        shape = list(x.shape)
        values = reshape_with_samples(x.to(statistics_dtype(x.dtype)), [shape[0], shape[1], product(shape[2:])])
        channels = values.shape[1]
        if training:
            mean, var, corrected_var, scales = _example_group_moments(values, groups, examples_per_group)
            # the block statistics averaged over the examples, in the units of x (detached: torch.export
            # cannot save a no_grad region)
            batch_mean = _to_channels((mean / scales).detach(), channels).mean(dim=0)
            batch_var = _to_channels((corrected_var / scales / scales).detach(), channels).mean(dim=0)
            running_mean.lerp_(batch_mean.to(running_mean.dtype), momentum)
            running_var.lerp_(batch_var.to(running_var.dtype), momentum)
            mean = _to_channels(mean, channels)
            var = _to_channels(var, channels)
            scales = _to_channels(scales, channels)
        else:
            mean, var, scales = _inference_statistics(values, running_mean, running_var, groups, eval_example_weight)
        # (x / s - mu') / sqrt(var' + eps / s^2), all of (n, C)
        inverse_std = torch.rsqrt(var + scaled_ridge(eps, scales)).unsqueeze(-1)
        centred = torch.addcmul(-mean.unsqueeze(-1), values, scales.unsqueeze(-1))
        normalized = reshape_with_samples(centred * inverse_std, shape)
    # the affine in the statistics dtype, then one rounding to the input's (as the fused GW op)
    return per_channel_affine(normalized, weight, bias).to(x.dtype)


def _example_group_moments(
    values: Tensor, groups: int, examples_per_group: int
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """:func:`_block_moments` with blocks of ``examples_per_group`` consecutive examples,
    the last ``N mod examples_per_group`` examples forming one smaller block."""
    num_examples = values.shape[0]
    if examples_per_group >= num_examples:  # one block of the whole batch, before ``%``: TorchScript's int
        # remainder overflows for a count near int64's maximum (example weighing's whole-batch groups)
        return _block_moments(values, num_examples, groups)
    grouped_examples = num_examples - num_examples % examples_per_group
    if grouped_examples == num_examples:
        return _block_moments(values, examples_per_group, groups)
    head = _block_moments(values[:grouped_examples], examples_per_group, groups)
    tail = _block_moments(values[grouped_examples:], num_examples - grouped_examples, groups)
    return (
        torch.cat([head[0], tail[0]]),
        torch.cat([head[1], tail[1]]),
        torch.cat([head[2], tail[2]]),
        torch.cat([head[3], tail[3]]),
    )


def _inference_statistics(
    values: Tensor, running_mean: Tensor, running_var: Tensor, groups: int, alpha: float
) -> Tuple[Tensor, Tensor, Tensor]:
    """Eq. 3: the example's own moments blended with the running ones, per example/channel,
    for the example scaled by ``1/s`` (the running moments scaled along); returns the mean, the
    variance and the factors ``1/s``, each ``(n, C)``."""
    channels = values.shape[1]
    if alpha == 0.0:  # batch norm's inference: the running moments alone, in the units of x (no scaling,
        # whose ridge floor would outweigh a running variance scaled down for a huge input)
        shape = [values.shape[0], channels]
        running_var = running_var.to(values.dtype)
        running_var = torch.where(torch.isinf(running_var), torch.full_like(running_var, float("nan")), running_var)
        return (running_mean.to(values.dtype).expand(shape), running_var.expand(shape),
                torch.ones(shape, dtype=values.dtype, device=values.device))
    own_mean, own_var, _, scales = _block_moments(values, 1, groups)
    own_mean = _to_channels(own_mean, channels)
    own_var = _to_channels(own_var, channels)
    scales = _to_channels(scales, channels)
    if alpha == 1.0:  # group norm: the running moments have no weight (even an infinite one)
        return own_mean, own_var, scales
    running_mean = running_mean.to(values.dtype) * scales
    running_var = running_var.to(values.dtype) * scales * scales
    mean = alpha * own_mean + (1.0 - alpha) * running_mean
    var = (
        alpha * own_var
        + (1.0 - alpha) * running_var
        + alpha * (1.0 - alpha) * (own_mean - running_mean) ** 2
    )
    # a running variance that overflowed (see the module docstring) has no value to blend
    var = torch.where(torch.isinf(running_var), torch.full_like(var, float("nan")), var)
    return mean, var, scales


def _block_moments(values: Tensor, examples: int, groups: int) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Mean, biased and Bessel-corrected variance of each (``examples`` consecutive examples
    x channel group) block of ``values`` ``(n, C, S)`` divided by the block's ``s``, and the
    factor ``1/s`` (:func:`~.common.magnitude_scales`: 1 unless the block is huge); ``n`` a
    multiple of ``examples``; each of shape ``(n, G)``, repeated for every example of a block."""
    num_examples, channels, positions = values.shape
    blocks = reshape_with_samples(values, [num_examples // examples, examples, groups, channels // groups * positions])
    scales = magnitude_scales(largest_magnitude(blocks, [1, 3]))
    var, mean = torch.var_mean(blocks * scales, dim=[1, 3], unbiased=False, keepdim=True)
    block_size = examples * blocks.shape[-1]
    bessel = block_size / (block_size - 1) if block_size > 1 else 1.0
    expanded = [num_examples // examples, examples, groups, 1]
    mean = reshape_with_samples(mean.expand(expanded), [num_examples, groups])
    var = reshape_with_samples(var.expand(expanded), [num_examples, groups])
    scales = reshape_with_samples(scales.expand(expanded), [num_examples, groups])
    return mean, var, var * bessel, scales


def _to_channels(group_statistic: Tensor, channels: int) -> Tensor:
    """Repeat an ``(n, G)`` per-group statistic for every channel of its group: ``(n, C)``."""
    return group_statistic.repeat_interleave(channels // group_statistic.shape[1], dim=1)


class BatchGroupNorm(SettingsInState):
    """Normalization over groups of examples times groups of channels (Four Things Sec. 3.4).

    Args:
        num_channels: ``C``, the size of dim 1 of the input.
        num_groups: requested channel-group count; :attr:`effective_num_groups` is the count
            actually used (largest divisor of ``C`` that is ``<= num_groups``).
        examples_per_group: consecutive examples sharing statistics in training, ``>= 1``.
        eps: added to the variance, ``> 0``.
        momentum: weight of the batch statistics in the running averages, in [0, 1].
        eval_example_weight: ``alpha`` of inference example weighing (Eq. 3), in [0, 1].
        affine: learn ``weight`` and ``bias`` of shape ``[C]`` (initialised to 1 and 0).
        device, dtype: where and in which floating-point dtype the parameters and buffers are
            created, as torch's batch norm takes them (``None``: torch's defaults);
            ``device="meta"`` builds them without memory (``torch.nn.utils.skip_init`` uses it).

    Buffers: ``running_mean`` (starts at 0) and ``running_var`` (starts at 1), both ``[C]``.

    Arguments are checked as :class:`~.group_whitening.GroupWhitening`'s, and the state dict
    records the settings (:mod:`~.settings_state`). In training, a batch in which a block holds a
    single value is refused, as batch norm refuses one (:meth:`validate_input`). In evaluation with
    ``eval_example_weight < 1``, running statistics no training computes (a NaN, a negative variance)
    and ones that overflowed to ``inf`` in training (float16 buffers: build the layer in float32 and
    use autocast) are refused, checked once after each change
    (:func:`~.common.check_layer_evaluation_statistics`).
    """

    HYPER_PARAMETERS = ("num_groups", "examples_per_group", "eps", "momentum", "eval_example_weight")
    DERIVED = ("effective_num_groups",)
    weight: Optional[Tensor]
    bias: Optional[Tensor]
    running_mean: Tensor
    running_var: Tensor

    def __init__(
        self,
        num_channels: int,
        num_groups: int = 32,
        examples_per_group: int = 2,
        eps: float = 1e-5,
        momentum: float = 0.1,
        eval_example_weight: float = 0.0,
        affine: bool = True,
        device: Optional[Union[torch.device, str, int]] = None,
        dtype: Optional[torch.dtype] = None,
    ) -> None:
        super().__init__()
        owner = type(self).__name__
        check_hyper_parameters(
            owner, {"num_channels": num_channels, "num_groups": num_groups, "examples_per_group": examples_per_group},
            positive={"eps": eps}, unit_interval={"momentum": momentum, "eval_example_weight": eval_example_weight},
            flags={"affine": affine},
        )
        factory = factory_kwargs(owner, device, dtype)
        self.num_channels = int(num_channels)
        self.num_groups = int(num_groups)
        self.effective_num_groups = largest_divisor_at_most(self.num_channels, self.num_groups)
        self.examples_per_group = int(examples_per_group)
        self.eps = float(eps)
        self.momentum = float(momentum)
        self.eval_example_weight = float(eval_example_weight)
        self.affine = bool(affine)
        with allocating_channels(owner, self.num_channels):
            register_affine(self, self.num_channels, affine, factory)
            self.register_buffer("running_mean", torch.zeros(self.num_channels, **factory))
            self.register_buffer("running_var", torch.ones(self.num_channels, **factory))

    def reset_running_stats(self) -> None:
        """The running mean and variance back to zeros and ones."""
        with torch.no_grad():
            self.running_mean.zero_()
            self.running_var.fill_(1.0)

    def reset_parameters(self) -> None:
        """Every parameter and buffer back to its initial value (as torch's batch norm does:
        ``module.to_empty(device=...)`` after a build on the meta device needs it)."""
        self.reset_running_stats()
        reset_affine(self)

    def forward(self, x: Tensor) -> Tensor:
        if torch.jit.is_scripting():
            check_scripted_settings("BatchGroupNorm", self.num_channels,
                                    {"num_groups": [self.num_groups, self.effective_num_groups]},
                                    {"examples_per_group": self.examples_per_group}, {"eps": self.eps},
                                    {"momentum": self.momentum, "eval_example_weight": self.eval_example_weight})
        self.validate_input(x)
        return _batch_group_norm(
            x, self.running_mean, self.running_var, self.weight, self.bias, self.training,
            self.effective_num_groups, self.examples_per_group, self.eps, self.momentum,
            self.eval_example_weight,
        )

    def replaces_batch_norm(self) -> bool:
        """Whether the layer stands in for a torch batch norm: one channel per group and example
        groups of :data:`WHOLE_BATCH` examples, which hold every batch, so it trains as batch norm
        (``gwdet.modeling.example_weighing`` builds such layers in place of a model's batch norms)."""
        return self.num_groups == self.num_channels and self.examples_per_group == WHOLE_BATCH

    def _load_from_state_dict(self, state_dict: Dict[str, Any], prefix: str, local_metadata: Dict[str, Any],
                              strict: bool, missing_keys: List[str], unexpected_keys: List[str],
                              error_msgs: List[str]) -> None:
        """:class:`SettingsInState`'s loading; where the layer replaced a batch norm
        (:meth:`replaces_batch_norm`) and torch finds that batch norm's ``num_batches_tracked``
        unexpected (a state saved before example weighing), a ``GwdetRuntimeWarning`` names the layer
        and the fix, once for the whole load (by the first such layer). A warning, not an error: torch
        gives a layer no way to tell a strict load, which fails on that key anyway, from a
        ``strict=False`` one, which loads the rest correctly."""
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
        tracked = prefix + _BATCHES_TRACKED
        first = next((key for key in unexpected_keys if key.rpartition(".")[2] == _BATCHES_TRACKED), None)
        if first == tracked and prefix + EXTRA_STATE_KEY not in state_dict and self.replaces_batch_norm():
            warnings.warn(
                f"{prefix[:-1] or 'the layer'} (BatchGroupNorm): the state's {tracked!r} is of the torch batch norm "
                "that example weighing (apply_example_weighing or example_weighted_norm) replaced with this "
                "example-weighted BatchGroupNorm, which keeps no num_batches_tracked: the state was saved before "
                "example weighing, and torch names that key unexpected (an error with strict=True; torch's "
                "unexpected keys name every such key). Load the weights into the model first, then apply example "
                "weighing (model.load_state_dict(state), then apply_example_weighing(model, weight)), or delete the "
                "num_batches_tracked keys from the state dict; with strict=False the rest (running statistics and "
                "affine) loads as it is.",
                GwdetRuntimeWarning, stacklevel=2)

    def validate_input(self, x: Tensor) -> None:
        """Raise ``ValueError`` for a wrong shape or dtype or, in training, an (example group x
        channel group) block of a single value, which normalizes to 0 whatever it holds (as torch's
        batch norm does): one channel per group, one position and an example group of one example;
        so too in evaluation with ``eval_example_weight=1``, where each example's own statistics are
        all there is (Eq. 3 with alpha = 1); in evaluation with ``eval_example_weight < 1``, running
        statistics no training computes or that overflowed to ``inf``."""
        check_input("BatchGroupNorm", x, self.num_channels)
        if not torch.jit.is_scripting():  # a weight.data of another size, or one given to torch.func.functional_call
            check_per_channel("BatchGroupNorm", {"weight": self.weight, "bias": self.bias, "running_mean": self.running_mean,
                                                 "running_var": self.running_var}, self.num_channels)
            if not self.training and self.eval_example_weight < 1.0:  # alpha = 1: the running statistics have no weight
                check_layer_evaluation_statistics(self, {"running_mean": self.running_mean,
                                                         "running_var": self.running_var})
        if not torch.jit.is_scripting() and self.training and torch.jit.is_tracing():
            warnings.warn(
                f"BatchGroupNorm: traced in training mode, the trace splits every batch into the example groups of "
                f"this one ({x.shape[0]} examples, {self.examples_per_group} per group) and fails on a batch of "
                "another size. Trace in evaluation mode (model.eval()), which groups no examples.",
                GwdetRuntimeWarning, stacklevel=2)
        if self.training:
            check_single_values("BatchGroupNorm", x, self.num_groups, self.effective_num_groups,
                                self.examples_per_group)
        elif self.eval_example_weight == 1.0 and x.numel() and x.numel() // x.shape[0] == self.effective_num_groups:
            raise GwdetValueError(
                f"BatchGroupNorm: in evaluation with eval_example_weight=1 each example is normalized by its own "
                f"statistics, and an input of shape {list(x.shape)} gives each of its channel groups a single value "
                f"(num_groups={self.num_groups} for {self.num_channels} channels: one channel per group, and one "
                "position), which normalizes to 0 for any input. "
                + _single_value_fixes("BatchGroupNorm", "an eval_example_weight below 1", "EVAL_EXAMPLE_WEIGHT",
                                      self.num_channels, ", which blends in the running statistics"))
