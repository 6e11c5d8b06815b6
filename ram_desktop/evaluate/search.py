"""``ram-merge search``: which merge is best for these agents? An Optuna study over methods and their
parameters, each trial merged and scored on validation suites, the best one then merged into
``DIR/best`` and scored on test suites beside RAM+ and Task Arithmetic at their defaults
(docs/evaluate.md, Search).

A search starts from a whole ``MergeSpec`` (the command line's sources and flags, a recipe file, the
window's spec). A trial is a method and its parameters (a compare ``Variant``) applied to that spec: they
replace the spec's method and parameters, and everything else the spec says (agent names, ε, output dtype,
vocabulary, tokenizer, chat template, layer map, shard size) reaches every trial and ``DIR/best`` as it
reaches ``ram-merge run``. Each parameter is searched over the paper's range where the paper gives one
(``Param.paper_range``, or the one it gives a parameter of the same name, as DARE's scale takes Table 11's
λ range), else over its declared range (``Param.minimum``..``maximum``); the parameters it does not vary
(seeds, per-agent values, settings) keep the spec's values in trials of the spec's own method, their defaults
in the others'. The first trial of a new study is the spec's method with the spec's values of the searched
parameters when that method is searched (RAM+ at its defaults otherwise), then the other chosen methods at
their defaults, so the best trial is never worse on validation than the starting point.

The study lives in ``DIR/study.db`` (Optuna's SQLite storage) and is the single source of truth: a rerun
with the same DIR continues it (its trials are kept, the sampler is seeded past them), a trial that a
killed run left running is marked failed, and trials run until ``trials`` have completed. Trials run in
this process (``workers`` of them merged from one read of the inputs and scored in one pass) or as Ray
tasks (``ray``: a cluster address, or ``"local"`` for a local Ray), the study staying in this process.

Fisher merging is searched when it has its calibration (``SearchOptions.calibration``: per-agent suites as
``ram-merge merge --fisher-suite`` takes them, or the spec's own): each agent's Fisher is estimated once before
the trials through the faces' calibrate step (``workflow.calibrate``, its cache), only its scale is searched,
and its trials merge like every other method's; the calibration is part of the study's identity.

A trial is merged in memory and scored there (``score_merges``): nothing of it is written. Only ``DIR/best``
(and the references' temporary folders) are written. Trials go to temporary folders instead with the vLLM
backend or lm-eval tasks (both load folders), when the trials' merged tensors would take more than a quarter of
the memory available (``fits_in_memory``), or with ``RAM_DESKTOP_TRIALS_ON_DISK=1``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core import (
    METHODS,
    SEARCH_METHODS,
    SEARCH_REFERENCES,
    Cancelled,
    InMemory,
    InputError,
    MergeSpec,
    Reporter,
    RunOptions,
    Variant,
    defaults,
    get_method,
    merge_variants,
    reuse_deltas,
    variant_specs,
)
from .scorer_process import ScorerProcess
from .stats import clearly_better, mean_interval, paired_difference
from .vllm_backend import check_backend

try:
    import fcntl
except ImportError:  # Windows: one search per folder is then the user's care
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger("ram_desktop")

STUDY_DB = "study.db"
SEARCH_JSON = "search.json"
BEST = "best"
STUDY_NAME = "ram-merge-search"
# what a study made before the key existed used: a study without a tokenizer, chat template or layer map reads
# as one made for a spec without them, and continues
IDENTITY_DEFAULTS = {
    "backend": "transformers",
    "tokenizer": None,
    "chat_template": None,
    "slices": None,
    "kept": None,
    "calibration": None,
}
SQLITE_SIDE_FILES = ("-journal", "-wal", "-shm")  # what SQLite may keep beside study.db while it is open
FORMAT = "ram-search/1"
SAME_SCORE_AFTER = 5  # distinct merges that all score the same: the suites cannot tell them apart
_NUMBER = r"-?\d+(?:\.\d+)?(?:e-?\d+)?"
TRIALS_ON_DISK = "RAM_DESKTOP_TRIALS_ON_DISK"  # "1": every trial written to a temporary folder and loaded from it
MEMORY_SHARE = 0.25  # of the available memory, for the kept trials: scoring makes a float32 copy of each too


# ---- the search space ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Dimension:
    """One searched parameter of a method: a float or int interval (``log``: sampled on a log scale) or choices."""

    method: str
    param: str
    kind: str  # "float", "int" or "choice"
    low: float = 0.0
    high: float = 0.0
    log: bool = False
    choices: tuple[Any, ...] = ()
    source: str = ""  # "paper" or "declared"
    label: str = ""  # the parameter's name for a reader (``Param.title``)

    @property
    def key(self) -> str:
        """The Optuna parameter name: the method's name first, so methods never share a distribution."""
        return f"{self.method}:{self.param}"

    def describe(self) -> str:
        """In words: ``trim scope: tensor or model``, ``normalize: false or true``, ``scale 0.1 to 1 (paper range)``."""
        name = self.label or self.param
        if self.kind == "choice":
            words = [str(c).lower() if isinstance(c, bool) else str(c) for c in self.choices]
            return f"{name}: {', '.join(words[:-1])} or {words[-1]}" if len(words) > 1 else f"{name}: {words[0]}"
        return f"{name} {self.low:g} to {self.high:g}{', log scale' if self.log else ''} ({self.source} range)"


