"""RAM, RAM+ and RAM+s (paper equations 6, 7, 8): average where agents overlap, keep unique updates
whole, and (RAM+) rescale them by λ_t computed from the whole-model probe.

Sums over agents run in a fixed order (agent 0, 1, ...) so every device gives the same bits.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Callable

import numpy as np

from ..chunks import PATTERN_MAX_AGENTS, Chunk
from ..lazy import torch
from .base import MergeMethod, Param

if TYPE_CHECKING:
    from ..probe import ProbeReport


# --- RAM, RAM+, RAM+s (paper equations 6, 7, 8) -------------------------------------------------

def ram_plus_lambdas(params: dict, probe: "ProbeReport") -> list[float]:
    """λ_t = 1 + r · clip(ρ_t, 0, α), with clip(∞) = α (equation 6)."""
    return [1.0 + params["r"] * min(max(a.rho, 0.0), params["alpha"]) for a in probe.agents]


def ram_plus_soft_lambdas(params: dict, probe: "ProbeReport") -> list[float]:
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
        if scaled is not None:
            scaled += active * torch.tensor(lambdas[t], dtype=chunk.base.dtype, device=chunk.base.device)
    unique_value = scaled if scaled is not None else total
    mean = total / counts.clamp(min=1).to(chunk.base.dtype)
    return torch.where(counts == 1, unique_value, torch.where(counts >= 2, mean, 0.0))


R = Param("r", float, 0.1, "rescaling strength r of unique updates", 0.0, 10.0, paper_range="0.1; ablation 0.0-0.2 (Table 2)")
ALPHA = Param("alpha", float, 2.0, "upper clip α of the overlap-unique ratio ρ", 0.0, 1000.0,
              paper_range="2.0 (paper setting)")

class SurvivalObserver:
    """Counts, per output dtype and agent, the unique elements whose written value differs from the
    unscaled RAM value: the exact rounding survival of this merge's λ (see ``probe.rescale_changes``)."""

    def __init__(self) -> None:
        self._changes: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()

    def observe(self, chunk: Chunk, context: object, merged: torch.Tensor) -> None:
        from ..formats.base import dtype_name
        from ..probe import rescale_changes

        self.add_counts(dtype_name(merged.dtype), rescale_changes(chunk, merged).cpu().numpy())

    def add_counts(self, dtype: str, changed: np.ndarray) -> None:
        """Add one chunk's ``[2, N]`` int64 counts (changed, unique per agent; also what the fused kernel
        returns) for the output dtype named ``dtype``."""
        with self._lock:
            previous = self._changes.get(dtype)
            self._changes[dtype] = changed if previous is None else previous + changed

    def finish(self) -> dict[str, list[float | None]]:
        """Per output dtype name: each agent's share of unique elements the rescale changed (None: none)."""
        return {d: [c / u if u else None for c, u in zip(*counts.tolist())] for d, counts in self._changes.items()}


def _ram_family(name: str, label: str, summary: str, params: tuple[Param, ...],
                lambdas: "Callable[[dict, ProbeReport], list[float]] | None") -> MergeMethod:
    """RAM (no λ) or a rescaling variant whose λ is declared once, by ``lambdas``."""
    if lambdas is None:
        return MergeMethod(name, label, summary, params, lambda chunk, ctx: selective_merge(chunk, None),
                           thread_safe=True, fused="ram")
    return MergeMethod(
        name, label, summary, params,
        merge=selective_merge,
        prepare=lambda params, probe, collected: lambdas(params, probe),
        needs_probe=lambda params: True,
        lambdas=lambdas,
        observer=lambda params, plan: SurvivalObserver(),
        thread_safe=True,
        fused="ram-plus",
    )


METHODS = (
    _ram_family("ram", "RAM", "Average where agents overlap, keep unique updates whole (λ = 1).", (), None),
    _ram_family("ram-plus", "RAM+", "RAM with unique updates rescaled by λ_t = 1 + r·clip(ρ_t, 0, α).",
                (R, ALPHA), ram_plus_lambdas),
    _ram_family("ram-plus-soft", "RAM+s",
                "RAM with soft-saturated rescaling λ_t = 1 + r·ρ_t/(1+ρ_t) (paper appendix E).",
                (R,), ram_plus_soft_lambdas),
)
