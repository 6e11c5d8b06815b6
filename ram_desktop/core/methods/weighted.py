"""Task arithmetic, TIES and DARE with per-agent weights, densities and gradients, as mergekit 0.1.5 computes
them (docs/methods.md, "Weighted task arithmetic family"). The paper's own ``task-arithmetic``, ``ties``,
``dare-ta`` and ``dare-ties`` (``baselines``) stay as they are; these are the opt-in extension that reads
mergekit configurations with per-model parameters."""

from __future__ import annotations

from .baselines import DARE_PAPER, TA_PAPER, TIES_PAPER
from .gta import Family, method
from .mergekit_map import MergekitExact, MergekitMapping, exact_export

SHARED = {"lambda": "lambda", "normalize": "normalize", "rescale": "rescale", "int8_mask": "int8_mask"}
PER_MODEL = {"weight": "weight", "density": "density"}


def _mapping(theirs: str, consensus: bool, sparse: bool, seeded: bool) -> MergekitMapping:
    shared = {k: v for k, v in SHARED.items() if consensus or k != "int8_mask"}
    per_model = PER_MODEL if sparse else {"weight": "weight"}
    exact = MergekitExact(theirs, shared, per_model, required=("weight",))
    note = (
        "random keep decisions: RAM Desktop's seeded hash, mergekit's torch.bernoulli "
        "(mergekit-yaml --random-seed): different elements survive"
    )
    notes = (note,) if seeded else ()
    return MergekitMapping(exact_export(exact, notes), exact=(exact,))


METHODS = (
    method(
        "weighted-task-arithmetic",
        "Task Arithmetic (per-agent weights)",
        "θ_base + λ·Σ w_t·τ_t (optionally / Σ w_t), per-agent weights and gradients as in mergekit.",
        Family("task_arithmetic", None, False, False, False),
        TA_PAPER,
        "Weighted TA",
        _mapping("task_arithmetic", False, False, False),
    ),
    method(
        "weighted-ties",
        "TIES (per-agent weights)",
        "Per-agent density trim (int(k·n) largest), weights, sign consensus, weighted disjoint mean (as mergekit).",
        Family("ties", "magnitude", True, True, False),
        TIES_PAPER,
        "Weighted TIES",
        _mapping("ties", True, True, False),
    ),
    method(
        "weighted-dare-linear",
        "DARE linear (per-agent weights)",
        "Seeded random drop per agent density, L1 rescale, weighted sum, as mergekit's dare_linear.",
        Family("dare_linear", "random", False, False, True),
        f"{DARE_PAPER}; {TA_PAPER}",
        "Weighted DARE",
        _mapping("dare_linear", False, True, True),
    ),
    method(
        "weighted-dare-ties",
        "DARE TIES (per-agent weights)",
        "Seeded random drop per agent density, L1 rescale, weights, sign consensus, as mergekit's dare_ties.",
        Family("dare_ties", "random", True, False, True),
        f"{DARE_PAPER}; {TIES_PAPER}",
        "Weighted DARE-TIES",
        _mapping("dare_ties", True, True, True),
    ),
)
