"""Probe counts, ρ, λ and merged tensors equal the plain whole-tensor reference, bit for bit."""

from __future__ import annotations

import math

import pytest
import torch

from ram_desktop.core import MergeSpec, RunOptions
from ram_desktop.core.methods import get_method
from ram_desktop.core.methods.ram_rescale import survival_histograms, survival_share
from ram_desktop.core.pipeline import merge, probe

from . import reference as ref
from .conftest import make_models

EPS = 1e-5


def _check_probe(report, base_dir, agent_dirs, eps=EPS):
    base = ref.load_model(base_dir)
    agents = [ref.load_model(a) for a in agent_dirs]
    expected = ref.probe_counts(ref.task_vectors(base, agents), eps)
    assert report.params == expected["params"]
    for t, a in enumerate(report.agents):
        assert a.unique == expected["unique"][t]
        assert a.shared == expected["shared"][t]
        assert a.overlap == expected["overlap"][t]
        assert a.updated == expected["unique"][t] + expected["shared"][t]
        assert a.density == a.updated / expected["params"]
        assert a.rho == expected["rho"][t]
    return base, agents, expected


@pytest.mark.parametrize("layout", ["single", "sharded"])
def test_probe_counts_match_reference(tmp_path, layout):
    base_dir, agent_dirs = make_models(tmp_path, shards=1 if layout == "single" else 3)
    report = probe(MergeSpec.build(str(base_dir), [str(a) for a in agent_dirs], eps=EPS), RunOptions(use_cache=False))
    _, _, expected = _check_probe(report, base_dir, agent_dirs)
    # the fixture really is RL-like: a sparse agent, dense agents, all three overlap patterns present
    assert report.agents[2].density < 0.1 < report.agents[0].density
    assert all(k > 0 for k in expected["overlap"][0])


def test_probe_with_other_eps_matches_reference(models):
    base_dir, agent_dirs = models
    report = probe(MergeSpec.build(str(base_dir), [str(a) for a in agent_dirs], eps=3e-4), RunOptions(use_cache=False))
    _check_probe(report, base_dir, agent_dirs, eps=3e-4)


CASES = [
    ("ram", {}),
    ("ram-plus", {"r": 0.1, "alpha": 2.0}),
    ("ram-plus", {"r": 0.25, "alpha": 0.5}),
    ("ram-plus-soft", {"r": 0.1}),
]


@pytest.mark.parametrize("layout", ["single", "sharded"])
@pytest.mark.parametrize("method,params", CASES)
def test_merge_matches_reference(tmp_path, layout, method, params):
    base_dir, agent_dirs = make_models(tmp_path / "in", shards=1 if layout == "single" else 3)
    result = merge(
        MergeSpec.build(
            str(base_dir), [str(a) for a in agent_dirs], tmp_path / "out", method, params, out_dtype="float32"
        )
    )
    base, agents, expected = _check_probe(result.probe, base_dir, agent_dirs)
    if method == "ram":
        lambdas = [1.0] * 3
    elif method == "ram-plus":
        lambdas = ref.lambdas_ram_plus(expected["rho"], params["r"], params["alpha"])
    else:
        lambdas = ref.lambdas_ram_plus_soft(expected["unique"], expected["shared"], params["r"])
    assert result.lambdas == pytest.approx(lambdas, rel=1e-15, abs=0)
    want = ref.merged_model(base, agents, EPS, lambdas, torch.float32)
    got = ref.load_model(tmp_path / "out")
    assert got.keys() == want.keys()
    for name in want:
        assert got[name].dtype == torch.float32
        assert torch.equal(got[name], want[name]), name


@pytest.mark.parametrize(
    "out_dtype,torch_dtype", [("base", torch.bfloat16), ("bfloat16", torch.bfloat16), ("float16", torch.float16)]
)
def test_rounds_once_to_output_dtype(models, tmp_path, out_dtype, torch_dtype):
    base_dir, agent_dirs = models
    result = merge(
        MergeSpec.build(str(base_dir), [str(a) for a in agent_dirs], tmp_path / "out", "ram-plus", out_dtype=out_dtype)
    )
    want = ref.merged_model(
        ref.load_model(base_dir), [ref.load_model(a) for a in agent_dirs], EPS, result.lambdas, torch_dtype
    )
    got = ref.load_model(tmp_path / "out")
    for name in want:
        assert torch.equal(got[name], want[name]), name


