"""Fused CPU kernels (numba), the engine's generic primitives: one pass over memory per chunk.

The torch formulation in ``chunks`` / ``probe`` and the methods runs ~15 elementwise operations per
element, each a full pass over the chunk. Fused kernels read the stored bf16 / fp16 / fp32 / fp64 bits
directly and do, per element, what those operations do, in the same IEEE order. This module gives what
every fused kernel needs, and the kernels the engine itself runs:

* whether kernels run here (``available``, ``disabled``, ``enabled_here``), the stored bits of a slice
  (``as_bits``, ``operands``, ``widenable_operands``), its output slice from a reusable pool
  (``output_slice``, ``release_output``), both at once for a merging kernel (``merge_operands``,
  ``float32_operands``), per-thread block buffers (``BUFFERS``), a range split over every core
  (``split``) and the ``KernelResult`` a merging kernel returns;
* widening (``widen_into``), τ's finiteness (``finite_taus``), τ rows (``offsets_into``), the out-of-range
  check of a merged slice (``output_beyond_range``);
* counting: the update pattern p = Σ_t [|τ_t| > ε]·2^t and its histogram (``count_patterns``,
  ``ProbeAccumulator``'s counts; τ_t = agent − base in the compute dtype, ε rounded to it as torch
  compares a tensor with a scalar);
* analysing: the Analyze probe's statistics in one pass (``analyze``), a method's probe statistic
  (``contracts.ProbeStatistic``) counted in that pass through its numba piece.

Each method's own fused kernel lives beside it in ``core.methods`` (its numba code in a ``*_kernel.py``,
built on the helpers of ``kernel_code``: ``widen``, ``store``, ``pattern_histogram`` …): RAM / RAM+
(``methods.ram``), TIES and DARE (``methods.baselines``), the GTA family and DELLA (``methods.gta``),
Model Stock, SLERP.

No fastmath, no fused multiply-add contraction (numba's default), so every value is the same bits
as the torch path; the one explicit fused multiply-add (``kernel_code.fma32``) is where torch's compiled
code has one (the tail of its row norm). Whole-tensor reductions that must be torch's bits without the whole
tensor are emulated and checked against torch on the machine once (``TorchSum``, ``torch_norm_exact``); their
few kernels whose independent lanes are kept as scalars (torch's order) are compiled with LLVM's SLP vectoriser
(``kernel_code.slp_jit``), which reorders no float operation. Kernels release the GIL and run single-threaded on one chunk: the engine's
chunk-level compute threads provide the parallelism, so results never depend on thread count.

``available()`` is False when numba cannot be used; the passes then keep the torch path,
which also stays the reference and the CUDA path.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ..lazy import torch
from ..storage.formats.base import FLOAT_BITS, FLOAT_OF_BITS, dtype_name, torch_dtype
from .chunks import PATTERN_MAX_AGENTS

log = logging.getLogger("ram_desktop")


@functools.cache
def available() -> bool:
    """Whether the fused kernels can run here: numba importable, its cache usable (a frozen bundle must
    ship ``kernel_code.py`` as source), and not disabled by ``RAM_DESKTOP_KERNELS=0``."""
    if os.environ.get("RAM_DESKTOP_KERNELS", "1") == "0":
        return False
    try:
        _jit()
    except (ImportError, RuntimeError, OSError) as e:  # no numba, numba's "no locator available" for a missing
        # source file (RuntimeError), or an unusable cache folder
        log.info("fused CPU kernels unavailable (%s); using the torch path", e)
        return False
    return True


_local = threading.local()


@contextlib.contextmanager
def disabled(below: float = math.inf) -> Iterator[None]:
    """Passes started by this thread inside the block that stream fewer than ``below`` elements (all of
    them by default) use the torch path and never import numba.

    For the GUI: importing numba and loading a compiled kernel hold the GIL for ~0.1–0.3 s at a time
    (C calls into LLVM), which freezes the window's event loop once; on a big model the kernels save
    far more than that, on a small one the torch path is fast anyway."""
    previous = getattr(_local, "below", 0)
    _local.below = below
    try:
        yield
    finally:
        _local.below = previous


def enabled_here(elements: int) -> bool:
    """False inside ``disabled(below)`` on this thread for a pass over fewer than ``below`` elements."""
    return elements >= getattr(_local, "below", 0)


def as_bits(t: torch.Tensor | np.ndarray) -> np.ndarray:
    """A numpy view (no copy) of a contiguous CPU tensor: bfloat16 as uint16 bits, float16 as int16
    bits (the kernels tell them apart by type), float32 / float64 as themselves. A numpy array is
    taken to be such bits already (``chunks.SliceReader`` with ``bits``)."""
    if isinstance(t, np.ndarray):
        return t
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    if t.dtype == torch.float16:
        return t.view(torch.int16).numpy()
    return t.numpy()


@functools.cache
def _jit() -> dict:
    """The compiled kernels (numba imported on first use: commands that never merge on the CPU do
    not pay for it)."""
    from . import kernel_code as k

    return {
        "count": k.count_kernel,
        "to_bf16": k.float_to_bf16,
        "to_half": k.float_to_half,
        "from_bf16": k.bf16_to_float,
        "from_half": k.half_to_float,
        "analyze": k.analyze_kernel,
        "written_beyond_range": k.written_beyond_range,
        "widen": k.widen_kernel,
        "offsets": k.offsets_kernel,
        "nonfinite_taus": k.nonfinite_taus_kernel,
        "sum_feed": k.cascade_sum_feed,
        "sum_finish": k.cascade_sum_finish,
        "stored_norm": k.stored_norm,
        "norm_parts": k.norm_parts,
        "norm_finish": k.norm_finish,
    }


def name_of(dtype: torch.dtype | str) -> str:
    """A dtype given by name ("float32") or as a torch dtype, by name."""
    return dtype if isinstance(dtype, str) else dtype_name(dtype)


def float_name(raw: torch.Tensor | np.ndarray) -> str | None:
    """The float dtype name of a slice (numpy bits or a CPU tensor); None for anything the kernels do not read."""
    if isinstance(raw, np.ndarray):
        return FLOAT_OF_BITS.get(raw.dtype) if raw.flags.c_contiguous else None
    if raw.device.type != "cpu" or not raw.is_contiguous():
        return None
    name = dtype_name(raw.dtype)
    return name if name in FLOAT_BITS else None


def size_of(raw: torch.Tensor | np.ndarray) -> int:
    return raw.size if isinstance(raw, np.ndarray) else raw.numel()


def operands(base_raw: torch.Tensor | np.ndarray, agent_raws: list[torch.Tensor] | list[np.ndarray]):
    """(base bits, agents' bits as a tuple), or None when the kernels do not cover this slice (agents
    in different dtypes, an agent shorter than the base, too many agents, a non-float or non-CPU slice)."""
    n_agents = len(agent_raws)
    if not 1 <= n_agents <= PATTERN_MAX_AGENTS or float_name(base_raw) is None:
        return None
    dtype = float_name(agent_raws[0])
    n = size_of(base_raw)
    for a in agent_raws:
        if dtype is None or float_name(a) != dtype or size_of(a) != n:
            return None
    return as_bits(base_raw.reshape(-1)), tuple(as_bits(a.reshape(-1)) for a in agent_raws)


class _OutputPool:
    """Memory for merged slices, reused once written: a merge pass on numpy slices then page-faults a few
    chunks' worth of output instead of the whole model's (~0.1 CPU-s per 300M bf16 elements here).
    ``take`` hands out a view of a pool buffer; ``release`` (the writer, after writing it) returns the
    buffer. Buffers never released are freed as usual; anything not from the pool is ignored."""

    KEEP = 16  # free buffers kept per bits type
    MIN_ELEMENTS = 1 << 19  # a buffer fits a default chunk (chunks.DEFAULT_CHUNK_ELEMENTS), so it is reused

    def __init__(self) -> None:
        self._free: dict[type, list[np.ndarray]] = {}
        self._owners: weakref.WeakValueDictionary[int, np.ndarray] = weakref.WeakValueDictionary()
        self._lock = threading.Lock()

    def take(self, n: int, bits: type) -> np.ndarray:
        with self._lock:
            free = self._free.setdefault(bits, [])
            for i, buf in enumerate(free):
                if buf.size >= n:
                    return free.pop(i)[:n]
        buf = np.empty(max(n, self.MIN_ELEMENTS), bits)
        with self._lock:
            self._owners[id(buf)] = buf
        return buf[:n]

    def release(self, view: np.ndarray) -> None:
        owner = view.base
        with self._lock:
            if owner is None or self._owners.get(id(owner)) is not owner:
                return
            free = self._free.setdefault(owner.dtype.type, [])
            if len(free) < self.KEEP and all(b is not owner for b in free):
                free.append(owner)


_OUTPUTS = _OutputPool()


def output_beyond_range(bits: np.ndarray) -> bool:
    """Whether a kernel's output slice (its ``output_slice`` bits) holds ±Inf or NaN (``kernel_code.written_beyond_range``)."""
    flat = bits.reshape(-1)
    return bool(_jit()["written_beyond_range"](flat, flat.size))


