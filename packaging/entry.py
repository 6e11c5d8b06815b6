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
    if name.endswith(".exe"):
        name = name[:-4]
    return name == "ram-merge"


def run() -> None:
    multiprocessing.freeze_support()  # a frozen child process started with "spawn" must not reopen the app
    from ram_desktop.paths import guard_stdio

    guard_stdio()
    if _invoked_as_cli():
        from ram_desktop.cli import entry

        entry()
    else:
        from ram_desktop.__main__ import main

        main()


if __name__ == "__main__":
    run()
