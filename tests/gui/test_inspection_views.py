"""The inspection views (SPEC.md section 10) driven through their widgets on the offscreen platform."""

from __future__ import annotations

import json

import pytest
from PySide6.QtCore import QEvent, QPoint, QPointF, Qt
from PySide6.QtGui import QImage, QMouseEvent
from PySide6.QtWidgets import QApplication

from ram_desktop.core.engine.inspection import module_grid
from ram_desktop.core.engine.probe import ProbeReport
from ram_desktop.core.methods.would_keep import would_keep

from .conftest import analyse, load_sources


@pytest.fixture
def analysed(qtbot, window, demo_models):
    base, agents = demo_models
    load_sources(qtbot, window, base, agents)
    analyse(qtbot, window)
    qtbot.waitUntil(window.analysis.charts_ready, timeout=10000)
    return window


def _move_mouse(view, scene_point) -> None:
    """A real mouse-move event on the view's viewport at a scene point (what a pointer does)."""
    pos = QPointF(view.mapFromScene(scene_point))
    event = QMouseEvent(
        QEvent.MouseMove, pos, view.viewport().mapToGlobal(pos), Qt.NoButton, Qt.NoButton, Qt.NoModifier
    )
    QApplication.sendEvent(view.viewport(), event)


def test_heatmap_hover_reads_out_the_cell(qtbot, analysed):
    window = analysed
    heatmap = window.analysis.heatmap
    window.analysis.tabs.setCurrentWidget(heatmap)
    qtbot.wait(50)
    report = window.report
    grid = module_grid(report.tensor_stats, len(report.agents))
    assert heatmap.grid.rows == grid.rows and len(heatmap.images) == 3
    column = grid.columns.index("q")
    for agent, row in ((1, 2), (2, 0)):
        qtbot.wait(30)  # pyqtgraph drops mouse moves that come within 10 ms of the last (mouseRateLimit)
        _move_mouse(heatmap.graphics, heatmap.cell_center(agent, row, column))
        text = heatmap.readout.text()
        updated, params = grid.updated[agent][row][column], grid.params[row][column]
        assert report.names[agent] in text and f"layer {grid.rows[row]}" in text and "<b>q</b>" in text
        assert f"{updated:,} of {params:,} elements" in text
        assert f"model.layers.{row}.self_attn.q_proj.weight" in text
    # the image shows the densities of the grid
    image = heatmap.images[2].image
    assert image[0][column] == pytest.approx(grid.updated[2][0][column] / grid.params[0][column])
    heatmap.metric_choice.setCurrentIndex(1)  # unique share
    assert heatmap.images[2].image[0][column] == pytest.approx(grid.unique[2][0][column] / grid.updated[2][0][column])


