"""The GPU path gives the CPU path's bytes, or stays within the method's stated tolerance: every method of
``METHODS`` merged with ``--device cuda`` and with ``--device cpu``, each in a fresh ``ram-merge`` process, on the
same synthetic checkpoints (one agent sharded), must write the same tensors bit for bit — except a method with a
``gpu_tolerance`` (docs/methods.md, "On a GPU"): there at most that share of elements may differ — and the same
update counts in the report.

Skipped where no CUDA device is present (CI has none: ``tests/test_device_mix.py`` catches a tensor made on the
wrong device on the CPU); run on a GPU machine with ``python -m pytest tests/test_gpu.py``, or
``benchmarks/gpu_check.sh``, which runs the same comparison and more in one command.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from ram_desktop.core.methods import METHODS
from ram_desktop.core.spec import MergeSpec

from .subproc import cli
from .synthetic import CONFIG, demo_shapes, generate_tensors, write_model
from .test_fisher_merge import random_fishers

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

# a method that stacks layers takes a layer map: agent 1's first layer on agent 2's two
STACKED = '[{"sources": [{"model": 1, "layer_range": [0, 1]}]}, {"sources": [{"model": 2, "layer_range": [0, 2]}]}]'


# "demo": the small synthetic model (one chunk per tensor); "wide": MLP tensors of 2.8 M elements, cut into
# several chunks, so that the GPU path's chunking, prefetch and ordered writes are exercised too
SIZES = {
    "demo": CONFIG,
    "wide": {
        **CONFIG,
        "hidden_size": 1024,
        "intermediate_size": 2752,
        "head_dim": 256,
        "num_hidden_layers": 2,
        "vocab_size": 4096,
    },
}


@pytest.fixture(scope="module", params=list(SIZES))
def models(request, tmp_path_factory) -> tuple[Path, list[Path]]:
    config = SIZES[request.param]
    folder = tmp_path_factory.mktemp(f"gpu-{request.param}")
    base, agents = generate_tensors(demo_shapes(config))
    base_dir = write_model(folder / "base", base, config)
    agent_dirs = [
        write_model(folder / name, tensors, config, shards=2 if i == 1 else 1)
        for i, (name, tensors) in enumerate(agents.items())
    ]
    return base_dir, agent_dirs


def _tensors(folder: Path) -> dict[str, bytes]:
    found: dict[str, bytes] = {}
    for shard in sorted(folder.glob("*.safetensors")):
        with safe_open(str(shard), "pt") as f:
            for key in f.keys():  # noqa: SIM118 — safe_open is not iterable
                tensor = f.get_tensor(key).contiguous()
                found[key] = tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
    return found


def _recipe(folder: Path, method: str, base: Path, agents: list[Path], fishers: list[Path], device: str) -> Path:
    """A recipe of ``method`` at its defaults on as many agents as it takes (at most three), run by ``ram-merge run``."""
    count = min(METHODS[method].agents[1] or 3, 3)
    params = {"fisher": [str(f) for f in fishers[:count]]} if method == "fisher" else {}
    slices = json.loads(STACKED) if METHODS[method].streaming.stacks else None
    spec = MergeSpec.build(base, agents[:count], method=method, params=params, device=device, slices=slices)
    path = folder / f"{method}-{device}.yaml"
    spec.save(path)
    return path


@pytest.mark.parametrize("method", list(METHODS))
def test_cuda_merge_equals_cpu_merge_or_stays_within_its_tolerance(tmp_path, models, method):
    base, agents = models
    fishers, _ = random_fishers(agents, tmp_path / "fisher")
    outputs = {}
    for device in ("cpu", "cuda"):
        out = tmp_path / device
        recipe = _recipe(tmp_path, method, base, agents, fishers, device)
        done = cli(tmp_path, "run", str(recipe), "--out", str(out), timeout=600)
        assert done.returncode == 0, done.stderr
        outputs[device] = out
    cpu, gpu = _tensors(outputs["cpu"]), _tensors(outputs["cuda"])
    assert cpu.keys() == gpu.keys()
    tolerance = METHODS[method].gpu_tolerance
    if not tolerance:
        differing = [key for key in cpu if cpu[key] != gpu[key]]
        assert not differing, f"{method}: {len(differing)} of {len(cpu)} tensors differ on cuda, e.g. {differing[:3]}"
    else:
        elements = moved = 0
        for key in cpu:
            a, b = (np.frombuffer(x[key], np.uint8).reshape(-1, 2) for x in (cpu, gpu))  # bf16: 2 bytes an element
            elements += len(a)
            moved += int((a != b).any(axis=1).sum())
        assert moved <= tolerance * elements, f"{method}: {moved} of {elements} elements differ on cuda"
    reports = {d: json.loads((o / "merge-report.json").read_text()) for d, o in outputs.items()}
    for key in ("agents", "counts", "update_counts"):
        if key in reports["cpu"] and not tolerance:
            assert reports["cpu"][key] == reports["cuda"][key], key
    assert reports["cpu"]["device"] == "cpu" and reports["cuda"]["device"].startswith("cuda"), reports["cuda"]["device"]