def release_output(data: object) -> None:
    """Hand a written merged slice back for reuse (a no-op for anything the pool did not give out). The
    caller must not use ``data`` afterwards."""
    if isinstance(data, np.ndarray):
        _OUTPUTS.release(data)


def output_slice(
    base_raw: torch.Tensor | np.ndarray, out_dtype: torch.dtype | str
) -> tuple[np.ndarray, torch.Tensor | np.ndarray] | None:
    """A new output slice for the merged values: its bits (what the kernel writes) and what the caller gets,
    in the kind of the input (numpy bits from the pool for numpy slices, a new tensor of the base's shape
    for tensors). None when the output dtype is not a float."""
    name = name_of(out_dtype)
    if name not in FLOAT_BITS:
        return None
    if isinstance(base_raw, np.ndarray):
        bits = _OUTPUTS.take(base_raw.size, FLOAT_BITS[name])
        return bits, bits
    bits = np.empty(base_raw.numel(), FLOAT_BITS[name])
    return bits, torch.from_numpy(bits).view(torch_dtype(name)).view(base_raw.shape)


def compute_type(compute_dtype: torch.dtype | str) -> type:
    return np.float64 if name_of(compute_dtype) == "float64" else np.float32


@dataclass(frozen=True)
class MergeOperands:
    """What a merging kernel reads and writes for one slice: the base's and the agents' bits (``operands``),
    the compute dtype as a numpy type, the output bits the kernel writes and what the caller gets (``output_slice``)."""

    base: np.ndarray
    agents: tuple[np.ndarray, ...]
    cdt: type
    out: np.ndarray
    result: torch.Tensor | np.ndarray


