"""The real-model track's report: ``results.md``, ``figure2.png`` and ``tables.png`` from ``results-seed*.json``.

    python -m reproduction.real.report RESULTS_DIR

Needs only the JSON files (not the models), so it reruns anywhere on results brought back from another
machine. The Table 1 / Table 2 / Figure 3 / chosen-settings tables are the toy track's (``reproduction/report.py``).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from reproduction import report as toy

TASKS = ("code", "tool", "memory")  # the first run's; a results file names its own (``tasks_of``)
PNGS = ("figure2.png", "tables.png")


def tasks_of(runs: list[dict]) -> tuple[str, ...]:
    """The tasks of these runs (the agents' names, in the results file's order)."""
    return tuple(runs[0]["agents"])


def load_runs(results: Path) -> list[dict]:
    files = sorted(results.glob("results-seed*.json"), key=lambda p: int(p.stem.removeprefix("results-seed")))
    if not files:
        raise SystemExit(f"error: no results-seed*.json in {results}")
    return [json.loads(f.read_text()) for f in files]


def pct(values: list[float]) -> str:
    return toy.fmt(values)


def agents_table(runs: list[dict]) -> str:
    rows = [
        (
            "| seed | agent | base on its task | agent on its task | gain ± paired SE (n) | clear (gain > 2 SE) | "
            "density (bf16) | unique | shared | ρ | right answers base → agent | GRPO steps |"
        ),
        "|---" * 12 + "|",
    ]
    for r in runs:
        t1 = r["table1"]
        for t in tasks_of(runs):
            a = r["agents"][t]
            rho = "∞" if a["rho"] is None else f"{a['rho']:.2f}"
            rows.append(
                f"| {r['seed']} | {t} | {100 * t1['base'][t]:.1f} | {100 * t1[t][t]:.1f} | "
                f"{100 * a['gain']:+.1f} ± {100 * a['gain_se']:.1f} ({a['n']}) | "
                f"{'yes' if a['gain'] > 2 * a['gain_se'] else 'no'} | {100 * a['density']:.2f} % | "
                f"{a['unique']:,} | {a['shared']:,} | {rho} | "
                f"{100 * t1['base'][t + '_exact']:.1f} → {100 * t1[t][t + '_exact']:.1f} | "
                f"{r['recipes'][t]['steps']} |"
            )
    return "\n".join(rows)


def module_table(runs: list[dict]) -> str:
    """Density per module kind (all layers together), per agent, mean over seeds."""
    r0 = runs[0]
    modules = r0["heatmap"][tasks_of(runs)[0]]["modules"]
    rows = ["| agent | " + " | ".join(modules) + " | embeddings |", "|---" * (len(modules) + 2) + "|"]
    for t in tasks_of(runs):
        cells = []
        for j in range(len(modules)):
            per_seed = []
            for r in runs:
                col = [row[j] for row in r["heatmap"][t]["layers"] if row[j] is not None]
                per_seed.append(statistics.fmean(col) if col else 0.0)
            cells.append(f"{100 * statistics.fmean(per_seed):.1f}")
        emb = [v for r in runs for k, v in r["heatmap"][t]["other"].items() if "embed" in k]
        cells.append(f"{100 * statistics.fmean(emb):.1f}" if emb else "–")
        rows.append(f"| {t} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def ifeval_models(runs: list[dict]) -> list[str]:
    """The models of the IFEval table (entries with scores; not ``implementation``, ``floor`` ...)."""
    return [k for k, v in runs[0]["ifeval"].items() if isinstance(v, dict) and "instruction" in v]


def ifeval_table(runs: list[dict]) -> str:
    names = ifeval_models(runs)
    n = runs[0]["ifeval"][names[0]]["n"]
    loose = "instruction_loose" in runs[0]["ifeval"][names[0]]
    head = "instruction-level strict | prompt-level strict | " + (
        "instruction-level loose | prompt-level loose | " if loose else ""
    )
    rows = [
        f"| model | {head}gain over base ± paired SE (per seed, n = {n}) |",
        "|---" * (6 if loose else 4) + "|",
    ]
    for name in names:
        label = {"base": "Base", **{t: f"{t} agent" for t in tasks_of(runs)}}.get(name, toy.LABELS.get(name, name))
        vals = [r["ifeval"][name] for r in runs if name in r["ifeval"]]
        gains = "; ".join(f"{100 * v['gain']:+.1f} ± {100 * v['gain_se']:.1f}" for v in vals) if name != "base" else "–"
        cells = [pct([v["instruction"] for v in vals]), pct([v["prompt"] for v in vals])]
        if loose:
            cells += [pct([v["instruction_loose"] for v in vals]), pct([v["prompt_loose"] for v in vals])]
        rows.append(f"| {label} | " + " | ".join(cells) + f" | {gains} |")
    return "\n".join(rows)


def floors_table(runs: list[dict]) -> str:
    """Each task's floor (best constant answer, as ``ram-merge eval`` computes it), the audit's constants, and
    each agent's score over its task's floor with the paired SE."""
    rows = [
        (
            "| seed | task | metric | floor: answer → score | audit's constant → score | agent | agent over the "
            "floor ± paired SE | clear over base | clear over floor |"
        ),
        "|---" * 9 + "|",
    ]
    for r in runs:
        for t, info in r["tasks"].items():
            a = r["agents"][t]
            constants = "; ".join(f"`{c}` → {100 * v:.1f}" for c, v in info["constants"].items()) or "–"
            rows.append(
                f"| {r['seed']} | {t} | {info['metric']} | `{info['floor']['answer']}` → "
                f"{100 * info['floor']['score']:.1f} | {constants} | {100 * a['score']:.1f} | "
                f"{100 * a['over_floor']:+.1f} ± {100 * a['over_floor_se']:.1f} | "
                f"{'yes' if a['clear_over_base'] else 'no'} | {'yes' if a['clear_over_floor'] else 'no'} |"
            )
    return "\n".join(rows)


def partial_table(runs: list[dict]) -> str:
    """The tool task's secondary column (the old partial credit) beside its primary metric (the exact call)."""
    names = ["base", *tasks_of(runs), *toy.merged(runs)]
    rows = ["| model | tool: exact call (primary) | tool: partial credit (secondary) |", "|---|---|---|"]
    for name in names:
        vals = [r["table1"][name] for r in runs]
        if all("tool_partial" in v for v in vals):
            label = {"base": "Base", **{t: f"{t} agent" for t in tasks_of(runs)}}.get(name, toy.LABELS.get(name, name))
            rows.append(f"| {label} | {pct([v['tool'] for v in vals])} | {pct([v['tool_partial'] for v in vals])} |")
    return "\n".join(rows)


