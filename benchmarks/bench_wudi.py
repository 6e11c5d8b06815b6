"""Seconds of a WUDI merge beside task arithmetic's on the same inputs, device and output dtype.

Each method merges the synthetic agents of ``make_agents.py`` once (after one small warm-up merge that
loads torch, the kernels and the optimiser), through ``pipeline.merge`` as the command line runs it;
WUDI's per-layer optimisation is timed apart from the rest (the ``wudi.wudi_layer`` calls).

    python benchmarks/bench_wudi.py --data /work/bench-small [--device cpu|cuda] [--steps 300] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="folder written by make_agents.py")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--out-dtype", default="bfloat16")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    import torch

    from ram_desktop.core import pipeline
    from ram_desktop.core.events import Reporter
    from ram_desktop.core.methods import wudi

    spent = {"layers": 0, "seconds": 0.0}
    optimise = wudi.wudi_layer

    def timed(taus, steps, lr):
        if taus.is_cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        merged = optimise(taus, steps, lr)
        if merged.is_cuda:
            torch.cuda.synchronize()
        spent["layers"] += 1
        spent["seconds"] += time.perf_counter() - start
        return merged

    wudi.wudi_layer = timed
    models = json.loads((args.data / "agents.json").read_text())["models"]  # {"base": path, agent: path, ...}
    base, sources = models.pop("base"), list(models.values())
    results: dict = {
        "device": args.device,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "steps": args.steps,
        "lr": args.lr,
        "out_dtype": args.out_dtype,
    }
    if args.device.startswith("cuda"):
        results["gpu"] = torch.cuda.get_device_name()
    with tempfile.TemporaryDirectory() as tmp:

        def merge(method: str, params: dict, out: str) -> float:
            start = time.perf_counter()
            pipeline.merge(
                pipeline.MergeSpec.build(
                    base, sources, Path(tmp) / out, method, params, device=args.device, out_dtype=args.out_dtype
                ),
                Reporter(),
                options=pipeline.RunOptions(use_cache=False),
            )
            return time.perf_counter() - start

        merge("wudi", {"steps": 1}, "warm")
        spent.update(layers=0, seconds=0.0)
        results["task_arithmetic_s"] = merge("task-arithmetic", {}, "ta")
        results["wudi_s"] = merge("wudi", {"steps": args.steps, "lr": args.lr}, "wudi")
        results["wudi_layers"] = spent["layers"]
        results["wudi_optimise_s"] = spent["seconds"]
    print(json.dumps(results, indent=1))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
