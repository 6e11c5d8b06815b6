"""Window → recipe → ``ram-merge run`` → the same bytes, for every method with non-default values typed
into the generated form; and a recipe opened in the window shows every field it holds."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from PySide6.QtCore import QPoint, Qt
from PySide6.QtWidgets import QCheckBox, QComboBox, QLineEdit

from ram_desktop.cli import main as cli_main
from ram_desktop.core.methods import METHODS

from ..conftest import make_models
from .conftest import load_sources, merge

# non-default values a user would type, per parameter name (the widget types come from the schemas)
TYPED = {
    "r": "0.1234",
    "alpha": "1.75",
    "scale": "0.4321",
    "density": "0.2345",
    "drop": "0.375",
    "seed": str(2**63 + 12345),
    "ties_scope": "model",
    "examples": "300",
    "steps": "7",
    "lr": "0.0002",
    # mergekit's methods: a gradient, numbers, the compute dtype
    "t": "[0.1, 0.9, 0.3]",
    "lambda": "0.75",
    "eps": "0.0001",
    "max_iter": "7",
    "tol": "0.0001",
    "select_topk": "0.6",
    "dtype": "float64",
}
# per-agent values typed into each agent's row: a number, a gradient, filters
PER_AGENT_TYPED = {
    "weight": ["0.7", "[0.2, 0.9]", "[{filter: mlp, value: 0.5}, {value: 1.5}]"],
    "density": ["0.6", "[0.5, 0.8]", "0.7"],
    "gamma": ["0.02", "0.05", "0.01"],
    "epsilon": ["0.1", "0.05", "0.2"],
}
AGENTS_OF = {"slerp": 1, "nearswap": 1, "arcee-fusion": 1, "nuslerp": 2}  # methods of a fixed agent count


def weights(folder: Path) -> dict[str, bytes]:
    return {
        p.name: p.read_bytes()
        for p in sorted(folder.iterdir())
        if p.name.endswith(".safetensors") or p.name.endswith(".index.json")
    }


def type_into(qtbot, widget, text: str) -> None:
    """Replace a field's content by typing, as a user does."""
    if isinstance(widget, QComboBox):
        widget.setCurrentIndex(widget.findText(text))
        return
    editor = widget.lineEdit() if not isinstance(widget, QLineEdit) else widget
    editor.selectAll()
    qtbot.keyClicks(editor, text)
    if not isinstance(widget, QLineEdit):
        widget.interpretText()


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return make_models(tmp_path_factory.mktemp("roundtrip"), shards=2)


