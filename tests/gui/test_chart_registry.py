"""One list of charts: a chart added to the registry is a tab of the analysis panel and a PNG of File ▸ Export
charts, with no other edit; the overview saved with every merge is the registry's."""

from __future__ import annotations

import pytest
from PySide6.QtWidgets import QLabel

from .conftest import analyse, load_sources, merge


class Note(QLabel):
    """A chart that shows the number of agents."""

    def show_report(self, report) -> None:
        self.setText("no report" if report is None else f"{len(report.agents)} agents")


@pytest.fixture
def extra_chart(monkeypatch):
    from ram_desktop.gui.analysis import panel

    chart = panel.Chart("note", "note", "Note", "the number of agents", Note)
    monkeypatch.setattr(panel, "CHARTS", (*panel.CHARTS, chart))
    return chart


def test_a_registered_chart_is_a_tab_and_an_exported_png(qtbot, extra_chart, settings, demo_models, tmp_path):
    from ram_desktop.gui.main_window import MainWindow

    window = MainWindow(settings)
    qtbot.addWidget(window)
    window.show()
    try:
        base, agents = demo_models
        load_sources(qtbot, window, base, agents)
        analyse(qtbot, window)
        tabs = window.analysis.tabs
        assert tabs.tabText(tabs.count() - 1) == "Note"
        tabs.setCurrentIndex(tabs.count() - 1)
        assert window.analysis.note.text() == "3 agents"
        (tmp_path / "charts").mkdir()
        names = window.export_charts(tmp_path / "charts")
        assert "note.png" in names and (tmp_path / "charts" / "note.png").stat().st_size > 0
        assert len(names) == tabs.count()
    finally:
        window.jobs.cancel()
        window.jobs.wait(10000)
        window.sources.wait_idle(5000)
        window.log_bridge.uninstall()


def test_a_merge_saves_the_registry_overview(qtbot, window, demo_models, tmp_path):
    from ram_desktop.gui.analysis.panel import CHARTS

    base, agents = demo_models
    load_sources(qtbot, window, base, agents)
    analyse(qtbot, window)
    window.method.out_dir.setText(str(tmp_path / "out"))
    merge(qtbot, window)
    saved = sorted(p.name for p in (tmp_path / "out").glob("*.png"))
    assert (
        saved == sorted(f"{c.name}.png" for c in CHARTS if c.overview) == ["density.png", "layers.png", "overlap.png"]
    )


def test_the_overview_is_rendered_once_while_the_window_is_idle(qtbot, window, demo_models, monkeypatch):
    """After an analysis, each overview chart is grabbed once at idle (its first grab is the slow one), so the
    grabs a merge's save makes as the merge ends are the quick ones; nothing is grabbed while a merge runs."""
    from PySide6.QtWidgets import QWidget

    from ram_desktop.gui.analysis.panel import CHARTS

    grabbed: list[QWidget] = []
    real_grab = QWidget.grab
    monkeypatch.setattr(QWidget, "grab", lambda self, *a: grabbed.append(self) or real_grab(self, *a))
    base, agents = demo_models
    load_sources(qtbot, window, base, agents)
    analyse(qtbot, window)
    saver, panel = window.charts, window.analysis
    overview = [c.picture(getattr(panel, c.attr)) for c in CHARTS if c.overview]
    qtbot.waitUntil(lambda: len(saver.prerendered) == len(overview), timeout=10000)
    assert saver.prerendered == overview and grabbed == overview
    grabbed.clear()
    panel.set_held(True)  # as while a merge runs
    panel.drawn.emit()
    qtbot.wait(100)
    assert grabbed == [] and saver.prerendered == []
