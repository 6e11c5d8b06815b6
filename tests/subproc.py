"""Running the real CLI in a fresh process, with a time limit (a hang fails the test instead of blocking it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def cli(
    tmp_path: Path, *args: str, timeout: float = 120, prelude: str | None = None, quiet: bool = True
) -> subprocess.CompletedProcess:
    """``python -m ram_desktop -q args`` in a new process whose caches live under ``tmp_path`` (``quiet=False``:
    without ``-q``, so its warnings are printed).

    ``prelude``: Python run in that process before the CLI (to simulate an OS error by patching); the
    CLI then runs through ``ram_desktop.cli.entry`` as ``python -m ram_desktop`` runs it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "RAM_DESKTOP_", "PYTEST"))}
    env.update(
        HF_HUB_OFFLINE="1",
        HF_HUB_CACHE=str(tmp_path / "hub"),
        HF_HOME=str(tmp_path / "hf-home"),
        RAM_DESKTOP_CACHE=str(tmp_path / "ram-cache"),
        XDG_CONFIG_HOME=str(tmp_path / "config"),
        QT_QPA_PLATFORM="offscreen",
    )
    flags = ["-q"] if quiet else []
    if prelude is None:
        command = [sys.executable, "-m", "ram_desktop", *flags, *args]
    else:
        code = prelude + "\nfrom ram_desktop.cli import entry\nentry()\n"
        command = [sys.executable, "-c", code, *flags, *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=timeout, check=False)


def refused(done: subprocess.CompletedProcess, *fragments: str) -> str:
    """Exit 2, exactly one stderr line ``error: ...`` holding ``fragments``, no traceback."""
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), (
        f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    )
    assert "Traceback" not in done.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]
