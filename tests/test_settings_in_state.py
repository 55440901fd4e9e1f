"""A detectron2 model's gwdet norm layers carry their settings in its state dict: every loader refuses
weights trained with other settings, naming the layer, the setting and both values, and states
saved before the layers recorded settings still load (gwdet.layers.settings_state). What each layer
records and refuses on its own: test_layer_contract.py."""
import logging

import pytest
import torch
from detectron2.checkpoint import DetectionCheckpointer
from detectron2.modeling import build_model

from conftest import DEMO_CONFIG, TINY_OPTS
from gwdet.checkpoint.resilient import ResilientCheckpointer
from gwdet.model_zoo import build_config

STEM = "backbone.bottom_up.stem.conv1.norm"  # GW at S1 in the demo


def tiny_model(*opts: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(build_config(str(DEMO_CONFIG), TINY_OPTS + list(opts)))


def weights(model: torch.nn.Module) -> dict:
    return {key: value.clone() for key, value in model.state_dict().items() if not key.endswith("_extra_state")}


def same_weights(model: torch.nn.Module, expected: dict) -> bool:
    return all(torch.equal(value, expected[key]) for key, value in weights(model).items())


@pytest.fixture(scope="module")
def four_groups(tmp_path_factory):
    """The state of the demo model with GW of 4 groups, and a file holding it as a plain checkpoint
    (as detectron2's lazyconfig_train_net.py writes one: the weights under "model", nothing else)."""
    model = tiny_model("MODEL.GW.NUM_GROUPS", "4")
    path = tmp_path_factory.mktemp("weights") / "gw4.pth"
    torch.save({"model": model.state_dict()}, path)
    return model.state_dict(), path


def test_a_gw_state_of_4_groups_is_refused_by_plain_load_state_dict_into_8(four_groups):
    state, _ = four_groups
    model = tiny_model("MODEL.GW.NUM_GROUPS", "8")
    for strict in (True, False):
        with pytest.raises(RuntimeError) as refused:
            model.load_state_dict(state, strict=strict)
        assert (f"{STEM} (GroupWhitening) was saved with num_groups=4, but this layer has num_groups=8: the weights "
                "were trained as another function.") in str(refused.value)
        assert f"delete '{STEM}._extra_state' from the state dict" in str(refused.value)


def test_a_gw_state_of_4_groups_is_refused_by_detectron2s_checkpointer(four_groups):
    _, path = four_groups
    model = tiny_model("MODEL.GW.NUM_GROUPS", "8")
    with pytest.raises(RuntimeError, match=rf"{STEM} \(GroupWhitening\) was saved with num_groups=4, but this layer "
                                           "has num_groups=8"):
        DetectionCheckpointer(model).load(str(path))


def test_gwdets_checkpointer_refuses_a_checkpoint_without_its_records_before_loading_anything(four_groups, monkeypatch):
    _, path = four_groups
    model = tiny_model("MODEL.GW.NUM_GROUPS", "8")
    before = weights(model)
    with pytest.raises(ValueError) as refused:
        ResilientCheckpointer(model).load(str(path))
    assert str(refused.value).startswith(
        "The checkpoint was trained with other norm hyper-parameters than this config gives its layers (")
    assert "norm num_groups 4 -> 8" in str(refused.value) and "GWDET_ALLOW_NORM_MISMATCH=1" in str(refused.value)
    assert same_weights(model, before), "nothing was loaded"
    monkeypatch.setenv("GWDET_ALLOW_NORM_MISMATCH", "1")  # the opt-in the message names: the weights load
    ResilientCheckpointer(model).load(str(path))
    assert same_weights(model, {key: value for key, value in torch.load(path)["model"].items()})
    assert model.backbone.bottom_up.stem.conv1.norm.num_groups == 8, "the layer keeps its settings"


def test_a_meta_state_is_refused_by_name_and_a_cpu_one_loads_into_a_meta_built_layer(tmp_path):
    # torch.load(map_location="meta") then load_state_dict(assign=True): a raw "Cannot copy out of meta tensor"
    from gwdet.layers import GroupWhitening

    torch.save(GroupWhitening(16, num_groups=4).state_dict(), tmp_path / "gw.pt")
    with torch.device("meta"):
        layer = GroupWhitening(16, num_groups=4)
    meta = torch.load(tmp_path / "gw.pt", map_location="meta", weights_only=True)
    with pytest.raises(RuntimeError, match=r"GroupWhitening: the state's '_extra_state' is on the meta device .* "
                                           r"read the state onto the CPU"):
        layer.load_state_dict(meta, assign=True)
    layer.load_state_dict(torch.load(tmp_path / "gw.pt", map_location="cpu", weights_only=True), assign=True)
    assert not layer.weight.is_meta


def test_a_wider_gw_layer_starts_afresh_in_a_fine_tuning_as_a_batch_norm_does(tmp_path):
    # MODEL.ROI_BOX_HEAD.CONV_DIM 128 from a run of 64: the settings record refused the whole file with a raw
    # traceback (num_channels 64 -> 128), where the BN twin fine-tuned with fvcore's "Skip loading" warnings
    from gwdet.layers import GroupWhitening

    def model(channels: int) -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Conv2d(3, channels, 1), GroupWhitening(channels, num_groups=4))

    ResilientCheckpointer(model(16), str(tmp_path)).save("narrow")
    wider = model(32)
    ResilientCheckpointer(wider, str(tmp_path / "ft")).load_weights(str(tmp_path / "narrow.pth"))
    assert wider[1].num_channels == 32 and torch.equal(wider[1].weight, torch.ones(32))  # its own initial values
    with pytest.raises(ValueError, match=r"does not hold every weight of the model .*1.weight: shape \(16,\) in the "
                                         r"checkpoint, \(32,\) in the model"):
        ResilientCheckpointer(model(32), str(tmp_path / "ev"), require_every_weight=True).load_weights(
            str(tmp_path / "narrow.pth"))


