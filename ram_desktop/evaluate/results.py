"""The result of an evaluation: scores (models × suites), the per-example rewards and completions behind
them, their 95 % intervals, paired differences and trivial floors, and the ``ram-eval/2`` JSON that
``ram-merge eval --json`` writes (a superset of ``ram-eval/1``: its readers keep working)."""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core import InputError
from .floors import Floor
from .stats import CLEAR_SE, mean_interval, paired_difference

FORMAT = "ram-eval/2"


@dataclass(frozen=True)
class ModelRef:
    """A model to evaluate: the name shown in tables and the source as given (folder or Hub id)."""

    name: str
    source: str


@dataclass(frozen=True)
class SuiteSummary:
    """What the JSON records of a suite."""

    name: str
    source: str
    examples: int
    scorer: str
    floor: Floor | None = None  # the best constant answer (None in a ram-eval/1 file)


@dataclass(frozen=True)
class Leader:
    """Who leads a column: ``best`` (a row) when it is clearly better than the runner-up, else None and
    ``tied`` holds the leader and every row it is not clearly better than (highest score first)."""

    best: int | None
    tied: tuple[int, ...]


@dataclass(frozen=True)
class ScoreFailure:
    """A scorer that failed during the run: the model and suite, and the message (suite, function, examples)."""

    model: str
    suite: str
    error: str


