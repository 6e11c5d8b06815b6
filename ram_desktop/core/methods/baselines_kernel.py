"""The numba code of the fused Average, Task Arithmetic, TIES, DARE-TA and DARE-TIES merges and TIES's radix-select digit histograms,
called by ``baselines.dare_merge_into``, ``ties_digit_counts`` and ``ties_merge_into``. DARE's counter-based
hash (``dare_uniform_block``) also draws DELLA's keep decisions (``gta_kernel``).

Imported lazily (it imports numba); numba caches the compiled code next to this file, as it does for
``engine.kernel_code``, whose helpers this code calls.
"""

from __future__ import annotations

import numpy as np

from ..engine.kernel_code import histogram_block, jit, store, widen, written_beyond_range


@jit
def mix32(x):
    """lowbias32 (Wellons) in uint32 arithmetic: every product wraps mod 2³², so the loops that
    call it vectorise on 32-bit lanes."""
    x = x ^ (x >> np.uint32(16))
    x = np.uint32(x * np.uint32(0x7FEB352D))
    x = x ^ (x >> np.uint32(15))
    x = np.uint32(x * np.uint32(0x846CA68B))
    return np.uint32(x ^ (x >> np.uint32(16)))


@jit
def dare_uniform_block(first, length, ka, kb, u):
    """u[j] = mix32(mix32((i mod 2³²) XOR a) XOR (i div 2³²) XOR b) for the flat positions
    i = first + j, as ``baselines.dare_uniform``. Its own loop: fused with the merge's float work the
    hash did not vectorise (measured 5–6× slower)."""
    a = np.uint32(ka)
    for j in range(length):
        i = first + j
        u[j] = mix32(mix32(np.uint32(i & 0xFFFFFFFF) ^ a) ^ np.uint32(((i >> 32) ^ kb) & 0xFFFFFFFF))


@jit
def elect_store(o, values, total, xb, length, nagents, zero, one, scale, acc, count):
    """TIES's sign election and disjoint mean of one block, as ``baselines.elect_disjoint_mean``: the sign
    of Σ_t v_t (``total``, ≥ 0 is +), the mean of the values agreeing with it (summed in agent order
    from +0, ÷ max(1, count); zeros never agree), ·λ, plus the base, rounded once into ``o``. Loops run
    agent by agent over the block (``acc``, ``count`` are block buffers), so each one vectorises."""
    for j in range(length):
        acc[j] = zero
        count[j] = zero
    for t in range(nagents):
        v_t = values[t]
        for j in range(length):
            v = v_t[j]
            agree = (v if total[j] >= zero else -v) > zero  # negation is exact; zeros never agree
            acc[j] = acc[j] + (v if agree else zero)
            count[j] = count[j] + (one if agree else zero)
    for j in range(length):
        c = count[j]
        store(o, j, xb[j] + (acc[j] / (max(one, c))) * scale)


@jit
def sum_kernel(base, agents, scale, divide, out, xb, total):
    """θ = base + (Σ_t τ_t from +0, in agent order) · λ (``divide`` False: Task Arithmetic) or ÷ N (``divide``
    True, ``scale`` = N: Average), rounded once into ``out``, as ``baselines.task_arithmetic_merge`` and
    ``average_merge`` compute it. Returns the number of blocks with a non-finite τ and the number of blocks with a
    merged value beyond out's dtype (``written_beyond_range``)."""
    n = base.shape[0]
    block = xb.shape[0]
    zero = scale - scale
    bad_blocks = 0
    over_blocks = 0
    for start in range(0, n, block):
        length = min(block, n - start)
        b = base[start : start + length]
        bad = np.int32(0)
        for j in range(length):
            xb[j] = widen(b[j])
            total[j] = zero
        for t in range(len(agents)):
            a = agents[t][start : start + length]
            for j in range(length):
                tau = widen(a[j]) - xb[j]
                bad |= np.int32(tau - tau != zero)
                total[j] = total[j] + tau
        if bad != 0:
            bad_blocks += 1
        o = out[start : start + length]
        if divide:
            for j in range(length):
                store(o, j, xb[j] + total[j] / scale)
        else:
            for j in range(length):
                store(o, j, xb[j] + total[j] * scale)
        if written_beyond_range(o, length):
            over_blocks += 1
    return bad_blocks, over_blocks


