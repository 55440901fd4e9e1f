# LazyConfig version of the demo, configs/Demo/mask_rcnn_R_50_FPN_gw_shapes.yaml: the narrow Mask
# R-CNN R-50-FPN of Base-Shapes.yaml trained from scratch on the embedded shapes dataset, with GW
# (g=16, ItN T=5) at S1-B2 of the backbone and GN (g=8) elsewhere in it, GW in the FPN, in the
# 4conv1fc box head and in the mask head. Same model, data, optimizer and schedule as the yacs demo
# (tests/test_lazy_training.py builds both and compares them); runs on a CPU as it is.
#   python tools/train_net.py --config-file configs/LazyConfig/mask_rcnn_R_50_FPN_gw_shapes.py
#   python .venv/detectron2-dist/tools/lazyconfig_train_net.py \
#       --config-file configs/LazyConfig/mask_rcnn_R_50_FPN_gw_shapes.py      (detectron2's own tool)
# Overrides are key=value: train.max_iter=100 dataloader.shapes.num_train=50 train.device=cuda ...
# Parts: common/shapes.py.
from .common.shapes import norm, sgd, shapes_dataloader, shapes_rcnn, training, warmup_multistep

# The demo's group numbers: 4x narrower channels than the paper's models, so GW keeps the paper's
# 4 channels per group at 64 channels (g=16 instead of 64), GN 8 channels per group (g=8, not 32).
# Each part of the model gets its own copy of these nodes (names with "_" stay out of the config).
_GW = norm("GW", num_groups=16, T=5, eps=1.0e-5)
_GN = norm("GN", num_groups=8)

model = shapes_rcnn(resnet_norm=_GN, gw_positions="S1-B2", gw_norm=_GW, fpn_norm=_GW, box_head_norm=_GW,
                    mask_head_norm=_GW)
dataloader = shapes_dataloader(num_train=400, num_val=50, num_test=50, test_split="val", batch_size=4,
                               num_workers=1)
optimizer = sgd(lr=0.02)
lr_multiplier = warmup_multistep(max_iter=1000, warmup_iters=100, steps=(800, 950))
train = training(output_dir="output/demo_lazy", max_iter=1000, checkpoint_period=500, vis_images=4)
