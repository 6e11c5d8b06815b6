"""The filters editor of a setting field ("Filters…" beside it, docs/gui.md): rows typed into its table
become the field's YAML text, the window's recipe and a merge with the same bytes as ``ram-merge run``;
the editor opens with the field's value, marks a wrong value with the command line's own message, and shows
the filters of an imported mergekit YAML (offscreen Qt, real widgets)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import yaml
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog, QLineEdit

from ram_desktop.gui.method.filters_dialog import SAMPLE_LAYERS, SAMPLE_NAMES

from ..subproc import cli, refused
from .conftest import load_sources, merge

FILTERS = [{"filter": "mlp", "value": 0.5}, {"filter": "self_attn", "value": [0.2, 0.9]}, {"value": 0.8}]


def click(qtbot, button) -> None:
    assert button.isEnabled(), button.text()
    qtbot.mouseClick(button, Qt.LeftButton)


def type_cell(qtbot, dialog, row: int, column: int, text: str) -> None:
    """Double-click-edit one cell as a user does: open its editor, type, press Return."""
    table = dialog.table
    table.setCurrentCell(row, column)
    table.editItem(table.item(row, column))
    editor = table.indexWidget(table.model().index(row, column))
    assert isinstance(editor, QLineEdit)
    editor.selectAll()
    qtbot.keyClicks(editor, text)
    qtbot.keyClick(editor, Qt.Key_Return)  # the delegate commits the text from the event loop
    qtbot.waitUntil(lambda: table.state() != table.State.EditingState)
    assert table.item(row, column).text() == text


def open_editor(qtbot, button):
    click(qtbot, button)
    dialog = button.dialog
    assert dialog is not None and dialog.isVisible()
    return dialog


def expected_value(setting: list[dict], name: str, layers: int):
    """Plain reference of mergekit's rules: the first entry whose filter is in the name (or the fallback);
    a gradient interpolated linearly at t = i / (L − 1) of decoder layer i, t = 0 outside the layers."""
    match = re.search(r"layers\.(\d+)\.", name)
    t = int(match.group(1)) / (layers - 1) if match else 0.0
    for entry in setting:
        if "filter" not in entry or entry["filter"] in name:
            value = entry["value"]
            if isinstance(value, list):
                return float(np.interp(t, np.linspace(0, 1, len(value)), value))
            return value
    return None


def weights(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.name.endswith(".safetensors")}


def test_filters_typed_into_the_table_reach_the_field_the_recipe_and_the_merge(qtbot, window, demo_models, tmp_path):
    base, agents = demo_models
    load_sources(qtbot, window, base, agents)
    window.method.set_method("weighted-task-arithmetic")
    field = window.method.fields["lambda"].widget
    qtbot.waitUntil(field.filters.isVisible)
    assert field.edit.text() == "1.0"
    dialog = open_editor(qtbot, field.filters)
    assert dialog.rows() == [("", "1.0")]  # a number: one fallback row

    dialog.table.setCurrentCell(0, 1)
    click(qtbot, dialog.remove_button)
    assert dialog.rows() == [] and not dialog.ok_button.isEnabled()
    assert "empty list" in dialog.error.text()
    for row, (filt, value) in enumerate([("mlp", "0.5"), ("self_attn", "[0.2, 0.9]"), ("", "0.8")]):
        click(qtbot, dialog.add_button)
        assert dialog.table.rowCount() == row + 1 and dialog.table.currentRow() == row
        if filt:
            type_cell(qtbot, dialog, row, 0, filt)
        type_cell(qtbot, dialog, row, 1, value)
    assert dialog.ok_button.isEnabled() and not dialog.error.isVisible()
    assert dialog.setting() == FILTERS
    # the selected row's gradient over the layers, and what the sample names get (a plain reference)
    dialog.table.setCurrentCell(1, 1)
    xs, ys = dialog.curve.getData()
    assert list(xs) == [0.0, 1.0] and list(ys) == [0.2, 0.9]
    preview = dialog.preview.text()
    for name in SAMPLE_NAMES:
        want = expected_value(FILTERS, name, SAMPLE_LAYERS)
        assert f"<tt>{name}</tt></td><td>&nbsp;→&nbsp;{want:.6g}<" in preview, (name, want, preview)

    click(qtbot, dialog.ok_button)
    qtbot.waitUntil(lambda: field.filters.dialog is None)
    assert field.edit.text() == "[{filter: mlp, value: 0.5}, {filter: self_attn, value: [0.2, 0.9]}, {value: 0.8}]"
    assert window.method.params()["lambda"] == FILTERS
    assert window.spec().params["lambda"] == FILTERS
    saved = tmp_path / "saved.yaml"
    assert window.save_recipe(saved)
    assert yaml.safe_load(saved.read_text())["parameters"]["lambda"] == FILTERS

    # reopened: the same rows; Cancel leaves the field as it is
    dialog = open_editor(qtbot, field.filters)
    assert dialog.rows() == [("mlp", "0.5"), ("self_attn", "[0.2, 0.9]"), ("", "0.8")]
    type_cell(qtbot, dialog, 0, 1, "0.25")
    click(qtbot, dialog.box.button(dialog.box.StandardButton.Cancel))
    qtbot.waitUntil(lambda: field.filters.dialog is None)
    assert window.method.params()["lambda"] == FILTERS

    # a merge from the window gives the bytes `ram-merge run` gives for the same recipe (a fresh process)
    window.method.set_out_dtype("float32")
    window.method.out_dir.setText(str(tmp_path / "window"))
    merge(qtbot, window)
    assert window.save_recipe(saved)
    recipe = yaml.safe_load(saved.read_text())
    assert recipe["parameters"]["lambda"] == FILTERS and recipe["method"] == "weighted-task-arithmetic"
    done = cli(tmp_path, "run", str(saved), "--out", str(tmp_path / "cli"))
    assert done.returncode == 0, done.stderr
    assert weights(tmp_path / "cli") == weights(tmp_path / "window") != {}
    # the filters changed the merge: all-1.0 λ (the default) gives other bytes
    plain = dict(recipe, parameters={**recipe["parameters"], "lambda": 1.0})
    (tmp_path / "plain.yaml").write_text(yaml.safe_dump(plain))
    done = cli(tmp_path, "run", str(tmp_path / "plain.yaml"), "--out", str(tmp_path / "plain"))
    assert done.returncode == 0, done.stderr
    assert weights(tmp_path / "plain") != weights(tmp_path / "window")


def test_rows_move_and_the_first_match_wins(qtbot, window):
    window.method.set_method(
        "slerp", {"t": [{"filter": "mlp", "value": 0.3}, {"filter": "mlp.down", "value": 0.9}, {"value": [0, 1]}]}
    )
    field = window.method.fields["t"].widget
    qtbot.waitUntil(field.filters.isVisible)
    dialog = open_editor(qtbot, field.filters)
    down = "<tt>model.layers.0.mlp.down_proj.weight</tt></td><td>&nbsp;→&nbsp;"
    assert down + "0.3<" in dialog.preview.text()
    assert "never reached" not in dialog.preview.text()
    dialog.table.setCurrentCell(1, 0)
    click(qtbot, dialog.up_button)  # mlp.down is now tried first
    assert dialog.rows()[:2] == [("mlp.down", "0.9"), ("mlp", "0.3")] and dialog.table.currentRow() == 0
    assert down + "0.9<" in dialog.preview.text()
    assert not dialog.up_button.isEnabled()
    dialog.table.setCurrentCell(2, 1)
    assert not dialog.down_button.isEnabled()
    click(qtbot, dialog.up_button)
    click(qtbot, dialog.up_button)  # the fallback first: the rows below it are never reached
    assert dialog.rows()[0] == ("", "[0, 1]")
    assert "Row 2, 3 is never reached" in dialog.preview.text()
    assert down + "0<" in dialog.preview.text()
    click(qtbot, dialog.down_button)
    click(qtbot, dialog.down_button)
    click(qtbot, dialog.add_button)  # a new row goes above the fallback
    assert dialog.table.currentRow() == 2 and dialog.rows()[3] == ("", "[0, 1]")
    type_cell(qtbot, dialog, 2, 0, "lm_head")
    type_cell(qtbot, dialog, 2, 1, "[0.1, 0.2]")
    click(qtbot, dialog.ok_button)
    assert window.method.params()["t"] == [
        {"filter": "mlp.down", "value": 0.9},
        {"filter": "mlp", "value": 0.3},
        {"filter": "lm_head", "value": [0.1, 0.2]},
        {"value": [0, 1]},
    ]


def test_a_wrong_value_disables_ok_with_the_command_lines_message(qtbot, window, demo_models, tmp_path):
    window.method.set_method("weighted-task-arithmetic")
    field = window.method.fields["lambda"].widget
    qtbot.waitUntil(field.filters.isVisible)
    dialog = open_editor(qtbot, field.filters)
    click(qtbot, dialog.add_button)
    type_cell(qtbot, dialog, 0, 0, "mlp")
    type_cell(qtbot, dialog, 0, 1, "20")  # λ is at most 10
    assert not dialog.ok_button.isEnabled()
    message = dialog.error.text()
    assert "--lambda" in message and "20" in message and dialog.error.isVisible()
    assert dialog.table.item(0, 1).background().color().name() == "#f8d0d0"
    assert dialog.table.item(0, 1).toolTip() and dialog.table.item(1, 1).background().style() == Qt.NoBrush
    assert "→&nbsp;?" in dialog.preview.text()
    # `ram-merge run` of a recipe with the same value refuses it with the same words
    base, agents = demo_models
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "format": "ram-recipe/1",
                "method": "weighted-task-arithmetic",
                "parameters": {"lambda": [{"filter": "mlp", "value": 20}, {"value": 1.0}]},
                "base": str(base),
                "agents": [str(a) for a in agents],
            }
        )
    )
    line = refused(cli(tmp_path, "run", str(recipe), "--out", str(tmp_path / "o")))
    assert line.endswith(message), (line, message)
    type_cell(qtbot, dialog, 0, 1, "abc")
    assert not dialog.ok_button.isEnabled() and "abc" in dialog.error.text()
    type_cell(qtbot, dialog, 0, 1, "[2, 4]")
    assert dialog.ok_button.isEnabled() and dialog.table.item(0, 1).background().style() == Qt.NoBrush
    click(qtbot, dialog.box.button(dialog.box.StandardButton.Cancel))
    assert field.edit.text() == "1.0"


def test_per_agent_rows_have_their_own_editor(qtbot, window):
    window.method.set_agent_names(["coder", "tool"])
    window.method.set_method("weighted-task-arithmetic")
    weight = window.method.fields["weight"].widget
    assert len(weight.filter_buttons) == 2
    qtbot.waitUntil(weight.filter_buttons[1].isVisible)
    dialog = open_editor(qtbot, weight.filter_buttons[1])
    assert dialog.rows() == [("", "")] and dialog.ok_button.isEnabled()  # empty: the default
    assert "1.0 (default)" in dialog.preview.text()
    assert "tool" in dialog.windowTitle()
    click(qtbot, dialog.add_button)
    type_cell(qtbot, dialog, 0, 0, "self_attn")
    type_cell(qtbot, dialog, 0, 1, "[0.5, 2]")
    assert not dialog.ok_button.isEnabled()  # the fallback row is empty now
    assert dialog.error.text().startswith("--weight[1][1].value")  # the agent's index, as in a recipe
    type_cell(qtbot, dialog, 1, 1, "0.7")
    click(qtbot, dialog.ok_button)
    assert weight.edits[1].text() == "[{filter: self_attn, value: [0.5, 2]}, {value: 0.7}]"
    assert window.method.params()["weight"] == {
        "coder": None,
        "tool": [{"filter": "self_attn", "value": [0.5, 2]}, {"value": 0.7}],
    }
    dialog = open_editor(qtbot, weight.filter_buttons[0])  # the other agent's row is untouched
    assert dialog.rows() == [("", "")]


def test_imported_mergekit_filters_show_in_the_editor(qtbot, window, demo_models, tmp_path, monkeypatch):
    base, agents = demo_models
    t = [
        {"filter": "self_attn", "value": [0, 0.5, 0.3, 0.7, 1]},
        {"filter": "mlp", "value": [1, 0.5, 0.7, 0.3, 0]},
        {"value": 0.5},
    ]
    config = tmp_path / "slerp.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "merge_method": "slerp",
                "base_model": str(base),
                "models": [{"model": str(base)}, {"model": str(agents[0])}],
                "parameters": {"t": t},
                "dtype": "float32",
            }
        )
    )
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(config), ""))
    window.menus.import_mergekit_action.trigger()  # File ▸ Import mergekit YAML…
    qtbot.waitUntil(lambda: window.method.current.name == "slerp", timeout=10000)
    qtbot.waitUntil(lambda: window.report is not None and not window.busy(), timeout=30000)  # its analysis
    field = window.method.fields["t"].widget
    qtbot.waitUntil(field.filters.isVisible)
    dialog = open_editor(qtbot, field.filters)
    assert dialog.rows() == [
        ("self_attn", "[0.0, 0.5, 0.3, 0.7, 1.0]"),
        ("mlp", "[1.0, 0.5, 0.7, 0.3, 0.0]"),
        ("", "0.5"),
    ]  # the import reads the numbers as floats
    dialog.table.setCurrentCell(1, 1)
    xs, ys = dialog.curve.getData()
    assert list(xs) == [0.0, 0.25, 0.5, 0.75, 1.0] and list(ys) == [1, 0.5, 0.7, 0.3, 0]
    click(qtbot, dialog.ok_button)  # unchanged rows give the same setting back
    assert window.method.params()["t"] == t


def test_an_agent_list_changed_under_an_open_editor_takes_the_editor_along(qtbot, window):
    import shiboken6

    window.method.set_agent_names(["coder", "tool"])
    window.method.set_method("weighted-task-arithmetic")
    weight = window.method.fields["weight"].widget
    qtbot.waitUntil(weight.filter_buttons[1].isVisible)
    dialog = open_editor(qtbot, weight.filter_buttons[1])
    window.method.set_agent_names(["coder", "tool", "memory"])  # the rows are rebuilt
    qtbot.waitUntil(lambda: not shiboken6.isValid(dialog))
    assert len(weight.filter_buttons) == 3 and all(b.dialog is None for b in weight.filter_buttons)
    assert window.method.params()["weight"] == 1.0
