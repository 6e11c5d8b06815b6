"""What compute the app uses now, in words: for the status bar, the About box and ``--compute-info``
(docs/compute.md). Imports torch (call it where torch is loaded anyway)."""

from __future__ import annotations

import warnings
from pathlib import Path
from types import ModuleType

from . import detect, runtime
from .verify import no_driver_reason


def describe_torch() -> dict[str, str]:
    """What the About box and ``--compute-info`` show (imports torch)."""
    import torch

    state = runtime.status()
    found = detect.detect()
    out = {
        "torch": str(torch.__version__),
        "torch file": str(Path(torch.__file__).parent),
        "runtime folder": str(state.folder) if state.folder else "none (the bundled torch)",
        "CUDA (torch build)": str(torch.version.cuda),
        "NVIDIA driver": found.driver or "none found",
        "driver supports CUDA": found.cuda or "-",
    }
    out["compute"] = compute_label(torch)
    return out


def compute_in_use(torch: ModuleType) -> tuple[str, str | None]:
    """What computes — the GPU's name, or "CPU" — and, on the CPU with a GPU build of torch, why that build
    found no usable GPU (None otherwise: a GPU computes, or this is the CPU build, which has none to use)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cuda = torch.cuda.is_available()
    if cuda:
        return torch.cuda.get_device_name(0), None
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "Apple GPU (MPS)", None
    if torch.version.cuda or getattr(torch.version, "hip", None):
        said = next((str(w.message).strip().splitlines()[0] for w in caught if str(w.message).strip()), "")
        why = said or no_driver_reason("cuda" if torch.version.cuda else "rocm")
        return "CPU", f"this torch found no usable GPU: {why}"
    return "CPU", None


def compute_label(torch: ModuleType) -> str:
    """``--compute-info``'s words: the GPU's name, or "CPU" and why not the GPU."""
    device, why = compute_in_use(torch)
    return f"{device} ({why})" if why else device
