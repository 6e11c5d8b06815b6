"""What ``ram-merge compare`` writes (``workflow.compare`` runs it): merge several variants from one read of the
inputs, then (with suites) score the base, every agent and every variant, and draw the comparison
(docs/contracts.md, Compare; docs/evaluate.md).

``DIR/<variant>/`` is a complete output folder for each variant; ``DIR/compare.json`` lists the
variants and, when suites were given, carries the ``ram-eval/1`` keys of the evaluation;
``DIR/compare.png`` draws the scores as grouped bars (suites × models).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core import InputError, MergeResult, Variant
from .results import EvalResult

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


def write_json(path: Path, data: dict) -> None:
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def draw_scores(result: EvalResult, path: Path) -> bool:
    """Grouped bars (one group per suite, one bar per model) as a PNG, with matplotlib's headless
    backend; False (and a log line) when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed: %s not drawn (pip install 'ram-desktop[eval]')", path.name)
        return False
    n_models, n_suites = len(result.models), len(result.suites)
    width = 0.8 / max(n_models, 1)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 + n_suites * (0.5 + 0.32 * n_models)), 4.2), dpi=120)
    for m, model in enumerate(result.models):
        xs = [s + (m - (n_models - 1) / 2) * width for s in range(n_suites)]
        ax.bar(xs, [result.scores[m][s] for s in range(n_suites)], width, label=model.name)
    ax.set_xticks(range(n_suites), [s.name for s in result.suites])
    ax.set_ylabel("mean reward")
    ax.set_ylim(0, max(1.0, max((v for row in result.scores for v in row), default=1.0)) * 1.08)
    ax.set_title("Scores per suite: base, agents and merged variants")
    ax.legend(fontsize=8, ncol=2, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True
