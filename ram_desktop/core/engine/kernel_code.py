"""The numba code of the engine's fused CPU primitives (see ``kernels.py``, which imports this module lazily):
the ``jit`` decorator every fused kernel uses, widening and storing stored bits (``widen``, ``store``,
``encoded``, ``same_value``, ``like``), pattern counting (``pattern_run``, ``pattern_histogram``,
``histogram_block``, ``count_kernel``) and the Analyze probe's kernel (``analyze_kernel``, with the hook a method's
probe statistic plugs its numba piece into, ``unique_statistic``). The methods' own kernels
(``core.methods.*_kernel``) call these helpers.

Module-level functions with ``cache=True``: numba keeps the compiled machine code next to this file
(or in ``NUMBA_CACHE_DIR``), so only the first run on a machine pays for compiling.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import numba
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic, overload

if TYPE_CHECKING:
    _F = TypeVar("_F", bound=Callable[..., Any])

    def jit(function: _F) -> _F:
        """For the type checker: a compiled kernel is called with its Python signature (numba's stubs type the
        dispatcher's ``__call__`` as taking no arguments)."""
        return function

    vector_jit = jit
    slp_jit = jit
    inlined_jit = jit
else:
    jit = functools.partial(numba.njit, nogil=True, cache=True)
    # inlined into its callers at numba's IR level (a call per few rows would cost more than the rows)
    inlined_jit = functools.partial(numba.njit, nogil=True, cache=True, inline="always")

    def slp_jit(function):
        """``jit``, compiled with LLVM's SLP vectoriser, which numba leaves off by default (it has miscompiled
        other code): for the norm's eight lanes, kept as eight scalars in torch's order, it forms one vector add
        (bfloat16 row norm 0.61 → 0.15 ns per element on this machine); likewise the cascade sum's lanes. Only
        these few kernels get it, and their results are checked against torch once per process
        (``kernels.torch_norm_exact``, ``TorchSum.exact``), falling back to torch where they differ. SLP never
        reorders float arithmetic, so the bits are the scalar code's. The flag
        is numba's process-wide setting, flipped only while this dispatcher compiles, under numba's compiler lock
        (no other compile runs meanwhile); a caller inlining this kernel must be an ``slp_jit`` kernel too."""
        from numba.core import config
        from numba.core.compiler_lock import global_compiler_lock

        dispatcher = jit(function)
        compile_scalar = dispatcher.compile

        def compile_vectorised(sig):
            with global_compiler_lock:
                before = config.SLP_VECTORIZE
                config.SLP_VECTORIZE = 1
                try:
                    return compile_scalar(sig)
                finally:
                    config.SLP_VECTORIZE = before

        dispatcher.compile = compile_vectorised
        return dispatcher


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


def beyond_range(out, v):  # pragma: no cover
    raise NotImplementedError


@overload(beyond_range)
def _beyond_range(out, v):
    """Whether ``v``, a value ``encoded`` for out's dtype, is ±Inf or NaN (all exponent bits set): a merged value
    beyond the output dtype's range."""
    if out.dtype == types.uint16:
        return lambda out, v: np.uint32(np.uint32(v) & np.uint32(0x7F80)) == np.uint32(0x7F80)
    if out.dtype == types.int16:
        return lambda out, v: np.uint32(np.uint32(np.uint16(v)) & np.uint32(0x7C00)) == np.uint32(0x7C00)
    return lambda out, v: v - v != v - v  # NaN for ±Inf and NaN, 0 otherwise


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
def written_beyond_range(o, length):
    """Whether any of the first ``length`` values of ``o`` (output bits, ``encoded``) is beyond its dtype's range
    (``beyond_range``): the merge kernels check each block just written (still in cache), so the writer need not
    read the output again; the writer checks the other kernels' slices whole. Its own loop, so that it vectorises
    whatever the merge loop does; no early exit."""
    found = np.int32(0)
    for j in range(length):
        found = np.int32(found | (np.int32(1) if beyond_range(o, o[j]) else np.int32(0)))
    return found != 0


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


# --- the Analyze probe: counts, signs, a method's statistic of unique elements and the ulp sample in one pass ---


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


def unique_statistic(statistic, xs, taus, agents, count, counts, scratch):  # pragma: no cover
    raise NotImplementedError


@overload(unique_statistic)
def _no_statistic(statistic, xs, taus, agents, count, counts, scratch):
    """The hook through which ``analyze_kernel`` hands each block's unique elements to a method's probe statistic
    (``contracts.ProbeStatistic``): elements k < ``count``, base value xs[k], update taus[k] (compute dtype) of
    agent agents[k], counted into ``counts`` ([N, *shape] int64); ``scratch`` is an int32 block buffer. A method
    overloads it for the numba type of its own ``statistic`` value (a named tuple of its constants, from
    ``ProbeStatistic.fused``), importing its kernel module before the probe runs; this overload is the probe with
    no statistic (``statistic`` None), which counts nothing."""
    if isinstance(statistic, types.NoneType):
        return lambda statistic, xs, taus, agents, count, counts, scratch: None
    return None


@jit
def analyze_kernel(
    base,
    agents,
    eps,
    one,
    statistic,
    counts,
    agent_of,
    joint,
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
    scratch,
):
    """The complete (Analyze) probe of one slice in one pass over memory, as ``ProbeAccumulator`` and
    ``InspectAccumulator`` compute it with torch:

    * joint[k, p + 2^N·q] += 1 per element (summed over k by the caller): p the update pattern
      Σ_t [|τ_t| > ε]·2^t, q the agents whose τ_t > ε (ε in the compute dtype);
    * ``counts`` (a method's probe statistic, ``unique_statistic``): the elements only agent t updates
      (agent_of[p] = t), each with its base value and τ_t = Σ_s [m_s]·τ_s (exact where one agent updates),
      gathered per block and handed to ``unique_statistic(statistic, ...)``;
    * ulps[t, bin] += 1 for each sampled element agent t updates (rows first_row, first_row + stride, ..
      of ``row`` elements; row = 0: none): |τ_t|·2^k with 2^k = 1/ulp of the base value in the stored
      dtype (``sig_bits`` significand bits, exponent at least ``min_exponent``), bin = the biased exponent
      of that product − bias + 1 clipped to 1 .. 64, 0 for a subnormal product.

    Returns the number of blocks with a non-finite τ (the caller then reports the tensor)."""
    n = base.shape[0]
    block = xb.shape[0]
    nagents = len(agents)
    zero = eps - eps
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
            ua[count] = t
            count += np.int64(t >= 0)
        unique_statistic(statistic, ux, ut, ua, count, counts, scratch)
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
def widen_kernel(a, start, out):
    """out[i] = a[start + i] as float32 (exact for float16 / bfloat16 bits). The index is unsigned: a signed one
    gets a wraparound check that makes every load a gather."""
    for i in range(out.size):
        out[i] = np.float32(widen(a[np.uint64(start + i)]))


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


if TYPE_CHECKING:

    def fma32(a: float, b: float, c: float) -> float:
        """For the type checker: the intrinsic below, as compiled code calls it."""
        return a * b + c

else:

    @intrinsic
    def fma32(typingctx, a, b, c):
        """a·b + c in float32, rounded once (LLVM's ``llvm.fma.f32``: the instruction, or exact software)."""
        signature = types.float32(types.float32, types.float32, types.float32)

        def codegen(context, builder, sig, args):
            f32 = ir.FloatType()
            fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f32, [f32, f32, f32]), "llvm.fma.f32")
            return builder.call(fma, args)

        return signature, codegen


