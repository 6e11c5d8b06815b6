"""The Analyze probe's fused kernel (``kernels.analyze``) counts exactly what the torch formulation counts.

The torch path (``ProbeAccumulator`` / ``InspectAccumulator``, itself checked against whole-tensor
references in ``test_inspection.py`` and ``test_probe*``) is the reference here: the complete report
(overlap counts, per-tensor stats, λ* survival histograms, intersections, pairs, ulp sample) must be
identical, key for key, for every dtype, odd shapes, chunk sizes down to one element and one or two
compute threads.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from ram_desktop.core import MergeSpec, RunOptions, pipeline
from ram_desktop.core.engine import kernels, passes
from ram_desktop.core.errors import InputError
from ram_desktop.core.methods.ram_rescale import LAMBDA_STAR

STAT = (LAMBDA_STAR.fused, LAMBDA_STAR.shape)  # RAM+'s λ* histograms, as the probe hands them to the kernel

from .conftest import SMALL_CONFIG, make_models
from .synthetic import write_model
from .test_fused_kernels import _inputs

pytestmark = pytest.mark.skipif(not kernels.available(), reason="numba not installed")

SHAPES = {  # odd sizes: no vector-width multiple, rows that straddle chunks, a 1-D and a one-row tensor
    "model.embed_tokens.weight": (97, 13),
    "model.layers.0.self_attn.q_proj.weight": (11, 5, 3),
    "model.layers.0.input_layernorm.weight": (101,),
    "model.layers.1.mlp.down_proj.weight": (1, 29),
    "model.layers.1.mlp.up_proj.weight": (61, 17),
}


def _odd_models(
    folder: Path, dtype: torch.dtype, n_agents: int, seed: int, agent_dtype: torch.dtype | None = None
) -> tuple[Path, list[Path]]:
    """Base and agents with ±0, subnormals, sign flips, ties, identical updates shared between agents
    (``_inputs``), plus values near the float16 overflow for wide dtypes, in odd shapes."""
    sizes = {k: int(np.prod(s)) for k, s in SHAPES.items()}
    base, agents = _inputs(sum(sizes.values()), n_agents, dtype, seed)
    if dtype in (torch.float32, torch.float64):  # round(x + τ) overflows float16 (NaN gap -> the last bin)
        big = torch.tensor([65504.0, -65519.0, 65520.0, 3.0e38], dtype=dtype)
        base[5:9] = big
        agents[0][5:9] = big + torch.tensor([0.25, -8.0, 16.0, 1.0e31], dtype=dtype)  # unique to agent 0
        for a in agents[1:]:
            a[5:9] = big
    cfg = dict(SMALL_CONFIG, torch_dtype=str(dtype).removeprefix("torch."))

    def split(flat: torch.Tensor, out_dtype: torch.dtype) -> dict[str, torch.Tensor]:
        parts, at = {}, 0
        for k, shape in SHAPES.items():
            parts[k] = flat[at : at + sizes[k]].reshape(shape).to(out_dtype).clone()
            at += sizes[k]
        return parts

    base_dir = write_model(folder / "base", split(base, dtype), cfg, shards=2)
    dirs = [
        write_model(folder / f"agent{t}", split(a.double(), agent_dtype or dtype), cfg, shards=2)
        for t, a in enumerate(agents)
    ]
    return base_dir, dirs


def _probe(monkeypatch, base: Path, agents: list[Path], fused: bool, eps: float, chunk: int, threads: int) -> dict:
    monkeypatch.setattr(passes, "use_kernels", lambda device_type, elements: fused and device_type == "cpu")
    monkeypatch.setenv("RAM_DESKTOP_THREADS", str(threads))
    calls = []
    real = kernels.analyze
    monkeypatch.setattr(kernels, "analyze", lambda *a, **k: calls.append(1) or real(*a, **k))
    report = pipeline.probe(
        MergeSpec.build(str(base), [str(a) for a in agents], eps=eps, device="cpu"),
        RunOptions(use_cache=False, chunk_elements=chunk),
    )
    monkeypatch.setattr(kernels, "analyze", real)
    assert bool(calls) == fused  # the kernel really ran (or really did not)
    assert report.complete
    return report.to_json()


@pytest.mark.parametrize(
    "dtype,agent_dtype,n_agents",
    [
        (torch.bfloat16, None, 3),
        (torch.float16, None, 3),
        (torch.float32, None, 3),
        (torch.float64, None, 2),
        (torch.bfloat16, torch.float64, 2),  # float64 compute over a bf16 base: ulps of the stored bf16
        (torch.bfloat16, None, 1),
        (torch.float16, None, 8),
    ],
)
@pytest.mark.parametrize("eps", [1e-5, 0.0])
def test_report_equals_torch_path(tmp_path, monkeypatch, dtype, agent_dtype, n_agents, eps):
    base, agents = _odd_models(tmp_path / "in", dtype, n_agents, seed=n_agents, agent_dtype=agent_dtype)
    reference = _probe(monkeypatch, base, agents, False, eps, 1000, 1)
    # the data reaches the interesting cases: unique elements in several λ* bins of every dtype, the
    # "never" bin, shared elements of both signs, and several ulp bins
    hist = {name: np.array(h).sum(0) for name, h in reference["rescale_survival"]["hist"].items()}
    assert hist["bfloat16"].sum() > 5 and max((h > 0).sum() for h in hist.values()) >= 3
    if dtype in (torch.float32, torch.float64):  # float16 overflow and "never" land in the last bin
        assert hist["float16"][-1] > 0
    if n_agents > 1:
        assert any(0 < p["same_sign"] < p["both"] for p in reference["pairs"])
    assert sum(1 for c in reference["ulp_histogram"]["counts"][0] if c) >= 3
    for chunk, threads in ((1000, 1), (1000, 2), (7, 2), (1 << 19, 1)):
        assert _probe(monkeypatch, base, agents, True, eps, chunk, threads) == reference, (chunk, threads)


def test_chunks_of_one_element(tmp_path, monkeypatch):
    base, agents = _odd_models(tmp_path / "in", torch.bfloat16, 3, seed=5)
    reference = _probe(monkeypatch, base, agents, False, 1e-5, 1, 1)
    assert _probe(monkeypatch, base, agents, True, 1e-5, 1, 2) == reference
    assert _probe(monkeypatch, base, agents, True, 1e-5, 1000, 1) == reference


def test_demo_probe_equals_torch_path(tmp_path, monkeypatch):
    base, agents = make_models(tmp_path / "in", shards=3, agents={"a": 0.5, "b": 0.55, "c": 0.04, "d": 0.3})
    reference = _probe(monkeypatch, base, agents, False, 1e-5, 1 << 19, 2)
    assert _probe(monkeypatch, base, agents, True, 1e-5, 1 << 19, 2) == reference


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_non_finite_task_vectors_are_refused_on_both_paths(tmp_path, monkeypatch, bad):
    base, agents = _odd_models(tmp_path / "in", torch.float32, 2, seed=1)
    tensors = {}
    from safetensors.torch import load_file, save_file

    target = next(agents[1].glob("model-00002-*.safetensors"))
    tensors = load_file(str(target))
    name = min(tensors)
    tensors[name].view(-1)[3] = bad
    save_file(tensors, str(target), metadata={"format": "pt"})
    messages = []
    for fused in (True, False):
        with pytest.raises(InputError) as err:
            _probe(monkeypatch, base, agents, fused, 1e-5, 1000, 2)
        messages.append(str(err.value))
    assert messages[0] == messages[1] and name in messages[0] and "NaN or Inf" in messages[0]


def test_kernel_flags_non_finite_and_declines_what_it_does_not_cover():
    base = torch.zeros(3000, dtype=torch.bfloat16)
    agent = base.clone()
    agent[2999] = float("inf")
    got = kernels.analyze(base, [base.clone(), agent], 1e-5, torch.float32, *STAT, 65, None)
    assert got is not None and got.finite is False
    ok = kernels.analyze(base, [base.clone(), base.clone()], 1e-5, torch.float32, *STAT, 65, None)
    assert ok.finite and ok.joint[0] == 3000 and ok.counts.sum() == 0 and ok.ulps.sum() == 0
    assert kernels.analyze(base, [base] * 9, 1e-5, torch.float32, *STAT, 65, None) is None  # 4^9 bins: torch
    assert kernels.analyze(base, [base[:10]], 1e-5, torch.float32, *STAT, 65, None) is None
    # no method statistic: the same counts, none of a statistic's
    bare = kernels.analyze(base, [base.clone(), agent.clone().fill_(1.0)], 1e-5, torch.float32, None, (), 65, None)
    withal = kernels.analyze(base, [base.clone(), agent.clone().fill_(1.0)], 1e-5, torch.float32, *STAT, 65, None)
    assert bare.counts is None and withal.counts.sum() == 3 * 3000
    assert np.array_equal(bare.joint, withal.joint) and np.array_equal(bare.ulps, withal.ulps)
    # a statistic that gives no numba value: the torch path
    assert kernels.analyze(base, [base], 1e-5, torch.float32, lambda compute: None, (3, 1000), 65, None) is None


# --- the branch-free helpers and the λ* bins against torch, element by element --------------------


def _map(fn, values: np.ndarray, out_dtype, *extra):
    import numba

    @numba.njit
    def run(values, out):
        for i in range(values.shape[0]):
            out[i] = fn(values[i], *extra)
        return out

    return run(values, np.empty(values.shape[0], out_dtype))


def test_branch_free_float16_conversions_match_torch():
    from ram_desktop.core.engine import kernel_code as kc

    from .test_fused_kernels import _edge_floats

    values = _edge_floats()
    values = values[~np.isnan(values)]
    ours = _map(kc.to_half_bits, values, np.int64).astype(np.uint16)
    theirs = torch.from_numpy(values).to(torch.float16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(ours, theirs)
    every = np.arange(1 << 16, dtype=np.int64)
    every = every[((every & 0x7C00) != 0x7C00) | ((every & 0x3FF) == 0)]  # all but NaN: ±0, subnormals, ±inf
    widened = _map(kc.from_half_bits, every, np.float32)
    reference = torch.from_numpy(every.astype(np.int16)).view(torch.float16).float().numpy()
    assert np.array_equal(widened.view(np.uint32), reference.view(np.uint32))


@pytest.mark.parametrize(
    "dtype,sign_mask,inf_bits",
    [(torch.bfloat16, 0x8000, 0x7F80), (torch.float16, 0x8000, 0x7C00), (torch.float32, 0x80000000, 0x7F800000)],
)
def test_step_bits_is_torch_nextafter(dtype, sign_mask, inf_bits):
    from ram_desktop.core.engine import kernel_code as kc

    if dtype == torch.float32:
        bits = np.concatenate(
            [
                np.arange(0, 1 << 32, 4099, dtype=np.int64),
                np.array(
                    [
                        0,
                        1,
                        0x7F7FFFFF,
                        0x7F800000,
                        0x80000000,
                        0x80000001,
                        0xFF7FFFFF,
                        0xFF800000,
                        0x00800000,
                        0x007FFFFF,
                        0x3F800000,
                        0xBF800000,
                    ],
                    np.int64,
                ),
            ]
        )
        view = torch.int32
        values = torch.from_numpy(bits.astype(np.uint32).view(np.int32)).view(dtype)
    else:
        bits = np.arange(1 << 16, dtype=np.int64)
        view = torch.int16
        values = torch.from_numpy(bits.astype(np.uint16).view(np.int16)).view(dtype)
    keep = ~torch.isnan(values).numpy()
    bits, values = bits[keep], values[torch.from_numpy(keep)]
    mask = (1 << (32 if dtype == torch.float32 else 16)) - 1
    for up in (True, False):
        ours = _map(kc.step_bits, bits, np.int64, up, np.int64(sign_mask), np.int64(inf_bits)) & mask
        toward = torch.full_like(values, float("inf") if up else float("-inf"))
        theirs = torch.nextafter(values, toward).view(view).numpy().astype(np.int64) & mask
        assert np.array_equal(ours, theirs), up


@pytest.mark.parametrize("compute", [torch.float32, torch.float64])
def test_lambda_star_bins_equal_torch_keys(compute):
    """Adversarial elements: updates of whole and half ulps of every survival dtype (λ* on bin edges and
    rounding ties), tiny and subnormal updates (1/τ overflows), values at the float16 overflow, ±0 bases."""
    from ram_desktop.core.methods import ram_rescale_kernel as kc
    from ram_desktop.core.methods.ram_rescale import SURVIVAL_BINS, SURVIVAL_STEP, lambda_star_keys

    g = torch.Generator().manual_seed(11)
    n = 40_000
    x = torch.randn(n, generator=g, dtype=torch.float64) * 10.0 ** torch.randint(-6, 3, (n,), generator=g)
    x[::7] = 0.0
    x[1::7] = -0.0
    x[2::50] = 65504.0 * torch.sign(torch.randn(x[2::50].shape, generator=g, dtype=torch.float64))
    x = x.to(compute)
    ulp_bits = torch.tensor([7, 10, 23], dtype=torch.float64)[torch.randint(0, 3, (n,), generator=g)]
    steps = torch.randint(-6, 7, (n,), generator=g).double() / 2.0 ** torch.randint(0, 3, (n,), generator=g)
    magnitude = torch.exp2(torch.floor(torch.log2(x.double().abs().clamp(min=1e-30))) - ulp_bits)
    tau = steps * magnitude
    tau[3::11] = torch.randn(tau[3::11].shape, generator=g, dtype=torch.float64) * 1e-3
    tau[4::97] = torch.finfo(torch.float32).tiny * torch.rand(tau[4::97].shape, generator=g, dtype=torch.float64)
    tau = tau.to(compute)
    keep = tau != 0
    x, tau = x[keep].contiguous(), tau[keep].contiguous()
    cdt = np.float64 if compute == torch.float64 else np.float32
    keys = lambda_star_keys(x, tau, 0).numpy()
    m = x.numel()
    for d in range(3):
        bins = np.empty(m, np.int32)
        kc.lambda_star_bins(
            x.numpy(),
            tau.numpy(),
            m,
            d,
            cdt(1.0 / SURVIVAL_STEP),
            cdt(np.finfo(cdt).max),
            cdt(0.5),
            cdt(SURVIVAL_BINS - 1),
            bins,
        )
        expected = keys[d * m : (d + 1) * m] - d * SURVIVAL_BINS
        assert np.array_equal(bins, expected), d
        assert len(np.unique(bins)) > 20 and (bins == SURVIVAL_BINS - 1).any() and (bins == 0).any()
