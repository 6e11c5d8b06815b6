"""Python scorers that hang, end their process, crash or raise, through a fresh ``ram-merge eval`` (and
``compare``) process: one ``error:`` line naming the model, suite and examples, exit 2, and the scores
finished before and after the failure kept in ``--json`` (docs/evaluate.md, Scorers; docs/contracts.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .subproc import cli
from .tinylm import write_tiny_lm

PROMPTS = ["What is 2 + 3?", "Say hello", "Repeat 42", "x", "def add(a, b):"]

# the reward functions: each does its damage on its second batch, so one batch was scored before
REWARDS = """
import os, signal, time
CALLS = {"n": 0}

def _second_batch():
    CALLS["n"] += 1
    return CALLS["n"] >= 2

def good(prompts, completions, **kw):
    return [float(len(c)) for c in completions]

def hang(prompts, completions, **kw):
    while _second_batch():
        time.sleep(0.05)
    return [1.0] * len(completions)

def exits(prompts, completions, **kw):
    if _second_batch():
        os._exit(0)
    return [1.0] * len(completions)

def raises(prompts, completions, **kw):
    if _second_batch():
        raise ValueError("no solution column")
    return [1.0] * len(completions)

def segfault(prompts, completions, **kw):
    if _second_batch():
        import ctypes
        ctypes.string_at(0)
    return [1.0] * len(completions)

def killed(prompts, completions, **kw):
    if _second_batch():
        os.kill(os.getpid(), signal.SIGKILL)
    return [1.0] * len(completions)
"""


@pytest.fixture(scope="module")
def lm(tmp_path_factory) -> Path:
    return write_tiny_lm(tmp_path_factory.mktemp("lm") / "tiny", chat_template=False, seed=0)


def write_suites(root: Path, function: str) -> tuple[Path, Path]:
    """A suite scored by ``good`` and one scored by ``function``, in one folder of scorer code."""
    (root / "code").mkdir(parents=True)
    (root / "code" / "rewards.py").write_text(REWARDS)
    suites = []
    for name, scorer in (("fine", "good"), ("broken", function)):
        folder = root / "code" / name
        folder.mkdir()
        (folder / "data.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
        (folder / "suite.yaml").write_text(
            f"name: {name}\nscorer: python:../rewards.py:{scorer}\nmax_new_tokens: 3\nscorer_timeout: 2\n"
        )
        suites.append(folder)
    return suites[0], suites[1]


def error_line(stderr: str) -> str:
    """The one ``error:`` line; besides it only the first-run ``note:`` naming the scorer folder."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    notes = [line for line in lines if line.startswith("note: ")]
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and len(notes) + 1 == len(lines) and "Traceback" not in stderr, stderr
    return errors[0]


@pytest.mark.parametrize(
    "function, words",
    [
        ("hang", "did not return within 2 s and was stopped"),
        ("exits", "ended its process (exit code 0)"),
        ("raises", "raised ValueError: no solution column"),
        ("segfault", "crashed its process (SIGSEGV)"),
        ("killed", "crashed its process (SIGKILL)"),
    ],
)
def test_failing_scorer_is_reported_and_the_finished_scores_are_written(lm, tmp_path, function, words):
    fine, broken = write_suites(tmp_path, function)
    out = tmp_path / "eval.json"
    done = cli(
        tmp_path,
        "eval",
        str(lm),
        str(lm),
        "--names",
        "first,second",
        "--suite",
        str(fine),
        str(broken),
        "--batch-size",
        "2",
        "--json",
        str(out),
        timeout=90,
    )
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    line = error_line(done.stderr)
    for fragment in (
        "model first",
        "suite 'broken'",
        f"function {function} in",
        "rewards.py",
        words,
        "examples ",
        "lines ",
        f"the finished scores are in {out}",
    ):
        assert fragment in line, (fragment, line)
    data = json.loads(out.read_text())
    # the suite before the failure is scored for both models; the broken one for neither
    assert [row[0] is not None for row in data["scores"]] == [True, True]
    assert [row[1] for row in data["scores"]] == [None, None]
    assert len(data["failures"]) == 1
    assert data["failures"][0]["model"] == "first" and data["failures"][0]["suite"] == "broken"
    assert words in data["failures"][0]["error"]
    assert "failed" in done.stdout  # the table marks the suite that was not scored


def test_a_hanging_scorer_stops_compare_and_keeps_its_merges(tmp_path):
    demo = tmp_path / "demo"
    assert cli(tmp_path, "demo", str(demo)).returncode == 0
    fine, broken = write_suites(tmp_path / "suites", "hang")
    out = tmp_path / "cmp"
    done = cli(
        tmp_path,
        "compare",
        str(demo / "base"),
        str(demo / "coder"),
        str(demo / "tool"),
        "--out",
        str(out),
        "--variant",
        "average",
        "--suite",
        str(fine),
        "--suite",
        str(broken),
        "--batch-size",
        "2",
        "--scorer-timeout",
        "1.5",
        timeout=120,
    )
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    line = error_line(done.stderr)
    assert "suite 'broken'" in line and "did not return within 1.5 s" in line and "compare.json" in line, line
    data = json.loads((out / "compare.json").read_text())
    assert [v["name"] for v in data["variants"]] == ["average"]
    assert (out / "average" / "merge-report.json").is_file()
    assert all(row[0] is not None and row[1] is None for row in data["scores"])
    assert data["failures"][0]["suite"] == "broken"


def test_first_run_from_a_folder_is_named_once(lm, tmp_path):
    fine, _ = write_suites(tmp_path, "good")
    first = cli(tmp_path, "eval", str(lm), "--suite", str(fine))
    assert first.returncode == 0, first.stderr
    notes = [line for line in first.stderr.splitlines() if line.startswith("note: ")]
    assert len(notes) == 1 and str((tmp_path / "code").resolve()) in notes[0] and "rewards.py" in notes[0], notes
    again = cli(tmp_path, "eval", str(lm), "--suite", str(fine))
    assert again.returncode == 0 and "note:" not in again.stderr, again.stderr


def test_the_demo_suites_run_without_a_note(tmp_path):
    demo = tmp_path / "demo"
    assert cli(tmp_path, "demo", str(demo)).returncode == 0
    done = cli(tmp_path, "eval", str(demo / "base"), "--suite", str(demo / "suites" / "code"), "--limit", "4")
    assert done.returncode == 0 and "note:" not in done.stderr, done.stderr


@pytest.mark.parametrize("value", ["0", "nan"])
def test_bad_scorer_timeout_is_refused_before_work(lm, tmp_path, value):
    fine, _ = write_suites(tmp_path, "good")
    done = cli(tmp_path, "eval", str(lm), "--suite", str(fine), "--scorer-timeout", value)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1 and "--scorer-timeout" in lines[0], done.stderr
