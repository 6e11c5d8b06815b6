"""Inspection views of a probe report (docs/engine.md, docs/gui.md): which (UpSet-style intersections),
agreement (pairs and signs), how much (ulp histogram) and what each method would keep (where:
``module_heatmaps``, ``tensor_table``). Every agent keeps its colour from ``charts.agent_color``.
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QWidget

from ...core import InputError, ProbeReport, defaults, get_method
from ...core.engine.inspection import ULP_BINS, ulp_bin_labels
from ...core.methods.would_keep import estimated, keep_methods, would_keep
from .charts import (
    FOREGROUND,
    _empty,
    _label,
    _plot,
    agent_color,
    fit_legend,
    fit_ticks,
    legend_below,
    percent,
    shade,
    tick_font,
)

# _lazy: the inspection charts build their pyqtgraph plots with the first report, not with the window:
# every Qt call that returns nothing costs PySide6 6.12.0 a reference to None (see _label).
MAX_SETS = 24  # intersections drawn in the UpSet chart (the largest); the rest are summarised


def _compact(count: float) -> str:
    for suffix, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(count) >= size:
            return f"{count / size:.1f}{suffix}"
    return f"{count:.0f}"


def _cleared_plot_with_legend(chart) -> pg.PlotItem:
    """The chart's plot and legend (made on first use, as ``chart.plot`` / ``chart.legend``), emptied."""
    if chart.plot is None:
        chart.plot = _plot(chart, row=0, col=0)
        chart.legend = legend_below(chart, chart.plot)
    chart.plot.clear()
    chart.legend.clear()
    return chart.plot


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
        bars = self.bars
        assert bars is not None  # _build made it, with the matrix
        self.matrix.clear()
        stats = report.inspect if report is not None else None
        sets = stats.intersections(report.names) if report is not None and stats is not None else None
        if report is None or not sets:  # no sets without a report
            self.sets = []
            _empty(
                bars,
                "Run the analysis to see which agents update the same elements"
                if report is None or stats is not None
                else "Analyze again to count the intersections",
            )
            self.matrix.hide()
            return
        self.matrix.show()
        names = report.names
        n = len(names)
        ordered = sorted(sets, key=lambda e: (-e["count"], len(e["agents"])))
        self.sets = ordered[:MAX_SETS]
        rest = ordered[MAX_SETS:]
        plot = bars
        plot.clear()
        _label(
            plot, "title", "Which agents update the same elements: elements updated by exactly this set", size="10pt"
        )
        _label(plot, "left", "elements", units="% of all")
        xs = list(range(len(self.sets)))
        heights = [100.0 * e["count"] / report.params for e in self.sets]
        colors = [agent_color(e["agents"][0]) if len(e["agents"]) == 1 else QColor("#555555") for e in self.sets]
        plot.addItem(pg.BarGraphItem(x=xs, height=heights, width=0.7, brushes=colors, pens=colors))
        for x, e, h in zip(xs, self.sets, heights):
            label = pg.TextItem(_compact(e["count"]), color=FOREGROUND, anchor=(0.5, 1.0))
            label.setPos(x, h)
            plot.addItem(label)
        plot.getAxis("bottom").setTicks([[]])
        plot.setXRange(-0.6, len(xs) - 0.4, padding=0)
        plot.setYRange(0, max(heights) * 1.15 or 1, padding=0)
        _label(
            plot,
            "bottom",
            "one colour: only that agent (unique); grey: shared by the dotted agents"
            + (
                f"; {len(rest)} smaller sets not shown ({_compact(sum(e['count'] for e in rest))} elements)"
                if rest
                else ""
            ),
        )
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
        brushes = [pg.mkBrush(agent_color(names[t])) for t in range(n)]
        for x, e in enumerate(self.sets):
            for t in range(n):
                member = names[t] in e["agents"]
                spots.append(
                    {"pos": (x, t), "size": 10 if member else 9, "brush": brushes[t] if member else grey, "pen": None}
                )
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
        if report is None or stats is None or len(report.agents) < 2:  # stats is None without a report
            self.pairs = []
            _empty(
                plot,
                "Run the analysis with two or more agents to see where they agree in sign"
                if report is None or stats is not None
                else "Analyze again to count sign agreement",
            )
            return
        self.pairs = stats.pairs(report.names)
        ys = list(range(len(self.pairs)))
        same = [100.0 * p["same_sign"] / report.params for p in self.pairs]
        opposite = [100.0 * (p["both"] - p["same_sign"]) / report.params for p in self.pairs]
        _label(
            plot,
            "title",
            "Sign agreement: elements both agents update, same sign (green) vs opposite (red)",
            size="10pt",
        )
        plot.addItem(pg.BarGraphItem(x0=[0] * len(ys), y=ys, height=0.6, width=same, brush="#2a9d8f", pen="#2a9d8f"))
        plot.addItem(pg.BarGraphItem(x0=same, y=ys, height=0.6, width=opposite, brush="#e4572e", pen="#e4572e"))
        top = max((s + o for s, o in zip(same, opposite)), default=0.0) or 1.0
        for y, p, s, o in zip(ys, self.pairs, same, opposite):
            agree = p["same_sign"] / p["both"] if p["both"] else None
            text = f"  {percent(agree)} agree · {p['both']:,} shared"
            label = pg.TextItem(text, color=FOREGROUND, anchor=(0.0, 0.5))
            label.setPos(s + o, y)
            plot.addItem(label)
        plot.invertY(True)
        plot.setYRange(-0.6, len(ys) - 0.4, padding=0)
        plot.setXRange(0, top * 1.6, padding=0)
        plot.getAxis("left").setTicks([[(y, " & ".join(p["agents"])) for y, p in zip(ys, self.pairs)]])
        _label(plot, "bottom", "elements both agents update, % of all elements")
        self.setToolTip(
            "Where shared updates mostly agree in sign, RAM's mean of them loses little; where they "
            "conflict, TIES elects a sign per element"
        )


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
        if report is None or stats is None:  # stats is None without a report
            self.shares = []
            _empty(
                plot,
                "Run the analysis to see how large the updates are"
                if report is None
                else "Analyze again to measure update sizes",
            )
            return
        counts = np.array(stats.ulps, dtype=float)
        totals = counts.sum(1, keepdims=True)
        shares = np.divide(counts, totals, out=np.zeros_like(counts), where=totals > 0)
        used = [b for b in range(counts.shape[1]) if counts[:, b].any()] or [1]
        lo, hi = min(used), max(used)
        bins = list(range(lo, hi + 1))
        self.shares = shares[:, lo : hi + 1].tolist()
        n = len(report.agents)
        width = 0.8 / n
        labels = ulp_short_labels()
        for t, agent in enumerate(report.agents):
            xs = [i - 0.4 + width * (t + 0.5) for i in range(len(bins))]
            color = agent_color(agent.name)
            plot.addItem(
                pg.BarGraphItem(
                    x=xs, height=[100 * shares[t, b] for b in bins], width=width * 0.92, brush=color, pen=color
                )
            )
            self.legend.addItem(pg.BarGraphItem(x=[0], height=[0], width=0, brush=color, pen=color), agent.name)
        unit = f"{dtype} ulps" if dtype else "ulps of the stored dtype"
        _label(plot, "title", f"How large the updates are: |τ| in {unit} of the base value", size="10pt")
        _label(plot, "left", "share of the agent's updates", units="%")
        _label(plot, "bottom", f"{unit}: each bar from its value to just under twice it (from a sample of each tensor)")
        self.setToolTip(
            "An update of one or two ulps rescaled by λ ≈ 1.1 rounds back to the same value in that dtype: "
            "RAM+'s rescale survives only in a finer output dtype (float32)"
        )
        plot.setXRange(-0.6, len(bins) - 0.4, padding=0)
        plot.setYRange(0, 100 * float(shares.max() or 1.0) * 1.08, padding=0)
        fit_ticks(plot, [(i, labels[b]) for i, b in enumerate(bins)])
        fit_legend(self.legend, self.width() - 20)


