"""Installing a runtime folder with the real ``uv``, offline, from wheels this module builds (a small stand-in
``torch`` package, built with ``pip wheel``), and every failure leaving a working app on the bundled torch
(docs/compute.md). Faces run in fresh processes with their own user folders."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ram_desktop.core.compute import builds, install, runtime, verify
from ram_desktop.core.compute.detect import Detection
from ram_desktop.core.errors import Cancelled, ComputeError
from ram_desktop.core.events import Reporter

from .fake_torch import build_wheel

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    base = tmp_path_factory.mktemp("wheelhouses")
    return {
        "cpu": build_wheel(base / "cpu"),
        "cuda-old-driver": build_wheel(
            base / "cuda",
            cuda="13.0",
            warn="CUDA initialization: The NVIDIA driver on your system is too old (found version 12020).",
        ),
        "broken": build_wheel(base / "broken", broken=True),
    }


def face(home: Path, *args: str, prelude: str | None = None) -> subprocess.CompletedProcess:
    """``python -m ram_desktop ARGS`` in a fresh process whose user folders live under ``home``; ``prelude``:
    Python run in that process first (to stand in for the machine, e.g. its free disk)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAM_DESKTOP_", "XDG_", "UV_"))}
    env.update(
        XDG_DATA_HOME=str(home / "data"),
        XDG_CACHE_HOME=str(home / "cache"),
        PATH=str(home / "no-bin"),
        ROCM_PATH=str(home / "no-rocm"),
        RAM_DESKTOP_CACHE=str(home / "ram-cache"),
    )
    command = [sys.executable, "-m", "ram_desktop", *args]
    if prelude is not None:
        command = [
            sys.executable,
            "-c",
            prelude + "\nimport runpy\nrunpy.run_module('ram_desktop', run_name='__main__')",
            *args,
        ]
    return subprocess.run(command, check=False, capture_output=True, text=True, env=env, timeout=600, cwd=home)


# the disk check comes before the download: a machine with less free disk than the CUDA build needs (7.2 GB)
# would be refused for that instead of reaching the network, so these runs see a roomy disk
ROOMY_DISK = (
    "import shutil, collections\n"
    "shutil.disk_usage = lambda path: collections.namedtuple('U', 'total used free')(1 << 42, 0, 1 << 42)"
)


def runtimes(home: Path) -> Path:
    return home / "data" / "ram-desktop" / "runtimes"


def torch_in_use(home: Path) -> dict[str, str]:
    done = face(home, "--compute-info")
    assert done.returncode == 0, done.stderr
    lines = [ln for ln in done.stdout.splitlines() if ": " in ln]
    info = dict(ln.split(": ", 1) for ln in lines if not ln.startswith("note: "))
    info["note"] = next((ln[6:] for ln in lines if ln.startswith("note: ")), "")
    return info


def bundled_torch_dir() -> str:
    import torch

    return str(Path(torch.__file__).parent)


def one_error_line(done: subprocess.CompletedProcess) -> str:
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("error: ")]
    assert done.returncode == 2 and len(errors) == 1, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    assert "Traceback" not in done.stderr
    return errors[0]


def merge_works(home: Path) -> None:
    """The app still merges (the demo, RAM+, on the CPU) — with whatever torch it started with."""
    assert face(home, "-q", "demo", str(home / "demo")).returncode == 0
    agents = [str(p) for p in sorted((home / "demo").iterdir()) if (p / "config.json").is_file() and p.name != "base"]
    done = face(
        home, "-q", "merge", str(home / "demo" / "base"), *agents, "--out", str(home / "merged"), "--device", "cpu"
    )
    assert done.returncode == 0, done.stderr
    assert (home / "merged" / "model.safetensors").is_file()


