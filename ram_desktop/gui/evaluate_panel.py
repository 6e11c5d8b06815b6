"""The Evaluate step: suites, the models to score, a background evaluation (progress, ETA, Cancel) and
the scores as a table and a grouped bar chart, both exportable (SPEC sections 3 and 6).

Suites open in the background (reading a JSONL file runs no code); a python scorer's file is shown
and runs only inside the evaluation the user starts. The evaluation writes ``eval.json`` and the
model card's Evaluation section into every merged model's folder it scored, and nothing when it is
cancelled or fails.
"""

from __future__ import annotations

import csv
import gc
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QBrush, QColor, QFont, QFontMetrics
from PySide6.QtWidgets import (QAbstractItemView, QComboBox, QFileDialog, QHBoxLayout, QHeaderView,
                               QLabel, QListWidget, QListWidgetItem, QPushButton,
                               QSpinBox, QSplitter, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget)

from ..core.demo import demo_suites
from ..core.errors import InputError
from ..evaluate import EvalResult, ModelRef, Suite, SuiteSummary, evaluate, load_suite
from ..evaluate.card import MERGE_REPORT, record_evaluation
from .charts import FOREGROUND, PALETTE, export_png
from .jobs import JobController, JobState
from .run_bar import PanelJob, RunBar, duration_text
from .worker import Job

log = logging.getLogger("ram_desktop")
BUILTIN_SCORERS = ("exact", "contains", "number", "regex:")
MERGED_KINDS = ("merged", "variant")
KIND_LABELS = {"base": "base model", "agent": "agent", "merged": "merged model", "variant": "compare variant",
               "other": "model folder"}
MERGED_COLORS = ["#111111", "#6d4c41", "#3949ab", "#00897b", "#c0ca33", "#d81b60", "#546e7a", "#fb8c00"]
BEST_BRUSH = QColor("#e3f2e1")


@dataclass(frozen=True)
class ModelEntry:
    """A model the user may score: its name in tables, its folder (or Hub id) and what it is."""

    name: str
    source: str
    kind: str  # base | agent | merged | variant | other


def import_transformers(sources: list[str]) -> None:
    """Import what an evaluation of ``sources`` will use (in the worker, before it starts) with the cyclic
    garbage collector paused. ``transformers``, the models' modules and what generation pulls in (torch's
    dynamo and distributed packages, sympy) make some 350 000 objects, and every full collection that
    triggers scans the whole process while holding the GIL: 0.2-0.6 s in which the window cannot draw.
    Frozen afterwards, these objects stay out of every later collection (the evaluation freezes in the
    same way what exists before its first model, so its own collections stay small). Only a warm-up: a folder transformers cannot read is reported by the evaluation itself."""
    import importlib.util

    if importlib.util.find_spec("transformers") is None:
        return  # the evaluation says how to install it
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        import transformers.generation.utils  # noqa: F401
        from transformers import AutoConfig
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

        for source in sources:
            if (Path(source) / "config.json").is_file():
                try:
                    MODEL_FOR_CAUSAL_LM_MAPPING[type(AutoConfig.from_pretrained(source))]
                except Exception:  # noqa: BLE001 — the evaluation refuses it with a message naming the folder
                    pass
    finally:
        gc.freeze()  # long-lived: kept out of every later collection (enabling would start a full one now)
        if was_enabled:
            gc.enable()


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' if n != 1 else ''}"


