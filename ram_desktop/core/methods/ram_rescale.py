"""RAM+'s rescale bookkeeping in the merge pass: how many of each agent's unique elements the λ rescale actually
changed once rounded to the output dtype (``merge-report.json``'s ``rescale_survival_share``).

The engine knows none of this: ``SurvivalObserver`` is the RAM+ family's ``Observer`` (it counts merged chunks on
the torch path with ``rescale_changes``) and a ``SliceObserver``, taking the counts the family's fused kernel
(``ram_kernel.count_moved``) makes in its merge pass and returns as ``KernelResult.observed``.
"""

from __future__ import annotations

import threading

import numpy as np

from ..engine.chunks import PATTERN_MAX_AGENTS, Chunk, StoredSlices
from ..engine.probe import flatnonzero, one_agent_patterns
from ..lazy import torch
from ..storage.formats.base import dtype_name


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
