#!/usr/bin/env python
"""Convert a torchvision-layout ImageNet ResNet/ResNeXt checkpoint into detectron2 weights.

    python tools/convert_pretrained.py resnet50.pth weights/R-50.pkl --arch R-50
    python tools/convert_pretrained.py gw50.pth weights/R-50-GW.pkl --arch R-50 --gw-positions S1-B2

The architecture and the GW positions (norms without running statistics) are read off the
checkpoint; --arch and --gw-positions make the conversion fail unless the checkpoint has them.
Prints a report (keys converted and dropped, the config for the weights). On a checkpoint that
cannot be converted faithfully it prints why and exits with code 2, leaving no output file.
Everything but argument parsing lives in :mod:`gwdet.checkpoint`.
"""
import argparse
import sys

from gwdet.checkpoint import ARCHITECTURES, ConversionError, convert_checkpoint


def argument_parser() -> argparse.ArgumentParser:
    """IN, OUT and the flags that constrain or relax the conversion."""
    parser = argparse.ArgumentParser(
        description="Convert a torchvision-layout ImageNet ResNet/ResNeXt checkpoint (BN, or GW "
        "at some positions) into a detectron2 .pkl for gwdet's backbones."
    )
    parser.add_argument("input", metavar="IN", help="checkpoint written by torch.save (.pth/.pt)")
    parser.add_argument("output", metavar="OUT", help="detectron2 weights to write (.pkl)")
    parser.add_argument(
        "--arch",
        choices=list(ARCHITECTURES),
        help="fail unless the checkpoint is this architecture (default: accept the inferred one)",
    )
    parser.add_argument(
        "--gw-positions",
        metavar="SPEC",
        help="fail unless GW sits exactly here, e.g. S1-B2 ('' = no GW, BN everywhere); "
        "default: accept the inferred positions",
    )
    parser.add_argument(
        "--allow-unsafe-pickle",
        action="store_true",
        help="load files that need full unpickling (arbitrary code execution!): trusted files only",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace OUT if it exists (by default an existing OUT is an error and stays as it is)",
    )
    parser.add_argument(
        "--allow-unexpected",
        action="store_true",
        help="drop keys outside torchvision's ResNet layout instead of failing (reported)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Convert, print the report; on a ConversionError print it and return 2."""
    args = argument_parser().parse_args(argv)
    try:
        report = convert_checkpoint(
            args.input,
            args.output,
            arch=args.arch,
            gw_positions=args.gw_positions,
            allow_unsafe_pickle=args.allow_unsafe_pickle,
            allow_unexpected=args.allow_unexpected,
            overwrite=args.overwrite,
        )
    except ConversionError as error:
        print(f"convert_pretrained: error: {error}", file=sys.stderr)
        return 2
    print(report.format())
    return 0


if __name__ == "__main__":
    sys.exit(main())
