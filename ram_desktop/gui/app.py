"""``ram-desktop``: open the window. ``--demo`` loads and analyses the built-in demo agents;
``--screenshot FILE`` saves the window after the analysis and exits; a recipe path opens it;
``--self-test`` drives the whole flow offscreen and checks it (:mod:`ram_desktop.gui.harness.selftest`)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from .. import __version__
from .application import setup_application

log = logging.getLogger("ram_desktop")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ram-desktop", description="RAM Desktop: merge RL-trained agents with RAM / RAM+."
    )
    parser.add_argument("recipe", nargs="?", type=Path, help="a ram-recipe.yaml to open")
    parser.add_argument("--demo", action="store_true", help="open with the built-in demo agents loaded and analysed")
    parser.add_argument(
        "--screenshot",
        type=Path,
        metavar="FILE",
        help="with --demo or a recipe: save a PNG of the window after the analysis and exit",
    )
    parser.add_argument("--size", default="1360x860", help="window size for --screenshot (default 1360x860)")
    parser.add_argument(
        "--self-test",
        action="store_true",
        help="offscreen: analyse and merge the demo agents through the window, check the output, "
        "print one line and exit 0 (or 1 with the reason)",
    )
    parser.add_argument(
        "--setup-compute",
        nargs="?",
        const="auto",
        metavar="auto|cpu|cuda|rocm|mps",
        help="detect the GPU and fetch the torch build that uses it, without the window "
        "(--dry-run, --offline, --find-links DIR, --json: see docs/compute.md)",
    )
    parser.add_argument("--compute-info", action="store_true", help="print the torch and device in use and exit")
    parser.add_argument("--version", action="version", version=f"ram-desktop {__version__}")
    return parser


def install_excepthook() -> None:
    """An unexpected exception on the GUI thread becomes a dialog and a log entry, never a silent crash."""
    from PySide6.QtWidgets import QApplication, QMessageBox

    def hook(kind, value, tb) -> None:
        if issubclass(kind, KeyboardInterrupt):
            QApplication.quit()
            return
        details = "".join(traceback.format_exception(kind, value, tb))
        log.error("unexpected error (a bug in RAM Desktop): %s: %s\n%s", kind.__name__, value, details)
        sys.__stderr__.write(details) if sys.__stderr__ else None
        app = QApplication.instance()
        if app is None:
            return
        box = QMessageBox(
            QMessageBox.Icon.Critical,
            "Unexpected error",
            f"RAM Desktop hit a bug: {kind.__name__}: {value}\n\n"
            "Your inputs were not changed. The details below help the developers.",
        )
        box.setDetailedText(details)
        box.exec()

    sys.excepthook = hook


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["--setup-compute"], ["--compute-info"]):  # headless: the compute set-up's own parser
        from ..compute_cli import main as compute_main

        return compute_main(argv)
    args = build_parser().parse_args(argv)
    if args.self_test:
        from .harness.selftest import run as self_test

        return self_test()
    if args.screenshot and not (args.demo or args.recipe):
        print("error: --screenshot needs --demo or a recipe", file=sys.stderr)
        return 2
    if args.screenshot:  # a PNG needs no screen: offscreen unless the caller chose a platform
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    try:
        from PySide6.QtCore import QSettings, QTimer
        from PySide6.QtWidgets import QApplication
    except ImportError:
        print(
            "error: the desktop application needs PySide6 and pyqtgraph: pip install 'ram-desktop[gui]'",
            file=sys.stderr,
        )
        return 2
    import torch  # noqa: F401 — the core imports torch at first use (``core.lazy``); the window loads it before

    # its event loop starts, so that no click waits for it
    from .main_window import MainWindow

    app = QApplication.instance() or QApplication([sys.argv[0]])
    setup_application(app)
    if not args.screenshot:
        install_excepthook()
    window = MainWindow(QSettings())
    status = {"code": 0}

    if args.screenshot:
        try:
            w, h = (int(v) for v in args.size.lower().split("x"))
        except ValueError:
            print(f"error: --size {args.size!r}: write it like 1360x860", file=sys.stderr)
            return 2
        window.resize(w, h)

        def shoot(ok: bool) -> None:
            if not ok:
                message = window.message.text.text() or "the analysis did not finish"
                print(f"error: {message}", file=sys.stderr)
                status["code"] = 2
                app.quit()
                return

            def grab() -> None:
                target = args.screenshot.expanduser()
                target.parent.mkdir(parents=True, exist_ok=True)
                if not window.grab().save(str(target), "PNG"):
                    print(f"error: cannot write {target}", file=sys.stderr)
                    status["code"] = 2
                else:
                    print(f"screenshot saved to {target}")
                app.quit()

            QTimer.singleShot(300, grab)  # let the charts lay out

        window.analysis_finished.connect(shoot)

        def too_slow() -> None:
            print("error: the analysis took longer than 10 minutes; no screenshot", file=sys.stderr)
            status["code"] = 2
            app.quit()

        QTimer.singleShot(600_000, too_slow)

    window.show()
    if args.recipe:
        if not window.open_recipe(args.recipe) and args.screenshot:
            print(f"error: {window.message.text.text()}", file=sys.stderr)
            return 2
    elif args.demo:
        window.load_demo()
    _close_on_termination(app, window, status)
    code = app.exec()
    return status["code"] or code


def _close_on_termination(app, window, status: dict) -> None:
    """Ctrl-C in the terminal, SIGTERM (a logout, ``kill``) and SIGHUP close the window like its close button:
    a running merge is cancelled and its staging folder removed, then the app exits 130. Python runs signal
    handlers only between its own bytecodes, so a timer wakes it while Qt's loop waits."""
    import signal

    from PySide6.QtCore import QTimer

    def close(signum: int, frame: object) -> None:
        status["code"] = 130
        QTimer.singleShot(0, window.close)

    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        number = getattr(signal, name, None)
        if number is not None and signal.getsignal(number) is not signal.SIG_IGN:  # nohup: stays ignored
            signal.signal(number, close)
    wake = QTimer(app)
    wake.timeout.connect(lambda: None)
    wake.start(250)


def entry() -> None:
    """Console-script entry point (``ram-desktop``; also ``python -m ram_desktop`` with no arguments)."""
    from ..core.compute.runtime import activate
    from ..paths import guard_stdio

    guard_stdio()  # a windowed build / Windows gui-script has no console: stdout and stderr go to the log
    activate()  # before torch is imported: a verified runtime folder goes ahead of the bundled torch
    if sys.argv[1:2] in (["--setup-compute"], ["--compute-info"]):
        from ..compute_cli import main as compute_main

        sys.exit(compute_main(sys.argv[1:]))
    sys.exit(main())
