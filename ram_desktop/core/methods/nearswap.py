"""NearSwap (docs/methods.md, "NearSwap"; mergekit ``nearswap``): take the agent's value where it is near the
base's. Per element, w = clamp(t / max(|θ_base − θ_agent|, 1e-6), 0, 1) and θ = w·θ_agent + (1 − w)·θ_base, in
the compute dtype — mergekit 0.1.5's operations: its bits. Elementwise: memory bounded by the chunk."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..engine.chunks import Chunk
from ..lazy import torch
from . import weights
from .base import Interop, MergeMethod, Streaming
from .mergekit_map import MergekitExact, MergekitMapping, exact_export
from .weights import WeightsContext

if TYPE_CHECKING:
    from ..engine.plan import MergePlan

T = weights.shared_param("t", 0.001, "distance scale: elements closer than t take the agent's value fully")
PARAMS = (T, weights.DTYPE)


def nearswap_merge(chunk: Chunk, ctx: WeightsContext) -> torch.Tensor:
    a, b = chunk.thetas(ctx.dtype(chunk))
    t = float(ctx.shared("t", chunk))
    w = (t / torch.abs(a - b).clamp(min=1e-6)).clamp(min=0, max=1)
    return w * b + (1 - w) * a


def _bind(ctx: WeightsContext, plan: MergePlan) -> WeightsContext:
    weights.check_count("nearswap", plan.n_agents, 1, 1)
    return weights.bind(ctx, plan)


EXACT = MergekitExact("nearswap", {"t": "t"}, {}, agents=(1, 1))

METHODS = (
    MergeMethod(
        "nearswap",
        "NearSwap",
        "Take the agent's values where they are within t of the base's.",
        PARAMS,
        nearswap_merge,
        prepare=lambda params, probe, collected: weights.prepare(params, PARAMS, required=("t",)),
        bind=_bind,
        short="NearSwap",
        streaming=Streaming(theta=True, thread_safe=True),
        interop=Interop(
            mergekit=MergekitMapping(exact_export(EXACT), exact=(EXACT,)),
            citation="alchemonaut, *QuartetAnemoi-70B-t0.0001* (Hugging Face model card), implemented in mergekit",
        ),
        agents=(1, 1),
    ),
)
