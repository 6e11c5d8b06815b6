"""Which method? The probe's numbers that decide between merge methods, and what they imply, in words.

The paper's argument (section 3) is about how the agents' updates overlap: where an element is updated by one
agent only, averaging divides it by N and RAM keeps it whole; where several agents update it, averaging keeps
their mean and summing (Task Arithmetic) adds them up, which helps when they agree in sign and hurts when they
conflict. RAM+ then rescales unique elements by λ_t = 1 + r·clip(ρ_t, 0, α), and in a bf16 output most of a
small rescale rounds away. ``advise`` reads those quantities from a probe report and says, for each, what it
implies, and which methods are worth searching first. The thresholds are rules of thumb, stated in
``THRESHOLDS`` and in docs/methods.md ("Which method?"); the advice never replaces scoring the merges.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from ..engine.probe import ProbeReport
from .ram import ram_plus_lambdas
from .ram_rescale import survival_histograms, survival_share

# the rules of thumb behind the words (docs/methods.md, "Which method?")
THRESHOLDS = {
    "mostly_unique": 0.5,  # unique / updated at or above this: the agents' updates are mostly disjoint
    "mostly_shared": 0.5,  # shared / updated at or above this: most of each update is shared with another agent
    "signs_agree": 0.8,  # same-sign share of elements two agents both update, at or above this: they add up
    "signs_conflict": 0.6,  # below this (0.5 is chance): shared updates pull against each other
    "rescale_survives": 0.5,  # below this share of unique elements, RAM+'s rescale mostly rounds away
    "dense": 0.3,  # an agent updating more than this share of elements is dense for an RL update
}
# the defaults RAM+ runs with (methods/ram.py); the advice speaks of them
DEFAULT_R, DEFAULT_ALPHA = 0.1, 2.0


@dataclass(frozen=True)
class AgentFacts:
    """One agent's numbers that decide between methods."""

    name: str
    density: float
    unique_share: float | None  # unique / updated (None: the agent updates nothing)
    rho: float | None  # shared / unique (None: nothing unique, ρ = ∞)
    lam: float  # RAM+'s λ at the default r and α
    rescale_survival: float | None  # share of unique elements whose RAM+ rescale survives the output dtype


@dataclass(frozen=True)
class Advice:
    """The deciding numbers, what they imply (one sentence each), and the methods to search first, in order."""

    agents: list[AgentFacts]
    sign_agreement: float | None  # same-sign share over all pairs' shared elements (None: not measured)
    out_dtype: str | None  # the dtype the rescale survival is for (None: not measured)
    findings: list[str]
    methods: list[str]
    thresholds: dict[str, float] = field(default_factory=lambda: dict(THRESHOLDS))

    def to_json(self) -> dict:
        return asdict(self)

    def text(self) -> str:
        lines = ["Which method?"]
        lines += [f"  - {f}" for f in self.findings]
        lines.append("  Worth searching first: " + ", ".join(self.methods))
        return "\n".join(lines)


def sign_agreement(report: ProbeReport) -> float | None:
    """Of the elements two different agents both update, summed over every pair, the share whose updates have
    the same sign; None without the inspection statistics or without any shared element."""
    if report.inspect is None:
        return None
    n = len(report.agents)
    both = sum(report.inspect.both[a][b] for a in range(n) for b in range(a + 1, n))
    same = sum(report.inspect.same_sign[a][b] for a in range(n) for b in range(a + 1, n))
    return same / both if both else None