NORM_LANES = 8  # the float lanes of torch's norm kernel on a row (``ReduceOpsKernel.cpp``, AVX2 vectors)


@jit
def norm_finish(n, lanes, tail):
    """torch's 2-norm of a float32 row of ``n`` ≥ 2 elements on the CPU (``torch.linalg.vector_norm(row, dim=-1)``,
    ``kernels.torch_norm_exact``) from its parts: ``lanes`` [8], element e < n − n mod 8 squared and added (each
    operation rounded) into lanes[e mod 8] in order, and ``tail`` [8], the last n mod 8 elements. The lanes added in order, then the tail's
    squares added in order, as torch's compiled scalar loop does it: groups of four squared as a vector, each
    added rounded, the last n mod 4 fused into the sum (multiply-add), then the square root."""
    total = lanes[0]
    for j in range(1, NORM_LANES):
        total = total + lanes[j]
    count = n % NORM_LANES
    grouped = count - count % 4
    for j in range(grouped):
        total = total + tail[j] * tail[j]
    for j in range(grouped, count):
        total = fma32(tail[j], tail[j], total)
    return np.float32(np.sqrt(np.float64(total)))


@jit
def norm_element(values, base, i):
    """values[i] widened to float32, less base[i] (rounded) unless ``base`` is None: one element of a norm's row."""
    if base is None:
        return np.float32(widen(values[i]))
    return np.float32(widen(values[i])) - np.float32(widen(base[i]))


