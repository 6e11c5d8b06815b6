"""Putting a runtime folder's torch ahead of the bundled one (docs/compute.md#the-runtime-folder): a finder
ahead of every other importer hands out torch's own packages from the folder, and the folder goes last on
``sys.path`` for anything else it holds that the app lacks. Used by the start-up (:mod:`.runtime`) once the
folder's torch passed its check, and by the check's child process (:mod:`.verify`)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

TORCH_FAMILY = frozenset({"torch", "torchgen", "functorch", "triton", "nvidia", "cuda"})

__all__ = ["TORCH_FAMILY", "use_folder"]


class _RuntimeFinder(importlib.abc.MetaPathFinder):
    """Finds the runtime's top-level packages (torch, triton, nvidia ...) in the runtime folder before any
    other finder: a frozen bundle's own importer sits ahead of ``sys.path`` and would hand out its bundled
    torch otherwise."""

    def __init__(self, site: Path, names: Sequence[str]) -> None:
        self.site = str(site)
        self.names = frozenset(names)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] not in self.names:
            return None
        return importlib.machinery.PathFinder.find_spec(fullname, [self.site] if "." not in fullname else path)


def use_folder(folder: Path, names: Sequence[str] = ("torch",)) -> None:
    """Make ``folder``'s ``site`` the source of torch's own packages among ``names`` (ahead of every other
    importer), and of anything else it holds that the app lacks (``site`` goes last on ``sys.path``: the
    packages the app shares with torch, pinned to the same versions, stay the app's)."""
    site = folder / "site"
    if str(site) not in sys.path:
        sys.path.append(str(site))
    if not any(isinstance(f, _RuntimeFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _RuntimeFinder(site, [n for n in names if n in TORCH_FAMILY]))
