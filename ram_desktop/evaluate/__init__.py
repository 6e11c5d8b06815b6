"""Evaluate: does the merged model keep every agent's skill? (docs/evaluate.md; no Qt.)

Public API (the CLI's ``ram-merge eval`` and the window's Evaluate step are thin faces over it):

- ``load_suite(path) -> Suite``: a JSONL file (optionally beside a ``suite.yaml``) or a folder with
  ``data.jsonl`` + ``suite.yaml``. Runs no code. ``Suite`` fields: ``name``, ``source``,
  ``data_file``, ``prompts``, ``columns`` (every extra field, one tuple per column), ``lines`` (line
  of each example), ``scorer`` (spec text), ``max_new_tokens``, ``chat_template``
  (``"auto"|"true"|"false"``), ``system``, ``config_file``; ``suite.head(n)``,
  ``suite.with_scorer(spec)``, ``suite.scorer_spec`` (parsed, not run).
- ``parse_scorer(spec, base_dir) -> ScorerSpec``: checks a spec without running anything;
  ``ScorerSpec.file`` / ``.function`` / ``.describe()`` say which file a python scorer will run.
- ``make_scorer(spec, base_dir, process=None, timeout=60) -> Scorer``: a callable with the TRL reward
  signature ``(prompts, completions, **columns) -> list[float]``; executes a python scorer's file in
  a child process (``scorer_process.ScorerProcess``; ``timeout`` seconds per call).
  ``Scorer.check(suite)`` refuses a suite it cannot score (missing answers);
  ``Scorer.score(suite, completions, indices=None)`` validates the rewards (InputError naming suite,
  function and examples; also for a scorer past its time limit or one that ends or crashes its process);
  ``Scorer.submit`` starts the same and returns what collects it.
- ``scorer_folders(suites)``: the folders whose Python code an evaluation runs (the faces' first-run
  notice, ``ram_desktop.core.new_code_folders``); ``check_timeout(value, what)``.
- ``model_refs(sources, names=None) -> list[ModelRef]``: names for model folders / Hub ids.
- ``evaluate(models, suites, device="auto", batch_size=8, limit=None, reporter=None, threads=None,
  cache=None, scorer_timeout=None, scorer_process=None, backend="transformers") -> EvalResult``
  (``backend="vllm"``: generation through vLLM on a CUDA GPU, ``vllm_backend``; ``scorer_process``: a caller's
  child for python scorers, kept across calls): raises ``ScoringFailed`` (an InputError whose ``.result`` keeps
  the finished scores) when a scorer fails mid-run; ``models`` are ``ModelRef``s (or paths / Hub ids, named by ``model_refs``);
  greedy batched generation with ``transformers``, one model in memory at a time; progress as
  ``Reporter.progress("evaluate", done, total, "examples", detail)`` (details "loading NAME",
  "generating with NAME", then per batch "NAME · SUITE · y tokens/s"; the rate in examples/s is the faces'), cancel
  between batches (``Cancelled``). ``threads``: torch CPU threads (default ``RAM_DESKTOP_THREADS``,
  else one for a model under 50 M parameters on the CPU, else torch's own).
- ``check_json_path(path)``: refuse an unwritable ``--json`` target before any work.
- ``EvalResult``: ``models``, ``suites`` (``SuiteSummary``, with the suite's ``floor``),
  ``scores[model][suite]``, ``completions`` and ``rewards`` per model, suite and example, ``seconds``,
  ``device``, ``versions``, ``generated_tokens``; ``interval(m, s)`` (95 %), ``difference(a, b, s)``
  (paired, with its SE), ``at_floor(m, s)``, ``leader(s, among)`` (best or tied);
  ``to_json()`` (``ram-eval/2``), ``write_json(path)`` (atomic), ``table()`` (plain text).
- ``stats``: ``mean_interval``, ``paired_difference``, ``clearly_better``; ``floors``: ``floor_of``;
  ``cache``: ``ScoreCache`` (``evaluate(..., cache=)``); ``chart``: ``score_chart``, ``draw_png`` (the
  one description of the scores chart).

Beside them: ``evaluate.compare`` (``ram-merge compare``), ``evaluate.search`` (``ram-merge search``: an
Optuna study over methods and parameters, ``search(SearchOptions, reporter, on_trial) -> SearchResult``)
and ``evaluate.stats`` (``mean_interval``, ``paired_difference``, ``clearly_better``).

Errors the user can act on are ``ram_desktop.core.errors.InputError``; cancelling raises
``ram_desktop.core.errors.Cancelled``. Nothing here writes files except ``EvalResult.write_json``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core import lazy_exports

# Every name the TYPE_CHECKING block below imports as itself is loaded on first use (``core.lazy_exports``), so
# that a scorer's child process (scorer_process) imports neither torch nor transformers through this package.
__getattr__, __dir__, __all__ = lazy_exports(__name__)


if TYPE_CHECKING:
    from .lm_eval_tasks import LmEvalTask as LmEvalTask
    from .results import (
        FORMAT as FORMAT,
        EvalResult as EvalResult,
        ModelRef as ModelRef,
        ScoringFailed as ScoringFailed,
        SuiteSummary as SuiteSummary,
        check_json_path as check_json_path,
        format_table as format_table,
    )
    from .runner import InMemoryModel as InMemoryModel, evaluate as evaluate, model_refs as model_refs
    from .scorers import (
        Scorer as Scorer,
        ScorerSpec as ScorerSpec,
        first_number as first_number,
        make_scorer as make_scorer,
        parse_scorer as parse_scorer,
    )
    from .suites import (
        Suite as Suite,
        check_timeout as check_timeout,
        load_suite as load_suite,
        load_suites as load_suites,
        scorer_folders as scorer_folders,
    )
