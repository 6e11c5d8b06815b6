"""Every agent keeps one colour in every table and chart through remove and reorder (issue 47): colours are
keyed by the agent, not by its row; also in the analysis still shown (stale) until Analyze runs again."""

from __future__ import annotations

from PySide6.QtCore import Qt

from ram_desktop.evaluate.chart import model_colors, palette_color
from ram_desktop.gui.sources.panel import NAME

from .conftest import analyse, load_sources


def _colours(window) -> dict[str, dict[str, str]]:
    """Each agent's colour in the sources table, the analysis table and the tensors table's header."""
    sources = {}
    for row in range(1, window.sources.table.rowCount()):
        item = window.sources.table.item(row, NAME)
        sources[item.text()] = item.foreground().color().name()
    table = window.analysis.table
    analysis = {table.item(r, 0).text(): table.item(r, 0).foreground().color().name() for r in range(table.rowCount())}
    model = window.analysis.tensors.model
    tensors = {
        name: model.headerData(4 + 2 * t, Qt.Orientation.Horizontal, Qt.ItemDataRole.ForegroundRole).color().name()
        for t, name in enumerate(model.names if hasattr(model, "names") else window.report.names)
    }
    return {"sources": sources, "analysis": analysis, "tensors": tensors}


def _same_colours(now: dict, before: dict) -> None:
    for view, colours in now.items():
        for name, colour in colours.items():
            assert colour == before["sources"][name], (view, name, colour, before["sources"][name])


def test_colours_follow_the_agent_through_remove_and_reorder(qtbot, window, demo_models):
    base, agents = demo_models
    load_sources(qtbot, window, base, agents)
    analyse(qtbot, window)
    before = _colours(window)
    assert len(set(before["sources"].values())) == 3
    _same_colours(before, before)

    window.sources.table.selectRow(3)  # the third agent moves up: the analysis shown is the old order's
    window.sources.move_selected(-1)
    _same_colours(_colours(window), before)
    analyse(qtbot, window)
    _same_colours(_colours(window), before)

    removed = window.sources.names[0]
    window.sources.table.selectRow(1)  # the first agent goes: the analysis shown still has it
    window.sources.remove_selected()
    _same_colours(_colours(window), before)
    analyse(qtbot, window)
    now = _colours(window)
    assert removed not in now["analysis"]
    _same_colours(now, before)
    # Evaluate and Compare: an agent's bars take its Analysis colour, whatever its place among the models
    from ram_desktop.gui.analysis.charts import agent_slot

    kept = window.sources.names
    slots = [agent_slot(n) for n in kept]
    colours = model_colors(["base", *["agent"] * len(kept), "merged"], slots)
    assert colours[1:3] == [before["sources"][n] for n in kept]
    assert colours[3] not in colours[:3] and colours[3] == palette_color(min(set(range(4)) - set(slots)))
