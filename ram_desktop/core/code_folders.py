"""Folders whose Python code the user has been told runs: a suite's ``python:FILE.py:FUNCTION`` scorer.

A python scorer runs with the user's rights. The first time an evaluation runs a scorer from a folder
that RAM Desktop did not write and the user has not seen named before, the faces say so: the command
line prints one ``note:`` line, the window asks Run / Cancel (docs/evaluate.md, Scorers). The folders
already known are kept in ``user_config_dir()/code-folders.json`` (``{"format": "ram-code-folders/1",
"folders": [absolute paths]}``); the demo's suites folder is recorded when the app writes it.

A record that cannot be read counts as empty (every folder is named again); one that cannot be
written is logged and the evaluation goes on.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger("ram_desktop")
RECORD = "code-folders.json"
FORMAT = "ram-code-folders/1"


def record_file() -> Path:
    from ..paths import user_config_dir

    return user_config_dir() / RECORD


def known_folders() -> set[Path]:
    """The folders recorded so far (empty when the record is missing or unreadable)."""
    try:
        data = json.loads(record_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return set()
    folders = data.get("folders") if isinstance(data, dict) and data.get("format") == FORMAT else None
    return {Path(f) for f in folders if isinstance(f, str)} if isinstance(folders, list) else set()


def new_code_folders(folders: Iterable[Path]) -> list[Path]:
    """Those of ``folders`` (resolved, in order, each once) not recorded yet."""
    known = known_folders()
    seen: dict[Path, None] = {}
    for folder in folders:
        path = Path(folder).resolve()
        if path not in known:
            seen.setdefault(path, None)
    return list(seen)


def remember_code_folders(folders: Iterable[Path]) -> None:
    """Record ``folders`` (resolved) as known; written atomically, an OS error only logged."""
    paths = {Path(f).resolve() for f in folders}
    known = known_folders()
    if paths <= known:
        return
    file = record_file()
    data = {"format": FORMAT, "folders": sorted(str(p) for p in known | paths)}
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{file.name}.", suffix=".partial", dir=file.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(json.dumps(data, indent=1) + "\n")
            os.replace(tmp, file)
        finally:
            Path(tmp).unlink(missing_ok=True)
    except OSError as e:
        log.warning("cannot record the scorer folders in %s (%s); they will be named again", file, e.strerror or e)
