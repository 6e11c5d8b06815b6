"""TIES runs on every compute thread and gives the same bytes for any thread count and chunk size:
the trim collector's histograms are order-independent, and each chunk's merge reads its offset
among the equal-to-cut elements from the collector (ties at the cut keep the earliest positions,
across chunk and tensor boundaries). Checked against the plain numpy reference in ``reference.py``."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from ram_desktop.core import MergeSpec, RunOptions
from ram_desktop.core.engine import kernels
from ram_desktop.core.engine.chunks import make_chunk, prefetch_chunks
from ram_desktop.core.engine.plan import make_plan
from ram_desktop.core.events import Reporter
from ram_desktop.core.methods import baselines, get_method
from ram_desktop.core.methods.baselines import TrimCollector
from ram_desktop.core.pipeline import merge, open_sources
from ram_desktop.core.storage.transfer import Transfer

from . import reference as ref
from .conftest import SMALL_CONFIG, make_models
from .synthetic import write_model

EPS = 1e-5
KERNEL_PATHS = ["torch"] + (["kernels"] if kernels.available() else [])


class _Stages(Reporter):
    def __init__(self) -> None:
        super().__init__()
        self.stages: list[str] = []

    def progress(self, stage: str, done: int, total: int, unit: str = "B", detail: str = "") -> None:
        if not self.stages or self.stages[-1] != stage:
            self.stages.append(stage)


def _merge(
    base_dir, agent_dirs, out, params, threads, chunk, monkeypatch, path="torch", out_dtype="float32", reporter=None
):
    monkeypatch.setenv("RAM_DESKTOP_THREADS", str(threads))
    if path == "torch":
        monkeypatch.setenv("RAM_DESKTOP_KERNELS", "0")
    else:
        monkeypatch.delenv("RAM_DESKTOP_KERNELS", raising=False)
    kernels.available.cache_clear()
    try:
        merge(
            MergeSpec.build(
                str(base_dir), [str(a) for a in agent_dirs], out, "ties", params, out_dtype=out_dtype, device="cpu"
            ),
            reporter,
            options=RunOptions(chunk_elements=chunk, use_cache=False),
        )
    finally:
        kernels.available.cache_clear()
    return out


def _expected(base_dir, agent_dirs, params, torch_dtype):
    base, agents = open_sources(str(base_dir), [str(a) for a in agent_dirs], Reporter())
    order = [j.name for j in make_plan(base, agents).jobs]
    full = get_method("ties").resolve(params)
    return ref.baseline_model(
        ref.load_model(base_dir), [ref.load_model(a) for a in agent_dirs], order, "ties", full, torch_dtype
    )


def _assert_equal_models(got_dir, want):
    got = ref.load_model(got_dir)
    assert got.keys() == want.keys()
    for name in want:
        assert got[name].dtype == want[name].dtype, name
        assert torch.equal(got[name], want[name]), name


def _weights(folder) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(folder.glob("*.safetensors")))


@pytest.mark.parametrize("path", KERNEL_PATHS)
@pytest.mark.parametrize("scope", ["tensor", "model"])
def test_ties_same_bytes_for_any_threads_and_chunk_size(models, tmp_path, monkeypatch, scope, path):
    """1, 2 and 4 compute threads, chunks from whole tensors down to one row (one element for the 1-D
    norms and biases): identical bytes, equal to the numpy reference."""
    base_dir, agent_dirs = models
    params = {"density": 0.2, "ties_scope": scope}
    want = _expected(base_dir, agent_dirs, params, torch.float32)
    outputs = []
    for i, (threads, chunk) in enumerate([(1, 1 << 22), (2, 1), (4, 7), (2, 1000), (4, 1)]):
        out = _merge(base_dir, agent_dirs, tmp_path / f"out{i}", params, threads, chunk, monkeypatch, path)
        _assert_equal_models(out, want)
        outputs.append(_weights(out))
    assert len(set(outputs)) == 1


@pytest.mark.parametrize("path", KERNEL_PATHS)
@pytest.mark.parametrize("scope", ["tensor", "model"])
def test_ties_float64_keys_any_threads(tmp_path, monkeypatch, scope, path):
    """float64 inputs: 64-bit magnitude keys, four radix levels; the same bytes on 1 and 3 threads."""
    base_dir, agent_dirs = make_models(tmp_path / "in", dtype=torch.float64)
    params = {"density": 0.3, "scale": 0.7, "ties_scope": scope}
    want = _expected(base_dir, agent_dirs, params, torch.float64)
    for i, (threads, chunk) in enumerate([(1, 1 << 22), (3, 7)]):
        out = _merge(
            base_dir, agent_dirs, tmp_path / f"out{i}", params, threads, chunk, monkeypatch, path, out_dtype="base"
        )
        _assert_equal_models(out, want)


def _equal_magnitude_models(folder, n_agents):
    """Base 1.0 and agents whose task vectors have one of two magnitudes, ±2^-6 (about 30 %) or ±2^-7
    (bf16 steps from 1.0), with seeded signs, in three tensors: long runs of equal magnitudes tie at
    the cut."""
    gen = torch.Generator().manual_seed(3)
    shapes = {"a.weight": (5, 4), "b.bias": (3,), "c.weight": (6, 4)}
    base = {name: torch.ones(shape, dtype=torch.bfloat16) for name, shape in shapes.items()}
    base_dir = write_model(folder / "base", base, SMALL_CONFIG)
    agent_dirs = []
    for t in range(n_agents):
        tensors = {}
        for name, shape in shapes.items():
            sign = torch.where(torch.rand(shape, generator=gen) < 0.5, -1.0, 1.0)
            step = torch.where(torch.rand(shape, generator=gen) < 0.3, 2.0**-6, 2.0**-7)
            tensors[name] = (1.0 + sign * step).to(torch.bfloat16)  # exact: both are bf16 values
        agent_dirs.append(write_model(folder / f"agent{t}", tensors, SMALL_CONFIG))
    return base_dir, agent_dirs


@pytest.mark.parametrize("path", KERNEL_PATHS)
def test_ties_cut_ties_span_chunks_and_tensors(tmp_path, monkeypatch, path):
    """One agent whose |τ| is one of two values: with model scope the cut falls inside the run of equal
    magnitudes, which spans chunks and tensors; the earliest positions in scope order (tensors in name
    order, then flat index) are kept, whatever the threads and chunks."""
    base_dir, (agent_dir,) = _equal_magnitude_models(tmp_path / "in", 1)
    base, agent = ref.load_model(base_dir), ref.load_model(agent_dir)
    order = ["a.weight", "b.bias", "c.weight"]
    tau = np.concatenate([(agent[n].float() - base[n].float()).numpy().reshape(-1) for n in order])
    big = np.abs(tau) == 2.0**-6
    k = 37  # ⌊0.8 · 47⌋
    assert big.sum() < k < tau.size
    # kept: every large magnitude, then the first (k − #large) small ones in scope order
    small_rank = np.cumsum(~big)
    want_kept = big | (~big & (small_rank <= k - big.sum()))
    cut_at = int(np.flatnonzero(~big & (small_rank == k - big.sum()))[0])
    assert cut_at >= 23  # past the first two tensors (20 + 3 elements): the tied run spans tensors
    for i, (threads, chunk) in enumerate([(1, 1 << 22), (2, 1), (4, 4), (3, 3)]):
        out = _merge(
            base_dir,
            [agent_dir],
            tmp_path / f"out{i}",
            {"density": 0.8, "ties_scope": "model"},
            threads,
            chunk,
            monkeypatch,
            path,
            out_dtype="base",
        )
        merged = ref.load_model(out)
        got = np.concatenate([(merged[n].float() - base[n].float()).numpy().reshape(-1) for n in order])
        assert np.array_equal(got != 0, want_kept), (threads, chunk)
        assert np.array_equal(got[want_kept], tau[want_kept])


@pytest.mark.parametrize("path", KERNEL_PATHS)
@pytest.mark.parametrize("scope", ["tensor", "model"])
def test_ties_equal_magnitudes_three_agents_match_reference(tmp_path, monkeypatch, scope, path):
    base_dir, agent_dirs = _equal_magnitude_models(tmp_path / "in", 3)
    params = {"density": 0.4, "ties_scope": scope}
    want = _expected(base_dir, agent_dirs, params, torch.float32)
    for i, (threads, chunk) in enumerate([(1, 1 << 22), (4, 1), (2, 5)]):
        _assert_equal_models(
            _merge(base_dir, agent_dirs, tmp_path / f"out{i}", params, threads, chunk, monkeypatch, path), want
        )


def _chunks(plan, chunk_elements):
    cpu = Transfer(torch.device("cpu"))
    jobs = [i for i, j in enumerate(plan.jobs) if j.mergeable]
    return [
        make_chunk(index, plan.jobs[index], span, b, a, EPS)
        for index, span, b, a in prefetch_chunks(plan, jobs, chunk_elements, cpu)
    ]


def _collect(plan, chunks, scope, shuffle_seed=None):
    collector = TrimCollector(0.2, scope, plan)
    passes = 0
    while True:
        passes += 1
        order = list(chunks)
        if shuffle_seed is not None:
            random.Random(shuffle_seed + passes).shuffle(order)
        for chunk in order:
            collector.add(chunk)
        if not collector.next_pass():
            return collector.finish(), passes


@pytest.mark.parametrize("scope", ["tensor", "model"])
def test_trim_collector_counts_chunks_in_any_order(models, scope):
    """Chunks fed in a shuffled order (as compute threads finish them) give the same cuts and the
    same per-chunk offsets as plan order."""
    base, agents = open_sources(str(models[0]), [str(a) for a in models[1]], Reporter())
    plan = make_plan(base, agents)
    chunks = _chunks(plan, 50)
    in_order, passes = _collect(plan, chunks, scope)
    assert passes == 2
    for seed in (1, 2):
        shuffled, _ = _collect(plan, chunks, scope, shuffle_seed=seed)
        assert shuffled.cuts == in_order.cuts
        assert shuffled.equal_before == in_order.equal_before
    assert len(in_order.equal_before) == len(chunks)


@pytest.mark.parametrize("scope", ["tensor", "model"])
def test_ties_counts_equal_elements_in_a_pass_over_budget(models, tmp_path, monkeypatch, scope):
    """When the sparse last-level records would exceed their budget, they are dropped and one more pass
    counts each chunk's elements equal to the cut: the same bytes as with the records."""
    base_dir, agent_dirs = models
    params = {"density": 0.2, "ties_scope": scope}
    within = _merge(base_dir, agent_dirs, tmp_path / "within", params, 2, 7, monkeypatch)
    monkeypatch.setattr(baselines, "EQUAL_RECORD_BUDGET", 0)
    stages = _Stages()
    over = _merge(base_dir, agent_dirs, tmp_path / "over", params, 2, 7, monkeypatch, reporter=stages)
    assert "refine 3" in stages.stages  # probe (level 0), refine 2 (level 1), refine 3 (the count)
    assert _weights(over) == _weights(within)
    _assert_equal_models(over, _expected(base_dir, agent_dirs, params, torch.float32))
