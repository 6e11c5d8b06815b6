"""Inspection statistics (SPEC.md section 10) against plain whole-tensor computations, the layer ×
module grid against the per-layer and whole-model counts, and "would keep" against real merges."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from ram_desktop.core import MergeSpec, RunOptions, pipeline
from ram_desktop.core.engine.inspection import ULP_BINS, module_grid
from ram_desktop.core.engine.probe import ProbeReport, cache_dir
from ram_desktop.core.methods import PROBE_STATISTICS
from ram_desktop.core.methods.would_keep import would_keep

from .conftest import SMALL_CONFIG, make_models
from .reference import load_model
from .synthetic import demo_shapes, write_model

EPS = 1e-5


def _whole(base: Path, agents: list[Path]) -> tuple[dict, dict, list[dict]]:
    b = load_model(base)
    return b, {}, [load_model(a) for a in agents]


def _reference(base: Path, agents: list[Path], eps: float = EPS) -> dict:
    """Every statistic from whole tensors with numpy, element by element in plain terms."""
    b, _, ags = _whole(base, agents)
    n = len(ags)
    sets: dict[tuple[int, ...], int] = {}
    both = np.zeros((n, n), dtype=np.int64)
    same = np.zeros((n, n), dtype=np.int64)
    ulps = np.zeros((n, ULP_BINS), dtype=np.int64)
    for name, bt in b.items():
        if not bt.is_floating_point():
            continue
        bf = bt.to(torch.float32).numpy().reshape(-1)
        taus = [a[name].to(torch.float32).numpy().reshape(-1) - bf for a in ags]
        masks = [np.abs(t) > np.float32(eps) for t in taus]
        members = np.stack(masks, 1)
        keys, counts = np.unique(members, axis=0, return_counts=True)
        for key, c in zip(keys, counts):
            if key.any():
                s = tuple(int(t) for t in np.flatnonzero(key))
                sets[s] = sets.get(s, 0) + int(c)
        for x in range(n):
            for y in range(n):
                joint = masks[x] & masks[y]
                both[x, y] += int(joint.sum())
                same[x, y] += int((joint & (np.sign(taus[x]) == np.sign(taus[y]))).sum())
            # every 8th row of the tensor (element of a 1-D one): |τ| in ulps of the base value in bf16,
            # ulp = 2^(floor(log2 |b|) − 7), bin = floor(log2 ratio) + 1
            row = int(np.prod(bt.shape[1:])) if bt.dim() > 1 else 1
            sel = masks[x] & ((np.arange(bf.size) // row) % 8 == 0)
            _, e = np.frexp(np.abs(bf[sel]).astype(np.float64))
            e = np.maximum(np.where(bf[sel] == 0, -1000, e - 1), -119)
            ratio = np.abs(taus[x][sel]).astype(np.float64) / np.exp2(e - 7.0)
            _, bins = np.frexp(ratio)
            np.add.at(ulps[x], np.clip(bins, 1, ULP_BINS - 1), 1)
    return {"sets": sets, "both": both, "same": same, "ulps": ulps}


NINE = {f"x{i}": 0.05 + 0.07 * i for i in range(9)}  # above JOINT_MAX_AGENTS: signs from products


@pytest.mark.parametrize("shards,chunk,agents", [(1, 1 << 19, None), (3, 1000, None), (2, 700, NINE)])
def test_intersections_pairs_and_ulps_equal_a_whole_tensor_computation(tmp_path, shards, chunk, agents):
    spec = agents or {"a": 0.5, "b": 0.55, "c": 0.04, "d": 0.3}
    base, agents = make_models(tmp_path / "in", shards=shards, agents=spec)
    report = pipeline.probe(
        MergeSpec.build(str(base), [str(a) for a in agents], eps=EPS, device="cpu"),
        RunOptions(use_cache=False, chunk_elements=chunk),
    )
    ref = _reference(base, agents)
    names = report.names
    data = report.to_json()
    got_sets = {tuple(names.index(a) for a in e["agents"]): e["count"] for e in data["intersections"]}
    assert got_sets == ref["sets"]
    assert all(e["count"] > 0 for e in data["intersections"])
    assert len(data["pairs"]) == len(spec) * (len(spec) - 1) // 2
    for e in data["pairs"]:
        x, y = (names.index(a) for a in e["agents"])
        assert x < y
        assert e["both"] == ref["both"][x, y] and e["same_sign"] == ref["same"][x, y]
    assert np.array_equal(np.array(data["ulp_histogram"]["counts"]), ref["ulps"])
    # the counts agree with the probe's own: a set's members each count it once
    for t, a in enumerate(report.agents):
        assert sum(c for s, c in ref["sets"].items() if t in s) == a.updated
    assert data["ulp_histogram"]["stride"] == 8 and len(data["ulp_histogram"]["bins"]) == ULP_BINS


def test_ulp_bins_are_the_bit_distance_within_a_binade(tmp_path):
    """The documented meaning of the bins: for a change that stays within one binade (same sign and
    exponent bits in bf16), the bin is the bit length of |bits(agent) − bits(base)|. Checked element by
    element with the definition the engine matches exactly (previous test)."""
    base, agents = make_models(tmp_path / "in")
    b, _, ags = _whole(base, agents)
    checked = 0
    for a in ags:
        for name, bt in b.items():
            bb = bt.view(torch.int16).numpy().astype(np.int64).reshape(-1)
            ab = a[name].view(torch.int16).numpy().astype(np.int64).reshape(-1)
            same_binade = ((bb >> 7) == (ab >> 7)) & (bb != ab) & ((bb & 0x7F80) != 0)
            bf = bt.to(torch.float32).numpy().reshape(-1)[same_binade].astype(np.float64)
            af = a[name].to(torch.float32).numpy().reshape(-1)[same_binade].astype(np.float64)
            _, e = np.frexp(np.abs(bf))
            _, bins = np.frexp(np.abs(af - bf) / np.exp2(e - 1 - 7.0))
            bit_length = np.array([int(d).bit_length() for d in np.abs(ab - bb)[same_binade]])
            assert np.array_equal(bins, bit_length)
            checked += int(same_binade.sum())
    assert checked > 10000


def test_module_grid_sums_to_layers_and_whole_model(tmp_path):
    base, agents = make_models(tmp_path / "in", shards=2)
    report = pipeline.probe(
        MergeSpec.build(str(base), [str(a) for a in agents], eps=EPS, device="cpu"), RunOptions(use_cache=False)
    )
    grid = module_grid(report.tensor_stats, len(report.agents))
    assert grid.rows == ["0", "1", "other"]
    assert grid.columns[:8] == ["embeddings", "q", "k", "v", "o", "gate", "up", "down"]
    assert "norms" in grid.columns and "lm_head" in grid.columns
    layers = {g["name"]: g for g in report.layers()}
    for r, row in enumerate(grid.rows):
        if row == "other":
            continue
        g = layers[f"model.layers.{row}"]
        assert sum(grid.params[r]) == g["params"]
        for t in range(len(report.agents)):
            assert sum(grid.updated[t][r]) == g["updated"][t]
            assert sum(grid.unique[t][r]) == g["unique"][t]
    other = [g for name, g in layers.items() if not name.startswith("model.layers.")]
    assert sum(grid.params[-1]) == sum(g["params"] for g in other)
    assert sum(map(sum, grid.params)) == report.params
    for t, a in enumerate(report.agents):
        assert sum(map(sum, grid.updated[t])) == a.updated
        assert sum(map(sum, grid.unique[t])) == a.unique
    # every tensor sits in exactly one cell
    assert sorted(n for row in grid.tensors for cell in row for n in cell) == sorted(
        s.name for s in report.tensor_stats
    )


def _float32_models(folder: Path) -> tuple[Path, list[Path]]:
    """Continuous updates (no two agents' τ cancel exactly), sparse and overlapping, in float32."""
    gen = torch.Generator().manual_seed(3)
    shapes = demo_shapes(SMALL_CONFIG)
    base = {k: torch.randn(s, generator=gen) * 0.05 for k, s in shapes.items()}
    cfg = dict(SMALL_CONFIG, torch_dtype="float32")
    dirs = []
    for name, density in (("a", 0.5), ("b", 0.3), ("c", 0.1)):
        tensors = {}
        for k, b in base.items():
            mask = torch.rand(b.shape, generator=gen) < density
            tensors[k] = b + torch.where(mask, torch.randn(b.shape, generator=gen) * 0.01, 0.0)
        dirs.append(write_model(folder / name, tensors, cfg))
    return write_model(folder / "base", base, cfg), dirs


def _measured_share(base: Path, agents: list[Path], merged: Path, active_only: bool) -> list[float]:
    """Per agent: the mean over its updated elements of w_i, read off the merged output as
    τ_merged,i / Σ_s τ_s,i (the sum over the active agents for RAM, all agents otherwise)."""
    b, _, ags = _whole(base, agents)
    out = load_model(merged)
    n = len(ags)
    kept, total = np.zeros(n), np.zeros(n)
    for name, bt in b.items():
        bf = bt.numpy().reshape(-1)
        taus = [(a[name].numpy().reshape(-1) - bf).astype(np.float64) for a in ags]  # float32 difference, widened
        masks = [np.abs(t) > EPS for t in taus]
        merged_tau = out[name].numpy().reshape(-1).astype(np.float64) - bf.astype(np.float64)
        denom = sum(np.where(m, t, 0.0) for m, t in zip(masks, taus)) if active_only else sum(taus)
        w = np.divide(merged_tau, denom, out=np.zeros_like(denom), where=denom != 0)
        for t in range(n):
            kept[t] += float(np.sum(w[masks[t]]))
            total[t] += int(masks[t].sum())
    return list(kept / total)


@pytest.mark.parametrize(
    "method,params,active_only",
    [
        ("ram", {}, True),
        ("ram-plus", {"r": 0.5, "alpha": 2.0}, True),
        ("ram-plus-soft", {"r": 0.3}, True),
        ("average", {}, False),
        ("task-arithmetic", {"scale": 0.3}, False),
        ("task-arithmetic", {"scale": 0.7}, False),
    ],
)
def test_would_keep_equals_what_the_merge_keeps(tmp_path, method, params, active_only):
    base, agents = _float32_models(tmp_path / "in")
    report = pipeline.probe(
        MergeSpec.build(str(base), [str(a) for a in agents], eps=EPS, device="cpu"), RunOptions(use_cache=False)
    )
    predicted = would_keep(report, method, params)
    out = tmp_path / "out"
    pipeline.merge(
        pipeline.MergeSpec.build(
            str(base), [str(a) for a in agents], out, method, params, eps=EPS, device="cpu", out_dtype="float32"
        ),
        options=pipeline.RunOptions(use_cache=False),
    )
    measured = _measured_share(base, agents, out, active_only)
    assert predicted == pytest.approx(measured, rel=1e-5)
    if method == "ram":  # a sparse agent whose updates mostly overlap keeps much less than a dense one
        assert 0.3 < min(predicted) < max(predicted) < 1.0


def test_would_keep_estimates_for_ties_and_dare():
    """With no sign conflicts TIES and DARE-TIES keep unique updates whole and average shared ones
    among the agents present; DARE-TA keeps λ in expectation."""
    from ram_desktop.core.methods.baselines import election_weight as _election_weight

    assert _election_weight(0, 0.3, 0.5) == 1.0
    assert _election_weight(1, 1.0, 1.0) == pytest.approx(0.5)  # both present and agreeing: halved
    assert _election_weight(1, 0.0, 1.0) == pytest.approx(0.5)  # one disagrees: a coin flip, kept whole
    assert _election_weight(2, 1.0, 0.5) == pytest.approx(0.25 * 1 + 0.5 * 0.5 + 0.25 / 3)


def test_old_cached_report_is_recomputed_for_analyze_and_still_serves_a_merge(tmp_path, models):
    base, agents = models
    first = pipeline.probe(MergeSpec.build(str(base), [str(a) for a in agents], eps=EPS, device="cpu"))
    path = next(cache_dir().glob("*.json"))
    sealed = json.loads(path.read_text())  # {"format": "ram-probe-cache/1", ..., "sha256", "report"}
    data = sealed["report"]
    for key in ("intersections", "pairs", "ulp_histogram"):
        data.pop(key)

    def cache_text(report: dict) -> str:  # an earlier version's report, sealed as the cache seals one
        canonical = json.dumps(report, sort_keys=True, separators=(",", ":")).encode()
        return json.dumps(dict(sealed, report=report, sha256=hashlib.sha256(canonical).hexdigest()))

    path.write_text(cache_text(data))
    old = ProbeReport.from_json(data)
    assert old.inspect is None and not old.complete
    assert would_keep(old, "ties", {}) == [None] * 3  # needs the pair statistics
    assert None not in would_keep(old, "ram", {})  # from the overlap counts alone
    again = pipeline.probe(MergeSpec.build(str(base), [str(a) for a in agents], eps=EPS, device="cpu"))
    assert again.inspect is not None and again.to_json()["pairs"] == first.to_json()["pairs"]
    # the round trip keeps every new key
    back = ProbeReport.from_json(json.loads(json.dumps(again.to_json())), PROBE_STATISTICS)
    assert back.to_json() == again.to_json()
    assert back.renamed(["x", "y", "z"], ["1", "2", "3"]).to_json()["pairs"][0]["agents"] == ["x", "y"]
    # a merge's pass 1 (counts only) may reuse the old report
    path.write_text(cache_text(data))
    result = pipeline.merge(
        pipeline.MergeSpec.build(
            str(base), [str(a) for a in agents], tmp_path / "out", "ram-plus", eps=EPS, device="cpu"
        )
    )
    assert result.report["agents"][0]["updated"] == first.agents[0].updated


def test_cli_probe_json_has_intersections_and_pairs(tmp_path, models):
    base, agents = models
    out = tmp_path / "probe.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ram_desktop",
            "probe",
            str(base),
            *map(str, agents),
            "--json",
            str(out),
            "--device",
            "cpu",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert {"intersections", "pairs", "ulp_histogram"} <= set(data)
    for _t, agent in enumerate(data["agents"]):  # each agent's sets add up to what it updates
        assert sum(e["count"] for e in data["intersections"] if agent["name"] in e["agents"]) == agent["updated"]
    assert [p["agents"] for p in data["pairs"]] == [["alpha", "beta"], ["alpha", "gamma"], ["beta", "gamma"]]
