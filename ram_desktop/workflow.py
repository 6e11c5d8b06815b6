"""The application layer: what a user does with a merge, above ``core`` (the engine) and ``evaluate`` (scoring),
called by both faces (``cli``, ``gui``) so neither assembles a step of its own.

analyse → calibrate (Fisher) → merge → evaluate → compare → search, each on a ``MergeSpec``, and the Fisher
estimate of one agent (``fisher``); how a step runs (overwrite, chunk size, cache, Hub token, the fused kernels'
threshold) is a ``RunOptions``, never state the faces set inside the engine.

This module is the faces' only door to the steps: the command line and the window import it and the core's
public API (``ram_desktop.core``), never ``core.pipeline`` or evaluate's ``runner``, ``search``, ``compare``
or ``fisher`` (``tests/test_architecture.py``). What the faces read of those steps (their result and option
types, the search space) is named here too, each loaded from its module on first use (``__getattr__``), so
importing this module stays as cheap as importing the core.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .core import (
    InputError,
    MergeResult,
    MergeSpec,
    ProbeReport,
    Reporter,
    RunOptions,
    Variant,
    get_method,
    lazy_exports,
)

if TYPE_CHECKING:
    from .core import check_eps as check_eps
    from .evaluate import model_refs as model_refs
    from .evaluate.cache import ScoreCache
    from .evaluate.compare import (
        COMPARE_JSON as COMPARE_JSON,
        COMPARE_PNG as COMPARE_PNG,
        CompareResult as CompareResult,
    )
    from .evaluate.lm_eval_tasks import LmEvalTask
    from .evaluate.results import EvalResult, ModelRef
    from .evaluate.search import (
        Dimension as Dimension,
        SearchOptions as SearchOptions,
        SearchResult as SearchResult,
        Trial as Trial,
        check_methods as check_methods,
        search_space as search_space,
        spec_calibration as spec_calibration,
    )
    from .evaluate.suites import Suite
    from .evaluate.vllm_backend import check_backend as check_backend

# The steps' types, file names and input checks the faces read: every name the TYPE_CHECKING block above
# imports as itself, imported from its module at its first use (``core.lazy_exports``).
__getattr__, __dir__, _STEP_NAMES = lazy_exports(__name__)
__all__ = ["analyse", "calibrate", "check_ready", "compare", "evaluate", "fisher", "merge", "search"]
__all__.extend(_STEP_NAMES)


def calibrate(spec: MergeSpec, reporter: Reporter | None = None) -> MergeSpec:
    """For a calibrated method (Fisher merging) with calibration suites: the spec with each agent's Fisher
    folder set (estimated, or taken from the cache); local Fisher folders made absolute so the written recipe
    runs from anywhere. Any other spec unchanged. The one place the Fisher step is written."""
    if not get_method(spec.method).interop.calibrated:
        return spec
    from .evaluate.fisher import resolve_fisher_params

    params = resolve_fisher_params(spec.method, spec.engine_params(), spec.sources, spec.device, reporter)
    return spec.with_method(spec.method, params)


def analyse(spec: MergeSpec, options: RunOptions | None = None, reporter: Reporter | None = None) -> ProbeReport:
    """The probe (task-vector density and overlap) of the spec's sources."""
    from .core import probe

    return probe(spec, options, reporter)


def merge(spec: MergeSpec, options: RunOptions | None = None, reporter: Reporter | None = None) -> MergeResult:
    """Calibrate when the method needs it, then merge into ``spec.output``."""
    from .core import merge as merge_spec

    check_ready(spec)
    return merge_spec(calibrate(spec, reporter), reporter, options)


def check_ready(spec: MergeSpec) -> None:
    """Every value checked before any estimate or file is touched: base, agents, output, the parameters."""
    spec.check_base()
    spec.check_agents()
    spec.check_output()
    spec.resolved_params()


def evaluate(
    models: Sequence[ModelRef | str | Path],
    suites: Sequence[Suite | LmEvalTask],
    device: str = "auto",
    batch_size: int = 8,
    limit: int | None = None,
    reporter: Reporter | None = None,
    scorer_timeout: float | None = None,
    cache: ScoreCache | None = None,
    backend: str = "transformers",
) -> EvalResult:
    """Score ``models`` on ``suites`` (greedy generation with ``backend``; lm-eval tasks through lm-eval)."""
    from .evaluate import evaluate as run_evaluation

    return run_evaluation(
        list(models),
        list(suites),
        device,
        batch_size,
        limit,
        reporter,
        scorer_timeout=scorer_timeout,
        cache=cache,
        backend=backend,
    )


