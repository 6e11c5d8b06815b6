"""Background work: a QThread runs one core call for a worker object that stays in the GUI thread, turning
the core's progress events into (throttled) Qt signals, queued to the GUI thread; the core's logging reaches
the window through a thread-safe handler. Cancellation is the core's cooperative ``CancelToken``.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable
from typing import Any, ClassVar

from PySide6.QtCore import QObject, Qt, QThread, Signal, Slot

from ..core import Cancelled, CancelToken, DeviceOutOfMemory, ProgressEvent, RamError, Reporter

log = logging.getLogger("ram_desktop")

PROGRESS_INTERVAL = 0.1  # seconds between progress signals: ten updates a second, the GUI thread never flooded


def _released(reporter: Reporter) -> None:
    raise RuntimeError("this worker has already run")


class Worker(QObject):
    """Runs ``fn(reporter)`` once, called from its job's thread. Exactly one of ``succeeded``, ``failed`` (a
    message meant for the user), ``crashed`` (a bug: message and traceback) or ``cancelled`` is emitted, then
    ``done``. The worker itself lives in the GUI thread and is never moved: no Qt object changes thread."""

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
            result = self._fn(Reporter(self._on_progress, self.token))
        except Cancelled:
            self.cancelled.emit()
        except DeviceOutOfMemory as e:
            self.failed.emit(
                f"The GPU {e.device} ran out of memory while {e.doing}; nothing was written. Close other programs "
                "that use it, or choose the CPU under Device in Method and output."
            )
        except RamError as e:
            self.failed.emit(str(e))
        except MemoryError:
            self.failed.emit("out of memory; close other programs, or merge on a machine with more memory")
        except OSError as e:
            self.failed.emit(f"{e.filename or 'file system'}: {e.strerror or e}")
        except Exception as e:  # noqa: BLE001  a bug: reported, never swallowed, never a frozen window
            self.crashed.emit(f"{type(e).__name__}: {e}", traceback.format_exc())
        else:
            if self.token.cancelled:
                self.cancelled.emit()
            else:
                self.succeeded.emit(result)
        finally:
            self._fn = _released  # what the function captured is freed now, not when the worker is deleted
            self.done.emit()

    def cancel(self) -> None:
        self.token.cancel()


class Job(QObject):
    """Owns a worker and its thread, and releases both when the work ends (``finished``).

    The GUI's one way to run work in the background (analysis, merge, chart export, opening sources,
    listing Hub files). Lifecycle: the worker and the thread object both live in the GUI thread; the
    thread's ``run`` calls the worker, whose signals are queued to the GUI thread; once the thread has
    finished, the job deletes the worker and the thread there and then itself, so a finished job holds
    nothing — not its function nor what that captured. No Qt object is created, moved or destroyed in the
    worker thread: each of those takes Qt's internal locks while holding the GIL, and the GUI thread,
    destroying a widget, takes such a lock and then asks for the GIL — two deadlocks seen in the GUI tests,
    the first with a destructor in the worker, the second with ``moveToThread`` back to the GUI thread.) A job without a parent keeps itself alive until it
    finishes, so a dialog that is closed while its job runs never destroys a running thread. After
    ``finished``, ``is_running`` is False, ``wait`` returns True and ``cancel`` does nothing."""

    # the worker's signals, re-emitted by the job in the GUI thread: connect plain functions and lambdas
    # here (connected to the worker's own signals they would run in the worker thread)
    progress = Signal(object)
    succeeded = Signal(object)
    failed = Signal(str)
    crashed = Signal(str, str)
    cancelled = Signal()
    finished = Signal()
    _detached: ClassVar[set[Job]] = set()

    def __init__(self, fn: Callable[[Reporter], Any], parent: QObject | None = None) -> None:
        super().__init__(parent)
        if parent is None:
            Job._detached.add(self)
        self.worker: Worker | None = Worker(fn)
        self.qthread: QThread | None = _WorkerThread(self.worker)  # not "thread": that is QObject.thread()
        self.qthread.setObjectName("ram-desktop-worker")
        for name in ("progress", "succeeded", "failed", "crashed", "cancelled"):
            # queued: emitted in the worker thread, received by the job in the GUI thread
            getattr(self.worker, name).connect(getattr(self, name), Qt.ConnectionType.QueuedConnection)
        self.qthread.finished.connect(self._cleanup)  # queued: after the worker's results were delivered
        self.started_at = 0.0

    def start(self) -> None:
        if self.qthread is not None:
            self.started_at = time.monotonic()
            self.qthread.start()

    def cancel(self) -> None:
        if self.worker is not None:
            self.worker.cancel()

    def is_running(self) -> bool:
        return self.qthread is not None and self.qthread.isRunning()

    def wait(self, ms: int = 30000) -> bool:
        return self.qthread is None or self.qthread.wait(ms)

    @Slot()
    def _cleanup(self) -> None:
        if self.qthread is not None:
            self.qthread.wait()  # its run() has returned
            self.qthread.deleteLater()
        if self.worker is not None:
            self.worker.deleteLater()
        self.qthread, self.worker = None, None
        self.finished.emit()
        Job._detached.discard(self)
        self.deleteLater()


class _WorkerThread(QThread):
    """The thread of one job: its ``run`` calls the worker (which stays in the GUI thread) and returns."""

    def __init__(self, worker: Worker) -> None:
        super().__init__()
        self._worker: Worker | None = worker

    def run(self) -> None:
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.run()


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
        except Exception:  # noqa: BLE001  logging.Handler's convention: handleError reports it
            self.handleError(record)
