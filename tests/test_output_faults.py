"""More of issue 22, found by fault injection on top of tests/test_output_safety.py: a real failed
``write()`` names no file, yet the error line must; a cancel while the replaced output is removed must not
end the run as "nothing was written" with the new output in place; ``nohup`` keeps SIGHUP ignored; and
``compare --out`` gets SPEC section 4's rule (--overwrite only over an earlier compare).

Every case runs the real CLI in a fresh process, with one function patched by a wrapper first."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from . import test_output_safety
from .conftest import make_models  # noqa: F401 — used by the imported inputs fixture
from .test_output_safety import leftovers

inputs = test_output_safety.inputs  # the shared fixture, under its name so pytest finds it here

REPO = Path(__file__).resolve().parents[1]

WRAPPER = """
import errno, os, shutil, signal, sys, time
{patch}
from ram_desktop.cli import entry
sys.argv[0] = "ram-merge"
entry()
"""


def run(tmp_path: Path, patch: str, *args: str):
    env = dict(os.environ, RAM_DESKTOP_CACHE=str(tmp_path / "cache"), HF_HUB_OFFLINE="1")
    code = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n" + WRAPPER.format(patch=patch)
    return subprocess.run(
        [sys.executable, "-c", code, "-q", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


def error_line(done, code: int = 2) -> str:
    assert done.returncode == code, f"exit {done.returncode}: {done.stderr}"
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def test_disk_full_from_a_real_write_names_the_shard_file(tmp_path, inputs):
    """A failed write() raises OSError without a file name (unlike open()); the line still names the file."""
    patch = """
from ram_desktop.core.storage.formats import safetensors_format as sf
def full(self, data):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
sf.SafetensorsStreamWriter.write = full
"""
    line = error_line(run(tmp_path, patch, "merge", *inputs, "--out", str(tmp_path / "out")))
    assert "model.safetensors: No space left on device" in line and ".partial-" in line
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "two-renames"])
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_cancel_while_the_replaced_output_is_removed_keeps_the_new_output_and_says_so(tmp_path, inputs, sig, exchange):
    out = tmp_path / "out"
    done = run(tmp_path, "", "merge", *inputs, "--out", str(out), "--method", "ram")
    assert done.returncode == 0, done.stderr
    patch = f"""
from ram_desktop.core.storage import output
if not {exchange}:
    output._exchange = lambda a, b: False
real, fired = shutil.rmtree, []
def rmtree(path, *a, **k):
    name = os.path.basename(os.fsdecode(path))
    if not fired and name.startswith(("out.partial-", "out.old-")):  # in a run that succeeds: the old output
        fired.append(1)
        os.kill(os.getpid(), signal.{sig})
        time.sleep(0.2)
    return real(path, *a, **k)
shutil.rmtree = rmtree
"""
    done = run(tmp_path, patch, "merge", *inputs, "--out", str(out), "--method", "ram-plus", "--overwrite")
    assert "Traceback" not in done.stderr
    assert done.returncode == 0, done.stderr  # the cancel came after the new output was in place: kept
    assert "nothing was written" not in done.stderr
    assert "ram-plus" in (out / "merge-report.json").read_text()
    assert leftovers(tmp_path) == []  # the earlier output was removed completely


def test_nohup_keeps_sighup_ignored(tmp_path, inputs):
    """``nohup ram-merge ...``: SIGHUP (the terminal closing) was set to be ignored and must stay so."""
    patch = """
signal.signal(signal.SIGHUP, signal.SIG_IGN)
from ram_desktop.core.storage.formats import safetensors_format as sf
real, calls = sf.SafetensorsStreamWriter.write, []
def write(self, data):
    calls.append(1)
    if len(calls) == 1:
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(0.2)
    return real(self, data)
sf.SafetensorsStreamWriter.write = write
"""
    done = run(tmp_path, patch, "merge", *inputs, "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "model.safetensors").is_file()


def test_compare_out_needs_overwrite_and_never_touches_an_unrelated_folder(tmp_path, inputs):
    out = tmp_path / "cmp"
    (out / "sub").mkdir(parents=True)
    (out / "thesis.txt").write_text("four years of work")
    (out / "sub" / "data.csv").write_text("a,b\n")
    line = error_line(run(tmp_path, "", "compare", *inputs, "--out", str(out), "--variant", "ram"))
    assert "--overwrite" not in line and "thesis.txt" in line  # --overwrite would refuse it too: not offered
    line = error_line(run(tmp_path, "", "compare", *inputs, "--out", str(out), "--variant", "ram", "--overwrite"))
    assert "thesis.txt" in line and "sub/data.csv" in line and "choose a new folder" in line
    assert sorted(p.name for p in out.rglob("*")) == ["data.csv", "sub", "thesis.txt"]
    assert (out / "thesis.txt").read_text() == "four years of work"


def test_compare_overwrite_over_an_earlier_compare(tmp_path, inputs):
    out = tmp_path / "cmp"
    done = run(tmp_path, "", "compare", *inputs, "--out", str(out), "--variant", "ram")
    assert done.returncode == 0, done.stderr
    line = error_line(run(tmp_path, "", "compare", *inputs, "--out", str(out), "--variant", "ram"))
    assert "earlier comparison" in line and "pass --overwrite" in line  # offered: it would work
    done = run(
        tmp_path, "", "compare", *inputs, "--out", str(out), "--variant", "ram", "--variant", "ties", "--overwrite"
    )
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["compare.json", "ram", "ram-manifest.json", "ties"]
