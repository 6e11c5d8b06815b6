"""mergekit's generalized task arithmetic with per-agent parameters (docs/methods.md, "Weighted task arithmetic
family"; mergekit ``task_arithmetic``, ``ties``, ``dare_linear``, ``dare_ties``, ``breadcrumbs``,
``breadcrumbs_ties``, ``della``, ``della_linear``).

Per tensor, in the compute dtype, with δ_t = θ_t − θ_base:

1. sparsify each δ_t with its own density k_t (and γ_t, ε_t):
   * ``magnitude`` (TIES): keep the max(1, int(k·n)) largest |δ| (as ``torch.argsort`` orders them);
   * ``magnitude_outliers`` (breadcrumbs): drop the int(γ·n) largest and then the smallest, keep int(k·n);
   * ``random`` (DARE): keep each element with probability k;
   * ``della_magprune`` (DELLA): per row, keep with probability k − ε + 2ε·r, r the element's magnitude rank
     scaled to [0, 1];
   with ``rescale`` the kept values are scaled so that the L1 norm of δ_t is unchanged;
2. weight: δ_t ← w_t·δ_t;
3. with a sign consensus (the ``-ties`` methods, della): keep only the δ_t whose sign equals the sign of
   Σ_t δ_t (≥ 0 counts as +), Σ = Σ_t kept δ_t, divisor = Σ_t w_t over the kept ones (0 → 1); without one,
   Σ = Σ_t δ_t, divisor = Σ_t w_t (|·| < 1e-8 → 1);
4. ``normalize``: Σ ← Σ / divisor; then Σ ← λ·Σ (λ ≠ 1); θ = θ_base + Σ, rounded to the compute dtype.

The deterministic ones (task_arithmetic, ties, breadcrumbs, breadcrumbs_ties) are mergekit 0.1.5's operations
in its order, so its bits. The random ones (DARE, DELLA) draw each element's keep decision from the seeded
counter-based hash of the ``dare`` methods (u < ⌊q·2³²⌋ with q the keep probability): deterministic for a
seed, the asked share kept in expectation, and not mergekit's ``torch.bernoulli`` draws. Sparsification needs
the whole tensor (its ranks and L1 norm). On the CPU ``gta_streamed`` keeps the masks as bits and combines block
by block: DELLA's per-row ranks and its L1 sums (``kernels.TorchSum``) stream too, so its memory is a few blocks
and the output; the magnitude trims rank one agent's whole |δ| with torch's sort at a time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..engine import kernels
from ..engine.chunks import Chunk, StoredSlices, as_tensor, thread_workspace
from ..errors import InputError
from ..lazy import torch
from . import weights
from .base import RANK_TIES_ON_GPU, FusedKernel, Interop, MergeMethod, Param, Streaming
from .baselines import dare_keys, dare_uniform
from .weights import WeightsContext

if TYPE_CHECKING:
    from ..engine.kernels import KernelResult
    from .mergekit_map import MergekitMapping

RESCALE_EPS = 1e-7
DELLA_BLOCK = 1 << 20  # elements ranked and drawn at a time (whole rows): bounds DELLA's int64 temporaries
STREAM_BLOCK = 1 << 22  # elements per block of the streamed path (gta_streamed): several kernels.split parts
TWO_32 = 4294967296.0


@dataclass(frozen=True)
class Family:
    """One member: mergekit's name, its sparsification and consensus, and its defaults."""

    theirs: str
    sparsify: str | None  # None, "magnitude", "magnitude_outliers", "random", "della_magprune"
    consensus: bool
    normalize: bool
    rescale: bool


def rescaled_masked(tensor: torch.Tensor, mask: torch.Tensor, rescale: bool) -> torch.Tensor:
    masked = tensor * mask
    if not rescale:
        return masked
    before = tensor.abs().sum()
    after = masked.abs().sum()
    if before < RESCALE_EPS or after < RESCALE_EPS:
        return masked
    return masked * (before / after)


def magnitude(tensor: torch.Tensor, density: float, rescale: bool) -> torch.Tensor:
    if density >= 1:
        return tensor
    if density <= 0 or tensor.numel() == 0:
        return torch.zeros_like(tensor)
    k = max(1, int(density * tensor.numel()))
    mask = torch.zeros(tensor.numel(), dtype=tensor.dtype, device=tensor.device)
    w = tensor.abs().reshape(-1)
    if w.device.type == "cpu":
        w = w.float()
    mask[torch.argsort(w, descending=True)[:k]] = 1
    return rescaled_masked(tensor, mask.reshape_as(tensor), rescale)


