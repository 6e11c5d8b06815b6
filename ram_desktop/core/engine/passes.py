"""Streaming passes: a reader (``chunks.prefetch_chunks`` through a ``Transfer``), per-chunk work on
compute threads, and sinks (the probe accumulator, a method's collector or observer, shard writers).

``probe_pass`` feeds every chunk to statistics sinks; ``merge_pass`` merges every chunk with each
``PassOutput`` (one variant: a method and its parameters; one or several from one read of the inputs) and
hands each result to that output's own writer. The engine composes these; it threads no flags through them.
"""

from __future__ import annotations

import os
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InputError
from ..events import Reporter
from ..lazy import torch
from ..storage.formats import lora
from ..storage.formats.base import FLOAT_BITS
from ..storage.output import MemoryShards, ShardSet
from ..storage.transfer import Transfer
from . import kernels
from .chunks import (
    DEFAULT_CHUNK_ELEMENTS,
    PREFETCH_DEPTH,
    Chunk,
    OpenFiles,
    StoredSlices,
    Workspace,
    as_tensor,
    prefetch_chunks,
    thread_workspace,
)
from .contracts import Collector, MergingMethod, Observer, SliceCollector, SliceObserver
from .inspection import ULP_BINS
from .plan import AuxInput, MergePlan
from .probe import ProbeAccumulator

_local = threading.local()


def _workspace() -> Workspace:
    """This thread's scratch buffers (each compute thread reuses its own from chunk to chunk), for a chunk
    on the torch path; a compute thread's torch runs single-threaded from its first such chunk on."""
    if getattr(_local, "compute_thread", False) and not getattr(_local, "single_threaded", False):
        torch.set_num_threads(1)
        _local.single_threaded = True
    return thread_workspace()


def compute_workers(device_type: str) -> int:
    """Compute threads for a CPU pass: one per available core (``RAM_DESKTOP_THREADS`` overrides),
    each running torch single-threaded on whole chunks. Chunk-level threads need no barrier per
    operation, so they keep working when other programs load the machine. GPU passes use one."""
    if device_type != "cpu":
        return 1
    env = os.environ.get("RAM_DESKTOP_THREADS")
    if env and env.isdigit() and int(env) > 0:
        return int(env)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def use_kernels(device_type: str, elements: int) -> bool:
    """CPU passes run the fused numba kernels where they apply (``kernels.py``). ``RAM_DESKTOP_KERNELS=0``,
    no numba, or a pass of ``elements`` inside ``kernels.disabled()``: the torch formulation, which stays
    the reference and the GPU path."""
    return device_type == "cpu" and kernels.enabled_here(elements) and kernels.available()


def _compute_thread() -> None:
    """Marks a pool thread as a compute thread (``_workspace`` makes its torch single-threaded when it needs
    torch: a pass on the fused kernels may never import it)."""
    _local.compute_thread = True
    kernels.mark_compute_thread()


def ordered_map(fn: Callable[[Any], Any], items: Iterable[Any], workers: int) -> Iterator[Any]:
    """``map(fn, items)`` computed by ``workers`` threads, results in input order, at most
    ``workers + 1`` items in flight. With one worker it runs inline (torch keeps its own threads)."""
    if workers <= 1:
        for item in items:
            yield fn(item)
        return
    with ThreadPoolExecutor(workers, thread_name_prefix="ram-desktop-compute", initializer=_compute_thread) as pool:
        pending: deque = deque()
        try:
            for item in items:
                pending.append(pool.submit(fn, item))
                if len(pending) > workers:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()