def merge_operands(
    base_raw: torch.Tensor | np.ndarray,
    agent_raws: list[torch.Tensor] | list[np.ndarray],
    compute_dtype: torch.dtype | str,
    out_dtype: torch.dtype | str,
) -> MergeOperands | None:
    """The operands of a merging kernel, or None when the kernels do not cover the slice."""
    ops = operands(base_raw, agent_raws)
    output = output_slice(base_raw, out_dtype)
    if ops is None or output is None:
        return None
    return MergeOperands(ops[0], ops[1], compute_type(compute_dtype), output[0], output[1])


BLOCK = 2048  # elements per block: the per-block buffers stay in L1/L2


class Buffers(threading.local):
    """Per-thread block buffers (a few KiB each), reused across calls."""

    def get(self, dtype: type) -> tuple[np.ndarray, ...]:
        cache = self.__dict__.setdefault("blocks", {})
        if dtype not in cache:
            cache[dtype] = (np.empty(BLOCK, dtype), np.empty(BLOCK, dtype), np.empty(BLOCK, np.int32))
        return cache[dtype]

    def pair(self, dtype: type) -> tuple[np.ndarray, np.ndarray]:
        """Two more block buffers (the sign election's sums and counts)."""
        cache = self.__dict__.setdefault("pairs", {})
        if dtype not in cache:
            cache[dtype] = (np.empty(BLOCK, dtype), np.empty(BLOCK, dtype))
        return cache[dtype]

    def unique(self, dtype: type) -> tuple[np.ndarray, ...]:
        """A block's unique elements for ``kernel_code.analyze_kernel``: base values, updates, agents, and an int32
        scratch block for the probe statistic they are handed to."""
        cache = self.__dict__.setdefault("unique_blocks", {})
        if dtype not in cache:
            cache[dtype] = (
                np.empty(BLOCK, dtype),
                np.empty(BLOCK, dtype),
                np.empty(BLOCK, np.int64),
                np.empty(BLOCK, np.int32),
            )
        return cache[dtype]

    def hashes(self) -> np.ndarray:
        """A block of DARE's 32-bit hashes."""
        if "hash_block" not in self.__dict__:
            self.__dict__["hash_block"] = np.empty(BLOCK, np.uint32)
        return self.__dict__["hash_block"]

    def values(self, n_agents: int, dtype: type) -> np.ndarray:
        cache = self.__dict__.setdefault("value_rows", {})
        if (n_agents, dtype) not in cache:
            cache[(n_agents, dtype)] = np.empty((n_agents, BLOCK), dtype)
        return cache[(n_agents, dtype)]


