"""gwdet.norm / Norm / norm_from_config / register_norm: values travel with the callable."""
import inspect
import itertools
import pickle
import re

import pytest
import torch
from detectron2.config import get_cfg
from detectron2.layers import get_norm

import gwdet
from gwdet import Norm, UnknownNormError, add_gwdet_config, known_norm_names, norm, norm_from_config, register_norm
from gwdet.config import CONFIG_KEYS, config_default
from gwdet.errors import GwdetTypeError, GwdetValueError
from gwdet.layers import BatchGroupNorm, BatchWhitening, GroupWhitening
from gwdet.norms import layer_types, norm_record, unregister_norm

GWDET_NAMES = {"GW": GroupWhitening, "GW_ZCA": GroupWhitening, "BW": BatchWhitening,
               "BW_ItN": BatchWhitening, "BGN": BatchGroupNorm, "GhostBN": BatchGroupNorm}


@pytest.mark.parametrize("name", sorted(GWDET_NAMES))
def test_every_name_builds_its_layer_through_detectron2s_get_norm(name):
    # what the layers then do: test_layer_contract.py
    assert isinstance(get_norm(norm(name), 64), GWDET_NAMES[name])


def test_values_given_reach_the_layer_and_the_rest_are_the_config_defaults():
    layer = norm("GW", num_groups=16, T=3)(64)
    assert (layer.num_groups, layer.T, layer.eps) == (16, 3, config_default("MODEL.GW.EPS"))
    bgn = norm("BGN", examples_per_group=1, eval_example_weight=0.25)(64)
    assert bgn.examples_per_group == 1 and bgn.eval_example_weight == 0.25
    assert bgn.num_groups == config_default("MODEL.BGN.NUM_GROUPS")
    ghost = norm("GhostBN")(48)
    assert ghost.num_groups == 48, "GhostBN: one channel per group"
    assert norm("GW_ZCA")(64).method == "zca" and norm("BW_ItN")(64).method == "itn"


@pytest.mark.parametrize("layer_class, prefix", [(GroupWhitening, "MODEL.GW."), (BatchWhitening, "MODEL.BW."),
                                                 (BatchGroupNorm, "MODEL.BGN.")])
def test_layer_defaults_agree_with_the_config_table(layer_class, prefix):
    keys = {key.name[len(prefix):].lower(): key.default for key in CONFIG_KEYS if key.name.startswith(prefix)}
    parameters = {name.lower(): p.default for name, p in inspect.signature(layer_class).parameters.items()}
    shared = set(keys) & set(parameters)
    assert len(shared) >= 3, shared
    assert {k: keys[k] for k in shared} == {k: parameters[k] for k in shared}


def test_norms_compare_hash_pickle_and_show_every_value():
    a, b = norm("GW", num_groups=16), Norm("GW", num_groups=16, T=5, eps=1e-5)
    assert a == b and hash(a) == hash(b) and a != norm("GW", num_groups=8)
    assert pickle.loads(pickle.dumps(a)) == a
    assert repr(a) == "Norm('GW', num_groups=16, T=5, eps=1e-05)"
    assert a != "GW" and not (a == ""), "detectron2 tests norm == '' for the bias"


def test_unknown_name_is_a_key_error_listing_the_known_names():
    with pytest.raises(KeyError) as err:
        norm("GWW")
    assert isinstance(err.value, UnknownNormError)
    message = str(err.value)
    assert "'GWW'" in message and "register_norm" in message
    for name in ("BN", "FrozenBN", "SyncBN", "GN", *GWDET_NAMES):
        assert name in message


# gwdet.norm('') (for "no norm") was refused as an unknown name, with the advice to register it
@pytest.mark.parametrize("name", ["", None])
def test_an_empty_name_says_how_to_have_no_norm(name):
    with pytest.raises(UnknownNormError, match=rf"^{name!r} names no norm, so there is nothing to build or look up\. "
                                               r"For no norm, give '' where the norm goes: NORM: \"\" in a yacs config, "
                                               rf".* in place of gwdet.norm\({name!r}\)\..* Else give a norm's name: "
                                               r"BGN, BN"):
        norm(name)


def test_bad_hyper_parameters_are_named():
    with pytest.raises(TypeError, match="num_group"):
        norm("GW", num_group=16)
    with pytest.raises(ValueError, match="num_groups of norm 'GW' must be an integer >= 1, got 0"):
        norm("GW", num_groups=0)
    with pytest.raises(ValueError, match="momentum of norm 'BW' must be a number in"):
        norm("BW", momentum=2.0)


def test_a_key_error_inside_a_build_function_is_not_relabeled(registered):
    registered.append("TestBrokenNorm")

    @register_norm("TestBrokenNorm")
    def _broken(channels):
        raise KeyError("missing table entry")

    with pytest.raises(KeyError) as err:
        norm("TestBrokenNorm")(8)
    assert not isinstance(err.value, UnknownNormError) and err.value.args == ("missing table entry",)


def test_a_string_for_a_number_of_a_registered_norm_is_refused_where_it_is_given(registered):
    # gwdet.norm("TestScaledLN", scale="2.0") built, then the first forward failed inside the user's own layer
    registered.append("TestScaledLN")

    @register_norm("TestScaledLN")
    def _scaled(channels, scale=1.0, label="ln"):
        return torch.nn.GroupNorm(1, channels, eps=1e-5 * scale)

    with pytest.raises(TypeError, match=r"gwdet.norm\('TestScaledLN'\): scale='2.0' is a string, and the norm's build "
                                        r"takes a number there \(its default is 1.0\): give scale as a number"):
        norm("TestScaledLN", scale="2.0")
    assert norm("TestScaledLN", scale=2, label="other").params == {"scale": 2, "label": "other"}


# gwdet.norm("MyBN", track_running_stats="no")(8) of a registered BatchNorm2d built a layer that kept running stats
def test_a_non_bool_for_a_flag_of_a_registered_norm_is_refused_where_it_is_given(registered):
    import numpy as np

    from gwdet.errors import GwdetValueError

    registered.append("TestFlagBN")
    register_norm("TestFlagBN", torch.nn.BatchNorm2d)
    for value in ("no", 0, None):
        with pytest.raises(GwdetValueError, match=rf"gwdet.norm\('TestFlagBN'\): track_running_stats={value!r} is not "
                                                  r"True or False, and the norm's build takes a flag there \(its default "
                                                  r"is True\).* give track_running_stats=True or track_running_stats=False"):
            norm("TestFlagBN", track_running_stats=value)
    assert norm("TestFlagBN", track_running_stats=False)(8).track_running_stats is False
    assert norm("TestFlagBN", affine=np.False_)(8).weight is None


# a build returning a conditional norm (a norm holding a Linear) or Sequential(Conv2d, GroupNorm) was refused, saying
# the optimizer would give the Linear/Conv2d the norm weight decay, which gwdet's and detectron2's builders do not
def test_a_registered_norm_that_holds_a_convolution_or_linear_layer_builds_and_that_layer_keeps_the_weight_decay(
        registered):
    from detectron2.solver.build import get_default_optimizer_params as detectron2_optimizer_params

    from gwdet.solver import get_default_optimizer_params

    class CondNorm(torch.nn.Module):
        def __init__(self, channels):
            super().__init__()
            self.gn = torch.nn.GroupNorm(4, channels, affine=False)
            self.scale = torch.nn.Linear(channels, channels)
            self.gamma = torch.nn.Parameter(torch.ones(channels))

        def forward(self, x):
            return self.gn(x) * self.gamma[:, None, None]

    registered.extend(["TestCondNorm", "TestConvNorm"])
    register_norm("TestCondNorm", lambda channels: CondNorm(channels), layer_types=(CondNorm,))
    register_norm("TestConvNorm", lambda channels: torch.nn.Sequential(torch.nn.Conv2d(channels, channels, 1),
                                                                     torch.nn.GroupNorm(1, channels)))
    for name, computing, normalizing in (("TestCondNorm", "scale", "gamma"), ("TestConvNorm", "0", "1.weight")):
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), norm(name)(16))
        assert model(torch.randn(1, 3, 8, 8)).shape == (1, 16, 6, 6)
        parameters = dict(model.named_parameters())
        ours = get_default_optimizer_params(model, base_lr=0.1, weight_decay=1e-4, weight_decay_norm=0.5)
        detectron2s = detectron2_optimizer_params(model, base_lr=0.1, weight_decay=1e-4, weight_decay_norm=0.5)
        for groups in (ours, detectron2s):
            decay = {id(param): group["weight_decay"] for group in groups for param in group["params"]}
            assert decay[id(parameters[f"1.{computing}.weight"])] == decay[id(parameters[f"1.{computing}.bias"])] == 1e-4
        assert [group["weight_decay"] for group in ours
                if any(param is parameters[f"1.{normalizing}"] for param in group["params"])] == [0.5]


# groups=0 stopped on torch's bare ZeroDivisionError inside the build; groups=-2 built GroupNorm(-2, 64) without a word,
# its first forward failing with torch's "Expected num groups to be greater than 0, got -2"
def test_a_registered_norm_with_a_group_count_torch_takes_only_at_the_forward_is_refused_naming_the_value(registered):
    registered.append("TestZeroGroups")
    register_norm("TestZeroGroups", lambda channels, groups=4: torch.nn.GroupNorm(groups, channels),
                  config_keys={"groups": "MODEL.TEST_ZERO_GROUPS.GROUPS"})
    with pytest.raises(GwdetValueError, match=r"^The norm 'TestZeroGroups' \(a registered name\) could not build a layer "
                                              r"of 64 channels with groups=0 \(the values of gwdet.norm\): its build "
                                              r"function .* raised ZeroDivisionError: integer modulo by zero\. Give "
                                              r"values it can build with") as refused:
        norm("TestZeroGroups", groups=0)(64)
    assert isinstance(refused.value.__cause__, ZeroDivisionError)
    with pytest.raises(GwdetValueError, match=r"^The norm 'TestZeroGroups' \(a registered name\): its build function "
                                              r".* returned a GroupNorm for 64 channels with groups=-2 \(the values of "
                                              r"gwdet.norm\), holding GroupNorm\(-2, 64\): torch's GroupNorm needs at "
                                              r"least 1 group .* Give values it can build with\."):
        norm("TestZeroGroups", groups=-2)(64)
    from gwdet.model_zoo import build_config

    from conftest import DEMO_CONFIG

    cfg = build_config(str(DEMO_CONFIG), ["MODEL.TEST_ZERO_GROUPS.GROUPS", "-2"])  # read from a yacs config: the key
    with pytest.raises(GwdetValueError, match=r"with groups=-2 \(groups from MODEL.TEST_ZERO_GROUPS.GROUPS in a yacs "
                                              r"config\), holding GroupNorm\(-2, 64\)"):
        norm_from_config("TestZeroGroups", cfg)(64)
    assert norm("TestZeroGroups", groups=2)(64).num_groups == 2


