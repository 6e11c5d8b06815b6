"""RAM, RAM+ and RAM+s (paper equations 6, 7, 8): average where agents overlap, keep unique updates
whole, and (RAM+) rescale them by λ_t computed from the whole-model probe.

Sums over agents run in a fixed order (agent 0, 1, ...) so every device gives the same bits.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..engine import kernels
from ..engine.chunks import PATTERN_MAX_AGENTS, Chunk, StoredSlices
from ..lazy import torch
from . import ram_rescale
from .base import Analysis, FusedKernel, Interop, MergeMethod, Param, Streaming, Sweep, WouldKeep
from .mergekit_map import MergekitExport, MergekitImport, MergekitInput, MergekitMapping
from .ram_rescale import SurvivalObserver

if TYPE_CHECKING:
    from ..engine.kernels import KernelResult
    from ..engine.probe import ProbeReport


# --- RAM, RAM+, RAM+s (paper equations 6, 7, 8) -------------------------------------------------


def ram_plus_lambdas(params: dict, probe: ProbeReport) -> list[float]:
    """λ_t = 1 + r · clip(ρ_t, 0, α), with clip(∞) = α (equation 6)."""
    return [1.0 + params["r"] * min(max(a.rho, 0.0), params["alpha"]) for a in probe.agents]


def ram_plus_soft_lambdas(params: dict, probe: ProbeReport) -> list[float]:
    """λ_t = 1 + r · ρ_t / (1 + ρ_t) = 1 + r · shared_t / updated_t (equation 8); 1 when nothing is updated."""
    return [1.0 + params["r"] * (a.shared / a.updated) if a.updated else 1.0 for a in probe.agents]


def selective_merge(chunk: Chunk, lambdas: list[float] | None) -> torch.Tensor:
    """Equation 7: 0 where no agent updates, λ_t·τ_t where only agent t does, the mean of the
    active agents' τ where two or more do.

    One kernel for every case: total = Σ_t [m_t]·τ_t (agents in order 0..N−1), then
    total · A[p] / B[p] with p the update pattern, A[p] = λ_t for the one-agent pattern 2^t (else 1)
    and B[p] = max(1, popcount p). Multiplying or dividing by 1 is exact, so this is bit-identical to
    λ_t·τ_t, total / c and 0 computed separately.
    """
    n = chunk.n_agents
    if n > PATTERN_MAX_AGENTS:
        return _selective_merge_masks(chunk, lambdas)
    dtype, device = chunk.base.dtype, chunk.base.device
    total = chunk.masked_sum  # Σ_t [m_t]·τ_t (shared with the survival observer; never modified here)
    if n == 1 and lambdas is None:
        return total
    size = (chunk.base.numel(),)
    out = chunk.scratch("merged_tau", size, dtype)
    if lambdas is not None:
        mul = _unique_scales(n, tuple(lambdas), dtype, device)
        torch.mul(total, torch.index_select(mul, 0, chunk.pattern, out=chunk.scratch("factor", size, dtype)), out=out)
        if n == 1:
            return out
        numerator = out
    else:
        numerator = total
    # B[p] = max(1, popcount p) is Σ_t m_t clamped at 1: the same small integers as a table lookup, summed
    # from the 0/1 mask values with vectorised adds (cheaper than a second lookup)
    m = chunk.mask_values
    count = torch.add(m[0], m[1], out=chunk.scratch("count", size, dtype))
    for t in range(2, n):
        count.add_(m[t])
    return torch.div(numerator, count.clamp_min_(1.0), out=out)


_SCALES: dict = {}


def _unique_scales(n: int, lambdas: tuple[float, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Lookup table over the 2^n update patterns: λ_t for the one-agent pattern 2^t, 1 for every other."""
    key = (n, lambdas, dtype, str(device))
    if key not in _SCALES:
        if len(_SCALES) > 64:
            _SCALES.clear()
        mul = torch.ones(1 << n, dtype=dtype)
        for t in range(n):
            mul[1 << t] = torch.tensor(lambdas[t], dtype=dtype)
        _SCALES[key] = mul.to(device)
    return _SCALES[key]