BUFFERS = Buffers()


@dataclass
class KernelResult:
    """What a fused kernel gives for one slice: ``merged`` (θ in the output dtype, as numpy bits for numpy
    slices or a tensor for tensors; None for a kernel that only counts), whether every τ is ``finite``
    (otherwise the results are incomplete and the caller raises), the update-pattern histogram ``hist``
    (2^N int64) when asked for, and what the method's observer takes of the chunk (``observed``, the method's
    own value, which the engine hands to ``contracts.SliceObserver.observe_slices`` unread) when asked for.
    ``in_range``: the kernel checked every merged value as it wrote it and found none beyond the output dtype
    (±Inf, NaN), so the writer need not read the slice again to check (False: not checked, or found; the writer
    checks)."""

    merged: torch.Tensor | np.ndarray | None
    finite: bool
    hist: np.ndarray | None = None
    observed: Any = None
    in_range: bool = False


def count_patterns(
    base_raw: torch.Tensor | np.ndarray,
    agent_raws: list[torch.Tensor] | list[np.ndarray],
    eps: float,
    compute_dtype: torch.dtype | str,
) -> KernelResult | None:
    """Histogram of update patterns over a slice (int64, 2^N bins) and whether every τ is finite;
    None when the kernels do not cover the slice (use the torch path)."""
    ops = operands(base_raw, agent_raws)
    if ops is None:
        return None
    base, agents = ops
    cdt = compute_type(compute_dtype)

    def count(start: int, stop: int) -> tuple[int, np.ndarray]:
        hist = np.zeros((4, 1 << len(agents)), np.int64)
        _, _, pattern = BUFFERS.get(cdt)  # this thread's
        bad = _jit()["count"](base[start:stop], tuple(a[start:stop] for a in agents), cdt(eps), hist, pattern)
        return bad, hist

    parts = split(base.size, count)  # counts add up exactly however the slice is parted
    return KernelResult(None, sum(bad for bad, _ in parts) == 0, hist=sum(hist for _, hist in parts).sum(0))


ANALYZE_MAX_AGENTS = 8  # the joint (pattern, sign) histogram has 4^N bins


@dataclass
class UlpSample:
    """Which rows of a slice the ulp histogram samples, and the stored dtype's ulp: rows ``first``,
    ``first + stride`` .. of ``row`` elements; ``significand`` bits, biased exponent at least ``min_exponent``."""

    row: int
    first: int
    stride: int
    significand: int
    min_exponent: int


@dataclass
class SliceStatistics:
    """One slice's complete-probe statistics from ``analyze`` (the probe accumulator adds them up)."""

    joint: np.ndarray  # [4^N] int64: elements per key p + 2^N·q (update pattern p, positive agents q)
    counts: np.ndarray | None  # [N, *shape] int64: the probe statistic's counts of the unique elements (None: none)
    ulps: np.ndarray  # [N, ulp bins] int64: the sampled updated elements per ulp bin
    finite: bool  # every τ finite (otherwise the statistics are incomplete and the caller raises)


@functools.lru_cache(maxsize=16)
def _unique_agent(n_agents: int) -> np.ndarray:
    """agent_of[p + 2^N·q] = t where the update pattern p is 2^t alone, −1 otherwise."""
    table = np.full((1 << n_agents, 1 << n_agents), -1, np.int32)  # [q, p]
    for t in range(n_agents):
        table[:, 1 << t] = t
    return table.reshape(-1)


