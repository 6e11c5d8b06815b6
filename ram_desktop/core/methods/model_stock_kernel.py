"""The numba code of Model Stock's fused combination and offset products (``model_stock.stock_combine``,
``model_stock.offset_products``).

Imported lazily (it imports numba); numba caches the compiled code next to this file, as it does for
``engine.kernel_code``, whose helpers this code calls.
"""

from __future__ import annotations

import numpy as np

from ..engine.kernel_code import jit, store, widen


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
