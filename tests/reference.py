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
        taus = [a[name].to(torch.float64 if work is np.float64 else torch.float32).numpy().reshape(-1) - bn
                for a in agents]
        out[name] = (bn, taus)
    return out


def probe_counts(tv: dict, eps: float) -> dict:
    """Equations (1) and (2): masks, counts c_i, unique / shared / overlap per agent over the whole model."""
    n = len(next(iter(tv.values()))[1])
    unique, shared = [0] * n, [0] * n
    overlap = [[0] * n for _ in range(n)]
    params = 0
    for _, (b, taus) in tv.items():
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


def merged_model(base: dict, agents: list[dict], eps: float, lambdas: list[float],
                 out_dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
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
