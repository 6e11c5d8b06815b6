"""``reproduction/real/carry.py``, the carry-size check run before a GPU lease (issue 46, item 5): on a small git
repository made here, the sizes it lists against sizes computed here with ``os.stat`` (not its helpers), its
refusals (9 carry paths, a missing path, a carry git does not ignore, a GGUF part over its limit, a sum over the
limit) and a sum at the limit exactly passing; then on this repository's own tree with the scripts' plans."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "reproduction" / "real" / "carry.py"
GITIGNORE = "/.whl/\n/.gguf/\n/build/\n"


def carry(*args: str, root: Path | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(SCRIPT), *args] + (["--root", str(root)] if root else [])
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def listed(out: str) -> dict[str, dict[str, int]]:
    """Each command's listed items: {label: {item: bytes}} from the lines ``  name  1,234 bytes ...``."""
    found: dict[str, dict[str, int]] = {}
    label = ""
    for line in out.splitlines():
        if not line.startswith(" "):
            label = line.split(": carry ")[0]
            found[label] = {}
        elif m := re.match(r"\s+(\S+)\s+([\d,]+) bytes", line):
            found[label][m.group(1)] = int(m.group(2).replace(",", ""))
    return found


def write(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repository: two tracked files, an untracked one, ignored files in .whl/, .gguf/ and build/."""
    root = tmp_path / "repo"
    root.mkdir()
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / ".gitignore").write_text(GITIGNORE)
    write(root / "a.py", 1000)
    write(root / "docs" / "b.md", 2345)
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
    env["GIT_COMMITTER_EMAIL"] = "t@t"
    subprocess.run(["git", "-C", str(root), "add", "."], check=True, env=env)
    subprocess.run(["git", "-C", str(root), "commit", "-q", "-m", "init"], check=True, env=env)
    write(root / "new.txt", 77)  # untracked, not ignored: travels with the tree
    write(root / ".whl" / "one.whl", 5000)
    write(root / ".whl" / "two.whl", 3000)
    for i, size in enumerate((400, 400, 123)):
        write(root / ".gguf" / f"part-{i:02d}", size)
    for i in range(9):
        write(root / "build" / f"c{i}", 10)
    return root


def sizes_here(root: Path, *rels: str) -> int:
    """Bytes under each path, by os.walk and os.stat."""
    total = 0
    for rel in rels:
        p = root / rel
        if p.is_file():
            total += p.stat().st_size
            continue
        for folder, _, names in os.walk(p):
            total += sum(os.stat(os.path.join(folder, n)).st_size for n in names)
    return total


def test_it_lists_the_tree_and_each_carry_with_their_sizes(repo):
    tree = sizes_here(repo, ".gitignore", "a.py", "docs/b.md", "new.txt")
    assert tree == len(GITIGNORE) + 1000 + 2345 + 77
    done = carry(".whl", ".gguf/part-00", root=repo)
    assert done.returncode == 0, done.stderr
    items = listed(done.stdout)["command"]
    assert items == {
        "tree": tree,
        ".whl": sizes_here(repo, ".whl"),
        ".gguf/part-00": 400,
        "sum": tree + 8000 + 400,
    }
    assert "4 files: 3 tracked, 1 untracked" in done.stdout and "ok" in done.stdout


def test_it_refuses_nine_carry_paths_and_takes_eight(repo):
    nine = [f"build/c{i}" for i in range(9)]
    done = carry(*nine, root=repo)
    assert done.returncode == 1
    assert "9 carry paths, more than the 8" in done.stderr
    assert carry(*nine[:8], root=repo).returncode == 0


def test_it_refuses_a_missing_path_unless_told_to_report_it(repo):
    done = carry(".whl", "nothere", root=repo)
    assert done.returncode == 1 and "carry path nothere is not here" in done.stderr
    allowed = carry(".whl", "nothere", "--allow-missing", root=repo)
    assert allowed.returncode == 0
    assert "ABSENT here, not counted: nothere" in allowed.stdout  # reported, not hidden


def test_it_refuses_a_carry_that_git_does_not_ignore(repo):
    done = carry("new.txt", root=repo)
    assert done.returncode == 1 and "new.txt is not ignored by git" in done.stderr


def test_it_refuses_a_sum_over_the_limit_and_passes_at_the_limit_exactly(repo):
    total = sizes_here(repo, ".gitignore", "a.py", "docs/b.md", "new.txt", ".whl")
    at = carry(".whl", "--limit-bytes", str(total), root=repo)
    assert at.returncode == 0, at.stderr
    assert listed(at.stdout)["command"]["sum"] == total
    over = carry(".whl", "--limit-bytes", str(total - 1), root=repo)
    assert over.returncode == 1
    (line,) = over.stderr.splitlines()  # one line, naming the biggest items first
    assert f"{total:,} bytes, over the {total - 1:,}" in line
    assert line.index(".whl 8,000") < line.index(f"tree {total - 8000:,}")


def test_it_checks_each_gguf_part_against_its_limit(repo):
    assert carry(".gguf/part-00", "--part-limit-bytes", "400", root=repo).returncode == 0
    done = carry(".gguf/part-00", "--part-limit-bytes", "399", root=repo)
    assert done.returncode == 1 and "GGUF part .gguf/part-00 is 400 bytes, over 399" in done.stderr
    # a whole .gguf/ carried is checked part by part too
    whole = carry(".gguf", "--part-limit-bytes", "399", root=repo).stderr
    assert "GGUF part .gguf/part-00 is 400 bytes, over 399 (2 parts over)" in whole
    assert carry(".whl", "--part-limit-bytes", "399", root=repo).returncode == 0  # wheels are not parts


def test_a_plan_checks_one_command_per_gguf_part(repo):
    done = carry("--plan", "gpu-run", root=repo)
    assert done.returncode == 0, done.stderr
    assert list(listed(done.stdout)) == [
        "wheels",
        "gguf part .gguf/part-00",
        "gguf part .gguf/part-01",
        "gguf part .gguf/part-02",
        "gpu_run.sh",
    ]
    assert 'gguf part .gguf/part-02: carry [".gguf/part-02"]' in done.stdout


def test_this_repository_s_tree_and_plans_fit_a_lease():
    """This repository, with the carry lists gpu_prepare.sh and gpu_wheels.sh check: a carry not made on this
    machine (.whl/, .gguf/ are made by those scripts) is named as absent in the output, not left out silently."""
    alone = carry()
    assert alone.returncode == 0, alone.stderr
    tree = listed(alone.stdout)["command"]["tree"]
    assert 0 < tree < 64 << 20
    for plan, carried in (("gpu-check", [".whl"]), ("gpu-run", [".whl", ".gguf/part-*"])):
        done = carry("--plan", plan, "--allow-missing")
        assert done.returncode == 0, done.stderr
        for path in carried:
            made = list(REPO.glob(path))
            if not made:
                assert f"ABSENT here, not counted: {path}" in done.stdout
            for p in made:
                rel = str(p.relative_to(REPO))
                assert sizes_here(REPO, rel) < (64 << 20) - tree, rel
                assert rel in done.stdout
        print(done.stdout)
