"""DELLA (docs/methods.md, "DELLA"; Deep et al., arXiv 2406.11617; mergekit ``della`` and ``della_linear``):
drop each task-vector element at random with a keep probability that grows with its magnitude rank
(k − ε … k + ε per row), rescale, then TIES's sign consensus (``della``) or a weighted sum
(``della-linear``). The keep decisions come from a seeded hash: deterministic for a seed."""

from __future__ import annotations

from .gta import Family, method
from .mergekit_map import MergekitExact, MergekitMapping, exact_export

PAPER = (
    "Deep et al., *DELLA-Merging: Reducing Interference in Model Merging through Magnitude-Based Sampling*, "
    "arXiv 2406.11617"
)
SHARED = {"lambda": "lambda", "normalize": "normalize", "rescale": "rescale"}
PER_MODEL = {"weight": "weight", "density": "density", "epsilon": "epsilon"}
RANDOM_NOTE = (
    "random keep decisions: RAM Desktop's seeded hash, mergekit's torch.bernoulli (mergekit-yaml --random-seed): "
    "different elements survive"
)
NOTE = (RANDOM_NOTE,)


def _mapping(theirs: str, consensus: bool) -> MergekitMapping:
    shared = {**SHARED, **({"int8_mask": "int8_mask"} if consensus else {})}
    exact = MergekitExact(theirs, shared, PER_MODEL, required=("weight",))
    return MergekitMapping(exact_export(exact, NOTE), exact=(exact,))


METHODS = (
    method(
        "della",
        "DELLA",
        "Magnitude-ranked random drop (MagPrune), L1 rescale, sign consensus, weighted mean.",
        Family("della", "della_magprune", True, True, True),
        PAPER,
        "DELLA",
        _mapping("della", True),
    ),
    method(
        "della-linear",
        "DELLA linear",
        "Magnitude-ranked random drop (MagPrune), L1 rescale, weighted sum.",
        Family("della_linear", "della_magprune", False, False, True),
        PAPER,
        "DELLA linear",
        _mapping("della_linear", False),
    ),
)
