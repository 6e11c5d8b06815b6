"""The fused numba kernels (core/engine/kernels.py and the methods' own, e.g. methods/ram.py) equal a plain numpy reference and the torch path, bit for bit.

The reference below is written from the formulas (SPEC.md section 1, equation 7): whole slices in
numpy, agents summed in order from +0, rounding to the output dtype by torch's own conversion.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from ram_desktop.core import MergeSpec, RunOptions
from ram_desktop.core.engine import kernels, passes
from ram_desktop.core.methods import baselines, model_stock, ram as ram_family, slerp
from ram_desktop.core.pipeline import merge

from . import reference as ref
from .conftest import make_models

pytestmark = pytest.mark.skipif(not kernels.available(), reason="numba not installed")

BITS = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32, torch.float64: torch.int64}


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(BITS[t.dtype]).numpy()


# --- rounding and widening on the bits -----------------------------------------------------------


def _njit_map(helper_name: str, out_dtype):
    import numba

    helper = kernels._jit()[helper_name]

    @numba.njit
    def run(values, out):
        for i in range(values.shape[0]):
            out[i] = helper(values[i])
        return out

    return lambda values: run(values, np.empty(values.shape[0], out_dtype))


def _edge_floats() -> np.ndarray:
    """float32 bit patterns: a stride over all 2^32, every 16-bit rounding boundary (each bfloat16 and
    float16 value's midpoint to its neighbour, ±1 float32 ulp), the float16 overflow and subnormal
    edges, ±0, ±inf and the largest finite floats."""
    u = [np.arange(0, 1 << 32, 65521, dtype=np.uint64).astype(np.uint32)]
    hi = np.arange(1 << 16, dtype=np.uint32) << 16
    for low in (0x7FFF, 0x8000, 0x8001, 0x0000, 0xFFFF):
        u.append(hi | low)
    half = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(torch.float16).float()
    half = half[torch.isfinite(half)].double().sort().values
    mids = ((half[1:] + half[:-1]) / 2).float()  # exact in float32: float16 has 11 significant bits
    m = mids.numpy().view(np.uint32)
    u += [m, m + 1, m - 1]
    for edge in (
        0x477FEFFF,
        0x477FF000,
        0x477FF001,
        0x38800000,
        0x387FFFFF,
        0x33000000,
        0x33000001,
        0x32FFFFFF,
        0x7F7FFFFF,
        0x7F800000,
        0x00000001,
        0x007FFFFF,
        0x00800000,
        0x3F800000,
    ):
        u.append(np.array([edge, edge | 0x80000000], np.uint32))
    return np.concatenate(u).view(np.float32)


@pytest.mark.parametrize("target", [torch.bfloat16, torch.float16])
def test_round_to_nearest_even_matches_torch(target):
    values = _edge_floats()
    assert np.isfinite(values).sum() > 500_000 and (values == 0).any() and np.isinf(values).any()
    name = "to_bf16" if target == torch.bfloat16 else "to_half"
    ours = _njit_map(name, np.int64)(values).astype(np.uint16)
    theirs = torch.from_numpy(values).to(target).view(torch.int16).numpy().view(np.uint16)
    finite = np.isfinite(values)
    assert np.array_equal(ours[finite], theirs[finite])
    inf = np.isinf(values)
    assert np.array_equal(ours[inf], theirs[inf])  # ±inf stay ±inf
    # NaN stays NaN (its payload may differ from torch's vectorised conversion; the merge rejects NaN inputs)
    exp_mask, frac_mask = (0x7F80, 0x7F) if target == torch.bfloat16 else (0x7C00, 0x3FF)
    nan = np.isnan(values)
    assert ((ours[nan] & exp_mask) == exp_mask).all() and ((ours[nan] & frac_mask) != 0).all()
    # subnormal results and overflow to inf are among the cases
    if target == torch.float16:
        assert ((theirs & 0x7C00) == 0).sum() > 1000 and ((theirs & 0x7FFF) == 0x7C00).sum() > 100


def test_half_and_bfloat16_widening_matches_torch():
    every = np.arange(1 << 16, dtype=np.int64)
    ours = _njit_map("from_half", np.float32)(every.astype(np.int16))
    theirs = torch.from_numpy(every.astype(np.int16)).view(torch.float16).float().numpy()
    nan = np.isnan(theirs)
    assert nan.sum() == 2 * 1023 and np.isnan(ours[nan]).all()  # NaN stays NaN (payload quieting may differ)
    assert np.array_equal(ours[~nan].view(np.uint32), theirs[~nan].view(np.uint32))  # ±0, subnormals, ±inf
    ours_bf = _njit_map("from_bf16", np.float32)(every.astype(np.uint16))
    theirs_bf = torch.from_numpy(every.astype(np.int16)).view(torch.bfloat16).float().numpy()
    assert np.array_equal(ours_bf.view(np.uint32), theirs_bf.view(np.uint32))


# --- the chunk kernels against the numpy reference -----------------------------------------------


def _inputs(n: int, n_agents: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Base and agents with ±0, subnormals (of the input dtype), ties, cancelling and identical updates."""
    g = torch.Generator().manual_seed(seed)
    base = 0.02 * torch.randn(n, generator=g, dtype=torch.float64)
    base[::9] = 0.0
    base[1::9] = -0.0
    tiny = torch.finfo(dtype).tiny
    base[2::9] = tiny * torch.rand(base[2::9].shape, generator=g, dtype=torch.float64)  # subnormals and small normals
    base = base.to(dtype)
    agents = []
    for t in range(n_agents):
        kind = torch.randint(0, 6, (n,), generator=g)
        step = base.double() * torch.randint(-3, 4, (n,), generator=g) * 2.0**-7 + 1e-4 * torch.randn(
            n, generator=g, dtype=torch.float64
        )
        agent = torch.where(kind == 0, base.double(), base.double() + step)
        agent = torch.where(kind == 1, -base.double(), agent)  # sign flips, −0 where the base is +0
        agent = torch.where(kind == 2, base.double() + tiny * 0.5, agent)  # a subnormal update
        agent = agent.to(dtype)
        if t:
            same = torch.rand(n, generator=g) < 0.2
            agent = torch.where(same, agents[0], agent)  # identical updates shared between agents
        agents.append(agent)
    return base, agents


def _reference(
    base: torch.Tensor,
    agents: list[torch.Tensor],
    eps: float,
    compute: torch.dtype,
    out_dtype: torch.dtype,
    lambdas: list[float] | None,
):
    """Equation 7 on whole slices in numpy; returns θ in out_dtype, the pattern histogram and the
    per-agent (moved, unique) rescale survival counts."""
    cdt = np.float64 if compute == torch.float64 else np.float32
    x = base.to(compute).numpy()
    taus = [a.to(compute).numpy() - x for a in agents]
    masks = [np.abs(t) > cdt(eps) for t in taus]
    c = np.sum(masks, axis=0)
    total = np.zeros_like(x)  # +0
    for t, m in zip(taus, masks):
        total = total + np.where(m, t, cdt(0))
    tau_m = np.zeros_like(x)
    for i, (t, m) in enumerate(zip(taus, masks)):
        only = m & (c == 1)
        tau_m[only] = t[only] * cdt(lambdas[i]) if lambdas is not None else t[only]
    several = c >= 2
    tau_m[several] = total[several] / c[several].astype(cdt)
    theta = torch.from_numpy(x + tau_m).to(out_dtype)
    pattern = sum(m.astype(np.int64) << i for i, m in enumerate(masks))
    hist = np.bincount(pattern, minlength=1 << len(agents))
    ram = torch.from_numpy(x + np.where(c == 1, total, tau_m)).to(out_dtype)
    moved = (ram != theta).numpy()
    survival = np.array(
        [[int((moved & m & (c == 1)).sum()) for m in masks], [int((m & (c == 1)).sum()) for m in masks]]
    )
    return theta, hist, survival


def _chunked(fn, base, agents, chunk):
    parts = []
    for s in range(0, base.numel(), chunk):
        parts.append(fn(base[s : s + chunk], [a[s : s + chunk] for a in agents]))
    return parts


CASES = [  # (input dtype, output dtype)
    (torch.bfloat16, torch.bfloat16),
    (torch.bfloat16, torch.float16),
    (torch.bfloat16, torch.float32),
    (torch.float16, torch.float16),
    (torch.float16, torch.bfloat16),
    (torch.float32, torch.float32),
    (torch.float32, torch.bfloat16),
    (torch.float32, torch.float16),
    (torch.float64, torch.float64),
    (torch.float64, torch.bfloat16),
    (torch.float64, torch.float16),
    (torch.float64, torch.float32),
]


# every input/output dtype pair with three agents; 1, 2, 4 and 5 agents on the common bf16 case (each
# agent count and dtype combination is a separate numba compilation, a few seconds each on first use)
MATRIX = (
    [(d, o, 3) for d, o in CASES]
    + [(torch.bfloat16, torch.bfloat16, n) for n in (1, 2, 4, 5)]
    + [(torch.float32, torch.float16, 2), (torch.float64, torch.float64, 1)]
)


@pytest.mark.parametrize("dtype,out_dtype,n_agents", MATRIX)
@pytest.mark.parametrize("eps", [1e-5, 0.0])
def test_merge_kernel_matches_reference(dtype, out_dtype, n_agents, eps):
    n = 3001  # odd: no vector-width multiple
    base, agents = _inputs(n, n_agents, dtype, seed=n_agents)
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    lambdas = [1.0 + 0.137 * (t + 1) for t in range(n_agents)]
    for lams in (None, lambdas):
        theta, hist, survival = _reference(base, agents, eps, compute, out_dtype, lams)
        for chunk in (n, 1000, 7, 1):
            if chunk == 1 and (n_agents != 3 or dtype != out_dtype):
                continue  # one element per call is slow through the Python wrapper; a few cases suffice
            parts = _chunked(
                lambda b, a, lams=lams: ram_family.selective_merge_into(
                    b, a, eps, compute, out_dtype, lams, True, True
                ),
                base,
                agents,
                chunk,
            )
            got = torch.cat([p.merged for p in parts])
            assert got.dtype == out_dtype
            assert np.array_equal(_bits(got), _bits(theta)), (chunk, lams)
            assert np.array_equal(sum(p.hist for p in parts), hist)
            assert all(p.finite for p in parts)
            if lams is not None:
                assert np.array_equal(sum(p.observed for p in parts), survival)
            else:
                assert all(p.observed is None for p in parts)
    # the pattern histogram has every pattern and the survival counts something on both sides
    assert (hist > 0).all()
    counted = kernels.count_patterns(base, agents, eps, compute)
    assert counted is not None and np.array_equal(counted.hist, hist) and counted.finite


# each case a numba compilation of the group kernel (dtypes, agent count, three outputs)
GROUP_CASES = [
    (torch.bfloat16, torch.bfloat16, 3),
    (torch.float16, torch.float32, 2),
    (torch.float32, torch.bfloat16, 1),
    (torch.float64, torch.float16, 4),
]


@pytest.mark.parametrize("dtype,out_dtype,n_agents", GROUP_CASES)
def test_group_kernel_gives_each_variant_the_reference(dtype, out_dtype, n_agents):
    """Several RAM-family variants of one slice in one kernel call (a compare's RAM, RAM+ and another RAM+): each
    variant's θ bits, survival counts and the histogram equal the whole-slice reference, whatever the chunking."""
    n = 3001
    base, agents = _inputs(n, n_agents, dtype, seed=11 + n_agents)
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    variants = [
        (None, False),
        ([1.0 + 0.137 * (t + 1) for t in range(n_agents)], True),
        ([2.0 - 0.25 * t for t in range(n_agents)], False),
    ]
    want = [_reference(base, agents, 1e-5, compute, out_dtype, lams) for lams, _ in variants]
    for chunk in (n, 1000, 7):
        parts = _chunked(
            lambda b, a: ram_family.selective_merge_group(
                b, a, 1e-5, compute, out_dtype, [lams for lams, _ in variants], True, [s for _, s in variants]
            ),
            base,
            agents,
            chunk,
        )
        for k, ((theta, hist, survival), (_, surv)) in enumerate(zip(want, variants)):
            got = torch.cat([p[k].merged for p in parts])
            assert got.dtype == out_dtype
            assert np.array_equal(_bits(got), _bits(theta)), (chunk, k)
            assert all(p[k].finite for p in parts)
            if surv:
                assert np.array_equal(sum(p[k].observed for p in parts), survival), (chunk, k)
            else:
                assert all(p[k].observed is None for p in parts)
            if k == 0:
                assert np.array_equal(sum(p[0].hist for p in parts), hist)
            else:
                assert all(p[k].hist is None for p in parts)
    bad = agents[-1].clone()
    bad[1234] = float("nan")
    done = ram_family.selective_merge_group(
        base, [*agents[:-1], bad], 1e-5, compute, out_dtype, [None, [1.5] * n_agents], False, [False, True]
    )
    assert done is not None and [d.finite for d in done] == [False, False]


def test_count_kernel_chunks_down_to_one_element():
    base, agents = _inputs(257, 4, torch.bfloat16, seed=3)
    _, hist, _ = _reference(base, agents, 1e-5, torch.float32, torch.bfloat16, None)
    for chunk in (257, 64, 5, 1):
        parts = _chunked(lambda b, a: kernels.count_patterns(b, a, 1e-5, torch.float32), base, agents, chunk)
        assert np.array_equal(sum(p.hist for p in parts), hist)


def test_eps_is_compared_in_the_compute_dtype():
    # |τ| equal to float32(ε) but below the double ε: torch compares in float32, so it counts
    eps = 1e-5
    e32 = float(np.float32(eps))
    assert e32 != eps
    base = torch.zeros(4, dtype=torch.float32)
    agent = torch.tensor([e32, -e32, np.nextafter(np.float32(e32), np.float32(1)), 0.0], dtype=torch.float32)
    got = kernels.count_patterns(base, [agent], eps, torch.float32).hist
    torch_masks = torch.abs(agent - base).gt(eps)
    assert got[1] == int(torch_masks.sum())


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_non_finite_task_vectors_are_flagged(bad):
    base = torch.zeros(5000, dtype=torch.float32)
    agent = base.clone()
    agent[4321] = bad
    assert kernels.count_patterns(base, [base.clone(), agent], 1e-5, torch.float32).finite is False
    assert (
        ram_family.selective_merge_into(base, [agent], 1e-5, torch.float32, torch.float32, None, True, False).finite
        is False
    )
    assert kernels.count_patterns(base, [base.clone(), base.clone()], 1e-5, torch.float32).finite is True


def _with_patterns(patterns: np.ndarray, n_agents: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """bfloat16 base values in [0.5, 1) and agents that move an element by (t + 1)/8 exactly where bit t of
    its pattern is set."""
    g = torch.Generator().manual_seed(n_agents)
    base = (0.5 + 0.5 * torch.rand(len(patterns), generator=g)).to(torch.bfloat16)
    bits = torch.from_numpy(patterns)
    return base, [torch.where((bits >> t) & 1 == 1, base + 0.125 * (t + 1), base) for t in range(n_agents)]


@pytest.mark.parametrize("n_agents", [1, 2, 3, 4, 5, 6])
def test_pattern_histogram_counts_runs_of_one_pattern_and_every_pattern(n_agents):
    # long runs of one pattern (more than 255, the packed 8-bit counters' limit, and past a 2048-element
    # block), every pattern at random, runs of exactly 255 and 256 of the two highest ones, odd lengths
    top = (1 << n_agents) - 1
    g = np.random.default_rng(n_agents)
    patterns = np.concatenate(
        [
            np.full(2048 + 300, top),
            g.integers(0, top + 1, 3000),
            np.full(255, top),
            np.full(256, max(top - 1, 0)),
            np.full(511, 1 << (n_agents - 1)),
            [top],
        ]
    )
    patterns = patterns.astype(np.int64)
    base, agents = _with_patterns(patterns, n_agents)
    hist = np.bincount(patterns, minlength=top + 1)
    assert (hist > 0).all()
    unique = np.array([(patterns == 1 << t).sum() for t in range(n_agents)])
    for chunk in (len(patterns), 2048, 256, 255, 97):
        parts = _chunked(lambda b, a: kernels.count_patterns(b, a, 1e-5, torch.float32), base, agents, chunk)
        assert np.array_equal(sum(p.hist for p in parts), hist), chunk
        assert all(p.finite for p in parts)
        # λ = 2 doubles every unique update: each one's rounded value changes, so moved = unique
        parts = _chunked(
            lambda b, a: ram_family.selective_merge_into(
                b, a, 1e-5, torch.float32, torch.bfloat16, [2.0] * n_agents, True, True
            ),
            base,
            agents,
            chunk,
        )
        assert np.array_equal(sum(p.hist for p in parts), hist), chunk
        survival = np.asarray(sum(p.observed for p in parts))
        assert np.array_equal(survival[1], unique) and np.array_equal(survival[0], unique), chunk
        parts = _chunked(
            lambda b, a: ram_family.selective_merge_into(b, a, 1e-5, torch.float32, torch.bfloat16, None, True, False),
            base,
            agents,
            chunk,
        )
        assert np.array_equal(sum(p.hist for p in parts), hist), chunk


# ±65504 in float16: their difference is finite in float32, so no "overflow" case there
@pytest.mark.parametrize(
    "dtype,bad",
    [
        (d, b)
        for d in (torch.bfloat16, torch.float16, torch.float32)
        for b in (float("nan"), float("inf"), float("-inf"), "overflow")
        if not (d == torch.float16 and b == "overflow")
    ],
)
def test_every_block_with_a_non_finite_task_vector_is_flagged(dtype, bad):
    n = 2 * 2048 + 3
    g = torch.Generator().manual_seed(5)
    base = (0.02 * torch.randn(n, generator=g)).to(dtype)
    agents = [(base.double() + 0.01 * torch.randn(n, generator=g, dtype=torch.float64)).to(dtype) for _ in range(3)]
    assert kernels.count_patterns(base, agents, 1e-5, torch.float32).finite is True
    for where in (0, 2047, 2048, n - 1):
        for t, on_base in ((2, False), (0, False), (None, True)):
            b, a = base.clone(), [x.clone() for x in agents]
            if bad == "overflow":  # both finite, their difference is not (in float32)
                b[where], a[t if t is not None else 1][where] = -torch.finfo(dtype).max, torch.finfo(dtype).max
            elif on_base:
                b[where] = bad
            else:
                a[t][where] = bad
            taus = [x.float() - b.float() for x in a]
            assert not all(bool(torch.isfinite(x).all()) for x in taus)
            assert kernels.count_patterns(b, a, 1e-5, torch.float32).finite is False, (where, t)
            for lams, survival in ((None, False), ([1.5, 1.25, 2.0], True)):
                done = ram_family.selective_merge_into(b, a, 1e-5, torch.float32, dtype, lams, True, survival)
                assert done.finite is False, (where, t, lams)
            # a chunk without the bad element is clean
            if where > 0:
                assert kernels.count_patterns(b[:where], [x[:where] for x in a], 1e-5, torch.float32).finite is True


@pytest.mark.parametrize("out_dtype,tiny", [(torch.float16, 1e-9), (torch.bfloat16, 1e-41)])
def test_survival_counts_zeros_of_either_sign_as_equal(out_dtype, tiny):
    # element 0: RAM rounds x + τ to +0, RAM+ (λ = 2) x + 2τ to −0: equal values, not a change;
    # element 1: an ordinary change; element 2: no update at all
    base = torch.tensor([3 * tiny, 0.5, 0.25], dtype=torch.float32)
    agent = torch.tensor([tiny, 0.51, 0.25], dtype=torch.float32)
    tau = agent - base
    ram, plus = (base + tau).to(out_dtype), (base + tau * 2.0).to(out_dtype)
    assert ram[0] == 0 and plus[0] == 0 and _bits(ram)[0] != _bits(plus)[0]  # +0 and −0
    moved = int((ram != plus).sum())
    assert moved == 1
    done = ram_family.selective_merge_into(base, [agent], 0.0, torch.float32, out_dtype, [2.0], False, True)
    merged, finite, survival = done.merged, done.finite, done.observed
    assert finite and np.array_equal(_bits(merged), _bits(plus))
    assert np.asarray(survival).tolist() == [[moved], [2]]


def test_slices_the_kernels_do_not_cover_fall_back():
    base = torch.zeros(10, dtype=torch.bfloat16)
    assert kernels.count_patterns(base, [base.float()], 1e-5, torch.float32) is not None  # mixed base/agents: covered
    assert kernels.count_patterns(base, [base, base.float()], 1e-5, torch.float32) is None  # agents differ in dtype
    assert kernels.count_patterns(base, [base[:8]], 1e-5, torch.float32) is None  # shorter agent (vocab common)
    assert kernels.count_patterns(base, [base] * 17, 1e-5, torch.float32) is None  # beyond the pattern table


# --- TIES: the radix-select digit counts and the trim + sign election + disjoint mean -------------


def _magnitude_keys(taus: list[np.ndarray], key64: bool) -> list[np.ndarray]:
    """|τ| as int64 keys: the IEEE bits of |τ| as float64 (key64) or as float32."""
    if key64:
        return [np.abs(t).astype(np.float64).view(np.int64) for t in taus]
    return [np.abs(t).astype(np.float32).view(np.int32).astype(np.int64) for t in taus]


def _ties_reference(base, agents, compute, out_dtype, key64, cuts, quotas, scale):
    """TIES of a whole slice in numpy: keep key > cut and the first ``quota`` keys equal to it, then the
    reference sign election and disjoint mean, ×λ, plus the base, rounded once."""
    cdt = np.float64 if compute == torch.float64 else np.float32
    x = base.to(compute).numpy()
    taus = [a.to(compute).numpy() - x for a in agents]
    keys = _magnitude_keys(taus, key64)
    trimmed = []
    for tau, key, cut, quota in zip(taus, keys, cuts, quotas):
        equal = key == cut
        keep = (key > cut) | (equal & (np.cumsum(equal) <= quota))
        trimmed.append(np.where(keep, tau, cdt(0)))
    merged = ref.elect_disjoint_mean(trimmed) * cdt(scale)
    return torch.from_numpy(x + merged).to(out_dtype), keys


TIES_MATRIX = (
    [(d, o, False) for d, o in CASES if d != torch.float64]
    + [(torch.float64, o, True) for o in (torch.float64, torch.bfloat16)]
    + [(torch.bfloat16, torch.bfloat16, True), (torch.float32, torch.float32, True)]
)


@pytest.mark.parametrize("dtype,out_dtype,key64", TIES_MATRIX)
def test_ties_kernel_matches_reference(dtype, out_dtype, key64):
    """Odd length, ±0, subnormals, many tied magnitudes; a cut taken at an existing magnitude with some of
    its ties kept, none kept (quota 0) and all kept; chunks down to one element, each chunk keeping what
    is left of the quota after the earlier ones."""
    n = 3001
    base, agents = _inputs(n, 3, dtype, seed=11)
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    x = base.to(compute).numpy()
    keys = _magnitude_keys([a.to(compute).numpy() - x for a in agents], key64)
    # cuts at the most frequent non-zero magnitude (agents 0 and 2) and at zero (agent 1: keeps every
    # update and the first zeros, ±0 among them)
    common = [int(np.bincount(np.unique(k[k > 0], return_inverse=True)[1]).argmax()) for k in keys]
    cuts = [int(np.unique(k[k > 0])[c]) for k, c in zip(keys, common)]
    cuts[1] = 0
    equal = [int((k == c).sum()) for k, c in zip(keys, cuts)]
    assert min(equal) >= 2  # ties at every cut
    quotas = [equal[0] // 2, 0, equal[2]]
    scale = 0.7
    theta, _ = _ties_reference(base, agents, compute, out_dtype, key64, cuts, quotas, scale)
    for chunk in (n, 1000, 7, 1):
        if chunk == 1 and dtype != out_dtype:
            continue  # one element per call is slow through the Python wrapper
        parts = []
        for s in range(0, n, chunk):
            left = [q - int((k[:s] == c).sum()) for k, c, q in zip(keys, cuts, quotas)]
            done = baselines.ties_merge_into(
                base[s : s + chunk], [a[s : s + chunk] for a in agents], compute, out_dtype, key64, cuts, left, scale
            )
            assert done is not None and done.finite
            parts.append(done.merged)
        got = torch.cat(parts)
        assert got.dtype == out_dtype
        assert np.array_equal(_bits(got), _bits(theta)), chunk


@pytest.mark.parametrize(
    "dtype,key64",
    [
        (torch.bfloat16, False),
        (torch.float16, False),
        (torch.float32, False),
        (torch.float32, True),
        (torch.float64, True),
    ],
)
def test_ties_digit_counts_match_reference(dtype, key64):
    """Every radix level's digit histogram (the top 16 bits, then the next 16 of the keys matching a
    prefix) equals numpy's, summed over chunks down to one element."""
    n = 2003
    base, agents = _inputs(n, 3, dtype, seed=5)
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    x = base.to(compute).numpy()
    keys = _magnitude_keys([a.to(compute).numpy() - x for a in agents], key64)
    width = 64 if key64 else 32
    for level in range(width // 16):
        shift = width - 16 * (level + 1)
        prefixes = [int(np.sort(k)[n // 3]) >> (shift + 16) if level else 0 for k in keys]
        want = np.zeros((3, 1 << 16), np.int64)
        for t, (k, prefix) in enumerate(zip(keys, prefixes)):
            chosen = k if level == 0 else k[(k >> (shift + 16)) == prefix]
            want[t] += np.bincount((chosen >> shift) & 0xFFFF, minlength=1 << 16)
        assert want.sum() > 3  # something matches the prefixes at every level
        for chunk in (n, 64, 1):
            if chunk == 1 and level not in (0, width // 16 - 1):
                continue
            got = np.zeros_like(want)
            for s in range(0, n, chunk):
                done = baselines.ties_digit_counts(
                    base[s : s + chunk], [a[s : s + chunk] for a in agents], compute, key64, level, prefixes
                )
                assert done is not None and done.finite
                got += done.hist
            assert np.array_equal(got, want), (level, chunk)


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_ties_kernels_flag_non_finite_task_vectors(bad):
    base = torch.zeros(5000, dtype=torch.float32)
    agent = base.clone()
    agent[4321] = bad
    assert baselines.ties_digit_counts(base, [base.clone(), agent], torch.float32, False, 0, [0, 0]).finite is False
    assert baselines.ties_merge_into(base, [agent], torch.float32, torch.float32, False, [0], [1], 1.0).finite is False
    assert (
        baselines.ties_merge_into(base, [base.clone()], torch.float32, torch.float32, False, [0], [1], 1.0).finite
        is True
    )


@pytest.mark.parametrize(
    "dtype,out_dtype",
    [
        (torch.bfloat16, torch.bfloat16),
        (torch.float16, torch.bfloat16),
        (torch.float32, torch.float16),
        (torch.float64, torch.float64),
    ],
)
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("first", [0, (1 << 32) - 1500, 5 * (1 << 32) + 17])
def test_dare_kernel_matches_reference(dtype, out_dtype, ties, first):
    """DARE-TA / DARE-TIES from the documented mask (a hash of seed, agent, tensor and flat position) at
    positions that start at 0, straddle 2³² and lie past it, with ±0 and subnormals, in chunks down to
    7 elements (a chunk's mask depends on its positions only)."""
    n, seed, drop, scale, name = 3001, 2**40 + 3, 0.6, 1.3, "model.layers.0.mlp.up_proj.weight"
    base, agents = _inputs(n, 3, dtype, seed=5)
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    cdt = np.float64 if compute == torch.float64 else np.float32
    x = base.to(compute).numpy()
    kept = [
        np.where(ref.dare_keep(seed, t, name, n, drop, first), (a.to(compute).numpy() - x) / cdt(1.0 - drop), cdt(0))
        for t, a in enumerate(agents)
    ]
    assert all(0.3 < k.mean() < 0.5 for k in (ref.dare_keep(seed, t, name, n, drop, first) for t in range(3)))
    if ties:
        merged = ref.elect_disjoint_mean(kept)
    else:
        merged = np.zeros(n, cdt)
        for v in kept:
            merged = merged + v
    theta = torch.from_numpy(x + merged * cdt(scale)).to(out_dtype)
    keys = [ref.dare_keys(seed, t, name) for t in range(3)]
    for chunk in (n, 1000, 7):
        parts = []
        for s in range(0, n, chunk):
            done = baselines.dare_merge_into(
                base[s : s + chunk],
                [a[s : s + chunk] for a in agents],
                first + s,
                keys,
                int(drop * 2**32),
                drop,
                scale,
                ties,
                compute,
                out_dtype,
            )
            assert done is not None and done.finite
            parts.append(done.merged)
        assert np.array_equal(_bits(torch.cat(parts)), _bits(theta)), chunk


# --- whole merges: the kernel path writes the same files as the torch path -----------------------


def _with_kernels_and_without(tmp_path, monkeypatch, spec: Callable[[Path], MergeSpec]) -> dict:
    """The merge of ``spec(out)`` with the fused kernels (True) and on the torch path (False): its weight files'
    bytes by name, and the result."""
    merged = {}
    for use in (True, False):
        monkeypatch.setattr(passes, "use_kernels", lambda device_type, elements, use=use: use and device_type == "cpu")
        monkeypatch.setenv("RAM_DESKTOP_CACHE", str(tmp_path / f"cache-{use}"))
        out = tmp_path / f"out-{use}"
        result = merge(spec(out), options=RunOptions(chunk_elements=999))
        merged[use] = ({p.name: p.read_bytes() for p in sorted(out.glob("*.safetensors"))}, result)
    return merged


@pytest.mark.parametrize(
    "dtype,out_dtype",
    [(torch.bfloat16, "base"), (torch.float16, "bfloat16"), (torch.float32, "float16"), (torch.float64, "base")],
)
@pytest.mark.parametrize(
    "method,params",
    [
        ("ram", {}),
        ("ram-plus", {}),
        ("ram-plus-soft", {}),
        ("average", {}),
        ("task-arithmetic", {"scale": 0.3}),
        ("task-arithmetic", {"scale": 1.7}),
        ("dare-ta", {"drop": 0.3, "seed": 5, "scale": 0.7}),
        ("dare-ties", {"drop": 0.6, "seed": 2**40 + 3, "scale": 1.3}),
        ("ties", {"density": 0.3, "scale": 0.8}),
        ("ties", {"density": 0.2, "ties_scope": "model"}),
    ],
)
def test_whole_merge_equals_torch_path(tmp_path, monkeypatch, dtype, out_dtype, method, params):
    base_dir, agent_dirs = make_models(tmp_path / "in", dtype=dtype, shards=2)
    agents = [str(a) for a in agent_dirs]
    merged = _with_kernels_and_without(
        tmp_path,
        monkeypatch,
        lambda out: MergeSpec.build(
            str(base_dir), agents, out, method=method, params=params, out_dtype=out_dtype, shard_size="4KB"
        ),
    )
    outputs = {
        use: (files, result.report["rescale_survival_share"], [a.overlap for a in result.probe.agents])
        for use, (files, result) in merged.items()
    }
    assert len(outputs[True][0]) >= 2
    assert outputs[True] == outputs[False]


@pytest.mark.parametrize(
    "dtype,out_dtype",
    [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float32), (torch.float64, torch.float16)],
)
@pytest.mark.parametrize("average", [False, True])
def test_sum_kernel_matches_reference(dtype, out_dtype, average):
    """Task Arithmetic (Σ τ from +0 in agent order, ·λ) and Average (÷ N) by ``sum_merge_into``, with ±0 and
    subnormals, in chunks down to 7 elements."""
    n, scale = 3001, 0.3
    base, agents = _inputs(n, 3, dtype, seed=9)
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    cdt = np.float64 if compute == torch.float64 else np.float32
    x = base.to(compute).numpy()
    total = np.zeros(n, cdt)
    for a in agents:
        total = total + (a.to(compute).numpy() - x)
    merged = total / cdt(3) if average else total * cdt(scale)
    theta = torch.from_numpy(x + merged).to(out_dtype)
    for chunk in (n, 1000, 7):
        parts = []
        for s in range(0, n, chunk):
            done = baselines.sum_merge_into(
                base[s : s + chunk],
                [a[s : s + chunk] for a in agents],
                3 if average else scale,
                average,
                compute,
                out_dtype,
            )
            assert done is not None and done.finite
            parts.append(done.merged)
        assert np.array_equal(_bits(torch.cat(parts)), _bits(theta)), chunk


def test_variants_of_fused_and_torch_methods_equal_their_own_merges(tmp_path, monkeypatch):
    """One merge pass of variants whose methods have fused kernels (RAM+, Task Arithmetic, TIES) and others on the
    torch path (linear: θ; the kernels widen it) writes each variant's own merge, byte for byte."""
    from ram_desktop.core.pipeline import merge_variants

    base_dir, agent_dirs = make_models(tmp_path / "in", dtype=torch.bfloat16, shards=2)
    monkeypatch.setattr(passes, "use_kernels", lambda device_type, elements: device_type == "cpu")
    variants = [
        ("ram-plus", {}),
        ("linear", {"weight": [0.5, 0.3, 0.9][: len(agent_dirs)]}),
        ("task-arithmetic", {"scale": 0.5}),
        ("ties", {"density": 0.3}),
    ]

    def spec(method, params, out):
        return MergeSpec.build(str(base_dir), [str(a) for a in agent_dirs], out, method, params, shard_size="4KB")

    options = RunOptions(chunk_elements=999)
    merge_variants([spec(m, p, tmp_path / f"v{i}") for i, (m, p) in enumerate(variants)], options=options)
    for i, (m, p) in enumerate(variants):
        merge(spec(m, p, tmp_path / f"own{i}"), options=options)
        files = sorted(f.name for f in (tmp_path / f"own{i}").glob("*.safetensors"))
        assert files and all(
            (tmp_path / f"v{i}" / f).read_bytes() == (tmp_path / f"own{i}" / f).read_bytes() for f in files
        ), m


def test_kernels_fall_back_when_numba_cannot_be_set_up(monkeypatch):
    def broken():
        raise RuntimeError("cannot cache function: no locator available")

    kernels.available.cache_clear()
    monkeypatch.setattr(kernels, "_jit", broken)
    try:
        assert kernels.available() is False
        assert passes.use_kernels("cpu", 10**9) is False
    finally:
        monkeypatch.undo()
        kernels.available.cache_clear()
    assert kernels.available() is True


def test_kernels_can_be_switched_off(monkeypatch):
    kernels.available.cache_clear()
    monkeypatch.setenv("RAM_DESKTOP_KERNELS", "0")
    try:
        assert kernels.available() is False
    finally:
        monkeypatch.undo()
        kernels.available.cache_clear()


def test_disabled_block_keeps_the_torch_path_on_this_thread():
    import threading

    cpu = "cpu"
    seen = []
    with kernels.disabled():
        assert passes.use_kernels(cpu, 10**12) is False
        other = threading.Thread(target=lambda: seen.append(passes.use_kernels(cpu, 1)))
        other.start()
        other.join()
    assert seen == [True]  # only the thread that entered the block
    assert passes.use_kernels(cpu, 1) is True


def test_disabled_below_a_size_keeps_small_passes_on_the_torch_path():
    cpu = "cpu"
    with kernels.disabled(below=1000):
        assert passes.use_kernels(cpu, 999) is False
        assert passes.use_kernels(cpu, 1000) is True
        with kernels.disabled():
            assert passes.use_kernels(cpu, 10**12) is False
        assert passes.use_kernels(cpu, 1000) is True  # the outer block again
    assert passes.use_kernels(cpu, 0) is True


def test_window_jobs_use_the_kernels_only_for_big_models(tmp_path, monkeypatch):
    """A window job (its run options: gui.method.spec_form.window_options) merging a small model stays on the torch
    path (no numba load freezing the event loop); above the size limit the same job runs the fused kernels."""
    pytest.importorskip("PySide6")
    import dataclasses

    from ram_desktop.gui import worker
    from ram_desktop.gui.method import spec_form

    base_dir, agent_dirs = make_models(tmp_path / "in", dtype=torch.bfloat16, shards=1)
    calls = []
    real = ram_family.selective_merge_into
    monkeypatch.setattr(ram_family, "selective_merge_into", lambda *a, **k: calls.append(1) or real(*a, **k))
    used = {}
    for limit in (10**12, 1):
        monkeypatch.setattr(spec_form, "KERNEL_MIN_ELEMENTS", limit)
        calls.clear()
        spec = MergeSpec.build(str(base_dir), [str(a) for a in agent_dirs], tmp_path / f"out-{limit}", method="ram")
        options = dataclasses.replace(spec_form.window_options(1 << 20, None), use_cache=False)
        job = worker.Worker(lambda reporter, spec=spec, options=options: spec_form.run_merge(spec, options, reporter))
        job.run()
        used[limit] = bool(calls)
    assert used == {10**12: False, 1: True}


def test_finite_task_vectors_whose_sum_overflows_are_refused_by_both_paths(tmp_path, monkeypatch):
    """The kernels flag a NaN / ±inf τ, never finite τ whose sum overflows: that merge computes +inf, like
    the torch path, and both refuse to write it, naming the tensor (a merged value beyond the output dtype)."""
    from safetensors.torch import save_file

    from ram_desktop.core.errors import InputError

    base = torch.zeros(4, 1000)
    big = base.clone()
    big[2, 17] = 3e38  # τ = 3e38 in both agents: finite, their sum is not
    dirs = []
    for name, t in (("base", base), ("a", big), ("b", big)):
        (tmp_path / name).mkdir()
        save_file({"w": t}, str(tmp_path / name / "model.safetensors"))
        dirs.append(str(tmp_path / name))
    counted = kernels.count_patterns(base.reshape(-1), [big.reshape(-1)] * 2, 1e-5, torch.float32)
    assert counted.finite is True and counted.hist.tolist() == [base.numel() - 1, 0, 0, 1]
    merged = ram_family.selective_merge_into(
        base.reshape(-1), [big.reshape(-1)] * 2, 1e-5, torch.float32, torch.float32, [1.5, 1.5], True, True
    )
    assert merged.finite is True and torch.isinf(merged.merged[2 * 1000 + 17])
    for use in (True, False):
        monkeypatch.setattr(passes, "use_kernels", lambda device_type, elements, use=use: use and device_type == "cpu")
        monkeypatch.setenv("RAM_DESKTOP_CACHE", str(tmp_path / f"cache-{use}"))
        out = tmp_path / f"out-{use}"
        with pytest.raises(InputError, match="tensor 'w': the ram-plus merge gives values beyond the range of float32"):
            merge(MergeSpec.build(dirs[0], dirs[1:], out, method="ram-plus"), options=RunOptions(chunk_elements=999))
        assert not out.exists()


def test_output_slices_are_reused_only_after_release(monkeypatch):
    """The merge kernels' numpy outputs come from a pool: a slice still held is never handed out again, a
    released one is, and releasing a foreign array (or one twice) changes nothing."""
    pool = kernels._OutputPool()
    first, second = pool.take(1000, np.uint16), pool.take(700, np.uint16)
    assert first.base is not second.base
    first[:] = 1
    pool.release(first)
    pool.release(first)  # twice: still one free buffer
    pool.release(np.empty(10, np.uint16))  # not from the pool
    pool.release(np.empty(10, np.uint16)[:5])
    third, fourth = pool.take(900, np.uint16), pool.take(900, np.uint16)
    assert third.base is first.base and fourth.base is not first.base and fourth.base is not second.base
    assert pool.take(10, np.int16).dtype == np.int16  # another bits type: its own buffers
    monkeypatch.setattr(kernels, "_OUTPUTS", kernels._OutputPool())  # the merge below starts from an empty pool
    base, agents = _inputs(3001, 3, torch.bfloat16, seed=5)
    bits = [kernels.as_bits(t) for t in (base, *agents)]
    merged = [
        ram_family.selective_merge_into(bits[0], bits[1:], 1e-5, "float32", "bfloat16", None, False, False).merged
        for _ in range(2)
    ]
    assert merged[0].base is not merged[1].base and np.array_equal(merged[0], merged[1])
    expected = merged[0].copy()
    kernels.release_output(merged[0])
    again = ram_family.selective_merge_into(bits[0], bits[1:], 1e-5, "float32", "bfloat16", None, False, False).merged
    assert again.base is merged[0].base and np.array_equal(again, expected) and np.array_equal(merged[1], expected)


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_merge_kernels_say_whether_every_written_value_is_within_the_output_dtype(out_dtype):
    """RAM / RAM+ and Task Arithmetic / Average check each merged value as they write it (``in_range``), so the
    writer need not read the slice again: the flag is exactly whether every written value is finite."""
    base, agents = _inputs(5000, 3, torch.bfloat16, seed=11)
    big = [a.clone() for a in agents]
    big[1][4321] = 1e5  # a bfloat16 update beyond float16 (65504), within bfloat16 and float32
    runs = {
        "ram": lambda b, a: ram_family.selective_merge_into(b, a, 1e-5, torch.float32, out_dtype, None, False, False),
        "ram-plus": lambda b, a: ram_family.selective_merge_into(
            b, a, 1e-5, torch.float32, out_dtype, [1.5, 1.25, 2.0], False, False
        ),
        "task-arithmetic": lambda b, a: baselines.sum_merge_into(b, a, 1.0, False, torch.float32, out_dtype),
        "average": lambda b, a: baselines.sum_merge_into(b, a, 3, True, torch.float32, out_dtype),
        "task-arithmetic 1e35": lambda b, a: baselines.sum_merge_into(b, a, 1e35, False, torch.float32, out_dtype),
    }
    seen = {}
    for name, run in runs.items():
        for label, inputs in (("plain", agents), ("big", big)):
            done = run(base, inputs)
            assert done is not None and done.finite
            written = torch.as_tensor(done.merged)
            assert written.dtype == out_dtype
            seen[name, label] = done.in_range
            assert done.in_range == bool(torch.isfinite(written).all()), (name, label)
    # SLERP's and Model Stock's combinations check theirs too
    out_bits = {
        torch.bfloat16: np.uint16,
        torch.float16: np.int16,
        torch.float32: np.float32,
        torch.float64: np.float64,
    }
    combines = {
        "slerp": lambda b, a, out: slerp.combine_pair(b, a[1], 0.25, 0.75, 1e-5, out)[1],
        "model-stock": lambda b, a, out: model_stock.stock_combine(b, tuple(a), 0.9, 0.1, out)[0],
    }
    every_big = [a.clone() for a in agents]
    for a in every_big:
        a[4321] = 1e5  # Model Stock's mean of the agents is beyond float16 only where all of them are
    for name, combine in combines.items():
        for label, inputs in (("plain", agents), ("big", big), ("every big", every_big)):
            bits = [kernels.as_bits(t) for t in (base, *inputs)]
            out = np.empty(base.numel(), out_bits[out_dtype])
            seen[name, label] = combine(bits[0], bits[1:], out)
            written = (
                torch.from_numpy(out).view(out_dtype)
                if out_dtype in (torch.bfloat16, torch.float16)
                else torch.from_numpy(out)
            )
            assert seen[name, label] == bool(torch.isfinite(written).all()), (name, label)
    assert seen["slerp", "plain"] and seen["model-stock", "plain"]
    # the flag follows the data: float16 cannot hold the big update merged whole; a scale of 1e35 overflows float32
    overflows_whole = out_dtype == torch.float16
    assert seen["slerp", "big"] != overflows_whole and seen["model-stock", "every big"] != overflows_whole
    assert seen["ram", "plain"] and seen["ram", "big"] != overflows_whole
    assert seen["ram-plus", "big"] != overflows_whole and seen["task-arithmetic", "big"] != overflows_whole
    assert not seen["task-arithmetic 1e35", "big"]


def test_the_writer_reads_back_no_slice_a_kernel_checked(tmp_path, monkeypatch):
    """A fused RAM+, Task Arithmetic, SLERP or Model Stock merge checks its values where it writes them: the
    writer's second pass over the output (``out_of_range``) runs for no merged tensor; with the torch path it runs
    for every slice."""
    base_dir, agent_dirs = make_models(tmp_path / "in", dtype=torch.bfloat16)
    checked: list[str] = []
    original = passes.out_of_range

    def counted(data, out_name):
        checked.append(out_name)
        return original(data, out_name)

    monkeypatch.setattr(passes, "out_of_range", counted)
    runs = ((True, "ram-plus"), (True, "task-arithmetic"), (True, "slerp"), (True, "model-stock"), (False, "ram-plus"))
    for use, method in runs:
        monkeypatch.setattr(passes, "use_kernels", lambda device_type, elements, use=use: use and device_type == "cpu")
        monkeypatch.setenv("RAM_DESKTOP_CACHE", str(tmp_path / f"cache-{use}-{method}"))
        checked.clear()
        agents = [str(a) for a in agent_dirs][: 1 if method == "slerp" else None]
        params = {"t": 0.5} if method == "slerp" else None
        merge(
            MergeSpec.build(str(base_dir), agents, tmp_path / f"out-{use}-{method}", method=method, params=params),
            options=RunOptions(chunk_elements=999),
        )
        assert (len(checked) == 0) == use, (use, method, len(checked))


def test_model_stock_streamed_terms_refuse_only_offsets_that_are_not_finite():
    """Model Stock's streamed norms flag a lane that is not finite; the offsets are then checked one by one: an
    infinite offset refuses (None), finite offsets whose squares overflow give an infinite norm and go on."""
    n = (1 << 20) + 13  # streamed (≥ STREAM_ELEMENTS), with a tail
    rng = np.random.default_rng(3)

    def bits(values: np.ndarray) -> np.ndarray:
        return kernels.as_bits(torch.from_numpy(values.astype(np.float32)).to(torch.bfloat16))

    base = bits(rng.standard_normal(n) * 0.02)
    agents = [bits(rng.standard_normal(n) * 0.02) for _ in range(3)]
    norms, _ = model_stock._streamed_terms(base, tuple(agents))
    assert all(np.isfinite(float(v)) for v in norms)
    for where in (7, n - 2):  # a lane, the tail
        broken = agents[1].copy()
        broken[where] = 0x7F80  # +inf in bfloat16
        assert model_stock._streamed_terms(base, (agents[0], broken, agents[2])) is None, where
    huge = agents[2].copy()
    huge[12345] = bits(np.array([1e30]))[0]  # finite offset, its square beyond float32
    norms, _ = model_stock._streamed_terms(base, (agents[0], agents[1], huge))
    assert np.isinf(float(norms[2])) and np.isfinite(float(norms[0]))


@pytest.mark.parametrize("n", [8, 9, 100, 4099, 65_536, 777_777, 1 << 20])
def test_slerp_sums_its_normalised_products_as_torch_does(n):
    """SLERP's dot product of a piece is formed and summed without torch (each part torch sums apart on a kernel
    thread): the same float32 bits as torch's sum of (a / ‖a‖) · (b / ‖b‖) over the widened piece."""
    rng = np.random.default_rng(n)
    a, b = (torch.from_numpy(rng.standard_normal(n) * 0.02).to(torch.bfloat16) for _ in range(2))
    norm_a, norm_b = torch.tensor([[1.7]]), torch.tensor([[0.37]])
    got = slerp._summed_products(kernels.as_bits(a), kernels.as_bits(b), 0, norm_a, norm_b, np.empty(n, np.float32))
    want = ((a.float().reshape(1, -1) / norm_a) * (b.float().reshape(1, -1) / norm_b)).sum(dim=1, keepdim=True)
    assert got == float(want)


@pytest.mark.parametrize("method,params,agents", [("slerp", {"t": 0.3}, 1), ("model-stock", {}, 3)])
def test_whole_tensor_methods_and_their_counts_equal_the_torch_path(tmp_path, monkeypatch, method, params, agents):
    """SLERP and Model Stock through their fused kernels give the torch path's bytes, and the report's update counts
    (SLERP's come from its combination kernel, not a pass of their own) equal the torch path's."""
    base_dir, agent_dirs = make_models(tmp_path / "in", dtype=torch.bfloat16, shards=2)
    sources = [str(a) for a in agent_dirs[:agents]]
    merged = _with_kernels_and_without(
        tmp_path, monkeypatch, lambda out: MergeSpec.build(str(base_dir), sources, out, method=method, params=params)
    )
    outputs = {use: (files, [a.overlap for a in result.probe.agents]) for use, (files, result) in merged.items()}
    assert outputs[True] == outputs[False]
    assert all(sum(overlap) > 0 for overlap in outputs[True][1])
