"""gwdet's norm layers get detectron2's norm weight decay (SOLVER.WEIGHT_DECAY_NORM / weight_decay_norm)
exactly as detectron2's own norms do, for every config gwdet ships (gwdet.solver)."""
from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import torch
from detectron2.config import CfgNode, LazyConfig, instantiate
from detectron2.solver import build_optimizer as detectron2_build_optimizer
from detectron2.solver import get_default_optimizer_params as detectron2_optimizer_params
from torch import nn

import gwdet
from conftest import REPO
from gwdet.engine.trainer import Trainer
from gwdet.model_zoo import build_config
from gwdet.layers import BatchGroupNorm, BatchWhitening, GroupWhitening
from gwdet.modeling import check_model
from gwdet.norms import register_norm, unregister_norm
from gwdet.solver import get_default_optimizer_params

# What this test counts as a norm layer, written out independently of gwdet.solver.is_norm_layer.
NORM_CLASSES = (nn.modules.batchnorm._BatchNorm, nn.GroupNorm, GroupWhitening, BatchWhitening, BatchGroupNorm)
GWDET_CLASSES = (GroupWhitening, BatchWhitening, BatchGroupNorm)
YACS_CONFIGS = sorted(p for p in (REPO / "configs").rglob("*.yaml"))
LAZY_CONFIGS = sorted(p for p in (REPO / "configs" / "LazyConfig").rglob("*.py")
                      if p.name != "gw_parts.py" and "common" not in p.parts)
# Built on the meta device: no weights are initialised, so even the X-101 configs build in a moment.
META = ["MODEL.DEVICE", "meta", "MODEL.WEIGHTS", ""]


def decay_by_parameter(groups, default: float) -> dict[nn.Parameter, float]:
    return {p: group.get("weight_decay", default) for group in groups for p in group["params"]}


def norm_layer_parameters(model: nn.Module) -> list[tuple[str, str, nn.Parameter, nn.Module]]:
    return [(name, param_name, param, module) for name, module in model.named_modules()
            if isinstance(module, NORM_CLASSES)
            for param_name, param in module.named_parameters(recurse=False) if param.requires_grad]


def check_every_norm_parameter(model, optimizer, weight_decay_norm, weight_decay) -> int:
    """Every norm parameter has the norm decay, every other one the ordinary decay; returns how many
    gwdet norm parameters there are."""
    decays = decay_by_parameter(optimizer.param_groups, optimizer.defaults["weight_decay"])
    norm_params = norm_layer_parameters(model)
    wrong = [f"{name}.{param_name}: {decays[param]}" for name, param_name, param, _ in norm_params
             if decays[param] != weight_decay_norm]
    assert not wrong, f"norm parameters not decayed by {weight_decay_norm}: {wrong[:5]}"
    in_norms = {param for *_, param, _ in norm_params}
    others = [p for p in decays if p not in in_norms]
    assert others and all(decays[p] == weight_decay for p in others)
    return sum(isinstance(module, GWDET_CLASSES) for *_, module in norm_params)


@pytest.mark.parametrize("config", YACS_CONFIGS, ids=lambda p: str(p.relative_to(REPO / "configs")))
def test_every_shipped_yacs_config_gives_every_norm_parameter_the_norm_weight_decay(config: Path):
    cfg = build_config(str(config), META)
    with torch.device("meta"):  # MODEL.DEVICE only moves a model built on the CPU; this builds it on meta
        model = Trainer.build_model(cfg)
    optimizer = Trainer.build_optimizer(cfg, model)
    assert cfg.SOLVER.WEIGHT_DECAY_NORM != cfg.SOLVER.WEIGHT_DECAY  # else the check below proves nothing
    gwdet_params = check_every_norm_parameter(model, optimizer, cfg.SOLVER.WEIGHT_DECAY_NORM, cfg.SOLVER.WEIGHT_DECAY)
    names_gwdet_norm = any(value in ("GW", "GW_ZCA", "BW", "BW_ItN", "BGN", "GhostBN")
                           for value in (cfg.MODEL.RESNETS.NORM, cfg.MODEL.FPN.NORM, cfg.MODEL.ROI_BOX_HEAD.NORM,
                                         cfg.MODEL.ROI_MASK_HEAD.NORM))
    assert (gwdet_params > 0) == (names_gwdet_norm or bool(cfg.MODEL.RESNETS.GW_POSITIONS))


@pytest.mark.parametrize("config", LAZY_CONFIGS, ids=lambda p: p.name)
def test_every_shipped_lazy_config_gives_every_norm_parameter_the_norm_weight_decay(config: Path):
    cfg = LazyConfig.load(str(config))
    with torch.device("meta"):
        model = instantiate(cfg.model)
    cfg.optimizer.params.model = model
    optimizer = instantiate(cfg.optimizer)
    gwdet_params = check_every_norm_parameter(model, optimizer, cfg.optimizer.params.weight_decay_norm,
                                              cfg.optimizer.weight_decay)
    assert (gwdet_params > 0) == ("gw" in config.stem)  # the study's bn.py and gn.py hold no gwdet layer


@pytest.mark.parametrize("name", ["bn", "gn"])
def test_bn_and_gn_study_cells_get_the_same_groups_as_from_detectron2(name: str):
    """Their recipe does not change with gwdet's optimizer: the study keeps their cells."""
    cfg = build_config(str(REPO / "configs" / "Study" / f"{name}.yaml"), META)
    model = Trainer.build_model(cfg)
    ours, theirs = Trainer.build_optimizer(cfg, model), detectron2_build_optimizer(cfg, model)
    assert len(ours.param_groups) == len(theirs.param_groups)
    for a, b in zip(ours.param_groups, theirs.param_groups, strict=True):
        assert [id(p) for p in a["params"]] == [id(p) for p in b["params"]]
        assert {k: v for k, v in a.items() if k != "params"} == {k: v for k, v in b.items() if k != "params"}