def test_tensor_table_sorts_by_clicking_a_header_and_filters(qtbot, analysed):
    window = analysed
    panel = window.analysis.tensors
    window.analysis.tabs.setCurrentWidget(panel)
    table = panel.table
    assert panel.proxy.rowCount() == len(window.report.tensor_stats)
    header = table.horizontalHeader()
    elements = 3
    x = header.sectionViewportPosition(elements) + header.sectionSize(elements) // 2
    qtbot.mouseClick(header.viewport(), Qt.LeftButton, pos=QPoint(x, header.height() // 2))
    first = [int(v.replace(",", "")) for v in panel.column_values(elements)]
    qtbot.mouseClick(header.viewport(), Qt.LeftButton, pos=QPoint(x, header.height() // 2))
    second = [int(v.replace(",", "")) for v in panel.column_values(elements)]
    assert first != second and sorted(first) in (first, first[::-1]) and second == first[::-1]
    # numeric sort of percentages, not text sort
    density = 4
    x = header.sectionViewportPosition(density) + header.sectionSize(density) // 2
    qtbot.mouseClick(header.viewport(), Qt.LeftButton, pos=QPoint(x, header.height() // 2))
    values = [float(v.rstrip(" %")) for v in panel.column_values(density)]
    assert values in (sorted(values), sorted(values, reverse=True))
    qtbot.keyClicks(panel.filter, "layers.2.")
    shown = panel.column_values(0)
    assert shown and all("layers.2." in name for name in shown)
    assert len(shown) == sum("layers.2." in t.name for t in window.report.tensor_stats)
    assert panel.count.text().startswith(f"{len(shown)} of ")


def test_sets_and_signs_show_the_report(analysed):
    window = analysed
    data = window.report.to_json()
    for view in (window.analysis.intersections, window.analysis.pairs, window.analysis.ulps):
        window.analysis.tabs.setCurrentWidget(view)  # views are drawn when their tab is first shown
    chart = window.analysis.intersections
    assert (
        sorted(e["count"] for e in chart.sets) == sorted(e["count"] for e in data["intersections"])[-len(chart.sets) :]
    )
    assert chart.sets[0]["count"] == max(e["count"] for e in data["intersections"])
    assert window.analysis.pairs.pairs == data["pairs"]
    shares = window.analysis.ulps.shares
    assert len(shares) == 3 and all(abs(sum(row) - 1.0) < 1e-9 for row in shares)


def test_would_keep_follows_the_method_form_live(qtbot, analysed):
    window = analysed
    chart = window.analysis.would_keep
    window.analysis.tabs.setCurrentWidget(chart)
    report = window.report
    assert chart.method == "ram-plus"
    before = chart.values["ram-plus"]
    field = window.method.fields["r"].widget
    field.selectAll()
    qtbot.keyClicks(field, "0.2")  # typing, as a user does
    assert not window.jobs.busy()
    assert chart.params["r"] == pytest.approx(0.2)
    assert chart.values["ram-plus"] == pytest.approx(would_keep(report, "ram-plus", {"r": 0.2, "alpha": 2.0}))
    assert chart.values["ram-plus"] != before
    window.method.set_method("task-arithmetic")
    scale = window.method.fields["scale"].widget
    scale.selectAll()
    qtbot.keyClicks(scale, "0.5")
    assert chart.method == "task-arithmetic"
    assert chart.values["task-arithmetic"] == pytest.approx([0.5] * 3)
    assert chart.values["ram"] == pytest.approx(would_keep(report, "ram", {}))
    assert chart.values["average"] == pytest.approx([1 / 3] * 3)


def test_export_writes_every_view_as_png(qtbot, analysed, tmp_path):
    names = analysed.export_charts(tmp_path)
    expected = [
        "density.png",
        "overlap.png",
        "layers.png",
        "heatmap.png",
        "tensors.png",
        "intersections.png",
        "pairs.png",
        "ulps.png",
        "would-keep.png",
        "which-method.png",
    ]
    assert sorted(names) == sorted(expected)  # in tab order (the chart registry)
    for name in expected:
        image = QImage(str(tmp_path / name))
        assert not image.isNull() and image.width() > 200 and image.height() > 100, name
        # not a blank picture: several colours
        colours = {image.pixel(x, y) for x in range(0, image.width(), 7) for y in range(0, image.height(), 7)}
        assert len(colours) > 5, name


def test_a_report_without_the_new_statistics_shows_a_hint(qtbot, analysed):
    window = analysed
    data = window.report.to_json()
    for key in ("intersections", "pairs", "ulp_histogram"):
        data.pop(key)
    old = ProbeReport.from_json(json.loads(json.dumps(data)))
    window.analysis.show_report(old)
    qtbot.waitUntil(window.analysis.charts_ready, timeout=5000)
    for view in (window.analysis.intersections, window.analysis.pairs, window.analysis.ulps, window.analysis.heatmap):
        window.analysis.tabs.setCurrentWidget(view)
    assert window.analysis.intersections.sets == [] and window.analysis.pairs.pairs == []
    assert window.analysis.ulps.shares == []
    assert window.analysis.heatmap.grid is not None  # from the per-tensor counts every report has
    window._method_changed()
    assert window.analysis.would_keep.values["ties"] == [None] * 3
    assert window.analysis.would_keep.values["ram"][0] is not None


def test_a_deep_models_heat_map_keeps_readable_rows_and_scrolls(qtbot, analysed):
    """Eight times the demo's layers at a laptop's size: each layer row keeps sixteen pixels and the step scrolls, rather than the map
    being crushed into the step's height."""
    import dataclasses
    import re

    window = analysed
    window.resize(1366, 698)
    report = window.report
    deep = []
    for stat in report.tensor_stats:
        found = re.search(r"layers\.(\d+)\.", stat.name)
        if found is None:
            deep.append(stat)
            continue
        for k in range(8):  # each demo layer becomes eight
            layer = int(found.group(1)) + 4 * k
            deep.append(dataclasses.replace(stat, name=stat.name.replace(found.group(0), f"layers.{layer}.")))
    window.analysis.tabs.setCurrentWidget(window.analysis.heatmap)
    window.analysis.heatmap.show_report(dataclasses.replace(report, tensor_stats=deep))
    graphics = window.analysis.heatmap.graphics
    layers = {re.search(r"layers\.(\d+)\.", t.name).group(1) for t in deep if "layers." in t.name}
    assert len(layers) >= 24
    qtbot.waitUntil(lambda: graphics.height() >= 16 * (len(layers) + 1), timeout=3000)  # the rows and "other"
    assert window.analysis.height() > window.analysis.parentWidget().height()  # the step scrolls
