"""The title names the rows there are (issue 47): a row added to the demo's sources and removed again, one that
could not be opened (not a model), leaves the title."""

from __future__ import annotations

from .conftest import drop_paths, load_sources


def test_a_removed_error_row_leaves_the_title(qtbot, window, demo_models, tmp_path):
    base, agents = demo_models
    load_sources(qtbot, window, base, agents)
    window.title.set("Built-in demo")  # as load_demo does
    bad = tmp_path / "notmodel"
    bad.mkdir()
    (bad / "model.safetensors").write_bytes(b"not a safetensors file")
    drop_paths(window.sources, [bad])
    qtbot.waitUntil(lambda: not window.sources.busy and bool(window.sources.errors()), timeout=10000)
    assert "notmodel" in window.windowTitle()
    window.sources.table.selectRow(window.sources.table.rowCount() - 1)
    window.sources.remove_selected()
    assert "notmodel" not in window.sources.names
    assert "notmodel" not in window.windowTitle(), window.windowTitle()
    assert all(name in window.windowTitle() for name in window.sources.names)
