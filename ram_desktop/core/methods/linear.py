"""Linear: a weighted average of whole models, no base (docs/methods.md, "Linear"; mergekit ``linear``).

    θ = Σ_i w_i·θ_i / Σ_i w_i      (normalize: true, the default)      θ = Σ_i w_i·θ_i      (normalize: false)

over the agents (a base model that should take part is listed among them), each converted to the compute
dtype; the sum runs in float32 (float64 for float64 inputs) from zero in agent order with one fused
multiply-add per agent, the coefficients are float32, and the result is rounded to the compute dtype —
mergekit 0.1.5's ``linear`` step by step, so the bits are its bits. Elementwise: memory is bounded by
the chunk.
"""

from __future__ import annotations

from ..engine.chunks import Chunk
from ..lazy import torch
from . import weights
from .base import Interop, MergeMethod, Param, Streaming
from .mergekit_map import MergekitExact, MergekitMapping, exact_export
from .weights import WeightsContext

WEIGHT = weights.agent_param(
    "weight", 1.0, "weight w of each model in the average (a gradient over layers or filters allowed)"
)
NORMALIZE = Param("normalize", bool, True, "divide by the sum of the weights")
PARAMS = (WEIGHT, NORMALIZE, weights.DTYPE)


def linear_merge(chunk: Chunk, ctx: WeightsContext) -> torch.Tensor:
    inputs = chunk.thetas(ctx.dtype(chunk))[1:]
    first = inputs[0]
    acc_dtype = torch.float64 if first.dtype == torch.float64 else torch.float32
    # [1, N] on the inputs' device, as mergekit packs them
    coef = torch.tensor([ctx.agents("weight", chunk)], dtype=acc_dtype, device=first.device)
    result = torch.zeros_like(first, dtype=acc_dtype)
    for tensor, c in zip(inputs, coef.unbind(1)):
        result.addcmul_(tensor, c.reshape(1))
    if ctx.params_of(chunk)["normalize"]:
        result.div_(coef.sum(dim=1).reshape(1))
    return result.to(first.dtype)


EXACT = MergekitExact("linear", {"normalize": "normalize"}, {"weight": "weight"}, base="input", required=("weight",))

METHODS = (
    MergeMethod(
        "linear",
        "Linear",
        "Weighted average of the models themselves (no base): Σ w·θ / Σ w.",
        PARAMS,
        linear_merge,
        prepare=lambda params, probe, collected: weights.prepare(params, PARAMS, required=("weight",)),
        bind=weights.bind,
        short="Linear",
        streaming=Streaming(theta=True, thread_safe=True),  # elementwise: any chunk, any order
        interop=Interop(
            mergekit=MergekitMapping(exact_export(EXACT), exact=(EXACT,)),
            citation="Wortsman et al., *Model soups: averaging weights of multiple fine-tuned models improves accuracy "
            "without increasing inference time*, ICML 2022, arXiv 2203.05482",
        ),
    ),
)