def _selective_merge_masks(chunk: Chunk, lambdas: list[float] | None) -> torch.Tensor:
    """The same result for many agents, from the masks and counts directly."""
    masks, counts = chunk.masks, chunk.counts
    total = torch.zeros_like(chunk.base)
    scaled = torch.zeros_like(chunk.base) if lambdas is not None else None
    for t in range(chunk.n_agents):
        active = torch.where(masks[t], chunk.taus[t], 0.0)
        total += active
        if scaled is not None and lambdas is not None:  # both or neither
            scaled += active * torch.tensor(lambdas[t], dtype=chunk.base.dtype, device=chunk.base.device)
    unique_value = scaled if scaled is not None else total
    mean = total / counts.clamp(min=1).to(chunk.base.dtype)
    return torch.where(counts == 1, unique_value, torch.where(counts >= 2, mean, 0.0))


R = Param(
    "r", float, 0.1, "rescaling strength r of unique updates", 0.0, 10.0, paper_range="0.1; ablation 0.0-0.2 (Table 2)"
)
ALPHA = Param(
    "alpha", float, 2.0, "upper clip α of the overlap-unique ratio ρ", 0.0, 1000.0, paper_range="2.0 (paper setting)"
)


@functools.lru_cache(maxsize=64)
def _agent_lambdas(lambdas: tuple[float, ...] | None, n_agents: int, cdt: type) -> np.ndarray:
    """λ_t per agent rounded to the compute dtype (as the torch path's factor table); ones for RAM."""

    return np.array(lambdas if lambdas is not None else [1.0] * n_agents, cdt)


def selective_merge_into(
    base_raw: torch.Tensor | np.ndarray,
    agent_raws: list[torch.Tensor] | list[np.ndarray],
    eps: float,
    compute_dtype: torch.dtype | str,
    out_dtype: torch.dtype | str,
    lambdas: list[float] | None,
    want_hist: bool,
    want_survival: bool,
) -> KernelResult | None:
    """θ = base + RAM / RAM+ merged task vector of one slice, in ``out_dtype`` (numpy bits for numpy slices,
    a tensor for tensors), and whether every τ is finite; with ``want_hist`` also the pattern histogram; with
    ``want_survival`` (and λ) the ``[2, N]`` int64 rescale survival counts of ``ram_rescale.rescale_changes``
    (``observed``, for the ``SurvivalObserver``). None when the kernels do not cover the slice."""
    from . import ram_kernel

    m = kernels.merge_operands(base_raw, agent_raws, compute_dtype, out_dtype)
    if m is None:
        return None
    base, agents, cdt = m.base, m.agents, m.cdt
    n_agents = len(agents)
    lam = _agent_lambdas(tuple(lambdas) if lambdas is not None else None, n_agents, cdt)
    hist = np.zeros((4, 1 << n_agents) if want_hist else (1, 1), np.int64)
    count_survival = want_survival and lambdas is not None
    surv = np.zeros((2, n_agents), np.int64)
    _, _, pattern = kernels.BUFFERS.get(cdt)
    bad, over = ram_kernel.merge_kernel(
        base, agents, cdt(eps), cdt(1), lam, lambdas is not None, m.out, hist, want_hist, surv, count_survival, pattern
    )
    return kernels.KernelResult(
        m.result,
        bad == 0,
        hist.sum(0) if want_hist else None,
        observed=surv if count_survival else None,
        in_range=over == 0,
    )


def selective_merge_group(
    base_raw: torch.Tensor | np.ndarray,
    agent_raws: list[torch.Tensor] | list[np.ndarray],
    eps: float,
    compute_dtype: torch.dtype | str,
    out_dtype: torch.dtype | str,
    lambdas: list[list[float] | None],
    want_hist: bool,
    want_survival: list[bool],
) -> list[KernelResult] | None:
    """``selective_merge_into`` for several variants of one slice (λ per variant, None for RAM) in one pass over
    the stored bits: each variant's result as that function gives it, the histogram on the first. None when the
    kernels do not cover the slice."""
    from . import ram_kernel

    found = [kernels.merge_operands(base_raw, agent_raws, compute_dtype, out_dtype) for _ in lambdas]
    operands = [o for o in found if o is not None]  # an output slice each, the same inputs
    if len(operands) < len(found):
        return None
    m = operands[0]
    n_agents = len(m.agents)
    lams = np.stack([_agent_lambdas(tuple(lam) if lam is not None else None, n_agents, m.cdt) for lam in lambdas])
    use_lam = np.array([lam is not None for lam in lambdas])
    count_survival = np.array([want and lam is not None for want, lam in zip(want_survival, lambdas)])
    hist = np.zeros((4, 1 << n_agents) if want_hist else (1, 1), np.int64)
    surv = np.zeros((len(lambdas), 2, n_agents), np.int64)
    xs, sums, pattern = kernels.BUFFERS.get(m.cdt)
    counts, moved = kernels.BUFFERS.pair(np.int32)
    outs = tuple(o.out for o in operands)
    bad, over = ram_kernel.merge_group_kernel(
        m.base, m.agents, m.cdt(eps), m.cdt(1), lams, use_lam, outs, hist, want_hist, surv, count_survival,
        xs, sums, pattern, counts, moved,
    )  # fmt: skip
    return [
        kernels.KernelResult(
            o.result,
            bad == 0,
            hist.sum(0) if want_hist and k == 0 else None,
            observed=surv[k] if count_survival[k] else None,
            in_range=over[k] == 0,
        )
        for k, o in enumerate(operands)
    ]


