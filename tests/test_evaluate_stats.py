"""Uncertainty and floors: the statistics module against numpy, and ``eval.json`` (ram-eval/2) from a real
evaluation checked against a computation written out here from its ``per_example`` scores (and, for the
floors, from the suite itself); the score cache reuses only what is unchanged; a tiny model generates on
one thread."""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import transformers

from ram_desktop.cli import main
from ram_desktop.evaluate import evaluate, load_suite, model_refs
from ram_desktop.evaluate.cache import ScoreCache
from ram_desktop.evaluate.chart import PALETTE, score_chart
from ram_desktop.evaluate.stats import clearly_better, mean_interval, paired_difference

from .test_compare import _tiny_agents
from .test_evaluate_runner import write_suite

PROMPTS = [
    "What is 2 + 3?",
    "Say hello to the world",
    "Remember the number 42",
    "def add(a, b):",
    "tool call: search(query='weather')",
    "Question: how many legs does a cat have?",
    "x",
    "The answer is",
    "Name a colour",
    "Count to three",
]


def np_interval(values) -> tuple[float, float]:
    v = np.asarray(values, dtype=float)
    half = 1.96 * (v.std(ddof=1) if len(v) > 1 else 0.0) / math.sqrt(len(v))
    return max(v.mean() - half, v.min()), min(v.mean() + half, v.max())


def np_paired(a, b) -> tuple[float, float]:
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    return d.mean(), (d.std(ddof=1) if len(d) > 1 else 0.0) / math.sqrt(len(d))


def test_stats_equal_numpy():
    rng = np.random.default_rng(3)
    for n in (1, 2, 7, 300):
        a = rng.integers(0, 2, n).astype(float).tolist()
        b = rng.random(n).tolist()
        assert mean_interval(a) == pytest.approx(np_interval(a), abs=1e-12)
        assert mean_interval(b) == pytest.approx(np_interval(b), abs=1e-12)
        assert paired_difference(a, b) == pytest.approx(np_paired(a, b), abs=1e-12)
    assert mean_interval([0.0] * 5 + [1.0])[0] == 0.0  # clipped to the range of the scores
    assert mean_interval([1.0] * 9 + [0.0])[1] == 1.0
    assert mean_interval([0.5]) == (0.5, 0.5)
    # 0.465 vs 0.466 on 300 examples is noise; a steady lead of one example in ten is not
    rng = np.random.default_rng(0)
    x = (rng.random(300) < 0.466).astype(float)
    y = x.copy()
    flip = rng.choice(300, 40, replace=False)
    y[flip[:20]], y[flip[20:]] = 1 - y[flip[:20]], y[flip[20:]]
    assert not clearly_better(x.tolist(), y.tolist()) and not clearly_better(y.tolist(), x.tolist())
    z = np.maximum(x, (np.arange(300) % 10 == 0).astype(float))
    assert clearly_better(z.tolist(), x.tolist()) and not clearly_better(x.tolist(), z.tolist())
    with pytest.raises(ValueError):
        paired_difference([1.0], [1.0, 0.0])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, list[Path], Path, Path]:
    """Three tiny models and two suites: 'words' (exact; every answer one of three words, "yes" the most
    frequent, so a constant answer scores) and 'lengths' (a python reward that pays for short
    completions, so the empty answer is its floor)."""
    root = tmp_path_factory.mktemp("stats")
    base, agents = _tiny_agents(root / "models")
    answers = ["yes", "no", "yes", "maybe", "yes", "no", "yes", "yes", "no", "maybe"]
    words = write_suite(
        root / "words",
        [{"prompt": p, "answer": a} for p, a in zip(PROMPTS, answers)],
        "name: words\nscorer: exact\nmax_new_tokens: 4\nchat_template: false\n",
    )
    (root / "lengths").mkdir()
    (root / "lengths" / "short.py").write_text(
        "def reward(prompts, completions, **columns):\n    return [1.0 / (1 + len(c)) for c in completions]\n"
    )
    lengths = write_suite(
        root / "lengths",
        [{"prompt": p} for p in PROMPTS],
        "name: lengths\nscorer: python:short.py:reward\nmax_new_tokens: 4\nchat_template: false\n",
    )
    return base, agents, words, lengths


