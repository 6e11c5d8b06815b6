#!/usr/bin/env python3
"""Time one ``ram-merge compare`` of four variants against the four separate ``merge`` runs, in one run.

    python benchmarks/bench_compare.py --data /work/bench-data --json benchmarks/results/compare.json

The target (issue 11): the compare takes under 1.6× the time of one merge, because it reads the
inputs once and runs the probe once for all variants. Each command runs in its own process (wall time
includes start-up, as a user sees it); outputs go to a scratch folder and are removed. The load of the
machine during the run is printed with the numbers: compare numbers only from quiet runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VARIANTS = [
    ("ram-plus", ["--method", "ram-plus"]),
    ("ram", ["--method", "ram"]),
    ("task-arithmetic:scale=0.5", ["--method", "task-arithmetic", "--scale", "0.5"]),
    ("ram-plus:r=0.2", ["--method", "ram-plus", "--r", "0.2"]),
]


def timed(args: list[str], env: dict) -> float:
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "ram_desktop", "-q", *args], env=env, capture_output=True, text=True, check=False
    )
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(args)}\n{proc.stderr}")
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--data",
        type=Path,
        default=Path("/work/bench-data"),
        help="base/ and agents from make_agents.py (default /work/bench-data)",
    )
    ap.add_argument("--agents", default="code,tool,memory")
    ap.add_argument("--scratch", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    base = args.data / "base"
    agents = [str(args.data / a) for a in args.agents.split(",")]
    scratch = Path(tempfile.mkdtemp(prefix="bench-compare-", dir=args.scratch))
    cache = scratch / "cache"
    env = dict(os.environ, PYTHONPATH=str(ROOT), RAM_DESKTOP_CACHE=str(cache))
    load_before = os.getloadavg()
    results: dict[str, float] = {}
    try:
        for text, flags in VARIANTS:
            shutil.rmtree(cache, ignore_errors=True)  # every merge probes from scratch, as the compare does
            out = scratch / "single"
            results[f"merge {text}"] = timed(
                ["merge", str(base), *agents, "--out", str(out), "--device", "cpu", *flags], env
            )
            shutil.rmtree(out)
        shutil.rmtree(cache, ignore_errors=True)
        argv = ["compare", str(base), *agents, "--out", str(scratch / "cmp"), "--device", "cpu"]
        for text, _ in VARIANTS:
            argv += ["--variant", text]
        results["compare (4 variants)"] = timed(argv, env)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    load_after = os.getloadavg()
    singles = [v for k, v in results.items() if k.startswith("merge ")]
    one = sum(singles) / len(singles)
    summary = {
        "data": str(args.data),
        "seconds": results,
        "compare_over_mean_single_merge": results["compare (4 variants)"] / one,
        "compare_over_sum_of_merges": results["compare (4 variants)"] / sum(singles),
        "load_average_before_after": [load_before[0], load_after[0]],
        "cores": os.cpu_count(),
    }
    for key, value in results.items():
        print(f"{key:32s} {value:8.2f} s")
    print(f"compare / one merge (mean of the four): {summary['compare_over_mean_single_merge']:.2f}x (target < 1.6x)")
    print(f"compare / four separate merges:         {summary['compare_over_sum_of_merges']:.2f}x")
    print(f"load average before / after: {load_before[0]:.2f} / {load_after[0]:.2f} on {os.cpu_count()} cores")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
