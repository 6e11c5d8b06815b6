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
