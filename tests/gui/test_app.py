"""``ram-desktop`` entry points, run as a user runs them (a separate process, offscreen)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(args, tmp_path, timeout=120):
    env = dict(
        os.environ,
        QT_QPA_PLATFORM="offscreen",
        RAM_DESKTOP_CACHE=str(tmp_path / "cache"),
        XDG_CONFIG_HOME=str(tmp_path / "config"),
        PYTHONPATH=str(ROOT),
    )
    return subprocess.run(
        [sys.executable, "-m", "ram_desktop", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_demo_screenshot_headless(tmp_path):
    shot = tmp_path / "shot.png"
    proc = _run(["--demo", "--screenshot", str(shot)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    assert (tmp_path / "cache" / "demo" / "base" / "model.safetensors").is_file()  # demo generated into the cache


def test_screenshot_of_a_bad_recipe_exits_2_with_one_error_line(tmp_path):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("format: ram-recipe/1\nbase: /nowhere/base\nagents: [/nowhere/a]\n")
    proc = _run([str(recipe), "--screenshot", str(tmp_path / "x.png")], tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error:")
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "x.png").exists()


def test_core_imports_without_qt(tmp_path):
    """The engine never imports Qt (ARCHITECTURE.md): import it with PySide6 blocked."""
    code = (
        "import sys; sys.modules['PySide6'] = None; sys.modules['pyqtgraph'] = None\n"
        "import ram_desktop.core.pipeline, ram_desktop.core.methods, ram_desktop.core.recipe, ram_desktop.cli\n"
        "assert not [m for m in sys.modules if m.startswith(('PySide6.', 'pyqtgraph.'))]\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr


def test_self_test_from_source(tmp_path):
    """``python -m ram_desktop --self-test``: one ok line, exit 0, no Qt noise, its temp folders removed."""
    env = dict(
        os.environ,
        RAM_DESKTOP_CACHE=str(tmp_path / "cache"),
        XDG_CONFIG_HOME=str(tmp_path / "config"),
        PYTHONPATH=str(ROOT),
        TMPDIR=str(tmp_path / "tmp"),
    )
    env.pop("QT_QPA_PLATFORM", None)  # the self-test forces offscreen itself
    (tmp_path / "tmp").mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "ram_desktop", "--self-test"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("self-test ok: analysed 3 agents, merged "), proc.stdout
    assert "with RAM+" in lines[0] and "float32" in lines[0]
    assert "Traceback" not in proc.stderr
    assert list((tmp_path / "tmp").iterdir()) == []  # its temporary folder is gone
    assert not (tmp_path / "cache").exists() and not (tmp_path / "config").exists()  # user folders untouched


def test_self_test_failure_is_one_line_exit_1(tmp_path, monkeypatch, capsys):
    """A failing check prints `self-test failed: <reason>` and exits 1 (in process: a broken output check)."""
    from ram_desktop.gui.harness import selftest

    def broken(out):
        raise selftest.SelfTestError("simulated: the output folder lacks config.json")

    monkeypatch.setattr(selftest, "_check_output", broken)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    cache_before = os.environ.get("RAM_DESKTOP_CACHE")
    code = selftest.run(timeout=120)
    assert code == 1
    assert capsys.readouterr().out.strip().splitlines() == [
        "self-test failed: simulated: the output folder lacks config.json"
    ]
    assert list(tmp_path.iterdir()) == []
    assert os.environ.get("RAM_DESKTOP_CACHE") == cache_before  # environment restored


def test_setup_application_desktop_id_and_optional_icon(qapp, monkeypatch):
    from ram_desktop import paths
    from ram_desktop.gui import application as app_module

    assert app_module.setup_application(qapp) is True  # a source checkout has resources/
    assert qapp.desktopFileName() == "ram-desktop"
    assert not qapp.windowIcon().isNull()

    def nowhere(name):
        raise FileNotFoundError(name)

    monkeypatch.setattr(paths, "resource_path", nowhere)  # a non-editable wheel: no resources/
    assert app_module.setup_application(qapp) is False  # no icon, no exception


GC_ON_GUI_THREAD = """
import gc, threading, weakref
from PySide6.QtCore import QEventLoop, QTimer
from PySide6.QtWidgets import QApplication, QWidget
from ram_desktop.gui.application import setup_application

app = QApplication([])
setup_application(app)
freed_in = []
widget = QWidget()
widget.cycle = widget  # a closed dialog left in a reference cycle: only the cyclic collector frees it
weakref.finalize(widget, lambda: freed_in.append(threading.current_thread().name))
del widget

kept = []


def allocate():  # what a merge thread allocates and keeps: many times the collector's threshold
    for _ in range(200):
        kept.append([[i] for i in range(5000)])

worker = threading.Thread(target=allocate, name="merge-thread")
worker.start()
worker.join()
print("after the merge thread:", freed_in)
loop = QEventLoop()
QTimer.singleShot(1500, loop.quit)
loop.exec()
print("automatic:", gc.isenabled(), "freed in:", freed_in)
"""


def test_qt_objects_in_cycles_are_freed_on_the_gui_thread_only(tmp_path):
    """The cyclic collector would free a widget in whichever thread crosses its threshold (a merge thread,
    where Qt forbids it); the app collects on the GUI thread instead."""
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", PYTHONPATH=str(ROOT), XDG_CONFIG_HOME=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-c", GC_ON_GUI_THREAD],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["after the merge thread: []", "automatic: False freed in: ['MainThread']"]
