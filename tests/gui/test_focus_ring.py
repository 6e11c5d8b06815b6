"""The blue focus ring on push buttons never clips their labels: with the ring drawn (border and padding of the
focused state), each button's contents at its size hint, and at the size the window gives it, hold its text
whole (no "\\dd agent folder..", "Jse this merge")."""

from __future__ import annotations

from PySide6.QtCore import QPoint, QRect
from PySide6.QtWidgets import QPushButton, QStyle, QStyleOptionButton

from .conftest import analyse, load_sources


def _contents(button: QPushButton, size) -> QRect:
    option = QStyleOptionButton()
    button.initStyleOption(option)
    option.state |= QStyle.StateFlag.State_HasFocus  # the focus ring's rule applies
    option.rect = QRect(QPoint(0, 0), size)
    return button.style().subElementRect(QStyle.SubElement.SE_PushButtonContents, option, button)


def test_focused_buttons_hold_their_labels(qtbot, window, demo_models):
    base, agents = demo_models
    load_sources(qtbot, window, base, agents)
    analyse(qtbot, window)
    window.resize(1366, 768 - 40 - 30)
    qtbot.wait(100)
    buttons = [b for b in window.findChildren(QPushButton) if b.text().strip()]
    assert len(buttons) > 20
    clipped = []
    for button in buttons:
        text = button.text().replace("&", "")
        metrics = button.fontMetrics()
        sizes = [button.sizeHint()] + ([button.size()] if button.isVisible() else [])
        for size in sizes:
            rect = _contents(button, size)
            if rect.width() < metrics.horizontalAdvance(text) or rect.height() < metrics.height():
                clipped.append((text, size.toTuple(), rect.size().toTuple(), metrics.horizontalAdvance(text)))
    assert not clipped, clipped