def probe_pass(
    plan: MergePlan,
    eps: float,
    transfer: Transfer,
    reporter: Reporter,
    sinks: Sequence[ProbeAccumulator | Collector],
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
    stage: str = "probe",
    files: OpenFiles | None = None,
) -> None:
    """Stream every mergeable tensor once and ``add`` each chunk to every sink, from every compute thread,
    chunks in any order. ``files``: the run's open inputs, shared by its passes (``chunks.OpenFiles``)."""
    jobs = [i for i, j in enumerate(plan.jobs) if j.mergeable]
    total = sum(plan.jobs[i].numel for i in jobs)
    done = 0
    reporter.progress(stage, 0, total, "elements")
    workers = compute_workers(transfer.device_type)
    fused = use_kernels(transfer.device_type, total)

    def work(item: tuple) -> int:
        slices = StoredSlices.read(plan, item, eps)
        pending = sinks
        if fused and _stored_agents(slices.job):  # sinks that take the stored slices: one fused pass each
            pending = [sink for sink in sinks if not _add_fused(sink, slices)]
        if pending:
            chunk = slices.load(_workspace())
            for sink in pending:
                sink.add(chunk)
        return slices.span.numel

    items = prefetch_chunks(plan, jobs, chunk_elements, transfer, bits=fused, files=files)
    for numel in ordered_map(work, items, workers):
        done += numel
        reporter.progress(stage, done, total, "elements")


def _add_fused(sink: ProbeAccumulator | Collector, slices: StoredSlices) -> bool:
    """Add one chunk to ``sink`` from its stored slices through a fused kernel: the probe's counts, the
    complete (Analyze) probe, or a ``SliceCollector``'s statistic. False when the kernels do not
    cover the slices or a τ is not finite (the caller then forms the chunk, whose checks raise the error
    naming agent and tensor)."""
    job, index, span = slices.job, slices.index, slices.span
    if isinstance(sink, ProbeAccumulator) and sink.complete:
        if not sink.fusable:
            return False
        # the complete (Analyze) probe: counts, signs, a method's statistic and the ulp sample in one fused pass
        assert sink.inspect is not None  # the complete probe keeps the inspection statistics
        sample = sink.inspect.ulp_sample(index, span.offset, span.numel, job.compute_dtype)
        statistic = sink.fused_statistic
        analysis = kernels.analyze(
            slices.base,
            slices.agents,
            slices.eps,
            job.compute_name,
            statistic.fused if statistic is not None else None,
            statistic.shape if statistic is not None else (),
            ULP_BINS,
            sample,
        )
        if analysis is None or not analysis.finite:
            return False
        sink.add_analysis(index, analysis)
        return True
    if isinstance(sink, ProbeAccumulator):
        counted = kernels.count_patterns(slices.base, slices.agents, slices.eps, job.compute_name)
        if counted is None or not counted.finite:
            return False
        assert counted.hist is not None  # count_patterns always counts
        sink.add_pattern_counts(index, counted.hist)
        return True
    return isinstance(sink, SliceCollector) and sink.add_slices(slices)


@dataclass
class PassOutput:
    """One output of a merge pass: a method with resolved parameters and its prepared context, the
    shards it writes to, and its observer (if the method has one)."""

    method: MergingMethod
    params: dict
    context: Any
    shards: ShardSet | MemoryShards  # written shards, or the in-memory sink (search trials)
    observer: Observer | None = None


