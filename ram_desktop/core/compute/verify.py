"""The check a new runtime folder must pass, run in a child process (docs/compute.md#verification):
torch imports from that folder, and a small matrix product on the device equals the CPU's.

    python -m ram_desktop.core.compute.verify FOLDER VARIANT MODULES   (frozen: ram-desktop --verify-runtime ...)

prints one line ``RAM-RUNTIME-VERIFY {json}`` and exits 0 when the check passed. The product uses small
integers (exact in float32 and TF32), so the device must give the CPU's result bit for bit. A GPU build
on a machine without a usable GPU passes on the CPU and says why the GPU was not used.
"""

from __future__ import annotations

import json
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

from .detect import detect_nvidia
from .runtime import use_folder

PREFIX = "RAM-RUNTIME-VERIFY "


def no_driver_reason(variant: str) -> str:
    """Why a GPU build sees no GPU, when torch itself does not say: what the detection found."""
    if variant == "rocm":
        return "no AMD GPU was found under ROCm"
    gpus, _driver, _cuda, notes = detect_nvidia()
    if notes:
        return notes[0]
    return "the NVIDIA driver did not offer a GPU" if gpus else "no NVIDIA driver or GPU was found (no nvidia-smi)"


def _gpu_device(torch, variant: str) -> tuple[str | None, str | None, str]:
    """``(device, device name, why not)`` for the variant's accelerator."""
    if variant in ("cuda", "rocm"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ok = torch.cuda.is_available()
        if ok:
            return "cuda", torch.cuda.get_device_name(0), ""
        said = next((str(w.message).strip().splitlines()[0] for w in caught if str(w.message).strip()), "")
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else f"HIP {getattr(torch.version, 'hip', None)}"
        return None, None, f"torch ({build}) found no usable GPU: {said or no_driver_reason(variant)}"
    if variant == "mps":
        if torch.backends.mps.is_available():
            return "mps", "Apple GPU (MPS)", ""
        return None, None, "MPS is not available"
    return None, None, ""


def check(folder: Path, variant: str, modules: Sequence[str] = ("torch",)) -> dict:
    use_folder(folder, modules)
    result: dict = {"ok": False}
    import torch

    result.update(torch=torch.__version__, file=str(torch.__file__), cuda=torch.version.cuda,
                  hip=getattr(torch.version, "hip", None))
    site = (folder / "site").resolve()
    if not Path(torch.__file__).resolve().is_relative_to(site):
        result["error"] = f"torch was imported from {torch.__file__}, not from {site}"
        return result
    device, name, why = _gpu_device(torch, variant)
    result.update(device=device or "cpu", device_name=name, gpu=device is not None, why_no_gpu=why or None)
    gen = torch.Generator().manual_seed(0)
    a = torch.randint(-4, 5, (64, 48), generator=gen).float()
    b = torch.randint(-4, 5, (48, 32), generator=gen).float()
    want = a @ b
    got = (a.to(device or "cpu") @ b.to(device or "cpu")).cpu()
    result["matmul_equal"] = bool(torch.equal(want, got))
    result["ok"] = result["matmul_equal"]
    if not result["ok"]:
        result["error"] = f"a 64×48 @ 48×32 product on {device} differs from the CPU's"
    return result


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) not in (2, 3):
        print("usage: python -m ram_desktop.core.compute.verify FOLDER VARIANT [MODULE,...]", file=sys.stderr)
        return 2
    try:
        result = check(Path(args[0]), args[1], [m for m in (args[2] if len(args) == 3 else "torch").split(",") if m])
    except BaseException as e:  # noqa: BLE001  any failure is the answer, reported as one line
        text = str(e).strip()
        result = {"ok": False, "error": f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"}
    print(PREFIX + json.dumps(result), flush=True)
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
