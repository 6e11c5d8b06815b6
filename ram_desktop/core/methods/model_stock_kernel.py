"""The numba code of Model Stock's fused combination and offset products (``model_stock.stock_combine``,
``model_stock.offset_products``).

Imported lazily (it imports numba); numba caches the compiled code next to this file, as it does for
``engine.kernel_code``, whose helpers this code calls.
"""

from __future__ import annotations

import numpy as np

from ..engine.kernel_code import NORM_LANES, jit, store, widen


@jit
def stock_combine_kernel(base, agents, t, one_minus_t, n, out):
    """Model Stock's θ: out[i] = t · ((0 + w_1 + … + w_N) / n) + (1 − t) · w_0 in float32, each operation rounded
    in that order, rounded once to out's dtype."""
    for i in range(base.size):
        total = np.float32(0.0)
        for k in range(len(agents)):
            total = total + np.float32(widen(agents[k][i]))
        store(out, i, t * (total / n) + one_minus_t * np.float32(widen(base[i])))


@jit
def offset_product_kernel(base, a, b, out):
    """out[i] = (a[i] − base[i]) · (b[i] − base[i]) in float32, each operation rounded (two offsets' products,
    summed by the caller with torch or ``kernels.TorchSum``)."""
    for i in range(base.size):
        x = np.float32(widen(base[i]))
        out[i] = (np.float32(widen(a[i])) - x) * (np.float32(widen(b[i])) - x)


@jit
def offset_norm_kernel(base, agent, lanes, tail):
    """The parts of torch's 2-norm of the offset w − w₀ (float32, each rounded) over the whole tensor, for
    ``kernel_code.norm_finish``: ``lanes`` [8], ``tail`` [8]; returns how many offsets are not finite. (The
    eight lanes are locals, so they stay in registers.)"""
    n = base.size
    vectors_end = n - n % NORM_LANES
    bad = 0
    l0, l1, l2, l3, l4, l5, l6, l7 = lanes[0], lanes[1], lanes[2], lanes[3], lanes[4], lanes[5], lanes[6], lanes[7]
    for v in range(0, vectors_end, NORM_LANES):
        d0 = np.float32(widen(agent[v])) - np.float32(widen(base[v]))
        d1 = np.float32(widen(agent[v + 1])) - np.float32(widen(base[v + 1]))
        d2 = np.float32(widen(agent[v + 2])) - np.float32(widen(base[v + 2]))
        d3 = np.float32(widen(agent[v + 3])) - np.float32(widen(base[v + 3]))
        d4 = np.float32(widen(agent[v + 4])) - np.float32(widen(base[v + 4]))
        d5 = np.float32(widen(agent[v + 5])) - np.float32(widen(base[v + 5]))
        d6 = np.float32(widen(agent[v + 6])) - np.float32(widen(base[v + 6]))
        d7 = np.float32(widen(agent[v + 7])) - np.float32(widen(base[v + 7]))
        l0, l1, l2, l3 = l0 + d0 * d0, l1 + d1 * d1, l2 + d2 * d2, l3 + d3 * d3
        l4, l5, l6, l7 = l4 + d4 * d4, l5 + d5 * d5, l6 + d6 * d6, l7 + d7 * d7
        finite = (d0 - d0) + (d1 - d1) + (d2 - d2) + (d3 - d3) + (d4 - d4) + (d5 - d5) + (d6 - d6) + (d7 - d7)
        bad += np.int64(finite != 0)  # 0, or NaN where any offset is inf or NaN
    lanes[0], lanes[1], lanes[2], lanes[3], lanes[4], lanes[5], lanes[6], lanes[7] = l0, l1, l2, l3, l4, l5, l6, l7
    for e in range(vectors_end, n):
        d = np.float32(widen(agent[e])) - np.float32(widen(base[e]))
        tail[e - vectors_end] = d
        bad += np.int64(d - d != 0)
    return bad
