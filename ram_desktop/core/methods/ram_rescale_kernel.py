"""The numba piece of RAM+'s probe statistic, the λ* rounding-survival histograms (``ram_rescale.LAMBDA_STAR``):
its overload of the engine's hook ``kernel_code.unique_statistic``, which the Analyze probe's fused kernel calls
with each block's unique elements, and ``lambda_star_bins``, the λ* bin of each element.

Imported lazily (it imports numba) by ``ram_rescale.fused_lambda_star``, before the probe's kernel is compiled or
loaded from numba's cache: the overload is chosen by the numba type of ``LambdaStarConstants``, so the cached
kernel is the one for this statistic. numba keys that cached kernel on ``kernel_code.py`` alone: after changing
this module, clear ``kernel_code.py``'s cache (docs/engine.md).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba.core import types
from numba.extending import overload

from ..engine.kernel_code import (
    from_half_bits,
    like,
    step_bits,
    to_bf16_bits,
    to_half_bits,
    unique_statistic,
    vector_jit,
)

DTYPES = 3  # bfloat16, float16, float32: ``ram_rescale.SURVIVAL_DTYPES`` in order


class LambdaStarConstants(NamedTuple):
    """The λ* histogram's constants in the compute dtype: 1/STEP, the largest finite value (a subnormal τ's
    overflowing 1/τ becomes it), the last bin, and ½. Its numba type selects ``_count_lambda_star``."""

    inv_step: float
    big: float
    last: float
    half: float


@vector_jit
def lambda_star_bins(xs, taus, count, d, inv_step, big, half, last, bins):
    """bins[k] = the λ* bin of unique element k (base value xs[k], update taus[k]) for survival dtype d
    (0 bfloat16, 1 float16, 2 float32), as ``ram_rescale.lambda_star_keys`` computes it, with the same
    operations in the same order and dtype: y0 = round(x + τ) in dtype d (from float64 through float32,
    as torch converts), h = half the signed gap from y0 to its neighbour toward τ's sign (nextafter),
    bin = clamp(ceil(((y0 − x) − τ + h)·scale), 0, last) with scale = (1/τ)·(1/STEP) (±inf → ±big);
    NaN (y0 overflowed float16) in the last bin. Branch-free, so the loop vectorises."""
    zero = half - half
    one = half + half
    for k in range(count):
        x = xs[k]
        tau = taus[k]
        total = x + tau
        up = tau > zero
        scale = one / tau * inv_step
        scale = (big if scale > zero else -big) if scale - scale != zero else scale
        f = np.float32(total)
        if d == 0:
            r = to_bf16_bits(f)
            y = np.uint32(r << 16).view(np.float32)
            n = np.uint32(step_bits(r, up, np.int64(0x8000), np.int64(0x7F80)) << 16).view(np.float32)
        elif d == 1:
            r = to_half_bits(f)
            y = from_half_bits(r)
            n = from_half_bits(step_bits(r, up, np.int64(0x8000), np.int64(0x7C00)))
        else:
            r = np.int64(f.view(np.uint32))
            y = f
            n = np.uint32(step_bits(r, up, np.int64(0x80000000), np.int64(0x7F800000))).view(np.float32)
        y0 = like(x, y)
        h = (like(x, n) - y0) * half
        num = np.ceil((((y0 - x) - tau) + h) * scale)
        clipped = min(max(num, zero), last)
        bins[k] = np.int32(last if num != num else clipped)  # noqa: PLR0124  num is NaN


@overload(unique_statistic)
def _count_lambda_star(statistic, xs, taus, agents, count, counts, scratch):
    """RAM+'s overload of the probe's hook: counts[t, d, bin] += 1 for each unique element k < count (agent
    t = agents[k]) in the λ* bin of survival dtype d, the dtypes in turn (``lambda_star_bins`` into
    ``scratch``), as ``ram_rescale.lambda_star_counts`` counts them."""
    if not (
        isinstance(statistic, types.BaseNamedTuple)
        and getattr(statistic, "instance_class", None) is LambdaStarConstants
    ):
        return None

    def impl(statistic, xs, taus, agents, count, counts, scratch):
        for d in range(DTYPES):
            lambda_star_bins(
                xs, taus, count, d, statistic.inv_step, statistic.big, statistic.half, statistic.last, scratch
            )
            for k in range(count):
                counts[agents[k], d, scratch[k]] += 1

    return impl
