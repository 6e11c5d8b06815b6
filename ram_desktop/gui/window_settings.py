"""The main window's geometry, splitters, last folder and device, kept in its QSettings between runs."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QByteArray

from .session import Topic

MainWindow = Any  # the main window (not imported: main_window imports this module)


def _splitters(window: MainWindow) -> tuple:
    return (
        ("window/splitter", window.splitter),
        ("window/left", window.left_splitter),
        ("window/right", window.right_splitter),
    )


def restore_window(window: MainWindow) -> None:
    """Size and splitters as the user left them (default sizes the first time, never beyond the screen),
    the last folder browsed and the device chosen."""
    settings = window.settings
    geometry = settings.value("window/geometry")
    if isinstance(geometry, QByteArray) and not geometry.isEmpty():
        window.restoreGeometry(geometry)
    else:
        window.resize(1360, 860)
        window.splitter.setSizes([490, 870])  # the charts and tables get the room; the forms need less
        window.left_splitter.setSizes([330, 400])
        window.right_splitter.setSizes([560, 170, 100])
    screen = window.screen().availableGeometry() if window.screen() is not None else None
    if screen is not None and (window.width() > screen.width() or window.height() > screen.height()):
        window.resize(min(window.width(), screen.width()), min(window.height(), screen.height()))
    for key, splitter in _splitters(window):
        state = settings.value(key)
        if isinstance(state, QByteArray) and not state.isEmpty():
            splitter.restoreState(state)
    folder = settings.value("paths/last_folder")
    if folder:
        window.sources.browse_dir = str(folder)
    device = settings.value("device")
    if device and window.method.offers_device(str(device)):
        window.edit_draft(device=str(device))  # the method form shows the session's draft
    kept = [window.session.draft.device]

    def keep_device(draft: Any) -> None:
        if draft.device != kept[0]:
            kept[0] = draft.device
            settings.setValue("device", draft.device)

    window.session.watch(Topic.DRAFT, keep_device)


def save_window(window: MainWindow) -> None:
    """Store what :func:`restore_window` reads back."""
    window.settings.setValue("window/geometry", window.saveGeometry())
    for key, splitter in _splitters(window):
        window.settings.setValue(key, splitter.saveState())
    window.settings.sync()
