"""Streaming passes: a reader (``chunks.prefetch_chunks`` through a ``Transfer``), per-chunk work on
compute threads, and sinks (the probe accumulator, a method's collector or observer, shard writers).

``probe_pass`` feeds every chunk to statistics sinks; ``merge_pass`` merges every chunk with each
``Variant`` (one or several methods and parameter sets, from one read of the inputs) and hands each
result to that variant's own writer. The engine composes these; it threads no flags through them.
"""

from __future__ import annotations

import os
import queue
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from .lazy import torch
from . import kernels
from .errors import InputError
from .chunks import DEFAULT_CHUNK_ELEMENTS, Chunk, OpenFiles, Workspace, load_chunk, prefetch_chunks
from .events import Reporter
from .formats import lora
from .methods import Collector, MergeMethod, Observer, SliceCollector
from .output import ShardSet
from .plan import MergePlan
from .inspection import ULP_BINS
from .probe import SURVIVAL_BINS, SURVIVAL_STEP, ProbeAccumulator
from .transfer import Transfer

_local = threading.local()


def _workspace() -> Workspace:
    """This thread's scratch buffers (each compute thread reuses its own from chunk to chunk), for a chunk
    on the torch path; a compute thread's torch runs single-threaded from its first such chunk on."""
    ws = getattr(_local, "workspace", None)
    if ws is None:
        if getattr(_local, "compute_thread", False):
            torch.set_num_threads(1)
        ws = _local.workspace = Workspace()
    return ws


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


def probe_pass(plan: MergePlan, eps: float, transfer: Transfer, reporter: Reporter,
               sinks: list[ProbeAccumulator | Collector], chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
               stage: str = "probe", ordered: bool = False, files: OpenFiles | None = None) -> None:
    """Stream every mergeable tensor once and ``add`` each chunk to every sink. ``ordered``: a sink needs
    the chunks in plan order (a collector whose ``needs_order`` is True), so the pass computes on one
    thread; otherwise sinks are fed from every compute thread, chunks in any order. ``files``: the run's
    open inputs, shared by its passes (``chunks.OpenFiles``)."""
    jobs = [i for i, j in enumerate(plan.jobs) if j.mergeable]
    total = sum(plan.jobs[i].numel for i in jobs)
    done = 0
    reporter.progress(stage, 0, total, "elements")
    workers = 1 if ordered else compute_workers(transfer.device_type)
    fused = use_kernels(transfer.device_type, total)

    def work(item: tuple) -> int:
        index, span, base, agents = item
        pending = sinks
        if fused and _stored_agents(plan.jobs[index]):  # sinks that take the stored slices: one fused pass each
            pending = [sink for sink in sinks if not _add_fused(sink, plan, index, span, base, agents, eps)]
        if pending:
            chunk = load_chunk(plan, index, span, base, agents, eps, _workspace())
            for sink in pending:
                sink.add(chunk)
        return span.numel

    items = prefetch_chunks(plan, jobs, chunk_elements, transfer, bits=fused, files=files)
    for numel in ordered_map(work, items, workers):
        done += numel
        reporter.progress(stage, done, total, "elements")


def _add_fused(sink: ProbeAccumulator | Collector, plan: MergePlan, index: int, span: Any, base: torch.Tensor,
               agents: list[torch.Tensor], eps: float) -> bool:
    """Add one chunk to ``sink`` from its stored slices through a fused kernel: the probe's counts, the
    complete (Analyze) probe, or a ``SliceCollector``'s statistic. False when the kernels do not
    cover the slices or a τ is not finite (the caller then forms the chunk, whose checks raise the error
    naming agent and tensor)."""
    job = plan.jobs[index]
    if isinstance(sink, ProbeAccumulator) and sink.with_survival:
        if not sink.fusable:
            return False
        # the complete (Analyze) probe: counts, signs, λ* histograms and the ulp sample in one fused pass
        sample = sink.inspect.ulp_sample(index, span.offset, span.numel, job.compute_dtype)
        analysis = kernels.analyze(base, agents, eps, job.compute_name, SURVIVAL_STEP, SURVIVAL_BINS, ULP_BINS, sample)
        if analysis is None or not analysis.finite:
            return False
        sink.add_analysis(index, analysis)
        return True
    if isinstance(sink, ProbeAccumulator):
        counted = kernels.count_patterns(base, agents, eps, job.compute_name)
        if counted is None or not counted[1]:
            return False
        sink.add_pattern_counts(index, counted[0])
        return True
    return isinstance(sink, SliceCollector) and sink.add_slices(index, span.offset, base, agents, job.compute_name)


@dataclass
class Variant:
    """One output of a merge pass: a method with resolved parameters and its prepared context, the
    shards it writes to, and its observer (if the method has one)."""

    method: MergeMethod
    params: dict
    context: Any
    shards: ShardSet
    observer: Observer | None = None


