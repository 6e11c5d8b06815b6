"""The fused CPU paths of mergekit's whole-tensor methods (SLERP, Model Stock at ``dtype: float32``; DELLA, TIES's
magnitude trim and breadcrumbs streamed by ``gta.gta_streamed``) give the torch path's bytes, and mergekit's where it is installed, on tensors of several 2²⁰-element pieces, for
bfloat16, float16 and float32 inputs and outputs; a NaN in an agent is still refused naming the tensor. Every
merge runs in a fresh ``ram-merge`` process (``RAM_DESKTOP_KERNELS=0`` turns the fused kernels off)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from tests import reference as ref
from tests.conftest import SMALL_CONFIG, make_models

# an embedding and a head of 70,000 × 32 = 2.24M elements: two whole 2²⁰-element pieces and a partial one,
# and more than one part for the kernels' threads (kernels.PART_ELEMENTS)
WIDE = dict(SMALL_CONFIG, vocab_size=70000, num_hidden_layers=3)
PIECE = 1 << 20


def _merge(base: Path, agents: list[Path], out: Path, method: str, kernels: bool, *extra: str) -> Path:
    env = dict(os.environ, RAM_DESKTOP_KERNELS="1" if kernels else "0")
    cmd = [
        sys.executable,
        "-m",
        "ram_desktop",
        "-q",
        "merge",
        str(base),
        *map(str, agents),
        "--method",
        method,
        "--dtype",
        "float32",
        "--out",
        str(out),
        "--device",
        "cpu",
        *extra,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _same(a: Path, b: Path) -> None:
    x, y = ref.load_model(a), ref.load_model(b)
    assert x.keys() == y.keys()
    for name in x:
        assert x[name].dtype == y[name].dtype, name
        assert torch.equal(x[name].view(torch.uint8), y[name].view(torch.uint8)), name


def _slerp_reference(a: torch.Tensor, b: torch.Tensor, t: float) -> torch.Tensor:
    """SLERP as mergekit 0.1.5 defines it, written out for one flat float32 pair: norms as the norm of the
    2²⁰-element pieces' norms, the dot product as the sum of the pieces' sums."""
    a, b = a.float().reshape(1, -1), b.float().reshape(1, -1)
    starts = range(0, a.shape[1], PIECE)
    na = torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(a[:, s : s + PIECE], dim=1, keepdim=True) for s in starts]), dim=0
    )
    nb = torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(b[:, s : s + PIECE], dim=1, keepdim=True) for s in starts]), dim=0
    )
    na, nb = torch.where(na > 1e-8, na, 1), torch.where(nb > 1e-8, nb, 1)
    dot = (
        torch.stack(
            [((a[:, s : s + PIECE] / na) * (b[:, s : s + PIECE] / nb)).sum(dim=1, keepdim=True) for s in starts]
        )
        .sum(dim=0)
        .clamp(-1, 1)
    )
    tt = torch.tensor([[t]])
    if bool(dot.abs() > 0.9995):
        ca, cb = 1 - tt, tt
    else:
        omega = torch.acos(dot)
        ca, cb = torch.sin((1 - tt) * omega) / torch.sin(omega), torch.sin(tt * omega) / torch.sin(omega)
    return ca * a + cb * b


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_fused_paths_equal_the_torch_path(tmp_path, dtype):
    base, agents = make_models(
        tmp_path / "in", dtype=dtype, config=WIDE, agents={"alpha": 0.5, "beta": 0.55, "gamma": 0.04}
    )
    assert load_file(str(next(base.glob("*.safetensors"))))["model.embed_tokens.weight"].numel() > PIECE
    out_dtype = "bfloat16" if dtype == torch.float32 else "float32"
    for method, inputs, params in (
        ("slerp", agents[:1], ["--t", "0.3"]),
        ("model-stock", agents, []),
        ("della", agents, ["--density", "0.4", "--epsilon", "0.15", "--seed", "3"]),
        # the trims: whole-|δ| ranks by torch, then the streamed combination; with and without the L1 rescale
        ("weighted-ties", agents, ["--weight", "0.5,1.0,0.8", "--density", "0.3,0.5,0.7", "--rescale", "true"]),
        ("breadcrumbs-ties", agents, ["--density", "0.6", "--gamma", "0.02"]),
    ):
        extra = ["--out-dtype", out_dtype, *params]
        fused = _merge(base, inputs, tmp_path / f"{method}-fused", method, True, *extra)
        plain = _merge(base, inputs, tmp_path / f"{method}-torch", method, False, *extra)
        _same(fused, plain)
    # and SLERP against the formula written out, on the two-piece embedding
    b, a = ref.load_model(base), ref.load_model(agents[0])
    merged = ref.load_model(tmp_path / "slerp-fused")
    name = "model.embed_tokens.weight"
    want = _slerp_reference(b[name], a[name], 0.3).to(getattr(torch, out_dtype)).reshape(b[name].shape)
    assert torch.equal(merged[name].view(torch.uint8), want.view(torch.uint8))


def test_a_nan_in_an_agent_is_refused_on_the_fused_path(tmp_path):
    base, agents = make_models(tmp_path / "in", config=WIDE, agents={"alpha": 0.5, "beta": 0.55})
    shard = next(agents[1].glob("*.safetensors"))
    tensors = load_file(str(shard))
    tensors["model.embed_tokens.weight"][5, 3] = float("nan")
    save_file(tensors, str(shard), metadata={"format": "pt"})
    cmd = [
        sys.executable,
        "-m",
        "ram_desktop",
        "merge",
        str(base),
        *map(str, agents),
        "--method",
        "model-stock",
        "--dtype",
        "float32",
        "--out",
        str(tmp_path / "out"),
        "--device",
        "cpu",
    ]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env=dict(os.environ, RAM_DESKTOP_KERNELS="1"), timeout=600, check=False
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "model.embed_tokens.weight" in proc.stderr and "NaN" in proc.stderr
    assert "Traceback" not in proc.stderr


def _mergekit() -> str | None:
    exe = os.environ.get("RAM_MERGEKIT") or "/work/mergekit-venv/bin/mergekit-yaml"
    return exe if Path(exe).exists() else None


@pytest.mark.skipif(_mergekit() is None, reason="mergekit not installed (set RAM_MERGEKIT=/path/to/mergekit-yaml)")
@pytest.mark.parametrize("method,n,parameters", [("slerp", 1, {"t": [0.2, 0.7]}), ("model_stock", 3, {})])
def test_fused_whole_tensor_methods_give_mergekit_bytes(tmp_path, method, n, parameters):
    base, agents = make_models(
        tmp_path / "in", config=WIDE, agents=dict(list({"alpha": 0.5, "beta": 0.55, "gamma": 0.04}.items())[:n])
    )
    config = {
        "merge_method": method,
        "base_model": str(base),
        "models": [{"model": str(a)} for a in agents],
        "dtype": "float32",
        "out_dtype": "bfloat16",
    }
    if parameters:
        config["parameters"] = parameters
    path = tmp_path / "mk.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [_mergekit(), str(path), str(tmp_path / "mk")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = subprocess.run(
        [sys.executable, "-m", "ram_desktop", "-q", "run", str(path), "--out", str(tmp_path / "ours")],
        capture_output=True,
        text=True,
        env=dict(os.environ, RAM_DESKTOP_KERNELS="1"),
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    _same(tmp_path / "ours", tmp_path / "mk")


def test_della_mask_kernel_equals_the_torch_loop():
    """DELLA's ranks and draws by the fused kernel (a radix sort) against the torch loop's two stable argsorts, on
    rows with ties, signed zeros, one-dimensional and two-wide tensors."""
    from ram_desktop.core.engine import kernels
    from ram_desktop.core.methods import gta

    torch.manual_seed(0)
    tied = torch.randint(-3, 4, (64, 300)).float() * 0.5
    tied[0, :10] = -0.0
    for x in (torch.randn(2100, 1024) * 1e-3, torch.randn(1000), tied, torch.randn(7, 2)):
        for agent in range(2):
            fused = gta.della_magprune(x.clone(), 0.4, 0.15, True, 3, agent, "model.layers.0.mlp.up_proj.weight")
            with kernels.disabled():
                plain = gta.della_magprune(x.clone(), 0.4, 0.15, True, 3, agent, "model.layers.0.mlp.up_proj.weight")
            assert torch.equal(fused.view(torch.int32), plain.view(torch.int32))
            if x.numel() > 1_000_000:  # no zeros here: the asked share (k = 0.4) in expectation
                assert 0.38 < float((fused != 0).float().mean()) < 0.42


@pytest.mark.parametrize(
    "name,params",
    [
        ("weighted-ties", {"weight": [0.5, 1.0, 0.8], "density": [0.3, 0.5, 0.7]}),
        ("weighted-task-arithmetic", {"weight": [0.3, 0.5, 1.2], "lambda": 0.8}),
        ("della", {"density": 0.5, "epsilon": 0.1, "seed": 3}),
        ("della-linear", {"density": 0.4, "seed": 5, "normalize": True}),
        ("breadcrumbs-ties", {"density": 0.6, "gamma": 0.02, "int8_mask": True}),
        ("weighted-ties", {"weight": [0.0, 0.0, 0.0], "density": [1, 1, 1]}),  # every divisor 0 → 1
    ],
)
def test_gta_combination_kernel_equals_the_torch_steps(name, params):
    """The weighted task arithmetic family's combination (weights, sign consensus, divisor, λ, base + Σ) by the
    fused kernel, split over the cores, against the torch steps on a 3M-element tensor with signed zeros in the
    base and cancelling agents."""
    from ram_desktop.core.engine import kernels
    from ram_desktop.core.engine.chunks import Chunk
    from ram_desktop.core.methods import get_method, weights

    torch.manual_seed(0)
    n = 3_000_000
    base = torch.randn(n) * 0.02
    base[:5] = -0.0
    agents = [base + torch.randn(n) * 1e-3 * (torch.rand(n) < 0.5) for _ in range(3)]
    agents[0][:3] = -agents[1][:3]
    method = get_method(name)
    ctx = weights.prepare(method.resolve(params), method.params)

    def merged() -> torch.Tensor:
        chunk = Chunk(
            0,
            "model.layers.0.mlp.up_proj.weight",
            0,
            base.clone(),
            torch.stack([a - base for a in agents]),
            1e-5,
            raw=[base.clone(), *(a.clone() for a in agents)],
        )
        return method.merge(chunk, ctx).clone()

    fused = merged()
    with kernels.disabled():
        plain = merged()
    assert torch.equal(fused.view(torch.int32), plain.view(torch.int32))
