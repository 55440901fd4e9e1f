"""Norm layers that carry their settings in their state dict, and refuse a state of other settings.

Layers of other settings (a GW layer of 4 groups and one of 8) can have parameters of the same
shapes, so a state would load into the wrong function without a word. Every gwdet norm layer (a
:class:`SettingsInState`) writes ``num_channels``, its :attr:`~SettingsInState.HYPER_PARAMETERS`
and ``affine`` under torch's extra-state key ``<prefix>_extra_state`` and compares them on loading:
whatever loads the state (``load_state_dict``, strict or not, detectron2's checkpointer,
``torch.hub``) gets an error naming the layer, each differing setting and both values.

Format: a ``uint8`` tensor of :data:`SETTINGS_BYTES` bytes holding the UTF-8 JSON object
``{"layer": class name, setting: value, ...}``, padded with zero bytes: fvcore's checkpointer
accepts only tensors and arrays, and drops values whose shape differs from the model's.

A state without the key (e.g. a scripted or traced copy's) loads without a comparison, and strict
loading does not report the key missing; gwdet's checkpointer compares such a state with the
settings its checkpoints record beside the weights (:mod:`gwdet.checkpoint.compatibility`). A torch
batch norm's state (one holding ``num_batches_tracked``) given to a layer's own ``load_state_dict``
with ``strict=True`` is refused, naming it and what to do with it, in place of torch's bare
unexpected key.
"""
import functools
import json
import math
import sys
import warnings
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize
from torch.nn.utils.parametrize import type_before_parametrizations

from gwdet.errors import GwdetAttributeError, GwdetError, GwdetTypeError, GwdetValueError

from .common import check_int_at_least, check_unit_interval, largest_divisor_at_most, running_statistics_problem

# torch's suffix for a module's extra state in a state dict (torch.nn.modules.module)
EXTRA_STATE_KEY = "_extra_state"
# the length of the recorded settings (the same for every layer, see the module docstring)
SETTINGS_BYTES = 512
# where a user changes the settings of gwdet's layers, named in the refusal
_WHERE_SET = ("in a yacs config MODEL.GW.*, MODEL.BW.*, MODEL.BGN.*; in Python the arguments of "
              "gwdet.norm or of the layer")


# what a refusal of a setting that cannot be recorded says to do with it
_LEAVE_OUT = "or leave it out of HYPER_PARAMETERS if it does not change what the layer computes"


def _json_number(value: Any) -> Any:
    """``json.dumps``'s ``default``: a numpy number as the Python number it holds; anything else
    JSON cannot hold is refused as ``json`` refuses it (``TypeError``)."""
    if isinstance(value, np.generic) and not isinstance(value, (np.str_, np.bytes_, np.void)):
        return value.item()
    raise GwdetTypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _as_json(value: Any) -> str:
    return json.dumps(value, default=_json_number)


def _shortened(text: str) -> str:
    """``text`` as a message shows it: whole up to 60 characters, else its start and end."""
    return text if len(text) <= 60 else f"{text[:40]}...{text[-12:]}"


def settings_json(layer: str, settings: Dict[str, Any]) -> bytes:
    """The UTF-8 JSON object ``{"layer": layer, setting: value, ...}`` that records ``settings`` of
    the layer class ``layer`` (numpy numbers as Python numbers). A value JSON cannot hold, or
    settings longer than :data:`SETTINGS_BYTES`, are refused naming what takes the bytes (the
    longest setting, or the class name where that is longer) and what to do."""
    for name, value in settings.items():
        try:
            _as_json(value)
        except (TypeError, ValueError) as error:  # another type, a dict key of another type, a circular list
            raise GwdetValueError(
                f"{layer}: its setting {name}={value!r} ({type(value).__name__}) cannot be recorded in the layer's "
                f"state, which holds its settings as JSON ({error}): give {name} a number, string, True/False, None, "
                f"or a list or dict of them (e.g. str() of the value), {_LEAVE_OUT}.") from None
    data = _as_json({"layer": layer, **settings}).encode("utf-8")
    if len(data) > SETTINGS_BYTES:
        name_bytes = len(_as_json(layer).encode("utf-8"))
        shown_layer = _shortened(layer)
        longest = max(settings, key=lambda name: len(_as_json(settings[name]).encode("utf-8")), default=None)
        value_bytes = len(_as_json(settings[longest]).encode("utf-8")) if longest is not None else 0
        if longest is None or name_bytes >= value_bytes:
            room = SETTINGS_BYTES - (len(data) - name_bytes) - 2  # the bytes a name may take, less its quotes
            fits = (f"at most {room} characters" if layer.isascii() else
                    f"at most {room} bytes as JSON, where a character other than ASCII takes 6")
            raise GwdetValueError(
                f"{shown_layer}: its settings take {len(data)} bytes as JSON, more than the {SETTINGS_BYTES} the "
                f"layer's state records them in (the class name, {len(layer)} characters, takes {name_bytes} of "
                f"them): give the class a shorter name ({fits} with these settings).")
        raise GwdetValueError(
            f"{shown_layer}: its settings take {len(data)} bytes as JSON, more than the {SETTINGS_BYTES} the layer's "
            f"state records them in ({longest}={_shortened(repr(settings[longest]))} takes {value_bytes} of them): "
            f"give {longest} a shorter value, {_LEAVE_OUT}.")
    return data


