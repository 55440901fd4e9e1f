"""ImageNet-pretrained torchvision-layout ResNet/ResNeXt checkpoints (BN, or GW at some positions
as in the group whitening authors' models) converted into detectron2 ``.pkl`` weights for gwdet's
backbones. The command line is ``tools/convert_pretrained.py``; see :mod:`gwdet.convert.converter`.
"""
from gwdet.convert.architecture import ARCHITECTURES, Architecture
from gwdet.convert.converter import (
    ConversionReport,
    convert_checkpoint,
    convert_state_dict,
    write_detectron2_pkl,
)
from gwdet.convert.loading import ConversionError, SourceStateDict, read_source_state_dict

__all__ = [
    "ARCHITECTURES",
    "Architecture",
    "ConversionError",
    "ConversionReport",
    "SourceStateDict",
    "convert_checkpoint",
    "convert_state_dict",
    "read_source_state_dict",
    "write_detectron2_pkl",
]
