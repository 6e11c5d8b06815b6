"""Background work: a QObject moved to a QThread runs one core call, turning the core's progress
events into (throttled) Qt signals; the core's logging reaches the window through a thread-safe
handler. Cancellation is the core's cooperative ``CancelToken``.
"""

from __future__ import annotations

import logging
import time
import traceback
from typing import Any, Callable

from PySide6.QtCore import QObject, Qt, QThread, Signal, Slot

from ..core import kernels
from ..core.errors import Cancelled, RamError
from ..core.events import CancelToken, ProgressEvent, Reporter

log = logging.getLogger("ram_desktop")

PROGRESS_INTERVAL = 0.1  # seconds between progress signals: ten updates a second, the GUI thread never flooded
# Window jobs run the fused CPU kernels only on passes over this many elements or more: loading numba's
# kernels holds the GIL long enough to freeze the event loop once (core/kernels.py ``disabled``), which a
# 300M-parameter merge or Analyze repays many times over and a small model's does not.
KERNEL_MIN_ELEMENTS = 50_000_000


class Worker(QObject):
    """Runs ``fn(reporter)`` once in its thread. Exactly one of ``succeeded``, ``failed`` (a message meant
    for the user), ``crashed`` (a bug: message and traceback) or ``cancelled`` is emitted, then ``done``."""

    progress = Signal(object)  # ProgressEvent
    succeeded = Signal(object)
    failed = Signal(str)
    crashed = Signal(str, str)
    cancelled = Signal()
    done = Signal()

    def __init__(self, fn: Callable[[Reporter], Any]) -> None:
        super().__init__()
        self._fn = fn
        self.token = CancelToken()
        self._last_emit = 0.0
        self._last_stage = ""

    def _on_progress(self, event: ProgressEvent) -> None:
        now = time.monotonic()
        final = event.done >= event.total
        if final or event.stage != self._last_stage or now - self._last_emit >= PROGRESS_INTERVAL:
            self._last_emit = now
            self._last_stage = event.stage
            self.progress.emit(event)

    @Slot()
    def run(self) -> None:
        try:
            with kernels.disabled(below=KERNEL_MIN_ELEMENTS):
                result = self._fn(Reporter(self._on_progress, self.token))
        except Cancelled:
            self.cancelled.emit()
        except RamError as e:
            self.failed.emit(str(e))
        except MemoryError:
            self.failed.emit("out of memory; close other programs, or merge on a machine with more memory")
        except OSError as e:
            self.failed.emit(f"{e.filename or 'file system'}: {e.strerror or e}")
        except Exception as e:  # a bug: reported, never swallowed, never a frozen window
            self.crashed.emit(f"{type(e).__name__}: {e}", traceback.format_exc())
        else:
            if self.token.cancelled:
                self.cancelled.emit()
            else:
                self.succeeded.emit(result)
        finally:
            self.done.emit()

    def cancel(self) -> None:
        self.token.cancel()


class Job(QObject):
    """Owns a worker and its thread; both are cleaned up when the work ends (``finished``).

    The GUI's one way to run work in the background (analysis, merge, chart export, opening sources,
    listing Hub files). A job without a parent keeps itself alive until it finishes, so a dialog that
    is closed while its job runs never destroys a running thread."""

    # the worker's signals, re-emitted by the job in the GUI thread: connect plain functions and lambdas
    # here (connected to the worker's own signals they would run in the worker thread)
    progress = Signal(object)
    succeeded = Signal(object)
    failed = Signal(str)
    crashed = Signal(str, str)
    cancelled = Signal()
    finished = Signal()
    _detached: set["Job"] = set()

    def __init__(self, fn: Callable[[Reporter], Any], parent: QObject | None = None) -> None:
        super().__init__(parent)
        if parent is None:
            Job._detached.add(self)
            self.finished.connect(lambda: Job._detached.discard(self))
        self.worker = Worker(fn)
        self.thread = QThread()
        self.thread.setObjectName("ram-desktop-worker")
        self.worker.moveToThread(self.thread)
        for name in ("progress", "succeeded", "failed", "crashed", "cancelled"):
            getattr(self.worker, name).connect(getattr(self, name))  # queued: the job lives in the GUI thread
        self.thread.started.connect(self.worker.run)
        # direct: quit() is thread-safe, and a GUI thread blocked in wait() (closing) must not deadlock
        self.worker.done.connect(self.thread.quit, Qt.DirectConnection)
        self.thread.finished.connect(self._cleanup)
        self.started_at = 0.0

    def start(self) -> None:
        self.started_at = time.monotonic()
        self.thread.start()

    def cancel(self) -> None:
        self.worker.cancel()

    def is_running(self) -> bool:
        return self.thread.isRunning()

    def wait(self, ms: int = 30000) -> bool:
        return self.thread.wait(ms)

    @Slot()
    def _cleanup(self) -> None:
        self.worker.deleteLater()
        self.thread.deleteLater()
        self.finished.emit()


class LogBridge(QObject):
    """A ``logging.Handler`` on the ``ram_desktop`` logger that forwards records from any thread as a
    signal (queued to the GUI thread by Qt)."""

    record = Signal(int, str)  # level, formatted line

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.handler = _SignalHandler(self)
        self.handler.setFormatter(logging.Formatter("%(asctime)s  %(levelname)-7s %(message)s", "%H:%M:%S"))

    def install(self, logger: logging.Logger = log) -> None:
        if self.handler not in logger.handlers:
            logger.addHandler(self.handler)
        if logger.level == logging.NOTSET or logger.level > logging.INFO:
            logger.setLevel(logging.INFO)

    def uninstall(self, logger: logging.Logger = log) -> None:
        logger.removeHandler(self.handler)


class _SignalHandler(logging.Handler):
    def __init__(self, bridge: LogBridge) -> None:
        super().__init__(logging.INFO)
        self.bridge = bridge

    def emit(self, record: logging.LogRecord) -> None:
        try:
            saved, record.exc_info, record.exc_text = (record.exc_info, record.exc_text), None, None
            line = self.format(record)
            record.exc_info, record.exc_text = saved
            self.bridge.record.emit(record.levelno, line)
        except RuntimeError:  # the window is gone (application shutting down)
            pass
        except Exception:
            self.handleError(record)
