"""The numba code of Model Stock's fused combination and offset products (``model_stock.stock_combine``,
``model_stock.offset_products``).

Imported lazily (it imports numba); numba caches the compiled code next to this file, as it does for
``engine.kernel_code``, whose helpers this code calls.
"""

from __future__ import annotations

import numpy as np

from ..engine.kernel_code import jit, pattern_histogram, pattern_run, store, vector_jit, widen, written_beyond_range


@vector_jit
def stock_combine_kernel(base, agents, t, one_minus_t, n, block, out, eps, pattern, hist, want_hist):
    """Model Stock's θ: out[i] = t · ((0 + w_1 + … + w_N) / n) + (1 − t) · w_0 in float32, each operation rounded
    in that order, rounded once to out's dtype, ``block`` elements at a time; returns how many blocks hold a value
    beyond out's dtype (each checked just after it is written, ``written_beyond_range``). With ``want_hist`` also
    each block's update patterns (``pattern_run`` at float32 ``eps``, into ``pattern``, a block long) added to
    ``hist`` (``pattern_histogram``) while the block is in cache: the report's counts without a pass of their own.
    Vector code: ``n`` (the agents' count) is never 0, so the division needs no zero check."""
    over = 0
    size = base.size
    for start in range(0, size, block):
        stop = min(size, start + block)
        for i in range(start, stop):
            j = np.uint64(i)  # unsigned: a signed index gets a wraparound check that stops the loop vectorising
            total = np.float32(0.0)
            for k in range(len(agents)):
                total = total + np.float32(widen(agents[k][j]))
            store(out, j, t * (total / n) + one_minus_t * np.float32(widen(base[j])))
        if written_beyond_range(out[start:stop], stop - start):
            over += 1
        if want_hist:
            pattern_run(base, agents, start, stop - start, eps, pattern)
            pattern_histogram(pattern, stop - start, len(agents), hist)
    return over


@jit
def offset_product_kernel(base, a, b, out):
    """out[i] = (a[i] − base[i]) · (b[i] − base[i]) in float32, each operation rounded (two offsets' products,
    summed by the caller with torch or ``kernels.TorchSum``)."""
    for i in range(base.size):
        x = np.float32(widen(base[i]))
        out[i] = (np.float32(widen(a[i])) - x) * (np.float32(widen(b[i])) - x)
