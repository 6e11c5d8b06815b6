"""The window's links to the ecosystem: File > Import / Export mergekit YAML, and the Result step's
"Publish to Hub…" dialog. Thin faces over ``core.ecosystem.mergekit`` and ``core.ecosystem.hub.publish``.

The publish dialog's token field echoes as a password; the token lives only in the dialog object and is
handed to ``core.ecosystem.hub.publish.publish`` — never to QSettings, a recipe or a log.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QVBoxLayout,
    QWidget,
)

from ..core import (
    InputError,
    MergeSpec,
    ProgressEvent,
    check_repo_id,
    has_stored_token,
    load_mergekit,
    publish,
    to_mergekit,
)
from .method.spec_form import write_from_recipe
from .worker import Job

MainWindow = Any  # the main window (not imported: main_window imports this module)

log = logging.getLogger("ram_desktop")
YAML_FILTER = "mergekit configs (*.yaml *.yml);;All files (*)"


def import_mergekit_dialog(window: MainWindow) -> None:
    path, _ = QFileDialog.getOpenFileName(window, "Import mergekit YAML", window.sources.browse_dir, YAML_FILTER)
    if path:
        import_mergekit(window, Path(path))


def import_mergekit(window: MainWindow, path: Path) -> bool:
    """Load a mergekit configuration into the window like a recipe; what differs from mergekit is shown."""
    if window.busy():
        return False
    try:
        imported = load_mergekit(Path(path))
        spec = imported.spec
        spec.resolved_params()  # validated whole before any widget changes
    except InputError as e:
        window.show_error(str(e))  # and into the log, once
        return False
    window.apply_spec(spec)
    window.title.set(f"{Path(path).name} (mergekit)")  # Qt appends " — RAM Desktop"
    for warning in imported.warnings:
        log.warning("%s", warning)
    if imported.warnings:
        text = "Imported from mergekit; differences: " + " · ".join(imported.warnings)
        window.show_warning(text)

        def show_again(_ok: bool) -> None:  # the analysis that loading starts clears the message bar
            window.analysis_finished.disconnect(show_again)
            window.show_warning(text)

        window.analysis_finished.connect(show_again)
    log.info("imported mergekit config %s as %s", path, imported.spec.method)
    return True


def export_mergekit_dialog(window: MainWindow) -> None:
    start = str(Path(window.menus.save_folder()) / "mergekit.yaml")
    path, _ = QFileDialog.getSaveFileName(window, "Export mergekit YAML", start, YAML_FILTER)
    if path:
        export_mergekit(window, Path(path))


def export_mergekit(window: MainWindow, path: Path) -> bool:
    def write(spec: MergeSpec, p: Path) -> None:
        p.write_text(to_mergekit(spec), encoding="utf-8")

    if not write_from_recipe(window, path, write, "exporting a mergekit config", "the mergekit config"):
        return False
    log.info("exported mergekit config %s", path)
    window.statusBar().showMessage(f"Exported {path} (differences from RAM Desktop are comments in the file)", 8000)
    return True


class PublishDialog(QDialog):
    """Repository id, private flag and an optional token; Publish runs the upload in a worker thread and
    shows the repository's URL."""

    def __init__(self, parent: QWidget | None, folder: Path, repo_id: str = "") -> None:
        super().__init__(parent)
        self.setWindowTitle("Publish to the Hugging Face Hub")
        self.setMinimumWidth(520)  # room for a repository id and the token's whole placeholder
        self.folder = Path(folder)
        self.url: str | None = None
        self._job: Job | None = None
        self.repo = QLineEdit(repo_id)
        self.repo.setPlaceholderText("org/name")
        self.private = QCheckBox("Private repository")
        self.token_edit = QLineEdit()
        self.token_edit.setEchoMode(QLineEdit.EchoMode.Password)
        self.token_edit.setPlaceholderText(
            "using HF_TOKEN / hf auth login" if has_stored_token() else "a token with write access (not stored)"
        )
        self.token_edit.setMinimumWidth(
            self.token_edit.fontMetrics().horizontalAdvance(self.token_edit.placeholderText()) + 24
        )
        self.status = QLabel(f"Uploads {self.folder} with its model card.")
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextBrowserInteraction)
        self.status.setOpenExternalLinks(True)
        self.bar = QProgressBar()
        self.bar.setRange(0, 1000)
        self.bar.setVisible(False)
        form = QFormLayout()
        form.addRow("Repository", self.repo)
        form.addRow("", self.private)
        form.addRow("Token", self.token_edit)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        self.publish_button = self.buttons.addButton("Publish", QDialogButtonBox.ButtonRole.AcceptRole)
        self.buttons.rejected.connect(self.reject)
        self.buttons.accepted.connect(self.start)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.status)
        layout.addWidget(self.bar)
        layout.addWidget(self.buttons)
        self.repo.textChanged.connect(self._update)
        self._update()

    def _update(self) -> None:
        try:
            check_repo_id(self.repo.text())
            ok = True
        except InputError:
            ok = False
        self.publish_button.setEnabled(ok and self._job is None and self.url is None)

    def start(self) -> None:
        """Create the repository and upload, in a worker thread (the dialog stays open)."""
        if self._job is not None:
            return
        repo_id, private = self.repo.text().strip(), self.private.isChecked()
        token = self.token_edit.text().strip() or None
        self._job = Job(lambda reporter: publish(self.folder, repo_id, private, token, reporter), self)
        # the job's signals (re-emitted in the GUI thread), not the worker's: the lambda would run in the worker thread
        self._job.progress.connect(self._progress)
        self._job.succeeded.connect(self._succeeded)
        self._job.failed.connect(self._failed)
        self._job.crashed.connect(lambda message, trace: self._failed(message))
        self._job.finished.connect(self._finished)
        self.status.setText(f"Publishing to {repo_id}…")
        self.bar.setVisible(True)
        self.publish_button.setEnabled(False)
        self._job.start()

    def _progress(self, event: ProgressEvent) -> None:
        self.bar.setValue(int(1000 * event.done / event.total) if event.total else 0)
        if event.detail:
            self.status.setText(f"{self.repo.text().strip()}: {event.detail}")

    def _succeeded(self, result) -> None:
        self.url = result.url
        self.bar.setValue(1000)
        kind = "private" if result.private else "public"
        self.status.setText(f'Published ({kind}, {len(result.files)} files): <a href="{result.url}">{result.url}</a>')

    def _failed(self, message: str) -> None:
        self.bar.setVisible(False)
        self.status.setText(f"<span style='color:#b00020'>{message}</span>")

    def _finished(self) -> None:
        self._job = None
        self._update()

    def wait(self, ms: int = 30000) -> bool:
        """Tests: block until a started upload has finished."""
        return self._job.wait(ms) if self._job is not None else True

    def done(self, code: int) -> None:
        if self._job is not None and self._job.is_running():
            return
        self.token_edit.clear()
        super().done(code)


def publish_dialog(window: MainWindow) -> None:
    if window.result is None:
        return
    PublishDialog(window, window.result.out, repo_id="").exec()
