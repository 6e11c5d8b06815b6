"""The sources table at 1366×768: a long agent name never pushes Status out of view, and a source cut to fit
keeps its folder's own name (cut at the left), the full path in its tooltip."""

from __future__ import annotations

import shutil

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QStyleOptionViewItem

from ram_desktop.gui.sources.panel import NAME, SOURCE, STATUS

from .conftest import load_sources

LONG = "a-very-long-agent-name-from-the-training-run-2026-11-28-step-4000"


def _shown(table, row: int, col: int) -> str:
    """The text the cell draws: its text cut as its delegate cuts it, to the column's width less margins."""
    index = table.model().index(row, col)
    option = QStyleOptionViewItem()
    table.itemDelegateForIndex(index).initStyleOption(option, index)
    width = table.columnWidth(col) - 2 * (table.style().pixelMetric(table.style().PixelMetric.PM_FocusFrameHMargin) + 1)
    return option.fontMetrics.elidedText(option.text, option.textElideMode, width)


def test_a_long_name_keeps_status_in_view_and_sources_keep_their_folder_name(qtbot, window, demo_models, tmp_path):
    base, agents = demo_models
    deep = tmp_path / "projects" / "rl-runs" / "2026-11" / "checkpoints"
    moved = [shutil.copytree(a, deep / f"{a.name}-with-memory") for a in agents]
    load_sources(qtbot, window, base, moved)
    window.resize(1366, 768 - 40 - 30)
    table = window.sources.table
    table.item(1, NAME).setText(LONG)  # the user renames an agent
    qtbot.waitUntil(lambda: window.sources.names[0] == LONG, timeout=2000)
    qtbot.wait(100)
    right = table.columnViewportPosition(STATUS) + table.columnWidth(STATUS)
    assert 0 <= table.columnViewportPosition(STATUS) and right <= table.viewport().width(), (
        right,
        table.viewport().width(),
    )
    for row in range(table.rowCount()):
        status = table.item(row, STATUS).text()
        assert _shown(table, row, STATUS) == status, status  # whole
        assert LONG in table.item(1, NAME).toolTip()
    for row, folder in enumerate([base, *moved]):
        shown = _shown(table, row, SOURCE)
        assert shown.endswith(folder.name[-12:]), shown  # the end of the folder's own name stays readable
        assert str(folder) in table.item(row, SOURCE).toolTip()
    assert table.textElideMode() == Qt.TextElideMode.ElideMiddle