def paper_interval(text: str | None) -> tuple[float, float] | None:
    """The interval a paper-range text spans: ``0.1-0.9 ...`` → (0.1, 0.9); ``0.1, 0.3, ..., 1.0`` → (0.1, 1.0);
    ``0.1; ablation 0.0-0.2`` → (0.0, 0.2) (the searched part); a single setting (``2.0 (paper setting)``) → None."""
    if not text:
        return None
    text = text.split("(")[0]
    spans = re.findall(rf"({_NUMBER})\s*[-–]\s*({_NUMBER})", text)
    if spans:
        low, high = (float(v) for v in spans[-1])
        return (low, high) if high > low else None
    values = [float(v) for v in re.findall(_NUMBER, text)]
    return (min(values), max(values)) if len(values) >= 2 and max(values) > min(values) else None


def search_space(method_name: str) -> list[Dimension]:
    """The parameters ``search`` varies for a method (module docstring), in the method's order."""
    dims = []
    method = get_method(method_name)
    for p in method.params:
        if p.per_agent or p.setting or p.name == "seed" or p.name in method.interop.calibration:
            continue
        if p.choices:
            dims.append(Dimension(method_name, p.name, "choice", choices=tuple(p.choices), label=p.title))
            continue
        if p.kind is bool:
            dims.append(Dimension(method_name, p.name, "choice", choices=(False, True), label=p.title))
            continue
        if p.kind not in (int, float):
            continue
        span = paper_interval(p.paper_range) or _shared_paper_interval(p.name)
        source = "paper"
        if span is None and p.minimum is not None and p.maximum is not None:
            span, source = (float(p.minimum), float(p.maximum)), "declared"
        if span is None:
            continue
        low = max(span[0], p.minimum) if p.minimum is not None else span[0]
        high = min(span[1], p.maximum) if p.maximum is not None else span[1]
        if high <= low:
            continue
        kind = "int" if p.kind is int else "float"
        log_scale = low > 0 and high / low >= 1000
        dims.append(Dimension(method_name, p.name, kind, low, high, log_scale, source=source, label=p.title))
    return dims


def _shared_paper_interval(name: str) -> tuple[float, float] | None:
    """The paper range another method gives a parameter of the same name (DARE's scale: Table 11's λ range)."""
    for method in METHODS.values():
        for p in method.params:
            if p.name == name and not p.per_agent and (span := paper_interval(p.paper_range)) is not None:
                return span
    return None


def check_methods(methods: Sequence[str]) -> list[str]:
    """The methods to search, validated: known, not stacking layers, no repeats (a calibrated method's
    calibration is checked by ``search``, which has it)."""
    chosen = [m.strip() for m in methods if m.strip()]
    if not chosen:
        raise InputError("no methods to search; give --methods m1,m2,... (e.g. ram-plus,task-arithmetic,ties)")
    for name in chosen:
        method = get_method(name)  # unknown: InputError listing the methods
        if method.streaming.stacks:
            raise InputError(f"{name} stacks layers from a layer map; search cannot tune it — leave it out")
    repeated = sorted({m for m in chosen if chosen.count(m) > 1})
    if repeated:
        raise InputError(f"--methods names {repeated[0]} twice")
    return chosen


# ---- trials -------------------------------------------------------------------------------------------


@dataclass
class Trial:
    """One finished trial: its Optuna number, the merge (method and resolved parameters), its validation
    score (mean over the suites) and per-suite scores, and the seconds it took (0 for a repeat)."""

    number: int
    method: str
    params: dict[str, Any]
    validation: float
    scores: list[float]
    seconds: float
    same_as: int | None = None  # a repeat of this earlier trial's merge: its score, not merged again

    def to_json(self) -> dict[str, Any]:
        data = {
            "number": self.number,
            "method": self.method,
            "params": self.params,
            "validation": self.validation,
            "scores": self.scores,
            "seconds": round(self.seconds, 3),
        }
        if self.same_as is not None:
            data["same_as"] = self.same_as
        return data

    @property
    def variant(self) -> Variant:
        return Variant(f"trial-{self.number}", self.method, dict(self.params))


@dataclass(frozen=True)
class Inputs:
    """What every trial reads, as plain data (it travels to Ray workers, pickled): the whole spec (sources made
    absolute, no output folder) and the suites with how they are scored. A trial is a delta of ``spec``: its
    method and parameters replace the spec's, everything else (names, ε, precision, vocabulary, tokenizer, chat
    template, layer map, shard size, device) is kept (``merge_specs``)."""

    spec: MergeSpec
    suites: tuple[str, ...]
    batch_size: int
    limit: int | None
    include_path: tuple[str, ...] = ()  # folders of lm-eval task YAMLs, for lm-eval:TASK suites
    backend: str = "transformers"  # what generates the completions: transformers or vllm
    # per calibrated method, what its calibrate step gave (Fisher: the suites made absolute, the examples and
    # each agent's Fisher folder), added to its trials' parameters when they are merged
    calibrated: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def merge_specs(self, merges: Sequence[tuple[str, str, dict[str, Any]]], folder: str | Path) -> list[MergeSpec]:
        """One spec per (name, method, params), each into ``folder/<name>``: the compare variants' one path
        (``variant_specs``) applied to the whole spec with its own parameters dropped, so a trial's method and
        parameters replace the spec's and nothing of the spec's method leaks into another method's trial. A
        calibrated method's trial takes the calibration's results (``calibrated``) as ``ram-merge merge`` does."""
        shared = self.spec.replace(
            params={}, agents=tuple(dataclasses.replace(a, params={}) for a in self.spec.agents), output=None
        )
        variants = [Variant(name, m, {**p, **self.calibrated.get(m, {})}) for name, m, p in merges]
        return variant_specs(shared, variants, folder)


