"""What every gwdet norm layer does, whatever it normalizes over.

The layers are the gwdet names of the norm catalogue (:mod:`gwdet.norms`), built as detectron2
builds a norm, ``get_norm(gwdet.norm(name, ...), channels)``, with trained-looking affine
parameters and running statistics. The properties they share are tested here once, for every
name: shapes and dtypes, gradients against finite differences, what training and evaluation
mode normalize over (against the catalogue's ``batch_statistics``), empty and constant batches,
float32 statistics under autocast, TorchScript and tracing, state dicts, and the refusal of bad
arguments and inputs. What each layer computes is tested in its own file:
test_group_whitening.py (and test_group_whitening_fast.py for GW's custom op),
test_batch_whitening.py and test_batch_group_norm.py.
"""
import copy
import inspect
import math
import re
import warnings

import pytest
import torch
import torch.nn.functional as F
from detectron2.layers import get_norm

from gwdet import known_norm_names, norm
from gwdet.errors import GwdetValueError
from gwdet.layers.settings_state import UNCOMPARED_SETTINGS, SettingsInState, decode_settings
from gwdet.norms import norm_record
from layer_cases import CATALOGUE_CHANNELS, CATALOGUE_PARAMS

CHANNELS = CATALOGUE_CHANNELS
TEST_PARAMS = CATALOGUE_PARAMS  # small hyper-parameters per name (layer_cases.py)
NAMES = sorted(TEST_PARAMS)
WITH_BATCH_STATISTICS = [name for name in NAMES if norm_record(name).batch_statistics]


def build(name: str, dtype: torch.dtype = torch.float64) -> torch.nn.Module:
    """The layer of ``name`` in training mode, with random affine parameters and (for layers with
    running statistics) statistics moved away from their start by one training batch."""
    layer = get_norm(norm(name, **TEST_PARAMS[name]), CHANNELS).to(dtype)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        layer.weight.copy_(torch.rand(CHANNELS, generator=generator) + 0.5)
        layer.bias.copy_(torch.randn(CHANNELS, generator=generator))
        layer.train()(random_batch((6, CHANNELS, 3, 3), dtype, seed=100))
    return layer


def random_batch(shape, dtype: torch.dtype = torch.float64, seed: int = 0) -> torch.Tensor:
    """Random values with a scale and an offset per channel."""
    generator = torch.Generator().manual_seed(seed)
    per_channel = (1, shape[1]) + (1,) * (len(shape) - 2)
    values = torch.randn(shape, generator=generator, dtype=torch.float64)
    scale = torch.rand(per_channel, generator=generator, dtype=torch.float64) + 0.5
    offset = torch.randn(per_channel, generator=generator, dtype=torch.float64)
    return (values * scale + offset).to(dtype)


def buffer_copies(layer: torch.nn.Module) -> list:
    return [buffer.clone() for buffer in layer.buffers()]


def unchanged(before: list, layer: torch.nn.Module) -> bool:
    return all(torch.equal(a, b) for a, b in zip(before, layer.buffers(), strict=True))


def test_every_gwdet_name_of_the_catalogue_is_tested_here():
    gwdet_names = {name for name in known_norm_names()
                   if norm_record(name).builtin and norm_record(name).detectron2_values is None}
    assert gwdet_names == set(NAMES)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_output_has_the_shape_and_dtype_of_the_input(name, dtype):
    layer = build(name, dtype)
    for training in (True, False):
        layer.train(training)
        # 6 examples: GhostBN's example groups of 2 divide them (an odd one would be a single value per
        # channel of an (N, C) input, refused in training)
        for shape in [(6, CHANNELS), (6, CHANNELS, 7), (6, CHANNELS, 3, 4), (6, CHANNELS, 2, 3, 2)]:
            out = layer(random_batch(shape, dtype))
            assert out.shape == shape and out.dtype == dtype and torch.isfinite(out).all()
        # (N, C) is an (N, C, 1, 1) map
        vectors = random_batch((6, CHANNELS), dtype)
        assert torch.equal(layer(vectors), layer(vectors.view(6, CHANNELS, 1, 1)).view(6, CHANNELS))


@pytest.mark.parametrize("name", NAMES)
def test_on_the_meta_device_the_output_has_the_input_s_shape(name):
    # shapes without data (e.g. a model sized before its weights are loaded); BW, which leaves
    # autocast on the input's device, raised "unknown device type for autocast" there
    layer = build(name, torch.float32).to("meta")
    for training in (True, False):
        out = layer.train(training)(torch.empty(6, CHANNELS, 3, 4, device="meta"))
        assert out.device.type == "meta" and out.shape == (6, CHANNELS, 3, 4)


@pytest.mark.parametrize("name", NAMES)
def test_a_layer_built_on_the_meta_device_then_reset_is_the_freshly_built_one(name):
    # torch's meta-device initialization: build without memory, to_empty(), then reset_parameters()
    fresh = get_norm(norm(name, **TEST_PARAMS[name]), CHANNELS)
    with torch.device("meta"):
        layer = get_norm(norm(name, **TEST_PARAMS[name]), CHANNELS)
    layer = layer.to_empty(device="cpu")
    layer.reset_parameters()
    expected, built = fresh.state_dict(), layer.state_dict()
    assert built.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(built[key], value), key