def test_gw_and_bn_gw_study_cells_differ_from_detectron2_only_in_gwdets_norm_layers():
    for name, expected in (("gw", 130), ("bn_gw_s1b2", 34)):
        cfg = build_config(str(REPO / "configs" / "Study" / f"{name}.yaml"), META)
        model = Trainer.build_model(cfg)
        ours = decay_by_parameter(Trainer.build_optimizer(cfg, model).param_groups, cfg.SOLVER.WEIGHT_DECAY)
        theirs = decay_by_parameter(detectron2_build_optimizer(cfg, model).param_groups, cfg.SOLVER.WEIGHT_DECAY)
        gwdet_params = {param for *_, param, module in norm_layer_parameters(model) if isinstance(module, GWDET_CLASSES)}
        changed = {p for p in ours if ours[p] != theirs[p]}
        assert changed == gwdet_params and len(changed) == expected
        assert all(ours[p] == 0.0 and theirs[p] == 1e-4 for p in changed)


class _Net(nn.Module):
    """A conv, then a norm named ``norm`` (its parameters ``weight`` and ``bias``), then a linear."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, bias=True)
        self.norm = norm
        self.fc = nn.Linear(8, 2)


@pytest.mark.parametrize("options", [
    {},
    {"weight_decay_bias": 0.5},
    {"bias_lr_factor": 2.0},
    {"overrides": {"weight": {"weight_decay": 0.25}}},
    {"overrides": {"bias": {"lr": 0.3}}},
    {"lr_factor_func": lambda name: 0.5 if name.startswith("norm") else 1.0},
])
@pytest.mark.parametrize("layer", [lambda: GroupWhitening(8, num_groups=4), lambda: BatchWhitening(8, group_size=4),
                                   lambda: BatchGroupNorm(8, num_groups=4)], ids=["GW", "BW", "BGN"])
def test_a_gwdet_layer_gets_what_detectron2_gives_its_own_group_norm(layer, options):
    """The oracle: detectron2's groups for the same network with torch's GroupNorm in its place."""
    ours_net, theirs_net = _Net(layer()), _Net(nn.GroupNorm(4, 8))

    def per_name(net, build) -> dict[str, dict]:
        groups = build(net, base_lr=0.1, weight_decay=1e-4, weight_decay_norm=0.0, **options)
        names = {param: name for name, param in net.named_parameters()}
        return {names[p]: {k: v for k, v in g.items() if k != "params"} for g in groups for p in g["params"]}

    ours = per_name(ours_net, get_default_optimizer_params)
    assert ours == per_name(theirs_net, detectron2_optimizer_params)
    assert ours["norm.weight"]["weight_decay"] != ours["conv.weight"]["weight_decay"] or "overrides" in options


def test_without_a_norm_setting_the_groups_are_detectron2s():
    net = _Net(GroupWhitening(8, num_groups=4))
    ours = get_default_optimizer_params(net, base_lr=0.1, weight_decay=1e-4)
    theirs = detectron2_optimizer_params(net, base_lr=0.1, weight_decay=1e-4)
    assert [(g.keys(), [id(p) for p in g["params"]]) for g in ours] == [(g.keys(), [id(p) for p in g["params"]]) for g in theirs]


def test_a_norm_registered_by_the_user_is_a_norm_to_the_optimizer():
    class Scale(nn.Module):  # no torch norm class: only the registration says it is a norm
        def __init__(self, channels: int) -> None:
            super().__init__()
            self.gain = nn.Parameter(torch.ones(channels))

    register_norm("TestScaleNorm", lambda channels: Scale(channels))
    try:
        net = _Net(gwdet.norm("TestScaleNorm")(8))
        groups = get_default_optimizer_params(net, weight_decay=1e-4, weight_decay_norm=0.0)
        assert decay_by_parameter(groups, 1e-4)[net.norm.gain] == 0.0
        assert decay_by_parameter(groups, 1e-4)[net.conv.weight] == 1e-4
        assert not hasattr(Scale(8), "_gwdet_norm_layer")  # marked when built by the name only
    finally:
        unregister_norm("TestScaleNorm")


def test_check_model_names_the_norm_layers_detectron2s_optimizer_decays(caplog):
    cfg = build_config(str(REPO / "configs" / "Study" / "bn_gw_s1b2.yaml"), META)
    model = Trainer.build_model(cfg)
    with caplog.at_level(logging.WARNING, logger="gwdet.modeling.model_checks"):
        check_model(model, optimizer=detectron2_build_optimizer(cfg, model), weight_decay_norm=0.0)
    warned = "\n".join(r.getMessage() for r in caplog.records)
    assert "17 norm layer(s)" in warned and "backbone.bottom_up.stem.conv1.norm (0.0001)" in warned
    assert "gwdet.build_optimizer" in warned
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gwdet.modeling.model_checks"):
        check_model(model, optimizer=Trainer.build_optimizer(cfg, model), weight_decay_norm=0.0)
    assert not caplog.records
    with pytest.raises(TypeError, match="weight_decay_norm"):
        check_model(model, optimizer=Trainer.build_optimizer(cfg, model))
    for value in ("0", float("nan")):  # "0": a raw ValueError of a format code
        with pytest.raises(TypeError, match=r"check_model: weight_decay_norm must be a number .*, got"):
            check_model(model, optimizer=Trainer.build_optimizer(cfg, model), weight_decay_norm=value)
    # -1 was taken, then every norm layer named as decayed otherwise, with advice to rebuild a right optimizer
    with pytest.raises(ValueError, match=r"^check_model: weight_decay_norm must be a weight decay >= 0 .*, got -1$"):
        check_model(model, optimizer=Trainer.build_optimizer(cfg, model), weight_decay_norm=-1)
    # an optimizer built for another model (a notebook's model rebuilt, the old optimizer kept): nothing would train
    other = Trainer.build_optimizer(cfg, Trainer.build_model(cfg))
    with pytest.raises(ValueError, match=r"check_model: the optimizer does not hold \d+ trainable parameter\(s\) of the "
                                         r"model .*so they would not train: was it built for another model"):
        check_model(model, optimizer=other, weight_decay_norm=0.0)
    # the same model, whose backbone was frozen when its optimizer was built and unfrozen after (a fine-tuning
    # schedule): not "another model"
    model.backbone.requires_grad_(False)
    frozen_then = Trainer.build_optimizer(cfg, model)
    model.backbone.requires_grad_(True)
    with pytest.raises(ValueError, match=r"would not train: were they made trainable \(requires_grad_\(True\), an "
                                         r"unfreezing\) after the optimizer was built\? Add them with "
                                         r"optimizer.add_param_group"):
        check_model(model, optimizer=frozen_then, weight_decay_norm=0.0)
    with pytest.raises(TypeError, match=r"check_model: optimizer must be the torch optimizer .*, got LRMultiplier"):
        check_model(model, optimizer=Trainer.build_lr_scheduler(cfg, other), weight_decay_norm=0.0)


@pytest.mark.parametrize("key, value, problem", [
    ("WEIGHT_DECAY_NORM", -1.0, "is no weight decay of the norm layers: give a finite number at least 0"),
    ("MOMENTUM", 5.0, "SOLVER.MOMENTUM=5.0"),
])
def test_build_optimizer_passes_the_config_gate_before_building(key, value, problem):
    # the train tool refused these; gwdet.build_optimizer built SGD groups with them without a word
    cfg = build_config(str(REPO / "configs" / "Demo" / "mask_rcnn_R_50_FPN_gw_shapes.yaml"))
    cfg.defrost()
    cfg.SOLVER[key] = value
    with pytest.raises(ValueError, match=problem):
        gwdet.build_optimizer(cfg, nn.Linear(2, 2))


@pytest.mark.parametrize("arguments, message", [
    ({"weight_decay_norm": -1.0}, "weight_decay_norm must be a finite number >= 0 or None, got -1.0"),
    ({"weight_decay_norm": "0"}, "weight_decay_norm must be a finite number >= 0 or None, got '0'"),
    ({"base_lr": float("nan")}, "base_lr must be a finite number >= 0 or None, got nan"),
])
def test_optimizer_params_refuse_a_rate_or_decay_sgd_would_take_unchecked(arguments, message):
    with pytest.raises(ValueError, match=f"get_default_optimizer_params: {message}"):
        gwdet.get_default_optimizer_params(nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)), **arguments)
    with pytest.raises(TypeError, match="model must be a torch module, got NoneType"):
        gwdet.get_default_optimizer_params(None)


@pytest.mark.parametrize("asked", [dict(bias_lr_factor=0.0), dict(lr_factor_func=lambda name: 1.0)])
def test_a_rate_factor_without_the_rate_it_multiplies_names_the_fix(asked):
    # a LazyConfig's optimizer.params.bias_lr_factor=0.0: detectron2's bare "bias_lr_factor requires base_lr", under
    # gwdet's "Change the value detectron2 cannot use" (the value was fine)
    with pytest.raises(ValueError, match=r"multiplies base_lr, which is not given: give the optimizer's rate as base_lr "
                                         r"too \(in a LazyConfig: optimizer.params.base_lr=\$\{optimizer.lr\}\)"):
        get_default_optimizer_params(nn.Linear(2, 2), **asked)
    assert len(get_default_optimizer_params(nn.Linear(2, 2), base_lr=0.1, **asked)) >= 1


def test_a_trainer_subclass_whose_own_optimizer_decays_the_norms_is_warned_about(tmp_path):
    # a build_optimizer of one's own decaying every parameter: gwdet's Trainer checked only its own optimizer
    from conftest import DEMO_CONFIG, TINY_OPTS, logged_warnings

    class DecayingEverything(Trainer):
        @classmethod
        def build_optimizer(cls, cfg, model):
            return torch.optim.SGD(model.parameters(), lr=cfg.SOLVER.BASE_LR, weight_decay=1e-4)

    cfg = build_config(str(DEMO_CONFIG), [*TINY_OPTS, "OUTPUT_DIR", str(tmp_path)])
    with logged_warnings("gwdet.modeling.model_checks") as warned:
        Trainer(cfg)
    assert warned == []
    with logged_warnings("gwdet.modeling.model_checks") as warned:
        DecayingEverything(cfg)
    assert len(warned) == 1 and "norm layer(s) are decayed otherwise than the norm weight decay 0 " in warned[0], warned


# an overrides key that named no parameter ('weights' for 'weight') was dropped without a word
def test_an_overrides_key_that_names_no_parameter_is_refused_with_the_names_it_could_mean():
    net = _Net(GroupWhitening(8, num_groups=4))
    with pytest.raises(ValueError, match=r"get_default_optimizer_params: overrides key 'weights' is the name of no "
                                         r"parameter of the model, so it would change nothing .*Did you mean 'weight'\? "
                                         r"The model's parameter names: 'bias', 'weight'\. Use one of them"):
        get_default_optimizer_params(net, base_lr=0.1, overrides={"weights": {"lr": 0.0}})
    with pytest.raises(ValueError, match=r"overrides key 'norm.weight' .* by its own name within its module, not by its "
                                         r"path: 'weight'"):
        get_default_optimizer_params(net, base_lr=0.1, overrides={"norm.weight": {"lr": 0.0}})
    groups = get_default_optimizer_params(net, base_lr=0.1, overrides={"weight": {"lr": 0.0}})
    assert {p: g["lr"] for g in groups for p in g["params"]}[net.conv.weight] == 0.0


# check_model(model, weight_decay_norm=...) without an optimizer returned without checking anything
@pytest.mark.parametrize("given", [{"weight_decay_norm": 0.0}, {"weight_decay_bias": 0.5}])
def test_check_model_refuses_a_weight_decay_given_without_an_optimizer(given):
    name, value = next(iter(given.items()))
    with pytest.raises(TypeError, match=rf"check_model: {name}={value!r} given without an optimizer: .* Give the "
                                        rf"optimizer too \(check_model\(model, optimizer=optimizer, .*or leave {name} out"):
        check_model(_Net(GroupWhitening(8, num_groups=4)), **given)


class _CondNorm(nn.Module):
    """A conditional norm: a GroupNorm, a gain of its own, and a convolution that modulates the output."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.gn = nn.GroupNorm(4, channels)
        self.gain = nn.Parameter(torch.ones(channels))
        self.mod = nn.Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gn(x) * self.gain[:, None, None] * (1 + self.mod(x))