def score_merges(
    inputs: Inputs,
    merges: Sequence[tuple[str, dict[str, Any]]],
    reporter: Reporter | None = None,
    threads: int | None = None,
    suites: Sequence[Any] | None = None,
    scorer_process: ScorerProcess | None = None,
) -> list[list[float]]:
    """Merge each (method, params) from one read of the inputs, score every merge on the suites, drop them; per
    merge, its score on each suite. The merges are kept in memory and scored there (``InMemoryModel``) where
    ``trials_in_memory`` allows, else written into a temporary folder each (removed after). Runs in this process
    or in a Ray worker. ``scorer_process``: the search's one child for python scorers (``evaluate``'s), reused
    across trials."""
    from . import InMemoryModel, evaluate, load_suites

    loaded = list(suites) if suites is not None else load_suites(inputs.suites, inputs.include_path)
    with tempfile.TemporaryDirectory(prefix="ram-search-") as tmp:
        specs = inputs.merge_specs([(f"m{i}", m, p) for i, (m, p) in enumerate(merges)], tmp)
        memory = None
        if trials_in_memory(inputs, loaded):
            memory = InMemory(Path(tmp) / "frame", fits_in_memory)  # config and tokenizer only: no weights
            memory.frame.mkdir()
        merged = merge_variants(specs, reporter, in_memory=memory)
        models = [
            InMemoryModel(f"m{i}", m.out, m.tensors) if m.tensors is not None else str(m.out)
            for i, m in enumerate(merged)
        ]
        del merged
        result = evaluate(
            models,
            loaded,
            inputs.spec.device,
            inputs.batch_size,
            inputs.limit,
            reporter,
            threads,
            scorer_process=scorer_process,
            backend=inputs.backend,
        )
    return [list(row) for row in result.scores]


def trials_in_memory(inputs: Inputs, suites: Sequence[Any]) -> bool:
    """Whether trials may be scored in memory: the transformers backend, RAM Desktop suites only (lm-eval tasks
    and vLLM load folders), and ``RAM_DESKTOP_TRIALS_ON_DISK`` not set to 1."""
    from .lm_eval_tasks import LmEvalTask

    if os.environ.get(TRIALS_ON_DISK, "").strip() == "1":
        return False
    return inputs.backend == "transformers" and not any(isinstance(s, LmEvalTask) for s in suites)


def fits_in_memory(nbytes: int) -> bool:
    """Whether ``nbytes`` of merged tensors may be kept in memory: at most ``MEMORY_SHARE`` of the memory available
    now (scoring each makes a float32 copy of it beside them); False when the available memory cannot be read."""
    available = available_memory()
    return available is not None and nbytes <= MEMORY_SHARE * available


def available_memory() -> int | None:
    """Bytes of memory available to new allocations (psutil's ``available``, else /proc/meminfo's MemAvailable)."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


# ---- the study ----------------------------------------------------------------------------------------


@dataclass
class SearchResult:
    """What ``search`` leaves in ``folder``: the trials, the best one and, with test suites, its test scores
    beside the references' with paired differences (``to_json`` is ``search.json``)."""

    folder: Path
    trials: list[Trial]
    best: Trial
    test: dict[str, Any] | None = None
    seconds: float = 0.0
    resumed: int = 0  # trials that earlier runs had finished
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        best: dict[str, Any] = {
            "number": self.best.number,
            "method": self.best.method,
            "params": self.best.params,
            "validation": self.best.validation,
            "folder": BEST,
        }
        data: dict[str, Any] = {"format": FORMAT, **self.extra, "trials": [t.to_json() for t in self.trials]}
        if self.test is not None:
            best["test"] = self.test["models"][0]["test"]
            best["test_interval"] = self.test["models"][0]["test_interval"]
            best["suites"] = self.test["models"][0]["suites"]
            data["test_suites"] = self.test["suites"]
            data["reference"] = [dict(r) for r in self.test["models"][1:]]
            for ref in data["reference"]:  # the default was a trial too (the first ones are): its validation score
                same = [t for t in self.trials if (t.method, t.params) == (ref["method"], ref["params"])]
                if same:
                    ref["validation"] = same[0].validation
            data["differences"] = self.test["differences"]
        data["best"] = best
        data["seconds"] = round(self.seconds, 3)
        return data


@dataclass
class SearchOptions:
    """A search: the inputs (the merge's sources and precision, and the suites), the methods, the trial budget
    and where it runs."""

    spec: MergeSpec
    suites: Sequence[Any]  # validation: paths or loaded Suites
    test_suites: Sequence[Any]
    folder: Path
    trials: int
    methods: Sequence[str] = SEARCH_METHODS
    seed: int = 0
    workers: int = 1
    ray: str | None = None  # a Ray cluster address, "local", or None (trials run here)
    batch_size: int = 32
    limit: int | None = None
    include_path: Sequence[Path] = ()  # folders of lm-eval task YAMLs, for lm-eval:TASK suites
    backend: str = "transformers"  # what generates the completions (evaluate's backend)
    # the calibrated methods' calibration as ``ram-merge merge`` takes it (Fisher: ``suite``, one per agent as a
    # list in agent order, comma-separated text or keyed by agent name; ``examples``; or ``fisher`` folders);
    # None: the spec's own, when its method is calibrated and names them (a recipe's, the window's Method form)
    calibration: Mapping[str, Any] | None = None


