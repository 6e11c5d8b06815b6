"""mergekit configurations: run through ``ram-merge run``, refused keys, export, and bit-identity with
mergekit 0.1.5 itself (those tests skip without /work/mergekit-venv, see benchmarks/setup_mergekit.sh)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch
import yaml

from ram_desktop.cli import main
from ram_desktop.core import MergeSpec
from ram_desktop.core.ecosystem.mergekit import from_mergekit
from tests import reference as ref
from tests.conftest import make_models


def _mergekit() -> str | None:
    exe = os.environ.get("RAM_MERGEKIT") or "/work/mergekit-venv/bin/mergekit-yaml"
    return exe if Path(exe).is_file() and os.access(exe, os.X_OK) else None


needs_mergekit = pytest.mark.skipif(
    _mergekit() is None, reason="mergekit not installed (set RAM_MERGEKIT=/path/to/mergekit-yaml)"
)


def _config(method: str, base: Path, agents: list[Path], model_params: dict | None = None, **top) -> dict:
    data = {
        "merge_method": method,
        "base_model": str(base),
        "models": [{"model": str(a), **({"parameters": dict(model_params)} if model_params else {})} for a in agents],
    }
    data.update(top)
    return data


def _write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _run_mergekit(config: Path, out: Path) -> None:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [_mergekit(), str(config), str(out)], capture_output=True, text=True, env=env, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]


def _assert_same_tensors(ours: Path, theirs: Path) -> None:
    a, b = ref.load_model(ours), ref.load_model(theirs)
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype, name
        assert torch.equal(
            a[name].view(torch.uint8) if a[name].dtype != torch.bool else a[name],
            b[name].view(torch.uint8) if b[name].dtype != torch.bool else b[name],
        ), name


# --- import ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "method,top,model_params,expect_method,expect_params",
    [
        ("task_arithmetic", {"parameters": {"lambda": 0.3}}, {"weight": 1.0}, "task-arithmetic", {"scale": 0.3}),
        ("task_arithmetic", {"parameters": {"normalize": True}}, {"weight": 1.0}, "average", {}),
        # mergekit's linear averages the models themselves, the base appended as the last input (methods/linear.py)
        (
            "linear",
            {"parameters": {"weight": 2.0}},
            {"weight": 0.5},
            "linear",
            {"weight": [0.5, 0.5, 2.0], "dtype": "inputs"},
        ),
        # where our paper method differs from mergekit's (TIES's cut, DARE's mask), mergekit's semantics are read
        (
            "ties",
            {"parameters": {"lambda": 0.9}},
            {"weight": 1, "density": 0.3},
            "weighted-ties",
            {"lambda": 0.9, "weight": [1.0, 1.0], "density": [0.3, 0.3], "dtype": "inputs"},
        ),
        (
            "dare_linear",
            {"parameters": {"lambda": 0.5}},
            {"weight": 1.0, "density": 0.7},
            "weighted-dare-linear",
            {"lambda": 0.5, "weight": [1.0, 1.0], "density": [0.7, 0.7], "dtype": "inputs"},
        ),
        (
            "dare_ties",
            {"parameters": {"normalize": True}},
            {"weight": 1.0, "density": 0.9},
            "weighted-dare-ties",
            {"normalize": True, "weight": [1.0, 1.0], "density": [0.9, 0.9], "dtype": "inputs"},
        ),
        ("ram", {"parameters": {"epsilon": 1e-4}}, None, "ram", {}),
        ("ramplus_tl", {"parameters": {"r": 0.2}}, None, "ram-plus", {"r": 0.2, "alpha": 0.2}),
    ],
)
def test_methods_map_to_ours(tmp_path, method, top, model_params, expect_method, expect_params):
    imported = from_mergekit(_config(method, tmp_path / "b", [tmp_path / "x", tmp_path / "y"], model_params, **top))
    assert imported.spec.method == expect_method
    assert imported.spec.engine_params() == expect_params  # per-agent values in the order of the models
    assert imported.spec.base == str(tmp_path / "b")
    # mergekit's linear takes base_model as one more input, appended after the listed models
    assert imported.spec.sources == [str(tmp_path / "x"), str(tmp_path / "y")] + (
        [str(tmp_path / "b")] if method == "linear" else []
    )
    if method == "ram":
        assert imported.spec.eps == 1e-4
    if method == "ramplus_tl":
        assert any("per tensor" in w and "0.2" in w for w in imported.warnings)


def test_dtype_and_out_dtype(tmp_path):
    data = _config("ram", tmp_path / "b", [tmp_path / "x"], dtype="bfloat16")
    imported = from_mergekit(data)
    assert imported.spec.out_dtype == "bfloat16"
    assert any("computes in bfloat16" in w for w in imported.warnings)
    assert from_mergekit(dict(data, dtype="float32", out_dtype="bf16")).spec.out_dtype == "bfloat16"
    assert from_mergekit(_config("ram", tmp_path / "b", [tmp_path / "x"])).spec.out_dtype == "base"


REFUSED = [
    ("slices beside models", {"slices": [{"sources": [{"model": "x", "layer_range": [0, 2]}]}]}, None, "models"),
    ("modules", {"modules": {"text": {"models": [{"model": "x"}]}}}, None, "modules"),
    ("tokenizer_source of another model", {"tokenizer_source": "org/other"}, {"weight": 1.0}, "tokenizer_source"),
    ("tokenizer block key", {"tokenizer": {"source": "base", "merge": True}}, None, "tokenizer.merge"),
    ("unknown chat_template", {"chat_template": "chatml2"}, None, "chat_template"),
    ("unknown top key", {"merge_options": {}}, None, "merge_options"),
    ("gradient of text", {"parameters": {"lambda": ["a", "b"]}}, {"weight": 1.0}, "parameters.lambda"),
    ("filter without value", {"parameters": {"lambda": [{"filter": "mlp"}]}}, {"weight": 1.0}, "parameters.lambda"),
    (
        "filter with an unknown key",
        {},
        {"weight": {"filter": "self_attn", "value": 1.0, "when": 2}},
        "models[0].parameters.weight",
    ),
    ("missing weight", {}, None, "models[0].parameters.weight"),
    ("unknown shared parameter", {"parameters": {"int4": True}}, {"weight": 1.0}, "parameters.int4"),
    ("unknown per-model parameter", {}, {"weight": 1.0, "gamma": 0.1}, "models[0].parameters.gamma"),
    ("shared parameter per model", {}, {"weight": 1.0, "lambda": 0.5}, "models[0].parameters.lambda"),
    ("density in task arithmetic", {}, {"weight": 1.0, "density": 0.5}, "models[0].parameters.density"),
    ("other method", {"merge_method": "frankenmerge"}, None, "merge_method"),
    ("no base", {"base_model": None}, {"weight": 1.0}, "base_model"),
    ("lora reference", {"base_model": "org/base+org/lora"}, {"weight": 1.0}, "base_model"),
]


@pytest.mark.parametrize("what,top,model_params,key", REFUSED, ids=[r[0] for r in REFUSED])
def test_refused_keys_exit_2_naming_the_key(tmp_path, capsys, what, top, model_params, key):
    data = _config("task_arithmetic", tmp_path / "b", [tmp_path / "x", tmp_path / "y"], model_params)
    data.update(top)
    if data.get("base_model") is None:
        del data["base_model"]
    code = main(["-q", "run", str(_write(tmp_path / "mk.yaml", data)), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("error:") and key in err[0], err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "method,top,model_params,key",
    [
        ("ties", {"parameters": {"normalize": [True, False]}}, {"weight": 1.0, "density": 0.5}, "parameters.normalize"),
        ("ties", {"parameters": {"rescale": "sometimes"}}, {"weight": 1.0, "density": 0.5}, "parameters.rescale"),
        (
            "ties",
            {},
            [{"weight": 1.0, "density": 0.5}, {"weight": 1.0, "density": 1.3}],
            "models[1].parameters.density",
        ),
        ("dare_ties", {}, {"weight": 1.0, "density": 0.5, "gamma": 0.1}, "models[0].parameters.gamma"),
        ("ram", {}, {"weight": 1.0}, "models[0].parameters.weight"),
        ("linear", {"parameters": {"normalize": 2}}, {"weight": 1.0}, "parameters.normalize"),
        ("linear", {}, [{"weight": 1.0}, None], "models[1].parameters.weight"),
        ("slerp", {}, None, "models"),
    ],
)
def test_refused_method_switches(tmp_path, capsys, method, top, model_params, key):
    data = _config(method, tmp_path / "b", [tmp_path / "x", tmp_path / "y"], None, **top)
    for i, entry in enumerate(data["models"]):
        entry["parameters"] = model_params[i] if isinstance(model_params, list) else model_params
    code = main(["-q", "run", str(_write(tmp_path / "mk.yaml", data)), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and key in err[0], err
    assert not (tmp_path / "out").exists()


def test_base_listed_among_models_is_refused(tmp_path, capsys):
    data = _config("ram", tmp_path / "b", [tmp_path / "b", tmp_path / "x"])
    code = main(["-q", "run", str(_write(tmp_path / "mk.yaml", data)), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "models[0].model" in err


def test_run_mergekit_config_equals_recipe_merge(models, tmp_path, caplog):
    """A mergekit ramplus_tl config runs our global RAM+ with mergekit's α default and warns about it."""
    base, agents = models
    config = _write(tmp_path / "mk.yaml", _config("ramplus_tl", base, agents, dtype="float32"))
    assert main(["run", str(config), "--out", str(tmp_path / "a")]) == 0
    assert "per tensor" in caplog.text
    recipe = MergeSpec.build(
        str(base), [str(a) for a in agents], method="ram-plus", params={"r": 0.1, "alpha": 0.2}, out_dtype="float32"
    )
    recipe.save(tmp_path / "r.yaml")
    assert main(["-q", "run", str(tmp_path / "r.yaml"), "--out", str(tmp_path / "b")]) == 0
    _assert_same_tensors(tmp_path / "a", tmp_path / "b")
    written = MergeSpec.load(tmp_path / "a" / "ram-recipe.yaml")
    assert written.method == "ram-plus" and written.params["alpha"] == 0.2


