"""Small things of the window: the log follows its newest line, the title follows the sources, output folders
are visible ones, Help ▸ Reading the charts explains every chart."""

from __future__ import annotations

import logging
import shutil

from PySide6.QtWidgets import QApplication, QDialog, QTextBrowser

from .conftest import load_sources


def test_the_log_follows_the_newest_line(qtbot, window):
    for i in range(300):
        logging.getLogger("ram_desktop").info("line %d of a long log", i)
    qtbot.waitUntil(lambda: "line 299" in window.log_view.toPlainText(), timeout=5000)
    bar = window.log_view.verticalScrollBar()
    assert bar.maximum() > 0 and bar.value() == bar.maximum()
    bar.setValue(0)  # read back, then the engine writes again: the newest line comes into view
    logging.getLogger("ram_desktop").info("the newest line")
    qtbot.waitUntil(lambda: "the newest line" in window.log_view.toPlainText(), timeout=5000)
    assert bar.value() == bar.maximum()


def test_the_title_follows_the_sources(qtbot, window, demo_models, tmp_path):
    base, agents = demo_models
    load_sources(qtbot, window, base, agents)
    recipe = tmp_path / "three.yaml"
    assert window.save_recipe(recipe)
    assert window.open_recipe(recipe)
    assert window.windowTitle().startswith("three.yaml")
    qtbot.waitUntil(lambda: window.sources.all_ready(), timeout=10000)
    window.sources.table.selectRow(3)
    window.sources.remove_selected()
    assert "three.yaml" not in window.windowTitle()
    assert "coder" in window.windowTitle() and "tool" in window.windowTitle()


def test_outputs_go_to_a_visible_folder_when_the_base_is_hidden(qtbot, window, demo_models, tmp_path, monkeypatch):
    visible = tmp_path / "Documents" / "RAM Desktop"
    monkeypatch.setenv("RAM_DESKTOP_OUTPUTS", str(visible))
    base, agents = demo_models
    hidden = tmp_path / ".cache" / "models"
    hidden.mkdir(parents=True)
    copies = [shutil.copytree(p, hidden / p.name) for p in (base, *agents[:2])]
    load_sources(qtbot, window, copies[0], copies[1:])
    out = window.method.out_dir.text()
    assert out.startswith(str(visible)) and "/." not in out
    assert window.compare.folder.text().startswith(str(visible))
    assert window.menus.save_folder().startswith(str(visible))


def test_help_reading_the_charts_explains_every_chart(qtbot, window):
    action = next(a for a in window.menus.help_menu.actions() if "Reading the charts" in a.text())
    action.trigger()
    dialog = next(w for w in QApplication.topLevelWidgets() if isinstance(w, QDialog) and w.isVisible())
    text = dialog.findChild(QTextBrowser).toPlainText()
    for title in (
        "Density",
        "Overlap",
        "Layers × modules",
        "Tensors",
        "Sets",
        "Signs",
        "Ulps",
        "Would keep",
        "Per layer",
    ):
        assert title in text
    assert "q, k, v, o" in text and "blank" in text.lower()
    dialog.close()


def test_the_two_dtype_fields_say_which_is_which(qtbot, window, demo_models):
    from PySide6.QtWidgets import QLabel

    base, agents = demo_models
    load_sources(qtbot, window, base, agents[:1])
    window.method.set_method("slerp")
    compute = window.method.findChild(QLabel, "label_dtype")
    assert compute.text() == "Compute dtype"
    output = window.method.form.labelForField(window.method.out_dtype)
    assert output.text() == "Output dtype" and "saved" in output.toolTip()
