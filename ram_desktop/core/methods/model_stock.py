"""Model Stock (docs/methods.md, "Model Stock"; Jang et al., arXiv 2403.19522; mergekit ``model_stock``).

Per tensor (or per row with ``filter_wise``), with the base w₀ and N ≥ 2 agents w_i, in the compute dtype:

    cos θ = mean over agent pairs i < j of clamp(⟨w_i − w₀, w_j − w₀⟩ / max(‖w_i − w₀‖·‖w_j − w₀‖, 1e-6), −1, 1)
    t     = N·cos θ / (1 + (N − 1)·cos θ)      (t = 0 where |1 + (N − 1)·cos θ| < 1e-6: the base is kept)
    θ     = t·mean_i w_i + (1 − t)·w₀

with mergekit 0.1.5's operations in its order, so its bits. The cosines are torch's sums over the whole tensor: the
fused CPU path forms the norms and sums as torch does from the stored bits, block by block (where its
emulations of torch's reductions are exact on the machine; else from one reused float32 row of the tensor),
so memory is the output and a few blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from ..engine import kernels
from ..engine.chunks import Chunk, StoredSlices, thread_workspace
from ..lazy import torch
from . import weights
from .base import Interop, MergeMethod, Param, Streaming
from .mergekit_map import MergekitExact, MergekitMapping, exact_export
from .weights import WeightsContext

if TYPE_CHECKING:
    from ..engine.kernels import KernelResult
    from ..engine.plan import MergePlan

FILTER_WISE = Param("filter_wise", bool, False, "one interpolation per row (output filter) instead of per tensor")
PARAMS = (FILTER_WISE, weights.DTYPE)


def model_stock_merge(chunk: Chunk, ctx: WeightsContext) -> torch.Tensor:
    shape = ctx.shape(chunk)
    all_weights = [w.reshape(shape) for w in chunk.thetas(ctx.dtype(chunk))]
    w_0, ws = all_weights[0], all_weights[1:]
    if ctx.params_of(chunk)["filter_wise"]:
        if w_0.dim() == 1:
            w_0, ws = w_0.unsqueeze(0), [w.unsqueeze(0) for w in ws]
    else:
        w_0, ws = w_0.reshape(-1), [w.reshape(-1) for w in ws]
    offsets = [w - w_0 for w in ws]
    t = interpolation(offsets, lambda a, b: (a * b).sum(dim=-1))
    average = sum(ws) / len(ws)
    return (t * average + (1 - t) * w_0).reshape(-1)


def interpolation(
    offsets: Sequence[torch.Tensor], dot: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """t from the agents' offsets w_i − w₀ (each [rows, n] or [n]): the mean pairwise cosine, as mergekit
    computes it; ``dot(a, b)``: Σ a·b over the last dimension."""
    norms = [torch.norm(off, dim=-1) for off in offsets]
    return interpolation_of(norms, lambda i, j: dot(offsets[i], offsets[j]))


def interpolation_of(norms: Sequence[torch.Tensor], dot_of: Callable[[int, int], torch.Tensor]) -> torch.Tensor:
    """t from the offsets' norms ``norms[i]`` = ‖w_i − w₀‖ and their dot products ``dot_of(i, j)`` (i < j): the
    same operations as ``interpolation``, whose norms and products may be formed one at a time."""
    cosines = []
    for i in range(len(norms)):
        for j in range(i + 1, len(norms)):
            norm_product = norms[i] * norms[j]
            cosines.append((dot_of(i, j) / norm_product.clamp(min=1e-6)).clamp(-1, 1))
    cos_theta = torch.stack(cosines).mean(dim=0).unsqueeze(-1)
    n = len(norms)
    denominator = 1 + (n - 1) * cos_theta
    singular = denominator.abs() < 1e-6
    safe = torch.where(singular, torch.ones_like(denominator), denominator)
    return torch.where(singular, torch.zeros_like(cos_theta), (n * cos_theta) / safe)


def stock_combine(
    base: np.ndarray,
    agents: tuple[np.ndarray, ...],
    t: float,
    one_minus_t: float,
    out: np.ndarray,
    eps: float | None = None,
) -> tuple[bool, np.ndarray | None]:
    """Model Stock's ``t · mean(agents) + (1 − t) · base`` in float32, rounded once to out's dtype; whether every
    value written is within out's dtype (checked block by block as written), and with ``eps`` the update
    patterns' histogram (2^N bins, |τ| > eps in float32) formed on the way."""
    from . import model_stock_kernel

    tt, rest, n = np.float32(t), np.float32(one_minus_t), np.float32(len(agents))
    want = eps is not None
    e = np.float32(eps if want else 0.0)

    def part(s: int, stop: int) -> tuple[int, np.ndarray]:
        hist = np.zeros((4, 1 << len(agents)) if want else (1, 1), np.int64)
        pattern = kernels.BUFFERS.get(np.float32)[2]  # this thread's block of patterns
        over = model_stock_kernel.stock_combine_kernel(
            base[s:stop],
            tuple(a[s:stop] for a in agents),
            tt,
            rest,
            n,
            kernels.BLOCK,
            out[s:stop],
            e,
            pattern,
            hist,
            want,
        )
        return over, hist

    parts = kernels.split(base.size, part)
    return sum(over for over, _ in parts) == 0, sum(h for _, h in parts).sum(0) if want else None


