#!/usr/bin/env python
"""Export a gwdet model to TorchScript or ONNX with detectron2's flags.

    python tools/deploy/export_model.py --config-file CFG --format torchscript --export-method tracing \
        --output output/deploy MODEL.WEIGHTS output/run/model_final.pth
    python tools/deploy/export_model.py --config-file CFG --format onnx --output output/deploy MODEL.WEIGHTS ...

Options and what the files need to load: :mod:`gwdet.export.export_model` and README "Deploy".
"""
import sys

from gwdet.export.export_model import main

if __name__ == "__main__":
    sys.exit(main())
