"""Which runs a study trains: named configs plus per-run overrides, and the default run sets.

A run is a name (its folder under the study's output folder and its row in the tables), a config
file, and ``KEY VALUE`` overrides of its own. The default sets are the paper's four from-scratch
configs (group_whitening_huang2021, end of Sec. 5.2): all BN, BN + GW at S1-B2, all GN, all GW,
as CPU-sized versions on the embedded shapes dataset (``configs/Demo``) or the COCO originals
(``configs/Scratch``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

PAPER_RUN_NAMES = ("bn", "bn_gw_s1b2", "gn", "gw")
DEFAULT_CONFIG_PATTERNS = {
    "shapes": "configs/Demo/scratch_faster_rcnn_{name}_shapes.yaml",
    "coco": "configs/Scratch/faster_rcnn_R_50_FPN_{name}.yaml",
}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")


@dataclass(frozen=True)
class RunSpec:
    """One run of a study: ``name``, ``config_file`` and its own ``KEY VALUE`` overrides."""

    name: str
    config_file: str
    opts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(
                f"Run name {self.name!r} must start with a letter or digit and hold only letters, "
                "digits and _ . + - (it names a folder)."
            )
        if len(self.opts) % 2:
            raise ValueError(f"Run {self.name!r}: overrides must be KEY VALUE pairs, got {list(self.opts)}")


def default_runs(dataset: str, repo_root: Path) -> list[RunSpec]:
    """The paper's four from-scratch runs on ``dataset`` ("shapes" or "coco")."""
    if dataset not in DEFAULT_CONFIG_PATTERNS:
        raise ValueError(f"Unknown dataset {dataset!r}; choose one of {', '.join(DEFAULT_CONFIG_PATTERNS)}.")
    pattern = DEFAULT_CONFIG_PATTERNS[dataset]
    return [RunSpec(name, str(repo_root / pattern.format(name=name))) for name in PAPER_RUN_NAMES]


def parse_config_item(item: str) -> RunSpec:
    """``"NAME=path.yaml"``, or ``"path.yaml"`` named after the file (without ``.yaml``)."""
    name, sep, path = item.partition("=")
    if not sep:
        name, path = Path(item).stem, item
    return RunSpec(name, path)


def parse_extra(tokens: Sequence[str]) -> RunSpec:
    """``["NAME=CONFIG", KEY, VALUE, ...]``: a run with overrides of its own, e.g. a BGN run

    ``bgn=configs/Demo/scratch_faster_rcnn_bn_shapes.yaml MODEL.RESNETS.NORM BGN``.
    """
    if not tokens or "=" not in tokens[0]:
        raise ValueError(f"--extra takes NAME=CONFIG [KEY VALUE ...], got {list(tokens)}")
    spec = parse_config_item(tokens[0])
    return RunSpec(spec.name, spec.config_file, tuple(tokens[1:]))


def check_unique_names(specs: Iterable[RunSpec]) -> None:
    """``ValueError`` naming any run name used twice (two runs cannot share a folder)."""
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            raise ValueError(f"Two runs are named {spec.name!r}; name them apart with NAME=CONFIG.")
        seen.add(spec.name)
