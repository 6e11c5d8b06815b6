#!/usr/bin/env python3
"""Time the Analyze step (the complete probe: counts, λ* survival histograms, inspection statistics) of
this tree against another checkout, alternating, and check the reports.

    python benchmarks/bench_analyze.py --data /work/bench-data --baseline /work/baseline --runs 3 \
        --json benchmarks/results/analyze-300M.json

Each run is ``python -m ram_desktop probe BASE AGENTS... --device cpu --json OUT`` in its own process
(wall time includes start-up, as a user sees it) with an empty probe cache, so the whole pass runs;
CPU seconds are the process's user + system time. One untimed run of each tree first warms the page
cache and numba's compile cache. Then the report of this tree's fused kernels is compared with its
torch path (``RAM_DESKTOP_KERNELS=0``, the reference) key for key, and the counts both trees have
(overlap, per-tensor stats, λ* histograms) with the baseline's. The load average is printed with the
numbers: on a shared machine compare the two trees only within one run of this script.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMON_KEYS = ("params", "tensors", "agents", "tensor_stats", "rescale_survival", "layers", "modules")


def run_probe(tree: Path, data: Path, agents: list[str], scratch: Path, tag: str, kernels: bool = True) -> dict:
    cache = scratch / f"cache-{tag}"
    shutil.rmtree(cache, ignore_errors=True)
    out = scratch / f"{tag}.json"
    env = dict(os.environ, PYTHONPATH=str(tree), RAM_DESKTOP_CACHE=str(cache))
    if not kernels:
        env["RAM_DESKTOP_KERNELS"] = "0"
    cmd = [
        sys.executable,
        "-m",
        "ram_desktop",
        "probe",
        str(data / "base"),
        *(str(data / a) for a in agents),
        "--device",
        "cpu",
        "--json",
        str(out),
    ]
    load = os.getloadavg()[0]
    start = time.perf_counter()
    err = scratch / f"{tag}.err"
    with err.open("w") as stderr:
        # cwd = the tree: ``python -m`` puts the working directory ahead of PYTHONPATH
        proc = subprocess.Popen(cmd, env=env, cwd=tree, stdout=subprocess.DEVNULL, stderr=stderr)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{tag} failed:\n{err.read_text()}")
    shutil.rmtree(cache, ignore_errors=True)
    return {
        "wall_s": round(wall, 2),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "load_before": round(load, 2),
        "load_after": round(os.getloadavg()[0], 2),
        "report": out,
    }


def _sorted(value):
    """Lists of named entries (tensor_stats, layers, modules) in name order: the trees may order them differently."""
    if isinstance(value, list) and value and isinstance(value[0], dict) and "name" in value[0]:
        return sorted(value, key=lambda entry: entry["name"])
    return value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=Path("/work/bench-data"))
    ap.add_argument("--agents", default="code,tool,memory")
    ap.add_argument("--baseline", type=Path, required=True, help="another checkout of ram_desktop to compare with")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-check", action="store_true", help="skip the torch-path run that checks the report")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    agents = args.agents.split(",")
    scratch = Path(tempfile.mkdtemp(prefix="bench-analyze-"))
    trees = {"baseline": args.baseline.resolve(), "this": ROOT}
    results: dict = {"trees": {k: str(v) for k, v in trees.items()}, "runs": []}
    try:
        for name, tree in trees.items():  # warm-up: page cache, numba compile cache
            run_probe(tree, args.data, agents, scratch, f"warm-{name}")
        for i in range(args.runs):
            for name, tree in trees.items() if i % 2 == 0 else reversed(list(trees.items())):
                r = run_probe(tree, args.data, agents, scratch, f"{name}-{i}")
                r.pop("report")
                results["runs"].append({"tree": name, **r})
                print(
                    f"run {i + 1} {name:8s}: {r['wall_s']:6.1f} s wall, {r['cpu_s']:6.1f} CPU-s "
                    f"(load {r['load_before']:.1f} -> {r['load_after']:.1f})",
                    flush=True,
                )
        for name in trees:
            runs = [r for r in results["runs"] if r["tree"] == name]
            results[name] = {
                "wall_s": round(statistics.mean(r["wall_s"] for r in runs), 2),
                "cpu_s": round(statistics.mean(r["cpu_s"] for r in runs), 2),
            }
            print(f"mean {name:8s}: {results[name]['wall_s']:6.1f} s wall, {results[name]['cpu_s']:6.1f} CPU-s")
        this = json.loads((scratch / f"this-{args.runs - 1}.json").read_text())
        base = json.loads((scratch / f"baseline-{args.runs - 1}.json").read_text())
        results["same_counts_as_baseline"] = {k: _sorted(this.get(k)) == _sorted(base.get(k)) for k in COMMON_KEYS}
        print("same as the baseline's:", results["same_counts_as_baseline"])
        if not args.no_check:
            r = run_probe(ROOT, args.data, agents, scratch, "torch-path", kernels=False)
            reference = json.loads(r.pop("report").read_text())
            results["torch_path"] = r
            results["identical_to_torch_path"] = this == reference
            print(
                f"torch path: {r['wall_s']:.1f} s wall, {r['cpu_s']:.1f} CPU-s; "
                f"report identical to the kernels': {this == reference}"
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