# the convolution inside a norm class named in register_norm(..., layer_types=...) took SOLVER.WEIGHT_DECAY_NORM
def test_a_convolution_inside_a_registered_layer_type_keeps_the_ordinary_weight_decay(caplog):
    register_norm("TestCondNorm", lambda channels: _CondNorm(channels), layer_types=(_CondNorm,))
    try:
        cfg = build_config(str(REPO / "configs" / "Demo" / "mask_rcnn_R_50_FPN_gw_shapes.yaml"),
                           ["SOLVER.WEIGHT_DECAY", "1e-4", "SOLVER.WEIGHT_DECAY_NORM", "0.0"])
        net = nn.Sequential(nn.Conv2d(3, 16, 3), _CondNorm(16))
        optimizer = gwdet.build_optimizer(cfg, net)
        decays = decay_by_parameter(optimizer.param_groups, optimizer.defaults["weight_decay"])
        assert decays[net[1].mod.weight] == decays[net[1].mod.bias] == decays[net[0].weight] == 1e-4
        assert decays[net[1].gain] == decays[net[1].gn.weight] == decays[net[1].gn.bias] == 0.0
        with caplog.at_level(logging.WARNING, logger="gwdet.modeling.model_checks"):
            check_model(net, optimizer=optimizer, weight_decay_norm=0.0)
        assert not caplog.records
    finally:
        unregister_norm("TestCondNorm")


