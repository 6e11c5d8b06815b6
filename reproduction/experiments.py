"""Stage 3: probe the agents, merge with every method through ``ram-merge compare``, score, and write the results.

Baselines are searched over the paper's Table 11 ranges with the setting chosen on the validation
split (mean over the three tasks); every chosen model is then scored on the test split. Scoring is
greedy decoding with the tasks' own reward functions (``common.score``); the same suites load in
``ram-merge eval``.

The toy track runs with the default ``Track``; the real-model track (``reproduction/real``) passes its own:
its tasks, how a model is scored (through ``ram-merge eval``'s runner, on a GPU when there is one), the
grids, and the device flags for the merges and the Fisher estimates.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from common import load_model, load_tokenizer, paired_gain, read_jsonl, rewards
from safetensors.torch import load_file, save_file
from tasks import TASKS

TA_SCALES = [0.1, 0.3, 0.5, 0.7, 0.9, 1.0]  # Table 11
TIES_DENSITIES = [0.1, 0.2, 0.3]
DARE_DROPS = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
R_SWEEP = [0.0, 0.05, 0.1, 0.15, 0.2]  # Table 2
EPS = 1e-5
FISHER_EXAMPLES, FISHER_EXAMPLES_SMOKE = 256, 8  # calibration examples per agent (paper: 256-2048)
GRID_METHODS = ("task-arithmetic", "ties", "dare-ta", "dare-ties", "fisher")  # searched on validation
METHOD_ORDER = (
    "ram",
    "ram-plus",
    "ram-plus-soft",
    "average",
    "task-arithmetic",
    "ties",
    "dare-ta",
    "dare-ties",
    "fisher",
    "wudi",
)

# per task: (reward per example, exact match per example[, {column: value per example}]) of one model on one
# split's examples; the optional third part holds secondary columns (the real track's tool partial credit)
ModelScores = dict[str, tuple]


def toy_scores(model_dir: Path, split: str, data: dict[str, list[dict]], tokenizer) -> ModelScores:
    """The toy track's scoring: greedy completions in-process, the task's own reward (``common.rewards``)."""
    model = load_model(model_dir)
    return {t: rewards(model, tokenizer, t, examples) for t, examples in data.items()}


@dataclass
class Track:
    """What differs between the toy and the real-model tracks; the defaults are the toy's."""

    tasks: tuple[str, ...] = TASKS
    methods: tuple[str, ...] = METHOD_ORDER
    scores: Callable[[Path, str, dict[str, list[dict]], object], ModelScores] = toy_scores
    ta_scales: list[float] = field(default_factory=lambda: list(TA_SCALES))
    ties_densities: list[float] = field(default_factory=lambda: list(TIES_DENSITIES))
    dare_drops: list[float] = field(default_factory=lambda: list(DARE_DROPS))
    r_sweep: list[float] = field(default_factory=lambda: list(R_SWEEP))
    fisher_examples: int = FISHER_EXAMPLES
    fisher_examples_smoke: int = FISHER_EXAMPLES_SMOKE
    fisher_device: str = "cpu"
    merge_flags: list[str] = field(default_factory=list)  # e.g. ["--device", "cuda"] for probe and compare
    smoke_grids: bool = True  # in --smoke, a few points of each grid
    prune_merges: bool = False  # delete the weights of merges that validation did not choose (disk space)
    wudi_params: dict = field(default_factory=dict)  # e.g. fewer Adam steps in a CPU smoke run
    # searched on validation when given (else fixed at r 0.1, alpha 2 / r 0.1): [{"r": .., "alpha": ..}, ...]
    ram_plus_grid: list[dict] | None = None
    ram_plus_soft_grid: list[dict] | None = None
    out_dtype: str | None = None  # --out-dtype of every merge (None: the base's dtype)
    probe_flags: list[str] = field(default_factory=list)  # e.g. ["--out-dtype", "bfloat16"] for the advice
    dtype_rows: str | None = None  # each chosen merge again in this dtype, scored on test (rounding's effect)


TOY = Track()


def cli(*args: str) -> None:
    from ram_desktop.cli import main

    code = main(["-q", *args])
    if code != 0:
        raise RuntimeError(f"ram-merge {' '.join(args)} exited {code}")


