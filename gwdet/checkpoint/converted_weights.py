"""What weights written by gwdet's converter record, read back when the weights load.

A converted file is detectron2's weights format plus gwdet's record of what the weights are::

    {"model": {name: float32 ndarray},      # detectron2's ResNet names
     "__author__": "gwdet convert_pretrained: resnet50.pth as R-50, GW at none",
     "matching_heuristics": True,           # detectron2 maps the names onto backbone.bottom_up.*
     "gwdet": {"arch": "R-50",              # an ARCHITECTURES name
               "gw_positions": "S1-B2",     # MODEL.RESNETS.GW_POSITIONS spelling; "" is no GW
               "norm": "BN",                # the norm elsewhere: "BN", or "GN" for a GN-style file
               "source": "resnet50.pth",    # the converted file's name
               "input": {"format": "RGB",   # how the weights expect images: torchvision's way
                         "pixel_mean": [...], "pixel_std": [...], "stride_in_1x1": False}}}

The converter (:mod:`gwdet.convert`) writes it; gwdet's checkpointer reads the ``"gwdet"`` entry
back (:func:`read_conversion_metadata`) and refuses weights whose architecture, GW positions, norms or
input format misfit the model (:mod:`gwdet.checkpoint.compatibility`); a file without ``"input"``
is checked for the rest.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterable, Mapping

from gwdet.errors import GwdetValueError

@dataclass(frozen=True)
class Architecture:
    """A bottleneck ResNet/ResNeXt as detectron2's ``MODEL.RESNETS`` describes it."""

    name: str
    depth: int
    blocks_per_stage: tuple[int, int, int, int]
    num_groups: int
    width_per_group: int
    stem_out_channels: int = 64  # torchvision's ImageNet ResNets (MODEL.RESNETS.STEM_OUT_CHANNELS)
    res2_out_channels: int = 256  # their first stage's output (MODEL.RESNETS.RES2_OUT_CHANNELS)

    def describe(self) -> str:
        """``"R-50 (blocks per stage [3, 4, 6, 3], conv2 1 group x 64 channels)"``."""
        shape = describe_shape(self.blocks_per_stage, self.num_groups, self.width_per_group)
        return f"{self.name} ({shape})"


ARCHITECTURES = {
    arch.name: arch
    for arch in (
        Architecture("R-50", 50, (3, 4, 6, 3), 1, 64),
        Architecture("R-101", 101, (3, 4, 23, 3), 1, 64),
        Architecture("X-50-32x4d", 50, (3, 4, 6, 3), 32, 4),
        Architecture("X-101-32x8d", 101, (3, 4, 23, 3), 32, 8),
    )
}


def describe_shape(blocks: Iterable[int], num_groups: int, width_per_group: int) -> str:
    """``"blocks per stage [3, 4, 6, 3], conv2 1 group x 64 channels"``."""
    groups = f"{num_groups} group{'s' if num_groups != 1 else ''}"
    return f"blocks per stage {list(blocks)}, conv2 {groups} x {width_per_group} channels"


WEIGHTS_KEY = "model"
AUTHOR_KEY = "__author__"
MATCHING_HEURISTICS_KEY = "matching_heuristics"
METADATA_KEY = "gwdet"
ARCH_FIELD = "arch"
GW_POSITIONS_FIELD = "gw_positions"
NORM_FIELD = "norm"
SOURCE_FIELD = "source"
INPUT_FIELD = "input"


def conversion_metadata(arch: str, gw_positions: str, gn_style: bool, source: str,
                        config: Mapping[str, object]) -> dict[str, object]:
    """The ``"gwdet"`` entry of weights converted from ``source`` (a path; its name is kept), whose
    loading config (:func:`gwdet.convert.target_backbone.loading_config`) is ``config``."""
    return {
        ARCH_FIELD: arch,
        GW_POSITIONS_FIELD: gw_positions,
        NORM_FIELD: "GN" if gn_style else "BN",
        SOURCE_FIELD: os.path.basename(source),
        INPUT_FIELD: {
            "format": config["INPUT.FORMAT"],
            "pixel_mean": config["MODEL.PIXEL_MEAN"],
            "pixel_std": config["MODEL.PIXEL_STD"],
            "stride_in_1x1": config["MODEL.RESNETS.STRIDE_IN_1X1"],
        },
    }


