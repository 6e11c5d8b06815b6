"""What each merge method would keep of each agent's update, before merging (SPEC.md section 10):
pure functions of a probe report (its overlap counts, per-tensor counts and sign agreement).
Definitions and which numbers are exact: docs/engine.md, "What each method would keep"."""

from __future__ import annotations

import math

from .inspection import InspectStats
from .methods import get_method
from .methods.baselines import keep_count


KEEP_METHODS = ("ram", "ram-plus", "ram-plus-soft", "average", "task-arithmetic", "ties", "dare-ta", "dare-ties")
ESTIMATED = frozenset({"ties", "dare-ta", "dare-ties"})


def would_keep(report, method: str, params: dict) -> list[float | None]:
    """Per agent: the share of its update mass that ``method`` keeps in the merged model.

    Update mass of agent t: the elements it updates (|τ_t,i| > ε), each one unit. A method whose
    merged task vector is τ_merged,i = Σ_t w_t,i·τ_t,i keeps w_t,i of unit i (the fraction of the
    agent's own update at i that the merged model carries); the share is the mean of w_t,i over the
    agent's updated elements. Exact for RAM (w = 1 where t alone updates, 1/c where c agents do),
    RAM+ and RAM+s (λ_t instead of 1 where t alone updates), Average (w = 1/N) and Task Arithmetic
    (w = λ). Expected value for DARE-TA (each element kept with probability 1 − p and scaled by
    1/(1 − p): λ). Estimates for TIES and DARE-TIES (``ESTIMATED``; see ``_trim_keep`` and
    ``_election_weight``). None for an agent with no updates, or, for TIES and DARE-TIES, when the
    report lacks the pair statistics.
    """
    n = len(report.agents)
    totals = [a.updated for a in report.agents]
    ram = [sum(a.overlap[k] / (k + 1) for k in range(n)) for a in report.agents]
    shares: list[float]
    if method == "ram":
        shares = ram
    elif method in ("ram-plus", "ram-plus-soft"):
        m = get_method(method)
        lambdas = m.lambdas(m.resolve(params), report)
        shares = [r + (lam - 1.0) * a.unique for r, lam, a in zip(ram, lambdas, report.agents)]
    elif method == "average":
        shares = [tot / n for tot in totals]
    elif method in ("task-arithmetic", "dare-ta"):
        shares = [tot * params.get("scale", 0.3) for tot in totals]
    elif method in ("ties", "dare-ties"):
        stats = getattr(report, "inspect", None)
        if stats is None:
            return [None] * n
        agree = _agreement(stats, n)
        if method == "ties":
            trim = _trim_keep(report, params.get("density", 0.2), params.get("ties_scope", "tensor"))
            present = [(sum(trim) - trim[t]) / (n - 1) if n > 1 else 1.0 for t in range(n)]
            own = trim
        else:  # each element kept with probability 1 − p and scaled by 1/(1 − p): 1 in expectation
            p = params.get("drop", 0.5)
            present, own = [1.0 - p] * n, [1.0] * n
        scale = params.get("scale", 1.0)
        shares = [scale * own[t] * sum(a.overlap[k] * _election_weight(k, agree[t], present[t]) for k in range(n))
                  for t, a in enumerate(report.agents)]
    else:
        return [None] * n
    return [s / tot if tot > 0 else None for s, tot in zip(shares, totals)]


def _agreement(stats: InspectStats, n: int) -> list[float]:
    """Per agent: the share of its shared elements' partners whose τ has the same sign (from ``pairs``)."""
    out = []
    for t in range(n):
        both = sum(stats.both[t][s] for s in range(n) if s != t)
        same = sum(stats.same_sign[t][s] for s in range(n) if s != t)
        out.append(same / both if both else 1.0)
    return out


def _trim_keep(report, density: float, scope: str) -> list[float]:
    """TIES's trim: per agent, the share of its updated elements among the ⌊k·n⌋ it keeps per scope,
    (every updated element outranks every other one: |τ| > ε ≥ the rest). Exact for the count of
    kept elements; it ignores which of an agent's elements the trim drops (the smallest ones)."""
    n = len(report.agents)
    if scope == "model":
        k = keep_count(density, report.params)
        return [min(a.updated, k) / a.updated if a.updated else 0.0 for a in report.agents]
    kept = [0] * n
    for t_stats in report.tensor_stats:
        k = keep_count(density, t_stats.params)
        for t in range(n):
            kept[t] += min(t_stats.updated[t], k)
    return [kept[t] / a.updated if a.updated else 0.0 for t, a in enumerate(report.agents)]


def _election_weight(k: int, agree: float, present: float) -> float:
    """Expected weight TIES's sign election and disjoint mean give an element that agent t shares
    with k others (k = 0: unique, kept whole). Each other agent is present with probability
    ``present`` (survives its trim or DARE drop) and, when present, agrees in sign with probability
    ``agree``, independently; magnitudes are taken as equal, so the elected sign is the majority's
    (a tie is a coin flip). If t's sign is elected with j agreeing partners present, t gets 1/(j+1)."""
    if k == 0:
        return 1.0
    total = 0.0
    p_agree, p_dis, p_abs = present * agree, present * (1.0 - agree), 1.0 - present
    for j in range(k + 1):
        for d in range(k - j + 1):
            prob = (math.comb(k, j) * math.comb(k - j, d) * p_agree ** j * p_dis ** d * p_abs ** (k - j - d))
            if j + 1 > d:
                win = 1.0
            elif j + 1 == d:
                win = 0.5
            else:
                win = 0.0
            total += prob * win / (j + 1)
    return total
