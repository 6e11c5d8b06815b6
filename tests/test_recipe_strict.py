"""Recipes, suites and scorers never change a run silently and never crash: unknown or misplaced keys and values
of the wrong type are refused naming the key, YAML aliases cannot blow up, text must be UTF-8, more agents than
the engine holds are refused before any file is opened, and a scorer calling sys.exit is an input error. Each
case runs the real CLI in a fresh process."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from ram_desktop.core import MergeSpec
from ram_desktop.core.engine.plan import MAX_AGENTS

from .conftest import make_models
from .subproc import cli, refused


@pytest.fixture
def recipe(tmp_path):
    base, agents = make_models(tmp_path / "in")
    data = {
        "format": "ram-recipe/1",
        "method": "ram-plus",
        "parameters": {"r": 0.3, "alpha": 1.5},
        "base": str(base),
        "agents": [{"name": a.name, "source": str(a)} for a in agents],
    }
    return tmp_path, data


def run_recipe(tmp_path: Path, data, name: str = "r.yaml") -> subprocess.CompletedProcess:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False) if not isinstance(data, str) else data)
    return cli(tmp_path, "run", str(path), "--out", str(tmp_path / "out"))


@pytest.mark.parametrize(
    "change,fragments",
    [
        (lambda d: d.update(paramters=d.pop("parameters")), ["paramters", "unknown key", "did you mean parameters"]),
        (
            lambda d: d["agents"][0].update(sorce=d["agents"][0].pop("source")),
            ["agents[0].sorce", "did you mean source"],
        ),
        (lambda d: d["parameters"].update(alhpa=2), ["parameters.alhpa", "did you mean alpha"]),
        (lambda d: d["parameters"].update(density=0.2), ["parameters.density", "not of ram-plus"]),
        (lambda d: d.update(eps="abc"), ["eps", "expected a number"]),
        (lambda d: d.update(agents="alpha"), ["agents", "expected a list"]),
        (lambda d: d.update(parameters=[1, 2]), ["parameters", "expected a mapping"]),
        (lambda d: d.update(shard_size=[1]), ["shard_size", "expected a size"]),
        (lambda d: d.update(base={"path": "x"}), ["base", "expected text"]),
    ],
)
def test_a_typo_or_wrong_type_in_a_recipe_is_refused_naming_the_key(recipe, change, fragments):
    tmp_path, data = recipe
    change(data)
    refused(run_recipe(tmp_path, data), *fragments)
    assert not (tmp_path / "out").exists()


def test_the_recipe_a_merge_writes_runs_back_unchanged(recipe):
    tmp_path, data = recipe
    done = run_recipe(tmp_path, data)
    assert done.returncode == 0, done.stderr
    written = tmp_path / "out" / "ram-recipe.yaml"
    again = MergeSpec.load(written)
    assert again.params == {"r": 0.3, "alpha": 1.5} and again.method == "ram-plus"
    assert MergeSpec.from_dict(yaml.safe_load(again.to_yaml()), "round trip") == again


def test_a_recipe_that_is_not_utf8_is_refused(recipe):
    tmp_path, data = recipe
    path = tmp_path / "latin1.yaml"
    path.write_bytes(yaml.safe_dump(data).encode() + "# café\n".encode("latin-1"))
    refused(cli(tmp_path, "run", str(path), "--out", str(tmp_path / "out")), "UTF-8")


LAUGHS = (
    "\n".join(
        ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
        + [f"{chr(97 + i)}: &{chr(97 + i)} [" + ", ".join([f"*{chr(96 + i)}"] * 9) + "]" for i in range(1, 10)]
    )
    + "\n"
)


def test_a_billion_laughs_recipe_costs_nothing(recipe):
    tmp_path, _ = recipe
    start = time.perf_counter()
    refused(run_recipe(tmp_path, "format: ram-recipe/1\n" + LAUGHS), "aliases expand to more than")
    assert time.perf_counter() - start < 30  # the process start dominates; the expansion never happens


def test_a_billion_laughs_suite_costs_nothing(recipe):
    tmp_path, _ = recipe
    demo = tmp_path / "demo"
    assert cli(tmp_path, "demo", str(demo)).returncode == 0
    (demo / "suites" / "code" / "suite.yaml").write_text("name: code\n" + LAUGHS)
    refused(
        cli(tmp_path, "eval", str(demo / "base"), "--suite", str(demo / "suites" / "code"), "--limit", "1"),
        "suite.yaml",
        "aliases expand",
    )


def test_more_agents_than_the_engine_holds_are_refused_before_any_file_is_opened(recipe):
    tmp_path, data = recipe
    many = [str(tmp_path / f"never-opened-{i}") for i in range(MAX_AGENTS + 1)]
    refused(
        cli(tmp_path, "merge", data["base"], *many, "--out", str(tmp_path / "out")),
        f"{MAX_AGENTS + 1} agents",
        f"at most {MAX_AGENTS}",
    )
    refused(cli(tmp_path, "probe", data["base"], *many), f"{MAX_AGENTS + 1} agents")
    data["agents"] = [{"source": s} for s in many * 20]  # 5140 agents
    refused(run_recipe(tmp_path, data), f"{len(many) * 20} agents")


def test_the_largest_supported_agent_count_merges(recipe):
    tmp_path, data = recipe
    agent = data["agents"][0]["source"]
    done = cli(
        tmp_path, "merge", data["base"], *[agent] * MAX_AGENTS, "--method", "ram", "--out", str(tmp_path / "out")
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "model.safetensors").exists()


@pytest.mark.parametrize("where", ["import", "call"])
def test_a_scorer_calling_sys_exit_is_an_input_error(recipe, where):
    tmp_path, _ = recipe
    demo = tmp_path / "demo"
    assert cli(tmp_path, "demo", str(demo)).returncode == 0
    suite = demo / "suites" / "code"
    reward = demo / "suites" / "reward.py"  # the demo's suites share one reward file
    if where == "import":
        reward.write_text(reward.read_text() + "\nimport sys\nsys.exit(3)\n")
    else:
        reward.write_text(
            reward.read_text() + "\n\ndef code_reward(prompts, completions, **kw):\n    import sys\n    sys.exit(3)\n"
        )
    line = refused(cli(tmp_path, "eval", str(demo / "base"), "--suite", str(suite), "--limit", "1"), "sys.exit(3)")
    assert "reward.py" in line or "code_reward" in line
    shutil.rmtree(demo)
