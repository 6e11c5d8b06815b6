"""Compare fits a 1366×768 laptop (issue 47): the methods list is never drawn under the Output folder row, and
the chart of 13 models keeps its suites' labels on the x axis, the bottom of its bars and every legend entry."""

from __future__ import annotations

from PySide6.QtCore import QPoint, QRect, QRectF
from PySide6.QtWidgets import QLabel, QScrollArea

from ram_desktop.evaluate import EvalResult, ModelRef, SuiteSummary

from .test_charts_fit import drawn_ticks

SIZE = (1366, 768)


def _thirteen_models():
    names = ["base", "coder", "tool", "memory"]
    names += [f"ram-plus_r={r}" for r in (0, 0.05, 0.1, 0.15, 0.2)]
    names += [f"task-arithmetic_scale={s}" for s in (0.3, 0.5, 1.0)]
    names += ["ties_scale=1.0"]
    kinds = {"base": "base", "coder": "agent", "tool": "agent", "memory": "agent"}
    models = [ModelRef(n, f"/m/{n}") for n in names]
    suites = [SuiteSummary(n, f"/s/{n}", 300, "exact") for n in ("code-test", "tool-test", "memory-test")]
    scores = [[0.2 + 0.04 * i + 0.01 * s for s in range(3)] for i in range(len(names))]
    return EvalResult(models, suites, scores, 1.0, "cpu", {}), {f"/m/{n}": kinds.get(n, "variant") for n in names}


def _rect_in(widget, ancestor) -> QRect:
    return QRect(widget.mapTo(ancestor, QPoint(0, 0)), widget.size())


def test_compare_page_rows_never_overlap_at_1366x768(qtbot, window):
    window.resize(*SIZE)
    page = window.compare
    window.steps.setCurrentWidget(page)
    qtbot.wait(100)
    methods = next(a for a in page.findChildren(QScrollArea) if a.widget() is page.rows["ram"].check.parentWidget())
    label = next(w for w in page.findChildren(QLabel) if w.text() == "Output folder")
    assert methods.isVisible() and label.isVisible()
    assert _rect_in(methods, page).bottom() < _rect_in(label, page).top(), (
        _rect_in(methods, page),
        _rect_in(label, page),
    )
    assert methods.height() >= methods.minimumHeight()


def test_compare_chart_keeps_axis_bars_and_every_legend_entry_at_1366x768(qtbot, window):
    window.resize(*SIZE)
    page = window.compare
    window.steps.setCurrentWidget(page)
    result, kinds = _thirteen_models()
    page.scores.show_result(result, kinds, keep=False)
    page.scores.views.setCurrentWidget(page.chart)
    qtbot.wait(100)
    chart = page.chart
    view = QRectF(chart.viewport().rect())
    # every legend entry inside the chart
    entries = [label for _, label in chart.legend.items]
    assert len(entries) == 13
    for label in entries:
        rect = chart.mapFromScene(label.mapRectToScene(label.boundingRect())).boundingRect()
        assert view.contains(QRectF(rect)), (label.text, rect, view)
    # the suites' labels on the x axis drawn, inside the chart
    axis = chart.plot.getAxis("bottom")
    assert [t for _, t in drawn_ticks(axis)] == ["code-test", "tool-test", "memory-test"]
    axis_rect = chart.mapFromScene(axis.sceneBoundingRect()).boundingRect()
    assert view.contains(QRectF(axis_rect)), (axis_rect, view)
    # the bottom of the bars (y = 0) inside the plotted area
    box = chart.plot.getViewBox()
    zero = chart.mapFromScene(box.mapViewToScene(box.mapToView(box.rect().center()) * 0))
    bottom = box.mapViewToScene(QRectF(0, 0, 1, 0).topLeft())
    y_zero = chart.mapFromScene(bottom).y()
    assert 0 <= y_zero <= view.height(), (y_zero, view)
    # and the chart whole in the page's visible area once scrolled to it (the page scrolls where it needs to)
    area = page.parentWidget().parentWidget()
    qtbot.waitUntil(lambda: page.height() >= page.minimumSizeHint().height(), timeout=2000)
    bottom = chart.mapTo(page, QPoint(0, chart.height())).y()
    area.verticalScrollBar().setValue(bottom - area.viewport().height())  # scrolled down to the chart's bottom
    qtbot.wait(20)
    shown = _rect_in(area.viewport(), window)
    assert shown.contains(_rect_in(chart, window)), (shown, _rect_in(chart, window))
    del zero
