"""The Search tab driven through its widgets on the demo: methods ticked, a two-trial budget, Run; each trial
appears in the table and the plot as it finishes, the best one loads into the Method step with "Use this
merge", and the tab is drawn (a screenshot written for a person to look at)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

pytest.importorskip("transformers")
pytest.importorskip("optuna")

from .conftest import load_sources


def test_search_tab_runs_trials_shows_them_live_and_uses_the_best(qtbot, window, demo_models, tmp_path):
    base, agents = demo_models
    demo = Path(base).parent
    load_sources(qtbot, window, base, agents)
    panel = window.search
    window.steps.setCurrentWidget(panel)
    for name, box in panel.checks.items():
        box.setChecked(name in ("task-arithmetic", "ties"))
    panel.trial_count.setValue(2)
    panel.set_validation([demo / "suites" / "validation" / "code"])
    panel.folder.setText(str(tmp_path / "search"))
    window.evaluate.limit.setValue(4)  # the Evaluate step's limit and batch size apply to the trials too
    seen: list[int] = []
    panel.trial_done.connect(lambda t: seen.append(panel.table.rowCount()))
    assert panel.run.start_button.isEnabled()
    with qtbot.waitSignal(panel.search_finished, timeout=300000) as done:
        qtbot.mouseClick(panel.run.start_button, Qt.LeftButton)
    assert done.args == ["done"], window.message.text.text()
    assert panel.table.rowCount() == 2 and len(seen) == 2
    data = json.loads((tmp_path / "search" / "search.json").read_text())
    shown = [[panel.table.item(r, c).text() for c in (0, 3)] for r in range(2)]
    assert shown == [[str(t["number"]), f"{t['validation']:.4f}"] for t in data["trials"]]
    xs, ys = panel.points.getData()
    assert list(xs) == [t["number"] for t in data["trials"]] and list(ys) == [t["validation"] for t in data["trials"]]
    assert list(panel.best_line.getData()[1]) == [ys[0], max(ys)]
    assert (tmp_path / "search" / "best" / "ram-recipe.yaml").is_file()

    best = data["best"]
    window.method.set_method("ram")
    qtbot.mouseClick(panel.use_button, Qt.LeftButton)
    assert window.method.method.currentData() == best["method"]
    spec = window.spec()
    assert spec.method == best["method"]
    for key, value in best["params"].items():
        assert spec.resolved_params()[key] == pytest.approx(value)

    shot = Path(os.environ.get("RAM_DESKTOP_SCREENSHOTS", tmp_path)) / "search-tab.png"
    assert panel.grab().save(str(shot)) and shot.stat().st_size > 0


def test_search_tab_refuses_no_methods_before_anything_runs(qtbot, window, demo_models, tmp_path):
    base, agents = demo_models
    load_sources(qtbot, window, base, agents)
    panel = window.search
    for box in panel.checks.values():
        box.setChecked(False)
    panel.folder.setText(str(tmp_path / "search"))
    panel.set_validation([Path(base).parent / "suites" / "validation" / "code"])
    assert not panel.run.start_button.isEnabled()
    panel.checks["ties"].setChecked(True)
    panel.validation.setText("")
    assert not panel.run.start_button.isEnabled()
    assert not (tmp_path / "search").exists()
