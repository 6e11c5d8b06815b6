"""``python -m ram_desktop``: with a subcommand it is ``ram-merge``; without one it opens the window."""

import sys

CLI_COMMANDS = {
    "probe",
    "merge",
    "run",
    "demo",
    "eval",
    "compare",
    "search",
    "export-mergekit",
    "publish",
    "fisher",
    "--version",
    "-h",
    "--help",
    "-q",
    "--quiet",
}


COMPUTE_COMMANDS = {"--setup-compute", "--compute-info"}  # ram_desktop.compute_cli (docs/compute.md)


def main() -> None:
    import multiprocessing

    multiprocessing.freeze_support()  # frozen: a spawned child (a python scorer's process) runs its task, not the app
    from .core.compute.runtime import activate

    activate()  # before anything imports torch: a verified runtime folder goes ahead of the bundled torch
    if len(sys.argv) > 1 and sys.argv[1] in COMPUTE_COMMANDS:
        from .compute_cli import main as compute_main

        sys.exit(compute_main(sys.argv[1:]))
    if len(sys.argv) > 1 and sys.argv[1] in CLI_COMMANDS:
        from .cli import entry

        entry()
    else:
        from .gui.app import entry as gui_entry

        gui_entry()


if __name__ == "__main__":
    main()
