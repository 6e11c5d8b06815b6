"""``ram-merge search`` on the built-in demo, in fresh processes: the study in DIR/study.db, search.json,
best/ tested beside the defaults; a rerun continues without repeating a trial, a killed run resumes; bad
input is one line and nothing lost; trials as Ray tasks on a local Ray with 2 workers."""

from __future__ import annotations

import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("optuna")

from .subproc import cli, refused

LIMIT = "6"  # examples per suite: trials stay quick; the demo's agents still differ on them


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    from ram_desktop.core.demo import write_demo

    folder = tmp_path_factory.mktemp("demo")
    write_demo(folder)
    return folder


def sources(demo: Path) -> list[str]:
    return [str(demo / n) for n in ("base", "coder", "tool", "memory")]


def args(demo: Path, out: Path, trials: int, *more: str) -> list[str]:
    return search_command(demo, out, trials, sources(demo), *more)


def search_command(demo: Path, out: Path, trials: int, inputs: Sequence[str], *more: str) -> list[str]:
    """``ram-merge search`` of ``inputs`` (sources, or ``--recipe FILE`` and what goes with it) on the demo's
    validation suites, kept quick; ``more`` after the rest."""
    validation = [str(demo / "suites" / "validation" / t) for t in ("code", "tool", "memory")]
    return [
        "search",
        *inputs,
        "--suite",
        *validation,
        "--trials",
        str(trials),
        "--out",
        str(out),
        "--limit",
        LIMIT,
        "--batch-size",
        "16",
        *more,
    ]


def completed(db: Path) -> list[tuple[int, str, str]]:
    """(number, state, params) of every trial, read straight from Optuna's tables."""
    con = sqlite3.connect(db)
    try:
        rows = con.execute("SELECT t.number, t.state, t.trial_id FROM trials t ORDER BY t.number").fetchall()
        out = []
        for number, state, trial_id in rows:
            params = con.execute(
                "SELECT param_name, param_value FROM trial_params WHERE trial_id = ? ORDER BY param_name", (trial_id,)
            ).fetchall()
            out.append((number, state, json.dumps(params)))
        return out
    finally:
        con.close()


def test_search_finds_a_merge_at_least_as_good_as_ram_plus_and_continues_without_repeating(demo, tmp_path):
    out = tmp_path / "search"
    tests = [str(demo / "suites" / t) for t in ("code", "tool", "memory")]
    done = cli(
        tmp_path, *args(demo, out, 4, "--methods", "ram-plus,task-arithmetic,ties", "--test-suite", *tests), timeout=600
    )
    assert done.returncode == 0, done.stderr
    data = json.loads((out / "search.json").read_text())
    trials = data["trials"]
    assert [t["number"] for t in trials] == [0, 1, 2, 3]
    assert {t["method"] for t in trials} <= {"ram-plus", "task-arithmetic", "ties"}
    assert trials[0]["method"] == "ram-plus" and trials[0]["params"] == {"r": 0.1, "alpha": 2.0}  # the default first
    for t in trials:
        assert set(t) >= {"number", "method", "params", "validation", "seconds"}
        assert math.isclose(t["validation"], sum(t["scores"]) / 3)
    best = data["best"]
    assert best["validation"] == max(t["validation"] for t in trials) >= trials[0]["validation"]
    assert (best["method"], best["params"]) in [(t["method"], t["params"]) for t in trials]
    assert best["test_interval"][0] <= best["test"] <= best["test_interval"][1]
    assert [r["name"] for r in data["reference"]] == ["RAM+", "Task Arithmetic"]
    assert data["reference"][0]["params"] == {"r": 0.1, "alpha": 2.0}
    assert data["reference"][0]["validation"] == trials[0]["validation"] <= best["validation"]
    assert [d["versus"] for d in data["differences"]] == ["RAM+", "Task Arithmetic"]
    for ref, diff in zip(data["reference"], data["differences"]):
        assert math.isclose(diff["difference"], best["test"] - ref["test"], abs_tol=1e-9)
    recipe = (out / "best" / "ram-recipe.yaml").read_text()
    assert best["method"] in recipe and (out / "best" / "README.md").is_file()
    assert sorted(p.name for p in out.iterdir()) == ["best", "search.json", "study.db"]  # no trial folder left
    assert "best:" in done.stdout and "RAM+" in done.stdout

    before = completed(out / "study.db")
    again = cli(tmp_path, *args(demo, out, 6, "--methods", "ram-plus,task-arithmetic,ties"), timeout=600)
    assert again.returncode == 0, again.stderr
    after = completed(out / "study.db")
    assert after[: len(before)] == before  # the earlier trials untouched
    assert [n for n, *_ in after] == list(range(6)) and all(s == "COMPLETE" for _, s, _ in after)
    data = json.loads((out / "search.json").read_text())
    assert [t["number"] for t in data["trials"]] == list(range(6))
    earlier = [(t["method"], t["params"]) for t in data["trials"][:4]]
    assert all((t["method"], t["params"]) not in earlier for t in data["trials"][4:])  # the sampler went on


