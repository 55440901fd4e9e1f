"""The from-scratch small-batch norm study behind ``tools/compare_norms.py``.

group_whitening_huang2021 (end of Sec. 5.2) trains Faster R-CNN from scratch with 2 images per
GPU and unfrozen norms: all BN, BN + GW at S1-B2, all GN, all GW. This package runs that
comparison over seeds and batch sizes with paired statistics, inference example weighing of the
batch-norm models (four_things_batchnorm_summers2020, Sec. 3.1) and batch norm's train/test gap.

* :mod:`~gwdet_lab.study.cells`: which runs a study has (configuration x batch size x seed);
* :mod:`~gwdet_lab.study.record`: each run's full resolved config, recorded and checked;
* :mod:`~gwdet_lab.study.scheduler`: worker processes side by side, progress and ETAs;
* :mod:`~gwdet_lab.study.worker`: one run in one process (training, evaluations);
* :mod:`~gwdet_lab.study.evaluation`: example weighing and batch-statistics evaluation;
* :mod:`~gwdet_lab.study.run_folder`: what a run's folder holds;
* :mod:`~gwdet_lab.study.summary`, :mod:`~gwdet_lab.study.stats`, :mod:`~gwdet_lab.study.report`:
  numbers per run, statistics over seeds, tables and plots;
* :mod:`~gwdet_lab.study.cli`: the command line.
"""