def test_float64_inputs_compute_in_float64(tmp_path):
    base_dir, agent_dirs = make_models(tmp_path / "in", dtype=torch.float64)
    result = merge(MergeSpec.build(str(base_dir), [str(a) for a in agent_dirs], tmp_path / "out", "ram-plus"))
    want = ref.merged_model(ref.load_model(base_dir), [ref.load_model(a) for a in agent_dirs], EPS, result.lambdas)
    got = ref.load_model(tmp_path / "out")
    for name in want:
        assert got[name].dtype == torch.float64
        assert torch.equal(got[name], want[name]), name


def test_infinite_rho_clips_to_alpha(tmp_path):
    """An agent whose every update overlaps another has ρ = ∞: clip(∞) = α, report says null."""
    from .conftest import SMALL_CONFIG
    from .synthetic import demo_shapes, write_model

    gen = torch.Generator().manual_seed(3)
    shapes = demo_shapes(SMALL_CONFIG)
    base = {k: (0.02 * torch.randn(s, generator=gen)).to(torch.bfloat16) for k, s in shapes.items()}
    wide = {
        k: (v.float() + 0.01 * (torch.rand(v.shape, generator=gen) < 0.5)).to(torch.bfloat16) for k, v in base.items()
    }
    narrow = {k: torch.where(torch.rand(v.shape, generator=gen) < 0.3, wide[k], v) for k, v in base.items()}
    dirs = [write_model(tmp_path / n, t, SMALL_CONFIG) for n, t in [("base", base), ("wide", wide), ("narrow", narrow)]]
    result = merge(
        MergeSpec.build(
            str(dirs[0]), [str(dirs[1]), str(dirs[2])], tmp_path / "out", "ram-plus", {"r": 0.1, "alpha": 2.0}
        )
    )
    assert result.probe.agents[1].unique == 0 and math.isinf(result.probe.agents[1].rho)
    assert result.lambdas[1] == 1 + 0.1 * 2.0
    assert result.report["agents"][1]["rho"] is None


def test_results_do_not_depend_on_chunk_size(models, tmp_path):
    base_dir, agent_dirs = models
    outputs = []
    for i, chunk in enumerate([7, 1000, 1 << 22]):
        out = tmp_path / f"out{i}"
        merge(
            MergeSpec.build(str(base_dir), [str(a) for a in agent_dirs], out, "ram-plus"),
            options=RunOptions(chunk_elements=chunk, use_cache=False),
        )
        outputs.append((out / "model.safetensors").read_bytes())
    assert outputs[0] == outputs[1] == outputs[2]


def test_cached_probe_is_reused_and_equal(models, tmp_path, caplog):
    base_dir, agent_dirs = models
    first = probe(MergeSpec.build(str(base_dir), [str(a) for a in agent_dirs]))
    caplog.set_level("INFO", logger="ram_desktop")
    second = probe(MergeSpec.build(str(base_dir), [str(a) for a in agent_dirs], names=["x", "y", "z"]))
    assert "reusing the cached probe" in caplog.text
    assert second.names == ["x", "y", "z"]
    assert [a.unique for a in second.agents] == [a.unique for a in first.agents]
    assert survival_histograms(second) == survival_histograms(first) != {}