def test_a_bw_state_of_another_group_size_is_refused_by_name_not_by_a_size_mismatch(tmp_path):
    saved = tiny_model("MODEL.FPN.NORM", "BW", "MODEL.BW.GROUP_SIZE", "8")
    model = tiny_model("MODEL.FPN.NORM", "BW", "MODEL.BW.GROUP_SIZE", "4")
    with pytest.raises(RuntimeError) as refused:
        model.load_state_dict(saved.state_dict())
    assert ("backbone.fpn_lateral2.norm (BatchWhitening) was saved with group_size=8, but this layer has "
            "group_size=4") in str(refused.value)
    assert "size mismatch" not in str(refused.value)
    # detectron2's checkpointer would skip the mismatched running_whitening with a warning and load the rest
    path = tmp_path / "bw8.pth"
    torch.save({"model": saved.state_dict()}, path)
    with pytest.raises(RuntimeError, match=r"backbone.fpn_lateral2.norm \(BatchWhitening\) was saved with group_size=8"):
        DetectionCheckpointer(model).load(str(path))


def test_a_state_saved_before_the_layers_recorded_settings_loads_with_every_loader(four_groups, tmp_path, caplog):
    state, _ = four_groups
    old = {key: value for key, value in state.items() if not key.endswith("_extra_state")}
    assert len(old) < len(state), "the demo's GW layers record their settings"
    model = tiny_model("MODEL.GW.NUM_GROUPS", "8")
    loaded = model.load_state_dict(old, strict=True)  # a different model, as the state lacks the record: loads
    assert (loaded.missing_keys, loaded.unexpected_keys) == ([], [])
    assert same_weights(model, old)
    path = tmp_path / "old.pth"
    torch.save({"model": old}, path)
    fresh = tiny_model("MODEL.GW.NUM_GROUPS", "4")
    with caplog.at_level(logging.WARNING):
        DetectionCheckpointer(fresh).load(str(path))
    assert same_weights(fresh, old)
    assert not any("_extra_state" in record.getMessage() for record in caplog.records), "no key reported missing"


def test_settings_that_make_the_same_function_load_and_others_are_named():
    from gwdet.layers import BatchWhitening, GroupWhitening

    # 64 requested groups on 16 channels whiten in 16, as 16 requested do; ZCA does not iterate (T)
    GroupWhitening(16, num_groups=16).load_state_dict(GroupWhitening(16, num_groups=64).state_dict())
    zca = BatchWhitening(16, group_size=4, method="zca", T=3).state_dict()
    BatchWhitening(16, group_size=4, method="zca", T=5).load_state_dict(zca)
    with pytest.raises(RuntimeError, match=r"saved with method='zca', but this layer has method='itn'"):
        BatchWhitening(16, group_size=4, method="itn", T=3).load_state_dict(zca)
    with pytest.raises(RuntimeError, match="saved with num_groups=4, but this layer has num_groups=8"):
        GroupWhitening(16, num_groups=8).load_state_dict(GroupWhitening(16, num_groups=4).state_dict())
    # an eps that went through a tensor is the float32 number the layer computes with (it was refused)
    GroupWhitening(16, eps=float(torch.tensor(1e-5))).load_state_dict(GroupWhitening(16, eps=1e-5).state_dict())
    with pytest.raises(RuntimeError, match=r"saved with eps=1e-05, but this layer has eps=2e-05"):
        GroupWhitening(16, eps=2e-5).load_state_dict(GroupWhitening(16, eps=1e-5).state_dict())


