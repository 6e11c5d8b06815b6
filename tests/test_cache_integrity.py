"""A cache can never change a result (docs/engine.md, "The probe cache"): a probe cache file whose numbers
were altered, that cannot be parsed, or that is not a regular file is a cache miss; the probe is computed
again and the merge has the same bytes as with a clean cache. Each run is a fresh ``ram-merge`` process."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .conftest import make_models
from .subproc import cli


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> list[str]:
    base, agents = make_models(tmp_path_factory.mktemp("cache") / "in")
    return [str(base), *map(str, agents)]


def _cache_files(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "ram-cache" / "probe").glob("*.json"))


def _merge(tmp_path: Path, inputs: list[str], out: str) -> bytes:
    done = cli(tmp_path, "merge", *inputs, "--out", str(tmp_path / out), "--method", "ram-plus")
    assert done.returncode == 0, done.stderr
    return (tmp_path / out / "model.safetensors").read_bytes()


def _poison(text: str) -> str:
    """Every ``"unique": N`` count (RAM+'s λ is computed from them) made 7 times larger."""
    import re

    return re.sub(r'"unique": ?(\d+)', lambda m: f'"unique": {int(m.group(1)) * 7 + 3}', text)


def test_altered_numbers_in_the_probe_cache_do_not_change_the_merge(tmp_path, inputs):
    clean = _merge(tmp_path, inputs, "clean")
    (cache,) = _cache_files(tmp_path)
    poisoned = _poison(cache.read_text())
    assert poisoned != cache.read_text()
    cache.write_text(poisoned)
    assert _merge(tmp_path, inputs, "again") == clean
    assert cache.read_text() != poisoned  # the miss computed the probe again and cached it afresh


@pytest.mark.parametrize("spoil", ["truncated", "directory", "fifo", "symlink"])
def test_an_unreadable_probe_cache_is_a_miss(tmp_path, inputs, spoil):
    clean = _merge(tmp_path, inputs, "clean")
    (cache,) = _cache_files(tmp_path)
    text = cache.read_text()
    cache.unlink()
    if spoil == "truncated":
        cache.write_text(text[: len(text) // 2])
    elif spoil == "directory":
        cache.mkdir()
    elif spoil == "fifo":
        os.mkfifo(cache)
    else:
        target = tmp_path / "elsewhere.json"
        target.write_text(_poison(text))
        cache.symlink_to(target)
    assert _merge(tmp_path, inputs, "again") == clean


def test_an_altered_fisher_cache_is_estimated_again(tmp_path):
    """The Fisher cache (``paths.cache_dir("fisher")``): a cached estimate whose numbers were changed is a
    miss; the merge equals the one from a clean cache."""
    pytest.importorskip("transformers")
    import json
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from .tinylm import write_tiny_lm

    base = write_tiny_lm(tmp_path / "lm", chat_template=False, seed=3, hidden=32)
    agents = []
    for t in range(2):
        folder = tmp_path / f"agent{t}"
        shutil.copytree(base, folder)
        tensors = load_file(str(folder / "model.safetensors"))
        g = torch.Generator().manual_seed(10 + t)
        save_file(
            {n: v + 0.01 * torch.randn(v.shape, generator=g) for n, v in tensors.items()},
            str(folder / "model.safetensors"),
            metadata={"format": "pt"},
        )
        agents.append(str(folder))
    suites = []
    for s, prompts in enumerate((["What is 2 + 3?", "Say hello"], ["def add(a, b):", "Remember 42"])):
        folder = tmp_path / f"suite{s}"
        folder.mkdir()
        (folder / "data.jsonl").write_text("".join(json.dumps({"prompt": p, "answer": "x"}) + "\n" for p in prompts))
        (folder / "suite.yaml").write_text("name: calib\nmax_new_tokens: 4\nchat_template: false\n")
        suites.append(str(folder))
    argv = [
        "merge",
        str(base),
        *agents,
        "--method",
        "fisher",
        "--device",
        "cpu",
        "--fisher-suite",
        ",".join(suites),
        "--examples",
        "2",
    ]
    done = cli(tmp_path, *argv, "--out", str(tmp_path / "m1"), timeout=600)
    assert done.returncode == 0, done.stderr
    clean = (tmp_path / "m1" / "model.safetensors").read_bytes()
    shards = sorted((tmp_path / "ram-cache" / "fisher").glob("*/*.safetensors"))
    assert shards
    for shard in shards:
        tensors = load_file(str(shard))
        save_file({n: v * 1000 + 1 for n, v in tensors.items()}, str(shard), metadata={"format": "pt"})
    done = cli(tmp_path, *argv, "--out", str(tmp_path / "m2"), timeout=600)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "m2" / "model.safetensors").read_bytes() == clean


def test_a_changed_copy_of_the_demo_is_copied_again(tmp_path):
    """The window's copy of the built-in demo lives in the cache: an agent changed there is replaced by the
    shipped one before it is merged."""
    from ram_desktop.core.demo import ensure_demo

    _, agents = ensure_demo(tmp_path / "demo")
    weights = agents[0] / "model.safetensors"
    shipped = weights.read_bytes()
    changed = bytearray(shipped)
    changed[-1] ^= 0xFF
    weights.write_bytes(bytes(changed))
    (tmp_path / "demo" / "suites" / "__pycache__").mkdir()  # a scorer's import leaves bytecode: not a change
    _, again_agents = ensure_demo(tmp_path / "demo")
    assert again_agents == agents and (again_agents[0] / "model.safetensors").read_bytes() == shipped
