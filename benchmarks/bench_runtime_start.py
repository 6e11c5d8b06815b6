"""Start-up time with a compute runtime folder in use (docs/compute.md#the-runtime-folder).

Builds a runtime folder that holds this environment's own torch (hard links, no copy: the same bytes under
``<home>/data/ram-desktop/runtimes/cpu-torch<version>/site/torch``, with its marker), then times, as fresh
processes, ``python -m ram_desktop --compute-info`` and the window's start (``ram_desktop.gui.app.entry``
until its event loop runs, then quit), each with the runtime folder and with the bundled torch
(``RAM_DESKTOP_RUNTIME=off``). One untimed run of each first (it may check the runtime and cache the verdict).

    python benchmarks/bench_runtime_start.py [--runs 10] [--work /tmp/rt-start] [--checkout DIR]

``--checkout``: the ``ram_desktop`` to time (put first on PYTHONPATH), to compare two trees on one machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

WINDOW = """
import sys
from ram_desktop.gui import app
shown = app._close_on_termination
def quit_when_running(qapp, window, status):
    shown(qapp, window, status)
    from PySide6.QtCore import QTimer
    QTimer.singleShot(0, qapp.quit)
app._close_on_termination = quit_when_running
sys.argv = ["ram-desktop"]
app.entry()
"""


def make_runtime(home: Path) -> Path:
    """A runtime folder holding this environment's torch, linked file by file, and its marker."""
    import torch

    bundled = Path(torch.__file__).parent
    folder = home / "data" / "ram-desktop" / "runtimes" / f"cpu-torch{torch.__version__.split('+')[0]}"
    site = folder / "site"
    if not (site / "torch" / "__init__.py").is_file():
        shutil.rmtree(folder, ignore_errors=True)
        site.mkdir(parents=True)
        shutil.copytree(bundled, site / "torch", copy_function=os.link)  # __pycache__ too: as after a first start
    binaries = {
        p.relative_to(site).as_posix(): p.stat().st_size
        for p in sorted((site / "torch").rglob("*"))
        if p.is_file() and (p.suffix in (".so", ".pyd", ".dll", ".dylib") or ".so." in p.name)
    }
    marker = {
        "format": "ram-runtime/1",
        "variant": "cpu",
        "build": "cpu",
        "torch": torch.__version__,
        "cuda": None,
        "hip": None,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "source": str(bundled),
        "lock": None,
        "installed": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "verified": {"ok": True, "torch": torch.__version__, "device": "cpu", "gpu": False, "matmul_equal": True},
        "modules": ["torch"],
        "binaries": binaries,
    }
    (folder / "runtime.json").write_text(json.dumps(marker, indent=1), encoding="utf-8")
    (folder.parent / "active").write_text(folder.name + "\n", encoding="utf-8")
    return folder


def timed(command: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float, subprocess.CompletedProcess]:
    """Wall seconds, CPU seconds (user + system, the process and the children it waited for) and the result."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, timeout=600, check=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), done


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--work", type=Path, default=Path("/tmp/rt-start"))
    parser.add_argument("--checkout", type=Path, help="the tree whose ram_desktop is timed")
    parser.add_argument("--with-bundled", action="store_true", help="also time RAM_DESKTOP_RUNTIME=off")
    args = parser.parse_args()
    home = args.work.resolve()
    folder = make_runtime(home)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAM_DESKTOP_", "XDG_"))}
    env.update(
        XDG_DATA_HOME=str(home / "data"),
        XDG_CONFIG_HOME=str(home / "config"),
        RAM_DESKTOP_CACHE=str(home / "cache"),
        QT_QPA_PLATFORM="offscreen",
        PATH=str(home / "no-bin") + os.pathsep + "/usr/bin:/bin",
    )
    if args.checkout:
        env["PYTHONPATH"] = str(args.checkout.resolve())
    cases = {
        "--compute-info": [sys.executable, "-m", "ram_desktop", "--compute-info"],
        "window start": [sys.executable, "-c", WINDOW],
    }
    results = {}
    for name, command in cases.items():
        for runtime in ("runtime", "bundled") if args.with_bundled else ("runtime",):
            case_env = dict(env, RAM_DESKTOP_RUNTIME="" if runtime == "runtime" else "off")
            _, _, first = timed(command, case_env, home)
            if first.returncode != 0:
                print(f"{name} ({runtime}) failed: exit {first.returncode}\n{first.stderr[-2000:]}", file=sys.stderr)
                return 1
            if name == "--compute-info":
                used = str(folder / "site" / "torch") in first.stdout
                if used != (runtime == "runtime"):
                    print(
                        f"{name} ({runtime}): the runtime folder was {'' if used else 'not '}used:\n"
                        f"{first.stdout}{first.stderr}",
                        file=sys.stderr,
                    )
                    return 1
            runs = [timed(command, case_env, home)[:2] for _ in range(args.runs)]
            results[f"{name} ({runtime})"] = runs
            for what, values in (("wall", [r[0] for r in runs]), ("CPU", [r[1] for r in runs])):
                print(
                    f"{name:15s} {runtime:8s} {what:4s} mean {statistics.mean(values):.3f} s  median "
                    f"{statistics.median(values):.3f} s  min {min(values):.3f} s  max {max(values):.3f} s  "
                    f"({args.runs} runs)",
                    flush=True,
                )
    print(json.dumps({k: [[round(w, 4), round(c, 4)] for w, c in v] for k, v in results.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
