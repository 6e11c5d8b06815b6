"""Trivial floors: what a model would score by giving the same answer to every prompt of a suite.

The candidates are the empty answer and the suite's ``FLOOR_CANDIDATES`` most frequent reference answers
(the ``answer`` column; a list answer counts as its first item, a non-string as its JSON text; ties in
first-appearance order). Each candidate is scored with the suite's own scorer, exactly like a completion
(a python reward function is called on it too); the floor is the best of them (the first on a tie). A
model whose scores are not clearly better than the floor's on the same examples
(``stats.clearly_better``) is "no better than answering X every time" (docs/evaluate.md, Floors).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .scorers import Scorer
from .stats import clearly_better
from .suites import Suite

FLOOR_CANDIDATES = 5  # most frequent reference answers tried, besides the empty answer


@dataclass(frozen=True)
class Floor:
    """The best constant answer of a suite, its score (mean reward) and its reward on every example."""

    answer: str
    score: float
    rewards: tuple[float, ...]

    def to_json(self) -> dict[str, Any]:
        return {"answer": self.answer, "score": self.score}

    def reached_by(self, rewards: Sequence[float]) -> bool:
        """Whether a model with these per-example ``rewards`` is no better than this constant answer."""
        return not clearly_better(rewards, self.rewards)


def candidate_answers(suite: Suite) -> list[str]:
    """The empty answer, then the ``FLOOR_CANDIDATES`` most frequent reference answers of ``suite``."""
    texts = [_text(a) for a in suite.columns.get("answer", ()) if a is not None and a != []]
    counts = Counter(texts)
    ranked = sorted(counts, key=lambda t: -counts[t])  # sorted is stable: ties keep first appearance
    return ["", *[t for t in ranked if t != ""][:FLOOR_CANDIDATES]]


def floor_of(suite: Suite, scorer: Scorer) -> Floor:
    """The best constant answer among ``candidate_answers(suite)``, scored by ``scorer`` on every example."""
    best: Floor | None = None
    for answer in candidate_answers(suite):
        rewards = tuple(scorer.score(suite, [answer] * len(suite)))
        floor = Floor(answer, math.fsum(rewards) / len(rewards), rewards)
        if best is None or floor.score > best.score:
            best = floor
    assert best is not None
    return best


def _text(answer: Any) -> str:
    item = answer[0] if isinstance(answer, list) else answer
    return item if isinstance(item, str) else json.dumps(item, ensure_ascii=False)
