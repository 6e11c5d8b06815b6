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
- ``make_scorer(spec, base_dir) -> Scorer``: a callable with the TRL reward signature
  ``(prompts, completions, **columns) -> list[float]``; executes a python scorer's file.
  ``Scorer.check(suite)`` refuses a suite it cannot score (missing answers);
  ``Scorer.score(suite, completions)`` validates the rewards (InputError naming suite and function).
- ``model_refs(sources, names=None) -> list[ModelRef]``: names for model folders / Hub ids.
- ``evaluate(models, suites, device="auto", batch_size=8, limit=None, reporter=None, threads=None)
  -> EvalResult``: ``models`` are ``ModelRef``s (or paths / Hub ids, named by ``model_refs``);
  greedy batched generation with ``transformers``, one model in memory at a time; progress as
  ``Reporter.progress("evaluate", done, total, "examples", detail)`` (details "loading NAME",
  "generating with NAME", then per batch "NAME · SUITE · x examples/s · y tokens/s"), cancel
  between batches (``Cancelled``). ``threads``: torch CPU threads (default ``RAM_DESKTOP_THREADS``
  or torch's own).
- ``check_json_path(path)``: refuse an unwritable ``--json`` target before any work.
- ``EvalResult``: ``models``, ``suites`` (``SuiteSummary``), ``scores[model][suite]``,
  ``completions`` and ``rewards`` per model, suite and example, ``seconds``, ``device``,
  ``versions``, ``generated_tokens``; ``to_json()`` (``ram-eval/1``), ``write_json(path)`` (atomic),
  ``table()`` (plain text).

Beside them: ``evaluate.compare`` (``ram-merge compare``), ``evaluate.search`` (``ram-merge search``: an
Optuna study over methods and parameters, ``search(SearchOptions, reporter, on_trial) -> SearchResult``)
and ``evaluate.stats`` (``mean_interval``, ``paired_difference``, ``clearly_better``).

Errors the user can act on are ``ram_desktop.core.errors.InputError``; cancelling raises
``ram_desktop.core.errors.Cancelled``. Nothing here writes files except ``EvalResult.write_json``.
"""

from .results import FORMAT, EvalResult, ModelRef, SuiteSummary, check_json_path, format_table
from .runner import evaluate, model_refs
from .scorers import Scorer, ScorerSpec, first_number, make_scorer, parse_scorer
from .suites import Suite, load_suite

__all__ = [
    "FORMAT",
    "EvalResult",
    "ModelRef",
    "Scorer",
    "ScorerSpec",
    "Suite",
    "SuiteSummary",
    "check_json_path",
    "evaluate",
    "first_number",
    "format_table",
    "load_suite",
    "make_scorer",
    "model_refs",
    "parse_scorer",
]
