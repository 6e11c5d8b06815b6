"""The documents the code cites are in the repository, and README's command synopsis matches the parser."""

from __future__ import annotations

import re
from pathlib import Path

from ram_desktop.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
MERGE_ONLY = {"--method", "--r", "--alpha", "--scale", "--density", "--drop", "--seed", "--ties-scope",
              "--fisher", "--fisher-suite", "--examples", "--out-dtype", "--shard-size", "--overwrite", "--eps",
              "--names", "--device", "--vocab", "--out",
              "--steps", "--lr",
              "--weight", "--lambda", "--t", "--normalize", "--rescale", "--int8-mask", "--gamma", "--epsilon",
              "--filter-wise", "--dtype", "--use-base", "--nuslerp-flatten", "--nuslerp-row-wise", "--normalize-weights",
              "--norm-eps", "--max-iter", "--tol", "--select-topk"}  # what "[merge flags]" stands for in compare's line


def _synopsis() -> dict[str, set[str]]:
    """Each ``ram-merge COMMAND`` of README's command-line block → the flags its lines name."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## The command line", 1)[1].split("```", 2)[1]
    flags: dict[str, set[str]] = {}
    command = None
    for line in block.splitlines():
        line = line.split("#", 1)[0]
        start = re.match(r"ram-merge ([a-z-]+)", line)
        if start:
            command = start.group(1)
        if command:
            flags.setdefault(command, set()).update(re.findall(r"(--[a-z][a-z0-9-]*)", line))
    return flags


def _parser_flags() -> dict[str, set[str]]:
    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    return {name: {o for a in p._actions for o in a.option_strings if o.startswith("--") and o != "--help"}
            for name, p in sub.choices.items()}


def test_readme_flags_match_the_parser():
    readme, code = _synopsis(), _parser_flags()
    assert set(readme) == set(code), set(readme) ^ set(code)
    for command, flags in readme.items():
        assert flags <= code[command], f"README names {flags - code[command]} for {command}"
        documented = flags | (MERGE_ONLY if command == "compare" else set())
        assert code[command] <= documented, f"README lacks {code[command] - documented} for {command}"


def test_the_package_cites_documents_that_exist():
    cited = set()
    for path in (ROOT / "ram_desktop").rglob("*.py"):
        text = path.read_text()
        assert not re.search(r"\bSPEC\b", text.replace('metavar="SPEC"', "")), f"{path} cites SPEC"
        cited.update(re.findall(r"docs/[a-z-]+\.md", text))
    assert cited and all((ROOT / c).is_file() for c in cited), cited
