"""The executor: open sources, plan, probe (pass 1), merge (pass 2, or one fused pass), write.

It owns reading, device transfer, progress and cancellation; methods only compute on chunks.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import torch

from .. import __version__
from .card import model_card
from .chunks import DEFAULT_CHUNK_ELEMENTS, Chunk, Workspace, make_chunk, prefetch_chunks
from .errors import InputError
from .events import Reporter
from .methods import Collector, MergeMethod, get_method
from .output import ShardSet, check_output, copy_tokenizer_files, staging_folder, write_config
from .plan import MergePlan, make_plan
from .probe import ProbeAccumulator, ProbeReport, load_cached, rescale_changes, save_cached
from .recipe import Recipe, parse_size
from .sources import Checkpoint, open_checkpoint

log = logging.getLogger("ram_desktop")


def resolve_device(spec: str = "auto") -> torch.device:
    """'auto' picks CUDA when present, else the CPU; 'cuda' / 'cuda:N' must exist."""
    spec = (spec or "auto").strip().lower()
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(spec)
    except RuntimeError:
        raise InputError(f"unknown device {spec!r}; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError(f"device {spec} requested but no CUDA GPU is available; use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise InputError(f"device {spec} does not exist; {torch.cuda.device_count()} CUDA device(s) found")
    elif device.type != "cpu":
        raise InputError(f"unsupported device {spec!r}; use auto, cpu, cuda or cuda:N")
    return device


def list_devices() -> list[tuple[str, str]]:
    """Devices a merge can run on, as ``(spec, label)``: each CUDA GPU by name and memory, then the CPU.

    ``spec`` is what ``resolve_device`` and ``MergeRequest.device`` accept.
    """
    devices: list[tuple[str, str]] = []
    try:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # a broken driver must not stop the application from listing the CPU
        count = 0
    for index in range(count):
        try:
            props = torch.cuda.get_device_properties(index)
            label = f"cuda:{index} — {props.name} ({props.total_memory / 2**30:.0f} GiB)"
        except Exception:
            label = f"cuda:{index}"
        devices.append((f"cuda:{index}", label))
    devices.append(("cpu", f"CPU ({os.cpu_count() or 1} cores)"))
    return devices


def open_sources(base: str, agents: list[str], reporter: Reporter,
                 token: str | None = None) -> tuple[Checkpoint, list[Checkpoint]]:
    """Resolve every source (headers only; Hub sources are downloaded to the cache first)."""
    base_ckpt = open_checkpoint(base, reporter, token)
    return base_ckpt, [open_checkpoint(a, reporter, token) for a in agents]


def _check_finite(chunk: Chunk, plan: MergePlan) -> None:
    if chunk.all_finite():
        return
    for t in range(chunk.n_agents):
        if not bool(torch.isfinite(chunk.taus[t]).all()):
            raise InputError(f"tensor {chunk.name!r} of agent {plan.names[t]!r} ({plan.agents[t].display}) "
                             "has NaN or Inf in its task vector; the checkpoint is broken — re-export it")


def probe_pass(plan: MergePlan, eps: float, device: torch.device, reporter: Reporter,
               chunk_elements: int = DEFAULT_CHUNK_ELEMENTS, collector: Collector | None = None,
               accumulate: bool = True, stage: str = "probe", survival: bool = True) -> ProbeReport | None:
    """Pass 1: stream every mergeable tensor and accumulate the whole-model statistics
    (and a method's collector). With ``accumulate=False`` only the collector runs; with
    ``survival=False`` only the counts (no λ* histograms); progress events carry ``stage``."""
    acc = ProbeAccumulator(plan, eps, survival) if accumulate else None
    jobs = [i for i, j in enumerate(plan.jobs) if j.mergeable]
    total = sum(plan.jobs[i].numel for i in jobs)
    done = 0
    reporter.progress(stage, 0, total, "elements")
    workers = compute_workers(device) if collector is None else 1  # a collector sees chunks in order

    def work(item: tuple) -> int:
        index, span, base, agents = item
        chunk = make_chunk(index, plan.jobs[index], span, base, agents, eps, _workspace())
        _check_finite(chunk, plan)
        if acc is not None:
            acc.add(chunk)
        if collector is not None:
            collector.add(chunk)
        return span.numel

    for numel in ordered_map(work, prefetch_chunks(plan, jobs, chunk_elements, device), workers):
        done += numel
        reporter.progress(stage, done, total, "elements")
    return acc.report() if acc is not None else None


def probe(base: str, agents: list[str], names: list[str] | None = None, eps: float = 1e-5,
          device: str = "auto", reporter: Reporter | None = None, use_cache: bool = True,
          chunk_elements: int = DEFAULT_CHUNK_ELEMENTS, token: str | None = None,
          vocab: str = "exact") -> ProbeReport:
    """Probe task-vector density and overlap (SPEC.md section 1, step 1); cached by inputs and ε.
    ``token`` is for Hub sources (None: HF_TOKEN or the stored login) and is never written anywhere."""
    reporter = reporter or Reporter()
    eps = _check_eps(eps)
    base_ckpt, agent_ckpts = open_sources(base, agents, reporter, token)
    plan = make_plan(base_ckpt, agent_ckpts, names, vocab=vocab)
    return _probe_plan(plan, eps, resolve_device(device), reporter, use_cache, chunk_elements)


def _probe_plan(plan: MergePlan, eps: float, device: torch.device, reporter: Reporter, use_cache: bool,
                chunk_elements: int, collector: Collector | None = None, survival: bool = True) -> ProbeReport:
    """The probe from the cache when possible; a collector still gets its own pass over the data.

    ``survival=False`` (the merge's pass 1): the λ* histograms are not needed, any cached probe will
    do and a fresh one is computed without them; otherwise (Analyze) a cached probe without them or
    without the inspection statistics (an older cache) is computed again, completely."""
    cached = load_cached(plan.fingerprint(), eps) if use_cache else None
    if cached is not None and len(cached.agents) == plan.n_agents and (cached.complete or not survival):
        log.info("reusing the cached probe of these inputs (ε = %g)", eps)
        if collector is not None:
            probe_pass(plan, eps, device, reporter, chunk_elements, collector, accumulate=False)
        return cached.renamed(plan.names, [a.display for a in plan.agents])
    start = time.perf_counter()
    report = probe_pass(plan, eps, device, reporter, chunk_elements, collector, survival=survival)
    assert report is not None
    log.info("probe: %d elements in %d tensors, %.2f s", report.params, report.tensors, time.perf_counter() - start)
    save_cached(report)
    return report


def _check_eps(eps: float) -> float:
    eps = float(eps)
    if not (eps >= 0.0 and eps < float("inf")):
        raise InputError(f"--eps must be a non-negative number, got {eps}")
    return eps


@dataclass
class MergeRequest:
    """Everything a merge needs; the CLI, the GUI and recipes all build one of these."""

    base: str
    agents: list[str]
    out: Path
    method: str = "ram-plus"
    params: dict[str, Any] = field(default_factory=dict)
    names: list[str] | None = None
    eps: float = 1e-5
    device: str = "auto"
    out_dtype: str = "base"
    shard_size: str = "5GB"
    overwrite: bool = False
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS
    use_cache: bool = True
    vocab: str = "exact"  # "common": merge the vocabulary rows base and agents share (plan.make_plan)
    # Hub token for this run only (None: HF_TOKEN or the stored login). Never written to a recipe, report,
    # card or log, and kept out of repr().
    token: str | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_recipe(cls, recipe: Recipe, out: Path | None = None, **overrides: Any) -> "MergeRequest":
        target = out or (Path(recipe.out) if recipe.out else None)
        if target is None:
            raise InputError("the recipe names no output folder; pass --out DIR")
        overrides.setdefault("vocab", recipe.vocab)
        return cls(recipe.base, recipe.agents, Path(target), recipe.method, dict(recipe.params), recipe.names,
                   recipe.eps, recipe.device, recipe.out_dtype, recipe.shard_size, **overrides)


@dataclass
class MergeResult:
    out: Path
    report: dict
    probe: ProbeReport
    lambdas: list[float]
    seconds: float
    bytes_written: int
    warnings: list[str]


def merge(request: MergeRequest, reporter: Reporter | None = None) -> MergeResult:
    """Merge base and agents into ``request.out``; nothing is written unless the whole merge succeeds."""
    reporter = reporter or Reporter()
    start = time.perf_counter()
    method = get_method(request.method)
    params = method.resolve(request.params)
    eps = _check_eps(request.eps)
    shard_bytes = parse_size(request.shard_size)
    device = resolve_device(request.device)
    base, agents = open_sources(request.base, request.agents, reporter, request.token)
    plan = make_plan(base, agents, request.names, request.out_dtype, request.vocab)
    out = check_output(Path(request.out), [base, *agents], request.overwrite, plan.out_bytes)

    probe_report = None
    timings: dict[str, float] = {}
    collector = method.collector(params, plan) if method.collector else None
    if method.needs_probe(params) or collector is not None:
        t0 = time.perf_counter()
        # the merge needs only the counts; the rounding survival is counted exactly in pass 2
        probe_report = _probe_plan(plan, eps, device, reporter, request.use_cache, request.chunk_elements, collector,
                                   survival=False)
        passes = 1
        while collector is not None and getattr(collector, "next_pass", None) is not None and collector.next_pass():
            passes += 1  # the collector needs another look at the data (TIES refines its exact cut)
            probe_pass(plan, eps, device, reporter, request.chunk_elements, collector, accumulate=False,
                       stage=f"refine {passes}")
        timings["probe_s"] = time.perf_counter() - t0
    context = method.prepare(params, probe_report, collector.finish() if collector else None)

    t0 = time.perf_counter()
    with staging_folder(out) as tmp:
        shards = ShardSet(tmp, plan, shard_bytes)
        try:
            fused, survival = _merge_pass(plan, method, context, eps, device, shards, reporter,
                                          request.chunk_elements, accumulate=probe_report is None,
                                          count_survival=method.lambdas is not None)
        except BaseException:
            shards.abort()
            raise
        shards.close()
        probe_report = probe_report or fused
        timings["merge_s"] = time.perf_counter() - t0
        if fused is not None:
            save_cached(fused)
        lambdas = method.lambdas(params, probe_report) if method.lambdas else [1.0] * plan.n_agents
        timings["total_s"] = time.perf_counter() - start
        report = merge_report(plan, request, params, probe_report, lambdas, device, timings, shards.files,
                              shards.bytes_written, survival)
        _write_extras(tmp, plan, request, params, probe_report, lambdas, report)
    seconds = time.perf_counter() - start
    log.info("merged %d agents with %s into %s in %.2f s", plan.n_agents, method.name, out, seconds)
    return MergeResult(out, report, probe_report, lambdas, seconds, shards.bytes_written, probe_report.warnings)


_local = threading.local()


def _workspace() -> Workspace:
    """This thread's scratch buffers (each compute thread reuses its own from chunk to chunk)."""
    ws = getattr(_local, "workspace", None)
    if ws is None:
        ws = _local.workspace = Workspace()
    return ws


def compute_workers(device: torch.device) -> int:
    """Compute threads for a CPU pass: one per available core (``RAM_DESKTOP_THREADS`` overrides),
    each running torch single-threaded on whole chunks. Chunk-level threads need no barrier per
    operation, so they keep working when other programs load the machine. GPU passes use one."""
    if device.type != "cpu":
        return 1
    env = os.environ.get("RAM_DESKTOP_THREADS")
    if env and env.isdigit() and int(env) > 0:
        return int(env)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def _single_threaded() -> None:
    torch.set_num_threads(1)


def ordered_map(fn: Callable[[Any], Any], items: Iterable[Any], workers: int) -> Iterator[Any]:
    """``map(fn, items)`` computed by ``workers`` threads, results in input order, at most
    ``workers + 1`` items in flight. With one worker it runs inline (torch keeps its own threads)."""
    if workers <= 1:
        for item in items:
            yield fn(item)
        return
    with ThreadPoolExecutor(workers, thread_name_prefix="ram-desktop-compute", initializer=_single_threaded) as pool:
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


def _merge_pass(plan: MergePlan, method: MergeMethod, context: Any, eps: float, device: torch.device,
                shards: ShardSet, reporter: Reporter, chunk_elements: int, accumulate: bool,
                count_survival: bool = False) -> tuple[ProbeReport | None, dict[str, list[float | None]]]:
    """Pass 2 (or the only pass, accumulating the probe's counts on the way when no probe was needed first).

    Reading runs ahead in a background thread and writing behind in another, so the compute
    thread only computes; θ = base + τ_merged is rounded once, straight into the output dtype.
    With ``count_survival`` (RAM+, RAM+s) it also counts, per output dtype and agent, the unique
    elements whose written value differs from the unscaled RAM value: the exact rounding survival
    of this merge's λ, returned as shares (None for an agent without unique elements).
    """
    from .output import DTYPE_NAMES

    acc = ProbeAccumulator(plan, eps, survival=False) if accumulate else None
    changes: dict[torch.dtype, torch.Tensor] = {}
    total = sum(j.numel for j in plan.jobs)
    done = 0
    reporter.progress("merge", 0, total, "elements")
    workers = compute_workers(device) if method.extra.get("thread_safe") else 1

    def work(item: tuple) -> tuple[int, int, torch.Tensor, torch.Tensor | None]:
        index, span, base, agents = item
        job = plan.jobs[index]
        if not job.mergeable:
            return index, span.numel, base, None
        chunk = make_chunk(index, job, span, base, agents, eps, _workspace())
        if acc is not None:
            _check_finite(chunk, plan)
            acc.add(chunk)
        merged = torch.empty(chunk.base.shape, dtype=job.out_dtype, device=chunk.base.device)
        torch.add(chunk.base, method.merge(chunk, context), out=merged)  # θ = base + τ_merged, rounded once
        return index, span.numel, merged, rescale_changes(chunk, merged) if count_survival else None

    with BackgroundWriter(shards) as writer:
        items = prefetch_chunks(plan, list(range(len(plan.jobs))), chunk_elements, device)
        for index, numel, merged, changed in ordered_map(work, items, workers):
            writer.write(index, merged)
            if changed is not None:
                dtype = plan.jobs[index].out_dtype
                changes[dtype] = changes[dtype] + changed if dtype in changes else changed
            done += numel
            reporter.progress("merge", done, total, "elements")
    survival = {DTYPE_NAMES.get(d, str(d)): [c / u if u else None for c, u in zip(*counts.tolist())]
                for d, counts in changes.items()}
    return (acc.report() if acc is not None else None), survival


class BackgroundWriter:
    """Hands merged slices to ``shards`` from a writer thread, in order, a few chunks behind.

    Device tensors are copied to the host in that thread. An error in the writer is raised in the
    caller at its next ``write`` or on exit; on exit the queue is drained (or abandoned on error).
    """

    DEPTH = 4

    def __init__(self, shards: ShardSet) -> None:
        import queue
        import threading

        self._shards = shards
        self._queue: queue.Queue = queue.Queue(maxsize=self.DEPTH)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="ram-desktop-writer", daemon=True)

    def __enter__(self) -> "BackgroundWriter":
        self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if self._error is not None:
                continue  # keep draining so the producer never blocks
            try:
                index, data = item
                self._shards.write(index, data.cpu() if data.device.type != "cpu" else data)
            except BaseException as e:
                self._error = e

    def write(self, index: int, data: torch.Tensor) -> None:
        if self._error is not None:
            raise self._error
        self._queue.put((index, data))

    def __exit__(self, exc_type, exc, tb) -> None:
        self._queue.put(None)
        self._thread.join()
        if exc_type is None and self._error is not None:
            raise self._error


def merge_report(plan: MergePlan, request: MergeRequest, params: dict, probe_report: ProbeReport,
                 lambdas: list[float], device: torch.device, timings: dict[str, float], files: list[str],
                 bytes_written: int, survival: dict[str, list[float | None]] | None = None) -> dict:
    """The probe report plus what the merge did (SPEC.md section 2)."""
    import huggingface_hub
    import safetensors

    report = probe_report.to_json()
    out_names = {j.out_dtype for j in plan.mergeable_jobs}
    from .output import DTYPE_NAMES

    if not survival:  # not counted in the merge pass: read off the λ* histograms when the probe has them
        survival = {}
        for name in {DTYPE_NAMES.get(d) for d in out_names} & set(probe_report.survival):
            survival[name] = [probe_report.survival_share(t, name, lam) for t, lam in enumerate(lambdas)]
    report.update({
        "method": request.method,
        "method_params": params,
        "lambda": lambdas,
        "out_dtype": request.out_dtype,
        "vocab": request.vocab,
        "device": str(device),
        "sources": {"base": plan.base.display, "agents": [a.display for a in plan.agents]},
        "rescale_survival_share": survival,
        "output": {"files": files, "bytes": bytes_written},
        "timings": {k: round(v, 4) for k, v in timings.items()},
        "versions": {"ram_desktop": __version__, "torch": torch.__version__, "safetensors": safetensors.__version__,
                     "huggingface_hub": huggingface_hub.__version__, "python": platform.python_version()},
    })
    return report


def _write_extras(folder: Path, plan: MergePlan, request: MergeRequest, params: dict, probe_report: ProbeReport,
                  lambdas: list[float], report: dict) -> None:
    write_config(plan.base, folder, plan)
    copy_tokenizer_files(plan.base, folder)
    model_card(plan, request.method, params, lambdas, probe_report, request.out_dtype).save(folder / "README.md")
    recipe = Recipe(
        base=_pinned(plan.base), agents=[_pinned(a) for a in plan.agents], method=request.method, params=params,
        names=plan.names, eps=request.eps, out_dtype=request.out_dtype, shard_size=str(request.shard_size),
        device=request.device, out=str(Path(request.out).expanduser().resolve()), vocab=request.vocab,
    )
    recipe.save(folder / "ram-recipe.yaml")
    (folder / "merge-report.json").write_text(json.dumps(report, indent=1) + "\n")


def _pinned(ckpt: Checkpoint) -> str:
    """The source as a recipe names it: a Hub id pinned to its commit, or the absolute local path."""
    if ckpt.repo_id:
        return f"{ckpt.repo_id}@{ckpt.revision}" if ckpt.revision else ckpt.repo_id
    return str(ckpt.path)