def test_users_register_their_own_name_with_config_keys(registered):
    registered.append("TestGN")

    def _other_default(channels, num_groups=4):
        return torch.nn.GroupNorm(num_groups, channels)

    # a default other than the key's would be used by no config that leaves the key alone (it built 32 groups)
    with pytest.raises(ValueError, match=r"register_norm\('TestGN'\): _other_default gives num_groups the default 4, "
                                         r"but reads it from the config key MODEL.GN.NUM_GROUPS, whose default in "
                                         r"detectron2's or gwdet's config is 32: .* Give num_groups the default 32 or none"):
        register_norm("TestGN", _other_default, config_keys={"num_groups": "MODEL.GN.NUM_GROUPS"})
    assert "TestGN" not in known_norm_names()

    @register_norm("TestGN", config_keys={"num_groups": "MODEL.GN.NUM_GROUPS"})
    def _test_gn(channels, num_groups):
        return torch.nn.GroupNorm(num_groups, channels)

    assert "TestGN" in known_norm_names()
    assert norm("TestGN")(64).num_groups == 32, "default of the config key it reads"
    cfg = add_gwdet_config(get_cfg())
    cfg.MODEL.GN.NUM_GROUPS = 2
    assert norm_from_config("TestGN", cfg)(8).num_groups == 2
    with pytest.raises(ValueError, match="built-in"):
        register_norm("GW", _test_gn)
    with pytest.raises(ValueError, match="does not take"):
        register_norm("TestBad", _test_gn, config_keys={"groups": "MODEL.GN.NUM_GROUPS"})
    assert "TestBad" not in known_norm_names()


def test_a_registered_names_own_config_key_can_be_set_in_a_config_file(registered, tmp_path):
    # docs/usage.md's recipe: MODEL.MY_GN.NUM_GROUPS was refused as "not a key of detectron2's or gwdet's config"
    from gwdet.model_zoo import build_config

    from conftest import DEMO_CONFIG

    registered.append("TestMyGN")

    @register_norm("TestMyGN", config_keys={"num_groups": "MODEL.TEST_MY_GN.NUM_GROUPS"})
    def _test_my_gn(channels, num_groups=16):
        return torch.nn.GroupNorm(num_groups, channels)

    config = tmp_path / "mine.yaml"
    config.write_text(f'_BASE_: "{DEMO_CONFIG}"\nMODEL:\n  FPN:\n    NORM: "TestMyGN"\n  TEST_MY_GN:\n    NUM_GROUPS: 4\n')
    cfg = build_config(str(config))
    assert cfg.MODEL.TEST_MY_GN.NUM_GROUPS == 4 and norm_from_config("TestMyGN", cfg)(8).num_groups == 4
    assert build_config(str(DEMO_CONFIG)).MODEL.TEST_MY_GN.NUM_GROUPS == 16  # the build function's default
    # a second name reading the key with another default would build with the first one's (4 instead of its 8)
    with pytest.raises(ValueError, match=r"register_norm\('TestMyGN8'\): the config key MODEL.TEST_MY_GN.NUM_GROUPS "
                                         r"is read by 'TestMyGN' too, with the default 16, and 'TestMyGN8' gives it the default 8"):
        register_norm("TestMyGN8", lambda channels, num_groups=8: torch.nn.GroupNorm(num_groups, channels),
                      config_keys={"num_groups": "MODEL.TEST_MY_GN.NUM_GROUPS"})
    assert "TestMyGN8" not in known_norm_names()


def test_a_registered_config_key_below_a_value_or_naming_a_section_is_refused_at_registration(registered):
    # MODEL.GN.NUM_GROUPS.X was blamed on the user's config at build time ("is 8, not a section of keys ... set its
    # keys instead of replacing it"), though the registration mapped the keyword below a value
    with pytest.raises(ValueError, match=r"^register_norm\('TestBelow'\): the config key MODEL.GN.NUM_GROUPS.X \(for g\) "
                                         r"lies below MODEL.GN.NUM_GROUPS, which detectron2's or gwdet's config holds "
                                         r"as a value, not as a section: give g a key of its own, e.g. "
                                         r"MODEL.TESTBELOW.G\.$"):
        register_norm("TestBelow", lambda channels, g=1: torch.nn.GroupNorm(g, channels),
                      config_keys={"g": "MODEL.GN.NUM_GROUPS.X"})
    assert "TestBelow" not in known_norm_names()


# config_keys={"g": "model.my.g"} was registered, and then every config was refused ("model is not a section ...
# Did you mean MODEL?"), and one setting MODEL.MY.G as "not a key"
def test_a_registered_config_key_no_config_can_hold_is_refused_with_the_key_that_can_be(registered, tmp_path):
    from gwdet.model_zoo import build_config

    from conftest import DEMO_CONFIG

    registered.append("TestCased")
    with pytest.raises(ValueError, match=r"^register_norm\('TestCased'\): no config can hold the config key model.my.g "
                                         r"\(for g\): it is not in upper case, as every key of detectron2's and gwdet's "
                                         r"configs is, .* write it in upper case, as detectron2's and "
                                         r"gwdet's keys are: config_keys=\{'g': 'MODEL.MY.G'\}\.$"):
        register_norm("TestCased", lambda channels, g=8: torch.nn.GroupNorm(g, channels), config_keys={"g": "model.my.g"})
    assert "TestCased" not in known_norm_names()
    with pytest.raises(ValueError, match=r"MODEL.fpn.G \(for g\): it is not in upper case.*'MODEL.FPN.G'"):
        register_norm("TestCased", lambda channels, g=8: torch.nn.GroupNorm(g, channels), config_keys={"g": "MODEL.fpn.G"})
    with pytest.raises(ValueError, match=r"the config key MODEL.GW.MY_G \(for g\): it lies among gwdet's own keys "
                                         r"\(MODEL.GW...\).* give g a key of its own, e.g. config_keys=\{'g': "
                                         r"'MODEL.TESTCASED.G'\}"):
        register_norm("TestCased", lambda channels, g=8: torch.nn.GroupNorm(g, channels), config_keys={"g": "MODEL.GW.MY_G"})
    assert "TestCased" not in known_norm_names()
    # the spelling the message gives is one a config file sets
    register_norm("TestCased", lambda channels, g=8: torch.nn.GroupNorm(g, channels), config_keys={"g": "MODEL.MY.G"})
    config = tmp_path / "mine.yaml"
    config.write_text(f'_BASE_: "{DEMO_CONFIG}"\nMODEL:\n  FPN:\n    NORM: "TestCased"\n  MY:\n    G: 4\n')
    assert norm_from_config("TestCased", build_config(str(config)))(8).num_groups == 4


def test_a_registered_key_shared_with_a_name_without_its_default_or_of_another_type_is_refused(registered):
    # a name without a default built with another name's 16 for the same key; num_groups read from MODEL.MASK_ON
    # built GroupNorm(True, 64), one group from a bool
    registered.append("TestKeyed16")
    register_norm("TestKeyed16", lambda channels, num_groups=16: torch.nn.GroupNorm(num_groups, channels),
                  config_keys={"num_groups": "MODEL.TEST_KEYED.G"})
    with pytest.raises(ValueError, match=r"is read by 'TestKeyed16' too, with the default 16, and 'TestKeyedNone' "
                                         r"gives it no default"):
        register_norm("TestKeyedNone", lambda channels, num_groups: torch.nn.GroupNorm(num_groups, channels),
                      config_keys={"num_groups": "MODEL.TEST_KEYED.G"})
    with pytest.raises(ValueError, match=r"^register_norm\('TestFromBool'\): the config key MODEL.MASK_ON holds bool "
                                         r"values \(its default is False\), and 'TestFromBool' reads its num_groups "
                                         r"\(default 8, integer\) from it: give num_groups a key of integer values"):
        register_norm("TestFromBool", lambda channels, num_groups=8: torch.nn.GroupNorm(num_groups, channels),
                      config_keys={"num_groups": "MODEL.MASK_ON"})
    with pytest.raises(ValueError, match=r"MODEL.GN.NUM_GROUPS holds integer values .* reads its eps \(default 1e-05, "
                                         r"float\)"):  # it built GroupNorm(4, 64, eps=32)
        register_norm("TestFromBool", lambda channels, eps=1e-5: torch.nn.GroupNorm(4, channels, eps=eps),
                      config_keys={"eps": "MODEL.GN.NUM_GROUPS"})
    assert "TestKeyedNone" not in known_norm_names() and "TestFromBool" not in known_norm_names()


def test_an_error_of_a_registered_build_function_names_the_norm_and_its_values(registered):
    # torch's bare "num_channels (64) must be divisible by num_groups (5)", naming neither the norm nor the key
    registered.append("TestGroups")
    register_norm("TestGroups", lambda channels, num_groups=32: torch.nn.GroupNorm(num_groups, channels),
                  config_keys={"num_groups": "MODEL.GN.NUM_GROUPS"})
    with pytest.raises(ValueError) as refused:
        norm("TestGroups", num_groups=5)(64)
    assert str(refused.value).startswith(
        "The norm 'TestGroups' (a registered name) could not build a layer of 64 channels with num_groups=5 "
        "(the values of gwdet.norm): its build function ")
    assert "<lambda> raised ValueError: num_channels (64) must be divisible by num_groups (5)." in str(refused.value)
    assert isinstance(refused.value.__cause__, ValueError)
    cfg = add_gwdet_config(get_cfg())
    cfg.MODEL.GN.NUM_GROUPS = 5  # read from a yacs config: its key is named
    with pytest.raises(ValueError, match=r"with num_groups=5 \(num_groups from MODEL.GN.NUM_GROUPS in a yacs config\)"):
        norm_from_config("TestGroups", cfg)(64)


def test_a_name_is_registered_once(registered):
    registered.append("TestOnce")
    register_norm("TestOnce", lambda channels: torch.nn.GroupNorm(1, channels))
    first = norm_record("TestOnce")
    with pytest.raises(ValueError, match="'TestOnce' is already registered.*unregister_norm"):
        register_norm("TestOnce", lambda channels: torch.nn.LayerNorm(channels))
    with pytest.raises(ValueError, match="'TestOnce' is already registered"):
        register_norm("TestOnce")(lambda channels: torch.nn.LayerNorm(channels))
    assert norm_record("TestOnce") is first, "the first registration stays"
    for name in ("BN", "SyncBN", "FrozenBN", "GN", "LN", "GW", "BGN"):  # detectron2's and gwdet's
        with pytest.raises(ValueError, match=f"{name!r} is a built-in norm name"):
            register_norm(name, lambda channels: torch.nn.LayerNorm(channels))
        with pytest.raises(ValueError, match=f"{name!r} is a built-in norm name"):
            unregister_norm(name)
    unregister_norm("TestOnce")  # a plugin that reloads unregisters, then registers again
    register_norm("TestOnce", lambda channels: torch.nn.GroupNorm(2, channels))
    assert norm("TestOnce")(8).num_groups == 2
    with pytest.raises(UnknownNormError):
        unregister_norm("TestNeverRegistered")


def test_the_catalogue_holds_every_fact_about_a_name():
    assert norm_record("BN").detectron2_values == {} and norm_record("BN").detectron2_per_level
    assert norm_record("GN").detectron2_values == {"num_groups": 32}
    assert norm_record("GW").detectron2_values is None and not norm_record("GW").batch_statistics
    assert {name for name in known_norm_names() if norm_record(name).example_groups} == {"BGN", "GhostBN"}
    assert {name for name in known_norm_names() if norm_record(name).detectron2_per_level} == {"BN", "SyncBN"}
    with_statistics = layer_types(batch_statistics=True)
    assert issubclass(torch.nn.SyncBatchNorm, with_statistics) and BatchWhitening in with_statistics
    assert GroupWhitening not in with_statistics and GroupWhitening in layer_types()
    for name in known_norm_names():  # every layer a name builds is of its record's types
        if name not in ("SyncBN", "nnSyncBN"):  # those need a process group to run, not to build
            assert isinstance(norm(name)(32), norm_record(name).layer_types), name