def test_eval_json_equals_an_independent_computation(tiny, tmp_path, capsys):
    base, agents, words, lengths = tiny
    out = tmp_path / "eval.json"
    code = main(
        [
            "-q",
            "eval",
            str(base),
            *map(str, agents),
            "--suite",
            str(words),
            str(lengths),
            "--json",
            str(out),
            "--device",
            "cpu",
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    data = json.loads(out.read_text())
    assert data["format"] == "ram-eval/2"
    names = [m["name"] for m in data["models"]]
    per_example = data["per_example"]
    assert len(per_example) == 3 and all(len(row) == 2 and len(row[0]) == len(row[1]) == 10 for row in per_example)
    for m in range(3):
        for s in range(2):
            assert data["scores"][m][s] == pytest.approx(np.mean(per_example[m][s]), abs=1e-12)
            assert data["intervals"][m][s] == pytest.approx(list(np_interval(per_example[m][s])), abs=1e-12)
    expected = []
    for s, suite in enumerate(["words", "lengths"]):
        for a in range(3):
            for b in range(a + 1, 3):
                diff, se = np_paired(per_example[a][s], per_example[b][s])
                expected.append((suite, names[a], names[b], diff, se, abs(diff) > 2 * se))
    got = [(d["suite"], d["a"], d["b"], d["difference"], d["se"], d["clear"]) for d in data["differences"]]
    assert [g[:3] for g in got] == [e[:3] for e in expected]
    for g, e in zip(got, expected):
        assert g[3:5] == pytest.approx(e[3:5], abs=1e-12) and g[5] == e[5]

    # the floors: the empty answer and the most frequent answers, scored as the suites score completions
    rows = [json.loads(line) for line in (words / "data.jsonl").read_text().splitlines()]
    counts = Counter(r["answer"] for r in rows)
    candidates = [""] + [a for a, _ in counts.most_common(5)]
    exact = {c: [float(c == r["answer"]) for r in rows] for c in candidates}
    best = max(candidates, key=lambda c: (np.mean(exact[c]), -candidates.index(c)))
    assert best == "yes"
    assert data["suites"][0]["floor"] == {"answer": "yes", "score": pytest.approx(0.5)}
    assert data["suites"][1]["floor"] == {"answer": "", "score": 1.0}  # 1 / (1 + 0) on every example
    floors = [exact[best], [1.0] * 10]
    for m in range(3):
        for s in range(2):
            diff, se = np_paired(per_example[m][s], floors[s])
            assert data["at_floor"][m][s] == (not diff > 2 * se)
    assert all(data["at_floor"][m][1] for m in range(3))  # nothing beats answering nothing on 'lengths'

    table = captured.out
    assert "floor" in table and '"yes"' in table and "≈" in table
    lo, hi = data["intervals"][0][0]
    assert f"{data['scores'][0][0]:.3f} [{lo:.3f}, {hi:.3f}]" in table
    assert "words: " in table and ("best: " in table or "tied: " in table)


def test_the_chart_is_described_once_with_intervals_and_distinct_colours(tiny):
    base, agents, words, _ = tiny
    result = evaluate(model_refs([base, *agents]), [load_suite(words)], device="cpu")
    chart = score_chart(result, ["base", "agent", "agent"])
    assert [s.name for s in chart.series] == ["base", "left", "right"]
    assert len({s.color for s in chart.series}) == 3 and chart.series[1].color == PALETTE[0]
    for m, series in enumerate(chart.series):
        assert (series.lows[0], series.highs[0]) == pytest.approx(np_interval(result.rewards[m][0]))
        assert series.labels[0].startswith(f"{result.scores[m][0]:.2f}")
    assert chart.floors == (0.5,)
    many = score_chart(result, ["variant"] * 3)
    assert len({s.color for s in many.series}) == 3


def test_the_cache_reuses_only_unchanged_models_and_suites(tiny, tmp_path, monkeypatch):
    base, agents, words, lengths = tiny
    calls: list[int] = []
    original = transformers.GenerationMixin.generate

    def generate(self, *args, **kwargs):
        calls.append(kwargs["input_ids"].shape[0])
        return original(self, *args, **kwargs)

    monkeypatch.setattr(transformers.GenerationMixin, "generate", generate)
    cache = ScoreCache()
    suites = [load_suite(words), load_suite(lengths)]
    first = evaluate(model_refs([base, agents[0]]), suites, device="cpu", batch_size=10, cache=cache)
    assert len(calls) == 4 and len(cache) == 4
    calls.clear()
    again = evaluate(model_refs([base, agents[0]]), suites, device="cpu", batch_size=10, cache=cache)
    assert calls == [] and cache.hits == 4
    (base / "eval.json").write_text("{}")  # what an evaluation writes into a merged model's folder: no change
    (base / "README.md").write_text("## Evaluation\n")
    evaluate(model_refs([base]), suites, device="cpu", batch_size=10, cache=cache)
    assert calls == [] and cache.hits == 6
    (base / "eval.json").unlink()
    (base / "README.md").unlink()
    assert again.rewards == first.rewards and again.completions == first.completions and again.scores == first.scores
    # another batch size, a changed model file or another suite: generated again
    evaluate(model_refs([base]), suites[:1], device="cpu", batch_size=5, cache=cache)
    assert len(calls) == 2
    calls.clear()
    weights = agents[0] / "model.safetensors"
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    evaluate(model_refs([base, agents[0]]), suites, device="cpu", batch_size=10, cache=cache)
    assert len(calls) == 2  # the agent on both suites; the base reused
    calls.clear()
    evaluate(model_refs([base]), [suites[0].head(6)], device="cpu", batch_size=10, cache=cache)
    assert len(calls) == 1
