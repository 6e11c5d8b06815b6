"""The main window: Sources → Analysis → Method → Merge → Result, all visible at once. It lays the panels
out and connects their signals; the window's one running job and its state live in the job controller
(:mod:`.jobs`), the demo's logic in the core (:mod:`ram_desktop.core.demo`)."""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path

from PySide6.QtCore import QSettings, Qt, Signal, Slot
from PySide6.QtWidgets import QMainWindow, QMessageBox, QSplitter, QVBoxLayout, QWidget

from .. import __version__
from ..core import (
    DEFAULT_CHUNK_ELEMENTS,
    METHODS,
    InputError,
    MergeResult,
    MergeSpec,
    ProbeReport,
    demo_suites,
    ensure_demo,
)
from ..core.storage.output import NotReplaceable, free_folder
from ..paths import outputs_dir, visible_folder
from . import ecosystem
from .analysis.chart_saver import ChartSaver
from .analysis.charts import set_agent_slots
from .analysis.panel import AnalysisPanel
from .compute.dialog import ComputeFace
from .draft import Draft, checked_merge_spec, draft_of_spec, engine_params, merge_spec
from .evaluate.compare_panel import ComparePanel
from .evaluate.panel import EvaluatePanel
from .evaluate.run_bar import duration
from .evaluate.search_panel import SearchPanel
from .freshness import FreshnessView
from .jobs import JobController, JobState, Outcome
from .menus import Menus
from .method.advice import window_words
from .method.panel import MethodPanel
from .method.spec_form import bind_draft, merge_options, run_merge, run_probe, window_options
from .run.result_box import ResultBox
from .run.run_box import RunBox
from .session import Change, ModelEntry, Part, Session, SourcesState, Topic
from .sources.panel import SourcesPanel
from .widgets.common import (
    MessageBar,
    StepTabs,
    WindowTitle,
    group,
    guard_wheel,
    keyboard_friendly,
    scrolled,
    splitter,
)
from .window_settings import restore_window, save_window
from .worker import LogBridge

log = logging.getLogger("ram_desktop")


TITLE = "Merge RL-trained agents"
DEMO_TITLE = "Built-in demo: a toy model (156k parameters, instant)"
REAL_RESULTS = (
    "results on a real model (SmolLM2-135M-Instruct, GRPO agents) are in the repository's "
    "reproduction/results/real/results.md"
)


