"""Loading suites: the JSONL file, suite.yaml, the folder form, and every bad input (file and line named)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ram_desktop.core.errors import InputError
from ram_desktop.evaluate import load_suite


def test_jsonl_file_with_suite_yaml_beside_it(tmp_path):
    data = tmp_path / "math.jsonl"
    data.write_text(
        '{"prompt": "2+3=", "answer": "5", "level": 1}\n\n   \n{"prompt": "7*6=", "answer": 42, "source": "gsm"}\n'
    )
    (tmp_path / "suite.yaml").write_text(
        "name: arithmetic\nscorer: number\nmax_new_tokens: 8\nchat_template: false\nsystem: Answer with a number.\n"
    )
    suite = load_suite(data)
    assert suite.name == "arithmetic" and suite.source == data.resolve() and suite.data_file == data.resolve()
    assert suite.prompts == ("2+3=", "7*6=")
    assert suite.columns == {"answer": ("5", 42), "level": (1, None), "source": (None, "gsm")}
    assert suite.lines == (1, 4)
    assert (suite.scorer, suite.max_new_tokens, suite.chat_template, suite.system) == (
        "number",
        8,
        "false",
        "Answer with a number.",
    )
    assert suite.config_file == (tmp_path / "suite.yaml").resolve()
    assert len(suite) == 2 and len(suite.head(1)) == 1 and suite.head(1).columns["source"] == (None,)
    assert suite.head(5) is suite


def test_defaults_without_suite_yaml(tmp_path):
    data = tmp_path / "tool-use.v2.jsonl"
    data.write_text('\ufeff{"prompt": "call the tool", "answer": "ok"}\n')
    suite = load_suite(data)
    assert suite.name == "tool-use.v2"
    assert (suite.scorer, suite.max_new_tokens, suite.chat_template, suite.system) == ("exact", 64, "auto", None)
    assert suite.config_file is None


def test_folder_form_and_its_suite_yaml(tmp_path):
    folder = tmp_path / "coder"
    folder.mkdir()
    (folder / "data.jsonl").write_text('{"prompt": "def f():", "answer": "pass"}\n')
    (folder / "suite.yaml").write_text("scorer: contains\nchat_template: true\n")
    for given in (folder, folder / "suite.yaml", folder / "data.jsonl"):
        suite = load_suite(given)
        assert suite.name == "coder" and suite.scorer == "contains" and suite.chat_template == "true"
        assert suite.data_file == (folder / "data.jsonl").resolve()
    assert load_suite(folder).source == folder.resolve()


def test_with_scorer_checks_without_running(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"prompt": "a", "answer": "b"}\n')
    suite = load_suite(tmp_path / "d.jsonl")
    assert suite.with_scorer(" contains ").scorer == "contains"
    with pytest.raises(InputError, match="unknown scorer"):
        suite.with_scorer("nope")
    with pytest.raises(InputError, match="no such file"):
        suite.with_scorer("python:r.py:f")


def refused(path: Path, *fragments: str) -> str:
    with pytest.raises(InputError) as e:
        load_suite(path)
    message = str(e.value)
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return message


@pytest.mark.parametrize(
    "text, line, fragment",
    [
        ('{"prompt": "a", "answer": "b"}\n{"prompt": "c", "answer": }\n', 2, "not valid JSON"),
        ('{"prompt": "a"}\n\n{"prompt": "b"\n', 3, "not valid JSON"),
        ('{"prompt": "a"}\n["prompt", "b"]\n', 2, "expected a JSON object"),
        ('{"prompt": "a"}\n"just text"\n', 2, "expected a JSON object"),
        ('{"prompt": "a"}\n{"question": "b", "answer": "c"}\n', 2, 'no "prompt"'),
        ('{"prompt": 12, "answer": "c"}\n', 1, 'a "prompt" that is int'),
        ('{"prompt": ["a", "b"]}\n', 1, 'a "prompt" that is list'),
        ('{"prompt": "   "}\n', 1, "the prompt is empty"),
    ],
)
def test_bad_rows_name_file_and_line(tmp_path, text, line, fragment):
    data = tmp_path / "bad.jsonl"
    data.write_text(text)
    refused(data, f"{data.resolve()}, line {line}:", fragment)


def test_not_utf8_names_the_line(tmp_path):
    data = tmp_path / "bad.jsonl"
    data.write_bytes(b'{"prompt": "a"}\n{"prompt": "\xff\xfe"}\n')
    refused(data, f"{data.resolve()}, line 2:", "not UTF-8")


@pytest.mark.parametrize("text", ["", "\n\n  \n"])
def test_empty_suite(tmp_path, text):
    data = tmp_path / "empty.jsonl"
    data.write_text(text)
    refused(data, str(data.resolve()), "no examples")


def test_missing_paths(tmp_path):
    refused(tmp_path / "nope.jsonl", "nope.jsonl", "no such suite file or folder")
    (tmp_path / "folder").mkdir()
    refused(tmp_path / "folder", "needs data.jsonl")


@pytest.mark.parametrize(
    "yaml_text, line, fragment",
    [
        ("name: x\nscorrer: exact\n", 2, "scorrer: unknown key; a suite.yaml takes name, scorer"),
        ("max_new_tokens: 0\n", 1, "max_new_tokens: expected a whole number of at least 1"),
        ("name: a\nmax_new_tokens: lots\n", 2, "max_new_tokens: expected a whole number"),
        ("max_new_tokens: 1.5\n", 1, "max_new_tokens: expected a whole number"),
        ("chat_template: maybe\n", 1, "chat_template: expected auto, true or false"),
        ("name: [a, b]\n", 1, "name: expected text"),
        ("system: 3\n", 1, "system: expected text"),
        ("\n\nscorer: fuzzy\n", 3, "unknown scorer 'fuzzy'"),
        ("scorer: python:nowhere.py:f\n", 1, "no such file"),
        ("scorer: 'regex:(a'\n", 1, "not a valid regular expression"),
        (
            "name: a\nscorer_timeout: 0\n",
            2,
            "scorer_timeout: a python scorer's time limit per batch: expected a number",
        ),
        ("scorer_timeout: soon\n", 1, "scorer_timeout: a python scorer's time limit per batch: expected a number"),
        ("scorer_timeout: .nan\n", 1, "scorer_timeout: a python scorer's time limit per batch: expected a number"),
    ],
)
def test_bad_suite_yaml_names_file_and_line(tmp_path, yaml_text, line, fragment):
    (tmp_path / "data.jsonl").write_text('{"prompt": "a", "answer": "b"}\n')
    (tmp_path / "suite.yaml").write_text(yaml_text)
    refused(tmp_path, f"{(tmp_path / 'suite.yaml').resolve()}, line {line}:", fragment)


def test_scorer_timeout_is_read_from_suite_yaml(tmp_path):
    (tmp_path / "data.jsonl").write_text('{"prompt": "a", "answer": "b"}\n')
    assert load_suite(tmp_path).scorer_timeout == 60
    (tmp_path / "suite.yaml").write_text("scorer_timeout: 2.5\n")
    assert load_suite(tmp_path).scorer_timeout == 2.5


@pytest.mark.parametrize(
    "yaml_text, fragment",
    [
        ("name: [unclosed\n", "not valid YAML"),
        ("- a\n- b\n", "expected keys such as name: and scorer:, found list"),
    ],
)
def test_suite_yaml_that_is_not_a_mapping(tmp_path, yaml_text, fragment):
    (tmp_path / "data.jsonl").write_text('{"prompt": "a", "answer": "b"}\n')
    (tmp_path / "suite.yaml").write_text(yaml_text)
    refused(tmp_path, str((tmp_path / "suite.yaml").resolve()), fragment)


def test_chat_template_accepts_yaml_booleans_and_words(tmp_path):
    (tmp_path / "data.jsonl").write_text('{"prompt": "a", "answer": "b"}\n')
    for text, expected in (("true", "true"), ("no", "false"), ("'AUTO'", "auto"), ("False", "false")):
        (tmp_path / "suite.yaml").write_text(f"chat_template: {text}\n")
        assert load_suite(tmp_path).chat_template == expected


def test_name_is_taken_as_written(tmp_path):
    (tmp_path / "data.jsonl").write_text('{"prompt": "a", "answer": "b"}\n')
    for text, expected in (("2024", "2024"), ("true", "true"), ("'007'", "007"), ("1.50", "1.50")):
        (tmp_path / "suite.yaml").write_text(f"name: {text}\n")
        assert load_suite(tmp_path).name == expected
