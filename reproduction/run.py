"""Reproduce the paper in miniature, end to end, for one seed.

    python reproduction/run.py --seed 0 --out runs/seed0            # everything (about 25 min here)
    python reproduction/run.py --seed 0 --out /tmp/s --smoke        # a few steps of every stage

Stages (each skipped when its output already exists, so a run can resume): suites, base (SFT),
agents (GRPO, one process per task), probe, merges (every method; baselines searched on the
validation split, scored on test), ablations (Table 2 r sweep, Figure 3 unique regions), results.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # ram_desktop from this checkout
# the reward functions: one file, the one the demo ships (its agents were trained with it); ``import reward``
DEMO_SUITES = HERE.parent / "ram_desktop" / "resources" / "demo" / "suites"
sys.path.insert(0, str(DEMO_SUITES))

from tasks import TASKS, make_split

SPLIT_SIZES = {"train": 2000, "validation": 100, "test": 300}
SMOKE_SIZES = {"train": 200, "validation": 12, "test": 12}


def log_to(path: Path):
    def log(msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        with path.open("a") as f:
            f.write(line + "\n")

    return log


def write_suites(folder: Path, seed: int, sizes: dict[str, int]) -> None:
    """One SPEC §6 suite folder per task and split: data.jsonl, suite.yaml, and the reward file it names."""
    import reward
    from common import MAX_NEW_TOKENS

    for task in TASKS:
        for split, n in sizes.items():
            d = folder / f"{task}-{split}"
            d.mkdir(parents=True, exist_ok=True)
            rows = make_split(task, split, n, seed)
            (d / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            shutil.copy(DEMO_SUITES / "reward.py", d / "reward.py")
            (d / "suite.yaml").write_text(
                f"name: {task}-{split}\n"
                f"scorer: python:reward.py:{reward.REWARDS[task]}\n"
                f"max_new_tokens: {MAX_NEW_TOKENS[task]}\n"
                "chat_template: false\n"
            )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--smoke", action="store_true", help="a few steps of every stage (CI)")
    ap.add_argument("--sft-steps", type=int, default=None)
    ap.add_argument("--grpo-steps", type=int, default=None, help="override every agent's step count")
    ap.add_argument("--stage", choices=["all", "agent"], default="all", help=argparse.SUPPRESS)
    ap.add_argument("--task", choices=TASKS, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    log = log_to(out / "run.log")

    from grpo import RECIPES, Recipe, train_agent

    def recipe_for(task: str) -> Recipe:
        r = RECIPES[task]
        steps = args.grpo_steps if args.grpo_steps is not None else (4 if args.smoke else r.steps)
        return Recipe(r.learning_rate, steps, r.trainable)

    if args.stage == "agent":  # one agent in its own process (the three train side by side)
        train_agent(out / "base", args.task, out / args.task, args.seed, recipe_for(args.task), log=log)
        return 0

    timings: dict[str, float] = {}
    t0 = time.time()
    sizes = SMOKE_SIZES if args.smoke else SPLIT_SIZES
    if not (out / "suites").exists():
        write_suites(out / "suites", args.seed, sizes)
    timings["suites"] = time.time() - t0

    t = time.time()
    if not (out / "base" / "model.safetensors").exists():
        from sft import train_base

        steps = args.sft_steps or (20 if args.smoke else 1500)
        log(f"base: supervised training, {steps} steps")
        train_base(out / "base", args.seed, steps, log=log)
    timings["base"] = time.time() - t

    t = time.time()
    procs, logs = {}, []
    for task in TASKS:
        if not (out / task / "model.safetensors").exists():
            cmd = [
                sys.executable,
                str(Path(__file__).resolve()),
                "--stage",
                "agent",
                "--task",
                task,
                "--seed",
                str(args.seed),
                "--out",
                str(out),
            ]
            if args.smoke:
                cmd.append("--smoke")
            if args.grpo_steps is not None:
                cmd += ["--grpo-steps", str(args.grpo_steps)]
            log(f"agent {task}: GRPO {recipe_for(task)}")
            logs.append(open(out / f"grpo-{task}.log", "w"))  # noqa: SIM115 — open while the child writes it
            procs[task] = subprocess.Popen(cmd, stdout=logs[-1], stderr=subprocess.STDOUT)
    for task, p in procs.items():
        code = p.wait()
        if code != 0:
            for f in logs:
                f.close()
            log(f"agent {task} failed; see {out / f'grpo-{task}.log'}")
            return 1
    for f in logs:
        f.close()
    timings["agents"] = time.time() - t

    from experiments import run_experiments

    t = time.time()
    run_experiments(out, smoke=args.smoke, log=log, timings=timings)
    timings["experiments"] = time.time() - t
    timings["total"] = time.time() - t0
    (out / "timings.json").write_text(json.dumps({k: round(v, 1) for k, v in timings.items()}, indent=2))
    log("timings: " + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
