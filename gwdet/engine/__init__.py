"""gwdet's run infrastructure: what trains, evaluates and records a run, beside the plugin itself.

* :mod:`gwdet.engine.trainer`: the yacs path (``Trainer``: detectron2's ``DefaultTrainer`` with
  COCOEvaluator, gwdet's optimizer, checkpointer and checks; ``setup``, ``main``, ``build_config``),
  behind ``tools/train_net.py`` / ``gwdet-train``;
* :mod:`gwdet.engine.lazy`: the same for LazyConfig ``.py`` files;
* :mod:`gwdet.engine.launch`: multi-process and multi-machine starts (also CPU processes with gloo);
* :mod:`gwdet.engine.threads`: the CPU thread count of a run;
* :mod:`gwdet.engine.output_dir`: a run folder's lock, fresh-start, resume and evaluation rules;
* :mod:`gwdet.engine.atomic`: files written under a temporary name and renamed into place, with
  their SHA-256 recorded beside them (``<file>.sha256``) where gwdet reads them again;
* :mod:`gwdet.engine.cli_errors`: the tools' one-line errors (``<tool>: error: <message>``, exit
  status 2; ``--verbose`` shows the traceback);
* :mod:`gwdet.engine.tables`, :mod:`gwdet.engine.visualize`: results as markdown/CSV tables and
  prediction drawings.

Nothing is imported here, so that a module of this package can be imported without the trainer
(and its detectron2 imports) coming with it.
"""
