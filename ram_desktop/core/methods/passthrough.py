"""Passthrough: each output tensor is one model's tensor, optionally scaled (docs/methods.md, "Slices and
passthrough"; mergekit ``passthrough``).

With a stacking layer map (``recipe.slices``, each slice one model's layer range) the output's layers are the
named layers of the named models, one after the other (a "frankenmerge"):

    θ_out = θ_m                  (no scale for model m)
    θ_out = θ_m · scale_m        (scale_m a number, a gradient over the slice's layers or filters)

θ_m converted to the compute dtype first (``dtype``; ``inputs``: as stored, mergekit's default), the product
in that dtype, then rounded once to the output dtype — mergekit 0.1.5's passthrough step by step, so its bits.
Elementwise: memory is bounded by the chunk.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..engine.chunks import Chunk
from ..errors import InputError
from ..lazy import torch
from . import weights
from .base import Interop, MergeMethod, Streaming
from .mergekit_map import MergekitExact, MergekitExport, MergekitMapping
from .weights import WeightsContext

if TYPE_CHECKING:
    from ..engine.plan import MergePlan

SCALE = weights.agent_param(
    "scale", None, "factor each stacked model's tensors are multiplied by (empty: copied as they are)"
)
DTYPE = weights.DTYPE
PARAMS = (SCALE, DTYPE)


def passthrough_merge(chunk: Chunk, ctx: WeightsContext) -> torch.Tensor:
    source = chunk.thetas(ctx.dtype(chunk))[0]  # every role reads the stacked model's tensor
    model = ctx.models.get(chunk.job_index, 0)
    scale = ctx.agent("scale", chunk, model - 1, required=False) if model > 0 else None
    return source if scale is None else source * float(scale)


def _bind(ctx: WeightsContext, plan: MergePlan) -> WeightsContext:
    if plan.layout is None or not plan.layout.stacking:
        raise InputError(
            "passthrough stacks layers of the models: it needs slices, each naming one model and its "
            "layer_range (recipe: slices:)"
        )
    return weights.bind(ctx, plan)


def _export(params: dict, eps: float) -> MergekitExport:
    scale = params.get("scale")
    dtype = params.get("dtype", "float32")
    return MergekitExport(
        "passthrough",
        per_agent={"scale": scale} if scale is not None else {},
        base=True,  # mergekit's passthrough ignores its base_model but takes the config and tokenizer from it
        dtype=None if dtype == "inputs" else dtype,
    )


EXACT = MergekitExact("passthrough", {}, {"scale": "scale"}, base="optional")  # read only with slices (``stacks``)

METHODS = (
    MergeMethod(
        "passthrough",
        "Passthrough (layer stacking)",
        "Copies each output layer from the model and layer the slices name (optionally scaled): layer stacking.",
        PARAMS,
        passthrough_merge,
        prepare=lambda params, probe, collected: weights.prepare(params, PARAMS),
        bind=_bind,
        short="Passthrough",
        streaming=Streaming(theta=True, thread_safe=True, stacks=True),
        interop=Interop(
            mergekit=MergekitMapping(_export, exact=(EXACT,)),
            citation="Goddard et al., *Arcee's MergeKit: A Toolkit for Merging Large Language Models*, arXiv 2403.13257",
        ),
    ),
)