def magnitude_outliers(tensor: torch.Tensor, density: float, gamma: float, rescale: bool) -> torch.Tensor:
    if density >= 1:
        return tensor
    n = tensor.numel()
    target = int(density * n)
    n_top = int(gamma * n)
    n_bot = max(0, n - target - n_top)
    w = tensor.abs().reshape(-1)
    if w.device.type == "cpu":
        w = w.float()
    order = torch.sort(w, descending=False).indices
    mask = torch.zeros(n, dtype=tensor.dtype, device=tensor.device)
    mask[order[n_bot : n_bot + target]] = 1
    return rescaled_masked(tensor, mask.reshape_as(tensor), rescale)


def _keep(
    probability: torch.Tensor | float,
    seed: int,
    agent: int,
    name: str,
    n: int,
    device: torch.device,
    offset: int = 0,
) -> torch.Tensor:
    """Each flat position kept with ``probability`` (a number or one per element): u < ⌊q·2³²⌋, u the seeded
    hash of (seed, agent, tensor, position) that DARE uses."""
    u = dare_uniform(seed, agent, name, offset, n, device)
    if isinstance(probability, float):
        return u < int(probability * TWO_32)
    return u < torch.floor(probability.reshape(-1).to(torch.float64) * TWO_32).to(torch.int64)


def random_drop(tensor: torch.Tensor, density: float, rescale: bool, seed: int, agent: int, name: str) -> torch.Tensor:
    if density >= 1:
        return tensor
    work = tensor.dtype if tensor.device.type != "cpu" or tensor.dtype == torch.bfloat16 else torch.float32
    mask = _keep(float(density), seed, agent, name, tensor.numel(), tensor.device).to(work).reshape(tensor.shape)
    return rescaled_masked(tensor.to(work), mask, rescale).to(tensor.dtype)


