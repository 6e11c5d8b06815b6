"""NuSLERP (docs/methods.md, "NuSLERP"; mergekit ``nuslerp``): spherical interpolation of two agents, of their
task vectors when the base takes part (``use_base``), by rows, columns or the flattened tensor.

With weights w₁, w₂ the position is t = w₂ / (w₁ + w₂) (0.5 when |w₁ + w₂| < 1e-6); v₀, v₁ are the two agents
(minus the base with ``use_base``), normalised along the last axis (``nuslerp_flatten``: the whole tensor;
``nuslerp_row_wise``: along the first), cos Ω = clamp(⟨v̂₀, v̂₁⟩, −1, 1) and

    r = (sin((1 − t)Ω)·v₀ + sin(tΩ)·v₁) / sin Ω,   (1 − t)·v₀ + t·v₁ where 1 − cos²Ω ≤ 1e-16,

θ = θ_base + r (or r). mergekit 0.1.5's operations in its order: its bits. Norms of whole rows or tensors:
memory bounded by one tensor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..engine.chunks import Chunk
from ..lazy import torch
from . import weights
from .base import Interop, MergeMethod, Param, Streaming
from .mergekit_map import MergekitExact, MergekitMapping, exact_export
from .weights import WeightsContext

if TYPE_CHECKING:
    from ..engine.plan import MergePlan

WEIGHT = weights.agent_param("weight", 1.0, "weight of each of the two agents (t = w₂ / (w₁ + w₂))")
ROW_WISE = Param("nuslerp_row_wise", bool, False, "interpolate columns (along the first axis) instead of rows")
FLATTEN = Param("nuslerp_flatten", bool, True, "interpolate the whole tensor as one vector")
USE_BASE = Param("use_base", bool, True, "interpolate task vectors (agent − base) and add the base back")
PARAMS = (WEIGHT, ROW_WISE, FLATTEN, USE_BASE, weights.DTYPE)


def nuslerp(t: float, v0: torch.Tensor, v1: torch.Tensor, dim: int, flatten: bool, eps: float = 1e-8) -> torch.Tensor:
    out_shape = v0.shape

    def unit(x: torch.Tensor) -> torch.Tensor:
        return x / torch.norm(x, dim=-1, keepdim=True).clamp(min=1e-7)

    if flatten:
        v0, v1 = v0.reshape(-1), v1.reshape(-1)
    elif dim != -1:
        v0, v1 = v0.transpose(dim, -1), v1.transpose(dim, -1)
    cos = torch.sum(unit(v0) * unit(v1), dim=-1, keepdim=True).clamp(-1, 1)
    colinear = (1 - cos.square()) <= eps**2
    omega = torch.acos(torch.where(colinear, 0, cos))
    result = (torch.sin((1 - t) * omega) * v0 + torch.sin(t * omega) * v1) / torch.sin(omega)
    result = torch.where(colinear, (1 - t) * v0 + t * v1, result)
    if dim != -1 and not flatten:
        result = result.transpose(dim, -1)
    return result.reshape(out_shape)


def nuslerp_merge(chunk: Chunk, ctx: WeightsContext) -> torch.Tensor:
    shape = ctx.shape(chunk)
    thetas = [t.reshape(shape) for t in chunk.thetas(ctx.dtype(chunk))]
    w = ctx.agents("weight", chunk)
    total = sum(w)
    t = 0.5 if abs(total) < 1e-6 else w[1] / total
    p = ctx.params
    dim = 0 if p["nuslerp_row_wise"] else -1
    if p["use_base"]:
        base = thetas[0]
        return (base + nuslerp(t, thetas[1] - base, thetas[2] - base, dim, p["nuslerp_flatten"])).reshape(-1)
    return nuslerp(t, thetas[1], thetas[2], dim, p["nuslerp_flatten"]).reshape(-1)


def _bind(ctx: WeightsContext, plan: MergePlan) -> WeightsContext:
    weights.check_count("nuslerp", plan.n_agents, 2, 2)
    return weights.bind(ctx, plan)


EXACT = MergekitExact(
    "nuslerp",
    {"nuslerp_row_wise": "nuslerp_row_wise", "nuslerp_flatten": "nuslerp_flatten"},
    {"weight": "weight"},
    base="optional",
    required=("weight",),
    agents=(2, 2),
)

METHODS = (
    MergeMethod(
        "nuslerp",
        "NuSLERP",
        "Spherical interpolation of two agents (or their task vectors) by weight.",
        PARAMS,
        nuslerp_merge,
        prepare=lambda params, probe, collected: weights.prepare(params, PARAMS, required=("weight",)),
        bind=_bind,
        short="NuSLERP",
        streaming=Streaming(whole_tensor=True, theta=True, thread_safe=False),
        interop=Interop(
            mergekit=MergekitMapping(exact_export(EXACT), exact=(EXACT,)),
            citation="Goddard et al., *Arcee's MergeKit: A Toolkit for Merging Large Language Models*, arXiv 2403.13257",
        ),
        agents=(2, 2),
    ),
)
