"""Bad input refused in one line before any work, each through a fresh ``ram-merge`` process: LoRA adapter
configs checked field by field, parameters mergekit requires that some tensor would get no value for, and
every option of ``compare`` and ``eval`` checked before the first merge or model load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors import safe_open
from safetensors.torch import save_file

from .conftest import make_models, tree_snapshot
from .subproc import cli, refused

TARGET = "model.layers.0.self_attn.q_proj"


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[Path, list[Path]]:
    return make_models(tmp_path_factory.mktemp("early") / "in")


def _adapter(folder: Path, base: Path, **config) -> Path:
    """A LoRA adapter of rank 2 on one projection of ``base``, written the way peft saves one."""
    with safe_open(str(base / "model.safetensors"), "pt") as f:
        rows, cols = f.get_slice(TARGET + ".weight").get_shape()
    g = torch.Generator().manual_seed(3)
    folder.mkdir(parents=True)
    save_file(
        {
            f"base_model.model.{TARGET}.lora_A.weight": torch.randn(2, cols, generator=g) * 0.01,
            f"base_model.model.{TARGET}.lora_B.weight": torch.randn(rows, 2, generator=g) * 0.01,
        },
        str(folder / "adapter_model.safetensors"),
    )
    settings = {
        "peft_type": "LORA",
        "r": 2,
        "lora_alpha": 4,
        "base_model_name_or_path": str(base),
        "target_modules": ["q_proj"],
        "use_rslora": False,
        "fan_in_fan_out": False,
    }
    settings.update(config)
    (folder / "adapter_config.json").write_text(json.dumps(settings))
    return folder


def test_a_valid_adapter_merges(tmp_path, models):
    base, agents = models
    adapter = _adapter(tmp_path / "adapter", base)
    done = cli(tmp_path, "merge", str(base), str(agents[0]), str(adapter), "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    "change,key",
    [
        ({"r": 0}, "r"),
        ({"r": "four"}, "r"),
        ({"r": 2.5}, "r"),
        ({"lora_alpha": "sixteen"}, "lora_alpha"),
        ({"lora_alpha": None}, "lora_alpha"),
        ({"use_rslora": "yes"}, "use_rslora"),
        ({"rank_pattern": {"q_proj(": 2}}, "rank_pattern"),
        ({"rank_pattern": {"q_proj": 0}}, "rank_pattern"),
        ({"rank_pattern": ["q_proj"]}, "rank_pattern"),
        ({"alpha_pattern": {"q_proj": "eight"}}, "alpha_pattern"),
        ({"alpha_pattern": {"[q": 8}}, "alpha_pattern"),
    ],
)
def test_bad_adapter_configs_are_one_line_naming_the_adapter_and_the_key(tmp_path, models, change, key):
    base, agents = models
    adapter = _adapter(tmp_path / "bad-adapter", base, **change)
    out = tmp_path / "out"
    line = refused(
        cli(tmp_path, "merge", str(base), str(agents[0]), str(adapter), "--out", str(out)),
        "bad-adapter",
        "adapter_config.json",
        key,
    )
    assert not out.exists()
    assert line


def _mergekit(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "mk.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


NOWHERE = [{"filter": "no_tensor_is_named_this", "value": 0.5}]


def test_slerp_t_that_filters_give_no_tensor_is_refused_as_mergekit_does(tmp_path, models):
    base, agents = models
    config = _mergekit(
        tmp_path,
        {
            "merge_method": "slerp",
            "base_model": str(base),
            "models": [{"model": str(base)}, {"model": str(agents[0])}],
            "parameters": {"t": NOWHERE},
        },
    )
    out = tmp_path / "out"
    refused(cli(tmp_path, "run", str(config), "--out", str(out)), "parameter t", "no value")
    assert not out.exists()
    # with an entry without a filter every tensor has a value: merged
    config = _mergekit(
        tmp_path,
        {
            "merge_method": "slerp",
            "base_model": str(base),
            "models": [{"model": str(base)}, {"model": str(agents[0])}],
            "parameters": {"t": [*NOWHERE, {"value": 0.3}]},
        },
    )
    done = cli(tmp_path, "run", str(config), "--out", str(out))
    assert done.returncode == 0, done.stderr


def test_linear_weight_that_filters_give_no_tensor_is_refused_as_mergekit_does(tmp_path, models):
    base, agents = models
    config = _mergekit(
        tmp_path,
        {
            "merge_method": "linear",
            "base_model": str(base),
            "models": [
                {"model": str(agents[0]), "parameters": {"weight": NOWHERE}},
                {"model": str(agents[1]), "parameters": {"weight": 1.0}},
            ],
            "parameters": {"weight": 1.0},
        },
    )
    out = tmp_path / "out"
    # the shared weight is each model's fallback, as in mergekit: no refusal
    done = cli(tmp_path, "run", str(config), "--out", str(out))
    assert done.returncode == 0, done.stderr
    config = _mergekit(
        tmp_path,
        {
            "merge_method": "linear",
            "models": [
                {"model": str(agents[0]), "parameters": {"weight": NOWHERE}},
                {"model": str(agents[1]), "parameters": {"weight": 1.0}},
            ],
        },
    )
    out = tmp_path / "out2"
    refused(cli(tmp_path, "run", str(config), "--out", str(out)), "parameter weight", "no value")
    assert not out.exists()


@pytest.fixture
def suite(tmp_path) -> Path:
    path = tmp_path / "suite.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"say {w}", "answer": w}) + "\n" for w in ("a", "b")))
    return path


@pytest.mark.parametrize("option", [["--limit", "0"], ["--batch-size", "0"], ["--limit", "-3"]])
def test_compare_checks_every_option_before_the_first_merge(tmp_path, models, suite, option):
    base, agents = models
    out = tmp_path / "cmp"
    before = tree_snapshot(tmp_path)
    refused(
        cli(
            tmp_path,
            "compare",
            str(base),
            *map(str, agents),
            "--out",
            str(out),
            "--variant",
            "ram",
            "--suite",
            str(suite),
            "--device",
            "cpu",
            *option,
        ),
        option[0],
    )
    assert not out.exists()
    assert tree_snapshot(tmp_path) == before


@pytest.mark.parametrize("option", [["--limit", "0"], ["--batch-size", "0"]])
def test_eval_checks_every_option_before_loading_a_model(tmp_path, models, suite, option):
    base, _ = models
    refused(cli(tmp_path, "eval", str(base), "--suite", str(suite), "--device", "cpu", *option), option[0])


def test_a_mergekit_file_listing_one_model_ten_thousand_times_is_refused_at_once(tmp_path, models):
    """Issue 48's hidden fault: the names of 10,000 copies were made unique in cubic time (over 5 minutes, no
    output). The agent count is checked first, and names are derived in linear time."""
    _, agents = models
    entries = "".join(f"  - model: {agents[0]}\n    parameters: {{weight: 1.0}}\n" for _ in range(10_000))
    config = tmp_path / "many.yaml"
    config.write_text(f"merge_method: linear\ndtype: float32\nmodels:\n{entries}")
    done = cli(tmp_path, "run", str(config), "--out", str(tmp_path / "out"), timeout=60)
    refused(done, "10000 agents", "at most 256")
    assert not (tmp_path / "out").exists()


def test_derived_names_of_many_copies_stay_unique_and_in_order():
    from ram_desktop.core.spec import derive_names

    names = derive_names(["a/coder", "b/coder", "c/tool", "coder-2/x", "d/coder"] + ["e/coder"] * 3000)
    assert names[:5] == ["coder", "coder-2", "tool", "x", "coder-3"]
    assert len(set(names)) == len(names) and names[-1] == "coder-3003"


def test_a_mergekit_file_listing_one_model_many_times_opens_it_once(tmp_path, models, monkeypatch):
    """A model listed 200 times (and the base listed as a model too) is opened once; linear of 200 copies of one
    bf16 model in float32 is that model exactly (every partial sum k·x of an 8-bit mantissa is exact)."""
    from safetensors.torch import load_file

    from ram_desktop import workflow
    from ram_desktop.core import load_recipe_or_mergekit, pipeline

    base, agents = models
    entries = "".join(f"  - model: {agents[0]}\n    parameters: {{weight: 1.0}}\n" for _ in range(200))
    entries += f"  - model: {base}\n    parameters: {{weight: 0.0}}\n"
    config = tmp_path / "many.yaml"
    config.write_text(f"merge_method: linear\ndtype: float32\nbase_model: {base}\nmodels:\n{entries}")
    opened: list[str] = []
    real_open = pipeline.open_checkpoint

    def counting_open(source, *args, **kwargs):
        opened.append(str(source))
        return real_open(source, *args, **kwargs)

    monkeypatch.setattr(pipeline, "open_checkpoint", counting_open)
    spec = load_recipe_or_mergekit(config).spec
    spec = spec.replace(output=str(tmp_path / "out"))
    workflow.merge(spec)
    assert sorted(opened) == sorted([str(base), str(agents[0])])
    merged = load_file(str(tmp_path / "out" / "model.safetensors"))
    agent = load_file(str(agents[0] / "model.safetensors"))
    assert merged.keys() == agent.keys()
    for name, value in agent.items():
        assert torch.equal(merged[name], value.float()), name