def test_install_from_local_wheels_offline_then_the_app_imports_it(tmp_path, wheels):
    done = face(tmp_path, "--setup-compute", "cpu", "--offline", "--find-links", str(wheels["cpu"]))
    assert done.returncode == 0, done.stdout + done.stderr
    folder = runtimes(tmp_path) / "cpu-torch2.13.0"
    assert "installed torch 2.13.0+fake (CUDA None) into " + str(folder) in done.stdout
    assert (runtimes(tmp_path) / "active").read_text().strip() == "cpu-torch2.13.0"
    marker = json.loads((folder / "runtime.json").read_text())
    assert marker["format"] == "ram-runtime/1" and marker["verified"]["matmul_equal"] is True
    assert marker["binaries"] == {"torch/lib/libtorch_fake.so": 4096} and marker["modules"] == ["torch"]
    verdict = json.loads((folder / "check.json").read_text())  # the check passed: the first start need not repeat it
    assert verdict["ok"] is True and verdict["result"]["matmul_equal"] is True
    assert not list(runtimes(tmp_path).glob("*.partial-*"))
    info = torch_in_use(tmp_path)
    assert info["torch"] == "2.13.0+fake" and info["torch file"] == str(folder / "site" / "torch")
    assert info["runtime folder"] == str(folder) and info["compute"] == "CPU" and info["note"] == ""
    # with RAM_DESKTOP_RUNTIME=off the bundled torch is used
    env_off = subprocess.run(
        [sys.executable, "-m", "ram_desktop", "--compute-info"],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        cwd=tmp_path,
        env=dict(os.environ, XDG_DATA_HOME=str(tmp_path / "data"), RAM_DESKTOP_RUNTIME="off"),
    )
    assert f"torch file: {bundled_torch_dir()}" in env_off.stdout


def test_a_gpu_build_whose_driver_cannot_run_it_installs_and_says_the_cpu_computes(tmp_path, wheels):
    done = face(tmp_path, "--setup-compute", "cuda", "--offline", "--find-links", str(wheels["cuda-old-driver"]))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "check passed on the CPU" in done.stdout
    assert (
        "note: torch (CUDA 13.0) found no usable GPU: CUDA initialization: The NVIDIA driver on your system is "
        "too old (found version 12020).; merges run on the CPU until one is"
    ) in done.stdout
    info = torch_in_use(tmp_path)
    assert info["CUDA (torch build)"] == "13.0"
    assert info["compute"] == (
        "CPU (this torch found no usable GPU: CUDA initialization: The NVIDIA driver on "
        "your system is too old (found version 12020).)"
    )


def test_a_torch_that_fails_its_check_is_never_used(tmp_path, wheels):
    assert face(tmp_path, "--setup-compute", "cpu", "--offline", "--find-links", str(wheels["cpu"])).returncode == 0
    done = face(tmp_path, "--setup-compute", "cpu", "--offline", "--find-links", str(wheels["broken"]))
    line = one_error_line(done)
    assert line.startswith("error: the new torch failed its check: ImportError: libtorch_fake.so: cannot open")
    assert line.endswith("; the bundled CPU torch stays in use")
    # the earlier runtime stays, whole and chosen; no staging folder is left
    assert sorted(p.name for p in runtimes(tmp_path).iterdir()) == ["active", "cpu-torch2.13.0"]
    assert torch_in_use(tmp_path)["torch"] == "2.13.0+fake"


def test_no_network_gives_one_line_and_a_working_cpu_app(tmp_path):
    done = face(tmp_path, "--setup-compute", "cuda", "--offline", prelude=ROOMY_DISK)  # the committed lock, no cache
    line = one_error_line(done)
    assert line.startswith("error: uv could not install torch: the packages could not be downloaded (")
    assert "check the network and retry" in line
    assert not runtimes(tmp_path).exists() or not any(runtimes(tmp_path).glob("cuda-*"))
    info = torch_in_use(tmp_path)
    assert info["torch file"] == bundled_torch_dir() and info["note"] == ""
    merge_works(tmp_path)


def test_a_damaged_or_half_written_runtime_folder_is_skipped_with_one_line(tmp_path, wheels):
    assert face(tmp_path, "--setup-compute", "cpu", "--offline", "--find-links", str(wheels["cpu"])).returncode == 0
    folder = runtimes(tmp_path) / "cpu-torch2.13.0"
    lib = folder / "site" / "torch" / "lib" / "libtorch_fake.so"
    lib.write_bytes(lib.read_bytes()[:1000])  # truncated, as by a full disk or a crash
    info = torch_in_use(tmp_path)
    assert info["torch file"] == bundled_torch_dir()
    assert info["note"] == (
        "compute runtime not used (cpu-torch2.13.0 is damaged: torch/lib/libtorch_fake.so "
        "changed size); using the bundled CPU torch"
    )
    merge_works(tmp_path)
    # a folder without its marker (an install killed before the end) is never used either
    (folder / "runtime.json").unlink()
    info = torch_in_use(tmp_path)
    assert info["torch file"] == bundled_torch_dir()
    assert info["note"] == (
        f"compute runtime not used ({folder} has no runtime.json (a half-written install?)); "
        "using the bundled CPU torch"
    )
    # ram-merge says it on stderr (not with -q), and still merges
    done = face(tmp_path, "demo", str(tmp_path / "demo2"))
    assert done.returncode == 0 and "note: compute runtime not used (" in done.stderr


