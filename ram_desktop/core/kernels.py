"""Fused CPU kernels (numba): one pass over memory per chunk for the probe's counts and the RAM merge.

The torch formulation in ``chunks`` / ``methods`` / ``probe`` runs ~15 elementwise operations per
element, each a full pass over the chunk. These kernels read the stored bf16 / fp16 / fp32 / fp64
bits directly and do, per element, what those operations do, in the same IEEE order:

* τ_t = agent − base in the compute dtype (float32, float64 when any input is float64); 16-bit
  values are widened exactly from their bits;
* m_t = |τ_t| > ε with ε rounded to the compute dtype (as torch compares a tensor with a scalar);
* the update pattern p = Σ_t m_t·2^t and its histogram (``ProbeAccumulator``'s counts);
* equation 7 exactly as ``methods.selective_merge`` computes it: s = Σ_t [m_t]·τ_t from +0 in agent
  order 0..N−1, then s·λ_t where one agent updates (RAM+), s / c where c ≥ 2 agents do, +0 where
  none does; θ = base + that, rounded once to the output dtype (round-to-nearest-even on the bits,
  equal to torch's conversion; float64 goes through float32 first, as torch's does);
* RAM+'s exact rescale survival (``probe.rescale_changes``): per agent, its unique elements and how
  many of them the rescale changed after rounding.

No fastmath, no fused multiply-add contraction (numba's default), so every value is the same bits
as the torch path. Kernels release the GIL and run single-threaded on one chunk: the engine's
chunk-level compute threads provide the parallelism, so results never depend on thread count.

``available()`` is False when numba cannot be imported; the engine then keeps the torch path,
which also stays the reference and the CUDA path.
"""

from __future__ import annotations

import functools
import os
import threading

import numpy as np
import torch

from .chunks import PATTERN_MAX_AGENTS

FLOATS = (torch.bfloat16, torch.float16, torch.float32, torch.float64)


@functools.lru_cache(maxsize=None)
def available() -> bool:
    """Whether the fused kernels can run here (numba importable and not disabled by RAM_DESKTOP_KERNELS=0)."""
    if os.environ.get("RAM_DESKTOP_KERNELS", "1") == "0":
        return False
    try:
        _jit()
    except ImportError:
        return False
    return True