def test_norm_from_config_carries_the_configs_values():
    cfg = add_gwdet_config(get_cfg())
    cfg.MODEL.GW.NUM_GROUPS, cfg.MODEL.GW.T, cfg.MODEL.GW.EPS = 8, 3, 1e-3
    assert norm_from_config("GW", cfg) == norm("GW", num_groups=8, T=3, eps=1e-3)
    cfg.MODEL.BW.GROUP_SIZE = 4
    assert norm_from_config("BW", cfg)(32).group_size == 4


def test_norm_from_config_keeps_detectron2s_names_as_detectron2_builds_them():
    cfg = add_gwdet_config(get_cfg())
    for name in ("", "BN", "FrozenBN", "SyncBN", "LN"):
        assert norm_from_config(name, cfg) == name
    callable_norm = norm("GW")
    assert norm_from_config(callable_norm, cfg) is callable_norm
    # GN has a config value: gwdet builds it (the divisor rule), with detectron2's 32 groups too, as
    # torch's GroupNorm with its state dict, as detectron2 builds it
    assert norm_from_config("GN", cfg) == norm("GN", num_groups=32)
    gn = norm_from_config("GN", cfg)(64)
    assert type(gn) is torch.nn.GroupNorm and gn.num_groups == 32
    assert gn.state_dict().keys() == get_norm("GN", 64).state_dict().keys()
    cfg.MODEL.GN.NUM_GROUPS = 16
    assert norm_from_config("GN", cfg)(64).num_groups == 16


def test_norm_from_config_refuses_a_config_without_gwdets_keys():
    with pytest.raises(KeyError, match=r"The norm 'GW' needs gwdet's config keys .*add_gwdet_config"):
        norm_from_config("GW", get_cfg())
    assert norm_from_config("BN", get_cfg()) == "BN"


def test_detectron2s_get_norm_is_not_changed_by_gwdet():
    with pytest.raises(KeyError):
        get_norm("GW", 64)
    assert get_norm("GN", 64).num_groups == 32
    assert gwdet.norm("GN")(64).num_groups == 32


# The adjustment is logged once per process for each message; the suite can run twice in one
# process (mutation testing), so each run of the test below asks with a channel count of its own.
_CHANNEL_RUNS = itertools.count()


def test_a_group_number_the_channels_cannot_use_is_logged_or_refused_never_silent(caplog):
    import logging

    channels = 256 * 2 ** next(_CHANNEL_RUNS)  # 48 divides none of them; the layer uses 32 groups
    other = channels * 3  # 48 divides 768 * 2**k: no adjustment; 40 does not, and 8 groups are used
    with caplog.at_level(logging.WARNING, logger="gwdet.norms"):
        layer = norm("GW", num_groups=48)(channels)
        norm("GW", num_groups=40)(other)
    assert layer.effective_num_groups == 32
    messages = [(record.name, record.getMessage()) for record in caplog.records]
    assert ("gwdet.norms", f"GW with 48 groups cannot divide {channels} channels; the layer uses 32.") in messages
    assert ("gwdet.norms", f"GW with 40 groups cannot divide {other} channels; the layer uses 32.") in messages, \
        "each different adjustment is logged, not only the first"
    with pytest.raises(ValueError) as refused:
        norm("GW", num_groups=48, strict=True)(256)
    # "the layer uses 32" in a refusal, where no layer is built
    assert str(refused.value) == ("GW with 48 groups cannot divide 256 channels (strict: refused; allowed, the layer "
                                  "would use 32). Choose a value that divides the channels, or allow the adjustment "
                                  "(strict=False; MODEL.STRICT_NORM_GROUPS False).")
    with pytest.raises(ValueError, match="BW with 48 channels per group cannot divide 256 channels"):
        norm("BW", group_size=48, strict=True)(256)
    assert norm("GW", num_groups=32, strict=True)(256).effective_num_groups == 32


def test_strict_norm_groups_holds_in_detectron2s_own_build_model():
    from detectron2.modeling import build_model

    from conftest import DEMO_CONFIG, TINY_OPTS
    from gwdet.model_zoo import build_config

    cfg = build_config(str(DEMO_CONFIG), TINY_OPTS + ["MODEL.GW.NUM_GROUPS", "48", "MODEL.STRICT_NORM_GROUPS", "True"])
    with pytest.raises(ValueError, match="GW with 48 groups cannot divide"):
        build_model(cfg)  # detectron2's builder, not gwdet's Trainer


# A value of every hyper-parameter that is no name's default, all different from each other.
NON_DEFAULT = {"num_groups": 4, "T": 3, "eps": 1e-3, "group_size": 8, "momentum": 0.25, "examples_per_group": 1,
               "eval_example_weight": 0.75}


@pytest.mark.parametrize("name", sorted(GWDET_NAMES))
def test_every_hyper_parameter_reaches_the_layer(name):
    params = norm_record(name).params()
    assert params, name
    values = {param: NON_DEFAULT[param] for param in params}
    layer = norm(name, **values)(32)
    assert {param: getattr(layer, param) for param in params} == values
    assert all(values[param] != norm_record(name).default(param) for param in params), "values the defaults are not"
    methods = {"GW": "itn", "GW_ZCA": "zca", "BW": "zca", "BW_ItN": "itn"}
    if name in methods:
        assert layer.method == methods[name]


def test_norms_with_other_values_or_strictness_differ_in_equality_hash_and_repr():
    base = norm("GW", num_groups=16)
    strict = norm("GW", num_groups=16, strict=True)
    assert strict != base and hash(strict) != hash(base)
    assert repr(strict) == "Norm('GW', num_groups=16, T=5, eps=1e-05, strict=True)"
    assert len({hash(norm("GW", num_groups=g)) for g in (8, 16, 32)}) == 3


def test_a_registered_name_has_the_facts_it_was_registered_with(registered):
    registered.extend(["TestPlain", "TestBatch"])
    register_norm("TestPlain", lambda channels, groups=2: torch.nn.GroupNorm(groups, channels))
    plain = norm_record("TestPlain")
    assert (plain.name, plain.batch_statistics, plain.layer_types, plain.builtin) == ("TestPlain", False, (), False)
    assert plain.default("groups") == 2 and norm("TestPlain")(8).num_groups == 2  # no config key: its own default
    register_norm("TestBatch", lambda channels: torch.nn.BatchNorm2d(channels), batch_statistics=True,
                  layer_types=[torch.nn.BatchNorm2d])
    batch = norm_record("TestBatch")
    assert batch.batch_statistics is True and batch.layer_types == (torch.nn.BatchNorm2d,)
    for bad in ("", None, 3):
        with pytest.raises(ValueError, match=rf"register_norm: name must be a non-empty string, got {bad!r}"):
            register_norm(bad, lambda channels: torch.nn.Identity())


def test_a_taken_name_names_who_registered_it(registered):
    registered.append("TestTaken")

    def build_taken(channels):
        return torch.nn.GroupNorm(1, channels)

    register_norm("TestTaken", build_taken)
    with pytest.raises(ValueError) as err:
        register_norm("TestTaken", lambda channels: torch.nn.LayerNorm(channels))
    assert str(err.value) == (
        f"register_norm: 'TestTaken' is already registered (by {__name__}."
        "test_a_taken_name_names_who_registered_it.<locals>.build_taken); choose another name, or call "
        "gwdet.norms.unregister_norm('TestTaken') first")


def test_the_decorator_refuses_a_taken_name_when_made_and_when_applied(registered):
    registered.append("TestDecorated")
    register_norm("TestDecorated", lambda channels: torch.nn.GroupNorm(1, channels))
    with pytest.raises(ValueError, match="'TestDecorated' is already registered"):
        register_norm("TestDecorated")(lambda channels: torch.nn.LayerNorm(channels))  # refused once applied
    registered.append("TestLate")
    decorate = register_norm("TestLate")  # free when the decorator is made ...
    register_norm("TestLate", lambda channels: torch.nn.GroupNorm(1, channels))  # ... taken before it is applied
    with pytest.raises(ValueError, match="'TestLate' is already registered"):
        decorate(lambda channels: torch.nn.LayerNorm(channels))


def test_detectron2_builds_a_name_only_with_its_own_values():
    from gwdet.norms import detectron2_builds, detectron2_builds_as_configured

    assert detectron2_builds("GN", {}) and detectron2_builds("GN", {"num_groups": 32})  # default: the config's 32
    assert not detectron2_builds("GN", {"num_groups": 16}) and not detectron2_builds("GW", {})
    assert detectron2_builds("BN", {})
    cfg = get_cfg()  # without gwdet's keys: fine for names that read none
    assert detectron2_builds_as_configured("", cfg) and detectron2_builds_as_configured(None, cfg)
    assert detectron2_builds_as_configured("BN", cfg)
    cfg = add_gwdet_config(get_cfg())
    assert detectron2_builds_as_configured("GN", cfg) and not detectron2_builds_as_configured("GW", cfg)
    cfg.MODEL.GN.NUM_GROUPS = 16
    assert not detectron2_builds_as_configured("GN", cfg)


def test_a_taken_name_whose_builder_has_no_qualname_is_named_by_its_repr(registered):
    import functools

    registered.append("TestPartial")
    build = functools.partial(torch.nn.GroupNorm, 1)
    register_norm("TestPartial", build)
    with pytest.raises(ValueError) as err:
        register_norm("TestPartial", functools.partial(torch.nn.GroupNorm, 2))
    assert f"(by functools.{build!r}); choose another name" in str(err.value)


def test_the_same_registration_again_is_taken_as_it_is(registered, tmp_path):
    # docs/usage.md's LazyConfig that registers its norm could be read once per process: "already registered"
    from gwdet.model_zoo.lazy_loading import load_lazy_config

    registered.append("TestFromFile")
    config = tmp_path / "own_norm.py"
    config.write_text("import torch\nimport gwdet\n\n\n@gwdet.register_norm('TestFromFile', config_keys={})\n"
                      "def own_norm(channels, num_groups=4):\n    return torch.nn.GroupNorm(num_groups, channels)\n\n\n"
                      "model = dict(norm=gwdet.norm('TestFromFile', num_groups=2))\n")
    for _ in range(2):
        load_lazy_config(str(config))
    assert norm("TestFromFile", num_groups=2)(8).num_groups == 2
    with pytest.raises(ValueError, match="'TestFromFile' is already registered"):  # other code: another registration
        register_norm("TestFromFile", lambda channels, num_groups=4: torch.nn.GroupNorm(num_groups, channels))
    # a file whose layer class of the same name computes otherwise: another registration, not the same one
    registered.append("TestOwnClass")
    layer = ("import torch\nimport gwdet\n\n\nclass Own(torch.nn.GroupNorm):\n    def forward(self, x):\n"
             "        return super().forward(x) * {}\n\n\n@gwdet.register_norm('TestOwnClass')\n"
             "def own(channels):\n    return Own(1, channels)\n")
    for scale, name in ((1, "first.py"), (1, "again.py")):
        (tmp_path / name).write_text(layer.format(scale))
        load_lazy_config(str(tmp_path / name))  # the same class and build: taken
    (tmp_path / "other.py").write_text(layer.format(2))
    with pytest.raises(ValueError, match="'TestOwnClass' is already registered"):
        load_lazy_config(str(tmp_path / "other.py"))


