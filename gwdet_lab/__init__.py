"""gwdet's lab: experiments built on the gwdet plugin, kept out of the plugin package.

The plugin (``gwdet``) is what a detectron2 user imports to train and deploy; it never imports
this package. Here live the tools that study the plugin's layers:

* :mod:`gwdet_lab.study`: the from-scratch small-batch norm study behind ``tools/compare_norms.py``;
* :mod:`gwdet_lab.benchmark`: speed and memory of the layers and models behind ``tools/benchmark.py``;
* :mod:`gwdet_lab.reporting`: duration formatting shared by lab reports (tables: :mod:`gwdet_lab.tables`).
"""
