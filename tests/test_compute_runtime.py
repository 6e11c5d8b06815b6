"""A damaged compute runtime folder never stops the app (docs/compute.md#the-runtime-folder): whatever is wrong
with it (a torch that raises, does not parse, exits or hangs; a marker of the wrong types, nested too deep, or
a FIFO; a FIFO for ``active``), ``--compute-info``, a merge that needs torch and the window start on the
bundled CPU torch and say why in one line. The folders are laid out by hand (``fake_torch.runtime_folder``)
and damaged here; every face runs in a fresh process with its own user folders. Also: the check's verdict is
kept for the folder's content (a start-up checks again only after it changed), and a signal during an
install's check ends the check's process and removes the staging folder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import make_models
from .fake_torch import alive, build_wheel, hanging, runtime_folder, torch_source

pytestmark = pytest.mark.skipif(sys.platform.startswith("win"), reason="FIFOs and process groups are POSIX")

FACE_TIMEOUT_S = 120  # a face that hangs fails the test after this long
CHECK_S = "4"  # RAM_DESKTOP_RUNTIME_CHECK_S: the start-up check's limit, for the torch that hangs

WINDOW = """
import sys
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QMainWindow
from ram_desktop.gui import app  # (imports no torch: the start-up must be first to)

show = QMainWindow.show
def show_then_report(window):
    show(window)
    def report():
        print("LABEL:", window.compute.label.text())
        print("TIP:", window.compute.label.toolTip().replace("\\n", " | "))
        QApplication.instance().quit()
    QTimer.singleShot(0, report)
QMainWindow.show = show_then_report
sys.argv = ["ram-desktop"]
app.entry()
"""


def env_for(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAM_DESKTOP_", "XDG_", "UV_"))}
    env.update(
        XDG_DATA_HOME=str(home / "data"),
        XDG_CONFIG_HOME=str(home / "config"),
        XDG_CACHE_HOME=str(home / "cache"),
        RAM_DESKTOP_CACHE=str(home / "ram-cache"),
        PATH=str(home / "no-bin"),
        ROCM_PATH=str(home / "no-rocm"),
        QT_QPA_PLATFORM="offscreen",
        RAM_DESKTOP_RUNTIME_CHECK_S=CHECK_S,
    )
    env.update(extra)
    return env


def run(home: Path, *command: str, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *command],
        capture_output=True,
        text=True,
        env=env_for(home, **extra),
        cwd=home,
        timeout=FACE_TIMEOUT_S,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def runtimes(home: Path) -> Path:
    return home / "data" / "ram-desktop" / "runtimes"


def bundled_torch_dir() -> str:
    import torch

    return str(Path(torch.__file__).parent)


def compute_info(home: Path) -> tuple[dict[str, str], str]:
    """``--compute-info``'s fields and its note line (exit 0 and no traceback asserted)."""
    done = run(home, "-m", "ram_desktop", "--compute-info")
    assert done.returncode == 0 and "Traceback" not in done.stderr, f"exit {done.returncode}\n{done.stderr}"
    lines = done.stdout.splitlines()
    notes = [ln.removeprefix("note: ") for ln in lines if ln.startswith("note: ")]
    assert len(notes) <= 1
    return dict(ln.split(": ", 1) for ln in lines if ": " in ln and not ln.startswith("note: ")), "".join(notes)


TRUNCATED = torch_source()[: torch_source().index("def randint") + len("def randint(low, high")]

# name: (torch's __init__.py or None for the working one, marker fields, what the folder becomes, the reason)
DAMAGE = {
    "import-error": (
        "raise ImportError('libtorch_cpu.so: cannot open shared object file')\n",
        {},
        None,
        ("cpu-torch2.13.0's torch failed its check: ImportError: libtorch_cpu.so: cannot open shared object file"),
    ),
    "truncated-init": (TRUNCATED, {}, None, "cpu-torch2.13.0's torch failed its check: SyntaxError: "),
    "sys-exit": ("import sys\nsys.exit(3)\n", {}, None, "cpu-torch2.13.0's torch failed its check: SystemExit: 3"),
    "hangs": (
        "import time\ntime.sleep(3600)\n",
        {},
        None,
        f"cpu-torch2.13.0's torch failed its check: it did not finish within {CHECK_S} s",
    ),
    "modules-a-number": (None, {"modules": 7}, None, "{marker} is damaged: 'modules' is not a list of module names"),
    "modules-hold-a-list": (
        None,
        {"modules": [["torch"]]},
        None,
        "{marker} is damaged: 'modules' is not a list of module names",
    ),
    "marker-100k-deep": (None, {}, "deep", "{marker}: JSON nested too deeply"),
    "marker-a-fifo": (None, {}, "marker-fifo", "{marker}: is a named pipe (FIFO), not a file"),
    "active-a-fifo": (None, {}, "active-fifo", "{active}: is a named pipe (FIFO), not a file"),
}


