#!/usr/bin/env python3
"""Time a 24-trial ``ram-merge search`` on the built-in demo, as a user runs it (one fresh process).

    python benchmarks/bench_search.py --json benchmarks/results/search-demo.json

The target (issue "Which merge for my agents", item 7): under 60 s on the development machine. The search
scores each trial on the demo's three validation suites (100 examples each) and the best on its three
test suites (300 each) beside RAM+ and Task Arithmetic at their defaults. The load of the machine is
printed with the numbers, and the CPU time of the search process beside its wall time: on a machine
that other programs keep busy, the CPU time (one torch thread: ``RAM_DESKTOP_THREADS=1``, the default
here) is what the search would take on an idle core.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TASKS = ("code", "tool", "memory")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=24)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threads", default="1", help="RAM_DESKTOP_THREADS for the search (default 1)")
    ap.add_argument("--json", type=Path, help="write the numbers here")
    args = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env["RAM_DESKTOP_THREADS"] = args.threads
    with tempfile.TemporaryDirectory(prefix="bench-search-") as tmp:
        demo, out = Path(tmp) / "demo", Path(tmp) / "search"
        subprocess.run(
            [sys.executable, "-m", "ram_desktop", "demo", str(demo)], env=env, check=True, capture_output=True
        )
        command = [
            sys.executable,
            "-m",
            "ram_desktop",
            "-q",
            "search",
            str(demo / "base"),
            *(str(demo / a) for a in ("coder", "tool", "memory")),
            "--suite",
            *(str(demo / "suites" / "validation" / t) for t in TASKS),
            "--test-suite",
            *(str(demo / "suites" / t) for t in TASKS),
            "--trials",
            str(args.trials),
            "--out",
            str(out),
            "--batch-size",
            str(args.batch_size),
        ]
        load = os.getloadavg()[0]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        seconds = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        if proc.returncode != 0:
            sys.exit(f"search failed:\n{proc.stderr}")
        data = json.loads((out / "search.json").read_text())
    ram_plus = next(t for t in data["trials"] if t["method"] == "ram-plus" and t["params"] == {"r": 0.1, "alpha": 2.0})
    result = {
        "trials": len(data["trials"]),
        "seconds": round(seconds, 1),
        "cpu_seconds": round(cpu, 1),
        "threads": args.threads,
        "trial_seconds": round(sum(t["seconds"] for t in data["trials"]), 1),
        "repeats": sum("same_as" in t for t in data["trials"]),
        "best": {k: data["best"][k] for k in ("method", "params", "validation", "test", "test_interval")},
        "ram_plus_default_validation": ram_plus["validation"],
        "reference": [{k: r[k] for k in ("name", "test", "test_interval")} for r in data["reference"]],
        "differences": [
            {k: d[k] for k in ("versus", "difference", "se", "clearly_better")} for d in data["differences"]
        ],
        "load_average_before": round(load, 2),
        "load_average_after": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
    }
    print(proc.stdout)
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
