"""The window's words follow the method (issue 47): a one-agent SLERP merge is warned about in SLERP's terms, the
output dtype speaks of rescaling only for a method that rescales, and the density caption has no "(x0.001)"."""

from __future__ import annotations

from .conftest import analyse, load_sources, merge


def _dtype_texts(window) -> list[str]:
    box = window.method.out_dtype
    return [box.itemText(i) for i in range(box.count())] + [box.toolTip()]


def test_a_one_agent_slerp_is_told_in_slerps_terms(qtbot, window, demo_models, tmp_path):
    base, agents = demo_models
    load_sources(qtbot, window, base, agents[:1])
    window.method.set_method("slerp")
    analyse(qtbot, window)
    assert "RAM" not in window.message.text.text()
    caption = window.analysis.density.plot.getAxis("bottom").labelString()
    assert "unique to the agent" in caption and "(x" not in caption, caption
    assert not any("RAM" in t or "rescal" in t for t in _dtype_texts(window)), _dtype_texts(window)
    window.method.out_dir.setText(str(tmp_path / "out"))
    merge(qtbot, window)
    log = window.run_box.log_view.toPlainText()
    one = [line for line in log.splitlines() if "only one agent" in line and "SLERP" in line]
    assert one and not any("RAM" in line for line in log.splitlines() if "only one agent" in line), log
    window.method.set_method("ram-plus")  # a method that rescales: its dtype note says float32 keeps that
    assert any("float32" in t and "rescaling" in t for t in _dtype_texts(window)), _dtype_texts(window)


def test_a_misspelt_mergekit_key_is_named_in_the_window(qtbot, window, tmp_path):
    from ram_desktop.gui import ecosystem

    config = tmp_path / "mk.yaml"
    config.write_text("merge_methd: ties\nbase_model: base\nmodels:\n  - model: coder\n")
    assert not ecosystem.import_mergekit(window, config)
    shown = window.message.text.text()
    assert "merge_methd" in shown and "did you mean merge_method?" in shown, shown
    assert not window.open_recipe(config)  # opened as a recipe: recognised as mergekit's, the import offered
    assert window.message.action_button.text() == "Import as mergekit YAML", window.message.text.text()


def test_the_form_labels_ties_scope_by_its_name(qtbot, window):
    from PySide6.QtWidgets import QLabel

    window.method.set_method("ties")
    assert window.method.findChild(QLabel, "label_ties_scope").text() == "trim scope"
