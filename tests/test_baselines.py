"""Baselines (average, task arithmetic, TIES, DARE+TA, DARE+TIES) equal the plain whole-tensor
reference bit for bit; TIES keeps exactly ⌊k·n⌋ per scope; DARE's mask is seeded and chunk-independent."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from ram_desktop.cli import build_parser, main
from ram_desktop.core import MergeSpec, RunOptions
from ram_desktop.core.engine.chunks import Chunk, make_chunk, prefetch_chunks
from ram_desktop.core.engine.passes import probe_pass
from ram_desktop.core.engine.plan import make_plan
from ram_desktop.core.events import Reporter
from ram_desktop.core.methods import get_method
from ram_desktop.core.methods.baselines import TiesContext, TrimCollector, dare_uniform, keep_count, mix32
from ram_desktop.core.pipeline import merge, open_sources
from ram_desktop.core.storage.transfer import Transfer

from . import reference as ref
from .conftest import make_models

EPS = 1e-5
TIES_DEFAULTS = {"density": 0.2, "scale": 1.0, "ties_scope": "tensor"}


def _dirs(base_dir, agent_dirs):
    return str(base_dir), [str(a) for a in agent_dirs]


def _order(base_dir, agent_dirs) -> list[str]:
    base, agents = open_sources(*_dirs(base_dir, agent_dirs), Reporter())
    return [j.name for j in make_plan(base, agents).jobs]


def _check_against_reference(
    tmp_path,
    base_dir,
    agent_dirs,
    method,
    params,
    out_dtype="float32",
    torch_dtype=torch.float32,
    chunk_elements=1 << 22,
):
    out = tmp_path / f"out-{method}-{len(list(tmp_path.iterdir()))}"
    result = merge(
        MergeSpec.build(*_dirs(base_dir, agent_dirs), out, method, params, out_dtype=out_dtype),
        options=RunOptions(chunk_elements=chunk_elements),
    )
    full = get_method(method).resolve(params)
    want = ref.baseline_model(
        ref.load_model(base_dir),
        [ref.load_model(a) for a in agent_dirs],
        _order(base_dir, agent_dirs),
        method,
        full,
        torch_dtype,
    )
    got = ref.load_model(out)
    assert got.keys() == want.keys()
    for name in want:
        assert got[name].dtype == want[name].dtype, name
        assert torch.equal(got[name], want[name]), name
    return result, got


CASES = [
    ("average", {}),
    ("task-arithmetic", {}),
    ("task-arithmetic", {"scale": 0.7}),
    ("ties", {}),
    ("ties", {"ties_scope": "model"}),
    ("ties", {"density": 0.1, "scale": 0.5, "ties_scope": "model"}),
    ("ties", {"density": 0.3, "ties_scope": "tensor"}),
    ("dare-ta", {}),
    ("dare-ta", {"drop": 0.9, "seed": 5, "scale": 1.0}),
    ("dare-ties", {}),
    ("dare-ties", {"drop": 0.3, "seed": 11, "scale": 0.5}),
]


@pytest.mark.parametrize("layout", ["single", "sharded"])
@pytest.mark.parametrize("method,params", CASES)
def test_baseline_matches_reference(tmp_path, layout, method, params):
    base_dir, agent_dirs = make_models(tmp_path / "in", shards=1 if layout == "single" else 3)
    result, _ = _check_against_reference(tmp_path, base_dir, agent_dirs, method, params)
    assert result.report["method"] == method


@pytest.mark.parametrize("method,params", [("average", {}), ("ties", {"ties_scope": "model"}), ("dare-ties", {})])
def test_baseline_rounds_once_to_bf16(models, tmp_path, method, params):
    _check_against_reference(tmp_path, *models, method, params, out_dtype="base", torch_dtype=torch.bfloat16)


@pytest.mark.parametrize("method", ["task-arithmetic", "ties", "dare-ta"])
def test_baseline_float64_inputs(tmp_path, method):
    base_dir, agent_dirs = make_models(tmp_path / "in", dtype=torch.float64)
    params = {"ties_scope": "model"} if method == "ties" else {}
    _check_against_reference(
        tmp_path, base_dir, agent_dirs, method, params, out_dtype="base", torch_dtype=torch.float64
    )


@pytest.mark.parametrize(
    "method,params", [("ties", {"ties_scope": "tensor"}), ("ties", {"ties_scope": "model"}), ("dare-ties", {"seed": 3})]
)
def test_small_chunks_match_reference(models, tmp_path, method, params):
    """Seven-element chunks split every tensor (and the runs of tied magnitudes) across many chunks."""
    _check_against_reference(tmp_path, *models, method, params, chunk_elements=7)


# --- TIES trim counts ----------------------------------------------------------------------------


def _trim_masks(base_dir, agent_dirs, density, scope, chunk_elements=1 << 22):
    """Run the TIES collector passes and the trim through the engine's chunking; masks per tensor."""
    base, agents = open_sources(*_dirs(base_dir, agent_dirs), Reporter())
    plan = make_plan(base, agents)
    collector = TrimCollector(density, scope, plan)
    cpu = Transfer(torch.device("cpu"))
    passes = 1
    probe_pass(plan, EPS, cpu, Reporter(), [collector], chunk_elements)
    while collector.next_pass():
        passes += 1
        probe_pass(plan, EPS, cpu, Reporter(), [collector], chunk_elements)
    ctx = TiesContext(collector.finish(), 1.0)
    jobs = [i for i, j in enumerate(plan.jobs) if j.mergeable]
    parts: dict[str, list[torch.Tensor]] = {}
    for index, span, b, a in prefetch_chunks(plan, jobs, chunk_elements, cpu):
        chunk = make_chunk(index, plan.jobs[index], span, b, a, EPS)
        parts.setdefault(chunk.name, []).append(torch.stack(ctx.trim_masks(chunk)))
    return {name: torch.cat(p, dim=1).numpy() for name, p in parts.items()}, plan, passes


