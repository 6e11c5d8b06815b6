"""``--backend vllm`` with the real vLLM on a CUDA GPU gives the transformers backend's scores, within a tolerance.

Skipped unless vLLM is installed and torch sees a CUDA GPU (this project's CI has neither); on a GPU machine, in
a venv with the ``[vllm]`` extra: ``python -m pytest tests/test_vllm_gpu.py`` (README.md, development).

Both backends generate greedily in bfloat16 on the same GPU from the same prompt token ids, with the same stop
tokens and the same decoding (vllm_backend.py), so what can differ is only a token where two candidates are
within bfloat16's rounding: vLLM's attention and matmul kernels sum in other orders than transformers'. Such a flip
changes one completion, and then its reward. The tolerance, per model and suite: at least 98 % of the
completions identical, or the two scores within 2 standard errors of their paired difference (the scale on which
the evaluation itself calls a difference clear, docs/evaluate.md). lm-eval tasks run on lm-eval's own ``hf`` and
``vllm`` models: their scores within 2 standard errors of the task's per-example values.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

from .subproc import cli

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None or not torch.cuda.is_available(), reason="needs vLLM and a CUDA GPU"
)

TASKS = ("code", "tool", "memory")
DATA = Path(__file__).resolve().parent / "data" / "lm_eval"
IDENTICAL = 0.98
SE = 2.0


def paired_se(a: list[float], b: list[float]) -> float:
    d = [x - y for x, y in zip(a, b)]
    mean = sum(d) / len(d)
    return math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1) / len(d)) if len(d) > 1 else 0.0


def within_tolerance(a, b, m: int, s: int) -> tuple[bool, str]:
    same = sum(x == y for x, y in zip(a.completions[m][s], b.completions[m][s])) / len(a.completions[m][s])
    diff = b.scores[m][s] - a.scores[m][s]
    se = paired_se(b.rewards[m][s], a.rewards[m][s])
    ok = same >= IDENTICAL or abs(diff) <= SE * se
    return ok, f"model {m} suite {s}: {same:.1%} identical, difference {diff:+.4f} (SE {se:.4f})"


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    from ram_desktop.core.demo import write_demo

    folder = tmp_path_factory.mktemp("demo")
    write_demo(folder)
    return folder


def test_vllm_scores_equal_the_transformers_backends_within_the_tolerance(demo):
    """Through the Python API (the completions are not in eval.json): the demo's four models on its test suites."""
    from ram_desktop.evaluate import evaluate, load_suite

    models = [str(demo / n) for n in ("base", "coder", "tool", "memory")]
    suites = [load_suite(demo / "suites" / t) for t in TASKS]
    a, b = (evaluate(models, suites, "cuda", 32, backend=backend) for backend in ("transformers", "vllm"))
    assert b.versions["vllm"].startswith("0.33") and a.device == b.device
    verdicts = [within_tolerance(a, b, m, s) for m in range(len(models)) for s in range(len(suites))]
    print("\n".join(text for _, text in verdicts))
    assert all(ok for ok, _ in verdicts), [text for ok, text in verdicts if not ok]


def test_an_lm_eval_task_through_lm_evals_vllm_model(demo, tmp_path):
    pytest.importorskip("lm_eval")
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    text = (DATA / "toy_code_mc.yaml.in").read_text().replace("@DATA@", str(DATA / "toy_code.jsonl"))
    (tasks / "toy_code_mc.yaml").write_text(text)
    results = {}
    for backend in ("transformers", "vllm"):
        out = tmp_path / f"{backend}.json"
        done = cli(tmp_path, "eval", str(demo / "coder"), "--suite", "lm-eval:toy_code_mc", "--include-path",
                   str(tasks), "--device", "cuda", "--backend", backend, "--json", str(out), timeout=1200)  # fmt: skip
        assert done.returncode == 0, done.stderr
        results[backend] = json.loads(out.read_text())
    a, b = results["transformers"], results["vllm"]
    diff = b["scores"][0][0] - a["scores"][0][0]
    assert abs(diff) <= SE * max(paired_se(b["rewards"][0][0], a["rewards"][0][0]), 1e-9), diff