def as_recorded(settings: Dict[str, Any]) -> Dict[str, Any]:
    """``settings`` as a state records them and :func:`decode_settings` gives them back (JSON's
    values: a tuple as a list, a numpy number as a Python number); a value JSON cannot hold stays
    as it is."""
    recorded = {}
    for name, value in settings.items():
        try:
            recorded[name] = json.loads(_as_json(value))
        except (TypeError, ValueError):
            recorded[name] = value
    return recorded


def same_setting(saved: Any, present: Any) -> bool:
    """Whether two recorded values are the same: equal, NaN the same as NaN (an 'unset' mark a
    setting may use), lists and tuples and dicts element by element. It never raises: values whose
    comparison fails (tensors of several values) count as different."""
    if isinstance(saved, float) and isinstance(present, float) and math.isnan(saved) and math.isnan(present):
        return True
    if isinstance(saved, (list, tuple)) and isinstance(present, (list, tuple)):
        return len(saved) == len(present) and all(same_setting(a, b) for a, b in zip(saved, present, strict=True))
    if isinstance(saved, dict) and isinstance(present, dict):
        return saved.keys() == present.keys() and all(same_setting(saved[key], present[key]) for key in saved)
    try:
        return bool(saved == present)
    except (RuntimeError, TypeError, ValueError):  # a tensor or array of several values
        return False


def encode_settings(layer: str, settings: Dict[str, Any]) -> Tensor:
    """The ``uint8`` tensor of :data:`SETTINGS_BYTES` bytes that records ``settings`` of the layer
    class ``layer`` (:func:`settings_json`, padded with zero bytes)."""
    data = settings_json(layer, settings)
    return torch.tensor(list(data) + [0] * (SETTINGS_BYTES - len(data)), dtype=torch.uint8)


def decode_settings(state: Any) -> Optional[Dict[str, Any]]:
    """The settings :func:`encode_settings` recorded in ``state`` (with ``"layer"``, the class
    name), or ``None`` when ``state`` is not such a record."""
    if isinstance(state, np.ndarray):  # a state that went through numpy (a .pkl)
        state = torch.from_numpy(state)
    if not isinstance(state, Tensor) or state.dtype != torch.uint8 or state.dim() != 1:
        return None
    try:
        settings = json.loads(state.cpu().numpy().tobytes().rstrip(b"\0").decode("utf-8"))
    except ValueError:  # not UTF-8, or not JSON
        return None
    if not isinstance(settings, dict) or not isinstance(settings.get("layer"), str):
        return None
    return settings


def cast_record(state: Any) -> str:
    """For a record that is no longer uint8 (every tensor of a state cast, e.g. ``{k: v.half()}``:
    a tensor of the record's :data:`SETTINGS_BYTES` values of another dtype), words that say so and
    how to cast instead; ``""`` otherwise."""
    if isinstance(state, np.ndarray):
        state = torch.from_numpy(state)
    if not isinstance(state, Tensor) or state.dtype == torch.uint8 or list(state.shape) != [SETTINGS_BYTES]:
        return ""
    return (f" (it was cast to {state.dtype}, as a cast of every tensor of the weights does: cast the floating-point "
            "tensors only)")


# Per layer, the setting the layer rounds to a divisor of its channels (the largest at most the request).
_DIVIDED_SETTING = {"GroupWhitening": "num_groups", "BatchGroupNorm": "num_groups", "BatchWhitening": "group_size"}
# Settings recorded but not compared: they leave the trained function as it is. ``momentum`` is how
# fast training updates the running statistics (which the state holds); ``eval_example_weight`` is
# how evaluation mixes batch and running statistics (Four Things Sec. 3.4), chosen after training;
# ``examples_per_group`` is how training groups the images of its batch (Sec. 3.4), which evaluation
# never reads, and which a fine-tuning at another batch size may change.
UNCOMPARED_SETTINGS = ("momentum", "eval_example_weight", "examples_per_group")
# those of them that only evaluation reads: a run's test settings (results.md lists them)
TEST_TIME_SETTINGS = ("eval_example_weight",)
# those of them that count examples (integers >= 1); the others are fractions in [0, 1]
_COUNTING_SETTINGS = ("examples_per_group",)