@slp_jit
def norm_parts(values, base, lanes, tail):
    """The parts ``norm_finish`` takes of torch's 2-norm of the float32 row ``values − base`` (each operation rounded;
    ``base`` None: the values themselves), from stored bits (bfloat16 / float16 bits or floats): the squares
    added in order into ``lanes`` [8], the last n mod 8 elements into ``tail`` [8]. Returns 0 when every offset
    is surely finite (always without a base), 1 when a lane or the tail is not: an offset may then not be finite
    (or its squares overflowed), which the caller checks (``kernels.finite_taus``). The eight lanes are locals,
    so they stay in registers."""
    n = values.size
    whole = n - n % NORM_LANES
    l0, l1, l2, l3, l4, l5, l6, l7 = lanes[0], lanes[1], lanes[2], lanes[3], lanes[4], lanes[5], lanes[6], lanes[7]
    for v in range(0, whole, NORM_LANES):
        d0, d1 = norm_element(values, base, v), norm_element(values, base, v + 1)
        d2, d3 = norm_element(values, base, v + 2), norm_element(values, base, v + 3)
        d4, d5 = norm_element(values, base, v + 4), norm_element(values, base, v + 5)
        d6, d7 = norm_element(values, base, v + 6), norm_element(values, base, v + 7)
        l0, l1, l2, l3 = l0 + d0 * d0, l1 + d1 * d1, l2 + d2 * d2, l3 + d3 * d3
        l4, l5, l6, l7 = l4 + d4 * d4, l5 + d5 * d5, l6 + d6 * d6, l7 + d7 * d7
    lanes[0], lanes[1], lanes[2], lanes[3], lanes[4], lanes[5], lanes[6], lanes[7] = l0, l1, l2, l3, l4, l5, l6, l7
    for e in range(whole, n):
        tail[e - whole] = norm_element(values, base, e)
    if base is None:
        return 0
    settled = np.float32(0.0)
    for k in range(NORM_LANES):
        settled += lanes[k] - lanes[k]
    for k in range(n - whole):
        settled += tail[k] - tail[k]
    # an offset that is not finite leaves its lane ±inf or NaN for good (squares are never negative, so nothing
    # cancels it); a lane may also overflow from finite offsets, so 1 only says the caller must look (a test per
    # element here, or a call to a counting kernel, costs this loop its vector code)
    return 0 if settled == 0 else 1


@slp_jit
def stored_norm(values):
    """torch's 2-norm of the row of stored values (bfloat16 / float16 bits or floats) widened to float32, from the
    stored bits (``norm_parts``, ``norm_finish``)."""
    lanes = np.zeros(NORM_LANES, np.float32)
    tail = np.zeros(NORM_LANES, np.float32)
    norm_parts(values, None, lanes, tail)
    return norm_finish(values.size, lanes, tail)


@inlined_jit
def add_rows_to_lanes(values, start, rows, lanes, absolute):
    """lanes[j] += values[start + 32·r + j] (its absolute value with ``absolute``) for r < ``rows`` in order, each
    addition rounded: one of the four 8-lane level-0 accumulators of torch's cascade sum over ``rows`` whole rows
    of four vectors. The lanes are locals, so the SLP vectoriser keeps them in one vector register; the index is
    unsigned (no wraparound check)."""
    l0, l1, l2, l3, l4, l5, l6, l7 = lanes[0], lanes[1], lanes[2], lanes[3], lanes[4], lanes[5], lanes[6], lanes[7]
    for r in range(rows):
        i = np.uint64(start + 32 * r)
        x0, x1, x2, x3 = values[i], values[i + 1], values[i + 2], values[i + 3]
        x4, x5, x6, x7 = values[i + 4], values[i + 5], values[i + 6], values[i + 7]
        if absolute:
            x0, x1, x2, x3 = np.float32(abs(x0)), np.float32(abs(x1)), np.float32(abs(x2)), np.float32(abs(x3))
            x4, x5, x6, x7 = np.float32(abs(x4)), np.float32(abs(x5)), np.float32(abs(x6)), np.float32(abs(x7))
        l0, l1, l2, l3 = l0 + x0, l1 + x1, l2 + x2, l3 + x3
        l4, l5, l6, l7 = l4 + x4, l5 + x5, l6 + x6, l7 + x7
    lanes[0], lanes[1], lanes[2], lanes[3], lanes[4], lanes[5], lanes[6], lanes[7] = l0, l1, l2, l3, l4, l5, l6, l7


