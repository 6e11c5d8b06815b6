"""``--backend vllm`` on a machine without vLLM or without a GPU, and a boundary test of the adapter.

- Refusals: without vLLM (this machine), and with vLLM importable but no CUDA GPU, ``eval``, ``compare`` and
  ``search`` with ``--backend vllm`` end in one line, exit 2, nothing written.
- Boundary test (not a test of vLLM): ``tests/fake_vllm`` is a stand-in ``vllm`` package with vLLM's offline API
  that generates greedily with transformers, one prompt at a time with no cache. Put on ``sys.path`` of a fresh
  ``ram-merge`` process (whose ``torch.cuda.is_available`` says yes: the stand-in runs on the CPU), it shows that
  our adapter (``ram_desktop/evaluate/vllm_backend.py`` and the runner's plumbing) hands vLLM the prompts' token
  ids with greedy sampling parameters and the stop tokens, and turns its outputs into the same completions and
  scores as the transformers backend. The real vLLM on a GPU is tested in tests/test_vllm_gpu.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from .subproc import cli, refused

FAKE = Path(__file__).resolve().parent / "fake_vllm"
TASKS = ("code", "tool", "memory")
# a fresh process that finds the stand-in vllm and believes it has a CUDA GPU (auto then still picks the CPU:
# torch counts no device); the test of the refusal without a GPU leaves torch alone
FAKE_ON_PATH = f"import sys; sys.path.insert(0, {str(FAKE)!r})"
FAKE_GPU = FAKE_ON_PATH + "\nimport torch; torch.cuda.is_available = lambda: True"


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    from ram_desktop.core.demo import write_demo

    folder = tmp_path_factory.mktemp("demo")
    write_demo(folder)
    return folder


def eval_args(demo: Path, out: Path, *more: str) -> list[str]:
    suites = [str(demo / "suites" / "validation" / t) for t in TASKS]
    return [
        "eval",
        str(demo / "base"),
        str(demo / "tool"),
        "--suite",
        *suites,
        "--limit",
        "12",
        "--json",
        str(out),
        *more,
    ]


def test_vllm_backend_is_refused_without_vllm(demo, tmp_path):
    pytest.importorskip("optuna")
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    out = tmp_path / "eval.json"
    refused(cli(tmp_path, *eval_args(demo, out, "--backend", "vllm")), "--backend vllm needs vLLM", "[vllm]")
    assert not out.exists()
    suite = str(demo / "suites" / "validation" / "code")
    agents = [str(demo / n) for n in ("base", "coder", "tool")]
    compared = tmp_path / "compare"
    done = cli(
        tmp_path,
        "compare",
        *agents,
        "--variant",
        "average",
        "--suite",
        suite,
        "--out",
        str(compared),
        "--backend",
        "vllm",
    )
    refused(done, "needs vLLM")
    assert not compared.exists()
    searched = tmp_path / "search"
    done = cli(
        tmp_path, "search", *agents, "--suite", suite, "--trials", "2", "--out", str(searched), "--backend", "vllm"
    )
    refused(done, "needs vLLM")
    assert not searched.exists()


def test_vllm_backend_is_refused_without_a_cuda_gpu(demo, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    out = tmp_path / "eval.json"
    done = cli(tmp_path, *eval_args(demo, out, "--backend", "vllm"), prelude=FAKE_ON_PATH)
    refused(done, "--backend vllm needs a CUDA GPU", "--backend transformers")
    assert not out.exists()


def test_the_adapter_gives_the_transformers_backends_scores_through_a_stand_in_vllm(demo, tmp_path):
    """Boundary test: our code at the vLLM boundary, with a stand-in vLLM (module docstring)."""
    log = tmp_path / "fake-vllm.jsonl"
    plain, through = tmp_path / "transformers.json", tmp_path / "vllm.json"
    done = cli(tmp_path, *eval_args(demo, plain), timeout=300)
    assert done.returncode == 0, done.stderr
    prelude = f"import os; os.environ['FAKE_VLLM_LOG'] = {str(log)!r}\n" + FAKE_GPU
    done = cli(
        tmp_path, *eval_args(demo, through, "--backend", "vllm", "--batch-size", "5"), timeout=300, prelude=prelude
    )
    assert done.returncode == 0, done.stderr
    a, b = json.loads(plain.read_text()), json.loads(through.read_text())
    assert b["versions"]["vllm"] == "0.33.0+fake" and "vllm" not in a["versions"]
    assert b["scores"] == a["scores"] and b["per_example"] == a["per_example"]  # every example's reward
    assert b["intervals"] == a["intervals"] and b["suites"] == a["suites"]  # the floors too

    calls = [json.loads(line) for line in log.read_text().splitlines()]
    engines = [c for c in calls if c["call"] == "LLM"]
    assert [Path(c["model"]).name for c in engines] == ["base", "tool"]  # one engine per model, in order
    assert all(c["dtype"] == "bfloat16" and c["trust_remote_code"] is False for c in engines)
    generations = [c for c in calls if c["call"] == "generate"]
    assert all(c["temperature"] == 0.0 and c["n"] == 1 and c["repetition_penalty"] == 1.0 for c in generations)
    assert all(c["stop_token_ids"] == [2] for c in generations)  # the demo's end-of-sequence id
    max_tokens = {}
    for t in TASKS:
        text = (demo / "suites" / "validation" / t / "suite.yaml").read_text()
        max_tokens[t] = int(text.split("max_new_tokens:")[1].split()[0])
    # per model and suite: 12 examples handed over 5 at a time (5, 5, 2), with the suite's max_new_tokens
    assert [c["prompts"] for c in generations] == [5, 5, 2] * 6
    assert [c["max_tokens"] for c in generations] == [max_tokens[t] for _ in range(2) for t in TASKS for _ in range(3)]


def test_a_search_through_the_stand_in_vllm_scores_its_trials_as_transformers_does(demo, tmp_path):
    """Boundary test: search's trials and final test go through the backend (module docstring)."""
    pytest.importorskip("optuna")
    validation = [str(demo / "suites" / "validation" / t) for t in TASKS]
    test = [str(demo / "suites" / t) for t in TASKS]
    common = [*(str(demo / n) for n in ("base", "coder", "tool", "memory")), "--suite", *validation]
    common += ["--test-suite", *test, "--trials", "2", "--methods", "task-arithmetic,ties", "--limit", "6"]
    done = cli(tmp_path, "search", *common, "--out", str(tmp_path / "plain"), timeout=600)
    assert done.returncode == 0, done.stderr
    done = cli(
        tmp_path, "search", *common, "--out", str(tmp_path / "vllm"), "--backend", "vllm", timeout=600, prelude=FAKE_GPU
    )
    assert done.returncode == 0, done.stderr
    a = json.loads((tmp_path / "plain" / "search.json").read_text())
    b = json.loads((tmp_path / "vllm" / "search.json").read_text())
    assert [(t["method"], t["params"], t["scores"]) for t in b["trials"]] == [
        (t["method"], t["params"], t["scores"]) for t in a["trials"]
    ]
    assert b["best"]["test"] == a["best"]["test"] and b["reference"] == a["reference"]
    # a study made with one backend is not continued with the other
    refused(cli(tmp_path, "search", *common, "--out", str(tmp_path / "vllm")), "belongs to another search", "backend")
