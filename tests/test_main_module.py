"""``python -m ram_desktop COMMAND`` is ``ram-merge COMMAND`` for every subcommand the CLI has."""

from __future__ import annotations

from ram_desktop.__main__ import CLI_COMMANDS
from ram_desktop.cli import build_parser


def test_every_cli_subcommand_is_routed_to_the_cli():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert set(sub.choices) <= CLI_COMMANDS, set(sub.choices) - CLI_COMMANDS
