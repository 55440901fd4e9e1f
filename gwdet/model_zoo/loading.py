"""Reading a yacs config file the way gwdet's tools read it: detectron2's defaults, gwdet's keys,
the file with its ``_BASE_`` chain, then the command line's ``KEY VALUE`` overrides, checked.

What yacs and fvcore report in their own words (a missing ``_BASE_`` file, a key the config does
not have, a value of another type than the key's default, overrides that do not come in pairs) is
refused here before or instead, naming the file, the key and the fix (:func:`check_base_files`,
:func:`merge_problem`); so is a key given twice in one YAML mapping of the file or of a base, of
which YAML would silently keep the last (:func:`load_config_yaml`). :func:`build_config` is the one
loader of yacs configs: the train, export and analyze tools, :func:`gwdet.model_zoo.get_config` and
the study all call it.
"""
from __future__ import annotations

import ast
import codecs
import datetime
import difflib
import json
import logging
import math
import os
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from detectron2.config import CfgNode, get_cfg

from gwdet.config import add_gwdet_config, flatten_config
from gwdet.config_checks import check_gwdet_config, value_refusal
from gwdet.errors import GwdetFileNotFoundError, GwdetIsADirectoryError, GwdetValueError, did_you_mean, listed
from gwdet.layers.common import check_flag
from gwdet.model_zoo.checked_config import checked_frozen
from gwdet.model_zoo.lazy_loading import check_config_file_exists, check_override_list, is_lazy_config, load_lazy_config
from gwdet.model_zoo.model_zoo import configs_dir, get_config_file
from gwdet.norms import add_registered_config_keys, known_norm_names, norm_record, spawned_process_note
from gwdet.utils.command_line import warn_of_repeated_overrides
from gwdet.utils.run_file_names import CONFIG_NAME

logger = logging.getLogger(__name__)


