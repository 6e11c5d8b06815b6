"""The Compare step: tick methods and parameter values (an r sweep, a TA scale sweep, …) and merge them
all as one ``workflow.compare`` call — one read of the inputs — then score base, agents and
every variant on the Evaluate step's suites, side by side in the step's own table and chart (docs/gui.md,
docs/evaluate.md). Scores of the base and the agents from an earlier evaluation or compare (same files,
suites, scorer and settings) are reused through the Evaluate step's ``ScoreCache``."""

from __future__ import annotations

import logging
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFileDialog,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QScrollArea,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from ...core import (
    METHODS,
    InputError,
    MergeSpec,
    RunOptions,
    Sweep,
    Variant,
    defaults,
    record_evaluation,
    variant_specs,
)
from ...workflow import CompareResult, compare
from ..jobs import JobController, JobState
from ..session import ModelEntry, Session, Topic
from ..widgets.common import StaleBanner, WrappedLines
from .code_notice import confirm_code
from .run_bar import PanelJob, RunBar
from .scores_view import ScoresView
from .warm_up import import_transformers

log = logging.getLogger("ram_desktop")


class MethodRow:
    """One method: a tick, the parameter to sweep and its values (comma-separated)."""

    def __init__(self, name: str) -> None:
        method = METHODS[name]
        self.name = name
        self.check = QCheckBox(method.label)
        self.check.setToolTip(method.summary)
        self.param = QComboBox()
        self.values = QLineEdit()
        self.has_params = bool(method.params)
        if method.params:
            for p in method.params:
                self.param.addItem(p.name, p.name)
                self.param.setItemData(self.param.count() - 1, p.help, Qt.ItemDataRole.ToolTipRole)
            # the sweep the method offers (``Interop.sweep``), else its first parameter at its default
            sweep = method.interop.sweep or Sweep(method.params[0].name, repr(method.params[0].default))
            param, values = sweep.param, sweep.values
            self.param.setCurrentIndex(max(0, self.param.findData(param)))
            self.values.setText(values)
            self.values.setToolTip(
                "Values to try, separated by commas; one variant each. Other parameters: "
                "the Method step's values where the method has them, else its defaults"
            )
        else:
            self.param.setEnabled(False)
            self.values.setEnabled(False)
            self.values.setPlaceholderText("no parameters")

    def variants(self) -> list[Variant]:
        """The ticked variants; ``InputError`` naming the method for a bad value."""
        if not self.check.isChecked():
            return []
        if not self.has_params:
            return [Variant.parse(self.name)]
        values = [v.strip() for v in self.values.text().replace(";", ",").split(",") if v.strip()]
        if not values:
            raise InputError(f"{self.check.text()}: give at least one {self.param.currentData()} value, or untick it")
        return [Variant.parse(f"{self.name}:{self.param.currentData()}={v}") for v in values]


