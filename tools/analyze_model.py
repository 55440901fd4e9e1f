#!/usr/bin/env python
"""Flops (with gwdet's layers counted by their analytic cost), parameters and structure of a model.

    python tools/analyze_model.py --config-file configs/mask_rcnn_gw.yaml --tasks flop parameter \
        --input-size 800 1216
    python tools/analyze_model.py --config-file configs/Demo/mask_rcnn_R_50_FPN_gw_shapes.yaml -n 4
    python tools/analyze_model.py --config-file configs/LazyConfig/mask_rcnn_R_50_FPN_gw_shapes.py -n 4 \
        train.init_checkpoint=output/demo_lazy/model_final.pth      # a LazyConfig: key=value overrides

Options: :mod:`gwdet.export.analyze_model`.
"""
import sys

from gwdet.export.analyze_model import main

if __name__ == "__main__":
    sys.exit(main())
