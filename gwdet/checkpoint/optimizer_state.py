"""Whether a saved optimizer state fits the optimizer it is loaded into.

torch's ``Optimizer.load_state_dict`` refuses a state of another number of parameter groups, or
of groups of other sizes, only when it is called, which a checkpointer does after the model's
weights were replaced; a state of the right group sizes whose per-parameter buffers have other
shapes (the optimizer of another model) it loads, and the first step fails. :func:`optimizer_state_problem`
finds both before anything is loaded.
"""
from __future__ import annotations

from itertools import chain
from typing import Any, Mapping

import torch

from gwdet.errors import listed

# the per-parameter buffers of torch's optimizers that have their parameter's shape (SGD, Adam,
# AdamW, Adagrad, RMSprop, Adadelta)
PARAMETER_SHAPED_STATE = ("momentum_buffer", "exp_avg", "exp_avg_sq", "max_exp_avg_sq", "sum", "square_avg",
                          "acc_delta", "grad_avg")


def optimizer_state_problem(optimizer: Any, state: Any, parameter_names: Mapping[int, str]) -> str | None:
    """What keeps ``state`` (a saved ``optimizer.state_dict()``) from fitting ``optimizer`` (a
    ``torch.optim.Optimizer``), or ``None``: another number of parameter groups, groups of other
    sizes, or a buffer of :data:`PARAMETER_SHAPED_STATE` whose shape is not its parameter's.
    ``parameter_names``: the model's parameter names by ``id`` of the parameter, named in the
    message. ``None`` too for an optimizer that is not torch's, or a state not of torch's layout
    (torch's own ``load_state_dict`` says what it refuses)."""
    if not isinstance(optimizer, torch.optim.Optimizer) or not isinstance(state, Mapping):
        return None
    saved_groups = state.get("param_groups")
    if not isinstance(saved_groups, (list, tuple)) or not all(
            isinstance(group, Mapping) and isinstance(group.get("params"), (list, tuple)) for group in saved_groups):
        return None
    saved_sizes = [len(group["params"]) for group in saved_groups]
    own_sizes = [len(group["params"]) for group in optimizer.param_groups]
    if saved_sizes != own_sizes:
        return (f"the saved state has {len(saved_sizes)} parameter group(s) of {listed(map(str, saved_sizes), 8)} "
                f"parameter(s), this optimizer {len(own_sizes)} of {listed(map(str, own_sizes), 8)}")
    buffers = state.get("state")
    if not isinstance(buffers, Mapping):
        return None
    saved_ids = chain.from_iterable(group["params"] for group in saved_groups)
    own_parameters = chain.from_iterable(group["params"] for group in optimizer.param_groups)
    for saved_id, parameter in zip(saved_ids, own_parameters, strict=True):  # the group sizes are equal
        entry = buffers.get(saved_id)
        if not isinstance(entry, Mapping):
            continue
        for key in PARAMETER_SHAPED_STATE:
            value = entry.get(key)
            if isinstance(value, torch.Tensor) and value.shape != parameter.shape:
                name = parameter_names.get(id(parameter), "a parameter the model does not hold")
                return (f"the saved {key} of parameter {saved_id} has shape {list(value.shape)}, but this optimizer's "
                        f"parameter at that place ({name}) has shape {list(parameter.shape)}")
    return None