# a model without a trainable parameter got torch's "optimizer got an empty parameter list"
def test_build_optimizer_refuses_a_model_without_a_trainable_parameter():
    cfg = build_config(str(REPO / "configs" / "Demo" / "mask_rcnn_R_50_FPN_gw_shapes.yaml"), [])
    with pytest.raises(ValueError, match=r"build_optimizer: the model \(Identity\) has no trainable parameter: it has no "
                                         r"parameters, so an optimizer would have nothing to train"):
        gwdet.build_optimizer(cfg, nn.Identity())
    frozen = _Net(GroupWhitening(8, num_groups=4)).requires_grad_(False)
    with pytest.raises(ValueError, match=r"\(_Net\) has no trainable parameter: all 6 of its parameters are frozen "
                                         r"\(requires_grad False\).* \(model.requires_grad_\(True\)\)"):
        gwdet.build_optimizer(cfg, frozen)


def test_detectron2s_ln_layers_get_the_norm_weight_decay_and_are_checked(caplog):
    # gwdet's builders gave LN (detectron2.layers.LayerNorm) SOLVER.WEIGHT_DECAY, and check_model named nothing
    ln = gwdet.norm("LN")(8)
    assert gwdet.solver.is_norm_layer(ln)
    net = nn.Sequential(nn.Conv2d(3, 8, 1), ln)
    groups = get_default_optimizer_params(net, base_lr=0.1, weight_decay=1e-4, weight_decay_norm=0.0)
    decays = decay_by_parameter(groups, 1e-4)
    assert (decays[ln.weight], decays[ln.bias], decays[net[0].weight]) == (0.0, 0.0, 1e-4)
    cfg = build_config(str(REPO / "configs" / "Demo" / "mask_rcnn_R_50_FPN_gw_shapes.yaml"),
                       META + ["MODEL.FPN.NORM", "LN", "SOLVER.WEIGHT_DECAY", "1e-4", "SOLVER.WEIGHT_DECAY_NORM", "0.0"])
    model = gwdet.build_model(cfg)
    optimizer = gwdet.build_optimizer(cfg, model)
    decays = decay_by_parameter(optimizer.param_groups, 1e-4)
    lateral = model.backbone.fpn_lateral2.norm
    assert (decays[lateral.weight], decays[lateral.bias]) == (0.0, 0.0)
    with caplog.at_level(logging.WARNING, logger="gwdet.modeling.model_checks"):
        check_model(model, optimizer=optimizer, weight_decay_norm=0.0)
    assert not caplog.records
    with caplog.at_level(logging.WARNING, logger="gwdet.modeling.model_checks"):
        check_model(model, optimizer=detectron2_build_optimizer(cfg, model), weight_decay_norm=0.0)
    assert "backbone.fpn_lateral2.norm (0.0001)" in "\n".join(r.getMessage() for r in caplog.records)


# a SOLVER.OPTIMIZER of another project's config ("ADAMW") was ignored: detectron2's SGD built without a word
def test_build_optimizer_refuses_an_optimizer_other_than_sgd_named_in_the_config():
    cfg = build_config(str(REPO / "configs" / "Demo" / "mask_rcnn_R_50_FPN_gw_shapes.yaml"), [])
    cfg.defrost()
    cfg.SOLVER.OPTIMIZER = "ADAMW"
    net = _Net(GroupWhitening(8, num_groups=4))
    with pytest.raises(ValueError, match=r"^build_optimizer: SOLVER.OPTIMIZER is 'ADAMW', but this function builds "
                                         r"detectron2's SGD .* or remove SOLVER.OPTIMIZER to train with SGD\.$"):
        gwdet.build_optimizer(cfg, net)
    cfg.SOLVER.OPTIMIZER = "sgd"
    assert isinstance(gwdet.build_optimizer(cfg, net), torch.optim.SGD)