def analyze(
    base_raw: torch.Tensor | np.ndarray,
    agent_raws: list[torch.Tensor] | list[np.ndarray],
    eps: float,
    compute_dtype: torch.dtype | str,
    statistic: Callable[[type], Any] | None,
    shape: tuple[int, ...],
    ulp_bins: int,
    sample: UlpSample | None,
) -> SliceStatistics | None:
    """The Analyze probe's statistics of one slice in one pass (``kernel_code.analyze_kernel``): the joint
    update-pattern / sign histogram, a method's statistic of the unique elements (``statistic``, its numba piece
    ``contracts.ProbeStatistic.fused``, counting ``[N, *shape]`` int64; None: none) and the ulp sample, each count
    exactly what the torch formulation (``ProbeAccumulator`` / ``InspectAccumulator``) counts. None when the
    kernels do not cover the slice (more than ``ANALYZE_MAX_AGENTS`` agents among others, a statistic that gives
    no numba value)."""
    ops = operands(base_raw, agent_raws)
    if ops is None or len(agent_raws) > ANALYZE_MAX_AGENTS:
        return None
    fused = statistic(compute_type(compute_dtype)) if statistic is not None else None
    if statistic is not None and fused is None:
        return None
    base, agents = ops
    n = len(agents)
    cdt = compute_type(compute_dtype)
    joint = np.zeros((4, 1 << (2 * n)), np.int64)
    counts = np.zeros((n, *shape) if statistic is not None else (n, 0), np.int64)
    ulps = np.zeros((n, ulp_bins), np.int64)
    s = sample or UlpSample(0, 0, 1, 0, 0)
    xb, total, key = BUFFERS.get(cdt)
    ux, ut, ua, scratch = BUFFERS.unique(cdt)
    bad = _jit()["analyze"](
        base,
        agents,
        cdt(eps),
        cdt(1),
        fused,
        counts,
        _unique_agent(n),
        joint,
        np.int64(s.row),
        np.int64(s.first),
        np.int64(s.stride),
        np.int64(s.significand),
        np.int64(s.min_exponent),
        ulps,
        xb,
        total,
        key,
        ux,
        ut,
        ua,
        scratch,
    )
    return SliceStatistics(joint.sum(0), counts if statistic is not None else None, ulps, bad == 0)


def widenable_operands(
    base_raw: torch.Tensor | np.ndarray, agent_raws: list[torch.Tensor] | list[np.ndarray]
) -> tuple[np.ndarray, tuple[np.ndarray, ...]] | None:
    """(base bits, agents' bits) of float16 / bfloat16 / float32 slices all of one dtype, which the kernels widen
    to float32 exactly (mergekit's whole-tensor methods at ``dtype: float32``); None otherwise."""
    ops = operands(base_raw, agent_raws)
    if ops is None or ops[0].dtype == np.float64 or ops[0].dtype != ops[1][0].dtype:
        return None
    return ops


def float32_operands(
    base_raw: torch.Tensor | np.ndarray, agent_raws: list[torch.Tensor] | list[np.ndarray], out_dtype: torch.dtype | str
) -> MergeOperands | None:
    """``widenable_operands`` and an output slice of ``out_dtype``: what a kernel computing in float32 and
    writing the merged slice reads and writes; None when the kernels do not cover the slices."""
    ops = widenable_operands(base_raw, agent_raws)
    output = output_slice(base_raw, out_dtype) if ops is not None else None
    if ops is None or output is None:
        return None
    return MergeOperands(ops[0], ops[1], np.float32, output[0], output[1])


PART_ELEMENTS = 1 << 20  # the least work worth a thread of its own in ``split``
_POOL: list[ThreadPoolExecutor] = []
_POOL_LOCK = threading.Lock()


def mark_compute_thread() -> None:
    """Called by the passes' compute threads: a kernel called there runs on that thread alone (the pass already
    keeps every core busy)."""
    _local.compute_thread = True


def _pool() -> ThreadPoolExecutor:
    with _POOL_LOCK:
        if not _POOL:
            _POOL.append(ThreadPoolExecutor(os.cpu_count() or 1, thread_name_prefix="ram-desktop-kernel"))
    return _POOL[0]


