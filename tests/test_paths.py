"""ram_desktop.paths: standard user folders, resource lookup, and the no-console guard."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ram_desktop import paths


@pytest.fixture
def linux(monkeypatch, tmp_path):
    monkeypatch.setattr(paths, "_platform", lambda: "linux")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for var in ("XDG_DATA_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path / "home"


def test_xdg_defaults(linux):
    assert paths.user_data_dir() == linux / ".local/share/ram-desktop"
    assert paths.user_config_dir() == linux / ".config/ram-desktop"
    assert paths.user_cache_dir() == linux / ".cache/ram-desktop"
    assert paths.user_log_dir() == linux / ".local/state/ram-desktop/log"
    assert not paths.user_data_dir().exists()  # nothing is created unless asked


def test_xdg_variables_absolute_only(linux, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # the XDG spec says: ignore
    assert paths.user_config_dir(create=True) == tmp_path / "cfg" / "ram-desktop"
    assert (tmp_path / "cfg" / "ram-desktop").is_dir()
    assert paths.user_cache_dir() == linux / ".cache/ram-desktop"


def test_windows_and_macos(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(paths, "_platform", lambda: "windows")
    monkeypatch.setenv("APPDATA", str(tmp_path / "Roaming"))
    monkeypatch.setenv("LOCALAPPDATA", str(tmp_path / "Local"))
    assert paths.user_config_dir() == tmp_path / "Roaming" / "RAM Desktop"
    assert paths.user_data_dir() == tmp_path / "Local" / "RAM Desktop"
    assert paths.user_log_dir() == tmp_path / "Local" / "RAM Desktop" / "Logs"
    monkeypatch.setattr(paths, "_platform", lambda: "macos")
    assert paths.user_config_dir() == Path.home() / "Library/Application Support/RAM Desktop"
    assert paths.user_cache_dir() == Path.home() / "Library/Caches/RAM Desktop"
    assert paths.user_log_dir() == Path.home() / "Library/Logs/RAM Desktop"


def test_resources_found_unfrozen():
    assert not paths.is_frozen()
    assert paths.resource_path("ram-desktop.png").stat().st_size > 0
    assert paths.resource_path("ram-desktop.desktop").read_text().startswith("[Desktop Entry]")
    with pytest.raises(FileNotFoundError, match="no-such-icon"):
        paths.resource_path("no-such-icon.png")


def test_frozen_resources_come_from_meipass(monkeypatch, tmp_path):
    (tmp_path / "resources").mkdir()
    (tmp_path / "resources" / "x.txt").write_text("frozen")
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path), raising=False)
    assert paths.bundle_dir() == tmp_path
    assert paths.resource_path("x.txt").read_text() == "frozen"


def test_guard_stdio_without_console(tmp_path):
    """A windowed build starts with sys.stdout / sys.stderr = None: output goes to the log file."""
    code = textwrap.dedent("""
        import sys
        sys.stdout = None
        sys.stderr = None
        from ram_desktop.paths import guard_stdio
        log = guard_stdio()
        print("to stdout")
        print("to stderr", file=sys.stderr)
        import logging
        logging.getLogger("x").error("via logging")
        assert guard_stdio() is None  # streams exist now: second call changes nothing
        sys.stdout.flush()
        open(sys.argv[1], "w").write(str(log))
    """)
    env = {"HOME": str(tmp_path), "XDG_STATE_HOME": str(tmp_path / "state"), "PATH": "/usr/bin:/bin"}
    marker = tmp_path / "log-path.txt"
    subprocess.run(
        [sys.executable, "-c", code, str(marker)], env=env, check=True, cwd=Path(__file__).resolve().parents[1]
    )
    log = Path(marker.read_text())
    assert log == tmp_path / "state" / "ram-desktop" / "log" / "ram-desktop.log"
    text = log.read_text()
    assert "to stdout" in text and "to stderr" in text and "via logging" in text


def test_guard_stdio_leaves_a_console_alone():
    before = sys.stdout, sys.stderr
    assert paths.guard_stdio() is None
    assert (sys.stdout, sys.stderr) == before


def test_every_cache_path_comes_from_paths(monkeypatch, tmp_path):
    from ram_desktop.core.engine import probe
    from ram_desktop.evaluate import fisher

    monkeypatch.setenv("RAM_DESKTOP_CACHE", str(tmp_path / "shared"))
    assert probe.cache_dir() == paths.cache_dir("probe") == tmp_path / "shared" / "probe"
    assert fisher.cache_root() == paths.cache_dir("fisher") == tmp_path / "shared" / "fisher"
    monkeypatch.delenv("RAM_DESKTOP_CACHE")
    assert probe.cache_dir() == paths.user_cache_dir() / "probe"
