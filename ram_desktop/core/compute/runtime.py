"""The runtime folder: a torch build installed per user, put ahead of the bundled torch at start-up
(docs/compute.md#the-runtime-folder).

Layout under :func:`~ram_desktop.core.compute.builds.runtimes_dir`::

    runtimes/
      active                      the name of the folder to use (written after it is in place)
      cuda-torch2.13.0/
        site/                     the packages (``uv pip install --target``)
        runtime.json              the marker, written last: variant, torch, Python, the check's result,
                                  the top-level modules and the size of every binary file
        check.json                the verdict of the last check of this folder's torch, and the content
                                  fingerprint it holds for

A folder is used only when its marker is there (a regular file, read with the guarded reader: its size,
nesting and field types checked), names this Python and system, every binary it lists still has its size,
and its torch passed the check in a child process (:mod:`.verify`) for the content the folder has now;
anything else (a half-written, damaged, foreign or tampered folder, a torch that raises, exits or hangs) is
skipped with one line saying why, and the bundled torch is used. The check's verdict is kept in
``check.json`` with a fingerprint of the content (the marker and the size, mtime and inode of torch's
``__init__.py``, ``version.py`` and every binary file), so a start-up checks again only after the folder
changed. Nothing here imports torch: :func:`activate` runs before it is imported.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ..errors import InputError
from ..storage.safe_read import decode_utf8, parse_json, read_bytes
from .builds import runtimes_dir
from .finder import use_folder

MARKER = "runtime.json"
FORMAT = "ram-runtime/1"
VERDICT = "check.json"
VERDICT_FORMAT = "ram-runtime-check/1"
ACTIVE_FILE = "active"
OFF_VALUES = ("0", "off", "no", "none", "bundled")
BINARY_SUFFIXES = (".so", ".pyd", ".dll", ".dylib")
MARKER_MAX_BYTES = 8 << 20  # a CUDA build's marker lists a few hundred binaries: tens of kB
SMALL_FILE_MAX_BYTES = 64 << 10  # ``active`` and ``check.json``
READ_TIMEOUT_S = 10.0  # reading the folder's files and their sizes (a hung network mount must not hang the app)
CHECK_TIMEOUT_S = 60.0  # the check of a torch whose folder changed; ``RAM_DESKTOP_RUNTIME_CHECK_S`` sets it
FINGERPRINT_FILES = ("torch/__init__.py", "torch/version.py")

__all__ = [
    "FORMAT",
    "MARKER",
    "VERDICT",
    "RuntimeProblem",
    "RuntimeStatus",
    "activate",
    "active_folder",
    "check_folder",
    "clear_active",
    "fingerprint",
    "read_marker",
    "record_verdict",
    "set_active",
    "status",
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


def _read(path: Path, max_bytes: int) -> bytes:
    try:
        return read_bytes(path, max_bytes=max_bytes)
    except InputError as e:
        raise RuntimeProblem(str(e)) from None


def _marker_fields(data: Any, where: Path) -> dict:
    """``data`` when it is a marker whose fields have the types the start-up relies on."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise RuntimeProblem(f"{where} is not a {FORMAT} marker")
    problems = []
    for key in ("python", "variant", "torch"):
        if data.get(key) is not None and not isinstance(data.get(key), str):
            problems.append(f"'{key}' is not text")
    modules = data.get("modules", ["torch"])
    if not isinstance(modules, list) or not all(isinstance(m, str) and m.isidentifier() for m in modules):
        problems.append("'modules' is not a list of module names")
    binaries = data.get("binaries", {})
    if not isinstance(binaries, dict) or not all(
        isinstance(size, int) and not isinstance(size, bool) and size >= 0 and _inside(rel)
        for rel, size in binaries.items()
    ):
        problems.append("'binaries' is not a list of files inside the folder and their sizes")
    if not isinstance(data.get("verified", {}), dict):
        problems.append("'verified' is not an object")
    if problems:
        raise RuntimeProblem(f"{where} is damaged: {'; '.join(problems)}")
    return data


def _inside(rel: str) -> bool:
    parts = rel.replace("\\", "/").split("/")
    return bool(rel) and not rel.startswith("/") and ".." not in parts and ":" not in parts[0]


def _marker(folder: Path) -> tuple[bytes, dict]:
    """The marker's bytes and its checked fields, or :class:`RuntimeProblem` when it is missing, unreadable
    or not a RAM Desktop marker with fields of the right types."""
    path = folder / MARKER
    if not os.path.lexists(path):
        raise RuntimeProblem(f"{folder} has no {MARKER} (a half-written install?)")
    data = _read(path, MARKER_MAX_BYTES)
    return data, _marker_fields(_parse(data, path), path)


