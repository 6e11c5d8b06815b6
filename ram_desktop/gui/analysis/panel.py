"""Analysis: charts of the probe, the ρ–λ table and the RAM+ rounding warning."""

from __future__ import annotations

import html
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QBrush
from PySide6.QtWidgets import (
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

from ...core import SURVIVAL_DTYPES, MergeMethod, ProbeReport, survival_histograms, survival_share
from ..session import Session, Topic
from ..widgets.common import StaleBanner
from .charts import HEAT_SCALE, ColourScale, DensityChart, LayerDensityChart, OverlapPies, agent_color
from .inspect_charts import IntersectionChart, PairsChart, UlpHistogram, WouldKeepChart
from .module_heatmaps import ModuleHeatmaps
from .tensor_table import TensorTable
from .which_method import WhichMethodView

TABLE_COLUMNS = ["Agent", "Density", "Unique", "Shared", "ρ = shared/unique", "λ", "Rescale kept"]
SAFETENSORS_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}
WARN_BELOW = 0.5  # warn when less than half of the rescaled unique updates survive rounding


def survival_dtype(out_dtype: str, base_dtype: str | None) -> str | None:
    """The dtype the rescale is rounded to: the chosen one, or the base's for "base"."""
    if out_dtype != "base":
        return out_dtype if out_dtype in SURVIVAL_DTYPES else None
    return SAFETENSORS_DTYPES.get(base_dtype or "")


def rescale_survival(
    report: ProbeReport, lambdas: list[float] | None, dtype: str | None
) -> tuple[list[float | None], float | None]:
    """Per agent: share of unique elements whose RAM+ rescale survives rounding to ``dtype``; and the
    share over all agents' unique elements together (None when nothing is rescaled)."""
    if lambdas is None or dtype is None or dtype not in survival_histograms(report):
        return [None] * len(report.agents), None
    shares = [survival_share(report, t, dtype, lam) if lam > 1.0 else None for t, lam in enumerate(lambdas)]
    weighted = [(s, a.unique) for s, a in zip(shares, report.agents) if s is not None and a.unique]
    total = sum(u for _, u in weighted)
    return shares, (sum(s * u for s, u in weighted) / total if total else None)


@dataclass(frozen=True)
class Chart:
    """One analysis chart: the panel shows it in a tab, the chart saver writes it as ``<name>.png``.
    ``attr``: the panel's attribute holding it; ``make()``: its widget; ``overview``: drawn at once and saved
    into every merge's output folder (the others are drawn when their tab is shown, saved by File ▸ Export
    charts); ``picture(widget)``: the part saved as the PNG (default the whole widget)."""

    name: str
    attr: str
    title: str
    tip: str
    make: Callable[[], QWidget]
    overview: bool = False
    picture: Callable[[Any], QWidget] = lambda widget: widget
    explain: str = ""  # how to read it, for Help ▸ Reading the charts (beyond the tip)
    scale: ColourScale | None = None  # its colour map, whose words Help adds to ``explain``

    def reading(self) -> str:
        """How to read it (Help): ``explain`` and, for a colour-mapped chart, what its colours mean."""
        if self.scale is None:
            return self.explain
        s = self.scale
        return (
            f"{self.explain} Colour: {s.words()} (the bar beside the maps): the nearer a cell is to {s.high}, "
            f"the more of that module in that layer the agent changed (or the larger its unique share); "
            f"{s.low}: little or none."
        ).strip()


