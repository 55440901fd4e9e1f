# Parts shared by gwdet's lazy configs: the paper's GW norm (g=64 groups, ItN with T=5) and the
# 4conv1fc box head (four 3x3 convs with a norm each, then one fc), both as L(...) nodes.
from detectron2.config import LazyCall as L
from detectron2.layers import ShapeSpec
from detectron2.modeling.roi_heads import FastRCNNConvFCHead

import gwdet

GW = L(gwdet.norm)(name="GW", num_groups=64, T=5, eps=1.0e-5)


def box_head_4conv1fc(norm):
    """detectron2's FastRCNNConvFCHead with 4 convs of 256 channels, each with ``norm``, and one fc."""
    return L(FastRCNNConvFCHead)(
        input_shape=ShapeSpec(channels=256, height=7, width=7),
        conv_dims=[256, 256, 256, 256],
        fc_dims=[1024],
        conv_norm=norm,
    )
