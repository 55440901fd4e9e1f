"""The hooks a module carries, for code that replaces a module by another (example weighing's
batch norms, ``place_norm``'s norms): forward and backward hooks move to the replacement, with
their handles; state-dict hooks, written for the replaced module's state dict, and pruning do not."""
from __future__ import annotations

from torch import nn
from torch.nn.utils import prune

# a module's hook dicts that move to its replacement, and those written for its state dict
_MODULE_HOOKS = ("_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
                 "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_backward_hooks", "_backward_pre_hooks")
_STATE_DICT_HOOKS = ("_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
                     "_load_state_dict_post_hooks")


def state_dict_hooks(module: nn.Module) -> list[str]:
    """What ``module`` carries that cannot move to a replacement: the kinds of its state-dict hooks
    (``_state_dict_hooks``, ...) and a ``torch.nn.utils.prune`` pruning (its forward pre-hook
    computes ``weight`` from ``weight_orig`` and ``weight_mask``, which a replacement has not); none: ``[]``."""
    pruned = any(isinstance(hook, prune.BasePruningMethod) for hook in module._forward_pre_hooks.values())
    return [kind for kind in _STATE_DICT_HOOKS if getattr(module, kind)] + \
        (["a pruning of torch.nn.utils.prune: prune.remove(module, name) makes it permanent"] if pruned else [])


def move_hooks(replaced: nn.Module, replacement: nn.Module) -> None:
    """Give ``replacement`` the forward and backward hooks of ``replaced``: the same dicts, so that
    the hooks' handles still remove them."""
    for kind in _MODULE_HOOKS:
        setattr(replacement, kind, getattr(replaced, kind))
    replacement._is_full_backward_hook = replaced._is_full_backward_hook
