"""The built-in demo: a real base, three RL-trained agents and their test suites (SPEC.md section 9)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
import yaml

from ram_desktop.cli import main

from .reference import load_model

AGENT_TASKS = {"coder": "code", "tool": "tool", "memory": "memory"}


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("demo") / "d"
    assert main(["demo", str(folder)]) == 0
    return folder


def test_demo_command_writes_base_agents_suites_and_manifest(demo, capsys):
    manifest = json.loads((demo / "demo.json").read_text())
    assert manifest["base"] == "base"
    assert [a["name"] for a in manifest["agents"]] == list(AGENT_TASKS)
    for entry in [{"path": manifest["base"]}, *manifest["agents"]]:
        assert not Path(entry["path"]).is_absolute()
        folder = demo / entry["path"]
        assert json.loads((folder / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"]
        assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()
    for agent in manifest["agents"]:
        suite = demo / agent["suite"]
        assert not Path(agent["suite"]).is_absolute() and agent["suite"].startswith("suites/")
        spec = yaml.safe_load((suite / "suite.yaml").read_text())
        kind, file, _function = spec["scorer"].split(":")
        assert kind == "python" and (suite / file).is_file()
        rows = [json.loads(line) for line in (suite / "data.jsonl").read_text().splitlines()]
        assert len(rows) >= 100 and all(isinstance(r["prompt"], str) and "answer" in r for r in rows)
        assert spec["max_new_tokens"] > max(len(str(r["answer"])) for r in rows)  # one token per character


def test_demo_command_prints_where_everything_went(tmp_path, capsys):
    assert main(["demo", str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out
    assert "demo base" in out and out.count("demo agent") == 3 and "suites" in out


def test_demo_agents_are_sparse_bf16_updates_of_the_base(demo):
    base = load_model(demo / "base")
    agents = {name: load_model(demo / name) for name in AGENT_TASKS}
    total = sum(t.numel() for t in base.values())
    updated, shares = {}, {}
    for name, tensors in agents.items():
        assert set(tensors) == set(base)
        assert all(t.dtype == torch.bfloat16 for t in tensors.values())
        updated[name] = {k: tensors[k] != base[k] for k in base}
    for name in AGENT_TASKS:
        density = sum(int(m.sum()) for m in updated[name].values()) / total
        unique = sum(
            int((updated[name][k] & ~torch.stack([updated[o][k] for o in AGENT_TASKS if o != name]).any(0)).sum())
            for k in base
        )
        assert 0.005 < density < 0.6, (name, density)  # sparse, as RL checkpoints in bf16 are
        shares[name] = unique / (density * total)
    # the coder (MLP of layers 1-2) and memory (attention + MLP of layer 0) agents each have a region of
    # their own; the tool agent's tensors (attention + MLP of layer 2) are all trained by another agent
    # too, so its update is nearly all shared (reproduction/README.md: rho ~ 100)
    assert shares["coder"] > 0.3 and shares["memory"] > 0.3, shares
    assert 0.0 < shares["tool"] < 0.05, shares


def _score(model_dir: Path, suite: Path, limit: int) -> float:
    """Mean reward of greedy completions, scored by the suite's own reward function."""
    transformers = pytest.importorskip("transformers")
    spec = yaml.safe_load((suite / "suite.yaml").read_text())
    _, file, function = spec["scorer"].split(":")
    loader = importlib.util.spec_from_file_location("demo_reward", suite / file)
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    rows = [json.loads(line) for line in (suite / "data.jsonl").read_text().splitlines()][:limit]
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    tokenizer.padding_side = "left"
    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    prompts = [r["prompt"] for r in rows]
    batch = tokenizer(prompts, return_tensors="pt", padding=True)
    with torch.no_grad():
        ids = model.generate(
            **batch,
            max_new_tokens=spec["max_new_tokens"],
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    completions = tokenizer.batch_decode(ids[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    rewards = getattr(module, function)(prompts, completions, answer=[r["answer"] for r in rows])
    return sum(rewards) / len(rewards)


def test_demo_agents_against_the_base_on_their_own_suites(demo):
    """What the shipped seed-0 agents measurably do (reproduction/README.md): each gains clearly on its
    own task (+4.6, +4.7 and +4.0 reward points on 300 examples, each more than twice its paired
    standard error)."""
    manifest = json.loads((demo / "demo.json").read_text())
    gains = {}
    for agent in manifest["agents"]:
        suite = demo / agent["suite"]
        base_score = _score(demo / manifest["base"], suite, 300)
        gains[agent["name"]] = _score(demo / agent["path"], suite, 300) - base_score
    assert all(g >= 0.03 for g in gains.values()), gains


def test_demo_tokenizer_loads_with_its_spaces(demo):
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(demo / "base"))
    text = "tool: look up rome cats >search(rome cats)"
    ids = tokenizer(text)["input_ids"]
    assert len(ids) == len(text)  # one token per character, spaces included
    assert tokenizer.decode(ids) == text


def test_merged_demo_loads_and_runs_in_transformers(demo, tmp_path):
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "merged"
    agents = [str(demo / name) for name in AGENT_TASKS]
    assert main(["-q", "merge", str(demo / "base"), *agents, "--out", str(out)]) == 0
    model = transformers.AutoModelForCausalLM.from_pretrained(str(out))
    merged = load_model(out)
    assert torch.equal(
        model.state_dict()["model.layers.0.mlp.up_proj.weight"], merged["model.layers.0.mlp.up_proj.weight"]
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
    ids = tokenizer("memory: a=12 b=34 ? b =", return_tensors="pt")
    with torch.no_grad():
        logits = model(**ids).logits
    assert logits.shape[-1] == model.config.vocab_size and torch.isfinite(logits).all()


def test_demo_without_its_files_is_an_error_and_writes_nothing(tmp_path, monkeypatch, capsys):
    import ram_desktop.core.demo as demo_module

    monkeypatch.setattr(demo_module, "demo_resources", lambda: tmp_path / "missing")
    assert main(["demo", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "demo" in err[0]
    assert not (tmp_path / "d").exists()
