"""The window's "Replace it?" replaces only what RAM Desktop wrote (docs/contracts.md, "What a merge writes"):
an earlier output the user added a file to is refused without asking, the file named and a free folder
offered; the window's own charts saved into the output never stop a later replace."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox

from .conftest import analyse, load_sources, merge


def test_replace_refuses_an_earlier_output_holding_a_users_file(qtbot, window, demo_models, tmp_path, monkeypatch):
    base, agents = demo_models
    asked: list[str] = []

    def question(parent, title, text, *args, **kwargs):
        asked.append(text)
        return QMessageBox.Yes

    monkeypatch.setattr(QMessageBox, "question", staticmethod(question))
    load_sources(qtbot, window, base, agents)
    analyse(qtbot, window)
    out = tmp_path / "merged"
    window.method.out_dir.setText(str(out))
    merge(qtbot, window)
    assert (out / "ram-manifest.json").is_file() and asked == []
    (out / "my-notes.md").write_text("what I found\n")
    qtbot.mouseClick(window.merge_button, Qt.LeftButton)
    qtbot.wait(200)
    assert asked == [] and not window.busy()
    assert window.message.kind == "error" and "my-notes.md" in window.message.text.text()
    offer = window.message.action_button
    assert offer.isVisible() and "merged-2" in offer.text()
    assert (out / "my-notes.md").read_text() == "what I found\n"
    # without the user's file, the output (its charts included) is the window's own: replaced after asking
    (out / "my-notes.md").unlink()
    merge(qtbot, window)
    assert len(asked) == 1 and "merged" in asked[0]
