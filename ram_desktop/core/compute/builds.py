"""Which torch build this machine can run, and the plan to install it (docs/compute.md#the-plan).

The builds of torch 2.13.0 that RAM Desktop knows, where each comes from, and the NVIDIA driver each
needs. A build can be installed only from a hash-locked requirements file committed in
``packaging/locks/`` (``<build>-<system>-<machine>-py<X.Y>.txt``, made by ``packaging/locks/make-locks.py``,
with a ``.json`` beside it that lists the packages and their download sizes), or from a local folder of
wheels (``--find-links``). Where no build fits, the plan says in plain words which driver or which
PyTorch index build would.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from ... import paths
from ..events import human_bytes
from .detect import Detection

TORCH_VERSION = "2.13.0"
PYPI = "https://pypi.org/simple"
PYTORCH_INDEX = "https://download.pytorch.org/whl"
VARIANTS = ("auto", "cpu", "cuda", "rocm", "mps")

__all__ = [
    "BUILDS",
    "TORCH_VERSION",
    "VARIANTS",
    "Package",
    "Plan",
    "TorchBuild",
    "choose",
    "human_bytes",
    "lock_name",
    "locks_dir",
    "runtimes_dir",
]


@dataclass(frozen=True)
class TorchBuild:
    """One build of torch: ``key`` names its lock files; ``label`` says where it comes from (the command
    line's words), ``plain`` what it runs on (the window's words); ``min_driver`` is the oldest NVIDIA driver
    per system that runs it (CUDA builds only)."""

    key: str
    variant: str
    label: str
    index: str
    platforms: tuple[tuple[str, str], ...]
    min_driver: dict[str, tuple[int, ...]] = field(default_factory=dict)
    plain: str = ""


BUILDS: tuple[TorchBuild, ...] = (
    # PyPI's torch for Linux x86-64 is the CUDA 13.0 build (torch + nvidia-* + triton); CUDA 13 needs a
    # driver of the 580 series or newer.
    TorchBuild(
        "cuda13",
        "cuda",
        "CUDA 13.0 build from PyPI",
        PYPI,
        (("linux", "x86_64"),),
        {"linux": (580, 65, 6)},
        "for NVIDIA GPUs (CUDA 13.0)",
    ),
    # CUDA 12.6 builds come only from PyTorch's own index; CUDA 12 runs on drivers from 525.60.13 (Linux) /
    # 528.33 (Windows) by CUDA's minor-version compatibility.
    TorchBuild(
        "cu126",
        "cuda",
        "CUDA 12.6 build from PyTorch's index",
        f"{PYTORCH_INDEX}/cu126",
        (("linux", "x86_64"), ("windows", "x86_64")),
        {"linux": (525, 60, 13), "windows": (528, 33)},
        "for NVIDIA GPUs (CUDA 12.6)",
    ),
    TorchBuild(
        "rocm6.4",
        "rocm",
        "ROCm 6.4 build from PyTorch's index",
        f"{PYTORCH_INDEX}/rocm6.4",
        (("linux", "x86_64"),),
        plain="for AMD GPUs (ROCm 6.4)",
    ),
    TorchBuild(
        "cpu",
        "cpu",
        "CPU build from PyTorch's index",
        f"{PYTORCH_INDEX}/cpu",
        (("linux", "x86_64"), ("windows", "x86_64")),
        plain="for the CPU",
    ),
    TorchBuild(
        "mps", "mps", "macOS build from PyPI (CPU and MPS)", PYPI, (("macos", "arm64"),), plain="for Apple GPUs (MPS)"
    ),
)


def locks_dir() -> Path:
    """The lock files: ``$RAM_DESKTOP_LOCKS``, else ``locks/`` in the frozen bundle, else the checkout's
    ``packaging/locks/``."""
    override = os.environ.get("RAM_DESKTOP_LOCKS")
    if override:
        return Path(override)
    bundle = paths.bundle_dir()
    if bundle is not None:
        return bundle / "locks"
    return Path(__file__).resolve().parents[3] / "packaging" / "locks"


def runtimes_dir() -> Path:
    """``<user data dir>/runtimes``: one folder per installed variant and torch version."""
    return paths.user_data_dir() / "runtimes"


def lock_name(build: TorchBuild, system: str, machine: str, python: str) -> str:
    return f"{build.key}-{system}-{machine}-py{python}"


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    size: int  # download bytes (0: not known)


@dataclass(frozen=True)
class Plan:
    """What ``--setup-compute`` will do. ``action``: "install" (fetch ``packages`` into ``folder``), "none"
    (the bundled torch already serves this machine) or "impossible" (``reason`` says what would work)."""

    variant: str
    action: str
    reason: str
    build: TorchBuild | None = None
    lock: Path | None = None
    index: str | None = None
    find_links: Path | None = None
    packages: tuple[Package, ...] = ()
    folder: Path | None = None
    warnings: tuple[str, ...] = ()

    @property
    def download_bytes(self) -> int:
        return sum(p.size for p in self.packages)

    def describe(self) -> list[str]:
        lines = [f"plan: {self.action} — {self.reason}"]
        if self.action == "install":
            source = f"local wheels in {self.find_links}" if self.find_links else f"{self.index} (lock {self.lock})"
            lines.append(f"from: {source}")
            size = human_bytes(self.download_bytes) if self.download_bytes else "unknown (local wheels)"
            lines.append(f"packages: {len(self.packages)}, download {size}")
            for p in self.packages:
                lines.append(f"  {p.name}=={p.version}" + (f"  {human_bytes(p.size)}" if p.size else ""))
            lines.append(f"target folder: {self.folder}")
        lines += [f"warning: {w}" for w in self.warnings]
        return lines

    def to_json(self) -> dict:
        return {
            "variant": self.variant,
            "action": self.action,
            "reason": self.reason,
            "build": self.build.key if self.build else None,
            "lock": str(self.lock) if self.lock else None,
            "index": self.index,
            "find_links": str(self.find_links) if self.find_links else None,
            "packages": [{"name": p.name, "version": p.version, "bytes": p.size} for p in self.packages],
            "download_bytes": self.download_bytes,
            "folder": str(self.folder) if self.folder else None,
            "warnings": list(self.warnings),
        }


def _version(text: str) -> tuple[int, ...]:
    out = []
    for part in text.split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits or 0))
    return tuple(out)


def _dotted(v: tuple[int, ...]) -> str:
    return ".".join(f"{n:02d}" if i == 2 else str(n) for i, n in enumerate(v))


def _read_lock(lock: Path) -> tuple[Package, ...]:
    """The packages of a lock, from its ``.json`` (name, version, download bytes)."""
    sidecar = lock.with_suffix(".json")
    try:
        data = json.loads(sidecar.read_text(encoding="utf-8"))
        return tuple(Package(p["name"], p["version"], int(p.get("bytes") or 0)) for p in data["packages"])
    except (OSError, ValueError, KeyError, TypeError):
        found = []
        for line in lock.read_text(encoding="utf-8").splitlines():
            if line and not line.startswith((" ", "#", "-")) and "==" in line:
                name, version = line.split("==", 1)
                found.append(Package(name.strip(), version.split()[0].rstrip("\\ ;"), 0))
        return tuple(found)


def _fits(build: TorchBuild, det: Detection) -> bool:
    return (det.system, det.machine) in build.platforms


def choose(
    det: Detection,
    want: str = "auto",
    find_links: Path | None = None,
    locks: Path | None = None,
    runtimes: Path | None = None,
) -> Plan:
    """The plan for ``want`` ("auto" picks from the detection) on the detected machine.

    With ``find_links`` the packages come from that folder of wheels (``torch==TORCH_VERSION``, no lock
    needed: the user chose the wheels); else only a build with a committed lock file for this system,
    machine and Python can be installed."""
    if want not in VARIANTS:
        raise ValueError(f"unknown compute variant {want!r} (one of {', '.join(VARIANTS)})")
    variant = det.kind if want == "auto" else want
    locks = locks or locks_dir()
    runtimes = runtimes or runtimes_dir()
    folder = runtimes / f"{variant}-torch{TORCH_VERSION}"
    warnings: list[str] = []
    platform_text = f"{det.system} {det.machine}"

    def lock_of(build: TorchBuild) -> Path | None:
        path = locks / f"{lock_name(build, det.system, det.machine, det.python)}.txt"
        return path if path.is_file() else None

    def install(build: TorchBuild | None, reason: str) -> Plan:
        if find_links is not None:
            return Plan(
                variant,
                "install",
                reason,
                build,
                None,
                None,
                find_links,
                (Package("torch", TORCH_VERSION, 0),),
                folder,
                tuple(warnings),
            )
        assert build is not None
        lock = lock_of(build)
        assert lock is not None
        return Plan(
            variant, "install", reason, build, lock, build.index, None, _read_lock(lock), folder, tuple(warnings)
        )

    candidates = [b for b in BUILDS if b.variant == variant and _fits(b, det)]
    if variant == "mps":
        if not det.apple_silicon and want != "auto":
            return Plan(variant, "impossible", f"MPS is Apple Silicon's GPU; this is {platform_text}")
        return Plan(variant, "none", "the bundled torch already reaches the Apple GPU through MPS; nothing to fetch")
    if variant == "cpu":
        if find_links is not None:
            return install(candidates[0] if candidates else None, "the CPU build of torch from local wheels")
        if candidates and lock_of(candidates[0]):
            return install(candidates[0], f"torch {TORCH_VERSION}, {candidates[0].label}")
        return Plan(variant, "none", "the bundled torch is the CPU build; nothing to fetch")
    if not candidates:
        what = "CUDA" if variant == "cuda" else "ROCm"
        return Plan(
            variant,
            "impossible",
            f"torch {TORCH_VERSION} has no {what} build for {platform_text}; the bundled CPU torch stays in use",
        )
    if variant == "rocm" and not det.amd_gpus:
        warnings.append("no AMD GPU was found under ROCm: this torch will compute on the CPU until one is")
    if variant == "cuda":
        if not det.nvidia:
            warnings.append("no NVIDIA GPU was found: this torch will compute on the CPU until one is")
        elif det.driver:
            driver = _version(det.driver)
            runnable = [b for b in candidates if det.system in b.min_driver and driver >= b.min_driver[det.system]]
            if not runnable:
                needs = " or ".join(
                    f"{_dotted(b.min_driver[det.system])} for the {b.label} ({b.index})"
                    for b in candidates
                    if det.system in b.min_driver
                )
                return Plan(
                    variant,
                    "impossible",
                    f"NVIDIA driver {det.driver} is too old for torch {TORCH_VERSION}: it needs driver "
                    f"{needs}. Update the NVIDIA driver; until then the bundled CPU torch stays in use",
                )
            candidates = runnable
    if find_links is not None:
        return install(candidates[0], f"torch {TORCH_VERSION}, {candidates[0].label}, from local wheels")
    locked = [b for b in candidates if lock_of(b)]
    if locked:
        return install(locked[0], f"torch {TORCH_VERSION}, {locked[0].label}")
    names = ", ".join(f"{b.label} ({b.index})" for b in candidates)
    hint = ""
    if variant == "cuda" and det.system == "linux":
        newest = BUILDS[0]
        if newest not in candidates and lock_of(newest):
            hint = (
                f"; or update the NVIDIA driver to {_dotted(newest.min_driver['linux'])} or newer to use the "
                f"{newest.label}"
            )
    return Plan(
        variant,
        "impossible",
        f"this machine needs the {names}, which this copy of RAM Desktop cannot download (it carries no list of "
        f"that build's files); install it from torch files (.whl) you downloaded yourself, naming their folder "
        f"(Settings → Compute: the folder field; command line: --find-links DIR){hint}. Until then the CPU version "
        f"of torch RAM Desktop comes with stays in use",
    )