class ComparePanel(QWidget):
    """Signals: ``run_requested`` (Run clicked: the window answers with :meth:`start`),
    ``compare_finished(status)`` ("done", "cancelled", "failed"), ``error``, ``info``. The comparison
    runs through the window's job controller ``jobs`` (state ``COMPARING``)."""

    run_requested = Signal()
    compare_finished = Signal(str)
    error = Signal(str)
    info = Signal(str)

    def __init__(self, session: Session, jobs: JobController, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.session, self.jobs = session, jobs
        self.last: CompareResult | None = None

        grid = QGridLayout()
        grid.setHorizontalSpacing(10)
        grid.addWidget(_head("Method"), 0, 0)
        grid.addWidget(_head("Sweep"), 0, 1)
        grid.addWidget(_head("Values"), 0, 2)
        self.rows: dict[str, MethodRow] = {}
        names = [
            name for name, m in METHODS.items() if not m.streaming.stacks
        ]  # stacking merges no models: nothing to compare
        for i, name in enumerate(names, start=1):
            row = MethodRow(name)
            self.rows[name] = row
            grid.addWidget(row.check, i, 0)
            grid.addWidget(row.param, i, 1)
            grid.addWidget(row.values, i, 2)
            row.check.toggled.connect(lambda _: self._update_actions())
        grid.setColumnStretch(2, 1)
        grid.setRowStretch(len(names) + 1, 1)  # rows stay at the top
        methods = QWidget()
        methods.setLayout(grid)
        scroll = QScrollArea()
        scroll.setWidget(methods)
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QScrollArea.Shape.NoFrame)
        row_height = max(w.sizeHint().height() for w in (row.check, row.param, row.values)) + 6
        scroll.setMinimumHeight(4 * row_height)  # the heading and three methods, also on a laptop screen
        self.methods_area = scroll

        self.folder = QLineEdit()
        self.folder.setPlaceholderText("folder for the variants (must not exist, or be empty)")
        self.folder.setToolTip("Each variant is merged into FOLDER/<variant>; compare.json and compare.png go here")
        browse = QPushButton("…")
        browse.setFixedWidth(32)
        browse.clicked.connect(self._browse)
        folder_row = QHBoxLayout()
        self.folder_label = QLabel("Output folder")
        folder_row.addWidget(self.folder_label)
        folder_row.addWidget(self.folder, 1)
        folder_row.addWidget(browse)
        self.summary = WrappedLines(lines=2)
        self.summary.setStyleSheet("color: #555;")
        self.run = RunBar("Run compare")
        self.run.start_button.setToolTip(
            "Merge every ticked variant from one read of the inputs, then score "
            "base, agents and variants on the Evaluate step's ticked suites"
        )
        intro = WrappedLines(  # lines of their own: a wrapping QLabel's height-for-width is lost in the splitter,
            # which then squeezed the methods list under the Output folder row
            "Tick methods and the values to sweep. All variants are merged in one pass over the inputs "
            "(the sources and the Method step's settings), then scored with the Evaluate step's "
            "ticked suites; the scores appear side by side below (the base's and the agents' reused "
            "when they and the suites are unchanged).",
            lines=3,
        )
        intro.setStyleSheet("color: #555;")
        self.scores = ScoresView(title="Scores per suite: base, agents and merged variants")
        self.table, self.chart, self.note = self.scores.table, self.scores.chart, self.scores.note
        self.scores.export_csv_button.clicked.connect(lambda: self._export("compare.csv", self.scores.export_csv))
        self.scores.export_png_button.clicked.connect(lambda: self._export("compare-chart.png", self.scores.export_png))
        self.scores.export_csv_button.setEnabled(False)
        self.scores.export_png_button.setEnabled(False)
        top = QWidget()
        top_layout = QVBoxLayout(top)
        top_layout.setContentsMargins(0, 0, 0, 0)
        top_layout.addWidget(intro)
        top_layout.addWidget(scroll, 1)
        top_layout.addLayout(folder_row)
        top_layout.addWidget(self.summary)
        top_layout.addWidget(self.run)
        self.splitter = QSplitter(Qt.Orientation.Vertical)
        # neither part is squeezed below what it needs (the methods were drawn under the Output folder row and
        # the chart lost its axis on a 1366×768 screen): the page scrolls instead
        self.splitter.setChildrenCollapsible(False)
        self.splitter.addWidget(top)
        self.splitter.addWidget(self.scores)
        self.splitter.setStretchFactor(0, 1)
        self.splitter.setStretchFactor(1, 2)
        self.splitter.setSizes([200, 400])  # the methods scroll; the scores get the room
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        self.stale = StaleBanner("Run compare")  # the scores below are of other settings (the window says)
        self.stale.action.connect(self.run.start_button.click)
        layout.addWidget(self.stale)
        layout.addWidget(self.splitter)
        self.task = PanelJob(jobs, JobState.COMPARING, self.run, self)
        self.task.failed.connect(self._failed)
        self.task.cancelled.connect(self._cancelled)
        self.task.finished.connect(self._finished)
        jobs.state_changed.connect(self._update_actions)
        self.run.start_button.clicked.connect(self.run_requested)
        self.run.cancel_button.clicked.connect(self.cancel)
        self.folder.textChanged.connect(lambda _: self._update_actions())
        session.watch(Topic.SCORING, lambda _: self._update_actions())  # the suites it scores on
        self.rows[defaults.METHOD].check.setChecked(True)
        self._update_actions()

    def variants(self) -> list[Variant]:
        return [v for row in self.rows.values() for v in row.variants()]

    def tick(self, method: str, values: str | None = None, param: str | None = None) -> None:
        """Tick a method with these values (tests and scripts)."""
        row = self.rows[method]
        row.check.setChecked(True)
        if param is not None:
            row.param.setCurrentIndex(row.param.findData(param))
        if values is not None:
            row.values.setText(values)

    def _update_actions(self) -> None:
        running = self.task.running()
        ticked = any(r.check.isChecked() for r in self.rows.values())
        self.run.start_button.setEnabled(not self.jobs.busy() and ticked and bool(self.folder.text().strip()))
        self.run.cancel_button.setEnabled(running)
        for row in self.rows.values():
            row.check.setEnabled(not running)
            row.param.setEnabled(not running and row.has_params)
            row.values.setEnabled(not running and row.has_params)
        suites = self.session.scoring.suites
        self.summary.setText(
            f"Scored on the {len(suites)} suite{'s' * (len(suites) != 1)} ticked in Evaluate: "
            + ", ".join(s.name for s in suites)
            if suites
            else "No suite ticked in Evaluate: the variants are merged, not scored."
        )

    def start(self, spec: MergeSpec, options: RunOptions | None = None) -> bool:
        """Merge (and score) the ticked variants of ``spec`` (``workflow.compare``), run with ``options``."""
        if self.jobs.busy():
            return False
        try:
            variants = self.variants()
            if not variants:
                raise InputError("tick at least one method to compare")
            variant_specs(spec, variants, self.folder.text().strip())  # duplicate names, bad values, before any work
        except InputError as e:
            self.error.emit(str(e))
            return False
        folder = Path(self.folder.text().strip()).expanduser()
        scoring = self.session.scoring
        suites = list(scoring.suites)
        if not confirm_code(self, suites, self.info.emit):
            return False
        device, batch, limit = spec.device, scoring.batch_size, scoring.limit
        cache = self.session.score_cache
        log.info("comparing %d variants into %s: %s", len(variants), folder, ", ".join(v.name for v in variants))

        def run(reporter) -> tuple[CompareResult, int]:
            if suites:
                import_transformers([spec.base])  # the variants share the base's architecture
            result = compare(
                spec,
                variants,
                folder,
                suites,
                options,
                reporter,
                device=device,
                batch_size=batch,
                limit=limit,
                cache=cache,
            )
            if result.evaluation is not None:
                record_evaluation(result.evaluation)
            return result, cache.hits - hits

        hits = cache.hits  # read by run(): the reuses of this compare alone
        return self.task.start(run, self._succeeded, f"Preparing {len(variants)} variants…")

    def cancel(self) -> None:
        self.task.cancel("Cancelling…")

    def _succeeded(self, value: tuple[CompareResult, int]) -> None:
        result, reused = value
        self.last = result
        for merge in result.merges:
            self.session.offer_model(ModelEntry(merge.out.name, str(merge.out), "variant"))
        seconds = max(m.seconds for m in result.merges)  # one pass: every variant's merge takes the same time
        text = f"{len(result.merges)} variants merged in one pass ({seconds:.1f} s) into {result.folder}"
        evaluation = result.evaluation
        if evaluation is not None:
            n_agents = len(evaluation.models) - 1 - len(result.merges)
            kinds = ["base"] + ["agent"] * n_agents + ["variant"] * len(result.merges)
            self.scores.show_result(evaluation, {m.source: k for m, k in zip(evaluation.models, kinds)}, keep=False)
            text += (
                f"; scored {len(evaluation.models)} models (the base, {n_agents} agents and "
                f"{len(result.merges)} variants) on {len(evaluation.suites)} suites"
            )
            if reused:
                text += f", {reused} scores reused (model and suite unchanged)"
            text += " — below"
        self.scores.export_csv_button.setEnabled(evaluation is not None)
        self.scores.export_png_button.setEnabled(evaluation is not None)
        self.run.end(text, True)
        log.info("compare done: %s", result.folder)

    def _export(self, name: str, write) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export", str(Path(self.folder.text() or Path.home()) / name))
        if not path:
            return
        try:
            saved = write(Path(path))
        except OSError as e:
            self.error.emit(f"{getattr(e, 'filename', None) or 'export'}: cannot write ({e.strerror or e})")
            return
        log.info("saved %s", saved)
        self.info.emit(f"Saved {saved}")

    def _failed(self, message: str, details: str = "") -> None:
        log.error(message + (f"\n{details}" if details else ""))
        self.error.emit(message)
        self.run.end("Stopped by an error (see above)", False)

    def _cancelled(self) -> None:
        log.info("compare cancelled")
        self.info.emit(
            "Compare cancelled: a cancelled merge leaves no variant folder; variants merged before an "
            "evaluation was cancelled stay, without scores."
        )
        self.run.end("Cancelled", False)

    def _finished(self, status: str) -> None:
        self.compare_finished.emit(status)

    def _browse(self) -> None:
        folder = QFileDialog.getExistingDirectory(
            self, "Folder for the variants", self.folder.text() or str(Path.home())
        )
        if folder:
            self.folder.setText(folder)


def _head(text: str) -> QLabel:
    label = QLabel(text)
    label.setStyleSheet("font-weight: bold; color: #444;")
    return label
