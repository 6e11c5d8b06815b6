"""Fisher merging in the window: a suite picker per agent, the Fisher estimate's progress and cancel."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from PySide6.QtCore import QObject, Qt, Slot

from ram_desktop.evaluate import fisher as fisher_module

from ..test_fisher_estimate import PROMPTS, _agents, write_suite
from ..tinylm import write_tiny_lm
from .conftest import load_sources, merge


@pytest.fixture
def fisher_inputs(tmp_path):
    lm = write_tiny_lm(tmp_path / "base", chat_template=False, seed=3, hidden=32)
    base, agents = _agents(tmp_path, lm)
    suites = [write_suite(tmp_path / "s0", PROMPTS[:2]), write_suite(tmp_path / "s1", PROMPTS[2:])]
    return base, agents, suites


class ProgressSpy(QObject):
    """Listens to the window's progress after the window's own slot (a slot of a QObject, so Qt delivers
    in the GUI thread), records each event with the progress line it left, and runs ``then(event)``."""

    def __init__(self, window, then=None) -> None:
        super().__init__(window)
        self.then, self.events = then, []
        window.jobs.progress.connect(self.on_progress)

    @Slot(object)
    def on_progress(self, event) -> None:
        self.events.append((event.stage, self.parent().progress_label.text()))
        if self.then is not None:
            self.then(event)


def _choose_fisher(qtbot, window, base, agents, suites, out: Path) -> None:
    load_sources(qtbot, window, base, agents)
    window.method.set_method("fisher")
    window.method.set_device("cpu")
    field = window.method.fields["suite"]
    assert [e.objectName() for e in field.widget.edits] == ["param_suite_0", "param_suite_1"]
    for edit, suite in zip(field.widget.edits, suites):
        edit.setFocus()
        qtbot.keyClicks(edit, str(suite))
    window.method.out_dir.setText(str(out))


def test_fisher_merge_from_suites_in_the_window(qtbot, window, fisher_inputs, tmp_path):
    base, agents, suites = fisher_inputs
    out = tmp_path / "merged"
    _choose_fisher(qtbot, window, base, agents, suites, out)
    spy = ProgressSpy(window)
    stages = spy.events
    merge(qtbot, window, timeout=120000)
    assert any(stage == "fisher" and text.startswith("Estimating Fisher: ") for stage, text in stages), stages
    # the last event always arrives (its rate, "· x examples/s", follows when the step took long enough to show one)
    assert any(
        stage == "fisher" and text.startswith("Estimating Fisher: 2 examples of 2 examples") for stage, text in stages
    ), stages
    assert stages.index(next(s for s in stages if s[0] == "merge")) > stages.index(
        next(s for s in stages if s[0] == "fisher")
    )
    report = json.loads((out / "merge-report.json").read_text())
    assert report["method"] == "fisher" and report["method_params"]["suite"] == [str(s) for s in suites]
    assert all(Path(f).parent == fisher_module.cache_root() for f in report["method_params"]["fisher"])
    if os.environ.get("RAM_DESKTOP_SCREENSHOTS"):
        window.grab().save(os.environ["RAM_DESKTOP_SCREENSHOTS"])


def test_cancel_during_the_fisher_estimate(qtbot, window, fisher_inputs, tmp_path):
    base, agents, _ = fisher_inputs
    # long suites, so the cancel (delivered through the GUI thread) lands while the first estimate runs
    suites = [write_suite(tmp_path / f"long{t}", PROMPTS * 8) for t in range(2)]
    out = tmp_path / "merged"
    _choose_fisher(qtbot, window, base, agents, suites, out)
    ProgressSpy(window, lambda event: window.cancel() if event.stage == "fisher" and event.done >= 1 else None)
    with qtbot.waitSignal(window.merge_finished, timeout=120000) as blocker:
        qtbot.mouseClick(window.merge_button, Qt.LeftButton)
    assert blocker.args == ["cancelled"]
    assert not out.exists() and not list(tmp_path.glob("merged.partial-*"))
    assert not fisher_module.cache_root().exists() or not [p for p in fisher_module.cache_root().iterdir()]


def test_demo_suites_are_the_default_calibration_data(qtbot, window, fisher_inputs, tmp_path, monkeypatch):
    """A demo with demo.json (SPEC section 9) fills each agent's suite row when Fisher merging is picked."""
    from ram_desktop.gui import main_window

    base, agents, suites = fisher_inputs
    manifest = {
        "base": "base",
        "agents": [{"name": a.name, "path": a.name, "suite": s.name} for a, s in zip(agents, suites)],
    }
    (tmp_path / "demo.json").write_text(json.dumps(manifest))
    monkeypatch.setattr(main_window, "ensure_demo", lambda: (base, agents))
    window.load_demo()
    qtbot.waitUntil(lambda: window.sources.all_ready() and not window.busy(), timeout=20000)
    window.method.set_method("fisher")
    assert window.method.params()["suite"] == {a.name: str(s) for a, s in zip(agents, suites)}
    window.method.set_method("ram")
    window.set_sources(str(base), [str(a) for a in agents], None, analyse=False)  # not the demo any more
    window.method.set_method("fisher")
    assert window.method.params()["suite"] is None
