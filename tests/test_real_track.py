"""The real-model track (``reproduction/real``): its tasks, rewards, IFEval-style checkers and report, and one
GRPO step of a real agent through the pipeline's own entry point.

The pure pieces run in well under a second; the report runs in a fresh process on results JSON written here;
the GRPO test builds (or reuses) the cached SmolLM2 base and is skipped only when the package index is out of
reach while the base is not cached (as ``tests/test_real_model.py``).
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the repository root, for reproduction/
from reproduction.real import ifeval, reward, tasks
from reproduction.real.run import MODULES, SIZES, task_vector_map


def test_splits_are_seeded_disjoint_and_full():
    for task in tasks.TASKS:
        first = tasks.make_splits(task, SIZES, 0)
        assert first == tasks.make_splits(task, SIZES, 0)  # seeded
        assert first != tasks.make_splits(task, SIZES, 1)
        prompts = {split: [r["prompt"] for r in rows] for split, rows in first.items()}
        assert {split: len(p) for split, p in prompts.items()} == SIZES  # the prompt space holds every split
        every = [p for ps in prompts.values() for p in ps]
        assert len(every) == len(set(every))  # no prompt twice, within or across splits


def test_examples_are_what_they_say():
    for seed in range(20):
        ex = tasks.code_example(random.Random(seed))
        a_line, b_line, print_line = ex["prompt"].splitlines()  # a = 4 / b = a * 3 / print(b + 2)
        a = int(a_line.removeprefix("a = "))
        _, _, _, op1, k = b_line.split()
        b = a + int(k) if op1 == "+" else a * int(k)
        _, op2, d = print_line.removeprefix("print(").removesuffix(")").split()
        assert str(b + int(d) if op2 == "+" else b - int(d)) == ex["answer"]
    mem = tasks.memory_example(random.Random(4))
    asked = mem["prompt"].split("Which number does the ")[1].removesuffix(" hold?")
    assert f"The {asked} holds {mem['answer']}." in mem["prompt"]


def test_code_reward():
    got = reward.code_reward(
        None,
        ["The output is 14.", "12", "9 or 14", "no idea", [{"role": "assistant", "content": "14"}], "-4"],
        answer=["14"] * 5 + ["4"],
    )
    assert got == [1.0, 0.5 * (1 - 2 / 10), 0.5 * (1 - 5 / 10), 0.0, 1.0, 0.5 * (1 - 8 / 10)]


def test_tool_reward():
    want = ["weather(Oslo)"] * 7
    got = reward.tool_reward(
        None,
        [
            "weather(Oslo)",
            'Sure: weather(city="oslo")',
            "I'll check the weather in Oslo.",
            "weather(Lima)",
            "search(Oslo)",
            "Oslo",
            "Hello",
        ],
        answer=want,
    )
    assert got == [1.0, 1.0, 0.4 + 0.2, 0.4 + 0.2, 0.2 + 0.2, 0.2, 0.0]


def test_memory_reward():
    prompt = "The red box holds 42. The blue box holds 17.\nWhich number does the blue box hold?"
    got = reward.memory_reward([prompt] * 4, ["17", "The blue box holds 42.", "99", "none"], answer=["17"] * 4)
    assert got == [1.0, 0.25, 0.0, 0.0]
    conversational = [[{"role": "system", "content": "x"}, {"role": "user", "content": prompt}]]
    assert reward.memory_reward(conversational, ["It holds 42"], answer=["17"]) == [0.25]


def test_tool_call_exact_parses_the_call():
    want = ["weather(Oslo)"] * 9
    got = reward.tool_call_exact(
        None,
        [
            "weather(Oslo)",
            'Sure: weather(city="oslo")',
            "Calling WEATHER('Oslo') now",
            "weather()",  # the audit's constant: no argument, no call
            "weather(Oslo, Lima)",  # two arguments
            "weather(Oslo rain)",  # not a call expression
            "search(Oslo)",  # wrong tool
            "I'll check the weather in Oslo.",  # no call at all
            "Sure (of course): weather(Oslo)",  # an aside in brackets is no call; the next one is
        ],
        answer=want,
    )
    assert got == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert reward.tool_call_exact(None, ["timer(15)", "timer('15')", "timer(16)"], answer=["timer(15)"] * 3) == [
        1.0,
        1.0,
        0.0,
    ]


def _suite(tmp_path: Path, task: str, seed: int, split: str = "test") -> Path:
    """The real track's suite folder for ``task`` (as ``run.py`` writes it)."""
    from reproduction.real.run import write_task_suite

    folder = tmp_path / f"{task}-{split}"
    write_task_suite(folder, task, split, tasks.make_splits(task, SIZES, seed)[split])
    return folder


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_audits_constant_weather_call_scores_at_the_floor(tmp_path, seed):
    """On each seed's tool test split: `weather()` earns about 30 % of the partial credit (the audit's 30.5 / 30.5
    / 32.2) but nothing on the exact call, the primary metric; the right calls earn 1.0 each; the floor is
    `ram-merge eval`'s (floors.floor_of: the best of the empty answer and the 5 most frequent answers)."""
    from ram_desktop.evaluate.floors import floor_of
    from ram_desktop.evaluate.scorers import make_scorer
    from ram_desktop.evaluate.suites import load_suite

    suite = load_suite(_suite(tmp_path, "tool", seed))
    answers = list(suite.columns["answer"])
    scorer = make_scorer(suite.scorer_spec)
    assert scorer.spec.function == "tool_call_exact"
    constant = scorer.score(suite, ["weather()"] * len(answers))
    assert sum(constant) == 0.0
    partial = reward.tool_reward(list(suite.prompts), ["weather()"] * len(answers), answer=answers)
    assert 0.28 < sum(partial) / len(partial) < 0.34  # what the old primary metric gave a constant
    assert scorer.score(suite, answers) == [1.0] * len(answers)
    floor = floor_of(suite, scorer)
    assert floor.answer in answers and floor.score < 0.05  # one frequent call is right on a few examples
    assert sum(constant) / len(constant) <= floor.score