def function_settings(layer: str, settings: Dict[str, Any]) -> Dict[str, Any]:
    """The values of ``settings`` (of a ``layer`` class) that make the layer's function: a requested
    group count (or size) as the layer uses it, no ``T`` for ZCA, which does not iterate, and none of
    :data:`UNCOMPARED_SETTINGS`, and a float as the float32 number it is; two states whose function
    settings agree were trained as the same function."""
    # a float as the float32 number the layers compute with (an eps that went through a tensor is the same eps)
    function = {setting: float(np.float32(value)) if isinstance(value, float) else value
                for setting, value in settings.items() if setting not in UNCOMPARED_SETTINGS}
    key, channels = _DIVIDED_SETTING.get(layer), function.get("num_channels")
    requested = function.get(key) if key is not None else None
    if (key is not None and isinstance(channels, int) and isinstance(requested, int)
            and not isinstance(requested, bool) and channels >= 1 and requested >= 1):
        function[key] = largest_divisor_at_most(channels, requested)
    if function.get("method") == "zca":
        function.pop("T", None)
    return function


class SettingsInState(nn.Module):
    """A norm layer whose state dict records its settings (module docstring).

    A subclass names in ``HYPER_PARAMETERS`` the attributes that, besides ``num_channels`` and
    ``affine``, make the layer the function it is; gwdet's checkpoints record the same values
    beside the weights (:func:`gwdet.checkpoint.compatibility.norm_setting_names`).
    """

    HYPER_PARAMETERS = ()  # type: Tuple[str, ...]
    DERIVED = ()  # type: Tuple[str, ...]  # attributes the constructor derives from the settings (group layout)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A subclass's ``__init__``, where it is the constructor called (not a base class's called
        from a subclass's), ends with :meth:`check_recordable_settings`: a setting the state cannot
        record is refused when the layer is built, not at its first checkpoint."""
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is None:
            return

        @functools.wraps(init)
        def checked_init(self: "SettingsInState", *args: Any, **kw: Any) -> None:
            init(self, *args, **kw)
            if type(self).__init__ is checked_init:
                self.check_recordable_settings()

        cls.__init__ = checked_init  # type: ignore[method-assign,assignment]

    def layer_kind(self) -> str:
        """The layer's class name, which its state records and its messages give: the class it was
        built as, also behind the subclass ``torch.nn.utils.parametrize`` makes of a parametrized
        layer (``ParametrizedGroupWhitening``)."""
        return type_before_parametrizations(self).__name__

    def check_recordable_settings(self) -> None:
        """Refuse a layer whose settings (:meth:`settings`) its state cannot record: a setting named
        in ``HYPER_PARAMETERS`` that the layer does not have, a value JSON cannot hold, or settings
        longer than :data:`SETTINGS_BYTES` (:func:`settings_json`)."""
        kind = self.layer_kind()
        missing = [name for name in self.setting_names() if not hasattr(self, name)]
        if missing:
            raise GwdetAttributeError(
                f"{kind}: its settings (num_channels, HYPER_PARAMETERS, affine) name {', '.join(missing)}, which the "
                f"layer does not have once built: set {', '.join(f'self.{name}' for name in missing)} in its "
                "__init__, or leave it out of HYPER_PARAMETERS.")
        settings_json(kind, self.settings())

    def setting_names(self) -> Tuple[str, ...]:
        """The attributes the layer records in its state: ``num_channels``, its hyper-parameters
        and ``affine`` (the arguments of its constructor)."""
        return ("num_channels",) + tuple(self.HYPER_PARAMETERS) + ("affine",)

    def settings(self) -> Dict[str, Any]:
        """The values the layer records in its state (:meth:`setting_names`)."""
        return {name: getattr(self, name) for name in self.setting_names()}

    def __setattr__(self, name: str, value: Any) -> None:
        """A recorded setting is assigned once, by the constructor that checks it. Afterwards
        :data:`UNCOMPARED_SETTINGS` (how training updates running statistics and groups examples,
        how evaluation mixes them) may change, checked as on construction (a fraction in [0, 1], a
        count of examples >= 1); any other setting is refused: the
        layer derived its group layout and buffers from it, and would record the new value while
        computing with the old one. The refusal names the constructor call of a layer with the new
        value, or, for a value the constructor refuses too, its reason (:meth:`_constructor_refusal`)."""
        if name in self.__dict__ and name in self.DERIVED:
            raise GwdetAttributeError(
                f"{self.layer_kind()}: {name} is derived from the settings when the layer is built (it is "
                f"{getattr(self, name)!r}) and cannot be changed; build a new layer with the settings you want.")
        if name in self.__dict__ and name in self.setting_names():
            owner = self.layer_kind()
            if _unchanged(getattr(self, name), value):
                return  # the value it has: nothing changes
            if name not in UNCOMPARED_SETTINGS:
                fixed = (f"{owner}: {name} is set when the layer is built and cannot be changed afterwards (the layer "
                         f"computes with {getattr(self, name)!r})")
                proposed = {setting: (value if setting == name else current)
                            for setting, current in self.settings().items()}
                refusal = self._constructor_refusal(proposed)
                if refusal is not None:
                    template = ", ".join(f"{setting}={'...' if setting == name else repr(current)}"
                                         for setting, current in proposed.items())
                    alone = refusal.startswith((f"{name} ", f"{name}="))  # else a check of several settings
                    raise GwdetAttributeError(
                        f"{fixed}, and {owner}'s constructor refuses {name}={value!r} too"
                        f"{'' if alone else ' with the other settings the layer has'}: {refusal.rstrip('.')}. To "
                        f"compute with another {name}, build a new layer: {owner}({template}) with values it accepts")
                arguments = ", ".join(f"{setting}={current!r}" for setting, current in proposed.items())
                raise GwdetAttributeError(f"{fixed}; build a new layer: {owner}({arguments})")
            if name in _COUNTING_SETTINGS:
                check_int_at_least(owner, name, value, 1)
                value = int(value)
            else:
                check_unit_interval(owner, name, value)
                value = float(value)
        if name in ("weight", "bias") or name in self.__dict__.get("_buffers", {}):
            self._check_tensor(name, value)
        super().__setattr__(name, value)

    def _constructor_refusal(self, settings: Dict[str, Any]) -> Optional[str]:
        """The refusal the layer's constructor gives for ``settings`` (its keyword arguments), without
        the layer's name before it; ``None`` when it builds a layer of them, or when it does not take
        them as keywords (a subclass's constructor of other arguments). It builds that layer on the
        meta device, which holds no values, so its checks are the constructor's own."""
        kind = type_before_parametrizations(self)
        try:
            with warnings.catch_warnings(), torch.device("meta"):
                warnings.simplefilter("ignore")
                kind(**settings)
        except GwdetError as error:
            message, named = str(error), f"{kind.__name__}: "
            return message[len(named):] if message.startswith(named) else message
        except Exception:  # a constructor that takes other arguments: the settings cannot be tried
            return None
        return None

    def register_parameter(self, name: str, param: Optional[nn.Parameter]) -> None:
        """torch's registration, with the check of :meth:`_check_tensor` for ``weight`` and ``bias``."""
        if name in ("weight", "bias"):
            self._check_tensor(name, param)
        super().register_parameter(name, param)

    def register_buffer(self, name: str, tensor: Optional[Tensor], persistent: bool = True) -> None:
        """torch's registration, with the check of :meth:`_check_tensor` for a buffer the layer has."""
        if name in self.__dict__.get("_buffers", {}):
            self._check_tensor(name, tensor)
        super().register_buffer(name, tensor, persistent)

    def _check_tensor(self, name: str, value: Any) -> None:
        """Once the layer is built, refuse a ``weight`` or ``bias`` that disagrees with ``affine`` (a
        tensor without it, ``None`` with it: the layer would compute with or without its affine while
        its state records the other), an affine tensor that is not one value per channel, and a
        running statistic replaced by ``None`` or by a tensor of another shape, of an integer type or
        requiring grad (training updates it in place)."""
        if "affine" not in self.__dict__:
            return  # the constructor registers them
        owner = self.layer_kind()
        if name in ("weight", "bias"):
            if value is None and self.affine:
                raise GwdetAttributeError(
                    f"{owner}: {name} cannot be set to None on a layer built with affine=True: the layer would "
                    f"compute without its affine while its state records affine=True; build the layer without "
                    f"it: {owner}(..., affine=False)")
            if value is not None and not self.affine:
                raise GwdetAttributeError(
                    f"{owner}: the layer was built with affine=False, so it takes no {name} (got a "
                    f"{_described(value)}): it would compute with it while its state records affine=False, and a "
                    f"layer built from that state would leave it out; build the layer with one: "
                    f"{owner}(..., affine=True)")
            if value is not None:
                channels: int = self.num_channels  # type: ignore[assignment]
                self._check_shape(name, value, [channels], "one value per channel")
            return
        current = self._buffers.get(name)
        if not isinstance(current, Tensor):
            return
        if value is None:
            raise GwdetAttributeError(
                f"{owner}: the running statistic {name} cannot be set to None: training updates it in place and "
                f"evaluation normalizes with it (the layer has no mode without running statistics); reset it "
                f"with layer.reset_running_stats(), or assign a tensor of shape {list(current.shape)}")
        self._check_shape(name, value, list(current.shape), "the running statistic the layer was built with")
        if value.requires_grad:
            raise GwdetValueError(
                f"{owner}: the running statistic {name} must not require grad (got a tensor with "
                f"requires_grad=True): training updates it in place, which autograd refuses on a leaf that "
                f"requires grad; assign {name}.detach() instead")

    def _check_shape(self, name: str, value: Any, shape: List[int], what: str) -> None:
        owner = self.layer_kind()
        if not isinstance(value, Tensor) or list(value.shape) != shape or not value.is_floating_point():
            raise GwdetValueError(
                f"{owner}: {name} must be a floating-point tensor of shape {shape} ({what}, num_channels="
                f"{self.num_channels}), got a {_described(value)}; assign one of that shape, or build a layer "
                "of the channels you want")

    def __delattr__(self, name: str) -> None:
        """A recorded setting or an attribute derived from them is never deleted (assigned again, it
        would get past the check of :meth:`__setattr__`), nor, once the layer is built, its ``weight``,
        ``bias`` or a running statistic: the layer computes with them and its state records them.
        ``torch.nn.utils.parametrize.register_parametrization`` deletes the tensor it puts behind a
        parametrization, which stands in for it (computed from the original on each access)."""
        if name in self.setting_names() or name in self.DERIVED:
            raise GwdetAttributeError(f"{self.layer_kind()}: {name} is set when the layer is built and cannot be "
                                      "deleted; build a new layer with the settings you want.")
        parametrizing = sys._getframe(1).f_globals.get("__name__") == parametrize.__name__
        if ("affine" in self.__dict__ and not parametrizing
                and (name in ("weight", "bias") or name in self.__dict__.get("_buffers", {}))):
            raise GwdetAttributeError(
                f"{self.layer_kind()}: {name} cannot be deleted from a built layer: the layer computes with it and "
                "its state records it; build a new layer with the settings you want"
                + (" (affine=False: no weight and bias)." if name in ("weight", "bias") else "."))
        super().__delattr__(name)

    def extra_repr(self) -> str:
        """The channels, each setting (a divided one followed by the value the layer uses:
        ``effective_num_groups``, ``effective_group_size``), then ``affine``."""
        parts = [str(self.num_channels)]
        for name in self.HYPER_PARAMETERS:
            parts.append(f"{name}={getattr(self, name)!r}")
            if hasattr(self, f"effective_{name}"):
                parts.append(f"effective_{name}={getattr(self, f'effective_{name}')!r}")
        return ", ".join([*parts, f"affine={self.affine!r}"])

    def get_extra_state(self) -> Tensor:
        return encode_settings(self.layer_kind(), self.settings())

    def set_extra_state(self, state: Any) -> None:
        """Accept the settings a state recorded when they are this layer's; raise ``ValueError``
        naming each differing setting otherwise (:meth:`settings_mismatch`)."""
        problem = self.settings_mismatch(state)
        if problem is not None:
            raise GwdetValueError(problem)

    def settings_mismatch(self, state: Any, name: str = "",
                          tensors: Optional[Mapping[str, Any]] = None) -> Optional[str]:
        """``None`` when ``state`` (a state dict's ``_extra_state`` value) records this layer's
        settings; else the refusal, naming the layer (``name`` in its model, when known), each
        differing setting with both values, and the fix. Loading the weights anyway (without
        ``_extra_state``) is offered only where the saved settings give the layer's tensors this
        layer's names and shapes: those of a layer built with them on the meta device, or, where the
        constructor does not take them by their names, ``tensors`` (the state dict's entries of this
        layer, by their names in it; when not given either, it is offered for tensors of this layer's
        names and shapes). Where they differ (``num_channels``, ``affine``, a group size), the
        refusal says so and that the state cannot load into this layer."""
        kind = self.layer_kind()
        layer = f"{name} ({kind})" if name else kind
        key = f"'{name}.{EXTRA_STATE_KEY}'" if name else f"'{EXTRA_STATE_KEY}'"
        if isinstance(state, Tensor) and state.is_meta:
            return (f"{layer}: the state's {key} is on the meta device (a state read with map_location='meta'), which "
                    "holds no values, so the settings it records cannot be checked against the layer; read the state "
                    "onto the CPU (torch.load(..., map_location='cpu')): a model built on the meta device loads it "
                    "with load_state_dict(..., assign=True) all the same")
        saved = decode_settings(state)
        if saved is None:
            return (f"{layer}: the state's {key} is not the settings a gwdet norm layer records (a uint8 "
                    f"tensor of {SETTINGS_BYTES} bytes of JSON){cast_record(state)}, so the state cannot be checked "
                    "against the layer; load an unchanged state dict of this model")
        if saved["layer"] != kind:
            return (f"{layer}: the state is of a {saved['layer']} layer, not of a {kind}; load weights trained "
                    f"with the norm this model has at that place, or, where the two compute the same function (a "
                    f"subclass that changes no computation), delete {key} from the state dict")
        own = self.settings()
        recorded = as_recorded(own)  # as the layer's own state gives them back: a tuple as a list
        saved_function, own_function = function_settings(kind, saved), function_settings(kind, recorded)
        differing = [(setting, saved[setting], value) for setting, value in own.items()
                     if setting in saved and not same_setting(saved[setting], recorded[setting])
                     and not same_setting(saved_function.get(setting), own_function.get(setting))]
        if not differing:
            return None
        found = (f"{layer} was saved with {_listed([(s, old) for s, old, _ in differing])}, but this layer has "
                 f"{_listed([(s, new) for s, _, new in differing])}: the weights were trained as another function. "
                 f"Build the layer with the saved values ({_WHERE_SET})")
        built = self._saved_layer_tensors(saved, tensors)
        tensors = built if built is not None else tensors
        shapes = _tensor_difference(self, tensors) if tensors is not None else None
        if shapes is not None:
            return (f"{found}: the state's tensors differ from this layer's too ({shapes}), so the state cannot be "
                    "loaded into this layer")
        anyway = "" if tensors is not None else ", if its tensors have this layer's names and shapes"
        return f"{found}, or, to load the weights into this layer anyway{anyway}, delete {key} from the state dict"

    def _saved_layer_tensors(self, saved: Dict[str, Any],
                             tensors: Optional[Mapping[str, Any]] = None) -> Optional[Dict[str, Any]]:
        """The state tensors of a layer of this kind built with the recorded settings ``saved`` on
        the meta device (shapes only), named as the state names them: a tensor pruned with
        ``torch.nn.utils.prune`` as its ``<name>_orig`` and ``<name>_mask`` (:func:`_pruned_names`:
        those the state ``tensors`` hold so, or, without them, those pruned in this layer). ``None``
        where the constructor does not take the settings by their names, or where this layer is
        parametrized (its state names its tensors otherwise)."""
        if parametrize.is_parametrized(self):
            return None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                built = type_before_parametrizations(self)(
                    **{setting: saved[setting] for setting in self.setting_names() if setting in saved},
                    device="meta")
            state = {key: value for key, value in built.state_dict().items() if not key.endswith(EXTRA_STATE_KEY)}
        except Exception:  # a subclass whose constructor takes other arguments: the shapes are unknown
            return None
        pruned = _pruned_names(self, state, tensors)
        named: Dict[str, Any] = {}
        for key, value in state.items():
            if key in pruned:  # torch's pruning keeps the tensor as <name>_orig and its mask as <name>_mask
                named[f"{key}_orig"] = value
                named[f"{key}_mask"] = value
            else:
                named[key] = value
        return named

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False):
        """torch's ``load_state_dict``; with ``strict=True`` a torch batch norm's state
        (:func:`_batch_norm_state_problem`) is refused first, naming it and how to load it, where torch
        would name its ``num_batches_tracked`` an unexpected key (with ``strict=False`` it loads as
        torch loads it, that key reported unexpected)."""
        problem = _batch_norm_state_problem(self, state_dict) if strict and isinstance(state_dict, Mapping) else None
        if problem is not None:
            raise GwdetValueError(problem)
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def _load_from_state_dict(self, state_dict: Dict[str, Any], prefix: str, local_metadata: Dict[str, Any],
                              strict: bool, missing_keys: List[str], unexpected_keys: List[str],
                              error_msgs: List[str]) -> None:
        """torch's loading, after the recorded settings are compared with the layer's: differing
        ones add the refusal to ``error_msgs`` (``load_state_dict`` raises them all, as it does
        size mismatches) and load nothing into the layer; a state without the key loads unchecked."""
        key = prefix + EXTRA_STATE_KEY
        if key in state_dict:
            tensors = {name[len(prefix):]: value for name, value in state_dict.items()
                       if isinstance(name, str) and name.startswith(prefix) and name != key}
            problem = self.settings_mismatch(state_dict[key], prefix[:-1], tensors)
            if problem is not None:
                error_msgs.append(problem)
                return
        problem = _running_whitening_shape_problem(self, state_dict, prefix)
        if problem is None:
            problem = _running_statistics_problem(state_dict, prefix, type(self).__name__)
        if problem is not None:
            error_msgs.append(problem)
            return
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
        if key not in state_dict and key in missing_keys:
            missing_keys.remove(key)


