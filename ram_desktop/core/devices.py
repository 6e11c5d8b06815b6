"""The one place that turns a device name into a torch device, for merges, probes and evaluations.

The names follow the torch builds the compute set-up installs (``core.compute.builds``: cpu, cuda, rocm,
mps): ``cpu``; ``cuda`` / ``cuda:N`` (an NVIDIA GPU with a CUDA build, or an AMD GPU with a ROCm build,
which reports its GPUs as ``cuda`` devices); ``rocm`` / ``rocm:N``, the same device named by its build
(accepted only where the running torch is a ROCm build, ``torch.version.hip``); ``mps`` (Apple silicon with
the macOS build); ``auto``: the first CUDA or ROCm GPU, else the CPU (never MPS: it computes in float32
only, so it is chosen by name). A device the running torch cannot use is one ``InputError`` naming it and
the build.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

from .errors import InputError
from .lazy import torch

NAMES = ("auto", "cpu", "cuda", "cuda:N", "rocm", "rocm:N", "mps")
GPU_KINDS = ("cuda", "rocm")  # torch's "cuda" devices, under the name of either build


def torch_build() -> str:
    """The running torch's build, as ``core.compute.builds`` names its variants: "rocm", "cuda", "mps" or "cpu"."""
    if getattr(torch.version, "hip", None):
        return "rocm"
    if torch.version.cuda:
        return "cuda"
    if sys.platform == "darwin" and torch.backends.mps.is_built():
        return "mps"
    return "cpu"


def _build_words() -> str:
    """The running torch in words, for an error: "torch 2.5.1+cpu (a CPU build)"."""
    kind = {"rocm": "a ROCm build", "cuda": "a CUDA build", "mps": "the macOS build", "cpu": "a CPU build"}
    return f"torch {torch.__version__} ({kind[torch_build()]})"


def _gpu_count() -> int:
    """CUDA (or ROCm) devices the running torch can use; 0 when none (or a broken driver)."""
    try:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except (RuntimeError, AssertionError):
        return 0


def resolve_device(spec: str = "auto") -> torch.device:
    """The torch device ``spec`` names (module docstring); an ``InputError`` for an unknown name or a device
    the running torch cannot use."""
    text = (spec or "auto").strip().lower()
    if text == "auto":
        return torch.device("cuda" if _gpu_count() else "cpu")
    kind, colon, index = text.partition(":")
    if kind not in ("cpu", "mps", *GPU_KINDS) or (colon and (kind not in GPU_KINDS or not index.isdigit())):
        raise InputError(f"unknown device {spec!r}; use {', '.join(NAMES[:-1])} or {NAMES[-1]}")
    if kind == "cpu":
        return torch.device("cpu")
    if kind == "mps":
        if not torch.backends.mps.is_available():
            raise InputError(f"device mps requested but {_build_words()} cannot use it here; use --device cpu")
        return torch.device("mps")
    if kind == "rocm" and torch_build() != "rocm":
        raise InputError(f"device {text} requested but {_build_words()} is not a ROCm build; use --device cpu")
    count = _gpu_count()
    gpu = "ROCm" if torch_build() == "rocm" else "CUDA"
    if count == 0:
        raise InputError(f"device {text} requested but no {gpu} GPU is available to {_build_words()}; use --device cpu")
    if index and int(index) >= count:
        raise InputError(f"device {text} does not exist; {count} {gpu} device(s) found")
    return torch.device("cuda", int(index)) if index else torch.device("cuda")


def device_spec(spec: str = "auto") -> str:
    """``resolve_device``'s choice by name ("cpu", "cuda:0", "mps"), without importing torch where no GPU can
    be present (a CPU-only command then need not load it)."""
    text = (spec or "auto").strip().lower()
    if text == "cpu" or (text == "auto" and not gpu_possible()):
        return "cpu"
    return str(resolve_device(text))


@dataclass(frozen=True)
class DeviceChoice:
    """Where a streamed probe or merge runs (``name``: "cpu", "cuda:0") and why, in words: the report's
    ``device`` and ``device_reason``, and a log line in both faces."""

    name: str
    reason: str


def choose_device(requested: str, cpu_kernels: Callable[[], bool]) -> DeviceChoice:
    """``requested`` resolved for a streamed probe or merge (an ``InputError`` as ``resolve_device`` gives).

    ``auto`` takes the CPU where every step of the run has a fused CPU kernel (``cpu_kernels()``, asked only
    where a GPU is present: it loads numba): those kernels
    read the stored weights in place and are bound by memory bandwidth, while the GPU path copies every chunk
    over the bus first — on an H200 host RAM+ took 21.5 s on CUDA and 3.65 s on the CPU (docs/compute.md,
    "Which device runs a merge"). Otherwise the first CUDA or ROCm GPU, else the CPU. A named device is used
    as named."""
    text = (requested or "auto").strip().lower()
    if text != "auto":
        return DeviceChoice(device_spec(text), f"{text} as chosen")
    gpu = device_spec("auto")
    if gpu == "cpu":
        return DeviceChoice("cpu", "auto: no CUDA or ROCm GPU here")
    if cpu_kernels():
        return DeviceChoice(
            "cpu",
            f"auto: the CPU's fused kernels stream this merge faster than the GPU ({gpu}) path, which copies every "
            "chunk to the GPU first; choose the GPU by name to use it",
        )
    return DeviceChoice(gpu, f"auto: the GPU ({gpu}); not every step of this run has a fused CPU kernel")


def gpu_possible() -> bool:
    """False only where no CUDA (or ROCm) device can exist: Linux without an NVIDIA, AMD KFD or WSL GPU device
    node. Elsewhere torch is asked."""
    if sys.platform != "linux":
        return True
    return any(os.path.exists(node) for node in ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd", "/dev/dxg"))


def list_devices() -> list[tuple[str, str]]:
    """Devices a merge can run on, as ``(spec, label)``: each CUDA or ROCm GPU by name and memory, then MPS
    where the running torch can use it, then the CPU. ``spec`` is what ``resolve_device`` accepts."""
    devices: list[tuple[str, str]] = []
    for index in range(_gpu_count()):
        try:
            props = torch.cuda.get_device_properties(index)
            label = f"cuda:{index} — {props.name} ({props.total_memory / 2**30:.0f} GiB)"
        except (RuntimeError, AssertionError):  # torch's errors for a device it cannot query
            label = f"cuda:{index}"
        devices.append((f"cuda:{index}", label))
    if sys.platform == "darwin" and torch.backends.mps.is_available():
        devices.append(("mps", "mps — Apple GPU (float32)"))
    devices.append(("cpu", f"CPU ({os.cpu_count() or 1} cores)"))
    return devices
