"""``BASE+ADAPTER`` (mergekit's syntax for a LoRA applied to a model) as an agent on the command line, in a recipe
and in a mergekit YAML: the same bytes as the adapter named as an agent; an adapter that does not fit the base,
a model other than the base, or a missing adapter is refused in one line naming the key, nothing written; and,
where mergekit 0.1.5 is installed, mergekit's own merge of the same YAML (peft's merge_and_unload) agrees within
the float32 rounding of θ = base + B·A."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import yaml

from tests import reference as ref
from tests.conftest import SMALL_CONFIG
from tests.subproc import cli, refused

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

from tests.test_lora import ADAPTERS, _adapter, _base_model


def _mergekit() -> str | None:
    exe = os.environ.get("RAM_MERGEKIT") or str(Path.home() / ".cache/ram-desktop/mergekit-venv/bin/mergekit-yaml")
    return exe if Path(exe).is_file() and os.access(exe, os.X_OK) else None


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("applied")
    base = root / "base"
    base_model = _base_model(base)
    _adapter(base, root / "plain", seed=1, **ADAPTERS["plain"])
    _adapter(base, root / "rslora", seed=2, **ADAPTERS["rslora"])
    dense = {k: v.detach().clone() for k, v in base_model.state_dict().items()}
    g = torch.Generator().manual_seed(7)
    for v in dense.values():
        if v.is_floating_point():
            v += (torch.rand(v.shape, generator=g) < 0.3) * torch.randn(v.shape, generator=g) * 1e-3
    base_model.load_state_dict(dense)
    base_model.save_pretrained(root / "dense")
    return root


def _weights(out: Path) -> bytes:
    return (out / "model.safetensors").read_bytes()


def _ok(done: subprocess.CompletedProcess) -> None:
    assert done.returncode == 0, done.stderr[-3000:]


_COUNT = itertools.count()


def _mergekit_yaml(root: Path, models: list, method: str = "task_arithmetic", **top) -> Path:
    data = {
        "merge_method": method,
        "base_model": str(root / "base"),
        "models": [{"model": m, "parameters": {"weight": w}} for m, w in zip(models, (0.7, 0.4, 0.9))],
        "dtype": "float32",
        **top,
    }
    path = root / f"mk-{next(_COUNT)}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_base_plus_adapter_is_the_adapter_as_an_agent(models, tmp_path):
    """On the command line, in a recipe, and in a mergekit YAML (string and mapping forms): the same bytes as
    the adapter folders named as agents."""
    base, plain, rslora, dense = (str(models / n) for n in ("base", "plain", "rslora", "dense"))
    flags = ["--method", "task-arithmetic", "--scale", "0.5", "--out-dtype", "float32"]
    _ok(cli(tmp_path, "merge", base, plain, rslora, dense, "--out", str(tmp_path / "agents"), *flags))
    _ok(
        cli(
            tmp_path,
            "merge",
            base,
            f"{base}+{plain}",
            f"{base}+{rslora}",
            dense,
            "--out",
            str(tmp_path / "plus"),
            *flags,
        )
    )
    expected = _weights(tmp_path / "agents")
    assert _weights(tmp_path / "plus") == expected
    names = [a["name"] for a in json.loads((tmp_path / "plus" / "merge-report.json").read_text())["agents"]]
    assert names == ["plain", "rslora", "dense"]

    recipe = yaml.safe_load((tmp_path / "plus" / "ram-recipe.yaml").read_text())
    assert [a["source"] for a in recipe["agents"]][:2] == [f"{base}+{plain}", f"{base}+{rslora}"]
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    _ok(cli(tmp_path, "run", str(tmp_path / "recipe.yaml"), "--out", str(tmp_path / "from-recipe")))
    assert _weights(tmp_path / "from-recipe") == expected

    # mergekit's task_arithmetic: one weight per model; the same YAML with adapters as agents is the reference
    for i, as_lora in enumerate(
        (
            [f"{base}+{plain}", f"{base}+{rslora}", dense],
            [{"model": base, "lora": plain}, {"model": {"path": base}, "lora": {"path": rslora}}, dense],
        )
    ):
        _ok(cli(tmp_path, "run", str(_mergekit_yaml(models, as_lora)), "--out", str(tmp_path / f"mk-plus-{i}")))
    _ok(cli(tmp_path, "run", str(_mergekit_yaml(models, [plain, rslora, dense])), "--out", str(tmp_path / "mk-agents")))
    reference = _weights(tmp_path / "mk-agents")
    assert _weights(tmp_path / "mk-plus-0") == reference and _weights(tmp_path / "mk-plus-1") == reference


def test_linear_of_applied_adapters_without_base_model(models, tmp_path):
    """mergekit's linear needs no base_model: the first model's MODEL lays out the merge, every BASE+ADAPTER
    is an input (θ = base + B·A), equal to the adapters named as models."""
    base, plain, rslora = (str(models / n) for n in ("base", "plain", "rslora"))
    outs = []
    for i, listed in enumerate(([f"{base}+{plain}", f"{base}+{rslora}"], [plain, rslora])):
        data = {
            "merge_method": "linear",
            "models": [{"model": m, "parameters": {"weight": w}} for m, w in zip(listed, (0.6, 0.4))],
            "dtype": "float32",
        }
        if i == 1:
            data["base_model"] = base  # the adapters need it to be bound; linear with base_model uses it as an input
            data["models"].insert(0, {"model": base, "parameters": {"weight": 0.0}})
        (tmp_path / f"linear-{i}.yaml").write_text(yaml.safe_dump(data))
        _ok(cli(tmp_path, "run", str(tmp_path / f"linear-{i}.yaml"), "--out", str(tmp_path / f"lin-{i}")))
        outs.append(ref.load_model(tmp_path / f"lin-{i}"))
    theta = {k: v.to(torch.float32) for k, v in ref.load_model(models / "base").items()}
    changed = [k for k in outs[0] if not torch.equal(outs[0][k], theta[k])]
    assert any("q_proj" in k for k in changed) and any("embed_tokens" in k for k in changed)
    assert outs[0].keys() == outs[1].keys() and all(torch.equal(outs[0][k], outs[1][k]) for k in outs[0])


def _wrong_shape(models: Path, tmp_path: Path) -> Path:
    other = tmp_path / "other-base"
    _base_model(other, dict(SMALL_CONFIG, hidden_size=48, head_dim=24), seed=3)
    wide = tmp_path / "wide"
    _adapter(other, wide, seed=4, **ADAPTERS["plain"])
    _set_config(wide, base_model_name_or_path=str(models / "base"))  # the name fits, the shapes do not
    return wide


def _set_config(adapter: Path, **changes) -> None:
    config = json.loads((adapter / "adapter_config.json").read_text())
    config.update(changes)
    (adapter / "adapter_config.json").write_text(json.dumps(config))


def _absent_module(models: Path, tmp_path: Path) -> Path:
    """An adapter whose factors name a module the base does not have."""
    import safetensors.torch

    bad = tmp_path / "absent"
    shutil.copytree(models / "plain", bad)
    tensors = safetensors.torch.load_file(bad / "adapter_model.safetensors")
    tensors = {k.replace("layers.0.self_attn.q_proj", "layers.0.self_attn.z_proj"): v for k, v in tensors.items()}
    safetensors.torch.save_file(tensors, bad / "adapter_model.safetensors", metadata={"format": "pt"})
    return bad


def _renamed(models: Path, tmp_path: Path) -> Path:
    renamed = tmp_path / "renamed"
    shutil.copytree(models / "plain", renamed)
    _set_config(renamed, base_model_name_or_path="Qwen/Qwen2.5-7B-Instruct")
    return renamed


def _rank_mismatch(models: Path, tmp_path: Path) -> Path:
    bad = tmp_path / "rank"
    shutil.copytree(models / "plain", bad)
    _set_config(bad, r=8)
    return bad


BAD = {
    "shape": (_wrong_shape, "trained on another base"),
    "absent module": (_absent_module, "which the base"),
    "another base name": (_renamed, "base_model_name_or_path"),
    "rank": (_rank_mismatch, "config says r = 8"),
    "missing": (lambda models, tmp: tmp / "no-such-adapter", "no such file or folder"),
    "not an adapter": (lambda models, tmp: models / "dense", "is not a LoRA adapter"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_adapters_that_do_not_fit_are_refused_naming_the_key(models, tmp_path, case):
    make, needle = BAD[case]
    adapter = make(models, tmp_path)
    base = str(models / "base")
    source = f"{base}+{adapter}"
    config = _mergekit_yaml(models, [str(models / "dense"), source])
    out = tmp_path / "out"
    refused(cli(tmp_path, "run", str(config), "--out", str(out)), "models[1].model", needle)
    refused(cli(tmp_path, "merge", base, source, "--out", str(out)), source, needle)
    recipe = {"format": "ram-recipe/2", "base": base, "agents": [{"name": "a", "source": source}], "method": "ram"}
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    refused(cli(tmp_path, "run", str(tmp_path / "recipe.yaml"), "--out", str(out)), source, needle)
    assert not out.exists()


def test_a_lora_on_anything_but_the_base_is_refused(models, tmp_path):
    base, plain, dense = (str(models / n) for n in ("base", "plain", "dense"))
    out = tmp_path / "out"
    cases = [
        (_mergekit_yaml(models, [f"{dense}+{plain}"]), "models[0].model", "the merge's base is"),
        (_mergekit_yaml(models, [plain], base_model=f"{base}+{plain}"), "base_model", "applies a LoRA"),
        (_mergekit_yaml(models, [f"{base}+{plain}+{plain}"]), "models[0].model", "one '+'"),
    ]
    for config, key, needle in cases:
        refused(cli(tmp_path, "run", str(config), "--out", str(out)), key, needle)
    refused(cli(tmp_path, "merge", base, f"{dense}+{plain}", "--out", str(out)), "the merge's base is")
    refused(cli(tmp_path, "merge", base, f"{plain}+{plain}", "--out", str(out)), "before '+' name the full model")
    assert not out.exists()


@pytest.mark.skipif(_mergekit() is None, reason="mergekit not installed (set RAM_MERGEKIT=/path/to/mergekit-yaml)")
@pytest.mark.parametrize("method", ["task_arithmetic", "linear"])
def test_mergekit_applies_the_lora_within_a_rounding_of_theta(models, tmp_path, method):
    """mergekit 0.1.5 merges the adapter into its model first (peft merge_and_unload: θ = fl32(base + fl32(B·A)),
    B·A through BLAS), then merges θ; we use τ = scale·B·A summed in a fixed order, never rounded into θ. So the
    results are not bit-identical: each element agrees within 8 float32 ulps of |base| + |ours| + |theirs| (the
    rounding of each θ to float32, summed over the models, and BLAS's order; measured here: at most 4.5)."""
    base, plain, rslora, dense = (str(models / n) for n in ("base", "plain", "rslora", "dense"))
    listed = [f"{base}+{plain}", f"{base}+{rslora}", dense]
    config = _mergekit_yaml(models, listed, method=method)
    if method == "linear":  # mergekit's linear without base_model: every listed model is an input
        data = yaml.safe_load(config.read_text())
        del data["base_model"]
        config.write_text(yaml.safe_dump(data))
    _ok(cli(tmp_path, "run", str(config), "--out", str(tmp_path / "ours")))
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    done = subprocess.run(
        [_mergekit(), str(config), str(tmp_path / "theirs"), "--lora-merge-cache", str(tmp_path / "lora-cache")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ours, theirs = ref.load_model(tmp_path / "ours"), ref.load_model(tmp_path / "theirs")
    base_weights = ref.load_model(models / "base")
    assert ours.keys() == theirs.keys()
    eps = float(torch.finfo(torch.float32).eps)
    differing = 0
    for name in ours:
        a, b = ours[name].to(torch.float32), theirs[name].to(torch.float32)
        scale = base_weights[name].to(torch.float32).abs() + a.abs() + b.abs()
        ulps = ((a - b).abs() / (eps * scale.clamp_min(1e-30))).max().item()
        assert ulps <= 8, (name, ulps)
        differing += int((a != b).sum())
    assert differing > 0  # not bit-identical (θ is rounded in mergekit): if this ever fails, say so in the docs


def test_an_adapter_agent_exports_to_mergekit_as_base_plus_adapter(models, tmp_path):
    base, plain, dense = (str(models / n) for n in ("base", "plain", "dense"))
    recipe = {
        "format": "ram-recipe/2",
        "base": base,
        "agents": [{"name": "plain", "source": plain}, {"name": "dense", "source": dense}],
        "method": "task-arithmetic",
        "parameters": {"scale": 0.5},
    }
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    _ok(cli(tmp_path, "export-mergekit", str(tmp_path / "recipe.yaml"), "--out", str(tmp_path / "mk.yaml")))
    exported = yaml.safe_load((tmp_path / "mk.yaml").read_text())
    assert [m["model"] for m in exported["models"]] == [f"{base}+{plain}", dense]
