"""Small pieces the main window is built from: the message bar, a titled section, a splitter, a free
folder name."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

from PySide6.QtCore import Qt
from PySide6.QtGui import QPainter
from PySide6.QtWidgets import QGroupBox, QHBoxLayout, QLabel, QPushButton, QSplitter, QVBoxLayout, QWidget


class ElidedLabel(QLabel):
    """One line of text that ends in … where the label is narrower than the text (it never runs past the
    panel's edge); the whole text is its tooltip."""

    def setText(self, text: str) -> None:
        super().setText(text)
        self.setToolTip(text if text else "")

    def displayed(self) -> str:
        """The text as painted now."""
        return self.fontMetrics().elidedText(self.text(), Qt.TextElideMode.ElideRight, self.contentsRect().width())

    def paintEvent(self, event) -> None:
        painter = QPainter(self)
        painter.setPen(self.palette().color(self.foregroundRole()))
        painter.drawText(
            self.contentsRect(), Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, self.displayed()
        )
        painter.end()


class MessageBar(QWidget):
    """A dismissible line at the top of the window for errors, warnings and notes (never modal)."""

    STYLES: ClassVar[dict[str, tuple[str, str]]] = {
        "error": ("#fdecea", "#b3261e"),
        "warning": ("#fff4ce", "#7a5a00"),
        "info": ("#e8f1fb", "#1a4d80"),
    }

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        row = QHBoxLayout(self)
        row.setContentsMargins(10, 6, 6, 6)
        self.text = QLabel()
        self.text.setWordWrap(True)
        self.text.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        close = QPushButton("✕")
        close.setFlat(True)
        close.setFixedWidth(28)
        close.setToolTip("Dismiss")
        close.clicked.connect(self.hide)
        self.action_button = QPushButton()
        self.action_button.hide()
        self.action_button.clicked.connect(self._act)
        self._action: Callable[[], None] | None = None
        row.addWidget(self.text, 1)
        row.addWidget(self.action_button, 0, Qt.AlignmentFlag.AlignTop)
        row.addWidget(close, 0, Qt.AlignmentFlag.AlignTop)
        self.kind = ""
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        self.hide()

    def show_message(self, kind: str, text: str) -> None:
        bg, fg = self.STYLES[kind]
        self.kind = kind
        self.setStyleSheet(
            f"MessageBar {{ background: {bg}; border: 1px solid {fg}; border-radius: 4px; }} QLabel {{ color: {fg}; }}"
        )
        prefix = {"error": "Error: ", "warning": "Warning: ", "info": ""}[kind]
        self.text.setText(prefix + text)
        self._action = None
        self.action_button.hide()
        self.show()

    def offer(self, label: str, action: Callable[[], None]) -> None:
        """A button beside the message shown: ``action`` runs when clicked, then the bar closes."""
        self._action = action
        self.action_button.setText(label)
        self.action_button.show()

    def _act(self) -> None:
        action, self._action = self._action, None
        self.hide()
        if action is not None:
            action()


def group(title: str, widget: QWidget) -> QGroupBox:
    """One numbered step of the window: ``widget`` in a box with a bold title."""
    box = QGroupBox(title)
    box.setStyleSheet("QGroupBox { font-weight: bold; } QGroupBox * { font-weight: normal; }")
    layout = QVBoxLayout(box)
    layout.setContentsMargins(8, 8, 8, 8)
    layout.addWidget(widget)
    return box


def splitter(orientation: Qt.Orientation, *parts: tuple[QWidget, int]) -> QSplitter:
    """A splitter of ``(widget, stretch factor)`` parts."""
    split = QSplitter(orientation)
    for i, (widget, stretch) in enumerate(parts):
        split.addWidget(widget)
        split.setStretchFactor(i, stretch)
    return split


def free_folder(path: Path) -> Path:
    """``path``, or ``path-2``, ``path-3`` ... : the first that does not exist or is empty."""
    candidate, k = path, 2
    while candidate.exists() and (not candidate.is_dir() or any(candidate.iterdir())):
        candidate, k = path.with_name(f"{path.name}-{k}"), k + 1
    return candidate
