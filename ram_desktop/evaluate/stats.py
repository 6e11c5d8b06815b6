"""Intervals and paired differences of mean rewards (docs/evaluate.md): every model is scored on the same
examples, so two models are compared example by example."""

from __future__ import annotations

import math
from collections.abc import Sequence

Z95 = 1.96  # the two-sided 95 % quantile of the normal distribution


def _mean_and_se(values: Sequence[float]) -> tuple[float, float]:
    """The mean and its standard error, sd with n − 1 over √n (0 for fewer than two values)."""
    n = len(values)
    if n == 0:
        raise ValueError("no values")
    mean = math.fsum(values) / n
    if n < 2:
        return mean, 0.0
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


def mean_interval(values: Sequence[float]) -> tuple[float, float]:
    """The 95 % normal interval of the mean: mean ± 1.96 · sd(n − 1) / √n."""
    mean, se = _mean_and_se(values)
    return mean - Z95 * se, mean + Z95 * se


def paired_difference(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """The mean of a − b over paired examples and its standard error, sd(a − b, n − 1) / √n."""
    if len(a) != len(b):
        raise ValueError(f"paired values differ in number: {len(a)} and {len(b)}")
    return _mean_and_se([x - y for x, y in zip(a, b)])


def clearly_better(a: Sequence[float], b: Sequence[float]) -> bool:
    """a beats b on the same examples beyond noise: the 95 % interval of the paired difference lies above 0."""
    mean, se = paired_difference(a, b)
    return mean - Z95 * se > 0
