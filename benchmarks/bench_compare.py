#!/usr/bin/env python3
"""Time one ``ram-merge compare`` of four variants against the four separate ``merge`` runs, in one run.

    python benchmarks/bench_compare.py --data /work/bench-data --json benchmarks/results/compare.json

The target (issues 11, 37): the compare takes at most 1.6× the time of one merge, because it reads the
inputs once and runs the probe once for all variants. Each command runs in its own process (wall time
includes start-up, as a user sees it); outputs go to a scratch folder and are removed. ``--repeat N`` runs
the four merges and the compare N times in turn and reports medians (a shared machine is noisy). Where the
time goes comes from each output's ``merge-report.json``: the probe pass, the merge pass (reading, merging
every variant and writing, overlapped) and the rest (start-up, opening, config, card) of each process. The
load of the machine during the run is printed with the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
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


def run_cli(args: list[str], env: dict) -> tuple[float, float]:
    """Wall seconds of one CLI run in its own process, and the CPU seconds (user + system) it used: on a shared
    machine the wall time follows the load, the CPU time much less."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "ram_desktop", "-q", *args], env=env, capture_output=True, text=True, check=False
    )
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(args)}\n{proc.stderr}")
    return seconds, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def timed(args: list[str], env: dict, report: Path) -> tuple[float, dict]:
    """Wall seconds of one CLI run, and the timings its merge report recorded (probe_s, merge_s, total_s) with
    the process's CPU seconds (cpu_s)."""
    seconds, cpu = run_cli(args, env)
    return seconds, {**json.loads(report.read_text()).get("timings", {}), "cpu_s": cpu}


def one_round(base: Path, agents: list[str], scratch: Path, env: dict, cache: Path) -> dict[str, tuple[float, dict]]:
    results: dict[str, tuple[float, dict]] = {}
    for text, flags in VARIANTS:
        shutil.rmtree(cache, ignore_errors=True)  # every merge probes from scratch, as the compare does
        out = scratch / "single"
        argv = ["merge", str(base), *agents, "--out", str(out), "--device", "cpu", *flags]
        results[f"merge {text}"] = timed(argv, env, out / "merge-report.json")
        shutil.rmtree(out)
    shutil.rmtree(cache, ignore_errors=True)
    argv = ["compare", str(base), *agents, "--out", str(scratch / "cmp"), "--device", "cpu"]
    for text, _ in VARIANTS:
        argv += ["--variant", text]
    results["compare (4 variants)"] = timed_compare(argv, env, scratch / "cmp")
    shutil.rmtree(scratch / "cmp")
    return results


def timed_compare(argv: list[str], env: dict, folder: Path) -> tuple[float, dict]:
    """Wall seconds of the compare, and the timings of its variants' reports (one pass: the same for all)."""
    seconds, cpu = run_cli(argv, env)
    reports = sorted(folder.glob("*/merge-report.json"))
    return seconds, {**json.loads(reports[0].read_text()).get("timings", {}), "cpu_s": cpu}


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
    ap.add_argument("--repeat", type=int, default=1, help="rounds of the four merges and the compare (medians)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    base = args.data / "base"
    agents = [str(args.data / a) for a in args.agents.split(",")]
    scratch = Path(tempfile.mkdtemp(prefix="bench-compare-", dir=args.scratch))
    cache = scratch / "cache"
    env = dict(os.environ, PYTHONPATH=str(ROOT), RAM_DESKTOP_CACHE=str(cache))
    load_before = os.getloadavg()
    rounds: list[dict[str, tuple[float, dict]]] = []
    try:
        for _ in range(args.repeat):
            rounds.append(one_round(base, agents, scratch, env, cache))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    load_after = os.getloadavg()
    names = list(rounds[0])
    median = {k: statistics.median(r[k][0] for r in rounds) for k in names}
    parts = {
        k: {
            t: statistics.median(r[k][1].get(t, 0.0) for r in rounds)
            for t in ("probe_s", "merge_s", "total_s", "cpu_s")
        }
        for k in names
    }
    ratios = []
    for r in rounds:  # each round's compare over that round's mean single merge, then the median of those
        singles = [r[k][0] for k in names if k.startswith("merge ")]
        ratios.append(r["compare (4 variants)"][0] / (sum(singles) / len(singles)))
    singles = [median[k] for k in names if k.startswith("merge ")]
    summary = {
        "data": str(args.data),
        "rounds": args.repeat,
        "seconds_median": median,
        "seconds_each_round": {k: [r[k][0] for r in rounds] for k in names},
        "report_timings_median": parts,
        "compare_over_mean_single_merge": statistics.median(ratios),
        "compare_over_mean_single_merge_each_round": ratios,
        "compare_over_sum_of_merges": median["compare (4 variants)"] / sum(singles),
        "load_average_before_after": [load_before[0], load_after[0]],
        "cores": os.cpu_count(),
    }
    print(
        f"{'run':32s} {'wall':>8s} {'probe':>7s} {'merge':>7s} {'other':>7s} {'CPU':>7s}   (medians of {args.repeat})"
    )
    for key in names:
        t = parts[key]
        other = median[key] - t["probe_s"] - t["merge_s"]
        print(
            f"{key:32s} {median[key]:7.2f}s {t['probe_s']:6.2f}s {t['merge_s']:6.2f}s {other:6.2f}s {t['cpu_s']:6.2f}s"
        )
    cpu_ratios = []
    for r in rounds:
        singles_cpu = [r[k][1]["cpu_s"] for k in names if k.startswith("merge ")]
        cpu_ratios.append(r["compare (4 variants)"][1]["cpu_s"] / (sum(singles_cpu) / len(singles_cpu)))
    summary["compare_cpu_over_mean_single_merge_cpu"] = statistics.median(cpu_ratios)
    print(
        f"compare / one merge (mean of the four): {summary['compare_over_mean_single_merge']:.2f}x "
        f"(median of the rounds {', '.join(f'{x:.2f}' for x in ratios)}; target <= 1.6x)"
    )
    print(f"compare / four separate merges:         {summary['compare_over_sum_of_merges']:.2f}x")
    print(f"compare CPU / one merge's CPU:          {summary['compare_cpu_over_mean_single_merge_cpu']:.2f}x")
    print(f"load average before / after: {load_before[0]:.2f} / {load_after[0]:.2f} on {os.cpu_count()} cores")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