def damaged_home(home: Path, case: str) -> Path:
    init, fields, become, _reason = DAMAGE[case]
    folder = runtime_folder(runtimes(home), init, **fields)
    if become == "deep":
        depth = 100_000
        (folder / "runtime.json").write_text('{"format": "ram-runtime/1", "x": ' + "[" * depth + "]" * depth + "}")
    elif become == "marker-fifo":
        (folder / "runtime.json").unlink()
        os.mkfifo(folder / "runtime.json")
    elif become == "active-fifo":
        (runtimes(home) / "active").unlink()
        os.mkfifo(runtimes(home) / "active")
    return folder


def expected_note(home: Path, case: str) -> str:
    folder = runtimes(home) / "cpu-torch2.13.0"
    reason = DAMAGE[case][3].format(marker=folder / "runtime.json", active=runtimes(home) / "active")
    return f"compute runtime not used ({reason}"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return make_models(tmp_path_factory.mktemp("models"))


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_damaged_runtime_keeps_the_bundled_torch_in_every_face(tmp_path, models, case):
    damaged_home(tmp_path, case)
    note = expected_note(tmp_path, case)
    # --compute-info: the bundled torch, and one line saying why
    info, said = compute_info(tmp_path)
    assert info["torch file"] == bundled_torch_dir() and info["runtime folder"] == "none (the bundled torch)"
    assert said.startswith(note) and said.endswith("); using the bundled CPU torch"), said
    # a merge on the torch path (no fused kernels: it imports torch)
    base, agents = models
    out = tmp_path / "merged"
    done = run(
        tmp_path,
        "-m",
        "ram_desktop",
        "merge",
        str(base),
        *map(str, agents),
        "--out",
        str(out),
        "--method",
        "ties",
        "--density",
        "0.3",
        "--device",
        "cpu",
        RAM_DESKTOP_KERNELS="0",
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, f"exit {done.returncode}\n{done.stderr}"
    assert (out / "model.safetensors").is_file()
    notes = [ln for ln in done.stderr.splitlines() if ln.startswith("note: compute runtime not used")]
    assert len(notes) == 1 and notes[0].startswith("note: " + note)
    # the window starts, and its status bar says why
    done = run(tmp_path, "-c", WINDOW)
    assert done.returncode == 0 and "Traceback" not in done.stderr, f"exit {done.returncode}\n{done.stderr}"
    label = next(ln for ln in done.stdout.splitlines() if ln.startswith("LABEL: "))
    tip = next(ln for ln in done.stdout.splitlines() if ln.startswith("TIP: "))
    assert label == "LABEL: Compute: CPU (runtime not used)"
    assert "TIP: " + note in tip
    # nothing was left running: no check process outlives its face
    assert not list(runtimes(tmp_path).glob("*.partial-*"))


def imports(folder: Path) -> list[str]:
    log = folder / "site" / "torch" / "imports.log"
    return log.read_text().split() if log.is_file() else []


COUNTING = (
    "import os as _os\n"
    "with open(_os.path.join(_os.path.dirname(__file__), 'imports.log'), 'a') as _log:\n"
    "    _log.write(f'{_os.getpid()}\\n')\n"
)


def test_the_check_runs_once_per_content_of_the_folder(tmp_path):
    """A runtime never checked is checked in a child process at the first start and used; later starts use
    the kept verdict (torch imported once, by the app itself) until the folder's content changes."""
    folder = runtime_folder(runtimes(tmp_path), torch_source(first=COUNTING))
    info, note = compute_info(tmp_path)
    assert note == "" and info["torch file"] == str(folder / "site" / "torch")
    first = imports(folder)
    assert len(first) == 2 and first[0] != first[1]  # the check's child, then --compute-info itself
    verdict = json.loads((folder / "check.json").read_text())
    assert verdict["ok"] is True and verdict["reason"] is None
    info, note = compute_info(tmp_path)
    assert note == "" and info["torch file"] == str(folder / "site" / "torch")
    assert len(imports(folder)) == 3  # no check this time
    # torch's __init__.py touched (its mtime): checked again
    init = folder / "site" / "torch" / "__init__.py"
    stat = init.stat()
    os.utime(init, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert compute_info(tmp_path)[1] == ""
    assert len(imports(folder)) == 5
    # a verdict written for other content ("ok", with a made-up fingerprint) is not believed
    init.write_text(torch_source(first=COUNTING + "raise ImportError('broken after the check')\n"))
    verdict = json.loads((folder / "check.json").read_text())
    verdict["fingerprint"] = "0" * 64
    (folder / "check.json").write_text(json.dumps(verdict))
    info, note = compute_info(tmp_path)
    assert info["torch file"] == bundled_torch_dir()
    assert note == (
        "compute runtime not used (cpu-torch2.13.0's torch failed its check: ImportError: broken after "
        "the check); using the bundled CPU torch"
    )
    assert len(imports(folder)) == 6  # the check's child only
    # a failed verdict is kept too: the next start says the same without checking again
    assert compute_info(tmp_path)[1] == note
    assert len(imports(folder)) == 6


def test_a_check_json_that_is_a_fifo_is_ignored(tmp_path):
    folder = runtime_folder(runtimes(tmp_path))
    os.mkfifo(folder / "check.json")
    info, note = compute_info(tmp_path)
    assert note == "" and info["torch file"] == str(folder / "site" / "torch")


def test_sigterm_during_the_install_check_ends_the_check_and_removes_the_staging_folder(tmp_path):
    pid_file = tmp_path / "check.pid"
    house = build_wheel(tmp_path / "slow", first=hanging(pid_file))
    setup = subprocess.Popen(
        [sys.executable, "-m", "ram_desktop", "--setup-compute", "cpu", "--offline", "--find-links", str(house)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env_for(tmp_path),
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
    )
    checker = None
    try:
        deadline = time.monotonic() + FACE_TIMEOUT_S
        while not (pid_file.is_file() and pid_file.read_text()) and time.monotonic() < deadline:
            assert setup.poll() is None, setup.communicate()
            time.sleep(0.2)
        checker = int(pid_file.read_text())
        assert list(runtimes(tmp_path).glob("cpu-torch2.13.0.partial-*"))  # the check runs in the staging folder
        setup.send_signal(signal.SIGTERM)
        out, err = setup.communicate(timeout=60)
        assert setup.returncode == 130, f"exit {setup.returncode}\n{out}\n{err}"
        assert "error: cancelled; the runtime folder was not changed" in err and "Traceback" not in err
        assert not list(runtimes(tmp_path).glob("*.partial-*"))
        assert not (runtimes(tmp_path) / "active").exists()
        assert not alive(checker)
    finally:
        if setup.poll() is None:
            setup.kill()
            setup.wait()
        if checker is not None and alive(checker):
            os.kill(checker, signal.SIGKILL)


def test_sigterm_during_the_start_up_check_ends_the_check_too(tmp_path):
    """A start that waits for the check of a torch that hangs, ended by SIGTERM: the check's process goes
    with it (it runs in a process group of its own, which the default signal action would leave running)."""
    pid_file = tmp_path / "check.pid"
    runtime_folder(runtimes(tmp_path), torch_source(first=hanging(pid_file)))
    start = subprocess.Popen(
        [sys.executable, "-m", "ram_desktop", "--compute-info"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env_for(tmp_path, RAM_DESKTOP_RUNTIME_CHECK_S="300"),
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
    )
    checker = None
    try:
        deadline = time.monotonic() + FACE_TIMEOUT_S
        while not (pid_file.is_file() and pid_file.read_text()) and time.monotonic() < deadline:
            assert start.poll() is None, start.communicate()
            time.sleep(0.2)
        checker = int(pid_file.read_text())
        assert checker != start.pid  # the check runs in a child process
        start.send_signal(signal.SIGTERM)
        _out, err = start.communicate(timeout=60)
        assert start.returncode == 128 + signal.SIGTERM and "Traceback" not in err, err
        assert not alive(checker)
    finally:
        if start.poll() is None:
            start.kill()
            start.wait()
        if checker is not None and alive(checker):
            os.kill(checker, signal.SIGKILL)