def merge_pass(
    plan: MergePlan,
    variants: list[PassOutput],
    eps: float,
    transfer: Transfer,
    reporter: Reporter,
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
    accumulator: ProbeAccumulator | None = None,
    files: OpenFiles | None = None,
    aux: Sequence[AuxInput] = (),
) -> None:
    """Read every tensor once; merge each chunk with every variant (θ = base + τ_merged, rounded once
    to the output dtype) and write it to that variant's shards, in order, from a writer thread.
    Tensors that are not merged are copied from the base. ``accumulator`` (when no probe ran first)
    collects the probe's counts on the way. ``files``: the run's open inputs (``chunks.OpenFiles``).
    ``aux``: per-agent auxiliary inputs the variants' methods read (``contracts.Streaming.aux_inputs``), streamed
    beside the agents and handed to each chunk as ``chunk.aux``."""
    total = sum(j.numel for j in plan.jobs)
    done = 0
    reporter.progress("merge", 0, total, "elements")
    parallel = all(v.method.streaming.thread_safe for v in variants)
    workers = compute_workers(transfer.device_type) if parallel else 1
    kernels_here = use_kernels(transfer.device_type, total)
    # each variant whose method has a fused kernel runs it; the others share one chunk on the torch path
    fused_at = [k for k, v in enumerate(variants) if kernels_here and _fusable(v)]
    torch_at = [k for k in range(len(variants)) if k not in fused_at]
    theta_only = all(variants[k].method.streaming.theta for k in torch_at)
    # the stored bits, for the fused kernels: a fused merge, or θ widened by them (``_widened_chunk``)
    bits_read = bool(fused_at) or (theta_only and kernels_here)
    depth = PREFETCH_DEPTH
    if any(v.method.streaming.whole_tensor for v in variants):  # whole-tensor statistics: one chunk per tensor
        chunk_elements = max([chunk_elements, *(j.numel for j in plan.jobs)])
        depth = 1  # one whole tensor read ahead, not three: memory stays near one tensor's inputs and outputs

    def work(item: tuple) -> tuple[int, int, list[torch.Tensor | np.ndarray], list[bool]]:
        slices = StoredSlices.read(plan, item, eps, aux)
        index, span, job = slices.index, slices.span, slices.job
        if not job.mergeable:
            return index, span.numel, [slices.base] * len(variants), [False] * len(variants)
        outputs: list[torch.Tensor | np.ndarray | None] = [None] * len(variants)
        in_range = [False] * len(variants)  # the kernel checked the merged values as it wrote them
        counting = accumulator
        rest = list(range(len(variants)))
        if fused_at:
            done = _fused_merges(slices, [variants[k] for k in fused_at], accumulator)
            if done is not None:
                for k, (merged, checked) in zip(fused_at, done):
                    outputs[k], in_range[k] = merged, checked
                counting, rest = None, torch_at  # the probe's counts came with the first kernel
        if rest:
            theta = all(variants[k].method.streaming.theta for k in rest)
            seen = any(variants[k].observer is not None for k in rest)
            chunk = _widened_chunk(slices, counting) if bits_read and theta and not seen else None
            if chunk is None:
                chunk = slices.load(_workspace())
                if counting is not None:
                    counting.add(chunk)
            chunk.cancel = reporter.cancel
            for k in rest:
                variant = variants[k]
                merged = torch.empty(chunk.base.shape, dtype=job.out_dtype, device=chunk.base.device)
                if variant.method.streaming.theta:  # the method gives θ itself: rounded once to the output dtype
                    merged.copy_(variant.method.merge(chunk, variant.context).reshape(merged.shape))
                else:
                    torch.add(chunk.base, variant.method.merge(chunk, variant.context), out=merged)
                if variant.observer is not None:
                    variant.observer.observe(chunk, variant.context, merged)
                outputs[k] = merged
        return index, span.numel, [merged for merged in outputs if merged is not None], in_range  # every one was set

    writers = [BackgroundWriter(v.shards, plan, v.method.name) for v in variants]
    for writer in writers:
        writer.start()
    try:
        items = prefetch_chunks(
            plan,
            list(range(len(plan.jobs))),
            chunk_elements,
            transfer,
            depth=depth,
            bits=bits_read,
            files=files,
            aux=aux,
        )
        for index, numel, outputs, in_range in ordered_map(work, items, workers):
            for writer, merged, checked in zip(writers, outputs, in_range):
                writer.write(index, merged, checked)
            done += numel
            reporter.progress("merge", done, total, "elements")
    except BaseException:
        for writer in writers:
            writer.stop(error=True)
        raise
    for writer in writers:
        writer.stop()