# --- export ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "method,params,needle",
    [
        ("ties", {"density": 0.2}, "int(k·n)"),
        ("dare-ta", {"drop": 0.3}, "L1"),
        ("dare-ties", {"drop": 0.3}, "L1"),
        ("ram-plus", {}, "per tensor"),
        ("ram-plus-soft", {}, "no mergekit equivalent"),
        ("average", {}, "normalize: true"),
    ],
)
def test_export_comments_every_difference_and_reimports(tmp_path, capsys, method, params, needle):
    recipe = MergeSpec.build("base", ["a1", "a2"], method=method, params=params, out_dtype="float32")
    recipe.save(tmp_path / "r.yaml")
    assert main(["export-mergekit", str(tmp_path / "r.yaml")]) == 0
    text = capsys.readouterr().out
    assert needle in text and text.startswith("#")
    data = yaml.safe_load(text)
    assert data["models"] == [
        {
            "model": "a1",
            **({"parameters": data["models"][0].get("parameters")} if "parameters" in data["models"][0] else {}),
        },
        {
            "model": "a2",
            **({"parameters": data["models"][1].get("parameters")} if "parameters" in data["models"][1] else {}),
        },
    ]
    if method in ("ties", "average", "ram-plus"):  # exports that read back as the same recipe
        back = from_mergekit(data).spec
        # mergekit's ties file reads back with mergekit's semantics (its int(k·n) cut, methods/weighted.py)
        assert back.method == {"ties": "weighted-ties"}.get(method, method)
        if method == "ties":
            assert [(a.name, a.params["density"]) for a in back.agents] == [("a1", 0.2), ("a2", 0.2)]
    if method == "dare-ta":
        assert data["models"][0]["parameters"]["density"] == 0.7


