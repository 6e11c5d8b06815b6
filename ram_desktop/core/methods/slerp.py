"""SLERP: spherical interpolation between the base and one agent (docs/methods.md, "SLERP"; mergekit ``slerp``).

Per tensor, with a = θ_base and b = θ_agent flattened (float32; float64 for float64 inputs):

    â = a / ‖a‖,  b̂ = b / ‖b‖   (a norm ≤ 1e-8 counts as 1),   d = clamp(Σ â·b̂, −1, 1),   Ω = acos d
    θ = (1 − t)·a + t·b                                     where |d| > 0.9995 (nearly collinear)
    θ = sin((1 − t)·Ω)/sin Ω · a + sin(t·Ω)/sin Ω · b       elsewhere

rounded to the compute dtype. ``t`` may be a gradient over the layers or filtered by tensor name (the
common ``self_attn`` / ``mlp`` recipes). The norms are computed as mergekit 0.1.5 computes them (the
norm of the norms of 2²⁰-element pieces), and so is the dot product (the sum of the pieces' sums), so
the result is mergekit's to the bit. Needs the whole tensor (its norms and angle): memory is bounded by
one tensor.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from ..engine import kernels
from ..engine.chunks import Chunk, StoredSlices, thread_workspace
from ..lazy import torch
from . import weights
from .base import Interop, MergeMethod, Streaming
from .mergekit_map import MergekitExact, MergekitMapping, exact_export
from .weights import WeightsContext

if TYPE_CHECKING:
    from ..engine.kernels import KernelResult
    from ..engine.plan import MergePlan

PIECE = 1 << 20  # elements per piece of the norm and dot sums (mergekit's _CHUNK_ELEMENTS)
DOT_THRESHOLD = 0.9995
NORM_EPS = 1e-8

T = weights.shared_param(
    "t", 0.5, "interpolation position: 0 = the base, 1 = the agent (a gradient over layers or filters allowed)"
)
PARAMS = (T, weights.DTYPE)


def slerp(t: float, v0: torch.Tensor, v1: torch.Tensor) -> torch.Tensor:
    """Spherical interpolation of two flat tensors (computed in float32, or float64 for float64 inputs),
    returned in the inputs' dtype."""
    dtype = torch.float64 if v0.dtype == torch.float64 else torch.float32
    a, b = v0.reshape(1, -1), v1.reshape(1, -1)
    if not a.shape[1]:
        tt = torch.tensor([t], dtype=dtype, device=a.device).reshape(-1, 1)
        return ((1 - tt) * a + tt * b).reshape(v0.shape).to(v0.dtype)

    def dot_piece(s: int, norm_a: torch.Tensor, norm_b: torch.Tensor) -> torch.Tensor:
        x, y = a[:, s : s + PIECE].to(dtype), b[:, s : s + PIECE].to(dtype)
        return ((x / norm_a) * (y / norm_b)).sum(dim=1, keepdim=True)

    def piece_norm(row: torch.Tensor) -> Callable[[int], torch.Tensor]:
        return lambda s: torch.linalg.vector_norm(row[:, s : s + PIECE].to(dtype), dim=1, keepdim=True)

    coef_a, coef_b = coefficients(t, a.shape[1], dtype, piece_norm(a), piece_norm(b), dot_piece)
    result = torch.empty_like(a)
    for s in range(0, a.shape[1], PIECE):
        result[:, s : s + PIECE] = coef_a * a[:, s : s + PIECE].to(dtype) + coef_b * b[:, s : s + PIECE].to(dtype)
    return result.reshape(v0.shape)


