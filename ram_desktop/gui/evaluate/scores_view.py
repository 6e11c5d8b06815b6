"""The scores of the Evaluate and Compare steps: a table (each score with its 95 % interval; the best
merged model marked only when it is clearly better than the next, else the leaders marked tied; a model
no better than the suite's floor marked ≈) and a grouped bar chart drawn from ``evaluate.chart``'s
description (error bars, value labels, floors), as CSV and PNG on request."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QBrush, QColor, QFont, QFontMetrics
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from ...core import MERGE_REPORT
from ...evaluate import EvalResult, SuiteSummary
from ...evaluate.chart import FLOOR_COLOR, FOREGROUND, KEY, ScoreChart, kinds_of, model_colors, score_chart
from ...evaluate.results import Leader
from ..analysis.charts import agent_slot, export_png

MERGED_KINDS = ("merged", "variant")
KIND_LABELS = {
    "base": "base model",
    "agent": "agent",
    "merged": "merged model",
    "variant": "compare variant",
    "other": "model folder",
}
BEST_BRUSH = QColor("#e3f2e1")
TIED_BRUSH = QColor("#fff4d6")
FLOOR_TEXT = QColor("#b00020")


class ScoresChart(pg.GraphicsLayoutWidget):
    """Grouped bars: one group per suite, one bar per model in the model's colour, its 95 % interval as an
    error bar and its value above it, each suite's floor as a dashed line; the legend beside. Draws an
    ``evaluate.chart.ScoreChart``, as ``compare.png`` does."""

    MIN_HEIGHT = 200

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setMinimumHeight(self.MIN_HEIGHT)
        self.plot = plot = self.addPlot(row=0, col=0)
        plot.setMenuEnabled(False)
        plot.hideButtons()
        plot.getViewBox().setMouseEnabled(False, False)
        plot.showGrid(y=True, alpha=0.25)
        plot.getAxis("bottom").setHeight(2 * QFontMetrics(self.font()).lineSpacing() + 10)  # two-line names
        self.items: list[pg.GraphicsObject] = []
        self.bars: list[pg.BarGraphItem] = []
        self.labels: list[pg.TextItem] = []
        self.suites: list[str] = []
        self.legend = pg.LegendItem(labelTextColor=FOREGROUND, labelTextSize="8pt", verSpacing=-6)
        self.ci.addItem(self.legend, row=0, col=1)
        self.ci.layout.setColumnStretchFactor(0, 1)
        self.show_chart(ScoreChart("Scores per suite — run an evaluation", (), (), (), 1.0))

    def show_chart(self, chart: ScoreChart) -> None:
        plot = self.plot
        for item in self.items:
            plot.removeItem(item)
        self.items, self.bars, self.labels = [], [], []
        self.legend.clear()
        n_suites = len(chart.suites)
        vertical = len(chart.series) > 4  # many narrow bars: labels upright
        for m, series in enumerate(chart.series):
            color = QColor(series.color)
            xs = [chart.x(m, s) for s in range(n_suites)]
            bar = pg.BarGraphItem(
                x=xs,
                height=list(series.values),
                width=chart.bar_width * 0.92,
                brush=pg.mkBrush(color),
                pen=pg.mkPen(color.darker(130)),
                name=series.name,
            )
            self._add(bar)
            self.bars.append(bar)
            self.legend.addItem(bar, series.name)  # whole: the legend sizes to its longest name
            known = [s for s in range(n_suites) if series.lows[s] is not None and series.highs[s] is not None]
            if known:
                self._add(
                    pg.ErrorBarItem(
                        x=np.array([xs[s] for s in known]),
                        y=np.array([series.values[s] for s in known]),
                        top=np.array([series.highs[s] - series.values[s] for s in known]),  # type: ignore[operator]
                        bottom=np.array([series.values[s] - series.lows[s] for s in known]),  # type: ignore[operator]
                        beam=chart.bar_width * 0.4,
                        pen=pg.mkPen(FOREGROUND, width=1),
                    )
                )
            for s, x in enumerate(xs):
                label = pg.TextItem(
                    series.labels[s],
                    color=FOREGROUND,
                    anchor=(0.0, 0.5) if vertical else (0.5, 1.0),
                    angle=90 if vertical else 0,
                )
                label.setFont(_small_font(self.font()))
                label.setPos(x, chart.label_y(m, s))
                self._add(label)
                self.labels.append(label)
        for s, floor in enumerate(chart.floors):
            if floor is not None:
                half = 0.44
                line = pg.PlotCurveItem(
                    [s - half, s + half],
                    [floor, floor],
                    pen=pg.mkPen(FLOOR_COLOR, width=1.5, style=Qt.PenStyle.DashLine),
                )
                self._add(line)
        self.legend.setVisible(bool(chart.series))
        self.suites = list(chart.suites)
        self.fit_legend(new=True)
        self.fit_suite_labels()
        plot.setLabel("left", chart.y_label)
        plot.setYRange(0, chart.y_top, padding=0)
        plot.setXRange(-0.55, max(n_suites, 1) - 0.45, padding=0)
        plot.setTitle(
            chart.title, color=FOREGROUND, size="10pt"
        )  # the key is in the note: a long title widens the chart
        self.setToolTip(KEY if chart.series else "")

    def _add(self, item: pg.GraphicsObject) -> None:
        self.plot.addItem(item)
        self.items.append(item)

    def fit_suite_labels(self) -> None:
        """Each suite's name under its group: whole if it fits the group's width, else on two lines broken
        after a ``-`` / ``_`` / space, else cut (… at the end): pyqtgraph hides a label that would reach past
        the axis, so on a narrow chart the outer suites lost theirs."""
        axis = self.plot.getAxis("bottom")
        slot = self.plot.getViewBox().width() / (max(len(self.suites), 1) + 0.1)  # the x range is n + 0.1 wide
        metrics = QFontMetrics(axis.style["tickFont"] or self.font())
        room = max(int(slot) - 8, metrics.horizontalAdvance("a…z"))
        axis.setTicks([[(s, _fit_label(name, metrics, room)) for s, name in enumerate(self.suites)]])

    LEGEND_MARGIN = 30  # the legend's margins and the chart's border, in pixels

    def _legend_row(self) -> float:
        """The height one legend entry takes, as the legend lays them out in one column."""
        if self.legend.columnCount != 1:
            self.legend.setColumnCount(1)
        height = self.legend.layout.effectiveSizeHint(Qt.SizeHint.PreferredSize).height()
        return height / max(len(self.legend.items), 1)

    def fit_legend(self, new: bool = False) -> None:
        """Every model's legend entry inside the chart: one column while they fit its height, else two, and the
        chart never shorter than two columns need (13 models on a 1366×768 screen lost two entries; the page
        scrolls instead). ``new``: the models changed."""
        items = self.legend.items
        if not items:
            self.setMinimumHeight(self.MIN_HEIGHT)
            return
        columns_before = self.legend.columnCount
        row = self._legend_row()
        if new:
            self.setMinimumHeight(max(self.MIN_HEIGHT, int(-(-len(items) // 2) * row + self.LEGEND_MARGIN)))
        columns = 1 if len(items) * row + self.LEGEND_MARGIN <= self.viewport().height() else 2
        if columns != self.legend.columnCount or columns != columns_before:
            self.legend.setColumnCount(columns)
            self.legend.updateSize()
            self.ci.layout.invalidate()  # the legend's column in the chart's layout takes its new width

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        if hasattr(self, "suites"):  # not while the base class is still being set up
            self.fit_legend()
            self.fit_suite_labels()


class ScoresView(QWidget):
    """The scores of the evaluations run so far: ``result`` (rows kept across runs on the same suites)
    and ``kinds`` (model source -> base, agent, merged, variant, other: colours and the best-merged mark)."""

    def __init__(self, parent: QWidget | None = None, title: str = "Scores per suite") -> None:
        super().__init__(parent)
        self.title = title
        self.result: EvalResult | None = None
        self.kinds: dict[str, str] = {}
        self.table = QTableWidget(0, 0)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        self.table.verticalHeader().setDefaultSectionSize(self.table.fontMetrics().height() + 8)
        self.table.setToolTip(
            "Mean reward per suite and its 95 % interval. Bold on green: the best merged model, clearly "
            "better than the next (by more than 2 standard errors, paired on the same examples); "
            "on yellow: merged models tied at the top; ≈: no better than the suite's floor"
        )
        header = self.table.horizontalHeader()
        header.setDefaultAlignment(
            Qt.AlignmentFlag.AlignCenter | Qt.TextFlag.TextWordWrap
        )  # a long suite name wraps, not cut
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.note = QLabel("No scores yet.")
        self.note.setWordWrap(True)
        self.note.setStyleSheet("color: #555;")
        self.export_csv_button = QPushButton("Export table (CSV)…")
        self.export_png_button = QPushButton("Export chart (PNG)…")
        export_row = QHBoxLayout()
        export_row.addWidget(self.note, 1)
        export_row.addWidget(self.export_csv_button)
        export_row.addWidget(self.export_png_button)
        self.chart = ScoresChart()
        # table and chart one at a time, each the pane's full width: side by side, the table hid suite
        # columns and the chart's legend cut the models' names
        self.views = results = QTabWidget()
        results.setDocumentMode(True)
        results.addTab(self.table, "Table")
        results.addTab(self.chart, "Chart")
        # the chart is drawn when it is shown: pyqtgraph's legend costs some 15 ms per model on the GUI thread
        self.chart_stale = False
        results.currentChanged.connect(lambda _: self.draw_chart())
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(results, 1)
        layout.addLayout(export_row)

    def show_result(self, result: EvalResult, kinds: dict[str, str] | None = None, keep: bool = True) -> None:
        """Show ``result``; with ``keep``, rows of models scored before on the same suites stay (same
        source: replaced)."""
        self.kinds.update(kinds or {})
        for model in result.models:
            if model.source not in self.kinds:
                self.kinds[model.source] = "merged" if (Path(model.source) / MERGE_REPORT).is_file() else "other"
        old = self.result
        if keep and old is not None and _suite_keys(old.suites) == _suite_keys(result.suites):
            new_sources = {m.source for m in result.models}
            kept = [i for i, m in enumerate(old.models) if m.source not in new_sources]
            models = [old.models[i] for i in kept] + list(result.models)
            scores = [old.scores[i] for i in kept] + [list(r) for r in result.scores]
            both = old.has_examples and result.has_examples
            rewards = [old.rewards[i] for i in kept] + list(result.rewards) if both else []
            order = sorted(range(len(models)), key=lambda i: _KIND_ORDER.get(self.kinds.get(models[i].source, ""), 9))
            result = EvalResult(
                [models[i] for i in order],
                list(result.suites),
                [scores[i] for i in order],
                old.seconds + result.seconds,
                result.device,
                result.versions,
                rewards=[rewards[i] for i in order] if both else [],
                generated_tokens=old.generated_tokens + result.generated_tokens,
            )
        self.result = result
        self._fill_table()

    def merged_rows(self) -> list[int]:
        assert self.result is not None
        return [i for i, m in enumerate(self.result.models) if self.kinds.get(m.source) in MERGED_KINDS]

    def leaders(self) -> list[Leader]:
        """Per suite and then for the mean: the best merged model (clearly better than the next) or the
        merged models tied at the top (``EvalResult.leader``); empty leaders without merged rows."""
        result = self.result
        if result is None:
            return []
        merged = self.merged_rows()
        return [result.leader(s, merged) for s in [*range(len(result.suites)), None]]

    def best_merged(self) -> list[int | None]:
        """Per suite and then for the mean: the row of the best merged model, None where none is clearly best."""
        return [lead.best for lead in self.leaders()]

    def model_colors(self) -> list[QColor]:
        """Grey for the base; the agents their Analysis colours; every other model the next palette colour
        after the agents': no two models share a colour (``evaluate.chart.model_colors``)."""
        assert self.result is not None
        kinds = kinds_of(self.result, self.kinds)
        return [QColor(c) for c in model_colors(kinds, self._agent_slots(kinds))]

    def _agent_slots(self, kinds: list[str]) -> list[int]:
        """The agents' colour slots, by agent name as in Analysis (``charts.agent_slot``)."""
        assert self.result is not None
        return [agent_slot(m.name) for m, kind in zip(self.result.models, kinds) if kind == "agent"]

    def chart_description(self) -> ScoreChart:
        assert self.result is not None
        kinds = kinds_of(self.result, self.kinds)
        return score_chart(self.result, kinds, self.title, self._agent_slots(kinds))

    def _fill_table(self) -> None:
        result = self.result
        assert result is not None
        heads = [_suite_head(s) for s in result.suites] + ["mean"]
        self.table.clear()
        self.table.setRowCount(len(result.models))
        self.table.setColumnCount(len(heads) + 1)
        self.table.setHorizontalHeaderLabels(["model", *heads])
        for c, summary in enumerate(result.suites, start=1):
            head = self.table.horizontalHeaderItem(c)
            if summary.floor is not None and head is not None:
                head.setToolTip(
                    f"floor: answering {_quote(summary.floor.answer)} to every prompt scores {summary.floor.score:.3f}"
                )
        leaders = self.leaders()
        bold = QFont(self.table.font())
        bold.setBold(True)
        colors = self.model_colors()
        for r, (model, row) in enumerate(zip(result.models, result.scores)):
            name = QTableWidgetItem(model.name)
            name.setForeground(QBrush(colors[r].darker(110)))
            name.setToolTip(f"{KIND_LABELS.get(self.kinds.get(model.source, 'other'))}: {model.source}")
            self.table.setItem(r, 0, name)
            for c, value in enumerate([*row, _mean(row)]):
                suite = c if c < len(row) else None
                item = QTableWidgetItem(self._cell_text(r, suite, value))
                item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                tips = []
                lead = leaders[c]
                where = " on this suite" if suite is not None else " on average"
                if lead.best == r:
                    item.setFont(bold)
                    item.setBackground(QBrush(BEST_BRUSH))
                    tips.append(f"best merged model{where}: {result.describe_leader(suite, self.merged_rows())}")
                elif len(lead.tied) > 1 and r in lead.tied:
                    item.setBackground(QBrush(TIED_BRUSH))
                    tips.append(f"tied{where} — {result.describe_leader(suite, self.merged_rows())}")
                if suite is not None and result.at_floor(r, suite):
                    floor = result.suites[suite].floor
                    assert floor is not None
                    item.setForeground(QBrush(FLOOR_TEXT))
                    tips.append(f"no better than answering {_quote(floor.answer)} every time (floor {floor.score:.3f})")
                if tips:
                    item.setToolTip("\n".join(tips))
                self.table.setItem(r, c + 1, item)
        self.chart_stale = True
        if self.views.currentWidget() is self.chart:
            self.draw_chart()
        self.note.setText(self.summary())

    def draw_chart(self) -> None:
        """Draw the chart of the scores shown, if it is not up to date."""
        if self.chart_stale and self.result is not None:
            self.chart.show_chart(self.chart_description())
            self.chart_stale = False

    def _cell_text(self, m: int, s: int | None, value: float) -> str:
        """``0.465 [0.437, 0.493]`` (the mean over suites without an interval), ``≈`` at the floor."""
        assert self.result is not None
        if s is None:
            return f"{value:.3f}"
        interval = self.result.interval(m, s)
        text = f"{value:.3f}" + (f" [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else "")
        return text + (" ≈" if self.result.at_floor(m, s) else "")

    def summary(self) -> str:
        """The line under the table: who is best (clearly better than the next merged model) or tied, what
        the marks mean, how many models."""
        result = self.result
        assert result is not None
        parts = []
        leaders = self.leaders()
        names = [s.name for s in result.suites] + ["mean"]
        best = [
            f"{result.models[lead.best].name} on {names[c]}" for c, lead in enumerate(leaders) if lead.best is not None
        ]
        tied = [names[c] for c, lead in enumerate(leaders) if lead.best is None and len(lead.tied) > 1]
        if best:
            parts.append("Best merged model (bold on green, clearly better than the next): " + ", ".join(best) + ".")
        if tied:
            parts.append(f"Tied at the top (yellow, none clearly better): {', '.join(tied)}.")
        if any(result.at_floor(m, s) for m in range(len(result.models)) for s in range(len(result.suites))):
            parts.append("≈ (red): no better than the floor.")
        parts.append(f"Chart: {KEY}.")
        parts.append(
            f"{_count(len(result.models), 'model')}, mean reward over {sum(s.examples for s in result.suites)} "
            f"examples on {result.device}" + (" [95 % interval]" if result.has_examples else "") + "."
        )
        return " ".join(parts)

    def table_rows(self) -> list[list[str]]:
        """The table as CSV rows: a header, one row per model (score, then its interval's low and high per
        suite), the floors, then the best merged model per column ("tied: a b" where none is clearly best)."""
        result = self.result
        assert result is not None
        head = ["model", "kind", "source"]
        for summary in result.suites:
            head += [summary.name, f"{summary.name} low", f"{summary.name} high"]
        rows = [[*head, "mean"]]
        for m, (model, row) in enumerate(zip(result.models, result.scores)):
            cells = [model.name, self.kinds.get(model.source, "other"), model.source]
            for s, v in enumerate(row):
                interval = result.interval(m, s)
                cells += (
                    [repr(round(v, 6)), *(repr(round(x, 6)) for x in interval)]
                    if interval
                    else [repr(round(v, 6)), "", ""]
                )
            rows.append([*cells, repr(round(_mean(row), 6))])
        if any(summary.floor is not None for summary in result.suites):
            cells = ["floor", "constant answer", ""]
            for summary in result.suites:
                floor = summary.floor
                cells += (
                    [repr(round(floor.score, 6)), json.dumps(floor.answer, ensure_ascii=False), ""]
                    if floor
                    else [""] * 3
                )
            rows.append([*cells, ""])
        leaders = self.leaders()
        if any(lead.tied for lead in leaders):
            cells = ["best merged", "", ""]
            for c, lead in enumerate(leaders):
                text = (
                    result.models[lead.best].name
                    if lead.best is not None
                    else ("tied: " + " ".join(result.models[m].name for m in lead.tied) if lead.tied else "")
                )
                cells += [text, "", ""] if c < len(result.suites) else [text]
            rows.append(cells)
        return rows

    def export_csv(self, path: Path) -> Path:
        path = Path(path)
        with open(path, "w", newline="", encoding="utf-8") as f:
            csv.writer(f).writerows(self.table_rows())
        return path

    def export_png(self, path: Path) -> Path:
        self.draw_chart()
        return export_png(self.chart, Path(path))


def _suite_head(suite: SuiteSummary) -> str:
    """A column head on three lines (narrower columns): name, examples, floor."""
    head = f"{suite.name}\n({suite.examples})"
    return head + (f"\nfloor {suite.floor.score:.3f}" if suite.floor is not None else "")


def _quote(answer: str) -> str:
    text = json.dumps(answer, ensure_ascii=False)
    return text if len(text) <= 40 else text[:38] + '…"'


def _small_font(font: QFont) -> QFont:
    small = QFont(font)
    small.setPointSizeF(max(font.pointSizeF() * 0.8, 6.5))
    return small


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' * (n != 1)}"


def _fit_label(name: str, metrics: QFontMetrics, room: int) -> str:
    if metrics.horizontalAdvance(name) <= room:
        return name
    for i in range(len(name) - 1, 0, -1):
        if name[i - 1] in "-_ " and metrics.horizontalAdvance(name[:i]) <= room:
            return name[:i] + "\n" + metrics.elidedText(name[i:], Qt.TextElideMode.ElideRight, room)
    return metrics.elidedText(name, Qt.TextElideMode.ElideRight, room)


_KIND_ORDER = {"base": 0, "agent": 1, "merged": 2, "variant": 3, "other": 4}


def _suite_keys(suites: list[SuiteSummary]) -> list[tuple]:
    return [(s.name, s.source, s.examples, s.scorer) for s in suites]


def _mean(row: list[float]) -> float:
    return sum(row) / len(row) if row else 0.0