@reuse_deltas()  # a LoRA agent's τ computed once for all the trials of this run (in this process)
def search(
    options: SearchOptions,
    reporter: Reporter | None = None,
    on_trial: Callable[[Trial], None] | None = None,
    calibrate: Callable[[MergeSpec, Reporter], MergeSpec] | None = None,
) -> SearchResult:
    """Run (or continue) the study in ``options.folder`` until ``options.trials`` trials have completed, then
    merge the best into ``folder/best``, score it on the test suites beside the references and write
    ``search.json``. ``on_trial`` sees every finished trial, earlier runs' first. ``calibrate``: the faces'
    calibrate step (``workflow.calibrate``), run once per calibrated method searched before the first trial.
    Bad input raises ``InputError`` before anything is written; a cancel (``Cancelled``) keeps the finished
    trials."""
    from . import LmEvalTask, Suite, load_suites

    started = time.perf_counter()
    reporter = reporter or Reporter()
    methods = check_methods(options.methods)
    if isinstance(options.trials, bool) or not isinstance(options.trials, int) or options.trials < 1:
        raise InputError(f"--trials must be a whole number of at least 1, got {options.trials!r}")
    if options.workers < 1:
        raise InputError(f"--workers must be at least 1, got {options.workers}")
    if not options.suites:
        raise InputError("no validation suites; give --suite SUITE... to score the trials on")
    spec = options.spec
    spec.check_base()
    spec.check_agents()
    calibration = _calibration(spec, options.calibration, methods)
    if calibration and calibrate is None:
        raise TypeError("a calibrated method is searched: pass the calibrate step (workflow.search does)")
    include = tuple(str(p) for p in options.include_path)
    check_backend(options.backend, spec.device)

    def opened(given: Sequence[Any]) -> list[Suite | LmEvalTask]:
        paths = [s for s in given if not isinstance(s, (Suite, LmEvalTask))]
        loaded = iter(load_suites(paths, include))
        return [s if isinstance(s, (Suite, LmEvalTask)) else next(loaded) for s in given]

    suites, tests = opened(options.suites), opened(options.test_suites)
    for suite in (*suites, *tests):
        if isinstance(suite, Suite):
            suite.scorer_spec  # noqa: B018 — a bad scorer spec is refused before any merge, without running it
    inputs = Inputs(
        _absolute(spec),
        tuple(str(s.source) for s in suites),
        options.batch_size,
        options.limit,
        include,
        options.backend,
    )
    start = _start(spec, methods)
    kept = _kept(start)
    identity = _identity(inputs, methods, options.seed, kept, calibration)
    folder = Path(options.folder).expanduser()
    _check_folder(folder)
    runner = _RayRunner(options.ray, options.workers) if options.ray else None
    created = not folder.exists()
    db = folder / STUDY_DB
    fresh = not db.exists()
    try:
        study, lock = _open_study(folder, identity, options.seed, start)
    except BaseException:
        if runner is not None:
            runner.close()
        raise
    # one child process runs the python scorers of every trial here and of the final test (started once, each
    # scorer file loaded once): a child per trial cost ~0.15 s of a ~1 s trial on the demo (benchmarks/README.md)
    scorer_process = ScorerProcess(reporter.check)
    try:
        try:
            if calibration and calibrate is not None:  # each agent's Fisher estimated (or cached) once, first
                inputs = _calibrated(inputs, calibration, calibrate, reporter)
            trials = _run_trials(
                study, inputs, suites, methods, options, reporter, on_trial, runner, scorer_process, kept, calibration
            )
        except InputError:
            if fresh and not _finished(study):  # a bad input found by the first merge: nothing left behind
                _close(study)
                _remove_new(folder, created)
            raise
        finally:
            if runner is not None:
                runner.close()
        best = max(trials, key=lambda t: (t.validation, -t.number))
        test = _merge_best(inputs, best, tests, folder, reporter, scorer_process)
    except (Cancelled, KeyboardInterrupt):
        raise Cancelled(
            f"{len(_finished(study))} finished trials kept in {db}; run the same command to continue"
        ) from None
    finally:
        scorer_process.close()
        _close(study)
        os.close(lock)
    result = SearchResult(folder, trials, best, test, time.perf_counter() - started)
    result.extra = {
        "study": STUDY_DB,
        "seed": options.seed,
        "methods": methods,
        "space": {m: [d.describe() for d in search_space(m)] for m in methods},
        "validation_suites": [s.name for s in suites],
    }
    _write_json(folder / SEARCH_JSON, result.to_json())
    return result


def _source(text: str) -> str:
    """A local path made absolute (the study remembers where its inputs are); a Hub id as given."""
    path = Path(text).expanduser()
    return str(path.resolve()) if path.exists() else text


def _absolute(spec: MergeSpec) -> MergeSpec:
    """The whole spec every trial is a delta of: its sources made absolute, no output folder of its own."""
    agents = tuple(dataclasses.replace(a, source=_source(a.source)) for a in spec.agents)
    return spec.replace(base=_source(spec.base), agents=agents, output=None)


