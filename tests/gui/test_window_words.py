"""Refusals in the window's words, before Merge, with the fix offered as a button: a bad per-agent value names
the agent and outlines its field, a method's agent count offers to keep the agents it merges, the engine's
command-line advice becomes a button, a mergekit file opened as a recipe offers the import."""

from __future__ import annotations

import shutil

import pytest
import torch
from PySide6.QtCore import Qt
from safetensors.torch import load_file, save_file

from ram_desktop.core import ParameterError, get_method
from ram_desktop.gui.method.fields import in_window_words

from .conftest import load_sources


def test_a_bad_weight_names_the_agent_and_its_field_before_merge(qtbot, window, demo_models, tmp_path):
    base, agents = demo_models
    load_sources(qtbot, window, base, agents)
    window.method.set_method("della")
    edit = window.method.findChild(type(window.method.eps), "param_weight_1")  # tool's row
    edit.setFocus()
    qtbot.keyClicks(edit, "abc")
    problem = window.method.problem
    assert problem.isVisible() and "weight of tool" in problem.text() and "--weight" not in problem.text()
    assert edit.property("invalid") is True
    window.method.out_dir.setText(str(tmp_path / "out"))
    qtbot.mouseClick(window.merge_button, Qt.LeftButton)
    assert not window.busy()
    shown = window.message.text.text()
    assert "weight of tool must be a number" in shown and "--weight" not in shown
    assert window.focusWidget() is edit or not window.isActiveWindow()
    edit.clear()
    qtbot.keyClicks(edit, "0.5")
    assert not problem.isVisible() and not edit.property("invalid")


def test_an_agents_bad_value_is_refused_with_fields_the_window_words_it_from():
    """A per-agent value refused while the method validates it is a ``ParameterError`` naming the parameter, the
    agent (its position), the value and the reason; the command line's text names the flag as before, the window
    words the same refusal from the fields with its own name for the field."""
    (weight,) = [p for p in get_method("della").params if p.name == "weight"]
    with pytest.raises(ParameterError) as refused:
        weight.validate([0.5, "abc"])
    e = refused.value
    assert (e.parameter, e.agent, e.value, e.reason) == ("weight", 1, "abc", "must be a number")
    assert str(e) == "--weight must be a float, got 'abc'"
    assert in_window_words(e, "weight of tool") == "weight of tool must be a number; it reads 'abc'"
    with pytest.raises(ParameterError) as refused:  # a setting's shape: where in the agent's setting, and why
        weight.validate([0.5, [{"filter": 3, "value": 1}]])
    e = refused.value
    assert (e.parameter, e.agent, e.value) == ("weight", 1, 3)
    assert str(e) == "--weight[1][0].filter: expected text, found 3"
    assert in_window_words(e, "weight of tool") == "weight of tool[0].filter: expected text, found 3"


def test_slerp_with_three_agents_offers_to_keep_one(qtbot, window, demo_models):
    base, agents = demo_models
    load_sources(qtbot, window, base, agents)
    window.method.set_method("slerp")
    problem = window.method.problem
    assert problem.isVisible()
    assert "SLERP merges one agent with the base" in problem.text() and "keep coder only?" in problem.text()
    qtbot.mouseClick(window.merge_button, Qt.LeftButton)  # refused before anything runs, the fix offered
    assert not window.busy() and window.message.action_button.text() == "Keep coder only"
    qtbot.mouseClick(window.method.fix_button, Qt.LeftButton)
    assert window.sources.names == ["coder"]
    assert not problem.isVisible()


def _wider_vocab(agent, folder):
    """A copy of ``agent`` whose embedding and output head have 8 more rows than the base's."""
    shutil.copytree(agent, folder)
    weights = folder / "model.safetensors"
    tensors = load_file(str(weights))
    for name, t in list(tensors.items()):
        if "embed_tokens" in name or "lm_head" in name:
            tensors[name] = torch.cat([t, t[:8]]).contiguous()
    save_file(tensors, str(weights), metadata={"format": "pt"})
    return folder


def test_vocabulary_refusal_offers_the_common_vocabulary(qtbot, window, demo_models, tmp_path):
    base, agents = demo_models
    wide = _wider_vocab(agents[0], tmp_path / "wide")
    load_sources(qtbot, window, base, [wide, agents[1]])
    with qtbot.waitSignal(window.analysis_finished, timeout=30000):
        qtbot.mouseClick(window.analyse_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: window.message.isVisible(), timeout=5000)
    shown = window.message.text.text()
    assert "vocabulary sizes differ" in shown and "--vocab" not in shown and "Vocabulary" in shown
    assert window.message.action_button.text() == "Use common vocabulary"
    qtbot.mouseClick(window.message.action_button, Qt.LeftButton)
    assert window.method.vocab.currentData() == "common"
    log = window.log_view.toPlainText()
    assert log.count("vocabulary sizes differ") == 1  # each error once


def test_a_mergekit_file_opened_as_a_recipe_offers_the_import(qtbot, window, demo_models, tmp_path):
    base, agents = demo_models
    config = tmp_path / "config.yaml"
    config.write_text(
        f"merge_method: ties\nbase_model: {base}\nmodels:\n"
        f"  - model: {agents[0]}\n    parameters: {{weight: 1.0, density: 0.5}}\n"
        f"  - model: {agents[1]}\n    parameters: {{weight: 1.0, density: 0.5}}\ndtype: float32\n"
    )
    assert not window.open_recipe(config)
    shown = window.message.text.text()
    assert not shown.startswith("Error: Error:") and "mergekit" in shown
    assert window.message.action_button.text() == "Import as mergekit YAML"
    qtbot.mouseClick(window.message.action_button, Qt.LeftButton)
    assert window.method.current.name.endswith("ties") and len(window.sources.agents) == 2


def test_a_shape_mismatch_marks_the_agent_rejected(qtbot, window, demo_models, tmp_path):
    base, agents = demo_models
    other = tmp_path / "other"
    shutil.copytree(agents[1], other)
    weights = other / "model.safetensors"
    tensors = load_file(str(weights))
    name = next(n for n in tensors if "mlp" in n and tensors[n].dim() == 2)
    tensors[name] = tensors[name][:-1].contiguous()  # one row fewer: another architecture
    save_file(tensors, str(weights), metadata={"format": "pt"})
    load_sources(qtbot, window, base, [agents[0], other])
    with qtbot.waitSignal(window.analysis_finished, timeout=30000):
        qtbot.mouseClick(window.analyse_button, Qt.LeftButton)
    table = window.sources.table
    assert table.item(2, 6).text() == "✗ rejected" and table.item(1, 6).text() == "✓ ready"
    assert not window.merge_button.isEnabled()  # not offered; the button says which row blocks it
    assert "agent 2 (other)" in window.merge_button.toolTip()
    assert "agent 2 (other) does not fit the base" in window.sources.not_ready("Merge")
