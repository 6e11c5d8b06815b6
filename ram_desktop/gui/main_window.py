"""The main window: Sources → Analysis → Method → Merge → Result, all visible at once."""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Any, Callable

from PySide6.QtCore import QByteArray, QSettings, Qt, QTimer, QUrl, Signal, Slot
from PySide6.QtGui import QAction, QDesktopServices, QKeySequence
from PySide6.QtWidgets import (QFileDialog, QGroupBox, QHBoxLayout, QLabel, QMainWindow, QMessageBox,
                               QPlainTextEdit, QProgressBar, QPushButton, QSizePolicy, QSplitter, QTabWidget, QVBoxLayout,
                               QWidget)

from .. import __version__
from ..core import engine
from ..core.chunks import DEFAULT_CHUNK_ELEMENTS
from ..core.errors import InputError
from ..core.events import ProgressEvent
from ..core.probe import ProbeReport, cache_dir
from ..core import defaults
from ..core.plan import OUT_DTYPES, VOCAB_MODES
from ..core.recipe import Recipe
from . import ecosystem
from ..core.session import Session
from .analysis_panel import AnalysisPanel
from .charts import export_png
from .compare_panel import ComparePanel
from .evaluate_panel import EvaluatePanel, ModelEntry
from .method_panel import MethodPanel
from ..core.output import human_bytes
from .sources_panel import SourcesPanel
from .worker import Job, LogBridge

log = logging.getLogger("ram_desktop")
MAX_RECENT = 8
STAGE_LABELS = {"probe": "Analysing", "merge": "Merging", "fisher": "Estimating Fisher", "download": "Downloading", "resolve": "Resolving"}
PAPER_URL = "https://arxiv.org/abs/2601.13572"


SHIPPED_STAMP = ".shipped-demo"  # in the cached demo: the fingerprint of the shipped demo it was copied from


def demo_folder() -> Path:
    return cache_dir().parent / "demo"


