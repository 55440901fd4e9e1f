# Parts of gwdet's LazyConfigs on the embedded shapes dataset (gwdet/data/shapes.py): the narrow
# R-50-FPN R-CNN of configs/Demo/Base-Shapes.yaml (4x narrower than the paper's, no pre-trained
# weights, nothing frozen), the shapes data loaders, the SGD optimizer in which gwdet's norms get the
# norm weight decay, the warm-up + multi-step schedule, and the training settings; each the value of
# the yacs config it mirrors (configs/Demo/*.yaml, configs/Study/*.yaml). Not a config itself: the
# configs beside this folder import it.
#
# Norms travel as L(...) nodes: one node per part of the model, which every layer of that part
# refers to (the ResNet's stages refer to its stem's norm, "${...stem.norm}"), so a value changed
# on the command line reaches exactly that part, e.g.
#   model.backbone.bottom_up.resnet.stem.norm.num_groups=4     # GN of the whole ResNet (demo)
#   model.backbone.bottom_up.norm.num_groups=8                 # GW at the S1-B2 positions
#   model.backbone.norm.T=3                                    # GW in the FPN
from detectron2.config import LazyCall as L
from detectron2.data import (
    DatasetMapper,
    build_detection_test_loader,
    build_detection_train_loader,
    get_detection_dataset_dicts,
)
import detectron2.data.transforms as T
from detectron2.evaluation import COCOEvaluator
from detectron2.layers import ShapeSpec
from detectron2.modeling.backbone import BasicStem, BottleneckBlock, ResNet
from detectron2.solver import WarmupParamScheduler
from detectron2.modeling.roi_heads import FastRCNNConvFCHead, MaskRCNNConvUpsampleHead
from fvcore.common.param_scheduler import MultiStepParamScheduler
from omegaconf import OmegaConf

import gwdet
from gwdet.data import ShapesSpec, shapes_dataset
from gwdet.model_zoo import detectron2_lazy_config  # detectron2's common/ configs, without pkg_resources
from gwdet.modeling import place_norm
from gwdet.solver import get_default_optimizer_params

# configs/Demo/Base-Shapes.yaml: MODEL.RESNETS.{STEM_OUT_CHANNELS 16, RES2_OUT_CHANNELS 64,
# WIDTH_PER_GROUP 16}, FPN and head convs of 64 channels, a 256-wide fc.
STEM_CHANNELS = 16
RES2_CHANNELS = 64
BOTTLENECK_CHANNELS = 16
WIDTH = 64
FC_WIDTH = 256
NUM_CLASSES = 4  # gwdet.data.CLASSES: circle, square, triangle, star


def norm(name, **values):
    """gwdet's norm ``name`` with every hyper-parameter ``values`` gives (gwdet.norm)."""
    return L(gwdet.norm)(name=name, **values)


def narrow_resnet(resnet_norm, gw_positions="", gw_norm=None):
    """R-50 layout (3-4-6-3 bottleneck blocks, stride in the 3x3 conv) at Base-Shapes.yaml's widths,
    ``resnet_norm`` everywhere, ``gw_norm`` at ``gw_positions`` (gwdet.modeling.place_norm), no
    stage frozen (MODEL.BACKBONE.FREEZE_AT 0)."""
    stages = []
    in_channels, out_channels, bottleneck = STEM_CHANNELS, RES2_CHANNELS, BOTTLENECK_CHANNELS
    for index, blocks in enumerate((3, 4, 6, 3)):
        first_stride = 1 if index == 0 else 2
        stages.append(L(ResNet.make_stage)(
            block_class=BottleneckBlock,
            num_blocks=blocks,
            stride_per_block=[first_stride] + [1] * (blocks - 1),
            in_channels=in_channels,
            out_channels=out_channels,
            bottleneck_channels=bottleneck,
            stride_in_1x1=False,
            norm="${...stem.norm}",  # the ResNet's one norm node: its stem's
        ))
        in_channels, out_channels, bottleneck = out_channels, out_channels * 2, bottleneck * 2
    resnet = L(ResNet)(
        stem=L(BasicStem)(in_channels=3, out_channels=STEM_CHANNELS, norm=resnet_norm),
        stages=stages,
        out_features=["res2", "res3", "res4", "res5"],
        freeze_at=0,
    )
    if not gw_positions:
        return resnet
    return L(place_norm)(resnet=resnet, positions=gw_positions, norm=gw_norm, freeze_at=0)


def shapes_rcnn(resnet_norm, fpn_norm, box_head_norm, mask_head_norm=None, gw_positions="", gw_norm=None,
                mask=True):
    """The R-CNN of configs/Demo/Base-Shapes.yaml: the narrow ResNet (:func:`narrow_resnet`) under
    a 64-channel FPN, a 4conv1fc box head, and with ``mask`` a 4-conv mask head; each part with its
    norm. Mask R-CNN with ``mask``, Faster R-CNN without."""
    model = detectron2_lazy_config("common/models/mask_rcnn_fpn.py").model
    model.backbone.bottom_up = narrow_resnet(resnet_norm, gw_positions, gw_norm)
    model.backbone.in_features = ["res2", "res3", "res4", "res5"]
    model.backbone.out_channels = WIDTH
    model.backbone.norm = fpn_norm

    rpn = model.proposal_generator
    rpn.head.in_channels = WIDTH
    rpn.anchor_generator.sizes = [[8], [16], [32], [64], [128]]
    rpn.batch_size_per_image = 128
    rpn.pre_nms_topk = (500, 300)  # (training, test)
    rpn.post_nms_topk = (200, 100)

    heads = model.roi_heads
    heads.num_classes = NUM_CLASSES
    heads.batch_size_per_image = 64
    heads.box_head = L(FastRCNNConvFCHead)(
        input_shape=ShapeSpec(channels=WIDTH, height=7, width=7),
        conv_dims=[WIDTH] * 4,
        fc_dims=[FC_WIDTH],
        conv_norm=box_head_norm,
    )
    heads.box_predictor.input_shape = ShapeSpec(channels=FC_WIDTH)
    if mask:
        heads.mask_head = L(MaskRCNNConvUpsampleHead)(
            input_shape=ShapeSpec(channels=WIDTH, width=14, height=14),
            num_classes="${..num_classes}",
            conv_dims=[WIDTH] * 5,  # 4 convs, then the deconvolution's width
            conv_norm=mask_head_norm,
        )
    else:
        heads.mask_in_features = None
        heads.mask_pooler = None
        heads.mask_head = None

    # The shapes images: RGB, centred and scaled to about [-2, 2] (MODEL.PIXEL_MEAN / PIXEL_STD).
    model.input_format = "RGB"
    model.pixel_mean = [127.5, 127.5, 127.5]
    model.pixel_std = [64.0, 64.0, 64.0]
    return model


