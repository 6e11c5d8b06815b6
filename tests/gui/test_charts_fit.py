"""Charts and tables that fit the window (docs/gui.md): labels that never run together, lines that never hide
each other, one distinct readable colour per model, names never cut, every suite column in view — checked
on the real chart items at 1360×860 (the default size) and at 1920×1080, geometrically, not by pixels."""

from __future__ import annotations

import itertools
import json
import math

import pytest
from PySide6.QtCore import QRectF
from PySide6.QtGui import QColor, QPainter, QPicture

from ram_desktop.core.methods.would_keep import would_keep
from ram_desktop.evaluate import EvalResult, ModelRef, SuiteSummary
from ram_desktop.gui.analysis import charts

from .conftest import analyse, load_sources

SIZES = [(1360, 860), (1920, 1080)]


def drawn_ticks(axis) -> list[tuple[QRectF, str]]:
    """The tick labels the axis draws now, with their rectangles (as AxisItem.paint lays them out)."""
    picture = QPicture()
    painter = QPainter(picture)
    try:
        if axis.style["tickFont"]:
            painter.setFont(axis.style["tickFont"])
        _, _, texts = axis.generateDrawSpecs(painter)
    finally:
        painter.end()
    return [(rect, text) for rect, _, text in texts if text]


def assert_apart(rects: list[tuple[QRectF, str]]) -> None:
    for (a, ta), (b, tb) in itertools.combinations(rects, 2):
        assert not a.intersects(b), f"{ta!r} runs into {tb!r}"


# colour maths of our own (sRGB → CIELAB, WCAG contrast), not the implementation's
def _linear(c: float) -> float:
    c /= 255
    return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4


