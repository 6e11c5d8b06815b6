"""The runtime folder: a torch build installed per user, put ahead of the bundled torch at start-up
(docs/compute.md#the-runtime-folder).

Layout under :func:`~ram_desktop.core.compute.builds.runtimes_dir`::

    runtimes/
      active                      the name of the folder to use (written after it is in place)
      cuda-torch2.13.0/
        site/                     the packages (``uv pip install --target``)
        runtime.json              the marker, written last: variant, torch, Python, the check's result,
                                  the top-level modules and the size of every binary file

A folder is used only when its marker is there, names this Python and system, and every binary it lists
still has its size; anything else (a half-written, damaged or foreign folder) is skipped with one line saying
why, and the bundled torch is used. Nothing here imports torch: :func:`activate` runs before it is imported.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from .builds import runtimes_dir

MARKER = "runtime.json"
FORMAT = "ram-runtime/1"
ACTIVE_FILE = "active"
OFF_VALUES = ("0", "off", "no", "none", "bundled")
BINARY_SUFFIXES = (".so", ".pyd", ".dll", ".dylib")

__all__ = [
    "FORMAT",
    "MARKER",
    "RuntimeStatus",
    "activate",
    "active_folder",
    "check_folder",
    "clear_active",
    "read_marker",
    "set_active",
    "status",
    "use_folder",
]


@dataclass(frozen=True)
class RuntimeStatus:
    """What :func:`activate` did: ``folder`` is the runtime in use (None: the bundled torch), ``message``
    one line for the user when a runtime was chosen but not used (None when all is as asked)."""

    folder: Path | None = None
    variant: str | None = None
    torch: str | None = None
    message: str | None = None
    marker: dict | None = None


_STATUS = RuntimeStatus()


def status() -> RuntimeStatus:
    """The status of the last :func:`activate` in this process."""
    return _STATUS


class RuntimeProblem(Exception):
    """A runtime folder that must not be used; the text says why, in one line."""


def _python_tag() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def read_marker(folder: Path) -> dict:
    """The folder's marker, or :class:`RuntimeProblem` when it is missing or not a RAM Desktop marker."""
    try:
        data = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RuntimeProblem(f"{folder} has no {MARKER} (a half-written install?)") from None
    except (OSError, ValueError) as e:
        raise RuntimeProblem(f"{folder / MARKER} cannot be read: {e}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise RuntimeProblem(f"{folder / MARKER} is not a {FORMAT} marker")
    return data


def check_folder(folder: Path) -> dict:
    """The marker of a usable runtime folder, else :class:`RuntimeProblem` saying why it is not usable."""
    marker = read_marker(folder)
    if marker.get("python") != _python_tag():
        raise RuntimeProblem(f"{folder.name} was made for Python {marker.get('python')}, this is {_python_tag()}")
    site = folder / "site"
    binaries = marker.get("binaries", {})
    if not isinstance(binaries, dict) or not (site / "torch" / "__init__.py").is_file():
        raise RuntimeProblem(f"{folder.name} is damaged: torch/__init__.py is missing")
    for rel, size in binaries.items():
        try:
            if (site / rel).stat().st_size != size:
                raise RuntimeProblem(f"{folder.name} is damaged: {rel} changed size")
        except OSError:
            raise RuntimeProblem(f"{folder.name} is damaged: {rel} is missing") from None
    return marker


def active_folder(root: Path | None = None) -> Path | None:
    """The runtime folder ``active`` names, or None when none is chosen."""
    root = root or runtimes_dir()
    try:
        name = (root / ACTIVE_FILE).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    if not name or "/" in name or "\\" in name or name in (".", ".."):
        return None
    return root / name


def set_active(folder: Path) -> None:
    """Choose ``folder`` for the next start (written to a temporary file and renamed)."""
    tmp = folder.parent / f"{ACTIVE_FILE}.tmp-{os.getpid()}"
    tmp.write_text(folder.name + "\n", encoding="utf-8")
    os.replace(tmp, folder.parent / ACTIVE_FILE)


def clear_active(root: Path | None = None) -> None:
    root = root or runtimes_dir()
    try:
        (root / ACTIVE_FILE).unlink()
    except FileNotFoundError:
        pass


class _RuntimeFinder(importlib.abc.MetaPathFinder):
    """Finds the runtime's top-level packages (torch, triton, nvidia ...) in the runtime folder before any
    other finder: a frozen bundle's own importer sits ahead of ``sys.path`` and would hand out its bundled
    torch otherwise."""

    def __init__(self, site: Path, names: Sequence[str]) -> None:
        self.site = str(site)
        self.names = frozenset(names)

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] not in self.names:
            return None
        return importlib.machinery.PathFinder.find_spec(fullname, [self.site] if "." not in fullname else path)


TORCH_FAMILY = frozenset({"torch", "torchgen", "functorch", "triton", "nvidia", "cuda"})


def use_folder(folder: Path, names: Sequence[str] = ("torch",)) -> None:
    """Make ``folder``'s ``site`` the source of torch's own packages among ``names`` (ahead of every other
    importer), and of anything else it holds that the app lacks (``site`` goes last on ``sys.path``: the
    packages the app shares with torch, pinned to the same versions, stay the app's)."""
    site = folder / "site"
    if str(site) not in sys.path:
        sys.path.append(str(site))
    if not any(isinstance(f, _RuntimeFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _RuntimeFinder(site, [n for n in names if n in TORCH_FAMILY]))


def activate(root: Path | None = None, env: Mapping[str, str] | None = None) -> RuntimeStatus:
    """At start-up, before torch is imported: use the chosen runtime folder if it is usable.

    ``RAM_DESKTOP_RUNTIME=off`` keeps the bundled torch. Returns (and remembers, see :func:`status`) what
    happened; never raises: a bad folder leaves the bundled torch in use and says why."""
    global _STATUS
    setting = (os.environ if env is None else env).get("RAM_DESKTOP_RUNTIME", "")
    if setting and setting.strip().lower() in OFF_VALUES:
        _STATUS = RuntimeStatus()
        return _STATUS
    folder = active_folder(root)
    if folder is None:
        _STATUS = RuntimeStatus()
        return _STATUS
    try:
        marker = check_folder(folder)
        if "torch" in sys.modules:
            raise RuntimeProblem("torch was already imported")
    except RuntimeProblem as e:
        _STATUS = RuntimeStatus(message=f"compute runtime not used ({e}); using the bundled CPU torch")
        return _STATUS
    use_folder(folder, marker.get("modules") or ["torch"])
    _STATUS = RuntimeStatus(folder, marker.get("variant"), marker.get("torch"), None, marker)
    return _STATUS
