"""The numba code of SLERP's fused normalised products and combination (``slerp.scaled_products``,
``slerp.combine_pair``).

Imported lazily (it imports numba); numba caches the compiled code next to this file, as it does for
``engine.kernel_code``, whose helpers this code calls.
"""

from __future__ import annotations

import numpy as np

from ..engine.kernel_code import jit, store, vector_jit, widen, written_beyond_range


@vector_jit
def scaled_product_kernel(a, b, norm_a, norm_b, out):
    """out[i] = (a[i] / norm_a) · (b[i] / norm_b) in float32, each operation rounded as torch rounds it (SLERP's
    normalised dot product, summed by the caller: ``kernels.TorchSum``, or torch where that emulation is not exact).
    Vector code: no zero-division branch (the norms are never 0) and no index offset, whose wraparound check would
    make every load a gather."""
    for i in range(out.size):
        out[i] = (np.float32(widen(a[i])) / norm_a) * (np.float32(widen(b[i])) / norm_b)


@jit
def combine_pair_kernel(a, b, coef_a, coef_b, eps, block, out):
    """out[i] = coef_a · a[i] + coef_b · b[i] in float32 (two products, one sum, each rounded), rounded once to
    out's dtype, ``block`` elements at a time; returns how many blocks hold a τ = b[i] − a[i] that is not finite
    (the merge must refuse it), how many hold a value beyond out's dtype (each checked just after it is written,
    ``written_beyond_range``, so the writer need not read the output again), and how many |τ| > ``eps`` (float32:
    the report's update count, as ``kernel_code.pattern_run`` compares, so no pass of its own)."""
    bad = 0
    over = 0
    updated = 0
    n = a.size
    for start in range(0, n, block):
        stop = min(n, start + block)
        nonfinite = np.int32(0)
        moved = np.int32(0)
        for i in range(start, stop):
            j = np.uint64(i)  # unsigned: a signed index gets a wraparound check that stops the loop vectorising
            x = np.float32(widen(a[j]))
            y = np.float32(widen(b[j]))
            d = y - x
            nonfinite = np.int32(nonfinite | np.int32(d - d != 0))  # an OR, not a branch: the loop vectorises
            moved = np.int32(moved + np.int32(abs(d) > eps))  # int32 within a block (numba widens int sums)
            store(out, j, coef_a * x + coef_b * y)
        if nonfinite != 0:
            bad += 1
        if written_beyond_range(out[start:stop], stop - start):
            over += 1
        updated += moved
    return bad, over, updated