def _other_encoding_problem(path: str) -> str | None:
    """For a file that is not UTF-8 but reads as text in another 8-bit encoding (a YAML config an
    editor saved in Latin-1: no NUL byte, mostly ASCII), the end of a sentence naming the first byte
    that is not UTF-8, its line and the fix; None for a binary file (a checkpoint, an export)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
        data.decode("utf-8")
    except UnicodeDecodeError as error:
        ascii_text = sum(byte in b"\t\n\r" or 32 <= byte < 127 for byte in data)
        if b"\0" in data or ascii_text < 0.9 * len(data):
            return None
        line = data[:error.start].count(b"\n") + 1
        return (f"is not UTF-8 text (byte 0x{data[error.start]:02x} at line {line}), which YAML readers take as "
                f"UTF-8 only: save it as UTF-8 (e.g. iconv -f LATIN1 -t UTF-8 {path} > OUT for a Latin-1 file), "
                "then give that file.")
    except OSError:
        return None
    return None


def build_config(config_file: str | os.PathLike, opts: list[str] | None = None) -> CfgNode:
    """detectron2's defaults + gwdet's keys + ``config_file`` + ``KEY VALUE`` overrides, checked, frozen;
    a key the overrides set more than once is warned of, naming the value used (the last)."""
    if not config_file:
        raise GwdetValueError("No config given: pass --config configs/<file>.yaml (see configs/).")
    config_file = os.fspath(config_file)
    check_override_list("build_config", opts)
    if os.path.isdir(config_file):
        raise GwdetIsADirectoryError(f"Config file {config_file!r} is a folder: give a config file in it "
                                     "(configs/ holds gwdet's).")
    check_config_file_exists(config_file)
    warn_of_repeated_overrides(opts or [])
    name = os.path.basename(config_file)
    if name.startswith("results") and name.endswith((".json", ".md")):  # a run's results (or those it set aside)
        beside = os.path.join(os.path.dirname(config_file), CONFIG_NAME)
        where = f"the run's config is {beside}" if os.path.isfile(beside) else f"a run keeps its config as {CONFIG_NAME}"
        raise GwdetValueError(f"Config file {config_file!r} is a run's results ({name}), not a config: {where}. Give "
                              "that file (or the config the run was started with).")
    if is_lazy_config(config_file):
        kind = "(.py)" if config_file.endswith(".py") else "(a LazyConfig run's saved config: model, train, dataloader)"
        raise GwdetValueError(
            f"Config file {config_file!r} is a LazyConfig {kind}, not a yacs config, which is what this step "
            "reads. tools/train_net.py (here or through --launcher slurm), tools/analyze_model.py and "
            "tools/deploy/export_model.py take LazyConfigs, with key=value overrides; in Python, load one with "
            "gwdet.model_zoo.lazy_loading.load_lazy_config.")
    try:
        with open(config_file, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError:
        with open(config_file, "rb") as f:
            utf16 = f.read(2) in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)
        if utf16:
            raise GwdetValueError(f"Config file {config_file!r} is UTF-16 text (as PowerShell's > writes it), which "
                                  "YAML readers take as UTF-8 only: save it as UTF-8.") from None
        encoding = _other_encoding_problem(config_file)
        if encoding:
            raise GwdetValueError(f"Config file {config_file!r} {encoding}") from None
        raise GwdetValueError(f"Config file {config_file!r} is not text (a checkpoint or an export?): give a yacs .yaml "
                              "config (see configs/) or a LazyConfig .py.") from None
    try:
        content = load_config_yaml(config_file, text) if text.strip() else None
    except yaml.YAMLError as error:
        raise GwdetValueError(f"Config file {config_file!r} is not valid YAML: {error}") from None
    if not isinstance(content, dict):
        raise GwdetValueError(f"Config file {config_file!r} holds no KEY: VALUE mapping (is it empty?). "
                              "Start from one of the files under configs/.")
    check_base_files(config_file, content)
    warn_of_bases_overridden_by_their_own_bases(config_file, content)
    cfg = add_registered_config_keys(add_gwdet_config(get_cfg()))
    try:
        cfg.merge_from_file(config_file)
    except (KeyError, AssertionError, ValueError) as error:  # yacs: unknown key, wrong type
        raise GwdetValueError(
            f"Config file {config_file!r} (or a _BASE_ it names): {merge_problem(cfg, error)}") from None
    padded = next((key for key in list(opts or [])[::2] if isinstance(key, str) and key != key.strip()), None)
    if padded is not None:
        raise GwdetValueError(f"The KEY VALUE overrides: the key {padded!r} has spaces at an end, which no config key "
                              f"has: write {padded.strip()}.")
    joined = next((key for key in list(opts or [])[::2] if isinstance(key, str) and " " in key.strip()), None)
    if joined is not None:  # yacs would pair it with the next word as its value
        raise GwdetValueError(
            f"The KEY VALUE overrides: {joined!r} is one argument holding a key and its value: give them as two, "
            f"{joined.strip().split()[0]} {' '.join(joined.strip().split()[1:])} (without quotes around both).")
    lazy_style = next((key for key in list(opts or [])[::2] if isinstance(key, str) and "=" in key), None)
    if lazy_style is not None:  # yacs would take it for a key, or pair it with the next word
        raise GwdetValueError(
            f"The KEY VALUE overrides: {lazy_style!r} is key=value, which a LazyConfig (.py) takes; a yacs config "
            "takes KEY VALUE pairs, e.g. SOLVER.MAX_ITER 100 OUTPUT_DIR output/run.")
    try:
        cfg.merge_from_list(opts or [])
    except (KeyError, AssertionError, ValueError) as error:
        raise GwdetValueError(f"The KEY VALUE overrides: {merge_problem(cfg, error)}") from None
    if isinstance(cfg.OUTPUT_DIR, str) and cfg.OUTPUT_DIR.startswith("~"):  # a quoted ~ reaches the config as it is
        cfg.OUTPUT_DIR = os.path.expanduser(cfg.OUTPUT_DIR)
    check_gwdet_config(cfg)
    return checked_frozen(cfg)


_UNKNOWN_KEY = re.compile(r"Non-existent (?:config )?key: (.*)")
_WRONG_TYPE = re.compile(r"Type mismatch \(<class '([\w.]+)'> vs\. <class '([\w.]+)'>\) with values "
                         r"\((.*) vs\. (.*)\) for config key: (\S+)$", re.DOTALL)


def _whole_number_fix(key: str, value: str, default: str) -> str:
    """The fix for the float ``value`` (as yacs' error shows it) of the int key ``key`` (``default``:
    its value before)."""
    try:
        number = float(value)
    except ValueError:
        return ""
    if not math.isfinite(number):
        return f" Give a whole number, e.g. {key} {default}."
    if not number.is_integer():
        return f" Give a whole number, e.g. {key} {math.floor(number)} or {key} {math.ceil(number)}."
    return f" Write it as a whole number: {key} {int(number)}."


def _quoted_number_fix(cfg: CfgNode, key: str, kind: str, value: str, default: str) -> str:
    """The fix for the text ``value`` (as yacs' error shows it) of the key ``key`` of numbers of type
    ``kind`` (``int`` or ``float``; ``default``: its value before): a number in quotes (``KEY "'16'"``),
    written without them (or refused as that number is); a NaN for a float key, refused as the number
    NaN is (its range), or told to give a finite number ("" for other text)."""
    text = value.strip()
    if kind == "float" and text.lstrip("+-").lower() == "nan":
        refusal = value_refusal(cfg, key, math.nan)
        return (f" yacs reads nan as text, and the number NaN is refused too: {refusal}" if refusal is not None else
                f" yacs reads nan as text: give a finite number, e.g. {key} {default}.")
    try:
        number = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return ""
    if isinstance(number, bool) or not isinstance(number, (int, float)):
        return ""
    if kind == "int" and isinstance(number, float):
        return _whole_number_fix(key, text, default)
    written = f"{text}.0" if kind == "float" and isinstance(number, int) else text
    refusal = value_refusal(cfg, key, float(number) if kind == "float" else number)
    return (f" Write it without quotes: {key} {written}." if refusal is None else
            f" Written without quotes ({key} {written}), it is refused too: {refusal}")


def merge_problem(cfg: CfgNode, error: BaseException) -> str:
    """What yacs' error when merging into ``cfg`` means, with the fix: a key the config does not
    have (and the close ones it has), a value of another type than the key's default, a section
    given a value, overrides that do not come in pairs."""
    text = str(error.args[0]) if error.args else str(error)
    unknown = _UNKNOWN_KEY.search(text)
    if unknown:
        key = unknown.group(1)
        if not key.strip():
            return (f"a key is empty ({key!r}; a shell variable that is not set, as in \"$KEY\" VALUE?): give the key "
                    "of each value, e.g. MODEL.GW.NUM_GROUPS 8.")
        spaced = next((part for part in key.split(".") if part != part.strip()), None)
        if spaced is not None:  # a quoted key in a file ("NUM_GROUPS ": 8), which yacs reads as it is
            return (f"{key!r} is not a key of detectron2's or gwdet's config: its part {spaced!r} has spaces at an "
                    f"end, which no key has. Write it as {spaced.strip()!r}.")
        if key.upper() == "_BASE_":  # the loader reads the base config's key in upper case only
            return (f"{key} is not a key of detectron2's or gwdet's config: a config names the config it extends as "
                    f"_BASE_, in upper case (detectron2's loader reads no other spelling): write _BASE_: \"...\".")
        if key != key.upper():  # a key spelled in lower case (``model.gw.num_groups``)
            names = _config_names(cfg)
            close = [key.upper()] if key.upper() in names else difflib.get_close_matches(
                key.upper(), sorted(names), n=3, cutoff=0.8)
            if close:
                return (f"{key} is not a key of detectron2's or gwdet's config, whose keys are upper-case: did you "
                        f"mean {' or '.join(close)}?")
        close = difflib.get_close_matches(key, list(flatten_config(cfg)), n=3, cutoff=0.8)
        if key in close:  # detectron2 renamed it while upgrading a file of an older VERSION
            return (f"{key} is a key of detectron2's current config format, but a file says an older VERSION, so "
                    "detectron2 renamed its keys while upgrading it and this one no longer fits: give the file (and its "
                    "_BASE_) the VERSION of the format they are written in (VERSION: 2 for detectron2's current "
                    "configs), or remove its VERSION line.")
        per_norm = _norm_value_of_a_part(cfg, key)
        if per_norm:
            return per_norm
        last = key.split(".")[-1]  # a key or section at another level (GW: at the top, SOLVER: under MODEL:)
        names = set(flatten_config(cfg))
        names |= {name.rsplit(".", depth)[0] for name in names for depth in range(1, name.count(".") + 1)}
        placed = sorted(name for name in names if (name == last or name.endswith("." + last)) and name != key)
        close = [*placed[:2], *(name for name in close if name not in placed)][:3]
        return (f"{key} is not a key of detectron2's or gwdet's config.{did_you_mean(close, quote=False)} (A project's own keys are added "
                "by its add_*_config function before the config is read; a norm registered with gwdet.register_norm "
                "adds its config_keys in the script that registers it: read a config of such a norm, a run's "
                "config.yaml say, with that script, e.g. its gwdet.cluster.training.run() with --eval-only.)"
                + spawned_process_note())
    wrong = _WRONG_TYPE.search(text)
    if wrong:
        expected, given, default, value, key = wrong.groups()
        if expected.endswith("CfgNode"):
            return f"{key} is a section of keys, not a value: set one of its keys (e.g. {key}.<KEY> VALUE)."
        quoted = (f" To give {value} as text, quote it for YAML as well as for the shell: {key} \"'{value}'\"."
                  if expected.endswith("str") and given.rsplit(".", 1)[-1] in ("int", "float") else "")
        if expected.endswith("str") and given.rsplit(".", 1)[-1] == "bool":
            quoted = (" YAML reads on, off, yes, no, true and false unquoted as True or False: quote the text "
                      "as 'off' in the file, or give \"\" for none where the key takes a name (NORM: \"\" is no norm).")
        sequence = expected.rsplit(".", 1)[-1] in ("tuple", "list")
        if sequence and given.rsplit(".", 1)[-1] in ("int", "float"):
            quoted = (f" A number in parentheses is that number, not a tuple: a tuple of one value is written with a "
                      f"comma, {key} \"({value},)\".")
        if sequence and given.rsplit(".", 1)[-1] == "str" and value.strip()[:1] in ("(", "["):
            listed_names = [name.strip() for name in value.strip().strip("()[]").split(",") if name.strip()]
            written = "(" + ", ".join(map(repr, listed_names)) + ("," if len(listed_names) == 1 else "") + ")"
            quoted = (f" It was read as text, since the names in it are not quoted: quote each one, "
                      f"{key} \"{written}\".")
        elif sequence and given.rsplit(".", 1)[-1] == "str":
            quoted = (f" A name alone (or in parentheses without a comma) is no tuple: a tuple of one name is "
                      f"written with a comma, {key} \"('{value.strip()}',)\".")
        if (expected.rsplit(".", 1)[-1] in ("int", "float") and given.rsplit(".", 1)[-1] == "str"
                and re.fullmatch(r"[+-]?0[0-9_]+", value.strip())):
            quoted = (f" A number written with a leading zero is read as text (Python reads no such number): write "
                      f"{key} {int(value.strip().replace('_', ''))}.")
        if (expected.endswith("float") and given.rsplit(".", 1)[-1] == "int"
                and re.fullmatch(r"[+-]?[0-9_]+", value.strip())):
            written = f"{int(value.strip().replace('_', ''))}.0"
            refusal = value_refusal(cfg, key, float(written))
            quoted = (f" Write it with a decimal point: {key} {written}." if refusal is None else
                      f" Written with a decimal point ({key} {written}), it is refused too: {refusal}")
        if expected.rsplit(".", 1)[-1] == "int" and given.rsplit(".", 1)[-1] == "float":
            quoted = _whole_number_fix(key, value, default)
        if expected.endswith("float") and value.strip().lstrip("+-").lower() in ("inf", "infinity"):
            quoted = f" yacs reads no inf; a number too large for a float is one: {key} {'-' if '-' in value else ''}1e999."
        shown = value
        if expected.rsplit(".", 1)[-1] in ("int", "float") and given.rsplit(".", 1)[-1] == "str":
            number_fix = _quoted_number_fix(cfg, key, expected.rsplit(".", 1)[-1], value, default)
            if number_fix:  # text that reads as a number: shown in quotes, as the text it is
                quoted, shown = number_fix, repr(value)
        return (f"{key} takes a value of type {expected.rsplit('.', 1)[-1]} (it is {default or repr('')} before this "
                f"value); got {shown} (a {given.rsplit('.', 1)[-1]}).{quoted}")
    if "odd length" in text:
        return f"overrides come in KEY VALUE pairs; {text.split(': ', 1)[-1].split(';')[0]} has a key without its value."
    return text


def _norm_value_of_a_part(cfg: CfgNode, key: str) -> str:
    """The words for ``key`` that sets a norm's value beside a part's NORM (``MODEL.FPN.NUM_GROUPS``
    where ``MODEL.FPN.NORM`` is ``GW``): the norm's own key, which every layer of that norm reads
    ("" when ``key`` is no such key)."""
    section, _, leaf = key.rpartition(".")
    name = flatten_config(cfg).get(f"{section}.NORM")
    if not isinstance(name, str) or name not in known_norm_names():
        return ""
    keys = {param: config_key for param, config_key in norm_record(name).config_keys.items()
            if config_key.rsplit(".", 1)[-1] == leaf}
    if not keys:
        return ""
    param, own = next(iter(keys.items()))
    return (f"{key} is not a key of detectron2's or gwdet's config: a norm's values are set per norm, not per part. "
            f"{section}.NORM is {name!r}, whose {param} is {own}, read by every {name} layer of the model. For "
            f"another value at this part only, build the model from a LazyConfig with "
            f"L(gwdet.norm)(name={name!r}, {param}=...) there (docs/usage.md).")


def _config_names(cfg: CfgNode) -> set[str]:
    """Every dotted name of ``cfg``: its keys and the sections above them (``MODEL``, ``MODEL.GW``)."""
    names: set[str] = set()
    for key in flatten_config(cfg):
        parts = key.split(".")
        names.update(".".join(parts[:end]) for end in range(1, len(parts) + 1))
    return names


class DuplicateKeyCheckingLoader(yaml.SafeLoader):
    """PyYAML's ``SafeLoader`` (what fvcore reads yacs configs with), except that a key given twice
    in one mapping raises instead of silently keeping the last value (a second ``MODEL:`` block
    would drop every key of the first): a ``ValueError`` (:class:`gwdet.errors.GwdetError`) naming
    the config file ``path`` (and the configs whose ``_BASE_`` chain reaches it, ``named_from``), the
    dotted key and the line of both. Mapping nodes are constructed parents first, so each mapping's
    dotted name is known when its keys are checked. A key holding a dot (``GW.T: 3`` inside a
    ``MODEL:`` block) is refused too: yacs would look for a key named ``GW.T``. The dotted key of
    each value (and of each item of a list value) is kept for the messages of the values refused
    as they are constructed (:func:`_refuse_timestamp`)."""

    def __init__(self, stream: Any, path: str = "", named_from: Sequence[str] = ()) -> None:
        super().__init__(stream)
        self.path, self.named_from = path, tuple(named_from)
        self._mapping_names: dict[int, str] = {}  # id of a mapping node -> its dotted name
        self.value_keys: dict[int, tuple[str, bool]] = {}  # id of a value node -> (its dotted key, in a list)

    def via(self) -> str:
        """The configs whose ``_BASE_`` chain reaches this file, as a message names them ("" for none)."""
        return f" (a base of {' -> '.join(repr(named) for named in self.named_from)})" if self.named_from else ""

    def _name_items(self, node: Any, name: str) -> None:
        """Record ``name`` as the key of the items of the list ``node`` (and of lists in it)."""
        for item in node.value:
            self.value_keys[id(item)] = (name, True)
            if isinstance(item, yaml.SequenceNode):
                self._name_items(item, name)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            prefix = self._mapping_names.get(id(node), "")
            first_seen: dict[tuple[str, Any], tuple[Any, Any]] = {}  # (tag, key) -> (key node, value node)
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # a '<<' merge key (or a complex key) is PyYAML's to handle
                name = f"{prefix}.{key_node.value}" if prefix else str(key_node.value)
                if "." in str(key_node.value):
                    self._refuse_dotted(str(key_node.value), prefix, key_node.start_mark.line + 1)
                identity = (key_node.tag, key_node.value)
                if identity in first_seen:
                    first_key, first_value = first_seen[identity]
                    sections = isinstance(first_value, yaml.MappingNode) and isinstance(value_node, yaml.MappingNode)
                    self._refuse(name, first_key.start_mark.line + 1, key_node.start_mark.line + 1, sections)
                first_seen[identity] = (key_node, value_node)
                if isinstance(value_node, yaml.MappingNode):
                    self._mapping_names[id(value_node)] = name
                self.value_keys[id(value_node)] = (name, False)
                if isinstance(value_node, yaml.SequenceNode):
                    self._name_items(value_node, name)
        return super().construct_mapping(node, deep=deep)

    def _refuse_dotted(self, key: str, section: str, line: int) -> None:
        path = self.path or str(self.name)
        where = f"under {section}: " if section else ""
        blocks = " then ".join(f"{part}:" for part in key.split("."))
        raise GwdetValueError(
            f"Config file {path!r} gives the key {key!r} {where}at line {line}: a YAML config nests its keys in "
            f"blocks, a key holds no dot. Write it as nested blocks, {blocks} each on its own line, indented below "
            f"the one before (or give the override {'.'.join(filter(None, [section, key]))} VALUE on the command line).")

    def _refuse(self, key: str, first: int, second: int, sections: bool) -> None:
        path, via = self.path or str(self.name), self.via()
        fix = (f"put the keys of both blocks under a single {key.rsplit('.', 1)[-1]}: block" if sections else
               "delete the line you do not mean")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key.rsplit(".", 1)[-1]):  # no key anyone writes: a split value
            fix = ("a value holding a comma inside a {...} mapping on one line is split there into keys of its "
                   "own (a tuple such as (\"a\", \"b\") or (\"a\",)): quote the value, or write the mapping as a "
                   "block, one key per line")
        raise GwdetValueError(
            f"Config file {path!r}{via} gives the key {key} twice, at line {first} and at line {second}: YAML keeps "
            f"only the last, so what line {first} sets would be silently dropped. Give {key} once in {path}: {fix}.")


def _construct_int(loader: DuplicateKeyCheckingLoader, node: yaml.ScalarNode) -> int:
    """PyYAML's integer, except one written with a leading zero, which YAML 1.1 reads as octal
    (``MAX_ITER: 010`` trains 8 iterations), or with colons, which it reads in base 60
    (``ASPECT_RATIOS: [[1:2]]`` is 62): refused naming the line, the value and what it reads as."""
    value = loader.construct_yaml_int(node)
    if re.fullmatch(r"[-+]?0[0-7_]+", str(node.value)):
        path = loader.path or str(loader.name)
        raise GwdetValueError(
            f"Config file {path!r} gives {node.value} at line {node.start_mark.line + 1}, which YAML reads as the octal "
            f"number {value} (a leading zero): write {str(node.value).lstrip('+-0_') or '0'} without the leading zero "
            f"(or {value} if the octal value is meant).")
    _refuse_base_60(loader, node, value)
    return value


def _construct_float(loader: DuplicateKeyCheckingLoader, node: yaml.ScalarNode) -> float:
    """PyYAML's float, except one written with colons, which YAML 1.1 reads in base 60 (``1:0.5``
    is 60.5): refused as :func:`_construct_int` refuses such an integer."""
    value = loader.construct_yaml_float(node)
    _refuse_base_60(loader, node, value)
    return value


def _refuse_base_60(loader: DuplicateKeyCheckingLoader, node: yaml.ScalarNode, value: float) -> None:
    """Refuse a number written with colons (YAML 1.1's base 60: ``1:30`` is 90), naming its line."""
    if ":" in str(node.value):
        path = loader.path or str(loader.name)
        raise GwdetValueError(
            f"Config file {path!r} gives {node.value} at line {node.start_mark.line + 1}, which YAML reads as the "
            f"base-60 number {value:g} (1:30 is 90, as minutes and seconds): quote it if it is text, or write the number "
            f"(a ratio such as 1:2 as 0.5).")


def _refuse_timestamp(loader: DuplicateKeyCheckingLoader, node: yaml.ScalarNode) -> Any:
    """Refuse an unquoted date or date and time (``OUTPUT_DIR: 2026-12-01``), which YAML 1.1 reads
    as a ``datetime.date`` / ``datetime.datetime``, a type no yacs key takes (and a date that does
    not exist, ``2026-13-01``, on which PyYAML stops with a bare ``ValueError``): named with the
    file, the line, the key and the quoted value to write."""
    try:
        value = loader.construct_yaml_timestamp(node)
        read = f"a {'date and time' if isinstance(value, datetime.datetime) else 'date'} ({value!r})"
    except ValueError as error:
        read = f"a date, one that does not exist ({error})"
    path, line = loader.path or str(loader.name), node.start_mark.line + 1
    key, in_list = loader.value_keys.get(id(node), ("", False))
    quoted = json.dumps(node.value)  # a double-quoted YAML scalar
    if not key:
        given, fix = node.value, quoted
    elif in_list:
        given, fix = f"{node.value} in {key}", f"{quoted} (in the list of {key})"
    else:
        section, _, leaf = key.rpartition(".")
        under = f" (under {': '.join(section.split('.'))}:)" if section else ""
        given, fix = f"{key} {node.value}", f"{leaf}: {quoted}{under}"
    raise GwdetValueError(
        f"Config file {path!r}{loader.via()} gives {given} at line {line}, which YAML reads as {read}, not as text: "
        f"a config holds no dates. Quote it: {fix}.")


DuplicateKeyCheckingLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)
DuplicateKeyCheckingLoader.add_constructor("tag:yaml.org,2002:float", _construct_float)
DuplicateKeyCheckingLoader.add_constructor("tag:yaml.org,2002:timestamp", _refuse_timestamp)


