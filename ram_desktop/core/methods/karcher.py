"""Karcher mean (docs/methods.md, "Karcher mean"; mergekit ``karcher``): the Riemannian mean of the inputs'
directions on the unit sphere, scaled by their mean norm. Every model is an input (a base model that should take
part is listed among the agents). Iterates at most ``max_iter`` times; mergekit 0.1.5's operations in its order:
its bits. Whole-tensor norms and dot products: memory bounded by one tensor."""

from __future__ import annotations

from typing import Any

from ..engine.chunks import Chunk
from ..lazy import torch
from . import weights
from .base import Interop, MergeMethod, Param, Streaming
from .mergekit_map import MergekitExact, MergekitMapping, exact_export
from .weights import WeightsContext

MAX_ITER = Param("max_iter", int, 10, "largest number of iterations", 1, 10_000)
TOL = Param("tol", float, 1e-5, "stop when the tangent step is shorter than this", 0.0, 1.0)
PARAMS = (MAX_ITER, TOL, weights.DTYPE)


def karcher(tensors: list[torch.Tensor], alphas: list[float], max_iter: int, tol: float) -> Any:
    if len(tensors) == 1:
        return tensors[0]
    dtype = torch.float64 if tensors[0].dtype == torch.float64 else torch.float32
    norms, units = [], []
    for tensor in tensors:
        norm = torch.linalg.vector_norm(tensor.to(dtype))
        norms.append(norm)
        units.append(torch.zeros_like(tensor) if norm.item() == 0.0 else (tensor / norm).to(tensor.dtype))
    valid = [i for i, n in enumerate(norms) if n.item() > tol]
    if not valid:
        return sum(t * 0 for t in tensors)
    alpha_sum = sum(alphas[i] for i in valid)
    alpha_n = [alphas[i] / alpha_sum for i in valid]
    valid_units = [units[i] for i in valid]
    mean = torch.zeros_like(valid_units[0])
    for a, u in zip(alpha_n, valid_units):
        mean += a * u
    mean_norm = torch.linalg.vector_norm(mean.to(dtype))
    mean = valid_units[0].clone() if mean_norm.item() < tol else (mean / mean_norm).to(mean.dtype)
    for _ in range(max_iter):
        tangent = torch.zeros_like(mean)
        for a, u in zip(alpha_n, valid_units):
            dot = torch.clamp(torch.dot(mean.flatten(), u.flatten()), -1.0, 1.0)
            angle = torch.arccos(dot)
            if angle.item() < tol:
                continue
            tangent += a * (angle / torch.sin(angle)) * (u - dot * mean)
        tangent_norm = torch.linalg.vector_norm(tangent.to(dtype))
        if tangent_norm.item() < tol:
            break
        mean = (torch.cos(tangent_norm) * mean + torch.sin(tangent_norm) * (tangent / tangent_norm)).to(mean.dtype)
        unit_norm = torch.linalg.vector_norm(mean.to(dtype))
        if unit_norm.item() > tol:
            mean = (mean / unit_norm).to(mean.dtype)
    scale = sum(a * n for a, n in zip(alphas, norms))
    return scale * mean


def karcher_merge(chunk: Chunk, ctx: WeightsContext) -> torch.Tensor:
    tensors = chunk.thetas(ctx.dtype(chunk))[1:]
    return karcher(
        tensors, [1.0 / len(tensors)] * len(tensors), ctx.params_of(chunk)["max_iter"], ctx.params_of(chunk)["tol"]
    )


EXACT = MergekitExact("karcher", {"max_iter": "max_iter", "tol": "tol"}, {}, base="input", agents=(1, None))

METHODS = (
    MergeMethod(
        "karcher",
        "Karcher mean",
        "Riemannian mean of the models' directions, scaled by their mean norm.",
        PARAMS,
        karcher_merge,
        prepare=lambda params, probe, collected: weights.prepare(params, PARAMS),
        bind=weights.bind,
        short="Karcher",
        streaming=Streaming(whole_tensor=True, theta=True, thread_safe=False),
        interop=Interop(
            mergekit=MergekitMapping(exact_export(EXACT), exact=(EXACT,)),
            citation="Karcher, *Riemannian center of mass and mollifier smoothing*, 1977 (as implemented in mergekit)",
        ),
    ),
)