def compare(
    spec: MergeSpec,
    variants: Sequence[Variant],
    folder: str | Path,
    suites: Sequence[Any] = (),
    options: RunOptions | None = None,
    reporter: Reporter | None = None,
    device: str | None = None,
    batch_size: int = 8,
    limit: int | None = None,
    cache: ScoreCache | None = None,
    scorer_timeout: float | None = None,
    backend: str = "transformers",
) -> CompareResult:
    """Merge every variant of ``spec`` into ``folder/<name>`` from one read of the inputs (each calibrated
    first when its method needs it), then evaluate the base, the agents and the variants on ``suites`` (when
    given) and write ``compare.json`` (and ``compare.png``), the folder's manifest last. Every option, the
    suites and what the evaluation needs are checked before anything is merged. ``cache``: scores to reuse
    (the base's and the agents' from an earlier evaluation or compare) and to keep."""
    from .core import merge_variants, resolve_device, variant_specs
    from .evaluate import LmEvalTask, Suite, load_suite
    from .evaluate.compare import CompareResult, check_compare_folder, write_result
    from .evaluate.results import ModelRef, ScoringFailed
    from .evaluate.suites import check_eval_options  # torch-free: a compare without suites never imports torch
    from .evaluate.vllm_backend import check_backend

    reporter = reporter or Reporter()
    options = options or RunOptions()
    check_eval_options(batch_size, limit, scorer_timeout)  # every option before the first merge
    if not variants:
        raise InputError("no variants to compare; give at least one --variant METHOD[:key=value,...]")
    folder = Path(folder).expanduser()
    loaded = [s if isinstance(s, (Suite, LmEvalTask)) else load_suite(s) for s in suites]  # the window: loaded
    for suite in loaded:
        if isinstance(suite, Suite):
            suite.scorer_spec  # noqa: B018 — a bad scorer spec is refused before the merge, without running it
    if loaded:  # what the evaluation needs, before the first merge
        from .evaluate.runner import require_transformers

        require_transformers()
        check_backend(backend, device or spec.device)
        resolve_device(device or spec.device)
    check_compare_folder(folder, options.overwrite)
    specs = variant_specs(spec, list(variants), folder)
    spec.check_base()
    specs = [calibrate(s, reporter) for s in specs]
    merges = merge_variants(specs, reporter, options)
    evaluation = None
    if loaded:
        models = [ModelRef("base", spec.base)]
        models += [ModelRef(a.name, a.source) for a in spec.agents]
        models += [ModelRef(v.name, str(m.out)) for v, m in zip(variants, merges)]
        try:
            evaluation = evaluate(
                models,
                loaded,
                device or spec.device,
                batch_size,
                limit,
                reporter,
                scorer_timeout=scorer_timeout,
                cache=cache,
                backend=backend,
            )
        except ScoringFailed as e:  # the merges and the finished scores are kept; the failure is recorded
            write_result(CompareResult(folder, list(variants), merges, e.result), len(spec.agents))
            raise
    result = CompareResult(folder, list(variants), merges, evaluation)
    write_result(result, len(spec.agents))
    return result


def search(
    options: SearchOptions, reporter: Reporter | None = None, on_trial: Callable[[Trial], None] | None = None
) -> SearchResult:
    """Run (or continue) the study ``options`` describe (its ``spec``: the whole merge every trial is a delta of)
    until ``options.trials`` trials have completed, merge the best into ``folder/best``, score it on the test
    suites beside the references and write ``search.json``. A calibrated method searched (Fisher, with
    ``options.calibration`` or the spec's suites) is calibrated first, once for all the trials, by ``calibrate``
    (each agent's Fisher estimated or taken from the cache). ``on_trial`` sees every finished trial. Raises
    ``InputError`` for bad input before anything is written, ``Cancelled`` (finished trials kept) on a cancel."""
    from .evaluate.search import search as run_search

    return run_search(options, reporter, on_trial, calibrate)


def fisher(
    agent: str | Path,
    suite: Suite | str | Path,
    out: str | Path,
    examples: int,
    device: str,
    reporter: Reporter | None,
    overwrite: bool,
    shard_size: str | int,
) -> dict[str, Any]:
    """``ram-merge fisher``: estimate ``agent``'s diagonal Fisher information on ``examples`` examples of its
    calibration ``suite`` and write it into ``out`` (staged: nothing written on error or cancel, an existing
    ``out`` replaced only with ``overwrite``; weight files sharded above ``shard_size``); returns what
    ``fisher.json`` says."""
    from .evaluate.fisher import write_fisher

    return write_fisher(agent, suite, out, examples, device, reporter, overwrite, shard_size)
