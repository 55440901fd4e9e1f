"""gwdet: group whitening and related normalizers for detectron2.

``import gwdet`` registers gwdet's backbones and heads in detectron2's registries; it changes no
detectron2 function. Norm layers get their hyper-parameters explicitly: :func:`norm` returns a
callable that detectron2 accepts wherever it takes a norm, and gwdet's registered components turn a
config's NORM string into one with that config's values (:func:`norm_from_config`). gwdet's norm
layers get the norm weight decay when the optimizer is built with :func:`build_optimizer` (yacs)
or :func:`get_default_optimizer_params` (LazyConfig); see :mod:`gwdet.solver`. Every refusal of
gwdet's is a :class:`GwdetError` (:mod:`gwdet.errors`).
"""
import warnings

with warnings.catch_warnings():
    # detectron2 and fvcore script a few helpers with torch.jit.script when first imported, which
    # PyTorch >= 2.9 reports as deprecated: a note about their code, not the user's, so it is
    # silenced for these imports only.
    warnings.filterwarnings("ignore", message="`torch.jit.script` is deprecated", category=FutureWarning)
    from gwdet.config import add_gwdet_config
    from gwdet.config_checks import NormConfigError, check_gwdet_config
    from gwdet.errors import GwdetError
    from gwdet.modeling import (
        build_gw_resnet_backbone,
        build_gw_resnet_fpn_backbone,
        build_gw_retinanet_resnet_fpn_backbone,
        build_model,
        check_model,
        place_norm,
    )
    from gwdet.norms import Norm, UnknownNormError, known_norm_names, norm, norm_from_config, register_norm
    from gwdet.solver import build_optimizer, get_default_optimizer_params

__all__ = [
    "GwdetError",
    "Norm",
    "NormConfigError",
    "UnknownNormError",
    "add_gwdet_config",
    "build_optimizer",
    "build_gw_resnet_backbone",
    "build_gw_resnet_fpn_backbone",
    "build_gw_retinanet_resnet_fpn_backbone",
    "build_model",
    "check_gwdet_config",
    "check_model",
    "get_default_optimizer_params",
    "known_norm_names",
    "norm",
    "norm_from_config",
    "place_norm",
    "register_norm",
]
__version__ = "0.1.0"
