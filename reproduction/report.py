"""Stage 4: tables (markdown) and figures (PNG) from one or more seeds' ``results.json``.

python reproduction/report.py runs/seed0 runs/seed1 runs/seed2 --out reproduction/results
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

TASKS = ("code", "tool", "memory")
AGENT_OF = {"code": "code", "tool": "tool", "memory": "memory"}
METHODS = [
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
]
LABELS = {
    "ram": "RAM",
    "ram-plus": "RAM+",
    "ram-plus-soft": "RAM+s",
    "average": "Average",
    "task-arithmetic": "Task Arithmetic",
    "ties": "TIES",
    "dare-ta": "DARE+TA",
    "dare-ties": "DARE+TIES",
    "fisher": "Fisher",
    "wudi": "WUDI",
}


def merged(runs: list[dict]) -> list[str]:
    """The methods these runs merged with (results written before a method existed lack it)."""
    return [m for m in METHODS if all(m in r["table1"] for r in runs)]


def fmt(values: list[float]) -> str:
    """Mean in percent, ± the sample standard deviation when there are several seeds."""
    m = 100 * statistics.fmean(values)
    return f"{m:.1f} ± {100 * statistics.stdev(values):.1f}" if len(values) > 1 else f"{m:.1f}"


def table1(runs: list[dict], tasks: tuple[str, ...] = TASKS, key: str = "table1") -> str:
    rows = ["| model | " + " | ".join(tasks) + " | mean |", "|---" * (len(tasks) + 2) + "|"]
    names = ["base", *tasks, *merged(runs)] if key == "table1" else merged(runs)
    for name in names:
        label = {"base": "Base", **{t: f"{t} agent" for t in tasks}}.get(name, LABELS.get(name))
        cells = [fmt([r[key][name][k] for r in runs]) for k in (*tasks, "mean")]
        if name in tasks:  # an agent: its own task in bold
            cells[tasks.index(name)] = f"**{cells[tasks.index(name)]}**"
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def table2(runs: list[dict], tasks: tuple[str, ...] = TASKS) -> str:
    rs = list(runs[0]["table2"])
    rows = ["| r | " + " | ".join(tasks) + " | mean |", "|---" * (len(tasks) + 2) + "|"]
    for r in rs:
        rows.append(f"| {r} | " + " | ".join(fmt([x["table2"][r][k] for x in runs]) for k in (*tasks, "mean")) + " |")
    return "\n".join(rows)


def figure3(runs: list[dict], tasks: tuple[str, ...] = TASKS) -> str:
    rows = [
        "| agent (its task) | full agent | unique region alone | unique region / N | base |",
        "|---|---|---|---|---|",
    ]
    for t in tasks:
        rows.append(
            f"| {t} | {fmt([r['table1'][t][t] for r in runs])} | {fmt([r['figure3'][t][t] for r in runs])} | "
            f"{fmt([r['figure3'][t + '-diluted'][t] for r in runs])} | {fmt([r['table1']['base'][t] for r in runs])} |"
        )
    return "\n".join(rows)


def agents_table(runs: list[dict]) -> str:
    """Each agent against the base on its own task, per seed: the skill the merge should keep."""
    rows = [
        (
            "| seed | agent | base on its task | agent on its task | gain ± paired SE | clear (gain > 2 SE) "
            "| exact match base → agent |"
        ),
        "|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        t1 = r["table1"]
        for t in TASKS:
            g = r["agent_gains"][t]
            rows.append(
                f"| {r['seed']} | {t} | {100 * t1['base'][t]:.1f} | {100 * t1[t][t]:.1f} | "
                f"{100 * g['gain']:+.1f} ± {100 * g['se']:.1f} | {'yes' if g['gain'] > 2 * g['se'] else 'no'} | "
                f"{100 * t1['base'][t + '_exact']:.1f} → {100 * t1[t][t + '_exact']:.1f} |"
            )
    return "\n".join(rows)


def density_table(runs: list[dict]) -> str:
    rows = [
        "| seed | agent | trained tensors | lr | steps | density (bf16) | unique | shared | ρ |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        for a in r["probe"]:
            rec = r["recipes"][a["name"]]
            rho = "∞" if a["rho"] is None else f"{a['rho']:.2f}"
            rows.append(
                f"| {r['seed']} | {a['name']} | `{rec['trainable'].replace('|', chr(92) + '|')}` ({rec['trained_parameters']:,} of {r['params']:,}) | "
                f"{rec['learning_rate']:g} | {rec['steps']} | {100 * a['density']:.1f} % | {a['unique']:,} | {a['shared']:,} | {rho} |"
            )
    return "\n".join(rows)


def chosen_table(runs: list[dict]) -> str:
    methods = merged(runs)
    rows = ["| seed | " + " | ".join(LABELS[m] for m in methods if runs[0]["chosen"][m]["params"]) + " |"]
    rows.append("|---" * (len(rows[0].split("|")) - 2) + "|")
    for r in runs:
        rows.append(
            f"| {r['seed']} | "
            + " | ".join(
                ", ".join(f"{k}={v}" for k, v in r["chosen"][m]["params"].items())
                for m in methods
                if runs[0]["chosen"][m]["params"]
            )
            + " |"
        )
    return "\n".join(rows)


def plots(runs: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    r0 = runs[0]
    names = [a["name"] for a in r0["probe"]]
    fig, ax = plt.subplots(1, 2, figsize=(9, 3.4))
    n = r0["params"]
    uniq = [100 * a["unique"] / n for a in r0["probe"]]
    shared = [100 * a["shared"] / n for a in r0["probe"]]
    ax[0].bar(names, uniq, label="unique to this agent", color="#4c72b0")
    ax[0].bar(names, shared, bottom=uniq, label="shared with another agent", color="#dd8452")
    ax[0].set_ylabel("% of all parameters updated (bf16)")
    ax[0].set_title(f"Task-vector density (seed {r0['seed']})")
    ax[0].legend(fontsize=8)
    ax[1].bar(names, [0 if a["rho"] is None else a["rho"] for a in r0["probe"]], color="#55a868")
    ax[1].set_title("overlap-unique ratio ρ = shared / unique")
    fig.tight_layout()
    fig.savefig(out / "figure2-density.png", dpi=110)
    plt.close(fig)

    models = ["base", *TASKS, *merged(runs)]
    fig, ax = plt.subplots(figsize=(11, 3.8))
    width = 0.8 / 4
    x = np.arange(len(models))
    for i, k in enumerate((*TASKS, "mean")):
        means = [100 * statistics.fmean(r["table1"][m][k] for r in runs) for m in models]
        errs = [100 * statistics.stdev(r["table1"][m][k] for r in runs) if len(runs) > 1 else 0 for m in models]
        ax.bar(x + (i - 1.5) * width, means, width, yerr=errs, label=k, capsize=2)
    ax.set_xticks(
        x,
        ["Base", "code agent", "tool agent", "memory agent", *(LABELS[m] for m in merged(runs))],
        rotation=30,
        ha="right",
    )
    ax.set_ylabel("test score (%)")
    ax.set_ylim(0, 100)
    ax.set_title(f"Table 1 in miniature ({len(runs)} seed{'s' if len(runs) > 1 else ''})")
    ax.legend(ncol=4, fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(out / "table1.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(1, 2, figsize=(9, 3.4))
    rs = list(r0["table2"])
    for k in (*TASKS, "mean"):
        ax[0].plot(
            [float(r) for r in rs],
            [100 * statistics.fmean(x["table2"][r][k] for x in runs) for r in rs],
            marker="o",
            label=k,
        )
    ax[0].set_xlabel("r (RAM+ rescaling strength)")
    ax[0].set_ylabel("test score (%)")
    ax[0].set_title("Table 2: r sweep")
    ax[0].legend(fontsize=8)
    x = np.arange(len(TASKS))
    for i, (key, label) in enumerate(
        [("full", "full agent"), ("", "unique region"), ("-diluted", "unique / N"), ("base", "base")]
    ):
        vals = []
        for t in TASKS:
            if key == "full":
                vals.append(statistics.fmean(r["table1"][t][t] for r in runs))
            elif key == "base":
                vals.append(statistics.fmean(r["table1"]["base"][t] for r in runs))
            else:
                vals.append(statistics.fmean(r["figure3"][t + key][t] for r in runs))
        ax[1].bar(x + (i - 1.5) * 0.2, [100 * v for v in vals], 0.2, label=label)
    ax[1].set_xticks(x, TASKS)
    ax[1].set_title("Figure 3: unique regions alone")
    ax[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "table2-figure3.png", dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    runs = [json.loads((r / "results.json").read_text()) for r in args.runs]
    args.out.mkdir(parents=True, exist_ok=True)
    seeds = ", ".join(str(r["seed"]) for r in runs)
    text = (
        f"Seeds: {seeds}. Scores in percent on the test splits (mean ± sample standard deviation over seeds).\n\n"
        f"### Agents against the base\n\n{agents_table(runs)}\n\n"
        f"### Agents (Figure 2)\n\n{density_table(runs)}\n\n![density](figure2-density.png)\n\n"
        f"### Table 1 in miniature\n\n{table1(runs)}\n\n![table 1](table1.png)\n\n"
        f"Baseline settings chosen on the validation split:\n\n{chosen_table(runs)}\n\n"
        f"### Table 2: RAM+ r sweep (α = 2)\n\n{table2(runs)}\n\n"
        f"### Figure 3: each agent's unique region merged alone into the base\n\n{figure3(runs)}\n\n"
        f"![table 2 and figure 3](table2-figure3.png)\n"
    )
    (args.out / "results.md").write_text(text)
    plots(runs, args.out)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
