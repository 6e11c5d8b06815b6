"""The probe's method advice: each rule from numbers chosen by hand, the real-model track's probes, and the CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ram_desktop.core.engine.inspection import InspectStats
from ram_desktop.core.engine.probe import AgentStats, ProbeReport
from ram_desktop.core.methods.advice import advise, sign_agreement

from .subproc import cli

ROOT = Path(__file__).resolve().parents[1]


def report(agents: list[tuple[int, int]], same_sign: float | None = None) -> ProbeReport:
    """A probe of agents given as (unique, shared) counts over 10,000 elements; ``same_sign``: the share of every
    pair's shared elements whose signs agree (pairs share ``min(shared)`` elements each)."""
    stats = [AgentStats(f"a{i}", f"/a{i}", u + s, u, s, [u, s], (u + s) / 10_000) for i, (u, s) in enumerate(agents)]
    inspect = None
    if same_sign is not None:
        n = len(agents)
        pair = min(s for _, s in agents)
        both = [[stats[a].updated if a == b else pair for b in range(n)] for a in range(n)]
        same = [[both[a][b] if a == b else round(pair * same_sign) for b in range(n)] for a in range(n)]
        inspect = InspectStats(None, both, same, [[0] for _ in range(n)])
    return ProbeReport(1e-5, 10_000, 1, stats, [], {}, counted=False, inspect=inspect)


def test_mostly_unique_updates_point_to_ram():
    advice = advise(report([(800, 200), (700, 300)]), None)
    assert advice.methods[:2] == ["ram", "ram-plus"]
    assert "70%–80% of each agent's update is unique" in advice.findings[0]
    assert [f.unique_share for f in advice.agents] == [0.8, 0.7]


def test_mostly_shared_updates_that_agree_point_to_summing():
    advice = advise(report([(100, 900), (200, 800)], same_sign=0.95), None)
    assert advice.methods[0] == "task-arithmetic"
    assert "80%–90% of each agent's update is shared" in advice.findings[0]
    assert advice.sign_agreement == pytest.approx(0.95, abs=1e-3)
    assert any("agree in sign 95%" in f for f in advice.findings)


def test_conflicting_signs_point_to_sign_election():
    advice = advise(report([(500, 500), (400, 600)], same_sign=0.5), None)
    assert "ties" in advice.methods and "dare-ties" in advice.methods
    assert any("only 50%" in f and "TIES" in f for f in advice.findings)


def test_rho_above_alpha_for_every_agent_is_a_uniform_rescale():
    advice = advise(report([(100, 900), (300, 700)]), None)  # ρ = 9 and 2.33, both ≥ α = 2
    assert any("uniform ×1.2" in f for f in advice.findings)
    assert [f.lam for f in advice.agents] == [pytest.approx(1.2), pytest.approx(1.2)]
    mixed = advise(report([(900, 100), (300, 700)]), None)  # ρ = 0.11 and 2.33
    assert not any("uniform" in f for f in mixed.findings)
    assert "ram-plus" in mixed.methods


def test_sign_agreement_pools_every_pair():
    stats = report([(10, 10), (10, 10), (10, 10)])
    stats.inspect = InspectStats(
        None, [[20, 6, 4], [6, 20, 10], [4, 10, 20]], [[20, 3, 4], [3, 20, 5], [4, 5, 20]], [[0], [0], [0]]
    )
    assert sign_agreement(stats) == pytest.approx((3 + 4 + 5) / (6 + 4 + 10))


def test_one_agent_and_no_update():
    assert advise(report([(500, 0)]), None).methods[0] == "task-arithmetic"
    empty = advise(report([(0, 0), (0, 0)]), None)
    assert "nothing to merge" in empty.findings[0]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_real_model_track_gets_task_arithmetic_first(seed):
    """reproduction/results/real: 74–81 % of each GRPO agent's update is shared and ρ > α for all; there a tuned
    Task Arithmetic won (results.md). The advice, from the saved probe numbers alone, names it first."""
    data = json.loads((ROOT / "reproduction/results/real" / f"results-seed{seed}.json").read_text())
    agents = [
        AgentStats(a["name"], a["name"], a["unique"] + a["shared"], a["unique"], a["shared"], [], a["density"])
        for a in data["probe"]
    ]
    advice = advise(ProbeReport(1e-5, data["params"], 1, agents, [], {}, counted=False), None)
    assert advice.methods[0] == "task-arithmetic"
    assert any("uniform ×1.2" in f for f in advice.findings)
    for a, facts in zip(data["probe"], advice.agents):
        assert facts.unique_share == pytest.approx(a["unique"] / (a["unique"] + a["shared"]))
        assert facts.rho == pytest.approx(a["rho"])


def test_the_cli_prints_and_writes_the_advice(tmp_path):
    demo = tmp_path / "demo"
    assert cli(tmp_path, "demo", str(demo)).returncode == 0
    out = tmp_path / "probe.json"
    done = cli(
        tmp_path,
        "probe",
        str(demo / "base"),
        *(str(demo / a) for a in ("coder", "tool", "memory")),
        "--json",
        str(out),
        "--out-dtype",
        "float32",
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "Which method?" in done.stdout and "Worth searching first:" in done.stdout
    written = json.loads(out.read_text())
    advice = written["advice"]
    assert advice["out_dtype"] == "float32" and advice["methods"]
    for entry, agent in zip(advice["agents"], written["agents"]):
        assert entry["unique_share"] == pytest.approx(agent["unique"] / agent["updated"])
        assert entry["rescale_survival"] == 1.0 or math.isclose(entry["rescale_survival"], 1.0, abs_tol=0.01)
    pairs = written["pairs"]
    both = sum(p["both"] for p in pairs)
    assert advice["sign_agreement"] == pytest.approx(sum(p["same_sign"] for p in pairs) / both)
