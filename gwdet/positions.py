"""GW positions in a ResNet/ResNeXt (group_whitening_huang2021, Sec. 5.1.1): the one vocabulary.

``S1`` is the stem norm; ``B1``, ``B2``, ``B3`` the norms after conv1, conv2, conv3 of every
bottleneck block; ``B12`` is B1 and B2. Tokens are joined by ``-``, each position named once;
``""`` means no GW. The paper's default ``S1-B2`` puts 17 GW layers in a ResNet-50. The
backbones, the config checks and the checkpoint converter all use this module.
"""
from __future__ import annotations

import collections.abc
from typing import Callable, FrozenSet, Iterable, Iterator, TypeVar

from detectron2.layers import Conv2d
from detectron2.modeling import BACKBONE_REGISTRY
from detectron2.modeling.backbone import ResNet

from gwdet.errors import GwdetTypeError, GwdetValueError

POSITION_TOKENS = {"S1": ("S1",), "B1": ("B1",), "B2": ("B2",), "B3": ("B3",), "B12": ("B1", "B2")}
POSITIONS = ("S1", "B1", "B2", "B3")
BLOCK_CONV_OF_POSITION = {"B1": "conv1", "B2": "conv2", "B3": "conv3"}


def parse_gw_positions(spec: str, setting: str = "MODEL.RESNETS.GW_POSITIONS") -> FrozenSet[str]:
    """``"S1-B2"`` -> ``{"S1", "B2"}``; ``"S1-B12"`` -> ``{"S1", "B1", "B2"}``; ``""`` -> none.
    ``setting`` is how an error names where ``spec`` came from."""
    if not isinstance(spec, str):
        raise GwdetValueError(f"{setting} must be a string like 'S1-B2', got {spec!r}")
    valid = f"Valid tokens: {', '.join(POSITION_TOKENS)}, joined by '-' (e.g. 'S1-B2'); '' means no GW."
    positions: set[str] = set()
    if not spec.strip():
        return frozenset(positions)
    for token in (t.strip() for t in spec.split("-")):
        if token not in POSITION_TOKENS:
            what = "an empty position (a '-' too many)" if not token else f"unknown position {token!r}"
            raise GwdetValueError(f"{setting}={spec!r}: {what}. {valid}")
        twice = positions.intersection(POSITION_TOKENS[token])
        if twice:  # 'S1-B2-B2' or 'B12-B2': most likely a typo for another position
            raise GwdetValueError(
                f"{setting}={spec!r}: position {sorted(twice)[0]} is named twice; name each position once "
                f"(B12 is B1 and B2). {valid}")
        positions.update(POSITION_TOKENS[token])
    return frozenset(positions)


def format_gw_positions(positions: Iterable[str]) -> str:
    """The canonical spelling of a collection of position tokens (``S1``, ``B1``, ``B2``, ``B3``,
    ``B12``): ``{"S1", "B1", "B2"}`` -> ``"S1-B12"``; ``{"B2", "S1"}`` -> ``"S1-B2"``; an empty one
    -> ``""`` (no GW). A string or an unknown token is refused (:func:`parse_gw_positions` reads
    a spec string such as ``"S1-B2"``)."""
    valid = f"Valid tokens: {', '.join(POSITION_TOKENS)}"
    if isinstance(positions, (str, bytes)):
        raise GwdetTypeError(f"format_gw_positions takes a collection of position tokens such as {{'S1', 'B2'}}, "
                             f"not the string {positions!r}; for a spec string use "
                             f"format_gw_positions(parse_gw_positions({positions!r})). {valid}.")
    if not isinstance(positions, collections.abc.Iterable):
        raise GwdetTypeError(f"format_gw_positions takes a collection of position tokens such as {{'S1', 'B2'}}, got "
                             f"{type(positions).__name__} {positions!r:.60}; give an empty one (set()) for no GW. "
                             f"{valid}.")
    given = list(positions)
    unknown = [token for token in given if not isinstance(token, str) or token not in POSITION_TOKENS]
    if unknown:
        raise GwdetValueError(f"format_gw_positions: unknown position token(s) {', '.join(map(repr, unknown))} in "
                              f"{given!r}. {valid} (upper case).")
    positions = frozenset(part for token in given for part in POSITION_TOKENS[token])
    tokens = ["S1"] if "S1" in positions else []
    if {"B1", "B2"} <= positions:
        tokens.append("B12")
    else:
        tokens.extend(position for position in ("B1", "B2") if position in positions)
    if "B3" in positions:
        tokens.append("B3")
    return "-".join(tokens)