def test_survival_share_matches_direct_rounding(models):
    """The probe's λ* histogram agrees with rounding rescaled unique elements directly (to a bin's width)."""
    base_dir, agent_dirs = models
    report = probe(MergeSpec.build(str(base_dir), [str(a) for a in agent_dirs]), RunOptions(use_cache=False))
    base = ref.load_model(base_dir)
    agents = [ref.load_model(a) for a in agent_dirs]
    tv = ref.task_vectors(base, agents)
    for lam in (1.1, 1.25, 1.6):
        for dtype_name, dtype in [("bfloat16", torch.bfloat16), ("float16", torch.float16)]:
            changed = total = 0
            for b, taus in tv.values():
                masks = [abs(t) > EPS for t in taus]
                c = sum(m.astype(int) for m in masks)
                bt, tt = torch.from_numpy(b), torch.from_numpy(taus[0])
                sel = torch.from_numpy(masks[0] & (c == 1))
                ram = (bt + tt)[sel].to(dtype)
                plus = (bt + torch.tensor(lam, dtype=torch.float32) * tt)[sel].to(dtype)
                changed += int((ram != plus).sum())
                total += int(sel.sum())
            direct = changed / total
            lo = survival_share(report, 0, dtype_name, lam - 0.002)
            hi = survival_share(report, 0, dtype_name, lam + 0.002)
            assert lo - 1e-3 <= direct <= hi + 1e-3, (lam, dtype_name, lo, direct, hi)
    assert survival_share(report, 0, "float32", 1.1) > 0.99
    assert survival_share(report, 0, "bfloat16", 1.1) < 0.1


def test_method_registry_schema():
    plus = get_method("ram-plus")
    assert [p.name for p in plus.params] == ["r", "alpha"]
    assert plus.resolve({}) == {"r": 0.1, "alpha": 2.0}
    assert get_method("ram-plus-soft").resolve({"r": 0.3}) == {"r": 0.3}


@pytest.mark.parametrize("method,out_dtype", [("ram-plus", "bfloat16"), ("ram-plus-soft", "float16")])
def test_report_survival_is_an_exact_count(models, tmp_path, method, out_dtype):
    """merge-report.json's rescale_survival_share is counted in the merge pass for the actual λ and output
    dtype: it equals a direct whole-tensor count of unique elements whose rescaled value differs after
    rounding from the RAM value."""
    base_dir, agent_dirs = models
    result = merge(
        MergeSpec.build(str(base_dir), [str(a) for a in agent_dirs], tmp_path / "out", method, out_dtype=out_dtype),
        options=RunOptions(use_cache=False),
    )
    dtype = getattr(torch, out_dtype)
    tv = ref.task_vectors(ref.load_model(base_dir), [ref.load_model(a) for a in agent_dirs])
    expected = []
    for t, lam in enumerate(result.lambdas):
        changed = total = 0
        for b, taus in tv.values():
            masks = [abs(x) > EPS for x in taus]
            c = sum(m.astype(int) for m in masks)
            bt, tt = torch.from_numpy(b), torch.from_numpy(taus[t])
            sel = torch.from_numpy(masks[t] & (c == 1))
            ram = (bt + tt)[sel].to(dtype)
            plus = (bt + torch.tensor(lam, dtype=torch.float32) * tt)[sel].to(dtype)
            changed += int((ram != plus).sum())
            total += int(sel.sum())
        expected.append(changed / total if total else None)
    assert result.report["rescale_survival_share"] == {out_dtype: expected}
    assert any(e for e in expected)


def test_merge_probe_without_histograms_is_completed_by_analyze(models, tmp_path, caplog):
    """The merge's pass 1 caches a probe without the λ* histograms; Analyze (pipeline.probe) computes it
    completely instead of reusing it, and a later merge reuses the complete one."""
    base_dir, agent_dirs = models
    agents = [str(a) for a in agent_dirs]
    caplog.set_level("INFO", logger="ram_desktop")
    first = merge(MergeSpec.build(str(base_dir), agents, tmp_path / "a", "ram-plus"))
    assert not first.probe.counted and survival_histograms(first.probe) == {}
    assert first.report["has_survival"] is False
    caplog.clear()
    analyzed = probe(MergeSpec.build(str(base_dir), agents))
    assert "reusing the cached probe" not in caplog.text
    assert analyzed.counted and set(survival_histograms(analyzed)) == {"bfloat16", "float16", "float32"}
    assert [a.overlap for a in analyzed.agents] == [a.overlap for a in first.probe.agents]
    caplog.clear()
    again = merge(MergeSpec.build(str(base_dir), agents, tmp_path / "b", "ram-plus"))
    assert "reusing the cached probe" in caplog.text
    assert again.probe.counted
    assert again.report["rescale_survival_share"] == first.report["rescale_survival_share"]
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()