@dataclass
class EvalResult:
    """Scores of every model on every suite; ``scores[m][s]`` is the mean reward of model m on suite s.

    ``completions[m][s]`` and ``rewards[m][s]`` hold the per-example text and reward in suite order
    (``rewards`` is empty for a ``ram-eval/1`` file: no intervals then).
    ``models[i].source`` is the resolved source (a Hub id carries its commit, ``org/name@sha``).
    A suite whose scorer failed (``failures``; only in ``ScoringFailed.result``) has no score for that model
    and the later ones (NaN; null in the JSON) and no rewards ([]); its completions are those generated
    before the failure ("" for the rest).
    """

    models: list[ModelRef]
    suites: list[SuiteSummary]
    scores: list[list[float]]
    seconds: float
    device: str
    versions: dict[str, str]
    completions: list[list[list[str]]] = field(default_factory=list)
    rewards: list[list[list[float]]] = field(default_factory=list)
    generated_tokens: int = 0
    failures: list[ScoreFailure] = field(default_factory=list)

    @property
    def has_examples(self) -> bool:
        """Whether the per-example rewards are known (intervals, differences and floor marks need them)."""
        return (
            not self.failures
            and len(self.rewards) == len(self.models)
            and all(len(r) == len(self.suites) and all(r) for r in self.rewards)
        )

    def interval(self, m: int, s: int) -> tuple[float, float] | None:
        """Model m's 95 % interval on suite s (``stats.mean_interval``), None without per-example rewards."""
        return mean_interval(self.rewards[m][s]) if self.has_examples else None

    def difference(self, a: int, b: int, s: int | None = None) -> tuple[float, float] | None:
        """Model a minus model b on suite s, paired on the suite's examples: (difference, standard error).
        ``s=None``: on the mean over suites (the mean of the suites' differences; their errors combined as
        independent, √(Σ SE²) / number of suites). None without per-example rewards."""
        if not self.has_examples:
            return None
        if s is not None:
            return paired_difference(self.rewards[a][s], self.rewards[b][s])
        parts = [paired_difference(self.rewards[a][k], self.rewards[b][k]) for k in range(len(self.suites))]
        n = len(parts)
        return math.fsum(d for d, _ in parts) / n, math.sqrt(math.fsum(se * se for _, se in parts)) / n

    def at_floor(self, m: int, s: int) -> bool:
        """Whether model m is no better than the suite's floor (not clearly better on the same examples)."""
        floor = self.suites[s].floor
        return floor is not None and self.has_examples and floor.reached_by(self.rewards[m][s])

    def leader(self, s: int | None, among: Sequence[int] | None = None) -> Leader:
        """The best of the rows ``among`` (default all) on suite s (None: the mean over suites), marked
        only when clearly better than the runner-up on the same examples (``Leader``)."""
        rows = list(range(len(self.models)) if among is None else among)
        if not rows:
            return Leader(None, ())

        def value(m: int) -> float:
            return self.scores[m][s] if s is not None else _mean(self.scores[m])

        rows.sort(key=lambda m: -value(m))
        top = rows[0]
        if len(rows) == 1:
            return Leader(top, (top,))
        tied = [top]
        for m in rows[1:]:
            diff = self.difference(top, m, s)
            if diff is None or not diff[0] > CLEAR_SE * diff[1]:
                tied.append(m)
        return Leader(top if len(tied) == 1 else None, tuple(tied))

    def differences(self) -> list[dict[str, Any]]:
        """Every pair of models on every suite: a − b paired on the suite's examples, its standard error, and
        whether it is clear (|a − b| > 2 SE)."""
        out = []
        for s, suite in enumerate(self.suites):
            for a in range(len(self.models)):
                for b in range(a + 1, len(self.models)):
                    diff, se = paired_difference(self.rewards[a][s], self.rewards[b][s])
                    out.append(
                        {
                            "suite": suite.name,
                            "a": self.models[a].name,
                            "b": self.models[b].name,
                            "difference": diff,
                            "se": se,
                            "clear": abs(diff) > CLEAR_SE * se,
                        }
                    )
        return out

    def to_json(self) -> dict[str, Any]:
        """The ``ram-eval/2`` object (docs/evaluate.md): the ``ram-eval/1`` keys, and with per-example
        rewards ``per_example``, ``intervals``, ``differences``, ``at_floor`` and each suite's ``floor``."""
        suites = []
        for s in self.suites:
            entry: dict[str, Any] = {"name": s.name, "source": s.source, "examples": s.examples, "scorer": s.scorer}
            if s.floor is not None:
                entry["floor"] = s.floor.to_json()
            suites.append(entry)
        data: dict[str, Any] = {
            "format": FORMAT,
            "models": [{"name": m.name, "source": m.source} for m in self.models],
            "suites": suites,
            "scores": [[None if math.isnan(v) else v for v in row] for row in self.scores],
        }
        if self.failures:  # only a run whose scorer failed: its null scores are explained here
            data["failures"] = [{"model": f.model, "suite": f.suite, "error": f.error} for f in self.failures]
        if self.has_examples:
            n_models, n_suites = len(self.models), len(self.suites)
            data["per_example"] = [[list(r) for r in per_model] for per_model in self.rewards]
            data["intervals"] = [
                [list(mean_interval(self.rewards[m][s])) for s in range(n_suites)] for m in range(n_models)
            ]
            data["differences"] = self.differences()
            data["at_floor"] = [[self.at_floor(m, s) for s in range(n_suites)] for m in range(n_models)]
        data.update({"seconds": round(self.seconds, 3), "device": self.device, "versions": dict(self.versions)})
        return data

    def write_json(self, path: Path) -> None:
        """Write ``to_json()`` to ``path`` atomically (a temporary sibling renamed into place)."""
        check_json_path(path)
        path = Path(path)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(json.dumps(self.to_json(), indent=1, ensure_ascii=False) + "\n")
            os.replace(tmp, path)
        except OSError as e:
            Path(tmp).unlink(missing_ok=True)
            raise InputError(f"{path}: cannot write ({e.strerror})") from None

    def table(self) -> str:
        """Models × suites as plain text: each score with its 95 % interval, ``≈`` where the model is no
        better than the suite's floor (a ``floor`` row: the best constant answer), then per suite the best
        model or the models tied at the top."""
        names = [m.name for m in self.models]
        heads = [f"{s.name} ({s.examples})" for s in self.suites]
        rows: list[list[str]] = []
        for m, row in enumerate(self.scores):
            cells = []
            for s, value in enumerate(row):
                interval = self.interval(m, s)
                if math.isnan(value):  # its scorer failed
                    cells.append("failed  ")
                    continue
                cell = f"{value:.3f}" + (f" [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else "")
                cells.append(cell + (" ≈" if self.at_floor(m, s) else "  "))
            rows.append(cells)
        floors = [s.floor for s in self.suites]
        if any(f is not None for f in floors):
            names.append("floor")
            rows.append([f"{f.score:.3f} {_quoted(f.answer)}  " if f is not None else "" for f in floors])
        lines = [format_rows(names, heads, rows)]
        if self.has_examples:
            lines.append(
                "[low, high]: 95 % interval, mean ± 1.96·SD/√n; floor: the best constant answer"
                + (
                    "; ≈: no better than the floor"
                    if any(self.at_floor(m, s) for m in range(len(self.models)) for s in range(len(self.suites)))
                    else ""
                )
            )
            lines.append("best: ahead of the next by more than 2 SE, paired on the same examples; else tied")
            for s, suite in enumerate(self.suites):
                lines.append(f"  {suite.name}: {self.describe_leader(s)}")
        return "\n".join(lines)

    def describe_leader(self, s: int | None, among: Sequence[int] | None = None) -> str:
        """``best: NAME (+d, SE e over RUNNER-UP)`` or ``tied: A, B (A − B = d, SE e)`` for a table's foot."""
        lead = self.leader(s, among)
        if not lead.tied:
            return ""
        top = lead.tied[0]
        if lead.best is not None:
            rows = [m for m in (among if among is not None else range(len(self.models))) if m != top]
            if not rows:
                return f"best: {self.models[top].name}"
            second = max(rows, key=lambda m: self.scores[m][s] if s is not None else _mean(self.scores[m]))
            diff = self.difference(top, second, s)
            assert diff is not None
            return f"best: {self.models[top].name} (+{diff[0]:.3f}, SE {diff[1]:.3f} over {self.models[second].name})"
        second = lead.tied[1]
        diff = self.difference(top, second, s)
        names = ", ".join(self.models[m].name for m in lead.tied)
        if diff is None:
            return f"tied: {names} (no per-example scores to tell them apart)"
        return (
            f"tied: {names} ({self.models[top].name} − {self.models[second].name} = {diff[0]:+.3f}, SE {diff[1]:.3f})"
        )


def format_rows(models: list[str], heads: list[str], rows: list[list[str]]) -> str:
    """A plain text table: a model column, then one right-aligned column per head."""
    first = max([len("model"), *map(len, models)])
    widths = [max([len(h), 6, *(len(r[c]) for r in rows)]) for c, h in enumerate(heads)]
    lines = ["  ".join([f"{'model':{first}s}", *(f"{h:>{w}s}" for h, w in zip(heads, widths))])]
    for name, row in zip(models, rows):
        lines.append("  ".join([f"{name:{first}s}", *(f"{v:>{w}s}" for v, w in zip(row, widths))]).rstrip())
    return "\n".join(lines)


def format_table(models: list[str], suites: list[str], scores: list[list[float]], examples: list[int]) -> str:
    """Scores alone (three decimals), one row per model."""
    heads = [f"{name} ({n})" for name, n in zip(suites, examples)]
    return format_rows(models, heads, [[f"{v:.3f}" if not math.isnan(v) else "failed" for v in row] for row in scores])


def _quoted(answer: str) -> str:
    text = json.dumps(answer, ensure_ascii=False)
    return text if len(text) <= 14 else text[:12] + '…"'


def _mean(row: Sequence[float]) -> float:
    return sum(row) / len(row) if row else 0.0


def check_json_path(path: Path) -> None:
    """Refuse, before any work, a ``--json`` path that cannot be written (missing folder, a folder)."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{path}: is a folder; --json needs a file name")
    if not path.parent.is_dir():
        raise InputError(f"{path}: the folder {path.parent} does not exist")


class ScoringFailed(InputError):
    """A scorer failed during an evaluation (bad input: the user's code); ``result`` holds every score
    finished before and after it, ``result.failures`` what failed. The message is the first failure."""

    def __init__(self, result: EvalResult, note: str = "") -> None:
        first, more = result.failures[0], len(result.failures) - 1
        text = first.error + (f" (and {more} more scorer failure{'s' if more > 1 else ''})" if more else "")
        super().__init__(text + note)
        self.result = result
