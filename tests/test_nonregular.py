"""Non-regular files where a weights or JSON file should be (issue 22): a FIFO, a device, a socket or a
folder named like the file is refused with one ``error:`` line naming it, before anything is opened for
reading; on ba1bdff a FIFO named ``model.safetensors`` hung probe and merge forever. Every case runs the
real CLI in a fresh process with a time limit, so a hang fails the test. Also here: JSON nested 100k
deep in an index or a suite line, JSON files with repeated keys or not UTF-8, and OS errors while
reading (EACCES, EIO: simulated by patching in the subprocess, since the tests run as root)."""

from __future__ import annotations

import json
import os
import socket
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from ram_desktop.core.errors import InputError

from .conftest import make_models, tree_snapshot
from .subproc import cli, refused

TIMEOUT = 120  # a refused input takes a second or two; a FIFO read would block forever


def _merge(tmp_path: Path, base: Path, *agents: Path, command: str = "merge") -> str:
    """``command`` on base + agents in a fresh process: refused, nothing written, inputs untouched."""
    roots = [base.parent, *{a.parent for a in agents}]
    before = tree_snapshot(*roots)
    out = tmp_path / "out"
    extra = ["--out", str(out)] if command == "merge" else []
    done = cli(tmp_path, command, str(base), *map(str, agents), *extra, timeout=TIMEOUT)
    line = refused(done)
    assert not out.exists() and not list(tmp_path.glob("out.partial-*"))
    assert tree_snapshot(*roots) == before
    return line


def _replace_with_fifo(path: Path) -> Path:
    path.unlink()
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("command", ["probe", "merge"])
def test_fifo_named_model_safetensors_in_an_agent_folder(tmp_path, models, command):
    """ba1bdff: probe and merge hung forever (the glob for *.safetensors found the FIFO and opened it)."""
    base, agents = models
    fifo = _replace_with_fifo(agents[0] / "model.safetensors")
    line = _merge(tmp_path, base, agents[0], agents[1], command=command)
    assert str(fifo) in line and "named pipe (FIFO)" in line


def test_fifo_given_as_the_weights_file(tmp_path, models):
    base, agents = models
    fifo = tmp_path / "agent.safetensors"
    os.mkfifo(fifo)
    line = _merge(tmp_path, base, fifo, agents[1])
    assert str(fifo) in line and "named pipe" in line


def test_fifo_shard_of_a_sharded_checkpoint(tmp_path, sharded_models):
    base, agents = sharded_models
    shard = _replace_with_fifo(sorted(agents[0].glob("model-*.safetensors"))[1])
    line = _merge(tmp_path, base, agents[0], agents[1])
    assert shard.name in line and "named pipe" in line


def test_fifo_index_file(tmp_path, sharded_models):
    base, agents = sharded_models
    index = _replace_with_fifo(agents[0] / "model.safetensors.index.json")
    line = _merge(tmp_path, base, agents[0], agents[1])
    assert str(index) in line and "named pipe" in line


def test_fifo_config_json(tmp_path, models):
    base, agents = models
    config = _replace_with_fifo(agents[0] / "config.json")
    line = _merge(tmp_path, base, agents[0], agents[1])
    assert str(config) in line and "named pipe" in line


def test_character_device_as_the_weights_file(tmp_path, models):
    base, agents = models
    line = refused(
        cli(tmp_path, "merge", str(base), "/dev/null", str(agents[1]), "--out", str(tmp_path / "out"), timeout=TIMEOUT)
    )
    assert "/dev/null" in line and "character device" in line


def test_folder_named_model_safetensors(tmp_path, models):
    base, agents = models
    weights = agents[0] / "model.safetensors"
    weights.unlink()
    weights.mkdir()
    line = _merge(tmp_path, base, agents[0], agents[1])
    assert str(weights) in line and "is a folder" in line


def test_folder_named_config_json(tmp_path, models):
    base, agents = models
    config = agents[0] / "config.json"
    config.unlink()
    config.mkdir()
    line = _merge(tmp_path, base, agents[0], agents[1])
    assert str(config) in line and "is a folder" in line


def test_socket_named_model_safetensors(tmp_path, models):
    base, agents = models
    path = agents[0] / "model.safetensors"
    path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        line = _merge(tmp_path, base, agents[0], agents[1])
    finally:
        sock.close()
    assert str(path) in line