def _lab(color: QColor) -> tuple[float, float, float]:
    r, g, b = (_linear(v) for v in (color.red(), color.green(), color.blue()))
    x = (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047
    y = 0.2126 * r + 0.7152 * g + 0.0722 * b
    z = (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883

    def f(t: float) -> float:
        return t ** (1 / 3) if t > 216 / 24389 else (24389 / 27 * t + 16) / 116

    return 116 * f(y) - 16, 500 * (f(x) - f(y)), 200 * (f(y) - f(z))


def _contrast_on_white(color: QColor) -> float:
    r, g, b = (_linear(v) for v in (color.red(), color.green(), color.blue()))
    return 1.05 / (0.2126 * r + 0.7152 * g + 0.0722 * b + 0.05)


def assert_distinct_and_readable(colors: list[QColor]) -> None:
    for a, b in itertools.combinations(colors, 2):
        assert math.dist(_lab(a), _lab(b)) >= 20, f"{a.name()} and {b.name()} look alike"
    for c in colors:
        assert _contrast_on_white(c) >= 2.5, f"{c.name()} is too light on white"


@pytest.fixture
def analysed(qtbot, window, demo_models):
    base, agents = demo_models
    load_sources(qtbot, window, base, agents)
    analyse(qtbot, window)
    qtbot.waitUntil(window.analysis.charts_ready, timeout=10000)
    return window


@pytest.mark.parametrize("size", SIZES)
def test_category_labels_never_run_together(qtbot, analysed, size):
    window = analysed
    window.resize(*size)
    tabs = window.analysis.tabs
    ulps = window.analysis.ulps
    tabs.setCurrentWidget(ulps)
    qtbot.wait(100)
    ticks = drawn_ticks(ulps.plot.getAxis("bottom"))
    assert len(ticks) >= 3 and ticks[0][1] == "1"  # written: every bin or every k-th, never on top of another
    assert_apart(ticks)
    keep = window.analysis.would_keep
    tabs.setCurrentWidget(keep)
    qtbot.wait(100)
    ticks = drawn_ticks(keep.plot.getAxis("bottom"))
    assert [t for _, t in ticks][:2] == ["RAM", "RAM+"]
    assert_apart(ticks)
    layers = window.analysis.layers
    tabs.setCurrentWidget(layers)
    for grouping in (0, 1):
        layers.grouping.setCurrentIndex(grouping)
        qtbot.wait(100)
        ticks = drawn_ticks(layers.plot.getAxis("bottom"))
        assert len(ticks) >= 2
        assert_apart(ticks)


def test_per_layer_lines_never_hide_each_other(qtbot, analysed):
    layers = analysed.analysis.layers
    analysed.analysis.tabs.setCurrentWidget(layers)
    layers.grouping.setCurrentIndex(1)  # per module kind: the agents' densities are close there
    qtbot.wait(50)
    lines = layers.lines
    names = analysed.report.names
    assert len(lines) == len(names) == 3
    looks = {(line.opts["symbol"], line.opts["pen"].style(), QColor(line.opts["pen"].color()).name()) for line in lines}
    assert len(looks) == 3
    xs = [set(line.getData()[0].tolist()) for line in lines]
    for a, b in itertools.combinations(xs, 2):
        assert not a & b  # no point of one agent sits exactly on another's
    assert [label.text for _, label in layers.legend.items] == names
    assert layers.legend.columnCount == 3  # one row: the legend takes no more height than it needs
    legend_box = layers.legend.sceneBoundingRect()
    assert not legend_box.intersects(layers.plot.getViewBox().sceneBoundingRect())  # beside the data, not on it


def test_would_keep_writes_the_chosen_methods_share_in_the_legend_not_over_bars(qtbot, analysed):
    window = analysed
    keep = window.analysis.would_keep
    window.analysis.tabs.setCurrentWidget(keep)
    qtbot.wait(50)
    report = window.report
    values = would_keep(report, "ram-plus", {"r": 0.1, "alpha": 2.0})
    legend = [label.text for _, label in keep.legend.items]
    assert legend == [f"{name}: RAM+ keeps {100 * v:.0f}%" for name, v in zip(report.names, values)]
    import pyqtgraph as pg

    texts = [item for item in keep.plot.items if isinstance(item, pg.TextItem)]
    bars = [item for item in keep.plot.items if isinstance(item, pg.BarGraphItem)]
    assert bars and not texts  # no number painted over the bars (they ran into each other: "50%50%50%")
    assert not keep.legend.sceneBoundingRect().intersects(keep.plot.getViewBox().sceneBoundingRect())


def test_palette_distinct_readable_colours():
    assert len(charts.PALETTE) >= 12
    assert_distinct_and_readable([QColor(c) for c in charts.PALETTE] + [QColor(charts.BASE_COLOR)])


def _many_models() -> tuple[EvalResult, dict[str, str]]:
    names = [
        "base",
        "coder",
        "tool",
        "memory",
        "ram-plus-merged",
        "average",
        "task-arithmetic_scale=0.3",
        "task-arithmetic_scale=0.5",
        "task-arithmetic_scale=1.0",
        "ties_scale=1.0",
        "ram-plus_r=0.05",
        "ram-plus_r=0.2",
    ]
    kinds = {"base": "base", "coder": "agent", "tool": "agent", "memory": "agent"}
    models = [ModelRef(n, f"/m/{n}") for n in names]
    suites = [
        SuiteSummary(n, f"/s/{n}", 300, "exact")
        for n in ("code-validation", "tool-validation", "memory-validation", "reasoning-test")
    ]
    scores = [[0.1 + 0.05 * i + 0.01 * s for s in range(len(suites))] for i in range(len(models))]
    return EvalResult(models, suites, scores, 1.0, "cpu", {}), {f"/m/{n}": kinds.get(n, "variant") for n in names}


@pytest.mark.parametrize("size", SIZES)
def test_twelve_models_twelve_colours_whole_names_every_column(qtbot, window, size):
    window.resize(*size)
    panel = window.evaluate
    window.steps.setCurrentWidget(panel)
    result, kinds = _many_models()
    panel.show_result(result, kinds)
    panel.scores.views.setCurrentWidget(panel.chart)  # the chart is drawn when it is shown
    qtbot.wait(50)
    bars = panel.chart.bars
    assert len(bars) == 12
    bar_colors = [QColor(bar.opts["brush"].color()) for bar in bars]
    assert_distinct_and_readable(bar_colors)
    assert [label.text for _, label in panel.chart.legend.items] == [m.name for m in result.models]
    table = panel.table
    assert [QColor(table.item(r, 0).foreground().color()).name() for r in range(12)] == [
        c.darker(110).name() for c in bar_colors
    ]  # the table names in the chart's colours
    # every suite column and the mean in view, none cut
    assert table.horizontalScrollBar().maximum() == 0
    header = table.horizontalHeader()
    for c in range(table.columnCount()):
        text = table.horizontalHeaderItem(c).text()
        assert header.sectionSize(c) >= max(header.fontMetrics().horizontalAdvance(line) for line in text.split("\n"))
    assert (
        table.columnViewportPosition(table.columnCount() - 1) + table.columnWidth(table.columnCount() - 1)
        <= table.viewport().width()
    )
    panel.scores.views.setCurrentWidget(panel.chart)
    qtbot.wait(50)
    ticks = drawn_ticks(panel.chart.plot.getAxis("bottom"))
    assert [t.replace("\n", "") for _, t in ticks] == [s.name for s in result.suites]  # whole, on two lines if need be
    assert_apart(ticks)


def test_suites_table_shows_the_whole_scorer(qtbot, window, tmp_path):
    window.resize(1360, 860)
    panel = window.evaluate
    window.steps.setCurrentWidget(panel)
    suite = tmp_path / "arith.jsonl"
    suite.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(3)))
    panel.add_suites([suite])
    qtbot.waitUntil(lambda: len(panel.suites) == 1, timeout=10000)
    assert panel.set_scorer(0, r"regex:answer is (\d+)")
    qtbot.wait(50)
    combo = panel.suite_table.cellWidget(0, 2)
    text_width = combo.fontMetrics().horizontalAdvance(combo.currentText())
    assert combo.lineEdit().width() >= text_width, "the scorer is cut"
    assert panel.suite_table.columnWidth(2) >= combo.sizeHint().width()
    assert panel.suite_table.horizontalScrollBar().maximum() == 0  # in view without scrolling sideways
