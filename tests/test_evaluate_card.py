"""Scores into a merged model's folder: the card's Evaluation section and eval.json."""

from __future__ import annotations

import json

import numpy as np

from ram_desktop.core.ecosystem.cards.evaluation import record_evaluation, with_section
from ram_desktop.evaluate import EvalResult, ModelRef, SuiteSummary
from ram_desktop.evaluate.floors import Floor

REWARDS = [[[1.0, 0.0, 0.0, 0.0], [1.0, 0.0]], [[1.0, 1.0, 1.0, 0.0], [1.0, 1.0]]]


def result(merged, plain) -> EvalResult:
    floors = [Floor("", 0.0, (0.0,) * 4), Floor("yes", 0.5, (1.0, 0.0))]
    return EvalResult(
        [ModelRef("base", str(plain)), ModelRef("merged", str(merged))],
        [
            SuiteSummary("code", "/s/code", 4, "exact", floors[0]),
            SuiteSummary("tool", "/s/tool", 2, "contains", floors[1]),
        ],
        [[0.25, 0.5], [0.75, 1.0]],
        2.0,
        "cpu",
        {"torch": "x"},
        rewards=REWARDS,
    )


def interval(values) -> str:
    """mean ± 1.96 · sample SD / √n, clipped to the values' range, written as the card writes it."""
    v = np.array(values)
    half = 1.96 * v.std(ddof=1) / np.sqrt(len(v))
    return f"[{max(v.mean() - half, v.min()):.3f}, {min(v.mean() + half, v.max()):.3f}]"


def test_only_merged_folders_get_the_section_and_eval_json(tmp_path):
    merged, plain = tmp_path / "merged", tmp_path / "plain"
    for folder in (merged, plain):
        folder.mkdir()
    (merged / "merge-report.json").write_text("{}")
    (merged / "README.md").write_text("# Merged with RAM Desktop\n\n## Agents\n\na, b\n\n## Reproduce\n\nrun it\n")
    assert record_evaluation(result(merged, plain)) == [merged]
    assert not (plain / "eval.json").exists() and not (plain / "README.md").exists()
    data = json.loads((merged / "eval.json").read_text())
    assert data["format"] == "ram-eval/2" and data["scores"] == [[0.25, 0.5], [0.75, 1.0]]
    assert data["per_example"] == REWARDS
    assert [s["floor"] for s in data["suites"]] == [{"answer": "", "score": 0.0}, {"answer": "yes", "score": 0.5}]
    card = (merged / "README.md").read_text()
    assert card.startswith(
        "# Merged with RAM Desktop\n\n## Agents\n\na, b\n\n## Reproduce\n\nrun it\n\n## Evaluation\n"
    )
    assert "| model | code (4) | tool (2) | mean |" in card
    # ≈ where a model is not ahead of the floor by more than 2 SE: base on code (+0.25, SE 0.25) and on tool
    # (the floor's own rewards), merged on tool (+0.5, SE 0.5); merged on code is (+0.75, SE 0.25)
    assert f"| base | 0.250 {interval(REWARDS[0][0])} ≈ | 0.500 {interval(REWARDS[0][1])} ≈ | 0.375 |" in card
    assert (
        f"| **merged** | **0.750 {interval(REWARDS[1][0])}** | **1.000 {interval(REWARDS[1][1])} ≈** | **0.875** |"
        in card
    )
    assert '| floor: best constant answer | 0.000 (`""`) | 0.500 (`"yes"`) | |' in card
    assert "code: `exact`, tool: `contains`" in card
    assert "- code: tied: merged, base (merged − base = +0.500, SE 0.289)" in card  # SD(0,1,1,0) / 2
    assert "≈: no better than the floor" in card


def test_a_second_evaluation_replaces_the_section(tmp_path):
    merged, plain = tmp_path / "merged", tmp_path / "plain"
    merged.mkdir()
    (merged / "merge-report.json").write_text("{}")
    (merged / "README.md").write_text("# Card\n\n## Agents\n\nx\n")
    first = result(merged, plain)
    record_evaluation(first)
    first.scores = [[0.0, 0.0], [0.5, 0.5]]
    first.rewards = [[[0.0] * 4, [0.0] * 2], [[1.0, 0.0, 1.0, 0.0], [1.0, 0.0]]]
    record_evaluation(first)
    card = (merged / "README.md").read_text()
    assert card.count("## Evaluation") == 1 and "0.750" not in card and "| **merged** | **0.500 [" in card
    assert card.startswith("# Card\n\n## Agents\n\nx\n\n## Evaluation\n")


def test_with_section_keeps_the_headings_after_it():
    card = "# T\n\n## Evaluation\n\nold\n\n## Reproduce\n\nr\n"
    assert with_section(card, "## Evaluation\n\nnew\n") == "# T\n\n## Evaluation\n\nnew\n\n## Reproduce\n\nr\n"
    assert with_section("", "## Evaluation\n\nnew\n") == "## Evaluation\n\nnew\n"
