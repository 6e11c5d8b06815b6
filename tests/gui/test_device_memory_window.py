"""A GPU out of memory mid-merge in the window: its words (the Device setting, not a flag), nothing written, the
staging folder gone. The CLI's side, and how the GPU is simulated here: tests/test_device_memory.py."""

from __future__ import annotations

from pathlib import Path

import torch
from PySide6.QtCore import Qt

from ram_desktop.core import pipeline
from ram_desktop.core.devices import DeviceChoice
from ram_desktop.core.engine import chunks

from .. import device_sim
from .conftest import load_sources


def _left_beside(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(out.name))


def test_the_window_says_what_to_try_and_writes_nothing(qtbot, window, tmp_path, synthetic_models, monkeypatch):
    def exhausted(*args, **kwargs):  # the first chunk of the merge pass, on the window's worker thread
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(pipeline, "choose_device", lambda requested, cpu_kernels: DeviceChoice("cuda:0", "simulated"))
    monkeypatch.setattr(pipeline, "Transfer", device_sim.SimulatedTransfer)
    monkeypatch.setattr(chunks, "make_chunk", exhausted)
    window.resize(1366, 768)
    base, agents = synthetic_models
    load_sources(qtbot, window, base, agents)
    window.method.method.setCurrentIndex(window.method.method.findData("average"))
    out = tmp_path / "merged"
    window.method.out_dir.setText(str(out))
    with qtbot.waitSignal(window.merge_finished, timeout=60000) as blocker:
        qtbot.mouseClick(window.merge_button, Qt.LeftButton)
    assert blocker.args != ["done"]
    text = window.message.text.text()
    assert "GPU cuda:0 ran out of memory" in text and "Device" in text and "--device" not in text, text
    assert window.message.kind == "error" and not window.busy()
    assert _left_beside(out) == []
