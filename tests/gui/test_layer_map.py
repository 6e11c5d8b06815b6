"""Sliced merges from the window (issue 35): a recipe or mergekit YAML with a layer map (``slices``) opens with
the map shown read-only, merges to the bytes ``ram-merge run`` writes from the same file, and agents that no
longer fit the map are said in the form with "Clear the layer map" as the fix."""

from __future__ import annotations

from pathlib import Path

import yaml
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog, QLabel

from ..subproc import cli
from .conftest import merge


def _choose_file(monkeypatch, path: Path) -> None:
    """The next File ▸ Open / Import dialog picks ``path``."""
    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(lambda *a, **k: (str(path), "")))


def _sliced_recipe(path: Path, base: Path, coder: Path) -> Path:
    """SLERP of coder with the base over two overlapping slices (layers 0–1, then 1–2: four output layers), each
    slice with its own t (so the form's t is not used)."""
    data = {
        "format": "ram-recipe/2",
        "method": "slerp",
        "parameters": {"t": 0.5, "dtype": "float32"},
        "base": str(base),
        "agents": [{"name": "coder", "source": str(coder)}],
        "out_dtype": "float32",
        "slices": [
            {
                "sources": [{"model": 0, "layer_range": [0, 2]}, {"model": 1, "layer_range": [0, 2]}],
                "parameters": {"t": 0.2},
            },
            {
                "sources": [{"model": 0, "layer_range": [1, 3]}, {"model": 1, "layer_range": [1, 3]}],
                "parameters": {"t": [0.3, 0.9]},
            },
        ],
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _stacking_config(path: Path, base: Path, coder: Path, tool: Path) -> Path:
    """mergekit passthrough: coder's layers 0–1 then tool's layers 1–2 (four layers), tool's scaled."""
    data = {
        "merge_method": "passthrough",
        "base_model": str(base),
        "dtype": "float32",
        "slices": [
            {"sources": [{"model": str(coder), "layer_range": [0, 2]}]},
            {"sources": [{"model": str(tool), "layer_range": [1, 3], "parameters": {"scale": 0.5}}]},
        ],
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _cells(window) -> list[list[str]]:
    table = window.method.layer_map_view.table
    return [[table.item(r, c).text() for c in range(table.columnCount())] for r in range(table.rowCount())]


def _wait_loaded(qtbot, window) -> None:
    """The file's sources opened and the analysis that loading starts finished."""
    qtbot.waitUntil(lambda: window.sources.all_ready() and not window.sources.busy, timeout=20000)
    qtbot.waitUntil(lambda: not window.busy(), timeout=30000)


def _same_bytes(ours: Path, theirs: Path) -> None:
    names = sorted(p.name for p in theirs.iterdir() if p.suffix == ".safetensors" or p.name == "config.json")
    assert names and "config.json" in names
    assert sorted(p.name for p in ours.iterdir() if p.suffix == ".safetensors" or p.name == "config.json") == names
    for name in names:
        assert (ours / name).read_bytes() == (theirs / name).read_bytes(), name


def test_a_sliced_recipe_shows_its_layer_map_and_merges_as_ram_merge_run(
    qtbot, window, demo_models, tmp_path, monkeypatch
):
    base, agents = demo_models
    recipe = _sliced_recipe(tmp_path / "sliced.yaml", base, agents[0])
    _choose_file(monkeypatch, recipe)
    window.menus.open_action.trigger()  # File ▸ Open recipe…
    assert window.message.kind != "error" or not window.message.isVisible(), window.message.text.text()
    _wait_loaded(qtbot, window)
    view = window.method.layer_map_view
    assert view.isVisible() and view.table.isVisible()
    assert _cells(window) == [
        ["0–1", "base, coder: 0–1", "t: 0.2"],
        ["2–3", "base, coder: 1–2", "t: [0.3, 0.9]"],
    ]
    # the method is the map's, and t, set in every slice, is not the form's to give
    assert window.method.current.name == "slerp" and not window.method.method.isEnabled()
    assert "layer map" in window.method.method.toolTip()
    t_field = window.method.fields["t"].widget
    assert not t_field.isEnabled() and "every slice" in t_field.toolTip()
    assert window.method.findChild(QLabel, "label_t").text() == "t (per slice)"
    assert not window.method.problem.isVisible(), window.method.problem.text()

    out = tmp_path / "window-out"
    window.method.out_dir.setText(str(out))
    merge(qtbot, window)
    done = cli(tmp_path, "run", str(recipe), "--out", str(tmp_path / "cli-out"))
    assert done.returncode == 0, done.stderr
    _same_bytes(out, tmp_path / "cli-out")
    saved = yaml.safe_load((out / "ram-recipe.yaml").read_text())
    assert [s["sources"] for s in saved["slices"]] == [
        [{"model": 0, "layer_range": [0, 2]}, {"model": 1, "layer_range": [0, 2]}],
        [{"model": 0, "layer_range": [1, 3]}, {"model": 1, "layer_range": [1, 3]}],
    ]
    # an agent added to a merge's map (which reads every model in every slice) is said, with the fix
    from .conftest import drop_paths

    drop_paths(window.sources, [agents[1]])
    qtbot.waitUntil(lambda: not window.sources.busy, timeout=10000)
    problem = window.method.problem.text()
    assert "layer map merges the same models in every slice, without tool" in problem
    assert window.method.fix_button.text() == "Clear the layer map"


def test_a_sliced_mergekit_config_imports_with_its_layer_map_and_merges_as_ram_merge_run(
    qtbot, window, demo_models, tmp_path, monkeypatch
):
    base, agents = demo_models
    config = _stacking_config(tmp_path / "stack.yaml", base, agents[0], agents[1])
    _choose_file(monkeypatch, config)
    window.menus.import_mergekit_action.trigger()  # File ▸ Import mergekit YAML…
    _wait_loaded(qtbot, window)
    assert window.method.layer_map_view.isVisible()
    assert _cells(window) == [
        ["0–1", "coder: 0–1", "—"],
        ["2–3", "tool: 1–2", "dtype: float32; scale: tool 0.5"],  # mergekit's: the source's, the config's
    ]
    assert window.method.current.name == "passthrough" and not window.method.method.isEnabled()
    assert "4 output layers, stacked" in window.method.layer_map_view.caption.text()
    out = tmp_path / "window-out"
    window.method.out_dir.setText(str(out))
    merge(qtbot, window)
    done = cli(tmp_path, "run", str(config), "--out", str(tmp_path / "cli-out"))
    assert done.returncode == 0, done.stderr
    _same_bytes(out, tmp_path / "cli-out")
    assert yaml.safe_load((out / "config.json").read_text())["num_hidden_layers"] == 4


def test_removing_an_agent_the_layer_map_reads_is_said_with_the_fix(qtbot, window, demo_models, tmp_path):
    base, agents = demo_models
    config = _stacking_config(tmp_path / "stack.yaml", base, agents[0], agents[1])
    from ram_desktop.gui import ecosystem

    assert ecosystem.import_mergekit(window, config)
    _wait_loaded(qtbot, window)
    # reorder: the map follows its agents (coder's layers are still coder's)
    window.sources.table.selectRow(2)
    qtbot.mouseClick(window.sources.up_button, Qt.LeftButton)
    assert window.sources.names == ["tool", "coder"]
    assert [row[1] for row in _cells(window)] == ["coder: 0–1", "tool: 1–2"]
    assert [[x["model"] for x in s["sources"]] for s in window.spec().slices] == [[2], [1]]
    # rename: the slice's per-agent value follows its agent
    window.sources.table.item(1, 1).setText("helper")  # tool's name cell (as a double-click edit does)
    assert window.sources.names == ["helper", "coder"]
    scale = window.spec().slices[1]["parameters"]["scale"]
    assert scale["helper"] == 0.5 and "tool" not in scale
    assert [row[1] for row in _cells(window)] == ["coder: 0–1", "helper: 1–2"]
    # remove coder, which the map reads: said in the form, in the window's words, with the fix
    window.sources.table.selectRow(2)
    qtbot.mouseClick(window.sources.remove_button, Qt.LeftButton)
    problem = window.method.problem
    assert problem.isVisible() and "The layer map reads coder, no longer among the agents" in problem.text()
    assert "slices[" not in problem.text() and "--" not in problem.text()
    assert window.method.layer_map_view.table.property("invalid") is True
    assert [row[1] for row in _cells(window)] == ["coder (removed): 0–1", "helper: 1–2"]
    assert window.method.fix_button.isVisible() and window.method.fix_button.text() == "Clear the layer map"
    window.method.out_dir.setText(str(tmp_path / "out"))
    qtbot.mouseClick(window.merge_button, Qt.LeftButton)  # refused before anything runs, the fix offered
    assert not window.busy() and not (tmp_path / "out").exists()
    assert window.message.action_button.text() == "Clear the layer map"
    qtbot.mouseClick(window.method.fix_button, Qt.LeftButton)
    assert not window.method.layer_map_view.isVisible() and not problem.isVisible()
    assert window.spec().slices is None and window.method.method.isEnabled()
    assert window.method.current.name != "passthrough"  # stacking needs a map: the default method again
    names = [window.method.method.itemData(i) for i in range(window.method.method.count())]
    assert "passthrough" not in names