def _identity(
    inputs: Inputs,
    methods: list[str],
    seed: int,
    kept: dict[str, Any] | None,
    calibration: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """What makes a study: the sources, suites, methods, seed, and every part of the spec that changes what a
    trial merges (precision, vocabulary, tokenizer, chat template, layer map, the values its method's trials
    keep: ``_kept``, the calibrated methods' calibration: ``_calibration``), as the JSON stored in study.db. Shard size and device are not in it: they change how a
    merge is written or run, not its values. The spec's values of searched parameters are not either: they
    are only where a new study starts."""
    spec = inputs.spec
    identity = {
        "base": spec.base,
        "agents": spec.sources,
        "names": spec.names,
        "suites": list(inputs.suites),
        "methods": methods,
        "seed": seed,
        "eps": spec.eps,
        "out_dtype": spec.out_dtype,
        "vocab": spec.vocab,
        "limit": inputs.limit,
        "backend": inputs.backend,
        "tokenizer": spec.tokenizer,
        "chat_template": spec.chat_template,
        "slices": list(spec.slices) if spec.slices is not None else None,
        "kept": kept,
        "calibration": calibration or None,
    }
    # tuples and mappings as the JSON stored in study.db reads back
    return json.loads(json.dumps(identity, default=lambda v: dict(v) if isinstance(v, Mapping) else _plain(v)))


def _start(spec: MergeSpec, methods: list[str]) -> tuple[str, dict[str, Any]] | None:
    """The study's starting point: the spec's method with its parameters (the engine's form, defaults filled
    in), when that method is searched; None: the defaults only."""
    if spec.method not in methods:
        return None
    return spec.method, spec.resolved_params()


def _kept(start: tuple[str, dict[str, Any]] | None) -> dict[str, Any] | None:
    """The values of the parameters search does not vary (per-agent values, seeds, settings) that the spec
    gives its own method other than the defaults: that method's trials keep them, as a delta of the spec keeps
    everything it does not replace. ``{"method": M, "params": {...}}``, or None when there are none."""
    if start is None:
        return None
    method, resolved = start
    fixed = {d.param for d in search_space(method)} | set(get_method(method).interop.calibration)  # not kept here
    default = get_method(method).resolve({})
    params = {k: v for k, v in resolved.items() if k not in fixed and v != default.get(k)}
    if not params:
        return None
    return json.loads(json.dumps({"method": method, "params": params}, default=_plain))


def spec_calibration(spec: MergeSpec) -> dict[str, Any] | None:
    """The spec's own calibration (``SearchOptions.calibration``): its method's calibration parameters in the
    engine's form when the method is calibrated and the spec names what it is calibrated on (Fisher: suites or
    Fisher folders), else None."""
    method = get_method(spec.method)
    params = spec.engine_params()
    given = {k: params[k] for k in method.interop.calibration if params.get(k) is not None}
    return given if any(given.get(name) for name in _calibration_paths(spec.method)) else None


def _calibration_paths(method: str) -> list[str]:
    """A calibrated method's per-agent calibration parameters, one path per agent (Fisher: suites, folders)."""
    m = get_method(method)
    return [p.name for p in m.params if p.per_agent and p.name in m.interop.calibration]


def _calibration(spec: MergeSpec, given: Mapping[str, Any] | None, methods: list[str]) -> dict[str, dict[str, Any]]:
    """Per calibrated method searched, its calibration in the engine's form, checked (one suite or folder per
    agent, every suite readable), paths made absolute: what its trials merge with and the study remembers.
    A calibrated method searched without one, or a calibration given for none, is refused."""
    from ..core.methods.fisher import NEEDS_FISHER
    from .suites import load_suite

    calibrated = [m for m in methods if get_method(m).interop.calibrated]
    if given is None:
        given = spec_calibration(spec)
    elif not calibrated:
        flags = ", ".join(sorted({p.flag for m in METHODS.values() for p in m.params if p.name in given}))
        takers = ", ".join(n for n, m in METHODS.items() if m.interop.calibrated)
        raise InputError(f"{flags}: for {takers}, which --methods leaves out; add it to --methods or leave {flags} out")
    out: dict[str, dict[str, Any]] = {}
    for name in calibrated:
        params = spec.with_method(name, dict(given or {})).resolved_params()
        paths = _calibration_paths(name)
        if not any(params.get(key) for key in paths):
            raise InputError(NEEDS_FISHER)
        for suite in params.get("suite") or ():
            load_suite(suite)  # unreadable: refused before the study is made
        kept = {k: params[k] for k in get_method(name).interop.calibration if params.get(k) is not None}
        for key in paths:
            if key in kept:
                kept[key] = [_source(str(v)) for v in kept[key]]
        out[name] = kept
    return out


def _calibrated(
    inputs: Inputs,
    calibration: dict[str, dict[str, Any]],
    calibrate: Callable[[MergeSpec, Reporter], MergeSpec],
    reporter: Reporter,
) -> Inputs:
    """``inputs`` with each calibrated method's calibrate step done (Fisher: every agent's Fisher estimated, or
    taken from its cache), once for all the trials."""
    done: dict[str, dict[str, Any]] = {}
    for name, params in calibration.items():
        resolved = calibrate(inputs.spec.with_method(name, params), reporter).engine_params()
        done[name] = {k: resolved[k] for k in get_method(name).interop.calibration if resolved.get(k) is not None}
    return dataclasses.replace(inputs, calibrated=done)


def _check_folder(folder: Path) -> None:
    """``--out`` is new, empty, or an earlier search's folder (its study.db); anything else is refused."""
    try:
        if not os.path.lexists(folder):
            return
        if not folder.is_dir():
            raise InputError(f"output {folder} exists and is not a folder; choose a folder name")
        if (folder / STUDY_DB).is_file() or not any(folder.iterdir()):
            return
    except OSError as e:
        raise InputError(f"{e.filename or folder}: cannot read ({e.strerror})") from None
    raise InputError(f"output folder {folder} holds files and no {STUDY_DB} of an earlier search; choose a new folder")


def _remove_new(folder: Path, created: bool) -> None:
    if created:
        shutil.rmtree(folder, ignore_errors=True)
    else:
        for name in (STUDY_DB, *(STUDY_DB + end for end in SQLITE_SIDE_FILES)):
            try:
                (folder / name).unlink()
            except OSError:
                pass


def _optuna():
    try:
        import optuna
    except ImportError:
        raise InputError("search needs Optuna: pip install 'ram-desktop[search]'") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def _open_study(folder: Path, identity: dict[str, Any], seed: int, start: tuple[str, dict[str, Any]] | None = None):
    """The study in ``folder/study.db``: created (the starting point, then every other method's defaults,
    enqueued) or loaded, refused when it was made for other inputs; trials a killed run left running are marked
    failed. ``start``: the spec's method and its parameters, tried first (None: RAM+'s defaults first). The sampler is seeded with the seed plus
    the number of trials so far, so a continued study never replays the draws of the run before."""
    optuna = _optuna()
    from optuna.trial import TrialState
    from sqlalchemy.exc import SQLAlchemyError

    db = folder / STUDY_DB
    if db.exists():
        _check_identity(db, identity)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        storage = optuna.storages.RDBStorage(f"sqlite:///{db}")
        _write_ahead(storage)
        study = optuna.create_study(study_name=STUDY_NAME, storage=storage, direction="maximize", load_if_exists=True)
    except OSError as e:
        raise InputError(f"{e.filename or folder}: cannot write the study ({e.strerror})") from None
    except (SQLAlchemyError, optuna.exceptions.OptunaError, ValueError) as e:  # a file that is not a study
        raise InputError(f"{db}: not an Optuna study of ram-merge search ({e.__class__.__name__}: {e})") from None
    if not study.user_attrs.get("search"):
        study.set_user_attr("search", identity)
        first = start[0] if start is not None else defaults.METHOD
        for method in sorted(identity["methods"], key=lambda m: m != first):  # the start (RAM+), then the defaults
            params = {"method": method}
            values = start[1] if start is not None and method == start[0] else get_method(method).resolve({})
            for d in search_space(method):
                params[d.key] = values[d.param]
            study.enqueue_trial(params, skip_if_exists=True)
    lock = _lock(db, folder)
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):  # locked: a stopped run left these
        log.warning("trial %d was left running by a run that stopped; marked failed", t.number)
        storage.set_trial_user_attr(t._trial_id, "lost", "the run stopped while it ran")
        storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
    sampler = optuna.samplers.TPESampler(seed=seed + len(study.trials), constant_liar=True)
    return optuna.load_study(study_name=STUDY_NAME, storage=storage, sampler=sampler), lock


