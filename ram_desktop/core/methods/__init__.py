"""Merge methods: one module per family on the contract in ``base``; this module is the registry.

Adding a method touches only its family's module (or a new one listed in ``_FAMILIES``): the CLI
flags, the GUI form, the recipe, the engine, would-keep, mergekit, the comparison and the charts all
read the registry and the method's fields.
"""

from __future__ import annotations

from .. import defaults
from ..engine.contracts import ProbeStatistic
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
    "PROBE_STATISTICS",
    "SEARCH_METHODS",
    "SEARCH_REFERENCES",
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

# What the search reads of the methods' ``Interop`` flags, derived here only. ``SEARCH_METHODS``: what
# ``ram-merge search`` (and the window's Search) tries without --methods: the default method first, then the
# registry's order. The order is part of a study's identity (``evaluate.search``): a study begun with the default
# methods continues only with them in the same order. ``SEARCH_REFERENCES``: (name, label) of the methods scored
# at their defaults beside the best trial, in the registry's order.
SEARCH_METHODS: tuple[str, ...] = tuple(
    sorted((name for name, m in METHODS.items() if m.interop.searched_by_default), key=lambda n: n != defaults.METHOD)
)
SEARCH_REFERENCES: tuple[tuple[str, str], ...] = tuple(
    (name, m.label) for name, m in METHODS.items() if m.interop.search_reference
)


# The statistics the Analyze probe counts for the methods (``Analysis.probe_statistic``), each once, in the
# registry's order: the probe runs with no method chosen, so it counts every method's (the pipeline hands them in).
PROBE_STATISTICS: tuple[ProbeStatistic, ...] = tuple(
    {
        m.analysis.probe_statistic.name: m.analysis.probe_statistic
        for m in METHODS.values()
        if m.analysis.probe_statistic
    }.values()
)


def get_method(name: str) -> MergeMethod:
    try:
        return METHODS[name]
    except KeyError:
        raise InputError(f"unknown method {name!r}; choose one of {', '.join(METHODS)}") from None
