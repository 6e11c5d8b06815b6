"""``ram-merge search`` with Fisher merging, in fresh processes on the demo: given per-agent calibration suites
(``--fisher-suite``, or a recipe's ``suite``), each agent's Fisher is estimated once before the trials (into the
cache ``ram-merge merge`` uses) and Fisher is searched like any other method; ``DIR/best`` of a Fisher trial
holds what ``ram-merge merge``/``run`` makes of its parameters with the same suites. Without suites Fisher is
refused in one line naming the flag, and a study resumed with other suites is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

pytest.importorskip("transformers")
pytest.importorskip("optuna")

from .subproc import cli, refused
from .test_search import search_command, sources
from .test_search_spec import assert_same_model

AGENTS = ("coder", "tool", "memory")
EXAMPLES = "2"  # calibration examples per agent: the estimates stay quick


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    from ram_desktop.core.demo import write_demo

    folder = tmp_path_factory.mktemp("demo")
    write_demo(folder)
    return folder


def calibration_suites(demo: Path) -> list[str]:
    """Each agent's calibration suite: its own task's test suite, in agent order."""
    return [str(demo / "suites" / task) for task in ("code", "tool", "memory")]


def cached_estimates(tmp_path: Path) -> list[Path]:
    """The Fisher estimates in the cache of the processes ``cli`` starts (``RAM_DESKTOP_CACHE`` under tmp_path)."""
    root = tmp_path / "ram-cache" / "fisher"
    return sorted(p for p in root.iterdir() if (p / "fisher.json").is_file()) if root.is_dir() else []


def test_fisher_is_searched_with_suites_and_best_is_what_merge_makes(demo, tmp_path):
    suites = calibration_suites(demo)
    out = tmp_path / "search"
    flags = ["--fisher-suite", ",".join(suites), "--examples", EXAMPLES]
    done = cli(
        tmp_path,
        *search_command(demo, out, 2, sources(demo), "--methods", "task-arithmetic,fisher", *flags),
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads((out / "search.json").read_text())
    assert [t["method"] for t in data["trials"]] == ["task-arithmetic", "fisher"]
    fisher_trial = data["trials"][1]
    assert fisher_trial["params"]["suite"] == suites and fisher_trial["params"]["examples"] == int(EXAMPLES)
    assert data["space"]["fisher"] == ["scale 0.1 to 1 (paper range)"]  # examples and suites are not searched
    estimates = cached_estimates(tmp_path)  # one per agent, made once before the trials
    assert len(estimates) == len(AGENTS)
    infos = [json.loads((e / "fisher.json").read_text()) for e in estimates]
    assert sorted(i["suite"]["source"] for i in infos) == sorted(suites)
    assert all(i["examples"] == int(EXAMPLES) for i in infos)

    best = data["best"]
    reference = ["merge", *sources(demo), "--out", str(tmp_path / "reference"), "--method", best["method"]]
    if best["method"] == "fisher":
        reference += ["--scale", repr(best["params"]["scale"]), *flags]
    else:
        reference += ["--scale", repr(best["params"]["scale"])]
    ran = cli(tmp_path, *reference)
    assert ran.returncode == 0, ran.stderr
    assert_same_model(out / "best", tmp_path / "reference")
    assert cached_estimates(tmp_path) == estimates  # the merge took them from the cache


def recipe(demo: Path, suites: list[str], scale: float = 0.5) -> dict:
    return {
        "format": "ram-recipe/2",
        "method": "fisher",
        "parameters": {"scale": scale, "examples": int(EXAMPLES), "suite": dict(zip(AGENTS, suites))},
        "base": str(demo / "base"),
        "agents": [{"name": n, "source": str(demo / n)} for n in AGENTS],
    }


def write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_a_fisher_recipe_starts_the_search_and_best_is_what_run_makes_of_it(demo, tmp_path):
    """Fisher searched alone from a recipe whose suites are its ``suite`` parameter: the one trial is the
    recipe's merge, so DIR/best holds what ``ram-merge run`` makes of the recipe; a resume with other suites
    is refused before anything is estimated or merged."""
    suites = calibration_suites(demo)
    file = write(tmp_path / "recipe.yaml", recipe(demo, suites))
    out = tmp_path / "search"
    done = cli(tmp_path, *search_command(demo, out, 1, ["--recipe", str(file)], "--methods", "fisher"), timeout=600)
    assert done.returncode == 0, done.stderr
    data = json.loads((out / "search.json").read_text())
    (trial,) = data["trials"]
    assert trial["method"] == "fisher" and trial["params"]["scale"] == 0.5
    ran = cli(tmp_path, "run", str(file), "--out", str(tmp_path / "reference"))
    assert ran.returncode == 0, ran.stderr
    assert_same_model(out / "best", tmp_path / "reference")
    assert len(cached_estimates(tmp_path)) == len(AGENTS)

    before = (out / "study.db").read_bytes()
    other = write(tmp_path / "other.yaml", recipe(demo, suites[::-1]))
    again = search_command(demo, out, 2, ["--recipe", str(other)], "--methods", "fisher")
    refused(cli(tmp_path, *again), "belongs to another search: its calibration")
    assert (out / "study.db").read_bytes() == before
    assert len(cached_estimates(tmp_path)) == len(AGENTS)  # nothing estimated for the other suites


def test_fisher_without_suites_is_refused_in_one_line(demo, tmp_path):
    out = tmp_path / "search"
    suites = calibration_suites(demo)
    line = refused(cli(tmp_path, *search_command(demo, out, 1, sources(demo), "--methods", "fisher")), "--fisher-suite")
    merge_line = refused(cli(tmp_path, "merge", *sources(demo), "--out", str(tmp_path / "m"), "--method", "fisher"))
    assert line == merge_line  # the words merge uses
    two = ",".join(suites[:2])
    refused(
        cli(tmp_path, *search_command(demo, out, 1, sources(demo), "--fisher-suite", two)), "--fisher-suite", "2 values"
    )
    refused(
        cli(tmp_path, *search_command(demo, out, 1, sources(demo), "--methods", "ties", "--fisher-suite", two)),
        "--fisher-suite",
        "--methods",
    )
    file = write(tmp_path / "recipe.yaml", recipe(demo, suites))
    with_recipe = search_command(demo, out, 1, ["--recipe", str(file)], "--fisher-suite", ",".join(suites))
    refused(cli(tmp_path, *with_recipe), "--fisher-suite with --recipe")
    assert not out.exists() and not (tmp_path / "m").exists() and cached_estimates(tmp_path) == []
