"""A bad value typed into the method form is said on the line under the method's description, and the fields
do not move while it appears and goes (the line's room is kept): at 1366×768 the field being typed into stays
under the cursor."""

from __future__ import annotations

from PySide6.QtCore import QPoint
from PySide6.QtWidgets import QLineEdit, QWidget

from .conftest import load_sources


def _y(widget, panel) -> int:
    return widget.mapTo(panel, QPoint(0, 0)).y()


def test_the_fields_stay_put_while_an_error_comes_and_goes(qtbot, window, demo_models):
    base, agents = demo_models
    load_sources(qtbot, window, base, agents)
    window.resize(1366, 768 - 40 - 30)
    panel = window.method
    panel.set_method("della")
    qtbot.wait(50)
    edit = panel.findChild(QLineEdit, "param_weight_1")  # tool's weight
    rows = panel.findChild(QWidget, "param_weight")  # the per-agent rows (the outlined edit's own frame may differ)
    watched = [rows, panel.findChild(QLineEdit, "param_weight_2"), panel.eps, panel.out_dir]
    before = [_y(w, panel) for w in watched]
    edit.setFocus()
    edit.selectAll()
    qtbot.keyClicks(edit, "abc")
    qtbot.wait(50)
    assert panel.problem.isVisible() and "weight of tool" in panel.problem.text()
    assert [_y(w, panel) for w in watched] == before, panel.problem.text()
    edit.selectAll()
    qtbot.keyClicks(edit, "0.5")
    qtbot.wait(50)
    assert not panel.problem.isVisible(), panel.problem.text()
    assert [_y(w, panel) for w in watched] == before


def test_a_tall_form_keeps_no_gap_under_the_description(qtbot, window, demo_models):
    """The kept room is two lines, not the form's spare height: in a tall window the first parameter follows
    the method's description by at most those two lines (the spare height goes below the last field)."""
    base, agents = demo_models
    load_sources(qtbot, window, base, agents)
    window.resize(1360, 1000)
    panel = window.method
    panel.set_method("ram-plus")
    qtbot.wait(50)
    first = panel.findChild(QWidget, "param_r")
    assert first is not None and first.isVisible()
    gap = _y(first, panel) - (_y(panel.summary, panel) + panel.summary.height())
    line = panel.problem.fontMetrics().lineSpacing()
    assert gap <= 2 * line + 3 * panel.form.verticalSpacing() + 4, (gap, line)
    below = panel.height() - (_y(panel.out_dir, panel) + panel.out_dir.height())
    assert below > gap  # where the spare height went
