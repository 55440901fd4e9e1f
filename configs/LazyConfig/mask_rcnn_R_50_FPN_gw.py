# LazyConfig version of gwdet's GW Mask R-CNN: R-50-FPN with GW (g=64, ItN T=5) at S1-B2 of the
# backbone (FrozenBN elsewhere, the ImageNet weights' BN frozen), in the FPN, in a 4conv1fc box head
# and in the mask head. Every GW layer's node is a copy of gw_parts.py's GW, holding its values, so
# the values travel with the config (LazyConfig.save / load keep them); another value is set on
# each node (model.backbone.norm.num_groups=32, ...). GW and the box head: gw_parts.py.
#   model = instantiate(LazyConfig.load("configs/LazyConfig/mask_rcnn_R_50_FPN_gw.py").model)
# Training: tools/train_net.py --config-file <this file> (gwdet's run folder, checks and results), or
# detectron2's own .venv/detectron2-dist/tools/lazyconfig_train_net.py (docs/usage.md, "LazyConfig").
from detectron2.config import LazyCall as L
from detectron2.modeling.backbone import BasicStem, ResNet

from gwdet.model_zoo import detectron2_lazy_config  # detectron2's common/ configs, without pkg_resources
from gwdet.modeling import place_norm
from gwdet.solver import get_default_optimizer_params

from .gw_parts import GW as _GW  # private: a top-level GW node would be read by nothing
from .gw_parts import box_head_4conv1fc

model = detectron2_lazy_config("common/models/mask_rcnn_fpn.py").model
model.backbone.bottom_up = L(place_norm)(
    resnet=L(ResNet)(
        stem=L(BasicStem)(in_channels=3, out_channels=64, norm="FrozenBN"),
        stages=L(ResNet.make_default_stages)(depth=50, stride_in_1x1=False, norm="FrozenBN"),
        out_features=["res2", "res3", "res4", "res5"],
        freeze_at=0,  # frozen by place_norm, after GW is in place
    ),
    positions="S1-B2",
    norm=_GW,
    freeze_at=2,
)
model.backbone.in_features = "${.bottom_up.resnet.out_features}"
model.backbone.norm = _GW
model.roi_heads.box_head = box_head_4conv1fc(_GW)
model.roi_heads.mask_head.conv_norm = _GW
# Converted torchvision-layout ImageNet weights (tools/convert_pretrained.py): RGB input with
# torchvision's mean/std in 0-255 units.
model.input_format = "RGB"
model.pixel_mean = [123.675, 116.280, 103.530]
model.pixel_std = [58.395, 57.120, 57.375]

dataloader = detectron2_lazy_config("common/data/coco.py").dataloader
dataloader.train.mapper.image_format = "RGB"
optimizer = detectron2_lazy_config("common/optim.py").SGD
optimizer.params._target_ = get_default_optimizer_params  # GW layers are norms: weight_decay_norm
lr_multiplier = detectron2_lazy_config("common/coco_schedule.py").lr_multiplier_1x
train = detectron2_lazy_config("common/train.py").train
train.init_checkpoint = "weights/R-50-GW.pkl"