def _write_ahead(storage) -> None:
    """The study's SQLite in write-ahead-log mode, synced at checkpoints: Optuna commits several times per trial
    (each suggested value, each attribute, the result), and a rollback journal synced on every commit cost ~0.3 s
    of a ~1 s trial on the demo (benchmarks/README.md). A killed process loses nothing committed (the log is
    replayed when the study is opened next); a power cut may lose the last commits, never the file. The log is
    folded back into study.db when the search closes the study (``_close``)."""
    from sqlalchemy import event

    @event.listens_for(storage.engine, "connect")
    def _pragmas(connection, _record) -> None:
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=NORMAL")

    storage.engine.dispose()  # the connection Optuna opened to create its tables: reopened with the pragmas


def _close(study) -> None:
    """Close the study's database connections: the last one folds the write-ahead log into study.db and removes
    study.db-wal and study.db-shm (the CLI ends with ``os._exit``, which would leave them)."""
    storage = getattr(study, "_storage", None)
    backend = getattr(storage, "_backend", storage)  # Optuna wraps an RDBStorage in a cache
    engine = getattr(backend, "engine", None)
    if engine is not None:
        engine.dispose()


def _lock(db: Path, folder: Path) -> int:
    """One search per study at a time: an exclusive ``flock`` on study.db (SQLite's own locks are separate
    ``fcntl`` locks), released when the process ends, however it ends. Returns the descriptor to close."""
    fd = os.open(db, os.O_RDONLY)
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise InputError(
                f"{folder} is being searched by another run; wait for it or choose another folder"
            ) from None
    return fd


def _check_identity(db: Path, identity: dict[str, Any]) -> None:
    """Refuse a study.db made for another search, naming what differs. Read through a writable connection where
    the file allows: a read-only one leaves the write-ahead log's side files behind (``_write_ahead``)."""
    import sqlite3

    try:
        try:
            con = sqlite3.connect(f"file:{db}?mode=rw", uri=True)
        except sqlite3.OperationalError:
            con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            row = con.execute(
                "SELECT a.value_json FROM study_user_attributes a JOIN studies s ON a.study_id = s.study_id "
                "WHERE s.study_name = ? AND a.key = 'search'",
                (STUDY_NAME,),
            ).fetchone()
        finally:
            con.close()
    except sqlite3.Error as e:
        raise InputError(f"{db}: not an Optuna study of ram-merge search ({e})") from None
    if row is None:
        return  # created, then stopped before it was described: continue it
    stored = json.loads(row[0])
    differs = [k for k in identity if stored.get(k, IDENTITY_DEFAULTS.get(k)) != identity[k]]
    if differs:
        k = differs[0]
        more = f" (and {', '.join(differs[1:])})" if differs[1:] else ""
        raise InputError(
            f"{db} belongs to another search: its {k} {_shown(stored.get(k, IDENTITY_DEFAULTS.get(k)))}, "
            f"now {_shown(identity[k])}{more}; use a new --out folder or the same inputs"
        )


def _shown(value: Any, most: int = 80) -> str:
    """A stored or given identity value on one short line (a layer map or a chat template can be long)."""
    text = repr(value)
    return text if len(text) <= most else text[: most - 1] + "…"


def _finished(study) -> list:
    from optuna.trial import TrialState

    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))


def _trial_of(frozen) -> Trial:
    a = frozen.user_attrs
    return Trial(
        frozen.number, a["method"], a["params"], float(frozen.value), a["scores"], a["seconds"], a.get("same_as")
    )


