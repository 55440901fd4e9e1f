"""gwdet's norm layers as test cases: built with a random affine and trained-looking running
statistics, run forward and backward, and compared in float64 (test_bad_inputs.py, test_cuda.py)."""
import torch

from gwdet.layers import BatchGroupNorm, BatchWhitening, GroupWhitening
from tiny_models import randomize_running_statistics

CHANNELS = 16
LAYERS = {
    "GW": lambda: GroupWhitening(CHANNELS, num_groups=4),
    "GW_ZCA": lambda: GroupWhitening(CHANNELS, num_groups=4, method="zca"),
    "BW": lambda: BatchWhitening(CHANNELS, group_size=8),
    "BW_ItN": lambda: BatchWhitening(CHANNELS, group_size=8, method="itn"),
    "BGN": lambda: BatchGroupNorm(CHANNELS, num_groups=4, eval_example_weight=0.5),
}
NAMES = sorted(LAYERS)

# The gwdet names of the norm catalogue with small hyper-parameters, for 12 channels (built with
# get_norm(gwdet.norm(name, **CATALOGUE_PARAMS[name]), 12); test_layer_contract.py,
# test_export.py). The requested counts (8) do not divide 12 channels, so they also run the
# largest-divisor rule: GW whitens 6 groups of 2 channels, BW 2 groups of 6, BGN normalizes 6
# channel groups.
CATALOGUE_CHANNELS = 12
CATALOGUE_PARAMS = {
    "GW": {"num_groups": 8},
    "GW_ZCA": {"num_groups": 8},
    "BW": {"group_size": 8},
    "BW_ItN": {"group_size": 8},
    "BGN": {"num_groups": 8, "examples_per_group": 2, "eval_example_weight": 0.4},
    "GhostBN": {"examples_per_group": 2},
}


def make_layer(name: str, training: bool, seed: int = 0) -> torch.nn.Module:
    """The layer ``name`` (float32, CPU) with a random affine and, for evaluation, random running
    statistics, in training or evaluation mode."""
    torch.manual_seed(seed)
    layer = LAYERS[name]()
    with torch.no_grad():
        layer.weight.uniform_(0.5, 1.5)
        layer.bias.uniform_(-1.0, 1.0)
    randomize_running_statistics(layer, seed)
    return layer.train(training)


def inputs(seed: int = 0, shape=(4, CHANNELS, 5, 5)):
    """An input and an output gradient, standard normal, float32."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)


def forward_backward(layer: torch.nn.Module, x: torch.Tensor, grad: torch.Tensor) -> list:
    """Output, input gradient and the affine's gradients of one forward + backward, as float64
    CPU tensors."""
    x = x.clone().requires_grad_()
    out = layer(x)
    out.backward(grad.to(out.dtype))
    return [t.detach().double().cpu() for t in (out, x.grad, layer.weight.grad, layer.bias.grad)]


RESULT_NAMES = ["output", "input gradient", "weight gradient", "bias gradient"]


def assert_close_relative(got: torch.Tensor, expected: torch.Tensor, tolerance: float, what: str) -> None:
    """Finite, and every value within ``tolerance`` times the largest expected magnitude."""
    scale = expected.abs().max()
    assert torch.isfinite(got).all(), what
    error = (got - expected).abs().max()
    assert error <= tolerance * scale, (what, (error / scale).item())
