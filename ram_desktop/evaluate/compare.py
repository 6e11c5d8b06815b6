"""What ``ram-merge compare`` writes (``workflow.compare`` merges the variants from one read of the inputs and
scores the base, every agent and every variant): its result, its folder's check, and its chart (docs/contracts.md,
Compare; docs/evaluate.md).

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core import InputError, MergeResult, Variant
from ..core.storage.manifest import foreign_entries, write_manifest
from ..core.storage.output import NotReplaceable, is_staging_entry
from .chart import draw_png, score_chart
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


def write_result(result: CompareResult, n_agents: int) -> None:
    """``compare.json``, the chart, and last the folder's manifest (compare.json, the chart and each variant's)."""
    write_json(result.folder / COMPARE_JSON, result.to_json())
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
        lost = foreign_entries(folder, tolerated=is_staging_entry, legacy=_legacy_compare_foreign)
    except OSError as e:
        raise InputError(f"{e.filename or folder}: cannot read ({e.strerror})") from None
    if lost:  # first: --overwrite is offered only where it would work
        raise NotReplaceable(folder, lost)
    if not overwrite:
        raise InputError(
            f"output folder {folder} holds an earlier comparison; pass --overwrite to replace it or choose another "
            "folder"
        )


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


def write_json(path: Path, data: dict) -> None:
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def draw_scores(result: EvalResult, path: Path, kinds: Sequence[str] | None = None) -> bool:
    """``compare.png``: the scores chart (``chart.score_chart``: bars, 95 % error bars, value labels, floors)
    drawn by matplotlib; False (and a log line) when matplotlib is not installed."""
    return draw_png(score_chart(result, kinds, "Scores per suite: base, agents and merged variants"), path)