def shapes_dataloader(num_train, num_val, num_test, test_split, batch_size, num_workers, mask=True,
                      image_size=128, seed=0):
    """Loaders of the shapes dataset (``dataloader.shapes``: what gwdet.data.shapes_dataset generates
    and registers), train and test images resized to the generated size (``INPUT.MIN_SIZE_*``),
    bitmask instance masks with ``mask``, and COCOEvaluator on the split ``test_split`` writing to
    ``train.output_dir``/inference. Change the data with e.g. ``dataloader.shapes.num_train=8``."""
    dataloader = OmegaConf.create()
    dataloader.shapes = L(ShapesSpec)(image_size=image_size, num_train=num_train, num_val=num_val,
                                      num_test=num_test, seed=seed)
    size = "${dataloader.shapes.image_size}"
    dataloader.train = L(build_detection_train_loader)(
        dataset=L(get_detection_dataset_dicts)(
            names=L(shapes_dataset)(split="train", spec="${dataloader.shapes}"),
            filter_empty=True,
        ),
        mapper=L(DatasetMapper)(
            is_train=True,
            augmentations=[
                L(T.ResizeShortestEdge)(short_edge_length=size, max_size=size, sample_style="choice"),
                L(T.RandomFlip)(horizontal=True, vertical=False),
            ],
            image_format="RGB",
            use_instance_mask=mask,
            instance_mask_format="bitmask",  # the shapes json holds RLE masks
        ),
        total_batch_size=batch_size,
        aspect_ratio_grouping=True,
        num_workers=num_workers,
    )
    dataloader.test = L(build_detection_test_loader)(
        dataset=L(get_detection_dataset_dicts)(
            names=L(shapes_dataset)(split=test_split, spec="${dataloader.shapes}"),
            filter_empty=False,
        ),
        mapper=L(DatasetMapper)(
            is_train=False,
            augmentations=[L(T.ResizeShortestEdge)(short_edge_length=size, max_size=size, sample_style="choice")],
            image_format="${...train.mapper.image_format}",
        ),
        num_workers=num_workers,
    )
    dataloader.evaluator = L(COCOEvaluator)(
        dataset_name="${..test.dataset.names}",
        output_dir="${train.output_dir}/inference",
    )
    return dataloader


def sgd(lr):
    """SOLVER's SGD (momentum 0.9, weight decay 1e-4), norms without weight decay
    (SOLVER.WEIGHT_DECAY_NORM 0), gwdet's layers counted as norms."""
    optimizer = detectron2_lazy_config("common/optim.py").SGD
    optimizer.params._target_ = get_default_optimizer_params
    optimizer.params.weight_decay_norm = 0.0
    optimizer.lr = lr
    optimizer.momentum = 0.9
    optimizer.weight_decay = 1.0e-4
    return optimizer


def warmup_multistep(max_iter, warmup_iters, steps):
    """SOLVER.LR_SCHEDULER_NAME WarmupMultiStepLR: linear warm-up from 0.001 over ``warmup_iters``,
    x0.1 at each of ``steps``. As in detectron2's LazyConfigs, the schedule is relative to
    ``train.max_iter``: with another max_iter the warm-up and steps keep their fractions."""
    return L(WarmupParamScheduler)(
        scheduler=L(MultiStepParamScheduler)(
            values=[0.1 ** k for k in range(len(steps) + 1)],
            milestones=list(steps),
            num_updates=max_iter,
        ),
        warmup_length=warmup_iters / max_iter,
        warmup_method="linear",
        warmup_factor=0.001,
    )


def training(output_dir, max_iter, checkpoint_period, seed=0, vis_images=0):
    """detectron2's ``common/train.py`` with the yacs configs' values: no initial weights
    (MODEL.WEIGHTS ""), on the CPU (MODEL.DEVICE "cpu"; train.device=cuda for a GPU), evaluation at
    the end only (TEST.EVAL_PERIOD 0), every periodic checkpoint kept, seeded (SEED), and
    ``vis_images`` prediction drawings of the evaluated dataset written to ``output_dir/vis`` by
    gwdet's train tool (TEST.VIS_IMAGES; detectron2's tool ignores the key)."""
    train = detectron2_lazy_config("common/train.py").train
    train.output_dir = output_dir
    train.init_checkpoint = ""
    train.max_iter = max_iter
    train.eval_period = 0
    train.log_period = 20
    train.checkpointer = dict(period=checkpoint_period, max_to_keep=None)
    train.device = "cpu"
    train.seed = seed
    train.vis_images = vis_images
    return train
