"""PyInstaller entry script of the RAM Desktop bundle.

One executable, two faces:

- called as ``ram-merge`` (the bundle's symlink, /usr/bin/ram-merge from the .deb, or ``ram-merge.exe``
  on Windows / macOS), it is exactly the ``ram-merge`` command line;
- called as ``ram-desktop``, it is ``python -m ram_desktop``: a CLI subcommand (``probe``, ``merge``,
  ``run``, ``demo``, ``--version``, ``--help``) goes to the command line, anything else opens the window.

Before anything else it makes sure a windowed build (no console: sys.stdout / sys.stderr are None)
writes to the log file in the user log folder instead of crashing on the first print.
"""

import multiprocessing
import os
import sys


def _invoked_as_cli() -> bool:
    name = os.path.basename(sys.argv[0] if sys.argv else "").lower()
    name = name.removesuffix(".exe")
    return name == "ram-merge"


def bundle_check() -> int:
    """``ram-desktop --bundle-check``: can this bundle run the window? (packaging's own smoke test)

    A narrower check than the window's ``--self-test`` (which drives the real window end to end); it
    still names the failing piece directly when a Qt plugin or resource is missing: Qt's offscreen
    platform plugin loads, the SVG and PNG icons load from the bundled resources, pyqtgraph imports the
    modules it loads by name (plot menus, exporters), a chart renders and exports to PNG, and the user
    folders resolve. Prints one line and exits 0, or prints the reason and exits 1.
    """
    import tempfile
    from pathlib import Path

    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    try:
        import pyqtgraph as pg
        import pyqtgraph.exporters
        from PySide6 import QtCore, QtGui, QtWidgets

        from ram_desktop import __version__, paths

        app = QtWidgets.QApplication.instance() or QtWidgets.QApplication(["ram-desktop"])
        icons = {}
        for name in ("ram-desktop.svg", "ram-desktop.png"):
            image = QtGui.QImage(str(paths.resource_path(name)))
            if image.isNull():
                raise RuntimeError(f"Qt cannot read the bundled {name} (image format plugin missing?)")
            icons[name] = image.width()
        window = pg.GraphicsLayoutWidget()
        plot = window.addPlot(title="density")
        plot.addItem(pg.BarGraphItem(x=[0, 1, 2], height=[0.46, 0.55, 0.03], width=0.6))
        plot.getViewBox().menu  # noqa: B018  the context menu imports its *Template_pyside6 module by name
        window.resize(320, 240)
        window.show()
        app.processEvents()
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "chart.png"
            pg.exporters.ImageExporter(plot).export(str(out))
            if not out.is_file() or out.stat().st_size == 0:
                raise RuntimeError("pyqtgraph exported no PNG")
            png_bytes = out.stat().st_size
        window.close()
        print(
            f"bundle-check ok: ram-desktop {__version__}, Qt {QtCore.qVersion()} "
            f"({app.platformName()}), pyqtgraph {pg.__version__}, icons {icons}, chart PNG {png_bytes} B, "
            f"frozen={paths.is_frozen()}, config {paths.user_config_dir()}, log {paths.user_log_dir()}"
        )
        return 0
    except Exception as e:  # noqa: BLE001 — one line: this is a check, not a crash
        print(f"bundle-check FAILED: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


def set_numba_cache_dir() -> None:
    """Point numba's kernel cache at the user cache folder (before numba is imported, which reads it).

    numba would otherwise write next to ``kernel_code.py`` inside the bundle, which is read-only in an
    installed copy (/opt/ram-desktop, Program Files, a signed .app); a user's own NUMBA_CACHE_DIR wins."""
    from ram_desktop.paths import user_cache_dir

    os.environ.setdefault("NUMBA_CACHE_DIR", str(user_cache_dir() / "numba"))


def kernel_check() -> int:
    """``ram-merge --kernel-check``: does this bundle run the fused numba kernels (not the torch fallback)?

    Imports numba through ``ram_desktop.core.engine.kernels``, counts update patterns of a small bf16 slice with
    the kernel and with torch and compares them, and checks numba cached the compiled code in
    NUMBA_CACHE_DIR. Prints one line and exits 0, or prints the reason and exits 1."""
    try:
        import torch

        from ram_desktop.core.engine import kernels

        if not kernels.available():
            raise RuntimeError(
                "ram_desktop.core.engine.kernels.available() is False (numba missing, or "
                "kernel_code.py not shipped as source); merges use the torch path"
            )
        import numba

        gen = torch.Generator().manual_seed(0)
        base = torch.randn(4099, generator=gen).to(torch.bfloat16)
        agents = [
            (base.float() + torch.randn(4099, generator=gen) * (torch.rand(4099, generator=gen) < 0.3)).to(
                torch.bfloat16
            )
            for _ in range(3)
        ]
        counted = kernels.count_patterns(base, agents, 1e-5, torch.float32)
        if counted is None:
            raise RuntimeError("the pattern-count kernel declined a bf16 slice")
        # reference: the update pattern p = sum_t [|agent_t - base| > eps] * 2^t, counted with torch
        pattern = sum(((a.float() - base.float()).abs() > 1e-5).long() << t for t, a in enumerate(agents))
        want = torch.bincount(pattern, minlength=8).numpy()
        if list(counted.hist) != list(want) or not counted.finite:
            raise RuntimeError(f"the kernel counted {list(counted.hist)}, torch counts {list(want)}")
        cache = os.environ.get("NUMBA_CACHE_DIR", "")
        cached = [f for _, _, files in os.walk(cache) for f in files if f.endswith(".nbi")] if cache else []
        if not cached:
            raise RuntimeError(f"numba cached nothing in NUMBA_CACHE_DIR={cache!r}")
        print(
            f"kernel-check ok: numba {numba.__version__}, update-pattern kernel equals torch on 4,099 "
            f"bf16 elements, {len(cached)} cached kernel index file(s) in {cache}"
        )
        return 0
    except Exception as e:  # noqa: BLE001 — one line: this is a check, not a crash
        print(f"kernel-check FAILED: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


def answer_as_python() -> bool:
    """``ram-desktop -I -B -c CODE``: run CODE as the Python this bundle embeds would.

    The compute set-up (docs/compute.md) runs the bundled ``uv pip install --python <this executable>``, and uv
    asks that interpreter about itself (version, platform, paths) with ``-I -B -c CODE``. No RAM Desktop
    command starts with these flags."""
    args = sys.argv[1:]
    while args and args[0] in ("-I", "-B", "-E", "-s", "-S", "-u"):
        args = args[1:]
    if len(args) < 2 or args[0] != "-c" or sys.argv[1] not in ("-I", "-B", "-E", "-s", "-S", "-u", "-c"):
        return False
    sys.argv = ["-c", *args[2:]]
    exec(compile(args[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})  # noqa: S102 — uv's own query, as python -c runs it
    return True


def run() -> None:
    multiprocessing.freeze_support()  # a frozen child process started with "spawn" must not reopen the app
    if getattr(sys, "frozen", False) and answer_as_python():
        sys.exit(0)
    if sys.argv[1:2] == ["--verify-runtime"]:  # the new runtime folder's check, before any torch is imported
        from ram_desktop.core.compute.verify import main as verify

        sys.exit(verify(sys.argv[2:]))
    from ram_desktop.paths import guard_stdio

    guard_stdio()
    if getattr(sys, "frozen", False):
        set_numba_cache_dir()
    if sys.argv[1:2] == ["--bundle-check"]:
        sys.exit(bundle_check())
    if sys.argv[1:2] == ["--kernel-check"]:
        sys.exit(kernel_check())
    if sys.argv[1:2] in (["--setup-compute"], ["--compute-info"]):  # either name, the console ram-merge.exe too
        from ram_desktop.compute_cli import main as compute_main
        from ram_desktop.core.compute.runtime import activate

        activate()
        sys.exit(compute_main(sys.argv[1:]))
    if _invoked_as_cli():
        from ram_desktop.cli import entry

        entry()
    else:
        from ram_desktop.__main__ import main

        main()


if __name__ == "__main__":
    run()