class PythonTagError(GwdetValueError):
    """A config's YAML holds a tag that builds a Python object (:func:`load_config_yaml`)."""


def load_config_yaml(path: str, text: str, named_from: Sequence[str] = ()) -> Any:
    """The YAML ``text`` of the config file ``path``, loaded as fvcore loads it (``yaml.safe_load``),
    but a key given twice in one mapping is refused (:class:`DuplicateKeyCheckingLoader`; ``named_from``:
    the configs whose ``_BASE_`` chain reaches ``path``, for the message), and so is a tag that
    builds a Python object (``!!python/...``), for which fvcore would fall back on
    ``yaml.unsafe_load`` and run what the tag names (:class:`PythonTagError`). Other invalid YAML
    raises ``yaml.YAMLError`` as ``yaml.safe_load`` does."""
    loader = DuplicateKeyCheckingLoader(text, path, named_from)
    try:
        return loader.get_single_data()
    except yaml.constructor.ConstructorError as error:
        raise PythonTagError(
            f"Config file {path!r} holds a YAML tag that builds a Python object ({error.problem}, line "
            f"{error.problem_mark.line + 1 if error.problem_mark else '?'}); loading it could run code, so gwdet "
            "reads configs as plain YAML only. Remove the tag: a config holds plain values.") from None
    finally:
        loader.dispose()


