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

Several orderings tested on the same cells form a family: Holm's step-down procedure (Holm 1979)
adjusts their two-sided paired t p-values so that the chance of any false verdict in the family
stays below ``1 - CONFIDENCE``; the adjusted verdict uses the adjusted p-value, the unadjusted one
the interval. Two further readings of the same differences:

* the interval with the test images' noise: every seed is evaluated on the same test images, so
  the part of a difference that comes from which images were drawn is common to all seeds and
  absent from their spread. ``mean +- t_{1-alpha/2, n-1} * sqrt(sd(d)^2 / n + v_img)``, with
  ``v_img`` the variance over test-image resamples of the mean difference over seeds;
* equivalence by two one-sided tests (Schuirmann 1987) with margin ``m``: the two configurations
  are *equivalent within +-m* when the ``1 - 2 alpha`` (90%) t interval lies inside ``(-m, +m)``.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass
from typing import Mapping, Sequence

from scipy.stats import t as student_t

from gwdet_lab.study.image_bootstrap import image_interval, image_variance

CONFIDENCE = 0.95
# Equivalence margin of the two one-sided tests, in AP points (declared in docs/study/README.md).
EQUIVALENCE_MARGIN = 1.0


def _numbers(values: Sequence[float]) -> list[float]:
    """``values`` without NaN (the AP of a cell that detected nothing, as COCOEvaluator reports it)."""
    return [value for value in values if not math.isnan(value)]


def mean(values: Sequence[float]) -> float | None:
    """The mean of the values that are numbers (NaN left out; NaN when none is); ``None`` for none."""
    if not values:
        return None
    numbers = _numbers(values)
    return statistics.fmean(numbers) if numbers else math.nan


def std(values: Sequence[float]) -> float | None:
    """Sample standard deviation (``n - 1``) of the values that are numbers; ``None`` for fewer
    than two."""
    numbers = _numbers(values)
    return statistics.stdev(numbers) if len(numbers) >= 2 else None


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
    confidence: float = CONFIDENCE
    # interval of the mean difference over bootstrap resamples of the test images (None: not known)
    image_low: float | None = None
    image_high: float | None = None
    # variance of the mean difference over those resamples (None: not known)
    image_var: float | None = None
    # Holm-adjusted p-value within the family of orderings it was tested with (None: not adjusted)
    holm_p: float | None = None
    # the test images' noise cannot be estimated (a report split of fewer than 2 images): no
    # equivalence is claimed
    image_noise_unknown: bool = False

    @property
    def n(self) -> int:
        return len(self.differences)

    @property
    def low(self) -> float | None:
        """Lower end of the seed-only ``confidence`` t interval (``None``: fewer than 2 seeds)."""
        interval = self.interval(self.confidence)
        return None if interval is None else interval[0]

    @property
    def high(self) -> float | None:
        """Upper end of the seed-only ``confidence`` t interval (``None``: fewer than 2 seeds)."""
        interval = self.interval(self.confidence)
        return None if interval is None else interval[1]

    @property
    def p_value(self) -> float | None:
        """Two-sided p-value of the paired t test of ``mean = 0`` (``None``: fewer than 2 seeds)."""
        if self.std is None or self.mean is None:
            return None
        if self.std == 0:
            return 0.0 if self.mean != 0 else 1.0
        statistic = self.mean / (self.std / math.sqrt(self.n))
        return float(2 * student_t.sf(abs(statistic), self.n - 1))

    @property
    def verdict(self) -> str:
        """From the seed-only interval: *supports*, *contradicts* or *cannot resolve*."""
        if self.low is None or self.high is None:
            return "cannot resolve (fewer than 2 paired seeds)"
        if self.low > 0:
            return "supports"
        if self.high < 0:
            return "contradicts"
        return "cannot resolve"

    @property
    def holm_verdict(self) -> str | None:
        """The verdict at the Holm-adjusted p-value (``None`` when not adjusted)."""
        if self.holm_p is None or self.mean is None:
            return None
        if self.holm_p >= 1 - self.confidence:
            return "cannot resolve"
        return "supports" if self.mean > 0 else "contradicts"

    def interval(self, confidence: float, image_noise: bool = False) -> tuple[float, float] | None:
        """The t interval of the mean difference at ``confidence``; with ``image_noise``, its
        variance includes ``image_var`` (``None`` when unknown or fewer than 2 seeds)."""
        if self.std is None or self.mean is None or (image_noise and self.image_var is None):
            return None
        spread = (math.sqrt(self.std ** 2 / self.n + self.image_var) if image_noise and self.image_var is not None
                  else self.std / math.sqrt(self.n))
        half = t_quantile(confidence, self.n - 1) * spread
        return self.mean - half, self.mean + half

    @property
    def with_image_noise(self) -> tuple[float, float] | None:
        """The ``confidence`` interval that adds the test images' noise shared by all seeds."""
        return self.interval(self.confidence, image_noise=True)

    def equivalent(self, margin: float = EQUIVALENCE_MARGIN) -> bool | None:
        """Two one-sided tests at ``alpha = 1 - confidence``: the ``1 - 2 alpha`` interval lies in
        ``(-margin, +margin)`` (``None``: fewer than 2 seeds, or ``image_noise_unknown``: APs of
        too few test images to say how much another test set would move them)."""
        if self.image_noise_unknown:
            return None
        interval = self.interval(1 - 2 * (1 - self.confidence))
        return None if interval is None else -margin < interval[0] and interval[1] < margin


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
    images = variance = None
    if resampled is not None:
        images = image_interval(resampled.get(better, {}), resampled.get(worse, {}), seeds, confidence)
        variance = image_variance(resampled.get(better, {}), resampled.get(worse, {}), seeds)
    image_low, image_high = images if images is not None else (None, None)
    return PairedDifference(better, worse, seeds, differences, m, sd, confidence, image_low, image_high, variance)


def holm_adjusted(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjustment of a family of p-values (``None``s are not part of the family):
    the k-th smallest of m becomes ``max over j <= k of min(1, (m - j + 1) p_(j))``."""
    ranked = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    adjusted: list[float | None] = [None] * len(p_values)
    running = 0.0
    for rank, (p, index) in enumerate(ranked):
        running = max(running, min(1.0, (len(ranked) - rank) * p))
        adjusted[index] = running
    return adjusted


def with_holm(family: Sequence[PairedDifference]) -> list[PairedDifference]:
    """The differences of one family with their Holm-adjusted p-values."""
    adjusted = holm_adjusted([d.p_value for d in family])
    return [dataclasses.replace(d, holm_p=p) for d, p in zip(family, adjusted, strict=True)]