def test_gn_with_a_group_count_the_channels_cannot_use_follows_gws_rule_logged_or_refused(caplog):
    import logging

    channels = 16 * 37 ** next(_CHANNEL_RUNS)  # of each run its own (logged once per process); 16 divides it, 17-32 not
    with caplog.at_level(logging.WARNING, logger="gwdet.norms"):
        layer = norm("GN", num_groups=32)(channels)
    assert isinstance(layer, torch.nn.GroupNorm) and (layer.num_groups, layer.requested_num_groups) == (16, 32)
    assert ("gwdet.norms", f"GN with 32 groups cannot divide {channels} channels; the layer uses 16.") in [
        (record.name, record.getMessage()) for record in caplog.records]
    x = torch.randn(2, channels, 3, 3)
    assert torch.equal(layer(x), torch.nn.functional.group_norm(x, 16, layer.weight, layer.bias, layer.eps))
    with pytest.raises(ValueError, match=rf"GN with 32 groups cannot divide {channels} channels \(strict: refused; "
                                         r"allowed, the layer would use 16\). Choose a value .*MODEL.STRICT_NORM_GROUPS "
                                         "False"):
        norm("GN", num_groups=32, strict=True)(channels)
    assert norm("GN", num_groups=8, strict=True)(channels).num_groups == 8


def test_gn_32_on_the_demos_16_channel_stem_is_adjusted_and_logged_or_refused(caplog):
    import logging

    from conftest import DEMO_CONFIG, TINY_OPTS
    from gwdet.model_zoo import build_config

    # gwdet's build_model: detectron2's, then the model's check, which logs each time, per component (the
    # stem and the 16-channel norms of res2 blocks)
    opts = TINY_OPTS + ["MODEL.RESNETS.GW_POSITIONS", "", "MODEL.GN.NUM_GROUPS", "32"]
    with caplog.at_level(logging.WARNING):
        model = gwdet.build_model(build_config(str(DEMO_CONFIG), opts))
    stem = model.backbone.bottom_up.stem.conv1.norm
    assert (type(stem), stem.num_channels, stem.num_groups, stem.requested_num_groups) == (torch.nn.GroupNorm, 16, 16, 32)
    messages = [record.getMessage() for record in caplog.records]
    assert any("backbone.bottom_up: 7 GroupNorm layer(s) asked for 32 groups use 16 (16 channels)" in message
               for message in messages), messages
    with pytest.raises(ValueError, match="GN with 32 groups cannot divide 16 channels.*MODEL.STRICT_NORM_GROUPS"):
        gwdet.build_model(build_config(str(DEMO_CONFIG), opts + ["MODEL.STRICT_NORM_GROUPS", "True"]))


def test_norm_arguments_of_the_wrong_type_are_named_with_their_repr():
    with pytest.raises(ValueError, match=r"num_groups of norm 'GW' must be an integer >= 1, got '4' \(str\)"):
        norm("GW", num_groups="4")
    with pytest.raises(ValueError, match=r"eps of norm 'GW' must be a finite number > 0 in float32.*got 1e\+300, "
                                         r"which float32 rounds to inf"):
        norm("GW", eps=1e300)
    with pytest.raises(ValueError, match=r"gwdet.norm\('GW'\): strict must be True or False, got 'no' \(str\)"):
        norm("GW", strict="no")
    with pytest.raises(TypeError, match=r"gwdet.norm\('GW', 8\): give the norm's settings by keyword, e.g. "
                                        r"gwdet.norm\('GW', num_groups=...\)"):
        norm("GW", 8)  # was taken as strict=8
    # the config keys go through the same checks
    from gwdet.config import check_config_values

    cfg = add_gwdet_config(get_cfg())
    cfg.MODEL.GW.EPS = 1e300
    with pytest.raises(ValueError, match=r"config: MODEL.GW.EPS must be a finite number > 0 in float32, .*got 1e\+300"):
        check_config_values(cfg)
    cfg.MODEL.GW.EPS, cfg.MODEL.STRICT_NORM_GROUPS = 1e-5, "yes"
    with pytest.raises(ValueError, match=r"config: MODEL.STRICT_NORM_GROUPS must be True or False, got 'yes' \(str\)"):
        check_config_values(cfg)


def test_register_norm_checks_what_it_is_given_naming_the_norm(registered):
    registered.append("TestChecked")
    with pytest.raises(TypeError, match=r"register_norm\('TestChecked'\): build must be a function channels -> "
                                        r"torch.nn.Module, got 5 \(int\)"):
        register_norm("TestChecked", 5)
    with pytest.raises(TypeError, match=r"register_norm\('TestChecked'\): build must be a function"):
        register_norm("TestChecked")("not a function")
    with pytest.raises(TypeError, match=r"build must take the channel count as its first argument .* takes \[\]"):
        register_norm("TestChecked", lambda: torch.nn.Identity())
    with pytest.raises(TypeError, match=r"config_keys must map build's keywords to config keys"):
        register_norm("TestChecked", lambda channels: torch.nn.Identity(), config_keys="MODEL.GN.NUM_GROUPS")
    for key in ("", "MODEL..GROUPS", 32):
        with pytest.raises(ValueError, match="config_keys must map build's keywords to dotted config keys"):
            register_norm("TestChecked", lambda channels, groups=2: torch.nn.Identity(), config_keys={"groups": key})
    with pytest.raises(ValueError, match=r"batch_statistics must be True or False, got 'no' \(str\)"):
        register_norm("TestChecked", lambda channels: torch.nn.Identity(), batch_statistics="no")
    with pytest.raises(TypeError, match="layer_types must be a tuple of classes"):
        register_norm("TestChecked", lambda channels: torch.nn.Identity(), layer_types=(torch.nn.Identity(),))
    for generic in (torch.nn.Sequential, torch.nn.Module, torch.nn.ModuleList):
        # every ResNet stage is a Sequential: its convs would have taken the norms' weight decay
        with pytest.raises(ValueError, match=rf"layer_types names {generic.__name__}, a class of modules of every kind "
                                             r".*Name the normalizing class inside what the build returns"):
            register_norm("TestChecked", lambda channels: torch.nn.Sequential(torch.nn.GroupNorm(2, channels)),
                          layer_types=(torch.nn.GroupNorm, generic))
    assert "TestChecked" not in known_norm_names(), "nothing was registered"


def test_a_build_function_that_returns_no_module_is_named(registered):
    registered.append("TestNone")

    @register_norm("TestNone")
    def forgot_the_return(channels):
        torch.nn.GroupNorm(1, channels)

    with pytest.raises(TypeError) as err:
        norm("TestNone")(8)
    assert str(err.value) == (
        "The norm 'TestNone': its build function "
        "test_a_build_function_that_returns_no_module_is_named.<locals>.forgot_the_return returned None "
        "(NoneType) for 8 channels, not a torch.nn.Module; make it return the layer")


def test_a_build_function_that_ignores_the_channel_count_or_returns_one_layer_twice_is_named(registered):
    # before: torch's "Expected weight to be a vector of size equal to the number of channels" at the
    # first input, naming neither the norm nor the layer; and a cached layer shared by every FPN
    # level's convs (their weights tied) without a word
    from gwdet import build_model, check_model
    from gwdet.model_zoo import build_config

    registered.extend(["TestFixed", "TestCached"])
    register_norm("TestFixed", lambda channels: torch.nn.GroupNorm(4, 64))
    with pytest.raises(ValueError) as err:
        norm("TestFixed")(16)
    assert str(err.value).startswith("The norm 'TestFixed': its build function ") and str(err.value).endswith(
        " returned a GroupNorm of 64 channels where 16 were asked (its first input would fail in torch): build the "
        "layer for the channel count the function is given.")
    assert norm("TestFixed")(64).num_channels == 64
    cache = {}
    register_norm("TestCached", lambda channels: cache.setdefault(channels, torch.nn.GroupNorm(4, channels)))
    cfg = build_config("configs/Demo/mask_rcnn_R_50_FPN_gw_shapes.yaml",
                       ["MODEL.FPN.NORM", "TestCached", "MODEL.DEVICE", "cpu"])
    with pytest.raises(ValueError, match=r"^One norm layer object \(GroupNorm\) sits at 8 places, "
                                         r"fpn_lateral2.norm, fpn_output2.norm, .*so their weights "
                                         r"and statistics are one: the code that builds the model gave one layer "
                                         r"object to several modules \(a norm layer made once and passed to each conv, "
                                         r"or a norm's build function that returns a layer it built before\). Build a "
                                         r"new layer for each place \(call the norm's builder once per conv\).$"):
        build_model(cfg)
    from detectron2.modeling import build_model as detectron2s_build_model

    with pytest.raises(ValueError, match=r"^One norm layer object \(GroupNorm\) sits at 8 places"):
        detectron2s_build_model(cfg)  # gwdet's backbone builders check what they build
    shared = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 1), torch.nn.BatchNorm2d(8))
    check_model(torch.nn.Sequential(shared, shared))  # a block reused whole: its norm is shared along with its conv
    with pytest.raises(ValueError, match=r"\(BatchNorm2d\) sits at 2 places, 0.1, 1.1, so"):
        check_model(torch.nn.Sequential(torch.nn.Sequential(torch.nn.Conv2d(3, 8, 1), shared[1]),
                                        torch.nn.Sequential(torch.nn.Conv2d(8, 8, 1), shared[1])))
    # one parent holding the layer under two names (self.norm1 = self.norm2 = norm(c), a ModuleDict's two keys):
    # places were counted by parent, so it passed
    twice = torch.nn.Module()
    twice.norm1 = twice.norm2 = torch.nn.BatchNorm2d(8)
    with pytest.raises(ValueError, match=r"\(BatchNorm2d\) sits at 2 places, norm1, norm2, so"):
        check_model(twice)
    with pytest.raises(ValueError, match=r"sits at 2 places, 0.a, 0.b, so"):
        check_model(torch.nn.Sequential(torch.nn.ModuleDict({"a": shared[1], "b": shared[1]})))
    check_model(torch.nn.Sequential(twice.norm1, torch.nn.Conv2d(8, 8, 1)))  # once in the model: fine


def test_a_config_key_of_a_registered_norm_that_the_config_lacks_is_named(registered):
    from detectron2.config import CfgNode

    registered.append("TestOwnKey")
    register_norm("TestOwnKey", lambda channels, num_groups=2: torch.nn.GroupNorm(num_groups, channels),
                  config_keys={"num_groups": "MODEL.MY_GN.NUM_GROUPS"})
    cfg = add_gwdet_config(get_cfg())
    with pytest.raises(KeyError) as err:
        norm_from_config("TestOwnKey", cfg)
    assert "The norm 'TestOwnKey' reads its num_groups from the config key MODEL.MY_GN.NUM_GROUPS" in str(err.value)
    assert "cfg.MODEL.MY_GN = CfgNode(); cfg.MODEL.MY_GN.NUM_GROUPS = <default>" in str(err.value)
    cfg.MODEL.MY_GN = CfgNode({"NUM_GROUPS": 4})
    assert norm_from_config("TestOwnKey", cfg)(8).num_groups == 4