def _batch_norm_state_problem(layer: SettingsInState, state_dict: Mapping[str, Any]) -> Optional[str]:
    """Why ``state_dict`` cannot load strictly into ``layer``: it is a torch batch norm's (it holds
    ``num_batches_tracked``, which no gwdet layer keeps, and no record of a gwdet layer's
    settings); the refusal says how to load its statistics and affine, where the layer has a batch
    norm's buffers (:class:`~.batch_group_norm.BatchGroupNorm`), or which layer takes the state.
    ``None`` for any other state."""
    tracked = "num_batches_tracked"
    if tracked not in state_dict or EXTRA_STATE_KEY in state_dict:
        return None
    kind = name = layer.layer_kind()
    channels: int = layer.num_channels  # type: ignore[assignment]
    found = (f"{name}: the state is a torch BatchNorm's, not a {kind}'s: it holds {tracked!r}, which a {kind} does "
             "not keep, and no record of a gwdet layer's settings; nothing was loaded into the layer.")
    build = f"build a torch.nn.BatchNorm2d({channels}) to load the state as it is"
    if {"running_mean", "running_var"} <= set(layer._buffers):
        alpha, eps = getattr(layer, "eval_example_weight", None), getattr(layer, "eps", None)
        return (f"{found} To load its running statistics and affine into this layer, delete {tracked!r} from the "
                f"state dict: in evaluation with eval_example_weight=0 (this layer has {alpha!r}) and that BatchNorm's "
                f"eps (this layer has {eps!r}) the layer then computes what the BatchNorm did, while training "
                f"normalizes over the layer's own groups. Or {build}.")
    own = ", ".join(buffer for buffer in layer._buffers if buffer.startswith("running_"))
    kept = own or "none (it normalizes each input by the input's own statistics)"
    return (f"{found} A {kind}'s running statistics are {kept}, not a BatchNorm's running_mean and running_var: "
            f"load the state of a {kind}, or {build}.")


