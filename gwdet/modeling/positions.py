"""GW position strings of a ResNet (group_whitening_huang2021, Sec. 5.1.1): ``"S1-B2"`` and the like.

``S1`` is the stem norm; ``B1``, ``B2``, ``B3`` the norms after conv1, conv2, conv3 of every
bottleneck block; ``B12`` is B1 and B2. Tokens are joined by ``-``; ``""`` means no GW.
"""
from __future__ import annotations

from typing import FrozenSet

POSITION_TOKENS = {"S1": ("S1",), "B1": ("B1",), "B2": ("B2",), "B3": ("B3",), "B12": ("B1", "B2")}


def parse_gw_positions(spec: str) -> FrozenSet[str]:
    """``"S1-B2"`` -> ``{"S1", "B2"}``; ``"S1-B12"`` -> ``{"S1", "B1", "B2"}``; ``""`` -> none."""
    if not isinstance(spec, str):
        raise ValueError(f"MODEL.RESNETS.GW_POSITIONS must be a string like 'S1-B2', got {spec!r}")
    positions: set[str] = set()
    for token in filter(None, (t.strip() for t in spec.split("-"))):
        if token not in POSITION_TOKENS:
            raise ValueError(
                f"MODEL.RESNETS.GW_POSITIONS={spec!r}: unknown position {token!r}. Valid tokens: "
                f"{', '.join(POSITION_TOKENS)}, joined by '-' (e.g. 'S1-B2'); '' means no GW."
            )
        positions.update(POSITION_TOKENS[token])
    return frozenset(positions)