def test_odd_names_a_section_as_a_config_key_and_zero_channels_are_named(registered):
    for odd in (" MyX", "MyX ", "G\u0057\uff37", "My\tX"):
        with pytest.raises(ValueError, match="has spaces at an end, unprintable or non-ASCII characters"):
            register_norm(odd, lambda channels: torch.nn.GroupNorm(1, channels))
    registered.append("TestFoo1")
    register_norm("TestFoo1", lambda channels: torch.nn.GroupNorm(1, channels))
    with pytest.raises(ValueError, match="'TESTFOO1' differs from the registered norm name 'TestFoo1' only in case"):
        register_norm("TESTFOO1", lambda channels: torch.nn.GroupNorm(1, channels))
    registered.append("TestSection")
    with pytest.raises(ValueError, match=r"the config key MODEL.GW \(for num_groups\) is a section of detectron2's or "
                                         r"gwdet's config"):  # at registration, no longer when a config is read
        register_norm("TestSection", lambda channels, num_groups=2: torch.nn.GroupNorm(num_groups, channels),
                      config_keys={"num_groups": "MODEL.GW"})
    register_norm("TestSection", lambda channels, num_groups=2: torch.nn.GroupNorm(num_groups, channels),
                  config_keys={"num_groups": "MODEL.TEST_SECTION"})
    cfg = add_gwdet_config(get_cfg())
    cfg.MODEL.TEST_SECTION = type(cfg)({"EPS": 1.0})  # a config of one's own makes the key a section
    with pytest.raises(ValueError, match=r"from the config key MODEL.TEST_SECTION .*which is a section of the config "
                                         r"\(EPS\), not a value"):
        norm_from_config("TestSection", cfg)
    with pytest.raises(ValueError, match="The norm 'GN': channels must be an integer >= 1, got 0"):
        norm("GN")(0)


def test_a_records_mappings_cannot_be_changed_through_the_record_the_catalogue_hands_out():
    """A change through norm_record("GW").config_keys made every later build read another key."""
    record = norm_record("GW")
    with pytest.raises(TypeError):
        record.config_keys["num_groups"] = "MODEL.GN.NUM_GROUPS"
    with pytest.raises(TypeError):
        norm_record("GN").detectron2_values["num_groups"] = 8
    cfg = add_gwdet_config(get_cfg())
    cfg.MODEL.GW.NUM_GROUPS, cfg.MODEL.GN.NUM_GROUPS = 8, 32
    assert norm_from_config("GW", cfg)(16).num_groups == 8


def test_a_build_that_collects_its_keywords_is_refused_at_registration():
    """gwdet.norm('MyVar', k=4) then answered "takes ['kw'], not ['k']"."""
    def build(channels, **kw):
        return torch.nn.GroupNorm(1, channels)

    with pytest.raises(TypeError, match=r"register_norm\('CollectingNorm'\): build takes \*\*kw, but gwdet.norm"):
        register_norm("CollectingNorm", build)
    assert "CollectingNorm" not in known_norm_names()


def test_a_norm_holding_a_list_value_hashes_as_it_compares():
    def build(channels, sizes=(1,)):
        return torch.nn.GroupNorm(1, channels)

    register_norm("ListValued", build)
    try:
        assert hash(norm("ListValued", sizes=[1, 2])) == hash(norm("ListValued", sizes=[1, 2]))
        assert len({norm("ListValued", sizes=[1, 2]), norm("ListValued", sizes=[1, 2])}) == 1
    finally:
        unregister_norm("ListValued")


def test_equal_norms_hash_equal_whatever_the_number_type():
    import numpy as np

    a, b = gwdet.norm("GW", num_groups=8), gwdet.norm("GW", num_groups=np.int64(8))
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1


def test_a_registered_names_value_refused_by_its_config_key_names_the_key(registered):
    registered.append("TestEpsOfGroups")
    register_norm("TestEpsOfGroups", lambda channels, groups=64: torch.nn.Identity(),
                  config_keys={"groups": "MODEL.GW.NUM_GROUPS"})
    with pytest.raises(ValueError, match=r"groups of norm 'TestEpsOfGroups' \(given to gwdet.norm, checked as its "
                                         r"config key MODEL.GW.NUM_GROUPS\) must be an integer >= 1, got 1e-05"):
        norm("TestEpsOfGroups", groups=1e-5)
    cfg = add_gwdet_config(get_cfg())
    cfg.MODEL.GW.NUM_GROUPS = 0  # read from the config: the key named as the source
    with pytest.raises(ValueError, match=r"groups of norm 'TestEpsOfGroups' \(read from MODEL.GW.NUM_GROUPS\) must be "
                                         r"an integer >= 1, got 0"):
        norm_from_config("TestEpsOfGroups", cfg)


def test_a_name_unknown_in_a_process_the_launcher_started_names_the_main_block(monkeypatch):
    # a registration under `if __name__ == "__main__":` does not run in --num-gpus' processes, which were told
    # to "register it with a script of your own", as they had
    import multiprocessing

    from gwdet.model_zoo import build_config

    with pytest.raises(ValueError) as refused:
        build_config("configs/Demo/mask_rcnn_R_50_FPN_gw_shapes.yaml", ["MODEL.RESNETS.NORM", "MyNeverRegistered"])
    assert "This process was started by the launcher" not in str(refused.value)
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: object())  # as in a spawned process
    with pytest.raises(ValueError) as refused:
        build_config("configs/Demo/mask_rcnn_R_50_FPN_gw_shapes.yaml", ["MODEL.RESNETS.NORM", "MyNeverRegistered"])
    assert ("docs/usage.md). This process was started by the launcher (--num-gpus, --num-machines): it imports your "
            "script anew without running its `if __name__ == \"__main__\":` block, so a gwdet.register_norm call inside "
            "that block does not reach it: register the name at the script's top level.") in str(refused.value)
    with pytest.raises(UnknownNormError, match="register the name at the script's top level"):
        norm("MyNeverRegistered")


def test_a_norm_run_on_a_tensor_says_it_builds_layers():
    # detectron2's Conv2d(..., norm=gwdet.norm(...)) ran the Norm on its output: "channels must be an integer >= 1,
    # got tensor([[[[...", the input printed
    from detectron2.layers import Conv2d

    conv = Conv2d(16, 16, 3, norm=gwdet.norm("GW", num_groups=4))
    with pytest.raises(TypeError, match=r"^gwdet.norm\('GW'\) was called with a tensor of shape \[1, 16, 6, 6\]: it "
                                        r"builds a layer .* detectron2's get_norm\(norm, channels\), or norm\(channels\).$"):
        conv(torch.randn(1, 16, 8, 8))
    built = Conv2d(16, 16, 3, norm=get_norm(gwdet.norm("GW", num_groups=4), 16))
    assert built(torch.randn(1, 16, 8, 8)).shape == (1, 16, 6, 6)


def test_layer_types_that_would_mark_other_layers_as_norms_are_refused(registered):
    # a conv class made every conv of every model a norm layer (weight decay 1e-4 -> SOLVER.WEIGHT_DECAY_NORM 0);
    # GroupNorm with batch_statistics=True made the model checks refuse the built-in GN as a batch-statistics norm
    from detectron2.layers import Conv2d
    from gwdet.layers import GroupWhitening

    registered.append("TestMarks")
    build = lambda channels: torch.nn.GroupNorm(1, channels)  # noqa: E731
    for kind in (Conv2d, torch.nn.Linear, torch.nn.Embedding, torch.nn.modules.conv._ConvNd):
        with pytest.raises(ValueError, match=rf"register_norm\('TestMarks'\): layer_types names {kind.__name__}, a "
                                             r"convolution, linear or embedding layer \(or a base class of one\), not a "
                                             r"norm: .*SOLVER.WEIGHT_DECAY_NORM"):
            register_norm("TestMarks", build, layer_types=(kind,))
    for kind, statistics, builtin in ((torch.nn.GroupNorm, True, "GN"), (GroupWhitening, True, "GW"),
                                      (torch.nn.BatchNorm2d, False, "BN")):
        with pytest.raises(ValueError, match=rf"layer_types names {kind.__name__}, the layer of the built-in norm "
                                             rf"'{builtin}', .* batch_statistics={statistics}: the model checks would "
                                             rf"take every '{builtin}' layer for one of yours"):
            register_norm("TestMarks", build, batch_statistics=statistics, layer_types=(kind,))
    assert "TestMarks" not in known_norm_names()

    class BatchGroupWhitening(GroupWhitening):  # a class of one's own is the registration's alone
        pass

    register_norm("TestMarks", lambda channels: BatchGroupWhitening(channels, num_groups=2), batch_statistics=True,
                  layer_types=(BatchGroupWhitening,))
    assert norm_record("TestMarks").layer_types == (BatchGroupWhitening,)


# the refusal's own message failed: AttributeError: 'functools.partial' object has no attribute '__name__'
def test_a_partial_or_callable_object_build_with_another_default_is_refused_by_name(registered):
    import functools

    def build(channels, num_groups=16):
        return torch.nn.GroupNorm(num_groups, channels)

    class Build:
        def __call__(self, channels, num_groups=16):
            return torch.nn.GroupNorm(num_groups, channels)

    registered.extend(["TestPartialGN", "TestObjectGN"])
    with pytest.raises(ValueError, match=r"register_norm\('TestPartialGN'\): functools.partial\(.*build, \.\.\.\) "
                                         r"gives num_groups the default 16, but reads it from the config key "
                                         r"MODEL.GW.NUM_GROUPS, whose default .* is 64"):
        register_norm("TestPartialGN", functools.partial(build, num_groups=16),
                      config_keys={"num_groups": "MODEL.GW.NUM_GROUPS"})
    with pytest.raises(ValueError, match=r"register_norm\('TestObjectGN'\): a .*Build object gives num_groups the "
                                         r"default 16"):
        register_norm("TestObjectGN", Build(), config_keys={"num_groups": "MODEL.GW.NUM_GROUPS"})
    with pytest.raises(ValueError, match=r"config_keys name \['width'\], which a .*Build object does not take"):
        register_norm("TestObjectGN", Build(), config_keys={"width": "MODEL.TEST_OBJECT_GN.WIDTH"})
    register_norm("TestObjectGN", Build(), config_keys={"num_groups": "MODEL.TEST_OBJECT_GN.NUM_GROUPS"})
    assert norm("TestObjectGN")(32).num_groups == 16


# every GroupNorm of 32 groups that gwdet's GN (64 -> 32 on 32 channels) or a registered name built counted as
# detectron2's get_norm's, and the model build warned to set MODEL.GN.NUM_GROUPS 32
def test_only_group_norms_detectron2s_get_norm_built_count_as_its_own(registered):
    from gwdet.norms import built_by_detectron2_get_norm

    cfg = add_gwdet_config(get_cfg())
    cfg.MODEL.GN.NUM_GROUPS = 64
    by_gwdet = norm_from_config("GN", cfg)(32)  # the channel rule's 32 groups
    assert by_gwdet.num_groups == 32 and not built_by_detectron2_get_norm(by_gwdet)
    cfg.MODEL.GN.NUM_GROUPS = 32
    assert not built_by_detectron2_get_norm(norm_from_config("GN", cfg)(64))
    registered.append("TestGN32")
    register_norm("TestGN32", lambda channels: torch.nn.GroupNorm(32, channels))
    assert not built_by_detectron2_get_norm(norm("TestGN32")(64))
    assert built_by_detectron2_get_norm(get_norm("GN", 64))
    assert not built_by_detectron2_get_norm(torch.nn.GroupNorm(16, 64))


