#!/usr/bin/env python3
"""SHA-256 of every merged weight file, for every method, on the demo and on synthetic benchmark
agents: run it before and after a change to the engine and diff the two JSON files.

    python benchmarks/output_hashes.py --work /tmp/hashes --json before.json
    ... change the engine ...
    python benchmarks/output_hashes.py --work /tmp/hashes --json after.json
    diff before.json after.json      # empty: every output is bit-identical

Only weights are hashed, twice: each weight file (``*.safetensors`` and the index, so the layout
counts) and each tensor's values wherever it is stored. The report carries timings and the card
carries paths, which change from run to run by design. The inputs are generated once into
``--work`` and reused; ``--params`` sets the synthetic agents' size (default 20M per model, which
already spans several chunks per tensor and two shards).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# (name, merge flags); every method, both TIES scopes, the dtypes a user picks
CONFIGS: list[tuple[str, list[str]]] = [
    ("ram", ["--method", "ram"]),
    ("ram-plus-base", ["--method", "ram-plus"]),
    ("ram-plus-f32", ["--method", "ram-plus", "--out-dtype", "float32"]),
    ("ram-plus-r.25-a.5-f16", ["--method", "ram-plus", "--r", "0.25", "--alpha", "0.5", "--out-dtype", "float16"]),
    ("ram-plus-soft-f32", ["--method", "ram-plus-soft", "--out-dtype", "float32"]),
    ("average", ["--method", "average"]),
    ("task-arithmetic", ["--method", "task-arithmetic", "--scale", "0.5"]),
    ("ties-tensor", ["--method", "ties", "--density", "0.2"]),
    ("ties-model", ["--method", "ties", "--density", "0.2", "--ties-scope", "model"]),
    ("dare-ta", ["--method", "dare-ta", "--drop", "0.5", "--seed", "7"]),
    ("dare-ties", ["--method", "dare-ties", "--drop", "0.3", "--seed", "11", "--out-dtype", "float32"]),
    # mergekit's methods that take any number of agents (whole-tensor θ methods, their fused CPU paths)
    ("linear", ["--method", "linear", "--weight", "0.2,0.3,0.5"]),
    ("model-stock", ["--method", "model-stock"]),
    ("weighted-ties", ["--method", "weighted-ties", "--weight", "0.5,1.0,0.8", "--density", "0.3,0.5,0.7"]),
    ("breadcrumbs-ties", ["--method", "breadcrumbs-ties", "--density", "0.6", "--gamma", "0.02"]),
    ("della", ["--method", "della", "--density", "0.5", "--epsilon", "0.1", "--seed", "3"]),
    ("della-linear-bf16", ["--method", "della-linear", "--density", "0.4", "--seed", "5", "--dtype", "inputs"]),
    ("sce", ["--method", "sce"]),
    ("karcher", ["--method", "karcher"]),
]


def run(args: list[str]) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "ram_desktop", *args], env=env, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        sys.exit(f"ram-merge {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")


def weight_hashes(folder: Path) -> dict[str, dict[str, str]]:
    """``files``: each weight file's sha-256 (layout included); ``tensors``: each tensor's dtype, shape and
    sha-256 of its bytes, whichever file holds it (the values alone)."""
    from safetensors import safe_open

    files, tensors = {}, {}
    for p in sorted(folder.iterdir()):
        if p.name.endswith(".safetensors") or p.name == "model.safetensors.index.json":
            files[p.name] = hashlib.sha256(p.read_bytes()).hexdigest()
        if p.name.endswith(".safetensors"):
            with safe_open(str(p), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 — safe_open is not iterable
                    t = f.get_tensor(name)
                    raw = t.contiguous().view(-1).view(__import__("torch").uint8).numpy().tobytes()
                    tensors[name] = f"{t.dtype}{list(t.shape)}:{hashlib.sha256(raw).hexdigest()}"
    return {"files": files, "tensors": dict(sorted(tensors.items()))}


def input_sets(work: Path, params: str) -> dict[str, tuple[Path, list[Path]]]:
    demo = work / "demo"
    if not (demo / "base").is_dir():
        run(["demo", str(demo)])
    demo_agents = sorted(
        p
        for p in demo.iterdir()
        if p.is_dir()
        and p.name != "base"
        and ((p / "model.safetensors").exists() or (p / "model.safetensors.index.json").exists())
    )
    synth = work / f"synthetic-{params}"
    if not (synth / "base").is_dir():
        subprocess.run(
            [
                sys.executable,
                str(HERE / "make_agents.py"),
                "--params",
                params,
                "--out",
                str(synth),
                "--shard-size",
                "30MB",
            ],
            check=True,
            capture_output=True,
        )
    return {
        "demo": (demo / "base", demo_agents),
        f"synthetic-{params}": (synth / "base", [synth / n for n in ("code", "tool", "memory")]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, required=True, help="folder for generated inputs and outputs")
    ap.add_argument("--params", default="20M", help="synthetic agents' size per model")
    ap.add_argument("--json", type=Path, default=None, help="write the hashes here (default: stdout)")
    ap.add_argument("--only", default=None, help="comma-separated config names")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    wanted = set(args.only.split(",")) if args.only else None
    result: dict[str, dict[str, dict[str, str]]] = {}
    for set_name, (base, agents) in input_sets(args.work, args.params).items():
        for name, flags in CONFIGS:
            if wanted and name not in wanted:
                continue
            out = args.work / "out" / set_name / name
            shutil.rmtree(out, ignore_errors=True)
            run(
                [
                    "merge",
                    str(base),
                    *map(str, agents),
                    "--out",
                    str(out),
                    "--device",
                    "cpu",
                    "--shard-size",
                    "20MB",
                    *flags,
                ]
            )
            result.setdefault(set_name, {})[name] = weight_hashes(out)
            shutil.rmtree(out)
            print(f"{set_name} {name}", file=sys.stderr)
    text = json.dumps(result, indent=1, sort_keys=True) + "\n"
    if args.json:
        args.json.write_text(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
