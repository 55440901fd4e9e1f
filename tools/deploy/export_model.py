#!/usr/bin/env python
"""Export a gwdet model to TorchScript or ONNX with detectron2's flags.

    python tools/deploy/export_model.py --config-file CFG --format torchscript --export-method tracing \
        --output output/deploy MODEL.WEIGHTS output/run/model_final.pth
    python tools/deploy/export_model.py --config-file CFG --format onnx --output output/deploy MODEL.WEIGHTS ...

Options and what the files need to load: :mod:`gwdet.export.export_model` and docs/deploy.md.
``--config-file`` also takes the name of a config gwdet ships (:mod:`gwdet.model_zoo`). This file
is a thin wrapper of :func:`gwdet.export.export_model.main` (the command ``gwdet-export`` of an
installed gwdet).
"""
import sys

from gwdet.export.export_model import main

if __name__ == "__main__":
    sys.exit(main())