# passed through as "callable"; detectron2's get_norm(n, 16) then failed: 'int' object has no attribute 'dim'
@pytest.mark.parametrize("layer", [torch.nn.BatchNorm2d(4), GroupWhitening(16, num_groups=4)])
def test_norm_from_config_refuses_a_layer_instance(layer):
    cfg = add_gwdet_config(get_cfg())
    with pytest.raises(TypeError, match=rf"norm_from_config: {type(layer).__name__}\(.*\) is a layer, not what builds "
                                        r"one: .* this one layer object would be shared by every part given it. Give "
                                        r"a name with the settings you want \(gwdet.norm\('GW', num_groups=16\)\), or "
                                        rf"a function of the channel count that builds a new {type(layer).__name__}"):
        norm_from_config(layer, cfg)
    assert norm_from_config(torch.nn.BatchNorm2d, cfg) is torch.nn.BatchNorm2d  # the class builds a layer per part


# "Leave method out" (which builds ItN) without naming GW_ZCA; "Leave affine out" with no way to the value
def test_a_layer_argument_gwdet_norm_does_not_take_names_the_way_to_it():
    with pytest.raises(TypeError, match=r"gwdet.norm\('GW'\) takes \['num_groups', 'T', 'eps'\], not \['method'\]. "
                                        r"gwdet.norm chooses the whitening method by the norm's name: 'GW' whitens by "
                                        r"ItN, 'GW_ZCA' by ZCA. Give the name of the method you want "
                                        r"\(gwdet.norm\('GW_ZCA', ...\)\), and leave method out.$"):
        norm("GW", method="zca")
    with pytest.raises(TypeError, match=r"'BW' whitens by ZCA, 'BW_ItN' by ItN. .*\(gwdet.norm\('BW_ItN', ...\)\)"):
        norm("BW", method="itn")
    with pytest.raises(TypeError, match=r"not \['affine'\]. affine is an argument of GroupWhitening that "
                                        r"gwdet.norm\('GW'\) does not set \(its layers keep GroupWhitening's "
                                        r"affine=True\). For another value, register a norm name of your own whose "
                                        r"build function sets it \(gwdet.register_norm, docs/usage.md\), or give, "
                                        r"where the norm is taken, a function of the channel count that builds the "
                                        r"GroupWhitening with it; leave affine out here.$"):
        norm("GW", affine=False)
    with pytest.raises(TypeError) as refused:
        norm("GN", num_group=4)
    assert str(refused.value) == ("gwdet.norm('GN') takes ['num_groups'], not ['num_group']. Did you mean num_groups "
                                  "(not num_group)?")
    with pytest.raises(TypeError, match=r"not \['colour'\]. No norm takes colour: leave colour out.$"):
        norm("GW", colour=1)


@pytest.mark.parametrize("param", ["strict", "read_from_config", "name"])
def test_a_build_parameter_named_as_an_argument_of_gwdet_norm_is_refused_at_registration(registered, param):
    # registered: gwdet.norm took strict=/read_from_config= as its own (the build got its default), name= a raw TypeError
    registered.append("TestClash")
    build = eval(f"lambda channels, {param}=False: torch.nn.GroupNorm(1, channels)")
    with pytest.raises(gwdet.errors.GwdetTypeError,
                       match=rf"^register_norm\('TestClash'\): <lambda> takes a parameter named '{param}', which is an "
                             rf"argument of gwdet.norm itself .*Rename the parameter \(e.g. '{param}_'"):
        register_norm("TestClash", build)
    assert "TestClash" not in known_norm_names()


def test_a_build_parameter_named_strict_read_from_a_config_key_is_refused_at_registration(registered):
    # registered: norm_from_config then stopped with a raw "Norm.__init__() got multiple values for argument 'strict'"
    registered.append("TestCfgStrict")
    with pytest.raises(gwdet.errors.GwdetTypeError, match=r"takes a parameter named 'strict'.*config_keys entry"):
        register_norm("TestCfgStrict", lambda channels, strict=False: torch.nn.GroupNorm(1, channels),
                      config_keys={"strict": "MODEL.TEST_CFG_STRICT.STRICT"})


def test_a_build_that_takes_the_channel_count_after_another_argument_is_refused_at_registration(registered):
    # registered: gwdet.norm('TestMyGroupNorm')(32) then asked for a value for 'num_channels'
    registered.append("TestMyGroupNorm")

    class MyGroupNorm(torch.nn.GroupNorm):
        pass

    with pytest.raises(gwdet.errors.GwdetTypeError,
                       match=r"^register_norm\('TestMyGroupNorm'\): MyGroupNorm takes \['num_groups', 'num_channels', "
                             r".*with the channel count as 'num_channels', not first: gwdet builds the layer as "
                             r"build\(channels, \*\*settings\).*would go into 'num_groups'.*def build\(channels, "
                             r"num_groups=...\): return MyGroupNorm\(num_groups, channels\)"):
        register_norm("TestMyGroupNorm", MyGroupNorm)


def test_a_build_with_positional_only_settings_is_refused_at_registration(registered):
    # registered: gwdet.norm('TestPosOnly', num_groups=2)(8) then failed inside the build with a raw TypeError
    registered.append("TestPosOnly")

    def positional_only(channels, num_groups=4, /):
        return torch.nn.GroupNorm(num_groups, channels)

    with pytest.raises(gwdet.errors.GwdetTypeError,
                       match=r"^register_norm\('TestPosOnly'\): positional_only takes num_groups as positional-only "
                             r"\(before '/'\).*Let build take num_groups by keyword"):
        register_norm("TestPosOnly", positional_only)

    def channels_only_first(channels, /, num_groups=4):
        return torch.nn.GroupNorm(num_groups, channels)

    register_norm("TestPosOnly", channels_only_first)
    assert norm("TestPosOnly", num_groups=2)(8).num_groups == 2


# n = gwdet.norm("GW"); n.name = "BGN" (or n.params["bogus"] = 1) was accepted; n(16) then raised a raw TypeError
def test_a_norm_is_read_only_and_still_pickles_copies_and_saves():
    import copy

    import yaml

    made = norm("GW", num_groups=8)
    with pytest.raises(gwdet.errors.GwdetAttributeError,
                       match=r"^Norm\('GW', num_groups=8, T=5, eps=1e-05\) is read-only: .* so name='BGN' cannot be set "
                             r"on it\. Build a new one with the values you want, e.g\. gwdet\.norm\('GW', \.\.\.\)"):
        made.name = "BGN"
    with pytest.raises(gwdet.errors.GwdetAttributeError, match=r"is read-only: strict cannot be deleted from it"):
        del made.strict
    with pytest.raises(gwdet.errors.GwdetTypeError,
                       match=r"^A norm's params \{'num_groups': 8, 'T': 5, 'eps': 1e-05\} are read-only: bogus=1 cannot "
                             r"be set in them.*Build a new norm with the values you want, e.g\. gwdet\.norm\(name, bogus="):
        made.params["bogus"] = 1
    with pytest.raises(gwdet.errors.GwdetTypeError, match=r"are read-only: T cannot be deleted from them"):
        del made.params["T"]
    assert made.name == "GW" and made.params == {"num_groups": 8, "T": 5, "eps": 1e-5}
    assert made(16).num_groups == 8
    for twin in (pickle.loads(pickle.dumps(made)), copy.deepcopy(made), copy.copy(made)):
        assert twin == made and hash(twin) == hash(made) and twin(16).num_groups == 8
        with pytest.raises(gwdet.errors.GwdetAttributeError):
            twin.name = "BGN"
    saved = yaml.dump({"norm": made})  # LazyConfig.save's form, which gwdet's saved-config loader reads
    assert saved.startswith("norm: !!python/object:gwdet.norms.Norm\n") and "params:" in saved
    assert yaml.unsafe_load(saved)["norm"] == made


# a registered norm with an int default took num_groups=True / 2.0 / 2.5 and failed at its first forward in torch
def test_a_bool_or_float_for_an_integer_of_a_registered_norm_is_refused(registered):
    import numpy as np
    from detectron2.config import get_cfg

    registered.append("TestMyGN2")

    @register_norm("TestMyGN2", config_keys={"num_groups": "MODEL.TEST_MY_GN2.NUM_GROUPS"})
    def _my_gn(channels, num_groups: int = 4, eps: float = 1e-5):
        return torch.nn.GroupNorm(num_groups, channels, eps=eps)

    for value in (True, np.True_):
        with pytest.raises(gwdet.errors.GwdetTypeError,
                           match=r"^gwdet.norm\('TestMyGN2'\): num_groups=True is a bool, and the norm's build takes an "
                                 r"integer there \(its default is 4\), where True would count as 1: give num_groups as "
                                 r"an integer \(e.g. num_groups=4\)"):
            norm("TestMyGN2", num_groups=value)
    with pytest.raises(gwdet.errors.GwdetTypeError,
                       match=r"num_groups=2.0 is a float, and the norm's build takes an integer there \(its default "
                             r"is 4\).*give num_groups as an integer \(e.g. 2 rather than 2.0\)"):
        norm("TestMyGN2", num_groups=2.0)
    with pytest.raises(gwdet.errors.GwdetTypeError, match=r"num_groups=2.5 is a float.*\(e.g. num_groups=4\)"):
        norm("TestMyGN2", num_groups=2.5)
    with pytest.raises(gwdet.errors.GwdetTypeError, match=r"eps=False is a bool, and the norm's build takes a float"):
        norm("TestMyGN2", eps=False)
    cfg = gwdet.norms.add_registered_config_keys(gwdet.add_gwdet_config(get_cfg()))
    cfg.MODEL.TEST_MY_GN2.NUM_GROUPS = True
    with pytest.raises(gwdet.errors.GwdetTypeError,
                       match=r"num_groups=True \(read from MODEL.TEST_MY_GN2.NUM_GROUPS\) is a bool"):
        norm_from_config("TestMyGN2", cfg)
    assert norm("TestMyGN2", num_groups=np.int64(2), eps=1)(8).num_groups == 2  # an int for a float: a number


# a registered norm got eps=Fraction(1, 1000) as it was: torch's forward raised TypeError, and a checkpoint recorded
# 'Fraction(1, 1000)' and refused a model built with the equal eps=0.001
def test_a_fraction_for_a_float_of_a_registered_norm_is_a_float_and_for_an_integer_is_refused(registered):
    from fractions import Fraction

    registered.append("TestFractionGN")

    @register_norm("TestFractionGN")
    def _fraction_gn(channels, num_groups: int = 4, eps: float = 1e-5):
        return torch.nn.GroupNorm(num_groups, channels, eps=eps)

    made = norm("TestFractionGN", eps=Fraction(1, 1000))
    assert type(made.params["eps"]) is float and made == norm("TestFractionGN", eps=0.001)
    layer = made(8)
    assert layer.eps == 0.001 and torch.isfinite(layer(torch.randn(2, 8, 3, 3))).all()
    assert type(norm("TestFractionGN", eps=1).params["eps"]) is float
    with pytest.raises(gwdet.errors.GwdetTypeError,
                       match=r"num_groups=Fraction\(2, 1\) is a Fraction, and the norm's build takes an integer there "
                             r".*\(e.g. 2 rather than Fraction\(2, 1\)\)"):
        norm("TestFractionGN", num_groups=Fraction(2, 1))


