"""Diagnostics of normalizers as pictures and tables (behind ``tools/analyze.py``).

One module per job:

* :mod:`~gwdet_lab.analysis.cli`: the subcommands and their flags (``tools/analyze.py`` runs its ``main``);
* :mod:`~gwdet_lab.analysis.normalizers`: the normalizers compared, on ``(m, d)`` feature matrices;
* :mod:`~gwdet_lab.analysis.conditioning`: kappa_p of normalized activations (GW paper Fig. 2);
* :mod:`~gwdet_lab.analysis.constraints`: constraint numbers, ranges and their numerical count (Table 1);
* :mod:`~gwdet_lab.analysis.cost`: cost of a model's GW layers against a 3x3 convolution (Sec. 3);
* :mod:`~gwdet_lab.analysis.constraint_report`: the ``constraints`` report (Table 1 + GW costs);
* :mod:`~gwdet_lab.analysis.propagation`: activation variance, cosine similarity and gradient norms
  at initialization in a detectron2 model (beyond_batchnorm_lubana2021, Secs. 3-5);
* :mod:`~gwdet_lab.analysis.capacity`: batch size / group number vs accuracy, random labels, on
  scikit-learn's digits (GW paper Figs. 1 and 5);
* :mod:`~gwdet_lab.analysis.plotting` and :mod:`~gwdet_lab.analysis.report`: PNG figures, markdown tables.

Submodules are imported on demand (capacity needs scikit-learn, the others detectron2).
"""
