"""Install a plan's torch build into a runtime folder with ``uv`` (docs/compute.md#installing).

Steps: free disk checked first; ``uv pip install --target <staging>/site --no-deps`` from the hash-locked
file (``--require-hashes``) or from a folder of wheels; progress as bytes written and speed, measured on
uv's cache and the staging folder; cancel stops uv and removes the staging folder; uv's cache keeps every
wheel that finished, so a retry resumes (``fresh=True`` re-checks the cache and starts clean); the new
torch is verified in a child process (:mod:`.verify`); the marker is written last, the staging folder
renamed into place and chosen for the next start. Every failure raises :class:`ComputeError` with one line,
and the runtime in use (or the bundled torch) is untouched.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ... import paths
from ..errors import ComputeError
from ..events import Reporter
from .builds import Plan, human_bytes
from .runtime import BINARY_SUFFIXES, FORMAT, MARKER, check_folder, clear_active, record_verdict, set_active
from .verify import console_executable, run as run_check

VERIFY_TIMEOUT_S = 600
DISK_MARGIN = 300_000_000

__all__ = [
    "InstallResult",
    "folder_bytes",
    "install",
    "remove",
    "required_bytes",
    "uv_binary",
    "uv_cache_dir",
]


@dataclass(frozen=True)
class InstallResult:
    folder: Path
    seconds: float
    bytes_on_disk: int
    verified: dict


def uv_binary() -> Path:
    """The bundled ``uv``: beside the frozen app (``_internal/uv/uv[.exe]``), else the ``uv`` Python package's."""
    exe = "uv.exe" if sys.platform.startswith("win") else "uv"
    bundle = paths.bundle_dir()
    if bundle is not None and (bundle / "uv" / exe).is_file():
        return bundle / "uv" / exe
    try:
        from uv import find_uv_bin

        return Path(find_uv_bin())
    except (ImportError, FileNotFoundError):
        pass
    found = shutil.which("uv")
    if found:
        return Path(found)
    raise ComputeError("uv is not installed, so no torch build can be fetched: pip install uv")


def uv_cache_dir() -> Path:
    return paths.cache_dir("uv")


def folder_bytes(*folders: Path) -> int:
    total = 0
    for folder in folders:
        for root, _dirs, files in os.walk(folder):
            for name in files:
                try:
                    total += os.lstat(os.path.join(root, name)).st_size
                except OSError:
                    pass
    return total


def required_bytes(plan: Plan) -> int:
    """Free disk the install needs: the download, unpacked into uv's cache and copied into the runtime
    folder (about 2.5× the wheels), plus a margin."""
    download = plan.download_bytes
    if plan.find_links is not None:
        download = sum(p.stat().st_size for p in plan.find_links.glob("*.whl"))
    return int(download * 2.5) + DISK_MARGIN


def _free(path: Path) -> tuple[int, Path]:
    probe = path
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    return shutil.disk_usage(probe).free, probe


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def _remove_stale_staging(root: Path, log: Callable[[str], None]) -> None:
    for old in root.glob("*.partial-*"):
        pid = old.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _pid_alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
            log(f"removed {old.name}, left by an install that did not finish")


def _uv_command(plan: Plan, site: Path, offline: bool, fresh: bool) -> list[str]:
    command = [
        str(uv_binary()),
        "pip",
        "install",
        "--target",
        str(site),
        "--python",
        console_executable(),
        "--no-deps",
        "--no-config",
        "--cache-dir",
        str(uv_cache_dir()),
        "--link-mode",
        "copy",
        "--no-progress",
    ]
    if plan.find_links is not None:
        command += [
            "--no-index",
            "--find-links",
            str(plan.find_links),
            *[f"{p.name}=={p.version}" for p in plan.packages],
        ]
    else:
        assert plan.lock is not None and plan.index is not None
        command += ["--require-hashes", "--index-url", plan.index, "-r", str(plan.lock)]
    if offline:
        command.append("--offline")
    if fresh:
        command.append("--refresh")
    return command


_UV_ERROR = re.compile(r"^\s*(error|Caused by|×|╰─▶)[:\s]", re.IGNORECASE)