def _pruned_names(layer: SettingsInState, names: Mapping[str, Any],
                  tensors: Optional[Mapping[str, Any]]) -> List[str]:
    """Those of ``names`` (a layer's tensors, unpruned) that ``torch.nn.utils.prune`` pruned: in the
    state ``tensors`` where given, else in ``layer``'s own state: it holds ``<name>_orig`` and
    ``<name>_mask`` in place of ``<name>``."""
    held = tensors if tensors is not None else layer.state_dict(keep_vars=True)
    return [name for name in names if name not in held and f"{name}_orig" in held and f"{name}_mask" in held]


def _tensor_difference(layer: SettingsInState, tensors: Mapping[str, Any]) -> Optional[str]:
    """How the state's ``tensors`` (by their names in ``layer``'s state dict, without its
    ``_extra_state``) differ from ``layer``'s own in names or shapes: the names one has and the
    other lacks, or a shape each (``weight: [32] in the state, [16] in this layer``); ``None`` when
    they agree."""
    own = {name: value for name, value in layer.state_dict(keep_vars=True).items()
           if not name.endswith(EXTRA_STATE_KEY)}
    lacking = [name for name in own if name not in tensors]
    extra = [name for name in tensors if name not in own]
    shapes = [f"{name}: {list(tensors[name].shape)} in the state, {list(own[name].shape)} in this layer"
              for name in own if name in tensors and isinstance(tensors[name], Tensor)
              and isinstance(own[name], Tensor) and tensors[name].shape != own[name].shape]
    parts = shapes + ([f"the state has no {', '.join(lacking)}, which this layer has"] if lacking else []) + (
        [f"the state has {', '.join(extra)}, which this layer has not"] if extra else [])
    return "; ".join(parts) if parts else None