def test_momentum_and_the_example_weight_leave_the_trained_function_and_load():
    """How fast training updated the running statistics, and how evaluation mixes them with the
    batch's (chosen after training), are recorded but not compared: by the layers, and by gwdet's
    checkpoint record."""
    from gwdet.checkpoint.compatibility import check_norm_settings, norm_settings
    from gwdet.layers import BatchGroupNorm, BatchWhitening

    trained = BatchGroupNorm(16, num_groups=4)
    # examples_per_group: how training groups its batch, which evaluation never reads (an evaluation of
    # BGN weights with another MODEL.BGN.EXAMPLES_PER_GROUP was refused as "trained as another function")
    weighed = BatchGroupNorm(16, num_groups=4, eval_example_weight=0.5, momentum=0.01, examples_per_group=1)
    weighed.load_state_dict(trained.state_dict())
    assert torch.equal(weighed.running_mean, trained.running_mean) and weighed.eval_example_weight == 0.5
    BatchWhitening(16, group_size=4, momentum=0.3).load_state_dict(BatchWhitening(16, group_size=4).state_dict())
    check_norm_settings(norm_settings(torch.nn.Sequential(trained)), torch.nn.Sequential(weighed), "opt in")
    with pytest.raises(ValueError, match=r"0 num_groups 4 -> 8"):
        check_norm_settings(norm_settings(torch.nn.Sequential(trained)),
                            torch.nn.Sequential(BatchGroupNorm(16, num_groups=8)), "opt in")


@pytest.mark.parametrize("kind, settings, name, value", [
    ("GroupWhitening", {"num_groups": 4}, "num_groups", 8),
    ("GroupWhitening", {"num_groups": 4}, "eps", -1.0),
    ("GroupWhitening", {"num_groups": 4}, "method", "svd"),
    ("BatchWhitening", {"group_size": 4}, "group_size", 8),
    ("BatchGroupNorm", {"num_groups": 4}, "affine", False),
])
def test_a_setting_the_layer_was_built_with_cannot_be_changed_on_it(kind, settings, name, value):
    """The layer derives its groups and buffers from its settings when built: a changed value was
    recorded in its state and shown in its repr while it computed with the old one."""
    import gwdet.layers

    layer = getattr(gwdet.layers, kind)(16, **settings)
    x = torch.randn(4, 16, 3, 3)
    before, state = layer(x), layer.state_dict()
    with pytest.raises(AttributeError, match=rf"{name} is set when the layer is built and cannot be changed "
                                             rf"afterwards .* build a new layer: {type(layer).__name__}\(num_channels=16"):
        setattr(layer, name, value)
    assert torch.equal(layer(x), before) and torch.equal(layer.get_extra_state(), state["_extra_state"])


@pytest.mark.parametrize("kind, settings, name, value", [
    ("GroupWhitening", {"num_groups": 4}, "effective_num_groups", 8),
    ("BatchWhitening", {"group_size": 16}, "effective_group_size", 4),
    ("BatchWhitening", {"group_size": 16}, "num_groups", 4),
    ("BatchGroupNorm", {"num_groups": 4}, "effective_num_groups", 2),
])
def test_the_group_layout_derived_from_the_settings_cannot_be_changed_or_deleted(kind, settings, name, value):
    # GW computed with an assigned effective_num_groups while its state recorded num_groups 4
    import gwdet.layers

    layer = getattr(gwdet.layers, kind)(16, **settings)
    x = torch.randn(4, 16, 3, 3)
    before = layer(x)
    with pytest.raises(AttributeError, match=rf"^{kind}: {name} is derived from the settings when the layer is built "
                                             rf"\(it is \d+\) and cannot be changed"):
        setattr(layer, name, value)
    for deleted in (name, next(iter(settings))):  # deleted, a setting could be assigned again unchecked
        with pytest.raises(AttributeError, match=rf"^{kind}: {deleted} is set when the layer is built and cannot be "
                                                 "deleted"):
            delattr(layer, deleted)
    assert torch.equal(layer(x), before)


