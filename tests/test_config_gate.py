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


def counted_calls(monkeypatch, module, name: str) -> list:
    """A list that gets an entry at each call of ``module.name`` (which still runs)."""
    calls = []
    original = getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


@pytest.fixture
def checks(monkeypatch):
    """How many times the whole-config check ran (its first step counted)."""
    return counted_calls(monkeypatch, config_checks, "check_config_values")


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


# before: the refusal quoted SOLVER.IMS_PER_BATCH=2, a batch the user never gave, without naming the rescaling
def test_a_refused_batch_names_detectron2s_rescaling_of_it():
    from detectron2.engine import DefaultTrainer
    cfg = build_config(str(DEMO_CONFIG), [*TINY_OPTS, "SOLVER.IMS_PER_BATCH", "4", "SOLVER.REFERENCE_WORLD_SIZE", "2",
                                          "MODEL.RESNETS.GW_NORM", "BGN", "MODEL.BGN.EXAMPLES_PER_GROUP", "4",
                                          "MODEL.BGN.NUM_GROUPS", "16"])
    scaled = DefaultTrainer.auto_scale_workers(cfg, 1)  # what detectron2's trainer builds its model with
    with pytest.raises(gwdet.errors.GwdetValueError,
                       match=r"MODEL.BGN.EXAMPLES_PER_GROUP=4 is larger than SOLVER.IMS_PER_BATCH=2 \(detectron2 "
                             r"rescaled SOLVER.IMS_PER_BATCH from the 4 given to 2: SOLVER.REFERENCE_WORLD_SIZE is 2, "
                             r"and the run has 1 process\(es\); set SOLVER.REFERENCE_WORLD_SIZE 0 to train with the "
                             r"batch as given\), so no example group can be filled"):
        Trainer.build_model(scaled)


# the tools' LazyConfig path checked the norm and call nodes twice: at LazyRun.load and again in its build_model
def test_a_lazyconfig_read_by_gwdet_has_its_nodes_checked_once_per_model_build(monkeypatch):
    from gwdet.engine import lazy

    from test_lazy_training import LAZY_DEMO, LAZY_TINY

    calls = counted_calls(monkeypatch, lazy, "check_norm_nodes")
    run = lazy.LazyRun.load(str(LAZY_DEMO), LAZY_TINY)
    assert len(calls) == 1
    assert isinstance(run.build_model(), torch.nn.Module)
    assert len(calls) == 1
    lazy.build_model(run.cfg)  # a config given in Python is checked where it enters
    assert len(calls) == 2
