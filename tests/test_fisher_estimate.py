"""The Fisher estimator on a tiny transformers model, against a direct per-example computation written
here (own greedy loop, autograd on each example, squared, averaged); files, cache, cancel, bad inputs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from ram_desktop.cli import main
from ram_desktop.core.errors import Cancelled
from ram_desktop.core.events import Reporter
from ram_desktop.evaluate import fisher as fisher_module

from .conftest import tree_snapshot
from .tinylm import write_tiny_lm

PROMPTS = ["What is 2 + 3?", "Say hello to the world", "def add(a, b):", "Remember the number 42"]
MAX_NEW = 6


@pytest.fixture(scope="module")
def lm(tmp_path_factory) -> Path:
    return write_tiny_lm(tmp_path_factory.mktemp("lm") / "agent", chat_template=False, seed=3, hidden=32)


def write_suite(folder: Path, prompts: list[str] = PROMPTS, max_new: int = MAX_NEW) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "data.jsonl").write_text("".join(json.dumps({"prompt": p, "answer": "x"}) + "\n" for p in prompts))
    (folder / "suite.yaml").write_text(f"name: calib\nmax_new_tokens: {max_new}\nchat_template: false\n")
    return folder


def direct_fisher(folder: Path, prompts: list[str], max_new: int) -> dict[str, torch.Tensor]:
    """(1/n) Σ_i (∇ log p(ŷ_i | x_i))², ŷ_i the greedy completion, one autograd call per example."""
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    eos = model.config.eos_token_id
    names = [n for n, _ in model.named_parameters()]
    params = [p for _, p in model.named_parameters()]
    total = [torch.zeros_like(p) for p in params]
    for prompt in prompts:
        ids = tokenizer(prompt)["input_ids"]
        seq = list(ids)
        with torch.no_grad():
            for _ in range(max_new):
                nxt = int(model(input_ids=torch.tensor([seq])).logits[0, -1].argmax())
                seq.append(nxt)
                if nxt == eos:
                    break
        logits = model(input_ids=torch.tensor([seq])).logits[0]
        log_probs = torch.log_softmax(logits, dim=-1)
        ll = sum(log_probs[k - 1, seq[k]] for k in range(len(ids), len(seq)))
        grads = torch.autograd.grad(ll, params)
        for acc, g in zip(total, grads):
            acc += g * g
    return {n: acc / len(prompts) for n, acc in zip(names, total)}


def test_estimate_equals_direct_per_example_computation(tmp_path, lm, capsys):
    suite = write_suite(tmp_path / "suite")
    out = tmp_path / "F"
    assert main(["-q", "fisher", str(lm), "--suite", str(suite), "--out", str(out), "--device", "cpu"]) == 0
    got = load_file(str(out / "fisher.safetensors"))
    want = direct_fisher(lm, PROMPTS, MAX_NEW)
    with safe_open(str(lm / "model.safetensors"), "pt") as f:
        stored = set(f.keys())
    assert set(got) == stored == set(want)
    for name, value in want.items():
        assert got[name].dtype == torch.float32
        # batched per-example gradients (the default): float32 rounding of other kernel shapes and sum orders,
        # measured up to 4e-6 of a tensor's largest value (tests/test_fisher_batched.py says why)
        torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-5 * float(value.abs().max()), msg=name)
    assert sum(float(v.sum()) for v in got.values()) > 0
    info = json.loads((out / "fisher.json").read_text())
    assert info["examples"] == len(PROMPTS) and info["examples_requested"] == 256
    assert info["estimator"] == fisher_module.ESTIMATOR and info["suite"]["name"] == "calib"
    assert info["agent"] == str(lm) and len(info["agent_fingerprint"]) == 32 and info["seconds"] > 0


def test_examples_takes_the_first_prompts(tmp_path, lm):
    """One example per pass (``batch=1``): the same passes as the direct computation, so equal to 1e-5."""
    suite = write_suite(tmp_path / "suite")
    estimate = fisher_module.estimate_fisher(lm, suite, examples=2, device="cpu", batch=1)
    want = direct_fisher(lm, PROMPTS[:2], MAX_NEW)
    for name, value in want.items():
        torch.testing.assert_close(estimate.tensors[name], value, rtol=1e-5, atol=1e-12)
    assert estimate.info["examples"] == 2


def test_sharded_fisher_files_merge(tmp_path, lm):
    """Above the shard size the Fisher is split with an index, and the merge reads it back."""
    suite = write_suite(tmp_path / "suite", PROMPTS[:1])
    out = tmp_path / "F"
    fisher_module.write_fisher(lm, suite, out, device="cpu", shard_size="40KB")
    index = json.loads((out / "fisher.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1 and not (out / "fisher.safetensors").exists()
    merged = {}
    for f in files:
        merged.update(load_file(str(out / f)))
    single = fisher_module.estimate_fisher(lm, suite, device="cpu").tensors
    assert set(merged) == set(single) and all(torch.equal(merged[n], single[n]) for n in single)


def _agents(tmp_path: Path, lm: Path) -> tuple[Path, list[Path]]:
    """Two agents: the tiny LM with small perturbations of its weights, tokenizer included."""
    agents = []
    for t in range(2):
        folder = tmp_path / f"agent{t}"
        shutil.copytree(lm, folder)
        tensors = load_file(str(folder / "model.safetensors"))
        g = torch.Generator().manual_seed(10 + t)
        tensors = {n: v + 0.01 * torch.randn(v.shape, generator=g) for n, v in tensors.items()}
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
        agents.append(folder)
    return lm, agents


def test_merge_with_suites_computes_then_reuses_the_cache(tmp_path, lm, monkeypatch, capsys):
    base, agents = _agents(tmp_path, lm)
    suites = [write_suite(tmp_path / "s0", PROMPTS[:2]), write_suite(tmp_path / "s1", PROMPTS[2:])]
    argv = [
        "-q",
        "merge",
        str(base),
        *map(str, agents),
        "--method",
        "fisher",
        "--device",
        "cpu",
        "--fisher-suite",
        ",".join(map(str, suites)),
        "--examples",
        "2",
    ]
    calls = []
    real = fisher_module.estimate_fisher
    monkeypatch.setattr(fisher_module, "estimate_fisher", lambda *a, **k: calls.append(a) or real(*a, **k))
    assert main([*argv, "--out", str(tmp_path / "m1")]) == 0, capsys.readouterr().err
    assert len(calls) == 2
    report = json.loads((tmp_path / "m1" / "merge-report.json").read_text())
    folders = report["method_params"]["fisher"]
    assert [Path(f).parent for f in folders] == [fisher_module.cache_root()] * 2
    for folder, agent, suite in zip(folders, agents, suites):
        info = json.loads((Path(folder) / "fisher.json").read_text())
        assert info["agent"] == str(agent) and info["suite"]["source"] == str(suite)
    # same agents, suites and examples: nothing estimated again, same bytes
    assert main([*argv, "--out", str(tmp_path / "m2")]) == 0, capsys.readouterr().err
    assert len(calls) == 2
    assert (tmp_path / "m1" / "model.safetensors").read_bytes() == (tmp_path / "m2" / "model.safetensors").read_bytes()
    # the recipe the merge wrote names the suites: running it reuses the cache too
    recipe = (tmp_path / "m1" / "ram-recipe.yaml").read_text()
    assert str(suites[0]) in recipe
    assert main(["-q", "run", str(tmp_path / "m1" / "ram-recipe.yaml"), "--out", str(tmp_path / "m4")]) == 0
    assert len(calls) == 2
    assert (tmp_path / "m4" / "model.safetensors").read_bytes() == (tmp_path / "m1" / "model.safetensors").read_bytes()
    # another number of examples is another estimate
    argv[argv.index("--examples") + 1] = "1"
    assert main([*argv, "--out", str(tmp_path / "m3")]) == 0
    assert len(calls) == 4


def test_cancel_writes_nothing(tmp_path, lm):
    suite = write_suite(tmp_path / "suite")
    reporter = Reporter()
    seen = []

    def on_progress(event):
        seen.append(event)
        if event.stage == "fisher" and event.done >= 1:
            reporter.cancel.cancel()

    reporter._on_progress = on_progress
    with pytest.raises(Cancelled):
        fisher_module.write_fisher(lm, suite, tmp_path / "F", device="cpu", reporter=reporter)
    assert not (tmp_path / "F").exists() and not list(tmp_path.glob("F.partial-*"))
    assert [e.done for e in seen if e.stage == "fisher"][:2] == [0, 1]
    assert all(e.total == len(PROMPTS) and e.unit == "examples" for e in seen if e.stage == "fisher")
    with pytest.raises(Cancelled):
        fisher_module.cached_fisher(lm, suite, device="cpu", reporter=reporter)
    assert not fisher_module.cache_root().exists() or not any(fisher_module.cache_root().iterdir())


def _refused(capsys, argv, *fragments, untouched=()):
    before = tree_snapshot(*untouched)
    code = main(["-q", *argv])
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if line]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert tree_snapshot(*untouched) == before


def test_bad_inputs(tmp_path, lm, capsys):
    suite = write_suite(tmp_path / "suite")
    out = tmp_path / "F"
    _refused(
        capsys,
        ["fisher", str(lm), "--suite", str(tmp_path / "none.jsonl"), "--out", str(out)],
        "none.jsonl",
        untouched=[lm],
    )
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{not json\n')
    _refused(capsys, ["fisher", str(lm), "--suite", str(bad), "--out", str(out)], "bad.jsonl", "line 2")
    _refused(capsys, ["fisher", str(tmp_path / "noagent"), "--suite", str(suite), "--out", str(out)], "noagent")
    _refused(capsys, ["fisher", str(lm), "--suite", str(suite), "--out", str(out), "--examples", "0"], "--examples")
    _refused(
        capsys, ["fisher", str(lm), "--suite", str(suite), "--out", str(lm / "F")], "inside the input", untouched=[lm]
    )
    remote = tmp_path / "remote"
    shutil.copytree(lm, remote)
    config = json.loads((remote / "config.json").read_text())
    (remote / "config.json").write_text(json.dumps(dict(config, model_type="mystery", auto_map={"AutoModel": "x.Y"})))
    _refused(capsys, ["fisher", str(remote), "--suite", str(suite), "--out", str(out)], "trust_remote_code")
    assert not out.exists()
