"""The run bar of the Evaluate and Compare steps (start, Cancel, progress with the time left) and the
job such a step runs through the window's job controller."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, ClassVar

from PySide6.QtCore import QObject, Signal, Slot
from PySide6.QtWidgets import QHBoxLayout, QProgressBar, QPushButton, QSizePolicy, QVBoxLayout, QWidget

from ...core import ProgressEvent, Reporter
from ..jobs import JobController, JobState, Outcome
from ..widgets.common import ElidedLabel

log = logging.getLogger("ram_desktop")


def eta_text(label: str, event: ProgressEvent, stage_start: tuple[float, int]) -> str:
    """``label: done of total unit · rate · about T left`` from the progress since the stage began."""
    text = f"{label}: {event.done:,} of {event.total:,} {event.unit}"
    t0, done0 = stage_start
    elapsed, done = time.monotonic() - t0, event.done - done0
    if elapsed > 0.2 and done > 0:
        rate = done / elapsed
        text += f" · {rate:.1f} {event.unit}/s"
        if event.done < event.total:
            text += f" · about {duration((event.total - event.done) / rate, coarse=True)} left"
    return text


def duration(seconds: float, coarse: bool = False) -> str:
    """A duration for a person: 0.42 s, 12.3 s, 4 min 05 s, 2 h 10 min; ``coarse`` (the steps' progress
    lines): 3.2 s, 42 s under 90 s."""
    if seconds < 90:
        if coarse:
            return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
        return f"{seconds:.2f} s" if seconds < 1 else f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes} min {secs:02d} s" if minutes < 90 else f"{minutes // 60} h {minutes % 60:02d} min"


class RunBar(QWidget):
    """Start button, Cancel, a progress bar and one line of progress text with the time left."""

    STAGES: ClassVar[dict[str, str]] = {
        "evaluate": "Evaluating",
        "probe": "Analysing",
        "merge": "Merging",
        "resolve": "Resolving",
        "download": "Downloading",
    }

    def __init__(self, start_text: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.start_button = QPushButton(start_text)
        self.start_button.setStyleSheet("QPushButton:enabled { font-weight: bold; }")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.bar = QProgressBar()
        self.bar.setRange(0, 1000)
        self.bar.setFormat("")
        self.label = ElidedLabel("")
        self.label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)  # text changes never re-lay out
        self.label.setFixedHeight(self.label.sizeHint().height())
        self.label.setStyleSheet("color: #444;")
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.start_button)
        row.addWidget(self.cancel_button)
        row.addWidget(self.bar, 1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addLayout(row)
        layout.addWidget(self.label)
        self._stage = ("", 0.0, 0)

    def begin(self, text: str) -> None:
        self.bar.setValue(0)
        self.bar.setFormat("")
        self.label.setText(text)
        self._stage = ("", 0.0, 0)

    def show_progress(self, event: ProgressEvent) -> None:
        if event.stage != self._stage[0]:
            self._stage = (event.stage, time.monotonic(), event.done)
        label = self.STAGES.get(event.stage, event.stage.capitalize())
        self.bar.setValue(int(1000 * event.fraction))
        self.bar.setFormat(f"{label} {100 * event.fraction:.0f} %")
        text = eta_text(label, event, self._stage[1:])
        if event.detail:
            text += f" · {event.detail}"
        self.label.setText(text)

    def end(self, text: str, done: bool) -> None:
        self.bar.setValue(1000 if done else 0)
        self.bar.setFormat("Done" if done else "")
        self.label.setText(text)


class PanelJob(QObject):
    """The one kind of job (``state``) a step runs through the window's job controller. While it runs,
    its progress goes into the step's :class:`RunBar` and its failure or cancellation comes out as
    ``failed(message, details)`` / ``cancelled()``; ``finished(status)`` ("done", "failed",
    "cancelled") once it ends. Another job running anywhere in the window keeps it from starting."""

    failed = Signal(str, str)  # a message for the user, details for the log (a traceback, or "")
    cancelled = Signal()
    finished = Signal(str)

    def __init__(self, jobs: JobController, state: JobState, bar: RunBar, parent: QObject) -> None:
        super().__init__(parent)
        self.jobs, self.state, self.bar = jobs, state, bar
        jobs.progress.connect(self._progress)
        jobs.failed.connect(self._failed)
        jobs.crashed.connect(self._crashed)
        jobs.cancelled.connect(self._cancelled)
        jobs.finished.connect(self._finished)

    def running(self) -> bool:
        return self.jobs.state is self.state

    def start(self, fn: Callable[[Reporter], Any], on_success: Callable[[Any], None], text: str) -> bool:
        """Run ``fn``; False (nothing started) while another job runs."""
        if self.jobs.busy():
            return False
        self.bar.begin(text)
        return self.jobs.start(self.state, fn, on_success)

    def cancel(self, text: str) -> None:
        """Stop it (at its next check), showing ``text`` meanwhile."""
        if self.running() and self.jobs.cancel():
            self.bar.cancel_button.setEnabled(False)
            self.bar.label.setText(text)

    @Slot(object)
    def _progress(self, event: ProgressEvent) -> None:
        if self.running():
            self.bar.show_progress(event)

    @Slot(str)
    def _failed(self, message: str) -> None:
        if self.running():
            self.failed.emit(message, "")

    @Slot(str, str)
    def _crashed(self, message: str, details: str) -> None:
        if self.running():
            self.failed.emit(
                f"unexpected error: {message}. This is a bug in RAM Desktop; the log has the details.", details
            )

    @Slot()
    def _cancelled(self) -> None:
        if self.running():
            self.cancelled.emit()

    @Slot(object, object)
    def _finished(self, state: JobState, outcome: Outcome) -> None:
        if state is self.state:
            self.finished.emit(outcome.value)
