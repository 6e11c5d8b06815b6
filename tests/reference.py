"""A plain whole-tensor implementation of the paper's equations, written independently of the engine:
numpy float32 on whole tensors, agents summed in order 1..N. Only bf16 conversion goes through torch."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file


def load_model(folder: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    return tensors


def task_vectors(base: dict, agents: list[dict]) -> dict[str, tuple[np.ndarray, list[np.ndarray]]]:
    out = {}
    for name, b in base.items():
        if not b.is_floating_point():
            continue
        work = np.float64 if any(t[name].dtype == torch.float64 for t in [base, *agents]) else np.float32
        bn = b.to(torch.float64 if work is np.float64 else torch.float32).numpy().reshape(-1)
        taus = [
            a[name].to(torch.float64 if work is np.float64 else torch.float32).numpy().reshape(-1) - bn for a in agents
        ]
        out[name] = (bn, taus)
    return out


def probe_counts(tv: dict, eps: float) -> dict:
    """Equations (1) and (2): masks, counts c_i, unique / shared / overlap per agent over the whole model."""
    n = len(next(iter(tv.values()))[1])
    unique, shared = [0] * n, [0] * n
    overlap = [[0] * n for _ in range(n)]
    params = 0
    for b, taus in tv.values():
        params += b.size
        masks = [np.abs(t) > np.asarray(eps, dtype=t.dtype) for t in taus]
        c = np.sum(masks, axis=0)
        for t in range(n):
            unique[t] += int(np.sum(masks[t] & (c == 1)))
            shared[t] += int(np.sum(masks[t] & (c >= 2)))
            for k in range(n):
                overlap[t][k] += int(np.sum(masks[t] & (c == k + 1)))
    rho = [s / u if u else math.inf for s, u in zip(shared, unique)]
    return {"params": params, "unique": unique, "shared": shared, "overlap": overlap, "rho": rho}


def lambdas_ram_plus(rho: list[float], r: float, alpha: float) -> list[float]:
    """Equation (6)."""
    return [1 + r * (alpha if math.isinf(p) else min(max(p, 0.0), alpha)) for p in rho]


def lambdas_ram_plus_soft(unique: list[int], shared: list[int], r: float) -> list[float]:
    """Equation (8), via (9): ρ/(1+ρ) = shared / (shared + unique)."""
    return [1 + r * (s / (s + u)) if s + u else 1.0 for u, s in zip(unique, shared)]


def merged_model(
    base: dict, agents: list[dict], eps: float, lambdas: list[float], out_dtype: torch.dtype | None = None
) -> dict[str, torch.Tensor]:
    """Equation (7), θ = θ_pre + τ_merged rounded once to the output dtype."""
    tv = task_vectors(base, agents)
    result = {}
    for name, b in base.items():
        if name not in tv:
            result[name] = b
            continue
        bn, taus = tv[name]
        dt = bn.dtype
        masks = [np.abs(t) > np.asarray(eps, dtype=dt) for t in taus]
        c = np.sum(masks, axis=0)
        total = np.zeros_like(bn)
        for t in range(len(taus)):
            total = total + np.where(masks[t], taus[t], dt.type(0))
        merged_tau = np.zeros_like(bn)
        for t in range(len(taus)):
            only_t = masks[t] & (c == 1)
            merged_tau[only_t] = dt.type(lambdas[t]) * taus[t][only_t]
        several = c >= 2
        merged_tau[several] = total[several] / c[several].astype(dt)
        theta = torch.from_numpy(bn + merged_tau).reshape(b.shape)
        result[name] = theta.to(out_dtype or b.dtype)
    return result


# --- baselines (SPEC.md section 1, 'Baselines') ----------------------------------------------------
# Whole tensors in numpy, agents summed in order from zero. ``order`` is the plan's tensor order
# (the base's header order), which TIES's earliest-position tie breaking follows in scope `model`.


def _scalar(dt, value):
    return dt.type(value)


def average_tau(taus: list[np.ndarray]) -> np.ndarray:
    dt = taus[0].dtype
    total = np.zeros_like(taus[0])
    for t in taus:
        total = total + t
    return total / _scalar(dt, len(taus))


def task_arithmetic_tau(taus: list[np.ndarray], scale: float) -> np.ndarray:
    total = np.zeros_like(taus[0])
    for t in taus:
        total = total + t
    return total * _scalar(taus[0].dtype, scale)


def ties_keep_count(density: float, n: int) -> int:
    from fractions import Fraction

    return 0 if n == 0 else max(1, math.floor(Fraction(repr(float(density))) * n))


def ties_trim_masks(tv: dict, order: list[str], density: float, scope: str) -> dict[str, list[np.ndarray]]:
    """Per tensor and agent: keep exactly ⌊k·n⌋ largest |τ| per scope, ties to the earliest position
    (a stable sort of −|τ|)."""
    names = [n for n in order if n in tv]
    n_agents = len(tv[names[0]][1])
    masks = {name: [None] * n_agents for name in names}
    for t in range(n_agents):
        groups = [[name] for name in names] if scope == "tensor" else [names]
        for group in groups:
            mags = [np.abs(tv[name][1][t]) for name in group]
            wide = np.float64 if any(m.dtype == np.float64 for m in mags) else np.float32
            flat = np.concatenate([m.astype(wide) for m in mags]) if mags else np.zeros(0, wide)
            k = ties_keep_count(density, flat.size)
            keep = np.zeros(flat.size, dtype=bool)
            keep[np.argsort(-flat, kind="stable")[:k]] = True
            start = 0
            for name, m in zip(group, mags):
                masks[name][t] = keep[start : start + m.size]
                start += m.size
    return masks


def elect_disjoint_mean(values: list[np.ndarray]) -> np.ndarray:
    dt = values[0].dtype
    total = np.zeros_like(values[0])
    for v in values:
        total = total + v
    positive = total >= 0
    acc = np.zeros_like(values[0])
    count = np.zeros(values[0].shape, dtype=np.int64)
    for v in values:
        agree = np.where(positive, v > 0, v < 0)
        acc = acc + np.where(agree, v, dt.type(0))
        count += agree
    return acc / np.maximum(count, 1).astype(dt)


M32 = np.uint64(0xFFFFFFFF)


def _mix32(x: np.ndarray) -> np.ndarray:
    """lowbias32 in uint64 arithmetic (products of two 32-bit numbers fit in 64 bits)."""
    x = x ^ (x >> np.uint64(16))
    x = (x * np.uint64(0x7FEB352D)) & M32
    x = x ^ (x >> np.uint64(15))
    x = (x * np.uint64(0x846CA68B)) & M32
    return x ^ (x >> np.uint64(16))


def dare_keys(seed: int, agent: int, name: str) -> tuple[int, int]:
    """The documented per-agent hash words (a, b): the two little-endian halves of an 8-byte BLAKE2b."""
    import hashlib

    digest = hashlib.blake2b(f"ram-desktop-dare/1\0{seed}\0{agent}\0{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest[:4], "little"), int.from_bytes(digest[4:], "little")


def dare_keep(seed: int, agent: int, name: str, n: int, p: float, first: int = 0) -> np.ndarray:
    """The documented DARE mask of flat positions first .. first+n-1: kept where u ≥ ⌊p·2³²⌋."""
    a, b = (np.uint64(k) for k in dare_keys(seed, agent, name))
    pos = np.arange(first, first + n, dtype=np.uint64)
    u = _mix32(_mix32((pos & M32) ^ a) ^ (pos >> np.uint64(32)) ^ b)
    return u >= np.uint64(math.floor(p * 2.0**32))


def dare_rescaled(taus: list[np.ndarray], name: str, seed: int, p: float) -> list[np.ndarray]:
    dt = taus[0].dtype
    return [
        np.where(dare_keep(seed, t, name, tau.size, p), tau / dt.type(1.0 - p), dt.type(0))
        for t, tau in enumerate(taus)
    ]


def baseline_model(
    base: dict, agents: list[dict], order: list[str], method: str, params: dict, out_dtype: torch.dtype | None = None
) -> dict[str, torch.Tensor]:
    """θ_pre + τ_merged for the baselines, rounded once to the output dtype."""
    tv = task_vectors(base, agents)
    masks = ties_trim_masks(tv, order, params["density"], params["ties_scope"]) if method == "ties" else None
    result = {}
    for name, b in base.items():
        if name not in tv:
            result[name] = b
            continue
        bn, taus = tv[name]
        dt = bn.dtype
        if method == "average":
            tau = average_tau(taus)
        elif method == "task-arithmetic":
            tau = task_arithmetic_tau(taus, params["scale"])
        elif method == "ties":
            trimmed = [np.where(m, t, dt.type(0)) for m, t in zip(masks[name], taus)]
            tau = elect_disjoint_mean(trimmed) * dt.type(params["scale"])
        elif method == "dare-ta":
            tau = task_arithmetic_tau(dare_rescaled(taus, name, params["seed"], params["drop"]), params["scale"])
        elif method == "dare-ties":
            tau = elect_disjoint_mean(dare_rescaled(taus, name, params["seed"], params["drop"])) * dt.type(
                params["scale"]
            )
        else:
            raise ValueError(method)
        result[name] = torch.from_numpy(bn + tau).reshape(b.shape).to(out_dtype or b.dtype)
    return result