LEGEND_TEXT_WIDTH = 120  # px: a longer model name keeps its start and end (the table beside has it whole)


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
        plot.getAxis("bottom").setHeight(34)
        self.bars: list[pg.BarGraphItem] = []
        self.suites: list[str] = []
        self.legend = pg.LegendItem(labelTextColor=FOREGROUND, labelTextSize="8pt", verSpacing=-6)
        self.ci.addItem(self.legend, row=0, col=1)
        self.ci.layout.setColumnStretchFactor(0, 1)
        self.show_scores([], [], [], [])

    def show_scores(self, models: list[str], colors: list[QColor], suites: list[str],
                    scores: list[list[float]]) -> None:
        plot = self.plot
        for item in self.bars:
            plot.removeItem(item)
        self.bars = []
        self.legend.clear()
        n_models, n_suites = len(models), len(suites)
        width = 0.8 / max(n_models, 1)
        legend_metrics = QFontMetrics(self.font())  # long compare-variant names would take the bars' room
        for m, (name, color) in enumerate(zip(models, colors)):
            xs = [s + (m - (n_models - 1) / 2) * width for s in range(n_suites)]
            item = pg.BarGraphItem(x=xs, height=[scores[m][s] for s in range(n_suites)], width=width * 0.92,
                                   brush=pg.mkBrush(color), pen=pg.mkPen(color.darker(130)), name=name)
            plot.addItem(item)
            self.legend.addItem(item, legend_metrics.elidedText(name, Qt.TextElideMode.ElideMiddle, LEGEND_TEXT_WIDTH))
            self.bars.append(item)
        self.legend.setVisible(bool(models))
        self.suites = list(suites)
        self.fit_suite_labels()
        top = max([1.0, *(v for row in scores for v in row)])
        plot.setYRange(0, top * 1.05, padding=0)
        plot.setXRange(-0.55, max(n_suites, 1) - 0.45, padding=0)
        plot.setTitle("Scores per suite" if models else "Scores per suite — run an evaluation", color=FOREGROUND,
                      size="10pt")

    def fit_suite_labels(self) -> None:
        """Each suite's name under its group, cut to the group's width (… at the end): pyqtgraph
        hides a label that would reach past the axis, so on a narrow chart the outer suites lost theirs."""
        axis = self.plot.getAxis("bottom")
        slot = self.plot.getViewBox().width() / (max(len(self.suites), 1) + 0.1)  # the x range is n + 0.1 wide
        metrics = QFontMetrics(axis.style["tickFont"] or self.font())
        room = max(int(slot) - 8, metrics.horizontalAdvance("a…z"))
        axis.setTicks([[(s, metrics.elidedText(name, Qt.TextElideMode.ElideRight, room))
                        for s, name in enumerate(self.suites)]])

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        if hasattr(self, "suites"):  # not while the base class is still being set up
            self.fit_suite_labels()


