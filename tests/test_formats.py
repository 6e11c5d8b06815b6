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

from ram_desktop.core import MergeSpec, RunOptions
from ram_desktop.core.errors import InputError
from ram_desktop.core.pipeline import merge
from ram_desktop.core.sources import open_checkpoint

from . import reference as ref
from .conftest import make_models

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
        torch.save({n: tensors[n] for n in names[s * per : (s + 1) * per]}, dest / file, **kwargs)
        weight_map.update({n: file for n in names[s * per : (s + 1) * per]})
    (dest / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return dest


def merged_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("*.safetensors"))}


def _merge(tmp_path, base, agents, name, method="ram-plus", chunk_elements=None, **kw):
    out = tmp_path / name
    options = RunOptions(use_cache=False, **({"chunk_elements": chunk_elements} if chunk_elements else {}))
    result = merge(MergeSpec.build(str(base), [str(a) for a in agents], out, method, **kw), options=options)
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
        merge(MergeSpec.build(str(base), [str(evil)], tmp_path / "out"))
    assert not (tmp_path / "out").exists() and calls == []
    # an arbitrary class (not a callable) is refused the same way
    with open(evil / "pytorch_model.bin", "wb") as f:
        pickle.dump({"w": _Marker()}, f, protocol=2)
    with pytest.raises(InputError, match="refused"):
        open_checkpoint(str(evil))


def test_corrupt_bin_is_a_clear_error(tmp_path):
    _, agents = make_models(tmp_path / "st")
    folder = to_bin(agents[0], tmp_path / "bad")
    data = (folder / "pytorch_model.bin").read_bytes()
    (folder / "pytorch_model.bin").write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match="pytorch_model.bin: cannot read this PyTorch checkpoint"):
        open_checkpoint(str(folder))


# ---------------------------------------------------------------------------------------------- helpers