def della_magprune(
    tensor: torch.Tensor, density: float, epsilon: float, rescale: bool, seed: int, agent: int, name: str
) -> torch.Tensor:
    """DELLA's MagPrune of one task vector. May write its result over ``tensor`` (the fused CPU path does)."""
    if density >= 1:
        return tensor
    if density <= 0:
        return torch.zeros_like(tensor)
    if density + epsilon >= 1 or density - epsilon <= 0:
        raise InputError(
            f"della: epsilon {epsilon:g} must keep density ± epsilon inside (0, 1) (density {density:g}, "
            f"tensor {name!r})"
        )
    shape = tensor.shape
    work = tensor.dtype if tensor.device.type != "cpu" or tensor.dtype == torch.bfloat16 else torch.float32
    rows = tensor.unsqueeze(0) if tensor.dim() < 2 else tensor
    width = max(rows.shape[1], 1)
    if _della_fused(rows, width):
        return _della_fused_in_place(rows, density, epsilon, rescale, dare_keys(seed, agent, name)).reshape(shape)
    mask = torch.empty(rows.shape, dtype=work, device=tensor.device)
    step = max(1, DELLA_BLOCK // width)  # rows at a time: the ranks are per row, the draws per position
    for start in range(0, rows.shape[0], step):
        block = rows[start : start + step]
        order = torch.argsort(block.abs(), dim=1, descending=False, stable=True)
        ranks = order.argsort(dim=1).to(work) + 1
        low, high = ranks.min(dim=1, keepdim=True).values, ranks.max(dim=1, keepdim=True).values
        rank_norm = ((ranks - low) / (high - low)).clamp(0, 1)
        probs = (density - epsilon) + rank_norm * 2 * epsilon
        keep = _keep(probs, seed, agent, name, block.numel(), tensor.device, offset=start * width)
        mask[start : start + step] = keep.reshape(block.shape)
    return rescaled_masked(rows.to(work), mask, rescale).to(tensor.dtype).reshape(shape)


def _della_fused(rows: torch.Tensor, width: int) -> bool:
    """Whether DELLA's ranks and draws of ``rows`` run in the fused CPU kernel (``della_mask``, the same
    mask as the torch loop): float32 rows on the CPU, two or more per row, kernels on."""
    if rows.device.type != "cpu" or rows.dtype != torch.float32 or rows.dim() != 2 or width < 2:
        return False

    return rows.is_contiguous() and kernels.enabled_here(rows.numel()) and kernels.available()


def gta_combine(
    deltas: np.ndarray,
    weights: np.ndarray,
    base: np.ndarray,
    consensus: bool,
    normalize: bool,
    scale: float,
    out: np.ndarray,
) -> None:
    """The weighted task arithmetic family's combination of float32 ``deltas`` [N, n] into ``out`` = θ in
    float32 (``gta_kernel.gta_combine_kernel``); ``scale`` 1 is not applied."""
    from . import gta_kernel

    w, lam = weights.astype(np.float32), np.float32(scale)
    kernels.split(
        base.size,
        lambda s, e: gta_kernel.gta_combine_kernel(
            deltas[:, s:e], w, base[s:e], consensus, normalize, lam, scale != 1, out[s:e]
        ),
    )


def della_mask(rows: np.ndarray, c0: float, eps: float, keys: tuple[int, int], mask: np.ndarray, row0: int = 0) -> None:
    """DELLA's keep mask (1.0 / 0.0) of float32 ``rows`` [R, W ≥ 2] into ``mask`` (``gta_kernel.della_mask_kernel``):
    ``c0`` = density − ε and ``eps`` = ε, each rounded to float32 as torch rounds a scalar operand; ``rows`` are
    the tensor's rows from ``row0`` on (the draws are per position in the tensor)."""
    from . import gta_kernel

    n_rows, width = rows.shape
    bits = rows.view(np.uint32)
    c0_32, eps_32 = np.float32(c0), np.float32(eps)

    def run(first: int, stop: int) -> None:
        idx, key = np.empty(width, np.int64), np.empty(width, np.uint32)
        idx2, key2 = np.empty(width, np.int64), np.empty(width, np.uint32)
        gta_kernel.della_mask_kernel(
            bits[first:stop],
            row0 + first,
            c0_32,
            eps_32,
            keys[0],
            keys[1],
            mask[first:stop],
            idx,
            key,
            idx2,
            key2,
            np.empty(256, np.int64),
        )

    # rows at a time: ``kernels.split`` parts elements, so it is given the row count scaled to elements
    per_row = max(1, width)
    kernels.split(
        n_rows * per_row, lambda s, e: run(s // per_row, e // per_row) if e // per_row > s // per_row else None
    )


def _della_fused_in_place(
    rows: torch.Tensor, density: float, epsilon: float, rescale: bool, keys: tuple[int, int]
) -> torch.Tensor:
    """``della_magprune`` of float32 CPU ``rows`` written over ``rows``: the mask by ``della_mask``, then
    ``rescaled_masked``'s operations on the same values into reused buffers (the same bits, no new tensors)."""

    workspace = thread_workspace()
    mask = workspace.get("della_mask", tuple(rows.shape), torch.float32, rows.device)
    della_mask(rows.numpy(), density - epsilon, epsilon, keys, mask.numpy())
    magnitudes = workspace.get("della_abs", tuple(rows.shape), torch.float32, rows.device)
    before = torch.abs(rows, out=magnitudes).sum()
    masked = torch.mul(rows, mask, out=mask)
    if rescale:
        after = torch.abs(masked, out=magnitudes).sum()
        if not (before < RESCALE_EPS or after < RESCALE_EPS):
            return torch.mul(masked, before / after, out=rows)
    return rows.copy_(masked)


def gta_streamed(family: Family, slices: StoredSlices, ctx: WeightsContext) -> KernelResult | None:
    """A sparsifying member of the family (TIES's magnitude, breadcrumbs, DELLA) on one whole tensor from its
    stored slices, the same bits as ``gta_merge`` on the CPU without its float32 copies of every input and task
    vector: each agent's keep mask is found first and kept as bits with its rescale factor (``_kept``), then a
    sweep of row blocks forms each block's δ again from the stored bits, masks and rescales it, combines
    (``gta_combine``) and rounds into the output. DELLA's masks come block by block, so its working set is a few
    blocks; the magnitude trims still rank the whole |δ| with torch (mergekit's unstable ``argsort`` order at
    the cut), so theirs is |δ| and the sort's copies of one agent at a time. None where this does not apply
    (another compute dtype, a tensor of more than two dimensions or under 8 elements, a density that keeps
    nothing, DELLA where ``kernels.TorchSum`` is not torch's sum): ``gta_merge`` then runs."""
    job, index = slices.job, slices.index
    shape = ctx.shapes.get(index, (job.numel,))
    if len(shape) > 2 or job.numel < 8 or ctx.dtype_of([slices.base, *slices.agents]) != torch.float32:
        return None
    n_rows, width = (1, job.numel) if len(shape) < 2 else shape
    m = kernels.float32_operands(slices.base, slices.agents, job.out_name)
    if width < 2 or m is None:
        return None
    n, count = job.numel, len(m.agents)
    # rows per block, whole bytes of mask bits per block (a multiple of 8 elements)
    unit = 8 // math.gcd(width, 8)
    step = min(n_rows, -(-max(1, STREAM_BLOCK // width) // unit) * unit)
    kept = np.empty((count, -(-n // 8)), np.uint8)
    scales: list[np.float32 | None] = []
    for i in range(count):
        found = _kept(family, slices, ctx, m, i, (n_rows, width, step), kept[i])
        if not isinstance(found, tuple):
            return None if found is None else kernels.KernelResult(m.result, False)
        scales.append(found[0])
    params = ctx.params_at(index)
    w = np.array([float(ctx.agent_at("weight", index, job.name, count, i)) for i in range(count)], np.float32)
    lam = float(ctx.shared_at("lambda", index, job.name))
    workspace, cpu = thread_workspace(), torch.device("cpu")
    block = step * width
    deltas = workspace.get("gta_block_deltas", (count * block,), torch.float32, cpu).numpy()
    mask = workspace.get("gta_block_mask", (block,), torch.float32, cpu).numpy()
    base = workspace.get("gta_block_base", (block,), torch.float32, cpu).numpy()
    theta = workspace.get("gta_block_theta", (block,), torch.float32, cpu)
    out = as_tensor(m.out)
    for start in range(0, n_rows, step):
        lo, hi = start * width, min(n_rows, start + step) * width
        size = hi - lo
        block_deltas = deltas[: count * size].reshape(count, size)
        kernels.widen_into(m.base, lo, base[:size])
        if not kernels.offsets_into(m.base[lo:hi], tuple(a[lo:hi] for a in m.agents), block_deltas):
            return kernels.KernelResult(m.result, False)
        for i in range(count):
            mask[:size] = np.unpackbits(kept[i, lo // 8 : -(-hi // 8)], count=size)
            np.multiply(block_deltas[i], mask[:size], out=block_deltas[i])
            scale = scales[i]
            if scale is not None:
                np.multiply(block_deltas[i], scale, out=block_deltas[i])
        gta_combine(
            block_deltas, w, base[:size], family.consensus, bool(params["normalize"]), lam, theta[:size].numpy()
        )
        out[lo:hi].copy_(theta[:size])
    return kernels.KernelResult(m.result, True)


def _kept(
    family: Family,
    slices: StoredSlices,
    ctx: WeightsContext,
    m: kernels.MergeOperands,
    agent: int,
    blocks: tuple[int, int, int],
    kept: np.ndarray,
) -> tuple[np.float32 | None] | bool | None:  # (rescale factor,), False, None
    """Agent ``agent``'s keep mask as bits into ``kept`` and its rescale factor (None: none), as ``gta_merge``'s
    sparsification gives them; False where a τ is not finite, None where ``gta_streamed`` does not apply."""
    job, index = slices.job, slices.index
    n, count = job.numel, len(m.agents)
    n_rows, width, step = blocks
    params = ctx.params_at(index)
    density = float(ctx.agent_at("density", index, job.name, count, agent))
    rescale = bool(params["rescale"])
    if density >= 1:  # kept whole, not rescaled
        kept[:] = 0xFF
        return (None,)
    tiny = np.float32(RESCALE_EPS)
    cpu = torch.device("cpu")
    if family.sparsify == "della_magprune":
        epsilon = float(ctx.agent_at("epsilon", index, job.name, count, agent))
        if density <= 0 or density + epsilon >= 1 or density - epsilon <= 0 or not kernels.TorchSum.exact():
            return None  # nothing kept, or the torch path's error
        workspace = thread_workspace()
        delta = workspace.get("gta_block_delta", (step * width,), torch.float32, cpu).numpy()
        keep = workspace.get("gta_block_keep", (step * width,), torch.float32, cpu).numpy()
        keys = dare_keys(params["seed"], agent, job.name)
        before, after = kernels.TorchSum(n, absolute=True), kernels.TorchSum(n, absolute=True)
        for start in range(0, n_rows, step):
            lo, hi = start * width, min(n_rows, start + step) * width
            if not kernels.offsets_into(m.base[lo:hi], (m.agents[agent][lo:hi],), delta[: hi - lo].reshape(1, -1)):
                return False
            rows, block_keep = delta[: hi - lo].reshape(-1, width), keep[: hi - lo].reshape(-1, width)
            della_mask(rows, density - epsilon, epsilon, keys, block_keep, start)
            before.feed(delta[: hi - lo])
            after.feed(np.multiply(delta[: hi - lo], keep[: hi - lo], out=delta[: hi - lo]))
            kept[lo // 8 : -(-hi // 8)] = np.packbits(keep[: hi - lo] != 0)
        l1_before, l1_after = np.float32(before.result()), np.float32(after.result())
    else:
        # |δ| of the whole tensor, ranked by torch as ``magnitude`` / ``magnitude_outliers`` rank it
        if family.sparsify == "magnitude" and density <= 0:
            return None
        magnitudes = torch.empty(n, dtype=torch.float32)
        if not kernels.offsets_into(m.base, (m.agents[agent],), magnitudes.numpy().reshape(1, -1)):
            return False
        magnitudes.abs_()
        selected = torch.zeros(n, dtype=torch.bool)
        if family.sparsify == "magnitude":
            selected[torch.argsort(magnitudes, descending=True)[: max(1, int(density * n))]] = True
        else:
            gamma = float(ctx.agent_at("gamma", index, job.name, count, agent))
            target, n_top = int(density * n), int(gamma * n)
            n_bot = max(0, n - target - n_top)
            selected[torch.sort(magnitudes, descending=False).indices[n_bot : n_bot + target]] = True
        kept[:] = np.packbits(selected.numpy())
        if not rescale:
            return (None,)
        l1_before = np.float32(float(magnitudes.sum()))  # |δ·mask| = |δ|·mask: the same values torch sums
        l1_after = np.float32(float(magnitudes.mul_(selected).sum()))
    if not rescale or l1_before < tiny or l1_after < tiny:
        return (None,)
    return (np.float32(l1_before / l1_after),)


def fused_kernel(family: Family) -> FusedKernel | None:
    """The family's fused CPU merge of a whole tensor (``gta_streamed``) for its sparsifying members but DARE."""
    if family.sparsify not in ("magnitude", "magnitude_outliers", "della_magprune"):
        return None

    def fused(slices: StoredSlices, ctx: WeightsContext, counts: bool, observe: bool) -> KernelResult | None:
        return gta_streamed(family, slices, ctx)

    return fused


def _fused_combine(base: torch.Tensor, deltas: torch.Tensor) -> bool:
    """Whether the family's combination runs in the fused CPU kernel (``gta_combine``, the torch steps'
    bits): float32 on the CPU, contiguous, kernels on."""
    if (
        base.device.type != "cpu"
        or base.dtype != torch.float32
        or not (base.is_contiguous() and deltas.is_contiguous())
    ):
        return False

    return kernels.enabled_here(base.numel()) and kernels.available()


def consensus_mask(deltas: torch.Tensor, mask_dtype: torch.dtype, chunk: Chunk) -> torch.Tensor:
    """Where each δ_t's sign equals the sign of Σ_t δ_t (≥ 0 counts as +), in the chunk's scratch buffers."""
    shape = tuple(deltas.shape)
    sign = torch.sign(deltas, out=chunk.scratch("gta_sign", shape, deltas.dtype)).to(mask_dtype)
    majority = (deltas.sum(dim=0) >= 0).to(mask_dtype) * 2 - 1
    return torch.eq(sign, majority, out=chunk.scratch("gta_mask", shape, torch.bool))


def gta_merge(family: Family, chunk: Chunk, ctx: WeightsContext) -> torch.Tensor:
    shape = ctx.shape(chunk)
    thetas = [t.reshape(shape) for t in chunk.thetas(ctx.dtype(chunk))]
    base, entries = thetas[0], thetas[1:]
    params = ctx.params_of(chunk)
    deltas = chunk.scratch("gta_deltas", (len(entries), *base.shape), base.dtype)
    for i, entry in enumerate(entries):
        delta = torch.sub(entry, base, out=deltas[i])
        if family.sparsify is not None:
            density = float(ctx.agent("density", chunk, i))
            rescale = bool(params["rescale"])
            if family.sparsify == "magnitude":
                delta = magnitude(delta, density, rescale)
            elif family.sparsify == "magnitude_outliers":
                delta = magnitude_outliers(delta, density, float(ctx.agent("gamma", chunk, i)), rescale)
            elif family.sparsify == "random":
                delta = random_drop(delta, density, rescale, params["seed"], i, chunk.name)
            else:
                delta = della_magprune(
                    delta, density, float(ctx.agent("epsilon", chunk, i)), rescale, params["seed"], i, chunk.name
                )
        if delta.data_ptr() != deltas[i].data_ptr():
            deltas[i] = delta
    w = torch.tensor([float(v) for v in ctx.agents("weight", chunk)], dtype=deltas.dtype, device=deltas.device)
    lam = float(ctx.shared("lambda", chunk))
    if _fused_combine(base, deltas):
        theta = chunk.scratch("gta_theta", (base.numel(),), base.dtype)
        gta_combine(
            deltas.reshape(len(entries), -1).numpy(),
            w.numpy(),
            base.reshape(-1).numpy(),
            family.consensus,
            bool(params["normalize"]),
            lam,
            theta.numpy(),
        )
        return theta
    while deltas.dim() > w.dim():
        w.unsqueeze_(-1)
    deltas.mul_(w)
    if family.consensus:
        mask = consensus_mask(deltas, torch.int8 if params["int8_mask"] else base.dtype, chunk)
        # δ·mask and w·mask written over δ, which is not read again: the same products without two new stacks
        mixed = deltas.mul_(mask).sum(dim=0)
        divisor = torch.mul(w, mask, out=deltas).sum(dim=0)
        divisor[divisor == 0] = 1
    else:
        mixed = deltas.sum(dim=0)
        divisor = w.sum(dim=0)
        divisor[divisor.abs() < 1e-8] = 1
    if params["normalize"]:
        mixed /= divisor
    if lam != 1:
        mixed *= lam
    return (base + mixed).to(base.dtype).reshape(-1)


WEIGHT = weights.agent_param(
    "weight", 1.0, "weight w of each agent's task vector (a gradient over layers or filters allowed)"
)
DENSITY = weights.agent_param("density", 1.0, "share k of each agent's task vector kept", 0.0, 1.0)
GAMMA = weights.agent_param("gamma", 0.01, "breadcrumbs: share of the largest magnitudes removed as outliers", 0.0, 1.0)
EPSILON = weights.agent_param(
    "epsilon", 0.15, "DELLA: spread ε of the keep probability around k (by magnitude rank)", 0.0, 1.0
)
LAMBDA = weights.shared_param("lambda", 1.0, "scale λ of the merged task vector", -10.0, 10.0)
INT8_MASK = Param("int8_mask", bool, False, "compute the sign-consensus mask in int8 (same result, less memory)")
SEED = Param(
    "seed", int, 0, "seed of the random keep decisions (a hash of seed, agent, tensor and position)", 0, 2**64 - 1
)


def _params(family: Family) -> tuple[Param, ...]:
    out = [WEIGHT]
    if family.sparsify is not None:
        out.append(DENSITY)
    if family.sparsify == "magnitude_outliers":
        out.append(GAMMA)
    if family.sparsify == "della_magprune":
        out.append(EPSILON)
    out += [
        LAMBDA,
        Param("normalize", bool, family.normalize, "divide the merged task vector by the sum of the (kept) weights"),
        Param("rescale", bool, family.rescale, "rescale the kept values to the task vector's L1 norm"),
    ]
    if family.consensus:
        out.append(INT8_MASK)
    if family.sparsify in ("random", "della_magprune"):
        out.append(SEED)
    out.append(weights.DTYPE)
    return tuple(out)


RANKED = ("magnitude", "magnitude_outliers")  # sparsifications that keep elements by their rank in a whole tensor


def method(
    name: str,
    label: str,
    summary: str,
    family: Family,
    citation: str,
    short: str,
    mergekit: MergekitMapping | None = None,
) -> MergeMethod:
    params = _params(family)

    def merge(chunk: Chunk, ctx: Any) -> torch.Tensor:
        return gta_merge(family, chunk, ctx)

    return MergeMethod(
        name,
        label,
        summary,
        params,
        merge,
        prepare=lambda p, probe, collected: weights.prepare(p, params, required=("weight",)),
        bind=weights.bind,
        short=short,
        # sparsification reads whole-tensor sums and orders whose rounding follows torch's intra-op threads:
        # such tensors are merged one at a time with torch's own threads, as mergekit merges them
        streaming=Streaming(
            whole_tensor=True, theta=True, fused=fused_kernel(family), thread_safe=family.sparsify is None
        ),
        interop=Interop(mergekit=mergekit, citation=citation),
        gpu_tolerance=RANK_TIES_ON_GPU if family.sparsify in RANKED else 0.0,
    )
