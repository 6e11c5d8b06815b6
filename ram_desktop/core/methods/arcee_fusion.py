"""Arcee Fusion (docs/methods.md, "Arcee Fusion"; mergekit ``arcee_fusion``): take the agent's values where they
matter most. Per element, importance = |θ_agent − θ_base| · KL(softmax θ_agent ‖ softmax θ_base) (the KL along the
last axis, each softmax + 1e-8); the threshold is median + 1.5·(q₃ − q₁) of the importances (quantiles read off the
sorted values at ⌊q·(n − 1)⌋); θ = θ_base + (θ_agent − θ_base)·[importance ≥ threshold].

mergekit 0.1.5's operations in its order, so its bits for tensors of at most 10⁶ elements. For larger tensors
both estimate the quantiles from 10⁶ elements drawn with replacement: mergekit with ``torch.randint``, RAM Desktop
with the seeded hash of the ``dare`` methods (deterministic for a seed; not mergekit's draws). Softmax rows and
quantiles of the whole tensor: memory bounded by one tensor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..engine.chunks import Chunk
from ..lazy import torch
from . import weights
from .base import RANK_TIES_ON_GPU, Interop, MergeMethod, Param, Streaming
from .baselines import dare_uniform
from .mergekit_map import MergekitExact, MergekitMapping, exact_export
from .weights import WeightsContext

if TYPE_CHECKING:
    from ..engine.plan import MergePlan

SAMPLE = 1_000_000
SEED = Param("seed", int, 0, "seed of the quantile sample of tensors above 10⁶ elements", 0, 2**64 - 1)
PARAMS = (SEED, weights.DTYPE)


def _quantiles(values: torch.Tensor, seed: int, name: str) -> torch.Tensor:
    flat = values.reshape(-1)
    if flat.numel() > SAMPLE:
        flat = flat[dare_uniform(seed, 0, "arcee-fusion\0" + name, 0, SAMPLE, flat.device) % flat.numel()]
    ordered, _ = torch.sort(flat)
    return ordered[(torch.tensor([0.25, 0.5, 0.75]) * (ordered.numel() - 1)).long()]


def arcee_fusion_merge(chunk: Chunk, ctx: WeightsContext) -> torch.Tensor:
    shape = ctx.shape(chunk)
    base, agent = (t.reshape(shape) for t in chunk.thetas(ctx.dtype(chunk)))
    diff = (agent - base).abs()
    p = torch.nn.functional.softmax(agent, dim=-1) + 1e-8
    q = torch.nn.functional.softmax(base, dim=-1) + 1e-8
    importance = diff * torch.sum(p * torch.log(p / q), dim=-1, keepdim=True)
    q1, median, q3 = _quantiles(importance, ctx.params_of(chunk)["seed"], chunk.name)
    mask = (importance >= median + 1.5 * (q3 - q1)).float()
    return (base + (agent - base) * mask).reshape(-1)


def _bind(ctx: WeightsContext, plan: MergePlan) -> WeightsContext:
    weights.check_count("arcee-fusion", plan.n_agents, 1, 1)
    return weights.bind(ctx, plan)


EXACT = MergekitExact("arcee_fusion", {}, {}, agents=(1, 1))

METHODS = (
    MergeMethod(
        "arcee-fusion",
        "Arcee Fusion",
        "Take the agent's values where their importance (|Δ|·KL) is an outlier.",
        PARAMS,
        arcee_fusion_merge,
        prepare=lambda params, probe, collected: weights.prepare(params, PARAMS),
        bind=_bind,
        short="Arcee Fusion",
        streaming=Streaming(whole_tensor=True, theta=True, thread_safe=False),
        gpu_tolerance=RANK_TIES_ON_GPU,
        interop=Interop(
            mergekit=MergekitMapping(
                exact_export(
                    EXACT,
                    (
                        "tensors above 10⁶ elements: quantiles from a seeded sample here, from torch.randint in mergekit",
                    ),
                ),
                exact=(EXACT,),
            ),
            citation="Arcee AI, *Arcee Fusion* (mergekit, arXiv 2403.13257)",
        ),
        agents=(1, 1),
    ),
)