def ensure_demo(folder: Path | None = None) -> tuple[Path, list[Path]]:
    """The built-in demo (real base, three RL-trained agents, suites), copied into the cache and reused
    while it matches the shipped one (``SHIPPED_STAMP`` holds the shipped demo's fingerprint)."""
    from ..core.demo import AGENTS, MANIFEST, demo_fingerprint, write_demo

    folder = folder or demo_folder()
    base, agents = folder / "base", [folder / name for name in AGENTS]
    shipped = demo_fingerprint()
    stamp = folder / SHIPPED_STAMP
    ready = [(p / "config.json").is_file() for p in [base, *agents]] + [(folder / MANIFEST).is_file()]
    if all(ready) and (base / "model.safetensors").is_file() and stamp.is_file() and stamp.read_text() == shipped:
        return base, agents
    tmp = folder.with_name(folder.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    base_t, agents_t = write_demo(tmp)
    (tmp / SHIPPED_STAMP).write_text(shipped)
    shutil.rmtree(folder, ignore_errors=True)
    tmp.replace(folder)
    return folder / base_t.name, [folder / a.name for a in agents_t]


def demo_suites(folder: Path, agents: list) -> list[str] | None:
    """The demo agents' suites from ``demo.json`` (SPEC section 9), in the order of ``agents``; None when the
    demo has no manifest or it does not name a suite for every agent."""
    from ..core.demo import read_manifest

    try:
        by_path = {Path(a["path"]).resolve(): a["suite"] for a in read_manifest(folder)["agents"]}
        return [str(by_path[Path(a).resolve()]) for a in agents]
    except (InputError, KeyError):
        return None


def free_folder(path: Path) -> Path:
    """``path``, or ``path-2``, ``path-3`` ... : the first that does not exist or is empty."""
    candidate, k = path, 2
    while candidate.exists() and (not candidate.is_dir() or any(candidate.iterdir())):
        candidate, k = path.with_name(f"{path.name}-{k}"), k + 1
    return candidate


class MessageBar(QWidget):
    """A dismissible line at the top of the window for errors, warnings and notes (never modal)."""

    STYLES = {"error": ("#fdecea", "#b3261e"), "warning": ("#fff4ce", "#7a5a00"), "info": ("#e8f1fb", "#1a4d80")}

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        row = QHBoxLayout(self)
        row.setContentsMargins(10, 6, 6, 6)
        self.text = QLabel()
        self.text.setWordWrap(True)
        self.text.setTextInteractionFlags(Qt.TextSelectableByMouse)
        close = QPushButton("✕")
        close.setFlat(True)
        close.setFixedWidth(28)
        close.setToolTip("Dismiss")
        close.clicked.connect(self.hide)
        row.addWidget(self.text, 1)
        row.addWidget(close, 0, Qt.AlignTop)
        self.kind = ""
        self.setAttribute(Qt.WA_StyledBackground, True)
        self.hide()

    def show_message(self, kind: str, text: str) -> None:
        bg, fg = self.STYLES[kind]
        self.kind = kind
        self.setStyleSheet(f"MessageBar {{ background: {bg}; border: 1px solid {fg}; border-radius: 4px; }}"
                           f" QLabel {{ color: {fg}; }}")
        prefix = {"error": "Error: ", "warning": "Warning: ", "info": ""}[kind]
        self.text.setText(prefix + text)
        self.show()


def _merge_with_fisher(request: engine.MergeRequest, reporter) -> engine.MergeResult:
    """The merge; Fisher merging with calibration suites first estimates (or takes from the cache) each
    agent's Fisher, with its own progress stage."""
    from ..core.methods import get_method

    if get_method(request.method).calibrated:
        from ..evaluate.fisher import resolve_fisher_params

        request.params = resolve_fisher_params(request.method, request.params, request.agents, request.device, reporter)
    return engine.merge(request, reporter)


def _group(title: str, widget: QWidget) -> QGroupBox:
    box = QGroupBox(title)
    box.setStyleSheet("QGroupBox { font-weight: bold; } QGroupBox * { font-weight: normal; }")
    layout = QVBoxLayout(box)
    layout.setContentsMargins(8, 8, 8, 8)
    layout.addWidget(widget)
    return box


class MainWindow(QMainWindow):
    """Signals for tests and ``--screenshot``: ``analysis_finished(ok)``, ``merge_finished(status)`` with
    status "done", "cancelled" or "failed"."""

    analysis_finished = Signal(bool)
    merge_finished = Signal(str)

    def __init__(self, settings: QSettings | None = None) -> None:
        super().__init__()
        self.settings = settings or QSettings()
        self.setWindowTitle("RAM Desktop — merge RL-trained agents")
        self.job: Job | None = None
        self.job_kind = ""
        self.report: ProbeReport | None = None
        self.report_key: tuple | None = None
        self.result: engine.MergeResult | None = None
        self.chunk_elements = DEFAULT_CHUNK_ELEMENTS
        self._analyse_when_ready = False
        self._stage = ""
        self._merge_status = ""
        self._pending_charts: list[tuple[Path, QWidget]] = []
        self._saved_charts: list[str] = []
        self._chart_images: list = []
        self._after_charts: Callable | None = None
        self.chart_job: Job | None = None
        self._demo_failed = False
        self.recipe_path: Path | None = None

        self.message = MessageBar()
        self.sources = SourcesPanel()
        self.analysis = AnalysisPanel()
        self.method = MethodPanel()
        self.evaluate = EvaluatePanel()
        self.compare = ComparePanel(self.evaluate)
        self.log_view = QPlainTextEdit()
        self.log_view.setReadOnly(True)
        self.log_view.setMaximumBlockCount(5000)
        self.log_view.setPlaceholderText("Log: what the engine does, warnings and errors")
        self.log_view.setStyleSheet("font-family: monospace; font-size: 9pt;")

        self.analyse_button = QPushButton("Analyze")
        self.analyse_button.setToolTip("Probe pass: measure density and overlap of the agents' task vectors")
        self.merge_button = QPushButton("Merge")
        self.merge_button.setToolTip("Merge the agents into one model in the output folder")
        self.merge_button.setStyleSheet("QPushButton:enabled { font-weight: bold; }")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setToolTip("Stop; a cancelled merge leaves nothing behind")
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setTextVisible(True)
        self.progress.setFormat("")
        self.progress_label = QLabel("Ready")
        self.progress_label.setMinimumWidth(260)
        # progress text changes must never re-lay out the window (that would re-render every chart)
        self.progress_label.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Fixed)
        self.progress_label.setFixedHeight(self.progress_label.sizeHint().height())

        self.result_panel = QWidget()
        result_layout = QVBoxLayout(self.result_panel)
        result_layout.setContentsMargins(0, 0, 0, 0)
        self.result_text = QLabel("No merge yet.")
        self.result_text.setWordWrap(True)
        self.result_text.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.result_text.setAlignment(Qt.AlignTop | Qt.AlignLeft)
        # room for the result from the start: showing it must not re-lay out (and re-render) the charts
        self.result_text.setFixedHeight(self.result_text.fontMetrics().lineSpacing() * 3 + 6)
        self.open_folder_button = QPushButton("Open output folder")
        self.open_card_button = QPushButton("Open model card")
        self.publish_button = QPushButton("Publish to Hub…")
        self.publish_button.setToolTip("Create a Hugging Face repository and upload the merged model with its card")
        result_buttons = QHBoxLayout()
        result_buttons.addWidget(self.open_folder_button)
        result_buttons.addWidget(self.open_card_button)
        result_buttons.addWidget(self.publish_button)
        self.evaluate_result_button = QPushButton("Evaluate it →")
        self.evaluate_result_button.setToolTip("Score the merged model, the base and the agents on suites (step 6)")
        self.evaluate_result_button.setEnabled(False)
        result_buttons.addWidget(self.evaluate_result_button)
        result_buttons.addStretch(1)
        result_layout.addWidget(self.result_text)
        result_layout.addLayout(result_buttons)
        self.open_folder_button.setEnabled(False)
        self.open_card_button.setEnabled(False)
        self.publish_button.setEnabled(False)
        self.publish_button.clicked.connect(lambda: ecosystem.publish_dialog(self))

        run_row = QHBoxLayout()
        run_row.addWidget(self.analyse_button)
        run_row.addWidget(self.merge_button)
        run_row.addWidget(self.cancel_button)
        run_row.addWidget(self.progress, 1)
        run_box = QWidget()
        run_layout = QVBoxLayout(run_box)
        run_layout.setContentsMargins(0, 0, 0, 0)
        run_layout.addLayout(run_row)
        run_layout.addWidget(self.progress_label)
        run_layout.addWidget(self.log_view, 1)

        left = QSplitter(Qt.Vertical)
        left.addWidget(_group("1 · Sources — base model and agents", self.sources))
        left.addWidget(_group("3 · Method and output", self.method))
        left.setStretchFactor(0, 1)
        left.setStretchFactor(1, 0)
        right = QSplitter(Qt.Vertical)
        # Analysis, Evaluate (after Merge) and Compare share the large pane, one tab each
        self.steps = QTabWidget()
        self.steps.addTab(self.analysis, "2 · Analysis — density, overlap, where, which, how much")
        self.steps.addTab(self.evaluate, "6 · Evaluate")
        self.steps.addTab(self.compare, "7 · Compare")
        right.addWidget(self.steps)
        right.addWidget(_group("4 · Merge", run_box))
        right.addWidget(_group("5 · Result", self.result_panel))
        right.setStretchFactor(0, 3)
        right.setStretchFactor(1, 1)
        right.setStretchFactor(2, 0)
        self.splitter = QSplitter(Qt.Horizontal)
        self.splitter.addWidget(left)
        self.splitter.addWidget(right)
        self.splitter.setStretchFactor(0, 2)
        self.splitter.setStretchFactor(1, 3)
        self.left_splitter, self.right_splitter = left, right
        central = QWidget()
        layout = QVBoxLayout(central)
        layout.setContentsMargins(8, 6, 8, 8)
        layout.addWidget(self.message)
        layout.addWidget(self.splitter, 1)
        self.setCentralWidget(central)
        self.statusBar().showMessage(f"RAM Desktop {__version__}")

        self._build_menu()
        self.log_bridge = LogBridge(self)
        self.log_bridge.record.connect(self._append_log)
        self.log_bridge.install()

        self.analyse_button.clicked.connect(self.analyse)
        self.merge_button.clicked.connect(self.merge)
        self.cancel_button.clicked.connect(self.cancel)
        self.open_folder_button.clicked.connect(self.open_output_folder)
        self.open_card_button.clicked.connect(self.open_model_card)
        self.sources.changed.connect(self._sources_changed)
        self.sources.error.connect(lambda m: self.show_error(m))
        self.sources.browse_dir_changed.connect(lambda d: self.settings.setValue("paths/last_folder", d))
        self.method.changed.connect(self._method_changed)
        self.method.out_dir_changed.connect(lambda d: self.settings.setValue("paths/last_output", d))
        self.method.device.currentIndexChanged.connect(
            lambda _: self.settings.setValue("device", self.method.device.currentData()))
        self.analysis.use_float32.connect(lambda: self.method.set_out_dtype("float32"))
        self._connect_evaluation()
        # charts not on screen wait while a merge runs and while its charts are saved (see AnalysisPanel.hold)
        self.analysis.hold = lambda: ((self.job is not None and self.job_kind == "merge") or bool(self._pending_charts)
                                      or self.chart_job is not None)

        self._restore_settings()
        self._update_actions()

    def _connect_evaluation(self) -> None:
        """Evaluate and Compare: messages into the bar, one job at a time across the window."""
        for panel in (self.evaluate, self.compare):
            panel.error.connect(lambda m: self.show_error(m))
            panel.info.connect(lambda m: self.show_info(m))
            panel.busy_changed.connect(self._update_actions)
        self.evaluate.device_fn = lambda: self.method.device.currentData()
        self.compare.session_fn = self._checked_session
        self.compare.token_fn = lambda: self.sources.hub_token
        self.compare.options_fn = lambda: {"chunk_elements": self.chunk_elements}
        self.evaluate_result_button.clicked.connect(lambda: self.steps.setCurrentWidget(self.evaluate))
        self.compare.compare_finished.connect(
            lambda status: self.steps.setCurrentWidget(self.evaluate) if status == "done" else None)

    # --- menu and settings --------------------------------------------------------------------
    def _build_menu(self) -> None:
        file_menu = self.menuBar().addMenu("&File")
        self.open_action = QAction("&Open recipe…", self, shortcut=QKeySequence.Open, triggered=self.open_recipe_dialog)
        self.save_action = QAction("&Save recipe…", self, shortcut=QKeySequence.Save, triggered=self.save_recipe_dialog)
        self.export_action = QAction("&Export charts as PNG…", self, triggered=self.export_charts_dialog)
        self.export_action.setToolTip("Save every analysis chart (density, overlap, heat map, tensors, sets, signs, "
                                      "ulps, would keep, per layer) into a folder")
        self.demo_action = QAction("Load &demo agents", self, triggered=self.load_demo)
        self.demo_action.setToolTip("A small real base and three agents RL-trained from it: merge them within a minute")
        self.import_mergekit_action = QAction("&Import mergekit YAML…", self,
                                              triggered=lambda: ecosystem.import_mergekit_dialog(self))
        self.export_mergekit_action = QAction("Export &mergekit YAML…", self,
                                              triggered=lambda: ecosystem.export_mergekit_dialog(self))
        self.recent_menu = file_menu.addMenu("Open &recent")
        quit_action = QAction("&Quit", self, shortcut=QKeySequence.Quit, triggered=self.close)
        file_menu.insertAction(self.recent_menu.menuAction(), self.open_action)
        file_menu.addAction(self.save_action)
        file_menu.addAction(self.export_action)
        file_menu.addSeparator()
        file_menu.addAction(self.import_mergekit_action)
        file_menu.addAction(self.export_mergekit_action)
        file_menu.addSeparator()
        file_menu.addAction(self.demo_action)
        file_menu.addSeparator()
        file_menu.addAction(quit_action)
        help_menu = self.menuBar().addMenu("&Help")
        help_menu.addAction(QAction("The RAM paper (arXiv 2601.13572)", self,
                                    triggered=lambda: QDesktopServices.openUrl(QUrl(PAPER_URL))))
        help_menu.addAction(QAction("&About RAM Desktop", self, triggered=self._about))
        self._rebuild_recent()

    def _about(self) -> None:
        QMessageBox.about(self, "About RAM Desktop",
                          f"<b>RAM Desktop {__version__}</b><p>Merges RL-trained agents that share one base with "
                          "RAM / RAM+ (Behavior Knowledge Merge in Reinforced Agentic Models, arXiv 2601.13572) "
                          "and classic baselines.</p>")

    def recent_recipes(self) -> list[str]:
        value = self.settings.value("recent/recipes", [])
        if isinstance(value, str):
            value = [value]
        return [str(v) for v in (value or [])]

    def _add_recent(self, path: Path) -> None:
        items = [str(path)] + [p for p in self.recent_recipes() if p != str(path)]
        self.settings.setValue("recent/recipes", items[:MAX_RECENT])
        self._rebuild_recent()

    def _rebuild_recent(self) -> None:
        self.recent_menu.clear()
        items = self.recent_recipes()
        for path in items:
            self.recent_menu.addAction(QAction(path, self, triggered=lambda _=False, p=path: self.open_recipe(Path(p))))
        self.recent_menu.setEnabled(bool(items))

    def _restore_settings(self) -> None:
        geometry = self.settings.value("window/geometry")
        if isinstance(geometry, QByteArray) and not geometry.isEmpty():
            self.restoreGeometry(geometry)
        else:
            self.resize(1360, 860)
            self.left_splitter.setSizes([330, 400])
            self.right_splitter.setSizes([560, 170, 100])
        screen = self.screen().availableGeometry() if self.screen() is not None else None
        if screen is not None and (self.width() > screen.width() or self.height() > screen.height()):
            self.resize(min(self.width(), screen.width()), min(self.height(), screen.height()))
        for key, splitter in (("window/splitter", self.splitter), ("window/left", self.left_splitter),
                              ("window/right", self.right_splitter)):
            state = self.settings.value(key)
            if isinstance(state, QByteArray) and not state.isEmpty():
                splitter.restoreState(state)
        folder = self.settings.value("paths/last_folder")
        if folder:
            self.sources.browse_dir = str(folder)
        device = self.settings.value("device")
        if device:
            index = self.method.device.findData(str(device))
            if index >= 0:
                self.method.device.setCurrentIndex(index)

    def save_settings(self) -> None:
        self.settings.setValue("window/geometry", self.saveGeometry())
        self.settings.setValue("window/splitter", self.splitter.saveState())
        self.settings.setValue("window/left", self.left_splitter.saveState())
        self.settings.setValue("window/right", self.right_splitter.saveState())
        self.settings.sync()

    def closeEvent(self, event) -> None:  # noqa: N802
        for job in (self.job, self.evaluate.job, self.compare.job):
            if job is not None and job.is_running():
                job.cancel()
                job.wait(15000)
        self.sources.cancel_downloads()
        self.sources.wait_idle(5000)
        self.save_settings()
        self.log_bridge.uninstall()
        super().closeEvent(event)

    # --- messages and log ---------------------------------------------------------------------
    def show_error(self, text: str) -> None:
        self.message.show_message("error", text)
        self.statusBar().showMessage("Error — see the message at the top", 8000)

    def show_warning(self, text: str) -> None:
        self.message.show_message("warning", text)

    def show_info(self, text: str) -> None:
        self.message.show_message("info", text)

    @Slot(int, str)
    def _append_log(self, level: int, line: str) -> None:
        color = "#b3261e" if level >= logging.ERROR else "#8a5a00" if level >= logging.WARNING else "#333333"
        escaped = line.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        self.log_view.appendHtml(f'<span style="color:{color}; white-space:pre-wrap">{escaped}</span>')

    # --- state --------------------------------------------------------------------------------
    def busy(self) -> bool:
        return self.job is not None or self.chart_job is not None or self.evaluate.busy() or self.compare.busy()

    def _update_actions(self) -> None:
        busy = self.busy()
        ready = self.sources.all_ready()
        self.analyse_button.setEnabled(not busy and ready)
        self.merge_button.setEnabled(not busy and ready)
        self.cancel_button.setEnabled(busy)
        self.sources.setEnabled(not busy)
        self.method.setEnabled(not busy)
        for action in (self.open_action, self.save_action, self.demo_action, self.export_action,
                       self.import_mergekit_action, self.export_mergekit_action):
            action.setEnabled(not busy)
        self.recent_menu.setEnabled(not busy and bool(self.recent_recipes()))
        own = self.job is not None or self.chart_job is not None
        self.evaluate.set_blocked(own or self.compare.busy())
        self.compare.set_blocked(own or self.evaluate.busy())

    def _source_key(self) -> tuple:
        return (self.sources.base.spec if self.sources.base else None,
                tuple(r.spec for r in self.sources.agents), self.method.eps.text().strip())

    def _base_dtype(self) -> str | None:
        base = self.sources.base
        return base.checkpoint.dtype if base is not None and base.checkpoint is not None else None

    def _sources_changed(self) -> None:
        self.method.set_agent_names(self.sources.names)
        base = self.sources.base
        if base is not None and base.checkpoint is not None and not self.method.out_dir.text().strip():
            self.method.out_dir.setText(str(free_folder(base.checkpoint.folder.parent / "merged")))
        if base is not None and base.checkpoint is not None and not self.compare.folder.text().strip():
            self.compare.folder.setText(str(free_folder(base.checkpoint.folder.parent / "compare")))
        self.evaluate.set_session_models(base.spec if base else None,
                                         list(zip(self.sources.names, [r.spec for r in self.sources.agents])))
        if self.report is not None:
            if self._source_key() == self.report_key:
                if self.report.names != self.sources.names:  # a rename: same statistics, new labels
                    self.report = self.report.renamed(self.sources.names, [a.source for a in self.report.agents])
                    self.analysis.show_report(self.report)
                self.analysis.set_stale(None)
            else:
                self.analysis.set_stale("The sources or ε changed since this analysis — click Analyze to update it.")
        self._method_changed()
        self._update_actions()
        self._maybe_auto_analyse()

    def _maybe_auto_analyse(self) -> None:
        """After the demo or a recipe loads: analyse once every source has opened."""
        if not self._analyse_when_ready or self.sources.busy or self.busy():
            return
        self._analyse_when_ready = False
        if self.sources.all_ready():
            self.analyse()
        else:
            self.analysis_finished.emit(False)

    def _method_changed(self) -> None:
        if self.report is None:
            self.analysis.update_method(self.method.current, {}, "base", None)
            return
        if self.report_key is not None and self.method.eps.text().strip() != self.report_key[2]:
            self.analysis.set_stale("ε changed since this analysis — click Analyze to update it.")
        self.analysis.update_method(self.method.current, self.method.params(),
                                    self.method.out_dtype.currentData(), self._base_dtype())

    # --- background jobs ----------------------------------------------------------------------
    def _start(self, kind: str, fn: Callable, on_success: Callable[[Any], None]) -> None:
        self.job_kind = kind
        self.job = Job(fn, self)
        worker = self.job.worker
        worker.progress.connect(self._on_progress)
        self._on_success = on_success
        worker.succeeded.connect(self._on_succeeded)  # a slot of this window: runs on the GUI thread
        worker.failed.connect(self._on_failed)
        worker.crashed.connect(self._on_crashed)
        worker.cancelled.connect(self._on_cancelled)
        self.job.finished.connect(self._job_finished)
        self.progress.setValue(0)
        self.progress.setFormat("")
        self.progress_label.setText({"probe": "Analysing…", "merge": "Preparing the merge…",
                                     "demo": "Generating the demo agents…"}.get(kind, "Working…"))
        self._stage = ""
        self._update_actions()
        self.job.start()

    @Slot(object)
    def _on_succeeded(self, result: Any) -> None:
        self._on_success(result)

    @Slot()
    def _job_finished(self) -> None:
        kind = self.job_kind
        self.job = None
        self.job_kind = ""
        self._update_actions()
        if kind == "probe":
            self.analysis_finished.emit(self.report is not None and self.report_key == self._source_key())
        elif kind == "merge" and self._merge_status == "done" and self.result is not None:
            result = self.result

            def finished() -> None:
                if self._saved_charts:
                    self._show_result(result, self._saved_charts)
                    log.info("charts saved into %s: %s", result.out, ", ".join(self._saved_charts))
                for w in result.warnings:
                    log.warning(w)
                self.merge_finished.emit("done")

            self._save_next_chart(finished)
        elif kind == "merge":
            self.merge_finished.emit(self._merge_status)
        elif kind == "demo" and self._demo_failed:
            self.analysis_finished.emit(False)
        self._maybe_auto_analyse()

    @Slot(object)
    def _on_progress(self, event: ProgressEvent) -> None:
        label = STAGE_LABELS.get(event.stage, event.stage.capitalize())
        frac = event.fraction
        self.progress.setValue(int(1000 * frac))
        self.progress.setFormat(f"{label} {100 * frac:.0f} %")
        text = f"{label}: {_amount(event.done, event.unit)} of {_amount(event.total, event.unit)}"
        if event.elapsed > 0.2 and event.done > 0:
            rate = event.done / event.elapsed
            text += f" · {_amount(rate, event.unit)}/s"
            if event.done < event.total:
                text += f" · about {_duration((event.total - event.done) / rate)} left"
        self.progress_label.setText(text)

    @Slot(str)
    def _on_failed(self, message: str) -> None:
        self._merge_status = "failed"
        self._demo_failed = True
        log.error(message)
        self.show_error(message)
        self.progress_label.setText("Stopped by an error (see above)")
        self.progress.setFormat("")

    @Slot(str, str)
    def _on_crashed(self, message: str, details: str) -> None:
        self._merge_status = "failed"
        self._demo_failed = True
        log.error("unexpected error (a bug in RAM Desktop): %s\n%s", message, details)
        self.show_error(f"unexpected error: {message}. This is a bug in RAM Desktop; the log has the details. "
                        "Nothing was written to the output folder.")
        self.progress_label.setText("Stopped by an unexpected error")

    @Slot()
    def _on_cancelled(self) -> None:
        self._merge_status = "cancelled"
        self._demo_failed = True
        what = "Merge cancelled; nothing was written." if self.job_kind == "merge" else "Cancelled."
        log.info(what)
        self.show_info(what)
        self.progress.setValue(0)
        self.progress.setFormat("")
        self.progress_label.setText(what)

    def cancel(self) -> None:
        if self.job is not None:
            self.job.cancel()
            self.cancel_button.setEnabled(False)
            self.progress_label.setText("Cancelling…")

    # --- the flow -----------------------------------------------------------------------------
    def session(self) -> Session:
        """The Session the widgets describe (the window's one way to a request or a recipe). Raises
        ``InputError`` when ε is not a number."""
        try:
            eps = self.method.eps_value()
        except ValueError:
            raise InputError(f"threshold ε {self.method.eps.text()!r} is not a non-negative number; "
                             "write it like 1e-5") from None
        return Session(base=self.sources.base.spec if self.sources.base else "",
                       agents=[r.spec for r in self.sources.agents], names=self.sources.names or None,
                       method=self.method.current.name, params=self.method.params(), eps=eps,
                       device=self.method.device.currentData(), out_dtype=self.method.out_dtype.currentData(),
                       shard_size=self.method.shard_size.text().strip() or defaults.SHARD_SIZE,
                       out=self.method.out_dir.text().strip() or None, vocab=self.method.vocab.currentData())

    def _checked_session(self) -> Session | None:
        """The Session, validated as the engine will validate it (ε, parameters); None after showing why not."""
        try:
            session = self.session()
            if not (session.eps >= 0 and session.eps != float("inf")):
                raise InputError(f"threshold ε {self.method.eps.text()!r} is not a non-negative number; "
                                 "write it like 1e-5")
            session.resolved_params()
        except InputError as e:
            self.show_error(str(e))
            return None
        return session

    def apply_session(self, session: Session) -> None:
        """Show a Session in the widgets (after it was validated: this step cannot fail halfway)."""
        self.method.set_method(session.method, session.params)
        self.method.eps.setText(repr(float(session.eps)))
        self.method.set_out_dtype(session.out_dtype)
        self.method.set_vocab(session.vocab)
        self.method.shard_size.setText(str(session.shard_size))
        self.method.set_device(session.device)
        self.method.out_dir.setText(session.out or "")
        self.set_sources(session.base, session.agents, session.names)

    def analyse(self) -> None:
        if self.busy():
            return
        if not self.sources.all_ready():
            self.show_error("add a base and at least one agent that open without errors, then Analyze")
            return
        session = self._checked_session()
        if session is None:
            return
        self.message.hide()
        key = self._source_key()
        chunk = self.chunk_elements
        token = self.sources.hub_token

        def run(reporter):
            return engine.probe(session.base, session.agents, session.names, session.eps, session.device, reporter,
                                chunk_elements=chunk, token=token, vocab=session.vocab)

        def done(report: ProbeReport) -> None:
            self.report, self.report_key = report, key
            self.analysis.show_report(report)
            self._method_changed()
            self.progress.setValue(1000)
            self.progress.setFormat("Analysis done")
            text = (f"Analysed {report.params:,} elements in {report.tensors} tensors "
                    f"(ε = {report.eps:g}). Pick a method and Merge.")
            self.progress_label.setText(text)
            for w in report.warnings:
                self.show_warning(w)

        self._start("probe", run, done)

    def merge(self) -> None:
        if self.busy():
            return
        if not self.sources.all_ready():
            self.show_error("add a base and at least one agent that open without errors, then Merge")
            return
        session = self._checked_session()
        if session is None:
            return
        if not session.out:
            self.show_error("choose an output folder (section 3) before merging")
            return
        out = Path(session.out).expanduser()
        overwrite = False
        if out.is_dir() and any(out.iterdir()):
            answer = QMessageBox.question(self, "Replace the output folder?",
                                          f"{out} already holds files. Replace its contents with the merged model?",
                                          QMessageBox.Yes | QMessageBox.No, QMessageBox.No)
            if answer != QMessageBox.Yes:
                return
            overwrite = True
        try:
            request = session.to_request(out, overwrite=overwrite, token=self.sources.hub_token,
                                         chunk_elements=self.chunk_elements)
        except InputError as e:
            self.show_error(str(e))
            return
        self.message.hide()
        self._merge_status = "failed"
        self.result = None
        self.result_text.setText("Merging…")
        self.open_folder_button.setEnabled(False)
        self.open_card_button.setEnabled(False)
        self.publish_button.setEnabled(False)
        self._last_request = request
        key = self._source_key()
        log.info("merging %d agents with %s into %s", len(request.agents), request.method, out)
        self._start("merge", lambda reporter: _merge_with_fisher(request, reporter), lambda r: self._merged(r, key))

    def _merged(self, result: engine.MergeResult, key: tuple) -> None:
        self._merge_status = "done"
        self.result = result
        if key == self._source_key() and (self.report is None or self.report.names != result.probe.names
                                          or self.report_key != key):
            self.report, self.report_key = result.probe, key
            self.analysis.show_report(result.probe)
            self._method_changed()
        self._show_result(result, [])
        self.evaluate.add_model(ModelEntry(result.out.name, str(result.out), "merged"))
        self._pending_charts = self._chart_targets(result.out, every_view=False)
        self._saved_charts = []

    def _show_result(self, result: engine.MergeResult, charts: list[str]) -> None:
        self.progress.setValue(1000)
        self.progress.setFormat("Merge done")
        self.progress_label.setText(f"Merged in {_duration(result.seconds)}")
        lam = ", ".join(f"{n} {v:.3f}" for n, v in zip(result.probe.names, result.lambdas))
        self.result_text.setText(
            f"<b>Merged model:</b> <a href=\"{QUrl.fromLocalFile(str(result.out)).toString()}\">{result.out}</a><br>"
            f"{human_bytes(result.bytes_written)} of weights in {_duration(result.seconds)} · "
            f"method {result.report.get('method')} · λ: {lam}<br>"
            "Also there: model card (README.md), ram-recipe.yaml, merge-report.json"
            + (", charts (PNG)." if charts else "."))
        self.result_text.setOpenExternalLinks(True)
        self.open_folder_button.setEnabled(True)
        self.open_card_button.setEnabled((result.out / "README.md").is_file())
        self.publish_button.setEnabled((result.out / "README.md").is_file())
        self.evaluate_result_button.setEnabled(True)
        self.settings.setValue("paths/last_output", str(result.out))
        self.statusBar().showMessage(f"Merged into {result.out}", 15000)

    def _chart_targets(self, folder: Path, every_view: bool = True) -> list[tuple[Path, QWidget]]:
        """Where each analysis view is saved. A merge's output folder gets the overview (density,
        overlap, per layer: drawn ahead, so saving them never stalls the window); File ▸ Export charts
        gets every view."""
        if self.report is None:
            return []
        a = self.analysis
        views = [(Path(folder) / "density.png", a.density),
                (Path(folder) / "overlap.png", a.overlap),
                (Path(folder) / "layers.png", a.layers.graphics),
                (Path(folder) / "heatmap.png", a.heatmap),
                (Path(folder) / "tensors.png", a.tensors),
                (Path(folder) / "intersections.png", a.intersections),
                (Path(folder) / "pairs.png", a.pairs),
                (Path(folder) / "ulps.png", a.ulps),
                (Path(folder) / "would-keep.png", a.would_keep)]
        overview = {"density.png", "overlap.png", "layers.png"}
        return views if every_view else [(p, w) for p, w in views if p.name in overview]

    def _save_next_chart(self, then: Callable[[], None]) -> None:
        """Save the pending charts, then call ``then``. The GUI thread only renders them (a few ms
        each, one per event-loop turn); PNG encoding and writing happen in a worker thread."""
        if self._pending_charts:
            path, widget = self._pending_charts[0]
            if self.analysis.draw_now(widget):  # not drawn yet: drawn in this turn, saved in the next
                QTimer.singleShot(0, lambda: self._save_next_chart(then))
                return
            self._pending_charts.pop(0)
            self._chart_images.append((path, widget.grab().toImage()))
            QTimer.singleShot(0, lambda: self._save_next_chart(then))
            return
        images, self._chart_images = self._chart_images, []

        def write(reporter) -> list[str]:
            saved = []
            for path, image in images:
                if image.save(str(path), "PNG"):
                    saved.append(path.name)
                else:
                    log.warning("could not save the chart %s", path)
            return saved

        def done(names: list[str]) -> None:
            then()

        self.chart_job = Job(write, self)
        self.chart_job.worker.succeeded.connect(self._charts_saved)
        self._after_charts = done
        self.chart_job.finished.connect(self._chart_job_finished)
        self.chart_job.start()

    @Slot(object)
    def _charts_saved(self, names: list[str]) -> None:
        self._saved_charts = names

    @Slot()
    def _chart_job_finished(self) -> None:
        self.chart_job = None
        self._update_actions()
        callback, self._after_charts = self._after_charts, None
        if callback is not None:
            callback(self._saved_charts)

    def export_charts(self, folder: Path) -> list[str]:
        """Save the analysis charts as PNG files into ``folder`` now; return their names."""
        names = []
        for path, widget in self._chart_targets(folder):
            self.analysis.draw_now(widget)  # a view still waiting in the drawing queue
            try:
                export_png(widget, path)
                names.append(path.name)
            except OSError as e:
                log.warning("could not save the chart %s: %s", path.name, e)
        return names

    def export_charts_dialog(self) -> None:
        if self.report is None:
            self.show_error("run the analysis first: there are no charts to export yet")
            return
        folder = QFileDialog.getExistingDirectory(self, "Export charts into", self.sources.browse_dir)
        if folder:
            names = self.export_charts(Path(folder))
            log.info("charts saved into %s: %s", folder, ", ".join(names))
            self.statusBar().showMessage(f"Saved {len(names)} charts into {folder}", 8000)

    def open_output_folder(self) -> None:
        if self.result is not None:
            QDesktopServices.openUrl(QUrl.fromLocalFile(str(self.result.out)))

    def open_model_card(self) -> None:
        if self.result is not None:
            QDesktopServices.openUrl(QUrl.fromLocalFile(str(self.result.out / "README.md")))

    # --- demo and recipes ---------------------------------------------------------------------
    def load_demo(self) -> None:
        """Generate (once) and load the demo agents, then analyse them."""
        if self.busy():
            return
        self._demo_failed = False

        def loaded(paths) -> None:
            base, agents = paths
            self.set_sources(str(base), [str(a) for a in agents], None)
            self.method.set_agent_defaults("suite", demo_suites(Path(base).parent, agents))
            self.method.out_dir.setText(str(free_folder(Path(base).parent / "merged")))
            self.compare.folder.setText(str(free_folder(Path(base).parent / "compare")))
            self.evaluate.preload_demo(Path(base).parent)  # the agents' suites, when demo.json names them
            log.info("demo agents loaded from %s", Path(base).parent)

        self._start("demo", lambda reporter: ensure_demo(), loaded)

    def set_sources(self, base: str, agents: list[str], names: list[str] | None, analyse: bool = True) -> None:
        self.method.set_agent_defaults("suite", None)  # another set of agents: the demo's suites no longer apply
        self.sources.clear()
        self.report, self.report_key = None, None
        self.analysis.show_report(None)
        self._analyse_when_ready = analyse
        self.sources.set_base(base)
        for i, spec in enumerate(agents):
            self.sources.add_agent(spec, names[i] if names else None)

    def open_recipe_dialog(self) -> None:
        start = str(self.recipe_path.parent) if self.recipe_path else self.sources.browse_dir
        path, _ = QFileDialog.getOpenFileName(self, "Open recipe", start, "RAM recipes (*.yaml *.yml);;All files (*)")
        if path:
            self.open_recipe(Path(path))

    def open_recipe(self, path: Path) -> bool:
        """Load a recipe into the window: every value is checked first, so a bad recipe changes nothing."""
        if self.busy():
            return False
        try:
            session = Session.from_recipe(Recipe.load(Path(path)))
            session.resolved_params()  # unknown method or parameter, out-of-range value
            if session.out_dtype not in OUT_DTYPES:
                raise InputError(f"{path}: unknown out_dtype {session.out_dtype!r}; choose one of "
                                 f"{', '.join(OUT_DTYPES)}")
            if session.vocab not in VOCAB_MODES:
                raise InputError(f"{path}: unknown vocab {session.vocab!r}; choose exact or common")
            if not (session.eps >= 0 and session.eps != float("inf")):
                raise InputError(f"{path}: eps must be a non-negative number, got {session.eps}")
            self.apply_session(session)
        except InputError as e:
            self.show_error(str(e))
            log.error(str(e))
            return False
        self.recipe_path = Path(path)
        self._add_recent(Path(path).resolve())
        self.setWindowTitle(f"RAM Desktop — {Path(path).name}")
        log.info("opened recipe %s", path)
        return True

    def current_recipe(self) -> Recipe:
        """The recipe of what the window shows (parameters resolved); raises ``InputError`` when a value is bad."""
        return self.session().to_recipe()

    def save_recipe_dialog(self) -> None:
        start = str(self.recipe_path) if self.recipe_path else str(Path(self.sources.browse_dir) / "ram-recipe.yaml")
        path, _ = QFileDialog.getSaveFileName(self, "Save recipe", start, "RAM recipes (*.yaml *.yml)")
        if path:
            self.save_recipe(Path(path))

    def save_recipe(self, path: Path) -> bool:
        if self.sources.base is None or not self.sources.agents:
            self.show_error("add a base and at least one agent before saving a recipe")
            return False
        try:
            self.current_recipe().save(Path(path))
        except InputError as e:
            self.show_error(str(e))
            return False
        except OSError as e:
            self.show_error(f"{path}: cannot write the recipe ({e.strerror})")
            return False
        self.recipe_path = Path(path)
        self._add_recent(Path(path).resolve())
        log.info("saved recipe %s", path)
        self.statusBar().showMessage(f"Saved {path}", 8000)
        return True


def _amount(value: float, unit: str) -> str:
    if unit == "B":
        return human_bytes(value)
    for suffix, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= size:
            return f"{value / size:.1f} {suffix} {unit}"
    return f"{value:.2f} {unit}" if 0 < value < 10 and value != int(value) else f"{value:.0f} {unit}"


def _duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds:.2f} s"
    if seconds < 90:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 90:
        return f"{minutes} min {secs:02d} s"
    return f"{minutes // 60} h {minutes % 60:02d} min"


def wait_until(condition: Callable[[], bool], timeout: float, app) -> bool:
    """Process events until ``condition()`` holds (for scripts such as ``--screenshot``)."""
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            return False
        app.processEvents()
        time.sleep(0.005)
    return True
