"""Charts of a probe report (pyqtgraph): density bars, overlap pies, per-layer density.

Every agent keeps one colour in every chart and table (``agent_color``); every model in the Evaluate
and Compare charts gets its own (``model_color``), from one colour-blind-safe palette.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyqtgraph as pg
from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QBrush, QColor, QFont, QFontMetricsF, QPainter, QPen, QPicture
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QVBoxLayout, QWidget

from ...core import ProbeReport

# one palette for every chart and compare.png (ram_desktop/evaluate/chart.py says how it was chosen)
from ...evaluate.chart import BASE_COLOR, PALETTE, palette_color  # noqa: F401  BASE_COLOR, PALETTE: re-exported

FOREGROUND = "#333333"


@dataclass(frozen=True)
class ColourScale:
    """A chart's colour map and the words for its colours: the chart draws with ``colormap()``, Help ▸ Reading
    the charts says ``words()``, so the two cannot disagree. ``stops``: (value, the colour's name in words)."""

    name: str  # pyqtgraph's colour map
    stops: tuple[tuple[float, str], ...]

    def colormap(self) -> pg.ColorMap:
        cmap = pg.colormap.get(self.name)
        assert cmap is not None, self.name
        return cmap

    def words(self) -> str:
        """ "dark purple at 0, teal at 0.5, yellow at 1"."""
        return ", ".join(f"{word} at {value:g}" for value, word in self.stops)

    @property
    def low(self) -> str:
        return self.stops[0][1]

    @property
    def high(self) -> str:
        return self.stops[-1][1]


# the layer × module heat maps: viridis (perceptually even, colour-blind safe); 0 is dark, 1 light
HEAT_SCALE = ColourScale("viridis", ((0.0, "dark purple"), (0.5, "teal"), (1.0, "yellow")))


_agent_slots: dict[str, int] = {}  # each agent's colour slot, by agent name (``set_agent_slots``)


def set_agent_slots(slots: Mapping[str, int], forget: bool = False) -> None:
    """The window's agents' colour slots by name: each agent keeps its colour when others are removed or the
    order changes (the sources panel gives each agent its slot when it is added). A removed agent keeps its
    entry, so a stale chart that still shows it draws it in its own colour; ``forget``: drop every entry first
    (a new window)."""
    if forget:
        _agent_slots.clear()
    for name, slot in slots.items():
        for other in [n for n, s in _agent_slots.items() if s == slot and n != name]:
            del _agent_slots[other]  # a slot given to another agent: the old name no longer owns it
        _agent_slots[name] = slot


def agent_slot(name: str) -> int:
    """The colour slot of agent ``name``; an agent the window never listed gets the first free slot (kept)."""
    if name not in _agent_slots:
        used = set(_agent_slots.values())
        _agent_slots[name] = next(i for i in itertools.count() if i not in used)
    return _agent_slots[name]


def agent_color(name: str) -> QColor:
    """The colour of agent ``name``: keyed by the agent, never by its position in a table or a chart."""
    return model_color(agent_slot(name))


def model_color(index: int) -> QColor:
    """The ``index``-th colour of the palette; past its end, further hues that keep clear of it."""
    return QColor(palette_color(index))


def shade(color: QColor, step: int, steps: int) -> QColor:
    """``step`` 0 is the colour itself; higher steps blend towards white (shared with more agents)."""
    if steps <= 1 or step == 0:
        return QColor(color)
    t = 0.72 * step / (steps - 1)
    return QColor(
        int(color.red() + (255 - color.red()) * t),
        int(color.green() + (255 - color.green()) * t),
        int(color.blue() + (255 - color.blue()) * t),
    )


def configure() -> None:
    pg.setConfigOptions(background="w", foreground=FOREGROUND, antialias=True)


def _plot(widget: pg.GraphicsLayoutWidget, **kwargs) -> pg.PlotItem:
    plot = widget.addPlot(**kwargs)
    plot.setMenuEnabled(False)
    plot.hideButtons()
    plot.getViewBox().setMouseEnabled(False, False)
    plot.getAxis("bottom").setHeight(40)  # room for descenders of agent names and an axis note
    return plot


def legend_below(widget: pg.GraphicsLayoutWidget, plot: pg.PlotItem, row: int = 1) -> pg.LegendItem:
    """A legend in its own row under ``plot``: it never covers a bar or a line, and sizes to its names (no
    name is cut); as many columns as the width holds, redone when the plot changes size."""
    legend = pg.LegendItem(labelTextColor=FOREGROUND, labelTextSize="9pt", horSpacing=18, verSpacing=-4)
    widget.addItem(legend, row=row, col=0)
    widget.ci.layout.setAlignment(legend, Qt.AlignmentFlag.AlignHCenter)
    plot.getViewBox().sigResized.connect(lambda *_: fit_legend(legend, widget.width() - 20))
    return legend


def fit_legend(legend: pg.LegendItem, width: float) -> None:
    """As many legend columns as fit ``width`` px (at least one)."""
    items = legend.items
    if not items:
        return
    # the text's own width (a LabelItem's rectangle grows with its layout cell)
    widest = max(sample.boundingRect().width() + label.item.boundingRect().width() for sample, label in items) + 30
    legend.setColumnCount(max(1, min(len(items), int(width // max(widest, 1.0)))))


def fit_ticks(plot: pg.PlotItem, ticks: Sequence[tuple[float, str]], gap: float = 10.0) -> None:
    """Category labels on the bottom axis that never run together: when the widest label with ``gap`` px
    does not fit between two neighbours, only every k-th is written (the others keep their tick). Redone
    whenever the plot changes size."""
    plot.__dict__["_ram_ticks"] = (list(ticks), gap)
    if not plot.__dict__.get("_ram_fit_connected"):
        plot.__dict__["_ram_fit_connected"] = True
        plot.getViewBox().sigResized.connect(lambda *_: _refit_ticks(plot))
    _refit_ticks(plot)


def _refit_ticks(plot: pg.PlotItem) -> None:
    ticks, gap = plot.__dict__.get("_ram_ticks", ([], 0.0))
    axis = plot.getAxis("bottom")
    if not ticks:
        axis.setTicks([[]])
        return
    metrics = QFontMetricsF(axis.style["tickFont"] or QFont())
    widths = [metrics.horizontalAdvance(text) for _, text in ticks]
    (x0, x1), width = plot.getViewBox().viewRange()[0], plot.getViewBox().width()
    per_unit = width / (x1 - x0) if x1 > x0 and width > 0 else 0.0

    def fits(step: int) -> bool:  # every step-th label: half of each and the gap between neighbours
        shown = list(range(0, len(ticks), step))
        return all(
            (widths[a] + widths[b]) / 2 + gap <= (ticks[b][0] - ticks[a][0]) * per_unit
            for a, b in itertools.pairwise(shown)
        )

    step = next((k for k in range(1, len(ticks)) if fits(k)), max(len(ticks), 1)) if per_unit > 0 else 1
    axis.setTicks([[(x, text if i % step == 0 else "") for i, (x, text) in enumerate(ticks)]])


class PieItem(pg.GraphicsObject):
    """A pie chart of ``values`` with ``colors``, centred on (0, 0) with radius 1, percentages on slices
    of at least 4 %."""

    def __init__(self, values: Sequence[float], colors: list[QColor], labels: bool = True) -> None:
        super().__init__()
        self.values = [max(0.0, float(v)) for v in values]
        self.colors = colors
        self.labels = labels
        self._picture = QPicture()
        self._render()

    def _render(self) -> None:
        painter = QPainter(self._picture)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        total = sum(self.values)
        rect = QRectF(-1, -1, 2, 2)
        pen = QPen(QColor("white"))
        pen.setWidthF(0.02)
        painter.setPen(pen)
        if total <= 0:
            painter.setBrush(QBrush(QColor("#dddddd")))
            painter.drawEllipse(rect)
            painter.end()
            return
        angle = 90.0 * 16  # start at 12 o'clock, clockwise
        for value, color in zip(self.values, self.colors):
            span = -360.0 * 16 * value / total
            if value > 0:
                painter.setBrush(QBrush(color))
                painter.drawPie(rect, round(angle), round(span) if abs(span) < 5760 else -5760)
            angle += span
        painter.end()

    def slice_label_positions(self) -> list[tuple[int, float, float, float]]:
        """(slice index, x, y, share) at the middle of each slice of at least 4 %; y up."""
        total = sum(self.values)
        out, start = [], 90.0
        for index, value in enumerate(self.values):
            share = value / total if total else 0.0
            mid = math.radians(start - 180.0 * share)
            if share >= 0.04:
                r = 0.62 if share < 0.999 else 0.0
                out.append((index, r * math.cos(mid), r * math.sin(mid), share))
            start -= 360.0 * share
        return out

    def paint(self, painter: QPainter, *args) -> None:
        painter.drawPicture(0, 0, self._picture)

    def boundingRect(self) -> QRectF:
        return QRectF(-1, -1, 2, 2)


def tick_font(pixels: int = 11) -> QFont:
    """The application's font at ``pixels`` pixels: axis ticks stay readable (at least 10 px) whatever the
    screen's dpi."""
    font = QFont()
    font.setPixelSize(pixels)
    return font


def small_font(points: int) -> QFont:
    """The application's font at ``points`` size (a font built from an empty family name crashes
    axis painting with PySide6 6.11 and earlier)."""
    font = QFont()
    font.setPointSize(points)
    return font


def overlap_labels(n_agents: int) -> list[str]:
    labels = ["unique"]
    for k in range(1, n_agents):
        labels.append(f"shared with {k} other" + ("s" if k > 1 else ""))
    return labels


class DensityChart(pg.GraphicsLayoutWidget):
    """Stacked bars per agent: unique updates (solid) and shared ones (light), as % of all elements."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setMinimumHeight(180)
        self.plot = _plot(self)
        self.plot.getAxis("bottom").enableAutoSIPrefix(False)  # agents by position: no "(x0.001)" in the caption
        self.report: ProbeReport | None = None
        self.show_report(None)

    def show_report(self, report: ProbeReport | None) -> None:
        self.report = report
        plot = self.plot
        plot.clear()
        plot.setTitle("Density: share of elements each agent updates (|τ| > ε)", size="10pt")
        plot.setLabel("left", "elements updated", units="%")
        if report is None or not report.agents:
            plot.getAxis("bottom").setTicks([[]])
            return
        n = len(report.agents)
        for t, a in enumerate(report.agents):
            color = agent_color(a.name)
            unique = 100.0 * a.unique / report.params if report.params else 0.0
            shared = 100.0 * a.shared / report.params if report.params else 0.0
            plot.addItem(pg.BarGraphItem(x=[t], height=[unique], width=0.6, brush=color, pen=color))
            plot.addItem(
                pg.BarGraphItem(x=[t], y0=[unique], height=[shared], width=0.6, brush=shade(color, 2, 3), pen=color)
            )
            label = pg.TextItem(f"{100 * a.density:.1f} %", color=FOREGROUND, anchor=(0.5, 1.0))
            label.setPos(t, unique + shared)
            plot.addItem(label)
        top = max(100.0 * a.density for a in report.agents) or 1.0
        plot.setXRange(-0.6, n - 0.4, padding=0)
        plot.setYRange(0, top * 1.18, padding=0)
        plot.getAxis("bottom").setTicks([[(t, a.name) for t, a in enumerate(report.agents)]])
        plot.setLabel("bottom", "dark: unique to the agent, light: shared")


class OverlapPies(pg.GraphicsLayoutWidget):
    """One pie per agent: its updates split into unique / shared with 1 other / with 2 others ..."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setMinimumHeight(180)
        self.pies: list[PieItem] = []
        self.show_report(None)

    def show_report(self, report: ProbeReport | None) -> None:
        self.clear()
        self.pies = []
        if report is None or not report.agents:
            self.addLabel("Run the analysis to see how each agent's updates overlap", color=FOREGROUND)
            return
        n = len(report.agents)
        cols = min(n, 4)
        self.addLabel(
            "Overlap: where each agent's updates fall (share of its updated elements)",
            colspan=cols,
            size="10pt",
            color=FOREGROUND,
        )
        self.nextRow()
        names = overlap_labels(n)
        for t, a in enumerate(report.agents):
            if t and t % cols == 0:
                self.nextRow()
            cell = self.addLayout()
            color = agent_color(a.name)
            cell.addLabel(f"<b>{_html(a.name)}</b>", color=color.name(), size="10pt")
            cell.nextRow()
            view = cell.addViewBox(lockAspect=True, enableMouse=False, enableMenu=False)
            view.setRange(QRectF(-1.08, -1.08, 2.16, 2.16), padding=0)
            view.setMinimumSize(90, 90)
            colors = [shade(color, k, n) for k in range(n)]
            pie = PieItem(a.overlap, colors)
            view.addItem(pie)
            for k, x, y, share in pie.slice_label_positions():
                text = pg.TextItem(f"{100 * share:.0f}%", color="white" if k == 0 else FOREGROUND, anchor=(0.5, 0.5))
                font = QFont()
                font.setBold(True)
                text.setFont(font)
                text.setPos(x, -y)
                view.addItem(text)
            view.invertY(True)
            self.pies.append(pie)
            cell.nextRow()
            total = sum(a.overlap) or 1
            lines = [
                f'<span style="color:{shade(color, k, n).name() if k else color.name()}">&#9632;</span> '
                f"{names[k]} {100 * v / total:.0f}%"
                for k, v in enumerate(a.overlap)
            ]
            cell.addLabel("<br>".join(lines), color=FOREGROUND, size="8pt")


LINE_STYLES = [
    Qt.PenStyle.SolidLine,
    Qt.PenStyle.DashLine,
    Qt.PenStyle.DotLine,
    Qt.PenStyle.DashDotLine,
    Qt.PenStyle.DashDotDotLine,
]
SYMBOLS = ["o", "s", "t", "d", "star", "p", "h", "t1", "+", "x", "t2", "t3"]


class LayerDensityChart(QWidget):
    """Density per transformer layer (or per module kind) with one line per agent: each agent its colour,
    dash and marker, its points set slightly apart, so that no line hides another."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        row = QHBoxLayout()
        row.addWidget(QLabel("Group by"))
        self.grouping = QComboBox()
        self.grouping.addItems(["layer", "module kind"])
        self.grouping.setToolTip("Per transformer layer (model.layers.N) or per module kind across layers")
        self.grouping.currentIndexChanged.connect(lambda _: self.show_report(self.report))
        row.addWidget(self.grouping)
        row.addStretch(1)
        layout.addLayout(row)
        self.graphics = pg.GraphicsLayoutWidget()
        self.graphics.setMinimumHeight(160)
        layout.addWidget(self.graphics, 1)
        self.plot = _plot(self.graphics, row=0, col=0)
        self.plot.getAxis("bottom").enableAutoSIPrefix(False)  # groups by position: no "(x0.001)" in the caption
        self.legend = legend_below(self.graphics, self.plot)
        self.lines: list[pg.PlotDataItem] = []
        self.report: ProbeReport | None = None
        self.show_report(None)

    def show_report(self, report: ProbeReport | None) -> None:
        self.report = report
        plot = self.plot
        plot.clear()
        self.legend.clear()
        self.lines = []
        by_layer = self.grouping.currentIndex() == 0
        plot.setTitle("Density per layer" if by_layer else "Density per module kind", size="10pt")
        plot.setLabel("left", "elements updated", units="%")
        if report is None or not report.agents:
            fit_ticks(plot, [])
            return
        groups = sorted(report.layers() if by_layer else report.modules(), key=_group_order)
        n = len(report.agents)
        spread = min(0.3, 0.08 * (n - 1))  # the agents' points side by side within a group
        for t, a in enumerate(report.agents):
            color = agent_color(a.name)
            offset = (t / (n - 1) - 0.5) * spread if n > 1 else 0.0
            ys = [100.0 * g["density"][t] for g in groups]
            line = plot.plot(
                [i + offset for i in range(len(groups))],
                ys,
                pen=pg.mkPen(color, width=2, style=LINE_STYLES[t % len(LINE_STYLES)]),
                symbol=SYMBOLS[t % len(SYMBOLS)],
                symbolSize=7,
                symbolBrush=color,
                symbolPen=color,
            )
            self.legend.addItem(line, a.name)
            self.lines.append(line)
        fit_legend(self.legend, self.graphics.width() - 20)
        fit_ticks(plot, [(i, _short(g["name"])) for i, g in enumerate(groups)])
        plot.setXRange(-0.5, len(groups) - 0.5, padding=0)
        top = max((100.0 * d for g in groups for d in g["density"]), default=1.0) or 1.0
        plot.setYRange(0, top * 1.1, padding=0)
        _refit_ticks(plot)


def _group_order(group: dict) -> tuple:
    """Embeddings first, then layers by number, then the rest (final norm, lm_head) in model order."""
    name = group["name"]
    m = re.search(r"layers\.(\d+)$", name)
    if "embed" in name:
        return (0, 0, name)
    if m:
        return (1, int(m.group(1)), name)
    return (2, 1 if "lm_head" in name else 0, name)


def _short(name: str) -> str:
    """``model.layers.3`` -> ``L3``; ``model.embed_tokens`` -> ``embed_tokens``; ``self_attn.q_proj`` -> ``q``;
    ``post_attention_layernorm`` -> ``post_attn_norm``."""
    m = re.search(r"layers\.(\d+)$", name)
    if m:
        return f"L{m.group(1)}"
    short = name.split(".")[-1]
    short = short.removesuffix("_proj")
    return short.replace("attention", "attn").replace("layernorm", "norm")


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


def percent(value: float | None, digits: int = 1) -> str:
    """A share as ``12.3 %`` (— when unknown)."""
    return "—" if value is None else f"{100 * value:.{digits}f} %"


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def export_png(widget: QWidget, path: Path) -> Path:
    """Save what the widget shows as a PNG (works offscreen)."""
    path = Path(path)
    if not widget.grab().save(str(path), "PNG"):
        raise OSError(f"cannot write {path}")
    return path
