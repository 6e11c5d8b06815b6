"""The built-in demo says in the window that it is a toy, and the title stops saying so for other models."""

from __future__ import annotations

from ram_desktop.gui import main_window


def test_the_demo_is_labelled_a_toy_until_other_models_are_opened(qtbot, window, demo_models, monkeypatch):
    base, agents = demo_models
    monkeypatch.setattr(main_window, "ensure_demo", lambda: (base, agents))
    assert "demo" not in window.windowTitle().lower()
    window.load_demo()
    qtbot.waitUntil(lambda: window.sources.all_ready() and not window.busy(), timeout=20000)
    assert "toy" in window.windowTitle() and "156k parameters" in window.windowTitle()
    assert "reproduction/results/real" in window.run_box.log_view.toPlainText()
    window.set_sources(str(base), [str(a) for a in agents], None, analyse=False)
    assert "toy" not in window.windowTitle()
