"""Merge methods: one module per family on the contract in ``base``; this module is the registry.

Adding a method touches only its family's module (or a new one listed in ``_FAMILIES``): the CLI
flags, the GUI form, the recipe, the engine, would-keep, mergekit, the comparison and the charts all
read the registry and the method's fields.
"""

from __future__ import annotations

from ..errors import InputError
from . import (
    arcee_fusion,
    baselines,
    breadcrumbs,
    della,
    fisher,
    karcher,
    linear,
    model_stock,
    multislerp,
    nearswap,
    nuslerp,
    passthrough,
    ram,
    sce,
    slerp,
    weighted,
    wudi,
)
from .base import (
    Analysis,
    Collector,
    FusedKernel,
    Interop,
    MergeMethod,
    Observer,
    Param,
    SliceCollector,
    Streaming,
    Sweep,
    WouldKeep,
    plan_warnings,
)

__all__ = [
    "METHODS",
    "Analysis",
    "Collector",
    "FusedKernel",
    "Interop",
    "MergeMethod",
    "Observer",
    "Param",
    "SliceCollector",
    "Streaming",
    "Sweep",
    "WouldKeep",
    "get_method",
    "plan_warnings",
]

_FAMILIES = (
    ram,
    baselines,
    fisher,
    wudi,
    linear,
    slerp,
    model_stock,
    weighted,
    breadcrumbs,
    della,
    nuslerp,
    multislerp,
    karcher,
    sce,
    nearswap,
    arcee_fusion,
    passthrough,
)
METHODS: dict[str, MergeMethod] = {m.name: m for family in _FAMILIES for m in family.METHODS}


def get_method(name: str) -> MergeMethod:
    try:
        return METHODS[name]
    except KeyError:
        raise InputError(f"unknown method {name!r}; choose one of {', '.join(METHODS)}") from None