def _widened_chunk(slices: StoredSlices, accumulator: ProbeAccumulator | None) -> Chunk | None:
    """The chunk of methods that read θ (``contracts.Streaming.theta``) from stored float bits, by the fused kernels:
    base and agents widened to float32 once into per-thread buffers (``thetas(float32)`` hands them out), every
    τ checked finite without being stored (the chunk's ``taus`` has no columns: θ methods read θ), the probe's
    counts (when asked) by ``kernels.count_patterns``; the same θ as ``slices.load`` without its copies. None where the kernels do not cover the slices or a τ is
    not finite (``slices.load`` then forms the chunk, or raises naming agent and tensor)."""
    job = slices.job
    if job.compute_name != "float32" or not _stored_agents(job) or slices.aux:
        return None
    operands = kernels.widenable_operands(slices.base, slices.agents)
    if operands is None:
        return None
    base_bits, agent_bits = operands
    n, count = slices.span.numel, len(agent_bits)
    if not kernels.finite_taus(base_bits, agent_bits):
        return None
    widened = _workspace().get("widened", (count + 1, n), torch.float32, torch.device("cpu")).numpy()
    for row, stored in zip(widened, (base_bits, *agent_bits)):
        kernels.widen_into(stored, 0, row)
    if accumulator is not None:
        counted = kernels.count_patterns(slices.base, slices.agents, slices.eps, job.compute_name)
        if counted is None or counted.hist is None or not counted.finite:
            return None
        accumulator.add_pattern_counts(slices.index, counted.hist)
    rows = [torch.from_numpy(row) for row in widened]
    return Chunk(
        slices.index,
        job.name,
        slices.span.offset,
        rows[0],
        torch.empty((count, 0)),  # τ is not formed: these methods never read it (``Chunk.n_agents`` still counts)
        slices.eps,
        workspace=_workspace(),
        raw=[as_tensor(slices.base), *(as_tensor(a) for a in slices.agents)],
        widened=rows,
    )


def _stored_agents(job: Any) -> bool:
    """The kernels form τ = agent − base from stored weights; a LoRA agent's slice is already its τ
    (``chunks.make_chunk``), so such jobs take the torch path."""
    return not any(lora.is_delta_file(a.file) for a in job.agents)


def _fusable(variant: PassOutput) -> bool:
    """The method has a fused kernel, and its observer (if any) takes what the kernel observes."""
    observer = variant.observer
    return variant.method.streaming.fused is not None and (observer is None or isinstance(observer, SliceObserver))


def _fused_merges(
    slices: StoredSlices, variants: list[PassOutput], accumulator: ProbeAccumulator | None
) -> list[tuple[torch.Tensor | np.ndarray, bool]] | None:
    """Every variant of one chunk through its method's fused kernel, the variants whose methods share a
    ``fused_group`` through it together (one pass over memory each kernel call): the merged slice and whether the
    kernel found every merged value within the output dtype (``KernelResult.in_range``); the probe's counts on
    the way when no probe ran first (from the first variant's kernel where it counts them, else
    ``kernels.count_patterns``); None when the kernels do not cover this chunk (the torch path then runs it)."""
    job = slices.job
    if not _stored_agents(job):
        return None
    results: dict[int, kernels.KernelResult] = {}
    for members in _kernel_groups(variants):
        counting = accumulator is not None and members[0] == 0
        group = [variants[k] for k in members]
        fused = [f for v in group if (f := v.method.streaming.fused) is not None]
        assert len(fused) == len(group)  # _fusable
        observe = [v.observer is not None for v in group]
        if len(group) > 1:
            group_kernel = group[0].method.streaming.fused_group
            assert group_kernel is not None
            done = group_kernel(slices, [(f, v.context) for f, v in zip(fused, group)], counting, observe)
        else:
            one = fused[0](slices, group[0].context, counting, observe[0])
            done = None if one is None else [one]
        if done is None:
            return None
        results.update(zip(members, done))
    outputs: list[tuple[torch.Tensor | np.ndarray, bool]] = []
    for k, variant in enumerate(variants):
        result = results[k]
        hist = result.hist
        counting = accumulator is not None and k == 0
        if counting and hist is None:
            counted = kernels.count_patterns(slices.base, slices.agents, slices.eps, job.compute_name)
            if counted is None:
                return None
            hist = counted.hist
        if not result.finite:
            slices.load()  # raises the error naming agent and tensor
        if counting:
            assert accumulator is not None and hist is not None  # counting: asked of the kernel, or counted above
            accumulator.add_pattern_counts(slices.index, hist)
        if variant.observer is not None:
            assert isinstance(variant.observer, SliceObserver)  # _fusable
            variant.observer.observe_slices(slices, result.observed)
        assert result.merged is not None  # a merge kernel gives the merged slice
        outputs.append((result.merged, result.in_range))
    return outputs


