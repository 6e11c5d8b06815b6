"""After Change base the agents are checked against the new base (issue 35): no row says "✓ ready" until it
fits, a shape mismatch is never "ready", and Merge is not offered while an agent does not fit."""

from __future__ import annotations

import shutil

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog
from safetensors.torch import load_file, save_file

from .conftest import load_sources

STATUS = 6


def _narrower_base(base, folder):
    """A copy of ``base`` whose first two-dimensional MLP weight has one row fewer: another architecture."""
    shutil.copytree(base, folder)
    weights = folder / "model.safetensors"
    tensors = load_file(str(weights))
    name = next(n for n in sorted(tensors) if "mlp" in n and tensors[n].dim() == 2)
    tensors[name] = tensors[name][:-1].contiguous()
    save_file(tensors, str(weights), metadata={"format": "pt"})
    return folder, name


def _statuses(window) -> list[str]:
    table = window.sources.table
    return [table.item(r, STATUS).text() for r in range(1, table.rowCount())]


def _change_base(qtbot, window, monkeypatch, folder) -> None:
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", staticmethod(lambda *a, **k: str(folder)))
    assert window.sources.base_button.text() == "Change base…"
    qtbot.mouseClick(window.sources.base_button, Qt.LeftButton)


def test_agents_leave_ready_after_change_base_and_a_shape_mismatch_is_never_ready(
    qtbot, window, demo_models, tmp_path, monkeypatch
):
    base, agents = demo_models
    load_sources(qtbot, window, base, agents[:2])
    assert _statuses(window) == ["✓ ready", "✓ ready"] and window.merge_button.isEnabled()
    other, tensor = _narrower_base(base, tmp_path / "other-base")

    _change_base(qtbot, window, monkeypatch, other)
    # at once, before the new base is read: not "ready", and no Merge
    assert "✓ ready" not in _statuses(window), _statuses(window)
    assert not window.merge_button.isEnabled()
    qtbot.waitUntil(lambda: not window.sources.busy and not window.busy(), timeout=20000)
    assert _statuses(window) == ["✗ mismatch", "✗ mismatch"]
    tip = window.sources.table.item(1, STATUS).toolTip()
    assert tensor in tip and "shape" in tip
    assert not window.merge_button.isEnabled()
    assert "agent 1 (coder) does not fit the base" in window.merge_button.toolTip()
    assert window.message.kind == "error" and "does not fit the base" in window.message.text.text()
    qtbot.mouseClick(window.merge_button, Qt.LeftButton)  # a disabled button: nothing runs
    assert not window.busy()

    # the base they were fine-tuned from again: checked, ready, Merge offered, the message gone
    _change_base(qtbot, window, monkeypatch, base)
    assert "✓ ready" not in _statuses(window)
    qtbot.waitUntil(lambda: _statuses(window) == ["✓ ready", "✓ ready"], timeout=20000)
    qtbot.waitUntil(lambda: not window.busy(), timeout=30000)
    assert window.merge_button.isEnabled() and "does not fit" not in window.merge_button.toolTip()
    assert not (window.message.isVisible() and "does not fit the base" in window.message.text.text())


def test_an_agent_added_to_a_base_of_another_shape_is_not_ready(qtbot, window, demo_models, tmp_path):
    from .conftest import drop_paths

    base, agents = demo_models
    other, _ = _narrower_base(base, tmp_path / "other-base")
    drop_paths(window.sources, [other, agents[0]])
    qtbot.waitUntil(lambda: not window.sources.busy, timeout=20000)
    assert _statuses(window) == ["✗ mismatch"]
    assert not window.merge_button.isEnabled()