def rounding_table(runs: list[dict]) -> str:
    """Each method's chosen merge written in float32 (the tables) and again in bf16: what rounding does."""
    key = next(k for k in runs[0] if k.startswith("table1_"))
    rows = [f"| method | mean, float32 | mean, {key.removeprefix('table1_')} | difference |", "|---|---|---|---|"]
    for m in toy.merged(runs):
        a = [r["table1"][m]["mean"] for r in runs]
        b = [r[key][m]["mean"] for r in runs if m in r[key]]
        if len(b) == len(a):
            rows.append(f"| {toy.LABELS.get(m, m)} | {pct(a)} | {pct(b)} | {pct([y - x for x, y in zip(a, b)])} |")
    return "\n".join(rows)


def grids_text(runs: list[dict]) -> str:
    r0 = runs[0]
    lines = ["Grids searched on the validation split (every setting of each; the chosen one is in Table 1's list):", ""]
    for method, grid in r0["grids"].items():
        axes = {k: sorted({p[k] for p in grid}) for k in grid[0]} if grid else {}
        lines.append(
            f"- {toy.LABELS.get(method, method)}: {len(grid)} settings, "
            + ", ".join(f"{k} ∈ {v}" for k, v in axes.items())
        )
    lines += ["", "Fixed (not searched):", ""]
    lines += [f"- {k}: {v}" for k, v in r0["fixed"].items()]
    return "\n".join(lines)


