"""The from-scratch small-batch norm comparison behind ``tools/compare_norms.py``.

group_whitening_huang2021 (end of Sec. 5.2) trains Faster R-CNN from scratch with 2 images per
GPU and unfrozen norms: all BN, BN + GW at S1-B2, all GN, all GW. This package runs that
comparison on any set of configs with the same schedule, seed and data, and adds inference
example weighing of the batch-norm runs (four_things_batchnorm_summers2020, Sec. 3.1).

* :mod:`~gwdet.study.runs`: which runs (named configs + overrides; the default sets);
* :mod:`~gwdet.study.runner`: training each run with ``tools/train_net.py``, resuming, progress;
* :mod:`~gwdet.study.run_folder`: what a run's folder holds, and reading it;
* :mod:`~gwdet.study.weighing`: the example-weight sweep of a finished run;
* :mod:`~gwdet.study.summary`: one table row per run;
* :mod:`~gwdet.study.report`: ``table.md``, ``table.csv``, ``loss_curves.png``, ``ap_bars.png``;
* :mod:`~gwdet.study.cli`: the command line.
"""
