"""RAM+'s rescale bookkeeping: how many of each agent's unique elements the λ rescale actually changes once rounded
to the output dtype (``merge-report.json``'s ``rescale_survival_share``), counted exactly in the merge pass, and
estimated for any λ from the Analyze probe's λ* histograms.

The engine knows none of this. In the merge pass, ``SurvivalObserver`` is the RAM+ family's ``Observer`` (it counts
merged chunks on the torch path with ``rescale_changes``) and a ``SliceObserver``, taking the counts the family's
fused kernel (``ram_kernel.count_moved``) makes in its merge pass and returns as ``KernelResult.observed``. In the
probe, ``LAMBDA_STAR`` is the family's ``ProbeStatistic``: per agent and output dtype, the histogram of λ*, the
smallest scale at which an agent's unique element rounds otherwise than unscaled (``lambda_star_keys`` on the
torch path, ``ram_rescale_kernel`` in the fused kernel); ``survival_histograms`` and ``survival_share`` read it
off a probe report. The probe file keeps it as ``has_survival`` and ``rescale_survival`` (docs/contracts.md).
"""

from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np

from ..engine.chunks import PATTERN_MAX_AGENTS, Chunk, StoredSlices
from ..engine.contracts import ProbeStatistic
from ..engine.probe import ProbeReport, flatnonzero, one_agent_patterns
from ..lazy import torch
from ..storage.formats.base import dtype_name, torch_dtype

SURVIVAL_DTYPES: dict[str, int] = {  # dtype name -> significand bits (incl. the implicit one)
    "bfloat16": 8,
    "float16": 11,
    "float32": 24,
}
SURVIVAL_STEP = 0.002  # resolution of the λ* histogram
SURVIVAL_BINS = 1000  # covers λ in [1, 3]; λ* beyond that lands in the last bin ("never")
NAME = "lambda-star"  # the statistic's name in ``ProbeReport.statistics``
REPORT_KEY = "rescale_survival_share"  # what a merge report states of it, and what ``SurvivalObserver`` counts


class SurvivalObserver:
    """Counts, per output dtype and agent, the unique elements whose written value differs from the
    unscaled RAM value: the exact rounding survival of this merge's λ (``rescale_changes``)."""

    def __init__(self) -> None:
        self._changes: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()

    def observe(self, chunk: Chunk, context: object, merged: torch.Tensor) -> None:
        self._add(dtype_name(merged.dtype), rescale_changes(chunk, merged).cpu().numpy())

    def observe_slices(self, slices: StoredSlices, observed: np.ndarray) -> None:
        """One chunk counted by the fused kernel as it merged it: its ``[2, N]`` int64 counts, as
        ``rescale_changes`` gives them, for the job's output dtype."""
        self._add(slices.job.out_name, observed)

    def _add(self, dtype: str, changed: np.ndarray) -> None:
        with self._lock:
            previous = self._changes.get(dtype)
            self._changes[dtype] = changed if previous is None else previous + changed

    def finish(self) -> dict[str, list[float | None]]:
        """Per output dtype name: each agent's share of unique elements the rescale changed (None: none)."""
        return {d: [c / u if u else None for c, u in zip(*counts.tolist())] for d, counts in self._changes.items()}


def rescale_changes(chunk: Chunk, merged: torch.Tensor) -> torch.Tensor:
    """Exact rounding survival of one merged chunk: ``[2, N]`` int64, row 0 the number of each agent's
    unique elements whose merged (rescaled) value differs from the unscaled RAM value round(x + τ)
    in the output dtype of ``merged``, row 1 the number of its unique elements.

    ``merged`` is θ as written (base + λ_t·τ_t rounded once); the RAM value is rounded the same way
    (float32 sum, one rounding on store), so this counts exactly what the RAM+ rescale changed.
    With the update pattern and ``chunk.masked_sum`` (Σ_t [m_t]·τ_t, which is τ_t where only agent t
    updates) this is a few full-width operations and one bincount of pattern + 2^N·[changed]; the
    elements of other patterns land in bins that are not read.
    """
    n = chunk.n_agents
    if n > PATTERN_MAX_AGENTS:
        return _rescale_changes_gather(chunk, merged)
    size = tuple(merged.shape)
    ram = torch.add(chunk.base, chunk.masked_sum, out=chunk.scratch("ram", size, merged.dtype))  # θ_RAM, rounded once
    changed = torch.ne(ram, merged, out=chunk.scratch("changed", size, torch.bool))
    keys = torch.add(chunk.pattern, changed, alpha=1 << n, out=chunk.scratch("keys", size, torch.int32))
    hist = torch.bincount(keys, minlength=2 << n).cpu()
    unique = one_agent_patterns(n)
    moved = hist[unique + (1 << n)]
    return torch.stack([moved, hist[unique] + moved])