def _uv_reason(text: str) -> str:
    """One line from uv's error output, with advice where the cause is known."""
    lines = [ln.strip(" │╰─▶×") for ln in text.splitlines() if ln.strip()]
    picked = [ln for ln in lines if _UV_ERROR.match(ln) or "error" in ln.lower()]
    reason = (picked[-1] if picked else (lines[-1] if lines else "no output")).removeprefix("error: ")
    low = text.lower()
    if "no space left" in low or "os error 28" in low:
        return f"the disk is full ({reason}); free some space and retry"
    if "offline" in low or "failed to fetch" in low or "dns" in low or "connect" in low or "network" in low:
        return (
            f"the packages could not be downloaded ({reason}); check the network and retry "
            "(wheels downloaded so far are kept)"
        )
    if "hash mismatch" in low:
        return f"a download does not match the lock file's hash ({reason}); retry with a clean start"
    return reason


def _verify(folder: Path, variant: str, modules: list[str], reporter: Reporter) -> dict:
    """The check of the new torch in a child process; a cancel or a signal ends the child with the install."""
    result = run_check(folder, variant, modules, VERIFY_TIMEOUT_S, poll=reporter.check)
    if not result.get("ok"):
        raise ComputeError(f"the new torch failed its check: {result.get('error', 'unknown reason')}")
    return result


def _manifest(site: Path) -> tuple[list[str], dict[str, int]]:
    modules = sorted(
        {
            p.name.split(".")[0]
            for p in site.iterdir()
            if not p.name.endswith((".dist-info", ".data"))
            and p.name not in ("bin", "__pycache__")
            and (p.is_dir() or p.suffix in (".py", *BINARY_SUFFIXES))
        }
    )
    binaries: dict[str, int] = {}
    for root, _dirs, files in os.walk(site):
        for name in files:
            if name.endswith(BINARY_SUFFIXES) or ".so." in name:
                path = Path(root) / name
                binaries[path.relative_to(site).as_posix()] = path.stat().st_size
    return modules, binaries


def install(
    plan: Plan,
    reporter: Reporter | None = None,
    offline: bool = False,
    fresh: bool = False,
    log: Callable[[str], None] = lambda line: None,
) -> InstallResult:
    """Carry out an "install" plan (see the module docstring). Raises :class:`ComputeError` or
    :class:`~ram_desktop.core.errors.Cancelled`."""
    if plan.action != "install" or plan.folder is None:
        raise ComputeError(f"nothing to install: {plan.reason}")
    reporter = reporter or Reporter()
    t0 = time.monotonic()
    folder = plan.folder
    root = folder.parent
    need = required_bytes(plan)
    for where in (root, uv_cache_dir()):
        free, probe = _free(where)
        if free < need:
            raise ComputeError(
                f"not enough free disk for the {human_bytes(plan.download_bytes)} download: "
                f"{human_bytes(need)} needed, {human_bytes(free)} free on {probe}"
            )
    try:
        root.mkdir(parents=True, exist_ok=True)
        uv_cache_dir().mkdir(parents=True, exist_ok=True)
        _remove_stale_staging(root, log)
        staging = root / f"{folder.name}.partial-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        site = staging / "site"
        site.mkdir(parents=True)
    except OSError as e:
        raise ComputeError(f"cannot create the runtime folder in {root}: {e.strerror or e}") from None
    try:
        return _install_into(plan, staging, site, folder, reporter, offline, fresh, log, t0)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _stop(process: subprocess.Popen) -> None:
    try:
        if sys.platform.startswith("win"):
            process.terminate()
        else:
            os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        process.kill()
        process.wait()


