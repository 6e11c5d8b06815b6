"""What travels to the GPU machine for each lease command, checked here before a lease is spent.

A device command receives the working tree as git would copy it (``git ls-files`` plus the untracked files git
does not ignore, ``git ls-files --others --exclude-standard``) and at most 8 *carry* paths of ignored files, at
most 64 MiB in all. This script lists each item with its size (the tree, each carry path), the sum, and exits 1
with a one-line reason naming the biggest items when the sum is over the limit, when there are more than 8 carry
paths, when a carry path is missing or is not ignored by git (it would travel with the tree already), or when a
carried GGUF part (a file under ``.gguf/``) is over 28 MiB. Plain Python (standard library only), so that it runs
with any ``python3``, on a machine with no GPU::

    python3 reproduction/real/carry.py                    # the tree alone
    python3 reproduction/real/carry.py .whl               # one command carrying .whl
    python3 reproduction/real/carry.py --plan gpu-run     # every command of gpu_run.sh's lease (PLANS)

``--allow-missing`` checks what is here and names, on its own line, each carry path that is absent (made by
``gpu_prepare.sh`` / ``benchmarks/gpu_wheels.sh``) instead of refusing it.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIMIT_BYTES = 64 << 20  # what one device command may carry, the tree included
MAX_CARRY = 8  # carry paths per command
PART_LIMIT_BYTES = 28 << 20  # each GGUF part gpu_prepare.sh writes
PARTS_DIR = ".gguf"

# Each lease's device commands and the carry paths of each, in order (the scripts' headers describe them). A
# pattern with "*" stands for one command per path it matches: each GGUF part travels in a call of its own
# (28 MiB with the ~20 MB tree; two would pass 64 MiB), and ignored files stay on the warm machine between calls.
PLANS: dict[str, list[tuple[str, list[str]]]] = {
    # benchmarks/gpu_wheels.sh here, then one device command: bash benchmarks/gpu_check.sh
    "gpu-check": [("gpu_check.sh", [".whl"])],
    # reproduction/real/gpu_prepare.sh here, then: the wheels, one call per GGUF part, and the run (tree only)
    "gpu-run": [
        ("wheels", [".whl"]),
        ("gguf part", [f"{PARTS_DIR}/part-*"]),
        ("gpu_run.sh", []),
    ],
}


@dataclass
class Item:
    name: str
    size: int
    files: int
    note: str = ""


@dataclass
class Report:
    label: str
    carries: list[str]  # as the command names them (patterns expanded)
    items: list[Item] = field(default_factory=list)
    absent: list[str] = field(default_factory=list)
    refused: str = ""  # the one-line reason, empty when the command's carries travel

    @property
    def total(self) -> int:
        return sum(i.size for i in self.items)


def _git(root: Path, *args: str) -> list[str]:
    out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, check=True).stdout
    return [p.decode("utf-8", "surrogateescape") for p in out.split(b"\0") if p]


def _file_size(path: Path) -> int | None:
    """A file's (or link's) own size; None for what is not there or a folder (a submodule's gitlink)."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None
    return None if path.is_dir() and not path.is_symlink() else st.st_size


def tree_item(root: Path) -> Item:
    """The working tree as git copies it: tracked files that exist, plus untracked files git does not ignore."""
    tracked = _git(root, "ls-files", "-z")
    others = _git(root, "ls-files", "-z", "--others", "--exclude-standard")
    size = files = 0
    for rel in dict.fromkeys(tracked + others):
        s = _file_size(root / rel)
        if s is not None:
            size += s
            files += 1
    return Item("tree", size, files, f"{len(tracked)} tracked, {len(others)} untracked")


def _walk(path: Path) -> list[tuple[Path, int]]:
    """Every file under ``path`` (or ``path`` itself) with its own size; links are not followed."""
    if path.is_symlink() or not path.is_dir():
        return [(path, path.lstat().st_size)]
    found = []
    for folder, dirs, names in os.walk(path):
        dirs.sort()
        for name in sorted(names):
            p = Path(folder, name)
            found.append((p, p.lstat().st_size))
    return found


def _here(path: Path) -> bool:
    return path.exists() or path.is_symlink()


def check(
    root: Path,
    carries: list[str],
    *,
    label: str = "command",
    limit: int = LIMIT_BYTES,
    max_carry: int = MAX_CARRY,
    part_limit: int = PART_LIMIT_BYTES,
    allow_missing: bool = False,
    tree: Item | None = None,
) -> Report:
    """The sizes of the tree and of each of ``carries`` (paths relative to ``root``; a pattern with "*" is
    expanded here), their sum, and ``Report.refused`` when they would not travel. ``allow_missing`` lists an
    absent path in ``Report.absent`` instead of refusing it."""
    report = Report(label, [], [tree or tree_item(root)])
    reasons = []
    for c in carries:
        hits = sorted(os.path.relpath(p, root) for p in glob.glob(str(root / c))) if glob.has_magic(c) else [c]
        report.carries += hits or [c]
        for rel in hits:
            path = root / rel
            if not _here(path):
                report.absent.append(rel)
                continue
            if subprocess.run(["git", "-C", str(root), "check-ignore", "-q", "--", rel], check=False).returncode:
                reasons.append(f"carry path {rel} is not ignored by git: it travels with the tree already")
            files = _walk(path)
            report.items.append(Item(rel, sum(s for _, s in files), len(files)))
            parts = root / PARTS_DIR
            over = [(p, s) for p, s in files if s > part_limit and (p == parts or parts in p.parents)]
            if over:
                p, s = max(over, key=lambda ps: ps[1])  # the biggest, the first of equals
                more = f" ({len(over)} parts over)" if len(over) > 1 else ""
                reasons.append(f"GGUF part {os.path.relpath(p, root)} is {s:,} bytes, over {part_limit:,}{more}")
        if not hits:
            report.absent.append(c)
    if len(report.carries) > max_carry:
        reasons.insert(0, f"{len(report.carries)} carry paths, more than the {max_carry} a command may name")
    if report.absent and not allow_missing:
        reasons.insert(0, f"carry path {report.absent[0]} is not here (under {root})")
    if report.total > limit:
        biggest = sorted(report.items, key=lambda i: -i.size)[:3]
        names = ", ".join(f"{i.name} {i.size:,}" for i in biggest)
        reasons.append(f"{report.total:,} bytes, over the {limit:,} a command may carry; biggest: {names}")
    report.refused = "; ".join(reasons)
    return report


def show(report: Report, limit: int) -> str:
    """The listing: one line per item, the sum, and each absent path on a line of its own."""
    width = max(len(i.name) for i in [*report.items, Item("sum", 0, 0)])
    lines = [f"{report.label}: carry {json.dumps(report.carries)}"]
    for i in report.items:
        note = f"{i.files} files" + (f": {i.note}" if i.note else "")
        lines.append(f"  {i.name:<{width}}  {i.size:>13,} bytes  {i.size / 2**20:6.1f} MiB  ({note})")
    verdict = "REFUSED" if report.refused else "ok"
    lines.append(
        f"  {'sum':<{width}}  {report.total:>13,} bytes  {report.total / 2**20:6.1f} MiB  of {limit:,}: {verdict}"
    )
    for a in report.absent:
        lines.append(f"  ABSENT here, not counted: {a} (gpu_prepare.sh or benchmarks/gpu_wheels.sh makes it)")
    return "\n".join(lines)


def commands(plan: list[tuple[str, list[str]]], root: Path) -> list[tuple[str, list[str]]]:
    """A plan's commands, a pattern standing for one command per path it matches (itself when none does)."""
    out = []
    for label, carries in plan:
        patterns = [c for c in carries if glob.has_magic(c)]
        plain = [c for c in carries if not glob.has_magic(c)]
        hits = sorted({os.path.relpath(p, root) for c in patterns for p in glob.glob(str(root / c))})
        if patterns and hits:
            out += [(f"{label} {h}", [*plain, h]) for h in hits]
        else:
            out.append((label, carries))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prog="carry.py")
    ap.add_argument("carry", nargs="*", help="carry paths of one command, relative to --root (may be none)")
    ap.add_argument("--plan", choices=sorted(PLANS), help="check every command of a lease (carry.py's PLANS)")
    ap.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this one)")
    ap.add_argument("--limit-bytes", type=int, default=LIMIT_BYTES, help="per command, tree included (64 MiB)")
    ap.add_argument("--max-carry", type=int, default=MAX_CARRY, help="carry paths per command (8)")
    ap.add_argument("--part-limit-bytes", type=int, default=PART_LIMIT_BYTES, help="per GGUF part (28 MiB)")
    ap.add_argument("--allow-missing", action="store_true", help="report absent carry paths instead of refusing")
    args = ap.parse_args(argv)
    if args.plan and args.carry:
        ap.error("give carry paths or --plan, not both")
    root = args.root.resolve()
    todo = commands(PLANS[args.plan], root) if args.plan else [("command", args.carry)]
    tree = tree_item(root)
    refused = []
    for label, carries in todo:
        report = check(
            root,
            carries,
            label=label,
            limit=args.limit_bytes,
            max_carry=args.max_carry,
            part_limit=args.part_limit_bytes,
            allow_missing=args.allow_missing,
            tree=tree,
        )
        print(show(report, args.limit_bytes))
        if report.refused:
            refused.append(f"{label}: {report.refused}")
    for line in refused:
        print(f"refused: {line}", file=sys.stderr)
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main())