def advise(report: ProbeReport, out_dtype: str | None = "bfloat16") -> Advice:
    """What the probe's numbers imply for the choice of method. ``out_dtype``: the output precision the rescale
    survival is read for (None or a probe without the survival histograms: not stated)."""
    n = len(report.agents)
    lambdas = ram_plus_lambdas({"r": DEFAULT_R, "alpha": DEFAULT_ALPHA}, report)
    survival_dtype = out_dtype if out_dtype and out_dtype in survival_histograms(report) else None
    facts = [
        AgentFacts(
            a.name,
            a.density,
            a.unique / a.updated if a.updated else None,
            None if math.isinf(a.rho) else a.rho,
            lam,
            survival_share(report, t, survival_dtype, lam) if survival_dtype else None,
        )
        for t, (a, lam) in enumerate(zip(report.agents, lambdas))
    ]
    agreement = sign_agreement(report) if n > 1 else None
    findings: list[str] = []
    ranked: list[str] = []

    def prefer(*methods: str) -> None:
        ranked.extend(m for m in methods if m not in ranked)

    updating = [f for f in facts if f.unique_share is not None]
    if n == 1:
        findings.append(
            "one agent: every merge is the base plus a scaled copy of its task vector; Task Arithmetic's λ is "
            "the only setting that matters"
        )
        prefer("task-arithmetic")
    elif not updating:
        findings.append("no agent changes any element by more than ε: there is nothing to merge at this ε")
        prefer("average")
    else:
        unique = [f.unique_share for f in updating if f.unique_share is not None]
        low, high = min(unique), max(unique)
        shared_low, shared_high = 1 - high, 1 - low
        span = f"{low:.0%}" if round(low, 2) == round(high, 2) else f"{low:.0%}–{high:.0%}"
        if low >= THRESHOLDS["mostly_unique"]:
            findings.append(
                f"{span} of each agent's update is unique to it: averaging divides those elements by {n}, RAM keeps "
                "them whole (the paper's case for RAM)"
            )
            prefer("ram", "ram-plus")
        elif shared_low >= THRESHOLDS["mostly_shared"]:
            shared_span = (
                f"{shared_low:.0%}"
                if round(shared_low, 2) == round(shared_high, 2)
                else f"{shared_low:.0%}–{shared_high:.0%}"
            )
            findings.append(
                f"{shared_span} of each agent's update is shared with another agent: averaging keeps their mean, "
                "summing (Task Arithmetic, λ near 1) keeps each agent's full step; RAM treats most elements as "
                "an average does"
            )
            prefer("task-arithmetic", "ties")
        else:
            findings.append(
                f"{span} of each agent's update is unique: a mix of disjoint and shared updates, where RAM and "
                "Task Arithmetic differ most"
            )
            prefer("ram", "task-arithmetic")
        if agreement is not None:
            if agreement >= THRESHOLDS["signs_agree"]:
                findings.append(
                    f"where agents update the same element they agree in sign {agreement:.0%} of the time: their "
                    "shared updates add up rather than conflict, so summing them is safe"
                )
                prefer("task-arithmetic")
            elif agreement < THRESHOLDS["signs_conflict"]:
                findings.append(
                    f"where agents update the same element they agree in sign only {agreement:.0%} of the time "
                    "(50 % is chance): shared updates pull against each other; sign election (TIES, DARE-TIES) "
                    "resolves such conflicts"
                )
                prefer("ties", "dare-ties")
            else:
                findings.append(
                    f"where agents update the same element they agree in sign {agreement:.0%} of the time: some "
                    "conflict, worth comparing TIES's sign election with a plain sum"
                )
                prefer("ties")
        rhos = [f.rho for f in facts]
        if all(r is None or r >= DEFAULT_ALPHA for r in rhos):
            findings.append(
                f"ρ ≥ α = {DEFAULT_ALPHA:g} for every agent: RAM+ is a uniform ×{1 + DEFAULT_R * DEFAULT_ALPHA:g} "
                "on unique elements (r = 0.1); its per-agent balance does nothing here, so search r, not α"
            )
        else:
            lams = ", ".join(f"{f.name} ×{f.lam:.3f}" for f in facts)
            findings.append(f"ρ differs between agents, so RAM+ rescales their unique elements differently ({lams})")
            prefer("ram-plus")
        dense = [f for f in facts if f.density > THRESHOLDS["dense"]]
        if dense:
            names = ", ".join(f"{f.name} {f.density:.0%}" for f in dense)
            findings.append(f"dense updates ({names}): trimming (TIES, DARE) has room to drop small, noisy changes")
            prefer("ties", "dare-ties")
    survivals = [f.rescale_survival for f in facts if f.rescale_survival is not None]
    if survival_dtype and survivals and n > 1:
        worst = min(survivals)
        if worst < THRESHOLDS["rescale_survives"]:
            findings.append(
                f"in {survival_dtype} only {worst:.0%} of some agent's unique elements keep RAM+'s rescale; the rest "
                "round back to RAM's value: write float32 (output dtype) or RAM+ ≈ RAM"
            )
        else:
            findings.append(
                f"in {survival_dtype} at least {worst:.0%} of each agent's unique elements keep RAM+'s rescale"
            )
    prefer("ram-plus", "task-arithmetic", "ties")
    return Advice(facts, agreement, survival_dtype, findings, ranked[:4])
