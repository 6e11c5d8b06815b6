"""The numba code of RAM / RAM+'s fused merge (equation 7, the pattern histogram and RAM+'s rescale survival
counts), called by ``ram.selective_merge_into``.

Imported lazily (it imports numba); numba caches the compiled code next to this file, as it does for
``engine.kernel_code``, whose helpers this code calls.
"""

from __future__ import annotations

import numpy as np

from ..engine.kernel_code import (
    encoded,
    inlined_jit,
    jit,
    like,
    pattern_histogram,
    same_value,
    widen,
    written_beyond_range,
)


@inlined_jit
def agent_updates(agents, i, x, eps, one):
    """Element i, base value x: s = Σ_t [m_t]·τ_t (agent order, from +0; × 0 or 1 is exact: τ or ±0, as the torch
    path), the update pattern, c the number of agents updating, and 1 where some τ is NaN or ±inf (τ − τ is then
    NaN). Inlined into the element loops of ``merge_run`` and ``shared_run``, which keep them vector code."""
    zero = eps - eps
    s = zero
    p = np.int32(0)
    c = np.int32(0)
    bad = np.int32(0)
    for t in range(len(agents)):
        v = like(eps, widen(agents[t][i])) - x
        m = abs(v) > eps
        s = s + v * (one if m else zero)
        p = np.int32(p | (np.int32(1 << t) if m else np.int32(0)))
        c = np.int32(c + (np.int32(1) if m else np.int32(0)))
        bad = np.int32(bad | (np.int32(1) if v - v != zero else np.int32(0)))
    return s, p, c, bad


@inlined_jit
def write_merged(o, j, x, s, p, c, agents, lams, moved_bit):
    """o[j] = round(x + s') once to o's dtype (``encoded``): s' = s·λ_t where only agent t updates (``lams``;
    None: RAM, no factor), else s / max(1, c) (÷1 is exact). Returns the pattern p, plus ``moved_bit`` (None: not
    computed) where the written value differs from the RAM value round(x + s). ``agents`` only for their number,
    known when compiling, so the λ loop unrolls and the caller's element loop vectorises. Inlined into
    ``merge_run`` and ``variant_run``."""
    scaled = s
    if lams is not None:
        for t in range(len(agents)):
            product = scaled * lams[t]  # loaded outside the select: a load only where p = 2^t is a gather
            scaled = product if p == np.int32(1 << t) else scaled
    divisor = np.float32(max(1, c))  # a constant type, not eps's: the loop vectorises
    written = encoded(o, x + scaled / divisor)
    o[j] = written
    if moved_bit is not None:
        moved = not same_value(o, encoded(o, x + s), written)
        p = np.int32(p | (moved_bit if moved else np.int32(0)))
    return p


@jit
def merge_run(base, agents, start, length, eps, one, lams, moved_bit, o, pattern):
    """o[j] = round(x + s') for the elements start + j, j < length, all agents per element: x the base,
    s = Σ_t [m_t]·τ_t (agent order, from +0), s' = s·λ_t where only agent t updates (``lams``; None: RAM,
    no factor), else s / max(1, c) with c the number of agents updating (÷1 is exact), rounded once to
    o's dtype (``encoded``). pattern[j] = the update pattern, plus ``moved_bit`` (None: not computed) where
    the written value differs from the RAM value round(x + s). Returns False when some τ is NaN or ±inf.
    ``lams`` and ``moved_bit`` may be None so that numba compiles one loop per case (no branch inside)."""
    first = np.uint64(start)
    bad = np.int32(0)
    for j in range(length):
        i = first + np.uint64(j)
        x = like(eps, widen(base[i]))
        s, p, c, flagged = agent_updates(agents, i, x, eps, one)
        bad = np.int32(bad | flagged)
        pattern[j] = write_merged(o, j, x, s, p, c, agents, lams, moved_bit)
    return bad == 0


@jit
def merge_kernel(base, agents, eps, one, lams, use_lam, out, hist, want_hist, surv, want_surv, pattern):
    """Pass 2: θ = base + equation 7, rounded once into ``out``.

    As ``methods.selective_merge``: s = Σ_t τ_t·[m_t] (agent order, from +0), then s·λ_t where
    only agent t updates (RAM+, ``lams`` rounded to the compute dtype; RAM: no factor, as ×1 is exact)
    and ÷ max(1, c); dividing by 1 is exact, so this is λ_t·τ_t, s / c and +0 bit for bit. Returns
    the number of blocks with a NaN or ±inf τ and the number of blocks with a merged value beyond out's dtype
    (±Inf or NaN written; ``written_beyond_range``). Optionally the pattern histogram (a merge that needed no
    probe first) and the exact rescale survival ``surv[0, t]`` / ``surv[1, t]``: agent t's unique
    elements whose rounded value the rescale changed / all its unique elements
    (``ram_rescale.rescale_changes``). Works a block of ``pattern`` at a time."""
    n = base.shape[0]
    block = pattern.shape[0]
    nagents = len(agents)
    moved_bit = np.int32(1 << nagents)
    bad = 0
    over = 0
    for start in range(0, n, block):
        length = min(block, n - start)
        o = out[start : start + length]
        if use_lam and want_surv:
            ok = merge_run(base, agents, start, length, eps, one, lams, moved_bit, o, pattern)
        elif use_lam:
            ok = merge_run(base, agents, start, length, eps, one, lams, None, o, pattern)
        elif want_surv:
            ok = merge_run(base, agents, start, length, eps, one, None, moved_bit, o, pattern)
        else:
            ok = merge_run(base, agents, start, length, eps, one, None, None, o, pattern)
        if not ok:
            bad += 1
        if written_beyond_range(o, length):
            over += 1
        if want_hist:
            pattern_histogram(pattern, length, nagents, hist)
        if want_surv:
            count_moved(pattern, length, nagents, surv)
    return bad, over


