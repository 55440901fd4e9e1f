"""Progress lines of a benchmark run on stderr: ``[k/n] what: result  (elapsed ..., ETA ...)``."""
from __future__ import annotations

import sys
import time
from typing import Sequence

from gwdet_lab.reporting import format_duration


class Progress:
    """One line per finished measurement; the ETA scales the time spent so far by the estimated
    cost of what is left (one weight per measurement, in the order they run)."""

    def __init__(self, weights: Sequence[float]) -> None:
        self.weights = list(weights)
        self.done = 0
        self.start = time.perf_counter()

    def step(self, what: str, result: str) -> None:
        self.done += 1
        elapsed = time.perf_counter() - self.start
        spent = sum(self.weights[: self.done])
        left = sum(self.weights[self.done :])
        eta = elapsed / spent * left if spent > 0 else float("nan")
        print(
            f"[{self.done}/{len(self.weights)}] {what}: {result}  "
            f"(elapsed {format_duration(elapsed)}, ETA {format_duration(eta)})",
            file=sys.stderr,
            flush=True,
        )
