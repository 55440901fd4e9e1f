"""Means, standard deviations and paired confidence intervals over seeds.

A paired comparison of configurations A and B uses the seeds both have: ``d_s = AP_A(s) - AP_B(s)``
(same seed: same initialization draw and data order, same test images), and the two-sided
Student t interval for the mean difference, ``mean(d) +- t_{1-alpha/2, n-1} * sd(d) / sqrt(n)``
with the sample standard deviation (``n - 1`` in the denominator). It covers the variation
between training seeds on this test set, not the sampling of the test images themselves.

The verdict on an ordering "A better than B": *supports* when the interval lies above 0,
*contradicts* when it lies below 0, *cannot resolve* when it contains 0. Beside it, when the
cells have them, the bootstrap interval over test images (:mod:`gwdet_lab.study.image_bootstrap`)
says how much of the difference the choice of test images could account for; it does not enter
the verdict.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Mapping, Sequence

from scipy.stats import t as student_t

from gwdet_lab.study.image_bootstrap import image_interval

CONFIDENCE = 0.95


def mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def std(values: Sequence[float]) -> float | None:
    """Sample standard deviation (``n - 1``); ``None`` for fewer than two values."""
    return statistics.stdev(values) if len(values) >= 2 else None


def t_quantile(confidence: float, degrees_of_freedom: int) -> float:
    """``t_{(1 + confidence) / 2, df}``: the half-width factor of a two-sided interval."""
    return float(student_t.ppf((1.0 + confidence) / 2.0, degrees_of_freedom))


@dataclass(frozen=True)
class PairedDifference:
    """``better - worse`` over the seeds both have."""

    better: str
    worse: str
    seeds: tuple[int, ...]
    differences: tuple[float, ...]
    mean: float | None
    std: float | None
    low: float | None
    high: float | None
    confidence: float = CONFIDENCE
    # interval of the mean difference over bootstrap resamples of the test images (None: not known)
    image_low: float | None = None
    image_high: float | None = None

    @property
    def n(self) -> int:
        return len(self.differences)

    @property
    def verdict(self) -> str:
        if self.low is None or self.high is None:
            return "cannot resolve (fewer than 2 paired seeds)"
        if self.low > 0:
            return "supports"
        if self.high < 0:
            return "contradicts"
        return "cannot resolve"


def paired_difference(better: str, worse: str, values: Mapping[str, Mapping[int, float]],
                      confidence: float = CONFIDENCE,
                      resampled: Mapping[str, Mapping[int, Sequence[float]]] | None = None) -> PairedDifference:
    """Paired t interval of ``values[better][seed] - values[worse][seed]`` over the shared seeds
    (``values``: group -> seed -> AP). NaN values are left out with their seed. ``resampled``
    (group -> seed -> AP per bootstrap resample of the test images) adds the test-image interval
    over the same seeds."""
    a, b = values.get(better, {}), values.get(worse, {})
    seeds = tuple(sorted(s for s in set(a) & set(b) if not (math.isnan(a[s]) or math.isnan(b[s]))))
    differences = tuple(a[s] - b[s] for s in seeds)
    m, sd = mean(differences), std(differences)
    low = high = None
    if sd is not None:
        half = t_quantile(confidence, len(differences) - 1) * sd / math.sqrt(len(differences))
        low, high = m - half, m + half
    images = None
    if resampled is not None:
        images = image_interval(resampled.get(better, {}), resampled.get(worse, {}), seeds, confidence)
    image_low, image_high = images if images is not None else (None, None)
    return PairedDifference(better, worse, seeds, differences, m, sd, low, high, confidence, image_low, image_high)
