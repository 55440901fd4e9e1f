#!/usr/bin/env python
"""Speed and memory of gwdet's norm layers, training steps and inference; see
``python tools/benchmark.py --help`` and gwdet_lab/benchmark/ (docs/benchmarks.md holds the results).
"""
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from gwdet_lab.benchmark.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
