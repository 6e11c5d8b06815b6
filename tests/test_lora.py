"""PEFT LoRA adapters as agents: adapters made with peft's own API on a tiny transformers model merge to the
result of their dense task vectors scale·B·A summed over the rank in a fixed order (float64, rounded once),
computed slice by slice within the chunk, the same bytes for any chunk size and within a float32 rounding of
peft's own ``get_delta_weight``; a wrong base is refused."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy
import torch

from ram_desktop.cli import main
from ram_desktop.core import MergeSpec, RunOptions
from ram_desktop.core.pipeline import merge
from ram_desktop.core.storage.formats import lora
from tests import reference as ref
from tests.conftest import SMALL_CONFIG

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

ADAPTERS = {
    "plain": {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj", "gate_proj"]},
    "rslora": {"r": 2, "lora_alpha": 3, "use_rslora": True, "target_modules": ["q_proj", "o_proj", "embed_tokens"]},
}


def _base_model(folder: Path, config: dict = SMALL_CONFIG, seed: int = 0):
    torch.manual_seed(seed)
    cfg = transformers.Qwen2Config(**{k: v for k, v in config.items() if k not in ("architectures", "torch_dtype")})
    model = transformers.Qwen2ForCausalLM(cfg).to(torch.float32)
    model.save_pretrained(folder)
    return model


def _adapter(base_dir: Path, out: Path, seed: int, **config) -> dict[str, torch.Tensor]:
    """An adapter trained (here: randomly initialised, B ≠ 0) with peft on the saved base; returns peft's own
    dense float32 task vectors (get_delta_weight) by base tensor name."""
    model = transformers.Qwen2ForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    torch.manual_seed(seed)
    peft_model = peft.get_peft_model(model, peft.LoraConfig(init_lora_weights=False, **config))
    with torch.no_grad():  # make B clearly non-zero everywhere
        for name, p in peft_model.named_parameters():
            if "lora_B" in name or "lora_embedding_B" in name:
                p.normal_(0, 0.05)
    peft_model.save_pretrained(out, save_embedding_layers=False)
    deltas = {}
    for name, module in peft_model.named_modules():
        if isinstance(module, peft.tuners.lora.LoraLayer):
            target = name[len("base_model.model.") :] + ".weight"
            deltas[target] = module.get_delta_weight("default").detach().to(torch.float32).clone()
    assert deltas
    return deltas


@pytest.fixture(scope="module")
def lora_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    base_dir = root / "base"
    base_model = _base_model(base_dir)
    deltas = {
        name: _adapter(base_dir, root / name, seed=i + 1, **cfg) for i, (name, cfg) in enumerate(ADAPTERS.items())
    }
    # a dense agent too: sparse updates of the base, saved by transformers
    dense = {k: v.detach().clone() for k, v in base_model.state_dict().items()}
    g = torch.Generator().manual_seed(5)
    for v in dense.values():
        if v.is_floating_point():
            mask = torch.rand(v.shape, generator=g) < 0.3
            v += mask * torch.randn(v.shape, generator=g) * 1e-3
    base_model.load_state_dict(dense)
    base_model.save_pretrained(root / "dense")
    return base_dir, [root / "plain", root / "rslora", root / "dense"], deltas


def _fixed_order_delta(adapter: Path) -> dict[str, np.ndarray]:
    """Each adapted weight's τ from the adapter's files alone: Σ_k B[:, k]·A[k, :] summed k = 0, 1, … in
    float64, times lora_alpha / r (or / √r), rounded once to float32; transposed for embeddings."""
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    r, alpha = cfg["r"], cfg["lora_alpha"]
    scale = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
    weights = safetensors.numpy.load_file(adapter / "adapter_model.safetensors")
    out = {}
    for key, a in weights.items():
        if key.endswith("lora_A.weight"):
            b, embedding = weights[key.replace("lora_A", "lora_B")], False
            module = key[: -len(".lora_A.weight")]
        elif key.endswith("lora_embedding_A"):
            b, embedding = weights[key.replace("lora_embedding_A", "lora_embedding_B")], True
            module = key[: -len(".lora_embedding_A")]
        else:
            continue
        left, right = (a.T, b.T) if embedding else (b, a)  # embeddings: τ = (B·A)ᵀ = Aᵀ·Bᵀ
        acc = np.zeros((left.shape[0], right.shape[1]), np.float64)
        for k in range(left.shape[1]):
            acc += np.outer(left[:, k].astype(np.float64), right[k, :].astype(np.float64))
        out[module.removeprefix("base_model.model.") + ".weight"] = (acc * scale).astype(np.float32)
    return out


def _dense_taus(base: dict, agent_dirs: list[Path]) -> dict[str, list[np.ndarray]]:
    """Per tensor, each agent's float32 task vector: the fixed-order scale·B·A for an adapter (0 where it
    does not adapt), θ − θ_pre for a full model."""
    out = {}
    adapters = {d: _fixed_order_delta(d) for d in agent_dirs if (d / "adapter_config.json").exists()}
    full = {d: ref.load_model(d) for d in agent_dirs if d not in adapters}
    for name, b in base.items():
        bf = b.to(torch.float32).reshape(-1)
        taus = []
        for d in agent_dirs:
            if d in full:
                taus.append((full[d][name].to(torch.float32).reshape(-1) - bf).numpy())
            else:
                delta = adapters[d].get(name)
                taus.append(delta.reshape(-1) if delta is not None else np.zeros(bf.numel(), np.float32))
        out[name] = taus
    return out


def _reference(base: dict, taus: dict, method: str, eps: float = 1e-5, scale: float = 0.3) -> dict:
    result = {}
    for name, b in base.items():
        bn = b.to(torch.float32).numpy().reshape(-1)
        ts = taus[name]
        if method == "task-arithmetic":
            merged = ref.task_arithmetic_tau(ts, scale)
        else:  # ram: unique updates kept, shared ones averaged over the active agents
            masks = [np.abs(t) > np.float32(eps) for t in ts]
            c = np.sum(masks, axis=0)
            total = np.zeros_like(bn)
            for t, m in zip(ts, masks):
                total = total + np.where(m, t, np.float32(0))
            merged = np.where(c == 1, total, np.float32(0))
            merged[c >= 2] = total[c >= 2] / c[c >= 2].astype(np.float32)
        result[name] = torch.from_numpy(bn + merged).reshape(b.shape)
    return result


@pytest.mark.parametrize("method", ["ram", "task-arithmetic"])
def test_adapters_merge_like_their_dense_task_vectors(lora_models, tmp_path, monkeypatch, method):
    base_dir, agent_dirs, _ = lora_models
    sizes = []
    rows = lora.DeltaHandle.rows

    def recording(self, target, start, stop):
        out = rows(self, target, start, stop)
        sizes.append((out.numel(), self.pairs[target].shape))
        return out

    monkeypatch.setattr(lora.DeltaHandle, "rows", recording)
    chunk = 200
    params = {"scale": 0.3} if method == "task-arithmetic" else {}
    merge(
        MergeSpec.build(
            str(base_dir), [str(d) for d in agent_dirs], tmp_path / "out", method, params, out_dtype="float32"
        ),
        options=RunOptions(chunk_elements=chunk),
    )
    ours = ref.load_model(tmp_path / "out")
    base = ref.load_model(base_dir)
    expected = _reference(base, _dense_taus(base, agent_dirs), method)
    assert ours.keys() == expected.keys()
    for name in ours:
        assert torch.equal(ours[name], expected[name]), name
    # τ was computed slice by slice: never more than a chunk's rows (or one row when a row is longer)
    assert sizes and all(n <= max(chunk, shape[1]) for n, shape in sizes)
    assert any(n < shape[0] * shape[1] for n, shape in sizes)  # big weights were cut


def test_adapter_factors_and_scale_follow_peft(lora_models):
    """peft's float32 B·A goes through BLAS, whose summation order depends on the CPU: ours may differ from it
    by float32 rounding only (the rank is at most 4 here, so a few units in the last place of the largest
    product), never by a wrong factor, transpose or scale."""
    _, agent_dirs, deltas = lora_models
    for d in agent_dirs[:2]:
        with lora.open_delta(d / lora.DELTA_FILE) as handle:
            for target, delta in deltas[d.name].items():
                ours = handle.get_tensor(target)
                assert ours.shape == delta.shape and ours.dtype == torch.float32, (d.name, target)
                assert torch.allclose(
                    ours, delta, rtol=0, atol=4 * float(torch.finfo(torch.float32).eps) * float(delta.abs().max())
                ), (d.name, target)
                assert not torch.equal(ours, torch.zeros_like(ours))
    config = json.loads((agent_dirs[1] / "adapter_config.json").read_text())
    assert config["use_rslora"] and "model.embed_tokens.weight" in deltas["rslora"]


def test_lora_merge_is_the_same_bytes_for_any_chunk_size(lora_models, tmp_path):
    base_dir, agent_dirs, _ = lora_models
    outputs = []
    for chunk in (64, 200, 1531, 1 << 24):
        out = tmp_path / f"out-{chunk}"
        merge(
            MergeSpec.build(str(base_dir), [str(d) for d in agent_dirs], out, "ram", {}, out_dtype="float32"),
            options=RunOptions(chunk_elements=chunk),
        )
        outputs.append((out / "model.safetensors").read_bytes())
    assert all(o == outputs[0] for o in outputs[1:])


def test_probe_counts_a_lora_agent(lora_models, capsys):
    base_dir, agent_dirs, _ = lora_models
    assert main(["probe", str(base_dir), *map(str, agent_dirs)]) == 0
    out = capsys.readouterr().out
    assert "plain" in out and "rslora" in out and "dense" in out


def test_adapter_of_another_base_is_refused(lora_models, tmp_path, capsys):
    base_dir, agent_dirs, _ = lora_models
    other = tmp_path / "other-base"
    _base_model(other, dict(SMALL_CONFIG, hidden_size=48, head_dim=24), seed=3)
    wrong_shape = tmp_path / "wide"
    _adapter(other, wrong_shape, seed=4, **ADAPTERS["plain"])
    config = json.loads((wrong_shape / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = str(base_dir)  # the name matches; the shapes do not
    (wrong_shape / "adapter_config.json").write_text(json.dumps(config))
    capsys.readouterr()  # transformers' own output while saving
    assert main(["-q", "merge", str(base_dir), str(wrong_shape), "--out", str(tmp_path / "o1")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "trained on another base" in err[0] and "_proj.weight" in err[0], err

    renamed = tmp_path / "renamed"
    shutil.copytree(agent_dirs[0], renamed)
    config = json.loads((renamed / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = "Qwen/Qwen2.5-7B-Instruct"
    (renamed / "adapter_config.json").write_text(json.dumps(config))
    assert main(["-q", "merge", str(base_dir), str(renamed), "--out", str(tmp_path / "o2")]) == 2
    err = capsys.readouterr().err
    assert "Qwen/Qwen2.5-7B-Instruct" in err and "base_model_name_or_path" in err
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


@pytest.mark.parametrize(
    "change,needle",
    [
        ({"use_dora": True}, "use_dora"),
        ({"peft_type": "IA3"}, "not LoRA"),
    ],
)
def test_unsupported_adapters_are_refused(lora_models, tmp_path, capsys, change, needle):
    base_dir, agent_dirs, _ = lora_models
    bad = tmp_path / "bad"
    shutil.copytree(agent_dirs[0], bad)
    config = json.loads((bad / "adapter_config.json").read_text())
    config.update(change)
    (bad / "adapter_config.json").write_text(json.dumps(config))
    assert main(["-q", "merge", str(base_dir), str(bad), "--out", str(tmp_path / "o")]) == 2
    assert needle in capsys.readouterr().err


def test_adapter_as_base_is_refused(lora_models, tmp_path, capsys):
    _, agent_dirs, _ = lora_models
    assert main(["-q", "merge", str(agent_dirs[0]), str(agent_dirs[2]), "--out", str(tmp_path / "o")]) == 2
    assert "cannot be the base" in capsys.readouterr().err


def test_adapter_from_the_hub(lora_models, tmp_path, monkeypatch):
    """An adapter repository on the Hub (adapter_config.json is downloaded with it) merges like the local folder."""
    from tests.hubcache import FakeHub, sha_of

    base_dir, agent_dirs, _ = lora_models
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    hub = FakeHub(monkeypatch, {"org/base": (base_dir, sha_of("base")), "org/plain": (agent_dirs[0], sha_of("plain"))})
    merge(MergeSpec.build("org/base", ["org/plain"], tmp_path / "hub-out", "ram", out_dtype="float32"))
    assert "adapter_config.json" in hub.downloads
    merge(MergeSpec.build(str(base_dir), [str(agent_dirs[0])], tmp_path / "local-out", "ram", out_dtype="float32"))
    a, b = ref.load_model(tmp_path / "hub-out"), ref.load_model(tmp_path / "local-out")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_editing_the_adapter_config_invalidates_the_cached_probe(lora_models, tmp_path):
    from ram_desktop.core.pipeline import probe

    base_dir, agent_dirs, _ = lora_models
    adapter = tmp_path / "plain"
    shutil.copytree(agent_dirs[0], adapter)
    before = probe(MergeSpec.build(str(base_dir), [str(adapter)])).agents[0].density
    config = json.loads((adapter / "adapter_config.json").read_text())
    config["lora_alpha"] = 1e-9  # τ far below ε almost everywhere
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    after = probe(MergeSpec.build(str(base_dir), [str(adapter)])).agents[0].density
    assert before > 0.01 and after < before / 10
