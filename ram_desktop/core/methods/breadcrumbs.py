"""Model Breadcrumbs (docs/methods.md, "Breadcrumbs"; Davari & Belilovsky, arXiv 2312.06795; mergekit
``breadcrumbs`` and ``breadcrumbs_ties``): drop each task vector's largest outliers (share γ) and its smallest
values, keep the share k in between, then task arithmetic (or TIES's sign consensus)."""

from __future__ import annotations

from .gta import Family, method
from .mergekit_map import MergekitExact, MergekitMapping, exact_export

PAPER = (
    "Davari & Belilovsky, *Model Breadcrumbs: Scaling Multi-Task Model Merging with Sparse Masks*, ECCV 2024, "
    "arXiv 2312.06795"
)
SHARED = {"lambda": "lambda", "normalize": "normalize", "rescale": "rescale"}
PER_MODEL = {"weight": "weight", "density": "density", "gamma": "gamma"}


def _mapping(theirs: str, consensus: bool) -> MergekitMapping:
    shared = {**SHARED, **({"int8_mask": "int8_mask"} if consensus else {})}
    exact = MergekitExact(theirs, shared, PER_MODEL, required=("weight",))
    return MergekitMapping(exact_export(exact), exact=(exact,))


METHODS = (
    method(
        "breadcrumbs",
        "Breadcrumbs",
        "Drop outliers and small values of each task vector, then λ·Σ w·τ.",
        Family("breadcrumbs", "magnitude_outliers", False, False, False),
        PAPER,
        "Breadcrumbs",
        _mapping("breadcrumbs", False),
    ),
    method(
        "breadcrumbs-ties",
        "Breadcrumbs + TIES",
        "Breadcrumbs' sparsification, then sign consensus.",
        Family("breadcrumbs_ties", "magnitude_outliers", True, False, False),
        PAPER,
        "Breadcrumbs-TIES",
        _mapping("breadcrumbs_ties", True),
    ),
)