BASE_KEY = "_BASE_"


def _base_paths(config_file: str, content: Mapping) -> list[tuple[str, str]]:
    """``(as written, as fvcore resolves it)`` for each ``_BASE_`` of a config (one or a list):
    ``~`` expanded, a relative path taken from the folder of ``config_file``; URLs are left out."""
    bases = content.get(BASE_KEY)
    written = [bases] if isinstance(bases, str) else [b for b in bases if isinstance(b, str)] if isinstance(bases, list) else []
    resolved = []
    for base in written:
        path = os.path.expanduser(base) if base.startswith("~") else base
        if path.startswith(("http://", "https://")):
            continue
        if not path.startswith("/"):
            path = os.path.join(os.path.dirname(config_file), path)
        resolved.append((base, path))
    return resolved


def _shipped_config_named(name: str) -> str | None:
    """The path of a config gwdet ships whose file name is ``name`` (the first, by path), if any."""
    try:
        matches = sorted(path for path in configs_dir().rglob(os.path.basename(name)) if path.is_file())
    except (FileNotFoundError, ValueError):
        return None
    return str(matches[0]) if matches else None


def check_base_files(config_file: str, content: Mapping, named_from: Sequence[str] = ()) -> None:
    """Every ``_BASE_`` file that ``config_file`` (whose YAML is ``content``) names, directly or
    through its own bases, exists, and no config is its own base: a ``FileNotFoundError`` naming the
    missing base, the config that names it (and the chain from the config given) and the fix, or a
    ``ValueError`` for a cycle (both :class:`gwdet.errors.GwdetError`). A base that is not plain YAML is left to detectron2 to read."""
    chain = [*named_from, config_file]
    if BASE_KEY in content:  # fvcore reads a path, or a list of paths
        bases = content[BASE_KEY]
        paths = bases if isinstance(bases, list) and bases else [bases]
        if not all(isinstance(path, str) and path.strip() for path in paths):
            raise GwdetValueError(
                f"Config file {config_file!r} gives {BASE_KEY}: {bases!r}: give the path of a base config (e.g. "
                f"{BASE_KEY}: \"../Base-RCNN-FPN.yaml\", relative to the config's folder) or a list of such paths, "
                f"or remove the {BASE_KEY} line.")
    for written, path in _base_paths(config_file, content):
        path = os.path.normpath(path)
        if os.path.abspath(path) in {os.path.abspath(named) for named in chain}:
            raise GwdetValueError(
                f"Config file {config_file!r} names {BASE_KEY}: {written!r}, so a config is its own base "
                f"({' -> '.join([*chain, path])}). Remove that {BASE_KEY} line or point it at another config.")
        via = f" (a base of {' -> '.join(repr(named) for named in chain[:-1])})" if named_from else ""
        if os.path.isdir(path):
            configs = sorted(name for name in os.listdir(path) if name.endswith((".yaml", ".yml")))
            inside = f" (it holds {listed(configs, 3)})" if configs else ""
            raise GwdetIsADirectoryError(
                f"Config file {config_file!r}{via} names {BASE_KEY}: {written!r}, which is a folder{inside}: a "
                f"{BASE_KEY} names one yacs .yaml config file. Correct that line to a config file's path.")
        if not os.path.isfile(path):
            shipped = _shipped_config_named(written)
            hint = f" gwdet ships a config of that name: {shipped}." if shipped else ""
            raise GwdetFileNotFoundError(
                f"Config file {config_file!r}{via} names {BASE_KEY}: {written!r}, but there is no file {path} "
                f"(a relative {BASE_KEY} is read from the folder of the config that names it). Correct the "
                f"{BASE_KEY} line of {config_file} to the base config's path, or put the base config at {path}.{hint}")
        if is_lazy_config(path):
            kind = "(.py)" if path.endswith(".py") else "run's saved config (model, train, dataloader)"
            raise GwdetValueError(
                f"Config file {config_file!r} names {BASE_KEY}: {written!r}, a LazyConfig {kind}: a yacs config's "
                f"{BASE_KEY} is another yacs .yaml config. Name one of those, or use the LazyConfig itself "
                "(--config-file with key=value overrides).")
        try:
            with open(path, encoding="utf-8") as f:
                base_text = f.read()
            base_content = load_config_yaml(path, base_text, named_from=chain)
        except (UnicodeDecodeError, yaml.YAMLError) as error:
            encoding = _other_encoding_problem(path) if isinstance(error, UnicodeDecodeError) else None
            if encoding:
                raise GwdetValueError(f"Config file {config_file!r} names {BASE_KEY}: {written!r}, but {path} "
                                      f"{encoding}") from None
            what = "not text (a checkpoint?)" if isinstance(error, UnicodeDecodeError) else f"not valid YAML ({error})"
            raise GwdetValueError(
                f"Config file {config_file!r} names {BASE_KEY}: {written!r}, but {path} is {what}: a {BASE_KEY} "
                "names another yacs .yaml config. Correct that line.") from None
        except (OSError, PythonTagError):
            continue  # left to detectron2 (its Base-RetinaNet.yaml computes its anchor sizes with a python tag)
        if not isinstance(base_content, dict):  # fvcore's merge of its keys fails with a raw TypeError
            raise GwdetValueError(
                f"Config file {config_file!r} names {BASE_KEY}: {written!r}, but {path} holds no KEY: VALUE mapping "
                f"(is it empty?): a {BASE_KEY} names another yacs .yaml config. Correct that line, or remove it.")
        check_base_files(path, base_content, chain)


