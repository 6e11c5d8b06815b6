"""Where RAM Desktop keeps user files, finds its resources, and sends output when it has no console.

Qt-free on purpose: the core and the command line use it too (``QStandardPaths`` is Qt). The rules
follow the platforms' conventions, the same ones ``platformdirs`` implements:

=========  ==========================================  ==================================  =====================================
           Linux (XDG)                                 macOS                               Windows
=========  ==========================================  ==================================  =====================================
data       ``$XDG_DATA_HOME/ram-desktop``              ``~/Library/Application Support/``  ``%LOCALAPPDATA%\\RAM Desktop``
           (``~/.local/share/ram-desktop``)            ``RAM Desktop``
config     ``$XDG_CONFIG_HOME/ram-desktop``            ``~/Library/Application Support/``  ``%APPDATA%\\RAM Desktop``
           (``~/.config/ram-desktop``)                 ``RAM Desktop``
cache      ``$XDG_CACHE_HOME/ram-desktop``             ``~/Library/Caches/RAM Desktop``    ``%LOCALAPPDATA%\\RAM Desktop\\Cache``
           (``~/.cache/ram-desktop``)
log        ``$XDG_STATE_HOME/ram-desktop/log``         ``~/Library/Logs/RAM Desktop``      ``%LOCALAPPDATA%\\RAM Desktop\\Logs``
           (``~/.local/state/ram-desktop/log``)
=========  ==========================================  ==================================  =====================================

An XDG variable counts only when it holds an absolute path (the XDG spec says to ignore relative
ones). Nothing is created until a caller asks with ``create=True``.

Every cache of RAM Desktop (probe reports, Fisher estimates, the demo copy) lives in one folder per kind
under :func:`cache_root`: ``$RAM_DESKTOP_CACHE`` when set (tests, the self-test, a shared cache), else
:func:`user_cache_dir`. No other module builds a cache path of its own.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TextIO

APP_NAME = "RAM Desktop"  # macOS / Windows folder name
APP_ID = "ram-desktop"  # Linux folder name, executable and .desktop id
LOG_FILE = "ram-desktop.log"
LOG_MAX_BYTES = 5_000_000  # rotated once (to .1) above this size

__all__ = [
    "APP_ID",
    "APP_NAME",
    "bundle_dir",
    "cache_dir",
    "cache_root",
    "guard_stdio",
    "is_frozen",
    "resource_path",
    "resources_dir",
    "user_cache_dir",
    "user_config_dir",
    "user_data_dir",
    "user_log_dir",
]


def _platform() -> str:
    if sys.platform.startswith("win"):
        return "windows"
    if sys.platform == "darwin":
        return "macos"
    return "linux"  # and the other Unix systems, which follow XDG too


def _xdg(var: str, default: str) -> Path:
    value = os.environ.get(var, "")
    return Path(value) if value and os.path.isabs(value) else Path.home() / default


def _windows_dir(var: str) -> Path:
    value = os.environ.get(var, "")
    if value:
        return Path(value)
    return Path.home() / "AppData" / ("Roaming" if var == "APPDATA" else "Local")


def _ready(path: Path, create: bool) -> Path:
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


def _library(folder: str) -> Path:
    """``~/Library/<folder>/RAM Desktop`` (macOS)."""
    return Path.home() / "Library" / folder / APP_NAME


def _user_dir(windows: Path, macos: Path, linux: Path, create: bool) -> Path:
    """The folder for this platform (the table in the module docstring)."""
    path = {"windows": windows, "macos": macos}.get(_platform(), linux)
    return _ready(path, create)


def user_data_dir(create: bool = False) -> Path:
    """Folder for files the user would not want to lose (recent recipes, probe cache index)."""
    return _user_dir(
        _windows_dir("LOCALAPPDATA") / APP_NAME,
        _library("Application Support"),
        _xdg("XDG_DATA_HOME", ".local/share") / APP_ID,
        create,
    )


def user_config_dir(create: bool = False) -> Path:
    """Folder for settings: ``$RAM_DESKTOP_CONFIG`` when set (the self-test keeps out of the user's), else the
    platform's."""
    override = os.environ.get("RAM_DESKTOP_CONFIG")
    if override:
        return _ready(Path(override), create)
    return _user_dir(
        _windows_dir("APPDATA") / APP_NAME,
        _library("Application Support"),
        _xdg("XDG_CONFIG_HOME", ".config") / APP_ID,
        create,
    )


def user_cache_dir(create: bool = False) -> Path:
    """Folder for data that can be rebuilt (probe results, exported chart previews)."""
    return _user_dir(
        _windows_dir("LOCALAPPDATA") / APP_NAME / "Cache",
        _library("Caches"),
        _xdg("XDG_CACHE_HOME", ".cache") / APP_ID,
        create,
    )


def user_log_dir(create: bool = False) -> Path:
    """Folder for log files (the windowed build's stdout / stderr go here)."""
    return _user_dir(
        _windows_dir("LOCALAPPDATA") / APP_NAME / "Logs",
        _library("Logs"),
        _xdg("XDG_STATE_HOME", ".local/state") / APP_ID / "log",
        create,
    )


def outputs_dir(create: bool = False) -> Path:
    """Where the window proposes to write the demo's merged models: a folder the user sees in a file
    manager, never a hidden cache. ``$RAM_DESKTOP_OUTPUTS`` when set (tests, scripts), else ``RAM Desktop``
    in the Documents folder (``$XDG_DOCUMENTS_DIR`` when absolute, else ``~/Documents``), or ``~/RAM Desktop``
    where there is no Documents folder."""
    override = os.environ.get("RAM_DESKTOP_OUTPUTS")
    if override:
        return _ready(Path(override), create)
    xdg = os.environ.get("XDG_DOCUMENTS_DIR", "")
    documents = Path(xdg) if os.path.isabs(xdg) else Path.home() / "Documents"
    return _ready((documents if documents.is_dir() else Path.home()) / APP_NAME, create)


def visible_folder(folder: Path) -> Path:
    """``folder`` where a file manager shows it, else :func:`outputs_dir`: never a hidden folder (one whose
    path has a name starting with ".", such as ~/.cache) nor a cache (a model downloaded from the Hub)."""
    resolved = Path(folder).expanduser().resolve()
    caches = (cache_root().expanduser().resolve(), user_cache_dir().resolve())
    hidden = any(part.startswith(".") for part in resolved.parts)
    if hidden or any(resolved == c or c in resolved.parents for c in caches):
        return outputs_dir()
    return Path(folder)


def cache_root() -> Path:
    """The root of every cache: ``$RAM_DESKTOP_CACHE`` when set (as given), else :func:`user_cache_dir`."""
    override = os.environ.get("RAM_DESKTOP_CACHE")
    return Path(override) if override else user_cache_dir()


def cache_dir(kind: str, create: bool = False) -> Path:
    """The cache folder for one kind of rebuildable data (``probe``, ``fisher``, ``demo``)."""
    return _ready(cache_root() / kind, create)


# --- resources -----------------------------------------------------------------------------------


def is_frozen() -> bool:
    """True inside a PyInstaller bundle."""
    return bool(getattr(sys, "frozen", False)) and hasattr(sys, "_MEIPASS")


def bundle_dir() -> Path | None:
    """The unpacked bundle's root (``sys._MEIPASS``: ``_internal/`` of a one-folder build), or None."""
    return Path(sys._MEIPASS) if is_frozen() else None  # type: ignore[attr-defined]


def _resource_candidates() -> list[Path]:
    here = Path(__file__).resolve().parent
    found: list[Path] = []
    if is_frozen():
        found.append(Path(sys._MEIPASS) / "resources")  # type: ignore[attr-defined]
    found.append(here.parent / "resources")  # a source checkout or editable install: <repo>/resources
    found.append(here / "resources")  # package data, if a wheel ever ships it
    return found


def resources_dir() -> Path | None:
    """The first folder that holds the application's resources (icons, .desktop file), or None."""
    for candidate in _resource_candidates():
        if candidate.is_dir():
            return candidate
    return None


def resource_path(name: str) -> Path:
    """The path of one resource file, frozen or not; FileNotFoundError names every place looked in.

    A non-editable wheel install does not carry ``resources/``: callers should treat icons as
    optional (``try: ... except FileNotFoundError``) so that the window still opens.
    """
    for candidate in _resource_candidates():
        path = candidate / name
        if path.exists():
            return path
    looked = ", ".join(str(c) for c in _resource_candidates())
    raise FileNotFoundError(f"resource {name!r} not found (looked in {looked})")


# --- no console ----------------------------------------------------------------------------------


def _open_log() -> TextIO | None:
    try:
        folder = user_log_dir(create=True)
        path = folder / LOG_FILE
        if path.exists() and path.stat().st_size > LOG_MAX_BYTES:
            os.replace(path, path.with_name(LOG_FILE + ".1"))
        return open(path, "a", encoding="utf-8", errors="backslashreplace", buffering=1)
    except OSError:
        return None


def guard_stdio() -> Path | None:
    """Give ``sys.stdout`` / ``sys.stderr`` somewhere to go when a windowed build has none.

    A windowed PyInstaller build (Windows, the macOS .app), ``pythonw`` and a desktop launcher may
    start the process with ``sys.stdout`` / ``sys.stderr`` set to None, and then the first print(),
    logging handler or tqdm bar raises. Each missing stream is pointed at the log file in
    :func:`user_log_dir` (appended, line buffered, rotated once at 5 MB), or at ``os.devnull`` when
    that folder cannot be written. Streams that exist are left alone. Returns the log file's path
    when one was opened, else None. Safe to call more than once.
    """
    if sys.stdout is not None and sys.stderr is not None:
        return None
    stream = _open_log()
    log_path = Path(getattr(stream, "name", "")) if stream is not None else None
    if stream is None:
        stream = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115  stdout / stderr for the process's life
    if sys.stdout is None:
        sys.stdout = stream
    if sys.stderr is None:
        sys.stderr = stream
        try:  # a hard crash (segfault in a native library) still leaves a trace in the log
            import faulthandler

            faulthandler.enable(stream)
        except (OSError, ValueError, AttributeError):
            pass
    if log_path is not None:
        import datetime

        print(
            f"--- {APP_ID} started {datetime.datetime.now().isoformat(timespec='seconds')} "
            f"(pid {os.getpid()}, frozen={is_frozen()}) ---",
            file=stream,
        )
    return log_path
