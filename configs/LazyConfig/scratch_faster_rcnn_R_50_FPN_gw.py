# LazyConfig version of configs/Scratch/faster_rcnn_R_50_FPN_gw.yaml: Faster R-CNN R-50-FPN trained
# from scratch with GW (g=64, ItN T=5) everywhere (backbone, FPN, 4conv1fc box head), 2 images per
# GPU on 8 GPUs, the 3x schedule (group_whitening_huang2021, end of Sec. 5.2: 28.79 AP).
from detectron2.config import LazyCall as L
from detectron2.layers import ShapeSpec
from detectron2.model_zoo import get_config
from detectron2.modeling.roi_heads import FastRCNNConvFCHead

import gwdet

GW = L(gwdet.norm)(name="GW", num_groups=64, T=5, eps=1.0e-5)

model = get_config("common/models/mask_rcnn_fpn.py").model
model.roi_heads.mask_in_features = None
model.roi_heads.mask_pooler = None
model.roi_heads.mask_head = None
model.backbone.bottom_up.stem.norm = GW
model.backbone.bottom_up.stages.norm = GW
model.backbone.bottom_up.stages.stride_in_1x1 = False
model.backbone.bottom_up.freeze_at = 0
model.backbone.norm = GW
model.roi_heads.box_head = L(FastRCNNConvFCHead)(
    input_shape=ShapeSpec(channels=256, height=7, width=7),
    conv_dims=[256, 256, 256, 256],
    fc_dims=[1024],
    conv_norm=GW,
)

dataloader = get_config("common/data/coco.py").dataloader
dataloader.train.mapper.use_instance_mask = False
dataloader.train.total_batch_size = 16
optimizer = get_config("common/optim.py").SGD
lr_multiplier = get_config("common/coco_schedule.py").lr_multiplier_3x
train = get_config("common/train.py").train
train.init_checkpoint = ""
train.max_iter = 270000