def test_export_to_file_and_bad_recipe(tmp_path, capsys):
    MergeSpec.build("base", ["a1"], method="task-arithmetic", params={"scale": 0.4}).save(tmp_path / "r.yaml")
    assert main(["export-mergekit", str(tmp_path / "r.yaml"), "--out", str(tmp_path / "mk.yaml")]) == 0
    data = yaml.safe_load((tmp_path / "mk.yaml").read_text())
    assert data["parameters"] == {"lambda": 0.4} and data["merge_method"] == "task_arithmetic"
    (tmp_path / "bad.yaml").write_text("format: ram-recipe/1\nmethod: nope\nbase: b\nagents: [a]\n")
    assert main(["export-mergekit", str(tmp_path / "bad.yaml"), "--out", str(tmp_path / "x.yaml")]) == 2
    assert not (tmp_path / "x.yaml").exists()
    assert main(["export-mergekit", str(tmp_path / "missing.yaml")]) == 2


# --- against mergekit itself -------------------------------------------------------------------------------------


@needs_mergekit
@pytest.mark.parametrize(
    "method,top,model_params,n_agents",
    [
        ("task_arithmetic", {"parameters": {"lambda": 0.3}}, {"weight": 1.0}, 3),
        ("ram", {}, None, 2),
        ("ram", {}, None, 3),
        ("ram", {"parameters": {"epsilon": 1e-3}}, None, 2),
    ],
)
@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16"])
def test_mergekit_file_gives_mergekit_bytes(tmp_path, method, top, model_params, n_agents, out_dtype):
    """The same YAML through ``ram-merge run`` and through ``mergekit-yaml``: identical tensors, bit for bit."""
    agents = {"alpha": 0.5, "beta": 0.55, "gamma": 0.04}
    base, dirs = make_models(tmp_path / "in", agents=dict(list(agents.items())[:n_agents]))
    config = _write(
        tmp_path / "mk.yaml", _config(method, base, dirs, model_params, dtype="float32", out_dtype=out_dtype, **top)
    )
    _run_mergekit(config, tmp_path / "mk")
    assert main(["-q", "run", str(config), "--out", str(tmp_path / "ours")]) == 0
    _assert_same_tensors(tmp_path / "ours", tmp_path / "mk")


