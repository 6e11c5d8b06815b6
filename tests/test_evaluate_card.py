"""Scores into a merged model's folder: the card's Evaluation section and eval.json."""

from __future__ import annotations

import json

from ram_desktop.core.ecosystem.cards.evaluation import record_evaluation, with_section
from ram_desktop.evaluate import EvalResult, ModelRef, SuiteSummary


def result(merged, plain) -> EvalResult:
    return EvalResult([ModelRef("base", str(plain)), ModelRef("merged", str(merged))],
                      [SuiteSummary("code", "/s/code", 4, "exact"), SuiteSummary("tool", "/s/tool", 2, "contains")],
                      [[0.25, 0.5], [0.75, 1.0]], 2.0, "cpu", {"torch": "x"})


def test_only_merged_folders_get_the_section_and_eval_json(tmp_path):
    merged, plain = tmp_path / "merged", tmp_path / "plain"
    for folder in (merged, plain):
        folder.mkdir()
    (merged / "merge-report.json").write_text("{}")
    (merged / "README.md").write_text("# Merged with RAM Desktop\n\n## Agents\n\na, b\n\n## Reproduce\n\nrun it\n")
    assert record_evaluation(result(merged, plain)) == [merged]
    assert not (plain / "eval.json").exists() and not (plain / "README.md").exists()
    data = json.loads((merged / "eval.json").read_text())
    assert data["format"] == "ram-eval/1" and data["scores"] == [[0.25, 0.5], [0.75, 1.0]]
    card = (merged / "README.md").read_text()
    assert card.startswith("# Merged with RAM Desktop\n\n## Agents\n\na, b\n\n## Reproduce\n\nrun it\n\n## Evaluation\n")
    assert "| model | code (4) | tool (2) | mean |" in card
    assert "| base | 0.250 | 0.500 | 0.375 |" in card
    assert "| **merged** | **0.750** | **1.000** | **0.875** |" in card
    assert "code: `exact`, tool: `contains`" in card


def test_a_second_evaluation_replaces_the_section(tmp_path):
    merged, plain = tmp_path / "merged", tmp_path / "plain"
    merged.mkdir()
    (merged / "merge-report.json").write_text("{}")
    (merged / "README.md").write_text("# Card\n\n## Agents\n\nx\n")
    first = result(merged, plain)
    record_evaluation(first)
    first.scores = [[0.0, 0.0], [0.5, 0.5]]
    record_evaluation(first)
    card = (merged / "README.md").read_text()
    assert card.count("## Evaluation") == 1 and "0.750" not in card and "| **merged** | **0.500**" in card
    assert card.startswith("# Card\n\n## Agents\n\nx\n\n## Evaluation\n")


def test_with_section_keeps_the_headings_after_it():
    card = "# T\n\n## Evaluation\n\nold\n\n## Reproduce\n\nr\n"
    assert with_section(card, "## Evaluation\n\nnew\n") == "# T\n\n## Evaluation\n\nnew\n\n## Reproduce\n\nr\n"
    assert with_section("", "## Evaluation\n\nnew\n") == "## Evaluation\n\nnew\n"