def model_stock_fused(slices: StoredSlices, ctx: WeightsContext, counts: bool, observe: bool) -> KernelResult | None:
    """``model_stock_merge`` of one whole tensor (not ``filter_wise``) from its stored slices at compute dtype
    float32, the same bits: the offsets' norms and the pairs' sums torch's way from the stored bits, block by
    block (``_streamed_terms``; on small tensors, or where the emulations are not exact here, by torch on one
    reused float32 row: ``_row_terms``), the final combination (rounded once to the output dtype) by the fused
    kernel. None where the kernels do not cover it."""

    job = slices.job
    if ctx.params_at(slices.index)["filter_wise"] or job.numel == 0:
        return None
    if ctx.dtype_of([slices.base, *slices.agents]) != torch.float32:
        return None
    m = kernels.float32_operands(slices.base, slices.agents, job.out_name)
    if m is None:
        return None
    t: torch.Tensor | None = None
    if job.numel >= STREAM_ELEMENTS and kernels.torch_norm_exact() and kernels.TorchSum.exact():
        terms = _streamed_terms(m.base, m.agents)
        if terms is not None:
            norms, dots = terms
            t = interpolation_of(norms, lambda i, j: dots[i, j])
    else:
        t = _row_terms(m.base, m.agents, job.numel)
    if t is None:  # an offset is not finite
        return kernels.KernelResult(m.result, False)
    in_range, hist = stock_combine(m.base, m.agents, float(t), float(1 - t), m.out, slices.eps if counts else None)
    return kernels.KernelResult(m.result, True, hist=hist, in_range=in_range)


STREAM_ELEMENTS = 1 << 20  # from this size on the cosines' norms and sums are formed block by block
PRODUCT_BLOCK = 1 << 18  # elements per block of the pairs' products (1 MiB a pair: they stay in cache)