def test_new_tasks_are_what_they_say():
    for seed in range(20):
        ex = tasks.arith_example(random.Random(seed))
        numbers = [int(x) for x in re.findall(r"\d+", ex["prompt"])]
        a, b, c = numbers
        assert int(ex["answer"]) in (a + b - c, a + b * a - c)
        ret = tasks.retrieval_example(random.Random(seed))
        place = ret["prompt"].rsplit("Who works at the ", 1)[1].removesuffix("?")
        assert f"{ret['answer']} works at the {place}." in ret["prompt"]
    prompt = "Anna works at the bank. Omar works at the school.\nWho works at the school?"
    got = reward.retrieval_reward([prompt] * 4, ["Omar", "It is Anna.", "omar works there", "Bob"], answer=["Omar"] * 4)
    assert got == [1.0, 0.25, 1.0, 0.0]
    assert reward.arith_reward(None, ["The answer is 9.", "7"], answer=["9", "9"]) == [1.0, 0.5 * (1 - 2 / 10)]


def test_ifeval_prompts_use_lm_evals_registry():
    pytest.importorskip("langdetect")
    instructions_registry = ifeval.registry()  # lm-eval's own, imported without a download (ensure_punkt_tab)
    rows = ifeval.load_prompts()
    assert rows == ifeval.make_prompts()  # the committed file is what the generator writes
    assert len(rows) >= 200 and len({r["prompt"] for r in rows}) == len(rows)
    used = {t for r in rows for t in r["instruction_id_list"]}
    assert len(used) >= 20 and used <= set(instructions_registry.INSTRUCTION_DICT)
    for r in rows:
        assert len(r["kwargs"]) == len(r["instruction_id_list"])


def test_ifeval_scores_with_lm_evals_checkers():
    """Strict and loose through lm-eval's own tests; a reply that follows the instructions scores 1, the
    audit's constant "YES" only on the instructions any short capitalised reply meets."""
    pytest.importorskip("langdetect")
    rows = [
        {
            "key": 0,
            "prompt": "Describe tea. Do not use commas.",
            "instruction_id_list": ["punctuation:no_comma"],
            "kwargs": [{}],
        },
        {
            "key": 1,
            "prompt": "Describe tea. Use lowercase.",
            "instruction_id_list": ["change_case:english_lowercase"],
            "kwargs": [{}],
        },
        {
            "key": 2,
            "prompt": "Describe tea. Wrap it in JSON. End with the phrase 'Any other questions?'",
            "instruction_id_list": ["detectable_format:json_format", "startend:end_checker"],
            "kwargs": [{}, {"end_phrase": "Any other questions?"}],
        },
    ]
    columns = {"instruction_id_list": [r["instruction_id_list"] for r in rows], "kwargs": [r["kwargs"] for r in rows]}
    prompts = [r["prompt"] for r in rows]
    good = ["tea is a drink.", "tea is a drink.", '**Here:**\n{"tea": "drink"}']
    assert ifeval.follow(prompts, good, **columns) == [[True], [True], [False, False]]
    assert ifeval.follow(prompts, good, loose=True, **columns)[2] == [True, False]  # loose drops the first line
    assert ifeval.instruction_strict(prompts, ["YES"] * 3, **columns) == [1.0, 0.0, 0.0]
    s = ifeval.summary(ifeval.follow(prompts, good, **columns), ifeval.follow(prompts, good, loose=True, **columns))
    assert s == {"prompt_strict": 2 / 3, "instruction_strict": 2 / 4, "prompt_loose": 2 / 3, "instruction_loose": 3 / 4}


