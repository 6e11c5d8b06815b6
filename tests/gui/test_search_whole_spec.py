"""The Search tab starts from the window's whole spec: a recipe with a tokenizer block, a chat template and a
layer map, opened in the window, reaches every trial and Folder/best, which holds what ``ram-merge run`` (a fresh
process) makes of the same recipe with the best trial's method and parameters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from PySide6.QtCore import Qt

pytest.importorskip("transformers")
pytest.importorskip("optuna")

from ..subproc import cli

NAMES = ("coder", "tool", "memory")
SLICES = [
    {"sources": [{"model": m, "layer_range": [0, 3]} for m in range(4)]},
    {"sources": [{"model": m, "layer_range": [2, 3]} for m in range(4)]},
]
TOKENIZER = {"source": "base", "tokens": {"<tool_call>": {"source": {"kind": "zero"}}}}


def _recipe(base: Path, agents: list[Path], method: str, params: dict) -> dict:
    return {
        "format": "ram-recipe/2",
        "method": method,
        "parameters": params,
        "base": str(base),
        "agents": [{"name": n, "source": str(a)} for n, a in zip(NAMES, agents)],
        "out_dtype": "float32",
        "tokenizer": TOKENIZER,
        "chat_template": "chatml",
        "slices": SLICES,
    }


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def test_search_tab_keeps_the_windows_tokenizer_and_layer_map(qtbot, window, demo_models, tmp_path):
    base, agents = demo_models
    demo = Path(base).parent
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(_recipe(base, agents, "task-arithmetic", {"scale": 0.5}), sort_keys=False))
    assert window.open_recipe(recipe), window.message.text.text()
    qtbot.waitUntil(lambda: window.sources.all_ready(), timeout=10000)
    spec = window.spec()
    assert (spec.tokenizer, spec.chat_template, spec.out_dtype) == (TOKENIZER, "chatml", "float32")
    assert [dict(s) for s in spec.slices] == SLICES
    panel = window.search
    window.steps.setCurrentWidget(panel)
    for name, box in panel.checks.items():
        box.setChecked(name in ("task-arithmetic", "ties"))
    panel.trial_count.setValue(2)
    panel.set_validation([demo / "suites" / "validation" / t for t in ("code", "tool", "memory")])
    panel.folder.setText(str(tmp_path / "search"))
    window.evaluate.limit.setValue(6)
    qtbot.waitUntil(lambda: panel.run.start_button.isEnabled(), timeout=30000)  # the recipe's analysis done
    with qtbot.waitSignal(panel.search_finished, timeout=240000) as done:
        qtbot.mouseClick(panel.run.start_button, Qt.LeftButton)
    assert done.args == ["done"], window.message.text.text()
    data = json.loads((tmp_path / "search" / "search.json").read_text())
    best = data["best"]

    reference = tmp_path / "reference.yaml"
    reference.write_text(yaml.safe_dump(_recipe(base, agents, best["method"], best["params"]), sort_keys=False))
    ran = cli(tmp_path, "run", str(reference), "--out", str(tmp_path / "reference"))
    assert ran.returncode == 0, ran.stderr
    got, want = _tensors(tmp_path / "search" / "best"), _tensors(tmp_path / "reference")
    assert sorted(got) == sorted(want)
    for name in got:
        assert got[name].dtype == want[name].dtype and torch.equal(got[name], want[name]), name
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "config.json"):
        assert (tmp_path / "search" / "best" / name).read_bytes() == (tmp_path / "reference" / name).read_bytes()
    assert json.loads((tmp_path / "search" / "best" / "config.json").read_text())["num_hidden_layers"] == 4
    # the Method step's method and value (the recipe's) were the first trial
    assert (data["trials"][0]["method"], data["trials"][0]["params"]) == ("task-arithmetic", {"scale": 0.5})


def test_search_tab_searches_fisher_on_the_method_forms_suites(qtbot, window, demo_models, tmp_path):
    """A Fisher recipe opened in the window: its calibration suites (the Method form's) reach the search, each
    agent's Fisher is estimated once, and Folder/best holds what ``ram-merge run`` makes of the recipe."""
    base, agents = demo_models
    demo = Path(base).parent
    suites = [str(demo / "suites" / t) for t in ("code", "tool", "memory")]
    data = {
        "format": "ram-recipe/2",
        "method": "fisher",
        "parameters": {"scale": 0.5, "examples": 2, "suite": dict(zip(NAMES, suites))},
        "base": str(base),
        "agents": [{"name": n, "source": str(a)} for n, a in zip(NAMES, agents)],
    }
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(data, sort_keys=False))
    assert window.open_recipe(recipe), window.message.text.text()
    qtbot.waitUntil(lambda: window.sources.all_ready(), timeout=10000)
    panel = window.search
    window.steps.setCurrentWidget(panel)
    for name, box in panel.checks.items():
        box.setChecked(name == "fisher")
    panel.trial_count.setValue(1)
    panel.set_validation([demo / "suites" / "validation" / t for t in ("code", "tool", "memory")])
    panel.folder.setText(str(tmp_path / "search"))
    window.evaluate.limit.setValue(6)
    qtbot.waitUntil(lambda: panel.run.start_button.isEnabled(), timeout=30000)
    with qtbot.waitSignal(panel.search_finished, timeout=240000) as done:
        qtbot.mouseClick(panel.run.start_button, Qt.LeftButton)
    assert done.args == ["done"], window.message.text.text()
    (trial,) = json.loads((tmp_path / "search" / "search.json").read_text())["trials"]
    assert trial["method"] == "fisher" and trial["params"]["scale"] == 0.5 and trial["params"]["examples"] == 2
    assert trial["params"]["suite"] == suites
    ran = cli(tmp_path, "run", str(recipe), "--out", str(tmp_path / "reference"))
    assert ran.returncode == 0, ran.stderr
    got, want = _tensors(tmp_path / "search" / "best"), _tensors(tmp_path / "reference")
    assert sorted(got) == sorted(want)
    for name in got:
        assert got[name].dtype == want[name].dtype and torch.equal(got[name], want[name]), name
