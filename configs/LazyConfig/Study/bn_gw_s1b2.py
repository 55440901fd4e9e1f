# LazyConfig version of configs/Study/bn_gw_s1b2.yaml, the from-scratch small-batch study
# (docs/study/README.md): BN with GW (g=16, ItN T=5) at S1-B2 of the backbone; the paper's 28.37 AP
# on COCO. Faster R-CNN with the narrow R-50-FPN and 4conv1fc box head of configs/Demo/Base-Scratch-
# Shapes.yaml, nothing frozen, no pre-trained weights; shapes with 5000 train, 500 val and 500 test
# images; 4000 iterations of 2 images, LR 0.01 after a 500-iteration warm-up, x0.1 at 3200 and 3700;
# seed 0 (train.seed=1 for another cell). The yacs study evaluates on shapes_val (selection) and
# shapes_test (reported): a LazyConfig has one test loader, here the reported split
# (dataloader.test.dataset.names.split=val for the other). Parts: ../common/shapes.py.
#   python tools/train_net.py --config-file configs/LazyConfig/Study/bn_gw_s1b2.py train.seed=1
from ..common.shapes import norm, sgd, shapes_dataloader, shapes_rcnn, training, warmup_multistep

# GW with g=16: the channels are 4x narrower than the paper's (configs/Demo/Base-Scratch-Shapes.yaml).
model = shapes_rcnn(resnet_norm="BN", gw_positions="S1-B2", gw_norm=norm("GW", num_groups=16, T=5, eps=1.0e-5),
                    fpn_norm="BN", box_head_norm="BN", mask=False)
dataloader = shapes_dataloader(num_train=5000, num_val=500, num_test=500, test_split="test", batch_size=2,
                               num_workers=0, mask=False)
optimizer = sgd(lr=0.01)
lr_multiplier = warmup_multistep(max_iter=4000, warmup_iters=500, steps=(3200, 3700))
train = training(output_dir="output/study_lazy_bn_gw_s1b2", max_iter=4000, checkpoint_period=500)
