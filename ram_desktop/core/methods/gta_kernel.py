"""The numba code of the weighted task arithmetic family's fused combination (``gta.gta_combine``) and DELLA's
keep mask (``gta.della_mask``).

Imported lazily (it imports numba); numba caches the compiled code next to this file, as it does for
``engine.kernel_code``, whose helpers this code calls.
"""

from __future__ import annotations

import numpy as np

from ..engine.kernel_code import jit
from .baselines_kernel import dare_uniform_block


@jit
def della_mask_kernel(bits, row0, c0, eps, ka, kb, mask, idx, key, idx2, key2, counts):
    """DELLA's keep mask of float32 rows [R, W] (W ≥ 2; ``bits``: their uint32 bits), as ``gta.della_magprune``'s torch loop gives it:
    each row's elements ranked by magnitude (a stable LSD radix sort of the |x| bits: ties in index order, as
    a stable argsort), rank_norm = (rank − 1)/(W − 1), p = c0 + (rank_norm · 2) · eps in float32, and
    position i = (row0 + r)·W + j kept where the seeded hash u(i) < ⌊p·2³²⌋."""
    n_rows, width = bits.shape
    span = np.float32(width) - np.float32(1.0)
    thresholds = np.empty(width, np.int64)  # per rank: the same for every row of this width
    for k in range(width):
        rank_norm = (np.float32(k + 1) - np.float32(1.0)) / span
        prob = c0 + (rank_norm * np.float32(2.0)) * eps
        thresholds[k] = np.int64(np.floor(np.float64(prob) * 4294967296.0))
    hashes = np.empty(width, np.uint32)
    digit_counts = np.empty((4, 256), np.int64)
    for r in range(n_rows):
        dare_uniform_block((row0 + r) * width, width, ka, kb, hashes)
        # keys, and every digit's counts in one read; a digit the same for the whole row keeps the order
        digit_counts[:] = 0
        varying = np.uint32(0)
        first_key = bits[r, 0] & np.uint32(0x7FFFFFFF)
        for j in range(width):
            k32 = bits[r, j] & np.uint32(0x7FFFFFFF)
            idx[j] = j
            key[j] = k32
            varying |= k32 ^ first_key
            digit_counts[0, k32 & np.uint32(0xFF)] += 1
            digit_counts[1, (k32 >> np.uint32(8)) & np.uint32(0xFF)] += 1
            digit_counts[2, (k32 >> np.uint32(16)) & np.uint32(0xFF)] += 1
            digit_counts[3, k32 >> np.uint32(24)] += 1
        src_idx, src_key, dst_idx, dst_key = idx, key, idx2, key2
        for pass_ in range(4):
            shift = np.uint32(8 * pass_)
            if (varying >> shift) & np.uint32(0xFF) == 0:
                continue
            total = 0
            for d in range(256):
                c = digit_counts[pass_, d]
                counts[d] = total
                total += c
            for j in range(width):
                d = (src_key[j] >> shift) & np.uint32(0xFF)
                p = counts[d]
                dst_idx[p] = src_idx[j]
                dst_key[p] = src_key[j]
                counts[d] = p + 1
            src_idx, dst_idx = dst_idx, src_idx
            src_key, dst_key = dst_key, src_key
        for k in range(width):
            j = src_idx[k]
            mask[r, j] = np.float32(1.0) if np.int64(hashes[j]) < thresholds[k] else np.float32(0.0)


@jit
def gta_combine_kernel(deltas, weights, base, consensus, normalize, scale, use_scale, out):
    """The weighted task arithmetic family's combination (``gta.gta_merge`` after sparsification), per element
    in float32 in torch's order: v_t = δ_t·w_t; with ``consensus`` the majority sign of 0 + v_0 + v_1 + …
    (≥ 0 is +) keeps the v_t of that sign (v_t·[kept]) and the divisor is 0 + w_0·[kept_0] + … (0 → 1), without
    it the divisor is 0 + w_0 + w_1 + … (|·| < 1e-8 → 1); the sum 0 + … over the agents, ÷ divisor with
    ``normalize``, × scale with ``use_scale``, then out[i] = base[i] + sum."""
    n_agents = deltas.shape[0]
    plain_divisor = np.float32(0.0)
    for t in range(n_agents):
        plain_divisor = plain_divisor + weights[t]
    if abs(plain_divisor) < np.float32(1e-8):
        plain_divisor = np.float32(1.0)
    for i in range(base.size):
        total = np.float32(0.0)
        if consensus:
            votes = np.float32(0.0)
            for t in range(n_agents):
                votes = votes + deltas[t, i] * weights[t]
            majority = np.float32(1.0) if votes >= np.float32(0.0) else np.float32(-1.0)
            divisor = np.float32(0.0)
            for t in range(n_agents):
                v = deltas[t, i] * weights[t]
                sign = np.float32(1.0) if v > 0 else (np.float32(-1.0) if v < 0 else np.float32(0.0))
                kept = np.float32(1.0) if sign == majority else np.float32(0.0)
                total = total + v * kept
                divisor = divisor + weights[t] * kept
            if divisor == np.float32(0.0):
                divisor = np.float32(1.0)
        else:
            for t in range(n_agents):
                total = total + deltas[t, i] * weights[t]
            divisor = plain_divisor
        if normalize:
            total = total / divisor
        if use_scale:
            total = total * scale
        out[i] = base[i] + total