def coefficients(
    t: float,
    n: int,
    dtype: torch.dtype,
    norm_a_of: Callable[[int], torch.Tensor],
    norm_b_of: Callable[[int], torch.Tensor],
    dot_piece: Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    """SLERP's two [1, 1] coefficients for two rows of ``n`` elements: the norms as the norm of the
    ``PIECE``-element pieces' norms (``norm_a_of(start)``, ``norm_b_of(start)``: each piece's 2-norm in ``dtype``,
    [1, 1]), the dot product as the sum of ``dot_piece(start, norm_a, norm_b)`` (each piece's
    Σ (a/‖a‖)·(b/‖b‖), [1, 1])."""
    pieces = range(0, n, PIECE)
    norm_a = torch.linalg.vector_norm(torch.stack([norm_a_of(s) for s in pieces]), dim=0)
    norm_b = torch.linalg.vector_norm(torch.stack([norm_b_of(s) for s in pieces]), dim=0)
    tt = torch.tensor([t], dtype=dtype, device=norm_a.device).reshape(-1, 1)  # where the norms are: the tensors'
    norm_a = torch.where(norm_a > NORM_EPS, norm_a, 1)
    norm_b = torch.where(norm_b > NORM_EPS, norm_b, 1)
    dot = torch.stack([dot_piece(s, norm_a, norm_b) for s in pieces]).sum(dim=0).clamp(-1, 1)
    linear = dot.abs() > DOT_THRESHOLD
    omega = torch.acos(torch.where(linear, 0, dot))
    sin_omega = torch.sin(omega)
    coef_a = torch.where(linear, 1 - tt, torch.sin((1 - tt) * omega) / sin_omega)
    coef_b = torch.where(linear, tt, torch.sin(tt * omega) / sin_omega)
    return coef_a, coef_b


def slerp_merge(chunk: Chunk, ctx: WeightsContext) -> torch.Tensor:
    base, agent = chunk.thetas(ctx.dtype(chunk))
    return slerp(float(ctx.shared("t", chunk)), base, agent)


def scaled_products(a: np.ndarray, b: np.ndarray, start: int, norm_a: float, norm_b: float, out: np.ndarray) -> None:
    """``out[i] = (a[start + i] / norm_a) · (b[start + i] / norm_b)`` in float32 (``slerp_kernel.scaled_product_kernel``)."""
    from . import slerp_kernel

    na, nb = np.float32(norm_a), np.float32(norm_b)
    kernels.split(
        out.size,
        lambda s, e: slerp_kernel.scaled_product_kernel(
            a[start + s : start + e], b[start + s : start + e], na, nb, out[s:e]
        ),
    )


def combine_pair(
    a: np.ndarray, b: np.ndarray, coef_a: float, coef_b: float, eps: float, out: np.ndarray
) -> tuple[bool, bool, int]:
    """``out = coef_a · a + coef_b · b`` in float32, rounded once to out's dtype; whether every b − a is finite,
    whether every value written is within out's dtype (checked block by block as written), and how many
    |b − a| > eps (float32)."""
    from . import slerp_kernel

    ca, cb, e = np.float32(coef_a), np.float32(coef_b), np.float32(eps)
    counts = kernels.split(
        a.size, lambda s, t: slerp_kernel.combine_pair_kernel(a[s:t], b[s:t], ca, cb, e, kernels.BLOCK, out[s:t])
    )
    return (
        sum(bad for bad, _, _ in counts) == 0,
        sum(over for _, over, _ in counts) == 0,
        sum(updated for _, _, updated in counts),
    )


def slerp_fused(slices: StoredSlices, ctx: WeightsContext, counts: bool, observe: bool) -> KernelResult | None:
    """``slerp_merge`` of one whole tensor from its stored slices at compute dtype float32, the same bits: the
    pieces' norms read from the stored bits in torch's order (``kernel_code.stored_norm``; widened and normed by
    torch where that emulation is not exact here), the sums torch's way (``kernels.TorchSum``; by torch where that
    emulation is not exact here), the normalised products and the final
    combination (rounded once to the output dtype) by the fused kernels, so no float32 copy of either tensor is
    made. None where the kernels do not cover the slices (other compute dtypes, mixed stored dtypes)."""

    job = slices.job
    if ctx.dtype_of([slices.base, *slices.agents]) != torch.float32 or job.numel == 0:
        return None
    m = kernels.float32_operands(slices.base, slices.agents, job.out_name)
    if m is None:
        return None
    n = job.numel
    # a's and b's widened piece (where torch forms the norms), the products: this thread's buffers, reused
    buffers = thread_workspace().get("slerp_pieces", (3, min(PIECE, n)), torch.float32, torch.device("cpu")).numpy()

    def widened_norm(bits: np.ndarray, out: np.ndarray) -> Callable[[int], torch.Tensor]:
        def norm(s: int) -> torch.Tensor:
            kernels.widen_into(bits, s, out[: min(PIECE, n - s)])
            return torch.linalg.vector_norm(
                torch.from_numpy(out[: min(PIECE, n - s)]).reshape(1, -1), dim=1, keepdim=True
            )

        return norm

    if n % PIECE != 1 and kernels.torch_norm_exact():  # torch's norm of a one-element piece is not its kernel's
        # both rows' piece norms from the stored bits, a row a thread, no widened copy
        norms = kernels.split_tasks([partial(_piece_norms, bits) for bits in (m.base, m.agents[0])])
        norm_a_of, norm_b_of = norms[0].__getitem__, norms[1].__getitem__
    else:
        norm_a_of, norm_b_of = widened_norm(m.base, buffers[0]), widened_norm(m.agents[0], buffers[1])

    emulated_sum = kernels.TorchSum.exact()

    def dot_piece(s: int, norm_a: torch.Tensor, norm_b: torch.Tensor) -> torch.Tensor:
        length = min(PIECE, n - s)
        products = buffers[2, :length]
        if not emulated_sum or length < 8:
            scaled_products(m.base, m.agents[0], s, float(norm_a), float(norm_b), products)
            return torch.from_numpy(products).reshape(1, -1).sum(dim=1, keepdim=True)
        return torch.tensor([[_summed_products(m.base, m.agents[0], s, norm_a, norm_b, products)]], dtype=torch.float32)

    t = float(ctx.shared_at("t", slices.index, job.name))
    coef_a, coef_b = coefficients(t, n, torch.float32, norm_a_of, norm_b_of, dot_piece)
    finite, in_range, updated = combine_pair(m.base, m.agents[0], float(coef_a), float(coef_b), slices.eps, m.out)
    hist = np.array([n - updated, updated], np.int64) if counts else None  # the update pattern: 0 or 1
    return kernels.KernelResult(m.result, finite, hist=hist, in_range=in_range)


SUM_BLOCK = 1 << 16  # products formed and summed a block at a time, in cache


def _summed_products(
    a: np.ndarray, b: np.ndarray, start: int, norm_a: torch.Tensor, norm_b: torch.Tensor, products: np.ndarray
) -> float:
    """torch's float32 sum of the normalised products of the piece at ``start`` (``products.size`` elements,
    ``products`` its buffer) without torch: each part torch's threads sum apart (``kernels.TorchSum.bounds``) formed
    and fed on a kernel thread of its own, so no torch thread pool wakes (its idle threads spinning beside the
    kernels' cost more than the sum)."""
    from . import slerp_kernel

    summed = kernels.TorchSum(products.size)
    na, nb = np.float32(float(norm_a)), np.float32(float(norm_b))

    def part(k: int) -> None:
        lo, hi = summed.bounds[k]
        for at in range(lo, hi, SUM_BLOCK):
            stop = min(hi, at + SUM_BLOCK)
            slerp_kernel.scaled_product_kernel(
                a[start + at : start + stop], b[start + at : start + stop], na, nb, products[at:stop]
            )
            summed.feed_part(k, products[at:stop])

    kernels.split_tasks([partial(part, k) for k in range(len(summed.bounds))])
    return summed.result()


def _piece_norms(bits: np.ndarray) -> dict[int, torch.Tensor]:
    """Each ``PIECE``-element piece's float32 2-norm as torch forms it ([1, 1]), by piece start, from the stored
    bits (``kernel_code.stored_norm``)."""
    from ..engine.kernel_code import stored_norm

    return {
        s: torch.tensor([[stored_norm(bits[s : s + PIECE])]], dtype=torch.float32) for s in range(0, bits.size, PIECE)
    }


def _check(params: dict) -> WeightsContext:
    return weights.prepare(params, PARAMS, required=("t",))


def _bind(ctx: WeightsContext, plan: MergePlan) -> WeightsContext:
    weights.check_count("slerp", plan.n_agents, 1, 1)
    return weights.bind(ctx, plan)


EXACT = MergekitExact("slerp", {"t": "t"}, {}, agents=(1, 1))

METHODS = (
    MergeMethod(
        "slerp",
        "SLERP",
        "Spherical interpolation between the base and one agent, position t per tensor.",
        PARAMS,
        slerp_merge,
        prepare=lambda params, probe, collected: _check(params),
        bind=_bind,
        short="SLERP",
        # the norms are whole-tensor sums whose rounding follows torch's intra-op threads: one tensor at a
        # time with torch's own threads, as mergekit computes them
        streaming=Streaming(whole_tensor=True, theta=True, fused=slerp_fused, thread_safe=False),
        interop=Interop(
            mergekit=MergekitMapping(exact_export(EXACT), exact=(EXACT,)),
            citation="Shoemake, *Animating rotation with quaternion curves*, SIGGRAPH 1985 (as applied to model weights "
            "by mergekit: Goddard et al., *Arcee's MergeKit*, arXiv 2403.13257)",
        ),
        agents=(1, 1),
    ),
)
