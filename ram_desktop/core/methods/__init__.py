"""Merge methods: one module per family on the contract in ``base``; this module is the registry.

Adding a method touches only its family's module (or a new one listed in ``_FAMILIES``): the CLI
flags, the GUI form, the recipe, the engine, would-keep, mergekit, the comparison and the charts all
read the registry and the method's fields.
"""

from __future__ import annotations

from ..errors import InputError
from . import baselines, fisher, ram, wudi
from .base import Collector, FusedKernel, MergeMethod, Observer, Param, SliceCollector, Sweep, WouldKeep

__all__ = ["METHODS", "Collector", "FusedKernel", "MergeMethod", "Observer", "Param", "SliceCollector", "Sweep",
           "WouldKeep", "get_method"]

_FAMILIES = (ram, baselines, fisher, wudi)
METHODS: dict[str, MergeMethod] = {m.name: m for family in _FAMILIES for m in family.METHODS}


def get_method(name: str) -> MergeMethod:
    try:
        return METHODS[name]
    except KeyError:
        raise InputError(f"unknown method {name!r}; choose one of {', '.join(METHODS)}") from None