def regime_table(runs: list[dict]) -> str:
    rows = [
        (
            "| seed | setting | lr | steps | density (bf16) per agent | unique share per agent | sign agreement | "
            "TA λ | RAM − TA ± paired SE (all agents) | RAM − TA, mean of pairs |"
        ),
        "|---" * 10 + "|",
    ]
    for r in runs:
        for e in r.get("regime", []):
            tasks = list(e["agents"])
            dens = " / ".join(f"{100 * e['agents'][t]['density_bf16']:.1f}" for t in tasks)
            uniq = " / ".join(
                "–" if e["agents"][t]["unique_share"] is None else f"{100 * e['agents'][t]['unique_share']:.0f}"
                for t in tasks
            )
            steps = "/".join(str(e["steps"][t]) for t in tasks)
            sign = "–" if e["sign_agreement"] is None else f"{100 * e['sign_agreement']:.1f} %"
            rows.append(
                f"| {r['seed']} | {e['setting']} | {e['learning_rate']:g} | {steps} | {dens} % | {uniq} % | {sign} | "
                f"{e['ta_lambda']:g} | {100 * e['ram_minus_ta']:+.1f} ± {100 * e['ram_minus_ta_se']:.1f} | "
                f"{100 * e['pairs_mean_ram_minus_ta']:+.1f} |"
            )
    return "\n".join(rows)


def timings_text(runs: list[dict], results: Path) -> str:
    lines = []
    tfile = results / "timings.json"
    if tfile.exists():
        timings = json.loads(tfile.read_text())
        stages = [f"{k} {v['seconds']:.0f} s" for k, v in timings.items() if isinstance(v, dict)]
        lines.append(
            f"Wall time by stage (the last run of each): {', '.join(stages)}; total {timings.get('total', 0):.0f} s."
        )
    for r in runs:
        lines.append(
            f"Seed {r['seed']} merges stage ({r['device']}): "
            + ", ".join(f"{k} {v:.0f} s" for k, v in r["timings"].items())
            + "."
        )
    return "\n\n".join(lines)