@pytest.mark.parametrize(
    "name,training",
    [(name, True) for name in NAMES] + [(name, False) for name in WITH_BATCH_STATISTICS],
    ids=lambda value: {True: "train", False: "eval"}.get(value, value),
)
def test_gradients_match_finite_differences(name, training):
    # 3 examples: BGN's example groups of 2 leave a smaller last group
    layer = build(name).train(training)
    x = random_batch((3, CHANNELS, 2, 2)).requires_grad_()

    def output(x, weight, bias):
        return torch.func.functional_call(layer, {"weight": weight, "bias": bias}, (x,))

    assert torch.autograd.gradcheck(output, (x, layer.weight, layer.bias))


@pytest.mark.parametrize("name", NAMES)
def test_batch_statistics_exactly_where_the_catalogue_says(name):
    layer = build(name)
    x = random_batch((6, CHANNELS, 3, 3), seed=1)
    other_second_example = x.clone()
    other_second_example[1] = 3.0 * x[1] + 1.0

    # evaluation: every example alone, with fixed statistics
    before = buffer_copies(layer)
    evaluated = layer.eval()(x)
    one_by_one = torch.cat([layer(x[i : i + 1]) for i in range(len(x))])
    assert torch.allclose(evaluated, one_by_one, rtol=0, atol=1e-12)
    assert unchanged(before, layer)

    trained = layer.train()(x)
    changed_neighbour = layer(other_second_example)
    if norm_record(name).batch_statistics:
        assert not unchanged(before, layer), "training updates the running statistics"
        assert not torch.allclose(changed_neighbour[0], trained[0], rtol=0, atol=1e-3), \
            "the first example is normalized together with the second"
    else:
        assert list(layer.buffers()) == []
        assert torch.equal(trained, evaluated), "no running statistics: training computes what evaluation does"
        assert torch.allclose(changed_neighbour[0], trained[0], rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_an_empty_batch_gives_an_empty_output_and_changes_nothing(name, training):
    layer = build(name).train(training)
    before = buffer_copies(layer)
    for shape in [(0, CHANNELS, 5, 5), (0, CHANNELS)]:
        x = torch.zeros(shape, dtype=torch.float64, requires_grad=True)
        out = layer(x)
        assert out.shape == shape
        out.sum().backward()
        assert x.grad.shape == shape
    assert unchanged(before, layer)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype,value", [(torch.float32, 1000.0), (torch.float64, -2.0)], ids=["float32", "float64"])
def test_a_constant_batch_gives_the_bias_and_finite_gradients(name, dtype, value):
    layer = build(name, dtype)
    x = torch.full((4, CHANNELS, 3, 3), value, dtype=dtype, requires_grad=True)
    out = layer(x)
    assert torch.allclose(out, layer.bias.detach().view(1, CHANNELS, 1, 1).expand_as(out))
    (out * torch.randn(out.shape, dtype=dtype)).sum().backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(layer.weight.grad).all()
    assert all(torch.isfinite(buffer).all() for buffer in layer.buffers())


# Largest error of a half-precision output against the float32 output on the unrounded input:
# the input rounding (relative finfo.eps / 2 per value) carried through the normalization.
INPUT_ROUNDING_ERROR = {torch.bfloat16: 0.05, torch.float16: 0.005}


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
def test_half_precision_and_autocast_keep_float32_statistics(name, dtype):
    layer = build(name, torch.float32)  # trained affine: applied in float32, rounded once
    x = random_batch((6, CHANNELS, 5, 5), torch.float32, seed=3)
    rounded = x.to(dtype)
    for training in (True, False):
        layer.train(training)
        reference = layer(x)
        on_rounded_input = layer(rounded.float())
        with torch.autocast("cpu", dtype=torch.bfloat16):
            autocast_float32 = layer(x)
            low = layer(rounded)
        # float32 input: the statistics stay float32 under autocast
        assert autocast_float32.dtype == torch.float32
        assert torch.allclose(autocast_float32, reference, rtol=0, atol=1e-6)
        # half-precision input: computed in float32 and rounded once, within half a unit in the last place
        assert low.dtype == dtype and torch.isfinite(low).all()
        half_ulp = torch.finfo(dtype).eps / 2 * on_rounded_input.abs() + 1e-6
        assert ((low.float() - on_rounded_input).abs() <= half_ulp).all()
        assert (low.float() - reference).abs().max() < INPUT_ROUNDING_ERROR[dtype]
        assert layer(rounded).dtype == dtype
    layer.train()
    rounded.requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        layer(rounded).float().square().sum().backward()
    assert rounded.grad.dtype == dtype and torch.isfinite(rounded.grad).all()
    assert layer.weight.grad.dtype == torch.float32 and torch.isfinite(layer.weight.grad).all()
    assert all(buffer.dtype == torch.float32 for buffer in layer.buffers())


@pytest.mark.parametrize("name", NAMES)
def test_torchscript_computes_what_eager_mode_does(name):
    eager = build(name, torch.float32)
    scripted = torch.jit.script(copy.deepcopy(eager))
    x = random_batch((5, CHANNELS, 3, 3), torch.float32, seed=4)
    for training in (True, False):
        eager.train(training)
        scripted.train(training)
        assert torch.allclose(scripted(x), eager(x), atol=1e-6)
        for expected, got in zip(eager.buffers(), scripted.buffers(), strict=True):
            assert torch.allclose(got, expected, atol=1e-6)


class _DoublingSubclass(torch.nn.Module):
    """The doubled output of a GW layer, as a subclass would write it: what docs/deploy.md's Limits name."""

    def __init__(self) -> None:
        super().__init__()
        from gwdet.layers import GroupWhitening

        self.norm = GroupWhitening(CHANNELS, num_groups=4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x) * 2


def test_a_layer_held_as_a_submodule_scripts_where_a_subclass_calling_super_does_not():
    from gwdet.layers import GroupWhitening

    class SuperCalling(GroupWhitening):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) * 2

    with pytest.raises(RuntimeError, match="has no attribute or method 'forward'"):  # TorchScript's: docs/deploy.md
        torch.jit.script(SuperCalling(CHANNELS, num_groups=4))
    holding = _DoublingSubclass()
    x = random_batch((2, CHANNELS, 3, 3), torch.float32, seed=1)
    assert torch.allclose(torch.jit.script(holding)(x), holding(x), atol=1e-6)
    assert torch.allclose(holding(x), 2 * holding.norm(x))