def warn_of_bases_overridden_by_their_own_bases(config_file: str, content: Mapping) -> None:
    """A warning for a ``_BASE_`` list whose later base, through a base of its own (one the bases
    share, say), gives a key another value than an earlier base sets: fvcore merges each base with
    its whole chain in order, so the earlier base's value is dropped (``[a.yaml, b.yaml]``, both on
    the demo: b's chain puts the demo's group number back over a's, which a may set itself or
    through a base of its own). Keys the config itself sets, and values a later base sets in its own
    file, are what the user wrote last: no warning."""
    bases = _base_paths(config_file, content)
    if len(bases) < 2:
        return
    own = set(flatten_config({key: value for key, value in content.items() if key != BASE_KEY}))
    chains, files = [], []
    for _, path in bases:
        try:
            chains.append(flatten_config(CfgNode.load_yaml_with_base(path, allow_unsafe=False)))
            with open(path, encoding="utf-8") as f:
                written = load_config_yaml(path, f.read())
        except Exception:  # a base read only with python tags, or damaged: left to the merge's own errors
            return
        files.append(set(flatten_config({key: value for key, value in (written or {}).items() if key != BASE_KEY})))
    for later in range(1, len(bases)):
        for earlier in range(later):
            dropped = sorted(key for key, value in chains[earlier].items()
                             if key not in own and key not in files[later]
                             and key in chains[later] and chains[later][key] != value)
            if dropped:
                key = dropped[0]
                logger.warning(
                    f"Config file {config_file!r}: its {BASE_KEY} {bases[later][0]!r} gives {listed(dropped, 3)} the "
                    f"values of its own base chain ({key}: {chains[later][key]!r}) over those {bases[earlier][0]!r} "
                    f"gives ({key}: {chains[earlier][key]!r}), as fvcore merges each base with its chain in order. Set "
                    "them in the config itself to keep them.")