# a stacking method (passthrough) needs a layer map (slices), which only a recipe or mergekit file gives: the
# window shows and merges it (tests/gui/test_layer_map.py), the CLI runs it (tests/test_slices.py)
@pytest.mark.parametrize("method", [name for name, m in METHODS.items() if not m.streaming.stacks])
def test_window_recipe_cli_give_the_same_bytes(qtbot, window, inputs, tmp_path, method):
    base, agents = inputs
    agents = agents[: AGENTS_OF.get(method, len(agents))]
    load_sources(qtbot, window, base, agents)
    window.method.set_method(method)
    per_agent = {}
    if method == "fisher":  # one Fisher folder per agent, typed into the form's row of each agent
        from ..test_fisher_merge import random_fishers

        folders, _ = random_fishers(agents, tmp_path / "fisher")
        per_agent = {"fisher": [str(f) for f in folders], "suite": None}
    expected = {}

    def keyed(values):  # per-agent values are keyed by agent name, in the form and in the recipe
        return dict(zip(window.sources.names, values)) if isinstance(values, list) else values

    for name, field in window.method.fields.items():
        if field.param.setting and field.param.per_agent:
            texts = PER_AGENT_TYPED[name][: len(agents)]
            for edit, text in zip(field.widget.edits, texts):
                type_into(qtbot, edit, text)
            per_agent[name] = [yaml.safe_load(t) for t in texts]
        if field.param.per_agent:
            assert len(field.widget.edits) == len(agents)
            if not field.param.setting:
                for edit, text in zip(field.widget.edits, per_agent[name] or []):
                    type_into(qtbot, edit, text)
            assert field.value() == keyed(per_agent[name])
            continue
        if isinstance(field.widget, QCheckBox):  # true/false: one click flips the default
            qtbot.waitUntil(field.widget.isVisible)
            qtbot.mouseClick(field.widget, Qt.LeftButton, pos=QPoint(8, field.widget.height() // 2))
            expected[name] = not field.param.default
            assert field.value() is expected[name], name
            continue
        type_into(qtbot, field.widget.edit if field.param.setting else field.widget, TYPED[name])
        expected[name] = yaml.safe_load(TYPED[name]) if field.param.setting or field.param.kind is float else None
        if expected[name] is None:
            assert str(field.value()) == TYPED[name], (name, field.value())
        else:
            assert field.value() == expected[name], (name, field.value())
    window.method.vocab.setCurrentIndex(window.method.vocab.findData("common"))
    window.method.set_out_dtype("float32")
    type_into(qtbot, window.method.eps, "2e-05")
    type_into(qtbot, window.method.shard_size, "40KB")
    out = tmp_path / "window"
    window.method.out_dir.setText(str(out))
    merge(qtbot, window)

    saved = tmp_path / "saved.yaml"
    assert window.save_recipe(saved)
    data = yaml.safe_load(saved.read_text())
    assert data["vocab"] == "common" and data["eps"] == 2e-05 and data["shard_size"] == "40KB"
    for name in window.method.fields:
        if name in per_agent:
            assert data["parameters"][name] == keyed(per_agent[name])
        elif expected.get(name) is not None:
            assert data["parameters"][name] == expected[name], name
        else:
            assert str(data["parameters"][name]) == TYPED[name]
    assert cli_main(["-q", "run", str(saved), "--out", str(tmp_path / "cli")]) == 0
    assert weights(tmp_path / "cli") == weights(out)
    assert len(weights(out)) > 2  # sharded: the shard size reached the engine
    # the recipe the merge wrote into its folder runs to the same bytes too
    assert cli_main(["-q", "run", str(out / "ram-recipe.yaml"), "--out", str(tmp_path / "cli2")]) == 0
    assert weights(tmp_path / "cli2") == weights(out)


def test_open_recipe_shows_every_field(qtbot, window, inputs, tmp_path):
    base, agents = inputs
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "format": "ram-recipe/1",
                "method": "dare-ties",
                "parameters": {"drop": 0.3125, "seed": 2**64 - 1, "scale": 0.8765},
                "eps": 3e-05,
                "base": str(base),
                "agents": [{"name": f"a{i}", "source": str(a)} for i, a in enumerate(agents)],
                "out_dtype": "float16",
                "shard_size": "2GB",
                "device": "cpu",
                "vocab": "common",
                "output": str(tmp_path / "o"),
            }
        )
    )
    assert window.open_recipe(recipe)
    qtbot.waitUntil(lambda: window.sources.all_ready(), timeout=10000)
    session = window.spec()
    assert session.method == "dare-ties"
    assert session.params == {"drop": 0.3125, "seed": 2**64 - 1, "scale": 0.8765}
    assert (session.eps, session.out_dtype, session.shard_size, session.device, session.vocab) == (
        3e-05,
        "float16",
        "2GB",
        "cpu",
        "common",
    )
    assert session.names == ["a0", "a1", "a2"]
    assert isinstance(window.method.fields["seed"].widget, QLineEdit)  # a 64-bit seed does not fit a QSpinBox
    assert window.method.fields["drop"].widget.text() == "0.3125"  # shown as given, not rounded to 3 decimals


@pytest.mark.parametrize(
    "change, fragment",
    [
        ({"parameters": {"r": 99.0}}, "--r must be at most"),
        ({"method": "nope"}, "unknown method"),
        ({"vocab": "sometimes"}, "unknown vocab"),
        ({"out_dtype": "int8"}, "unknown out_dtype"),
    ],
)
def test_a_bad_recipe_changes_nothing_in_the_window(qtbot, window, inputs, tmp_path, change, fragment):
    base, agents = inputs
    load_sources(qtbot, window, base, agents)
    window.method.set_method("ties")
    before = window.spec()
    data = {
        "format": "ram-recipe/1",
        "method": "ram-plus",
        "parameters": {},
        "base": str(base),
        "agents": [str(a) for a in agents],
    }
    data.update(change)
    recipe = tmp_path / "bad.yaml"
    recipe.write_text(yaml.safe_dump(data))
    assert not window.open_recipe(recipe)
    assert fragment in window.message.text.text()
    assert window.spec() == before
