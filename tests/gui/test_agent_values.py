"""Per-agent values, names and colours follow their agent through remove, reorder and rename in the window: the
method form never shifts one agent's value onto another (a silent wrong merge) and keeps no row for an agent
that is gone (offscreen Qt, real widgets clicked)."""

from __future__ import annotations

from PySide6.QtCore import Qt

from ram_desktop.gui.sources.panel import NAME


def _rows(field) -> list[tuple[str, str]]:
    """(label, value) of each row of a per-agent field, as the form shows them."""
    grid = field.layout()
    out = []
    for row in range(grid.rowCount()):
        label, edit = grid.itemAtPosition(row, 0), grid.itemAtPosition(row, 1)
        if label is not None and edit is not None:
            out.append((label.widget().text(), edit.widget().text()))
    return out


def _colors(window) -> dict[str, str]:
    table = window.sources.table
    return {
        table.item(r, NAME).text(): table.item(r, NAME).foreground().color().name() for r in range(1, table.rowCount())
    }


def _click_row(qtbot, window, row: int, button) -> None:
    window.sources.table.selectRow(row)
    qtbot.mouseClick(button, Qt.LeftButton)


def test_remove_move_and_rename_keep_every_agents_values(qtbot, window, tmp_path):
    for name in ("base", "coder", "tool", "memory"):
        (tmp_path / name).mkdir()
    window.sources.set_base(str(tmp_path / "base"))
    for name in ("coder", "tool", "memory"):
        window.sources.add_agent(str(tmp_path / name))
    window.method.set_method("weighted-ties")
    weight = window.method.fields["weight"].widget
    qtbot.waitUntil(weight.isVisible)
    for edit, value in zip(weight.edits, ("0.1", "0.2", "0.3")):
        qtbot.keyClicks(edit, value)
    assert _rows(window.method.fields["weight"].widget) == [("coder", "0.1"), ("tool", "0.2"), ("memory", "0.3")]
    colors = _colors(window)

    _click_row(qtbot, window, 1, window.sources.remove_button)  # remove coder
    assert window.sources.names == ["tool", "memory"]
    assert _rows(window.method.fields["weight"].widget) == [("tool", "0.2"), ("memory", "0.3")]  # no stale row
    assert _colors(window) == {n: colors[n] for n in ("tool", "memory")}

    _click_row(qtbot, window, 2, window.sources.up_button)  # move memory up
    assert window.sources.names == ["memory", "tool"]
    assert _rows(window.method.fields["weight"].widget) == [("memory", "0.3"), ("tool", "0.2")]
    assert _colors(window) == {n: colors[n] for n in ("tool", "memory")}

    window.sources.table.item(2, NAME).setText("tools")  # rename tool (as a double-click edit does)
    assert window.sources.names == ["memory", "tools"]
    assert _rows(window.method.fields["weight"].widget) == [("memory", "0.3"), ("tools", "0.2")]
    assert _colors(window)["tools"] == colors["tool"]

    # what the window merges: the values keyed by the agents they belong to
    window.method.out_dir.setText(str(tmp_path / "out"))
    recipe = window.spec().resolved().to_yaml()
    assert "weight:\n    memory: 0.3\n    tools: 0.2\n" in recipe
