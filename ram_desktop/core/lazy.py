"""torch, imported at its first use instead of when the core is imported.

Importing torch costs 1–2 s of CPU before any work. A CPU merge of safetensors checkpoints by a method
with fused kernels (``kernels.py``) never needs it: the reader maps the files, the numba kernels compute
on the stored bits and the writer writes bytes. So core modules take ``torch`` from here: a stand-in
whose first attribute read imports torch (a normal ``import``, under Python's import lock, so any thread
may be first) and which then hands out torch's own attributes. Code that uses torch runs exactly as
with ``import torch``; ``ram-merge merge`` on the fused path finishes without it
(``tests/test_startup.py``). The window imports torch before its event loop starts (``gui/app.py``),
so no click pays for it.
"""

from __future__ import annotations

import gc
import importlib
import sys
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any


class DeferredModule:
    """A module imported when one of its attributes is first read; attributes are kept once read
    (a plain attribute lookup afterwards, no call)."""

    def __init__(self, name: str) -> None:
        self.__dict__["_name"] = name

    def __getattr__(self, attr: str) -> Any:
        module = self.module()
        value = getattr(module, attr)
        if not attr.startswith("__"):
            self.__dict__[attr] = value
        return value

    def module(self) -> ModuleType:
        """The real module (imported now if it was not yet). Importing torch creates about a million objects;
        the cyclic garbage collector would walk them again and again while they load (~0.2 CPU-s), so it is
        off for the import."""
        name = self.__dict__["_name"]
        if name in sys.modules:  # imported, or being imported by another thread: the import lock waits for it
            return importlib.import_module(name)
        collecting = gc.isenabled()
        gc.disable()
        try:
            return importlib.import_module(name)
        finally:
            if collecting:
                gc.enable()

    def __setattr__(self, attr: str, value: Any) -> None:  # e.g. a test patching torch.xyz through a core module
        setattr(self.module(), attr, value)
        self.__dict__.pop(attr, None)

    def __repr__(self) -> str:
        return f"<deferred module {self.__dict__['_name']!r}>"


if TYPE_CHECKING:
    import torch
else:
    torch = DeferredModule("torch")


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__`` (PEP 562) that import each name in ``exports`` (name → the
    package's submodule holding it) at its first use and keep it: ``import ram_desktop.core`` stays cheap."""
    namespace = sys.modules[package].__dict__

    def get(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{module}", package), name)
        namespace[name] = value  # loaded once
        return value

    def names() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return get, names
