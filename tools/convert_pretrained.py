#!/usr/bin/env python
"""Convert a torchvision-layout ImageNet ResNet/ResNeXt checkpoint into detectron2 weights.

    python tools/convert_pretrained.py resnet50.pth weights/R-50.pkl --arch R-50
    python tools/convert_pretrained.py gw50.pth weights/R-50-GW.pkl --arch R-50 --gw-positions S1-B2

The architecture and the GW positions (norms without running statistics) are read off the
checkpoint; --arch and --gw-positions make the conversion fail unless the checkpoint has them.
Prints a report (keys converted and dropped, the config for the weights). On a checkpoint that
cannot be converted faithfully it prints why and exits with code 2, leaving no output file.
This file is a thin wrapper of :func:`gwdet.convert.cli.main` (the command ``gwdet-convert`` of
an installed gwdet); the conversion lives in :mod:`gwdet.convert`.
"""
import sys

from gwdet.convert.cli import argument_parser, main  # noqa: F401  (argument_parser: the tool's parser)

if __name__ == "__main__":
    sys.exit(main())
