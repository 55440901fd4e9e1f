#!/usr/bin/env python
"""Speed and memory of gwdet's norm layers, training steps and inference; see
``python tools/benchmark.py --help`` and gwdet_lab/benchmark/ (docs/benchmarks.md holds the results).
"""
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

if __name__ == "__main__":
    import torch

    if not torch.cuda.is_available():
        # the op-count level runs the triton plan's kernels on CPU tensors, in Triton's
        # interpreter, which must be on before anything imports Triton (gwdet does, via torch._dynamo)
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from gwdet_lab.benchmark.cli import main

    sys.exit(main())
