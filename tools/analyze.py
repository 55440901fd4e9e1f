#!/usr/bin/env python
"""Diagnostics of normalizers from the GW and "Beyond BatchNorm" papers, as PNGs + markdown tables;
see ``python tools/analyze.py --help``. The lab package gwdet_lab.analysis does the work (its cli
module holds the subcommands); this file only makes it runnable from a checkout.
"""
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # gwdet_lab beside gwdet, also when only gwdet is installed

from gwdet_lab.analysis.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
