"""Layer maps (recipe ``slices``): layer stacking with passthrough against a plain reference (output layer i is
the named model's layer j), the stacked model loading in transformers, the recipe key and its checks."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import yaml

from ram_desktop.cli import main
from ram_desktop.core import MergeSpec, thaw
from ram_desktop.core.errors import InputError
from tests import reference as ref
from tests.conftest import SMALL_CONFIG, make_models

CONFIG = dict(SMALL_CONFIG, num_hidden_layers=5, layer_types=["full_attention"] * 5)


def _two(tmp_path: Path) -> tuple[Path, Path]:
    base, agents = make_models(tmp_path / "in", agents={"alpha": 0.5}, config=CONFIG, shards=2)
    return base, agents[0]


def _stack_recipe(a: Path, b: Path, params: dict | None = None) -> MergeSpec:
    # A's layers 0..2, then B's layers 1..4 (overlapping 1..2): seven layers
    return MergeSpec.build(
        str(a),
        [str(a), str(b)],
        method="passthrough",
        params=params or {},
        slices=[{"sources": [{"model": 1, "layer_range": [0, 3]}]}, {"sources": [{"model": 2, "layer_range": [1, 5]}]}],
    )


def _expected_source(name: str, a: dict, b: dict) -> torch.Tensor:
    """The plain layer map: output layer i < 3 is A's layer i, else B's layer i − 2; the embeddings are A's (first
    slice), the final norm and head B's (last slice)."""
    parts = name.split(".")
    if "layers" in parts:
        k = parts.index("layers")
        i = int(parts[k + 1])
        model, j = (a, i) if i < 3 else (b, i - 2)
        return model[".".join([*parts[: k + 1], str(j), *parts[k + 2 :]])]
    return a[name] if "embed_tokens" in name else b[name]


def test_stacked_layers_are_the_named_source_layers(tmp_path):
    a, b = _two(tmp_path)
    _stack_recipe(a, b).save(tmp_path / "r.yaml")
    assert main(["-q", "run", str(tmp_path / "r.yaml"), "--out", str(tmp_path / "out")]) == 0
    out, ta, tb = ref.load_model(tmp_path / "out"), ref.load_model(a), ref.load_model(b)
    assert len({n.split(".")[2] for n in out if ".layers." in n}) == 7
    assert len(out) == len(ta) + 2 * (len(ta) - 3) // 5  # 3 tensors outside the layers, 2 more layers' worth
    for name, tensor in out.items():
        expected = _expected_source(name, ta, tb)
        assert tensor.dtype == expected.dtype and torch.equal(tensor, expected), name
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["num_hidden_layers"] == 7 and len(config["layer_types"]) == 7


def test_stacked_scale_multiplies_in_the_compute_dtype(tmp_path):
    a, b = _two(tmp_path)
    _stack_recipe(a, b, {"scale": [None, 0.3]}).save(tmp_path / "r.yaml")
    assert main(["-q", "run", str(tmp_path / "r.yaml"), "--out", str(tmp_path / "out")]) == 0
    out, ta, tb = ref.load_model(tmp_path / "out"), ref.load_model(a), ref.load_model(b)
    for name, tensor in out.items():
        source = _expected_source(name, ta, tb)
        from_b = any(source is v for v in tb.values())
        expected = (source.to(torch.float32) * 0.3).to(torch.bfloat16) if from_b else source
        assert torch.equal(tensor, expected), name


def test_stacked_model_loads_and_runs_in_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    a, b = _two(tmp_path)
    _stack_recipe(a, b).save(tmp_path / "r.yaml")
    assert main(["-q", "run", str(tmp_path / "r.yaml"), "--out", str(tmp_path / "out")]) == 0
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32)
    assert model.config.num_hidden_layers == 7 and len(model.model.layers) == 7
    with torch.no_grad():
        logits = model(torch.tensor([[1, 5, 9, 3]])).logits
    assert logits.shape == (1, 4, CONFIG["vocab_size"]) and torch.isfinite(logits).all()


def test_recipe_without_slices_is_written_as_before():
    text = MergeSpec.build("b", ["x"], method="ram").to_yaml()
    assert "slices" not in text
    assert MergeSpec.from_dict(yaml.safe_load(text)).slices is None


def test_recipe_slices_round_trip():
    recipe = _stack_recipe(Path("a"), Path("b"), {"scale": [None, 0.5]})
    again = MergeSpec.from_dict(yaml.safe_load(recipe.to_yaml()))
    assert again.slices == recipe.slices and again.layout() == recipe.layout() and again.layout().stacking


@pytest.mark.parametrize(
    "slices,key",
    [
        ([{"sources": [{"model": 3, "layer_range": [0, 2]}]}], "slices[0].sources[0].model"),
        ([{"sources": [{"model": 1, "layer_range": [2, 2]}]}], "slices[0].sources[0].layer_range"),
        ([{"sources": [{"model": 1, "layer_range": [0, 2], "scale": 2}]}], "slices[0].sources[0].scale"),
        ([{"sources": [{"model": 0, "layer_range": [0, 2]}, {"model": 1, "layer_range": [0, 3]}]}], "unequal length"),
        (
            [
                {"sources": [{"model": 0, "layer_range": [0, 2]}, {"model": 1, "layer_range": [0, 2]}]},
                {"sources": [{"model": 1, "layer_range": [0, 2]}]},
            ],
            "one kind",
        ),
        ([{"sources": [{"model": 1, "layer_range": [0, 2]}], "parameters": {"density": 0.5}}], "slices[0]: parameters"),
    ],
)
def test_recipe_slices_refused_naming_the_key(slices, key):
    data = {"format": "ram-recipe/1", "method": "passthrough", "base": "b", "agents": ["x", "y"], "slices": slices}
    with pytest.raises(InputError, match=re.escape(key)):
        MergeSpec.from_dict(data)


def test_layer_range_beyond_the_model_is_refused(tmp_path, capsys):
    a, b = _two(tmp_path)
    recipe = _stack_recipe(a, b)
    slices = thaw(recipe.slices)
    slices[1]["sources"][0]["layer_range"] = [3, 6]
    recipe.replace(slices=tuple(slices)).save(tmp_path / "r.yaml")
    assert main(["-q", "run", str(tmp_path / "r.yaml"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "slices[1].sources[0].layer_range" in err and "5 layers" in err
    assert not (tmp_path / "out").exists()


def test_stacking_needs_passthrough_and_passthrough_needs_slices(tmp_path, capsys):
    a, b = _two(tmp_path)
    recipe = _stack_recipe(a, b).replace(method="linear")
    recipe.save(tmp_path / "r.yaml")
    assert main(["-q", "run", str(tmp_path / "r.yaml"), "--out", str(tmp_path / "out")]) == 2
    assert "use passthrough" in capsys.readouterr().err
    MergeSpec.build(str(a), [str(b)], method="passthrough").save(tmp_path / "p.yaml")
    assert main(["-q", "run", str(tmp_path / "p.yaml"), "--out", str(tmp_path / "out")]) == 2
    assert "slices" in capsys.readouterr().err
