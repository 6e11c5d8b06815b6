"""``ram-merge compare``: merge several variants from one read of the inputs, then (with suites) score
the base, every agent and every variant, and draw the comparison (docs/contracts.md, Compare; docs/evaluate.md).

``DIR/<variant>/`` is a complete output folder for each variant; ``DIR/compare.json`` lists the
variants and, when suites were given, carries the ``ram-eval/2`` keys of the evaluation;
``DIR/compare.png`` draws the scores as grouped bars (suites × models) with their 95 % intervals, value
labels and each suite's floor (``chart``).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..core import InputError, MergeResult, Reporter, Session, Variant, merge_variants, resolve_device
from ..core.storage.manifest import foreign_entries, write_manifest
from ..core.storage.output import NotReplaceable, is_staging_entry
from .cache import ScoreCache
from .chart import draw_png, score_chart
from .fisher import resolve_fisher_params
from .results import EvalResult, ModelRef, ScoringFailed

log = logging.getLogger("ram_desktop")
COMPARE_JSON = "compare.json"
COMPARE_PNG = "compare.png"


@dataclass
class CompareResult:
    folder: Path
    variants: list[Variant]
    merges: list[MergeResult]
    evaluation: EvalResult | None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "variants": [
                {"name": v.name, "method": m.report["method"], "params": m.report["method_params"]}
                for v, m in zip(self.variants, self.merges)
            ]
        }
        if self.evaluation is not None:
            data.update(self.evaluation.to_json())
        return data


def compare(
    session: Session,
    variants: Sequence[Variant],
    folder: str | Path,
    suites: Sequence[Any] = (),
    overwrite: bool = False,
    reporter: Reporter | None = None,
    device: str | None = None,
    batch_size: int = 8,
    limit: int | None = None,
    token: str | None = None,
    cache: ScoreCache | None = None,
    scorer_timeout: float | None = None,
    **engine_options: Any,
) -> CompareResult:
    """Merge every variant into ``folder/<name>`` from one read of the inputs, then evaluate (when
    ``suites`` are given) and write ``compare.json`` (and ``compare.png``). Suites are loaded and
    checked before anything is merged. ``cache``: scores to reuse (the base's and the agents' from an
    earlier evaluation or compare) and to keep."""
    from . import Suite, evaluate, load_suite
    from .runner import check_eval_options, require_transformers

    reporter = reporter or Reporter()
    check_eval_options(batch_size, limit)  # every option before the first merge
    if not variants:
        raise InputError("no variants to compare; give at least one --variant METHOD[:key=value,...]")
    folder = Path(folder).expanduser()
    loaded = [s if isinstance(s, Suite) else load_suite(s) for s in suites]  # the window passes loaded suites
    for suite in loaded:
        suite.scorer_spec  # noqa: B018 — a bad scorer spec is refused before the merge, without running it
    if loaded:  # what the evaluation needs, before the first merge
        require_transformers()
        resolve_device(device or session.device)
    check_compare_folder(folder, overwrite)
    specs = session.variant_specs(list(variants), folder)
    # the shared parameters reach the variants through their specs; the session's own method need not take them
    request = replace(session, params={}).to_request(folder, overwrite=overwrite, token=token, **engine_options)
    specs = [
        replace(spec, params=resolve_fisher_params(spec.method, spec.params, session.agents, session.device, reporter))
        for spec in specs
    ]
    merges = merge_variants(request, specs, reporter)
    evaluation = None
    if loaded:
        models = [ModelRef("base", session.base)]
        names = merges[0].probe.names
        models += [ModelRef(n, a) for n, a in zip(names, session.agents)]
        models += [ModelRef(v.name, str(m.out)) for v, m in zip(variants, merges)]
        try:
            evaluation = evaluate(
                models,
                loaded,
                device or session.device,
                batch_size,
                limit,
                reporter,
                scorer_timeout=scorer_timeout,
                cache=cache,
            )
        except ScoringFailed as e:  # the merges and the finished scores are kept; the failure is recorded
            _write_result(CompareResult(folder, list(variants), merges, e.result), len(session.agents))
            raise
    result = CompareResult(folder, list(variants), merges, evaluation)
    _write_result(result, len(session.agents))
    return result


def _write_result(result: CompareResult, n_agents: int) -> None:
    """``compare.json``, the chart, and last the folder's manifest (compare.json, the chart and each variant's)."""
    _write_json(result.folder / COMPARE_JSON, result.to_json())
    if result.evaluation is not None:
        kinds = ["base"] + ["agent"] * n_agents + ["variant"] * len(result.merges)
        draw_scores(result.evaluation, result.folder / COMPARE_PNG, kinds)
    write_manifest(result.folder)


def check_compare_folder(folder: Path, overwrite: bool) -> None:
    """docs/contracts.md (Bad input, The output folder) for ``compare --out``: a non-empty folder needs
    ``overwrite``, and is written into only when nothing in it is foreign: its ``ram-manifest.json`` lists
    ``compare.json``, the chart and each variant's manifest; without one (an earlier version, or a compare
    interrupted before its manifest), only a compare's files and variant folders that are ours. Refused
    naming what would be lost."""
    try:
        if not os.path.lexists(folder):
            return
        if not folder.is_dir() or folder.is_symlink():
            raise InputError(f"output {folder} exists and is not a folder; choose a folder name")
        if not any(folder.iterdir()):
            return
        if not overwrite:
            raise InputError(
                f"output folder {folder} exists and is not empty; pass --overwrite or choose another folder"
            )
        lost = foreign_entries(folder, tolerated=is_staging_entry, legacy=_legacy_compare_foreign)
    except OSError as e:
        raise InputError(f"{e.filename or folder}: cannot read ({e.strerror})") from None
    if lost:
        raise NotReplaceable(folder, lost)


def _legacy_compare_foreign(folder: Path) -> list[str]:
    """Without a manifest, what in a compare folder is not ours: anything but a ``compare.json`` that
    parses as one, the chart, and variant folders that are ours (``foreign_entries``)."""
    lost = []
    for item in sorted(folder.iterdir()):
        if is_staging_entry(item):
            continue
        if item.is_dir() and not item.is_symlink():
            lost += [f"{item.name}/{f}" for f in foreign_entries(item)]
        elif item.name == COMPARE_JSON and not item.is_symlink():
            try:
                ours = isinstance(json.loads(item.read_text()).get("variants"), list)
            except (OSError, ValueError, AttributeError, RecursionError):
                ours = False
            if not ours:
                lost.append(item.name)
        elif not (item.name == COMPARE_PNG and item.is_file() and not item.is_symlink()):
            lost.append(item.name)
    return lost


def _write_json(path: Path, data: dict) -> None:
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def draw_scores(result: EvalResult, path: Path, kinds: Sequence[str] | None = None) -> bool:
    """``compare.png``: the scores chart (``chart.score_chart``: bars, 95 % error bars, value labels, floors)
    drawn by matplotlib; False (and a log line) when matplotlib is not installed."""
    return draw_png(score_chart(result, kinds, "Scores per suite: base, agents and merged variants"), path)