@slp_jit
def cascade_sum_feed(values, state, acc, tail, absolute):
    """Feed float32 ``values`` (the next elements of one thread's part, in order; their absolute values with
    ``absolute``) to torch's cascade sum of that part (``kernels.TorchSum``): ``state`` = [elements fed, rows,
    vectors, level power], ``acc`` [4 levels, 4 rows, 8 lanes] its accumulators, ``tail`` [1] the scalar tail's sum.
    Every operation is torch's (``SumKernel.cpp``: ``multi_row_sum`` over 8-lane vectors, 4 at a time), so the
    result is its bits however the part is cut into feeds."""
    pos, rows, vectors, power = state[0], state[1], state[2], state[3]
    level_mask = (np.int64(1) << power) - 1
    rows_end = rows * 4
    first = 0
    # whole rows of four vectors from a row's start: the level-0 accumulators take them lane by lane (the
    # same additions in the same order as the element loop below), then the row's cascade
    while (pos + first) % 32 == 0 and (pos + first) // 8 + 4 <= rows_end and first + 32 <= values.size:
        row = (pos + first) // 32
        # the rows up to the next cascade (or the part's last row, or this feed's), each vector's lanes in turn:
        # every accumulator still takes its additions in row order
        run = min((level_mask + 1) - (row & level_mask), rows - row, (values.size - first) // 32)
        for k in range(4):
            add_rows_to_lanes(values, first + k * 8, run, acc[0, k], absolute)
        r = row + run - 1
        if ((r + 1) & level_mask) == 0:
            for j in range(1, 4):
                for kk in range(4):
                    for lane in range(8):
                        acc[j, kk, lane] = acc[j, kk, lane] + acc[j - 1, kk, lane]
                        acc[j - 1, kk, lane] = np.float32(0.0)
                if ((r + 1) & (level_mask << (j * power))) != 0:
                    break
        first += 32 * run
    for idx in range(first, values.size):
        x = np.float32(abs(values[idx])) if absolute else values[idx]
        e = pos + idx
        v = e >> 3
        lane = e & 7
        if v < rows_end:
            k = v & 3
            acc[0, k, lane] = acc[0, k, lane] + x
            r = v >> 2
            if k == 3 and ((r + 1) & level_mask) == 0:  # a full block of rows: cascade up the levels
                for j in range(1, 4):
                    for kk in range(4):
                        acc[j, kk, lane] = acc[j, kk, lane] + acc[j - 1, kk, lane]
                        acc[j - 1, kk, lane] = np.float32(0.0)
                    if ((r + 1) & (level_mask << (j * power))) != 0:
                        break
        elif v < vectors:
            if v == rows_end:  # the rows are done: fold the levels before the remaining vectors
                for j in range(1, 4):
                    for kk in range(4):
                        acc[0, kk, lane] = acc[0, kk, lane] + acc[j, kk, lane]
            acc[0, 0, lane] = acc[0, 0, lane] + x
        else:
            tail[0] = tail[0] + x
    state[0] = pos + values.size


@jit
def cascade_sum_finish(state, acc, tail):
    """The part's sum once every element was fed (``cascade_sum_feed``)."""
    if state[2] == state[1] * 4:  # no vector after the rows: fold the levels now
        for lane in range(8):
            for j in range(1, 4):
                for kk in range(4):
                    acc[0, kk, lane] = acc[0, kk, lane] + acc[j, kk, lane]
    total = tail[0]
    for lane in range(8):
        for kk in range(1, 4):
            acc[0, 0, lane] = acc[0, 0, lane] + acc[0, kk, lane]
    for lane in range(8):
        total = total + acc[0, 0, lane]
    return np.float32(np.float32(0.0) + total)