def _fake_run(seed: int, with_wudi: bool) -> dict:
    """A results-seed JSON with every key the report reads (values made up)."""
    methods = [
        "ram",
        "ram-plus",
        "ram-plus-soft",
        "average",
        "task-arithmetic",
        "ties",
        "dare-ta",
        "dare-ties",
        "fisher",
    ] + (["wudi"] if with_wudi else [])
    task_names = list(tasks.TASKS)

    def scores(k: float) -> dict:
        out = {t: 0.2 + 0.1 * i + k for i, t in enumerate(task_names)}
        out.update({f"{t}_exact": v / 2 for t, v in list(out.items())})
        out["mean"] = sum(out[t] for t in task_names) / 3
        out["mean_exact"] = out["mean"] / 2
        return out

    layers = [[0.1 * (i % 3) + 0.01 * j for j in range(9)] for i in range(4)]
    return {
        "seed": seed,
        "params": 1000,
        "model": "SmolLM2 (test)",
        "device": "cpu",
        "smoke": False,
        "sizes": {"train": 8, "validation": 4, "test": 6},
        "grids": {"ta_scales": [0.5], "ties_densities": [0.2], "dare_drops": [0.5], "r_sweep": [0.0, 0.2]},
        "recipe": {"learning_rate": 1e-5, "steps": 2, "prompts_per_step": 2, "generations": 4, "temperature": 1.0},
        "table1": {
            "base": scores(0),
            **{t: scores(0.05) for t in task_names},
            **{m: scores(0.01 * seed) for m in methods},
        },
        "table2": {"0.0": scores(0.0), "0.2": scores(0.02)},
        "base_validation": scores(0.1),
        "figure3": {**{t: scores(0.03) for t in task_names}, **{f"{t}-diluted": scores(0.01) for t in task_names}},
        "recipes": {t: {"steps": 2} for t in task_names},
        "chosen": {
            m: {"method": m, "params": {"scale": 0.5} if m in ("task-arithmetic", "fisher") else {}} for m in methods
        },
        "agents": {
            t: {"density": 0.1, "gain": 0.05, "gain_se": 0.02, "n": 6, "unique": 60, "shared": 40, "rho": 0.67}
            for t in task_names
        },
        "heatmap": {
            t: {
                "density": 0.1,
                "modules": list(MODULES),
                "layers": layers,
                "other": {"model.embed_tokens.weight": 0.05, "model.norm.weight": 0.0},
            }
            for t in task_names
        },
        "ifeval": {
            name: {"instruction": 0.5, "prompt": 0.25, "gain": 0.0, "gain_se": 0.01, "n": 3}
            for name in ["base", *task_names, *methods]
        },
        "timings": {"probe": 1.0, "total": 9.0},
    }


