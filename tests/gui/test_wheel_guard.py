"""The mouse wheel changes no setting the user is not editing (issue 47): over every combo box and spin box of
the Method form (several methods, per-agent rows included) and over a suite's scorer in the Evaluate table, a
real wheel event leaves the spec and the suites as they were; the wheel scrolls the page instead."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QPoint, QPointF, Qt
from PySide6.QtGui import QWheelEvent
from PySide6.QtWidgets import (
    QAbstractSlider,
    QAbstractSpinBox,
    QApplication,
    QComboBox,
    QDialog,
    QLineEdit,
    QScrollArea,
    QScrollBar,
    QVBoxLayout,
    QWidget,
)

from ram_desktop.gui.widgets import common

from .conftest import load_sources


def _wheel(widget, notches: int, at: QPoint | None = None) -> None:
    """``notches`` wheel notches (negative: towards the user) over ``widget`` (its middle, or ``at``), as a
    mouse sends them: to the window under the pointer, which hands them to the widget there. The pointer stays
    where it is while the page scrolls under it."""
    top = widget.window()
    centre = QPointF(widget.mapTo(top, at or QPoint(widget.width() // 2, widget.height() // 2)))
    under = top.childAt(centre.toPoint())
    assert under is widget or widget.isAncestorOf(under), (widget, under)  # the pointer is over the field
    for _ in range(abs(notches)):
        event = QWheelEvent(
            centre,
            QPointF(top.mapToGlobal(centre.toPoint())),
            QPoint(0, 0),
            QPoint(0, 120 if notches > 0 else -120),
            Qt.MouseButton.NoButton,
            Qt.KeyboardModifier.NoModifier,
            Qt.ScrollPhase.NoScrollPhase,
            False,
        )
        QApplication.sendEvent(top.windowHandle(), event)


def _scroll_area_around(widget):
    w = widget.parentWidget()
    while w is not None and not isinstance(w, QScrollArea):
        w = w.parentWidget()
    return w


def _fields(root):
    kinds = (QComboBox, QAbstractSpinBox, QAbstractSlider, QLineEdit)
    return [
        w
        for kind in kinds
        for w in root.findChildren(kind)
        if w.isVisible()
        and w.isEnabled()
        and not isinstance(w, QScrollBar)
        and not isinstance(w.parentWidget(), (QComboBox, QAbstractSpinBox))  # their own line edits
    ]


def test_the_wheel_changes_no_method_setting_without_focus(qtbot, window, demo_models):
    base, agents = demo_models
    load_sources(qtbot, window, base, agents)
    window.resize(1366, 700)
    for name in ("ties", "dare-ta", "della", "weighted-ties", "wudi", "fisher"):
        window.method.set_method(name)
        qtbot.wait(20)
        window.analyse_button.setFocus()  # the keyboard is elsewhere; the pointer passes over the form
        before = window.spec()
        fields = _fields(window.method)
        assert sum(isinstance(f, (QComboBox, QAbstractSpinBox)) for f in fields) >= 4, name
        for field in fields:
            for notches in (3, -6):
                _scroll_area_around(field).ensureWidgetVisible(field)  # the wheel scrolled the page
                _wheel(field, notches)
                assert window.spec() == before, (name, field.objectName())
        assert window.method.current.name == name


def test_the_wheel_scrolls_the_form_instead(qtbot, window, demo_models):
    base, agents = demo_models
    load_sources(qtbot, window, base, agents)
    window.resize(1366, 600)
    window.method.set_method("della")
    qtbot.wait(50)
    area = window.method.parentWidget().parentWidget().parentWidget()  # group box → viewport → scroll area
    bar = area.verticalScrollBar()
    assert bar.maximum() > 0
    bar.setValue(0)
    view = area.viewport()
    field = next(  # the first setting in sight at the top of the page
        f
        for f in _fields(window.method)
        if isinstance(f, (QComboBox, QAbstractSpinBox)) and f.mapTo(view, QPoint(0, f.height())).y() < view.height()
    )
    window.analyse_button.setFocus()
    _wheel(field, -2)
    assert bar.value() > 0


def test_a_focused_field_still_takes_the_wheel(qtbot, window):
    combo = window.method.out_dtype
    combo.setFocus()
    qtbot.waitUntil(combo.hasFocus)
    index = combo.currentIndex()
    _wheel(combo, -1)
    assert combo.currentIndex() != index


def test_the_wheel_changes_no_suite_scorer(qtbot, window, tmp_path):
    from ram_desktop.evaluate import load_suite

    data = tmp_path / "arith.jsonl"
    data.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2=", "answer": "4"}\n')
    table = window.evaluate.suite_table
    table.add(load_suite(data).with_scorer("number"))
    window.steps.setCurrentWidget(window.evaluate)
    qtbot.wait(20)
    before = list(table.suites)
    combo = table.cellWidget(0, 2)
    assert combo.isVisible()
    window.analyse_button.setFocus()
    for notches in (2, -4, 1):
        _wheel(combo, notches)  # over its text
        _wheel(combo, notches, at=QPoint(combo.width() - 6, combo.height() // 2))  # over its arrow
    assert table.suites == before and combo.currentText() == "number"


def test_a_dialog_opened_later_is_guarded(qtbot, window):
    dialog = QDialog(window)
    area = QScrollArea(dialog)
    page = QWidget()
    layout = QVBoxLayout(page)
    combos = [QComboBox() for _ in range(12)]
    for combo in combos:
        combo.addItems(["one", "two", "three"])
        layout.addWidget(combo)
    area.setWidget(page)
    area.resize(200, 120)
    dialog.resize(220, 140)
    qtbot.addWidget(dialog)
    dialog.show()
    qtbot.waitUntil(dialog.isActiveWindow)  # shown, as a user sees it before the wheel
    area.setFocus()
    _wheel(combos[0], -2)
    assert [c.currentIndex() for c in combos] == [0] * 12
    assert area.verticalScrollBar().value() > 0


def test_the_guard_runs_for_no_ordinary_event(qtbot, window, demo_models, monkeypatch):
    """Only the windows are filtered: repainting the whole window calls the guard for no widget's events (an
    application-wide filter ran Python some 1,600 times for one chart's first paint)."""
    seen: list[int] = []
    guard = common._wheel_guard
    assert guard is not None
    original = guard.eventFilter

    def counting(watched, event):
        seen.append(int(event.type().value))
        return original(watched, event)

    monkeypatch.setattr(guard, "eventFilter", counting)
    base, agents = demo_models
    load_sources(qtbot, window, base, agents)
    window.method.set_method("della")
    seen.clear()
    for _ in range(3):
        window.repaint()
        window.method.set_method("ties")
        window.method.set_method("della")
    window.grab()
    assert len(seen) < 30, len(seen)
    window.analyse_button.setFocus()
    _wheel(window.method.out_dtype, -1)
    assert int(QEvent.Type.Wheel.value) in seen  # it is installed, and sees the wheel