def _streamed_terms(
    base: np.ndarray, agents: tuple[np.ndarray, ...]
) -> tuple[list[torch.Tensor], dict[tuple[int, int], torch.Tensor]] | None:
    """The offsets' norms and the pairs' dot products, torch's bits without a float32 copy of the tensor: the
    norms an agent a task (``kernel_code.norm_parts`` and ``norm_finish``, torch's order), the pairs' products a
    task per part torch sums apart (``kernels.TorchSum.bounds``), block by block, every pair of a block while its
    offsets are in cache, each fed to its pair's sum; the tasks share the kernel threads. None where an offset is
    not finite."""
    from ..engine.kernel_code import norm_finish, norm_parts
    from . import model_stock_kernel

    n_agents, n = len(agents), base.size
    lanes = np.zeros((n_agents, 8), np.float32)
    tails = np.zeros((n_agents, 8), np.float32)
    pairs = [(i, j) for i in range(n_agents) for j in range(i + 1, n_agents)]
    sums = [kernels.TorchSum(n) for _ in pairs]

    def pair_sums(part: int) -> int:
        lo, hi = sums[0].bounds[part]  # the same for every pair: one n
        block = thread_workspace().get("stock_products", (PRODUCT_BLOCK,), torch.float32, torch.device("cpu"))
        for start in range(lo, hi, PRODUCT_BLOCK):
            stop = min(hi, start + PRODUCT_BLOCK)
            products = block.numpy()[: stop - start]
            for (i, j), summed in zip(pairs, sums, strict=True):
                model_stock_kernel.offset_product_kernel(
                    base[start:stop], agents[i][start:stop], agents[j][start:stop], products
                )
                summed.feed_part(part, products)
        return 0

    # the pairs' tasks first: the longer ones
    pair_tasks = [partial(pair_sums, part) for part in range(len(sums[0].bounds))]
    norm_tasks = [partial(norm_parts, agents[k], base, lanes[k], tails[k]) for k in range(n_agents)]
    unsettled = kernels.split_tasks([*pair_tasks, *norm_tasks])[len(pair_tasks) :]
    if any(unsettled) and not kernels.finite_taus(base, tuple(a for a, u in zip(agents, unsettled, strict=True) if u)):
        return None
    norms = [torch.tensor(norm_finish(n, lanes[k], tails[k]), dtype=torch.float32) for k in range(n_agents)]
    dots = {pair: torch.tensor(summed.result(), dtype=torch.float32) for pair, summed in zip(pairs, sums, strict=True)}
    return norms, dots


def _row_terms(base: np.ndarray, agents: tuple[np.ndarray, ...], numel: int) -> torch.Tensor | None:
    """t from one float32 row of the tensor, reused: each offset in turn for its norm, then each pair's products
    for its sum (the torch reductions mergekit runs on the whole tensor). None where an offset is not finite."""
    row = thread_workspace().get("stock_row", (numel,), torch.float32, torch.device("cpu"))
    norms = []
    for agent in agents:
        if not kernels.offsets_into(base, (agent,), row.numpy().reshape(1, -1)):
            return None
        norms.append(torch.norm(row, dim=-1))

    def dot_of(i: int, j: int) -> torch.Tensor:
        offset_products(base, agents[i], agents[j], row.numpy())
        return row.sum(dim=-1)

    return interpolation_of(norms, dot_of)


def offset_products(base: np.ndarray, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """``out = (a − base) · (b − base)`` in float32, each operation rounded as torch rounds it."""
    from . import model_stock_kernel

    kernels.split(base.size, lambda s, e: model_stock_kernel.offset_product_kernel(base[s:e], a[s:e], b[s:e], out[s:e]))


def _bind(ctx: WeightsContext, plan: MergePlan) -> WeightsContext:
    weights.check_count("model-stock", plan.n_agents, 2)
    return weights.bind(ctx, plan)


EXACT = MergekitExact("model_stock", {"filter_wise": "filter_wise"}, {}, agents=(2, None))

METHODS = (
    MergeMethod(
        "model-stock",
        "Model Stock",
        "Interpolate between the base and the agents' mean by the agents' mutual angle.",
        PARAMS,
        model_stock_merge,
        prepare=lambda params, probe, collected: weights.prepare(params, PARAMS),
        bind=_bind,
        short="Model Stock",
        streaming=Streaming(whole_tensor=True, theta=True, fused=model_stock_fused, thread_safe=False),  # as slerp
        interop=Interop(
            mergekit=MergekitMapping(exact_export(EXACT), exact=(EXACT,)),
            citation="Jang et al., *Model Stock: All we need is just a few fine-tuned models*, ECCV 2024, arXiv 2403.19522",
        ),
        agents=(2, None),
    ),
)