def get_config(config_path: str, trained: bool = False, *, opts: Sequence[str] | None = None):
    """Config ``config_path`` loaded the way gwdet's tools load it.

    ``.yaml``: a yacs ``CfgNode`` with detectron2's defaults, gwdet's keys, the file and its
    ``_BASE_`` chain, and the ``KEY VALUE`` pairs of ``opts`` merged and checked (what
    ``tools/train_net.py`` trains), left unfrozen for the caller. ``.py``: the LazyConfig
    (:func:`gwdet.model_zoo.lazy_loading.load_lazy_config`) with ``opts`` as ``key=value``
    overrides, each key checked.

    ``trained=True`` (detectron2's argument) is refused with a ``ValueError`` saying how to get
    weights instead: gwdet publishes no trained models of its configs.
    """
    check_flag("gwdet.model_zoo.get_config", "trained", trained)
    check_override_list("gwdet.model_zoo.get_config", opts)
    path = get_config_file(config_path)
    if trained:
        weights_key = "train.init_checkpoint" if Path(path).suffix == ".py" else "MODEL.WEIGHTS"
        raise GwdetValueError(
            f"gwdet.model_zoo.get_config({config_path!r}, trained=True): gwdet ships no trained weights for its "
            f"configs (detectron2's model_zoo points {weights_key} at its own zoo's trained model; gwdet has none "
            f"to point at). Call get_config({config_path!r}) without trained=True, train the config (tools/train_net.py "
            f"--config-file {config_path}, or gwdet-train) and set {weights_key} to the run's model_final.pth; "
            "ImageNet backbones to start from: docs/weights.md.")
    suffix = Path(path).suffix
    if suffix in (".yaml", ".yml"):
        cfg = build_config(path, list(opts or []))
        cfg.defrost()
        return cfg
    if suffix == ".py":  # a file of parts (gw_parts.py, common/shapes.py) defines no model: refused
        return load_lazy_config(path, list(opts or []), model=True)
    raise GwdetValueError(f"{config_path!r} is neither a yacs (.yaml) nor a LazyConfig (.py) config")
