"""Runs the ``triton`` plan's kernels in Triton's interpreter on CPU tensors and prints what
tests/test_triton_kernels.py checks, as JSON. Run in its own process: ``TRITON_INTERPRET=1`` must
be set before Triton is imported (this script sets it first thing).

The interpreter computes ``tl.dot`` by NumPy in float32 whatever its ``input_precision``; the
kernels' products are ``"tf32x3"`` on GPUs. :func:`emulate_tf32x3` makes the interpreter round
them as the tensor cores do: each operand split into TF32 ``hi`` (``cvt.rna.tf32.f32``: the
mantissa rounded to 10 bits, ties away from zero) and ``lo = tf32(x - hi)``, the three products
``hi hi``, ``hi lo`` and ``lo hi`` exact (a product of two TF32 numbers fits a float32), summed
over each 8-wide slice of the inner dimension (one ``mma`` instruction) and added to the float32
accumulator with one rounding per slice, the small terms first (Triton's decomposition of
``tf32x3``). So the errors below are those of the GPU's arithmetic, up to the order of the
additions inside an instruction.

* ``kernels``: for every case, the largest error of the whitening matrix and of its gradient
  w.r.t. the covariance against the float64 PyTorch functions they fuse
  (:func:`gwdet.layers.whitening_matrix.itn_whitening` / ``itn_whitening_vjp``), relative to the
  largest expected value;
* ``layers``: output, input and affine gradients of GW and BW_ItN layers under the ``triton``
  plan in float32 against the ``cpu`` plan in float64, relative errors as above, and the ``cpu``
  plan's own errors in float32 beside them;
* ``launches``: per layer call (forward op, backward op) the PyTorch operations, the Triton
  kernels and the host synchronisations, at two sample counts;
* ``tf32x3_check``: the emulated product's error against float64 beside TF32's and float32's;
* ``fallbacks``: the reason the plan fell back to ``accelerator`` (null: it never did).
"""
import os

os.environ["TRITON_INTERPRET"] = "1"
os.environ["GWDET_GW_PLAN"] = "triton"

import copy  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from gwdet.layers import BatchWhitening, GroupWhitening  # noqa: E402
from gwdet.layers.plans import PLAN_VARIABLE, PLANS  # noqa: E402
from gwdet.layers.plans import triton_kernels, triton_plan  # noqa: E402
from gwdet.layers.plans.triton_plan import fallback_reason  # noqa: E402
from gwdet.layers.whitening_matrix import itn_whitening, itn_whitening_vjp  # noqa: E402
from gwdet_lab.benchmark.op_counts import count_operations  # noqa: E402

GROUP_SIZES = [1, 4, 8, 16, 32, 64]
MMA_K = 8  # inner dimension of one TF32 mma instruction (m16n8k8)


def tf32(values: np.ndarray) -> np.ndarray:
    """``values`` (float32) rounded to TF32 (10-bit mantissa), to nearest, ties away from zero."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def tf32x3_dot(a: np.ndarray, b: np.ndarray, acc: np.ndarray) -> np.ndarray:
    """``acc + a @ b`` as tensor cores compute Triton's ``tf32x3`` (module docstring)."""
    a_hi, b_hi = tf32(a), tf32(b)
    a_lo, b_lo = tf32(a - a_hi), tf32(b - b_hi)
    result = acc.astype(np.float32)
    for k in range(0, a.shape[-1], MMA_K):
        inner = slice(k, k + MMA_K)
        small = a_hi[..., inner].astype(np.float64) @ b_lo[..., inner, :] + a_lo[..., inner].astype(np.float64) @ b_hi[
            ..., inner, :]
        result = (result + small.astype(np.float32)).astype(np.float32)
        big = a_hi[..., inner].astype(np.float64) @ b_hi[..., inner, :]
        result = (result + big.astype(np.float32)).astype(np.float32)
    return result


def emulate_tf32x3() -> None:
    """Make the interpreter's ``tl.dot`` round ``input_precision="tf32x3"`` products as a GPU does."""
    from triton._C.libtriton import ir
    from triton.runtime import interpreter

    plain = interpreter.InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if input_precision != ir.INPUT_PRECISION.TF32x3:
            return plain(self, a, b, d, input_precision, max_num_imprecise_acc)
        return interpreter.TensorHandle(tf32x3_dot(a.data, b.data, d.data), d.dtype.scalar)

    interpreter.InterpreterBuilder.create_dot = create_dot


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got.double() - expected).abs().max() / expected.abs().max().clamp_min(1e-300))


