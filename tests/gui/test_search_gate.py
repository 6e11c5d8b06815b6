"""Search like Merge (issue 47): Run search is offered exactly when Merge is (one condition), so it never starts
with an agent that does not fit the base; trials are numbered as in the table, search.json and the chart alike;
when the search is over the summary no longer says "Best so far"."""

from __future__ import annotations

from pathlib import Path

from ram_desktop.evaluate.search import SearchResult, Trial

from .conftest import load_sources
from .test_change_base import _change_base, _narrower_base


def _ready_to_search(window, demo: Path, tmp_path) -> None:
    window.search.set_validation([demo / "suites" / "validation" / "code"])
    window.search.folder.setText(str(tmp_path / "search"))


def test_search_is_offered_only_when_merge_is(qtbot, window, demo_models, tmp_path, monkeypatch):
    base, agents = demo_models
    load_sources(qtbot, window, base, agents[:2])
    _ready_to_search(window, Path(base).parent, tmp_path)
    start = window.search.run.start_button
    assert window.merge_button.isEnabled() and start.isEnabled()

    other, _ = _narrower_base(base, tmp_path / "other-base")
    _change_base(qtbot, window, monkeypatch, other)
    qtbot.waitUntil(lambda: not window.sources.busy and not window.busy(), timeout=20000)
    assert not window.merge_button.isEnabled()
    assert not start.isEnabled()
    assert start.toolTip() == window.merge_button.toolTip() and "does not fit the base" in start.toolTip()
    # a click that gets through all the same (a shortcut, a script) starts nothing and says why
    window.search.run_requested.emit()
    assert not window.busy() and "does not fit the base" in window.message.text.text()

    _change_base(qtbot, window, monkeypatch, base)
    qtbot.waitUntil(lambda: window.merge_button.isEnabled(), timeout=30000)
    assert start.isEnabled() and start.toolTip() != window.merge_button.toolTip()


def _trial(number: int, validation: float) -> Trial:
    return Trial(number, "task-arithmetic", {"scale": 0.5 + number / 10}, validation, [validation], 1.0)


def test_trials_are_numbered_alike_and_best_so_far_ends_with_the_search(qtbot, window, tmp_path):
    panel = window.search
    trials = [_trial(0, 0.2), _trial(1, 0.5), _trial(2, 0.4)]
    for t in trials:
        panel.add_trial(t)
    table = [panel.table.item(r, 0).text() for r in range(panel.table.rowCount())]
    xs, _ = panel.points.getData()
    numbers = [t.to_json()["number"] for t in trials]  # what search.json says
    assert table == [str(n) for n in numbers]
    assert list(xs) == numbers
    assert "Best so far: trial 1," in panel.best_label.text()

    panel._succeeded(SearchResult(tmp_path, trials, trials[1]))
    assert "so far" not in panel.best_label.text()
    assert "trial 1," in panel.best_label.text()


def test_a_trials_parameters_read_by_their_titles():
    """The table and the best line name a parameter as the method form does ("trim scope"), not by its key."""
    from ram_desktop.gui.evaluate.search_panel import params_text

    assert params_text("ties", {"density": 0.11444, "ties_scope": "model"}) == "density=0.1144, trim scope=model"
    assert params_text("ram", {}) == "—"