def test_momentum_and_the_example_weight_may_change_on_a_built_layer_within_their_range():
    from gwdet.layers import BatchGroupNorm

    layer = BatchGroupNorm(16, num_groups=4)
    layer.eval_example_weight, layer.momentum = 1, 0.5
    assert (layer.eval_example_weight, layer.momentum) == (1.0, 0.5)
    with pytest.raises(ValueError, match=r"BatchGroupNorm: momentum must be a number in \[0, 1\], got 5"):
        layer.momentum = 5
    assert layer.momentum == 0.5


def test_the_examples_per_group_may_change_on_a_built_layer_as_a_count():
    # 4 was refused as "a number in [0, 1]"; 1 was kept as the float 1.0 (reshape's raw TypeError at the next
    # forward) and 0 accepted (a ZeroDivisionError there)
    from gwdet.layers import BatchGroupNorm

    layer = BatchGroupNorm(16, num_groups=4, examples_per_group=2)
    x = torch.randn(8, 16, 3, 3)
    layer.examples_per_group = 4
    assert layer.examples_per_group == 4 and type(layer.examples_per_group) is int
    assert torch.allclose(layer(x), BatchGroupNorm(16, num_groups=4, examples_per_group=4)(x))
    for value, shown in ((0, "0"), (1.0, r"1.0 \(float\)"), (True, r"True \(bool\)")):
        with pytest.raises(ValueError, match=rf"^BatchGroupNorm: examples_per_group must be an integer >= 1, got {shown}"):
            layer.examples_per_group = value
    assert layer.examples_per_group == 4


# weight/bias set to None on an affine=True layer: it computed without its affine while its state recorded affine=True
def test_an_affine_parameter_set_to_none_is_refused_naming_affine_false():
    from gwdet.layers import GroupWhitening

    layer = GroupWhitening(16, num_groups=4)
    with pytest.raises(AttributeError, match=r"weight cannot be set to None on a layer built with affine=True.*"
                                             r"GroupWhitening\(\.\.\., affine=False\)"):
        layer.weight = None
    with pytest.raises(AttributeError, match=r"bias cannot be set to None"):
        layer.register_parameter("bias", None)
    assert isinstance(layer.weight, torch.nn.Parameter) and isinstance(layer.bias, torch.nn.Parameter)


# a weight added to an affine=False layer: applied in forward, recorded as affine=False, dropped on loading
def test_an_affine_parameter_added_to_a_layer_without_affine_is_refused_naming_affine_true():
    from gwdet.layers import GroupWhitening

    layer = GroupWhitening(16, num_groups=4, affine=False)
    with pytest.raises(AttributeError, match=r"built with affine=False, so it takes no weight \(got a Parameter of "
                                             r"shape \[16\].*GroupWhitening\(\.\.\., affine=True\)"):
        layer.weight = torch.nn.Parameter(torch.full((16,), 2.0))
    assert layer.weight is None and list(layer.state_dict()) == ["_extra_state"]


# a weight of 8 values on 16 channels: raw "The size of tensor a (16) must match ..." at the first forward
def test_an_affine_parameter_of_another_size_is_refused_when_assigned():
    from gwdet.layers import GroupWhitening

    layer = GroupWhitening(16, num_groups=4)
    with pytest.raises(ValueError, match=r"weight must be a floating-point tensor of shape \[16\] \(one value per "
                                         r"channel, num_channels=16\), got a Parameter of shape \[8\]"):
        layer.weight = torch.nn.Parameter(torch.ones(8))
    layer.weight = torch.nn.Parameter(torch.full((16,), 2.0))  # the same shape: accepted
    assert torch.equal(layer.weight, torch.full((16,), 2.0))


