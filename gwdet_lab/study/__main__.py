"""``python -m gwdet_lab.study``: the same command line as ``tools/compare_norms.py``."""
import sys

from gwdet_lab.study.cli import main

sys.exit(main())
