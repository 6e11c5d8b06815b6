"""Scorers on known completions, the TRL reward-function form, and scorers that misbehave."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from ram_desktop.core.errors import InputError
from ram_desktop.evaluate import load_suite, make_scorer, parse_scorer


def write_suite(folder: Path, rows: list[dict], yaml_text: str | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if yaml_text is not None:
        (folder / "suite.yaml").write_text(yaml_text)
    return folder


def rewards(spec: str, completions: list[str], answers: list) -> list[float]:
    return make_scorer(spec)(["p"] * len(completions), completions, answer=answers)


def test_exact_strips_whitespace_and_compares_text():
    assert rewards(
        "exact", ["  5\n", "5.0", "five", "5", "Paris", "paris"], ["5", "5", "5", 5, " Paris ", "Paris"]
    ) == [1, 0, 0, 1, 1, 0]


def test_exact_list_answer_accepts_any_item():
    assert rewards("exact", ["cat", "dog", "cow"], [["cat", "dog"], ["cat", "dog"], ["cat", "dog"]]) == [1, 1, 0]


def test_contains_finds_the_stripped_answer_anywhere():
    assert rewards(
        "contains", ["the answer is 42.", "4 2", "answer: Paris!", "no"], ["42", "42", "  Paris ", "yes"]
    ) == [1, 0, 1, 0]


def test_regex_is_a_full_match_of_the_stripped_completion():
    scorer = make_scorer(r"regex:\d+")
    assert scorer(["a"] * 5, ["123", " 42 \n", "12a", "a12", ""]) == [1, 1, 0, 0, 0]
    assert make_scorer("regex:yes|no")(["a"] * 3, ["yes", "no", "yes no"]) == [1, 1, 0]


@pytest.mark.parametrize(
    "completion, answer, expected",
    [
        ("The answer is 1,000 apples", 1000, 1),
        ("x = -2.50 then 7", "-2.5", 1),
        ("3 then 4", 4, 0),  # the first number counts
        ("no numbers here", 0, 0),
        ("1e3", "1000", 1),
        ("0.1", 0.1, 1),
        ("it costs 12,5 euros", 12.5, 0),  # "12,5" is 12 then 5
        (".5 of it", "0.5", 1),
        ("answer: 72", "72.0", 1),
        ("answer: 72", 73, 0),
    ],
)
def test_number_compares_the_first_number(completion, answer, expected):
    assert rewards("number", [completion], [answer]) == [expected]


def test_trl_reward_function_receives_every_extra_column(tmp_path):
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "rewards.py").write_text(
        "import json, pathlib\n"
        "def accuracy(prompts, completions, **kwargs):\n"
        "    with open(pathlib.Path(__file__).with_name('calls.jsonl'), 'a') as f:\n"
        "        f.write(json.dumps({'prompts': prompts, 'completions': completions, 'kwargs': kwargs}) + '\\n')\n"
        "    return [float(len(c)) + (10.0 if c == str(a) else 0.0) for c, a in zip(completions, kwargs['answer'])]\n"
    )
    folder = write_suite(
        tmp_path / "s",
        [
            {"prompt": "2+3=", "answer": "5", "domain": "math", "level": 1},
            {"prompt": "capital of France?", "answer": "Paris", "domain": "geo", "tags": ["x", "y"]},
            {"prompt": "say hi", "answer": "hi", "level": 3},
        ],
        "scorer: python:rewards.py:accuracy\n",
    )
    suite = load_suite(folder)
    scorer = make_scorer(suite.scorer_spec)
    completions = ["5", "Lyon", "hi there"]
    assert scorer.score(suite, completions) == [11.0, 4.0, 8.0]
    calls = [json.loads(line) for line in (tmp_path / "s" / "calls.jsonl").read_text().splitlines()]  # in the child
    assert len(calls) == 1
    call = calls[0]
    assert call["prompts"] == ["2+3=", "capital of France?", "say hi"]
    assert call["completions"] == completions
    assert call["kwargs"] == {
        "answer": ["5", "Paris", "hi"],
        "domain": ["math", "geo", None],
        "level": [1, None, 3],
        "tags": [None, ["x", "y"], None],
    }


def test_python_scorer_runs_only_when_made(tmp_path):
    """Opening a suite (or parsing its scorer) never executes the file; make_scorer does."""
    marker = tmp_path / "ran"
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "side.py").write_text(
        f"open({str(marker)!r}, 'w').write('x')\n"
        "def f(prompts, completions, **kw):\n    return [0.0] * len(completions)\n"
    )
    folder = write_suite(tmp_path / "s", [{"prompt": "a"}], "scorer: python:side.py:f\n")
    suite = load_suite(folder)
    spec = suite.scorer_spec
    assert spec.kind == "python" and spec.file == (folder / "side.py").resolve() and spec.function == "f"
    assert str(spec.file) in spec.describe()
    assert not marker.exists()
    make_scorer(spec)
    assert marker.exists()


def test_python_scorer_may_return_numpy_or_tensor(tmp_path):
    (tmp_path / "r.py").write_text(
        "import numpy, torch\n"
        "def np_scores(prompts, completions, **kw):\n    return numpy.array([0.5] * len(completions))\n"
        "def torch_scores(prompts, completions, **kw):\n    return [torch.tensor(1.5) for _ in completions]\n"
    )
    suite = load_suite(write_suite(tmp_path / "s", [{"prompt": "a"}, {"prompt": "b"}]))
    assert make_scorer(f"python:{tmp_path / 'r.py'}:np_scores").score(suite, ["x", "y"]) == [0.5, 0.5]
    assert make_scorer(f"python:{tmp_path / 'r.py'}:torch_scores").score(suite, ["x", "y"]) == [1.5, 1.5]


@pytest.mark.parametrize(
    "body, fragment",
    [
        ("    raise KeyError('solution')\n", "raised KeyError: 'solution'"),
        ("    return [1.0]\n", "returned 1 scores for 3 completions"),
        ("    return [1.0, 'high', 0.0]\n", "returned 'high' as the score of example 2"),
        ("    return [1.0, None, 0.0]\n", "returned None as the score of example 2"),
        ("    return [1.0, float('nan'), 0.0]\n", "returned nan as the score of example 2"),
        ("    return 1.0\n", "returned float"),
    ],
)
def test_misbehaving_reward_function_names_suite_and_function(tmp_path, body, fragment):
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "bad.py").write_text("def reward(prompts, completions, **kw):\n" + body)
    suite = load_suite(
        write_suite(tmp_path / "s", [{"prompt": p} for p in "abc"], "name: mysuite\nscorer: python:bad.py:reward\n")
    )
    with pytest.raises(InputError) as e:
        make_scorer(suite.scorer_spec).score(suite, ["x", "y", "z"])
    message = str(e.value)
    assert "'mysuite'" in message and "function reward in" in message and "bad.py" in message
    assert fragment in message


@pytest.mark.parametrize(
    "source, fragment",
    [
        ("def other(prompts, completions, **kw):\n    return []\n", "has no function 'reward'"),
        ("reward = 3\n", "'reward' is not a function"),
        ("import not_a_module_anywhere\n", "loading the scorer module raised ModuleNotFoundError"),
        ("def reward(:\n", "loading the scorer module raised SyntaxError"),
    ],
)
def test_reward_module_that_cannot_load(tmp_path, source, fragment):
    (tmp_path / "r.py").write_text(source)
    with pytest.raises(InputError) as e:
        make_scorer(f"python:{tmp_path / 'r.py'}:reward")
    assert fragment in str(e.value) and "r.py" in str(e.value)


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ("", "empty scorer"),
        ("fuzzy", "unknown scorer 'fuzzy'"),
        ("regex:(unclosed", "not a valid regular expression"),
        ("python:rewards.py", "write a python scorer as python:FILE.py:FUNCTION"),
        ("python:rewards.txt:f", "write a python scorer as python:FILE.py:FUNCTION"),
        ("python:rewards.py:not-a-name", "write a python scorer as python:FILE.py:FUNCTION"),
        ("python:missing.py:f", "no such file"),
    ],
)
def test_bad_scorer_specs(tmp_path, spec, fragment):
    with pytest.raises(InputError) as e:
        parse_scorer(spec, tmp_path)
    assert fragment in str(e.value)


def test_builtin_scorer_refuses_rows_without_answer_naming_the_line(tmp_path):
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "data.jsonl").write_text('{"prompt": "a", "answer": "1"}\n\n{"prompt": "b"}\n')
    suite = load_suite(folder)
    with pytest.raises(InputError) as e:
        make_scorer("exact").check(suite)
    assert str(folder / "data.jsonl") + ", line 3" in str(e.value) and "answer" in str(e.value)
    (folder / "data.jsonl").write_text('{"prompt": "a", "answer": "1"}\n{"prompt": "b", "answer": "two"}\n')
    with pytest.raises(InputError) as e:
        make_scorer("number").check(load_suite(folder))
    assert ", line 2" in str(e.value) and "'two' is not a number" in str(e.value)
    make_scorer("regex:.*").check(load_suite(folder))  # needs no answer


def test_the_scorer_process_imports_neither_torch_nor_qt(tmp_path):
    """The child imports the standard library, the scorer module and what its file imports: it starts fast."""
    (tmp_path / "r.py").write_text(
        "import sys\n"
        "def heavy(prompts, completions, **kw):\n"
        "    return [float(sum(m in sys.modules for m in ('torch', 'transformers', 'PySide6', 'numpy')))]"
        " * len(completions)\n"
    )
    suite = load_suite(write_suite(tmp_path / "s", [{"prompt": "a"}]))
    assert make_scorer(f"python:{tmp_path / 'r.py'}:heavy").score(suite, ["x"]) == [0.0]


def test_cancelling_stops_a_scorer_that_hangs(tmp_path):
    """The reporter's cancellation is checked while the child runs: its process is killed at once."""
    from ram_desktop.core.errors import Cancelled
    from ram_desktop.evaluate.scorer_process import ScorerProcess

    (tmp_path / "r.py").write_text("import time\ndef slow(prompts, completions, **kw):\n    time.sleep(600)\n")
    suite = load_suite(write_suite(tmp_path / "s", [{"prompt": "a"}]))
    armed: list[float] = []  # cancel one second into the call (not while the file loads)

    def check() -> None:
        if armed and time.monotonic() - armed[0] > 1.0:
            raise Cancelled("cancelled")

    process = ScorerProcess(check)
    scorer = make_scorer(f"python:{tmp_path / 'r.py'}:slow", process=process, timeout=300)
    child = process._process
    start = time.monotonic()
    armed.append(start)
    with pytest.raises(Cancelled):
        scorer.score(suite, ["x"])
    assert time.monotonic() - start < 30 and child is not None and not child.is_alive()
    process.close()
