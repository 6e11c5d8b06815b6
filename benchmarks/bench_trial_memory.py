#!/usr/bin/env python3
"""What keeping a search trial in memory saves per trial on a model larger than the demo's: merge (into folders,
or into memory) and load into transformers (from the folder, or from the tensors), as ``search.score_merges``
does for ``--workers`` trials at once.

    python benchmarks/bench_trial_memory.py --json benchmarks/results/trial-memory.json

A synthetic Qwen2-shaped model (``tests/synthetic.py``'s generator at a larger config, ``--size``: ~31 M parameters,
62 MB in bf16, or ~200 M, 400 MB) with three agents; Task Arithmetic with two scales per merge (two trials from one read), each mode run
``--repeats`` times alternately. Prints seconds and the ratio disk / memory; no threshold is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SIZES = {  # config changes: ~31 M parameters (62 MB in bf16), ~200 M (400 MB)
    "31m": {
        "hidden_size": 512,
        "intermediate_size": 1376,
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 64,
        "vocab_size": 8192,
    },
    "200m": {
        "hidden_size": 1024,
        "intermediate_size": 2816,
        "num_hidden_layers": 12,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "vocab_size": 32000,
    },
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--size", choices=sorted(SIZES), default="31m")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import torch

    from ram_desktop.core import InMemory, MergeSpec, merge_variants
    from ram_desktop.evaluate.runner import load_model
    from tests.synthetic import CONFIG, demo_shapes, generate_tensors, write_model

    config = {**CONFIG, **SIZES[args.size]}
    rows: dict[str, list[dict[str, float]]] = {"disk": [], "memory": []}
    with tempfile.TemporaryDirectory(prefix="bench-trial-memory-") as tmp:
        root = Path(tmp)
        base, agents = generate_tensors(demo_shapes(config), seed=7)
        write_model(root / "base", base, config)
        for name, tensors in agents.items():
            write_model(root / name, tensors, config)
        params = sum(t.numel() for t in base.values())
        spec = MergeSpec.build(str(root / "base"), [str(root / n) for n in agents], method="task-arithmetic")
        for k in range(args.repeats):
            for mode in ("disk", "memory"):
                work = root / f"{mode}-{k}"
                work.mkdir()
                specs = [
                    spec.with_method("task-arithmetic", {"scale": s}).replace(output=str(work / f"m{i}"))
                    for i, s in enumerate((0.4, 0.8))
                ]
                memory = None
                if mode == "memory":
                    memory = InMemory(work / "frame")
                    memory.frame.mkdir()
                t0 = time.perf_counter()
                merged = merge_variants(specs, in_memory=memory)
                t1 = time.perf_counter()
                for m in merged:
                    model, _ = load_model(m.out, "m", torch.device("cpu"), torch.float32, m.tensors)
                    del model
                t2 = time.perf_counter()
                rows[mode].append({"merge_s": t1 - t0, "load_s": t2 - t1, "total_s": t2 - t0})
                del merged
    summary = {}
    for mode, runs in rows.items():
        summary[mode] = {key: round(min(r[key] for r in runs), 3) for key in ("merge_s", "load_s", "total_s")}
    result = {
        "size": args.size,
        "parameters": params,
        "bytes_per_merge_bf16": params * 2,
        "trials_per_merge": 2,
        "repeats": args.repeats,
        "best_of_repeats": summary,
        "all_runs": {m: [{k: round(v, 3) for k, v in r.items()} for r in runs] for m, runs in rows.items()},
        "ratio_disk_over_memory": {
            key: round(summary["disk"][key] / summary["memory"][key], 2) for key in ("merge_s", "load_s", "total_s")
        },
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
    }
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
