"""GUI test fixtures: offscreen Qt, isolated QSettings, the demo agents generated once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")
pytest.importorskip("pytestqt")

from PySide6.QtCore import QMimeData, QPointF, QSettings, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import QApplication


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test that used a window reports what the window was doing (its job, which start buttons were
    enabled, its message, the threads alive): a wait that timed out then says whether the work never started,
    still ran, or ended unseen."""
    outcome = yield
    report = outcome.get_result()
    window = getattr(item, "funcargs", {}).get("window")
    if report.when != "call" or not report.failed or window is None:
        return
    import threading

    try:
        buttons = {
            "analyse": window.analyse_button,
            "merge": window.merge_button,
            "evaluate": window.evaluate.run.start_button,
            "compare": window.compare.run.start_button,
        }
        lines = [
            f"job: {window.jobs.state.value} (busy: {window.jobs.busy()})",
            f"suites job running: {window.evaluate.suite_job is not None}; sources opening: {window.sources.busy}",
            "enabled: " + ", ".join(f"{name} {button.isEnabled()}" for name, button in buttons.items()),
            f"message: {window.message.text.text()!r}",
            f"evaluate bar: {window.evaluate.run.label.text()!r}",
            "threads: " + ", ".join(sorted(t.name for t in threading.enumerate())),
        ]
    except RuntimeError as e:  # the window is already deleted
        lines = [f"(window state unavailable: {e})"]
    report.sections.append(("window state", "\n".join(lines)))


@pytest.fixture(scope="session")
def demo_models(tmp_path_factory) -> tuple[Path, list[Path]]:
    from ram_desktop.core.demo import write_demo

    return write_demo(tmp_path_factory.mktemp("demo"))


@pytest.fixture(scope="session")
def synthetic_models(tmp_path_factory) -> tuple[Path, list[Path]]:
    """The larger synthetic agents (858k elements each): merges that last long enough to cancel or time."""
    from ..synthetic import write_synthetic

    return write_synthetic(tmp_path_factory.mktemp("synthetic"))


@pytest.fixture(scope="session", autouse=True)
def _qt_settings_sandbox(tmp_path_factory):
    """Whatever Qt writes through a default QSettings lands in a temporary folder, never the user's."""
    folder = tmp_path_factory.mktemp("qsettings")
    QSettings.setDefaultFormat(QSettings.IniFormat)
    for scope in (QSettings.UserScope, QSettings.SystemScope):
        QSettings.setPath(QSettings.IniFormat, scope, str(folder))
    from ram_desktop.gui.analysis import charts

    charts.configure()
    yield


@pytest.fixture
def settings(tmp_path) -> QSettings:
    return QSettings(str(tmp_path / "settings.ini"), QSettings.IniFormat)


@pytest.fixture
def window(qtbot, settings):
    from ram_desktop.gui.main_window import MainWindow

    w = MainWindow(settings)
    qtbot.addWidget(w)
    w.resize(1200, 800)
    w.show()
    yield w
    w.jobs.cancel()
    w.jobs.wait(10000)
    w.sources.wait_idle(5000)
    w.log_bridge.uninstall()


def drop_paths(widget, paths) -> None:
    """Drag and drop local paths onto a widget, as the file manager does."""
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    pos = QPointF(widget.width() / 2, widget.height() / 2)
    enter = QDragEnterEvent(pos.toPoint(), Qt.CopyAction, mime, Qt.LeftButton, Qt.NoModifier)
    QApplication.sendEvent(widget, enter)
    assert enter.isAccepted()
    drop = QDropEvent(pos, Qt.CopyAction, mime, Qt.LeftButton, Qt.NoModifier)
    QApplication.sendEvent(widget, drop)


def load_sources(qtbot, window, base, agents) -> None:
    """Drop the base and the agents onto the sources panel and wait until their headers are read."""
    drop_paths(window.sources, [base, *agents])
    qtbot.waitUntil(lambda: window.sources.all_ready() and window.analyse_button.isEnabled(), timeout=10000)


def analyse(qtbot, window) -> None:
    with qtbot.waitSignal(window.analysis_finished, timeout=30000) as blocker:
        qtbot.mouseClick(window.analyse_button, Qt.LeftButton)
    assert blocker.args == [True], window.message.text.text()


def merge(qtbot, window, timeout: int = 60000) -> None:
    """Click Merge and wait until the merge has finished with "done" (the bar's message tells why not)."""
    with qtbot.waitSignal(window.merge_finished, timeout=timeout) as blocker:
        qtbot.mouseClick(window.merge_button, Qt.LeftButton)
    assert blocker.args == ["done"], window.message.text.text()
