"""gwdet.norm(...) as torchvision's ``norm_layer``: torchvision's ResNet calls ``norm_layer(channels)``
for every norm it builds, which is how a gwdet.Norm builds a layer (docs/usage.md)."""
import torch
import torchvision

import gwdet
from gwdet.layers import GroupWhitening


def test_a_torchvision_resnet_built_with_gw_runs_with_the_configured_values():
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None, norm_layer=gwdet.norm("GW", num_groups=16, T=3, eps=1e-4))
    norms = {name: module for name, module in model.named_modules() if isinstance(module, GroupWhitening)}
    # the stem's bn1, two per BasicBlock (8 blocks), the downsampling shortcuts of layer2-4
    assert len(norms) == 1 + 2 * 8 + 3 and "bn1" in norms and "layer4.0.downsample.1" in norms
    assert not [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert {(m.num_groups, m.T, m.eps, m.method) for m in norms.values()} == {(16, 3, 1e-4, "itn")}
    assert sorted({m.num_channels for m in norms.values()}) == [64, 128, 256, 512]
    model.eval()
    with torch.no_grad():
        out = model(torch.randn(2, 3, 64, 64))
    assert out.shape == (2, 1000) and torch.isfinite(out).all()