def rewrite(folder: Path, dest: Path, change=None, **config) -> Path:
    """Copy an HF folder, transforming its tensors with ``change(dict) -> dict`` and updating its config."""
    shutil.copytree(folder, dest, ignore=shutil.ignore_patterns("*.safetensors", "*.safetensors.index.json"))
    tensors = ref.load_model(folder)
    if change:
        tensors = change(dict(tensors))
    save_file(tensors, str(dest / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((dest / "config.json").read_text())
    cfg.update(config)
    (dest / "config.json").write_text(json.dumps(cfg))
    return dest


def _exact_merge(tmp_path, base, agents, name, **kw):
    out, result = _merge(tmp_path, base, agents, name, out_dtype="float32", **kw)
    return ref.load_model(out), result


def _want(base_t, agent_ts, result):
    return ref.merged_model(base_t, agent_ts, EPS, result.lambdas, torch.float32)


def _assert_equal(got, want):
    assert got.keys() == want.keys()
    for k in want:
        assert torch.equal(got[k], want[k]), k


def _drop_head(t):
    t.pop("lm_head.weight")
    return t


def _head_is_embed(t):
    t["lm_head.weight"] = t["model.embed_tokens.weight"].clone()
    return t


# ---------------------------------------------------------------------------------------------- tied embeddings


def test_tied_embeddings_everywhere(tmp_path):
    base, agents = make_models(tmp_path / "st")
    tb = rewrite(base, tmp_path / "t" / "base", _drop_head, tie_word_embeddings=True)
    ta = [rewrite(a, tmp_path / "t" / a.name, _drop_head, tie_word_embeddings=True) for a in agents]
    got, result = _exact_merge(tmp_path, tb, ta, "out")
    assert "lm_head.weight" not in got
    _assert_equal(got, _want(ref.load_model(tb), [ref.load_model(a) for a in ta], result))
    assert json.loads((tmp_path / "out" / "config.json").read_text())["tie_word_embeddings"] is True


def test_tied_base_with_agents_that_store_a_duplicate_head(tmp_path, caplog):
    """RL frameworks often save lm_head even for tied models: it is ignored, the output stays tied, and the
    result equals the all-tied merge (probe counts included)."""
    base, agents = make_models(tmp_path / "st")
    tb = rewrite(base, tmp_path / "t" / "base", _drop_head, tie_word_embeddings=True)
    ta = [rewrite(a, tmp_path / "t" / a.name, _drop_head, tie_word_embeddings=True) for a in agents]
    da = [rewrite(a, tmp_path / "d" / a.name, _head_is_embed, tie_word_embeddings=True) for a in agents]
    want, r1 = _exact_merge(tmp_path, tb, ta, "want")
    got, r2 = _exact_merge(tmp_path, tb, da, "got")
    _assert_equal(got, want)
    assert [a.unique for a in r1.probe.agents] == [a.unique for a in r2.probe.agents]
    assert not any("untied" in w for w in r2.warnings)
    # an agent whose config unties the head: merged without its head, with a warning that says so
    untied = rewrite(agents[0], tmp_path / "u" / "alpha", tie_word_embeddings=False)
    _, r3 = _exact_merge(tmp_path, tb, [untied, *ta[1:]], "got2")
    assert any("untied lm_head.weight but the base ties it" in w for w in r3.warnings)


def test_untied_base_with_tied_agents_reads_their_embedding(tmp_path):
    """An agent that omits lm_head because it ties it: its lm_head is its embedding."""
    base, agents = make_models(tmp_path / "st")
    ta = [rewrite(agents[0], tmp_path / "t" / "alpha", _drop_head, tie_word_embeddings=True), *agents[1:]]
    got, result = _exact_merge(tmp_path, base, ta, "got")
    explicit = [_head_is_embed(ref.load_model(agents[0])), *[ref.load_model(a) for a in agents[1:]]]
    _assert_equal(got, _want(ref.load_model(base), explicit, result))
    # an agent missing lm_head while its config says untied is a tensor-set error
    broken = rewrite(agents[0], tmp_path / "b" / "alpha", _drop_head, tie_word_embeddings=False)
    with pytest.raises(InputError, match=r"missing 1 \(lm_head.weight\)"):
        _merge(tmp_path, base, [broken], "x")


def test_tied_bin_agents_merge_like_safetensors(tmp_path):
    base, agents = make_models(tmp_path / "st")
    tb = rewrite(base, tmp_path / "t" / "base", _drop_head, tie_word_embeddings=True)
    ta = [rewrite(a, tmp_path / "t" / a.name, _drop_head, tie_word_embeddings=True) for a in agents]
    ba = [to_bin(a, tmp_path / "b" / a.name) for a in ta]
    want, _ = _merge(tmp_path, tb, ta, "want")
    got, _ = _merge(tmp_path, tb, ba, "got")
    assert merged_bytes(got) == merged_bytes(want)


# ---------------------------------------------------------------------------------------------- non-float tensors


def test_non_float_tensors_are_copied_from_the_base(tmp_path):
    base, agents = make_models(tmp_path / "st")

    def buffers(offset):
        def change(t):
            t["model.position_ids"] = torch.arange(16, dtype=torch.int64)[None] + offset
            t["model.causal_mask"] = torch.rand(4, 4, generator=torch.Generator().manual_seed(offset)) < 0.5
            return t

        return change

    nb = rewrite(base, tmp_path / "n" / "base", buffers(0))
    na = [rewrite(a, tmp_path / "n" / a.name, buffers(i + 1)) for i, a in enumerate(agents)]
    got, result = _exact_merge(tmp_path, nb, na, "out")
    base_t = ref.load_model(nb)
    assert torch.equal(got["model.position_ids"], base_t["model.position_ids"])
    assert torch.equal(got["model.causal_mask"], base_t["model.causal_mask"])
    assert got["model.position_ids"].dtype == torch.int64 and got["model.causal_mask"].dtype == torch.bool
    _assert_equal(got, _want(base_t, [ref.load_model(a) for a in na], result))
    assert result.probe.params == sum(v.numel() for v in base_t.values() if v.is_floating_point())


# ---------------------------------------------------------------------------------------------- vocabulary sizes


def _resize_vocab(rows: int, seed: int = 5):
    def change(t):
        gen = torch.Generator().manual_seed(seed)
        for name in ("model.embed_tokens.weight", "lm_head.weight"):
            w = t[name]
            if rows <= w.shape[0]:
                t[name] = w[:rows].clone()
            else:
                extra = (0.02 * torch.randn(rows - w.shape[0], w.shape[1], generator=gen)).to(w.dtype)
                t[name] = torch.cat([w, extra])
        return t

    return change


def test_vocab_mismatch_is_an_error_naming_the_rows(tmp_path, capsys):
    base, agents = make_models(tmp_path / "st")
    big = rewrite(agents[0], tmp_path / "v" / "alpha", _resize_vocab(72), vocab_size=72)
    with pytest.raises(
        InputError,
        match=r"vocabulary sizes differ: .*tensor 'model.embed_tokens.weight' has 72 "
        r"vocabulary rows in .*alpha but 64 in the base .*\(rows 64..71 exist only "
        r"in the agent\).*--vocab common",
    ):
        _merge(tmp_path, base, [big, *agents[1:]], "x")
    from ram_desktop.cli import main

    assert main(["merge", str(base), str(big), str(agents[1]), "--out", str(tmp_path / "y")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "rows 64..71 exist only in the agent" in err[0]
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


@pytest.mark.parametrize("rows", [72, 56])
def test_vocab_common_merges_shared_rows_and_keeps_the_base_for_the_rest(tmp_path, rows):
    base, agents = make_models(tmp_path / "st")
    odd = rewrite(agents[0], tmp_path / "v" / "alpha", _resize_vocab(rows), vocab_size=rows)
    got, result = _exact_merge(tmp_path, base, [odd, *agents[1:]], "out", vocab="common")
    base_t = ref.load_model(base)
    # what "common" means, spelled out on whole tensors: the agent restricted / extended to the base's rows,
    # rows it lacks taken from the base (so its task vector there is 0)
    fitted = ref.load_model(odd)
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        fitted[name] = torch.cat([fitted[name][:64], base_t[name][min(rows, 64) :]])
    agent_ts = [fitted, *[ref.load_model(a) for a in agents[1:]]]
    _assert_equal(got, _want(base_t, agent_ts, result))
    expected = ref.probe_counts(ref.task_vectors(base_t, agent_ts), EPS)
    assert [a.unique for a in result.probe.agents] == expected["unique"]
    assert [a.shared for a in result.probe.agents] == expected["shared"]
    assert got["model.embed_tokens.weight"].shape[0] == 64
    assert any("vocabulary rows" in w for w in result.warnings)
    recipe = (tmp_path / "out" / "ram-recipe.yaml").read_text()
    assert "vocab: common" in recipe
    assert json.loads((tmp_path / "out" / "merge-report.json").read_text())["vocab"] == "common"


def test_vocab_common_through_cli_and_recipe(tmp_path):
    from ram_desktop.cli import main

    base, agents = make_models(tmp_path / "st")
    small = rewrite(agents[2], tmp_path / "v" / "gamma", _resize_vocab(60), vocab_size=60)
    args = [str(base), str(agents[0]), str(small), "--out", str(tmp_path / "a"), "--vocab", "common", "-q"]
    assert main(["-q", "merge", *args[:-1]]) == 0
    assert main(["-q", "run", str(tmp_path / "a" / "ram-recipe.yaml"), "--out", str(tmp_path / "b")]) == 0
    assert merged_bytes(tmp_path / "a") == merged_bytes(tmp_path / "b")
    assert main(["-q", "probe", str(base), str(small), "--vocab", "common"]) == 0


def test_mapped_reader_equals_safetensors_views(tmp_path):
    """``open_slices`` reads row slices as views of a private mapping; they must equal what safetensors
    itself reads, for every stored dtype, odd shapes, 0-d and empty tensors, and stay valid
    after the handle is closed (chunks still in flight when a pass's reader finishes)."""
    from safetensors import safe_open

    from ram_desktop.core.storage.formats.safetensors_format import open_slices

    g = torch.Generator().manual_seed(0)
    tensors = {
        "a.bf16": torch.randn(7, 5, generator=g).to(torch.bfloat16),
        "b.f16": torch.randn(3, 3, 2, generator=g).to(torch.float16),
        "c.f32": torch.randn(11, generator=g),
        "d.f64": torch.randn(4, 1, generator=g, dtype=torch.float64),
        "e.i8": torch.arange(-5, 4, dtype=torch.int8).reshape(3, 3),  # 9 bytes (save_file orders by dtype size)
        "f.i64": torch.arange(6, dtype=torch.int64).reshape(2, 3),
        "g.bool": torch.tensor([True, False, True]),
        "h.scalar": torch.tensor(3.5, dtype=torch.bfloat16),
        "i.empty": torch.zeros(0, 4),
    }
    path = tmp_path / "m.safetensors"
    save_file(tensors, str(path))
    kept = []
    with open_slices(path) as mine, safe_open(str(path), framework="pt") as theirs:
        assert sorted(mine.keys()) == sorted(tensors)
        for name, t in tensors.items():
            assert (
                torch.equal(mine.get_tensor(name), theirs.get_tensor(name)) and mine.get_tensor(name).dtype == t.dtype
            )
            if t.dim() == 0:
                continue
            n = t.shape[0]
            for a, b in ((0, n), (1, n), (0, 1), (n - 1, n), (1, max(1, n - 1)), (n, n), (0, n + 5)):
                got = mine.get_slice(name)[a:b]
                assert got.dtype == t.dtype and torch.equal(got, theirs.get_slice(name)[a:b]), (name, a, b)
            kept.append((name, mine.get_slice(name)[1:]))
        with pytest.raises(KeyError):
            mine.get_slice("missing")
    for name, view in kept:  # the handle is closed: the views still read the file's values
        assert torch.equal(view, tensors[name][1:])


def _npz_format():
    """A weights format written for this test only: numpy ``.npz`` archives (one module's worth of code plus
    its line in the registry), read by nothing but its own functions."""
    import numpy as np

    from ram_desktop.core.storage.formats.base import Checkpoint, TensorInfo, WeightFormat

    def open_file(path: Path, spec: str) -> Checkpoint:
        with np.load(path) as data:
            tensors = {k: TensorInfo(k, "F32", tuple(data[k].shape), path) for k in data.files}
        return Checkpoint(spec, path, [path], tensors)

    def open_folder(folder: Path, spec: str) -> Checkpoint | None:
        return open_file(folder / "model.npz", spec) if (folder / "model.npz").exists() else None

    def pick(names: list[str]) -> list[str] | None:
        return ["model.npz"] if "model.npz" in names else None

    return WeightFormat("npz", "numpy archive", (".npz",), ("model.npz",), pick, open_folder, open_file, np.load)


def test_a_new_weight_format_is_one_entry_in_the_registry(tmp_path, monkeypatch):
    """Registered once, a format is opened locally (file and folder), offered by the file dialog, chosen on
    the Hub, and named where no weights are found."""
    import numpy as np

    from ram_desktop.core import weights_file_filter
    from ram_desktop.core.ecosystem.hub.source import needed_files
    from ram_desktop.core.storage.formats import open_local, registry

    folder = tmp_path / "npz-model"
    folder.mkdir()
    np.savez(folder / "model.npz", w=np.zeros((3, 2), np.float32))
    with pytest.raises(InputError, match="not a weights file"):
        open_local(folder / "model.npz")
    monkeypatch.setattr(registry, "FORMATS", (*registry.FORMATS, _npz_format()))
    assert open_local(folder / "model.npz").tensors["w"].shape == (3, 2)
    assert open_local(folder).files == [folder / "model.npz"]
    assert "numpy archive (*.npz)" in weights_file_filter() and "*.npz" in weights_file_filter().split(";;")[0]
    assert needed_files(["model.npz", "config.json"]) == (["model.npz", "config.json"], "npz")
    assert needed_files(["model.safetensors", "model.npz"])[1] == "safetensors"  # the registry's order decides
    (tmp_path / "empty").mkdir()
    with pytest.raises(
        InputError, match=r"expected model\.safetensors, .*pytorch_model\.bin\.index\.json or model\.npz\)"
    ):
        open_local(tmp_path / "empty")


def test_the_file_dialog_offers_every_registered_suffix():
    from ram_desktop.core import weights_file_filter
    from ram_desktop.core.storage.formats.registry import FORMATS

    every = weights_file_filter().split(";;")[0]
    for fmt in FORMATS:
        for suffix in fmt.suffixes:
            assert f"*{suffix}" in every
    assert {".safetensors", ".bin", ".pt"} <= {s for f in FORMATS for s in f.suffixes}
