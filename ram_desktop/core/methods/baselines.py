"""Baseline merge methods (SPEC.md section 1, 'Baselines'; paper section 5.1, appendix D, Table 11).

* ``average``          τ = mean_t τ_t
* ``task-arithmetic``  τ = λ · Σ_t τ_t
* ``ties``             trim each τ_t to exactly ⌊k·n⌋ elements of largest |τ| per trim scope (earliest
                       positions win ties), elect a sign per element, disjoint mean, times λ
* ``dare-ta``          drop each element with probability p, divide the kept ones by (1 − p), then
                       task arithmetic
* ``dare-ties``        the same DARE step in place of TIES's trim, then sign election + disjoint mean

Every sum over agents runs in agent order 0, 1, ... from a zero tensor, and divisions are true
divisions by tensors on the chunk's device, so every device gives the same bits.

TIES's exact cut. Magnitudes |τ| of non-negative floats order exactly like their IEEE bit patterns
read as integers, so the k-th largest magnitude of a scope is found by a radix select over those bits,
16 bits per pass: pass 1 (the probe pass) histograms the top 16 bits per agent and scope, each
further pass histograms the next 16 bits of the elements whose higher bits equal the cut found so far
(float32: 2 passes, float64: 4). The result per agent and scope is the exact cut pattern ``c`` and
``m``, how many elements equal to ``c`` must be kept so that exactly K = ⌊k·n⌋ (at least 1) survive.
The merge pass keeps |τ| > c plus the first ``m`` elements equal to ``c`` in scope order (tensors in
plan order, then flat index), counting the equal ones already seen in earlier chunks. Histograms
are per agent and per scope; with scope ``tensor`` a tensor's histogram is reduced to its (c, m)
state as soon as its last chunk has passed, so memory stays at one 65536-bin histogram per agent.
K is computed in exact rational arithmetic from the decimal k as written (``repr``), so
⌊0.29·100⌋ = 29 (float arithmetic gives 28).

DARE's mask. Element ``i`` (flat index inside its tensor) of agent ``t`` in tensor ``name`` is dropped
when ``u < T`` with T = ⌊p·2³²⌋ and

    a, b = the two little-endian 32-bit words of blake2b("ram-desktop-dare/1\\0{seed}\\0{t}\\0{name}", 8 bytes)
    u    = mix32(mix32((i mod 2³²) XOR a) XOR (i div 2³²) XOR b)
    mix32(x): x ^= x >> 16; x = x·0x7feb352d mod 2³²; x ^= x >> 15; x = x·0x846ca68b mod 2³²; x ^= x >> 16

(``mix32`` is Chris Wellons' "lowbias32" integer hash, a bijection of 32-bit integers). It is a
counter-based generator: ``u`` depends only on (seed, agent index, tensor name, flat position), so
chunk size, thread count and device never change the mask. It is computed in int64 torch ops with
every value kept below 2⁴⁹ (the 32×32-bit products are split into 16-bit halves of the constant), so
no signed overflow happens anywhere. Kept elements become τ / (1 − p), a true division by (1 − p)
rounded to the compute dtype.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Hashable

import numpy as np
import torch

from ..chunks import Chunk
from .base import MergeMethod, Param

RADIX_BITS = 16
RADIX = 1 << RADIX_BITS
M32 = 0xFFFFFFFF
TABLE_11_SCALE = "0.1, 0.3, 0.5, 0.7, 0.9, 1.0 (Table 11)"


# --- shared pieces -------------------------------------------------------------------------------

def _scalar(value: float, like: torch.Tensor) -> torch.Tensor:
    """A 0-dim tensor in ``like``'s dtype and device: keeps products and quotients elementwise-exact
    (CUDA turns a division by a host scalar into a multiplication by its reciprocal)."""
    return torch.tensor(value, dtype=like.dtype, device=like.device)


def agent_sum(values: torch.Tensor | list[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """Σ_t values[t], from zero, in agent order."""
    total = torch.zeros_like(like)
    for v in values:
        total += v
    return total


def elect_disjoint_mean(values: list[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """TIES steps 2 and 3: the sign of Σ_t values[t] (a zero sum counts as +), then the mean of the
    values that carry that sign (zeros carry none); 0 where no value agrees."""
    positive = agent_sum(values, like) >= 0
    acc = torch.zeros_like(like)
    count = torch.zeros(like.shape, dtype=torch.int32, device=like.device)
    for v in values:
        agree = torch.where(positive, v, -v) > 0  # negation is exact; zeros never agree
        acc += torch.where(agree, v, 0.0)
        count += agree
    return acc / count.clamp(min=1).to(like.dtype)


# --- average, task arithmetic --------------------------------------------------------------------

def average_merge(chunk: Chunk, ctx: Any) -> torch.Tensor:
    total = agent_sum(chunk.taus, chunk.base)
    return total / _scalar(float(chunk.n_agents), total)


def task_arithmetic_merge(chunk: Chunk, ctx: dict) -> torch.Tensor:
    total = agent_sum(chunk.taus, chunk.base)
    return total * _scalar(ctx["scale"], total)


# --- TIES: exact trim ----------------------------------------------------------------------------

def keep_count(density: float, n: int) -> int:
    """K = ⌊k·n⌋, at least 1 (0 for an empty scope); k taken as the decimal it was written as."""
    if n <= 0:
        return 0
    return max(1, math.floor(Fraction(repr(float(density))) * n))


def magnitude_bits(tau: torch.Tensor, key_dtype: torch.dtype) -> torch.Tensor:
    """|τ| as integers that order like the magnitudes (IEEE bits of a non-negative float)."""
    if key_dtype == torch.float64:
        return tau.to(torch.float64).abs().view(torch.int64)
    return tau.abs().contiguous().view(torch.int32)


def _levels(key_dtype: torch.dtype) -> int:
    return (64 if key_dtype == torch.float64 else 32) // RADIX_BITS


@dataclass
class _Select:
    """Radix-select state of one agent in one scope: ``need`` elements still to place at or below
    ``prefix`` (the cut's bits found so far)."""

    need: int
    prefix: int = 0


class TrimCollector:
    """Pass-1 (and refinement passes) statistic of TIES: the exact per-agent magnitude cut per scope."""

    def __init__(self, density: float, scope: str, plan: Any) -> None:
        self.density = density
        self.scope = scope
        self.n_agents = plan.n_agents
        jobs = plan.jobs
        self._numel = {i: j.numel for i, j in enumerate(jobs) if j.mergeable}
        self._dtype = {i: j.compute_dtype for i, j in enumerate(jobs) if j.mergeable}
        self.model_dtype = (torch.float64 if any(d == torch.float64 for d in self._dtype.values())
                            else torch.float32)
        self.level = 0
        self._state: dict[Hashable, list[_Select]] = {}
        self._key_dtype: dict[Hashable, torch.dtype] = {}
        self._current: Hashable | None = None
        self._hist: torch.Tensor | None = None  # [N, RADIX] digit counts of the open scope
        self._buffer: torch.Tensor | None = None

    def scope_key(self, chunk: Chunk) -> Hashable:
        return chunk.job_index if self.scope == "tensor" else "model"

    def _open(self, key: Hashable, chunk: Chunk) -> None:
        if key not in self._state:
            n = self._numel[chunk.job_index] if self.scope == "tensor" else sum(self._numel.values())
            self._key_dtype[key] = self._dtype[chunk.job_index] if self.scope == "tensor" else self.model_dtype
            self._state[key] = [_Select(keep_count(self.density, n)) for _ in range(self.n_agents)]
        self._current = key
        if self._active(key):
            if self._buffer is None or self._buffer.device != chunk.base.device:
                self._buffer = torch.zeros((self.n_agents, RADIX), dtype=torch.int64, device=chunk.base.device)
            else:
                self._buffer.zero_()
            self._hist = self._buffer
        else:
            self._hist = None

    def _active(self, key: Hashable) -> bool:
        return self.level < _levels(self._key_dtype[key]) and self._state[key][0].need > 0

    def add(self, chunk: Chunk) -> None:
        key = self.scope_key(chunk)
        if key != self._current:
            self._flush()
            self._open(key, chunk)
        if self._hist is None or chunk.taus.shape[1] == 0:
            return
        key_dtype = self._key_dtype[key]
        shift = _levels(key_dtype) * RADIX_BITS - RADIX_BITS * (self.level + 1)
        for t in range(self.n_agents):
            bits = magnitude_bits(chunk.taus[t], key_dtype)
            if self.level == 0:
                digits = bits >> shift  # the top digit: the sign bit of a magnitude is 0
            else:
                digits = bits[(bits >> (shift + RADIX_BITS)) == self._state[key][t].prefix]
                digits = (digits >> shift) & (RADIX - 1) if shift else digits & (RADIX - 1)
            counts = torch.bincount(digits)
            self._hist[t, :counts.numel()] += counts

    def _flush(self) -> None:
        """Fold the current scope's histograms into its select state."""
        if self._hist is None:
            self._current = None
            return
        for state, hist in zip(self._state[self._current], self._hist.cpu().numpy()):
            above_or_at = hist[::-1].cumsum()  # above_or_at[j]: elements whose digit is ≥ RADIX-1-j
            j = int(np.searchsorted(above_or_at, state.need))  # first j with above_or_at[j] ≥ need
            digit = RADIX - 1 - j
            state.need -= int(above_or_at[j]) - int(hist[digit])
            state.prefix = (state.prefix << RADIX_BITS) | digit
        self._hist = None
        self._current = None

    def next_pass(self) -> bool:
        """Called after each full pass; True asks the engine for one more pass over every chunk."""
        self._flush()
        self.level += 1
        return any(self._active(key) for key in self._state)

    def finish(self) -> "TrimCuts":
        self._flush()
        assert not any(self._active(key) for key in self._state), "TIES cut not fully refined"
        cuts = {key: [(s.prefix, s.need) for s in states] for key, states in self._state.items()}
        return TrimCuts(self.scope, cuts, dict(self._key_dtype))


@dataclass
class TrimCuts:
    """Per scope and agent: (cut bit pattern c, number m of elements equal to c to keep)."""

    scope: str
    cuts: dict[Hashable, list[tuple[int, int]]]
    key_dtype: dict[Hashable, torch.dtype]


@dataclass
class TiesContext:
    cuts: TrimCuts
    scale: float
    seen: dict[tuple[Hashable, int], int] = field(default_factory=dict)  # equal-to-cut elements passed

    def trim_masks(self, chunk: Chunk) -> list[torch.Tensor]:
        """Which elements of each agent survive the trim in this chunk (call once per chunk, in order)."""
        key = chunk.job_index if self.cuts.scope == "tensor" else "model"
        if key not in self.cuts.cuts:  # an empty tensor
            return [torch.zeros(chunk.taus.shape[1], dtype=torch.bool, device=chunk.base.device)
                    for _ in range(chunk.n_agents)]
        key_dtype = self.cuts.key_dtype[key]
        masks = []
        for t, (cut, m) in enumerate(self.cuts.cuts[key]):
            bits = magnitude_bits(chunk.taus[t], key_dtype)
            keep = bits > cut
            seen = self.seen.get((key, t), 0)
            if seen < m and bits.numel():
                equal = bits == cut
                rank = equal.cumsum(0)  # 1-based rank of each equal element within this chunk
                keep |= equal & (rank <= m - seen)
                self.seen[(key, t)] = seen + int(rank[-1])
            masks.append(keep)
        return masks


def ties_merge(chunk: Chunk, ctx: TiesContext) -> torch.Tensor:
    masks = ctx.trim_masks(chunk)
    trimmed = [torch.where(keep, chunk.taus[t], 0.0) for t, keep in enumerate(masks)]
    merged = elect_disjoint_mean(trimmed, chunk.base)
    return merged * _scalar(ctx.scale, merged)


# --- DARE ----------------------------------------------------------------------------------------

HASH_BLOCK = 1 << 15  # CPU: positions hashed at a time, in place: buffers stay in cache, ops stay single-threaded


def _mul32_(x: torch.Tensor, c: int, tmp: torch.Tensor) -> None:
    """x ← x·c mod 2³² in place, for 0 ≤ x < 2³², without leaving the int64 range (every
    intermediate < 2⁴⁹: the 32-bit constant is split into 16-bit halves)."""
    torch.mul(x, c >> 16, out=tmp)
    tmp.bitwise_and_(0xFFFF).bitwise_left_shift_(16)
    x.mul_(c & 0xFFFF).add_(tmp).bitwise_and_(M32)


def _xorshift_(x: torch.Tensor, k: int, tmp: torch.Tensor) -> None:
    torch.bitwise_right_shift(x, k, out=tmp)
    x.bitwise_xor_(tmp)


def mix32_(x: torch.Tensor, tmp: torch.Tensor) -> torch.Tensor:
    """lowbias32 (Wellons), in place on an int64 tensor holding 0 ≤ x < 2³²; ``tmp`` is scratch."""
    _xorshift_(x, 16, tmp)
    _mul32_(x, 0x7FEB352D, tmp)
    _xorshift_(x, 15, tmp)
    _mul32_(x, 0x846CA68B, tmp)
    _xorshift_(x, 16, tmp)
    return x


def mix32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 of an int64 tensor holding 0 ≤ x < 2³² (a new tensor)."""
    return mix32_(x.clone(), torch.empty_like(x))


def dare_keys(seed: int, agent: int, name: str) -> tuple[int, int]:
    digest = hashlib.blake2b(f"ram-desktop-dare/1\0{seed}\0{agent}\0{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest[:4], "little"), int.from_bytes(digest[4:], "little")


def dare_uniform(seed: int, agent: int, name: str, offset: int, n: int, device: torch.device) -> torch.Tensor:
    """u in [0, 2³²) (int64) for flat positions offset .. offset+n-1 of tensor ``name`` of agent ``agent``."""
    a, b = dare_keys(seed, agent, name)
    out = torch.empty(n, dtype=torch.int64, device=device)
    block = n if device.type != "cpu" else HASH_BLOCK
    tmp = torch.empty(min(block, n), dtype=torch.int64, device=device)
    hi = torch.empty_like(tmp)
    for s in range(0, n, block):
        x = out[s:s + block]
        t, h = tmp[:x.numel()], hi[:x.numel()]
        torch.arange(offset + s, offset + s + x.numel(), out=x)
        torch.bitwise_right_shift(x, 32, out=h)
        h.bitwise_xor_(b)  # (i div 2³²) XOR b
        x.bitwise_and_(M32).bitwise_xor_(a)
        mix32_(x, t)
        x.bitwise_xor_(h)
        mix32_(x, t)
    return out


def dare_keep(seed: int, agent: int, name: str, offset: int, n: int, threshold: int,
              device: torch.device) -> torch.Tensor:
    """The kept elements (u ≥ T) of flat positions offset .. offset+n-1."""
    return dare_uniform(seed, agent, name, offset, n, device) >= threshold


def drop_threshold(p: float) -> int:
    """T = ⌊p·2³²⌋: an element is dropped when u < T (exact: scaling by a power of two)."""
    return math.floor(p * 4294967296.0)


@dataclass
class DareContext:
    drop: float
    seed: int
    scale: float

    def rescaled(self, chunk: Chunk) -> list[torch.Tensor]:
        """τ_t / (1 − p) where kept, 0 where dropped, per agent."""
        threshold = drop_threshold(self.drop)
        keep_scale = _scalar(1.0 - self.drop, chunk.base)
        out = []
        for t in range(chunk.n_agents):
            keep = dare_keep(self.seed, t, chunk.name, chunk.offset, chunk.taus.shape[1], threshold, chunk.base.device)
            out.append(torch.where(keep, chunk.taus[t] / keep_scale, 0.0))
        return out


def dare_ta_merge(chunk: Chunk, ctx: DareContext) -> torch.Tensor:
    total = agent_sum(ctx.rescaled(chunk), chunk.base)
    return total * _scalar(ctx.scale, total)


def dare_ties_merge(chunk: Chunk, ctx: DareContext) -> torch.Tensor:
    merged = elect_disjoint_mean(ctx.rescaled(chunk), chunk.base)
    return merged * _scalar(ctx.scale, merged)


# --- registration --------------------------------------------------------------------------------

def _scale(default: float, paper: str | None) -> Param:
    return Param("scale", float, default, "scaling term λ multiplying the merged task vector", -10.0, 10.0,
                 paper_range=paper)


DENSITY = Param("density", float, 0.2, "TIES trim: share k of each task vector kept (exactly ⌊k·n⌋ "
                "largest-magnitude elements per scope, at least 1)", 0.0, 1.0, paper_range="0.1, 0.2, 0.3 (Table 11)")
TIES_SCOPE = Param("ties_scope", str, "tensor", "TIES trim scope: tensor = per tensor per agent (like mergekit), "
                   "model = one cut over each agent's whole task vector (the TIES paper's)", choices=("tensor", "model"))
DROP = Param("drop", float, 0.5, "DARE drop rate p: each task-vector element is dropped with probability p, "
             "kept ones divided by 1-p", 0.0, 0.99, paper_range="0.1-0.9 in steps of 0.1 (Table 11)")
SEED = Param("seed", int, 0, "DARE random seed (the mask depends only on seed, agent, tensor and position)",
             0, 2**64 - 1)

METHODS = (
    MergeMethod(
        "average", "Average", "θ_pre + mean of the task vectors (plain weight averaging).",
        (), average_merge,
        thread_safe=True,  # pure per chunk: the result depends only on the chunk
    ),
    MergeMethod(
        "task-arithmetic", "Task Arithmetic", "θ_pre + λ·Σ task vectors.",
        (_scale(0.3, TABLE_11_SCALE),), task_arithmetic_merge,
        thread_safe=True,
    ),
    MergeMethod(
        "ties", "TIES", "Trim each task vector to its ⌊k·n⌋ largest magnitudes, elect signs, disjoint mean, ×λ.",
        (DENSITY, _scale(1.0, TABLE_11_SCALE), TIES_SCOPE),
        ties_merge,
        prepare=lambda params, probe, collected: TiesContext(collected, params["scale"]),
        collector=lambda params, plan: TrimCollector(params["density"], params["ties_scope"], plan),
    ),
    MergeMethod(
        "dare-ta", "DARE + Task Arithmetic", "Drop task-vector elements with probability p, rescale by 1/(1-p), λ·Σ.",
        (DROP, SEED, _scale(0.3, None)),
        dare_ta_merge,
        prepare=lambda params, probe, collected: DareContext(params["drop"], params["seed"], params["scale"]),
        # the mask is a hash of (seed, agent, tensor, position): pure per chunk, no state shared between chunks
        thread_safe=True,
    ),
    MergeMethod(
        "dare-ties", "DARE + TIES", "DARE drop and rescale in place of TIES's trim, then sign election, disjoint mean, ×λ.",
        (DROP, SEED, _scale(1.0, None)),
        dare_ties_merge,
        prepare=lambda params, probe, collected: DareContext(params["drop"], params["seed"], params["scale"]),
        thread_safe=True,
    ),
)