# --- in-process: disk space, cancel, stale staging, removal ----------------------------------------


def plan_for(tmp_path: Path, house: Path) -> builds.Plan:
    return builds.choose(
        Detection("linux", "x86_64", f"{sys.version_info.major}.{sys.version_info.minor}"),
        "cpu",
        find_links=house,
        runtimes=tmp_path / "runtimes",
    )


@pytest.fixture
def user_dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("RAM_DESKTOP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.delenv("UV_CACHE_DIR", raising=False)


def test_not_enough_disk_is_refused_before_anything_is_fetched(tmp_path, wheels, user_dirs, monkeypatch):
    plan = plan_for(tmp_path, wheels["cpu"])

    class Usage:
        free = 50_000_000

    monkeypatch.setattr(install.shutil, "disk_usage", lambda path: Usage)
    with pytest.raises(ComputeError, match=r"^not enough free disk for the .*: 300\.\d MB needed, 50\.0 MB free on "):
        install.install(plan, offline=True)
    assert not (tmp_path / "runtimes").exists() and not (tmp_path / "cache" / "uv").exists()


def test_cancel_stops_uv_and_leaves_nothing(tmp_path, wheels, user_dirs):
    plan = plan_for(tmp_path, wheels["cpu"])
    reporter = Reporter(lambda event: reporter.cancel.cancel())
    with pytest.raises(Cancelled):
        install.install(plan, reporter, offline=True)
    assert list((tmp_path / "runtimes").iterdir()) == []
    # the retry works and removes what a killed install left behind
    dead = tmp_path / "runtimes" / "cpu-torch2.13.0.partial-999999999"
    (dead / "site").mkdir(parents=True)
    seen: list[str] = []
    done = install.install(plan, Reporter(lambda e: seen.append(e.stage)), offline=True)
    assert done.folder == plan.folder and not dead.exists() and "download" in seen and seen[-1] == "verify"
    assert runtime.check_folder(done.folder)["torch"] == "2.13.0+fake"
    assert runtime.active_folder(tmp_path / "runtimes") == done.folder
    install.remove(done.folder)
    assert not done.folder.exists() and runtime.active_folder(tmp_path / "runtimes") is None


def test_activation_puts_the_folder_first_and_a_finder_ahead_of_the_others(tmp_path, wheels, user_dirs):
    """In a fresh process: activate() → the runtime's site is on sys.path, and ``import torch`` finds it there
    even when another finder (the frozen app's importer) sits ahead of sys.path."""
    plan = plan_for(tmp_path, wheels["cpu"])
    done = install.install(plan, offline=True)
    code = textwrap.dedent(f"""
        import sys, importlib.machinery
        class Bundled:  # stands for PyInstaller's importer, which hands out the bundled torch
            def find_spec(self, name, path=None, target=None):
                return importlib.machinery.PathFinder.find_spec(name, {[str(Path(bundled_torch_dir()).parent)]!r})
        sys.meta_path.insert(0, Bundled())
        from pathlib import Path
        from ram_desktop.core.compute import runtime
        state = runtime.activate(Path({str(tmp_path / "runtimes")!r}))
        import torch
        print(state.folder, sys.path[-1], torch.__file__)
        """)
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
        env=dict(os.environ, RAM_DESKTOP_RUNTIME=""),
    ).stdout.split()
    assert out == [str(done.folder), str(done.folder / "site"), str(done.folder / "site" / "torch" / "__init__.py")]


@pytest.mark.parametrize(
    "platform,console", [("win32", "ram-merge.exe"), ("darwin", "ram-merge"), ("linux", "ram-desktop")]
)
def test_the_frozen_app_gives_uv_and_the_check_its_console_executable(tmp_path, monkeypatch, platform, console):
    """Windows' and macOS' windowed ram-desktop has no stdout for uv's interpreter query or the check's answer."""
    exe = tmp_path / ("ram-desktop.exe" if platform == "win32" else "ram-desktop")
    for name in (exe.name, console):
        (tmp_path / name).write_text("")
    monkeypatch.setattr(install.paths, "is_frozen", lambda: True)
    monkeypatch.setattr(install.sys, "executable", str(exe))
    monkeypatch.setattr(install.sys, "platform", platform)
    assert verify.console_executable() == str(tmp_path / console)
    assert verify.command(tmp_path / "rt", "cuda", ["torch", "nvidia"]) == [
        str(tmp_path / console),
        "--verify-runtime",
        str(tmp_path / "rt"),
        "cuda",
        "torch,nvidia",
    ]
