"""Step 4 of the window: Analyze, Merge and Cancel, the progress bar with one line of progress text,
and the log."""

from __future__ import annotations

import logging

from PySide6.QtCore import Signal, Slot
from PySide6.QtWidgets import (
    QHBoxLayout,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from ...core import ProgressEvent, human_bytes
from ..evaluate.run_bar import duration
from ..jobs import JobController, JobState
from ..widgets.common import ElidedLabel

log = logging.getLogger("ram_desktop")

STAGE_LABELS = {
    "probe": "Analysing",
    "merge": "Merging",
    "fisher": "Estimating Fisher",
    "download": "Downloading",
    "resolve": "Resolving",
}
START_TEXT = {
    JobState.ANALYSING: "Analysing…",
    JobState.MERGING: "Preparing the merge…",
    JobState.DEMO: "Generating the demo agents…",
}


MERGE_TIP = "Merge the agents into one model in the output folder"  # when nothing blocks it


class RunBox(QWidget):
    """The buttons that start and stop the window's jobs, their progress and the log. It follows the job
    controller (progress, how a job ended) and Cancel stops its job; the window connects Analyze and
    Merge. ``message(kind, text)``: a failure or cancellation for the window's message bar."""

    message = Signal(str, str)  # "error" | "info", text

    def __init__(self, jobs: JobController, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.jobs = jobs
        self.log_view = QPlainTextEdit()
        self.log_view.setReadOnly(True)
        self.log_view.setMaximumBlockCount(5000)
        self.log_view.setPlaceholderText("Log: what the engine does, warnings and errors")
        self.log_view.setStyleSheet("font-family: monospace; font-size: 9pt;")
        self.analyse_button = QPushButton("Analyze")
        self.analyse_button.setToolTip("Probe pass: measure density and overlap of the agents' task vectors")
        self.merge_button = QPushButton("Merge")
        self.merge_button.setToolTip(MERGE_TIP)
        self.merge_button.setStyleSheet("QPushButton:enabled { font-weight: bold; }")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setToolTip("Stop; a cancelled merge leaves nothing behind")
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setTextVisible(True)
        self.progress.setFormat("")
        self.progress_label = ElidedLabel("Ready")
        self.progress_label.setMinimumWidth(260)
        # progress text changes must never re-lay out the window (that would re-render every chart)
        self.progress_label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
        self.progress_label.setFixedHeight(self.progress_label.sizeHint().height())

        run_row = QHBoxLayout()
        run_row.addWidget(self.analyse_button)
        run_row.addWidget(self.merge_button)
        run_row.addWidget(self.cancel_button)
        run_row.addWidget(self.progress, 1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(run_row)
        layout.addWidget(self.progress_label)
        layout.addWidget(self.log_view, 1)
        self.cancel_button.clicked.connect(self.cancel)
        jobs.state_changed.connect(self._state_changed)
        jobs.progress.connect(self._progress)
        jobs.failed.connect(self._failed)
        jobs.crashed.connect(self._crashed)
        jobs.cancelled.connect(self._cancelled)

    def offer(self, busy: bool, ready: bool, merge_blocker: str | None) -> None:
        """Analyze and Merge enabled when no job runs and the sources are ready; Merge not while a row blocks it
        (``merge_blocker``: why, shown as Merge's tooltip)."""
        self.analyse_button.setEnabled(not busy and ready)
        self.merge_button.setEnabled(not busy and ready and merge_blocker is None)
        self.merge_button.setToolTip(merge_blocker or MERGE_TIP)

    def show_state(self, value: int, bar: str, text: str) -> None:
        """Set the bar (``value`` of 1000, its text) and the progress line."""
        self.progress.setValue(value)
        self.progress.setFormat(bar)
        self.progress_label.setText(text)

    def _mine(self) -> bool:
        """The running job is one this box shows (not a chart export, an evaluation or a comparison)."""
        return self.jobs.state in START_TEXT

    def cancel(self) -> None:
        """Stop the running job (it ends at its next check)."""
        if self._mine() and self.jobs.cancel():
            self.cancel_button.setEnabled(False)
            self.progress_label.setText("Cancelling…")

    @Slot(object)
    def _state_changed(self, state: JobState) -> None:
        if state in START_TEXT:
            self.show_state(0, "", START_TEXT[state])

    @Slot(str)
    def _failed(self, message: str) -> None:
        if not self._mine():
            return
        self.message.emit("error", message)  # the window shows it and logs it, once
        self.progress_label.setText("Stopped by an error (see above)")
        self.progress.setFormat("")

    @Slot(str, str)
    def _crashed(self, message: str, details: str) -> None:
        if not self._mine():
            return
        log.error("unexpected error (a bug in RAM Desktop): %s\n%s", message, details)
        self.message.emit(
            "error",
            f"unexpected error: {message}. This is a bug in RAM Desktop; the log has the "
            "details. Nothing was written to the output folder.",
        )
        self.progress_label.setText("Stopped by an unexpected error")

    @Slot()
    def _cancelled(self) -> None:
        if not self._mine():
            return
        what = "Merge cancelled; nothing was written." if self.jobs.state is JobState.MERGING else "Cancelled."
        log.info(what)
        self.message.emit("info", what)
        self.show_state(0, "", what)

    @Slot(object)
    def _progress(self, event: ProgressEvent) -> None:
        if self._mine():
            self.show_progress(event)

    def show_progress(self, event: ProgressEvent) -> None:
        label = STAGE_LABELS.get(event.stage, event.stage.capitalize())
        frac = event.fraction
        text = f"{label}: {amount(event.done, event.unit)} of {amount(event.total, event.unit)}"
        if event.elapsed > 0.2 and event.done > 0:
            rate = event.done / event.elapsed
            text += f" · {amount(rate, event.unit)}/s"
            if event.done < event.total:
                text += f" · about {duration((event.total - event.done) / rate)} left"
        self.show_state(int(1000 * frac), f"{label} {100 * frac:.0f} %", text)

    @Slot(int, str)
    def append_log(self, level: int, line: str) -> None:
        self._recent = [*getattr(self, "_recent", [])[-7:], line]
        color = "#b3261e" if level >= logging.ERROR else "#8a5a00" if level >= logging.WARNING else "#333333"
        escaped = line.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        self.log_view.appendHtml(f'<span style="color:{color}; white-space:pre-wrap">{escaped}</span>')
        bar = self.log_view.verticalScrollBar()  # the log follows its newest line
        bar.setValue(bar.maximum())

    def log_once(self, kind: str, text: str) -> None:
        """A message the window shows (error, warning) into the log too, unless one of its last lines has it."""
        if kind in ("error", "warning") and not any(text in line for line in getattr(self, "_recent", [])):
            log.log(logging.ERROR if kind == "error" else logging.WARNING, text)


def amount(value: float, unit: str) -> str:
    """``value`` of ``unit`` for a person: bytes as KB/MB/GB, other units with k, M, G."""
    if unit == "B":
        return human_bytes(value)
    for suffix, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= size:
            return f"{value / size:.1f} {suffix} {unit}"
    return f"{value:.2f} {unit}" if 0 < value < 10 and value != int(value) else f"{value:.0f} {unit}"