# an optimizer of one's own decaying every bias by -1: the warning advised check_model(..., weight_decay_bias=-1),
# which check_model refuses
def test_norm_biases_decayed_by_a_negative_value_are_not_told_to_give_it_to_the_check(caplog):
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4))
    biases = [parameter for name, parameter in model.named_parameters() if name.endswith("bias")]
    weights = [parameter for name, parameter in model.named_parameters() if not name.endswith("bias")]
    optimizer = torch.optim.SGD([{"params": weights, "weight_decay": 0.0}, {"params": biases, "weight_decay": -1.0}],
                                lr=0.1)
    with caplog.at_level(logging.WARNING, logger="gwdet.modeling.model_checks"):
        check_model(model, optimizer=optimizer, weight_decay_norm=0.0)
    warned = "\n".join(r.getMessage() for r in caplog.records)
    assert "are decayed otherwise than the norm weight decay 0" in warned, warned
    assert "weight_decay_bias=-1" not in warned


def _built_with_norm_decay_0_and_bias_decay_0_5() -> tuple[CfgNode, nn.Module, torch.optim.Optimizer]:
    """The study's BN + GW config with SOLVER.WEIGHT_DECAY_NORM 0 and SOLVER.WEIGHT_DECAY_BIAS 0.5, its model and
    gwdet.build_optimizer's optimizer."""
    cfg = build_config(str(REPO / "configs" / "Study" / "bn_gw_s1b2.yaml"), META)
    cfg.defrost()
    cfg.SOLVER.WEIGHT_DECAY_NORM = 0.0
    cfg.SOLVER.WEIGHT_DECAY_BIAS = 0.5
    model = Trainer.build_model(cfg)
    return cfg, model, gwdet.build_optimizer(cfg, model)


# SOLVER.WEIGHT_DECAY_BIAS set: check_model(m, optimizer=gwdet.build_optimizer(cfg, m), weight_decay_norm=0.0) warned
# that the norm layers were decayed otherwise and advised gwdet.build_optimizer, which had built the optimizer
def test_norm_biases_decayed_by_the_bias_weight_decay_are_named_as_such(caplog):
    cfg, model, optimizer = _built_with_norm_decay_0_and_bias_decay_0_5()
    with caplog.at_level(logging.WARNING, logger="gwdet.modeling.model_checks"):
        check_model(model, optimizer=optimizer, weight_decay_norm=0.0)
    warned = "\n".join(r.getMessage() for r in caplog.records)
    assert "norm layer(s) have their bias decayed by 0.5, not by the norm weight decay 0 " in warned, warned
    assert "backbone.fpn_lateral2.norm (0.5)" in warned
    assert "give it to the check (check_model(..., weight_decay_bias=0.5), i.e. cfg.SOLVER.WEIGHT_DECAY_BIAS)" in warned
    assert "gwdet.build_optimizer" not in warned
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gwdet.modeling.model_checks"):
        check_model(model, optimizer=optimizer, weight_decay_norm=0.0, weight_decay_bias=0.5)
    assert not caplog.records
    # weights decayed otherwise too (detectron2's builder, which knows no gwdet layer): the builder advice stays
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gwdet.modeling.model_checks"):
        check_model(model, optimizer=detectron2_build_optimizer(cfg, model), weight_decay_norm=0.0,
                    weight_decay_bias=0.5)
    assert "decayed otherwise than the norm weight decay 0 " in caplog.text and "gwdet.build_optimizer" in caplog.text


# a model built from scratch in Python with frozen stages (or FrozenBN) got an optimizer without a word, while the
# train tool refuses the config: the frozen parts would stay random (identities)
def test_an_optimizer_for_a_scratch_model_with_frozen_parts_warns_that_they_stay_as_built():
    from conftest import DEMO_CONFIG, LAZY_CONFIG, TINY_OPTS, logged_warnings
    from gwdet.engine import lazy
    from gwdet.model_zoo.lazy_loading import load_lazy_config

    for opts, part in ((["MODEL.BACKBONE.FREEZE_AT", "2"], r"\d+ frozen parameter\(s\) \(backbone.bottom_up.stem"),
                       (["MODEL.FPN.NORM", "FrozenBN"], r"8 FrozenBN layer\(s\) \(backbone.fpn_lateral2.norm")):
        cfg = build_config(str(DEMO_CONFIG), [*TINY_OPTS, *opts])
        model = gwdet.build_model(cfg)
        with logged_warnings("gwdet.solver") as warned:
            gwdet.build_optimizer(cfg, model)
        assert len(warned) == 1
        assert re.match(rf"MODEL.WEIGHTS is empty \(training from scratch\), and the model has {part}.*training leaves "
                        r"them as they are built. Load pretrained weights into the model before training", warned[0])
        cfg.defrost()
        cfg.MODEL.WEIGHTS = "pretrained.pkl"  # loaded later: no warning
        with logged_warnings("gwdet.solver") as warned:
            gwdet.build_optimizer(cfg, model)
        assert warned == []
    cfg = load_lazy_config(str(LAZY_CONFIG), ["model.backbone.bottom_up.freeze_at=2", "train.init_checkpoint=''"])
    model = lazy.build_model(cfg)
    with logged_warnings("gwdet.solver") as warned:
        lazy.build_optimizer(cfg, model)
    assert len(warned) == 1 and warned[0].startswith("train.init_checkpoint is empty (training from scratch), and the "
                                                     "model has ")


