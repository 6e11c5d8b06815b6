"""The pinned Qt binding keeps Python's reference counts: PySide6 6.12.0 dropped one reference to
None on every call of a Qt method that returns nothing, and a long session crashed the interpreter
("none_dealloc"); the pin is 6.11.0 until a fixed release."""

from __future__ import annotations

import sys

import pytest


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="None is immortal from Python 3.12 on")
def test_void_qt_calls_keep_none_alive(qapp):
    from PySide6.QtWidgets import QWidget

    widget = QWidget()
    before = sys.getrefcount(None)
    for _ in range(2000):
        widget.setMinimumHeight(5)
        widget.setVisible(False)
    lost = before - sys.getrefcount(None)
    assert lost < 100, f"{lost} references to None lost in 4000 calls"
