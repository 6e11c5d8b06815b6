"""Application-wide Qt setup shared by the window (``app``) and the self-test (``selftest``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from .. import __version__

log = logging.getLogger("ram_desktop")
ORGANIZATION, APPLICATION = "RAM Desktop", "ram-desktop"


def setup_application(app) -> bool:
    """Names, the .desktop id and the window icon of the application; True when the icon loaded.

    The icon is optional: a non-editable wheel install does not carry ``resources/``.
    """
    from PySide6.QtGui import QIcon

    from .. import paths
    from . import charts

    app.setOrganizationName(ORGANIZATION)
    app.setApplicationName(APPLICATION)
    app.setApplicationDisplayName("RAM Desktop")
    app.setApplicationVersion(__version__)
    app.setDesktopFileName(paths.APP_ID)  # Wayland / X11 match the window to ram-desktop.desktop
    charts.configure()
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
