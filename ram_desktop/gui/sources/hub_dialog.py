"""The "Add from Hub…" dialog: a Hugging Face repository id, a revision and an optional token.

Public API (everything else is private)::

    dialog = HubDialog(parent, repo_id="", revision="", token=None)
    if dialog.exec() == QDialog.Accepted:
        spec = dialog.spec()      # "org/name" or "org/name@revision": give it to open_checkpoint / MergeSpec.build
        token = dialog.token()    # str or None: pass as open_checkpoint(spec, reporter, token=token) and
                                  # RunOptions(token=token); never store it in settings, recipes or logs
    dialog.repo_id()              # "org/name" as typed (stripped)
    dialog.revision()             # "" when left empty (= the default branch)
    dialog.listing()              # core.ecosystem.hub.source.RepoFiles of the last successful listing, or None
                                  # (.sha, .sizes, .expected, .expected_bytes, .weights_format)

Behaviour:

- When online, it lists the revision's files with their sizes through ``core.ecosystem.hub.source.list_repo_files``
  (huggingface_hub ``model_info`` with file metadata) — when the repository or revision field is left,
  or with "List files" — in a background thread, so the window never stalls. Files a merge downloads
  are ticked and their total size shown with the resolved commit. Hub errors (not found, gated,
  revision not found, network) appear as the core's one-line message under the table.
- When ``HF_HUB_OFFLINE`` is set, listing is disabled and a message says that the model is used from
  the local cache if it is there.
- Add (OK) is enabled once the repository id is well formed; listing is informative and not required. After
  a listing fails, Add stays disabled for that repository, revision and token (there is nothing valid to add,
  and adding it would only put an error row into the sources) until one of them is changed.
- The token field echoes as a password; the token lives only in this dialog object.

The dialog imports ``ram_desktop.core.ecosystem.hub.source`` (and so huggingface_hub) but nothing else from the window;
it is self-contained.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from ...core import InputError
from ...core.ecosystem.hub import source as hub
from ..worker import Job


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


class HubDialog(QDialog):
    """Ask for a Hub repository id, revision and optional token; list the files when online.

    See the module docstring for the public API: ``spec()``, ``token()``, ``repo_id()``,
    ``revision()``, ``listing()``.
    """

    COLUMNS = ("", "File", "Size")

    def __init__(
        self, parent: QWidget | None = None, repo_id: str = "", revision: str = "", token: str | None = None
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("Add a model from the Hugging Face Hub")
        self.resize(620, 460)
        self._generation = 0
        self._listing: hub.RepoFiles | None = None
        self._failed: tuple[str, str, str | None] | None = None  # (repo, revision, token) whose listing failed

        self.repo_edit = QLineEdit(repo_id)
        self.repo_edit.setPlaceholderText("org/name, e.g. Qwen/Qwen2.5-7B-Instruct")
        self.revision_edit = QLineEdit(revision)
        self.revision_edit.setPlaceholderText("main (a branch, tag or commit sha)")
        self.token_edit = QLineEdit(token or "")
        self.token_edit.setEchoMode(QLineEdit.EchoMode.Password)
        self.token_edit.setPlaceholderText("optional: for gated or private models (default: HF_TOKEN or your login)")
        self.list_button = QPushButton("List files")
        self.list_button.clicked.connect(self.list_files)

        form = QFormLayout()
        form.addRow("Repository", self.repo_edit)
        form.addRow("Revision", self.revision_edit)
        form.addRow("Token", self.token_edit)

        self.table = QTableWidget(0, len(self.COLUMNS))
        self.table.setHorizontalHeaderLabels(self.COLUMNS)
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.setSelectionMode(QTableWidget.SelectionMode.NoSelection)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)
        header.setSectionResizeMode(2, QHeaderView.ResizeMode.ResizeToContents)

        self.status = QLabel()
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        self.buttons.button(QDialogButtonBox.StandardButton.Ok).setText("Add")
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)

        row = QHBoxLayout()
        row.addStretch(1)
        row.addWidget(self.list_button)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addLayout(row)
        layout.addWidget(self.table, 1)
        layout.addWidget(self.status)
        layout.addWidget(self.buttons)

        for edit in (self.repo_edit, self.revision_edit, self.token_edit):
            edit.textChanged.connect(self._update_buttons)
        self.repo_edit.editingFinished.connect(self._auto_list)
        self.revision_edit.editingFinished.connect(self._auto_list)
        self._offline = hub.is_offline()
        if self._offline:
            self.list_button.setEnabled(False)
            self.table.setEnabled(False)
            self._set_status(
                "Offline (HF_HUB_OFFLINE is set): files cannot be listed or downloaded. The model is "
                "used from the local Hugging Face cache if it is there.",
                error=False,
            )
        else:
            self._set_status("The files a merge needs are listed here before anything is downloaded.", error=False)
        self._update_buttons()

    # ------------------------------------------------------------------ public API

    def repo_id(self) -> str:
        return self.repo_edit.text().strip()

    def revision(self) -> str:
        return self.revision_edit.text().strip()

    def token(self) -> str | None:
        return self.token_edit.text().strip() or None

    def spec(self) -> str:
        """``org/name`` or ``org/name@revision`` ("" while the id is not well formed)."""
        if not self._valid():
            return ""
        return f"{self.repo_id()}@{self.revision()}" if self.revision() else self.repo_id()

    def listing(self) -> hub.RepoFiles | None:
        return self._listing

    def list_files(self) -> None:
        """Ask the Hub for the revision's files in a background thread (no-op when offline or invalid)."""
        if self._offline or not self._valid():
            return
        self._generation += 1
        generation, repo_id, revision, token = self._generation, self.repo_id(), self.revision() or None, self.token()
        key = self._key()
        self.table.setRowCount(0)
        self._listing = None
        self.list_button.setEnabled(False)
        self._set_status(f"Asking the Hub for the files of {repo_id}…", error=False)

        def deliver(result: object) -> None:
            try:
                self._on_listed(generation, key, result)
            except RuntimeError:
                pass  # the dialog was closed and deleted while the Hub answered

        job = Job(lambda reporter: hub.list_repo_files(repo_id, revision, token))  # outlives a closed dialog
        job.succeeded.connect(deliver)
        job.failed.connect(deliver)
        job.crashed.connect(lambda message, details: deliver(f"{repo_id}: cannot list files ({message})"))
        job.start()

    # ------------------------------------------------------------------ private

    def _valid(self) -> bool:
        text = self.repo_id()
        if not text:
            return False
        try:
            hub.parse_spec(text)
        except InputError:
            return False
        return "@" not in text

    def _key(self) -> tuple[str, str, str | None]:
        return (self.repo_id(), self.revision(), self.token())

    def _addable(self) -> bool:
        """A well-formed id whose listing has not failed (with this revision and token)."""
        return self._valid() and self._key() != self._failed

    def accept(self) -> None:
        if self._addable():  # Enter in a field must not add what the disabled Add refuses
            super().accept()

    def _update_buttons(self) -> None:
        ok = self.buttons.button(QDialogButtonBox.StandardButton.Ok)
        ok.setEnabled(self._addable())
        failed = self._valid() and not self._addable()
        ok.setToolTip(
            "The Hub could not list this repository at this revision (see the message above): correct the "
            "repository, revision or token to add it"
            if failed
            else ""
        )
        self.list_button.setEnabled(self._valid() and not self._offline)

    def _auto_list(self) -> None:
        key = (self.repo_id(), self.revision(), self.token())
        if self._valid() and getattr(self, "_last_key", None) != key:
            self._last_key = key
            self.list_files()

    def _set_status(self, text: str, error: bool) -> None:
        self.status.setText(text)
        self.status.setStyleSheet("color: #b00020;" if error else "")

    def _on_listed(self, generation: int, key: tuple[str, str, str | None], result: object) -> None:
        if generation != self._generation:
            return  # an older request finished after a newer one started
        self._failed = key if isinstance(result, str) else None
        self._update_buttons()
        if isinstance(result, str):
            self._set_status(result, error=True)
            return
        assert isinstance(result, hub.RepoFiles)
        self._listing = result
        needed = set(result.expected)
        names = sorted(result.sizes, key=lambda n: (n not in needed, n))
        self.table.setRowCount(len(names))
        for row, name in enumerate(names):
            mark = QTableWidgetItem("✓" if name in needed else "")
            mark.setToolTip("downloaded for the merge" if name in needed else "not needed")
            size = QTableWidgetItem(_size(result.sizes[name]))
            size.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            for col, item in enumerate((mark, QTableWidgetItem(name), size)):
                self.table.setItem(row, col, item)
        gated = " Gated: your account needs access." if result.gated else ""
        self._set_status(
            f"{result.repo_id} at commit {result.sha[:12]}: {len(needed)} of {len(names)} files "
            f"({result.weights_format} weights, {_size(result.expected_bytes)}) will be downloaded into the "
            f"Hugging Face cache; files already cached are reused.{gated}",
            error=False,
        )
