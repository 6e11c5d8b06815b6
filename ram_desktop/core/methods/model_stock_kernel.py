"""The numba code of Model Stock's fused combination (``model_stock.stock_combine``).

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