# running buffers replaced by None or a tensor of another size: raw AttributeError ('lerp_') / RuntimeError in forward
def test_running_statistics_replaced_by_none_or_another_shape_are_refused_when_assigned():
    from gwdet.layers import BatchWhitening

    layer = BatchWhitening(16, group_size=4)
    with pytest.raises(AttributeError, match=r"running statistic running_mean cannot be set to None.*"
                                             r"reset_running_stats\(\)"):
        layer.register_buffer("running_mean", None)
    with pytest.raises(ValueError, match=r"running_mean must be a floating-point tensor of shape \[16\].*got a Tensor "
                                         r"of shape \[8\]"):
        layer.running_mean = torch.zeros(8)
    with pytest.raises(ValueError, match=r"running_whitening must be a floating-point tensor of shape \[4, 4, 4\]"):
        layer.running_whitening = torch.eye(4)
    with pytest.raises(ValueError, match=r"must not require grad.*assign running_mean.detach\(\) instead"):
        layer.running_mean = torch.zeros(16, requires_grad=True)
    layer.running_mean = torch.ones(16)  # the same shape: accepted
    layer(torch.randn(4, 16, 3, 3))


# gw.affine = True on an affine=True layer was refused as a change, its advice the same layer
def test_assigning_a_setting_its_own_value_changes_nothing_and_is_accepted():
    from gwdet.layers import GroupWhitening

    layer = GroupWhitening(16, num_groups=4)
    layer.affine = True
    layer.num_groups = 4
    layer.method = "itn"
    assert (layer.affine, layer.num_groups, layer.method) == (True, 4, "itn")
    with pytest.raises(AttributeError, match=r"affine is set when the layer is built"):
        layer.affine = 1  # not the flag: refused as before
    with pytest.raises(AttributeError, match=r"num_groups is set when the layer is built"):
        layer.num_groups = 8


# GroupWhitening(16, affine=np.bool_(True)): "affine must be True or False, got np.True_ (bool)"
def test_a_numpy_bool_is_accepted_as_affine_and_recorded_as_a_bool():
    import numpy as np

    from gwdet.layers import BatchWhitening, GroupWhitening

    layer = GroupWhitening(16, num_groups=4, affine=np.bool_(True))
    assert layer.affine is True and layer.weight is not None
    assert BatchWhitening(16, affine=np.bool_(False)).affine is False
    GroupWhitening(16, num_groups=4).load_state_dict(layer.state_dict())


# settings assigned to a scripted GW/BW were used unchecked: T=0 and eps=-1 gave other or all-NaN outputs,
# num_groups=8 stood beside the 4 groups computed, method='svd' failed inside the interpreter
def test_a_scripted_layer_refuses_settings_assigned_to_it():
    from gwdet.layers import BatchWhitening, GroupWhitening

    x = torch.randn(4, 16, 5, 5)
    fix = r"script a layer built with the settings you want, torch\.jit\.script\({}\(\.\.\., setting=value\)\)"
    for layer, name, value, message in [
            (GroupWhitening(16, num_groups=4), "T", 0, r"GroupWhitening: T must be an integer >= 1, got 0"),
            (BatchWhitening(16, group_size=4), "T", 10**12, r"BatchWhitening: T must be an integer from 1 to 1000"),
            (GroupWhitening(16, num_groups=4), "eps", -1.0, r"GroupWhitening: eps must be a number from 1.1754944e-38"),
            (GroupWhitening(16, num_groups=4), "num_groups", 8,
             r"GroupWhitening: num_groups=8 does not give the 4 the layer was built with"),
            (BatchWhitening(16, group_size=4), "method", "svd", r"BatchWhitening: method must be 'itn' or 'zca', got 'svd'"),
            (BatchWhitening(16, group_size=4), "momentum", 5.0, r"BatchWhitening: momentum must be a number in \[0, 1\]")]:
        scripted = torch.jit.script(layer)
        expected = scripted(x)
        setattr(scripted, name, value)
        with pytest.raises(torch.jit.Error, match=message + ".*" + fix.format(type(layer).__name__)):
            scripted(x)
    scripted = torch.jit.script(GroupWhitening(16, num_groups=4))
    scripted.num_groups = 5  # the same 4 groups of 16 channels: the same function
    assert torch.allclose(scripted(x), GroupWhitening(16, num_groups=4)(x), atol=1e-5)
    assert expected.shape == x.shape


