"""A GPU out of memory mid-merge (torch's ``OutOfMemoryError``, a ``RuntimeError``): one line naming the device and
what to try, nothing written, the staging folder gone — in a fresh ``ram-merge`` (the window: tests/gui/test_device_memory_window.py).

No GPU here: the run is put on a simulated accelerator (``device_sim``) under the name ``cuda:0``, and the third
chunk formed raises torch's error, as the caching allocator does when a chunk's buffers no longer fit."""

from __future__ import annotations

from pathlib import Path

import pytest

from .subproc import cli, refused
from .synthetic import write_synthetic

REPO = Path(__file__).resolve().parents[1]

# run before the CLI in its process: the device is "cuda:0" by name, the chunks tagged device tensors, and the
# third chunk formed fails as an exhausted GPU fails
PRELUDE = f"""
import sys
sys.path.insert(0, {str(REPO)!r})
import torch
from tests import device_sim
from ram_desktop.core import pipeline
from ram_desktop.core.devices import DeviceChoice
from ram_desktop.core.engine import chunks

pipeline.choose_device = lambda requested, cpu_kernels: DeviceChoice("cuda:0", "simulated")
pipeline.Transfer = device_sim.SimulatedTransfer
made = chunks.make_chunk
calls = []

def exhausted(*args, **kwargs):
    calls.append(1)
    if len(calls) == 3:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 139.8 GiB total)")
    return made(*args, **kwargs)

chunks.make_chunk = exhausted
SIMULATED = device_sim.simulated_device()  # kept: the mode lasts as long as this object
SIMULATED.__enter__()
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[Path, list[Path]]:
    return write_synthetic(tmp_path_factory.mktemp("oom"))


def _left_beside(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(out.name))


@pytest.mark.parametrize("method", ["average", "ram-plus"])
def test_the_cli_says_one_line_and_writes_nothing(tmp_path, models, method):
    base, agents = models
    out = tmp_path / "merged"
    args = ("merge", str(base), *map(str, agents), "--method", method, "--out", str(out))
    done = cli(tmp_path, *args, prelude=PRELUDE, timeout=300)
    line = refused(done, "GPU cuda:0 ran out of memory", "nothing was written", "--device cpu")
    assert "Traceback" not in done.stderr and "RuntimeError" not in line
    assert _left_beside(out) == []