class MainWindow(QMainWindow):
    """Signals for tests and ``--screenshot``: ``analysis_finished(ok)``, ``merge_finished(status)`` with
    status "done", "cancelled" or "failed"."""

    analysis_finished = Signal(bool)
    merge_finished = Signal(str)

    def __init__(self, settings: QSettings | None = None) -> None:
        super().__init__()
        guard_wheel()  # the wheel changes no field that has no focus, in this window and its dialogs
        set_agent_slots({}, forget=True)  # colours by agent name: this window's agents only
        self.settings = settings or QSettings()
        self.setWindowTitle(TITLE)  # Qt appends " — RAM Desktop" (applicationDisplayName)
        self.jobs = JobController(self)
        self.session = Session()  # what the panels share, and whether each result is still fresh (docs/gui.md)
        self.chunk_elements = DEFAULT_CHUNK_ELEMENTS
        self._analyse_when_ready = False
        self._seen: tuple | None = None  # the draft's method settings last followed
        self.message = MessageBar()
        self.sources = SourcesPanel(self.session)
        self.analysis = AnalysisPanel(self.session)
        self.method = MethodPanel(self.session)
        bind_draft(self.method)  # the form writes the session's draft and shows one written elsewhere
        self.evaluate = EvaluatePanel(self.jobs, self.session)
        self.compare = ComparePanel(self.session, self.jobs)
        self.search = SearchPanel(self.session, self.jobs, lambda: self._ready_spec("Search"))
        self.run_box = RunBox(self.jobs)
        self.result_box = ResultBox(self.jobs)
        self.charts = ChartSaver(self.analysis, self.jobs)
        # the widgets that tests and scripts reach through the window
        rb, res = self.run_box, self.result_box
        self.analyse_button, self.merge_button, self.cancel_button = (
            rb.analyse_button,
            rb.merge_button,
            rb.cancel_button,
        )
        self.progress, self.progress_label, self.log_view = rb.progress, rb.progress_label, rb.log_view
        self.result_text, self.publish_button = res.result_text, res.publish_button
        self.open_folder_button, self.evaluate_result_button = res.open_folder_button, res.evaluate_result_button
        self.steps, self.left_splitter, self.right_splitter, self.splitter = _lay_out(self)
        self.title = WindowTitle(self, TITLE, self.sources)  # the demo, a recipe's name, else the sources'
        self.statusBar().showMessage(f"RAM Desktop {__version__}")
        panels = (self.sources, self.analysis, self.run_box, self.result_box, self.evaluate, self.compare)
        self.freshness = FreshnessView(self.session, panels, self.statusBar(), self.busy)
        self.stale_status = self.freshness.status
        self.menus = Menus(self)
        self.compute = ComputeFace(self, self.settings)  # status bar label, first-start offer, Settings → Compute
        self.log_bridge = LogBridge(self)
        self.log_bridge.record.connect(self.run_box.append_log)
        self.log_bridge.install()
        self._connect()
        keyboard_friendly(self)
        restore_window(self)
        self._update_actions()

    def _connect(self) -> None:
        """The panels' and the job controller's signals; Evaluate and Compare report into the message bar."""
        self.analyse_button.clicked.connect(self.analyse)
        self.merge_button.clicked.connect(self.merge)
        self.result_box.publish_requested.connect(lambda: ecosystem.publish_dialog(self))
        self.result_box.evaluate_requested.connect(lambda: self.steps.setCurrentWidget(self.evaluate))
        self.run_box.message.connect(self.notify)
        self.jobs.state_changed.connect(self._update_actions)
        self.jobs.finished.connect(self._job_finished)
        self.jobs.failed.connect(
            lambda text: (
                self.sources.reject(text) if self.jobs.state in (JobState.ANALYSING, JobState.MERGING) else None
            )
        )
        self.session.watch(Topic.SOURCES, self._sources_changed)
        self.sources.error.connect(self.show_error)
        self.sources.browse_dir_changed.connect(lambda d: self.settings.setValue("paths/last_folder", d))
        self.session.watch(Topic.DRAFT, self._draft_changed)  # the method's settings (the form writes them)
        self.method.keep_agents.connect(self.sources.keep_only)
        self.method.out_dir_changed.connect(lambda d: self.settings.setValue("paths/last_output", d))
        self.analysis.use_float32.connect(lambda: self.edit_draft(out_dtype="float32"))
        for panel in (self.evaluate, self.compare, self.search):
            panel.error.connect(self.show_error)
            panel.info.connect(self.show_info)
        self.compare.run_requested.connect(self._compare)  # its scores show in its own tab

        self.analysis.stale.action.connect(self.analyse)
        self.result_box.stale.action.connect(self.merge)

    def edit_draft(self, **changes) -> None:
        """Change these fields of the session's draft (the method form shows them)."""
        self.session.set_draft(self.session.draft.edited(**changes))

    def _draft_changed(self, _draft: Draft) -> None:
        """The estimates and the freshness of the merge follow the method's settings in the session's draft (read
        whole: a newer one may have been written since)."""
        d = self.session.draft
        if (seen := (d.method, d.params, d.per_agent, d.eps, d.out_dtype, d.layer_map)) != self._seen:
            self._seen = seen
            self._method_changed()

    def _compare(self) -> None:
        """Compare's Run: the variants of the spec the window shows."""
        spec = self._checked_spec()
        if spec is not None:
            self.compare.start(spec, window_options(self.chunk_elements, self.sources.hub_token))

    def save_settings(self) -> None:
        save_window(self)

    def closeEvent(self, event) -> None:
        self.jobs.cancel()
        self.jobs.wait(15000)
        self.sources.cancel_downloads()
        self.sources.wait_idle(5000)
        self.save_settings()
        self.log_bridge.uninstall()
        super().closeEvent(event)

    @property
    def result(self) -> MergeResult | None:
        """The merge result shown (the session's)."""
        return self.session.result

    @property
    def report(self) -> ProbeReport | None:
        """The analysis shown (the session's)."""
        return self.session.analysis

    # --- messages and log ---------------------------------------------------------------------
    @Slot(str, str)
    def notify(self, kind: str, text: str) -> None:
        """``text`` in the bar at the top (its flags in the window's words, their fix offered) and in the log."""
        text, fix = window_words(text, self.method)
        self.message.show_message(kind, text, fix)
        self.run_box.log_once(kind, text)
        if kind == "error":
            self.statusBar().showMessage("Error — see the message at the top", 8000)

    def show_error(self, text: str) -> None:
        self.notify("error", text)

    def show_warning(self, text: str) -> None:
        self.notify("warning", text)

    def show_info(self, text: str) -> None:
        self.notify("info", text)

    def busy(self) -> bool:
        return self.jobs.busy()

    @Slot()
    def _update_actions(self) -> None:
        busy = self.busy()
        ready = self.sources.all_ready()
        self.run_box.offer(busy, ready, self.sources.merge_blocker() if ready else None)  # Analyze, Merge
        self.search.set_blocker(self.sources.not_ready("Search"))  # the same condition as Merge
        self.cancel_button.setEnabled(busy)
        self.analysis.stale.button.setEnabled(not busy and ready)  # each banner's action as its own button
        self.result_box.stale.button.setEnabled(self.merge_button.isEnabled())
        self.sources.setEnabled(not busy)
        self.method.setEnabled(not busy)
        self.menus.set_busy(busy)
        # charts not on screen wait while a merge runs and while its charts are saved
        self.analysis.set_held(
            self.jobs.state in (JobState.MERGING, JobState.SAVING_CHARTS) or bool(self.charts.pending)
        )

    def _source_key(self) -> tuple:
        return (
            self.sources.base.spec if self.sources.base else None,
            tuple(r.spec for r in self.sources.agents),
            self.session.draft.eps.strip(),
        )

    def _base_dtype(self) -> str | None:
        base = self.sources.base
        return base.checkpoint.dtype if base is not None and base.checkpoint is not None else None

    def _sources_changed(self, sources: SourcesState) -> None:
        """The Sources step changed (the session says; the method form and Evaluate follow it themselves)."""
        if self.message.kind == "error" and self.sources.error_gone(self.message.text.text()):
            self.message.hide()  # the row it told of was removed
        set_agent_slots(sources.color_slots)
        base = self.sources.base
        if base is not None and base.checkpoint is not None:
            self._default_folders(visible_folder(base.checkpoint.folder.parent), replace=False)
        self.title.follow()
        if not self.analysis.follow_sources(self._source_key(), sources.names):
            self.session.changed(Change.SOURCES)  # the analysis and everything after it
        elif self.session.stale(Part.ANALYSIS):
            self.freshness.show(Part.ANALYSIS, self.session.stale(Part.ANALYSIS))  # its hint follows the rows
        self._method_changed()
        self._update_actions()
        self._maybe_auto_analyse()

    def _default_folders(self, parent: Path, replace: bool) -> None:
        """The merge's and the comparison's output folders in ``parent`` where none is chosen (always: ``replace``)."""
        self.method.default_out(parent, replace)
        for field, name in ((self.compare.folder, "compare"), (self.search.folder, "search")):
            if replace or not field.text().strip():
                field.setText(str(free_folder(parent / name)))

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
        draft, method = self.session.draft, METHODS[self.session.draft.method]
        if self.report is None:
            self.analysis.update_method(method, {}, "base", None)
            self.freshness.method_seen()
            return
        key = self.session.analysis_key
        if key is not None and draft.eps.strip() != key[2]:
            self.session.changed(Change.EPS)
        self.freshness.method_changed()  # the merge result and the comparison
        params = engine_params(self.session.sources, draft)
        self.analysis.update_method(method, params, draft.out_dtype, self._base_dtype())

    # --- background jobs ----------------------------------------------------------------------
    @Slot(object, object)
    def _job_finished(self, state: JobState, outcome: Outcome) -> None:
        if state is JobState.ANALYSING:
            self.analysis_finished.emit(self.analysis.is_current(self._source_key()))
        elif state is JobState.MERGING and outcome is Outcome.DONE and self.result is not None:
            self.charts.queue(self.result.out)
            self._update_actions()
            self.charts.save(partial(self._merge_done, self.result))
        elif state is JobState.MERGING:
            self.merge_finished.emit(outcome.value)
        elif state is JobState.DEMO and outcome is not Outcome.DONE:
            self.analysis_finished.emit(False)
        self._maybe_auto_analyse()

    def _merge_done(self, result: MergeResult, charts: list[str]) -> None:
        """A merge and the saving of its charts are over."""
        if charts:
            self._show_result(result, charts)
            log.info("charts saved into %s: %s", result.out, ", ".join(charts))
        for w in result.warnings:
            log.warning(w)
        self.merge_finished.emit("done")

    def cancel(self) -> None:
        self.run_box.cancel()

    # --- the flow -----------------------------------------------------------------------------
    def spec(self) -> MergeSpec:
        """The spec of the session's sources and draft (the window's one way to a merge or a recipe; ``.resolved()``
        states every parameter, as a saved recipe does). Raises ``InputError`` when ε is not a number."""
        return merge_spec(self.session.sources, self.session.draft)

    def _checked_spec(self) -> MergeSpec | None:
        """The spec, validated as the engine will validate it; None after showing why not."""
        try:
            return checked_merge_spec(self.session.sources, self.session.draft)
        except InputError as e:
            self.show_error(str(e))
            return None

    def apply_spec(self, spec: MergeSpec) -> None:
        """Show a validated spec: its agents first, then its draft, each per-agent value on its agent's row."""
        self.set_sources(spec.base, spec.sources, spec.names)
        self.session.set_draft(draft_of_spec(spec, self.session.sources.identities, self.session.draft))

    def _ready_spec(self, action: str) -> MergeSpec | None:
        """The checked spec to Analyze or Merge; None (after saying why) while busy or not ready."""
        if self.busy():
            return None
        problem = self.sources.not_ready(action)  # a row missing, failing, or refused by the analysis
        if problem is not None:
            self.show_error(problem)
            return None
        if action == "Merge" and self.method.refused(self.show_error, self.message.offer):
            return None  # said in section 3 as it was typed; now in the bar too, with its fix
        return self._checked_spec()

    def analyse(self) -> None:
        spec = self._ready_spec("Analyze")
        if spec is None:
            return
        self.message.hide()
        key = self._source_key()

        def done(report: ProbeReport) -> None:
            self.sources.reject("")  # the analysis took every row
            self.session.set_analysis(report, key)
            self._method_changed()
            text = (
                f"Analysed {report.params:,} elements in {report.tensors} tensors "
                f"(ε = {report.eps:g}). Pick a method and Merge."
            )
            self.run_box.show_state(1000, "Analysis done", text)
            for w in report.warnings:
                self.show_warning(w)

        options = window_options(self.chunk_elements, self.sources.hub_token)
        self.jobs.start(JobState.ANALYSING, partial(run_probe, spec, options), done)

    def _confirm_replace(self, out: Path) -> bool:
        answer = QMessageBox.question(
            self,
            "Replace the output folder?",
            f"{out} holds an earlier RAM Desktop output. Replace it with this merge?",
            QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No,
            QMessageBox.StandardButton.No,
        )
        return answer == QMessageBox.StandardButton.Yes

    def merge(self) -> None:
        spec = self._ready_spec("Merge")
        if spec is None:
            return
        inputs = [r.checkpoint for r in (self.sources.base, *self.sources.agents) if r and r.checkpoint]
        try:
            options = merge_options(spec, inputs, self._confirm_replace, self.sources.hub_token, self.chunk_elements)
        except InputError as e:
            self.show_error(str(e))
            if isinstance(e, NotReplaceable):
                self.message.offer(f"Use {e.free.name}", partial(self.edit_draft, output=str(e.free)))
            return
        if options is None:
            return
        self.message.hide()
        self.session.set_result(None)
        log.info("merging %d agents with %s into %s", len(spec.agents), spec.method, spec.output)
        self.jobs.start(
            JobState.MERGING, partial(run_merge, spec, options), partial(self._merged, key=self._source_key())
        )

    def _merged(self, result: MergeResult, key: tuple) -> None:
        self.session.set_result(result)
        report = self.report
        if key == self._source_key() and (
            report is None or report.names != result.probe.names or self.session.analysis_key != key
        ):
            self.session.set_analysis(result.probe, key)
            self._method_changed()
        self.freshness.merged(result.out)
        self._show_result(result, [])
        self.session.offer_model(ModelEntry(result.out.name, str(result.out), "merged"))

    def _show_result(self, result: MergeResult, charts: list[str]) -> None:
        self.run_box.show_state(1000, "Merge done", f"Merged in {duration(result.seconds)}")
        self.result_box.show_result(result, charts)
        self.settings.setValue("paths/last_output", str(result.out))
        self.statusBar().showMessage(f"Merged into {result.out}", 15000)

    def export_charts(self, folder: Path) -> list[str]:
        """Save the analysis charts as PNG files into ``folder`` now; return their names."""
        return self.charts.export(folder)

    # --- demo and recipes ---------------------------------------------------------------------
    def load_demo(self) -> None:
        """Generate (once) and load the demo agents, then analyse them."""
        if self.busy():
            return

        def loaded(paths) -> None:
            base, agents = paths
            self.set_sources(str(base), [str(a) for a in agents], None)
            self.title.set(DEMO_TITLE)
            log.info("the built-in demo is a toy (156k parameters, instant); %s", REAL_RESULTS)
            try:
                found = [str(p) for p in demo_suites(Path(base).parent, agents)]
            except InputError:
                found = []
            self.method.set_agent_defaults("suite", dict(zip(self.sources.names, found)) or None)
            self._default_folders(outputs_dir() / "demo", replace=True)  # visible, not in the cache
            self.evaluate.preload_demo(Path(base).parent)  # the agents' suites, when demo.json names them
            self.search.set_validation(
                sorted(p.parent for p in (Path(base).parent / "suites" / "validation").glob("*/data.jsonl"))
            )
            log.info("demo agents loaded from %s", Path(base).parent)

        self.jobs.start(JobState.DEMO, lambda reporter: ensure_demo(), loaded)

    def set_sources(self, base: str, agents: list[str], names: list[str] | None, analyse: bool = True) -> None:
        self.method.forget_agents()  # another set of agents: the demo's suites and a file's layer map go
        self.setWindowTitle(TITLE)
        self.sources.clear()
        self.session.set_analysis(None)
        self._analyse_when_ready = analyse
        self.sources.set_base(base)
        for i, spec in enumerate(agents):
            self.sources.add_agent(spec, names[i] if names else None)

    def open_recipe(self, path: Path) -> bool:
        """Load a recipe into the window (File ▸ Open recipe); False after showing why not."""
        return self.menus.open_recipe(path)

    def save_recipe(self, path: Path) -> bool:
        """Save what the window shows as a recipe (File ▸ Save recipe); False after showing why not."""
        return self.menus.save_recipe(path)


