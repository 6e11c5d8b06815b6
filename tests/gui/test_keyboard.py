"""The window by keyboard: one Tab stop per table (arrows move inside), a visible focus ring on push buttons,
shortcuts for Analyze, Merge, Evaluate and Cancel, and a name for every control a screen reader announces."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QKeySequence
from PySide6.QtWidgets import QAbstractButton, QApplication

from .conftest import load_sources


def _tab(qtbot, window):
    qtbot.keyClick(QApplication.focusWidget() or window, Qt.Key_Tab)
    return QApplication.focusWidget()


def test_tab_leaves_the_sources_table_in_one_step_and_reaches_merge(qtbot, window, demo_models):
    base, agents = demo_models
    load_sources(qtbot, window, base, agents)
    window.activateWindow()
    table = window.sources.table
    table.setFocus()
    table.setCurrentCell(0, 0)
    after = _tab(qtbot, window)
    assert after is not table and after is not table.viewport()  # not cell by cell
    assert window.analysis.table.tabKeyNavigation() is False
    seen = []
    for _ in range(120):
        seen.append(_tab(qtbot, window))
        if seen[-1] is window.merge_button:
            break
    assert window.merge_button in seen


def test_a_focused_push_button_shows_a_ring(qtbot, window):
    button = window.sources.base_button
    plain = button.grab().toImage()
    button.setFocus(Qt.TabFocusReason)
    qtbot.waitUntil(button.hasFocus, timeout=2000)
    ring = button.grab().toImage()
    y = ring.height() // 2
    assert ring.pixelColor(1, y) != plain.pixelColor(1, y)
    assert QColor(ring.pixelColor(1, y)).blue() > 150


def test_shortcuts_run_analyze_merge_evaluate_and_cancel(qtbot, window, demo_models):
    shortcuts = {a.text().replace("&", ""): a.shortcut() for a in window.menus.run_menu.actions()}
    assert shortcuts["Analyze"] == QKeySequence("F5")
    assert shortcuts["Merge"] == QKeySequence("Ctrl+M")
    assert shortcuts["Evaluate"] == QKeySequence("Ctrl+E")
    assert shortcuts["Cancel"] == QKeySequence("Esc")
    base, agents = demo_models
    load_sources(qtbot, window, base, agents)
    with qtbot.waitSignal(window.analysis_finished, timeout=30000) as done:
        qtbot.keyClick(window, Qt.Key_F5)
    assert done.args == [True]


def test_every_button_has_an_accessible_name(qtbot, window):
    nameless = [
        b
        for b in window.findChildren(QAbstractButton)
        if b.isVisibleTo(window) and not b.accessibleName().strip() and not any(ch.isalpha() for ch in b.text())
    ]
    assert not nameless, [(b.objectName(), b.text()) for b in nameless]