def merge_pass(plan: MergePlan, variants: list[Variant], eps: float, transfer: Transfer, reporter: Reporter,
               chunk_elements: int = DEFAULT_CHUNK_ELEMENTS, accumulator: ProbeAccumulator | None = None,
               files: OpenFiles | None = None) -> None:
    """Read every tensor once; merge each chunk with every variant (θ = base + τ_merged, rounded once
    to the output dtype) and write it to that variant's shards, in order, from a writer thread.
    Tensors that are not merged are copied from the base. ``accumulator`` (when no probe ran first)
    collects the probe's counts on the way. ``files``: the run's open inputs (``chunks.OpenFiles``)."""
    total = sum(j.numel for j in plan.jobs)
    done = 0
    reporter.progress("merge", 0, total, "elements")
    parallel = all(v.method.thread_safe for v in variants)
    workers = compute_workers(transfer.device_type) if parallel else 1
    fused = use_kernels(transfer.device_type, total) and all(_fusable(v) for v in variants)

    def work(item: tuple) -> tuple[int, int, list[torch.Tensor]]:
        index, span, base, agents = item
        job = plan.jobs[index]
        if not job.mergeable:
            return index, span.numel, [base] * len(variants)
        if fused:
            outputs = _fused_merges(plan, index, span, base, agents, eps, variants, accumulator)
            if outputs is not None:
                return index, span.numel, outputs
        chunk: Chunk = load_chunk(plan, index, span, base, agents, eps, _workspace())
        if accumulator is not None:
            accumulator.add(chunk)
        outputs = []
        for variant in variants:
            merged = torch.empty(chunk.base.shape, dtype=job.out_dtype, device=chunk.base.device)
            torch.add(chunk.base, variant.method.merge(chunk, variant.context), out=merged)
            if variant.observer is not None:
                variant.observer.observe(chunk, variant.context, merged)
            outputs.append(merged)
        return index, span.numel, outputs

    writers = [BackgroundWriter(v.shards, plan, v.method.name) for v in variants]
    for writer in writers:
        writer.start()
    try:
        items = prefetch_chunks(plan, list(range(len(plan.jobs))), chunk_elements, transfer, bits=fused, files=files)
        for index, numel, outputs in ordered_map(work, items, workers):
            for writer, merged in zip(writers, outputs):
                writer.write(index, merged)
            done += numel
            reporter.progress("merge", done, total, "elements")
    except BaseException:
        for writer in writers:
            writer.stop(error=True)
        raise
    for writer in writers:
        writer.stop()


def _stored_agents(job: Any) -> bool:
    """The kernels form τ = agent − base from stored weights; a LoRA agent's slice is already its τ
    (``chunks.make_chunk``), so such jobs take the torch path."""
    return not any(lora.is_delta_file(a.file) for a in job.agents)


def _fusable(variant: Variant) -> bool:
    observer = variant.observer
    if variant.method.fused in ("dare-ta", "dare-ties", "ties"):
        return observer is None
    return variant.method.fused in ("ram", "ram-plus") and (observer is None or hasattr(observer, "add_counts"))


def _fused_merges(plan: MergePlan, index: int, span: Any, base: torch.Tensor, agents: list[torch.Tensor], eps: float,
                  variants: list[Variant], accumulator: ProbeAccumulator | None) -> list[torch.Tensor] | None:
    """Every variant of one chunk through ``kernels.selective_merge_into`` (one pass over memory each);
    None when the kernels do not cover this chunk (the torch path then runs it)."""
    job = plan.jobs[index]
    if not _stored_agents(job):
        return None
    outputs = []
    for k, variant in enumerate(variants):
        if variant.method.fused in ("dare-ta", "dare-ties", "ties"):
            fuse = _fused_ties if variant.method.fused == "ties" else _fused_dare
            merged = fuse(plan, index, span, base, agents, eps, variant, accumulator if k == 0 else None)
            if merged is None:
                return None
            outputs.append(merged)
            continue
        lambdas = [float(x) for x in variant.context] if variant.method.fused == "ram-plus" else None
        counting = accumulator is not None and k == 0
        done = kernels.selective_merge_into(base, agents, eps, job.compute_name, job.out_name, lambdas,
                                            counting, variant.observer is not None)
        if done is None:
            return None
        merged, hist, finite, changed = done
        if not finite:
            load_chunk(plan, index, span, base, agents, eps)  # raises the error naming agent and tensor
        if counting:
            accumulator.add_pattern_counts(index, hist)
        if variant.observer is not None:
            variant.observer.add_counts(job.out_name, changed)
        outputs.append(merged)
    return outputs


def _fused_dare(plan: MergePlan, index: int, span: Any, base: torch.Tensor, agents: list[torch.Tensor], eps: float,
                variant: Variant, accumulator: ProbeAccumulator | None) -> torch.Tensor | None:
    """DARE-TA / DARE-TIES of one chunk through ``kernels.dare_merge_into`` (and the probe's counts
    through ``kernels.count_patterns`` when no probe ran first)."""
    from .methods.baselines import dare_keys, drop_threshold

    job, ctx = plan.jobs[index], variant.context
    keys = [dare_keys(ctx.seed, t, job.name) for t in range(len(agents))]
    done = kernels.dare_merge_into(base, agents, span.offset, keys, drop_threshold(ctx.drop), ctx.drop, ctx.scale,
                                   variant.method.fused == "dare-ties", job.compute_name, job.out_name)
    return _checked_and_counted(plan, index, span, base, agents, eps, done, accumulator)


