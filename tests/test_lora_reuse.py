"""A LoRA agent's task vector τ = scale·B·A is computed once per run (``lora.reuse_deltas``): once for the probe
pass and the merge pass of a merge, for every variant of a compare, and for every trial of a search; the bytes
are those of a merge that computes it on its own."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy
import xxhash

from ram_desktop import workflow
from ram_desktop.core import MergeSpec, RunOptions, Variant
from ram_desktop.core.demo import write_demo
from ram_desktop.core.storage.formats import lora

TARGETS = ("model.layers.0.self_attn.q_proj", "model.layers.1.mlp.gate_proj", "model.layers.2.mlp.down_proj")


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> tuple[Path, Path]:
    """The built-in demo and a rank-4 adapter of its base, written by hand in PEFT's layout."""
    folder = tmp_path_factory.mktemp("demo")
    write_demo(folder)
    with safetensors.safe_open(folder / "base" / "model.safetensors", "np") as f:
        shapes = {k: f.get_slice(k).get_shape() for k in f.keys()}  # noqa: SIM118 — safe_open has no iterator
    rng = np.random.default_rng(3)
    factors = {}
    for module in TARGETS:
        out_dim, in_dim = shapes[module + ".weight"]
        factors[f"base_model.model.{module}.lora_A.weight"] = rng.normal(0, 0.05, (4, in_dim)).astype(np.float32)
        factors[f"base_model.model.{module}.lora_B.weight"] = rng.normal(0, 0.05, (out_dim, 4)).astype(np.float32)
    adapter = folder / "adapter"
    adapter.mkdir()
    safetensors.numpy.save_file(factors, adapter / "adapter_model.safetensors", metadata={"format": "pt"})
    config = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "gate_proj", "down_proj"]}
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    return folder, adapter


def _adapted_elements(folder: Path) -> int:
    with safetensors.safe_open(folder / "base" / "model.safetensors", "np") as f:
        return sum(int(np.prod(f.get_slice(m + ".weight").get_shape())) for m in TARGETS)


def _spec(folder: Path, adapter: Path, out: Path | None = None, method: str = "ram-plus") -> MergeSpec:
    return MergeSpec.build(str(folder / "base"), [str(adapter), str(folder / "coder")], out, method)


def test_a_compare_computes_the_adapters_task_vector_once(demo, tmp_path):
    folder, adapter = demo
    once = _adapted_elements(folder)
    options = RunOptions(chunk_elements=1000, use_cache=False)
    variants = [
        Variant("ram-plus", "ram-plus", {}),
        Variant("ram", "ram", {}),
        Variant("ta", "task-arithmetic", {"scale": 0.5}),
        Variant("ties", "ties", {}),
    ]
    before = lora.computed_elements
    workflow.compare(_spec(folder, adapter), variants, tmp_path / "cmp", options=options)
    assert lora.computed_elements - before == once  # a probe pass, TIES's refining passes and the merge pass

    before = lora.computed_elements
    workflow.merge(_spec(folder, adapter, tmp_path / "single", "ties"), options)
    assert lora.computed_elements - before == once
    single = (tmp_path / "single" / "model.safetensors").read_bytes()
    assert (tmp_path / "cmp" / "ties" / "model.safetensors").read_bytes() == single
    # the weights were hashed as they were written: the manifest holds the file's own content hash
    for folder in (tmp_path / "single", *(tmp_path / "cmp" / v.name for v in variants)):
        listed = json.loads((folder / "ram-manifest.json").read_text())["files"]["model.safetensors"]
        assert listed["xxh3_128"] == xxhash.xxh3_128((folder / "model.safetensors").read_bytes()).hexdigest()

    # outside a run's scope each read computes the rows again (what the scope saves)
    before = lora.computed_elements
    with lora.open_delta(adapter / lora.DELTA_FILE) as handle:
        for _ in range(2):
            handle.get_tensor(TARGETS[0] + ".weight")
    assert lora.computed_elements - before == 2 * 64 * 64


def test_a_search_computes_the_adapters_task_vector_once_for_all_its_trials(demo, tmp_path):
    pytest.importorskip("optuna")
    pytest.importorskip("transformers")
    from ram_desktop.evaluate.search import SearchOptions, search

    folder, adapter = demo
    suites = [folder / "suites" / "validation" / t for t in ("code", "tool")]
    options = SearchOptions(
        spec=_spec(folder, adapter),
        suites=[str(s) for s in suites],
        test_suites=[],
        folder=tmp_path / "search",
        trials=3,
        methods=["task-arithmetic", "ties"],
        limit=4,
        batch_size=8,
    )
    before = lora.computed_elements
    result = search(options)
    assert len(result.trials) == 3
    assert lora.computed_elements - before == _adapted_elements(folder)


def test_past_its_budget_the_store_computes_again(demo, tmp_path, monkeypatch):
    """The temporary files stay within ``DeltaStore.BUDGET``: with no budget, each pass computes τ again (TIES:
    the probe, one refining pass, the merge), the same bytes."""
    folder, adapter = demo
    options = RunOptions(chunk_elements=1000, use_cache=False)
    workflow.merge(_spec(folder, adapter, tmp_path / "kept", "ties"), options)
    monkeypatch.setattr(lora.DeltaStore, "BUDGET", 0)
    before = lora.computed_elements
    workflow.merge(_spec(folder, adapter, tmp_path / "again", "ties"), options)
    assert lora.computed_elements - before > _adapted_elements(folder)
    assert (tmp_path / "again" / "model.safetensors").read_bytes() == (
        tmp_path / "kept" / "model.safetensors"
    ).read_bytes()
