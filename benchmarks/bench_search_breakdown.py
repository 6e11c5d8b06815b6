#!/usr/bin/env python3
"""Where a 24-trial ``ram-merge search`` of the built-in demo spends its time, in one process:

    python benchmarks/bench_search_breakdown.py --json benchmarks/results/search-demo-breakdown.json

Runs the search as ``bench_search.py`` does (same suites, trials, batch size, one torch thread), in this process,
with wrappers that add up the seconds spent merging (trials, and the best with the references at the end),
loading models into transformers (from a folder, or from tensors in memory), generating, and in the rest (the
study, scoring, start-up of the search). ``--on-disk`` sets ``RAM_DESKTOP_TRIALS_ON_DISK=1`` (trials written to
temporary folders and loaded from them, as before trials were kept in memory). Works on older trees too (run
it with ``PYTHONPATH`` at one): it only wraps functions both have.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TASKS = ("code", "tool", "memory")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=24)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--on-disk", action="store_true", help="trials written to folders (RAM_DESKTOP_TRIALS_ON_DISK=1)")
    ap.add_argument("--json", type=Path, help="write the numbers here")
    args = ap.parse_args()
    os.environ.setdefault("RAM_DESKTOP_THREADS", "1")
    if args.on_disk:
        os.environ["RAM_DESKTOP_TRIALS_ON_DISK"] = "1"
    if not os.environ.get("PYTHONPATH"):  # PYTHONPATH=TREE: time that tree instead (its ram_desktop is imported)
        sys.path.insert(0, str(ROOT))
    import ram_desktop
    from ram_desktop.core import MergeSpec
    from ram_desktop.core.demo import write_demo
    from ram_desktop.evaluate import runner, search

    seconds: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    phase = ["trials"]

    def timed(module, name: str, key) -> None:
        inner = getattr(module, name)

        def wrapper(*a, **k):
            label = key()
            counts[label] += 1
            t0 = time.perf_counter()
            try:
                return inner(*a, **k)
            finally:
                seconds[label] += time.perf_counter() - t0

        def generator(*a, **k):  # a generator: its time is spent in each next(), between which scoring runs
            label = key()
            counts[label] += 1
            batches = inner(*a, **k)
            while True:
                t0 = time.perf_counter()
                try:
                    item = next(batches)
                except StopIteration:
                    return
                finally:
                    seconds[label] += time.perf_counter() - t0
                yield item

        setattr(module, name, generator if name == "_generate" else wrapper)

    timed(search, "merge_variants", lambda: f"merge ({phase[0]})")
    timed(runner, "load_model", lambda: f"load model ({phase[0]})")
    timed(runner, "_generate", lambda: f"generate ({phase[0]})")
    best = search._merge_best

    def merge_best(*a, **k):
        phase[0] = "best and references"
        return best(*a, **k)

    search._merge_best = merge_best

    with tempfile.TemporaryDirectory(prefix="bench-search-") as tmp:
        demo, out = Path(tmp) / "demo", Path(tmp) / "search"
        write_demo(demo)
        options = search.SearchOptions(
            spec=MergeSpec.build(str(demo / "base"), [str(demo / a) for a in ("coder", "tool", "memory")]),
            suites=[str(demo / "suites" / "validation" / t) for t in TASKS],
            test_suites=[str(demo / "suites" / t) for t in TASKS],
            folder=out,
            trials=args.trials,
            batch_size=args.batch_size,
        )
        load = os.getloadavg()[0]
        cpu0, t0 = time.process_time(), time.perf_counter()
        result = search.search(options)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    phases = {k: round(v, 2) for k, v in sorted(seconds.items())}
    data = {
        "tree": str(Path(ram_desktop.__file__).parent.parent),
        "trials_on_disk": args.on_disk or not hasattr(search, "trials_in_memory"),
        "trials": len(result.trials),
        "seconds": round(wall, 1),
        "cpu_seconds_this_process": round(cpu, 1),
        "seconds_by_phase": phases,
        "calls": dict(sorted(counts.items())),
        "rest_seconds": round(wall - sum(seconds.values()), 2),
        "trial_scores": [t.scores for t in result.trials],
        "load_average_before": round(load, 2),
        "load_average_after": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
    }
    print(json.dumps({k: v for k, v in data.items() if k != "trial_scores"}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()
