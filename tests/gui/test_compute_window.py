"""The window's compute set-up (docs/compute.md), clicked through real widgets: the status bar's compute
label, About's versions, the first-start offer (remembered), and Settings → Compute installing a runtime
folder from local wheels with progress, cancel and remove."""

from __future__ import annotations

import pytest
from PySide6.QtWidgets import QApplication, QMessageBox

from ram_desktop.core.compute import runtime
from ram_desktop.gui.compute import dialog as compute_dialog

from .. import compute_recordings as rec
from ..fake_torch import alive, build_wheel, hanging


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
    assert w.compute.label.toolTip() == (
        f"torch {torch.__version__}, the one RAM Desktop comes with\n"
        "Merges and evaluations run on the CPU: this torch is the CPU version.\n"
        "Settings → Compute… sets up a GPU."
    )
    shown = []
    monkeypatch.setattr(QMessageBox, "about", lambda parent, title, text: shown.append(text))
    w.menus._about()
    assert f"torch {torch.__version__}, the one RAM Desktop comes with" in shown[0]
    assert "CUDA in this torch: none (the CPU version)" in shown[0]
    assert "None" not in shown[0] and "((" not in shown[0] and "))" not in shown[0]  # words, not Python values
    assert "NVIDIA driver: 580.159.04 (supports CUDA 13.0)" in shown[0]


def test_first_start_offer_is_shown_once_and_remembered(qtbot, settings, machine):
    w = make_window(qtbot, settings)
    qtbot.waitUntil(lambda: w.compute.banner is not None and w.compute.banner.isVisible(), timeout=30000)
    text = w.compute.banner.text.text()
    assert text == (
        "Found NVIDIA H100 80GB HBM3. RAM Desktop computes on the CPU now; with the GPU, evaluations run "
        "many times faster (about 40× on an NVIDIA H100 than on 2 CPU cores, as measured). Set up… "
        "downloads 2.7 GB, and RAM Desktop uses the GPU after a restart."
    )
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
    assert page.status.text().startswith(
        "Not installed: uv could not install torch: the packages could not be downloaded ("
    )
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
    assert w.compute.label.text() == "Compute: CPU (runtime not used)"
    assert w.compute.label.toolTip().splitlines()[0] == (
        f"compute runtime not used ({root / 'cuda-torch2.13.0'} has no runtime.json (a half-written install?)); "
        "using the bundled CPU torch"
    )
    assert w.compute.label.toolTip().splitlines()[-1] == "Settings → Compute… sets up a GPU."


INSTALLER_WORDS = ("torch build", "wheels", "uv's cache", "build from PyPI", "bundled", "lock")


def shown_words(page) -> str:
    """Every text the page shows (labels, buttons, check boxes, the choices, the placeholders), the plan's
    details only while they are shown."""
    from PySide6.QtWidgets import QAbstractButton, QComboBox, QLabel, QLineEdit, QPlainTextEdit

    texts = []
    for widget in page.findChildren(QLabel) + page.findChildren(QAbstractButton):
        if widget.isVisible():
            texts.append(widget.text())
    for combo in page.findChildren(QComboBox):
        texts += [combo.itemText(i) for i in range(combo.count())]
    texts += [edit.placeholderText() for edit in page.findChildren(QLineEdit) if edit.isVisible()]
    texts += [view.toPlainText() for view in page.findChildren(QPlainTextEdit) if view.isVisible()]
    return "\n".join(texts)


def test_the_compute_page_speaks_plain_words(qtbot, settings, machine):
    """What the GPU gives, the download and the restart, in the words of someone who merges models; the
    installer's words (the package list, the index) only behind Details…"""
    from PySide6.QtCore import Qt

    w = make_window(qtbot, settings)
    w.menus.compute_action.trigger()  # Settings → Compute…
    page = w.compute.page
    qtbot.waitUntil(lambda: page.detection is not None, timeout=30000)
    words = shown_words(page)
    assert not [term for term in INSTALLER_WORDS if term.lower() in words.lower()], words
    assert "evaluations run many times faster (about 40× on an NVIDIA H100 than on 2 CPU cores" in words
    assert page.summary.text() == (
        "Install downloads torch 2.13.0 for NVIDIA GPUs (CUDA 13.0), 2.7 GB, into your user folder and checks it; "
        "RAM Desktop uses it after a restart. If anything goes wrong, the CPU version it comes with stays in use."
    )
    assert page.install_button.isEnabled()
    # the packages are one click away
    assert not page.plan_view.isVisible()
    qtbot.mouseClick(page.details, Qt.LeftButton)
    assert page.plan_view.isVisible() and "nvidia-cublas" in page.plan_view.toPlainText()


@pytest.fixture
def no_gpu(tmp_path, monkeypatch):
    """User folders under tmp_path; no nvidia-smi, no ROCm."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("RAM_DESKTOP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("ROCM_PATH", str(tmp_path / "no-rocm"))
    monkeypatch.setenv("PATH", rec.path_with(tmp_path / "bin"))
    return tmp_path


def test_cuda_without_an_nvidia_gpu_says_so_first_and_install_is_off(qtbot, settings, no_gpu):
    from PySide6.QtCore import Qt

    w = make_window(qtbot, settings)
    page = w.compute.open_page()
    qtbot.waitUntil(lambda: page.detection is not None, timeout=30000)
    assert "no GPU found: the CPU computes" in page.detection_view.toPlainText()
    # the automatic choice says what it picks here, not "the GPU found here"
    assert page.variant.itemText(page.variant.findData("auto")) == "automatic: the CPU (no GPU found here)"
    page.variant.setFocus()
    while page.variant.currentData() != "cuda":  # down the list, as with the keyboard
        qtbot.keyClick(page.variant, Qt.Key_Down)
    assert page.variant.currentText() == "an NVIDIA GPU (CUDA)"
    assert page.summary.text().startswith(
        "No NVIDIA GPU was found on this machine: the NVIDIA version of torch "
        "would compute on the CPU, so Install is off."
    )
    assert not page.install_button.isEnabled()
    qtbot.mouseClick(page.install_button, Qt.LeftButton)
    assert page.job is None and page.status.text() == ""
    # back to "the CPU only": nothing to install, said as plainly
    while page.variant.currentData() != "cpu":
        qtbot.keyClick(page.variant, Qt.Key_Up)
    assert page.summary.text() == "Nothing to install: the torch RAM Desktop comes with already computes on the CPU."
    assert not page.install_button.isEnabled()


def test_closing_the_window_during_the_install_check_ends_the_check(qtbot, settings, machine):
    """The window closing (its close button, or SIGTERM, which closes it) cancels the install: the check's
    child process ends and the staging folder goes."""
    from PySide6.QtCore import Qt

    pid_file = machine / "check.pid"
    house = build_wheel(machine / "slow", first=hanging(pid_file))
    w = make_window(qtbot, settings)
    page = w.compute.open_page()
    qtbot.waitUntil(lambda: page.detection is not None, timeout=30000)
    page.variant.setCurrentIndex(page.variant.findData("cpu"))
    page.find_links.setText(str(house))
    page.offline.setChecked(True)
    qtbot.mouseClick(page.install_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: pid_file.is_file() and pid_file.read_text() != "", timeout=120000)
    checker = int(pid_file.read_text())
    root = machine / "data" / "ram-desktop" / "runtimes"
    try:
        assert list(root.glob("cpu-torch2.13.0.partial-*"))
        w.close()
        assert not list(root.glob("*.partial-*")) and not (root / "active").exists()
        assert not alive(checker)
    finally:
        if alive(checker):
            import os
            import signal

            os.kill(checker, signal.SIGKILL)
