"""Scores into a merged model's folder: an "Evaluation" section in its model card (README.md) and
``eval.json`` (``ram-eval/2``) beside it (docs/evaluate.md)."""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from ...errors import InputError
from ...storage.manifest import entry_matches, record_files


class _Model(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def source(self) -> str: ...


class _Floor(Protocol):
    @property
    def answer(self) -> str: ...
    @property
    def score(self) -> float: ...


class _Suite(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def examples(self) -> int: ...
    @property
    def scorer(self) -> str: ...
    @property
    def floor(self) -> _Floor | None: ...


class EvalScores(Protocol):
    """What the section needs of a result (``evaluate.results.EvalResult`` is one): the core keeps
    no import of ``evaluate``."""

    @property
    def models(self) -> Sequence[_Model]: ...
    @property
    def suites(self) -> Sequence[_Suite]: ...
    @property
    def scores(self) -> Sequence[Sequence[float]]: ...
    @property
    def device(self) -> str: ...
    def write_json(self, path: Path) -> object: ...
    def interval(self, m: int, s: int) -> tuple[float, float] | None: ...
    def at_floor(self, m: int, s: int) -> bool: ...
    def describe_leader(self, s: int | None) -> str: ...


EVAL_JSON = "eval.json"
MERGE_REPORT = "merge-report.json"
SECTION = "## Evaluation"
_NEXT_HEADING = re.compile(r"^#{1,2} ", re.MULTILINE)


def merged_folders(result: EvalScores) -> list[tuple[int, Path]]:
    """(model index, folder) of every evaluated model that is a RAM Desktop output (holds a merge report)."""
    out = []
    for index, model in enumerate(result.models):
        folder = Path(model.source).expanduser()
        if (folder / MERGE_REPORT).is_file():
            out.append((index, folder))
    return out


def evaluation_section(result: EvalScores, highlight: int | None = None) -> str:
    """The card's section: a Markdown table (models × suites, each score with its 95 % interval, and their
    mean), ``highlight``'s row in bold, ≈ where a model is no better than the suite's floor (a last row),
    then the best model per suite or the models tied at the top."""
    suites = list(result.suites)
    heads = [f"{s.name} ({s.examples})" for s in suites]
    lines = [
        SECTION,
        "",
        f"Mean reward per suite (greedy decoding, {result.device}, "
        f"{sum(s.examples for s in suites)} examples per model; scorers: "
        + ", ".join(f"{s.name}: `{s.scorer}`" for s in suites)
        + ") with its 95 % interval: mean ± 1.96·SD/√n, clipped to the range of the per-example rewards.",
        "",
        "| model | " + " | ".join(heads) + " | mean |",
        "|---" * (len(heads) + 2) + "|",
    ]
    for m, (model, row) in enumerate(zip(result.models, result.scores)):
        cells = [model.name]
        for s, value in enumerate(row):
            interval = result.interval(m, s)
            cells.append(
                f"{value:.3f}"
                + (f" [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else "")
                + (" ≈" if result.at_floor(m, s) else "")
            )
        cells.append(f"{sum(row) / len(row):.3f}" if row else "—")
        if m == highlight:
            cells = [f"**{c}**" for c in cells]
        lines.append("| " + " | ".join(cells) + " |")
    floors = [s.floor for s in suites]
    if any(f is not None for f in floors):
        cells = [f"{f.score:.3f} (`{json.dumps(f.answer, ensure_ascii=False)}`)" if f else "—" for f in floors]
        lines.append("| floor: best constant answer | " + " | ".join(cells) + " | |")
    lines.append("")
    if any(result.at_floor(m, s) for m in range(len(result.models)) for s in range(len(suites))):
        lines += ["≈: no better than the floor, giving the floor's answer every time (within 2 SE).", ""]
    leaders = [(s.name, result.describe_leader(k)) for k, s in enumerate(suites)]
    if any(text for _, text in leaders):
        lines += [
            (
                "Differences are paired on the same examples; a model is best only when it beats the next by "
                "more than 2 standard errors."
            ),
            "",
        ]
        lines += [f"- {name}: {text}" for name, text in leaders if text]
        lines.append("")
    lines += [f"Full result, with every example's reward: `{EVAL_JSON}` (ram-eval/2).", ""]
    return "\n".join(lines)


def with_section(card: str, section: str) -> str:
    """``card`` with its Evaluation section replaced by ``section`` (appended when it has none)."""
    start = card.find("\n" + SECTION + "\n")
    if card.startswith(SECTION + "\n"):
        start = 0
    elif start >= 0:
        start += 1
    if start < 0:
        return card.rstrip("\n") + "\n\n" + section if card.strip() else section
    following = _NEXT_HEADING.search(card, start + len(SECTION))
    end = following.start() if following else len(card)
    return card[:start] + section + ("\n" + card[end:] if following else "")


def record_evaluation(result: EvalScores) -> list[Path]:
    """Write ``eval.json`` and the card's Evaluation section into every merged model's folder that
    ``result`` scored, and record them in its manifest (``ram-manifest.json``) where they were ours before;
    return those folders."""
    written = []
    for index, folder in merged_folders(result):
        # what the merge wrote and we now rewrite stays ours in its manifest; a file the user changed stays theirs
        ours = [name for name in (EVAL_JSON, "README.md") if entry_matches(folder, name)]
        result.write_json(folder / EVAL_JSON)
        card = folder / "README.md"
        text = card.read_text(encoding="utf-8") if card.is_file() else ""
        _write_text(card, with_section(text, evaluation_section(result, index)))
        record_files(folder, ours)
        written.append(folder)
    return written


def _write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise InputError(f"{path}: cannot write ({e.strerror})") from None
