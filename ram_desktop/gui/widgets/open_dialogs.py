"""What "Open model card" and "Open output folder" show inside the window: the card rendered from its
Markdown, and — where the desktop has no file manager to open — where the folder is, to copy."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QDesktopServices, QGuiApplication
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)


class CardDialog(QDialog):
    """The model card (``README.md``) rendered; **Open in editor** hands the file to the desktop."""

    def __init__(self, card: Path, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.card = Path(card)
        self.setWindowTitle(f"Model card — {self.card.parent.name}")
        self.setMinimumSize(640, 480)
        self.resize(820, 680)
        self.browser = QTextBrowser()
        self.browser.setOpenExternalLinks(True)
        text = self.card.read_text(encoding="utf-8", errors="replace")
        self.browser.setMarkdown(_without_front_matter(text))
        self.path = _path_field(self.card)
        self.editor_button = QPushButton("Open in editor")
        self.editor_button.setToolTip("Open README.md with the desktop's editor")
        self.editor_button.clicked.connect(self.open_in_editor)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        buttons.addButton(self.editor_button, QDialogButtonBox.ButtonRole.ActionRole)
        layout = QVBoxLayout(self)
        layout.addWidget(self.browser, 1)
        layout.addWidget(self.path)
        layout.addWidget(buttons)
        self.note = QLabel()
        self.note.setWordWrap(True)
        self.note.hide()
        layout.insertWidget(2, self.note)

    def open_in_editor(self) -> None:
        if not QDesktopServices.openUrl(QUrl.fromLocalFile(str(self.card))):
            self.note.setText("No editor could be opened on this desktop; the card is the file above.")
            self.note.show()


class FolderDialog(QDialog):
    """Where the output folder is (selectable, with **Copy**), when no file manager could open it."""

    def __init__(self, folder: Path, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Output folder")
        self.setMinimumWidth(560)
        text = QLabel("No file manager could be opened on this desktop. The merged model is in this folder:")
        text.setWordWrap(True)
        self.path = _path_field(Path(folder))
        self.copy_button = QPushButton("Copy")
        self.copy_button.setToolTip("Copy the folder's path to the clipboard")
        self.copy_button.clicked.connect(lambda: QGuiApplication.clipboard().setText(self.path.text()))
        row = QHBoxLayout()
        row.addWidget(self.path, 1)
        row.addWidget(self.copy_button)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(text)
        layout.addLayout(row)
        layout.addWidget(buttons)


def _path_field(path: Path) -> QLineEdit:
    field = QLineEdit(str(path))
    field.setReadOnly(True)  # selectable, not editable
    field.setCursorPosition(0)
    field.setToolTip(str(path))
    return field


def _without_front_matter(text: str) -> str:
    """The card's Markdown without its YAML metadata block (``---`` … ``---`` at the top, for the Hub)."""
    lines = text.split("\n")
    if lines and lines[0].strip() == "---":
        end = next((i for i in range(1, len(lines)) if lines[i].strip() == "---"), None)
        if end is not None:
            return "\n".join(lines[end + 1 :]).lstrip("\n")
    return text


def open_folder(folder: Path, parent: QWidget | None = None) -> QDialog | None:
    """Open ``folder`` with the desktop's file manager; where there is none, a dialog that says where it is."""
    if QDesktopServices.openUrl(QUrl.fromLocalFile(str(folder))):
        return None
    dialog = FolderDialog(folder, parent)
    dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    dialog.show()
    return dialog


def show_card(card: Path, parent: QWidget | None = None) -> CardDialog:
    dialog = CardDialog(card, parent)
    dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    dialog.show()
    return dialog