def plots(runs: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    r0 = runs[0]
    tasks = tasks_of(runs)
    names = list(tasks)
    fig, axes = plt.subplots(
        1, 1 + len(names), figsize=(4 + 3.4 * len(names), 4.6), gridspec_kw={"width_ratios": [1.2] + [1] * len(names)}
    )
    n = r0["params"]
    uniq = [100 * r0["agents"][t]["unique"] / n for t in names]
    shared = [100 * r0["agents"][t]["shared"] / n for t in names]
    axes[0].bar(names, uniq, label="unique to this agent", color="#4c72b0")
    axes[0].bar(names, shared, bottom=uniq, label="shared with another agent", color="#dd8452")
    axes[0].set_ylabel("% of all parameters updated (bf16)")
    axes[0].set_title(f"Task-vector density (seed {r0['seed']})")
    axes[0].legend(fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.06), ncol=2, frameon=False)
    cells = sorted(v for t in names for row in r0["heatmap"][t]["layers"] for v in row if v is not None)
    vmax = 100 * cells[int(0.98 * (len(cells) - 1))] or 1.0  # a few hot cells (layer 0) would flatten the rest
    for ax, t in zip(axes[1:], names):
        grid = np.array([[np.nan if v is None else 100 * v for v in row] for row in r0["heatmap"][t]["layers"]])
        im = ax.imshow(grid, aspect="auto", cmap="viridis", vmin=0, vmax=vmax, origin="lower")
        ax.set_xticks(
            range(len(r0["heatmap"][t]["modules"])),
            [
                m.replace("_proj", "").replace("_layernorm", " norm").replace("post_attention", "post")
                for m in r0["heatmap"][t]["modules"]
            ],
            rotation=60,
            ha="right",
            fontsize=7,
        )
        if t == names[0]:
            ax.set_ylabel("layer")
        ax.set_title(f"{t} agent", fontsize=9)
    fig.colorbar(im, ax=axes[1:], shrink=0.8, extend="max", label="% of the tensor changed in bf16, per layer × module")
    fig.suptitle("Figure 2 on SmolLM2-135M-Instruct (GRPO agents, bf16)", fontsize=10)
    fig.savefig(out / "figure2.png", dpi=100, bbox_inches="tight")
    plt.close(fig)

    methods = toy.merged(runs)
    models = ["base", *tasks, *methods]
    fig, ax = plt.subplots(2, 3, figsize=(20, 8))
    width = 0.8 / (len(tasks) + 1)
    x = np.arange(len(models))

    def mean_sd(values: list[float]) -> tuple[float, float]:
        return 100 * statistics.fmean(values), (100 * statistics.stdev(values) if len(values) > 1 else 0.0)

    for i, k in enumerate((*tasks, "mean")):
        stats = [mean_sd([r["table1"][m][k] for r in runs]) for m in models]
        ax[0, 0].bar(
            x + (i - len(tasks) / 2) * width,
            [s[0] for s in stats],
            width,
            yerr=[s[1] for s in stats],
            label=k,
            capsize=2,
        )
    ax[0, 0].set_xticks(
        x, ["Base", *(f"{t} agent" for t in tasks), *(toy.LABELS[m] for m in methods)], rotation=30, ha="right"
    )
    ax[0, 0].set_ylabel("test reward (%)")
    ax[0, 0].set_title(f"Table 1 ({len(runs)} seed{'s' if len(runs) > 1 else ''})")
    ax[0, 0].set_ylim(0, 112)
    ax[0, 0].legend(ncol=4, fontsize=8, loc="upper left")
    rs = list(r0["table2"])
    for k in (*tasks, "mean"):
        ax[0, 1].plot(
            [float(r) for r in rs], [mean_sd([x_["table2"][r][k] for x_ in runs])[0] for r in rs], marker="o", label=k
        )
    ax[0, 1].set_xlabel("r (RAM+ rescaling strength, α = 2)")
    ax[0, 1].set_ylabel("test reward (%)")
    ax[0, 1].set_title("Table 2: r sweep")
    ax[0, 1].legend(fontsize=8)
    xt = np.arange(len(tasks))
    for i, (key, label) in enumerate(
        [("full", "full agent"), ("", "unique region"), ("-diluted", "unique / N"), ("base", "base")]
    ):
        vals = []
        for t in tasks:
            if key == "full":
                vals.append(mean_sd([r["table1"][t][t] for r in runs])[0])
            elif key == "base":
                vals.append(mean_sd([r["table1"]["base"][t] for r in runs])[0])
            else:
                vals.append(mean_sd([r["figure3"][t + key][t] for r in runs])[0])
        ax[1, 0].bar(xt + (i - 1.5) * 0.2, vals, 0.2, label=label)
    ax[1, 0].set_xticks(xt, tasks)
    ax[1, 0].set_ylabel("test reward on the agent's task (%)")
    ax[1, 0].set_title("Figure 3: unique regions alone, and diluted by 1/N")
    ax[1, 0].legend(fontsize=8)
    names = ifeval_models(runs)
    for i, k in enumerate(("instruction", "prompt")):
        stats = [mean_sd([r["ifeval"][m][k] for r in runs if m in r["ifeval"]]) for m in names]
        ax[1, 1].bar(
            np.arange(len(names)) + (i - 0.5) * 0.4,
            [s[0] for s in stats],
            0.4,
            yerr=[s[1] for s in stats],
            label=f"{k}-level",
            capsize=2,
        )
    ax[1, 1].set_xticks(np.arange(len(names)), [toy.LABELS.get(m, m) for m in names], rotation=30, ha="right")
    ax[1, 1].set_ylabel("constraints met (%)")
    ax[1, 1].set_title("IFEval (lm-eval's checkers, strict)" if "implementation" in r0["ifeval"] else "IFEval-style")
    ax[1, 1].legend(fontsize=8)
    entries = [(r["seed"], e) for r in runs for e in r.get("regime", []) if e.get("mean_unique_share") is not None]
    for seed, e in entries:
        ax[0, 2].errorbar(
            100 * e["mean_unique_share"], 100 * e["ram_minus_ta"], yerr=200 * e["ram_minus_ta_se"], fmt="o", capsize=3
        )
        ax[0, 2].annotate(f"{e['setting']} (seed {seed})", (100 * e["mean_unique_share"], 100 * e["ram_minus_ta"]))
    ax[0, 2].axhline(0, color="gray", lw=0.8)
    ax[0, 2].set_xlabel("mean unique share of the agents' updates (%)")
    ax[0, 2].set_ylabel("RAM − Task Arithmetic, test (points, ± 2 SE)")
    ax[0, 2].set_title("The regime: RAM's gap against its premise" if entries else "The regime: not run")
    key = next((k for k in r0 if k.startswith("table1_")), None)
    if key:
        ms = [m for m in methods if all(m in r[key] for r in runs)]
        for i, (k, label) in enumerate((("table1", "float32"), (key, key.removeprefix("table1_")))):
            ax[1, 2].bar(np.arange(len(ms)) + (i - 0.5) * 0.4, [mean_sd([r[k][m]["mean"] for r in runs])[0] for m in ms],
                         0.4, label=label)  # fmt: skip
        ax[1, 2].set_xticks(np.arange(len(ms)), [toy.LABELS[m] for m in ms], rotation=30, ha="right")
        ax[1, 2].set_ylabel("test mean (%)")
        ax[1, 2].set_title("The same merges written in float32 and in bf16")
        ax[1, 2].legend(fontsize=8)
    else:
        ax[1, 2].axis("off")
    fig.tight_layout()
    fig.savefig(out / "tables.png", dpi=90)
    plt.close(fig)