def _kernel_groups(variants: list[PassOutput]) -> list[list[int]]:
    """The variants' indices by kernel call, in order of first appearance: those whose methods share a
    ``fused_group`` together, every other variant alone."""
    groups: dict[object, list[int]] = {}
    for k, variant in enumerate(variants):
        shared = variant.method.streaming.fused_group
        groups.setdefault(k if shared is None else shared, []).append(k)
    return list(groups.values())


_EXPONENT_BITS: dict[str, tuple[type, int]] = {
    "float16": (np.uint16, 0x7C00),
    "bfloat16": (np.uint16, 0x7F80),
    "float32": (np.uint32, 0x7F800000),
    "float64": (np.uint64, 0x7FF0000000000000),
}


def out_of_range(data: torch.Tensor | np.ndarray, out_name: str) -> bool:
    """True when a slice of ``out_name`` values (a tensor, or the kernels' stored bits) holds ±Inf or NaN:
    an exponent with all bits set. One pass over the stored bits, a fraction of a merge's cost."""
    if isinstance(data, np.ndarray):  # the fused kernels' output: numba is loaded, so check with its loop
        assert data.dtype == FLOAT_BITS[out_name], (data.dtype, out_name)  # the kernels' encoding of out_name
        return kernels.output_beyond_range(data)
    bits_type, mask = _EXPONENT_BITS[out_name]
    same_size_int = {2: torch.int16, 4: torch.int32, 8: torch.int64}[data.element_size()]
    bits: np.ndarray = data.contiguous().view(same_size_int).numpy().view(bits_type)
    exponent = bits_type(mask)
    return bool(((bits & exponent) == exponent).any())


class BackgroundWriter:
    """Hands merged slices to ``shards`` from a writer thread, in order, a few chunks behind.

    Device tensors are copied to the host in that thread; the fused kernels' output slices go back to
    their pool once written (``kernels.release_output``). An error in the writer is raised in the
    caller at its next ``write`` or at ``stop``; on an error stop the queue is abandoned.
    """

    DEPTH = 4

    def __init__(self, shards: ShardSet | MemoryShards, plan: MergePlan | None = None, method: str = "") -> None:
        self._shards = shards
        self._plan, self._method = plan, method
        self._queue: queue.Queue = queue.Queue(maxsize=self.DEPTH)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="ram-desktop-writer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if self._error is not None:
                continue  # keep draining so the producer never blocks
            try:
                index, data, in_range = item
                on_device = not isinstance(data, np.ndarray) and data.device.type != "cpu"
                data_host = data.cpu() if on_device else data
                if self._plan is not None and not in_range:
                    self._check_range(index, data_host)
                self._shards.write(index, data_host)
                kernels.release_output(data)
            except BaseException as e:  # noqa: BLE001  kept and raised in the merging thread (close / next write)
                self._error = e

    def _check_range(self, index: int, data: torch.Tensor | np.ndarray) -> None:
        """Base and task vectors are finite (``load_chunk``), so ±Inf or NaN in a merged slice means the
        merged value left the output dtype's range (a large scale, or a narrower ``--out-dtype``)."""
        job = self._plan.jobs[index] if self._plan is not None else None
        if job is None or not job.mergeable or not out_of_range(data, job.out_name):
            return
        raise InputError(
            f"tensor {job.name!r}: the {self._method} merge gives values beyond the range of "
            f"{job.out_name} (±Inf); lower the method's scale or choose a wider --out-dtype"
        )

    def write(self, index: int, data: torch.Tensor | np.ndarray, in_range: bool = False) -> None:
        """Queue a merged slice; ``in_range``: its values were already checked within the output dtype (by the
        kernel that wrote them), so the writer does not read it again to check."""
        if self._error is not None:
            raise self._error
        self._queue.put((index, data, in_range))

    def stop(self, error: bool = False) -> None:
        """Drain and join; raises the writer's own error unless stopping because of another one."""
        self._queue.put(None)
        self._thread.join()
        if not error and self._error is not None:
            raise self._error
