"""The numba code of the fused CPU kernels (see ``kernels.py``, which imports this module lazily).

Module-level functions with ``cache=True``: numba keeps the compiled machine code next to this file
(or in ``NUMBA_CACHE_DIR``), so only the first run on a machine pays for compiling.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import numba
import numpy as np
from numba.core import types
from numba.extending import overload

if TYPE_CHECKING:
    _F = TypeVar("_F", bound=Callable[..., Any])

    def jit(function: _F) -> _F:
        """For the type checker: a compiled kernel is called with its Python signature (numba's stubs type the
        dispatcher's ``__call__`` as taking no arguments)."""
        return function

    vector_jit = jit
else:
    jit = functools.partial(numba.njit, nogil=True, cache=True)


@jit
def half_to_float(h):
    """float16 bits → float32, exact, with selects only (no loop over a subnormal's leading zeros) on
    32-bit integers (each result cast back: numba widens integer arithmetic to 64 bits), so loops widening
    float16 vectorise: a subnormal is its significand times 2^−24, exact in float32."""
    u = np.uint32(np.uint16(h))
    sign = np.uint32((u & np.uint32(0x8000)) << np.uint32(16))
    em = np.uint32(u & np.uint32(0x7FFF))  # exponent and significand
    e = np.uint32(em >> np.uint32(10))
    shifted = np.uint32(em << np.uint32(13))
    normal = np.uint32(shifted + np.uint32(112 << 23))  # rebias the exponent
    tiny = np.float32(np.float32(np.int32(em)) * np.float32(5.960464477539063e-08)).view(np.uint32)
    special = np.uint32(shifted | np.uint32(0x7F800000))  # ±inf, NaN (payload kept)
    bits = special if e == np.uint32(0x1F) else (tiny if e == np.uint32(0) else normal)
    return np.uint32(sign | bits).view(np.float32)


@jit
def bf16_to_float(h):
    return np.uint32(np.int64(h) << 16).view(np.float32)


def widen(v):  # pragma: no cover - replaced by the overload in compiled code
    raise NotImplementedError


@overload(widen)
def _widen(v):
    """The compute value of one stored element: bfloat16 bits arrive as uint16, float16 bits as
    int16 (so the dtype is known when compiling), other floats as themselves."""
    if v == types.uint16:
        return lambda v: bf16_to_float(v)
    if v == types.int16:
        return lambda v: half_to_float(v)
    return lambda v: v


@jit
def float_to_bf16(x):
    """float32 → bfloat16 bits, round to nearest even (NaN → 0x7FC0, as torch)."""
    if x != x:  # noqa: PLR0124  NaN (numba compiles the self-compare to one instruction)
        return np.int64(0x7FC0)
    u = np.int64(np.float32(x).view(np.uint32))
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


@jit
def float_to_half(x):
    """float32 → float16 bits, round to nearest even, overflow to ±inf (NaN → sign | 0x7E00, as torch),
    with selects only on 32-bit lanes (as ``half_to_float``), so loops storing float16 vectorise. Normal
    results: rebias and round 23 → 10 significand bits on the integer bits; from 65520 on (the tie
    between 65504 and 2^16 rounds to even) ±inf; below the smallest normal the number of 2^−24 units,
    rounded by ``rint`` (half to even; the scaling by 2^24 is exact), 1024 of them being the smallest normal."""
    f = np.float32(x)
    u = f.view(np.uint32)
    sign = np.uint32((u >> np.uint32(16)) & np.uint32(0x8000))
    a = np.uint32(u & np.uint32(0x7FFFFFFF))
    odd = np.uint32((a >> np.uint32(13)) & np.uint32(1))
    rebiased = np.uint32(a - np.uint32(0x38000000))  # wraps below 2^−14, where tiny is taken instead
    normal = np.uint32(np.uint32(rebiased + np.uint32(np.uint32(0xFFF) + odd)) >> np.uint32(13))
    tiny = np.uint32(np.int32(np.rint(min(abs(f), np.float32(1.0)) * np.float32(16777216.0))))
    body = np.uint32(0x7C00) if a >= np.uint32(0x477FF000) else (normal if a >= np.uint32(0x38800000) else tiny)
    return np.int64(np.uint32(sign | (np.uint32(0x7E00) if a > np.uint32(0x7F800000) else body)))


def store(out, i, x):  # pragma: no cover
    raise NotImplementedError


@overload(store)
def _store(out, i, x):
    """Round the compute value x once to the output dtype (``encoded``) and store it at out[i]."""

    def impl(out, i, x):
        out[i] = encoded(out, x)

    return impl


def encoded(out, x):  # pragma: no cover
    raise NotImplementedError


@overload(encoded)
def _encoded(out, x):
    """x rounded once to out's dtype as ``store`` writes it: bfloat16 / float16 bits (uint16 / int16), or
    the float32 / float64 value (float64 → float32 first for float32, as torch's conversion does)."""
    if out.dtype == types.uint16:
        return lambda out, x: np.uint16(float_to_bf16(np.float32(x)))
    if out.dtype == types.int16:
        return lambda out, x: np.int16(float_to_half(np.float32(x)))
    if out.dtype == types.float32:
        return lambda out, x: np.float32(x)
    return lambda out, x: x


def same_value(out, a, b):  # pragma: no cover
    raise NotImplementedError


@overload(same_value)
def _same_value(out, a, b):
    """Whether two ``encoded`` values of out's dtype are equal as values (``==`` on the floats: +0 equals
    −0, NaN equals nothing). bfloat16 widens with a shift, so its floats are compared; float16 bits are
    compared directly (widening them costs more), on 32-bit lanes, without a branch."""
    if out.dtype == types.uint16:
        return lambda out, a, b: bf16_to_float(a) == bf16_to_float(b)
    if out.dtype == types.int16:

        def impl(out, a, b):
            ua = np.uint32(np.uint16(a))
            ub = np.uint32(np.uint16(b))
            ma = np.uint32(ua & np.uint32(0x7FFF))  # the magnitude bits; above 0x7C00: NaN
            mb = np.uint32(ub & np.uint32(0x7FFF))
            equal = (ua == ub) | (np.uint32(ma | mb) == np.uint32(0))
            return equal & (ma <= np.uint32(0x7C00))

        return impl
    return lambda out, a, b: a == b


@jit
def histogram_block(pattern, length, hist):
    """hist[k, p] += 1 for each element's pattern, four interleaved rows (no store-to-load stall)."""
    j = 0
    while j + 4 <= length:
        hist[0, pattern[j]] += 1
        hist[1, pattern[j + 1]] += 1
        hist[2, pattern[j + 2]] += 1
        hist[3, pattern[j + 3]] += 1
        j += 4
    while j < length:
        hist[0, pattern[j]] += 1
        j += 1


PACKED_MAX_AGENTS = 4  # up to 16 patterns: their counts fit two uint64 words of 8-bit fields
PACKED_RUN = 255  # elements per packed count: an 8-bit field never overflows


@jit
def pattern_histogram(pattern, length, nagents, hist):
    """hist[0, p] += the number of elements j < length whose pattern[j] & (2^N − 1) is p (bits above N,
    such as the merge's moved flag, are ignored).

    Up to ``PACKED_MAX_AGENTS`` agents, each element adds 1 << 8·(p mod 8) to one of two uint64 words (p < 8
    or not), over runs of at most 255 elements, and the 8-bit fields are added up after each run: integer
    adds in any order, so the loop vectorises (0.15 vs 0.55 ns per element for the scalar rows). More
    agents: four interleaved rows, as ``histogram_block``."""
    mask = np.int32((1 << nagents) - 1)
    if nagents > PACKED_MAX_AGENTS:
        j = 0
        while j + 4 <= length:
            hist[0, pattern[j] & mask] += 1
            hist[1, pattern[j + 1] & mask] += 1
            hist[2, pattern[j + 2] & mask] += 1
            hist[3, pattern[j + 3] & mask] += 1
            j += 4
        while j < length:
            hist[0, pattern[j] & mask] += 1
            j += 1
        return
    one = np.uint64(1)
    zero = np.uint64(0)
    for first in range(0, length, PACKED_RUN):
        run = pattern[first : min(first + PACKED_RUN, length)]
        low = zero
        high = zero
        for j in range(len(run)):
            p = run[j] & mask
            field = one << np.uint64(8 * (p & 7))
            low += field if p < 8 else zero
            high += zero if p < 8 else field
        for p in range(min(8, hist.shape[1])):
            hist[0, p] += np.int64((low >> np.uint64(8 * p)) & np.uint64(0xFF))
        for p in range(8, hist.shape[1]):
            hist[0, p] += np.int64((high >> np.uint64(8 * (p - 8))) & np.uint64(0xFF))


@jit
def pattern_run(base, agents, start, length, eps, pattern):
    """pattern[j] = Σ_t [|τ_t| > ε]·2^t for the elements start + j, j < length, all agents per element (no
    block buffers of τ or the base; element indices are unsigned, so numba adds no negative-index
    wrap-around and the loop vectorises). Returns False when some τ is NaN or ±inf (τ − τ is then NaN)."""
    zero = eps - eps
    first = np.uint64(start)
    bad = np.int32(0)
    for j in range(length):
        i = first + np.uint64(j)
        x = like(eps, widen(base[i]))
        p = np.int32(0)
        for t in range(len(agents)):
            v = like(eps, widen(agents[t][i])) - x
            p = np.int32(p | (np.int32(1 << t) if abs(v) > eps else np.int32(0)))  # int32 (numba widens | to int64)
            bad = np.int32(bad | (np.int32(1) if v - v != zero else np.int32(0)))  # int32: the reduction vectorises
        pattern[j] = p
    return bad == 0


@jit
def count_kernel(base, agents, eps, hist, pattern):
    """Pass 1: hist[k, p] += number of elements with update pattern p (summed over k by the
    caller), a block of ``pattern`` at a time. Returns the number of blocks with a NaN or ±inf τ (the
    caller then reports the tensor)."""
    n = base.shape[0]
    block = pattern.shape[0]
    bad = 0
    for start in range(0, n, block):
        length = min(block, n - start)
        if not pattern_run(base, agents, start, length, eps, pattern):
            bad += 1
        pattern_histogram(pattern, length, len(agents), hist)
    return bad


@jit
def merge_run(base, agents, start, length, eps, one, lams, moved_bit, o, pattern):
    """o[j] = round(x + s') for the elements start + j, j < length, all agents per element: x the base,
    s = Σ_t [m_t]·τ_t (agent order, from +0), s' = s·λ_t where only agent t updates (``lams``; None: RAM,
    no factor), else s / max(1, c) with c the number of agents updating (÷1 is exact), rounded once to
    o's dtype (``encoded``). pattern[j] = the update pattern, plus ``moved_bit`` (None: not computed) where
    the written value differs from the RAM value round(x + s). Returns False when some τ is NaN or ±inf.
    ``lams`` and ``moved_bit`` may be None so that numba compiles one loop per case (no branch inside)."""
    zero = eps - eps
    first = np.uint64(start)
    bad = np.int32(0)
    for j in range(length):
        i = first + np.uint64(j)
        x = like(eps, widen(base[i]))
        s = zero
        p = np.int32(0)
        c = np.int32(0)
        for t in range(len(agents)):
            v = like(eps, widen(agents[t][i])) - x
            m = abs(v) > eps
            s = s + v * (one if m else zero)  # × 0 or 1 is exact: τ or ±0, as the torch path
            p = np.int32(p | (np.int32(1 << t) if m else np.int32(0)))
            c = np.int32(c + (np.int32(1) if m else np.int32(0)))
            bad = np.int32(bad | (np.int32(1) if v - v != zero else np.int32(0)))
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
        pattern[j] = p
    return bad == 0


@jit
def merge_kernel(base, agents, eps, one, lams, use_lam, out, hist, want_hist, surv, want_surv, pattern):
    """Pass 2: θ = base + equation 7, rounded once into ``out``.

    As ``methods.selective_merge``: s = Σ_t τ_t·[m_t] (agent order, from +0), then s·λ_t where
    only agent t updates (RAM+, ``lams`` rounded to the compute dtype; RAM: no factor, as ×1 is exact)
    and ÷ max(1, c); dividing by 1 is exact, so this is λ_t·τ_t, s / c and +0 bit for bit. Returns
    the number of blocks with a NaN or ±inf τ. Optionally the pattern histogram (a merge that needed no
    probe first) and the exact rescale survival ``surv[0, t]`` / ``surv[1, t]``: agent t's unique
    elements whose rounded value the rescale changed / all its unique elements
    (``probe.rescale_changes``). Works a block of ``pattern`` at a time."""
    n = base.shape[0]
    block = pattern.shape[0]
    nagents = len(agents)
    moved_bit = np.int32(1 << nagents)
    bad = 0
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
        if want_hist:
            pattern_histogram(pattern, length, nagents, hist)
        if want_surv:
            count_moved(pattern, length, nagents, surv)
    return bad


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


# --- the Analyze probe: counts, signs, λ* survival keys and the ulp sample in one pass -------------


def like(x, v):  # pragma: no cover
    raise NotImplementedError


@overload(like)
def _like(x, v):
    """v converted to x's float type (widening a float32 to float64 is exact)."""
    if x == types.float32:
        return lambda x, v: np.float32(v)
    return lambda x, v: np.float64(v)


def float_bits(x):  # pragma: no cover
    raise NotImplementedError


@overload(float_bits)
def _float_bits(x):
    """The IEEE bits of a float32 / float64 as an int64."""
    if x == types.float32:
        return lambda x: np.int64(np.float32(x).view(np.uint32))
    return lambda x: np.float64(x).view(np.int64)


def power_of_two(x, e):  # pragma: no cover
    raise NotImplementedError


@overload(power_of_two)
def _power_of_two(x, e):
    """The float of x's type whose bits are the biased exponent e alone: 2^(e − bias)."""
    if x == types.float32:
        return lambda x, e: np.uint32(e << 23).view(np.float32)
    return lambda x, e: np.int64(e << 52).view(np.float64)


def exponent_layout(x):  # pragma: no cover
    raise NotImplementedError


@overload(exponent_layout)
def _exponent_layout(x):
    """(bias, shift, field mask) of the biased exponent of x's float type."""
    if x == types.float32:
        return lambda x: (127, 23, 0xFF)
    return lambda x: (1023, 52, 0x7FF)


if not TYPE_CHECKING:
    vector_jit = functools.partial(numba.njit, nogil=True, cache=True, error_model="numpy")  # no zero-division branch


@vector_jit
def step_bits(bits, up, sign_mask, inf_bits):
    """nextafter(v, ±inf) on the bits of a 16- or 32-bit float v that is not NaN, torch's (musl's) rule:
    ±inf toward itself stays, ±0 steps to the smallest subnormal of the target's sign, otherwise the bit
    pattern moves one unit away from zero (toward the target) or toward zero. Selects only, so loops
    calling it vectorise."""
    magnitude = bits & (sign_mask - 1)
    negative = (bits & sign_mask) != 0
    moved = bits - 1 if negative == up else bits + 1
    moved = (np.int64(1) if up else sign_mask | 1) if magnitude == 0 else moved
    return bits if (magnitude == inf_bits and negative != up) else moved


@vector_jit
def to_half_bits(f):
    """float32 (not NaN) → float16 bits, round to nearest even, overflow to ±inf: ``float_to_half``
    without branches. Below the smallest normal the result is the number of 2^−24 units, rounded by
    ``rint`` (round half to even; the scaling by 2^24 is exact), 1024 being the smallest normal."""
    u = np.int64(np.float32(f).view(np.uint32))
    sign = (u >> 16) & 0x8000
    a = u & 0x7FFFFFFF
    normal = ((a - 0x38000000) + 0xFFF + ((a >> 13) & 1)) >> 13
    tiny = np.int64(np.rint(min(abs(f), np.float32(1.0)) * np.float32(16777216.0)))
    body = 0x7C00 if a >= 0x477FF000 else (normal if a >= 0x38800000 else tiny)
    return sign | body


@vector_jit
def from_half_bits(h):
    """float16 bits (not NaN) → float32, exact: ``half_to_float`` without the subnormal loop (a
    subnormal is its significand times 2^−24, exact in float32)."""
    sign = (h & 0x8000) << 16
    e = (h >> 10) & 0x1F
    m = h & 0x3FF
    normal = sign | ((e + 112) << 23) | (m << 13)
    tiny = np.int64(np.float32(np.float32(m) * np.float32(5.960464477539063e-08)).view(np.uint32)) | sign
    bits = (sign | 0x7F800000 | (m << 13)) if e == 0x1F else (tiny if e == 0 else normal)
    return np.uint32(bits).view(np.float32)


@vector_jit
def to_bf16_bits(f):
    """float32 (not NaN) → bfloat16 bits, round to nearest even (``float_to_bf16`` without the NaN branch)."""
    u = np.int64(np.float32(f).view(np.uint32))
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


@vector_jit
def lambda_star_bins(xs, taus, count, d, inv_step, big, half, last, bins):
    """bins[k] = the λ* bin of unique element k (base value xs[k], update taus[k]) for survival dtype d
    (0 bfloat16, 1 float16, 2 float32), as ``probe._lambda_star_keys`` computes it, with the same
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


@jit
def analyze_kernel(
    base,
    agents,
    eps,
    one,
    inv_step,
    big,
    last,
    agent_of,
    joint,
    surv,
    row,
    first_row,
    stride,
    sig_bits,
    min_exponent,
    ulps,
    xb,
    total,
    key,
    ux,
    ut,
    ua,
    bins,
):
    """The complete (Analyze) probe of one slice in one pass over memory, as ``ProbeAccumulator`` and
    ``InspectAccumulator`` compute it with torch:

    * joint[k, p + 2^N·q] += 1 per element (summed over k by the caller): p the update pattern
      Σ_t [|τ_t| > ε]·2^t, q the agents whose τ_t > ε (ε in the compute dtype);
    * surv[3·t + d, bin] += 1 for every element only agent t updates (agent_of[p] = t): the λ* bin of
      survival dtype d (``lambda_star_bins``), from τ_t = Σ_s [m_s]·τ_s (exact where one agent updates);
    * ulps[t, bin] += 1 for each sampled element agent t updates (rows first_row, first_row + stride, ..
      of ``row`` elements; row = 0: none): |τ_t|·2^k with 2^k = 1/ulp of the base value in the stored
      dtype (``sig_bits`` significand bits, exponent at least ``min_exponent``), bin = the biased exponent
      of that product − bias + 1 clipped to 1 .. 64, 0 for a subnormal product.

    Returns the number of blocks with a non-finite τ (the caller then reports the tensor)."""
    n = base.shape[0]
    block = xb.shape[0]
    nagents = len(agents)
    zero = eps - eps
    half = one / (one + one)
    bad_blocks = 0
    for start in range(0, n, block):
        length = min(block, n - start)
        b = base[start : start + length]
        bad = np.int32(0)
        for j in range(length):
            xb[j] = widen(b[j])
            total[j] = zero
            key[j] = 0
        for t in range(nagents):
            a = agents[t][start : start + length]
            bit = np.int32(1 << t)
            sign_bit = np.int32(1 << (t + nagents))
            for j in range(length):
                v = widen(a[j]) - xb[j]
                m = abs(v) > eps
                total[j] = total[j] + v * (one if m else zero)
                key[j] = key[j] | (bit if m else np.int32(0)) | (sign_bit if v > eps else np.int32(0))
                bad |= np.int32(v - v != zero)
        if bad != 0:
            bad_blocks += 1
            continue  # the caller raises; nothing of this slice is kept
        histogram_block(key, length, joint)
        count = 0
        for j in range(length):  # gather the unique elements: base value, update, agent
            t = agent_of[key[j]]
            # written for every element and kept (count advanced) for the unique ones: no branch to
            # mispredict; Σ_s [m_s]·τ_s is τ_t exactly where only agent t updates
            ux[count] = xb[j]
            ut[count] = total[j]
            ua[count] = t * 3
            count += np.int64(t >= 0)
        for d in range(3):
            lambda_star_bins(ux, ut, count, d, inv_step, big, half, last, bins)
            for k in range(count):
                surv[ua[k] + d, bins[k]] += 1
    if bad_blocks or row == 0:
        return bad_blocks
    # the ulp sample: every stride-th row, recomputing τ from the stored bits (1/stride of the elements)
    bias, shift, field = exponent_layout(zero)
    lowest = max(min_exponent, sig_bits)
    for r in range(first_row, n // row, stride):
        for i in range(r * row, (r + 1) * row):
            x = like(zero, widen(base[i]))  # the compute dtype, as xb
            e = (float_bits(x) >> shift) & field
            e = max(e, lowest)
            inv_ulp = power_of_two(x, 2 * bias - 1 + sig_bits - e)
            for t in range(nagents):
                v = widen(agents[t][i]) - x
                if abs(v) > eps:
                    k = (float_bits(abs(v) * inv_ulp) >> shift) & field
                    ulps[t, 0 if k == 0 else min(max(k - bias + 1, 1), ulps.shape[1] - 1)] += 1
    return bad_blocks


@jit
def exponent_all_ones(bits, mask):
    """Whether any stored float in ``bits`` (its unsigned-integer view) has every exponent bit of ``mask`` set:
    ±Inf or NaN. No early exit, so the loop vectorises (one pass over a slice just written, in cache)."""
    found = 0
    for i in range(bits.shape[0]):
        found |= (bits[i] & mask) == mask
    return found != 0


@jit
def widen_kernel(a, start, out):
    """out[i] = a[start + i] as float32 (exact for float16 / bfloat16 bits)."""
    for i in range(out.size):
        out[i] = np.float32(widen(a[start + i]))


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


@jit
def offsets_kernel(base, agents, out):
    """out[t, i] = agents[t][i] − base[i] in float32 (each τ rounded once); returns how many are not finite."""
    bad = 0
    for t in range(len(agents)):
        a = agents[t]
        row = out[t]
        for i in range(base.size):
            d = np.float32(widen(a[i])) - np.float32(widen(base[i]))
            if d - d != 0:
                bad += 1
            row[i] = d
    return bad


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
    for r in range(n_rows):
        dare_uniform_block((row0 + r) * width, width, ka, kb, hashes)
        for j in range(width):
            idx[j] = j
            key[j] = bits[r, j] & np.uint32(0x7FFFFFFF)
        src_idx, src_key, dst_idx, dst_key = idx, key, idx2, key2
        for shift in range(0, 32, 8):
            counts[:] = 0
            for j in range(width):
                counts[(src_key[j] >> np.uint32(shift)) & np.uint32(0xFF)] += 1
            if counts.max() == width:  # one digit value for the whole row: this pass keeps the order
                continue
            total = 0
            for d in range(256):
                c = counts[d]
                counts[d] = total
                total += c
            for j in range(width):
                d = (src_key[j] >> np.uint32(shift)) & np.uint32(0xFF)
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
def nonfinite_taus_kernel(base, agents):
    """How many agents[t][i] − base[i] (float32) are NaN or ±Inf."""
    bad = 0
    for t in range(len(agents)):
        a = agents[t]
        for i in range(base.size):
            d = np.float32(widen(a[i])) - np.float32(widen(base[i]))
            if d - d != 0:
                bad += 1
    return bad


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
