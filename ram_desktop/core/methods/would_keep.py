"""What each merge method would keep of each agent's update, before merging (docs/engine.md, "What each
method would keep"): pure functions of a probe report (its overlap counts, per-tensor counts and sign agreement).
Each method declares its own estimate (``Analysis.would_keep``); definitions and which numbers are
exact: docs/engine.md, "What each method would keep"."""

from __future__ import annotations

from . import METHODS, get_method


def keep_methods() -> list[str]:
    """The methods with a would-keep estimate, in registry order."""
    return [name for name, m in METHODS.items() if m.analysis.would_keep is not None]


def estimated(method: str) -> bool:
    """Whether ``method``'s share is an estimate (drawn lighter) rather than exact or expected."""
    keep = get_method(method).analysis.would_keep
    return keep is not None and keep.estimated


def would_keep(report, method: str, params: dict) -> list[float | None]:
    """Per agent: the share of its update mass that ``method`` keeps in the merged model.

    Update mass of agent t: the elements it updates (|τ_t,i| > ε), each one unit. A method whose
    merged task vector is τ_merged,i = Σ_t w_t,i·τ_t,i keeps w_t,i of unit i (the fraction of the
    agent's own update at i that the merged model carries); the share is the mean of w_t,i over the
    agent's updated elements. None for an agent with no updates, for a method without an estimate,
    or when the report lacks the statistics the estimate needs (TIES's pair statistics).
    """
    n = len(report.agents)
    m = get_method(method)
    shares = m.analysis.would_keep.shares(report, m.resolve(params)) if m.analysis.would_keep is not None else None
    if shares is None:
        return [None] * n
    return [s / a.updated if a.updated > 0 else None for s, a in zip(shares, report.agents)]
