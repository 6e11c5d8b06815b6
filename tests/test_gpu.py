"""The GPU path gives the CPU path's bytes: every method merged with ``--device cuda`` and with
``--device cpu``, each in a fresh ``ram-merge`` process, on the same synthetic checkpoints (one agent
sharded), must write the same tensors bit for bit and the same update counts in the report.

The GPU path shares the chunking, the order of every sum and the output writer with the CPU path; only
where each chunk is computed differs. Skipped where no CUDA device is present (CI has none); run on a
GPU machine with ``python -m pytest tests/test_gpu.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from ram_desktop.core.methods import METHODS

from .subproc import cli
from .synthetic import CONFIG, demo_shapes, generate_tensors, write_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

# Fisher needs per-agent Fisher files (its own test makes them); every other method runs from its defaults
# mergekit's methods (``theta``) compute with mergekit's torch operations on whole tensors (norms, angles, sorts,
# softmax): on a GPU those reductions and functions round differently from the CPU's, as in mergekit itself, so
# their CUDA bytes are not promised to equal the CPU's (docs/methods.md, "mergekit's methods")
GPU_METHODS = [name for name, m in METHODS.items() if name != "fisher" and not m.streaming.theta]


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


@pytest.mark.parametrize("method", GPU_METHODS)
def test_cuda_merge_equals_cpu_merge(tmp_path, models, method):
    base, agents = models
    outputs = {}
    for device in ("cpu", "cuda"):
        out = tmp_path / device
        done = cli(
            tmp_path,
            "merge",
            str(base),
            *map(str, agents),
            "--method",
            method,
            "--device",
            device,
            "--out",
            str(out),
            timeout=600,
        )
        assert done.returncode == 0, done.stderr
        outputs[device] = out
    cpu, gpu = _tensors(outputs["cpu"]), _tensors(outputs["cuda"])
    assert cpu.keys() == gpu.keys()
    differing = [key for key in cpu if cpu[key] != gpu[key]]
    assert not differing, f"{method}: {len(differing)} of {len(cpu)} tensors differ on cuda, e.g. {differing[:3]}"
    reports = {d: json.loads((o / "merge-report.json").read_text()) for d, o in outputs.items()}
    for key in ("agents", "counts", "update_counts"):
        if key in reports["cpu"]:
            assert reports["cpu"][key] == reports["cuda"][key], key
    assert reports["cpu"]["device"] == "cpu" and reports["cuda"]["device"].startswith("cuda"), reports["cuda"]["device"]