@jit
def dare_kernel(
    base, agents, first, keys_a, keys_b, threshold, keep_scale, scale, ties, out, xb, total, values, acc, count, u
):
    """θ = base + DARE-TA (``ties`` False) or DARE-TIES merged task vector, rounded once into ``out``,
    as ``methods.baselines`` computes them: per agent, u = mix32(mix32((i mod 2³²) XOR a_t) XOR
    (i div 2³²) XOR b_t) for the flat position i = first + k, kept where u ≥ threshold as τ / (1 − p)
    (``keep_scale``), else +0; TA: (Σ_t from +0)·λ; TIES: sign of the sum (≥ 0 is +), the mean of the
    values agreeing with it (÷ max(1, count)), ·λ. ``u`` is a uint32 block buffer for the hashes.
    Returns the number of blocks with a non-finite τ."""
    n = base.shape[0]
    block = xb.shape[0]
    zero = keep_scale - keep_scale
    one = zero + np.float32(1)
    bad_blocks = 0
    for start in range(0, n, block):
        length = min(block, n - start)
        b = base[start : start + length]
        bad = np.int32(0)
        for j in range(length):
            xb[j] = widen(b[j])
            total[j] = zero
        for t in range(len(agents)):
            a = agents[t][start : start + length]
            ka = keys_a[t]
            kb = keys_b[t]
            v_t = values[t]
            dare_uniform_block(first + start, length, ka, kb, u)
            for j in range(length):
                tau = widen(a[j]) - xb[j]
                bad |= np.int32(tau - tau != zero)
                v = tau / keep_scale if np.int64(u[j]) >= threshold else zero
                v_t[j] = v
                total[j] = total[j] + v
        if bad != 0:
            bad_blocks += 1
        o = out[start : start + length]
        if not ties:
            for j in range(length):
                store(o, j, xb[j] + total[j] * scale)
            continue
        elect_store(o, values, total, xb, length, len(agents), zero, one, scale, acc, count)
    return bad_blocks


@jit
def magnitude_key(tau, key64):
    """|τ| as an integer that orders like the magnitude (``baselines.magnitude_bits``): the IEEE bits of
    |τ| as float32, or as float64 (``key64``; a float32 τ widens exactly)."""
    if key64:
        return np.float64(abs(tau)).view(np.int64)
    return np.int64(np.float32(abs(tau)).view(np.uint32))


@jit
def ties_digits_kernel(base, agents, one, key64, shift, level0, prefixes, hist, xb, digits):
    """TIES's radix-select histogram of one slice (``baselines.TrimCollector``): per agent t, hist[t, k, d] += 1
    for each element whose magnitude key has digit d = (key >> shift) & 0xFFFF and, past the top level
    (``level0`` False), whose higher bits equal ``prefixes[t]``; the others count in the extra column
    65536. Per block, the digits are computed first (a loop without branches, which vectorises), then
    counted into four interleaved rows k (neighbours often share a digit; one row would make each
    increment wait for the previous one), which the caller sums. Returns the number of blocks with a
    non-finite τ."""
    n = base.shape[0]
    block = xb.shape[0]
    zero = one - one
    other = np.int64(1 << 16)  # the column of the elements off the prefix
    bad_blocks = 0
    for start in range(0, n, block):
        length = min(block, n - start)
        b = base[start : start + length]
        bad = np.int32(0)
        for j in range(length):
            xb[j] = widen(b[j])
        for t in range(len(agents)):
            a = agents[t][start : start + length]
            h = hist[t]
            prefix = prefixes[t]
            for j in range(length):
                tau = widen(a[j]) - xb[j]
                bad |= np.int32(tau - tau != zero)
                key = magnitude_key(tau, key64)
                if level0:
                    digits[j] = np.int32(key >> shift)
                else:
                    digit = (key >> shift) & 0xFFFF
                    digits[j] = np.int32(digit if (key >> (shift + 16)) == prefix else other)
            histogram_block(digits, length, h)
        if bad != 0:
            bad_blocks += 1
    return bad_blocks


@jit
def ties_kernel(base, agents, key64, cuts, left, scale, out, xb, total, values, acc, count):
    """θ = base + TIES merged task vector of one slice, rounded once into ``out``, as
    ``baselines.ties_merge``: agent t keeps τ where its magnitude key is above ``cuts[t]``, and the first
    ``left[t]`` elements of this slice whose key equals it (its share of the ties at the cut left after
    earlier chunks; ≤ 0: none), else +0; then the sign election and disjoint mean, ·λ. Returns the
    number of blocks with a non-finite τ."""
    n = base.shape[0]
    block = xb.shape[0]
    nagents = len(agents)
    zero = scale - scale
    one = zero + np.float32(1)
    ranks = np.zeros(nagents, np.int64)  # equal-to-cut elements met so far in this slice, per agent
    bad_blocks = 0
    for start in range(0, n, block):
        length = min(block, n - start)
        b = base[start : start + length]
        bad = np.int32(0)
        for j in range(length):
            xb[j] = widen(b[j])
            total[j] = zero
        for t in range(nagents):
            a = agents[t][start : start + length]
            cut = cuts[t]
            v_t = values[t]
            if left[t] <= 0:  # no tie at the cut is kept here: a plain threshold (vectorises)
                for j in range(length):
                    tau = widen(a[j]) - xb[j]
                    bad |= np.int32(tau - tau != zero)
                    v = tau if magnitude_key(tau, key64) > cut else zero
                    v_t[j] = v
                    total[j] = total[j] + v
                continue
            quota = left[t]
            rank = ranks[t]
            for j in range(length):
                tau = widen(a[j]) - xb[j]
                bad |= np.int32(tau - tau != zero)
                key = magnitude_key(tau, key64)
                equal = key == cut
                rank += np.int64(equal)
                v = tau if (key > cut) or (equal and rank <= quota) else zero
                v_t[j] = v
                total[j] = total[j] + v
            ranks[t] = rank
        if bad != 0:
            bad_blocks += 1
        elect_store(out[start : start + length], values, total, xb, length, nagents, zero, one, scale, acc, count)
    return bad_blocks