def _install_into(
    plan: Plan,
    staging: Path,
    site: Path,
    folder: Path,
    reporter: Reporter,
    offline: bool,
    fresh: bool,
    log: Callable[[str], None],
    t0: float,
) -> InstallResult:
    command = _uv_command(plan, site, offline, fresh)
    log("running " + " ".join(command))
    uv_log = staging / "uv.log"
    cache = uv_cache_dir()
    start_bytes = folder_bytes(cache)
    total = plan.download_bytes
    kwargs: dict = (
        {"start_new_session": True}
        if not sys.platform.startswith("win")
        else {"creationflags": getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0)}
    )
    env = dict(os.environ, UV_NO_PROGRESS="1", NO_COLOR="1")
    with open(uv_log, "wb") as out:
        try:
            process = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, **kwargs
            )
        except OSError as e:
            raise ComputeError(f"uv could not start: {e.strerror or e}") from None
        last_t, last_b = time.monotonic(), 0
        try:
            while process.poll() is None:
                time.sleep(0.5)
                now = time.monotonic()
                written = max(0, folder_bytes(cache) - start_bytes) + folder_bytes(site)
                speed = (written - last_b) / max(now - last_t, 1e-3)
                last_t, last_b = now, written
                reporter.progress(
                    "download",
                    written,
                    max(total, written),
                    "B",
                    detail=f"{human_bytes(written)} written, {human_bytes(max(speed, 0))}/s",
                )
        except BaseException:
            _stop(process)
            raise
    text = uv_log.read_text(encoding="utf-8", errors="replace")
    if process.returncode != 0:
        raise ComputeError(f"uv could not install torch: {_uv_reason(text)}")
    if not (site / "torch" / "__init__.py").is_file():
        raise ComputeError("uv finished but the runtime folder holds no torch")
    reporter.progress("verify", 0, 1, "", detail="checking the new torch in a child process")
    modules, binaries = _manifest(site)
    verified = _verify(staging, plan.variant, modules, reporter)
    reporter.check()
    if isinstance(verified.get("file"), str):  # where torch will be found, not where it was checked
        verified["file"] = verified["file"].replace(str(staging), str(folder), 1)
    marker = {
        "format": FORMAT,
        "variant": plan.variant,
        "build": plan.build.key if plan.build else None,
        "torch": verified.get("torch"),
        "cuda": verified.get("cuda"),
        "hip": verified.get("hip"),
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "source": str(plan.find_links) if plan.find_links else plan.index,
        "lock": plan.lock.name if plan.lock else None,
        "installed": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "verified": verified,
        "modules": modules,
        "binaries": binaries,
    }
    (staging / MARKER).write_text(json.dumps(marker, indent=1), encoding="utf-8")  # last: the folder is whole
    old = folder.with_name(f"{folder.name}.old-{os.getpid()}")
    try:
        if folder.exists():
            os.replace(folder, old)
        os.replace(staging, folder)
        set_active(folder)
    except OSError as e:
        if old.exists() and not folder.exists():
            os.replace(old, folder)
        raise ComputeError(f"cannot put the runtime folder in place: {e.strerror or e}") from None
    shutil.rmtree(old, ignore_errors=True)
    check_folder(folder)
    record_verdict(folder, verified)  # the check just passed for this content: the next start need not repeat it
    # the wheels are in the runtime folder now; uv's copy of them (as large again) is only needed to resume
    # a failed install, so it goes
    subprocess.run(
        [str(uv_binary()), "cache", "clean", "--cache-dir", str(cache)],
        check=False,
        capture_output=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )
    reporter.progress("verify", 1, 1, "")
    return InstallResult(folder, time.monotonic() - t0, folder_bytes(folder), verified)


def remove(folder: Path) -> None:
    """Remove one runtime folder (and stop choosing it). The bundled torch is used from the next start."""
    from .runtime import active_folder

    if active_folder(folder.parent) == folder:
        clear_active(folder.parent)
    try:
        shutil.rmtree(folder)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise ComputeError(f"cannot remove {folder}: {e.strerror or e}") from None


def installed(root: Path) -> list[tuple[Path, dict | None, str | None]]:
    """Every runtime folder under ``root``: ``(folder, marker or None, problem or None)``."""
    from .runtime import RuntimeProblem

    found: list[tuple[Path, dict | None, str | None]] = []
    if root.is_dir():
        for folder in sorted(
            p for p in root.iterdir() if p.is_dir() and ".partial-" not in p.name and ".old-" not in p.name
        ):
            try:
                found.append((folder, check_folder(folder), None))
            except RuntimeProblem as e:
                found.append((folder, None, str(e)))
    return found
