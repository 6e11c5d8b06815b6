"""The result of an evaluation: scores (models × suites), the completions behind them, and the
``ram-eval/1`` JSON that ``ram-merge eval --json`` writes."""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core import InputError

FORMAT = "ram-eval/1"


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


@dataclass(frozen=True)
class ScoreFailure:
    """A scorer that failed during the run: the model and suite, and the message (suite, function, examples)."""

    model: str
    suite: str
    error: str


@dataclass
class EvalResult:
    """Scores of every model on every suite; ``scores[m][s]`` is the mean reward of model m on suite s.

    ``completions[m][s]`` and ``rewards[m][s]`` hold the per-example text and reward in suite order.
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

    def to_json(self) -> dict[str, Any]:
        """The ``ram-eval/1`` object (docs/evaluate.md)."""
        data: dict[str, Any] = {
            "format": FORMAT,
            "models": [{"name": m.name, "source": m.source} for m in self.models],
            "suites": [
                {"name": s.name, "source": s.source, "examples": s.examples, "scorer": s.scorer} for s in self.suites
            ],
            "scores": [[None if math.isnan(v) else v for v in row] for row in self.scores],
            "seconds": round(self.seconds, 3),
            "device": self.device,
            "versions": dict(self.versions),
        }
        if self.failures:  # only a run whose scorer failed: its null scores are explained here
            data["failures"] = [{"model": f.model, "suite": f.suite, "error": f.error} for f in self.failures]
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
        """Models × suites as plain text, one row per model (scores with three decimals)."""
        return format_table(
            [m.name for m in self.models], [s.name for s in self.suites], self.scores, [s.examples for s in self.suites]
        )


def format_table(models: list[str], suites: list[str], scores: list[list[float]], examples: list[int]) -> str:
    """The table; a suite not scored (NaN: its scorer failed) shows ``failed``."""
    heads = [f"{name} ({n})" for name, n in zip(suites, examples)]
    first = max([len("model"), *map(len, models)])
    widths = [max(len(h), 6) for h in heads]
    lines = ["  ".join([f"{'model':{first}s}", *(f"{h:>{w}s}" for h, w in zip(heads, widths))])]
    for name, row in zip(models, scores):
        lines.append(
            "  ".join(
                [
                    f"{name:{first}s}",
                    *(f"{v:>{w}.3f}" if not math.isnan(v) else f"{'failed':>{w}s}" for v, w in zip(row, widths)),
                ]
            )
        )
    return "\n".join(lines)


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