# overrides={'bias': {'weight_decy': 0.0}} / {'weight_decay': -1.0} / {'lr': nan} were taken (SGD carried the misspelt
# key and ignored it, decayed by -1, trained the biases to NaN); {'bias': 0.0} stopped on "'float' object is not iterable"
@pytest.mark.parametrize("overrides, error, message", [
    ({"bias": {"weight_decy": 0.0}}, ValueError,
     r"overrides\['bias'\]\['weight_decy'\] is no key of a parameter group of torch's optimizers, so the optimizer "
     r"would carry it and ignore it\. Did you mean 'weight_decay'"),
    ({"bias": {"weight_decay": -1.0}}, ValueError,
     r"overrides\['bias'\]\['weight_decay'\] must be a finite number >= 0, got -1\.0: .* Give e\.g\. "
     r"\{'bias': \{'weight_decay': 0\.0\}\}"),
    ({"bias": {"lr": float("nan")}}, ValueError, r"overrides\['bias'\]\['lr'\] must be a finite number >= 0, got nan"),
    ({"bias": 0.0}, TypeError, r"overrides\['bias'\] is 0\.0 \(float\), but an override is a dict of the parameter "
                               r"group's values .* Give e\.g\. \{'bias': \{'weight_decay': 0\.0\}\}"),
])
def test_an_override_is_a_dict_of_group_keys_torchs_optimizers_take_with_finite_rates(overrides, error, message):
    net = _Net(GroupWhitening(8, num_groups=4))
    with pytest.raises(error, match=f"get_default_optimizer_params: {message}"):
        get_default_optimizer_params(net, base_lr=0.1, weight_decay=1e-4, weight_decay_norm=0.0, overrides=overrides)
    groups = get_default_optimizer_params(net, base_lr=0.1, weight_decay=1e-4, weight_decay_norm=0.0,
                                          overrides={"bias": {"weight_decay": 0.0, "momentum": 0.5, "lr": 0.0}})
    assert {g["lr"] for g in groups if any(p is net.conv.bias for p in g["params"])} == {0.0}


# lr_factor_func returning -1 or NaN made groups with lr -0.1 or NaN; returning '2' stopped on a bare TypeError
@pytest.mark.parametrize("factor, shown", [(-1.0, "-1.0"), (float("nan"), "nan"), ("2", r"'2' \(str\)")])
def test_an_lr_factor_func_result_that_is_no_rate_factor_is_refused_naming_the_parameter(factor, shown):
    net = _Net(GroupWhitening(8, num_groups=4))
    with pytest.raises(ValueError, match=rf"get_default_optimizer_params: lr_factor_func\('conv.weight'\), the factor "
                                         rf"of base_lr=0.1 for parameter 'conv.weight', must be a finite number >= 0, "
                                         rf"got {shown}: .* Make lr_factor_func return a finite number >= 0"):
        get_default_optimizer_params(net, base_lr=0.1, lr_factor_func=lambda name: factor if "conv" in name else 1.0)
    groups = get_default_optimizer_params(net, base_lr=0.1, lr_factor_func=lambda name: 0.5)
    assert {g["lr"] for g in groups} == {0.05}


# the check given another norm weight decay than gwdet.build_optimizer's optimizer had (SOLVER.WEIGHT_DECAY_NORM 0,
# weight_decay_norm=0.1) advised building the optimizer with gwdet.build_optimizer, which had built it
def test_norm_layers_decayed_by_another_norm_weight_decay_name_the_optimizers_value(caplog):
    cfg, model, optimizer = _built_with_norm_decay_0_and_bias_decay_0_5()
    with caplog.at_level(logging.WARNING, logger="gwdet.modeling.model_checks"):
        check_model(model, optimizer=optimizer, weight_decay_norm=0.1, weight_decay_bias=0.5)
    warned = "\n".join(r.getMessage() for r in caplog.records)
    assert re.search(r"\d+ norm layer\(s\) are decayed by 0, where the check was told the norm weight decay 0.1 "
                     r"\(SOLVER.WEIGHT_DECAY_NORM / weight_decay_norm\): backbone.fpn_lateral2.norm \(0\), .*"
                     r"The optimizer decays every norm layer of the model by 0, a norm weight decay other than the "
                     r"check's. If 0 is the setting, give it to the check \(check_model\(..., weight_decay_norm=0\), "
                     r"i.e. cfg.SOLVER.WEIGHT_DECAY_NORM\); else build the optimizer again with 0.1 "
                     r"\(SOLVER.WEIGHT_DECAY_NORM 0.1; in a LazyConfig optimizer.params.weight_decay_norm=0.1\).$",
                     warned), warned
    assert "gwdet.build_optimizer" not in warned
    # gwdet's layers decayed as the convolutions (detectron2's builder): the builder advice stays, even where they
    # are the model's only norm layers and all decayed by one value
    net = nn.Sequential(nn.Conv2d(3, 8, 1), GroupWhitening(8, num_groups=2))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gwdet.modeling.model_checks"):
        check_model(net, optimizer=torch.optim.SGD(detectron2_optimizer_params(net, base_lr=0.1, weight_decay=1e-4,
                                                                               weight_decay_norm=0.0), lr=0.1),
                    weight_decay_norm=0.0)
    assert "norm layer(s) are decayed otherwise than the norm weight decay 0 " in caplog.text
    assert "build the optimizer with gwdet.build_optimizer(cfg, model)" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gwdet.modeling.model_checks"):
        check_model(net, optimizer=torch.optim.SGD(get_default_optimizer_params(net, base_lr=0.1, weight_decay=1e-4,
                                                                                weight_decay_norm=0.0), lr=0.1),
                    weight_decay_norm=1e-3)
    assert "1 norm layer(s) are decayed by 0, where the check was told the norm weight decay 0.001 " in caplog.text


