"""The Search tab: tick the methods to try, set the trial budget and run ``evaluate.search.search`` — an
Optuna study over the methods and their paper ranges, scored on validation suites — with a live plot of
each trial's validation score and the best so far, the trials table, and "Use this merge" to load the
best trial into the Method step (docs/gui.md, docs/evaluate.md)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyqtgraph as pg
from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QFileDialog,
    QGridLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from ...core import METHODS, SEARCH_METHODS, InputError, MergeSpec
from ...workflow import SearchOptions, SearchResult, Trial, check_methods, search, search_space
from ..jobs import JobController, JobState
from ..session import Session
from ..widgets.common import WrappedLines
from .run_bar import PanelJob, RunBar
from .warm_up import import_transformers

log = logging.getLogger("ram_desktop")
COLUMNS = ("Trial", "Method", "Parameters", "Validation", "Seconds")
SEARCH_TIP = (
    "Merge and score each trial on the validation suites (Optuna TPE), then merge the best into "
    "FOLDER/best and test it beside RAM+ and Task Arithmetic at their defaults"
)
CALIBRATION_TIP = (
    "\nCalibrated on the Method step's calibration suites: choose this method there and give each agent's "
    "suite; each agent's Fisher is estimated once, before the trials"
)


def params_text(method: str, params: dict[str, Any]) -> str:
    """A trial's parameters as a reader sees them: each by its title ("trim scope", not ``ties_scope``)."""
    titles = {p.name: p.title for p in METHODS[method].params}
    words = (
        f"{titles.get(k, k)}={v:.4g}" if isinstance(v, float) else f"{titles.get(k, k)}={v}" for k, v in params.items()
    )
    return ", ".join(words) or "—"


