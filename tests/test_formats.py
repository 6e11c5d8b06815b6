"""Checkpoint formats: PyTorch .bin (single and sharded), refused code-running pickles, tied embeddings,
non-float tensors, vocabulary-size mismatches."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from ram_desktop.core.engine import MergeRequest, merge, probe
from ram_desktop.core.errors import InputError
from ram_desktop.core.sources import open_checkpoint

from . import reference as ref
from .conftest import SMALL_CONFIG, make_models

EPS = 1e-5


def to_bin(folder: Path, dest: Path, shards: int = 1, legacy: bool = False) -> Path:
    """Copy an HF folder, replacing its safetensors weights with pytorch_model.bin (or .bin shards + index)."""
    tensors = ref.load_model(folder)
    shutil.copytree(folder, dest, ignore=shutil.ignore_patterns("*.safetensors", "*.safetensors.index.json"))
    names = list(tensors)
    kwargs = {"_use_new_zipfile_serialization": False} if legacy else {}
    if shards == 1:
        torch.save(tensors, dest / "pytorch_model.bin", **kwargs)
        return dest
    per = -(-len(names) // shards)
    weight_map = {}
    for s in range(shards):
        file = f"pytorch_model-{s + 1:05d}-of-{shards:05d}.bin"
        torch.save({n: tensors[n] for n in names[s * per:(s + 1) * per]}, dest / file, **kwargs)
        weight_map.update({n: file for n in names[s * per:(s + 1) * per]})
    (dest / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return dest


def merged_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("*.safetensors"))}


def _merge(tmp_path, base, agents, name, method="ram-plus", **kw):
    out = tmp_path / name
    result = merge(MergeRequest(str(base), [str(a) for a in agents], out, method, use_cache=False, **kw))
    return out, result


@pytest.mark.parametrize("shards,legacy", [(1, False), (3, False), (1, True)])
def test_bin_checkpoints_merge_like_safetensors(tmp_path, shards, legacy):
    base, agents = make_models(tmp_path / "st")
    bin_base = to_bin(base, tmp_path / "bin" / "base", shards, legacy)
    bin_agents = [to_bin(a, tmp_path / "bin" / a.name, shards, legacy) for a in agents]
    ckpt = open_checkpoint(str(bin_base))
    assert ckpt.tensors.keys() == ref.load_model(base).keys()
    assert all(f.suffix == ".bin" for f in ckpt.files) and len(ckpt.files) == shards
    want, r1 = _merge(tmp_path, base, agents, "want", chunk_elements=100)
    got, r2 = _merge(tmp_path, bin_base, bin_agents, "got", chunk_elements=100)
    assert merged_bytes(got) == merged_bytes(want)
    assert r1.lambdas == r2.lambdas


def test_single_bin_file_and_mixed_formats(tmp_path):
    base, agents = make_models(tmp_path / "st")
    bin_agent = to_bin(agents[0], tmp_path / "bin" / "alpha")
    want, _ = _merge(tmp_path, base, agents, "want")
    got, _ = _merge(tmp_path, base, [bin_agent / "pytorch_model.bin", *agents[1:]], "got")
    assert merged_bytes(got) == merged_bytes(want)


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


class _Marker:
    pass


def test_pickle_that_needs_code_is_refused_and_never_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    base, agents = make_models(tmp_path / "st")
    evil = to_bin(agents[0], tmp_path / "evil")
    state = ref.load_model(agents[0])
    state["trojan"] = _RunsCode()
    torch.save(state, evil / "pytorch_model.bin")
    calls = []
    monkeypatch.setattr(os, "system", lambda cmd: calls.append(cmd))
    with pytest.raises(InputError, match="refused .*needs code to load.*weights_only=True"):
        open_checkpoint(str(evil))
    assert calls == [] and not (tmp_path / "PWNED").exists()
    # the same through a merge: exit-2 style error, nothing written
    with pytest.raises(InputError, match="pytorch_model.bin: refused"):
        merge(MergeRequest(str(base), [str(evil)], tmp_path / "out"))
    assert not (tmp_path / "out").exists() and calls == []
    # an arbitrary class (not a callable) is refused the same way
    with open(evil / "pytorch_model.bin", "wb") as f:
        pickle.dump({"w": _Marker()}, f)
    with pytest.raises(InputError, match="refused"):
        open_checkpoint(str(evil))


def test_corrupt_bin_is_a_clear_error(tmp_path):
    _, agents = make_models(tmp_path / "st")
    folder = to_bin(agents[0], tmp_path / "bad")
    data = (folder / "pytorch_model.bin").read_bytes()
    (folder / "pytorch_model.bin").write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match="pytorch_model.bin: cannot read this PyTorch checkpoint"):
        open_checkpoint(str(folder))