# `del gw.weight` left a layer whose forward failed with a raw AttributeError and whose state recorded affine=True
def test_a_built_layers_affine_and_running_statistics_cannot_be_deleted():
    from gwdet.errors import GwdetAttributeError
    from gwdet.layers import BatchGroupNorm, GroupWhitening

    layer = GroupWhitening(16, num_groups=4)
    with pytest.raises(GwdetAttributeError, match=r"^GroupWhitening: weight cannot be deleted from a built layer: .* "
                                                  r"\(affine=False: no weight and bias\)\.$"):
        del layer.weight
    assert isinstance(layer.weight, torch.nn.Parameter)
    statistics = BatchGroupNorm(16, num_groups=4)
    with pytest.raises(GwdetAttributeError, match=r"^BatchGroupNorm: running_mean cannot be deleted from a built "
                                                  r"layer: .* the settings you want\.$"):
        del statistics.running_mean
    assert statistics.running_mean.shape == (16,)


class _Positive(torch.nn.Module):
    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight.abs()


# a parametrized GW recorded torch's subclass name (its state was refused by a plain GW as "of a
# ParametrizedGroupWhitening layer"), and the refusal of `del weight` then refused the parametrization itself
def test_a_parametrized_layer_runs_and_its_state_loads_into_the_plain_layer():
    from torch.nn.utils import parametrize
    from gwdet.checkpoint.compatibility import norm_types
    from gwdet.layers import BatchGroupNorm, GroupWhitening

    for layer in (GroupWhitening(16, num_groups=4), BatchGroupNorm(16, num_groups=4)):
        layer_class, kind = type(layer), type(layer).__name__
        with torch.no_grad():
            layer.weight.copy_(torch.linspace(-2.0, 2.0, 16))
        parametrize.register_parametrization(layer, "weight", _Positive())
        x = torch.randn(4, 16, 3, 3)
        expected = layer.eval()(x)
        assert norm_types(torch.nn.Sequential(layer)) == {"0": kind}
        state = {key.replace("parametrizations.weight.original", "weight"): value
                 for key, value in layer.state_dict().items()}
        plain = layer_class(16, num_groups=4)
        plain.load_state_dict(state)
        with torch.no_grad():
            plain.weight.abs_()
        assert torch.allclose(plain.eval()(x), expected, rtol=0, atol=1e-6)
        parametrize.remove_parametrizations(layer, "weight")
        assert type(layer).__name__ == kind and torch.equal(layer.weight, plain.weight)


# m.T = 0 on a built GW offered the fix "build a new layer: GroupWhitening(..., T=0, ...)", refused in its turn
@pytest.mark.parametrize("kind, name, value, reason", [
    ("GroupWhitening", "T", 0, r"T must be an integer >= 1, got 0"),
    ("GroupWhitening", "eps", -1.0, r"eps must be a finite number > 0, got -1\.0"),
    ("BatchWhitening", "group_size", 0, r"group_size must be an integer >= 1, got 0"),
    ("BatchGroupNorm", "affine", 1, r"affine must be True or False, got 1 \(int\)"),
])
def test_an_invalid_value_for_a_built_setting_names_what_the_constructor_takes(kind, name, value, reason):
    import gwdet.layers

    layer = getattr(gwdet.layers, kind)(16)
    with pytest.raises(AttributeError, match=rf"^{kind}: {name} is set when the layer is built and cannot be changed "
                                             rf"afterwards \(the layer computes with .*\), and {kind}'s constructor "
                                             rf"refuses {name}={value!r} too: {reason}\. To compute with another "
                                             rf"{name}, build a new layer: {kind}\(.*{name}=\.\.\..*\) with values it "
                                             "accepts$") as refused:
        setattr(layer, name, value)
    assert f"{name}={value!r}," not in str(refused.value).split("build a new layer")[1]  # no call that is refused
    with pytest.raises(ValueError, match=reason):  # what the constructor says of that value
        getattr(gwdet.layers, kind)(16, **{name: value})


# a value refused only with the layer's other settings (ZCA with an eps below its smallest) was offered as the fix too
def test_a_built_setting_refused_with_the_other_settings_names_the_constructors_reason():
    from gwdet.layers import GroupWhitening

    layer = GroupWhitening(16, num_groups=4, eps=1e-21)
    with pytest.raises(AttributeError, match=r"constructor refuses method='zca' too with the other settings the layer "
                                             r"has: eps=1e-21 is too small for ZCA whitening.*build a new layer: "
                                             r"GroupWhitening\(num_channels=16, num_groups=4, T=5, eps=1e-21, "
                                             r"method=\.\.\., affine=True\) with values it accepts"):
        layer.method = "zca"
    assert layer.method == "itn"


