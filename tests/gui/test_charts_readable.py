"""Charts that pay their way: readable ticks, legends for module letters and blank cells, plain words, whole
tensor names, Would keep saying what it does for the method in the form, a taller gradient plot."""

from __future__ import annotations

from PySide6.QtGui import QFontInfo

from .conftest import analyse, load_sources


def _px(font) -> int:
    return QFontInfo(font).pixelSize()


def test_heatmap_ticks_are_readable_and_explained(qtbot, window, demo_models):
    base, agents = demo_models
    load_sources(qtbot, window, base, agents)
    window.resize(1366, 768)
    analyse(qtbot, window)
    heatmap = window.analysis.heatmap
    window.analysis.tabs.setCurrentWidget(heatmap)
    qtbot.waitUntil(lambda: heatmap.plot is not None, timeout=5000)
    for side in ("bottom", "left"):
        assert _px(heatmap.plot.getAxis(side).style["tickFont"]) >= 10
    legend = heatmap.legend_text.text()
    assert "q, k, v, o" in legend and "blank" in legend.lower()


def test_ulps_in_plain_words_and_tensor_names_whole(qtbot, window, demo_models):
    base, agents = demo_models
    load_sources(qtbot, window, base, agents)
    analyse(qtbot, window)
    ulps = window.analysis.ulps
    window.analysis.tabs.setCurrentWidget(ulps)
    qtbot.wait(50)
    assert "every 8th row" not in ulps.plot.getAxis("bottom").labelText
    tensors = window.analysis.tensors
    window.analysis.tabs.setCurrentWidget(tensors)
    names = tensors.column_values(0)
    widest = max(tensors.table.fontMetrics().horizontalAdvance(n) for n in names)
    assert tensors.table.columnWidth(0) >= min(widest + 12, 420)


def test_would_keep_says_why_a_per_agent_method_is_not_shown(qtbot, window, demo_models):
    base, agents = demo_models
    load_sources(qtbot, window, base, agents)
    analyse(qtbot, window)
    chart = window.analysis.would_keep
    window.analysis.tabs.setCurrentWidget(chart)
    window.method.set_method("della")
    qtbot.wait(20)
    assert "DELLA" in chart.note and "not" in chart.note


def test_the_gradient_plot_is_tall_enough_to_read(qtbot, window, demo_models):
    base, agents = demo_models
    load_sources(qtbot, window, base, agents[:1])
    window.method.set_method("slerp")
    window.method.fields["t"].set_value([0.0, 0.5, 1.0])
    qtbot.wait(50)  # a widget added to a shown form is shown on the next turn of the event loop
    plot = window.method.fields["t"].widget.plot
    assert plot.isVisibleTo(window) and plot.height() >= 100
