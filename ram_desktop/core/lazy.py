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

import ast
import gc
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
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


def lazy_exports(name: str) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """A module's ``__getattr__``, ``__dir__`` (PEP 562) and ``__all__`` for names it exports lazily: each is
    imported from its module at its first use and kept, so importing the module stays cheap.

    The names are the imports the module's ``if TYPE_CHECKING:`` block writes as themselves (``from .spec
    import MergeSpec as MergeSpec``, PEP 484's re-export form): one list, which the type checker reads too.
    The block is read from the module's source file (the frozen bundle ships these modules as source:
    ``packaging/ram-desktop.spec``)."""
    module = sys.modules[name]
    exports = type_checking_exports(Path(str(module.__file__)), module.__package__ or name)
    namespace = module.__dict__

    def get(attr: str) -> Any:
        source = exports.get(attr)
        if source is None:
            raise AttributeError(f"module {name!r} has no attribute {attr!r}")
        value = getattr(importlib.import_module(source), attr)
        namespace[attr] = value  # loaded once
        return value

    def names() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return get, names, sorted(exports)


def type_checking_exports(path: Path, package: str) -> dict[str, str]:
    """name → absolute module, for each import of the source's top-level ``if TYPE_CHECKING:`` blocks that
    binds a name as itself (``import X as X``); ``package`` resolves relative imports. Only the blocks are
    parsed (a whole module costs milliseconds at every start)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[str] = []
    for i, line in enumerate(lines):
        if line.startswith("if TYPE_CHECKING:"):
            end = next((j for j in range(i + 1, len(lines)) if lines[j][:1] not in ("", " ", "#")), len(lines))
            blocks += lines[i:end]
    exports: dict[str, str] = {}
    for node in ast.walk(ast.parse("\n".join(blocks))):
        if isinstance(node, ast.ImportFrom):
            source = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
            exports.update({a.name: source for a in node.names if a.asname == a.name})
    return exports
