#!/usr/bin/env python
"""Compare norms on small-batch detection trained from scratch (group_whitening_huang2021, end of
Sec. 5.2): train several configs with the same schedule, seed and data, evaluate each with
COCOEvaluator, and write tables and plots into one folder.

    python tools/compare_norms.py                        # BN, BN+GW S1-B2, GN, GW on shapes (CPU)
    python tools/compare_norms.py --out output/study --opts SOLVER.MAX_ITER 300
    python tools/compare_norms.py --dataset coco --num-gpus 8
    python tools/compare_norms.py --extra bgn=configs/Demo/scratch_faster_rcnn_bn_shapes.yaml \\
        MODEL.RESNETS.NORM BGN MODEL.FPN.NORM BGN MODEL.ROI_BOX_HEAD.NORM BGN

Running the same command again resumes: finished runs are skipped, an interrupted run continues
from its last checkpoint. See ``--help`` and :mod:`gwdet.study`.
"""
import sys
from pathlib import Path

from gwdet.study.cli import main

if __name__ == "__main__":
    sys.exit(main(repo_root=Path(__file__).resolve().parents[1]))