def _pickle_models(folder: Path) -> tuple[Path, list[Path]]:
    base, agents = make_models(folder)
    for model in (base, *agents):
        tensors = load_file(model / "model.safetensors")
        torch.save(tensors, model / "pytorch_model.bin")
        (model / "model.safetensors").unlink()
    return base, agents


def test_fifo_pytorch_model_bin(tmp_path):
    base, agents = _pickle_models(tmp_path / "in")
    fifo = _replace_with_fifo(agents[0] / "pytorch_model.bin")
    line = _merge(tmp_path, base, agents[0], agents[1])
    assert str(fifo) in line and "named pipe" in line


def test_fifo_pickle_file_given_directly(tmp_path):
    base, agents = _pickle_models(tmp_path / "in")
    fifo = tmp_path / "agent.bin"
    os.mkfifo(fifo)
    line = _merge(tmp_path, base, fifo, agents[1])
    assert str(fifo) in line and "named pipe" in line


def test_fifo_pickle_index(tmp_path):
    base, agents = _pickle_models(tmp_path / "in")
    index = agents[0] / "pytorch_model.bin.index.json"
    os.mkfifo(index)
    line = _merge(tmp_path, base, agents[0], agents[1])
    assert str(index) in line and "named pipe" in line


def _adapter_folder(folder: Path, base: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(
        json.dumps(
            {
                "peft_type": "LORA",
                "r": 1,
                "lora_alpha": 1,
                "base_model_name_or_path": str(base),
                "target_modules": ["q_proj"],
            }
        )
    )
    save_file(
        {
            "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(1, 32),
            "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": torch.zeros(32, 1),
        },
        str(folder / "adapter_model.safetensors"),
    )
    return folder


@pytest.mark.parametrize("name", ["adapter_model.safetensors", "adapter_config.json"])
def test_fifo_in_a_lora_adapter(tmp_path, models, name):
    base, agents = models
    adapter = _adapter_folder(tmp_path / "adapter", base)
    fifo = _replace_with_fifo(adapter / name)
    line = _merge(tmp_path, base, adapter, agents[1])
    assert str(fifo) in line and "named pipe" in line


def test_fifo_suite_data_jsonl(tmp_path, models):
    base, _ = models
    suite = tmp_path / "suite"
    suite.mkdir()
    fifo = suite / "data.jsonl"
    os.mkfifo(fifo)
    for given in (suite, fifo):
        line = refused(cli(tmp_path, "eval", str(base), "--suite", str(given), timeout=TIMEOUT))
        assert str(fifo) in line and "named pipe" in line


def test_fifo_demo_json(tmp_path):
    """``ram-merge demo DIR`` over a DIR whose demo.json is a FIFO, and ``read_manifest`` on it."""
    folder = tmp_path / "demo"
    folder.mkdir()
    fifo = folder / "demo.json"
    os.mkfifo(fifo)
    line = refused(cli(tmp_path, "demo", str(folder), timeout=TIMEOUT))
    assert str(fifo) in line and "named pipe" in line
    from ram_desktop.core.demo import read_manifest

    result: list[str] = []

    def attempt() -> None:
        try:
            read_manifest(folder)
        except InputError as e:
            result.append(str(e))

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(timeout=30)
    assert not worker.is_alive(), "read_manifest blocked on a FIFO"
    assert result and str(fifo) in result[0] and "named pipe" in result[0]


def test_fifo_in_the_probe_cache_is_ignored_not_waited_for(tmp_path, models):
    """The cache is an optimisation: a FIFO in its place is skipped (and replaced), never opened."""
    base, agents = models
    args = ("probe", str(base), str(agents[0]), str(agents[1]))
    first = cli(tmp_path, *args, timeout=TIMEOUT)
    assert first.returncode == 0, first.stderr
    cached = list((tmp_path / "ram-cache" / "probe").glob("*.json"))
    assert len(cached) == 1
    _replace_with_fifo(cached[0])
    again = cli(tmp_path, *args, timeout=TIMEOUT)
    assert again.returncode == 0 and "Traceback" not in again.stderr, again.stderr
    assert again.stdout == first.stdout
    assert cached[0].is_file()  # the recomputed probe replaced it


@pytest.mark.parametrize(
    "content",
    [
        "[" * 100_000 + "]" * 100_000,
        '{"format": "x", "format": "y"}',
    ],
    ids=["nested_100k_deep", "repeated_key"],
)
def test_bad_json_in_the_probe_cache_is_recomputed(tmp_path, models, content):
    base, agents = models
    args = ("probe", str(base), str(agents[0]), str(agents[1]))
    first = cli(tmp_path, *args, timeout=TIMEOUT)
    cached = next((tmp_path / "ram-cache" / "probe").glob("*.json"))
    cached.write_text(content)
    again = cli(tmp_path, *args, timeout=TIMEOUT)
    assert again.returncode == 0 and "Traceback" not in again.stderr, again.stderr
    assert again.stdout == first.stdout


# ---- JSON nested too deeply, repeated keys, not UTF-8: one line naming the file (and line) ----


def test_index_nested_100k_deep(tmp_path, sharded_models):
    """ba1bdff: RecursionError traceback."""
    base, agents = sharded_models
    index = agents[0] / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    text = json.dumps(data)[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    index.write_text(text)
    line = _merge(tmp_path, base, agents[0], agents[1])
    assert str(index) in line and "nested too deeply" in line


def test_index_with_a_repeated_key(tmp_path, sharded_models):
    base, agents = sharded_models
    index = agents[0] / "model.safetensors.index.json"
    index.write_text(index.read_text().replace("{", '{"weight_map": {}, ', 1))  # a second "weight_map" follows
    line = _merge(tmp_path, base, agents[0], agents[1])
    assert str(index) in line and "'weight_map' appears twice" in line


def test_config_json_not_utf8(tmp_path, models):
    base, agents = models
    config = agents[0] / "config.json"
    config.write_bytes(config.read_bytes().replace(b'"qwen2"', b'"qw\xe9n2"'))
    line = _merge(tmp_path, base, agents[0], agents[1])
    assert str(config) in line and "not UTF-8" in line


def test_config_json_nested_100k_deep(tmp_path, models):
    base, agents = models
    config = agents[0] / "config.json"
    config.write_text(config.read_text().rstrip()[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    line = _merge(tmp_path, base, agents[0], agents[1])
    assert str(config) in line and "nested too deeply" in line


def _suite(tmp_path: Path, second_line: bytes) -> Path:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "data.jsonl").write_bytes(b'{"prompt": "2+3=", "answer": "5"}\n' + second_line + b"\n")
    return suite


@pytest.mark.parametrize(
    "second,message",
    [
        (b'{"prompt": "x", "answer": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
        (b'{"prompt": "x", "prompt": "y"}', "'prompt' appears twice"),
        (b'{"prompt": "caf\xe9"}', "not UTF-8"),
    ],
    ids=["nested_100k_deep", "repeated_key", "not_utf8"],
)
def test_bad_suite_line(tmp_path, models, second, message):
    """The 100k-deep line was a RecursionError traceback on ba1bdff; the repeated key was silently resolved."""
    base, _ = models
    suite = _suite(tmp_path, second)
    line = refused(cli(tmp_path, "eval", str(base), "--suite", str(suite), timeout=TIMEOUT))
    assert f"{(suite / 'data.jsonl').resolve()}, line 2" in line and message in line


def test_adapter_config_with_a_repeated_key(tmp_path, models):
    base, agents = models
    adapter = _adapter_folder(tmp_path / "adapter", base)
    config = adapter / "adapter_config.json"
    config.write_text('{"peft_type": "LORA", ' + config.read_text()[1:])
    line = _merge(tmp_path, base, adapter, agents[1])
    assert str(config) in line and "'peft_type' appears twice" in line


# ---- OS errors while reading: exit 2 naming the file (root ignores permissions: simulated) ----

PATCH = """
import builtins, errno, io, os
TARGET, CODE, AT = {target!r}, errno.{code}, {at!r}
def _hit(path):
    return str(path).endswith(TARGET)
def _error(path):
    return OSError(CODE, os.strerror(CODE), str(path))
_os_open, _open, _fdopen = os.open, builtins.open, os.fdopen
def os_open(path, flags, *a, **k):
    if AT == "open" and _hit(path):
        raise _error(path)
    return _os_open(path, flags, *a, **k)
def open_(file, *a, **k):
    hit = isinstance(file, (str, bytes, os.PathLike)) and _hit(os.fsdecode(file))
    if AT == "open" and hit:
        raise _error(file)
    f = _open(file, *a, **k)
    return _Failing(f, os.fsdecode(file)) if AT == "read" and hit else f
class _Failing:
    def __init__(self, f, path):
        self._f, self._path = f, path
    def read(self, *a):
        raise _error(self._path)
    def __getattr__(self, name):
        return getattr(self._f, name)
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        self._f.close()
def fdopen(fd, *a, **k):
    f = _fdopen(fd, *a, **k)
    path = os.readlink(f"/proc/self/fd/{{fd}}")
    return _Failing(f, path) if AT == "read" and _hit(path) else f
os.open, builtins.open, io.open, os.fdopen = os_open, open_, open_, fdopen
"""


@pytest.mark.parametrize(
    "target,code,at",
    [
        ("alpha/model.safetensors", "EACCES", "open"),
        ("alpha/model.safetensors", "EIO", "read"),
        ("alpha/config.json", "EACCES", "open"),
        ("alpha/config.json", "EIO", "read"),
    ],
)
def test_os_error_reading_safetensors_inputs(tmp_path, models, target, code, at):
    base, agents = models
    assert agents[0].name == "alpha"
    done = cli(
        tmp_path,
        "merge",
        str(base),
        str(agents[0]),
        str(agents[1]),
        "--out",
        str(tmp_path / "out"),
        timeout=TIMEOUT,
        prelude=PATCH.format(target=target, code=code, at=at),
    )
    line = refused(done, str(tmp_path / "in" / target), "cannot read", os.strerror(getattr(__import__("errno"), code)))
    assert not (tmp_path / "out").exists()
    assert line


@pytest.mark.parametrize("code,at", [("EACCES", "open"), ("EIO", "read")])
def test_os_error_reading_a_pickle_checkpoint(tmp_path, code, at):
    base, agents = _pickle_models(tmp_path / "in")
    done = cli(
        tmp_path,
        "merge",
        str(base),
        str(agents[0]),
        str(agents[1]),
        "--out",
        str(tmp_path / "out"),
        timeout=TIMEOUT,
        prelude=PATCH.format(target="alpha/pytorch_model.bin", code=code, at=at),
    )
    refused(done, str(agents[0] / "pytorch_model.bin"), os.strerror(getattr(__import__("errno"), code)))


@pytest.mark.parametrize("code,at", [("EACCES", "open"), ("EIO", "read")])
def test_os_error_reading_a_suite(tmp_path, models, code, at):
    base, _ = models
    suite = _suite(tmp_path, b'{"prompt": "x"}')
    done = cli(
        tmp_path,
        "eval",
        str(base),
        "--suite",
        str(suite),
        timeout=TIMEOUT,
        prelude=PATCH.format(target="suite/data.jsonl", code=code, at=at),
    )
    refused(done, "data.jsonl", "cannot read", os.strerror(getattr(__import__("errno"), code)))


@pytest.mark.parametrize("kind", ["fifo", "nested_100k_deep", "repeated_key", "not_utf8"])
def test_hub_check_cached_config(tmp_path, monkeypatch, kind):
    """The pre-check's cached ``config.json`` goes through safe_read: refused naming the file, never blocking
    (ba1bdff: a FIFO blocked, 100k-deep JSON raised RecursionError, a repeated key was silently resolved)."""
    from ram_desktop.core.ecosystem.hub import check as hub_check, source as hub

    cached = tmp_path / "config.json"
    if kind == "fifo":
        os.mkfifo(cached)
    else:
        cached.write_bytes(
            {
                "nested_100k_deep": b"[" * 100_000 + b"]" * 100_000,
                "repeated_key": b'{"vocab_size": 8, "vocab_size": 9}',
                "not_utf8": b'{"model_type": "qw\xe9n"}',
            }[kind]
        )
    monkeypatch.setattr(hub_check.hf, "try_to_load_from_cache", lambda *a, **k: str(cached))
    listing = hub.RepoFiles("org/model", "0" * 40, {"config.json": 10})
    result: list[str] = []

    def attempt() -> None:
        try:
            hub_check._remote_config("org/model", listing, None)
        except InputError as e:
            result.append(str(e))

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(timeout=30)
    assert not worker.is_alive(), "reading the cached config blocked"
    assert result and str(cached) in result[0], result


@pytest.mark.parametrize("name", ["tokenizer.json", "generation_config.json"])
def test_fifo_among_the_files_transformers_opens_for_eval(tmp_path, models, name):
    """Evaluation hands the folder to transformers, which opens its files itself: a FIFO among them is refused
    by name (ba1bdff: "no tokenizer" for a FIFO tokenizer.json; a FIFO generation_config.json silently ignored)."""
    base, _ = models
    fifo = _replace_with_fifo(base / name)
    suite = _suite(tmp_path, b'{"prompt": "x", "answer": "y"}')
    line = refused(cli(tmp_path, "eval", str(base), "--suite", str(suite), timeout=TIMEOUT))
    assert str(fifo) in line and "named pipe" in line