def _running_whitening_shape_problem(layer: SettingsInState, state_dict: Dict[str, Any],
                                     prefix: str) -> Optional[str]:
    """Why the state's ``running_whitening`` (under ``prefix``) cannot load into ``layer``: a shape
    other than the layer's ``[groups, k, k]`` (one ``k x k`` whitening matrix per group of ``k``
    channels), told as the layer it is the statistics of; ``None`` when the shapes agree, or when
    the layer or the state has no such tensor."""
    value, own = state_dict.get(prefix + "running_whitening"), layer._buffers.get("running_whitening")
    if not isinstance(value, Tensor) or not isinstance(own, Tensor) or value.shape == own.shape:
        return None
    kind = layer.layer_kind()
    name = prefix[:-1] or kind
    size_name = "group_size" if hasattr(layer, "group_size") else None  # BW's: groups of that many channels
    if own.dim() != 3 or own.shape[1] != own.shape[2] or size_name is None:
        return (f"{name}: the state's running_whitening has shape {list(value.shape)}, but this layer's has shape "
                f"{list(own.shape)}; load the state of a layer built with this layer's settings")

    def layout(groups: int, size: int) -> str:
        return (f"{groups} group{'s' if groups != 1 else ''} of {size} channels: num_channels={groups * size}, "
                f"{size_name}={size}")

    channels: int = layer.num_channels  # type: ignore[assignment]
    settings = f"num_channels={channels}, {size_name}={getattr(layer, size_name)!r}"
    ours = f"this layer's has shape {list(own.shape)} ({layout(own.shape[0], own.shape[1])})"
    damaged = (f" The state's own record says {settings}, as this layer has, so its running_whitening does not match "
               "its record: the file may be damaged, or the tensor taken from another layer."
               if decode_settings(state_dict.get(prefix + EXTRA_STATE_KEY)) is not None else "")
    found = f"{name}: the state's running_whitening has shape {list(value.shape)}"
    if value.dim() == 3 and value.shape[1] == value.shape[2] and value.shape[0] >= 1 and value.shape[1] >= 1:
        groups, size = int(value.shape[0]), int(value.shape[1])
        return (f"{found} (groups x group size x group size): the running statistics of a {kind} of "
                f"{layout(groups, size)}, while {ours}.{damaged} Build the layer with num_channels={groups * size}, "
                f"{size_name}={size} to use these statistics, or load the state of a layer of {settings}")
    return (f"{found}, which is not the groups x group size x group size of a {kind}'s whitening matrices, while "
            f"{ours}.{damaged} Load the state of a layer of {settings}{'' if damaged else ' (the file may be damaged)'}")


