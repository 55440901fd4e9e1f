"""gwdet's run infrastructure: what trains, evaluates and records a run, beside the plugin itself.

* :mod:`gwdet.engine.run`: the one run of ``tools/train_net.py`` / ``gwdet-train`` (``main``,
  ``setup``, the run-request checks, results files) for any config, through a ``RunConfig``;
* :mod:`gwdet.engine.trainer`: a yacs config's ``RunConfig`` and ``Trainer`` (detectron2's
  ``DefaultTrainer`` with COCOEvaluator, gwdet's optimizer, checkpointer and checks);
* :mod:`gwdet.engine.lazy`: a LazyConfig's ``RunConfig`` and ``LazyTrainer``;
* :mod:`gwdet.engine.training`: what both trainers add to detectron2's loop;
* :mod:`gwdet.engine.arguments`: the train tool's command line;
* :mod:`gwdet.engine.launch`: multi-process and multi-machine starts (also CPU processes with gloo);
* :mod:`gwdet.engine.threads`: the CPU thread count of a run;
* :mod:`gwdet.engine.output_dir`: a run folder's lock, fresh-start, resume and evaluation rules;
* :mod:`gwdet.engine.run_environment`: the package versions and dataset annotation files (with
  their SHA-256) that ``results.json`` and the study's records name;
* :mod:`gwdet.engine.run_log`: the checks' messages held until the run's ``log.txt`` exists;
* :mod:`gwdet.engine.visualize`: prediction drawings.

Writing files atomically and the tools' one-line errors are :mod:`gwdet.utils`; reading a yacs
config file is :mod:`gwdet.model_zoo.loading`. Nothing is imported here, so that a module of this
package can be imported without the trainer (and its detectron2 imports) coming with it.
"""