@pytest.mark.parametrize("with_wudi", [False, True])
def test_report_from_results_json_alone(tmp_path, with_wudi):
    pytest.importorskip("matplotlib")
    for seed in (0, 1):
        (tmp_path / f"results-seed{seed}.json").write_text(json.dumps(_fake_run(seed, with_wudi)))
    (tmp_path / "timings.json").write_text(json.dumps({"base": {"seconds": 3.0}, "total": 3.0}))
    (tmp_path / "run.log").write_text("[00:00:00] [run] start\n")
    done = subprocess.run(
        [sys.executable, "-m", "reproduction.real.report", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    text = (tmp_path / "results.md").read_text()
    for heading in ("Agents against the base", "Figure 2", "Table 1", "Table 2", "Figure 3", "IFEval-style", "Timings"):
        assert heading in text
    assert ("| WUDI |" in text) is with_wudi and ("WUDI is not in this build" in text) is not with_wudi
    assert "| 1 | memory | 40.0 | 45.0 | +5.0 ± 2.0 (6) | yes | 10.00 % |" in text
    assert text.count("| 2 |\n") == 2 * len(tasks.TASKS)  # each agent's own GRPO steps, two seeds
    assert "seed 0: code 30.0 % (15.0 % right), tool 40.0 % (20.0 % right), memory 50.0 % (25.0 % right)" in text
    for png in ("figure2.png", "tables.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(list(tmp_path.iterdir())) <= 8  # what may come back from the GPU machine


@pytest.mark.slow
def test_one_grpo_step_of_a_real_agent(tmp_path):
    """``run --stage suites`` then ``--stage agent`` (one GRPO step, chat prompts): a bf16 agent, sparse."""
    pytest.importorskip("trl")
    from reproduction.real import base as real_base

    try:
        base = real_base.build_base(log=print)
    except real_base.IndexUnreachable as exc:
        pytest.skip(str(exc))
    work, results = tmp_path / "work", tmp_path / "results"
    work.mkdir()
    (work / "base").symlink_to(base, target_is_directory=True)
    common = ["--work", str(work), "--results", str(results), "--seeds", "5", "--device", "cpu", "--smoke"]
    for extra in (["--stage", "suites"], ["--stage", "agent", "--task", "memory", "--grpo-steps", "1"]):
        done = subprocess.run(
            [sys.executable, "-m", "reproduction.real.run", *common, *extra],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            check=False,
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    suite = (work / "seed5" / "suites" / "memory-test" / "suite.yaml").read_text()
    assert "chat_template: true" in suite and "scorer: python:reward.py:memory_reward" in suite
    agent = work / "seed5" / "memory"
    assert json.loads((agent / "config.json").read_text())["dtype"] == "bfloat16"
    recipe = json.loads((agent / "recipe.json").read_text())
    assert recipe["steps"] == 1 and recipe["seed"] == 5 and recipe["task"] == "memory"
    density = task_vector_map(base, agent)["density"]
    assert 0.0 < density < 0.3  # one small step moves few elements by half a bf16 ulp
    assert "grpo memory seed 5: step 1/1" in (results / "run.log").read_text()


@pytest.mark.parametrize("content", [b"not a gguf", b"PK\x03\x04 not a wheel either"])
def test_a_local_gguf_or_wheel_with_another_hash_is_refused(tmp_path, content):
    from reproduction.real import base as real_base

    path = tmp_path / "model.gguf"
    path.write_bytes(content)
    with pytest.raises(real_base.BuildError) as raised:
        real_base.local_gguf(path, tmp_path / "out")
    assert "refusing it" in str(raised.value) and "\n" not in str(raised.value)
    with pytest.raises(real_base.BuildError, match="no such file"):
        real_base.local_gguf(tmp_path / "missing.whl", tmp_path / "out")


NEW_KEYS = ("tasks", "grids", "fixed", "merges", "regime", "samples", "table1_bfloat16", "advice")


@pytest.mark.slow
@pytest.mark.timeout(1800)  # ten GRPO processes each import TRL: 12 minutes on a loaded 2-core machine
def test_tiny_pipeline_writes_every_new_key(tmp_path):
    """The whole pipeline on a tiny random model (``--smoke --tiny-base``): agents of two training settings, the
    float32 merges and their bf16 rows, floors, IFEval through lm-eval's checkers, the regime loop, the report —
    and every key issue 38 adds to ``results-seed{N}.json``."""
    pytest.importorskip("trl")
    pytest.importorskip("langdetect")
    work, results = tmp_path / "work", tmp_path / "results"
    done = subprocess.run(
        [sys.executable, "-m", "reproduction.real.run", "--work", str(work), "--results", str(results)]
        + ["--seeds", "0", "--device", "cpu", "--smoke", "--tiny-base", "--jobs", "2"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1500,
        env={**os.environ, "OMP_NUM_THREADS": "1", "RAM_DESKTOP_NLTK_DATA": str(tmp_path / "nltk")},
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    r = json.loads((results / "results-seed0.json").read_text())
    for key in (*NEW_KEYS, "table1", "table2", "figure3", "chosen", "agents", "ifeval", "heatmap", "probe"):
        assert key in r, key
    assert r["merges"]["out_dtype"] == "float32"
    compared = json.loads((work / "seed0" / "merges" / "search" / "compare.json").read_text())
    assert compared["variants"] and (work / "seed0" / "merges" / "bfloat16" / "compare.json").exists()
    assert set(r["table1_bfloat16"]) == set(r["chosen"])
    assert max(p["scale"] for p in r["grids"]["task-arithmetic"]) == 2.0
    assert {p["r"] for p in r["grids"]["ram-plus"]} == {0.1, 0.3} and {p["alpha"] for p in r["grids"]["ram-plus"]} == {
        2.0,
        8.0,
    }
    assert "ram" in r["fixed"] and "ram-plus" not in r["fixed"]  # RAM+ is searched now, RAM is not
    for task in tasks.TASKS:
        floor = r["tasks"][task]["floor"]
        assert set(floor) == {"answer", "score"} and 0.0 <= floor["score"] <= 1.0
        a = r["agents"][task]
        for k in ("score", "over_floor", "over_floor_se", "unique_share", "density", "gain", "gain_se"):
            assert k in a, (task, k)
        assert a["over_floor"] == pytest.approx(a["score"] - floor["score"], abs=1e-9)
        assert len(r["samples"][task][task]) == 6  # the smoke test split
    assert r["tasks"]["tool"]["constants"] == {"weather()": 0.0}
    assert "tool_partial" in r["table1"]["base"]
    assert r["ifeval"]["implementation"].startswith("lm-eval 0.4.13")
    constant = r["ifeval"]["constant 'YES'"]
    assert {"prompt_strict", "instruction_strict", "prompt_loose", "instruction_loose"} <= set(constant)
    assert [e["setting"] for e in r["regime"]] == ["lr1e-5", "lr5e-5"]
    for e in r["regime"]:
        for k in ("sign_agreement", "ta_lambda", "ram_minus_ta", "ram_minus_ta_se", "pairs", "mean_unique_share"):
            assert k in e, k
        assert len(e["pairs"]) == 10 and set(e["agents"]) == set(tasks.TASKS)
    assert r["regime"][1]["steps"] == {"code": 1, "tool": 2, "memory": 1, "arith": 2, "retrieval": 1}
    text = (results / "results.md").read_text()
    for heading in ("Floors", "exact call and partial credit", "Rounding", "Grids and fixed settings", "The regime"):
        assert heading in text
    assert len(list(results.iterdir())) <= 8


def test_gap_over_tasks_and_probe_facts():
    from reproduction.real.run import gap_over_tasks, probe_facts

    a = {"x": [1.0, 0.0, 1.0, 1.0], "y": [0.5, 0.5]}
    b = {"x": [0.0, 0.0, 1.0, 0.0], "y": [0.0, 0.5]}
    gap, se = gap_over_tasks(a, b, ("x", "y"))
    # x: differences 1, 0, 0, 1 (mean 0.5, sd 0.5774, se 0.2887); y: 0.5, 0 (mean 0.25, sd 0.3536, se 0.25)
    assert gap == pytest.approx((0.5 + 0.25) / 2)
    assert se == pytest.approx((0.2886751**2 + 0.25**2) ** 0.5 / 2, rel=1e-6)
    facts = probe_facts(
        {
            "agents": [
                {"name": "a", "density": 0.1, "unique": 30, "shared": 90, "rho": 3.0},
                {"name": "b", "density": 0.0, "unique": 0, "shared": 0, "rho": None},
            ],
            "advice": {"agents": [{"name": "a", "rescale_survival": 0.16}]},
        }
    )
    assert facts["a"]["unique_share"] == 0.25 and facts["a"]["rescale_survival_bf16"] == 0.16
    assert facts["b"]["unique_share"] is None and facts["b"]["rescale_survival_bf16"] is None


def test_the_gpu_budget_plan_is_printed_and_says_when_it_does_not_fit(capsys):
    import argparse

    from reproduction.real.run import BUDGET_LADDER, apply_budget

    args = argparse.Namespace(grpo_steps=None, fisher_examples=None)
    plan = apply_budget(args, 1000)
    assert args.seeds == [0, 1, 2] and args.grids == "full" and args.fisher_examples == 256
    assert len(args.regime_settings) >= 3 and plan["total"] <= 1000
    small = argparse.Namespace(grpo_steps=None, fisher_examples=None)
    apply_budget(small, 1)
    seeds, steps, settings, _, grids, fisher = BUDGET_LADDER[-1]
    assert (small.seeds, small.grpo_steps, small.grids, small.fisher_examples) == (seeds, steps, grids, fisher)
    assert len(small.regime_settings) == settings >= 3  # the regime loop's 3 settings survive every plan
    assert "OVER the 1 minutes" in capsys.readouterr().out