@needs_mergekit
def test_exported_ram_recipe_runs_in_mergekit_with_our_bytes(tmp_path):
    base, dirs = make_models(tmp_path / "in", agents={"alpha": 0.5, "beta": 0.55})
    MergeSpec.build(str(base), [str(d) for d in dirs], method="ram", params={}, out_dtype="bfloat16").save(
        tmp_path / "r.yaml"
    )
    assert main(["-q", "export-mergekit", str(tmp_path / "r.yaml"), "--out", str(tmp_path / "mk.yaml")]) == 0
    _run_mergekit(tmp_path / "mk.yaml", tmp_path / "mk")
    assert main(["-q", "run", str(tmp_path / "r.yaml"), "--out", str(tmp_path / "ours")]) == 0
    _assert_same_tensors(tmp_path / "ours", tmp_path / "mk")


# --- slices --------------------------------------------------------------------------------------------------------


def _slices(method: str, *slices: list[tuple[str, int, int]], **top) -> dict:
    return {
        "slices": [{"sources": [{"model": m, "layer_range": [a, b]} for m, a, b in s]} for s in slices],
        "merge_method": method,
        **top,
    }


REFUSED_SLICES = [
    ("unequal lengths", _slices("slerp", [("b", 0, 2), ("x", 0, 3)], base_model="b"), "slices[0].sources"),
    ("models and slices", dict(_slices("slerp", [("b", 0, 2), ("x", 0, 2)]), models=[{"model": "x"}]), "models"),
    (
        "slice key",
        {
            "slices": [{"sources": [{"model": "x", "layer_range": [0, 2]}], "residual_weight": 0.5}],
            "merge_method": "passthrough",
        },
        "slices[0].residual_weight",
    ),
    (
        "source key",
        {"slices": [{"sources": [{"model": "x", "layer_range": [0, 2], "weight": 1}]}], "merge_method": "passthrough"},
        "slices[0].sources[0].weight",
    ),
    ("bad layer_range", _slices("passthrough", [("x", 2, 1)]), "slices[0].sources[0].layer_range"),
    ("passthrough with two sources", _slices("passthrough", [("x", 0, 2), ("y", 0, 2)]), "slices[0].sources"),
    ("passthrough without slices", {"merge_method": "passthrough", "models": [{"model": "x"}]}, "merge_method"),
    ("passthrough parameter", _slices("passthrough", [("x", 0, 2)], parameters={"t": 0.5}), "parameters.t"),
    (
        "other models per slice",
        _slices(
            "ties",
            [("b", 0, 2), ("x", 0, 2)],
            [("b", 2, 4), ("y", 2, 4)],
            base_model="b",
            parameters={"weight": 1.0, "density": 0.5},
        ),
        "slices[1].sources",
    ),
    ("base not a source", _slices("slerp", [("x", 0, 2), ("y", 0, 2)], base_model="b"), "slices[0]"),
    ("model twice", _slices("linear", [("x", 0, 2), ("x", 2, 4)], parameters={"weight": 1.0}), "slices[0].sources"),
    ("paper method", _slices("ram", [("b", 0, 2), ("x", 0, 2)], base_model="b"), "slices"),
    ("modules", {"modules": {"text": {"slices": []}}, "merge_method": "slerp"}, "modules"),
]


