"""README's command-line examples run (issue 47): every fenced block marked ``<!-- runnable -->`` runs, command
by command in the order a reader meets them, in one empty folder, each exiting 0 (``ram-merge`` as a reader
has it: the real CLI in a fresh process). The blocks use the built-in demo and small limits; about a minute."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = "<!-- runnable -->"


def runnable_blocks(text: str) -> list[str]:
    """The fenced blocks right after a marker line, in order."""
    lines = text.splitlines()
    blocks = []
    for i, line in enumerate(lines):
        if line.strip() == MARKER:
            assert lines[i + 1].startswith("```"), f"README line {i + 1}: {MARKER} must stand right before a fence"
            end = lines.index("```", i + 2)
            blocks.append("\n".join(lines[i + 2 : end]))
    return blocks


def commands(block: str) -> list[str]:
    """One command per line, a trailing backslash joining the next line; blank lines and comments left out."""
    joined = re.sub(r"\\\n\s*", " ", block)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def test_readme_starts_with_make_demo_and_make_test():
    first = re.search(r"```\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)
    assert first is not None
    assert [line.split("#")[0].strip() for line in first.group(1).splitlines()] == ["make demo", "make test"]


def test_readmes_examples_run_in_order_in_an_empty_folder(tmp_path):
    blocks = runnable_blocks((ROOT / "README.md").read_text(encoding="utf-8"))
    run = [c for b in blocks for c in commands(b)]
    assert any(c.startswith("ram-merge merge") for c in run) and any(c.startswith("ram-merge eval") for c in run)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "ram-merge"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m ram_desktop "$@"\n')
    wrapper.chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "RAM_DESKTOP_", "PYTEST"))}
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        HF_HUB_OFFLINE="1",
        HF_HOME=str(tmp_path / "hf-home"),
        RAM_DESKTOP_CACHE=str(tmp_path / "ram-cache"),
        XDG_CONFIG_HOME=str(tmp_path / "config"),
        QT_QPA_PLATFORM="offscreen",
    )
    for command in run:
        done = subprocess.run(
            ["bash", "-c", command], cwd=work, env=env, capture_output=True, text=True, timeout=300, check=False
        )
        assert done.returncode == 0, f"README: {command}\nexit {done.returncode}\n{done.stdout}\n{done.stderr}"