# gwdet.norm("GW", num_groups=np.int64(8)) kept the numpy scalar: a LazyConfig saved with it could not be read again
def test_numpy_scalars_are_kept_as_python_numbers_and_the_config_saves_as_plain_yaml(tmp_path):
    import numpy as np
    from detectron2.config import LazyConfig

    from conftest import LAZY_CONFIG
    from gwdet.model_zoo.lazy_loading import load_lazy_config

    made = norm("GW", num_groups=np.int64(8), T=np.int32(3), eps=np.float32(0.5))
    assert made == norm("GW", num_groups=8, T=3, eps=0.5)
    assert [type(value) for value in made.params.values()] == [int, int, float]
    assert type(norm("GN", num_groups=np.int16(4)).params["num_groups"]) is int
    cfg = LazyConfig.load(str(LAZY_CONFIG))
    cfg.model.backbone.norm = norm("GW", num_groups=np.int64(8))
    saved = tmp_path / "config.yaml"
    LazyConfig.save(cfg, str(saved))
    assert "numpy" not in saved.read_text()
    node = load_lazy_config(str(saved), []).model.backbone.norm
    assert (node.name, node.num_groups) == ("GW", 8)


# Before: a registered build returning nn.Identity, used as MODEL.FPN.NORM, gave FPN convs with neither
# normalization nor bias (detectron2 drops the bias of a conv given a norm), without a word.
def test_a_registered_norm_that_builds_an_identity_is_refused(registered):
    from detectron2.modeling import build_model as detectron2s_build_model

    from gwdet.errors import GwdetValueError
    from gwdet.model_zoo import build_config

    class PassThrough(torch.nn.Identity):
        pass

    registered.extend(["TestNoneNorm", "TestPassThrough"])

    @register_norm("TestNoneNorm")
    def none_norm(channels):
        return torch.nn.Identity()

    register_norm("TestPassThrough", lambda channels: PassThrough())
    message = (r"^The norm 'TestNoneNorm': its build function .*none_norm returned Identity\(\) for 8 channels; "
               r"detectron2 drops the bias of a conv given a norm, so the layer would have neither normalization nor "
               r"bias\. For no norm, set the NORM key to '' .*")
    with pytest.raises(GwdetValueError, match=message):
        norm("TestNoneNorm")(8)
    with pytest.raises(GwdetValueError, match=r"^The norm 'TestPassThrough': .* returned PassThrough\(\) for 8 "):
        norm("TestPassThrough")(8)
    cfg = build_config("configs/Demo/mask_rcnn_R_50_FPN_gw_shapes.yaml",
                       ["MODEL.FPN.NORM", "TestNoneNorm", "MODEL.DEVICE", "cpu"])
    with pytest.raises(GwdetValueError, match=r"^The norm 'TestNoneNorm': .* returned Identity\(\) for 64 channels"):
        detectron2s_build_model(cfg)


# norm_from_config(False / 0 / [], cfg) returned the value unchanged; detectron2 then failed with
# "TypeError: 'bool' object is not callable"
@pytest.mark.parametrize("value", [False, 0, 0.0, [], ()], ids=repr)
def test_norm_from_config_refuses_a_false_value_that_is_no_string(value):
    cfg = add_gwdet_config(get_cfg())
    with pytest.raises(GwdetTypeError, match=re.escape(
            f"norm_from_config: a NORM value is a norm name (a string such as 'GW'), '' for none, or a callable "
            f"channels -> nn.Module (gwdet.norm(...)); got {value!r} ({type(value).__name__}). It is empty or false, "
            "and detectron2 would call it as a norm: for no norm give '' (or None). Known names: ")):
        norm_from_config(value, cfg)
    assert norm_from_config("", cfg) == "" and norm_from_config(None, cfg) is None


# gwdet.norm(gwdet.norm("GW")) said "Unknown norm name Norm('GW', ...)" and suggested register_norm
def test_a_norm_given_where_the_name_goes_is_refused_as_already_a_norm():
    made = norm("GW", num_groups=8)
    with pytest.raises(GwdetTypeError, match=re.escape(
            "gwdet.norm takes a norm name (a string such as 'GW'), got Norm('GW', num_groups=8, T=5, eps=1e-05), "
            "which is already a norm: use it as it is (detectron2 takes it wherever it takes a norm, e.g. norm=n); "
            "for other values, make one of its name: gwdet.norm(n.name, **{**n.params, <setting>: <value>}).")):
        norm(made)
    with pytest.raises(GwdetTypeError, match=re.escape("; with these values it is gwdet.norm('GW', num_groups=8, T=5, "
                                                       "eps=0.001).")):
        norm(made, eps=1e-3)
    with pytest.raises(GwdetTypeError, match=re.escape("got Norm('BN'), which is already a norm: use it as it is "
                                                       "(detectron2 takes it wherever it takes a norm, e.g. norm=n).")):
        Norm(norm("BN"))
    assert norm(made.name, **{**made.params, "eps": 1e-3}) == norm("GW", num_groups=8, eps=1e-3)


# norm(16, eps=1e-3) and norm(num_channels=16) raised Python's bare "unexpected keyword argument"
def test_a_norm_takes_num_channels_by_keyword_and_refuses_other_keywords():
    made = norm("GW", num_groups=8)
    assert made(num_channels=16).num_channels == 16 and made(16).num_groups == 8
    with pytest.raises(GwdetTypeError, match=re.escape(
            "Norm('GW', num_groups=8, T=5, eps=1e-05) was called with eps=0.001: a norm builds its layer from the "
            "channel count alone (norm(16) or norm(num_channels=16)), and its settings are fixed when it is made. "
            "Give them to gwdet.norm: gwdet.norm('GW', num_groups=8, T=5, eps=0.001) (the settings 'GW' takes: "
            "['num_groups', 'T', 'eps']).")):
        made(16, eps=1e-3)
    with pytest.raises(GwdetTypeError, match=re.escape("was called with affine=False: ")):
        made(num_channels=16, affine=False)


# a list in a Norm's params could be changed in place: the "read-only" Norm then built GroupNorm(3) instead of 2
def test_a_list_read_from_a_norms_params_is_a_copy(registered):
    registered.append("TestListParam")
    register_norm("TestListParam", lambda channels, sizes=(1, 1): torch.nn.GroupNorm(len(sizes), channels))
    made = norm("TestListParam", sizes=[1, 1])
    made.params["sizes"].append(1)
    dict(made.params)["sizes"].append(1)
    assert made.params["sizes"] == [1, 1] and repr(made) == "Norm('TestListParam', sizes=[1, 1])"
    assert made(6).num_groups == 2


# the Norm held the caller's dict: changing it changed the Norm's repr, layers and hash
def test_a_norm_keeps_its_own_copy_of_a_dict_given_to_it(registered):
    registered.append("TestDictParam")
    register_norm("TestDictParam", lambda channels, opts=None: torch.nn.GroupNorm((opts or {}).get("g", 1), channels))
    given = {"g": 2, "nested": [1]}
    made = norm("TestDictParam", opts=given)
    before = hash(made)
    cache = {made: 1}
    given["g"] = 4
    given["nested"].append(2)
    assert repr(made) == "Norm('TestDictParam', opts={'g': 2, 'nested': [1]})"
    assert made(8).num_groups == 2 and hash(made) == before and made in cache
    assert made == norm("TestDictParam", opts={"g": 2, "nested": [1]})
    assert pickle.loads(pickle.dumps(made)) == made


# the Norm held its build function's default list: appending to it changed every Norm of the name and the default
def test_a_build_functions_default_list_is_copied_into_each_norm(registered):
    def build(channels, sizes=[1, 1]):  # noqa: B006 (the mutable default under test)
        return torch.nn.GroupNorm(len(sizes), channels)

    registered.append("TestDefaultList")
    register_norm("TestDefaultList", build)
    first, second = norm("TestDefaultList"), norm("TestDefaultList")
    assert first.params["sizes"] is not build.__defaults__[0]
    first.params["sizes"].append(1)
    assert build.__defaults__ == ([1, 1],) and second(6).num_groups == 2 and norm("TestDefaultList")(6).num_groups == 2


# a build function that changed its argument in place changed the Norm's values for every later layer
def test_a_build_function_is_given_copies_of_the_norms_values(registered):
    def build(channels, sizes=(1,)):
        layer = torch.nn.GroupNorm(len(sizes), channels)
        sizes.append(1)
        return layer

    registered.append("TestMutatingBuild")
    register_norm("TestMutatingBuild", build)
    made = norm("TestMutatingBuild", sizes=[1, 1])
    assert [made(4).num_groups for _ in range(3)] == [2, 2, 2] and made.params["sizes"] == [1, 1]


# a checkpoint recorded the caller's dict as changed after the layer was built, not the values it was built with
def test_a_checkpoint_records_the_values_a_layer_was_built_with(registered, tmp_path):
    from gwdet.checkpoint.resilient import ResilientCheckpointer

    registered.append("TestDictRecord")
    register_norm("TestDictRecord", lambda channels, opts=None: torch.nn.GroupNorm((opts or {}).get("g", 1), channels))
    given = {"g": 2}
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), norm("TestDictRecord", opts=given)(8))
    given["g"] = 4
    ResilientCheckpointer(model, save_dir=str(tmp_path)).save("m")
    recorded = torch.load(tmp_path / "m.pth", weights_only=False)["gwdet_norm_settings"]["1"]
    assert recorded["opts"] == {"g": 2}


# a plain dict was taken for a config lacking gwdet's keys: "add_gwdet_config(cfg) adds them back", which refuses a dict
def test_norm_from_config_refuses_a_plain_dict_naming_its_type_and_the_fix():
    with pytest.raises(GwdetTypeError, match=r"^norm_from_config\('GW', cfg\) needs a detectron2 CfgNode \(a yacs "
                                             r"config\), got a dict: \{'MODEL': .*get_cfg\(\); gwdet.add_gwdet_config"
                                             r".*gwdet.model_zoo.get_config\(path\).*CfgNode\(your_dict\)"):
        norm_from_config("GW", {"MODEL": {"GW": {"NUM_GROUPS": 8}}})


# norm(channels=32) raised Python's bare "missing 1 required positional argument: 'num_channels'"
def test_a_norm_takes_the_channel_count_as_channels_and_refuses_none_or_two():
    made = norm("GW", num_groups=8)
    assert made(channels=32).num_channels == 32 and get_norm(made, 32).num_channels == 32
    with pytest.raises(GwdetTypeError, match=re.escape(
            "Norm('GW', num_groups=8, T=5, eps=1e-05) was called without a channel count: a norm builds its layer for "
            "the channel count it is called with, e.g. norm(32) (as detectron2's get_norm(norm, channels) calls it), "
            "norm(channels=32) or norm(num_channels=32); gwdet.norm('GW', ...) takes the settings, the call the "
            "channels.")):
        made()
    with pytest.raises(GwdetTypeError, match=re.escape(
            "was called with more than one channel count (32 positionally, channels=16): give the channel count once, "
            "e.g. norm(32)")):
        made(32, channels=16)
    with pytest.raises(GwdetTypeError, match=re.escape("(channels=32, num_channels=32)")):
        made(channels=32, num_channels=32)
    with pytest.raises(GwdetTypeError, match=re.escape("was called with eps=0.001: ")):
        made(channels=16, eps=1e-3)


