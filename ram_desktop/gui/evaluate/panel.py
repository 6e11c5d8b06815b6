"""The Evaluate step: suites, the models to score, a background evaluation (progress, ETA, Cancel) and
the scores as a table and a grouped bar chart, both exportable (docs/gui.md, docs/evaluate.md).

Suites open in the background (reading a JSONL file runs no code); a python scorer's file is shown
and runs only inside the evaluation the user starts. The evaluation writes ``eval.json`` and the
model card's Evaluation section into every merged model's folder it scored, and nothing when it is
cancelled or fails.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QSpinBox,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from ...core import MERGE_REPORT, InputError, demo_suites, record_evaluation
from ...evaluate import EvalResult, ModelRef, Suite, load_suite
from ...workflow import evaluate
from ..jobs import JobController, JobState
from ..session import ModelEntry, Scoring, Session, SourcesState, Topic
from ..widgets.common import StaleBanner
from ..worker import Job
from .code_notice import confirm_code
from .run_bar import PanelJob, RunBar, duration
from .scores_view import KIND_LABELS, ScoresView
from .suites_table import SuitesTable
from .warm_up import import_transformers

log = logging.getLogger("ram_desktop")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' if n != 1 else ''}"


def scored_text(result: EvalResult, reused: int, rows: int) -> str:
    """``Scored 4 models on 3 suites in 12 s`` and what else the table holds: the scores reused from
    earlier runs (unchanged model and suite), and the rows kept from earlier runs, so that the count
    matches the table."""
    text = (
        f"Scored {_count(len(result.models), 'model')} on {_count(len(result.suites), 'suite')} "
        f"in {duration(result.seconds, coarse=True)}"
    )
    if reused:
        text += f" ({reused} of {len(result.models) * len(result.suites)} scores reused: model and suite unchanged)"
    if rows > len(result.models):
        text += f"; the table shows {rows} models ({rows - len(result.models)} scored earlier)"
    return text


class EvaluatePanel(QWidget):
    """Signals: ``evaluation_finished(status)`` ("done", "cancelled", "failed"); ``suites_loaded`` once added
    suites are in the table and Evaluate may start; ``error(str)`` and
    ``info(str)`` for the window's message bar. The evaluation runs through the window's job controller
    ``jobs`` (state ``EVALUATING``), so nothing else runs meanwhile. It writes the ``session``'s scoring
    settings and scores, and shows its sources and the models offered for scoring."""

    evaluation_finished = Signal(str)
    suites_loaded = Signal()
    error = Signal(str)
    info = Signal(str)

    def __init__(self, jobs: JobController, session: Session, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.jobs, self.session = jobs, session
        self.suite_job: Job | None = None
        self.device = "auto"  # where models are scored: the method form's device (set_device)
        self.browse_dir = str(Path.home())

        # suites
        self.suite_table = SuitesTable()
        self.suite_table.error.connect(self.error.emit)
        self.suite_table.changed.connect(lambda: self._update_actions())
        self.add_file_button = QPushButton("Add JSONL…")
        self.add_file_button.setToolTip('A JSONL file: one {"prompt": ..., "answer": ...} per line')
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

        setup = QSplitter(Qt.Orientation.Horizontal)
        setup.addWidget(suites_box)
        setup.addWidget(models_box)
        setup.setStretchFactor(0, 3)
        setup.setStretchFactor(1, 2)
        self.run = RunBar("Evaluate")
        self.run.start_button.setToolTip("Generate greedily with every ticked model on every ticked suite and score")

        self.scores = ScoresView()
        self.kinds = self.scores.kinds  # model source -> kind, for colours and the best-merged mark
        # the parts tests and scripts reach through the panel
        self.table, self.chart, self.note = self.scores.table, self.scores.chart, self.scores.note
        self.export_csv_button, self.export_png_button = self.scores.export_csv_button, self.scores.export_png_button

        self.splitter = QSplitter(Qt.Orientation.Vertical)
        top = QWidget()
        top_layout = QVBoxLayout(top)
        top_layout.setContentsMargins(0, 0, 0, 0)
        top_layout.addWidget(setup, 1)
        top_layout.addWidget(self.run)
        self.splitter.addWidget(top)
        self.splitter.addWidget(self.scores)
        self.splitter.setStretchFactor(0, 2)
        self.splitter.setStretchFactor(1, 3)
        self.splitter.setSizes([230, 290])
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        self.stale = StaleBanner("Evaluate")  # the merged model's scores are of an earlier merge (the window says)
        self.stale.action.connect(self.run.start_button.click)
        layout.addWidget(self.stale)
        layout.addWidget(self.splitter)

        self.add_file_button.clicked.connect(self._add_files_dialog)
        self.add_folder_button.clicked.connect(self._add_folder_dialog)
        self.remove_suite_button.clicked.connect(self.suite_table.remove_selected)
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
        for changed in (self.suite_table.changed, self.suite_table.itemChanged):  # added, removed, (un)ticked
            changed.connect(self._publish_scoring)
        self.batch_size.valueChanged.connect(self._publish_scoring)
        self.limit.valueChanged.connect(self._publish_scoring)
        session.watch(Topic.SOURCES, self._follow_sources)
        session.watch(Topic.DRAFT, lambda draft: self.set_device(draft.device))
        self.set_device(session.draft.device)
        session.watch(Topic.MODEL_OFFERED, self.add_model)
        self._update_actions()

    def _publish_scoring(self) -> None:
        """The ticked suites, batch size and examples, for Compare and Search to score with."""
        self.session.set_scoring(
            Scoring(tuple(self.checked_suites()), self.batch_size.value(), self.limit.value() or None)
        )

    def _follow_sources(self, sources: SourcesState) -> None:
        self.set_session_models(sources.base or None, [(a.name, a.source) for a in sources.agents])

    # --- suites -------------------------------------------------------------------------------
    def add_suites(self, sources: Sequence[str | Path]) -> None:
        """Open suites in the background; each lands as a ticked row (errors go to the message bar)."""
        paths = [Path(p) for p in sources]
        if not paths:
            return

        added: list[Suite] = []

        def opened(loaded: list[Suite]) -> None:
            for suite in loaded:
                self.suite_table.add(suite)
            added.extend(loaded)

        job = Job(lambda reporter: [load_suite(p) for p in paths], self)
        job.succeeded.connect(opened)
        job.failed.connect(self.error.emit)
        job.crashed.connect(lambda m, d: self.error.emit(f"could not open the suite: {m}"))
        job.finished.connect(lambda: self._suite_job_done(job, bool(added)))
        self.suite_job = job
        self._update_actions()
        job.start()

    def _suite_job_done(self, job: Job, added: bool) -> None:
        """A suites' job has ended: Evaluate may start again (unless a later one still runs), and only now is
        ``suites_loaded`` said: a job's result arrives before its thread has ended, and a click on Evaluate in
        between would find the button still disabled."""
        if self.suite_job is job:
            self.suite_job = None
        self._update_actions()
        if added:
            self.suites_loaded.emit()

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

    @property
    def suites(self) -> list[Suite]:
        return self.suite_table.suites

    def set_scorer(self, row: int, spec: str) -> bool:
        """Score suite ``row`` with ``spec`` (checked, never run here); a bad spec is refused and shown."""
        return self.suite_table.set_scorer(row, spec)

    def checked_suites(self) -> list[Suite]:
        return self.suite_table.checked_suites()

    # --- models -------------------------------------------------------------------------------
    def add_model(self, entry: ModelEntry, checked: bool = True) -> None:
        """Add (or update, same source) a model to the list."""
        self.kinds[entry.source] = entry.kind
        for i in range(self.model_list.count()):
            item = self.model_list.item(i)
            if item.data(Qt.ItemDataRole.UserRole).source == entry.source:
                self._set_item(item, entry)
                return
        item = QListWidgetItem()
        item.setFlags(Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable | Qt.ItemFlag.ItemIsUserCheckable)
        item.setCheckState(Qt.CheckState.Checked if checked else Qt.CheckState.Unchecked)
        self._set_item(item, entry)
        self.model_list.addItem(item)
        self._update_actions()

    def _set_item(self, item: QListWidgetItem, entry: ModelEntry) -> None:
        item.setData(Qt.ItemDataRole.UserRole, entry)
        item.setText(f"{entry.name}  —  {KIND_LABELS.get(entry.kind, entry.kind)}")
        item.setToolTip(entry.source)

    def set_session_models(self, base: str | None, agents: list[tuple[str, str]]) -> None:
        """Replace the base and agent rows with the Sources step's (merged, variant and other rows stay)."""
        keep = [self.model_list.item(i) for i in range(self.model_list.count())]
        state = {item.data(Qt.ItemDataRole.UserRole).source: item.checkState() for item in keep}
        others = [
            (item.data(Qt.ItemDataRole.UserRole), item.checkState())
            for item in keep
            if item.data(Qt.ItemDataRole.UserRole).kind not in ("base", "agent")
        ]
        self.model_list.blockSignals(True)
        self.model_list.clear()
        entries = ([ModelEntry("base", base, "base")] if base else []) + [ModelEntry(n, s, "agent") for n, s in agents]
        for entry in entries:
            self.add_model(entry, state.get(entry.source, Qt.CheckState.Checked) == Qt.CheckState.Checked)
        for entry, check in others:
            self.add_model(entry, check == Qt.CheckState.Checked)
        self.model_list.blockSignals(False)
        self._update_actions()

    def checked_models(self) -> list[ModelEntry]:
        items = [self.model_list.item(i) for i in range(self.model_list.count())]
        return [item.data(Qt.ItemDataRole.UserRole) for item in items if item.checkState() == Qt.CheckState.Checked]

    def set_checked(self, names: list[str]) -> None:
        """Tick exactly the models named (tests and scripts)."""
        for i in range(self.model_list.count()):
            item = self.model_list.item(i)
            item.setCheckState(
                Qt.CheckState.Checked if item.data(Qt.ItemDataRole.UserRole).name in names else Qt.CheckState.Unchecked
            )

    # --- running ------------------------------------------------------------------------------
    def set_device(self, device: str) -> None:
        """Score on ``device`` (the session's draft's: the method form's choice)."""
        self.device = device

    def _update_actions(self) -> None:
        running = self.task.running()
        self.run.start_button.setEnabled(
            not self.jobs.busy()
            and self.suite_job is None
            and bool(self.checked_suites())
            and bool(self.checked_models())
        )
        self.run.cancel_button.setEnabled(running)
        for w in (
            self.add_file_button,
            self.add_folder_button,
            self.remove_suite_button,
            self.add_model_button,
            self.suite_table,
            self.model_list,
            self.batch_size,
            self.limit,
        ):
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
        if not confirm_code(self, suites, self.info.emit):
            return False
        device, batch, limit = self.device, self.batch_size.value(), self.limit.value() or None
        pythons = [str(s.scorer_spec.file) for s in suites if s.scorer_spec.kind == "python"]
        for file in pythons:
            log.info("the evaluation runs the reward function file %s", file)
        log.info("evaluating %d models on %d suites (%s)", len(refs), len(suites), device)

        cache = self.session.score_cache

        def run(reporter):
            import_transformers([r.source for r in refs])
            hits = cache.hits
            result = evaluate(refs, suites, device, batch, limit, reporter, cache=cache)
            return result, record_evaluation(result), cache.hits - hits

        return self.task.start(run, self._succeeded, f"Loading {refs[0].name}…")

    def cancel(self) -> None:
        self.task.cancel("Cancelling after this batch…")

    def _succeeded(self, value) -> None:
        result, written, reused = value
        self.show_result(result)
        text = scored_text(result, reused, self.table.rowCount())
        if written:
            text += f" · scores written to {', '.join(p.name for p in written)} (eval.json, model card)"
            log.info(
                "scores written into %s (eval.json and the model card's Evaluation section)",
                ", ".join(str(p) for p in written),
            )
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
    @property
    def result(self) -> EvalResult | None:
        return self.scores.result

    def show_result(self, result: EvalResult, kinds: dict[str, str] | None = None) -> None:
        """Show ``result``; rows of models scored before on the same suites stay (same source: replaced)."""
        self.scores.show_result(result, kinds)
        self.session.set_scores(self.scores.result)
        self._update_actions()

    def _export_csv_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(
            self, "Export scores", str(Path(self.browse_dir) / "scores.csv"), "CSV (*.csv)"
        )
        if path:
            self._export(lambda: self.scores.export_csv(Path(path)))

    def _export_png_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(
            self, "Export chart", str(Path(self.browse_dir) / "scores.png"), "PNG images (*.png)"
        )
        if path:
            self._export(lambda: self.scores.export_png(Path(path)))

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
        paths, _ = QFileDialog.getOpenFileNames(
            self, "Add suites", self.browse_dir, "Suites (*.jsonl suite.yaml);;All files (*)"
        )
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
        taken = {self.model_list.item(i).data(Qt.ItemDataRole.UserRole).name for i in range(self.model_list.count())}
        name, k = folder.name, 2
        while name in taken:
            name, k = f"{folder.name}-{k}", k + 1
        self.add_model(ModelEntry(name, str(folder), kind))


def _caption(text: str) -> QLabel:
    label = QLabel(text)
    label.setStyleSheet("font-weight: bold; color: #444;")
    return label