def _fused_ties(plan: MergePlan, index: int, span: Any, base: torch.Tensor, agents: list[torch.Tensor], eps: float,
                variant: Variant, accumulator: ProbeAccumulator | None) -> torch.Tensor | None:
    """TIES of one chunk through ``kernels.ties_merge_into``: the cut and this chunk's share of the ties
    at the cut come from the context (``TiesContext.chunk_trim``), so chunks merge in any order."""
    job, ctx = plan.jobs[index], variant.context
    trim = ctx.chunk_trim(index, span.offset, span.numel)
    if trim is None:
        return None
    key_dtype, cuts, left = trim
    done = kernels.ties_merge_into(base, agents, job.compute_name, job.out_name, key_dtype == "float64", cuts,
                                   left, ctx.scale)
    return _checked_and_counted(plan, index, span, base, agents, eps, done, accumulator)


def _checked_and_counted(plan: MergePlan, index: int, span: Any, base: torch.Tensor, agents: list[torch.Tensor],
                         eps: float, done: tuple[torch.Tensor, bool] | None,
                         accumulator: ProbeAccumulator | None) -> torch.Tensor | None:
    """The merged slice of a DARE / TIES kernel (``done``: merged, all finite) after its non-finite check,
    with the probe's counts added through ``kernels.count_patterns`` when no probe ran first; None when
    the kernels do not cover the chunk."""
    if done is None:
        return None
    job = plan.jobs[index]
    counted = kernels.count_patterns(base, agents, eps, job.compute_name) if accumulator is not None else None
    if accumulator is not None and counted is None:
        return None
    merged, finite = done
    if not finite:
        load_chunk(plan, index, span, base, agents, eps)  # raises the error naming agent and tensor
    if accumulator is not None:
        accumulator.add_pattern_counts(index, counted[0])
    return merged


_EXPONENT_BITS: dict[str, tuple[type, int]] = {
    "float16": (np.uint16, 0x7C00), "bfloat16": (np.uint16, 0x7F80),
    "float32": (np.uint32, 0x7F800000), "float64": (np.uint64, 0x7FF0000000000000),
}


def out_of_range(data: torch.Tensor | np.ndarray, out_name: str) -> bool:
    """True when a slice of ``out_name`` values (a tensor, or the kernels' stored bits) holds ±Inf or NaN:
    an exponent with all bits set. One pass over the stored bits, a fraction of a merge's cost."""
    bits_type, mask = _EXPONENT_BITS[out_name]
    if isinstance(data, np.ndarray):  # the fused kernels' output: numba is loaded, so check with its loop
        return kernels.exponent_all_ones(data.view(bits_type), mask)
    same_size_int = {2: torch.int16, 4: torch.int32, 8: torch.int64}[data.element_size()]
    bits = data.contiguous().view(same_size_int).numpy().view(bits_type)
    exponent = bits_type(mask)
    return bool(((bits & exponent) == exponent).any())


class BackgroundWriter:
    """Hands merged slices to ``shards`` from a writer thread, in order, a few chunks behind.

    Device tensors are copied to the host in that thread; the fused kernels' output slices go back to
    their pool once written (``kernels.release_output``). An error in the writer is raised in the
    caller at its next ``write`` or at ``stop``; on an error stop the queue is abandoned.
    """

    DEPTH = 4

    def __init__(self, shards: ShardSet, plan: MergePlan | None = None, method: str = "") -> None:
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
                index, data = item
                on_device = not isinstance(data, np.ndarray) and data.device.type != "cpu"
                data_host = data.cpu() if on_device else data
                if self._plan is not None:
                    self._check_range(index, data_host)
                self._shards.write(index, data_host)
                kernels.release_output(data)
            except BaseException as e:
                self._error = e

    def _check_range(self, index: int, data: torch.Tensor | np.ndarray) -> None:
        """Base and task vectors are finite (``load_chunk``), so ±Inf or NaN in a merged slice means the
        merged value left the output dtype's range (a large scale, or a narrower ``--out-dtype``)."""
        job = self._plan.jobs[index] if self._plan is not None else None
        if job is None or not job.mergeable or not out_of_range(data, job.out_name):
            return
        raise InputError(f"tensor {job.name!r}: the {self._method} merge gives values beyond the range of "
                         f"{job.out_name} (±Inf); lower the method's scale or choose a wider --out-dtype")

    def write(self, index: int, data: torch.Tensor | np.ndarray) -> None:
        if self._error is not None:
            raise self._error
        self._queue.put((index, data))

    def stop(self, error: bool = False) -> None:
        """Drain and join; raises the writer's own error unless stopping because of another one."""
        self._queue.put(None)
        self._thread.join()
        if not error and self._error is not None:
            raise self._error
