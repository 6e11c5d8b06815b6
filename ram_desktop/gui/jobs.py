"""The window's job controller: the one job that runs for the main window, its explicit state, and
start, cancel and finish in one place. A finished job is dropped with all it held."""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any

from PySide6.QtCore import QObject, Signal, Slot

from ..core import Reporter
from .worker import Job


class JobState(Enum):
    """What the window is doing in the background."""

    IDLE = "idle"
    DEMO = "demo"  # copying the built-in demo into the cache
    ANALYSING = "analysing"  # the probe pass
    MERGING = "merging"
    SAVING_CHARTS = "saving charts"  # a merge's charts written into its output folder
    EVALUATING = "evaluating"  # the Evaluate step scores models on suites
    COMPARING = "comparing"  # the Compare step merges (and scores) variants
    SEARCHING = "searching"  # the Search tab runs trials


class Outcome(Enum):
    """How a job ended."""

    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


class JobController(QObject):
    """Runs one job at a time for the whole window (its own, Evaluate's and Compare's). ``finished(state, outcome)`` comes once per job, after its result was
    delivered to ``on_success`` (done) or ``failed`` / ``crashed`` / ``cancelled`` were emitted; by then
    the controller is idle again and holds nothing of the job."""

    state_changed = Signal(object)  # JobState
    progress = Signal(object)  # ProgressEvent
    failed = Signal(str)  # a message for the user
    crashed = Signal(str, str)  # a bug: message, traceback
    cancelled = Signal()
    finished = Signal(object, object)  # JobState, Outcome

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.state = JobState.IDLE
        self.job: Job | None = None
        self._on_success: Callable[[Any], None] | None = None
        self._outcome = Outcome.FAILED

    def busy(self) -> bool:
        return self.job is not None

    def start(self, state: JobState, fn: Callable[[Reporter], Any], on_success: Callable[[Any], None]) -> bool:
        """Run ``fn`` in a worker thread as ``state``; ``on_success(result)`` on the GUI thread. False
        (and nothing started) while another job runs."""
        if self.job is not None or state is JobState.IDLE:
            return False
        self.job = Job(fn)
        self.job.progress.connect(self.progress)
        self.job.succeeded.connect(self._succeeded)
        self.job.failed.connect(self.failed)
        self.job.crashed.connect(self.crashed)
        self.job.cancelled.connect(self._cancelled)
        self.job.finished.connect(self._finished)
        self._on_success, self._outcome = on_success, Outcome.FAILED
        self._set_state(state)
        self.job.start()
        return True

    def cancel(self) -> bool:
        """Ask the running job to stop (cooperatively); False when none runs."""
        if self.job is None:
            return False
        self.job.cancel()
        return True

    def wait(self, ms: int = 30000) -> bool:
        """Block until the running job's thread has ended (closing the window, tests)."""
        return self.job is None or self.job.wait(ms)

    def _set_state(self, state: JobState) -> None:
        self.state = state
        self.state_changed.emit(state)

    @Slot(object)
    def _succeeded(self, result: Any) -> None:
        self._outcome = Outcome.DONE
        if self._on_success is not None:
            self._on_success(result)

    @Slot()
    def _cancelled(self) -> None:
        self._outcome = Outcome.CANCELLED
        self.cancelled.emit()

    @Slot()
    def _finished(self) -> None:
        state, outcome = self.state, self._outcome
        self.job, self._on_success = None, None  # the job deletes itself; its result callback goes too
        self._set_state(JobState.IDLE)
        self.finished.emit(state, outcome)
