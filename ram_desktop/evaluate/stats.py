"""The statistics behind every score: a 95 % interval for a mean reward and the paired difference of two
models scored on the same examples (docs/evaluate.md, Uncertainty).

- ``mean_interval``: the normal interval of the mean, ``mean ± 1.96 · SD / √n`` with the sample standard
  deviation (``n − 1``), clipped to the smallest and largest per-example score (for 0/1 scorers, to
  [0, 1]); one example gives ``[mean, mean]``.
- ``paired_difference``: the mean of ``a − b`` over the same examples and its standard error
  ``SD(a − b, n − 1) / √n`` (0 for one example).
- ``clearly_better``: ``a`` beats ``b`` by more than two standard errors of the paired difference.

No bootstrap: the same numbers come back for the same rewards, without a seed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

Z95 = 1.96  # the two-sided 95 % quantile of the normal distribution
CLEAR_SE = 2.0  # a difference is clear when it exceeds this many standard errors


def _mean_sd(values: Sequence[float]) -> tuple[float, float]:
    n = len(values)
    if n == 0:
        raise ValueError("no values")
    mean = math.fsum(values) / n
    if n < 2:
        return mean, 0.0
    return mean, math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))


def mean_interval(values: Sequence[float]) -> tuple[float, float]:
    """The 95 % normal interval of the mean of ``values`` (sample SD, n − 1), clipped to [min, max]."""
    mean, sd = _mean_sd(values)
    half = Z95 * sd / math.sqrt(len(values))
    return max(mean - half, min(values)), min(mean + half, max(values))


def paired_difference(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """(mean of a − b, its standard error SD(a − b, n − 1) / √n) over examples scored by both, in order."""
    if len(a) != len(b):
        raise ValueError(f"paired scores need the same examples: {len(a)} and {len(b)} values")
    mean, sd = _mean_sd([x - y for x, y in zip(a, b)])
    return mean, sd / math.sqrt(len(a))


def clearly_better(a: Sequence[float], b: Sequence[float]) -> bool:
    """Whether ``a`` beats ``b`` on the same examples by more than two standard errors of the difference."""
    diff, se = paired_difference(a, b)
    return diff > CLEAR_SE * se