def split_tasks(tasks: list[Callable[[], object]]) -> list:
    """Each of ``tasks`` (independent kernels releasing the GIL) on the kernel threads, the first on this one,
    results in order; all on this thread on a pass's compute thread or a one-core machine."""
    if len(tasks) <= 1 or (os.cpu_count() or 1) <= 1 or getattr(_local, "compute_thread", False):
        return [task() for task in tasks]
    futures = [_pool().submit(task) for task in tasks[1:]]
    return [tasks[0](), *(f.result() for f in futures)]


def split(n: int, run: Callable[[int, int], object]) -> list:
    """``run(start, stop)`` over parts of ``range(n)`` on every core (the kernels release the GIL), results in
    part order; on this thread alone for small ``n`` or on a pass's compute thread. Elementwise and per-row
    kernels give the same bits however the range is split."""
    parts = min(os.cpu_count() or 1, n // PART_ELEMENTS)
    if parts <= 1 or getattr(_local, "compute_thread", False):
        return [run(0, n)]
    bounds = [n * k // parts for k in range(parts + 1)]
    futures = [_pool().submit(run, bounds[k], bounds[k + 1]) for k in range(1, parts)]
    return [run(bounds[0], bounds[1]), *(f.result() for f in futures)]


def widen_into(a: np.ndarray, start: int, out: np.ndarray) -> None:
    """``out[i] = a[start + i]`` as float32 (``kernel_code.widen_kernel``)."""
    split(out.size, lambda s, e: _jit()["widen"](a, start + s, out[s:e]))


def offsets_into(base: np.ndarray, agents: tuple[np.ndarray, ...], out: np.ndarray) -> bool:
    """``out[t] = agents[t] − base`` in float32; whether every one is finite (``kernel_code.offsets_kernel``)."""
    bad = split(base.size, lambda s, e: _jit()["offsets"](base[s:e], tuple(a[s:e] for a in agents), out[:, s:e]))
    return sum(bad) == 0


def finite_taus(base: np.ndarray, agents: tuple[np.ndarray, ...]) -> bool:
    """Whether every ``agents[t] − base`` (float32) is finite, without storing them."""
    bad = split(base.size, lambda s, e: _jit()["nonfinite_taus"](base[s:e], tuple(a[s:e] for a in agents)))
    return sum(bad) == 0


SUM_GRAIN = 32768  # torch's internal::GRAIN_SIZE: below it a reduction runs on one thread
SUM_LANES = 8  # the float lanes of torch's sum kernel (it keeps the AVX2 kernel on AVX512 machines)


class TorchSum:
    """``torch.sum`` of a float32 CPU tensor of ``n`` ≥ 8 elements (or of their absolute values), fed in order in
    slices of any size, to the bit: torch parts the elements among its intra-op threads (``two_pass_reduction``,
    ``parallel_for``), sums each part with its cascade (``kernel_code.cascade_sum_feed``) and adds the parts'
    sums in thread order. So a whole-tensor sum needs no whole tensor. ``exact()`` says whether this
    emulation gives torch's bits here (checked once per thread count); where it does not, callers keep torch."""

    _checked: ClassVar[dict[int, bool]] = {}

    def __init__(self, n: int, absolute: bool = False) -> None:
        threads = torch.get_num_threads()
        if n < SUM_GRAIN or threads == 1:
            bounds = [(0, n)]
        else:
            used = min(threads, -(-n // SUM_GRAIN))
            step = -(-n // used)
            bounds = [(b, min(n, b + step)) for b in range(0, n, step)]
        self._bounds = bounds
        self._absolute = absolute
        self._parts = []
        for start, stop in bounds:
            vectors = (stop - start) // SUM_LANES
            rows = vectors // 4
            power = max(4, (max(rows - 1, 1)).bit_length() // 4 if rows > 2 else 1)
            self._parts.append(
                (
                    np.array([0, rows, vectors, power], np.int64),
                    np.zeros((4, 4, SUM_LANES), np.float32),
                    np.zeros(1, np.float32),
                )
            )
        self._fed = 0

    @property
    def bounds(self) -> list[tuple[int, int]]:
        """The element ranges torch sums apart (one per intra-op thread it uses), in order."""
        return list(self._bounds)

    def feed_part(self, part: int, values: np.ndarray) -> None:
        """The next ``values`` (float32, flat) of the range ``bounds[part]``, in order: each part may be fed on a
        thread of its own (an instance is fed either this way or with ``feed``, not both)."""
        _jit()["sum_feed"](values, *self._parts[part], self._absolute)

    def feed(self, values: np.ndarray) -> None:
        """The next ``values`` (float32, flat) of the tensor, in order."""
        feed = _jit()["sum_feed"]
        at = 0
        while at < values.size:
            part = next(i for i, (s, e) in enumerate(self._bounds) if s <= self._fed < e)
            take = min(values.size - at, self._bounds[part][1] - self._fed)
            feed(values[at : at + take], *self._parts[part], self._absolute)
            at += take
            self._fed += take

    def result(self) -> float:
        """The sum, as a float32 value held in a Python float."""
        finish = _jit()["sum_finish"]
        total = np.float32(0.0)
        for state, acc, tail in self._parts:
            total = np.float32(total + finish(state, acc, tail))
        return float(total)

    @classmethod
    def exact(cls) -> bool:
        """Whether ``TorchSum`` gives ``torch.sum``'s bits on this machine and thread count (a few sizes that
        take every branch: a short part, scalar tails, several level blocks, two parts)."""
        threads = torch.get_num_threads()
        known = cls._checked.get(threads)
        if known is None:
            rng = np.random.default_rng(0)
            known = True
            for n in (8, 37, 4099, 40_001, 1_000_003):
                values = (rng.standard_normal(n) * 3).astype(np.float32)
                for absolute in (False, True):
                    summed = cls(n, absolute)
                    for start in range(0, n, 65_537):
                        summed.feed(values[start : start + 65_537])
                    reference = torch.from_numpy(values)
                    expected = float((reference.abs() if absolute else reference).sum())
                    known = known and summed.result() == expected
            cls._checked[threads] = known
        return known


@functools.cache
def torch_norm_exact() -> bool:
    """Whether ``kernel_code.norm_finish`` (with ``stored_norm``, and with ``norm_parts`` of an offset) gives the
    bits of torch's 2-norm of a float32 CPU row of two or more elements (``torch.linalg.vector_norm(row, dim=-1)``,
    one thread whatever torch's thread count) on this machine, for float32 rows and bfloat16 bits as stored, a row
    itself and its offset from another: sizes taking every branch (no whole vector, every tail length, long rows),
    large and tiny values. This also checks the vectorised code these kernels compile to (``slp_jit``). Where
    it does not hold, callers keep torch."""
    jitted = _jit()
    norm, parts, finish = jitted["stored_norm"], jitted["norm_parts"], jitted["norm_finish"]
    rng = np.random.default_rng(0)
    sizes = (*range(2, 24), 37, 4099, 40_001, 1_000_003)  # a row of one element is torch's |x|, not this kernel

    def torch_norm(row: torch.Tensor) -> float:
        return float(torch.linalg.vector_norm(row, dim=-1))

    def offset_norm(values: np.ndarray, base: np.ndarray) -> float:
        lanes, tail = np.zeros(8, np.float32), np.zeros(8, np.float32)
        parts(values, base, lanes, tail)
        return float(finish(values.size, lanes, tail))

    draws = rng.standard_normal((2, max(sizes)))
    for n in sizes:
        for scale in (3.0, 1e-20, 1e18):
            values, base = (draws[:, :n] * scale).astype(np.float32)
            bf16 = (values.view(np.uint32) >> 16).astype(np.uint16)
            bf16_base = (base.view(np.uint32) >> 16).astype(np.uint16)
            widened, widened_base = (
                torch.from_numpy(b.view(np.int16)).view(torch.bfloat16).float() for b in (bf16, bf16_base)
            )
            if (
                float(norm(values)) != torch_norm(torch.from_numpy(values))
                or float(norm(bf16)) != torch_norm(widened)
                or offset_norm(values, base) != torch_norm(torch.from_numpy(values) - torch.from_numpy(base))
                or offset_norm(bf16, bf16_base) != torch_norm(widened - widened_base)
            ):
                return False
    return True