def _suggest(
    trial, methods: list[str], kept: dict[str, Any] | None = None, calibration: dict[str, dict[str, Any]] | None = None
) -> tuple[str, dict[str, Any]]:
    """The merge an Optuna trial asks for: a method, then its searched parameters; the rest at the values the
    spec keeps for its own method (``_kept``), a calibrated method's calibration (``_calibration``), else at
    their defaults."""
    method = trial.suggest_categorical("method", methods)
    given: dict[str, Any] = dict(kept["params"]) if kept is not None and kept["method"] == method else {}
    given.update((calibration or {}).get(method, {}))
    for d in search_space(method):
        if d.kind == "choice":
            given[d.param] = trial.suggest_categorical(d.key, list(d.choices))
        elif d.kind == "int":
            given[d.param] = trial.suggest_int(d.key, int(d.low), int(d.high), log=d.log)
        else:
            given[d.param] = trial.suggest_float(d.key, d.low, d.high, log=d.log)
    return method, get_method(method).resolve(given)


def _merge_key(method: str, params: dict[str, Any]) -> str:
    return json.dumps([method, params], sort_keys=True, default=str)


def _run_trials(
    study,
    inputs,
    suites,
    methods,
    options,
    reporter,
    on_trial,
    runner,
    scorer_process: ScorerProcess | None = None,
    kept: dict[str, Any] | None = None,
    calibration: dict[str, dict[str, Any]] | None = None,
) -> list[Trial]:
    """Ask, merge and score, tell: until ``options.trials`` trials have completed."""
    done = [_trial_of(t) for t in _finished(study)]
    for t in done:
        if on_trial is not None:
            on_trial(t)
    seen = {_merge_key(t.method, t.params): t for t in done}
    quiet = Reporter(None, reporter.cancel)  # each trial's own merge and evaluation: no progress bars of their own
    resumed, started = len(done), time.perf_counter()

    def report() -> None:
        best = max((t.validation for t in done), default=float("nan"))
        reporter.progress("search", len(done), options.trials, "trials", f"best {best:.4f}" if done else "")

    def finish(asked, method: str, params: dict, scores: list[float], seconds: float, same_as=None) -> None:
        value = sum(scores) / len(scores)
        for key, v in (("method", method), ("params", params), ("scores", scores), ("seconds", seconds)):
            asked.set_user_attr(key, v)
        if same_as is not None:
            asked.set_user_attr("same_as", same_as)
        study.tell(asked, value)
        trial = Trial(asked.number, method, params, value, scores, seconds, same_as)
        done.append(trial)
        seen.setdefault(_merge_key(method, params), trial)
        if on_trial is not None:
            on_trial(trial)
        _check_distinguishable(done, options.trials)
        report()

    report()
    pending: list = []  # (asked trial, method, params, handle)
    try:
        while len(done) < options.trials:
            room = options.trials - len(done) - len(pending)
            batch = []
            for _ in range(min(options.workers - len(pending), room)):
                asked = study.ask()
                method, params = _suggest(asked, methods, kept, calibration)
                earlier = seen.get(_merge_key(method, params))
                if earlier is not None:
                    finish(asked, method, params, earlier.scores, 0.0, earlier.number)
                else:
                    batch.append((asked, method, params))
            if not batch and not pending:
                continue
            if runner is None:
                t0 = time.perf_counter()
                pending = [(a, m, p, None) for a, m, p in batch]
                rows = score_merges(inputs, [(m, p) for _, m, p in batch], quiet, None, suites, scorer_process)
                seconds = (time.perf_counter() - t0) / len(batch)
                for item, scores in zip(list(pending), rows):
                    finish(item[0], item[1], item[2], scores, seconds)
                    pending.remove(item)
            else:
                pending += [(a, m, p, runner.submit(inputs, m, p)) for a, m, p in batch]
                ready = runner.wait([h for *_, h in pending], reporter)
                for item in [p for p in pending if p[3] in ready]:
                    pending.remove(item)
                    asked, method, params, handle = item
                    scores, seconds = runner.result(handle)
                    finish(asked, method, params, scores, seconds)
    except BaseException:
        from optuna.trial import TrialState

        # cancelled or failed while these ran (or were being asked or told): lost, the finished ones kept
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
        if runner is not None:
            runner.cancel([h for *_, h in pending])
        raise
    done.sort(key=lambda t: t.number)  # Ray tasks finish in any order
    elapsed = time.perf_counter() - started
    log.info(
        "%d trials (%d from earlier runs) in %.1f s; best validation %.4f",
        len(done),
        resumed,
        elapsed,
        max(t.validation for t in done),
    )
    return done


def _check_distinguishable(done: list[Trial], budget: int) -> None:
    """Refuse suites on which every distinct merge scores the same (checked once enough distinct merges ran)."""
    distinct = {_merge_key(t.method, t.params): t.validation for t in done}
    if len(distinct) < 2 or len(distinct) < min(budget, SAME_SCORE_AFTER) and len(done) < budget:
        return
    values = set(distinct.values())
    if len(values) == 1:
        raise InputError(
            f"the suite cannot tell these merges apart: {len(distinct)} different merges all scored "
            f"{values.pop():.4f} on validation; use suites on which the agents differ (more examples, or a "
            "reward with partial credit)"
        )


# ---- the end: the best merge, tested beside the references --------------------------------------------