def read_marker(folder: Path) -> dict:
    """The folder's marker (see :func:`_marker`)."""
    return _marker(folder)[1]


def _parse(data: bytes, where: Path) -> Any:
    try:
        return parse_json(decode_utf8(data, str(where)), str(where))
    except InputError as e:
        raise RuntimeProblem(str(e)) from None


def _stat_line(site: Path, rel: str) -> str:
    try:
        st = os.stat(site / rel)
    except OSError:
        return f"{rel} missing"
    return f"{rel} {st.st_size} {st.st_mtime_ns} {st.st_ino}"


def _fingerprint(folder: Path, marker_bytes: bytes, marker: dict) -> str:
    digest = hashlib.sha256(f"{sys.version}\0".encode())
    digest.update(marker_bytes)
    for rel in (*FINGERPRINT_FILES, *sorted(marker.get("binaries", {}))):
        digest.update(_stat_line(folder / "site", rel).encode("utf-8", "surrogateescape") + b"\0")
    return digest.hexdigest()


def fingerprint(folder: Path) -> str:
    """A cheap fingerprint of the folder's content, for the check's verdict: the Python version, the marker, and
    the size, mtime and inode of torch's ``__init__.py``, ``version.py`` and every binary the marker lists
    (stat calls only: no file of the GBs is read)."""
    return _fingerprint(folder, *_marker(folder))


def _check_static(folder: Path) -> tuple[dict, str]:
    """The marker of a folder that passes every check short of importing its torch, and its fingerprint."""
    data, marker = _marker(folder)
    if marker.get("python") != _python_tag():
        raise RuntimeProblem(f"{folder.name} was made for Python {marker.get('python')}, this is {_python_tag()}")
    site = folder / "site"
    if not (site / "torch" / "__init__.py").is_file():
        raise RuntimeProblem(f"{folder.name} is damaged: torch/__init__.py is missing")
    for rel, size in marker.get("binaries", {}).items():
        try:
            if (site / rel).stat().st_size != size:
                raise RuntimeProblem(f"{folder.name} is damaged: {rel} changed size")
        except OSError:
            raise RuntimeProblem(f"{folder.name} is damaged: {rel} is missing") from None
    return marker, _fingerprint(folder, data, marker)


def check_folder(folder: Path) -> dict:
    """The marker of a folder that passes every check short of importing its torch, else
    :class:`RuntimeProblem` saying why it is not usable."""
    return _check_static(folder)[0]


def _read_verdict(folder: Path) -> dict | None:
    """The last check's verdict kept in the folder, or None when there is none that can be trusted."""
    path = folder / VERDICT
    if not os.path.lexists(path):
        return None
    try:
        data = _parse(_read(path, SMALL_FILE_MAX_BYTES), path)
    except RuntimeProblem:
        return None
    if (
        not isinstance(data, dict)
        or data.get("format") != VERDICT_FORMAT
        or not isinstance(data.get("fingerprint"), str)
        or not isinstance(data.get("ok"), bool)
        or not isinstance(data.get("reason") or "", str)
    ):
        return None
    return data


def record_verdict(folder: Path, result: Mapping[str, Any], print_: str | None = None) -> None:
    """Keep the check's ``result`` for the folder's content now (``print_``: its fingerprint, when known).
    Written to a temporary file and renamed; a folder that cannot be written keeps no verdict (the next start
    checks again)."""
    verdict = {
        "format": VERDICT_FORMAT,
        "fingerprint": print_ or fingerprint(folder),
        "ok": result.get("ok") is True,
        "reason": None if result.get("ok") is True else str(result.get("error") or "unknown reason"),
        "checked": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "result": dict(result),
    }
    tmp = folder / f"{VERDICT}.tmp-{os.getpid()}"
    try:
        tmp.write_text(json.dumps(verdict, indent=1), encoding="utf-8")
        os.replace(tmp, folder / VERDICT)
    except OSError:
        try:
            tmp.unlink()
        except OSError:
            pass


def _chosen(root: Path) -> Path | None:
    """The folder ``active`` names; None when none is chosen; :class:`RuntimeProblem` when ``active`` is
    not a small text file naming a folder beside it."""
    path = root / ACTIVE_FILE
    if not os.path.lexists(path):
        return None
    data = _read(path, SMALL_FILE_MAX_BYTES)
    try:
        name = decode_utf8(data, str(path)).strip()
    except InputError as e:
        raise RuntimeProblem(str(e)) from None
    if not name or "/" in name or "\\" in name or name in (".", "..") or "\n" in name or "\0" in name:
        raise RuntimeProblem(f"{path} does not name a runtime folder")
    return root / name


