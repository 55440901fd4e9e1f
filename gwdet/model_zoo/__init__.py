"""gwdet's configs, from any working directory (detectron2's ``model_zoo`` convention)::

    from gwdet import model_zoo

    model_zoo.get_config_file("mask_rcnn_gw.yaml")                        # absolute path
    cfg = model_zoo.get_config("Demo/mask_rcnn_R_50_FPN_gw_shapes.yaml")  # yacs CfgNode, gwdet keys added
    lazy = model_zoo.get_config("LazyConfig/mask_rcnn_R_50_FPN_gw.py")    # LazyConfig (OmegaConf DictConfig)
    model_zoo.list_configs()                                              # every config the two accept

gwdet publishes no trained weights of its configs, so ``get_config(name, trained=True)`` (detectron2's
argument) is refused with what to do instead (:func:`get_config`).

Names are paths relative to the repository's ``configs/`` folder: a wheel carries it as
``gwdet/model_zoo/configs``, a source checkout or editable install reads the checkout's own.
:func:`resolve_config_argument` lets the tools fall back on a packaged config when no such file
exists locally; :func:`detectron2_lazy_config` loads detectron2's packaged LazyConfigs without
detectron2's ``model_zoo`` (:mod:`gwdet.model_zoo.detectron2_configs`); :func:`build_config` reads
a yacs config file as every gwdet tool does (:mod:`gwdet.model_zoo.loading`).
"""
from typing import Any, NoReturn

from gwdet.errors import GwdetAttributeError
from gwdet.model_zoo.detectron2_configs import (
    detectron2_config_file,
    detectron2_configs_dir,
    detectron2_lazy_config,
)
from gwdet.model_zoo.loading import build_config, get_config
from gwdet.model_zoo.model_zoo import (
    configs_dir,
    get_config_file,
    list_configs,
    resolve_config_argument,
    resolve_config_file,
)

__all__ = ["build_config", "detectron2_config_file", "detectron2_configs_dir", "detectron2_lazy_config", "configs_dir", "get_config", "get_config_file", "list_configs", "resolve_config_argument", "resolve_config_file"]


def _published_weights_refusal(name: str) -> GwdetAttributeError:
    return GwdetAttributeError(
        f"gwdet.model_zoo has no {name}(): detectron2's model_zoo.{name} builds or points at its zoo's trained "
        "models, and gwdet publishes none. Build a model with gwdet.build_model(gwdet.model_zoo.get_config(NAME)); "
        "train it with tools/train_net.py (or gwdet-train) for weights; ImageNet backbones: docs/weights.md.")


def get(*args: Any, **kwargs: Any) -> NoReturn:
    """detectron2's ``model_zoo.get`` (a trained model of its zoo), refused with what to use instead:
    gwdet publishes no trained weights. A function, so that ``from gwdet.model_zoo import get``
    (detectron2's import) reaches the message too."""
    raise _published_weights_refusal("get")


def get_checkpoint_url(*args: Any, **kwargs: Any) -> NoReturn:
    """detectron2's ``model_zoo.get_checkpoint_url``, refused as :func:`get` is."""
    raise _published_weights_refusal("get_checkpoint_url")