def ulp_short_labels() -> list[str]:
    """Per ulp bin the smallest size it holds, compact (``1``, ``2``, ``4`` … ``1k`` … ``≥256k``); the bins
    of ``ulp_bin_labels`` (``2-3``, ``4-7`` …) double in width, so their lower ends say the same."""

    def compact(n: int) -> str:
        if n < 1024:
            return str(n)
        exponent = n.bit_length() - 1
        return f"{1 << exponent % 10}{'kMGTPE'[exponent // 10 - 1]}"

    labels = ulp_bin_labels()
    return [labels[0]] + [compact(1 << (b - 1)) for b in range(1, ULP_BINS - 1)] + [f"≥{compact(1 << (ULP_BINS - 2))}"]


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
        self.note = ""  # what the chart cannot show, in plain words (under the chart)

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

    def showEvent(self, event) -> None:
        self.ensure_current()
        super().showEvent(event)

    def _note(self, names: list[str], chosen: str | None) -> str:
        """Plain words for what the chart cannot show: the method in the form when it has no estimate, and
        methods whose bars are empty (they need more agents)."""
        parts = []
        if chosen is None:
            label = get_method(self.method).label
            parts.append(
                f"{label} is not shown: what it keeps depends on the weights themselves "
                "(their sizes, signs or angles), known only while merging"
            )
        empty = [get_method(n).short_label for n in names if all(v is None for v in self.values.get(n, []))]
        if empty:
            parts.append(f"{' and '.join(empty)}: no bars, they need two agents or more to estimate")
        return "; ".join(parts)

    def compute(self) -> dict[str, list[float | None]]:
        report = self.report
        assert report is not None
        out = {}
        for name in keep_methods():
            method = get_method(name)
            try:
                params = method.resolve(self.params if name == self.method else {})
            except InputError:  # a field being typed: the defaults until it is valid again
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
        chosen = self.method if self.method in names else None
        for t, agent in enumerate(report.agents):
            color = agent_color(agent.name)
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
            # the chosen method's share in the legend, not over the bars (labels there ran into each other)
            kept = self.values[chosen][t] if chosen else None
            label = agent.name + (
                f": {get_method(chosen).short_label} keeps {100 * kept:.0f}%" if chosen and kept is not None else ""
            )
            self.legend.addItem(pg.BarGraphItem(x=[0], height=[0], width=0, brush=color, pen=color), label)
        if chosen:
            i = names.index(chosen)
            region = pg.LinearRegionItem(
                (i - 0.48, i + 0.48), movable=False, brush=QColor(255, 220, 120, 60), pen=pg.mkPen(None)
            )
            region.setZValue(-10)
            plot.addItem(region)
        plot.addItem(pg.InfiniteLine(pos=100, angle=0, pen=pg.mkPen("#999999", style=Qt.PenStyle.DashLine)))
        ticks = [(i, get_method(name).short_label + (" ≈" if estimated(name) else "")) for i, name in enumerate(names)]
        plot.getAxis("bottom").setStyle(tickFont=tick_font())
        self.note = self._note(names, chosen)
        _label(
            plot,
            "title",
            "What each method would keep: share of each agent's updates carried into the merge",
            size="10pt",
        )
        _label(plot, "left", "kept", units="%")
        _label(
            plot,
            "bottom",
            "highlighted: the method in the form, with its parameters; light bars ≈: estimates"
            + (f"<br>{self.note}" if self.note else ""),
        )
        self.setToolTip(
            "Share of each agent's updated elements the merged model carries (mean fraction of its own "
            "update kept). Exact for RAM, RAM+, RAM+s, Average and Task Arithmetic; expected value for "
            "DARE-TA; estimates for TIES and DARE-TIES. Methods not selected use their defaults."
        )
        plot.setXRange(-0.6, len(names) - 0.4, padding=0)
        plot.setYRange(0, 100 * top * 1.08, padding=0)
        fit_ticks(plot, ticks)
        fit_legend(self.legend, self.width() - 20)