@pytest.mark.parametrize("scope", ["tensor", "model"])
@pytest.mark.parametrize("density", [0.1, 0.2, 0.29])
def test_ties_keeps_exactly_floor_k_n(models, scope, density):
    base_dir, agent_dirs = models
    masks, plan, passes = _trim_masks(base_dir, agent_dirs, density, scope)
    assert passes == 2  # float32 keys: top 16 bits in the probe pass, low 16 bits in one refinement pass
    tv = ref.task_vectors(ref.load_model(base_dir), [ref.load_model(a) for a in agent_dirs])
    order = [j.name for j in plan.jobs]
    want = ref.ties_trim_masks(tv, order, density, scope)
    ge_ratio = []
    for t in range(plan.n_agents):
        scopes = [[n] for n in order if n in tv] if scope == "tensor" else [[n for n in order if n in tv]]
        for group in scopes:
            n = sum(tv[name][0].size for name in group)
            k = max(1, math.floor(round(density * 100) * n / 100))  # exact for these two-digit densities
            assert sum(int(masks[name][t].sum()) for name in group) == k, (t, group[:1])
            for name in group:
                assert np.array_equal(masks[name][t], want[name][t]), (t, name)
            mags = np.concatenate([np.abs(tv[name][1][t]) for name in group])
            kth = np.sort(mags)[::-1][k - 1]
            ge_ratio.append(((mags >= kth).sum(), k))
    # the RL-like bf16 agents have many equal magnitudes: keeping everything ≥ the k-th would keep far more
    kept_ge = sum(g for g, _ in ge_ratio)
    kept = sum(k for _, k in ge_ratio)
    assert kept_ge > 1.5 * kept


def test_ties_trim_is_chunk_independent(models):
    base_dir, agent_dirs = models
    for scope in ("tensor", "model"):
        big, _, _ = _trim_masks(base_dir, agent_dirs, 0.2, scope)
        small, _, _ = _trim_masks(base_dir, agent_dirs, 0.2, scope, chunk_elements=7)
        assert big.keys() == small.keys()
        for name in big:
            assert np.array_equal(big[name], small[name]), (scope, name)


def test_ties_cut_on_all_equal_magnitudes_takes_earliest():
    """One tensor whose |τ| are all equal: the first ⌊k·n⌋ positions are kept, across chunks."""
    from types import SimpleNamespace

    n = 100
    job = SimpleNamespace(numel=n, compute_name="float32", mergeable=True)
    plan = SimpleNamespace(n_agents=2, jobs=[job])
    taus = torch.stack([torch.full((n,), 0.25), torch.where(torch.arange(n) % 2 == 0, 0.25, -0.25)])
    chunks = [Chunk(0, "w", s, torch.zeros(10), taus[:, s : s + 10].clone(), EPS) for s in range(0, n, 10)]
    for scope in ("tensor", "model"):
        collector = TrimCollector(0.29, scope, plan)
        while True:
            for c in chunks:
                collector.add(c)
            if not collector.next_pass():
                break
        ctx = TiesContext(collector.finish(), 1.0)
        kept = torch.cat([torch.stack(ctx.trim_masks(c)) for c in chunks], dim=1)
        assert keep_count(0.29, n) == 29  # 0.29 * 100 is 28.999999999999996 in float arithmetic
        assert torch.equal(kept, (torch.arange(n) < 29).expand(2, n)), scope


