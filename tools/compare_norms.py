#!/usr/bin/env python
"""Compare norms on small-batch detection trained from scratch (group_whitening_huang2021, end of
Sec. 5.2): BN, BN + GW at S1-B2, GN and GW over seeds and batch sizes, with paired confidence
intervals, example weighing and batch norm's train/test gap. The lab package gwdet_lab.study
does the work; this file only makes it runnable from a checkout.

    python tools/compare_norms.py --study paper                 # the four configurations x seeds 0, 1, 2
    python tools/compare_norms.py --study batch-sweep --jobs 2  # x 1, 2, 4, 8 images per batch
    python tools/compare_norms.py --study paper --only gn-b2-s1 # one cell
    python tools/compare_norms.py --study paper --launcher slurm --num-gpus 8  # one SLURM job per cell

Running the same command again resumes: finished cells are skipped, an interrupted one continues
from its last checkpoint, and a cell whose config differs from the recorded one is refused.
See ``--help``, docs/study/README.md and, for clusters, docs/cluster.md.
"""
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # gwdet_lab beside gwdet, also when only gwdet is installed

from gwdet_lab.study.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(repo_root=REPO))
