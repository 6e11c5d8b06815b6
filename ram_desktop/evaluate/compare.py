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

from ..core import InputError, MergeResult, Reporter, Session, Variant, merge_variants
from .cache import ScoreCache
from .chart import draw_png, score_chart
from .fisher import resolve_fisher_params
from .results import EvalResult, ModelRef

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
    **engine_options: Any,
) -> CompareResult:
    """Merge every variant into ``folder/<name>`` from one read of the inputs, then evaluate (when
    ``suites`` are given) and write ``compare.json`` (and ``compare.png``). Suites are loaded and
    checked before anything is merged. ``cache``: scores to reuse (the base's and the agents' from an
    earlier evaluation or compare) and to keep."""
    from . import Suite, evaluate, load_suite

    reporter = reporter or Reporter()
    if not variants:
        raise InputError("no variants to compare; give at least one --variant METHOD[:key=value,...]")
    folder = Path(folder).expanduser()
    loaded = [s if isinstance(s, Suite) else load_suite(s) for s in suites]  # the window passes loaded suites
    for suite in loaded:
        suite.scorer_spec  # noqa: B018 — a bad scorer spec is refused before the merge, without running it
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
        evaluation = evaluate(models, loaded, device or session.device, batch_size, limit, reporter, cache=cache)
    result = CompareResult(folder, list(variants), merges, evaluation)
    _write_json(folder / COMPARE_JSON, result.to_json())
    if evaluation is not None:
        kinds = ["base"] + ["agent"] * len(session.agents) + ["variant"] * len(merges)
        draw_scores(evaluation, folder / COMPARE_PNG, kinds)
    return result


def check_compare_folder(folder: Path, overwrite: bool) -> None:
    """docs/contracts.md (Bad input, The output folder) for ``compare --out``: a non-empty folder needs ``overwrite``, and is written into only
    when it holds an earlier compare (its compare.json, or only its variants' merge outputs and chart, as an
    interrupted compare leaves them); any other folder's files are never touched."""
    try:
        if not os.path.lexists(folder):
            return
        if not folder.is_dir():
            raise InputError(f"output {folder} exists and is not a folder; choose a folder name")
        items = list(folder.iterdir())
    except OSError as e:
        raise InputError(f"{e.filename or folder}: cannot read ({e.strerror})") from None
    if not items:
        return
    if not overwrite:
        raise InputError(f"output folder {folder} exists and is not empty; pass --overwrite or choose another folder")
    if (folder / COMPARE_JSON).is_file():
        return

    def ours(item: Path) -> bool:
        if item.name == COMPARE_PNG or item.name.startswith("."):  # the chart; lock files, staging of variants
            return True
        return item.is_dir() and all((item / n).is_file() for n in ("merge-report.json", "ram-recipe.yaml"))

    if not all(ours(item) for item in items):
        raise InputError(
            f"output folder {folder} holds files that RAM Desktop did not write (no {COMPARE_JSON}); "
            "--overwrite replaces only an earlier RAM Desktop output — choose a new folder"
        )


def _write_json(path: Path, data: dict) -> None:
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def draw_scores(result: EvalResult, path: Path, kinds: Sequence[str] | None = None) -> bool:
    """``compare.png``: the scores chart (``chart.score_chart``: bars, 95 % error bars, value labels, floors)
    drawn by matplotlib; False (and a log line) when matplotlib is not installed."""
    return draw_png(score_chart(result, kinds, "Scores per suite: base, agents and merged variants"), path)