class Scorer:
    """Scores models on suites, caching results in ``scores.json`` so a resumed run skips them."""

    def __init__(self, out: Path, split: str, smoke: bool, track: Track = TOY, log=None):
        self.out, self.split, self.track, self.log = out, split, track, log
        self.path = out / f"scores-{split}.json"
        self.cache: dict = json.loads(self.path.read_text()) if self.path.exists() else {}
        self.rewards_path = out / f"rewards-{split}.json"  # per example, for paired standard errors
        self.rewards: dict = json.loads(self.rewards_path.read_text()) if self.rewards_path.exists() else {}
        self.data = {t: read_jsonl(out / "suites" / f"{t}-{split}" / "data.jsonl") for t in track.tasks}
        self.tokenizer = load_tokenizer(out / "base")

    def __call__(self, model_dir: Path) -> dict[str, float]:
        key = str(Path(model_dir).relative_to(self.out))
        if key not in self.cache or key not in self.rewards:
            tasks = self.track.tasks
            started = time.time()
            per_task = self.track.scores(Path(model_dir), self.split, self.data, self.tokenizer)
            scores = {}
            for t in tasks:
                values, exact, *extra = per_task[t]
                scores[t] = float(sum(values) / max(len(values), 1))
                scores[f"{t}_exact"] = float(sum(exact) / max(len(exact), 1))
                for column, per_example in (extra[0] if extra else {}).items():
                    scores[f"{t}_{column}"] = float(sum(per_example) / max(len(per_example), 1))
            scores["mean"] = sum(scores[t] for t in tasks) / len(tasks)
            scores["mean_exact"] = sum(scores[f"{t}_exact"] for t in tasks) / len(tasks)
            self.cache[key] = scores
            self.rewards[key] = {t: list(per_task[t][0]) for t in tasks}
            self.path.write_text(json.dumps(self.cache, indent=1))
            self.rewards_path.write_text(json.dumps(self.rewards))
            if self.log:
                self.log(f"scored {key} on {self.split} in {time.time() - started:.1f} s: mean {scores['mean']:.3f}")
        return self.cache[key]

    def per_example(self, model_dir: Path, task: str) -> list[float]:
        """``model_dir``'s reward on each example of ``task`` (scored first when not yet)."""
        self(model_dir)
        return self.rewards[str(Path(model_dir).relative_to(self.out))][task]


def variant_name(method: str, params: dict) -> str:
    return method + "".join(f"_{k}{v}" for k, v in params.items())


def compare(
    out: Path, batch: str, variants: list[tuple[str, dict]], *shared: str, tasks: tuple[str, ...] = TASKS, log=None
) -> dict[str, Path]:
    """Merge every (method, params) through one ``ram-merge compare`` (one read of the inputs), each into
    ``merges/<batch>/<name>``; skipped when that batch's compare.json exists (a resumed run)."""
    folder = out / "merges" / batch
    names = {variant_name(m, p): (m, p) for m, p in variants}
    if not (folder / "compare.json").exists():
        shutil.rmtree(folder, ignore_errors=True)
        specs = []
        for name, (method, params) in names.items():
            specs += [
                "--variant",
                ":".join([method, ",".join([*(f"{k}={v}" for k, v in params.items()), f"name={name}"])]),
            ]
        started = time.time()
        cli(
            "compare",
            str(out / "base"),
            *(str(out / t) for t in tasks),
            "--names",
            ",".join(tasks),
            *shared,
            *specs,
            "--out",
            str(folder),
        )
        if log:
            log(f"compare {batch}: {len(names)} variants in {time.time() - started:.1f} s")
    return {name: folder / name for name in names}


def search(val: Scorer, method: str, folders: dict[str, Path], grid: list[dict], log) -> dict:
    """Pick the setting with the best validation mean among ``grid`` (already merged into ``folders``)."""
    best = None
    for params in grid:
        folder = folders[variant_name(method, params)]
        s = val(folder)
        if best is None or s["mean"] > best["val"]["mean"] + 1e-12:
            best = {"method": method, "params": params, "folder": folder, "val": s}
    log(f"{method}: chose {best['params']} (validation mean {best['val']['mean']:.3f} over {len(grid)} settings)")
    return best


def fisher_estimates(out: Path, examples: int, log, tasks: tuple[str, ...] = TASKS, device: str = "cpu") -> list[Path]:
    """Each agent's diagonal Fisher on its own task's train split (``ram-merge fisher``), cached on disk."""
    folders = []
    for t in tasks:
        folder = out / "fisher" / t
        if not (folder / "fisher.json").exists():
            shutil.rmtree(folder, ignore_errors=True)
            started = time.time()
            cli(
                "fisher",
                str(out / t),
                "--suite",
                str(out / "suites" / f"{t}-train"),
                "--examples",
                str(examples),
                "--device",
                device,
                "--out",
                str(folder),
            )
            log(f"fisher {t}: {examples} examples of {t}-train in {time.time() - started:.1f} s")
        folders.append(folder)
    return folders