# overrides={'weight': {'wd': 0.2}} suggested 'd' (a key of Adafactor that SGD does not take), not 'weight_decay'
@pytest.mark.parametrize("key, meant", [("wd", "weight_decay"), ("mom", "momentum"), ("LR", "lr"),
                                        ("learning_rate", "lr"), ("momentun", "momentum")])
def test_an_unknown_override_key_suggests_the_group_key_it_abbreviates_or_one_of_sgds_and_adamws(key, meant):
    net = _Net(GroupWhitening(8, num_groups=4))
    with pytest.raises(gwdet.errors.GwdetValueError, match=rf"overrides\['weight'\]\[{key!r}\] is no key of a parameter "
                                                           rf"group .* Did you mean {meant!r}\? The keys"):
        get_default_optimizer_params(net, base_lr=0.1, overrides={"weight": {key: 0.2}})


# the suggestion for an unknown override key was drawn from every optimizer's keys, whatever the optimizer
def test_an_unknown_override_key_is_matched_against_the_keys_of_the_optimizer_given_first():
    from gwdet.solver import check_override_values
    with pytest.raises(gwdet.errors.GwdetValueError, match=r"Did you mean 'weight_decay'\? The keys"):
        check_override_values({"bias": {"weight_decy": 0.0}}, optimizer=torch.optim.SGD)
    with pytest.raises(gwdet.errors.GwdetValueError, match=r"Did you mean 'betas'\? The keys"):
        check_override_values({"bias": {"beta": 0.0}}, optimizer=torch.optim.AdamW)


def test_norm_decays_set_by_overrides_are_as_asked_and_not_blamed_on_detectron2s_builders(caplog):
    # overrides={'weight': {'weight_decay': 0.7}} with weight_decay_norm 0: the warning advised building with
    # gwdet.get_default_optimizer_params, which had built the optimizer; check_model could not be given the overrides
    net = _Net(GroupWhitening(8, num_groups=4))
    overrides = {"weight": {"weight_decay": 0.7}}
    optimizer = torch.optim.SGD(get_default_optimizer_params(net, base_lr=0.1, weight_decay=1e-4, weight_decay_norm=0.0,
                                                             overrides=overrides), lr=0.1, weight_decay=1e-4)
    with caplog.at_level(logging.WARNING, logger="gwdet.modeling.model_checks"):
        check_model(net, optimizer=optimizer, weight_decay_norm=0.0, overrides=overrides)
    assert not caplog.records
    with caplog.at_level(logging.WARNING, logger="gwdet.modeling.model_checks"):
        check_model(net, optimizer=optimizer, weight_decay_norm=0.0)
    [warned] = [record.getMessage() for record in caplog.records]
    assert warned.startswith("1 norm layer(s) are decayed otherwise than the norm weight decay 0 (SOLVER.WEIGHT_DECAY_NORM"
                             " / weight_decay_norm): norm (0.7). The optimizer decays every parameter named 'weight' "
                             "of the model alike, as an override by parameter name does: if overrides set these "
                             "decays (get_default_optimizer_params(..., overrides={'weight': {'weight_decay': 0.7}}), "
                             "optimizer.params.overrides), that is as asked, an override taking precedence over "
                             "weight_decay_norm, and the check expects them when given them (check_model(..., "
                             "overrides=...)). Else detectron2's optimizer builders")
    # an override the optimizer does not follow is still named; overrides without an optimizer or of another shape
    caplog.clear()
    plain = torch.optim.SGD(get_default_optimizer_params(net, base_lr=0.1, weight_decay=1e-4, weight_decay_norm=0.0),
                            lr=0.1, weight_decay=1e-4)
    with caplog.at_level(logging.WARNING, logger="gwdet.modeling.model_checks"):
        check_model(net, optimizer=plain, weight_decay_norm=0.0, overrides=overrides)
    assert "norm (0)" in caplog.records[0].getMessage()
    with pytest.raises(gwdet.errors.GwdetTypeError, match=r"check_model: overrides=\{'weight': \{'weight_decay': 0.7\}\} "
                                                          r"given without an optimizer"):
        check_model(net, overrides=overrides)
    with pytest.raises(gwdet.errors.GwdetTypeError, match=r"check_model: overrides must be a dict of"):
        check_model(net, optimizer=optimizer, weight_decay_norm=0.0, overrides=0.7)


def test_the_norm_decay_check_expects_the_decay_the_overrides_give():
    # check_norm_weight_decay took no overrides (LazyConfig optimizer.params.overrides): the layers were misnamed
    from gwdet.modeling.model_checks import check_norm_weight_decay

    net = _Net(BatchGroupNorm(8, num_groups=4))
    overrides = {"weight": {"weight_decay": 0.7}, "bias": {"lr": 0.2}}
    optimizer = torch.optim.SGD(get_default_optimizer_params(net, base_lr=0.1, weight_decay=1e-4, weight_decay_norm=0.0,
                                                             overrides=overrides), lr=0.1)
    assert check_norm_weight_decay(net, optimizer, 0.0, None, overrides) == []
    assert check_norm_weight_decay(net, optimizer, 0.0, None, {"weight": {"weight_decay": 0.5}}) == ["norm (0.7)"]


# a LazyConfig's optimizer.params.overrides={'weight': {'weight_decay': 0.7}} with weight_decay_norm 0: the build warned
# that detectron2's builders had decayed the norm layers, advising the params target the config already had
def test_a_lazyconfig_s_overrides_reach_the_norm_decay_check_of_its_optimizer(caplog):
    from omegaconf import OmegaConf
    from gwdet.engine import lazy
    from gwdet.model_zoo.lazy_loading import load_lazy_config
    from conftest import LAZY_CONFIG

    cfg = load_lazy_config(str(LAZY_CONFIG), ["train.device=cpu"], model=True)
    cfg.optimizer.params.weight_decay_norm = 0.0
    cfg.optimizer.params.overrides = OmegaConf.create({"weight": {"weight_decay": 0.7}})
    model = lazy.build_model(cfg)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gwdet.modeling.model_checks"):
        optimizer = lazy.build_optimizer(cfg, model)
    assert not [record for record in caplog.records if record.levelno >= logging.WARNING]
    assert 0.7 in {group["weight_decay"] for group in optimizer.param_groups}


