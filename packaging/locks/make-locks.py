"""Make the hash-locked requirements files of the compute runtimes (docs/compute.md#lock-files).

    python packaging/locks/make-locks.py [--python 3.11] [--only KEY ...] [--check]

For every torch build in ``ram_desktop.core.compute.builds.BUILDS`` and every platform it is made for, this
runs ``uv pip compile`` with ``--python-platform``, ``--python-version`` and ``--generate-hashes`` against
the build's index (pinned to the app's own versions by ``constraints.txt``, so that the shared packages in a
runtime folder equal the app's) and writes ``<key>-<system>-<machine>-py<X.Y>.txt``, plus a ``.json``
beside it that lists each package with the size of the wheel that platform downloads (from the index's
JSON simple API, PEP 691 / 700). A build whose index does not answer is skipped with a line saying so
(the release workflow, which reaches every index, makes those). ``--check`` makes nothing and exits 1 when a
committed lock no longer resolves to the same packages.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from ram_desktop.core.compute.builds import BUILDS, TORCH_VERSION, TorchBuild, lock_name

HERE = Path(__file__).resolve().parent
UV_PLATFORM = {
    ("linux", "x86_64"): "x86_64-manylinux_2_28",
    ("windows", "x86_64"): "x86_64-pc-windows-msvc",
    ("macos", "arm64"): "aarch64-apple-darwin",
}
WHEEL_PLATFORM = {
    ("linux", "x86_64"): re.compile(r"^(manylinux\w*_x86_64|linux_x86_64|any)$"),
    ("windows", "x86_64"): re.compile(r"^(win_amd64|any)$"),
    ("macos", "arm64"): re.compile(r"^(macosx_\d+_\d+_(arm64|universal2)|any)$"),
}


def uv() -> str:
    from uv import find_uv_bin

    return find_uv_bin()


def get_json(url: str) -> dict | None:
    request = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.loads(answer.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None


def reachable(index: str) -> bool:
    return get_json(f"{index.rstrip('/')}/torch/") is not None


def wheel_fits(filename: str, platform: tuple[str, str], python: str) -> bool:
    if not filename.endswith(".whl"):
        return False
    parts = filename[:-4].split("-")
    py_tags, abi_tags, plat_tags = parts[-3].split("."), parts[-2].split("."), parts[-1].split(".")
    cp = "cp" + python.replace(".", "")
    if not any(
        t in (cp, "py3", "py2") or (t.startswith("cp3") and "abi3" in abi_tags and int(t[3:]) <= int(cp[3:]))
        for t in py_tags
    ):
        return False
    return any(WHEEL_PLATFORM[platform].match(t) for t in plat_tags)


def packages_of(lock_text: str) -> list[tuple[str, str, set[str]]]:
    found: list[tuple[str, str, set[str]]] = []
    for block in re.split(r"\n(?=[A-Za-z0-9])", lock_text):
        head = re.match(r"([A-Za-z0-9._-]+)==([^\s\\;]+)", block)
        if head:
            found.append((head.group(1), head.group(2), set(re.findall(r"--hash=sha256:([0-9a-f]{64})", block))))
    return found


def sizes(index: str, lock_text: str, platform: tuple[str, str], python: str) -> list[dict]:
    out = []
    for name, version, hashes in packages_of(lock_text):
        listing = get_json(f"{index.rstrip('/')}/{name.lower()}/") or {}
        files = [f for f in listing.get("files", []) if f.get("hashes", {}).get("sha256") in hashes]
        fitting = [f for f in files if wheel_fits(f["filename"], platform, python)] or files
        size = max((int(f.get("size") or 0) for f in fitting), default=0)
        out.append({"name": name, "version": version, "bytes": size})
    return out


def compile_lock(build: TorchBuild, platform: tuple[str, str], python: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        req = Path(tmp) / "runtime.in"
        req.write_text(f"torch=={TORCH_VERSION}\n")
        out = Path(tmp) / "lock.txt"
        subprocess.run(
            [
                uv(),
                "pip",
                "compile",
                str(req),
                "-c",
                str(ROOT / "constraints.txt"),
                "--python-platform",
                UV_PLATFORM[platform],
                "--python-version",
                python,
                "--generate-hashes",
                "--index-url",
                build.index,
                "--no-header",
                "--no-annotate",
                "--quiet",
                "-o",
                str(out),
            ],
            check=True,
            cwd=ROOT,
            env={**os.environ, "MACOSX_DEPLOYMENT_TARGET": "14.0"},
        )
        return out.read_text()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", default="3.11", help="the Python of the app (the bundle's; default 3.11)")
    parser.add_argument("--only", nargs="*", help="build keys to make (default: every build)")
    parser.add_argument("--check", action="store_true", help="compare with the committed locks, write nothing")
    args = parser.parse_args(argv)
    stale = 0
    for build in BUILDS:
        if args.only and build.key not in args.only:
            continue
        if not reachable(build.index):
            print(f"skip {build.key}: {build.index} does not answer from here (the release workflow makes it)")
            continue
        for platform in build.platforms:
            name = lock_name(build, *platform, args.python)
            text = f"# {name}: torch {TORCH_VERSION}, {build.label}; made by packaging/locks/make-locks.py\n"
            text += compile_lock(build, platform, args.python)
            lock, sidecar = HERE / f"{name}.txt", HERE / f"{name}.json"
            if args.check:
                same = lock.is_file() and packages_of(lock.read_text()) == packages_of(text)
                print(f"{'ok' if same else 'STALE'} {lock.name}")
                stale += not same
                continue
            lock.write_text(text)
            listed = sizes(build.index, text, platform, args.python)
            sidecar.write_text(
                json.dumps(
                    {
                        "lock": lock.name,
                        "torch": TORCH_VERSION,
                        "build": build.key,
                        "index": build.index,
                        "system": platform[0],
                        "machine": platform[1],
                        "python": args.python,
                        "packages": listed,
                        "download_bytes": sum(p["bytes"] for p in listed),
                    },
                    indent=1,
                )
                + "\n"
            )
            total = sum(p["bytes"] for p in listed)
            print(f"wrote {lock.name}: {len(listed)} packages, {total / 1e9:.2f} GB to download")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
