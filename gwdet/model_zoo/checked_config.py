"""The type of the configs :func:`gwdet.model_zoo.build_config` returns (checked and frozen).

yacs refuses a key set on a frozen config with "Attempted to set DEVICE to cpu, but CfgNode is
immutable", which names neither the key's section nor how to change it. :class:`CheckedConfig` is
detectron2's ``CfgNode`` with that refusal naming the key and the ways to change it; everything
else (merging, cloning, dumping, ``defrost``) is detectron2's.
"""
from __future__ import annotations

import reprlib
from typing import Any, Sequence

from detectron2.config import CfgNode

from gwdet.errors import GwdetAttributeError

# the attribute (beside yacs' own flags, not a config key) that holds a node's full key
KEY_ATTRIBUTE = "_gwdet_key"


class CheckedConfig(CfgNode):
    """detectron2's ``CfgNode`` whose nodes know their full key (``MODEL.RESNETS``), so that a key
    set while the config is frozen is refused naming it and the fix; unfrozen (``cfg.defrost()``,
    :func:`gwdet.model_zoo.get_config`), it takes keys as any ``CfgNode``."""

    def __setattr__(self, name: str, value: Any) -> None:
        if self.is_frozen() and not name.startswith("_"):
            key = ".".join(filter(None, (self.__dict__.get(KEY_ATTRIBUTE, ""), name)))
            raise GwdetAttributeError(
                f"Cannot set {key} to {reprlib.repr(value)}: this config is frozen (gwdet.model_zoo.build_config "
                f"returns it checked and frozen, as detectron2's tools freeze theirs). Give the change as an override, "
                f"build_config(path, [{key!r}, {str(value)!r}]), or call cfg.defrost() first (gwdet checks the config "
                "again when it builds from it); gwdet.model_zoo.get_config returns a config that is not frozen.")
        super().__setattr__(name, value)


def checked_frozen(cfg: CfgNode) -> CheckedConfig:
    """``cfg`` (checked by :func:`gwdet.check_gwdet_config`) as a frozen :class:`CheckedConfig`: its
    keys and values, and the attributes beside them (yacs' flags, gwdet's record of the content it
    checked)."""
    copy = CheckedConfig(cfg)
    _copy_attributes(cfg, copy, [])
    copy.freeze()
    return copy


def _copy_attributes(source: CfgNode, target: CfgNode, keys: Sequence[str]) -> None:
    """Give ``target`` and each node under it the attributes of ``source``'s node at the same key
    (yacs' constructor keeps the keys only), and its full key."""
    target.__dict__.update(source.__dict__)
    target.__dict__[KEY_ATTRIBUTE] = ".".join(keys)
    for name, value in source.items():
        if isinstance(value, CfgNode):
            _copy_attributes(value, target[name], [*keys, name])