def _merge_best(
    inputs: Inputs,
    best: Trial,
    tests: list,
    folder: Path,
    reporter: Reporter,
    scorer_process: ScorerProcess | None = None,
) -> dict[str, Any] | None:
    """Merge the best trial into ``folder/best`` (recipe and card as any merge) and, with test suites, score it
    beside RAM+ and Task Arithmetic at their defaults (merged into a temporary folder, removed after)."""
    from . import evaluate

    refs = [(label, m, get_method(m).resolve({})) for m, label in SEARCH_REFERENCES]
    with tempfile.TemporaryDirectory(prefix="ram-search-ref-") as tmp:
        specs = inputs.merge_specs([(BEST, best.method, best.params)], folder)
        if tests:
            specs += inputs.merge_specs([(m, m, p) for _, m, p in refs], tmp)
        merged = merge_variants(specs, reporter, RunOptions(overwrite=True))
        if not tests:
            return None
        result = evaluate(
            [str(m.out) for m in merged],
            tests,
            inputs.spec.device,
            inputs.batch_size,
            inputs.limit,
            reporter,
            scorer_process=scorer_process,
            backend=inputs.backend,
        )
    names = [f"best ({best.method})", *(label for label, _, _ in refs)]
    models = []
    for i, name in enumerate(names):
        pooled = _pooled(result.rewards[i])
        models.append(
            {
                "name": name,
                "method": best.method if i == 0 else refs[i - 1][1],
                "params": best.params if i == 0 else refs[i - 1][2],
                "test": sum(result.scores[i]) / len(result.scores[i]),
                "test_interval": list(mean_interval(pooled)),
                "suites": [
                    {
                        "name": s.name,
                        "score": result.scores[i][k],
                        "interval": list(mean_interval(result.rewards[i][k])),
                    }
                    for k, s in enumerate(result.suites)
                ],
            }
        )
    differences = []
    best_pooled = _pooled(result.rewards[0])
    for i, (label, _, _) in enumerate(refs, start=1):
        ref_pooled = _pooled(result.rewards[i])
        mean, se = paired_difference(best_pooled, ref_pooled)
        differences.append(
            {
                "versus": label,
                "difference": mean,
                "se": se,
                "interval": [mean - 1.96 * se, mean + 1.96 * se],
                "clearly_better": clearly_better(best_pooled, ref_pooled),
                "suites": [
                    dict(
                        zip(
                            ("suite", "difference", "se"),
                            (s.name, *paired_difference(result.rewards[0][k], result.rewards[i][k])),
                        )
                    )
                    for k, s in enumerate(result.suites)
                ],
            }
        )
    return {"suites": [s.name for s in result.suites], "models": models, "differences": differences}


def _pooled(per_suite: list[list[float]]) -> list[float]:
    """Every example's reward, weighted so that their plain mean is the mean of the suite means (suites of
    different sizes count alike, as in the validation score): the values intervals and paired differences use."""
    total = sum(len(r) for r in per_suite)
    return [v * total / (len(per_suite) * len(r)) for r in per_suite for v in r]


def _write_json(path: Path, data: dict) -> None:
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(data, indent=1, default=_plain) + "\n")
    os.replace(tmp, path)


def _plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return str(value)


# ---- Ray ----------------------------------------------------------------------------------------------


def _score_remote(inputs: Inputs, method: str, params: dict[str, Any]) -> tuple[list[float], float]:
    """A Ray task: merge and score one trial where the worker runs (its own reads of the sources)."""
    started = time.perf_counter()
    scores = score_merges(inputs, [(method, params)], None, 1)[0]
    return scores, time.perf_counter() - started


class _RayRunner:
    """Trials as Ray tasks (one CPU each) on a cluster, or on a local Ray started here with ``workers`` CPUs."""

    def __init__(self, address: str, workers: int) -> None:
        try:
            import ray
        except ImportError:
            raise InputError("--ray needs Ray: pip install 'ram-desktop[search]'") from None
        self.ray = ray
        if address == "local":
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False, configure_logging=False)
        else:
            _check_answers(address)
            try:
                ray.init(address=address, log_to_driver=False, configure_logging=False)
            except (ConnectionError, RuntimeError, ValueError) as e:  # gone meanwhile, a version mismatch
                raise InputError(f"Ray cluster at {address} cannot be joined: {str(e).splitlines()[0]}") from None
        self.task = ray.remote(num_cpus=1, max_retries=0)(_score_remote)

    def submit(self, inputs: Inputs, method: str, params: dict[str, Any]):
        return self.task.remote(inputs, method, params)

    def wait(self, handles: list, reporter: Reporter) -> list:
        """The handles that finished (at least one), checking for a cancel every half second."""
        while True:
            ready, _ = self.ray.wait(handles, num_returns=1, timeout=0.5)
            reporter.check()
            if ready:
                return ready

    def result(self, handle) -> tuple[list[float], float]:
        try:
            return self.ray.get(handle)
        except self.ray.exceptions.RayTaskError as e:
            cause = e.as_instanceof_cause()
            if isinstance(cause, InputError):
                raise InputError(str(cause)) from None
            raise

    def cancel(self, handles: list) -> None:
        for h in handles:
            with contextlib.suppress(ValueError, TypeError, self.ray.exceptions.RayError):  # finished already
                self.ray.cancel(h, force=True)

    def close(self) -> None:
        self.ray.shutdown()


def _check_answers(address: str) -> None:
    """A cluster address that does not answer is refused at once (Ray itself would keep retrying)."""
    if address == "auto":
        return
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise InputError(f"--ray {address!r} is not HOST:PORT (or ray://HOST:PORT, auto, local)")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as e:
        raise InputError(
            f"Ray cluster at {address} does not answer ({e.strerror or e}); start it (ray start --head) "
            "or use --ray local"
        ) from None
