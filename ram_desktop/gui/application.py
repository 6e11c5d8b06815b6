"""Application-wide Qt setup shared by the window (``app``) and the self-test (``selftest``)."""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from typing import Any

from .. import __version__

log = logging.getLogger("ram_desktop")
ORGANIZATION, APPLICATION = "RAM Desktop", "ram-desktop"


def setup_application(app) -> bool:
    """Names, the .desktop id and the window icon of the application; True when the icon loaded.

    The icon is optional: a non-editable wheel install does not carry ``resources/``.
    """
    from PySide6.QtGui import QIcon

    from .. import paths
    from .analysis import charts
    from .widgets.common import guard_wheel

    app.setOrganizationName(ORGANIZATION)
    app.setApplicationName(APPLICATION)
    app.setApplicationDisplayName("RAM Desktop")
    app.setApplicationVersion(__version__)
    app.setDesktopFileName(paths.APP_ID)  # Wayland / X11 match the window to ram-desktop.desktop
    charts.configure()
    guard_wheel()
    collect_garbage_on_gui_thread()
    for name in ("ram-desktop.svg", "ram-desktop.png"):
        try:
            icon = QIcon(str(paths.resource_path(name)))
        except FileNotFoundError:
            continue
        if not icon.pixmap(64, 64).isNull():  # the file exists and Qt's image plugins can read it
            app.setWindowIcon(icon)
            return True
    log.debug("no window icon found; going on without one")
    return False


_collector: Any = None  # pyqtgraph's GarbageCollector while it runs


def collect_garbage_on_gui_thread() -> None:
    """Python's cyclic garbage collector runs in whichever thread crosses its threshold: a merge's compute
    threads, a job's QThread. There it would destroy Qt objects left in reference cycles (a closed window or
    dialog and every widget in it), which Qt allows only in the GUI thread; the GUI tests saw whole windows
    destroyed in a merge thread, and a test run hang. Automatic collection is switched off and the GUI thread
    collects on a one-second timer instead (pyqtgraph's ``GarbageCollector``), by the same thresholds."""
    global _collector
    if _collector is None:
        from pyqtgraph.util.garbage_collector import GarbageCollector

        _collector = GarbageCollector()


def collect_garbage_automatically() -> None:
    """Undo ``collect_garbage_on_gui_thread``: collect everything now, on this (the GUI) thread, and let Python
    collect by itself again (the GUI tests, after each window's jobs have ended)."""
    global _collector
    if _collector is not None:
        _collector.timer.stop()
        _collector = None
    gc.collect()
    gc.enable()


def wait_until(condition: Callable[[], bool], timeout: float, app) -> bool:
    """Process events until ``condition()`` holds; False after ``timeout`` seconds (scripts such as
    ``--screenshot``, the soak)."""
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            return False
        app.processEvents()
        time.sleep(0.005)
    return True