def unique_region_models(out: Path, log, tasks: tuple[str, ...] = TASKS) -> dict[str, Path]:
    """Figure 3: each agent's unique updates alone added to the base, and the same divided by N."""
    base = load_file(str(out / "base" / "model.safetensors"))
    agents = {t: load_file(str(out / t / "model.safetensors")) for t in tasks}
    made = {}
    for t in tasks:
        for diluted in (False, True):
            folder = out / "unique" / (f"{t}-diluted" if diluted else t)
            made[folder.name] = folder
            if (folder / "model.safetensors").exists():
                continue
            tensors = {}
            for name, b in base.items():
                taus = {a: agents[a][name].float() - b.float() for a in tasks}
                others = torch.zeros_like(b, dtype=torch.bool)
                for a in tasks:
                    if a != t:
                        others |= taus[a].abs() > EPS
                unique = (taus[t].abs() > EPS) & ~others
                step = torch.where(unique, taus[t], torch.zeros_like(taus[t])) / (len(tasks) if diluted else 1)
                tensors[name] = (b.float() + step).to(b.dtype)
            folder.mkdir(parents=True, exist_ok=True)
            for f in (out / "base").iterdir():
                if f.name != "model.safetensors" and f.is_file():
                    shutil.copy(f, folder / f.name)
            save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return made


def agent_gains(out: Path, test: Scorer) -> dict[str, dict[str, float]]:
    """Each agent against the base on its own task's test split, example by example (``paired_gain``)."""
    return {
        task: paired_gain(test.per_example(out / "base", task), test.per_example(out / task, task))
        for task in test.track.tasks
    }


