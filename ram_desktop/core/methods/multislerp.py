"""Multi-SLERP (docs/methods.md, "Multi-SLERP"; mergekit ``multislerp``): barycentric interpolation of N agents on
the hypersphere (of their task vectors when the base takes part, ``use_base``).

With weights w (divided by Σw with ``normalize_weights``), x_i the flattened inputs, u_i = x_i / (‖x_i‖ + ε):
m = Σ w_i·u_i / ‖Σ w_i·u_i‖; tangents g_i = u_i − ⟨u_i, m⟩·m; g = Σ w_i·g_i;
r = (m·cos ‖g‖' + g·sin ‖g‖' / ‖g‖')·Σ w_i‖x_i‖ with ‖g‖' = ‖g‖ + ε; θ = θ_base + r (or r). mergekit 0.1.5's
operations in its order: its bits. Whole-tensor norms: memory bounded by one tensor.
"""

from __future__ import annotations

from ..engine.chunks import Chunk
from ..errors import InputError
from ..lazy import torch
from . import weights
from .base import Interop, MergeMethod, Param, Streaming
from .mergekit_map import MergekitExact, MergekitMapping, exact_export
from .weights import WeightsContext

WEIGHT = weights.agent_param("weight", 1.0, "weight of each agent in the barycentre")
NORMALIZE = Param("normalize_weights", bool, True, "divide the weights by their sum")
EPS = Param("eps", float, 1e-8, "added to norms before dividing", 0.0, 1.0, flag_name="norm_eps")
USE_BASE = Param("use_base", bool, True, "interpolate task vectors (agent − base) and add the base back")
PARAMS = (WEIGHT, NORMALIZE, EPS, USE_BASE, weights.DTYPE)


def multislerp_merge(chunk: Chunk, ctx: WeightsContext) -> torch.Tensor:
    p = ctx.params
    eps = p["eps"]
    thetas = chunk.thetas(ctx.dtype(chunk))
    base = thetas[0] if p["use_base"] else None
    inputs = thetas[1:]
    if len(inputs) == 1:
        return inputs[0]
    tensors = torch.stack(inputs, dim=0)
    if base is not None:
        tensors -= base
    flat = tensors.view(tensors.shape[0], -1)
    w = torch.tensor([float(v) for v in ctx.agents("weight", chunk)], dtype=tensors.dtype, device=tensors.device)
    if p["normalize_weights"]:
        w = w / w.sum()
    norms = torch.norm(flat, dim=-1, keepdim=True)
    units = flat / (norms + eps)
    mean = (units * w.view(-1, 1)).sum(0)
    mean_norm = torch.norm(mean)
    if mean_norm < eps:
        if tensors.shape[0] == 2:
            res = (tensors[0] * w[0] + tensors[1] * w[1]).view(tensors.shape[1:])
            return res + base if base is not None else res
        raise InputError(
            f"multislerp: the weighted sum of the inputs of tensor {chunk.name!r} is zero (no agent changed "
            "it from the base, or antipodal inputs with balancing weights; mergekit refuses it too); choose "
            "other weights, or set use_base false"
        )
    mean = mean / mean_norm
    dots = (units * mean).sum(-1, keepdim=True)
    tangents = units - dots * mean
    tangent = (tangents * w.view(-1, 1)).sum(0)
    tangent_norm = torch.norm(tangent) + eps
    result = mean * torch.cos(tangent_norm) + tangent * (torch.sin(tangent_norm) / tangent_norm)
    result = result * (norms.squeeze(-1) * w).sum()
    result = result.view(tensors.shape[1:])
    return result + base if base is not None else result


EXACT = MergekitExact(
    "multislerp",
    {"normalize_weights": "normalize_weights", "eps": "eps"},
    {"weight": "weight"},
    base="optional",
    required=("weight",),
)

METHODS = (
    MergeMethod(
        "multislerp",
        "Multi-SLERP",
        "Barycentric spherical interpolation of several agents (or their task vectors).",
        PARAMS,
        multislerp_merge,
        prepare=lambda params, probe, collected: weights.prepare(params, PARAMS, required=("weight",)),
        bind=weights.bind,
        short="Multi-SLERP",
        streaming=Streaming(whole_tensor=True, theta=True, thread_safe=False),
        interop=Interop(
            mergekit=MergekitMapping(exact_export(EXACT), exact=(EXACT,)),
            citation="Goddard, *Multi-SLERP* (goddard.blog), implemented in mergekit (arXiv 2403.13257)",
        ),
    ),
)
