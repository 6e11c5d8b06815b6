"""Progress events and cooperative cancellation between core and its faces.

Core never prints: it calls ``Reporter.progress`` and logs through the ``ram_desktop`` logger.
The CLI turns events into a tqdm bar, the GUI worker into Qt signals.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .errors import Cancelled

log = logging.getLogger("ram_desktop")


@dataclass(frozen=True)
class ProgressEvent:
    """``done`` of ``total`` units of ``stage`` ("resolve", "probe", "merge", "download", ...)."""

    stage: str
    done: int
    total: int
    unit: str = "B"
    elapsed: float = 0.0
    detail: str = ""  # optional human-readable line, e.g. the file being downloaded and its own progress

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 1.0


class CancelToken:
    """Thread-safe flag checked between chunks; ``cancel()`` may be called from any thread."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def cancel(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def raise_if_cancelled(self) -> None:
        if self._event.is_set():
            raise Cancelled("cancelled by the user")


class Reporter:
    """What a long-running core call receives: a progress callback and a cancel token."""

    def __init__(
        self,
        on_progress: Callable[[ProgressEvent], None] | None = None,
        cancel: CancelToken | None = None,
    ) -> None:
        self._on_progress = on_progress
        self.cancel = cancel or CancelToken()
        self._stage_start: dict[str, float] = {}

    def progress(self, stage: str, done: int, total: int, unit: str = "B", detail: str = "") -> None:
        """Report progress and check for cancellation (the natural point between chunks)."""
        start = self._stage_start.setdefault(stage, time.perf_counter())
        if self._on_progress is not None:
            self._on_progress(ProgressEvent(stage, done, total, unit, time.perf_counter() - start, detail))
        self.cancel.raise_if_cancelled()

    def check(self) -> None:
        self.cancel.raise_if_cancelled()


def human_bytes(n: float) -> str:
    """A byte count in the unit that fits: 512 B, 3.4 KB, 12.0 MB, 1.5 GB (decimal, as disk tools show); every
    size the core reports to a user (merge outputs, disk checks, downloads) is written with it."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000.0
    return f"{n:.1f} TB"
