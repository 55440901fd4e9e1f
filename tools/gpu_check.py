#!/usr/bin/env python
"""The first check on a CUDA GPU (``make gpu-check``): tests/test_cuda.py, every execution plan of
GW against GroupNorm and the 3x3 convolution, a demo detector's training step with and without
mixed precision, the Triton kernels' resources, the cost model beside the measurements; results
in a dated section of docs/benchmarks.md (gwdet_lab/benchmark/gpu_check.py). Without CUDA it
measures and writes nothing and exits with status 2."""
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

if __name__ == "__main__":
    from gwdet_lab.benchmark.gpu_check import main

    sys.exit(main())