@dataclass(frozen=True)
class _Fused:
    """Equation 7 through ``selective_merge_into`` (the pattern histogram and, with λ, the ``SurvivalObserver``'s
    counts in the same pass); ``lambdas_of(context)``: λ per agent, None for RAM (λ = 1)."""

    lambdas_of: Callable[[Any], list[float] | None]

    def __call__(self, slices: StoredSlices, context: Any, counts: bool, observe: bool) -> KernelResult | None:
        job = slices.job
        return selective_merge_into(
            slices.base,
            slices.agents,
            slices.eps,
            job.compute_name,
            job.out_name,
            self.lambdas_of(context),
            counts,
            observe,
        )


def _fused_group(
    slices: StoredSlices, members: list[tuple[FusedKernel, Any]], counts: bool, observe: list[bool]
) -> list[KernelResult] | None:
    """The RAM family's ``FusedGroupKernel``: its variants of a chunk through ``selective_merge_group``."""
    lambdas = []
    for kernel, context in members:
        assert isinstance(kernel, _Fused)  # the family's methods share this group kernel
        lambdas.append(kernel.lambdas_of(context))
    job = slices.job
    return selective_merge_group(
        slices.base, slices.agents, slices.eps, job.compute_name, job.out_name, lambdas, counts, observe
    )


def ram_shares(report: ProbeReport) -> list[float]:
    """RAM's kept update mass per agent: 1 where the agent alone updates, 1/c where c agents do."""
    n = len(report.agents)
    return [sum(a.overlap[k] / (k + 1) for k in range(n)) for a in report.agents]


def _rescaled_shares(lambdas: Callable[[dict, ProbeReport], list[float]]) -> WouldKeep:
    """RAM with λ_t instead of 1 where agent t alone updates: exact."""

    def shares(report: ProbeReport, params: dict) -> list[float]:
        return [
            r + (lam - 1.0) * a.unique for r, lam, a in zip(ram_shares(report), lambdas(params, report), report.agents)
        ]

    return WouldKeep(shares)


# --- mergekit: ram and ramplus_tl (mergekit 0.1.5 merge_methods/ram.py) ---------------------------------------


def _from_ram(given: MergekitInput) -> tuple[str, dict]:
    return "ram", {}


def _from_ramplus_tl(given: MergekitInput) -> tuple[str, dict]:
    shared = given.shared
    given.warnings.append(
        "ramplus_tl: mergekit computes ρ per tensor (shared / unique within each tensor) and "
        "defaults α to 0.2; RAM Desktop's ram-plus computes ρ over the whole model, as the paper "
        f"defines it (paper default α = 2.0); using r = {shared['r']:g}, α = {shared['alpha']:g}"
    )
    return "ram-plus", {"r": shared["r"], "alpha": shared["alpha"]}


def _to_ram(params: dict, eps: float) -> MergekitExport:
    return MergekitExport(
        "ram",
        {"epsilon": eps},
        notes=[
            (
                "ram: same per-element rule. With two agents the output is bit-identical; with more, mergekit sums τ_t/c_i "
                "where RAM Desktop divides the sum by c_i, which can differ in the last bit"
            )
        ],
    )


_RHO_NOTE = (
    "ramplus_tl computes ρ per tensor (shared / unique within each tensor; a tensor without unique "
    "elements gets λ = 1 + r·α); RAM Desktop computes ρ once over the whole model. Results differ"
)