# The analysis charts, in tab order: the one list the panel and the chart saver read. Adding a chart is one
# entry here.
CHARTS: tuple[Chart, ...] = (
    Chart(
        "density",
        "density",
        "Density",
        "Share of all elements each agent changes; dark = only this agent changes it",
        DensityChart,
        overview=True,
        explain="Each bar is one agent. Its height is the share of all the model's numbers that the agent's training changed by more than ε. The dark part is what only this agent changed; the light part is changed by at least one other agent too. RAM keeps the dark part whole and averages the light part.",
    ),
    Chart(
        "overlap",
        "overlap",
        "Overlap",
        "For each agent: how many of its updates no other agent touches (unique) "
        "and how many it shares with 1, 2 ... other agents",
        OverlapPies,
        overview=True,
        explain="One pie per agent: of the numbers it changed, the slice no other agent touched (unique), the slice one other agent also changed, two others, and so on.",
    ),
    Chart(
        "heatmap",
        "heatmap",
        "Layers × modules",
        "Where each agent learned: a layer × module heat map per agent of density or unique share; "
        "hover a cell for its numbers",
        ModuleHeatmaps,
        explain="One map per agent. Rows are the model's layers (\"other\" holds what is outside them: embeddings, the output head, the final norm); columns are the kinds of module. q, k, v, o: the attention's query, key, value and output projections; gate, up, down: the feed-forward block; norm columns: the layer norms. A blank (white) cell: that layer has no module of that kind. Hover a cell for its numbers.",
        scale=HEAT_SCALE,
    ),
    Chart(
        "tensors",
        "tensors",
        "Tensors",
        "Every tensor with density and unique share per agent; sortable, filterable",
        TensorTable,
        explain="One row per weight tensor: its layer, module, size and, for each agent, the share it changed and the share of that which is unique. Click a header to sort; type in the filter box to narrow by name; hover a name for the whole of it; drag the column's edge to widen it.",
    ),
    Chart(
        "intersections",
        "intersections",
        "Sets",
        "Which sets of agents update the same elements (UpSet-style)",
        IntersectionChart,
        explain="Each bar counts the numbers changed by exactly the set of agents marked by the dots below it. A coloured bar: one agent alone (its unique changes); grey: shared.",
    ),
    Chart(
        "pairs",
        "pairs",
        "Signs",
        "For every pair of agents: elements both update, and how many agree in sign",
        PairsChart,
        explain="For each pair of agents, the numbers both changed: green where they moved the same way, red where they moved opposite ways. Mostly green: averaging the shared changes loses little.",
    ),
    Chart(
        "ulps", "ulps", "Ulps", "How large each agent's updates are, in ulps of the base value's dtype", UlpHistogram
    ),
    Chart(
        "would-keep",
        "would_keep",
        "Would keep",
        "Before merging: the share of each agent's updates each method keeps; follows the method form as you change it",
        WouldKeepChart,
        explain="For each method, the share of each agent's change that the merged model carries. The method "
        "chosen in section 3 is highlighted, with its values as you type them (per-agent values too); a method "
        "whose share cannot be worked out before merging says why under the chart. Light bars marked ≈ are "
        "estimates.",
    ),
    Chart(
        "which-method",
        "which_method",
        "Which method?",
        "What the numbers imply for the choice of method, and the methods worth searching first",
        WhichMethodView,
        explain="Each agent's unique share, the sign agreement on shared elements, ρ against α and how much of "
        "RAM+'s rescale a bfloat16 output keeps, each with what it implies (docs/methods.md, Which method?). "
        "Rules of thumb, not a verdict: score the merges.",
    ),
    Chart(
        "layers",
        "layers",
        "Per layer",
        "Density per transformer layer or module kind, one line per agent",
        LayerDensityChart,
        overview=True,
        picture=lambda chart: chart.graphics,
        explain="The share each agent changed, per layer (or per module kind), one line per agent.",
    ),
)


def reading_the_charts() -> str:
    """Help ▸ Reading the charts: every chart of the registry, what it shows and how to read it (HTML)."""
    parts = ["<h2>Reading the charts</h2><p>Every agent keeps one colour in every chart and table.</p>"]
    for chart in CHARTS:
        parts.append(f"<h3>{html.escape(chart.title)}</h3><p>{html.escape(chart.tip)}.</p>")
        if chart.reading():
            parts.append(f"<p>{html.escape(chart.reading())}</p>")
    return "".join(parts)


@runtime_checkable
class ReportView(Protocol):
    """What each chart or table in the panel's tabs is besides a widget: it shows a probe report."""

    def show_report(self, report: ProbeReport | None) -> None: ...


def _show(view: QWidget, report: ProbeReport | None) -> None:
    assert isinstance(view, ReportView)  # every tab's view shows reports
    view.show_report(report)


