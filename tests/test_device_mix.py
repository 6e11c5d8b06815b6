"""No method mixes a host tensor into a device computation: every method of ``METHODS`` merged through the torch
path on a simulated accelerator (``device_sim``: chunks arrive as device tensors, a host tensor of one or more
dimensions joining them raises CUDA's "Expected all tensors to be on the same device") on a machine without a GPU.

The same merge on the CPU's torch path gives the reference bytes: the simulation only tags tensors, so every
byte must match. ``linear`` and ``slerp`` built their coefficients on the host before this test existed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from ram_desktop.core import pipeline
from ram_desktop.core.engine import kernels
from ram_desktop.core.methods import METHODS
from ram_desktop.core.spec import MergeSpec

from . import device_sim
from .synthetic import CONFIG, demo_shapes, generate_tensors, write_model
from .test_fisher_merge import random_fishers

SMALL = {**CONFIG, "num_hidden_layers": 2, "vocab_size": 256}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[Path, list[Path], list[Path]]:
    folder = tmp_path_factory.mktemp("device-mix")
    base, agents = generate_tensors(demo_shapes(SMALL))
    base_dir = write_model(folder / "base", base, SMALL)
    agent_dirs = [
        write_model(folder / name, tensors, SMALL, shards=2 if i == 1 else 1)
        for i, (name, tensors) in enumerate(agents.items())
    ]
    fishers, _ = random_fishers(agent_dirs, folder / "fisher")
    return base_dir, agent_dirs, fishers


# a method that stacks layers takes a layer map: agent 1's first layer on agent 2's two
STACKED = [{"sources": [{"model": 1, "layer_range": [0, 1]}]}, {"sources": [{"model": 2, "layer_range": [0, 2]}]}]
# WUDI's optimisation, shortened; its products are summed in BLAS's order, which follows the thread count, so its
# result agrees to float32 rounding rather than bit for bit (docs/methods.md, WUDI): compared in float32 below
OPTIMISED = {"wudi": {"steps": 4}}


def _spec(method: str, base: Path, agents: list[Path], fishers: list[Path], out: Path) -> MergeSpec:
    count = min(METHODS[method].agents[1] or 3, 3)
    params = {"fisher": [str(f) for f in fishers[:count]]} if method == "fisher" else OPTIMISED.get(method, {})
    out_dtype = "float32" if method in OPTIMISED else "base"
    slices = STACKED if METHODS[method].streaming.stacks else None
    return MergeSpec.build(
        base, agents[:count], output=out, method=method, params=params, out_dtype=out_dtype, slices=slices
    )


def _tensors(folder: Path) -> dict[str, bytes]:
    found: dict[str, bytes] = {}
    for shard in sorted(folder.glob("*.safetensors")):
        with safe_open(str(shard), "pt") as f:
            for key in f.keys():  # noqa: SIM118 — safe_open is not iterable
                found[key] = f.get_tensor(key).contiguous().view(torch.uint8).numpy().tobytes()
    return found


@pytest.mark.parametrize("method", list(METHODS))
def test_method_makes_every_tensor_on_the_device(tmp_path, models, monkeypatch, method):
    base, agents, fishers = models
    with kernels.disabled():
        pipeline.merge(_spec(method, base, agents, fishers, tmp_path / "host"))
    monkeypatch.setattr(pipeline, "Transfer", device_sim.SimulatedTransfer)
    with kernels.disabled(), device_sim.simulated_device():
        pipeline.merge(_spec(method, base, agents, fishers, tmp_path / "device"))
    host, device = _tensors(tmp_path / "host"), _tensors(tmp_path / "device")
    assert host.keys() == device.keys()
    if method in OPTIMISED:
        for key in host:
            a, b = (torch.frombuffer(bytearray(x[key]), dtype=torch.float32).double() for x in (host, device))
            assert float((a - b).abs().max()) <= 1e-5 * float(a.abs().max()) + 1e-7, key
        return
    assert [k for k in host if host[k] != device[k]] == []


def test_the_simulation_catches_a_host_tensor_mixed_in():
    with device_sim.simulated_device():
        on_device = torch.ones(4).to(device_sim.SIM)
        made_there = torch.zeros(4, device=on_device.device)
        assert isinstance(made_there, device_sim.OnDevice) and (made_there + on_device).sum().item() == 4
        assert isinstance(on_device * torch.tensor(2.0), device_sim.OnDevice)  # a host 0-d tensor may join
        with pytest.raises(device_sim.DeviceMix):
            on_device.add_(torch.tensor([2.0]))
        with pytest.raises(device_sim.DeviceMix):
            torch.stack([on_device, torch.ones(4)])
        with pytest.raises(TypeError):
            on_device.numpy()
        assert not isinstance(on_device.cpu(), device_sim.OnDevice) and on_device.cpu().numpy().sum() == 4
