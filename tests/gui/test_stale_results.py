"""A change marks stale exactly what it invalidates, where the user looks (issue 47): after remove, reorder or a
base that does not fit, the analysis, the merge result and the merged model's scores say "Out of date" in a
banner at the top of their area and in the status line, visible in a 1366×768 window, with the one action that
refreshes them; a change of the method leaves the analysis fresh; a new merge, only its own scores."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QPoint, QRect
from PySide6.QtWidgets import QAbstractScrollArea

from ram_desktop.evaluate import EvalResult, ModelRef, SuiteSummary

from .conftest import analyse, load_sources, merge
from .test_change_base import _change_base, _narrower_base

LAPTOP = (1366, 768 - 40 - 30)  # less a taskbar and a title bar


def _scored(window) -> None:
    """The base, the agents and the merged model scored (as an evaluation that just ended)."""
    models = [ModelRef("base", str(window.sources.base.spec))]
    models += [ModelRef(r.name, r.spec) for r in window.sources.agents]
    models.append(ModelRef("merged", str(window.result.out)))
    suites = [SuiteSummary("code", "/s/code", 4, "exact")]
    window.evaluate.show_result(EvalResult(models, suites, [[0.5]] * len(models), 1.0, "cpu", {}))
    window.evaluate.evaluation_finished.emit("done")


def _in_view(widget) -> bool:
    """``widget`` is shown and whole inside the window and every scroll area around it (not below the fold)."""
    if not widget.isVisible() or widget.height() == 0:
        return False
    window = widget.window()
    rect = QRect(widget.mapTo(window, QPoint(0, 0)), widget.size())
    if not window.rect().contains(rect):
        return False
    parent = widget.parentWidget()
    while parent is not None and parent is not window:
        if isinstance(parent, QAbstractScrollArea):
            viewport = parent.viewport()
            shown = QRect(viewport.mapTo(window, QPoint(0, 0)), viewport.size())
            if not shown.contains(rect):
                return False
        parent = parent.parentWidget()
    return True


@pytest.fixture
def merged_and_scored(qtbot, window, demo_models, tmp_path):
    base, agents = demo_models
    window.resize(*LAPTOP)
    load_sources(qtbot, window, base, agents)
    analyse(qtbot, window)
    window.method.out_dir.setText(str(tmp_path / "merged"))
    merge(qtbot, window)
    _scored(window)
    assert not window.analysis.stale.isVisible()
    return window


def _all_stale(qtbot, window) -> None:
    window.steps.setCurrentWidget(window.analysis)
    qtbot.wait(50)
    assert _in_view(window.analysis.stale), window.analysis.stale.geometry()
    from ram_desktop.gui.session import Part

    assert {Part.ANALYSIS, Part.RESULT, Part.SCORES} <= set(window.session.stale_parts())
    assert "Out of date" in window.analysis.stale.text()
    assert window.analysis.stale.button.text() == "Analyze again"
    assert _in_view(window.result_box.stale)
    assert "Analysis out of date" in window.progress.format()  # no "Analysis done · Pick a method and Merge"
    assert _in_view(window.stale_status) and "analysis" in window.stale_status.text()
    window.steps.setCurrentWidget(window.evaluate)
    qtbot.wait(50)
    assert _in_view(window.evaluate.stale) and "Out of date" in window.evaluate.stale.text()


def test_removing_an_agent_marks_the_analysis_the_result_and_the_scores_stale(qtbot, merged_and_scored):
    window = merged_and_scored
    window.sources.table.selectRow(2)
    window.sources.remove_selected()
    _all_stale(qtbot, window)
    window.steps.setCurrentWidget(window.analysis)
    with qtbot.waitSignal(window.analysis_finished, timeout=30000):
        window.analysis.stale.button.click()  # the one action: Analyze again
    assert not window.analysis.stale.isVisible()
    assert window.session.stale(window.session.stale_parts()[0]) if window.session.stale_parts() else True


def test_reordering_agents_marks_them_stale(qtbot, merged_and_scored):
    window = merged_and_scored
    window.sources.table.selectRow(3)
    window.sources.move_selected(-1)
    _all_stale(qtbot, window)


def test_a_base_that_does_not_fit_marks_them_stale(qtbot, merged_and_scored, demo_models, tmp_path, monkeypatch):
    window = merged_and_scored
    other, _ = _narrower_base(demo_models[0], tmp_path / "other-base")
    _change_base(qtbot, window, monkeypatch, other)
    qtbot.waitUntil(lambda: not window.sources.busy and not window.busy(), timeout=20000)
    _all_stale(qtbot, window)


def test_a_method_change_leaves_the_analysis_and_a_new_merge_only_its_scores(qtbot, merged_and_scored, monkeypatch):
    from ram_desktop.gui.session import Part

    window = merged_and_scored
    monkeypatch.setattr(window, "_confirm_replace", lambda out: True)  # "Replace the output folder?" Yes
    window.method.set_method("task-arithmetic")
    assert window.session.stale(Part.ANALYSIS) is None and window.session.stale(Part.SCORES) is None
    assert window.session.stale(Part.RESULT) and _in_view(window.result_box.stale)
    window.method.set_method("ram-plus")
    window.method.out_dir.setText(str(window.result.out))
    merge(qtbot, window)  # into the same folder: the merged model's scores are of the model it replaced
    assert window.session.stale(Part.RESULT) is None and window.session.stale(Part.ANALYSIS) is None
    assert window.session.stale(Part.SCORES)
