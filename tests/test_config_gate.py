"""One gate: the whole-config check runs once per config content, whatever builds the model
(gwdet.build_model, the trainer, detectron2's own build_model with gwdet's components), and a value
changed after the check is checked again before a component uses it."""
import pytest
import torch
from detectron2.config import get_cfg
from detectron2.modeling import build_model as detectron2_build_model

import gwdet
from gwdet import config_checks
from gwdet.config import add_gwdet_config
from gwdet.engine.trainer import Trainer
from gwdet.model_zoo import build_config

from conftest import DEMO_CONFIG, TINY_OPTS


@pytest.fixture
def checks(monkeypatch):
    """How many times the whole-config check ran (its first step counted)."""
    calls = []
    original = config_checks.check_config_values

    def counted(cfg):
        calls.append(1)
        return original(cfg)

    monkeypatch.setattr(config_checks, "check_config_values", counted)
    return calls


def plain_config():
    """The demo config as a detectron2 user builds one, without gwdet's loader (no check yet)."""
    cfg = add_gwdet_config(get_cfg())
    cfg.merge_from_file(str(DEMO_CONFIG))
    cfg.merge_from_list(TINY_OPTS)
    return cfg


def test_gwdet_build_model_checks_the_config_once(checks):
    gwdet.build_model(plain_config())
    assert len(checks) == 1


def test_detectron2_build_model_with_gwdet_components_checks_once(checks):
    detectron2_build_model(plain_config())  # the backbone and both heads are gwdet's components
    assert len(checks) == 1


def test_a_config_read_by_gwdet_is_not_checked_again_by_the_trainer_s_build(checks):
    cfg = build_config(str(DEMO_CONFIG), TINY_OPTS)
    assert len(checks) == 1
    Trainer.build_model(cfg)
    Trainer.build_model(cfg.clone())  # a copy carries the check with its content
    assert len(checks) == 1


def test_a_value_changed_after_the_check_is_checked_again(checks):
    cfg = build_config(str(DEMO_CONFIG), TINY_OPTS)
    cfg.defrost()
    cfg.MODEL.GW.NUM_GROUPS = 0
    with pytest.raises(ValueError, match="MODEL.GW.NUM_GROUPS"):
        detectron2_build_model(cfg)
    assert len(checks) == 2
    cfg.MODEL.GW.NUM_GROUPS = 4
    model = gwdet.build_model(cfg)
    assert len(checks) == 3
    assert isinstance(model, torch.nn.Module)