# (torch warns that the variance of BGN's empty blocks has no degree of freedom: there is none to compute)
@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning", r"ignore:var_mean\(\). degrees of freedom:UserWarning")
@pytest.mark.parametrize("name", NAMES)
def test_a_trace_in_evaluation_mode_holds_only_aten_ops_and_reloads(name, tmp_path):
    # what a deployment graph needs: it loads where gwdet is not installed
    layer = build(name, torch.float32).eval()
    traced = torch.jit.trace(layer, (random_batch((2, CHANNELS, 3, 3), torch.float32),))
    kinds = {node.kind() for node in traced.graph.nodes()}
    assert not any(kind.startswith(("prim::PythonOp", "gwdet::")) for kind in kinds), kinds
    torch.jit.save(traced, str(tmp_path / "layer.pt"))
    loaded = torch.jit.load(str(tmp_path / "layer.pt"))
    other = random_batch((3, CHANNELS, 4, 2), torch.float32, seed=5)  # another batch and spatial size
    assert torch.allclose(loaded(other), layer(other), rtol=0, atol=1e-5)
    # no sample at all (a head without ROIs): an empty output, not an error
    assert loaded(torch.zeros(0, CHANNELS, 4, 2)).shape == (0, CHANNELS, 4, 2)


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
@pytest.mark.parametrize("name", NAMES)
def test_a_trace_on_a_half_precision_input_warns_that_it_keeps_that_dtype(name):
    # the recorded casts are constants: a float16 trace returned float16 for a float32 input without a word
    layer = build(name, torch.float32).eval()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.jit.trace(layer, (random_batch((2, CHANNELS, 3, 3), torch.float32),))
    assert not [w for w in caught if "traced on a" in str(w.message)]
    with pytest.warns(RuntimeWarning, match=r"traced on a torch.bfloat16 input, the trace holds the casts .* returns "
                      r"torch.bfloat16 whatever dtype it is given later, a float32 input rounded to it. Trace with a "
                      r"float32 input"):
        traced = torch.jit.trace(layer.bfloat16(), (random_batch((2, CHANNELS, 3, 3), torch.bfloat16),))
    assert traced(random_batch((2, CHANNELS, 3, 3), torch.float32)).dtype == torch.bfloat16  # what it warns of


