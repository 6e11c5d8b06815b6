"""SCE (docs/methods.md, "SCE"; Wan et al., arXiv 2408.07990; mergekit ``sce``): Select the elements whose task
vectors vary most across agents (share ``select_topk`` of the nonzero variances), Calculate each agent's weight
from its mean squared task vector, Erase the values whose sign disagrees with the sum's; θ = θ_base +
Σ_t w_t·m_t·τ_t / max(Σ_t w_t·m_t, 1e-6). mergekit 0.1.5's operations in its order: its bits. Variances, top-k and
weights over the whole tensor: memory bounded by one tensor."""

from __future__ import annotations

from ..engine.chunks import Chunk
from ..lazy import torch
from . import weights
from .base import RANK_TIES_ON_GPU, Interop, MergeMethod, Param, Streaming
from .gta import consensus_mask
from .mergekit_map import MergekitExact, MergekitMapping, exact_export
from .weights import WeightsContext

SELECT = Param("select_topk", float, 1.0, "share of the elements (by variance across agents) kept", 0.0, 1.0)
INT8_MASK = Param("int8_mask", bool, False, "compute the masks in int8 (same result, less memory)")
PARAMS = (SELECT, INT8_MASK, weights.DTYPE)


def sce_merge(chunk: Chunk, ctx: WeightsContext) -> torch.Tensor:
    thetas = chunk.thetas(ctx.dtype(chunk))
    base, tensors = thetas[0], thetas[1:]
    mask_dtype = torch.int8 if ctx.params_of(chunk)["int8_mask"] else base.dtype
    tvs = torch.stack([t - base for t in tensors], dim=0)
    topk = ctx.params_of(chunk)["select_topk"]
    if topk < 1:
        if topk <= 0:
            select = torch.zeros_like(tvs[0], dtype=mask_dtype)
        else:
            var = torch.var(tvs, dim=0, unbiased=False)
            k = int(torch.count_nonzero(var) * topk)
            select = torch.zeros_like(var, dtype=mask_dtype)
            if k:
                _, indices = torch.topk(var.abs().view(-1), k=k, largest=True)
                select.view(-1)[indices] = 1
        tvs = tvs * select.unsqueeze(0)
    erase = consensus_mask(tvs, mask_dtype, chunk)
    w = tvs.square().reshape(tvs.shape[0], -1).mean(dim=1)
    total = torch.sum(w).item()
    w = torch.ones_like(w) / w.shape[0] if abs(total) < 1e-6 else w / total
    while w.dim() < tvs.dim():
        w = w.unsqueeze(-1)
    erased = w * erase
    merged = (tvs * erased).sum(dim=0)
    return base + merged / torch.sum(erased, dim=0).clamp(min=1e-6)


EXACT = MergekitExact("sce", {"select_topk": "select_topk", "int8_mask": "int8_mask"}, {})

METHODS = (
    MergeMethod(
        "sce",
        "SCE",
        "Select high-variance elements, weight agents by their mean square, erase minority signs.",
        PARAMS,
        sce_merge,
        prepare=lambda params, probe, collected: weights.prepare(params, PARAMS),
        bind=weights.bind,
        short="SCE",
        streaming=Streaming(whole_tensor=True, theta=True, thread_safe=False),
        gpu_tolerance=RANK_TIES_ON_GPU,
        interop=Interop(
            mergekit=MergekitMapping(exact_export(EXACT), exact=(EXACT,)),
            citation="Wan et al., *FuseChat: Knowledge Fusion of Chat Models*, arXiv 2408.07990",
        ),
    ),
)
