"""A few steps of every stage of ``reproduction/run.py`` end to end, so the scripts cannot rot.

Skipped when the ``[reproduce]`` extra (TRL, datasets, matplotlib) is not installed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("datasets")
pytest.importorskip("matplotlib")

REPO = Path(__file__).resolve().parent.parent
TASKS = ("code", "tool", "memory")


@pytest.mark.slow
def test_reproduction_pipeline_smoke(tmp_path):
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, str(REPO / "reproduction" / "run.py"), "--seed", "3", "--out", str(out), "--smoke"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for task in TASKS:
        for split in ("train", "validation", "test"):
            spec = (out / "suites" / f"{task}-{split}" / "suite.yaml").read_text()
            assert "scorer: python:reward.py:" in spec
        recipe = json.loads((out / task / "recipe.json").read_text())
        assert recipe["task"] == task and recipe["steps"] > 0
        assert json.loads((out / task / "config.json").read_text())["dtype"] == "bfloat16"
    results = json.loads((out / "results.json").read_text())
    methods = {
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
    }
    assert methods <= set(results["table1"]) and {"base", *TASKS} <= set(results["table1"])
    assert all(0.0 <= s[t] <= 1.0 for s in results["table1"].values() for t in TASKS)
    assert set(results["figure3"]) == {*TASKS, *(t + "-diluted" for t in TASKS)}
    assert [a["name"] for a in results["probe"]] == list(TASKS)
    for batch in ("search", "dare"):  # every merge went through `ram-merge compare`
        compared = json.loads((out / "merges" / batch / "compare.json").read_text())
        assert compared["variants"]
    assert results["chosen"]["fisher"]["params"]["scale"] > 0
    for task in TASKS:
        assert (out / "fisher" / task / "fisher.json").exists()
        gain = results["agent_gains"][task]  # paired over the 12 smoke test examples
        assert gain["n"] == 12 and gain["se"] >= 0.0
        t1 = results["table1"]
        assert gain["gain"] == pytest.approx(t1[task][task] - t1["base"][task], abs=1e-9)

    report = subprocess.run(
        [sys.executable, str(REPO / "reproduction" / "report.py"), str(out), "--out", str(tmp_path / "report")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert report.returncode == 0, report.stderr[-3000:]
    for png in ("figure2-density.png", "table1.png", "table2-figure3.png"):
        assert (tmp_path / "report" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Table 1 in miniature" in (tmp_path / "report" / "results.md").read_text()
