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

TASKS = ("code", "tool", "memory")
PNGS = ("figure2.png", "tables.png")


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
        for t in TASKS:
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
    modules = r0["heatmap"][TASKS[0]]["modules"]
    rows = ["| agent | " + " | ".join(modules) + " | embeddings |", "|---" * (len(modules) + 2) + "|"]
    for t in TASKS:
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


def ifeval_table(runs: list[dict]) -> str:
    names = list(runs[0]["ifeval"])
    n = runs[0]["ifeval"][names[0]]["n"]
    rows = [
        f"| model | instruction-level | prompt-level | gain over base ± paired SE (per seed, n = {n}) |",
        "|---|---|---|---|",
    ]
    for name in names:
        label = {"base": "Base", **{t: f"{t} agent" for t in TASKS}}.get(name, toy.LABELS.get(name, name))
        vals = [r["ifeval"][name] for r in runs if name in r["ifeval"]]
        gains = "; ".join(f"{100 * v['gain']:+.1f} ± {100 * v['gain_se']:.1f}" for v in vals) if name != "base" else "–"
        rows.append(
            f"| {label} | {pct([v['instruction'] for v in vals])} | {pct([v['prompt'] for v in vals])} | {gains} |"
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
    fig, axes = plt.subplots(1, 4, figsize=(15, 4.6), gridspec_kw={"width_ratios": [1.2, 1, 1, 1]})
    names = list(TASKS)
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
    models = ["base", *TASKS, *methods]
    fig, ax = plt.subplots(2, 2, figsize=(14, 8))
    width = 0.8 / 4
    x = np.arange(len(models))

    def mean_sd(values: list[float]) -> tuple[float, float]:
        return 100 * statistics.fmean(values), (100 * statistics.stdev(values) if len(values) > 1 else 0.0)

    for i, k in enumerate((*TASKS, "mean")):
        stats = [mean_sd([r["table1"][m][k] for r in runs]) for m in models]
        ax[0, 0].bar(
            x + (i - 1.5) * width, [s[0] for s in stats], width, yerr=[s[1] for s in stats], label=k, capsize=2
        )
    ax[0, 0].set_xticks(
        x, ["Base", *(f"{t} agent" for t in TASKS), *(toy.LABELS[m] for m in methods)], rotation=30, ha="right"
    )
    ax[0, 0].set_ylabel("test reward (%)")
    ax[0, 0].set_title(f"Table 1 ({len(runs)} seed{'s' if len(runs) > 1 else ''})")
    ax[0, 0].set_ylim(0, 112)
    ax[0, 0].legend(ncol=4, fontsize=8, loc="upper left")
    rs = list(r0["table2"])
    for k in (*TASKS, "mean"):
        ax[0, 1].plot(
            [float(r) for r in rs], [mean_sd([x_["table2"][r][k] for x_ in runs])[0] for r in rs], marker="o", label=k
        )
    ax[0, 1].set_xlabel("r (RAM+ rescaling strength, α = 2)")
    ax[0, 1].set_ylabel("test reward (%)")
    ax[0, 1].set_title("Table 2: r sweep")
    ax[0, 1].legend(fontsize=8)
    xt = np.arange(len(TASKS))
    for i, (key, label) in enumerate(
        [("full", "full agent"), ("", "unique region"), ("-diluted", "unique / N"), ("base", "base")]
    ):
        vals = []
        for t in TASKS:
            if key == "full":
                vals.append(mean_sd([r["table1"][t][t] for r in runs])[0])
            elif key == "base":
                vals.append(mean_sd([r["table1"]["base"][t] for r in runs])[0])
            else:
                vals.append(mean_sd([r["figure3"][t + key][t] for r in runs])[0])
        ax[1, 0].bar(xt + (i - 1.5) * 0.2, vals, 0.2, label=label)
    ax[1, 0].set_xticks(xt, TASKS)
    ax[1, 0].set_ylabel("test reward on the agent's task (%)")
    ax[1, 0].set_title("Figure 3: unique regions alone, and diluted by 1/N")
    ax[1, 0].legend(fontsize=8)
    names = list(r0["ifeval"])
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
    ax[1, 1].set_title("IFEval-style check (held-out instruction prompts)")
    ax[1, 1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "tables.png", dpi=90)
    plt.close(fig)


def render(runs: list[dict], results: Path) -> str:
    r0 = runs[0]
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
            for t in TASKS
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
        f"Task Arithmetic / TIES / Fisher scale {r0['grids']['ta_scales']}, TIES density "
        f"{r0['grids']['ties_densities']}, DARE drop {r0['grids']['dare_drops']} at the scale chosen for its "
        f"partner. Scores are mean rewards in percent on the test splits (mean ± sample standard deviation "
        f'over seeds); "right answers" are rewards of 1.0.{wudi}\n\n'
        f"### Agents against the base (each on its own task's test split)\n\n{agents_table(runs)}\n\n"
        f"Density: the fraction of elements whose bf16 value changed (τ ≠ 0); unique, shared and ρ: the probe's "
        f"counts of |τ| > ε = 1e-5, as RAM uses them.\n\n"
        f"### Figure 2: where the agents' updates are\n\nDensity per module kind, % of elements changed in bf16 "
        f"(mean over layers and seeds):\n\n{module_table(runs)}\n\n![figure 2](figure2.png)\n\n"
        f"### Table 1\n\n{toy.table1(runs)}\n\nSettings chosen on the validation split:\n\n{toy.chosen_table(runs)}\n\n"
        f"### Table 2: RAM+ r sweep (α = 2)\n\n{toy.table2(runs)}\n\n"
        f"### Figure 3: each agent's unique region merged alone into the base, and diluted by 1/N\n\n"
        f"{toy.figure3(runs)}\n\n"
        f"### IFEval-style check: instruction following, merged against base\n\n{ifeval_table(runs)}\n\n"
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