def new_sections(runs: list[dict]) -> str:
    """The sections of issue 38's keys (floors, partial credit, IFEval's implementation, bf16 rows, grids and
    fixed settings, the regime), each only when the results files hold its keys."""
    r0 = runs[0]
    parts = []
    if "tasks" in r0:
        parts.append(
            "### Floors: what a constant answer scores, and each agent over it\n\n"
            "The floor is the best constant answer (the empty answer and the 5 most frequent reference answers, "
            "scored by the suite's own scorer, as `ram-merge eval` does: `ram_desktop/evaluate/floors.py`); the "
            "audit's constant replies are scored the same way.\n\n" + floors_table(runs)
        )
    if all("tool_partial" in r["table1"]["base"] for r in runs):
        parts.append("### The tool task: exact call and partial credit\n\n" + partial_table(runs))
    if "implementation" in r0["ifeval"]:
        fl = r0["ifeval"]["floor"]
        parts.append(
            f"IFEval checkers: {r0['ifeval']['implementation']}; types left out: {r0['ifeval']['left_out']}. "
            f"The suite's floor (no reference answers, so the empty reply): {100 * fl['score']:.1f}."
        )
    if any(k.startswith("table1_") for k in r0):
        parts.append("### Rounding: the chosen merges in float32 and in bf16\n\n" + rounding_table(runs))
    if "fixed" in r0:
        parts.append("### Grids and fixed settings\n\n" + grids_text(runs))
    if any(r.get("regime") for r in runs):
        parts.append(
            "### The regime: training settings, the agents' overlap, and RAM against Task Arithmetic\n\n"
            + regime_table(runs)
        )
    return "\n\n".join(parts) + ("\n\n" if parts else "")


