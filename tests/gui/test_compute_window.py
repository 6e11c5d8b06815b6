"""The window's compute set-up (docs/compute.md), clicked through real widgets: the status bar's compute
label, About's versions, the first-start offer (remembered), and Settings → Compute installing a runtime
folder from local wheels with progress, cancel and remove."""

from __future__ import annotations

import pytest
from PySide6.QtWidgets import QApplication, QMessageBox

from ram_desktop.core.compute import runtime
from ram_desktop.gui.compute import dialog as compute_dialog

from .. import compute_recordings as rec
from ..fake_torch import build_wheel


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """User folders under tmp_path; PATH holds a fake nvidia-smi of an H100 on driver 580."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("RAM_DESKTOP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("ROCM_PATH", str(tmp_path / "no-rocm"))
    bin_dir = tmp_path / "bin"
    rec.fake_program(bin_dir, "nvidia-smi", {"query": (0, rec.H100_580_QUERY), "plain": (0, rec.H100_580_HEADER)})
    monkeypatch.setenv("PATH", rec.path_with(bin_dir))
    return tmp_path


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    return build_wheel(tmp_path_factory.mktemp("fake-torch"))


def make_window(qtbot, settings):
    from ram_desktop.gui.main_window import MainWindow

    w = MainWindow(settings)
    qtbot.addWidget(w)
    w.show()
    return w


def test_status_bar_and_about_say_what_computes(qtbot, settings, machine, monkeypatch):
    import torch

    w = make_window(qtbot, settings)
    assert w.compute.label.text() == "Compute: CPU"  # the bundled CPU torch, whatever GPU is there
    assert w.compute.label.toolTip() == "the bundled torch"
    shown = []
    monkeypatch.setattr(QMessageBox, "about", lambda parent, title, text: shown.append(text))
    w.menus._about()
    assert f"torch {torch.__version__} (none (the bundled torch))" in shown[0]
    assert "CUDA in this torch: None" in shown[0]
    assert "NVIDIA driver: 580.159.04 (supports CUDA 13.0)" in shown[0]


def test_first_start_offer_is_shown_once_and_remembered(qtbot, settings, machine):
    w = make_window(qtbot, settings)
    qtbot.waitUntil(lambda: w.compute.banner is not None and w.compute.banner.isVisible(), timeout=30000)
    text = w.compute.banner.text.text()
    assert text.startswith("Found NVIDIA H100 80GB HBM3. RAM Desktop computes on the CPU now")
    assert "torch 2.13.0 (CUDA 13.0 build from PyPI, 2.7 GB)" in text
    qtbot.mouseClick(w.compute.banner.never_button, pytest.importorskip("PySide6.QtCore").Qt.LeftButton)
    assert not w.compute.banner.isVisible()
    assert compute_dialog._truthy(settings.value(compute_dialog.OFFER_KEY))
    again = make_window(qtbot, settings)
    QApplication.processEvents()
    qtbot.wait(300)
    assert again.compute.banner is None


def test_not_now_hides_it_for_this_run_only(qtbot, settings, machine):
    from PySide6.QtCore import Qt

    w = make_window(qtbot, settings)
    qtbot.waitUntil(lambda: w.compute.banner is not None, timeout=30000)
    qtbot.mouseClick(w.compute.banner.later_button, Qt.LeftButton)
    assert not w.compute.banner.isVisible() and settings.value(compute_dialog.OFFER_KEY) is None


def test_settings_compute_installs_cancels_and_removes(qtbot, settings, machine, wheels):
    from PySide6.QtCore import Qt

    w = make_window(qtbot, settings)
    w.menus.compute_action.trigger()  # Settings → Compute…
    page = w.compute.page
    assert page is not None and page.isVisible()
    qtbot.waitUntil(lambda: page.detection is not None, timeout=30000)
    assert "NVIDIA GPU 0: NVIDIA H100 80GB HBM3, 80 GiB" in page.detection_view.toPlainText()
    assert "plan: install — torch 2.13.0, CUDA 13.0 build from PyPI" in page.plan_view.toPlainText()
    # the CPU build from a local folder of wheels, offline
    page.variant.setCurrentIndex(page.variant.findData("cpu"))
    page.find_links.setText(str(wheels))
    page.offline.setChecked(True)
    assert "from: local wheels in " + str(wheels) in page.plan_view.toPlainText()
    # cancel at once: nothing is installed
    qtbot.mouseClick(page.install_button, Qt.LeftButton)
    assert page.cancel_button.isEnabled()
    qtbot.mouseClick(page.cancel_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: page.job is None, timeout=120000)
    assert page.status.text() == "Cancelled; nothing was changed."
    assert page.runtimes.count() == 0
    # install for real
    qtbot.mouseClick(page.install_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: page.job is None, timeout=300000)
    folder = machine / "data" / "ram-desktop" / "runtimes" / "cpu-torch2.13.0"
    assert page.status.text().startswith(f"Installed torch 2.13.0+fake into {folder} (")
    assert page.status.text().endswith("its check passed on the CPU. RAM Desktop uses it from its next start.")
    assert runtime.active_folder() == folder
    assert page.runtimes.count() == 1
    assert page.runtimes.item(0).text() == "cpu-torch2.13.0: torch 2.13.0+fake, CUDA None  (chosen)"
    # remove it
    page.runtimes.setCurrentRow(0)
    qtbot.mouseClick(page.remove_button, Qt.LeftButton)
    assert not folder.exists() and runtime.active_folder() is None
    assert page.runtimes.count() == 0
    assert page.status.text() == f"Removed {folder}; the bundled torch is used from the next start."


def test_an_install_that_fails_says_so_in_the_page(qtbot, settings, machine, tmp_path):
    from PySide6.QtCore import Qt

    w = make_window(qtbot, settings)
    page = w.compute.open_page()
    qtbot.waitUntil(lambda: page.detection is not None, timeout=30000)
    page.variant.setCurrentIndex(page.variant.findData("cuda"))
    page.offline.setChecked(True)  # the committed lock, nothing cached: no download possible
    qtbot.mouseClick(page.install_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: page.job is None, timeout=120000)
    assert page.status.text().startswith("Not installed: uv could not install torch: the packages could not be "
                                         "downloaded (")
    assert page.status.text().endswith("The bundled CPU torch stays in use.")
    assert runtime.active_folder() is None


def test_a_runtime_folder_not_used_is_said_in_the_status_bar(qtbot, settings, machine, monkeypatch):
    root = machine / "data" / "ram-desktop" / "runtimes"
    (root / "cuda-torch2.13.0" / "site" / "torch").mkdir(parents=True)  # no marker: a half-written install
    (root / "active").write_text("cuda-torch2.13.0\n")
    monkeypatch.setattr(runtime, "_STATUS", runtime.RuntimeStatus())
    monkeypatch.delenv("RAM_DESKTOP_RUNTIME", raising=False)
    state = runtime.activate()
    assert state.folder is None and state.message.startswith("compute runtime not used (")
    w = make_window(qtbot, settings)
    assert w.compute.label.text() == "Compute: CPU — runtime not used"
    assert w.compute.label.toolTip() == (f"compute runtime not used ({root / 'cuda-torch2.13.0'} has no runtime.json "
                                         "(a half-written install?)); using the bundled CPU torch")
