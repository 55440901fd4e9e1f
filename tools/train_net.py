#!/usr/bin/env python
"""Train or evaluate a gwdet model with detectron2's trainer and COCOEvaluator.

    python tools/train_net.py --config configs/mask_rcnn_gw.yaml
    python tools/train_net.py --config configs/Demo/mask_rcnn_R_50_FPN_gw_shapes.yaml
    python tools/train_net.py --config-file CFG --eval-only MODEL.WEIGHTS out/model_final.pth
    python tools/train_net.py --config CFG --resume            # continue from OUTPUT_DIR/last_checkpoint
    python tools/train_net.py --config CFG --num-gpus 8 SOLVER.IMS_PER_BATCH 16

Trailing ``KEY VALUE`` pairs override the config. Everything but argument parsing lives in
:mod:`gwdet.engine`. ``--num-gpus N`` starts N processes: one per GPU, or N CPU processes (gloo)
when there is no GPU (:mod:`gwdet.launch`, which also works on detectron2 v0.6). CPU threads: see
:mod:`gwdet.threads` (``--threads N`` or ``OMP_NUM_THREADS`` to choose).
"""
from gwdet.engine import main, parse_args
from gwdet.launch import launch
from gwdet.threads import configure_threads


if __name__ == "__main__":
    args = parse_args()
    print("Command Line Args:", args)
    configure_threads(args.threads, processes=args.num_gpus)
    launch(
        main,
        args.num_gpus,
        num_machines=args.num_machines,
        machine_rank=args.machine_rank,
        dist_url=args.dist_url,
        args=(args,),
    )
