"""Training and the norm study beyond one machine: SLURM jobs through submitit.

* :mod:`gwdet.cluster.options`: the ``--launcher {local,submitit-local,slurm}`` flags and their checks;
* :mod:`gwdet.cluster.slurm`: SLURM's commands (is a controller reachable, job states from squeue);
* :mod:`gwdet.cluster.executor`: submitit executors, submitting, following and waiting for a job;
* :mod:`gwdet.cluster.jobs`: a node's place in a job, and requeueing on preemption or time limit;
* :mod:`gwdet.cluster.training`: ``tools/train_net.py`` here or as a job (:class:`TrainingJob`).

submitit is the optional ``cluster`` extra (``pip install 'gwdet[cluster]'``); only submitting a job
imports it. User guide: docs/cluster.md.
"""
from gwdet.cluster.options import LAUNCHERS, add_launcher_arguments

__all__ = ["LAUNCHERS", "add_launcher_arguments"]
