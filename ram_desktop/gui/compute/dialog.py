"""The window's compute set-up (docs/compute.md): the status bar's compute label, the first-start offer
(non-blocking, dismissable, remembered in QSettings) and the Settings → Compute page (detection, plan,
install with progress and cancel, remove a runtime folder). The work is ``ram_desktop.core.compute``'s,
run through ``gui.worker.Job``."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QEvent, QObject, QSettings, Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMainWindow,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from ...core import ProgressEvent
from ...core.compute import builds, detect, install, runtime
from ...core.compute.detect import Detection
from ..worker import Job

log = logging.getLogger("ram_desktop")
OFFER_KEY = "compute/offer_dismissed"
LOOK_DELAY_MS = 1000  # the offer's look at the machine waits for the window to be up and idle


# what a GPU gives, as measured (benchmarks/README.md: evaluation of the real model, 200 examples/s on an H100
# against 5.1 on 2 CPU cores)
GPU_GAIN = "evaluations run many times faster (about 40× on an NVIDIA H100 than on 2 CPU cores, as measured)"
CHOICES = {
    "auto": "automatic (this machine's GPU, else the CPU)",  # until the look at the machine says which (AUTO)
    "cpu": "the CPU only",
    "cuda": "an NVIDIA GPU (CUDA)",
    "rocm": "an AMD GPU (ROCm)",
    "mps": "the Apple GPU (MPS)",
}


AUTO = {  # the automatic choice, once the machine is known: what it picks here
    "cpu": "automatic: the CPU (no GPU found here)",
    "cuda": "automatic: the NVIDIA GPU found here (CUDA)",
    "rocm": "automatic: the AMD GPU found here (ROCm)",
    "mps": "automatic: the Apple GPU (MPS)",
}


def compute_words() -> tuple[str, str]:
    """The status bar's words for the compute in use now, and its tooltip: where torch comes from, and why
    the CPU computes when it does (the fallback's one line, when a runtime folder was not used)."""
    import torch

    from ...core.compute.summary import compute_in_use

    state = runtime.status()
    device, why = compute_in_use(torch)
    text = f"Compute: {device}"
    if state.folder is not None:
        lines = [f"torch {torch.__version__} from the runtime folder {state.folder}"]
    else:
        lines = [f"torch {torch.__version__}, the one RAM Desktop comes with"]
    if state.message:
        text += " (runtime not used)"
        lines.insert(0, state.message)
    if device != "CPU":
        lines.append(f"Merges and evaluations run on {device}.")
    elif why:
        lines.append(f"Merges and evaluations run on the CPU: {why}.")
    else:
        lines.append("Merges and evaluations run on the CPU: this torch is the CPU version.")
    if device == "CPU":
        lines.append("Settings → Compute… sets up a GPU.")
    return text, "\n".join(lines)


def plan_summary(plan: builds.Plan, found: Detection) -> tuple[str, bool]:
    """The plan in plain words for the page's first line, and whether Install may be pressed."""
    if plan.action == "none":
        if plan.variant == "mps":
            return "Nothing to install: the torch RAM Desktop comes with already uses the Apple GPU (MPS).", False
        return "Nothing to install: the torch RAM Desktop comes with already computes on the CPU.", False
    if plan.action == "impossible":
        return f"Cannot install: {plan.reason}.", False
    missing = {"cuda": ("NVIDIA", found.nvidia), "rocm": ("AMD", found.amd_gpus)}.get(plan.variant)
    if missing is not None and not missing[1]:
        text = (
            f"No {missing[0]} GPU was found on this machine: the {missing[0]} version of torch would compute "
            "on the CPU, so Install is off. Choose “automatic” or “the CPU only”."
        )
        return text, False
    what = f"torch {builds.TORCH_VERSION} {plan.build.plain}" if plan.build else f"torch {builds.TORCH_VERSION}"
    if plan.find_links is not None:
        fetch = f"Install copies {what} from {plan.find_links}"
    else:
        fetch = f"Install downloads {what}, {builds.human_bytes(plan.download_bytes)},"
    text = (
        f"{fetch} into your user folder and checks it; RAM Desktop uses it after a restart. If anything goes "
        "wrong, the CPU version it comes with stays in use."
    )
    return text, True


def about_lines() -> list[str]:
    """torch, CUDA and driver versions for the About box, in words (no Python ``None``, no nested brackets)."""
    import torch

    from ...core.compute.summary import describe_torch

    info = describe_torch()
    folder = runtime.status().folder
    hip = getattr(torch.version, "hip", None)
    if torch.version.cuda:
        build = f"CUDA in this torch: {torch.version.cuda}"
    elif hip:
        build = f"ROCm in this torch: {hip}"
    else:
        build = "CUDA in this torch: none (the CPU version)"
    driver = info["NVIDIA driver"]
    if driver != "none found":
        driver += f" (supports CUDA {info['driver supports CUDA']})"
    source = f"from the runtime folder {folder}" if folder else "the one RAM Desktop comes with"
    return [f"torch {info['torch']}, {source}", build, f"NVIDIA driver: {driver}", f"compute: {info['compute']}"]


def look_at_machine(then: Callable[[Detection], None]) -> None:
    """Detect the GPU in the background and hand the result to ``then``. The job has no parent and no
    reference is kept: it keeps itself alive until it ends and is then released (a kept reference held a
    finished job's wrapper for the window's life, which the soak counted)."""
    job = Job(lambda reporter: detect.detect())
    job.succeeded.connect(then)
    job.start()


class ComputePage(QDialog):
    """Settings → Compute. ``installed`` is emitted with the new runtime folder after an install."""

    installed = Signal(object)

    def __init__(self, parent: QWidget | None = None, detection: Detection | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Compute")
        self.resize(720, 620)
        self.detection: Detection | None = detection
        self.plan: builds.Plan | None = None
        self.job: Job | None = None
        intro = QLabel(
            "RAM Desktop comes with torch for the CPU. With a GPU, " + GPU_GAIN + ". Here it can fetch the "
            "torch that uses this machine's GPU; it is used after a restart.",
            wordWrap=True,
        )
        self.detection_view = QPlainTextEdit(readOnly=True)
        self.detection_view.setMaximumHeight(120)
        self.variant = QComboBox()
        for name in builds.VARIANTS:
            self.variant.addItem(CHOICES[name], name)
        self.find_links = QLineEdit(placeholderText="optional, for a machine without internet")
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse)
        self.offline = QCheckBox("Don't use the internet (only files already downloaded)")
        self.summary = QLabel(wordWrap=True)
        self.summary.setObjectName("compute-plan-summary")
        self.details = QPushButton("Details…")
        self.details.setCheckable(True)
        self.plan_view = QPlainTextEdit(readOnly=True)
        self.plan_view.setVisible(False)
        self.details.toggled.connect(self.plan_view.setVisible)
        self.install_button = QPushButton("Install")
        self.install_button.clicked.connect(self.start_install)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.clicked.connect(self.cancel)
        self.cancel_button.setEnabled(False)
        self.progress = QProgressBar()
        self.progress_label = QLabel()
        self.status = QLabel(wordWrap=True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.runtimes = QListWidget()
        self.runtimes.setMaximumHeight(110)
        self.remove_button = QPushButton("Remove")
        self.remove_button.clicked.connect(self.remove_selected)
        layout = QVBoxLayout(self)
        layout.addWidget(intro)
        layout.addWidget(QLabel("<b>This machine</b>"))
        layout.addWidget(self.detection_view)
        row = QHBoxLayout()
        row.addWidget(QLabel("Compute on:"))
        row.addWidget(self.variant)
        row.addStretch(1)
        layout.addLayout(row)
        row = QHBoxLayout()
        row.addWidget(QLabel("Install from a folder of downloaded torch files (.whl):"))
        row.addWidget(self.find_links, 1)
        row.addWidget(browse)
        layout.addLayout(row)
        layout.addWidget(self.offline)
        layout.addWidget(QLabel("<b>Plan</b>"))
        layout.addWidget(self.summary)
        layout.addWidget(self.details, 0, Qt.AlignmentFlag.AlignLeft)
        layout.addWidget(self.plan_view, 1)
        row = QHBoxLayout()
        row.addWidget(self.install_button)
        row.addWidget(self.cancel_button)
        row.addWidget(self.progress, 1)
        layout.addLayout(row)
        layout.addWidget(self.progress_label)
        layout.addWidget(self.status)
        layout.addWidget(QLabel("<b>Installed</b> (used from the next start)"))
        layout.addWidget(self.runtimes)
        row = QHBoxLayout()
        row.addStretch(1)
        row.addWidget(self.remove_button)
        layout.addLayout(row)
        self.variant.currentIndexChanged.connect(self.replan)
        self.find_links.textChanged.connect(self.replan)
        self.refresh_runtimes()
        if detection is None:
            self.detection_view.setPlainText("looking at this machine…")
            look_at_machine(self.set_detection)
        else:
            self.set_detection(detection)

    def set_detection(self, found: Detection) -> None:
        self.detection = found
        self.variant.setItemText(self.variant.findData("auto"), AUTO.get(found.kind, CHOICES["auto"]))
        self.detection_view.setPlainText("\n".join(found.describe()))
        self.replan()

    def _browse(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Folder of wheels")
        if folder:
            self.find_links.setText(folder)

    def replan(self) -> None:
        if self.detection is None:
            return
        links = self.find_links.text().strip()
        if links and not Path(links).is_dir():
            self.plan = None
            self.summary.setText(f"{links}: no such folder")
            self.plan_view.setPlainText(f"{links}: no such folder")
            self.install_button.setEnabled(False)
            return
        self.plan = builds.choose(self.detection, self.variant.currentData(), find_links=Path(links) if links else None)
        summary, can_install = plan_summary(self.plan, self.detection)
        self.summary.setText(summary)
        self.plan_view.setPlainText("\n".join(self.plan.describe()))
        self.install_button.setEnabled(can_install and self.job is None)

    def start_install(self) -> None:
        plan, offline = self.plan, self.offline.isChecked()
        if plan is None or not self.install_button.isEnabled() or self.job is not None:
            return
        self.job = job = Job(lambda reporter: install.install(plan, reporter, offline=offline, log=log.info), self)
        job.progress.connect(self._progress)
        job.succeeded.connect(self._done)
        job.failed.connect(
            lambda message: self._ended(f"Not installed: {message}. The bundled CPU torch stays in use.")
        )
        job.crashed.connect(lambda message, details: self._ended(f"Not installed (a bug): {message}"))
        job.cancelled.connect(lambda: self._ended("Cancelled; nothing was changed."))
        job.finished.connect(self._finished)
        self.install_button.setEnabled(False)
        self.cancel_button.setEnabled(True)
        self.remove_button.setEnabled(False)
        self.progress.setRange(0, 0)
        self.status.setText(f"Installing into {plan.folder}…")
        job.start()

    def cancel(self) -> None:
        if self.job is not None:
            self.job.cancel()
            self.status.setText("Cancelling…")

    def _progress(self, event: ProgressEvent) -> None:
        if event.stage == "download" and event.total:
            self.progress.setRange(0, 1000)
            self.progress.setValue(min(999, int(1000 * event.done / event.total)))
        elif event.stage == "verify":
            self.progress.setRange(0, 0)
        if event.detail:
            self.progress_label.setText(event.detail)

    def _done(self, result: install.InstallResult) -> None:
        v = result.verified
        where = v.get("device_name") or "the CPU"
        text = (
            f"Installed torch {v.get('torch')} into {result.folder} "
            f"({builds.human_bytes(result.bytes_on_disk)}, {result.seconds:.0f} s); its check passed on {where}. "
            "RAM Desktop uses it from its next start."
        )
        if not v.get("gpu") and v.get("why_no_gpu"):
            text += f" Note: {v['why_no_gpu']}; merges run on the CPU until a GPU is usable."
        self._ended(text)
        self.installed.emit(result.folder)

    def _ended(self, text: str) -> None:
        self.status.setText(text)
        self.progress.setRange(0, 1)
        self.progress.setValue(1)

    def _finished(self) -> None:
        self.job = None
        self.cancel_button.setEnabled(False)
        self.remove_button.setEnabled(True)
        self.refresh_runtimes()
        self.replan()

    def refresh_runtimes(self) -> None:
        self.runtimes.clear()
        active = runtime.active_folder()
        for folder, marker, problem in install.installed(builds.runtimes_dir()):
            if marker is not None:
                text = f"{folder.name}: torch {marker.get('torch')}, CUDA {marker.get('cuda')}"
            else:
                text = f"{folder.name}: not usable ({problem})"
            if folder == active:
                text += "  (chosen)"
            item = QListWidgetItem(text)
            item.setData(Qt.ItemDataRole.UserRole, str(folder))
            self.runtimes.addItem(item)
        self.remove_button.setEnabled(self.runtimes.count() > 0 and self.job is None)

    def remove_selected(self) -> None:
        item = self.runtimes.currentItem()
        if item is None or self.job is not None:
            return
        folder = Path(item.data(Qt.ItemDataRole.UserRole))
        try:
            install.remove(folder)
        except Exception as e:  # noqa: BLE001  shown, never raised into Qt
            self.status.setText(str(e))
        else:
            self.status.setText(f"Removed {folder}; the bundled torch is used from the next start.")
        self.refresh_runtimes()

    def closeEvent(self, event: Any) -> None:
        if self.job is not None:
            self.job.cancel()
        super().closeEvent(event)


class OfferBanner(QFrame):
    """The first-start offer: a GPU is here and a torch build can use it. Set up… opens the page; Not now
    hides it for this run; Don't ask again remembers that in the settings."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setStyleSheet("OfferBanner { background: #eef5ff; border: 1px solid #9bbbe0; }")
        self.text = QLabel(text, wordWrap=True)
        self.setup_button = QPushButton("Set up…")
        self.later_button = QPushButton("Not now")
        self.never_button = QPushButton("Don't ask again")
        row = QHBoxLayout(self)
        row.setContentsMargins(8, 4, 8, 4)
        row.addWidget(self.text, 1)
        for button in (self.setup_button, self.later_button, self.never_button):
            row.addWidget(button)


class ComputeFace(QObject):
    """What the main window holds: the status bar label, the offer, and the page (one at a time)."""

    def __init__(self, window: QMainWindow, settings: QSettings, offer: bool = True) -> None:
        super().__init__(window)
        self.window, self.settings = window, settings
        self.page: ComputePage | None = None
        self.banner: OfferBanner | None = None
        self.detection: Detection | None = None
        self.label = QLabel()
        self.label.setObjectName("compute-label")
        window.statusBar().addPermanentWidget(self.label)
        self.update_label()
        if offer and not _truthy(settings.value(OFFER_KEY, False)):
            QTimer.singleShot(LOOK_DELAY_MS, self._look)
        window.installEventFilter(self)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        """The window closing (its close button, or a signal: SIGTERM closes it) cancels a running install
        and waits for it: uv or the check's child process ends and the staging folder goes."""
        if watched is self.window and event.type() == QEvent.Type.Close and self.page is not None:
            job = self.page.job
            if job is not None:
                job.cancel()
                job.wait(30000)
        return False

    def update_label(self) -> None:
        text, tip = compute_words()
        self.label.setText(text)
        self.label.setToolTip(tip)

    def _look(self) -> None:
        if getattr(self.window, "busy", lambda: False)():  # never beside a running merge or analysis
            QTimer.singleShot(LOOK_DELAY_MS, self._look)
            return
        look_at_machine(self._looked)

    def _looked(self, found: Detection) -> None:
        self.detection = found
        if runtime.status().folder is not None:
            return
        plan = builds.choose(found, "auto")
        if plan.action != "install" or found.kind == "cpu":
            return
        device = found.nvidia[0].name if found.nvidia else (found.amd_gpus[0] if found.amd_gpus else found.kind)
        self.banner = OfferBanner(
            f"Found {device}. RAM Desktop computes on the CPU now; with the GPU, {GPU_GAIN}. Set up… downloads "
            f"{builds.human_bytes(plan.download_bytes)}, and RAM Desktop uses the GPU after a restart."
        )
        self.banner.setup_button.clicked.connect(self._setup)
        self.banner.later_button.clicked.connect(self._hide)
        self.banner.never_button.clicked.connect(self._never)
        central = self.window.centralWidget()
        layout = central.layout() if central is not None else None
        if layout is not None and hasattr(layout, "insertWidget"):
            layout.insertWidget(0, self.banner)
        else:
            self.window.statusBar().addWidget(self.banner)

    def _hide(self) -> None:
        if self.banner is not None:
            self.banner.hide()

    def _never(self) -> None:
        self.settings.setValue(OFFER_KEY, True)
        self.settings.sync()
        self._hide()

    def _setup(self) -> None:
        self._never()
        self.open_page()

    def open_page(self) -> ComputePage:
        if self.page is None:
            self.page = ComputePage(self.window, self.detection)
            self.page.finished.connect(self._page_closed)
        self.page.show()
        self.page.raise_()
        return self.page

    def _page_closed(self) -> None:
        if self.page is not None and self.page.job is None:
            self.page.deleteLater()
            self.page = None


def _truthy(value: object) -> bool:
    return value is True or str(value).lower() in ("true", "1")