def covariances(count: int, size: int, seed: int, constant: bool) -> torch.Tensor:
    """Ridge covariances of random data, or of constant data (the ridge alone: ``1e-3 I``)."""
    generator = torch.Generator().manual_seed(seed)
    data = torch.randn(count, size, 2 * size + 3, generator=generator, dtype=torch.float64)
    if constant:
        data.zero_()
    return data @ data.transpose(1, 2) / data.shape[-1] + 1e-3 * torch.eye(size, dtype=torch.float64)


def kernel_case(size: int, T: int, constant: bool, offset) -> dict:
    """Errors of both kernels against the float64 functions they fuse, on 2 matrices."""
    plan = PLANS["triton"]
    cov = covariances(2, size, seed=size + T, constant=constant)
    grad = torch.randn(cov.shape, generator=torch.Generator().manual_seed(size), dtype=torch.float64)
    # the few-columns trace offset, one value per matrix as the layer passes it
    trace_offset = torch.rand(2, 1, 1, dtype=torch.float64) if offset == "per matrix" else offset
    expected = itn_whitening(cov, T, trace_offset)
    expected_w, expected_grad = itn_whitening_vjp(cov, grad, T, trace_offset)
    float_offset = trace_offset.float() if isinstance(trace_offset, torch.Tensor) else trace_offset
    got = plan.itn_whitening(cov.float(), T, float_offset)
    got_w, got_grad = plan.itn_whitening_vjp(cov.float(), grad.float(), T, float_offset)
    return {
        "size": size, "T": T, "constant": constant, "offset": str(offset),
        "whitening": relative_error(got, expected),
        "vjp_whitening": relative_error(got_w, expected_w),
        "vjp_grad": relative_error(got_grad, expected_grad),
    }


def kernel_cases() -> list:
    """Every group size with T = 5, 1, 2 (constant data) and 5 with the trace offset, the kernels
    taking the whole tile at once (as the interpreter runs them); then two sizes in panels of 16
    rows, the way they run on a GPU (several panels, inner slices and a padded last panel)."""
    results = []
    for size in GROUP_SIZES:
        for T, constant, offset in ((5, False, 0.0), (1, False, 0.0), (2, True, 0.0), (5, False, "per matrix")):
            results.append({**kernel_case(size, T, constant, offset), "panel": triton_plan.block_size(size)})
    as_on_a_gpu = triton_plan.panel_rows
    triton_plan.panel_rows = lambda device, block: triton_kernels.ROWS
    try:
        for size in (20, 64):
            results.append({**kernel_case(size, 5, False, "per matrix"), "panel": triton_kernels.ROWS})
    finally:
        triton_plan.panel_rows = as_on_a_gpu
    return results


def tf32x3_check() -> dict:
    """The emulation on one product against float64, beside plain TF32 and float32: its error
    must sit between them (so the rounding is really applied, and is that of 3xTF32)."""
    generator = np.random.default_rng(0)
    a, b = generator.standard_normal((2, 64, 64)).astype(np.float32)
    exact = a.astype(np.float64) @ b
    scale = np.abs(exact).max()
    return {
        "tf32x3": float(np.abs(tf32x3_dot(a, b, np.zeros((64, 64), np.float32)) - exact).max() / scale),
        "tf32": float(np.abs(tf32(a).astype(np.float64) @ tf32(b) - exact).max() / scale),
        "float32": float(np.abs((a @ b).astype(np.float64) - exact).max() / scale),
    }


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
    # BW_ItN with 4 groups: the interpreter runs a kernel's programs one after another
    layers = (("GW", 256, lambda: GroupWhitening(256, 64)), ("BW_ItN", 64, lambda: BatchWhitening(64, 16, method="itn")))
    for name, channels, make in layers:
        for samples in (4, 8):
            torch.manual_seed(0)
            layer = make()
            x = torch.randn(samples, channels, 7, 7, requires_grad=True)
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
    emulate_tf32x3()
    report = {"tf32x3_check": tf32x3_check(), "kernels": kernel_cases(), "layers": layer_cases(), "launches": launches()}
    report["fallbacks"] = fallback_reason()
    json.dump(report, sys.stdout)
