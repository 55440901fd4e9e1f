#!/usr/bin/env python
"""Train or evaluate a gwdet model with detectron2's trainer and COCOEvaluator, here or on SLURM.

    python tools/train_net.py --config configs/mask_rcnn_gw.yaml
    python tools/train_net.py --config configs/Demo/mask_rcnn_R_50_FPN_gw_shapes.yaml
    python tools/train_net.py --config-file CFG --eval-only MODEL.WEIGHTS out/model_final.pth
    python tools/train_net.py --config CFG --resume            # continue from OUTPUT_DIR/last_checkpoint
    python tools/train_net.py --config CFG --num-gpus 8 SOLVER.IMS_PER_BATCH 16
    python tools/train_net.py --config CFG --launcher slurm --nodes 2 --num-gpus 8 --partition gpu

Trailing ``KEY VALUE`` pairs override the config. ``--config`` also takes the name of a config
gwdet ships (``--config mask_rcnn_gw.yaml``): a path that does not exist here is looked up in
:mod:`gwdet.model_zoo`. This file is a thin wrapper of :func:`gwdet.cluster.training.run`, which an
installed gwdet also provides as the command ``gwdet-train``; training itself lives in :mod:`gwdet.engine.run`.
``--num-gpus N`` starts N processes: one per GPU, or N CPU processes (gloo) when there is no GPU
(:mod:`gwdet.engine.launch`, which also works on detectron2 v0.6). CPU threads: see :mod:`gwdet.engine.threads`
(``--threads N`` or ``OMP_NUM_THREADS`` to choose). ``--launcher slurm``
submits the same run as a SLURM job through submitit (:mod:`gwdet.cluster`, docs/cluster.md).
"""
import sys

from gwdet.cluster.training import run

if __name__ == "__main__":
    sys.exit(run())