def conversion_author(arch: str, gw_positions: str, source: str) -> str:
    """The ``__author__`` line of weights converted from ``source``."""
    return (
        f"gwdet convert_pretrained: {os.path.basename(source)} as {arch}, "
        f"GW at {gw_positions or 'none'}"
    )


def read_conversion_metadata(checkpoint: Mapping) -> Mapping | None:
    """The ``"gwdet"`` entry of a loaded checkpoint; None for weights the converter did not write."""
    metadata = checkpoint.get(METADATA_KEY)
    return metadata if isinstance(metadata, Mapping) else None


def malformed_record_field(metadata: Mapping) -> tuple[str, object, str] | None:
    """``(field, value, what it should be)`` for the first field of a ``"gwdet"`` record that is not
    what the converter writes (:func:`conversion_metadata`); None when every field present is."""
    from gwdet.positions import parse_gw_positions  # detectron2's modeling, needed only for such a record

    for field in (ARCH_FIELD, NORM_FIELD, SOURCE_FIELD):
        value = metadata.get(field)
        if value is not None and not isinstance(value, str):
            return field, value, "a string"
    if GW_POSITIONS_FIELD in metadata:
        value = metadata[GW_POSITIONS_FIELD]
        try:
            parse_gw_positions(value)
        except GwdetValueError:
            return GW_POSITIONS_FIELD, value, "GW positions spelled as MODEL.RESNETS.GW_POSITIONS ('S1-B2'; '' for none)"
    fields = metadata.get(INPUT_FIELD)
    if fields is None:
        return None
    if not isinstance(fields, Mapping):
        return INPUT_FIELD, fields, "a dict of the input values (format, pixel_mean, pixel_std, stride_in_1x1)"
    wanted = {"format": (str, "a string"), "stride_in_1x1": (bool, "True or False")}
    for name, (kind, what) in wanted.items():
        if fields.get(name) is not None and not isinstance(fields[name], kind):
            return f"{INPUT_FIELD}.{name}", fields[name], what
    for name in ("pixel_mean", "pixel_std"):
        value = fields.get(name)
        if value is not None and not (isinstance(value, (list, tuple)) and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
            return f"{INPUT_FIELD}.{name}", value, "a list of numbers, one per colour channel"
    channels = 3 if fields.get("format") in ("RGB", "BGR") else None
    lengths = {name: len(fields[name]) for name in ("pixel_mean", "pixel_std") if fields.get(name) is not None}
    count = channels if channels is not None else lengths.get("pixel_mean")
    for name, length in lengths.items():
        if count is not None and length != count:
            return (f"{INPUT_FIELD}.{name}", fields[name],
                    f"a list of {count} numbers, one per colour channel of the {fields.get('format') or 'input'} images")
    return None


def check_conversion_metadata(metadata: Mapping, path: str | None) -> None:
    """Refuse a ``"gwdet"`` record (of the file ``path``) whose fields are not the values the
    converter writes (a string architecture, norm and source, GW positions in
    ``MODEL.RESNETS.GW_POSITIONS``'s spelling, an input dict), naming the file, the field and its
    value: such a record cannot be compared with the model."""
    found = malformed_record_field(metadata)
    if found is None:
        return
    field, value, what = found
    shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
    raise GwdetValueError(
        f"{path or 'The checkpoint'}: the file's {METADATA_KEY!r} record is malformed: its field {field!r} is "
        f"{shown} ({type(value).__name__}), where gwdet's converter writes {what}; nothing was loaded. Convert the "
        f"weights again with tools/convert_pretrained.py (metadata of one's own belongs outside the {METADATA_KEY!r} "
        "entry, which gwdet reads to check the weights against the model).")
