"""The benchmark harness behind ``tools/benchmark.py`` (results in docs/benchmarks.md).

One module per job:

* :mod:`~gwdet_lab.benchmark.measure`: time (median of repeats, interleaved rounds) and peak memory of a call;
* :mod:`~gwdet_lab.benchmark.progress`: progress lines with an ETA on stderr;
* :mod:`~gwdet_lab.benchmark.cases`: the layers and shapes timed, and the targets (the analytic GW
  cost from :mod:`gwdet.layers.cost`);
* :mod:`~gwdet_lab.benchmark.layer_level`: forward + backward time and memory of the layers, its tables;
* :mod:`~gwdet_lab.benchmark.model_level`: R-50-FPN Faster R-CNN training steps, its tables;
* :mod:`~gwdet_lab.benchmark.inference`: the demo model's per-image evaluation with GW and GN, GW in
  evaluation against training mode, their tables;
* :mod:`~gwdet_lab.benchmark.busy`: competing CPU-bound processes (``--busy N``);
* :mod:`~gwdet_lab.benchmark.report`: the report's header and its section of a markdown file;
* :mod:`~gwdet_lab.benchmark.cli`: the command line.

Every table is a :class:`gwdet_lab.tables.Table`.
"""
