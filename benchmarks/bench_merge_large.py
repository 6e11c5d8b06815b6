#!/usr/bin/env python3
"""The same mergekit YAML through ``ram-merge run`` and through mergekit 0.1.5, at the size people merge.

For each method (default: slerp, model_stock, della, ties with per-model weight and density) it writes one
mergekit config for a generated model of a published layout (``--layout qwen2-1.5b``: hidden 1536, 28 layers,
intermediate 8960, vocabulary 151936, 12 heads / 2 key-value heads, untied: 1.78B parameters per model, three
agents, bf16), runs ours and mergekit on it one after the other in the same run (the method's inputs read into
the page cache before each run) and prints wall time, CPU, peak anonymous memory (``bench_merge.run_measured``:
``RssAnon`` of the process tree polled from /proc) and the speed-up (mergekit / ours). Start-up is timed apart: ``ram-merge`` on a config
whose inputs are the ``--startup-data`` tiny agents (import, plan, a few tensors).

    .venv/bin/python benchmarks/bench_merge_large.py --data /tmp/q15 --generate --layout qwen2-1.5b
    .venv/bin/python benchmarks/bench_merge_large.py --data /tmp/q15 --methods della --side ours

Nothing of that size belongs in the repository: generate under /tmp and delete it when done (~14 GB for the
base and three agents at 1.5B). Needs the mergekit venv (``setup_mergekit.sh``) for the mergekit side.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_merge import drop_dir, input_files, model_dirs, read_all, run_measured

MK_DEFAULT = Path.home() / ".cache" / "ram-desktop" / "mergekit-venv" / "bin" / "mergekit-yaml"

# method -> (models used, per-model parameters, global parameters), as a mergekit user writes them
CONFIGS: dict[str, tuple[int, dict, dict]] = {
    "slerp": (1, {}, {"t": 0.5}),
    "model_stock": (3, {}, {}),
    "della": (3, {"weight": 1.0, "density": 0.5, "epsilon": 0.1}, {}),
    "ties": (3, {"weight": [0.5, 1.0, 0.8], "density": [0.3, 0.5, 0.7]}, {"normalize": "true"}),
}


def config_text(method: str, base: Path, agents: list[Path], dtype: str, configs: dict | None = None) -> str:
    """The mergekit YAML of ``method`` as ``configs`` (default ``CONFIGS``) spells it."""
    n, per_model, shared = (configs or CONFIGS)[method]
    lines = [f"merge_method: {method}", f"base_model: {base}", f"dtype: {dtype}", "out_dtype: bfloat16", "models:"]
    for k, agent in enumerate(agents[:n]):
        lines.append(f"  - model: {agent}")
        values = {key: (v[k] if isinstance(v, list) else v) for key, v in per_model.items()}
        if values:
            lines.append("    parameters: {" + ", ".join(f"{key}: {v}" for key, v in values.items()) + "}")
    if shared:
        lines += ["parameters:", *(f"  {key}: {v}" for key, v in shared.items())]
    return "\n".join(lines) + "\n"


def ram_merge_cmd(a: argparse.Namespace, cfg: Path, out: Path) -> list[str]:
    return [*a.ram_merge, "run", str(cfg), "--out", str(out)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="agents folder (make_agents.py layout)")
    ap.add_argument("--generate", action="store_true", help="generate the agents into --data first")
    ap.add_argument("--layout", default="qwen2-1.5b", help="with --generate: make_agents.py --layout")
    ap.add_argument("--methods", default=",".join(CONFIGS), help=f"comma list of {', '.join(CONFIGS)}")
    ap.add_argument("--side", choices=["both", "ours", "mergekit"], default="both")
    ap.add_argument("--ram-merge", type=shlex.split, default=[sys.executable, "-m", "ram_desktop"], help="our command")
    ap.add_argument("--mergekit-yaml", default=str(MK_DEFAULT))
    ap.add_argument("--mk-args", default="--lazy-unpickle --quiet")
    ap.add_argument("--dtype", default="float32", help="the configs' compute dtype (default float32)")
    ap.add_argument("--startup-data", type=Path, default=None, help="tiny agents for the start-up time")
    ap.add_argument("--scratch", type=Path, default=Path("/tmp/bench-large"), help="outputs, configs, logs")
    ap.add_argument("--timeout", type=float, default=None, help="seconds per run")
    ap.add_argument("--json", type=Path, default=None, help="results file (default SCRATCH/results.json)")
    a = ap.parse_args(argv)
    if a.generate:
        subprocess.run(
            [sys.executable, str(HERE / "make_agents.py"), "--out", str(a.data), "--layout", a.layout], check=True
        )
    base, agents = model_dirs(a.data)
    a.scratch.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(HERE.parent))
    floor_s, floor_bytes = read_all(input_files([base, *agents]))  # warms the page cache
    print(f"inputs {floor_bytes / 1e9:.1f} GB, read from the page cache in {floor_s:.2f} s", flush=True)
    results: list[dict] = []
    if a.startup_data is not None:
        tiny_base, tiny_agents = model_dirs(a.startup_data)
        cfg = a.scratch / "startup.yaml"
        cfg.write_text(config_text("slerp", tiny_base, tiny_agents, a.dtype))
        out = a.scratch / "startup-out"
        drop_dir(out)
        r = run_measured(ram_merge_cmd(a, cfg, out), a.scratch / "startup.log", 0.025, a.timeout, env)
        results.append({"method": "startup", "side": "ours", **r})
        print(f"start-up (tiny config, import + plan + merge): {r['wall_s']:.2f} s", flush=True)
        drop_dir(out)
    for method in a.methods.split(","):
        cfg = a.scratch / f"{method}.yaml"
        cfg.write_text(config_text(method, base, agents, a.dtype))
        row = {"method": method}
        for side in ("ours", "mergekit"):
            if a.side not in ("both", side):
                continue
            out = a.scratch / f"{method}-{side}"
            drop_dir(out)
            # the run before may have pushed these out of the page cache (mergekit's 10+ GB): both sides start warm
            read_all(input_files([base, *agents[: CONFIGS[method][0]]]))
            cmd = (
                ram_merge_cmd(a, cfg, out)
                if side == "ours"
                else [a.mergekit_yaml, str(cfg), str(out), *shlex.split(a.mk_args)]
            )
            r = run_measured(cmd, a.scratch / f"{method}-{side}.log", 0.025, a.timeout, env)
            results.append({"method": method, "side": side, **r})
            row[side] = r
            status = "" if r["ok"] else f"  FAILED: {r.get('error')} {r.get('log_tail', '')}"
            print(
                f"{method:12s} {side:8s} {r['wall_s']:8.1f} s  cpu {r['cpu_user_s'] + r['cpu_sys_s']:7.1f} s  "
                f"peak anon {r['peak_anon_mb'] / 1024:6.2f} GiB  other cores {r['other_cores']:.2f}{status}",
                flush=True,
            )
            drop_dir(out)
        if "ours" in row and "mergekit" in row and row["ours"]["ok"] and row["mergekit"]["ok"]:
            print(f"{method:12s} speed-up {row['mergekit']['wall_s'] / row['ours']['wall_s']:.2f}x", flush=True)
    path = a.json or a.scratch / "results.json"
    path.write_text(json.dumps({"floor_s": floor_s, "input_bytes": floor_bytes, "runs": results}, indent=1))
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
