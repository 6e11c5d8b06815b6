"""``python -m ram_desktop``: with a subcommand it is ``ram-merge``; without one it opens the window."""

import sys

CLI_COMMANDS = {"probe", "merge", "run", "demo", "eval", "compare", "export-mergekit", "publish", "fisher", "--version", "-h", "--help", "-q", "--quiet"}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in CLI_COMMANDS:
        from .cli import entry

        entry()
    else:
        from .gui.app import entry as gui_entry

        gui_entry()


if __name__ == "__main__":
    main()
