"""The check a runtime folder's torch must pass, run in a child process (docs/compute.md#verification):
torch imports from that folder, and a small matrix product on the device equals the CPU's.

    python -m ram_desktop.core.compute.verify FOLDER VARIANT MODULES   (frozen: ram-desktop --verify-runtime ...)

prints one line ``RAM-RUNTIME-VERIFY {json}`` and exits 0 when the check passed. The product uses small
integers (exact in float32 and TF32), so the device must give the CPU's result bit for bit. A GPU build
on a machine without a usable GPU passes on the CPU and says why the GPU was not used.

:func:`run` starts that child for the install and for the start-up: in a process group of its own, with a
time limit, and ended with everything it started when the limit passes or the caller is interrupted (a
signal, a cancel). Whatever the folder's torch does (raise, fail to parse, ``sys.exit``, hang), the
caller gets a verdict, never that failure.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

from ... import paths
from .detect import detect_nvidia
from .finder import use_folder

PREFIX = "RAM-RUNTIME-VERIFY "
OUTPUT_TAIL = 65536  # the bytes of the child's output read back: its verdict line is the last thing it prints

__all__ = ["PREFIX", "command", "console_executable", "main", "run"]


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

    result.update(
        torch=torch.__version__,
        file=str(torch.__file__),
        cuda=torch.version.cuda,
        hip=getattr(torch.version, "hip", None),
    )
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


def console_executable() -> str:
    """The interpreter for uv and the check: this Python, or in the frozen app its console executable (the
    windowed ``ram-desktop`` of Windows and macOS has no stdout; its sibling ``ram-merge`` has)."""
    exe = Path(sys.executable)
    if paths.is_frozen() and sys.platform in ("win32", "darwin"):
        console = exe.with_name("ram-merge.exe" if sys.platform == "win32" else "ram-merge")
        if console.is_file():
            return str(console)
    return str(exe)


def command(folder: Path, variant: str, modules: Sequence[str]) -> list[str]:
    """The child process that checks a runtime folder (the frozen app answers ``--verify-runtime``)."""
    args = [str(folder), variant, ",".join(modules)]
    if paths.is_frozen():
        return [console_executable(), "--verify-runtime", *args]
    return [sys.executable, "-m", "ram_desktop.core.compute.verify", *args]


def _tail(stream: IO[bytes]) -> str:
    stream.seek(0, os.SEEK_END)
    stream.seek(max(0, stream.tell() - OUTPUT_TAIL))
    return stream.read().decode("utf-8", errors="replace")


def _end(process: subprocess.Popen) -> None:
    """End the child and everything it started (its process group), and reap it."""
    if process.poll() is None:
        try:
            if sys.platform.startswith("win"):
                process.kill()
            else:
                os.killpg(process.pid, signal.SIGKILL)
        except OSError:
            pass
    process.wait()


def run(
    folder: Path,
    variant: str,
    modules: Sequence[str],
    timeout_s: float,
    poll: Callable[[], None] = lambda: None,
) -> dict:
    """Check ``folder``'s torch in a child process and return the child's verdict: ``{"ok": True, "torch":
    ..., "device": ...}``, or ``{"ok": False, "error": one line}`` when torch failed, the child died or it
    did not finish within ``timeout_s``. ``poll`` is called every tenth of a second and may raise (a cancel);
    the child's whole process group ends with any exception (a signal's ``KeyboardInterrupt`` too)."""
    env = dict(os.environ, RAM_DESKTOP_RUNTIME="off", PYTHONNOUSERSITE="1")
    group: dict = (
        {"start_new_session": True}
        if not sys.platform.startswith("win")
        else {"creationflags": getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0)}
    )
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            process = subprocess.Popen(
                command(folder, variant, modules), stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env, **group
            )
        except OSError as e:
            return {"ok": False, "error": f"it could not start: {e.strerror or e}"}
        deadline = time.monotonic() + timeout_s
        try:
            while process.poll() is None:
                poll()
                if time.monotonic() > deadline:
                    return {"ok": False, "error": f"it did not finish within {timeout_s:g} s"}
                try:
                    process.wait(timeout=0.1)
                except subprocess.TimeoutExpired:
                    pass
        finally:
            _end(process)
        stdout, stderr = _tail(out), _tail(err)
    line = next((ln for ln in reversed(stdout.splitlines()) if ln.startswith(PREFIX)), None)
    try:
        result = json.loads(line[len(PREFIX) :]) if line is not None else None
    except ValueError:
        result = None
    if not isinstance(result, dict):
        tail = (stderr.strip().splitlines() or stdout.strip().splitlines() or ["no output"])[-1]
        return {"ok": False, "error": f"it ended with exit {process.returncode}: {tail.strip()}"}
    if result.get("ok") is not True:
        result["ok"] = False
        result["error"] = str(result.get("error") or "unknown reason")
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
