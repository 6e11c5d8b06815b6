"""The window's Tokenizer box (beside Vocabulary): a recipe's tokenizer block and chat template are shown and
kept, a choice made in the box reaches the spec, and the default copies the base's files as before."""

from __future__ import annotations

import yaml

from .conftest import load_sources


def test_tokenizer_box_shows_keeps_and_changes_the_choice(qtbot, window, synthetic_models, tmp_path):
    base, agents = synthetic_models
    load_sources(qtbot, window, base, agents)
    assert window.spec().tokenizer is None and window.spec().chat_template is None  # the default: copy

    box = window.method.tokenizer
    box.setCurrentIndex(box.findData("union"))
    assert window.spec().tokenizer == {"source": "union"}

    block = {"source": "model:a0", "tokens": {"<t>": {"source": {"kind": "zero"}}}, "pad_to_multiple_of": 8}
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "format": "ram-recipe/2",
                "method": "ram-plus",
                "base": str(base),
                "agents": [{"name": f"a{i}", "source": str(a)} for i, a in enumerate(agents)],
                "tokenizer": block,
                "chat_template": "chatml",
            }
        )
    )
    assert window.open_recipe(recipe)
    qtbot.waitUntil(lambda: window.sources.all_ready(), timeout=10000)
    assert box.currentData() == "model:a0"
    assert window.spec().tokenizer == block and window.spec().chat_template == "chatml"
    saved = tmp_path / "saved.yaml"
    assert window.save_recipe(saved)
    data = yaml.safe_load(saved.read_text())
    assert data["tokenizer"] == block and data["chat_template"] == "chatml"

    box.setCurrentIndex(box.findData(None))
    assert window.spec().tokenizer is None
