"""Start-up: ``ram-merge merge`` on the fused CPU kernels never imports torch (``core.lazy``), and the pieces
that make that possible (the reader's bit views, the device choice) give what the torch path gives."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from ram_desktop.core import MergeSpec, RunOptions, devices
from ram_desktop.core.engine import kernels
from ram_desktop.core.engine.chunks import SliceReader, Span, as_tensor
from ram_desktop.core.pipeline import merge

from .conftest import make_models

RUN_CLI = """
import sys
from ram_desktop.cli import main
code = main(sys.argv[1:])
print("TORCH-LOADED" if "torch" in sys.modules else "TORCH-NOT-LOADED")
sys.exit(code)
"""


def _cli(args: list[str], env_cache: Path) -> subprocess.CompletedProcess:
    import os

    env = dict(os.environ, RAM_DESKTOP_CACHE=str(env_cache))
    return subprocess.run(
        [sys.executable, "-c", RUN_CLI, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=Path(__file__).resolve().parents[1],
        check=False,
    )


@pytest.mark.parametrize(
    "method,params", [("ram-plus", []), ("ties", ["--density", "0.3"]), ("dare-ties", ["--drop", "0.5"])]
)
def test_cpu_merge_on_the_fused_kernels_never_imports_torch(tmp_path, method, params):
    if not kernels.available():
        pytest.skip("numba not installed")
    base, agents = make_models(tmp_path / "in", shards=2)
    out = tmp_path / "out"
    done = _cli(
        [
            "-q",
            "merge",
            str(base),
            *map(str, agents),
            "--out",
            str(out),
            "--method",
            method,
            *params,
            "--device",
            "cpu",
            "--shard-size",
            "4KB",
        ],
        tmp_path / "cache-cli",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "TORCH-NOT-LOADED"

    # the same folder as an in-process merge on the torch path (the reference formulation)
    with kernels.disabled():
        reference = merge(
            MergeSpec.build(
                str(base),
                [str(a) for a in agents],
                tmp_path / "ref",
                method=method,
                params=dict(zip([p.lstrip("-") for p in params[::2]], [float(v) for v in params[1::2]])),
                device="cpu",
                shard_size="4KB",
            ),
            options=RunOptions(use_cache=False),
        )
    files = sorted(p.name for p in reference.out.iterdir())
    assert sorted(p.name for p in out.iterdir()) == files
    assert len([f for f in files if f.endswith(".safetensors")]) >= 2
    for name in files:
        if name.endswith(".safetensors") or name in ("config.json", "model.safetensors.index.json", "README.md"):
            assert (out / name).read_bytes() == (reference.out / name).read_bytes(), name
    ours, ref = (json.loads((folder / "merge-report.json").read_text()) for folder in (out, reference.out))
    for report in (ours, ref):
        report.pop("timings")
    assert ours == ref  # versions included: read from package metadata without importing torch


def test_a_command_that_needs_torch_still_gets_it(tmp_path):
    """The torch path (here: a LoRA-free probe with the complete statistics) imports torch at first use."""
    base, agents = make_models(tmp_path / "in")
    done = _cli(
        ["-q", "probe", str(base), *map(str, agents), "--device", "cpu", "--json", str(tmp_path / "p.json")],
        tmp_path / "cache",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "TORCH-LOADED"
    assert json.loads((tmp_path / "p.json").read_text())["agents"]


@pytest.mark.parametrize(
    "dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.int64, torch.uint8]
)
def test_bit_views_hold_the_stored_bytes(tmp_path, dtype):
    """``SliceReader(bits=True)`` slices are the stored bytes, row-sliced like the tensor reader's, and
    ``as_tensor`` makes a float one the same tensor again."""
    g = torch.Generator().manual_seed(3)
    if dtype.is_floating_point:
        value = torch.randn(7, 5, generator=g).to(dtype)
        value[0, 0], value[0, 1] = -0.0, float("inf")
    else:
        value = torch.randint(0, 100, (7, 5), generator=g).to(dtype)
    file = tmp_path / "t.safetensors"
    save_file({"w": value, "s": value[0, 0].clone()}, str(file))
    span = Span(2, 6, 10, 20)
    with SliceReader(bits=True) as bits_reader, SliceReader() as tensor_reader:
        bits = bits_reader.read(file, "w", span, (7, 5))
        tensor = tensor_reader.read(file, "w", span, (7, 5))
        scalar = bits_reader.read(file, "s", Span(0, 1, 0, 1), ())
    assert isinstance(bits, np.ndarray) and bits.shape == (20,)
    assert bits.tobytes() == value[2:6].contiguous().view(-1).view(torch.uint8).numpy().tobytes()
    assert tensor.reshape(-1).view(torch.uint8).numpy().tobytes() == bits.tobytes()
    assert scalar.tobytes() == value[0, 0].reshape(1).view(torch.uint8).numpy().tobytes()
    if dtype.is_floating_point:
        back = as_tensor(bits)
        assert back.dtype == dtype and torch.equal(back.view(torch.uint8), value[2:6].reshape(-1).view(torch.uint8))


def test_device_choice_without_torch_where_no_gpu_can_exist(monkeypatch):
    asked = []
    monkeypatch.setattr(devices, "resolve_device", lambda spec: asked.append(spec) or torch.device("cuda:1"))
    monkeypatch.setattr(devices.sys, "platform", "linux")
    monkeypatch.setattr(devices.os.path, "exists", lambda path: False)
    assert devices.device_spec("cpu") == "cpu"
    assert devices.device_spec("auto") == "cpu"
    assert devices.device_spec("") == "cpu"
    assert asked == []
    assert devices.device_spec("cuda") == "cuda:1"  # asked for explicitly: torch decides (and checks) it
    monkeypatch.setattr(devices.os.path, "exists", lambda path: path == "/dev/nvidiactl")
    assert devices.device_spec(" AUTO ") == "cuda:1"
    monkeypatch.setattr(devices.os.path, "exists", lambda path: False)
    monkeypatch.setattr(devices.sys, "platform", "win32")
    assert devices.device_spec("auto") == "cuda:1"  # no device nodes to look at there: torch is asked
    assert asked == ["cuda", "auto", "auto"]


def test_deferred_module_imports_at_first_read_once_from_many_threads():
    """The stand-in imports its module at the first attribute read (from whichever thread reads first, the
    others waiting on the import lock), hands out the real attributes, and writes go to the real module."""
    code = """
import sys, threading
from ram_desktop.core.lazy import DeferredModule
wave = DeferredModule("wave")
assert "wave" not in sys.modules
seen, barrier = [], threading.Barrier(8)
def read():
    barrier.wait()
    seen.append(wave.open)
threads = [threading.Thread(target=read) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
real = sys.modules["wave"]
assert len(seen) == 8 and all(f is real.open for f in seen)
wave.marker = 5
assert real.marker == 5 and wave.marker == 5
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[1],
        check=False,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