def _lay_out(window: MainWindow) -> tuple[StepTabs, QSplitter, QSplitter, QSplitter]:
    """The window's areas: sources and method on the left, the steps, Merge and Result on the right; returns the
    step tabs, the left and right splitters and the one between them."""
    # Analysis, Evaluate and Compare share the large pane; every part scrolls on a small (1366×768) screen
    steps = StepTabs()
    steps.add_page(window.analysis, "2 · Analysis — density, overlap, where, which, how much")
    steps.add_page(window.evaluate, "6 · Evaluate")
    steps.add_page(window.compare, "7 · Compare")
    steps.add_page(window.search, "8 · Search")
    left_splitter = splitter(
        Qt.Orientation.Vertical,
        (scrolled(group("1 · Sources — base model and agents", window.sources), keep_height=True), 0),
        (scrolled(group("3 · Method and output", window.method)), 1),
    )
    right_splitter = splitter(
        Qt.Orientation.Vertical,
        (steps, 3),
        (group("4 · Merge", window.run_box), 1),
        (result_group := group("5 · Result", window.result_box), 0),
    )
    steps.shown_only_with(window.analysis, result_group)  # scoring steps need the height
    between = splitter(Qt.Orientation.Horizontal, (left_splitter, 2), (right_splitter, 3))
    central = QWidget()
    layout = QVBoxLayout(central)
    layout.setContentsMargins(8, 6, 8, 8)
    layout.addWidget(window.message)
    layout.addWidget(between, 1)
    window.setCentralWidget(central)
    return steps, left_splitter, right_splitter, between
