"""Runs the ``triton`` plan's kernels in Triton's interpreter on CPU tensors and prints what
tests/test_triton_kernels.py checks, as JSON. Run in its own process: ``TRITON_INTERPRET=1`` must
be set before Triton is imported (this script sets it first thing).

* ``kernels``: for every case, the largest error of the whitening matrix and of its gradient
  w.r.t. the covariance against the float64 PyTorch functions they fuse
  (:func:`gwdet.layers.whitening_matrix.itn_whitening` / ``itn_whitening_vjp``), relative to the
  largest expected value;
* ``layers``: output, input and affine gradients of GW and BW_ItN layers under the ``triton``
  plan in float32 against the ``cpu`` plan in float64, relative errors as above, and the ``cpu``
  plan's own errors in float32 beside them;
* ``launches``: per layer call (forward op, backward op) the PyTorch operations, the Triton
  kernels and the host synchronisations, at two sample counts;
* ``fallbacks``: the reason the plan fell back to ``accelerator`` (null: it never did).
"""
import os

os.environ["TRITON_INTERPRET"] = "1"
os.environ["GWDET_GW_PLAN"] = "triton"

import copy  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402

from gwdet.layers import BatchWhitening, GroupWhitening  # noqa: E402
from gwdet.layers.plans import PLAN_VARIABLE, PLANS  # noqa: E402
from gwdet.layers.plans.triton_plan import fallback_reason  # noqa: E402
from gwdet.layers.whitening_matrix import itn_whitening, itn_whitening_vjp  # noqa: E402
from gwdet_lab.benchmark.op_counts import count_operations  # noqa: E402

GROUP_SIZES = [1, 4, 8, 16, 32, 64]


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got.double() - expected).abs().max() / expected.abs().max().clamp_min(1e-300))


def covariances(count: int, size: int, seed: int, constant: bool) -> torch.Tensor:
    """Ridge covariances of random data, or of constant data (the ridge alone: ``1e-3 I``)."""
    generator = torch.Generator().manual_seed(seed)
    data = torch.randn(count, size, 2 * size + 3, generator=generator, dtype=torch.float64)
    if constant:
        data.zero_()
    return data @ data.transpose(1, 2) / data.shape[-1] + 1e-3 * torch.eye(size, dtype=torch.float64)


def kernel_cases() -> list:
    plan = PLANS["triton"]
    results = []
    for size in GROUP_SIZES:
        for T, constant, offset in ((5, False, 0.0), (1, False, 0.0), (2, True, 0.0), (5, False, "per matrix")):
            cov = covariances(3, size, seed=size + T, constant=constant)
            grad = torch.randn(cov.shape, generator=torch.Generator().manual_seed(size), dtype=torch.float64)
            # the few-columns trace offset, one value per matrix as the layer passes it
            trace_offset = torch.rand(3, 1, 1, dtype=torch.float64) if offset == "per matrix" else offset
            expected = itn_whitening(cov, T, trace_offset)
            expected_w, expected_grad = itn_whitening_vjp(cov, grad, T, trace_offset)
            float_offset = trace_offset.float() if isinstance(trace_offset, torch.Tensor) else trace_offset
            got = plan.itn_whitening(cov.float(), T, float_offset)
            got_w, got_grad = plan.itn_whitening_vjp(cov.float(), grad.float(), T, float_offset)
            results.append({
                "size": size, "T": T, "constant": constant, "offset": str(offset),
                "whitening": relative_error(got, expected),
                "vjp_whitening": relative_error(got_w, expected_w),
                "vjp_grad": relative_error(got_grad, expected_grad),
            })
    return results


def forward_backward(layer, x, grad):
    x = x.clone().requires_grad_()
    out = layer(x)
    out.backward(grad)
    return [out.detach(), x.grad] + [p.grad for p in layer.parameters()]


def layer_cases() -> list:
    cases = [(GroupWhitening, (3, 64, 3, 3), g) for g in GROUP_SIZES]  # 64 channels, g groups
    cases += [(GroupWhitening, (5, 128), 64),  # few columns (m = 2 < g): the m x m Gram matrix
              (GroupWhitening, (7, 16, 5, 5), 16),  # one channel per group, odd sample count
              (BatchWhitening, (5, 32, 3, 3), 16)]
    results = []
    for make, shape, size in cases:
        torch.manual_seed(size)
        layer = make(shape[1], size) if make is GroupWhitening else make(shape[1], size, method="itn")
        with torch.no_grad():
            layer.weight.uniform_(0.5, 1.5)
            layer.bias.uniform_(-1.0, 1.0)
        x = torch.randn(shape, dtype=torch.float64) * 2.0 + 1.0
        if make is GroupWhitening:
            x[1] = 3.0  # a constant sample
        grad = torch.randn(shape, dtype=torch.float64)
        os.environ[PLAN_VARIABLE] = "cpu"
        expected = forward_backward(copy.deepcopy(layer).double(), x, grad)
        in_float32 = forward_backward(copy.deepcopy(layer), x.float(), grad.float())
        os.environ[PLAN_VARIABLE] = "triton"
        got = forward_backward(layer, x.float(), grad.float())
        results.append({"layer": make.__name__, "shape": list(shape), "groups": size,
                        "errors": [relative_error(a, b) for a, b in zip(got, expected, strict=True)],
                        "cpu_float32_errors": [relative_error(a, b)
                                               for a, b in zip(in_float32, expected, strict=True)]})
    return results


def launches() -> list:
    results = []
    layers = (("GW", lambda: GroupWhitening(256, 64)), ("BW_ItN", lambda: BatchWhitening(256, 16, method="itn")))
    for name, make in layers:
        for samples in (8, 64):
            torch.manual_seed(0)
            layer = make()
            x = torch.randn(samples, 256, 7, 7, requires_grad=True)
            grad = torch.randn(x.shape)
            holder = {}
            # count_operations calls each at once; the defaults bind this iteration's layer and tensors
            forward = count_operations(lambda holder=holder, layer=layer, x=x: holder.update(out=layer(x)))
            backward = count_operations(lambda holder=holder, grad=grad: holder["out"].backward(grad))
            for direction, counted in (("forward", forward), ("backward", backward)):
                results.append({"layer": name, "samples": samples, "direction": direction,
                                "pytorch_operations": counted.pytorch_operations,
                                "operations": dict(counted.operations),
                                "triton_kernels": dict(counted.triton_kernels), "host_syncs": counted.host_syncs})
    return results


if __name__ == "__main__":
    report = {"kernels": kernel_cases(), "layers": layer_cases(), "launches": launches()}
    report["fallbacks"] = fallback_reason()
    json.dump(report, sys.stdout)
