"""The Evaluate step's scores: a table (the best merged model marked) beside a grouped bar chart, as
CSV and PNG on request."""

from __future__ import annotations

import csv
from pathlib import Path

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
from ..analysis.charts import BASE_COLOR, FOREGROUND, export_png, model_color

MERGED_KINDS = ("merged", "variant")
KIND_LABELS = {
    "base": "base model",
    "agent": "agent",
    "merged": "merged model",
    "variant": "compare variant",
    "other": "model folder",
}
BEST_BRUSH = QColor("#e3f2e1")


class ScoresChart(pg.GraphicsLayoutWidget):
    """Grouped bars: one group per suite, one bar per model, in the model's colour; the legend beside."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setMinimumHeight(200)
        self.plot = plot = self.addPlot(row=0, col=0)
        plot.setMenuEnabled(False)
        plot.hideButtons()
        plot.getViewBox().setMouseEnabled(False, False)
        plot.showGrid(y=True, alpha=0.25)
        plot.setLabel("left", "mean reward")
        plot.getAxis("bottom").setHeight(2 * QFontMetrics(self.font()).lineSpacing() + 10)  # two-line names
        self.bars: list[pg.BarGraphItem] = []
        self.suites: list[str] = []
        self.legend = pg.LegendItem(labelTextColor=FOREGROUND, labelTextSize="8pt", verSpacing=-6)
        self.ci.addItem(self.legend, row=0, col=1)
        self.ci.layout.setColumnStretchFactor(0, 1)
        self.show_scores([], [], [], [])

    def show_scores(
        self, models: list[str], colors: list[QColor], suites: list[str], scores: list[list[float]]
    ) -> None:
        plot = self.plot
        for item in self.bars:
            plot.removeItem(item)
        self.bars = []
        self.legend.clear()
        n_models, n_suites = len(models), len(suites)
        width = 0.8 / max(n_models, 1)
        for m, (name, color) in enumerate(zip(models, colors)):
            xs = [s + (m - (n_models - 1) / 2) * width for s in range(n_suites)]
            item = pg.BarGraphItem(
                x=xs,
                height=[scores[m][s] for s in range(n_suites)],
                width=width * 0.92,
                brush=pg.mkBrush(color),
                pen=pg.mkPen(color.darker(130)),
                name=name,
            )
            plot.addItem(item)
            self.legend.addItem(item, name)  # whole: the legend sizes to its longest name
            self.bars.append(item)
        self.legend.setVisible(bool(models))
        self.suites = list(suites)
        self.fit_suite_labels()
        top = max([1.0, *(v for row in scores for v in row)])
        plot.setYRange(0, top * 1.05, padding=0)
        plot.setXRange(-0.55, max(n_suites, 1) - 0.45, padding=0)
        plot.setTitle(
            "Scores per suite" if models else "Scores per suite — run an evaluation", color=FOREGROUND, size="10pt"
        )

    def fit_suite_labels(self) -> None:
        """Each suite's name under its group: whole if it fits the group's width, else on two lines broken
        after a ``-`` / ``_`` / space, else cut (… at the end): pyqtgraph hides a label that would reach past
        the axis, so on a narrow chart the outer suites lost theirs."""
        axis = self.plot.getAxis("bottom")
        slot = self.plot.getViewBox().width() / (max(len(self.suites), 1) + 0.1)  # the x range is n + 0.1 wide
        metrics = QFontMetrics(axis.style["tickFont"] or self.font())
        room = max(int(slot) - 8, metrics.horizontalAdvance("a…z"))
        axis.setTicks([[(s, _fit_label(name, metrics, room)) for s, name in enumerate(self.suites)]])

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        if hasattr(self, "suites"):  # not while the base class is still being set up
            self.fit_suite_labels()


class ScoresView(QWidget):
    """The scores of the evaluations run so far: ``result`` (rows kept across runs on the same suites)
    and ``kinds`` (model source -> base, agent, merged, variant, other: colours and the best-merged mark)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.result: EvalResult | None = None
        self.kinds: dict[str, str] = {}
        self.table = QTableWidget(0, 0)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        self.table.verticalHeader().setDefaultSectionSize(self.table.fontMetrics().height() + 8)
        self.table.setToolTip("Mean reward per suite; bold on green: the best merged model on that suite")
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
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(results, 1)
        layout.addLayout(export_row)

    def show_result(self, result: EvalResult, kinds: dict[str, str] | None = None) -> None:
        """Show ``result``; rows of models scored before on the same suites stay (same source: replaced)."""
        self.kinds.update(kinds or {})
        for model in result.models:
            if model.source not in self.kinds:
                self.kinds[model.source] = "merged" if (Path(model.source) / MERGE_REPORT).is_file() else "other"
        old = self.result
        if old is not None and _suite_keys(old.suites) == _suite_keys(result.suites):
            new_sources = {m.source for m in result.models}
            keep = [i for i, m in enumerate(old.models) if m.source not in new_sources]
            models = [old.models[i] for i in keep] + list(result.models)
            scores = [old.scores[i] for i in keep] + [list(r) for r in result.scores]
            order = sorted(range(len(models)), key=lambda i: _KIND_ORDER.get(self.kinds.get(models[i].source, ""), 9))
            result = EvalResult(
                [models[i] for i in order],
                list(result.suites),
                [scores[i] for i in order],
                old.seconds + result.seconds,
                result.device,
                result.versions,
                generated_tokens=old.generated_tokens + result.generated_tokens,
            )
        self.result = result
        self._fill_table()

    def best_merged(self) -> list[int | None]:
        """Per suite and then for the mean: the row of the best merged model (None without merged rows)."""
        result = self.result
        if result is None:
            return []
        merged = [i for i, m in enumerate(result.models) if self.kinds.get(m.source) in MERGED_KINDS]
        columns = [[row[s] for row in result.scores] for s in range(len(result.suites))]
        columns.append([_mean(row) for row in result.scores])
        return [max(merged, key=lambda i: col[i]) if merged else None for col in columns]

    def model_colors(self) -> list[QColor]:
        assert self.result is not None
        """Grey for the base; the agents their Analysis colours; every other model the next palette colour
        after the agents': no two models share a colour."""
        kinds = [self.kinds.get(model.source, "other") for model in self.result.models]
        agents = kinds.count("agent")
        colors, agent, other = [], 0, 0
        for kind in kinds:
            if kind == "base":
                colors.append(QColor(BASE_COLOR))
            elif kind == "agent":
                colors.append(model_color(agent))
                agent += 1
            else:
                colors.append(model_color(agents + other))
                other += 1
        return colors

    def _fill_table(self) -> None:
        result = self.result
        assert result is not None
        heads = [f"{s.name}\n({s.examples})" for s in result.suites] + ["mean"]  # two lines: narrower columns
        self.table.clear()
        self.table.setRowCount(len(result.models))
        self.table.setColumnCount(len(heads) + 1)
        self.table.setHorizontalHeaderLabels(["model", *heads])
        best = self.best_merged()
        bold = QFont(self.table.font())
        bold.setBold(True)
        colors = self.model_colors()
        for r, (model, row) in enumerate(zip(result.models, result.scores)):
            name = QTableWidgetItem(model.name)
            name.setForeground(QBrush(colors[r].darker(110)))
            name.setToolTip(f"{KIND_LABELS.get(self.kinds.get(model.source, 'other'))}: {model.source}")
            self.table.setItem(r, 0, name)
            for c, value in enumerate([*row, _mean(row)]):
                item = QTableWidgetItem(f"{value:.3f}")
                item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                if best[c] == r:
                    item.setFont(bold)
                    item.setBackground(QBrush(BEST_BRUSH))
                    item.setToolTip("best merged model" + (" on this suite" if c < len(row) else " on average"))
                self.table.setItem(r, c + 1, item)
        self.chart.show_scores([m.name for m in result.models], colors, [s.name for s in result.suites], result.scores)
        marked = (
            "Bold on green: the best merged model per suite and on average. "
            if any(b is not None for b in best)
            else ""
        )
        self.note.setText(
            f"{marked}Mean reward over {sum(s.examples for s in result.suites)} examples, greedy, on {result.device}."
        )

    def table_rows(self) -> list[list[str]]:
        """The table as CSV rows: a header, one row per model, then the best merged model per column."""
        result = self.result
        assert result is not None
        rows = [["model", "kind", "source", *(s.name for s in result.suites), "mean"]]
        for model, row in zip(result.models, result.scores):
            rows.append(
                [
                    model.name,
                    self.kinds.get(model.source, "other"),
                    model.source,
                    *(repr(round(v, 6)) for v in row),
                    repr(round(_mean(row), 6)),
                ]
            )
        best = self.best_merged()
        if any(b is not None for b in best):
            rows.append(["best merged", "", "", *(result.models[b].name if b is not None else "" for b in best)])
        return rows

    def export_csv(self, path: Path) -> Path:
        path = Path(path)
        with open(path, "w", newline="", encoding="utf-8") as f:
            csv.writer(f).writerows(self.table_rows())
        return path

    def export_png(self, path: Path) -> Path:
        return export_png(self.chart, Path(path))


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
