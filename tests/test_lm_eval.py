"""lm-eval tasks as suites: the score equals lm-eval's own command line on the same model and task."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")
pytest.importorskip("transformers")

from ram_desktop.core import InputError
from ram_desktop.evaluate.lm_eval_tasks import open_task, score_model

from .subproc import cli

DATA = Path(__file__).resolve().parent / "data" / "lm_eval"
TASKS = ("toy_code_mc", "toy_code_gen")


@pytest.fixture(scope="module")
def tasks_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tasks")
    for task in TASKS:
        text = (DATA / f"{task}.yaml.in").read_text().replace("@DATA@", str(DATA / "toy_code.jsonl"))
        (folder / f"{task}.yaml").write_text(text)
    return folder


@pytest.fixture(scope="module")
def coder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("demo")
    assert cli(root, "demo", str(root / "demo")).returncode == 0
    return root / "demo" / "coder"


def test_an_unknown_task_is_refused_naming_the_closest(tasks_dir):
    with pytest.raises(InputError, match="unknown lm-eval task 'toy_code_m'.*toy_code_mc"):
        open_task("lm-eval:toy_code_m", [tasks_dir])
    with pytest.raises(InputError, match="no such folder"):
        open_task("lm-eval:toy_code_mc", [tasks_dir / "missing"])


def test_scores_equal_lm_evals_own_command_line(tasks_dir, coder, tmp_path):
    tasks = [open_task(f"lm-eval:{t}", [tasks_dir]) for t in TASKS]
    ours = score_model(coder, tasks, device="cpu", batch_size=8)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "lm_eval",
            "run",
            "--model",
            "hf",
            "--model_args",
            f"pretrained={coder},dtype=auto",
            "--tasks",
            ",".join(TASKS),
            "--include_path",
            str(tasks_dir),
            "--device",
            "cpu",
            "--batch_size",
            "8",
            "--output_path",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (written,) = (tmp_path / "out").rglob("results_*.json")
    theirs = json.loads(written.read_text())["results"]
    assert [s.metric for s in ours] == ["acc,none", "exact_match,none"]
    for score in ours:
        assert score.score == theirs[score.task][score.metric], score.task
        assert len(score.per_example) == 24
        assert sum(score.per_example) / 24 == pytest.approx(score.score, abs=1e-12)


def test_an_lm_eval_suite_through_ram_merge_eval(tasks_dir, coder, tmp_path):
    """``--suite lm-eval:TASK --include-path DIR`` beside a suite of our own: the task's column is lm-eval's main
    metric, its per-example values make the ram-eval/2 interval, and the JSONL suite is scored as ever."""
    out = tmp_path / "eval.json"
    suite = coder.parent / "suites" / "code"
    done = cli(
        tmp_path,
        "eval",
        str(coder),
        "--suite",
        "lm-eval:toy_code_mc",
        str(suite),
        "--include-path",
        str(tasks_dir),
        "--limit",
        "8",
        "--json",
        str(out),
        "--device",
        "cpu",
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads(out.read_text())
    assert [s["name"] for s in data["suites"]] == ["toy_code_mc", "code-test"]
    assert data["suites"][0]["source"] == "lm-eval:toy_code_mc" and data["suites"][0]["examples"] == 8
    (expected,) = score_model(coder, [open_task("lm-eval:toy_code_mc", [tasks_dir])], "cpu", 8, 8)
    assert data["scores"][0][0] == expected.score
    assert data["per_example"][0][0] == expected.per_example
    low, high = data["intervals"][0][0]
    assert low <= expected.score <= high
    refused = cli(tmp_path, "eval", str(coder), "--suite", "lm-eval:no_such_task", "--include-path", str(tasks_dir))
    assert refused.returncode == 2 and "unknown lm-eval task 'no_such_task'" in refused.stderr


def test_search_opens_lm_eval_tasks_before_any_merge(tasks_dir, coder, tmp_path):
    """``ram-merge search`` reads ``lm-eval:TASK`` with ``--include-path`` as eval does: an unknown task is refused
    before the study or any merge exists."""
    demo = coder.parent
    done = cli(
        tmp_path,
        "search",
        str(demo / "base"),
        str(coder),
        "--suite",
        "lm-eval:toy_code_mcq",
        "--include-path",
        str(tasks_dir),
        "--trials",
        "2",
        "--out",
        str(tmp_path / "study"),
    )
    assert done.returncode == 2, done.stderr
    assert "unknown lm-eval task 'toy_code_mcq'; did you mean toy_code_mc" in done.stderr
    assert not (tmp_path / "study").exists()