def render(runs: list[dict], results: Path) -> str:
    r0 = runs[0]
    tasks = tasks_of(runs)
    axes = r0.get("grid_axes", r0["grids"])
    seeds = ", ".join(str(r["seed"]) for r in runs)
    smoke = (
        " **SMOKE RUN (tiny splits, 2 GRPO steps): the numbers mean nothing.**" if any(r["smoke"] for r in runs) else ""
    )
    rec = r0["recipe"]
    wudi = (
        ""
        if "wudi" in r0["chosen"]
        else ("\n\nWUDI is not in this build's methods (`ram_desktop.core.methods.METHODS`), so its row is left out.")
    )
    base_val = "; ".join(
        f"seed {r['seed']}: "
        + ", ".join(
            f"{t} {100 * r['base_validation'][t]:.1f} % ({100 * r['base_validation'][t + '_exact']:.1f} % right)"
            for t in tasks
        )
        for r in runs
        if "base_validation" in r
    )
    return (
        f"Model: {r0['model']}. Seeds: {seeds}. Device: {r0['device']}.{smoke}\n\n"
        f"The base on the validation splits (mean reward): {base_val or 'not recorded'}.\n\n"
        f"Splits per task: {', '.join(f'{k} {v}' for k, v in r0['sizes'].items())}. GRPO (TRL `GRPOTrainer`, β = 0, "
        f"float32 master weights, saved in bf16, every parameter trainable): learning rate {rec['learning_rate']:g}, "
        f"{rec['steps']} steps (per agent in the table below) of {rec['prompts_per_step']} prompts × "
        f"{rec['generations']} completions. "
        f"Merge grids (subsets of the paper's Table 11 ranges, chosen on the validation mean): "
        f"Task Arithmetic / TIES / Fisher scale {axes['ta_scales']}, TIES density "
        f"{axes['ties_densities']}, DARE drop {axes['dare_drops']} at the scale chosen for its "
        f"partner. Scores are mean rewards in percent on the test splits (mean ± sample standard deviation "
        f'over seeds); "right answers" are rewards of 1.0.{wudi}\n\n'
        f"### Agents against the base (each on its own task's test split)\n\n{agents_table(runs)}\n\n"
        f"Density: the fraction of elements whose bf16 value changed (τ ≠ 0); unique, shared and ρ: the probe's "
        f"counts of |τ| > ε = 1e-5, as RAM uses them.\n\n"
        f"### Figure 2: where the agents' updates are\n\nDensity per module kind, % of elements changed in bf16 "
        f"(mean over layers and seeds):\n\n{module_table(runs)}\n\n![figure 2](figure2.png)\n\n"
        f"### Table 1\n\n{toy.table1(runs, tasks)}\n\nSettings chosen on the validation split:\n\n"
        f"{toy.chosen_table(runs)}\n\n"
        f"### Table 2: RAM+ r sweep (α = 2)\n\n{toy.table2(runs, tasks)}\n\n"
        f"### Figure 3: each agent's unique region merged alone into the base, and diluted by 1/N\n\n"
        f"{toy.figure3(runs, tasks)}\n\n"
        f"### {'IFEval' if 'implementation' in r0['ifeval'] else 'IFEval-style check'}: instruction following, "
        f"merged against base\n\n{ifeval_table(runs)}\n\n"
        f"{new_sections(runs)}"
        f"![tables](tables.png)\n\n### Timings\n\n{timings_text(runs, results)}\n"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path, help="the folder holding results-seed*.json (the report is written there)")
    args = ap.parse_args(argv)
    runs = load_runs(args.results)
    text = render(runs, args.results)
    (args.results / "results.md").write_text(text)
    plots(runs, args.results)
    print(f"wrote {args.results / 'results.md'} and {', '.join(PNGS)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
