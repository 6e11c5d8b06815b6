"""The numba code of SLERP's fused normalised products and combination (``slerp.scaled_products``,
``slerp.combine_pair``).

Imported lazily (it imports numba); numba caches the compiled code next to this file, as it does for
``engine.kernel_code``, whose helpers this code calls.
"""

from __future__ import annotations

import numpy as np

from ..engine.kernel_code import jit, store, widen


@jit
def scaled_product_kernel(a, b, start, norm_a, norm_b, out):
    """out[i] = (a[start + i] / norm_a) · (b[start + i] / norm_b) in float32, each operation rounded as torch
    rounds it (SLERP's normalised dot product, summed by the caller with torch)."""
    for i in range(out.size):
        out[i] = (np.float32(widen(a[start + i])) / norm_a) * (np.float32(widen(b[start + i])) / norm_b)


@jit
def combine_pair_kernel(a, b, coef_a, coef_b, out):
    """out[i] = coef_a · a[i] + coef_b · b[i] in float32 (two products, one sum, each rounded), rounded once to
    out's dtype; returns how many b[i] − a[i] are not finite (a τ the merge must refuse)."""
    bad = 0
    for i in range(a.size):
        x = np.float32(widen(a[i]))
        y = np.float32(widen(b[i]))
        d = y - x
        if d - d != 0:
            bad += 1
        store(out, i, coef_a * x + coef_b * y)
    return bad