# a LayerNorm's eps was not recorded: detectron2's LayerNorm of eps 1e-6 loaded into one of eps 10 without a word
@pytest.mark.parametrize("kind", ["detectron2", "torch"])
def test_a_layer_norm_of_another_eps_is_refused_and_one_of_the_same_loads(kind, tmp_path):
    from detectron2.layers.batch_norm import LayerNorm

    def net(eps):
        layer = LayerNorm(16, eps=eps) if kind == "detectron2" else torch.nn.LayerNorm([16, 6, 6], eps=eps)
        return torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), layer)

    ResilientCheckpointer(net(1e-6), save_dir=str(tmp_path)).save("ln")
    with pytest.raises(ValueError, match=r"other norm hyper-parameters .*1 eps 1e-06 -> 10.0"):
        ResilientCheckpointer(net(10.0)).load(str(tmp_path / "ln.pth"))
    ResilientCheckpointer(net(1e-6)).load(str(tmp_path / "ln.pth"))


# a 600-character class name made the settings too long for the state, and the refusal said to shorten eps
def test_settings_too_long_because_of_the_class_name_are_refused_naming_the_class_name():
    from gwdet.errors import GwdetValueError
    from gwdet.layers import GroupWhitening
    long_named = type("G" + "x" * 600, (GroupWhitening,), {})
    with pytest.raises(GwdetValueError, match=r"^Gx{39}\.\.\.x{12}: its settings take 706 bytes as JSON, more than "
                                              r"the 512 .* \(the class name, 601 characters, takes 603 of them\): give "
                                              r"the class a shorter name \(at most 407 characters with these settings\)"):
        long_named(16, num_groups=4)
    type("G" + "x" * 406, (GroupWhitening,), {})(16, num_groups=4).state_dict()


# a state of other num_channels, affine or BW group_size offered "delete '_extra_state' ... to load anyway", after
# which torch refused with a size mismatch or missing keys
def test_a_state_of_other_shapes_is_refused_without_offering_to_load_it_anyway():
    import re

    from gwdet.errors import GwdetValueError
    from gwdet.layers import BatchWhitening, GroupWhitening

    cases = [(GroupWhitening(32, 4), GroupWhitening(16, 4), "num_channels=32",
              "weight: [32] in the state, [16] in this layer; bias: [32] in the state, [16] in this layer"),
             (GroupWhitening(16, 4, affine=False), GroupWhitening(16, 4), "affine=False",
              "the state has no weight, bias, which this layer has"),
             (BatchWhitening(16, 8), BatchWhitening(16, 4), "group_size=8",
              "running_whitening: [2, 8, 8] in the state, [4, 4, 4] in this layer")]
    for saved, layer, setting, shapes in cases:
        expected = (f"was saved with {setting}, but this layer has .*: the weights were trained as another function. "
                    r"Build the layer with the saved values \(.*\): the state's tensors differ from this layer's too "
                    rf"\({re.escape(shapes)}\), so the state cannot be loaded into this layer$")
        with pytest.raises(RuntimeError, match=expected) as refused:
            layer.load_state_dict(saved.state_dict())
        assert "_extra_state" not in str(refused.value)
        with pytest.raises(GwdetValueError, match=expected):  # set_extra_state on its own
            layer.set_extra_state(saved.state_dict()["_extra_state"])
    # settings that leave the tensors as they are: the way out is offered, and it loads
    layer = GroupWhitening(16, 4)
    for other in (GroupWhitening(16, 4, eps=1e-3), GroupWhitening(16, 4, T=3), GroupWhitening(16, 2)):
        with pytest.raises(RuntimeError, match=r"or, to load the weights into this layer anyway, delete '_extra_state' "
                                               r"from the state dict$"):
            layer.load_state_dict(other.state_dict())
        layer.load_state_dict({key: value for key, value in other.state_dict().items() if key != "_extra_state"})


