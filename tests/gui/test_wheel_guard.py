"""The mouse wheel changes no setting the user is not editing (issue 47): over every combo box and spin box of
the Method form (several methods, per-agent rows included) and over a suite's scorer in the Evaluate table, a
real wheel event leaves the spec and the suites as they were; the wheel scrolls the page instead."""

from __future__ import annotations

from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QWheelEvent
from PySide6.QtWidgets import QAbstractSlider, QAbstractSpinBox, QApplication, QComboBox, QLineEdit, QScrollBar

from ram_desktop.gui.method.spec_form import read_spec

from .conftest import load_sources


def _wheel(widget, notches: int) -> None:
    """``notches`` wheel notches (negative: towards the user) over the middle of ``widget``, as a mouse sends."""
    centre = QPointF(widget.width() / 2, widget.height() / 2)
    for _ in range(abs(notches)):
        event = QWheelEvent(
            centre,
            QPointF(widget.mapToGlobal(centre.toPoint())),
            QPoint(0, 0),
            QPoint(0, 120 if notches > 0 else -120),
            Qt.MouseButton.NoButton,
            Qt.KeyboardModifier.NoModifier,
            Qt.ScrollPhase.NoScrollPhase,
            False,
        )
        QApplication.sendEvent(widget, event)


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
        before = read_spec(*window.sources.chosen, window.method)
        fields = _fields(window.method)
        assert sum(isinstance(f, (QComboBox, QAbstractSpinBox)) for f in fields) >= 4, name
        for field in fields:
            for notches in (3, -6):
                _wheel(field, notches)
                assert read_spec(*window.sources.chosen, window.method) == before, (name, field.objectName())
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
    window.analyse_button.setFocus()
    _wheel(window.method.out_dtype, -2)
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
        _wheel(combo, notches)
        _wheel(combo.lineEdit(), notches)
    assert table.suites == before and combo.currentText() == "number"
