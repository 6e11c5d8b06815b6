"""The output's README.md model card: huggingface_hub's ``ModelCardData`` front matter and a Markdown body.

The text is what ``huggingface_hub.ModelCard(text).save(path)`` writes (that class stores the text and
writes it back unchanged); writing it directly spares every merge importing ``huggingface_hub.repocard``,
which pulls the Hub client (~0.3 CPU-s). ``ModelCard.load`` reads the file back.
"""

from __future__ import annotations

import math
from pathlib import Path

from ...engine.plan import MergePlan
from ...engine.probe import ProbeReport
from ...methods import get_method


def _hub_base_id(plan: MergePlan) -> str | None:
    if plan.base.repo_id:
        return plan.base.repo_id
    name = (plan.base.config or {}).get("_name_or_path")
    return name if isinstance(name, str) and name.count("/") == 1 and not name.startswith((".", "/")) else None


def model_card(
    plan: MergePlan, method_name: str, params: dict, lambdas: list[float], probe: ProbeReport, out_dtype: str
) -> str:
    """The card's text: YAML front matter (``base_model``, ``tags``, ``library_name``) and the body."""
    from huggingface_hub.repocard_data import ModelCardData  # the front matter only (not the Hub client)

    method = get_method(method_name)
    data = ModelCardData(
        base_model=_hub_base_id(plan),
        tags=["merge", "ram-desktop", method_name, "reinforcement-learning", "agent"],
        library_name="transformers" if (plan.base.config or {}).get("architectures") else None,
    )
    params_text = ", ".join(f"{k} = {v}" for k, v in params.items()) or "none"
    rescales = method.rescales  # λ only means something for RAM+ / RAM+s
    rho = method.analysis.selective  # ρ describes RAM's selective merge only
    stats = not method.streaming.stacks  # layer stacking compares no task vectors: no statistics to show
    rows = []
    for t, a in enumerate(probe.agents):
        cells = [a.name, f"`{plan.agents[t].display}`"]
        if stats:
            cells += [f"{a.density:.2%}", f"{a.unique:,}", f"{a.shared:,}"]
        if stats and rho:
            cells.append("∞" if math.isinf(a.rho) else f"{a.rho:.3f}")
        if stats and rescales:
            cells.append(f"{lambdas[t]:.4f}")
        rows.append("| " + " | ".join(cells) + " |")
    head = ["agent", "source"] + (["density", "unique", "shared"] if stats else [])
    head += (["ρ"] if stats and rho else []) + (["λ"] if stats and rescales else [])
    overlap_head = " | ".join(f"{k + 1} agent{'s' if k else ''}" for k in range(len(probe.agents)))
    overlap_rows = [
        f"| {a.name} | " + " | ".join(f"{c / a.updated:.1%}" if a.updated else "-" for c in a.overlap) + " |"
        for a in probe.agents
    ]
    overlap = f"""
## Overlap: share of each agent's updates that k agents update

| agent | {overlap_head} |
|---|{"---|" * len(probe.agents)}
{chr(10).join(overlap_rows)}
"""
    rho_note = (
        "\n- Overlap statistics ρ are counted over the whole model, as the RAM paper defines them (arXiv 2601.13572)."
    )
    agents = f"{plan.n_agents} reinforcement-learning-trained agent{'s' if plan.n_agents != 1 else ''}"
    body = f"""
# Merged with RAM Desktop: {method.label}

This model merges {agents} into their common base with
**{method.label}** ({method.summary.rstrip(".")}){f" — {method.interop.citation}" if method.interop.citation else ""}.

- Base: `{plan.base.display}`
- Method: `{method_name}`; parameters: {params_text}; ε = {probe.eps:g}
- Output dtype: {out_dtype}; elements compared: {probe.params:,} in {probe.tensors} tensors{rho_note if rho else ""}

## Agents

| {" | ".join(head)} |
|{"---|" * len(head)}
{chr(10).join(rows)}
{overlap if stats else ""}
## Reproduce

```
ram-merge run ram-recipe.yaml
```

`merge-report.json` holds the full statistics, per-layer densities, timings and versions.
"""
    return f"---\n{data.to_yaml()}\n---\n{body}"


def save_card(text: str, path: Path) -> None:
    """Write the card as ``ModelCard.save`` does (UTF-8, newlines as they are)."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        f.write(text)