class SearchPanel(QWidget):
    """``spec()`` gives the window's checked MergeSpec (None after it said why not) when Run is clicked.
    Signals: ``run_requested`` (Run clicked), ``use_merge(method,
    params)`` ("Use this merge": the best trial, written to the session's draft, which the Method step shows),
    ``search_finished(status)``, ``error``,
    ``info``. ``trial_done`` carries each finished trial from the worker to the GUI thread."""

    run_requested = Signal()
    use_merge = Signal(str, object)
    search_finished = Signal(str)
    trial_done = Signal(object)
    error = Signal(str)
    info = Signal(str)

    def __init__(
        self,
        session: Session,
        jobs: JobController,
        spec: Callable[[], MergeSpec | None],
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.session, self.jobs, self.spec = session, jobs, spec
        self.trials: list[Trial] = []
        self.last: SearchResult | None = None
        self.blocker: str | None = None  # why the sources cannot be merged (the window's, as for Merge)

        self.checks: dict[str, QCheckBox] = {}
        grid = QGridLayout()
        names = [n for n, m in METHODS.items() if not m.streaming.stacks]
        for i, name in enumerate(names):
            box = QCheckBox(METHODS[name].short_label)
            space = search_space(name)
            box.setToolTip(
                METHODS[name].summary
                + ("\nSearched: " + "; ".join(d.describe() for d in space) if space else "\nNo parameters")
                + (CALIBRATION_TIP if METHODS[name].interop.calibrated else "")
            )
            box.setChecked(name in SEARCH_METHODS)
            box.toggled.connect(lambda _: self._update_actions())
            self.checks[name] = box
            grid.addWidget(box, i // 6, i % 6)
        inner = QWidget()
        inner.setLayout(grid)
        methods = QScrollArea()  # 26 methods: the paper's fit in the first rows, the rest scroll
        methods.setWidget(inner)
        methods.setWidgetResizable(True)
        methods.setFrameShape(QScrollArea.Shape.NoFrame)
        methods.setMaximumHeight(inner.sizeHint().height() // max(1, grid.rowCount()) * 3 + 6)

        self.trial_count = QSpinBox()
        self.trial_count.setRange(1, 100000)
        self.trial_count.setValue(24)
        self.trial_count.setToolTip("Trials to complete; running again into the same folder continues the study")
        self.seed = QSpinBox()
        self.seed.setRange(0, 2**31 - 1)
        self.seed.setToolTip("The sampler's seed (Optuna TPE)")
        self.validation = QLineEdit()
        self.validation.setPlaceholderText("validation suites (folders or .jsonl files), separated by ;")
        self.validation.setToolTip(
            "The trials are scored on these; the best is then tested on the Evaluate step's ticked suites"
        )
        add_suite = QPushButton("Add…")
        add_suite.clicked.connect(self._browse_suite)
        self.folder = QLineEdit()
        self.folder.setPlaceholderText("folder for study.db, search.json and best/ (new, or an earlier search's)")
        browse = QPushButton("…")
        browse.setFixedWidth(32)
        browse.clicked.connect(self._browse)
        form = QGridLayout()
        form.addWidget(QLabel("Trials"), 0, 0)
        form.addWidget(self.trial_count, 0, 1)
        form.addWidget(QLabel("Seed"), 0, 2)
        form.addWidget(self.seed, 0, 3)
        form.addWidget(QLabel("Validation"), 1, 0)
        form.addWidget(self.validation, 1, 1, 1, 3)
        form.addWidget(add_suite, 1, 4)
        form.addWidget(QLabel("Folder"), 2, 0)
        form.addWidget(self.folder, 2, 1, 1, 3)
        form.addWidget(browse, 2, 4)
        form.setColumnStretch(3, 1)

        self.plot = pg.PlotWidget()
        self.plot.setBackground("w")
        self.plot.setLabel("bottom", "trial")
        self.plot.setLabel("left", "validation score")
        self.plot.setMinimumHeight(140)
        self.plot.getAxis("left").enableAutoSIPrefix(False)  # scores stay as they are, no "(x0.001)"
        self.plot.addLegend(offset=(-10, 10))
        self.points = self.plot.plot(
            [], [], pen=None, symbol="o", symbolSize=7, symbolBrush=(70, 110, 200, 200), name="trial"
        )
        self.best_line = self.plot.plot([], [], pen=pg.mkPen((220, 90, 40), width=2), name="best so far")

        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.horizontalHeader().setSectionResizeMode(2, QHeaderView.ResizeMode.Stretch)
        self.best_label = WrappedLines("No trials yet.")
        self.use_button = QPushButton("Use this merge")
        self.use_button.setToolTip("Load the best trial's method and parameters into the Method step")
        self.use_button.clicked.connect(self._use_best)
        best_row = QHBoxLayout()
        best_row.addWidget(self.best_label, 1)
        best_row.addWidget(self.use_button)
        self.run = RunBar("Run search")
        self.run.start_button.setToolTip(SEARCH_TIP)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(methods)
        layout.addLayout(form)
        layout.addWidget(self.plot, 2)
        layout.addWidget(self.table, 2)
        layout.addLayout(best_row)
        layout.addWidget(self.run)
        self.task = PanelJob(jobs, JobState.SEARCHING, self.run, self)
        self.task.failed.connect(self._failed)
        self.task.cancelled.connect(self._cancelled)
        self.task.finished.connect(self.search_finished)
        self.trial_done.connect(self.add_trial)
        jobs.state_changed.connect(self._update_actions)
        self.run.start_button.clicked.connect(self.run_requested)
        self.run_requested.connect(self._run)
        self.run.cancel_button.clicked.connect(self.cancel)
        self.folder.textChanged.connect(lambda _: self._update_actions())
        self.validation.textChanged.connect(lambda _: self._update_actions())
        self._update_actions()

    # --- the form -------------------------------------------------------------------------------------
    def methods(self) -> list[str]:
        return [name for name, box in self.checks.items() if box.isChecked()]

    def validation_suites(self) -> list[str]:
        return [s.strip() for s in self.validation.text().split(";") if s.strip()]

    def set_validation(self, paths: list[Path]) -> None:
        self.validation.setText("; ".join(str(p) for p in paths))

    def set_blocker(self, blocker: str | None) -> None:
        """Why the window's sources cannot be merged now (a row missing, mismatched or rejected), or None: Run
        search is enabled exactly when Merge is, and its tooltip says why not (the window's one condition)."""
        self.blocker = blocker
        self._update_actions()

    def _update_actions(self) -> None:
        running = self.task.running()
        ready = bool(self.methods()) and bool(self.folder.text().strip()) and bool(self.validation_suites())
        self.run.start_button.setEnabled(not self.jobs.busy() and ready and self.blocker is None)
        self.run.start_button.setToolTip(self.blocker or SEARCH_TIP)
        self.run.cancel_button.setEnabled(running)
        for box in self.checks.values():
            box.setEnabled(not running)
        self.use_button.setEnabled(not running and bool(self.trials))

    # --- running --------------------------------------------------------------------------------------
    def _run(self) -> None:
        spec = self.spec()
        if spec is not None:
            self.start(spec)

    def start(self, spec: MergeSpec) -> bool:
        """Search from the window's whole ``spec``: the ticked methods are tried as deltas of it (its tokenizer,
        chat template, layer map, dtype and names kept in every trial); its own method, when ticked, is the
        first trial at its values."""
        if self.jobs.busy():
            return False
        if self.blocker is not None:
            self.error.emit(self.blocker)
            return False
        try:
            methods = check_methods(self.methods())
            if not self.validation_suites():
                raise InputError("give at least one validation suite to score the trials on")
        except InputError as e:
            self.error.emit(str(e))
            return False
        options = SearchOptions(
            spec,
            self.validation_suites(),
            list(self.session.scoring.suites),
            Path(self.folder.text().strip()).expanduser(),
            self.trial_count.value(),
            methods,
            self.seed.value(),
            batch_size=self.session.scoring.batch_size,
            limit=self.session.scoring.limit,
        )
        self.clear()
        log.info("searching %d trials over %s into %s", options.trials, ", ".join(methods), options.folder)

        def run(reporter) -> SearchResult:
            import_transformers([spec.base])  # every trial shares the base's architecture
            return search(options, reporter, self.trial_done.emit)

        return self.task.start(run, self._succeeded, f"Preparing {options.trials} trials…")

    def cancel(self) -> None:
        self.task.cancel("Cancelling… (finished trials are kept)")

    def clear(self) -> None:
        self.trials = []
        self.table.setRowCount(0)
        self.points.setData([], [])
        self.best_line.setData([], [])
        self.best_label.setText("No trials yet.")
        self._update_actions()

    def add_trial(self, trial: Trial) -> None:
        """One finished trial: a table row, a point, the best-so-far line."""
        self.trials.append(trial)
        row = self.table.rowCount()
        self.table.insertRow(row)
        cells = (
            str(trial.number),
            METHODS[trial.method].short_label,
            params_text(trial.method, trial.params),
            f"{trial.validation:.4f}",
            "repeat" if trial.same_as is not None else f"{trial.seconds:.1f}",
        )
        for col, text in enumerate(cells):
            self.table.setItem(row, col, QTableWidgetItem(text))
        xs = [t.number for t in self.trials]  # the trial numbers of the table and search.json (Optuna's, from 0)
        ys = [t.validation for t in self.trials]
        best = [max(ys[: i + 1]) for i in range(len(ys))]
        self.points.setData(xs, ys)
        self.best_line.setData(xs, best)
        step = max(1, -(-len(xs) // 10))
        self.plot.getAxis("bottom").setTickSpacing(step, step)  # whole trial numbers only
        self._say_best("Best so far")
        self._update_actions()

    def _say_best(self, lead: str) -> None:
        top = self.best()
        if top is not None:
            self.best_label.setText(
                f"{lead}: trial {top.number}, {METHODS[top.method].short_label} "
                f"({params_text(top.method, top.params)}), validation {top.validation:.4f}"
            )

    def best(self) -> Trial | None:
        return max(self.trials, key=lambda t: (t.validation, -t.number)) if self.trials else None

    def _use_best(self) -> None:
        top = self.best()
        if top is not None:
            session = self.session
            session.set_draft(session.draft.with_method(top.method, dict(top.params), session.sources.identities))
            self.use_merge.emit(top.method, dict(top.params))

    def _succeeded(self, result: SearchResult) -> None:
        self.last = result
        self._say_best(f"Best of {len(self.trials)} trials")
        text = f"{len(result.trials)} trials; best merged into {result.folder / 'best'}"
        if result.test is not None:
            best, refs = result.test["models"][0], result.test["models"][1:]
            text += f"; test {best['test']:.4f} (" + ", ".join(f"{r['name']} {r['test']:.4f}" for r in refs) + ")"
        self.run.end(text, True)
        log.info("search done: %s", result.folder)

    def _failed(self, message: str, details: str = "") -> None:
        log.error(message + (f"\n{details}" if details else ""))
        self.error.emit(message)
        self._say_best(f"Best of the {len(self.trials)} finished trials")
        self.run.end("Stopped by an error (see above)", False)

    def _cancelled(self) -> None:
        log.info("search cancelled")
        self.info.emit("Search cancelled: the finished trials are kept; run again into the same folder to continue.")
        self._say_best(f"Best of the {len(self.trials)} finished trials")
        self.run.end("Cancelled", False)

    def _browse(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Folder for the search", self.folder.text() or str(Path.home()))
        if folder:
            self.folder.setText(folder)

    def _browse_suite(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "A validation suite folder", str(Path.home()))
        if folder:
            self.set_validation([*map(Path, self.validation_suites()), Path(folder)])