def as_bits(t: torch.Tensor) -> np.ndarray:
    """A numpy view (no copy) of a contiguous CPU tensor: bfloat16 as uint16 bits, float16 as int16
    bits (the kernels tell them apart by type), float32 / float64 as themselves."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    if t.dtype == torch.float16:
        return t.view(torch.int16).numpy()
    return t.numpy()


@functools.lru_cache(maxsize=None)
def _jit():
    """Compile-on-first-use kernels (cached on disk by numba). Imported lazily: the CLI's other
    commands never pay for numba."""
    import numba
    from numba.core import types
    from numba.extending import overload

    jit = functools.partial(numba.njit, nogil=True, cache=True)
    helper = functools.partial(numba.njit, nogil=True, cache=True, inline="always")

    @helper
    def half_to_float(h):
        h = np.int64(h)
        sign = (h & 0x8000) << 16
        e = (h >> 10) & 0x1F
        m = h & 0x3FF
        if e == 0x1F:
            bits = sign | 0x7F800000 | (m << 13)
        elif e == 0:
            if m == 0:
                bits = sign
            else:
                e2 = 113
                while (m & 0x400) == 0:
                    m <<= 1
                    e2 -= 1
                bits = sign | (e2 << 23) | ((m & 0x3FF) << 13)
        else:
            bits = sign | ((e + 112) << 23) | (m << 13)
        return np.uint32(bits).view(np.float32)

    @helper
    def bf16_to_float(h):
        return np.uint32(np.int64(h) << 16).view(np.float32)

    def widen(v):  # pragma: no cover - replaced by the overload in compiled code
        raise NotImplementedError

    @overload(widen, inline="always")
    def _widen(v):
        """The compute value of one stored element: bfloat16 bits arrive as uint16, float16 bits as
        int16 (so the dtype is known when compiling), other floats as themselves."""
        if v == types.uint16:
            return lambda v: bf16_to_float(v)
        if v == types.int16:
            return lambda v: half_to_float(v)
        return lambda v: v

    @helper
    def float_to_bf16(x):
        """float32 → bfloat16 bits, round to nearest even (NaN → 0x7FC0, as torch)."""
        if x != x:
            return np.int64(0x7FC0)
        u = np.int64(np.float32(x).view(np.uint32))
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF

    @helper
    def float_to_half(x):
        """float32 → float16 bits, round to nearest even, overflow to ±inf (NaN → sign | 0x7E00, as torch)."""
        u = np.int64(np.float32(x).view(np.uint32))
        sign = (u >> 16) & 0x8000
        a = u & 0x7FFFFFFF
        if a > 0x7F800000:
            return sign | 0x7E00
        if a >= 0x477FF000:  # ≥ 65520 (the tie between 65504 and 2^16 rounds to even: inf)
            return sign | 0x7C00
        if a >= 0x38800000:  # a normal float16: rebias, round 23 → 10 mantissa bits
            a -= 0x38000000
            return sign | ((a + 0xFFF + ((a >> 13) & 1)) >> 13)
        if a < 0x33000000:  # below 2^-25 (2^-25 itself is a tie to the even 0)
            return sign
        e = a >> 23
        m = (a & 0x7FFFFF) | 0x800000
        shift = 126 - e  # value = m · 2^(e−150) = (m >> shift) units of 2^-24, 14 ≤ shift ≤ 24
        q = m >> shift
        rem = m & ((1 << shift) - 1)
        half = np.int64(1) << (shift - 1)
        if rem > half or (rem == half and (q & 1) == 1):
            q += 1
        return sign | q

    def store(out, i, x):  # pragma: no cover
        raise NotImplementedError

    @overload(store, inline="always")
    def _store(out, i, x):
        """Round the compute value x once to the output dtype (bfloat16 as uint16 bits, float16 as
        int16 bits, float64 → float32 first as torch's conversion does) and store it at out[i]."""
        if out.dtype == types.uint16:
            def impl(out, i, x):
                out[i] = np.uint16(float_to_bf16(np.float32(x)))
            return impl
        if out.dtype == types.int16:
            def impl(out, i, x):
                out[i] = np.int16(float_to_half(np.float32(x)))
            return impl
        if out.dtype == types.float32:
            def impl(out, i, x):
                out[i] = np.float32(x)
            return impl

        def impl(out, i, x):
            out[i] = x
        return impl

    def rounded(out, x):  # pragma: no cover
        raise NotImplementedError

    @overload(rounded, inline="always")
    def _rounded(out, x):
        """x rounded to ``out``'s dtype, as a float (for value comparisons: +0 equals −0)."""
        if out.dtype == types.uint16:
            return lambda out, x: bf16_to_float(float_to_bf16(np.float32(x)))
        if out.dtype == types.int16:
            return lambda out, x: half_to_float(float_to_half(np.float32(x)))
        if out.dtype == types.float32:
            return lambda out, x: np.float32(x)
        return lambda out, x: x

    @helper
    def popcount(p):
        p = p - ((p >> 1) & 0x55555555)
        p = (p & 0x33333333) + ((p >> 2) & 0x33333333)
        p = (p + (p >> 4)) & 0x0F0F0F0F
        return (p * 0x01010101) >> 24

    @helper
    def pattern_block(base, agents, start, length, eps, one, xb, total, pattern):
        """For elements start .. start+length−1, in agent order 0..N−1 (each loop vectorises):
        xb = base, total = Σ_t τ_t·[m_t] from +0, pattern = Σ_t m_t·2^t. Returns True when every τ
        is finite."""
        zero = eps - eps
        bad = np.int32(0)  # an integer reduction (a float one could not be vectorised without reordering)
        b = base[start:start + length]
        for j in range(length):
            xb[j] = widen(b[j])
            total[j] = zero
            pattern[j] = 0
        for t in range(len(agents)):
            a = agents[t][start:start + length]
            bit = np.int32(1 << t)
            for j in range(length):
                v = widen(a[j]) - xb[j]
                m = abs(v) > eps
                total[j] = total[j] + v * (one if m else zero)  # × 0 or 1 is exact: τ or ±0, as the torch path
                pattern[j] = pattern[j] | (bit if m else np.int32(0))
                bad |= np.int32(v - v != zero)  # ±inf − ±inf and NaN − NaN are NaN
        return bad == 0

    @helper
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

    @jit
    def count_kernel(base, agents, eps, one, hist, xb, total, pattern):
        """Pass 1: hist[k, p] += number of elements with update pattern p (summed over k by the
        caller). Returns the number of blocks with a non-finite τ (the caller then reports the tensor)."""
        n = base.shape[0]
        block = xb.shape[0]
        bad = 0
        for start in range(0, n, block):
            length = min(block, n - start)
            if not pattern_block(base, agents, start, length, eps, one, xb, total, pattern):
                bad += 1
            histogram_block(pattern, length, hist)
        return bad

    @jit
    def merge_kernel(base, agents, eps, one, lam, use_lam, out, hist, want_hist, surv, want_surv,
                     xb, total, pattern):
        """Pass 2: θ = base + equation 7, rounded once into ``out``.

        As ``methods.selective_merge``: s = Σ_t τ_t·[m_t] (agent order, from +0), then s·λ_t where
        only agent t updates (RAM+; ×1 for RAM) and ÷ max(1, c); multiplying or dividing by 1 is
        exact, so this is λ_t·τ_t, s / c and +0 bit for bit. Returns the number of blocks with a
        non-finite τ. Optionally the pattern histogram (a merge that needed no probe first) and the
        exact rescale survival ``surv[0, t]`` / ``surv[1, t]``: agent t's unique elements whose rounded
        value the rescale changed / all its unique elements (``probe.rescale_changes``)."""
        n = base.shape[0]
        block = xb.shape[0]
        nagents = len(agents)
        zero = eps - eps
        bad = 0
        for start in range(0, n, block):
            length = min(block, n - start)
            if not pattern_block(base, agents, start, length, eps, one, xb, total, pattern):
                bad += 1
            if want_hist:
                histogram_block(pattern, length, hist)
            o = out[start:start + length]
            for j in range(length):
                p = pattern[j]
                c = popcount(p)
                factor = lam[p] if use_lam else one  # λ_t for the one-agent pattern 2^t, else 1
                divisor = zero + np.float32(c if c > 1 else 1)
                merged = xb[j] + (total[j] * factor) / divisor
                store(o, j, merged)
                if want_surv:
                    # flag the unique elements whose rounded value the rescale moved (bit N of the pattern)
                    moved = rounded(o, xb[j] + total[j]) != rounded(o, merged)
                    pattern[j] = p | (np.int32(1 << nagents) if moved else np.int32(0))
            if want_surv:
                for t in range(nagents):
                    unique = np.int32(1 << t)
                    flagged = np.int32((1 << t) | (1 << nagents))
                    u = 0
                    mv = 0
                    for j in range(length):
                        u += np.int64(pattern[j] == unique)
                        mv += np.int64(pattern[j] == flagged)
                    surv[0, t] += mv
                    surv[1, t] += u + mv
        return bad

    return {"count": count_kernel, "merge": merge_kernel, "to_bf16": float_to_bf16, "to_half": float_to_half,
            "from_bf16": bf16_to_float,
            "from_half": half_to_float}


def _operands(base_raw: torch.Tensor, agent_raws: list[torch.Tensor]):
    """(base bits, agents' bits as a tuple), or None when the kernels do not cover this slice (agents
    in different dtypes, an agent shorter than the base, too many agents, a non-float or non-CPU tensor)."""
    n_agents = len(agent_raws)
    if not 1 <= n_agents <= PATTERN_MAX_AGENTS or base_raw.device.type != "cpu" or base_raw.dtype not in FLOATS:
        return None
    dtype = agent_raws[0].dtype
    n = base_raw.numel()
    for a in agent_raws:
        if a.dtype != dtype or a.numel() != n or not a.is_contiguous() or a.device.type != "cpu":
            return None
    if dtype not in FLOATS or not base_raw.is_contiguous():
        return None
    return as_bits(base_raw.reshape(-1)), tuple(as_bits(a.reshape(-1)) for a in agent_raws)


def _compute_np(compute_dtype: torch.dtype) -> type:
    return np.float64 if compute_dtype == torch.float64 else np.float32


BLOCK = 2048  # elements per block: the per-block buffers stay in L1/L2


class _Buffers(threading.local):
    """Per-thread block buffers (a few KiB each), reused across calls."""

    def get(self, dtype: type) -> tuple[np.ndarray, ...]:
        cache = self.__dict__.setdefault("cache", {})
        if dtype not in cache:
            cache[dtype] = (np.empty(BLOCK, dtype), np.empty(BLOCK, dtype), np.empty(BLOCK, np.int32))
        return cache[dtype]


_BUFFERS = _Buffers()


def count_patterns(base_raw: torch.Tensor, agent_raws: list[torch.Tensor], eps: float,
                   compute_dtype: torch.dtype) -> tuple[np.ndarray, bool] | None:
    """Histogram of update patterns over a slice (int64, 2^N bins) and whether every τ is finite;
    None when the kernels do not cover the slice (use the torch path)."""
    ops = _operands(base_raw, agent_raws)
    if ops is None:
        return None
    base, agents = ops
    cdt = _compute_np(compute_dtype)
    hist = np.zeros((4, 1 << len(agents)), np.int64)
    bad = _jit()["count"](base, agents, cdt(eps), cdt(1), hist, *_BUFFERS.get(cdt))
    return hist.sum(0), bad == 0


@functools.lru_cache(maxsize=64)
def _pattern_lambdas(lambdas: tuple[float, ...] | None, n_agents: int, cdt: type) -> np.ndarray:
    """Per update pattern p: λ_t (rounded to the compute dtype, as the torch path's factor table) for
    the one-agent pattern 2^t, 1 for every other pattern."""
    table = np.ones(1 << n_agents, cdt)
    for t in range(n_agents):
        table[1 << t] = cdt(lambdas[t]) if lambdas is not None else 1.0
    return table


def selective_merge_into(base_raw: torch.Tensor, agent_raws: list[torch.Tensor], eps: float,
                         compute_dtype: torch.dtype, out_dtype: torch.dtype, lambdas: list[float] | None,
                         want_hist: bool, want_survival: bool
                         ) -> tuple[torch.Tensor, np.ndarray | None, bool, torch.Tensor | None] | None:
    """θ = base + RAM / RAM+ merged task vector of one slice, in ``out_dtype``, and whether every τ is
    finite; with ``want_hist`` also the pattern histogram; with ``want_survival`` (and λ) the ``[2, N]`` int64
    rescale survival counts of ``probe.rescale_changes``. None when the kernels do not cover the slice."""
    ops = _operands(base_raw, agent_raws)
    if ops is None or out_dtype not in FLOATS:
        return None
    base, agents = ops
    n_agents = len(agents)
    cdt = _compute_np(compute_dtype)
    lam = _pattern_lambdas(tuple(lambdas) if lambdas is not None else None, n_agents, cdt)
    merged = torch.empty(base_raw.shape, dtype=out_dtype)
    hist = np.zeros((4, 1 << n_agents) if want_hist else (1, 1), np.int64)
    count_survival = want_survival and lambdas is not None
    surv = np.zeros((2, n_agents), np.int64)
    bad = _jit()["merge"](base, agents, cdt(eps), cdt(1), lam, lambdas is not None, as_bits(merged), hist,
                          want_hist, surv, count_survival, *_BUFFERS.get(cdt))
    return (merged, (hist.sum(0) if want_hist else None), bad == 0,
            torch.from_numpy(surv) if count_survival else None)
