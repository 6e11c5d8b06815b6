"""Inspection views of a probe report (SPEC.md section 10): where (layer × module heat maps, a
per-tensor table), which (UpSet-style intersections), agreement (pairs and signs), how much (ulp
histogram) and what each method would keep. Every agent keeps its colour from ``charts.agent_color``.
"""

from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QAbstractTableModel, QModelIndex, QSortFilterProxyModel, Qt
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QHeaderView, QLabel, QLineEdit, QTableView, QVBoxLayout, QWidget

from ..core.inspection import OTHER_ROW, layer_of, module_grid, module_kind, ulp_bin_labels
from ..core import defaults
from ..core.would_keep import estimated, keep_methods, would_keep
from ..core.methods import get_method
from ..core.probe import ProbeReport
from .charts import FOREGROUND, _html, _plot, agent_color, shade, small_font

SHORT_COLUMNS = {"embeddings": "e", "qkv": "qkv", "gate": "g", "up": "u", "down": "d", "norms": "n", "lm_head": "h"}
COLUMN_LEGEND = {"e": "embeddings", "g": "gate", "u": "up", "d": "down", "n": "norms", "h": "lm_head"}
# _lazy: the inspection charts build their pyqtgraph plots with the first report, not with the window:
# every Qt call that returns nothing costs PySide6 6.12.0 a reference to None (see _label).
MAX_SETS = 24  # intersections drawn in the UpSet chart (the largest); the rest are summarised


def _compact(count: float) -> str:
    for suffix, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(count) >= size:
            return f"{count / size:.1f}{suffix}"
    return f"{count:.0f}"


