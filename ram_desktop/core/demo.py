"""The built-in demo: a small real model and three agents RL-trained from it, with their test suites.

The files ship under ``ram_desktop/resources/demo/`` (``reproduction/`` regenerates them): a
character-level Qwen2ForCausalLM base trained from scratch on three toy agent tasks, and one agent
per task trained from it with GRPO and saved in bf16 (docs/contracts.md, The built-in demo). ``write_demo`` copies them
out with ``demo.json``:

    {"base": "base", "agents": [{"name": "coder", "path": "coder", "suite": "suites/code"}, ...]}

The synthetic generator the demo used to be lives on in ``tests/synthetic.py``.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
from pathlib import Path

from .errors import InputError
from .storage import manifest as files
from .storage.safe_read import os_reason, read_bytes, read_json

log = logging.getLogger("ram_desktop")

MANIFEST = "demo.json"
AGENTS = {"coder": "code", "tool": "tool", "memory": "memory"}  # agent folder -> the task (suite) it learned
SHIPPED_STAMP = ".shipped-demo"  # in the cached demo: the fingerprint of the shipped demo it was copied from


def demo_resources() -> Path:
    """The shipped demo folder (in a source checkout, a wheel, or the frozen bundle)."""
    return Path(__file__).resolve().parent.parent / "resources" / "demo"


def demo_fingerprint(folder: Path | str | None = None) -> str:
    """SHA-256 over every file of a demo folder (default: the shipped one), names and bytes: a cached
    copy is current only while this matches the shipped demo's (an update may ship other agents)."""
    folder = Path(folder) if folder is not None else demo_resources()
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(path.relative_to(folder).as_posix().encode() + b"\0")
        h.update(read_bytes(path))
    return h.hexdigest()


def read_manifest(folder: Path | str) -> dict:
    """``demo.json`` of a demo folder, its paths resolved against the folder."""
    folder = Path(folder)
    path = folder / MANIFEST
    data = read_json(path)  # a FIFO, bad JSON, repeated keys, deep nesting, non-UTF-8: refused naming the file
    try:
        return {
            "base": folder / data["base"],
            "agents": [
                {"name": a["name"], "path": folder / a["path"], "suite": folder / a["suite"]} for a in data["agents"]
            ],
        }
    except (KeyError, TypeError, AttributeError) as exc:
        raise InputError(f"{path}: not a readable demo manifest ({exc}); run `ram-merge demo DIR` again") from exc


def write_demo(folder: Path | str, seed: int | None = None, record_code: bool = True) -> tuple[Path, list[Path]]:
    """Write the demo (``base/``, one folder per agent, ``suites/``, ``demo.json``) under ``folder``.

    Returns (base, agents). ``seed`` is accepted for older callers and ignored: the shipped demo is
    seed 0 of ``reproduction/``. ``record_code``: record the suites' reward-function folders as written by
    the app (``code_folders``), so that evaluating them names no foreign code.
    """
    source = demo_resources()
    if not (source / MANIFEST).is_file():
        raise InputError(f"the built-in demo is missing from {source}: reinstall RAM Desktop")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        for item in sorted(source.iterdir()):
            target = folder / item.name
            if item.is_dir():
                shutil.copytree(item, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(item, target)
    except shutil.SpecialFileError as e:  # a FIFO or socket where a demo file goes: never opened
        raise InputError(f"{folder}: cannot write the demo there: {e}; remove it or choose another folder") from None
    except OSError as e:
        raise InputError(f"{e.filename or folder}: cannot write the demo ({os_reason(e)})") from None
    manifest = read_manifest(folder)
    if record_code:
        record_demo_code(folder)
    return manifest["base"], [a["path"] for a in manifest["agents"]]


def record_demo_code(folder: Path) -> None:
    """The demo's python scorers are the app's own: their folders are recorded as known."""
    from .code_folders import remember_code_folders

    remember_code_folders(file.parent for file in (folder / "suites").rglob("*.py"))


def demo_folder() -> Path:
    """Where the applications keep their copy of the demo (``paths.cache_dir("demo")``)."""
    from ..paths import cache_dir

    return cache_dir("demo")


def ensure_demo(folder: Path | None = None) -> tuple[Path, list[Path]]:
    """The built-in demo (real base, three RL-trained agents, suites), copied into the cache and reused
    while it matches the shipped one (``SHIPPED_STAMP`` holds the shipped demo's fingerprint).

    Returns (base, agents); raises ``InputError`` when it cannot be written."""
    folder = folder or demo_folder()
    base, agents = folder / "base", [folder / name for name in AGENTS]
    shipped = demo_fingerprint()
    stamp = folder / SHIPPED_STAMP
    ready = [(p / "config.json").is_file() for p in [base, *agents]] + [(folder / MANIFEST).is_file()]
    if all(ready) and (base / "model.safetensors").is_file() and stamp.is_file() and stamp.read_text() == shipped:
        why = _copy_changed(folder, shipped)
        if why is None:
            record_demo_code(folder)  # a copy made before the record existed
            return base, agents
        log.warning("the cached demo in %s is not the shipped one (%s); copying it again", folder, why)
    tmp = folder.with_name(folder.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    base_t, agents_t = write_demo(tmp, record_code=False)
    (tmp / SHIPPED_STAMP).write_text(shipped)
    files.write_manifest(tmp, shipped=shipped)  # a changed copy is copied again, never merged
    shutil.rmtree(folder, ignore_errors=True)
    tmp.replace(folder)
    record_demo_code(folder)
    return folder / base_t.name, [folder / a.name for a in agents_t]


def _bytecode(item: Path) -> bool:
    """Python's ``__pycache__`` beside the suites' reward file (written when a scorer imports it)."""
    return item.name == "__pycache__" and item.is_dir()


def _copy_changed(folder: Path, shipped: str) -> str | None:
    """Why the cached copy in ``folder`` cannot be used (None: it can): its ``ram-manifest.json`` must name the
    shipped demo and list every file with its size and SHA-256, unchanged, and nothing else (but bytecode)."""
    manifest = files.read_manifest(folder)
    if manifest is None or manifest.get("shipped") != shipped:
        return "no manifest of this demo"
    changed = files.foreign_entries(folder, tolerated=_bytecode) + [
        n for n in manifest["files"] if not (folder / n).is_file()
    ]
    return f"changed: {', '.join(changed[:3])}" if changed else None


def demo_suites(folder: Path | str, agents: list[Path] | list[str] | None = None) -> list[Path]:
    """The test suites a demo folder's ``demo.json`` names: one per agent of ``agents``, in that order,
    or without ``agents`` each distinct suite in the manifest's order. [] when the folder has no manifest.

    Raises ``InputError`` for a manifest that cannot be read or does not name a suite for an agent."""
    if not (Path(folder) / MANIFEST).is_file():
        return []
    named = read_manifest(folder)["agents"]
    if agents is None:
        return list(dict.fromkeys(Path(a["suite"]).resolve() for a in named))
    by_path = {Path(a["path"]).resolve(): Path(a["suite"]) for a in named}
    missing = [str(a) for a in agents if Path(a).resolve() not in by_path]
    if missing:
        raise InputError(f"{Path(folder) / MANIFEST}: names no suite for {', '.join(missing)}")
    return [by_path[Path(a).resolve()] for a in agents]