def test_a_killed_search_resumes_losing_at_most_the_trial_in_flight(demo, tmp_path):
    out = tmp_path / "search"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAM_DESKTOP_", "PYTEST"))}
    command = [sys.executable, "-m", "ram_desktop", "-q", *args(demo, out, 8, "--methods", "task-arithmetic,ties")]
    proc = subprocess.Popen(command, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if (out / "study.db").exists():
                try:
                    if sum(s == "COMPLETE" for _, s, _ in completed(out / "study.db")) >= 2:
                        break
                except sqlite3.Error:
                    pass
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    before = [t for t in completed(out / "study.db") if t[1] == "COMPLETE"]
    assert 2 <= len(before) < 8
    resumed = cli(tmp_path, *args(demo, out, 8, "--methods", "task-arithmetic,ties"), timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    trials = completed(out / "study.db")
    finished = [t for t in trials if t[1] == "COMPLETE"]
    assert finished[: len(before)] == before and len(finished) == 8
    assert all(state in ("COMPLETE", "FAIL") for _, state, _ in trials)
    assert sum(state == "FAIL" for _, state, _ in trials) <= 1  # at most the one in flight was lost
    data = json.loads((out / "search.json").read_text())
    assert [t["number"] for t in data["trials"]] == [n for n, _, _ in finished]


def test_bad_input_is_one_line_and_nothing_is_written(demo, tmp_path):
    out = tmp_path / "search"
    refused(cli(tmp_path, *args(demo, out, 2, "--methods", "")), "no methods")
    refused(cli(tmp_path, *args(demo, out, 2, "--methods", "ram-plus,nonsense")), "nonsense")
    refused(cli(tmp_path, *args(demo, out, 0)), "--trials")
    refused(cli(tmp_path, *args(demo, out, 2, "--ray", "127.0.0.1:9")), "does not answer")
    assert not out.exists()


def test_a_suite_that_scores_every_merge_the_same_is_refused(demo, tmp_path):
    suite = tmp_path / "flat"
    suite.mkdir()
    rows = [{"prompt": f"code: x={i};x=x+1;x =", "answer": "never"} for i in range(4)]
    (suite / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (suite / "suite.yaml").write_text("name: flat\nscorer: exact\nmax_new_tokens: 3\nchat_template: false\n")
    out = tmp_path / "search"
    done = cli(
        tmp_path,
        "search",
        *sources(demo),
        "--suite",
        str(suite),
        "--trials",
        "6",
        "--out",
        str(out),
        "--methods",
        "task-arithmetic,ties",
        timeout=600,
    )
    refused(done, "cannot tell these merges apart")
    assert len([t for t in completed(out / "study.db") if t[1] == "COMPLETE"]) == 5  # the trials are kept


def test_a_study_of_other_sources_is_refused_naming_the_difference(demo, tmp_path):
    out = tmp_path / "search"
    done = cli(tmp_path, *args(demo, out, 1, "--methods", "average"), timeout=600)
    assert done.returncode == 0, done.stderr
    before = (out / "study.db").read_bytes()
    other = args(demo, out, 2, "--methods", "average")
    other.remove(str(demo / "memory"))
    refused(cli(tmp_path, *other), "belongs to another search", "agents")
    assert (out / "study.db").read_bytes() == before
    refused(cli(tmp_path, *args(demo, out, 2, "--methods", "average", "--seed", "3")), "seed")
    assert (out / "study.db").read_bytes() == before


def test_trials_run_as_ray_tasks_on_a_local_ray(demo, tmp_path):
    pytest.importorskip("ray")
    out = tmp_path / "search"
    done = cli(
        tmp_path,
        *args(demo, out, 3, "--methods", "task-arithmetic,ties", "--ray", "local", "--workers", "2"),
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads((out / "search.json").read_text())
    assert [t["number"] for t in data["trials"]] == [0, 1, 2]
    assert all(t["seconds"] > 0 for t in data["trials"])
    # the same merges scored here give the same validation scores as in the Ray workers
    here = cli(
        tmp_path, *args(demo, tmp_path / "here", 3, "--methods", "task-arithmetic,ties", "--workers", "2"), timeout=600
    )
    assert here.returncode == 0, here.stderr
    local = {
        json.dumps([t["method"], t["params"]]): t["validation"]
        for t in json.loads((tmp_path / "here" / "search.json").read_text())["trials"]
    }
    for t in data["trials"]:
        key = json.dumps([t["method"], t["params"]])
        if key in local:
            assert t["validation"] == pytest.approx(local[key], abs=1e-9)


def test_ctrl_c_keeps_the_finished_trials(demo, tmp_path):
    out = tmp_path / "search"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAM_DESKTOP_", "PYTEST"))}
    command = [sys.executable, "-m", "ram_desktop", "-q", *args(demo, out, 8, "--methods", "task-arithmetic,ties")]
    proc = subprocess.Popen(
        command, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if (out / "study.db").exists() and any(s == "COMPLETE" for _, s, _ in completed(out / "study.db")):
                    break
            except sqlite3.Error:
                pass
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert proc.returncode == 130 and len(lines) == 1 and "finished trials kept" in lines[0], stderr
    trials = completed(out / "study.db")
    assert any(s == "COMPLETE" for _, s, _ in trials) and not any(s == "RUNNING" for _, s, _ in trials)