def _percent(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{100 * value:.{digits}f} %"


def _label(plot: pg.PlotItem, where: str, text: str, **style) -> None:
    """``setTitle`` / ``setLabel`` only when the text changes: each call costs several Qt calls, and
    PySide6 6.12.0 drops a reference to Python's None on every one that returns nothing (it crashes
    Python 3.11 once None's count runs out), so charts redrawn while the user types must not repeat them."""
    cache = plot.__dict__.setdefault("_ram_labels", {})
    key = (text, tuple(sorted(style.items())))
    if cache.get(where) == key:
        return
    cache[where] = key
    if where == "title":
        plot.setTitle(text, **style)
    else:
        plot.setLabel(where, text, **style)


def _empty(plot: pg.PlotItem, text: str) -> None:
    plot.clear()
    plot.getAxis("bottom").setTicks([[]])
    plot.getAxis("left").setTicks(None)
    label = pg.TextItem(text, color=FOREGROUND, anchor=(0.5, 0.5))
    label.setPos(0.5, 0.5)
    plot.addItem(label)
    plot.setXRange(0, 1, padding=0)
    plot.setYRange(0, 1, padding=0)


# --- where: layer × module heat maps ----------------------------------------------------------------

def _cleared_plot_with_legend(chart) -> pg.PlotItem:
    """The chart's plot and legend (made on first use, as ``chart.plot`` / ``chart.legend``), emptied."""
    if chart.plot is None:
        chart.plot = _plot(chart)
        chart.legend = chart.plot.addLegend(offset=(-10, 5), labelTextColor=FOREGROUND)
    chart.plot.clear()
    chart.legend.clear()
    return chart.plot


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
        self.metric_choice.setToolTip("Density: updated / elements in the cell. Unique share: of the agent's updates in "
                                      "the cell, how many no other agent touches (RAM keeps them whole)")
        self.metric_choice.currentIndexChanged.connect(lambda _: self.show_report(self.report))
        row.addWidget(self.metric_choice)
        row.addStretch(1)
        layout.addLayout(row)
        self.graphics = pg.GraphicsLayoutWidget()
        self.graphics.setMinimumHeight(200)
        layout.addWidget(self.graphics, 1)
        self.readout = QLabel("Hover a cell to read its numbers.")
        self.readout.setTextInteractionFlags(Qt.TextSelectableByMouse)
        # a fixed height: hover text changes must not re-lay out (and re-render) the charts
        self.readout.setFixedHeight(self.readout.fontMetrics().lineSpacing() * 2 + 6)
        self.readout.setWordWrap(True)
        layout.addWidget(self.readout)
        self.plot: pg.PlotItem | None = None  # built with the first report (see _lazy)
        self.report: ProbeReport | None = None
        self.grid = None
        self.images: list[pg.ImageItem] = []
        self.graphics.scene().sigMouseMoved.connect(self._hover)
        self.show_report(None)

    def _build(self) -> None:
        self.plot = _plot(self.graphics, row=0, col=0)
        self.plot.getAxis("bottom").setStyle(tickFont=small_font(7))
        self.plot.getAxis("left").setStyle(tickFont=small_font(7))
        self.cmap = pg.colormap.get("viridis")
        self.colorbar = pg.ColorBarItem(values=(0, 1), colorMap=self.cmap, interactive=False, width=12)
        self.colorbar.axis.enableAutoSIPrefix(False)
        self.graphics.addItem(self.colorbar, row=0, col=1)

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
        if self.plot is None:
            self._build()
        plot = self.plot
        plot.clear()
        plot.invertY(True)
        grid = self.grid = module_grid(report.tensor_stats, len(report.agents))
        by_density = self.metric_choice.currentIndex() == 0
        values = [np.array([[np.nan if v is None else v for v in row]
                            for row in (grid.density(t) if by_density else grid.unique_share(t))], dtype=float)
                  for t in range(len(report.agents))]
        top = max((float(np.nanmax(v)) for v in values if np.isfinite(v).any()), default=1.0)
        levels = (0.0, top if by_density and top > 0 else 1.0)
        rows, cols = len(grid.rows), len(grid.columns)
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
            name.setHtml(f"<b style='color:{agent_color(t).name()}'>{_html(agent.name)}</b>")
            name.setPos(t * width + cols / 2, 0)
            plot.addItem(name)
            ticks += [(t * width + c + 0.5, SHORT_COLUMNS.get(kind, kind)) for c, kind in enumerate(grid.columns)]
        self.colorbar.setLevels(levels)
        self.colorbar.setImageItem(self.images)
        if self.colorbar.axis.labelText != ("density" if by_density else "unique share"):
            self.colorbar.axis.setLabel("density" if by_density else "unique share")
        _label(plot, "title", "Density per layer and module" if by_density else
               "Unique share of each agent's updates per layer and module", size="10pt")
        plot.getAxis("bottom").setTicks([ticks])
        step = 1 if rows <= 12 else math.ceil(rows / 10)  # about ten layer labels, never overlapping
        plot.getAxis("left").setTicks([[(r + 0.5, name) for r, name in enumerate(grid.rows)
                                        if r % step == 0 or name == OTHER_ROW]])
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
        x, r = int(math.floor(point.x())), int(math.floor(point.y()))
        t, c = divmod(x, cols + self.GAP)
        if 0 <= t < len(self.images) and 0 <= c < cols and 0 <= r < rows:
            return t, r, c
        return None

    def cell_center(self, agent: int, row: int, column: int):
        """The scene position of a cell's centre (for tests and screenshots)."""
        assert self.grid is not None
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
        return (f"<b>{_html(report.agents[t].name)}</b> · {where} · <b>{grid.columns[c]}</b>: density "
                f"{_percent(updated / params, 2)} ({updated:,} of {params:,} elements), unique share "
                f"{_percent(unique / updated if updated else None)} ({unique:,})<br>"
                f"<span style='color:#666'>{_html(tensors)}</span>")

    def _hover(self, scene_pos) -> None:
        cell = self.cell_at(scene_pos)
        if cell is not None:
            self.readout.setText(self.describe(*cell))


# --- where: the per-tensor table ---------------------------------------------------------------------

def _role(role) -> int:
    return role if type(role) is int else int(role.value if hasattr(role, "value") else role)


_DISPLAY, _ALIGN, _TOOLTIP = (_role(r) for r in (Qt.DisplayRole, Qt.TextAlignmentRole, Qt.ToolTipRole))
_SORT = _role(Qt.UserRole) + 1
_ROLES = frozenset({_DISPLAY, _ALIGN, _TOOLTIP, _SORT})
_RIGHT = _role(Qt.AlignRight) | _role(Qt.AlignVCenter)
_FOREGROUND = _role(Qt.ForegroundRole)
_HEADER_ROLES = frozenset({_DISPLAY, _FOREGROUND, _TOOLTIP})


class TensorModel(QAbstractTableModel):
    """The per-tensor statistics as a table model: text for display, numbers for sorting (``SORT_ROLE``)."""

    SORT_ROLE = Qt.UserRole + 1

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.rows: list[tuple[list[str], list]] = []
        self.headers: list[str] = []
        self.agents = 0

    def set_report(self, report: ProbeReport | None) -> None:
        self.beginResetModel()
        self.rows, self.headers, self.agents = [], [], 0
        if report is not None:
            self.agents = len(report.agents)
            self.headers = ["Tensor", "Layer", "Module", "Elements"]
            for name in report.names:
                self.headers += [f"{name}\ndensity", f"{name}\nunique"]
            for stats in report.tensor_stats:
                layer = layer_of(stats.name)
                kind = module_kind(stats.name)
                texts = [stats.name.removeprefix("model."), str(layer) if layer is not None else "—", kind,
                         f"{stats.params:,}"]
                keys: list = [stats.name, layer if layer is not None else -1, kind, stats.params]
                for t in range(self.agents):
                    density = stats.updated[t] / stats.params if stats.params else None
                    share = stats.unique[t] / stats.updated[t] if stats.updated[t] else None
                    texts += [_percent(density, 2), _percent(share)]
                    keys += [-1.0 if density is None else density, -1.0 if share is None else share]
                self.rows.append((texts, keys))
        self.endResetModel()

    def rowCount(self, parent=QModelIndex()) -> int:  # noqa: N802
        return 0 if parent.isValid() else len(self.rows)

    def columnCount(self, parent=QModelIndex()) -> int:  # noqa: N802
        return 0 if parent.isValid() else len(self.headers)

    def data(self, index, role=Qt.DisplayRole):
        # roles compared as plain ints: comparing Qt's enum objects costs tens of microseconds per call,
        # and a table view asks for several roles per visible cell on every paint
        role = _role(role)
        if role not in _ROLES:
            return None
        row, col = index.row(), index.column()
        texts, keys = self.rows[row]
        if role == _DISPLAY:
            return texts[col]
        if role == _SORT:
            return keys[col]
        if role == _ALIGN:
            return _RIGHT if col >= 3 else None
        return keys[0] if col == 0 else None  # tooltip: the full tensor name

    def headerData(self, section, orientation, role=Qt.DisplayRole):  # noqa: N802
        role = _role(role)
        if role not in _HEADER_ROLES or orientation != Qt.Horizontal:
            return None
        if role == _DISPLAY:
            return self.headers[section]
        if section < 4:
            return None
        if role == _FOREGROUND:
            return QBrush(agent_color((section - 4) // 2))
        return ("Share of the tensor's elements this agent updates" if section % 2 == 0 else
                "Of this agent's updates in the tensor, the share no other agent touches")


class TensorTable(QWidget):
    """Every merged tensor with its layer, module kind, size and, per agent, density and unique share;
    click a header to sort, type to filter by name. A model and a sort/filter proxy: nothing is built
    per cell, so thousands of tensors show at once."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        row = QHBoxLayout()
        self.filter = QLineEdit()
        self.filter.setPlaceholderText("Filter tensors by name, e.g. layers.3. or down_proj")
        self.filter.setClearButtonEnabled(True)
        row.addWidget(self.filter, 1)
        self.count = QLabel()
        row.addWidget(self.count)
        layout.addLayout(row)
        self.model = TensorModel(self)
        self.proxy = QSortFilterProxyModel(self)
        self.proxy.setSourceModel(self.model)
        self.proxy.setSortRole(TensorModel.SORT_ROLE)
        self.proxy.setFilterKeyColumn(0)
        self.proxy.setFilterCaseSensitivity(Qt.CaseInsensitive)
        self.filter.textChanged.connect(self._apply_filter)
        self.table = QTableView()
        self.table.setModel(self.proxy)
        self.table.verticalHeader().setVisible(False)
        self.table.verticalHeader().setDefaultSectionSize(self.table.fontMetrics().lineSpacing() + 6)
        self.table.setSelectionBehavior(QTableView.SelectRows)
        self.table.setAlternatingRowColors(True)
        self.table.setSortingEnabled(True)
        self.table.sortByColumn(-1, Qt.AscendingOrder)  # model order until a header is clicked
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.Interactive)
        header.setStretchLastSection(False)
        layout.addWidget(self.table, 1)
        self.report: ProbeReport | None = None

    def show_report(self, report: ProbeReport | None) -> None:
        self.report = report
        self.model.set_report(report)
        if report is not None:
            self.table.setColumnWidth(0, 250)
            for col in range(1, self.model.columnCount()):
                self.table.setColumnWidth(col, 64 if col < 3 else 84)
        self._apply_filter(self.filter.text())

    def _apply_filter(self, text: str) -> None:
        self.proxy.setFilterFixedString(text.strip())
        self.count.setText(f"{self.proxy.rowCount()} of {self.model.rowCount()} tensors" if self.report else "")

    def column_values(self, column: int) -> list[str]:
        """The column as shown (sorted and filtered)."""
        return [self.proxy.data(self.proxy.index(r, column)) for r in range(self.proxy.rowCount())]


# --- which: UpSet-style intersections -----------------------------------------------------------------

class IntersectionChart(pg.GraphicsLayoutWidget):
    """UpSet-style: bars of how many elements exactly each set of agents updates (largest first),
    above a matrix whose filled dots name the set."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setMinimumHeight(200)
        self.bars: pg.PlotItem | None = None  # built with the first report (see _lazy)
        self.sets: list[dict] = []

    def _build(self) -> None:
        self.bars = _plot(self, row=0, col=0)
        self.matrix = _plot(self, row=1, col=0)
        self.matrix.setXLink(self.bars)
        self.ci.layout.setRowStretchFactor(0, 3)
        self.ci.layout.setRowStretchFactor(1, 1)

    def show_report(self, report: ProbeReport | None) -> None:
        if report is None and self.bars is None:
            self.sets = []
            return
        if self.bars is None:
            self._build()
        self.matrix.clear()
        stats = report.inspect if report is not None else None
        sets = stats.intersections(report.names) if stats is not None else None
        if not sets:
            self.sets = []
            _empty(self.bars, "Run the analysis to see which agents update the same elements"
                   if report is None or stats is not None else "Analyze again to count the intersections")
            self.matrix.hide()
            return
        self.matrix.show()
        names = report.names
        n = len(names)
        ordered = sorted(sets, key=lambda e: (-e["count"], len(e["agents"])))
        self.sets = ordered[:MAX_SETS]
        rest = ordered[MAX_SETS:]
        plot = self.bars
        plot.clear()
        _label(plot, "title", "Which agents update the same elements: elements updated by exactly this set", size="10pt")
        _label(plot, "left", "elements", units="% of all")
        xs = list(range(len(self.sets)))
        heights = [100.0 * e["count"] / report.params for e in self.sets]
        colors = [agent_color(names.index(e["agents"][0])) if len(e["agents"]) == 1 else QColor("#555555")
                  for e in self.sets]
        plot.addItem(pg.BarGraphItem(x=xs, height=heights, width=0.7, brushes=colors, pens=colors))
        for x, e, h in zip(xs, self.sets, heights):
            label = pg.TextItem(_compact(e["count"]), color=FOREGROUND, anchor=(0.5, 1.0))
            label.setPos(x, h)
            plot.addItem(label)
        plot.getAxis("bottom").setTicks([[]])
        plot.setXRange(-0.6, len(xs) - 0.4, padding=0)
        plot.setYRange(0, max(heights) * 1.15 or 1, padding=0)
        _label(plot, "bottom", "one colour: only that agent (unique); grey: shared by the dotted agents"
                      + (f"; {len(rest)} smaller sets not shown ({_compact(sum(e['count'] for e in rest))} elements)"
                         if rest else ""))
        m = self.matrix
        # one line item for the set connectors and one scatter for every dot (few items: fast to build)
        xs_line, ys_line = [], []
        for x, e in enumerate(self.sets):
            members = [names.index(a) for a in e["agents"]]
            if len(members) > 1:
                xs_line += [x, x]
                ys_line += [min(members), max(members)]
        if xs_line:
            m.addItem(pg.PlotDataItem(xs_line, ys_line, connect="pairs", pen=pg.mkPen("#555555", width=2)))
        spots = []
        grey = pg.mkBrush("#dddddd")
        brushes = [pg.mkBrush(agent_color(t)) for t in range(n)]
        for x, e in enumerate(self.sets):
            for t in range(n):
                member = names[t] in e["agents"]
                spots.append({"pos": (x, t), "size": 10 if member else 9, "brush": brushes[t] if member else grey,
                              "pen": None})
        m.addItem(pg.ScatterPlotItem(spots=spots))
        m.invertY(True)
        m.setYRange(-0.6, n - 0.4, padding=0)
        m.getAxis("left").setTicks([[(t, name) for t, name in enumerate(names)]])
        m.getAxis("bottom").setTicks([[]])
        m.getAxis("bottom").setHeight(6)
        width = max(m.getAxis("left").width(), 60)
        for p in (plot, m):
            p.getAxis("left").setWidth(width)


# --- agreement: pairs ----------------------------------------------------------------------------------

class PairsChart(pg.GraphicsLayoutWidget):
    """Per pair of agents: the elements both update, split into same sign and opposite sign."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setMinimumHeight(180)
        self.plot: pg.PlotItem | None = None  # built with the first report (see _lazy)
        self.pairs: list[dict] = []

    def show_report(self, report: ProbeReport | None) -> None:
        if report is None and self.plot is None:
            self.pairs = []
            return
        if self.plot is None:
            self.plot = _plot(self)
        plot = self.plot
        plot.clear()
        stats = report.inspect if report is not None else None
        if stats is None or len(report.agents) < 2:
            self.pairs = []
            _empty(plot, "Run the analysis with two or more agents to see where they agree in sign"
                   if report is None or stats is not None else "Analyze again to count sign agreement")
            return
        self.pairs = stats.pairs(report.names)
        ys = list(range(len(self.pairs)))
        same = [100.0 * p["same_sign"] / report.params for p in self.pairs]
        opposite = [100.0 * (p["both"] - p["same_sign"]) / report.params for p in self.pairs]
        _label(plot, "title", "Sign agreement: elements both agents update, same sign (green) vs opposite (red)", size="10pt")
        plot.addItem(pg.BarGraphItem(x0=[0] * len(ys), y=ys, height=0.6, width=same, brush="#2a9d8f", pen="#2a9d8f"))
        plot.addItem(pg.BarGraphItem(x0=same, y=ys, height=0.6, width=opposite, brush="#e4572e", pen="#e4572e"))
        top = max((s + o for s, o in zip(same, opposite)), default=0.0) or 1.0
        for y, p, s, o in zip(ys, self.pairs, same, opposite):
            agree = p["same_sign"] / p["both"] if p["both"] else None
            text = f"  {_percent(agree)} agree · {p['both']:,} shared"
            label = pg.TextItem(text, color=FOREGROUND, anchor=(0.0, 0.5))
            label.setPos(s + o, y)
            plot.addItem(label)
        plot.invertY(True)
        plot.setYRange(-0.6, len(ys) - 0.4, padding=0)
        plot.setXRange(0, top * 1.6, padding=0)
        plot.getAxis("left").setTicks([[(y, " & ".join(p["agents"])) for y, p in zip(ys, self.pairs)]])
        _label(plot, "bottom", "elements both agents update, % of all elements")
        self.setToolTip("Where shared updates mostly agree in sign, RAM's mean of them loses little; where they "
                        "conflict, TIES elects a sign per element")


# --- how much: update sizes in ulps -------------------------------------------------------------------

class UlpHistogram(pg.GraphicsLayoutWidget):
    """Per agent: the share of its updates that are 1 ulp, 2–3 ulps, 4–7 ... of the base value."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setMinimumHeight(180)
        self.plot: pg.PlotItem | None = None  # built with the first report (see _lazy)
        self.shares: list[list[float]] = []
        self.dtype: str | None = None  # the base's stored dtype, for the axis label
        self.report: ProbeReport | None = None

    def set_dtype(self, dtype: str | None) -> None:
        if dtype != self.dtype:
            self.dtype = dtype
            self.show_report(self.report)

    def show_report(self, report: ProbeReport | None) -> None:
        self.report = report
        dtype = self.dtype
        if report is None and self.plot is None:
            self.shares = []
            return
        plot = _cleared_plot_with_legend(self)
        stats = report.inspect if report is not None else None
        if stats is None:
            self.shares = []
            _empty(plot, "Run the analysis to see how large the updates are"
                   if report is None else "Analyze again to measure update sizes")
            return
        counts = np.array(stats.ulps, dtype=float)
        totals = counts.sum(1, keepdims=True)
        shares = np.divide(counts, totals, out=np.zeros_like(counts), where=totals > 0)
        used = [b for b in range(counts.shape[1]) if counts[:, b].any()] or [1]
        lo, hi = min(used), max(used)
        bins = list(range(lo, hi + 1))
        self.shares = shares[:, lo:hi + 1].tolist()
        n = len(report.agents)
        width = 0.8 / n
        labels = ulp_bin_labels()
        for t, agent in enumerate(report.agents):
            xs = [i - 0.4 + width * (t + 0.5) for i in range(len(bins))]
            color = agent_color(t)
            plot.addItem(pg.BarGraphItem(x=xs, height=[100 * shares[t, b] for b in bins], width=width * 0.92,
                                         brush=color, pen=color))
            self.legend.addItem(pg.BarGraphItem(x=[0], height=[0], width=0, brush=color, pen=color), agent.name)
        unit = f"{dtype} ulps" if dtype else "ulps of the stored dtype"
        _label(plot, "title", f"How large the updates are: |τ| in {unit} of the base value", size="10pt")
        _label(plot, "left", "share of the agent's updates", units="%")
        _label(plot, "bottom", f"{unit} (every 8th row counted)")
        self.setToolTip("An update of one or two ulps rescaled by λ ≈ 1.1 rounds back to the same value in that dtype: "
                        "RAM+'s rescale survives only in a finer output dtype (float32)")
        plot.getAxis("bottom").setTicks([[(i, labels[b]) for i, b in enumerate(bins)]])
        plot.setXRange(-0.6, len(bins) - 0.4, padding=0)
        plot.setYRange(0, 100 * float(shares.max() or 1.0) * 1.3, padding=0)
        self.legend.setColumnCount(n)


# --- what each method would keep ------------------------------------------------------------------------

class WouldKeepChart(pg.GraphicsLayoutWidget):
    """Grouped bars: per method, the share of each agent's update mass the merged model keeps."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setMinimumHeight(180)
        self.plot: pg.PlotItem | None = None  # built with the first report (see _lazy)
        self.report: ProbeReport | None = None
        self.method = defaults.METHOD
        self.params: dict = {}
        self.values: dict[str, list[float | None]] = {}

    def show_report(self, report: ProbeReport | None) -> None:
        self.report = report
        self.values = self.compute() if report is not None and report.agents else {}
        self._draw()

    def set_report(self, report: ProbeReport | None) -> None:
        """Take the report's numbers now and draw them when shown (the panel defers hidden views)."""
        self.report = report
        self.values = self.compute() if report is not None and report.agents else {}
        self._dirty = True

    def set_method(self, method: str, params: dict) -> None:
        """The method picked in the form and its parameters: its bars use them (the others, defaults).
        The numbers follow at once; the bars are redrawn now if shown, else when next shown or exported."""
        self.method, self.params = method, dict(params)
        if self.report is not None and self.report.agents:
            self.values = self.compute()
        if self.isVisible():
            self._draw()
        else:
            self._dirty = True

    def ensure_current(self) -> bool:
        """Redraw if the form changed while hidden; True when it did."""
        if getattr(self, "_dirty", False):
            self._draw()
            return True
        return False

    def showEvent(self, event) -> None:  # noqa: N802
        self.ensure_current()
        super().showEvent(event)

    def compute(self) -> dict[str, list[float | None]]:
        report = self.report
        assert report is not None
        out = {}
        for name in keep_methods():
            method = get_method(name)
            try:
                params = method.resolve(self.params if name == self.method else {})
            except Exception:  # a field being typed: the defaults until it is valid again
                params = method.resolve({})
            out[name] = would_keep(report, name, params)
        return out

    def _draw(self) -> None:
        self._dirty = False
        if self.report is None and self.plot is None:
            return
        plot = _cleared_plot_with_legend(self)
        report = self.report
        if report is None or not report.agents:
            self.values = {}
            _empty(plot, "Run the analysis to see how much of each agent each method would keep")
            return
        n = len(report.agents)
        width = 0.8 / n
        top = 1.0
        names = keep_methods()
        for t, agent in enumerate(report.agents):
            color = agent_color(t)
            xs, hs, brushes = [], [], []
            for i, name in enumerate(names):
                value = self.values[name][t]
                if value is None:
                    continue
                xs.append(i - 0.4 + width * (t + 0.5))
                hs.append(100 * value)
                brushes.append(shade(color, 1, 3) if estimated(name) else color)
                top = max(top, value)
            plot.addItem(pg.BarGraphItem(x=xs, height=hs, width=width * 0.92, brushes=brushes, pen=color))
            self.legend.addItem(pg.BarGraphItem(x=[0], height=[0], width=0, brush=color, pen=color), agent.name)
        if self.method in names:
            i = names.index(self.method)
            region = pg.LinearRegionItem((i - 0.48, i + 0.48), movable=False, brush=QColor(255, 220, 120, 60),
                                         pen=pg.mkPen(None))
            region.setZValue(-10)
            plot.addItem(region)
            for t in range(n):
                value = self.values[self.method][t]
                if value is not None:
                    label = pg.TextItem(f"{100 * value:.0f}%", color=FOREGROUND, anchor=(0.5, 1.0))
                    label.setPos(i - 0.4 + width * (t + 0.5), 100 * value)
                    plot.addItem(label)
        plot.addItem(pg.InfiniteLine(pos=100, angle=0, pen=pg.mkPen("#999999", style=Qt.DashLine)))
        ticks = [(i, get_method(name).short_label + (" ≈" if estimated(name) else "")) for i, name in enumerate(names)]
        plot.getAxis("bottom").setTicks([ticks])
        plot.getAxis("bottom").setStyle(tickFont=small_font(8))
        _label(plot, "title", "What each method would keep: share of each agent's updates carried into the merge", size="10pt")
        _label(plot, "left", "kept", units="%")
        _label(plot, "bottom", "highlighted: the method in the form, with its parameters; light bars ≈: estimates")
        self.setToolTip("Share of each agent's updated elements the merged model carries (mean fraction of its own "
                        "update kept). Exact for RAM, RAM+, RAM+s, Average and Task Arithmetic; expected value for "
                        "DARE-TA; estimates for TIES and DARE-TIES. Methods not selected use their defaults.")
        plot.setXRange(-0.6, len(names) - 0.4, padding=0)
        plot.setYRange(0, 100 * top * 1.3, padding=0)
        self.legend.setColumnCount(n)