@jit
def count_moved(pattern, length, nagents, surv):
    """surv[0, t] += agent t's unique elements flagged as moved, surv[1, t] += all its unique elements
    (int32 counters within a block, cast back after each add, as numba widens int32 sums to int64: the
    loops vectorise on 32-bit lanes, 3× faster)."""
    for t in range(nagents):
        unique = np.int32(1 << t)
        flagged = np.int32((1 << t) | (1 << nagents))
        u = np.int32(0)
        mv = np.int32(0)
        for j in range(length):
            p = pattern[j]
            u = np.int32(u + (np.int32(1) if p == unique else np.int32(0)))
            mv = np.int32(mv + (np.int32(1) if p == flagged else np.int32(0)))
        surv[0, t] += mv
        surv[1, t] += u + mv


@jit
def shared_run(base, agents, start, length, eps, one, xs, sums, pattern, counts):
    """What every RAM-family variant of a block shares, as ``merge_run`` forms it: per element start + j the base
    x (``xs``), s = Σ_t [m_t]·τ_t (``sums``), the update pattern and c, the number of agents updating
    (``counts``). Returns False when some τ is NaN or ±inf."""
    first = np.uint64(start)
    bad = np.int32(0)
    for j in range(length):
        i = first + np.uint64(j)
        x = like(eps, widen(base[i]))
        s, p, c, flagged = agent_updates(agents, i, x, eps, one)
        bad = np.int32(bad | flagged)
        xs[j] = x
        sums[j] = s
        pattern[j] = p
        counts[j] = c
    return bad == 0


@jit
def variant_run(agents, xs, sums, pattern, counts, length, lams, moved_bit, o, moved):
    """One variant's values from ``shared_run``'s block, as ``merge_run`` writes them (``write_merged``; ``lams``
    None: RAM); with ``moved_bit``, ``moved`` the pattern with that bit where the value differs from RAM's."""
    for j in range(length):
        marked = write_merged(o, j, xs[j], sums[j], pattern[j], counts[j], agents, lams, moved_bit)
        if moved_bit is not None:
            moved[j] = marked


@jit
def merge_group_kernel(
    base, agents, eps, one, lams, use_lam, outs, hist, want_hist, surv, want_surv, xs, sums, pattern, counts, moved
):
    """``merge_kernel`` for several RAM-family variants of one slice at once (``outs``: a tuple, an output per
    variant; ``lams`` [K, N], ``use_lam`` [K]: RAM+ λ or RAM; ``surv`` [K, 2, N], ``want_surv`` [K]): each block's
    τ, masks and counts formed once (``shared_run``), then every variant's value written from them, the same bits
    as ``merge_kernel`` gives each. Returns the blocks with a τ that is not finite and, per variant, the blocks
    holding a value beyond out's dtype."""
    n = base.shape[0]
    block = pattern.shape[0]
    nagents = len(agents)
    moved_bit = np.int32(1 << nagents)
    bad = 0
    over = np.zeros(len(outs), np.int64)
    for start in range(0, n, block):
        length = min(block, n - start)
        if not shared_run(base, agents, start, length, eps, one, xs, sums, pattern, counts):
            bad += 1
        if want_hist:
            pattern_histogram(pattern, length, nagents, hist)
        for k in range(len(outs)):
            o = outs[k][start : start + length]
            if use_lam[k] and want_surv[k]:
                variant_run(agents, xs, sums, pattern, counts, length, lams[k], moved_bit, o, moved)
            elif use_lam[k]:
                variant_run(agents, xs, sums, pattern, counts, length, lams[k], None, o, moved)
            elif want_surv[k]:
                variant_run(agents, xs, sums, pattern, counts, length, None, moved_bit, o, moved)
            else:
                variant_run(agents, xs, sums, pattern, counts, length, None, None, o, moved)
            if written_beyond_range(o, length):
                over[k] += 1
            if want_surv[k]:
                count_moved(moved, length, nagents, surv[k])
    return bad, over
