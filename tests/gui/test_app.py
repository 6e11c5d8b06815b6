"""``ram-desktop`` entry points, run as a user runs them (a separate process, offscreen)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(args, tmp_path, timeout=120):
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", RAM_DESKTOP_CACHE=str(tmp_path / "cache"),
               XDG_CONFIG_HOME=str(tmp_path / "config"), PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "ram_desktop", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_demo_screenshot_headless(tmp_path):
    shot = tmp_path / "shot.png"
    proc = _run(["--demo", "--screenshot", str(shot)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    assert (tmp_path / "cache" / "demo" / "base" / "model.safetensors").is_file()  # demo generated into the cache


def test_screenshot_of_a_bad_recipe_exits_2_with_one_error_line(tmp_path):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("format: ram-recipe/1\nbase: /nowhere/base\nagents: [/nowhere/a]\n")
    proc = _run([str(recipe), "--screenshot", str(tmp_path / "x.png")], tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error:")
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "x.png").exists()


def test_core_imports_without_qt(tmp_path):
    """The engine never imports Qt (ARCHITECTURE.md): import it with PySide6 blocked."""
    code = ("import sys; sys.modules['PySide6'] = None; sys.modules['pyqtgraph'] = None\n"
            "import ram_desktop.core.engine, ram_desktop.core.methods, ram_desktop.core.recipe, ram_desktop.cli\n"
            "assert not [m for m in sys.modules if m.startswith(('PySide6.', 'pyqtgraph.'))]\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
