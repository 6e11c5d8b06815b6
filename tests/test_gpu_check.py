"""``benchmarks/gpu_check.sh``'s dry run (``DEV=cpu``): the lease's one command runs end to end on the CPU, tiny
layouts, mergekit skipped, and writes the JSON and the log a session reads back from ``$OUT``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ram_desktop.core.methods import METHODS

REPO = Path(__file__).resolve().parents[1]


def test_the_gpu_check_dry_runs_on_the_cpu(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAM_DESKTOP_", "PYTEST"))}
    env.update(
        DEV="cpu",
        OUT=str(tmp_path / "out"),
        RAM_MERGEKIT="none",
        PYTHON=sys.executable,
        HF_HUB_OFFLINE="1",
        RAM_DESKTOP_CACHE=str(tmp_path / "cache"),
        TMPDIR=str(tmp_path),
    )
    done = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "gpu_check.sh"), "--budget", "1200", "--work", str(tmp_path / "work")],
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads((tmp_path / "out" / "gpu-check.json").read_text())
    assert data["device"] == "cpu" and data["mergekit"].startswith("skipped")
    stages = data["stages"]
    assert stages["env"]["torch"] and stages["env"]["device"] == "cpu"
    methods = stages["methods"]
    assert set(methods) == set(METHODS)
    # the dry run's "device" is the CPU's torch path: every method gives the kernels' bytes there
    assert {name: row["status"] for name, row in methods.items()} == dict.fromkeys(METHODS, "same bytes")
    runs = stages["large"]["runs"]
    assert [r["run"] for r in runs] == [
        "ram ours (auto)",
        "ties ours (auto)",
        "della ours (auto)",
        "ram-plus --device cpu",
        "ram-plus --device auto",
    ]
    assert all(r["ok"] for r in runs), runs
    assert all(r["ran_on"] == "cpu" for r in runs)
    assert runs[-1]["why"] == "auto: no CUDA or ROCm GPU here" and runs[-2]["why"] == "cpu as chosen"
    evals = stages["eval"]["runs"]
    assert [r["batch_size"] for r in evals] == [1, 16] and all(r["examples_per_s"] > 0 for r in evals)
    log = (tmp_path / "out" / "gpu-check.log").read_text()
    assert "stage eval" in log and "methods: passthrough" in log
    assert not (tmp_path / "work").exists()  # the scratch folder is removed at the end