# a float16 BatchGroupNorm's own state_dict, its running_var overflowed to inf in training, was refused as values
# "which no training computes ... (the file may be damaged)"
def test_a_state_whose_float16_running_var_overflowed_is_refused_naming_the_overflow():
    from gwdet.layers import BatchGroupNorm

    torch.manual_seed(0)
    trained = BatchGroupNorm(8, 8, dtype=torch.float16)
    trained((torch.randn(4, 8, 4, 4).clamp(-2, 2) * 30000).half())  # finite float16 values, variance beyond 65504
    assert torch.isinf(trained.running_var).all()
    layer = BatchGroupNorm(8, 8, dtype=torch.float16)
    with pytest.raises(RuntimeError) as refused:
        layer.load_state_dict(trained.state_dict())
    message = str(refused.value)
    assert ("BatchGroupNorm: the state's running_var holds inf values (the first at channel 0): the output would be "
            "NaN. The likely cause: the float16 running statistic overflowed in training, as it does once a batch's "
            "variance exceeds 65504, the largest float16 (inputs beyond about 256 in magnitude). Keep the layer's "
            "buffers in float32: build it in float32 (or call layer.float())") in message, message
    assert "no training computes" not in message and "damaged" not in message
    assert torch.equal(layer.running_var, torch.ones(8, dtype=torch.float16)), "nothing loaded"
    # a NaN is still one no training computes
    state = trained.state_dict()
    state["running_var"][2] = float("nan")
    with pytest.raises(RuntimeError, match=r"running_var holds NaN variances \(at channel 2\), which no training "
                                           r"computes: .*\(the file may be damaged\)"):
        layer.load_state_dict(state)


# a state of a layer pruned with torch.nn.utils.prune, refused by a pruned layer of other settings, was said to hold
# "weight, which this layer has not" (the tensors of an unpruned layer), so the way out was not offered
@pytest.mark.parametrize("kind, settings, other, tensor", [
    ("GroupWhitening", {"num_groups": 4}, {"num_groups": 8}, "weight"),
    ("GroupWhitening", {"num_groups": 4}, {"num_groups": 8}, "bias"),
    ("BatchGroupNorm", {"num_groups": 4}, {"num_groups": 8}, "weight"),
])
def test_a_pruned_state_refused_for_its_settings_names_the_pruned_tensors_as_they_are(kind, settings, other, tensor):
    import torch.nn.utils.prune as prune

    import gwdet.layers
    from gwdet.errors import GwdetValueError

    def built(values, pruned):
        torch.manual_seed(0)
        layer = getattr(gwdet.layers, kind)(16, **values)
        if pruned:
            prune.l1_unstructured(layer, tensor, 0.5)
        return layer

    saved = built(settings, True).state_dict()
    way_out = r"or, to load the weights into this layer anyway, delete '_extra_state' from the state dict$"
    layer = built(other, True)
    with pytest.raises(RuntimeError, match=rf"{kind} was saved with num_groups=4, but this layer has num_groups=8: "
                                           rf"the weights were trained as another function\. .*, {way_out}"):
        layer.load_state_dict(saved)
    with pytest.raises(GwdetValueError, match=way_out):  # set_extra_state on its own, the state named as the layer
        layer.set_extra_state(saved["_extra_state"])
    layer.load_state_dict({key: value for key, value in saved.items() if key != "_extra_state"})
    assert torch.equal(getattr(layer, f"{tensor}_mask"), saved[f"{tensor}_mask"])
    # one pruned, the other not: the tensors differ, and the state cannot be loaded
    cannot = r"\), so the state cannot be loaded into this layer$"
    with pytest.raises(RuntimeError, match=rf"the state's tensors differ from this layer's too \(the state has no "
                                           rf"{tensor}, which this layer has; the state has {tensor}_orig, "
                                           rf"{tensor}_mask, which this layer has not{cannot}"):
        built(other, False).load_state_dict(saved)
    with pytest.raises(RuntimeError, match=rf"the state's tensors differ from this layer's too \(the state has no "
                                           rf"{tensor}_orig, {tensor}_mask, which this layer has; the state has "
                                           rf"{tensor}, which this layer has not{cannot}"):
        layer.load_state_dict(built(settings, False).state_dict())


# a pruned BatchWhitening's state of another group_size listed a weight difference beside the running_whitening one
def test_a_pruned_batch_whitening_state_of_another_group_size_names_only_its_running_whitening():
    import torch.nn.utils.prune as prune

    from gwdet.layers import BatchWhitening

    saved, layer = BatchWhitening(16, group_size=4), BatchWhitening(16, group_size=8)
    prune.l1_unstructured(saved, "weight", 0.5)
    prune.identity(layer, "weight")
    with pytest.raises(RuntimeError, match=r"the state's tensors differ from this layer's too \(running_whitening: "
                                           r"\[4, 4, 4\] in the state, \[2, 8, 8\] in this layer\), so the state "
                                           r"cannot be loaded into this layer$"):
        layer.load_state_dict(saved.state_dict())
