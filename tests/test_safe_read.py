"""core.storage.safe_read, the one reader of user files: regular files only (a FIFO never blocks), UTF-8, JSON
without repeated keys or deep nesting, YAML without aliases (a "billion laughs" costs nothing)."""

from __future__ import annotations

import os
import threading
import time

import pytest

from ram_desktop.core.errors import InputError
from ram_desktop.core.storage import safe_read


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "model.safetensors"
    os.mkfifo(fifo)
    result = []

    def attempt():
        try:
            safe_read.read_bytes(fifo)
        except InputError as e:
            result.append(str(e))

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert not worker.is_alive(), "reading a FIFO blocked"
    assert result and "named pipe (FIFO), not a file" in result[0] and str(fifo) in result[0]
    with pytest.raises(InputError, match="named pipe"):
        safe_read.check_regular(fifo)


def test_a_folder_and_a_missing_file_are_named(tmp_path):
    with pytest.raises(InputError, match="folder"):
        safe_read.read_text(tmp_path)
    with pytest.raises(InputError, match="nope.json"):
        safe_read.read_json(tmp_path / "nope.json")


def test_a_file_larger_than_its_kind_holds_is_refused_unread(tmp_path):
    f = tmp_path / "runtime.json"
    f.write_bytes(b" " * 5000)
    assert safe_read.read_bytes(f, max_bytes=5000) == b" " * 5000
    with pytest.raises(InputError, match=r"runtime.json: holds more than 4,999 bytes"):
        safe_read.read_bytes(f, max_bytes=4999)


def test_text_must_be_utf8(tmp_path):
    f = tmp_path / "recipe.yaml"
    f.write_bytes(b"method: ram\nbase: caf\xe9\n")
    with pytest.raises(InputError, match="UTF-8"):
        safe_read.read_yaml(f)


def test_json_repeated_keys_and_depth(tmp_path):
    assert safe_read.parse_json('{"a": [1, {"b": 2}]}', "x") == {"a": [1, {"b": 2}]}
    with pytest.raises(InputError, match="the key .w. appears twice"):
        safe_read.parse_json('{"w": 1, "w": 2}', "header")
    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(InputError, match="nest"):
        safe_read.parse_json(deep, "index")
    at_limit = "[" * safe_read.MAX_JSON_DEPTH + "]" * safe_read.MAX_JSON_DEPTH
    safe_read.parse_json(at_limit, "fine")
    with pytest.raises(InputError, match="nest"):
        safe_read.parse_json("[" + at_limit + "]", "one too deep")


def test_yaml_aliases_are_refused_before_they_expand(tmp_path):
    laughs = ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, 10):
        prev, cur = chr(ord("a") + i - 1), chr(ord("a") + i)
        laughs.append(
            f"{cur}: &{cur} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]"
        )
    f = tmp_path / "bomb.yaml"
    f.write_text("\n".join(laughs) + "\n")
    start = time.perf_counter()
    with pytest.raises(InputError, match="aliases expand to more than"):
        safe_read.read_yaml(f)
    assert time.perf_counter() - start < 5
    assert safe_read.parse_yaml("method: ram\nagents: [a, b]\n", "x") == {"method": "ram", "agents": ["a", "b"]}


def test_a_few_aliases_are_fine():
    text = "base: &b /models/base\nagents:\n- *b\n- {name: x, source: *b}\n"
    assert safe_read.parse_yaml(text, "x") == {
        "base": "/models/base",
        "agents": ["/models/base", {"name": "x", "source": "/models/base"}],
    }