def run_experiments(out: Path, smoke: bool, log, timings: dict, track: Track = TOY) -> dict:
    tasks = track.tasks
    t = time.time()
    probe_json = out / "probe.json"
    if not probe_json.exists():
        cli(
            "probe",
            str(out / "base"),
            *(str(out / t) for t in tasks),
            "--names",
            ",".join(tasks),
            *track.merge_flags,
            *track.probe_flags,
            "--json",
            str(probe_json),
        )
    probe = json.loads(probe_json.read_text())
    for a in probe["agents"]:
        log(
            f"probe {a['name']}: density {a['density']:.3f}, unique {a['unique']}, shared {a['shared']}, rho {a['rho']}"
        )
    timings["probe"] = time.time() - t

    t = time.time()
    val, test = Scorer(out, "validation", smoke, track, log), Scorer(out, "test", smoke, track, log)
    few = smoke and track.smoke_grids
    scales = track.ta_scales[-2:] if few else track.ta_scales
    densities = track.ties_densities[:1] if few else track.ties_densities
    drops = track.dare_drops[::4] if few else track.dare_drops
    r_sweep = track.r_sweep[::2] if few else track.r_sweep
    fixed = [
        (m, p)
        for m, p in [
            ("ram", {}),
            ("ram-plus", {"r": 0.1, "alpha": 2.0}),
            ("ram-plus-soft", {"r": 0.1}),
            ("average", {}),
        ]
        if not (m == "ram-plus" and track.ram_plus_grid is not None)
        and not (m == "ram-plus-soft" and track.ram_plus_soft_grid is not None)
    ]
    # the methods without a grid (WUDI: its authors' settings, 300 Adam steps, lr 1e-5, unless the track gives
    # wudi_params; Table 10 searches none)
    searched = {*GRID_METHODS, *(["ram-plus"] if track.ram_plus_grid is not None else [])}
    searched |= {"ram-plus-soft"} if track.ram_plus_soft_grid is not None else set()
    fixed += [
        (m, dict(track.wudi_params) if m == "wudi" else {})
        for m in track.methods
        if m not in searched and m not in dict(fixed)
    ]
    grids = {
        "task-arithmetic": [{"scale": s} for s in scales],
        "ties": [{"density": d, "scale": s} for d in densities for s in scales],
        "fisher": [{"scale": s} for s in scales],
    }
    if track.ram_plus_grid is not None:
        grids["ram-plus"] = list(track.ram_plus_grid)
    if track.ram_plus_soft_grid is not None:
        grids["ram-plus-soft"] = list(track.ram_plus_soft_grid)
    dtype_flags = ["--out-dtype", track.out_dtype] if track.out_dtype else []
    fishers = fisher_estimates(
        out, track.fisher_examples_smoke if smoke else track.fisher_examples, log, tasks, track.fisher_device
    )
    first = compare(
        out,
        "search",
        [
            *fixed,
            *[(m, p) for m, grid in grids.items() for p in grid],
            *[("ram-plus", {"r": r, "alpha": 2.0}) for r in r_sweep],
        ],
        "--fisher",
        ",".join(map(str, fishers)),
        *track.merge_flags,
        *dtype_flags,
        tasks=tasks,
        log=log,
    )
    chosen = {m: {"method": m, "params": p, "folder": first[variant_name(m, p)]} for m, p in fixed}
    for method, grid in grids.items():
        chosen[method] = search(val, method, first, grid, log)
    # DARE: the drop rate searched over 0.1..0.9 at the scaling term chosen for its partner method
    dare_grids = {
        "dare-ta": [{"drop": p, "scale": chosen["task-arithmetic"]["params"]["scale"]} for p in drops],
        "dare-ties": [{"drop": p, "scale": chosen["ties"]["params"]["scale"]} for p in drops],
    }
    second = compare(
        out,
        "dare",
        [(m, p) for m, grid in dare_grids.items() for p in grid],
        *track.merge_flags,
        *dtype_flags,
        tasks=tasks,
        log=log,
    )
    for method, grid in dare_grids.items():
        chosen[method] = search(val, method, second, grid, log)
    if track.prune_merges:  # their scores are cached; only the chosen and the r sweep are scored again
        keep = {c["folder"] for c in chosen.values()} | {
            first[variant_name("ram-plus", {"r": r, "alpha": 2.0})] for r in r_sweep
        }
        for folder in [*first.values(), *second.values()]:
            if folder not in keep:
                for f in folder.glob("*.safetensors"):
                    f.unlink()
    timings["merges+validation"] = time.time() - t

    t = time.time()
    table1 = {"base": test(out / "base")}
    for task in tasks:
        table1[task] = test(out / task)
    for name in track.methods:
        table1[name] = test(chosen[name]["folder"])
    table2 = {str(r): test(first[variant_name("ram-plus", {"r": r, "alpha": 2.0})]) for r in r_sweep}
    figure3 = {name: test(folder) for name, folder in unique_region_models(out, log, tasks).items()}
    dtype_table = {}
    if track.dtype_rows:  # the same chosen settings merged in another dtype: what rounding does
        again = compare(
            out,
            track.dtype_rows,
            [(chosen[n]["method"], chosen[n]["params"]) for n in track.methods],
            "--fisher",
            ",".join(map(str, fishers)),
            *track.merge_flags,
            "--out-dtype",
            track.dtype_rows,
            tasks=tasks,
            log=log,
        )
        dtype_table = {n: test(again[variant_name(chosen[n]["method"], chosen[n]["params"])]) for n in track.methods}
    gains = agent_gains(out, test)
    for task, g in gains.items():
        log(f"agent {task} on {task}-test: gain {100 * g['gain']:+.1f} ± {100 * g['se']:.1f} (paired SE, n = {g['n']})")
    timings["test"] = time.time() - t

    results = {
        "seed": json.loads((out / "code" / "recipe.json").read_text())["seed"],
        "probe": [{k: a[k] for k in ("name", "density", "unique", "shared", "rho")} for a in probe["agents"]],
        "advice": probe.get("advice"),
        "params": probe["params"],
        "recipes": {t: json.loads((out / t / "recipe.json").read_text()) for t in tasks},
        "chosen": {n: {"method": chosen[n]["method"], "params": chosen[n]["params"]} for n in track.methods},
        "table1": table1,
        "table2": table2,
        "figure3": figure3,
        "agent_gains": gains,
        "searched": {**grids, **dare_grids},
        "fixed_settings": {m: p for m, p in fixed},
    }
    if track.dtype_rows:
        results[f"table1_{track.dtype_rows}"] = dtype_table
    (out / "results.json").write_text(json.dumps(results, indent=2))
    for name, s in table1.items():
        log(
            f"test {name:16s} "
            + " ".join(f"{k}={s[k]:.3f}" for k in (*tasks, "mean"))
            + "  exact: "
            + " ".join(f"{k}={s[k + '_exact']:.3f}" for k in (*tasks, "mean"))
        )
    return results