def run_stages(resnet: ResNet) -> list:
    """The stages detectron2's ``ResNet.forward`` runs (``resnet.stages``), refused when one of them
    is not the module registered under its name (``resnet.res2 = ...`` after the build changes the
    registered module and the state dict, not the list the forward runs)."""
    for name, stage in zip(resnet.stage_names, resnet.stages, strict=True):
        if getattr(resnet, name) is not stage:
            raise GwdetValueError(
                f"The ResNet's {name} ({type(getattr(resnet, name)).__name__}) is not the stage its forward runs: "
                f"detectron2's ResNet.forward runs the list resnet.stages, which still holds the stage built for "
                f"{name}, so a stage given by assignment (resnet.{name} = ...) is in the state dict but never run, "
                f"and norms placed there would not run either. Replace a stage in both places (resnet.{name} and "
                f"resnet.stages[{resnet.stage_names.index(name)}]), or build the ResNet with it.")
    return list(resnet.stages)


def convs_at_positions(resnet: ResNet, positions: FrozenSet[str]) -> Iterator[Conv2d]:
    """The conv layers whose norm sits at ``positions``, stem first, then block by block."""
    if "S1" in positions:
        yield resnet.stem.conv1
    block_positions = [p for p in BLOCK_CONV_OF_POSITION if p in positions]
    for stage in run_stages(resnet) if block_positions else ():
        for block in stage:
            for position in block_positions:
                conv_name = BLOCK_CONV_OF_POSITION[position]
                if not hasattr(block, conv_name):
                    raise GwdetValueError(
                        f"GW position {position} needs {conv_name} in every block, but "
                        f"{type(block).__name__} has none: use MODEL.RESNETS.DEPTH >= 50 "
                        "(bottleneck blocks) or drop that position."
                    )
                yield getattr(block, conv_name)


def positions_with_norm(resnet: ResNet, norm_types: tuple) -> FrozenSet[str]:
    """The positions (``S1``, ``B1``, ``B2``, ``B3``) where every norm is one of ``norm_types``."""
    positions = {"S1"} if isinstance(resnet.stem.conv1.norm, norm_types) else set()
    blocks = [block for stage in run_stages(resnet) for block in stage]
    for position, conv_name in BLOCK_CONV_OF_POSITION.items():
        if blocks and all(isinstance(getattr(getattr(b, conv_name, None), "norm", None), norm_types)
                          for b in blocks):
            positions.add(position)
    return frozenset(positions)


# the attribute by which a backbone builder says that it reads MODEL.RESNETS.GW_POSITIONS
_READS_POSITIONS = "gwdet_reads_gw_positions"
Builder = TypeVar("Builder", bound=Callable)


def reads_gw_positions(builder: Builder) -> Builder:
    """Mark a backbone builder of your own (``@BACKBONE_REGISTRY.register()``) as one that places
    GW at ``MODEL.RESNETS.GW_POSITIONS``, e.g. by calling one of gwdet's builders: the config check
    then accepts the positions with it as ``MODEL.BACKBONE.NAME``. Returns ``builder``."""
    if not callable(builder):
        raise GwdetTypeError(f"reads_gw_positions marks a backbone builder function (@reads_gw_positions above its "
                             f"def), not {type(builder).__name__} {builder!r}.")
    setattr(builder, _READS_POSITIONS, True)
    return builder


def backbone_reads_gw_positions(name: str, gw_backbones: Iterable[str]) -> bool:
    """Whether the backbone ``name`` (``MODEL.BACKBONE.NAME``) places GW at the positions: one of
    ``gw_backbones`` (gwdet's), or a registered builder marked with :func:`reads_gw_positions`."""
    if name in gw_backbones:
        return True
    return name in BACKBONE_REGISTRY and getattr(BACKBONE_REGISTRY.get(name), _READS_POSITIONS, False)