@pytest.mark.parametrize("what,data,key", REFUSED_SLICES, ids=[r[0] for r in REFUSED_SLICES])
def test_refused_slices_exit_2_naming_the_key(tmp_path, capsys, what, data, key):
    code = main(["-q", "run", str(_write(tmp_path / "mk.yaml", data)), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("error:") and key in err[0], err
    assert not (tmp_path / "out").exists()


def test_sliced_source_of_another_architecture_is_refused(tmp_path, capsys):
    from tests.conftest import SMALL_CONFIG

    base, _ = make_models(tmp_path / "a", agents={"x": 0.5})
    _, other = make_models(tmp_path / "b", agents={"wide": 0.5}, config=dict(SMALL_CONFIG, intermediate_size=64))
    for stacking in (False, True):
        data = (
            _slices("passthrough", [(str(base), 0, 2)], [(str(other[0]), 0, 2)])
            if stacking
            else _slices("slerp", [(str(base), 0, 2), (str(other[0]), 0, 2)], base_model=str(base))
        )
        code = main(["-q", "run", str(_write(tmp_path / "mk.yaml", data)), "--out", str(tmp_path / "out")])
        err = capsys.readouterr().err
        assert code == 2 and "mlp" in err and "do not share an architecture" in err, err
        assert not (tmp_path / "out").exists()


def test_sliced_config_reads_as_a_layer_map(tmp_path):
    """Two slices of a slerp: the recipe's layer map names each model's range, the second slice's own t."""
    data = _slices(
        "slerp", [("b", 0, 2), ("x", 0, 2)], [("b", 2, 4), ("x", 2, 4)], base_model="b", parameters={"t": 0.5}
    )
    data["slices"][1]["parameters"] = {"t": [0.1, 0.9]}
    recipe = from_mergekit(data).spec
    assert (recipe.method, recipe.base, recipe.sources) == ("slerp", "b", ["x"])
    assert recipe.params["t"] == 0.5
    assert list(recipe.slices) == [
        {"sources": [{"model": 0, "layer_range": [0, 2]}, {"model": 1, "layer_range": [0, 2]}]},
        {
            "sources": [{"model": 0, "layer_range": [2, 4]}, {"model": 1, "layer_range": [2, 4]}],
            "parameters": {"t": [0.1, 0.9], "dtype": "inputs"},
        },
    ]
