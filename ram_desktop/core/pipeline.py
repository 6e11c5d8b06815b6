"""The executor: open sources, plan, probe (pass 1), merge (pass 2, or one pass that also counts),
write. It composes the passes of ``passes``; methods only compute on chunks.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import json
import logging
import os
import platform
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .. import __version__
from . import tokenizer
from .devices import DeviceChoice, choose_device
from .ecosystem.cards.merge import model_card, save_card
from .engine import kernels
from .engine.chunks import OpenFiles
from .engine.passes import PassOutput, merge_pass, probe_pass
from .engine.plan import AuxInput, Layout, MergePlan, check_agent_count, check_aux, make_plan
from .engine.probe import ProbeAccumulator, ProbeReport, load_cached, save_cached
from .errors import InputError, device_memory
from .events import Reporter
from .frozen import thaw
from .methods import PROBE_STATISTICS, Collector, MergeMethod, get_method, plan_warnings
from .recipe import parse_size
from .sources import open_checkpoint
from .spec import Agent, MergeSpec, RunOptions
from .storage.formats import Checkpoint, lora
from .storage.output import (
    MemoryShards,
    ShardSet,
    check_output,
    copy_tokenizer_files,
    staging_folder,
    write_config,
)
from .storage.transfer import Transfer

log = logging.getLogger("ram_desktop")


def open_sources(
    base: str, agents: list[str], reporter: Reporter, token: str | None = None
) -> tuple[Checkpoint, list[Checkpoint]]:
    """Resolve every source (headers only; Hub sources are downloaded to the cache first). A source named more
    than once (the same agent listed twice, or the base listed as an agent) is opened once and shared."""
    opened: dict[str, Checkpoint] = {}

    def open_once(source: str) -> Checkpoint:
        key = str(source).strip()
        if key not in opened:
            opened[key] = open_checkpoint(source, reporter, token)
        return opened[key]

    base_ckpt = open_once(base)
    return base_ckpt, [open_once(a) for a in agents]


def _check_hub_sources(spec: MergeSpec, reporter: Reporter, token: str | None, out: Path | None) -> None:
    """Hub sources: plan from their remote headers, then download them concurrently (``ecosystem.hub.check``).
    ``out`` None: for a probe, which writes nothing (no output precision; the spec's vocabulary mode)."""
    from .sources import HUB_ID

    sources = [spec.base, *spec.sources]
    if any(HUB_ID.match(str(s).strip()) and not Path(str(s).strip()).expanduser().exists() for s in sources):
        from .ecosystem.hub.check import prepare_sources  # imported lazily: huggingface_hub only for Hub sources

        # a rebuilt vocabulary makes every model's vocabulary rows the same: checked later
        vocab = "common" if out is not None and spec.tokenizer is not None else spec.vocab
        out_dtype = spec.out_dtype if out is not None else "base"
        prepare_sources(spec.base, spec.sources, reporter, token, spec.names, out_dtype, vocab, out)


def probe(spec: MergeSpec, options: RunOptions | None = None, reporter: Reporter | None = None) -> ProbeReport:
    """Probe task-vector density and overlap of the spec's sources (docs/methods.md, RAM, RAM+, RAM+s) at its ε,
    on its device; cached by inputs and ε. The spec's method, parameters and output play no part."""
    options = options or RunOptions()
    reporter = reporter or Reporter()
    eps = check_eps(spec.eps)
    check_agent_count(len(spec.agents))
    _check_hub_sources(spec, reporter, options.token, None)
    base_ckpt, agent_ckpts = open_sources(spec.base, spec.sources, reporter, options.token)
    plan = make_plan(base_ckpt, agent_ckpts, spec.names, vocab=spec.vocab)
    notes = _warn(plan, [None])
    with kernels.disabled(below=options.kernel_min_elements):
        choice = choose_device(spec.device, kernels.available)
        _say_device(choice)
        with device_memory(choice.name, "analysing"):
            report = _probe_plan(plan, eps, Transfer(choice.name), reporter, options.use_cache, options.chunk_elements)
    return replace(report, warnings=[*notes, *report.warnings])  # never cached: a later merge words its own


def _say_device(choice: DeviceChoice) -> None:
    """The device (``devices.choose_device``, which refuses an unusable one before any work) and why, in the log both
    faces show, once the inputs are known to be good (a bad input's error stays the only line)."""
    log.info("device: %s (%s)", choice.name, choice.reason)


def _warn(plan: MergePlan, methods: Sequence[MergeMethod | None]) -> list[str]:
    """Log and return the warnings about the inputs that each method words its own way (``plan_warnings``)."""
    notes = list(dict.fromkeys(w for m in methods for w in plan_warnings(m, plan)))
    for w in notes:
        log.warning(w)
    return notes


def _probe_plan(
    plan: MergePlan,
    eps: float,
    transfer: Transfer,
    reporter: Reporter,
    use_cache: bool,
    chunk_elements: int,
    collectors: Sequence[Collector] = (),
    complete: bool = True,
    files: OpenFiles | None = None,
) -> ProbeReport:
    """The probe from the cache when possible, then every collector's passes (as many as it asks for;
    all reading through ``files`` when given. The probe holds every method's statistic of the unique elements
    (``methods.PROBE_STATISTICS``): it runs with no method chosen.

    ``complete=False`` (the merge's pass 1): the methods' statistics are not needed, any cached probe will
    do and a fresh one is computed without them; otherwise (Analyze) a cached probe without them or
    without the inspection statistics (an older cache) is computed again, completely."""
    collectors = list(collectors)
    cached = load_cached(plan.fingerprint(), eps, PROBE_STATISTICS) if use_cache else None
    if cached is not None and len(cached.agents) == plan.n_agents and (cached.complete or not complete):
        log.info("reusing the cached probe of these inputs (ε = %g)", eps)
        report = cached.renamed(plan.names, [a.display for a in plan.agents])
        if collectors:
            probe_pass(plan, eps, transfer, reporter, collectors, chunk_elements, files=files)
    else:
        start = time.perf_counter()
        accumulator = ProbeAccumulator(plan, eps, PROBE_STATISTICS, complete)
        probe_pass(plan, eps, transfer, reporter, [accumulator, *collectors], chunk_elements, files=files)
        report = accumulator.report()
        log.info("probe: %d elements in %d tensors, %.2f s", report.params, report.tensors, time.perf_counter() - start)
        save_cached(report)
    passes = 1
    refining = collectors
    while True:
        refining = [c for c in refining if c.next_pass()]
        if not refining:
            return report
        passes += 1  # a collector needs another look at the data (TIES refines its exact cut)
        probe_pass(plan, eps, transfer, reporter, refining, chunk_elements, stage=f"refine {passes}", files=files)


def check_eps(eps: float, what: str = "--eps") -> float:
    """ε as a float: a non-negative finite number (0 included), else ``InputError`` naming ``what``."""
    try:
        eps = float(eps)
    except (TypeError, ValueError):
        raise InputError(f"{what} must be a non-negative number, got {eps!r}") from None
    if not (eps >= 0.0 and eps < float("inf")):
        raise InputError(f"{what} must be a non-negative number, got {eps}")
    return eps


@dataclass
class MergeResult:
    out: Path
    report: dict
    probe: ProbeReport
    lambdas: list[float]
    seconds: float
    bytes_written: int
    warnings: list[str]
    # a merge kept in memory (``InMemory``): every output tensor by name, holding the bytes the written merge's
    # shards would hold; ``out`` is then the frame folder (config and tokenizer, no weights)
    tensors: dict[str, Any] | None = None


@dataclass(frozen=True)
class InMemory:
    """Merge into memory, not into folders (search trials: scored, then dropped): each variant's tensors are kept
    by a ``MemoryShards`` sink and nothing of them is written. ``frame``: an existing empty folder that receives,
    once, the files the written merges would hold beside their weights for transformers to load them (config.json,
    the tokenizer, the generation config); the variants of one merge share them (``SHARED``). ``fits``: given the
    bytes every variant's tensors take together, whether they may be held in memory; when not, the variants are
    written to their output folders as ``merge_variants`` writes them (``MergeResult.tensors`` None)."""

    frame: Path
    fits: Callable[[int], bool] = field(default=lambda nbytes: True)


def merge(spec: MergeSpec, reporter: Reporter | None = None, options: RunOptions | None = None) -> MergeResult:
    """Merge ``spec`` into its output folder; nothing is written unless the whole merge succeeds."""
    return merge_variants([spec], reporter, options)[0]


COMPUTE_DTYPES = ("float64", "float32", "bfloat16", "float16")  # a method's ``dtype`` that casts its inputs
SHARED = ("base", "agents", "eps", "out_dtype", "vocab", "tokenizer", "chat_template", "slices", "device", "shard_size")


def merge_variants(
    specs: Sequence[MergeSpec],
    reporter: Reporter | None = None,
    options: RunOptions | None = None,
    in_memory: InMemory | None = None,
) -> list[MergeResult]:
    """Merge every spec from one read of the inputs: one probe (when any needs it) and every collector's
    passes, then one merge pass in which each chunk is merged by every spec's method and written by its own
    writer. The specs differ only in method, parameters and output (``SHARED`` is the same in all). Every
    output folder is complete (as ``merge`` writes it) or, on any failure or cancel, none is written.
    ``in_memory``: keep the merges in memory instead where they fit (``InMemory``)."""
    options = options or RunOptions()
    with kernels.disabled(below=options.kernel_min_elements), lora.reuse_deltas(), ExitStack() as scratch:
        # a LoRA's τ computed once
        return _merge_variants(list(specs), reporter or Reporter(), options, scratch, in_memory)


def _merge_variants(
    specs: list[MergeSpec],
    reporter: Reporter,
    options: RunOptions,
    scratch: ExitStack,
    in_memory: InMemory | None = None,
) -> list[MergeResult]:
    start = time.perf_counter()
    methods, params = _checked_variants(specs)
    first = specs[0]
    eps = check_eps(first.eps)
    shard_bytes = parse_size(first.shard_size)
    choice = choose_device(first.device, lambda: kernels.available() and all(m.streaming.fused for m in methods))
    transfer = Transfer(choice.name)
    scratch.enter_context(device_memory(choice.name, "merging"))  # exits after the staging folders are gone
    outs = [Path(str(s.output)).expanduser() for s in specs]
    if len({os.path.normpath(os.path.abspath(o)) for o in outs}) != len(outs):
        raise InputError("two variants name the same output folder; give each its own")
    check_agent_count(len(first.agents))
    settings = None if first.tokenizer is None else thaw(first.tokenizer)
    tokenizer.check_references(settings, first.names, [first.base, *first.sources])
    _check_hub_sources(first, reporter, options.token, outs[0])
    layout = first.layout()
    _check_layout(methods, layout)
    base, agents, vocabulary = _open_aligned(first, settings, params[0], reporter, options.token, scratch)
    plan = make_plan(base, agents, first.names, first.out_dtype, first.vocab, layout)
    _warn(plan, methods)
    aux = _aux_inputs(plan, methods, params)
    inputs = [base, *agents, *(c for a in aux.values() for c in a.checkpoints)]
    memory = in_memory is not None and in_memory.fits(plan.out_bytes * len(outs))
    if in_memory is not None and not memory:
        log.info("%d merge(s) of %d bytes each do not fit in memory: written to folders", len(outs), plan.out_bytes)
    if not memory:
        outs = [check_output(o, inputs, options.overwrite, plan.out_bytes * len(outs)) for o in outs]
    _say_device(choice)

    timings: dict[str, float] = {}
    files = OpenFiles()  # every pass of this run reads through the same open inputs
    try:
        probe_report, contexts = _prepare_methods(
            plan, methods, params, first, eps, transfer, reporter, options, files, timings
        )
    except BaseException:
        files.close()
        raise

    t0 = time.perf_counter()
    with ExitStack() as stack:
        stack.enter_context(files)
        folders = outs if memory else [stack.enter_context(staging_folder(o, options.overwrite)) for o in outs]
        outputs = [
            PassOutput(
                m,
                p,
                ctx,
                MemoryShards(plan) if memory else ShardSet(folder, plan, shard_bytes),
                m.analysis.observer(p, plan) if m.analysis.observer else None,
            )
            for m, p, ctx, folder in zip(methods, params, contexts, folders)
        ]
        accumulator = ProbeAccumulator(plan, eps, PROBE_STATISTICS, complete=False) if probe_report is None else None
        try:  # the auxiliary inputs are read beside the agents in the merge pass only (the probe needs none)
            merge_pass(
                plan, outputs, eps, transfer, reporter, options.chunk_elements, accumulator, files, list(aux.values())
            )
        except BaseException:
            for o in outputs:
                o.shards.abort()
            raise
        for o in outputs:
            o.shards.close()
        if accumulator is not None:
            probe_report = accumulator.report()
            save_cached(probe_report)
        assert probe_report is not None  # from the probe, or counted in the merge pass
        timings["merge_s"] = time.perf_counter() - t0
        frame = in_memory.frame if memory and in_memory is not None else None
        if frame is not None:
            _write_frame(frame, plan, first, vocabulary)
        results = []
        for spec, m, output, folder, out in zip(specs, methods, outputs, folders, outs):
            timings["total_s"] = time.perf_counter() - start
            results.append(
                _variant_result(spec, m, output, plan, probe_report, choice, timings, folder, out, frame, vocabulary)
            )
    seconds = time.perf_counter() - start
    for result in results:
        result.seconds = seconds
        log.info(
            "merged %d agents with %s into %s in %.2f s", plan.n_agents, result.report["method"], result.out, seconds
        )
    return results


def _shared_part(spec: MergeSpec, key: str) -> Any:
    """What variants must share of ``spec``'s ``key``: of the agents, their names and sources (each variant's
    own per-agent values are its parameters)."""
    if key == "agents":
        return [(a.name, a.source) for a in spec.agents]
    return getattr(spec, key)


def _checked_variants(specs: list[MergeSpec]) -> tuple[list[MergeMethod], list[dict[str, Any]]]:
    """The variants' methods and resolved parameters, once the specs are known to make one merge: they share
    ``SHARED``, name a base and each an output."""
    if not specs:
        raise InputError("no variants to merge; give at least one method")
    first = specs[0]
    for key in SHARED:
        if any(_shared_part(s, key) != _shared_part(first, key) for s in specs[1:]):
            raise InputError(f"variants of one merge must share {key}; only method, parameters and output may differ")
    first.check_base()
    first.check_agents()
    for s in specs:
        s.check_output()
    methods = [get_method(s.method) for s in specs]
    return methods, [m.resolve(s.engine_params()) for m, s in zip(methods, specs)]


def _check_layout(methods: list[MergeMethod], layout: Layout | None) -> None:
    """A stacking method needs a stacking layer map, and a stacking layer map a stacking method."""
    for m in methods:
        if m.streaming.stacks and (layout is None or not layout.stacking):
            raise InputError(
                f"{m.name} stacks layers: give slices, each naming one model and its layer_range (recipe: slices:)"
            )
        if layout is not None and layout.stacking and not m.streaming.stacks:
            raise InputError(
                f"slices with one source each stack layers, which {m.name} does not do; use passthrough, or list "
                "every model in each slice to merge them"
            )


def _open_aligned(
    spec: MergeSpec,
    settings: dict[str, Any] | None,
    params: dict[str, Any],
    reporter: Reporter,
    token: str | None,
    scratch: ExitStack,
) -> tuple[Checkpoint, list[Checkpoint], tokenizer.Vocabulary | None]:
    """The base and agents opened, and the output's vocabulary; with a rebuilt vocabulary, the models as
    aligned to it (written into a scratch folder that lives as long as ``scratch``)."""
    base, agents = open_sources(spec.base, spec.sources, reporter, token)
    vocabulary = tokenizer.prepare(
        [base, *agents],
        spec.names,
        [spec.base, *spec.sources],
        settings,
        spec.chat_template,
        prefer_base=params.get("use_base") is not False,
    )
    if vocabulary is not None and vocabulary.rebuilt:
        cast = params.get("dtype")
        folder = Path(scratch.enter_context(tempfile.TemporaryDirectory(prefix="ram-vocabulary-")))
        base, agents = vocabulary.aligned(folder, cast if cast in COMPUTE_DTYPES else None)
    return base, agents, vocabulary


def _prepare_methods(
    plan: MergePlan,
    methods: list[MergeMethod],
    params: list[dict[str, Any]],
    spec: MergeSpec,
    eps: float,
    transfer: Transfer,
    reporter: Reporter,
    options: RunOptions,
    files: OpenFiles,
    timings: dict[str, float],
) -> tuple[ProbeReport | None, list[Any]]:
    """Each method's context for the merge pass: the probe and the collectors' passes where a method needs them
    (None: no probe; the merge pass counts it), then ``prepare``, ``bind`` and the layer map's parameters."""
    collectors = [m.analysis.collector(p, plan) if m.analysis.collector else None for m, p in zip(methods, params)]
    probe_report = None
    if any(m.analysis.needs_probe(p) for m, p in zip(methods, params)) or any(collectors):
        t0 = time.perf_counter()
        # the merge needs only the counts; the rounding survival is counted exactly in the merge pass
        probe_report = _probe_plan(
            plan,
            eps,
            transfer,
            reporter,
            options.use_cache,
            options.chunk_elements,
            [c for c in collectors if c is not None],
            complete=False,
            files=files,
        )
        timings["probe_s"] = time.perf_counter() - t0
    contexts = [m.prepare(p, probe_report, c.finish() if c else None) for m, p, c in zip(methods, params, collectors)]
    contexts = [m.bind(ctx, plan) if m.bind is not None else ctx for m, ctx in zip(methods, contexts)]
    _slice_parameters(spec.engine_slices(), methods, contexts)
    return probe_report, contexts


def _variant_result(
    spec: MergeSpec,
    m: MergeMethod,
    output: PassOutput,
    plan: MergePlan,
    probe_report: ProbeReport,
    choice: DeviceChoice,
    timings: dict[str, float],
    folder: Path,
    out: Path,
    frame: Path | None,
    vocabulary: tokenizer.Vocabulary | None,
) -> MergeResult:
    """One variant's report and result; its folder's other files written beside its weights (``frame``: the
    in-memory merge's frame folder, which holds them once for all variants)."""
    lambdas = m.analysis.lambdas(output.params, probe_report) if m.analysis.lambdas else [1.0] * plan.n_agents
    # what the method's observer counted, under the merge report key the method names
    observed = {m.analysis.observed_as: output.observer.finish()} if output.observer is not None else {}
    written = _written_spec(spec, plan, output.params, out)
    report = merge_report(
        plan,
        written,
        output.params,
        probe_report,
        lambdas,
        choice,
        timings,
        output.shards.files,
        output.shards.bytes_written,
        observed,
    )
    own = plan_warnings(m, plan)  # the method's own words for its inputs (logged once, before the passes)
    report["warnings"] = [*own, *report["warnings"]]
    tensors = None
    if frame is not None:
        assert isinstance(output.shards, MemoryShards)
        tensors, out = output.shards.tensors(), frame
    else:
        _write_extras(folder, plan, written, output.params, probe_report, lambdas, report, vocabulary)
    return MergeResult(
        out, report, probe_report, lambdas, 0.0, output.shards.bytes_written, [*own, *probe_report.warnings], tensors
    )


def _slice_parameters(slices: list[dict[str, Any]] | None, methods: list, contexts: list) -> None:
    """Each slice's own parameters (recipe ``slices[i].parameters``), resolved, into every variant's context:
    only the methods that resolve parameters per tensor (``methods.weights``) can take them."""
    if not slices or not any(s.get("parameters") is not None for s in slices):
        return
    from .methods.weights import WeightsContext

    for method, ctx in zip(methods, contexts):
        if not isinstance(ctx, WeightsContext):
            raise InputError(
                f"slices[*].parameters: {method.name} takes one set of parameters for the whole model; "
                "move them to the recipe's parameters"
            )
        ctx.group_params = [
            method.resolve(s["parameters"]) if s.get("parameters") is not None else None for s in slices
        ]


def _aux_inputs(plan: MergePlan, methods: list, params: list[dict]) -> dict[str, AuxInput]:
    """Every variant's per-agent auxiliary checkpoints (``Streaming.aux_inputs``), opened (headers only)
    and checked against the plan before anything is read or written."""
    aux: dict[str, AuxInput] = {}
    for method, p in zip(methods, params):
        if method.streaming.aux_inputs is None:
            continue
        for key, checkpoints in method.streaming.aux_inputs(p).items():
            if key not in aux:
                aux[key] = check_aux(plan, key, checkpoints, method.label)
    return aux


def merge_report(
    plan: MergePlan,
    spec: MergeSpec,
    params: dict,
    probe_report: ProbeReport,
    lambdas: list[float],
    device: DeviceChoice,
    timings: dict[str, float],
    files: list[str],
    bytes_written: int,
    observed: dict[str, Any] | None = None,
) -> dict:
    """The probe report plus what the merge did (docs/contracts.md, The probe and merge report). ``observed``:
    what the method's observer counted in the merge pass, by the report key the method names; each replaces what
    the probe's statistics state under that key (``ProbeStatistic.merge_fields``) unless it counted nothing."""
    report = probe_report.to_json()
    out_names = {j.out_name for j in plan.mergeable_jobs}
    fields: dict[str, Any] = {}
    for kind in probe_report.kinds:
        fields.update(kind.merge_fields(probe_report.statistics[kind.name], lambdas, out_names))
    fields.update({key: value for key, value in (observed or {}).items() if value})
    report.update(
        {
            "method": spec.method,
            "method_params": params,
            "lambda": lambdas,
            "out_dtype": spec.out_dtype,
            "vocab": spec.vocab,
            "device": device.name,
            "device_reason": device.reason,
            "sources": {"base": plan.base.display, "agents": [a.display for a in plan.agents]},
            **fields,
            "output": {"files": files, "bytes": bytes_written},
            "timings": {k: round(v, 4) for k, v in timings.items()},
            "versions": {
                "ram_desktop": __version__,
                "torch": _package_version("torch"),
                "safetensors": _package_version("safetensors"),
                "huggingface_hub": _package_version("huggingface_hub"),
                "python": platform.python_version(),
            },
        }
    )
    return report


@functools.cache
def _package_version(name: str) -> str:
    """An installed package's version, from its metadata (no import), or from the module where the metadata is
    missing (a frozen bundle)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return importlib.import_module(name).__version__


def _written_spec(spec: MergeSpec, plan: MergePlan, params: dict, out: Path) -> MergeSpec:
    """The spec a merge writes as its recipe: sources pinned, every parameter stated (each agent's on it), the
    output folder absolute."""
    agents = tuple(Agent(name, _pinned(a)) for name, a in zip(plan.names, plan.agents))
    stated = spec.replace(agents=agents, base=_pinned(plan.base), output=str(Path(out).expanduser().resolve()))
    return stated.with_method(spec.method, params)


def _write_extras(
    folder: Path,
    plan: MergePlan,
    spec: MergeSpec,
    params: dict,
    probe_report: ProbeReport,
    lambdas: list[float],
    report: dict,
    vocabulary: tokenizer.Vocabulary | None = None,
) -> None:
    _write_frame(folder, plan, spec, vocabulary)
    save_card(model_card(plan, spec.method, params, lambdas, probe_report, spec.out_dtype), folder / "README.md")
    spec.save(folder / "ram-recipe.yaml")
    (folder / "merge-report.json").write_text(json.dumps(report, indent=1) + "\n")


def _write_frame(
    folder: Path, plan: MergePlan, spec: MergeSpec, vocabulary: tokenizer.Vocabulary | None = None
) -> None:
    """What a merge's folder holds beside its weights for transformers to load it: config.json, the tokenizer
    (the base's, or the rebuilt vocabulary's) and the generation config."""
    write_config(plan.base, folder, plan, plan.layer_sources)
    if vocabulary is None:
        copy_tokenizer_files(plan.base, folder)
    else:
        vocabulary.save(folder, spec.chat_template)
        copy_tokenizer_files(plan.base, folder, ("generation_config.json",))  # a generation setting, not vocabulary


def _pinned(ckpt: Checkpoint) -> str:
    """The source as a recipe names it: a Hub id pinned to its commit, or the absolute local path (``MODEL+ADAPTER``
    for an adapter named with the model it is applied to)."""
    if ckpt.applied_to is not None:
        return f"{_pinned(ckpt.applied_to)}+{_pinned(replace(ckpt, applied_to=None))}"
    if ckpt.repo_id:
        return f"{ckpt.repo_id}@{ckpt.revision}" if ckpt.revision else ckpt.repo_id
    return str(ckpt.path)