# --- DARE ----------------------------------------------------------------------------------------


def test_dare_generator_matches_plain_python():
    """The int64 torch hash equals lowbias32 written with Python's unbounded integers."""

    def mix(x):
        x ^= x >> 16
        x = (x * 0x7FEB352D) & 0xFFFFFFFF
        x ^= x >> 15
        x = (x * 0x846CA68B) & 0xFFFFFFFF
        return x ^ (x >> 16)

    xs = [0, 1, 2, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFE, 0xFFFFFFFF, 123456789]
    assert mix32(torch.tensor(xs, dtype=torch.int64)).tolist() == [mix(x) for x in xs]
    # positions past 2^32 (huge tensors) use the high word too, and stay within [0, 2^32)
    u = dare_uniform(1, 0, "w", (1 << 32) - 2, 4, torch.device("cpu"))
    assert ((u >= 0) & (u <= 0xFFFFFFFF)).all() and len(set(u.tolist())) == 4


def _dare_chunk(n=200_000, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    tau = (torch.rand(n, generator=gen) + 0.5) * torch.where(torch.rand(n, generator=gen) < 0.5, -1e-3, 1e-3)
    return Chunk(0, "model.layers.0.mlp.up_proj.weight", 0, torch.zeros(n, dtype=dtype), tau.to(dtype)[None], EPS)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("method", ["dare-ta", "dare-ties"])
def test_dare_keeps_one_minus_p_and_rescales_exactly(method, p):
    chunk = _dare_chunk()
    m = get_method(method)
    params = m.resolve({"drop": p, "seed": 42, "scale": 1.0})
    out = m.merge(chunk, m.prepare(params, None, None))
    tau = chunk.taus[0]
    kept = out != 0
    n = tau.numel()
    share = kept.sum().item() / n
    assert abs(share - (1 - p)) < 5 * math.sqrt(p * (1 - p) / n)  # within 5 standard deviations
    q = torch.tensor(1 - p, dtype=torch.float32)
    assert torch.equal(out[kept], tau[kept] / q)  # τ / (1 − p), one rounding
    assert torch.equal(kept, torch.from_numpy(ref.dare_keep(42, 0, chunk.name, n, p)))


def test_dare_agents_draw_independent_masks():
    n, p = 200_000, 0.5
    a = torch.from_numpy(ref.dare_keep(0, 0, "w", n, p))
    b = torch.from_numpy(ref.dare_keep(0, 1, "w", n, p))
    c = torch.from_numpy(ref.dare_keep(0, 0, "v", n, p))
    for x, y in [(a, b), (a, c)]:
        both = (x & y).float().mean().item()
        assert abs(both - 0.25) < 5 * math.sqrt(0.25 * 0.75 / n)


@pytest.mark.parametrize("method", ["dare-ta", "dare-ties"])
def test_dare_same_seed_same_bytes_across_chunk_sizes(models, tmp_path, method):
    base_dir, agent_dirs = models
    outputs = []
    for i, (chunk, seed) in enumerate([(7, 3), (1 << 22, 3), (1000, 3), (1 << 22, 4)]):
        out = tmp_path / f"out{i}"
        merge(
            MergeSpec.build(*_dirs(base_dir, agent_dirs), out, method, {"seed": seed, "drop": 0.5}),
            options=RunOptions(chunk_elements=chunk, use_cache=False),
        )
        outputs.append((out / "model.safetensors").read_bytes())
    assert outputs[0] == outputs[1] == outputs[2]
    assert outputs[3] != outputs[1]


# --- schema and command line ----------------------------------------------------------------------


def test_schemas_and_defaults():
    assert get_method("average").resolve({}) == {}
    assert get_method("task-arithmetic").resolve({}) == {"scale": 0.3}
    assert get_method("ties").resolve({}) == TIES_DEFAULTS
    assert get_method("dare-ta").resolve({}) == {"drop": 0.5, "seed": 0, "scale": 0.3}
    assert get_method("dare-ties").resolve({}) == {"drop": 0.5, "seed": 0, "scale": 1.0}


def test_merge_help_lists_baseline_flags():
    sub = build_parser()._subparsers._group_actions[0].choices["merge"]  # type: ignore[union-attr]
    text = sub.format_help()
    for flag in ("--scale", "--density", "--drop", "--seed", "--ties-scope"):
        assert flag in text
    for method in ("average", "task-arithmetic", "ties", "dare-ta", "dare-ties"):
        assert method in text
    assert "0.1, 0.3, 0.5, 0.7, 0.9, 1.0 (Table 11)" in text
    assert "0.1-0.9 in steps of 0.1 (Table 11)" in text
    assert "default 0.3" in text and "default 0.2" in text


def test_merge_help_from_the_command_line():
    proc = subprocess.run(
        [sys.executable, "-m", "ram_desktop", "merge", "--help"], capture_output=True, text=True, check=True
    )
    assert "--ties-scope" in proc.stdout and "--drop" in proc.stdout and "dare-ties" in proc.stdout


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--method", "ties", "--density", "1.5"], "--density must be at most 1.0"),
        (["--method", "dare-ta", "--drop", "1.0"], "--drop must be at most 0.99"),
        (["--method", "ties", "--ties-scope", "layer"], "invalid choice"),
        (["--method", "average", "--scale", "0.5"], "method average takes no parameter scale"),
    ],
)
def test_bad_parameter_is_one_error_line(models, tmp_path, capsys, args, needle):
    base_dir, agent_dirs = models
    code = main(
        [
            "-q",
            "merge",
            *_dirs(base_dir, agent_dirs)[:1],
            *_dirs(base_dir, agent_dirs)[1],
            "--out",
            str(tmp_path / "out"),
            *args,
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("error:") and needle in err[0], err
    assert not (tmp_path / "out").exists()


# --- mergekit ------------------------------------------------------------------------------------


def _mergekit() -> str | None:
    exe = os.environ.get("RAM_MERGEKIT") or "/work/mergekit-venv/bin/mergekit-yaml"
    return exe if Path(exe).is_file() and os.access(exe, os.X_OK) else None


@pytest.mark.skipif(_mergekit() is None, reason="mergekit not installed (set RAM_MERGEKIT=/path/to/mergekit-yaml)")
@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16"])
def test_task_arithmetic_equals_mergekit(models, tmp_path, out_dtype):
    """mergekit's task_arithmetic (weight 1 per model, lambda = λ, float32 compute) computes
    base + λ·Σ τ_t in the same order: the outputs are bit-identical."""
    base_dir, agent_dirs = models
    scale = 0.3
    lines = ["merge_method: task_arithmetic", f"base_model: {base_dir}", "models:"]
    for a in agent_dirs:
        lines += [f"  - model: {a}", "    parameters: {weight: 1.0}"]
    lines += [f"parameters: {{lambda: {scale}}}", "dtype: float32", f"out_dtype: {out_dtype}"]
    config = tmp_path / "mergekit.yaml"
    config.write_text("\n".join(lines) + "\n")
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [_mergekit(), str(config), str(tmp_path / "mk")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    merge(
        MergeSpec.build(
            *_dirs(base_dir, agent_dirs), tmp_path / "ours", "task-arithmetic", {"scale": scale}, out_dtype=out_dtype
        )
    )
    ours, theirs = ref.load_model(tmp_path / "ours"), ref.load_model(tmp_path / "mk")
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert ours[name].dtype == theirs[name].dtype, name
        assert torch.equal(ours[name], theirs[name]), name


def test_ties_after_a_cached_probe(models, tmp_path, caplog):
    """With the probe cached, TIES still gets its collector passes (pass 1 + refinement) and is exact."""
    from ram_desktop.core.pipeline import probe

    base_dir, agent_dirs = models
    probe(MergeSpec.build(*_dirs(base_dir, agent_dirs)))
    caplog.set_level("INFO", logger="ram_desktop")
    _check_against_reference(tmp_path, base_dir, agent_dirs, "ties", {"ties_scope": "model", "density": 0.1})
    assert "reusing the cached probe" in caplog.text


@pytest.mark.parametrize("method", ["average", "task-arithmetic", "dare-ta", "dare-ties"])
def test_thread_safe_baselines_do_not_depend_on_threads(models, tmp_path, monkeypatch, method):
    """Average, Task Arithmetic and DARE are pure per chunk and run in parallel compute threads: the
    output is the same bits with one thread and with several, whatever the chunk size."""
    assert get_method(method).streaming.thread_safe
    base_dir, agent_dirs = models
    outputs = []
    for i, (threads, chunk) in enumerate([("1", 1 << 22), ("3", 1000), ("2", 7)]):
        monkeypatch.setenv("RAM_DESKTOP_THREADS", threads)
        out = tmp_path / f"out{i}"
        merge(
            MergeSpec.build(str(base_dir), [str(a) for a in agent_dirs], out, method, params={}, device="cpu"),
            options=RunOptions(chunk_elements=chunk),
        )
        outputs.append((out / "model.safetensors").read_bytes())
    assert outputs[0] == outputs[1] == outputs[2]
