# LazyConfig version of configs/Scratch/faster_rcnn_R_50_FPN_gw.yaml: Faster R-CNN R-50-FPN trained
# from scratch with GW (g=64, ItN T=5) everywhere (backbone, FPN, 4conv1fc box head), 2 images per
# GPU on 8 GPUs, the paper's 1x schedule (group_whitening_huang2021, end of Sec. 5.2: 28.79 AP;
# it follows the setup of Table 4: 90k iterations, batch 16 on eight GPUs).

from gwdet.model_zoo import detectron2_lazy_config  # detectron2's common/ configs, without pkg_resources
from gwdet.solver import get_default_optimizer_params

from .gw_parts import GW as _GW  # private: a top-level GW node would be read by nothing
from .gw_parts import box_head_4conv1fc

model = detectron2_lazy_config("common/models/mask_rcnn_fpn.py").model
model.roi_heads.mask_in_features = None
model.roi_heads.mask_pooler = None
model.roi_heads.mask_head = None
model.backbone.bottom_up.stem.norm = _GW
model.backbone.bottom_up.stages.norm = _GW
model.backbone.bottom_up.stages.stride_in_1x1 = False
model.backbone.bottom_up.freeze_at = 0
model.backbone.norm = _GW
model.roi_heads.box_head = box_head_4conv1fc(_GW)
# As the yacs config (configs/Base-RCNN-FPN.yaml): RGB input with torchvision's mean/std in 0-255 units.
model.input_format = "RGB"
model.pixel_mean = [123.675, 116.280, 103.530]
model.pixel_std = [58.395, 57.120, 57.375]

dataloader = detectron2_lazy_config("common/data/coco.py").dataloader
dataloader.train.mapper.image_format = "RGB"
dataloader.train.mapper.use_instance_mask = False
dataloader.train.total_batch_size = 16
optimizer = detectron2_lazy_config("common/optim.py").SGD
optimizer.params._target_ = get_default_optimizer_params  # GW layers are norms: weight_decay_norm
lr_multiplier = detectron2_lazy_config("common/coco_schedule.py").lr_multiplier_1x
train = detectron2_lazy_config("common/train.py").train
train.init_checkpoint = ""
train.max_iter = 90000
train.eval_period = 0  # as the yacs config (TEST.EVAL_PERIOD 0): evaluated once, at the end