def _to_ramplus_tl(params: dict, eps: float) -> MergekitExport:
    return MergekitExport("ramplus_tl", {"r": params["r"], "alpha": params["alpha"], "epsilon": eps}, notes=[_RHO_NOTE])


def _soft_to_ramplus_tl(params: dict, eps: float) -> MergekitExport:
    return MergekitExport(
        "ramplus_tl",
        {"r": params["r"], "alpha": 1.0, "epsilon": eps},
        notes=[
            _RHO_NOTE,
            (
                "ram-plus-soft (λ = 1 + r·ρ/(1+ρ)) has no mergekit equivalent; ramplus_tl with α = 1 is the "
                "closest clipped form"
            ),
        ],
    )


RAM_PAPER = "*Behavior Knowledge Merge in Reinforced Agentic Models*, arXiv 2601.13572"
RAM_MERGEKIT = MergekitMapping(_to_ram, (MergekitImport("ram", {"epsilon": 1e-5}, {}, _from_ram),))
RAM_PLUS_MERGEKIT = MergekitMapping(
    _to_ramplus_tl, (MergekitImport("ramplus_tl", {"r": 0.1, "alpha": 0.2, "epsilon": 1e-5}, {}, _from_ramplus_tl),)
)


def _ram_family(
    name: str,
    label: str,
    summary: str,
    params: tuple[Param, ...],
    lambdas: Callable[[dict, ProbeReport], list[float]] | None,
    short: str,
    mergekit: MergekitMapping,
    sweep: Sweep | None,
    searched: bool = False,
    reference: bool = False,
) -> MergeMethod:
    """RAM (no λ) or a rescaling variant whose λ is declared once, by ``lambdas``; ``searched`` and ``reference``:
    its ``Interop.searched_by_default`` and ``search_reference``."""
    interop = Interop(
        mergekit=mergekit, sweep=sweep, citation=RAM_PAPER, searched_by_default=searched, search_reference=reference
    )
    if lambdas is None:
        return MergeMethod(
            name,
            label,
            summary,
            params,
            lambda chunk, ctx: selective_merge(chunk, None),
            short=short,
            streaming=Streaming(thread_safe=True, fused=_Fused(lambda ctx: None), fused_group=_fused_group),
            analysis=Analysis(would_keep=WouldKeep(lambda report, p: ram_shares(report)), selective=True),
            interop=interop,
        )

    def prepare(params: dict, probe: ProbeReport | None, collected: object) -> list[float]:
        assert probe is not None  # needs_probe: the probe ran first
        return lambdas(params, probe)

    return MergeMethod(
        name,
        label,
        summary,
        params,
        merge=selective_merge,
        prepare=prepare,
        short=short,
        streaming=Streaming(
            thread_safe=True, fused=_Fused(lambda ctx: [float(x) for x in ctx]), fused_group=_fused_group
        ),
        analysis=Analysis(
            needs_probe=lambda params: True,
            lambdas=lambdas,
            observer=lambda params, plan: SurvivalObserver(),
            observed_as=ram_rescale.REPORT_KEY,
            probe_statistic=ram_rescale.LAMBDA_STAR,
            would_keep=_rescaled_shares(lambdas),
            selective=True,
        ),
        interop=interop,
    )


METHODS = (
    _ram_family(
        "ram",
        "RAM",
        "Average where agents overlap, keep unique updates whole (λ = 1).",
        (),
        None,
        "RAM",
        RAM_MERGEKIT,
        None,
        searched=True,
    ),
    _ram_family(
        "ram-plus",
        "RAM+",
        "RAM with unique updates rescaled by λ_t = 1 + r·clip(ρ_t, 0, α).",
        (R, ALPHA),
        ram_plus_lambdas,
        "RAM+",
        RAM_PLUS_MERGEKIT,
        Sweep("r", "0, 0.05, 0.1, 0.15, 0.2"),  # the paper's Table 2 r sweep
        searched=True,
        reference=True,
    ),
    _ram_family(
        "ram-plus-soft",
        "RAM+s",
        "RAM with soft-saturated rescaling λ_t = 1 + r·ρ_t/(1+ρ_t) (paper appendix E).",
        (R,),
        ram_plus_soft_lambdas,
        "RAM+s",
        MergekitMapping(_soft_to_ramplus_tl),
        Sweep("r", "0.1"),
    ),
)
