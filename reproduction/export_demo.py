"""Copy one run's base, agents and test suites into the app's built-in demo (ram_desktop/resources/demo).

    python reproduction/export_demo.py runs/seed0

Agent folders are named after what they are (coder, tool, memory); each suite is the task's test
split. The three suites share one reward file, ``suites/reward.py`` (their ``suite.yaml`` names
``python:../reward.py:FUNCTION``), so the demo ships one copy of it. Only the files a model folder
needs are copied.

``suites/validation/<task>`` holds a validation suite per task for ``ram-merge search``: the first
100 examples of the task's validation stream (seed 0, as ``run.py`` draws it) whose prompts the test
suite does not hold, so a search never chooses on the examples it is then tested on.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEST = ROOT / "ram_desktop" / "resources" / "demo"
AGENTS = {"coder": "code", "tool": "tool", "memory": "memory"}  # demo agent name -> task
VALIDATION_EXAMPLES = 100
MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "recipe.json",
)


def export(run: Path, dest: Path = DEST) -> Path:
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for name, src in [("base", run / "base"), *((a, run / t) for a, t in AGENTS.items())]:
        (dest / name).mkdir()
        for f in MODEL_FILES:
            if (src / f).exists():
                shutil.copy(src / f, dest / name / f)
    for task in AGENTS.values():
        suite = dest / "suites" / task
        shutil.copytree(run / "suites" / f"{task}-test", suite)
        shutil.move(suite / "reward.py", dest / "suites" / "reward.py")  # the same file in every run suite
        config = suite / "suite.yaml"
        config.write_text(config.read_text().replace("scorer: python:reward.py:", "scorer: python:../reward.py:"))
    write_validation_suites(dest)
    manifest = {"base": "base", "agents": [{"name": a, "path": a, "suite": f"suites/{t}"} for a, t in AGENTS.items()]}
    (dest / "demo.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return dest


def write_validation_suites(dest: Path = DEST, seed: int = 0) -> None:
    """``dest/suites/validation/<task>``: validation examples disjoint from the task's test suite in ``dest``,
    with the test suite's settings (its reward function, one folder further up)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from tasks import make_split

    for task in AGENTS.values():
        test = dest / "suites" / task
        test_prompts = {json.loads(line)["prompt"] for line in (test / "data.jsonl").read_text().splitlines() if line}
        rows = [
            r for r in make_split(task, "validation", 10 * VALIDATION_EXAMPLES, seed) if r["prompt"] not in test_prompts
        ]
        suite = dest / "suites" / "validation" / task
        suite.mkdir(parents=True, exist_ok=True)
        (suite / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:VALIDATION_EXAMPLES]))
        config = (test / "suite.yaml").read_text().replace("-test\n", "-validation\n", 1)
        (suite / "suite.yaml").write_text(config.replace("python:../reward.py:", "python:../../reward.py:"))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("run", type=Path)
    print(export(ap.parse_args().run))
