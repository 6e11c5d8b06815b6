"""What accelerator this machine has: NVIDIA GPUs (``nvidia-smi``), AMD GPUs under ROCm on Linux
(``rocminfo``, the ROCm folder), Apple Silicon (MPS), else only the CPU (docs/compute.md#detection).

Nothing here imports torch: the answer must be known before a torch build is chosen. Every external
program runs with a time limit; one that is missing, fails, hangs or prints something unexpected gives no
device and a note saying what happened, never an exception.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

TIMEOUT_S = 15.0

__all__ = ["Detection", "NvidiaGpu", "detect", "detect_nvidia", "detect_rocm", "machine_name", "system_name"]


@dataclass(frozen=True)
class NvidiaGpu:
    name: str
    memory_mib: int | None
    driver: str


@dataclass(frozen=True)
class Detection:
    """One look at the machine. ``cuda`` is the newest CUDA version the NVIDIA driver supports (from
    ``nvidia-smi``'s header), ``rocm`` the ROCm version found (None: no ROCm). ``notes`` say what could
    not be read and why (a broken ``nvidia-smi``, say)."""

    system: str  # "linux" | "windows" | "macos"
    machine: str  # "x86_64" | "arm64" | "aarch64" | ...
    python: str  # "3.11"
    nvidia: tuple[NvidiaGpu, ...] = ()
    driver: str | None = None
    cuda: str | None = None
    rocm: str | None = None
    amd_gpus: tuple[str, ...] = ()
    apple_silicon: bool = False
    notes: tuple[str, ...] = field(default=())

    @property
    def kind(self) -> str:
        """The best accelerator found: "cuda", "rocm", "mps" or "cpu"."""
        if self.nvidia:
            return "cuda"
        if self.amd_gpus and self.rocm is not None:
            return "rocm"
        if self.apple_silicon:
            return "mps"
        return "cpu"

    def describe(self) -> list[str]:
        """Plain lines for a person: what was found, then the notes."""
        lines = [f"system: {self.system} {self.machine}, Python {self.python}"]
        for i, gpu in enumerate(self.nvidia):
            memory = f", {gpu.memory_mib / 1024:.0f} GiB" if gpu.memory_mib else ""
            lines.append(f"NVIDIA GPU {i}: {gpu.name}{memory}")
        if self.driver:
            lines.append(f"NVIDIA driver {self.driver}"
                         + (f" (supports CUDA up to {self.cuda})" if self.cuda else " (CUDA version not reported)"))
        if self.rocm is not None or self.amd_gpus:
            gpus = ", ".join(self.amd_gpus) or "no GPU agent listed"
            lines.append(f"AMD ROCm {self.rocm or '(version unknown)'}: {gpus}")
        if self.apple_silicon:
            lines.append("Apple Silicon: the GPU is reached through MPS")
        if self.kind == "cpu":
            lines.append("no GPU found: the CPU computes")
        lines += [f"note: {n}" for n in self.notes]
        return lines

    def to_json(self) -> dict:
        data = asdict(self)
        data["kind"] = self.kind
        return data


def system_name() -> str:
    if sys.platform.startswith("win"):
        return "windows"
    if sys.platform == "darwin":
        return "macos"
    return "linux" if sys.platform.startswith("linux") else sys.platform


def machine_name() -> str:
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "x64": "x86_64", "arm64": "arm64", "aarch64": "aarch64"}.get(machine, machine)


def _run(program: str, *args: str) -> tuple[int, str, str] | str:
    """``(exit code, stdout, stderr)``, or a one-line reason when the program could not run at all."""
    try:
        done = subprocess.run([program, *args], check=False, capture_output=True, timeout=TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return f"{Path(program).name} did not answer within {TIMEOUT_S:.0f} s"
    except OSError as e:
        return f"{Path(program).name} could not run: {e.strerror or e}"
    decode = lambda b: b.decode("utf-8", errors="replace")
    return done.returncode, decode(done.stdout), decode(done.stderr)


def _first_line(text: str, limit: int = 160) -> str:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "(nothing)")
    return line if len(line) <= limit else line[: limit - 1] + "…"


_MEMORY = re.compile(r"^\s*(\d+)\s*(MiB)?\s*$")
_DRIVER = re.compile(r"^\d+(\.\d+)+$")
_CUDA_HEADER = re.compile(r"CUDA Version\s*:\s*(\d+\.\d+)")


def detect_nvidia(program: str | None = None) -> tuple[tuple[NvidiaGpu, ...], str | None, str | None, list[str]]:
    """``(gpus, driver version, CUDA version the driver supports, notes)`` from ``nvidia-smi``.

    ``nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader`` lists the GPUs; the
    header of plain ``nvidia-smi`` ("CUDA Version: 13.0") gives the CUDA version. No ``nvidia-smi`` on
    PATH: no GPUs and no note."""
    program = program or shutil.which("nvidia-smi")
    if not program:
        return (), None, None, []
    name = Path(program).name
    got = _run(program, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader")
    if isinstance(got, str):
        return (), None, None, [got]
    code, out, err = got
    if code != 0:
        return (), None, None, [f"{name} failed (exit {code}): {_first_line(out + chr(10) + err)}"]
    gpus: list[NvidiaGpu] = []
    for line in out.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.rsplit(",", 2)]
        memory = _MEMORY.match(parts[1]) if len(parts) == 3 else None
        if len(parts) != 3 or not parts[0] or not memory or not _DRIVER.match(parts[2]):
            return (), None, None, [f"{name} printed something unexpected: {_first_line(line)!r}"]
        gpus.append(NvidiaGpu(parts[0], int(memory.group(1)), parts[2]))
    if not gpus:
        return (), None, None, [f"{name} listed no GPU"]
    driver = gpus[0].driver
    cuda = None
    notes: list[str] = []
    header = _run(program)
    if isinstance(header, str):
        notes.append(header)
    else:
        found = _CUDA_HEADER.search(header[1])
        if found:
            cuda = found.group(1)
        else:
            notes.append(f"{name} did not name the CUDA version its driver supports")
    return tuple(gpus), driver, cuda, notes


def _rocm_root() -> Path:
    return Path(os.environ.get("ROCM_PATH") or "/opt/rocm")


def detect_rocm(program: str | None = None) -> tuple[str | None, tuple[str, ...], list[str]]:
    """``(ROCm version or None, AMD GPU names, notes)`` on Linux: ``rocminfo`` (on PATH or in the ROCm
    folder, ``$ROCM_PATH`` or ``/opt/rocm``) lists the GPU agents, ``.info/version`` gives the version."""
    root = _rocm_root()
    if program is None:
        program = shutil.which("rocminfo")
        if program is None and (root / "bin" / "rocminfo").is_file():
            program = str(root / "bin" / "rocminfo")
    version = None
    info = root / ".info" / "version"
    try:
        version = info.read_text(encoding="utf-8").strip().split("-")[0] or None
    except (OSError, UnicodeDecodeError):
        pass
    if not program:
        return version, (), []
    got = _run(program)
    if isinstance(got, str):
        return version, (), [got]
    code, out, err = got
    if code != 0:
        return version, (), [f"rocminfo failed (exit {code}): {_first_line(out + chr(10) + err)}"]
    gpus: list[str] = []
    for agent in re.split(r"\n\*+\s*\nAgent \d+\s*\n\*+\s*\n", out)[1:]:
        fields = dict(re.findall(r"^\s{2}([A-Za-z][A-Za-z ]*?):\s+(.*?)\s*$", agent, re.MULTILINE))
        if fields.get("Device Type") == "GPU":
            gfx, market = fields.get("Name", ""), fields.get("Marketing Name", "")
            gpus.append(f"{market} ({gfx})" if market and market != gfx else gfx or market or "AMD GPU")
    notes: list[str] = []
    if "HSA Agents" not in out:
        notes.append(f"rocminfo printed something unexpected: {_first_line(out)!r}")
    if version is None and gpus:
        version = "unknown"
    return version, tuple(gpus), notes


def detect() -> Detection:
    """Look at this machine (a few seconds at most; safe to call from a worker thread)."""
    system, machine = system_name(), machine_name()
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    notes: list[str] = []
    gpus: tuple[NvidiaGpu, ...] = ()
    driver: str | None = None
    cuda: str | None = None
    if system in ("linux", "windows"):
        gpus, driver, cuda, more = detect_nvidia()
        notes += more
    rocm: str | None = None
    amd: tuple[str, ...] = ()
    if system == "linux":
        rocm, amd, more_rocm = detect_rocm()
        notes += more_rocm
    apple = system == "macos" and machine == "arm64"
    return Detection(system, machine, python, tuple(gpus), driver, cuda, rocm, tuple(amd), apple, tuple(notes))