def _rescale_changes_gather(chunk: Chunk, merged: torch.Tensor) -> torch.Tensor:
    """``rescale_changes`` for many agents (no pattern), from the unique elements gathered."""
    n = chunk.n_agents
    owner = torch.where(chunk.counts == 1, torch.argmax(chunk.masks.to(torch.int8), 0).to(torch.int32), -1)
    idx = flatnonzero(owner >= 0)
    if idx.numel() == 0:
        return torch.zeros(2, n, dtype=torch.int64)
    agent = owner.index_select(0, idx).long()
    base = chunk.base
    x = base.index_select(0, idx)
    tau = chunk.taus.reshape(-1).index_select(0, agent * base.numel() + idx)
    ram = torch.empty(idx.shape, dtype=merged.dtype, device=merged.device)
    torch.add(x, tau, out=ram)  # θ_RAM, rounded once like the merge
    changed = torch.ne(ram, merged.reshape(-1).index_select(0, idx))
    out = torch.stack([torch.bincount(agent[changed], minlength=n), torch.bincount(agent, minlength=n)])
    return out.cpu()


# --- the probe's λ* histograms ------------------------------------------------------------------------------


def lambda_star_keys(x: torch.Tensor, tau: torch.Tensor, first: torch.Tensor | int) -> torch.Tensor:
    """Histogram keys ``(first + d)·BINS + bin(λ*)`` for each survival dtype d (``first`` per element
    or one int), where λ* is the smallest scale at which round(x + λ·τ) leaves round(x + τ) in that
    dtype; bin(λ*) = ceil((λ* − 1) / STEP) clipped to the bins.

    y0 = round(x + τ); the value moves once x + λτ passes the midpoint between y0 and its neighbour
    in the direction of τ, so λ* − 1 = ((y0 − x) − τ + h) / τ with h the signed half gap to that
    neighbour (``nextafter``, so binade edges, subnormals and zero need no special cases). All in
    the compute dtype (float32 for 16-bit and 32-bit inputs): y0, its neighbour and h are exact
    there, and the remaining rounding moves λ* by ~1e-7, far below the 0.002 bin width.
    """
    x = x.to(tau.dtype)
    total = x + tau
    inf = torch.tensor(math.inf, dtype=tau.dtype, device=tau.device)
    toward = torch.copysign(inf, tau)
    scale = torch.reciprocal(tau).mul_(1.0 / SURVIVAL_STEP)  # 1 / (τ·STEP)
    if not bool(torch.isfinite(scale).all()):
        # a subnormal τ (possible at ε = 0) overflows 1/τ; the largest finite value keeps every ratio's
        # sign and clip, and a zero numerator (exactly at the midpoint) gives 0 instead of 0·inf = NaN
        big = torch.finfo(tau.dtype).max
        scale.nan_to_num_(posinf=big, neginf=-big)
    # keys are built in the compute dtype (exact integers: at most N·3·BINS < 2^24) and converted once
    offset = (torch.as_tensor(first, device=tau.device) * SURVIVAL_BINS).to(tau.dtype)  # += BINS per dtype
    limit = float(total.abs().max()) if total.numel() else 0.0
    dtypes = [torch_dtype(name) for name in SURVIVAL_DTYPES]
    finite = limit < min(torch.finfo(d).max for d in dtypes) / 2
    keys = torch.empty((len(SURVIVAL_DTYPES), tau.numel()), dtype=torch.int32, device=tau.device)
    y0 = torch.empty_like(tau)
    for d, dtype in enumerate(dtypes):
        if dtype == tau.dtype:
            y0.copy_(total)
            neighbour = torch.nextafter(y0, toward)
        else:
            rounded = total.to(dtype)
            y0.copy_(rounded)
            neighbour = torch.nextafter(rounded, toward.to(dtype)).to(tau.dtype)
        h = neighbour.sub_(y0).mul_(0.5)  # signed half gap, exact
        num = (
            y0.sub_(x).sub_(tau).add_(h)
        )  # (y0 − x) − τ is the rounding of x + τ; mid = y0 + h may not be representable
        num.mul_(scale).ceil_()  # ceil((λ* − 1) / STEP)
        num.clamp_(0.0, SURVIVAL_BINS - 1)
        if not finite:  # y0 overflowed to ±inf somewhere (float16): NaN gaps land in the last bin ("never")
            torch.nan_to_num_(num, nan=SURVIVAL_BINS - 1)
        keys[d].copy_(num.add_(offset))
        offset.add_(SURVIVAL_BINS)
    return keys.reshape(-1)