def active_folder(root: Path | None = None) -> Path | None:
    """The runtime folder ``active`` names, or None when none is chosen (or ``active`` cannot be read)."""
    try:
        return _chosen(root or runtimes_dir())
    except RuntimeProblem:
        return None


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


T = TypeVar("T")


def _within(seconds: float, work: Callable[[], T], what: str) -> T:
    """``work()``, run in a daemon thread so that a read that blocks (a hung network mount) cannot hold the
    start-up longer than ``seconds``: :class:`RuntimeProblem` then, and the thread is left behind."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = work()
        except BaseException as e:  # noqa: BLE001  handed to the caller's thread
            box["error"] = e

    thread = threading.Thread(target=target, name="runtime-read", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise RuntimeProblem(f"{what} did not answer within {seconds:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


@contextlib.contextmanager
def _termination_ends_the_check() -> Iterator[None]:
    """While the start-up waits for the check: SIGTERM and SIGHUP end this process (exit 128 + the signal)
    through ``SystemExit``, so that the check's child process ends with it (by default the signal would end
    this process alone, and a torch that hangs would keep its child running). Signals set to be ignored stay
    ignored; outside the main thread nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {}
    for name in ("SIGTERM", "SIGHUP"):
        number = getattr(signal, name, None)
        if number is not None and signal.getsignal(number) is signal.SIG_DFL:
            saved[number] = signal.signal(number, _exit_on_signal)
    try:
        yield
    finally:
        for number, handler in saved.items():
            signal.signal(number, handler)


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _check_timeout(env: Mapping[str, str]) -> float:
    try:
        value = float(env.get("RAM_DESKTOP_RUNTIME_CHECK_S", ""))
    except ValueError:
        return CHECK_TIMEOUT_S
    return value if 0 < value < 86400 else CHECK_TIMEOUT_S


def _usable(root: Path, env: Mapping[str, str]) -> tuple[Path, dict] | None:
    """The chosen folder and its marker when its torch may be used; None when none is chosen;
    :class:`RuntimeProblem` saying why not otherwise."""

    def read() -> tuple[Path, dict, str, dict | None] | None:
        folder = _chosen(root)
        if folder is None:
            return None
        marker, print_ = _check_static(folder)
        return folder, marker, print_, _read_verdict(folder)

    found = _within(READ_TIMEOUT_S, read, f"the runtime folder in {root}")
    if found is None:
        return None
    folder, marker, print_, verdict = found
    if "torch" in sys.modules:
        raise RuntimeProblem("torch was already imported")
    if verdict is None or verdict["fingerprint"] != print_:
        from .verify import run

        with _termination_ends_the_check():
            result = run(
                folder, marker.get("variant") or "cpu", marker.get("modules") or ["torch"], _check_timeout(env)
            )
        record_verdict(folder, result, print_)
        verdict = {"ok": result.get("ok") is True, "reason": result.get("error")}
    if not verdict["ok"]:
        raise RuntimeProblem(f"{folder.name}'s torch failed its check: {verdict.get('reason') or 'unknown reason'}")
    return folder, marker


def _one_line(text: str, limit: int = 400) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def activate(root: Path | None = None, env: Mapping[str, str] | None = None) -> RuntimeStatus:
    """At start-up, before torch is imported: use the chosen runtime folder if it is usable.

    ``RAM_DESKTOP_RUNTIME=off`` keeps the bundled torch. Returns (and remembers, see :func:`status`) what
    happened; never raises (but for ``KeyboardInterrupt``): anything wrong with the folder leaves the bundled
    torch in use and says why in one line."""
    global _STATUS
    env = os.environ if env is None else env
    setting = env.get("RAM_DESKTOP_RUNTIME", "")
    if setting and setting.strip().lower() in OFF_VALUES:
        _STATUS = RuntimeStatus()
        return _STATUS
    try:
        found = _usable(root or runtimes_dir(), env)
    except RuntimeProblem as e:
        reason = str(e)
    except Exception as e:  # noqa: BLE001  the runtime must never stop the app: a bug here is said, not raised
        reason = f"{type(e).__name__}: {e}"
    else:
        if found is None:
            _STATUS = RuntimeStatus()
            return _STATUS
        folder, marker = found
        use_folder(folder, marker.get("modules") or ["torch"])
        _STATUS = RuntimeStatus(folder, marker.get("variant"), marker.get("torch"), None, marker)
        return _STATUS
    _STATUS = RuntimeStatus(message=_one_line(f"compute runtime not used ({reason}); using the bundled CPU torch"))
    return _STATUS
