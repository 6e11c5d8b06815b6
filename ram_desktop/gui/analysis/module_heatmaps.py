"""Where the agents update: one layer × module heat map per agent (density or unique share), with a
readout of the cell under the pointer."""

from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QVBoxLayout, QWidget

from ...core import ProbeReport
from ...core.engine.inspection import OTHER_ROW, ModuleGrid, module_grid
from ..widgets.common import WrappedLines
from .charts import HEAT_SCALE, _empty, _html, _label, _plot, agent_color, percent, tick_font

SHORT_COLUMNS = {"embeddings": "e", "qkv": "qkv", "gate": "g", "up": "u", "down": "d", "norms": "n", "lm_head": "h"}
COLUMN_LEGEND = {"e": "embeddings", "g": "gate", "u": "up", "d": "down", "n": "norms", "h": "lm_head"}


MIN_HEIGHT = 120


class ModuleHeatmaps(QWidget):
    """One heat map per agent, side by side in one plot: rows are layers, columns module kinds;
    colour = density or unique share. The plot and the colour bar are built once; a report only
    replaces the images and labels, so showing one costs a few milliseconds."""

    GAP = 1  # empty columns between two agents' maps

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        row = QHBoxLayout()
        row.addWidget(QLabel("Colour"))
        self.metric_choice = QComboBox()
        self.metric_choice.addItems(["density (share of elements updated)", "unique share (of the agent's updates)"])
        self.metric_choice.setToolTip(
            "Density: updated / elements in the cell. Unique share: of the agent's updates in "
            "the cell, how many no other agent touches (RAM keeps them whole)"
        )
        self.metric_choice.currentIndexChanged.connect(lambda _: self.show_report(self.report))
        row.addWidget(self.metric_choice)
        row.addStretch(1)
        layout.addLayout(row)
        self.graphics = pg.GraphicsLayoutWidget()
        self.graphics.setMinimumHeight(MIN_HEIGHT)  # the Analysis page fits a 1366×768 window
        layout.addWidget(self.graphics, 1)
        self.readout = WrappedLines("Hover a cell to read its numbers.")
        self.readout.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        # a fixed height: hover text changes must not re-lay out (and re-render) the charts
        self.readout.setFixedHeight(self.readout.fontMetrics().lineSpacing() * 2 + 6)
        layout.addWidget(self.readout)
        self.legend_text = WrappedLines(
            "Columns: q, k, v, o — the attention's query, key, value and output projections; gate, up, down — "
            "the feed-forward block; norms — the layer norms. Row “other”: what is outside the layers "
            "(embeddings, output head). A blank (white) cell: that layer has no module of that kind.",
            lines=3,
        )
        self.legend_text.setStyleSheet("color: #555;")
        layout.addWidget(self.legend_text)
        self.plot: pg.PlotItem | None = None  # built with the first report (see _lazy in inspect_charts)
        self.report: ProbeReport | None = None
        self.grid: ModuleGrid | None = None
        self.images: list[pg.ImageItem] = []
        self.graphics.scene().sigMouseMoved.connect(self._hover)
        self.show_report(None)

    def _build(self) -> pg.PlotItem:
        self.plot = _plot(self.graphics, row=0, col=0)
        self.plot.getAxis("bottom").setStyle(tickFont=tick_font())
        self.plot.getAxis("left").setStyle(tickFont=tick_font())
        self.cmap = HEAT_SCALE.colormap()  # the registry's (Help's words come from it)
        self.colorbar = pg.ColorBarItem(values=(0, 1), colorMap=self.cmap, interactive=False, width=12)
        self.colorbar.axis.enableAutoSIPrefix(False)
        self.graphics.addItem(self.colorbar, row=0, col=1)
        return self.plot

    def show_report(self, report: ProbeReport | None) -> None:
        self.report = report
        self.images = []
        if report is None or not report.agents or not report.tensor_stats:
            self.grid = None
            if self.plot is not None:
                self.plot.clear()
                self.plot.invertY(False)
                _empty(self.plot, "Run the analysis to see where in the network each agent learned")
            return
        plot = self.plot if self.plot is not None else self._build()
        plot.clear()
        plot.invertY(True)
        grid = self.grid = module_grid(report.tensor_stats, len(report.agents))
        by_density = self.metric_choice.currentIndex() == 0
        values = [
            np.array(
                [
                    [np.nan if v is None else v for v in row]
                    for row in (grid.density(t) if by_density else grid.unique_share(t))
                ],
                dtype=float,
            )
            for t in range(len(report.agents))
        ]
        top = max((float(np.nanmax(v)) for v in values if np.isfinite(v).any()), default=1.0)
        levels = (0.0, top if by_density and top > 0 else 1.0)
        rows, cols = len(grid.rows), len(grid.columns)
        # sixteen pixels a layer row at the least (its label and the agent names fit): a deep model's map makes the
        # page scroll rather than crush its rows
        self.graphics.setMinimumHeight(max(MIN_HEIGHT, 110 + 16 * rows))
        width = cols + self.GAP
        ticks = []
        for t, agent in enumerate(report.agents):
            image = pg.ImageItem(values[t], axisOrder="row-major")
            image.setColorMap(self.cmap)
            image.setLevels(levels)
            image.setRect(t * width, 0, cols, rows)
            plot.addItem(image)
            self.images.append(image)
            name = pg.TextItem(f"<b>{_html(agent.name)}</b>", anchor=(0.5, 1.0))
            name.setHtml(f"<b style='color:{agent_color(agent.name).name()}'>{_html(agent.name)}</b>")
            name.setPos(t * width + cols / 2, 0)
            plot.addItem(name)
            ticks += [(t * width + c + 0.5, SHORT_COLUMNS.get(kind, kind)) for c, kind in enumerate(grid.columns)]
        self.colorbar.setLevels(levels)
        self.colorbar.setImageItem(self.images)
        if self.colorbar.axis.labelText != ("density" if by_density else "unique share"):
            self.colorbar.axis.setLabel("density" if by_density else "unique share")
        _label(
            plot,
            "title",
            "Density per layer and module"
            if by_density
            else "Unique share of each agent's updates per layer and module",
            size="10pt",
        )
        plot.getAxis("bottom").setTicks([ticks])
        step = 1 if rows <= 12 else math.ceil(rows / 10)  # about ten layer labels, never overlapping
        plot.getAxis("left").setTicks(
            [[(r + 0.5, name) for r, name in enumerate(grid.rows) if r % step == 0 or name == OTHER_ROW]]
        )
        _label(plot, "left", "layer")
        shown = [SHORT_COLUMNS.get(kind, kind) for kind in grid.columns]
        legend = ", ".join(f"{k} = {COLUMN_LEGEND[k]}" for k in dict.fromkeys(shown) if k in COLUMN_LEGEND)
        _label(plot, "bottom", f"module ({legend})" if legend else "module")
        plot.setXRange(-0.2, len(report.agents) * width - self.GAP + 0.2, padding=0)
        plot.setYRange(-0.12 * rows - 0.6, rows, padding=0)  # room for the agent names above the maps

    def cell_at(self, scene_pos) -> tuple[int, int, int] | None:
        """(agent, row, column) under a scene position, or None."""
        if self.grid is None or self.plot is None or not self.plot.sceneBoundingRect().contains(scene_pos):
            return None
        point = self.plot.vb.mapSceneToView(scene_pos)
        cols, rows = len(self.grid.columns), len(self.grid.rows)
        x, r = math.floor(point.x()), math.floor(point.y())
        t, c = divmod(x, cols + self.GAP)
        if 0 <= t < len(self.images) and 0 <= c < cols and 0 <= r < rows:
            return t, r, c
        return None

    def cell_center(self, agent: int, row: int, column: int):
        """The scene position of a cell's centre (for tests and screenshots)."""
        assert self.grid is not None and self.plot is not None  # a report is shown
        x = agent * (len(self.grid.columns) + self.GAP) + column + 0.5
        return self.plot.vb.mapViewToScene(pg.Point(x, row + 0.5))

    def describe(self, t: int, r: int, c: int) -> str:
        grid, report = self.grid, self.report
        assert grid is not None and report is not None
        params, updated, unique = grid.params[r][c], grid.updated[t][r][c], grid.unique[t][r][c]
        row = grid.rows[r]
        where = f"layer {row}" if row != OTHER_ROW else "outside the layers"
        tensors = ", ".join(grid.tensors[r][c]) or "no tensor"
        if not params:
            return f"<b>{_html(report.agents[t].name)}</b> · {where} · {grid.columns[c]}: no tensor here"
        return (
            f"<b>{_html(report.agents[t].name)}</b> · {where} · <b>{grid.columns[c]}</b>: density "
            f"{percent(updated / params, 2)} ({updated:,} of {params:,} elements), unique share "
            f"{percent(unique / updated if updated else None)} ({unique:,})<br>"
            f"<span style='color:#666'>{_html(tensors)}</span>"
        )

    def _hover(self, scene_pos) -> None:
        cell = self.cell_at(scene_pos)
        if cell is not None:
            self.readout.setText(self.describe(*cell))