class AnalysisPanel(QWidget):
    use_float32 = Signal()
    drawn = Signal()  # the queued charts of the report shown are drawn (the window is idle again)
    # the charts (made from ``CHARTS``)
    density: DensityChart
    overlap: OverlapPies
    heatmap: ModuleHeatmaps
    tensors: TensorTable
    intersections: IntersectionChart
    pairs: PairsChart
    ulps: UlpHistogram
    would_keep: WouldKeepChart
    layers: LayerDensityChart

    def __init__(self, session: Session | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.session = session
        if session is not None:  # the analysis shown is the session's
            session.watch(Topic.ANALYSIS, lambda report: self.show_report(report, session.analysis_key))
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.placeholder = QLabel(
            "Add a base and agents, then click <b>Analyze</b> to see how dense and how "
            "overlapping their task vectors are."
        )
        self.placeholder.setWordWrap(True)
        self.placeholder.setStyleSheet("color: #666; padding: 4px;")
        layout.addWidget(self.placeholder)
        self.tabs = QTabWidget()
        self.charts: list[QWidget] = []
        self.registry = CHARTS  # what the chart saver writes, too
        for index, chart in enumerate(self.registry):  # one tab per chart, in the registry's order
            widget = chart.make()
            setattr(self, chart.attr, widget)
            self.tabs.addTab(widget, chart.title)
            self.tabs.setTabToolTip(index, chart.tip)
            self.charts.append(widget)
        self.tabs.setUsesScrollButtons(True)
        # the overview is drawn at once; every other chart when its tab is first shown
        self.eager = {getattr(self, c.attr) for c in self.registry if c.overview}
        self._deferred: dict[QWidget, ProbeReport | None] = {}
        self.tabs.currentChanged.connect(self._tab_shown)
        # while held (the window runs a merge, see set_held), charts not on screen wait: building one is
        # Python-heavy and would compete with the worker thread for the interpreter, stalling the window
        self.held = False
        layout.addWidget(self.tabs, 3)

        self.table = QTableWidget(0, len(TABLE_COLUMNS))
        self.table.setHorizontalHeaderLabels(TABLE_COLUMNS)
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.setSelectionMode(QTableWidget.SelectionMode.NoSelection)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        tips = [
            "Agent name",
            "Share of all elements the agent updates (|τ| > ε)",
            "Elements only this agent updates: RAM keeps them whole, RAM+ scales them by λ",
            "Elements this agent and at least one other update: averaged over the active agents",
            "Overlap-unique ratio ρ = shared / unique (paper eq. 5)",
            "Scale of this agent's unique updates for the chosen method and parameters",
            "Share of the agent's unique elements whose rescaled value survives rounding to the output dtype",
        ]
        for col, tip in enumerate(tips):
            header_item = self.table.horizontalHeaderItem(col)
            assert header_item is not None  # setHorizontalHeaderLabels made it
            header_item.setToolTip(tip)
        self.table.setMinimumHeight(90)
        layout.addWidget(self.table, 1)

        self.warning = QWidget()
        row = QHBoxLayout(self.warning)
        row.setContentsMargins(8, 4, 8, 4)
        self.warning.setObjectName("rounding_warning")  # the box only: its button keeps its own look and size
        self.warning.setStyleSheet(
            "#rounding_warning { background: #fff4ce; border: 1px solid #e0c060; border-radius: 4px; }"
        )
        self.warning_text = QLabel()
        self.warning_text.setWordWrap(True)
        self.warning_text.setStyleSheet("border: none; color: #5c4400;")
        self.warning_fix = QPushButton("Use float32 output")
        self.warning_fix.clicked.connect(self.use_float32.emit)
        row.addWidget(self.warning_text, 1)
        row.addWidget(self.warning_fix)
        self.warning.hide()
        layout.addWidget(self.warning)
        self.stale = StaleBanner("Analyze again")  # at the top, where the user looks (the window's session says)
        layout.insertWidget(0, self.stale)

        self._chart_queue: list[tuple[QWidget, ProbeReport | None]] = []
        # the panel's own timer (not QTimer.singleShot): it dies with the panel, so a queue left behind
        # by a closed window never draws into deleted charts
        self._chart_timer = QTimer(self)
        self._chart_timer.setSingleShot(True)
        self._chart_timer.timeout.connect(self._next_chart)
        self.report: ProbeReport | None = None
        self.report_key: tuple | None = None  # what the report measured (sources and ε): the window's key
        self.lambdas: list[float] | None = None
        self.survival: list[float | None] = []
        self.overall_survival: float | None = None
        self.tabs.setEnabled(False)

    def show_report(self, report: ProbeReport | None, key: tuple | None = None) -> None:
        """Show a report (measured on ``key``): the visible chart now, the others one per event-loop turn
        (building a pyqtgraph chart takes tens of milliseconds; the window keeps answering in between)."""
        self.report, self.report_key = report, key
        self.placeholder.setVisible(report is None)
        self.tabs.setEnabled(report is not None)
        charts = self.charts
        current = self.tabs.currentIndex()
        _show(charts[current], report)
        # the overview charts are drawn ahead, one per turn; the inspection views when their tab is
        # first shown or they are exported (each draw costs Qt calls: see charts._label)
        self._chart_queue = [(c, report) for i, c in enumerate(charts) if i != current and c in self.eager]
        self._deferred = {c: report for i, c in enumerate(charts) if i != current and c not in self.eager}
        if self.would_keep in self._deferred:
            self.would_keep.set_report(report)  # its numbers follow the method form even while hidden
        self._chart_timer.start(0)

    def _next_chart(self) -> None:
        if self._chart_queue:
            if self.held:
                self._chart_timer.start(100)
                return
            chart, report = self._chart_queue.pop(0)
            if report is self.report:
                _show(chart, report)
        if self._chart_queue:
            self._chart_timer.start(0)
        else:
            self.drawn.emit()

    def set_held(self, held: bool) -> None:
        """Hold the drawing of charts not on screen (while a merge runs or its charts are saved)."""
        self.held = held

    def _tab_shown(self, index: int) -> None:
        """A chart still waiting in the queue is drawn as soon as its tab is shown."""
        widget = self.tabs.widget(index)
        if widget is None:  # index -1: no tab
            return
        self._draw_deferred(widget)
        for i, (chart, report) in enumerate(self._chart_queue):
            if chart is widget:
                del self._chart_queue[i]
                if report is self.report:
                    _show(chart, report)
                return

    def _draw_deferred(self, widget: QWidget) -> bool:
        for chart in list(self._deferred):
            if chart is widget or chart.isAncestorOf(widget):
                report = self._deferred.pop(chart)
                if report is self.report:
                    _show(chart, report)
                return True
        ensure = getattr(widget, "ensure_current", None)
        return bool(ensure()) if ensure is not None else False

    def draw_now(self, widget: QWidget) -> bool:
        """Draw the queued chart that is or holds ``widget`` now; False when it is already drawn."""
        if self._draw_deferred(widget):
            return True
        for i, (chart, report) in enumerate(self._chart_queue):
            if chart is widget or chart.isAncestorOf(widget):
                del self._chart_queue[i]
                if report is self.report:
                    _show(chart, report)
                return True
        return False

    def charts_ready(self) -> bool:
        return not self._chart_queue

    def is_current(self, key: tuple) -> bool:
        """A report measured on ``key`` is shown."""
        return self.report is not None and self.report_key == key

    def follow_sources(self, key: tuple, names: list[str]) -> bool:
        """The sources are now ``key``: a rename relabels the report (same statistics). False when the report
        shown measured other sources (the window marks it stale)."""
        if self.report is None:
            return True
        if key != self.report_key:
            return False
        if self.report.names != names:
            renamed = self.report.renamed(names, [a.source for a in self.report.agents])
            if self.session is not None:
                self.session.relabel_analysis(renamed)
            else:
                self.show_report(renamed, key)
        return True

    def set_stale(self, message: str | None) -> None:
        """Why the analysis shown is out of date (the banner at the top), or None."""
        self.stale.set_stale(message)

    def update_method(self, method: MergeMethod, params: dict, out_dtype: str, base_dtype: str | None) -> None:
        """Recompute λ from the cached probe (instant) and refresh the table and the rounding warning."""
        report = self.report
        if report is None:
            self.table.setRowCount(0)
            self.warning.hide()
            return
        try:
            self.lambdas = method.analysis.lambdas(params, report) if method.analysis.lambdas else None
        except (ValueError, KeyError, TypeError, ZeroDivisionError):
            self.lambdas = None
        self.would_keep.set_method(method.name, params)
        self.ulps.set_dtype(SAFETENSORS_DTYPES.get(base_dtype or ""))
        dtype = survival_dtype(out_dtype, base_dtype)
        self.survival, self.overall_survival = rescale_survival(report, self.lambdas, dtype)
        self.table.setRowCount(len(report.agents))
        for t, a in enumerate(report.agents):
            lam = self.lambdas[t] if self.lambdas else None
            share = self.survival[t]
            values = [
                a.name,
                f"{100 * a.density:.2f} %",
                f"{a.unique:,}",
                f"{a.shared:,}",
                "∞" if math.isinf(a.rho) else f"{a.rho:.3f}",
                f"{lam:.4f}" if lam is not None else "—",
                f"{100 * share:.1f} % in {dtype}" if share is not None else "—",
            ]
            for col, text in enumerate(values):
                item = QTableWidgetItem(text)
                if col == 0:
                    item.setForeground(QBrush(agent_color(a.name)))
                    font = item.font()
                    font.setBold(True)
                    item.setFont(font)
                else:
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                if col == 6 and share is not None and share < WARN_BELOW:
                    item.setForeground(QBrush(Qt.GlobalColor.darkRed))
                self.table.setItem(t, col, item)
        rows = min(len(report.agents), 6)
        self.table.setMinimumHeight(self.table.horizontalHeader().height() + rows * self.table.rowHeight(0) + 6)
        overall = self.overall_survival
        if overall is not None and overall < WARN_BELOW:
            self.warning_text.setText(
                f"<b>{method.label} rescaling will mostly round away.</b> In {dtype} output only "
                f"{100 * overall:.1f} % of the rescaled unique updates differ from plain RAM (RL updates are often "
                f"one or two {dtype} ulps). Choose float32 output to keep the rescale."
            )
            self.warning_fix.setVisible(dtype != "float32")
            self.warning.show()
        else:
            self.warning.hide()