# a registered build's float64 layer went into a float32 model (torch's "mixed dtype" at the first forward), and one
# on the meta device stopped detectron2's build with torch's "Cannot copy out of meta tensor ... use to_empty()"
def test_a_registered_norms_layer_of_another_dtype_or_on_the_meta_device_is_refused(registered):
    from gwdet.errors import GwdetValueError

    def double_gn(channels):
        return torch.nn.GroupNorm(4, channels).double()

    def meta_gn(channels):
        return torch.nn.GroupNorm(4, channels, device="meta")

    registered.extend(["TestDouble", "TestMeta", "TestIntBuffer"])
    register_norm("TestDouble", double_gn)
    register_norm("TestMeta", meta_gn)

    def with_a_counter(channels):
        layer = torch.nn.GroupNorm(4, channels)
        layer.register_buffer("seen", torch.zeros((), dtype=torch.long))
        return layer

    register_norm("TestIntBuffer", with_a_counter)
    with pytest.raises(GwdetValueError, match=r"^The norm 'TestDouble': its build function \S*double_gn " + re.escape(
            "returned a GroupNorm for 16 channels whose weight is "
            "torch.float64, where the model is built in torch's default dtype, torch.float32 (that of the convolution "
            "around the norm): the model's forward would stop at torch's \"mixed dtype\" error. Build the layer in the "
            "default dtype (no dtype=, .double(), .half() or .to(torch.float64) in the build function); for a model "
            "in torch.float64, move the whole model after building it (model.to(torch.float64)).")):
        get_norm(norm("TestDouble"), 16)
    with pytest.raises(GwdetValueError, match=r"^The norm 'TestMeta': its build function \S*meta_gn " + re.escape(
            "returned a GroupNorm for 16 channels whose weight is on "
            "the meta device, which holds no values: the model cannot be moved off it (detectron2 moves the model to "
            "MODEL.DEVICE with .to() after building it). Build the layer on a real device (no device='meta' in the "
            "build function): the model is moved with .to() after building.")):
        norm("TestMeta")(16)
    assert norm("TestIntBuffer")(16).seen.dtype == torch.long  # an integer buffer is no floating dtype
    with torch.device("meta"):  # a model built on the meta device as a whole: its norms are there too
        assert norm("TestMeta")(16).weight.is_meta and norm("GW")(16).weight.is_meta
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:  # the default dtype is what the convolutions get: float64 layers then fit
        assert norm("TestDouble")(16).weight.dtype == torch.float64
    finally:
        torch.set_default_dtype(before)


# torch's LayerNorm((C,)) registered as a norm normalized the width of (N, C, H, W) maps without a word
def test_a_registered_torch_layer_norm_over_the_last_axis_is_refused_naming_the_channel_norms(registered):
    registered.append("TestTorchLN")
    register_norm("TestTorchLN", torch.nn.LayerNorm)
    with pytest.raises(ValueError, match=r"^The norm 'TestTorchLN': its build function LayerNorm returned torch's "
                                         r"LayerNorm\(\(16,\).* normalizes over the last axis of its input: the width "
                                         r".*not the channels.*gwdet's 'LN' \(detectron2's LayerNorm, "
                                         r"gwdet.norm\('LN'\)\).*torch.nn.GroupNorm\(1, channels\)"):
        norm("TestTorchLN")(16)
    assert isinstance(norm("LN")(16), torch.nn.Module)


# a Norm made before its name was unregistered and registered with another function built with the new function
def test_a_norm_made_before_its_name_was_registered_anew_is_refused(registered):
    import copy

    registered.append("TestAnew")
    register_norm("TestAnew", lambda channels: torch.nn.GroupNorm(2, channels))
    made = norm("TestAnew")
    kept = copy.deepcopy(made)
    assert made(16).num_groups == 2
    unregister_norm("TestAnew")
    register_norm("TestAnew", lambda channels: torch.nn.GroupNorm(4, channels))
    for stale in (made, kept):
        with pytest.raises(ValueError, match=re.escape(
                "Norm('TestAnew') was made while 'TestAnew' was registered with one <lambda>; the name has been "
                "registered anew since, with another function named <lambda>") + r".*Make the norm again after the "
                r"registration you want: gwdet.norm\('TestAnew'\)"):
            stale(16)
    assert norm("TestAnew")(16).num_groups == 4


def _same_build(channels: int, num_groups: int = 2) -> torch.nn.Module:
    return torch.nn.GroupNorm(num_groups, channels)


def test_a_norm_still_builds_after_its_name_was_registered_again_with_the_same_function(registered):
    registered.append("TestAgain")
    register_norm("TestAgain", _same_build)
    made = norm("TestAgain", num_groups=4)
    unregister_norm("TestAgain")
    register_norm("TestAgain", _same_build)
    assert made(16).num_groups == 4 and pickle.loads(pickle.dumps(made))(16).num_groups == 4


# norm(16, 4) raised Python's "takes from 1 to 2 positional arguments"; norm(num_features=16) was told to give
# num_features to gwdet.norm, which refuses it too
def test_a_norm_called_with_two_positionals_or_num_features_names_the_call_forms():
    made = norm("GW", num_groups=4)
    forms = re.escape("a norm takes the channel count alone, norm(16), norm(channels=16) or norm(num_channels=16)")
    with pytest.raises(GwdetTypeError, match=re.escape(
            "Norm('GW', num_groups=4, T=5, eps=1e-05) was called with 2 positional arguments (16, 4): ") + forms
            + r".*gwdet.norm\('GW', <setting>=...\) \(the settings 'GW' takes: \['num_groups', 'T', 'eps'\]\)"):
        made(16, 4)
    for word in ("num_features", "normalized_shape"):
        with pytest.raises(GwdetTypeError, match=re.escape(
                f"Norm('GW', num_groups=4, T=5, eps=1e-05) was called with {word}=16, torch's word for a layer's "
                "channel count, which a norm does not take: ") + forms + re.escape(", e.g. norm(16)")):
            made(**{word: 16})


# check_gwdet_config({...}) said "call gwdet.add_gwdet_config(cfg)", which refuses a dict too
def test_check_gwdet_config_refuses_a_plain_dict_naming_what_it_takes():
    with pytest.raises(GwdetTypeError, match=r"^gwdet needs a detectron2 CfgNode \(a yacs config\), got a dict: "
                                             r"\{'MODEL': \{\}\}.*gwdet.add_gwdet_config takes a CfgNode too.*"
                                             r"get_cfg\(\); gwdet.add_gwdet_config\(cfg\).*"
                                             r"gwdet.model_zoo.build_config\(path\)"):
        gwdet.check_gwdet_config({"MODEL": {}})


# a build made by a factory with another closure value (make(4), make(8)) silently replaced the first registration
def test_a_build_of_the_same_code_with_other_closure_values_is_another_registration(registered):
    def make(groups):
        def build(channels):
            return torch.nn.GroupNorm(groups, channels)
        return build

    registered.append("TestClosure")
    register_norm("TestClosure", make(4))
    made = norm("TestClosure")
    register_norm("TestClosure", make(4))  # the same code and closure values: the same registration
    with pytest.raises(GwdetValueError, match=r"register_norm: 'TestClosure' is already registered \(by .*make.<locals>"
                                              r".build\); choose another name, or call "
                                              r"gwdet.norms.unregister_norm\('TestClosure'\) first"):
        register_norm("TestClosure", make(8))
    assert made(32).num_groups == 4


# a build reading a class a factory made with another class attribute silently replaced the first registration
def test_a_build_of_a_factory_class_with_other_attributes_is_another_registration(registered):
    def make_class(groups):
        class Layer(torch.nn.GroupNorm):
            GROUPS = groups

            def __init__(self, channels):
                super().__init__(self.GROUPS, channels)
        return Layer

    def build_from(layer):
        def build(channels):
            return layer(channels)
        return build

    registered.extend(["TestFactoryClass", "TestClassItself"])
    register_norm("TestFactoryClass", build_from(make_class(4)))
    register_norm("TestFactoryClass", build_from(make_class(4)))  # a class of the same attributes: the same
    with pytest.raises(GwdetValueError, match="'TestFactoryClass' is already registered"):
        register_norm("TestFactoryClass", build_from(make_class(8)))
    assert norm("TestFactoryClass")(32).num_groups == 4
    register_norm("TestClassItself", make_class(4))  # a class as the build
    register_norm("TestClassItself", make_class(4))
    with pytest.raises(GwdetValueError, match="'TestClassItself' is already registered"):
        register_norm("TestClassItself", make_class(8))


# (kept accepted) a module reloaded registers the same build again; reloaded with another closure value it is refused
def test_a_reloaded_module_registers_the_same_build_again(registered, tmp_path, monkeypatch):
    import importlib
    import sys

    registered.append("TestReloaded")
    source = ("import torch\nimport gwdet\n\nGROUPS = {}\n\n\nclass Own(torch.nn.GroupNorm):\n"
              "    def forward(self, x):\n        return super().forward(x)\n\n\n"
              "def make(groups):\n    def build(channels):\n        return Own(groups, channels)\n    return build\n\n\n"
              "gwdet.register_norm('TestReloaded', make(GROUPS))\n")
    module = tmp_path / "reloaded_norm_module.py"
    module.write_text(source.format(4))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "reloaded_norm_module", raising=False)
    loaded = importlib.import_module("reloaded_norm_module")
    try:
        importlib.reload(loaded)  # new function, closure and class objects of the same code and values: taken
        assert norm("TestReloaded")(32).num_groups == 4
        module.write_text(source.format(16))  # another length: no cached bytecode of the same size and time
        importlib.invalidate_caches()
        with pytest.raises(GwdetValueError, match="'TestReloaded' is already registered"):
            importlib.reload(loaded)
    finally:
        sys.modules.pop("reloaded_norm_module", None)


# before: "register_norm: name must be a non-empty string, got <function my_gn ...>", naming neither the cause (the
# decorator used without the name) nor the decorator form with a name
def test_register_norm_used_as_a_decorator_without_the_name_shows_the_form_with_it():
    def my_gn(channels, num_groups=16):
        return torch.nn.GroupNorm(num_groups, channels)

    with pytest.raises(GwdetTypeError, match=r"^register_norm takes the norm's name first, got <function .*my_gn at "
                                             r"0x[0-9a-f]+> in its place \(@gwdet\.register_norm used as a decorator "
                                             r"without the name\?\)\. Give the name the norm is looked up by: "
                                             r"@gwdet\.register_norm\('MY_GN'\) over the function, or "
                                             r"gwdet\.register_norm\('MY_GN', my_gn\)\.$"):
        register_norm(my_gn)
    assert "MY_GN" not in known_norm_names() and "my_gn" not in known_norm_names()


# gwdet.norm('ListN', dims='1234') was accepted, and the build made a layer from the string's four characters
def test_a_string_for_a_registered_norms_list_setting_is_refused(registered):
    import gwdet

    registered.append("TestListN")

    @gwdet.register_norm("TestListN")
    def build(channels, dims=[1, 2]):  # noqa: B006 (a default the build only reads)
        return torch.nn.GroupNorm(len(dims), channels)

    with pytest.raises(GwdetTypeError, match=re.escape(
            "gwdet.norm('TestListN'): dims='1234' is a string, and the norm's build takes a list there (its default "
            "is [1, 2]), which would iterate the string's characters: give dims as a list (e.g. dims=[1, 2]; "
            "['1234'] for a list of that one string).")):
        gwdet.norm("TestListN", dims="1234")
    assert gwdet.norm("TestListN", dims=[1, 2, 3, 4])(8).num_groups == 4