def lambda_star_counts(x: torch.Tensor, tau: torch.Tensor, first: torch.Tensor | int, n: int) -> torch.Tensor:
    """The λ* histograms of unique elements (base values ``x``, updates ``tau``) of agents ``first`` (an int, or
    one per element): ``[n, dtypes, BINS]`` int64 on the CPU, one bincount of ``lambda_star_keys``."""
    keys = lambda_star_keys(x, tau, first * len(SURVIVAL_DTYPES))
    counts = torch.bincount(keys, minlength=n * len(SURVIVAL_DTYPES) * SURVIVAL_BINS)
    return counts.cpu().reshape(n, len(SURVIVAL_DTYPES), SURVIVAL_BINS)


def fused_lambda_star(compute: type) -> Any:
    """The numba piece: the constants that select ``ram_rescale_kernel``'s overload of the probe's hook (importing
    that module registers it), in the compute dtype."""
    from .ram_rescale_kernel import LambdaStarConstants

    return LambdaStarConstants(
        compute(1.0 / SURVIVAL_STEP), compute(np.finfo(compute).max), compute(SURVIVAL_BINS - 1), compute(0.5)
    )


def _histograms(counts: torch.Tensor | None) -> dict[str, list[list[int]]]:
    """The report's value: dtype -> per agent histogram of λ* (empty when not counted)."""
    if counts is None:
        return {}
    return {d: counts[:, i].tolist() for i, d in enumerate(SURVIVAL_DTYPES)}


def _save(histograms: dict[str, list[list[int]]], counted: bool) -> dict[str, Any]:
    """The probe file's keys, as every version of it has written them."""
    return {
        "has_survival": counted,
        "rescale_survival": {"step": SURVIVAL_STEP, "bins": SURVIVAL_BINS, "hist": histograms},
    }


def _load(data: dict) -> tuple[dict[str, list[list[int]]], bool]:
    """(histograms, counted) from a probe's JSON; a probe saved before ``has_survival`` existed had them all."""
    return data["rescale_survival"]["hist"], bool(data.get("has_survival", True))


def _merge_fields(histograms: dict[str, list[list[int]]], lambdas: list[float], out_dtypes: set[str]) -> dict[str, Any]:
    """The merge report's ``rescale_survival_share`` read off the histograms for the merge's λ and output dtypes
    (empty when the probe has none); ``SurvivalObserver``'s exact count replaces it where the merge pass made one."""
    return {
        REPORT_KEY: {
            name: [_share(histograms[name][t], lam) for t, lam in enumerate(lambdas)]
            for name in out_dtypes & set(histograms)
        }
    }


LAMBDA_STAR = ProbeStatistic(
    NAME,
    (len(SURVIVAL_DTYPES), SURVIVAL_BINS),
    lambda_star_counts,
    fused_lambda_star,
    _histograms,
    _save,
    _load,
    _merge_fields,
)


def survival_histograms(report: ProbeReport) -> dict[str, list[list[int]]]:
    """A probe's λ* histograms: dtype -> per agent histogram (empty when the probe did not count them)."""
    return report.statistics.get(NAME, {}) if report.counted else {}


def survival_share(report: ProbeReport, agent: int, dtype: str, lam: float) -> float | None:
    """Share of the agent's unique elements whose value rescaled by ``lam`` differs, after rounding
    to ``dtype``, from the unscaled (RAM) value. None when the agent has no unique elements.

    From the λ* histogram: an element counts when λ ≥ the upper edge of its λ* bin, so the
    share is exact up to the bin width of 0.002 in λ.
    """
    histograms = survival_histograms(report)
    if not histograms:
        raise ValueError("this probe was computed without the rounding-survival histograms")
    return _share(histograms[dtype][agent], lam)


def _share(hist: list[int], lam: float) -> float | None:
    total = sum(hist)
    if total == 0:
        return None
    k = min(math.floor((lam - 1.0) / SURVIVAL_STEP + 1e-9), SURVIVAL_BINS - 1)
    return sum(hist[: k + 1]) / total if k >= 0 else 0.0
