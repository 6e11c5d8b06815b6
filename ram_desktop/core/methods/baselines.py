"""Baseline merge methods (docs/methods.md, 'Baselines'; paper section 5.1, appendix D, Table 11).

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
plan order, then flat index). Digit histograms are integer sums, so chunks are counted on every compute
thread in any order; a scope is reduced to its (c, m) state as soon as all its elements were counted
(scope ``tensor``: memory stays at a few 65536-bin histograms per agent). In a scope's last level
each chunk also keeps its digit counts sparsely (only the elements matching the prefix are left), so
once c is known every chunk's number of elements equal to c is known too; their running sums in plan
order are each chunk's offset, and the merge of a chunk is a pure function of the chunk: chunks
merge in parallel, and the result is the same for any chunk size and thread count.
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
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np

from ..engine import kernels
from ..engine.chunks import Chunk, StoredSlices
from ..errors import InputError
from ..lazy import torch
from .base import Analysis, FusedKernel, Interop, MergeMethod, Param, Streaming, Sweep, WouldKeep
from .mergekit_map import (
    TASK_ARITHMETIC_SHARED,
    MergekitExport,
    MergekitImport,
    MergekitInput,
    MergekitMapping,
    all_equal,
    check_density,
    one_density,
    unit_weights,
)

if TYPE_CHECKING:
    from ..engine.inspection import InspectStats
    from ..engine.kernels import KernelResult
    from ..engine.probe import ProbeReport

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


def sum_merge_into(
    base_raw: torch.Tensor | np.ndarray,
    agent_raws: list[torch.Tensor] | list[np.ndarray],
    scale: float,
    divide: bool,
    compute_dtype: torch.dtype | str,
    out_dtype: torch.dtype | str,
) -> KernelResult | None:
    """θ = base + Σ_t τ_t · scale (or ÷ scale with ``divide``) of one slice in ``out_dtype`` by the fused kernel,
    the bytes of ``task_arithmetic_merge`` / ``average_merge``; None when the kernels do not cover the slice."""
    from . import baselines_kernel

    m = kernels.merge_operands(base_raw, agent_raws, compute_dtype, out_dtype)
    if m is None:
        return None
    xb, total, _ = kernels.BUFFERS.get(m.cdt)
    bad, over = baselines_kernel.sum_kernel(m.base, m.agents, m.cdt(scale), divide, m.out, xb, total)
    return kernels.KernelResult(m.result, bad == 0, in_range=over == 0)


def average_fused(slices: StoredSlices, ctx: Any, counts: bool, observe: bool) -> KernelResult | None:
    job = slices.job
    return sum_merge_into(slices.base, slices.agents, len(slices.agents), True, job.compute_name, job.out_name)


def task_arithmetic_fused(slices: StoredSlices, ctx: dict, counts: bool, observe: bool) -> KernelResult | None:
    job = slices.job
    return sum_merge_into(slices.base, slices.agents, ctx["scale"], False, job.compute_name, job.out_name)


# --- TIES: exact trim ----------------------------------------------------------------------------


def keep_count(density: float, n: int) -> int:
    """K = ⌊k·n⌋, at least 1 (0 for an empty scope); k taken as the decimal it was written as."""
    if n <= 0:
        return 0
    return max(1, math.floor(Fraction(repr(float(density))) * n))


def magnitude_bits(tau: torch.Tensor, key_dtype: str) -> torch.Tensor:
    """|τ| as integers that order like the magnitudes (IEEE bits of a non-negative float); ``key_dtype`` is
    "float32" or "float64"."""
    if key_dtype == "float64":
        return tau.to(torch.float64).abs().view(torch.int64)
    return tau.abs().contiguous().view(torch.int32)


def dare_merge_into(
    base_raw: torch.Tensor | np.ndarray,
    agent_raws: list[torch.Tensor] | list[np.ndarray],
    first: int,
    keys: list[tuple[int, int]],
    threshold: int,
    drop: float,
    scale: float,
    ties: bool,
    compute_dtype: torch.dtype | str,
    out_dtype: torch.dtype | str,
) -> KernelResult | None:
    """θ = base + DARE-TA / DARE-TIES merged task vector of one slice (flat positions ``first`` ..) in
    ``out_dtype``, and whether every τ is finite; ``keys`` are the per-agent hash words of
    ``baselines.dare_keys``. None when the kernels do not cover the slice."""
    from . import baselines_kernel

    m = kernels.merge_operands(base_raw, agent_raws, compute_dtype, out_dtype)
    if m is None:
        return None
    base, agents, cdt = m.base, m.agents, m.cdt
    xb, total, _ = kernels.BUFFERS.get(cdt)
    values = kernels.BUFFERS.values(len(agents), cdt)
    keys_a = np.array([k[0] for k in keys], np.int64)
    keys_b = np.array([k[1] for k in keys], np.int64)
    bad = baselines_kernel.dare_kernel(
        base,
        agents,
        np.int64(first),
        keys_a,
        keys_b,
        np.int64(threshold),
        cdt(1.0 - drop),
        cdt(scale),
        ties,
        m.out,
        xb,
        total,
        values,
        *kernels.BUFFERS.pair(cdt),
        kernels.BUFFERS.hashes(),
    )
    return kernels.KernelResult(m.result, bad == 0)


def ties_digit_counts(
    base_raw: torch.Tensor | np.ndarray,
    agent_raws: list[torch.Tensor] | list[np.ndarray],
    compute_dtype: torch.dtype | str,
    key64: bool,
    level: int,
    prefixes: list[int],
) -> KernelResult | None:
    """TIES's radix-select digit counts of one slice at ``level`` (16 bits per level from the top of the
    32-bit, or with ``key64`` 64-bit, magnitude key): ``hist``, an ``[N, 65536]`` int64 histogram per agent of
    the elements whose higher digits equal ``prefixes[t]``, and whether every τ is finite. None when the
    kernels do not cover the slice."""
    from . import baselines_kernel

    ops = kernels.operands(base_raw, agent_raws)
    if (
        ops is None
        or (kernels.name_of(compute_dtype) == "float64" and not key64)
        or kernels.size_of(base_raw) >= 1 << 31
    ):
        return None
    base, agents = ops
    cdt = kernels.compute_type(compute_dtype)
    hist = np.zeros((len(agents), 4, (1 << 16) + 1), np.int32)  # the last column: elements off the prefix
    shift = (64 if key64 else 32) - 16 * (level + 1)
    xb, _, digits = kernels.BUFFERS.get(cdt)
    bad = baselines_kernel.ties_digits_kernel(
        base, agents, cdt(1), key64, np.int64(shift), level == 0, np.array(prefixes, np.int64), hist, xb, digits
    )
    return kernels.KernelResult(None, bad == 0, hist=hist[:, :, : 1 << 16].sum(1, dtype=np.int64))


def ties_merge_into(
    base_raw: torch.Tensor | np.ndarray,
    agent_raws: list[torch.Tensor] | list[np.ndarray],
    compute_dtype: torch.dtype | str,
    out_dtype: torch.dtype | str,
    key64: bool,
    cuts: list[int],
    left: list[int],
    scale: float,
) -> KernelResult | None:
    """θ = base + TIES merged task vector of one slice in ``out_dtype`` (``baselines.ties_merge``): agent t
    keeps |τ| above ``cuts[t]`` and the first ``left[t]`` elements of the slice equal to it; and whether
    every τ is finite. None when the kernels do not cover the slice."""
    from . import baselines_kernel

    m = kernels.merge_operands(base_raw, agent_raws, compute_dtype, out_dtype)
    if m is None or (kernels.name_of(compute_dtype) == "float64" and not key64):
        return None
    base, agents, cdt = m.base, m.agents, m.cdt
    xb, total, _ = kernels.BUFFERS.get(cdt)
    bad = baselines_kernel.ties_kernel(
        base,
        agents,
        key64,
        np.array(cuts, np.int64),
        np.array(left, np.int64),
        cdt(scale),
        m.out,
        xb,
        total,
        kernels.BUFFERS.values(len(agents), cdt),
        *kernels.BUFFERS.pair(cdt),
    )
    return kernels.KernelResult(m.result, bad == 0)


def _levels(key_dtype: str) -> int:
    return (64 if key_dtype == "float64" else 32) // RADIX_BITS


@dataclass
class _Select:
    """Radix-select state of one agent in one scope: ``need`` elements still to place at or below
    ``prefix`` (the cut's bits found so far)."""

    need: int
    prefix: int = 0


ChunkKey = tuple[int, int]  # (job index, flat offset of the chunk's first element)

EQUAL_RECORD_BUDGET = 4 << 20  # sparse digit counts held for the equal-to-cut offsets (~10 B each)


@dataclass
class _Scope:
    """One trim scope while a pass counts it: the digit histogram summed over its chunks, how many
    elements have been counted, and (in its last level) each chunk's sparse digit counts per agent."""

    numel: int
    hist: np.ndarray  # [N, RADIX] int64
    counted: int = 0
    records: dict[ChunkKey, list[tuple[np.ndarray, np.ndarray]]] = field(default_factory=dict)


class TrimCollector:
    """Pass-1 (and refinement passes) statistic of TIES: the exact per-agent magnitude cut per scope,
    and for every chunk the number of elements equal to the cut in earlier chunks of its scope.

    Order-independent, as every collector: a chunk's digit counts are integers summed into its
    scope's histogram under a lock, so chunks may be counted on any thread in any order. A scope is
    folded into its select state as soon as all its elements were counted (scope ``tensor``: memory
    stays at a few open histograms). In a scope's last level every chunk also keeps its digit counts
    sparsely (only elements matching the prefix remain); once the final cut digit is known, each
    chunk's count of elements equal to the cut is read off them. Should those records grow beyond
    ``EQUAL_RECORD_BUDGET`` entries, they are dropped and one more pass counts the equal elements
    per chunk directly."""

    def __init__(self, density: float, scope: str, plan: Any) -> None:
        self.density = density
        self.scope = scope
        self.n_agents = plan.n_agents
        jobs = plan.jobs
        self._numel = {i: j.numel for i, j in enumerate(jobs) if j.mergeable}
        self._dtype = {i: j.compute_name for i, j in enumerate(jobs) if j.mergeable}
        self.model_dtype = "float64" if "float64" in self._dtype.values() else "float32"
        self.level = 0
        self._counting_pass = False  # the extra pass that counts equal-to-cut elements per chunk
        self._state: dict[Hashable, list[_Select]] = {}
        self._key_dtype: dict[Hashable, str] = {}  # "float32" or "float64": the magnitude key's float
        self._open: dict[Hashable, _Scope] = {}
        self._records_held = 0
        self._needs_count: set[Hashable] = set()  # scopes whose records were dropped (over budget)
        self._equal: dict[ChunkKey, list[int]] = {}  # per chunk, per agent: elements equal to the cut
        self._chunk_scope: dict[ChunkKey, Hashable] = {}
        self._lock = threading.Lock()
        for index in self._numel:  # every scope's K and key dtype, known up front
            key = self.scope_key(index)
            if key not in self._state:
                self._key_dtype[key] = self._dtype[index] if scope == "tensor" else self.model_dtype
                self._state[key] = [_Select(keep_count(density, self._scope_numel(key))) for _ in range(self.n_agents)]

    def scope_key(self, job_index: int) -> Hashable:
        return job_index if self.scope == "tensor" else "model"

    def _scope_numel(self, key: Hashable) -> int:
        if self.scope == "tensor":
            assert isinstance(key, int)  # a tensor scope's key is its job index
            return self._numel[key]
        return sum(self._numel.values())

    def _active(self, key: Hashable) -> bool:
        return self.level < _levels(self._key_dtype[key]) and self._state[key][0].need > 0

    def _last_level(self, key: Hashable) -> bool:
        return self.level == _levels(self._key_dtype[key]) - 1

    def add(self, chunk: Chunk) -> None:
        key = self.scope_key(chunk.job_index)
        numel = chunk.taus.shape[1]
        if self._counting_pass:
            if key in self._needs_count and numel:
                self._count_equal(key, chunk)
            return
        if not self._active(key) or numel == 0:
            return
        key_dtype = self._key_dtype[key]
        shift = _levels(key_dtype) * RADIX_BITS - RADIX_BITS * (self.level + 1)
        last = self._last_level(key)
        counts = []
        for t in range(self.n_agents):
            bits = magnitude_bits(chunk.taus[t], key_dtype)
            if self.level == 0:
                digits = bits >> shift  # the top digit: the sign bit of a magnitude is 0
            else:
                digits = bits[(bits >> (shift + RADIX_BITS)) == self._state[key][t].prefix]
                digits = (digits >> shift) & (RADIX - 1) if shift else digits & (RADIX - 1)
            counts.append(torch.bincount(digits, minlength=RADIX).cpu().numpy())
        self._add_counts(
            key, (chunk.job_index, chunk.offset), numel, np.stack(counts), _sparse_digits(counts) if last else None
        )

    def add_slices(self, slices: StoredSlices) -> bool:
        """``add`` from the stored slices through the fused kernel (``ties_digit_counts``). False when
        the kernels do not cover them or a τ is not finite (the pass then forms the chunk, whose checks
        raise the error naming the tensor, and calls ``add``), and in the equal-count pass."""

        job_index = slices.index
        key = self.scope_key(job_index)
        numel = math.prod(slices.base.shape)
        if self._counting_pass:
            return False
        if not self._active(key) or numel == 0:
            return True
        key_dtype = self._key_dtype[key]
        done = ties_digit_counts(
            slices.base,
            slices.agents,
            slices.job.compute_name,
            key_dtype == "float64",
            self.level,
            [s.prefix for s in self._state[key]],
        )
        if done is None or not done.finite:
            return False
        counts = done.hist
        assert counts is not None  # ties_digit_counts always counts
        self._add_counts(
            key,
            (job_index, slices.span.offset),
            numel,
            counts,
            _sparse_digits(counts) if self._last_level(key) else None,
        )
        return True

    def _add_counts(
        self,
        key: Hashable,
        chunk_key: ChunkKey,
        numel: int,
        counts: np.ndarray,
        sparse: list[tuple[np.ndarray, np.ndarray]] | None,
    ) -> None:
        """Add one chunk's [N, RADIX] digit counts to its scope (any thread); fold the scope when complete."""
        with self._lock:
            scope = self._open.get(key)
            if scope is None:
                scope = self._open[key] = _Scope(self._scope_numel(key), np.zeros((self.n_agents, RADIX), np.int64))
            scope.hist += counts
            scope.counted += numel
            if sparse is not None and key not in self._needs_count:
                scope.records[chunk_key] = sparse
                self._records_held += sum(d.size for d, _ in sparse)
                if self._records_held > EQUAL_RECORD_BUDGET:  # too many distinct digits: count in a pass
                    for k, s in self._open.items():
                        if s.records:
                            self._records_held -= sum(d.size for r in s.records.values() for d, _ in r)
                            s.records.clear()
                            self._needs_count.add(k)
            if scope.counted == scope.numel:
                self._fold(key)

    def _fold(self, key: Hashable) -> None:
        """Fold a scope's histograms into its select state (called with the lock held)."""
        scope = self._open.pop(key)
        for state, hist in zip(self._state[key], scope.hist):
            above_or_at = hist[::-1].cumsum()  # above_or_at[j]: elements whose digit is ≥ RADIX-1-j
            j = int(np.searchsorted(above_or_at, state.need))  # first j with above_or_at[j] ≥ need
            digit = RADIX - 1 - j
            state.need -= int(above_or_at[j]) - int(hist[digit])
            state.prefix = (state.prefix << RADIX_BITS) | digit
        if self._last_level(key) and key not in self._needs_count:
            digits = [s.prefix & (RADIX - 1) for s in self._state[key]]
            for chunk_key, sparse in scope.records.items():
                self._equal[chunk_key] = [_sparse_count(d, c, digit) for (d, c), digit in zip(sparse, digits)]
                self._chunk_scope[chunk_key] = key
            self._records_held -= sum(d.size for r in scope.records.values() for d, _ in r)

    def _count_equal(self, key: Hashable, chunk: Chunk) -> None:
        """The extra pass: this chunk's elements equal to the final cut, per agent."""
        key_dtype = self._key_dtype[key]
        equal = [
            int((magnitude_bits(chunk.taus[t], key_dtype) == state.prefix).sum())
            for t, state in enumerate(self._state[key])
        ]
        with self._lock:
            self._equal[(chunk.job_index, chunk.offset)] = equal
            self._chunk_scope[(chunk.job_index, chunk.offset)] = key

    def _fold_open(self) -> None:
        with self._lock:
            for key in list(self._open):
                self._fold(key)

    def next_pass(self) -> bool:
        """Called after each full pass; True asks the engine for one more pass over every chunk."""
        self._fold_open()
        if self._counting_pass:
            self._needs_count.clear()
            self._counting_pass = False
            return False
        self.level += 1
        if any(self._active(key) for key in self._state):
            return True
        self._counting_pass = bool(self._needs_count)
        return self._counting_pass

    def finish(self) -> TrimCuts:
        self._fold_open()
        assert not any(self._active(key) for key in self._state), "TIES cut not fully refined"
        assert not self._needs_count, "TIES equal-to-cut counts not taken"
        cuts = {key: [(s.prefix, s.need) for s in states] for key, states in self._state.items()}
        # each chunk's offset: the equal-to-cut elements of earlier chunks of its scope, in plan order
        # (jobs in tensor-name order, chunks by offset), per agent
        before: dict[ChunkKey, tuple[int, ...]] = {}
        running: dict[Hashable, list[int]] = {}
        for chunk_key in sorted(self._equal):
            scope_key = self._chunk_scope[chunk_key]
            seen = running.setdefault(scope_key, [0] * self.n_agents)
            before[chunk_key] = tuple(seen)
            running[scope_key] = [s + e for s, e in zip(seen, self._equal[chunk_key])]
        equal = {chunk_key: tuple(e) for chunk_key, e in self._equal.items()}
        return TrimCuts(self.scope, cuts, dict(self._key_dtype), before, equal)


def _sparse_digits(counts) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per agent, a chunk's digit counts (RADIX bins) in sparse form: the digits present and their counts."""
    sparse = []
    for c in counts:
        nonzero = np.flatnonzero(c)
        sparse.append((nonzero.astype(np.uint16), c[nonzero]))
    return sparse


def _sparse_count(digits: np.ndarray, counts: np.ndarray, digit: int) -> int:
    """The count of ``digit`` in sparse (sorted digits, counts) form; 0 when absent."""
    i = int(np.searchsorted(digits, digit))
    return int(counts[i]) if i < digits.size and int(digits[i]) == digit else 0


@dataclass
class TrimCuts:
    """Per scope and agent: (cut bit pattern c, number m of elements equal to c to keep); per chunk
    (job index, offset) and agent: elements equal to c in earlier chunks of its scope, and in it."""

    scope: str
    cuts: dict[Hashable, list[tuple[int, int]]]
    key_dtype: dict[Hashable, str]
    equal_before: dict[ChunkKey, tuple[int, ...]] = field(default_factory=dict)
    equal_in: dict[ChunkKey, tuple[int, ...]] = field(default_factory=dict)  # per chunk and agent: equal to c

    def scope_key(self, job_index: int) -> Hashable:
        return job_index if self.scope == "tensor" else "model"

    def before(self, job_index: int, offset: int) -> tuple[int, ...]:
        """Equal-to-cut elements in earlier chunks of this chunk's scope, per agent. A chunk the collector
        never counted (the merge pass chunked the tensors differently) is an error."""
        try:
            return self.equal_before[(job_index, offset)]
        except KeyError:
            raise RuntimeError(
                f"TIES: no equal-to-cut offset for chunk ({job_index}, {offset}); the merge pass "
                "must chunk the tensors as the collector passes did"
            ) from None


@dataclass(frozen=True)
class TiesContext:
    """TIES's merge context: the cuts and λ. ``trim_masks`` depends only on the chunk (the offsets of
    the equal-to-cut elements come from the collector), so chunks merge on any thread in any order."""

    cuts: TrimCuts
    scale: float

    def trim_masks(self, chunk: Chunk) -> list[torch.Tensor]:
        """Which elements of each agent survive the trim in this chunk: |τ| above the cut, and the
        first m equal to it in scope order (the earliest positions win ties)."""
        trim = self.chunk_trim(chunk.job_index, chunk.offset, chunk.taus.shape[1])
        if trim is None:  # an empty tensor
            return [
                torch.zeros(chunk.taus.shape[1], dtype=torch.bool, device=chunk.base.device)
                for _ in range(chunk.n_agents)
            ]
        key_dtype, cuts, left = trim
        masks = []
        for t, (cut, quota) in enumerate(zip(cuts, left)):
            bits = magnitude_bits(chunk.taus[t], key_dtype)
            keep = bits > cut
            if quota > 0:
                equal = bits == cut
                rank = equal.cumsum(0)  # 1-based rank of each equal element within this chunk
                keep |= equal & (rank <= quota)
            masks.append(keep)
        return masks

    def chunk_trim(self, job_index: int, offset: int, numel: int) -> tuple[str, list[int], list[int]] | None:
        """For the chunk at ``offset`` of job ``job_index``: the magnitude key dtype, and per agent a cut and
        how many of this chunk's elements equal to it are kept (≤ 0: none). That is the cut c and m minus
        the ties at c in earlier chunks of the scope; where all of this chunk's ties at c are kept, the
        cut c − 1 and 0 instead (keys above c − 1 are those at or above c), so only the one chunk in
        which the kept ties end needs to rank them. None for an empty chunk."""
        key = self.cuts.scope_key(job_index)
        if key not in self.cuts.cuts or numel == 0:
            return None
        before = self.cuts.before(job_index, offset)
        here = self.cuts.equal_in[(job_index, offset)]
        cuts, left = [], []
        for (cut, m), b, e in zip(self.cuts.cuts[key], before, here):
            if m - b >= e:
                cuts.append(cut - 1)
                left.append(0)
            else:
                cuts.append(cut)
                left.append(m - b)
        return self.cuts.key_dtype[key], cuts, left


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
        x = out[s : s + block]
        t, h = tmp[: x.numel()], hi[: x.numel()]
        torch.arange(offset + s, offset + s + x.numel(), out=x)
        torch.bitwise_right_shift(x, 32, out=h)
        h.bitwise_xor_(b)  # (i div 2³²) XOR b
        x.bitwise_and_(M32).bitwise_xor_(a)
        mix32_(x, t)
        x.bitwise_xor_(h)
        mix32_(x, t)
    return out


def dare_keep(
    seed: int, agent: int, name: str, offset: int, n: int, threshold: int, device: torch.device
) -> torch.Tensor:
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


# --- fused CPU kernels (kernels.py): the same bits as the merges above ---------------------------------------


def ties_fused(slices: StoredSlices, ctx: TiesContext, counts: bool, observe: bool) -> KernelResult | None:
    """TIES of one chunk through ``ties_merge_into``: the cut and this chunk's share of the ties at
    the cut come from the context (``TiesContext.chunk_trim``), so chunks merge in any order."""

    job = slices.job
    trim = ctx.chunk_trim(slices.index, slices.span.offset, slices.span.numel)
    if trim is None:
        return None
    key_dtype, cuts, left = trim
    return ties_merge_into(
        slices.base, slices.agents, job.compute_name, job.out_name, key_dtype == "float64", cuts, left, ctx.scale
    )


def _dare_fused(ties: bool) -> FusedKernel:
    """DARE-TA (``ties`` False) or DARE-TIES of one chunk through ``dare_merge_into``."""

    def fused(slices: StoredSlices, ctx: DareContext, counts: bool, observe: bool) -> KernelResult | None:

        job = slices.job
        keys = [dare_keys(ctx.seed, t, job.name) for t in range(len(slices.agents))]
        return dare_merge_into(
            slices.base,
            slices.agents,
            slices.span.offset,
            keys,
            drop_threshold(ctx.drop),
            ctx.drop,
            ctx.scale,
            ties,
            job.compute_name,
            job.out_name,
        )

    return fused


# --- what each would keep (core.methods.would_keep; docs/engine.md, "What each method would keep") --------------------


def _updated(report: ProbeReport) -> list[float]:
    return [a.updated for a in report.agents]


def average_shares(report: ProbeReport, params: dict) -> list[float]:
    """Exact: w = 1/N."""
    n = len(report.agents)
    return [tot / n for tot in _updated(report)]


def scaled_shares(report: ProbeReport, params: dict) -> list[float]:
    """Task Arithmetic exactly (w = λ); DARE-TA in expectation (kept with probability 1 − p, scaled by 1/(1 − p))."""
    return [tot * params["scale"] for tot in _updated(report)]


def ties_shares(report: ProbeReport, params: dict) -> list[float] | None:
    """TIES: the trim (``trim_keep``), then the sign election's expected weight (``election_weight``)."""
    if getattr(report, "inspect", None) is None:  # an old report without the pair statistics
        return None
    n = len(report.agents)
    trim = trim_keep(report, params["density"], params["ties_scope"])
    present = [(sum(trim) - trim[t]) / (n - 1) if n > 1 else 1.0 for t in range(n)]
    return _elected_shares(report, params["scale"], trim, present)


def dare_ties_shares(report: ProbeReport, params: dict) -> list[float] | None:
    """DARE-TIES: each element kept with probability 1 − p and scaled by 1/(1 − p) (1 in expectation)."""
    n = len(report.agents)
    p = params["drop"]
    return _elected_shares(report, params["scale"], [1.0] * n, [1.0 - p] * n)


def _elected_shares(report: ProbeReport, scale: float, own: list[float], present: list[float]) -> list[float] | None:
    """Σ over the agent's elements shared with k others of the sign election's expected weight; None for an
    old report without the pair statistics."""
    stats = getattr(report, "inspect", None)
    if stats is None:
        return None
    n = len(report.agents)
    agree = agreement(stats, n)
    return [
        scale * own[t] * sum(a.overlap[k] * election_weight(k, agree[t], present[t]) for k in range(n))
        for t, a in enumerate(report.agents)
    ]


def agreement(stats: InspectStats, n: int) -> list[float]:
    """Per agent: the share of its shared elements' partners whose τ has the same sign (from ``pairs``)."""
    out = []
    for t in range(n):
        both = sum(stats.both[t][s] for s in range(n) if s != t)
        same = sum(stats.same_sign[t][s] for s in range(n) if s != t)
        out.append(same / both if both else 1.0)
    return out


def trim_keep(report: ProbeReport, density: float, scope: str) -> list[float]:
    """TIES's trim: per agent, the share of its updated elements among the ⌊k·n⌋ it keeps per scope,
    (every updated element outranks every other one: |τ| > ε ≥ the rest). Exact for the count of
    kept elements; it ignores which of an agent's elements the trim drops (the smallest ones)."""
    n = len(report.agents)
    if scope == "model":
        k = keep_count(density, report.params)
        return [min(a.updated, k) / a.updated if a.updated else 0.0 for a in report.agents]
    kept = [0] * n
    for t_stats in report.tensor_stats:
        k = keep_count(density, t_stats.params)
        for t in range(n):
            kept[t] += min(t_stats.updated[t], k)
    return [kept[t] / a.updated if a.updated else 0.0 for t, a in enumerate(report.agents)]


def election_weight(k: int, agree: float, present: float) -> float:
    """Expected weight TIES's sign election and disjoint mean give an element that agent t shares
    with k others (k = 0: unique, kept whole). Each other agent is present with probability
    ``present`` (survives its trim or DARE drop) and, when present, agrees in sign with probability
    ``agree``, independently; magnitudes are taken as equal, so the elected sign is the majority's
    (a tie is a coin flip). If t's sign is elected with j agreeing partners present, t gets 1/(j+1)."""
    if k == 0:
        return 1.0
    total = 0.0
    p_agree, p_dis, p_abs = present * agree, present * (1.0 - agree), 1.0 - present
    for j in range(k + 1):
        for d in range(k - j + 1):
            prob = math.comb(k, j) * math.comb(k - j, d) * p_agree**j * p_dis**d * p_abs ** (k - j - d)
            if j + 1 > d:
                win = 1.0
            elif j + 1 == d:
                win = 0.5
            else:
                win = 0.0
            total += prob * win / (j + 1)
    return total


# --- mergekit (0.1.5: merge_methods/generalized_task_arithmetic.py, linear.py, sparsify.py) ---------------------


def _from_task_arithmetic(given: MergekitInput) -> tuple[str, dict]:
    scale = unit_weights(given)
    all_equal(given.where, given.per_model["density"], "task_arithmetic does not sparsify", must=1.0)
    if given.shared["normalize"]:
        if scale != 1.0:
            raise InputError(
                f"{given.where}: parameters.normalize: true with lambda ≠ 1 cannot be expressed "
                "(it is the average times lambda); use normalize: false or lambda: 1"
            )
        return "average", {}
    return "task-arithmetic", {"scale": scale}


def _from_ties(given: MergekitInput) -> tuple[str, dict]:
    where, scale = given.where, unit_weights(given)
    density = one_density(given)
    if not given.shared["normalize"]:
        raise InputError(
            f"{where}: parameters.normalize: false (a disjoint sum) cannot be expressed; "
            "RAM Desktop's TIES takes the disjoint mean, set normalize: true"
        )
    if given.shared["rescale"]:
        raise InputError(
            f"{where}: parameters.rescale: true (L1 rescale of the trimmed values) cannot be expressed; remove it"
        )
    check_density(given, density)
    given.warnings.append(
        "ties: RAM Desktop keeps exactly ⌊k·n⌋ elements per tensor (exact rational k; earliest "
        "positions win among equal magnitudes at the cut); mergekit keeps int(k·n) by a float "
        "product and picks ties with a non-stable argsort"
    )
    return "ties", {"density": density, "scale": scale, "ties_scope": "tensor"}


def _from_dare(ours: str, normalize: bool) -> Callable[[MergekitInput], tuple[str, dict]]:
    """dare_linear (``normalize`` False, as ours is a sum) or dare_ties (True: ours takes the disjoint mean)."""

    def convert(given: MergekitInput) -> tuple[str, dict]:
        where, method, scale = given.where, given.method, unit_weights(given)
        density = one_density(given)
        if not given.shared["rescale"]:
            raise InputError(
                f"{where}: parameters.rescale: false (no rescale of the kept values) cannot be "
                "expressed; RAM Desktop divides them by 1 − p"
            )
        if normalize and not given.shared["normalize"]:
            raise InputError(
                f"{where}: parameters.normalize: false (mergekit's default for {method}: a disjoint "
                f"sum) cannot be expressed; RAM Desktop's {ours} takes the disjoint mean, set "
                "normalize: true"
            )
        if not normalize and given.shared["normalize"]:
            raise InputError(
                f"{where}: parameters.normalize: true (dividing by the number of models) cannot be "
                f"expressed for {method}; remove it and put the scale in lambda"
            )
        check_density(given, density)
        drop = float(Decimal(1) - Decimal(repr(density)))
        given.warnings.append(
            f"{method}: RAM Desktop drops with a seeded counter-based mask and divides the kept "
            f"values by 1 − p (p = 1 − density = {drop:g}); mergekit draws torch.bernoulli and "
            "rescales each tensor to its L1 norm, so the results differ in which elements survive "
            "and by how much they grow"
        )
        return ours, {"drop": drop, "seed": 0, "scale": scale}

    return convert


def _to_average(params: dict, eps: float) -> MergekitExport:
    return MergekitExport(
        "task_arithmetic",
        {"normalize": True},
        {"weight": 1.0},
        [
            (
                "average = base + (Σ τ_t)/N: task_arithmetic with weight 1 and normalize: true computes the same (mergekit's "
                "linear would average the models' weights, base included)"
            )
        ],
    )


def _to_task_arithmetic(params: dict, eps: float) -> MergekitExport:
    return MergekitExport(
        "task_arithmetic",
        {"lambda": params["scale"]},
        {"weight": 1.0},
        [
            (
                "task_arithmetic with weight 1 and lambda = scale computes base + λ·Σ τ_t like RAM Desktop (bit-identical "
                "with dtype float32)"
            )
        ],
    )


def _to_ties(params: dict, eps: float) -> MergekitExport:
    out = MergekitExport(
        "ties",
        {"lambda": params["scale"], "normalize": True},
        {"weight": 1.0, "density": params["density"]},
        [
            (
                "ties: mergekit keeps int(k·n) elements per tensor (float product: int(0.29·100) = 28) and breaks ties at "
                "the cut with a non-stable argsort; RAM Desktop keeps exactly ⌊k·n⌋ with the earliest positions winning"
            )
        ],
    )
    if params["ties_scope"] == "model":
        out.notes.append(
            "ties_scope: model (one trim over the whole task vector) has no mergekit equivalent; "
            "mergekit trims per tensor"
        )
    return out


def _to_dare(theirs: str, normalize: bool) -> Callable[[dict, float], MergekitExport]:
    def export(params: dict, eps: float) -> MergekitExport:
        shared: dict[str, Any] = {"lambda": params["scale"], "rescale": True}
        if normalize:
            shared["normalize"] = True
        per_model = {"weight": 1.0, "density": float(Decimal(1) - Decimal(repr(params["drop"])))}
        return MergekitExport(
            theirs,
            shared,
            per_model,
            [
                (
                    f"{theirs}: density = 1 − p. mergekit rescales kept values to each tensor's L1 norm (rescale: true; "
                    "false keeps them unscaled) where RAM Desktop divides by 1 − p, and draws its mask with torch.bernoulli "
                    f"(mergekit-yaml --random-seed) instead of seed {params['seed']}'s counter-based hash: different "
                    "elements survive"
                )
            ],
        )

    return export


SPARSE_PER_MODEL = {"weight": None, "density": 1.0}


def _gta(
    name: str, normalize: bool, rescale: bool, convert: Callable[[MergekitInput], tuple[str, dict]]
) -> MergekitImport:
    """A mergekit generalized-task-arithmetic method with its defaults."""
    return MergekitImport(
        name, {**TASK_ARITHMETIC_SHARED, "normalize": normalize, "rescale": rescale}, SPARSE_PER_MODEL, convert
    )


# --- registration --------------------------------------------------------------------------------


def _scale(default: float, paper: str | None) -> Param:
    return Param(
        "scale", float, default, "scaling term λ multiplying the merged task vector", -10.0, 10.0, paper_range=paper
    )


DENSITY = Param(
    "density",
    float,
    0.2,
    "TIES trim: share k of each task vector kept (exactly ⌊k·n⌋ largest-magnitude elements per scope, at least 1)",
    0.0,
    1.0,
    paper_range="0.1, 0.2, 0.3 (Table 11)",
)
TIES_SCOPE = Param(
    "ties_scope",
    str,
    "tensor",
    "TIES trim scope: tensor = per tensor per agent (like mergekit), "
    "model = one cut over each agent's whole task vector (the TIES paper's)",
    choices=("tensor", "model"),
    label="trim scope",
)
DROP = Param(
    "drop",
    float,
    0.5,
    "DARE drop rate p: each task-vector element is dropped with probability p, kept ones divided by 1-p",
    0.0,
    0.99,
    paper_range="0.1-0.9 in steps of 0.1 (Table 11)",
)
SEED = Param(
    "seed", int, 0, "DARE random seed (the mask depends only on seed, agent, tensor and position)", 0, 2**64 - 1
)

TA_PAPER = "Ilharco et al., *Editing Models with Task Arithmetic*, ICLR 2023, arXiv 2212.04089"
TIES_PAPER = "Yadav et al., *TIES-Merging: Resolving Interference When Merging Models*, NeurIPS 2023, arXiv 2306.01708"
DARE_PAPER = (
    "Yu et al., *Language Models are Super Mario: Absorbing Abilities from Homologous Models as a Free "
    "Lunch*, ICML 2024, arXiv 2311.03099"
)


def _dare(
    name: str,
    label: str,
    summary: str,
    scale: float,
    merge: Callable[[Chunk, DareContext], torch.Tensor],
    ties: bool,
    keep: Callable[[ProbeReport, dict], list[float] | None],
    theirs: str,
    short: str,
) -> MergeMethod:
    """DARE-TA (``ties`` False: λ·Σ) or DARE-TIES (sign election and disjoint mean): the same drop step,
    mask, parameters and mergekit family (``theirs``: dare_linear or dare_ties)."""
    return MergeMethod(
        name,
        label,
        summary,
        (DROP, SEED, _scale(scale, None)),
        merge,
        prepare=lambda params, probe, collected: DareContext(params["drop"], params["seed"], params["scale"]),
        short=short,
        # the mask is a hash of (seed, agent, tensor, position): pure per chunk, no state shared between chunks
        streaming=Streaming(thread_safe=True, fused=_dare_fused(ties)),
        analysis=Analysis(would_keep=WouldKeep(keep, estimated=True)),
        interop=Interop(
            mergekit=MergekitMapping(
                _to_dare(theirs, normalize=ties), (_gta(theirs, False, True, _from_dare(name, normalize=ties)),)
            ),
            sweep=Sweep("drop", "0.5"),
            citation=f"{DARE_PAPER}; {TIES_PAPER if ties else TA_PAPER}",
            searched_by_default=True,  # both DARE variants are among the paper's baselines
        ),
    )


METHODS = (
    MergeMethod(
        "average",
        "Average",
        "θ_pre + mean of the task vectors (plain weight averaging).",
        (),
        average_merge,
        short="Average",
        streaming=Streaming(thread_safe=True, fused=average_fused),  # pure per chunk
        analysis=Analysis(would_keep=WouldKeep(average_shares)),
        interop=Interop(
            # mergekit's linear averages the models themselves (methods/linear.py reads it)
            mergekit=MergekitMapping(_to_average),
            citation="Wortsman et al., *Model soups: averaging weights of multiple fine-tuned models improves accuracy "
            "without increasing inference time*, ICML 2022, arXiv 2203.05482",
            searched_by_default=True,
        ),
    ),
    MergeMethod(
        "task-arithmetic",
        "Task Arithmetic",
        "θ_pre + λ·Σ task vectors.",
        (_scale(0.3, TABLE_11_SCALE),),
        task_arithmetic_merge,
        short="TA",
        streaming=Streaming(thread_safe=True, fused=task_arithmetic_fused),
        analysis=Analysis(would_keep=WouldKeep(scaled_shares)),
        interop=Interop(
            mergekit=MergekitMapping(
                _to_task_arithmetic, (_gta("task_arithmetic", False, False, _from_task_arithmetic),)
            ),
            sweep=Sweep("scale", "0.3, 0.5, 1.0"),
            citation=TA_PAPER,
            searched_by_default=True,
            search_reference=True,
        ),
    ),
    MergeMethod(
        "ties",
        "TIES",
        "Trim each task vector to its ⌊k·n⌋ largest magnitudes, elect signs, disjoint mean, ×λ.",
        (DENSITY, _scale(1.0, TABLE_11_SCALE), TIES_SCOPE),
        ties_merge,
        prepare=lambda params, probe, collected: TiesContext(collected, params["scale"]),
        short="TIES",
        # the trim reads each chunk's equal-to-cut offset from the collector: pure per chunk
        streaming=Streaming(thread_safe=True, fused=ties_fused),
        analysis=Analysis(
            collector=lambda params, plan: TrimCollector(params["density"], params["ties_scope"], plan),
            would_keep=WouldKeep(ties_shares, estimated=True),
        ),
        interop=Interop(
            mergekit=MergekitMapping(_to_ties, (_gta("ties", True, False, _from_ties),)),
            sweep=Sweep("density", "0.2"),
            citation=TIES_PAPER,
            searched_by_default=True,
        ),
    ),
    _dare(
        "dare-ta",
        "DARE + Task Arithmetic",
        "Drop task-vector elements with probability p, rescale by 1/(1-p), λ·Σ.",
        0.3,
        dare_ta_merge,
        ties=False,
        keep=scaled_shares,
        theirs="dare_linear",
        short="DARE-TA",
    ),
    _dare(
        "dare-ties",
        "DARE + TIES",
        "DARE drop and rescale in place of TIES's trim, then sign election, disjoint mean, ×λ.",
        1.0,
        dare_ties_merge,
        ties=True,
        keep=dare_ties_shares,
        theirs="dare_ties",
        short="DARE-TIES",
    ),
)