class EvaluatePanel(QWidget):
    """Signals: ``evaluation_finished(status)`` ("done", "cancelled", "failed"); ``error(str)`` and
    ``info(str)`` for the window's message bar. The evaluation runs through the window's job controller
    ``jobs`` (state ``EVALUATING``), so nothing else runs meanwhile."""

    evaluation_finished = Signal(str)
    suites_loaded = Signal()
    error = Signal(str)
    info = Signal(str)

    def __init__(self, jobs: JobController, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.jobs = jobs
        self.suites: list[Suite] = []
        self.result: EvalResult | None = None
        self.kinds: dict[str, str] = {}  # model source -> kind, for colours and the best-merged mark
        self.suite_job: Job | None = None
        self.device = "auto"  # where models are scored: the method form's device (set_device)
        self.browse_dir = str(Path.home())
        self._pending_result: tuple[EvalResult, list[Path]] | None = None

        # suites
        self.suite_table = QTableWidget(0, 4)
        self.suite_table.setHorizontalHeaderLabels(["Suite", "Examples", "Scorer", "Scored by"])
        self.suite_table.verticalHeader().setVisible(False)
        self.suite_table.setSelectionBehavior(QAbstractItemView.SelectRows)
        header = self.suite_table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeToContents)
        header.setSectionResizeMode(1, QHeaderView.ResizeToContents)
        header.setSectionResizeMode(2, QHeaderView.Interactive)
        header.setStretchLastSection(True)
        self.suite_table.setColumnWidth(2, 110)
        self.suite_table.setToolTip("Tick the suites to run. Scorer: exact, contains, number, regex:PATTERN or "
                                    "python:FILE.py:FUNCTION (a TRL reward function; it runs only when you "
                                    "click Evaluate)")
        self.add_file_button = QPushButton("Add JSONL…")
        self.add_file_button.setToolTip("A JSONL file: one {\"prompt\": ..., \"answer\": ...} per line")
        self.add_folder_button = QPushButton("Add suite folder…")
        self.add_folder_button.setToolTip("A folder with data.jsonl and suite.yaml")
        self.remove_suite_button = QPushButton("Remove")
        suite_buttons = QHBoxLayout()
        for b in (self.add_file_button, self.add_folder_button, self.remove_suite_button):
            suite_buttons.addWidget(b)
        suite_buttons.addStretch(1)
        suites_box = QWidget()
        suites_layout = QVBoxLayout(suites_box)
        suites_layout.setContentsMargins(0, 0, 0, 0)
        suites_layout.addWidget(_caption("Suites"))
        suites_layout.addWidget(self.suite_table, 1)
        suites_layout.addLayout(suite_buttons)

        # models
        self.model_list = QListWidget()
        self.model_list.setToolTip("Tick the models to score")
        self.add_model_button = QPushButton("Add model folder…")
        self.add_model_button.setToolTip("Any model folder with config.json, weights and a tokenizer")
        self.batch_size = QSpinBox()
        self.batch_size.setRange(1, 512)
        self.batch_size.setValue(8)
        self.batch_size.setToolTip("Prompts generated together (left-padded)")
        self.limit = QSpinBox()
        self.limit.setRange(0, 1_000_000)
        self.limit.setSpecialValueText("all")
        self.limit.setToolTip("Score only the first N examples of each suite (all: every example)")
        options_row = QHBoxLayout()
        options_row.addWidget(self.add_model_button)
        options_row.addStretch(1)
        options_row.addWidget(QLabel("Batch"))
        options_row.addWidget(self.batch_size)
        options_row.addWidget(QLabel("Examples"))
        options_row.addWidget(self.limit)
        models_box = QWidget()
        models_layout = QVBoxLayout(models_box)
        models_layout.setContentsMargins(0, 0, 0, 0)
        models_layout.addWidget(_caption("Models to score"))
        models_layout.addWidget(self.model_list, 1)
        models_layout.addLayout(options_row)

        setup = QSplitter(Qt.Horizontal)
        setup.addWidget(suites_box)
        setup.addWidget(models_box)
        setup.setStretchFactor(0, 3)
        setup.setStretchFactor(1, 2)
        self.run = RunBar("Evaluate")
        self.run.start_button.setToolTip("Generate greedily with every ticked model on every ticked suite and score")

        # results
        self.table = QTableWidget(0, 0)
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        self.table.verticalHeader().setDefaultSectionSize(self.table.fontMetrics().height() + 8)
        self.table.setToolTip("Mean reward per suite; bold on green: the best merged model on that suite")
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
        self.results_splitter = results = QSplitter(Qt.Horizontal)
        results.addWidget(self.table)
        results.addWidget(self.chart)
        results.setStretchFactor(0, 0)
        results.setStretchFactor(1, 1)
        results_box = QWidget()
        results_layout = QVBoxLayout(results_box)
        results_layout.setContentsMargins(0, 0, 0, 0)
        results_layout.addWidget(results, 1)
        results_layout.addLayout(export_row)

        self.splitter = QSplitter(Qt.Vertical)
        top = QWidget()
        top_layout = QVBoxLayout(top)
        top_layout.setContentsMargins(0, 0, 0, 0)
        top_layout.addWidget(setup, 1)
        top_layout.addWidget(self.run)
        self.splitter.addWidget(top)
        self.splitter.addWidget(results_box)
        self.splitter.setStretchFactor(0, 2)
        self.splitter.setStretchFactor(1, 3)
        self.splitter.setSizes([230, 290])
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.splitter)

        self.add_file_button.clicked.connect(self._add_files_dialog)
        self.add_folder_button.clicked.connect(self._add_folder_dialog)
        self.remove_suite_button.clicked.connect(self._remove_selected_suites)
        self.add_model_button.clicked.connect(self._add_model_dialog)
        self.task = PanelJob(jobs, JobState.EVALUATING, self.run, self)
        self.task.failed.connect(self._failed)
        self.task.cancelled.connect(self._cancelled)
        self.task.finished.connect(self.evaluation_finished)
        jobs.state_changed.connect(self._update_actions)
        self.run.start_button.clicked.connect(self.start)
        self.run.cancel_button.clicked.connect(self.cancel)
        self.export_csv_button.clicked.connect(self._export_csv_dialog)
        self.export_png_button.clicked.connect(self._export_png_dialog)
        self.model_list.itemChanged.connect(lambda _: self._update_actions())
        self.suite_table.itemChanged.connect(lambda _: self._update_actions())
        self._update_actions()

    # --- suites -------------------------------------------------------------------------------
    def add_suites(self, paths: list[str | Path]) -> None:
        """Open suites in the background; each lands as a ticked row (errors go to the message bar)."""
        paths = [Path(p) for p in paths]
        if not paths:
            return

        def opened(loaded: list[Suite]) -> None:
            for suite in loaded:
                self._add_suite_row(suite)
            self.suites_loaded.emit()

        self.suite_job = Job(lambda reporter: [load_suite(p) for p in paths], self)
        self.suite_job.succeeded.connect(opened)
        self.suite_job.failed.connect(self.error.emit)
        self.suite_job.crashed.connect(lambda m, d: self.error.emit(f"could not open the suite: {m}"))
        self.suite_job.finished.connect(self._suite_job_done)
        self._update_actions()
        self.suite_job.start()

    def _suite_job_done(self) -> None:
        self.suite_job = None
        self._update_actions()

    def preload_demo(self, folder: Path) -> list[Path]:
        """Add the suites a demo folder's ``demo.json`` names (none when it has no manifest)."""
        try:
            paths = demo_suites(folder)
        except InputError as e:
            self.error.emit(str(e))
            return []
        known = {s.source for s in self.suites}
        paths = [p for p in paths if p not in known]
        self.add_suites(paths)
        return paths

    def _add_suite_row(self, suite: Suite) -> None:
        if any(s.source == suite.source for s in self.suites):
            return
        self.suite_table.blockSignals(True)
        row = self.suite_table.rowCount()
        self.suite_table.insertRow(row)
        name = QTableWidgetItem(suite.name)
        name.setFlags(Qt.ItemIsEnabled | Qt.ItemIsSelectable | Qt.ItemIsUserCheckable)
        name.setCheckState(Qt.Checked)
        name.setToolTip(str(suite.source))
        count = QTableWidgetItem(f"{len(suite):,}")
        count.setFlags(Qt.ItemIsEnabled | Qt.ItemIsSelectable)
        count.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
        self.suite_table.setItem(row, 0, name)
        self.suite_table.setItem(row, 1, count)
        combo = QComboBox()
        combo.setEditable(True)
        for spec in dict.fromkeys([suite.scorer, *BUILTIN_SCORERS]):
            combo.addItem(spec)
        combo.setCurrentText(suite.scorer)
        combo.setToolTip("exact · contains · number · regex:PATTERN · python:FILE.py:FUNCTION")
        combo.lineEdit().editingFinished.connect(lambda c=combo: self._scorer_edited(c))
        combo.activated.connect(lambda _=0, c=combo: self._scorer_edited(c))
        self.suite_table.setCellWidget(row, 2, combo)
        runs = QTableWidgetItem()
        runs.setFlags(Qt.ItemIsEnabled | Qt.ItemIsSelectable)
        self.suite_table.setItem(row, 3, runs)
        self.suites.append(suite)
        self._describe_scorer(row)
        self.suite_table.blockSignals(False)
        self._update_actions()

    def _scorer_edited(self, combo: QComboBox) -> None:
        row = next((r for r in range(self.suite_table.rowCount()) if self.suite_table.cellWidget(r, 2) is combo), -1)
        if row < 0:
            return
        self.set_scorer(row, combo.currentText())

    def set_scorer(self, row: int, spec: str) -> bool:
        """Score suite ``row`` with ``spec`` (checked, never run here); a bad spec is refused and shown."""
        suite = self.suites[row]
        combo: QComboBox = self.suite_table.cellWidget(row, 2)
        if spec.strip() == suite.scorer:
            return True
        try:
            self.suites[row] = suite.with_scorer(spec)
        except InputError as e:
            self.error.emit(f"suite {suite.name!r}: {e}")
            combo.setCurrentText(suite.scorer)
            return False
        combo.setCurrentText(self.suites[row].scorer)
        self._describe_scorer(row)
        return True

    def _describe_scorer(self, row: int) -> None:
        suite, item = self.suites[row], self.suite_table.item(row, 3)
        try:
            spec = suite.scorer_spec
            text = spec.describe()
            item.setForeground(QBrush(QColor("#8a5a00" if spec.kind == "python" else "#333333")))
            item.setToolTip(f"{spec.file} will run when you click Evaluate" if spec.kind == "python" else text)
        except InputError as e:
            text = str(e)
            item.setForeground(QBrush(QColor("#b3261e")))
            item.setToolTip(text)
        item.setText(text)

    def _remove_selected_suites(self) -> None:
        rows = sorted({i.row() for i in self.suite_table.selectedIndexes()}, reverse=True)
        for row in rows:
            self.suite_table.removeRow(row)
            del self.suites[row]
        self._update_actions()

    def checked_suites(self) -> list[Suite]:
        return [s for r, s in enumerate(self.suites) if self.suite_table.item(r, 0).checkState() == Qt.Checked]

    # --- models -------------------------------------------------------------------------------
    def add_model(self, entry: ModelEntry, checked: bool = True) -> None:
        """Add (or update, same source) a model to the list."""
        self.kinds[entry.source] = entry.kind
        for i in range(self.model_list.count()):
            item = self.model_list.item(i)
            if item.data(Qt.UserRole).source == entry.source:
                self._set_item(item, entry)
                return
        item = QListWidgetItem()
        item.setFlags(Qt.ItemIsEnabled | Qt.ItemIsSelectable | Qt.ItemIsUserCheckable)
        item.setCheckState(Qt.Checked if checked else Qt.Unchecked)
        self._set_item(item, entry)
        self.model_list.addItem(item)
        self._update_actions()

    def _set_item(self, item: QListWidgetItem, entry: ModelEntry) -> None:
        item.setData(Qt.UserRole, entry)
        item.setText(f"{entry.name}  —  {KIND_LABELS.get(entry.kind, entry.kind)}")
        item.setToolTip(entry.source)

    def set_session_models(self, base: str | None, agents: list[tuple[str, str]]) -> None:
        """Replace the base and agent rows with the Sources step's (merged, variant and other rows stay)."""
        keep = [self.model_list.item(i) for i in range(self.model_list.count())]
        state = {item.data(Qt.UserRole).source: item.checkState() for item in keep}
        others = [(item.data(Qt.UserRole), item.checkState()) for item in keep
                  if item.data(Qt.UserRole).kind not in ("base", "agent")]
        self.model_list.blockSignals(True)
        self.model_list.clear()
        entries = ([ModelEntry("base", base, "base")] if base else []) + [ModelEntry(n, s, "agent") for n, s in agents]
        for entry in entries:
            self.add_model(entry, state.get(entry.source, Qt.Checked) == Qt.Checked)
        for entry, check in others:
            self.add_model(entry, check == Qt.Checked)
        self.model_list.blockSignals(False)
        self._update_actions()

    def checked_models(self) -> list[ModelEntry]:
        items = [self.model_list.item(i) for i in range(self.model_list.count())]
        return [item.data(Qt.UserRole) for item in items if item.checkState() == Qt.Checked]

    def set_checked(self, names: list[str]) -> None:
        """Tick exactly the models named (tests and scripts)."""
        for i in range(self.model_list.count()):
            item = self.model_list.item(i)
            item.setCheckState(Qt.Checked if item.data(Qt.UserRole).name in names else Qt.Unchecked)

    # --- running ------------------------------------------------------------------------------
    def set_device(self, device: str) -> None:
        """Score on ``device`` (the window passes the method form's choice)."""
        self.device = device

    def _update_actions(self) -> None:
        running = self.task.running()
        self.run.start_button.setEnabled(not self.jobs.busy() and self.suite_job is None
                                         and bool(self.checked_suites()) and bool(self.checked_models()))
        self.run.cancel_button.setEnabled(running)
        for w in (self.add_file_button, self.add_folder_button, self.remove_suite_button, self.add_model_button,
                  self.suite_table, self.model_list, self.batch_size, self.limit):
            w.setEnabled(not running)
        has = self.result is not None
        self.export_csv_button.setEnabled(has)
        self.export_png_button.setEnabled(has)

    def start(self) -> bool:
        """Score the ticked models on the ticked suites in the background."""
        if self.jobs.busy():
            return False
        suites, entries = self.checked_suites(), self.checked_models()
        if not suites or not entries:
            self.error.emit("tick at least one suite and one model, then Evaluate")
            return False
        names = [e.name for e in entries]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            self.error.emit(f"two models are named {dupes[0]!r}; rename an agent in Sources")
            return False
        refs = [ModelRef(e.name, e.source) for e in entries]
        for e in entries:
            self.kinds[e.source] = e.kind
        device, batch, limit = self.device, self.batch_size.value(), self.limit.value() or None
        pythons = [str(s.scorer_spec.file) for s in suites if s.scorer_spec.kind == "python"]
        for file in pythons:
            log.info("the evaluation runs the reward function file %s", file)
        log.info("evaluating %d models on %d suites (%s)", len(refs), len(suites), device)

        def run(reporter):
            import_transformers([r.source for r in refs])
            result = evaluate(refs, suites, device, batch, limit, reporter)
            return result, record_evaluation(result)

        return self.task.start(run, self._succeeded, f"Loading {refs[0].name}…")

    def cancel(self) -> None:
        self.task.cancel("Cancelling after this batch…")

    def _succeeded(self, value) -> None:
        result, written = value
        self.show_result(result)
        text = (f"Scored {_count(len(result.models), 'model')} on {_count(len(result.suites), 'suite')} "
                f"in {duration_text(result.seconds)}")
        if written:
            text += f" · scores written to {', '.join(p.name for p in written)} (eval.json, model card)"
            log.info("scores written into %s (eval.json and the model card's Evaluation section)",
                     ", ".join(str(p) for p in written))
        self.run.end(text, True)

    def _failed(self, message: str, details: str = "") -> None:
        log.error(message + (f"\n{details}" if details else ""))
        self.error.emit(message)
        self.run.end("Stopped by an error (see above); nothing was written", False)

    def _cancelled(self) -> None:
        log.info("evaluation cancelled; nothing was written")
        self.info.emit("Evaluation cancelled; nothing was written.")
        self.run.end("Cancelled; nothing was written", False)

    # --- results ------------------------------------------------------------------------------
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
            order = sorted(range(len(models)), key=lambda i: _KIND_ORDER.get(self.kinds.get(models[i].source), 9))
            result = EvalResult([models[i] for i in order], list(result.suites), [scores[i] for i in order],
                                old.seconds + result.seconds, result.device, result.versions,
                                generated_tokens=old.generated_tokens + result.generated_tokens)
        self.result = result
        self._fill_table()
        self._update_actions()

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
        colors, agent, merged = [], 0, 0
        for model in self.result.models:
            kind = self.kinds.get(model.source, "other")
            if kind == "base":
                colors.append(QColor("#9e9e9e"))
            elif kind == "agent":
                colors.append(QColor(PALETTE[agent % len(PALETTE)]))
                agent += 1
            else:
                colors.append(QColor(MERGED_COLORS[merged % len(MERGED_COLORS)]))
                merged += 1
        return colors

    def _fill_table(self) -> None:
        result = self.result
        assert result is not None
        heads = [f"{s.name} ({s.examples})" for s in result.suites] + ["mean"]
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
                item.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
                if best[c] == r:
                    item.setFont(bold)
                    item.setBackground(QBrush(BEST_BRUSH))
                    item.setToolTip("best merged model" + (" on this suite" if c < len(row) else " on average"))
                self.table.setItem(r, c + 1, item)
        self.table.resizeColumnsToContents()
        self.table.horizontalHeader().setStretchLastSection(False)
        # the table as wide as its columns (the chart takes the rest), at most half the pane
        width = sum(self.table.columnWidth(c) for c in range(self.table.columnCount())) + 2 * self.table.frameWidth()
        width += self.table.verticalScrollBar().sizeHint().width()
        total = sum(self.results_splitter.sizes())
        if total > 0:
            table_width = min(width, total // 2)
            self.results_splitter.setSizes([table_width, total - table_width])
        self.chart.show_scores([m.name for m in result.models], colors, [s.name for s in result.suites],
                               result.scores)
        marked = "Bold on green: the best merged model per suite and on average. " if any(
            b is not None for b in best) else ""
        self.note.setText(f"{marked}Mean reward over {sum(s.examples for s in result.suites)} examples, greedy, "
                          f"on {result.device}.")

    def table_rows(self) -> list[list[str]]:
        """The table as CSV rows: a header, one row per model, then the best merged model per column."""
        result = self.result
        assert result is not None
        rows = [["model", "kind", "source", *(s.name for s in result.suites), "mean"]]
        for model, row in zip(result.models, result.scores):
            rows.append([model.name, self.kinds.get(model.source, "other"), model.source,
                         *(repr(round(v, 6)) for v in row), repr(round(_mean(row), 6))])
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

    def _export_csv_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export scores", str(Path(self.browse_dir) / "scores.csv"),
                                              "CSV (*.csv)")
        if path:
            self._export(lambda: self.export_csv(Path(path)))

    def _export_png_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export chart", str(Path(self.browse_dir) / "scores.png"),
                                              "PNG images (*.png)")
        if path:
            self._export(lambda: self.export_png(Path(path)))

    def _export(self, write: Callable[[], Path]) -> None:
        try:
            path = write()
        except OSError as e:
            self.error.emit(f"{getattr(e, 'filename', None) or 'export'}: cannot write ({e.strerror or e})")
            return
        log.info("saved %s", path)
        self.info.emit(f"Saved {path}")

    # --- dialogs ------------------------------------------------------------------------------
    def _add_files_dialog(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self, "Add suites", self.browse_dir,
                                                "Suites (*.jsonl suite.yaml);;All files (*)")
        if paths:
            self.browse_dir = str(Path(paths[0]).parent)
            self.add_suites(paths)

    def _add_folder_dialog(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Add a suite folder (data.jsonl + suite.yaml)", self.browse_dir)
        if folder:
            self.browse_dir = str(Path(folder).parent)
            self.add_suites([folder])

    def _add_model_dialog(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Add a model folder to score", self.browse_dir)
        if folder:
            self.add_model_folder(Path(folder))

    def add_model_folder(self, folder: Path) -> None:
        kind = "merged" if (folder / MERGE_REPORT).is_file() else "other"
        taken = {self.model_list.item(i).data(Qt.UserRole).name for i in range(self.model_list.count())}
        name, k = folder.name, 2
        while name in taken:
            name, k = f"{folder.name}-{k}", k + 1
        self.add_model(ModelEntry(name, str(folder), kind))


_KIND_ORDER = {"base": 0, "agent": 1, "merged": 2, "variant": 3, "other": 4}


def _suite_keys(suites: list[SuiteSummary]) -> list[tuple]:
    return [(s.name, s.source, s.examples, s.scorer) for s in suites]


def _mean(row: list[float]) -> float:
    return sum(row) / len(row) if row else 0.0


def _caption(text: str) -> QLabel:
    label = QLabel(text)
    label.setStyleSheet("font-weight: bold; color: #444;")
    return label