@pytest.mark.parametrize("name", NAMES)
def test_a_weight_of_another_size_put_in_after_the_build_is_named_at_the_forward(name):
    # weight.data or functional_call's weight of 8 values ended in torch's "size of tensor a (16) must match ..."
    layer, x = build(name), random_batch((4, CHANNELS, 3, 3))
    message = re.escape(f"weight must hold one value per channel, shape [{CHANNELS}], got [{CHANNELS // 2}]")
    with pytest.raises(ValueError, match=message):
        torch.func.functional_call(layer, {"weight": torch.ones(CHANNELS // 2, dtype=torch.float64)}, (x,))
    layer.weight.data = torch.ones(CHANNELS // 2, dtype=torch.float64)
    with pytest.raises(ValueError, match=message):
        layer(x)


@pytest.mark.parametrize("name", NAMES)
def test_a_state_dict_restores_the_layer(name):
    trained = build(name)
    fresh = get_norm(norm(name, **TEST_PARAMS[name]), CHANNELS).double()
    fresh.load_state_dict(trained.state_dict())
    x = random_batch((5, CHANNELS, 3, 3), seed=6)
    for training in (False, True):
        assert torch.equal(fresh.train(training)(x), trained.train(training)(x))
    # the affine parameters have the names and shapes of torch's (and so detectron2's) norms
    parameters = {key: value.shape for key, value in trained.named_parameters()}
    assert parameters == {key: value.shape for key, value in torch.nn.GroupNorm(1, CHANNELS).named_parameters()}


# ---- the settings each layer records in its state dict (gwdet.layers.settings_state) -------------

# for every hyper-parameter a value that no name above is built with (BW: another group size, so
# another shape of running_whitening)
OTHER_VALUES = {"num_groups": 3, "T": 3, "eps": 1e-3, "group_size": 4, "momentum": 0.25, "examples_per_group": 3,
                "eval_example_weight": 0.75}


def build_named(name: str, **changed) -> torch.nn.Module:
    """``name``'s layer with the test values and ``changed``, float64, with random parameters (a
    whitening matrix symmetric, as every trained one is)."""
    layer = get_norm(norm(name, **{**TEST_PARAMS[name], **changed}), CHANNELS).double()
    generator = torch.Generator().manual_seed(len(changed))
    with torch.no_grad():
        for key, tensor in layer.state_dict().items():
            if tensor.is_floating_point():
                tensor.copy_(torch.rand(tensor.shape, generator=generator, dtype=tensor.dtype) + 0.5)
                if key.endswith("running_whitening"):
                    tensor.copy_((tensor + tensor.transpose(-1, -2)) / 2)
    return layer


def test_every_hyper_parameter_has_another_value_here():
    for name in NAMES:
        assert set(norm_record(name).params()) <= set(OTHER_VALUES), name


@pytest.mark.parametrize("name", NAMES)
def test_the_state_dict_records_the_settings(name):
    layer = build_named(name)
    recorded = decode_settings(layer.state_dict()["_extra_state"])
    assert recorded == {"layer": type(layer).__name__, **layer.settings()}
    assert recorded["num_channels"] == CHANNELS and recorded["affine"] is True
    assert all(recorded[param] == getattr(layer, param) for param in norm_record(name).params())


@pytest.mark.parametrize("name", NAMES)
def test_a_state_of_other_settings_is_refused_naming_the_layer_the_setting_and_both_values(name):
    saved = build_named(name)
    state = {f"head.0.{key}": value for key, value in saved.state_dict().items()}
    for param in norm_record(name).params():
        other = build_named(name, **{param: OTHER_VALUES[param]})
        model = torch.nn.ModuleDict({"head": torch.nn.Sequential(other)})
        if param in UNCOMPARED_SETTINGS:  # momentum, eval_example_weight: the same trained function
            model.load_state_dict(state)
            continue
        before = {key: value.clone() for key, value in other.state_dict().items() if key != "_extra_state"}
        for strict in (True, False):  # detectron2's checkpointer loads with strict=False
            with pytest.raises(RuntimeError) as refused:
                model.load_state_dict(state, strict=strict)
            message = str(refused.value)
            assert (f"head.0 ({type(other).__name__}) was saved with {param}={getattr(saved, param)!r}, but this "
                    f"layer has {param}={getattr(other, param)!r}: the weights were trained as another function. Build "
                    "the layer with the saved values") in message, message
            # the way out of loading anyway is offered only where the tensors keep their shapes
            assert ("delete 'head.0._extra_state' from the state dict" in message) == (param != "group_size")
            assert "size mismatch" not in message
            assert all(torch.equal(value, before[key]) for key, value in other.state_dict().items()
                       if key != "_extra_state"), "the refused layer keeps its own values"
        without_record = {key: value for key, value in state.items() if not key.endswith("_extra_state")}
        if param != "group_size":  # the one setting that changes a shape (BW's running_whitening)
            model.load_state_dict(without_record)  # the fix the message names: it loads, and the layer keeps its settings
            assert getattr(other, param) == OTHER_VALUES[param]


@pytest.mark.parametrize("name", NAMES)
def test_a_state_saved_before_the_layers_recorded_settings_loads_strictly(name):
    old_state = {key: value for key, value in build_named(name).state_dict().items() if key != "_extra_state"}
    fresh = build_named(name)
    with torch.no_grad():
        for tensor in fresh.state_dict().values():
            if tensor.is_floating_point():
                tensor.zero_()
    loaded = fresh.load_state_dict(old_state, strict=True)
    assert (loaded.missing_keys, loaded.unexpected_keys) == ([], []), "the absent record is not a missing key"
    assert all(torch.equal(fresh.state_dict()[key], value) for key, value in old_state.items())


@pytest.mark.parametrize("name", ["GW", "BW"])
def test_a_record_that_is_not_settings_or_of_another_layer_is_refused(name):
    layer = build_named(name)
    state = layer.state_dict()
    # three zeros, never a record, were said to be a record cast to float32
    with pytest.raises(RuntimeError, match=r"the state's '_extra_state' is not the settings a gwdet norm layer records "
                                           r"\(a uint8 tensor of 512 bytes of JSON\), so the state"):
        build_named(name).load_state_dict({**state, "_extra_state": torch.zeros(3)})
    with pytest.raises(RuntimeError, match=r"bytes of JSON\) \(it was cast to torch.float16, as a cast of every tensor "
                                           r"of the weights does: cast the floating-point tensors only\), so the state"):
        build_named(name).load_state_dict({key: value.half() for key, value in state.items()})
    other_kind = build_named("BGN").state_dict()["_extra_state"]
    with pytest.raises(RuntimeError, match=rf"{type(layer).__name__}: the state is of a BatchGroupNorm layer, not of a "
                                           rf"{type(layer).__name__}; .*\(a subclass that changes no computation\), "
                                           r"delete '_extra_state' from the state dict"):
        build_named(name).load_state_dict({**state, "_extra_state": other_kind})
    with pytest.raises(ValueError, match=r"was saved with"):  # set_extra_state called on its own
        build_named(name, **{norm_record(name).params()[0]: OTHER_VALUES[norm_record(name).params()[0]]}) \
            .set_extra_state(state["_extra_state"])


LAYER_CLASSES = sorted({type(get_norm(norm(name), CHANNELS)) for name in NAMES}, key=lambda cls: cls.__name__)


@pytest.mark.parametrize("layer_class", LAYER_CLASSES, ids=lambda cls: cls.__name__)
def test_without_affine_there_are_no_parameters_and_the_output_is_unscaled(layer_class):
    plain, with_affine = layer_class(CHANNELS, affine=False).double(), layer_class(CHANNELS).double()
    assert list(plain.parameters()) == []
    assert set(plain.state_dict()) == set(with_affine.state_dict()) - {"weight", "bias"}
    x = random_batch((5, CHANNELS, 4, 4), seed=7)
    for training in (True, False):
        assert torch.allclose(plain.train(training)(x), with_affine.train(training)(x), rtol=0, atol=1e-12)


# constructor argument -> bad values and the end of the error each gets: the value's repr, with its
# type where the type is wrong (a string that reads like a number, a bool)
NOT_A_COUNT = [(0, "must be an integer >= 1, got 0"), (2.5, "must be an integer >= 1, got 2.5 (float)"),
               ("4", "must be an integer >= 1, got '4' (str)"), (True, "must be an integer >= 1, got True (bool)")]
NOT_A_FRACTION = [(1.5, "must be a number in [0, 1], got 1.5"), (-0.1, "must be a number in [0, 1], got -0.1"),
                  ("0.5", "must be a number in [0, 1], got '0.5' (str)"), (math.nan, "must be a number in [0, 1], got nan")]
BAD_ARGUMENTS = {
    "num_channels": NOT_A_COUNT,
    "num_groups": NOT_A_COUNT,
    "group_size": NOT_A_COUNT,
    "examples_per_group": NOT_A_COUNT,
    # a count past int64 failed in the op's call; 10**12 iterations ran for days without a word
    "T": NOT_A_COUNT + [(2**63, "must be an integer from 1 to 1000 (Newton's iterations, Eqs. 6-7; the default is 5), "
                                "got 9223372036854775808"), (1001, "must be an integer from 1 to 1000")],
    "eps": [(0.0, "must be a finite number > 0, got 0.0"), (-1e-5, "must be a finite number > 0, got -1e-05"),
            (math.inf, "must be a finite number > 0, got inf"), (math.nan, "must be a finite number > 0, got nan"),
            ("1e-5", "must be a finite number > 0, got '1e-5' (str)"),
            # finite in Python's float64, not in float32, in which the layers compute
            (1e300, "must be a finite number > 0 in float32, the precision the norm layers compute in, got 1e+300, "
                    "which float32 rounds to inf; use a value within float32's range (1.2e-38 to 3.4e+38)"),
            (1e-50, "must be a finite number > 0 in float32, the precision the norm layers compute in, got 1e-50, "
                    "which float32 rounds to 0.0; use a value within float32's range (1.2e-38 to 3.4e+38)")],
    "momentum": NOT_A_FRACTION,
    "eval_example_weight": NOT_A_FRACTION,
    "method": [("pca", "must be one of 'itn', 'zca', got 'pca'"), (None, "must be one of 'itn', 'zca', got None (NoneType)")],
    "affine": [("no", "must be True or False, got 'no' (str)"), (0, "must be True or False, got 0 (int)")],
    "device": [("nowhere", "must be a torch.device, a device string ('cpu', 'cuda:0', 'meta') or None (torch's default "
                           "device), got 'nowhere', which torch does not read as a device"),
               (1.5, "must be a torch.device, a device string ('cpu', 'cuda:0', 'meta') or None (torch's default "
                     "device), got 1.5 (float)")],
    "dtype": [(torch.int64, "must be a floating-point dtype (torch.float16, torch.bfloat16, torch.float32, "
                            "torch.float64) or None (torch's default dtype), got torch.int64: the layer's parameters "
                            "and running statistics are learned and averaged in floating point; leave dtype out, or "
                            "give e.g. dtype=torch.float64"),
              ("float64", "must be a floating-point dtype (torch.float16, torch.bfloat16, torch.float32, "
                          "torch.float64) or None (torch's default dtype), got 'float64' (str)")],
}


def constructor_arguments(layer_class) -> list:
    return list(inspect.signature(layer_class).parameters)


def test_every_constructor_argument_has_bad_values_here():
    for layer_class in LAYER_CLASSES:
        assert set(constructor_arguments(layer_class)) <= set(BAD_ARGUMENTS), layer_class


@pytest.mark.parametrize(
    "layer_class,argument,value,message",
    [(cls, argument, value, message) for cls in LAYER_CLASSES for argument in constructor_arguments(cls)
     for value, message in BAD_ARGUMENTS.get(argument, [])],
    ids=lambda value: value.__name__ if isinstance(value, type) else None,
)
def test_a_bad_constructor_argument_is_named(layer_class, argument, value, message):
    arguments = {"num_channels": CHANNELS, argument: value}
    with pytest.raises(ValueError, match=re.escape(f"{layer_class.__name__}: {argument} {message}")):
        layer_class(**arguments)


COUNT_ARGUMENTS = [(cls, argument) for cls in LAYER_CLASSES for argument in constructor_arguments(cls)
                   if BAD_ARGUMENTS.get(argument) is NOT_A_COUNT]


# before: BatchGroupNorm(16, num_groups=4, examples_per_group=10**30) was accepted, and torch.jit.script failed with
# a raw pybind error (Could not cast attribute 'examples_per_group' to type int: ... to C++ type '?'); with
# examples_per_group=2**63 - 1 the scripted layer failed in training (Stride calculation overflowed)
@pytest.mark.parametrize("layer_class,argument", COUNT_ARGUMENTS,
                         ids=lambda value: value.__name__ if isinstance(value, type) else None)
def test_a_count_past_int64_is_refused_naming_the_largest(layer_class, argument):
    largest = 2**63 - 1
    for value in (10**30, largest + 1):
        with pytest.raises(GwdetValueError, match=re.escape(
                f"{layer_class.__name__}: {argument} must be an integer from 1 to {largest} (2**63 - 1, the largest "
                f"integer torch holds: a larger one fails in torch.jit.script and torch's ops), got {value}; give a "
                f"value of at most {largest}")):
            layer_class(**{"num_channels": CHANNELS, argument: value})
    if argument != "num_channels":  # the largest is accepted, and the layer scripts and runs as built
        layer = layer_class(**{"num_channels": CHANNELS, argument: largest})
        assert getattr(layer, argument) == largest
        x = random_batch((4, CHANNELS, 3, 3), torch.float32, seed=3)
        torch.testing.assert_close(torch.jit.script(copy.deepcopy(layer))(x), layer(x))


# before: layer.examples_per_group = 10**30 after the build was taken, and the layer could not be scripted
def test_a_count_past_int64_set_after_the_build_is_refused():
    from gwdet.layers import BatchGroupNorm

    layer = BatchGroupNorm(CHANNELS, num_groups=4)
    with pytest.raises(GwdetValueError, match=re.escape(
            f"BatchGroupNorm: examples_per_group must be an integer from 1 to {2**63 - 1} (2**63 - 1, the largest "
            f"integer torch holds: a larger one fails in torch.jit.script and torch's ops), got {10**30}")):
        layer.examples_per_group = 10**30
    assert layer.examples_per_group == 2


@pytest.mark.parametrize("name", ["GW_ZCA", "BW"])
def test_zca_whitening_refuses_an_eps_whose_gradient_float32_cannot_hold(name):
    # eps=1e-30 on a group of rank below its size: output and weight gradient finite, the input gradient inf
    from gwdet.layers import BatchWhitening, GroupWhitening
    from gwdet.layers.whitening_matrix import ZCA_SMALLEST_EPS

    layer_class, groups = (GroupWhitening, {"num_groups": 1}) if name == "GW_ZCA" else (BatchWhitening, {"group_size": 16})
    with pytest.raises(ValueError, match=r"eps=1e-30 is too small for ZCA whitening: .* reaches 1/\(2 eps\^\(3/2\)\) = "
                                         r"5e\+44, .* Give eps >= 1e-20 \(MODEL.GW.EPS, MODEL.BW.EPS in a config\), or method 'itn'"):
        layer_class(16, eps=1e-30, method="zca", **groups)
    layer_class(16, eps=1e-30, method="itn", **groups)  # ItN's gradients stay finite
    x = torch.randn(2, 16, 1, 3, requires_grad=True)  # 6 values for a group of 16 channels, or 3 per sample
    layer_class(16, eps=ZCA_SMALLEST_EPS, method="zca", **groups)(x).square().sum().backward()
    assert torch.isfinite(x.grad).all()


@pytest.mark.filterwarnings("ignore:The PyTorch API of (nested tensors|MaskedTensors) is in prototype stage")
@pytest.mark.parametrize("name", NAMES)
def test_input_of_another_layout_or_dtype_is_refused(name):
    layer = build(name, torch.float32)
    owner = type(layer).__name__
    expected_shape = f"{owner}: expected input of shape (N, {CHANNELS}) or (N, {CHANNELS}, *spatial), got"
    for shape in [(2, 6, 3, 3), (CHANNELS,)]:
        with pytest.raises(ValueError, match=re.escape(f"{expected_shape} {list(shape)}")):
            layer(torch.randn(shape))
    with pytest.raises(ValueError, match=re.escape(
            f"{owner}: expected a floating-point input, got torch.int64; convert it with .float()")):
        layer(torch.ones(2, CHANNELS, 3, 3, dtype=torch.int64))
    if isinstance(layer, SettingsInState):  # torch's own layers answer for themselves
        # float8 (a storage type): GW ended in torch's "max_values_cpu" not implemented, BW and BGN computed
        with pytest.raises(ValueError, match=re.escape(
                f"{owner}: expected a float16, bfloat16, float32 or float64 input, got torch.float8_e4m3fn; convert "
                "it with .float()")):
            layer(torch.randn(2, CHANNELS, 3, 3).to(torch.float8_e4m3fn))
        with pytest.raises(ValueError, match=re.escape(
                f"{owner}: expected a dense input, got a sparse tensor; convert it with .to_dense()")):
            layer(torch.randn(2, CHANNELS, 3, 3).to_sparse())
        # nested and masked tensors: torch's "NestedTensorImpl doesn't support sizes", "Multiple dispatch failed"
        nested = torch.nested.nested_tensor([torch.randn(CHANNELS, 3, 3), torch.randn(CHANNELS, 4, 4)])
        with pytest.raises(ValueError, match=re.escape(f"{owner}: expected a dense input, got a nested tensor")):
            layer(nested)
        masked = torch.masked.masked_tensor(torch.randn(2, CHANNELS, 3, 3), torch.rand(2, CHANNELS, 3, 3) > 0.5)
        with pytest.raises(ValueError, match=re.escape(f"{owner}: expected a dense input, got a torch.masked "
                                                       "MaskedTensor")):
            layer(masked)


@pytest.mark.parametrize("name", NAMES)
def test_the_output_can_be_modified_in_place(name):
    # detectron2's blocks run F.relu_(norm(conv(x))): the output must be no view of a saved tensor
    layer = build(name)
    x, grad = random_batch((4, CHANNELS, 3, 3), seed=8), random_batch((4, CHANNELS, 3, 3), seed=9)
    in_place_input, input_ = x.clone().requires_grad_(), x.clone().requires_grad_()
    in_place = F.relu_(layer(in_place_input))
    (in_place * grad).sum().backward()
    expected = torch.relu(layer(input_))
    (expected_grad,) = torch.autograd.grad(expected, input_, grad)
    assert torch.allclose(in_place, expected, rtol=0, atol=1e-12)
    assert torch.allclose(in_place_input.grad, expected_grad, rtol=0, atol=1e-12)


def test_an_eps_flushed_to_zero_names_the_flush_mode_and_the_smallest_value_left():
    # "use a value within float32's range (1.4e-45 to ...)" although 1.4e-45 itself was refused:
    # with subnormals flushed to zero the range starts at the smallest normal number
    from gwdet.layers import GroupWhitening

    if not torch.set_flush_denormal(True):  # True where the CPU supports the mode
        pytest.skip("this CPU cannot flush subnormal numbers to zero")
    try:
        with pytest.raises(ValueError) as refused:
            GroupWhitening(16, 4, eps=1.4e-45)
        GroupWhitening(16, 4, eps=1.2e-38)  # the smallest value the message names is accepted
    finally:
        torch.set_flush_denormal(False)
    assert str(refused.value).endswith(
        "got 1.4e-45, which float32 rounds to 0.0 with subnormal numbers flushed to zero "
        "(torch.set_flush_denormal(True)); use a value within float32's range (1.2e-38 to 3.4e+38)")


def test_torch_fx_traces_a_model_with_gwdet_norms_as_leaves_as_deploy_md_says():
    # docs/deploy.md, Limits: torch's bare TraceError, and the leaf_modules that work
    import torchvision
    from torchvision.models.feature_extraction import create_feature_extractor

    import gwdet

    model = torchvision.models.resnet18(norm_layer=gwdet.norm("GW", num_groups=16)).eval()
    with pytest.raises(torch.fx.proxy.TraceError, match="control flow"):
        create_feature_extractor(model, {"layer2": "c3"})
    extractor = create_feature_extractor(model, {"layer2": "c3"},
                                         tracer_kwargs={"leaf_modules": list(gwdet.norms.layer_types())})
    x = torch.randn(2, 3, 64, 64)
    expected = model.layer2(model.layer1(model.maxpool(model.relu(model.bn1(model.conv1(x))))))
    assert torch.allclose(extractor(x)["c3"], expected)


# GroupWhitening(8, 4, device="meta") and dtype=torch.float64 raised a bare TypeError (an unexpected keyword),
# and torch.nn.utils.skip_init refused the layers ("Module must support a 'device' arg")
@pytest.mark.parametrize("layer_class", LAYER_CLASSES, ids=lambda cls: cls.__name__)
def test_the_layers_take_torch_s_device_and_dtype_factory_arguments(layer_class):
    on_meta = layer_class(CHANNELS, device="meta")
    assert all(tensor.device.type == "meta" for tensor in [*on_meta.parameters(), *on_meta.buffers()])
    single = build_from(layer_class(CHANNELS))
    double = layer_class(CHANNELS, dtype=torch.float64)
    assert all(tensor.dtype == torch.float64 for tensor in [*double.parameters(), *double.buffers()])
    assert double.state_dict()["_extra_state"].dtype == torch.uint8  # the settings record stays bytes
    double.load_state_dict(single.state_dict())
    x = random_batch((6, CHANNELS, 3, 3), seed=3)
    for training in (False, True):  # the same input: what differs is the layers' own dtype
        expected = single.train(training)(x.float())
        assert torch.allclose(double.train(training)(x.float()), expected, rtol=0, atol=1e-6)
    assert torch.allclose(double.eval()(x).float(), single.eval()(x.float()), rtol=0, atol=1e-4)
    assert double.eval()(x).dtype == torch.float64
    with pytest.raises(ValueError, match=re.escape(f"{layer_class.__name__}: dtype must be a floating-point dtype "
                                                   "(torch.float16, torch.bfloat16, torch.float32, torch.float64) or "
                                                   "None (torch's default dtype), got torch.int64")):
        layer_class(CHANNELS, dtype=torch.int64)
    skipped = torch.nn.utils.skip_init(layer_class, CHANNELS)
    assert skipped.weight.device.type == "cpu"
    skipped.reset_parameters()
    fresh = layer_class(CHANNELS)
    assert torch.equal(skipped(x.float()), fresh(x.float()))
    assert torch.jit.script(layer_class(CHANNELS, dtype=torch.float64)).eval()(x).dtype == torch.float64


def build_from(layer: torch.nn.Module) -> torch.nn.Module:
    """``layer`` with random affine parameters and running statistics moved by one training batch."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        layer.weight.copy_(torch.rand(CHANNELS, generator=generator) + 0.5)
        layer.bias.copy_(torch.randn(CHANNELS, generator=generator))
        layer.train()(random_batch((6, CHANNELS, 3, 3), torch.float32, seed=100))
    return layer


# GroupWhitening(16, device="cuda") on a machine without CUDA failed in torch with "Found no NVIDIA driver", "xpu"
# with "Torch not compiled with XPU enabled", a device torch cannot allocate on with "Could not run
# 'aten::empty.memory_format'". The machine's own devices decide which refusals are asserted.
@pytest.mark.parametrize("layer_class", LAYER_CLASSES, ids=lambda cls: cls.__name__)
def test_a_device_this_machine_does_not_have_is_refused_by_name(layer_class):
    fix = re.escape("give device='cpu' (or leave it out), or build the layer on the CPU and move it with "
                    ".to(device) on a machine that has that device")
    owner = layer_class.__name__
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        with pytest.raises(GwdetValueError, match=re.escape(
                f"device 'cuda:{count}' names CUDA device {count}, but this machine has {count} CUDA device")):
            layer_class(CHANNELS, device=f"cuda:{count}")
    else:
        with pytest.raises(GwdetValueError, match=re.escape(
                f"{owner}: device 'cuda' is a CUDA device, but CUDA is not available on this machine "
                "(torch.cuda.is_available() is False); ") + fix):
            layer_class(CHANNELS, device="cuda")
        with pytest.raises(GwdetValueError, match=re.escape("device 0 (cuda:0) is a CUDA device, but CUDA is not "
                                                            "available")):
            layer_class(CHANNELS, device=0)
    if not torch.backends.mps.is_available():
        with pytest.raises(GwdetValueError, match=re.escape("device 'mps' is an Apple MPS device, but MPS is not "
                                                            "available")):
            layer_class(CHANNELS, device=torch.device("mps"))
    if not torch.xpu.is_available():
        with pytest.raises(GwdetValueError, match=re.escape(
                f"{owner}: device 'xpu' is an XPU device, but XPU is not available on this machine "
                "(torch.xpu.is_available() is False); ") + fix):
            layer_class(CHANNELS, device="xpu")
    with pytest.raises(GwdetValueError, match=re.escape(
            "device 'xla' cannot be used on this machine: torch cannot create a tensor there (torch.empty(0, "
            "device='xla') fails with ") + ".*" + fix):
        layer_class(CHANNELS, device="xla")
    assert layer_class(CHANNELS, device="meta").weight.device.type == "meta"
    assert layer_class(CHANNELS, device="cpu").weight.device.type == "cpu"


# GroupWhitening(2**40, 4) failed with torch's allocator error, which names the bytes but not the argument; a
# count whose byte size overflows with "Storage size calculation overflowed". 2**50 float32 values pass any
# machine's address space, so the allocation fails whatever the memory overcommit setting.
@pytest.mark.parametrize("layer_class", LAYER_CLASSES, ids=lambda cls: cls.__name__)
@pytest.mark.parametrize("channels", [2**50, 2**61], ids=["too-large", "overflowing"])
def test_a_channel_count_no_memory_holds_is_refused_naming_the_argument(layer_class, channels):
    with pytest.raises(GwdetValueError, match=re.escape(
            f"{layer_class.__name__}(num_channels={channels}): its parameters and running statistics do not fit in "
            "this device's memory (") + ".*" + re.escape("check num_channels.")):
        layer_class(channels)
    if channels == 2**50:  # on the meta device nothing is allocated; an overflowing size is refused there too
        assert layer_class(channels, device="meta").weight.shape == (channels,)


# GroupWhitening(16, 4)(64), BatchWhitening(16, 4)(numpy array), BatchGroupNorm(16, 4)([t] * 4) failed with a
# raw "AttributeError: '<type>' object has no attribute 'is_nested'"
@pytest.mark.parametrize("layer_class", LAYER_CLASSES, ids=lambda cls: cls.__name__)
def test_an_input_that_is_not_a_tensor_is_refused_by_name(layer_class):
    from gwdet.errors import GwdetTypeError

    layer, x = layer_class(CHANNELS), random_batch((4, CHANNELS, 3, 3), torch.float32)
    owner, shape = layer_class.__name__, f"(N, {CHANNELS}, *spatial)"
    with pytest.raises(GwdetTypeError, match=re.escape(
            f"{owner}: expected a torch.Tensor input of shape {shape}, got 64 (int); pass a tensor of shape {shape}")):
        layer(64)
    with pytest.raises(GwdetTypeError, match=re.escape(
            f"{owner}: expected a torch.Tensor input of shape {shape}, got a numpy.ndarray of shape "
            f"[4, {CHANNELS}, 3, 3] (float32); convert it with torch.from_numpy(x)")):
        layer(x.numpy())
    with pytest.raises(GwdetTypeError, match=re.escape(
            f"{owner}: expected a torch.Tensor input of shape {shape}, got a list of 4 tensors; join them into one "
            f"tensor of shape {shape} with torch.cat(x)")):
        layer([x] * 4)
    assert torch.jit.script(layer)(x).shape == x.shape  # the check is left out of the scripted graph


# a BGN state with running_var -1 loaded through the layer's own load_state_dict gave NaN for every output, a BW state
# with an all-zero running_whitening 0 for every output, without a word
@pytest.mark.parametrize("layer_class", LAYER_CLASSES, ids=lambda cls: cls.__name__)
def test_running_statistics_no_training_computes_are_refused_at_load(layer_class):
    layer = layer_class(CHANNELS)
    state = layer.state_dict()
    damaged = {name: value for name, value in state.items() if name.startswith("running_")}
    if not damaged:
        pytest.skip(f"{layer_class.__name__} keeps no running statistics")
    for name, value in damaged.items():
        bad = dict(state)
        bad[name] = torch.full_like(value, -1.0) if name == "running_var" else (
            torch.zeros_like(value) if name == "running_whitening" else torch.full_like(value, float("nan")))
        with pytest.raises(RuntimeError, match=rf"{layer_class.__name__}: the state's {name} holds .*, which no "
                                               r"training computes"):
            layer_class(CHANNELS).load_state_dict(bad)
    layer_class(CHANNELS).load_state_dict(state)  # a layer's own state loads


# group_whitening_relative_cost((0, 16, 4, 4), 4): a raw ZeroDivisionError (both costs 0)
def test_the_relative_cost_of_an_input_without_values_is_refused():
    from gwdet.layers.cost import group_whitening_relative_cost

    with pytest.raises(GwdetValueError, match=re.escape("group_whitening_relative_cost: the input of shape [0, 16, 4, 4] "
                                                        "holds no values, so neither GW nor the convolution costs "
                                                        "anything and their ratio is undefined")):
        group_whitening_relative_cost((0, 16, 4, 4), 4)
    assert group_whitening_relative_cost((2, 16, 4, 4), 4) > 0