def _running_statistics_problem(state_dict: Dict[str, Any], prefix: str, owner: str) -> Optional[str]:
    """Why the running statistics of a state (``running_mean``, ``running_var``, ``running_whitening``
    under ``prefix``) cannot load (:func:`~.common.running_statistics_problem`): a value no training
    computes (a NaN, a negative variance, a whitening matrix whose diagonal is not positive or that
    is not symmetric), or an ``inf``, which a training whose running statistic overflowed its dtype
    leaves (a float16 ``running_var``: told with the cause and how to keep it finite); ``None`` when
    they can load."""
    problem = running_statistics_problem({name: state_dict.get(prefix + name)
                                          for name in ("running_mean", "running_var", "running_whitening")})
    if problem is None:
        return None
    name, why, effect, overflow = problem
    leave = "leave the running statistics out of the state to keep the layer's own"
    if overflow is not None:
        return f"{prefix[:-1] or owner}: the state's {name} holds {why}: {effect}. {overflow}; or {leave}"
    return (f"{prefix[:-1] or owner}: the state's {name} holds {why}, which no training computes: {effect}. Load the "
            f"state of a trained layer (the file may be damaged), or {leave}")


def _unchanged(current: Any, value: Any) -> bool:
    """Whether assigning ``value`` to a setting of value ``current`` changes nothing: the same value
    and, for a bool, a bool (``1`` for ``True`` is not the flag the layer records)."""
    if isinstance(current, bool) or isinstance(value, (bool, np.bool_)):
        return type(current) is bool and isinstance(value, (bool, np.bool_)) and bool(value) == current
    if isinstance(value, (str, np.str_)) != isinstance(current, str):
        return False
    return same_setting(current, as_recorded({"value": value})["value"])


def _described(value: Any) -> str:
    """A tensor as its type, shape and dtype; anything else as its repr and type."""
    if isinstance(value, Tensor):
        return f"{type(value).__name__} of shape {list(value.shape)} ({value.dtype})"
    return f"{value!r} ({type(value).__name__})"


def _listed(values: List[Tuple[str, Any]]) -> str:
    return ", ".join(f"{setting}={value!r}" for setting, value in values)