def _scripted_norms() -> list:
    return [
        pytest.param(lambda: BatchWhitening(16, group_size=4), "BatchWhitening", id="BW"),
        pytest.param(lambda: GroupWhitening(16, num_groups=4), "GroupWhitening", id="GW"),
        pytest.param(lambda: BatchGroupNorm(16, num_groups=4), "BatchGroupNorm", id="BGN"),
        pytest.param(lambda: nn.BatchNorm2d(16), "BatchNorm2d", id="BN"),
        pytest.param(lambda: nn.GroupNorm(4, 16), "GroupNorm", id="GN"),
        pytest.param(lambda: nn.LayerNorm(16), "LayerNorm", id="LN"),
    ]


# a scripted norm layer inside an eager model got the ordinary weight decay (1e-4) instead of weight_decay_norm 0,
# and check_model(m, optimizer=opt, weight_decay_norm=0.0) passed without a word
@pytest.mark.parametrize("make, kind", _scripted_norms())
def test_a_scripted_norm_layer_is_refused_where_it_would_not_get_the_norm_weight_decay(make, kind):
    model = nn.Sequential(nn.Conv2d(3, 16, 3), torch.jit.script(make()))
    message = (rf"the model's submodule '1' is a scripted {kind} \(a TorchScript RecursiveScriptModule, as "
               r"torch.jit.script makes\), so its parameters weight, bias cannot be given weight_decay_norm=0.0: a "
               r"scripted module is no instance of its class.*\(the {} them the ordinary weight decay 0.0001\)\. "
               rf"Keep the eager {kind} in the model and script the whole model after building the optimizer")
    with pytest.raises(gwdet.errors.GwdetTypeError, match="get_default_optimizer_params: " + message.format("groups give")):
        get_default_optimizer_params(model, base_lr=0.1, weight_decay=1e-4, weight_decay_norm=0.0)
    optimizer = torch.optim.SGD(detectron2_optimizer_params(model, base_lr=0.1, weight_decay=1e-4, weight_decay_norm=0.0),
                                lr=0.1)
    with pytest.raises(gwdet.errors.GwdetTypeError, match="check_model: " + message.format("optimizer gives")):
        check_model(model, optimizer=optimizer, weight_decay_norm=0.0)
    alone = torch.jit.script(make())
    with pytest.raises(gwdet.errors.GwdetTypeError, match=rf"get_default_optimizer_params: the model is a scripted {kind}"):
        get_default_optimizer_params(alone, base_lr=0.1, weight_decay=1e-4, weight_decay_norm=0.0)


def test_scripted_layers_that_need_no_norm_weight_decay_are_left_as_detectron2_groups_them(caplog):
    from detectron2.layers import FrozenBatchNorm2d

    # a scripted conv, and a scripted norm without trainable parameters, beside an eager norm
    model = nn.Sequential(torch.jit.script(nn.Conv2d(3, 16, 3)), nn.BatchNorm2d(16),
                          torch.jit.script(FrozenBatchNorm2d(16)), torch.jit.script(nn.BatchNorm2d(16, affine=False)))
    params = get_default_optimizer_params(model, base_lr=0.1, weight_decay=1e-4, weight_decay_norm=0.0)
    decays = decay_by_parameter(params, 1e-4)
    assert decays == decay_by_parameter(
        detectron2_optimizer_params(model, base_lr=0.1, weight_decay=1e-4, weight_decay_norm=0.0), 1e-4)
    assert [decays[p] for p in model.parameters()] == [1e-4, 1e-4, 0.0, 0.0]
    optimizer = torch.optim.SGD(params, lr=0.1)
    with caplog.at_level(logging.WARNING, logger="gwdet.modeling.model_checks"):
        check_model(model, optimizer=optimizer, weight_decay_norm=0.0)
    assert not caplog.records
    # a scripted norm with no norm weight decay asked for, or given the ordinary decay as its norm decay
    norm = torch.jit.script(BatchWhitening(16, group_size=4))
    scripted = nn.Sequential(nn.Conv2d(3, 16, 3), norm)
    assert {g.get("weight_decay") for g in get_default_optimizer_params(scripted, base_lr=0.1, weight_decay=1e-4)} == {1e-4}
    same = torch.optim.SGD(get_default_optimizer_params(scripted, base_lr=0.1, weight_decay=1e-4,
                                                        weight_decay_norm=1e-4), lr=0.1)
    check_model(scripted, optimizer=same, weight_decay_norm=1e-4)


def test_a_whole_model_scripted_after_the_optimizer_is_built_keeps_its_norm_weight_decay(caplog):
    eager = nn.Sequential(nn.Conv2d(3, 16, 3), BatchWhitening(16, group_size=4))
    optimizer = torch.optim.SGD(get_default_optimizer_params(eager, base_lr=0.1, weight_decay=1e-4,
                                                             weight_decay_norm=0.0), lr=0.1)
    scripted = torch.jit.script(eager)
    assert scripted[1].weight is eager[1].weight
    with caplog.at_level(logging.WARNING, logger="gwdet.modeling.model_checks"):
        check_model(scripted, optimizer=optimizer, weight_decay_norm=0.0)
    assert not caplog.records
    with pytest.raises(gwdet.errors.GwdetTypeError, match=r"get_default_optimizer_params: the model's submodule '1' is a "
                                                          r"scripted BatchWhitening"):
        get_default_optimizer_params(scripted, base_lr=0.1, weight_decay=1e-4, weight_decay_norm=0.0)
